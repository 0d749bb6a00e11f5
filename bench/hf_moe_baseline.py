"""The MoE baseline a user would otherwise pick: HF transformers Qwen3-MoE, eager or torch.compile.

Runs on the GPU machine. Prints one line per run:
  baseline hf-qwen3-moe ... tok/s ... TFLOP/s ...
Shape defaults to the issue's Qwen3-30B-A3B layer cut to 6 layers: hidden 2048, 128 experts,
top-8, expert ffn 768, 32 heads / 4 kv heads, head dim 128, vocab 151936, seq 4096, micro-batch 1;
pure bf16, SDPA, fused AdamW, experts through `grouped_mm` (config._experts_implementation) unless
--experts eager.

  python3 hf_moe_baseline.py [--compile] [--experts grouped_mm|eager] [--layers 6] [--seq 4096] [--iters 10]
                             [--grad-accum 1 [8 ...]]

--grad-accum N: N micro-batches per optimizer step (gradients accumulated, the loss of each
scaled by 1/N), as `megatron train --global-batch-size N` with micro-batch 1; tokens/s count all
N micro-batches of a step. Several values are timed one after another on the same (compiled) model,
one line each.

Two FLOP counts per token, as bench/gpu_moe.sh prints them for megatron.cpp too:
  dense-style  6 * N_active + 6 * L * heads * head_dim * s   (N_active: parameters a token meets)
  megatron     Megatron-LM's num_floating_point_operations for this shape (GEMMs x 3 for backward,
               attention projections and core attention, routed experts x top-k, logits)
"""
import argparse, torch
from hf_timing import prepare, time_steps
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--compile", action="store_true")
p.add_argument("--experts", default="grouped_mm")
for k, v in dict(mb=1, seq=4096, layers=6, hidden=2048, moe_ffn=768, num_experts=128, topk=8, heads=32, kv_heads=4,
                 head_dim=128, vocab=151936, iters=10).items():
    p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
p.add_argument("--grad-accum", type=int, nargs="+", default=[1])
a = p.parse_args()


def flops_per_token(n_params):
    h, f, k, E, L, s = a.hidden, a.moe_ffn, a.topk, a.num_experts, a.layers, a.seq
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    active = n_params - L * (E - k) * 3 * h * f
    dense_style = 6 * active + 6 * L * q * s
    attention = 6 * (h * (q + 2 * kv) + q * h) + 6 * q * s
    experts = 3 * 2 * 3 * h * f * k  # fwd+bwd x FMA x SwiGLU's three GEMMs, top-k experts
    megatron = L * (attention + experts) + 6 * h * a.vocab
    return dense_style, megatron


cfg = Qwen3MoeConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=6144, moe_intermediate_size=a.moe_ffn,
                     num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                     head_dim=a.head_dim, num_experts=a.num_experts, num_experts_per_tok=a.topk, norm_topk_prob=True,
                     max_position_embeddings=a.seq, decoder_sparse_step=1, mlp_only_layers=[],
                     output_router_logits=False, tie_word_embeddings=False)
n, opt, fwd, x = prepare(Qwen3MoeForCausalLM, cfg, a.experts, a.compile, a.mb, a.seq, a.vocab)

for accum, dt, tok, loss in time_steps(fwd, opt, x, a.grad_accum, a.iters):
    dense_style, megatron = flops_per_token(n)
    print(f"baseline hf-qwen3-moe experts={a.experts} params={n/1e9:.2f}B layers={a.layers} seq={a.seq} grad_accum={accum} "
          f"compile={a.compile}: {dt*1e3:.1f} ms/step, {tok:.0f} tok/s, {dense_style*tok/1e12:.0f} TFLOP/s "
          f"(megatron count {megatron*tok/1e12:.0f}), peak mem {torch.cuda.max_memory_allocated()/2**30:.1f} GiB, "
          f"loss {loss.item():.3f}", flush=True)
