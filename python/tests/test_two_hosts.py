"""A refit across two "hosts": the ranks of tiny-moe split over two Linux
network namespaces joined by a veth pair (created and removed here), meeting
through the TCP rendezvous (no shared directory), every element checked.
Skipped with a message where namespaces cannot be created (no root, no `ip`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import reshard

HERE = Path(__file__).resolve().parent


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is missing: cannot create network namespaces")
    tag = uuid.uuid4().hex[:6]
    a, b = f"rsA{tag}", f"rsB{tag}"
    made = []
    try:
        r = _ip("netns", "add", a)
        if r.returncode != 0:
            pytest.skip(f"cannot create a network namespace here ({r.stderr.strip()}); needs root / CAP_NET_ADMIN")
        made.append(a)
        assert _ip("netns", "add", b).returncode == 0
        made.append(b)
        for cmd in (["link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}"],
                    ["link", "set", f"va{tag}", "netns", a], ["link", "set", f"vb{tag}", "netns", b],
                    ["-n", a, "addr", "add", "10.213.0.1/24", "dev", f"va{tag}"],
                    ["-n", b, "addr", "add", "10.213.0.2/24", "dev", f"vb{tag}"],
                    ["-n", a, "link", "set", f"va{tag}", "up"], ["-n", b, "link", "set", f"vb{tag}", "up"],
                    ["-n", a, "link", "set", "lo", "up"], ["-n", b, "link", "set", "lo", "up"]):
            r = _ip(*cmd)
            assert r.returncode == 0, f"ip {' '.join(cmd)}: {r.stderr}"
        yield (a, "10.213.0.1"), (b, "10.213.0.2")
    finally:
        for ns in made:  # deleting a namespace removes its end of the veth pair, and with it the pair
            _ip("netns", "del", ns)


def test_refit_across_two_namespaces_over_tcp_rendezvous(two_hosts, plans):
    (ns_a, ip_a), (ns_b, ip_b) = two_hosts
    path = str(plans["tiny-moe"])
    n = reshard.Plan.open(path).num_ranks
    rendezvous = f"{ip_a}:29{uuid.uuid4().int % 400 + 100}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = []
    for ns, ip, first, last in ((ns_a, ip_a, 0, n // 2 - 1), (ns_b, ip_b, n // 2, n - 1)):
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(HERE / "refit_host.py"), path,
                                       str(first), str(last), rendezvous, ip],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    checked = 0
    for out, _ in outs:
        status, c, wrong, _ = out.strip().split(" ", 3)
        assert status == "ok" and wrong == "0", out
        checked += int(c)
    assert checked > 0
