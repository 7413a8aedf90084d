"""Helpers for tests of a refit: the synthetic weights of ``reshard run``.

Every element of a logical tensor gets a value derived from (tensor,
coordinate) alone (runtime/synthetic.h), so a destination checks what it
received without seeing the source. These write into and read from the
memory a session has bound (through bind / bind_module), so a test exercises
exactly the Python binding path.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple

from . import _reshard
from ._tensors import numpy_dtype, torch_dtype, DTYPE_CODES
from .session import Session


class CheckResult(NamedTuple):
    checked: int  #: destination elements compared
    wrong: int  #: of them, how many differ from the source's value
    first: List[str]  #: the first wrong ones, in words


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
    _reshard._testing_fill_sources(session._s)
    _sync(session, to_view=True)


def poison_destinations(session: Session) -> None:
    """Fills every destination buffer with a NaN pattern (CPU memory)."""
    _sync(session, to_view=False)
    _reshard._testing_poison_destinations(session._s)
    _sync(session, to_view=True)


def check_destinations(session: Session, keep: int = 10) -> CheckResult:
    """Compares every destination element of the bound tensors with the
    synthetic source value (CPU memory)."""
    _sync(session, to_view=False)
    return CheckResult(*_reshard._testing_check_destinations(session._s, keep))


def allocate(session: Session, like: str = "torch", device: str = "cpu") -> Dict[str, Any]:
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
