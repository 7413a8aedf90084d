"""reshard.compile and reshard.init: the compiler in-process (what ``reshard
compile`` and ``reshard init`` do, with their options and messages)."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, Mapping, Optional, Union

from . import _reshard
from .errors import CompileError

PathLike = Union[str, "os.PathLike[str]"]


def compile(model: PathLike, from_: PathLike, to: PathLike, cluster: PathLike, output: PathLike, *,
            strategy: str = "direct", staging_mb: int = 512, nvlink_exchange: bool = True,
            requantize_on_receiver: bool = False, search_fills: bool = False,
            fill_of: Optional[PathLike] = None) -> Dict[str, Any]:
    """Compiles the refit from the training layout `from_` to the inference
    layout `to` of `model` on `cluster` into the plan file `output` (written
    whole or not at all), with the GIL released.

    The options are ``reshard compile``'s: `strategy` (--strategy: "direct"
    or "gather"), `staging_mb` (--staging-mb, 2..4095), `nvlink_exchange`
    (False: --no-nvlink-exchange), `requantize_on_receiver`
    (--requantize-on-receiver), `search_fills` (--search-fills: more ways to
    fill the rounds, the fastest by an estimate kept), `fill_of` (--fill-of:
    an earlier plan of this job whose round fill a recompile reuses, one fill
    and no estimate: after an EPLB step). ``reshard compile
    --simulate-fills``, which forks a process per fill to simulate it, is
    left to the CLI (a CI step): forking a Python process that runs PyTorch
    threads is not safe. Returns the summary ``reshard compile --json``
    prints (plan, strategy, ranks, rounds, net_bytes, nvlink_bytes,
    plan_bytes, split_blocks, shared_packs, round_fill, min_share,
    split_share, nic_reserve, staging_fill, stripe_mib, estimate, memory_warnings, seconds) plus "summary", the CLI's line.
    `cluster` is a reshard.cluster/1 file or a bundled name ("dgx-h100",
    "gb200-nvl72"; a file of that name wins). Where a rank's weights exceed
    the cluster's GPU memory ("gpu_memory_GB"), each such warning of the CLI
    is also a Python ``UserWarning``. Raises CompileError with the CLI's
    message (naming the file and JSON path).
    """
    def existing_file(flag: str, value: PathLike) -> str:  # the CLI's check (CLI11 ExistingFile), its messages
        p = os.fspath(value)
        if not os.path.exists(p):
            raise CompileError(f"{flag}: File does not exist: {p}")
        if os.path.isdir(p):
            raise CompileError(f"{flag}: File is actually a directory: {p}")
        return p

    paths = {"--cluster": os.fspath(cluster)}  # a file or a bundled name ("dgx-h100"): the compiler resolves it
    for flag, value in (("--model", model), ("--from", from_), ("--to", to)):
        paths[flag] = existing_file(flag, value)
    if strategy not in ("direct", "gather"):
        raise CompileError(f"--strategy: {strategy} not in {{direct,gather}}")
    if isinstance(staging_mb, bool) or not isinstance(staging_mb, int) or not 2 <= staging_mb <= 4095:
        raise CompileError(f"--staging-mb: Value {staging_mb} not in range 2 to 4095")
    fill = "" if fill_of is None else existing_file("--fill-of", fill_of)
    text, line = _reshard._compile(paths["--model"], paths["--from"], paths["--to"], paths["--cluster"],
                                   os.fspath(output), strategy, staging_mb, bool(nvlink_exchange),
                                   not requantize_on_receiver, bool(search_fills), fill)
    summary: Dict[str, Any] = json.loads(text)
    summary["summary"] = line
    for w in summary.get("memory_warnings", []):  # the CLI's stderr warnings, as Python warnings
        warnings.warn(w.get("message", str(w)), stacklevel=2)
    return summary


def init(hf_config: Union[PathLike, Mapping[str, Any]], train: str, infer: str, cluster: Optional[PathLike] = None,
         out_dir: Optional[PathLike] = None, *, name: Optional[str] = None) -> Dict[str, Any]:
    """Derives the model spec and the training and inference layouts (and the
    cluster) from a Hugging Face config and the frameworks' parallel
    settings, as ``reshard init`` does, with the GIL released::

        specs = reshard.init("Qwen3-30B-A3B/config.json", train="megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm",
                             infer="vllm:tp=2,dp=8,ep", cluster="dgx-h100", out_dir="qwen3-30b")
        reshard.compile("qwen3-30b/model.json", "qwen3-30b/train.json", "qwen3-30b/infer.json",
                        "qwen3-30b/cluster.json", "qwen3-30b/plan.rsplan")

    `hf_config`: the model's config.json, or the directory holding it
    (--hf-config), or the config itself as a mapping (e.g. a loaded
    config.json, ``transformers.AutoConfig.to_dict()``). `train` and `infer`
    (--train, --infer): ``megatron:tp=N,pp=N[,dp,cp,ep,etp,vpp,pp-layers,
    grouped-gemm,spec=te|local,fp32-norms,vocab-divisible]``,
    ``vllm:tp=N[,pp,dp,ep,engines,quant=none|fp8-block|fp8-channel|mxfp8]``,
    ``hf`` or ``hf:tp=N`` (``reshard init --help`` explains each). `cluster`
    (--cluster): "dgx-h100", "gb200-nvl72" or a reshard.cluster/1 file.
    `name` (--name): the model spec's name (default: from the config).
    `out_dir` (-o): also write model.json, train.json, infer.json (and
    cluster.json) there, each file whole; nothing is written when an input is
    refused.

    Returns ``{"model": ..., "train": ..., "infer": ...[, "cluster": ...],
    "notes": [...]}``: each spec as a dict (exactly the JSON the files hold),
    and the lines ``reshard init`` prints about what it derived (ranks,
    padding, replication). Raises CompileError with the CLI's message, e.g.
    ``--train 'megatron:ep=3': Megatron-Core needs num_moe_experts (8)
    divisible by expert_model_parallel_size (3)``.
    """
    for arg, value in (("train", train), ("infer", infer)):
        if not isinstance(value, str):
            raise TypeError(f"{arg}: expected a str such as 'megatron:tp=2' or 'vllm:tp=4', got {type(value).__name__}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name: expected a str, got {type(name).__name__}")
    if isinstance(hf_config, Mapping):
        try:
            path, text = "", json.dumps(dict(hf_config))
        except (TypeError, ValueError) as e:
            raise TypeError(f"hf_config: the mapping is not JSON: {e}") from None
    else:
        path, text = os.fspath(hf_config), ""
        if not path:
            raise CompileError("--hf-config: the path is empty")
    files, notes = _reshard._init(path, text, train, infer, "" if cluster is None else os.fspath(cluster),
                                  name or "", "" if out_dir is None else os.fspath(out_dir))
    out: Dict[str, Any] = {f[:-len(".json")]: json.loads(t) for f, t in files}
    out["notes"] = list(notes)
    return out
