#include "train/checkpointer.h"

#include <ATen/ATen.h>

#include <cstdio>

#include "model/gpt_model.h"
#include "optim/adamw.h"

namespace megatron {

Checkpointer::Checkpointer(const Config& config, const dist::ParallelState& ps, const at::Device& device)
    : c_(config), ps_(ps), device_(device) {}

Checkpointer::~Checkpointer() {
  if (async_save_ && async_save_->writer.joinable()) async_save_->writer.join();
}

Checkpointer::Duration Checkpointer::save(const TrainingProgress& progress, const std::vector<GPTModel*>& chunks,
                                          const AdamW& optimizer, const char* why) {
  if (last_saved_ == progress.iteration) return Duration::zero();
  const TrainConfig& t = c_.train;
  const auto start = std::chrono::steady_clock::now();
  if (t.async_save) finish_async(/*wait=*/true);  // one save in flight at a time; its buffers are reused
  if (t.async_save) {
    const auto snapshot_start = std::chrono::steady_clock::now();
    async_save_ = std::make_unique<AsyncSave>();
    async_save_->snapshot = snapshot_checkpoint(t.save, progress, chunks, optimizer, c_, ps_, /*copy=*/true, &snapshot_buffers_);
    async_save_->start = snapshot_start;
    async_save_->why = why;
    AsyncSave* pending = async_save_.get();
    pending->writer = std::thread([pending] {
      try {
        write_checkpoint_files(pending->snapshot);
      } catch (...) {
        pending->error = std::current_exception();
      }
      pending->done.store(true);
    });
    last_saved_ = progress.iteration;
    const double stall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (ps_.rank == 0) {
      std::printf("started asynchronous checkpoint of iteration %lld to %s (%s; training stalled %.3f s for the host copy)\n",
                  static_cast<long long>(progress.iteration), t.save.c_str(), why, stall);
      std::fflush(stdout);
    }
    return std::chrono::steady_clock::now() - start;
  }
  save_checkpoint(t.save, progress, chunks, optimizer, c_, ps_);
  last_saved_ = progress.iteration;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (ps_.rank == 0) {
    std::printf("saved checkpoint at iteration %lld to %s (%s, %.2f s)\n", static_cast<long long>(progress.iteration),
                t.save.c_str(), why, seconds);
  }
  std::fflush(stdout);
  return std::chrono::steady_clock::now() - start;
}

Checkpointer::Duration Checkpointer::finish_async(bool wait) {
  if (!async_save_) return Duration::zero();
  const auto start = std::chrono::steady_clock::now();
  bool all_done = async_save_->done.load();
  if (!wait && ps_.world_size > 1) {
    // Publishing is collective: every rank must have finished writing its files.
    at::Tensor flag = at::full({1}, all_done ? 1.0f : 0.0f, at::TensorOptions().device(device_));
    ps_.world.all_reduce(flag);  // the number of ranks done
    all_done = flag.item<float>() == float(ps_.world_size);
  }
  if (!wait && !all_done) return std::chrono::steady_clock::now() - start;
  async_save_->writer.join();
  if (async_save_->error) std::rethrow_exception(async_save_->error);
  publish_checkpoint(async_save_->snapshot, ps_);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - async_save_->start).count();
  if (ps_.rank == 0) {
    std::printf("saved checkpoint at iteration %lld to %s (%s, asynchronous, %.2f s from snapshot to published)\n",
                static_cast<long long>(async_save_->snapshot.iteration), c_.train.save.c_str(), async_save_->why.c_str(), seconds);
    std::fflush(stdout);
  }
  async_save_.reset();
  return std::chrono::steady_clock::now() - start;
}

}  // namespace megatron
