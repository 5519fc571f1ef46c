#include "model/parallel.hpp"

#include <stdexcept>
#include <string>

namespace trainctl::model {

ModelParallel ModelParallel::from_mesh(const comm::Mesh& mesh, int zero) {
  ModelParallel p;
  p.layout = mesh.layout();
  p.layout.zero = zero;
  p.at = mesh.groups().coordinates;
  if (p.layout.tp > 1) p.tp = &mesh.tp();
  if (p.layout.ep > 1) p.ep = &mesh.ep();
  if (p.layout.cp > 1) p.cp = &mesh.cp();
  p.cp_background = mesh.cp_bg();
  return p;
}

std::vector<StageRange> stage_ranges(int layers, int pp_size,
                                     const std::vector<int>& stage_layers) {
  if (pp_size < 1)
    throw std::invalid_argument("pipeline: pp_size = " + std::to_string(pp_size) + " must be >= 1");
  if (layers < pp_size)
    throw std::invalid_argument("pipeline: " + std::to_string(layers) + " layers cannot fill " +
                                std::to_string(pp_size) +
                                " stages (each stage needs at least one layer): lower pp");
  std::vector<int> counts = stage_layers;
  if (counts.empty()) {
    // Earlier stages take the remainder: 8 layers over 3 stages give 3, 3, 2.
    for (int s = 0; s < pp_size; ++s)
      counts.push_back(layers / pp_size + (s < layers % pp_size ? 1 : 0));
  } else {
    if (static_cast<int>(counts.size()) != pp_size)
      throw std::invalid_argument("pipeline: stage_layers has " + std::to_string(counts.size()) +
                                  " entries for pp = " + std::to_string(pp_size) +
                                  " stages: give one count per stage");
    int sum = 0;
    std::string formula;
    for (size_t s = 0; s < counts.size(); ++s) {
      if (counts[s] < 1)
        throw std::invalid_argument("pipeline: stage_layers[" + std::to_string(s) +
                                    "] = " + std::to_string(counts[s]) + " must be >= 1");
      sum += counts[s];
      formula += (s ? " + " : "") + std::to_string(counts[s]);
    }
    if (sum != layers)
      throw std::invalid_argument("pipeline: stage_layers " + formula + " = " +
                                  std::to_string(sum) + " != " + std::to_string(layers) +
                                  " layers of the model");
  }
  std::vector<StageRange> ranges;
  int first = 0;
  for (int count : counts) {
    ranges.push_back({first, first + count});
    first += count;
  }
  return ranges;
}

std::vector<StageRange> chunk_ranges(int layers, const ModelParallel& parallel) {
  const int P = parallel.pp_size(), V = parallel.virtual_stages;
  if (V < 1)
    throw std::invalid_argument("pipeline: virtual_stages = " + std::to_string(V) +
                                " must be >= 1");
  if (parallel.pp_rank() < 0 || parallel.pp_rank() >= P)
    throw std::invalid_argument("pipeline: pp_rank " + std::to_string(parallel.pp_rank()) +
                                " outside [0, pp_size = " + std::to_string(P) + ")");
  const std::vector<StageRange> all = stage_ranges(layers, P * V, parallel.stage_layers);
  std::vector<StageRange> mine;
  for (int c = 0; c < V; ++c)
    mine.push_back(all[static_cast<size_t>(c * P + parallel.pp_rank())]);
  return mine;
}

}  // namespace trainctl::model
