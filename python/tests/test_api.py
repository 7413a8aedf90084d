"""Unit tests of the reshard Python API on CPU (numpy and torch tensors):
plans, compile, binding checks and their messages, strided views, re-binding,
bind_module, missing(), the GIL released during run(), errors."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import reshard
import reshard.testing as rt
from conftest import CLUSTER, ROOT, SAMPLES, make_sessions, mesh, reshard_binary, run_threads

# -- plans ---------------------------------------------------------------------


def test_plan_open_describes_the_plan(plans):
    plan = reshard.Plan.open(plans["tiny-dense"])
    assert plan.num_ranks == 12
    assert len(plan.source_ranks) == 8 and len(plan.dest_ranks) == 4
    assert sorted(plan.source_ranks + plan.dest_ranks) == list(range(12))
    assert len(plan.digest) >= 16
    assert plan.strategy == "direct"
    assert plan.inputs["model"] == "tiny-dense"
    assert set(plan.inputs) == {"model", "source_layout", "dest_layout", "cluster"}
    assert plan.num_rounds >= 1 and plan.net_bytes > 0
    src = plan.program(plan.source_ranks[0])
    dst = plan.program(plan.dest_ranks[0])
    assert src.src_rank == 0 and src.dst_rank == -1
    assert dst.dst_rank == 0 and dst.src_rank == -1
    assert all(b.is_source and not b.is_destination for b in src.buffers)
    assert all(b.is_destination for b in dst.buffers)
    b = dst.buffers[0]
    assert b.dtype == "bf16" and all(isinstance(n, int) for n in b.shape)
    assert plan.staging_bytes(dst.rank) == dst.staging_bytes > 0
    assert "12 ranks" in repr(plan)


def test_plan_open_errors(tmp_path):
    with pytest.raises(reshard.PlanError) as e:
        reshard.Plan.open(tmp_path / "nope.rsplan")
    assert str(tmp_path / "nope.rsplan") in str(e.value)
    bad = tmp_path / "bad.rsplan"
    bad.write_bytes(b"not a plan at all, just some bytes" * 4)
    with pytest.raises(reshard.PlanError) as e:
        reshard.Plan.open(bad)
    assert str(bad) in str(e.value)
    assert isinstance(e.value, reshard.Error)


def test_program_rank_out_of_range(plans):
    plan = reshard.Plan.open(plans["tiny-dense"])
    with pytest.raises(reshard.PlanError) as e:
        plan.program(12)
    assert str(e.value) == f"{plans['tiny-dense']}: rank 12 out of range: the plan has 12 ranks"


# -- compile -------------------------------------------------------------------


def test_compile_matches_the_cli(tmp_path):
    cli = reshard_binary()
    if not cli.exists():
        pytest.skip(f"the reshard CLI is not built at {cli} (build it, or set RESHARD_BIN)")
    d = SAMPLES / "tiny-moe"
    args = [d / "model.json", d / "train.json", d / "infer-ep.json", CLUSTER]
    summary = reshard.compile(*args, tmp_path / "py.rsplan", staging_mb=8)
    out = subprocess.run([str(cli), "compile", "--model", args[0], "--from", args[1], "--to", args[2], "--cluster",
                          args[3], "--staging-mb", "8", "-o", tmp_path / "cli.rsplan"],
                         check=True, capture_output=True, text=True).stdout
    assert (tmp_path / "py.rsplan").read_bytes() == (tmp_path / "cli.rsplan").read_bytes()
    assert summary["ranks"] == 16 and summary["rounds"] >= 1 and summary["net_bytes"] > 0
    # The CLI's line, but for the timing and the file name.
    strip = lambda s: s.rsplit(",", 1)[0]  # noqa: E731
    assert strip(summary["summary"]) == strip(out.splitlines()[0])
    # The CLI's --json, field for field but the file and the wall time, with and without --search-fills,
    # on a plan whose rounds --search-fills fills differently (Qwen3-30B-A3B with 64 MiB of staging).
    reshard.init(ROOT / "tools" / "bench" / "configs" / "qwen3-30b-a3b.json",
                 train="megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm", infer="vllm:tp=2,dp=8", cluster="dgx-h100",
                 out_dir=tmp_path / "q")
    q = [tmp_path / "q" / f for f in ("model.json", "train.json", "infer.json", "cluster.json")]
    plans = []
    for flags, kwargs in (([], {}), (["--search-fills"], {"search_fills": True})):
        py = reshard.compile(*q, tmp_path / "py.rsplan", staging_mb=64, **kwargs)
        cli_json = json.loads(subprocess.run(
            [str(cli), "compile", "--json", "--model", q[0], "--from", q[1], "--to", q[2], "--cluster", q[3],
             "--staging-mb", "64", *flags, "-o", tmp_path / "cli.rsplan"],
            check=True, capture_output=True, text=True).stdout)
        plans.append((tmp_path / "py.rsplan").read_bytes())
        assert plans[-1] == (tmp_path / "cli.rsplan").read_bytes()
        drop = ("plan", "seconds", "summary")
        assert {k: v for k, v in py.items() if k not in drop} == {k: v for k, v in cli_json.items() if k not in drop}
        assert list(k for k in py if k != "summary") == list(cli_json)
    assert plans[0] != plans[1]
    assert py["staging_fill"] == 0.8  # --search-fills kept a lower staging fill here
    # fill_of (--fill-of): that plan's round fill, one fill and no estimate, as the CLI does.
    py = reshard.compile(*q, tmp_path / "fill-of.rsplan", staging_mb=64, fill_of=tmp_path / "py.rsplan")
    subprocess.run([str(cli), "compile", "-q", "--model", q[0], "--from", q[1], "--to", q[2], "--cluster", q[3],
                    "--staging-mb", "64", "--fill-of", tmp_path / "py.rsplan", "-o", tmp_path / "cli.rsplan"], check=True)
    assert (tmp_path / "fill-of.rsplan").read_bytes() == (tmp_path / "cli.rsplan").read_bytes() == plans[1]
    assert py["staging_fill"] == 0.8


def test_compile_errors_carry_the_cli_messages(tmp_path):
    # Argument errors (Python's names, ValueError / TypeError / FileNotFoundError): test_messages.py.
    d = SAMPLES / "tiny-dense"
    ok = [d / "model.json", d / "train.json", d / "infer.json", CLUSTER]
    reshard.compile(*ok, tmp_path / "g.rsplan", strategy="gather")
    with pytest.raises(reshard.CompileError) as e:
        reshard.compile(*ok, tmp_path / "p.rsplan", fill_of=tmp_path / "g.rsplan")
    assert "the plan records no round fill" in str(e.value)
    broken = tmp_path / "train.json"
    broken.write_text('{"format": "reshard.layout/1", "ranks": }')
    with pytest.raises(reshard.CompileError) as e:
        reshard.compile(ok[0], broken, ok[2], ok[3], tmp_path / "p.rsplan")
    assert str(e.value).startswith(f"{broken}:1:41: syntax error while parsing value")
    assert not (tmp_path / "p.rsplan").exists()
    cli = reshard_binary()
    if cli.exists():  # word for word what the CLI says
        err = subprocess.run([str(cli), "compile", "--model", ok[0], "--from", broken, "--to", ok[2], "--cluster", ok[3],
                              "-o", tmp_path / "p.rsplan"], capture_output=True, text=True).stderr
        assert err == f"reshard: error: {e.value}\n"


def test_compile_takes_bundled_cluster_names_and_warns_on_gpu_memory(tmp_path):
    d = SAMPLES / "qwen3-235b"
    args = [d / "model.json", d / "train-tp4-pp8-ep16.json", d / "infer-tp4-dp32.json"]
    # Qwen3-235B BF16 at TP4 holds 117.6 GB per GPU: more than an H100's 80 GB.
    with pytest.warns(UserWarning, match=r"rank \d+ holds 117\.\d+ GB .*more than its GPU's 80 GB"):
        summary = reshard.compile(*args, "dgx-h100", tmp_path / "p.rsplan")
    assert summary["memory_warnings"] and (tmp_path / "p.rsplan").exists()
    with pytest.raises(ValueError) as e:
        reshard.compile(*args, "dgx-h", tmp_path / "q.rsplan")
    assert "did you mean 'dgx-h100'" in str(e.value)
    assert not (tmp_path / "q.rsplan").exists()


# -- binding -------------------------------------------------------------------


@pytest.fixture(scope="module")
def dense(plans, tmp_path_factory):
    """tiny-dense's plan and a session per rank (transports connected by threads; no runs)."""
    plan = reshard.Plan.open(plans["tiny-dense"])
    transports = mesh(plan.num_ranks, tmp_path_factory.mktemp("store"))
    return plan, transports


def session(dense, rank):
    plan, transports = dense
    return make_sessions(plan, transports)[rank]


def torch_like(b):
    return torch.zeros(b.shape, dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[b.dtype])


def test_bind_checks_name_dtype_shape_device(dense):
    s = session(dense, 8)
    b = s.buffers[0]
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name + "x", torch_like(b))
    assert str(e.value) == f"rank 8: the plan has no buffer '{b.name}x' for this rank (did you mean '{b.name}'?)"
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, torch.zeros(b.shape, dtype=torch.float32))
    assert str(e.value) == f"rank 8: buffer '{b.name}' is bound with dtype fp32 (torch.float32), the plan expects bf16"
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, torch.zeros(b.shape, dtype=torch.int32))
    assert str(e.value) == f"rank 8: buffer '{b.name}' is bound with dtype torch.int32, the plan expects bf16"
    wrong = (b.shape[0] + 1,) + tuple(b.shape[1:])
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, torch.zeros(wrong, dtype=torch.bfloat16))
    shape = ",".join(map(str, b.shape))
    got = ",".join(map(str, wrong))
    assert str(e.value) == f"rank 8: buffer '{b.name}' is bound with shape [{got}], the plan expects [{shape}]"
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, torch.zeros(b.shape, dtype=torch.bfloat16, device="meta"))
    assert str(e.value) == (f"rank 8: buffer '{b.name}' is bound with memory on meta, "
                            "the gloo transport needs cpu memory")
    ro = np.zeros(b.shape, dtype=np.uint16)
    ro.flags.writeable = False
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, ro, dtype="bf16")
    assert str(e.value) == (f"rank 8: buffer '{b.name}' is bound with a read-only array, "
                            "the plan writes into this buffer")
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, np.zeros(b.shape, dtype=np.float32), dtype="bf16")
    assert str(e.value) == (f"rank 8: buffer '{b.name}' is bound with dtype='bf16' reinterprets 4-byte elements "
                            "(float32) as 2-byte ones")
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, [1, 2, 3])
    assert str(e.value) == (f"rank 8: buffer '{b.name}': builtins.list is not a tensor (expected a torch.Tensor, "
                            "a numpy.ndarray or an object with __dlpack__)")
    assert isinstance(e.value, ValueError)  # BindError is also a ValueError
    assert len(s.missing()) == len(s.buffers)  # nothing was bound by the failures


def test_missing_rebind_and_run_with_unbound(plans, tmp_path):
    # Its own transports: a run that fails ends their use (test_misuse.py).
    plan = reshard.Plan.open(plans["tiny-dense"])
    s = make_sessions(plan, mesh(plan.num_ranks, tmp_path))[0]
    names = [b.name for b in s.buffers]
    assert s.missing() == names
    t = rt.allocate(s)
    s.bind(names[0], t[names[0]])
    assert s.missing() == names[1:]
    # Re-binding replaces: the session now holds the new tensor.
    again = torch.zeros_like(t[names[0]])
    s.bind(names[0], again)
    assert s.tensor(names[0]).data_ptr() == again.data_ptr()
    with pytest.raises(reshard.BindError) as e:
        s.run()
    n = len(names) - 1
    shown = ", ".join(f"'{x}'" for x in names[1:6])
    assert str(e.value) == f"rank 0: {n} of {len(names)} buffers are not bound: {shown}" + (", ..." if n > 5 else "")


def test_numpy_bf16_bits_and_dlpack_objects(dense):
    s = session(dense, 0)
    b = s.buffers[0]
    arr = np.zeros(b.shape, dtype=np.uint16)
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, arr)
    assert str(e.value) == f"rank 0: buffer '{b.name}' is bound with dtype uint16, the plan expects bf16"
    s.bind(b.name, arr, dtype="bf16")
    assert b.name not in s.missing()

    class DLPackOnly:  # a producer reshard knows only through DLPack
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    t = torch.zeros(b.shape, dtype=torch.bfloat16)
    s.bind(b.name, DLPackOnly(t))
    assert s.tensor(b.name).t is t
    if len(b.shape) == 2 and b.shape[1] > 1:
        wide = torch.zeros(b.shape[0], b.shape[1] * 2, dtype=torch.bfloat16)
        with pytest.raises(reshard.BindError) as e:
            s.bind(b.name, DLPackOnly(wide[:, ::2]))
        assert "non-contiguous DLPack tensor" in str(e.value)


def test_binding_keeps_the_memory_alive(dense):
    s = session(dense, 8)
    b = s.buffers[0]
    p = torch.nn.Parameter(torch_like(b), requires_grad=False)
    ptr = p.data_ptr()
    s.bind(b.name, p)
    # The framework swaps .data (FP8 post-processing) and drops its tensor:
    # the bound memory stays alive until re-bound.
    p.data = torch_like(b)
    del p
    gc.collect()
    assert s.tensor(b.name).data_ptr() == ptr


class Tiny(torch.nn.Module):
    """A module whose parameters are named like a plan's buffers."""

    def __init__(self, buffers, skip=(), dtype_of=None):
        super().__init__()
        for b in buffers:
            if b.name in skip:
                continue
            *path, leaf = b.name.split(".")
            mod = self
            for part in path:
                if not hasattr(mod, part):
                    mod.add_module(part, torch.nn.Module())
                mod = getattr(mod, part)
            dt = (dtype_of or {}).get(b.name, torch.bfloat16)
            mod.register_parameter(leaf, torch.nn.Parameter(torch.zeros(b.shape, dtype=dt), requires_grad=False))
        self.register_buffer("rotary_inv_freq", torch.zeros(4), persistent=False)
        self.extra = torch.nn.Parameter(torch.zeros(3))


def test_bind_module_binds_every_parameter(dense):
    s = session(dense, 8)
    m = Tiny(s.buffers)
    unused = s.bind_module(m)
    assert s.missing() == []
    assert unused == ["extra"]  # the non-persistent buffer is not even considered
    name = s.buffers[0].name
    assert s.tensor(name).data_ptr() == m.get_parameter(name).data_ptr()
    del s  # one session per transport at a time: the next ones are made on the same transports
    # A prefix maps module names to plan names.
    s2 = session(dense, 9)
    stripped = {b.name.split(".", 1)[1]: torch_like(b) for b in s2.buffers if "." in b.name}
    first = s2.buffers[0].name.split(".", 1)[0]
    same_root = {k: v for k, v in stripped.items() if any(b.name == f"{first}.{k}" for b in s2.buffers)}
    s2.bind_module(same_root, prefix=first + ".", missing_ok=True)
    assert len(s2.missing()) == len(s2.buffers) - len(same_root)


def test_bind_module_reports_everything_in_one_error(dense):
    s = session(dense, 8)
    b0, b1 = s.buffers[0], s.buffers[1]
    m = Tiny(s.buffers, skip={b0.name}, dtype_of={b1.name: torch.float32})
    with pytest.raises(reshard.BindError) as e:
        s.bind_module(m)
    msg = str(e.value)
    assert msg.startswith(f"rank 8: bind_module: 2 of {len(s.buffers)} plan buffers cannot be bound, nothing was "
                          "bound:\n")
    assert f"\n  '{b1.name}': dtype fp32 (torch.float32), the plan expects bf16" in msg
    assert f"\n  '{b0.name}': no tensor of that name in the module" in msg
    assert len(s.missing()) == len(s.buffers)  # all or nothing


def test_bind_module_of_2000_parameters_is_fast(tmp_path):
    # A one-rank plan of 2000 buffers: the overhead benchmark's plan, if built.
    bench = reshard_binary().parent / "python_overhead"
    if not bench.exists():
        pytest.skip(f"{bench} is not built (ninja -C build python_overhead)")
    subprocess.run([str(bench), "plans", str(tmp_path), "--rounds", "1", "--k", "1"], check=True,
                   capture_output=True)
    plan = reshard.Plan.open(tmp_path / "params.rsplan")
    [t] = mesh(1, tmp_path)
    s = reshard.Session(plan, 0, t)
    m = Tiny(s.buffers)
    # CPU time of this process: wall time on a shared CI machine also counts
    # the other jobs' turns (tools/bench/python_overhead.sh reports both).
    best = min(_cpu_timed(lambda: s.bind_module(m)) for _ in range(3))
    assert s.missing() == []
    assert best < 0.05, f"bind_module of 2000 parameters took {best * 1e3:.1f} ms of CPU"


def _cpu_timed(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


# -- running -------------------------------------------------------------------


def refit_in_threads(plan, transports, strided=False, like="torch", transposed=False):
    """Every rank of `plan` as a thread: bind fresh tensors (destinations as
    strided views if asked), poison, fill, run, check every element."""
    sessions = make_sessions(plan, transports)
    pads = []
    for s in sessions:
        for b in s.buffers:
            code = {"bf16": torch.bfloat16, "fp32": torch.float32}[b.dtype]
            if transposed and b.held_transposed and b.is_destination:
                # vLLM's per-channel FP8 linears after loading: weight.t(), a view of [out, in] memory.
                storage = torch.zeros(b.shape, dtype=code)
                view = storage.t()
                s.bind(b.name, view)
                assert s.tensor(b.name).data_ptr() == storage.data_ptr() and not s._staged  # no copy
                pads.append(None)
            elif strided and b.is_destination and len(b.shape) == 2 and like == "numpy" and b.dtype == "bf16":
                big = np.full((b.shape[0], b.shape[1] + 3), 0x40E0, dtype=np.uint16)  # 7.0 in bf16 bits
                view = big[:, 1:1 + b.shape[1]]
                assert not view.flags.c_contiguous
                s.bind(b.name, view, dtype="bf16")
                pads.append(torch.from_numpy(big.view(np.int16)).view(torch.bfloat16))
            elif strided and b.is_destination and len(b.shape) == 2:
                # A slice of a wider tensor: rows of b.shape[1] + 3 elements.
                big = torch.full((b.shape[0], b.shape[1] + 3), 7.0, dtype=code)
                view = big[:, 1:1 + b.shape[1]]
                assert not view.is_contiguous()
                s.bind(b.name, view)
                pads.append(big)
            elif like == "numpy" and b.dtype == "bf16":
                s.bind(b.name, np.zeros(b.shape, dtype=np.uint16), dtype="bf16")
            else:
                s.bind(b.name, torch.zeros(b.shape, dtype=code))
        rt.poison_destinations(s)
        rt.fill_sources(s)
    stats = run_threads([s.run for s in sessions])
    checked = 0
    for s in sessions:
        c = rt.check_destinations(s)
        assert c.wrong == 0, c.first
        checked += c.checked
    for big in filter(lambda x: x is not None, pads):  # the columns around each view are untouched
        assert bool((big[:, 0] == 7.0).all()) and bool((big[:, -2:] == 7.0).all())
    return sessions, stats, checked


def test_gil_is_released_during_run(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-moe"])
    transports = mesh(plan.num_ranks, tmp_path)
    # All 16 ranks are threads of this process: a run() holding the GIL would
    # deadlock on its first message. A ticker thread counts meanwhile.
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    th = threading.Thread(target=ticker)
    th.start()
    try:
        sessions, stats, checked = refit_in_threads(plan, transports)
    finally:
        stop.set()
        th.join()
    assert checked > 0
    assert len(ticks) > 3
    s = stats[plan.dest_ranks[0]]
    assert s.rounds == plan.program(plan.dest_ranks[0]).rounds and s.steps > 0
    assert s.net.bytes_received + s.nvlink.bytes_received > 0 and s.seconds > 0
    assert sum(x.bytes_sent for x in stats) == sum(x.bytes_received for x in stats)
    for x in stats:  # the per-round figures add up to the run's
        rs = x.round_stats
        assert len(rs) == x.rounds and all(isinstance(r, reshard.RoundStats) for r in rs)
        assert sum(r.steps for r in rs) == x.steps
        assert sum(r.bytes_sent for r in rs) == x.bytes_sent and sum(r.bytes_received for r in rs) == x.bytes_received
        assert all(0 <= r.comm_seconds <= r.seconds <= x.seconds for r in rs)


def test_strided_views_and_numpy(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    _, _, checked = refit_in_threads(plan, mesh(plan.num_ranks, tmp_path), strided=True)
    assert checked > 0
    plan = reshard.Plan.open(plans["tiny-dense-tp2-dp2"])
    _, _, checked = refit_in_threads(plan, mesh(plan.num_ranks, tmp_path), like="numpy")
    assert checked > 0
    plan = reshard.Plan.open(plans["tiny-moe-ep"])
    sessions, _, checked = refit_in_threads(plan, mesh(plan.num_ranks, tmp_path), strided=True, like="numpy")
    assert checked > 0
    assert any(st.kind == "numpy" for s in sessions for st in s._staged.values())


def _held_plan(tmp_path) -> reshard.Plan:
    """tiny-dense -> TP1 x DP4 whose qkv_proj ([128,64]) and o_proj ([64,64],
    square) the layout declares held transposed, as vLLM holds per-channel FP8
    linears after loading (weight.t())."""
    d = SAMPLES / "tiny-dense"
    infer = json.loads((d / "infer-tp1-dp4.json").read_text())
    for rule in infer["buffers"]:
        if rule["name"].endswith("qkv_proj.weight"):
            rule["held"] = "transposed"
    infer["buffers"].append({"name": "model.layers.{layer}.self_attn.o_proj.weight",
                             "tensor": "model.layers.{layer}.self_attn.o_proj.weight", "held": "transposed"})
    (tmp_path / "held.json").write_text(json.dumps(infer))
    reshard.compile(d / "model.json", d / "train.json", tmp_path / "held.json", CLUSTER, tmp_path / "held.rsplan")
    return reshard.Plan.open(tmp_path / "held.rsplan")


def test_views_bind_their_memory_only_where_the_layout_declares_it(tmp_path):
    """A parameter swapped for `weight.t()` after loading binds the memory
    behind it, in place, where the layout declares the buffer held transposed
    (square ones too); the refit is exact."""
    plan = _held_plan(tmp_path)
    dst = plan.dest_ranks[0]
    held = {b.name: b.shape for b in plan.buffers(dst) if b.held_transposed}
    assert any(n.endswith("qkv_proj.weight") for n in held) and any(s[0] == s[1] for s in held.values())
    (tmp_path / "s").mkdir()
    sessions, _, checked = refit_in_threads(plan, mesh(plan.num_ranks, tmp_path / "s"), transposed=True)
    assert checked > 0
    s = sessions[dst]
    assert not s._staged and all(s.tensor(n).shape == tuple(sh) for n, sh in held.items())  # the memory, in place
    name, shape = next((n, sh) for n, sh in held.items() if sh[0] != sh[1])
    np_storage = np.zeros(shape, dtype=np.uint16)  # numpy: the same rule
    s.bind(name, np_storage.T, dtype="bf16")
    assert s.tensor(name).__array_interface__["data"][0] == np_storage.__array_interface__["data"][0]
    wrong = torch.zeros((shape[1] * 2, shape[0]), dtype=torch.bfloat16)[::2]  # strided, not the transpose of memory
    with pytest.raises(reshard.BindError) as e:
        s.bind(name, wrong)
    assert str(e.value).endswith(f"is bound with shape [{shape[1]},{shape[0]}], the plan expects "
                                 f"[{shape[0]},{shape[1]}]")


def test_views_elsewhere_are_copied_or_refused(plans, tmp_path):
    """Where the layout declares nothing, a transposed view is what it says: a
    square one goes through the copy (its elements, not its memory, get the
    plan's values) and one of the transposed shape is refused, saying why."""
    plan = reshard.Plan.open(plans["tiny-dense-tp1-dp4"])
    sessions = make_sessions(plan, mesh(plan.num_ranks, tmp_path))
    dst = plan.dest_ranks[0]
    s = sessions[dst]
    assert not any(b.held_transposed for b in s.buffers)
    square = next(b for b in s.buffers if len(b.shape) == 2 and b.shape[0] == b.shape[1] and b.dtype == "bf16")
    wide = next(b for b in s.buffers if len(b.shape) == 2 and b.shape[0] != b.shape[1] and b.dtype == "bf16")
    for b in s.buffers:
        if b.name != square.name:
            s.bind(b.name, torch_like(b))
    storage = torch.zeros(square.shape, dtype=torch.bfloat16)
    s.bind(square.name, storage.t())
    assert square.name in {s._buffers[i].name for i in s._staged}  # the copy path, not the memory
    with pytest.raises(reshard.BindError) as e:
        s.bind(wide.name, torch.zeros(wide.shape, dtype=torch.bfloat16).t())
    assert str(e.value) == (
        f"rank {dst}: buffer '{wide.name}' is bound with shape [{wide.shape[1]},{wide.shape[0]}], the plan expects "
        f"[{wide.shape[0]},{wide.shape[1]}] (a transposed tensor: only buffers the layout declares \"held\": "
        "\"transposed\" bind their transposed view; pass the tensor in the plan's shape)")
    for other in sessions:
        if other is not s:
            for b in other.buffers:
                other.bind(b.name, torch_like(b))
            rt.poison_destinations(other)
            rt.fill_sources(other)
    rt.poison_destinations(s)
    run_threads([x.run for x in sessions])
    assert rt.check_destinations(s).wrong == 0
    # The view holds the plan's values element for element: its memory is their transpose.
    assert torch.equal(storage.t(), s._staged[s._index[square.name]].staging)


def test_rebinding_between_runs(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    sessions, _, _ = refit_in_threads(plan, mesh(plan.num_ranks, tmp_path))
    # New destination tensors (a framework replaced .data): bind, poison, run again.
    for s in sessions:
        for b in s.buffers:
            if b.is_destination:
                s.bind(b.name, torch_like(b))
        rt.poison_destinations(s)
    run_threads([s.run for s in sessions])
    for s in sessions:
        c = rt.check_destinations(s)
        assert c.wrong == 0, c.first


def test_a_stalled_peer_times_out_naming_step_and_peer(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    transports = mesh(plan.num_ranks, tmp_path, timeout_s=1.0)
    dst = plan.dest_ranks[0]
    s = make_sessions(plan, transports)[dst]  # every rank says hello; only dst runs
    for b in s.buffers:
        s.bind(b.name, torch_like(b))
    t0 = time.perf_counter()
    with pytest.raises(reshard.PeerTimeoutError) as e:
        s.run()  # nobody else runs
    assert time.perf_counter() - t0 < 10
    msg = str(e.value)
    assert msg.startswith(f"rank {dst}: step ") and " from peer " in msg and "timed out after 1" in msg
    assert isinstance(e.value, reshard.PeerError) and isinstance(e.value, TimeoutError)


def test_a_missing_peer_fails_the_connection(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(reshard.PeerError) as e:
        reshard.GlooTransport(0, 2, store=tmp_path, timeout_s=1.0)
    assert time.perf_counter() - t0 < 10
    assert str(e.value).startswith(f"rank 0: gloo: cannot connect 2 ranks through '{tmp_path}' within 1")
    with pytest.raises(ValueError) as e:
        reshard.GlooTransport(0, 2, store=tmp_path / "nope")
    assert str(e.value) == (f"store: '{tmp_path / 'nope'}' is neither a directory (the rendezvous directory every "
                            "rank shares must exist) nor HOST:PORT")


def test_session_checks_rank_and_transport(plans, tmp_path):
    plan = reshard.Plan.open(plans["tiny-dense"])
    [t] = mesh(1, tmp_path)
    with pytest.raises(reshard.PlanError) as e:
        reshard.Session(plan, 0, t)
    assert str(e.value) == (
        "rank 0: the transport connects 1 ranks, the plan has 12 ranks (a transport connects every plan rank, or only "
        "the active ones: Plan.active_ranks)")
    with pytest.raises(TypeError):
        reshard.Session("plan.rsplan", 0, t)


def test_help_teaches():
    import pydoc

    text = pydoc.render_doc(reshard.Session, renderer=pydoc.plaintext)
    for words in ("bind_module(self, module", "GIL", "Bind again at any time between runs", "non-contiguous view",
                  "PeerError", "torch.nn.Module", "missing(self)", "all or nothing"):
        assert words.lower() in text.lower(), words
    assert "HOST:PORT" in pydoc.render_doc(reshard.GlooTransport, renderer=pydoc.plaintext)
    assert "RESHARD_NCCL_LIBRARY" in pydoc.render_doc(reshard.NcclTransport, renderer=pydoc.plaintext)


# -- NCCL surface without a GPU --------------------------------------------------


def test_nccl_transport_without_cuda_says_so():
    with pytest.raises(reshard.NcclError) as e:
        reshard.NcclTransport(net=None)
    assert str(e.value) == "the net communicator is 0 (NULL)"
    with pytest.raises(TypeError) as e:
        reshard.NcclTransport(net="comm")
    assert "net: cannot take a communicator from str" in str(e.value)
    if reshard.HAVE_CUDA:
        pytest.skip("this runtime has CUDA; the NCCL transport is tested by tools/gpu-check.sh")
    with pytest.raises(reshard.NcclError) as e:
        reshard.NcclTransport(net=1)
    assert str(e.value) == "this reshard runtime was built without CUDA (RESHARD_WITH_CUDA=OFF)"
    with pytest.raises(TypeError) as e:
        reshard.NcclTransport(net="comm")
    assert "net: cannot take a communicator from str" in str(e.value)


def test_nccl_library_errors(tmp_path):
    with pytest.raises(reshard.NcclError) as e:
        reshard.nccl.load(str(tmp_path / "libnccl.so.2"))
    assert str(e.value).startswith(f"cannot load NCCL from '{tmp_path / 'libnccl.so.2'}': ")
    assert "RESHARD_NCCL_LIBRARY" in str(e.value)


@pytest.mark.parametrize("order", ["import reshard, torch", "import torch, reshard"])
def test_reshard_and_torch_import_in_either_order(order):
    # The runtime links libnccl.so.2 in CUDA builds: importing reshard first
    # must not bind torch to another NCCL than its own (reshard preloads it).
    out = subprocess.run([sys.executable, "-c", f"{order}; print(torch.ones(2).sum().item(), reshard.NCCL_PRELOADED)"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("2.0 ")


class Wrapper(torch.nn.Module):
    """Holds the model as `.module`, as Megatron's Float16Module and DDP do."""

    def __init__(self, inner):
        super().__init__()
        self.module = inner
        self.fp16 = False


def test_bind_module_looks_through_wrappers(dense):
    s = session(dense, 8)
    m = Tiny(s.buffers)
    assert s.bind_module(Wrapper(Wrapper(m))) == ["extra"]
    assert s.missing() == []
    name = s.buffers[0].name
    assert s.tensor(name).data_ptr() == m.get_parameter(name).data_ptr()
    # A wrapper with tensors of its own is a model: its names keep "module.".
    w = Wrapper(Tiny(s.buffers))
    w.scale = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(reshard.BindError, match=f"'{name}': no tensor of that name in the module "
                                                f"\\(closest: 'module.{name}'\\)"):
        s.bind_module(w)


def test_colocated_sides_bind_their_own_modules(tmp_path):
    """A colocated cluster whose two sides use the same names on a GPU (HF
    names on both: an FSDP2-like trainer, every tensor cut on dim 0 over 2
    ranks, and an engine holding every tensor whole): the plan calls them
    train:NAME and infer:NAME, each side binds its own module with side=,
    and the refit is exact."""
    model = json.loads((SAMPLES / "tiny-dense" / "model.json").read_text())
    names = [t["name"] for t in model["tensors"]]
    train = {"format": "reshard.layout/1", "name": "fsdp", "model": model["name"], "ranks": 2,
             "meshes": {"m": [["dp", 2]]}, "placements": [{"match": n, "dp": {"shard": 0}} for n in names]}
    infer = {"format": "reshard.layout/1", "name": "whole", "model": model["name"], "ranks": 2,
             "meshes": {"m": [["dp", 2]]}, "placements": [{"match": "*"}]}
    cluster = json.loads(CLUSTER.read_text())
    cluster.update(name="colocated", placement="colocated")
    for n, obj in (("train", train), ("infer", infer), ("cluster", cluster)):
        (tmp_path / f"{n}.json").write_text(json.dumps(obj))
    plan_path = tmp_path / "p.rsplan"
    reshard.compile(SAMPLES / "tiny-dense" / "model.json", tmp_path / "train.json", tmp_path / "infer.json",
                    tmp_path / "cluster.json", plan_path, staging_mb=2)
    plan = reshard.Plan.open(plan_path)
    (tmp_path / "store").mkdir()
    sessions = make_sessions(plan, mesh(2, tmp_path / "store"))
    for s in sessions:
        assert {b.name for b in s.buffers if b.is_source} >= {"train:model.norm.weight", "train:lm_head.weight"}
        assert "infer:model.norm.weight" in {b.name for b in s.buffers if b.is_destination}
        # The plain name says which to bind.
        with pytest.raises(reshard.BindError, match="buffer 'model.norm.weight' is on this GPU for both sides "
                                                    r"\(colocated\): bind 'train:model.norm.weight'"):
            s.bind("model.norm.weight", torch.zeros(64, dtype=torch.bfloat16))
        trainer = {b.name.split(":", 1)[1]: torch.zeros(b.shape, dtype=torch.bfloat16) for b in s.buffers if b.is_source}
        engine = {b.name.split(":", 1)[1]: torch.zeros(b.shape, dtype=torch.bfloat16)
                  for b in s.buffers if b.is_destination}
        assert s.bind_module(trainer, side="train") == []
        assert len(s.missing()) == sum(b.is_destination for b in s.buffers)  # only the training side so far
        assert s.bind_module(engine, side="infer") == []
        assert s.missing() == []
        rt.poison_destinations(s)
        rt.fill_sources(s)
    run_threads([s.run for s in sessions])
    for s in sessions:
        c = rt.check_destinations(s)
        assert c.wrong == 0 and c.checked > 0, c.first
    with pytest.raises(ValueError, match="side: expected 'train' or 'infer'"):
        sessions[0].bind_module({}, side="both")
