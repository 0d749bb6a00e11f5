#include "train/batch_schedule.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "core/errors.h"

namespace megatron {
namespace {

// "250B" -> 250e9: Megatron's K, M, B, T suffixes (case-insensitive), the number a float.
int64_t parse_count(const std::string& text, const std::string& entry) {
  std::string digits = text;
  double multiplier = 1;
  if (!digits.empty()) {
    switch (std::toupper(static_cast<unsigned char>(digits.back()))) {
      case 'K': multiplier = 1e3; break;
      case 'M': multiplier = 1e6; break;
      case 'B': multiplier = 1e9; break;
      case 'T': multiplier = 1e12; break;
      default: break;
    }
    if (multiplier != 1) digits.pop_back();
  }
  char* end = nullptr;
  const double v = std::strtod(digits.c_str(), &end);
  if (digits.empty() || *end != '\0' || !std::isfinite(v) || v < 0) {
    throw UserError("--step-batch-size-schedule: '" + entry + "' is not THRESHOLD:BATCH_SIZE (numbers, optionally with K, M, B or T)");
  }
  return static_cast<int64_t>(v * multiplier);
}

}  // namespace

GlobalBatchSchedule::GlobalBatchSchedule(const TrainConfig& t, int64_t seq_length) {
  if (t.step_batch_size_schedule.empty()) {
    steps_ = {{0, t.global_batch_size}};
    return;
  }
  std::string text = t.step_batch_size_schedule;
  std::replace(text.begin(), text.end(), ',', ' ');
  std::istringstream words(text);
  for (std::string entry; words >> entry;) {
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) throw UserError("--step-batch-size-schedule: '" + entry + "' is not THRESHOLD:BATCH_SIZE");
    // Thresholds count tokens; samples are tokens // seq_length.
    const int64_t threshold = parse_count(entry.substr(0, colon), entry) / seq_length;
    const int64_t batch = parse_count(entry.substr(colon + 1), entry);
    if (batch <= 0) throw UserError("--step-batch-size-schedule: '" + entry + "': the batch size must be positive");
    steps_.emplace_back(threshold, batch);
  }
  std::sort(steps_.begin(), steps_.end());
  if (steps_.empty() || steps_.front().first != 0) {
    throw UserError("--step-batch-size-schedule '" + t.step_batch_size_schedule + "': the first threshold must be 0");
  }
  for (size_t i = 1; i < steps_.size(); ++i) {
    if (steps_[i].first == steps_[i - 1].first) {
      throw UserError("--step-batch-size-schedule '" + t.step_batch_size_schedule +
                      "': thresholds must be strictly increasing (two are " + std::to_string(steps_[i].first) + " samples)");
    }
  }
}

int64_t GlobalBatchSchedule::at(int64_t consumed_samples) const {
  int64_t batch = steps_.front().second;
  for (const auto& [threshold, size] : steps_) {
    if (consumed_samples < threshold) break;
    batch = size;
  }
  return batch;
}

int64_t GlobalBatchSchedule::iterations_for(int64_t samples) const {
  if (constant()) return samples / steps_.front().second;
  int64_t iterations = 0;
  for (int64_t consumed = 0; consumed < samples; consumed += at(consumed)) ++iterations;
  return iterations;
}

}  // namespace megatron
