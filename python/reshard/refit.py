"""Bind a module once, run each step: parameters a framework replaced since
binding (a new Parameter, or new storage under ``.data``: post-processing,
offload, sleep mode) are re-bound by name first, never written through a
stale pointer. No framework imports: the trainer side runs anywhere."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Tuple, Union

from .errors import BindError
from .session import RunStats, Session

if TYPE_CHECKING:
    import torch

__all__ = ["BoundModule", "TrainerRefit"]


def _identity(t: "torch.Tensor") -> Tuple[int, int, int]:
    return id(t), t.data_ptr(), t.untyped_storage().nbytes()


class BoundModule:
    """A session bound to a module's tensors, re-bound by name when the
    framework replaced one (a new Parameter, or new storage under .data)."""

    def __init__(self, session: Session, module: "Union[torch.nn.Module, Mapping[str, torch.Tensor]]"):
        if not isinstance(session, Session):
            raise TypeError(f"session: expected a reshard.Session, got {type(session).__name__}")
        self.session = session
        self.module = module
        self.rebinds = 0
        self._bind()

    def _tensors(self) -> "Dict[str, torch.Tensor]":
        return dict(self.session.module_tensors(self.module))

    def _bind(self) -> None:
        self.session.bind_module(self.module)
        tensors = self._tensors()
        self._ids = {b.name: _identity(tensors[b.name]) for b in self.session.buffers if b.name in tensors}

    def replaced(self) -> List[str]:
        """Names of bound tensors the module no longer holds as bound."""
        tensors = self._tensors()
        out = []
        for name, ident in self._ids.items():
            t = tensors.get(name)
            if t is None:
                raise BindError(f"rank {self.session.rank}: '{name}' was bound, and the module no longer has it "
                                "(the engine removed the parameter): nothing was written")
            if _identity(t) != ident:
                out.append(name)
        return out

    def rebind_if_replaced(self) -> List[str]:
        names = self.replaced()
        if names:
            self._bind()  # all or nothing; a shape or dtype the plan does not have is a BindError naming it
            self.rebinds += 1
        return names


class TrainerRefit(BoundModule):
    """A training rank's side: its module bound once, :meth:`run` per step
    (parameters the framework replaced since binding are re-bound first)."""

    def run(self) -> RunStats:
        self.rebind_if_replaced()
        return self.session.run()
