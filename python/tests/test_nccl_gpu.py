"""The NCCL transport through `import reshard` on a CUDA device: the GPU
tests' loopback plan (rank 1 mirrors rank 0; every message goes back to the
sender through one-rank communicators) replayed on torch CUDA tensors, every
element checked; and reshard.nccl's communicators (unique_id, init, split)
on one rank. Run by tools/gpu-check.sh; skipped with a message without a GPU
or without a CUDA build of the runtime."""

from __future__ import annotations

import pytest
import torch

import reshard
import reshard.testing as rt

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _need_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch: the NCCL transport's Python tests need a GPU")
    if not reshard.HAVE_CUDA:
        pytest.skip("this reshard runtime was built without CUDA (RESHARD_WITH_CUDA=OFF)")


def test_loopback_refit_on_device_tensors(tmp_path):
    _need_gpu()
    path = tmp_path / "loopback.rsplan"
    rt.write_loopback_plan(path)
    plan = reshard.Plan.open(path)
    t = reshard.NcclTransport._loopback(0, 0, 2, timeout_s=20)
    s = reshard.Session(plan, 0, t)
    host = {b.name: torch.zeros(b.shape, dtype=DTYPES[b.dtype]) for b in s.buffers}
    rt.poison_destinations_at(plan, 0, host)
    rt.fill_sources_at(plan, 0, host)
    dev = {n: h.to("cuda:0") for n, h in host.items()}
    # One buffer as a strided view of a wider device tensor (through the copy path).
    name, h = next((n, h) for n, h in host.items() if h.dim() == 2)
    wide = torch.zeros(h.shape[0], h.shape[1] + 2, dtype=h.dtype, device="cuda:0")
    wide[:, 1:-1] = dev[name]
    dev[name] = wide[:, 1:-1]
    assert s.bind_module(dev) == []
    with pytest.raises(reshard.BindError) as e:
        s.bind(name, h)  # host memory on an NCCL transport
    assert "the nccl transport needs cuda memory" in str(e.value)
    for _ in range(2):
        stats = s.run()
        assert stats.steps > 0
        back = {n: d.cpu().contiguous() for n, d in dev.items()}
        c = rt.check_destinations_at(plan, 0, back)
        assert c.checked > 0 and c.wrong == 0, c.first


def test_nccl_communicators_from_python():
    _need_gpu()
    path, version = reshard.nccl.load()
    assert "nccl" in path and version > 0
    uid = reshard.nccl.unique_id()
    assert len(uid) == 128
    comm = reshard.nccl.Communicator.init(1, 0, uid, device=0)
    assert (comm.size, comm.rank, comm.device) == (1, 0, 0)
    sub = comm.split(color=0, key=0)
    assert sub is not None and sub.size == 1
    t = reshard.NcclTransport(comm, sub, stream=torch.cuda.Stream(device=0))
    assert t.kind == "nccl" and t.device_index == 0
    del t
    sub.destroy()
    comm.destroy()
    with pytest.raises(reshard.NcclError) as e:
        reshard.nccl.Communicator.init(1, 0, b"short", device=0)
    assert "the unique id has 5 bytes" in str(e.value)
