"""Learning rates from megatron-core's own OptimizerParamScheduler, for test_lr_schedule.cpp.

  python megatron_lr_reference.py STYLE WARMUP DECAY WSD_STEPS WSD_STYLE ITERATIONS [INCREMENT]
Prints one learning rate per line for iterations 0..ITERATIONS. WARMUP, DECAY and WSD_STEPS count
the scheduler's steps: samples, as Megatron's training loop steps it by INCREMENT (the global
batch size, default 1) each iteration; WARMUP may be fractional (--lr-warmup-fraction).
"""
import sys
import warnings

warnings.filterwarnings("ignore")
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler


class _Optimizer:  # the scheduler only sets param_groups' lr / weight_decay
    param_groups = [{"lr": 0.0, "weight_decay": 0.0}]


style, warmup, decay, wsd_iters, wsd_style, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
increment = int(sys.argv[7]) if len(sys.argv) > 7 else 1
warmup = int(warmup) if warmup == int(warmup) else warmup
scheduler = OptimizerParamScheduler(_Optimizer(), init_lr=1e-5, max_lr=3e-4, min_lr=3e-5, lr_warmup_steps=warmup,
                                    lr_decay_steps=decay, lr_decay_style=style, start_wd=0.1, end_wd=0.1,
                                    wd_incr_steps=decay, wd_incr_style="constant",
                                    wsd_decay_steps=wsd_iters if style == "WSD" else None,
                                    lr_wsd_decay_style=wsd_style if style == "WSD" else None)
for step in range(steps + 1):
    print(repr(scheduler.get_lr({"max_lr": 3e-4, "min_lr": 3e-5})))
    scheduler.step(increment)
