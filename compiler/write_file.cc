#include "compiler/write_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/error.h"

namespace reshard {

namespace {

// Holds SIGINT, SIGTERM and SIGHUP for its lifetime; any that arrived are
// delivered when it ends (by the previous mask's rules).
class HeldSignals {
 public:
  HeldSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~HeldSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  HeldSignals(const HeldSignals&) = delete;
  HeldSignals& operator=(const HeldSignals&) = delete;

 private:
  sigset_t old_;
};

}  // namespace

void WriteFileAtomic(const std::string& path, const void* data, size_t size) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const HeldSignals held;
  auto fail = [&](int err, int fd) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(path + ": cannot write: " + std::strerror(err));
  };
  // Created as any new file is (0666 less the umask).
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw Error(path + ": cannot write: " + std::strerror(errno));
  const char* p = static_cast<const char*>(data);
  for (size_t off = 0; off < size;) {
    const ssize_t w = ::write(fd, p + off, size - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(w < 0 ? errno : EIO, fd);
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) fail(errno, fd);
  if (::close(fd) != 0) fail(errno, -1);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(errno, -1);
}

}  // namespace reshard
