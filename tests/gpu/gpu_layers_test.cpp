// The CUDA backend's layer ops (norms, activations, RoPE, attention, embedding, cross-entropy,
// MoE) against the CPU backend (tests/gpu/gpu_compare.hpp): fresh random inputs, GPU outputs
// poisoned (NaN) before each run, tolerances per dtype (f32 1e-5, f16 1e-3, bf16 1e-2; f32
// statistics such as mean, rstd, lse at 1e-5 whatever the storage), shapes that are not
// multiples of the kernels' tiles, GQA, head sizes 32/64/128, B > 1.
//
// Identical bits where the GPU follows the CPU's order of operations exactly: embedding forward
// and backward (sorted tokens, then the CPU's sequential sums), MoE routing decisions (indices,
// slots, counts, load) and permute. Determinism: every op runs twice on the GPU and must give
// the same bits (accumulated gradients are reset to their initial values in between).
// The shapes are the gpu rows of the shared case table (tests/unit/backend_op_cases.hpp), which
// the CPU reference suite iterates too.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend_op_cases.hpp"
#include "gpu_compare.hpp"

using gpu_compare::Harness;
using gpu_compare::kGpuFloatTypes;
using gpu_compare::Tolerance;
using gpu_compare::Twin;
using trainctl::backend::AttentionShape;
using trainctl::backend::Backend;
using trainctl::backend::RouterArgs;
using trainctl::backend::RouterLosses;
using trainctl::tensor::DType;
using trainctl::tensor::dtype_name;
using trainctl::tensor::Tensor;

namespace {

using op_cases::kGpu;
using op_cases::rows;

const Tensor& side(const Twin& t, bool gpu) {
  return gpu ? t.gpu : t.cpu;
}

Tensor none() {
  return Tensor{};
}

// Makes the GPU side hold the CPU side's values (inputs that an earlier op produced, so both
// backends start the next op from the same bits).
void copy_cpu_to_gpu(Harness& h, const Twin& t) {
  const auto bytes = h.bytes(t.cpu);
  h.gpu().copy_from_host(t.gpu, bytes.data());
}

// Runs op on the CPU, then (after poisoning `outputs` and restoring `accumulated` to their
// state before the op) twice on the GPU; the two GPU runs must agree bit for bit. The second
// GPU result is left for the caller to compare with the CPU.
void run_both(Harness& h, const std::vector<const Twin*>& outputs,
              const std::vector<const Twin*>& accumulated,
              const std::function<void(Backend&, bool)>& op) {
  std::vector<std::vector<unsigned char>> before;
  for (const Twin* t : accumulated)
    before.push_back(h.bytes(t->gpu));
  op(h.cpu(), false);
  std::vector<std::vector<unsigned char>> first;
  for (int run = 0; run < 2; ++run) {
    for (const Twin* t : outputs)
      h.poison(*t);
    for (size_t i = 0; i < accumulated.size(); ++i)
      h.gpu().copy_from_host(accumulated[i]->gpu, before[i].data());
    op(h.gpu(), true);
    for (size_t i = 0; i < outputs.size() + accumulated.size(); ++i) {
      const Twin* t = i < outputs.size() ? outputs[i] : accumulated[i - outputs.size()];
      auto bytes = h.bytes(t->gpu);
      if (run == 0) {
        first.push_back(std::move(bytes));
      } else {
        INFO("output " << i << " (" << dtype_name(t->dtype()) << ") repeats bit for bit");
        CHECK(bytes == first[i]);
      }
    }
  }
}

std::string label(DType dtype) {
  return std::string(dtype_name(dtype));
}

}  // namespace

// ---- norms ---------------------------------------------------------------------------------

TEST_CASE("cuda layernorm forward and backward match the CPU (with and without bias)") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const op_cases::NormShape& shape : rows(op_cases::kNorms, kGpu))
      for (const bool with_bias : {true, false}) {
        const int64_t N = shape.N, C = shape.C;
        INFO(label(dtype) << " N=" << N << " C=" << C << " bias=" << with_bias);
        Twin x = h.random(dtype, {N, C}, 0, 0.05, 2.0);
        Twin w = h.random(dtype, {C});
        Twin b = h.random(dtype, {C});
        Twin out = h.output(dtype, {N, C});
        Twin mean = h.output(DType::f32, {N});
        Twin rstd = h.output(DType::f32, {N});
        run_both(h, {&out, &mean, &rstd}, {}, [&](Backend& be, bool g) {
          be.layernorm_forward(side(out, g), side(mean, g), side(rstd, g), side(x, g), side(w, g),
                               with_bias ? side(b, g) : none(), 1e-5);
        });
        GPU_EXPECT_CLOSE(h, out, "layernorm out");
        GPU_EXPECT_CLOSE(h, mean, "layernorm mean");
        GPU_EXPECT_CLOSE(h, rstd, "layernorm rstd");
        copy_cpu_to_gpu(h, mean);
        copy_cpu_to_gpu(h, rstd);

        Twin dout = h.random(dtype, {N, C});
        Twin dx = h.output(dtype, {N, C});
        Twin dw = h.random(DType::f32, {C});  // accumulates onto what is there
        Twin db = h.random(DType::f32, {C});
        run_both(h, {&dx}, {&dw, &db}, [&](Backend& be, bool g) {
          be.layernorm_backward(side(dx, g), side(dw, g), with_bias ? side(db, g) : none(),
                                side(dout, g), side(x, g), side(w, g), side(mean, g),
                                side(rstd, g));
        });
        GPU_EXPECT_CLOSE(h, dx, "layernorm dx");
        GPU_EXPECT_CLOSE(h, dw, "layernorm dweight");
        GPU_EXPECT_CLOSE(h, db, "layernorm dbias");
      }
}

TEST_CASE("cuda rmsnorm forward and backward match the CPU") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const op_cases::NormShape& shape : rows(op_cases::kNorms, kGpu)) {
      const int64_t N = shape.N, C = shape.C;
      INFO(label(dtype) << " N=" << N << " C=" << C);
      Twin x = h.random(dtype, {N, C}, 0, 0.05, 2.0);
      Twin w = h.random(dtype, {C});
      Twin out = h.output(dtype, {N, C});
      Twin rstd = h.output(DType::f32, {N});
      run_both(h, {&out, &rstd}, {}, [&](Backend& be, bool g) {
        be.rmsnorm_forward(side(out, g), side(rstd, g), side(x, g), side(w, g), 1e-6);
      });
      GPU_EXPECT_CLOSE(h, out, "rmsnorm out");
      GPU_EXPECT_CLOSE(h, rstd, "rmsnorm rstd");
      copy_cpu_to_gpu(h, rstd);

      Twin dout = h.random(dtype, {N, C});
      Twin dx = h.output(dtype, {N, C});
      Twin dw = h.random(DType::f32, {C});
      run_both(h, {&dx}, {&dw}, [&](Backend& be, bool g) {
        be.rmsnorm_backward(side(dx, g), side(dw, g), side(dout, g), side(x, g), side(w, g),
                            side(rstd, g));
      });
      GPU_EXPECT_CLOSE(h, dx, "rmsnorm dx");
      GPU_EXPECT_CLOSE(h, dw, "rmsnorm dweight");
    }
}

TEST_CASE("cuda scratch grows stream-ordered between two queued ops without a wrong result") {
  // A fresh backend: its scratch is sized by the first rmsnorm backward, then grown by a larger
  // one queued right behind it with no host wait in between (cudaFreeAsync of the buffer the first
  // kernel may still be reading, cudaMallocAsync of the new one). Both must match the CPU.
  Harness h;
  struct Norm {
    Twin x, w, rstd, dout, dx, dw;
  };
  std::vector<Norm> norms;
  for (const int64_t C : {int64_t{64}, int64_t{4096}}) {
    const int64_t N = C == 64 ? 8 : 1024;
    Norm n;
    n.x = h.random(DType::bf16, {N, C}, 0, 0.05, 2.0);
    n.w = h.random(DType::bf16, {C});
    n.rstd = h.output(DType::f32, {N});
    Twin out = h.output(DType::bf16, {N, C});
    h.cpu().rmsnorm_forward(out.cpu, n.rstd.cpu, n.x.cpu, n.w.cpu, 1e-6);
    copy_cpu_to_gpu(h, n.rstd);
    n.dout = h.random(DType::bf16, {N, C});
    n.dx = h.output(DType::bf16, {N, C});
    n.dw = h.output(DType::f32, {C});
    norms.push_back(std::move(n));
  }
  for (const bool gpu : {false, true})
    for (Norm& n : norms)
      (gpu ? h.gpu() : h.cpu())
          .rmsnorm_backward(side(n.dx, gpu), side(n.dw, gpu), side(n.dout, gpu), side(n.x, gpu),
                            side(n.w, gpu), side(n.rstd, gpu));
  for (size_t i = 0; i < norms.size(); ++i) {
    INFO("rmsnorm backward " << i << " of 2");
    GPU_EXPECT_CLOSE(h, norms[i].dx, "dx");
    GPU_EXPECT_CLOSE(h, norms[i].dw, "dweight");
  }
}

TEST_CASE("cuda norm column sums stay exact over many rows (several row chunks)") {
  // 1000 rows span 32 chunks of the column kernel: the chunk partials and their ordered sum.
  Harness h;
  const int64_t N = 1000, C = 300;
  Twin x = h.random(DType::f32, {N, C});
  Twin w = h.random(DType::f32, {C});
  Twin rstd = h.output(DType::f32, {N});
  h.cpu().rmsnorm_forward(h.output(DType::f32, {N, C}).cpu, rstd.cpu, x.cpu, w.cpu, 1e-6);
  copy_cpu_to_gpu(h, rstd);
  Twin dout = h.random(DType::f32, {N, C});
  Twin dx = h.output(DType::f32, {N, C});
  Twin dw = h.random(DType::f32, {C});
  run_both(h, {&dx}, {&dw}, [&](Backend& be, bool g) {
    be.rmsnorm_backward(side(dx, g), side(dw, g), side(dout, g), side(x, g), side(w, g),
                        side(rstd, g));
  });
  GPU_EXPECT_CLOSE(h, dx, "rmsnorm dx");
  GPU_EXPECT_CLOSE(h, dw, "rmsnorm dweight over 1000 rows");
}

// ---- activations ---------------------------------------------------------------------------

TEST_CASE("cuda gelu and swiglu forward and backward match the CPU") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const op_cases::ActivationShape& shape : rows(op_cases::kActivations, kGpu)) {
      const int64_t N = shape.N, F = shape.F;
      INFO(label(dtype) << " N=" << N << " F=" << F);
      Twin x = h.random(dtype, {N, F}, 0, 0.01, 4.0);
      Twin out = h.output(dtype, {N, F});
      run_both(h, {&out}, {},
               [&](Backend& be, bool g) { be.gelu_forward(side(out, g), side(x, g)); });
      GPU_EXPECT_CLOSE(h, out, "gelu out");
      Twin dout = h.random(dtype, {N, F});
      Twin dx = h.output(dtype, {N, F});
      run_both(h, {&dx}, {}, [&](Backend& be, bool g) {
        be.gelu_backward(side(dx, g), side(dout, g), side(x, g));
      });
      GPU_EXPECT_CLOSE(h, dx, "gelu dx");

      Twin gate_up = h.random(dtype, {N, 2 * F}, 0, 0.01, 4.0);
      Twin sw = h.output(dtype, {N, F});
      run_both(h, {&sw}, {},
               [&](Backend& be, bool g) { be.swiglu_forward(side(sw, g), side(gate_up, g)); });
      GPU_EXPECT_CLOSE(h, sw, "swiglu out");
      Twin dgate_up = h.output(dtype, {N, 2 * F});
      run_both(h, {&dgate_up}, {}, [&](Backend& be, bool g) {
        be.swiglu_backward(side(dgate_up, g), side(dout, g), side(gate_up, g));
      });
      GPU_EXPECT_CLOSE(h, dgate_up, "swiglu dgate_up");
    }
}

// ---- RoPE ----------------------------------------------------------------------------------

TEST_CASE("cuda rope rotates like the CPU, forward, inverse and in place") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const op_cases::RopeShape& shape : rows(op_cases::kRope, kGpu))
      for (const bool inverse : {false, true}) {
        const int64_t B = shape.B, T = shape.T, rotated = shape.rotated, D = shape.D,
                      width = shape.width();
        INFO(label(dtype) << " B=" << B << " T=" << T << " width=" << width
                          << " rotated=" << rotated << " D=" << D << " inverse=" << inverse);
        Twin x = h.random(dtype, {B * T, width});
        Twin out = h.output(dtype, {B * T, width});
        run_both(h, {&out}, {}, [&](Backend& be, bool g) {
          be.rope(side(out, g), side(x, g), T, rotated, D, 10000.0, inverse);
        });
        GPU_EXPECT_CLOSE(h, out, "rope out");
        // In place: x becomes the output.
        Twin y = h.random(dtype, {B * T, width});
        const auto original = h.bytes(y.cpu);
        h.cpu().rope(y.cpu, y.cpu, T, rotated, D, 500000.0, inverse);
        h.gpu().rope(y.gpu, y.gpu, T, rotated, D, 500000.0, inverse);
        GPU_EXPECT_CLOSE(h, y, "rope in place");
        h.gpu().copy_from_host(y.gpu, original.data());
        h.gpu().rope(y.gpu, y.gpu, T, rotated, D, 500000.0, inverse);
        const auto again = h.bytes(y.gpu);
        h.gpu().copy_from_host(y.gpu, original.data());
        h.gpu().rope(y.gpu, y.gpu, T, rotated, D, 500000.0, inverse);
        CHECK(h.bytes(y.gpu) == again);
      }
}

TEST_CASE("cuda rope with explicit positions (context parallel chunks) matches the CPU") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const bool inverse : {false, true}) {
      INFO(label(dtype) << " inverse=" << inverse);
      const int64_t B = 2, L = 32, heads = 4, D = 64, width = 6 * D;
      std::vector<int32_t> positions;  // chunks 1 and 6 of 8 chunks of 16: rank 1 of cp 4
      for (const int32_t c : {1, 6})
        for (int32_t t = 0; t < 16; ++t)
          positions.push_back(c * 16 + t);
      Twin pos = h.output(DType::i32, {L});
      h.upload_i32(pos, positions);
      Twin x = h.random(dtype, {B * L, width});
      Twin out = h.output(dtype, {B * L, width});
      run_both(h, {&out}, {}, [&](Backend& be, bool g) {
        be.rope(side(out, g), side(x, g), L, heads, D, 500000.0, inverse, side(pos, g));
      });
      GPU_EXPECT_CLOSE(h, out, "rope with positions out");
    }
}

// ---- attention -----------------------------------------------------------------------------

namespace {

// Attention forward (out, lse) and backward (dqkv) of one shape on both backends, compared.
void check_attention(Harness& h, DType dtype, const AttentionShape& s) {
  INFO(label(dtype) << " B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV
                    << " D=" << s.D);
  const int64_t N = s.B * s.T;
  Twin qkv = h.random(dtype, {N, s.qkv_width()}, 0, 0.05, 2.0);
  Twin out = h.output(dtype, {N, s.H * s.D});
  Twin lse = h.output(DType::f32, {s.B, s.H, s.T});
  run_both(h, {&out, &lse}, {}, [&](Backend& be, bool g) {
    be.attention_forward(side(out, g), side(lse, g), side(qkv, g), s);
  });
  GPU_EXPECT_CLOSE(h, out, "attention out");
  GPU_EXPECT_CLOSE(h, lse, "attention lse");
  copy_cpu_to_gpu(h, out);
  copy_cpu_to_gpu(h, lse);

  Twin dout = h.random(dtype, {N, s.H * s.D});
  Twin dqkv = h.output(dtype, {N, s.qkv_width()});
  run_both(h, {&dqkv}, {}, [&](Backend& be, bool g) {
    be.attention_backward(side(dqkv, g), side(dout, g), side(qkv, g), side(out, g), side(lse, g),
                          s);
  });
  GPU_EXPECT_CLOSE(h, dqkv, "attention dqkv");
}

}  // namespace

TEST_CASE("cuda attention forward and backward match the CPU (GQA, D 32/64/128, ragged T)") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const op_cases::AttentionCase& row : rows(op_cases::kAttention, kGpu))
      check_attention(h, dtype, row.shape);
}

TEST_CASE("cuda attention at GPT-2's size matches the CPU (T 1024, 12 heads, D 64, MHA and GQA)") {
  // Many key tiles per query tile and many query tiles per head: the online-softmax rescale runs
  // 32 times per row, which the small shapes above never reach.
  Harness h;
  for (const DType dtype : {DType::bf16, DType::f32})
    for (const op_cases::AttentionCase& row : rows(op_cases::kAttentionGpt2, kGpu))
      check_attention(h, dtype, row.shape);
}

TEST_CASE("cuda attention rejects a head size it has no kernel for, naming it") {
  Harness h;
  const AttentionShape s{1, 4, 2, 2, 48};
  Twin qkv = h.random(DType::f32, {4, s.qkv_width()});
  Twin out = h.output(DType::f32, {4, s.H * s.D});
  Twin lse = h.output(DType::f32, {1, 2, 4});
  CHECK_THROWS_WITH(h.gpu().attention_forward(out.gpu, lse.gpu, qkv.gpu, s),
                    Catch::Contains("D=48"));
}

// Context-parallel attention blocks: rank 0 of 2 (chunks 0 and 3 of every sequence, the causal
// load balance) merges its own block (causal inside) and rank 1's (chunks 1 and 2: all of them
// visible to chunk 3, none to chunk 0) into f32 out and lse, then accumulates each block's dQ and
// dK, dV from the final ones.
TEST_CASE("cuda context-parallel attention blocks match the CPU (GQA, D 32/64, partial masks)") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const int64_t D : {32, 64}) {
      INFO(label(dtype) << " D=" << D);
      const int64_t B = 2, H = 4, KV = 2, c = 16, L = 2 * c;
      const trainctl::backend::AttentionBlockShape s{B, L, L, H, KV, D};
      auto chunks = [&](int64_t first, int64_t second) {
        std::vector<int32_t> p;
        for (const int64_t k : {first, second})
          for (int64_t t = 0; t < c; ++t)
            p.push_back(static_cast<int32_t>(k * c + t));
        return p;
      };
      Twin q = h.random(dtype, {B * L, s.qkv_width()}, 0, 0.05, 2.0);
      Twin own = h.random(dtype, {B * L, s.kv_width()}, 0, 0.05, 2.0);
      Twin other = h.random(dtype, {B * L, s.kv_width()}, 0, 0.05, 2.0);
      Twin q_pos = h.output(DType::i32, {L}), other_pos = h.output(DType::i32, {L});
      h.upload_i32(q_pos, chunks(0, 3));
      h.upload_i32(other_pos, chunks(1, 2));
      Twin out = h.output(DType::f32, {B * L, H * D}), lse = h.output(DType::f32, {B, H, L});
      h.upload(lse, std::vector<double>(static_cast<size_t>(B * H * L), -INFINITY));
      const std::pair<const Twin*, const Twin*> blocks[] = {{&own, &q_pos}, {&other, &other_pos}};
      for (const auto& [kv, k_pos] : blocks) {
        run_both(h, {}, {&out, &lse}, [&](Backend& be, bool g) {
          be.attention_block_forward(side(out, g), side(lse, g), side(q, g), side(*kv, g),
                                     side(q_pos, g), side(*k_pos, g), s);
        });
        GPU_EXPECT_CLOSE(h, out, "attention block out");
        GPU_EXPECT_CLOSE(h, lse, "attention block lse");
        copy_cpu_to_gpu(h, out);
        copy_cpu_to_gpu(h, lse);
      }
      Twin dout = h.random(dtype, {B * L, H * D});
      Twin dq = h.output(DType::f32, {B * L, H * D});
      for (const auto& [kv, k_pos] : blocks) {
        Twin dkv = h.output(DType::f32, {B * L, s.kv_width()});
        run_both(h, {}, {&dq, &dkv}, [&](Backend& be, bool g) {
          be.attention_block_backward(side(dq, g), side(dkv, g), side(dout, g), side(q, g),
                                      side(*kv, g), side(out, g), side(lse, g), side(q_pos, g),
                                      side(*k_pos, g), s);
        });
        GPU_EXPECT_CLOSE(h, dq, "attention block dq");
        GPU_EXPECT_CLOSE(h, dkv, "attention block dkv");
        copy_cpu_to_gpu(h, dq);
      }
    }
}

// ---- embedding -----------------------------------------------------------------------------

TEST_CASE("cuda embedding forward and backward equal the CPU bit for bit, repeated tokens") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const op_cases::EmbeddingShape& shape : rows(op_cases::kEmbedding, kGpu))
      for (const bool positions : {true, false}) {
        const int64_t B = shape.B, T = shape.T, V = shape.V, C = shape.C;
        INFO(label(dtype) << " B=" << B << " T=" << T << " V=" << V << " C=" << C
                          << " wpe=" << positions);
        REQUIRE(V > 40);  // the token pattern below
        Twin tokens = h.output(DType::i32, {B * T});
        std::vector<int32_t> ids(static_cast<size_t>(B * T));
        for (auto& id : ids)  // a narrow range: many repeats, the order of their sums matters
          id = static_cast<int32_t>(h.rng()() % 9) * 5;
        ids[3] = V - 1;
        h.upload_i32(tokens, ids);
        Twin wte = h.random(dtype, {V, C});
        Twin wpe = h.random(dtype, {T, C});
        Twin out = h.output(dtype, {B * T, C});
        run_both(h, {&out}, {}, [&](Backend& be, bool g) {
          be.embedding_forward(side(out, g), side(tokens, g), side(wte, g),
                               positions ? side(wpe, g) : none(), T);
        });
        GPU_EXPECT_IDENTICAL(h, out, "embedding out");

        Twin dout = h.random(dtype, {B * T, C});
        Twin dwte = h.random(DType::f32, {V, C});
        Twin dwpe = h.random(DType::f32, {T, C});
        run_both(h, {}, {&dwte, &dwpe}, [&](Backend& be, bool g) {
          be.embedding_backward(side(dwte, g), positions ? side(dwpe, g) : none(), side(dout, g),
                                side(tokens, g), T);
        });
        GPU_EXPECT_IDENTICAL(h, dwte, "embedding dwte");
        GPU_EXPECT_IDENTICAL(h, dwpe, "embedding dwpe");
      }
}

TEST_CASE("cuda vocab-parallel embedding reads zeros and takes no gradient outside its shard") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const op_cases::EmbeddingShardShape& shape : rows(op_cases::kEmbeddingShard, kGpu)) {
      const int64_t B = shape.B, T = shape.T, V_local = shape.V_local,
                    vocab_begin = shape.vocab_begin, C = shape.C;
      INFO(label(dtype) << " B=" << B << " T=" << T << " V_local=" << V_local
                        << " vocab_begin=" << vocab_begin << " C=" << C);
      Twin tokens = h.output(DType::i32, {B * T});
      std::vector<int32_t> ids(static_cast<size_t>(B * T));
      for (auto& id : ids)
        id = static_cast<int32_t>(h.rng()() % 50);
      ids[0] = vocab_begin;
      ids[1] = vocab_begin + V_local - 1;
      ids[2] = vocab_begin + V_local;
      h.upload_i32(tokens, ids);
      Twin wte = h.random(dtype, {V_local, C});
      Twin wpe = h.random(dtype, {T, C});
      Twin out = h.output(dtype, {B * T, C});
      run_both(h, {&out}, {}, [&](Backend& be, bool g) {
        be.embedding_forward_shard(side(out, g), side(tokens, g), side(wte, g), side(wpe, g), T,
                                   vocab_begin);
      });
      GPU_EXPECT_IDENTICAL(h, out, "shard embedding out");
      Twin dout = h.random(dtype, {B * T, C});
      Twin dwte = h.random(DType::f32, {V_local, C});
      Twin dwpe = h.random(DType::f32, {T, C});
      run_both(h, {}, {&dwte, &dwpe}, [&](Backend& be, bool g) {
        be.embedding_backward_shard(side(dwte, g), side(dwpe, g), side(dout, g), side(tokens, g), T,
                                    vocab_begin);
      });
      GPU_EXPECT_IDENTICAL(h, dwte, "shard embedding dwte");
      GPU_EXPECT_IDENTICAL(h, dwpe, "shard embedding dwpe");
    }
}

// ---- cross-entropy -------------------------------------------------------------------------

TEST_CASE("cuda cross-entropy matches the CPU, ignores negative targets, works in place") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const op_cases::CrossEntropyShape& shape : rows(op_cases::kCrossEntropy, kGpu)) {
      const int64_t N = shape.N, V = shape.V;
      INFO(label(dtype) << " V=" << V);
      Twin logits = h.random(dtype, {N, V}, 0, 0.01, 8.0);
      Twin targets = h.output(DType::i32, {N});
      std::vector<int32_t> t(static_cast<size_t>(N));
      for (auto& v : t)
        v = static_cast<int32_t>(h.rng()() % static_cast<uint64_t>(V));
      t[2] = -1;
      t[5] = 0;
      t[6] = static_cast<int32_t>(V - 1);
      h.upload_i32(targets, t);
      Twin losses = h.output(DType::f32, {N});
      Twin lse = h.output(DType::f32, {N});
      run_both(h, {&losses, &lse}, {}, [&](Backend& be, bool g) {
        be.cross_entropy_forward(side(losses, g), side(lse, g), side(logits, g), side(targets, g));
      });
      GPU_EXPECT_CLOSE(h, losses, "losses");
      GPU_EXPECT_CLOSE(h, lse, "lse");
      CHECK(h.values(losses.gpu)[2] == 0.0);
      copy_cpu_to_gpu(h, lse);

      Twin dlogits = h.output(dtype, {N, V});
      run_both(h, {&dlogits}, {}, [&](Backend& be, bool g) {
        be.cross_entropy_backward(side(dlogits, g), side(logits, g), side(lse, g), side(targets, g),
                                  1.0 / 19);
      });
      GPU_EXPECT_CLOSE(h, dlogits, "dlogits");
      // dlogits aliasing logits: each element is read before it is written.
      h.cpu().cross_entropy_backward(logits.cpu, logits.cpu, lse.cpu, targets.cpu, 1.0 / 19);
      h.gpu().cross_entropy_backward(logits.gpu, logits.gpu, lse.gpu, targets.gpu, 1.0 / 19);
      GPU_EXPECT_CLOSE(h, logits, "dlogits in place");
    }
}

TEST_CASE("cuda vocab-parallel cross-entropy backward uses the whole row's lse") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const op_cases::CrossEntropyShardShape& shape : rows(op_cases::kCrossEntropyShard, kGpu)) {
      const int64_t N = shape.N, V_local = shape.V_local, vocab_begin = shape.vocab_begin;
      INFO(label(dtype) << " N=" << N << " V_local=" << V_local << " vocab_begin=" << vocab_begin);
      Twin logits = h.random(dtype, {N, V_local}, 0, 0.01, 4.0);
      Twin targets = h.output(DType::i32, {N});
      std::vector<int32_t> t(static_cast<size_t>(N));
      for (auto& v : t)
        v = static_cast<int32_t>(h.rng()() % 1000);  // inside and outside the shard
      t[0] = -1;
      t[1] = static_cast<int32_t>(vocab_begin);
      t[2] = static_cast<int32_t>(vocab_begin + V_local - 1);
      h.upload_i32(targets, t);
      // The whole row's lse exceeds the shard's: any values above the shard's max logit do.
      Twin lse = h.random(DType::f32, {N}, 0, 9.0, 10.0);
      std::vector<double> positive = h.values(lse.cpu);
      for (double& v : positive)
        v = std::fabs(v);
      h.upload(lse, positive);
      Twin dlogits = h.output(dtype, {N, V_local});
      run_both(h, {&dlogits}, {}, [&](Backend& be, bool g) {
        be.cross_entropy_backward_shard(side(dlogits, g), side(logits, g), side(lse, g),
                                        side(targets, g), vocab_begin, 0.5);
      });
      GPU_EXPECT_CLOSE(h, dlogits, "shard dlogits");
    }
}

// ---- mixture of experts --------------------------------------------------------------------

namespace {

struct RouterTwins {
  Twin logits, probs, expert_idx, gates, slot, counts, load;
  bool renormalize = false;
  RouterArgs args(bool gpu, int64_t top_k, int64_t capacity) const {
    RouterArgs a;
    a.logits = side(logits, gpu);
    a.probs = side(probs, gpu);
    a.expert_idx = side(expert_idx, gpu);
    a.gates = side(gates, gpu);
    a.slot = side(slot, gpu);
    a.counts = side(counts, gpu);
    a.load = side(load, gpu);
    a.top_k = top_k;
    a.capacity = capacity;
    a.renormalize = renormalize;
    return a;
  }
};

RouterTwins make_router(Harness& h, DType dtype, int64_t N, int64_t E, int64_t K) {
  return {h.random(dtype, {N, E}, 0, 0.01, 3.0),
          h.output(DType::f32, {N, E}),
          h.output(DType::i32, {N, K}),
          h.output(DType::f32, {N, K}),
          h.output(DType::i32, {N, K}),
          h.output(DType::i32, {E}),
          h.output(DType::f32, {E})};
}

}  // namespace

TEST_CASE("cuda moe router matches the CPU: choices, capacity slots, losses, backward") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes)
    for (const int64_t capacity : {int64_t{0}, int64_t{10}})
      for (const bool renormalize : {false, true}) {
        const int64_t N = 300, E = 8, K = 2;  // 300 tokens: more than one block of assignments
        INFO(label(dtype) << " capacity=" << capacity << " renormalize=" << renormalize);
        RouterTwins r = make_router(h, dtype, N, E, K);
        r.renormalize = renormalize;
        RouterLosses cpu_losses, gpu_losses[2];
        int run = 0;
        run_both(h, {&r.probs, &r.expert_idx, &r.gates, &r.slot, &r.counts, &r.load}, {},
                 [&](Backend& be, bool g) {
                   const RouterLosses l = be.moe_router_forward(r.args(g, K, capacity));
                   if (g)
                     gpu_losses[run++] = l;
                   else
                     cpu_losses = l;
                 });
        GPU_EXPECT_CLOSE(h, r.probs, "probs");
        GPU_EXPECT_IDENTICAL(h, r.expert_idx, "expert_idx");
        GPU_EXPECT_CLOSE(h, r.gates, "gates");
        GPU_EXPECT_IDENTICAL(h, r.slot, "slot");
        GPU_EXPECT_IDENTICAL(h, r.counts, "counts");
        GPU_EXPECT_IDENTICAL(h, r.load, "load");
        CHECK(gpu_losses[0].aux_loss == gpu_losses[1].aux_loss);
        CHECK(gpu_losses[0].z_loss == gpu_losses[1].z_loss);
        CHECK(gpu_losses[1].aux_loss == Approx(cpu_losses.aux_loss).epsilon(1e-5));
        CHECK(gpu_losses[1].z_loss == Approx(cpu_losses.z_loss).epsilon(1e-5));
        if (capacity > 0) {  // some assignments were dropped
          const auto slots = h.values(r.slot.cpu);
          CHECK(std::count(slots.begin(), slots.end(), -1.0) > 0);
        }
        copy_cpu_to_gpu(h, r.probs);
        copy_cpu_to_gpu(h, r.gates);

        Twin dgates = h.random(DType::f32, {N, K});
        Twin dlogits = h.output(dtype, {N, E});
        run_both(h, {&dlogits}, {}, [&](Backend& be, bool g) {
          be.moe_router_backward(side(dlogits, g), side(dgates, g), r.args(g, K, capacity), 0.01,
                                 0.001, 0.5);
        });
        GPU_EXPECT_CLOSE(h, dlogits, "router dlogits");
      }
}

TEST_CASE("cuda moe permute and unpermute match the CPU, dropped slots included") {
  Harness h;
  for (const DType dtype : kGpuFloatTypes) {
    const int64_t N = 57, E = 4, K = 2, C = 96, capacity = 20;
    INFO(label(dtype));
    RouterTwins r = make_router(h, dtype, N, E, K);
    h.cpu().moe_router_forward(r.args(false, K, capacity));
    copy_cpu_to_gpu(h, r.slot);
    copy_cpu_to_gpu(h, r.gates);
    const int64_t R = E * capacity;
    const Twin& slot = r.slot;
    const Twin& gates = r.gates;

    Twin x = h.random(dtype, {N, C});
    Twin expert_in = h.output(dtype, {R, C});
    run_both(h, {&expert_in}, {}, [&](Backend& be, bool g) {
      be.moe_permute(side(expert_in, g), side(x, g), side(slot, g));
    });
    GPU_EXPECT_IDENTICAL(h, expert_in, "expert_in");

    Twin dexpert_in = h.random(dtype, {R, C});
    Twin dx = h.output(dtype, {N, C});
    run_both(h, {&dx}, {}, [&](Backend& be, bool g) {
      be.moe_permute_backward(side(dx, g), side(dexpert_in, g), side(slot, g));
    });
    GPU_EXPECT_IDENTICAL(h, dx, "permute dx");

    Twin expert_out = h.random(dtype, {R, C});
    Twin out = h.output(dtype, {N, C});
    run_both(h, {&out}, {}, [&](Backend& be, bool g) {
      be.moe_unpermute(side(out, g), side(expert_out, g), side(gates, g), side(slot, g));
    });
    GPU_EXPECT_CLOSE(h, out, "unpermute out");

    Twin dout = h.random(dtype, {N, C});
    Twin dexpert_out = h.output(dtype, {R, C});
    Twin dgates = h.output(DType::f32, {N, K});
    run_both(h, {&dexpert_out, &dgates}, {}, [&](Backend& be, bool g) {
      be.moe_unpermute_backward(side(dexpert_out, g), side(dgates, g), side(dout, g),
                                side(expert_out, g), side(gates, g), side(slot, g));
    });
    GPU_EXPECT_CLOSE(h, dexpert_out, "dexpert_out");
    GPU_EXPECT_CLOSE(h, dgates, "dgates");
  }
}
