// The ZeRO-1 partition of a flat parameter buffer into contiguous parts, one per dp rank. The
// model (ParamStore's optimizer state), the trainer (GradSync's reduce-scatter and gather) and the
// planner's memory model must agree on it element for element, so all of them call these
// functions. Header-only: the planner uses them without linking the model.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainctl::model {

// One tensor of the flat buffer, in buffer order: its elements and its rows (the first dimension;
// 1 for a scalar). A part boundary may only fall between rows, so each part of a tensor is a box.
struct TensorRows {
  int64_t numel = 0;
  int64_t rows = 1;
};

// Cuts the buffer made of `tensors` into `parts` contiguous ranges, each boundary at the row
// boundary nearest to the ideal cut k * total / parts (ties: the lower one). Returns parts + 1
// boundaries from 0 to the total; parts are as equal as rows allow.
inline std::vector<int64_t> zero_partition(const std::vector<TensorRows>& tensors, int parts) {
  if (parts < 1)
    throw std::invalid_argument("zero_partition: parts = " + std::to_string(parts) +
                                " must be >= 1");
  int64_t total = 0;
  for (const TensorRows& t : tensors)
    total += t.numel;
  std::vector<int64_t> bounds{0};
  size_t i = 0;
  int64_t offset = 0;  // of tensors[i]
  for (int k = 1; k < parts; ++k) {
    const int64_t ideal = total * k / parts;
    while (i < tensors.size() && offset + tensors[i].numel <= ideal)
      offset += tensors[i++].numel;
    int64_t cut = total;
    if (i < tensors.size()) {
      const int64_t n = tensors[i].numel;
      const int64_t row = tensors[i].rows > 0 ? n / tensors[i].rows : n;
      const int64_t within = ideal - offset;
      const int64_t lower = within / row * row;
      cut = offset + (within - lower > lower + row - within ? lower + row : lower);
    }
    bounds.push_back(std::max(cut, bounds.back()));
  }
  bounds.push_back(total);
  return bounds;
}

// How many elements of [begin, end) fall into each part of a partition (its `bounds`, as
// zero_partition returns them); [0, total) gives the sizes of the parts.
inline std::vector<size_t> zero_shares(const std::vector<int64_t>& bounds, int64_t begin,
                                       int64_t end) {
  std::vector<size_t> shares;
  for (size_t r = 0; r + 1 < bounds.size(); ++r)
    shares.push_back(static_cast<size_t>(
        std::max<int64_t>(0, std::min(end, bounds[r + 1]) - std::max(begin, bounds[r]))));
  return shares;
}

}  // namespace trainctl::model
