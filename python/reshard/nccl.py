"""NCCL communicators made by reshard, through the process's own libnccl.

A communicator works only inside the NCCL library that made it, so reshard
never links NCCL here: it loads it at run time. ``dlopen("libnccl.so.2")``
returns the copy the process has already loaded (import torch or vLLM first);
``RESHARD_NCCL_LIBRARY=/path/to/libnccl.so.2`` — or ``library=`` on the first
call — names one explicitly, e.g. ``site-packages/nvidia/nccl/lib/libnccl.so.2``
of a PyTorch wheel. Once loaded, the library cannot change in the process.

::

    uid = reshard.nccl.unique_id() if rank == 0 else None
    uid = framework_broadcast(uid)                       # ship the 128 bytes yourself
    world = reshard.nccl.Communicator.init(size, rank, uid, device=local_gpu)
    nvlink = world.split(color=node_id, key=rank)        # the NVLink channel's communicator
    t = reshard.NcclTransport(world, nvlink)
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, List, Optional, Tuple, Type

from . import _reshard

__all__ = ["load", "unique_id", "Communicator"]


def load(library: Optional[str] = None) -> Tuple[str, int]:
    """Loads NCCL (see the module doc) and returns (path, version code, e.g. 22703)."""
    return tuple(_reshard._nccl_load(library or ""))


def unique_id(library: Optional[str] = None) -> bytes:
    """A new ncclUniqueId (128 bytes), made on one rank and shipped by the caller to the others."""
    return _reshard._nccl_unique_id(library or "")


class Communicator:
    """An NCCL communicator that reshard made (``init``, ``split``); ``ptr``
    is its ncclComm_t as an int (0 once destroyed).

    ``close()`` (or the end of a ``with`` block) closes the open
    :class:`reshard.NcclTransport` objects made over it (and so their
    sessions), then destroys it (``ncclCommDestroy``); it is idempotent. After
    a run or hello on such a transport raised, the runtime may have aborted
    the communicator (``ncclCommAbort`` frees it: the error says "the
    communicators were aborted"), so ``close()`` then only forgets it; call
    ``destroy()`` yourself when the error says otherwise. ``destroy()`` and
    ``abort()`` act on the communicator as asked, also after a failure,
    and do nothing once it is destroyed or forgotten.

    ::

        with reshard.nccl.Communicator.init(world, rank, uid, device) as comm:
            with reshard.NcclTransport(comm) as t, reshard.Session(plan, rank, t) as s:
                ...
    """

    __slots__ = ("ptr", "size", "rank", "device", "_transports", "_given_up")

    def __init__(self, ptr: int):
        if not ptr:
            raise ValueError("a null communicator")
        self.ptr = ptr
        self.size, self.rank, self.device = _reshard._nccl_comm_info(ptr)
        self._transports: List[Any] = []  # weak references to the NcclTransports made over it
        self._given_up = False  # a transport over it failed: the runtime may have aborted it

    @classmethod
    def init(cls, world: int, rank: int, uid: bytes, device: int, *, library: Optional[str] = None) -> "Communicator":
        """ncclCommInitRank on CUDA device `device`; blocks (GIL released) until all `world` ranks joined."""
        return cls(_reshard._nccl_comm_init(world, rank, bytes(uid), device, library or ""))

    def split(self, color: int, key: int) -> Optional["Communicator"]:
        """ncclCommSplit, collective over this communicator's ranks: ranks of
        equal `color` form a communicator, ordered by `key`; color -1
        (NCCL_SPLIT_NOCOLOR) joins none and returns None."""
        ptr = _reshard._nccl_comm_split(self.ptr, color, key)
        return Communicator(ptr) if ptr else None

    @property
    def closed(self) -> bool:
        """Whether it was destroyed, aborted or closed."""
        return not self.ptr

    def _close_transports(self) -> None:
        for ref in self._transports:
            t = ref()
            if t is not None:
                t.close()
        self._transports = []

    def close(self) -> None:
        """Closes the transports over it, then destroys it, unless a transport
        over it failed (then it is only forgotten; see the class doc). Idempotent."""
        if not self.ptr:
            return
        self._close_transports()
        if self._given_up:
            self.ptr = 0
        else:
            self.destroy()

    def destroy(self) -> None:
        """ncclCommDestroy (nothing once destroyed). Transports over it must be closed first."""
        if self.ptr:
            _reshard._nccl_comm_destroy(self.ptr, False)
            self.ptr = 0

    def abort(self) -> None:
        """ncclCommAbort (nothing once destroyed). Transports over it must be closed first."""
        if self.ptr:
            _reshard._nccl_comm_destroy(self.ptr, True)
            self.ptr = 0

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __int__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        closed = ", closed" if not self.ptr else ""
        return f"<reshard.nccl.Communicator rank {self.rank} of {self.size} on cuda:{self.device}{closed}>"
