// The preprocess pipeline (reader thread -> tokenizing workers -> in-order writer on the calling
// thread), its progress line, and merge_datasets.
#include "data/preprocess.h"

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "core/errors.h"
#include "core/files.h"
#include "data/indexed_dataset.h"
#include "data/line_batch_reader.h"

namespace megatron {
namespace {

// ~64 KB of text is tens of milliseconds of tokenizing: coarse enough that locking is noise,
// fine enough that workers stay balanced and little memory is in flight.
constexpr size_t kBatchBytes = 64 * 1024;
constexpr size_t kMaxBadLinesListed = 10;

// One key's output for a batch: documents back to back, each as seq_counts[d] sequences.
struct KeyOutput {
  std::vector<int64_t> tokens;
  std::vector<int32_t> seq_lens;
  std::vector<uint32_t> seq_counts;  // per document
};

struct EncodedBatch {
  uint64_t bytes = 0;
  uint64_t empty_lines = 0;
  uint64_t documents = 0;
  std::vector<BadLine> bad;
  std::vector<KeyOutput> keys;
};

bool is_blank(std::string_view s) {
  return s.find_first_not_of(" \t\r") == std::string_view::npos;
}

EncodedBatch encode_batch(const LineBatch& batch, size_t num_outputs, const LineEncoder& encode) {
  EncodedBatch out;
  out.bytes = batch.bytes;
  out.keys.resize(num_outputs);
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<int32_t>> sentences;
  std::string_view text = batch.text;
  uint64_t line_no = batch.first_line;
  for (size_t start = 0; start < text.size(); ++line_no) {
    const size_t nl = text.find('\n', start);
    std::string_view line = text.substr(start, nl - start);
    start = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF files
    if (line_no == 1 && line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);  // BOM
    if (is_blank(line)) {
      ++out.empty_lines;
      continue;
    }
    std::string why = encode(line, &tokens, &sentences);
    if (!why.empty()) {
      out.bad.push_back({line_no, std::move(why)});
      continue;
    }
    ++out.documents;
    for (size_t k = 0; k < tokens.size(); ++k) {
      KeyOutput& key = out.keys[k];
      key.tokens.insert(key.tokens.end(), tokens[k].begin(), tokens[k].end());
      key.seq_lens.insert(key.seq_lens.end(), sentences[k].begin(), sentences[k].end());
      key.seq_counts.push_back(static_cast<uint32_t>(sentences[k].size()));
    }
  }
  return out;
}

// Walks one key's output of a batch, document by document.
class KeyCursor {
 public:
  // Appends the next document to the builder; returns its token count.
  uint64_t write_document(const KeyOutput& key, IndexedDatasetBuilder& builder) {
    const size_t start = tok_;
    for (uint32_t s = 0; s < key.seq_counts[doc_]; ++s) {
      const size_t len = static_cast<size_t>(key.seq_lens[seq_++]);
      builder.add_sequence(key.tokens.data() + tok_, len);
      tok_ += len;
    }
    builder.end_document();
    ++doc_;
    return tok_ - start;
  }

 private:
  size_t doc_ = 0, seq_ = 0, tok_ = 0;
};

std::string format_duration(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

// Reader thread, workers and the in-order hand-over to the writer. Destruction stops and joins
// every thread, so an exception on the writer side unwinds cleanly.
class Pipeline {
 public:
  Pipeline(LineBatchReader& reader, const PreprocessOptions& opt, size_t num_outputs, const LineEncoder& encode)
      : reader_(reader), num_outputs_(num_outputs), encode_(encode),
        max_in_flight_(4 * static_cast<uint64_t>(opt.workers) + 4) {
    threads_.emplace_back([this] { read_loop(); });
    for (int i = 0; i < opt.workers; ++i) threads_.emplace_back([this] { work_loop(); });
  }
  ~Pipeline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_cv_.notify_all();
    work_cv_.notify_all();
    result_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // The next batch in input order; false at the end. Rethrows a reader or worker failure.
  bool next(EncodedBatch* out) {
    std::unique_lock<std::mutex> lock(mu_);
    result_cv_.wait(lock, [&] {
      return error_ || results_.count(next_out_) > 0 || (reader_done_ && next_out_ == batches_read_);
    });
    if (error_) std::rethrow_exception(error_);
    auto it = results_.find(next_out_);
    if (it == results_.end()) return false;
    *out = std::move(it->second);
    results_.erase(it);
    ++next_out_;
    --in_flight_;
    space_cv_.notify_one();
    return true;
  }

 private:
  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = e;
      stop_ = true;
    }
    space_cv_.notify_all();
    work_cv_.notify_all();
    result_cv_.notify_all();
  }

  void read_loop() {
    try {
      for (;;) {
        {
          std::unique_lock<std::mutex> lock(mu_);
          space_cv_.wait(lock, [&] { return stop_ || in_flight_ < max_in_flight_; });
          if (stop_) return;
        }
        std::optional<LineBatch> batch = reader_.next();  // outside the lock: I/O and inflating
        std::lock_guard<std::mutex> lock(mu_);
        if (!batch) {
          reader_done_ = true;
          work_cv_.notify_all();
          result_cv_.notify_all();
          return;
        }
        work_.emplace_back(batches_read_++, std::move(*batch));
        ++in_flight_;
        work_cv_.notify_one();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }

  void work_loop() {
    try {
      for (;;) {
        std::pair<uint64_t, LineBatch> item;
        {
          std::unique_lock<std::mutex> lock(mu_);
          work_cv_.wait(lock, [&] { return stop_ || !work_.empty() || reader_done_; });
          if (stop_ || work_.empty()) return;
          item = std::move(work_.front());
          work_.pop_front();
        }
        EncodedBatch encoded = encode_batch(item.second, num_outputs_, encode_);
        {
          std::lock_guard<std::mutex> lock(mu_);
          results_.emplace(item.first, std::move(encoded));
        }
        result_cv_.notify_one();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }

  LineBatchReader& reader_;
  const size_t num_outputs_;
  const LineEncoder& encode_;
  const uint64_t max_in_flight_;  // batches read but not yet written: bounds memory

  std::mutex mu_;
  std::condition_variable space_cv_, work_cv_, result_cv_;
  std::deque<std::pair<uint64_t, LineBatch>> work_;
  std::map<uint64_t, EncodedBatch> results_;
  uint64_t batches_read_ = 0, next_out_ = 0, in_flight_ = 0;
  bool reader_done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

class Progress {
 public:
  Progress(std::FILE* out, std::optional<uint64_t> total) : out_(out), total_(total) {}
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void print(const PreprocessStats& s, bool done) const {
    if (out_ == nullptr) return;
    const double t = std::max(elapsed(), 1e-9);
    const double mb = static_cast<double>(s.bytes_read) / 1e6;
    std::string line = "preprocess: " + std::string(done ? "done: " : "") + std::to_string(s.documents) +
                       " documents";
    char buf[160];
    std::snprintf(buf, sizeof(buf), " | %.2f MB read | %.2f MB/s | %.3f M tokens", mb, mb / t,
                  static_cast<double>(s.tokens) / 1e6);
    line += buf;
    if (done) {
      line += " | " + format_duration(t);
    } else if (total_ && s.bytes_read > 0 && *total_ >= s.bytes_read) {
      const double rate = static_cast<double>(s.bytes_read) / t;
      line += " | ETA " + format_duration(static_cast<double>(*total_ - s.bytes_read) / rate);
    }
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
  }

 private:
  std::FILE* out_;
  std::optional<uint64_t> total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

std::string parent_dir(const std::string& prefix) {
  const size_t slash = prefix.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : prefix.substr(0, slash);
}

}  // namespace

std::string preprocess_output_prefix(const std::string& prefix, const std::string& key) {
  return prefix + "_" + key + "_document";
}

PreprocessStats preprocess_jsonl(const PreprocessOptions& opt, const Tokenizer& tokenizer) {
  if (opt.json_keys.empty()) throw UserError("--json-keys: give at least one key");
  if (std::set<std::string>(opt.json_keys.begin(), opt.json_keys.end()).size() != opt.json_keys.size()) {
    throw UserError("--json-keys: a key is listed twice; each key writes its own dataset");
  }
  if (opt.output_prefix.empty()) throw UserError("--output-prefix is required");
  if (opt.workers < 1) throw UserError("--workers must be at least 1");
  if (opt.append_eod && !tokenizer.eod_id()) {
    throw UserError("--append-eod: this tokenizer has no end-of-document token (no EOS); drop the flag "
                    "or use a tokenizer whose tokenizer_config.json names an eos_token");
  }
  const TokenDType dtype = token_dtype_for_vocab(tokenizer.vocab_size());
  std::vector<LineOutput> outputs;
  for (const std::string& key : opt.json_keys) {
    outputs.push_back({preprocess_output_prefix(opt.output_prefix, key), dtype});
  }
  return preprocess_lines(opt, outputs, [&](std::string_view line, std::vector<std::vector<int64_t>>* tokens,
                                            std::vector<std::vector<int32_t>>* sentences) {
    return encode_jsonl_line(line, opt.json_keys, tokenizer, opt.include_special_tokens, opt.append_eod, tokens,
                             sentences);
  });
}

PreprocessStats preprocess_lines(const PreprocessOptions& opt, const std::vector<LineOutput>& outputs,
                                 const LineEncoder& encode) {
  if (outputs.empty()) throw std::invalid_argument("preprocess_lines: no outputs");
  if (opt.workers < 1) throw UserError("--workers must be at least 1");
  LineBatchReader reader(opt.input, kBatchBytes);  // opens (and checks) the input first
  for (const LineOutput& out : outputs) make_directories(parent_dir(out.prefix));

  PreprocessStats stats;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const LineOutput& out : outputs) {
    stats.outputs.push_back(out.prefix);
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(out.prefix, out.dtype));
  }

  Progress progress(opt.progress, reader.total_bytes());
  {
    Pipeline pipeline(reader, opt, builders.size(), encode);
    EncodedBatch batch;
    while (pipeline.next(&batch)) {
      if (!batch.bad.empty()) {
        if (!opt.skip_bad_lines) {
          const BadLine& bad = batch.bad.front();
          throw UserError(opt.input + ":" + std::to_string(bad.line) + ": " + bad.reason +
                          " (--skip-bad-lines skips such lines and reports them at the end)");
        }
        stats.bad_lines += batch.bad.size();
        for (BadLine& bad : batch.bad) {
          if (stats.first_bad_lines.size() < kMaxBadLinesListed) stats.first_bad_lines.push_back(std::move(bad));
        }
      }
      stats.empty_lines += batch.empty_lines;
      stats.bytes_read += batch.bytes;
      std::vector<KeyCursor> cursors(builders.size());
      for (uint64_t d = 0; d < batch.documents; ++d) {
        for (size_t k = 0; k < builders.size(); ++k) {
          stats.tokens += cursors[k].write_document(batch.keys[k], *builders[k]);
        }
        ++stats.documents;
        if (opt.log_interval > 0 && stats.documents % static_cast<uint64_t>(opt.log_interval) == 0) {
          progress.print(stats, false);
        }
      }
    }
  }
  // Every dataset is complete before any is renamed into place.
  for (auto& builder : builders) builder->finalize();
  stats.seconds = progress.elapsed();
  progress.print(stats, true);
  return stats;
}

std::vector<std::string> merge_datasets(const std::vector<std::string>& inputs,
                                        const std::string& output_prefix) {
  std::vector<std::string> prefixes;
  for (const std::string& input : inputs) {
    if (!is_directory(input)) {
      prefixes.push_back(input);
      continue;
    }
    // merge_datasets.py --input DIR: every .bin/.idx pair in DIR, by name.
    std::set<std::string> found;
    if (DIR* dir = ::opendir(input.c_str())) {
      while (dirent* e = ::readdir(dir)) {
        const std::string name = e->d_name;
        if (name.size() < 5) continue;
        const std::string ext = name.substr(name.size() - 4);
        if (ext != ".bin" && ext != ".idx") continue;
        const std::string prefix = input + "/" + name.substr(0, name.size() - 4);
        if (prefix == output_prefix || !is_file(prefix + ext)) continue;
        const std::string other = prefix + (ext == ".bin" ? ".idx" : ".bin");
        if (!is_file(other)) throw UserError(prefix + ext + " has no matching " + other);
        found.insert(prefix);
      }
      ::closedir(dir);
    } else {
      throw UserError(input + ": cannot list the directory");
    }
    if (found.empty()) throw UserError(input + ": no .bin/.idx datasets in this directory");
    prefixes.insert(prefixes.end(), found.begin(), found.end());
  }
  make_directories(parent_dir(output_prefix));
  IndexedDatasetBuilder::merge(prefixes, output_prefix);
  return prefixes;
}

}  // namespace megatron
