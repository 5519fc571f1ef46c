#include "train/optimizer.hpp"

#include <algorithm>
#include <vector>

namespace trainctl::train {

void AdamW::step(backend::Backend& be, model::ParamStore& params, double lr, double grad_scale) {
  ++updates_;
  // values and grads are indexed by the flat buffer, the optimizer state from its own begin: one
  // multi-tensor call over the state's elements, with a range per run of parameters that share
  // their decay (adjacent parameters of the same kind merge).
  const int64_t first = params.optimizer_begin(), last = params.optimizer_end();
  using Range = backend::Backend::AdamWRange;
  std::vector<Range> ranges;
  for (const model::ParamSpec& spec : params.table().specs()) {
    const int64_t begin = std::max(spec.offset, first);
    const int64_t end = std::min(spec.offset + spec.shape.numel(), last);
    model::append_joined(ranges, Range{begin - first, end - first, spec.weight_decay},
                         [](const Range& a, const Range& b) { return a.decay == b.decay; });
  }
  if (ranges.empty()) return;
  const backend::Backend::AdamW hyper{lr,          config_.betas[0],     config_.betas[1],
                                      config_.eps, config_.weight_decay, grad_scale,
                                      updates_};
  be.adamw(params.value_part(), params.master(), params.grad_part(), params.moment1(),
           params.moment2(), ranges, hyper);
}

}  // namespace trainctl::train
