// A process group: the ranks of one parallel dimension and the c10d backend (Gloo on CPU, NCCL
// on CUDA) they talk over. A cheap handle; copies share the backend. The group of a process
// alone has no backend and every collective on it is the identity, so single-process code
// runs the same calls as parallel code. c10d stays out of this header.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace megatron::dist {

enum class ReduceOp { Sum, Max, Avg };  // Avg: NCCL only (see supports_avg)

// An operation in flight. wait() blocks until it is done (NCCL: until the current stream is
// ordered after it). A default-constructed Work is already done.
class Work {
 public:
  Work() = default;
  void wait();
  struct Impl;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

class Group {
 public:
  Group();  // this process alone

  int size() const;
  int rank() const;                          // within the group
  const std::vector<int>& global_ranks() const;
  std::string describe() const;              // "[0, 2]"
  bool supports_avg() const;                 // the backend averages in the collective (NCCL)
  // Whether all_gather / reduce_scatter may take as input (output) this rank's block of their
  // output (input), saving a copy (NCCL; Gloo's may not alias).
  bool supports_in_place() const { return supports_avg(); }

  // In place, over all members.
  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) const;
  Work all_reduce_async(at::Tensor& t, ReduceOp op = ReduceOp::Sum) const;
  // out [size * n, ...] = the members' `in` [n, ...] concatenated along dim 0, in group rank order.
  void all_gather(at::Tensor& out, const at::Tensor& in) const;
  Work all_gather_async(at::Tensor& out, const at::Tensor& in) const;
  // out [n, ...] = this rank's n-row block of the sum of the members' `in` [size * n, ...].
  void reduce_scatter(at::Tensor& out, const at::Tensor& in) const;
  Work reduce_scatter_async(at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::Sum) const;
  // All-to-all along dim 0: `in` holds in_splits[r] rows for member r, back to back in group
  // rank order; `out` receives out_splits[r] rows from member r, likewise. Empty splits: equal
  // blocks (in and out of the same shape, dim 0 divisible by size()).
  void all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits = {},
                  const std::vector<int64_t>& in_splits = {}) const;
  Work all_to_all_async(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits = {},
                        const std::vector<int64_t>& in_splits = {}) const;
  void broadcast(at::Tensor& t, int root) const;  // root: a rank within the group
  void barrier() const;
  // Point to point; peer is a rank within the group. Messages between two ranks are matched
  // in the order they are posted.
  void send(const at::Tensor& t, int peer) const;
  void recv(at::Tensor& t, int peer) const;
  Work send_async(const at::Tensor& t, int peer) const;
  Work recv_async(at::Tensor& t, int peer) const;

  struct Impl;
  explicit Group(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace megatron::dist
