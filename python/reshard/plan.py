"""reshard.Plan: a compiled plan file, opened read-only."""

from __future__ import annotations

import bisect
import os
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

from . import _reshard
from ._tensors import DTYPES

__all__ = ["Plan", "Program", "Buffer"]


class Buffer(NamedTuple):
    """A weight buffer a rank binds: its name, plan dtype ("bf16", "fp16",
    "fp32", "fp8_e4m3", "e8m0") and shape, whether the plan reads it (it
    holds source weights) and/or writes it (it is a destination), and whether
    the framework holds it transposed (`held_transposed`: the layout's
    ``"held": "transposed"``, e.g. vLLM's per-channel FP8 linears, whose
    parameter is ``storage.t()``; binding that view binds the storage)."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    is_source: bool
    is_destination: bool
    held_transposed: bool = False


class Program(NamedTuple):
    """What one global rank does: its index on the training side (`src_rank`,
    -1 if none) and the inference side (`dst_rank`), the staging memory the
    session allocates, its step and round counts, and the buffers it binds."""

    rank: int
    src_rank: int
    dst_rank: int
    staging_bytes: int
    steps: int
    rounds: int
    buffers: Tuple[Buffer, ...]


class Plan:
    """A compiled plan (``reshard compile`` or :func:`reshard.compile`).

    ``Plan.open(path)`` maps the file and verifies it (identifier, schema
    version, flatbuffers verifier); each rank's program is checked when first
    used. Raises :class:`reshard.PlanError` naming the file and what is wrong.

    >>> plan = reshard.Plan.open("tiny-moe.rsplan")
    >>> plan.num_ranks, plan.digest
    >>> [b.name for b in plan.buffers(rank)]
    """

    __slots__ = ("_p", "_programs", "_active")

    def __init__(self, handle: "_reshard._Plan"):
        self._p = handle
        self._programs: Dict[int, Program] = {}
        self._active: Optional[Tuple[int, ...]] = None

    @staticmethod
    def open(path: Union[str, "os.PathLike[str]"]) -> "Plan":
        """Opens and verifies the plan file at `path`."""
        return Plan(_reshard._Plan.open(os.fspath(path)))

    # -- the whole plan ---------------------------------------------------------
    @property
    def path(self) -> str:
        return self._p.path

    @property
    def num_ranks(self) -> int:
        """Global ranks: training ranks and inference ranks (disjoint unless colocated)."""
        return self._p.num_ranks

    @property
    def active_ranks(self) -> Tuple[int, ...]:
        """The plan ranks that need a process, ascending: those the training or
        inference side uses (or that hold buffers or steps). The others are
        idle, the unused GPUs of partly used NVLink domains, and need none.

        A job launches one process per active rank: process ``i`` plays plan
        rank ``active_ranks[i]``, on transports (and NCCL communicators) of
        ``len(active_ranks)`` ranks with rank ``i``. Where no rank is idle,
        process ``i`` plays plan rank ``i``. ``reshard show`` prints the map."""
        if self._active is None:
            self._active = tuple(self._p.active_ranks)
        return self._active

    def process_of(self, rank: int) -> int:
        """The process (transport rank, communicator rank) that plays plan rank
        `rank` in a job launched over the active ranks: its index in
        :attr:`active_ranks`. Raises ValueError for an idle rank."""
        active = self.active_ranks
        i = bisect.bisect_left(active, rank)
        if i == len(active) or active[i] != rank:
            if not 0 <= rank < self.num_ranks:
                raise ValueError(f"rank {rank}: the plan has ranks 0..{self.num_ranks - 1}")
            raise ValueError(f"plan rank {rank} is idle (no side, buffers or steps): it needs no process")
        return i

    @property
    def digest(self) -> str:
        """Digest of the canonicalized compiler inputs: equal digests, equal inputs."""
        return self._p.digest

    @property
    def content_digest(self) -> str:
        """Digest of the whole plan file (32 hex digits, XXH3-128): equal digests,
        the same plan. Every rank's session compares it with every other's at
        connect; ``reshard show`` prints it."""
        return self._p.content_digest

    @property
    def compiler_version(self) -> str:
        return self._p.compiler_version

    @property
    def schema_version(self) -> int:
        return self._p.schema_version

    @property
    def strategy(self) -> str:
        """"direct" or "gather" (the baseline)."""
        return self._p.strategy

    @property
    def inputs(self) -> Dict[str, str]:
        """Names of the specs the plan was compiled from: model, source_layout, dest_layout, cluster."""
        p = self._p
        return {"model": p.model, "source_layout": p.source_layout, "dest_layout": p.dest_layout,
                "cluster": p.cluster}

    @property
    def source_ranks(self) -> List[int]:
        """Global rank of each training-side rank."""
        return list(self._p.src_global)

    @property
    def dest_ranks(self) -> List[int]:
        """Global rank of each inference-side rank."""
        return list(self._p.dst_global)

    @property
    def domains(self) -> List[int]:
        """NVLink domain of each global rank."""
        return list(self._p.domain)

    @property
    def staging_limit(self) -> int:
        """Staging bytes per rank the plan was compiled for (--staging-mb)."""
        return self._p.staging_limit

    @property
    def num_rounds(self) -> int:
        return self._p.num_rounds

    @property
    def net_bytes(self) -> int:
        """Bytes the plan moves over the network channel, all ranks together."""
        return self._p.total_net_bytes

    @property
    def nvlink_bytes(self) -> int:
        return self._p.total_nvlink_bytes

    # -- one rank ---------------------------------------------------------------
    def program(self, rank: int) -> Program:
        """Rank `rank`'s program summary (checked on first use; PlanError if it is invalid or out of range)."""
        prog = self._programs.get(rank)
        if prog is None:
            d = self._p.program(rank)
            buffers = tuple(Buffer(name, DTYPES[dt], shape, bool(role & 1), bool(role & 2), held)
                            for name, dt, shape, role, held in d["buffers"])
            prog = Program(d["rank"], d["src_rank"], d["dst_rank"], d["staging_bytes"], d["steps"], d["rounds"],
                           buffers)
            self._programs[rank] = prog
        return prog

    def buffers(self, rank: int) -> Tuple[Buffer, ...]:
        """The buffers rank `rank` binds, in plan order."""
        return self.program(rank).buffers

    def staging_bytes(self, rank: int) -> int:
        """The staging memory a session of rank `rank` allocates (host for Gloo, device for NCCL)."""
        return self.program(rank).staging_bytes

    def __repr__(self) -> str:
        # The content digest, which every rank's session compares at connect
        # and `reshard show` prints: two plans with equal inputs may differ.
        return (f"<reshard.Plan {self.path!r}: {self.num_ranks} ranks, {self.num_rounds} rounds, "
                f"{self.strategy}, content digest {self.content_digest}>")
