// Internal to lib/tokenize: the UTF-8 checks and the NFC normalization the tokenizers share.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace trainctl::tokenize::detail {

// The offset of the first byte that does not start a valid UTF-8 sequence (overlong forms,
// surrogates and code points above U+10FFFF are invalid, as in Python), or npos when all of
// `text` is valid.
size_t find_invalid_utf8(std::string_view text);

// Throws TokenizerError "text is not valid UTF-8 at byte N (...)" unless `text` is valid.
void check_utf8(std::string_view text);

// True when every byte is below 0x80 (such text is its own NFC).
bool is_ascii(std::string_view text);

// Unicode NFC of valid UTF-8 text (ICU's Normalizer2), as HF's NFC normalizer. Returns false and
// leaves `out` untouched when `text` is already NFC (the common case costs a scan, no copy).
bool nfc(std::string_view text, std::string& out);

// The length in bytes of the UTF-8 sequence that starts with byte `lead` (1 for bytes that do
// not start one).
inline size_t utf8_length(unsigned char lead) {
  return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// The code point at text[pos] (valid UTF-8) and its end.
char32_t decode_utf8(std::string_view text, size_t pos, size_t& end);

// Unicode White_Space, as Rust's char::is_whitespace (added tokens' lstrip/rstrip).
bool is_unicode_whitespace(char32_t c);

}  // namespace trainctl::tokenize::detail
