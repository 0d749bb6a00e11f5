"""The DeepSeek baseline a user would otherwise pick: HF transformers DeepseekV2, eager or compiled.

Runs on the GPU machine. Prints one line per global batch:
  baseline hf-deepseek-v2 ... tok/s ... TFLOP/s ...
Shape defaults to the DeepSeek-V2-Lite layer shape of issue #21 cut to 6 layers: hidden 2048,
16 heads, kv latent 512, no query latent, 128 + 64 rotary query/key channels, values 128, 64
experts top-6 with 2 shared, expert ffn 1408, the first layer dense with ffn 10944, vocab 102400,
seq 4096, micro-batch 1; pure bf16, SDPA, fused AdamW, experts through `grouped_mm`
(config._experts_implementation) unless --experts eager.

  python3 hf_deepseek_baseline.py [--compile] [--experts grouped_mm|eager] [--layers 6] [--seq 4096] [--iters 10]
                                  [--grad-accum 1 [8 ...]]

TFLOP/s counts 6 x the parameters a token meets + attention's scores and values
(3 x L x heads x (qk + v head dims) x s), as bench/gpu_deepseek.sh counts megatron.cpp's.
"""
import argparse, torch
from hf_timing import prepare, time_steps
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--compile", action="store_true")
p.add_argument("--experts", default="grouped_mm")
for k, v in dict(mb=1, seq=4096, layers=6, hidden=2048, ffn=10944, moe_ffn=1408, num_experts=64, topk=6, shared=2,
                 heads=16, kv_lora=512, nope=128, rope=64, v_dim=128, vocab=102400, iters=10).items():
    p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
p.add_argument("--grad-accum", type=int, nargs="+", default=[1])
a = p.parse_args()

cfg = DeepseekV2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn, moe_intermediate_size=a.moe_ffn,
                       num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
                       q_lora_rank=None, kv_lora_rank=a.kv_lora, qk_nope_head_dim=a.nope, qk_rope_head_dim=a.rope,
                       v_head_dim=a.v_dim, n_routed_experts=a.num_experts, n_shared_experts=a.shared,
                       num_experts_per_tok=a.topk, first_k_dense_replace=1, topk_method="greedy", routed_scaling_factor=1.0,
                       max_position_embeddings=a.seq, tie_word_embeddings=False,
                       rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096, beta_fast=32,
                                         beta_slow=1, mscale=0.707, mscale_all_dim=0.707))
n, opt, fwd, x = prepare(DeepseekV2ForCausalLM, cfg, a.experts, a.compile, a.mb, a.seq, a.vocab)
moe_layers = a.layers - 1
active = n - moe_layers * (a.num_experts - a.topk) * 3 * a.hidden * a.moe_ffn
flops_per_token = 6 * active + 3 * a.layers * a.heads * (a.nope + a.rope + a.v_dim) * a.seq

for accum, dt, tok, loss in time_steps(fwd, opt, x, a.grad_accum, a.iters):
    print(f"baseline hf-deepseek-v2 experts={a.experts} params={n/1e9:.2f}B layers={a.layers} seq={a.seq} grad_accum={accum} "
          f"compile={a.compile}: {dt*1e3:.1f} ms/step, {tok:.0f} tok/s, {flops_per_token*tok/1e12:.0f} TFLOP/s, "
          f"peak mem {torch.cuda.max_memory_allocated()/2**30:.1f} GiB, loss {loss.item():.3f}", flush=True)
