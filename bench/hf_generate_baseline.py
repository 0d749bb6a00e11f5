"""HF transformers' generation on the 1.1B reference shape (random weights, bf16, one GPU), the
baseline of bench/gpu_generate.sh: `generate` with a static cache, greedy, EOS ignored. With
--compile, generate compiles the decoding forward itself (transformers 4.48+ does so for a static
cache on a GPU: torch.compile in "reduce-overhead" mode, CUDA graphs; HF's fastest documented
setting; wrapping model.forward in torch.compile as well crashed); without, disable_compile=True.

  python hf_generate_baseline.py MODEL_DIR PROMPT_TEXT [--compile]

Prints one line per measurement: prefill of the prompt, decode at batch 1 (ms a token: the time
of 256 new tokens less the prefill, over 255), and batch 64 with 128 new tokens (output tokens/s).
"""
import sys
import time

import tokenizers
import torch
import transformers

model_dir, text = sys.argv[1], sys.argv[2]
compile_ = "--compile" in sys.argv
tok = tokenizers.Tokenizer.from_file(f"{model_dir}/tokenizer.json")
ids = tok.encode(text).ids
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
model.generation_config.cache_implementation = "static"
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
model.generation_config.disable_compile = not compile_


def timed(batch, new_tokens, repeats=3):
    x = torch.tensor([ids] * batch, device="cuda")
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, attention_mask=torch.ones_like(x))
    with torch.no_grad():
        model.generate(x, **kw)  # warm-up (compilation)
        best = float("inf")
        for _ in range(repeats):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(x, **kw)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
    assert out.shape[1] == len(ids) + new_tokens
    return best


mode = "compile" if compile_ else "eager"
prefill = timed(1, 1)
print(f"baseline hf-generate {mode} prefill: {len(ids)} tokens in {1e3 * prefill:.1f} ms", flush=True)
whole = timed(1, 256)
print(f"baseline hf-generate {mode} batch 1: {1e3 * (whole - prefill) / 255:.3f} ms a token ({len(ids)}-token prompt, 256 new)", flush=True)
batched = timed(64, 128, repeats=2)
print(f"baseline hf-generate {mode} batch 64: {64 * 128 / batched:.0f} output tokens/s (128 new each, prefill included)", flush=True)
