#!/usr/bin/env python3
"""Phase marks for the cluster MLP kernel (mnistcu.h, >>cuda_fused_clusters): patches a copy of the
header so that block 0's first thread adds clock64 differences per phase into shared memory and, at the
kernel's end, prints the cycles a step of each phase, the W1-gradient part of the update phase, and the
nanoseconds (%globaltimer) and cycles of a whole step. Figures: bench/RESULTS.md (2026-11-28).

    mkdir -p /tmp/ph && git archive HEAD | tar xf - -C /tmp/ph
    python3 bench/variants/cluster_phases.py /tmp/ph/mnistcu.h
    (cd /tmp/ph && nvcc -x cu -O3 -arch=sm_90 -DMNISTCU_CUBLAS -o bench_ph bench/bench.c -lcublas)
    /tmp/ph/bench_ph P1 --gemm own --fused-mlp-clusters on --data data/mnist 2>&1 | grep mcphases

The printed columns: phase 1 (partial h, pushed), the wait for the cluster's partials (mbarrier A),
phase 2 (h of own rows, partial logits, h pushed), phase 3 (the next batch) and the first warp's start
of phase 5, thread 0's polls of the other clusters' partial logits (its row's; 0 where it waits for
none), the rest of phase 5 (logits, loss, dz, dh), the pushes of dh and dz, the wait for the batch's h,
dh and dz (mbarrier B), then the rest of the update phase after thread 0's W1 tiles ("dw1"); with an
optimizer that keeps state, the W1 tiles' products and their general steps apart ("general steps"); and
thread 0's rounds of polls a step (1.00: its first loads already carried the step).
Block 0's thread 0 alone is timed: the other threads' time shows in the waits that follow.
Per-instruction stall reasons: bench/variants/cluster_ncu.py.
Exits non-zero where the header no longer has a marked place."""
import sys

path = sys.argv[1]
src = open(path).read()


def put(old, new):
    global src
    if src.count(old) != 1:
        sys.exit("cluster_phases.py: %d matches for %r" % (src.count(old), old[:70]))
    src = src.replace(old, new)


put("        total = ints + 4 * BM + 2 * R,\n", "        total = ints + 4 * BM + 2 * R + 40,\n")
put("    for (int q = 0; q < a.nsteps; ++q) {\n        const int off = q * B, b = min(B, a.n - off);",
    """    long long *mcp = blockIdx.x == 0 && t == 0 ? (long long *)(sm + ((L::total - 36) & ~1)) : NULL, mcl = 0;
    if (mcp) { for (int i_ = 0; i_ < 16; ++i_) mcp[i_] = 0; }
    long long mcg0 = 0, mcc0 = clock64(); if (mcp) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(mcg0));
#define MCM(i) if (mcp) { long long c_ = clock64(); if (i >= 0) mcp[i] += c_ - mcl; mcl = c_; }
    for (int q = 0; q < a.nsteps; ++q) {
        MCM(-1)
        const int off = q * B, b = min(B, a.n - off);""")
put("        mnistcu__mc_wait(bA, (uint32_t)q & 1u);", "        MCM(0) mnistcu__mc_wait(bA, (uint32_t)q & 1u); MCM(1)")
put("        /* 3. while the other clusters catch up", "        MCM(2) /* 3. while the other clusters catch up")
put("        {   /* 4, 5. the logits of own rows", "        MCM(3) {   /* 4, 5. the logits of own rows")
put("                do { /* a round: the missing words (the pairs with one), loaded together */",
    "                do { /* a round: the missing words (the pairs with one), loaded together */\n"
    "                    if (mcp) mcp[13] += 1;")
put("            if (lc) { /* 4. the G clusters' partials, polled until each carries this step */",
    "            if (t == 0) MCM(-1)\n            if (lc) { /* 4. the G clusters' partials, polled until each carries this step */")
put("                z = s2 + b2s[c];\n            }", "                z = s2 + b2s[c];\n            }\n            if (t == 0) MCM(4)")
put("        {   /* dh and dz of own rows (below BM)", "        MCM(5) {   /* dh and dz of own rows (below BM)")
put("            mnistcu__mc_wait(bB, (uint32_t)q & 1u);", "            MCM(6) mnistcu__mc_wait(bB, (uint32_t)q & 1u); MCM(7)")
put("            if (jz < W::NZ) {\n                float az[2][4];", "            MCM(9) if (jz < W::NZ) {\n                float az[2][4];")
# the general steps' part of thread 0's W1 tiles (momentum, Adam...): their products, then their steps
put("                if (a.xb) mnistcu__mc_tc_dw<BM, U, true>(xc, dhall, mt, n0, lane, acc);",
    "                long long mcx0 = clock64();\n                if (a.xb) mnistcu__mc_tc_dw<BM, U, true>(xc, dhall, mt, n0, lane, acc);")
put("                const mnistcu__opt ow = sopt[a.sst ? 2 : 0];\n",
    "                const mnistcu__opt ow = sopt[a.sst ? 2 : 0];\n"
    "                long long mcx1 = clock64();\n                if (mcp) { mcp[10] += mcx1 - mcx0; mcp[12] += 1; }\n")
put("#undef MNISTCU__MC_STEPS\n", "#undef MNISTCU__MC_STEPS\n                if (mcp) mcp[11] += clock64() - mcx1;\n")
put("        if (t < Rr) labs[((q + 1) & 1) * L::R + t] = labn;\n        __syncthreads();\n    }",
    """        if (t < Rr) labs[((q + 1) & 1) * L::R + t] = labn;
        __syncthreads(); MCM(8)
    }
    if (mcp) {
        long long g1_;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1_));
        printf("mcphases BM %d U %d steps %d: %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f\\n", BM, U, a.nsteps,
               (double)mcp[0] / a.nsteps, (double)mcp[1] / a.nsteps, (double)mcp[2] / a.nsteps,
               (double)mcp[3] / a.nsteps, (double)mcp[4] / a.nsteps, (double)mcp[5] / a.nsteps,
               (double)mcp[6] / a.nsteps, (double)mcp[7] / a.nsteps, (double)mcp[8] / a.nsteps);
        printf("mcphases general steps: products %.0f, steps %.0f, tiles %.0f a step\\n", (double)mcp[10] / a.nsteps,
               (double)mcp[11] / a.nsteps, (double)mcp[12] / a.nsteps);
        printf("mcphases polls: %.2f rounds a step\\n", (double)mcp[13] / a.nsteps);
        printf("mcphases dw1 %.0f; ns a step %.1f, cycles a step %.0f\\n", (double)mcp[9] / a.nsteps,
               (double)(g1_ - mcg0) / a.nsteps, (double)(clock64() - mcc0) / a.nsteps);
    }""")
open(path, "w").write(src)
