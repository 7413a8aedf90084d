"""reshard.slime against slime's own code, as far as it runs on this CPU:
slime's `UpdateWeightFromDistributed` (the class the plug-in subclasses)
imported from a slime checkout, its constructor run by the subclass, the
class swap `reshard.slime.apply` makes in slime's actor module (where that
module imports), and the updater's checks of slime's engines against a
plan compiled from `reshard init --train megatron:... --infer sglang:...`.

Needs a slime checkout (SLIME_SRC=DIR: slime is not on PyPI) and, in the
same venv, Megatron-Core and Ray; skips, saying which is missing,
otherwise. Not run: slime's Ray actors, its SGLangEngine over HTTP, its
Megatron actor's training loop (docs/sglang.md)."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

SLIME = os.environ.get("SLIME_SRC", "")
if not SLIME or not os.path.isdir(os.path.join(SLIME, "slime")):
    pytest.skip("no slime checkout: set SLIME_SRC to a directory holding slime/ (https://github.com/THUDM/slime)",
                allow_module_level=True)
for _mod in ("megatron.core", "ray"):
    pytest.importorskip(_mod, reason=f"reshard.slime's test needs {_mod} beside slime")
sys.path.insert(0, SLIME)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import reshard  # noqa: E402
import reshard.slime as rsl  # noqa: E402
from slime.backends.megatron_utils.update_weight.update_weight_from_distributed import (  # noqa: E402
    UpdateWeightFromDistributed)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MOE = os.path.join(ROOT, "tests", "data", "megatron", "moe-tp2-pp2-ep2", "config.json")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("slime-plan")
    reshard.init(MOE, train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local", infer="sglang:tp=2,ep=2,engines=2",
                 cluster="dgx-h100", out_dir=str(d))
    out = str(d / "plan.rsplan")
    reshard.compile(str(d / "model.json"), str(d / "train.json"), str(d / "infer.json"), str(d / "cluster.json"),
                    out)
    return out


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    store = tmp_path_factory.mktemp("pg") / "init"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_updater_is_slimes_class_with_slimes_constructor(plan, monkeypatch):
    monkeypatch.setenv("RESHARD_PLAN", plan)
    assert issubclass(rsl.ReshardUpdateWeight, UpdateWeightFromDistributed)
    model = [torch.nn.Linear(4, 4)]
    u = rsl.ReshardUpdateWeight(argparse.Namespace(), model, weights_getter=dict, model_name="qwen3moe",
                                quantization_config=None)
    # slime's own constructor ran: its state, its metrics interface
    assert u.model is model and u.model_name == "qwen3moe" and u.weight_version == 0
    assert u.pop_metrics() == {}
    assert u.plan.path == plan


def test_engines_meet_the_plans_inference_ranks(plan, monkeypatch, one_rank_group):
    monkeypatch.setenv("RESHARD_PLAN", plan)
    p = reshard.Plan.open(plan)
    first = p.dest_ranks[0]
    assert rsl.engine_offsets(p, [2, 2]) == [first, first + 2]
    with pytest.raises(ValueError) as e:
        rsl.engine_offsets(p, [4, 4])
    assert str(e.value) == (f"the rollout engines have 8 GPUs ([4, 4] per engine); the plan '{plan}' has 4 inference "
                            "ranks: compile it for these engines")
    u = rsl.ReshardUpdateWeight(argparse.Namespace(rollout_num_gpus_per_engine=2), [torch.nn.Linear(4, 4)],
                                weights_getter=dict, model_name="qwen3moe", quantization_config=None)
    # a one-rank torch world is not the plan's four Megatron ranks
    with pytest.raises(ValueError) as e:
        u.connect_rollout_engines(["engine0", "engine1"], None)
    assert str(e.value) == (f"the Megatron world has 1 ranks; the plan '{plan}' has 4 training ranks: compile it for "
                            "this trainer")
    assert u.offsets == [first, first + 2]  # slime's default: rollout_num_gpus_per_engine per engine


def test_apply_needs_a_plan(monkeypatch):
    monkeypatch.delenv("RESHARD_PLAN", raising=False)
    with pytest.raises(ValueError, match=r"name the plan in RESHARD_PLAN"):
        rsl.apply(argparse.Namespace())


def test_apply_swaps_the_class_slimes_actor_builds(plan, monkeypatch):
    monkeypatch.setenv("RESHARD_PLAN", plan)
    try:
        import slime.backends.megatron_utils.actor as actor
    except (ImportError, OSError) as e:  # it imports torch_memory_saver, wandb, SGLang's GPU kernels, ...
        pytest.skip(f"slime's actor module does not import here: {e}")
    monkeypatch.setattr(actor, "UpdateWeightFromDistributed", actor.UpdateWeightFromDistributed)
    rsl.apply(argparse.Namespace())
    assert actor.UpdateWeightFromDistributed is rsl.ReshardUpdateWeight
