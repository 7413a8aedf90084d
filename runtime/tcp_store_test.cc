// The TCP rendezvous: address parsing, a Gloo mesh meeting through it, and
// the errors of a missing server, a missing rank and a taken port.
#include "runtime/tcp_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "runtime/error.h"
#include "runtime/gloo_transport.h"
#include "runtime/reshard.h"
#include "runtime/synthetic.h"
#include "runtime/test.h"

namespace reshard {
namespace {

using testing::BuildPlan;
using testing::ForwardPlan;
using testing::RunRanks;

// A port nobody listens on right now.
uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A loopback port bound and held but not listening: connecting to it is
// refused for as long as it lives, and no other process can serve on it.
// (A port FreePort found free could be taken by a test running beside this
// one before the connect: the sanitizer stage once saw "the server closed
// the connection" where "Connection refused" was expected.)
class ClosedPort {
 public:
  ClosedPort() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~ClosedPort() { close(fd_); }
  ClosedPort(const ClosedPort&) = delete;
  ClosedPort& operator=(const ClosedPort&) = delete;
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_;
  uint16_t port_ = 0;
};

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TcpStoreTest, ParsesAddresses) {
  EXPECT_TRUE(IsHostPort("10.0.0.1:29500"));
  EXPECT_TRUE(IsHostPort("node-1:29500"));
  EXPECT_TRUE(IsHostPort("[::1]:29500"));
  EXPECT_FALSE(IsHostPort("/tmp/store"));
  EXPECT_FALSE(IsHostPort("store"));
  EXPECT_FALSE(IsHostPort("./a:1"));
  HostPort hp = ParseHostPort("[::1]:29500", "x");
  EXPECT_EQ(hp.host, "::1");
  EXPECT_EQ(hp.port, 29500);
  EXPECT_EQ(ErrorOf([] { ParseHostPort("host", "--rendezvous"); }), "--rendezvous: 'host' is not HOST:PORT");
  EXPECT_EQ(ErrorOf([] { ParseHostPort("host:70000", "--rendezvous"); }),
            "--rendezvous: 'host:70000' has no valid port (1-65535)");
}

TEST(TcpStoreTest, SetGetWaitAcrossProcesses) {
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  auto out = RunRanks(3, [&](int r) -> std::string {
    std::unique_ptr<TcpStore> s = r == 0 ? TcpStore::Serve(addr, 2, std::chrono::seconds(10))
                                         : TcpStore::Connect(addr, r, std::chrono::seconds(10));
    s->set("k" + std::to_string(r), std::vector<char>(100000, static_cast<char>('a' + r)));
    s->wait({"k0", "k1", "k2"});
    for (int k = 0; k < 3; ++k) {
      std::vector<char> v = s->get("k" + std::to_string(k));
      if (v != std::vector<char>(100000, static_cast<char>('a' + k))) return "wrong value of k" + std::to_string(k);
    }
    return "";
  });
  for (size_t r = 0; r < out.size(); ++r) EXPECT_EQ(out[r].exit_code, 0) << "rank " << r << ": " << out[r].message;
}

TEST(TcpStoreTest, GlooMeshMeetsThroughTcp) {
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  std::vector<uint8_t> bytes = BuildPlan(ForwardPlan());
  auto out = RunRanks(4, [&](int r) -> std::string {
    Plan plan = Plan::from_bytes(bytes, "p.rsplan");
    GlooOptions options;
    options.rendezvous = addr;
    options.timeout = std::chrono::seconds(20);
    GlooTransport transport(static_cast<uint32_t>(r), plan.num_ranks(), options);
    SyntheticRun run = RunSynthetic(plan, static_cast<uint32_t>(r), transport);
    return run.check.wrong == 0 ? "" : std::to_string(run.check.wrong) + " wrong";
  });
  for (size_t r = 0; r < out.size(); ++r) EXPECT_EQ(out[r].exit_code, 0) << "rank " << r << ": " << out[r].message;
}

TEST(TcpStoreTest, NoServerIsAClearError) {
  const ClosedPort closed;
  const std::string addr = closed.addr();
  EXPECT_EQ(ErrorOf([&] { TcpStore::Connect(addr, 1, std::chrono::milliseconds(300)); }),
            "rendezvous: cannot connect to '" + addr + "' within 0.3 s: Connection refused");
}

TEST(TcpStoreTest, MissingKeyTimesOutNamingIt) {
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  auto server = TcpStore::Serve(addr, 0, std::chrono::milliseconds(300));
  auto client = TcpStore::Connect(addr, 1, std::chrono::milliseconds(300));
  EXPECT_EQ(ErrorOf([&] { client->get("rank/3"); }),
            "rendezvous '" + addr + "': timed out after 0.3 s waiting for key 'rank/3' (a rank has not arrived)");
  EXPECT_EQ(ErrorOf([&] { server->get("rank/3"); }),
            "rendezvous '" + addr + "': timed out after 0.3 s waiting for key 'rank/3' (a rank has not arrived)");
  // Serving three clients of which one came: the serving rank names the others.
  const std::string addr3 = "127.0.0.1:" + std::to_string(FreePort());
  auto server3 = TcpStore::Serve(addr3, 3, std::chrono::milliseconds(300));
  auto client1 = TcpStore::Connect(addr3, 1, std::chrono::milliseconds(300));
  client1->set("rank/1", {'x'});  // its hello has been read once its first request is answered
  EXPECT_EQ(ErrorOf([&] { server3->get("rank/3"); }),
            "rendezvous '" + addr3 +
                "': timed out after 0.3 s waiting for key 'rank/3' (a rank has not arrived; ranks 2, 3 never connected)");
  client1.reset();
}

TEST(TcpStoreTest, TakenPortIsAClearError) {
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  auto server = TcpStore::Serve(addr, 0, std::chrono::milliseconds(100));
  EXPECT_EQ(ErrorOf([&] { TcpStore::Serve(addr, 0, std::chrono::milliseconds(100)); }),
            "rendezvous: cannot listen on '" + addr + "': Address already in use");
}

TEST(TcpStoreTest, GlooNamesTheRendezvousWhenARankIsMissing) {
  const ClosedPort closed;
  const std::string addr = closed.addr();
  GlooOptions options;
  options.rendezvous = addr;
  options.timeout = std::chrono::milliseconds(500);
  std::string e = ErrorOf([&] { GlooTransport t(1, 2, options); });
  EXPECT_EQ(e, "rank 1: gloo: cannot connect 2 ranks through '" + addr +
                   "' within 0.5 s: rendezvous: cannot connect to '" + addr + "' within 0.5 s: Connection refused");
}

TEST(TcpStoreTest, CApiMeetsThroughTcpAndBarriers) {
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  auto out = RunRanks(3, [&](int r) -> std::string {
    reshard_transport* t = reshard_gloo_transport_create_tcp(static_cast<uint32_t>(r), 3, addr.c_str(), "capi",
                                                             nullptr, 20);
    if (t == nullptr) return reshard_last_error();
    if (reshard_transport_barrier(t) != 0) return reshard_last_error();
    reshard_transport_destroy(t);
    return "";
  });
  for (size_t r = 0; r < out.size(); ++r) EXPECT_EQ(out[r].exit_code, 0) << "rank " << r << ": " << out[r].message;
  EXPECT_EQ(reshard_gloo_transport_create_tcp(0, 2, "/tmp/dir", nullptr, nullptr, 1), nullptr);
  EXPECT_STREQ(reshard_last_error(), "host_port: '/tmp/dir' is not HOST:PORT");
  EXPECT_EQ(reshard_transport_barrier(nullptr), -1);
}

}  // namespace
}  // namespace reshard
