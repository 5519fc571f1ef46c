// The one table of Backend op cases that both op suites iterate:
//   reference  tests/unit/backend_ops_test.cpp: the CPU backend against naive double-precision
//              loops, in every storage dtype (kReferenceTypes);
//   gpu        tests/gpu/gpu_backend_test.cpp and gpu_layers_test.cpp: the CUDA backend against
//              the CPU backend (gpu_compare.hpp), in the dtypes it computes on (kGpuTypes).
// A row is one shape of one op (family); `suites` says which suites run it. kBoth where both can:
// a shape the GPU tests chose (tile edges, ragged sizes, GQA) is then also proven against the naive
// loops, and the reference suite's small odd shapes also run on the GPU. A row stays in one suite
// where the other cannot take it: f64-only needs, a head size without a CUDA attention kernel
// (D 6), token and target patterns written for one vocabulary, or sizes too large for the naive
// loops (the GPT-2-size attention, the big GEMMs).
// Adding a case: one row here. Adding an op: its table here, then its check in both suites.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"

namespace op_cases {

using trainctl::backend::AttentionShape;
using trainctl::tensor::DType;

enum Suite : unsigned { kReference = 1u << 0, kGpu = 1u << 1, kBoth = kReference | kGpu };

inline constexpr DType kReferenceTypes[] = {DType::f64, DType::f32, DType::bf16, DType::f16};
inline constexpr DType kGpuTypes[] = {DType::f32, DType::bf16, DType::f16};

// The rows of `table` that `suite` runs, in table order.
template <class Case, size_t count>
std::vector<Case> rows(const Case (&table)[count], Suite suite) {
  std::vector<Case> out;
  for (const Case& c : table)
    if ((c.suites & suite) != 0) out.push_back(c);
  return out;
}

// ---- gemm ----------------------------------------------------------------------------------
// Every transpose. reference: batch 3 at packed strides, bias, alpha 0.75, beta 0 and 0.5;
// gpu: one product, c of the inputs' dtype.
struct GemmShape {
  int64_t m, n, k;
  unsigned suites;
};
inline constexpr GemmShape kGemmShapes[] = {
    {5, 7, 13, kBoth},      {1, 1, 1, kBoth},     {1, 7, 3, kBoth},     {5, 1, 9, kBoth},
    {7, 13, 33, kBoth},     {64, 64, 64, kBoth},  {127, 65, 31, kBoth}, {128, 256, 512, kGpu},
    {512, 768, 1024, kGpu}, {1024, 1, 768, kGpu},
};

// Products of bf16/f16 (gpu: also f32) inputs accumulated into f32 with beta 1 (weight gradients).
// reference: two accumulations, alpha 1; gpu: one, alpha 1 and 0.25.
struct GemmAccumulateCase {
  int64_t m, n, k;
  bool trans_a, trans_b;
  unsigned suites;
};
inline constexpr GemmAccumulateCase kGemmAccumulate[] = {
    {6, 9, 11, true, true, kReference},
    {768, 320, 1000, true, false, kGpu},  // dW = dout^T x: the layout the model uses
    {33, 320, 1000, false, true, kGpu},
};

// bias_backward: dbias[cols] += column sums of dout[rows, cols].
struct BiasBackwardShape {
  int64_t rows, cols;
  unsigned suites;
};
inline constexpr BiasBackwardShape kBiasBackward[] = {
    {7, 13, kBoth},    {1, 1, kBoth},      {7, 33, kBoth},
    {1000, 96, kBoth}, {4099, 768, kBoth}, {64, 50257, kBoth},
};

// ---- norms: layernorm and rmsnorm over [N, C] ----------------------------------------------
struct NormShape {
  int64_t N, C;
  unsigned suites;
};
inline constexpr NormShape kNorms[] = {
    {7, 13, kBoth}, {37, 64, kBoth}, {37, 769, kBoth}, {45, 32, kBoth}, {45, 1000, kBoth},
};

// ---- activations: gelu over [N, 2F] (reference) or [N, F] (gpu), swiglu [N, 2F] -> [N, F] ----
struct ActivationShape {
  int64_t N, F;
  unsigned suites;
};
inline constexpr ActivationShape kActivations[] = {{5, 11, kBoth}, {41, 101, kBoth}};

// ---- rope: [B*T, heads*D + extra] with the first `rotated` heads rotated --------------------
struct RopeShape {
  int64_t B, T, heads, rotated, D, extra;
  unsigned suites;
  int64_t width() const { return heads * D + extra; }
};
inline constexpr RopeShape kRope[] = {{2, 7, 3, 2, 6, 4, kBoth}, {3, 7, 6, 4, 64, 0, kBoth}};

// ---- attention -----------------------------------------------------------------------------
struct AttentionCase {
  AttentionShape shape;
  unsigned suites;
};
inline constexpr AttentionCase kAttention[] = {
    {{2, 7, 4, 2, 6}, kReference},  // GQA; D 6 has no CUDA kernel (32, 64, 128)
    {{2, 45, 4, 4, 32}, kBoth},     // B > 1, T not a multiple of the 32-row tile
    {{1, 70, 8, 2, 64}, kBoth},     // GQA: 4 query heads per kv head
    {{2, 33, 2, 1, 128}, kBoth},    // multi-query, one row past a tile
    {{1, 1, 2, 2, 64}, kBoth},      // a single token
    {{1, 96, 8, 2, 128}, kBoth},    // whole tiles, GQA
};
// GPT-2's size (T 1024, 12 heads, D 64, MHA and GQA 12/4), in bf16 and f32.
inline constexpr AttentionCase kAttentionGpt2[] = {
    {{1, 1024, 12, 12, 64}, kGpu},
    {{1, 1024, 12, 4, 64}, kGpu},
};

// ---- embedding: N = B*T tokens over a [V, C] table -----------------------------------------
// Each suite writes its own token pattern for its vocabulary (the reference suite a fixed one
// with a repeat, the GPU suite many repeats of multiples of 5 below 50, and V - 1).
struct EmbeddingShape {
  int64_t B, T, V, C;
  unsigned suites;
};
inline constexpr EmbeddingShape kEmbedding[] = {{2, 7, 9, 13, kReference}, {3, 17, 50, 300, kGpu}};

// Vocab-parallel: a [V_local, C] shard holding ids [vocab_begin, vocab_begin + V_local).
struct EmbeddingShardShape {
  int64_t B, T, V_local, vocab_begin, C;
  unsigned suites;
};
inline constexpr EmbeddingShardShape kEmbeddingShard[] = {{2, 13, 15, 20, 70, kGpu}};

// ---- cross-entropy over [N, V] -------------------------------------------------------------
// Each suite writes its own targets (negative ones included).
struct CrossEntropyShape {
  int64_t N, V;
  unsigned suites;
};
inline constexpr CrossEntropyShape kCrossEntropy[] = {
    {6, 13, kReference},
    {19, 1000, kGpu},
    {19, 50257, kGpu},
};

// Vocab-parallel backward over an [N, V_local] slice starting at vocab_begin.
struct CrossEntropyShardShape {
  int64_t N, V_local, vocab_begin;
  unsigned suites;
};
inline constexpr CrossEntropyShardShape kCrossEntropyShard[] = {{23, 333, 333, kGpu}};

}  // namespace op_cases
