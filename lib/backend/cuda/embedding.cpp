// CudaBackend: token (+ position) embedding and its vocab-parallel form. The contract's checks ran
// in Backend's wrappers (backend_ops.cpp); here the CUDA backend's own (the dtypes it computes on,
// its kernels' limits), then the launch of kernels/embedding.cu on the backend's stream.
//
// Token ids live on the GPU and are not checked without a device round trip: the kernels never
// read or write out of bounds with a bad id, and a token outside a whole table yields a NaN row, so
// the trainer's finite check stops the step (kernels/embedding.cuh).
// Determinism: no float atomics; every reduction runs in an order fixed by the shapes, so repeats
// on one GPU are bit-identical (tests/gpu/gpu_layers_test.cpp checks each op twice).
#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "backend/cuda/cuda_args.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_backend_impl.hpp"
#include "kernels/embedding.cuh"

namespace trainctl::backend::cuda {

using kernels::Storage;

namespace {

struct EmbeddingDims {
  int64_t N, C, V;
};

// table [V, C], N tokens (checked by Backend's wrapper).
EmbeddingDims embedding_dims(const Tensor& table, const Tensor& tokens) {
  return {tokens.numel(), table.shape[1], table.shape[0]};
}

}  // namespace

void CudaBackend::do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                       const Tensor& wpe, int64_t T) {
  do_embedding_forward_shard(out, tokens, wte, wpe, T, -1);
}

void CudaBackend::do_embedding_forward_shard(const Tensor& out, const Tensor& tokens,
                                             const Tensor& wte, const Tensor& wpe, int64_t T,
                                             int64_t vocab_begin) {
  // vocab_begin -1 marks the whole-table lookup (embedding_forward): rows start at 0 and a token
  // outside the table is an error (NaN row), not another rank's row.
  const bool shard = vocab_begin >= 0;
  const std::string_view op = shard ? "embedding_forward_shard" : "embedding_forward";
  const Storage s = storage_of(op, "wte", wte);
  const auto [N, C, V] = embedding_dims(wte, tokens);
  activate(*impl_, op);
  check_cuda(kernels::launch_embedding_forward(s, out.data, i32(tokens), wte.data, wpe.data, N, C,
                                               V, T, shard ? vocab_begin : 0, shard, impl_->stream),
             op, "the embedding kernel");
}

void CudaBackend::do_embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                        const Tensor& tokens, int64_t T) {
  do_embedding_backward_shard(dwte, dwpe, dout, tokens, T, -1);
}

void CudaBackend::do_embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe,
                                              const Tensor& dout, const Tensor& tokens, int64_t T,
                                              int64_t vocab_begin) {
  const bool shard = vocab_begin >= 0;
  const std::string_view op = shard ? "embedding_backward_shard" : "embedding_backward";
  const Storage s = storage_of(op, "dout", dout);
  const auto [N, C, V] = embedding_dims(dwte, tokens);
  if (N >= INT32_MAX || V >= INT32_MAX)
    fail(op, fmt::format("N={} tokens or V={} rows exceed the sort's 32-bit keys", N, V));
  activate(*impl_, op);
  const size_t bytes = kernels::embedding_backward_scratch_bytes(N, V);
  void* scratch = impl_->scratch_for(bytes);
  check_cuda(
      kernels::launch_embedding_backward(s, f32(dwte), f32(dwpe), dout.data, i32(tokens), N, C, V,
                                         T, shard ? vocab_begin : 0, scratch, bytes, impl_->stream),
      op, "the embedding backward kernels");
}

}  // namespace trainctl::backend::cuda
