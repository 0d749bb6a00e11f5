#include "kernels/attention_ops.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "kernels/cuda_dispatch.h"

namespace megatron::kernels {

namespace {

void attention_merge_composite(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& part_out, const at::Tensor& part_lse) {
  const at::Tensor merged = at::logaddexp(lse, part_lse);
  // Rows neither side saw anything in stay at zero (exp(-inf - -inf) is NaN).
  const at::Tensor kept = at::exp(lse - merged).nan_to_num_(0.0).unsqueeze(-1);  // [b, H, rows, 1]
  const at::Tensor added = at::exp(part_lse - merged).nan_to_num_(0.0).unsqueeze(-1);
  // Two passes over the rows' outputs, the block's read in its own dtype (no fp32 copy of it).
  out.mul_(kept).addcmul_(part_out, added);
  lse.copy_(merged);
}

}  // namespace

void attention_merge(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& part_out, const at::Tensor& part_lse,
                     Impl impl) {
  TORCH_CHECK(out.dim() == 4 && lse.dim() == 3 && part_out.sizes() == out.sizes() && part_lse.sizes() == lse.sizes() &&
                  lse.size(0) == out.size(0) && lse.size(1) == out.size(1) && lse.size(2) == out.size(2),
              "attention_merge: out ", out.sizes(), " / lse ", lse.sizes(), " and the block's ", part_out.sizes(), " / ",
              part_lse.sizes(), " must be [b, H, rows, dv] and [b, H, rows] alike");
  TORCH_CHECK(out.scalar_type() == at::kFloat && lse.scalar_type() == at::kFloat && part_lse.scalar_type() == at::kFloat,
              "attention_merge: the accumulator and the log-sum-exps are fp32");
  const bool kernel = uses_kernel(part_out, impl) && out.is_cuda() && out.stride(3) == 1 && part_out.stride(3) == 1;
  if (!kernel) return attention_merge_composite(out, lse, part_out, part_lse);
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::AttentionMergeArgs a{};
  a.out = out.data_ptr<float>();
  a.lse = lse.data_ptr<float>();
  a.part_out = part_out.data_ptr();
  a.part_lse = part_lse.data_ptr<float>();
  a.part_dtype = storage_type(part_out);
  a.b = out.size(0), a.heads = out.size(1), a.rows = out.size(2), a.dv = out.size(3);
  a.out_stride_b = out.stride(0), a.out_stride_h = out.stride(1), a.out_stride_row = out.stride(2);
  a.lse_stride_b = lse.stride(0), a.lse_stride_h = lse.stride(1), a.lse_stride_row = lse.stride(2);
  a.part_stride_b = part_out.stride(0), a.part_stride_h = part_out.stride(1), a.part_stride_row = part_out.stride(2);
  a.part_lse_stride_b = part_lse.stride(0), a.part_lse_stride_h = part_lse.stride(1), a.part_lse_stride_row = part_lse.stride(2);
  cuda::attention_merge(a, current_stream());
#endif
}

namespace {

#ifdef MEGATRON_WITH_CUDA_KERNELS
static_assert(kMostCombinedParts == cuda::kMaxCombinedParts);
#endif

at::Tensor attention_combine_composite(const std::vector<CombinedPart>& parts, int64_t rows, const at::Tensor& lse_out,
                                       at::ScalarType dtype) {
  const at::Tensor& first = parts.front().out;
  const at::TensorOptions fp32 = first.options().dtype(at::kFloat);
  at::Tensor out = at::zeros({first.size(0), first.size(1), rows, first.size(3)}, fp32);
  if (!parts.front().lse.defined()) {
    for (const CombinedPart& p : parts) out.narrow(2, p.first_row, p.out.size(2)).add_(p.out);
    return out.to(dtype);
  }
  at::Tensor lse = at::full({first.size(0), first.size(1), rows}, -std::numeric_limits<double>::infinity(), fp32);
  for (const CombinedPart& p : parts) {
    attention_merge_composite(out.narrow(2, p.first_row, p.out.size(2)), lse.narrow(2, p.first_row, p.out.size(2)), p.out, p.lse);
  }
  if (lse_out.defined()) lse_out.copy_(lse);
  return out.to(dtype);
}

}  // namespace

at::Tensor attention_combine(const std::vector<CombinedPart>& parts, int64_t rows, const at::Tensor& lse_out, Impl impl) {
  TORCH_CHECK(!parts.empty(), "attention_combine: no parts");
  const bool by_lse = parts.front().lse.defined();
  bool one_dtype = true, kernel = parts.size() <= size_t(kMostCombinedParts);
  const at::Tensor& first = parts.front().out;
  for (const CombinedPart& p : parts) {
    TORCH_CHECK(p.out.dim() == 4 && p.out.size(0) == first.size(0) && p.out.size(1) == first.size(1) && p.out.size(3) == first.size(3) &&
                    p.first_row >= 0 && p.first_row + p.out.size(2) <= rows && p.lse.defined() == by_lse &&
                    (!by_lse || (p.lse.scalar_type() == at::kFloat && p.lse.dim() == 3 && p.lse.size(2) == p.out.size(2))),
                "attention_combine: a part ", p.out.sizes(), " at row ", p.first_row, " of ", rows,
                " is not [b, H, rows_i, dv] like the first, inside the rows, with an fp32 log-sum-exp iff the others have");
    one_dtype = one_dtype && p.out.scalar_type() == first.scalar_type();
    kernel = kernel && uses_kernel(p.out, impl) && p.out.is_cuda() && p.out.stride(3) == 1;
  }
  const at::ScalarType dtype = one_dtype ? first.scalar_type() : at::kFloat;
  TORCH_CHECK(!lse_out.defined() || (by_lse && lse_out.scalar_type() == at::kFloat && lse_out.dim() == 3 && lse_out.size(2) == rows),
              "attention_combine: lse_out [b, H, rows] fp32, for parts with log-sum-exps");
  if (!kernel || !one_dtype) return attention_combine_composite(parts, rows, lse_out, dtype);
  at::Tensor out = at::empty({first.size(0), first.size(1), rows, first.size(3)}, first.options());
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::AttentionCombineArgs a{};
  a.out = out.data_ptr();
  a.out_lse = lse_out.defined() ? lse_out.data_ptr<float>() : nullptr;
  a.dtype = storage_type(out);
  a.b = out.size(0), a.heads = out.size(1), a.rows = rows, a.dv = out.size(3);
  a.out_stride_b = out.stride(0), a.out_stride_h = out.stride(1), a.out_stride_row = out.stride(2);
  if (lse_out.defined()) a.lse_stride_b = lse_out.stride(0), a.lse_stride_h = lse_out.stride(1), a.lse_stride_row = lse_out.stride(2);
  a.parts = int(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const CombinedPart& p = parts[i];
    cuda::AttentionCombineArgs::Part& q = a.part[i];
    q.out = p.out.data_ptr();
    q.lse = by_lse ? p.lse.data_ptr<float>() : nullptr;
    q.first_row = p.first_row, q.rows = p.out.size(2);
    q.stride_b = p.out.stride(0), q.stride_h = p.out.stride(1), q.stride_row = p.out.stride(2);
    if (by_lse) q.lse_stride_b = p.lse.stride(0), q.lse_stride_h = p.lse.stride(1), q.lse_stride_row = p.lse.stride(2);
  }
  cuda::attention_combine(a, current_stream());
#endif
  return out;
}

void add_key_value_grads(const at::Tensor& sum_k, const at::Tensor& sum_v, const at::Tensor& dk, const at::Tensor& dv, bool overwrite,
                         Impl impl) {
  TORCH_CHECK(sum_k.dim() == 4 && sum_k.sizes() == dk.sizes() && sum_v.dim() == 4 && sum_v.sizes() == dv.sizes(),
              "add_key_value_grads: sums ", sum_k.sizes(), " / ", sum_v.sizes(), " and gradients ", dk.sizes(), " / ", dv.sizes(),
              " must be [b, G, rows, d] alike");
  TORCH_CHECK(sum_k.scalar_type() == at::kFloat && sum_v.scalar_type() == at::kFloat && dk.scalar_type() == dv.scalar_type(),
              "add_key_value_grads: fp32 sums, key and value gradients of one dtype");
  // Channels contiguous in all four; rows at any stride (the ring's views, FA2's transposed grads).
  auto channels_contiguous = [](const at::Tensor& t) { return t.size(3) <= 1 || t.stride(3) == 1; };
  const bool kernel = uses_kernel(dk, impl) && sum_k.is_cuda() && channels_contiguous(sum_k) && channels_contiguous(sum_v) &&
                      channels_contiguous(dk) && channels_contiguous(dv);
  if (!kernel) {
    for (auto [sum, grad] : {std::pair{sum_k, dk}, std::pair{sum_v, dv}}) overwrite ? sum.copy_(grad) : sum.add_(grad);
    return;
  }
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::KeyValueGradsArgs a{};
  const at::Tensor* sums[2] = {&sum_k, &sum_v};
  const at::Tensor* grads[2] = {&dk, &dv};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor &sum = *sums[i], &grad = *grads[i];
    a.pair[i] = {sum.data_ptr<float>(), grad.data_ptr(), sum.size(0), sum.size(1), sum.size(2), sum.size(3),
                 sum.stride(0), sum.stride(1), sum.stride(2), grad.stride(0), grad.stride(1), grad.stride(2)};
  }
  a.dtype = storage_type(dk);
  a.overwrite = overwrite;
  cuda::add_key_value_grads(a, current_stream());
#endif
}

bool qkv_rope_into_cache_takes(const at::Tensor& qkv, int64_t head_dim, const at::Tensor& cos) {
  // 16-byte packs of half a head (the kernel's launcher checks the strides and pointers again).
  return uses_kernel(qkv) && qkv.scalar_type() != at::kFloat && qkv.dim() == 4 && qkv.stride(3) == 1 && head_dim % 16 == 0 &&
         cos.scalar_type() == at::kFloat && cos.dim() == 4 && cos.size(-1) == head_dim && cos.stride(-1) == 1;
}

at::Tensor qkv_rope_into_cache(const at::Tensor& qkv, int64_t heads_per_group, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& k_store, const at::Tensor& v_store, const at::Tensor& store_rows) {
  const int64_t s = qkv.size(0), b = qkv.size(1), groups = qkv.size(2), d = qkv.size(3) / (heads_per_group + 2);
  TORCH_CHECK(qkv_rope_into_cache_takes(qkv, d, cos) && qkv.size(3) == (heads_per_group + 2) * d, "qkv_rope_into_cache: qkv ", qkv.sizes(),
              " is not [s, b, G, (P + 2) d] of a kind the kernel takes");
  TORCH_CHECK(k_store.dim() == 3 && k_store.sizes() == v_store.sizes() && k_store.strides() == v_store.strides() &&
                  k_store.size(1) == groups && k_store.size(2) == d && k_store.stride(2) == 1 && k_store.scalar_type() == qkv.scalar_type(),
              "qkv_rope_into_cache: stores [rows, G, d] in qkv's dtype");
  TORCH_CHECK(store_rows.scalar_type() == at::kLong && store_rows.is_contiguous() && store_rows.numel() == b * s,
              "qkv_rope_into_cache: store_rows [b s] int64");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.size(-1) == d && cos.size(0) >= s && cos.stride(-1) == 1 && sin.strides() == cos.strides(),
              "qkv_rope_into_cache: fp32 tables [>= s, 1 or b, 1, d]");
  at::Tensor q = at::empty({s, b, groups * heads_per_group, d}, qkv.options());
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::QkvIntoCacheArgs a{};
  a.qkv = qkv.data_ptr();
  a.q_out = q.data_ptr();
  a.k_store = k_store.data_ptr();
  a.v_store = v_store.data_ptr();
  a.store_rows = store_rows.data_ptr<int64_t>();
  a.cos = cos.data_ptr<float>();
  a.sin = sin.data_ptr<float>();
  a.s = s, a.b = b, a.groups = groups, a.heads_per_group = heads_per_group, a.d = d;
  a.x_stride_s = qkv.stride(0), a.x_stride_b = qkv.stride(1), a.x_stride_group = qkv.stride(2);
  a.store_stride_row = k_store.stride(0), a.store_stride_group = k_store.stride(1);
  a.table_stride_s = cos.stride(0);
  a.table_stride_b = cos.size(1) == 1 ? 0 : cos.stride(1);
  a.dtype = storage_type(qkv);
  cuda::rope_qkv_into_cache(a, current_stream());
#endif
  return q;
}

bool decode_attention_takes(const at::Tensor& q, const at::Tensor& k_store, const at::Tensor& v_store) {
  if (!uses_kernel(q) || q.scalar_type() == at::kFloat || q.dim() != 3 || !q.is_contiguous()) return false;
  const int64_t heads = q.size(1), d = q.size(2);
  if (d != 64 && d != 128) return false;
  for (const at::Tensor& store : {k_store, v_store}) {
    if (store.dim() != 3 || store.scalar_type() != q.scalar_type() || store.device() != q.device() || store.size(2) != d ||
        store.stride(2) != 1 || store.stride(1) != d || store.stride(0) % 8 != 0 || reinterpret_cast<uintptr_t>(store.data_ptr()) % 16 != 0) {
      return false;
    }
  }
  const int64_t groups = k_store.size(1);
  return v_store.size(1) == groups && heads % groups == 0 && heads / groups <= 8 && reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0;
}

int64_t decode_attention_tickets(int64_t batch, int64_t groups) { return batch * groups; }

bool decode_attention_merges_in_cluster(int64_t longest, int64_t batch, int64_t groups) {
#ifdef MEGATRON_WITH_CUDA_KERNELS
  return cuda::decode_attention_merges_in_cluster(longest, batch, groups);
#else
  (void)longest, (void)batch, (void)groups;
  return false;
#endif
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_store, const at::Tensor& v_store, const at::Tensor& key_starts,
                            const at::Tensor& key_counts, int64_t longest, double scale, const at::Tensor& tickets) {
  TORCH_CHECK(decode_attention_takes(q, k_store, v_store), "decode_attention: q ", q.sizes(), " and stores ", k_store.sizes(),
              " are not of a kind the kernel takes (decode_attention_takes)");
  const int64_t b = q.size(0), groups = k_store.size(1);
  for (const at::Tensor* t : {&key_starts, &key_counts, &tickets}) {
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous() && t->device() == q.device(), "decode_attention: key_starts, key_counts "
                "and tickets are int32 on q's device");
  }
  TORCH_CHECK(key_starts.numel() >= b && key_counts.numel() >= b && tickets.numel() >= decode_attention_tickets(b, groups),
              "decode_attention: ", b, " sequences need as many key starts and counts and ", decode_attention_tickets(b, groups), " tickets");
  at::Tensor out = at::empty_like(q);  // [b, H, d]
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::DecodeAttentionArgs a{};
  a.q = q.data_ptr();
  a.k = k_store.data_ptr();
  a.v = v_store.data_ptr();
  a.out = out.data_ptr();
  a.key_starts = key_starts.data_ptr<int32_t>();
  a.key_counts = key_counts.data_ptr<int32_t>();
  a.tickets = tickets.data_ptr<int32_t>();
  a.dtype = storage_type(q);
  a.batch = b, a.heads = q.size(1), a.groups = groups, a.heads_per_group = q.size(1) / groups, a.head_dim = q.size(2);
  a.k_row_stride = k_store.stride(0), a.v_row_stride = v_store.stride(0);
  a.splits = cuda::decode_attention_splits(longest, b, groups);
  a.merge_in_cluster = decode_attention_merges_in_cluster(longest, b, groups);
  a.scale = static_cast<float>(scale);
  const at::Tensor partials = at::empty({cuda::decode_attention_partial_floats(a)}, q.options().dtype(at::kFloat));
  a.partials = partials.data_ptr<float>();
  cuda::decode_attention(a, current_stream());
#else
  (void)longest, (void)scale;
#endif
  return out;
}

}  // namespace megatron::kernels
