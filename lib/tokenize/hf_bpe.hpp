// Internal to lib/tokenize: the Hugging Face byte-level BPE tokenizer (tokenizer.json).
//
//   text --added tokens (raw)--> pieces --NFC--> --added tokens (normalized)--> --pre-tokenizer
//   steps (prefix space, regex splits)--> words --BPE (word cache)--> ids
//
// read_tokenizer_json parses and checks the file (every refusal lives there); HfBpeTokenizer runs
// the pipeline above, exactly in HF's order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenize/added_tokens.hpp"
#include "tokenize/bpe.hpp"
#include "tokenize/regex.hpp"
#include "tokenize/tokenize.hpp"

namespace trainctl::tokenize::detail {

// One pre-tokenizer step, applied to each piece the previous steps produced.
struct PreTokenizeStep {
  // ByteLevel's add_prefix_space: a piece that does not start with ' ' gets one.
  bool prefix_space = false;
  // Otherwise a Split (behavior Isolated): matches and the text between them become pieces.
  std::unique_ptr<Regex> regex;
};

// Everything tokenizer.json says that encoding needs, checked.
struct HfBpeParts {
  std::string path;
  BpeModel model;
  AddedTokenMatcher raw_tokens;         // added tokens with normalized: false
  AddedTokenMatcher normalized_tokens;  // the others, matched after normalization
  bool nfc = false;
  std::vector<PreTokenizeStep> steps;
  std::vector<std::string> id_bytes;  // decode: each id's bytes (added tokens: their text)
  std::vector<bool> id_exists;
  TokenMap token_ids;  // added tokens' contents and the vocabulary as the file spells them
  int32_t vocab_size = 0;
};

// Reads and checks a tokenizer.json. Throws TokenizerError naming the file, the field, the value
// and what is supported, for anything it does not implement.
HfBpeParts read_tokenizer_json(const std::string& path);

class HfBpeTokenizer final : public Tokenizer {
 public:
  // `eod`: the end-of-document token's text, which must be one of the tokenizer's tokens.
  HfBpeTokenizer(HfBpeParts parts, const std::string& eod);

  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  int32_t vocab_size() const override { return parts_.vocab_size; }
  int32_t eod_id() const override { return eod_id_; }
  std::string eod_token() const override { return eod_token_; }
  std::string_view kind() const override { return "hf-bpe"; }
  const std::string& path() const override { return parts_.path; }
  std::string decode(std::span<const int32_t> ids) const override;

  // The id of a token as the file spells it (added token content or vocabulary key), or -1.
  int32_t token_id(std::string_view token) const;

 private:
  struct ThreadState;
  ThreadState& thread_state() const;
  void encode_text(std::string_view text, ThreadState& state, std::vector<int32_t>& out) const;
  void pre_tokenize(std::string_view piece, size_t step, ThreadState& state,
                    std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, ThreadState& state, std::vector<int32_t>& out) const;

  HfBpeParts parts_;
  uint64_t serial_;  // this tokenizer's key for per-thread state (never reused, unlike `this`)
  int32_t eod_id_ = -1;
  std::string eod_token_;
};

}  // namespace trainctl::tokenize::detail
