// UTF-8 checks and NFC (unicode.hpp).
#include "tokenize/unicode.hpp"

#include <unicode/bytestream.h>
#include <unicode/errorcode.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include <cstring>

#include <fmt/format.h>

#include "tokenize/tokenize.hpp"

namespace trainctl::tokenize::detail {

size_t find_invalid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    // Eight ASCII bytes at a time: most text is mostly ASCII.
    if (i + 8 <= size) {
      uint64_t word;
      std::memcpy(&word, bytes + i, 8);
      if ((word & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    char32_t min = 0;
    char32_t code = 0;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2, min = 0x80, code = lead & 0x1F;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3, min = 0x800, code = lead & 0x0F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4, min = 0x10000, code = lead & 0x07;
    } else {
      return i;
    }
    if (i + length > size) return i;
    for (size_t k = 1; k < length; ++k) {
      if ((bytes[i + k] & 0xC0) != 0x80) return i;
      code = (code << 6) | (bytes[i + k] & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += length;
  }
  return std::string_view::npos;
}

void check_utf8(std::string_view text) {
  const size_t bad = find_invalid_utf8(text);
  if (bad == std::string_view::npos) return;
  const size_t from = bad >= 16 ? bad - 16 : 0;
  std::string context;
  for (size_t i = from; i < text.size() && i < bad + 8; ++i)
    context += fmt::format("{}{:02x}",
                           i == bad    ? "["
                           : i == from ? ""
                                       : " ",
                           static_cast<unsigned char>(text[i])) +
               (i == bad ? "]" : "");
  throw TokenizerError(fmt::format(
      "text is not valid UTF-8 at byte {} (bytes {}): tokenizers read Unicode text; convert the "
      "file to UTF-8 (e.g. iconv -f latin1 -t utf-8) or drop the broken bytes",
      bad, context));
}

bool is_ascii(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

bool nfc(std::string_view text, std::string& out) {
  if (is_ascii(text)) return false;
  icu::ErrorCode error;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(error);
  if (error.isFailure())
    throw TokenizerError(fmt::format("ICU has no NFC normalizer: {}", error.errorName()));
  const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
  if (normalizer->isNormalizedUTF8(piece, error) && error.isSuccess()) return false;
  error.reset();
  std::string normalized;
  icu::StringByteSink<std::string> sink(&normalized, static_cast<int32_t>(text.size()));
  normalizer->normalizeUTF8(0, piece, sink, nullptr, error);
  if (error.isFailure())
    throw TokenizerError(
        fmt::format("ICU could not NFC-normalize the text: {}", error.errorName()));
  out = std::move(normalized);
  return true;
}

char32_t decode_utf8(std::string_view text, size_t pos, size_t& end) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  const size_t length = utf8_length(lead);
  char32_t code = length == 1   ? lead
                  : length == 2 ? lead & 0x1F
                  : length == 3 ? lead & 0x0F
                                : lead & 0x07;
  for (size_t k = 1; k < length && pos + k < text.size(); ++k)
    code = (code << 6) | (static_cast<unsigned char>(text[pos + k]) & 0x3F);
  end = pos + length;
  return code;
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace trainctl::tokenize::detail
