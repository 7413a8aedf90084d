// The frameworks' side of `reshard init`: parallel settings as users write them
// ("megatron:tp=4,pp=8,ep=16", "vllm:tp=8,dp=16,ep", "hf:tp=2") and the layout
// (reshard.layout/1) each framework's ranks hold for an architecture.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/init_arch.h"

namespace reshard::init {

enum class Framework { megatron, vllm, hf };

/// Parsed framework settings. Unset sizes are 0 until resolved.
struct Settings {
  Framework fw = Framework::hf;
  std::string option;            // "--train" or "--infer", for messages
  std::string text;              // as written
  int64_t tp = 1, pp = 1, dp = 0, cp = 1, ep = 1, etp = 0, vpp = 1, engines = 1;
  std::vector<int64_t> pp_layers;
  bool grouped_gemm = false, te = true, vllm_ep = false, fp32_norms = false;
  int64_t vocab_divisible = 128;
  std::string quant;             // vllm: "", "none", "fp8-block", "fp8-channel", "mxfp8"
};

/// Parses "megatron:...", "vllm:...", "hf[:tp=N]"; errors name `option`.
Settings ParseSettings(const std::string& text, const std::string& option);

/// The layout for `arch` under `s`, in the order reshard.layout/1 writes it;
/// `notes` gets one line per derived fact worth saying (padding, replication).
nlohmann::ordered_json MakeLayout(const Arch& arch, const std::string& model_name, Settings s,
                                  std::vector<std::string>& notes);

}  // namespace reshard::init
