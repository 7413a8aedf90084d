"""reshard: move model weights from training ranks to inference ranks by a
precompiled plan (the weight refit of RL post-training).

The specs come from a Hugging Face config (``reshard init`` or :func:`init`);
the plan is compiled once (``reshard compile`` or :func:`compile`); every
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

NCCL: reshard's runtime must use the libnccl.so.2 of the framework (a
communicator works only inside the library that made it). ``import reshard``
takes, in order: RESHARD_NCCL_LIBRARY; a libnccl.so.2 already loaded (torch or
vLLM imported first); the NVIDIA wheel's (nvidia-nccl-cu*, which pip's torch
uses); else the system's. ``reshard.NCCL_PRELOADED`` says which it loaded.
"""

from __future__ import annotations

import ctypes as _ctypes
import importlib.util as _importlib_util
import os as _os
from typing import Optional as _Optional

try:
    from ._build import HAVE_CUDA as _BUILT_WITH_CUDA
except ImportError:  # a build tree without the generated file
    _BUILT_WITH_CUDA = True


def _preload_nccl() -> _Optional[str]:
    """Loads the NCCL the process should share before the runtime (which links
    libnccl.so.2) is loaded: RESHARD_NCCL_LIBRARY if set; else nothing if a
    libnccl.so.2 is loaded already (torch/vLLM imported first); else the
    NVIDIA wheel's (nvidia-nccl-cu*, what a pip-installed torch loads); else
    the dynamic linker's choice (the system's). Returns the path it loaded."""
    path = _os.environ.get("RESHARD_NCCL_LIBRARY")
    if not path:
        if not _BUILT_WITH_CUDA:
            return None
        try:
            _ctypes.CDLL("libnccl.so.2", mode=_ctypes.RTLD_GLOBAL | _os.RTLD_NOLOAD)
            return None  # the process has one: the runtime binds to it
        except OSError:
            pass
        try:
            spec = _importlib_util.find_spec("nvidia.nccl")
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            candidate = _os.path.join(loc, "lib", "libnccl.so.2")
            if _os.path.exists(candidate):
                path = candidate
                break
    if path:
        _ctypes.CDLL(path, mode=_ctypes.RTLD_GLOBAL)
    return path


#: The libnccl.so.2 reshard loaded before its runtime (None: the one already
#: in the process, or none, or the system's).
NCCL_PRELOADED: _Optional[str] = _preload_nccl()

from . import _reshard  # noqa: E402
from . import errors as _errors  # noqa: E402

_reshard._set_error_classes(_errors._KINDS)

from .compiler import compile, init  # noqa: E402
from .errors import BindError, CompileError, Error, NcclError, PeerError, PeerTimeoutError, PlanError  # noqa: E402
from .plan import Buffer, Plan, Program  # noqa: E402
from .session import ChannelStats, RoundStats, RunStats, Session  # noqa: E402
from .refit import TrainerRefit  # noqa: E402
from .dtensor import LayoutError, layout_from_module  # noqa: E402
from .transport import GlooTransport, NcclTransport, Transport  # noqa: E402
from . import nccl  # noqa: E402

__version__: str = _reshard.__version__
HAVE_CUDA: bool = bool(_reshard._have_cuda)  #: whether this runtime was built with the NCCL transport

__all__ = [
    "Plan", "Program", "Buffer", "Session", "RunStats", "ChannelStats", "RoundStats", "Transport", "GlooTransport",
    "NcclTransport", "compile", "init", "nccl", "Error", "PlanError", "CompileError", "BindError", "PeerError",
    "PeerTimeoutError", "NcclError", "HAVE_CUDA", "NCCL_PRELOADED", "TrainerRefit", "layout_from_module",
    "LayoutError",
]
