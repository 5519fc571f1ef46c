// lib/tokenize: text to token ids, with the tokenizers users bring, token for token as their own
// libraries produce them (tests/integration/cli_tokenize.py proves it against the PyPI packages).
//
//   load_tokenizer(path) --> Tokenizer: encode(text, ids) from any number of threads at once
//
// Two kinds:
//   - "hf-bpe": a Hugging Face tokenizer.json of the byte-level BPE family (GPT-2, Llama 3,
//     Qwen2). encode() equals Python's `Tokenizer.encode(text, add_special_tokens=False).ids`:
//     added tokens are split out of the raw text first (longest match), the rest is normalized
//     (none or NFC), pre-tokenized (ByteLevel's GPT-2 regex, or Split regexes then ByteLevel) and
//     merged by BPE. Whatever the file asks for that this code does not implement (another model,
//     normalizer or pre-tokenizer, byte_fallback, dropout, subword prefixes, truncation, ...) is
//     refused at load with a TokenizerError naming the file, the field, the value and what is
//     supported: never silently ignored, because ids that differ from the tokenizer's own would
//     train a model no one can use. The post-processor and the decoder are not read: encode adds
//     no template tokens, and decode() is the plain byte concatenation.
//   - "sentencepiece": a SentencePiece .model through Debian's libsentencepiece; encode() equals
//     Python's `SentencePieceProcessor.encode(text)` (no BOS/EOS).
//
// Text must be valid UTF-8 (as a Python str always is): encode() refuses anything else with a
// TokenizerError giving the byte offset, so a corrupt corpus is found, not tokenized as noise.
//
// Depends on nlohmann_json, PCRE2 (the pre-tokenizer regexes, JIT-compiled), ICU (NFC),
// libsentencepiece, OpenSSL (sha256_file) and lib/files.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace trainctl::tokenize {

// Every problem with a tokenizer file or with text to encode. The message names the file, the
// field and value that were wrong, and what would work.
class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` to `out`: no BOS/EOS and no template. Const and safe to call from
  // many threads at once on one Tokenizer; each thread keeps its own scratch state and word cache
  // (thread-local, keyed by this tokenizer), so throughput scales with threads. Throws
  // TokenizerError for text that is not valid UTF-8 (`out` may then hold a part of the ids).
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;

  // Every id encode() returns is below this. hf-bpe: the largest id of the vocabulary and the
  // added tokens, plus one; sentencepiece: the number of pieces.
  virtual int32_t vocab_size() const = 0;

  // The end-of-document token appended after each document (chosen at load, see load_tokenizer).
  virtual int32_t eod_id() const = 0;
  virtual std::string eod_token() const = 0;

  // "hf-bpe" or "sentencepiece".
  virtual std::string_view kind() const = 0;

  // The file the tokenizer was read from (tokenizer.json or the .model).
  virtual const std::string& path() const = 0;

  // The text of `ids` (for tests and debugging): hf-bpe concatenates each token's bytes (added
  // tokens as their text), sentencepiece is DecodeIds. Throws TokenizerError for an id outside
  // [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
};

// Loads a tokenizer. `path` is a tokenizer.json, a .model file, or a folder holding
// tokenizer.json (preferred) or tokenizer.model.
// `eod` is the end-of-document token's text. Empty: for hf-bpe, tokenizer_config.json's
// eos_token beside the file when there is one, else the first of <|endoftext|>, <|end_of_text|>,
// </s> that the tokenizer has; for sentencepiece, the model's eos piece. A token that does not
// exist (or no default) is a TokenizerError that names the candidates and --eod.
// Throws TokenizerError (also for unreadable files: the message names the file).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, std::string_view eod = {});

// The SHA-256 of a file's bytes as 64 lowercase hex digits (the data sidecar records the
// tokenizer's). Throws TokenizerError naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace trainctl::tokenize
