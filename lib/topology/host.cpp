// Cores, NUMA nodes and which PCI devices (NVIDIA GPUs, InfiniBand/Ethernet HCAs) sit near which
// NUMA node, through hwloc. I/O objects are off by default in hwloc 2; the io types filter turns
// on the "important" ones (GPUs, NICs, their bridges).
#include <hwloc.h>

#include <cerrno>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "topology/probes.hpp"

namespace trainctl::topology {
namespace {

constexpr unsigned kVendorNvidia = 0x10de;
constexpr unsigned kVendorMellanox = 0x15b3;

bool is_nvidia_gpu(const hwloc_obj_t pci) {
  unsigned base_class = pci->attr->pcidev.class_id >> 8;
  return pci->attr->pcidev.vendor_id == kVendorNvidia && base_class == 0x03;  // display/3D
}

bool is_network(const hwloc_obj_t pci) {
  unsigned base_class = pci->attr->pcidev.class_id >> 8;
  return base_class == 0x02 && (pci->attr->pcidev.vendor_id == kVendorMellanox ||
                                pci->attr->pcidev.class_id == 0x0207);  // 0x0207: InfiniBand
}

// The name a NIC goes by: its first OpenFabrics OS device ("mlx5_0"), else its network one.
std::string nic_name(const hwloc_obj_t pci) {
  std::string network;
  for (hwloc_obj_t child = pci->io_first_child; child; child = child->next_sibling) {
    if (child->type != HWLOC_OBJ_OS_DEVICE || !child->name) continue;
    if (child->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) return child->name;
    if (network.empty()) network = child->name;
  }
  if (!network.empty()) return network;
  return fmt::format("{:04x}:{:02x}:{:02x}.{}", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                     pci->attr->pcidev.dev, pci->attr->pcidev.func);
}

std::string bus_id(const hwloc_obj_t pci) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{}", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                     pci->attr->pcidev.dev, pci->attr->pcidev.func);
}

struct NumaPlace {
  int cores = 0;
  std::vector<std::string> gpus, nics;
};

}  // namespace

HostReport probe_host() {
  HostReport report;
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) {
    report.reason = "hwloc_topology_init failed";
    return report;
  }
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0) {
    report.reason = fmt::format("hwloc_topology_load failed ({})", std::strerror(errno));
    hwloc_topology_destroy(topo);
    return report;
  }
  report.available = true;
  report.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  report.threads = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  report.numa_nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);

  std::map<int, NumaPlace> places;  // by NUMA node os_index
  for (int i = 0; i < report.numa_nodes; ++i) {
    hwloc_obj_t numa = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    places[static_cast<int>(numa->os_index)].cores =
        hwloc_get_nbobjs_inside_cpuset_by_type(topo, numa->cpuset, HWLOC_OBJ_CORE);
  }
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo, nullptr); pci;
       pci = hwloc_get_next_pcidev(topo, pci)) {
    bool gpu = is_nvidia_gpu(pci);
    if (!gpu && !is_network(pci)) continue;
    if (gpu && report.gpu_pcie_gbps == 0) report.gpu_pcie_gbps = pci->attr->pcidev.linkspeed;
    // The NUMA node(s) local to the device: those of its closest non-I/O ancestor.
    hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topo, pci);
    int numa_index = -1;
    if (ancestor && ancestor->nodeset) {
      int first = hwloc_bitmap_first(ancestor->nodeset);
      if (first >= 0 && hwloc_bitmap_weight(ancestor->nodeset) == 1) numa_index = first;
    }
    auto& place = places[numa_index];
    (gpu ? place.gpus : place.nics).push_back(gpu ? bus_id(pci) : nic_name(pci));
  }
  for (const auto& [index, place] : places) {
    std::string line =
        index < 0 ? std::string("NUMA ?") : fmt::format("NUMA {}: {} cores", index, place.cores);
    if (!place.gpus.empty()) line += fmt::format(", GPUs {}", fmt::join(place.gpus, " "));
    if (!place.nics.empty()) line += fmt::format(", NICs {}", fmt::join(place.nics, " "));
    report.placement.push_back(std::move(line));
  }
  hwloc_topology_destroy(topo);
  return report;
}

}  // namespace trainctl::topology
