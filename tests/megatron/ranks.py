"""Runs a function on every rank of a Gloo group of CPU processes
(torch.multiprocessing), one process per Megatron rank."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from free_port import free_port  # noqa: E402  (tests/free_port.py: below the ephemeral range)


def _entry(rank, world, port, fn, args):
    import warnings
    warnings.filterwarnings("ignore")  # Megatron warns about Apex, absl, deprecations on every rank
    sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tools")]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()


def spawn(world, fn, *args, join=True):
    """fn(rank, *args) on `world` processes; with join=False returns the
    context (call .join() until it returns True)."""
    return mp.start_processes(_entry, args=(world, free_port(), fn, args), nprocs=world, join=join,
                              start_method="spawn")
