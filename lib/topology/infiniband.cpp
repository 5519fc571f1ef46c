// InfiniBand and RoCE ports from sysfs: SYSFS_ROOT/class/infiniband/<hca>/ports/<n>/{rate,state,
// link_layer}, as the kernel's ib_core writes them ("400 Gb/sec (4X NDR)", "4: ACTIVE",
// "InfiniBand"). The root is a parameter so tests read recorded trees.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "topology/probes.hpp"

namespace trainctl::topology {
namespace {

namespace fs = std::filesystem;

std::string read_trimmed(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto end = text.find_last_not_of(" \t\r\n");
  return end == std::string::npos ? std::string{} : text.substr(0, end + 1);
}

}  // namespace

InfinibandReport probe_infiniband(const std::string& sysfs_root) {
  InfinibandReport report;
  fs::path dir = fs::path(sysfs_root) / "class" / "infiniband";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    report.reason = fmt::format("no InfiniBand/RoCE adapters ({} does not exist)", dir.string());
    return report;
  }
  for (const auto& hca : fs::directory_iterator(dir, ec)) {
    fs::path ports = hca.path() / "ports";
    if (!fs::is_directory(ports, ec)) continue;
    int numa_node = -1;
    if (std::string numa = read_trimmed(hca.path() / "device" / "numa_node"); !numa.empty())
      numa_node = std::atoi(numa.c_str());
    for (const auto& port_dir : fs::directory_iterator(ports, ec)) {
      IbPort port;
      port.device = hca.path().filename().string();
      port.port = std::atoi(port_dir.path().filename().string().c_str());
      port.rate_text = read_trimmed(port_dir.path() / "rate");
      port.rate_gbits = std::strtod(port.rate_text.c_str(), nullptr);  // "400 Gb/sec (4X NDR)"
      std::string state = read_trimmed(port_dir.path() / "state");     // "4: ACTIVE"
      auto colon = state.find(':');
      port.state = colon == std::string::npos ? state : state.substr(colon + 1);
      port.state.erase(0, port.state.find_first_not_of(' '));
      port.link_layer = read_trimmed(port_dir.path() / "link_layer");
      port.numa_node = numa_node;
      report.ports.push_back(std::move(port));
    }
  }
  std::sort(report.ports.begin(), report.ports.end(), [](const IbPort& a, const IbPort& b) {
    return std::pair(a.device, a.port) < std::pair(b.device, b.port);
  });
  if (report.ports.empty())
    report.reason = fmt::format("no InfiniBand/RoCE ports under {}", dir.string());
  return report;
}

}  // namespace trainctl::topology
