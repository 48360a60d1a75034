#!/usr/bin/env python3
"""PyTorch's side of the mnistcu benchmarks (configurations P1-P5 and P7 of BENCHMARKS.md).

    python3 bench/torch_bench.py P2 --mode eager            # on the GPU
    python3 bench/torch_bench.py P2 --mode graph            # the whole step in one CUDA graph
    python3 bench/torch_bench.py P2 --mode compile          # torch.compile (max-autotune kernels) + one CUDA graph
    python3 bench/torch_bench.py P4 --mode graph --cudnn-benchmark   # LeNet-5, cuDNN autotuning on
    python3 bench/torch_bench.py P5 --mode graph            # the Fashion-MNIST CNN (data/fashion-mnist)
    python3 bench/torch_bench.py P7 --device cpu --threads 2
    python3 bench/torch_bench.py P4 --device cpu --threads 2 --epochs 1 --limit 6400   # quick CPU run
    python3 bench/torch_bench.py P5 --smoke                 # a few steps on whatever device exists

Configurations:
    P1  first 10,000 MNIST train images in file order, 784-1024-10, batch 32, SGD lr 0.01, 10 epochs
    P2  MNIST 60k shuffled, 784-128-10, batch 64, SGD lr 0.1, per epoch
    P3  MNIST 60k shuffled, 784-1024-1024-10, batch 512, SGD lr 0.1, per epoch
    P4  MNIST 60k shuffled, LeNet-5 (mnistcu preset "lenet5"), batch 64, SGD momentum 0.9 lr 0.02
    P5  Fashion-MNIST 60k shuffled, the Fashion CNN (preset "fashion-cnn"), batch 64, SGD momentum 0.9 lr 0.02
    P7  P2 on the CPU

Same data as bench.c (the gzip IDX files, read with gzip + numpy), inputs x/255, the same model
(nn.Sequential exactly as mnistcu's layer list, so the state_dict names match; PyTorch's default init),
CrossEntropyLoss (mean), torch.optim.SGD, the same batch size and steps per epoch (the last partial
batch is trained too), FP32 (TF32 off for matmul and cuDNN). The data lives on the device as uint8
and each batch is gathered and converted there (and reshaped to [B][1][28][28] for the CNNs).

Protocol: one warm-up epoch (not timed; --warmup-limit N makes it the first N images only), then
each epoch timed separately (torch.cuda.Event on the GPU, perf_counter on the CPU), median of the
epochs (P1: the total of its 10 epochs, on a model reset to its initial weights after the warm-up, as
bench.c uses a fresh model), then the test set is evaluated after timing. One JSON line on stdout,
human-readable lines on stderr. Exits 1 on any failure, a non-finite loss included.

--smoke: a few steps (640 images, 1 epoch, 1,000 test images) on CUDA if available, else the CPU
(graph and compile modes fall back to eager without CUDA); it checks that the whole path runs, not its
speed.

--mode compile (PyTorch 2.x): the training step of graph mode (batch gather, forward, loss, backward,
optimizer.step(), loss accumulation) goes through torch.compile, then is captured and replayed exactly
as in graph mode (warm-up on a side stream, one torch.cuda.CUDAGraph per step, the partial batch eager).
--compile-mode max-autotune-no-cudagraphs (the default) is max-autotune (Inductor's Triton/template
GEMMs and convolutions chosen by timing them, coordinate-descent tuning) without Inductor's own CUDA
graphs, which cannot be captured inside ours: the compile happens in the warm-up steps, and the one
captured graph holds the compiled forward, the compiled backward (AOTAutograd; Dynamo breaks the graph
at loss.backward(), the autograd engine runs the compiled backward) and the compiled optimizer step.
--compile-mode max-autotune leaves the graphs to Inductor (CUDA graph trees: one graph per compiled
region, forward, backward and optimizer step, replayed from Python each step) and captures nothing
itself; its row is "torch-compile-inductor-graphs". TF32 stays off for Inductor's kernels too (they
follow torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32).

A run that fails (an exception, torch.compile missing or failing, no CUDA) prints one JSON line with
"failed": true and the "reason" on stdout, and exits 1.
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

import numpy as np
import torch
import torch.nn as nn

# model (a list of MLP widths or a preset name), batch, lr, momentum, shuffle, default train limit,
# default timed epochs, default data folder, expected parameter count
CONFIGS = {
    "P1": ([784, 1024, 10], 32, 0.01, 0.0, False, 10000, 10, "data/mnist", 814090),
    "P2": ([784, 128, 10], 64, 0.1, 0.0, True, 0, 5, "data/mnist", 101770),
    "P3": ([784, 1024, 1024, 10], 512, 0.1, 0.0, True, 0, 5, "data/mnist", 1863690),
    "P4": ("lenet5", 64, 0.02, 0.9, True, 0, 5, "data/mnist", 44426),
    "P5": ("fashion-cnn", 64, 0.02, 0.9, True, 0, 5, "data/fashion-mnist", 896522),
    "P7": ([784, 128, 10], 64, 0.1, 0.0, True, 0, 5, "data/mnist", 101770),
}


# what a failed run reports on stdout (impl, config, device), filled in once the arguments are read
FAIL_ROW = {}


def log(*a):
    print("torch_bench:", *a, file=sys.stderr, flush=True)


def die(msg):
    print("torch_bench: FAILED: " + msg, file=sys.stderr, flush=True)
    if FAIL_ROW:
        row = dict(FAIL_ROW)
        row.update({"failed": True, "reason": msg})
        print(json.dumps(row), flush=True)
    sys.exit(1)


def impl_name(mode, compile_mode, cudnn_benchmark):
    name = "torch-" + mode
    if mode == "compile" and compile_mode == "max-autotune":
        name += "-inductor-graphs"
    return name + ("+cudnn-benchmark" if cudnn_benchmark else "")


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


def make_model(spec):
    """(model, input shape of one sample): exactly mnistcu's layer lists, as torch.nn.Sequential."""
    if spec == "lenet5":
        # 1x28x28 conv5x5x6 relu maxpool2 conv5x5x16 relu maxpool2 flatten dense120 relu dense84 relu dense10
        return nn.Sequential(
            nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(256, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, 10)), (1, 28, 28)
    if spec == "fashion-cnn":
        # 1x28x28 conv3x3x64 maxpool2 relu conv3x3x128 maxpool2 relu flatten dense256 relu dense10
        return nn.Sequential(
            nn.Conv2d(1, 64, 3), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(64, 128, 3), nn.MaxPool2d(2), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3200, 256), nn.ReLU(),
            nn.Linear(256, 10)), (1, 28, 28)
    mods = []
    for i in range(len(spec) - 1):
        mods.append(nn.Linear(spec[i], spec[i + 1]))
        if i < len(spec) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods), (spec[0],)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", choices=sorted(CONFIGS))
    ap.add_argument("--mode", choices=["eager", "graph", "compile"], default="eager")
    ap.add_argument("--compile-mode", choices=["max-autotune-no-cudagraphs", "max-autotune"],
                    default="max-autotune-no-cudagraphs",
                    help="torch.compile mode of --mode compile: max-autotune-no-cudagraphs (default: the "
                         "compiled step captured in one CUDA graph by this program) or max-autotune "
                         "(Inductor's own CUDA graphs, no capture here)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="default: cpu for P7, else cuda (--smoke: cuda if available, else cpu)")
    ap.add_argument("--epochs", type=int, default=None, help="timed epochs (default 5; P1: 10)")
    ap.add_argument("--data", default=None, help="default: data/mnist (P5: data/fashion-mnist)")
    ap.add_argument("--limit", type=int, default=None, help="train on the first N images only (quick tests)")
    ap.add_argument("--warmup-limit", type=int, default=0,
                    help="warm-up epoch on the first N images of the order only (0: a whole epoch)")
    ap.add_argument("--test-limit", type=int, default=0, help="evaluate the first N test images only (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark = True (cuDNN picks algorithms by timing them)")
    ap.add_argument("--smoke", action="store_true",
                    help="a few steps on whatever device exists: checks the path runs, not its speed")
    args = ap.parse_args()

    model_spec, batch, lr, momentum, shuffle, limit, epochs, data_dir, want_params = CONFIGS[args.config]
    device = args.device
    mode = args.mode
    if args.smoke and device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    FAIL_ROW.update({"impl": impl_name(mode, args.compile_mode, args.cudnn_benchmark), "config": args.config,
                     "device": device or ("cpu" if args.config == "P7" else "cuda"), "torch": torch.__version__})
    if mode == "compile" and not hasattr(torch, "compile"):
        die("--mode compile needs PyTorch 2.x (torch.compile); this is torch %s" % torch.__version__)
    if args.smoke:
        if mode in ("graph", "compile") and device != "cuda":
            log("smoke: no CUDA device, %s mode falls back to eager" % mode)
            mode = "eager"
            FAIL_ROW["impl"] = impl_name(mode, args.compile_mode, args.cudnn_benchmark)
        limit = 640 if args.limit is None else args.limit
        epochs = 1 if args.epochs is None else args.epochs
        if not args.warmup_limit:
            args.warmup_limit = 2 * batch
        if not args.test_limit:
            args.test_limit = 1000
    if args.limit is not None:
        limit = args.limit
    if args.epochs is not None:
        epochs = args.epochs
    if args.data is not None:
        data_dir = args.data
    if epochs < 1:
        die("--epochs must be >= 1")
    if device is None:
        device = "cpu" if args.config == "P7" else "cuda"
    if args.config == "P7" and device != "cpu":
        die("P7 is the CPU configuration (use P2 for the GPU)")
    if device == "cuda" and not torch.cuda.is_available():
        die("--device cuda asked but torch.cuda.is_available() is False (torch %s, built for CUDA %s)"
            % (torch.__version__, torch.version.cuda))
    if mode in ("graph", "compile") and device != "cuda":
        die("--mode %s needs --device cuda" % mode)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    # FP32 everywhere, as mnistcu.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    torch.manual_seed(args.seed)
    dev = torch.device(device)

    xtr, ytr = load_split(data_dir, "train")
    xte, yte = load_split(data_dir, "t10k")
    if limit:
        xtr, ytr = xtr[:limit], ytr[:limit]
    if args.test_limit:
        xte, yte = xte[:args.test_limit], yte[:args.test_limit]
    X = torch.from_numpy(np.array(xtr, dtype=np.uint8)).to(dev)        # uint8 [N][784], resident
    Y = torch.from_numpy(ytr.astype(np.int64)).to(dev)
    Xte = torch.from_numpy(np.array(xte, dtype=np.uint8)).to(dev)
    Yte = torch.from_numpy(yte.astype(np.int64)).to(dev)
    N = X.shape[0]
    if N == 0:
        die("no training images")
    full_steps, tail = divmod(N, batch)
    inv255 = 1.0 / 255.0
    FAIL_ROW["train_images"] = N

    model, in_shape = make_model(model_spec)
    model = model.to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    if nparams != want_params:
        die("the %s model has %d parameters, expected %d" % (args.config, nparams, want_params))
    if X.shape[1] != int(np.prod(in_shape)):
        die("images have %d features, the model takes %s" % (X.shape[1], in_shape))
    bshape = (-1,) + tuple(in_shape)                                    # [B][784] or [B][1][28][28]
    init_state = [p.detach().clone() for p in model.parameters()]
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_sum = torch.zeros((), dtype=torch.float32, device=dev)        # sum over samples of the loss, this epoch

    # The epoch's sample order: a permutation (or the identity for P1), kept in one static buffer.
    perm_buf = torch.arange(N, device=dev)
    arange_b = torch.arange(batch, device=dev)
    offset = torch.zeros((), dtype=torch.int64, device=dev)           # position of the next batch in perm_buf

    def eager_step(idx):
        x = X.index_select(0, idx).float().mul_(inv255).view(bshape)
        y = Y.index_select(0, idx)
        # eager mode: PyTorch 2's default (grads dropped, no zeroing kernels); graph mode's eager tail:
        # zero in place the grad tensors the captured graph writes, so they stay the graph's
        opt.zero_grad(set_to_none=graph is None)
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        loss_sum.add_(loss.detach(), alpha=float(idx.shape[0]))

    def graph_body():
        # Everything on the device, so one replay is one whole training step: the batch's indices come
        # from the static permutation buffer at a device-side offset that the graph itself advances.
        # (compile mode: this is the step given to torch.compile)
        idx = perm_buf.index_select(0, arange_b + offset)
        x = X.index_select(0, idx).float().mul_(inv255).view(bshape)
        y = Y.index_select(0, idx)
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        loss_sum.add_(loss.detach(), alpha=float(batch))
        offset.add_(batch)

    graph = None
    step_fn = graph_body
    setup_s = 0.0
    if mode == "compile":
        # The whole step through torch.compile. Nothing is compiled yet: the first calls (the warm-up
        # steps below, or the warm-up epoch with Inductor's graphs) compile and autotune. The model
        # itself stays uncompiled, so the eager partial batch and the test evaluation run eagerly.
        step_fn = torch.compile(graph_body, mode=args.compile_mode)
    capture = mode == "graph" or (mode == "compile" and args.compile_mode != "max-autotune")
    if mode == "compile" and not capture:
        # Inductor's CUDA graph trees copy each input that is not at a static address into the graph's
        # own buffers at every replay: the resident data and the step's buffers never move, say so.
        from torch import _dynamo
        for t in (X, Y, perm_buf, arange_b, offset, loss_sum):
            _dynamo.mark_static_address(t, guard=False)
    if capture:
        if full_steps == 0:
            die("fewer training images than one batch: nothing to capture")
        # PyTorch's whole-network capture recipe: warm up on a side stream, zero_grad(set_to_none=True)
        # before capture, then capture one training step with static inputs. With momentum, the
        # warm-up steps create the momentum buffers, which the captured step then updates in place.
        # In compile mode the first warm-up step compiles (and autotunes), the second recompiles the
        # optimizer step when the momentum buffers have just been created, the third runs what the
        # capture then records: nothing compiles while capturing.
        t_setup = time.perf_counter()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                offset.zero_()
                step_fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            step_fn()
        torch.cuda.synchronize()
        setup_s = time.perf_counter() - t_setup
        log("%s mode: the warm-up steps%s and the capture took %.1f s"
            % (mode, " (torch.compile %s: compile and autotune)" % args.compile_mode if mode == "compile" else "",
               setup_s))
        # The last partial batch has another shape: it runs EAGERLY (one step per epoch), on the grad
        # tensors the graph owns (zeroed, accumulated, stepped: zero_grad(set_to_none=False) in eager_step).
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def new_order():
        if shuffle:
            perm_buf.copy_(torch.randperm(N, device=dev))
        loss_sum.zero_()
        offset.zero_()

    def run_epoch(max_images=0):
        """One epoch (or its first max_images images, rounded up to whole batches); returns the images trained."""
        new_order()
        steps = full_steps
        do_tail = tail > 0
        if max_images:
            steps = min(full_steps, -(-max_images // batch))
            do_tail = do_tail and steps == full_steps and max_images >= N
        if graph is not None:
            for _ in range(steps):
                graph.replay()
            if do_tail:
                eager_step(perm_buf[full_steps * batch:])
        elif mode == "compile":
            # Inductor's CUDA graphs (--compile-mode max-autotune): the compiled step called once per
            # batch; it reads the batch at the device-side offset as in the captured graph.
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                if mark_step is not None:
                    mark_step()
                step_fn()
            if do_tail:
                eager_step(perm_buf[full_steps * batch:])
        else:
            for s0 in range(0, steps * batch, batch):
                eager_step(perm_buf[s0:s0 + batch])
            if do_tail:
                eager_step(perm_buf[full_steps * batch:])
        return steps * batch + (tail if do_tail else 0)

    def timed_epoch(max_images=0):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            n = run_epoch(max_images)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            n = run_epoch(max_images)
            ms = 1e3 * (time.perf_counter() - t0)
        loss = loss_sum.item() / max(n, 1)
        if not math.isfinite(loss):
            die("the training loss is %r" % loss)
        return ms, loss, n

    name = torch.cuda.get_device_name(dev) if device == "cuda" else "CPU (%d threads)" % torch.get_num_threads()
    model_name = model_spec if isinstance(model_spec, str) else "-".join(map(str, model_spec))
    log("%s %s%s on %s, torch %s, model %s (%d params), %d training images, batch %d (%d full steps + %s), "
        "lr %g, momentum %g, %s, %d timed epochs%s"
        % (args.config, mode + (" (%s)" % args.compile_mode if mode == "compile" else ""),
           " +cudnn.benchmark" if args.cudnn_benchmark else "", name, torch.__version__,
           model_name, nparams, N, batch, full_steps,
           ("a partial batch of %d" % tail) if tail else "no partial batch", lr, momentum,
           "shuffled" if shuffle else "file order", epochs, " (SMOKE TEST)" if args.smoke else ""))

    ms, loss, nw = timed_epoch(args.warmup_limit)
    log("warm-up epoch (%d images) %.2f ms, loss %.4f (not timed)" % (nw, ms, loss))
    if args.config == "P1":
        # P1's timed run starts from fresh weights: restore the initial ones in place (the captured
        # graph keeps pointing at the same parameter tensors; plain SGD has no optimizer state).
        with torch.no_grad():
            for p, p0 in zip(model.parameters(), init_state):
                p.copy_(p0)

    all_ms = []
    wall0 = time.perf_counter()
    for e in range(epochs):
        ms, loss, _ = timed_epoch()
        all_ms.append(ms)
        log("epoch %d: %.3f ms, loss %.4f" % (e + 1, ms, loss))
    wall_s = time.perf_counter() - wall0

    # validate after timing
    model.eval()
    correct = 0
    with torch.no_grad():
        for s0 in range(0, Xte.shape[0], 1000):
            logits = model(Xte[s0:s0 + 1000].float().mul_(inv255).view(bshape))
            correct += int((logits.argmax(1) == Yte[s0:s0 + 1000]).sum().item())
    acc = correct / Xte.shape[0]
    med = statistics.median(all_ms)
    total_s = sum(all_ms) / 1e3
    if args.config == "P1":
        log("%s %s: total %.4f s for %d epochs (median epoch %.3f ms), test accuracy %.2f%%, train loss %.4f"
            % (args.config, mode, total_s, epochs, med, 100 * acc, loss))
    else:
        log("%s %s: median %.3f ms/epoch over %d epochs, test accuracy %.2f%%, train loss %.4f"
            % (args.config, mode, med, epochs, 100 * acc, loss))
    impl = impl_name(mode, args.compile_mode, args.cudnn_benchmark)
    print(json.dumps({
        "impl": impl, "config": args.config, "device": device, "device_name": name,
        "torch": torch.__version__, "threads": torch.get_num_threads() if device == "cpu" else None,
        "model": model_name, "params": nparams, "batch": batch, "lr": lr, "momentum": momentum,
        "train_images": N, "warmup_images": nw, "test_images": int(Xte.shape[0]), "epochs": epochs,
        "epoch_ms_median": round(med, 4), "epoch_ms_all": [round(v, 4) for v in all_ms],
        "total_s": round(total_s, 6), "wall_s": round(wall_s, 6),
        "test_accuracy": acc, "train_loss": loss, "smoke": bool(args.smoke),
        "compile_mode": args.compile_mode if mode == "compile" else None,
        "setup_s": round(setup_s, 3)}), flush=True)
    if args.smoke:
        log("SMOKE OK: %s %s on %s ran %d + %d images, loss %.4f, test accuracy %.2f%% on %d images"
            % (args.config, mode, device, nw, N * epochs, loss, 100 * acc, Xte.shape[0]))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a compile or capture error included: report it as a failed row
        traceback.print_exc()
        die("%s: %s" % (type(e).__name__, " / ".join(str(e).split("\n"))[:600]))
