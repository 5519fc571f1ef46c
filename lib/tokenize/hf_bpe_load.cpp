// Reading and checking a tokenizer.json (hf_bpe.hpp). Every refusal of the hf-bpe kind is here:
// a field this code does not implement stops the load with the file, the field, the value and
// what is supported, because ids that differ from the tokenizer's own are silent data corruption.
#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <nlohmann/json.hpp>

#include "files/files.hpp"
#include "tokenize/hf_bpe.hpp"
#include "tokenize/unicode.hpp"

namespace trainctl::tokenize::detail {
namespace {

using nlohmann::json;

// The pre-tokenizer regex of GPT-2 that ByteLevel(use_regex: true) applies.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr uint64_t kMaxFileBytes = uint64_t{512} << 20;

// object[key], or null when absent (no copy of a large member such as the vocabulary).
const json& member(const json& object, std::string_view key) {
  static const json kNull;
  const auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

std::string shown(const json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// Reads one tokenizer.json; `fail` builds the messages.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void refuse(const std::string& field, const json& value,
                           std::string_view supported) const {
    throw TokenizerError(
        fmt::format("{}: {} is {}, which trainctl does not implement; supported: "
                    "{}",
                    path_, field, shown(value), supported));
  }
  [[noreturn]] void malformed(const std::string& field, std::string_view what) const {
    throw TokenizerError(
        fmt::format("{}: {} {}; is this a Hugging Face tokenizer.json?", path_, field, what));
  }

  // Refuses keys of `object` outside `known`: a field this code has never heard of may change
  // the ids.
  void only_known(const json& object, const std::string& field,
                  std::initializer_list<std::string_view> known) const {
    for (const auto& [key, value] : object.items())
      if (std::find(known.begin(), known.end(), key) == known.end())
        refuse(field + "." + key, value,
               fmt::format("the fields {} of {}", fmt::join(known, ", "), field));
  }

  bool flag(const json& object, const std::string& field, std::string_view key,
            bool fallback) const {
    if (!object.contains(key) || object[std::string(key)].is_null()) return fallback;
    const json& value = object[std::string(key)];
    if (!value.is_boolean()) malformed(fmt::format("{}.{}", field, key), "is not true or false");
    return value.get<bool>();
  }

  std::string string_of(const json& value, const std::string& field) const {
    if (!value.is_string()) malformed(field, "is not a string");
    return value.get<std::string>();
  }

  int32_t id_of(const json& value, const std::string& field) const {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= (int64_t{1} << 31) - 1)
      malformed(field, fmt::format("is {}, not a token id (an integer from 0)", shown(value)));
    return value.get<int32_t>();
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The bytes a byte-level token spells, or false when a character is outside the alphabet.
bool byte_level_bytes(std::string_view token, std::string& bytes) {
  bytes.clear();
  for (size_t pos = 0; pos < token.size();) {
    size_t end = 0;
    const int byte = char_to_byte(decode_utf8(token, pos, end));
    if (byte < 0) return false;
    bytes += static_cast<char>(byte);
    pos = end;
  }
  return true;
}

void note_id(HfBpeParts& parts, int32_t id, std::string bytes) {
  if (id >= static_cast<int32_t>(parts.id_bytes.size())) {
    parts.id_bytes.resize(id + 1);
    parts.id_exists.resize(id + 1, false);
  }
  parts.id_bytes[id] = std::move(bytes);
  parts.id_exists[id] = true;
  parts.vocab_size = std::max(parts.vocab_size, id + 1);
}

void read_model(const Reader& reader, const json& model, HfBpeParts& parts) {
  if (!model.is_object()) reader.malformed("model", "is missing or not an object");
  const json type = model.value("type", json());
  if (type != "BPE")
    reader.refuse("model.type", type,
                  "BPE (the byte-level BPE family: GPT-2, Llama 3, Qwen2), or a SentencePiece "
                  ".model file");
  reader.only_known(
      model, "model",
      {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
       "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"});
  if (const json dropout = model.value("dropout", json());
      !dropout.is_null() && dropout != 0 && dropout != 0.0)
    reader.refuse("model.dropout", dropout, "null (BPE dropout is for training-time sampling)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json affix = model.value(key, json()); !affix.is_null() && affix != "")
      reader.refuse(fmt::format("model.{}", key), affix, "null or \"\" (byte-level BPE)");
  if (reader.flag(model, "model", "byte_fallback", false))
    reader.refuse("model.byte_fallback", true,
                  "false (byte_fallback belongs to SentencePiece-style BPE: use its .model)");
  parts.model.fuse_unk = reader.flag(model, "model", "fuse_unk", false);
  parts.model.ignore_merges = reader.flag(model, "model", "ignore_merges", false);

  const json& vocab = member(model, "vocab");
  if (!vocab.is_object() || vocab.empty()) reader.malformed("model.vocab", "is missing or empty");
  TokenMap by_spelling;  // the vocabulary as the file spells it, for merges and unk_token
  std::string bytes;
  for (const auto& [token, value] : vocab.items()) {
    const int32_t id = reader.id_of(value, "model.vocab[\"" + token + "\"]");
    by_spelling[token] = id;
    parts.token_ids[token] = id;
    // A token outside the byte-level alphabet can never come out of merging bytes; it is kept
    // for decode and --eod only.
    if (byte_level_bytes(token, bytes)) {
      parts.model.vocab[bytes] = id;
      note_id(parts, id, bytes);
    } else {
      note_id(parts, id, token);
    }
  }
  if (const json unk = model.value("unk_token", json()); !unk.is_null()) {
    const auto it = by_spelling.find(reader.string_of(unk, "model.unk_token"));
    if (it == by_spelling.end())
      reader.malformed("model.unk_token", fmt::format("{} is not in model.vocab", shown(unk)));
    parts.model.unk_id = it->second;
  }

  const json& merges = member(model, "merges");
  if (!merges.is_array()) reader.malformed("model.merges", "is not a list");
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& merge = merges[rank];
    const std::string field = fmt::format("model.merges[{}]", rank);
    std::string left;
    std::string right;
    if (merge.is_string()) {  // "a b" (older files)
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        reader.malformed(field,
                         fmt::format("is {}, not two tokens separated by one space", shown(merge)));
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {  // ["a", "b"] (newer files)
      left = reader.string_of(merge[0], field + "[0]");
      right = reader.string_of(merge[1], field + "[1]");
    } else {
      reader.malformed(field, fmt::format("is {}, not \"a b\" or [\"a\", \"b\"]", shown(merge)));
    }
    const auto a = by_spelling.find(left);
    const auto b = by_spelling.find(right);
    const auto ab = by_spelling.find(left + right);
    for (const auto& [it, token] : {std::pair{a, left}, {b, right}, {ab, left + right}})
      if (it == by_spelling.end())
        reader.malformed(
            field, fmt::format("{}: the token '{}' is not in model.vocab", shown(merge), token));
    parts.model.add_merge(a->second, b->second, static_cast<int32_t>(rank), ab->second);
  }
  parts.model.finish();
}

// null, NFC, or a Sequence of those.
void read_normalizer(const Reader& reader, const json& normalizer, const std::string& field,
                     HfBpeParts& parts) {
  if (normalizer.is_null()) return;
  const json type = normalizer.is_object() ? normalizer.value("type", json()) : json();
  if (type == "NFC") {
    reader.only_known(normalizer, field, {"type"});
    parts.nfc = true;
    return;
  }
  if (type == "Sequence" && normalizer.contains("normalizers") &&
      normalizer["normalizers"].is_array()) {
    reader.only_known(normalizer, field, {"type", "normalizers"});
    const json& list = normalizer["normalizers"];
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(reader, list[i], fmt::format("{}.normalizers[{}]", field, i), parts);
    return;
  }
  reader.refuse(field + ".type", type,
                "null (no normalizer) or NFC (Qwen2), or a Sequence of them");
}

void flatten_pre_tokenizers(const Reader& reader, const json& node, const std::string& field,
                            std::vector<std::pair<std::string, const json*>>& out) {
  const json type = node.is_object() ? node.value("type", json()) : json();
  if (type == "Sequence") {
    reader.only_known(node, field, {"type", "pretokenizers"});
    const json& list = member(node, "pretokenizers");
    if (!list.is_array()) reader.malformed(field + ".pretokenizers", "is not a list");
    for (size_t i = 0; i < list.size(); ++i)
      flatten_pre_tokenizers(reader, list[i], fmt::format("{}.pretokenizers[{}]", field, i), out);
    return;
  }
  out.emplace_back(field, &node);
}

std::string escape_literal(std::string_view text) {
  std::string pattern;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x80 && !std::isalnum(byte)) pattern += '\\';
    pattern += c;
  }
  return pattern;
}

constexpr std::string_view kSupportedPreTokenizers =
    "ByteLevel, or a Sequence of Split (Regex or String pattern, behavior Isolated, invert false) "
    "steps ending in one ByteLevel (GPT-2, Llama 3, Qwen2)";

void read_pre_tokenizer(const Reader& reader, const json& root, HfBpeParts& parts) {
  const json& node = member(root, "pre_tokenizer");
  std::vector<std::pair<std::string, const json*>> steps;
  flatten_pre_tokenizers(reader, node, "pre_tokenizer", steps);
  bool byte_level = false;
  for (const auto& [field, step] : steps) {
    const json type = step->is_object() ? step->value("type", json()) : json();
    if (byte_level)
      reader.refuse(field + ".type", type,
                    "nothing after ByteLevel: " + std::string(kSupportedPreTokenizers));
    if (type == "ByteLevel") {
      reader.only_known(*step, field, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
      byte_level = true;
      if (reader.flag(*step, field, "add_prefix_space", true))
        parts.steps.push_back({true, nullptr});
      if (reader.flag(*step, field, "use_regex", true))
        parts.steps.push_back(
            {false, std::make_unique<Regex>(kGpt2Pattern, reader.path() + ": " + field)});
    } else if (type == "Split") {
      reader.only_known(*step, field, {"type", "pattern", "behavior", "invert"});
      if (const json behavior = step->value("behavior", json()); behavior != "Isolated")
        reader.refuse(field + ".behavior", behavior, "Isolated");
      if (reader.flag(*step, field, "invert", false))
        reader.refuse(field + ".invert", true, "false");
      const json pattern = step->value("pattern", json());
      std::string regex;
      if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex"))
        regex = reader.string_of(pattern["Regex"], field + ".pattern.Regex");
      else if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String"))
        regex = escape_literal(reader.string_of(pattern["String"], field + ".pattern.String"));
      else
        reader.refuse(field + ".pattern", pattern, "{\"Regex\": ...} or {\"String\": ...}");
      parts.steps.push_back(
          {false, std::make_unique<Regex>(regex, reader.path() + ": " + field + ".pattern")});
    } else {
      reader.refuse(field + ".type", type, kSupportedPreTokenizers);
    }
  }
  if (!byte_level)
    reader.refuse("pre_tokenizer", node,
                  std::string(kSupportedPreTokenizers) +
                      " (trainctl reads byte-level BPE tokenizer.json files only)");
}

void read_added_tokens(const Reader& reader, const json& root, HfBpeParts& parts) {
  const json& list = member(root, "added_tokens");
  if (list.is_null()) return;
  if (!list.is_array()) reader.malformed("added_tokens", "is not a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& token = list[i];
    const std::string field = fmt::format("added_tokens[{}]", i);
    if (!token.is_object()) reader.malformed(field, "is not an object");
    reader.only_known(
        token, field,
        {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
    const int32_t id = reader.id_of(token.value("id", json()), field + ".id");
    std::string content = reader.string_of(token.value("content", json()), field + ".content");
    if (reader.flag(token, field, "single_word", false))
      reader.refuse(field + ".single_word", true, "false");
    const bool special = reader.flag(token, field, "special", false);
    const bool normalized = reader.flag(token, field, "normalized", !special);
    const bool lstrip = reader.flag(token, field, "lstrip", false);
    const bool rstrip = reader.flag(token, field, "rstrip", false);
    parts.token_ids[content] = id;
    note_id(parts, id, content);
    if (normalized) {
      // Matched against normalized text, so its content is normalized too (as in HF).
      std::string normal;
      if (parts.nfc && nfc(content, normal)) content = normal;
      parts.normalized_tokens.add(content, id, lstrip, rstrip);
    } else {
      parts.raw_tokens.add(content, id, lstrip, rstrip);
    }
  }
}

}  // namespace

HfBpeParts read_tokenizer_json(const std::string& path) {
  const Reader reader(path);
  std::string text;
  try {
    text = files::read_regular_file(path, kMaxFileBytes, "tokenizer");
  } catch (const files::FileError& e) {
    throw TokenizerError(e.what());
  }
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    throw TokenizerError(
        fmt::format("{}: not JSON ({}); a Hugging Face tokenizer.json was "
                    "expected",
                    path, e.what()));
  }
  if (!root.is_object()) reader.malformed("the top level", "is not an object");
  reader.only_known(root, "the top level",
                    {"version", "truncation", "padding", "added_tokens", "normalizer",
                     "pre_tokenizer", "post_processor", "decoder", "model"});
  for (const char* key : {"truncation", "padding"})
    if (const json value = root.value(key, json()); !value.is_null())
      reader.refuse(key, value, "null (trainctl encodes whole documents, unpadded)");
  HfBpeParts parts;
  parts.path = path;
  read_model(reader, member(root, "model"), parts);
  read_normalizer(reader, member(root, "normalizer"), "normalizer", parts);
  read_pre_tokenizer(reader, root, parts);
  read_added_tokens(reader, root, parts);
  return parts;
}

}  // namespace trainctl::tokenize::detail
