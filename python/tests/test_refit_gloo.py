"""Every tiny sample's refit, one process per rank (torch.multiprocessing)
over Gloo: each rank binds torch tensors (destinations poisoned, every third
one a strided view), runs, and checks every destination element against the
synthetic source value; then binds fresh destinations and runs again."""

from __future__ import annotations

import uuid

import pytest
import torch
import torch.multiprocessing as mp

import reshard
import reshard.testing as rt
from conftest import TINY

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _rank(rank: int, path: str, store: str, prefix: str, results) -> None:
    plan = reshard.Plan.open(path)
    t = reshard.GlooTransport(rank, plan.num_ranks, store=store, prefix=prefix, timeout_s=60)
    s = reshard.Session(plan, rank, t)
    model = {}
    for i, b in enumerate(s.buffers):
        dt = DTYPES[b.dtype]
        if b.is_destination and len(b.shape) >= 1 and i % 3 == 0:
            wide = torch.zeros(*b.shape[:-1], b.shape[-1] + 2, dtype=dt)
            model[b.name] = wide[..., 1:-1] if b.shape[-1] > 0 else wide[..., :0]
        else:
            model[b.name] = torch.zeros(b.shape, dtype=dt)
    assert s.bind_module(model) == []
    rt.poison_destinations(s)
    rt.fill_sources(s)
    checks = []
    for _ in range(2):
        stats = s.run()
        c = rt.check_destinations(s)
        checks.append((c.checked, c.wrong, c.first, stats.bytes_sent, stats.bytes_received))
        # Re-bind every destination to fresh poisoned memory for the second run.
        for b in s.buffers:
            if b.is_destination:
                s.bind(b.name, torch.zeros(b.shape, dtype=DTYPES[b.dtype]))
        rt.poison_destinations(s)
    results.put((rank, checks))


@pytest.mark.parametrize("name", [t[0] for t in TINY])
def test_tiny_refit_over_gloo(name, plans, tmp_path):
    plan = reshard.Plan.open(plans[name])
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    mp.start_processes(_rank, args=(str(plans[name]), str(tmp_path), uuid.uuid4().hex, results),
                       nprocs=plan.num_ranks, join=True, start_method="fork")
    got = dict(results.get(timeout=30) for _ in range(plan.num_ranks))
    assert sorted(got) == list(range(plan.num_ranks))
    for run in range(2):
        checked = sum(got[r][run][0] for r in got)
        wrong = [(r, got[r][run][2]) for r in got if got[r][run][1]]
        assert not wrong, f"run {run}: wrong elements: {wrong}"
        dest = sum(got[r][run][0] for r in plan.dest_ranks)
        assert checked == dest > 0
        assert sum(got[r][run][3] for r in got) == sum(got[r][run][4] for r in got) > 0
