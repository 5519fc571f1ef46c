// fp8 under tensor parallel, one Linear at a time, on two ranks: with the group's amaxes
// (TensorParallel::group_amax) every shard GEMM gives, bit for bit, the slice of the one-rank
// result that the shard owns: column-parallel y and dW, row-parallel dx and dW. One half of each
// sharded operand is made 2^12 (x, W) or 2^26 (dy) times louder than the other, so that a shard
// scaled by its own amax would quantize differently; the test checks that it does.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "backend_test_util.hpp"
#include "comm/comm.hpp"
#include "comm_test_util.hpp"
#include "model/layers.hpp"

using namespace backend_test;
using comm_test::expect;
using trainctl::model::Fp8Mode;
using trainctl::model::Linear;
using trainctl::model::Param;
using trainctl::model::TensorParallel;

namespace {

constexpr int64_t kRows = 16, kIn = 32, kOut = 48;

// A [rows, cols] row-major matrix of normal values; the first half of its rows (by_rows) or of
// its columns is multiplied by `loud`.
Values matrix(int64_t rows, int64_t cols, uint64_t stream, bool by_rows, double loud) {
  Values v = random_values(size_t(rows * cols), stream);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      if (by_rows ? i < rows / 2 : j < cols / 2) v[size_t(i * cols + j)] *= loud;
  return rounded(DType::bf16, v);
}

// Columns [begin, begin + count) of a [rows, cols] matrix, and rows [begin, begin + count).
Values columns(const Values& m, int64_t rows, int64_t cols, int64_t begin, int64_t count) {
  Values out;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = begin; j < begin + count; ++j)
      out.push_back(m[size_t(i * cols + j)]);
  return out;
}
Values rows_of(const Values& m, int64_t cols, int64_t begin, int64_t count) {
  return Values(m.begin() + begin * cols, m.begin() + (begin + count) * cols);
}

struct Results {
  Values y, dx, dw;
};

// forward then backward of y[rows, out] = x[rows, in] W^T (W [out, in]) in fp8 hybrid.
Results run(Backend& be, const TensorParallel* tp, const Values& x, const Values& w,
            const Values& dy, int64_t in, int64_t out) {
  OwnedTensor tx = make(DType::bf16, Shape{kRows, in}, x);
  OwnedTensor tw = make(DType::bf16, Shape{out, in}, w);
  OwnedTensor tdy = make(DType::bf16, Shape{kRows, out}, dy);
  OwnedTensor dw(DType::f32, Shape{out, in}), y(DType::bf16, Shape{kRows, out});
  OwnedTensor dx(DType::bf16, Shape{kRows, in});
  write(dw, Values(size_t(out * in), 0.0));
  const Linear layer{Param{tw, dw}, Param{}, Fp8Mode::hybrid, tp};
  layer.forward(be, y, tx);
  layer.backward(be, dx, tdy, tx);
  return {read(y), read(dx), read(dw)};
}

}  // namespace

TEST_CASE("fp8 tp2: each shard of a Linear quantizes like one rank, bit for bit",
          "[model][parallel][fp8]") {
  const comm_test::TempDir temp;
  const auto status = comm_test::run_ranks(2, [&](int rank) {
    auto be = trainctl::backend::make_cpu_backend();
    trainctl::comm::FileStore store(temp.path);
    auto comm = trainctl::comm::create_gloo_communicator(
        store, trainctl::comm::GroupOptions{.name = "tp", .rank = rank, .size = 2});
    OwnedTensor amax(DType::f32, Shape{TensorParallel::kMaxAmax});
    TensorParallel tp;
    tp.comm = comm.get();
    tp.amax = amax;
    const std::string where = "rank " + std::to_string(rank) + ": ";

    // Column-parallel (qkv, fc1): this rank holds W's rows and dy's columns [begin, +half).
    {
      const int64_t half = kOut / 2, begin = rank * half;
      const Values x = matrix(kRows, kIn, 1, false, 1.0);
      const Values w = matrix(kOut, kIn, 2, true, 0x1p12);
      const Values dy = matrix(kRows, kOut, 3, false, 0x1p26);
      const Results one = run(*be, nullptr, x, w, dy, kIn, kOut);
      const Values w_shard = rows_of(w, kIn, begin, half);
      const Values dy_shard = columns(dy, kRows, kOut, begin, half);
      const Results grouped = run(*be, &tp, x, w_shard, dy_shard, kIn, half);
      expect(grouped.y == columns(one.y, kRows, kOut, begin, half), where + "column-parallel y");
      expect(grouped.dw == rows_of(one.dw, kIn, begin, half), where + "column-parallel dW");
      const Results own = run(*be, nullptr, x, w_shard, dy_shard, kIn, half);
      if (rank == 1)
        expect(own.y != grouped.y && own.dw != grouped.dw,
               "the quiet shard's own scales quantize differently (column-parallel)");
    }
    // Row-parallel (proj, fc2): this rank holds W's and x's columns [begin, +half).
    {
      const int64_t half = kIn / 2, begin = rank * half;
      const Values x = matrix(kRows, kIn, 4, false, 0x1p12);
      const Values w = matrix(kOut, kIn, 5, false, 0x1p12);
      const Values dy = matrix(kRows, kOut, 6, false, 1.0);
      const Results one = run(*be, nullptr, x, w, dy, kIn, kOut);
      const Values x_shard = columns(x, kRows, kIn, begin, half);
      const Values w_shard = columns(w, kOut, kIn, begin, half);
      const Results grouped = run(*be, &tp, x_shard, w_shard, dy, half, kOut);
      expect(grouped.dx == columns(one.dx, kRows, kIn, begin, half), where + "row-parallel dx");
      expect(grouped.dw == columns(one.dw, kOut, kIn, begin, half), where + "row-parallel dW");
      const Results own = run(*be, nullptr, x_shard, w_shard, dy, half, kOut);
      if (rank == 1)
        expect(own.dx != grouped.dx && own.dw != grouped.dw,
               "the quiet shard's own scales quantize differently (row-parallel)");
    }
    comm->barrier();
    return 0;
  });
  CHECK(status == std::vector<int>{0, 0});
}
