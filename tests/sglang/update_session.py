"""SGLang 0.5.23's weight-update session around one real rank's model
(engine.py), and a fresh load of the same rank for comparison.

`weight_updaters(model)` builds SGLang's own two classes that a refit goes
through in a scheduler process:

- `managers/scheduler_components/weight_updater.py`
  `SchedulerWeightUpdaterManager`: `begin_weight_update`,
  `update_weights_from_tensor`, `end_weight_update` (the session's state,
  the TP barriers, `deserialize_own_rank`);
- `model_executor/model_runner_components/weight_updater.py`
  `WeightUpdater`: `restore_weights_before_loading`, the custom loader
  (`dynamic_import(load_format)`), `post_load_weights` and every quant
  method's `process_weights_after_loading`.

Around them stand the objects a scheduler process has and these CPU ranks do
not (no forward pass, no KV cache): the TP worker (`managers/tp_worker.py`
`TpModelWorker`: its `weight_update_runners` and its own
`deserialize_own_rank`, called unbound), the model runner holding the
`WeightUpdater`, and the scheduler's weight-version record. Requests reach
the manager as the scheduler's dispatcher hands them over (SGLang's
`io_struct` request classes), not through HTTP and the tokenizer manager.

`fresh(...)` loads a second model of this rank from another checkpoint with
the same settings (SGLang's `load_model_with_memory_saver`, as engine.py
loads the first): what a freshly started engine would hold.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

import engine  # noqa: E402  (sets the CPU environment before SGLang is imported)


class _Runner:
    """The model runner's part a weight update uses: its WeightUpdater."""

    def __init__(self, weight_updater):
        self.weight_updater = weight_updater


class _TpWorker:
    """The TP worker's part a weight update uses (managers/tp_worker.py TpModelWorker)."""

    def __init__(self, runner):
        self.model_runner = runner

    def weight_update_runners(self):
        return [("target", self.model_runner)]

    def deserialize_own_rank(self, serialized_named_tensors):
        from sglang.srt.managers.tp_worker import TpModelWorker

        return TpModelWorker.deserialize_own_rank(self, serialized_named_tensors)


class _WeightVersions:
    """What the scheduler records of weight versions (Scheduler.record_weight_version_change)."""

    def __init__(self):
        self.versions = []

    def record_weight_version_change(self, new_version=None):
        if new_version is not None:
            self.versions.append(new_version)


def weight_updaters(model, custom_weight_loaders):
    """(SchedulerWeightUpdaterManager, WeightUpdater) around `model`, SGLang's
    own classes, as a scheduler process makes them (model_runner.py
    init_weight_updater; scheduler.py's weight-update manager)."""
    from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater
    from sglang.srt.runtime_context import get_parallel

    updater = WeightUpdater(tp_rank=get_parallel().tp_rank, device="cpu", gpu_id=0, model_config=None,
                            custom_weight_loaders=list(custom_weight_loaders), get_model=lambda: model,
                            update_model_fields=lambda *a, **k: None, recapture_cuda_graph=lambda: None,
                            get_model_runner=lambda: None)
    manager = SchedulerWeightUpdaterManager(tp_worker=_TpWorker(_Runner(updater)), draft_worker=None,
                                            memory_saver_adapter=None, flush_cache=lambda **k: True,
                                            is_fully_idle=lambda **k: True, scheduler=_WeightVersions())
    return manager, updater


def fresh(ckpt_dir, tp, ep=1, attn_dp=1, shared_experts=None):
    """A second model of this rank (same process groups and settings), loaded by
    SGLang from `ckpt_dir`."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner_components.load_model_utils import (build_load_config,
                                                                                    load_model_with_memory_saver)
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter

    args = engine.server_args(ckpt_dir, tp, ep, attn_dp, None, shared_experts)
    model_config = ModelConfig.from_server_args(args)
    load_config = build_load_config(server_args=args, tp_rank=get_parallel().tp_rank,
                                    remote_instance_weight_transporter_engine=None,
                                    remote_instance_weight_transporter_session_id="", draft_model_idx=None,
                                    weight_cache_mode="off", weight_cache_socket=None)
    return load_model_with_memory_saver(model_config=model_config, load_config=load_config, device="cpu", gpu_id=0,
                                        memory_saver_adapter=TorchMemorySaverAdapter.create(enable=False),
                                        is_draft_worker=False).model
