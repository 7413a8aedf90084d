// reshard viz: the SVG and HTML parse as XML with one heatmap cell per rank
// (or NVLink domain) pair whose bytes add up to what `show` reports; large plans
// are drawn per domain; Chromium renders the report; errors leave no file.
#include <filesystem>
#include <set>

#include "tests/test_util.h"

namespace reshard::testing {
namespace {

using nlohmann::json;

// Parses an .svg or .html file with a real XML parser and reports the heatmap:
// cells, their summed data-net / data-nvlink bytes, and the other sections.
const char* kXmlCheck = R"PY(
import json, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
S = '{http://www.w3.org/2000/svg}'
H = '{http://www.w3.org/1999/xhtml}'
cells = [g for g in root.iter(S + 'g') if g.get('id') == 'cells']
assert len(cells) == 1, 'expected one heatmap'
rects = [c for c in cells[0] if c.tag == S + 'rect']
xy = set((r.get('x'), r.get('y')) for r in rects)
ids = [e.get('id') for e in root.iter() if e.get('id')]
external = [e.tag for e in root.iter() if e.tag in (H + 'script', H + 'link', H + 'img', S + 'image')]
tensor_rows = [t for t in root.iter(H + 'table') if t.get('id') == 'tensors']
print(json.dumps({
  'root': root.tag, 'cells': len(rects), 'distinct_positions': len(xy),
  'other_children': len(cells[0]) - len(rects),
  'net': sum(int(r.get('data-net', 0)) for r in rects),
  'nvlink': sum(int(r.get('data-nvlink', 0)) for r in rects),
  'nonzero': sum(1 for r in rects if r.get('data-net') is not None),
  'ids': ids, 'external': external,
  'tensor_rows': len(tensor_rows[0].findall(H + 'tr')) - 1 if tensor_rows else -1}))
)PY";

// Decodes an 8-bit RGB/RGBA PNG without PIL and reports how much is drawn.
const char* kPngCheck = R"PY(
import json, struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat = 8, b''
while pos < len(data):
  n, kind = struct.unpack('>I4s', data[pos:pos + 8])
  body = data[pos + 8:pos + 8 + n]
  if kind == b'IHDR': w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
  if kind == b'IDAT': idat += body
  pos += 12 + n
assert depth == 8 and ctype in (2, 6), (depth, ctype)
bpp = 3 if ctype == 2 else 4
raw, stride = zlib.decompress(idat), w * bpp
prev, i, colours, dark, total = bytearray(stride), 0, set(), 0, 0
for y in range(h):
  f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
  for x in range(stride):
    a = line[x - bpp] if x >= bpp else 0
    b = prev[x]; c = prev[x - bpp] if x >= bpp else 0
    if f == 1: line[x] = (line[x] + a) & 255
    elif f == 2: line[x] = (line[x] + b) & 255
    elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
    elif f == 4:
      p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
      line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
  prev = line
  for x in range(0, stride, bpp * 2):
    px = tuple(line[x:x + 3]); colours.add(px); total += 1
    dark += sum(px) < 600
print(json.dumps({'width': w, 'height': h, 'colours': len(colours), 'drawn': dark / max(total, 1)}))
)PY";

bool HavePython() { return HaveProgram("python3"); }

// Runs `reshard viz PLAN -o OUT ARGS...` and parses OUT with kXmlCheck.
json RenderAndParse(const TempDir& dir, const std::string& plan, const std::string& out,
                    const std::vector<std::string>& args = {}) {
  std::vector<std::string> cmd = {"viz", plan, "-o", out};
  cmd.insert(cmd.end(), args.begin(), args.end());
  Result r = Reshard(dir, cmd);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? Python(dir, kXmlCheck, {out}) : json::object();
}

TEST(VizTest, SvgHasOneCellPerRankPairAddingUpToShow) {
  if (!HavePython()) GTEST_SKIP() << "python3 not found (needed to parse the SVG)";
  TempDir dir;
  std::string plan = TinyDense(dir, "tiny.rsplan");
  json show = ShowJson(dir, plan);
  json x = RenderAndParse(dir, plan, dir.File("tiny.svg"));
  EXPECT_EQ(x["root"], "{http://www.w3.org/2000/svg}svg");
  EXPECT_EQ(x["cells"], 12 * 12);
  EXPECT_EQ(x["distinct_positions"], 12 * 12);
  EXPECT_EQ(x["other_children"], 0);
  EXPECT_EQ(x["net"], show["net"]["bytes"]);
  EXPECT_EQ(x["nvlink"], show["nvlink"]["bytes"]);
  EXPECT_GT(x["nonzero"].get<int>(), 0);
}

TEST(VizTest, HtmlIsSelfContainedXhtmlWithEverySection) {
  if (!HavePython()) GTEST_SKIP() << "python3 not found (needed to parse the HTML)";
  TempDir dir;
  std::string plan = TinyDense(dir, "tiny.rsplan", "infer.json", "../tests/data/nvl72-shared.json");
  json show = ShowJson(dir, plan);
  std::string out = dir.File("tiny.html");
  json x = RenderAndParse(dir, plan, out);
  EXPECT_EQ(x["root"], "{http://www.w3.org/1999/xhtml}html");
  EXPECT_EQ(x["cells"], 12 * 12);
  EXPECT_EQ(x["net"], show["net"]["bytes"]);
  EXPECT_EQ(x["nvlink"], show["nvlink"]["bytes"]);
  EXPECT_GT(x["nvlink"].get<uint64_t>(), 0u);
  std::set<std::string> ids = x["ids"].get<std::set<std::string>>();
  for (const char* id : {"cells", "nic-load", "nvlink-load", "rounds", "tensors"}) EXPECT_TRUE(ids.count(id)) << id;
  EXPECT_TRUE(x["external"].empty()) << x["external"].dump();
  EXPECT_EQ(x["tensor_rows"], 12);  // tiny-dense has 12 tensor families
  std::string html = ReadText(out);
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t p = html.find(what); p != std::string::npos; p = html.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("http"), count("xmlns=\"http://www.w3.org/")) << "no network references but XML namespaces";
  EXPECT_NE(html.find("(4,64,64):(4096,64,1)"), std::string::npos) << "tensor layouts in CuTe notation";
}

// kimi-k2: 1024 training + 512 inference GPUs on DGX H100 = 192 NVLink domains.
// Skipped under the sanitizers: the 1536-rank compile takes a minute there
// (the drawing code runs there on the other tests' smaller plans); every plain
// build runs it.
TEST(VizTest, LargePlanIsDrawnPerNvlinkDomain) {
#ifdef RESHARD_SANITIZE
  GTEST_SKIP() << "a 1536-rank compile: a minute under AddressSanitizer";
#endif
  if (!HavePython()) GTEST_SKIP() << "python3 not found (needed to parse the SVG)";
  TempDir dir;
  std::string plan = CompileSample(dir, "kimi.rsplan", "kimi-k2/model.json", "kimi-k2/train-1024.json",
                                   "kimi-k2/infer-512.json", "clusters/dgx-h100.json");
  json show = ShowJson(dir, plan);
  ASSERT_GE(show["ranks"].get<uint32_t>(), 512u);
  std::set<uint32_t> domains;
  for (const json& r : show["per_rank"]) domains.insert(r["domain"].get<uint32_t>());
  ASSERT_EQ(domains.size(), 192u);
  std::string svg = dir.File("kimi.svg"), html = dir.File("kimi.html"), dot = dir.File("kimi.dot");
  for (const std::string& out : {svg, html, dot}) {
    Result r = Reshard(dir, {"viz", plan, "-o", out});
    ASSERT_EQ(r.code, 0) << out << ": " << r.err;
  }
  for (const std::string& out : {svg, html}) {
    json x = Python(dir, kXmlCheck, {out});
    EXPECT_EQ(x["cells"], 192 * 192) << out;
    EXPECT_EQ(x["distinct_positions"], 192 * 192) << out;
    EXPECT_EQ(x["net"], show["net"]["bytes"]) << out;
    EXPECT_EQ(x["nvlink"], show["nvlink"]["bytes"]) << out;
  }
  std::string text = ReadText(dot);
  EXPECT_NE(text.find("d191 [label=\"domain 191\\nranks 1528-1535\"]"), std::string::npos);
  EXPECT_EQ(text.find(" r0 "), std::string::npos) << "ranks are aggregated";
}

TEST(VizTest, SmallPlanByDomainAndDot) {
  if (!HavePython()) GTEST_SKIP() << "python3 not found (needed to parse the SVG)";
  TempDir dir;
  std::string plan = TinyDense(dir, "tiny.rsplan");
  json show = ShowJson(dir, plan);
  json x = RenderAndParse(dir, plan, dir.File("d.svg"), {"--by", "domain"});
  EXPECT_EQ(x["cells"], 2 * 2);  // training domain and inference domain
  EXPECT_EQ(x["net"], show["net"]["bytes"]);

  Result r = Reshard(dir, {"viz", plan, "-o", dir.File("tiny.DOT")});
  ASSERT_EQ(r.code, 0) << r.err;
  std::string dot = ReadText(dir.File("tiny.DOT"));
  EXPECT_EQ(dot.rfind("digraph reshard {"), dot.find("digraph reshard {"));
  EXPECT_NE(dot.find("subgraph cluster_d0 {"), std::string::npos);
  EXPECT_NE(dot.find("subgraph cluster_d1 {"), std::string::npos);
  EXPECT_NE(dot.find("r8 [label=\"r8\\ninfer 0\"];"), std::string::npos) << dot;
  // One edge per sender, receiver and channel that carries bytes.
  size_t edges = 0;
  for (size_t p = dot.find(" -> r"); p != std::string::npos; p = dot.find(" -> r", p + 1)) ++edges;
  json cells = RenderAndParse(dir, plan, dir.File("r.svg"));
  // Across domains only the network, inside one only NVLink: one channel per pair.
  EXPECT_EQ(edges, cells["nonzero"].get<size_t>());
  if (HaveProgram("dot")) {
    Result g = Shell(dir, "dot -Tsvg " + Quote(dir.File("tiny.DOT")) + " -o " + Quote(dir.File("g.svg")));
    EXPECT_EQ(g.code, 0) << g.err;
  }
}

TEST(VizTest, ChromiumRendersTheReport) {
  std::string browser;
  for (const char* b : {"chromium", "chromium-browser", "google-chrome"})
    if (HaveProgram(b)) {
      browser = b;
      break;
    }
  if (browser.empty()) GTEST_SKIP() << "no chromium, chromium-browser or google-chrome on PATH";
  if (!HavePython()) GTEST_SKIP() << "python3 not found (needed to decode the screenshot)";
  TempDir dir;
  std::string plan = TinyDense(dir, "tiny.rsplan");
  std::string html = dir.File("tiny.html"), png = dir.File("shot.png");
  Result r = Reshard(dir, {"viz", plan, "-o", html});
  ASSERT_EQ(r.code, 0) << r.err;
  Result c = Shell(dir, "timeout 120 " + browser +
                            " --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run "
                            "--user-data-dir=" + Quote(dir.File("profile")) +
                            " --window-size=1000,900 --screenshot=" + Quote(png) + " " + Quote("file://" + html));
  ASSERT_TRUE(std::filesystem::exists(png)) << c.out << c.err;
  json x = Python(dir, kPngCheck, {png});
  EXPECT_EQ(x["width"], 1000);
  EXPECT_GT(x["colours"].get<int>(), 20) << x.dump();
  EXPECT_GT(x["drawn"].get<double>(), 0.01) << x.dump();
}

TEST(VizTest, ErrorsExitTwoAndLeaveNoFile) {
  TempDir dir;
  std::string plan = TinyDense(dir, "tiny.rsplan");
  auto files = [&] {
    std::set<std::string> s;
    for (auto& e : std::filesystem::directory_iterator(dir.path())) s.insert(e.path().filename().string());
    return s;
  };
  const std::set<std::string> before = files();

  Result ext = Reshard(dir, {"viz", plan, "-o", dir.File("out.png")});
  EXPECT_EQ(ext.code, 2);
  EXPECT_EQ(ext.err, "reshard: error: " + dir.File("out.png") +
                         ": unknown output type '.png', expected .html, .svg or .dot\n");
  Result none = Reshard(dir, {"viz", plan, "-o", dir.File("noext")});
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("unknown output type ''"), std::string::npos) << none.err;

  Result missing = Reshard(dir, {"viz", dir.File("nope.rsplan"), "-o", dir.File("out.html")});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("nope.rsplan"), std::string::npos) << missing.err;

  std::string not_plan = dir.File("spec.rsplan");
  std::ofstream(not_plan) << ReadText(Sample("tiny-dense/infer.json"));
  Result bad = Reshard(dir, {"viz", not_plan, "-o", dir.File("out.svg")});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("reshard: error: " + not_plan + ":"), std::string::npos) << bad.err;

  // A path below a regular file cannot be created (even by root).
  Result unwritable = Reshard(dir, {"viz", plan, "-o", dir.File("tiny.rsplan/out.html")});
  EXPECT_EQ(unwritable.code, 2);
  EXPECT_NE(unwritable.err.find("out.html: cannot write: Not a directory"), std::string::npos) << unwritable.err;
  Result no_dir = Reshard(dir, {"viz", plan, "-o", dir.File("missing/out.dot")});
  EXPECT_EQ(no_dir.code, 2);
  EXPECT_NE(no_dir.err.find("out.dot: cannot write: No such file or directory"), std::string::npos) << no_dir.err;

  std::set<std::string> after = files();
  after.erase("spec.rsplan");
  EXPECT_EQ(after, before) << "a failed viz leaves no file behind";

  // A failure keeps an existing output as it was.
  std::string keep = dir.File("keep.svg");
  std::ofstream(keep) << "old";
  Result again = Reshard(dir, {"viz", not_plan, "-o", keep});
  EXPECT_EQ(again.code, 2);
  EXPECT_EQ(ReadText(keep), "old");
}

TEST(VizTest, HelpTeachesWithAnExample) {
  TempDir dir;
  Result r = Reshard(dir, {"viz", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("reshard viz qwen3.rsplan -o qwen3.html"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(".dot"), std::string::npos);
}

}  // namespace
}  // namespace reshard::testing
