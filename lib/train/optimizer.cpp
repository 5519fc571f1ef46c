#include "train/optimizer.hpp"

#include <algorithm>
#include <vector>

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
  // values and grads are indexed by the flat buffer, the optimizer state from its own begin: one
  // multi-tensor call over the state's elements, with a range per run of parameters that share
  // their decay (adjacent parameters of the same kind merge).
  const int64_t first = params.optimizer_begin(), last = params.optimizer_end();
  std::vector<backend::Backend::AdamWRange> ranges;
  for (const model::ParamSpec& spec : params.table().specs()) {
    const int64_t begin = std::max(spec.offset, first);
    const int64_t end = std::min(spec.offset + spec.shape.numel(), last);
    if (begin >= end) continue;
    if (!ranges.empty() && ranges.back().end == begin - first &&
        ranges.back().decay == spec.weight_decay)
      ranges.back().end = end - first;
    else
      ranges.push_back({begin - first, end - first, spec.weight_decay});
  }
  if (ranges.empty()) return;
  const backend::Backend::AdamW hyper{
      lr, config_.beta1, config_.beta2, config_.eps, config_.weight_decay, grad_scale, updates_};
  be.adamw(range_of(params.values(), first, last), params.master(),
           range_of(params.grads(), first, last), params.moment1(), params.moment2(), ranges,
           hyper);
}

}  // namespace trainctl::train
