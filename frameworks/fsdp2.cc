// PyTorch FSDP2 (`fully_shard`), alone, as HSDP, or over DTensor tensor
// parallelism, on transformers 5 models: what each rank holds, and the settings
// "fsdp2:dp_shard=N[,dp_replicate=M][,tp=K][,master=fp32|bf16][,experts-dim=0|1]"
// (the DeviceMesh dims named as TorchTitan names them).
// Sources (torch 2.15, transformers 5.20.2, NeMo RL):
//  - torch/distributed/fsdp/_fully_shard/_fsdp_param.py FSDPParam._init_sharded_param:
//    every parameter Shard(0) over the shard dim of the mesh (a
//    shard_placement_fn may pick another dim), cut by _chunk_with_empty
//    (_fsdp_common.py: torch.chunk, chunks of ceil(L / n), the trailing ranks
//    short or holding an empty [0, ...] shard); uneven sharding on a dim other
//    than 0 is refused ("FSDP does not support uneven sharding on dim d"). On a
//    2-D mesh (dp_replicate, dp_shard) it is HSDP: (Replicate(), Shard(0))
//    (_fully_shard.py fully_shard). _init_sharding_spec_tp: a parameter that is
//    already a TP DTensor has its local TP piece chunked (_StridedShard: TP
//    cuts first, then FSDP). Only parameters are sharded: module buffers
//    (DeepSeek-V3's e_score_correction_bias) stay whole on every rank.
//  - _fsdp_api.py MixedPrecisionPolicy: param_dtype is the dtype the
//    parameters are all-gathered in for compute; the sharded parameters keep
//    the dtype the model was built in (fp32 masters under a bf16 policy).
//  - torch/distributed/tensor/parallel/style.py ColwiseParallel (Linear weight
//    and bias Shard(0)), RowwiseParallel (Linear weight Shard(1), bias
//    Replicate(); Embedding weight Shard(0)).
//  - NeMo RL nemo_rl/models/dtensor/parallelize.py _parallelize_llama,
//    _parallelize_qwen (the TP plan): model.embed_tokens RowwiseParallel,
//    model.layers.*.self_attn.{q,k,v}_proj and mlp.{gate,up}_proj
//    ColwiseParallel, self_attn.o_proj and mlp.down_proj RowwiseParallel,
//    lm_head ColwiseParallel; nothing else is in the plan.
//  - transformers 5.20.2 models/<arch>/modeling_<arch>.py: the parameters keep
//    the checkpoint's names (FSDP2 inserts no prefix), except the MoE experts,
//    fused into two parameters per layer: Qwen3MoeExperts
//    (modeling_qwen3_moe.py), MixtralExperts (modeling_mixtral.py),
//    DeepseekV3Experts (modeling_deepseek_v3.py) hold `gate_up_proj`
//    [E, 2 x I, H] (gate rows then up rows: forward's `.chunk(2, dim=-1)`) and
//    `down_proj` [E, H, I], without `.weight`. conversion_mapping.py loads
//    checkpoints into them: "qwen2_moe" (used by qwen3_moe and deepseek_v3)
//    merges experts.*.gate_proj / up_proj with MergeModulelist(dim=0) +
//    Concatenate(dim=1); "mixtral" merges w1 (gate) / w3 (up) the same way,
//    w2 into down_proj, and renames `.block_sparse_moe.` to `.mlp.`
//    (MixtralDecoderLayer's MixtralSparseMoeBlock is `mlp`). DeepseekV3TopkRouter's
//    e_score_correction_bias is an nn.Buffer kept in fp32
//    (_keep_in_fp32_modules_strict); its shared experts are a DeepseekV3MLP
//    (mlp.shared_experts.{gate,up,down}_proj.weight).
#include <algorithm>
#include <set>

#include "compiler/spec.h"
#include "frameworks/layout_builder.h"
#include "runtime/error.h"

namespace reshard::init {
namespace {

using nlohmann::ordered_json;

// transformers 5's name of a checkpoint tensor family (conversion_mapping.py, "mixtral").
std::string LiveName(std::string name) {
  const std::string from = ".block_sparse_moe.";
  if (const auto at = name.find(from); at != std::string::npos) name.replace(at, from.size(), ".mlp.");
  return name;
}

// The fused experts parameter an expert tensor family lives in.
std::string FusedExpertName(const ArchTensor& t) {
  const std::string prefix = t.name.substr(0, t.name.find(".{expert}."));
  return LiveName(prefix) + (t.role == Role::expert_down ? ".down_proj" : ".gate_up_proj");
}

// NeMo RL's TP plan: the dim tp cuts a role on, -1 when the role is not in the
// plan (replicated on tp). ColwiseParallel shards a Linear's bias with its weight.
int TpDim(Role r) {
  switch (r) {
    case Role::embed: case Role::lm_head: case Role::q: case Role::k: case Role::v:
    case Role::q_bias: case Role::k_bias: case Role::v_bias: case Role::gate: case Role::up:
      return 0;
    case Role::o: case Role::down: return 1;
    default: return -1;
  }
}

// torch.chunk of `len` over `n` positions: the size at position p (0 past the end).
int64_t ChunkSize(int64_t len, int64_t n, int64_t p) {
  const int64_t c = (len + n - 1) / n;
  return std::clamp<int64_t>(len - p * c, 0, c);
}

ordered_json Chunk(const ordered_json& dim) { return {{"shard", dim}, {"split", "chunk"}}; }

// The chunk sizes, "63, 63, 63, 61"; over more than 8 positions with runs
// counted: "2 x 16, 0 x 48".
std::string Sizes(int64_t len, int64_t n) {
  std::string out;
  for (int64_t p = 0; p < n;) {
    int64_t run = 1;
    while (n > 8 && p + run < n && ChunkSize(len, n, p + run) == ChunkSize(len, n, p)) ++run;
    out += (p ? ", " : "") + S(ChunkSize(len, n, p)) + (run > 1 ? " x " + S(run) : "");
    p += run;
  }
  return out;
}

// A list of notes' items, the first few in full.
std::string List(const std::vector<std::string>& items, size_t shown = 4) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < shown; ++i) out += (i ? "; " : "") + items[i];
  if (items.size() > shown) out += "; and " + S(items.size() - shown) + " more";
  return out;
}

ordered_json MakeFsdp2(const Arch& a, const std::string& model, Settings& s, Notes& notes) {
  if (s.dp_shard == 0)
    Fail(s, "fsdp2 needs dp_shard=N: the size of the DeviceMesh dim fully_shard shards over (TorchTitan's dp_shard)");
  // transformers 5's GptOssExperts (models/gpt_oss/modeling_gpt_oss.py) and
  // Llama4TextExperts (models/llama4/modeling_llama4.py) hold gate_up_proj
  // [E, H, 2I] and down_proj [E, I, H]: [in, out], the transpose of the model
  // spec's [out, in] experts (what vLLM and Megatron hold).
  if (a.experts_transposed) {
    const ArchTensor* g = Find(a, Role::expert_gate);
    const bool llama4 = a.model_type == "llama4";
    Fail(s, "transformers 5's " + a.model_type + " experts (" +
                (llama4 ? "Llama4TextExperts, models/llama4/modeling_llama4.py" : "GptOssExperts, models/gpt_oss/modeling_gpt_oss.py") +
                ") are " + g->name.substr(0, g->name.find(".{expert}.")) + ".gate_up_proj [" + S(a.experts) + ", " +
                S(a.hidden) + ", " + S(2 * g->shape[0]) +
            "] and down_proj [" + S(a.experts) + ", " + S(g->shape[0]) + ", " + S(a.hidden) +
            "], [in, out] per expert: the transpose of the [out, in] experts vLLM and Megatron hold, and a layout "
            "cannot transpose; reshard init does not describe FSDP2 for " + a.model_type);
  }
  // transformers 5 holds Qwen3-Next's gated q_proj, in_proj_qkvz, in_proj_ba
  // and conv1d as the checkpoint fuses them (modeling_qwen3_next.py), and
  // fully_shard chunks each fused parameter as a whole: their buffer rules
  // below cut the fused buffer ("shard": dp_shard). NeMo RL's TP plan has no
  // rule for the linear attention.
  const bool fused_parts = Find(a, Role::q_gate) != nullptr;
  if (fused_parts && s.tp > 1)
    Fail(s, "NeMo RL's TP plan has no rule for Qwen3-Next's linear attention (in_proj_qkvz, conv1d, ...) nor its "
            "gated q_proj; use tp=1");
  const int64_t rep = s.dp_replicate, shard = s.dp_shard, tp = s.tp;
  const bool moe = a.experts > 0, fp32 = s.master == "fp32";
  if (s.experts_dim != 0 && !moe) Fail(s, "the model has no experts; leave out experts-dim");
  if (tp > 1 && a.mla)
    Fail(s, "tp follows NeMo RL's TP plan, which cuts o_proj by heads (RowwiseParallel) but has no rule for MLA's "
            "q_a_proj / q_b_proj / kv_a_proj_with_mqa / kv_b_proj (" + a.model_type +
            "): a TP rank would not hold the heads its o_proj columns need; use tp=1");
  // ColwiseParallel / RowwiseParallel chunk rows / columns without regard to
  // heads: a TP rank must still hold whole heads.
  for (const auto& t : a.tensors) {
    const int d = TpDim(t.role);
    if (tp == 1 || d < 0 || t.head_dim == 0) continue;
    const int64_t heads = t.shape[d] / t.head_dim;
    if (heads % tp == 0) continue;
    const bool kv = t.role == Role::k || t.role == Role::v || t.role == Role::k_bias || t.role == Role::v_bias;
    FailTp(s, "tp (" + S(tp) + ") would cut an attention head: NeMo RL's TP plan shards " + t.name + " dim " + S(d) +
                (d == 0 ? " (ColwiseParallel)" : " (RowwiseParallel)") + ", " + S(heads) + " heads of " +
                S(t.head_dim) + " (" + (kv ? "num_key_value_heads" : "num_attention_heads") + " " + S(heads) +
                "), which tp does not divide");
  }
  // FSDP2 shards a dim other than 0 only evenly.
  if (s.experts_dim == 1 && shard > 1)
    for (const auto& t : a.tensors) {
      if (t.role != Role::expert_gate && t.role != Role::expert_down) continue;
      const int64_t len = t.role == Role::expert_gate ? 2 * t.shape[0] : t.shape[0];
      if (len % shard != 0)
        Fail(s, "FSDP2 refuses uneven sharding on a dim other than 0 (torch/distributed/fsdp/_fully_shard/"
                "_fsdp_param.py _init_sharded_param: \"FSDP does not support uneven sharding on dim 1\"): " +
                    FusedExpertName(t) + " dim 1 is " + S(len) + ", dp_shard " + S(shard));
    }

  const int64_t ranks = rep * shard * tp;
  Builder b;
  if (ranks == 1) b.AddMesh("fsdp", {{"dp_shard", 1}});
  else b.AddMesh("fsdp", {{"dp_replicate", rep}, {"dp_shard", shard}, {"tp", tp}});
  if (fp32) b.SetDtype("fp32");

  std::vector<std::string> uneven, empty;  // for the notes, one item per parameter
  std::set<std::string> noted;
  // What a dp_shard cut of `len` (per TP piece: `pieces`, each holding `len`
  // or less) leaves: uneven chunks, empty shards and on how many ranks.
  auto note_cut = [&](const std::string& name, const std::string& what, const std::vector<int64_t>& pieces,
                      int64_t copies) {
    if (shard == 1 || !noted.insert(name).second) return;
    bool is_uneven = false;
    int64_t empty_ranks = 0;
    for (int64_t len : pieces) {
      for (int64_t p = 0; p < shard; ++p) {
        is_uneven |= ChunkSize(len, shard, p) != ChunkSize(len, shard, 0);
        empty_ranks += ChunkSize(len, shard, p) == 0 ? copies : 0;
      }
    }
    const std::string per_piece = pieces.size() > 1 ? " per TP piece" : "";
    if (is_uneven) uneven.push_back(name + " " + S(pieces[0]) + " " + what + per_piece + " -> " + Sizes(pieces[0], shard));
    if (empty_ranks > 0)
      empty.push_back(name + " (" + S(pieces[0]) + " " + what + per_piece + " over " + S(shard) + "): " +
                      S(empty_ranks) + " of " + S(ranks) + " ranks");
  };

  for (const auto& t : a.tensors) {
    std::vector<std::pair<std::string, ordered_json>> axes;
    ordered_json extra = ordered_json::object();
    const int td = tp > 1 ? TpDim(t.role) : -1;
    if (td >= 0) axes.push_back({"tp", Chunk(td)});
    // The TP pieces of the dim FSDP2 chunks (dim 0), and how many ranks hold each.
    std::vector<int64_t> pieces{t.shape[0]};
    if (td == 0) {
      pieces.clear();
      for (int64_t i = 0; i < tp; ++i) pieces.push_back(ChunkSize(t.shape[0], tp, i));
    }
    const int64_t copies = rep * (td == 0 ? 1 : tp);
    // Qwen3-Next's split parts: whole here, their fused buffer is chunked (below).
    const bool part = InCheckpointFusion(a, t);
    if (t.role == Role::router_bias || part) {
      // A module buffer (nn.Buffer): fully_shard leaves it whole on every rank.
    } else if (IsExpert(t.role)) {
      if (s.experts_dim == 0) {
        axes.push_back({"dp_shard", Chunk("expert")});
        note_cut(FusedExpertName(t), "experts", {a.experts}, rep * tp);
      } else if (t.role == Role::expert_down) {
        axes.push_back({"dp_shard", Chunk(0)});  // down_proj's dim 1 is each expert's dim 0
      }
      // gate_up_proj's dim 1 holds gate and up rows: its buffer rule cuts the fused dim.
    } else {
      axes.push_back({"dp_shard", Chunk(0)});
      note_cut(LiveName(t.name), t.shape.size() == 1 ? "entries" : "rows", pieces, copies);
      if (td >= 0 && shard > 1) extra["order"] = {"tp", "dp_shard"};
      // FSDP2 chunks rows without regard to heads: say the cut is intended
      // where a chunk boundary falls inside a head (TP cuts whole heads).
      if (t.head_dim > 0 && t.role != Role::o && t.role != Role::lin_out && shard > 1) {
        bool cuts = false;
        for (int64_t len : pieces)
          for (int64_t p = 1, at = 0; p < shard; ++p)
            if ((at += ChunkSize(len, shard, p - 1)) < len && at % t.head_dim != 0) cuts = true;
        if (cuts) extra["split_heads"] = true;
      }
    }
    if (part && shard > 1) extra["split_heads"] = true;  // chunks of the fused rows cut where they fall
    b.Place(t, "fsdp", axes, extra);
    // Qwen3-Next: the fused parameters, each chunked as a whole over dp_shard.
    if (part) {
      ordered_json rule = CheckpointFusion(a, t);
      if (rule.is_null()) continue;  // the other parts are in their first part's rule
      int64_t rows = 0;
      for (const auto& n : rule["parts"])
        for (const auto& u : a.tensors)
          if (u.name == n.get<std::string>()) rows += u.shape[0];
      note_cut(rule["name"].get<std::string>(), "rows", {rows}, rep);
      if (shard > 1) rule["shard"] = {{"axis", "dp_shard"}, {"split", "chunk"}};
      b.Buffer(rule);
      continue;
    }
    // Buffers: HF names (default_buffers) but the fused experts and Mixtral's renamed block.
    if (t.role == Role::expert_gate) {
      ordered_json rule = {{"name", FusedExpertName(t)}, {"parts", {t.name, Find(a, Role::expert_up)->name}},
                           {"concat", 0}};
      if (s.experts_dim == 1 && shard > 1) rule["shard"] = {{"axis", "dp_shard"}, {"split", "chunk"}};
      b.Buffer(rule);
    } else if (t.role == Role::expert_down) {
      b.Buffer({{"name", FusedExpertName(t)}, {"parts", {t.name}}});
    } else if (t.role != Role::expert_up && LiveName(t.name) != t.name) {
      b.Buffer({{"name", LiveName(t.name)}, {"parts", {t.name}}});
    }
  }

  // What was written.
  std::string mesh;
  for (auto [n, v] : std::vector<std::pair<std::string, int64_t>>{{"dp_replicate", rep}, {"dp_shard", shard}, {"tp", tp}})
    if (v > 1 || n == "dp_shard") mesh += (mesh.empty() ? "" : ", ") + n + " " + S(v);
  notes.push_back(s.option + ": FSDP2 fully_shard over the DeviceMesh (" + mesh + ")" +
                  (rep > 1 || tp > 1 ? ", row-major, tp fastest" : "") + ": " + S(ranks) +
                  " ranks; every parameter Shard(0) over dp_shard in torch.chunk sizes" +
                  (rep > 1 ? ", whole on each dp_replicate group (HSDP)" : "") +
                  (Find(a, Role::router_bias) ? "; the router's e_score_correction_bias is a module buffer, whole "
                                                "on every rank"
                                              : ""));
  if (tp > 1)
    notes.push_back(s.option + ": tp " + S(tp) + " follows NeMo RL's TP plan (nemo_rl/models/dtensor/parallelize.py): "
                    "ColwiseParallel q_proj, k_proj, v_proj, gate_proj, up_proj, lm_head (Shard(0) on tp, q/k/v "
                    "biases with their weights), RowwiseParallel o_proj, down_proj (Shard(1) on tp), embed_tokens "
                    "Shard(0) of the vocabulary on tp; norms, routers" + std::string(moe ? ", experts" : "") +
                    " and the rest replicated on tp; fully_shard then chunks each TP-local piece over dp_shard "
                    "(_StridedShard: \"order\": [\"tp\", \"dp_shard\"])" +
                    std::string(Find(a, Role::q_norm) ? ". Keep q_norm/k_norm the same on every TP rank "
                                                        "(SequenceParallel on tp, as NeMo RL's Qwen3 QK norms): "
                                                        "plain modules train a copy per TP rank, which drift "
                                                        "apart, and the refit sends one of them"
                                                      : ""));
  if (moe) {
    const ArchTensor* g = Find(a, Role::expert_gate);
    const ArchTensor* d = Find(a, Role::expert_down);
    notes.push_back(s.option + ": transformers 5 fuses each layer's experts: " + FusedExpertName(*g) + " [" +
                    S(a.experts) + ", 2 x " + S(g->shape[0]) + ", " + S(g->shape[1]) + "] (gate rows then up rows) and " +
                    FusedExpertName(*d) + " [" + S(a.experts) + ", " + S(d->shape[0]) + ", " + S(d->shape[1]) + "], " +
                    (s.experts_dim == 0 ? "Shard(0) over the experts"
                                        : "Shard(1) (experts-dim=1: gate_up_proj's fused rows, down_proj's hidden rows)") +
                    (LiveName(g->name) != g->name ? "; Mixtral's block_sparse_moe is the layer's mlp" : ""));
  }
  if (!uneven.empty())
    notes.push_back(s.option + ": uneven chunks over dp_shard " + S(shard) + " (torch.chunk: the last positions hold less): " +
                    List(uneven));
  if (!empty.empty())
    notes.push_back(s.option + ": empty shards (FSDP2's [0, ...] local shards; zero-size buffers in the plan): " +
                    List(empty));
  std::string fp32_kept;
  for (const auto& t : a.tensors)
    if (t.fp32) fp32_kept += (fp32_kept.empty() ? "" : ", ") + t.name;
  if (fp32)
    notes.push_back(s.option + ": master=fp32: every buffer holds fp32 (the layout's \"dtype\"), FSDP2's masters under "
                    "a bf16 MixedPrecisionPolicy; the model is bf16, so the plan moves bf16 (converted where fp32 is "
                    "held): half the bytes of fp32");
  else
    notes.push_back(s.option + ": master=bf16: the parameters are bf16 (the model cast before fully_shard), buffers "
                    "in the model's dtype" + (fp32_kept.empty() ? "" : "; " + fp32_kept + " stays fp32 as the "
                    "checkpoint stores it"));

  std::string lname = "fsdp2";
  if (rep > 1) lname += "-dp_replicate" + S(rep);
  lname += "-dp_shard" + S(shard);
  if (tp > 1) lname += "-tp" + S(tp);
  if (s.experts_dim == 1) lname += "-experts-dim1";
  lname += "-" + s.master;
  const std::string note = std::string("PyTorch FSDP2 fully_shard") + (rep > 1 ? " (HSDP)" : "") +
                           (tp > 1 ? " over NeMo RL's TP plan" : "") + ", " +
                           (fp32 ? "fp32 masters" : "bf16 parameters") + ", transformers 5 parameter names" +
                           (moe ? " (fused experts)" : "") + "; generated by reshard init";
  return b.Finish(lname, model, ranks, true, note);
}

void Set(Settings& s, const std::string& key, const std::string& value) {
  if (key == "dp_shard") s.dp_shard = PositiveInt(s, key, value);
  else if (key == "dp_replicate") s.dp_replicate = PositiveInt(s, key, value);
  else if (key == "tp") s.tp = PositiveInt(s, key, value);
  else if (key == "master") {
    if (value != "fp32" && value != "bf16")
      Fail(s, "'master' expects fp32 or bf16 (the dtype the sharded parameters hold), got '" + value + "'" +
                  DidYouMeanSameKind(value, {"fp32", "bf16"}));
    s.master = value;
  } else if (key == "experts-dim") {
    if (value != "0" && value != "1")
      Fail(s, "'experts-dim' expects 0 (Shard(0): over the experts) or 1 (Shard(1), TorchTitan's shard_placement_fn), "
              "got '" + value + "'");
    s.experts_dim = value == "1";
  }
}

}  // namespace

const FrameworkDef& Fsdp2Framework() {
  static const FrameworkDef def{
      "fsdp2", "fsdp2:dp_shard=N,...", {"dp_shard", "dp_replicate", "tp", "master", "experts-dim"}, {}, {}, false,
      Set, MakeFsdp2,
  };
  return def;
}

}  // namespace reshard::init
