"""tools/dump_state_dict.py on DTensor parameters (real FSDP2 and TP on 4
Gloo processes, mesh dp 2 x tp 2): each rank records its LOCAL shapes, the
placements (Shard, _StridedShard, Replicate) and the device mesh of every
DTensor, with activation checkpointing's wrapper segment removed from the
names; plain tensors keep their entries as before."""
import json
import os
import sys
from datetime import timedelta

import torch
import torch.multiprocessing as mp

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import dump_state_dict  # noqa: E402

WORLD = 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(6, 90, bias=False)  # TP column-parallel, then FSDP: 90 -> 45 -> 23 / 22
        self.norm = torch.nn.RMSNorm(6)
        self.router = torch.nn.Linear(6, 1, bias=False)  # 1 row over dp 2: the second dp rank holds [0, 6]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block()])
        self.register_buffer("steps", torch.zeros(2))


def _rank(rank, tmp):
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    m = Model()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(m.layers[0], mesh["tp"], {"q_proj": ColwiseParallel()})
    m.layers[0] = checkpoint_wrapper(m.layers[0])
    fully_shard(m.layers[0], mesh=mesh["dp"])
    fully_shard(m, mesh=mesh["dp"])
    dump_state_dict.write(os.path.join(tmp, f"rank{rank}.json"), m, rank)
    dist.destroy_process_group()


def test_dtensors_record_local_shapes_placements_and_mesh(tmp_path):
    mp.start_processes(_rank, args=(str(tmp_path),), nprocs=WORLD, join=True, start_method="fork")
    dumps = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    dp_tp = {"names": ["dp", "tp"], "shape": [2, 2]}
    dp = {"names": ["dp"], "shape": [2]}
    for r, d in enumerate(dumps):
        dp_rank = r // 2
        assert d["rank"] == r
        assert d["params"] == [
            {"name": "layers.0.q_proj.weight", "dtype": "torch.float32", "shape": [[23, 6], [22, 6]][dp_rank],
             "placements": ["_StridedShard(dim=0, sf=2)", "Shard(0)"], "mesh": dp_tp},
            {"name": "layers.0.norm.weight", "dtype": "torch.float32", "shape": [3],
             "placements": ["Shard(0)"], "mesh": dp},
            {"name": "layers.0.router.weight", "dtype": "torch.float32", "shape": [[1, 6], [0, 6]][dp_rank],
             "placements": ["Shard(0)"], "mesh": dp},
            {"name": "steps", "dtype": "torch.float32", "shape": [2]}]
