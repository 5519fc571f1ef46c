// Internal to lib/tokenize: the pre-tokenizer regexes, compiled once with PCRE2 (8-bit, UTF and
// Unicode properties, JIT), matched from many threads with per-thread scratch.
//
// HF tokenizers compile these patterns with Oniguruma. PCRE2 reads the patterns in use (GPT-2's,
// Llama 3's, Qwen2's) the same way except for Perl classes, whose Unicode sets differ: Oniguruma's
// \s is Unicode White_Space (PCRE2 10.42 also counts U+180E) and its \w is letters, marks,
// numbers and connector punctuation (PCRE2's has no marks). The constructor rewrites \s \S \w \W
// into explicit classes with Oniguruma's sets, and refuses what it cannot translate (\S or \W
// inside a [...] class, \h \H, whose meaning differs, and \Q...\E).
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace trainctl::tokenize::detail {

// One thread's match state for one Regex (PCRE2 match data is not shareable between threads).
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

  pcre2_match_data* data() const { return data_; }
  pcre2_match_context* context() const { return context_; }

 private:
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
};

class Regex {
 public:
  // `where` names the file and field for messages ("x/tokenizer.json: pre_tokenizer...").
  // Throws TokenizerError when the pattern cannot be translated or compiled.
  Regex(std::string_view pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match in text[start, size) (text valid UTF-8, start on a character boundary):
  // sets [begin, end) and returns true, or returns false when there is none. Thread-safe with one
  // scratch per thread.
  bool find(std::string_view text, size_t start, RegexScratch& scratch, size_t& begin,
            size_t& end) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;  // as written in the file
  std::string where_;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// The pattern with Oniguruma's \s \S \w \W spelled as explicit PCRE2 classes (see the top of
// this file). Throws TokenizerError naming `where` for what cannot be translated.
std::string translate_oniguruma_classes(std::string_view pattern, const std::string& where);

}  // namespace trainctl::tokenize::detail
