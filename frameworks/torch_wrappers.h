// Name segments that PyTorch's module wrappers insert into parameter names,
// which the weights' own names (and so the plan's buffer names) do not have:
//   `_checkpoint_wrapped_module.`  activation checkpointing
//       (torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py:
//       ActivationWrapper, _CHECKPOINT_WRAPPED_MODULE);
//   `_orig_mod.`                   torch.compile (torch/_dynamo/eval_frame.py:
//       OptimizedModule holds the module as `_orig_mod`);
//   `_fsdp_wrapped_module.`        FSDP1 (torch/distributed/fsdp/_common_utils.py:
//       FSDP_WRAPPED_MODULE).
// FSDP2 (`fully_shard`) inserts nothing: it keeps the module's names.
// `reshard check` removes them from dumps, as `Session.bind_module` and
// tools/dump_state_dict.py do in Python (python/reshard/dtensor.py).
#pragma once

#include <string>

namespace reshard {

/// `name` without the wrapper segments above, wherever they occur.
std::string WithoutWrapperSegments(const std::string& name);

}  // namespace reshard
