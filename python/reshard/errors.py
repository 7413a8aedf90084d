"""The exceptions of reshard.

Every failure of the runtime reaches Python as one of these, carrying the
runtime's own message (which names the file, buffer, step and peer involved)::

    Error                    anything reshard raises
    ├── PlanError            a plan file that cannot be opened or is not valid for a rank
    ├── CompileError         specs that do not compile, settings init refuses (the CLI's message)
    ├── BindError            a tensor that does not fit its buffer, or buffers left unbound at run()
    ├── PeerError            a peer that failed, vanished or did not connect
    │   └── PeerTimeoutError a peer that stalled past the transport's timeout (also a TimeoutError)
    └── NcclError            NCCL could not be loaded, or a communicator call failed
"""

from __future__ import annotations

__all__ = ["Error", "PlanError", "CompileError", "BindError", "PeerError", "PeerTimeoutError", "NcclError"]


class Error(RuntimeError):
    """Base class of every error reshard raises."""


class PlanError(Error):
    """A plan file is missing, damaged, of another schema, or lacks the rank asked for."""


class CompileError(Error):
    """The compiler rejected its inputs: reshard.compile (the message of
    `reshard compile`) or reshard.init (the message of `reshard init`)."""


class BindError(Error, ValueError):
    """A tensor does not fit the plan buffer it is bound to (name, dtype, shape,
    device, memory), or run() found buffers still unbound."""


class PeerError(Error):
    """A peer failed during connection or a run; the message names the step,
    the peer and which buffers were completely written. The transport must not
    be reused after it."""


class PeerTimeoutError(PeerError, TimeoutError):
    """A peer stalled longer than the transport's timeout."""


class NcclError(Error):
    """NCCL could not be loaded or one of its calls failed."""


# The order of reshard::py::ErrorKind in python/src/ext.h.
_KINDS = (Error, PlanError, BindError, PeerError, PeerTimeoutError, CompileError, NcclError)
