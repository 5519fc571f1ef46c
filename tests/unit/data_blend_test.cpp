// Blends (data.sources): samples drawn from several datasets in proportion to their weights, in
// a seeded order that a resume continues exactly.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "data/data.hpp"
#include "data_test_util.hpp"

using namespace trainctl::data;
using namespace trainctl::data::test;

namespace {

constexpr int kSeqLen = 8;

// Three synthetic datasets of different sizes (their windows: 100, 37 and 250).
struct ThreeSources {
  SyntheticSource a{1, 256, 100 * kSeqLen + 1};
  SyntheticSource b{2, 256, 37 * kSeqLen + 1};
  SyntheticSource c{3, 256, 250 * kSeqLen + 1};
  std::vector<SamplerPart> parts(double wa, double wb, double wc) const {
    return {{&a, wa}, {&b, wb}, {&c, wc}};
  }
};

}  // namespace

TEST_CASE("a blend's proportions over 10,000 samples follow the weights within one sample") {
  const ThreeSources s;
  const Sampler blend(s.parts(0.5, 0.3, 0.2), kSeqLen, 7, true);
  CHECK(blend.num_parts() == 3);
  CHECK(blend.num_samples() == 100 + 37 + 250);
  std::vector<int64_t> taken(3, 0);
  for (int64_t p = 0; p < 10000; ++p) {
    const Sampler::Sample sample = blend.locate(p);
    ++taken[static_cast<size_t>(sample.part)];
    // Never more than one sample from the share, at every prefix.
    const std::vector<double> weights = {0.5, 0.3, 0.2};
    for (size_t d = 0; d < 3; ++d)
      REQUIRE(std::abs(static_cast<double>(taken[d]) - weights[d] * static_cast<double>(p + 1)) <=
              1.0);
  }
  CHECK(taken == std::vector<int64_t>{5000, 3000, 2000});
  // Weights need not sum to 1: 5:3:2 is the same blend.
  const Sampler same(s.parts(5, 3, 2), kSeqLen, 7, true);
  for (int64_t p = 0; p < 500; ++p) {
    CHECK(same.locate(p).part == blend.locate(p).part);
    CHECK(same.locate(p).index == blend.locate(p).index);
  }
  CHECK(same.fingerprint() == blend.fingerprint());
}

TEST_CASE("each dataset of a blend visits all of its windows once per epoch of its own") {
  const ThreeSources s;
  const Sampler blend(s.parts(1, 1, 1), kSeqLen, 11, true);
  std::vector<std::vector<int64_t>> seen(3);
  for (int64_t p = 0; p < 3 * 250; ++p) {
    const Sampler::Sample sample = blend.locate(p);
    seen[static_cast<size_t>(sample.part)].push_back(sample.index);
  }
  // b (37 windows) went through 250 / 37 epochs: each full epoch is a permutation.
  const std::vector<int64_t>& b = seen[1];
  REQUIRE(b.size() == 250);
  for (size_t epoch = 0; epoch + 1 < 250 / 37; ++epoch) {
    std::set<int64_t> windows(b.begin() + static_cast<long>(epoch * 37),
                              b.begin() + static_cast<long>((epoch + 1) * 37));
    CHECK(windows.size() == 37);
    CHECK(*windows.rbegin() == 36);
  }
  // The epochs of one part are shuffled differently.
  CHECK(std::vector<int64_t>(b.begin(), b.begin() + 37) !=
        std::vector<int64_t>(b.begin() + 37, b.begin() + 74));
}

TEST_CASE("a blend read in any order or after a restore gives the same batches") {
  const ThreeSources s;
  Sampler original(s.parts(0.6, 0.1, 0.3), kSeqLen, 5, true);
  std::vector<int32_t> batch(static_cast<size_t>(6 * (kSeqLen + 1)));
  for (int step = 0; step < 700; ++step)  // 4,200 samples: past a snapshot of the walk
    original.next_batch(6, batch.data());
  const SamplerState saved = original.state();
  std::vector<std::vector<int32_t>> after;
  for (int step = 0; step < 20; ++step) {
    original.next_batch(6, batch.data());
    after.push_back(batch);
  }

  Sampler resumed(s.parts(0.6, 0.1, 0.3), kSeqLen, 5, true);
  resumed.restore(saved);
  for (int step = 0; step < 20; ++step) {
    resumed.next_batch(6, batch.data());
    CHECK(batch == after[static_cast<size_t>(step)]);
  }
  // Going back (a rank's slice before another's) walks again from a snapshot, same answer.
  std::vector<int32_t> again(batch.size());
  original.fill_batch(saved.position, 6, again.data());
  CHECK(again == after[0]);
  original.fill_batch(3, 6, again.data());
  resumed.fill_batch(3, 6, batch.data());
  CHECK(again == batch);

  // Other weights are other data: the state is refused.
  Sampler reweighted(s.parts(0.5, 0.2, 0.3), kSeqLen, 5, true);
  CHECK(error_of([&] {
          reweighted.restore(saved);
        }).starts_with("cannot resume the data sampler: the checkpoint was made on other data"));
}

TEST_CASE("a blend of one dataset is that dataset's sampler, its fingerprint included") {
  const ThreeSources s;
  const Sampler single(s.a, kSeqLen, 9, true);
  const Sampler one_part(std::vector<SamplerPart>{{&s.a, 3.0}}, kSeqLen, 9, true);
  CHECK(single.fingerprint() == fingerprint_source(s.a, kSeqLen));
  CHECK(one_part.fingerprint() == single.fingerprint());
  for (int64_t p = 0; p < 250; ++p)
    CHECK(one_part.sample_at(p) == single.sample_at(p));
}

TEST_CASE("a blend refuses a weight that is not positive and a dataset shorter than a window") {
  const ThreeSources s;
  CHECK(error_of([&] { Sampler bad(s.parts(1, 0, 1), kSeqLen, 1, true); }) ==
        s.b.describe() +
            ": blend weight 0 is not a positive number; give every dataset of the blend a "
            "weight > 0");
  const SyntheticSource tiny(4, 256, 5);
  CHECK(error_of([&] {
          Sampler bad(std::vector<SamplerPart>{{&s.a, 1}, {&tiny, 1}}, kSeqLen, 1, true);
        }) == tiny.describe() +
                  " has 5 tokens, fewer than one window of seq_len + 1 = 9 tokens; use a shorter "
                  "seq_len or more data");
}

TEST_CASE("open_dataset blends data.sources, each with its own validation holdout") {
  TempDir dir;
  write_bytes(dir.file("a.txt"), std::string(1000, 'a'));
  write_bytes(dir.file("b.txt"), std::string(500, 'b'));
  DataConfig config;
  config.source = SourceKind::text;
  config.sources = {{dir.file("a.txt"), 3}, {dir.file("b.txt"), 1}};
  config.val_fraction = 0.1;
  const Dataset dataset = open_dataset(config);
  REQUIRE(dataset.parts.size() == 2);
  CHECK(dataset.parts[0].train->size() == 900);
  CHECK(dataset.parts[1].val->size() == 50);
  CHECK(dataset.train_tokens() == 900 + 450);
  CHECK(dataset.val_tokens() == 100 + 50);
  CHECK(dataset.describe() == "a blend of 2 datasets: text " + dir.file("a.txt") +
                                  " (1000 bytes) tokens [0, 900) (75%), text " + dir.file("b.txt") +
                                  " (500 bytes) tokens [0, 450) (25%)");

  Sampler sampler(dataset.train_parts(), 4, 1, true);
  std::vector<int32_t> rows(static_cast<size_t>(400 * 5));
  sampler.next_batch(400, rows.data());
  const auto from_a = std::count(rows.begin(), rows.end(), 'a');
  CHECK(from_a == 300 * 5);

  const ValidationSet val(dataset.val_parts(), 4);
  CHECK(val.num_samples() == (99 / 4) + (49 / 4));

  config.val_path = dir.file("b.txt");
  CHECK(error_of([&] {
          open_dataset(config);
        }).starts_with("a blend (data.sources) takes no data.path or data.val_path"));
}
