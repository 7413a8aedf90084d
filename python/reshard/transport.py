"""Transports: how a session's messages travel.

- :class:`GlooTransport` — TCP between processes, host memory (tests, CPU runs).
- :class:`NcclTransport` — NCCL point-to-point on CUDA devices, over
  communicators the framework already has or that :mod:`reshard.nccl` made.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from . import _reshard


class Transport:
    """Base of the transports. A transport connects `size` ranks and serves one
    session at a time; after a failed run it must not be reused."""

    __slots__ = ("_t", "device", "device_index", "_session")

    def __init__(self, handle: "_reshard._Transport", device: str, device_index: int):
        self._t = handle
        self._session: Any = None  # a weak reference to the session using it
        self.device = device  #: "cpu" or "cuda": where bound tensors must live
        self.device_index = device_index  #: CUDA device of an NCCL transport, -1 otherwise

    @property
    def rank(self) -> int:
        return self._t.rank

    @property
    def size(self) -> int:
        return self._t.size

    @property
    def kind(self) -> str:
        """"gloo" or "nccl"."""
        return self._t.kind

    @property
    def timeout_s(self) -> float:
        return self._t.timeout_s

    def __repr__(self) -> str:
        return f"<reshard.{type(self).__name__} rank {self.rank} of {self.size}>"


class GlooTransport(Transport):
    """Gloo over TCP, for host (CPU) memory.

    `rank` and `size` are the process's: a transport connects every plan rank
    (size ``plan.num_ranks``, rank = plan rank) or only the active ones (size
    ``len(plan.active_ranks)``, rank i plays ``plan.active_ranks[i]``).
    ``GlooTransport(rank, size, store=DIR)`` meets the other ranks through
    files in a fresh directory every rank can see (it must exist; one an
    earlier run used is refused, naming it, and so is a second process
    claiming a rank);
    ``GlooTransport(rank, size, store="HOST:PORT")`` through a TCP
    rendezvous instead, for hosts that share no file system: rank 0 serves on
    that address (HOST must be one of its own), the others connect to it.
    The constructor blocks (with the GIL released) until all `size` ranks
    have connected, or raises :class:`reshard.PeerError` after `timeout_s`
    (naming the ranks that never joined), at once when another rank gave up
    (a duplicate, an interrupted rank: the message says), or
    ``KeyboardInterrupt`` within a second of Ctrl-C.

    `prefix` separates meshes that share a store; `hostname` is the address
    this rank listens on for messages (the other hosts' ranks must reach it);
    `nvlink_hostname` (optional) an address for the nvlink channel's messages,
    a second mesh; `timeout_s` bounds connecting and each round's messages.
    """

    __slots__ = ()

    def __init__(self, rank: int, size: int, store: Union[str, "os.PathLike[str]"], *, prefix: str = "reshard",
                 hostname: str = "127.0.0.1", nvlink_hostname: Optional[str] = None, timeout_s: float = 60.0):
        store = os.fspath(store)
        if not os.path.isdir(store) and not _is_host_port(store):
            raise ValueError(f"store: '{store}' is neither a directory (the rendezvous directory every rank shares "
                             "must exist) nor HOST:PORT")
        super().__init__(_reshard._gloo_transport(rank, size, store, prefix, hostname, nvlink_hostname or "",
                                                  timeout_s), "cpu", -1)


def _is_host_port(s: str) -> bool:
    host, sep, port = s.rpartition(":")
    return bool(sep) and bool(host) and port.isdigit() and "/" not in s


def _handle(obj: Any, what: str) -> int:
    """An ncclComm_t or cudaStream_t as an int, from the shapes frameworks hold them in."""
    if obj is None:
        return 0
    if isinstance(obj, int):
        return obj
    ptr = getattr(obj, "ptr", None)  # reshard.nccl.Communicator
    if isinstance(ptr, int):
        return ptr
    if what == "stream":
        cs = getattr(obj, "cuda_stream", None)  # torch.cuda.Stream, cupy's Stream.ptr handled above
        if isinstance(cs, int):
            return cs
    comm = getattr(obj, "comm", None)  # vLLM's PyNcclCommunicator: ctypes c_void_p
    if comm is not None and hasattr(comm, "value"):
        return comm.value or 0
    if hasattr(obj, "value") and (obj.value is None or isinstance(obj.value, int)):  # a bare ctypes.c_void_p
        return obj.value or 0
    if callable(getattr(obj, "_comm_ptr", None)):  # torch ProcessGroupNCCL
        return int(obj._comm_ptr())
    raise TypeError(f"{what}: cannot take a {'stream' if what == 'stream' else 'communicator'} from "
                    f"{type(obj).__name__} (pass an int, a reshard.nccl.Communicator, vLLM's PyNcclCommunicator, "
                    "a torch ProcessGroupNCCL, a torch.cuda.Stream or a ctypes.c_void_p)")


class NcclTransport(Transport):
    """NCCL point-to-point over the caller's communicators, for CUDA memory.

    `net` is an ncclComm_t over all plan ranks (communicator rank = plan
    rank) or over the active ones (communicator rank i plays
    ``plan.active_ranks[i]``); `nvlink` one for the NVLink channel (None: it shares `net`);
    `stream` the cudaStream_t the kernels run on (None: the transport's own).
    Each may be given as an int or as the object a framework holds it in: a
    :class:`reshard.nccl.Communicator`, vLLM's ``PyNcclCommunicator``, torch's
    ``ProcessGroupNCCL`` (``_comm_ptr()``), a ``ctypes.c_void_p``, a
    ``torch.cuda.Stream``.

    The communicators stay the caller's; after a failed run they are aborted
    and must not be destroyed. They must come from the same libnccl.so that
    reshard's runtime uses: import your framework (torch) before reshard, or
    set RESHARD_NCCL_LIBRARY to that library's path before ``import reshard``.
    Raises :class:`reshard.NcclError` in a runtime built without CUDA.
    """

    __slots__ = ("stream",)

    def __init__(self, net: Any, nvlink: Any = None, stream: Any = None, *, timeout_s: float = 60.0):
        net_i, nvl_i, stream_i = _handle(net, "net"), _handle(nvlink, "nvlink"), _handle(stream, "stream")
        handle = _reshard._nccl_transport(net_i, nvl_i, stream_i, timeout_s)
        super().__init__(handle, "cuda", _reshard._transport_device(handle))
        self.stream = stream_i  #: the cudaStream_t given (0: the transport's own)

    @classmethod
    def _loopback(cls, device: int, rank: int, size: int, timeout_s: float = 60.0) -> "NcclTransport":
        """Test hook: one-rank communicators on `device` presented as plan rank
        `rank` of `size`, every message sent to itself (NCCL send-to-self)."""
        self = cls.__new__(cls)
        self._session = None
        handle = _reshard._nccl_loopback_transport(device, rank, size, timeout_s)
        Transport.__init__(self, handle, "cuda", _reshard._transport_device(handle))
        self.stream = 0
        return self
