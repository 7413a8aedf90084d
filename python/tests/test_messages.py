"""Messages that steer right (issue 59): reshard.compile's and reshard.init's
argument errors are ValueError / TypeError / FileNotFoundError in Python's
argument names; the compiler's own messages reach Python with those names
for the CLI's options; suggestions never change a format's or a cluster's
kind; repr(Plan) shows the digest the ranks compare."""

from __future__ import annotations

import pytest

import reshard
from conftest import CLUSTER, ROOT, SAMPLES
from reshard.compiler import _COMPILE_NAMES, _INIT_NAMES, _python_names

D = SAMPLES / "tiny-dense"
OK = [D / "model.json", D / "train.json", D / "infer.json", CLUSTER]
CONFIG = ROOT / "tests" / "data" / "megatron" / "moe-tp2-pp2-ep2" / "config.json"  # Qwen3-MoE, 4 experts
BUNDLED = ("expected a reshard.cluster/1 file or a bundled cluster: 'dgx-h100' (H100 80 GB, 8 GPUs per NVLink "
           "domain) or 'gb200-nvl72' (GB200 186 GB, 72 GPUs per NVLink domain)")


def raised(kind, fn):
    """The message of the exception of class `kind` that fn() raises (no CompileError where kind is not one)."""
    with pytest.raises(kind) as e:
        fn()
    if not issubclass(kind, reshard.CompileError):
        assert not isinstance(e.value, reshard.CompileError)
    return str(e.value)


def test_compile_arguments_speak_python(tmp_path):
    out = tmp_path / "p.rsplan"
    assert raised(ValueError, lambda: reshard.compile(*OK, out, staging_mb=1)) == \
        "staging_mb=1: expected 2 to 4095 (MiB of staging memory per rank)"
    assert raised(TypeError, lambda: reshard.compile(*OK, out, staging_mb=8.0)) == \
        "staging_mb: expected an int (MiB of staging memory per rank), got float"
    assert raised(TypeError, lambda: reshard.compile(*OK, out, staging_mb=True)) == \
        "staging_mb: expected an int (MiB of staging memory per rank), got bool"
    assert raised(ValueError, lambda: reshard.compile(*OK, out, strategy="drect")) == \
        "strategy='drect': expected 'direct' or 'gather'; did you mean 'direct'?"
    assert raised(FileNotFoundError, lambda: reshard.compile(tmp_path / "model.json", *OK[1:], out)) == \
        f"model: no such file: '{tmp_path / 'model.json'}'"
    assert raised(IsADirectoryError, lambda: reshard.compile(OK[0], tmp_path, *OK[2:], out)) == \
        f"from_: '{tmp_path}' is a directory, expected a reshard.layout/1 file"
    assert raised(TypeError, lambda: reshard.compile(OK[0], OK[1], 3, OK[3], out)) == \
        "to: expected a path (str or os.PathLike), got int"
    assert raised(FileNotFoundError, lambda: reshard.compile(*OK, out, fill_of=tmp_path / "none.rsplan")) == \
        f"fill_of: no such file: '{tmp_path / 'none.rsplan'}'"
    reshard.compile(*OK, tmp_path / "g.rsplan", strategy="gather")
    assert raised(ValueError, lambda: reshard.compile(*OK, out, fill_of=tmp_path / "g.rsplan", search_fills=True)) == \
        "fill_of excludes search_fills=True: the fill of that plan is reused, none is searched"
    assert raised(ValueError, lambda: reshard.compile(*OK, out, strategy="gather", fill_of=tmp_path / "g.rsplan")) == \
        "fill_of: only direct plans fill rounds (this compile is strategy='gather')"
    # The compiler's own message, in Python's names.
    assert raised(reshard.CompileError, lambda: reshard.compile(*OK, out, fill_of=tmp_path / "g.rsplan")) == \
        (f"fill_of='{tmp_path / 'g.rsplan'}': the plan records no round fill (a gather plan, or one written before "
         "reshard recorded it); compile without fill_of")
    assert not out.exists()


def test_an_unknown_cluster_is_a_value_error_that_keeps_the_gpu(tmp_path):
    out = tmp_path / "p.rsplan"
    # Another GPU: the bundled clusters and what each is, never "did you mean 'dgx-h100'".
    assert raised(ValueError, lambda: reshard.compile(*OK[:3], "dgx-h200", out)) == \
        f"cluster: cannot open 'dgx-h200'; {BUNDLED}"
    assert raised(ValueError, lambda: reshard.compile(*OK[:3], "gb200", out)) == \
        f"cluster: cannot open 'gb200'; {BUNDLED}; did you mean 'gb200-nvl72'?"
    assert raised(ValueError, lambda: reshard.init(CONFIG, "hf", "hf", cluster="dgx-h200")) == \
        f"cluster: cannot open 'dgx-h200'; {BUNDLED}"
    assert not out.exists()


def test_the_compilers_flags_become_argument_names():
    assert _python_names("infer.json: tensor 'w': ... more than the 4194304 a round may use (half of --staging-mb "
                         "8); raise --staging-mb to at least 17", _COMPILE_NAMES) == \
        ("infer.json: tensor 'w': ... more than the 4194304 a round may use (half of staging_mb=8); raise staging_mb "
         "to at least 17")
    assert _python_names("--strategy gather: tensor 'w' has no owner", _COMPILE_NAMES) == \
        "strategy='gather': tensor 'w' has no owner"
    assert _python_names("--fill-of excludes --search-fills", _COMPILE_NAMES) == "fill_of excludes search_fills"
    # A path or a quoted name that holds a flag's text is left as it is; flags of other programs too.
    assert _python_names("/tmp/a--cluster/x.json: '--cluster' ... vLLM's --data-parallel-size 2", _COMPILE_NAMES) == \
        "/tmp/a--cluster/x.json: '--cluster' ... vLLM's --data-parallel-size 2"
    assert _python_names("-o: cannot create directory 'x': Not a directory", _INIT_NAMES) == \
        "out_dir: cannot create directory 'x': Not a directory"
    assert _python_names("--infer: dp=2 is vLLM's built-in data parallel ... would be --infer vllm:tp=2,engines=2",
                         _INIT_NAMES) == \
        "infer: dp=2 is vLLM's built-in data parallel ... would be infer='vllm:tp=2,engines=2'"


def test_init_refusals_speak_python_and_name_the_fix():
    assert raised(reshard.CompileError, lambda: reshard.init(CONFIG, "hf", "vllm:tp=2,quant=fp8")) == \
        ("infer='vllm:tp=2,quant=fp8': 'quant' expects one of none, fp8-block, fp8-channel, mxfp8, got 'fp8'; "
         "did you mean 'fp8-block' or 'fp8-channel'?")
    assert raised(reshard.CompileError, lambda: reshard.init(CONFIG, "megatron:tp=3", "hf")) == \
        ("train='megatron:tp=3': Megatron-Core needs num_attention_heads (8) divisible by tensor_model_parallel_size "
         "(3); use tp=1, tp=2, tp=4 or tp=8")
    assert raised(reshard.CompileError, lambda: reshard.init(CONFIG, "hf:tp=1e30", "hf")) == \
        "train='hf:tp=1e30': 'tp' is too large: expected a positive integer up to 1048576, got '1e30'"
    assert raised(ValueError, lambda: reshard.init("", "hf", "hf")) == "hf_config: the path is empty"


def test_plan_repr_shows_the_content_digest(plans):
    plan = reshard.Plan.open(plans["tiny-dense"])
    assert repr(plan) == (f"<reshard.Plan {plan.path!r}: 12 ranks, {plan.num_rounds} rounds, direct, "
                          f"content digest {plan.content_digest}>")
    assert plan.digest not in repr(plan)
