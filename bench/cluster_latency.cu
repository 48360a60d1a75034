/* bench/cluster_latency.cu - the cluster MLP kernel's synchronisation alone: what a step of
   mnistcu.h's >>cuda_fused_clusters costs with no arithmetic at all.

   nvcc -x cu -O3 -arch=sm_90 -std=c++17 -o build/cluster_latency bench/cluster_latency.cu
   build/cluster_latency [steps [pause]]

   A step of that kernel has three exchanges on its path, one after the other:
     A  every block pushes its partial h (BM rows by U units) to the rows' owners in its cluster
        (st.async into their shared memory, counted on an mbarrier) and waits for its own rows';
     X  every block stores its rows' partial logits (R by C words, each with its step) to global
        memory and polls the same rows' words of the G - 1 other clusters until each carries the step;
     B  every block pushes its rows' h, dh and dz to every block of its cluster and waits for the
        batch's.
   Between them the kernel has block barriers (the phases read what other warps wrote). This program
   runs that skeleton, the same thread count (384), clusters (G = 16 of S = 6 blocks), mbarriers,
   push and poll helpers (the header's own) and the same bytes, with no products, no loss and no
   update: each exchange alone, and all three. The time a step of the full skeleton is the part of
   the kernel's step no arithmetic can remove while the design stays; bench/RESULTS.md compares it
   with the kernel's step (P1: R = 6 rows a block, U = 64 units a cluster; P2: R = 11, U = 8).
   Each configuration is timed over `steps` steps (default 4000) with CUDA events, after a warm-up
   launch; the figure is the median of 5 launches. `pause` (ns, default 64, as the header's polls;
   0: none) is the __nanosleep after a round of polls that still misses a word. */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"
#include <cooperative_groups.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>

enum { T = 384, S = MNISTCU__MC_S, GM = MNISTCU__MC_G, C = 10, CM = 16 };

struct lat_args {
    int steps, R, U, mode; /* mode: bit 0 A, bit 1 X, bit 2 B */
    unsigned pause;        /* ns after a round of polls that misses a word (0: none) */
    unsigned step0;
    unsigned long long *pz; /* [2][S][G][R C] */
};

/* shared memory (floats): rcv [S][R][U], hall [S R][U], dhall [S R][U], dzall [S R][CM], two mbarriers */
static size_t lat_smem(int R, int U) { return (size_t)(S * R * U + S * R * (2 * U + CM) + 4) * sizeof(float); }

__global__ void __launch_bounds__(T, 1) lat_kernel(lat_args a)
{
#ifdef MNISTCU__MC_ON
    extern __shared__ float4 lat_sm4[];
    float *sm = (float *)lat_sm4;
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const int t = (int)threadIdx.x, lane = t & 31, warp = t >> 5;
    const int r = (int)cl.block_rank(), g = (int)blockIdx.x / S, G = (int)gridDim.x / S;
    const int R = a.R, U = a.U, BM = S * R;
    float *rcv = sm, *hall = rcv + S * R * U, *dhall = hall + BM * U, *dzall = dhall + BM * U;
    float *bars = dzall + BM * CM;
    const uint32_t bA = (uint32_t)__cvta_generic_to_shared(bars), bB = bA + 8;
    const bool doA = a.mode & 1, doX = a.mode & 2, doB = a.mode & 4;
    const uint32_t txa = (uint32_t)(S * R * U * 4), txb = (uint32_t)(BM * (2 * U + CM) * 4);
    for (int e = t; e < S * R * (U + 2 * U + CM); e += T) sm[e] = 0.0f;
    if (t == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bA) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bB) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if (doA) mnistcu__mc_expect(bA, txa);
        if (doB) mnistcu__mc_expect(bB, txb);
    }
    cl.sync();
    float acc = 0.0f;
    for (int q = 0; q < a.steps; ++q) {
        const unsigned gstep = a.step0 + (unsigned)q + 1u;
        if (doA) { /* the partial h of the batch's rows to their owners */
            for (int e = t; e < BM * U / 4; e += T) {
                const int row = e / (U / 4), blk = row / R;
                const float4 v = make_float4(1.0f, 2.0f, 3.0f, (float)q);
                mnistcu__mc_push4(mnistcu__mc_mapa(rcv + (r * R + row - blk * R) * U + 4 * (e - row * (U / 4)), blk), v,
                                  mnistcu__mc_mapa(bars, blk));
            }
            mnistcu__mc_wait(bA, (uint32_t)q & 1u);
            if (t == 0 && q + 1 < a.steps) mnistcu__mc_expect(bA, txa);
        }
        __syncthreads(); /* h of own rows is read by the partial logits' threads */
        if (doX) {
            unsigned long long *dst = a.pz + (size_t)((gstep & 1u) * S + r) * (size_t)(R * C) * GM + g * (R * C);
            for (int e = t; e < R * C; e += T) mnistcu__mc_put(dst + e, gstep, rcv[e % (S * R * U)]);
        }
        __syncthreads(); /* the next batch's conversion's barrier */
        if (doX) { /* a half warp a row, lane c a class: the G clusters' words of this step */
            const int i = warp * 2 + (lane >> 4), c = lane & 15;
            if (i < R && c < C) {
                const unsigned long long *src = a.pz + (size_t)((gstep & 1u) * S + r) * (size_t)(R * C) * GM + i * C + c;
                unsigned wait = (1u << G) - 1u;
                unsigned long long v[GM];
                for (int gg = 0; gg < GM; ++gg) v[gg] = 0ull;
                do {
#pragma unroll
                    for (int gg = 0; gg < GM; ++gg)
                        if (wait >> gg & 1u) v[gg] = mnistcu__mc_get(src + gg * (R * C));
#pragma unroll
                    for (int gg = 0; gg < GM; ++gg)
                        if ((unsigned)(v[gg] >> 32) == gstep) wait &= ~(1u << gg);
                    if (wait && a.pause) __nanosleep(a.pause);
                } while (wait);
#pragma unroll
                for (int gg = 0; gg < GM; ++gg) acc += gg < G ? __uint_as_float((unsigned)v[gg]) : 0.0f;
            }
        }
        __syncthreads(); /* dz of own rows is read by dh's threads */
        __syncthreads(); /* dh of own rows is read by the pushes */
        if (doB) { /* h, dh and dz of own rows to every block */
            const int F = 2 * U / 4 + CM / 4;
            for (int e = t; e < R * F; e += T) {
                const int i = e / F, w = e - i * F, row = r * R + i;
                const float4 v = make_float4(acc, 1.0f, 2.0f, (float)q);
                float *d = w < U / 4 ? hall + row * U + 4 * w
                         : w < 2 * U / 4 ? dhall + row * U + 4 * (w - U / 4) : dzall + row * CM + 4 * (w - 2 * U / 4);
#pragma unroll
                for (int blk = 0; blk < S; ++blk) mnistcu__mc_push4(mnistcu__mc_mapa(d, blk), v, mnistcu__mc_mapa(bars + 2, blk));
            }
            mnistcu__mc_wait(bB, (uint32_t)q & 1u);
            if (t == 0 && q + 1 < a.steps) mnistcu__mc_expect(bB, txb);
        }
        __syncthreads(); /* the update's end */
    }
    if (acc == 12345.0f) a.pz[0] = 0ull; /* keeps the polls' values live */
    cl.sync();
#else
    (void)a; /* clusters need sm_90 and CUDA 12.1 or later: main says so */
    if (threadIdx.x == 0 && blockIdx.x == 0) printf("cluster_latency: built without sm_90's clusters\n");
#endif
}

static int launch(lat_args a, int G, cudaStream_t st)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3((unsigned)(G * S));
    cfg.blockDim = dim3(T);
    cfg.dynamicSmemBytes = lat_smem(a.R, a.U);
    cfg.stream = st;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = S;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, lat_kernel, a) == cudaSuccess ? 0 : 1;
}

int main(int argc, char **argv)
{
    const int steps = argc > 1 ? atoi(argv[1]) : 4000;
    const unsigned pause = argc > 2 ? (unsigned)atoi(argv[2]) : 64u;
    const struct { const char *name; int R, U; } shapes[] = {{"P2 (R 11, U 8)", 11, 8}, {"P1 (R 6, U 64)", 6, 64}};
    const struct { const char *name; int mode; } modes[] = {
        {"barriers only", 0}, {"A", 1}, {"X", 2}, {"B", 4}, {"A B", 5}, {"A X B (the step's skeleton)", 7}};
    const int G = GM;
    unsigned step0 = 0;
    unsigned long long *pz;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    if (steps < 1) return 2;
    if (cudaFuncSetAttribute(lat_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)lat_smem(11, 64)) != cudaSuccess ||
        cudaMalloc(&pz, sizeof(unsigned long long) * 2 * S * GM * 11 * C) != cudaSuccess ||
        cudaMemset(pz, 0, sizeof(unsigned long long) * 2 * S * GM * 11 * C) != cudaSuccess ||
        cudaStreamCreate(&st) != cudaSuccess || cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        fprintf(stderr, "cluster_latency: CUDA setup failed\n");
        return 1;
    }
    {
        cudaDeviceProp p;
        int clk = 0;
        cudaGetDeviceProperties(&p, 0);
        cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
        printf("device: %s, %d multiprocessors, %d MHz; %d clusters of %d blocks of %d threads; %d steps a launch; "
               "polls pause %u ns\n", p.name, p.multiProcessorCount, clk / 1000, G, S, T, steps, pause);
    }
    for (const auto &sh : shapes)
        for (const auto &md : modes) {
            float ms[6];
            for (int rep = 0; rep < 6; ++rep) { /* rep 0: warm-up */
                lat_args a = {steps, sh.R, sh.U, md.mode, pause, step0, pz};
                cudaEventRecord(e0, st);
                if (launch(a, G, st)) {
                    fprintf(stderr, "cluster_latency: launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
                    return 1;
                }
                cudaEventRecord(e1, st);
                if (cudaEventSynchronize(e1) != cudaSuccess) {
                    fprintf(stderr, "cluster_latency: %s\n", cudaGetErrorString(cudaGetLastError()));
                    return 1;
                }
                cudaEventElapsedTime(&ms[rep], e0, e1);
                step0 += (unsigned)steps; /* the words' steps go on across launches, as in the kernel */
            }
            std::sort(ms + 1, ms + 6);
            printf("%-16s %-30s %7.3f us a step (launches %.3f-%.3f ms)\n", sh.name, md.name, 1000.0 * ms[3] / steps,
                   ms[1], ms[5]);
        }
    return 0;
}
