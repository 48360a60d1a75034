#!/usr/bin/env python3
"""A timeline of the classifier head kernel (mnistcu.h, >>cuda_head, mnistcu__k_head) across all its
blocks: patches a copy of the header so that thread 0 of every block reads %globaltimer (nanoseconds,
one clock for the whole GPU) at six points of each launch in a window of launches, and the block that
takes the patch's ticket last prints, for each point, the earliest and the latest block relative to the earliest
block's start. `analyse` prints the medians over the window.

    rm -rf /tmp/hx && mkdir -p /tmp/hx && cp -r mnistcu.h bench examples /tmp/hx/
    python3 bench/variants/head_timeline.py patch /tmp/hx/mnistcu.h
    (cd /tmp/hx && nvcc -x cu -O3 -arch=sm_90a -o bench_hx bench/bench.c)
    /tmp/hx/bench_hx P3 --device cuda --gemm own --precision tf32x3 --epochs 1 --data data/mnist 2>&1 |
        python3 bench/variants/head_timeline.py analyse

The points (thread 0 of the block, a lane of the first row's logits): 0 the kernel's start, before
the wait for the kernel before it; 1 that wait done; 2 the first pass's weights and rows in shared
memory; 3 the logits done; 4 the rows' loss gradients in shared memory (the barrier after the loss);
5 the input gradients stored. The block that takes the patch's own ticket last prints them; the
kernel's statistics, where it sums them, come after. (The header before the kernel's changes of
2026-11-29 had two points more, the ticket and the statistics: 10.4-10.6 and 12.0 us in P3.)"""
import sys
import statistics as st

W0, WN = 200, 40
NP = 6


def patch(path):
    src = open(path).read()

    def put(old, new):
        nonlocal src
        if src.count(old) != 1:
            sys.exit("head_timeline.py: %d matches for %r" % (src.count(old), old[:70]))
        src = src.replace(old, new)

    put("template <int CT, int RES>\n__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_head(mnistcu__headp p)\n{\n    MNISTCU__PDL_WAIT();",
        "__device__ unsigned long long hdtl_buf[1024 * %d];\n__device__ unsigned hdtl_launch, hdtl_ticket;\n" % NP +
        "template <int CT, int RES>\n__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_head(mnistcu__headp p)\n{\n"
        "    const unsigned hl_ = *(volatile unsigned *)&hdtl_launch;\n"
        "#define HDT(i) if (threadIdx.x == 0 && hl_ - %du < %du && blockIdx.x < 1024) { unsigned long long g_; "
        "asm volatile(\"mov.u64 %%0, %%%%globaltimer;\" : \"=l\"(g_) :: \"memory\"); hdtl_buf[blockIdx.x * %d + (i)] = g_; }\n"
        "    HDT(0)\n    MNISTCU__PDL_WAIT();\n    HDT(1)" % (W0, WN, NP))
    put("        if (half == 0 && lane < C && live) {\n            const float4 *xq",
        "        if (k0 == 0) { HDT(2) }\n        if (half == 0 && lane < C && live) {\n            const float4 *xq")
    put("    if (half == 0 && lane < C && live) {\n        if (IN % 16) acc = acc + 0.0f;",
        "    HDT(3)\n    if (half == 0 && lane < C && live) {\n        if (IN % 16) acc = acc + 0.0f;")
    put("    __syncthreads(); /* the rows' gradients, to every thread */",
        "    __syncthreads(); /* the rows' gradients, to every thread */\n    HDT(4)")
    put("    if (!p.stats && !p.db) return;",
        """    HDT(5)
    __syncthreads();
    if (threadIdx.x == 0) { /* the block's ticket of its own: the last block prints the launch's points */
        __threadfence();
        if (atomicAdd(&hdtl_ticket, 1u) == gridDim.x - 1) {
            __threadfence();
            if (hl_ - %du < %du) {
                const int nb = gridDim.x < 1024 ? (int)gridDim.x : 1024;
                unsigned long long base = ~0ull, lo[6], hi[6];
                int b, i;
                for (b = 0; b < nb; ++b) base = min(base, ((volatile unsigned long long *)hdtl_buf)[b * %d]);
                for (i = 0; i < 6; ++i) {
                    lo[i] = ~0ull, hi[i] = 0;
                    for (b = 0; b < nb; ++b) {
                        const unsigned long long v = ((volatile unsigned long long *)hdtl_buf)[b * %d + i] - base;
                        lo[i] = min(lo[i], v), hi[i] = max(hi[i], v);
                    }
                }
                printf("hdtl %%u %%d %%llu %%llu %%llu %%llu %%llu %%llu %%llu %%llu %%llu %%llu %%llu %%llu\\n", hl_, nb,
                       lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], lo[3], hi[3], lo[4], hi[4], lo[5], hi[5]);
            }
            hdtl_ticket = 0;
            hdtl_launch = hl_ + 1;
        }
    }
    if (!p.stats && !p.db) return;""" % (W0, WN, NP, NP))
    open(path, "w").write(src)


def analyse():
    rows = []
    for line in sys.stdin:
        if line.startswith("hdtl "):
            rows.append([int(v) for v in line.split()[1:]])
    if not rows:
        sys.exit("head_timeline.py: no hdtl lines")
    names = ["start", "waited", "pass 0 staged", "logits done", "loss done", "dx stored"]
    print("%d launches, %d blocks; ns from the earliest block's start, medians (earliest block, latest block)" %
          (len(rows), rows[0][1]))
    for i, n in enumerate(names):
        lo = st.median(r[2 + 2 * i] for r in rows)
        hi = st.median(r[3 + 2 * i] for r in rows)
        print("%-16s %8.0f %8.0f" % (n, lo, hi))


if __name__ == "__main__":
    {"patch": lambda: patch(sys.argv[2]), "analyse": analyse}[sys.argv[1]]()
