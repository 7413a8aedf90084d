"""reshard.compile and reshard.init: the compiler in-process (what ``reshard
compile`` and ``reshard init`` do, with their options and messages)."""

from __future__ import annotations

import difflib
import json
import os
import re
import warnings
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from . import _reshard
from .errors import CompileError

__all__ = ["compile", "init"]

PathLike = Union[str, "os.PathLike[str]"]

# The CLI's option names in the compiler's messages, as this module's argument
# names: a Python caller reads "raise staging_mb to at least 40", never a flag.
_COMPILE_NAMES = {"--model": "model", "--from": "from_", "--to": "to", "--cluster": "cluster", "-o": "output",
                  "--strategy": "strategy", "--staging-mb": "staging_mb", "--fill-of": "fill_of",
                  "--search-fills": "search_fills", "--no-nvlink-exchange": "nvlink_exchange=False",
                  "--requantize-on-receiver": "requantize_on_receiver"}
_INIT_NAMES = {"--hf-config": "hf_config", "--train": "train", "--infer": "infer", "--cluster": "cluster",
               "-o": "out_dir", "--name": "name"}
_BEFORE = r"(?<![\w/.'-])"  # a flag starts a word: not inside a path or a quoted name
_FLAG = re.compile(_BEFORE + r"(--[a-z][a-z-]*|-o)(?![\w-])")
_FLAG_VALUE = [  # a flag and its value, as Python writes the argument: strategy='gather', staging_mb=512
    ("--train", re.compile(_BEFORE + r"--train '"), "train='"),
    ("--infer", re.compile(_BEFORE + r"--infer '"), "infer='"),
    ("--train", re.compile(_BEFORE + r"--train ((?:megatron|vllm|hf|fsdp2)\b[^\s;)']*)"), r"train='\1'"),
    ("--infer", re.compile(_BEFORE + r"--infer ((?:megatron|vllm|hf|fsdp2)\b[^\s;)']*)"), r"infer='\1'"),
    ("--strategy", re.compile(_BEFORE + r"--strategy (direct|gather)\b"), r"strategy='\1'"),
    ("--staging-mb", re.compile(_BEFORE + r"--staging-mb (\d+)"), r"staging_mb=\1"),
    ("--fill-of", re.compile(_BEFORE + r"--fill-of ([^:]+):"), r"fill_of='\1':"),
]


def _python_names(text: str, names: Mapping[str, str]) -> str:
    """`text` with the CLI's option names among `names` replaced by Python's."""
    for flag, pattern, repl in _FLAG_VALUE:
        if flag in names:
            text = pattern.sub(repl, text)
    return _FLAG.sub(lambda m: names.get(m.group(1), m.group(1)), text)


def _speaking_python(e: CompileError, names: Mapping[str, str]) -> CompileError:
    return type(e)(_python_names(str(e), names))


def _fspath(arg: str, value: PathLike) -> str:
    try:
        p = os.fspath(value)
    except TypeError:
        p = value
    if not isinstance(p, str):
        raise TypeError(f"{arg}: expected a path (str or os.PathLike), got {type(value).__name__}")
    return p


def _path(arg: str, value: PathLike, what: str) -> str:
    """An input file's path: TypeError for a value that is no path,
    FileNotFoundError / IsADirectoryError naming the argument."""
    p = _fspath(arg, value)
    if not os.path.exists(p):
        raise FileNotFoundError(f"{arg}: no such file: '{p}'")
    if os.path.isdir(p):
        raise IsADirectoryError(f"{arg}: '{p}' is a directory, expected {what}")
    return p


def _one_of(arg: str, value: Any, allowed: Tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{arg}: expected a str, got {type(value).__name__}")
    if value not in allowed:
        close = difflib.get_close_matches(value, allowed, n=1)
        raise ValueError(f"{arg}={value!r}: expected " + " or ".join(repr(a) for a in allowed) +
                         (f"; did you mean {close[0]!r}?" if close else ""))
    return value


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
    is also a Python ``UserWarning``.

    Raises TypeError or ValueError for an argument of the wrong type or
    value (an unknown cluster name included), FileNotFoundError for an input
    file that does not exist, and CompileError where the specs do not compile
    (the CLI's message, naming the file and JSON path, with this function's
    argument names for the CLI's options: "raise staging_mb to at least 40").
    """
    paths = {"model": _path("model", model, "a reshard.model/1 file"),
             "from_": _path("from_", from_, "a reshard.layout/1 file"),
             "to": _path("to", to, "a reshard.layout/1 file")}
    cluster_path = _fspath("cluster", cluster)  # a file or a bundled name ("dgx-h100"): the compiler resolves it
    out_path = _fspath("output", output)
    _one_of("strategy", strategy, ("direct", "gather"))
    if isinstance(staging_mb, bool) or not isinstance(staging_mb, int):
        raise TypeError(f"staging_mb: expected an int (MiB of staging memory per rank), got {type(staging_mb).__name__}")
    if not 2 <= staging_mb <= 4095:
        raise ValueError(f"staging_mb={staging_mb}: expected 2 to 4095 (MiB of staging memory per rank)")
    fill = ""
    if fill_of is not None:
        fill = _path("fill_of", fill_of, "a plan file")
        if strategy != "direct":
            raise ValueError(f"fill_of: only direct plans fill rounds (this compile is strategy={strategy!r})")
        if search_fills:
            raise ValueError("fill_of excludes search_fills=True: the fill of that plan is reused, none is searched")
    try:
        text, line = _reshard._compile(paths["model"], paths["from_"], paths["to"], cluster_path, out_path, strategy,
                                       staging_mb, bool(nvlink_exchange), not requantize_on_receiver,
                                       bool(search_fills), fill)
    except CompileError as e:
        raise _speaking_python(e, _COMPILE_NAMES) from None
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
    padding, replication), with this function's argument names for the
    CLI's options.

    Raises TypeError or ValueError for an argument of the wrong type or value
    (an unknown cluster name included), FileNotFoundError for a config path
    that does not exist, and CompileError for a config or settings refused,
    with the CLI's message in this function's argument names, e.g.
    ``train='megatron:ep=3': Megatron-Core needs num_moe_experts (8)
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
        path, text = _fspath("hf_config", hf_config), ""
        if not path:
            raise ValueError("hf_config: the path is empty")
        if not os.path.exists(path):
            raise FileNotFoundError(f"hf_config: no such file or directory: '{path}'")
    try:
        files, notes = _reshard._init(path, text, train, infer, "" if cluster is None else _fspath("cluster", cluster),
                                      name or "", "" if out_dir is None else _fspath("out_dir", out_dir))
    except CompileError as e:
        raise _speaking_python(e, _INIT_NAMES) from None
    out: Dict[str, Any] = {f[:-len(".json")]: json.loads(t) for f, t in files}
    out["notes"] = [_python_names(n, _INIT_NAMES) for n in notes]
    return out
