// The time model of one optimizer step (docs/planner.md, "Time"):
//   stage time per micro-batch = compute + tensor-parallel all-reduces + expert all-to-alls
//                                + context-parallel ring passes
//   step = the layout's pipeline schedule (1F1B, interleaved or ZB-H1) of m micro-batches run
//          on those stage times, with the pipeline sends between them (layout/timeline.hpp: 1F1B
//          takes (m + pp - 1) stage times for equal stages and free sends)
//        + data-parallel gradient sync not hidden behind the last micro-batch's backward
// Collectives are rings: an all-reduce moves 2(d-1)/d of the buffer per GPU, a reduce-scatter or
// all-gather (d-1)/d, each over the slowest link its group spans, at kLinkEfficiency of nominal.
#include <algorithm>
#include <cmath>
#include <utility>

#include "planner/planner.hpp"
#include "planner/shape.hpp"

namespace trainctl::planner {

namespace {

struct Link {
  double bytes_per_s = 1e9;
  double latency_s = 0;
};

// The slowest link inside a group of GPUs spanning `span` consecutive global ranks.
Link link_for_span(const topology::ClusterSpec& c, int span) {
  const double inter = c.inter_node_gbps > 0 ? c.inter_node_gbps : 1.0;
  const double intra = c.intra_node_gbps > 0 ? c.intra_node_gbps : inter;
  const double nvlink = c.nvlink_gbps > 0 ? c.nvlink_gbps : intra;
  const int gpn = std::max(1, c.gpus_per_node);
  const int domain = std::max(1, c.nvlink_domain);
  Link l;
  if (span <= domain && domain % span == 0) {
    l.bytes_per_s = nvlink * 1e9;
    l.latency_s = c.nvlink_latency_us * 1e-6;
  } else if (span <= gpn && gpn % span == 0) {
    l.bytes_per_s = intra * 1e9;
    l.latency_s = c.nvlink_latency_us * 1e-6;
  } else {
    l.bytes_per_s = inter * 1e9;
    l.latency_s = c.inter_node_latency_us * 1e-6;
  }
  l.bytes_per_s *= kLinkEfficiency;
  return l;
}

// Ring collective: `passes` = 2 for all-reduce, 1 for reduce-scatter / all-gather / all-to-all.
double ring_seconds(double bytes, int group, const Link& link, double passes) {
  if (group <= 1 || bytes <= 0) return 0;
  const double steps = passes * (group - 1);
  return steps / group * bytes / link.bytes_per_s + steps * link.latency_s;
}

// The interleaved and ZB-H1 schedules' sends do not wait for the peer (Trainer,
// Communicator::isend). On NCCL they still do until sends get a stream of their own: there the
// planner is optimistic by the waits (the lists run either way).
bool buffered_sends(const PipelineShape& shape) {
  return shape.schedule == PipeSchedule::interleaved || shape.schedule == PipeSchedule::zb_h1;
}

}  // namespace

double peak_tflops(const topology::GpuSpec& g, tensor::DType compute) {
  switch (compute) {
    case tensor::DType::bf16:
      return g.peak_tflops_bf16;
    case tensor::DType::f16:
      return g.peak_tflops_fp16;
    case tensor::DType::f64:
      return g.peak_tflops_fp32 / 2;
    default:  // f32 (the recipe offers no other compute type)
      break;
  }
  return g.peak_tflops_fp32;
}

TimeEstimate estimate_time(const recipe::Recipe& r, const topology::ClusterSpec& cluster,
                           const Variant& lay, const TimeOptions& options) {
  const ModelShape s = shape_of(r);
  const Sizes z = sizes_of(r.model.storage);
  const double efficiency =
      options.compute_efficiency > 0 ? options.compute_efficiency : kDefaultComputeEfficiency;
  const double peak = std::max(peak_tflops(cluster.gpu, r.model.storage), 1e-3) * 1e12;
  const double flops_per_s = peak * efficiency;
  // With fp8 the blocks' linear layers (qkv, proj, fc1, fc2, experts) run on the fp8 tensor
  // cores; attention's scores and values, the router and the head stay at the storage precision.
  const bool fp8 = r.model.fp8 != recipe::Fp8::none && cluster.gpu.peak_tflops_fp8 > 0;
  const double linear_flops_per_s =
      fp8 ? cluster.gpu.peak_tflops_fp8 * 1e12 * efficiency : flops_per_s;
  const bool full = lay.recompute == trainctl::Recompute::full;
  const double passes = full ? 4.0 : 3.0;  // forward, backward (2x), recompute forward
  // A micro-batch's tokens on one rank: context parallel keeps seq_len / cp of each sequence.
  const double n = static_cast<double>(lay.micro_batch) * (s.T / lay.cp);
  const double hidden_bytes = n * s.C * z.storage;

  // Rank order tp-cp-ep-dp-pp: each group spans the ranks of the axes before it.
  const Link tp_link = link_for_span(cluster, lay.tp);
  const Link cp_link = link_for_span(cluster, lay.tp * lay.cp);
  const Link ep_link = link_for_span(cluster, lay.tp * lay.cp * lay.ep);
  const Link dp_link = link_for_span(cluster, lay.tp * lay.cp * lay.ep * lay.dp);
  // Adjacent stages are tp*cp*ep*dp ranks apart: another node unless a whole stage shares one.
  const Link pp_link = link_for_span(cluster, 2 * lay.tp * lay.cp * lay.ep * lay.dp);
  // Gradients are summed, and ZeRO shards, over the dp and cp ranks together.
  const int dp_group = lay.dp * lay.cp;
  const double collectives_per_layer = full ? 6.0 : 4.0;  // 2 fwd + 2 bwd (+ 2 recompute)
  // Ring passes over tp of one [N, C] activation per layer. Without sequence parallelism two
  // all-reduces (two passes each) per forward, backward and full recompute. With it, the forward
  // all-gathers before qkv and fc1 and reduce-scatters after proj and fc2 (the same bytes); the
  // backward gathers the output gradients, gathers the inputs again for the weight gradients
  // (the engine keeps only its rows), and reduce-scatters the input gradients: 6 passes, not 4.
  const bool sp = lay.sequence_parallel && lay.tp > 1;
  const double tp_passes = (sp ? 10.0 : 8.0) + (full ? 4.0 : 0.0);

  TimeEstimate t;
  t.micro_batches = std::max(1, r.training.global_batch / (lay.micro_batch * lay.dp * lay.ep));
  t.pipeline = lay.pipeline(r);
  // The slowest rank sets the pace: stages differ by their layers (even, or parallel.pp_layers),
  // where MoE layers fall, and the head (last). With virtual stages (interleaved) a rank runs
  // each of its chunks, virtual stage c * pp + r, every micro-batch.
  struct RankSum {
    double total = 0, compute = 0, tp = 0, ep = 0, cp = 0, p2p = 0;
    int layers = 0;
  };
  std::vector<RankSum> ranks(static_cast<size_t>(lay.pp));
  const int virtual_stages = lay.pp * lay.pp_virtual;
  double transfer = 0;  // one pipeline send
  for (int stage = 0; stage < virtual_stages; ++stage) {
    const bool last = stage == virtual_stages - 1;
    const StageLayers st = stage_layers(r, stage, virtual_stages);
    const int layers_here = st.count;
    int moe = 0;
    for (int i = st.first; i < st.first + st.count; ++i)
      moe += r.model.is_moe_layer(i) ? 1 : 0;
    const double layer_flops = layers_here * s.attention_flops +
                               (layers_here - moe) * s.dense_mlp_flops + moe * s.moe_flops;
    const double linear_flops = layers_here * s.attention_linear_flops +
                                (layers_here - moe) * s.dense_mlp_flops + moe * s.moe_expert_flops;
    double other_flops = n * (layer_flops - linear_flops) * passes;
    if (last) other_flops += n * s.head_flops * 3.0;  // the head is never recomputed
    const double compute =
        (n * linear_flops * passes / linear_flops_per_s + other_flops / flops_per_s) / lay.tp;
    // fp8 under tp: each sharded Linear all-reduces its operands' amaxes (12 bytes, latency
    // alone) once per forward, backward and recompute pass: qkv and proj, then fc1 and fc2 of
    // the dense MLP or of every local expert.
    const double sharded_linears = 2.0 * layers_here + 2.0 * (layers_here - moe) +
                                   2.0 * moe * (r.model.moe.experts / std::max(1, lay.ep));
    const double amax_reduces = fp8 && lay.tp > 1 ? sharded_linears * (passes - 1.0) : 0.0;
    const double tp_comm = layers_here * ring_seconds(hidden_bytes, lay.tp, tp_link, tp_passes) +
                           amax_reduces * ring_seconds(12.0, lay.tp, tp_link, 2.0);
    const double ep_comm = moe * collectives_per_layer *
                           ring_seconds(n * s.K * s.C * z.storage / lay.tp, lay.ep, ep_link, 1.0);
    const double p2p =
        lay.pp > 1 ? 2.0 * (hidden_bytes / lay.tp / pp_link.bytes_per_s + pp_link.latency_s) : 0.0;
    // Context parallel, per layer: the ring passes a key/value block cp - 1 times in forward
    // (again with full recompute); backward passes the block with its gradients cp - 1 times and
    // the gradients home once. Counted whole: an upper bound, since with overlap_grad_sync the
    // engine passes the blocks and their gradients beside attention (BENCHMARKS.md); only the
    // gradients' last return is exposed.
    const double kv_elements = n * 2.0 * static_cast<double>(s.KV / lay.tp * s.D);
    auto hop = [&](double bytes) { return bytes / cp_link.bytes_per_s + cp_link.latency_s; };
    // A MoE layer under cp all-gathers the micro-batch's router logits in forward (again with
    // full recompute) and its gate gradients in backward.
    const double routed = n * lay.cp;
    const double cp_comm =
        lay.cp > 1
            ? layers_here * ((full ? 2.0 : 1.0) * (lay.cp - 1) * hop(kv_elements * z.storage) +
                             (lay.cp - 1) * hop(kv_elements * (z.storage + z.stats)) +
                             hop(kv_elements * z.stats)) +
                  moe * ((full ? 2.0 : 1.0) *
                             ring_seconds(routed * s.E * z.storage, lay.cp, cp_link, 1.0) +
                         ring_seconds(routed * s.K * z.stats, lay.cp, cp_link, 1.0))
            : 0.0;
    const double total = compute + tp_comm + ep_comm + cp_comm + p2p;
    // The schedule's view: a forward is one of the `passes` forward-equivalents, the backward
    // (with its recompute) the rest; the sends are the schedule's own. The backward splits into
    // B and W (StageTimes): W is the blocks' weight gradients, one GEMM of each linear layer's
    // forward FLOPs (qkv, proj, fc1, fc2; the router and every expert's fc1 and fc2), and the
    // embedding's backward (a scatter of rows, no FLOPs counted, as in the forward); B is the
    // rest, the collectives and the head's whole backward included. Only ZB-H1 runs them apart:
    // other schedules run B + W as one backward, the same figure as before the split.
    // With sequence parallelism W gathers the inputs of qkv and fc1 again (2 of the tp passes:
    // the engine keeps its rows only), which B then does not.
    const double work = total - p2p;
    const double regather =
        sp ? layers_here * ring_seconds(hidden_bytes, lay.tp, tp_link, 2.0) : 0.0;
    const double weight =
        (n * linear_flops / linear_flops_per_s + n * moe * s.moe_router_flops / flops_per_s) /
            lay.tp +
        regather;
    const double backward = work * (passes - 1.0) / passes;
    t.stage_times.push_back({work / passes, backward - weight, weight});
    RankSum& rank = ranks[static_cast<size_t>(stage % lay.pp)];
    rank.total += total;
    rank.compute += compute;
    rank.tp += tp_comm;
    rank.ep += ep_comm;
    rank.cp += cp_comm;
    rank.p2p += p2p;
    rank.layers += layers_here;
    transfer = p2p / 2;  // the same [N, C] / tp each way
  }
  const RankSum& worst =
      *std::max_element(ranks.begin(), ranks.end(),
                        [](const RankSum& a, const RankSum& b) { return a.total < b.total; });
  const double worst_stage = worst.total, worst_compute = worst.compute;
  const int layers = worst.layers;
  const double m = t.micro_batches;
  t.compute_s = m * worst_compute;
  t.tp_comm_s = m * worst.tp;
  t.ep_comm_s = m * worst.ep;
  t.cp_comm_s = m * worst.cp;
  t.pp_p2p_s = m * worst.p2p;
  t.pp_transfer_s = transfer;

  // Gradient sync: non-expert gradients over the dp*ep replicas, expert gradients over dp.
  const double expert_elements = static_cast<double>(s.moe_layers) * s.moe_experts / lay.ep;
  const double shared_elements = static_cast<double>(s.total()) - s.moe_layers * s.moe_experts;
  const double per_gpu = 1.0 / (static_cast<double>(lay.tp) * lay.pp);
  const double shared_bytes = shared_elements * per_gpu;
  const double expert_bytes = expert_elements * per_gpu;
  // The gradients' all-reduce, or ZeRO's reduce-scatter of them (half the ring traffic), ZeRO-2
  // and 3's in precision.reduce_dtype ...
  const double reduce_item =
      lay.zero >= 2 && r.precision.reduce_dtype == recipe::ReduceDtype::bf16 ? 2.0 : z.grad;
  auto reduce = [&](double elements, int group) {
    return ring_seconds(elements * reduce_item, group, dp_link, lay.zero ? 1.0 : 2.0);
  };
  // ... followed by ZeRO's all-gather of the updated parameters.
  auto gather = [&](double elements, int group) {
    return lay.zero ? ring_seconds(elements * z.storage, group, dp_link, 1.0) : 0.0;
  };
  // ZeRO shards over dp only: with ep > 1 everything is reduce-scattered over dp and the part's
  // non-expert share all-reduced over ep (after the wait, exposed); the gather is over dp.
  const int shared_group = lay.zero ? dp_group : dp_group * lay.ep;
  double reduce_s = reduce(shared_bytes, shared_group) + reduce(expert_bytes, dp_group);
  const double ep_part_s =
      lay.zero && lay.ep > 1 ? ring_seconds(shared_bytes / dp_group * z.grad, lay.ep, ep_link, 2.0)
                             : 0.0;
  const double one_pass = worst_compute / passes;        // one forward of the stage's micro-batch
  const double backward_pass = (passes - 1) * one_pass;  // its backward (and recompute)
  const bool overlapped = r.parallel.overlap_grad_sync;
  double gather_s = 0;
  if (lay.zero >= 2 && dp_group > 1) {
    // ZeRO-2 and 3 reduce-scatter each micro-batch's block gradients as its backward ends, and
    // the embedding, final norm and head (kept whole) once per step, blocking, after backward.
    const double outer = static_cast<double>(s.embedding + s.final_norm + s.head) * per_gpu;
    const double outer_reduce_s = reduce(outer, shared_group);
    const double block_reduce_s = std::max(0.0, reduce_s - outer_reduce_s);  // per micro-batch
    reduce_s = outer_reduce_s + m * block_reduce_s;
    // What shares the data-parallel link with each micro-batch's forward and backward, and what
    // no compute hides (the first gather of the step, the outer regions' collectives).
    double forward_link = 0, backward_link = block_reduce_s, exposed = outer_reduce_s;
    if (lay.zero >= 3) {
      // ZeRO-3 gathers each block's parameters over dp before its forward and its backward; a
      // value slot still holding a block saves its gather (ParamGather): per step the first
      // micro-batch's forward gathers every block, each later forward and every backward all
      // but two (the two slots), i.e. 2 m (B - 2) + min(B, 2) gathers of B blocks per stage.
      // With prefetch each runs while the block before it computes, except the step's first;
      // after the step the embedding, final norm and head are gathered once, blocking.
      const int blocks = std::max(1, layers);
      const double block_elements = (shared_bytes + expert_bytes - outer) / blocks;
      const double one = ring_seconds(block_elements * z.storage, dp_group, dp_link, 1.0);
      const double repeated = m * std::max(0, blocks - 2);
      const double forward_gathers = repeated + std::min(blocks, 2);
      const double backward_gathers = repeated;
      const double outer_gather_s = ring_seconds(outer * z.storage, dp_group, dp_link, 1.0);
      gather_s = (forward_gathers + backward_gathers) * one + outer_gather_s;
      forward_link = (forward_gathers - 1) * one / m;
      backward_link += backward_gathers * one / m;
      exposed += one + outer_gather_s;
    } else {
      // ZeRO-2's bucketed all-gather of all updated parameters hides behind the next step's
      // first forward, which waits for each bucket only as it reaches it.
      gather_s = gather(shared_bytes, shared_group) + gather(expert_bytes, dp_group);
      exposed += std::max(0.0, gather_s - one_pass);
    }
    // Gathers and reduce-scatters queue on one link: each micro-batch's forward hides its
    // gathers, its backward its gathers and reduce-scatters, as far as the compute lasts.
    exposed +=
        m * (std::max(0.0, forward_link - one_pass) + std::max(0.0, backward_link - backward_pass));
    t.dp_comm_s = reduce_s + gather_s + ep_part_s;
    t.dp_exposed_s = ep_part_s + (overlapped ? exposed : reduce_s + gather_s);
  } else {
    // With parallel.overlap_grad_sync the bucketed reduction (all-reduce, or ZeRO-1's
    // reduce-scatter) starts as the last micro-batch's backward produces gradients, so it hides
    // behind that backward, and ZeRO-1's bucketed all-gather of the updated parameters behind
    // the next step's first forward (1 of the `passes` forward-equivalents of one stage time):
    // that forward waits for each bucket only as it reaches it.
    gather_s = gather(shared_bytes, shared_group) + gather(expert_bytes, dp_group);
    t.dp_comm_s = reduce_s + gather_s + ep_part_s;
    t.dp_exposed_s = ep_part_s + (overlapped ? std::max(0.0, reduce_s - backward_pass) +
                                                   std::max(0.0, gather_s - one_pass)
                                             : reduce_s + gather_s);
  }

  // Every stage computes its m micro-batches and sends at least two messages for each, so no
  // schedule takes less than m slowest-stage times: a variant that cannot beat `skip_above_s`
  // even so is not simulated (the search's pruning; the estimate then holds that bound).
  const double lower_bound = m * worst_stage + t.dp_exposed_s;
  if (options.skip_above_s > 0 && lower_bound >= options.skip_above_s) {
    t.step_s = lower_bound;
    t.bound_only = true;
    return t;
  }
  const double pipeline_s = makespan(schedule_of(t.pipeline).lists, t.stage_times, t.pp_transfer_s,
                                     buffered_sends(t.pipeline));
  t.bubble_s = std::max(0.0, pipeline_s - m * worst_stage);
  t.step_s = std::max(pipeline_s, m * worst_stage) + t.dp_exposed_s;
  const double tokens = static_cast<double>(r.training.global_batch) * s.T;
  const double forward = s.forward_flops_per_token();
  t.model_flops = 3.0 * forward * tokens;
  t.hardware_flops = tokens * ((forward - s.head_flops) * passes + 3.0 * s.head_flops);
  const double gpus = lay.world_size();
  t.tokens_per_s_per_gpu = tokens / t.step_s / gpus;
  t.mfu = t.model_flops / (t.step_s * gpus * peak);
  return t;
}

Timeline planned_timeline(const TimeEstimate& t) {
  Timeline timeline = simulate(schedule_of(t.pipeline).lists, t.stage_times, t.pp_transfer_s,
                               buffered_sends(t.pipeline));
  timeline.schedule = schedule_name(t.pipeline.schedule);
  return timeline;
}

}  // namespace trainctl::planner
