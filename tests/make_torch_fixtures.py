#!/usr/bin/env python3
"""Write the PyTorch reference fixtures that tests/test_torch_fixtures.c checks.

Regenerate (from any folder; the files go to tests/fixtures/ next to this script):

    apt-get install -y python3-torch          # Debian's PyTorch 1.13 (CPU), or
    /usr/bin/python3 tests/make_torch_fixtures.py
    python3 tests/make_torch_fixtures.py      # wherever PyTorch 2.x is installed

then commit tests/fixtures/*.txt together with the version line of
tests/fixtures/README.md.  Only the CPU build of PyTorch is used; the C tests
read the text files and need no PyTorch.  Options: --out DIR writes elsewhere,
--check compares freshly computed values with the files in tests/fixtures/
instead of writing them (exit status 1 on a difference above 1e-12).

What it computes, per case: a small MLP (nn.Linear layers with the hidden
activation between them, no activation after the last layer), float32 inputs
and initial parameters drawn from torch's own generator with a fixed seed, then
in float64 (model.double()): the logits, the mean cross-entropy, its gradients,
and the parameters after a few torch.optim.SGD steps on the same batch.  The
inputs and the initial parameters are float32 values, so the C side loads them
exactly and every difference it sees is its own float32 arithmetic against a
reference that is exact to ~1e-15.  The same computation in float32 PyTorch is
run too, to record in each file how far PyTorch's own float32 results are from
the reference (a yardstick for the C test's tolerances).

File format (tests/fixtures/README.md has the full description): lines starting
with '#' are comments; every other line is `name count v1 ... vcount`,
separated by single spaces; the values are the shortest decimal strings that
read back as the same float64 (Python repr, with a trailing ".0" dropped),
except on the `act` line, whose one value is a word.
"""

import argparse
import math
import os
import sys

import torch
from torch import nn

# ---- the optimizer sequences: (name, steps, lr, momentum, nesterov, weight_decay)
OPTIMS = [
    ("sgd_step1", 1, 0.1, 0.0, False, 0.0),
    ("momentum_step3", 3, 0.1, 0.9, False, 0.0),
    ("nesterov_step3", 3, 0.1, 0.9, True, 0.0),
    ("wd_step2", 2, 0.05, 0.5, False, 0.01),
]

ACTS = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "identity": nn.Identity,
}

# ---- the cases -------------------------------------------------------------------
# gain scales PyTorch's default bound 1/sqrt(fan_in) for W and b: above 1 it puts
# tanh and sigmoid into their curved range and spreads the logits.
# image: inputs are pixels k/255 in float32 like MNIST after /255, nonzero only on
# `active` pixels (a random set that includes the first and the last), and the
# first layer's weights are zero on the other pixels.  That keeps the 784-wide
# case a few tens of KB (a dense 784x16 layer alone prints to ~290 KB) while the
# products still run over all 784 inputs.  optims=False stores no optimizer
# sequences for it (the update rule is elementwise and the small cases cover it).
CASES = [
    dict(name="relu_5_7_4_3", sizes=[5, 7, 4, 3], act="relu", batch=6, seed=1, gain=2.0),
    dict(name="tanh_6_8_5", sizes=[6, 8, 5], act="tanh", batch=4, seed=2, gain=2.0),
    dict(name="sigmoid_6_8_5", sizes=[6, 8, 5], act="sigmoid", batch=4, seed=3, gain=2.0),
    dict(name="identity_6_8_5", sizes=[6, 8, 5], act="identity", batch=4, seed=4, gain=2.0),
    dict(name="relu_784_16_10", sizes=[784, 16, 10], act="relu", batch=8, seed=7, gain=1.0,
         image=True, active=64, optims=False),
    dict(name="relu_5_7_4_3_batch1", sizes=[5, 7, 4, 3], act="relu", batch=1, seed=6, gain=2.0),
]

# The smallest |pre-activation| of a ReLU unit allowed in any forward pass: float32
# rounding must not be able to flip a unit on or off, or the C side would take the
# other branch of the derivative.
RELU_MARGIN = 1e-5


def fmt(v):
    """Shortest decimal that reads back as the same float64; '0', '1', '-0' for integers."""
    s = repr(float(v))
    if s.endswith(".0"):
        s = s[:-2]
    return s


def make_inputs(case):
    """float32 x [B][in], int64 labels [B] and the flat float32 parameters (mnistcu's layout)."""
    g = torch.Generator().manual_seed(case["seed"])
    sizes, B = case["sizes"], case["batch"]
    if case.get("image"):
        n_in = sizes[0]
        perm = torch.randperm(n_in - 2, generator=g)[: case["active"] - 2] + 1
        active = torch.cat([torch.tensor([0, n_in - 1]), perm]).sort().values
        pixels = torch.randint(0, 256, (B, len(active)), generator=g)
        keep = torch.rand(B, len(active), generator=g) < 0.7  # some active pixels are black too
        pixels = pixels * keep
        x = torch.zeros(B, n_in, dtype=torch.float32)
        x[:, active] = pixels.to(torch.float32) / 255.0
    else:
        x = torch.randn(B, sizes[0], generator=g, dtype=torch.float32)
        active = None
    labels = torch.randint(0, sizes[-1], (B,), generator=g)
    params = []
    for l in range(len(sizes) - 1):
        n_in, n_out = sizes[l], sizes[l + 1]
        bound = case["gain"] / math.sqrt(n_in)
        w = (torch.rand(n_out, n_in, generator=g, dtype=torch.float32) * 2 - 1) * bound
        b = (torch.rand(n_out, generator=g, dtype=torch.float32) * 2 - 1) * bound
        if l == 0 and active is not None:
            mask = torch.zeros(n_in, dtype=torch.bool)
            mask[active] = True
            w = w * mask.to(torch.float32)
        params += [w.reshape(-1), b]
    return x, labels, torch.cat(params)


class ReluMargin:
    """Records the smallest |input| a ReLU sees."""

    def __init__(self):
        self.min = math.inf

    def hook(self, module, inputs, output):
        self.min = min(self.min, inputs[0].detach().abs().min().item())


def build(case, dtype, flat, margin):
    sizes = case["sizes"]
    layers = []
    for l in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[l], sizes[l + 1]))
        if l + 2 < len(sizes):
            act = ACTS[case["act"]]()
            if margin is not None and case["act"] == "relu":
                act.register_forward_hook(margin.hook)
            layers.append(act)
    model = nn.Sequential(*layers).to(dtype)
    with torch.no_grad():  # copies: the optimizer must not write into flat
        offset = 0
        for p in model.parameters():
            p.copy_(flat[offset:offset + p.numel()].reshape(p.shape))
            offset += p.numel()
        assert offset == flat.numel()
    return model


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def flat_grads(model):
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def compute(case, dtype, x, labels, flat, margin=None):
    """Every reference quantity of one case, computed in dtype, as float64 tensors."""
    out = {}
    model = build(case, dtype, flat, margin)
    xd = x.to(dtype)
    logits = model(xd)
    loss = nn.functional.cross_entropy(logits, labels)
    loss.backward()
    out["logits"] = logits.detach().reshape(-1).double()
    out["loss"] = loss.detach().reshape(1).double()
    out["grads"] = flat_grads(model).double()
    if case.get("optims", True):
        for name, steps, lr, mu, nesterov, wd in OPTIMS:
            model = build(case, dtype, flat, margin)
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=mu, nesterov=nesterov, weight_decay=wd)
            for _ in range(steps):
                opt.zero_grad()
                nn.functional.cross_entropy(model(xd), labels).backward()
                opt.step()
            out[name] = flat_params(model).double()
    return out


def case_lines(case):
    torch.set_num_threads(1)  # reproducible reductions
    x, labels, flat = make_inputs(case)
    margin = ReluMargin()
    ref = compute(case, torch.float64, x, labels, flat, margin)
    if case["act"] == "relu" and not margin.min > RELU_MARGIN:
        sys.exit("%s: a ReLU input is %g from 0 (limit %g): pick another seed" % (case["name"], margin.min, RELU_MARGIN))
    f32 = compute(case, torch.float32, x, labels, flat)
    sizes = case["sizes"]
    lines = [
        "# case %s: %s MLP %s, batch %d, seed %d" % (case["name"], case["act"], "-".join(map(str, sizes)),
                                                   case["batch"], case["seed"]),
        "# float32 PyTorch vs these float64 references, max |diff|: "
        + ", ".join("%s %.2g" % (k, (f32[k] - ref[k]).abs().max().item()) for k in ref),
    ]
    if case["act"] == "relu":
        lines.append("# smallest |ReLU input| over all forward passes: %.3g" % margin.min)

    def add(name, values):
        lines.append(" ".join([name, str(len(values))] + [fmt(v) for v in values]))

    add("sizes", sizes)
    lines.append("act 1 " + case["act"])
    add("x", x.double().reshape(-1).tolist())
    add("labels", labels.tolist())
    add("params", flat.double().tolist())
    add("logits", ref["logits"].tolist())
    add("loss", ref["loss"].tolist())
    add("grads", ref["grads"].tolist())
    if case.get("optims", True):
        for name, steps, lr, mu, nesterov, wd in OPTIMS:
            add(name + "_optim", [steps, lr, mu, 1 if nesterov else 0, wd])
            add(name, ref[name].tolist())
    return lines


def parse(path):
    """The numeric lines of a fixture file: {name: [floats]}."""
    out = {}
    with open(path) as f:
        for line in f:
            tok = line.split()
            if not tok or tok[0].startswith("#") or tok[0] == "act":
                continue
            out[tok[0]] = [float(t) for t in tok[2:]]
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "fixtures"), help="output folder (default tests/fixtures)")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out instead of writing")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    worst = 0.0
    for case in CASES:
        lines = case_lines(case)
        path = os.path.join(args.out, case["name"] + ".txt")
        if args.check:
            old = parse(path)
            for line in lines:
                tok = line.split()
                if tok[0].startswith("#") or tok[0] == "act":
                    continue
                new = [float(t) for t in tok[2:]]
                if tok[0] not in old or len(old[tok[0]]) != len(new):
                    sys.exit("%s: line %s differs in presence or length" % (path, tok[0]))
                d = max([abs(a - b) for a, b in zip(old[tok[0]], new)] + [0.0])
                worst = max(worst, d)
                if d > 1e-12:
                    print("%s: %s differs by %g" % (path, tok[0], d))
            continue
        header = ["# mnistcu test fixture written by tests/make_torch_fixtures.py with PyTorch %s; do not edit,"
                  " regenerate (see tests/fixtures/README.md)" % torch.__version__]
        with open(path, "w") as f:
            f.write("\n".join(header + lines) + "\n")
        print("%-40s %7d bytes" % (os.path.relpath(path), os.path.getsize(path)))
    if args.check:
        print("largest difference from the committed fixtures: %g" % worst)
        if worst > 1e-12:
            sys.exit(1)


if __name__ == "__main__":
    main()
