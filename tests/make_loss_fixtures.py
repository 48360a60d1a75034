#!/usr/bin/env python3
"""Write tests/fixtures/losses.txt: the value of each loss PyTorch defines and its gradient with
respect to a Linear layer's weight and bias, for tests/test_toolkit.c (losses_match_pytorch), which
rebuilds the layer with mnistcu and calls mnistcu_model_compute_grads(_targets). PyTorch only (1.13
or 2.x, CPU):

    /usr/bin/python3 tests/make_loss_fixtures.py           # writes the file
    /usr/bin/python3 tests/make_loss_fixtures.py --check   # compares with it (exit 1 on a difference)

The layer is Linear(6, 4) on a batch of 5. Lines ('#' lines are comments):
    case NAME loss=ce|mse|bce|hinge smoothing=E sum=0|1 margin=M p=1|2 targets=0|1 scale=S
    x <30 floats>          inputs (multiplied by `scale` for the large-logit cases)
    weight <24 floats>     bias <4 floats>
    y <5 ints>             class labels
    t <20 floats>          float targets (when targets=1)
    loss <1 float>         PyTorch's loss
    dweight <24 floats>    dbias <4 floats>   its gradients
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from make_optim_fixtures import f32  # the shortest decimal that reads back as the same float32

B, IN, C = 5, 6, 4

# name, loss, smoothing, sum, margin, p, targets (0 labels, 1 floats), scale
CASES = [
    ("ce", "ce", 0.0, 0, 1.0, 1, 0, 1.0),
    ("ce_smoothing", "ce", 0.1, 0, 1.0, 1, 0, 1.0),
    ("ce_probabilities", "ce", 0.0, 0, 1.0, 1, 1, 1.0),
    ("ce_probabilities_smoothing_sum", "ce", 0.2, 1, 1.0, 1, 1, 1.0),
    ("ce_large_logits", "ce", 0.05, 0, 1.0, 1, 0, 40.0),
    ("mse_onehot", "mse", 0.0, 0, 1.0, 1, 0, 1.0),
    ("mse_targets", "mse", 0.0, 0, 1.0, 1, 1, 1.0),
    ("mse_targets_sum", "mse", 0.0, 1, 1.0, 1, 1, 1.0),
    ("bce_multilabel", "bce", 0.0, 0, 1.0, 1, 1, 1.0),
    ("bce_onehot_sum", "bce", 0.0, 1, 1.0, 1, 0, 1.0),
    ("bce_large_logits", "bce", 0.0, 0, 1.0, 1, 1, 60.0),
    ("hinge", "hinge", 0.0, 0, 1.0, 1, 0, 1.0),
    ("hinge_p2_margin", "hinge", 0.0, 0, 0.5, 2, 0, 1.0),
    ("hinge_sum", "hinge", 0.0, 1, 2.0, 1, 0, 1.0),
]




def row(key, t):
    return key + " " + " ".join(f32(v) for v in t.detach().flatten().tolist())


def text():
    g = torch.Generator().manual_seed(424242)
    out = ["# losses of torch.nn.functional and their gradients (tests/make_loss_fixtures.py, torch %s)"
           % torch.__version__]
    for name, loss, eps, sum_, margin, p, targets, scale in CASES:
        x = torch.randn(B, IN, generator=g) * scale
        w = (torch.rand(C, IN, generator=g) - 0.5).requires_grad_()
        b = (torch.rand(C, generator=g) - 0.5).requires_grad_()
        y = torch.randint(0, C, (B,), generator=g)
        if loss == "ce":
            t = torch.softmax(torch.randn(B, C, generator=g) * 2, 1)
        elif loss == "bce":
            t = (torch.rand(B, C, generator=g) > 0.5).float()
        else:
            t = torch.randn(B, C, generator=g)
        red = "sum" if sum_ else "mean"
        z = F.linear(x, w, b)
        onehot = F.one_hot(y, C).float()
        if loss == "ce":
            v = F.cross_entropy(z, t if targets else y, reduction=red, label_smoothing=eps)
        elif loss == "mse":
            v = F.mse_loss(z, t if targets else onehot, reduction=red)
        elif loss == "bce":
            v = F.binary_cross_entropy_with_logits(z, t if targets else onehot, reduction=red)
        else:
            v = F.multi_margin_loss(z, y, p=p, margin=margin, reduction=red)
        v.backward()
        out.append("case %s loss=%s smoothing=%g sum=%d margin=%g p=%d targets=%d scale=%g"
                   % (name, loss, eps, sum_, margin, p, targets, scale))
        out.append(row("x", x))
        out.append(row("weight", w))
        out.append(row("bias", b))
        out.append("y " + " ".join(str(int(k)) for k in y.tolist()))
        out.append(row("t", t))
        out.append("loss " + f32(v.item()))
        out.append(row("dweight", w.grad))
        out.append(row("dbias", b.grad))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "fixtures", "losses.txt"))
    a = ap.parse_args()
    new = text()
    if a.check:
        worst = 0.0
        for lo, ln in zip(open(a.out).read().splitlines()[1:], new.splitlines()[1:]):
            p, q = lo.split(), ln.split()
            if p[0] != q[0] or len(p) != len(q):
                print("the fixtures differ in layout at: %s" % p[0])
                return 1
            if p[0] not in ("case", "y"):
                # relative to the line's largest value (the measure tests/test_toolkit.c applies)
                u, v = np.array(p[1:], dtype=np.float64), np.array(q[1:], dtype=np.float64)
                worst = max(worst, float(np.max(np.abs(u - v) / (1e-30 + np.max(np.abs(u))))))
        print("largest relative difference to the committed fixtures: %.3g" % worst)
        return 0 if worst < 1e-5 else 1
    with open(a.out, "w") as f:
        f.write(new)
    print("wrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
