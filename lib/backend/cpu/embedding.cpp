// Token (+ learned position) embedding. Forward: out[n] = wte[tokens[n]] + wpe[n % T], summed in
// the compute type and rounded once. Backward accumulates (+=) into G gradients in token order
// n = 0, 1, ..., so repeated tokens always add up in the same order.
#include <string_view>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.hpp"

namespace trainctl::backend::cpu {

namespace {

struct EmbeddingDims {
  int64_t N, C, V;
};

// The shapes (checked by Backend's wrapper), then what only a host backend can check: a whole
// table's tokens inside it.
EmbeddingDims check_tokens(std::string_view op, const Tensor& table, const Tensor& tokens,
                           bool shard) {
  const int64_t V = table.shape[0], C = table.shape[1];
  const int64_t N = tokens.numel();
  const int32_t* tok = tokens.as<int32_t>();
  for (int64_t n = 0; n < N && !shard; ++n)
    if (tok[n] < 0 || tok[n] >= V)
      fail(op, fmt::format("tokens[{}] = {} is outside the vocabulary [0, {}): check the data's "
                           "vocab_size against the model's",
                           n, tok[n], V));
  return {N, C, V};
}

// The lookups of a whole table (vocab_begin 0, every token checked to be inside it) and of a
// vocab-parallel shard (rows of tokens outside [vocab_begin, vocab_begin + V) read zeros forward
// and take no gradient backward; positions count for every token) share these loops.
void embedding_forward_rows(std::string_view op, const Tensor& out, const Tensor& tokens,
                            const Tensor& wte, const Tensor& wpe, int64_t T, int64_t vocab_begin,
                            bool shard) {
  const auto [N, C, V] = check_tokens(op, wte, tokens, shard);
  dispatch_float(wte.dtype, op, "wte", [&]<class S>(Tag<S>) {
    using Cm = compute_t<S>;
    const int32_t* tok = tokens.as<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = tok[n] - vocab_begin;
      const S* w = row >= 0 && row < V ? wte.as<S>() + row * C : nullptr;
      const S* p = wpe.empty() ? nullptr : wpe.as<S>() + (n % T) * C;
      S* o = out.as<S>() + n * C;
      for (int64_t c = 0; c < C; ++c) {
        Cm value = w ? tensor::load(w[c]) : Cm(0);
        if (p) value += tensor::load(p[c]);
        o[c] = tensor::store<S>(value);
      }
    }
  });
}

void embedding_backward_rows(std::string_view op, const Tensor& dwte, const Tensor& dwpe,
                             const Tensor& dout, const Tensor& tokens, int64_t T,
                             int64_t vocab_begin, bool shard) {
  const auto [N, C, V] = check_tokens(op, dwte, tokens, shard);
  dispatch_float(dout.dtype, op, "dout", [&]<class S>(Tag<S>) {
    using G = compute_t<S>;
    const int32_t* tok = tokens.as<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = tok[n] - vocab_begin;
      const S* d = dout.as<S>() + n * C;
      G* w = row >= 0 && row < V ? dwte.as<G>() + row * C : nullptr;
      G* p = dwpe.empty() ? nullptr : dwpe.as<G>() + (n % T) * C;
      for (int64_t c = 0; c < C; ++c) {
        const G g = tensor::load(d[c]);
        if (w) w[c] += g;
        if (p) p[c] += g;
      }
    }
  });
}

}  // namespace

void CpuBackend::do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                      const Tensor& wpe, int64_t T) {
  const ScopedOp timed(timer_, OpFamily::embedding);
  embedding_forward_rows("embedding_forward", out, tokens, wte, wpe, T, 0, false);
}

void CpuBackend::do_embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                       const Tensor& tokens, int64_t T) {
  const ScopedOp timed(timer_, OpFamily::embedding);
  embedding_backward_rows("embedding_backward", dwte, dwpe, dout, tokens, T, 0, false);
}

void CpuBackend::do_embedding_forward_shard(const Tensor& out, const Tensor& tokens,
                                            const Tensor& wte, const Tensor& wpe, int64_t T,
                                            int64_t vocab_begin) {
  const ScopedOp timed(timer_, OpFamily::embedding);
  embedding_forward_rows("embedding_forward_shard", out, tokens, wte, wpe, T, vocab_begin, true);
}

void CpuBackend::do_embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe,
                                             const Tensor& dout, const Tensor& tokens, int64_t T,
                                             int64_t vocab_begin) {
  const ScopedOp timed(timer_, OpFamily::embedding);
  embedding_backward_rows("embedding_backward_shard", dwte, dwpe, dout, tokens, T, vocab_begin,
                          true);
}

}  // namespace trainctl::backend::cpu
