#include "prepare/prepare.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "files/files.hpp"
#include "tokenize/tokenize.hpp"

namespace trainctl::prepare {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A batch: what one worker tokenizes at a time. About a megabyte keeps every worker busy without
// holding much in flight.
constexpr size_t kBatchBytes = size_t{1} << 20;
constexpr size_t kBatchRecords = 4096;

struct Batch {
  int64_t index = 0;
  std::vector<Record> records;
  // Filled by the worker:
  std::vector<int32_t> ids;      // every document's ids, eod included, back to back
  std::vector<int64_t> lengths;  // tokens per document; 0 for an empty document (skipped)
  uint64_t text_bytes = 0;
};

// Work handed out in order, results collected for the writer in order.
class Pipeline {
 public:
  explicit Pipeline(size_t max_in_flight) : max_in_flight_(max_in_flight) {}

  // Whether the reader should write finished batches before pushing another.
  bool full() {
    std::lock_guard lock(mutex_);
    return in_flight_ >= max_in_flight_;
  }
  // Reader: hands a batch to the workers.
  void push(Batch batch) {
    std::lock_guard lock(mutex_);
    ++in_flight_;
    pending_.push_back(std::move(batch));
    work_.notify_one();
  }
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    work_.notify_all();
  }
  // Worker: the next batch, or nothing when closed and drained or failed.
  std::optional<Batch> take() {
    std::unique_lock lock(mutex_);
    work_.wait(lock, [&] { return !pending_.empty() || closed_ || failed_; });
    if (failed_ || pending_.empty()) return std::nullopt;
    Batch batch = std::move(pending_.front());
    pending_.pop_front();
    return batch;
  }
  void done(Batch batch) {
    std::lock_guard lock(mutex_);
    done_.emplace(batch.index, std::move(batch));
    ready_.notify_all();
  }
  void fail(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (!failed_) error_ = error;
    failed_ = true;
    work_.notify_all();
    ready_.notify_all();
  }
  // Writer: batch `index` once it is done (waits when `wait`), or nothing (also after a failure).
  std::optional<Batch> finished(int64_t index, bool wait) {
    std::unique_lock lock(mutex_);
    if (wait) ready_.wait(lock, [&] { return done_.contains(index) || failed_; });
    auto it = done_.find(index);
    if (failed_ || it == done_.end()) return std::nullopt;
    Batch batch = std::move(it->second);
    done_.erase(it);
    --in_flight_;
    return batch;
  }
  void rethrow() {
    std::lock_guard lock(mutex_);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::condition_variable work_, ready_;
  std::deque<Batch> pending_;
  std::map<int64_t, Batch> done_;
  size_t in_flight_ = 0;
  size_t max_in_flight_;
  bool closed_ = false;
  bool failed_ = false;
  std::exception_ptr error_;
};

// Where a record came from, for messages: "a.jsonl:12" or "a.txt".
std::string origin(const std::vector<InputFile>& inputs, const Record& record) {
  const std::string& path = inputs[static_cast<size_t>(record.file)].path;
  return record.line > 0 ? fmt::format("{}:{}", path, record.line) : path;
}

void tokenize_batch(Batch& batch, const tokenize::Tokenizer& tokenizer,
                    const std::vector<InputFile>& inputs, const std::string& key) {
  const int32_t eod = tokenizer.eod_id();
  for (const Record& record : batch.records) {
    std::string from_json;
    std::string_view text = record.text;
    if (inputs[static_cast<size_t>(record.file)].format == InputFormat::jsonl) {
      nlohmann::json line;
      try {
        line = nlohmann::json::parse(record.text);
      } catch (const nlohmann::json::exception& e) {
        throw PrepareError(
            fmt::format("{}: not a JSON object ({}); JSON Lines files hold one "
                        "object per line",
                        origin(inputs, record), e.what()));
      }
      const auto field = line.is_object() ? line.find(key) : line.end();
      if (!line.is_object() || field == line.end() || !field->is_string())
        throw PrepareError(fmt::format(
            "{}: no string field \"{}\" in this line; name the field that holds the text with "
            "--jsonl-key",
            origin(inputs, record), key));
      from_json = field->get<std::string>();
      text = from_json;
    }
    if (text.empty()) {
      batch.lengths.push_back(0);
      continue;
    }
    const size_t before = batch.ids.size();
    try {
      tokenizer.encode(text, batch.ids);
    } catch (const tokenize::TokenizerError& e) {
      throw PrepareError(fmt::format("{}: {}", origin(inputs, record), e.what()));
    }
    batch.ids.push_back(eod);
    batch.lengths.push_back(static_cast<int64_t>(batch.ids.size() - before));
    batch.text_bytes += text.size();
  }
  batch.records.clear();
  batch.records.shrink_to_fit();
}

// The checks on the output, before anything is created.
void check_output(const PrepareOptions& options, const std::vector<InputFile>& inputs) {
  if (options.out.empty())
    throw PrepareError("--out is empty; give the dataset's prefix, e.g. --out data/corpus");
  if (options.out.ends_with('/') || fs::is_directory(options.out))
    throw PrepareError(fmt::format(
        "--out {} is a folder; give a prefix inside it, e.g. --out {}/corpus (the dataset is "
        "PREFIX.bin, PREFIX.idx and PREFIX.json)",
        options.out, fs::path(options.out).lexically_normal().string()));
  const fs::path parent = fs::path(options.out).parent_path();
  if (std::string why = files::why_not_writable_directory(parent.empty() ? "." : parent);
      !why.empty())
    throw PrepareError(fmt::format("--out {}: cannot write there: {}", options.out, why));
  for (const char* suffix : {".bin", ".idx", ".json"}) {
    const std::string path = options.out + suffix;
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(path, ec))) continue;
    for (const InputFile& input : inputs)
      if (fs::equivalent(input.path, path, ec))
        throw PrepareError(
            fmt::format("--out {}: {} is also an input; write the dataset "
                        "elsewhere",
                        options.out, path));
    if (!options.overwrite)
      throw PrepareError(fmt::format(
          "--out {}: {} already exists; choose another prefix, or pass --overwrite to replace "
          "that dataset",
          options.out, path));
  }
}

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& options,
                               const std::function<void(const PrepareProgress&)>& progress) {
  const Clock::time_point start = Clock::now();
  const std::vector<InputFile> inputs = list_inputs(options.inputs);
  if (options.jsonl_key.empty())
    throw PrepareError("--jsonl-key is empty; name the JSON field that holds the text");
  std::unique_ptr<tokenize::Tokenizer> tokenizer;
  try {
    tokenizer = tokenize::load_tokenizer(options.tokenizer, options.eod);
  } catch (const tokenize::TokenizerError& e) {
    throw PrepareError(fmt::format("--tokenizer {}", e.what()));
  }
  check_output(options, inputs);
  if (options.workers < 0)
    throw PrepareError(
        fmt::format("--workers {} is negative; give 0 (one per hardware thread) "
                    "or a count",
                    options.workers));

  PrepareSummary summary;
  summary.prefix = options.out;
  summary.workers = options.workers > 0
                        ? options.workers
                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  summary.dtype = data::indexed_dtype_for_vocab(tokenizer->vocab_size());
  PrepareProgress seen;
  for (const InputFile& input : inputs)
    seen.bytes_total += input.bytes;
  summary.input_bytes = seen.bytes_total;

  // The folders --out needs are made here and, when the run fails on bad input found while
  // reading, removed again (declared before the writer, so its temporary files are gone first).
  struct CreatedFolder {
    fs::path root;  // the outermost folder this run created; empty: none
    bool keep = false;
    ~CreatedFolder() {
      std::error_code ignored;
      if (!keep && !root.empty()) fs::remove_all(root, ignored);
    }
  } created;
  if (const fs::path parent = fs::path(options.out).parent_path(); !parent.empty()) {
    std::error_code ec;
    for (fs::path p = parent; !p.empty() && !fs::exists(p, ec); p = p.parent_path())
      created.root = p;
    fs::create_directories(parent, ec);
    if (ec) files::throw_os_error("create the folder", parent, ec.value());
  }
  data::IndexedDatasetWriter writer(options.out, summary.dtype);
  Pipeline pipeline(static_cast<size_t>(2 * summary.workers + 2));
  std::vector<std::thread> workers;
  for (int w = 0; w < summary.workers; ++w)
    workers.emplace_back([&] {
      while (std::optional<Batch> batch = pipeline.take()) {
        try {
          tokenize_batch(*batch, *tokenizer, inputs, options.jsonl_key);
        } catch (...) {
          pipeline.fail(std::current_exception());
          return;
        }
        pipeline.done(std::move(*batch));
      }
    });

  int64_t next_to_write = 0;
  Clock::time_point last_report = start;
  auto write = [&](Batch batch) {
    size_t at = 0;
    for (const int64_t length : batch.lengths) {
      if (length == 0) {
        ++summary.empty_skipped;
        continue;
      }
      writer.add_document(std::span(batch.ids).subspan(at, static_cast<size_t>(length)));
      at += static_cast<size_t>(length);
    }
    summary.text_bytes += batch.text_bytes;
    ++next_to_write;
  };
  auto drain = [&] {
    while (std::optional<Batch> batch = pipeline.finished(next_to_write, false))
      write(std::move(*batch));
  };
  auto report = [&](uint64_t bytes_read) {
    seen.bytes_read = bytes_read;
    seen.documents = writer.num_documents();
    seen.tokens = writer.num_tokens();
    seen.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (progress) progress(seen);
  };

  // Stops the workers on every way out: a failure leaves no thread running and, through the
  // writer's destructor, no temporary file.
  struct Joiner {
    Pipeline& pipeline;
    std::vector<std::thread>& threads;
    ~Joiner() {
      pipeline.close();
      for (std::thread& t : threads)
        if (t.joinable()) t.join();
    }
  } joiner{pipeline, workers};

  int64_t batches = 0;
  uint64_t bytes_before = 0;  // of the files already read
  Batch batch;
  size_t batch_bytes = 0;
  for (size_t f = 0; f < inputs.size(); ++f) {
    RecordReader reader(inputs[f], static_cast<int32_t>(f));
    Record record;
    while (reader.next(record)) {
      batch_bytes += record.text.size();
      batch.records.push_back(std::move(record));
      if (batch_bytes >= kBatchBytes || batch.records.size() >= kBatchRecords) {
        // The reader is also the writer: with the pipeline full it writes the oldest batch (the
        // one the file needs next) before reading on.
        while (pipeline.full()) {
          std::optional<Batch> done = pipeline.finished(next_to_write, true);
          pipeline.rethrow();
          if (done) write(std::move(*done));
        }
        batch.index = batches++;
        pipeline.push(std::move(batch));
        batch = Batch();
        batch_bytes = 0;
        drain();
        if (Clock::now() - last_report > std::chrono::milliseconds(500)) {
          last_report = Clock::now();
          report(bytes_before + reader.bytes_read());
        }
      }
    }
    pipeline.rethrow();
    bytes_before += inputs[f].bytes;
  }
  if (!batch.records.empty()) {
    batch.index = batches++;
    pipeline.push(std::move(batch));  // one over the limit at most: the workers drain it
  }
  pipeline.close();
  while (next_to_write < batches) {
    pipeline.rethrow();
    std::optional<Batch> done = pipeline.finished(next_to_write, true);
    if (!done) break;
    write(std::move(*done));
  }
  pipeline.rethrow();
  if (writer.num_tokens() == 0)
    throw PrepareError(
        fmt::format("the inputs hold no text ({} empty documents); nothing to "
                    "prepare",
                    summary.empty_skipped));

  writer.finish();
  created.keep = true;
  data::IndexedSidecar& sidecar = summary.sidecar;
  sidecar.tokenizer.path = tokenizer->path();
  try {
    sidecar.tokenizer.sha256 = tokenize::sha256_file(tokenizer->path());
  } catch (const tokenize::TokenizerError& e) {
    throw PrepareError(e.what());
  }
  sidecar.tokenizer.kind = std::string(tokenizer->kind());
  sidecar.tokenizer.vocab_size = tokenizer->vocab_size();
  sidecar.tokenizer.eod_id = tokenizer->eod_id();
  sidecar.tokenizer.eod_token = tokenizer->eod_token();
  sidecar.documents = writer.num_documents();
  sidecar.tokens = writer.num_tokens();
  for (const InputFile& input : inputs)
    sidecar.inputs.push_back(input.path);
  files::write_file_atomically(options.out + ".json", sidecar.to_json());

  summary.documents = writer.num_documents();
  summary.tokens = writer.num_tokens();
  report(summary.input_bytes);
  summary.seconds = seen.seconds;
  return summary;
}

}  // namespace trainctl::prepare
