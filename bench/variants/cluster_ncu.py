#!/usr/bin/env python3
"""Nsight Compute on the cluster MLP kernel (mnistcu.h, >>cuda_fused_clusters).

ncu cannot profile the kernel as the library launches it: a launch with both a cluster dimension and the
cooperative attribute fails under it (LaunchFailed, or an illegal instruction, 2026-11-28, ncu 2025.3.1).
`patch` drops the cooperative attribute in a copy of the header. The kernel still needs every cluster
resident at once; on an idle GPU the plan's occupancy query makes sure of that, so the profile is of the
same code. `summary` reads ncu's source page (SASS, CSV) and prints, for each stretch of the kernel between
two barriers (block, cluster, or an mbarrier's wait), its share of the warp-state samples, with the top
stall reasons and the instructions it executes a step.

    mkdir -p /tmp/nc && git archive HEAD | tar xf - -C /tmp/nc
    python3 bench/variants/cluster_ncu.py patch /tmp/nc/mnistcu.h
    (cd /tmp/nc && nvcc -x cu -std=c++17 -O3 -arch=sm_90 -lineinfo -o mnistcu_nc examples/mnistcu_cli.c)
    ncu --clock-control none --replay-mode application --kernel-name-base demangled -k regex:'k_mc<' \\
        --launch-skip 1 --launch-count 1 --section WarpStateStats --section SourceCounters -o /tmp/p1 \\
        /tmp/nc/mnistcu_nc train --device cuda --layers 784-1024-10 --batch 32 --limit 10000 --epochs 2 \\
        --fused-mlp-clusters --quiet
    ncu -i /tmp/p1.ncu-rep --page source --csv --print-source sass > /tmp/p1.csv
    python3 bench/variants/cluster_ncu.py summary /tmp/p1.csv 313

(313: the launch's steps, an epoch of 10,000 samples at batch 32.) Application replay is what was
measured with; kernel replay was tried only before the patch, where it failed the same way.
Figures: bench/RESULTS.md (2026-11-28, third block)."""
import collections
import csv
import sys


def patch(path):
    src = open(path).read()
    old = "    cfg.numAttrs = 2;\n    /* the instance's limit"
    if src.count(old) != 1:
        sys.exit("cluster_ncu.py: %d matches for the cluster kernel's launch" % src.count(old))
    open(path, "w").write(src.replace(old, "    cfg.numAttrs = 1; /* no cooperative attribute, for ncu */\n"
                                           "    /* the instance's limit"))


def summary(path, steps):
    rows = list(csv.reader(open(path)))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Kernel Name" and "k_mc<" in r[1])
    hdr = rows[start + 1]
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    data = []
    for r in rows[start + 2:]:
        if not r or r[0] == "Kernel Name":
            break
        data.append(r)

    def num(r, k):
        v = r[ix[k]] if k in ix else ""
        return int(v) if v.strip().lstrip("-").isdigit() else 0

    total = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data) or 1
    blocks = max(1, max(num(r, "Instructions Executed") for r in data[:4]) // 12)  # warps: 12 a block
    segs, cur = [], None
    for i, r in enumerate(data):
        if cur is None:
            cur = {"first": i, "s": 0, "st": collections.Counter(), "ops": collections.Counter()}
        src = r[ix["Source"]].strip()
        words = src.split()
        op = (words[1] if src.startswith("@") and len(words) > 1 else words[0] if words else "").split(".")[0]
        cur["s"] += num(r, "Warp Stall Sampling (All Samples)")
        cur["ops"][op] += num(r, "Instructions Executed")
        for k in stalls:
            cur["st"][k[6:]] += num(r, k)
        if op in ("BAR", "UCGABAR_WAIT") or (op == "SYNCS" and "TRYWAIT" in src):
            cur["last"], cur["end"] = src, i
            segs.append(cur)
            cur = None
    if cur:
        cur["last"], cur["end"] = "(end)", len(data) - 1
        segs.append(cur)
    print("%d instructions, %d samples; per step and warp over %d steps of %d blocks" %
          (len(data), total, steps, blocks))
    for g in segs:
        if g["s"] < 0.003 * total:
            continue
        top = " ".join("%s %d%%" % (k, 100 * v // g["s"]) for k, v in g["st"].most_common(3) if v)
        ops = " ".join("%s %.0f" % (k, v / steps / blocks / 12) for k, v in g["ops"].most_common(6) if v)
        print("[%5d-%5d] %5.1f%%  %s\n      %s\n      up to: %s" %
              (g["first"], g["end"], 100.0 * g["s"] / total, top, ops, g["last"]))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "patch":
        patch(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "summary":
        summary(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    else:
        sys.exit(__doc__)
