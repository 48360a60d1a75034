#!/usr/bin/env python3
"""A timeline of the cluster MLP kernel (mnistcu.h, >>cuda_fused_clusters) across all its blocks:
patches a copy of the header so that thread 0 of every block reads %globaltimer (nanoseconds, one
clock for the whole GPU) at seven points of each step in a window of the model's steps, and prints
them at the end of the launch that ran them; `analyse` then places the step's time: how long after
the last cluster's partial logits were stored a block's polls were done, how far apart the clusters
stored them, and each phase's part. Figures: bench/RESULTS.md (2026-11-28, sixth block).

    rm -rf /tmp/tl && mkdir -p /tmp/tl && cp -r mnistcu.h bench examples /tmp/tl/
    python3 bench/variants/cluster_timeline.py patch /tmp/tl/mnistcu.h
    (cd /tmp/tl && nvcc -x cu -O3 -arch=sm_90 -o bench_tl bench/bench.c)
    /tmp/tl/bench_tl P2 --gemm own --fused-mlp-clusters on --epochs 1 --data data/mnist 2>&1 |
        python3 bench/variants/cluster_timeline.py analyse

The patch also prints, for each launch of the window, every block's kernel entry, loop start, loop
end and exit ("mctk"); for each mnistcu_train call, host microseconds from its call to the end of its
setup, the epoch's start, the plan, the chunk's launch returned, the statistics read (the stream
synchronised), the divergence check, and `done` ("mcth"; with "mcts" inside the setup); and each
device and pinned allocation's host time ("mcal"). `analyse` prints the launches and the "mcth"
lines before the step's table.

The points (thread 0 of the block): 0 the step's start; 1 the wait for the cluster's partials of h
done (mbarrier A); 2 its rows' partial logits stored and h pushed; 3 the next batch converted (the
polls start); 4 the barrier after the polls and the loss (every row of the block polled); 5 the wait
for the batch's h, dh and dz done (mbarrier B); 6 the step's end (its last block barrier). The window:
the model's steps TL0 to TL0 + TLN - 1 (below; in P2's second epoch, P1's fifth, counting the warm-up's)."""
import sys
import statistics as st

TL0, TLN = 1500, 32


def patch(path):
    src = open(path).read()

    def put(old, new):
        nonlocal src
        if src.count(old) != 1:
            sys.exit("cluster_timeline.py: %d matches for %r" % (src.count(old), old[:70]))
        src = src.replace(old, new)

    put("template <int BM, int U>\n__global__ void __launch_bounds__(MNISTCU__MC_T, 1) mnistcu__k_mc(mnistcu__mc_args a)",
        "__device__ unsigned long long mctl_buf[%d * %d * 7];\n" % (16 * 6, TLN) +
        "template <int BM, int U>\n__global__ void __launch_bounds__(MNISTCU__MC_T, 1) mnistcu__k_mc(mnistcu__mc_args a)")
    put("    for (int q = 0; q < a.nsteps; ++q) {\n        const int off = q * B, b = min(B, a.n - off);",
        """#define MCT(i) if (t == 0 && gstep - %du < %du) { unsigned long long g_; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(g_) :: "memory"); mctl_buf[((size_t)blockIdx.x * %d + (gstep - %du)) * 7 + (i)] = g_; }
    for (int q = 0; q < a.nsteps; ++q) {
        const int off = q * B, b = min(B, a.n - off);""" % (TL0, TLN, TLN, TL0))
    put("        const float inv_b = a.lsum ? 1.0f : 1.0f / (float)b;",
        "        const float inv_b = a.lsum ? 1.0f : 1.0f / (float)b;\n        MCT(0)")
    put("        mnistcu__mc_wait(bA, (uint32_t)q & 1u);", "        mnistcu__mc_wait(bA, (uint32_t)q & 1u); MCT(1)")
    put("        /* 3. while the other clusters catch up", "        MCT(2) /* 3. while the other clusters catch up")
    put("        {   /* 4, 5. the logits of own rows", "        MCT(3) {   /* 4, 5. the logits of own rows")
    put("        for (e = t; e < Rr * U; e += T) { /* dh of own rows", "        MCT(4) for (e = t; e < Rr * U; e += T) { /* dh of own rows")
    put("            mnistcu__mc_wait(bB, (uint32_t)q & 1u);", "            mnistcu__mc_wait(bB, (uint32_t)q & 1u); MCT(5)")
    put("        if (t < Rr) labs[((q + 1) & 1) * L::R + t] = labn;\n        __syncthreads();\n    }",
        """        if (t < Rr) labs[((q + 1) & 1) * L::R + t] = labn;
        __syncthreads(); MCT(6)
    }
    if (t == 0)
        for (int q = 0; q < a.nsteps; ++q) {
            const unsigned s_ = a.step0 + (unsigned)q + 1u;
            if (s_ - %du >= %du) continue;
            const unsigned long long *p_ = mctl_buf + ((size_t)blockIdx.x * %d + (s_ - %du)) * 7;
            printf("mctl %%d %%d %%u %%llu %%llu %%llu %%llu %%llu %%llu %%llu\\n", g, r, s_, p_[0], p_[1], p_[2], p_[3], p_[4],
                   p_[5], p_[6]);
        }""" % (TL0, TLN, TLN, TL0))
    # the kernel's start, its loop's start and end, its end (every block, every launch)
    put("    typedef mnistcu__mc_lay<BM, U> L;\n    enum { S = MNISTCU__MC_S, T = MNISTCU__MC_T, GM = MNISTCU__MC_G, CM = L::CM,",
        """    unsigned long long mck_[4];
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(mck_[0]) :: "memory");
    typedef mnistcu__mc_lay<BM, U> L;
    enum { S = MNISTCU__MC_S, T = MNISTCU__MC_T, GM = MNISTCU__MC_G, CM = L::CM,""")
    put("    bool ahead = false;" if "    bool ahead = false;" in src else "    for (int q = 0; q < a.nsteps; ++q) {\n        const int off",
        ("    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(mck_[1]) :: \"memory\");\n" +
         ("    bool ahead = false;" if "    bool ahead = false;" in src else
          "    for (int q = 0; q < a.nsteps; ++q) {\n        const int off")))
    put("    if (t == 0)\n        for (int q = 0; q < a.nsteps; ++q) {\n            const unsigned s_",
        "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(mck_[2]) :: \"memory\");\n"
        "    if (t == 0)\n        for (int q = 0; q < a.nsteps; ++q) {\n            const unsigned s_")
    put("    cl.sync(); /* no block leaves while another may read its shared memory */\n#else",
        "    cl.sync(); /* no block leaves while another may read its shared memory */\n"
        "    asm volatile(\"mov.u64 %%0, %%%%globaltimer;\" : \"=l\"(mck_[3]) :: \"memory\");\n"
        "    if (t == 0 && a.step0 + 1u <= %du + %du - 1u && a.step0 + (unsigned)a.nsteps >= %du) /* the window's */\n"
        "        printf(\"mctk %%d %%d %%d %%llu %%llu %%llu %%llu\\n\", g, r, a.nsteps, mck_[0], mck_[1], mck_[2], mck_[3]);\n"
        "#else" % (TL0, TLN, TL0))
    # mnistcu_train's host time: its setup, the epoch's start, the plan, the kernel's launch returned, the
    # statistics read (the stream synchronised), the divergence check, the end (microseconds from its call)
    put("    uint64_t upd_steps0 = m ? m->upd_steps : 0;\n",
        "    uint64_t upd_steps0 = m ? m->upd_steps : 0;\n    double mth0 = mnistcu__now(), mth[6] = {0, 0, 0, 0, 0, 0};\n")
    put("    m->norm_shift = train->shift;\n", "    m->norm_shift = train->shift;\n    mth[0] = mnistcu__now();\n")
    put("        if ((r = mnistcu__epoch_begin(m, train, idx, n, &st))) goto done;\n",
        "        if ((r = mnistcu__epoch_begin(m, train, idx, n, &st))) goto done;\n        mth[1] = mnistcu__now();\n")
    put("            mnistcu__fused_plan_make(m, train, B, n, &o, aug.on, d.fused_cnn, d.fused_mlp_clusters, &fused);\n",
        "            mnistcu__fused_plan_make(m, train, B, n, &o, aug.on, d.fused_cnn, d.fused_mlp_clusters, &fused);\n"
        "        mth[2] = mnistcu__now();\n")
    put("if ((r = mnistcu__fused_chunk(m, train, &fused, &d, &o, epoch, steps, n, step, end))) goto done;\n",
        "if ((r = mnistcu__fused_chunk(m, train, &fused, &d, &o, epoch, steps, n, step, end))) goto done;\n"
        "                mth[3] = mnistcu__now();\n")
    put("                reported = step + 1;\n", "                reported = step + 1;\n                mth[4] = mnistcu__now();\n")
    put("                if ((r = mnistcu__finite_check(m, &guard, &st, &p, &res))) goto done;\n",
        "                if ((r = mnistcu__finite_check(m, &guard, &st, &p, &res))) goto done;\n"
        "                mth[5] = mnistcu__now();\n")
    i = src.index("MNISTCU_DEF mnistcu_result mnistcu_train(mnistcu_model *m, const mnistcu_dataset *train, const mnistcu_train_desc *desc,\n                                         mnistcu_train_result *result)\n{")
    j = src.index("\ndone:\n", i)
    src = src[:j] + """\ndone:
    fprintf(stderr, "mcth setup %.1f begin %.1f plan %.1f chunk %.1f stats %.1f check %.1f end %.1f us\\n",
            1e6 * (mth[0] - mth0), 1e6 * (mth[1] - mth0), 1e6 * (mth[2] - mth0), 1e6 * (mth[3] - mth0),
            1e6 * (mth[4] - mth0), 1e6 * (mth[5] - mth0), 1e6 * (mnistcu__now() - mth0));
""" + src[j + len("\ndone:\n"):]
    put("    if ((r = mnistcu__model_reserve(m, B))) return r;\n",
        "    if ((r = mnistcu__model_reserve(m, B))) return r;\n"
        "    fprintf(stderr, \"mcts reserved %.1f us\\n\", 1e6 * (mnistcu__now() - mth0));\n")
    put("    if ((r = mnistcu__finite_begin(m, &guard, !d.no_divergence_check, o.learning_rate))) goto done;\n",
        "    fprintf(stderr, \"mcts before the check %.1f us\\n\", 1e6 * (mnistcu__now() - mth0));\n"
        "    if ((r = mnistcu__finite_begin(m, &guard, !d.no_divergence_check, o.learning_rate))) goto done;\n"
        "    fprintf(stderr, \"mcts the check begun %.1f us\\n\", 1e6 * (mnistcu__now() - mth0));\n")
    # each device and pinned allocation's host time (mnistcu__cuda_malloc, cudaMallocHost)
    put("    e = cudaMalloc(p, bytes);\n    if (e != cudaSuccess) {\n        *p = NULL;\n        return mnistcu__cuda_check(ctx, e, what);",
        "    { double t_ = mnistcu__now(); e = cudaMalloc(p, bytes); fprintf(stderr, \"mcal %s %lu bytes %.1f us\\n\", what, "
        "(unsigned long)bytes, 1e6 * (mnistcu__now() - t_)); }\n    if (e != cudaSuccess) {\n        *p = NULL;\n"
        "        return mnistcu__cuda_check(ctx, e, what);")
    src = src.replace("cudaMallocHost(", "mctl_mallochost(")
    src = src.replace("/* >>cuda_fused_clusters ----", """static double mnistcu__now(void);
static cudaError_t mctl_mallochost(void **p, size_t bytes)
{
    double t_ = mnistcu__now();
    cudaError_t e = cudaMallocHost(p, bytes);
    fprintf(stderr, "mcal pinned %lu bytes %.1f us\\n", (unsigned long)bytes, 1e6 * (mnistcu__now() - t_));
    return e;
}
/* >>cuda_fused_clusters ----""", 1)
    open(path, "w").write(src)


def analyse(lines):
    ev = {}  # (g, r, step) -> [7 stamps]
    for ln in lines:
        if not ln.startswith("mctl "):
            continue
        f = ln.split()
        g, r, s = int(f[1]), int(f[2]), int(f[3])
        ev[(g, r, s)] = [int(x) for x in f[4:11]]
    kern, host = [], []
    for ln in lines:
        if ln.startswith("mctk "):
            f = ln.split()
            kern.append([int(x) for x in f[1:8]])
        elif ln.startswith("mcth "):
            host.append(ln.strip())
    if kern:  # a launch: the blocks' stamps (g, r, nsteps, entry, loop start, loop end, exit), by entry
        kern.sort(key=lambda k: k[3])
        launches, cur = [], [kern[0]]
        for k in kern[1:]:
            if k[3] - cur[0][3] > 200000:  # more than 200 us after the launch's first block: the next launch
                launches.append(cur)
                cur = [k]
            else:
                cur.append(k)
        launches.append(cur)
        print("launches (us): steps, first entry to last loop start (prologue), the loop, loop end to last exit")
        for L in launches:
            e0 = min(k[3] for k in L)
            print("  %4d steps, %3d blocks: prologue %7.1f  loop %8.1f  (%.3f us a step)  epilogue %6.1f  kernel %8.1f"
                  % (L[0][2], len(L), (max(k[4] for k in L) - e0) / 1e3, (max(k[5] for k in L) - max(k[4] for k in L)) / 1e3,
                     (max(k[5] for k in L) - max(k[4] for k in L)) / 1e3 / max(1, L[0][2]),
                     (max(k[6] for k in L) - max(k[5] for k in L)) / 1e3, (max(k[6] for k in L) - e0) / 1e3))
    for h in host:
        print("  " + h)
    if not ev:
        sys.exit("cluster_timeline.py: no mctl lines")
    G = max(k[0] for k in ev) + 1
    S = max(k[1] for k in ev) + 1
    steps = sorted({k[2] for k in ev})
    allv = sorted({v for e in ev.values() for v in e})
    diffs = [b - a for a, b in zip(allv, allv[1:]) if b > a]
    print("timeline: %d clusters of %d blocks, steps %d-%d; the timer's smallest step seen %d ns"
          % (G, S, steps[0], steps[-1], min(diffs) if diffs else -1))
    names = ["phase 1 and the wait for the partials of h (0-1)", "h, partial logits stored, h pushed (1-2)",
             "the next batch converted (2-3)", "polls and loss to the barrier after them (3-4)",
             "dh, pushes, the wait for the batch's h dh dz (4-5)", "the update (5-6)"]
    per = [[] for _ in names]
    stepdur, xlat, skew, dwait, late = [], [], [], [], {}
    for s in steps:
        for g in range(G):
            for r in range(S):
                e = ev.get((g, r, s))
                if not e:
                    continue
                for i in range(6):
                    per[i].append(e[i + 1] - e[i])
                n = ev.get((g, r, s + 1))
                if n:
                    stepdur.append(n[0] - e[0])
        for r in range(S):
            puts = [(ev[(g, r, s)][2], g) for g in range(G) if (g, r, s) in ev]
            if len(puts) < G:
                continue
            last, lg = max(puts)
            first = min(puts)[0]
            skew.append(last - first)
            late[lg] = late.get(lg, 0) + 1
            for g in range(G):
                xlat.append(ev[(g, r, s)][4] - last)
        # the wait B's end against the last block of the cluster to finish its polls
        for g in range(G):
            lastpoll = max(ev[(g, r, s)][4] for r in range(S) if (g, r, s) in ev)
            for r in range(S):
                if (g, r, s) in ev:
                    dwait.append(ev[(g, r, s)][5] - lastpoll)

    def q(v):
        v = sorted(v)
        return "median %6.0f  p10 %6.0f  p90 %6.0f" % (st.median(v), v[len(v) // 10], v[9 * len(v) // 10])

    print("ns, over blocks and steps:")
    for nm, v in zip(names, per):
        print("  %-52s %s" % (nm, q(v)))
    if stepdur:
        print("  %-52s %s" % ("a step (start to the next step's start)", q(stepdur)))
    print("  %-52s %s" % ("polls done after the last cluster's store (4 - max 2)", q(xlat)))
    print("  %-52s %s" % ("the clusters' stores apart (max 2 - min 2, a rank)", q(skew)))
    print("  %-52s %s" % ("wait B done after the cluster's last polls (5 - max 4)", q(dwait)))
    print("  the cluster that stored last, a count over ranks and steps: %s"
          % ", ".join("%d: %d" % (g, late[g]) for g in sorted(late)))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "patch":
        patch(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "analyse":
        analyse(list(open(sys.argv[2]) if len(sys.argv) > 2 else sys.stdin))
    else:
        sys.exit(__doc__)
