"""reshard.sglang's door into SGLang 0.5.23 without an engine: the refit
request through SGLang's own serializer (what a TP worker's
update_weights_from_tensor hands the custom loader), the loader refusing
what is not a request, the engine check against plans compiled from
`reshard init --infer sglang:...`, and the one-line refusals of a missing
SGLang or another version. Runs where SGLang is installed (build/vllm-venv;
tools/test.d/27-sglang-refit.sh); real ranks: tests/sglang/refit_live.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sglang = pytest.importorskip("sglang", reason="SGLang is not installed here (build/vllm-venv has it)")

import reshard  # noqa: E402
import reshard.sglang as rs  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MOE = os.path.join(ROOT, "tests", "data", "megatron", "moe-tp2-pp2-ep2", "config.json")


def _last_line(code, env=None):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    return r.returncode, lines[-1] if lines else ""


def test_request_round_trips_through_sglangs_own_deserializer():
    from sglang.srt.model_executor.model_runner_components.weight_updater import _unwrap_tensor
    from sglang.srt.utils import MultiprocessingSerializer

    req = rs.RefitRequest(plan_path="/shared/refit.rsplan", rank_offset=4, store="/shared/store", timeout_s=30.0,
                          step=7)
    payload = rs.refit_payload(req, tp_size=4)
    assert len(payload) == 4 and all(isinstance(p, str) for p in payload)  # base64: JSON carries it
    for tp_rank, one in enumerate(payload):
        named = MultiprocessingSerializer.deserialize(one)  # SafeUnpickler, as deserialize_own_rank reads it
        named = [(n, _unwrap_tensor(t, tp_rank=tp_rank, device="cpu")) for n, t in named]
        assert rs.RefitRequest.from_named_tensors(named) == req


def test_loader_refuses_tensors_that_are_not_a_request():
    import torch

    with pytest.raises(ValueError) as e:
        rs.RefitRequest.from_named_tensors([("model.embed_tokens.weight", torch.zeros(2, 2))])
    assert str(e.value) == (
        "reshard.sglang.load_refit: expected one refit request made by reshard.sglang.refit_payload(), got 1 "
        "tensor(s) ('model.embed_tokens.weight'): this loader writes the plan's shards, not tensors sent with "
        "the request")
    with pytest.raises(ValueError, match="the refit request cannot be read"):
        rs.RefitRequest.from_named_tensors([(rs.REQUEST_PREFIX + "{not json", torch.empty(0))])
    with pytest.raises(ValueError, match=r"tp_size=0: expected the engine's TP size"):
        rs.refit_payload(rs.RefitRequest(plan_path="p"), tp_size=0)


@pytest.fixture(scope="module")
def moe_plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("sglang-plan")
    specs = reshard.init(MOE, train="megatron:tp=2,pp=2,ep=2,etp=1,spec=local", infer="sglang:tp=2,ep=2,attn-dp=2",
                         cluster="dgx-h100", out_dir=str(d))
    assert specs["infer"]["name"].startswith("sglang-tp2"), specs["infer"]["name"]
    out = str(d / "plan.rsplan")
    reshard.compile(str(d / "model.json"), str(d / "train.json"), str(d / "infer.json"), str(d / "cluster.json"),
                    out)
    return reshard.Plan.open(out)


def test_plan_settings_read_from_the_layout_init_wrote(moe_plan):
    assert rs.plan_settings(moe_plan) == rs.EngineSettings(tp=2, ep=2, attn_dp=2)


def test_engine_of_other_widths_is_refused_naming_both(moe_plan):
    layout = moe_plan.inputs["dest_layout"]
    rs.check_engine(moe_plan, rs.EngineSettings(tp=2, ep=2, attn_dp=2))
    with pytest.raises(rs.EngineMismatchError) as e:
        rs.check_engine(moe_plan, rs.EngineSettings(tp=2, ep=1, attn_dp=1))
    assert str(e.value) == (
        f"the plan's inference layout '{layout}' is TP 2 EP 2 attention-DP 2; this SGLang engine runs TP 2 EP 1 "
        "attention-DP 1: compile the plan for the engine's settings (reshard init --infer sglang:...)")
    with pytest.raises(rs.EngineMismatchError, match="is TP 2 EP 2 attention-DP 2; this SGLang engine runs TP 4 EP 2"):
        rs.check_engine(moe_plan, rs.EngineSettings(tp=4, ep=2, attn_dp=2))


def test_worker_rank_from_rank_offset(moe_plan):
    settings = rs.EngineSettings(tp=2, ep=2, attn_dp=2)
    first = moe_plan.dest_ranks[0]
    assert [rs.worker_plan_rank(moe_plan, settings, pos, first) for pos in range(2)] == [first, first + 1]
    assert rs.worker_plan_rank(moe_plan, settings, 1, None) == first + 1
    with pytest.raises(rs.WorkerRankError) as e:
        rs.worker_plan_rank(moe_plan, settings, 0, 0)
    assert str(e.value) == (
        f"SGLang worker 0 (rank_offset 0 + 0 = plan rank 0): plan rank 0 is not an inference rank (the plan's "
        f"inference ranks are {first}-{moe_plan.dest_ranks[-1]}): rank_offset is the plan rank of the engine's "
        "first worker")


def test_without_sglang_one_line():
    rc, last = _last_line("import sys; sys.modules['sglang'] = None; import reshard.sglang")
    assert rc != 0
    assert last.startswith(f"ImportError: reshard.sglang needs SGLang {rs.SGLANG_VERSION} in this Python "
                           f"environment (pip install sglang=={rs.SGLANG_VERSION}): "), last


def test_another_sglang_version_one_line():
    code = "import sglang; sglang.__version__ = '0.5.9'; import reshard.sglang"
    env = {k: v for k, v in os.environ.items() if k != "RESHARD_SGLANG_ANY_VERSION"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    last = [x for x in r.stderr.strip().splitlines() if x.strip()][-1]
    assert r.returncode != 0
    assert last == ("ImportError: reshard.sglang was proven against SGLang 0.5.23; this is SGLang 0.5.9, whose "
                    "parameter layouts and weight-update session may differ. Check the layout against a dump of a "
                    "real rank (`reshard check`) and set RESHARD_SGLANG_ANY_VERSION=1 to use it."), last
    r = subprocess.run([sys.executable, "-c", code + "; print('ok')"], capture_output=True, text=True, timeout=300,
                       env=dict(env, RESHARD_SGLANG_ANY_VERSION="1"))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_request_names_its_connection():
    a = rs.RefitRequest(plan_path="p", rank_offset=2, store="s", step=1)
    b = rs.RefitRequest(plan_path="p", rank_offset=2, store="s", step=2)
    assert a.connection() == b.connection()  # a new step does not reconnect
    assert json.loads(a.to_name()[len(rs.REQUEST_PREFIX):])["step"] == 1
