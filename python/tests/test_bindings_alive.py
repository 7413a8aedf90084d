"""Bindings alive at every run: a bound torch tensor whose storage a
framework freed (FSDP2's reshard after forward, offload, vLLM's sleep mode:
``untyped_storage().resize_(0)``) or replaced (``param.data = ...``) is
refused by name before any byte moves, on a source and on a destination."""

import pytest
import torch

import reshard
import reshard.testing as rt
from conftest import make_sessions, mesh, run_all, run_threads


def _bound(plan, tmp_path):
    sessions = make_sessions(plan, mesh(plan.num_ranks, tmp_path))
    for s in sessions:
        for b in s.buffers:
            s.bind(b.name, torch.zeros(b.shape, dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[b.dtype]))
        rt.fill_sources(s)
        rt.poison_destinations(s)
    return sessions


def _first(s, destination):
    return next(b.name for b in s.buffers if b.is_destination == destination and b.is_source != destination)


@pytest.mark.parametrize("side", ["source", "destination"])
def test_freed_storage_is_refused_by_name(plans, tmp_path, side):
    plan = reshard.Plan.open(plans["tiny-dense"])
    sessions = _bound(plan, tmp_path)
    rank = plan.source_ranks[0] if side == "source" else plan.dest_ranks[0]
    s = sessions[rank]
    name = _first(s, side == "destination")
    s.tensor(name).untyped_storage().resize_(0)
    message = (f"rank {rank}: 1 bound tensor(s) no longer hold the memory they were bound with; nothing was sent or "
               f"written. Re-bind them (Session.bind / bind_module) before run():\n  '{name}': its storage was freed "
               "(0 bytes: resize_(0), offloading, sleep mode)")
    # check_bindings() asks without ending anything: re-bound, the refit runs and is exact.
    with pytest.raises(reshard.BindError) as e:
        s.check_bindings()
    assert str(e.value) == message
    b = next(b for b in s.buffers if b.name == name)
    s.bind(name, torch.zeros(b.shape, dtype=torch.bfloat16 if b.dtype == "bf16" else torch.float32))
    if side == "source":
        rt.fill_sources(s)
    else:
        rt.poison_destinations(s)
    run_threads([x.run for x in sessions])
    for x in sessions:
        assert rt.check_destinations(x).wrong == 0
    # run() itself refuses the same way, and tells its peers: they end at once
    # naming it instead of waiting for a rank that will not send.
    s.tensor(name).untyped_storage().resize_(0)
    errors = run_all(sessions)
    assert str(errors[rank]) == message and isinstance(errors[rank], reshard.BindError)
    told = [err for r, err in errors.items() if r != rank]
    assert told and all(f"another rank failed first: rank {rank}: run() stopped before sending: BindError: "
                        f"{message}" in str(err) for err in told), [str(err) for err in told]


def test_replaced_data_is_refused_by_name(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    sessions = make_sessions(plan, mesh(plan.num_ranks, tmp_path))
    rank = plan.dest_ranks[0]
    s = sessions[rank]
    b = next(b for b in s.buffers if b.is_destination)
    p = torch.nn.Parameter(torch.zeros(b.shape, dtype=torch.bfloat16), requires_grad=False)
    s.bind(b.name, p)
    s.check_bindings()
    old = p.data_ptr()
    p.data = torch.zeros_like(p)  # what post-processing and offload do
    with pytest.raises(reshard.BindError, match=(rf"'{b.name}': its memory moved \(bound at 0x{old:x}, now at "
                                                 rf"0x{p.data_ptr():x}: .data or storage replaced\)")):
        s.run()
    s.bind(b.name, p)
    s.check_bindings()  # re-bound: fine again
