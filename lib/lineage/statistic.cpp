// The statistic of lineage.hpp on plain numbers: centred correlation, Fisher z, Stouffer.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <stdexcept>

#include "lineage/lineage.hpp"
#include "tensor/rng.hpp"

namespace trainctl::lineage {

PairAccumulator::PairAccumulator(std::string name, int64_t rows, int64_t cols, int permutations)
    : name_(std::move(name)),
      rows_(rows),
      cols_(cols),
      col_x_(static_cast<size_t>(cols), 0.0),
      col_y_(static_cast<size_t>(cols), 0.0),
      permuted_xy_(static_cast<size_t>(std::max(permutations, 0)), 0.0) {
  if (rows < 1 || cols < 1)
    throw std::invalid_argument("PairAccumulator: " + name_ + " has an empty shape");
  // Fisher-Yates shuffles from a fixed counter stream: the same permutations on every run.
  const tensor::CounterRng rng(0x5eed, tensor::stream_key("lineage.permutations"));
  uint64_t draw = 0;
  for (int k = 0; k < permutations; ++k) {
    std::vector<int32_t> order(static_cast<size_t>(cols));
    std::iota(order.begin(), order.end(), 0);
    for (int64_t j = cols - 1; j > 0; --j)
      std::swap(order[static_cast<size_t>(j)],
                order[static_cast<size_t>(rng.bits(draw++) % static_cast<uint64_t>(j + 1))]);
    permutations_.push_back(std::move(order));
  }
}

void PairAccumulator::add_rows(int64_t first_row, std::span<const double> x,
                               std::span<const double> y) {
  const int64_t n = static_cast<int64_t>(x.size());
  if (x.size() != y.size() || n % cols_ != 0 || first_row < 0 || first_row + n / cols_ > rows_)
    throw std::invalid_argument("PairAccumulator: " + name_ + ": a block of " + std::to_string(n) +
                                " elements is not whole rows inside the tensor");
  for (int64_t i = 0; i < n / cols_; ++i) {
    // Per-row partial sums first: the totals then add R numbers of similar size, not R * C.
    double xy = 0, xx = 0, yy = 0, rx = 0, ry = 0;
    for (int64_t j = 0; j < cols_; ++j) {
      const double a = x[static_cast<size_t>(i * cols_ + j)];
      const double b = y[static_cast<size_t>(i * cols_ + j)];
      xy += a * b;
      xx += a * a;
      yy += b * b;
      rx += a;
      ry += b;
      col_x_[static_cast<size_t>(j)] += a;
      col_y_[static_cast<size_t>(j)] += b;
    }
    const double* row_x = x.data() + i * cols_;
    const double* row_y = y.data() + i * cols_;
    for (size_t k = 0; k < permutations_.size(); ++k) {
      const int32_t* order = permutations_[k].data();
      double sum = 0;
      for (int64_t j = 0; j < cols_; ++j)
        sum += row_x[j] * row_y[order[j]];
      permuted_xy_[k] += sum;
    }
    xy_ += xy;
    xx_ += xx;
    yy_ += yy;
    row_xy_ += rx * ry;
    row_xx_ += rx * rx;
    row_yy_ += ry * ry;
  }
  rows_seen_ += n / cols_;
}

TensorStat PairAccumulator::finish() const {
  if (rows_seen_ != rows_)
    throw std::logic_error("PairAccumulator: " + name_ + " saw " + std::to_string(rows_seen_) +
                           " of its " + std::to_string(rows_) + " rows");
  TensorStat s;
  s.name = name_;
  s.elements = rows_ * cols_;
  double gx = 0, gy = 0, col_xy = 0, col_xx = 0, col_yy = 0;
  for (size_t j = 0; j < col_x_.size(); ++j) {
    gx += col_x_[j];
    gy += col_y_[j];
    col_xy += col_x_[j] * col_y_[j];
    col_xx += col_x_[j] * col_x_[j];
    col_yy += col_y_[j] * col_y_[j];
  }
  const double n = static_cast<double>(s.elements), R = static_cast<double>(rows_),
               C = static_cast<double>(cols_);
  double sxy = 0, sxx = 0, syy = 0;
  if (rows_ >= 2 && cols_ >= 2) {  // double centring: the projection removes R + C - 1 directions
    sxy = xy_ - row_xy_ / C - col_xy / R + gx * gy / n;
    sxx = xx_ - row_xx_ / C - col_xx / R + gx * gx / n;
    syy = yy_ - row_yy_ / C - col_yy / R + gy * gy / n;
    s.dof = (rows_ - 1) * (cols_ - 1);
  } else {  // a vector: centred once (double centring of one row or column leaves nothing)
    sxy = xy_ - gx * gy / n;
    sxx = xx_ - gx * gx / n;
    syy = yy_ - gy * gy / n;
    s.dof = s.elements - 1;
  }
  // A side that is constant after centring says nothing (rounding leaves a residue of about
  // 1e-16 of the raw sum of squares); neither does a tensor too small for the Fisher transform.
  // The comparisons are written so a NaN side is left out too.
  if (!(sxx > 1e-10 * xx_) || !(syy > 1e-10 * yy_) || s.dof <= 2) {
    s.dof = 0;
    return s;
  }
  // Rounding can push |r| past 1 for identical tensors; atanh(1) is infinite, so stop just short
  // of it (z is then ~19 sqrt(d): evidence beyond any threshold all the same).
  constexpr double kMaxR = 1.0 - 1e-15;
  s.r = std::clamp(sxy / std::sqrt(sxx * syy), -kMaxR, kMaxR);
  s.z = std::atanh(s.r) * std::sqrt(static_cast<double>(s.dof - 2));
  if (permutations_.empty()) return s;
  if (rows_ < 2 || cols_ < 2) {  // a vector has no rows whose columns could be permuted
    s.dof = 0;
    return s;
  }
  // The centred cross-product with y's columns permuted: row sums are unchanged, column sums
  // permuted. Its mean over all permutations is exactly 0 (each row of the centred x sums to 0),
  // so the null variance is the mean square.
  double square = 0;
  for (size_t k = 0; k < permutations_.size(); ++k) {
    double cols_xy = 0;
    for (size_t j = 0; j < col_x_.size(); ++j)
      cols_xy += col_x_[j] * col_y_[static_cast<size_t>(permutations_[k][j])];
    const double permuted = permuted_xy_[k] - row_xy_ / C - cols_xy / R + gx * gy / n;
    square += permuted * permuted;
  }
  const double null_sd = std::sqrt(square / static_cast<double>(permutations_.size()));
  if (!(null_sd > 0)) {
    s.dof = 0;
    return s;
  }
  s.z = sxy / null_sd;
  return s;
}

TensorStat correlate(std::span<const double> x, std::span<const double> y, int64_t rows,
                     int64_t cols, std::string name, int permutations) {
  PairAccumulator acc(std::move(name), rows, cols, permutations);
  acc.add_rows(0, x, y);
  return acc.finish();
}

Result combine(std::vector<TensorStat> tensors) {
  Result result;
  double numerator = 0, weights = 0;
  for (const TensorStat& t : tensors) {
    if (t.dof == 0) continue;
    const double w = static_cast<double>(t.dof - 2);  // the square of z_k's weight
    numerator += std::sqrt(w) * t.z;
    weights += w;
    result.elements += t.elements;
  }
  result.tensors = std::move(tensors);
  if (weights > 0) result.z = numerator / std::sqrt(weights);
  result.p = 0.5 * std::erfc(result.z / std::numbers::sqrt2);
  result.log10_p = log10_upper_tail(result.z);
  return result;
}

double log10_upper_tail(double z) {
  // erfc is accurate down to its underflow near z = 38; switch well before, at z = 30, to the
  // asymptotic series of the Mills ratio, P(Z >= z) = phi(z) / z * (1 - 1/z^2 + 3/z^4 - 15/z^6
  // + ...), whose next term (105/z^8) is below 2e-10 there.
  if (z < 30) return std::log10(0.5 * std::erfc(z / std::numbers::sqrt2));
  const double z2 = z * z;
  const double series = 1 - 1 / z2 + 3 / (z2 * z2) - 15 / (z2 * z2 * z2);
  const double ln_p =
      -0.5 * z2 - std::log(z) - 0.5 * std::log(2 * std::numbers::pi) + std::log(series);
  return ln_p / std::numbers::ln10;
}

}  // namespace trainctl::lineage
