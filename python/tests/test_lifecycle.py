"""Lifetimes the way PyTorch users write them: close() and with-blocks on
sessions, transports and communicators; the public names of every module
(__all__); the package importing without torch."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys

import pytest
import torch

import reshard
from conftest import make_sessions, mesh, run_in_background, run_threads

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

MODULES = ["reshard", "reshard.session", "reshard.transport", "reshard.plan", "reshard.compiler", "reshard.dtensor",
           "reshard.errors", "reshard.refit", "reshard.testing", "reshard.nccl"]


def bind_all(s):
    for b in s.buffers:
        s.bind(b.name, torch.zeros(b.shape, dtype=DTYPES[b.dtype]))


class Boom(Exception):
    pass


@pytest.fixture
def dense(plans, tmp_path):
    """The tiny-dense plan, a mesh of its ranks and a session per rank;
    whatever the test left open is closed after it."""
    plan = reshard.Plan.open(plans["tiny-dense"])
    transports = mesh(plan.num_ranks, tmp_path)
    sessions = make_sessions(plan, transports)
    yield plan, transports, sessions
    for s in sessions:
        s.close()
    for t in transports:
        t.close()


def run_all(sessions) -> list:
    for s in sessions:
        bind_all(s)
    return run_threads([s.run for s in sessions])


def test_a_closed_session_frees_its_transport_for_a_new_one(dense):
    plan, transports, sessions = dense
    run_all(sessions)
    for s in sessions:
        assert not s.closed
        s.close()
        assert s.closed
        s.close()  # idempotent
    # The same transports serve new sessions, and those run.
    again = make_sessions(plan, transports)
    assert sum(st.bytes_sent for st in run_all(again)) > 0
    for s in again:
        s.close()


def test_every_method_of_a_closed_session_says_so(dense):
    plan, transports, sessions = dense
    s = sessions[plan.dest_ranks[0]]
    b = s.buffers[0]
    t = torch.zeros(b.shape, dtype=DTYPES[b.dtype])
    s.bind(b.name, t)
    s.close()
    calls = {
        "bind": lambda: s.bind(b.name, t),
        "bind_module": lambda: s.bind_module({b.name: t}),
        "module_tensors": lambda: s.module_tensors({b.name: t}),
        "missing": s.missing,
        "tensor": lambda: s.tensor(b.name),
        "run": s.run,
        "check_bindings": s.check_bindings,
        "buffers": lambda: s.buffers,
        "staging_bytes": lambda: s.staging_bytes,
    }
    for what, call in calls.items():
        with pytest.raises(reshard.Error) as e:
            call()
        assert str(e.value) == (f"rank {s.rank}: this session is closed (Session.close() or the end of its with "
                                "block): make a new Session to refit again"), what
    # What it was still answers.
    assert s.rank == plan.dest_ranks[0] and s.plan is plan and s.transport is transports[s.rank]
    assert repr(s) == f"<reshard.Session rank {s.rank}: closed, gloo>"


def test_with_closes_the_session_and_reraises(dense):
    plan, transports, sessions = dense
    with pytest.raises(Boom):
        with sessions[0] as s:
            assert s is sessions[0]
            raise Boom()
    assert sessions[0].closed
    with sessions[1]:
        pass
    assert sessions[1].closed
    for s in sessions:
        s.close()

    # A rank's whole refit in with-blocks, twice on the same transports.
    def refit(r):
        with reshard.Session(plan, r, transports[r]) as s:
            bind_all(s)
            return s.run().steps

    for _ in range(2):
        assert sum(run_threads([lambda r=r: refit(r) for r in range(plan.num_ranks)])) > 0
    for t in transports:
        with t:
            pass
        assert t.closed


def test_close_is_refused_while_another_thread_runs(dense):
    plan, transports, sessions = dense
    for s in sessions:
        bind_all(s)
    # Rank 0 waits in run() for peers that have not started.
    first = run_in_background(sessions[0])
    with pytest.raises(reshard.Error) as e:
        sessions[0].close()
    assert str(e.value) == ("rank 0: close: run() is in progress on this session in another thread; close it after "
                            "run() returns")
    with pytest.raises(reshard.Error, match="in progress"):
        transports[0].close()
    assert not sessions[0].closed and not transports[0].closed
    run_threads([s.run for s in sessions[1:]])
    first.join()


def test_a_closed_transport_closes_its_session_and_refuses_new_ones(dense):
    plan, transports, sessions = dense
    t = transports[0]
    t.close()
    assert t.closed and sessions[0].closed
    t.close()  # idempotent
    with pytest.raises(reshard.Error) as e:
        sessions[0].run()
    assert str(e.value) == ("rank 0: this session is closed (its transport was closed): make a new Session to refit "
                            "again")
    with pytest.raises(reshard.Error) as e:
        reshard.Session(plan, 0, t)
    assert str(e.value) == ("rank 0: this gloo transport is closed (Transport.close() or the end of its with block): "
                            "make a new transport, and a session on it, for the next refit")
    assert (t.rank, t.size, t.kind) == (0, plan.num_ranks, "gloo")
    assert repr(t) == f"<reshard.GlooTransport rank 0 of {plan.num_ranks}, closed>"
    # Its connections are closed: the ranks that receive from rank 0 hear so (not a timeout).
    errors = {}

    def run(s):
        bind_all(s)
        try:
            s.run()
        except reshard.PeerError as e:
            errors[s.rank] = e

    run_threads([lambda s=s: run(s) for s in sessions[1:]])
    assert errors and not any(isinstance(e, reshard.PeerTimeoutError) for e in errors.values())
    with pytest.raises(Boom):
        with transports[1]:
            raise Boom()
    assert transports[1].closed


def test_a_communicator_closes_its_transports_first_and_forgets_one_a_failure_may_have_aborted():
    # The Python side of Communicator.close(), without NCCL: no communicator call is made here.
    order = []

    class FakeTransport:
        def close(self):
            order.append("transport")

    c = reshard.nccl.Communicator.__new__(reshard.nccl.Communicator)
    c.ptr, c.size, c.rank, c.device = 0x1234, 2, 0, 0
    fake = FakeTransport()
    c._transports = [lambda: fake, lambda: None]
    c._given_up = False
    t = reshard.NcclTransport.__new__(reshard.NcclTransport)
    t._comms = (c,)
    t._run_failed()  # a run on a transport over it raised
    assert c._given_up
    with pytest.raises(Boom):
        with c:
            raise Boom()
    assert order == ["transport"] and c.ptr == 0 and c.closed
    c.close()  # idempotent
    c.destroy()  # nothing once forgotten
    c.abort()
    assert "closed" in repr(c)


def test_every_public_module_lists_its_public_names():
    for name in MODULES:
        mod = importlib.import_module(name)
        assert isinstance(getattr(mod, "__all__", None), list), name
        listed = mod.__all__
        assert len(set(listed)) == len(listed), name
        for n in listed:
            assert hasattr(mod, n), f"{name}.__all__ lists {n}, which it lacks"
        # What the module defines under a public name is listed.
        for n, obj in vars(mod).items():
            if n.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) == name:
                assert n in listed, f"{name} defines {n} without listing it in __all__"
        ns = {}
        exec(f"from {name} import *", ns)
        assert set(listed) <= set(ns), name


def test_the_package_imports_without_torch():
    code = ("import sys\n"
            "sys.modules['torch'] = None  # import torch raises ImportError\n"
            f"import {', '.join(MODULES)}\n"
            "assert sys.modules['torch'] is None\n"
            "print('ok')\n")
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
