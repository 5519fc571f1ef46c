// What the optimizer ops (adamw.cpp, momentum.cpp) share: the update of a run of weights (the
// master copy when present, the parameter rounded from it), and their view of the moments:
// compute-type pointers to the moments of a run of elements. G moments are used in place; bf16
// moments (optimizer.state_dtype) are loaded into f32 scratch a chunk at a time and stored back
// stochastically rounded with the bits of each element's global index (tensor/stochastic_round.hpp,
// Backend::AdamWRange).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <type_traits>

#include "backend/backend.hpp"
#include "tensor/dtype.hpp"
#include "tensor/stochastic_round.hpp"

namespace trainctl::backend::cpu {

// Calls f(i, w) -> new w over elements [first, last), on the master when present.
template <class S, class C, class F>
void update_run(const Tensor& param, const Tensor& master, int64_t first, int64_t last, F&& f) {
  S* __restrict p = param.as<S>();
  if (!master.empty()) {
    C* __restrict w = master.as<C>();
    for (int64_t i = first; i < last; ++i) {
      const C value = f(i, w[i]);
      w[i] = value;
      p[i] = tensor::store<S>(value);
    }
  } else {
    for (int64_t i = first; i < last; ++i)
      p[i] = tensor::store<S>(f(i, tensor::load(p[i])));
  }
}

// Calls body(range, first, last, mm, vv) for runs [first, last) covering every range, where
// mm[k] and vv[k] are the moments of element first + k (null for an empty m or v). step: the
// rounding's step.
template <class C, class Body>
void for_moment_chunks(const Tensor& m, const Tensor& v,
                       std::span<const Backend::AdamWRange> ranges, int64_t step, Body&& body) {
  if (m.empty() || m.dtype != tensor::DType::bf16) {
    C* mm = m.empty() ? nullptr : m.as<C>();
    C* vv = v.empty() ? nullptr : v.as<C>();
    for (const Backend::AdamWRange& range : ranges)
      body(range, range.begin, range.end, mm ? mm + range.begin : nullptr,
           vv ? vv + range.begin : nullptr);
    return;
  }
  if constexpr (std::is_same_v<C, float>) {
    constexpr int64_t kChunk = 2048;
    std::array<float, kChunk> mbuf, vbuf;
    auto* mb = static_cast<uint16_t*>(m.data);
    auto* vb = v.empty() ? nullptr : static_cast<uint16_t*>(v.data);
    const auto widen = [](uint16_t bits) { return tensor::to_float(tensor::bf16{bits}); };
    for (const Backend::AdamWRange& range : ranges) {
      for (int64_t first = range.begin; first < range.end; first += kChunk) {
        const int64_t n = std::min(kChunk, range.end - first);
        for (int64_t k = 0; k < n; ++k)
          mbuf[static_cast<size_t>(k)] = widen(mb[first + k]);
        if (vb)
          for (int64_t k = 0; k < n; ++k)
            vbuf[static_cast<size_t>(k)] = widen(vb[first + k]);
        body(range, first, first + n, mbuf.data(), vb ? vbuf.data() : nullptr);
        uint64_t cached = ~uint64_t{0};
        uint32_t block[4] = {};
        for (int64_t k = 0; k < n; ++k) {
          const auto g = static_cast<uint64_t>(tensor::range_global_index(
              first + k, range.begin, range.global_begin, range.local_width, range.global_width));
          if (g >> 2 != cached) {
            cached = g >> 2;
            tensor::rounding_block(range.key, cached, static_cast<uint64_t>(step), block);
          }
          const uint32_t r = block[g & 3];
          mb[first + k] = tensor::bf16_stochastic(mbuf[static_cast<size_t>(k)], r);
          if (vb) vb[first + k] = tensor::bf16_stochastic(vbuf[static_cast<size_t>(k)], r >> 16);
        }
      }
    }
  }
}

}  // namespace trainctl::backend::cpu
