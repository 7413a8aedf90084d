"""tools/dump_state_dict.py: parameters then persistent buffers (not the
non-persistent ones), wrapper prefixes stripped, tied parameters once, the
file format `reshard check` reads, and the command line on a saved state dict."""
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import dump_state_dict  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3, bias=False, dtype=torch.bfloat16)
        self.norm = torch.nn.RMSNorm(4)
        self.register_buffer("scale", torch.ones(2, dtype=torch.float8_e4m3fn))
        self.register_buffer("cache", torch.zeros(5), persistent=False)


class Wrapper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.module = Block()
        self.tied = self.module.proj  # the same parameters under a second name


def test_params_then_persistent_buffers(tmp_path):
    path = str(tmp_path / "rank3.json")
    dump_state_dict.write(path, Wrapper(), 3, strip="module.", meta={"framework": "test"})
    with open(path) as f:
        d = json.load(f)
    assert d == {"rank": 3, "framework": "test", "params": [
        {"name": "proj.weight", "dtype": "torch.bfloat16", "shape": [3, 4]},
        {"name": "norm.weight", "dtype": "torch.float32", "shape": [4]},
        {"name": "scale", "dtype": "torch.float8_e4m3fn", "shape": [2]}]}


def test_list_of_ranks(tmp_path):
    path = str(tmp_path / "all.json")
    dump_state_dict.write_json(path, [dump_state_dict.rank_dump(Block(), r) for r in range(2)])
    with open(path) as f:
        d = json.load(f)
    assert [r["rank"] for r in d] == [0, 1] and d[1]["params"][0]["name"] == "proj.weight"


def test_command_line_on_a_saved_state_dict(tmp_path):
    ckpt, out = str(tmp_path / "sd.pt"), str(tmp_path / "d.json")
    torch.save({"module.a": torch.zeros(2, 3, dtype=torch.float16), "step": 7}, ckpt)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "dump_state_dict.py"), ckpt, "--rank", "1",
                        "--strip", "module.", "-o", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{out}: rank 1, 1 tensors\n"
    with open(out) as f:
        assert json.load(f) == {"rank": 1, "params": [{"name": "a", "dtype": "torch.float16", "shape": [2, 3]}]}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "dump_state_dict.py"), str(tmp_path / "no.pt"),
                        "-o", out], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith(f"dump_state_dict: {tmp_path / 'no.pt'}: cannot load: ")


def test_views_record_their_strides(tmp_path):
    """A parameter swapped for a transposed view after loading (vLLM's per-channel
    FP8 `weight.t()`) is dumped with its strides, so `reshard check` can see that
    its memory is the layout's."""
    m = Block()
    m.proj.weight = torch.nn.Parameter(m.proj.weight.data.t(), requires_grad=False)
    path = str(tmp_path / "v.json")
    dump_state_dict.write(path, m, 0)
    with open(path) as f:
        d = json.load(f)
    assert d["params"][0] == {"name": "proj.weight", "dtype": "torch.bfloat16", "shape": [4, 3], "stride": [1, 4]}
    assert "stride" not in d["params"][1]
