#include "data/prefetcher.h"

namespace megatron {

BatchPrefetcher::BatchPrefetcher(std::function<Batch(int64_t)> make, int64_t stride, int depth)
    : make_(std::move(make)), stride_(stride), depth_(static_cast<size_t>(std::max(depth, 1))) {
  worker_ = std::thread([this] { run(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

Batch BatchPrefetcher::get(int64_t first) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (ready_.empty() ? next_ != first : ready_.front().first != first) {
    ready_.clear();  // not the expected position: start over from `first`
    next_ = first;
    ++generation_;
    error_ = nullptr;
    changed_.notify_all();
  }
  changed_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty()) std::rethrow_exception(error_);
  Batch batch = std::move(ready_.front().second);
  ready_.pop_front();
  changed_.notify_all();
  return batch;
}

void BatchPrefetcher::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || (next_ >= 0 && ready_.size() < depth_ && !error_); });
    if (stop_) return;
    const int64_t first = next_;
    const uint64_t generation = generation_;
    lock.unlock();
    Batch batch;
    std::exception_ptr error;
    try {
      batch = make_(first);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // the consumer moved elsewhere meanwhile
    if (error) {
      error_ = error;
    } else {
      ready_.emplace_back(first, std::move(batch));
      next_ = first + stride_;
    }
    changed_.notify_all();
  }
}

}  // namespace megatron
