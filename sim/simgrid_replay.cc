// The SimGrid replay of a plan's workload (sim/simulate.h: Simulate). Built
// into a module of its own, libreshard_simgrid.so, that Simulate loads on
// first use (sim/simulate.cc): linked in, SimGrid and the ns-3 libraries it
// brings would be loaded and bound at the start of every reshard command.
#include "sim/simulate.h"

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <chrono>
#include <memory>

#include <nlohmann/json.hpp>

#include "compiler/compile.h"
#include "compiler/write_file.h"
#include "runtime/error.h"

namespace sg4 = simgrid::s4u;

namespace reshard::sim {

SimResult Replay(const Workload& w, const ClusterSpec& cluster, const SimOptions& opt);

namespace {

// One slice of the timeline: a rank's local work, or its transfers of one
// round on one path (from posting them to the last completion).
struct Slice {
  uint32_t rank, round;
  uint8_t track;  // 0 HBM (pack/copy, unpack), 1 net, 2 nvlink
  bool unpack;
  double t0, t1;
  uint64_t bytes;
};

struct Shared {
  const Workload* w = nullptr;
  LinkModel m;
  bool trace = false;
  std::vector<std::vector<Slice>> slices;  // per rank (each actor writes its own)
  uint32_t done = 0;
  double hbm_seconds = 0;
  uint32_t hbm_rank = 0;
  uint64_t comms = 0;
  uint32_t overlap_depth = 0;  // SimOptions'
};

// A pair's messages on one path meet in order in one mailbox; with rounds
// overlapping (SimOptions::overlap_depth), in one mailbox per round, as the
// runtime's message numbers would match them.
sg4::Mailbox* MailboxOf(uint32_t src, uint32_t dst, Path p, const Shared& sh, uint32_t round) {
  std::string name = std::to_string(src) + (p == Path::net ? ">" : "~") + std::to_string(dst);
  if (sh.overlap_depth > 0) name += "@" + std::to_string(round);
  return sg4::Mailbox::by_name(name);
}

char g_payload;  // what every simulated message "carries"

// One round's messages on one path, posted and not yet waited for.
struct Posted {
  std::vector<sg4::CommPtr> comms;
  std::vector<void*> sinks;
  double t0 = 0;
  uint64_t bytes = 0;
};

// Which of a round's messages Post posts.
enum class Part { all, unforwarded, forwarded };

// Posts one round's messages on one path: receives first, as the executor
// does (Part::forwarded: only sends that forward, Part::unforwarded: the rest).
void Post(Shared& sh, uint32_t g, const RankRound& rr, Path p, Posted& out, Part part = Part::all) {
  const std::vector<Message>& list = p == Path::net ? rr.net : rr.nvlink;
  out.comms.clear();
  out.sinks.assign(list.size(), nullptr);
  out.comms.reserve(list.size());
  out.t0 = sg4::Engine::get_clock();
  out.bytes = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < list.size(); ++i) {
      const Message& msg = list[i];
      if (msg.send != (pass == 1)) continue;
      if (part != Part::all && (msg.send && msg.forwarded > 0) != (part == Part::forwarded)) continue;
      if (msg.send) {
        out.comms.push_back(MailboxOf(g, msg.peer, p, sh, rr.round)->put_async(&g_payload, msg.bytes));
        out.bytes += msg.bytes;
      } else {
        out.comms.push_back(MailboxOf(msg.peer, g, p, sh, rr.round)->get_async<void>(&out.sinks[i]));
      }
    }
  }
  sh.comms += out.comms.size();
}

void Land(Shared& sh, uint32_t g, const RankRound& rr, Path p, Posted& posted) {
  sg4::Comm::wait_all(posted.comms);
  if (sh.trace) {
    sh.slices[g].push_back({g, rr.round, static_cast<uint8_t>(p == Path::net ? 1 : 2), false, posted.t0,
                            sg4::Engine::get_clock(), posted.bytes});
  }
}

// Rank g's HBM work took `hbm` seconds: the busiest so far (ties: the lowest rank)?
void Busiest(Shared& sh, uint32_t g, double hbm) {
  if (hbm > sh.hbm_seconds || (hbm == sh.hbm_seconds && hbm > 0 && g < sh.hbm_rank)) sh.hbm_seconds = hbm, sh.hbm_rank = g;
}

void Local(Shared& sh, uint32_t g, uint32_t round, uint64_t bytes, bool unpack, double& hbm) {
  if (!bytes) return;
  const double t0 = sg4::Engine::get_clock();
  const double secs = 2.0 * static_cast<double>(bytes) / sh.m.hbm_Bps;  // read once, written once
  sg4::this_actor::sleep_for(secs);
  hbm += secs;
  if (sh.trace) sh.slices[g].push_back({g, round, 0, unpack, t0, t0 + secs, bytes});
}

// A rank, as runtime/executor.cc runs it: per round, its local work (unless
// it ran early), both paths' transfers (the NVLink ones by a helper actor on
// the rank's NVLink host, so the two overlap) and, while they fly, the
// previous round's late unpacks and the next round's early packs; then its
// unpacks unless they run late.
void RankActor(Shared* sh, uint32_t g, sg4::Host* nvhost) {
  const std::vector<RankRound>& rounds = sh->w->ranks[g];
  sg4::SemaphorePtr go, done;
  bool has_nv = std::any_of(rounds.begin(), rounds.end(), [](const RankRound& r) { return !r.nvlink.empty(); });
  if (has_nv) {
    go = sg4::Semaphore::create(0);
    done = sg4::Semaphore::create(0);
    sg4::Actor::create("nv" + std::to_string(g), nvhost, [sh, g, go, done, &rounds] {
      for (const RankRound& rr : rounds) {
        if (rr.nvlink.empty()) continue;
        go->acquire();
        Posted posted;
        Post(*sh, g, rr, Path::nvlink, posted);
        Land(*sh, g, rr, Path::nvlink, posted);
        done->release();
      }
    });
  }
  double hbm = 0;
  std::vector<uint8_t> packed(rounds.size(), 0);
  for (size_t k = 0; k < rounds.size(); ++k) {
    const RankRound& rr = rounds[k];
    if (!packed[k]) Local(*sh, g, rr.round, rr.local_bytes, false, hbm);
    const bool late_prev = k > 0 && rounds[k - 1].late_unpack;
    const bool early_next = k + 1 < rounds.size() && rounds[k + 1].early_pack;
    const bool comm = !rr.net.empty() || !rr.nvlink.empty();
    if (comm) {
      Posted net;
      if (!rr.nvlink.empty()) go->release();
      if (!rr.net.empty()) Post(*sh, g, rr, Path::net, net);
      if (late_prev) Local(*sh, g, rounds[k - 1].round, rounds[k - 1].unpack_bytes, true, hbm);
      if (early_next) {
        Local(*sh, g, rounds[k + 1].round, rounds[k + 1].local_bytes, false, hbm);
        packed[k + 1] = 1;
      }
      if (!rr.net.empty()) Land(*sh, g, rr, Path::net, net);
      if (!rr.nvlink.empty()) done->acquire();
    } else if (late_prev) {
      Local(*sh, g, rounds[k - 1].round, rounds[k - 1].unpack_bytes, true, hbm);
    }
    if (!(k + 1 < rounds.size() && rr.late_unpack)) Local(*sh, g, rr.round, rr.unpack_bytes, true, hbm);
  }
  Busiest(*sh, g, hbm);
  ++sh->done;
}

// A rank as SimOptions::overlap_depth asks (not what the runtime does):
// each path on its own actor keeps up to `depth` rounds in flight; a round's
// forwarding sends wait until every earlier round of the rank landed on
// both paths (what they forward was received there).
void OverlappedRankActor(Shared* sh, uint32_t g, sg4::Host* nvhost) {
  const std::vector<RankRound>& rounds = sh->w->ranks[g];
  struct Landing {
    sg4::MutexPtr mutex = sg4::Mutex::create();
    sg4::ConditionVariablePtr landed = sg4::ConditionVariable::create();
    std::vector<uint8_t> paths_left;  // per listed round: paths not yet landed
    size_t first_open = 0;            // rounds before it landed on both paths
  };
  auto landing = std::make_shared<Landing>();
  for (const RankRound& rr : rounds) landing->paths_left.push_back(!rr.net.empty() + !rr.nvlink.empty());
  auto advance = [landing] {
    while (landing->first_open < landing->paths_left.size() && landing->paths_left[landing->first_open] == 0)
      ++landing->first_open;
  };
  advance();
  auto path_actor = [sh, g, &rounds, landing, advance](Path p) {
    // The rounds this actor takes: NVLink's those with NVLink messages, the
    // NIC's all (it runs the local work).
    std::vector<size_t> mine;
    for (size_t k = 0; k < rounds.size(); ++k)
      if (p == Path::net || !rounds[k].nvlink.empty()) mine.push_back(k);
    std::vector<Posted> early(mine.size()), late(mine.size());
    double hbm = 0;
    const bool nic = p == Path::net;
    auto post_early = [&](size_t j) {
      const RankRound& rr = rounds[mine[j]];
      if (nic) Local(*sh, g, rr.round, rr.local_bytes, false, hbm);
      Post(*sh, g, rr, p, early[j], Part::unforwarded);
    };
    auto post_late = [&](size_t j) {
      {
        std::unique_lock<sg4::Mutex> lock(*landing->mutex);
        while (landing->first_open < mine[j]) landing->landed->wait(lock);
      }
      Post(*sh, g, rounds[mine[j]], p, late[j], Part::forwarded);
    };
    for (size_t j = 0; j < mine.size() && j < sh->overlap_depth; ++j) post_early(j);
    if (!mine.empty()) post_late(0);
    for (size_t i = 0; i < mine.size(); ++i) {
      const RankRound& rr = rounds[mine[i]];
      sg4::Comm::wait_all(early[i].comms);
      sg4::Comm::wait_all(late[i].comms);
      if (sh->trace && !(nic ? rr.net : rr.nvlink).empty()) {
        sh->slices[g].push_back({g, rr.round, static_cast<uint8_t>(nic ? 1 : 2), false, early[i].t0,
                                 sg4::Engine::get_clock(), early[i].bytes + late[i].bytes});
      }
      if (!(nic ? rr.net : rr.nvlink).empty()) {
        std::unique_lock<sg4::Mutex> lock(*landing->mutex);
        --landing->paths_left[mine[i]];
        advance();
        landing->landed->notify_all();
      }
      if (i + 1 < mine.size()) post_late(i + 1);
      if (nic) Local(*sh, g, rr.round, rr.unpack_bytes, true, hbm);
      if (i + sh->overlap_depth < mine.size()) post_early(i + sh->overlap_depth);
    }
    if (nic) Busiest(*sh, g, hbm);
  };
  const bool has_nv = std::any_of(rounds.begin(), rounds.end(), [](const RankRound& r) { return !r.nvlink.empty(); });
  if (has_nv) sg4::Actor::create("nv" + std::to_string(g), nvhost, [path_actor] { path_actor(Path::nvlink); });
  path_actor(Path::net);
  ++sh->done;
}

void WriteTrace(const Shared& sh, const std::string& path, const ClusterSpec& cluster) {
  nlohmann::json events = nlohmann::json::array();
  static const char* tracks[] = {"HBM (pack, copy, unpack)", "net", "nvlink"};
  for (uint32_t g = 0; g < sh.w->num_ranks; ++g) {
    if (sh.w->ranks[g].empty()) continue;
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", g},
                      {"args", {{"name", "rank " + std::to_string(g) + " (domain " +
                                             std::to_string(sh.w->domain[g]) + ")"}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", g}, {"args", {{"sort_index", g}}}});
    for (int t = 0; t < 3; ++t) {
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", g}, {"tid", t}, {"args", {{"name", tracks[t]}}}});
    }
    for (const Slice& s : sh.slices[g]) {
      std::string name = s.track == 0 ? (s.unpack ? "unpack" : "pack") : (s.track == 1 ? "net" : "nvlink");
      name += " r" + std::to_string(s.round);
      events.push_back({{"ph", "X"}, {"name", name}, {"cat", tracks[s.track]}, {"pid", g}, {"tid", s.track},
                        {"ts", s.t0 * 1e6}, {"dur", (s.t1 - s.t0) * 1e6},
                        {"args", {{"round", s.round}, {"bytes", s.bytes}}}});
    }
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ms"},
                        {"otherData", {{"tool", "reshard simulate"}, {"cluster", cluster.name}}}};
  const std::string text = doc.dump();
  WriteFileAtomic(path, std::vector<uint8_t>(text.begin(), text.end()));
}

}  // namespace

SimResult Replay(const Workload& w, const ClusterSpec& cluster, const SimOptions& opt) {
  const auto wall0 = std::chrono::steady_clock::now();
  Shared sh;
  sh.w = &w;
  sh.m = LinkModel::Of(cluster);
  sh.trace = !opt.trace_path.empty();
  sh.overlap_depth = opt.overlap_depth;
  sh.slices.resize(w.num_ranks);
  if (sh.m.nic_Bps <= 0 || sh.m.nvlink_Bps <= 0 || sh.m.hbm_Bps <= 0) throw Error("cluster bandwidths must be > 0");

  // CM02 is the plain max-min flow model: no TCP window bound, no empirical
  // latency/bandwidth factors, no cross traffic of acknowledgements.
  std::vector<std::string> args = {"reshard-simulate",
                                   "--cfg=network/model:CM02",
                                   "--cfg=network/TCP-gamma:1e18",
                                   "--cfg=network/crosstraffic:0",
                                   "--cfg=network/latency-factor:1",
                                   "--cfg=network/bandwidth-factor:1",
                                   "--cfg=network/weight-S:0",
                                   "--cfg=contexts/stack-size:64",
                                   "--log=root.thres:critical"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  sg4::Engine engine(&argc, argv.data());

  // Platform: a root zone over the fabric (a star: every GPU's NIC links up and
  // down into a non-blocking switch) and one star per NVLink domain.
  auto* root = sg4::create_full_zone("cluster");
  auto* fabric = sg4::create_star_zone("fabric");
  fabric->set_parent(root);
  std::vector<sg4::Host*> nic_host(w.num_ranks), nv_host(w.num_ranks);
  for (uint32_t g = 0; g < w.num_ranks; ++g) {
    nic_host[g] = fabric->create_host("gpu" + std::to_string(g), 1e9);
    sg4::Link* nic = fabric->create_split_duplex_link("nic" + std::to_string(g), sh.m.nic_Bps)
                         ->set_latency(sh.m.nic_latency_s / 2);  // up + down = the spec's latency
    fabric->add_route(nic_host[g]->get_netpoint(), nullptr, nullptr, nullptr,
                      {sg4::LinkInRoute(nic, sg4::LinkInRoute::Direction::UP)}, true);
  }
  fabric->seal();
  std::vector<sg4::NetZone*> domains;
  for (uint32_t g = 0; g < w.num_ranks; ++g) {
    const uint32_t d = w.domain[g];
    if (d >= domains.size()) {
      domains.resize(d + 1, nullptr);
    }
    if (!domains[d]) {
      domains[d] = sg4::create_star_zone("nvl" + std::to_string(d));
      domains[d]->set_parent(root);
    }
    nv_host[g] = domains[d]->create_host("gpu" + std::to_string(g) + ".nvl", 1e9);
    sg4::Link* nv = domains[d]->create_split_duplex_link("nvlink" + std::to_string(g), sh.m.nvlink_Bps)
                        ->set_latency(sh.m.nvlink_latency_s / 2);
    domains[d]->add_route(nv_host[g]->get_netpoint(), nullptr, nullptr, nullptr,
                          {sg4::LinkInRoute(nv, sg4::LinkInRoute::Direction::UP)}, true);
  }
  for (auto* z : domains)
    if (z) z->seal();
  root->seal();

  for (uint32_t g = 0; g < w.num_ranks; ++g) {
    if (w.ranks[g].empty()) continue;
    sg4::Host* nv = nv_host[g];
    sg4::Actor::create("rank" + std::to_string(g), nic_host[g], [&sh, g, nv] {
      if (sh.overlap_depth > 0) OverlappedRankActor(&sh, g, nv);
      else RankActor(&sh, g, nv);
    });
  }
  if (opt.progress) {
    uint32_t active = 0;
    for (uint32_t g = 0; g < w.num_ranks; ++g) active += !w.ranks[g].empty();
    // A daemon reporting progress every 2 s of wall time, checked at simulated-time steps.
    sg4::Actor::create("progress", nic_host.empty() ? nullptr : nic_host[0], [&sh, &opt, active] {
      auto last = std::chrono::steady_clock::now();
      while (sh.done < active) {
        sg4::this_actor::sleep_for(1e-3);
        auto now = std::chrono::steady_clock::now();
        if (now - last > std::chrono::seconds(2)) {
          opt.progress(sg4::Engine::get_clock(), sh.done);
          last = now;
        }
      }
    })->daemonize();
  }
  engine.run();

  SimResult res;
  res.seconds = sg4::Engine::get_clock();
  res.hbm_seconds = sh.hbm_seconds;
  res.hbm_rank = sh.hbm_rank;
  res.comms = sh.comms / 2;  // both ends counted
  // Link loads over the refit.
  std::vector<LinkLoad> loads;
  const double T = res.seconds > 0 ? res.seconds : 1;
  for (uint32_t g = 0; g < w.num_ranks; ++g) {
    for (int p = 0; p < 2; ++p) {
      const double bw = p == 0 ? sh.m.nic_Bps : sh.m.nvlink_Bps;
      for (bool out : {true, false}) {
        uint64_t b = out ? w.sent[p][g] : w.received[p][g];
        if (b) loads.push_back({g, static_cast<Path>(p), out, b, static_cast<double>(b) / (bw * T)});
      }
    }
  }
  std::sort(loads.begin(), loads.end(), [](const LinkLoad& a, const LinkLoad& b) {
    if (a.utilization != b.utilization) return a.utilization > b.utilization;
    return a.name() < b.name();
  });
  if (loads.size() > 8) loads.resize(8);
  res.busiest = std::move(loads);
  if (sh.trace) WriteTrace(sh, opt.trace_path, cluster);
  res.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return res;
}

}  // namespace reshard::sim

// The module's entry (dlsym): the replay above.
extern "C" __attribute__((visibility("default"))) reshard::sim::ReplayFn reshard_simgrid_replay() {
  return &reshard::sim::Replay;
}
