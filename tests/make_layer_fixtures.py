#!/usr/bin/env python3
"""Write the PyTorch reference fixtures that tests/test_layer_fixtures.c checks.

Regenerate (from any folder; the files go to tests/fixtures/ next to this script):

    apt-get install -y python3-torch          # Debian's PyTorch 1.13 (CPU), or
    /usr/bin/python3 tests/make_layer_fixtures.py
    python3 tests/make_layer_fixtures.py      # wherever PyTorch 2.x is installed

then commit tests/fixtures/layer_*.txt together with the version line of
tests/fixtures/README.md.  Only the CPU build of PyTorch is used; the C test reads
the text files and needs no PyTorch.  Options: --out DIR writes elsewhere,
--check compares freshly computed values with the files in tests/fixtures/
instead of writing them (exit status 1 on a difference above 1e-12).

What it computes, per case: a torch.nn.Sequential built from an mnistcu spec
string (conv2d, pooling, batch norm, dropout, activations), its tensors drawn
from a generator the C test reproduces (below), a batch of float32 inputs, then
in float64 (model.double()): the logits in TRAIN mode, the mean cross-entropy,
its gradient for every parameter, a few torch.optim.SGD steps on the same batch
(the parameters and the batch-norm buffers after them), and the logits in EVAL
mode after the steps.  The same computation in float32 PyTorch is run too, to
record in each file how far PyTorch's own float32 results are from the
references (a yardstick for the C test's tolerances).

The initial tensors.  Fashion-CNN has 896,522 parameters: printed they would
take ~18 MB, so the files store a recipe instead, and the C test draws the same
values.  One splitmix64 stream per case (state s = the case's `seed`; each draw
s += 0x9E3779B97F4A7C15, then the usual splitmix64 mix; tests/test_util.h's
tu_next) runs over the state_dict keys in order; a key with an `init:KEY a b`
line takes count draws z, each giving

    u = ((z >> 40) - 2^23) / 2^23          (24 bits: exact, in [-1, 1))
    value = float32(a + b * u)             (b a float32 value and a = 0, or a = 1
                                            and b a power of two: exact in double,
                                            so one rounding, the same in C)

Conv and dense weights and biases: a = 0, b = float32(1/sqrt(fan_in)), PyTorch's
default bound, fan_in = in_channels * kh * kw.  Batch norm in the every-kind
case: weight 1 + u/2, bias u/2, running_mean u/2, running_var 1 + u/2 (not the
defaults, so that a swapped or ignored tensor shows), num_batches_tracked an
explicit `value:` line.

Dropout is mnistcu's, not torch's: nn.Dropout is replaced by PhiloxDropout,
which multiplies by keep * float32(1/(1-p)) with keep from the Philox4x32-10
mask that mnistcu defines (see philox_keep); the step in its counter is the
number of optimizer steps taken before the forward pass (mnistcu_model_steps;
mnistcu_model_apply_grads advances it).

File format (tests/fixtures/README.md has the full description): lines starting
with '#' are comments; every other line is `name count v1 ... vcount`,
separated by single spaces; the values are the shortest decimal strings that
read back as the same float64 (Python repr, with a trailing ".0" dropped),
except on the `spec` and `keys` lines, whose values are words.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch
from torch import nn

U64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15

# The context seed of every case (mnistcu_ctx_desc.seed): both 32-bit halves of
# the Philox key nonzero, and below 2^53 so that it prints exactly.
CTX_SEED = 0x1234_9ABC_DEF0

# Tensors up to this many elements are stored in full; bigger ones as a digest.
FULL_LIMIT = 4096
DIGEST_SAMPLES = 256   # sampled elements of a result digest
INIT_SAMPLES = 32      # of an initial-tensor digest (a check of the C generator)

# ReLU / LeakyReLU inputs must stay this far from 0 (a case may set its own), and the largest value of a
# max-pool window this far above the second largest, in every forward pass
# that a gradient flows back through (float64), or float32 rounding could flip a unit or a window's argmax and
# send a gradient elsewhere.  The script tries seeds from the case's until one
# qualifies.  Each file records the margin found and the largest float32
# PyTorch deviation of those inputs (the noise the margin must cover).
MARGIN = 1e-5

F32 = np.float32


def f32(v):
    """The float32 value nearest to v, as a Python float."""
    return float(F32(v))


CASES = [
    dict(name="layer_lenet5", spec="lenet5", batch=4, seed=1, steps=3, lr=f32(0.02), momentum=f32(0.9),
         inputs="pixels", full_grads=True, full_after=True),
    # margin: its 2x64x26x26 first conv outputs make ~45k max-pool windows per pass, and
    # 1e-5 is met by no seed of hundreds; 8e-6 is still >10x float32 PyTorch's deviation.
    dict(name="layer_fashion_cnn", spec="fashion-cnn", batch=2, seed=101, steps=2, lr=f32(0.02),
         momentum=f32(0.9), inputs="pixels", margin=8e-6),
    # every layer kind: an input of 2 channels with H != W; a padded conv (with bias,
    # before a LeakyReLU); overlapping max and average pools (stride != kernel); a
    # non-square conv kernel with stride 2 and padding, no bias, then batch norm 2d
    # (defaults); softmax over the channels of a map and over flat features; batch
    # norm 1d (eps and momentum options) on the flattened map, then dropout.  No
    # biased layer feeds a batch norm: that bias's gradient would be zero.
    dict(name="layer_every_kind",
         spec="2x13x11 conv3x3x4:p=1 leaky_relu0.1 maxpool3:s=2 conv3x2x6:s=2:p=1:bias=0 batchnorm relu"
              " avgpool2:s=1 softmax flatten batchnorm:eps=0.001:momentum=0.25 dropout0.25 dense12 tanh"
              " dense8 sigmoid softmax dense5",
         batch=5, seed=201, steps=3, lr=f32(0.05), momentum=f32(0.9), inputs="normal", bn_random=True,
         nbt_init=7),
    # the dropout mask alone, exactly: the logits are relu(x) * keep * scale; a
    # forward pass before each step checks the mask at steps 0, 1, 2 (the model has
    # no parameters; apply_grads only advances the step).
    dict(name="layer_dropout_mask", spec="60 relu dropout0.3", batch=3, seed=301, steps=3, lr=f32(0.1),
         momentum=0.0, inputs="uniform", logits_each_step=True),
]

PRESETS = {
    "lenet5": "1x28x28 conv5x5x6 relu maxpool2 conv5x5x16 relu maxpool2 flatten dense120 relu dense84 relu dense10",
    "fashion-cnn": "1x28x28 conv3x3x64 maxpool2 relu conv3x3x128 maxpool2 relu flatten dense256 relu dense10",
}


def fmt(v):
    """Shortest decimal that reads back as the same float64; '0', '1', '-0' for integers."""
    s = repr(float(v))
    if s.endswith(".0"):
        s = s[:-2]
    return s


# ---- the generators ------------------------------------------------------------------
def splitmix(seed, start, n):
    """Draws start+1 .. start+n of the splitmix64 stream with state seed, as uint64."""
    with np.errstate(over="ignore"):
        s = (np.arange(start + 1, start + n + 1, dtype=np.uint64) * np.uint64(GOLDEN)) + np.uint64(seed & U64)
        z = (s ^ (s >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def unit24(z):
    """((z >> 40) - 2^23) / 2^23 in float64: exact, in [-1, 1)."""
    return ((z >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float64) / float(1 << 23)


class Stream:
    def __init__(self, seed):
        self.seed, self.used = seed, 0

    def draw(self, n):
        z = splitmix(self.seed, self.used, n)
        self.used += n
        return z


def recipe_values(stream, count, a, b):
    """float32(a + b*u) for count draws; asserts the double arithmetic is exact."""
    assert f32(b) == b and (a == 0 or (a == 1 and b > 0 and math.frexp(b)[0] == 0.5 and b <= 1)), (a, b)
    u = unit24(stream.draw(count))
    return (a + b * u).astype(np.float32)


MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Random123's philox4x32_10 on uint64 arrays holding 32-bit words."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & MASK32 for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0) & MASK32, np.uint64(k1) & MASK32
    for r in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if r < 9:
            k0 = (k0 + np.uint64(0x9E3779B9)) & MASK32
            k1 = (k1 + np.uint64(0xBB67AE85)) & MASK32
    return c0, c1, c2, c3


# Random123's known answers (tests/kat_vectors): counter, key, output.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def check_philox():
    for ctr, key, want in PHILOX_KAT:
        got = philox4x32_10(*[np.array([c]) for c in ctr], *key)
        assert tuple(int(g[0]) for g in got) == want, "philox4x32_10 fails a Random123 known answer"


def philox_keep(n, layer, step, seed, p):
    """mnistcu's dropout mask for the n elements of a layer's batch tensor: element e
    uses word e & 3 of philox4x32_10(counter {e>>2, layer, step lo, step hi},
    key {seed lo, seed hi}), u = (word >> 8) * 2^-24, kept iff u >= p (p float32)."""
    e = np.arange(n, dtype=np.uint64)
    ctr = e >> np.uint64(2)
    words = philox4x32_10(ctr, np.full(n, layer), np.full(n, step & 0xFFFFFFFF), np.full(n, step >> 32),
                          seed & 0xFFFFFFFF, seed >> 32)
    w = np.choose((e & np.uint64(3)).astype(np.int64), words)
    u = (w >> np.uint64(8)).astype(np.float64) * 2.0 ** -24
    return u >= f32(p)


# ---- the model ----------------------------------------------------------------------
class Clock:
    """mnistcu_model_steps: the optimizer steps taken."""
    step = 0


class PhiloxDropout(nn.Module):
    def __init__(self, p, index, seed, clock):
        super().__init__()
        self.p, self.index, self.seed, self.clock = p, index, seed, clock
        self.scale = float(F32(1.0) / (F32(1.0) - F32(p)))  # 1.0f/(1.0f-p), as mnistcu
        self.kept = []  # (step, kept, total) of each forward pass in TRAIN mode

    def forward(self, x):
        if not self.training:
            return x
        keep = philox_keep(x.numel(), self.index, self.clock.step, self.seed, self.p)
        self.kept.append((self.clock.step, int(keep.sum()), keep.size))
        m = torch.from_numpy(keep.reshape(tuple(x.shape))).to(x.dtype) * self.scale
        return x * m


def parse_options(tok):
    parts = tok.split(":")
    opts = {}
    for o in parts[1:]:
        k, v = o.split("=")
        opts[k] = v
    return parts[0], opts


def build(spec, clock, ctx_seed):
    """(nn.Sequential in float64, input shape of one sample) from an mnistcu spec."""
    words = PRESETS.get(spec, spec).split()
    dims = [int(d) for d in words[0].split("x")]
    shape = tuple(dims)  # (N,) flat or (C, H, W)
    cur = torch.zeros((1,) + shape, dtype=torch.float64)
    layers = []
    for index, tok in enumerate(words[1:]):
        head, opts = parse_options(tok)
        if head.startswith("dense"):
            assert cur.dim() == 2
            mod = nn.Linear(cur.shape[1], int(head[5:]), bias=opts.get("bias", "1") != "0")
        elif head.startswith("conv"):
            kh, kw, n = (int(v) for v in head[4:].split("x"))
            mod = nn.Conv2d(cur.shape[1], n, (kh, kw), stride=int(opts.get("s", 1)), padding=int(opts.get("p", 0)),
                            bias=opts.get("bias", "1") != "0")
        elif head.startswith("maxpool") or head.startswith("avgpool"):
            k = [int(v) for v in head[7:].split("x")] if len(head) > 7 else [2]
            k = (k[0], k[-1])
            s = int(opts["s"]) if "s" in opts else k
            mod = (nn.MaxPool2d if head.startswith("max") else nn.AvgPool2d)(k, stride=s)
        elif head == "batchnorm":
            bn = nn.BatchNorm1d if cur.dim() == 2 else nn.BatchNorm2d
            # eps and momentum as the float32 values mnistcu keeps
            mod = bn(cur.shape[1], eps=f32(opts.get("eps", 1e-5)), momentum=f32(opts.get("momentum", 0.1)))
        elif head.startswith("dropout"):
            mod = PhiloxDropout(f32(head[7:] or 0.5), index, ctx_seed, clock)
        elif head == "flatten":
            mod = nn.Flatten()
        elif head == "relu":
            mod = nn.ReLU()
        elif head.startswith("leaky_relu"):
            mod = nn.LeakyReLU(f32(head[10:] or 0.01))
        elif head == "sigmoid":
            mod = nn.Sigmoid()
        elif head == "tanh":
            mod = nn.Tanh()
        elif head == "softmax":
            mod = nn.Softmax(dim=1)
        else:
            raise ValueError("unknown token " + tok)
        assert not opts or head.startswith(("dense", "conv", "maxpool", "avgpool", "batchnorm")), tok
        mod = mod.double()
        layers.append(mod)
        with torch.no_grad():
            mod.eval()
            cur = mod(cur)
    return nn.Sequential(*layers), shape, words


def fan_in(model, key):
    layer = model[int(key.split(".")[0])]
    w = layer.weight
    return w.shape[1] * (w.shape[2] * w.shape[3] if w.dim() == 4 else 1)


def make_case(case):
    """The model's recipe, the initial tensors, x and labels (float32 / int)."""
    clock = Clock()
    model, shape, words = build(case["spec"], clock, CTX_SEED)
    sd = model.state_dict()
    keys = list(sd.keys())
    stream = Stream(case["seed"])
    recipes, init = {}, {}
    for key in keys:
        t = sd[key]
        kind = key.split(".")[-1]
        if kind in ("weight", "bias") and isinstance(model[int(key.split(".")[0])], (nn.Linear, nn.Conv2d)):
            ab = (0.0, f32(1.0 / math.sqrt(fan_in(model, key))))
        elif case.get("bn_random") and kind in ("weight", "running_var"):
            ab = (1.0, 0.5)
        elif case.get("bn_random") and kind in ("bias", "running_mean"):
            ab = (0.0, 0.5)
        elif kind == "num_batches_tracked":
            init[key] = np.array([case.get("nbt_init", 0)], dtype=np.float32)
            continue
        else:
            raise ValueError("no recipe for " + key)
        recipes[key] = ab
        init[key] = recipe_values(stream, t.numel(), *ab).reshape(tuple(t.shape))
    # inputs and labels: from a second stream, stored in the file in full
    data = Stream(case["seed"] + 1000003)
    B, n_in = case["batch"], int(np.prod(shape))
    z = data.draw(B * n_in)
    if case["inputs"] == "pixels":      # MNIST-like k/255
        x = ((z >> np.uint64(56)).astype(np.float64) / 255.0).astype(np.float32)
    elif case["inputs"] == "normal":    # uniform in [-2, 2)
        x = (2.0 * unit24(z)).astype(np.float32)
    else:                               # uniform in [-1, 1)
        x = unit24(z).astype(np.float32)
    x = x.reshape((B,) + shape)
    with torch.no_grad():
        classes = model(torch.from_numpy(x).double()).shape[1]
    labels = ((data.draw(B) >> np.uint64(32)) % np.uint64(classes)).astype(np.int64)
    return dict(words=words, keys=keys, shapes={k: list(sd[k].shape) for k in keys}, recipes=recipes, init=init,
                x=x, labels=labels, classes=classes)


class Margins:
    """Records every ReLU / LeakyReLU input and every max-pool window gap (in order)."""

    def __init__(self):
        self.relu, self.gaps = [], []
        self.active = True  # off for the EVAL pass: no gradient goes back through it

    def attach(self, model):
        for mod in model:
            if isinstance(mod, (nn.ReLU, nn.LeakyReLU)):
                mod.register_forward_hook(self.relu_hook)
            elif isinstance(mod, nn.MaxPool2d):
                mod.register_forward_hook(self.pool_hook)

    def relu_hook(self, m, i, o):
        if self.active:
            self.relu.append(i[0].detach().double().clone())

    def pool_hook(self, m, i, o):
        if self.active:
            self.gaps.append(self.window_gaps(m, i[0].detach()))

    @staticmethod
    def window_gaps(m, x):
        """top1 - top2 of every window; inf where the two largest are both exactly 0 (ReLU
        zeros: the gradient is zero whichever one gets it)."""
        cols = nn.functional.unfold(x.double(), m.kernel_size, stride=m.stride)  # [B, C*kh*kw, L]
        B, L = cols.shape[0], cols.shape[2]
        cols = cols.reshape(B, x.shape[1], -1, L)
        top = cols.topk(2, dim=2).values
        gap = top[:, :, 0] - top[:, :, 1]
        gap[(top[:, :, 0] == 0) & (top[:, :, 1] == 0)] = math.inf
        return gap

    def smallest(self):
        r = min([t.abs().min().item() for t in self.relu] + [math.inf])
        g = min([t.min().item() for t in self.gaps] + [math.inf])
        return r, g


def run(case, c, dtype, margins=None):
    """Every reference quantity of one case computed in dtype, as float64 numpy arrays."""
    clock = Clock()
    out = {}
    x = torch.from_numpy(c["x"]).to(dtype)
    labels = torch.from_numpy(c["labels"])

    def fresh():
        model, _, _ = build(case["spec"], clock, CTX_SEED)
        model = model.to(dtype)
        sd = {k: torch.from_numpy(np.asarray(v)).reshape(c["shapes"][k]) for k, v in c["init"].items()}
        for k in sd:
            if k.endswith("num_batches_tracked"):
                sd[k] = sd[k].to(torch.int64)
        model.load_state_dict(sd)
        if margins is not None:
            margins.attach(model)
        return model.train()

    def np64(t):
        return t.detach().double().reshape(-1).numpy().copy()

    # model A: the TRAIN-mode logits of a fresh model at step 0, and its buffers after that pass
    model = fresh()
    with torch.no_grad():
        out["logits"] = np64(model(x))
    for k, v in model.state_dict().items():
        if k.split(".")[-1] in ("running_mean", "running_var", "num_batches_tracked"):
            out["after_forward:" + k] = np64(v)

    # model B: the optimizer sequence
    model = fresh()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=case["lr"], momentum=case["momentum"]) if params else None
    losses = []
    for k in range(case["steps"]):
        clock.step = k
        if case.get("logits_each_step") and k > 0:
            with torch.no_grad():
                out["logits_step:%d" % k] = np64(model(x))
        if opt:
            opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), labels)
        if params:
            loss.backward()
        losses.append(loss.item())
        if k == 0:
            out["loss"] = np.array([loss.item()])
            for name, p in model.named_parameters():
                out["grad:" + name] = np64(p.grad)
        if opt:
            opt.step()
    clock.step = case["steps"]
    out["losses"] = np.array(losses)
    for k, v in model.state_dict().items():
        out["after:" + k] = np64(v)
    model.eval()
    if margins is not None:
        margins.active = False
    with torch.no_grad():
        out["eval_logits"] = np64(model(x))
    out["_kept"] = [(m.index, m.kept) for m in model if isinstance(m, PhiloxDropout)]
    return out


def digest(values, samples, seed):
    """n, sum, sum |v|, sum v^2, max |v|, then (index, value) at samples sorted indices (the first and
    the last included) picked by splitmix64 from seed."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    n = v.size
    picks = {0, n - 1}
    z = splitmix(seed, 0, 8 * samples)
    for zz in z:
        if len(picks) >= min(samples, n):
            break
        picks.add(int(zz % np.uint64(n)))
    idx = sorted(picks)
    head = [n, math.fsum(v.tolist()), math.fsum(np.abs(v).tolist()), math.fsum((v * v).tolist()), float(np.abs(v).max())]
    return head + [x for i in idx for x in (i, v[i])]


def name_seed(name):
    """A fixed seed per line name for the digest's sampled indices."""
    h = 1469598103934665603
    for ch in name.encode():
        h = ((h ^ ch) * 1099511628211) & U64
    return h


def case_lines(case):
    torch.set_num_threads(1)  # reproducible reductions
    check_philox()
    seed = case["seed"]
    margin = case.get("margin", MARGIN)
    tried = []
    while True:  # the first seed from the case's whose forward passes keep the margins
        c = make_case(dict(case, seed=seed))
        margins = Margins()
        ref = run(dict(case, seed=seed), c, torch.float64, margins)
        relu_min, gap_min = margins.smallest()
        if relu_min > margin and gap_min > margin:
            break
        tried.append(seed)
        seed += 1
        if len(tried) > 200:
            sys.exit("%s: no seed keeps the margins" % case["name"])
    case = dict(case, seed=seed)
    m32 = Margins()
    f32run = run(case, c, torch.float32, m32)
    noise = max([(a - b.double()).abs().max().item() for a, b in zip(margins.relu, m32.relu)] + [0.0])
    gap_noise = 0.0
    for a, b in zip(margins.gaps, m32.gaps):
        finite = a != math.inf
        if finite.any():
            gap_noise = max(gap_noise, (a[finite] - b.double()[finite]).abs().max().item())
    n_params = sum(int(np.prod(c["shapes"][k])) for k in c["recipes"] if k.split(".")[-1] in ("weight", "bias"))
    lines = [
        "# case %s: %s" % (case["name"], PRESETS.get(case["spec"], case["spec"])),
        "# batch %d, %d trained parameters, %d SGD steps (lr %s, momentum %s), generator seed %d, context seed %d"
        % (case["batch"], n_params, case["steps"], fmt(case["lr"]), fmt(case["momentum"]), seed, CTX_SEED),
    ]
    if tried:
        lines.append("# seeds %s skipped: a ReLU input or a max-pool gap within %g" % (
            ", ".join(map(str, tried)), margin))
    lines.append("# smallest |ReLU/LeakyReLU input| over all forward passes: %.3g (float32 PyTorch deviates from"
                 " those inputs by at most %.2g); smallest max-pool top-2 gap: %.3g (float32 deviation %.2g)"
                 % (relu_min, noise, gap_min, gap_noise))
    for index, kept in ref["_kept"]:
        lines.append("# dropout layer %d, (step, kept, elements) of each TRAIN forward pass: %s" % (
            index, " ".join("(%d,%d,%d)" % k for k in kept)))

    # the float32 yardstick, per quantity: max |d| and max |d| / max |ref|
    lines.append("# float32 PyTorch vs these float64 references, per quantity: max |diff| (max |diff| / max |ref|):")
    yard = []
    for k in ref:
        if k.startswith("_"):
            continue
        d = np.abs(f32run[k] - ref[k])
        scale = np.abs(ref[k]).max() if ref[k].size else 0.0
        yard.append("%s %.2g (%.2g)" % (k, d.max(), d.max() / scale if scale > 0 else 0.0))
        if ref[k].size > FULL_LIMIT and not (k.startswith("grad:") and case.get("full_grads")) and not (
                k.startswith("after:") and case.get("full_after")):
            s1 = np.abs(ref[k]).sum()
            yard.append("%s sums: d sum / sum|ref| %.2g, d sum_sq / sum_sq %.2g" % (
                k, abs(f32run[k].sum() - ref[k].sum()) / s1,
                abs((f32run[k] ** 2).sum() - (ref[k] ** 2).sum()) / (ref[k] ** 2).sum()))
    for i in range(0, len(yard), 6):
        lines.append("#   " + ", ".join(yard[i:i + 6]))

    def add(name, values):
        lines.append(" ".join([name, str(len(values))] + [fmt(v) for v in values]))

    def add_words(name, words):
        lines.append(" ".join([name, str(len(words))] + list(words)))

    def add_tensor(prefix, key, values, full):
        if full or len(values) <= FULL_LIMIT:
            add(prefix + ":" + key, values)
        else:
            add(prefix + "_digest:" + key, digest(values, DIGEST_SAMPLES, name_seed(prefix + key)))

    add_words("spec", c["words"] if case["spec"] not in PRESETS else [case["spec"]])
    add("ctx_seed", [CTX_SEED])
    add("seed", [seed])
    add("optim", [case["steps"], case["lr"], case["momentum"]])
    add_words("keys", c["keys"])
    for k in c["keys"]:
        add("shape:" + k, c["shapes"][k])
    for k in c["keys"]:
        if k in c["recipes"]:
            add("init:" + k, list(c["recipes"][k]))
            add("init_digest:" + k, digest(c["init"][k], INIT_SAMPLES, name_seed("init" + k)))
        else:
            add("value:" + k, c["init"][k].reshape(-1).tolist())
    add("x", c["x"].astype(np.float64).reshape(-1).tolist())
    add("labels", c["labels"].tolist())
    add("logits", ref["logits"])
    for k in ref:
        if k.startswith("after_forward:"):
            add(k, ref[k])
    for k in sorted(ref):
        if k.startswith("logits_step:"):
            add(k, ref[k])
    add("loss", ref["loss"])
    add("losses", ref["losses"])
    for k in ref:
        if k.startswith("grad:"):
            add_tensor("grad", k[5:], ref[k], case.get("full_grads", False))
    for k in ref:
        if k.startswith("after:"):
            add_tensor("after", k[6:], ref[k], case.get("full_after", False))
    add("eval_logits", ref["eval_logits"])
    return lines


def parse(path):
    """The numeric lines of a fixture file: {name: [floats]} ({name: [words]} for spec, keys)."""
    out = {}
    with open(path) as f:
        for line in f:
            tok = line.split()
            if not tok or tok[0].startswith("#"):
                continue
            out[tok[0]] = tok[2:] if tok[0] in ("spec", "keys") else [float(t) for t in tok[2:]]
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "fixtures"), help="output folder (default tests/fixtures)")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out instead of writing")
    ap.add_argument("--case", action="append", help="only this case (repeatable)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    worst = 0.0
    bad = False
    for case in CASES:
        if args.case and case["name"] not in args.case:
            continue
        lines = case_lines(case)
        path = os.path.join(args.out, case["name"] + ".txt")
        if args.check:
            old = parse(path)
            seen = set()
            for line in lines:
                tok = line.split()
                if tok[0].startswith("#"):
                    continue
                seen.add(tok[0])
                if tok[0] in ("spec", "keys"):
                    if old.get(tok[0]) != tok[2:]:
                        print("%s: line %s differs" % (path, tok[0]))
                        bad = True
                    continue
                new = [float(t) for t in tok[2:]]
                if tok[0] not in old or len(old[tok[0]]) != len(new):
                    print("%s: line %s differs in presence or length" % (path, tok[0]))
                    bad = True
                    continue
                d = max([abs(a - b) for a, b in zip(old[tok[0]], new)] + [0.0])
                worst = max(worst, d)
                if d > 1e-12:
                    print("%s: %s differs by %g" % (path, tok[0], d))
            for name in set(old) - seen:
                print("%s: line %s is no longer written" % (path, name))
                bad = True
            continue
        header = ["# mnistcu test fixture written by tests/make_layer_fixtures.py with PyTorch %s; do not edit,"
                  " regenerate (see tests/fixtures/README.md)" % torch.__version__]
        with open(path, "w") as f:
            f.write("\n".join(header + lines) + "\n")
        print("%-40s %8d bytes" % (os.path.relpath(path), os.path.getsize(path)))
    if args.check:
        print("largest difference from the committed fixtures: %g" % worst)
        if worst > 1e-12 or bad:
            sys.exit(1)


if __name__ == "__main__":
    main()
