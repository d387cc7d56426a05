"""Seeded, download-free models for lowering and runtime checks (see ``zoo.py``)."""

from conformance.models.greedy import asr_greedy, llm_greedy
from conformance.models.zoo import DTYPES, ZOO, Methods, ZooModel, get_model

__all__ = ["DTYPES", "ZOO", "Methods", "ZooModel", "asr_greedy", "get_model", "llm_greedy"]
