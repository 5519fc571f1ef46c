// SentencePiece models (sentencepiece.hpp). The processor is immutable after Load and its
// Encode is const, so one instance serves every thread.
#include "tokenize/sentencepiece.hpp"

#include <sentencepiece_processor.h>

#include <fmt/format.h>

#include "tokenize/unicode.hpp"

namespace trainctl::tokenize::detail {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string path, const std::string& eod) : path_(std::move(path)) {
    const auto status = processor_.Load(path_);
    if (!status.ok())
      throw TokenizerError(
          fmt::format("{}: not a SentencePiece model that libsentencepiece {} "
                      "can load: {}",
                      path_, "0.1.97", status.ToString()));
    if (eod.empty()) {
      eod_id_ = processor_.eos_id();
      if (eod_id_ < 0 || eod_id_ >= processor_.GetPieceSize())
        throw TokenizerError(fmt::format(
            "{}: the model has no end-of-sentence piece (eos_id is -1); pass --eod with the "
            "piece that ends a document",
            path_));
      eod_token_ = processor_.IdToPiece(eod_id_);
    } else {
      eod_id_ = processor_.PieceToId(eod);
      if (processor_.IdToPiece(eod_id_) != eod)
        throw TokenizerError(fmt::format(
            "{}: the end-of-document token '{}' is not a piece of this model; pass --eod with "
            "one of its pieces (its eos piece is '{}')",
            path_, eod,
            processor_.eos_id() >= 0 ? processor_.IdToPiece(processor_.eos_id()) : "none"));
      eod_token_ = eod;
    }
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    check_utf8(text);
    // Encode(text, &ids) builds a fresh SentencePieceText (a protobuf message per piece) on every
    // call and throws it away: a third of the time went to malloc. One kept per thread is
    // cleared, not freed, so its messages and strings are reused.
    thread_local sentencepiece::ImmutableSentencePieceText pieces;
    const auto status = processor_.Encode(text, pieces.mutable_proto());
    if (!status.ok())
      throw TokenizerError(
          fmt::format("{}: SentencePiece could not encode the text: {}", path_, status.ToString()));
    const size_t count = pieces.pieces_size();
    for (size_t i = 0; i < count; ++i)
      out.push_back(static_cast<int32_t>(pieces.pieces(static_cast<int>(i)).id()));
  }

  int32_t vocab_size() const override { return processor_.GetPieceSize(); }
  int32_t eod_id() const override { return eod_id_; }
  std::string eod_token() const override { return eod_token_; }
  std::string_view kind() const override { return "sentencepiece"; }
  const std::string& path() const override { return path_; }

  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> pieces;
    for (const int32_t id : ids) {
      if (id < 0 || id >= processor_.GetPieceSize())
        throw TokenizerError(fmt::format("{}: cannot decode id {}: ids are below {}", path_, id,
                                         processor_.GetPieceSize()));
      pieces.push_back(id);
    }
    std::string text;
    const auto status = processor_.Decode(pieces, &text);
    if (!status.ok())
      throw TokenizerError(
          fmt::format("{}: SentencePiece could not decode: {}", path_, status.ToString()));
    return text;
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor processor_;
  int32_t eod_id_ = -1;
  std::string eod_token_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, const std::string& eod) {
  return std::make_unique<SentencePieceTokenizer>(path, eod);
}

}  // namespace trainctl::tokenize::detail
