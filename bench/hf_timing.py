"""What the HF MoE / DeepSeek baselines share: the model as they time it (prepare), and the timed
training loop: forward and backward on one batch `accum` times, one fused AdamW step, three
warm-up steps, then `iters` timed ones."""
import time

import torch


def prepare(model_class, cfg, experts, compile, mb, seq, vocab):
    """SDPA attention, experts through `experts`, pure bf16 on the GPU, fused AdamW, optionally
    torch.compile; one fixed batch. Returns (parameter count, optimizer, forward, batch)."""
    cfg._attn_implementation = "sdpa"
    cfg._experts_implementation = experts
    torch.manual_seed(0)
    model = model_class(cfg).to(device="cuda", dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if compile else model
    x = torch.randint(0, vocab, (mb, seq), device="cuda")
    return n, opt, fwd, x


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
