"""The training layout of a module whose parameters are DTensors: FSDP2
(``fully_shard``), HSDP, TP x FSDP, as verl's FSDP workers, TRL, OpenRLHF,
TorchTitan and NeMo RL train::

    model = ...; fully_shard(...)                     # every rank
    layout = reshard.layout_from_module(model, "specs/model.json", path="specs/train.json")
    # CI: reshard compile --model specs/model.json --from specs/train.json --to infer.json ...

Everything comes from each parameter's DTensor metadata (device mesh,
placements, global shape) and its local tensor, on the rank that calls it:
no collective runs, and every rank derives the same layout.

What a DTensor says, in reshard.layout/1:

- the mesh: the DTensor's root device mesh (the one a submesh such as
  ``mesh["dp"]`` was sliced from), its dim names and sizes; its rank tensor
  must be ``arange(world size)`` in row-major order (layout rank = global rank);
- ``Shard(d)``: ``{"shard": d, "split": "chunk"}`` (torch.chunk: chunks of
  ceil(L / n), the last ones short or empty); ``Replicate()``: "replicate";
  ``_StridedShard(d, split_factor=s)`` (TP x FSDP: TP cuts first, FSDP chunks
  the TP-local piece): a shard of d cut after the axes it strides over (the
  placement's "order"); ``Partial`` or anything else: an error;
- a mesh dim the DTensor's (sub)mesh lacks: "replicate"; a flattened dim
  (``mesh["dp", "cp"]._flatten()``): successive cuts by its root axes, where
  that is the same cut;
- dtypes: the parameters' own (fp32 masters under a bf16
  ``MixedPrecisionPolicy`` are fp32): the layout-level "dtype" when they all
  agree with each other but not with the model, buffer rules otherwise.

Names: wrapper segments (``_checkpoint_wrapped_module.``, ``_orig_mod.``,
``_fsdp_wrapped_module.``) are removed wherever they appear. A parameter
that is an instance of a model tensor family is placed as that family; one
that is not (transformers 5 fused experts ``mlp.experts.gate_up_proj``
[E, 2I, H]) is placed through the buffer rule of `base` (a layout, e.g. from
``reshard init``) that names it, which is copied: its parts placed as the
DTensor says (a buffer dim is a stack dim or a dim of the parts' shape; a
cut of the fused dim becomes the rule's ``"shard": {"axis": A, "split":
"chunk"}``).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from itertools import product
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._tensors import WRAPPER_SEGMENTS, dtensor_local, is_dtensor, strip_wrappers
from .errors import CompileError

if TYPE_CHECKING:
    import torch

__all__ = ["layout_from_module", "LayoutError", "strip_wrappers", "write_layout", "layout_text", "WRAPPER_SEGMENTS"]

PathLike = Union[str, "os.PathLike[str]"]

_TORCH_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
                 "torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e8m0fnu": "e8m0"}
_RESERVED_AXES = ("match", "mesh", "order", "split_heads")


class LayoutError(CompileError, ValueError):
    """The module cannot be described by a reshard.layout/1 for this model
    spec (the message names the parameter and why)."""


# -- specs ----------------------------------------------------------------------

def _load(spec: Any, what: str, fmt: str) -> Dict[str, Any]:
    if isinstance(spec, Mapping):
        d = dict(spec)
        where = what
    else:
        where = os.fspath(spec)
        try:
            with open(where) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise LayoutError(f"{what}: cannot read {where}: {e}") from None
    if not isinstance(d, dict) or d.get("format") != fmt:
        got = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise LayoutError(f"{what} ({where}): expected a {fmt} spec, got format {got!r}")
    return d


_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def _template(name: str) -> Tuple[List[str], List[str]]:
    """A name cut at its placeholders: (literal texts, placeholder contents)."""
    parts = _PLACEHOLDER.split(name)
    return parts[0::2], parts[1::2]


def _regex(texts: List[str], holes: List[str]) -> "re.Pattern[str]":
    out = re.escape(texts[0])
    for i, _ in enumerate(holes):
        out += f"(?P<h{i}>0|[1-9][0-9]*)" + re.escape(texts[i + 1])
    return re.compile(out + r"\Z")


class _Family:
    """A model tensor family: name with {dim} placeholders, stack dims, shape."""

    def __init__(self, t: Mapping[str, Any], index: int, dims: Mapping[str, int], model_dtype: str):
        self.name: str = t["name"]
        self.index = index
        self.shape: Tuple[int, ...] = tuple(int(x) for x in t["shape"])
        self.dtype: str = t.get("dtype", model_dtype)
        texts, holes = _template(self.name)
        self.stack: List[str] = holes
        self.regex = _regex(texts, holes)
        # per stack dim, the intervals the family exists for ("range": [lo, hi]
        # or a list of them: a hybrid model's linear-attention layers)
        self.range: Dict[str, List[Tuple[int, int]]] = {}
        for d in holes:
            if d not in dims:
                raise LayoutError(f"model: tensor '{self.name}': placeholder '{{{d}}}' is not a dim declared in /dims")
            self.range[d] = _intervals(t.get("range", {}).get(d, (0, dims[d])))
        heads = t.get("heads")
        self.heads: Optional[Tuple[int, int]] = (int(heads["dim"]), int(heads["size"])) if heads else None

    def instance(self, name: str) -> Optional[Dict[str, int]]:
        m = self.regex.match(name)
        if m is None:
            return None
        idx = {d: int(m.group(f"h{i}")) for i, d in enumerate(self.stack)}
        if any(not _within(idx[d], ivs) for d, ivs in self.range.items()):
            return None
        return idx

    def indices(self, d: str) -> List[int]:
        return [i for lo, hi in self.range[d] for i in range(lo, hi)]


def _intervals(v: Any) -> List[Tuple[int, int]]:
    """A model or rule "range" value: [lo, hi] or [[lo, hi], ...]."""
    v = list(v)
    return [(int(x[0]), int(x[1])) for x in v] if v and isinstance(v[0], (list, tuple)) else [(int(v[0]), int(v[1]))]


def _within(i: int, intervals: List[Tuple[int, int]]) -> bool:
    return any(lo <= i < hi for lo, hi in intervals)


class _Rule:
    """A buffer rule of the base layout that may name fused parameters."""

    def __init__(self, j: Mapping[str, Any], index: int, families: Mapping[str, _Family]):
        self.json = dict(j)
        self.index = index
        self.name: str = j["name"]
        parts = [j["tensor"]] if "tensor" in j else list(j.get("parts", []))
        missing = [p for p in parts if p not in families]
        self.usable = bool(parts) and not missing
        self.parts: List[_Family] = [families[p] for p in parts if p in families]
        texts, holes = _template(self.name)
        self.holes: List[str] = []
        for h in holes:
            dim, _, kind = h.partition(".")
            if kind not in ("", "local"):
                self.usable = False  # {dim.chunk} / {dim.in_chunk}: a pipeline's numbering
            self.holes.append(dim)
        self.regex = _regex(texts, holes)
        if "concat" in j:
            self.fuse: Optional[str] = "concat"
            self.fuse_dim = int(j["concat"])
        elif "interleave" in j:
            self.fuse, self.fuse_dim = "interleave", int(j["interleave"]["dim"])
            if "blocks" in j["interleave"]:
                self.usable = False  # blocks of parts: not a layout a module's parameters are matched by
        else:
            self.fuse, self.fuse_dim = None, -1
        self.range: Dict[str, List[Tuple[int, int]]] = {d: _intervals(v) for d, v in j.get("range", {}).items()}
        if self.usable:
            p0 = self.parts[0]
            self.usable = all(p.stack == p0.stack and len(p.shape) == len(p0.shape) for p in self.parts)
            self.usable = self.usable and all(h in p0.stack for h in self.holes)

    def instance(self, name: str) -> Optional[Dict[str, int]]:
        if not self.usable:
            return None
        m = self.regex.match(name)
        if m is None:
            return None
        idx: Dict[str, int] = {}
        for i, d in enumerate(self.holes):
            v = int(m.group(f"h{i}"))
            if idx.setdefault(d, v) != v:
                return None
        for d, v in idx.items():
            if not _within(v, self.parts[0].range[d]) or (d in self.range and not _within(v, self.range[d])):
                return None
        return idx

    def indices(self, d: str) -> List[int]:
        """The instances of stack dim `d` this rule names."""
        return [i for i in self.parts[0].indices(d) if d not in self.range or _within(i, self.range[d])]

    def _extent(self, d: str) -> Tuple[int, int]:
        """A leading (stacked) dim's instances: one run, or an error."""
        ids = self.indices(d)
        if ids != list(range(ids[0], ids[-1] + 1)):
            raise LayoutError(f"buffer rule '{self.name}' stacks the '{d}' dim of '{self.parts[0].name}', which "
                              f"exists for separate intervals: name each instance ({{{d}}} in the rule's name)")
        return ids[0], ids[-1] + 1

    @property
    def leading(self) -> List[str]:
        """The parts' stack dims the name does not instance: leading buffer dims."""
        return [d for d in self.parts[0].stack if d not in self.holes]

    def shape(self) -> Tuple[int, ...]:
        """The whole buffer's shape: leading stack dims, then the parts' fused shape."""
        p0 = self.parts[0]
        trailing = list(p0.shape)
        if self.fuse is not None:
            trailing[self.fuse_dim] = sum(p.shape[self.fuse_dim] for p in self.parts)
        lead = []
        for d in self.leading:
            lo, hi = self._extent(d)
            lead.append(hi - lo)
        return tuple(lead) + tuple(trailing)


# -- meshes -----------------------------------------------------------------------

class _Mesh:
    """A layout mesh: a root DeviceMesh's dim names and sizes."""

    def __init__(self, name: str, axes: List[str], sizes: List[int], coord: Tuple[int, ...]):
        self.name, self.axes, self.sizes, self.coord = name, axes, sizes, coord
        self.same_cut: set = set()  # (length, axes of each flattened mesh dim) checked to cut alike


def _root_axes(mesh: Any, root: Any, pname: str) -> List[List[int]]:
    """For each dim of `mesh` (a DTensor's device mesh), the dims of its root
    mesh it spans, outer first (one, or several for a flattened dim)."""
    if mesh is root:
        return [[i] for i in range(mesh.ndim)]
    root_names = list(root.mesh_dim_names or ())
    sizes = list(root.mesh.shape)
    strides = [math.prod(sizes[k + 1:]) for k in range(len(sizes))]
    out: List[List[int]] = []
    names = list(mesh.mesh_dim_names or ())
    layout = getattr(mesh, "_layout", None)
    for i in range(mesh.ndim):
        if names and names[i] in root_names and root.size(root_names.index(names[i])) == mesh.size(i):
            out.append([root_names.index(names[i])])
            continue
        if layout is None:
            raise LayoutError(f"'{pname}': its device mesh dim {i} ({names[i] if names else 'unnamed'}) is no dim of "
                              f"the mesh it was sliced from ({root_names}); this torch has no DeviceMesh._layout to "
                              "tell which dims it spans")
        modes = sorted(layout[i].sizes_and_strides, key=lambda m: -m[1])
        dims: List[int] = []
        for size, stride in modes:
            if size == 1:
                continue
            b = next((k for k in range(len(sizes)) if strides[k] == stride and sizes[k] > 1), None)
            a, n = b, sizes[b] if b is not None else 0
            while b is not None and n < size and a > 0:
                a -= 1
                n *= sizes[a]
            if b is None or n != size:
                raise LayoutError(f"'{pname}': its device mesh dim {i} (size {mesh.size(i)}) does not span whole dims "
                                  f"of the root mesh {root_names} {sizes}")
            dims.extend(k for k in range(a, b + 1) if sizes[k] > 1)
        out.append(dims)
    return out


# -- cuts -------------------------------------------------------------------------

def _cut(length: int, cuts: Sequence[Tuple[int, int]]) -> Tuple[int, int]:
    """[lo, hi) of a dim of `length` after successive torch.chunk cuts, each
    (positions n, position p) cutting what the previous left."""
    lo, hi = 0, length
    for n, p in cuts:
        ext = hi - lo
        c = -(-ext // n) if ext else 0
        a, b = min(ext, p * c), min(ext, (p + 1) * c)
        lo, hi = lo + a, lo + b
    return lo, hi


def _placement_text(p: Any) -> str:
    kind = type(p).__name__
    if kind == "_StridedShard":
        return f"_StridedShard(dim={p.dim}, sf={p.split_factor})"
    if kind == "Shard":
        return f"Shard({p.dim})"
    if kind == "Replicate":
        return "Replicate()"
    return repr(p)


class _Derived:
    """What one DTensor parameter says: mesh, per buffer dim the root axes
    cutting it (in cut order), dtype."""

    def __init__(self, pname: str, t: Any, meshes: "_Meshes"):
        self.pname = pname
        mesh = t.device_mesh
        root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
        self.mesh = meshes.of(root, pname)
        axes_of = _root_axes(mesh, root, pname)
        self.placements = tuple(t.placements)
        self.text = "(" + ", ".join(_placement_text(p) for p in self.placements) + ")"
        per_dim: Dict[int, List[Tuple[int, Optional[int]]]] = {}
        for i, p in enumerate(self.placements):
            kind = type(p).__name__
            if kind == "Replicate":
                continue
            if kind == "_StridedShard":
                per_dim.setdefault(p.dim % t.ndim, []).append((i, int(p.split_factor)))
            elif kind == "Shard":
                per_dim.setdefault(p.dim % t.ndim, []).append((i, None))
            else:
                raise LayoutError(f"'{pname}': placement {_placement_text(p)} on mesh dim {i} has no layout "
                                  "(reshard moves what ranks hold: Shard, _StridedShard or Replicate; a Partial "
                                  "parameter holds summands, not values)")
        self.cuts: Dict[int, List[int]] = {}  # buffer dim -> root axes, in the order they cut it
        for d, entries in sorted(per_dim.items()):
            order = self._order(entries, mesh)
            self.cuts[d] = [k for i in order for k in axes_of[i]]
            self._check_flattened(d, order, axes_of, tuple(t.shape))
        self.shape = tuple(int(x) for x in t.shape)
        self.local_shape = tuple(int(x) for x in dtensor_local(t).shape)
        dt = _TORCH_DTYPES.get(str(t.dtype))
        if dt is None:
            raise LayoutError(f"'{pname}': dtype {t.dtype} is none of reshard's "
                              f"({', '.join(sorted(set(_TORCH_DTYPES.values())))})")
        self.dtype = dt

    def _order(self, entries: List[Tuple[int, Optional[int]]], mesh: Any) -> List[int]:
        """Mesh dims cutting one tensor dim, in the order they cut it:
        DTensor reads placements left to right, a _StridedShard cutting after
        the later dims it strides over (split_factor = their sizes' product)."""
        if not entries:
            return []
        (i, sf), rest = entries[0], entries[1:]
        if sf is None:
            return [i] + self._order(rest, mesh)
        over = math.prod(mesh.size(j) for j, _ in rest)
        if sf != over:
            raise LayoutError(f"'{self.pname}': _StridedShard(dim=..., sf={sf}) on mesh dim {i} strides over "
                              f"{sf} pieces, but the mesh dims after it cut that tensor dim into {over}: no layout "
                              "says this cut")
        return self._order(rest, mesh) + [i]

    def _check_flattened(self, d: int, order: List[int], axes_of: List[List[int]], shape: Tuple[int, ...]) -> None:
        """A flattened mesh dim cuts as one axis of the product size; the
        layout cuts by its root axes one after the other. Same cut for every
        coordinate, or an error."""
        if all(len(axes_of[i]) <= 1 for i in order):
            return
        sizes = self.mesh.sizes
        axes = [k for i in order for k in axes_of[i]]
        key = (shape[d], tuple(tuple(axes_of[i]) for i in order))
        if key in self.mesh.same_cut:
            return
        self.mesh.same_cut.add(key)
        for coord in product(*(range(sizes[k]) for k in axes)):
            at = dict(zip(axes, coord))
            flat: List[Tuple[int, int]] = []
            for i in order:
                n, p = 1, 0
                for k in axes_of[i]:
                    n, p = n * sizes[k], p * sizes[k] + at[k]
                flat.append((n, p))
            if _cut(shape[d], flat) != _cut(shape[d], [(sizes[k], at[k]) for k in axes]):
                raise LayoutError(f"'{self.pname}': a flattened mesh dim cuts tensor dim {d} (size {shape[d]}) "
                                  f"unevenly over {', '.join(self.mesh.axes[k] for k in axes)}, which no succession "
                                  "of cuts by those axes says")

    def key(self) -> Tuple[Any, ...]:
        return (self.mesh.name, tuple(sorted((d, tuple(a)) for d, a in self.cuts.items())))

    def expected_local(self, dims: Sequence[int]) -> Tuple[int, ...]:
        """The local shape the layout implies on this rank (torch.chunk cuts)."""
        out = []
        for d, length in enumerate(dims):
            lo, hi = _cut(length, [(self.mesh.sizes[k], self.mesh.coord[k]) for k in self.cuts.get(d, [])])
            out.append(hi - lo)
        return tuple(out)


class _Meshes:
    """Layout meshes by root DeviceMesh: names and sizes; the rank tensor must
    be arange(world size), row-major."""

    def __init__(self, world: Optional[int]):
        self.world = world
        self.by_key: Dict[Tuple[Any, ...], _Mesh] = {}
        self.by_id: Dict[int, _Mesh] = {}

    def of(self, root: Any, pname: str) -> _Mesh:
        m = self.by_id.get(id(root))
        if m is not None:
            return m
        sizes = [int(s) for s in root.mesh.shape]
        n = math.prod(sizes)
        names = list(root.mesh_dim_names) if root.mesh_dim_names else (
            ["dp_shard"] if len(sizes) == 1 else [f"dim{i}" for i in range(len(sizes))])
        desc = f"mesh ({', '.join(f'{a}={s}' for a, s in zip(names, sizes))})"
        if self.world is not None and n != self.world:
            raise LayoutError(f"'{pname}': its {desc} has {n} ranks, the world has {self.world}: a layout's mesh "
                              "covers every rank (build the DTensors on one mesh of the whole world, e.g. "
                              "init_device_mesh over all ranks, and slice it)")
        ranks = root.mesh.reshape(-1).tolist()
        if ranks != list(range(n)):
            raise LayoutError(f"'{pname}': its {desc} holds ranks {root.mesh.tolist()}, not 0..{n - 1} in row-major "
                              "order: a layout numbers ranks by their mesh coordinates (rank = row-major index), so "
                              "the device mesh must be torch.arange(world size).reshape(sizes), as "
                              "init_device_mesh makes it")
        bad = [a for a in names if a in _RESERVED_AXES]
        if bad:
            raise LayoutError(f"'{pname}': mesh dim name '{bad[0]}' is a placement field of reshard.layout/1; "
                              "rename the mesh dim")
        key = (tuple(names), tuple(sizes))
        m = self.by_key.get(key)
        if m is None:
            coord = root.get_coordinate()
            if coord is None:
                raise LayoutError(f"'{pname}': this rank is not in its {desc}")
            name = "fsdp" if not self.by_key else f"fsdp{len(self.by_key)}"
            m = _Mesh(name, names, sizes, tuple(int(c) for c in coord))
            self.by_key[key] = m
        self.by_id[id(root)] = m
        return m


# -- the layout ---------------------------------------------------------------------

class _Placed:
    """A family's placement, from the first parameter that placed it."""

    def __init__(self, pname: str, key: Tuple[Any, ...], text: str, entry: Dict[str, Any], dtype: str):
        self.pname, self.key, self.text, self.entry, self.dtype = pname, key, text, entry, dtype


def _named_parameters(module: Any) -> List[Tuple[str, Any]]:
    if hasattr(module, "named_parameters"):
        return list(module.named_parameters(remove_duplicate=False))
    if isinstance(module, Mapping):
        import torch

        return [(k, v) for k, v in module.items() if isinstance(v, torch.Tensor)]
    raise TypeError(f"module: expected a torch.nn.Module or a mapping of names to tensors, got {type(module).__name__}")


class _Whole:
    """A plain persistent buffer: the whole tensor on every rank."""

    def __init__(self, name: str, dtype: str):
        self.pname, self.dtype, self.text = name, dtype, "(whole: a buffer)"


def _persistent_buffers(module: Any) -> List[Tuple[str, Any]]:
    """(name, tensor) of a module's persistent buffers that are no DTensor (none for a mapping)."""
    if not hasattr(module, "named_modules"):
        return []
    out = []
    for mod_name, mod in module.named_modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for n, b in mod._buffers.items():
            if b is not None and n not in skip and not is_dtensor(b):
                out.append(((mod_name + "." if mod_name else "") + n, b))
    return out


def _split_heads(fam: _Family, cuts: List[int], mesh: _Mesh) -> bool:
    """Whether some rank's share of `fam` starts or ends inside a head."""
    if fam.heads is None or not cuts:
        return False
    dim, size = fam.heads
    for coord in product(*(range(mesh.sizes[k]) for k in cuts)):
        lo, hi = _cut(fam.shape[dim], list(zip((mesh.sizes[k] for k in cuts), coord)))
        if lo < hi and (lo % size or hi % size):
            return True
    return False


def layout_from_module(module: "Union[torch.nn.Module, Mapping[str, torch.Tensor]]",
                       model: Union[PathLike, Mapping[str, Any]], *,
                       base: Union[None, PathLike, Mapping[str, Any]] = None, name: Optional[str] = None,
                       path: Optional[PathLike] = None) -> Dict[str, Any]:
    """The reshard.layout/1 (a dict) of what this module's DTensor parameters
    hold on every rank, for the model spec `model` (a reshard.model/1 path or
    dict). Call it on every rank; no collective runs (each DTensor's device
    mesh, placements and shapes say everything) and every rank gets the same
    layout.

    `module`: a ``torch.nn.Module`` after ``fully_shard`` (and TP's
    ``parallelize_module``), or a mapping of parameter names to DTensors
    (every entry is taken as a parameter: a state dict's plain buffers
    would be refused). Every parameter must be a DTensor; a persistent buffer that is
    a model tensor (DeepSeek's ``e_score_correction_bias``) is placed whole
    on every rank (FSDP2 leaves buffers alone), other buffers are not
    looked at. Wrapper segments
    (``_checkpoint_wrapped_module.``, ``_orig_mod.``,
    ``_fsdp_wrapped_module.``) are removed from the names.

    `base`: a reshard.layout/1 (path or dict, e.g. what ``reshard init``
    wrote) whose buffer rules name parameters that are no instance of a model
    tensor (fused buffers: transformers 5's ``mlp.experts.gate_up_proj``);
    the rules used are copied, their parts placed as the parameter's DTensor.

    `name`: the layout's name (default "fsdp2-" and the mesh). `path`: also
    write the layout there as JSON, atomically (a temporary file of this
    process renamed into place). Every rank that is given `path` writes the
    same bytes, so a shared file system and per-host disks both end with the
    file; pass it on one rank only if you prefer.

    The layout has ``"ranks"`` = the world size, one mesh per root device
    mesh (``"fsdp"``: its dim names, or "dp_shard" for FSDP2's unnamed 1-D
    default mesh, "dim0".. for other unnamed ones) and one placement per
    model tensor family. Raises :class:`LayoutError` (a
    :class:`reshard.CompileError`) naming the parameter: a plain tensor
    beside DTensors, a Partial or unknown placement, a device mesh that is
    not arange(world) row-major, instances of one family placed differently,
    a parameter no family or base rule names, a global shape other than the
    model's, a local shape other than the torch.chunk arithmetic of the
    layout (the module holds something the layout would get wrong), a model
    tensor no parameter holds.
    """
    spec = _load(model, "model", "reshard.model/1")
    rules: List[_Rule] = []
    build = _LayoutBuilder(spec, _world_size())
    if base is not None:
        b = _load(base, "base", "reshard.layout/1")
        rules = [_Rule(r, i, build.by_name) for i, r in enumerate(b.get("buffers", []))]
    build.rules = rules
    for pname, sname, t in _dtensor_parameters(module):
        d = _Derived(pname, t, build.meshes)
        if not build.add_model_tensor(d, sname):
            build.add_base_rule_part(d, sname, base is not None)
    build.add_persistent_buffers(module)
    build.check_every_tensor_held()
    layout = build.layout(name)
    if path is not None:
        write_layout(path, layout)
    return layout


def _world_size() -> Optional[int]:
    """torch.distributed's world size, None when no process group is up."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except ImportError:
        pass
    return None


def _dtensor_parameters(module: Any) -> List[Tuple[str, str, Any]]:
    """(name, stripped name, tensor) of every parameter, each stripped name
    once (a tied tensor under several names); refuses a module without
    DTensors and plain parameters beside DTensors."""
    params: List[Tuple[str, str, Any]] = []
    seen: Dict[str, Any] = {}
    for n, t in _named_parameters(module):
        s = strip_wrappers(n)
        if s in seen:
            if seen[s] is not t:
                raise LayoutError(f"'{n}': two parameters are named '{s}' once wrapper segments are removed")
            continue
        seen[s] = t
        params.append((n, s, t))
    dts = [(n, s, t) for n, s, t in params if is_dtensor(t)]
    plain = [n for n, s, t in params if not is_dtensor(t)]
    if not dts:
        raise LayoutError("the module has no DTensor parameters" + (f" ('{plain[0]}' is a plain tensor)" if plain else "")
                          + ": layout_from_module describes FSDP2 (fully_shard) / DTensor modules")
    if plain:
        raise LayoutError(f"'{plain[0]}' is a plain tensor, while '{dts[0][0]}' is a DTensor"
                          f"{f' ({len(plain)} plain parameters)' if len(plain) > 1 else ''}: a plain parameter's "
                          "placement is unknown (replicated? this rank's own piece?); shard or wrap every "
                          "parameter (fully_shard the root module too)")
    return dts


class _LayoutBuilder:
    """What layout_from_module gathers, parameter by parameter: each model
    tensor family's placement (one for all its instances), the instances
    held, the base rules used; then the layout."""

    def __init__(self, spec: Mapping[str, Any], world: Optional[int]):
        self.spec = spec
        dims: Dict[str, int] = {k: int(v) for k, v in spec.get("dims", {}).items()}
        model_dtype = spec.get("dtype", "bf16")
        self.families = [_Family(t, i, dims, model_dtype) for i, t in enumerate(spec.get("tensors", []))]
        self.by_name = {f.name: f for f in self.families}
        self.rules: List[_Rule] = []
        self.meshes = _Meshes(world)
        self.placed: Dict[str, _Placed] = {}  # family name -> placement
        self.held: Dict[str, set] = {}  # family name -> instances held (tuples of stack indices)
        self.rules_used: Dict[int, Tuple[str, Tuple[Any, ...], Dict[str, Any]]] = {}  # rule index -> (pname, key, json)

    def place(self, fam: _Family, d: Any, entry: Optional[Dict[str, Any]], key: Tuple[Any, ...]) -> None:
        prev = self.placed.get(fam.name)
        if prev is None:
            self.placed[fam.name] = _Placed(d.pname, key, d.text, entry, d.dtype)
            return
        if prev.key != key:
            raise LayoutError(f"'{prev.pname}' and '{d.pname}' are both '{fam.name}' but are placed differently: "
                              f"{prev.text} on mesh '{prev.key[0]}' vs {d.text} on mesh '{key[0]}'; one layout "
                              "placement cannot say both")
        if prev.dtype != d.dtype:
            raise LayoutError(f"'{prev.pname}' ({prev.dtype}) and '{d.pname}' ({d.dtype}) are both '{fam.name}' "
                              "but hold different dtypes")

    @staticmethod
    def axis_entries(d: _Derived, dim_keys: Dict[int, Any], skip: Optional[int]) -> Dict[str, Any]:
        """The placement's mesh-axis fields and "order" from the parameter's cuts."""
        entry: Dict[str, Any] = {}
        cut_of: Dict[int, Any] = {}
        for bd, axes in d.cuts.items():
            for k in axes:
                if k != skip:
                    cut_of[k] = dim_keys[bd]
        for k, a in enumerate(d.mesh.axes):
            entry[a] = {"shard": cut_of[k], "split": "chunk"} if k in cut_of else "replicate"
        # "order": only where some dim is cut against the mesh's axis order.
        sharding = sorted(cut_of)
        order = list(sharding)
        for bd, axes in d.cuts.items():
            axes = [k for k in axes if k != skip]
            slots = sorted(axes)
            for slot, k in zip(slots, axes):
                order[sharding.index(slot)] = k
        if order != sharding:
            entry["order"] = [d.mesh.axes[k] for k in order]
        return entry

    def add_model_tensor(self, d: _Derived, sname: str) -> bool:
        """Places a parameter that is an instance of a model tensor; False when it is none."""
        fam = inst = None
        for f in self.families:
            inst = f.instance(sname)
            if inst is not None:
                fam = f
                break
        if fam is None:
            return False
        if d.shape != fam.shape:
            raise LayoutError(f"'{d.pname}' has shape {list(d.shape)}, the model's '{fam.name}' is "
                              f"{list(fam.shape)}")
        _check_local(d, d.shape)
        entry = None
        if fam.name not in self.placed:  # later instances are compared by key
            entry = {"match": fam.name, "mesh": d.mesh.name}
            entry.update(self.axis_entries(d, {i: i for i in range(len(d.shape))}, None))
            if _split_heads(fam, d.cuts.get(fam.heads[0], []) if fam.heads else [], d.mesh):
                entry["split_heads"] = True
        self.place(fam, d, entry, d.key())
        self.held.setdefault(fam.name, set()).add(tuple(inst[s] for s in fam.stack))
        return True

    def add_base_rule_part(self, d: _Derived, sname: str, have_base: bool) -> None:
        """Places a fused parameter through the base buffer rule that names it."""
        pname = d.pname
        rule = ridx = None
        for r in self.rules:
            ridx = r.instance(sname)
            if ridx is not None:
                rule = r
                break
        if rule is None:
            hint = " (a fused buffer? pass base=, a layout whose buffer rule names it)" if not have_base else ""
            raise LayoutError(f"'{pname}' ('{sname}') is no instance of a tensor of model '{self.spec.get('name')}'"
                              f"{' nor named by a buffer rule of base' if have_base else ''}{hint}")
        for field in ("quant", "at", "held", "shape"):
            if field in rule.json:
                raise LayoutError(f"'{pname}': base buffer rule /buffers/{rule.index} ('{rule.name}') has "
                                  f"\"{field}\", which layout_from_module cannot derive from a DTensor")
        want = rule.shape()
        if d.shape != want:
            raise LayoutError(f"'{pname}' has shape {list(d.shape)}, base buffer rule /buffers/{rule.index} "
                              f"('{rule.name}') makes {list(want)} of its parts")
        _check_local(d, d.shape)
        lead = rule.leading
        nlead = len(lead)
        dim_keys: Dict[int, Any] = {}
        fused_axis = None
        for bd, axes in d.cuts.items():
            if bd < nlead:
                dim_keys[bd] = lead[bd]
            elif rule.fuse is not None and bd - nlead == rule.fuse_dim:
                if len(axes) != 1:
                    raise LayoutError(f"'{pname}': {len(axes)} mesh axes cut the fused dim {bd} of base rule "
                                      f"'{rule.name}'; a rule's \"shard\" takes one axis")
                fused_axis = axes[0]
                dim_keys[bd] = None
            else:
                dim_keys[bd] = bd - nlead
        entry_axes = self.axis_entries(d, dim_keys, fused_axis)
        rj = {k: v for k, v in rule.json.items() if k not in ("shard", "dtype")}
        if fused_axis is not None:
            rj["shard"] = {"axis": d.mesh.axes[fused_axis], "split": "chunk"}
        rj["dtype"] = d.dtype
        key = d.key()
        prev = self.rules_used.get(rule.index)
        if prev is None:
            self.rules_used[rule.index] = (pname, key, rj)
        elif prev[1] != key or prev[2] != rj:
            raise LayoutError(f"'{prev[0]}' and '{pname}' are both base rule '{rule.name}' but are placed "
                              "differently")
        for part in rule.parts:
            entry = None
            if part.name not in self.placed:
                entry = {"match": part.name, "mesh": d.mesh.name}
                entry.update(entry_axes)
                if fused_axis is not None and part.heads and part.heads[0] == rule.fuse_dim:
                    entry["split_heads"] = True
                elif part.heads and _split_heads(part, d.cuts.get(nlead + part.heads[0], []), d.mesh):
                    entry["split_heads"] = True
            self.place(part, d, entry, key + (("rule", rule.index),))
            # instances: every combination of the leading dims, at this name's index
            ranges = [range(*rule._extent(s)) if s in lead else [ridx[s]] for s in part.stack]
            self.held.setdefault(part.name, set()).update(product(*ranges))

    def add_persistent_buffers(self, module: Any) -> None:
        """Persistent buffers that are model tensors (DeepSeek's
        e_score_correction_bias): FSDP2 leaves buffers whole on every rank."""
        first = next(iter(self.meshes.by_key.values()))
        for bname, buf in _persistent_buffers(module):
            sname = strip_wrappers(bname)
            for f in self.families:
                inst = f.instance(sname)
                if inst is None:
                    continue
                if tuple(buf.shape) != f.shape:
                    raise LayoutError(f"buffer '{bname}' has shape {list(buf.shape)}, the model's '{f.name}' is "
                                      f"{list(f.shape)}")
                dt = _TORCH_DTYPES.get(str(buf.dtype))
                if dt is None:
                    raise LayoutError(f"buffer '{bname}': dtype {buf.dtype} is none of reshard's")
                whole = _Whole(bname, dt)
                entry = None if f.name in self.placed else dict({"match": f.name, "mesh": first.name},
                                                                 **{a: "replicate" for a in first.axes})
                self.place(f, whole, entry, (first.name, ()))
                self.held.setdefault(f.name, set()).add(tuple(inst[s] for s in f.stack))
                break

    def check_every_tensor_held(self) -> None:
        """Every model tensor held, every instance."""
        for f in self.families:
            got = self.held.get(f.name)
            if not got:
                raise LayoutError(f"the module holds no parameter for the model's '{f.name}' (model "
                                  f"'{self.spec.get('name')}'): a layout must place every model tensor")
            want = set(product(*(f.indices(s) for s in f.stack)))
            lack = sorted(want - got)
            if lack:
                inst = dict(zip(f.stack, lack[0]))
                nm = _PLACEHOLDER.sub(lambda m: str(inst[m.group(1)]), f.name)
                raise LayoutError(f"the module holds no parameter '{nm}' ({len(lack)} instances of '{f.name}' "
                                  "missing)")

    def layout(self, name: Optional[str]) -> Dict[str, Any]:
        """The reshard.layout/1 dict: the layout's dtype where most families
        agree, per-family buffer rules where they differ."""
        families, placed, first = self.families, self.placed, next(iter(self.meshes.by_key.values()))
        fam_dtype = {f.name: placed[f.name].dtype for f in families}
        in_rules = {p.name for r in self.rules if r.index in self.rules_used for p in r.parts}
        free = [f for f in families if f.name not in in_rules]
        counts = Counter(fam_dtype[f.name] for f in free)
        layout_dtype: Optional[str] = None
        differ = [f for f in free if fam_dtype[f.name] != f.dtype]
        if counts:
            top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
            with_top = [f for f in free if fam_dtype[f.name] != top]
            if differ and len(with_top) < len(differ):
                layout_dtype, differ = top, with_top
        buffers = [self.rules_used[i][2] for i in sorted(self.rules_used)]
        for f in differ:
            buffers.append({"name": f.name, "tensor": f.name, "dtype": fam_dtype[f.name]})

        layout: Dict[str, Any] = {
            "format": "reshard.layout/1",
            "name": name or "fsdp2-" + "-".join(f"{a}{s}" for a, s in zip(first.axes, first.sizes)),
            "model": self.spec.get("name"),
            "notes": "DTensor / FSDP2 parameters; written by reshard.layout_from_module",
            "ranks": math.prod(first.sizes),
        }
        if layout_dtype is not None:
            layout["dtype"] = layout_dtype
        layout["meshes"] = {m.name: [[a, s] for a, s in zip(m.axes, m.sizes)] for m in self.meshes.by_key.values()}
        layout["placements"] = [placed[f.name].entry for f in families]
        if buffers:
            layout["default_buffers"] = True
            layout["buffers"] = buffers
        return layout


def _check_local(d: _Derived, whole: Sequence[int]) -> None:
    want = d.expected_local(whole)
    if d.local_shape != want:
        coord = ", ".join(f"{a}={c}" for a, c in zip(d.mesh.axes, d.mesh.coord))
        raise LayoutError(f"'{d.pname}': this rank ({coord}) holds a local shard of shape {list(d.local_shape)}, "
                          f"the layout of {d.text} over {list(whole)} says {list(want)} (torch.chunk cuts): the "
                          "module holds something this layout would get wrong")


def layout_text(layout: Mapping[str, Any]) -> str:
    """A layout as JSON text, one placement and one buffer rule per line."""
    lines = ["{"]
    items = list(layout.items())
    for i, (k, v) in enumerate(items):
        end = "," if i + 1 < len(items) else ""
        if k in ("placements", "buffers") and v:
            lines.append(f"  {json.dumps(k)}: [")
            lines.extend(f"    {json.dumps(x)}" + ("," if j + 1 < len(v) else "") for j, x in enumerate(v))
            lines.append("  ]" + end)
        elif k == "meshes":
            lines.append(f"  {json.dumps(k)}: {{")
            ms = list(v.items())
            lines.extend(f"    {json.dumps(n)}: {json.dumps(a)}" + ("," if j + 1 < len(ms) else "")
                         for j, (n, a) in enumerate(ms))
            lines.append("  }" + end)
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)}{end}")
    return "\n".join(lines) + "\n}\n"


def write_layout(path: PathLike, layout: Mapping[str, Any]) -> None:
    """Writes `layout` to `path` atomically (a temporary file of this process, flushed and renamed)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(layout_text(layout))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
