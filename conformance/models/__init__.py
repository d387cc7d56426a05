"""Seeded, download-free models for lowering and runtime checks (see ``zoo.py``)."""

from conformance.models.greedy import asr_greedy, greedy, llm_greedy
from conformance.models.zoo import (
    DTYPES,
    HF_KINDS,
    HF_MODELS,
    HF_UNAVAILABLE,
    HF_VERSION,
    ZOO,
    Greedy,
    Methods,
    ZooModel,
    get_model,
)

__all__ = [
    "DTYPES",
    "HF_KINDS",
    "HF_MODELS",
    "HF_UNAVAILABLE",
    "HF_VERSION",
    "ZOO",
    "Greedy",
    "Methods",
    "ZooModel",
    "asr_greedy",
    "get_model",
    "greedy",
    "llm_greedy",
]
