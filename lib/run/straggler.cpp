#include "run/straggler.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace trainctl::run {

JobStep exchange_step(StepVote mine, RankStepTime time, comm::Communicator* world) {
  if (!world) return {mine, {}};
  const std::array<double, 4> own = {mine.stop ? 1.0 : 0.0, mine.save ? 1.0 : 0.0, time.step_ms,
                                     time.comm_ms};
  std::vector<double> all(own.size() * static_cast<size_t>(world->size()));
  world->all_gather(own.data(), all.data(), sizeof own);
  JobStep job;
  for (int r = 0; r < world->size(); ++r) {
    const double* v = all.data() + static_cast<size_t>(r) * own.size();
    job.vote.stop = job.vote.stop || v[0] > 0;
    job.vote.save = job.vote.save || v[1] > 0;
    job.ranks.push_back({v[2], v[3]});
  }
  return job;
}

std::vector<std::string> gather_hosts(comm::Communicator& world) {
  std::array<char, 64> own{};
  ::gethostname(own.data(), own.size() - 1);
  std::vector<char> all(own.size() * static_cast<size_t>(world.size()));
  world.all_gather(own.data(), all.data(), own.size());
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r) {
    const char* name = all.data() + static_cast<size_t>(r) * own.size();
    hosts.emplace_back(name, strnlen(name, own.size()));
  }
  return hosts;
}

std::optional<Straggler> slowest_rank(std::span<const RankStepTime> ranks,
                                      std::span<const int> groups) {
  const auto group = [&](size_t r) { return r < groups.size() ? groups[r] : 0; };
  std::vector<int> seen;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (std::find(seen.begin(), seen.end(), group(r)) == seen.end()) seen.push_back(group(r));
  std::optional<Straggler> worst;
  for (const int g : seen) {
    std::vector<double> compute;
    Straggler s;
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (group(r) != g) continue;
      compute.push_back(ranks[r].compute_ms());
      if (compute.size() == 1 || ranks[r].compute_ms() > s.compute_ms) {
        s.rank = static_cast<int>(r);
        s.compute_ms = ranks[r].compute_ms();
      }
    }
    if (compute.size() < 2) continue;
    std::sort(compute.begin(), compute.end());
    const size_t n = compute.size();
    s.median_ms = n % 2 ? compute[n / 2] : (compute[n / 2 - 1] + compute[n / 2]) / 2;
    if (!worst || s.compute_ms - s.median_ms > worst->compute_ms - worst->median_ms) worst = s;
  }
  return worst;
}

StragglerWatch::StragglerWatch(std::vector<std::string> hosts, double threshold,
                               int64_t every_steps)
    : hosts_(std::move(hosts)),
      threshold_(threshold),
      every_steps_(std::max<int64_t>(1, every_steps)),
      slowest_count_(hosts_.size()),
      excess_sum_(hosts_.size()),
      median_sum_(hosts_.size()) {}

bool StragglerWatch::is_straggler(const Straggler& s) const {
  return threshold_ > 0 && s.compute_ms > (1 + threshold_) * s.median_ms &&
         s.compute_ms - s.median_ms >= kMinExcessMs;
}

std::optional<std::string> StragglerWatch::observe(int64_t step,
                                                   const std::optional<Straggler>& s) {
  if (s && is_straggler(*s) && static_cast<size_t>(s->rank) < slowest_count_.size()) {
    ++slowest_count_[static_cast<size_t>(s->rank)];
    excess_sum_[static_cast<size_t>(s->rank)] += s->compute_ms;
    median_sum_[static_cast<size_t>(s->rank)] += s->median_ms;
  }
  if (++window_steps_ < every_steps_ && step % every_steps_ != 0) return std::nullopt;
  const auto most = std::max_element(slowest_count_.begin(), slowest_count_.end());
  std::optional<std::string> line;
  if (most != slowest_count_.end() && *most > 0) {
    const size_t r = static_cast<size_t>(most - slowest_count_.begin());
    const double compute = excess_sum_[r] / static_cast<double>(*most);
    const double median = median_sum_[r] / static_cast<double>(*most);
    line = fmt::format(
        "straggler: rank {} on {} computed {:.1f} ms a step, {:.2f}x the median rank's {:.1f} ms "
        "(the slowest by more than {:.0f}% in {} of the last {} steps; the others waited for it)",
        r, hosts_[r], compute, median > 0 ? compute / median : 0.0, median, threshold_ * 100, *most,
        window_steps_);
  }
  window_steps_ = 0;
  std::fill(slowest_count_.begin(), slowest_count_.end(), 0);
  std::fill(excess_sum_.begin(), excess_sum_.end(), 0.0);
  std::fill(median_sum_.begin(), median_sum_.end(), 0.0);
  return line;
}

}  // namespace trainctl::run
