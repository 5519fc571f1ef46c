// Mesh: the communicators of one rank, one per group kind (world, tp, ep, dp, pp, dp_ep), built
// from a validated Layout. A plain value passed down explicitly: no process-group globals.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/gloo_communicator.hpp"
#include "comm/layout.hpp"
#include "comm/store.hpp"

namespace trainctl::comm {

class CommClock;

// Which library carries the collectives: Gloo (host buffers, CPU ranks) or NCCL (device buffers
// on cuda_device, GPU ranks; see nccl_communicator.hpp).
enum class CommBackend { gloo, nccl };

struct MeshOptions {
  std::chrono::milliseconds timeout{30000};  // rendezvous and default per-call timeout
  std::shared_ptr<GlooDevice> device{};      // gloo: null means one new device for all groups
  CommBackend backend = CommBackend::gloo;
  int cuda_device = 0;  // nccl: this rank's GPU (its local rank)
  // nccl: the stream the backend writes the groups' device buffers on (Backend::stream()); every
  // call of the groups above waits for it on the device first. Not given to the background groups:
  // their caller hands over a fence per buffer instead (GradSync), so a bucket's reduction does not
  // also wait for the backward issued after it.
  void* cuda_stream = nullptr;
  bool deterministic = false;  // nccl: pin NCCL_ALGO=Ring, NCCL_PROTO=Simple (docs/comm.md)
  // Also join dp_bg and dp_ep_bg: the dp_cp and dp_cp_ep members a second time, for the gradient
  // reduction that a BackgroundReducer runs on its own thread while backward goes on (a context
  // serves one thread at a time). Only groups of more than one rank are joined.
  bool background_groups = false;
};

class Mesh {
 public:
  // Collective over the whole world: every rank calls it with the same store namespace (a
  // job_store), world size and layout. Validates the layout first (CommError, Kind::usage).
  // Group kinds are joined in a fixed order (world, tp, ep, dp, pp, dp_ep) and each group
  // rendezvouses under its own prefix "mesh/<kind>/<first member>/", so the disjoint groups of one
  // kind connect in parallel and no rank waits on a group it is not in. Size-1 groups cost nothing
  // with Gloo; with NCCL they are one-rank NCCL communicators (device buffers need device copies).
  // Ends with a barrier on the world group: no rank returns before every group is connected.
  static Mesh create(Store& store, int world_size, int rank, const Layout& layout,
                     const MeshOptions& options = {});

  const Layout& layout() const { return layout_; }
  const RankGroups& groups() const { return groups_; }
  int rank() const { return groups_.rank; }

  Communicator& world() const { return *world_; }
  // The group of this rank along `axis` (one per row of kAxes, joined in that order).
  Communicator& group(Axis axis) const { return *axes_[static_cast<size_t>(axis)]; }
  Communicator& tp() const { return group(Axis::tp); }
  Communicator& ep() const { return group(Axis::ep); }
  Communicator& dp() const { return group(Axis::dp); }
  Communicator& pp() const { return group(Axis::pp); }
  Communicator& dp_ep() const { return *dp_ep_; }
  Communicator& cp() const { return group(Axis::cp); }
  // The groups the gradients are summed over, and ZeRO shards over: dp and dp_ep widened by cp
  // (RankGroups::dp_cp); the same communicators as dp and dp_ep when cp = 1. The data ranks (which
  // samples a rank reads) stay dp_ep: the cp ranks of a dp rank read the same sequences.
  Communicator& dp_cp() const { return dp_cp_ ? *dp_cp_ : dp(); }
  Communicator& dp_cp_ep() const { return dp_cp_ep_ ? *dp_cp_ep_ : dp_ep(); }
  // The background twins of dp_cp and dp_cp_ep (MeshOptions::background_groups), for one
  // BackgroundReducer each; null when not joined or when the group has one rank. When the two
  // have the same members (ep 1) both return the same communicator: one context, one worker.
  Communicator* dp_bg() const { return dp_bg_.get(); }
  Communicator* dp_ep_bg() const { return dp_ep_bg_ ? dp_ep_bg_.get() : dp_bg_.get(); }
  // The cp members a second time (with background_groups and cp > 1), for the context-parallel
  // ring's exchanges on a worker thread while attention computes; null otherwise.
  Communicator* cp_bg() const { return cp_bg_.get(); }

  // Wall time this process has spent inside calls of any of its communicators (all groups), for
  // the share of step time spent communicating. Monotonic; callers take differences.
  // Counts the union of the calls' intervals (overlapping calls on two threads count once) and
  // only groups of more than one rank: a one-rank group's copies are not communication.
  // Thread-safe.
  double comm_seconds() const;
  // The time inside each group's own calls, by group name ("tp", "pp", "dp", "dp_ep", "world",
  // ...), for the training thread's groups of more than one rank, in a fixed order. Groups may
  // overlap in time (a call of one group while a background thread is in another); on the
  // training thread alone they add up to comm_seconds. Thread-safe.
  std::vector<std::pair<std::string, double>> comm_seconds_by_group() const;
  // The same for the background groups alone (busy time of the reducers' workers, which overlaps
  // the training thread's work and is therefore not part of comm_seconds).
  double background_comm_seconds() const;
  // The staging memory its communicators keep (Communicator::buffer_bytes), all groups together.
  size_t buffer_bytes() const;

 private:
  Layout layout_;
  RankGroups groups_;
  std::unique_ptr<Communicator> world_;
  std::array<std::unique_ptr<Communicator>, kAxes.size()> axes_;
  std::unique_ptr<Communicator> dp_ep_;
  std::unique_ptr<Communicator> dp_cp_, dp_cp_ep_;  // null when cp = 1 (dp and dp_ep serve)
  std::unique_ptr<Communicator> dp_bg_, dp_ep_bg_;  // dp_ep_bg_ null when it would equal dp_bg_
  std::unique_ptr<Communicator> cp_bg_;
  std::shared_ptr<CommClock> clock_;  // shared by the timed communicators of the groups above
  std::shared_ptr<CommClock> background_clock_;  // the _bg groups'
};

}  // namespace trainctl::comm
