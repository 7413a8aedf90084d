"""reshard.Session: one rank's side of a refit."""

from __future__ import annotations

import difflib
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple, Type, Union

from . import _reshard
from ._tensors import (DTYPE_CODES, DTYPE_SIZES, DTYPES, RAW_BITS, WRAPPER_SEGMENTS, DTensorOrigin, TensorInfo,
                       describe, dtensor_local, element_offsets, element_span, is_dtensor, self_overlapping,
                       strip_wrappers, transposed_storage)
from .errors import BindError, Error
from .plan import Buffer, Plan
from .transport import Transport, _Closed

if TYPE_CHECKING:
    import torch

__all__ = ["Session", "RunStats", "ChannelStats", "RoundStats"]


class ChannelStats(NamedTuple):
    bytes_sent: int
    bytes_received: int
    seconds: float  #: wall time of the communication phases of rounds that used the channel


class RoundStats(NamedTuple):
    bytes_sent: int
    bytes_received: int
    bytes_local: int  #: bytes written by pack, copy and unpack steps
    steps: int
    seconds: float
    comm_seconds: float


class RunStats:
    """What one run() did: bytes per channel, seconds, rounds, steps.

    Read from the runtime's own record only when asked (run() itself builds
    no per-round objects)."""

    __slots__ = ("_r",)

    def __init__(self, raw: "_reshard._RunStats"):
        self._r = raw

    @property
    def seconds(self) -> float:
        """The runtime's own measure of the run."""
        return self._r.seconds

    @property
    def steps(self) -> int:
        """Steps this rank executed."""
        return self._r.steps

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank sent, both channels."""
        return self._r.bytes_sent

    @property
    def bytes_received(self) -> int:
        """Bytes this rank received, both channels."""
        return self._r.bytes_received

    @property
    def net(self) -> ChannelStats:
        """Bytes and seconds of the network channel."""
        return ChannelStats(*self._r.channel(0))

    @property
    def nvlink(self) -> ChannelStats:
        """Bytes and seconds of the NVLink channel."""
        return ChannelStats(*self._r.channel(1))

    @property
    def rounds(self) -> int:
        """Rounds this rank ran."""
        return self._r.num_rounds

    @property
    def round_stats(self) -> List[RoundStats]:
        """Per round: bytes sent/received/written locally, steps, seconds, communication seconds."""
        return [RoundStats(*r) for r in self._r.rounds()]

    def __repr__(self) -> str:
        return (f"RunStats(seconds={self.seconds:.6f}, rounds={self.rounds}, steps={self.steps}, "
                f"net={tuple(self.net)}, nvlink={tuple(self.nvlink)})")


class _Staged(NamedTuple):
    """A strided view bound through a contiguous copy."""

    view: Any
    staging: Any
    copy_in: bool  # the plan reads the buffer: view -> staging before run
    copy_out: bool  # the plan writes it: staging -> view after run
    kind: str


def _shape(s: Iterable[int]) -> str:
    return "[" + ",".join(str(int(x)) for x in s) + "]"


class Session:
    """One rank's side of a refit: bind its weight buffers, then run the plan.

    ::

        plan = reshard.Plan.open("refit.rsplan")
        # one process per active plan rank: process i plays plan.active_ranks[i]
        rank = plan.active_ranks[process]
        transport = reshard.GlooTransport(process, len(plan.active_ranks), store="/shared/fresh-dir")
        s = reshard.Session(plan, rank, transport)  # every rank says hello: one plan, distinct ranks
        s.bind_module(model)              # or s.bind(name, tensor) per buffer
        stats = s.run()                   # every step; the GIL is released

    Making a session blocks (the GIL released) until every rank has made
    its own: the ranks exchange the plan's content digest and their plan
    ranks, and all of them raise the same :class:`reshard.PlanError` when
    they do not run one plan as distinct ranks (naming the ranks and the
    digests, or the duplicate), :class:`reshard.PeerError` naming a rank not
    heard from within the transport's timeout, ``KeyboardInterrupt`` within a
    second of Ctrl-C.

    Binding checks name, dtype, shape and device against the plan (a
    :class:`reshard.BindError` says which and what was expected) and keeps a
    reference to the tensor's memory until it is re-bound or the session is
    dropped. Bind again at any time between runs (frameworks replace
    ``param.data`` after post-processing): the next run uses the new memory.

    Tensors: PyTorch tensors, NumPy arrays, and any object with
    ``__dlpack__`` (CuPy, JAX). A DTensor (FSDP2's sharded parameter) binds
    its local tensor, the memory this rank holds (an empty shard binds the
    plan's zero-size buffer). CPU memory for a Gloo transport, CUDA memory of
    the transport's device for NCCL. A non-contiguous view (a slice of a
    fused parameter) is bound through a contiguous copy: reshard copies the
    view into it before each run where the plan reads the buffer, and back
    after each run where it writes it — one extra pass over the view's bytes
    per direction and the view's size in extra memory (PyTorch and NumPy only).
    Views bind by memory only by declaration: for a buffer the layout declares
    ``"held": "transposed"`` (:attr:`Buffer.held_transposed`: vLLM's
    per-channel FP8 linears are ``weight.t()`` after loading), the transposed
    view of contiguous memory binds that memory in place, in its storage
    order: the plan writes the bytes the framework's kernels read. Any other
    strided view, a transposed one included, goes through the copy, and a
    tensor of another shape is refused.

    A session is not thread-safe: bind and run from one thread at a time.

    ``close()`` (or the end of a ``with`` block, which re-raises what ended
    it) releases the session: the runtime's session is destroyed and the
    bound tensors are let go, so the transport can serve a new session (one
    session per transport at a time). After it, every method raises
    :class:`reshard.Error` ("this session is closed"); ``plan``, ``rank``,
    ``transport`` and ``closed`` still answer. ``close()`` is idempotent, and
    refused while run() is in progress in another thread.
    """

    __slots__ = ("_s", "plan", "transport", "rank", "_buffers", "_index", "_held", "_staged", "_origin", "_device",
                 "_device_index", "_strip_wrappers", "__weakref__")

    def __init__(self, plan: Plan, rank: int, transport: Transport):
        if not isinstance(plan, Plan):
            raise TypeError(f"plan: expected a reshard.Plan, got {type(plan).__name__}")
        if not isinstance(transport, Transport):
            raise TypeError(f"transport: expected a reshard.GlooTransport or NcclTransport, got {type(transport).__name__}")
        if transport._session is not None and transport._session() is not None:
            # A dropped session may wait in a reference cycle (a traceback
            # holding its frame): collect it before calling the transport taken.
            import gc

            gc.collect()
        handle = transport._open_handle()
        # Refused before the hello (another session open, a rank out of range), the transport is unharmed.
        refused = (transport._session is not None and transport._session() is not None) or not (
            isinstance(rank, int) and 0 <= rank < plan.num_ranks)
        try:
            self._s = _reshard._Session(plan._p, rank, handle)
        except BaseException:
            if not refused:
                transport._run_failed()
            raise
        transport._session = weakref.ref(self)
        self.plan = plan
        self.transport = transport
        self.rank = rank
        self._buffers: Tuple[Buffer, ...] = plan.buffers(rank)
        self._index: Dict[str, int] = {b.name: i for i, b in enumerate(self._buffers)}
        self._held: List[Any] = [None] * len(self._buffers)
        # torch bindings: the tensor the caller bound and its data pointer then,
        # checked before every run (a framework may free or swap the storage).
        self._origin: Dict[int, Tuple[Any, int]] = {}
        self._staged: Dict[int, _Staged] = {}
        self._device = transport.device
        self._device_index = transport.device_index
        # Plan names without wrapper segments: module names are looked through them.
        self._strip_wrappers = not any(seg in n for n in self._index for seg in WRAPPER_SEGMENTS)

    # -- lifetime ---------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` (or its transport's close) released the session."""
        return isinstance(self._s, _Closed)

    def _check_open(self) -> None:
        if isinstance(self._s, _Closed):
            raise Error(self._s.message)

    def close(self) -> None:
        """Releases the session (see the class doc): the transport can serve a
        new one. Idempotent. Raises :class:`reshard.Error` (and releases
        nothing) while run() is in progress in another thread."""
        self._close("Session.close() or the end of its with block")

    def _close(self, why: str) -> None:
        if self.closed:
            return
        if self._s.running:
            raise Error(f"rank {self.rank}: close: run() is in progress on this session in another thread; close "
                        "it after run() returns")
        # The runtime's session goes first (it releases the transport), then the memory it pointed into.
        self._s = _Closed(f"rank {self.rank}: this session is closed ({why}): make a new Session to refit again")
        self._held = [None] * len(self._buffers)
        self._origin = {}
        self._staged = {}
        t = self.transport
        if t._session is not None and t._session() is self:
            t._session = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    # -- what the rank binds ----------------------------------------------------
    @property
    def buffers(self) -> Tuple[Buffer, ...]:
        """The buffers this rank binds (name, dtype, shape, is_source, is_destination), in plan order."""
        self._check_open()
        return self._buffers

    @property
    def staging_bytes(self) -> int:
        """Staging memory the session allocated (the plan's figure for this rank)."""
        return self._s.staging_bytes

    def missing(self) -> List[str]:
        """Names of the buffers still unbound (empty buffers need no binding)."""
        return [self._buffers[i].name for i in self._s.unbound()]

    def tensor(self, name: str) -> "Optional[Union[torch.Tensor, Any]]":
        """The tensor bound to buffer `name` (None if unbound): the one bound,
        a NumPy array or DLPack object where that is what was bound."""
        self._check_open()
        i = self._lookup(name)
        st = self._staged.get(i)
        return st.view if st is not None else self._held[i]

    # -- binding ----------------------------------------------------------------
    def _lookup(self, name: str) -> int:
        i = self._index.get(name)
        if i is None:
            raise BindError(self._unknown(name))
        return i

    def _unknown(self, name: str) -> str:
        if "train:" + name in self._index:  # colocated: both sides use the name on this GPU
            return (f"rank {self.rank}: buffer '{name}' is on this GPU for both sides (colocated): bind "
                    f"'train:{name}' (the training side's) or 'infer:{name}' (the inference side's); "
                    "bind_module(module, side=\"train\") or side=\"infer\"")
        msg = f"rank {self.rank}: the plan has no buffer '{name}' for this rank"
        close = difflib.get_close_matches(name, self._index.keys(), n=1, cutoff=0.8)
        return msg + (f" (did you mean '{close[0]}'?)" if close else "")

    @staticmethod
    def _describe(tensor: Any, b: Buffer) -> TensorInfo:
        """The tensor's facts; for a buffer the layout declares held
        transposed (``Buffer.held_transposed``), the transposed view of its
        memory is seen as that memory (binding it binds the memory in place)."""
        info = describe(tensor)
        if b.held_transposed and not info.contiguous:
            view = transposed_storage(info.keep if info.kind == "torch" else tensor, info, b.shape)
            if view is not None:
                return describe(view)
        return info

    def _problem(self, b: Buffer, info: TensorInfo, dtype: Optional[str]) -> Tuple[Optional[str], int]:
        """Why `info` cannot be bound to `b` (None if it can), and the dtype code to bind with."""
        code = info.dtype
        if dtype is not None:
            want = DTYPE_CODES.get(dtype)
            if want is None:
                return f"dtype='{dtype}' is none of {', '.join(DTYPES)}", -1
            if info.itemsize != DTYPE_SIZES[want]:
                return (f"dtype='{dtype}' reinterprets {info.itemsize}-byte elements ({info.dtype_name}) as "
                        f"{DTYPE_SIZES[want]}-byte ones"), -1
            # A declaration names what raw bits are; it never reinterprets a
            # typed value (float16 bits read as bf16 are other numbers).
            raw = RAW_BITS.get(info.itemsize)
            if code != want and not (info.kind == "numpy" and info.dtype_name == raw):
                if info.kind == "numpy":
                    how = (f"an array of {raw} holding the {dtype} bits (arr.view(np.{raw})), or values converted "
                           f"to {dtype}")
                else:
                    how = (f"a tensor of the plan's dtype ({dtype}): convert the values, or view raw bits as that "
                           "dtype (tensor.view(...)) if that is what they are")
                return (f"dtype='{dtype}' on {info.dtype_name} data: its values would be read as other numbers; "
                        f"bind {how}"), -1
            code = want
        if code is None or DTYPES[code] != b.dtype:
            what = info.dtype_name if code is None else f"{DTYPES[code]} ({info.dtype_name})"
            return f"dtype {what}, the plan expects {b.dtype}", -1
        if info.shape != b.shape:
            hint = ""
            if len(b.shape) == 2 and tuple(info.shape) == (b.shape[1], b.shape[0]) and not b.held_transposed:
                hint = (" (a transposed tensor: only buffers the layout declares \"held\": \"transposed\" bind "
                        "their transposed view; pass the tensor in the plan's shape)")
            return f"shape {_shape(info.shape)}, the plan expects {_shape(b.shape)}{hint}", -1
        if info.device != self._device:
            where = info.device if info.device_index < 0 else f"{info.device}:{info.device_index}"
            return f"memory on {where}, the {self.transport.kind} transport needs {self._device} memory", -1
        if self._device == "cuda" and self._device_index >= 0 and info.device_index != self._device_index:
            return (f"memory on cuda:{info.device_index}, the NCCL transport's communicators are on "
                    f"cuda:{self._device_index}"), -1
        if b.is_destination and not info.writable:
            return "a read-only array, the plan writes into this buffer", -1
        if b.is_destination and not info.contiguous and self_overlapping(info.shape, info.strides):
            return (f"a view whose elements overlap (strides {_shape(info.strides)} over shape "
                    f"{_shape(info.shape)}: an expand() or as_strided() view), the plan writes into this buffer: "
                    "bind a tensor with memory of its own (.contiguous() or .clone())"), -1
        if not info.contiguous and info.kind == "dlpack":
            return ("a non-contiguous DLPack tensor (strided views are bound through a copy for torch and numpy "
                    "only; pass a contiguous tensor)"), -1
        return None, code

    def _staged_overlap(self, i: int, info: TensorInfo, only_staged: bool = False) -> Optional[str]:
        """The destination buffer whose memory a destination shares with a
        strided destination view (None if none): such a view is written
        through a copy after each run, so the runtime's check of bound memory
        cannot see it. `info` a strided view: checked against every
        destination; a contiguous tensor (`only_staged`): against the views."""
        lo, hi = element_span(info)
        mine = None
        for j in (list(self._staged) if only_staged else range(len(self._buffers))):
            b = self._buffers[j]
            if j == i or not b.is_destination:
                continue
            st = self._staged.get(j)
            if st is not None:
                other = describe(st.view)
            else:
                ptr = self._s.bound_ptr(j)
                if ptr == 0:
                    continue
                other = describe(self._held[j])
            olo, ohi = element_span(other)
            if ohi <= lo or hi <= olo:
                continue
            import numpy as np

            if mine is None:
                mine = element_offsets(info)
            theirs = element_offsets(other)
            if np.intersect1d(mine, theirs, assume_unique=True).size:
                return b.name
        return None

    def _bind_checked(self, i: int, info: TensorInfo, code: int, origin: Any = None) -> None:
        b = self._buffers[i]
        if info.kind == "torch" and origin is not None:
            self._origin[i] = (origin, origin.data_ptr())
        else:
            self._origin.pop(i, None)
        if info.contiguous:
            if b.is_destination and self._staged:
                other = self._staged_overlap(i, info, only_staged=True)
                if other is not None:
                    raise BindError(f"rank {self.rank}: buffer '{b.name}' is bound to memory that buffer '{other}' "
                                    "(a strided view) also uses: both are destinations, so each would overwrite "
                                    "the other's weights; bind each to its own tensor")
            self._s.bind_index(i, info.ptr, code, b.shape)
            self._held[i] = info.keep
            self._staged.pop(i, None)
            return
        # A strided view: bind a contiguous copy and move the bytes around each run.
        if b.is_destination:
            other = self._staged_overlap(i, info)
            if other is not None:
                raise BindError(f"rank {self.rank}: buffer '{b.name}' is bound to a view that shares memory with "
                                f"buffer '{other}': both are destinations, so each would overwrite the other's "
                                "weights; bind each to its own tensor")
        if info.kind == "torch":
            staging = info.keep.contiguous()  # a copy, with the view's current values
        else:
            import numpy as np

            staging = np.ascontiguousarray(info.keep)
        self._s.bind_index(i, describe(staging).ptr, code, b.shape)
        self._held[i] = staging
        self._staged[i] = _Staged(info.keep, staging, b.is_source, b.is_destination, info.kind)

    def bind(self, name: str, tensor: "Union[torch.Tensor, Any]", *, dtype: Optional[str] = None) -> None:
        """Binds buffer `name` to `tensor` (re-binding replaces the previous tensor).

        `dtype` reinterprets the tensor's elements as a plan dtype of the same
        size ("bf16" for a numpy uint16 array, which has no bfloat16).
        Raises BindError for an unknown name (with the closest one), a dtype,
        shape or device other than the plan's, or read-only memory the plan
        writes into.
        """
        self._check_open()
        i = self._lookup(name)
        origin = tensor
        if is_dtensor(tensor):
            origin, tensor = DTensorOrigin(tensor), dtensor_local(tensor)
        try:
            info = self._describe(tensor, self._buffers[i])
        except TypeError as e:
            raise BindError(f"rank {self.rank}: buffer '{name}': {e}") from None
        problem, code = self._problem(self._buffers[i], info, dtype)
        if problem is not None:
            raise BindError(f"rank {self.rank}: buffer '{name}' is bound with {problem}")
        self._bind_checked(i, info, code, origin)

    def bind_module(self, module: "Union[torch.nn.Module, Mapping[str, torch.Tensor]]", prefix: str = "", *,
                    missing_ok: bool = False,
                    side: Optional[str] = None, strip_prefix: str = "") -> List[str]:
        """Binds every plan buffer to the module's tensor of the same name.

        `side` ("train" or "infer") binds only that side's buffers, for a GPU
        that holds both (a colocated cluster): the training module with
        side="train", the inference engine's with side="infer". A name both
        sides use on the GPU is "train:NAME" / "infer:NAME" in the plan, and
        binds the module tensor NAME of that side.

        `module` is a ``torch.nn.Module`` (its parameters and persistent
        buffers, tied ones under each of their names) or a mapping of names to
        tensors (a state dict, ``dict(model.named_parameters())``). The module
        tensor named N binds the plan buffer ``prefix + N``; `strip_prefix`
        is first removed from the names that start with it (a state dict
        saved from a wrapper: ``strip_prefix="module."`` for DDP's).

        Wrappers are looked through: a module whose only child is
        ``.module`` and that holds no tensor of its own (Megatron's
        ``Float16Module`` and ``DistributedDataParallel``, torch's DDP) binds
        as the model inside it, as Megatron's ``unwrap_model`` does, so
        ``bind_module(model)`` matches a GPTModel's names
        ("decoder.layers.0...") with or without wrappers; unless the plan's
        own names start with ``prefix + "module."`` (a layout written from a
        wrapped state dict), then the names stay as they are. Wrapper
        segments anywhere in a name (``_checkpoint_wrapped_module.`` of
        activation checkpointing, ``_orig_mod.`` of torch.compile,
        ``_fsdp_wrapped_module.`` of FSDP1) are removed, as
        :func:`reshard.layout_from_module` removes them, unless a plan name
        has one: the plan buffer "model.layers.0.mlp.up_proj.weight" binds
        "model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight".

        DTensor parameters (FSDP2's ``fully_shard``, TP) bind their local
        tensor: the sharded parameter this rank holds, which optimizer steps
        update in place and FSDP2 never frees (reshard-after-forward frees
        the all-gathered unsharded parameter, not it). An empty local shard
        binds the plan's zero-size buffer.

        All or nothing: every plan buffer without a tensor (unless
        `missing_ok`) and every tensor that does not fit is reported in one
        BindError, and then nothing is bound. Returns the names of the module's
        tensors that the plan does not bind (not an error: a plan may move a
        subset of the weights).
        """
        self._check_open()
        tensors = self._module_tensors(module, prefix)
        if strip_prefix:
            n0 = len(strip_prefix)
            tensors = [(n[n0:] if n.startswith(strip_prefix) else n, t, o) for n, t, o in tensors]
        found: Dict[int, Any] = {}
        origins: Dict[int, Any] = {}
        unused: List[str] = []
        index = self._index
        mine = range(len(self._buffers))  # the buffers this call binds
        if side is not None:
            if side not in ("train", "infer"):
                raise ValueError(f"side: expected 'train' or 'infer', got {side!r}")
            src = side == "train"
            mine = [i for i, b in enumerate(self._buffers) if (b.is_source if src else b.is_destination)]
            tag = side + ":"
            index = {}
            for i in mine:
                nm = self._buffers[i].name
                index[nm[len(tag):] if nm.startswith(tag) else nm] = i
        for n, t, o in tensors:
            i = index.get(prefix + n)
            if i is None:
                unused.append(n)
            elif i not in found:
                found[i] = t
                origins[i] = o
        problems: List[str] = []
        checked: List[Tuple[int, TensorInfo, int, Any]] = []
        buffers = self._buffers
        for i, t in found.items():
            b = buffers[i]
            try:
                info = self._describe(t, b)
            except TypeError as e:
                problems.append(f"'{b.name}': {e}")
                continue
            problem, code = self._problem(b, info, None)
            if problem is not None:
                problems.append(f"'{b.name}': {problem}")
            else:
                checked.append((i, info, code, origins[i]))
        problems += self._overlaps(checked)
        if not missing_ok and len(found) < len(mine):
            names = [prefix + n for n, _, _ in tensors]
            hint = _prefix_hint([buffers[i].name for i in mine if i not in found], names, prefix)
            if hint:
                problems.insert(0, hint)
            for i in mine:
                b = buffers[i]
                if i not in found:
                    close = difflib.get_close_matches(b.name, names, n=1, cutoff=0.8) if len(names) < 5000 else []
                    hint = f" (closest: '{close[0]}')" if close else ""
                    problems.append(f"'{b.name}': no tensor of that name in the module{hint}")
        if problems:
            shown = problems[:20]
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise BindError(f"rank {self.rank}: bind_module: {len(problems)} of {len(mine)} plan buffers cannot "
                            "be bound, nothing was bound:\n  " + "\n  ".join(shown) + more)
        for i, info, code, t in checked:
            self._bind_checked(i, info, code, t)
        return unused

    def _overlaps(self, checked: List[Tuple[int, TensorInfo, int, Any]]) -> List[str]:
        """Pairs of destination buffers that bind_module would bind to one
        memory (the runtime refuses them one binding at a time; found here
        first, nothing is bound)."""
        spans = []
        rebound = set()
        for i, info, _, _ in checked:
            if self._buffers[i].is_destination:
                rebound.add(i)
                if not info.contiguous:
                    continue  # strided views: checked element by element as they bind
                lo, hi = element_span(info)
                if hi > lo:
                    spans.append((lo, hi, i))
        if not spans:
            return []
        for j, b in enumerate(self._buffers):
            if b.is_destination and j not in rebound and j not in self._staged:
                ptr = self._s.bound_ptr(j)
                if ptr:
                    lo, hi = element_span(describe(self._held[j]))
                    if hi > lo:
                        spans.append((lo, hi, j))
        spans.sort()
        out = []
        end, owner = 0, -1
        for lo, hi, j in spans:
            if lo < end:
                out.append(f"'{self._buffers[j].name}': its memory overlaps that of '{self._buffers[owner].name}': "
                           "both are destinations, so each would overwrite the other's weights; bind each to its "
                           "own tensor")
            if hi > end:
                end, owner = hi, j
        return out

    def module_tensors(self, module: "Union[torch.nn.Module, Mapping[str, torch.Tensor]]",
                       prefix: str = "") -> "List[Tuple[str, torch.Tensor]]":
        """(name, tensor) of what :meth:`bind_module` binds from `module`: its
        parameters and persistent buffers (tied ones under each name), looked
        through Float16Module / DDP wrappers and wrapper segments
        (``_checkpoint_wrapped_module.``, ``_orig_mod.``,
        ``_fsdp_wrapped_module.``) unless the plan's names keep them; a
        DTensor as its local tensor."""
        self._check_open()
        return [(n, t) for n, t, _ in self._module_tensors(module, prefix)]

    def _module_tensors(self, module: Any, prefix: str) -> "List[Tuple[str, torch.Tensor, Any]]":
        """(name, tensor to bind, what check_bindings reads) per module tensor."""
        if hasattr(module, "named_modules"):
            inner = _unwrapped(module)
            if inner is not module and not any(n.startswith(prefix + "module.") for n in self._index):
                module = inner
        strip = self._strip_wrappers
        out: List[Tuple[str, Any, Any]] = []
        for n, t in _named_tensors(module):
            if strip:
                n = strip_wrappers(n)
            if is_dtensor(t):
                out.append((n, dtensor_local(t), DTensorOrigin(t)))
            else:
                out.append((n, t, t))
        return out

    # -- running ----------------------------------------------------------------
    def run(self, stream: Any = None) -> RunStats:
        """Replays this rank's program once, with the GIL released, and returns its stats.

        Raises BindError before any byte moves if a buffer is unbound or a
        bound torch tensor no longer holds the memory it was bound with (its
        storage freed or replaced since: re-bind it; :meth:`check_bindings`
        asks the same without running), and PeerError (PeerTimeoutError)
        when a peer fails or stalls: the message names the step, the peer,
        the first failure's reason and the buffers completely written.

        Any failure of run() ends the transport's use, and every rank hears
        why within about a second instead of waiting out its timeout: a
        later run() or Session on the transport raises, naming the failure;
        make a new transport (and session) for the next refit. Another
        thread's run() of this session in progress is refused at once.

        `stream`: with an NCCL transport, the stream is fixed when the
        transport is made (``NcclTransport(..., stream=)``); pass the same one
        or None. run() returns once the plan's kernels are done.
        """
        self._check_open()
        if stream is not None:
            want = getattr(self.transport, "stream", None)
            from .transport import _handle

            if want is None or _handle(stream, "stream") != want:
                raise ValueError("stream: the stream is fixed when the transport is made "
                                 "(reshard.NcclTransport(..., stream=)); run() takes that one or None")
        staged = self._staged
        try:
            if self._origin:
                self.check_bindings()
            if staged:
                self._stage_in()
        except Exception as e:
            # This rank will not send: its peers learn why now, not at their timeout.
            self._s.abort(f"rank {self.rank}: run() stopped before sending: {type(e).__name__}: {e}")
            self.transport._run_failed()
            raise
        if self._s.running:  # another thread's run(): the runtime refuses this one, the transport unharmed
            return RunStats(self._s.run())
        try:
            stats = RunStats(self._s.run())
        except BaseException:
            self.transport._run_failed()
            raise
        if staged:
            self._stage_out()
        return stats

    def check_bindings(self) -> None:
        """Raises BindError naming every bound torch tensor that no longer
        holds the memory it was bound with: its storage freed (``resize_(0)``:
        FSDP2's reshard after forward, CPU offload, vLLM's sleep mode) or
        replaced (``param.data = ...``). run() calls it first, so nothing is
        sent from or written into memory the framework gave up. NumPy arrays
        and DLPack objects keep their memory while referenced (the session
        holds them); for them, and for the C API, the caller promises that
        bound memory stays allocated and in place until it re-binds."""
        self._check_open()
        stale = [i for i, (t, ptr) in self._origin.items() if t.data_ptr() != ptr]
        if stale:
            raise BindError(self._stale(stale))

    def _stale(self, stale: List[int]) -> str:
        lines = []
        for i in stale[:20]:
            t, ptr = self._origin[i]
            if t.untyped_storage().nbytes() == 0:
                why = "its storage was freed (0 bytes: resize_(0), offloading, sleep mode)"
            else:
                why = f"its memory moved (bound at 0x{ptr:x}, now at 0x{t.data_ptr():x}: .data or storage replaced)"
            lines.append(f"'{self._buffers[i].name}': {why}")
        more = f"\n  ... and {len(stale) - 20} more" if len(stale) > 20 else ""
        return (f"rank {self.rank}: {len(stale)} bound tensor(s) no longer hold the memory they were bound with; "
                "nothing was sent or written. Re-bind them (Session.bind / bind_module) before run():\n  "
                + "\n  ".join(lines) + more)

    def _stage_in(self) -> None:
        for st in self._staged.values():
            if not st.copy_in:
                continue
            if st.kind == "torch":
                st.staging.copy_(st.view)
                if st.staging.is_cuda:
                    import torch

                    torch.cuda.synchronize(st.staging.device)  # reshard's kernels run on their own stream
            else:
                import numpy as np

                np.copyto(st.staging, st.view)

    def _stage_out(self) -> None:
        for st in self._staged.values():
            if not st.copy_out:
                continue
            if st.kind == "torch":
                st.view.copy_(st.staging)
            else:
                import numpy as np

                np.copyto(st.view, st.staging)

    def __repr__(self) -> str:
        if self.closed:
            return f"<reshard.Session rank {self.rank}: closed, {self.transport.kind}>"
        return (f"<reshard.Session rank {self.rank}: {len(self._buffers) - len(self._s.unbound())}"
                f"/{len(self._buffers)} buffers bound, {self.transport.kind}>")


def _prefix_hint(missing: List[str], names: List[str], prefix: str) -> str:
    """What to pass when the module's names and the plan's differ by a
    leading prefix (a state dict of a wrapped model: DDP's "module."), else ""."""
    if not missing or not names:
        return ""
    have = set(names)
    # The module has "P.NAME" for plan buffers NAME: strip P.
    by_rest: Dict[str, str] = {}
    for n in names:
        parts = n.split(".", 3)
        for k in range(1, min(3, len(parts) - 1) + 1):
            head = ".".join(parts[:k]) + "."
            by_rest.setdefault(n[len(head):], head)
    seen: Dict[str, int] = {}
    for m in missing[:50]:
        head = by_rest.get(m)
        if head is not None:
            seen[head] = seen.get(head, 0) + 1
    if seen:
        head, count = max(seen.items(), key=lambda kv: kv[1])
        if count * 2 >= min(len(missing), 50):
            return (f"the module's names start with '{head}' where the plan's do not (a state dict of a wrapped "
                    f"model): bind_module(..., strip_prefix='{head}')")
    # The plan has "P.NAME" for module tensors NAME: prepend P.
    for m in missing[:50]:
        parts = m.split(".", 3)
        for k in range(1, min(3, len(parts) - 1) + 1):
            head = ".".join(parts[:k]) + "."
            if m[len(head):] in have:
                return (f"the plan's names start with '{head}' where the module's do not: "
                        f"bind_module(..., prefix='{prefix + head}')")
    return ""


def _unwrapped(module: Any) -> Any:
    """The model inside wrappers that hold it as their only child ``.module``
    and have no tensors of their own (Float16Module, DistributedDataParallel)."""
    while True:
        children = getattr(module, "_modules", None)
        if (children is None or list(children) != ["module"] or children["module"] is None or module._parameters
                or module._buffers):
            return module
        module = children["module"]


def _named_tensors(module: Any) -> List[Tuple[str, Any]]:
    """(name, tensor) of a module's parameters and persistent buffers, tied
    ones under every name; or the items of a mapping."""
    if not hasattr(module, "named_modules"):
        if isinstance(module, Mapping):
            return list(module.items())
        raise TypeError(f"module: expected a torch.nn.Module or a mapping of names to tensors, got "
                        f"{type(module).__name__}")
    out: List[Tuple[str, Any]] = []
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        pre = mod_name + "." if mod_name else ""
        for n, p in mod._parameters.items():
            if p is not None:
                out.append((pre + n, p))
        non_persistent = mod._non_persistent_buffers_set
        for n, b in mod._buffers.items():
            if b is not None and n not in non_persistent:
                out.append((pre + n, b))
    return out
