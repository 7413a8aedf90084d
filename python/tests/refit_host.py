"""One "host" of a multi-host refit: ranks FIRST..LAST of PLAN as threads of
this process, meeting the other hosts' ranks through RENDEZVOUS (a directory
or HOST:PORT) and listening on HOSTNAME. Each rank binds fresh torch tensors,
poisons its destinations, fills its sources, runs, and checks every element.
Prints one line: "ok CHECKED WRONG" (or raises).

    python refit_host.py PLAN FIRST LAST RENDEZVOUS HOSTNAME
"""

import sys
import threading

import torch

import reshard
import reshard.testing as rt


def main(path, first, last, rendezvous, hostname):
    plan = reshard.Plan.open(path)
    results, errors = [], []

    def rank(r):
        try:
            t = reshard.GlooTransport(r, plan.num_ranks, store=rendezvous, hostname=hostname, timeout_s=60)
            s = reshard.Session(plan, r, t)
            s.bind_module(rt.allocate(s))
            rt.poison_destinations(s)
            rt.fill_sources(s)
            s.run()
            c = rt.check_destinations(s)
            results.append((c.checked, c.wrong, c.first))
        except BaseException as e:  # noqa: BLE001
            errors.append(f"rank {r}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(first, last + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit("\n".join(errors))
    wrong = [w for _, n, w in results if n]
    print(f"ok {sum(c for c, _, _ in results)} {sum(n for _, n, _ in results)} {wrong[:1]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
