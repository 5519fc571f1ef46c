#include "data/indexed_dataset.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace trainctl::data {

static_assert(std::endian::native == std::endian::little,
              "indexed datasets are little-endian; reading them on a big-endian host needs swaps");

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;
constexpr uint64_t kVersion = 1;
constexpr std::string_view kSidecarFormat = "trainctl-indexed-dataset";
constexpr uint64_t kMaxSidecarBytes = uint64_t{64} << 20;

int64_t item_bytes_of(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::uint8:
    case IndexedDType::int8:
      return 1;
    case IndexedDType::int16:
    case IndexedDType::uint16:
      return 2;
    case IndexedDType::int32:
    case IndexedDType::float32:
      return 4;
    case IndexedDType::int64:
    case IndexedDType::float64:
      return 8;
  }
  return 0;
}

// The largest token id a dtype holds; 0 for the types that hold no ids (signed bytes, int64,
// floats). The one place the writer's range check, the reader's refusal and vocab_hint read.
int64_t largest_id(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::uint8:
      return 255;
    case IndexedDType::int16:
      return 32767;
    case IndexedDType::uint16:
      return 65535;
    case IndexedDType::int32:
      return std::numeric_limits<int32_t>::max();
    default:
      return 0;
  }
}

bool holds_token_ids(IndexedDType dtype) {
  return largest_id(dtype) > 0;
}

template <typename T>
std::vector<T> read_array(const detail::DataFile& file, uint64_t offset, int64_t count) {
  std::vector<T> out(static_cast<size_t>(count));
  if (count > 0) file.read(offset, out.size() * sizeof(T), out.data());
  return out;
}

}  // namespace

IndexedDType indexed_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::uint16 : IndexedDType::int32;
}

std::string_view indexed_dtype_name(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::uint8:
      return "uint8";
    case IndexedDType::int8:
      return "int8";
    case IndexedDType::int16:
      return "int16";
    case IndexedDType::int32:
      return "int32";
    case IndexedDType::int64:
      return "int64";
    case IndexedDType::float64:
      return "float64";
    case IndexedDType::float32:
      return "float32";
    case IndexedDType::uint16:
      return "uint16";
  }
  return "unknown";
}

// ---- sidecar ------------------------------------------------------------------------------------

std::string IndexedSidecar::to_json() const {
  nlohmann::ordered_json j = {{"format", kSidecarFormat},
                              {"version", 1},
                              {"tokenizer",
                               {{"path", tokenizer.path},
                                {"sha256", tokenizer.sha256},
                                {"kind", tokenizer.kind},
                                {"vocab_size", tokenizer.vocab_size},
                                {"eod_id", tokenizer.eod_id},
                                {"eod_token", tokenizer.eod_token}}},
                              {"documents", documents},
                              {"tokens", tokens},
                              {"inputs", inputs}};
  return j.dump(2) + "\n";
}

std::optional<IndexedSidecar> IndexedSidecar::parse(const std::string& text,
                                                    const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("format") || j["format"] != kSidecarFormat) return std::nullopt;
  IndexedSidecar s;
  try {
    const nlohmann::json& t = j.at("tokenizer");
    s.tokenizer.path = t.at("path").get<std::string>();
    s.tokenizer.sha256 = t.at("sha256").get<std::string>();
    s.tokenizer.kind = t.at("kind").get<std::string>();
    s.tokenizer.vocab_size = t.at("vocab_size").get<int32_t>();
    s.tokenizer.eod_id = t.at("eod_id").get<int32_t>();
    s.tokenizer.eod_token = t.at("eod_token").get<std::string>();
    s.documents = j.at("documents").get<int64_t>();
    s.tokens = j.at("tokens").get<int64_t>();
    s.inputs = j.at("inputs").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format(
        "{}: unreadable dataset sidecar ({}); recreate the dataset with trainctl data prepare or "
        "remove the sidecar",
        path, e.what()));
  }
  if (s.tokenizer.vocab_size < 1 || s.tokenizer.eod_id < 0 ||
      s.tokenizer.eod_id >= s.tokenizer.vocab_size)
    throw DataError(fmt::format(
        "{}: the sidecar's tokenizer has vocab_size {} and eod_id {}; both must be set, with the "
        "eod id below the vocabulary: recreate the dataset with trainctl data prepare",
        path, s.tokenizer.vocab_size, s.tokenizer.eod_id));
  return s;
}

// ---- reader -------------------------------------------------------------------------------------

IndexedSource::IndexedSource(const std::string& path)
    : prefix_(indexed_prefix(path)), bin_(prefix_ + ".bin") {
  const std::string idx_path = prefix_ + ".idx";
  const detail::DataFile idx(idx_path);
  const auto idx_bytes = static_cast<int64_t>(idx.size());
  idx_bytes_ = idx.size();
  auto refuse = [&](const std::string& what) {
    throw DataError(
        fmt::format("{}: {}; recreate the dataset (trainctl data prepare, or "
                    "Megatron's tools/preprocess_data.py)",
                    idx_path, what));
  };
  if (idx_bytes < kHeaderBytes)
    refuse(fmt::format("not a Megatron index: {} bytes is shorter than the {}-byte header",
                       idx_bytes, kHeaderBytes));
  unsigned char header[kHeaderBytes];
  idx.read(0, sizeof(header), header);
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0)
    refuse(
        "not a Megatron index: it does not start with MMIDIDX (a .bin/.idx pair of another "
        "format, such as fairseq's cached datasets, cannot be read)");
  uint64_t version = 0, sequences = 0, documents = 0;
  std::memcpy(&version, header + 9, 8);
  const uint8_t code = header[17];
  std::memcpy(&sequences, header + 18, 8);
  std::memcpy(&documents, header + 26, 8);
  if (version != kVersion) refuse(fmt::format("index version {} (only version 1 exists)", version));
  if (code < 1 || code > 8) refuse(fmt::format("unknown dtype code {}", code));
  dtype_ = static_cast<IndexedDType>(code);
  if (!holds_token_ids(dtype_))
    refuse(
        fmt::format("its dtype is {}, which does not hold token ids (uint8, int16, uint16 "
                    "or int32 do)",
                    indexed_dtype_name(dtype_)));
  item_bytes_ = item_bytes_of(dtype_);
  // Counts from disk are bounded by the file's length before anything is allocated.
  const auto max_count = static_cast<uint64_t>(idx_bytes);
  if (sequences > max_count || documents > max_count)
    refuse(
        fmt::format("its header counts {} sequences and {} documents, more than a {}-byte "
                    "index can list",
                    sequences, documents, idx_bytes));
  const auto S = static_cast<int64_t>(sequences);
  const auto D = static_cast<int64_t>(documents);
  const int64_t expected = kHeaderBytes + 12 * S + 8 * D;
  if (idx_bytes != expected && idx_bytes != expected + S)  // + S: a multimodal index's modes
    refuse(
        fmt::format("its header counts {} sequences and {} documents, which take {} bytes, "
                    "but the file has {} (truncated or from another dataset)",
                    S, D, expected, idx_bytes));
  const std::vector<int32_t> sizes = read_array<int32_t>(idx, kHeaderBytes, S);
  pointers_ = read_array<int64_t>(idx, static_cast<uint64_t>(kHeaderBytes + 4 * S), S);
  document_starts_ = read_array<int64_t>(idx, static_cast<uint64_t>(kHeaderBytes + 12 * S), D);

  // The sizes and pointers must describe .bin exactly: sequence after sequence, no gaps.
  int64_t offset = 0;
  for (int64_t i = 0; i < S; ++i) {
    const auto k = static_cast<size_t>(i);
    if (sizes[k] < 0) refuse(fmt::format("sequence {} has a negative size {}", i, sizes[k]));
    if (pointers_[k] != offset)
      refuse(
          fmt::format("sequence {} starts at byte {} of {}.bin, but the sequences before it "
                      "end at byte {} (trainctl reads the sequences as one stream, as they lie "
                      "in .bin)",
                      i, pointers_[k], prefix_, offset));
    offset += int64_t{sizes[k]} * item_bytes_;
  }
  if (offset != static_cast<int64_t>(bin_.size()))
    refuse(
        fmt::format("its {} sequences hold {} bytes of {} tokens, but {}.bin has {} bytes "
                    "(the pair does not belong together, or one of them is truncated)",
                    S, offset, indexed_dtype_name(dtype_), prefix_, bin_.size()));
  num_tokens_ = offset / item_bytes_;
  if (D < 2 || document_starts_.front() != 0 || document_starts_.back() != S)
    refuse(fmt::format(
        "its document index must run from 0 to the sequence count {} with at "
        "least one document, but it has {} entries{}",
        S, D,
        D > 0 ? fmt::format(" from {} to {}", document_starts_.front(), document_starts_.back())
              : std::string()));
  for (int64_t d = 1; d < D; ++d)
    if (document_starts_[static_cast<size_t>(d)] < document_starts_[static_cast<size_t>(d - 1)])
      refuse(fmt::format("document {} starts at sequence {}, before document {} ({})", d,
                         document_starts_[static_cast<size_t>(d)], d - 1,
                         document_starts_[static_cast<size_t>(d - 1)]));
  if (num_tokens_ < 1)
    throw DataError(
        fmt::format("{}.bin: the dataset holds no tokens; prepare it from non-empty "
                    "documents",
                    prefix_));

  const std::string sidecar_path = prefix_ + ".json";
  std::error_code ec;
  // Sidecars are small; a large PREFIX.json is some other file (a corpus), not read.
  if (fs::is_regular_file(sidecar_path, ec) &&
      fs::file_size(sidecar_path, ec) <= kMaxSidecarBytes) {
    std::string text;
    try {
      text = files::read_regular_file(sidecar_path, kMaxSidecarBytes, "dataset sidecar");
    } catch (const files::FileError& e) {
      throw DataError(e.what());
    }
    std::optional<IndexedSidecar> sidecar = IndexedSidecar::parse(text, sidecar_path);
    if (sidecar && (sidecar->documents != num_documents() || sidecar->tokens != num_tokens_))
      throw DataError(fmt::format(
          "{}: the sidecar describes {} documents and {} tokens, but {} holds {} documents and {} "
          "tokens: it belongs to another dataset; remove it or prepare the dataset again",
          sidecar_path, sidecar->documents, sidecar->tokens, prefix_, num_documents(),
          num_tokens_));
    sidecar_ = std::move(sidecar);
  }
}

void IndexedSource::read(int64_t offset, int64_t count, int32_t* out) const {
  check_range(offset, count);
  const auto at = static_cast<uint64_t>(offset * item_bytes_);
  switch (dtype_) {
    case IndexedDType::uint8:
      bin_.read_ids<uint8_t>(at, count, out);
      return;
    case IndexedDType::int16:
      bin_.read_ids<int16_t>(at, count, out);
      return;
    case IndexedDType::uint16:
      bin_.read_ids<uint16_t>(at, count, out);
      return;
    case IndexedDType::int32:
      bin_.read_ids<int32_t>(at, count, out);
      return;
    default:
      break;
  }
  throw DataError(
      fmt::format("{}.bin: dtype {} holds no token ids", prefix_, indexed_dtype_name(dtype_)));
}

int32_t IndexedSource::vocab_hint() const {
  if (sidecar_) return sidecar_->tokenizer.vocab_size;
  const int64_t largest = largest_id(dtype_);
  return static_cast<int32_t>(std::min<int64_t>(largest + 1, std::numeric_limits<int32_t>::max()));
}

int64_t IndexedSource::document_offset(int64_t doc) const {
  const int64_t sequence = document_starts_.at(static_cast<size_t>(doc));
  if (sequence >= num_sequences()) return num_tokens_;
  return pointers_[static_cast<size_t>(sequence)] / item_bytes_;
}

std::string IndexedSource::where(int64_t offset) const {
  if (offset < 0 || offset >= num_tokens_) return TokenSource::where(offset);
  // The last document whose first token is <= offset (empty documents share a start).
  int64_t low = 0, high = num_documents() - 1;
  while (low < high) {
    const int64_t mid = (low + high + 1) / 2;
    if (document_offset(mid) <= offset)
      low = mid;
    else
      high = mid - 1;
  }
  return fmt::format("{}.bin, document {}, token {}", prefix_, low, offset - document_offset(low));
}

const TokenizerInfo* IndexedSource::tokenizer() const {
  return sidecar_ ? &sidecar_->tokenizer : nullptr;
}

std::vector<SourceFile> IndexedSource::files() const {
  return {{bin_.path(), bin_.size()}, {prefix_ + ".idx", idx_bytes_}};
}

std::string IndexedSource::describe() const {
  return fmt::format("indexed dataset {} ({} documents, {} {} tokens{})", prefix_, num_documents(),
                     num_tokens_, indexed_dtype_name(dtype_),
                     sidecar_ ? fmt::format(", tokenizer {}", sidecar_->tokenizer.path) : "");
}

// ---- writer -------------------------------------------------------------------------------------

namespace {

std::string temporary_name(const std::string& path) {
  return fmt::format("{}.tmp-{}", path, ::getpid());
}

void sync_file(int fd, const std::string& path) {
  if (::fsync(fd) != 0) files::throw_os_error("fsync", path, errno);
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, IndexedDType dtype)
    : prefix_(std::move(prefix)),
      dtype_(dtype),
      item_bytes_(item_bytes_of(dtype)),
      bin_tmp_(temporary_name(prefix_ + ".bin")),
      idx_tmp_(temporary_name(prefix_ + ".idx")) {
  if (!holds_token_ids(dtype_))
    throw DataError(fmt::format("{}: an indexed dataset of tokens cannot use dtype {}", prefix_,
                                indexed_dtype_name(dtype_)));
  bin_fd_ = files::create_regular(bin_tmp_, "dataset");
  buffer_.reserve(size_t{1} << 20);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (finished_) return;
  bin_fd_ = files::UniqueFd();
  ::unlink(bin_tmp_.c_str());
  ::unlink(idx_tmp_.c_str());
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw DataError(
        fmt::format("{}: a document of {} tokens does not fit the index's int32 "
                    "sizes; split it",
                    prefix_, tokens.size()));
  const int64_t high = largest_id(dtype_);
  const size_t at = buffer_.size();
  buffer_.resize(at + tokens.size() * static_cast<size_t>(item_bytes_));
  unsigned char* out = buffer_.data() + at;
  for (const int32_t id : tokens) {
    if (id < 0 || id > high)
      throw DataError(fmt::format("{}: token id {} does not fit the dataset's dtype {}", prefix_,
                                  id, indexed_dtype_name(dtype_)));
    switch (item_bytes_) {
      case 1:
        *out = static_cast<uint8_t>(id);
        break;
      case 2: {
        const auto v = static_cast<uint16_t>(id);
        std::memcpy(out, &v, 2);
        break;
      }
      default:
        std::memcpy(out, &id, 4);
    }
    out += item_bytes_;
  }
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
  if (buffer_.size() >= (size_t{1} << 20)) flush();
}

void IndexedDatasetWriter::flush() {
  files::write_all(bin_fd_.get(), bin_tmp_, buffer_.data(), buffer_.size());
  buffer_.clear();
}

void IndexedDatasetWriter::finish() {
  flush();
  sync_file(bin_fd_.get(), bin_tmp_);
  bin_fd_ = files::UniqueFd();

  const auto S = static_cast<uint64_t>(sizes_.size());
  std::string index(kMagic, sizeof(kMagic));
  auto put = [&index](const void* data, size_t bytes) {
    index.append(static_cast<const char*>(data), bytes);
  };
  put(&kVersion, 8);
  const auto code = static_cast<uint8_t>(dtype_);
  put(&code, 1);
  const uint64_t D = S + 1;
  put(&S, 8);
  put(&D, 8);
  put(sizes_.data(), sizes_.size() * 4);
  int64_t pointer = 0;
  for (const int32_t size : sizes_) {
    put(&pointer, 8);
    pointer += int64_t{size} * item_bytes_;
  }
  for (int64_t d = 0; d <= static_cast<int64_t>(S); ++d)
    put(&d, 8);
  {
    files::UniqueFd fd = files::create_regular(idx_tmp_, "dataset index");
    files::write_all(fd.get(), idx_tmp_, index.data(), index.size());
    sync_file(fd.get(), idx_tmp_);
  }
  const std::string bin = prefix_ + ".bin", idx = prefix_ + ".idx";
  if (::rename(bin_tmp_.c_str(), bin.c_str()) != 0) files::throw_os_error("rename", bin, errno);
  if (::rename(idx_tmp_.c_str(), idx.c_str()) != 0) files::throw_os_error("rename", idx, errno);
  const fs::path parent = fs::path(bin).parent_path();
  files::fsync_directory(parent.empty() ? fs::path(".") : parent);
  finished_ = true;
}

}  // namespace trainctl::data
