// lib/tokenize: a hand-made tokenizer.json whose BPE ids follow from its merges by hand (each
// expectation was also checked once against Python's tokenizers), added tokens, every refusal of
// the loader, and many threads against one. Token-for-token equality with the real libraries on
// trained tokenizers is tests/integration/cli_tokenize.py.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "files/files.hpp"
#include "tokenize/tokenize.hpp"

namespace {

using nlohmann::json;
using trainctl::tokenize::load_tokenizer;
using trainctl::tokenize::TokenizerError;
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "trainctl-tokenize-test-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

json added_token(int id, const std::string& content, bool strip) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", strip},
          {"rstrip", strip}, {"normalized", false}, {"special", true}};
}

// a b c Ġ, merges (a,b) (ab,c) (Ġ,ab); "ca" is a token no merge reaches; <|endoftext|> and <m>
// (lstrip, rstrip) are added tokens.
json tiny_tokenizer() {
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", {added_token(7, "<|endoftext|>", false), added_token(9, "<m>", true)}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", nullptr},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab",
             {{"a", 0},
              {"b", 1},
              {"c", 2},
              {"\xC4\xA0", 3},
              {"ab", 4},
              {"abc", 5},
              {"\xC4\xA0"
               "ab",
               6},
              {"<|endoftext|>", 7},
              {"ca", 8},
              {"<m>", 9}}},
            {"merges", json::array({json::array({"a", "b"}), json::array({"ab", "c"}),
                                    json::array({"\xC4\xA0", "ab"})})}}}};
}

fs::path write(const fs::path& dir, const json& document, const std::string& name = "t.json") {
  const fs::path path = dir / name;
  std::ofstream(path) << document.dump();
  return path;
}

std::vector<int32_t> encode(const trainctl::tokenize::Tokenizer& tokenizer, std::string_view text) {
  std::vector<int32_t> ids;
  tokenizer.encode(text, ids);
  return ids;
}

// The message of the TokenizerError that loading `document` throws ("" when none).
std::string refusal(const json& document) {
  TempDir dir;
  const fs::path path = write(dir.path, document);
  try {
    load_tokenizer(path.string());
  } catch (const TokenizerError& e) {
    std::string message = e.what();
    CHECK(message.find(path.string()) != std::string::npos);  // every message names the file
    return message;
  }
  return "";
}

// GPT-2's bytes_to_unicode, as the file spells a byte.
std::string byte_token(int byte) {
  const bool printable =
      (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
  int code = byte;
  if (!printable) {
    code = 256;
    for (int b = 0; b < byte; ++b)
      if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) ++code;
  }
  std::string utf8;
  if (code < 0x80) {
    utf8 += static_cast<char>(code);
  } else {
    utf8 += static_cast<char>(0xC0 | (code >> 6));
    utf8 += static_cast<char>(0x80 | (code & 0x3F));
  }
  return utf8;
}

}  // namespace

TEST_CASE("a hand-made byte-level BPE merges by rank, as derived by hand") {
  TempDir dir;
  const auto tokenizer = load_tokenizer(write(dir.path, tiny_tokenizer()).string());
  CHECK(tokenizer->kind() == "hf-bpe");
  CHECK(tokenizer->vocab_size() == 10);
  // "abc" -> (a,b) -> (ab,c) = abc; " ab" -> Ġ a b -> (a,b) -> (Ġ,ab) = Ġab.
  CHECK(encode(*tokenizer, "abc ab") == std::vector<int32_t>{5, 6});
  CHECK(encode(*tokenizer, "cab") == std::vector<int32_t>{2, 4});  // no (c,ab) merge
  CHECK(encode(*tokenizer, "ca") == std::vector<int32_t>{2, 0});   // "ca" is unreachable
  CHECK(encode(*tokenizer, "ab ab ab") == std::vector<int32_t>{4, 6, 6});
  CHECK(encode(*tokenizer, "").empty());
  // A byte without a token and no unk_token is dropped, and its neighbours then merge (as HF).
  CHECK(encode(*tokenizer, "axb") == std::vector<int32_t>{4});
  CHECK(tokenizer->decode(std::vector<int32_t>{5, 6, 7}) == "abc ab<|endoftext|>");
}

TEST_CASE("ignore_merges emits a word that is itself a token whole") {
  TempDir dir;
  json document = tiny_tokenizer();
  document["model"]["ignore_merges"] = true;
  const auto tokenizer = load_tokenizer(write(dir.path, document).string());
  CHECK(encode(*tokenizer, "ca") == std::vector<int32_t>{8});
  CHECK(encode(*tokenizer, "cab") == std::vector<int32_t>{2, 4});
}

TEST_CASE("merges written as \"a b\" strings read as pairs do") {
  TempDir dir;
  json document = tiny_tokenizer();
  document["model"]["merges"] = json::array({"a b", "ab c", "\xC4\xA0 ab"});
  const auto tokenizer = load_tokenizer(write(dir.path, document).string());
  CHECK(encode(*tokenizer, "abc ab") == std::vector<int32_t>{5, 6});
}

TEST_CASE("added tokens are split out of the raw text first, lstrip and rstrip take whitespace") {
  TempDir dir;
  const auto tokenizer = load_tokenizer(write(dir.path, tiny_tokenizer()).string());
  CHECK(encode(*tokenizer, "ab<|endoftext|>c") == std::vector<int32_t>{4, 7, 2});
  CHECK(encode(*tokenizer, "<|endoftext|><|endoftext|>") == std::vector<int32_t>{7, 7});
  CHECK(encode(*tokenizer, "a  <m>  b") == std::vector<int32_t>{0, 9, 1});
  CHECK(encode(*tokenizer, "<|endoftext") == std::vector<int32_t>{});  // '<', '|', ... no tokens
  CHECK(tokenizer->eod_id() == 7);                                     // <|endoftext|> by default
  CHECK(tokenizer->eod_token() == "<|endoftext|>");
}

TEST_CASE("the end-of-document token: --eod, tokenizer_config.json, or refused when missing") {
  TempDir dir;
  const fs::path path = write(dir.path, tiny_tokenizer(), "tokenizer.json");
  CHECK(load_tokenizer(path.string(), "<m>")->eod_id() == 9);
  CHECK(load_tokenizer(dir.path.string())->eod_id() == 7);  // a folder holding tokenizer.json
  std::ofstream(dir.path / "tokenizer_config.json") << R"({"eos_token": {"content": "<m>"}})";
  CHECK(load_tokenizer(path.string())->eod_id() == 9);
  CHECK_THROWS_WITH(load_tokenizer(path.string(), "</s>"),
                    Catch::Contains("'</s>' is not one of its tokens") && Catch::Contains("--eod"));
}

TEST_CASE("every field the loader does not implement is refused, naming file, field and value") {
  const auto refused = [](const std::function<void(json&)>& change) {
    json document = tiny_tokenizer();
    change(document);
    return refusal(document);
  };
  using Catch::Matchers::Contains;
  CHECK_THAT(refused([](json& d) { d["model"]["type"] = "WordPiece"; }),
             Contains("model.type is \"WordPiece\"") && Contains("supported: BPE"));
  CHECK_THAT(refused([](json& d) { d["model"]["byte_fallback"] = true; }),
             Contains("model.byte_fallback is true"));
  CHECK_THAT(refused([](json& d) { d["model"]["dropout"] = 0.1; }),
             Contains("model.dropout is 0.1"));
  CHECK_THAT(refused([](json& d) { d["model"]["continuing_subword_prefix"] = "##"; }),
             Contains("model.continuing_subword_prefix is \"##\""));
  CHECK_THAT(refused([](json& d) { d["model"]["end_of_word_suffix"] = "</w>"; }),
             Contains("model.end_of_word_suffix"));
  CHECK_THAT(refused([](json& d) { d["model"]["surprise"] = 1; }), Contains("model.surprise"));
  CHECK_THAT(refused([](json& d) {
               d["normalizer"] = {{"type", "NFKC"}};
             }),
             Contains("normalizer.type is \"NFKC\"") && Contains("NFC"));
  CHECK_THAT(refused([](json& d) {
               d["pre_tokenizer"] = {{"type", "Whitespace"}};
             }),
             Contains("pre_tokenizer.type is \"Whitespace\"") && Contains("ByteLevel"));
  CHECK_THAT(refused([](json& d) { d["pre_tokenizer"] = nullptr; }), Contains("pre_tokenizer"));
  const json split = {{"type", "Split"},
                      {"pattern", {{"Regex", "\\s+"}}},
                      {"behavior", "Removed"},
                      {"invert", false}};
  CHECK_THAT(
      refused([&](json& d) {
        d["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split, d["pre_tokenizer"]}}};
      }),
      Contains("pre_tokenizer.pretokenizers[0].behavior is \"Removed\""));
  CHECK_THAT(refused([&](json& d) {
               json inverted = split;
               inverted["behavior"] = "Isolated";
               inverted["invert"] = true;
               d["pre_tokenizer"] = {{"type", "Sequence"},
                                     {"pretokenizers", {inverted, d["pre_tokenizer"]}}};
             }),
             Contains("invert is true"));
  CHECK_THAT(
      refused([&](json& d) {
        json after = split;
        after["behavior"] = "Isolated";
        d["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {d["pre_tokenizer"], after}}};
      }),
      Contains("nothing after ByteLevel"));
  CHECK_THAT(
      refused([&](json& d) {
        json odd = split;
        odd["behavior"] = "Isolated";
        odd["pattern"] = {{"Regex", "[^\\S\\n]+"}};
        d["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {odd, d["pre_tokenizer"]}}};
      }),
      Contains("\\S inside a [...] class"));
  CHECK_THAT(refused([](json& d) { d["added_tokens"][1]["single_word"] = true; }),
             Contains("added_tokens[1].single_word is true"));
  CHECK_THAT(refused([](json& d) {
               d["truncation"] = {{"max_length", 512}};
             }),
             Contains("truncation is {\"max_length\":512}"));
  CHECK_THAT(refused([](json& d) {
               d["padding"] = {{"strategy", "BatchLongest"}};
             }),
             Contains("padding is"));
  CHECK_THAT(refused([](json& d) {
               d["model"]["merges"].push_back(json::array({"x", "a"}));
             }),
             Contains("model.merges[3]") && Contains("the token 'x' is not in model.vocab"));
  CHECK_THAT(refused([](json& d) {
               d["model"]["merges"].push_back(json::array({"b", "c"}));
             }),
             Contains("model.merges[3]") && Contains("the token 'bc' is not in model.vocab"));
}

TEST_CASE("files that are not tokenizers are refused with the path and the fix") {
  TempDir dir;
  CHECK_THROWS_WITH(load_tokenizer((dir.path / "missing.json").string()),
                    Catch::Contains("missing.json: no such file or folder"));
  CHECK_THROWS_WITH(load_tokenizer(dir.path.string()),
                    Catch::Contains("neither tokenizer.json nor tokenizer.model"));
  std::ofstream(dir.path / "broken.json") << "{\"model\": ";
  CHECK_THROWS_WITH(load_tokenizer((dir.path / "broken.json").string()),
                    Catch::Contains("broken.json: not JSON"));
  std::ofstream(dir.path / "junk.model") << "not a protobuf";
  CHECK_THROWS_WITH(load_tokenizer((dir.path / "junk.model").string()),
                    Catch::Contains("junk.model: not a SentencePiece model"));
}

TEST_CASE("text that is not UTF-8 is refused with its byte offset") {
  TempDir dir;
  const auto tokenizer = load_tokenizer(write(dir.path, tiny_tokenizer()).string());
  std::vector<int32_t> ids;
  CHECK_THROWS_WITH(tokenizer->encode("abc\xFF", ids),
                    Catch::Contains("not valid UTF-8 at byte 3"));
  CHECK_THROWS_WITH(tokenizer->encode("a\xED\xA0\x80", ids),  // a surrogate
                    Catch::Contains("at byte 1"));
  CHECK_THROWS_WITH(tokenizer->encode("\xC0\xAF", ids), Catch::Contains("at byte 0"));  // overlong
  CHECK_NOTHROW(tokenizer->encode("caf\xC3\xA9 \xF0\x9F\x98\x80", ids));
}

TEST_CASE("many threads on one tokenizer give what one thread gives, with two tokenizers mixed") {
  // Every byte a token, a few merges; GPT-2's pre-tokenizer regex over the bundled text.
  json document = tiny_tokenizer();
  json vocab = json::object();
  for (int byte = 0; byte < 256; ++byte)
    vocab[byte_token(byte)] = byte;
  const std::string space = byte_token(' ');
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {space, "th"}, {"e", "r"}, {space, "a"}, {"th", "e"},   {space + "a", "n"},
      {"a", "n"}, {"n", "d"},    {"o", "r"}, {space, "s"}, {space, "the"}};
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = static_cast<int>(vocab.size());
    merge_list.push_back(json::array({a, b}));
  }
  vocab["<|endoftext|>"] = static_cast<int>(vocab.size());
  document["model"]["vocab"] = vocab;
  document["model"]["merges"] = merge_list;
  document["added_tokens"] = {added_token(vocab["<|endoftext|>"], "<|endoftext|>", false)};
  TempDir dir;
  const auto first = load_tokenizer(write(dir.path, document, "first.json").string());
  document["model"]["ignore_merges"] = true;
  const auto second = load_tokenizer(write(dir.path, document, "second.json").string());

  const std::string text = trainctl::files::read_regular_file(
      std::string(TRAINCTL_SOURCE_DIR) + "/data/kjv.txt", 8 << 20, "text");
  std::vector<std::string_view> chunks;
  for (size_t at = 0; at < 400'000; at += 4'000)
    chunks.push_back(std::string_view(text).substr(at, 4'000 + at % 7));
  std::vector<std::vector<int32_t>> want_first(chunks.size());
  std::vector<std::vector<int32_t>> want_second(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    first->encode(chunks[i], want_first[i]);
    second->encode(chunks[i], want_second[i]);
  }
  REQUIRE(want_first[0].size() * 10 < chunks[0].size() * 9);  // the merges are used
  constexpr int kThreads = 8;
  std::vector<std::vector<std::vector<int32_t>>> got(
      kThreads, std::vector<std::vector<int32_t>>(2 * chunks.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < chunks.size(); ++k) {
        const size_t i = (k * 7 + static_cast<size_t>(t) * 13) % chunks.size();  // own order
        first->encode(chunks[i], got[t][2 * i]);
        second->encode(chunks[i], got[t][2 * i + 1]);
      }
    });
  for (std::thread& thread : threads)
    thread.join();
  for (int t = 0; t < kThreads; ++t)
    for (size_t i = 0; i < chunks.size(); ++i) {
      REQUIRE(got[t][2 * i] == want_first[i]);
      REQUIRE(got[t][2 * i + 1] == want_second[i]);
    }
}

TEST_CASE("sha256_file is the SHA-256 of the file's bytes") {
  TempDir dir;
  std::ofstream(dir.path / "abc") << "abc";
  CHECK(trainctl::tokenize::sha256_file((dir.path / "abc").string()) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK_THROWS_AS(trainctl::tokenize::sha256_file((dir.path / "none").string()), TokenizerError);
}
