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

from typing import Optional, Tuple

from . import _reshard


def load(library: Optional[str] = None) -> Tuple[str, int]:
    """Loads NCCL (see the module doc) and returns (path, version code, e.g. 22703)."""
    return tuple(_reshard._nccl_load(library or ""))


def unique_id(library: Optional[str] = None) -> bytes:
    """A new ncclUniqueId (128 bytes), made on one rank and shipped by the caller to the others."""
    return _reshard._nccl_unique_id(library or "")


class Communicator:
    """An NCCL communicator that reshard made (``init``, ``split``); ``ptr``
    is its ncclComm_t as an int. Destroy it with ``destroy()`` (or ``abort()``),
    not before the transports using it are gone."""

    __slots__ = ("ptr", "size", "rank", "device")

    def __init__(self, ptr: int):
        if not ptr:
            raise ValueError("a null communicator")
        self.ptr = ptr
        self.size, self.rank, self.device = _reshard._nccl_comm_info(ptr)

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

    def destroy(self) -> None:
        _reshard._nccl_comm_destroy(self.ptr, False)
        self.ptr = 0

    def abort(self) -> None:
        _reshard._nccl_comm_destroy(self.ptr, True)
        self.ptr = 0

    def __int__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return f"<reshard.nccl.Communicator rank {self.rank} of {self.size} on cuda:{self.device}>"
