// The offloaded part of the optimizer; see host_optimizer.h.
#include "optim/host_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/StreamGuard.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "core/streams.h"
#include "distributed/launch_env.h"
#include "optim/adamw.h"

namespace megatron {
namespace {

// Elements per staging chunk: 128 MiB of fp32 gradients; a few of them in flight.
constexpr int64_t kChunk = int64_t(1) << 25;

std::string gib(int64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.1f GiB", double(bytes) / double(int64_t(1) << 30));
  return s;
}

kernels::AdamWStepScalars on_host(const kernels::AdamWStepScalars& s) {
  kernels::AdamWStepScalars h;
  h.step = s.step.cpu();
  h.bias_corrections = s.bias_corrections.cpu();
  h.grad_scale = s.grad_scale.cpu();
  h.found_inf = s.found_inf.cpu();
  h.lr = s.lr.cpu();
  return h;
}

}  // namespace

int64_t host_memory_available_per_rank() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  int64_t available_kib = -1;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "MemAvailable:") fields >> available_kib;
  }
  if (available_kib < 0) return -1;
  // The ranks on this node, as the launcher (torchrun, `megatron launch` or Slurm) left them.
  return available_kib * 1024 / std::max(1, dist::launch_env_from_environment().local_world_size);
}

void check_host_memory(int64_t needed, int64_t available) {
  if (available < 0 || double(needed) <= 0.9 * double(available)) return;
  throw UserError("--optimizer-cpu-offload: this rank's offloaded optimizer state needs " + gib(needed) + " of host memory, and " +
                  gib(available) + " is available to it (MemAvailable over the node's ranks): lower --optimizer-offload-fraction, "
                  "keep the moments in bf16 (--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16), or spread the model over more ranks");
}

HostOptimizer::HostOptimizer(std::vector<OptimizerParam>& params, const TrainConfig& config, int64_t chunk_elements, bool report)
    : overlap_(config.overlap_cpu_optimizer_d2h_h2d), report_(report) {
  const int64_t chunk = chunk_elements > 0 ? chunk_elements : kChunk;
  int64_t total = 0;
  for (const OptimizerParam& p : params) total += p.numel;
  // Megatron's rule: parameters in order while fewer than fraction x all elements are offloaded.
  const double threshold = config.optimizer_offload_fraction * double(total);
  std::vector<size_t> chosen;
  int64_t largest = 0, needed = 0;
  for (size_t i = 0; i < params.size() && double(offloaded_elements_) < threshold; ++i) {
    const OptimizerParam& p = params[i];
    chosen.push_back(i);
    offloaded_elements_ += p.numel;
    largest = std::max(largest, p.numel);
    // fp32 masters, or remainders with the host's copy of the bf16 weights: 4 bytes either way.
    needed += p.numel * int64_t(4 + p.exp_avg.element_size() + p.exp_avg_sq.element_size());
  }
  if (chosen.empty()) return;
  const OptimizerParam& first = params[chosen.front()];
  for (size_t i : chosen) {
    // One staging serves every chunk: the buffers hold one dtype of weights and one of gradients.
    TORCH_CHECK(params[i].main_grad.scalar_type() == first.main_grad.scalar_type() &&
                    params[i].model_slice.scalar_type() == first.model_slice.scalar_type(),
                "HostOptimizer: ", params[i].name, " is stored as ", params[i].model_slice.scalar_type(), " with ",
                params[i].main_grad.scalar_type(), " gradients, unlike ", first.name);
  }
  const bool cuda = first.main_grad.is_cuda();
  const int64_t slot_elements = std::min(largest, chunk);
  const int slots = 2;
  needed += slots * slot_elements * int64_t(first.main_grad.element_size() + first.model_slice.element_size());
  check_host_memory(needed, host_memory_available_per_rank());

  at::NoGradGuard no_grad;
  for (size_t i : chosen) {
    OptimizerParam& p = params[i];
    if (p.master_is_remainder()) {
      // Kept as the device keeps them (bf16 weight + remainder), so the weights round as they
      // would there: the offloaded step is the device step's numbers.
      p.host_weights = p.model_slice.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
      p.master = p.master.to(at::kCPU).contiguous();
    } else {
      p.master = p.master_fp32().to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
    }
    p.exp_avg = p.exp_avg.to(at::kCPU).contiguous();
    p.exp_avg_sq = p.exp_avg_sq.to(at::kCPU).contiguous();
    p.on_host = true;
    for (int64_t offset = 0; offset < p.numel; offset += chunk) chunks_.push_back({i, offset, std::min(chunk, p.numel - offset)});
  }
  // Pinned on CUDA, so the copies run asynchronously; on the CPU the same path with plain memory.
  auto staging = [&](at::ScalarType dtype) {
    return at::empty({slot_elements}, at::TensorOptions().dtype(dtype).pinned_memory(cuda));
  };
  for (int s = 0; s < slots; ++s) slots_.push_back({staging(first.main_grad.scalar_type()), staging(first.model_slice.scalar_type()), {}, {}});
  if (cuda && overlap_) {
    d2h_ = pooled_stream(first.main_grad.device(), /*high_priority=*/false);
    h2d_ = pooled_stream(first.main_grad.device(), /*high_priority=*/false);
  }
}

void HostOptimizer::step_chunk(OptimizerParam& p, const Chunk& c, const at::Tensor& grad, const at::Tensor& model,
                               const kernels::AdamWStepScalars& s, const TrainConfig& config) const {
  const kernels::AdamWHyperparameters h{config.adam_beta1, config.adam_beta2, config.adam_eps, p.decay ? config.weight_decay : 0.0};
  kernels::adamw_step(p.master.narrow(0, c.offset, c.numel), p.exp_avg.narrow(0, c.offset, c.numel),
                      p.exp_avg_sq.narrow(0, c.offset, c.numel), grad, model, h, s);
}

namespace {

using Clock = std::chrono::steady_clock;

// Adds the wall time of work() to total.
template <typename Work>
void timed(double& total, const Work& work) {
  const Clock::time_point t = Clock::now();
  work();
  total += std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

void HostOptimizer::step(std::vector<OptimizerParam>& params, const kernels::AdamWStepScalars& scalars,
                         const kernels::AdamWStepScalars& decoupled, const TrainConfig& config) {
  if (chunks_.empty()) return;
  const Clock::time_point start = Clock::now();
  StepTimes times;
  run_step(params, scalars, decoupled, config, times);
  // Where the host's time went, once (the second step: the first warms the caches up).
  if (report_ && ++steps_ == 2) {
    std::fprintf(stderr,
                 "> optimizer offload, step 2: %.3g elements in %zu chunks on %d threads: %.2f s waiting for the backward, "
                 "%.2f s for gradients to arrive, %.2f s AdamW, %.2f s for staging to free; %.2f s in all\n",
                 double(offloaded_elements_), chunks_.size(), at::get_num_threads(), times.backward, times.gradients,
                 times.adamw, times.staging, std::chrono::duration<double>(Clock::now() - start).count());
  }
}

void HostOptimizer::run_step(std::vector<OptimizerParam>& params, const kernels::AdamWStepScalars& scalars,
                             const kernels::AdamWStepScalars& decoupled, const TrainConfig& config, StepTimes& times) {
  at::NoGradGuard no_grad;
  kernels::AdamWStepScalars host, host_decoupled;
  // Reading the scalars waits for the device to finish the backward and the gradient norm.
  timed(times.backward, [&] { host = on_host(scalars), host_decoupled = on_host(decoupled); });
  auto gradient_of = [&](const Chunk& c) { return params[c.param].main_grad.narrow(0, c.offset, c.numel); };
  auto weights_of = [&](const Chunk& c) { return params[c.param].model_slice.narrow(0, c.offset, c.numel); };
  auto step = [&](const Chunk& c, const Slot& s) {
    timed(times.adamw, [&] {
      OptimizerParam& p = params[c.param];
      const at::Tensor grad = s.grad.narrow(0, 0, c.numel), model = s.model.narrow(0, 0, c.numel);
      const kernels::AdamWStepScalars& sc = p.decoupled_lr ? host_decoupled : host;
      if (!p.host_weights.defined()) return step_chunk(p, c, grad, model, sc, config);
      const at::Tensor weights = p.host_weights.narrow(0, c.offset, c.numel);
      step_chunk(p, c, grad, weights, sc, config);
      model.copy_(weights);  // into the pinned staging the copy to the device reads
    });
  };
  if (!d2h_) {
    // One chunk at a time, each copy finished before the next thing reads its result.
    Slot& s = slots_[0];
    for (const Chunk& c : chunks_) {
      timed(times.gradients, [&] { s.grad.narrow(0, 0, c.numel).copy_(gradient_of(c)); });
      step(c, s);
      timed(times.staging, [&] { weights_of(c).copy_(s.model.narrow(0, 0, c.numel)); });
    }
    return;
  }
  const c10::Stream compute = current_stream(params[chunks_.front().param].main_grad.device());
  order_after(compute, *d2h_);  // the reduced gradients are complete where the compute stream stands
  auto send_gradient = [&](size_t k) {
    Slot& s = slots_[k % slots_.size()];
    {
      c10::StreamGuard on_d2h(*d2h_);
      s.grad.narrow(0, 0, chunks_[k].numel).copy_(gradient_of(chunks_[k]), /*non_blocking=*/true);
    }
    s.gradient_arrived.emplace(d2h_->device_type());
    s.gradient_arrived->record(*d2h_);
  };
  send_gradient(0);
  for (size_t k = 0; k < chunks_.size(); ++k) {
    // The next chunk's gradient comes over while this one steps (its staging was last read by
    // the CPU, which is done with it).
    if (k + 1 < chunks_.size()) send_gradient(k + 1);
    Slot& s = slots_[k % slots_.size()];
    timed(times.gradients, [&] { s.gradient_arrived->synchronize(); });
    // The weights this staging held before have left.
    if (s.weights_sent) timed(times.staging, [&] { s.weights_sent->synchronize(); });
    step(chunks_[k], s);
    {
      c10::StreamGuard on_h2d(*h2d_);
      weights_of(chunks_[k]).copy_(s.model.narrow(0, 0, chunks_[k].numel), /*non_blocking=*/true);
    }
    s.weights_sent.emplace(h2d_->device_type());
    s.weights_sent->record(*h2d_);
  }
  order_after(*h2d_, compute);  // the next forward (and the parameter all-gather) reads the new weights
}

}  // namespace megatron
