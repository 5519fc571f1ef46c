// load_tokenizer and sha256_file (tokenize.hpp): which kind a path is, and which token ends a
// document.
#include <openssl/evp.h>
#include <unistd.h>

#include <array>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "files/files.hpp"
#include "tokenize/hf_bpe.hpp"
#include "tokenize/sentencepiece.hpp"
#include "tokenize/tokenize.hpp"

namespace trainctl::tokenize {
namespace {

namespace fs = std::filesystem;

// The end-of-document tokens tried, in order, when neither --eod nor tokenizer_config.json names
// one: GPT-2 and Qwen2, Llama 3, Llama 2 and most SentencePiece-derived files.
constexpr std::array<std::string_view, 3> kDefaultEod = {"<|endoftext|>", "<|end_of_text|>",
                                                         "</s>"};

// tokenizer_config.json's eos_token beside `tokenizer_json` ("" when there is none): a string or
// {"content": ...}.
std::string configured_eos(const fs::path& tokenizer_json) {
  const fs::path config = tokenizer_json.parent_path() / "tokenizer_config.json";
  std::error_code error;
  if (!fs::is_regular_file(config, error)) return {};
  std::string text;
  try {
    text = files::read_regular_file(config, uint64_t{64} << 20, "tokenizer config");
  } catch (const files::FileError& e) {
    throw TokenizerError(e.what());
  }
  const nlohmann::json root = nlohmann::json::parse(text, nullptr, false);
  if (root.is_discarded() || !root.is_object())
    throw TokenizerError(
        fmt::format("{}: not a JSON object; fix or remove it, or pass --eod", config.string()));
  const auto eos = root.find("eos_token");
  if (eos == root.end()) return {};
  if (eos->is_string()) return eos->get<std::string>();
  if (eos->is_object() && eos->contains("content") && (*eos)["content"].is_string())
    return (*eos)["content"].get<std::string>();
  return {};
}

std::unique_ptr<Tokenizer> load_hf(const std::string& path, std::string_view eod) {
  detail::HfBpeParts parts = detail::read_tokenizer_json(path);
  std::string chosen(eod);
  if (chosen.empty()) chosen = configured_eos(path);
  if (chosen.empty()) {
    for (const std::string_view candidate : kDefaultEod)
      if (parts.token_ids.count(candidate) != 0) {
        chosen = candidate;
        break;
      }
  }
  if (chosen.empty())
    throw TokenizerError(fmt::format(
        "{}: no end-of-document token: no tokenizer_config.json eos_token beside it and none of "
        "{} in it; pass --eod with the text of the token that ends a document",
        path, fmt::join(kDefaultEod, ", ")));
  return std::make_unique<detail::HfBpeTokenizer>(std::move(parts), chosen);
}

// A file's kind by its name, else by its first byte: JSON starts with '{'.
bool looks_like_json(const fs::path& file) {
  if (file.extension() == ".json") return true;
  if (file.extension() == ".model") return false;
  std::string head;
  try {
    files::UniqueFd fd = files::open_regular(file, "tokenizer");
    char byte = 0;
    while (::read(fd.get(), &byte, 1) == 1)
      if (byte != ' ' && byte != '\n' && byte != '\r' && byte != '\t') return byte == '{';
  } catch (const files::FileError& e) {
    throw TokenizerError(e.what());
  }
  return false;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, std::string_view eod) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status))
    throw TokenizerError(fmt::format(
        "{}: no such file or folder; the tokenizer is a tokenizer.json, a SentencePiece .model, "
        "or a folder holding tokenizer.json or tokenizer.model",
        path));
  fs::path file = path;
  if (fs::is_directory(status)) {
    if (fs::exists(file / "tokenizer.json", error))
      file /= "tokenizer.json";
    else if (fs::exists(file / "tokenizer.model", error))
      file /= "tokenizer.model";
    else
      throw TokenizerError(fmt::format(
          "{}: the folder holds neither tokenizer.json nor tokenizer.model; point at one of "
          "them (a Hugging Face model folder has tokenizer.json)",
          path));
  }
  if (looks_like_json(file)) return load_hf(file.string(), eod);
  return detail::load_sentencepiece(file.string(), std::string(eod));
}

std::string sha256_file(const std::string& path) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  &EVP_MD_CTX_free);
  if (!context || EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) != 1)
    throw TokenizerError("OpenSSL's SHA-256 is not available");
  try {
    files::UniqueFd fd = files::open_regular(path, "tokenizer");
    std::vector<char> buffer(size_t{1} << 20);
    for (;;) {
      const ssize_t got = ::read(fd.get(), buffer.data(), buffer.size());
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) files::throw_os_error("cannot read", path, errno);
      if (got == 0) break;
      EVP_DigestUpdate(context.get(), buffer.data(), static_cast<size_t>(got));
    }
  } catch (const files::FileError& e) {
    throw TokenizerError(e.what());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i)
    hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

}  // namespace trainctl::tokenize
