// The pre-tokenizer regexes with PCRE2 (regex.hpp).
#include "tokenize/regex.hpp"

#include <fmt/format.h>

#include "tokenize/tokenize.hpp"

namespace trainctl::tokenize::detail {
namespace {

// Unicode White_Space, Oniguruma's \s.
constexpr std::string_view kSpaceSet =
    R"(\t-\r\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";
// Oniguruma's Unicode \w.
constexpr std::string_view kWordSet = R"(\p{L}\p{M}\p{N}\p{Pc})";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string translate_oniguruma_classes(std::string_view pattern, const std::string& where) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in `pattern` just after '[' or '[^'
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      const bool word = e == 'w' || e == 'W';
      if (e == 's' || e == 'w') {
        const std::string_view set = word ? kWordSet : kSpaceSet;
        out += in_class ? std::string(set) : fmt::format("[{}]", set);
      } else if (e == 'S' || e == 'W') {
        if (in_class)
          throw TokenizerError(fmt::format(
              "{}: the regex '{}' has \\{} inside a [...] class, which cannot be translated from "
              "Oniguruma to PCRE2; supported: \\s \\w inside classes, \\S \\W outside",
              where, pattern, e));
        out += fmt::format("[^{}]", word ? kWordSet : kSpaceSet);
      } else if (e == 'h' || e == 'H' || e == 'Q') {
        throw TokenizerError(fmt::format(
            "{}: the regex '{}' uses \\{}, which Oniguruma and PCRE2 read differently; not "
            "supported",
            where, pattern, e));
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == '[')
      throw TokenizerError(fmt::format(
          "{}: the regex '{}' nests a [...] class (Oniguruma's class set operations); not "
          "supported",
          where, pattern));
    if (in_class && c == ']' && i != class_start) in_class = false;
    out += c;
  }
  return out;
}

RegexScratch::RegexScratch() {
  data_ = pcre2_match_data_create(1, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  stack_ = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
  if (data_ == nullptr || context_ == nullptr || stack_ == nullptr) throw std::bad_alloc();
  pcre2_jit_stack_assign(context_, nullptr, stack_);
}

RegexScratch::~RegexScratch() {
  pcre2_jit_stack_free(stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(data_);
}

Regex::Regex(std::string_view pattern, const std::string& where)
    : pattern_(pattern), where_(where) {
  const std::string translated = translate_oniguruma_classes(pattern, where);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                        PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code_ == nullptr)
    throw TokenizerError(
        fmt::format("{}: the regex '{}' does not compile: {} (at offset {} of "
                    "its PCRE2 form '{}')",
                    where, pattern, pcre2_message(error), offset, translated));
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  pcre2_code_free(code_);
}

bool Regex::find(std::string_view text, size_t start, RegexScratch& scratch, size_t& begin,
                 size_t& end) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The text was checked once (check_utf8): PCRE2 would otherwise re-check the rest of the text
  // at every call, which is quadratic.
  const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                        scratch.data(), scratch.context())
                      : pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                    scratch.data(), scratch.context());
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0)  // rc == 0: a match with more groups than the ovector holds, which is fine
    throw TokenizerError(
        fmt::format("{}: matching the regex '{}' failed: {}", where_, pattern_, pcre2_message(rc)));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data());
  begin = ovector[0];
  end = ovector[1];
  return true;
}

}  // namespace trainctl::tokenize::detail
