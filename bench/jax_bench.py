#!/usr/bin/env python3
"""JAX's side of the mnistcu benchmarks (configurations P1-P5 of BENCHMARKS.md): each epoch is one
jitted XLA program, a jax.lax.scan over the batches.

    python3 bench/jax_bench.py P2                 # on the GPU
    python3 bench/jax_bench.py P4 --epochs 3      # LeNet-5
    python3 bench/jax_bench.py P5                 # the Fashion-MNIST CNN (data/fashion-mnist)
    python3 bench/jax_bench.py P3 --smoke         # a few steps on whatever device JAX has

It mirrors bench/torch_bench.py: the same configurations (model, batch size, SGD learning rate and
momentum, shuffled or file order, images per epoch), the same data (the gzip IDX files, inputs x/255),
the same model (mnistcu's layer lists: dense, relu, conv 'VALID' stride 1, 2x2 max pooling, flatten;
weights and biases uniform in +-1/sqrt(fan_in), PyTorch's default initialisation scheme), softmax
cross-entropy (mean over the batch), SGD with PyTorch's momentum semantics (buf = momentum * buf + grad,
p -= lr * buf; no dampening; plain SGD without momentum), the same number of steps per epoch with the
last partial batch trained too. FP32: jax_default_matmul_precision = "highest", and every dot and
convolution also asks for Precision.HIGHEST (no TF32). Convolutions are jax.lax.conv_general_dilated
with NCHW inputs and OIHW weights, max pooling jax.lax.reduce_window; dense weights are stored [in][out].

One epoch = one call of one compiled program (jax.jit, compiled ahead of time with .lower().compile()
before the warm-up epoch, so no timed epoch includes compilation): draw the epoch's permutation
(jax.random.permutation; P1 keeps file order), jax.lax.scan over the full batches (gather the batch's
images and labels from the data resident on the device as uint8, convert to float32 x/255, forward,
loss, jax.value_and_grad, SGD update, loss accumulation), then the last partial batch as one more step
inside the same program (the step function traced a second time, with the partial batch's shape). The
parameters and momentum buffers are donated to the call, so XLA updates them in place.

Protocol as torch_bench.py: one warm-up epoch (not timed; --warmup-limit N: its first N images only,
rounded up to whole batches, a program of its own), then each epoch timed separately (wall clock around
the call and jax.block_until_ready on its results), median of the timed epochs (P1: the total of its
10 epochs, restarted from the initial weights after the warm-up), then the test set evaluated after
timing. One JSON line on stdout (the fields of torch_bench.py's rows, impl "jax-scan"), human-readable
lines on stderr. A failure (JAX not importable, no GPU, a compile error, a non-finite loss) prints a
JSON line with "failed": true and the "reason", and exits 1.

--smoke: a few steps (640 images, 1 epoch, 1,000 test images) on the GPU if JAX has one, else its CPU.
"""
import argparse
import gzip
import json
import math
import os
import statistics
import struct
import sys
import time
import traceback

np = None  # numpy, imported with JAX (which needs it) so that a python without either still reports a row
# model (a list of MLP widths or a preset name), batch, lr, momentum, shuffle, default train limit,
# default timed epochs, default data folder, expected parameter count: as torch_bench.py
CONFIGS = {
    "P1": ([784, 1024, 10], 32, 0.01, 0.0, False, 10000, 10, "data/mnist", 814090),
    "P2": ([784, 128, 10], 64, 0.1, 0.0, True, 0, 5, "data/mnist", 101770),
    "P3": ([784, 1024, 1024, 10], 512, 0.1, 0.0, True, 0, 5, "data/mnist", 1863690),
    "P4": ("lenet5", 64, 0.02, 0.9, True, 0, 5, "data/mnist", 44426),
    "P5": ("fashion-cnn", 64, 0.02, 0.9, True, 0, 5, "data/fashion-mnist", 896522),
}
IMPL = "jax-scan"
FAIL_ROW = {}


def log(*a):
    print("jax_bench:", *a, file=sys.stderr, flush=True)


def die(msg):
    print("jax_bench: FAILED: " + msg, file=sys.stderr, flush=True)
    if FAIL_ROW:
        row = dict(FAIL_ROW)
        row.update({"failed": True, "reason": msg})
        print(json.dumps(row), flush=True)
    sys.exit(1)


def load_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        die("%s: not an IDX file of unsigned bytes" % path)
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        die("%s: payload size %d does not match the dimensions %s" % (path, data.size, dims))
    return data.reshape(dims)


def load_split(data_dir, prefix):
    try:
        x = load_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
        y = load_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    except OSError as e:
        die("reading %s (%s): run sh data/fetch.sh or pass --data" % (data_dir, e))
    if x.shape[0] != y.shape[0]:
        die("%s: %d images but %d labels" % (prefix, x.shape[0], y.shape[0]))
    return x.reshape(x.shape[0], -1), y


def layer_list(spec):
    """(layers, input shape of one sample): mnistcu's layer lists, as torch_bench.make_model builds them."""
    if spec == "lenet5":
        # 1x28x28 conv5x5x6 relu maxpool2 conv5x5x16 relu maxpool2 flatten dense120 relu dense84 relu dense10
        return [("conv", 1, 6, 5), ("relu",), ("pool",), ("conv", 6, 16, 5), ("relu",), ("pool",), ("flatten",),
                ("dense", 256, 120), ("relu",), ("dense", 120, 84), ("relu",), ("dense", 84, 10)], (1, 28, 28)
    if spec == "fashion-cnn":
        # 1x28x28 conv3x3x64 maxpool2 relu conv3x3x128 maxpool2 relu flatten dense256 relu dense10
        return [("conv", 1, 64, 3), ("pool",), ("relu",), ("conv", 64, 128, 3), ("pool",), ("relu",), ("flatten",),
                ("dense", 3200, 256), ("relu",), ("dense", 256, 10)], (1, 28, 28)
    layers = []
    for i in range(len(spec) - 1):
        layers.append(("dense", spec[i], spec[i + 1]))
        if i < len(spec) - 2:
            layers.append(("relu",))
    return layers, (spec[0],)


def main():
    global np
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", choices=sorted(CONFIGS))
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="default: cuda (--smoke: cuda if JAX has a GPU, else cpu)")
    ap.add_argument("--epochs", type=int, default=None, help="timed epochs (default 5; P1: 10)")
    ap.add_argument("--data", default=None, help="default: data/mnist (P5: data/fashion-mnist)")
    ap.add_argument("--limit", type=int, default=None, help="train on the first N images only (quick tests)")
    ap.add_argument("--warmup-limit", type=int, default=0,
                    help="warm-up epoch on the first N images of the order only (0: a whole epoch)")
    ap.add_argument("--test-limit", type=int, default=0, help="evaluate the first N test images only (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="a few steps on whatever device exists: checks the path runs, not its speed")
    args = ap.parse_args()

    model_spec, batch, lr, momentum, shuffle, limit, epochs, data_dir, want_params = CONFIGS[args.config]
    FAIL_ROW.update({"impl": IMPL, "config": args.config, "device": args.device or "cuda"})
    try:
        import numpy as np
        import jax
        import jax.numpy as jnp
        from jax import lax
    except Exception as e:  # ImportError, or a broken installation
        die("JAX is not importable (%s: %s) by %s; install it (pip install -U \"jax[cuda12]\") or leave jax "
            "out of PEERS" % (type(e).__name__, e, sys.executable))
    FAIL_ROW["jax"] = jax.__version__
    jax.config.update("jax_default_matmul_precision", "highest")
    HI = lax.Precision.HIGHEST

    def gpu_devices():
        try:
            return jax.devices("gpu")
        except Exception:  # RuntimeError: no GPU platform (CPU-only jaxlib, or the CUDA plugin failed)
            return []

    device = args.device
    if args.smoke:
        if device is None:
            device = "cuda" if gpu_devices() else "cpu"
        limit = 640 if args.limit is None else args.limit
        epochs = 1 if args.epochs is None else args.epochs
        if not args.warmup_limit:
            args.warmup_limit = 2 * batch
        if not args.test_limit:
            args.test_limit = 1000
    if device is None:
        device = "cuda"
    FAIL_ROW["device"] = device
    if args.limit is not None:
        limit = args.limit
    if args.epochs is not None:
        epochs = args.epochs
    if args.data is not None:
        data_dir = args.data
    if epochs < 1:
        die("--epochs must be >= 1")
    if device == "cuda":
        gpus = gpu_devices()
        if not gpus:
            die("--device cuda asked but JAX %s has no GPU (default backend %s): install the CUDA build "
                "(pip install -U \"jax[cuda12]\")" % (jax.__version__, jax.default_backend()))
        dev = gpus[0]
    else:
        dev = jax.devices("cpu")[0]

    xtr, ytr = load_split(data_dir, "train")
    xte, yte = load_split(data_dir, "t10k")
    if limit:
        xtr, ytr = xtr[:limit], ytr[:limit]
    if args.test_limit:
        xte, yte = xte[:args.test_limit], yte[:args.test_limit]
    N = xtr.shape[0]
    FAIL_ROW["train_images"] = N
    full_steps, tail = divmod(N, batch)
    if full_steps == 0:
        die("fewer training images than one batch")
    X = jax.device_put(np.ascontiguousarray(xtr, dtype=np.uint8), dev)     # uint8 [N][784], resident
    Y = jax.device_put(ytr.astype(np.int32), dev)
    Xte = jax.device_put(np.ascontiguousarray(xte, dtype=np.uint8), dev)
    yte = yte.astype(np.int32)

    layers, in_shape = layer_list(model_spec)
    if X.shape[1] != int(np.prod(in_shape)):
        die("images have %d features, the model takes %s" % (X.shape[1], in_shape))
    bshape = (-1,) + tuple(in_shape)                                      # [B][784] or [B][1][28][28]
    inv255 = np.float32(1.0 / 255.0)

    # PyTorch's default initialisation scheme for nn.Linear and nn.Conv2d: weights and biases uniform
    # in [-1/sqrt(fan_in), 1/sqrt(fan_in)] (kaiming_uniform with a = sqrt(5) for the weights)
    key = jax.random.PRNGKey(args.seed)
    key, init_key = jax.random.split(key)
    params = []
    for layer in layers:
        if layer[0] == "dense":
            fan_in, wshape = layer[1], (layer[1], layer[2])
        elif layer[0] == "conv":
            fan_in, wshape = layer[1] * layer[3] * layer[3], (layer[2], layer[1], layer[3], layer[3])
        else:
            continue
        bound = 1.0 / math.sqrt(fan_in)
        init_key, kw, kb = jax.random.split(init_key, 3)
        params.append((jax.random.uniform(kw, wshape, jnp.float32, -bound, bound),
                       jax.random.uniform(kb, (wshape[0] if layer[0] == "conv" else wshape[1],), jnp.float32,
                                          -bound, bound)))
    nparams = sum(int(np.prod(w.shape)) + int(np.prod(b.shape)) for w, b in params)
    if nparams != want_params:
        die("the %s model has %d parameters, expected %d" % (args.config, nparams, want_params))
    init_host = [(np.asarray(w), np.asarray(b)) for w, b in params]      # P1 restarts from these

    def forward(p, x):
        i = 0
        for layer in layers:
            kind = layer[0]
            if kind == "dense":
                w, b = p[i]
                i += 1
                x = jnp.dot(x, w, precision=HI) + b
            elif kind == "conv":
                w, b = p[i]
                i += 1
                x = lax.conv_general_dilated(x, w, window_strides=(1, 1), padding="VALID",
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=HI)
                x = x + b.reshape(1, -1, 1, 1)
            elif kind == "relu":
                x = jax.nn.relu(x)
            elif kind == "pool":
                x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
            elif kind == "flatten":
                x = x.reshape(x.shape[0], -1)
        return x

    def prep(xb):
        return (xb.astype(jnp.float32) * inv255).reshape(bshape)

    def loss_fn(p, x, y):
        logp = jax.nn.log_softmax(forward(p, x))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def train_step(p, buf, xb, yb):
        loss, g = jax.value_and_grad(loss_fn)(p, prep(xb), yb)
        if momentum:
            buf = jax.tree_util.tree_map(lambda m, d: momentum * m + d, buf, g)
            g = buf
        p = jax.tree_util.tree_map(lambda w, d: w - lr * d, p, g)
        return p, buf, loss

    def make_epoch(steps, do_tail):
        """The program of one epoch: `steps` full batches (a lax.scan), then the partial batch if do_tail."""
        def epoch(p, buf, key, Xd, Yd):
            key, sub = jax.random.split(key)
            perm = jax.random.permutation(sub, N) if shuffle else jnp.arange(N, dtype=jnp.int32)

            def body(carry, idx):
                p, buf, lsum = carry
                p, buf, loss = train_step(p, buf, Xd[idx], Yd[idx])
                return (p, buf, lsum + loss * batch), None

            (p, buf, lsum), _ = lax.scan(body, (p, buf, jnp.zeros((), jnp.float32)),
                                         perm[:steps * batch].reshape(steps, batch))
            if do_tail:
                idx = perm[full_steps * batch:]
                p, buf, loss = train_step(p, buf, Xd[idx], Yd[idx])
                lsum = lsum + loss * tail
            return p, buf, key, lsum
        return epoch

    def momentum_buffers():
        return [(jnp.zeros_like(w), jnp.zeros_like(b)) for w, b in params] if momentum else []

    def epoch_plan(max_images):
        steps, do_tail = full_steps, tail > 0
        if max_images:
            steps = min(full_steps, -(-max_images // batch))
            do_tail = do_tail and steps == full_steps and max_images >= N
        return steps, do_tail

    params = jax.device_put(params, dev)
    buf = jax.device_put(momentum_buffers(), dev)
    key = jax.device_put(key, dev)
    programs = {}

    def program(plan):
        if plan not in programs:
            t0 = time.perf_counter()
            jitted = jax.jit(make_epoch(*plan), donate_argnums=(0, 1))
            programs[plan] = jitted.lower(params, buf, key, X, Y).compile()
            log("compiled the epoch program (%d steps%s) in %.2f s"
                % (plan[0], " + the partial batch" if plan[1] else "", time.perf_counter() - t0))
        return programs[plan]

    t_compile = time.perf_counter()
    program(epoch_plan(0))                                   # the timed epochs' program, before any timing
    compile_s = time.perf_counter() - t_compile

    def timed_epoch(max_images=0):
        nonlocal params, buf, key
        plan = epoch_plan(max_images)
        run = program(plan)
        t0 = time.perf_counter()
        params, buf, key, lsum = run(params, buf, key, X, Y)
        for leaf in jax.tree_util.tree_leaves((params, buf, key, lsum)):
            leaf.block_until_ready()
        ms = 1e3 * (time.perf_counter() - t0)
        n = plan[0] * batch + (tail if plan[1] else 0)
        loss = float(lsum) / n
        if not math.isfinite(loss):
            die("the training loss is %r" % loss)
        return ms, loss, n

    name = dev.device_kind
    model_name = model_spec if isinstance(model_spec, str) else "-".join(map(str, model_spec))
    log("%s on %s (%s), jax %s, model %s (%d params), %d training images, batch %d (%d full steps + %s), "
        "lr %g, momentum %g, %s, %d timed epochs%s"
        % (args.config, name, jax.default_backend(), jax.__version__, model_name, nparams, N, batch, full_steps,
           ("a partial batch of %d" % tail) if tail else "no partial batch", lr, momentum,
           "shuffled" if shuffle else "file order", epochs, " (SMOKE TEST)" if args.smoke else ""))

    ms, loss, nw = timed_epoch(args.warmup_limit)
    log("warm-up epoch (%d images) %.2f ms, loss %.4f (not timed)" % (nw, ms, loss))
    if args.config == "P1":
        # P1's timed run starts from fresh weights (plain SGD: no optimizer state to reset)
        params = jax.device_put(init_host, dev)
        buf = jax.device_put(momentum_buffers(), dev)

    all_ms = []
    wall0 = time.perf_counter()
    for e in range(epochs):
        ms, loss, _ = timed_epoch()
        all_ms.append(ms)
        log("epoch %d: %.3f ms, loss %.4f" % (e + 1, ms, loss))
    wall_s = time.perf_counter() - wall0

    # validate after timing
    predict = jax.jit(lambda p, xb: jnp.argmax(forward(p, prep(xb)), axis=1))
    correct = 0
    for s0 in range(0, Xte.shape[0], 1000):
        pred = np.asarray(predict(params, Xte[s0:s0 + 1000]))
        correct += int((pred == yte[s0:s0 + 1000]).sum())
    acc = correct / Xte.shape[0]
    med = statistics.median(all_ms)
    total_s = sum(all_ms) / 1e3
    if args.config == "P1":
        log("%s jax: total %.4f s for %d epochs (median epoch %.3f ms), test accuracy %.2f%%, train loss %.4f"
            % (args.config, total_s, epochs, med, 100 * acc, loss))
    else:
        log("%s jax: median %.3f ms/epoch over %d epochs, test accuracy %.2f%%, train loss %.4f"
            % (args.config, med, epochs, 100 * acc, loss))
    print(json.dumps({
        "impl": IMPL, "config": args.config, "device": device, "device_name": name,
        "jax": jax.__version__, "threads": None,
        "model": model_name, "params": nparams, "batch": batch, "lr": lr, "momentum": momentum,
        "train_images": N, "warmup_images": nw, "test_images": int(Xte.shape[0]), "epochs": epochs,
        "epoch_ms_median": round(med, 4), "epoch_ms_all": [round(v, 4) for v in all_ms],
        "total_s": round(total_s, 6), "wall_s": round(wall_s, 6),
        "test_accuracy": acc, "train_loss": loss, "smoke": bool(args.smoke),
        "compile_s": round(compile_s, 3)}), flush=True)
    if args.smoke:
        log("SMOKE OK: %s jax on %s ran %d + %d images, loss %.4f, test accuracy %.2f%% on %d images"
            % (args.config, device, nw, N * epochs, loss, 100 * acc, Xte.shape[0]))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a compile or runtime error of JAX/XLA included: report it as a failed row
        traceback.print_exc()
        die("%s: %s" % (type(e).__name__, " / ".join(str(e).split("\n"))[:600]))
