#include "distributed/process_group.h"

#include <ATen/ATen.h>

#include "distributed/process_group_impl.h"

namespace megatron::dist {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Avg: return c10d::ReduceOp::AVG;
    default: return c10d::ReduceOp::SUM;
  }
}

Work pending(c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> tensors) {
  auto impl = std::make_shared<Work::Impl>();
  impl->work = std::move(work);
  impl->keep_alive = std::move(tensors);
  return Work(std::move(impl));
}

void check_contiguous(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_contiguous(), "process group ", what, ": tensors must be contiguous");
}

}  // namespace

void Work::wait() {
  if (impl_ && impl_->work) impl_->work->wait();
  impl_.reset();
}

Group::Group() : impl_(std::make_shared<Impl>()) {}

bool Group::supports_avg() const { return impl_->supports_avg; }

int Group::size() const { return impl_->size; }
int Group::rank() const { return impl_->rank; }
const std::vector<int>& Group::global_ranks() const { return impl_->global_ranks; }

std::string Group::describe() const {
  std::string s = "[";
  for (size_t i = 0; i < impl_->global_ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(impl_->global_ranks[i]);
  return s + "]";
}

void Group::all_reduce(at::Tensor& t, ReduceOp op) const {
  if (size() == 1) return;
  check_contiguous(t, "all_reduce");
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  impl_->backend->allreduce(v, o)->wait();
}

Work Group::all_reduce_async(at::Tensor& t, ReduceOp op) const {
  if (size() == 1) return Work();
  check_contiguous(t, "all_reduce");
  TORCH_CHECK(op != ReduceOp::Avg || supports_avg(), "this backend cannot average in a collective");
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  return pending(impl_->backend->allreduce(v, o), {t});
}

Work Group::all_gather_async(at::Tensor& out, const at::Tensor& in) const {
  TORCH_CHECK(out.numel() == in.numel() * size(), "all_gather: output holds ", out.numel(), " elements, expected ",
              in.numel() * size());
  if (size() == 1) {
    out.copy_(in.view(out.sizes()));
    return Work();
  }
  check_contiguous(out, "all_gather");
  at::Tensor input = in.contiguous();
  return pending(impl_->backend->_allgather_base(out, input), {out, input});
}

void Group::all_gather(at::Tensor& out, const at::Tensor& in) const { all_gather_async(out, in).wait(); }

Work Group::reduce_scatter_async(at::Tensor& out, const at::Tensor& in, ReduceOp op) const {
  TORCH_CHECK(in.numel() == out.numel() * size(), "reduce_scatter: input holds ", in.numel(), " elements, expected ",
              out.numel() * size());
  if (size() == 1) {
    out.copy_(in.view(out.sizes()));
    return Work();
  }
  check_contiguous(out, "reduce_scatter");
  TORCH_CHECK(op != ReduceOp::Avg || supports_avg(), "this backend cannot average in a collective");
  at::Tensor input = in.contiguous();
  c10d::ReduceScatterOptions o;
  o.reduceOp = to_c10d(op);
  return pending(impl_->backend->_reduce_scatter_base(out, input, o), {out, input});
}

void Group::reduce_scatter(at::Tensor& out, const at::Tensor& in) const { reduce_scatter_async(out, in).wait(); }

Work Group::all_to_all_async(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                             const std::vector<int64_t>& in_splits) const {
  auto check_splits = [&](const std::vector<int64_t>& splits, const at::Tensor& t, const char* which) {
    if (splits.empty()) {
      TORCH_CHECK(t.dim() > 0 && t.size(0) % size() == 0, "all_to_all: ", which, " has ", t.dim() > 0 ? t.size(0) : 0,
                  " rows, not divisible into ", size(), " equal blocks");
      return;
    }
    TORCH_CHECK(int(splits.size()) == size(), "all_to_all: ", splits.size(), " ", which, " splits for a group of ", size());
    int64_t rows = 0;
    for (int64_t n : splits) {
      TORCH_CHECK(n >= 0, "all_to_all: negative ", which, " split");
      rows += n;
    }
    TORCH_CHECK(rows == t.size(0), "all_to_all: ", which, " splits sum to ", rows, " rows, the tensor has ", t.size(0));
  };
  check_splits(in_splits, in, "input");
  check_splits(out_splits, out, "output");
  TORCH_CHECK(in.dim() == out.dim() && in.sizes().slice(1).equals(out.sizes().slice(1)),
              "all_to_all: input and output rows differ in shape");
  if (size() == 1) {
    out.copy_(in);
    return Work();
  }
  check_contiguous(out, "all_to_all");
  at::Tensor input = in.contiguous();
  std::vector<int64_t> outs = out_splits, ins = in_splits;  // c10d takes them by non-const reference
  return pending(impl_->backend->alltoall_base(out, input, outs, ins), {out, input});
}

void Group::all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                       const std::vector<int64_t>& in_splits) const {
  all_to_all_async(out, in, out_splits, in_splits).wait();
}

void Group::broadcast(at::Tensor& t, int root) const {
  if (size() == 1) return;
  check_contiguous(t, "broadcast");
  std::vector<at::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  impl_->backend->broadcast(v, o)->wait();
}

void Group::barrier() const {
  if (size() == 1) return;
  impl_->backend->barrier()->wait();
}

void Group::send(const at::Tensor& t, int peer) const { send_async(t, peer).wait(); }

void Group::recv(at::Tensor& t, int peer) const { recv_async(t, peer).wait(); }

Work Group::send_async(const at::Tensor& t, int peer) const {
  TORCH_CHECK(size() > 1, "send within a group of one process");
  TORCH_CHECK(peer >= 0 && peer < size() && peer != rank(), "send: bad peer ", peer, " in a group of ", size());
  std::vector<at::Tensor> v{t.contiguous()};
  return pending(impl_->backend->send(v, peer, /*tag=*/0), {v[0]});
}

Work Group::recv_async(at::Tensor& t, int peer) const {
  TORCH_CHECK(size() > 1, "recv within a group of one process");
  TORCH_CHECK(peer >= 0 && peer < size() && peer != rank(), "recv: bad peer ", peer, " in a group of ", size());
  check_contiguous(t, "recv");
  std::vector<at::Tensor> v{t};
  return pending(impl_->backend->recv(v, peer, /*tag=*/0), {t});
}

}  // namespace megatron::dist
