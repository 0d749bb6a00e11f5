// Builds upcoming micro-batches on a background thread while the model computes the current
// one. Batches are a pure function of their first sample index, so prefetching never changes
// what a run sees: the consumer asks for index i and gets exactly make(i).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "data/micro_batch.h"

namespace megatron {

class BatchPrefetcher {
 public:
  // make(first_sample) builds the batch starting at that sample; `stride` is the distance
  // between consecutive requests (the micro-batch size); `depth` batches are kept ready.
  BatchPrefetcher(std::function<Batch(int64_t)> make, int64_t stride, int depth = 2);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The batch at `first`. Requests that follow the stride are served from the queue; any other
  // index (after a resume or a jump) restarts prefetching from there. Errors raised while
  // building (bad data) are rethrown here, in the caller's thread.
  Batch get(int64_t first);

 private:
  void run();

  std::function<Batch(int64_t)> make_;
  int64_t stride_;
  size_t depth_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<int64_t, Batch>> ready_;
  int64_t next_ = -1;  // first sample of the next batch to build; -1: idle until asked
  uint64_t generation_ = 0;  // bumped on a restart so a batch built for the old position is dropped
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace megatron
