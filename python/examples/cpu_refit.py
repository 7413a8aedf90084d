"""A whole refit on this machine, CPU only: compile a bundled sample, start
one process per rank, bind each rank's torch tensors by name, run, check.

    python python/examples/cpu_refit.py [samples/tiny-moe train.json infer-ep.json]

Training ranks fill their tensors with reshard's synthetic weights (so that
every destination element can be checked without a reference copy); in a
real job they would hold the trained model and bind it with
``session.bind_module(model)``.
"""

import os
import sys
import tempfile

import torch
import torch.multiprocessing as mp

import reshard
import reshard.testing as rt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rank_main(process, plan_path, store, results):
    # One process per active plan rank (idle GPUs of partly used NVLink domains need none):
    # process i plays plan rank plan.active_ranks[i] on a transport of len(plan.active_ranks).
    plan = reshard.Plan.open(plan_path)
    rank = plan.active_ranks[process]
    transport = reshard.GlooTransport(process, len(plan.active_ranks), store=store)
    session = reshard.Session(plan, rank, transport)
    weights = rt.allocate(session)  # {buffer name: torch tensor}, as a module's named_parameters() would be
    session.bind_module(weights)
    rt.poison_destinations(session)
    rt.fill_sources(session)
    stats = session.run()
    check = rt.check_destinations(session)
    results.put((rank, stats.net.bytes_sent, stats.seconds, check.checked, check.wrong))


def main():
    sample, train, infer = (sys.argv[1:4] if len(sys.argv) > 3 else ("samples/tiny-moe", "train.json", "infer-ep.json"))
    d = os.path.join(ROOT, sample)
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = os.path.join(tmp, "refit.rsplan")
        summary = reshard.compile(os.path.join(d, "model.json"), os.path.join(d, train), os.path.join(d, infer),
                                  os.path.join(ROOT, "samples/clusters/dgx-h100.json"), plan_path)
        print(summary["summary"])
        plan = reshard.Plan.open(plan_path)
        results = mp.get_context("fork").Queue()
        processes = len(plan.active_ranks)
        mp.start_processes(rank_main, args=(plan_path, tmp, results), nprocs=processes, start_method="fork")
        rows = sorted(results.get() for _ in range(processes))
    for rank, sent, secs, checked, wrong in rows:
        print(f"rank {rank:2d}: sent {sent:8d} B in {secs * 1e3:6.2f} ms, checked {checked:7d} elements, {wrong} wrong")
    wrong = sum(r[4] for r in rows)
    print("every destination element right" if wrong == 0 else f"{wrong} wrong elements")
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
