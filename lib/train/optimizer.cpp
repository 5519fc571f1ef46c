#include "train/optimizer.hpp"

#include <algorithm>

namespace trainctl::train {

namespace {

// Elements [begin, end) of a flat buffer, as a 1-D tensor (empty stays empty: no master weights).
tensor::Tensor range_of(const tensor::Tensor& whole, int64_t begin, int64_t end) {
  if (whole.empty()) return {};
  tensor::Tensor t = whole;
  t.data =
      static_cast<char*>(whole.data) + static_cast<size_t>(begin) * tensor::dtype_size(whole.dtype);
  t.shape = {end - begin};
  return t;
}

}  // namespace

void AdamW::step(backend::Backend& be, model::ParamStore& params, double lr, double grad_scale) {
  ++updates_;
  const auto values = params.values(), grads = params.grads(), master = params.master(),
             m = params.moment1(), v = params.moment2();
  // values and grads are indexed by the flat buffer, the optimizer state from its own begin.
  const int64_t first = params.optimizer_begin(), last = params.optimizer_end();
  for (const model::ParamSpec& spec : params.table().specs()) {
    const int64_t begin = std::max(spec.offset, first);
    const int64_t end = std::min(spec.offset + spec.shape.numel(), last);
    if (begin >= end) continue;
    const backend::Backend::AdamW hyper{lr,
                                        config_.beta1,
                                        config_.beta2,
                                        config_.eps,
                                        spec.weight_decay ? config_.weight_decay : 0.0,
                                        grad_scale,
                                        updates_};
    be.adamw(range_of(values, begin, end), range_of(master, begin - first, end - first),
             range_of(grads, begin, end), range_of(m, begin - first, end - first),
             range_of(v, begin - first, end - first), hyper);
  }
}

}  // namespace trainctl::train
