#include "dist/mesh.hpp"

#include <algorithm>
#include <numeric>

#include "dist/error.hpp"

namespace trainctl::dist {
namespace {

std::unique_ptr<Communicator> join(Store& store, const std::string& kind,
                                   const std::vector<int>& members, int rank,
                                   const MeshOptions& options) {
  const auto it = std::find(members.begin(), members.end(), rank);
  PrefixStore group_store(store, "mesh/" + kind + "/" + std::to_string(members.front()) + "/");
  GroupOptions group;
  group.name = kind;
  group.rank = static_cast<int>(it - members.begin());
  group.size = static_cast<int>(members.size());
  group.timeout = options.timeout;
  group.device = options.device;
  return create_gloo_communicator(group_store, group);
}

}  // namespace

Mesh Mesh::create(Store& store, int world_size, int rank, const Layout& layout,
                  const MeshOptions& options) {
  validate(layout, world_size);
  Mesh mesh;
  mesh.layout_ = layout;
  mesh.groups_ = rank_groups(layout, rank);
  MeshOptions shared = options;
  if (!shared.device && world_size > 1) shared.device = make_gloo_device();
  std::vector<int> everyone(static_cast<size_t>(world_size));
  std::iota(everyone.begin(), everyone.end(), 0);
  mesh.world_ = join(store, "world", everyone, rank, shared);
  mesh.tp_ = join(store, "tp", mesh.groups_.tp, rank, shared);
  mesh.ep_ = join(store, "ep", mesh.groups_.ep, rank, shared);
  mesh.dp_ = join(store, "dp", mesh.groups_.dp, rank, shared);
  mesh.pp_ = join(store, "pp", mesh.groups_.pp, rank, shared);
  mesh.dp_ep_ = join(store, "dp_ep", mesh.groups_.dp_ep, rank, shared);
  return mesh;
}

}  // namespace trainctl::dist
