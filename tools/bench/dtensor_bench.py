#!/usr/bin/env python3
"""reshard.layout_from_module and Session.bind_module on a 2,000-parameter
FSDP2 model: 4 Gloo ranks forked after importing torch and
reshard, a plain torch model with Hugging Face names (400 layers of 5
parameters), fully_shard per layer then the root; each call timed on every
rank, RUNS times; prints the median of the slowest rank's times.

    build/venv/bin/python tools/bench/dtensor_bench.py [--layers 400] [--runs 5]

Needs the Python package (tools/python_install.sh build/venv/bin/python).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp

import reshard

WORLD = 4
H = 32
ROOT = Path(__file__).resolve().parents[2]


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = torch.nn.RMSNorm(H)
        self.q_proj = torch.nn.Linear(H, H, bias=False)
        self.k_proj = torch.nn.Linear(H, H // 2, bias=False)
        self.o_proj = torch.nn.Linear(H, H, bias=False)
        self.post_attention_layernorm = torch.nn.RMSNorm(H)


class Model(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer() for _ in range(layers)])


def model_spec(layers):
    shapes = {"input_layernorm.weight": [H], "q_proj.weight": [H, H], "k_proj.weight": [H // 2, H],
              "o_proj.weight": [H, H], "post_attention_layernorm.weight": [H]}
    return {"format": "reshard.model/1", "name": "bench", "dtype": "fp32", "dims": {"layer": layers},
            "tensors": [{"name": "layers.{layer}." + n, "shape": s} for n, s in shapes.items()]}


def full_layout(spec):
    return {"format": "reshard.layout/1", "name": "full", "model": spec["name"], "ranks": WORLD,
            "meshes": {"r": [["dp", WORLD]]}, "placements": [{"match": "*"}],
            "buffers": [{"name": "full." + t["name"], "tensor": t["name"]} for t in spec["tensors"]]}


def rank_main(rank, tmp, layers, runs):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp_shard",))
    torch.manual_seed(0)
    model = Model(layers)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    spec = model_spec(layers)
    nparams = len(list(model.parameters()))
    times = {"layout_from_module": [], "bind_module": []}
    layout = None
    for _ in range(runs):
        t0 = time.perf_counter()
        layout = reshard.layout_from_module(model, spec)
        times["layout_from_module"].append(time.perf_counter() - t0)
    d = Path(tmp)
    if rank == 0:
        cluster = json.loads((ROOT / "samples/clusters/dgx-h100.json").read_text())
        cluster.update(name="colocated", placement="colocated")
        for name, obj in (("model", spec), ("train", layout), ("infer", full_layout(spec)), ("cluster", cluster)):
            (d / f"{name}.json").write_text(json.dumps(obj))
        reshard.compile(d / "model.json", d / "train.json", d / "infer.json", d / "cluster.json", d / "p.rsplan")
    dist.barrier()
    session = reshard.Session(reshard.Plan.open(d / "p.rsplan"), rank,
                              reshard.GlooTransport(rank, WORLD, store=str(d), prefix="bench", timeout_s=60))
    for _ in range(runs):
        t0 = time.perf_counter()
        session.bind_module(model, missing_ok=True)
        times["bind_module"].append(time.perf_counter() - t0)
    (d / f"rank{rank}.json").write_text(json.dumps({"params": nparams, "times": times}))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=400, help="layers of 5 parameters (default 400: 2,000)")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(rank_main, args=(tmp, a.layers, a.runs), nprocs=WORLD, join=True, start_method="fork")
        got = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(WORLD)]
    print(f"{got[0]['params']} parameters, {WORLD} ranks, median of {a.runs} (slowest rank per run):")
    for what in ("layout_from_module", "bind_module"):
        per_run = [max(g["times"][what][i] for g in got) for i in range(a.runs)]
        print(f"  {what}: {statistics.median(per_run) * 1e3:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
