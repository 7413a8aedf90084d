"""A TCP port for a test's rendezvous (MASTER_PORT, a TCPStore) that stays
free until the ranks bind it.

A port the kernel hands out for bind(("127.0.0.1", 0)) comes from the
ephemeral range, and once the probe socket closes it can go to any outgoing
connection in the meantime: the Gloo and TCPStore connections of the other
side's ranks, which connect while the vLLM ranks still load their models (CI
failed so: the vLLM ranks' init_process_group got EADDRINUSE, 2026-12-04).
Ports below the ephemeral range (net.ipv4.ip_local_port_range) are never
given to outgoing connections, so a random one that binds now is only
taken by another explicit bind."""
import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    high = _ephemeral_low()
    low = max(1024, high - 12768)
    rng = random.SystemRandom()
    for _ in range(256):
        port = rng.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in [{low}, {high}) below the ephemeral range")
