// reshard init: the model, training and inference specs (and a cluster) from a
// Hugging Face config.json and the frameworks' parallel settings.
#include <cstdio>
#include <filesystem>

#include "compiler/init.h"
#include "tools/commands.h"

namespace reshard::cli {

namespace {

std::string Help() {
  std::string types;
  for (const auto& t : init::SupportedModelTypes()) types += (types.empty() ? "" : ", ") + t;
  return "Write model.json, train.json and infer.json (and cluster.json) for `reshard compile` from a Hugging Face\n"
         "config.json and the frameworks' parallel settings (Megatron-Core 0.19, vLLM 0.33, SGLang 0.5.23, PyTorch FSDP2).\n"
         "Architectures (model_type): " + types + ".\n"
         "\n"
         "--train / --infer take one of:\n"
         "  megatron:tp=N,pp=N[,dp=N][,cp=N][,ep=N][,etp=N][,vpp=N][,pp-layers=N,N,...][,grouped-gemm]\n"
         "           [,spec=te|local][,fp32-norms][,vocab-divisible=N]\n"
         "      dp defaults to the smallest size the expert grid fits in (ep x etp dividing tp x cp x dp);\n"
         "      etp defaults to tp (as in Megatron); pp-layers lists every stage's layer count (uneven first/last\n"
         "      stages); vpp deals layers to virtual stages round-robin and names chunk c's parameters model{c}.\n"
         "      (layers from 0 in each chunk: bind each chunk with that prefix); grouped-gemm names experts as TEGroupedMLP\n"
         "      (mlp.experts.linear_fc1.weight{j}) instead of SequentialMLP (local_experts.{j}); spec=local uses\n"
         "      the non-TE layer spec (separate norms); every parameter is bf16 as under Float16Module (get_model\n"
         "      with --bf16), fp32-norms keeps the local spec's norms in float32 as a bare GPTModel does;\n"
         "      vocab-divisible (default 128) pads the vocabulary to a multiple of it x tp, 0 = no padding\n"
         "      (Megatron-Bridge's default). Refused for qwen3_next (its linear-attention out_norm is HF's\n"
         "      weight - 1 under Megatron-Bridge's zero-centered norms: a refit adds no constant).\n"
         "  vllm:tp=N[,pp=N][,dp=N][,ep][,engines=N][,quant=none|fp8-block|fp8-channel|mxfp8]\n"
         "      dp is vLLM's built-in data parallel (--data-parallel-size): without ep it shards each expert's\n"
         "      intermediate dim over dp x tp; ep spreads whole experts over dp x tp ranks (with tp > 1 and\n"
         "      dp > 1 the shared experts are then whole on every rank); engines=N runs N independent engines\n"
         "      (each its own dp x pp x tp). pp splits the layers as vLLM's get_pp_indices does (global layer\n"
         "      names; ranks ordered dp, pp, tp). An FP8 checkpoint (quantization_config) is served in FP8\n"
         "      block scales unless quant=none; gpt-oss's MXFP4 release needs quant=none (engines serving BF16:\n"
         "      init does not write vLLM's MXFP4 kernel layouts).\n"
         "  sglang:tp=N[,ep=N][,attn-dp=N][,engines=N][,shared-experts=fused|tp|replicated][,dense-tp=1][,dp-lm-head]\n"
         "         [,quant=none|fp8-block]\n"
         "      ep and attn-dp split the TP group as SGLang does: experts whole over ep ranks, each expert's\n"
         "      intermediate dim over tp / ep; attention and the input embedding over tp / attn-dp ranks (Qwen3-MoE,\n"
         "      DeepSeek-V3, Kimi-K2), lm_head (unless dp-lm-head), the dense MLP (unless dense-tp=1) and DeepSeek's\n"
         "      shared experts over all tp; engines=N runs N independent engines. shared-experts: tp (cut over TP,\n"
         "      --disable-shared-experts-fusion), replicated (whole on every rank), fused (slot E of w13_weight,\n"
         "      SGLang's default for DeepSeek-V3/R1 at EP 1 on a GPU; refused: a layout cannot name that slot yet).\n"
         "      Refused with SGLang's reason: experts not divisible by ep, ep not dividing tp, FP8 block slices\n"
         "      fp8.py rejects. An FP8 block checkpoint is served in FP8 unless quant=none.\n"
         "  hf | hf:tp=N\n"
         "      Hugging Face names, one rank or plain row/column TP shards (tests, checkpoint export).\n"
         "  fsdp2:dp_shard=N[,dp_replicate=N][,tp=N][,master=fp32|bf16][,experts-dim=0|1]\n"
         "      PyTorch FSDP2 (fully_shard, torch 2.15) on a transformers 5 model (HF names; MoE experts fused into\n"
         "      mlp.experts.gate_up_proj [E, 2I, H] and down_proj [E, H, I]). DeviceMesh (dp_replicate, dp_shard, tp),\n"
         "      row-major, tp fastest, as TorchTitan names it: every parameter Shard(0) over dp_shard in torch.chunk\n"
         "      sizes (the last ranks short or empty), whole on dp_replicate (HSDP); experts-dim=1 shards the fused\n"
         "      experts on dim 1 (evenly, as FSDP2 requires). tp follows NeMo RL's TP plan: ColwiseParallel\n"
         "      q_proj, k_proj, v_proj, gate_proj, up_proj, lm_head (Shard(0) on tp), RowwiseParallel o_proj,\n"
         "      down_proj (Shard(1)), embed_tokens Shard(0); norms, routers and experts replicated on tp; FSDP2 then\n"
         "      chunks each TP-local piece (_StridedShard); a tp that cuts an attention head is refused, and so is\n"
         "      tp > 1 with MLA (deepseek_v3, kimi_k2: not in the plan) and with qwen3_next (no TP rule for its\n"
         "      linear attention), and gpt_oss and llama4 (transformers holds their experts transposed).\n"
         "      qwen3_next's fused q_proj, in_proj_qkvz, in_proj_ba and conv1d are chunked as whole parameters.\n"
         "      master=fp32 (default: FSDP2 keeps fp32\n"
         "      masters under a bf16 MixedPrecisionPolicy) holds fp32 buffers while the plan moves the model's bf16\n"
         "      (half the bytes); master=bf16 for a model cast to bf16 before fully_shard.\n"
         "\n"
         "Examples:\n"
         "  reshard init --hf-config Qwen3-30B-A3B/config.json --train megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm \\\n"
         "      --infer vllm:tp=2,dp=8 --cluster dgx-h100 -o qwen3-30b\n"
         "  reshard init --hf-config DeepSeek-V3/config.json --train megatron:pp=16,ep=16,grouped-gemm,\\\n"
         "pp-layers=3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2 --infer vllm:tp=16,engines=16 --cluster gb200-nvl72 -o dsv3\n"
         "  reshard init --hf-config Llama-3.1-70B/config.json --train megatron:tp=8,pp=4,dp=2 \\\n"
         "      --infer vllm:tp=8,engines=8 --cluster samples/clusters/dgx-h100.json -o llama70b\n"
         "  reshard init --hf-config Qwen3-8B/config.json --train fsdp2:dp_shard=8,tp=2 --infer vllm:tp=2,engines=8 \\\n"
         "      --cluster dgx-h100 -o qwen3-8b\n"
         "  reshard init --hf-config Qwen3-30B-A3B/config.json --train megatron:tp=2,pp=2,ep=8,etp=1,grouped-gemm \\\n"
         "      --infer sglang:tp=8,ep=8,attn-dp=8 --cluster dgx-h100 -o qwen3-30b-sglang\n"
         "  reshard init --hf-config tiny/config.json --train megatron:tp=2,pp=2,spec=local --infer hf -o tiny";
}

}  // namespace

void AddInitCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("init", Help());
  struct Opts {
    std::string config, train, infer, cluster, out, name;
    bool quiet = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--hf-config", o->config, "the model's Hugging Face config.json (or its directory)")->required();
  cmd->add_option("--train", o->train, "the training side: megatron:..., fsdp2:..., vllm:..., sglang:..., hf or hf:tp=N")->required();
  cmd->add_option("--infer", o->infer, "the inference side: vllm:..., sglang:..., megatron:..., fsdp2:..., hf or hf:tp=N")->required();
  cmd->add_option("--cluster", o->cluster,
                  ClusterOptionHelp("written as cluster.json") +
                      "; with its gpu_memory_GB, init warns where a rank's weights exceed a GPU's memory");
  cmd->add_option("--name", o->name, "the model spec's name (default: from the config's _name_or_path or model_type)");
  cmd->add_option("-o,--output", o->out, "directory to write the specs into (created if missing)")->required();
  cmd->add_flag("-q,--quiet", o->quiet, "print nothing on success");
  cmd->callback([o, &exit_code] {
    init::Request req;
    init::ReadConfig(o->config, req);
    req.train = o->train;
    req.infer = o->infer;
    req.cluster = o->cluster;
    req.name = o->name;
    init::Result res = init::Generate(req);
    init::WriteFiles(o->out, res);
    for (const auto& w : res.warnings) std::fprintf(stderr, "reshard: warning: %s\n", w.c_str());
    if (o->quiet) return;
    for (const auto& [name, text] : res.files)
      std::printf("wrote %s\n", (std::filesystem::path(o->out) / name).string().c_str());
    for (const auto& n : res.notes) std::printf("  %s\n", n.c_str());
    const std::string d = o->out + "/";
    std::printf("next:\n  reshard compile --model %smodel.json --from %strain.json --to %sinfer.json --cluster %s -o %splan.rsplan\n",
                d.c_str(), d.c_str(), d.c_str(),
                o->cluster.empty() ? "CLUSTER.json" : (d + "cluster.json").c_str(), d.c_str());
    exit_code = 0;
  });
}

}  // namespace reshard::cli
