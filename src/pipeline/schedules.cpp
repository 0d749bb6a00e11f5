#include "pipeline/schedules.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <deque>

#include "pipeline/p2p.h"

namespace megatron::pipeline {
namespace {

class Runner {
 public:
  Runner(const StageFunctions& f, const ScheduleOptions& o, const dist::Group& pp)
      : f_(f), o_(o), pp_(pp), link_(pp, o.activation_shape, o.activation_options) {}

  void no_pipelining();
  void one_f_one_b();
  void interleaved();
  ScheduleStats stats() const { return stats_; }

 private:
  bool first_stage() const { return pp_.rank() == 0; }
  bool last_stage() const { return pp_.rank() == pp_.size() - 1; }
  // The chunk that begins / ends the whole model.
  bool begins_model(int chunk) const { return first_stage() && chunk == 0; }
  bool ends_model(int chunk) const { return last_stage() && chunk == o_.chunks - 1; }

  at::Tensor forward_step(int chunk, int64_t micro_batch, const at::Tensor& input) {
    at::Tensor output = f_.forward(chunk, micro_batch, input);
    if (!o_.forward_only) stats_.max_in_flight = std::max(stats_.max_in_flight, ++in_flight_);
    if (f_.after_forward) f_.after_forward();
    return output;
  }

  // Backward of one micro-batch through one chunk; returns the gradient for the previous stage.
  at::Tensor backward_step(int chunk, bool last_micro_batch, const at::Tensor& input, const at::Tensor& output,
                           const at::Tensor& output_grad) {
    if (f_.before_backward) f_.before_backward(chunk, last_micro_batch);
    if (!output_grad.defined()) {
      torch::autograd::backward({output});  // the loss
    } else {
      // Straight into the engine: the output's data may have been freed (deallocate), only
      // its place in the graph is needed.
      torch::autograd::Engine::get_default_engine().execute({torch::autograd::impl::gradient_edge(output)}, {output_grad},
                                                            /*keep_graph=*/false, /*create_graph=*/false,
                                                            /*accumulate_grad=*/true);
    }
    --in_flight_;
    return input.defined() ? input.grad() : at::Tensor();
  }

  // Megatron's deallocate_output_tensor: once sent, an output's values are not needed (the next
  // stage owns a copy, backward only needs its grad_fn), so its memory goes back right away and
  // activation memory follows the schedule's bound, not the number of micro-batches.
  static void deallocate(const at::Tensor& output) {
    if (!output.defined() || output.dim() == 0 || output.is_view()) return;
    at::Tensor placeholder = at::empty({1}, output.options());
    const_cast<at::Tensor&>(output).set_data(placeholder);
  }

  at::Tensor received(at::Tensor t) const {
    if (t.defined() && !o_.forward_only) t.requires_grad_(true);
    return t;
  }
  at::Tensor recv_forward() { return first_stage() ? at::Tensor() : received(link_.exchange({}, {}, true, false).from_prev); }
  void send_forward(const at::Tensor& out) { if (!last_stage()) link_.exchange(out, {}, false, false); }
  at::Tensor recv_backward() { return last_stage() ? at::Tensor() : link_.exchange({}, {}, false, true).from_next; }
  void send_backward(const at::Tensor& grad) { if (!first_stage()) link_.exchange({}, grad, false, false); }
  at::Tensor send_forward_recv_backward(const at::Tensor& out) {
    return last_stage() ? at::Tensor() : link_.exchange(out, {}, false, true).from_next;
  }
  at::Tensor send_backward_recv_forward(const at::Tensor& grad) {
    return first_stage() ? at::Tensor() : received(link_.exchange({}, grad, true, false).from_prev);
  }

  const StageFunctions& f_;
  const ScheduleOptions& o_;
  dist::Group pp_;
  StageLink link_;
  int in_flight_ = 0;
  ScheduleStats stats_;
};

void Runner::no_pipelining() {
  for (int64_t k = 0; k < o_.micro_batches; ++k) {
    at::Tensor loss = forward_step(0, k, {});
    if (!o_.forward_only) backward_step(0, k == o_.micro_batches - 1, {}, loss, {});
  }
}

// Stage r runs p - r - 1 warm-up forwards, then alternates one forward and one backward, then
// drains the remaining backwards: at most p - r micro-batches are in flight on it.
void Runner::one_f_one_b() {
  const int64_t m = o_.micro_batches;
  const int64_t warmup = o_.forward_only ? m : warmup_forwards(pp_.size(), pp_.rank(), 1, m);
  const int64_t remaining = m - warmup;
  std::deque<at::Tensor> inputs, outputs;
  auto keep = [&](const at::Tensor& input, const at::Tensor& output) {
    if (o_.forward_only) return;
    inputs.push_back(input);
    outputs.push_back(output);
    if (!last_stage()) deallocate(output);
  };
  for (int64_t k = 0; k < warmup; ++k) {
    at::Tensor input = recv_forward();
    at::Tensor output = forward_step(0, k, input);
    send_forward(output);
    keep(input, output);
  }
  at::Tensor input = remaining > 0 ? recv_forward() : at::Tensor();
  for (int64_t k = 0; k < remaining; ++k) {
    const bool last_iteration = k == remaining - 1;
    at::Tensor output = forward_step(0, warmup + k, input);
    if (o_.forward_only) {
      send_forward(output);
      if (!last_iteration) input = recv_forward();
      continue;
    }
    at::Tensor output_grad = send_forward_recv_backward(output);
    keep(input, output);
    at::Tensor oldest_input = inputs.front(), oldest_output = outputs.front();
    inputs.pop_front();
    outputs.pop_front();
    // The backward of micro-batch k: the step's last when there was no warm-up.
    at::Tensor input_grad = backward_step(0, warmup == 0 && last_iteration, oldest_input, oldest_output, output_grad);
    if (last_iteration) {
      send_backward(input_grad);
    } else {
      input = send_backward_recv_forward(input_grad);
    }
  }
  if (o_.forward_only) return;
  for (int64_t k = 0; k < warmup; ++k) {
    at::Tensor oldest_input = inputs.front(), oldest_output = outputs.front();
    inputs.pop_front();
    outputs.pop_front();
    at::Tensor output_grad = recv_backward();
    send_backward(backward_step(0, k == warmup - 1, oldest_input, oldest_output, output_grad));
  }
}

// Interleaved 1F1B (Megatron-Core's forward_backward_pipelining_with_interleaving): virtual
// micro-batch k runs on chunk (k mod (p * v)) / p, groups of p micro-batches per chunk, so
// each stage works on v chunks in turn and the bubble shrinks by v. Stages wrap around: the
// last stage's chunk c feeds the first stage's chunk c + 1.
void Runner::interleaved() {
  const int p = pp_.size(), v = o_.chunks;
  const int64_t m = o_.micro_batches;
  const int64_t total = m * v;
  const int64_t group = int64_t(p) * v;
  // k may be negative (the first stage looks p - 1 micro-batches back): Python's floor modulo.
  auto chunk_of = [&](int64_t k, bool forward) {
    const int c = static_cast<int>((((k % group) + group) % group) / p);
    return forward ? c : v - c - 1;
  };
  auto micro_batch_of = [&](int64_t k) { return (k / group) * p + k % p; };
  auto last_for_chunk = [&](int64_t k) { return k / group == total / group - 1 && (k % group) % p == p - 1; };

  const bool all_warmup = !o_.forward_only && m == p;
  const int64_t warmup = o_.forward_only ? total : warmup_forwards(p, pp_.rank(), v, m);
  const int64_t remaining = total - warmup;

  std::vector<std::deque<at::Tensor>> inputs(v), outputs(v), output_grads(v);
  auto forward_helper = [&](int64_t k) {
    const int chunk = chunk_of(k, true);
    if (begins_model(chunk) && inputs[chunk].size() == outputs[chunk].size()) inputs[chunk].push_back({});
    at::Tensor output = forward_step(chunk, micro_batch_of(k), inputs[chunk].back());
    outputs[chunk].push_back(output);
    if (o_.forward_only) {
      inputs[chunk].pop_back();
      outputs[chunk].pop_back();
    }
    return output;
  };
  auto backward_helper = [&](int64_t k) {
    const int chunk = chunk_of(k, false);
    if (ends_model(chunk) && output_grads[chunk].empty()) output_grads[chunk].push_back({});
    at::Tensor input = inputs[chunk].front(), output = outputs[chunk].front(), grad = output_grads[chunk].front();
    inputs[chunk].pop_front();
    outputs[chunk].pop_front();
    output_grads[chunk].pop_front();
    return backward_step(chunk, last_for_chunk(k), input, output, grad);
  };

  inputs[0].push_back(first_stage() ? at::Tensor() : received(link_.exchange({}, {}, true, false).from_prev));
  for (int64_t k = 0; k < warmup; ++k) {
    at::Tensor output = forward_helper(k);
    const int next_chunk = chunk_of(k + 1, true);
    bool recv_prev = !(first_stage() && next_chunk == 0) && k != total - 1;
    if (ends_model(chunk_of(k, true))) output = at::Tensor();
    if (k == warmup - 1 && !o_.forward_only && !all_warmup) {
      const bool recv_next = !last_stage();
      auto got = link_.exchange(output, {}, recv_prev, recv_next);
      output_grads[v - 1].push_back(got.from_next);
      inputs[next_chunk].push_back(received(got.from_prev));
    } else {
      inputs[next_chunk].push_back(received(link_.exchange(output, {}, recv_prev, false).from_prev));
    }
    if (!o_.forward_only) deallocate(output);
  }

  for (int64_t k = 0; k < remaining; ++k) {
    const int64_t forward_k = k + warmup, backward_k = k;
    at::Tensor output = forward_helper(forward_k);
    at::Tensor input_grad = backward_helper(backward_k);
    if (ends_model(chunk_of(forward_k, true))) output = at::Tensor();
    if (begins_model(chunk_of(backward_k, false))) input_grad = at::Tensor();

    // Which chunk the tensors received now belong to. The first stage runs p - 1 micro-batches
    // ahead of the last, so their chunk ids are taken that far back.
    bool recv_prev = true;
    int next_forward_chunk;
    if (first_stage()) {
      next_forward_chunk = chunk_of(forward_k - (p - 1), true);
      if (next_forward_chunk == v - 1) recv_prev = false;
      ++next_forward_chunk;
    } else {
      next_forward_chunk = chunk_of(forward_k + 1, true);
    }
    bool recv_next = true;
    int next_backward_chunk;
    if (last_stage()) {
      next_backward_chunk = chunk_of(backward_k - (p - 1), false);
      if (next_backward_chunk == 0) recv_next = false;
      --next_backward_chunk;
    } else {
      next_backward_chunk = chunk_of(backward_k + 1, false);
    }
    if (k == remaining - 1) recv_prev = false;

    auto got = link_.exchange(output, input_grad, recv_prev, recv_next);
    deallocate(output);
    if (recv_prev) inputs[next_forward_chunk].push_back(received(got.from_prev));
    if (recv_next) output_grads[next_backward_chunk].push_back(got.from_next);
  }

  if (o_.forward_only) return;
  if (all_warmup) output_grads[v - 1].push_back(last_stage() ? at::Tensor() : link_.exchange({}, {}, false, true).from_next);
  for (int64_t k = remaining; k < total; ++k) {
    at::Tensor input_grad = backward_helper(k);
    const int next_chunk = chunk_of(k + 1, false);
    bool recv_next = !(last_stage() && next_chunk == v - 1) && k != total - 1;
    output_grads[next_chunk].push_back(link_.exchange({}, input_grad, false, recv_next).from_next);
  }
}

}  // namespace

int64_t warmup_forwards(int stages, int stage, int chunks, int64_t micro_batches) {
  const int64_t forwards = micro_batches * chunks;
  if (chunks == 1) return std::min<int64_t>(stages - stage - 1, forwards);
  if (micro_batches == stages) return forwards;
  return std::min<int64_t>(int64_t(stages - stage - 1) * 2 + int64_t(chunks - 1) * stages, forwards);
}

ScheduleStats forward_backward(const StageFunctions& functions, const ScheduleOptions& options, const dist::Group& pp) {
  TORCH_CHECK(options.micro_batches >= 1, "forward_backward: no micro-batches");
  TORCH_CHECK(options.chunks == 1 || pp.size() > 1, "forward_backward: model chunks need a pipeline");
  TORCH_CHECK(options.chunks == 1 || options.micro_batches % pp.size() == 0,
              "the interleaved schedule needs a multiple of the pipeline size in micro-batches");
  Runner runner(functions, options, pp);
  if (pp.size() == 1) {
    runner.no_pipelining();
  } else if (options.chunks == 1) {
    runner.one_f_one_b();
  } else {
    runner.interleaved();
  }
  return runner.stats();
}

}  // namespace megatron::pipeline
