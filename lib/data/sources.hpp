// The concrete token sources: seeded synthetic tokens, byte-level text and llm.c token shards.
// See token_source.hpp for the contract they all keep.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/config.hpp"
#include "data/data_file.hpp"
#include "data/token_source.hpp"

namespace trainctl::data {

// Seeded, learnable synthetic tokens, computed on the fly (no memory, random access).
//
// The stream is cut into blocks of kBlockLength tokens. A block starts with a uniformly random
// token; every later token follows a fixed sparse bigram table: token t is followed by one of
// `branching` distinct successors of t, each with probability 1/branching. The table and the
// choices are pure functions of (seed, token, position), so the same seed always gives the same
// tokens and another seed gives others.
//
// Entropy: ln(branching) nats per token inside a block, ln(vocab) at a block start, so the best
// possible next-token loss is entropy_nats_per_token() (~1.39 nats for branching 4), far below the
// ln(vocab) of a model that has learnt nothing (5.55 nats for vocab 256): a training test can watch
// the loss fall towards that floor.
class SyntheticSource final : public TokenSource {
 public:
  static constexpr int64_t kBlockLength = 1024;
  static constexpr int32_t kDefaultBranching = data::kDefaultBranching;

  // Throws DataError unless vocab >= 2, 1 <= branching <= vocab and num_tokens >= 1.
  SyntheticSource(uint64_t seed, int32_t vocab, int64_t num_tokens,
                  int32_t branching = kDefaultBranching);

  int64_t size() const override { return num_tokens_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override;
  int32_t vocab_hint() const override { return vocab_; }
  bool ids_below_hint() const override { return true; }
  std::string describe() const override;

  // The mean entropy of the stream in nats per token: the floor of the next-token loss,
  // ((kBlockLength - 1) * ln(branching) + ln(vocab)) / kBlockLength.
  double entropy_nats_per_token() const;

  // The k-th successor (k in [0, branching)) of `token` in the bigram table; for tests.
  int32_t successor(int32_t token, int32_t k) const;

 private:
  int32_t block_start_token(int64_t block) const;
  int32_t next_token(int32_t previous, int64_t position) const;

  uint64_t seed_;
  int32_t vocab_;
  int64_t num_tokens_;
  int32_t branching_;
};

// A text file read byte by byte: each byte is one token (vocab 256). The file is read with pread
// and checked for changes on every read (data_file.hpp).
// Throws DataError when the file is missing, unreadable or empty.
class TextSource final : public TokenSource {
 public:
  explicit TextSource(const std::string& path);

  int64_t size() const override { return static_cast<int64_t>(file_.size()); }
  void read(int64_t offset, int64_t count, int32_t* out) const override;
  int32_t vocab_hint() const override { return 256; }
  bool ids_below_hint() const override { return true; }
  std::string describe() const override;
  std::string where(int64_t offset) const override;  // "data/kjv.txt, byte 12"
  std::vector<SourceFile> files() const override { return {{file_.path(), file_.size()}}; }

 private:
  detail::DataFile file_;
};

// llm.c token shards (the .bin files of llm.c's dev/data scripts), concatenated in the given order.
// Layout of one shard: a header of 256 little-endian int32 (header[0] = 20240520 magic,
// header[1] = version, header[2] = number of tokens), then that many tokens: uint16 in version 1
// (GPT-2 tokens, vocab_hint() 50257), uint32 in version 2 (Llama 3 tokens, vocab_hint() 128256).
// All shards of one source have the same version.
// Each shard is checked on open (and for changes on every read, data_file.hpp): magic, version, a
// token count > 0 and a file length of exactly 1024 + 2 (or 4) * tokens bytes; any mismatch is a
// DataError naming the file.
class LlmcShardSource final : public TokenSource {
 public:
  static constexpr int32_t kMagic = 20240520;
  static constexpr int32_t kVersion = 1;   // uint16 tokens
  static constexpr int32_t kVersion2 = 2;  // uint32 tokens
  static constexpr int64_t kHeaderInts = 256;
  static constexpr int64_t kHeaderBytes = kHeaderInts * 4;
  static constexpr int32_t kGpt2Vocab = 50257;
  static constexpr int32_t kLlama3Vocab = 128256;

  explicit LlmcShardSource(const std::vector<std::string>& paths);

  int64_t size() const override { return total_tokens_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override;
  int32_t vocab_hint() const override { return version_ == kVersion ? kGpt2Vocab : kLlama3Vocab; }
  std::string describe() const override;
  std::string where(int64_t offset) const override;  // the shard file and the token in it
  std::vector<SourceFile> files() const override;

  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  int32_t version() const { return version_; }

 private:
  size_t shard_of(int64_t offset) const;  // the shard holding token `offset` (in range)

  std::vector<detail::DataFile> shards_;
  std::vector<int64_t> first_token_;  // first_token_[i]: global index of shard i's first token
  int64_t total_tokens_ = 0;
  int32_t version_ = kVersion;
};

// Expands a glob pattern (e.g. "data/fineweb_train_*.bin") into the sorted list of matching
// paths; a pattern without wildcards names one file. Throws DataError when nothing matches.
std::vector<std::string> expand_shard_pattern(const std::string& pattern);

}  // namespace trainctl::data
