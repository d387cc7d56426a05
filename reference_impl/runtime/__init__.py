"""The reference runtime: delegate handles over AOTInductor packages, with the skip-copy option.

``init`` / ``execute`` / ``destroy`` / ``execute_stats`` live in ``delegate.py`` (streams, threads and data
movement are documented there); the backend-wide options in ``options.py``; input/output metadata in
``iospec.py``. The suite drives multi-method models through the protocol (``conformance/pipelines.py``).
"""

from reference_impl.runtime.delegate import (
    STREAM_POLICY,
    DelegateHandle,
    destroy,
    execute,
    execute_stats,
    init,
)
from reference_impl.runtime.errors import (
    DestroyedHandleError,
    InputError,
    IOSpecError,
    OutputError,
    RuntimeArgumentError,
)
from reference_impl.runtime.iospec import IOSpec, io_spec_from_exported_program
from reference_impl.runtime.options import (
    SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD,
    OptionError,
    get_option,
    reset_options,
    set_option,
    set_options,
)

__all__ = [
    "SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD",
    "STREAM_POLICY",
    "DelegateHandle",
    "DestroyedHandleError",
    "IOSpec",
    "IOSpecError",
    "InputError",
    "OptionError",
    "OutputError",
    "RuntimeArgumentError",
    "destroy",
    "execute",
    "execute_stats",
    "get_option",
    "init",
    "io_spec_from_exported_program",
    "reset_options",
    "set_option",
    "set_options",
]
