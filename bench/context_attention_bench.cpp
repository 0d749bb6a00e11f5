// Issue #22's attention figure on one GPU: the work of ring attention (--cp-comm-type p2p) for a
// sequence of S tokens split over CP ranks, i.e. every rank's blocks (partial attention over chunk
// pairs plus the log-sum-exp merge, forward and backward from the merged statistics), run one
// after another, against one fused causal attention (SDPA, flash) over the same S tokens, forward
// and backward. Communication is not in it: on one GPU there is none to time; the ratio says what
// cutting attention into the ring's blocks costs. The blocks in cuDNN's kernels (FA2's where cuDNN
// fails), next to each kernel over the whole sequence as one block and SDPA's own choice named;
// the ring one step a block and with its steps grouped as ring_attention groups them
// (cp::ring_steps_per_block, or --steps-per-block), and the grouped blocks' kernels alone (what the
// merges, gradient sums and casts add is the difference).
// Then packed documents of uneven lengths (--document-tokens on average; 0 skips it): the ring's
// blocks cut into their documents (FA2's variable-length kernel per block) against one
// variable-length call over every document of the sequence.
//   megatron_bench_context_attention [--heads 32] [--groups 4] [--dim 64] [--iters 10] [--document-tokens 4096]
//                                    [--causal 1]   (0: the packed documents' table alone)
//                                    [--steps-per-block 0]   (0: ring_attention's choice)
//                                    [--longest 131072] [--shortest 32768]   (the sequences of 32k, 64k, 128k between them)
//                                    [--rounds 3]   (each round the fused call timed around each of the ring's
//                                                    variants, fused-ring-ring-fused: medians, the ratios each
//                                                    round's over the fused call's around it)
//                                    [--block-kinds 0]   (1: each kind of block's kernels against its share,
//                                                         and the ring's arithmetic around them piece by piece)
// prints one table row per (S, CP).
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cmath>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "context_parallel/block_results.h"
#include "context_parallel/chunks.h"
#include "context_parallel/document_blocks.h"
#include "context_parallel/partial_attention.h"
#include "context_parallel/ring_attention.h"
#include "kernels/attention_ops.h"

namespace {

using namespace megatron;

// Without CUDA headers: the bench builds wherever the library does, and runs where CUDA is.
void synchronize() { c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->synchronizeDevice(0); }

double seconds_per_call(const std::function<void()>& f, int iters) {
  f();  // warm-up (kernel selection, allocator)
  synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

// Several timings of the same work, alternated with others round by round (the card's clock
// drifts as it warms: a baseline timed only first would be favoured); the median round.
struct Rounds {
  std::vector<double> seconds;
  void add(double s) { seconds.push_back(s); }
  double median() const { return median_of(seconds); }
  // One round of `work` against `base` timed around it, base-work-work-base: each ratio then pairs
  // timings taken next to each other, the drift over the four cancels to first order, and no
  // variant is timed only after another (session 47 on an H100: the grouped ring timed right after
  // the one-step-a-block ring ran 2 ms, 5%, slower at 32k CP 8 than timed right after the fused call).
  void add_paired(Rounds& base, const std::function<void()>& work, const std::function<void()>& base_work, int iters) {
    const double b1 = seconds_per_call(base_work, iters), w1 = seconds_per_call(work, iters), w2 = seconds_per_call(work, iters),
                 b2 = seconds_per_call(base_work, iters);
    add((w1 + w2) / 2);
    base.add((b1 + b2) / 2);
  }
  // The median over rounds of this round's time over `base`'s in the same round: each ratio pairs
  // two timings taken moments apart, so the card's drift between rounds (it slows as it warms)
  // cancels, where a ratio of the two medians would carry it.
  double median_ratio_to(const Rounds& base) const {
    std::vector<double> ratios;
    for (size_t i = 0; i < seconds.size() && i < base.seconds.size(); ++i) ratios.push_back(seconds[i] / base.seconds[i]);
    return median_of(ratios);
  }
};

// Each rank's rows of q, k, v and dout (chunks i and 2cp-1-i), split once outside the timing:
// a rank of the ring holds its own as they are.
struct RankRows {
  std::vector<at::Tensor> q, k, v, dout;
  RankRows(const at::Tensor& q_all, const at::Tensor& k_all, const at::Tensor& v_all, const at::Tensor& dout_all, int cp) {
    for (int rank = 0; rank < cp; ++rank) {
      q.push_back(cp::rank_rows(q_all, 2, cp, rank));
      k.push_back(cp::rank_rows(k_all, 2, cp, rank));
      v.push_back(cp::rank_rows(v_all, 2, cp, rank));
      dout.push_back(cp::rank_rows(dout_all, 2, cp, rank));
    }
  }
};

// One step's share of an owner's key and value gradients (rows [first_key, first_key + rows) of
// them) into the owner's fp32 sums ([b, G, 2c, d] each), started as the ring starts its own
// (ring_attention.cpp's KeyValueShare): an undefined sum is written over where the share covers
// every row, else zeros first. Impl::Composite: ATen's zeros and add_, as the ring did before
// session 46 (always zeros first).
void add_share(at::Tensor& sum_k, at::Tensor& sum_v, at::IntArrayRef k_shape, at::IntArrayRef v_shape, int64_t first_key,
               const at::Tensor& dk, const at::Tensor& dv, kernels::Impl impl = kernels::Impl::Auto) {
  const at::TensorOptions fp32 = dk.options().dtype(at::kFloat);
  const bool start = !sum_k.defined(),
             covers_all = impl == kernels::Impl::Auto && first_key == 0 && dk.size(2) == k_shape[2];
  if (start) {
    sum_k = covers_all ? at::empty(k_shape, fp32) : at::zeros(k_shape, fp32);
    sum_v = covers_all ? at::empty(v_shape, fp32) : at::zeros(v_shape, fp32);
  }
  kernels::add_key_value_grads(sum_k.narrow(2, first_key, dk.size(2)), sum_v.narrow(2, first_key, dv.size(2)), dk, dv,
                               start && covers_all, impl);
}

// Every rank's ring steps for one sequence, as ring_attention runs them (steps_per_block of one
// kind to a block, cp::ring_groups): forward blocks folded into the output (cp::BlockOutputs:
// combined in one pass when a rank has at most four, else merged into an fp32 accumulator and
// cast back); then their backward, the query gradients likewise (cp::BlockQueryGrads), the key
// and value gradients added into fp32 sums per owner (kernels::add_key_value_grads, as the ring
// adds its shares) and cast back. Under packed documents (non-null) one step a
// block, each piece by piece, as the ring does. bookkeeping false: the blocks' kernels alone (no
// merges, sums or casts; the backward reads `merged`, which it needs): what the ring's own
// arithmetic around the kernels costs is the difference. runs:
// which groups run (others skipped); merged: each rank's merged output and statistics, filled by a
// run given an empty vector and read by the backward of a run given a full one.
void ring_work(const RankRows& r, int cp, int steps_per_block, double scale, cp::BlockKernel kernel,
               const cp::PackedDocuments* documents = nullptr, bool bookkeeping = true,
               const std::function<bool(const cp::RingGroup&)>& runs = nullptr, std::vector<cp::PartialAttention>* merged = nullptr) {
  const int64_t c = r.q[0].size(2) / 2;
  // [b, G, 2c, d] fp32 per owner, started by its first share (add_share)
  std::vector<at::Tensor> dk(static_cast<size_t>(cp)), dv(static_cast<size_t>(cp));
  for (int rank = 0; rank < cp; ++rank) {
    const at::Tensor &mq = r.q[size_t(rank)], &mdout = r.dout[size_t(rank)];
    std::vector<cp::BlockDocuments> pieces;  // per step, as ring_attention cuts them
    for (int step = 0; documents && step < cp; ++step) {
      const cp::RingBlock blk = cp::ring_block(step, rank, cp, c);
      pieces.push_back(cp::shared_documents(*documents, cp::rank_row_positions(rank, cp, c, blk.first_query, blk.queries),
                                            cp::rank_row_positions(blk.owner, cp, c, blk.first_key, blk.keys), mq.device()));
    }
    // The rank's blocks; under documents only the rows they share (none: skipped).
    std::vector<cp::RingGroup> groups = cp::ring_groups(rank, cp, c, documents ? 1 : steps_per_block);
    for (cp::RingGroup& group : groups) {
      if (documents) group = cp::shared_rows(group, pieces[size_t(group.first_step)]);
      if (runs && !runs(group)) group.queries = 0;  // left out (the kinds' table: kernels alone)
    }
    auto owner_of = [&](int step) { return (rank - step + cp) % cp; };
    auto keys = [&](const std::vector<at::Tensor>& x, const cp::RingGroup& group) {
      std::vector<at::Tensor> per_step;
      for (int i = 0; i < group.steps; ++i) per_step.push_back(x[size_t(owner_of(group.first_step + i))]);
      return cp::group_rows(group, per_step);
    };
    int computed = 0;
    for (const cp::RingGroup& group : groups) computed += group.queries > 0 ? 1 : 0;
    cp::BlockOutputs outputs(computed);
    for (const cp::RingGroup& group : groups) {
      if (group.queries == 0) continue;
      const at::Tensor bk = keys(r.k, group), bv = keys(r.v, group), bq = mq.narrow(2, group.first_query, group.queries);
      cp::PartialAttention part = documents ? cp::attend_documents(bq, bk, bv, pieces[size_t(group.first_step)], group.causal, scale, kernel)
                                            : cp::attend_block(bq, bk, bv, group.causal, at::Tensor(), scale, kernel);
      if (bookkeeping) outputs.add(std::move(part), group.first_query);
    }
    const bool given = merged && merged->size() == size_t(cp);  // the merged results of an earlier run
    TORCH_CHECK(bookkeeping || given, "ring_work: the kernels alone need each rank's merged results (a run that fills `merged` first)");
    const cp::PartialAttention acc = given ? (*merged)[size_t(rank)] : outputs.finish(2 * c, mq.scalar_type());
    if (merged && !given) merged->push_back(acc);
    const at::Tensor& out = acc.out;
    cp::BlockQueryGrads dq(computed);
    for (const cp::RingGroup& group : groups) {
      if (group.queries == 0) continue;
      const at::Tensor bk = keys(r.k, group), bv = keys(r.v, group);
      const at::Tensor bdout = mdout.narrow(2, group.first_query, group.queries), bq = mq.narrow(2, group.first_query, group.queries),
                       bout = out.narrow(2, group.first_query, group.queries), blse = acc.lse.narrow(2, group.first_query, group.queries);
      const cp::BlockGrads g =
          documents ? cp::attend_documents_backward(bdout, bq, bk, bv, bout, blse, pieces[size_t(group.first_step)], group.causal, scale, kernel)
                    : cp::attend_block_backward(bdout, bq, bk, bv, bout, blse, group.causal, at::Tensor(), scale, kernel);
      if (!bookkeeping) continue;
      dq.add(g.dq, group.first_query);
      for (int i = 0; i < group.steps; ++i) {
        const size_t owner = size_t(owner_of(group.first_step + i));
        add_share(dk[owner], dv[owner], r.k[0].sizes(), r.v[0].sizes(), group.first_key, g.dk.narrow(2, i * group.keys, group.keys),
                  g.dv.narrow(2, i * group.keys, group.keys));
      }
    }
    if (bookkeeping) (void)dq.finish(2 * c, mq.scalar_type());
  }
  for (int owner = 0; bookkeeping && owner < cp; ++owner) {
    if (!dk[size_t(owner)].defined()) continue;  // under documents a rank's keys may meet no query
    (void)dk[size_t(owner)].to(r.k[0].scalar_type());
    (void)dv[size_t(owner)].to(r.v[0].scalar_type());
  }
}

// What the ring does around its kernels, each piece alone over every rank (the blocks' results
// stand-ins of their shapes, as cuDNN returns them): the forward's combine of a rank's blocks, the
// query gradients' sum, the key/value gradient shares into the owners' fp32 sums (this project's
// kernel, and ATen's zeros and mixed-dtype add_ as the ring did before session 46), and the sums'
// casts back. One line each: ms for all ranks, and the bytes it must move over that time.
std::string bookkeeping_rows(int64_t seq, int cp, int steps_per_block, int64_t heads, int64_t groups, int64_t dim, int iters, int rounds) {
  const int64_t c = seq / (2 * cp);
  const at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16), fp32 = bf16.dtype(at::kFloat);
  struct Rank {
    std::vector<kernels::CombinedPart> outs, grads;
    std::vector<std::pair<cp::RingGroup, std::pair<at::Tensor, at::Tensor>>> key_grads;  // each group's dk, dv
  };
  std::vector<Rank> ranks(static_cast<size_t>(cp));
  double combine_bytes = 0, grad_bytes = 0, sum_bytes = 0;
  for (int rank = 0; rank < cp; ++rank) {
    Rank& r = ranks[size_t(rank)];
    for (const cp::RingGroup& g : cp::ring_groups(rank, cp, c, steps_per_block)) {
      r.outs.push_back({at::randn({1, heads, g.queries, dim}, bf16), at::randn({1, heads, g.queries}, fp32), g.first_query});
      r.grads.push_back({at::randn({1, heads, g.queries, dim}, bf16), at::Tensor(), g.first_query});
      r.key_grads.push_back({g, {at::randn({1, groups, g.steps * g.keys, dim}, bf16), at::randn({1, groups, g.steps * g.keys, dim}, bf16)}});
      combine_bytes += double(heads * g.queries) * (dim * 2 + 4);
      grad_bytes += double(heads * g.queries) * dim * 2;
      sum_bytes += 2.0 * double(groups * g.steps * g.keys * dim) * (2 + 4 + 4);  // k and v: read bf16, read and write fp32
    }
    combine_bytes += double(heads * 2 * c) * (dim * 2 + 4);  // the output and its log-sum-exp
    grad_bytes += double(heads * 2 * c) * dim * 2;
  }
  const std::vector<int64_t> sum_shape{1, groups, 2 * c, dim};
  auto sums = [&](bool kernel) {
    std::vector<at::Tensor> dk(static_cast<size_t>(cp)), dv(static_cast<size_t>(cp));
    for (int rank = 0; rank < cp; ++rank) {
      for (const auto& [g, grads] : ranks[size_t(rank)].key_grads) {
        for (int i = 0; i < g.steps; ++i) {
          const size_t owner = size_t((rank - g.first_step - i + cp) % cp);
          add_share(dk[owner], dv[owner], sum_shape, sum_shape, g.first_key, grads.first.narrow(2, i * g.keys, g.keys),
                    grads.second.narrow(2, i * g.keys, g.keys), kernel ? kernels::Impl::Auto : kernels::Impl::Composite);
        }
      }
    }
    return std::make_pair(dk, dv);
  };
  std::vector<std::pair<at::Tensor, at::Tensor>> owner_sums;
  {
    auto [dk, dv] = sums(true);
    for (int owner = 0; owner < cp; ++owner) owner_sums.push_back({dk[size_t(owner)], dv[size_t(owner)]});
  }
  const std::pair<const char*, std::function<void()>> pieces[] = {
      {"combine of the blocks' outputs", [&] {
         for (Rank& r : ranks) (void)kernels::attention_combine(r.outs, 2 * c, at::empty({1, heads, 2 * c}, fp32));
       }},
      {"query gradients' sum", [&] {
         for (Rank& r : ranks) (void)kernels::attention_combine(r.grads, 2 * c, at::Tensor());
       }},
      {"key/value shares into the sums (kernel)", [&] { (void)sums(true); }},
      {"key/value shares into the sums (ATen zeros + add_)", [&] { (void)sums(false); }},
      {"the sums cast back", [&] {
         for (auto& [dk, dv] : owner_sums) {
           (void)dk.to(at::kBFloat16);
           (void)dv.to(at::kBFloat16);
         }
       }}};
  const double bytes[] = {combine_bytes, grad_bytes, sum_bytes, sum_bytes, 2.0 * cp * groups * 2 * c * dim * (4 + 2)};
  std::string out;
  char line[256];
  for (size_t i = 0; i < std::size(pieces); ++i) {
    Rounds t;
    for (int round = 0; round < rounds; ++round) t.add(seconds_per_call(pieces[i].second, iters));
    std::snprintf(line, sizeof line, "| %lld | %d | %s | %.3f | %.0f |\n", static_cast<long long>(seq), cp, pieces[i].first, t.median() * 1e3,
                  bytes[i] / t.median() / 1e9);
    out += line;
  }
  return out;
}

// The whole sequence as one causal block of a kernel, forward and backward: the kernel's own speed.
void one_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout, double scale,
               cp::BlockKernel kernel) {
  const cp::PartialAttention p = cp::attend_block(q, k, v, /*causal=*/true, at::Tensor(), scale, kernel);
  cp::attend_block_backward(dout, q, k, v, p.out.to(q.scalar_type()), p.lse, true, at::Tensor(), scale, kernel);
}

// Every document of the sequence in one variable-length call, forward and backward: what packed
// attention costs without context parallelism.
void one_call_over_documents(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout, double scale,
                             const cp::BlockDocuments& all) {
  const cp::PartialAttention p = cp::attend_documents(q, k, v, all, /*causal=*/true, scale, cp::BlockKernel::Flash);
  cp::attend_documents_backward(dout, q, k, v, p.out.to(q.scalar_type()), p.lse, all, true, scale, cp::BlockKernel::Flash);
}

// Documents of uneven lengths (uniform in [mean/4, 7·mean/4]) filling `seq` tokens, the last one cut.
cp::PackedDocuments uneven_documents(int64_t seq, int64_t mean) {
  cp::PackedDocuments d{{0}, 1, seq};
  const at::Tensor lengths = at::randint(mean / 4, 7 * mean / 4 + 1, {seq / (mean / 4) + 1}, at::kLong);
  for (int64_t i = 0; d.starts.back() < seq; ++i) d.starts.push_back(int32_t(std::min(seq, d.starts.back() + lengths[i].item<int64_t>())));
  return d;
}

const char* sdpa_backend_name(int64_t choice) {
  switch (choice) {  // at::SDPBackend's values
    case 0: return "math";
    case 1: return "flash attention (FA2)";
    case 2: return "memory-efficient";
    case 3: return "cuDNN";
    default: return "other";
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t heads = 32, groups = 4, dim = 64, document_tokens = 4096, causal = 1, steps_per_block = 0, block_kinds = 0;
  int64_t iters = 10, rounds = 3, longest = 131072, shortest = 32768;
  const std::pair<const char*, int64_t*> flags[] = {
      {"--heads", &heads}, {"--groups", &groups}, {"--dim", &dim}, {"--iters", &iters}, {"--rounds", &rounds},
      {"--longest", &longest}, {"--shortest", &shortest}, {"--document-tokens", &document_tokens}, {"--causal", &causal},
      {"--steps-per-block", &steps_per_block}, {"--block-kinds", &block_kinds}};
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    const auto known = std::find_if(std::begin(flags), std::end(flags), [&](const auto& f) { return flag == f.first; });
    if (known == std::end(flags)) {
      std::string names;
      for (const auto& f : flags) names += std::string(names.empty() ? "" : ", ") + f.first;
      std::fprintf(stderr, "unknown flag %s (expected %s)\n", argv[i], names.c_str());
      return 2;
    }
    char* end = nullptr;
    const int64_t value = i + 1 < argc ? std::strtoll(argv[i + 1], &end, 10) : 0;
    if (i + 1 >= argc || end == argv[i + 1] || *end != '\0') {
      std::fprintf(stderr, "%s needs a whole number after it (got %s)\n", argv[i], i + 1 < argc ? argv[i + 1] : "nothing");
      return 2;
    }
    *known->second = value;
  }
  rounds = std::max<int64_t>(1, rounds);
  // The sequences timed: those of 32k, 64k and 128k between --shortest and --longest.
  std::vector<int64_t> sequences;
  for (int64_t seq : {32768, 65536, 131072}) {
    if (shortest <= seq && seq <= longest) sequences.push_back(seq);
  }
  if (sequences.empty()) {
    std::fprintf(stderr, "--shortest %lld and --longest %lld hold none of the sequences timed (32768, 65536, 131072): "
                 "give --shortest <= --longest with one of them between\n", static_cast<long long>(shortest), static_cast<long long>(longest));
    return 2;
  }
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const double scale = 1.0 / std::sqrt(double(dim));
  const at::TensorOptions o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  {
    const at::Tensor q = at::randn({1, heads, 4096, dim}, o), k = at::randn({1, groups, 4096, dim}, o);
    std::printf("SDPA's kernel for the fused call: %s\n",
                sdpa_backend_name(at::_fused_sdp_choice(q, k, k, std::nullopt, 0.0, true, scale, /*enable_gqa=*/true)));
  }
  if (causal) std::printf("| sequence | fused SDPA fwd+bwd (ms) | one FA2 block (ms) | one cuDNN block (ms) | CP | ring, one step a block (ms) | "
              "steps a block | ring, steps grouped (ms) | their kernels alone (ms) | ring / SDPA, one step a block | ring / SDPA | kernels alone / SDPA |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string kinds_table, bookkeeping_table;  // the blocks' kernels by kind, the ring's arithmetic around them: after the main table
  // --causal 0 skips this table and times only the packed documents below.
  const std::vector<int64_t> causal_sequences = causal ? sequences : std::vector<int64_t>{};
  for (int64_t seq : causal_sequences) {
    at::manual_seed(0);
    const at::Tensor q = at::randn({1, heads, seq, dim}, o), k = at::randn({1, groups, seq, dim}, o),
                     v = at::randn({1, groups, seq, dim}, o), dout = at::randn({1, heads, seq, dim}, o);
    auto fused_call = [&] {
      const at::Tensor rq = q.detach().requires_grad_(), rk = k.detach().requires_grad_(), rv = v.detach().requires_grad_();
      at::scaled_dot_product_attention(rq, rk, rv, std::nullopt, 0.0, /*is_causal=*/true, scale, /*enable_gqa=*/true).backward(dout);
    };
    const double fa2 = seconds_per_call([&] { one_block(q, k, v, dout, scale, cp::BlockKernel::Flash); }, iters);
    double cudnn = 0;
    try {
      cudnn = seconds_per_call([&] { one_block(q, k, v, dout, scale, cp::BlockKernel::Cudnn); }, iters);
    } catch (const std::exception& e) {
      std::printf("cuDNN blocks failed: %.200s\n", e.what());
    }
    // The ring's blocks in the kernel Auto picks (cuDNN on Hopper, FA2 when it failed).
    const cp::BlockKernel kernel = cudnn > 0 ? cp::BlockKernel::Cudnn : cp::BlockKernel::Flash;
    for (int cp : {2, 4, 8}) {
      const RankRows rows(q, k, v, dout, cp);
      const int grouped = steps_per_block > 0 ? steps_per_block : cp::ring_steps_per_block(seq / (2 * cp), cp);
      // Each rank's merged output and statistics, which the kernels-alone runs' backward reads (as
      // the ring's does: the own block's alone would leave the other blocks' probabilities unbounded).
      std::vector<cp::PartialAttention> merged;
      ring_work(rows, cp, grouped, scale, kernel, nullptr, true, nullptr, &merged);
      // The fused call timed around each of the ring's variants in every round (Rounds::add_paired).
      Rounds fused, single, fused_single, ring, fused_ring, kernels_alone, fused_alone;
      for (int round = 0; round < rounds; ++round) {
        single.add_paired(fused_single, [&] { ring_work(rows, cp, 1, scale, kernel); }, fused_call, iters);
        if (grouped > 1) ring.add_paired(fused_ring, [&] { ring_work(rows, cp, grouped, scale, kernel); }, fused_call, iters);
        kernels_alone.add_paired(fused_alone, [&] { ring_work(rows, cp, grouped, scale, kernel, nullptr, /*bookkeeping=*/false, nullptr, &merged); },
                                 fused_call, iters);
      }
      for (const Rounds* r : {&fused_single, &fused_ring, &fused_alone}) fused.seconds.insert(fused.seconds.end(), r->seconds.begin(), r->seconds.end());
      const double f = fused.median(), one = single.median(), g = grouped > 1 ? ring.median() : one, alone = kernels_alone.median();
      const double grouped_ratio = grouped > 1 ? ring.median_ratio_to(fused_ring) : single.median_ratio_to(fused_single);
      std::printf("| %lld | %.2f | %.2f | %.2f | %d | %.2f | %d | %.2f | %.2f | %.3f | %.3f | %.3f |\n", static_cast<long long>(seq),
                  f * 1e3, fa2 * 1e3, cudnn * 1e3, cp, one * 1e3, grouped, g * 1e3, alone * 1e3, single.median_ratio_to(fused_single),
                  grouped_ratio, kernels_alone.median_ratio_to(fused_alone));
      std::fflush(stdout);
      if (!block_kinds) continue;
      bookkeeping_table += bookkeeping_rows(seq, cp, grouped, heads, groups, dim, iters, rounds);
      // Each kind of block's kernels (every rank's), against its share of the fused call's work:
      // the own blocks 1/CP of it, the earlier ranks' and the later ranks' (CP-1)/2CP each.
      const int64_t c = seq / (2 * cp);
      const std::pair<const char*, std::function<bool(const cp::RingGroup&)>> kinds[] = {
          {"own (causal)", [](const cp::RingGroup& g) { return g.causal; }},
          {"earlier ranks'", [](const cp::RingGroup& g) { return !g.causal && g.first_query == 0; }},
          {"later ranks'", [c](const cp::RingGroup& g) { return !g.causal && g.first_query == c; }}};
      const double share[] = {1.0 / cp, (cp - 1) / (2.0 * cp), (cp - 1) / (2.0 * cp)};
      char line[256];
      for (int kind = 0; kind < 3; ++kind) {
        Rounds t;
        for (int round = 0; round < rounds; ++round) {
          t.add(seconds_per_call([&] { ring_work(rows, cp, grouped, scale, kernel, nullptr, false, kinds[kind].second, &merged); }, iters));
        }
        std::snprintf(line, sizeof line, "| %lld | %d | %s | %.2f | %.2f | %.3f |\n", static_cast<long long>(seq), cp, kinds[kind].first,
                      t.median() * 1e3, share[kind] * f * 1e3, t.median() / (share[kind] * f));
        kinds_table += line;
      }
    }
  }
  if (!kinds_table.empty()) {
    std::printf("\nthe blocks' kernels by kind (every rank's, forward and backward) against their share of the fused call:\n"
                "| sequence | CP | blocks | kernels (ms) | share of fused (ms) | ratio |\n|---|---|---|---|---|---|\n%s",
                kinds_table.c_str());
    std::printf("\nthe ring's arithmetic around its kernels, each piece alone (every rank's; GB/s: the bytes it must move over its time):\n"
                "| sequence | CP | piece | ms | GB/s |\n|---|---|---|---|---|\n%s",
                bookkeeping_table.c_str());
  }
  if (document_tokens <= 0) return 0;
  std::printf("\npacked documents, %lld tokens on average (uniform in [1/4, 7/4] of it):\n"
              "| sequence | documents | one variable-length call fwd+bwd (ms) | CP | ring, document pieces (ms) | ring / one call |\n"
              "|---|---|---|---|---|---|\n", static_cast<long long>(document_tokens));
  for (int64_t seq : sequences) {
    at::manual_seed(0);
    const at::Tensor q = at::randn({1, heads, seq, dim}, o), k = at::randn({1, groups, seq, dim}, o),
                     v = at::randn({1, groups, seq, dim}, o), dout = at::randn({1, heads, seq, dim}, o);
    const cp::PackedDocuments documents = uneven_documents(seq, document_tokens);
    const cp::BlockDocuments all = cp::block_documents(documents, {{0, seq}}, {{0, seq}}, q.device());
    const double one = seconds_per_call([&] { one_call_over_documents(q, k, v, dout, scale, all); }, iters);
    for (int cp : {2, 4, 8}) {
      const RankRows rows(q, k, v, dout, cp);
      const double ring = seconds_per_call([&] { ring_work(rows, cp, 1, scale, cp::BlockKernel::Flash, &documents); }, iters);
      std::printf("| %lld | %zu | %.2f | %d | %.2f | %.3f |\n", static_cast<long long>(seq), documents.starts.size() - 1, one * 1e3, cp,
                  ring * 1e3, ring / one);
      std::fflush(stdout);
    }
  }
  return 0;
}
