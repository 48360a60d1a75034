#!/usr/bin/env python3
"""Write tests/fixtures/schedules.txt: the learning rates torch.optim.lr_scheduler gives, epoch by
epoch, for the cases that tests/test_train.c (schedules_match_pytorch) rebuilds with
mnistcu_schedule_desc. PyTorch's CPU build only; run with Debian's python3-torch (1.13) or any 2.x:

    /usr/bin/python3 tests/make_schedule_fixtures.py          # writes the file
    /usr/bin/python3 tests/make_schedule_fixtures.py --check  # compares with it (exit 1 on a difference)

Each line: `name T lr_0 ... lr_{T-1}`, the rate in force during epoch t (read before
scheduler.step()), as the shortest decimal that reads back as the same float64; '#' lines are comments.
The base learning rate is 0.05 in every case.
"""
import argparse
import math
import os
import sys

import torch
from torch.optim import lr_scheduler as S

BASE = 0.05


def opt():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE)


def cases():
    """(name, T, a function making (optimizer, scheduler))"""
    def step():
        o = opt(); return o, S.StepLR(o, step_size=3, gamma=0.5)
    def multistep():
        o = opt(); return o, S.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.3)
    def exponential():
        o = opt(); return o, S.ExponentialLR(o, gamma=0.8)
    def cosine():
        o = opt(); return o, S.CosineAnnealingLR(o, T_max=9, eta_min=0.001)
    def exp_decay():
        o = opt(); return o, S.LambdaLR(o, lambda t: math.exp(-0.15 * t))
    def warmup_cosine():
        o = opt()
        return o, S.SequentialLR(o, [S.LinearLR(o, start_factor=0.25, total_iters=3), S.CosineAnnealingLR(o, T_max=9)],
                                 milestones=[3])
    def warmup_step():
        o = opt()
        return o, S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=2), S.StepLR(o, step_size=2, gamma=0.5)],
                                 milestones=[2])
    def one_cycle():
        o = opt(); return o, S.OneCycleLR(o, max_lr=BASE, total_steps=20, cycle_momentum=False)
    def one_cycle_custom():
        o = opt()
        return o, S.OneCycleLR(o, max_lr=BASE, total_steps=15, pct_start=0.4, div_factor=10.0, final_div_factor=100.0,
                               cycle_momentum=False)
    return [("one_cycle_20", 20, one_cycle), ("one_cycle_15_0.4_10_100", 15, one_cycle_custom),
            ("step_3_0.5", 10, step), ("multistep_2_5_9_0.3", 12, multistep), ("exponential_0.8", 10, exponential),
            ("cosine_min_0.001", 9, cosine), ("exp_decay_0.15", 10, exp_decay), ("warmup3_0.25_cosine", 12, warmup_cosine),
            ("warmup2_0.1_step_2_0.5", 10, warmup_step)]


# ReduceLROnPlateau(patience=2, factor=0.5, min_lr=0.004), stepped with these validation losses
PLATEAU_LOSSES = [1.0, 0.9, 0.95, 0.95, 0.95, 0.8, 0.81, 0.82, 0.83, 0.84, 0.85, 0.86, 0.87, 0.7, 0.71, 0.72]


def plateau_rates():
    o = opt()
    sch = S.ReduceLROnPlateau(o, mode="min", factor=0.5, patience=2, min_lr=0.004)
    out = []
    for loss in PLATEAU_LOSSES:
        out.append(o.param_groups[0]["lr"])
        o.step()
        sch.step(loss)
    return out


def rates(T, make):
    o, sch = make()
    out = []
    for _ in range(T):
        out.append(o.param_groups[0]["lr"])
        o.step()
        sch.step()
    return out


def text():
    lines = ["# learning rates of torch.optim.lr_scheduler, base 0.05 (tests/make_schedule_fixtures.py, torch %s)"
             % torch.__version__]
    for name, T, make in cases():
        lines.append(" ".join([name, str(T)] + [repr(float(v)) for v in rates(T, make)]))
    lines.append("# plateau: the losses " + " ".join(repr(v) for v in PLATEAU_LOSSES))
    lines.append(" ".join(["plateau_2_0.5_0.004", str(len(PLATEAU_LOSSES))] + [repr(float(v)) for v in plateau_rates()]))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "schedules.txt")
    if a.check:
        old = {l.split()[0]: [float(v) for v in l.split()[2:]] for l in open(path) if l.strip() and l[0] != "#"}
        new = {l.split()[0]: [float(v) for v in l.split()[2:]] for l in text().splitlines() if l[0] != "#"}
        bad = [k for k in new if k not in old or any(abs(x - y) > 1e-12 for x, y in zip(new[k], old[k]))]
        print("schedules: %s" % ("differ: " + ", ".join(bad) if bad else "same"))
        return 1 if bad else 0
    open(path, "w").write(text())
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
