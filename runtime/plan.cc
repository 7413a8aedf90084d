#include "runtime/plan.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>

#include <zstd.h>

#include "runtime/error.h"
#include "runtime/plan_check.h"

namespace reshard {
namespace {

// The flatbuffers verifier asserts buffers are below 2 GiB; refuse them first.
constexpr uint64_t kMaxPlanBytes = (uint64_t{1} << 31) - 1;

// Four identifier bytes, printable ones as-is, the rest as \xNN.
std::string Printable(const uint8_t* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f) {
      out += static_cast<char>(p[i]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      out += buf;
    }
  }
  return out;
}

}  // namespace

size_t DtypeSize(fb::Dtype d) {
  switch (d) {
    case fb::Dtype::bf16:
    case fb::Dtype::fp16:
      return 2;
    case fb::Dtype::fp32:
      return 4;
    case fb::Dtype::fp8_e4m3:
    case fb::Dtype::e8m0:
      return 1;
  }
  return 0;
}

const char* DtypeName(fb::Dtype d) {
  static thread_local char buf[32];
  if (static_cast<unsigned>(d) <= static_cast<unsigned>(fb::Dtype::MAX)) return fb::EnumNameDtype(d);
  std::snprintf(buf, sizeof buf, "dtype(%u)", static_cast<unsigned>(d));
  return buf;
}

const char* StepKindName(fb::StepKind k) {
  static thread_local char buf[32];
  if (static_cast<unsigned>(k) <= static_cast<unsigned>(fb::StepKind::MAX)) {
    return fb::EnumNameStepKind(k);
  }
  std::snprintf(buf, sizeof buf, "kind(%u)", static_cast<unsigned>(k));
  return buf;
}

const char* QuantKindName(fb::QuantKind k) {
  static thread_local char buf[32];
  if (static_cast<unsigned>(k) <= static_cast<unsigned>(fb::QuantKind::MAX)) return fb::EnumNameQuantKind(k);
  std::snprintf(buf, sizeof buf, "quant(%u)", static_cast<unsigned>(k));
  return buf;
}

uint64_t RegionElements(const fb::Region& r) {
  uint64_t n = 1;
  int ndim = r.ndim() > 4 ? 4 : r.ndim();
  for (int k = 0; k < ndim; ++k) {
    const uint64_t s = r.shape()->Get(k);
    if (s != 0 && n > UINT64_MAX / s) return UINT64_MAX;
    n *= s;
  }
  return n;
}

uint64_t BufferElements(const fb::Buffer& b) {
  uint64_t n = 1;
  if (b.shape() == nullptr) return 0;
  for (uint64_t s : *b.shape()) {
    if (s != 0 && n > UINT64_MAX / s) return UINT64_MAX;
    n *= s;
  }
  return n;
}

std::string FormatRegion(const fb::Region& r) {
  int ndim = r.ndim() > 4 ? 4 : r.ndim();
  std::string s = "(";
  for (int k = 0; k < ndim; ++k) {
    if (k) s += ",";
    s += std::to_string(r.shape()->Get(k));
  }
  s += "):(";
  for (int k = 0; k < ndim; ++k) {
    if (k) s += ",";
    if (r.buffer_modes() & (1u << k)) s += "b";
    s += std::to_string(r.stride()->Get(k));
  }
  return s + ")";
}

struct Plan::Impl {
  std::string path;
  const uint8_t* data = nullptr;
  size_t size = 0;
  void* map = nullptr;          // mmap'ed file, or null
  std::vector<uint8_t> owned;   // from_bytes
  std::mutex mu;
  std::vector<uint8_t> checked;  // per rank: 1 once program(r) passed its checks
  std::vector<uint32_t> active;   // active_ranks(), filled once under mu
  std::vector<int64_t> process;   // plan rank -> index in active, -1 idle
  bool active_known = false;
  ContentDigest digest;           // computed (plans without the field), under mu
  bool digest_computed = false;
  // Per rank: its packed program decompressed (schema 2), once, under mu;
  // kept while the plan lives (program() hands out references into it).
  std::vector<std::unique_ptr<std::vector<uint8_t>>> unpacked;

  // Rank r's packed program, decompressed and verified as a FlatBuffer of its own.
  const fb::Program* Unpack(uint32_t r, const flatbuffers::Vector<uint8_t>& packed);

  ~Impl() {
    if (map != nullptr) munmap(map, size);
  }

  [[noreturn]] void Fail(const std::string& what) const { throw Error(path + ": " + what); }

  void CheckRoot();
};

void Plan::Impl::CheckRoot() {
  if (size < 8) Fail("file is " + std::to_string(size) + " bytes, too small to be a plan");
  if (size > kMaxPlanBytes) {
    Fail("file is " + std::to_string(size) + " bytes, larger than the 2 GiB a plan may have");
  }
  if (!flatbuffers::BufferHasIdentifier(data, fb::PlanIdentifier())) {
    Fail("not a reshard plan (file identifier is '" +
         Printable(data + sizeof(flatbuffers::uoffset_t), flatbuffers::kFileIdentifierLength) +
         "', expected 'RSPL')");
  }
  // The verifier runs before any field is read: a newer schema version still
  // verifies (fields are only ever added), so the version message below stays
  // accurate while a damaged file is reported as such.
  flatbuffers::Verifier verifier(data, size);
  if (!fb::VerifyPlanBuffer(verifier)) {
    Fail("the file is damaged or truncated (flatbuffers verification failed)");
  }
  const fb::Plan* root = fb::GetPlan(data);
  if (root->schema_version() < kOldestSchemaVersion || root->schema_version() > kSchemaVersion) {
    Fail("schema version " + std::to_string(root->schema_version()) + ", this reshard reads versions " +
         std::to_string(kOldestSchemaVersion) + " to " + std::to_string(kSchemaVersion));
  }
  uint32_t programs = root->programs() ? root->programs()->size() : 0;
  if (programs != root->num_ranks()) {
    Fail("the plan has " + std::to_string(root->num_ranks()) + " ranks but " + std::to_string(programs) +
         " programs");
  }
  CheckPlanTables(*root, path);
  checked.assign(root->num_ranks(), 0);
  unpacked.resize(root->num_ranks());
}

const fb::Program* Plan::Impl::Unpack(uint32_t r, const flatbuffers::Vector<uint8_t>& packed) {
  const std::string at = "rank " + std::to_string(r) + ": its packed program ";
  const unsigned long long size = ZSTD_getFrameContentSize(packed.data(), packed.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) Fail(at + "is not a zstd frame (the file is damaged)");
  // A program compresses a few times over; a frame that claims far more (a
  // damaged or crafted size) is refused before anything is allocated for it.
  const uint64_t most = std::min<uint64_t>(kMaxPlanBytes, uint64_t{4096} * packed.size() + (uint64_t{1} << 20));
  if (size < 8 || size > most) Fail(at + "would be " + std::to_string(size) + " bytes (the file is damaged)");
  auto out = std::make_unique<std::vector<uint8_t>>(size);
  const size_t n = ZSTD_decompress(out->data(), out->size(), packed.data(), packed.size());
  if (ZSTD_isError(n) || n != size) {
    Fail(at + "does not decompress (" + std::string(ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short") +
         "): the file is damaged");
  }
  flatbuffers::Verifier verifier(out->data(), out->size());
  if (!verifier.VerifyBuffer<fb::Program>(nullptr)) Fail(at + "fails flatbuffers verification (the file is damaged)");
  const fb::Program* p = flatbuffers::GetRoot<fb::Program>(out->data());
  if (p->packed() != nullptr || p->rank() != r) Fail(at + "is not rank " + std::to_string(r) + "'s program");
  unpacked[r] = std::move(out);
  return p;
}

Plan::Plan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Plan::Plan(Plan&& other) noexcept = default;
Plan& Plan::operator=(Plan&& other) noexcept = default;
Plan::~Plan() = default;

Plan Plan::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) impl->Fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    impl->Fail(std::string("cannot stat: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    impl->Fail("not a regular file");
  }
  impl->size = static_cast<size_t>(st.st_size);
  if (impl->size < 8 || impl->size > kMaxPlanBytes) {
    ::close(fd);
    impl->CheckRoot();  // throws the size message
  }
  void* map = mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (map == MAP_FAILED) impl->Fail(std::string("cannot map: ") + std::strerror(e));
  impl->map = map;
  impl->data = static_cast<const uint8_t*>(map);
  impl->CheckRoot();
  return Plan(std::move(impl));
}

Plan Plan::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->owned = std::move(bytes);
  impl->data = impl->owned.data();
  impl->size = impl->owned.size();
  impl->CheckRoot();
  return Plan(std::move(impl));
}

const fb::Plan& Plan::root() const { return *fb::GetPlan(impl_->data); }
uint32_t Plan::num_ranks() const { return root().num_ranks(); }
const std::string& Plan::path() const { return impl_->path; }
size_t Plan::size_bytes() const { return impl_->size; }

const std::vector<uint32_t>& Plan::active_ranks() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->active_known) {
    // The verifier has checked every program's structure; these fields need no more.
    const uint32_t n = num_ranks();
    impl_->process.assign(n, -1);
    for (uint32_t r = 0; r < n; ++r) {
      const fb::Program* p = root().programs()->Get(r);
      const bool used = p->src_rank() >= 0 || p->dst_rank() >= 0 || (p->buffers() && p->buffers()->size() > 0) ||
                        (p->steps() && p->steps()->size() > 0) || p->packed() != nullptr;
      if (!used) continue;
      impl_->process[r] = static_cast<int64_t>(impl_->active.size());
      impl_->active.push_back(r);
    }
    impl_->active_known = true;
  }
  return impl_->active;
}

int64_t Plan::process_of(uint32_t plan_rank) const {
  active_ranks();
  return plan_rank < impl_->process.size() ? impl_->process[plan_rank] : -1;
}

bool Plan::carries_content_digest() const { return root().content_digest() != nullptr; }

ContentDigest Plan::content_digest() const {
  if (const fb::Digest128* d = root().content_digest()) return {d->hi(), d->lo()};
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->digest_computed) {
    impl_->digest = DigestBytes(impl_->data, impl_->size);
    impl_->digest_computed = true;
  }
  return impl_->digest;
}

std::string Plan::check_content_digest() const {
  const fb::Digest128* d = root().content_digest();
  if (d == nullptr) return "";
  const size_t at = reinterpret_cast<const uint8_t*>(d) - impl_->data;
  const ContentDigest stored{d->hi(), d->lo()}, actual = DigestBytes(impl_->data, impl_->size, at);
  if (stored == actual) return "";
  return "the file carries content digest " + stored.hex() + " but its bytes hash to " + actual.hex() +
         " (edited or damaged after it was written)";
}

const fb::Program& Plan::program(uint32_t global_rank) const {
  const uint32_t n = num_ranks();
  if (global_rank >= n) {
    impl_->Fail("rank " + std::to_string(global_rank) + " out of range (the plan has " + std::to_string(n) +
                " ranks)");
  }
  // The verifier already checked every program's structure when the plan was
  // opened; what is left is the semantic check of this rank's program.
  const fb::Program* program = root().programs()->Get(global_rank);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (const auto& u = impl_->unpacked[global_rank]) program = flatbuffers::GetRoot<fb::Program>(u->data());
  if (impl_->checked[global_rank]) return *program;
  if (program->packed() != nullptr) program = impl_->Unpack(global_rank, *program->packed());
  CheckProgram(root(), global_rank, *program, impl_->path);
  impl_->checked[global_rank] = 1;
  return *program;
}

}  // namespace reshard
