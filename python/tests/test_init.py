"""reshard.init: `reshard init` in-process. The specs it returns and writes are
the CLI's byte for byte; a refused setting raises CompileError with the CLI's
message, in Python's argument names (train='...' for --train '...'), and
writes nothing."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

import reshard
from conftest import ROOT, reshard_binary

CONFIG = ROOT / "tests" / "data" / "megatron" / "moe-tp2-pp2-ep2" / "config.json"  # Qwen3-MoE, 4 experts
TRAIN = "megatron:tp=2,pp=2,ep=2,etp=1,spec=local"
INFER = "vllm:tp=4"


def cli():
    b = reshard_binary()
    if not b.exists():
        pytest.skip(f"the reshard CLI is not built at {b} (build it, or set RESHARD_BIN)")
    return b


def test_init_writes_and_returns_what_the_cli_writes(tmp_path):
    out = subprocess.run([str(cli()), "init", "--hf-config", CONFIG.parent, "--train", TRAIN, "--infer", INFER,
                          "--cluster", "dgx-h100", "-o", tmp_path / "cli"], check=True, capture_output=True,
                         text=True).stdout
    specs = reshard.init(CONFIG.parent, train=TRAIN, infer=INFER, cluster="dgx-h100", out_dir=tmp_path / "py")
    names = ["model.json", "train.json", "infer.json", "cluster.json"]
    assert sorted(p.name for p in (tmp_path / "py").iterdir()) == sorted(names)
    for n in names:
        assert (tmp_path / "py" / n).read_bytes() == (tmp_path / "cli" / n).read_bytes(), n
        assert specs[n[:-5]] == json.loads((tmp_path / "cli" / n).read_text()), n
    assert list(specs) == ["model", "train", "infer", "cluster", "notes"]
    # The lines the CLI prints under "wrote ...", indented by two spaces, in Python's names.
    assert ["  " + n for n in specs["notes"]] == [as_python(line) for line in out.splitlines()
                                                  if line.startswith("  ") and not line.startswith("  reshard compile")]
    assert specs["notes"][:2] == ["train: megatron-tp2-pp2-ep2-local, 4 ranks", "infer: vllm-tp4, 4 ranks"]
    assert "infer: TP 4 > 2 KV heads: each KV head replicated on 2 ranks" in specs["notes"]
    # What it wrote compiles.
    d = tmp_path / "py"
    summary = reshard.compile(d / "model.json", d / "train.json", d / "infer.json", d / "cluster.json",
                              tmp_path / "plan.rsplan", staging_mb=2)
    assert summary["ranks"] == 8


def test_init_without_out_dir_writes_nothing_and_takes_a_config_mapping(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from_path = reshard.init(str(CONFIG), "hf", "hf:tp=2")
    from_dict = reshard.init(json.loads(CONFIG.read_text()), "hf", "hf:tp=2", name=from_path["model"]["name"])
    assert list(tmp_path.iterdir()) == []
    assert from_dict == from_path
    assert "cluster" not in from_path
    assert from_path["infer"]["ranks"] == 2 and from_path["model"]["format"] == "reshard.model/1"
    assert reshard.init(CONFIG, "hf", "hf", name="mine")["model"]["name"] == "mine"


def as_python(cli_text):
    """The CLI's text as reshard.init says it: --train 'x' -> train='x', --infer: -> infer:, -o -> out_dir."""
    text = re.sub(r"--(train|infer) '", r"\1='", cli_text)
    return re.sub(r"^-o:", "out_dir:", re.sub(r"--(train|infer|cluster)\b", r"\1", text))


def cli_error(*args):
    r = subprocess.run([str(cli()), "init", *map(str, args)], capture_output=True, text=True)
    assert r.returncode != 0 and r.stdout == ""
    prefix = "reshard: error: "
    assert r.stderr.startswith(prefix) and r.stderr.endswith("\n")
    return r.stderr[len(prefix):-1]


@pytest.mark.parametrize("train,infer,message", [
    ("megatron:tp=2,ep=3", INFER,
     "train='megatron:tp=2,ep=3': Megatron-Core needs num_moe_experts (4) divisible by "
     "expert_model_parallel_size (3)"),
    ("megatron:tp=3", INFER,
     "train='megatron:tp=3': Megatron-Core needs num_attention_heads (8) divisible by tensor_model_parallel_size (3); "
     "use tp=1, tp=2, tp=4 or tp=8"),
    ("megatron:tp=2,pq=2", INFER, None),
    (TRAIN, "vllm:tp=3", None),
])
def test_init_refusals_carry_the_cli_message_and_write_nothing(tmp_path, train, infer, message):
    out = tmp_path / "out"
    with pytest.raises(reshard.CompileError) as e:
        reshard.init(CONFIG, train=train, infer=infer, out_dir=out)
    assert not out.exists()
    if message is not None:
        assert str(e.value) == message
    args = ["--hf-config", CONFIG, "--train", train, "--infer", infer, "-o", tmp_path / "cli"]
    assert str(e.value) == as_python(cli_error(*args))
    assert not (tmp_path / "cli").exists()


def test_init_unknown_cluster_is_a_value_error(tmp_path):
    with pytest.raises(ValueError) as e:
        reshard.init(CONFIG, train=TRAIN, infer=INFER, cluster="nowhere-nvl9", out_dir=tmp_path / "out")
    assert str(e.value) == ("cluster: cannot open 'nowhere-nvl9'; expected a reshard.cluster/1 file or a bundled "
                            "cluster: 'dgx-h100' (H100 80 GB, 8 GPUs per NVLink domain) or 'gb200-nvl72' (GB200 186 "
                            "GB, 72 GPUs per NVLink domain)")
    assert not (tmp_path / "out").exists()
    assert str(e.value) == as_python(cli_error("--hf-config", CONFIG, "--train", TRAIN, "--infer", INFER, "--cluster",
                                               "nowhere-nvl9", "-o", tmp_path / "cli"))


def test_init_bad_config_messages(tmp_path):
    missing = tmp_path / "none" / "config.json"
    with pytest.raises(FileNotFoundError) as e:
        reshard.init(missing, "hf", "hf", out_dir=tmp_path / "out")
    assert str(e.value) == f"hf_config: no such file or directory: '{missing}'"
    assert cli_error("--hf-config", missing, "--train", "hf", "--infer", "hf", "-o", tmp_path / "o") == \
        f"{missing}: cannot open file: No such file or directory"
    broken = tmp_path / "config.json"
    broken.write_text('{"model_type": "llama",}')
    with pytest.raises(reshard.CompileError) as e:
        reshard.init(tmp_path, "hf", "hf")  # the directory: its config.json
    assert str(e.value).startswith(f"{broken}:1:")
    assert str(e.value) == cli_error("--hf-config", tmp_path, "--train", "hf", "--infer", "hf", "-o", tmp_path / "o")
    with pytest.raises(reshard.CompileError) as e:
        reshard.init({"model_type": "gpt2"}, "hf", "hf")
    assert "model_type 'gpt2'" in str(e.value) and "llama" in str(e.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()
    with pytest.raises(TypeError, match="train: expected a str"):
        reshard.init(CONFIG, 2, "hf")


def test_init_out_dir_that_cannot_be_made(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(reshard.CompileError) as e:
        reshard.init(CONFIG, "hf", "hf", out_dir=f / "specs")
    assert str(e.value) == f"out_dir: cannot create directory '{f / 'specs'}': Not a directory"
    assert str(e.value) == as_python(cli_error("--hf-config", CONFIG, "--train", "hf", "--infer", "hf", "-o", f / "specs"))
