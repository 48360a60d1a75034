#!/usr/bin/env python3
"""PyTorch's side of the mnistcu benchmarks (configurations P1, P2, P3, P7 of BENCHMARKS.md).

    python3 bench/torch_bench.py P2 --mode eager            # on the GPU
    python3 bench/torch_bench.py P2 --mode graph            # the whole step in one CUDA graph
    python3 bench/torch_bench.py P7 --device cpu --threads 2
    python3 bench/torch_bench.py P2 --device cpu --epochs 1 --limit 6000   # quick test

Same data as bench.c (the gzip IDX files, read with gzip + numpy), inputs x/255, the same model
(nn.Sequential of nn.Linear/ReLU, PyTorch's default init), CrossEntropyLoss (mean), torch.optim.SGD,
the same batch size and steps per epoch (the last partial batch is trained too), FP32 (TF32 off).
The data lives on the device as uint8 and each batch is gathered and converted there.

Protocol: one warm-up epoch (not timed), then each epoch timed separately (torch.cuda.Event on the
GPU, perf_counter on the CPU), median of the epochs (P1: the total of its 10 epochs, on a model
reset to its initial weights after the warm-up, as bench.c uses a fresh model), then the test set
is evaluated after timing. One JSON line on stdout, human-readable lines on stderr.
"""
import argparse
import gzip
import json
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn

CONFIGS = {
    # layers, batch, lr, shuffle, default train limit, default timed epochs
    "P1": ([784, 1024, 10], 32, 0.01, False, 10000, 10),
    "P2": ([784, 128, 10], 64, 0.1, True, 0, 5),
    "P3": ([784, 1024, 1024, 10], 512, 0.1, True, 0, 5),
    "P7": ([784, 128, 10], 64, 0.1, True, 0, 5),
}


def log(*a):
    print("torch_bench:", *a, file=sys.stderr, flush=True)


def die(msg):
    print("torch_bench: FAILED: " + msg, file=sys.stderr, flush=True)
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
    x = load_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
    y = load_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    if x.shape[0] != y.shape[0]:
        die("%s: %d images but %d labels" % (prefix, x.shape[0], y.shape[0]))
    return x.reshape(x.shape[0], -1), y


def make_model(layers):
    mods = []
    for i in range(len(layers) - 1):
        mods.append(nn.Linear(layers[i], layers[i + 1]))
        if i < len(layers) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", choices=sorted(CONFIGS))
    ap.add_argument("--mode", choices=["eager", "graph"], default="eager")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--epochs", type=int, default=None, help="timed epochs (default 5; P1: 10)")
    ap.add_argument("--data", default="data/mnist")
    ap.add_argument("--limit", type=int, default=None, help="train on the first N images only (quick tests)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    args = ap.parse_args()

    layers, batch, lr, shuffle, limit, epochs = CONFIGS[args.config]
    if args.limit is not None:
        limit = args.limit
    if args.epochs is not None:
        epochs = args.epochs
    if epochs < 1:
        die("--epochs must be >= 1")
    device = args.device or ("cpu" if args.config == "P7" else "cuda")
    if args.config == "P7" and device != "cpu":
        die("P7 is the CPU configuration (use P2 for the GPU)")
    if device == "cuda" and not torch.cuda.is_available():
        die("--device cuda asked but torch.cuda.is_available() is False (torch %s, built for CUDA %s)"
            % (torch.__version__, torch.version.cuda))
    if args.mode == "graph" and device != "cuda":
        die("--mode graph needs --device cuda")
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    # FP32 everywhere, as mnistcu.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    dev = torch.device(device)

    xtr, ytr = load_split(args.data, "train")
    xte, yte = load_split(args.data, "t10k")
    if limit:
        xtr, ytr = xtr[:limit], ytr[:limit]
    X = torch.from_numpy(np.array(xtr, dtype=np.uint8)).to(dev)        # uint8 [N][784], resident
    Y = torch.from_numpy(ytr.astype(np.int64)).to(dev)
    Xte = torch.from_numpy(np.array(xte, dtype=np.uint8)).to(dev)
    Yte = torch.from_numpy(yte.astype(np.int64)).to(dev)
    N = X.shape[0]
    full_steps, tail = divmod(N, batch)
    inv255 = 1.0 / 255.0

    model = make_model(layers).to(dev)
    init_state = [p.detach().clone() for p in model.parameters()]
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_sum = torch.zeros((), dtype=torch.float32, device=dev)        # sum over samples of the loss, this epoch

    # The epoch's sample order: a permutation (or the identity for P1), kept in one static buffer.
    perm_buf = torch.arange(N, device=dev)
    arange_b = torch.arange(batch, device=dev)
    offset = torch.zeros((), dtype=torch.int64, device=dev)           # position of the next batch in perm_buf

    def eager_step(idx):
        x = X.index_select(0, idx).float().mul_(inv255)
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
        idx = perm_buf.index_select(0, arange_b + offset)
        x = X.index_select(0, idx).float().mul_(inv255)
        y = Y.index_select(0, idx)
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        loss_sum.add_(loss.detach(), alpha=float(batch))
        offset.add_(batch)

    graph = None
    if args.mode == "graph":
        if full_steps == 0:
            die("fewer training images than one batch: nothing to capture")
        # PyTorch's whole-network capture recipe: warm up on a side stream, zero_grad(set_to_none=True)
        # before capture, then capture one training step with static inputs.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                offset.zero_()
                graph_body()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            graph_body()
        torch.cuda.synchronize()
        # The last partial batch has another shape: it runs EAGERLY (one step per epoch), on the grad
        # tensors the graph owns (zeroed, accumulated, stepped: zero_grad(set_to_none=False) in eager_step).

    def new_order():
        if shuffle:
            perm_buf.copy_(torch.randperm(N, device=dev))
        loss_sum.zero_()
        offset.zero_()

    def run_epoch():
        new_order()
        if graph is not None:
            for _ in range(full_steps):
                graph.replay()
            if tail:
                eager_step(perm_buf[full_steps * batch:])
        else:
            for s0 in range(0, N, batch):
                eager_step(perm_buf[s0:s0 + batch])

    def timed_epoch():
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run_epoch()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            run_epoch()
            ms = 1e3 * (time.perf_counter() - t0)
        return ms, loss_sum.item() / N

    name = torch.cuda.get_device_name(dev) if device == "cuda" else "CPU (%d threads)" % torch.get_num_threads()
    log("%s %s on %s, torch %s, layers %s, %d training images, batch %d (%d full steps + %s), lr %g, %s, %d timed epochs"
        % (args.config, args.mode, name, torch.__version__, "-".join(map(str, layers)), N, batch, full_steps,
           ("a partial batch of %d" % tail) if tail else "no partial batch", lr,
           "shuffled" if shuffle else "file order", epochs))

    ms, loss = timed_epoch()
    log("warm-up epoch %.2f ms, loss %.4f (not timed)" % (ms, loss))
    if args.config == "P1":
        # P1's timed run starts from fresh weights: restore the initial ones in place (the captured
        # graph keeps pointing at the same parameter tensors; plain SGD has no optimizer state).
        with torch.no_grad():
            for p, p0 in zip(model.parameters(), init_state):
                p.copy_(p0)

    all_ms = []
    wall0 = time.perf_counter()
    for e in range(epochs):
        ms, loss = timed_epoch()
        all_ms.append(ms)
        log("epoch %d: %.3f ms, loss %.4f" % (e + 1, ms, loss))
    wall_s = time.perf_counter() - wall0

    # validate after timing
    model.eval()
    correct = 0
    with torch.no_grad():
        for s0 in range(0, Xte.shape[0], 1000):
            logits = model(Xte[s0:s0 + 1000].float().mul_(inv255))
            correct += int((logits.argmax(1) == Yte[s0:s0 + 1000]).sum().item())
    acc = correct / Xte.shape[0]
    med = statistics.median(all_ms)
    total_s = sum(all_ms) / 1e3
    if args.config == "P1":
        log("%s %s: total %.4f s for %d epochs (median epoch %.3f ms), test accuracy %.2f%%, train loss %.4f"
            % (args.config, args.mode, total_s, epochs, med, 100 * acc, loss))
    else:
        log("%s %s: median %.3f ms/epoch over %d epochs, test accuracy %.2f%%, train loss %.4f"
            % (args.config, args.mode, med, epochs, 100 * acc, loss))
    print(json.dumps({
        "impl": "torch-" + args.mode, "config": args.config, "device": device, "device_name": name,
        "torch": torch.__version__, "threads": torch.get_num_threads() if device == "cpu" else None,
        "train_images": N, "epochs": epochs, "epoch_ms_median": round(med, 4),
        "epoch_ms_all": [round(v, 4) for v in all_ms], "total_s": round(total_s, 6), "wall_s": round(wall_s, 6),
        "test_accuracy": acc, "train_loss": loss}), flush=True)


if __name__ == "__main__":
    main()
