"""reshard.verl's plan helpers: verl's config -> reshard.init arguments, the
plan they make, and the checks of a plan against a model and a rollout. No
verl needed (the plan is often made offline); the backend itself is proven
with real verl by tests/verl/refit.py."""
import json

import pytest

import reshard
import reshard.verl as rv

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "vocab_size": 256, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def job(model="/models/qwen3", trainer=(1, 8), actor=None, rollout=None):
    """A verl PPO config as nested dicts (what Hydra composes), with verl's defaults where unset."""
    a = {"strategy": "fsdp2", "fsdp_config": {"fsdp_size": -1, "model_dtype": "fp32"}}
    a.update(actor or {})
    r = {"name": "vllm", "nnodes": 1, "n_gpus_per_node": 8, "tensor_model_parallel_size": 2, "data_parallel_size": 1,
         "pipeline_model_parallel_size": 1, "expert_parallel_size": 1}
    r.update(rollout or {})
    return {"actor_rollout_ref": {"model": {"path": model}, "actor": a, "rollout": r},
            "trainer": {"nnodes": trainer[0], "n_gpus_per_node": trainer[1]}}


def test_fsdp2_over_every_trainer_rank():
    assert rv.plan_args(job(trainer=(2, 8))) == {"hf_config": "/models/qwen3", "train": "fsdp2:dp_shard=16,master=fp32",
                                                 "infer": "vllm:tp=2,engines=4"}


def test_fsdp_size_is_hsdp_and_bf16_models_are_bf16_masters():
    a = rv.plan_args(job(trainer=(2, 8), actor={"fsdp_config": {"fsdp_size": 8, "model_dtype": "bf16"}}))
    assert a["train"] == "fsdp2:dp_shard=8,dp_replicate=2,master=bf16"


def test_rollout_sizes():
    r = {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2, "data_parallel_size": 2,
         "expert_parallel_size": 8, "nnodes": 4}
    assert rv.plan_args(job(rollout=r))["infer"] == "vllm:tp=4,pp=2,dp=2,ep,engines=2"
    assert rv.plan_args(job(rollout={"n_gpus_per_node": 2}))["infer"] == "vllm:tp=2"


def test_megatron():
    m = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "context_parallel_size": 1,
         "expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1,
         "virtual_pipeline_model_parallel_size": None}
    a = rv.plan_args(job(trainer=(2, 8), actor={"strategy": "megatron", "megatron": m}))
    assert a["train"] == "megatron:tp=2,pp=2,dp=4,ep=4,etp=1"


@pytest.mark.parametrize("config, words", [
    (job(actor={"strategy": "fsdp"}), "FSDP1 holds flattened parameters: use actor.strategy=fsdp2"),
    (job(rollout={"nnodes": 0}), "rollout.nnodes=0 is verl's hybrid engine"),
    (job(rollout={"name": "sglang"}), "rollout.name=sglang: reshard's verl backend writes vLLM 0.33 rollouts"),
    (job(rollout={"n_gpus_per_node": 3}), "3 rollout GPUs are not a whole number of replicas of tp 2"),
    (job(model=None), "actor_rollout_ref.model.path: the model's directory"),
    (job(actor={"fsdp_config": {"fsdp_size": "many"}}), "fsdp_size: expected an integer, got 'many'"),
])
def test_settings_it_does_not_serve_are_named(config, words):
    with pytest.raises(ValueError) as e:
        rv.plan_args(config)
    assert words in str(e.value)


def test_version_line():
    assert rv.version_problem("0.9.1") is None
    line = rv.version_problem("0.10.0")
    assert line == ("reshard.verl is proven on verl 0.9.1; this is verl 0.10.0: set RESHARD_VERL_ANY_VERSION=1 to use "
                    "it anyway (its patches name the verl methods they replace: docs/verl.md)")


def test_version_override(monkeypatch):
    monkeypatch.setenv("RESHARD_VERL_ANY_VERSION", "1")
    assert rv.version_problem("0.10.0") is None


def test_config_lines_select_the_backend():
    lines = rv.config_lines("/shared/refit.rsplan")
    assert lines[:4] == ["actor_rollout_ref.rollout.checkpoint_engine.backend=reshard",
                         "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=reshard.verl",
                         "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.reshard.plan_path="
                         "/shared/refit.rsplan",
                         "+actor_rollout_ref.rollout.engine_kwargs.vllm.weight_transfer_config.backend=reshard"]


def write_config(tmp_path, name, config):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def test_make_plan_names_the_model_by_its_tensors(tmp_path):
    model = write_config(tmp_path, "qwen3", QWEN3)
    plan = reshard.Plan.open(rv.make_plan(job(model=model, trainer=(1, 2), rollout={"n_gpus_per_node": 2}),
                                          str(tmp_path / "plan")))
    assert plan.inputs["source_layout"] == "fsdp2-dp_shard2-fp32"
    assert plan.inputs["dest_layout"] == "vllm-tp2"
    assert plan.inputs["model"] == "qwen3@" + rv.model_fingerprint(model)
    assert len(plan.source_ranks) == 2 and len(plan.dest_ranks) == 2
    rv.check_model(plan, model)  # its own model: no error
    other = write_config(tmp_path, "other", dict(QWEN3, intermediate_size=96))
    with pytest.raises(rv.PlanMismatchError) as e:
        rv.check_model(plan, other)
    assert f"is for model 'qwen3@{rv.model_fingerprint(model)}', whose tensors are not those of {other}" in str(e.value)
    assert rv.model_fingerprint(other) != rv.model_fingerprint(model)


class Rollout:
    def __init__(self, tp, pp=1, dp=1, ep=1):
        self.tensor_model_parallel_size, self.pipeline_model_parallel_size = tp, pp
        self.data_parallel_size, self.expert_parallel_size = dp, ep


def test_rollout_check_names_both(tmp_path):
    model = write_config(tmp_path, "qwen3", QWEN3)
    plan = reshard.Plan.open(rv.make_plan(job(model=model, trainer=(1, 2), rollout={"n_gpus_per_node": 4}),
                                          str(tmp_path / "plan")))
    rv.check_rollout(plan, Rollout(2), 2)
    with pytest.raises(rv.PlanMismatchError) as e:
        rv.check_rollout(plan, Rollout(4), 1)
    assert str(e.value) == ("the plan's inference layout 'vllm-tp2-x2' is TP 2 PP 1 DP 1, 2 engine(s); this job's "
                            "rollout is TP 4 PP 1 DP 1, 1 replica(s): make the plan from this job's config "
                            "(reshard.verl.make_plan)")


def module_of(buffers, wrong=None):
    """A torch module holding, under the plan's names, a tensor of each buffer's shape and dtype (one of them
    `wrong`: another shape), wrapped as Megatron wraps its model (a module whose only child is .module)."""
    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    root = torch.nn.Module()
    for b in buffers:
        *path, leaf = b.name.split(".")
        m = root
        for p in path:
            if p not in m._modules:
                m.add_module(p, torch.nn.Module())
            m = m._modules[p]
        shape = [s + 1 for s in b.shape] if b.name == wrong else list(b.shape)
        m.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape, dtype=dtypes[b.dtype])))
    wrapper = torch.nn.Module()
    wrapper.module = root
    return wrapper


def test_trainer_check_names_the_tensors_that_differ(tmp_path):
    pytest.importorskip("torch")
    model = write_config(tmp_path, "qwen3", QWEN3)
    plan = reshard.Plan.open(rv.make_plan(job(model=model, trainer=(1, 1), rollout={"n_gpus_per_node": 2}),
                                          str(tmp_path / "plan")))
    rank = plan.source_ranks[0]
    buffers = [b for b in plan.buffers(rank) if b.is_source]
    rv.check_trainer(plan, rank, [("", module_of(buffers))])
    name = "model.layers.1.mlp.up_proj.weight"
    with pytest.raises(rv.PlanMismatchError) as e:
        rv.check_trainer(plan, rank, [("", module_of(buffers, wrong=name))])
    assert str(e.value) == (f"plan rank {rank}: the plan's training layout 'fsdp2-dp_shard1-fp32' is not what this "
                            "trainer holds (plain (not DTensor) torch.float32 parameters); nothing was sent:\n"
                            f"  '{name}': the plan has fp32 [128, 64], the trainer holds fp32 [129, 65]")
