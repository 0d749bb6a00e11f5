#include "pipeline/p2p.h"

#include <ATen/ATen.h>

namespace megatron::pipeline {

StageLink::StageLink(const dist::Group& pp, std::vector<int64_t> shape, at::TensorOptions options)
    : pp_(pp), shape_(std::move(shape)), options_(options) {}

StageLink::Received StageLink::exchange(const at::Tensor& to_next, const at::Tensor& to_prev, bool recv_prev,
                                        bool recv_next) const {
  Received got;
  const int size = pp_.size(), rank = pp_.rank();
  if (size == 1) return got;
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  if (recv_prev) got.from_prev = at::empty(shape_, options_);
  if (recv_next) got.from_next = at::empty(shape_, options_);
  std::vector<dist::Work> works;
  auto send_next = [&] { if (to_next.defined()) works.push_back(pp_.send_async(to_next, next)); };
  auto send_prev = [&] { if (to_prev.defined()) works.push_back(pp_.send_async(to_prev, prev)); };
  auto get_prev = [&] { if (recv_prev) works.push_back(pp_.recv_async(got.from_prev, prev)); };
  auto get_next = [&] { if (recv_next) works.push_back(pp_.recv_async(got.from_next, next)); };
  // Stage r's k-th transfer with stage r+1 meets that stage's k-th transfer with stage r.
  if (rank % 2 == 0) {
    send_next(); get_prev(); send_prev(); get_next();
  } else {
    get_prev(); send_next(); get_next(); send_prev();
  }
  for (auto& w : works) w.wait();
  return got;
}

}  // namespace megatron::pipeline
