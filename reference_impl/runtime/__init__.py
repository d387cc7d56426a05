"""The reference runtime: delegate handles over AOTInductor packages, with the skip-copy option.

``init`` / ``execute`` / ``destroy`` / ``execute_stats`` live in ``delegate.py`` (streams, threads and data
movement are documented there); the backend-wide options in ``options.py``. What the runtime reads — the
program, blob, placement and input/output metadata, and the package loader — is the format floor's
(``reference_impl/format/``), shared with the lowering. The suite drives multi-method models through the
protocol (``conformance/common/pipelines.py``).
"""

from reference_impl.format.argument_errors import IOSpecError, RuntimeArgumentError
from reference_impl.runtime.delegate import (
    STREAM_POLICY,
    DelegateHandle,
    destroy,
    execute,
    execute_stats,
    init,
)
from reference_impl.runtime.errors import DestroyedHandleError, InputError, OutputError
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
    "reset_options",
    "set_option",
    "set_options",
]
