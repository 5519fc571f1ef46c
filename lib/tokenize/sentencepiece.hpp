// Internal to lib/tokenize: SentencePiece models through Debian's libsentencepiece.
#pragma once

#include <memory>
#include <string>

#include "tokenize/tokenize.hpp"

namespace trainctl::tokenize::detail {

// Loads a .model file. `eod` empty: the model's eos piece (refused when it has none).
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, const std::string& eod);

}  // namespace trainctl::tokenize::detail
