"""Weight decays from megatron-core's own OptimizerParamScheduler (get_wd), for test_lr_schedule.cpp.

  python megatron_wd_reference.py STYLE,START,END,INCR_STEPS,ITERATIONS,INCREMENT ...
For each case, prints the weight decay the scheduler sets for iterations 0..ITERATIONS, one per
line, stepping by INCREMENT (the global batch size) each iteration, as Megatron's training loop
does. INCR_STEPS counts samples (Megatron: --train-iters x --global-batch-size, or --train-samples).
"""
import sys
import warnings

warnings.filterwarnings("ignore")
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # noqa: E402


class _Optimizer:  # the scheduler only sets param_groups' lr / weight_decay
    param_groups = [{"lr": 0.0, "weight_decay": 0.0}]


for case in sys.argv[1:]:
    style, start, end, incr_steps, steps, increment = case.split(",")
    optimizer = _Optimizer()
    scheduler = OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=1e-3, min_lr=0.0, lr_warmup_steps=0,
                                        lr_decay_steps=int(incr_steps), lr_decay_style="constant", start_wd=float(start),
                                        end_wd=float(end), wd_incr_steps=int(incr_steps), wd_incr_style=style)
    for step in range(int(steps) + 1):
        print(repr(optimizer.param_groups[0]["weight_decay"]))  # what the step after `step` iterations uses
        scheduler.step(int(increment))
