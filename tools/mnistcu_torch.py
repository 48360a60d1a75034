#!/usr/bin/env python3
"""Move mnistcu models to and from PyTorch through their safetensors files.

Needs only torch and numpy (PyTorch 1.13, e.g. Debian's python3-torch run as
/usr/bin/python3, or PyTorch 2.x); the safetensors file is read and written here.

    tools/mnistcu_torch.py check MODEL.safetensors --data DIR --logits FILE [--tol 1e-5]
        Build the torch.nn.Sequential that the model's spec describes, load the
        file's tensors into it (strictly: every tensor, nothing more, except
        names starting with "mnistcu." that checkpoints carry), run the 10,000
        test images of DIR in eval mode on the CPU in float32 and compare the
        logits with FILE, mnistcu's logits for the same images (raw
        little-endian float32 [images][classes]).  Prints one JSON line:
        max_abs_diff, max_rel_diff (max |a-b| / max(1, max |b|) per image, b mnistcu's),
        torch_accuracy, mnistcu_accuracy, ok.  ok (exit 0) when max_rel_diff
        <= tol and the argmax agrees on every image; otherwise exit 1.

    tools/mnistcu_torch.py train-torch --spec SPEC --data DIR --out FILE.safetensors
            [--epochs 1] [--seed 0] [--lr 0.05] [--batch 64] [--class-names fashion|none]
        Train the model of SPEC with PyTorch (SGD, momentum 0.9, cross-entropy,
        shuffled batches), with the standard normalisation of DIR's training
        images; save it in mnistcu's format and print one JSON line with the
        test accuracy: {"accuracy": ..., "correct": ..., "count": ...}.

    tools/mnistcu_torch.py torch-logits MODEL.safetensors --data DIR --out FILE
        Like check, but writes torch's logits to FILE (raw float32) instead.

DIR holds MNIST-style IDX files, t10k-images-idx3-ubyte and
t10k-labels-idx1-ubyte (train-* for training), gzipped (.gz) or not.  Inputs are
x = pixel * norm_scale + norm_shift in float32, with pixel the uint8 value and
the two constants from the file's metadata (with norm_u8 "0", pixel / 255).
SPEC is a spec string such as "1x28x28 conv5x5x6 relu maxpool2 flatten dense10"
(README.md, Models and layers), a preset (lenet5, fashion-cnn) or MLP widths
(784-128-10).  A spec's layer k is module k-1 of the Sequential, so tensors are
named as its state_dict names them ("0.weight", "3.running_mean", ...).

The file: an 8-byte little-endian header length, a JSON header (tensor name ->
dtype, shape, data_offsets; "__metadata__" -> strings: format "mnistcu",
format_version "1", kind, spec, input_shape "C,H,W", norm_scale, norm_shift,
norm_u8, classes, class_names (a JSON array, optional), loss, library_version),
padded with spaces to a multiple of 8 bytes, then the tensors' little-endian data.

Exit status: 0 success; 1 check found a difference; 2 a usage error or a file
that cannot be read (bad safetensors or IDX, a spec that does not parse, tensors
that do not match the model).
"""

import argparse
import gzip
import json
import os
import re
import struct
import sys

import numpy as np
import torch
from torch import nn

PRESETS = {
    "lenet5": "1x28x28 conv5x5x6 relu maxpool2 conv5x5x16 relu maxpool2 "
              "flatten dense120 relu dense84 relu dense10",
    "fashion-cnn": "1x28x28 conv3x3x64 maxpool2 relu conv3x3x128 maxpool2 relu "
                   "flatten dense256 relu dense10",
}
FASHION_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                 "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
# safetensors dtype -> numpy little-endian dtype (BF16 is read as raw uint16)
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8",
          "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
NUMPY_TO_ST = {np.dtype(v).name: k for k, v in DTYPES.items() if k != "BF16"}


class Error(Exception):
    """A usage or file error: reported on stderr, exit status 2."""


# ---------------------------------------------------------------- model specs

def expand_spec(spec):
    """A preset name or MLP widths (784-128-10) as a spec string; others unchanged."""
    spec = " ".join(spec.split())
    if re.fullmatch(r"\d+(-\d+)+", spec):
        widths = spec.split("-")
        return widths[0] + " " + " relu ".join("dense" + w for w in widths[1:])
    return PRESETS.get(spec, spec)


LAYER = re.compile(r"(dense|conv|maxpool|avgpool|batchnorm|dropout|flatten|leaky_relu|"
                   r"relu|sigmoid|tanh|softmax)(.*)")


def build_model(spec):
    """The torch.nn.Sequential of a spec, with its input and output dims.

    Dims are [F] for a flat tensor [batch][F], [C, H, W] for [batch][C][H][W].
    """
    tokens = expand_spec(spec).split()
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)|(\d+)", tokens[0]) if tokens else None
    dims = [int(g) for g in m.groups() if g] if m else [0]
    if min(dims) < 1:
        raise Error("model spec: token 1 %r: expected the input shape CxHxW or N, sizes > 0"
                    % (tokens[:1] or [""])[0])
    # 1x1xN and Nx1x1 are flat data, unless a conv or pool comes before any dense,
    # batchnorm or flatten: then they are maps.
    first = [t for t in tokens[1:] if re.match("conv|maxpool|avgpool|dense|batchnorm|flatten", t)]
    if len(dims) == 3 and (dims[1:] == [1, 1] or dims[:2] == [1, 1]):
        if not (first and re.match("conv|maxpool|avgpool", first[0])):
            dims = [max(dims)]
    in_dims, modules = dims, []
    for pos, token in enumerate(tokens[1:], start=2):
        def fail(msg):
            return Error("model spec: token %d %r: %s" % (pos, token, msg))

        def num(text, kind=int, low=1):
            try:
                v = kind(text)
            except ValueError:
                v = None
            if v is None or not v >= low:
                raise fail("%r is not a number >= %s" % (text, low))
            return v

        def pair(text, low=1):                      # "K" or "KHxKW"
            parts = text.split("x")
            if len(parts) > 2:
                raise fail("%r: expected N or NxM" % text)
            return num(parts[0], int, low), num(parts[-1], int, low)

        head, *opts = token.split(":")
        m = LAYER.fullmatch(head)
        try:
            opt = dict(o.split("=", 1) for o in opts)
        except ValueError:
            raise fail("options are key=value") from None
        if not m:
            raise fail("unknown layer")
        kind, arg = m.groups()
        opt.pop("init", None)                       # how mnistcu initialised it: no matter here
        bias = opt.pop("bias", "1") if kind in ("dense", "conv") else "1"
        if bias not in ("0", "1"):
            raise fail("bias must be 0 or 1")
        if kind in ("conv", "maxpool", "avgpool") and len(dims) != 3:
            raise fail("%s needs maps [C][H][W], not flat data" % kind)
        if kind == "dense":
            if len(dims) != 1:
                raise fail("dense needs flat input, not %s maps (add flatten)"
                           % "x".join(map(str, dims)))
            modules.append(nn.Linear(dims[0], num(arg), bias=bias == "1"))
            dims = [modules[-1].out_features]
        elif kind == "conv":
            if not re.fullmatch(r"\d+x\d+x\d+", arg):
                raise fail("expected convKHxKWxN")
            kh, kw, n = (num(v) for v in arg.split("x"))
            (sh, sw), (ph, pw) = pair(opt.pop("s", "1")), pair(opt.pop("p", "0"), 0)
            c, h, w = dims
            if h + 2 * ph < kh or w + 2 * pw < kw:
                raise fail("a %dx%d kernel does not fit a %dx%dx%d input" % (kh, kw, c, h, w))
            modules.append(nn.Conv2d(c, n, (kh, kw), (sh, sw), (ph, pw), bias=bias == "1"))
            dims = [n, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1]
        elif kind in ("maxpool", "avgpool"):
            (kh, kw), c, h, w = pair(arg), *dims
            sh, sw = pair(opt.pop("s")) if "s" in opt else (kh, kw)
            if h < kh or w < kw:
                raise fail("a %dx%d window does not fit a %dx%dx%d input" % (kh, kw, c, h, w))
            pool = nn.MaxPool2d if kind == "maxpool" else nn.AvgPool2d
            modules.append(pool((kh, kw), (sh, sw)))
            dims = [c, (h - kh) // sh + 1, (w - kw) // sw + 1]
        elif kind == "batchnorm" and not arg:
            eps = num(opt.pop("eps", "1e-5"), float, 0)
            mom = num(opt.pop("momentum", "0.1"), float, 0)
            bn = nn.BatchNorm1d if len(dims) == 1 else nn.BatchNorm2d
            modules.append(bn(dims[0], eps=eps, momentum=mom))
        elif kind == "dropout":
            p = num(arg, float, 0) if arg else 0.5
            if p >= 1:
                raise fail("the dropout probability must be below 1")
            modules.append(nn.Dropout(p))
        elif kind == "leaky_relu":
            modules.append(nn.LeakyReLU(num(arg, float, -np.inf) if arg else 0.01))
        elif kind == "flatten" and not arg:
            modules.append(nn.Flatten())
            dims = [int(np.prod(dims))]
        elif not arg and kind in ("relu", "sigmoid", "tanh", "softmax"):
            modules.append(nn.Softmax(dim=1) if kind == "softmax" else
                           {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}[kind]())
        else:
            raise fail("unknown layer")
        if opt:
            raise fail("unknown option %s" % ", ".join(sorted(opt)))
    return nn.Sequential(*modules), in_dims, dims


# ---------------------------------------------------------------- safetensors

def read_safetensors(path):
    """{name: numpy array} and the metadata dict of a safetensors file."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise Error("%s: %s" % (path, e.strerror)) from None
    bad = lambda msg: Error("%s: not a valid safetensors file: %s" % (path, msg))
    if len(blob) < 8:
        raise bad("shorter than its 8-byte header length")
    n = struct.unpack("<Q", blob[:8])[0]
    if n > len(blob) - 8:
        raise bad("header length %d runs past the end of the file (%d bytes)" % (n, len(blob)))

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise bad("duplicate key in the header")
        return dict(pairs)
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise bad("header is not JSON: %s" % e) from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad("__metadata__ is not an object of strings")
    data, tensors, spans = memoryview(blob)[8 + n:], {}, []
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise bad("tensor %r needs dtype, shape and data_offsets" % name)
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise bad("tensor %r has unknown dtype %r" % (name, dtype))
        ints = lambda v: isinstance(v, list) and all(type(x) is int and x >= 0 for x in v)
        if not ints(shape):
            raise bad("tensor %r: shape %r is not a list of sizes" % (name, shape))
        if not ints(offs) or len(offs) != 2 or not offs[0] <= offs[1] <= len(data):
            raise bad("tensor %r: data_offsets %r out of range (data buffer %d bytes)"
                      % (name, offs, len(data)))
        nd = np.dtype(DTYPES[dtype])
        if offs[1] - offs[0] != int(np.prod(shape)) * nd.itemsize:
            raise bad("tensor %r: data_offsets %r do not hold %s %s" % (name, offs, dtype, shape))
        arr = np.frombuffer(data[offs[0]:offs[1]], dtype=nd).reshape(shape)
        if dtype == "BF16":
            arr = (arr.astype("<u4") << 16).view("<f4")
        tensors[name] = arr.astype(arr.dtype.newbyteorder("="))
        spans.append((offs[0], offs[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise bad("tensor %r starts at %d, not at %d: the data is not contiguous"
                      % (name, begin, end))
        end = stop
    if end != len(data):
        raise bad("the tensors cover %d of the %d bytes of data" % (end, len(data)))
    return tensors, meta


def write_safetensors(path, tensors, meta):
    """Write [(name, numpy array)] in order, with string metadata."""
    header, chunks, offset = {"__metadata__": meta}, [], 0
    for name, arr in tensors:
        dtype = NUMPY_TO_ST[arr.dtype.name]
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def f32_text(v):
    """Shortest decimal that reads back as the same float32."""
    v = np.float32(v)
    s = str(v)
    return s if np.float32(float(s)) == v else repr(float(v))


# ---------------------------------------------------------------- data

def read_idx(folder, name):
    path = os.path.join(folder, name)
    try:
        if os.path.exists(path + ".gz"):
            with gzip.open(path + ".gz", "rb") as f:
                blob = f.read()
        else:
            with open(path, "rb") as f:
                blob = f.read()
    except (OSError, EOFError) as e:
        raise Error("%s(.gz): %s" % (path, e)) from None
    if len(blob) < 4 or blob[0] != 0 or blob[1] != 0 or blob[2] != 0x08 or blob[3] == 0:
        raise Error("%s: not an IDX file of uint8 (magic %s)" % (path, blob[:4].hex()))
    ndim = blob[3]
    if len(blob) < 4 + 4 * ndim:
        raise Error("%s: truncated IDX header" % path)
    dims = struct.unpack(">%dI" % ndim, blob[4:4 + 4 * ndim])
    if len(blob) - 4 - 4 * ndim != int(np.prod(dims)):
        raise Error("%s: %d data bytes, dims %s need %d" % (path, len(blob) - 4 - 4 * ndim,
                                                            dims, int(np.prod(dims))))
    return np.frombuffer(blob, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def read_split(folder, split):
    images = read_idx(folder, split + "-images-idx3-ubyte")
    labels = read_idx(folder, split + "-labels-idx1-ubyte")
    if images.ndim < 2 or labels.ndim != 1 or len(images) != len(labels):
        raise Error("%s: %s images %s and labels %s do not match"
                    % (folder, split, images.shape, labels.shape))
    return images.reshape(len(images), -1), labels.astype(np.int64)


def normalise(pixels, scale, shift, u8=True):
    x = pixels.astype(np.float32)
    if not u8:
        x = x / np.float32(255)
    return x * np.float32(scale) + np.float32(shift)


def as_input(x, in_dims):
    if x.shape[1] != int(np.prod(in_dims)):
        raise Error("the images have %d pixels, the model takes %s" % (x.shape[1], in_dims))
    return torch.from_numpy(np.ascontiguousarray(x).reshape([len(x)] + list(in_dims)))


def predict(model, x, batch=500):
    model.eval()
    with torch.no_grad():
        return torch.cat([model(x[i:i + batch]) for i in range(0, len(x), batch)]).numpy()


# ---------------------------------------------------------------- commands

def load_model(path, data):
    """Model of a mnistcu safetensors file, with its logits on DIR's test images."""
    tensors, meta = read_safetensors(path)
    if meta.get("format") != "mnistcu" or meta.get("format_version") != "1":
        raise Error("%s: not a mnistcu model (format %r, version %r)"
                    % (path, meta.get("format"), meta.get("format_version")))
    for key in ("spec", "norm_scale", "norm_shift"):
        if key not in meta:
            raise Error("%s: metadata has no %r" % (path, key))
    spec = meta["spec"]
    model, in_dims, out_dims = build_model(spec)
    state = {k: torch.from_numpy(v) for k, v in tensors.items() if not k.startswith("mnistcu.")}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise Error("%s: the tensors do not match the spec %r: %s" % (path, spec, e)) from None
    classes = meta.get("classes", str(out_dims[-1]))
    if len(out_dims) != 1 or classes != str(out_dims[0]):
        raise Error("%s: the spec's output %s is not %s classes" % (path, out_dims, classes))
    shape = meta.get("input_shape", "").split(",")
    if len(shape) == 3 and all(v.isdigit() for v in shape) \
            and np.prod([int(v) for v in shape]) != np.prod(in_dims):
        raise Error("%s: input_shape %s does not match the spec %r"
                    % (path, meta["input_shape"], spec))
    u8 = meta.get("norm_u8", "1")
    if u8 not in ("0", "1"):
        raise Error("%s: norm_u8 %r is neither 0 nor 1" % (path, u8))
    try:
        scale, shift = float(meta["norm_scale"]), float(meta["norm_shift"])
    except ValueError:
        raise Error("%s: norm_scale or norm_shift is not a number" % path) from None
    pixels, labels = read_split(data, "t10k")
    return predict(model, as_input(normalise(pixels, scale, shift, u8 == "1"), in_dims)), labels


def cmd_check(args):
    logits, labels = load_model(args.model, args.data)
    try:
        ref = np.fromfile(args.logits, dtype="<f4")
    except OSError as e:
        raise Error("%s: %s" % (args.logits, e.strerror)) from None
    if ref.size != logits.size:
        raise Error("%s: %d floats, expected %d images x %d classes"
                    % (args.logits, ref.size, *logits.shape))
    ref = ref.reshape(logits.shape).astype(np.float64)
    diff = np.abs(logits.astype(np.float64) - ref)
    # relative to each image's largest logit (at least 1): a normwise error per image
    rel = diff / np.maximum(1.0, np.max(np.abs(ref), axis=1, keepdims=True))
    max_abs, max_rel = float(np.max(diff)), float(np.max(rel))     # NaN if any is NaN
    same = bool(np.all(logits.argmax(1) == ref.argmax(1)))
    ok = bool(max_rel <= args.tol and same)
    finite = lambda v: v if np.isfinite(v) else None                  # JSON has no NaN
    print(json.dumps({"max_abs_diff": finite(max_abs), "max_rel_diff": finite(max_rel),
                      "torch_accuracy": float(np.mean(logits.argmax(1) == labels)),
                      "mnistcu_accuracy": float(np.mean(ref.argmax(1) == labels)), "ok": ok}))
    return 0 if ok else 1


def cmd_torch_logits(args):
    logits, labels = load_model(args.model, args.data)
    logits.astype("<f4").tofile(args.out)
    print(json.dumps({"accuracy": float(np.mean(logits.argmax(1) == labels)),
                      "count": len(labels), "classes": logits.shape[1]}))
    return 0


def cmd_train_torch(args):
    spec = expand_spec(args.spec)
    torch.manual_seed(args.seed)
    model, in_dims, out_dims = build_model(spec)
    if len(out_dims) != 1:
        raise Error("model spec %r: the output %s is not flat (add flatten)" % (spec, out_dims))
    pixels, labels = read_split(args.data, "train")
    counts = np.bincount(pixels.ravel(), minlength=256).astype(np.float64)
    values = np.arange(256) / 255.0
    mean = float(np.sum(counts * values) / counts.sum())
    std = float(np.sqrt(np.sum(counts * (values - mean) ** 2) / counts.sum()))
    scale, shift = np.float32(1.0 / (255.0 * std)), np.float32(-mean / std)
    x, y = as_input(normalise(pixels, scale, shift), in_dims), torch.from_numpy(labels)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn, gen = nn.CrossEntropyLoss(), torch.Generator().manual_seed(args.seed)
    for epoch in range(1, args.epochs + 1):
        model.train()
        total, steps = 0.0, 0
        for idx in torch.randperm(len(x), generator=gen).split(args.batch):
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
        print("epoch %d: mean loss %.4f" % (epoch, total / max(steps, 1)), file=sys.stderr)
    test_pixels, test_labels = read_split(args.data, "t10k")
    logits = predict(model, as_input(normalise(test_pixels, scale, shift), in_dims))
    correct = int(np.sum(logits.argmax(1) == test_labels))
    shape = spec.split()[0].split("x")
    meta = {"format": "mnistcu", "format_version": "1", "kind": "weights", "spec": spec,
            "input_shape": ",".join(["1", "1"] + shape if len(shape) == 1 else shape),
            "norm_scale": f32_text(scale), "norm_shift": f32_text(shift), "norm_u8": "1",
            "classes": str(out_dims[0]), "loss": "ce",
            "library_version": "torch-" + torch.__version__}
    if args.class_names == "fashion":
        meta["class_names"] = json.dumps(FASHION_NAMES)
    state = [(k, v.detach().cpu().numpy()) for k, v in model.state_dict().items()]
    write_safetensors(args.out, state, meta)
    count = len(test_labels)
    print(json.dumps({"accuracy": correct / count, "correct": correct, "count": count}))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="mnistcu_torch.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("check", help="compare torch's logits of a model with mnistcu's")
    p.add_argument("model", metavar="MODEL.safetensors")
    p.add_argument("--data", required=True, metavar="DIR", help="folder of the IDX files")
    p.add_argument("--logits", required=True, metavar="FILE", help="mnistcu's logits, float32")
    p.add_argument("--tol", type=float, default=1e-5, help="largest |a-b| / max(1, the image's largest |logit|) (1e-5)")
    p.set_defaults(run=cmd_check)
    p = sub.add_parser("train-torch", help="train a spec with PyTorch, save it for mnistcu")
    p.add_argument("--spec", required=True, help="spec string, preset or MLP widths")
    p.add_argument("--data", required=True, metavar="DIR", help="folder of the IDX files")
    p.add_argument("--out", required=True, metavar="FILE.safetensors")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="for the initial weights and the shuffling")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--class-names", choices=("fashion", "none"), default="none",
                   help="fashion: store Fashion-MNIST's class names")
    p.set_defaults(run=cmd_train_torch)
    p = sub.add_parser("torch-logits", help="write torch's logits of a model")
    p.add_argument("model", metavar="MODEL.safetensors")
    p.add_argument("--data", required=True, metavar="DIR", help="folder of the IDX files")
    p.add_argument("--out", required=True, metavar="FILE", help="where the float32 logits go")
    p.set_defaults(run=cmd_torch_logits)
    args = ap.parse_args(argv)
    if args.command == "train-torch" and (args.epochs < 0 or args.batch <= 0):
        ap.error("--epochs must be >= 0 and --batch > 0")
    try:
        return args.run(args)
    except Error as e:
        print("mnistcu_torch: error: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
