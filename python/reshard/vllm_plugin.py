"""reshard's vLLM plug-in: registers the ``"reshard"`` weight-transfer
engines (worker side and trainer side) in every vLLM process.

vLLM runs the functions of the ``vllm.general_plugins`` entry-point group in
every process it starts (``vllm/plugins/__init__.py`` ``load_general_plugins``,
called by ``v1/worker/worker_base.py`` ``WorkerWrapperBase.init_worker`` in
each worker, by ``v1/engine/core.py`` ``EngineCore.__init__`` and by
``engine/arg_utils.py`` in the front end), so ``vllm serve
--weight-transfer-config '{"backend": "reshard"}'`` finds the engine in its
workers. The package declares::

    [project.entry-points."vllm.general_plugins"]
    reshard = "reshard.vllm_plugin:register"

:func:`register` never raises: it runs in every vLLM process on the
machine, whatever that process serves, and ``load_general_plugins`` calls
plug-in functions without catching their errors. Under another vLLM version
(or one lacking the pieces reshard uses) it logs one line and registers
nothing. It imports neither reshard's engines nor their dependencies:
both factories take a module path and import it only when a process asks
for the ``"reshard"`` backend (``distributed/weight_transfer/factory.py``
``register_engine``, the lazy form).
"""

from __future__ import annotations

import logging
import os
from typing import Optional

#: The vLLM release whose layouts and post-processing reshard was proven against (tests/vllm).
VLLM_VERSION = "0.33.0"

#: The backend name, in both of vLLM's factories.
BACKEND = "reshard"

#: (factory, module, class): what :func:`register` adds.
ENGINES = (
    ("WeightTransferEngineFactory", "reshard.vllm", "ReshardWeightTransferEngine"),
    ("WeightTransferTrainerFactory", "reshard.vllm_trainer", "ReshardTrainerWeightTransferEngine"),
)

_log = logging.getLogger("reshard.vllm_plugin")


def version_problem(version: str) -> Optional[str]:
    """Why reshard's vLLM engines must not be used with vLLM `version` (None: they may)."""
    if version.split("+")[0] == VLLM_VERSION or os.environ.get("RESHARD_VLLM_ANY_VERSION"):
        return None
    return (f"reshard.vllm was proven against vLLM {VLLM_VERSION}; this is vLLM {version}, whose parameter layouts "
            "and post-processing may differ. Check the layout against a dump of a real rank "
            "(tools/dump_state_dict.py, `reshard check`) and set RESHARD_VLLM_ANY_VERSION=1 to use it.")


def _factories() -> list:
    """The two factory classes, or an error naming what this vLLM lacks."""
    from vllm.distributed.weight_transfer import factory

    out = []
    for name, _, _ in ENGINES:
        cls = getattr(factory, name, None)
        if cls is None or not callable(getattr(cls, "register_engine", None)) or not isinstance(
                getattr(cls, "_registry", None), dict):
            raise ImportError(f"vllm.distributed.weight_transfer.factory has no {name}.register_engine")
        out.append(cls)
    return out


def register() -> bool:
    """Registers ``"reshard"`` with vLLM's worker-side and trainer-side
    weight-transfer factories (both or neither; again is a no-op). Returns
    whether both are registered. Never raises: a vLLM of another version, or
    one missing a piece, gets one logged line."""
    try:
        import vllm

        version = getattr(vllm, "__version__", "unknown")
        if version_problem(version) is not None:
            _log.warning("reshard: the 'reshard' weight-transfer engines are not registered: this is vLLM %s, and "
                         "reshard's vLLM layouts were proven against %s (RESHARD_VLLM_ANY_VERSION=1 registers them "
                         "anyway)", version, VLLM_VERSION)
            return False
        factories = _factories()
        added = []
        try:
            for cls, (_, module, name) in zip(factories, ENGINES):
                if BACKEND not in cls._registry:
                    cls.register_engine(BACKEND, module, name)
                    added.append(cls)
        except Exception:
            for cls in added:  # both or neither
                cls._registry.pop(BACKEND, None)
            raise
        return True
    except Exception as e:  # noqa: BLE001 - a plug-in runs in every vLLM process: one line, never a failure
        _log.warning("reshard: the 'reshard' weight-transfer engines are not registered: %s: %s",
                     type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return False
