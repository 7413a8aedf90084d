"""Helpers for tests of a refit: the synthetic weights of ``reshard run``.

Every element of a logical tensor gets a value derived from (tensor,
coordinate) alone (runtime/synthetic.h), so a destination checks what it
received without seeing the source. These write into and read from the
memory a session has bound (through bind / bind_module), so a test exercises
exactly the Python binding path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Union

from . import _reshard
from ._tensors import numpy_dtype, torch_dtype, DTYPE_CODES
from .plan import Plan
from .session import Session

if TYPE_CHECKING:
    import torch

__all__ = ["CheckResult", "fill_sources", "poison_destinations", "check_destinations", "allocate", "fill_sources_at",
           "poison_destinations_at", "check_destinations_at", "write_loopback_plan"]


class CheckResult(NamedTuple):
    checked: int  #: destination elements compared
    wrong: int  #: of them, how many differ from the source's value
    first: List[str]  #: the first wrong ones, in words


def _ptrs(session: Session) -> List[int]:
    return [session._s.bound_ptr(i) for i in range(len(session.buffers))]


def fill_sources_at(plan: Plan, rank: int, tensors: "Dict[str, torch.Tensor]") -> None:
    """fill_sources into host tensors given by buffer name (e.g. host twins of device tensors)."""
    _reshard._testing_fill_sources(plan._p, rank, _named_ptrs(plan, rank, tensors))


def poison_destinations_at(plan: Plan, rank: int, tensors: "Dict[str, torch.Tensor]") -> None:
    _reshard._testing_poison_destinations(plan._p, rank, _named_ptrs(plan, rank, tensors))


def check_destinations_at(plan: Plan, rank: int, tensors: "Dict[str, torch.Tensor]", keep: int = 10) -> CheckResult:
    return CheckResult(*_reshard._testing_check_destinations(plan._p, rank, _named_ptrs(plan, rank, tensors), keep))


def _named_ptrs(plan: Plan, rank: int, tensors: "Dict[str, torch.Tensor]") -> List[int]:
    from ._tensors import describe

    out = []
    for b in plan.buffers(rank):
        info = describe(tensors[b.name])
        if not info.contiguous or info.device != "cpu":
            raise ValueError(f"'{b.name}': host twins must be contiguous CPU tensors")
        out.append(info.ptr)
    return out


def write_loopback_plan(path: str) -> None:
    """The GPU tests' loopback plan (runtime/cuda/loopback_plan.h): 2 ranks,
    rank 1 mirroring rank 0, so that rank 0 alone over a loopback NCCL
    transport (every message to itself) replays a real program."""
    _reshard._testing_write_loopback_plan(str(path))


def _sync(session: Session, to_view: bool) -> None:
    # Strided views are bound through contiguous copies (Session.bind): the
    # helpers work on the copies and keep the views the truth.
    for st in session._staged.values():
        if st.kind == "torch":
            (st.view.copy_(st.staging) if to_view else st.staging.copy_(st.view))
        else:
            import numpy as np

            (np.copyto(st.view, st.staging) if to_view else np.copyto(st.staging, st.view))


def fill_sources(session: Session) -> None:
    """Writes every source fragment's synthetic values into the bound tensors (CPU memory)."""
    _sync(session, to_view=False)
    _reshard._testing_fill_sources(session.plan._p, session.rank, _ptrs(session))
    _sync(session, to_view=True)


def poison_destinations(session: Session) -> None:
    """Fills every destination buffer with a NaN pattern (CPU memory)."""
    _sync(session, to_view=False)
    _reshard._testing_poison_destinations(session.plan._p, session.rank, _ptrs(session))
    _sync(session, to_view=True)


def check_destinations(session: Session, keep: int = 10) -> CheckResult:
    """Compares every destination element of the bound tensors with the
    synthetic source value (CPU memory)."""
    _sync(session, to_view=False)
    return CheckResult(*_reshard._testing_check_destinations(session.plan._p, session.rank, _ptrs(session), keep))


def allocate(session: Session, like: str = "torch", device: str = "cpu") -> "Dict[str, Union[torch.Tensor, Any]]":
    """A fresh tensor for every buffer of the session's rank: torch tensors
    of the plan dtype on `device`, or numpy arrays (bf16/fp8 as uint16/uint8 bits)."""
    out: Dict[str, Any] = {}
    for b in session.buffers:
        code = DTYPE_CODES[b.dtype]
        if like == "torch":
            import torch

            out[b.name] = torch.empty(b.shape, dtype=torch_dtype(code), device=device)
        else:
            import numpy as np

            out[b.name] = np.empty(b.shape, dtype=numpy_dtype(code))
    return out
