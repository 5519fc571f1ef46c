#include "backend/arg_check.hpp"

#include <stdexcept>
#include <tuple>
#include <utility>

#include <fmt/format.h>

namespace trainctl::backend {

void ArgCheck::fail(std::string_view op, const std::string& message) const {
  throw std::invalid_argument(fmt::format("{} backend {}: {}", backend_, op, message));
}

void ArgCheck::present(std::string_view op, std::string_view name, const Tensor& t) const {
  if (t.empty()) fail(op, fmt::format("{} is empty (null data) but is required", name));
  if (t.device == device_) return;
  if (device_ == Device::cpu) fail(op, fmt::format("{} is not in host memory", name));
  fail(op, fmt::format("{} is in host memory; the {} backend takes tensors from its own allocate()",
                       name, backend_));
}

void ArgCheck::dtype(std::string_view op, std::string_view name, const Tensor& t,
                     DType expected) const {
  present(op, name, t);
  if (t.dtype != expected)
    fail(op, fmt::format("{} has dtype {}, expected {}", name, tensor::dtype_name(t.dtype),
                         tensor::dtype_name(expected)));
}

void ArgCheck::numel(std::string_view op, std::string_view name, const Tensor& t,
                     int64_t expected) const {
  present(op, name, t);
  if (t.numel() != expected)
    fail(op, fmt::format("{} has shape {} ({} elements), expected {} elements", name,
                         t.shape.to_string(), t.numel(), expected));
}

int64_t ArgCheck::rows(std::string_view op, std::string_view name, const Tensor& t,
                       int64_t width) const {
  present(op, name, t);
  if (width <= 0 || t.numel() % width != 0)
    fail(op, fmt::format("{} has shape {}, which is not a whole number of rows of {}", name,
                         t.shape.to_string(), width));
  return t.numel() / width;
}

void ArgCheck::gemm(const GemmArgs& g) const {
  constexpr std::string_view op = "gemm";
  present(op, "a", g.a);
  present(op, "b", g.b);
  present(op, "c", g.c);
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0)
    fail(op,
         fmt::format("m={}, n={}, k={}, batch={} must all be positive", g.m, g.n, g.k, g.batch));
  if (g.b.dtype != g.a.dtype)
    fail(op, fmt::format("a is {} but b is {}: a and b must share one dtype",
                         tensor::dtype_name(g.a.dtype), tensor::dtype_name(g.b.dtype)));
  if (g.c.dtype != g.a.dtype && g.c.dtype != grad_dtype(g.a.dtype))
    fail(op, fmt::format("c is {} for {} inputs: expected {} or {}", tensor::dtype_name(g.c.dtype),
                         tensor::dtype_name(g.a.dtype), tensor::dtype_name(g.a.dtype),
                         tensor::dtype_name(grad_dtype(g.a.dtype))));
  const auto need = [&](std::string_view name, const Tensor& t, int64_t size, int64_t stride) {
    const int64_t last = (g.batch - 1) * stride + size;
    if (t.numel() < last)
      fail(op, fmt::format("{} has {} elements but batch {} with stride {} needs {}", name,
                           t.numel(), g.batch, stride, last));
  };
  need("a", g.a, g.m * g.k, g.stride_a);
  need("b", g.b, g.k * g.n, g.stride_b);
  need("c", g.c, g.m * g.n, g.stride_c);
  if (g.fp8_a || g.fp8_b) {
    for (const auto& [name, format] : {std::pair{"fp8_a", g.fp8_a}, std::pair{"fp8_b", g.fp8_b}})
      if (format && *format != DType::e4m3 && *format != DType::e5m2)
        fail(op, fmt::format("{} is {}: an fp8 operand is e4m3 or e5m2", name,
                             tensor::dtype_name(*format)));
    if (g.a.dtype == DType::f64) fail(op, "fp8 operands need f32, bf16 or f16 inputs, not f64");
    if (g.batch != 1) fail(op, fmt::format("fp8 operands need batch 1, got {}", g.batch));
    if (g.epilogue != Epilogue::none) fail(op, "fp8 operands need epilogue none");
  }
  for (const auto& [name, amax, format] :
       {std::tuple{"amax_a", &g.amax_a, g.fp8_a}, std::tuple{"amax_b", &g.amax_b, g.fp8_b}}) {
    if (amax->empty()) continue;
    if (!format)
      fail(op, fmt::format("{} is given but its operand is not fp8: it only scales fp8 operands",
                           name));
    dtype(op, name, *amax, DType::f32);
    numel(op, name, *amax, 1);
  }
  if (g.epilogue == Epilogue::gelu) {
    present(op, "pre_gelu", g.pre_gelu);
    dtype(op, "pre_gelu", g.pre_gelu, g.c.dtype);
    numel(op, "pre_gelu", g.pre_gelu, g.m * g.n);
    if (g.batch != 1 || g.beta != 0)
      fail(op, fmt::format("epilogue gelu needs batch 1 and beta 0, got batch {} and beta {}",
                           g.batch, g.beta));
    if (g.c.data == g.pre_gelu.data) fail(op, "epilogue gelu: c and pre_gelu must not alias");
  }
  if (!g.bias.empty()) {
    numel(op, "bias", g.bias, g.n);
    if (g.bias.dtype != g.c.dtype && g.bias.dtype != g.a.dtype)
      fail(op, fmt::format("bias is {}: expected the dtype of c ({}) or of a ({})",
                           tensor::dtype_name(g.bias.dtype), tensor::dtype_name(g.c.dtype),
                           tensor::dtype_name(g.a.dtype)));
  }
}

void ArgCheck::amax(const Tensor& out, const Tensor& src) const {
  constexpr std::string_view op = "amax";
  dtype(op, "out", out, DType::f32);
  numel(op, "out", out, 1);
  present(op, "src", src);
  if (src.dtype != DType::f32 && src.dtype != DType::bf16 && src.dtype != DType::f16)
    fail(op, fmt::format("src is {}: amax takes f32, bf16 or f16", tensor::dtype_name(src.dtype)));
}

void ArgCheck::adamw_ranges(std::string_view op, int64_t count,
                            std::span<const Backend::AdamWRange> ranges) const {
  int64_t previous_end = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Backend::AdamWRange& r = ranges[i];
    if (r.begin < previous_end || r.end < r.begin || r.end > count)
      fail(op, fmt::format("range {} is [{}, {}): ranges must be ascending, disjoint and inside "
                           "the {} elements (the previous one ends at {})",
                           i, r.begin, r.end, count, previous_end));
    previous_end = r.end;
  }
}

void ArgCheck::attention(std::string_view op, const AttentionShape& s) const {
  if (s.B <= 0 || s.T <= 0 || s.H <= 0 || s.KV <= 0 || s.D <= 0)
    fail(op, fmt::format("B={}, T={}, H={}, KV={}, D={} must all be positive", s.B, s.T, s.H, s.KV,
                         s.D));
  if (s.H % s.KV != 0)
    fail(op,
         fmt::format("H={} query heads are not a multiple of KV={} key/value heads", s.H, s.KV));
}

void ArgCheck::attention_block(std::string_view op, const AttentionBlockShape& s) const {
  attention(op, AttentionShape{s.B, s.Tq, s.H, s.KV, s.D});
  if (s.Tk <= 0) fail(op, fmt::format("Tk={} must be positive", s.Tk));
}

ArgCheck::RouterDims ArgCheck::router(std::string_view op, const RouterArgs& r) const {
  present(op, "logits", r.logits);
  if (r.logits.shape.rank != 2)
    fail(op, fmt::format("logits must be [N, E], got {}", r.logits.shape.to_string()));
  const int64_t N = r.logits.shape[0], E = r.logits.shape[1], K = r.top_k;
  if (K < 1 || K > E) fail(op, fmt::format("top_k={} must be in [1, E={}]", K, E));
  const DType a = stats_dtype(r.logits.dtype);
  dtype(op, "probs", r.probs, a);
  numel(op, "probs", r.probs, N * E);
  dtype(op, "expert_idx", r.expert_idx, DType::i32);
  numel(op, "expert_idx", r.expert_idx, N * K);
  dtype(op, "gates", r.gates, a);
  numel(op, "gates", r.gates, N * K);
  dtype(op, "slot", r.slot, DType::i32);
  numel(op, "slot", r.slot, N * K);
  dtype(op, "counts", r.counts, DType::i32);
  numel(op, "counts", r.counts, E);
  dtype(op, "load", r.load, a);
  numel(op, "load", r.load, E);
  return {N, E, K};
}

ArgCheck::PermuteDims ArgCheck::permute(std::string_view op, std::string_view token_name,
                                        const Tensor& tokens, std::string_view expert_name,
                                        const Tensor& experts, const Tensor& slot) const {
  present(op, token_name, tokens);
  dtype(op, expert_name, experts, tokens.dtype);
  dtype(op, "slot", slot, DType::i32);
  if (tokens.shape.rank != 2)
    fail(op, fmt::format("{} must be [N, C], got {}", token_name, tokens.shape.to_string()));
  const int64_t N = tokens.shape[0], C = tokens.shape[1];
  const int64_t K = N ? slot.numel() / N : 0;
  if (N <= 0 || slot.numel() != N * K)
    fail(op, fmt::format("slot {} is not [N={}, k]", slot.shape.to_string(), N));
  return {N, K, C, rows(op, expert_name, experts, C)};
}

}  // namespace trainctl::backend
