#include "train/optimizer.hpp"

namespace trainctl::train {

void AdamW::step(backend::Backend& be, model::ParamStore& params, double lr, double grad_scale) {
  ++updates_;
  using model::ParamStore;
  const auto values = params.values(), grads = params.grads(), master = params.master(),
             m = params.moment1(), v = params.moment2();
  for (const model::ParamSpec& spec : params.table().specs()) {
    const backend::Backend::AdamW hyper{lr,
                                        config_.beta1,
                                        config_.beta2,
                                        config_.eps,
                                        spec.weight_decay ? config_.weight_decay : 0.0,
                                        grad_scale,
                                        updates_};
    be.adamw(ParamStore::slice(values, spec), ParamStore::slice(master, spec),
             ParamStore::slice(grads, spec), ParamStore::slice(m, spec), ParamStore::slice(v, spec),
             hyper);
  }
}

}  // namespace trainctl::train
