// Flash-style causal attention kernels. See attention.cuh for the contract.
//
// Work split (all kernels): 4 warps per block, a tile of 32 query rows or 32 keys per block, each
// warp owning 8 of them; a lane owns D/32 columns of the per-row accumulators, and during a score
// computation lane j takes key j (or query row j) of the tile. Shared tiles are f32; the ones read
// by a lane-varying row are padded to D + 1 floats so the 32 lanes hit 32 different banks.
// Plain CUDA cores, f32 FMA. Tensor cores (mma.sync m16n8k16 bf16/f16 on sm_80+, wgmma on sm_90a
// with TMA tile loads) would replace the two dot-product loops and the P V / dS K / P^T dO / dS^T Q
// accumulations: see docs/cuda.md.
#include <cstdint>

#include "kernels/attention.cuh"
#include "kernels/check.cuh"
#include "kernels/storage.cuh"

namespace trainctl::kernels {
namespace {

constexpr int kTile = 32;  // query rows or keys per block and per shared tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = kTile / kWarps;

struct Geometry {
  int64_t T, H, KV, W;  // W: the width of a qkv row, (H + 2 KV) D
};

// Loads rows [row0, row0 + kTile) of one head's D columns (starting at column col of a row of
// `width`) of sequence b into a shared f32 tile with row pitch `pitch`; rows >= T read zeros.
template <class St, int D>
__device__ void load_tile(float* tile, int pitch, const typename St::T* src, int64_t width,
                          int64_t col, int64_t b, int64_t T, int64_t row0) {
  for (int idx = threadIdx.x; idx < kTile * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    const int64_t t = row0 + r;
    tile[r * pitch + d] = t < T ? St::load(src[(b * T + t) * width + col + d]) : 0.0f;
  }
}

template <int D>
__device__ __forceinline__ float dot_rows(const float* a, const float* b) {
  float s = 0.0f;
#pragma unroll 8
  for (int d = 0; d < D; ++d)
    s += a[d] * b[d];
  return s;
}

template <class St, int D>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(typename St::T* out, float* lse, const typename St::T* qkv, Geometry g,
                             float scale) {
  constexpr int DL = D / 32;
  extern __shared__ float shared[];
  float* q_tile = shared;                    // [kTile][D]
  float* k_tile = q_tile + kTile * D;        // [kTile][D + 1]
  float* v_tile = k_tile + kTile * (D + 1);  // [kTile][D]
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t kv = h / (g.H / g.KV);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  load_tile<St, D>(q_tile, D, qkv, g.W, h * D, b, g.T, q0);

  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][DL];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int dl = 0; dl < DL; ++dl)
      o[i][dl] = 0.0f;
  }
  const int64_t last_query = (q0 + kTile < g.T ? q0 + kTile : g.T) - 1;
  for (int64_t k0 = 0; k0 <= last_query; k0 += kTile) {
    __syncthreads();  // the previous tiles are no longer read
    load_tile<St, D>(k_tile, D + 1, qkv, g.W, (g.H + kv) * D, b, g.T, k0);
    load_tile<St, D>(v_tile, D, qkv, g.W, (g.H + g.KV + kv) * D, b, g.T, k0);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp * kRowsPerWarp + i;
      const int64_t qi = q0 + r;
      if (qi >= g.T) continue;  // uniform over the warp
      const bool visible = k0 + lane <= qi;
      const float s =
          visible ? dot_rows<D>(q_tile + r * D, k_tile + lane * (D + 1)) * scale : -INFINITY;
      // Key k0 <= q0 <= qi is visible to every row, so the tile max is finite.
      const float m_new = fmaxf(m[i], warp_max(s));
      const float p = visible ? expf(s - m_new) : 0.0f;
      const float alpha = expf(m[i] - m_new);  // 0 on the first tile (m = -inf)
      l[i] = l[i] * alpha + warp_sum(p);
      m[i] = m_new;
#pragma unroll
      for (int dl = 0; dl < DL; ++dl)
        o[i][dl] *= alpha;
      for (int j = 0; j < kTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int dl = 0; dl < DL; ++dl)
          o[i][dl] += pj * v_tile[j * D + lane + 32 * dl];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t qi = q0 + warp * kRowsPerWarp + i;
    if (qi >= g.T) continue;
    const float inv = 1.0f / l[i];
    typename St::T* dst = out + (b * g.T + qi) * g.H * D + h * D;
#pragma unroll
    for (int dl = 0; dl < DL; ++dl)
      dst[lane + 32 * dl] = St::store(o[i][dl] * inv);
    if (lane == 0) lse[(b * g.H + h) * g.T + qi] = m[i] + logf(l[i]);
  }
}

// delta[b, h, t] = sum_d dout * out, one warp per (row, head).
template <class St>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(float* delta, const typename St::T* dout, const typename St::T* out,
                           int64_t B, int64_t T, int64_t H, int64_t D) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (w >= B * T * H) return;
  const int64_t n = w / H, h = w % H;  // n = b T + t
  const int64_t offset = n * H * D + h * D;
  float s = 0.0f;
  for (int64_t d = lane; d < D; d += 32)
    s += St::load(dout[offset + d]) * St::load(out[offset + d]);
  s = warp_sum(s);
  if (lane == 0) delta[((n / T) * H + h) * T + n % T] = s;
}

template <class St, int D>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(typename St::T* dqkv, const typename St::T* dout, const typename St::T* qkv,
                        const float* lse, const float* delta, Geometry g, float scale) {
  constexpr int DL = D / 32;
  extern __shared__ float shared[];
  float* q_tile = shared;                    // [kTile][D]
  float* do_tile = q_tile + kTile * D;       // [kTile][D]
  float* k_tile = do_tile + kTile * D;       // [kTile][D + 1]
  float* v_tile = k_tile + kTile * (D + 1);  // [kTile][D + 1]
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t kv = h / (g.H / g.KV);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  load_tile<St, D>(q_tile, D, qkv, g.W, h * D, b, g.T, q0);
  load_tile<St, D>(do_tile, D, dout, g.H * D, h * D, b, g.T, q0);

  float row_lse[kRowsPerWarp], row_delta[kRowsPerWarp], dq[kRowsPerWarp][DL];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t qi = q0 + warp * kRowsPerWarp + i;
    const int64_t at = (b * g.H + h) * g.T + qi;
    row_lse[i] = qi < g.T ? lse[at] : 0.0f;
    row_delta[i] = qi < g.T ? delta[at] : 0.0f;
#pragma unroll
    for (int dl = 0; dl < DL; ++dl)
      dq[i][dl] = 0.0f;
  }
  const int64_t last_query = (q0 + kTile < g.T ? q0 + kTile : g.T) - 1;
  for (int64_t k0 = 0; k0 <= last_query; k0 += kTile) {
    __syncthreads();
    load_tile<St, D>(k_tile, D + 1, qkv, g.W, (g.H + kv) * D, b, g.T, k0);
    load_tile<St, D>(v_tile, D + 1, qkv, g.W, (g.H + g.KV + kv) * D, b, g.T, k0);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp * kRowsPerWarp + i;
      const int64_t qi = q0 + r;
      if (qi >= g.T) continue;
      float ds = 0.0f;
      if (k0 + lane <= qi) {
        const float s = dot_rows<D>(q_tile + r * D, k_tile + lane * (D + 1)) * scale;
        const float p = expf(s - row_lse[i]);
        const float dp = dot_rows<D>(do_tile + r * D, v_tile + lane * (D + 1));
        ds = p * (dp - row_delta[i]);
      }
      for (int j = 0; j < kTile; ++j) {
        const float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int dl = 0; dl < DL; ++dl)
          dq[i][dl] += dsj * k_tile[j * (D + 1) + lane + 32 * dl];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t qi = q0 + warp * kRowsPerWarp + i;
    if (qi >= g.T) continue;
    typename St::T* dst = dqkv + (b * g.T + qi) * g.W + h * D;
#pragma unroll
    for (int dl = 0; dl < DL; ++dl)
      dst[lane + 32 * dl] = St::store(dq[i][dl] * scale);
  }
}

template <class St, int D>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(typename St::T* dqkv, const typename St::T* dout,
                          const typename St::T* qkv, const float* lse, const float* delta,
                          Geometry g, float scale) {
  constexpr int DL = D / 32;
  extern __shared__ float shared[];
  float* k_tile = shared;                       // [kTile][D]
  float* v_tile = k_tile + kTile * D;           // [kTile][D]
  float* q_tile = v_tile + kTile * D;           // [kTile][D + 1]
  float* do_tile = q_tile + kTile * (D + 1);    // [kTile][D + 1]
  float* lse_tile = do_tile + kTile * (D + 1);  // [kTile]
  float* delta_tile = lse_tile + kTile;         // [kTile]
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t kv = blockIdx.y, b = blockIdx.z;
  const int64_t group = g.H / g.KV;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  load_tile<St, D>(k_tile, D, qkv, g.W, (g.H + kv) * D, b, g.T, k0);
  load_tile<St, D>(v_tile, D, qkv, g.W, (g.H + g.KV + kv) * D, b, g.T, k0);

  float dk[kRowsPerWarp][DL], dv[kRowsPerWarp][DL];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i)
#pragma unroll
    for (int dl = 0; dl < DL; ++dl) {
      dk[i][dl] = 0.0f;
      dv[i][dl] = 0.0f;
    }
  for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
    // Queries before k0 see none of these keys: start at the tile holding k0.
    for (int64_t q0 = k0; q0 < g.T; q0 += kTile) {
      __syncthreads();
      load_tile<St, D>(q_tile, D + 1, qkv, g.W, h * D, b, g.T, q0);
      load_tile<St, D>(do_tile, D + 1, dout, g.H * D, h * D, b, g.T, q0);
      if (threadIdx.x < kTile) {
        const int64_t qi = q0 + threadIdx.x;
        const int64_t at = (b * g.H + h) * g.T + qi;
        lse_tile[threadIdx.x] = qi < g.T ? lse[at] : 0.0f;
        delta_tile[threadIdx.x] = qi < g.T ? delta[at] : 0.0f;
      }
      __syncthreads();
      const int64_t qi = q0 + lane;  // lane = query row of the tile
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int c = warp * kRowsPerWarp + i;
        const int64_t kj = k0 + c;
        if (kj >= g.T) continue;  // uniform over the warp
        float p = 0.0f, ds = 0.0f;
        if (qi < g.T && kj <= qi) {
          const float s = dot_rows<D>(q_tile + lane * (D + 1), k_tile + c * D) * scale;
          p = expf(s - lse_tile[lane]);
          const float dp = dot_rows<D>(do_tile + lane * (D + 1), v_tile + c * D);
          ds = p * (dp - delta_tile[lane]);
        }
        for (int r = 0; r < kTile; ++r) {
          const float pr = __shfl_sync(0xffffffffu, p, r);
          const float dsr = __shfl_sync(0xffffffffu, ds, r);
#pragma unroll
          for (int dl = 0; dl < DL; ++dl) {
            dv[i][dl] += pr * do_tile[r * (D + 1) + lane + 32 * dl];
            dk[i][dl] += dsr * q_tile[r * (D + 1) + lane + 32 * dl];
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t kj = k0 + warp * kRowsPerWarp + i;
    if (kj >= g.T) continue;
    typename St::T* row = dqkv + (b * g.T + kj) * g.W;
#pragma unroll
    for (int dl = 0; dl < DL; ++dl) {
      row[(g.H + kv) * D + lane + 32 * dl] = St::store(dk[i][dl] * scale);
      row[(g.H + g.KV + kv) * D + lane + 32 * dl] = St::store(dv[i][dl]);
    }
  }
}

template <class Kernel>
cudaError_t allow_shared(Kernel kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

template <int D>
cudaError_t forward_for(Storage storage, void* out, float* lse, const void* qkv, int64_t B,
                        Geometry g, float scale, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((g.T + kTile - 1) / kTile), static_cast<unsigned>(g.H),
                  static_cast<unsigned>(B));
  const size_t bytes = sizeof(float) * (kTile * D * 2 + kTile * (D + 1));
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    TRAINCTL_CUDA_RETURN(allow_shared(attention_forward_kernel<St, D>, bytes));
    attention_forward_kernel<St, D><<<grid, kThreads, bytes, stream>>>(
        static_cast<Tp*>(out), lse, static_cast<const Tp*>(qkv), g, scale);
    return cudaGetLastError();
  });
}

template <int D>
cudaError_t backward_for(Storage storage, void* dqkv, const void* dout, const void* qkv,
                         const void* out, const float* lse, int64_t B, Geometry g, float scale,
                         float* delta, cudaStream_t stream) {
  const auto tiles = static_cast<unsigned>((g.T + kTile - 1) / kTile);
  const size_t bytes = sizeof(float) * (kTile * D * 2 + kTile * (D + 1) * 2 + 2 * kTile);
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    const auto delta_blocks = static_cast<unsigned>((B * g.T * g.H + kWarps - 1) / kWarps);
    attention_delta_kernel<St><<<delta_blocks, kThreads, 0, stream>>>(
        delta, static_cast<const Tp*>(dout), static_cast<const Tp*>(out), B, g.T, g.H, D);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    TRAINCTL_CUDA_RETURN(allow_shared(attention_dkdv_kernel<St, D>, bytes));
    attention_dkdv_kernel<St, D>
        <<<dim3(tiles, static_cast<unsigned>(g.KV), static_cast<unsigned>(B)), kThreads, bytes,
           stream>>>(static_cast<Tp*>(dqkv), static_cast<const Tp*>(dout),
                     static_cast<const Tp*>(qkv), lse, delta, g, scale);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    TRAINCTL_CUDA_RETURN(allow_shared(attention_dq_kernel<St, D>, bytes));
    attention_dq_kernel<St, D>
        <<<dim3(tiles, static_cast<unsigned>(g.H), static_cast<unsigned>(B)), kThreads, bytes,
           stream>>>(static_cast<Tp*>(dqkv), static_cast<const Tp*>(dout),
                     static_cast<const Tp*>(qkv), lse, delta, g, scale);
    return cudaGetLastError();
  });
}

// ---- one key/value block (context parallel) --------------------------------------------------

struct BlockGeometry {
  int64_t B, Tq, Tk, H, KV, W, KW;  // W: a qkv row's width, KW: a kv row's, 2 KV D
};

// One warp per query row (b, h, i): an online softmax over the visible keys of the block, then
// merged into the running out and lse.
template <class St, int D>
__global__ void __launch_bounds__(kThreads)
    attention_block_forward_kernel(float* out, float* lse, const typename St::T* qkv,
                                   const typename St::T* kv, const int32_t* q_pos,
                                   const int32_t* k_pos, BlockGeometry g, float scale) {
  constexpr int DL = D / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= g.B * g.H * g.Tq) return;  // uniform over the warp
  const int lane = threadIdx.x % 32;
  const int64_t i = row % g.Tq, h = row / g.Tq % g.H, b = row / (g.Tq * g.H);
  const int64_t kvh = h / (g.H / g.KV);
  float q[DL], o[DL];
#pragma unroll
  for (int dl = 0; dl < DL; ++dl) {
    q[dl] = St::load(qkv[(b * g.Tq + i) * g.W + h * D + lane + 32 * dl]);
    o[dl] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int32_t position = q_pos[i];
  for (int64_t j = 0; j < g.Tk; ++j) {
    if (k_pos[j] > position) continue;  // uniform over the warp
    const typename St::T* k = kv + (b * g.Tk + j) * g.KW + kvh * D;
    const typename St::T* v = kv + (b * g.Tk + j) * g.KW + (g.KV + kvh) * D;
    float part = 0.0f;
#pragma unroll
    for (int dl = 0; dl < DL; ++dl)
      part += q[dl] * St::load(k[lane + 32 * dl]);
    const float s = warp_sum(part) * scale;
    const float m_new = fmaxf(m, s);
    const float alpha = expf(m - m_new), p = expf(s - m_new);  // alpha 0 on the first key
    l = l * alpha + p;
#pragma unroll
    for (int dl = 0; dl < DL; ++dl)
      o[dl] = o[dl] * alpha + p * St::load(v[lane + 32 * dl]);
    m = m_new;
  }
  if (l == 0.0f) return;  // no key of the block is visible: the row is left as it was
  const float block_lse = m + logf(l);
  float* lse_row = lse + (b * g.H + h) * g.Tq + i;
  const float before = *lse_row;
  const float top = fmaxf(before, block_lse);
  const float merged = top + logf(expf(before - top) + expf(block_lse - top));
  const float keep = expf(before - merged), add = expf(block_lse - merged) / l;
  float* dst = out + (b * g.Tq + i) * g.H * D + h * D;
#pragma unroll
  for (int dl = 0; dl < DL; ++dl)
    dst[lane + 32 * dl] = keep * dst[lane + 32 * dl] + add * o[dl];
  __syncwarp();  // every lane has read the old lse
  if (lane == 0) *lse_row = merged;
}

// One warp per query row: delta = rowsum(dO * O) (kept for the dK/dV kernel), then
// dQ += scale * sum_j dS_ij K_j over the visible keys in order.
template <class St, int D>
__global__ void __launch_bounds__(kThreads)
    attention_block_dq_kernel(float* dq, float* delta, const typename St::T* dout,
                              const typename St::T* qkv, const typename St::T* kv, const float* out,
                              const float* lse, const int32_t* q_pos, const int32_t* k_pos,
                              BlockGeometry g, float scale) {
  constexpr int DL = D / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= g.B * g.H * g.Tq) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = row % g.Tq, h = row / g.Tq % g.H, b = row / (g.Tq * g.H);
  const int64_t kvh = h / (g.H / g.KV);
  const int64_t at = (b * g.Tq + i) * g.H * D + h * D;
  float q[DL], dy[DL], acc[DL], part = 0.0f;
#pragma unroll
  for (int dl = 0; dl < DL; ++dl) {
    q[dl] = St::load(qkv[(b * g.Tq + i) * g.W + h * D + lane + 32 * dl]);
    dy[dl] = St::load(dout[at + lane + 32 * dl]);
    part += dy[dl] * out[at + lane + 32 * dl];
    acc[dl] = 0.0f;
  }
  const float d = warp_sum(part);
  const int64_t stat = (b * g.H + h) * g.Tq + i;
  if (lane == 0) delta[stat] = d;
  const float l = lse[stat];
  if (l == -INFINITY) return;  // the row saw no key at all: no gradient
  const int32_t position = q_pos[i];
  for (int64_t j = 0; j < g.Tk; ++j) {
    if (k_pos[j] > position) continue;
    const typename St::T* k = kv + (b * g.Tk + j) * g.KW + kvh * D;
    const typename St::T* v = kv + (b * g.Tk + j) * g.KW + (g.KV + kvh) * D;
    float s = 0.0f, dp = 0.0f;
#pragma unroll
    for (int dl = 0; dl < DL; ++dl) {
      s += q[dl] * St::load(k[lane + 32 * dl]);
      dp += dy[dl] * St::load(v[lane + 32 * dl]);
    }
    const float p = expf(warp_sum(s) * scale - l);
    const float ds = p * (warp_sum(dp) - d);
#pragma unroll
    for (int dl = 0; dl < DL; ++dl)
      acc[dl] += ds * St::load(k[lane + 32 * dl]);
  }
#pragma unroll
  for (int dl = 0; dl < DL; ++dl)
    dq[at + lane + 32 * dl] += scale * acc[dl];
}

// One warp per key row j and kv head: dV += sum P_ij dO_i and dK += scale * sum dS_ij Q_i over the
// group's query heads and the query rows that see key j, in order.
template <class St, int D>
__global__ void __launch_bounds__(kThreads)
    attention_block_dkv_kernel(float* dkv, const float* delta, const typename St::T* dout,
                               const typename St::T* qkv, const typename St::T* kv,
                               const float* lse, const int32_t* q_pos, const int32_t* k_pos,
                               BlockGeometry g, float scale) {
  constexpr int DL = D / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= g.B * g.KV * g.Tk) return;
  const int lane = threadIdx.x % 32;
  const int64_t j = row % g.Tk, kvh = row / g.Tk % g.KV, b = row / (g.Tk * g.KV);
  const int64_t group = g.H / g.KV;
  float k[DL], v[DL], dk[DL], dv[DL];
#pragma unroll
  for (int dl = 0; dl < DL; ++dl) {
    k[dl] = St::load(kv[(b * g.Tk + j) * g.KW + kvh * D + lane + 32 * dl]);
    v[dl] = St::load(kv[(b * g.Tk + j) * g.KW + (g.KV + kvh) * D + lane + 32 * dl]);
    dk[dl] = dv[dl] = 0.0f;
  }
  const int32_t position = k_pos[j];
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
    for (int64_t i = 0; i < g.Tq; ++i) {
      if (position > q_pos[i]) continue;
      const int64_t stat = (b * g.H + h) * g.Tq + i;
      const float l = lse[stat];
      if (l == -INFINITY) continue;
      const typename St::T* q = qkv + (b * g.Tq + i) * g.W + h * D;
      const typename St::T* dy = dout + (b * g.Tq + i) * g.H * D + h * D;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int dl = 0; dl < DL; ++dl) {
        s += St::load(q[lane + 32 * dl]) * k[dl];
        dp += St::load(dy[lane + 32 * dl]) * v[dl];
      }
      const float p = expf(warp_sum(s) * scale - l);
      const float ds = p * (warp_sum(dp) - delta[stat]);
#pragma unroll
      for (int dl = 0; dl < DL; ++dl) {
        dv[dl] += p * St::load(dy[lane + 32 * dl]);
        dk[dl] += ds * St::load(q[lane + 32 * dl]);
      }
    }
  float* dst = dkv + (b * g.Tk + j) * g.KW;
#pragma unroll
  for (int dl = 0; dl < DL; ++dl) {
    dst[kvh * D + lane + 32 * dl] += scale * dk[dl];
    dst[(g.KV + kvh) * D + lane + 32 * dl] += dv[dl];
  }
}

template <int D>
cudaError_t block_forward_for(Storage storage, float* out, float* lse, const void* qkv,
                              const void* kv, const int32_t* q_pos, const int32_t* k_pos,
                              BlockGeometry g, float scale, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((g.B * g.H * g.Tq + kWarps - 1) / kWarps);
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    attention_block_forward_kernel<St, D><<<blocks, kThreads, 0, stream>>>(
        out, lse, static_cast<const Tp*>(qkv), static_cast<const Tp*>(kv), q_pos, k_pos, g, scale);
    return cudaGetLastError();
  });
}

template <int D>
cudaError_t block_backward_for(Storage storage, float* dq, float* dkv, const void* dout,
                               const void* qkv, const void* kv, const float* out, const float* lse,
                               const int32_t* q_pos, const int32_t* k_pos, BlockGeometry g,
                               float scale, float* delta, cudaStream_t stream) {
  const auto q_blocks = static_cast<unsigned>((g.B * g.H * g.Tq + kWarps - 1) / kWarps);
  const auto k_blocks = static_cast<unsigned>((g.B * g.KV * g.Tk + kWarps - 1) / kWarps);
  return dispatch_storage(storage, [&]<class St>(St) {
    using Tp = typename St::T;
    attention_block_dq_kernel<St, D><<<q_blocks, kThreads, 0, stream>>>(
        dq, delta, static_cast<const Tp*>(dout), static_cast<const Tp*>(qkv),
        static_cast<const Tp*>(kv), out, lse, q_pos, k_pos, g, scale);
    TRAINCTL_CUDA_RETURN(cudaGetLastError());
    attention_block_dkv_kernel<St, D><<<k_blocks, kThreads, 0, stream>>>(
        dkv, delta, static_cast<const Tp*>(dout), static_cast<const Tp*>(qkv),
        static_cast<const Tp*>(kv), lse, q_pos, k_pos, g, scale);
    return cudaGetLastError();
  });
}

bool valid(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  return B > 0 && T > 0 && H > 0 && KV > 0 && H % KV == 0 && attention_supported_head_size(D) &&
         B <= 65535 && H <= 65535;
}

}  // namespace

bool attention_supported_head_size(int64_t D) {
  return D == 32 || D == 64 || D == 128;
}

size_t attention_backward_scratch_floats(int64_t B, int64_t H, int64_t T) {
  return B > 0 && H > 0 && T > 0 ? static_cast<size_t>(B * H * T) : 1;
}

cudaError_t launch_attention_forward(Storage storage, void* out, float* lse, const void* qkv,
                                     int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                     cudaStream_t stream) {
  if (!valid(B, T, H, KV, D)) return cudaErrorInvalidValue;
  const Geometry g{T, H, KV, (H + 2 * KV) * D};
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  switch (D) {
    case 32:
      return forward_for<32>(storage, out, lse, qkv, B, g, scale, stream);
    case 64:
      return forward_for<64>(storage, out, lse, qkv, B, g, scale, stream);
    default:
      return forward_for<128>(storage, out, lse, qkv, B, g, scale, stream);
  }
}

cudaError_t launch_attention_backward(Storage storage, void* dqkv, const void* dout,
                                      const void* qkv, const void* out, const float* lse, int64_t B,
                                      int64_t T, int64_t H, int64_t KV, int64_t D, float* scratch,
                                      cudaStream_t stream) {
  if (!valid(B, T, H, KV, D)) return cudaErrorInvalidValue;
  const Geometry g{T, H, KV, (H + 2 * KV) * D};
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  switch (D) {
    case 32:
      return backward_for<32>(storage, dqkv, dout, qkv, out, lse, B, g, scale, scratch, stream);
    case 64:
      return backward_for<64>(storage, dqkv, dout, qkv, out, lse, B, g, scale, scratch, stream);
    default:
      return backward_for<128>(storage, dqkv, dout, qkv, out, lse, B, g, scale, scratch, stream);
  }
}

size_t attention_block_scratch_floats(int64_t B, int64_t H, int64_t Tq) {
  return attention_backward_scratch_floats(B, H, Tq);
}

cudaError_t launch_attention_block_forward(Storage storage, float* out, float* lse, const void* qkv,
                                           const void* kv, const int32_t* q_pos,
                                           const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tk,
                                           int64_t H, int64_t KV, int64_t D, cudaStream_t stream) {
  if (!valid(B, Tq, H, KV, D) || Tk <= 0) return cudaErrorInvalidValue;
  const BlockGeometry g{B, Tq, Tk, H, KV, (H + 2 * KV) * D, 2 * KV * D};
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  switch (D) {
    case 32:
      return block_forward_for<32>(storage, out, lse, qkv, kv, q_pos, k_pos, g, scale, stream);
    case 64:
      return block_forward_for<64>(storage, out, lse, qkv, kv, q_pos, k_pos, g, scale, stream);
    default:
      return block_forward_for<128>(storage, out, lse, qkv, kv, q_pos, k_pos, g, scale, stream);
  }
}

cudaError_t launch_attention_block_backward(Storage storage, float* dq, float* dkv,
                                            const void* dout, const void* qkv, const void* kv,
                                            const float* out, const float* lse,
                                            const int32_t* q_pos, const int32_t* k_pos, int64_t B,
                                            int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                                            int64_t D, float* scratch, cudaStream_t stream) {
  if (!valid(B, Tq, H, KV, D) || Tk <= 0) return cudaErrorInvalidValue;
  const BlockGeometry g{B, Tq, Tk, H, KV, (H + 2 * KV) * D, 2 * KV * D};
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  switch (D) {
    case 32:
      return block_backward_for<32>(storage, dq, dkv, dout, qkv, kv, out, lse, q_pos, k_pos, g,
                                    scale, scratch, stream);
    case 64:
      return block_backward_for<64>(storage, dq, dkv, dout, qkv, kv, out, lse, q_pos, k_pos, g,
                                    scale, scratch, stream);
    default:
      return block_backward_for<128>(storage, dq, dkv, dout, qkv, kv, out, lse, q_pos, k_pos, g,
                                     scale, scratch, stream);
  }
}

}  // namespace trainctl::kernels
