#!/usr/bin/env python3
"""Check an ONNX file written by mnistcu.h: validate it, run it, compare with mnistcu's logits.

Usage:
    tools/onnx_check.py MODEL.onnx --input INPUT.f32 --shape N,C,H,W --expect LOGITS.f32
                        [--tol 1e-5] [--runtime auto|python|node] [--save OUTPUT.f32]
    tools/onnx_check.py MODEL.onnx            (validation only: steps 1 and 2 below)

    INPUT.f32   raw little-endian float32 inputs, [N][C][H][W] (a flat model: N,1,1,FEATURES)
    LOGITS.f32  raw little-endian float32, mnistcu's outputs for the same inputs, [N][CLASSES]

Steps:
    1. onnx.load and onnx.checker.check_model(model, full_check=True) (without full_check on an
       onnx that lacks it);
    2. prints the IR version, opsets, producer, the nodes' op types, the inputs and outputs with
       their shapes, and warns about things ONNX Runtime users trip on (a fixed batch dimension,
       a non-float32 input);
    3. runs the model on the CPU with the Python package onnxruntime (--runtime python, or auto
       when it imports), else with node tools/onnx_run.js and onnxruntime-node (--runtime node,
       or auto without the Python package; install it with sh tools/fetch_onnxruntime.sh). The
       input is fed with the shape the model declares: [N,C,H,W], or [N,C*H*W] for a flat input;
    4. compares the first output with LOGITS.f32: max_diff = max over samples of max |a-b| / max(1, max |b|) (b: the expected logits)
       values, argmax_agree = the fraction of the N samples whose argmax agrees.

The last line printed is JSON:
    {"checker": "ok", "runtime": "node", "max_diff": 3e-07, "argmax_agree": 1.0, "ok": true, ...}

Exit status: 0 the outputs agree (max_diff <= tol), 1 they differ (or the model does not run),
2 the checker rejects the model (or it cannot be read), 3 skipped: no ONNX Runtime available,
4 bad arguments or files.

Tested with Python 3.11, onnx 1.12 and numpy 1.24 (no onnxruntime: the node runtime), and with
Python 3.12, onnx 1.23, onnxruntime 1.30 and numpy 2.5.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import onnx
except ImportError:  # pragma: no cover - reported in main()
    onnx = None

EXIT_OK, EXIT_DIFFER, EXIT_CHECKER, EXIT_SKIPPED, EXIT_USAGE = 0, 1, 2, 3, 4
CHUNK = 1000
HERE = os.path.dirname(os.path.abspath(__file__))


class Failure(Exception):
    """An error to report, with the exit status it ends with."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


FIRST_KEYS = ("checker", "runtime", "max_diff", "argmax_agree", "ok")


def emit(result):
    """Print the result as one JSON line, the keys of the summary first."""
    ordered = {k: result[k] for k in FIRST_KEYS if k in result}
    ordered.update((k, v) for k, v in result.items() if k not in ordered)
    print(json.dumps(ordered), flush=True)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits with EXIT_USAGE (argparse's 2 means a checker failure here)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, "%s: error: %s\n" % (self.prog, message))


# ---------------------------------------------------------------------------------------------
# Step 1 and 2: the checker and a description of the graph


def elem_type_name(t):
    try:
        return onnx.TensorProto.DataType.Name(t)
    except (ValueError, AttributeError):
        return str(t)


def dims_of(value_info):
    """The dims of a graph input or output: ints, dim_param names, or '?'; None for no shape."""
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append("?")
    return dims


def describe_value(v):
    dims = dims_of(v)
    shape = "unknown shape" if dims is None else "[" + ", ".join(str(d) for d in dims) + "]"
    return "%s: %s %s" % (v.name, elem_type_name(v.type.tensor_type.elem_type), shape)


def check_model(path):
    """Load and check the model; print what it holds. Returns (model, summary dict)."""
    if onnx is None:
        raise Failure(EXIT_USAGE, "the Python package onnx is missing (Debian: apt-get install python3-onnx)")
    try:
        model = onnx.load(path)
    except FileNotFoundError:
        raise Failure(EXIT_USAGE, "no such model file: %s" % path)
    except Exception as e:  # a protobuf decode error, mostly
        raise Failure(EXIT_CHECKER, "onnx.load cannot read %s: %s" % (path, e))
    try:
        try:
            onnx.checker.check_model(model, full_check=True)
            mode = "full_check"
        except TypeError:  # an onnx without full_check
            onnx.checker.check_model(model)
            mode = "check_model"
    except Exception as e:
        raise Failure(EXIT_CHECKER, "onnx.checker rejects %s: %s" % (path, str(e).strip()))

    g = model.graph
    initializers = {t.name for t in g.initializer}
    inputs = [v for v in g.input if v.name not in initializers]
    opsets = {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}
    ops = [n.op_type if not n.domain else "%s:%s" % (n.domain, n.op_type) for n in g.node]
    params = sum(int(np.prod(t.dims)) if len(t.dims) else 1 for t in g.initializer)

    print("model %s: checker ok (%s, onnx %s)" % (path, mode, onnx.__version__))
    print("  ir_version %d, opset %s, producer %s %s" % (
        model.ir_version, ", ".join("%s %d" % kv for kv in sorted(opsets.items())),
        model.producer_name or "-", model.producer_version or ""))
    print("  %d nodes: %s" % (len(ops), " ".join(ops)))
    print("  %d initializers, %d parameters" % (len(g.initializer), params))
    for v in inputs:
        print("  input  " + describe_value(v))
    for v in g.output:
        print("  output " + describe_value(v))

    warnings = []
    if len(inputs) != 1:
        warnings.append("%d graph inputs besides the initializers; one is expected" % len(inputs))
    for v in list(inputs) + list(g.output):
        dims = dims_of(v)
        if v.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            warnings.append("%s is %s, not FLOAT" % (v.name, elem_type_name(v.type.tensor_type.elem_type)))
        if dims and isinstance(dims[0], int):
            warnings.append("%s has a fixed batch dimension %d; a dim_param (e.g. 'batch') lets any N run"
                            % (v.name, dims[0]))
    for w in warnings:
        print("  warning: " + w)
    sys.stdout.flush()
    summary = {
        "ir_version": int(model.ir_version),
        "opset": opsets.get("ai.onnx"),
        "ops": sorted(set(ops)),
        "inputs": [{"name": v.name, "shape": dims_of(v)} for v in inputs],
        "outputs": [{"name": v.name, "shape": dims_of(v)} for v in g.output],
    }
    return model, summary


# ---------------------------------------------------------------------------------------------
# Step 3: running the model


def feed_tail(declared, c, h, w):
    """Dims after the batch one to feed, for an input declared as `declared` (None: unknown)."""
    features = c * h * w
    if not declared:
        return None
    rest = list(declared[1:])
    if rest and all(isinstance(d, int) and d > 0 for d in rest):
        if int(np.prod(rest)) != features:
            raise Failure(EXIT_USAGE, "the model input is %s, %d values a sample, but C*H*W = %d"
                          % (declared, int(np.prod(rest)), features))
        return rest
    if len(declared) == 4:
        return [c, h, w]
    if len(declared) == 3:
        return [c, h * w]
    if len(declared) == 2:
        return [features]
    raise Failure(EXIT_USAGE, "cannot feed C, H, W to a model input of shape %s" % (declared,))


def run_python(ort, model_path, x, n, c, h, w):
    so = ort.SessionOptions()
    t0 = time.perf_counter()
    try:
        sess = ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise Failure(EXIT_DIFFER, "onnxruntime cannot load %s: %s" % (model_path, e))
    load_seconds = time.perf_counter() - t0
    ins = sess.get_inputs()
    if len(ins) != 1:
        raise Failure(EXIT_DIFFER, "the model has %d inputs; one is expected" % len(ins))
    inp = ins[0]
    if inp.type not in ("tensor(float)", None):
        raise Failure(EXIT_DIFFER, "the model input %s is %s, not tensor(float)" % (inp.name, inp.type))
    declared = [d if isinstance(d, int) else (d or "?") for d in inp.shape] if inp.shape is not None else None
    tail = feed_tail(declared, c, h, w)
    tails = [tail] if tail is not None else [[c, h, w], [c * h * w]]
    chunk = CHUNK
    if declared and isinstance(declared[0], int) and declared[0] > 0:
        chunk = declared[0]
        if n % chunk:
            raise Failure(EXIT_DIFFER, "the model has a fixed batch dimension of %d, which does not divide N = %d"
                          % (chunk, n))
        if chunk != n:
            sys.stderr.write("onnx_check: warning: the model input has a fixed batch dimension of %d (a dynamic one "
                             "is expected); running %d batches of %d\n" % (chunk, n // chunk, chunk))
    out_name = sess.get_outputs()[0].name
    x = x.reshape(n, c * h * w)
    parts, seconds, used = [], 0.0, None
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        errors = []
        for t in ([used] if used is not None else tails):
            xb = np.ascontiguousarray(x[start:start + m].reshape([m] + list(t)))
            t1 = time.perf_counter()
            try:
                y = sess.run([out_name], {inp.name: xb})[0]
            except Exception as e:
                errors.append("%s: %s" % ([m] + list(t), e))
                continue
            seconds += time.perf_counter() - t1
            used = t
            break
        else:
            raise Failure(EXIT_DIFFER, "onnxruntime run failed with input shape " + "; with ".join(errors))
        y = np.asarray(y)
        if y.ndim == 0 or y.shape[0] != m:
            raise Failure(EXIT_DIFFER, "output %s has shape %s for a batch of %d" % (out_name, list(y.shape), m))
        parts.append(y.astype(np.float32, copy=False))
    y = np.concatenate(parts, axis=0)
    return y, {"seconds": seconds, "load_seconds": load_seconds, "input_shape": [n] + list(used),
               "onnxruntime": getattr(ort, "__version__", None)}


def run_node(node, model_path, input_path, n, c, h, w):
    script = os.path.join(HERE, "onnx_run.js")
    tmpdir = tempfile.mkdtemp(prefix="onnx_check.")
    out_path = os.path.join(tmpdir, "output.f32")
    try:
        proc = subprocess.run([node, script, model_path, input_path, str(n), str(c), str(h), str(w), out_path],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        if proc.stderr:
            sys.stderr.write(proc.stderr)
        if proc.returncode == 3:
            return None, {"why": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "onnxruntime-node not found"}
        if proc.returncode != 0:
            said = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            raise Failure(EXIT_DIFFER if proc.returncode == 1 else EXIT_USAGE,
                          "tools/onnx_run.js failed (exit %d)%s" % (proc.returncode, ": " + said[-1] if said else ""))
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        info = json.loads(lines[-1])
        shape = info.get("output_shape") or [n, -1]
        y = np.fromfile(out_path, dtype="<f4")
        return y.reshape(shape), info
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Step 4: the comparison


def compare(y, expect, n):
    a = np.asarray(y, dtype=np.float64).reshape(-1)
    b = np.asarray(expect, dtype=np.float64).reshape(-1)
    both_nan = np.isnan(a) & np.isnan(b)
    per = a.size // n if n else 0
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
        d[both_nan] = 0.0
        d[np.isnan(d)] = np.inf
        if per:  # relative to the sample's largest logit (at least 1): a normwise error per sample
            scale = np.maximum(1.0, np.nanmax(np.abs(b).reshape(n, per), axis=1))
            d = (d.reshape(n, per) / scale[:, None]).reshape(-1)
    max_diff = float(d.max()) if d.size else 0.0
    worst = int(np.argmax(d)) if d.size else 0
    agree = float(np.mean(np.argmax(a.reshape(n, per), 1) == np.argmax(b.reshape(n, per), 1))) if per else 1.0
    return max_diff, agree, worst


# ---------------------------------------------------------------------------------------------


def parse_shape(s):
    try:
        dims = [int(v) for v in s.split(",")]
    except ValueError:
        dims = []
    if not 2 <= len(dims) <= 4 or any(d < 1 for d in dims):
        raise Failure(EXIT_USAGE, "--shape wants N,C,H,W (or N,FEATURES) of positive integers, not %r" % s)
    if len(dims) < 4:  # N,F -> N,1,1,F; N,H,W -> N,1,H,W
        dims = dims[:1] + [1] * (4 - len(dims)) + dims[1:]
    return dims


def main(argv=None):
    p = Parser(
        description="Check an ONNX file: onnx.checker, run it in ONNX Runtime, compare with expected logits.",
        epilog="The last line printed is JSON. Exit: 0 ok, 1 outputs differ, 2 checker fails, "
               "3 no ONNX Runtime, 4 bad arguments.")
    p.add_argument("model", help="the .onnx file")
    p.add_argument("--input", help="raw little-endian float32 inputs [N][C][H][W]")
    p.add_argument("--shape", help="N,C,H,W of --input (a flat model: N,1,1,FEATURES or N,FEATURES)")
    p.add_argument("--expect", help="raw little-endian float32 expected outputs (mnistcu's logits)")
    p.add_argument("--tol", type=float, default=1e-5, help="largest max |a-b|/max(1,|b|) accepted (default 1e-5)")
    p.add_argument("--runtime", choices=("auto", "python", "node"), default="auto",
                   help="python: the onnxruntime package; node: tools/onnx_run.js; auto: python if it imports")
    p.add_argument("--node", default=os.environ.get("NODE", "node"), help="the node binary (default: node, or $NODE)")
    p.add_argument("--save", metavar="OUTPUT.f32", help="also write the runtime's output there (raw float32)")
    args = p.parse_args(argv)

    result = {"checker": None, "model": args.model}
    try:
        given = [v is not None for v in (args.input, args.shape, args.expect)]
        if any(given) and not all(given):
            raise Failure(EXIT_USAGE, "--input, --shape and --expect go together")
        if not (args.tol >= 0):
            raise Failure(EXIT_USAGE, "--tol must be >= 0")
        shape = parse_shape(args.shape) if args.shape else None

        try:
            _, summary = check_model(args.model)
        except Failure as f:
            if f.code == EXIT_CHECKER:
                result["checker"] = "failed"
            raise
        result["checker"] = "ok"
        result.update(summary)
        if shape is None:
            result["ok"] = True
            emit(result)
            return EXIT_OK

        n, c, h, w = shape
        try:
            x = np.fromfile(args.input, dtype="<f4")
            expect = np.fromfile(args.expect, dtype="<f4")
        except OSError as e:
            raise Failure(EXIT_USAGE, "cannot read %s: %s" % (e.filename, e.strerror))
        if x.size != n * c * h * w:
            raise Failure(EXIT_USAGE, "%s holds %d float32 values, but --shape %s makes %d"
                          % (args.input, x.size, args.shape, n * c * h * w))
        if expect.size % n:
            raise Failure(EXIT_USAGE, "%s holds %d float32 values, not a multiple of N = %d" % (args.expect, expect.size, n))

        ort, why_not = None, []
        if args.runtime in ("auto", "python"):
            try:
                import onnxruntime as ort  # noqa: F811
            except ImportError as e:
                why_not.append("Python onnxruntime: %s" % e)
        y = None
        if ort is not None:
            result["runtime"] = "python"
            y, info = run_python(ort, args.model, x, n, c, h, w)
        elif args.runtime in ("auto", "node"):
            node = shutil.which(args.node)
            if node is None:
                why_not.append("no node binary (%s)" % args.node)
            else:
                y, info = run_node(node, args.model, args.input, n, c, h, w)
                if y is None:
                    why_not.append("node: %s" % info["why"])
                else:
                    result["runtime"] = "node"
        if y is None:
            print("skipped: no ONNX Runtime (%s); install the Python package onnxruntime, or run "
                  "sh tools/fetch_onnxruntime.sh for node" % "; ".join(why_not), flush=True)
            result.update({"runtime": None, "skipped": "no ONNX Runtime", "ok": None})
            emit(result)
            return EXIT_SKIPPED

        result["output_shape"] = [int(d) for d in y.shape]
        for k in ("seconds", "load_seconds", "input_shape", "onnxruntime"):
            if k in info:
                result[k] = round(info[k], 6) if isinstance(info[k], float) else info[k]
        if args.save:
            np.asarray(y, dtype="<f4").tofile(args.save)
        if y.size != expect.size:
            print("output %s of shape %s holds %d values, %s holds %d" % (
                "the model's", list(y.shape), y.size, args.expect, expect.size), flush=True)
            result.update({"max_diff": None, "argmax_agree": None, "ok": False,
                           "error": "output size %d != expected size %d" % (y.size, expect.size)})
            emit(result)
            return EXIT_DIFFER

        max_diff, agree, worst = compare(y, expect, n)
        ok = bool(max_diff <= args.tol)
        per = expect.size // n
        print("compared %d values (%d samples x %d): max_diff %.3g (tol %.3g) at sample %d value %d "
              "(got %.9g, expected %.9g), argmax agrees on %.4f" % (
                  expect.size, n, per, max_diff, args.tol, worst // per, worst % per,
                  float(np.asarray(y).reshape(-1)[worst]), float(expect[worst]), agree), flush=True)
        result.update({"max_diff": max_diff if math.isfinite(max_diff) else str(max_diff),
                       "argmax_agree": agree, "tol": args.tol, "ok": ok})
        emit(result)
        return EXIT_OK if ok else EXIT_DIFFER
    except Failure as f:
        print("error: %s" % f, file=sys.stderr, flush=True)
        result.update({"ok": False, "error": str(f)})
        emit(result)
        return f.code


if __name__ == "__main__":
    sys.exit(main())
