"""Fixtures of the reshard Python tests: the tiny sample plans, compiled
in-process once per test session, and meshes of Gloo transports whose ranks
are threads of this process."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Dict, List

import pytest

import reshard

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
CLUSTER = SAMPLES / "clusters" / "dgx-h100.json"

# Every tiny sample refit: (name, model dir, training layout, inference layout).
TINY = [
    ("tiny-dense", "tiny-dense", "train.json", "infer.json"),
    ("tiny-dense-tp1-dp4", "tiny-dense", "train.json", "infer-tp1-dp4.json"),
    ("tiny-dense-tp2-dp2", "tiny-dense", "train.json", "infer-tp2-dp2.json"),
    ("tiny-moe", "tiny-moe", "train.json", "infer.json"),
    ("tiny-moe-ep", "tiny-moe", "train.json", "infer-ep.json"),
]


def reshard_binary() -> Path:
    """The CLI of this checkout (RESHARD_BIN overrides)."""
    return Path(os.environ.get("RESHARD_BIN", ROOT / "build" / "reshard"))


@pytest.fixture(scope="session")
def plans(tmp_path_factory) -> Dict[str, Path]:
    out = tmp_path_factory.mktemp("plans")
    paths = {}
    for name, model, train, infer in TINY:
        d = SAMPLES / model
        paths[name] = out / f"{name}.rsplan"
        reshard.compile(d / "model.json", d / train, d / infer, CLUSTER, paths[name], staging_mb=2)
    return paths


def mesh(size: int, store: Path, timeout_s: float = 30.0) -> List[reshard.GlooTransport]:
    """`size` connected Gloo transports, one per rank, made by threads of this process."""
    prefix = uuid.uuid4().hex
    out: List = [None] * size
    errors: List[BaseException] = []

    def connect(r: int) -> None:
        try:
            out[r] = reshard.GlooTransport(r, size, store=store, prefix=prefix, timeout_s=timeout_s)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=connect, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def run_threads(fns) -> list:
    """Runs each callable in its own thread; returns results, re-raising the first error."""
    results: list = [None] * len(fns)
    errors: list = []

    def call(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def run_all(sessions) -> Dict[int, BaseException]:
    """Runs every session in its own thread; returns the reshard errors by plan rank."""
    errors: Dict[int, BaseException] = {}

    def run(s) -> None:
        try:
            s.run()
        except reshard.Error as e:
            errors[s.rank] = e

    run_threads([lambda s=s: run(s) for s in sessions])
    return errors


def run_in_background(session) -> threading.Thread:
    """Starts `session.run()` in a thread and returns once it is waiting in
    run() (for peers that have not started)."""
    import time

    t = threading.Thread(target=session.run)
    t.start()
    time.sleep(0.3)
    return t


def bind_zeros(s, skip=()) -> None:
    """Binds every buffer of `s` (but `skip`) to a fresh torch tensor of zeros."""
    import torch

    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    for b in s.buffers:
        if b.name not in skip:
            s.bind(b.name, torch.zeros(b.shape, dtype=dtypes[b.dtype]))


def make_sessions(plan, transports) -> list:
    """A session per rank of `transports` (rank r plays plan rank r), made by
    threads: a session's hello waits until every rank has made its own."""
    return run_threads([lambda r=r: reshard.Session(plan, r, transports[r]) for r in range(len(transports))])
