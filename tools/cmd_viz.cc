// reshard viz: pictures of a plan's traffic. The output's extension picks the
// form: .html a self-contained report (inline SVG and CSS, no network), .svg the
// rank-to-rank heatmap alone, .dot a Graphviz graph with NVLink domains as
// clusters. Plans of 512 global ranks and more are drawn per NVLink domain.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "compiler/write_file.h"
#include "runtime/error.h"
#include "runtime/plan.h"
#include "tools/commands.h"
#include "tools/plan_report.h"

namespace reshard::cli {
namespace {

using report::Bytes;

constexpr uint32_t kAggregateFrom = 512;  // global ranks from which units are NVLink domains

std::string Xml(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// A DOT double-quoted string's content.
std::string DotText(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// An sRGB colour "#rrggbb" from hue (degrees), saturation and lightness in [0,1].
std::string Hsl(double h, double s, double l) {
  double c = (1 - std::fabs(2 * l - 1)) * s, hp = std::fmod(h, 360.0) / 60.0;
  double x = c * (1 - std::fabs(std::fmod(hp, 2.0) - 1)), m = l - c / 2;
  double rgb[3] = {0, 0, 0};
  int sector = static_cast<int>(hp);
  const int idx[6][2] = {{0, 1}, {1, 0}, {1, 2}, {2, 1}, {2, 0}, {0, 2}};  // which gets c, which x
  rgb[idx[sector % 6][0]] = c;
  rgb[idx[sector % 6][1]] = x;
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(std::lround((rgb[0] + m) * 255)),
                static_cast<int>(std::lround((rgb[1] + m) * 255)), static_cast<int>(std::lround((rgb[2] + m) * 255)));
  return buf;
}

constexpr double kNetHue = 214, kNvlinkHue = 28, kMixedHue = 285;
const char* kNetColour = "#2f6fb3";
const char* kNvlinkColour = "#e07b24";
const char* kEmptyColour = "#f1f3f5";

// A cell's colour: hue by channel (net blue, nvlink orange, both purple),
// darker with more bytes on a log scale relative to the largest cell.
std::string CellColour(uint64_t net, uint64_t nvl, uint64_t max) {
  double t = std::log1p(static_cast<double>(net + nvl)) / std::log1p(static_cast<double>(std::max<uint64_t>(max, 1)));
  double hue = net && nvl ? kMixedHue : nvl ? kNvlinkHue : kNetHue;
  return Hsl(hue, 0.72, 0.88 - 0.56 * std::min(1.0, t));
}

// What the pictures show: units (ranks, or NVLink domains for large plans) and
// the bytes between them.
struct View {
  bool by_domain = false;
  uint32_t n = 0;                      // units
  std::vector<std::string> label;      // short: "r12", "d3"
  std::vector<std::string> detail;     // "rank 12, train 4, domain 1" / "domain 3: ranks 24-31"
  std::vector<std::vector<uint32_t>> members;  // global ranks of each unit
  std::vector<uint64_t> net, nvl;      // n*n, sender-major
  uint64_t max_cell = 0;
  std::vector<uint32_t> unit_of;       // global rank -> unit
  std::vector<uint32_t> domain_of_unit;
};

View MakeView(const Plan& plan, const report::PlanStats& st, bool by_domain) {
  const fb::Plan& root = plan.root();
  View v;
  v.by_domain = by_domain;
  v.unit_of.resize(st.ranks);
  if (by_domain) {
    uint32_t nd = 0;
    for (uint32_t r = 0; r < st.ranks; ++r) nd = std::max(nd, report::DomainOf(root, r) + 1);
    v.n = nd;
    v.members.resize(nd);
    for (uint32_t r = 0; r < st.ranks; ++r) {
      v.unit_of[r] = report::DomainOf(root, r);
      v.members[v.unit_of[r]].push_back(r);
    }
    for (uint32_t d = 0; d < nd; ++d) {
      v.label.push_back("d" + std::to_string(d));
      v.detail.push_back("NVLink domain " + std::to_string(d) + ": ranks " + report::RankRanges(v.members[d]));
      v.domain_of_unit.push_back(d);
    }
  } else {
    v.n = st.ranks;
    v.members.resize(st.ranks);
    for (uint32_t r = 0; r < st.ranks; ++r) {
      v.unit_of[r] = r;
      v.members[r] = {r};
      v.label.push_back("r" + std::to_string(r));
      v.detail.push_back("rank " + std::to_string(r) + " (" + report::Side(plan.program(r)) + ", NVLink domain " +
                         std::to_string(report::DomainOf(root, r)) + ")");
      v.domain_of_unit.push_back(report::DomainOf(root, r));
    }
  }
  v.net.assign(static_cast<size_t>(v.n) * v.n, 0);
  v.nvl.assign(static_cast<size_t>(v.n) * v.n, 0);
  for (auto& [k, bytes] : st.flows) {
    uint32_t from = report::FlowFrom(k), to = report::FlowTo(k);
    if (from >= st.ranks || to >= st.ranks) continue;
    size_t cell = static_cast<size_t>(v.unit_of[from]) * v.n + v.unit_of[to];
    (report::FlowChannel(k) ? v.nvl : v.net)[cell] += bytes;
  }
  for (size_t i = 0; i < v.net.size(); ++i) v.max_cell = std::max(v.max_cell, v.net[i] + v.nvl[i]);
  return v;
}

// The heatmap: one <rect> per (sender, receiver) unit pair inside <g id="cells">,
// with data-net / data-nvlink bytes and a tooltip on the non-empty ones.
std::string HeatmapSvg(const View& v, const std::string& title, bool standalone) {
  const double cell = std::clamp(720.0 / std::max<uint32_t>(v.n, 1), 2.0, 28.0);
  const double left = 64, top = 70, side = cell * v.n;
  const double width = std::max(left + side + 24, 560.0), height = top + side + 70;
  std::string s;
  s.reserve(static_cast<size_t>(v.n) * v.n * 56 + 4096);
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"heatmap\" width=\"" + Num(width) + "\" height=\"" +
       Num(height) + "\" viewBox=\"0 0 " + Num(width) + " " + Num(height) + "\" font-family=\"sans-serif\">\n";
  if (standalone) s += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  s += "<text x=\"" + Num(left) + "\" y=\"20\" font-size=\"14\" font-weight=\"bold\">" + Xml(title) + "</text>\n";
  s += "<text x=\"" + Num(left) + "\" y=\"36\" font-size=\"11\" fill=\"#444\">rows: sender, columns: receiver (" +
       std::string(v.by_domain ? "NVLink domains" : "global ranks") + ")</text>\n";
  s += "<text x=\"" + Num(left) + "\" y=\"50\" font-size=\"11\" fill=\"#444\">net blue, NVLink orange, both purple; "
       "darker = more bytes (log scale)</text>\n";
  // Axis labels: every unit when they fit, otherwise every k-th.
  uint32_t every = std::max<uint32_t>(1, static_cast<uint32_t>(std::ceil(11.0 / cell)));
  s += "<g font-size=\"" + Num(std::min(10.0, std::max(7.0, cell * 0.8))) + "\" fill=\"#333\">\n";
  // Column labels are side by side, so they need room for a whole label.
  uint32_t col_every = std::max<uint32_t>(every, static_cast<uint32_t>(std::ceil(30.0 / cell)));
  for (uint32_t u = 0; u < v.n; u += every)
    s += "<text x=\"" + Num(left - 4) + "\" y=\"" + Num(top + (u + 0.5) * cell + 3) + "\" text-anchor=\"end\">" +
         Xml(v.label[u]) + "</text>\n";
  for (uint32_t u = 0; u < v.n; u += col_every)
    s += "<text x=\"" + Num(left + (u + 0.5) * cell) + "\" y=\"" + Num(top - 4) + "\" text-anchor=\"middle\">" +
         Xml(v.label[u]) + "</text>\n";
  s += "</g>\n<g id=\"cells\" fill=\"" + std::string(kEmptyColour) + "\">\n";
  const std::string w = Num(cell);
  for (uint32_t i = 0; i < v.n; ++i) {
    for (uint32_t j = 0; j < v.n; ++j) {
      size_t k = static_cast<size_t>(i) * v.n + j;
      s += "<rect x=\"" + Num(left + j * cell) + "\" y=\"" + Num(top + i * cell) + "\" width=\"" + w +
           "\" height=\"" + w + "\"";
      if (v.net[k] + v.nvl[k] == 0) {
        s += "/>";
      } else {
        s += " fill=\"" + CellColour(v.net[k], v.nvl[k], v.max_cell) + "\" data-net=\"" + std::to_string(v.net[k]) +
             "\" data-nvlink=\"" + std::to_string(v.nvl[k]) + "\"><title>" + Xml(v.label[i]) + " to " +
             Xml(v.label[j]) + ": net " + Bytes(v.net[k]) + ", nvlink " + Bytes(v.nvl[k]) + "</title></rect>";
      }
    }
    s += '\n';
  }
  s += "</g>\n";
  // Thin lines between NVLink domains when drawing ranks.
  if (!v.by_domain) {
    s += "<g stroke=\"#888\" stroke-width=\"0.6\">\n";
    for (uint32_t u = 1; u < v.n; ++u) {
      if (v.domain_of_unit[u] == v.domain_of_unit[u - 1]) continue;
      double p = left + u * cell;
      s += "<line x1=\"" + Num(p) + "\" y1=\"" + Num(top) + "\" x2=\"" + Num(p) + "\" y2=\"" + Num(top + side) +
           "\"/><line x1=\"" + Num(left) + "\" y1=\"" + Num(top + u * cell) + "\" x2=\"" + Num(left + side) +
           "\" y2=\"" + Num(top + u * cell) + "\"/>\n";
    }
    s += "</g>\n";
  }
  // Legend.
  double ly = top + side + 22;
  const std::pair<const char*, double> keys[] = {{"net", kNetHue}, {"NVLink", kNvlinkHue}, {"both", kMixedHue}};
  double lx = left;
  for (auto& [name, hue] : keys) {
    for (int step = 0; step < 5; ++step)
      s += "<rect x=\"" + Num(lx + step * 14) + "\" y=\"" + Num(ly) + "\" width=\"14\" height=\"12\" fill=\"" +
           Hsl(hue, 0.72, 0.88 - 0.56 * step / 4.0) + "\"/>";
    s += "<text x=\"" + Num(lx + 76) + "\" y=\"" + Num(ly + 10) + "\" font-size=\"11\">" + name + "</text>\n";
    lx += 150;
  }
  s += "<text x=\"" + Num(left) + "\" y=\"" + Num(ly + 32) +
       "\" font-size=\"11\" fill=\"#444\">light to dark: 1 B to " + Xml(Bytes(v.max_cell)) + " per cell</text>\n";
  s += "</svg>\n";
  return s;
}

// Mirrored columns: `up` above the axis, `down` below, one column per unit.
std::string ColumnsSvg(const std::string& id, const std::vector<std::string>& labels,
                       const std::vector<std::string>& detail, const std::vector<uint64_t>& up,
                       const std::vector<uint64_t>& down, const std::string& up_name, const std::string& down_name,
                       const std::string& colour) {
  size_t n = labels.size();
  uint64_t max = 1;
  for (size_t i = 0; i < n; ++i) max = std::max({max, up[i], down[i]});
  const double col = std::clamp(900.0 / std::max<size_t>(n, 1), 2.0, 24.0), left = 96, half = 80, top = 16;
  const double width = left + col * n + 20, height = top + 2 * half + 40, axis = top + half;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"" + id + "\" width=\"" + Num(width) +
                  "\" height=\"" + Num(height) + "\" font-family=\"sans-serif\" font-size=\"10\">\n";
  s += "<text x=\"4\" y=\"" + Num(top + 10) + "\">" + Xml(up_name) + "</text><text x=\"4\" y=\"" +
       Num(axis + half - 4) + "\">" + Xml(down_name) + "</text>\n";
  bool any = false;
  for (size_t i = 0; i < n; ++i) any = any || up[i] || down[i];
  s += "<text x=\"4\" y=\"" + Num(axis + 4) + "\" fill=\"#666\">" + (any ? "max " + Xml(Bytes(max)) : "no traffic") +
       "</text>\n";
  s += "<line x1=\"" + Num(left) + "\" y1=\"" + Num(axis) + "\" x2=\"" + Num(left + col * n) + "\" y2=\"" +
       Num(axis) + "\" stroke=\"#999\"/>\n<g fill=\"" + colour + "\">\n";
  for (size_t i = 0; i < n; ++i) {
    double x = left + i * col, w = std::max(1.0, col - (col > 4 ? 1 : 0));
    double hu = half * static_cast<double>(up[i]) / max, hd = half * static_cast<double>(down[i]) / max;
    if (up[i])
      s += "<rect x=\"" + Num(x) + "\" y=\"" + Num(axis - hu) + "\" width=\"" + Num(w) + "\" height=\"" + Num(hu) +
           "\"><title>" + Xml(detail[i]) + ": " + Xml(up_name) + " " + Bytes(up[i]) + "</title></rect>";
    if (down[i])
      s += "<rect x=\"" + Num(x) + "\" y=\"" + Num(axis) + "\" width=\"" + Num(w) + "\" height=\"" + Num(hd) +
           "\" opacity=\"0.6\"><title>" + Xml(detail[i]) + ": " + Xml(down_name) + " " + Bytes(down[i]) +
           "</title></rect>";
    if (up[i] || down[i]) s += '\n';
  }
  s += "</g>\n";
  uint32_t every = std::max<uint32_t>(1, static_cast<uint32_t>(std::ceil(26.0 / col)));
  for (size_t i = 0; i < n; i += every)
    s += "<text x=\"" + Num(left + (i + 0.5) * col) + "\" y=\"" + Num(height - 6) + "\" text-anchor=\"middle\">" +
         Xml(labels[i]) + "</text>";
  s += "\n</svg>\n";
  return s;
}

std::string RoundsSvg(const report::PlanStats& st) {
  size_t n = st.rounds.size();
  uint64_t max = 1;
  for (auto& r : st.rounds) max = std::max(max, r[0] + r[1]);
  const double col = std::clamp(900.0 / std::max<size_t>(n, 1), 2.0, 28.0), left = 96, h = 140, top = 16;
  const double width = left + col * n + 20, height = top + h + 30;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"rounds\" width=\"" + Num(width) + "\" height=\"" +
                  Num(height) + "\" font-family=\"sans-serif\" font-size=\"10\">\n";
  s += "<text x=\"4\" y=\"" + Num(top + 10) + "\">" + Xml(Bytes(max)) + "</text>\n";
  for (size_t i = 0; i < n; ++i) {
    double x = left + i * col, w = std::max(1.0, col - (col > 4 ? 1 : 0));
    double hn = h * static_cast<double>(st.rounds[i][0]) / max, hv = h * static_cast<double>(st.rounds[i][1]) / max;
    std::string tip = "<title>round " + std::to_string(i) + ": net " + Bytes(st.rounds[i][0]) + ", nvlink " +
                      Bytes(st.rounds[i][1]) + ", " + std::to_string(st.rounds[i][2]) + " messages</title>";
    if (hn > 0)
      s += "<rect x=\"" + Num(x) + "\" y=\"" + Num(top + h - hn) + "\" width=\"" + Num(w) + "\" height=\"" + Num(hn) +
           "\" fill=\"" + kNetColour + "\">" + tip + "</rect>";
    if (hv > 0)
      s += "<rect x=\"" + Num(x) + "\" y=\"" + Num(top + h - hn - hv) + "\" width=\"" + Num(w) + "\" height=\"" +
           Num(hv) + "\" fill=\"" + kNvlinkColour + "\">" + tip + "</rect>";
    s += '\n';
  }
  s += "<line x1=\"" + Num(left) + "\" y1=\"" + Num(top + h) + "\" x2=\"" + Num(left + col * n) + "\" y2=\"" +
       Num(top + h) + "\" stroke=\"#999\"/>\n";
  uint32_t every = std::max<uint32_t>(1, static_cast<uint32_t>(std::ceil(26.0 / col)));
  for (size_t i = 0; i < n; i += every)
    s += "<text x=\"" + Num(left + (i + 0.5) * col) + "\" y=\"" + Num(height - 6) + "\" text-anchor=\"middle\">" +
         std::to_string(i) + "</text>";
  s += "\n</svg>\n";
  return s;
}

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

std::string Html(const Plan& plan, const report::PlanStats& st, const View& v, const std::string& name) {
  const fb::Plan& root = plan.root();
  std::string title = "reshard plan " + name;
  std::string h =
      "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
      "<title>" + Xml(title) + "</title>\n<style>\n"
      "body { font-family: sans-serif; margin: 24px; color: #1d2329; background: #ffffff; }\n"
      "h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; border-bottom: 1px solid #ddd; }\n"
      "table { border-collapse: collapse; font-size: 13px; }\n"
      "td, th { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; }\n"
      "td.n { text-align: right; font-variant-numeric: tabular-nums; }\n"
      ".net { color: " + std::string(kNetColour) + "; } .nvlink { color: " + kNvlinkColour + "; }\n"
      "code { font-size: 12px; }\n.scroll { overflow-x: auto; }\n</style>\n</head>\n<body>\n";
  h += "<h1>" + Xml(title) + "</h1>\n<table class=\"summary\">\n";
  auto row = [&](const std::string& k, const std::string& val) {
    h += "<tr><th>" + Xml(k) + "</th><td>" + Xml(val) + "</td></tr>\n";
  };
  row("model", Str(root.model()));
  row("layouts", Str(root.source_layout()) + " -> " + Str(root.dest_layout()));
  row("cluster", Str(root.cluster()));
  row("strategy", report::StrategyName(root.strategy()));
  row("ranks", std::to_string(st.ranks) + " global (" +
                   std::to_string(root.src_global() ? root.src_global()->size() : 0) + " train, " +
                   std::to_string(root.dst_global() ? root.dst_global()->size() : 0) + " infer)" +
                   (v.by_domain ? ", drawn as " + std::to_string(v.n) + " NVLink domains" : ""));
  row("net", Bytes(st.bytes[0]) + " in " + std::to_string(st.messages[0]) + " messages");
  row("nvlink", Bytes(st.bytes[1]) + " in " + std::to_string(st.messages[1]) + " messages");
  row("rounds", std::to_string(root.num_rounds()) + ", staging limit " + Bytes(root.staging_limit()) +
                    " per rank, largest staging " + Bytes(st.max_staging));
  row("compiler", Str(root.compiler_version()) + ", digest " + Str(root.digest()));
  h += "</table>\n";

  h += "<h2>Rank-to-rank traffic</h2>\n<div class=\"scroll\">\n" +
       HeatmapSvg(v, v.by_domain ? "bytes between NVLink domains" : "bytes between ranks", false) + "</div>\n";

  // Per NIC and per NVLink port: one GPU each when drawing ranks, a domain's sum otherwise.
  std::vector<uint64_t> net_out(v.n), net_in(v.n), nvl_out(v.n), nvl_in(v.n);
  std::vector<uint64_t> busiest(v.n);
  for (uint32_t r = 0; r < st.ranks; ++r) {
    uint32_t u = v.unit_of[r];
    const report::RankStats& t = st.rank[r];
    net_out[u] += t.sent[0], net_in[u] += t.received[0], nvl_out[u] += t.sent[1], nvl_in[u] += t.received[1];
    busiest[u] = std::max(busiest[u], std::max(t.sent[0], t.received[0]));
  }
  std::vector<std::string> detail = v.detail;
  if (v.by_domain)
    for (uint32_t u = 0; u < v.n; ++u) detail[u] += ", busiest NIC " + Bytes(busiest[u]);
  uint32_t top_nic = 0;
  uint64_t top_bytes = 0;
  for (uint32_t r = 0; r < st.ranks; ++r) {
    uint64_t b = std::max(st.rank[r].sent[0], st.rank[r].received[0]);
    if (b > top_bytes) top_bytes = b, top_nic = r;
  }
  h += "<h2>Per-NIC load</h2>\n<p>" +
       Xml(v.by_domain ? "Bytes over the NICs of each NVLink domain (sum of its GPUs' NICs)."
                       : "Bytes over each GPU's NIC.") +
       " Busiest NIC: rank " + std::to_string(top_nic) + ", " + Xml(Bytes(top_bytes)) +
       " in its busier direction.</p>\n<div class=\"scroll\">\n" +
       ColumnsSvg("nic-load", v.label, detail, net_out, net_in, "sent", "received", kNetColour) + "</div>\n";
  h += "<h2>Per-NVLink load</h2>\n<p>" +
       Xml(v.by_domain ? "Bytes forwarded over NVLink inside each domain." : "Bytes over each GPU's NVLink.") +
       "</p>\n<div class=\"scroll\">\n" +
       ColumnsSvg("nvlink-load", v.label, detail, nvl_out, nvl_in, "sent", "received", kNvlinkColour) + "</div>\n";
  h += "<h2>Bytes per round</h2>\n<p><span class=\"net\">net</span> and <span class=\"nvlink\">NVLink</span> "
       "bytes sent in each round.</p>\n<div class=\"scroll\">\n" + RoundsSvg(st) + "</div>\n";

  // Biggest tensors, by bytes delivered into destination buffers.
  std::vector<uint32_t> order;
  for (uint32_t t = 0; t < st.tensors.size(); ++t) order.push_back(t);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return st.tensors[a].written_bytes > st.tensors[b].written_bytes; });
  h += "<h2>Biggest tensors</h2>\n<table id=\"tensors\">\n<tr><th>tensor</th><th>logical layout</th><th>dtype</th>"
       "<th>size</th><th>read from sources</th><th>written to destinations</th><th>sent unstaged</th>"
       "<th>source ranks</th><th>destination ranks</th></tr>\n";
  for (size_t i = 0; i < order.size() && i < 20; ++i) {
    const fb::Tensor* t = root.tensors()->Get(order[i]);
    const report::TensorStats& ts = st.tensors[order[i]];
    h += "<tr><td><code>" + Xml(Str(t->name())) + "</code></td><td><code>" + Xml(report::TensorLayout(*t)) +
         "</code></td><td>" + DtypeName(t->dtype()) + "</td><td class=\"n\">" +
         Bytes(report::TensorElements(*t) * DtypeSize(t->dtype())) + "</td><td class=\"n\">" + Bytes(ts.read_bytes) +
         "</td><td class=\"n\">" + Bytes(ts.written_bytes) + "</td><td class=\"n\">" + Bytes(ts.direct_bytes) +
         "</td><td class=\"n\">" + std::to_string(ts.read.size()) + "</td><td class=\"n\">" +
         std::to_string(ts.written.size()) + "</td></tr>\n";
  }
  h += "</table>\n<p>Generated by reshard " RESHARD_VERSION " from " + Xml(name) + ".</p>\n</body>\n</html>\n";
  return h;
}

std::string Dot(const Plan& plan, const View& v, const std::string& name) {
  const fb::Plan& root = plan.root();
  std::string d = "// reshard viz " + name + ": edges weighted by bytes; blue net, orange NVLink\n";
  d += "digraph reshard {\n  graph [rankdir=LR, fontname=\"Helvetica\", label=\"" + DotText(Str(root.model())) + ": " +
       DotText(Str(root.source_layout())) + " -> " + DotText(Str(root.dest_layout())) + " on " +
       DotText(Str(root.cluster())) +
       "\"];\n  node [shape=box, style=filled, fillcolor=\"#f1f3f5\", fontname=\"Helvetica\"];\n"
       "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  if (v.by_domain) {
    for (uint32_t u = 0; u < v.n; ++u)
      d += "  " + v.label[u] + " [label=\"domain " + std::to_string(u) + "\\nranks " +
           report::RankRanges(v.members[u]) + "\"];\n";
  } else {
    std::vector<std::vector<uint32_t>> by_dom;
    for (uint32_t u = 0; u < v.n; ++u) {
      uint32_t dom = v.domain_of_unit[u];
      if (by_dom.size() <= dom) by_dom.resize(dom + 1);
      by_dom[dom].push_back(u);
    }
    for (uint32_t dom = 0; dom < by_dom.size(); ++dom) {
      if (by_dom[dom].empty()) continue;
      d += "  subgraph cluster_d" + std::to_string(dom) + " {\n    label=\"NVLink domain " + std::to_string(dom) +
           "\";\n    style=rounded;\n";
      for (uint32_t u : by_dom[dom])
        d += "    " + v.label[u] + " [label=\"" + v.label[u] + "\\n" + report::Side(plan.program(u)) + "\"];\n";
      d += "  }\n";
    }
  }
  for (uint32_t i = 0; i < v.n; ++i)
    for (uint32_t j = 0; j < v.n; ++j) {
      size_t k = static_cast<size_t>(i) * v.n + j;
      for (int ch = 0; ch < 2; ++ch) {
        uint64_t b = ch ? v.nvl[k] : v.net[k];
        if (!b) continue;
        double t = static_cast<double>(b) / static_cast<double>(v.max_cell);
        d += "  " + v.label[i] + " -> " + v.label[j] + " [color=\"" + (ch ? kNvlinkColour : kNetColour) +
             "\", penwidth=" + Num(0.5 + 5.5 * t) + ", weight=" + std::to_string(1 + std::lround(9 * t)) +
             ", label=\"" + Bytes(b) + "\"];\n";
      }
    }
  d += "}\n";
  return d;
}

std::string Extension(const std::string& path) {
  size_t slash = path.find_last_of('/'), dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string e = path.substr(dot);
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e;
}

}  // namespace

void AddVizCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "viz",
      "Draw a plan's traffic. The output's extension picks the form:\n"
      "  .html  a self-contained report (inline SVG and CSS, works offline): rank-to-rank heatmap\n"
      "         coloured by channel, per-NIC and per-NVLink load, bytes per round, biggest tensors\n"
      "  .svg   the heatmap alone\n"
      "  .dot   Graphviz: NVLink domains as clusters, edges weighted by bytes (dot -Tpdf)\n"
      "Plans of 512 global ranks and more are drawn per NVLink domain (see --by).\n"
      "The file is written whole or not at all.\n"
      "Example:\n"
      "  reshard viz qwen3.rsplan -o qwen3.html && chromium qwen3.html\n"
      "  reshard viz kimi.rsplan -o kimi.dot && dot -Tsvg kimi.dot > kimi-graph.svg");
  struct Opts {
    std::string plan, out, by = "auto";
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("plan", o->plan, "plan file (.rsplan)")->required();
  cmd->add_option("-o,--output", o->out, "file to write: .html, .svg or .dot")->required();
  cmd->add_option("--by", o->by, "units of the pictures: auto (NVLink domains from 512 ranks), rank or domain")
      ->check(OneOf({"auto", "rank", "domain"}));
  cmd->callback([o, &exit_code] {
    const std::string ext = Extension(o->out);
    if (ext != ".html" && ext != ".svg" && ext != ".dot")
      throw Error(o->out + ": unknown output type '" + ext + "', expected .html, .svg or .dot");
    Plan plan = Plan::open(o->plan);
    const report::PlanStats st = report::Collect(plan, ext == ".html");
    bool by_domain = o->by == "domain" || (o->by == "auto" && st.ranks >= kAggregateFrom);
    View v = MakeView(plan, st, by_domain);
    std::string name = o->plan.substr(o->plan.find_last_of('/') + 1);
    std::string text;
    if (ext == ".html") text = Html(plan, st, v, name);
    else if (ext == ".svg")
      text = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" +
             HeatmapSvg(v, "reshard " + name + ": bytes between " + (by_domain ? "NVLink domains" : "ranks"), true);
    else text = Dot(plan, v, name);
    WriteFileAtomic(o->out, text);
    exit_code = 0;
  });
}

}  // namespace reshard::cli
