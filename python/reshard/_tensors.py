"""What reshard needs to know about a tensor: address, dtype, shape, layout,
device, and an object that keeps its memory alive.

PyTorch tensors and NumPy arrays are read through their own attributes (fast,
and covers FP8 dtypes that not every DLPack exporter supports); any other
object is read through DLPack (``__dlpack__``: CuPy, JAX, ...).
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple, Optional, Tuple

from . import _reshard

# Plan dtypes (schema/plan.fbs fb::Dtype) by code and name.
DTYPES = ("bf16", "fp16", "fp32", "fp8_e4m3", "e8m0")
DTYPE_CODES = {name: code for code, name in enumerate(DTYPES)}
DTYPE_SIZES = (2, 2, 4, 1, 1)

_TORCH_NAMES = {
    "torch.bfloat16": 0,
    "torch.float16": 1,
    "torch.float32": 2,
    "torch.float8_e4m3fn": 3,
    "torch.float8_e8m0fnu": 4,
}
_NUMPY_NAMES = {"bfloat16": 0, "float16": 1, "float32": 2, "float8_e4m3fn": 3, "float8_e8m0fnu": 4}
# DLPack (code, bits) -> plan dtype: kDLFloat 2, kDLBfloat 4, kDLFloat8_e4m3fn 10, kDLFloat8_e8m0fnu 14.
_DLPACK_CODES = {(2, 16): 1, (2, 32): 2, (4, 16): 0, (10, 8): 3, (14, 8): 4}
_DLPACK_DEVICES = {1: "cpu", 2: "cuda", 3: "cpu", 13: "cuda"}  # CPU, CUDA, CUDA host (pinned), CUDA managed

_torch_codes: dict = {}


class TensorInfo(NamedTuple):
    ptr: int
    dtype: Optional[int]  # plan dtype code, None when the tensor's dtype is none of them
    dtype_name: str  # the tensor's own name for its dtype
    itemsize: int
    shape: Tuple[int, ...]
    contiguous: bool
    device: str  # "cpu" or "cuda"
    device_index: int  # -1 for cpu
    writable: bool
    keep: Any  # holds the memory alive
    kind: str  # "torch", "numpy" or "dlpack"
    strides: Tuple[int, ...] = ()  # in elements


def _describe_torch(t: Any) -> TensorInfo:
    dtype = t.dtype
    code = _torch_codes.get(dtype, -1)
    if code == -1:
        code = _TORCH_NAMES.get(str(dtype))
        _torch_codes[dtype] = code
    if t.is_cpu:
        device, index = "cpu", -1
    else:
        dev = t.device
        device, index = dev.type, -1 if dev.index is None else dev.index
    # detach(): a tensor sharing the storage, so a later `param.data = ...`
    # swap cannot free the memory reshard writes into.
    contiguous = t.is_contiguous()
    return TensorInfo(t.data_ptr(), code, str(dtype), t.element_size() if code is None else DTYPE_SIZES[code],
                      t.shape, contiguous, device, index, True, t.detach(), "torch", () if contiguous else t.stride())


_by_type: dict = {}


def transposed_storage(t: Any, info: TensorInfo, shape: tuple) -> Any:
    """The memory under `t` seen as `shape`, when `t` is the transposed view
    of contiguous 2-D memory of `shape` (vLLM's per-channel FP8 linears are,
    after loading, ``weight.t()``: [in, out] over [out, in] row-major memory);
    else None. The result shares `t`'s memory: binding it binds `t`'s bytes.
    Used only for buffers the layout declares held transposed."""
    if info.contiguous or len(info.shape) != 2 or len(shape) != 2 or tuple(info.shape) != (shape[1], shape[0]):
        return None
    if info.kind == "torch":
        view = t.t()
        return view if view.is_contiguous() else None
    if info.kind == "numpy":
        view = t.T
        return view if view.flags["C_CONTIGUOUS"] else None
    return None


def describe(t: Any) -> TensorInfo:
    """Reads a tensor's facts; raises TypeError for objects that are no tensor."""
    fn = _by_type.get(type(t))
    if fn is not None:
        return fn(t)
    mod = type(t).__module__
    # torch tensors, and subclasses from other packages (vLLM's
    # ModelWeightParameter, BasevLLMParameter, ...) by their base class
    if hasattr(t, "data_ptr") and any(c.__module__.startswith("torch") and c.__name__ == "Tensor"
                                      for c in type(t).__mro__):
        _by_type[type(t)] = _describe_torch
        return _describe_torch(t)
    if mod == "numpy" and hasattr(t, "__array_interface__"):
        ai = t.__array_interface__
        contiguous = t.flags.c_contiguous
        return TensorInfo(ai["data"][0], _NUMPY_NAMES.get(t.dtype.name), t.dtype.name, t.itemsize, t.shape,
                          contiguous, "cpu", -1, t.flags.writeable, t, "numpy",
                          () if contiguous else tuple(x // t.itemsize for x in t.strides))
    if hasattr(t, "__dlpack__"):
        try:
            ptr, (code, bits, lanes), shape, strides, dev_type, dev_id = _reshard._dlpack_info(t)
        except TypeError as e:
            raise TypeError(f"cannot read {type(t).__name__} through DLPack: {e}") from None
        contiguous = True
        expect = 1
        for n, s in zip(reversed(shape), reversed(strides)):
            if n != 1 and s != expect:
                contiguous = False
            expect *= n
        dtype = _DLPACK_CODES.get((code, bits)) if lanes == 1 else None
        device = _DLPACK_DEVICES.get(dev_type, f"dlpack device type {dev_type}")
        return TensorInfo(ptr, dtype, f"dlpack(code={code}, bits={bits}, lanes={lanes})", bits * lanes // 8, tuple(shape),
                          contiguous, device, dev_id if device == "cuda" else -1, True, t, "dlpack",
                          () if contiguous else tuple(strides))
    raise TypeError(f"{type(t).__module__}.{type(t).__name__} is not a tensor "
                    "(expected a torch.Tensor, a numpy.ndarray or an object with __dlpack__)")


# The element types that hold a plan dtype's bits as raw integers, by size
# (numpy has no bfloat16 or FP8: an array of them is declared with `dtype=`).
RAW_BITS = {1: "uint8", 2: "uint16", 4: "uint32"}


def self_overlapping(shape: Tuple[int, ...], strides: Tuple[int, ...]) -> bool:
    """Whether a strided view may reach one element through two indices
    (a stride of 0 on a dim of more than one, as ``expand`` makes, or strides
    that interleave): dims by increasing stride, each stride must exceed the
    farthest offset the smaller ones reach."""
    reach = 0
    for n, st in sorted(((n, abs(st)) for n, st in zip(shape, strides) if n > 1), key=lambda x: x[1]):
        if st <= reach:
            return True
        reach += (n - 1) * st
    return False


def element_span(info: "TensorInfo") -> Tuple[int, int]:
    """[first byte, end) of the memory a view's elements lie in."""
    if info.contiguous or not info.strides:
        n = 1
        for d in info.shape:
            n *= d
        return info.ptr, info.ptr + n * info.itemsize
    lo = hi = 0
    for n, st in zip(info.shape, info.strides):
        if n == 0:
            return info.ptr, info.ptr
        if st > 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return info.ptr + lo * info.itemsize, info.ptr + (hi + 1) * info.itemsize


def element_offsets(info: "TensorInfo"):
    """The byte addresses of a view's elements, as a numpy array."""
    import numpy as np

    offs = np.zeros((), dtype=np.int64)
    for n, st in zip(info.shape, info.strides or _contiguous_strides(info.shape)):
        offs = np.add.outer(offs, np.arange(n, dtype=np.int64) * st)
    return info.ptr + offs.ravel() * info.itemsize


def _contiguous_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def torch_dtype(code: int):
    """The torch dtype of a plan dtype code."""
    import torch

    return {0: torch.bfloat16, 1: torch.float16, 2: torch.float32, 3: torch.float8_e4m3fn,
            4: getattr(torch, "float8_e8m0fnu", None)}[code]


def numpy_dtype(code: int):
    """The numpy dtype holding a plan dtype's bits (uint16/uint8 where numpy has no such float)."""
    import numpy as np

    return {0: np.uint16, 1: np.float16, 2: np.float32, 3: np.uint8, 4: np.uint8}[code]


def module_loaded(name: str) -> bool:
    return name in sys.modules


# Module wrappers that insert a segment into parameter names: activation
# checkpointing (checkpoint_wrapper), torch.compile (OptimizedModule), FSDP1.
WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")
_WRAPPERS = frozenset(WRAPPER_SEGMENTS)


def strip_wrappers(name: str) -> str:
    """`name` without wrapper segments (``_checkpoint_wrapped_module.``,
    ``_orig_mod.``, ``_fsdp_wrapped_module.``) wherever they appear:
    "model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight" ->
    "model.layers.0.mlp.up_proj.weight"."""
    if "_" not in name:
        return name
    parts = name.split(".")
    if not _WRAPPERS.intersection(parts):
        return name
    return ".".join(p for p in parts if p not in _WRAPPERS)


_dtensor_types: dict = {}


def is_dtensor(t: Any) -> bool:
    """Whether `t` is a torch DTensor (FSDP2's sharded parameters), without importing torch.distributed."""
    cls = type(t)
    r = _dtensor_types.get(cls)
    if r is None:
        r = any(c.__name__ == "DTensor" and c.__module__.startswith("torch.distributed") for c in cls.__mro__)
        _dtensor_types[cls] = r
    return r


def dtensor_local(t: Any) -> Any:
    """The local tensor of a DTensor: the memory this rank holds (FSDP2's
    sharded parameter, which optimizer steps update in place)."""
    local = getattr(t, "_local_tensor", None)
    return local if local is not None else t.to_local()


class DTensorOrigin:
    """What check_bindings reads for a bound DTensor: its local tensor now (a
    framework may give the DTensor a new local tensor, as FSDP2's
    reset_sharded_param does after load_state_dict(assign=True))."""

    __slots__ = ("dtensor",)

    def __init__(self, dtensor: Any):
        self.dtensor = dtensor

    def data_ptr(self) -> int:
        return dtensor_local(self.dtensor).data_ptr()

    def untyped_storage(self) -> Any:
        return dtensor_local(self.dtensor).untyped_storage()
