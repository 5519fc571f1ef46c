// The lineage test: does a model descend from the initialisation of seed N (test_seed), or do two
// models share an initialisation (test_against)? After SeedPrints (the method issue 29 names): a
// model's random initialisation leaves a "birth fingerprint" in its weights that training does not
// erase. trainctl's initialisation is a pure function of (seed, tensor name, element index)
// (model::InitialValues), so the birth values of seed N are reproduced exactly, whatever layout
// trained or saved the model.
//
// The statistic, per normal-initialised tensor (zeros/ones-initialised norms and biases start
// identical in every model and carry no fingerprint; the table comes from the checkpoint's model
// description, model::build_param_table, so the roles decide, never the names):
//   1. View the tensor as a matrix of R rows (all dimensions but the last) and C columns (the
//      last), and double-centre both sides: x_ij - row mean_i - column mean_j + grand mean.
//      Two models trained on the same data share mean shifts (a row of a token the data never
//      shows moves like every other such row; a column of the residual stream moves together),
//      which would correlate two unrelated models; removing row and column means removes them.
//   2. r = Pearson correlation of the centred birth (or other model's) and current values.
//   3. Fisher z = atanh(r) * sqrt(d - 2), with d = (R - 1)(C - 1) the degrees of freedom left
//      after centring (d = n - 1 for a vector, centred once; then sqrt(d - 2) = sqrt(n - 3)).
//      Under "independent of that seed" the birth values are i.i.d. normal and independent of
//      the weights, so r is exactly distributed as the correlation of a fixed vector with a
//      random direction of a d-dimensional space and z is N(0, 1) to within O(1/d).
//   4. Combined over the K tensors by weighted Stouffer, z_k weighted by sqrt(d_k - 2):
//          Z = sum_k sqrt(d_k - 2) z_k / sqrt(sum_k (d_k - 2))
//            = sum_k (d_k - 2) atanh(r_k) / sqrt(sum_k (d_k - 2)).
//      The birth values of different tensors are independent streams, so the z_k are
//      independent and Z is N(0, 1) under the null for any fixed weights. These weights are the
//      inverse-variance (fixed-effect) combination of the atanh(r_k), the most powerful when the
//      tensors keep a similar share of their birth values; an unweighted sum would let a small
//      tensor count as much as the embedding.
//   5. One-sided p = P(N(0,1) >= Z) = erfc(Z / sqrt 2) / 2: training moves weights away from
//      their birth values but not against them, so only positive correlation is evidence.
//      p underflows double precision for Z > ~38 (a trained model has Z in the hundreds), so
//      log10 p is computed directly (log10_upper_tail) and reported too.
// The init scale (model.init_std, which the description does not record) does not matter:
// correlation is scale-free.
//
// The null of --against (test_against). Neither side is i.i.d. there, and two models trained on
// the same data share structure that is aligned by the data: the rows of a token embedding
// belong to the same tokens in both. Measured (docs/lineage.md): the rows of the tokens the data
// never shows move together, a (rows) x (direction) rank-one part whose direction is the model's
// own, so the two models' embeddings correlate like two random C-vectors, not like two random
// R x C matrices: their Fisher z spread with a standard deviation near sqrt(R), |z| up to 22 on
// unrelated pairs (step 1 removes only the part shared by all rows). So test_against replaces
// step 3 by a permutation null: the last dimension of every tensor is an input-feature axis
// (hidden units, the residual stream) whose order is an arbitrary labelling fixed by each
// model's own initialisation, while the data-aligned axes (tokens, positions) come first. Under
// "independent initialisations", permuting the other model's last dimension leaves the joint
// distribution unchanged, so z = S / sd(S_pi), S the centred cross-product and S_pi its values
// over kPermutations random column permutations pi (mean 0 exactly, double-centred), is ~N(0, 1)
// whatever structure the rows share. A shared initialisation puts its correlation on the diagonal
// of the feature axes, which a permutation destroys; its z is then of order C (per tensor), far
// past any threshold. Steps 4 and 5 are unchanged.
// docs/lineage.md measures both modes on descendant and unrelated pairs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckpt/reader.hpp"

namespace trainctl::lineage {

// Verdict threshold on p: "descends" below it (Z > 7.03). In docs/lineage.md's table the
// unrelated pairs stay below Z = 2.7 and the descendants above Z = 35, in both modes.
inline constexpr double kThreshold = 1e-12;

// One tensor's statistic.
struct TensorStat {
  std::string name;      // the parameter ("layers.0.attn.qkv.weight")
  int64_t elements = 0;  // R * C
  int64_t dof = 0;       // d: degrees of freedom left after centring
  double r = 0;          // correlation after centring
  double z = 0;          // atanh(r) * sqrt(d - 2), or S / sd(S_pi) with permutations
};

struct Result {
  std::vector<TensorStat> tensors;  // in the model's parameter order
  int64_t elements = 0;             // over the tensors used
  double z = 0;                     // the combined statistic
  double p = 1;                     // one-sided; 0 when it underflows (see log10_p)
  double log10_p = 0;
  bool descends() const { return p < kThreshold; }
};

// Accumulates the centred cross-products of two R x C matrices a row block at a time, so a tensor
// never has to be held whole twice in double precision. The centred sums follow from the raw
// ones and the row and column sums: sum x~y~ = sum xy - sum_i Rx_i Ry_i / C - sum_j Cx_j Cy_j / R
// + Gx Gy / (R C) (R/C: row/column sums, G: grand sums).
//
// With `permutations` > 0 (test_against) z is not the Fisher z but the centred cross-product
// divided by its standard deviation over that many random permutations of the second matrix's
// columns (fixed ones: the result is deterministic). See "The null of --against" above.
class PairAccumulator {
 public:
  PairAccumulator(std::string name, int64_t rows, int64_t cols, int permutations = 0);
  // Rows [first_row, first_row + x.size() / cols) of both matrices, row-major; blocks may come
  // in any order but every row exactly once.
  void add_rows(int64_t first_row, std::span<const double> x, std::span<const double> y);
  // The tensor's statistic. dof is 0 (the tensor carries no information; combine skips it) when a
  // side is constant after centring or the tensor is too small (d <= 2).
  TensorStat finish() const;

 private:
  std::string name_;
  int64_t rows_, cols_;
  int64_t rows_seen_ = 0;
  double xy_ = 0, xx_ = 0, yy_ = 0;              // raw sums of products
  double row_xy_ = 0, row_xx_ = 0, row_yy_ = 0;  // sums of products of row sums
  std::vector<double> col_x_, col_y_;            // column sums
  // Permutation k of the columns, and the raw cross-product of x with y so permuted.
  std::vector<std::vector<int32_t>> permutations_;
  std::vector<double> permuted_xy_;
};

// The statistic of two whole R x C matrices (tests; the checkpoint tests stream rows).
TensorStat correlate(std::span<const double> x, std::span<const double> y, int64_t rows,
                     int64_t cols, std::string name = "", int permutations = 0);

// The permutations test_against estimates each tensor's null from: the estimate's relative
// standard error is 1/sqrt(2 * 64) = 9%.
inline constexpr int kPermutations = 64;

// Combines tensors by weighted Stouffer (above); tensors with dof 0 are left out.
Result combine(std::vector<TensorStat> tensors);

// log10 P(N(0,1) >= z), accurate where the tail underflows double precision.
double log10_upper_tail(double z);

// The test of `model` against the birth values of `seed` (determinism.seed of the recipe).
// Throws ckpt::CheckpointError when the checkpoint's model description is missing or does not
// describe its tensors, or a tensor fails its checksum.
Result test_seed(const ckpt::CheckpointReader& model, uint64_t seed);

// Two models' tensors against each other. Throws Incomparable when `other` lacks a tensor of
// `model` or has it with another shape.
class Incomparable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
Result test_against(const ckpt::CheckpointReader& model, const ckpt::CheckpointReader& other);

}  // namespace trainctl::lineage
