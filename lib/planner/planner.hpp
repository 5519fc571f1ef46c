// The planner: which parallel layouts of a recipe fit a cluster, how fast each should be, and why
// the best one wins -- answered before anything is launched. Three models, all documented with
// their assumptions in docs/planner.md:
//   memory   bytes per GPU by category (params, grads, optimizer, activations, comm buffers,
//            framework overhead) of the rank that needs the most. For any rank of any layout it
//            reproduces what lib/model allocates (ParamStore::bytes, Transformer::
//            activation_bytes) -- the unit tests hold it to that.
//   time     compute (FLOPs over peak x an achievable fraction), tensor-parallel collectives,
//            pipeline bubble and point-to-point sends, data-parallel gradient sync with the
//            overlap it gets, expert all-to-all.
//   search   every valid (tp, pp, dp, ep, micro_batch, zero, recompute) using all GPUs of the
//            cluster, rejected with a reason or ranked by predicted step time.
// Rank order of a layout is tp fastest, then ep, then dp, then pp (comm::Layout::order), so a tp
// group is tp consecutive GPUs and stays inside a node's NVLink domain when tp divides it.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "layout/timeline.hpp"
#include "recipe/recipe.hpp"
#include "topology/topology.hpp"

namespace trainctl::planner {

// What the planner scores: a layout (layout/layout.hpp: degrees, ZeRO stage, recompute, rank
// order tp fastest, then ep, dp, pp) and the micro-batch size it runs with.
struct Variant : Layout {
  int micro_batch = 1;
  // The pipeline schedule and model chunks per rank (parallel.pp_schedule, pp_virtual).
  PipeSchedule pp_schedule = PipeSchedule::one_f_one_b;
  int pp_virtual = 1;
  // The step's pipeline: its ranks, micro-batches per step, schedule and chunks.
  PipelineShape pipeline(const recipe::Recipe& recipe) const;

  Variant() = default;
  Variant(int tp, int pp, int dp, int ep, int micro_batch, int zero = 0,
          Recompute recompute = Recompute::none);
  // "tp=8 pp=2 dp=4 ep=1 mb=1 zero=0 recompute=full", and " sp=1" with sequence parallelism,
  // " interleaved=2" with two chunks per rank, " schedule=zb-h1" with ZB-H1
  std::string describe() const;
  // The GPUs one copy of the model spans (tp * pp * cp): fewer is the ties' second criterion.
  int gpus_per_replica() const { return tp * pp * cp; }
  bool operator==(const Variant&) const = default;
};

// Divisibility rules of the recipe (heads, kv_heads, ffn_hidden, vocab % tp; layers % pp;
// experts % ep; global_batch % (micro_batch * dp * ep)) for `layout`. Empty when valid, else
// the first broken rule as a formula, e.g. "model.heads % tp = 32 % 3 = 2 != 0".
std::string check_divisibility(const recipe::Recipe& recipe, const Variant& layout);
// What the engine refuses of the layout's pipeline schedule: ZB-H1 (parallel.pp_schedule zb-h1)
// with pp < 2 or pp_virtual != 1 (its shape's rules, PipelineShape::problem), with ZeRO-2 or 3,
// or with recompute other than none. Empty when allowed, else the first rule it breaks in the
// recipe's words, e.g. "parallel.pp_schedule zb-h1 needs parallel.zero <= 1 (got 2): ...". The
// search never proposes such a layout; a preview of one says why it does not run.
std::string schedule_problem(const recipe::Recipe& recipe, const Variant& layout);

// ---- memory
// --------------------------------------------------------------------------------------
// Bytes per GPU of one rank. Params, grads, optimizer and activations are what the engine
// allocates on that rank (lib/model ParamStore::bytes, Transformer::activation_bytes), exactly:
// tests/unit/planner_memory_test.cpp builds every rank of tp, pp, dp with ZeRO-1 and ep layouts
// and compares. Activations include the micro-batches in flight under the schedule: with 1F1B
// stage i holds min(pp - i, micro-batches per step); with ZB-H1 every stage min(pp, micro-batches
// per step), each slot also keeping what its weight-gradient pass needs.
struct MemoryEstimate {
  double params = 0, grads = 0, optimizer = 0;
  double activations = 0;       // kept for backward x in flight, plus one set of scratch
  double activations_kept = 0;  // of which: kept for backward (all micro-batches in flight)
  // Buffers of the collectives: GradSync's scratch (ZeRO part, tied-embedding peer gradient),
  // Gloo's reduce-scatter staging (CPU only), the vocab-parallel loss's host vectors (a bound).
  double comm_buffers = 0;
  double overhead = 0;  // CUDA context, library workspaces (0 on a CPU machine)
  int worst_stage = 0;  // the pipeline stage of the rank described
  int in_flight = 1;    // activation sets in flight on that stage: micro-batches, or chunks of one
                        // with the interleaved schedule (pipeline_slots); ZB-H1: min(pp, m)
  double total() const {
    return params + grads + optimizer + activations + comm_buffers + overhead;
  }
};

struct MemoryOptions {
  double overhead_bytes = -1;  // < 0: 1 GiB on a GPU cluster, 0 on a CPU-only machine
};

// The rank that needs the most: every pipeline stage is evaluated (the first holds the embedding
// and the most micro-batches in flight, the last the head and the logits; with uneven
// parallel.pp_layers any may win) and, with ZeRO-1, the dp rank with the largest optimizer part.
MemoryEstimate estimate_memory(const recipe::Recipe& recipe, const topology::ClusterSpec& cluster,
                               const Variant& layout, const MemoryOptions& options = {});
// The rank at `at`: its stage (at.pp) and, with ZeRO-1, its dp rank's part (at.dp); tp and ep
// ranks of a stage hold equal shards.
MemoryEstimate estimate_rank_memory(const recipe::Recipe& recipe,
                                    const topology::ClusterSpec& cluster, const Variant& layout,
                                    const Coordinates& at, const MemoryOptions& options = {});

// ---- time
// ----------------------------------------------------------------------------------------
struct TimeEstimate {
  double step_s = 0;
  double compute_s = 0;       // FLOPs on the critical path over achievable throughput
  double tp_comm_s = 0;       // tensor-parallel all-reduce time on the critical path
  double ep_comm_s = 0;       // expert all-to-all
  double cp_comm_s = 0;       // context-parallel ring passes of key/value blocks
  double pp_p2p_s = 0;        // pipeline sends on the critical path
  double bubble_s = 0;        // pipeline fill and drain: the schedule's time beyond m stage times
  double dp_comm_s = 0;       // whole gradient sync (all-reduce, or ZeRO reduce-scatter+all-gather)
  double dp_exposed_s = 0;    // of which not hidden behind the last backward
  int micro_batches = 1;      // per step per data-parallel replica
  double model_flops = 0;     // per step, whole cluster: 6N + attention per token (no recompute)
  double hardware_flops = 0;  // per step, whole cluster, recompute included
  double tokens_per_s_per_gpu = 0;
  double mfu = 0;  // model_flops / (step_s * GPUs * peak)
  // The pipeline schedule's inputs (timeline.hpp): the schedule, and per (virtual) stage one
  // micro-batch's forward and backward (recompute included) with the stage's collectives; one
  // pipeline send.
  PipelineShape pipeline;
  std::vector<StageTimes> stage_times;
  double pp_transfer_s = 0;
  // TimeOptions::skip_above_s cut the estimate short: step_s is only a lower bound, the rest of
  // the figures after the stage times unset.
  bool bound_only = false;
  double bubble_share() const { return step_s > 0 ? bubble_s / step_s : 0; }
  double comm_share() const {
    return step_s > 0 ? (tp_comm_s + ep_comm_s + cp_comm_s + pp_p2p_s + dp_exposed_s) / step_s : 0;
  }
};

struct TimeOptions {
  // Achievable fraction of the GPU's dense peak for the model's GEMMs; <= 0: the calibrated
  // default (kDefaultComputeEfficiency, fitted to Narayanan et al. 2021 on A100).
  double compute_efficiency = 0;
  // > 0: when even the schedule's lower bound (m slowest-stage times and the exposed gradient
  // sync) reaches this, return that bound (bound_only) without running the schedule. The search
  // passes the best step of a degree tuple so far.
  double skip_above_s = 0;
};
// Above this share of the GPU's memory a layout is reported as tight (text: a note naming the
// fastest layout below it; JSON: memory_bytes.tight).
inline constexpr double kTightMemoryShare = 0.90;
inline bool tight_memory(double bytes, double capacity) {
  return bytes > kTightMemoryShare * capacity;
}
// The model's error. Between two layouts of one job most of it cancels: where a published layout
// is not the planner's first it loses by 3.5% or less (docs/planner.md), so steps within kTieBand
// of the fastest are a tie. On a step's absolute value it is the spread of the published runs'
// errors (-20% to +20%): the output shows that range.
inline constexpr double kTieBand = 0.05;
inline constexpr double kStepError = 0.20;
// Fitted once to the published A100 runs (tests/unit/planner_published_test.cpp).
inline constexpr double kDefaultComputeEfficiency = 0.525;
// Share of a link's nominal bandwidth collectives reach (NCCL bus bandwidth), all links.
inline constexpr double kLinkEfficiency = 0.80;

TimeEstimate estimate_time(const recipe::Recipe& recipe, const topology::ClusterSpec& cluster,
                           const Variant& layout, const TimeOptions& options = {});

// The step's pipeline schedule (t.pipeline) on the estimate's stage times: what
// `trainctl plan --timeline` draws, and whose length estimate_time takes as the pipeline's part of
// the step.
Timeline planned_timeline(const TimeEstimate& t);

// Peak dense TFLOP/s of a GPU for the recipe's precision (fp32: peak_tflops_fp32). The planner
// scores layouts against it, and a run's measured MFU (lib/run) divides by it.
double peak_tflops(const topology::GpuSpec& gpu, tensor::DType compute);

// ---- search
// --------------------------------------------------------------------------------------
struct Candidate {
  Variant layout;
  MemoryEstimate memory;
  TimeEstimate time;
  double headroom_bytes = 0;  // usable GPU memory minus memory.total()
};

struct Rejection {
  Variant layout;      // degrees (micro_batch etc. of the variant that came closest)
  std::string reason;  // "does not fit: 93.1 GiB > 80.0 GiB" / "does not divide: formula"
};

// The search tries context parallelism (cp 2, 4, 8, 16) only where each rank keeps at least this
// many tokens of a sequence: long contexts, what Megatron and torchtitan use it for; shorter
// sequences are split by tp and dp (`--layout cp=N` still scores any cp).
inline constexpr int kMinContextTokens = 4096;
// The search tries the interleaved schedule for a variant only where 1F1B's bubble is large
// enough that removing part of it could move the step by this share (1%).
inline constexpr double kMinBubbleGain = 0.01;
// ZB-H1 cuts 1F1B's bubble of (pp - 1)(F + B + W) stage passes to (pp - 1)(F + B - W) (Qi et al.
// 2024; F forward, B input-gradient, W weight-gradient pass), by 2W / (F + B + W) of it: at most
// two thirds, since the planner's W (the forward's GEMMs again) is at most F and B. The search
// tries it for a variant only where that share of 1F1B's bubble reaches kMinBubbleGain.
inline constexpr double kZbH1MaxBubbleCut = 2.0 / 3.0;

struct SearchOptions {
  std::vector<trainctl::Recompute> recompute{
      trainctl::Recompute::none, trainctl::Recompute::selective, trainctl::Recompute::full};
  std::vector<int> zero{0, 1, 2, 3};
  std::vector<bool> sequence_parallel{false, true};  // true: tried where tp > 1 divides seq_len
  // Model chunks per pipeline rank tried where pp > 1: 1 is 1F1B, more the interleaved schedule
  // (where the micro-batches come in groups of pp and every chunk gets a layer).
  std::vector<int> pp_virtual{1, 2};
  // The ZB-H1 schedule (a split backward) tried where pp > 1 and the engine allows it: ZeRO 0 or
  // 1, recompute none (schedule_problem).
  bool zb_h1 = true;
  int max_micro_batch =
      64;  // micro-batch sizes tried: divisors of the per-replica batch up to this
  TimeOptions time;
  MemoryOptions memory;
};

// One layout scored on its own, whether or not the search would pick it: the recipe's own
// `parallel:` section (`trainctl plan` previews it first) or a layout given with --layout.
struct Preview {
  Variant layout;
  std::string origin;      // "the recipe's parallel section", "--layout ..."
  std::string problem;     // empty: it runs on the cluster; else every constraint it breaks
  bool estimated = false;  // memory and time hold figures (not when the layout does not divide)
  MemoryEstimate memory;
  TimeEstimate time;
  double headroom_bytes = 0;
  int rank = 0;  // where its step time falls among the ranked layouts (1 = fastest); 0: it does
                 // not run
  // pp > 1: the stage split (layers per stage) whose step the model finds shortest, where it
  // beats the recipe's (balance_stages), and that step; empty when the recipe's is already best.
  std::vector<int> balanced_pp_layers;
  double balanced_step_s = 0;
};

// The layers per pipeline stage that give `layout` the shortest modelled step and still fit the
// GPU: from the recipe's split (parallel.pp_layers, else even), layers move one at a time between
// neighbouring stages while the step shrinks (the first and last stages also hold the embedding
// and the head, so they usually end with fewer layers). Returns the split and its estimate; the
// split is the starting one when nothing moved. With the interleaved schedule the stages are the
// virtual ones (pp * pp_virtual entries, as parallel.pp_layers has them).
struct StageBalance {
  std::vector<int> pp_layers;
  TimeEstimate time;
  MemoryEstimate memory;
};
StageBalance balance_stages(const recipe::Recipe& recipe, const topology::ClusterSpec& cluster,
                            const Variant& layout, const TimeOptions& time = {},
                            const MemoryOptions& memory = {});

struct Plan {
  topology::ClusterSpec cluster;
  int world = 0;
  std::optional<Preview> preview;  // set by the caller (preview_layout), printed first
  // The best variant (micro_batch, zero, recompute) of each feasible (tp, pp, dp, ep), fastest
  // first: distinct layouts, not micro-batch variations of one.
  std::vector<Candidate> ranked;
  // One per (tp, pp, dp, ep) without a feasible variant, with the reason.
  std::vector<Rejection> rejected;
  int64_t variants_evaluated = 0;
  int64_t variants_feasible = 0;
  double search_seconds = 0;
  // ranked[0, tied) predict steps within kTieBand of the fastest: a tie within the model's
  // error, ordered by memory headroom (more first), then GPUs per model replica (fewer first).
  int tied = 0;
};

// Thrown when no layout can run: the message says why (nothing fits, and by how much; more GPUs
// than the batch can feed; a cluster without GPUs described as having some) and what to change.
class PlanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Every valid layout on all cluster.world_size() GPUs (a CPU-only machine, gpus_per_node 0,
// plans a world of 1). Throws PlanError when none fits.
Plan make_plan(const recipe::Recipe& recipe, const topology::ClusterSpec& cluster,
               const SearchOptions& options = {});

// Why `other` lost to `best`, e.g. "+12% step time: tp=8 crosses nodes (tp comm 0.8 s vs 0.1 s)".
std::string explain_loss(const Candidate& best, const Candidate& other,
                         const topology::ClusterSpec& cluster);

// The layout the recipe asks for: its parallel section and training.micro_batch.
Variant recipe_layout(const recipe::Recipe& recipe);
// Scores `layout` on plan.cluster: every constraint that keeps it from running there (another
// world size than the cluster's, a degree that does not divide the model or batch, memory beyond
// the GPU's), its memory and time whenever it divides (stages as the engine splits them:
// recipe.parallel.pp_layers when it has one entry per stage, else evenly), and its place among
// plan.ranked.
Preview preview_layout(const recipe::Recipe& recipe, const Plan& plan, const Variant& layout,
                       std::string origin, const SearchOptions& options = {});

// This machine's CPU as the planner's device: one rank with the host's memory (gpus_per_node 0,
// a world of 1); or, for a multi-rank CPU run (`parallel: auto` with --ranks, or under a launcher),
// `nodes` nodes of `ranks_per_node` CPU ranks (ClusterSpec::cpu_ranks), each with its share of
// the host's memory, linked by Gloo at the assumed bandwidths below.
topology::ClusterSpec cpu_machine(int ranks_per_node = 1, int nodes = 1);
inline constexpr double kCpuLoopbackGbps = 2.0;  // Gloo over loopback TCP, per rank (assumed)
inline constexpr double kCpuNetworkGbps = 1.25;  // 10 Gb Ethernet between nodes (assumed)

// ---- output
// -------------------------------------------------------------------------------------- The top-K
// table, the rank grid of the best layout, the runner-ups' reasons and the rejections.
// The preview (Plan::preview) alone, as format_plan starts with it; empty without one.
std::string format_preview(const Plan& plan);
std::string format_plan(const Plan& plan, const recipe::Recipe& recipe, int top);
// Which GPU of which node holds which (pp stage, dp replica, tp rank[, ep rank]). Nodes beyond
// max_nodes are elided (first and last shown).
std::string format_rank_grid(const Variant& layout, const topology::ClusterSpec& cluster,
                             int max_nodes = 4);
// The same content as format_plan as a stable JSON document (schema in docs/planner.md);
// `error`: why no layout runs (PlanError's message), with plan.ranked empty.
std::string plan_json(const Plan& plan, const recipe::Recipe& recipe, int top,
                      const std::string& error = {});

}  // namespace trainctl::planner
