// The global sampler of lib/data: permutations, determinism, resume, data-parallel slices, and the
// fixed validation batches.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "data/data.hpp"
#include "data_test_util.hpp"

using namespace trainctl::data;
using namespace trainctl::data::test;

namespace {

constexpr int kSeqLen = 8;
constexpr int64_t kWindow = kSeqLen + 1;

// 100 windows of 8 (+1) tokens: 801 tokens, the last few tokens unused.
const SyntheticSource& source100() {
  static const SyntheticSource source(42, 256, 100 * kSeqLen + 5);
  return source;
}

std::vector<int32_t> take(Sampler& sampler, int batch) {
  std::vector<int32_t> out(static_cast<size_t>(batch * kWindow));
  sampler.next_batch(batch, out.data());
  return out;
}

std::vector<int64_t> epoch_order(const Sampler& sampler, int64_t epoch) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < sampler.num_samples(); ++i) {
    order.push_back(sampler.sample_at(epoch * sampler.num_samples() + i));
  }
  return order;
}

}  // namespace

TEST_CASE("each epoch visits every sample exactly once, in a new order") {
  const Sampler sampler(source100(), kSeqLen, 5, /*shuffle=*/true);
  REQUIRE(sampler.num_samples() == 100);
  std::vector<std::vector<int64_t>> orders;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    orders.push_back(epoch_order(sampler, epoch));
    const std::set<int64_t> distinct(orders.back().begin(), orders.back().end());
    CHECK(distinct.size() == 100);
    CHECK(*distinct.begin() == 0);
    CHECK(*distinct.rbegin() == 99);
  }
  CHECK(orders[0] != orders[1]);
  CHECK(orders[1] != orders[2]);

  std::vector<int64_t> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(orders[0] != identity);
  const Sampler in_order(source100(), kSeqLen, 5, /*shuffle=*/false);
  CHECK(epoch_order(in_order, 0) == identity);
  CHECK(epoch_order(in_order, 1) == identity);
}

TEST_CASE("sample s is the window of seq_len + 1 tokens at s * seq_len") {
  Sampler sampler(source100(), kSeqLen, 9, true);
  std::vector<int32_t> batch = take(sampler, 3);
  for (int row = 0; row < 3; ++row) {
    std::vector<int32_t> expected(kWindow);
    source100().read(sampler.sample_at(row) * kSeqLen, kWindow, expected.data());
    CHECK(std::vector<int32_t>(batch.begin() + row * kWindow,
                               batch.begin() + (row + 1) * kWindow) == expected);
  }
  CHECK(sampler.position() == 3);
}

TEST_CASE("the order is a function of the seed") {
  const Sampler a(source100(), kSeqLen, 1, true);
  const Sampler b(source100(), kSeqLen, 1, true);
  const Sampler c(source100(), kSeqLen, 2, true);
  CHECK(epoch_order(a, 0) == epoch_order(b, 0));
  CHECK(epoch_order(a, 4) == epoch_order(b, 4));
  CHECK(epoch_order(a, 0) != epoch_order(c, 0));
}

TEST_CASE("a restored sampler continues exactly where the saved one was, across epochs") {
  // 7 batches of 9 = 63 samples, then 5 more cross into epoch 1 (100 samples per epoch).
  Sampler original(source100(), kSeqLen, 77, true);
  for (int i = 0; i < 7; ++i)
    take(original, 9);
  const SamplerState saved = original.state();
  CHECK(saved.position == 63);
  CHECK(saved.epoch == 0);
  std::vector<std::vector<int32_t>> after;
  for (int i = 0; i < 5; ++i)
    after.push_back(take(original, 9));
  CHECK(original.epoch() == 1);

  Sampler resumed(source100(), kSeqLen, 77, true);
  resumed.restore(saved);
  for (int i = 0; i < 5; ++i)
    CHECK(take(resumed, 9) == after[static_cast<size_t>(i)]);
  CHECK(resumed.state().position == original.state().position);
  CHECK(resumed.state().fingerprint == original.state().fingerprint);
}

TEST_CASE("restore refuses state from other data or settings and leaves the sampler unchanged") {
  Sampler sampler(source100(), kSeqLen, 77, true);
  take(sampler, 4);
  SamplerState saved = sampler.state();
  saved.position = 50;

  Sampler other_seq_len(source100(), 4, 77, true);
  CHECK(error_of([&] { other_seq_len.restore(saved); }) ==
        "cannot resume the data sampler: the checkpoint was made with seq_len 8 but this run has "
        "seq_len 4; resume with seq_len 8 or start a new run");

  const SyntheticSource other_data(43, 256, 100 * kSeqLen + 5);
  Sampler on_other_data(other_data, kSeqLen, 77, true);
  CHECK_THROWS_WITH(on_other_data.restore(saved),
                    Catch::StartsWith("cannot resume the data sampler: the checkpoint was made on "
                                      "other data (fingerprint ") &&
                        Catch::Contains("resume with the data the checkpoint was trained on"));

  Sampler other_seed(source100(), kSeqLen, 78, true);
  CHECK(error_of([&] { other_seed.restore(saved); }) ==
        "cannot resume the data sampler: the checkpoint was made with data seed 77 but this run "
        "has seed 78; set the seed back to 77 to resume");
  CHECK(other_seed.position() == 0);

  SamplerState negative = saved;
  negative.position = -1;
  CHECK_THROWS_AS(sampler.restore(negative), DataError);
  CHECK(sampler.position() == 4);
  sampler.restore(saved);
  CHECK(sampler.position() == 50);
}

TEST_CASE("data-parallel slices of a global batch make up the single-rank batch") {
  Sampler single(source100(), kSeqLen, 3, true);
  Sampler rank0(source100(), kSeqLen, 3, true);
  Sampler rank1(source100(), kSeqLen, 3, true);
  for (int step = 0; step < 30; ++step) {  // 30 * 8 samples: crosses two epoch boundaries
    const std::vector<int32_t> whole = take(single, 8);
    std::vector<int32_t> half0(4 * kWindow);
    std::vector<int32_t> half1(4 * kWindow);
    rank0.next_batch_slice(8, 0, 2, half0.data());
    rank1.next_batch_slice(8, 1, 2, half1.data());
    std::vector<int32_t> joined = half0;
    joined.insert(joined.end(), half1.begin(), half1.end());
    REQUIRE(joined == whole);
  }
  CHECK(rank0.position() == single.position());
  CHECK(rank1.position() == single.position());
  std::vector<int32_t> out(3 * kWindow);
  CHECK(error_of([&] { rank0.next_batch_slice(7, 0, 2, out.data()); }) ==
        "global batch 7 is not a multiple of the 2 data-parallel ranks; use a global batch of 6 or "
        "8");
}

TEST_CASE("validation batches are the same windows in order on every evaluation") {
  const ValidationSet val(source100(), kSeqLen);
  CHECK(val.num_batches(16) == 6);
  std::vector<int32_t> first(16 * kWindow);
  std::vector<int32_t> again(16 * kWindow);
  val.fill_batch(2, 16, first.data());
  val.fill_batch(0, 16, again.data());
  val.fill_batch(2, 16, again.data());
  CHECK(first == again);
  std::vector<int32_t> expected(kWindow);
  source100().read(32 * kSeqLen, kWindow, expected.data());  // batch 2 starts at sample 32
  CHECK(std::vector<int32_t>(first.begin(), first.begin() + kWindow) == expected);

  std::vector<int32_t> rank1(8 * kWindow);
  val.fill_batch(2, 16, rank1.data(), 1, 2);
  CHECK(std::vector<int32_t>(first.begin() + 8 * kWindow, first.end()) == rank1);
  CHECK(error_of([&] { val.fill_batch(6, 16, first.data()); }) ==
        "validation batch 6 does not exist: the validation data holds 6 full batches of 16 "
        "windows; evaluate fewer batches or hold out more validation data");
}

TEST_CASE("the sampler refuses data too short for a window and tokens outside the vocabulary") {
  const SyntheticSource tiny(1, 256, 8);
  CHECK(error_of([&] { Sampler s(tiny, 8, 0, true); }) ==
        "synthetic (seed 1, vocab 256, 8 tokens, branching 4) has 8 tokens, fewer than one window "
        "of seq_len + 1 = 9 tokens; use a shorter seq_len or more data");
  CHECK_THROWS_AS(Sampler(tiny, 0, 0, true), DataError);

  Sampler small_vocab(source100(), kSeqLen, 0, false, /*vocab_size=*/16);
  std::vector<int32_t> out(100 * kWindow);
  CHECK_THROWS_WITH(small_vocab.next_batch(100, out.data()),
                    Catch::Contains("is outside the model vocabulary [0, 16); use a model vocab of "
                                    "at least 256"));
  Sampler fitting_vocab(source100(), kSeqLen, 0, false, /*vocab_size=*/256);
  CHECK_NOTHROW(fitting_vocab.next_batch(100, out.data()));
}

TEST_CASE("the sampler trains on the bundled text's holdout split") {
  DataConfig config;
  config.source = SourceKind::text;
  config.path = std::string(TRAINCTL_SOURCE_DIR) + "/" + std::string(kBundledTextPath);
  const Dataset dataset = open_dataset(config);
  Sampler sampler(*dataset.parts[0].train, 256, 1234, true, 256);
  const ValidationSet val(*dataset.parts[0].val, 256, 256);
  CHECK(sampler.num_samples() == (dataset.parts[0].train->size() - 1) / 256);
  CHECK(val.num_batches(8) > 20);
  std::vector<int32_t> out(8 * 257);
  sampler.next_batch(8, out.data());
  val.fill_batch(0, 8, out.data());
}
