#include "comm/mesh.hpp"

#include <algorithm>
#include <numeric>

#include "comm/error.hpp"
#include "comm/nccl_communicator.hpp"
#include "comm/timed_communicator.hpp"

namespace trainctl::comm {
namespace {

std::unique_ptr<Communicator> join(Store& store, const std::string& kind,
                                   const std::vector<int>& members, int rank,
                                   const MeshOptions& options,
                                   const std::shared_ptr<CommClock>& clock,
                                   bool background = false) {
  const auto it = std::find(members.begin(), members.end(), rank);
  PrefixStore group_store(store, "mesh/" + kind + "/" + std::to_string(members.front()) + "/");
  GroupOptions group;
  group.name = kind;
  group.rank = static_cast<int>(it - members.begin());
  group.size = static_cast<int>(members.size());
  group.timeout = options.timeout;
  group.device = options.device;
  std::unique_ptr<Communicator> communicator =
      options.backend == CommBackend::nccl
          ? create_nccl_communicator(group_store, group, options.cuda_device, options.deterministic,
                                     background ? nullptr : options.cuda_stream)
          : create_gloo_communicator(group_store, group);
  // A one-rank group only copies: it is not communication and stays a direct call.
  if (communicator->size() == 1) return communicator;
  return std::make_unique<TimedCommunicator>(std::move(communicator), clock);
}

}  // namespace

Mesh Mesh::create(Store& store, int world_size, int rank, const Layout& layout,
                  const MeshOptions& options) {
  validate(layout, world_size);
  Mesh mesh;
  mesh.layout_ = layout;
  mesh.groups_ = rank_groups(layout, rank);
  mesh.clock_ = std::make_shared<CommClock>();
  MeshOptions shared = options;
  if (shared.backend == CommBackend::gloo && !shared.device && world_size > 1)
    shared.device = make_gloo_device();
  std::vector<int> everyone(static_cast<size_t>(world_size));
  std::iota(everyone.begin(), everyone.end(), 0);
  mesh.world_ = join(store, "world", everyone, rank, shared, mesh.clock_);
  for (const Layout::AxisInfo& axis : kAxes)
    mesh.axes_[static_cast<size_t>(axis.axis)] =
        join(store, std::string(axis.name), mesh.groups_.of(axis.axis), rank, shared, mesh.clock_);
  mesh.dp_ep_ = join(store, "dp_ep", mesh.groups_.dp_ep, rank, shared, mesh.clock_);
  if (layout.cp > 1) {
    mesh.dp_cp_ = join(store, "dp_cp", mesh.groups_.dp_cp, rank, shared, mesh.clock_);
    mesh.dp_cp_ep_ = join(store, "dp_cp_ep", mesh.groups_.dp_cp_ep, rank, shared, mesh.clock_);
  }
  mesh.background_clock_ = std::make_shared<CommClock>();
  if (options.background_groups) {
    // Every member of a group sees the same sizes and member lists, so all join or none does.
    const RankGroups& g = mesh.groups_;
    if (g.dp_cp.size() > 1)
      mesh.dp_bg_ =
          join(store, "dp_bg", g.dp_cp, rank, shared, mesh.background_clock_, /*background=*/true);
    if (g.dp_cp_ep.size() > 1 && g.dp_cp_ep != g.dp_cp)
      mesh.dp_ep_bg_ = join(store, "dp_ep_bg", g.dp_cp_ep, rank, shared, mesh.background_clock_,
                            /*background=*/true);
    if (g.of(Axis::cp).size() > 1)
      mesh.cp_bg_ = join(store, "cp_bg", g.of(Axis::cp), rank, shared, mesh.background_clock_,
                         /*background=*/true);
  }
  // A rank can finish its side of a group's connections while a peer is still completing its
  // own; were the first to leave then exit (a short job, a test), the peer's rendezvous would fail
  // with "connection closed by peer". Nobody leaves creation before every group is connected.
  mesh.world_->barrier();
  return mesh;
}

double Mesh::comm_seconds() const {
  return clock_ ? clock_->seconds() : 0.0;
}

size_t Mesh::buffer_bytes() const {
  size_t bytes = world_ ? world_->buffer_bytes() : 0;
  for (const std::unique_ptr<Communicator>& group : axes_)
    if (group) bytes += group->buffer_bytes();
  for (const Communicator* group :
       {dp_ep_.get(), dp_cp_.get(), dp_cp_ep_.get(), dp_bg_.get(), dp_ep_bg_.get(), cp_bg_.get()})
    if (group) bytes += group->buffer_bytes();
  return bytes;
}

std::vector<std::pair<std::string, double>> Mesh::comm_seconds_by_group() const {
  std::vector<std::pair<std::string, double>> out;
  auto add = [&](const Communicator* group) {
    if (const auto* timed = dynamic_cast<const TimedCommunicator*>(group))
      out.emplace_back(timed->name(), timed->group_seconds());
  };
  for (const std::unique_ptr<Communicator>& group : axes_)
    add(group.get());
  for (const Communicator* group : {dp_ep_.get(), dp_cp_.get(), dp_cp_ep_.get(), world_.get()})
    add(group);
  return out;
}

double Mesh::background_comm_seconds() const {
  return background_clock_ ? background_clock_->seconds() : 0.0;
}

}  // namespace trainctl::comm
