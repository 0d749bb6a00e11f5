#include "tensor_parallel/recompute.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <optional>

namespace megatron::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Every generator a region's dropout can draw from, as it stood at one moment. The tracker's
// states are replaced, never changed in place, so holding them is enough.
struct GeneratorStates {
  DefaultGeneratorStates defaults;       // cuda: when the region runs on CUDA
  at::Tensor tracker_cpu, tracker_cuda;  // the model-parallel generator, where TP has one

  static GeneratorStates now(const TensorParallel& tp, bool cuda) {
    GeneratorStates s{DefaultGeneratorStates::save(cuda), {}, {}};
    if (tp.rng) {
      s.tracker_cpu = tp.rng->cpu_state();
      s.tracker_cuda = tp.rng->cuda_state();
    }
    return s;
  }
  void restore(const TensorParallel& tp) const {
    defaults.restore();
    if (tp.rng) tp.rng->set_states(tracker_cpu, tracker_cuda);
  }
};

// What the backward needs besides the saved inputs, carried through ctx->saved_data.
struct RegionCapsule : torch::CustomClassHolder {
  RecomputedRegion region;
  TensorParallel tp;
  std::optional<GeneratorStates> forward_states;  // set when the region draws random numbers
  std::vector<bool> input_requires_grad;
};

struct Recompute : torch::autograd::Function<Recompute> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, const c10::intrusive_ptr<RegionCapsule>& capsule) {
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["region"] = at::IValue::make_capsule(capsule);
    return capsule->region(inputs.vec());  // grad mode is off here: nothing inside is kept
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto capsule = c10::static_intrusive_pointer_cast<RegionCapsule>(ctx->saved_data["region"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    variable_list inputs;  // fresh leaves, so the second run's graph ends at them
    for (size_t i = 0; i < saved.size(); ++i) {
      inputs.push_back(saved[i].detach().requires_grad_(capsule->input_requires_grad[i]));
    }
    variable_list outputs;
    {
      std::optional<GeneratorStates> current;
      if (capsule->forward_states) {
        current = GeneratorStates::now(capsule->tp, capsule->forward_states->defaults.cuda.defined());
        capsule->forward_states->restore(capsule->tp);
      }
      at::AutoGradMode grad_on(true);
      outputs = capsule->region(inputs);
      if (current) current->restore(capsule->tp);
    }
    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grads[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    // Parameters inside the region get their gradients here, through their usual accumulation
    // (and the gradient buffer's hooks), as in a backward without recomputation.
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    variable_list input_grads;
    for (const at::Tensor& x : inputs) input_grads.push_back(x.requires_grad() ? x.grad() : at::Tensor());
    input_grads.push_back({});  // the capsule
    return input_grads;
  }
};

}  // namespace

std::vector<at::Tensor> recompute_in_backward(const RecomputedRegion& region, const std::vector<at::Tensor>& inputs,
                                              const TensorParallel& tp, bool draws_random) {
  bool any_requires_grad = false;
  for (const at::Tensor& x : inputs) any_requires_grad |= x.requires_grad();
  // Without a graph to hang the backward on (evaluation, or inputs that need no gradient, when
  // the parameters inside would get none) the region just runs.
  if (!at::GradMode::is_enabled() || !any_requires_grad) return region(inputs);
  auto capsule = c10::make_intrusive<RegionCapsule>();
  capsule->region = region;
  capsule->tp = tp;
  for (const at::Tensor& x : inputs) capsule->input_requires_grad.push_back(x.requires_grad());
  if (draws_random) capsule->forward_states = GeneratorStates::now(tp, !inputs.empty() && inputs[0].is_cuda());
  return Recompute::apply(at::TensorList(inputs), capsule);
}

void discard_output_until_backward(const at::Tensor& output, const at::Tensor& hook, std::function<at::Tensor()> recompute) {
  if (!at::GradMode::is_enabled() || !hook.requires_grad() || !output.defined()) return;
  c10::Storage storage = output.storage();
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  const size_t nbytes = impl->nbytes();
  // A view of a larger buffer would take others' data with it; an empty or borrowed one saves nothing.
  if (nbytes == 0 || impl->allocator() == nullptr || !impl->resizable() || output.storage_offset() != 0 ||
      static_cast<size_t>(output.numel()) * output.element_size() != nbytes || !output.is_non_overlapping_and_dense()) {
    return;
  }
  impl->reset();  // the memory goes back to the allocator; the tensor keeps its shape
  hook.register_hook([storage, nbytes, sizes = output.sizes().vec(), strides = output.strides().vec(), options = output.options(),
                      recompute = std::move(recompute)](const at::Tensor&) {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    if (impl->nbytes() != 0) return;  // already back (a second backward through a kept graph)
    at::NoGradGuard no_grad;
    const at::Tensor values = recompute();
    impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
    impl->set_nbytes(nbytes);
    // Written through a tensor of its own over the storage: the saved tensor's version counter
    // stays as autograd recorded it.
    at::Tensor alias = at::empty({0}, options);
    alias.set_(storage, 0, sizes, strides);
    alias.copy_(values);
  });
}

}  // namespace megatron::tp
