#!/usr/bin/env python3
"""Write tests/fixtures/optimizers.txt: trajectories of torch.optim on a small MLP, which
tests/test_toolkit.c (optimizers_match_pytorch) replays with mnistcu_model_compute_grads and
mnistcu_model_apply_grads. PyTorch only (any 1.13 or 2.x, CPU):

    /usr/bin/python3 tests/make_optim_fixtures.py           # writes the file
    /usr/bin/python3 tests/make_optim_fixtures.py --check   # compares with it (exit 1 on a difference)

The model is torch.nn.Sequential(Linear(10, 12), ReLU(), Linear(12, 4)) with cross-entropy, trained
for STEPS steps on BATCHES fixed batches of 8 samples, batch s % BATCHES at step s. A case may add
lambda * sum(W^2) over the two weight matrices to the loss (l2) and clip the gradient's global norm
(clip_grad_norm_) before the step. Lines ('#' lines are comments):
    x <BATCHES*8*10 floats>            the batches' inputs, row-major
    y <BATCHES*8 ints>                 their labels
    case NAME key=value ...            one optimizer: mnistcu_optim_desc's field names
    init <floats>                      the parameters before, in state_dict order
    loss <STEPS floats>                the cross-entropy (without the penalty) at each step
    final <floats>                     the parameters after STEPS steps
Numbers are written as the shortest decimal that reads back as the same float32.
"""
import argparse
import os
import sys

import numpy as np
import torch

STEPS = 50
BATCHES = 5
B, IN, HID, OUT = 8, 10, 12, 4

# name, optimizer kind, its keyword arguments in torch's names, mnistcu's fields, l2, clip
CASES = [
    ("sgd", "sgd", dict(lr=0.1), {}, 0.0, 0.0),
    ("sgd_momentum_dampening", "sgd", dict(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=0.01),
     dict(momentum=0.9, dampening=0.2, weight_decay=0.01), 0.0, 0.0),
    ("sgd_nesterov", "sgd", dict(lr=0.05, momentum=0.8, nesterov=True), dict(momentum=0.8, nesterov=1), 0.0, 0.0),
    ("sgd_l2_clip", "sgd", dict(lr=0.1, momentum=0.9), dict(momentum=0.9), 0.01, 0.5),
    ("adam", "adam", dict(lr=0.01), {}, 0.0, 0.0),
    ("adam_betas_wd_amsgrad", "adam", dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, amsgrad=True),
     dict(beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.01, amsgrad=1), 0.0, 0.0),
    ("adamw", "adamw", dict(lr=0.01, weight_decay=0.05), dict(weight_decay=0.05), 0.0, 0.0),
    ("adamw_amsgrad_clip", "adamw", dict(lr=0.01, weight_decay=0.01, amsgrad=True), dict(weight_decay=0.01, amsgrad=1),
     0.0, 0.25),
    ("rmsprop", "rmsprop", dict(lr=0.01), {}, 0.0, 0.0),
    ("rmsprop_momentum_centered", "rmsprop", dict(lr=0.005, alpha=0.9, eps=1e-6, momentum=0.5, centered=True,
                                                  weight_decay=0.01),
     dict(alpha=0.9, eps=1e-6, momentum=0.5, centered=1, weight_decay=0.01), 0.0, 0.0),
    ("adagrad", "adagrad", dict(lr=0.05), {}, 0.0, 0.0),
    ("adagrad_decay_init", "adagrad", dict(lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1, weight_decay=0.01),
     dict(lr_decay=0.01, initial_accumulator_value=0.1, weight_decay=0.01), 0.001, 1.0),
]


def f32(v):
    """The shortest decimal that reads back as the same float32."""
    v = float(np.float32(v))
    for prec in range(1, 10):
        s = "%.*g" % (prec, v)
        if float(np.float32(float(s))) == v:
            return s
    return "%.9g" % v


def data():
    g = torch.Generator().manual_seed(20261123)
    x = torch.randn(BATCHES, B, IN, generator=g)
    y = torch.randint(0, OUT, (BATCHES, B), generator=g)
    return x, y


def make(kind, kw, params):
    kw = dict(kw)
    if "foreach" in torch.optim.SGD.__init__.__code__.co_varnames:
        kw["foreach"] = False  # the single-tensor rules mnistcu follows
    return {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
            "rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad}[kind](params, **kw)


def run_case(x, y, kind, kw, l2, clip):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.ReLU(), torch.nn.Linear(HID, OUT))
    init = torch.cat([p.detach().flatten() for p in model.state_dict().values()]).clone()
    opt = make(kind, kw, model.parameters())
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        ce = torch.nn.functional.cross_entropy(model(x[s % BATCHES]), y[s % BATCHES])
        loss = ce
        if l2:
            loss = loss + l2 * (model[0].weight.pow(2).sum() + model[2].weight.pow(2).sum())
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(ce.item())
    final = torch.cat([p.detach().flatten() for p in model.state_dict().values()])
    return init, losses, final


def text():
    x, y = data()
    out = ["# torch.optim trajectories, %d steps (tests/make_optim_fixtures.py, torch %s)" % (STEPS, torch.__version__),
           "x " + " ".join(f32(v) for v in x.flatten().tolist()),
           "y " + " ".join(str(int(v)) for v in y.flatten().tolist())]
    for name, kind, kw, fields, l2, clip in CASES:
        f = dict(fields)
        f["lr"] = kw["lr"]
        if l2:
            f["l2"] = l2
        if clip:
            f["clip_norm"] = clip
        init, losses, final = run_case(x, y, kind, kw, l2, clip)
        out.append("case %s kind=%s %s" % (name, kind, " ".join("%s=%s" % (k, v) for k, v in f.items())))
        out.append("init " + " ".join(f32(v) for v in init.tolist()))
        out.append("loss " + " ".join(f32(v) for v in losses))
        out.append("final " + " ".join(f32(v) for v in final.tolist()))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "fixtures", "optimizers.txt"))
    a = ap.parse_args()
    new = text()
    if a.check:
        old = open(a.out).read().splitlines()
        worst = 0.0
        for lo, ln in zip(old[1:], new.splitlines()[1:]):
            p, q = lo.split(), ln.split()
            if p[0] != q[0]:
                print("line kinds differ: %s / %s" % (p[0], q[0]))
                return 1
            if p[0] in ("init", "loss", "final", "x"):
                # relative to each value, or to the root mean square of the line for values near zero
                # (the measure tests/test_toolkit.c applies)
                a_, b_ = np.array(p[1:], dtype=np.float64), np.array(q[1:], dtype=np.float64)
                rms = float(np.sqrt(np.mean(a_ * a_)))
                worst = max(worst, float(np.max(np.abs(a_ - b_) / (rms + np.abs(a_)))))
        print("largest relative difference to the committed fixtures: %.3g" % worst)
        return 0 if worst < 1e-6 else 1
    with open(a.out, "w") as f:
        f.write(new)
    print("wrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
