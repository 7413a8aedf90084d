#include "runtime/hello.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "runtime/error.h"
#include "runtime/rank_map.h"

namespace reshard {
namespace {

constexpr char kMagic[8] = {'R', 'S', 'H', 'E', 'L', 'L', 'O', '1'};

template <size_t N>
void CopyTruncated(char (&to)[N], const std::string& from) {
  std::memset(to, 0, N);
  std::memcpy(to, from.data(), std::min(from.size(), N - 1));
}

template <size_t N>
std::string Text(const char (&s)[N]) {
  return std::string(s, strnlen(s, N));
}

// "0-1, 3, 5-9".
std::string Ranks(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string Who(const Hello& h) {
  return "transport rank " + std::to_string(h.transport_rank) + " (pid " + std::to_string(h.pid) + " on " +
         Text(h.host) + ")";
}

}  // namespace

Hello MakeHello(const Plan& plan, uint32_t plan_rank, const Transport& transport) {
  Hello h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  const ContentDigest d = plan.content_digest();
  h.digest_hi = d.hi;
  h.digest_lo = d.lo;
  h.plan_rank = plan_rank;
  h.transport_rank = transport.rank();
  h.num_plan_ranks = plan.num_ranks();
  h.pid = static_cast<uint32_t>(getpid());
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  CopyTruncated(h.host, host);
  const std::string& path = plan.path();
  CopyTruncated(h.plan, path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1));
  return h;
}

std::string CheckHellos(const std::vector<Hello>& all) {
  std::vector<uint32_t> strangers;
  for (uint32_t r = 0; r < all.size(); ++r)
    if (std::memcmp(all[r].magic, kMagic, sizeof kMagic) != 0) strangers.push_back(r);
  if (!strangers.empty()) {
    return "transport rank(s) " + Ranks(strangers) +
           " sent no reshard hello (another program, or another reshard version, on that rank)";
  }
  // One plan: group the ranks by content digest.
  std::map<std::pair<uint64_t, uint64_t>, std::vector<uint32_t>> plans;
  for (uint32_t r = 0; r < all.size(); ++r) plans[{all[r].digest_hi, all[r].digest_lo}].push_back(r);
  if (plans.size() > 1) {
    std::string list;
    for (const auto& [digest, ranks] : plans) {
      const Hello& h = all[ranks.front()];
      list += std::string(list.empty() ? "" : "; ") + (ranks.size() == 1 ? "rank " : "ranks ") + Ranks(ranks) +
              " run '" + Text(h.plan) + "' (content digest " + ContentDigest{h.digest_hi, h.digest_lo}.hex() + ", " +
              std::to_string(h.num_plan_ranks) + " plan ranks)";
    }
    return "the ranks do not run one plan: " + list +
           ". Every rank must open the same plan file (compare `reshard show PLAN`'s content digest); nothing was "
           "sent";
  }
  // Distinct plan ranks.
  std::map<uint32_t, std::vector<uint32_t>> by_plan_rank;
  for (uint32_t r = 0; r < all.size(); ++r) by_plan_rank[all[r].plan_rank].push_back(r);
  for (const auto& [plan_rank, ranks] : by_plan_rank) {
    if (ranks.size() < 2) continue;
    std::string who;
    for (uint32_t r : ranks) who += (who.empty() ? "" : " and ") + Who(all[r]);
    return "plan rank " + std::to_string(plan_rank) + " is played by " + std::to_string(ranks.size()) +
           " processes: " + who + "; each plan rank needs exactly one process; nothing was sent";
  }
  return "";
}

bool ExchangeHellos(const Plan& plan, uint32_t plan_rank, Transport& transport) {
  const std::string at = "rank " + std::to_string(plan_rank) + ": ";
  if (transport.rank() >= transport.size()) {
    throw Error(at + "the transport says it is rank " + std::to_string(transport.rank()) + " of " +
                std::to_string(transport.size()));
  }
  const Hello mine = MakeHello(plan, plan_rank, transport);
  std::vector<Hello> all(transport.size());
  const auto deadline = Transport::Clock::now() + transport.timeout();
  try {
    if (!transport.allgather(&mine, sizeof mine, all.data(), deadline)) return false;
  } catch (const Error& e) {
    throw HelloFailed(at + "connect: every rank says which plan it runs when its session starts; " + e.what());
  }
  const std::string why = CheckHellos(all);
  if (!why.empty()) throw Error(at + why);
  // Every process plays the plan rank of its transport rank (the table is
  // the same on every rank, so all of them fail alike).
  for (uint32_t t = 0; t < all.size(); ++t) {
    const int64_t want = PlanRankOf(plan, transport.size(), t);
    if (want < 0 || want == all[t].plan_rank) continue;
    const bool every = transport.size() == plan.num_ranks();
    throw Error(at + "transport rank " + std::to_string(t) + " (pid " + std::to_string(all[t].pid) + " on " +
                std::string(all[t].host, strnlen(all[t].host, sizeof all[t].host)) + ") plays plan rank " +
                std::to_string(all[t].plan_rank) + ", but on a transport over " +
                (every ? "every plan rank it must play plan rank " + std::to_string(want)
                       : "the plan's " + std::to_string(transport.size()) + " active ranks it must play plan rank " +
                             std::to_string(want) + " (process i plays Plan.active_ranks[i])") +
                "; nothing was sent");
  }
  return true;
}

}  // namespace reshard
