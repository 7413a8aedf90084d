#include "compiler/spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "runtime/error.h"

namespace reshard {

using nlohmann::json;

size_t DtypeBytes(Dtype d) {
  switch (d) {
    case Dtype::bf16: case Dtype::fp16: return 2;
    case Dtype::fp32: return 4;
    case Dtype::fp8_e4m3: case Dtype::e8m0: return 1;
  }
  return 0;
}

const char* DtypeString(Dtype d) {
  switch (d) {
    case Dtype::bf16: return "bf16";
    case Dtype::fp16: return "fp16";
    case Dtype::fp32: return "fp32";
    case Dtype::fp8_e4m3: return "fp8_e4m3";
    case Dtype::e8m0: return "e8m0";
  }
  return "?";
}

int64_t TensorSpec::elements() const {
  int64_t n = 1;
  for (int d = 0; d < ndim(); ++d) n *= hi[d] - lo[d];
  return n;
}

int ModelSpec::dim_index(const std::string& n) const {
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i].first == n) return static_cast<int>(i);
  return -1;
}

int64_t ModelSpec::total_bytes() const {
  int64_t b = 0;
  for (const auto& t : tensors) b += t.elements() * static_cast<int64_t>(DtypeBytes(t.dtype));
  return b;
}

namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

// "; did you mean 'x'?" when a candidate is close enough, else "".
std::string DidYouMean(const std::string& word, const std::vector<std::string>& candidates, size_t min_edits) {
  std::string best;
  size_t best_d = std::max<size_t>(min_edits, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = EditDistance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// The words of a name that hold a number, in order: what says its kind
// ("dgx-a100" -> a100; "gb200-nvl72" -> gb200, nvl72; "fp8_e4m3" -> fp8, e4m3).
std::vector<std::string> NumberedWords(const std::string& s) {
  std::vector<std::string> out;
  std::string word;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && std::isalnum(static_cast<unsigned char>(s[i]))) {
      word += s[i];
      continue;
    }
    if (std::any_of(word.begin(), word.end(), IsDigit)) out.push_back(word);
    word.clear();
  }
  return out;
}

// `head` begins `s` and does not end inside one of its numbers.
bool Begins(const std::string& head, const std::string& s) {
  return head.size() >= 2 && head.size() < s.size() && s.compare(0, head.size(), head) == 0 &&
         !(IsDigit(head.back()) && IsDigit(s[head.size()]));
}

// `part` is one or more of the dash- or underscore-separated parts of `s`
// ("h100" of "dgx-h100", "block" of "fp8-block").
bool IsPartOf(const std::string& part, const std::string& s) {
  auto sep = [](char c) { return c == '-' || c == '_'; };
  for (size_t at = s.find(part, 1); part.size() >= 2 && at != std::string::npos; at = s.find(part, at + 1))
    if (sep(s[at - 1]) && (at + part.size() == s.size() || sep(s[at + part.size()]))) return true;
  return false;
}

}  // namespace

std::string DidYouMeanSameKind(const std::string& word, const std::vector<std::string>& candidates,
                               size_t min_edits) {
  const std::string w = Lower(word);
  std::vector<std::string> begun, same;
  for (const auto& c : candidates) {
    const std::string lc = Lower(c);
    if (Begins(w, lc) || Begins(lc, w) || IsPartOf(w, lc)) begun.push_back(c);
    if (NumberedWords(lc) == NumberedWords(w)) same.push_back(c);
  }
  if (begun.empty()) return DidYouMean(w, same, min_edits);
  std::string out = "; did you mean ";
  for (size_t i = 0; i < begun.size(); ++i)
    out += (i == 0 ? "" : i + 1 == begun.size() ? " or " : ", ") + ("'" + begun[i] + "'");
  return out + "?";
}

namespace {

// Reads one spec file: every accessor reports "file: /json/path: what".
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}
  [[noreturn]] void Fail(const std::string& path, const std::string& msg) const {
    throw Error(file_ + ": " + (path.empty() ? "/" : path) + ": " + msg);
  }
  const json& Get(const json& obj, const std::string& path, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) Fail(path, std::string("missing required field '") + key + "'");
    return *it;
  }
  std::string String(const json& v, const std::string& path) const {
    if (!v.is_string()) Fail(path, "expected a string, got " + Kind(v));
    return v.get<std::string>();
  }
  // Every integer of a spec is at most kMaxSpecInt unless a field says less
  // (dims, shapes and sizes are tensor extents: fragment coordinates are 32-bit).
  int64_t Int(const json& v, const std::string& path, int64_t min_value, int64_t max_value = kMaxSpecInt) const {
    if (v.is_number_float()) {
      // A whole number written with an exponent or a point (1e30, 8.0) is
      // out of range, or an integer in the wrong notation; not a fraction.
      const double d = v.get<double>();
      if (d == std::floor(d)) {
        if (d > static_cast<double>(max_value) || d >= 0x1p63)
          Fail(path, "expected an integer <= " + std::to_string(max_value) + ", got " + v.dump());
        if (d < static_cast<double>(min_value) || d < -0x1p63)
          Fail(path, "expected an integer >= " + std::to_string(min_value) + ", got " + v.dump());
        Fail(path, "expected an integer, got " + v.dump() + "; write it as " + std::to_string(static_cast<int64_t>(d)));
      }
    }
    if (!v.is_number_integer()) Fail(path, "expected an integer, got " + Kind(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max_value))
      Fail(path, "expected an integer <= " + std::to_string(max_value) + ", got " + std::to_string(v.get<uint64_t>()));
    int64_t x = v.get<int64_t>();
    if (x < min_value) Fail(path, "expected an integer >= " + std::to_string(min_value) + ", got " + std::to_string(x));
    if (x > max_value) Fail(path, "expected an integer <= " + std::to_string(max_value) + ", got " + std::to_string(x));
    return x;
  }
  // A positive finite number, at most kMaxSpecNumber (bandwidths, latencies).
  double Number(const json& v, const std::string& path) const {
    if (!v.is_number()) Fail(path, "expected a number, got " + Kind(v));
    double x = v.get<double>();
    if (!(x > 0)) Fail(path, "expected a positive number, got " + v.dump());
    if (!(x <= kMaxSpecNumber)) Fail(path, "expected a number <= 1e12, got " + v.dump());
    return x;
  }
  const json& Object(const json& v, const std::string& path) const {
    if (!v.is_object()) Fail(path, "expected an object, got " + Kind(v));
    return v;
  }
  const json& Array(const json& v, const std::string& path) const {
    if (!v.is_array()) Fail(path, "expected an array, got " + Kind(v));
    return v;
  }
  std::vector<int64_t> IntList(const json& v, const std::string& path, int64_t min_value,
                               int64_t max_value = kMaxSpecInt) const {
    Array(v, path);
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(Int(v[i], path + "/" + std::to_string(i), min_value, max_value));
    return out;
  }
  void Format(const json& root, const std::string& expected) const {
    Object(root, "");
    std::string f = String(Get(root, "", "format"), "/format");
    if (f != expected) Fail("/format", "unknown format '" + f + "', expected '" + expected + "'");
  }
  void Keys(const json& obj, const std::string& path, const std::vector<std::string>& allowed) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end())
        Fail(path + "/" + it.key(), "unknown field '" + it.key() + "'" + DidYouMean(it.key(), allowed));
    }
  }
  Dtype ParseDtype(const json& v, const std::string& path) const {
    std::string s = String(v, path);
    static const std::vector<std::string> names = {"bf16", "fp16", "fp32", "fp8_e4m3"};
    for (size_t i = 0; i < names.size(); ++i)
      if (s == names[i]) return static_cast<Dtype>(i);
    Fail(path, "unknown dtype '" + s + "', expected one of bf16, fp16, fp32, fp8_e4m3" + DidYouMeanSameKind(s, names));
  }
  static std::string Kind(const json& v) {
    switch (v.type()) {
      case json::value_t::null: return "null";
      case json::value_t::boolean: return "a boolean";
      case json::value_t::string: return "a string";
      case json::value_t::array: return "an array";
      case json::value_t::object: return "an object";
      case json::value_t::number_float:
        return v.get<double>() == std::floor(v.get<double>()) ? "a number" : "a number with a fraction";
      default: return "a number";
    }
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

}  // namespace

NameTemplate ParseNameTemplate(const std::string& name) {
  NameTemplate t;
  size_t pos = 0;
  while (true) {
    size_t open = name.find('{', pos);
    size_t close = open == std::string::npos ? open : name.find('}', open);
    if (close == std::string::npos) {
      t.text.push_back(name.substr(pos));
      return t;
    }
    t.text.push_back(name.substr(pos, open - pos));
    std::string p = name.substr(open + 1, close - open - 1);
    IndexKind kind = IndexKind::global;
    for (auto [suffix, k] : {std::pair{".local", IndexKind::local}, std::pair{".chunk", IndexKind::chunk},
                             std::pair{".in_chunk", IndexKind::in_chunk}}) {
      const size_t n = std::string_view(suffix).size();
      if (p.size() > n && p.compare(p.size() - n, n, suffix) == 0) {
        p.resize(p.size() - n);
        kind = k;
        break;
      }
    }
    t.dims.push_back(p);
    t.kind.push_back(kind);
    pos = close + 1;
  }
}

bool GlobMatch(const std::string& p, const std::string& s) {
  size_t pi = 0, si = 0, star = std::string::npos, mark = 0;
  auto class_match = [&](size_t& i, char c) {
    // p[i] == '['; on return i points past ']'.
    size_t j = i + 1;
    bool neg = j < p.size() && (p[j] == '!' || p[j] == '^');
    if (neg) ++j;
    bool hit = false;
    for (; j < p.size() && p[j] != ']'; ++j) {
      if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
        if (c >= p[j] && c <= p[j + 2]) hit = true;
        j += 2;
      } else if (p[j] == c) {
        hit = true;
      }
    }
    i = j + 1;
    return hit != neg;
  };
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
      continue;
    }
    if (pi < p.size() && p[pi] == '[' && p.find(']', pi) != std::string::npos) {
      size_t np = pi;
      if (class_match(np, s[si])) {
        pi = np;
        ++si;
        continue;
      }
    } else if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
      continue;
    }
    if (star == std::string::npos) return false;
    pi = star + 1;
    si = ++mark;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

namespace {

// `s` with bytes outside printable ASCII written as \n, \t, \r or \xNN.
std::string Escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else if (c == '\n' || c == '\t' || c == '\r') {
      out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r";
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

// "file:line:col: msg", then at most 80 characters of the line around byte
// `at` (escaped, "..." where cut) and a caret under `at`.
[[noreturn]] void FailAt(const std::string& text, size_t at, const std::string& file, const std::string& msg) {
  constexpr size_t kBefore = 40, kAfter = 40;
  if (at > text.size()) at = text.size();
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < at; ++i)
    if (text[i] == '\n') ++line, line_start = i + 1;
  size_t line_end = text.find('\n', line_start);
  if (line_end == std::string::npos) line_end = text.size();
  const size_t from = at - line_start > kBefore ? at - kBefore : line_start;
  const size_t to = line_end - at > kAfter ? at + kAfter : line_end;
  std::string before = (from > line_start ? "..." : "") + Escape(text.substr(from, at - from));
  std::string after = Escape(text.substr(at, to - at)) + (to < line_end ? "..." : "");
  throw Error(file + ":" + std::to_string(line) + ":" + std::to_string(at - line_start + 1) + ": " + Escape(msg) + "\n" +
              before + after + "\n" + std::string(before.size(), ' ') + "^");
}

// nlohmann's message without its "[json.exception...] ... column N: " prefix,
// the token it last read cut to its last 40 characters.
std::string Message(const std::string& what) {
  std::string msg = what;
  size_t colon = what.find(": ", what.find("column"));
  size_t bracket = what.find("] ");
  if (colon != std::string::npos && what.find("column") != std::string::npos) {
    msg = what.substr(colon + 2);
  } else if (bracket != std::string::npos) {
    msg = what.substr(bracket + 2);
  }
  const std::string last = "last read: '";
  size_t begin = msg.find(last), end = begin == std::string::npos ? begin : msg.find("'; ", begin + last.size());
  if (end != std::string::npos && end - begin - last.size() > 40) msg.replace(begin + last.size(), end - begin - last.size() - 40, "...");
  return msg;
}

}  // namespace

namespace {

// Duplicate keys are an error: a SAX pass over the text keeps one set of keys
// per open object and the JSON path of the value being read. (A second pass,
// beside json::parse: nlohmann's callback parser rescans the enclosing
// container at every object's end, quadratic in a model of 10^5 tensors.)
class DuplicateKeys : public nlohmann::json_sax<json> {
 public:
  explicit DuplicateKeys(const std::string& file) : file_(file) {}
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(false); }
  bool start_array(std::size_t) override { return Open(true); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    Frame& f = open_.back();
    f.key = k;
    if (!f.keys.insert(k).second) throw Error(file_ + ": " + Escape(Path()) + ": duplicate key '" + Escape(k) + "' (each key at most once)");
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  struct Frame {
    bool array = false;
    size_t index = 0;
    std::string key;
    std::unordered_set<std::string> keys;
  };
  bool Value() {
    if (!open_.empty() && open_.back().array) ++open_.back().index;
    return true;
  }
  bool Open(bool array) {
    open_.emplace_back();
    open_.back().array = array;
    return true;
  }
  bool Close() {
    open_.pop_back();
    return Value();
  }
  std::string Path() const {
    std::string p;
    for (const Frame& f : open_) p += "/" + (f.array ? std::to_string(f.index) : f.key);
    return p;
  }
  const std::string& file_;
  std::vector<Frame> open_;
};

}  // namespace

json ParseJson(const std::string& text, const std::string& file) {
  try {
    json j = json::parse(text);
    DuplicateKeys keys(file);
    json::sax_parse(text, &keys);
    return j;
  } catch (const json::parse_error& e) {
    const bool empty = text.find_first_not_of(" \t\r\n") == std::string::npos;
    FailAt(text, e.byte == 0 ? 0 : e.byte - 1, file, empty ? "the file is empty, expected a JSON object" : Message(e.what()));
  } catch (const json::exception& e) {
    // A number out of range ("number overflow parsing '1e400'"): point at it.
    std::string msg = Message(e.what());
    size_t q = msg.find('\''), q2 = q == std::string::npos ? q : msg.find('\'', q + 1);
    size_t at = q2 == std::string::npos ? std::string::npos : text.find(msg.substr(q + 1, q2 - q - 1));
    if (at == std::string::npos) throw Error(file + ": " + Escape(msg));
    FailAt(text, at, file, msg);
  }
}

json LoadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseJson(ss.str(), path);
}

namespace {

// A tensor family's elements (at most kMaxTensorElements) and the model's
// (at most kMaxModelElements): sizes computed later fit in 64 bits.
// A "range" value: [lo, hi], or a list of such intervals, ascending and
// apart (touching ones are one interval: written as one), each within
// [0, size]. Returns them in order.
std::vector<std::pair<int64_t, int64_t>> ParseIntervals(const Reader& r, const json& v, const std::string& path,
                                                        int64_t size) {
  const std::string want = "expected [lo, hi] with 0 <= lo < hi <= " + std::to_string(size) +
                           ", or a list of such intervals ([[0, 3], [4, 7]])";
  std::vector<std::pair<int64_t, int64_t>> out;
  if (!v.is_array() || v.empty()) r.Fail(path, want + ", got " + v.dump());
  const bool list = v[0].is_array();
  for (size_t i = 0; i < (list ? v.size() : 1); ++i) {
    const std::string ip = list ? path + "/" + std::to_string(i) : path;
    const auto lohi = r.IntList(list ? v[i] : v, ip, 0);
    if (lohi.size() != 2 || lohi[0] >= lohi[1] || lohi[1] > size) r.Fail(ip, want);
    if (!out.empty() && lohi[0] <= out.back().second)
      r.Fail(ip, "[" + std::to_string(lohi[0]) + ", " + std::to_string(lohi[1]) + "] " +
                     (lohi[0] < out.back().second ? "overlaps or precedes" : "touches") + " [" +
                     std::to_string(out.back().first) + ", " + std::to_string(out.back().second) +
                     "]: list intervals ascending and apart (touching ones as one)");
    out.emplace_back(lohi[0], lohi[1]);
  }
  return out;
}

void CheckElements(const Reader& r, const std::string& path, const TensorSpec& ts) {
  uint64_t n = 1;
  for (size_t d = 0; d < ts.lo.size(); ++d) {
    n *= static_cast<uint64_t>(ts.hi[d] - ts.lo[d]);  // each <= 2^32 - 1, n <= 2^48 before: no overflow
    if (n > static_cast<uint64_t>(kMaxTensorElements))
      r.Fail(path + "/shape", "tensor '" + ts.name + "' has more than 2^48 elements (stack dims times shape)");
  }
}

void CheckModelElements(const Reader& r, const ModelSpec& m) {
  uint64_t total = 0;  // <= 2^52 + 2^48 in the loop
  for (const TensorSpec& t : m.tensors) {
    total += static_cast<uint64_t>(t.elements());
    if (total > static_cast<uint64_t>(kMaxModelElements))
      r.Fail(t.path, "the model's tensors up to '" + t.name + "' have more than 2^52 elements");
  }
}

}  // namespace

ModelSpec ParseModel(const json& root, const std::string& file) {
  Reader r(file);
  r.Format(root, "reshard.model/1");
  r.Keys(root, "", {"format", "name", "dtype", "dims", "tensors", "notes"});
  ModelSpec m;
  m.file = file;
  m.name = r.String(r.Get(root, "", "name"), "/name");
  if (root.contains("dtype")) m.dtype = r.ParseDtype(root["dtype"], "/dtype");
  if (root.contains("dims")) {
    const json& dims = r.Object(root["dims"], "/dims");
    for (auto it = dims.begin(); it != dims.end(); ++it)
      m.dims.emplace_back(it.key(), r.Int(it.value(), "/dims/" + it.key(), 1));
  }
  std::vector<std::string> dim_names;
  for (auto& d : m.dims) dim_names.push_back(d.first);
  const json& tensors = r.Array(r.Get(root, "", "tensors"), "/tensors");
  if (tensors.empty()) r.Fail("/tensors", "the model has no tensors");
  std::set<std::string> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::string path = "/tensors/" + std::to_string(i);
    const json& t = r.Object(tensors[i], path);
    r.Keys(t, path, {"name", "shape", "dtype", "range", "heads"});
    TensorSpec ts;
    ts.path = path;
    ts.name = r.String(r.Get(t, path, "name"), path + "/name");
    if (!seen.insert(ts.name).second) r.Fail(path + "/name", "tensor '" + ts.name + "' is declared twice");
    ts.shape = r.IntList(r.Get(t, path, "shape"), path + "/shape", 1);
    ts.dtype = t.contains("dtype") ? r.ParseDtype(t["dtype"], path + "/dtype") : m.dtype;
    NameTemplate nt = ParseNameTemplate(ts.name);
    for (size_t k = 0; k < nt.dims.size(); ++k) {
      // Tensor names take global indices only.
      const char* suffix[] = {"", ".local", ".chunk", ".in_chunk"};
      const std::string p = nt.dims[k] + suffix[static_cast<int>(nt.kind[k])];
      int d = m.dim_index(p);
      if (d < 0) r.Fail(path + "/name", "placeholder '{" + p + "}' is not a dim declared in /dims" + DidYouMean(p, dim_names));
      if (std::find(ts.stack.begin(), ts.stack.end(), d) != ts.stack.end())
        r.Fail(path + "/name", "placeholder '{" + p + "}' appears twice");
      ts.stack.push_back(d);
    }
    if (ts.stack.size() + ts.shape.size() > static_cast<size_t>(kMaxDims))
      r.Fail(path, "tensor has " + std::to_string(ts.stack.size() + ts.shape.size()) +
                       " dims (stack dims and shape), at most " + std::to_string(kMaxDims) + " are supported");
    for (int d : ts.stack) ts.lo.push_back(0), ts.hi.push_back(m.dims[d].second);
    // "range": per stack dim one [lo, hi], or a list of them (a hybrid
    // model's linear-attention layers); a list makes the family one piece per
    // interval, each a TensorSpec of the same name (at most one dim so).
    int split_dim = -1;
    std::vector<std::pair<int64_t, int64_t>> runs;
    if (t.contains("range")) {
      const json& range = r.Object(t["range"], path + "/range");
      for (auto it = range.begin(); it != range.end(); ++it) {
        std::string rp = path + "/range/" + it.key();
        int d = m.dim_index(it.key());
        auto pos = std::find(ts.stack.begin(), ts.stack.end(), d);
        if (d < 0 || pos == ts.stack.end()) r.Fail(rp, "tensor '" + ts.name + "' has no stack dim '" + it.key() + "'");
        const auto intervals = ParseIntervals(r, it.value(), rp, m.dims[d].second);
        size_t k = pos - ts.stack.begin();
        if (intervals.size() > 1) {
          if (split_dim >= 0) r.Fail(rp, "only one stack dim may list several intervals");
          split_dim = static_cast<int>(k);
          runs = intervals;
        }
        ts.lo[k] = intervals.front().first;
        ts.hi[k] = intervals.back().second;
      }
    }
    for (int64_t s : ts.shape) ts.lo.push_back(0), ts.hi.push_back(s);
    CheckElements(r, path, ts);
    if (t.contains("heads")) {
      const std::string hp = path + "/heads";
      const json& h = r.Object(t["heads"], hp);
      r.Keys(h, hp, {"dim", "size"});
      ts.head_dim = static_cast<int>(r.Int(r.Get(h, hp, "dim"), hp + "/dim", 0));
      ts.head_size = r.Int(r.Get(h, hp, "size"), hp + "/size", 1);
      if (ts.head_dim >= static_cast<int>(ts.shape.size()))
        r.Fail(hp + "/dim", "the shape has " + std::to_string(ts.shape.size()) + " dims, dim " +
                                std::to_string(ts.head_dim) + " does not exist");
      if (ts.shape[ts.head_dim] % ts.head_size != 0)
        r.Fail(hp + "/size", "dim " + std::to_string(ts.head_dim) + " (size " + std::to_string(ts.shape[ts.head_dim]) +
                                 ") is not a whole number of heads of " + std::to_string(ts.head_size));
    }
    if (split_dim < 0) {
      m.tensors.push_back(std::move(ts));
      continue;
    }
    for (const auto& [lo, hi] : runs) {
      TensorSpec piece = ts;
      piece.lo[split_dim] = lo;
      piece.hi[split_dim] = hi;
      m.tensors.push_back(std::move(piece));
    }
  }
  CheckModelElements(r, m);
  return m;
}

namespace {

AxisSpec ParseAxis(const Reader& r, const json& v, const std::string& path, const ModelSpec& model, int64_t axis_size) {
  AxisSpec a;
  a.path = path;
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s != "replicate") r.Fail(path, "expected \"replicate\", {\"shard\": DIM} or {\"at\": I}, got '" + s + "'");
    return a;
  }
  r.Object(v, path);
  r.Keys(v, path, {"shard", "split", "sizes", "blocks", "parts", "cyclic", "assign", "at"});
  if (v.contains("at")) {
    if (v.size() != 1) r.Fail(path, "\"at\" takes no other fields");
    a.kind = AxisKind::at;
    // One position, or several that each hold a whole copy (Megatron's tied
    // embedding on the first and the last pipeline stage).
    const json& at = v["at"];
    const bool list = at.is_array();
    if (list && at.empty()) r.Fail(path + "/at", "list at least one position");
    for (size_t i = 0; i < (list ? at.size() : 1); ++i) {
      const std::string ip = path + "/at" + (list ? "/" + std::to_string(i) : "");
      const json& x = list ? at[i] : at;
      int64_t pos = r.Int(x, ip, -axis_size);
      if (pos < 0) pos += axis_size;
      if (pos >= axis_size)
        r.Fail(ip, "position " + x.dump() + " is outside the axis of size " + std::to_string(axis_size));
      if (std::find(a.at.begin(), a.at.end(), pos) != a.at.end())
        r.Fail(ip, "position " + x.dump() + " is listed twice (as " + std::to_string(pos) + ")");
      a.at.push_back(pos);
    }
    return a;
  }
  if (!v.contains("shard")) r.Fail(path, "expected \"shard\" or \"at\"");
  a.kind = AxisKind::shard;
  const json& d = v["shard"];
  if (d.is_string()) {
    a.dim_name = d.get<std::string>();
    a.stack_dim = model.dim_index(a.dim_name);
    if (a.stack_dim < 0) {
      std::vector<std::string> names;
      for (auto& x : model.dims) names.push_back(x.first);
      r.Fail(path + "/shard", "unknown dim '" + a.dim_name + "': the model's stack dims are " +
                                  (names.empty() ? std::string("none") : "'" + [&] {
                                    std::string s;
                                    for (size_t i = 0; i < names.size(); ++i) s += (i ? "', '" : "") + names[i];
                                    return s;
                                  }() + "'") + ", or give an index into the tensor's shape" + DidYouMean(a.dim_name, names));
    }
  } else {
    a.shape_dim = static_cast<int>(r.Int(d, path + "/shard", 0));
    a.dim_name = std::to_string(a.shape_dim);
  }
  int extras = 0;
  if (v.contains("sizes")) ++extras, a.sizes = r.IntList(v["sizes"], path + "/sizes", 0);
  if (v.contains("blocks")) ++extras, a.blocks = r.Int(v["blocks"], path + "/blocks", 1);
  if (v.contains("parts")) ++extras, a.parts = r.Int(v["parts"], path + "/parts", 1);
  if (v.contains("cyclic")) ++extras, a.cyclic = r.Int(v["cyclic"], path + "/cyclic", 1);
  if (v.contains("assign")) {
    ++extras;
    const json& as = r.Array(v["assign"], path + "/assign");
    for (size_t i = 0; i < as.size(); ++i) a.assign.push_back(r.IntList(as[i], path + "/assign/" + std::to_string(i), 0));
  }
  if (extras > 1) r.Fail(path, "use at most one of \"sizes\", \"blocks\", \"parts\", \"cyclic\", \"assign\"");
  if (v.contains("split")) {
    const std::string split = r.String(v["split"], path + "/split");
    if (split != "even" && split != "chunk")
      r.Fail(path + "/split", "unknown split '" + split +
                                  "', expected 'even' (the dim divides evenly) or 'chunk' (torch.chunk: chunks of "
                                  "ceil(size / positions), the last ones short or empty)" +
                                  DidYouMean(split, {"even", "chunk"}));
    a.chunk = split == "chunk";
    if (a.chunk && extras > 0 && !a.blocks)
      r.Fail(path + "/split", "\"split\" applies to an even cut or to \"blocks\", not to \"sizes\", \"parts\", "
                              "\"cyclic\" or \"assign\", which say where every index goes");
  }
  if (!a.sizes.empty() && static_cast<int64_t>(a.sizes.size()) != axis_size)
    r.Fail(path + "/sizes", "has " + std::to_string(a.sizes.size()) + " entries, the axis has size " + std::to_string(axis_size));
  if (!a.assign.empty() && static_cast<int64_t>(a.assign.size()) != axis_size)
    r.Fail(path + "/assign", "has " + std::to_string(a.assign.size()) + " entries, the axis has size " + std::to_string(axis_size));
  if (a.parts && axis_size % a.parts != 0)
    r.Fail(path + "/parts", std::to_string(a.parts) + " parts do not divide the axis size " + std::to_string(axis_size));
  return a;
}

// A placement's "order": the axes that shard the tensor, in the order they
// cut it; the axes it leaves out (replicate, "at") keep their mesh order.
std::vector<int> ParseOrder(const Reader& r, const json& v, const std::string& path, const Mesh& m, const Placement& p) {
  const json& list = r.Array(v, path);
  std::vector<std::string> names;
  for (const auto& ax : m.axes) names.push_back(ax.first);
  std::vector<int> order;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string ip = path + "/" + std::to_string(i);
    const std::string name = r.String(list[i], ip);
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) r.Fail(ip, "'" + name + "' is not an axis of mesh '" + m.name + "'" + DidYouMean(name, names));
    const int k = static_cast<int>(it - names.begin());
    if (std::find(order.begin(), order.end(), k) != order.end()) r.Fail(ip, "axis '" + name + "' is listed twice");
    if (p.axes[k].kind != AxisKind::shard)
      r.Fail(ip, "axis '" + name + "' does not shard this placement; \"order\" lists the axes that cut the tensor");
    order.push_back(k);
  }
  for (size_t k = 0; k < p.axes.size(); ++k)
    if (p.axes[k].kind == AxisKind::shard && std::find(order.begin(), order.end(), static_cast<int>(k)) == order.end())
      r.Fail(path, "axis '" + names[k] + "' shards this placement but is not listed; list every axis that cuts the "
                   "tensor, in the order they cut it");
  for (size_t k = 0; k < p.axes.size(); ++k)
    if (p.axes[k].kind != AxisKind::shard) order.push_back(static_cast<int>(k));
  return order;
}

// A buffer rule's "quant": the format, its scales and the scale buffer's name.
QuantSpec ParseQuant(const Reader& r, const json& v, const std::string& rule_path, const BufferRule& b) {
  const std::string path = rule_path + "/quant";
  r.Object(v, path);
  r.Keys(v, path, {"format", "scale", "block", "scale_name"});
  QuantSpec q;
  q.path = path;
  q.format = r.String(r.Get(v, path, "format"), path + "/format");
  if (q.format == "mxfp8") {
    if (v.contains("scale")) r.Fail(path + "/scale", "mxfp8 always has e8m0 scales over blocks of 1x32; leave out \"scale\"");
    if (v.contains("block")) r.Fail(path + "/block", "mxfp8 always has e8m0 scales over blocks of 1x32; leave out \"block\"");
    q.scale = "block";
    q.block = {1, 32};
    q.scale_dtype = Dtype::e8m0;
  } else if (q.format == "fp8_e4m3") {
    q.scale = r.String(r.Get(v, path, "scale"), path + "/scale");
    static const std::vector<std::string> scales = {"block", "channel", "tensor"};
    if (std::find(scales.begin(), scales.end(), q.scale) == scales.end())
      r.Fail(path + "/scale", "unknown scale '" + q.scale + "', expected 'block', 'channel' or 'tensor'" + DidYouMean(q.scale, scales));
    if (q.scale == "block") {
      auto block = r.IntList(r.Get(v, path, "block"), path + "/block", 1);
      if (block.size() != 2) r.Fail(path + "/block", "expected [rows, cols], got " + std::to_string(block.size()) + " entries");
      q.block = {block[0], block[1]};
    } else {
      if (v.contains("block")) r.Fail(path + "/block", "only \"scale\": \"block\" takes a block shape");
      q.block = {q.scale == "channel" ? 1 : 0, 0};
    }
  } else {
    r.Fail(path + "/format", "unknown quant format '" + q.format + "', expected 'fp8_e4m3' or 'mxfp8'" +
                                 DidYouMeanSameKind(q.format, {"fp8_e4m3", "mxfp8"}));
  }
  q.scale_name = r.String(r.Get(v, path, "scale_name"), path + "/scale_name");
  const NameTemplate data = ParseNameTemplate(b.name), scale = ParseNameTemplate(q.scale_name);
  if (data.dims != scale.dims || data.kind != scale.kind)
    r.Fail(path + "/scale_name", "placeholders must be those of the buffer's name, in the same order");
  if (q.scale_name == b.name) r.Fail(path + "/scale_name", "the scale buffer needs a name of its own");
  if (b.fuse == Fuse::interleave) r.Fail(path, "a buffer fused with \"interleave\" cannot be quantized");
  if (b.shape) r.Fail(path, "a padded buffer (\"shape\") cannot be quantized");
  if (b.dtype && *b.dtype != Dtype::fp8_e4m3)
    r.Fail(rule_path + "/dtype", std::string("a quantized buffer holds fp8_e4m3, not ") + DtypeString(*b.dtype));
  return q;
}

// A number as a message writes it: "-1", "0.5".
std::string FormatNumber(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// A buffer rule's "transform": how the framework's values differ from the
// model's. Only an additive offset, on values stored in a dtype that carries
// arithmetic (bf16, fp16, fp32): FP8 values with scales (quant) cannot take a
// constant without requantizing, which the plan does not do on the way.
void ParseTransform(const Reader& r, const json& v, const std::string& rule_path, BufferRule& b,
                    const ModelSpec& model, const std::unordered_map<std::string, size_t>& tensor_index,
                    const std::optional<Dtype>& layout_dtype) {
  const std::string path = rule_path + "/transform";
  r.Object(v, path);
  r.Keys(v, path, {"offset"});
  const json& o = r.Get(v, path, "offset");
  if (!o.is_number()) r.Fail(path + "/offset", "expected a number, got " + o.dump());
  const double x = o.get<double>();
  if (!(std::abs(x) <= 65504))
    r.Fail(path + "/offset", "expected a number between -65504 and 65504 (what fp16 holds), got " + o.dump());
  b.offset = static_cast<float>(x);
  if (static_cast<double>(b.offset) != x)
    r.Fail(path + "/offset", "expected a number fp32 holds exactly, got " + o.dump());
  b.transform_path = path;
  if (b.quant)
    r.Fail(path, "an offset needs values stored as bf16, fp16 or fp32; this rule stores them as " + b.quant->format +
                     " (" + rule_path + "/quant), which cannot carry one");
  for (const std::string& part : b.parts) {
    const Dtype stored = b.dtype ? *b.dtype : layout_dtype ? *layout_dtype : model.tensors[tensor_index.at(part)].dtype;
    if (stored == Dtype::fp8_e4m3 || stored == Dtype::e8m0)
      r.Fail(path, std::string("an offset needs values stored as bf16, fp16 or fp32; '") + part + "' is stored as " +
                       DtypeString(stored) + ", which cannot carry one");
  }
}

}  // namespace

LayoutSpec ParseLayout(const json& root, const std::string& file, const ModelSpec& model) {
  Reader r(file);
  r.Format(root, "reshard.layout/1");
  r.Keys(root, "", {"format", "name", "model", "ranks", "meshes", "placements", "buffers", "default_buffers", "dtype",
                    "notes"});
  LayoutSpec l;
  l.file = file;
  if (root.contains("dtype")) l.dtype = r.ParseDtype(root["dtype"], "/dtype");
  l.name = r.String(r.Get(root, "", "name"), "/name");
  if (root.contains("model")) {
    l.model = r.String(root["model"], "/model");
    if (l.model != model.name)
      r.Fail("/model", "layout is written for model '" + l.model + "', the model spec is '" + model.name + "'");
  }
  l.ranks = r.Int(r.Get(root, "", "ranks"), "/ranks", 1, kMaxRanks);
  if (root.contains("default_buffers")) {
    if (!root["default_buffers"].is_boolean()) r.Fail("/default_buffers", "expected true or false, got " + Reader::Kind(root["default_buffers"]));
    l.default_buffers = root["default_buffers"].get<bool>();
  }
  const json& meshes = r.Object(r.Get(root, "", "meshes"), "/meshes");
  if (meshes.empty()) r.Fail("/meshes", "declare at least one mesh");
  for (auto it = meshes.begin(); it != meshes.end(); ++it) {
    std::string path = "/meshes/" + it.key();
    Mesh mesh;
    mesh.name = it.key();
    const json& axes = r.Array(it.value(), path);
    int64_t product = 1;
    std::set<std::string> names;
    for (size_t i = 0; i < axes.size(); ++i) {
      std::string ap = path + "/" + std::to_string(i);
      const json& ax = r.Array(axes[i], ap);
      if (ax.size() != 2) r.Fail(ap, "expected [axis name, size]");
      std::string n = r.String(ax[0], ap + "/0");
      if (!names.insert(n).second) r.Fail(ap, "axis '" + n + "' appears twice");
      if (n == "match" || n == "mesh" || n == "order" || n == "split_heads")
        r.Fail(ap + "/0", "'" + n + "' is a field of every placement and cannot name a mesh axis");
      int64_t s = r.Int(ax[1], ap + "/1", 1, kMaxRanks);
      mesh.axes.emplace_back(n, s);
      product = std::min(product * s, kMaxRanks + 1);  // both <= 2^20 + 1: no overflow
    }
    if (product != l.ranks)
      r.Fail(path, "mesh axes multiply to " + (product > kMaxRanks ? "more than " + std::to_string(kMaxRanks) : std::to_string(product)) +
                       " ranks, the layout has " + std::to_string(l.ranks));
    l.meshes.push_back(std::move(mesh));
  }
  std::vector<std::string> mesh_names;
  for (auto& m : l.meshes) mesh_names.push_back(m.name);
  const json& placements = r.Array(r.Get(root, "", "placements"), "/placements");
  for (size_t i = 0; i < placements.size(); ++i) {
    std::string path = "/placements/" + std::to_string(i);
    const json& pj = r.Object(placements[i], path);
    Placement p;
    p.path = path;
    p.match = r.String(r.Get(pj, path, "match"), path + "/match");
    std::string mesh = pj.contains("mesh") ? r.String(pj["mesh"], path + "/mesh")
                                           : (l.meshes.size() == 1 ? l.meshes[0].name : "");
    if (mesh.empty()) r.Fail(path, "missing required field 'mesh' (the layout has several meshes)");
    auto mit = std::find(mesh_names.begin(), mesh_names.end(), mesh);
    if (mit == mesh_names.end()) r.Fail(path + "/mesh", "unknown mesh '" + mesh + "'" + DidYouMean(mesh, mesh_names));
    p.mesh = static_cast<int>(mit - mesh_names.begin());
    const Mesh& m = l.meshes[p.mesh];
    std::vector<std::string> allowed = {"match", "mesh", "split_heads", "order"};
    for (auto& ax : m.axes) allowed.push_back(ax.first);
    if (pj.contains("split_heads")) {
      if (!pj["split_heads"].is_boolean())
        r.Fail(path + "/split_heads", "expected true or false, got " + Reader::Kind(pj["split_heads"]));
      p.split_heads = pj["split_heads"].get<bool>();
    }
    for (auto it = pj.begin(); it != pj.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end())
        r.Fail(path + "/" + it.key(), "'" + it.key() + "' is not an axis of mesh '" + m.name + "'" + DidYouMean(it.key(), allowed));
    }
    for (auto& ax : m.axes) {
      if (pj.contains(ax.first)) {
        p.axes.push_back(ParseAxis(r, pj[ax.first], path + "/" + ax.first, model, ax.second));
      } else {
        AxisSpec rep;
        rep.path = path + "/" + ax.first;
        p.axes.push_back(rep);
      }
    }
    for (size_t k = 0; k < m.axes.size(); ++k) p.order.push_back(static_cast<int>(k));
    if (pj.contains("order")) p.order = ParseOrder(r, pj["order"], path + "/order", m, p);
    l.placements.push_back(std::move(p));
  }
  std::vector<std::string> tensor_names;
  std::unordered_map<std::string, size_t> tensor_index;
  for (auto& t : model.tensors) tensor_index.emplace(t.name, tensor_names.size()), tensor_names.push_back(t.name);
  // An exact match (no *, ? or [) names one tensor family: a typo there would
  // silently hand the tensor to a later catch-all placement.
  for (const Placement& p : l.placements)
    if (p.match.find_first_of("*?[") == std::string::npos && !tensor_index.count(p.match))
      r.Fail(p.path + "/match", "no tensor '" + p.match + "' in model '" + model.name + "'" +
                                    DidYouMean(p.match, tensor_names) +
                                    " (a match without * ? [ names one tensor family, as the model spec writes it)");
  if (root.contains("buffers")) {
    const json& bufs = r.Array(root["buffers"], "/buffers");
    for (size_t i = 0; i < bufs.size(); ++i) {
      std::string path = "/buffers/" + std::to_string(i);
      const json& bj = r.Object(bufs[i], path);
      r.Keys(bj, path,
             {"name", "parts", "tensor", "concat", "interleave", "shape", "dtype", "quant", "shard", "range", "at", "held",
              "transform"});
      BufferRule b;
      b.path = path;
      b.name = r.String(r.Get(bj, path, "name"), path + "/name");
      if (bj.contains("tensor") && bj.contains("parts"))
        r.Fail(path, "use either \"tensor\" (a buffer of one tensor) or \"parts\" (several, fused)");
      if (bj.contains("tensor")) {
        b.parts.push_back(r.String(bj["tensor"], path + "/tensor"));
      } else {
        const json& parts = r.Array(r.Get(bj, path, "parts"), path + "/parts");
        if (parts.empty()) r.Fail(path + "/parts", "list at least one tensor");
        for (size_t k = 0; k < parts.size(); ++k) b.parts.push_back(r.String(parts[k], path + "/parts/" + std::to_string(k)));
      }
      for (size_t k = 0; k < b.parts.size(); ++k) {
        if (!tensor_index.count(b.parts[k]))
          r.Fail(path + "/parts/" + std::to_string(k),
                 "no tensor '" + b.parts[k] + "' in model '" + model.name + "'" + DidYouMean(b.parts[k], tensor_names));
      }
      if (bj.contains("concat") && bj.contains("interleave")) r.Fail(path, "use either \"concat\" or \"interleave\"");
      if (bj.contains("concat")) {
        b.fuse = Fuse::concat;
        b.fuse_dim = static_cast<int>(r.Int(bj["concat"], path + "/concat", 0));
      } else if (bj.contains("interleave")) {
        const json& il = r.Object(bj["interleave"], path + "/interleave");
        const std::string ip = path + "/interleave";
        r.Keys(il, ip, {"dim", "groups", "blocks"});
        b.fuse = Fuse::interleave;
        b.fuse_dim = static_cast<int>(r.Int(r.Get(il, ip, "dim"), ip + "/dim", 0));
        // "groups" may be left out with "blocks" (one outer group).
        b.groups = il.contains("blocks") && !il.contains("groups") ? 1 : r.Int(r.Get(il, ip, "groups"), ip + "/groups", 1);
        if (il.contains("blocks")) {
          const json& blocks = r.Array(il["blocks"], ip + "/blocks");
          if (blocks.empty()) r.Fail(ip + "/blocks", "list at least one block");
          int64_t total = 0;
          for (size_t k = 0; k < blocks.size(); ++k) {
            const std::string bp = ip + "/blocks/" + std::to_string(k);
            const json& bj2 = r.Object(blocks[k], bp);
            r.Keys(bj2, bp, {"parts", "groups"});
            const int64_t n = r.Int(r.Get(bj2, bp, "parts"), bp + "/parts", 1);
            const int64_t g = bj2.contains("groups") ? r.Int(bj2["groups"], bp + "/groups", 1) : 1;
            total += n;
            b.blocks.emplace_back(n, g);
          }
          if (total != static_cast<int64_t>(b.parts.size()))
            r.Fail(ip + "/blocks", "the blocks take " + std::to_string(total) + " parts, the rule has " +
                                       std::to_string(b.parts.size()));
        }
      }
      if (b.parts.size() > 1 && b.fuse == Fuse::none)
        r.Fail(path, "a buffer of " + std::to_string(b.parts.size()) + " parts needs \"concat\" or \"interleave\"");
      if (bj.contains("shard")) {
        const json& sh = bj["shard"];
        if (sh.is_object()) {
          r.Keys(sh, path + "/shard", {"axis", "split"});
          b.shard_axis = r.String(r.Get(sh, path + "/shard", "axis"), path + "/shard/axis");
          if (sh.contains("split")) {
            const std::string split = r.String(sh["split"], path + "/shard/split");
            if (split != "even" && split != "chunk")
              r.Fail(path + "/shard/split", "unknown split '" + split + "', expected 'even' or 'chunk'" +
                                                DidYouMean(split, {"even", "chunk"}));
            b.shard_chunk = split == "chunk";
          }
        } else {
          b.shard_axis = r.String(sh, path + "/shard");
        }
        if (b.fuse == Fuse::none)
          r.Fail(path + "/shard", "only a fused buffer (\"concat\" or \"interleave\") is sharded as a whole; "
                                  "shard a single tensor in its placement");
      }
      if (bj.contains("held")) {
        const std::string held = r.String(bj["held"], path + "/held");
        if (held != "transposed")
          r.Fail(path + "/held",
                 std::string("expected \"transposed\" (the framework holds the 2-D buffer as storage.t()), got '") +
                     held + "'");
        b.held_transposed = true;
      }
      if (bj.contains("shape")) b.shape = r.IntList(bj["shape"], path + "/shape", 1);
      if (bj.contains("dtype")) b.dtype = r.ParseDtype(bj["dtype"], path + "/dtype");
      if (bj.contains("quant")) b.quant = ParseQuant(r, bj["quant"], path, b);
      if (bj.contains("transform")) ParseTransform(r, bj["transform"], path, b, model, tensor_index, l.dtype);
      // A list of intervals on one dim makes one rule per interval.
      int split_dim = -1;
      std::vector<std::pair<int64_t, int64_t>> runs;
      if (bj.contains("range")) {
        const json& range = r.Object(bj["range"], path + "/range");
        if (range.empty()) r.Fail(path + "/range", "name at least one stack dim");
        const TensorSpec& t0 = model.tensors[tensor_index.at(b.parts[0])];
        for (auto it = range.begin(); it != range.end(); ++it) {
          const std::string rp = path + "/range/" + it.key();
          const int d = model.dim_index(it.key());
          if (d < 0 || std::find(t0.stack.begin(), t0.stack.end(), d) == t0.stack.end())
            r.Fail(rp, "'" + b.parts[0] + "' has no stack dim '" + it.key() + "'");
          const auto intervals = ParseIntervals(r, it.value(), rp, model.dims[d].second);
          if (intervals.size() > 1) {
            if (split_dim >= 0) r.Fail(rp, "only one stack dim may list several intervals");
            split_dim = d;
            runs = intervals;
          }
          b.range.emplace_back(d, intervals.front().first, intervals.back().second);
        }
      }
      if (bj.contains("at")) {
        const json& at = r.Object(bj["at"], path + "/at");
        if (at.empty()) r.Fail(path + "/at", "name at least one mesh axis");
        for (auto it = at.begin(); it != at.end(); ++it)
          b.at.emplace_back(it.key(), r.Int(it.value(), path + "/at/" + it.key(), -kMaxRanks, kMaxRanks));
      }
      // Every placeholder of the name must be a stack dim of the parts.
      for (const auto& p : ParseNameTemplate(b.name).dims) {
        int d = model.dim_index(p);
        const TensorSpec* t0 = &model.tensors[tensor_index.at(b.parts[0])];
        if (d < 0 || std::find(t0->stack.begin(), t0->stack.end(), d) == t0->stack.end())
          r.Fail(path + "/name", "placeholder '{" + p + "}' is not a stack dim of '" + b.parts[0] + "'");
      }
      if (split_dim < 0) {
        l.buffers.push_back(std::move(b));
        continue;
      }
      for (const auto& [lo, hi] : runs) {
        BufferRule piece = b;
        for (auto& [d, rlo, rhi] : piece.range)
          if (d == split_dim) rlo = lo, rhi = hi;
        l.buffers.push_back(std::move(piece));
      }
    }
  }
  // One offset per tensor: a sender reads, and a checker expects, the same
  // values from every buffer that holds it. A rule narrowed by "range" or
  // "at" leaves the rest of the tensor to other rules, or to default buffers
  // (offset 0). (A family of several intervals is several model tensors of
  // one name.)
  struct Held {
    float offset = 0;
    std::string path, transform_path;
    bool whole = false;
  };
  std::map<std::string, Held> held;
  for (const BufferRule& b : l.buffers) {
    for (const std::string& part : b.parts) {
      const std::string where = b.transform_path.empty() ? b.path : b.transform_path;
      auto [it, fresh] = held.try_emplace(part, Held{b.offset, where, b.transform_path, false});
      Held& h = it->second;
      h.whole = h.whole || (b.range.empty() && b.at.empty());
      if (!fresh && b.offset != h.offset) {
        auto say = [](float x) { return x == 0 ? std::string("none") : "offset " + FormatNumber(x); };
        r.Fail(where, "'" + part + "' is held with " + say(b.offset) + " here and with " + say(h.offset) + " by " +
                          h.path + "; every buffer of a tensor holds it with one offset");
      }
    }
  }
  for (const auto& [name, h] : held) {
    if (l.default_buffers && h.offset != 0 && !h.whole)
      r.Fail(h.transform_path, "'" + name +
                                   "' is held with an offset, but this rule is narrowed by \"range\" or \"at\" and "
                                   "the rest of the tensor falls to default buffers (no offset); every buffer of a "
                                   "tensor holds it with one offset");
  }
  l.offsets.assign(model.tensors.size(), 0.0f);
  l.offset_paths.assign(model.tensors.size(), "");
  for (size_t t = 0; t < model.tensors.size(); ++t) {
    auto it = held.find(model.tensors[t].name);
    if (it == held.end()) continue;
    l.offsets[t] = it->second.offset;
    l.offset_paths[t] = it->second.transform_path;
  }
  return l;
}

ClusterSpec ParseCluster(const json& root, const std::string& file) {
  Reader r(file);
  r.Format(root, "reshard.cluster/1");
  r.Keys(root, "", {"format", "name", "gpus_per_domain", "nic_gbps", "nvlink_GBps", "hbm_GBps", "nic_latency_us",
                    "nvlink_latency_us", "placement", "train_gpus_per_domain", "infer_gpus_per_domain",
                    "gpu_memory_GB", "sources", "notes"});
  ClusterSpec c;
  c.file = file;
  c.name = r.String(r.Get(root, "", "name"), "/name");
  c.gpus_per_domain = r.Int(r.Get(root, "", "gpus_per_domain"), "/gpus_per_domain", 1);
  c.nic_gbps = r.Number(r.Get(root, "", "nic_gbps"), "/nic_gbps");
  c.nvlink_GBps = r.Number(r.Get(root, "", "nvlink_GBps"), "/nvlink_GBps");
  if (root.contains("hbm_GBps")) c.hbm_GBps = r.Number(root["hbm_GBps"], "/hbm_GBps");
  if (root.contains("nic_latency_us")) c.nic_latency_us = r.Number(root["nic_latency_us"], "/nic_latency_us");
  if (root.contains("nvlink_latency_us")) c.nvlink_latency_us = r.Number(root["nvlink_latency_us"], "/nvlink_latency_us");
  if (root.contains("gpu_memory_GB")) c.gpu_memory_GB = r.Number(root["gpu_memory_GB"], "/gpu_memory_GB");
  if (root.contains("placement")) {
    std::string p = r.String(root["placement"], "/placement");
    if (p == "colocated") c.colocated = true;
    else if (p != "disjoint") r.Fail("/placement", "unknown placement '" + p + "', expected 'disjoint' or 'colocated'");
  }
  for (auto [key, field] : {std::pair{"train_gpus_per_domain", &c.train_per_domain},
                            std::pair{"infer_gpus_per_domain", &c.infer_per_domain}}) {
    if (!root.contains(key)) continue;
    const std::string path = std::string("/") + key;
    if (c.colocated) r.Fail(path, "only with \"placement\": \"disjoint\" (colocated ranks share every GPU)");
    *field = r.Int(root[key], path, 1);
    if (*field > c.gpus_per_domain)
      r.Fail(path, std::to_string(*field) + " is more than the " + std::to_string(c.gpus_per_domain) +
                       " GPUs of a domain (/gpus_per_domain)");
  }
  return c;
}

}  // namespace reshard
