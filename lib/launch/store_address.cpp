// The TCP store address of a Slurm job step; see store_address.hpp for the contract.
#include "launch/store_address.hpp"

#include <fmt/core.h>
#include <netdb.h>
#include <sys/socket.h>

#include <charconv>
#include <optional>

namespace trainctl::launch {

namespace {

std::optional<long long> parse_number(std::string_view text) {
  long long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || value < 0)
    return std::nullopt;
  return value;
}

[[noreturn]] void bad_list(std::string_view list, std::size_t at, const std::string& why) {
  throw RankEnvError(
      fmt::format("node list '{}' (SLURM_NODELIST) at character {}: {}", list, at + 1, why));
}

// "1-3,7" (the inside of one bracket group) -> "1" "2" "3" "7", keeping zero padding.
std::vector<std::string> expand_ranges(std::string_view list, std::string_view inside,
                                       std::size_t offset) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= inside.size()) {
    std::size_t comma = inside.find(',', at);
    if (comma == std::string_view::npos) comma = inside.size();
    const std::string_view part = inside.substr(at, comma - at);
    const std::size_t dash = part.find('-');
    const std::string_view first = part.substr(0, dash);
    const std::string_view last = dash == std::string_view::npos ? first : part.substr(dash + 1);
    const std::optional<long long> lo = parse_number(first);
    const std::optional<long long> hi = parse_number(last);
    if (!lo || !hi)
      bad_list(list, offset + at, fmt::format("'{}' is not a number or a range like 1-4", part));
    if (*hi < *lo) bad_list(list, offset + at, fmt::format("the range '{}' descends", part));
    if (*hi - *lo > 100000) bad_list(list, offset + at, "the range is implausibly long");
    const std::size_t width = first.size();
    for (long long n = *lo; n <= *hi; ++n) {
      out.push_back(fmt::format("{:0{}}", n, width));
    }
    at = comma + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(std::string_view list) {
  std::vector<std::string> hosts;
  std::size_t at = 0;
  while (at < list.size()) {
    // One host expression up to the next comma outside brackets.
    std::vector<std::string> names{""};
    const std::size_t start = at;
    while (at < list.size() && list[at] != ',') {
      if (list[at] == ']') bad_list(list, at, "']' without '['");
      if (list[at] != '[') {
        for (std::string& name : names)
          name += list[at];
        ++at;
        continue;
      }
      const std::size_t close = list.find(']', at);
      if (close == std::string_view::npos) bad_list(list, at, "'[' without ']'");
      const std::string_view inside = list.substr(at + 1, close - at - 1);
      if (inside.find('[') != std::string_view::npos) bad_list(list, at, "nested '['");
      const std::vector<std::string> suffixes = expand_ranges(list, inside, at + 1);
      std::vector<std::string> grown;
      grown.reserve(names.size() * suffixes.size());
      for (const std::string& name : names)
        for (const std::string& suffix : suffixes)
          grown.push_back(name + suffix);
      names = std::move(grown);
      at = close + 1;
    }
    if (at == start) bad_list(list, at, "empty host name");
    for (std::string& name : names)
      hosts.push_back(std::move(name));
    if (at < list.size()) {
      ++at;  // the comma
      if (at == list.size()) bad_list(list, at - 1, "a trailing ','");
    }
  }
  if (hosts.empty()) throw RankEnvError("node list (SLURM_NODELIST) is empty");
  return hosts;
}

int store_port_for_job(std::string_view job_id) {
  const std::optional<long long> id = parse_number(job_id);
  if (!id)
    throw RankEnvError("SLURM_JOB_ID='" + std::string(job_id) +
                       "' is not a job number, so no TCP store port can be derived from it; set " +
                       kEnvStorePort + " to a free port");
  return kStorePortBase + static_cast<int>(*id % kStorePortCount);
}

bool host_resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0) return false;
  ::freeaddrinfo(result);
  return true;
}

namespace {

// TRAINCTL_STORE_PORT's value as a port; RankEnvError naming the variable when it is not one.
int store_port_from(const std::string& text) {
  const std::optional<long long> value = parse_number(text);
  if (!value || *value < 1 || *value > 65535)
    throw RankEnvError(std::string(kEnvStorePort) + "='" + text + "' is not a TCP port (1..65535)");
  return static_cast<int>(*value);
}

}  // namespace

StoreAddress launcher_store_address(const Getenv& getenv) {
  const char* host = getenv(kEnvStoreHost);
  const char* port = getenv(kEnvStorePort);
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0')
    throw RankEnvError(std::string("a rank of trainctl's launcher without a shared file system "
                                   "needs ") +
                       kEnvStoreHost + " and " + kEnvStorePort +
                       ", which the launcher sets; start the run with `trainctl run`");
  StoreAddress address;
  address.host = host;
  address.port = store_port_from(port);
  address.how = "served by trainctl's launcher";
  return address;
}

StoreAddress external_store_address(const Getenv& getenv) {
  const auto text = [&](const char* name) {
    const char* value = getenv(name);
    return value ? std::string(value) : std::string();
  };
  StoreAddress address;
  address.port = store_port_from(text(kEnvStorePort));
  const std::string port_how = "port " + std::to_string(address.port) + " from " + kEnvStorePort;
  for (const char* name : {kEnvStoreHost, "MASTER_ADDR"}) {
    address.host = text(name);
    if (address.host.empty()) continue;
    address.how = "rank 0 serves it, host from " + std::string(name) + ", " + port_how;
    return address;
  }
  throw RankEnvError(std::string(kEnvStorePort) + " is set, so the ranks meet through the TCP " +
                     "store rank 0 serves, but neither " + kEnvStoreHost +
                     " nor MASTER_ADDR names rank 0's host; set " + kEnvStoreHost +
                     " to an address of rank 0's host that every rank reaches");
}

StoreAddress tcp_store_address(const RankInfo& info, const Getenv& getenv,
                               const Resolves& resolves) {
  auto text = [&](const char* name) {
    const char* value = getenv(name);
    return value ? std::string(value) : std::string();
  };
  StoreAddress address;
  std::string port_how;
  if (const std::string port = text(kEnvStorePort); !port.empty()) {
    address.port = store_port_from(port);
    port_how = "port " + port + " from " + kEnvStorePort;
  } else {
    const std::string job = text("SLURM_JOB_ID");
    address.port = store_port_for_job(job);
    port_how = "port " + std::to_string(address.port) + " from job " + job;
  }
  if (std::string host = text(kEnvStoreHost); !host.empty()) {
    address.host = std::move(host);
    address.how = "host from " + std::string(kEnvStoreHost) + ", " + port_how;
    return address;
  }
  const std::string first = expand_slurm_nodelist(info.node_list).front();
  if (info.rank == 0 && info.node != first)
    throw RankEnvError("rank 0 runs on " + info.node + ", not on " + first +
                       ", the first node of " + info.node_list +
                       " where every rank looks for the TCP store (cluster.shared_fs: false); "
                       "use Slurm's default block distribution, or set " +
                       kEnvStoreHost + " to rank 0's node");
  address.host = first;
  address.how = "first node " + first + " of " + info.node_list + ", " + port_how;
  if (!resolves(first)) {
    const std::string launch_address = text("SLURM_LAUNCH_NODE_IPADDR");
    if (launch_address.empty())
      throw RankEnvError("the first node " + first + " of " + info.node_list +
                         " has no address here (it does not resolve); set " + kEnvStoreHost +
                         " to its address");
    address.host = launch_address;
    address.how = "first node " + first + " of " + info.node_list +
                  " does not resolve: its address " + launch_address +
                  " from SLURM_LAUNCH_NODE_IPADDR, " + port_how;
  }
  return address;
}

}  // namespace trainctl::launch
