// Rotary position embedding, rotate-half convention (GPT-NeoX, Hugging Face Llama): within each
// rotated head of D columns, pair (i, i + D/2) for i < D/2 is rotated by angle t * theta^(-2i/D)
// where t = row % T, or positions[row % T] when given. The inverse (transpose) rotation is the
// backward pass. out may alias x.
#include <cmath>
#include <cstring>
#include <string_view>

#include "backend/cpu/cpu_backend.hpp"

namespace trainctl::backend::cpu {

void CpuBackend::do_rope(const Tensor& out, const Tensor& x, int64_t T, int64_t rotated_heads,
                         int64_t D, double theta, bool inverse, const Tensor& positions) {
  const ScopedOp timed(timer_, OpFamily::rope);
  constexpr std::string_view op = "rope";
  const int64_t N = x.shape[0];
  const int64_t width = N > 0 ? x.numel() / N : 0;
  const int64_t half = D / 2;
  dispatch_float(x.dtype, op, "x", [&]<class S>(Tag<S>) {
    using C = compute_t<S>;
    // cos/sin table [T, half], angles computed in double.
    C* table = scratch_.get<C>(kSlotGemmA, static_cast<size_t>(2 * T * half));
    const int32_t* position = positions.empty() ? nullptr : positions.as<int32_t>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(position ? position[t] : t) *
                             std::pow(theta, -2.0 * static_cast<double>(i) / D);
        table[2 * (t * half + i)] = static_cast<C>(std::cos(angle));
        table[2 * (t * half + i) + 1] =
            static_cast<C>(inverse ? -std::sin(angle) : std::sin(angle));
      }
    const int64_t rotated = rotated_heads * D;
    for (int64_t n = 0; n < N; ++n) {
      const S* xr = x.as<S>() + n * width;
      S* o = out.as<S>() + n * width;
      const C* row_table = table + 2 * (n % T) * half;
      for (int64_t h = 0; h < rotated_heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const C a = tensor::load(xr[h * D + i]);
          const C b = tensor::load(xr[h * D + i + half]);
          const C c = row_table[2 * i], s = row_table[2 * i + 1];
          o[h * D + i] = tensor::store<S>(a * c - b * s);
          o[h * D + i + half] = tensor::store<S>(b * c + a * s);
        }
      if (o != xr && width > rotated)
        std::memcpy(o + rotated, xr + rotated, static_cast<size_t>(width - rotated) * sizeof(S));
    }
  });
}

}  // namespace trainctl::backend::cpu
