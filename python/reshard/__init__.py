"""reshard: move model weights from training ranks to inference ranks by a
precompiled plan (the weight refit of RL post-training).

The plan is compiled once (``reshard compile`` or :func:`compile`); every
rank then opens it, binds its weight tensors by name and runs it each step::

    import reshard
    plan = reshard.Plan.open("refit.rsplan")
    transport = reshard.NcclTransport(net=comm)          # or GlooTransport(rank, size, store=DIR)
    session = reshard.Session(plan, rank, transport)
    session.bind_module(model)                           # every plan buffer <- named_parameters()
    stats = session.run()                                # each refit; GIL released

Errors are :class:`Error` subclasses carrying the runtime's message:
:class:`PlanError`, :class:`CompileError`, :class:`BindError`,
:class:`PeerError` (:class:`PeerTimeoutError`), :class:`NcclError`.

NCCL: reshard's runtime uses the libnccl.so.2 already in the process. Import
your framework (torch, vLLM) before reshard, or set RESHARD_NCCL_LIBRARY to
the framework's libnccl.so.2 before ``import reshard`` (see reshard.nccl).
"""

from __future__ import annotations

import ctypes as _ctypes
import os as _os

_nccl_path = _os.environ.get("RESHARD_NCCL_LIBRARY")
if _nccl_path:
    # Loaded first and globally, so the runtime's own NCCL dependency resolves to it.
    _ctypes.CDLL(_nccl_path, mode=_ctypes.RTLD_GLOBAL)

from . import _reshard  # noqa: E402
from . import errors as _errors  # noqa: E402

_reshard._set_error_classes(_errors._KINDS)

from .compiler import compile  # noqa: E402
from .errors import BindError, CompileError, Error, NcclError, PeerError, PeerTimeoutError, PlanError  # noqa: E402
from .plan import Buffer, Plan, Program  # noqa: E402
from .session import ChannelStats, RoundStats, RunStats, Session  # noqa: E402
from .transport import GlooTransport, NcclTransport, Transport  # noqa: E402
from . import nccl  # noqa: E402

__version__: str = _reshard.__version__
HAVE_CUDA: bool = bool(_reshard._have_cuda)  #: whether this runtime was built with the NCCL transport

__all__ = [
    "Plan", "Program", "Buffer", "Session", "RunStats", "ChannelStats", "RoundStats", "Transport", "GlooTransport",
    "NcclTransport", "compile", "nccl", "Error", "PlanError", "CompileError", "BindError", "PeerError",
    "PeerTimeoutError", "NcclError", "HAVE_CUDA",
]
