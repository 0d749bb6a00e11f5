"""The timed training loop the HF MoE / DeepSeek baselines share: forward and backward on one
batch `accum` times, one fused AdamW step, three warm-up steps, then `iters` timed ones."""
import time

import torch


def time_steps(fwd, opt, x, grad_accums, iters):
    """Yields (accum, seconds per step, tokens per second, last loss) for each gradient accumulation."""
    def step(accum):
        for _ in range(accum):
            loss = fwd(input_ids=x, labels=x).loss
            (loss / accum).backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        return loss

    for accum in grad_accums:
        for _ in range(3):
            step(accum)
        torch.cuda.synchronize(); t0 = time.time()
        for _ in range(iters):
            loss = step(accum)
        torch.cuda.synchronize(); dt = (time.time() - t0) / iters
        yield accum, dt, accum * x.numel() / dt, loss
