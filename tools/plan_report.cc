#include "tools/plan_report.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "compiler/program.h"
#include "runtime/error.h"

namespace reshard::report {

std::string Bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  else if (b >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string SignedBytes(int64_t b) {
  if (b == 0) return "0 B";
  uint64_t mag = b < 0 ? static_cast<uint64_t>(-(b + 1)) + 1 : static_cast<uint64_t>(b);
  std::string s(1, b < 0 ? '-' : '+');
  s += Bytes(mag);
  return s;
}

std::string Percent(uint64_t a, uint64_t b) {
  if (a == 0) return b == 0 ? "0%" : "new";
  char buf[32];
  double pct = (static_cast<double>(b) - static_cast<double>(a)) * 100.0 / static_cast<double>(a);
  std::snprintf(buf, sizeof buf, "%+.1f%%", pct);
  return buf;
}

std::string Cute(const std::vector<uint64_t>& shape, const std::vector<uint64_t>& stride) {
  // Appended piecewise: GCC 12 warns (-Wrestrict, falsely) on `(k ? "," : "") + std::to_string(x)`.
  std::string s = "(";
  for (size_t k = 0; k < shape.size(); ++k) {
    if (k) s += ',';
    s += std::to_string(shape[k]);
  }
  s += "):(";
  for (size_t k = 0; k < stride.size(); ++k) {
    if (k) s += ',';
    s += std::to_string(stride[k]);
  }
  s += ')';
  return s;
}

std::string RegionText(const fb::Program& p, const fb::Region& r) {
  std::string s;
  if (r.buffer() == kNone) {
    s = "staging";
  } else if (p.buffers() && r.buffer() < p.buffers()->size() && p.buffers()->Get(r.buffer())->name()) {
    s += '\'';
    s += p.buffers()->Get(r.buffer())->name()->str();
    s += '\'';
  } else {
    s = "buffer ";
    s += std::to_string(r.buffer());
  }
  s += " @";
  s += std::to_string(r.offset());
  s += ' ';
  s += FormatRegion(r);
  return s;
}

std::string StepText(const fb::Program& p, const fb::Step& s) {
  bool comm = s.kind() == fb::StepKind::send || s.kind() == fb::StepKind::recv || s.kind() == fb::StepKind::forward;
  std::string line = StepKindName(s.kind());
  line += ' ';
  line += Bytes(s.bytes());
  line += ' ';
  line += DtypeName(s.wire());
  if (comm) {
    line += s.kind() == fb::StepKind::recv ? " from " : " to ";
    line += std::to_string(s.peer());
    line += " over ";
    line += ChannelName(s.channel());
  }
  auto region = [&](uint32_t idx) {
    return p.regions() && idx < p.regions()->size() ? RegionText(p, *p.regions()->Get(idx))
                                                    : "region " + std::to_string(idx);
  };
  if (s.src() != kNone) line += " from " + region(s.src());
  else if (s.kind() != fb::StepKind::recv) line += " from staging @" + std::to_string(s.staging());
  if (s.dst() != kNone) line += " into " + region(s.dst());
  else if (s.kind() != fb::StepKind::send && s.kind() != fb::StepKind::forward)
    line += " into staging @" + std::to_string(s.staging());
  if (s.dep() != kNone) line += " after step " + std::to_string(s.dep());
  // A quant op (kept sorted by step) turns the step into a block-scaled conversion.
  const uint32_t index = p.steps() ? static_cast<uint32_t>(&s - p.steps()->Get(0)) : 0;
  if (p.quant_ops() != nullptr) {
    for (const fb::QuantOp* op : *p.quant_ops()) {
      if (op->step() != index) continue;
      const std::string blocks = std::to_string(op->block()->Get(0)) + "x" + std::to_string(op->block()->Get(1));
      std::string origin = "(";  // appended piecewise (GCC 12 -Wrestrict, see above)
      origin += std::to_string(op->origin()->Get(0));
      origin += ",";
      origin += std::to_string(op->origin()->Get(1));
      origin += ")";
      if (op->kind() == fb::QuantKind::amax) {
        line += ", block amaxes over blocks of " + blocks + " from " + origin;
        continue;
      }
      if (op->kind() == fb::QuantKind::scale_from_amax) {
        line += ", " + std::string(DtypeName(op->scale_dtype())) + " scales of the largest amaxes (blocks of " +
                blocks + ")";
        continue;
      }
      if (op->kind() == fb::QuantKind::quantize_scaled) {
        line += ", quantizing over blocks of " + blocks + " from " + origin + " with the scales " + region(op->scale());
        continue;
      }
      const bool q = op->kind() == fb::QuantKind::quantize;
      line += q ? ", quantizing" : ", dequantizing";
      line += " over blocks of " + std::to_string(op->block()->Get(0)) + "x" + std::to_string(op->block()->Get(1));
      if (q) line += " from (" + std::to_string(op->origin()->Get(0)) + "," + std::to_string(op->origin()->Get(1)) + ")";
      line += q ? ", scales " : ", scales from ";
      line += DtypeName(op->scale_dtype());
      line += q ? " into " : " ";
      line += region(op->scale());
    }
  }
  return line;
}

std::string RankRanges(const std::vector<uint32_t>& r) {
  std::string s;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(r[i]);
    if (j > i) {
      s += '-';
      s += std::to_string(r[j]);
    }
    i = j + 1;
  }
  return s;
}

uint64_t TensorElements(const fb::Tensor& t) {
  uint64_t n = 1;
  for (uint32_t d = 0; t.lo() && t.hi() && d < t.lo()->size() && d < t.hi()->size(); ++d)
    n *= t.hi()->Get(d) - t.lo()->Get(d);
  return n;
}

std::string TensorLayout(const fb::Tensor& t) {
  std::vector<uint64_t> shape, stride;
  for (uint32_t d = 0; t.lo() && t.hi() && d < t.lo()->size() && d < t.hi()->size(); ++d)
    shape.push_back(t.hi()->Get(d) - t.lo()->Get(d));
  stride.resize(shape.size());
  uint64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    stride[d] = s;
    s *= shape[d];
  }
  return Cute(shape, stride);
}

const char* StrategyName(fb::Strategy s) { return s == fb::Strategy::gather ? "gather" : "direct"; }
const char* ChannelName(fb::Channel c) { return c == fb::Channel::nvlink ? "nvlink" : "net"; }

std::string RoundFillText(bool proportional, double min_share, double staging_fill, double split_share,
                          double nic_reserve, uint32_t stripe_mib) {
  std::string how = !proportional ? "greedily"
                    : min_share > 0
                        ? "with every pair's proportional share, at least " +
                              std::to_string(static_cast<int>(min_share * 100 + 0.5)) + "% of a round's"
                        : "with every pair's proportional share";
  if (split_share == 0) {
    how += ", pieces split down to 4 MiB";
  } else if (split_share > 0) {
    char s[64];
    std::snprintf(s, sizeof s, ", pieces split down to %.3g%% of a round's share", split_share * 100);
    how += s;
  }
  if (nic_reserve > 0) {
    char s[96];
    std::snprintf(s, sizeof s, ", staging kept for NIC intake (%.3gx a GPU's NIC bytes left per round)", nic_reserve);
    how += s;
  }
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.0f%%", staging_fill * 100);
  std::string stripes;
  if (stripe_mib != kStripeMiB) stripes = ", regions entering a domain in stripes of " + std::to_string(stripe_mib) + " MiB";
  if (stripe_mib < kStripeMiB)  // the finer routing (compiler/route.cc): quantized pieces cut finer too
    stripes += " and quantized tensors in pieces of at most 1/" + std::to_string(kQuantPiecesPerArena) +
               " of a round's staging";
  return "rounds filled " + how + ", planned for " + pct + " of the staging budget" + stripes;
}

std::string Side(const fb::Program& p) {
  std::string s;
  if (p.src_rank() >= 0) s += "train " + std::to_string(p.src_rank());
  if (p.dst_rank() >= 0) s += std::string(s.empty() ? "" : " + ") + "infer " + std::to_string(p.dst_rank());
  return s.empty() ? "-" : s;
}


uint32_t DomainOf(const fb::Plan& root, uint32_t r) {
  return root.domain() && r < root.domain()->size() ? root.domain()->Get(r) : 0;
}

namespace {

// Finds which tensor a buffer element belongs to by solving the fragment's
// affine map backwards. Fragments are boxes laid out without overlap, so a
// greedy split of the element offset over the dims, largest stride first,
// recovers the coordinate when there is one.
class TensorLocator {
 public:
  explicit TensorLocator(const fb::Program& p) : p_(p) {
    if (!p.fragments()) return;
    for (uint32_t i = 0; i < p.fragments()->size(); ++i) {
      const fb::Fragment* f = p.fragments()->Get(i);
      if (f->buffer_dims() != 0) multi_.push_back(i);
      else by_buffer_[f->buffer()].push_back(i);
    }
  }

  /// The tensor holding element `offset` of buffer `buffer`, or kNone.
  uint32_t Find(uint32_t buffer, uint64_t offset) const {
    auto it = by_buffer_.find(buffer);
    if (it != by_buffer_.end())
      for (uint32_t i : it->second)
        if (Holds(*p_.fragments()->Get(i), buffer, offset)) return p_.fragments()->Get(i)->tensor();
    for (uint32_t i : multi_)
      if (Holds(*p_.fragments()->Get(i), buffer, offset)) return p_.fragments()->Get(i)->tensor();
    return kNone;
  }

 private:
  static bool Solve(const fb::Fragment& f, uint64_t delta, bool buffer_side) {
    int ndim = std::min<int>(f.ndim(), 6);
    std::vector<int> order;
    for (int d = 0; d < ndim; ++d) {
      bool is_buffer = (f.buffer_dims() >> d) & 1;
      if (is_buffer == buffer_side && f.hi()->Get(d) > f.lo()->Get(d) + 1 && f.stride()->Get(d) > 0) order.push_back(d);
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return f.stride()->Get(a) > f.stride()->Get(b); });
    for (int d : order) {
      uint64_t st = f.stride()->Get(d), extent = f.hi()->Get(d) - f.lo()->Get(d);
      uint64_t c = delta / st;
      if (c >= extent) return false;
      delta -= c * st;
    }
    return delta == 0;
  }

  static bool Holds(const fb::Fragment& f, uint32_t buffer, uint64_t offset) {
    if (buffer < f.buffer() || offset < f.offset()) return false;
    return Solve(f, buffer - f.buffer(), true) && Solve(f, offset - f.offset(), false);
  }

  const fb::Program& p_;
  std::unordered_map<uint32_t, std::vector<uint32_t>> by_buffer_;
  std::vector<uint32_t> multi_;
};

}  // namespace

PlanStats Collect(const Plan& plan, bool tensors) {
  const fb::Plan& root = plan.root();
  PlanStats st;
  st.ranks = plan.num_ranks();
  st.rank.resize(st.ranks);
  if (tensors) st.tensors.resize(root.tensors() ? root.tensors()->size() : 0);
  for (uint32_t r = 0; r < st.ranks; ++r) {
    const fb::Program& p = plan.program(r);
    RankStats& t = st.rank[r];
    t.staging = p.staging_bytes();
    st.max_staging = std::max(st.max_staging, t.staging);
    t.steps = p.steps() ? p.steps()->size() : 0;
    uint32_t nrounds = p.round_begin() && p.round_begin()->size() > 0 ? p.round_begin()->size() - 1 : 0;
    t.rounds = nrounds;
    if (st.rounds.size() < nrounds) st.rounds.resize(nrounds, {0, 0, 0});
    std::unique_ptr<TensorLocator> locate;
    std::unordered_map<uint32_t, uint32_t> region_tensor;  // region index -> tensor (cached)
    if (tensors) locate = std::make_unique<TensorLocator>(p);
    // Attributes `bytes` moved through buffer region `idx` to its tensor.
    auto attribute = [&](uint32_t idx, uint64_t bytes, bool read, bool direct) {
      if (!tensors || idx == kNone) return;
      const fb::Region* rg = p.regions()->Get(idx);
      if (rg->buffer() == kNone) return;
      auto [it, fresh] = region_tensor.try_emplace(idx, kNone);
      if (fresh) it->second = locate->Find(rg->buffer(), rg->offset());
      if (it->second == kNone || it->second >= st.tensors.size()) {
        st.unattributed_bytes += bytes;
        return;
      }
      TensorStats& ts = st.tensors[it->second];
      if (read) ts.read[r] += bytes, ts.read_bytes += bytes;
      else ts.written[r] += bytes, ts.written_bytes += bytes;
      if (direct) ts.direct_bytes += bytes;
    };
    for (uint32_t rd = 0; rd < nrounds; ++rd) {
      for (uint32_t i = p.round_begin()->Get(rd); i < p.round_begin()->Get(rd + 1); ++i) {
        const fb::Step* s = p.steps()->Get(i);
        int ch = s->channel() == fb::Channel::nvlink ? 1 : 0;
        switch (s->kind()) {
          case fb::StepKind::send:
          case fb::StepKind::forward:
            t.sent[ch] += s->bytes();
            ++t.messages_out;
            st.bytes[ch] += s->bytes();
            ++st.messages[ch];
            st.rounds[rd][ch] += s->bytes();
            ++st.rounds[rd][2];
            st.flows[FlowKey(r, s->peer(), ch)] += s->bytes();
            if (s->kind() == fb::StepKind::send) attribute(s->src(), s->bytes(), true, true);
            break;
          case fb::StepKind::recv:
            t.received[ch] += s->bytes();
            ++t.messages_in;
            attribute(s->dst(), s->bytes(), false, false);
            break;
          case fb::StepKind::pack:
            ++t.packs;
            attribute(s->src(), s->bytes(), true, false);
            break;
          case fb::StepKind::unpack:
            ++t.unpacks;
            attribute(s->dst(), s->bytes(), false, false);
            break;
          case fb::StepKind::copy:
            ++t.copies;
            attribute(s->src(), s->bytes(), true, false);
            attribute(s->dst(), s->bytes(), false, false);
            break;
        }
      }
    }
  }
  return st;
}

}  // namespace reshard::report
