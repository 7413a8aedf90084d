#!/usr/bin/env python3
"""Writes what a rank of a framework really holds (name, dtype, shape of every
parameter and persistent buffer) as the dump `reshard check` reads:

    {"rank": R, "params": [{"name": N, "dtype": "torch.bfloat16", "shape": [..]}, ...]}

A DTensor (FSDP2's fully_shard, TP) is what this rank holds: its local
shape, plus its "placements" (["Shard(0)"], ["_StridedShard(dim=0, sf=2)",
"Shard(0)"], ["Replicate()", "Shard(0)"]) and its device "mesh"
({"names": ["dp", "tp"], "shape": [2, 2]}; names null when unnamed). Wrapper
segments (_checkpoint_wrapped_module. of activation checkpointing, _orig_mod.
of torch.compile, _fsdp_wrapped_module. of FSDP1) are removed from every name.

From your own code, on every rank of a Megatron or vLLM model:

    import dump_state_dict  # tools/ on sys.path
    dump_state_dict.write(f"dump/rank{rank}.json", model, rank, strip="module.")

or from a saved state dict (torch.save of a dict of tensors):

    python tools/dump_state_dict.py CKPT.pt --rank 0 -o dump/rank0.json

then: reshard check --layout train.json --model model.json --state-dict dump/rank*.json
"""
import argparse
import json
import os
import sys


WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")


def strip_wrappers(name):
    """`name` without wrapper segments, wherever they appear."""
    parts = name.split(".")
    return ".".join(p for p in parts if p not in WRAPPER_SEGMENTS)


def _is_dtensor(t):
    return any(c.__name__ == "DTensor" and c.__module__.startswith("torch.distributed") for c in type(t).__mro__)


def placement_text(p):
    """Shard(0), _StridedShard(dim=0, sf=2), Replicate(), or torch's repr of anything else (Partial(sum))."""
    kind = type(p).__name__
    if kind == "_StridedShard":
        return f"_StridedShard(dim={p.dim}, sf={p.split_factor})"
    if kind == "Shard":
        return f"Shard({p.dim})"
    if kind == "Replicate":
        return "Replicate()"
    return repr(p)


def entry(name, tensor):
    local = tensor
    if _is_dtensor(tensor):  # what this rank holds: the local shard
        local = tensor._local_tensor if getattr(tensor, "_local_tensor", None) is not None else tensor.to_local()
    e = {"name": name, "dtype": str(local.dtype), "shape": list(local.shape)}
    if not local.is_contiguous():  # a view (vLLM's per-channel FP8 weight.t()): its memory order
        e["stride"] = list(local.stride())
    if local is not tensor:
        mesh = tensor.device_mesh
        e["placements"] = [placement_text(p) for p in tensor.placements]
        e["mesh"] = {"names": list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
                     "shape": list(mesh.mesh.shape)}
    return e


def persistent_buffers(module):
    """(name, tensor) of every persistent buffer, as state_dict() would name them."""
    for mod_name, mod in module.named_modules(remove_duplicate=True):
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for b_name, buf in mod._buffers.items():
            if buf is not None and b_name not in skip:
                yield (mod_name + "." if mod_name else "") + b_name, buf


def _strip(name, strip):
    name = strip_wrappers(name)
    for prefix in strip:
        while prefix and name.startswith(prefix):
            name = name[len(prefix):]
    return name


def params_of(module, strip=()):
    """Entries for named_parameters() then persistent buffers, wrapper
    segments and the prefixes in `strip` (e.g. "module." of DDP /
    Float16Module wrappers) removed."""
    if isinstance(strip, str):
        strip = (strip,)
    out, seen = [], set()
    items = list(module.named_parameters()) + list(persistent_buffers(module))
    for name, t in items:
        name = _strip(name, strip)
        if name in seen:
            continue
        seen.add(name)
        out.append(entry(name, t))
    return out


def rank_dump(module, rank, strip=(), meta=None):
    """{"rank", **meta (e.g. the framework's version), "params"}."""
    return dict({"rank": int(rank)}, **(meta or {}), params=params_of(module, strip))


def write_json(path, obj):
    """Writes a rank's dump, or a list of them, atomically (a temporary file renamed into place)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        if isinstance(obj, list):
            f.write("[\n" + ",\n".join(_format_rank(r) for r in obj) + "\n]\n")
        else:
            f.write(_format_rank(obj) + "\n")
    os.replace(tmp, path)


def _format_rank(r):
    # One parameter per line: readable diffs of recorded dumps.
    head = {k: v for k, v in r.items() if k != "params"}
    lines = ",\n".join("  " + json.dumps(p) for p in r["params"])
    text = json.dumps(head)[:-1]
    return text + (", " if head else "") + '"params": [\n' + lines + "\n]}"


def write(path, module, rank, strip=(), meta=None):
    write_json(path, rank_dump(module, rank, strip, meta))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a torch.save'd dict of tensors (a state dict)")
    ap.add_argument("--rank", type=int, default=0, help="the rank this state dict is (default 0)")
    ap.add_argument("--strip", action="append", default=[], help="name prefix to remove (repeatable)")
    ap.add_argument("-o", "--output", required=True, help="the dump to write (JSON)")
    a = ap.parse_args(argv)
    import torch
    try:
        sd = torch.load(a.checkpoint, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any load failure is the user's file
        sys.exit(f"dump_state_dict: {a.checkpoint}: cannot load: {e}")
    if not isinstance(sd, dict):
        sys.exit(f"dump_state_dict: {a.checkpoint}: expected a dict of tensors, got {type(sd).__name__}")
    params = [entry(_strip(k, a.strip), v) for k, v in sd.items() if isinstance(v, torch.Tensor)]
    write_json(a.output, {"rank": a.rank, "params": params})
    print(f"{a.output}: rank {a.rank}, {len(params)} tensors")


if __name__ == "__main__":
    main()
