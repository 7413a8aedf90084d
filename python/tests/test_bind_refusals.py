"""What a binding cannot mean is refused by name, before any byte moves:
typed data declared as another dtype, two destination buffers in one memory,
views that write one element twice, wrapper prefixes in a state dict."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

import reshard
from conftest import make_sessions, mesh


@pytest.fixture(scope="module")
def dest(plans, tmp_path_factory):
    """A destination rank's session of tiny-dense (transports connected by threads; no runs)."""
    plan = reshard.Plan.open(plans["tiny-dense"])
    transports = mesh(plan.num_ranks, tmp_path_factory.mktemp("store"))
    return make_sessions(plan, transports)[plan.dest_ranks[0]]


def like(b, dtype=torch.bfloat16):
    return torch.zeros(b.shape, dtype=dtype)


def twins(s):
    """Two destination buffers of one shape and dtype."""
    groups = defaultdict(list)
    for b in s.buffers:
        if b.is_destination and len(b.shape) == 2:
            groups[(b.shape, b.dtype)].append(b)
    return next(g for g in groups.values() if len(g) >= 2)[:2]


def test_a_declared_dtype_never_reinterprets_typed_values(dest):
    s = dest
    b = next(b for b in s.buffers if b.dtype == "bf16")
    rank = s.rank
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, np.full(b.shape, 1.539, dtype=np.float16), dtype="bf16")
    assert str(e.value) == (f"rank {rank}: buffer '{b.name}' is bound with dtype='bf16' on float16 data: its values "
                            "would be read as other numbers; bind an array of uint16 holding the bf16 bits "
                            "(arr.view(np.uint16)), or values converted to bf16")
    for dt in (torch.float16, torch.int16, torch.uint16):
        with pytest.raises(reshard.BindError) as e:
            s.bind(b.name, like(b, dt), dtype="bf16")
        assert str(e.value) == (f"rank {rank}: buffer '{b.name}' is bound with dtype='bf16' on {dt} data: its values "
                                "would be read as other numbers; bind a tensor of the plan's dtype (bf16): convert "
                                "the values, or view raw bits as that dtype (tensor.view(...)) if that is what they are")
    with pytest.raises(reshard.BindError):
        s.bind(b.name, np.zeros(b.shape, dtype=np.int16), dtype="bf16")  # signed: not raw bits
    assert b.name in s.missing()
    s.bind(b.name, np.zeros(b.shape, dtype=np.uint16), dtype="bf16")  # raw bits, declared: fine
    s.bind(b.name, like(b), dtype="bf16")  # the tensor's own dtype, declared: fine
    assert b.name not in s.missing()


def test_two_destinations_in_one_memory_are_refused(dest):
    s = dest
    a, b = twins(s)
    t = like(a)
    s.bind(a.name, t)
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, t)
    msg = str(e.value)
    assert msg.startswith(f"rank {s.rank}: buffer '{b.name}' is bound to memory [0x")
    assert msg.endswith(f" that overlaps buffer '{a.name}' [0x{t.data_ptr():x}, 0x{t.data_ptr() + t.nbytes:x}): "
                        "both are destinations, so each would overwrite the other's weights; bind each to its own "
                        "tensor")
    assert b.name in s.missing()
    # Memory that only partly overlaps is refused too; the same buffer bound
    # again to its own memory, and each to its own tensor, are fine.
    n = t.numel()
    big = torch.zeros(2 * n, dtype=torch.bfloat16)
    s.bind(a.name, big[:n].view(t.shape))
    with pytest.raises(reshard.BindError):
        s.bind(b.name, big[n // 2: n // 2 + n].view(t.shape))
    s.bind(b.name, big[n:].view(t.shape))
    s.bind(a.name, big[:n].view(t.shape))
    s.bind(a.name, t)
    s.bind(b.name, like(b))
    # bind_module: all or nothing, the pair named.
    u = like(a)
    with pytest.raises(reshard.BindError) as e:
        s.bind_module({a.name: u, b.name: u}, missing_ok=True)
    assert (f"'{b.name}': its memory overlaps that of '{a.name}': both are destinations" in str(e.value)
            or f"'{a.name}': its memory overlaps that of '{b.name}': both are destinations" in str(e.value))
    assert s.tensor(a.name).data_ptr() == t.data_ptr()  # nothing was bound


def test_views_that_write_one_element_twice_are_refused(dest):
    s = dest
    a, b = twins(s)
    rows, cols = a.shape
    row = torch.zeros(cols, dtype=torch.bfloat16)
    with pytest.raises(reshard.BindError) as e:
        s.bind(a.name, row.expand(rows, cols))
    assert str(e.value) == (f"rank {s.rank}: buffer '{a.name}' is bound with a view whose elements overlap (strides "
                            f"[0,1] over shape [{rows},{cols}]: an expand() or as_strided() view), the plan writes "
                            "into this buffer: bind a tensor with memory of its own (.contiguous() or .clone())")
    # Two column slices of one wider tensor: disjoint views bind; overlapping ones are refused.
    wide = torch.zeros(rows, 2 * cols, dtype=torch.bfloat16)
    s.bind(a.name, wide[:, :cols])
    s.bind(b.name, wide[:, cols:])
    with pytest.raises(reshard.BindError) as e:
        s.bind(b.name, wide[:, cols // 2: cols // 2 + cols])
    assert str(e.value) == (f"rank {s.rank}: buffer '{b.name}' is bound to a view that shares memory with buffer "
                            f"'{a.name}': both are destinations, so each would overwrite the other's weights; bind "
                            "each to its own tensor")
    s.bind(a.name, like(a))
    s.bind(b.name, like(b))


def test_a_prefixed_state_dict_gets_the_prefix_to_strip(dest):
    s = dest
    state = {"module." + b.name: like(b, torch.bfloat16 if b.dtype == "bf16" else torch.float32) for b in s.buffers}
    with pytest.raises(reshard.BindError) as e:
        s.bind_module(state)
    lines = str(e.value).splitlines()
    assert lines[1] == ("  the module's names start with 'module.' where the plan's do not (a state dict of a "
                        "wrapped model): bind_module(..., strip_prefix='module.')")
    assert s.bind_module(state, strip_prefix="module.") == []
    assert s.missing() == []
