// NVLink through NVML, loaded at run time with dlopen so the binary starts on machines without the
// NVIDIA driver. NVML's header is not installed here, so the few functions used are declared below
// with the types of nvml.h (stable C ABI since NVML 5; the _v2/_v3 names are the current ones).
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "topology/probes.hpp"

namespace trainctl::topology {
namespace {

// ---- the slice of nvml.h we use -----------------------------------------------------------------
using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr unsigned kNvlinkMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
constexpr int kFeatureEnabled = 1;        // NVML_FEATURE_ENABLED
constexpr int kP2pCapsIndexNvlink = 2;    // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kP2pStatusOk = 0;           // NVML_P2P_STATUS_OK

struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};

struct Nvml {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*get_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*get_handle)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*get_memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*get_pci)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*nvlink_state)(nvmlDevice_t, unsigned int, int*) = nullptr;
  nvmlReturn_t (*nvlink_remote_pci)(nvmlDevice_t, unsigned int, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*p2p_status)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;
};

template <class F>
void bind(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
}

// Closes the library on every path out of probe_nvml.
struct Library {
  void* handle = nullptr;
  ~Library() {
    if (handle) dlclose(handle);
  }
};

std::string error_text(const Nvml& nvml, nvmlReturn_t rc) {
  const char* text = nvml.error_string ? nvml.error_string(rc) : nullptr;
  return text ? fmt::format("error {} ({})", rc, text) : fmt::format("error {}", rc);
}

std::string lower_bus_id(const char* bus_id) {
  std::string out(bus_id, strnlen(bus_id, 32));
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Fills report.nvlink from the remote end of each active link: a link to another GPU's bus id
// joins the two; links to anything else (an NVSwitch) join every GPU that has one.
void connect_by_remote_pci(const Nvml& nvml, const std::vector<nvmlDevice_t>& devices,
                           NvmlReport& report) {
  std::size_t n = devices.size();
  std::vector<bool> on_switch(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    for (unsigned link = 0; link < kNvlinkMaxLinks; ++link) {
      int state = 0;
      if (nvml.nvlink_state(devices[i], link, &state) != kNvmlSuccess || state != kFeatureEnabled)
        continue;
      nvmlPciInfo_t remote{};
      if (nvml.nvlink_remote_pci(devices[i], link, &remote) != kNvmlSuccess) continue;
      std::string bus = lower_bus_id(remote.busId);
      bool to_gpu = false;
      for (std::size_t j = 0; j < n; ++j) {
        if (j != i && !bus.empty() && bus == report.gpus[j].pci_bus_id) {
          report.nvlink[i][j] = report.nvlink[j][i] = true;
          to_gpu = true;
        }
      }
      if (!to_gpu) on_switch[i] = true;
    }
  }
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      if (on_switch[i] && on_switch[j]) report.nvlink[i][j] = true;
}

}  // namespace

NvmlReport probe_nvml(const std::string& library_path) {
  NvmlReport report;
  Library lib;
  lib.handle = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib.handle) {
    const char* why = dlerror();
    report.reason = why ? why : fmt::format("{}: cannot be loaded", library_path);
    return report;
  }
  Nvml nvml;
  bind(lib.handle, "nvmlInit_v2", nvml.init);
  bind(lib.handle, "nvmlShutdown", nvml.shutdown);
  bind(lib.handle, "nvmlErrorString", nvml.error_string);
  bind(lib.handle, "nvmlDeviceGetCount_v2", nvml.get_count);
  bind(lib.handle, "nvmlDeviceGetHandleByIndex_v2", nvml.get_handle);
  bind(lib.handle, "nvmlDeviceGetName", nvml.get_name);
  bind(lib.handle, "nvmlDeviceGetMemoryInfo", nvml.get_memory);
  bind(lib.handle, "nvmlDeviceGetPciInfo_v3", nvml.get_pci);
  bind(lib.handle, "nvmlDeviceGetNvLinkState", nvml.nvlink_state);
  bind(lib.handle, "nvmlDeviceGetNvLinkRemotePciInfo_v2", nvml.nvlink_remote_pci);
  bind(lib.handle, "nvmlDeviceGetP2PStatus", nvml.p2p_status);
  if (!nvml.init || !nvml.shutdown || !nvml.get_count || !nvml.get_handle) {
    report.reason =
        fmt::format("{} lacks nvmlInit_v2/nvmlDeviceGetCount_v2 (NVML too old?)", library_path);
    return report;
  }
  if (nvmlReturn_t rc = nvml.init(); rc != kNvmlSuccess) {
    report.reason = fmt::format("nvmlInit_v2: {}", error_text(nvml, rc));
    return report;
  }
  unsigned count = 0;
  if (nvmlReturn_t rc = nvml.get_count(&count); rc != kNvmlSuccess) {
    report.reason = fmt::format("nvmlDeviceGetCount_v2: {}", error_text(nvml, rc));
    nvml.shutdown();
    return report;
  }
  std::vector<nvmlDevice_t> devices;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr;
    if (nvmlReturn_t rc = nvml.get_handle(i, &device); rc != kNvmlSuccess) {
      report.reason = fmt::format("nvmlDeviceGetHandleByIndex_v2({}): {}", i, error_text(nvml, rc));
      nvml.shutdown();
      return report;
    }
    devices.push_back(device);
    NvmlGpu gpu;
    char name[96] = {};
    if (nvml.get_name && nvml.get_name(device, name, sizeof name) == kNvmlSuccess)
      gpu.name = std::string(name, strnlen(name, sizeof name));
    nvmlMemory_t memory{};
    if (nvml.get_memory && nvml.get_memory(device, &memory) == kNvmlSuccess)
      gpu.memory_bytes = memory.total;
    nvmlPciInfo_t pci{};
    if (nvml.get_pci && nvml.get_pci(device, &pci) == kNvmlSuccess)
      gpu.pci_bus_id = lower_bus_id(pci.busId);
    if (nvml.nvlink_state) {
      for (unsigned link = 0; link < kNvlinkMaxLinks; ++link) {
        int state = 0;
        if (nvml.nvlink_state(device, link, &state) == kNvmlSuccess && state == kFeatureEnabled)
          ++gpu.active_links;
      }
    }
    report.gpus.push_back(std::move(gpu));
  }
  std::size_t n = devices.size();
  report.nvlink.assign(n, std::vector<bool>(n, false));
  for (std::size_t i = 0; i < n; ++i)
    report.nvlink[i][i] = true;
  // P2P status first; when the library lacks it or answers no pair (NOT_SUPPORTED on some
  // drivers), the remote end of each link.
  bool p2p_answered = false;
  if (nvml.p2p_status) {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        int status = -1;
        if (i == j ||
            nvml.p2p_status(devices[i], devices[j], kP2pCapsIndexNvlink, &status) != kNvmlSuccess)
          continue;
        p2p_answered = true;
        if (status == kP2pStatusOk) report.nvlink[i][j] = report.nvlink[j][i] = true;
      }
  }
  if (!p2p_answered && nvml.nvlink_state && nvml.nvlink_remote_pci)
    connect_by_remote_pci(nvml, devices, report);
  nvml.shutdown();
  report.available = true;
  return report;
}

int nvlink_domain(const NvmlReport& report, std::string* why) {
  auto say = [&](std::string text) {
    if (why) *why = std::move(text);
  };
  std::size_t n = report.nvlink.size();
  if (!report.available || n == 0) {
    say(report.available ? "NVML sees no GPU" : fmt::format("no NVML ({})", report.reason));
    return 1;
  }
  // Connected components of the NVLink graph.
  std::vector<int> component(n, -1);
  std::vector<int> sizes;
  for (std::size_t start = 0; start < n; ++start) {
    if (component[start] >= 0) continue;
    int id = static_cast<int>(sizes.size());
    sizes.push_back(0);
    std::vector<std::size_t> stack{start};
    component[start] = id;
    while (!stack.empty()) {
      std::size_t i = stack.back();
      stack.pop_back();
      ++sizes[id];
      for (std::size_t j = 0; j < n; ++j)
        if (report.nvlink[i][j] && component[j] < 0) {
          component[j] = id;
          stack.push_back(j);
        }
    }
  }
  int domain = 0;
  for (int s : sizes)
    domain = std::gcd(domain, s);
  int links = report.gpus.empty() ? 0 : report.gpus[0].active_links;
  if (domain <= 1) {
    say(fmt::format("NVML: {} GPU{}, no NVLink between them", n, n == 1 ? "" : "s"));
    return 1;
  }
  bool equal = std::all_of(sizes.begin(), sizes.end(), [&](int s) { return s == sizes[0]; });
  say(fmt::format("NVML: {} GPUs in {} NVLink group{} of {}{} ({} active NVLinks on GPU 0)", n,
                  sizes.size(), sizes.size() == 1 ? "" : "s", equal ? sizes[0] : domain,
                  equal ? "" : " (unequal groups: using their gcd)", links));
  return domain;
}

}  // namespace trainctl::topology
