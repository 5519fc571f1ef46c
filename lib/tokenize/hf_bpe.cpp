// The Hugging Face byte-level BPE pipeline (hf_bpe.hpp).
#include "tokenize/hf_bpe.hpp"

#include <algorithm>
#include <atomic>

#include <fmt/format.h>

#include "tokenize/unicode.hpp"
#include "tokenize/word_cache.hpp"

namespace trainctl::tokenize::detail {

// What one thread needs to encode with one tokenizer: match scratch per regex, the word cache,
// BPE buffers. Built on the thread's first encode() with that tokenizer.
struct HfBpeTokenizer::ThreadState {
  uint64_t owner = 0;
  std::vector<std::unique_ptr<RegexScratch>> regex;  // by step
  WordCache cache;
  BpeScratch bpe;
  std::vector<int32_t> word_ids;
};

namespace {

std::atomic<uint64_t> next_serial{1};

// A thread keeps the state of the few tokenizers it used last (most recent first): a tokenizer
// that is destroyed leaves at most this many stale states per thread behind.
constexpr size_t kStatesPerThread = 4;

}  // namespace

HfBpeTokenizer::HfBpeTokenizer(HfBpeParts parts, const std::string& eod)
    : parts_(std::move(parts)), serial_(next_serial.fetch_add(1)), eod_token_(eod) {
  eod_id_ = token_id(eod);
  if (eod_id_ < 0)
    throw TokenizerError(fmt::format(
        "{}: the end-of-document token '{}' is not one of its tokens; pass --eod with the text "
        "of one (e.g. its eos_token)",
        parts_.path, eod));
}

int32_t HfBpeTokenizer::token_id(std::string_view token) const {
  const auto it = parts_.token_ids.find(token);
  return it == parts_.token_ids.end() ? -1 : it->second;
}

HfBpeTokenizer::ThreadState& HfBpeTokenizer::thread_state() const {
  thread_local std::vector<std::unique_ptr<ThreadState>> states;
  for (size_t i = 0; i < states.size(); ++i)
    if (states[i]->owner == serial_) {
      if (i != 0) std::rotate(states.begin(), states.begin() + i, states.begin() + i + 1);
      return *states.front();
    }
  auto state = std::make_unique<ThreadState>();
  state->owner = serial_;
  for (size_t i = 0; i < parts_.steps.size(); ++i)
    state->regex.push_back(parts_.steps[i].regex ? std::make_unique<RegexScratch>() : nullptr);
  if (states.size() >= kStatesPerThread) states.pop_back();
  states.insert(states.begin(), std::move(state));
  return *states.front();
}

void HfBpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  check_utf8(text);
  ThreadState& state = thread_state();
  if (parts_.raw_tokens.empty()) return encode_text(text, state, out);
  parts_.raw_tokens.split(text, [&](int32_t id, size_t begin, size_t end) {
    if (id >= 0)
      out.push_back(id);
    else
      encode_text(text.substr(begin, end - begin), state, out);
  });
}

// One piece between raw added tokens: normalize, split out normalized added tokens, pre-tokenize.
void HfBpeTokenizer::encode_text(std::string_view text, ThreadState& state,
                                 std::vector<int32_t>& out) const {
  std::string normalized;
  if (parts_.nfc && nfc(text, normalized)) text = normalized;
  if (parts_.normalized_tokens.empty()) return pre_tokenize(text, 0, state, out);
  parts_.normalized_tokens.split(text, [&](int32_t id, size_t begin, size_t end) {
    if (id >= 0)
      out.push_back(id);
    else
      pre_tokenize(text.substr(begin, end - begin), 0, state, out);
  });
}

void HfBpeTokenizer::pre_tokenize(std::string_view piece, size_t step, ThreadState& state,
                                  std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (step == parts_.steps.size()) return encode_word(piece, state, out);
  const PreTokenizeStep& current = parts_.steps[step];
  if (current.prefix_space) {
    if (piece.front() == ' ') return pre_tokenize(piece, step + 1, state, out);
    std::string prefixed;  // own buffer: a later prefix step may run while this one is in use
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    return pre_tokenize(prefixed, step + 1, state, out);
  }
  // Split, behavior Isolated: each match is a piece, and so is the text between matches.
  RegexScratch& scratch = *state.regex[step];
  size_t gap = 0;
  size_t search = 0;
  size_t begin = 0;
  size_t end = 0;
  while (search < piece.size() && current.regex->find(piece, search, scratch, begin, end)) {
    if (end == begin) {  // an empty match splits nothing: look again one character on
      search = begin + utf8_length(static_cast<uint8_t>(piece[begin]));
      continue;
    }
    pre_tokenize(piece.substr(gap, begin - gap), step + 1, state, out);
    pre_tokenize(piece.substr(begin, end - begin), step + 1, state, out);
    gap = search = end;
  }
  pre_tokenize(piece.substr(gap), step + 1, state, out);
}

void HfBpeTokenizer::encode_word(std::string_view word, ThreadState& state,
                                 std::vector<int32_t>& out) const {
  const BpeModel& model = parts_.model;
  if (model.ignore_merges) {
    const auto it = model.vocab.find(word);
    if (it != model.vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const uint64_t hash = std::hash<std::string_view>{}(word);
  if (state.cache.find(word, hash, out)) return;
  state.word_ids.clear();
  model.merge_word(word, state.bpe, state.word_ids);
  state.cache.insert(word, hash, state.word_ids.data(), state.word_ids.size());
  out.insert(out.end(), state.word_ids.begin(), state.word_ids.end());
}

std::string HfBpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) {
    if (id < 0 || id >= parts_.vocab_size || !parts_.id_exists[id])
      throw TokenizerError(
          fmt::format("{}: cannot decode id {}: not a token of this tokenizer "
                      "(ids are below {})",
                      parts_.path, id, parts_.vocab_size));
    text += parts_.id_bytes[id];
  }
  return text;
}

}  // namespace trainctl::tokenize::detail
