"""Transports: how a session's messages travel.

- :class:`GlooTransport` — TCP between processes, host memory (tests, CPU runs).
- :class:`NcclTransport` — NCCL point-to-point on CUDA devices, over
  communicators the framework already has or that :mod:`reshard.nccl` made.
"""

from __future__ import annotations

import os
import weakref
from types import TracebackType
from typing import Any, Optional, Tuple, Type, Union

from . import _reshard
from .errors import Error

__all__ = ["Transport", "GlooTransport", "NcclTransport"]


class _Closed:
    """Stands where a closed object's runtime handle was: any use of it raises
    `message` as a :class:`reshard.Error` (never an AttributeError on None)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message

    def __getattr__(self, name: str) -> Any:
        raise Error(self.message)

    def __bool__(self) -> bool:
        return False


class Transport:
    """Base of the transports. A transport connects `size` ranks and serves one
    session at a time; after a failed run it must not be reused.

    ``close()`` (or the end of a ``with`` block) closes its connections: the
    session it serves, if still open, is closed first (a session cannot
    outlive its transport's connections), then the runtime's transport is
    destroyed. A closed transport refuses new sessions with a
    :class:`reshard.Error`. ``close()`` is idempotent; ``rank``, ``size``,
    ``kind`` and ``timeout_s`` still answer after it. The communicators of an
    :class:`NcclTransport` stay the caller's: closing it leaves them open.

    ::

        with reshard.GlooTransport(rank, size, store=d) as t, reshard.Session(plan, rank, t) as s:
            s.bind_module(model)
            s.run()
    """

    __slots__ = ("_t", "device", "device_index", "_session", "_facts", "__weakref__")

    def __init__(self, handle: "_reshard._Transport", device: str, device_index: int):
        self._t = handle
        self._session: Any = None  # a weak reference to the session using it
        self._facts = (handle.rank, handle.size, handle.kind, handle.timeout_s)
        self.device = device  #: "cpu" or "cuda": where bound tensors must live
        self.device_index = device_index  #: CUDA device of an NCCL transport, -1 otherwise

    @property
    def rank(self) -> int:
        return self._facts[0]

    @property
    def size(self) -> int:
        return self._facts[1]

    @property
    def kind(self) -> str:
        """"gloo" or "nccl"."""
        return self._facts[2]

    @property
    def timeout_s(self) -> float:
        return self._facts[3]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return isinstance(self._t, _Closed)

    def close(self) -> None:
        """Closes the transport's connections, and first the session it serves
        if that is still open (see the class doc). Idempotent. Raises
        :class:`reshard.Error` (and closes nothing) while that session's run()
        is in progress in another thread."""
        if self.closed:
            return
        session = self._session() if self._session is not None else None
        if session is not None:
            session._close("its transport was closed")
        self._session = None
        self._t = _Closed(f"rank {self.rank}: this {self.kind} transport is closed (Transport.close() or the end of "
                          "its with block): make a new transport, and a session on it, for the next refit")

    def _open_handle(self) -> "_reshard._Transport":
        """The runtime's transport, or a clear Error once closed."""
        if self.closed:
            raise Error(self._t.message)
        return self._t

    def _run_failed(self) -> None:
        """A run or hello of a session on this transport raised: the
        transport must not be reused (subclasses note what that implies)."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __repr__(self) -> str:
        closed = ", closed" if self.closed else ""
        return f"<reshard.{type(self).__name__} rank {self.rank} of {self.size}{closed}>"


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


def _communicators(*objs: Any) -> Tuple[Any, ...]:
    """The :class:`reshard.nccl.Communicator` objects among `objs`."""
    from .nccl import Communicator

    return tuple(o for o in objs if isinstance(o, Communicator))


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

    ``close()`` leaves the communicators open. A
    :class:`reshard.nccl.Communicator` closed while a transport over it is
    open closes that transport first.
    """

    __slots__ = ("stream", "_comms")

    def __init__(self, net: Any, nvlink: Any = None, stream: Any = None, *, timeout_s: float = 60.0):
        net_i, nvl_i, stream_i = _handle(net, "net"), _handle(nvlink, "nvlink"), _handle(stream, "stream")
        handle = _reshard._nccl_transport(net_i, nvl_i, stream_i, timeout_s)
        super().__init__(handle, "cuda", _reshard._transport_device(handle))
        self.stream = stream_i  #: the cudaStream_t given (0: the transport's own)
        self._comms: Tuple[Any, ...] = _communicators(net, nvlink)
        for c in self._comms:
            c._transports.append(weakref.ref(self))

    def _run_failed(self) -> None:
        # The runtime may have aborted the communicators (ncclCommAbort frees
        # them): reshard's own must not be destroyed by their close().
        for c in self._comms:
            c._given_up = True

    @classmethod
    def _loopback(cls, device: int, rank: int, size: int, timeout_s: float = 60.0) -> "NcclTransport":
        """Test hook: one-rank communicators on `device` presented as plan rank
        `rank` of `size`, every message sent to itself (NCCL send-to-self)."""
        self = cls.__new__(cls)
        self._session = None
        self._comms = ()
        handle = _reshard._nccl_loopback_transport(device, rank, size, timeout_s)
        Transport.__init__(self, handle, "cuda", _reshard._transport_device(handle))
        self.stream = 0
        return self
