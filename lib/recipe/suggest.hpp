// "Did you mean": the spelling suggestion every file format of trainctl uses (recipes, cluster
// descriptions), so a typo gets the same help wherever it is made.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace trainctl::recipe {

// The candidate closest to `word` by edit distance (transpositions count 1, case ignored), or ""
// when none is close enough to be a plausible typo.
std::string closest(std::string_view word, const std::vector<std::string_view>& candidates);

}  // namespace trainctl::recipe
