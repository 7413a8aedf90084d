"""reshard.compile: the plan compiler in-process (what ``reshard compile`` does)."""

from __future__ import annotations

import os
from typing import Any, Dict, Union

from . import _reshard
from .errors import CompileError

PathLike = Union[str, "os.PathLike[str]"]


def compile(model: PathLike, from_: PathLike, to: PathLike, cluster: PathLike, output: PathLike, *,
            strategy: str = "direct", staging_mb: int = 512, nvlink_exchange: bool = True,
            requantize_on_receiver: bool = False) -> Dict[str, Any]:
    """Compiles the refit from the training layout `from_` to the inference
    layout `to` of `model` on `cluster` into the plan file `output` (written
    whole or not at all), with the GIL released.

    The options are ``reshard compile``'s: `strategy` (--strategy: "direct"
    or "gather"), `staging_mb` (--staging-mb, 2..4095), `nvlink_exchange`
    (False: --no-nvlink-exchange), `requantize_on_receiver`
    (--requantize-on-receiver). Returns the summary ``reshard compile --json``
    prints (plan, strategy, ranks, rounds, net_bytes, nvlink_bytes,
    plan_bytes, seconds, split_blocks) plus "summary", the CLI's line.
    Raises CompileError with the CLI's message (naming the file and JSON path).
    """
    paths = {}
    for flag, value in (("--model", model), ("--from", from_), ("--to", to), ("--cluster", cluster)):
        p = os.fspath(value)
        if not os.path.exists(p):
            raise CompileError(f"{flag}: File does not exist: {p}")
        if os.path.isdir(p):
            raise CompileError(f"{flag}: File is actually a directory: {p}")
        paths[flag] = p
    if strategy not in ("direct", "gather"):
        raise CompileError(f"--strategy: {strategy} not in {{direct,gather}}")
    if isinstance(staging_mb, bool) or not isinstance(staging_mb, int) or not 2 <= staging_mb <= 4095:
        raise CompileError(f"--staging-mb: Value {staging_mb} not in range 2 to 4095")
    return _reshard._compile(paths["--model"], paths["--from"], paths["--to"], paths["--cluster"], os.fspath(output),
                             strategy, staging_mb, bool(nvlink_exchange), not requantize_on_receiver)
