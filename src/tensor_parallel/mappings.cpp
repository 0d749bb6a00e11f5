#include "tensor_parallel/mappings.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "tensor_parallel/group_capsule.h"

namespace megatron::tp {

at::Tensor all_gather_rows(const at::Tensor& x, const dist::Group& g) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] *= g.size();
  at::Tensor out = at::empty(shape, x.options());
  g.all_gather(out, x.contiguous());
  return out;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor all_reduce(const at::Tensor& x, const dist::Group& g) {
  at::Tensor out = x.contiguous().clone();
  g.all_reduce(out);
  return out;
}

at::Tensor reduce_scatter_rows(const at::Tensor& x, const dist::Group& g) {
  TORCH_CHECK(x.size(0) % g.size() == 0, "sequence length ", x.size(0), " is not divisible by the tensor-parallel size ",
              g.size());
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] /= g.size();
  at::Tensor out = at::empty(shape, x.options());
  g.reduce_scatter(out, x.contiguous());
  return out;
}

at::Tensor my_rows(const at::Tensor& x, const dist::Group& g) {
  TORCH_CHECK(x.size(0) % g.size() == 0, "sequence length ", x.size(0), " is not divisible by the tensor-parallel size ",
              g.size());
  return x.chunk(g.size(), 0)[g.rank()].contiguous();
}

at::Tensor my_columns(const at::Tensor& x, const dist::Group& g) {
  TORCH_CHECK(x.size(-1) % g.size() == 0, "last dimension ", x.size(-1), " is not divisible by the tensor-parallel size ",
              g.size());
  return x.chunk(g.size(), -1)[g.rank()].contiguous();
}

at::Tensor all_gather_columns(const at::Tensor& x, const dist::Group& g) {
  at::Tensor gathered = all_gather_rows(x.movedim(-1, 0), g);  // [tp * n, ...]
  return gathered.movedim(0, -1).contiguous();
}

// One autograd function per pair (forward, backward) of collectives.
template <at::Tensor (*Forward)(const at::Tensor&, const dist::Group&),
          at::Tensor (*Backward)(const at::Tensor&, const dist::Group&)>
struct Collective : torch::autograd::Function<Collective<Forward, Backward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const dist::Group& g) {
    ctx->saved_data["group"] = to_ivalue(g);
    return Forward(x, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {Backward(grads[0], group_of(ctx->saved_data["group"])), at::Tensor()};
  }
};

at::Tensor identity(const at::Tensor& x, const dist::Group&) { return x; }

at::Tensor exchange_rows(const at::Tensor& x, const dist::Group& g, const std::vector<int64_t>& out_splits,
                         const std::vector<int64_t>& in_splits) {
  std::vector<int64_t> shape = x.sizes().vec();
  if (!out_splits.empty()) {
    shape[0] = 0;
    for (int64_t n : out_splits) shape[0] += n;
  }
  at::Tensor out = at::empty(shape, x.options());
  g.all_to_all(out, x, out_splits, in_splits);
  return out;
}

struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const dist::Group& g,
                            const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits) {
    ctx->saved_data["group"] = to_ivalue(g);
    ctx->saved_data["out_splits"] = out_splits;
    ctx->saved_data["in_splits"] = in_splits;
    return exchange_rows(x, g, out_splits, in_splits);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> out_splits = ctx->saved_data["out_splits"].toIntVector();
    const std::vector<int64_t> in_splits = ctx->saved_data["in_splits"].toIntVector();
    // The gradient rows travel back: what came from member r returns to it.
    return {exchange_rows(grads[0].contiguous(), group_of(ctx->saved_data["group"]), in_splits, out_splits), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tp(const at::Tensor& x, const dist::Group& g) {
  return g.size() == 1 ? x : Collective<identity, all_reduce>::apply(x, g);
}
at::Tensor reduce_from_tp(const at::Tensor& x, const dist::Group& g) {
  return g.size() == 1 ? x : Collective<all_reduce, identity>::apply(x, g);
}
at::Tensor scatter_to_tp(const at::Tensor& x, const dist::Group& g) {
  return g.size() == 1 ? x : Collective<my_columns, all_gather_columns>::apply(x, g);
}
at::Tensor gather_from_tp(const at::Tensor& x, const dist::Group& g) {
  return g.size() == 1 ? x : Collective<all_gather_columns, my_columns>::apply(x, g);
}
at::Tensor scatter_to_sp(const at::Tensor& x, const dist::Group& g) {
  return g.size() == 1 ? x : Collective<my_rows, all_gather_rows>::apply(x, g);
}
at::Tensor gather_from_sp(const at::Tensor& x, const dist::Group& g) {
  return g.size() == 1 ? x : Collective<all_gather_rows, reduce_scatter_rows>::apply(x, g);
}
at::Tensor reduce_scatter_to_sp(const at::Tensor& x, const dist::Group& g) {
  return g.size() == 1 ? x : Collective<reduce_scatter_rows, all_gather_rows>::apply(x, g);
}
at::Tensor all_to_all(const at::Tensor& x, const dist::Group& g, const std::vector<int64_t>& out_splits,
                      const std::vector<int64_t>& in_splits) {
  return g.size() == 1 ? x : AllToAll::apply(x, g, out_splits, in_splits);
}

}  // namespace megatron::tp
