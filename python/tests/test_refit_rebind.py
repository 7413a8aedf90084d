"""reshard.TrainerRefit (python/reshard/refit.py): bind a module once, then
each run re-binds by name what the framework replaced since (a new Parameter,
new storage under .data), never writing through a stale pointer; and
`import reshard.vllm` without vLLM says so in one line."""

import subprocess
import sys

import pytest
import torch

import reshard
import reshard.testing as rt
from conftest import make_sessions, mesh, run_threads


def _modules(plan):
    """{rank: {name: tensor}} of fresh torch tensors for every rank's buffers."""
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}
    return {r: {b.name: torch.zeros(b.shape, dtype=dt[b.dtype]) for b in plan.buffers(r)}
            for r in range(plan.num_ranks)}


class Holder(torch.nn.Module):
    """A module holding one rank's buffers as parameters (p0, p1, ...)."""

    def __init__(self, tensors):
        super().__init__()
        self._names = {}
        for i, (n, t) in enumerate(tensors.items()):
            self.register_parameter(f"p{i}", torch.nn.Parameter(t, requires_grad=False))
            self._names[n] = f"p{i}"

    def param(self, name):
        return getattr(self, self._names[name])


def test_trainer_refit_rebinds_what_the_framework_replaced(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    tensors = _modules(plan)
    sessions = make_sessions(plan, mesh(plan.num_ranks, tmp_path))
    refits = [reshard.TrainerRefit(s, tensors[r]) for r, s in enumerate(sessions)]
    for r, s in enumerate(sessions):
        rt.fill_sources(s)
        rt.poison_destinations(s)
    run_threads([f.run for f in refits])
    for s in sessions:
        assert rt.check_destinations(s).wrong == 0
    # A framework replaces one destination's storage and one source's: the
    # next run re-binds both by name and writes / reads the new memory.
    dst = next(r for r in plan.dest_ranks)
    name = next(b.name for b in sessions[dst].buffers if b.is_destination)
    old = tensors[dst][name]
    tensors[dst][name] = torch.full_like(old, float("nan"))
    assert refits[dst].replaced() == [name]
    old.fill_(0)
    run_threads([f.run for f in refits])
    assert refits[dst].rebinds == 1
    assert sessions[dst].tensor(name).data_ptr() == tensors[dst][name].data_ptr()
    assert not torch.isnan(tensors[dst][name].float()).any()  # written: the new memory
    assert torch.count_nonzero(old) == 0  # the replaced memory was not written
    for s in sessions:
        assert rt.check_destinations(s).wrong == 0


def test_trainer_refit_on_a_module_sees_data_replaced_in_place(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    src = plan.source_ranks[0]
    s = make_sessions(plan, mesh(plan.num_ranks, tmp_path))[src]
    holder = Holder(_modules(plan)[src])
    plan_names = {b.name for b in s.buffers}
    # bind through a mapping of plan names to the module's parameters
    view = {n: holder.param(n) for n in plan_names}
    refit = reshard.TrainerRefit(s, view)
    n = sorted(plan_names)[0]
    assert refit.replaced() == []
    holder.param(n).data = torch.zeros_like(holder.param(n))  # what FSDP / offload / post-processing do
    view[n] = holder.param(n)
    assert refit.replaced() == [n]
    assert refit.rebind_if_replaced() == [n] and refit.rebinds == 1
    assert s.tensor(n).data_ptr() == holder.param(n).data_ptr()
    del view[n]
    with pytest.raises(reshard.BindError, match=f"'{n}' was bound, and the module no longer has it"):
        refit.replaced()


def test_import_reshard_vllm_without_vllm_says_so_in_one_line():
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed in this environment (tests/vllm covers reshard.vllm there)")
    except ImportError:
        pass
    r = subprocess.run([sys.executable, "-c", "import reshard.vllm"], capture_output=True, text=True)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: reshard.vllm needs vLLM 0.33.0 in this Python environment "
                           "(pip install vllm==0.33.0): No module named 'vllm'"), r.stderr
