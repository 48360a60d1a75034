/* bench/mlp_cluster.cu - a one-hidden-layer MLP's SGD steps in one kernel of thread-block clusters,
   with one cross-cluster exchange a step: how fast P1 and P2 can go when the sums may be reordered.

   nvcc -O3 -arch=sm_90 -std=c++17 -DREF_EPOCHS=0 -o build/mlp_cluster bench/mlp_cluster.cu
   build/mlp_cluster data/mnist ["P2 P1" [quick]]
   (-DREF_EPOCHS=1: the CPU reference trains the first epoch alongside, slowly; -DPHASES: block 0's
   clock a phase; -DLL: the exchange by tagged words instead of flags; "quick": the parity checks
   alone, for compute-sanitizer)

   The header's fused MLP kernel keeps the step-by-step path's bits, so each output is one chain of
   fmafs (784 long for the first layer), every block reads the whole batch, and a step has two
   grid-wide barriers. This design gives up those bits (a fixed order still: two runs give the same
   weights) for parallel sums:
     - G = 16 clusters of S blocks (S = 8 where 16 fit at once, else 6, else 4). Cluster g owns
       hidden units [g U, g U + U): their rows of W1, entries of b1 and columns of W2. Block r of a
       cluster owns the r-th slice of the inputs (about D / S of them) for those units, and rows
       [r R, r R + R) of the batch (R = B / S rounded up).
     - A step: partial sums of h over the block's slice; cluster barrier; for its rows, h from the S
       partials (distributed shared memory) and the cluster's partial logits over its U units,
       stored to global memory, then a flag; while the other clusters catch up, the next batch's
       slice (bytes loaded a step ahead) into floats; it waits for the flags of the blocks of rank
       r of every cluster (no grid barrier: the only data that crosses clusters); the logits of its
       rows (a half warp a row), their loss and dz, dh for its rows and units; cluster barrier;
       every block gathers h, dz and dh of the batch from the cluster, updates W2's columns, b1 and
       b2 (every block the same way, so the copies stay equal) and its slice of W1.
   Weights never leave the multiprocessors during an epoch. Prints the weights' distance from a
   CPU reference (sequential sums) after 1 and 20 steps, whether two runs agree bit for bit, and
   epoch times, losses and accuracies. Measured: bench/RESULTS.md (2026-11-27, night).
   The library's form of this design, for general shapes and every optimizer, is mnistcu.h's
   >>cuda_fused_clusters (mnistcu_train_desc.fused_mlp_clusters); this program stays as its first
   form, with the CPU reference and the phase marks the library's kernel was measured against. */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"
#include <cooperative_groups.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

namespace cg = cooperative_groups;
#ifndef REF_EPOCHS
#define REF_EPOCHS 1 /* epochs the CPU reference trains alongside */
#endif

#define T 384 /* threads a block: 8 warps for the partial sums; the W1 gradient's 2 x 132 tasks beside W2's 98 */
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

struct Args {
    const uint8_t *x;     /* [n][D] */
    const int32_t *lab;   /* [n] */
    const uint32_t *idx;  /* the epoch's order, [n] */
    int n, D, H, C, nsteps;
    unsigned step0;       /* the first step's global number (flags count steps across launches) */
    float scale, shift, lr;
    float *W1, *b1, *W2, *b2; /* PyTorch layouts: W1 [H][D], W2 [C][H] */
#ifdef LL
    unsigned long long *pz; /* [2][S][G][R C] partial logits, each with its step in the high word */
#else
    float *pz;            /* [2][S][G][R C] partial logits */
    unsigned *flags;      /* [G S] each block's last step whose partial logits are stored */
#endif
    float *loss;          /* [nsteps][B] cluster 0's rows' losses */
    int *ok;              /* [nsteps][B] correct */
};

/* ks: the input slice of block r of S: words [r W / S, (r + 1) W / S) of the W = D / 4 words */
__host__ __device__ static inline void slice_of(int D, int r, int S, int *k0, int *kn)
{
    int W = D / 4, w0 = r * W / S, w1 = (r + 1) * W / S;
    *k0 = 4 * w0;
    *kn = 4 * (w1 - w0);
}

template <int B, int U, int S> struct Lay {
    static constexpr int R = (B + S - 1) / S, NUG = U / 8, KSP = 8 / NUG, KMAX = 4 * ((196 + S - 1) / S) + 4;
    static constexpr int LDX = KMAX + 1; /* odd: lanes reading rows r, r + 1... hit distinct banks */
    static constexpr int CM = 16;        /* most classes */
    static constexpr int NPART = KSP * B * U > LDX * U ? KSP * B * U : LDX * U; /* >= 2 KMAX 8 */
    enum : int {
        w1s = 0,                      /* [KMAX][U] the slice of W1, units contiguous */
        xs = w1s + KMAX * U,          /* [2][B][LDX] the batch's slice, by step parity */
        ph = xs + 2 * B * LDX,        /* [KSP][B][U] partial h; then dW1's row halves */
        phs = ph + NPART,              /* [B][U] partial h over the slice (read by the cluster) */
        hrow = phs + B * U,           /* [R][U] h of own rows (read by the cluster) */
        dhrow = hrow + R * U,         /* [R][U] */
        dzrow = dhrow + R * U,        /* [R][CM] */
        hall = dzrow + R * CM,        /* [B][U] */
        dhall = hall + B * U,         /* [B][U] */
        dzall = dhall + B * U,        /* [B][CM] */
        w2s = dzall + B * CM,         /* [CM][U] */
        b1s = w2s + CM * U,           /* [U] */
        b2s = b1s + U,                /* [CM] */
        ints = b2s + CM,              /* sample indices [4][B] (steps q .. q + 3), own rows' labels [2][R] */
        total = ints + 4 * B + 2 * R
    };
};

#ifdef PHASES /* block 0's first thread sums its clock per phase */
#define NPH 10
__device__ unsigned long long d_ph[NPH];
#define PH(i)                                                                                      \
    do {                                                                                           \
        if (blockIdx.x == 0 && threadIdx.x == 0) {                                                 \
            long long c_ = clock64();                                                              \
            ph_acc[i] += c_ - ph_last;                                                             \
            ph_last = c_;                                                                          \
        }                                                                                          \
    } while (0)
#else
#define PH(i) ((void)0)
#endif

#ifdef LL
/* -DLL: a partial logit travels with its step number in one 8-byte word (single-copy atomic): the
   reader polls the values themselves, so no flag, fence or barrier orders them (measured slower on
   P2, bench/RESULTS.md). */
__device__ __forceinline__ unsigned long long ld_word(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_word(unsigned long long *p, float v, unsigned step)
{
    const unsigned long long w = (unsigned long long)step << 32 | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
#else
/* the default: the block stores its partial logits, then its flag with release semantics; the reader
   polls the flag with acquire semantics, then loads the values */
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(unsigned *p, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
#endif

/* The prefetch (mnistcu__mc_load) and its conversion to floats (mnistcu__mc_floats) are the library's
   own, from >>cuda_fused_clusters of the header included above. The library's kernel takes its
   products on the tensor cores; this program keeps them in FP32 fmafs, as first measured. */

/* acc[u] = the sum over rows [ra, rb) of x[row][k] dh[row][ug 8 + u] */
template <int U, int LDX>
__device__ __forceinline__ void dw1_rows(const float *x, const float *dh, int k, int ug, int ra, int rb, float *acc)
{
#pragma unroll
    for (int u = 0; u < 8; ++u) acc[u] = 0.0f;
#pragma unroll 4
    for (int row = ra; row < rb; ++row) {
        const float xv = x[row * LDX + k];
        const float4 da = *(const float4 *)(dh + row * U + ug * 8), db = *(const float4 *)(dh + row * U + ug * 8 + 4);
        acc[0] = fmaf(xv, da.x, acc[0]);
        acc[1] = fmaf(xv, da.y, acc[1]);
        acc[2] = fmaf(xv, da.z, acc[2]);
        acc[3] = fmaf(xv, da.w, acc[3]);
        acc[4] = fmaf(xv, db.x, acc[4]);
        acc[5] = fmaf(xv, db.y, acc[5]);
        acc[6] = fmaf(xv, db.z, acc[6]);
        acc[7] = fmaf(xv, db.w, acc[7]);
    }
}
/* w[0..8) -= lr g, as two float4 */
__device__ __forceinline__ void w1_step(float *w, const float *gr, float lr)
{
    float4 a = *(float4 *)w, b = *(float4 *)(w + 4);
    a.x -= lr * gr[0], a.y -= lr * gr[1], a.z -= lr * gr[2], a.w -= lr * gr[3];
    b.x -= lr * gr[4], b.y -= lr * gr[5], b.z -= lr * gr[6], b.w -= lr * gr[7];
    *(float4 *)w = a;
    *(float4 *)(w + 4) = b;
}

template <int B, int U, int S> __global__ void __launch_bounds__(T, 1) k_mlp(Args a)
{
    typedef Lay<B, U, S> L;
    constexpr int R = L::R, NUG = L::NUG, KSP = L::KSP, LDX = L::LDX, CM = L::CM;
    constexpr int GM = 16;                              /* most clusters */
    constexpr int NW = (B * (L::KMAX / 4) + T - 1) / T; /* prefetched words a thread */
    static_assert(R <= 2 * (T / 32), "a half warp a row");
    extern __shared__ float4 sm4[];
    float *sm = (float *)sm4;
    cg::cluster_group cl = cg::this_cluster();
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int r = (int)cl.block_rank(), g = blockIdx.x / S, G = gridDim.x / S;
    const int D = a.D, H = a.H, C = a.C, u0 = g * U;
    int k0, kn;
    slice_of(D, r, S, &k0, &kn);
    const int nw = kn / 4;
    float *w1s = sm + L::w1s, *xs = sm + L::xs, *ph = sm + L::ph, *phs = sm + L::phs, *hrow = sm + L::hrow;
    float *dhrow = sm + L::dhrow, *dzrow = sm + L::dzrow, *hall = sm + L::hall, *dhall = sm + L::dhall;
    float *dzall = sm + L::dzall, *w2s = sm + L::w2s, *b1s = sm + L::b1s, *b2s = sm + L::b2s;
    uint32_t *sidx = (uint32_t *)(sm + L::ints);
    int32_t *labs = (int32_t *)(sidx + 4 * B);
    uint32_t pre[NW];
    int pm[NW]; /* the words this thread prefetches: row << 8 | word, the same every step */
    int e;
#pragma unroll
    for (int i = 0; i < NW; ++i) {
        const int w = t + i * T, row = w / nw;
        pm[i] = row << 8 | (w - row * nw);
    }
#ifdef PHASES
    long long ph_acc[NPH] = {0}, ph_last = clock64();
#endif
    /* own parameters in */
    for (e = t; e < kn * U; e += T) {
        int k = e / U, u = e - k * U;
        w1s[e] = a.W1[(size_t)(u0 + u) * D + k0 + k];
    }
    for (e = t; e < C * U; e += T) {
        int c = e / U, u = e - c * U;
        w2s[e] = a.W2[(size_t)c * H + u0 + u];
    }
    for (e = t; e < U; e += T) b1s[e] = a.b1[u0 + e];
    for (e = t; e < C; e += T) b2s[e] = a.b2[e];
    {   /* steps 0 and 1's indices, step 0's labels and bytes (into xs[0]), step 1's bytes (in flight) */
        const int b0 = min(B, a.n), b1 = a.nsteps > 1 ? min(B, a.n - B) : 0;
        for (e = t; e < b0; e += T) sidx[e] = a.idx[e];
        for (e = t; e < b1; e += T) sidx[B + e] = a.idx[B + e];
        __syncthreads();
        if (t < R && r * R + t < b0) labs[t] = a.lab[sidx[r * R + t]];
        mnistcu__mc_load<NW>(pre, pm, b0, a.x, sidx, D, k0);
        mnistcu__mc_floats<NW, LDX>(pre, pm, b0, xs, a.scale, a.shift);
        mnistcu__mc_load<NW>(pre, pm, b1, a.x, sidx + B, D, k0);
        __syncthreads();
    }
    for (int q = 0; q < a.nsteps; ++q) {
        const int off = q * B, b = min(B, a.n - off);
        const int bn = q + 1 < a.nsteps ? min(B, a.n - off - B) : 0, bnn = q + 2 < a.nsteps ? min(B, a.n - off - 2 * B) : 0;
        const unsigned gstep = a.step0 + (unsigned)q + 1u;
        const float lr = a.lr, inv_b = 1.0f / (float)b;
        float *xc = xs + (q & 1) * B * LDX, *xn = xs + ((q + 1) & 1) * B * LDX;
        const uint32_t *inx = sidx + ((q + 1) & 3) * B; /* step q + 1's indices */
        uint32_t *inn = sidx + ((q + 2) & 3) * B;       /* step q + 2's, stored during this step */
        /* started now, used later: step q + 2's indices, step q + 1's labels of own rows */
        const uint32_t idx2 = t < bnn ? a.idx[off + 2 * B + t] : 0u;
        const int32_t labn = t < R && r * R + t < bn ? a.lab[inx[r * R + t]] : 0;
        /* 2. partial h over the slice: warp = (unit group ug, k part kp), lane = rows lane, lane + 32 */
        if (warp < 8) {
            constexpr int RPL = (B + 31) / 32;
            const int ug = warp % NUG, kp = warp / NUG;
            const int ka = kp * kn / KSP, kb = (kp + 1) * kn / KSP;
            float acc[RPL][8];
#pragma unroll
            for (int i = 0; i < RPL; ++i)
#pragma unroll
                for (int u = 0; u < 8; ++u) acc[i][u] = 0.0f;
#pragma unroll 4
            for (int k = ka; k < kb; ++k) {
                const float4 wa = *(const float4 *)(w1s + k * U + ug * 8), wb = *(const float4 *)(w1s + k * U + ug * 8 + 4);
#pragma unroll
                for (int i = 0; i < RPL; ++i) {
                    const float xv = xc[(lane + 32 * i) * LDX + k];
                    acc[i][0] = fmaf(xv, wa.x, acc[i][0]);
                    acc[i][1] = fmaf(xv, wa.y, acc[i][1]);
                    acc[i][2] = fmaf(xv, wa.z, acc[i][2]);
                    acc[i][3] = fmaf(xv, wa.w, acc[i][3]);
                    acc[i][4] = fmaf(xv, wb.x, acc[i][4]);
                    acc[i][5] = fmaf(xv, wb.y, acc[i][5]);
                    acc[i][6] = fmaf(xv, wb.z, acc[i][6]);
                    acc[i][7] = fmaf(xv, wb.w, acc[i][7]);
                }
            }
            float *dst = KSP == 1 ? phs : ph + kp * B * U;
#pragma unroll
            for (int i = 0; i < RPL; ++i) {
                const int row = lane + 32 * i;
                if (row < B) {
                    *(float4 *)(dst + row * U + ug * 8) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
                    *(float4 *)(dst + row * U + ug * 8 + 4) = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
                }
            }
        }
        if (KSP > 1) {
            __syncthreads();
            for (e = t; e < B * U; e += T) {
                float s = ph[e];
#pragma unroll
                for (int p = 1; p < KSP; ++p) s += ph[p * B * U + e];
                phs[e] = s;
            }
        }
        PH(0);
        cl.sync(); /* (a) every block's partial h is in its shared memory */
        PH(1);
        /* 3. own rows: h from the cluster's partials, then the cluster's partial logits over its units */
        for (e = t; e < R * U; e += T) {
            const int i = e / U, u = e - i * U, row = r * R + i;
            float p[S], s;
            if (row >= B) { /* the last block's rows past the batch */
                hrow[e] = 0.0f;
                continue;
            }
#pragma unroll
            for (int q2 = 0; q2 < S; ++q2) p[q2] = cl.map_shared_rank(phs, q2)[row * U + u];
            s = b1s[u];
#pragma unroll
            for (int q2 = 0; q2 < S; ++q2) s += p[q2];
            hrow[e] = s > 0.0f ? s : 0.0f;
        }
        __syncthreads();
        {
#ifdef LL
            unsigned long long *dst = a.pz + ((size_t)((gstep & 1u) * S + r) * G + g) * (R * C);
#else
            float *dst = a.pz + ((size_t)((gstep & 1u) * S + r) * G + g) * (R * C);
#endif
            for (e = t; e < R * C; e += T) {
                const int i = e / C, c = e - i * C;
                float s = 0.0f;
#pragma unroll 8
                for (int u = 0; u < U; ++u) s = fmaf(hrow[i * U + u], w2s[c * U + u], s);
#ifdef LL
                st_word(dst + e, s, gstep);
#else
                __stcg(dst + e, s);
#endif
            }
        }
#ifndef LL
        __syncthreads();
        if (t == 0) st_release(a.flags + g * S + r, gstep); /* release: the block's stores before it */
#endif
        PH(2);
        /* 3b. while the other clusters catch up: the next batch's bytes into xn, the batch after's loads */
        if (t < bnn) inn[t] = idx2;
        mnistcu__mc_floats<NW, LDX>(pre, pm, bn, xn, a.scale, a.shift);
        __syncthreads();
        mnistcu__mc_load<NW>(pre, pm, bnn, a.x, inn, D, k0);
        PH(3);
#ifndef LL
        /* 4. wait for rank r of every cluster */
        if (t < G)
            while ((int)(ld_acquire(a.flags + t * S + r) - gstep) < 0) {
            }
        __syncthreads();
#endif
        PH(4);
        {   /* the logits of own rows, a half warp a row (lane c: class c), their loss, dz, then dh */
            const int i = warp * 2 + (lane >> 4), c = lane & 15, row = r * R + i;
            const bool live = i < R && row < b, lc = live && c < C;
            float z = -INFINITY, m, sum, ex, zy;
            int am = c, y = 0;
#ifndef LL
            if (lc) {
                const float *src = a.pz + (size_t)((gstep & 1u) * S + r) * G * (R * C) + i * C + c;
                float v[GM], s2 = 0.0f;
#pragma unroll
                for (int gg = 0; gg < GM; ++gg) v[gg] = gg < G ? __ldcg(src + gg * (R * C)) : 0.0f;
#pragma unroll
                for (int gg = 0; gg < GM; ++gg) s2 += v[gg];
                z = s2 + b2s[c];
            }
#else
            if (lc) { /* 4. rank r of every cluster: poll until every word carries this step */
                const unsigned long long *src = a.pz + (size_t)((gstep & 1u) * S + r) * G * (R * C) + i * C + c;
                const unsigned long long done = (unsigned long long)gstep << 32;
                unsigned long long w[GM];
                float s2 = 0.0f;
                bool all;
#pragma unroll
                for (int gg = 0; gg < GM; ++gg) w[gg] = gg < G ? ld_word(src + gg * (R * C)) : done;
                do {
                    all = true;
#pragma unroll
                    for (int gg = 0; gg < GM; ++gg)
                        if ((w[gg] >> 32) != gstep) {
                            w[gg] = ld_word(src + gg * (R * C));
                            all = false;
                        }
                } while (!all);
#pragma unroll
                for (int gg = 0; gg < GM; ++gg) s2 += __uint_as_float((unsigned)w[gg]);
                z = s2 + b2s[c];
            }
#endif
            m = z;
#pragma unroll
            for (int o = 8; o; o >>= 1) { /* the first maximum */
                const float m2 = __shfl_xor_sync(0xffffffffu, m, o, 16);
                const int a2 = __shfl_xor_sync(0xffffffffu, am, o, 16);
                if (m2 > m || (m2 == m && a2 < am)) {
                    m = m2;
                    am = a2;
                }
            }
            ex = lc ? expf(z - m) : 0.0f;
            sum = ex;
#pragma unroll
            for (int o = 8; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o, 16);
            PH(8);
            if (live) y = labs[(q & 1) * R + i];
            zy = __shfl_sync(0xffffffffu, z, y, 16);
            if (i < R) dzrow[i * CM + c] = lc ? (ex / sum - (c == y ? 1.0f : 0.0f)) * inv_b : 0.0f;
            if (live && c == 0 && g == 0) {
                a.loss[(size_t)q * B + row] = logf(sum) - (zy - m);
                a.ok[(size_t)q * B + row] = am == y;
            }
            __syncwarp();
            if (i < R)
                for (int u = c; u < U; u += 16) {
                    float s2 = 0.0f;
                    for (int cc = 0; cc < C; ++cc) s2 = fmaf(dzrow[i * CM + cc], w2s[cc * U + u], s2);
                    dhrow[i * U + u] = live && hrow[i * U + u] > 0.0f ? s2 : 0.0f;
                }
        }
        PH(5);
        cl.sync(); /* (b) every block's rows of h, dz, dh are in its shared memory */
        PH(6);
        {   /* 5. gather the batch's h, dh, dz from the cluster: every load first */
            constexpr int NG = (B * U / 4 + T - 1) / T, NZ = (B * CM / 4 + T - 1) / T;
            float4 hv[NG], dv[NG], zv[NZ];
#pragma unroll
            for (int i = 0; i < NG; ++i) {
                const int f = t + i * T, row = f / (U / 4), rk = row / R, ri = row - rk * R, u4 = f - row * (U / 4);
                if (f < B * U / 4) {
                    hv[i] = ((const float4 *)cl.map_shared_rank(hrow, rk))[ri * (U / 4) + u4];
                    dv[i] = ((const float4 *)cl.map_shared_rank(dhrow, rk))[ri * (U / 4) + u4];
                }
            }
#pragma unroll
            for (int i = 0; i < NZ; ++i) {
                const int f = t + i * T, row = f / (CM / 4), rk = row / R, ri = row - rk * R, c4 = f - row * (CM / 4);
                if (f < B * CM / 4) zv[i] = ((const float4 *)cl.map_shared_rank(dzrow, rk))[ri * (CM / 4) + c4];
            }
#pragma unroll
            for (int i = 0; i < NG; ++i)
                if (t + i * T < B * U / 4) {
                    ((float4 *)hall)[t + i * T] = hv[i];
                    ((float4 *)dhall)[t + i * T] = dv[i];
                }
#pragma unroll
            for (int i = 0; i < NZ; ++i)
                if (t + i * T < B * CM / 4) ((float4 *)dzall)[t + i * T] = zv[i];
        }
        __syncthreads();
        PH(9);
        /* W2's columns, b1, b2: the same sums in every block */
        for (e = t; e < C * U + U + C; e += T) {
            float s2 = 0.0f;
            if (e < C * U) {
                const int c = e / U, u = e - c * U;
#pragma unroll 8
                for (int row = 0; row < b; ++row) s2 = fmaf(dzall[row * CM + c], hall[row * U + u], s2);
                w2s[e] -= lr * s2;
            } else if (e < C * U + U) {
                const int u = e - C * U;
#pragma unroll 8
                for (int row = 0; row < b; ++row) s2 += dhall[row * U + u];
                b1s[u] -= lr * s2;
            } else {
                const int c = e - C * U - U;
#pragma unroll 8
                for (int row = 0; row < b; ++row) s2 += dzall[row * CM + c];
                b2s[c] -= lr * s2;
            }
        }
        {   /* W1's slice: task = (k, unit group; unit groups fastest), each 8 units as two float4; where
               twice the tasks fit in the block, rows in two halves, the second half's sums through ph */
            const int nt = kn * NUG;
            if (2 * nt <= T - C * U - U - C) { /* beside the W2 tasks' threads */
                const int f = T - 1 - t, rs = f >= nt, tk = f - rs * nt, k = tk / NUG, ug = tk - k * NUG;
                const int ra = rs ? b / 2 : 0, rb = rs ? b : b / 2;
                float acc[8];
                if (f < 2 * nt) {
                    dw1_rows<U, LDX>(xc, dhall, k, ug, ra, rb, acc);
                    if (rs) {
                        *(float4 *)(ph + tk * 8) = make_float4(acc[0], acc[1], acc[2], acc[3]);
                        *(float4 *)(ph + tk * 8 + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
                    }
                }
                __syncthreads();
                if (f < nt) {
                    const float4 pa = *(const float4 *)(ph + tk * 8), pb = *(const float4 *)(ph + tk * 8 + 4);
                    acc[0] += pa.x, acc[1] += pa.y, acc[2] += pa.z, acc[3] += pa.w;
                    acc[4] += pb.x, acc[5] += pb.y, acc[6] += pb.z, acc[7] += pb.w;
                    w1_step(w1s + k * U + ug * 8, acc, lr);
                }
            } else { /* lanes: consecutive k of one unit group (x in one wavefront, dh broadcast); the sums
                        staged as [u][k] (stride LDX, odd), then each weight's step with lanes on u */
                for (e = t; e < nt; e += T) {
                    const int ug = e / kn, k = e - ug * kn;
                    float acc[8];
                    dw1_rows<U, LDX>(xc, dhall, k, ug, 0, b, acc);
#pragma unroll
                    for (int u = 0; u < 8; ++u) ph[(ug * 8 + u) * LDX + k] = acc[u];
                }
                __syncthreads();
                for (e = t; e < kn * U; e += T) {
                    const int k = e / U, u = e - k * U;
                    w1s[e] -= lr * ph[u * LDX + k];
                }
            }
        }
        if (t < R) labs[((q + 1) & 1) * R + t] = labn;
        __syncthreads();
        PH(7);
    }
#ifdef PHASES
    if (blockIdx.x == 0 && t == 0)
        for (e = 0; e < NPH; ++e) d_ph[e] += (unsigned long long)ph_acc[e];
#endif
    /* own parameters out: each block its W1 slice; block 0 of each cluster W2's columns and b1; block 0 b2 */
    for (e = t; e < kn * U; e += T) {
        int k = e / U, u = e - k * U;
        a.W1[(size_t)(u0 + u) * D + k0 + k] = w1s[e];
    }
    if (r == 0) {
        for (e = t; e < C * U; e += T) {
            int c = e / U, u = e - c * U;
            a.W2[(size_t)c * H + u0 + u] = w2s[e];
        }
        for (e = t; e < U; e += T) a.b1[u0 + e] = b1s[e];
        if (g == 0)
            for (e = t; e < C; e += T) a.b2[e] = b2s[e];
    }
    cl.sync(); /* no block leaves while another may read its shared memory */
}

/* ---------------------------------------------------------------- host */
struct Net {
    int D, H, C;
    std::vector<float> W1, b1, W2, b2;
};

static uint64_t rng_state;
static float urand(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) & 0xFFFFFF) / 16777216.0f;
}
static void init_net(Net *n, int D, int H, int C, uint64_t seed)
{
    float a1 = 1.0f / sqrtf((float)D), a2 = 1.0f / sqrtf((float)H);
    rng_state = seed;
    n->D = D, n->H = H, n->C = C;
    n->W1.resize((size_t)H * D), n->b1.resize(H), n->W2.resize((size_t)C * H), n->b2.resize(C);
    for (auto &v : n->W1) v = (2 * urand() - 1) * a1;
    for (auto &v : n->b1) v = (2 * urand() - 1) * a1;
    for (auto &v : n->W2) v = (2 * urand() - 1) * a2;
    for (auto &v : n->b2) v = (2 * urand() - 1) * a2;
}

/* the CPU reference: one SGD step, sequential sums */
static double cpu_step(Net *n, const uint8_t *x, const int32_t *lab, const uint32_t *rows, int b, float lr, int *correct)
{
    const int D = n->D, H = n->H, C = n->C;
    std::vector<float> xs((size_t)b * D), h((size_t)b * H), dz((size_t)b * C), dh((size_t)b * H);
    double loss = 0;
    for (int i = 0; i < b; ++i)
        for (int k = 0; k < D; ++k) xs[(size_t)i * D + k] = fmaf((float)x[(size_t)rows[i] * D + k], 1.0f / 255.0f, 0.0f);
    for (int i = 0; i < b; ++i)
        for (int u = 0; u < H; u += 8) { /* eight chains at once (H % 8 == 0), each in order */
            float s[8];
            for (int v = 0; v < 8; ++v) s[v] = n->b1[u + v];
            for (int k = 0; k < D; ++k)
                for (int v = 0; v < 8; ++v) s[v] = fmaf(xs[(size_t)i * D + k], n->W1[(size_t)(u + v) * D + k], s[v]);
            for (int v = 0; v < 8; ++v) h[(size_t)i * H + u + v] = s[v] > 0 ? s[v] : 0;
        }
    for (int i = 0; i < b; ++i) {
        float z[64], m, sum = 0;
        int arg = 0, y = lab[rows[i]];
        for (int c = 0; c < C; ++c) {
            float s = n->b2[c];
            for (int u = 0; u < H; ++u) s = fmaf(h[(size_t)i * H + u], n->W2[(size_t)c * H + u], s);
            z[c] = s;
        }
        m = z[0];
        for (int c = 1; c < C; ++c)
            if (z[c] > m) m = z[c], arg = c;
        for (int c = 0; c < C; ++c) sum += expf(z[c] - m);
        for (int c = 0; c < C; ++c) dz[(size_t)i * C + c] = (expf(z[c] - m) / sum - (c == y)) / (float)b;
        loss += logf(sum) - (z[y] - m);
        *correct += arg == y;
    }
    for (int i = 0; i < b; ++i)
        for (int u = 0; u < H; ++u) {
            float s = 0;
            for (int c = 0; c < C; ++c) s = fmaf(dz[(size_t)i * C + c], n->W2[(size_t)c * H + u], s);
            dh[(size_t)i * H + u] = h[(size_t)i * H + u] > 0 ? s : 0;
        }
    for (int c = 0; c < C; ++c) {
        float sb = 0;
        for (int u = 0; u < H; ++u) {
            float s = 0;
            for (int i = 0; i < b; ++i) s = fmaf(dz[(size_t)i * C + c], h[(size_t)i * H + u], s);
            n->W2[(size_t)c * H + u] -= lr * s;
        }
        for (int i = 0; i < b; ++i) sb += dz[(size_t)i * C + c];
        n->b2[c] -= lr * sb;
    }
    for (int u = 0; u < H; ++u) {
        float sb = 0;
        for (int i = 0; i < b; ++i) sb += dh[(size_t)i * H + u];
        n->b1[u] -= lr * sb;
        for (int k = 0; k < D; k += 8) { /* D % 8 == 0 */
            float s[8] = {0};
            for (int i = 0; i < b; ++i)
                for (int v = 0; v < 8; ++v) s[v] = fmaf(dh[(size_t)i * H + u], xs[(size_t)i * D + k + v], s[v]);
            for (int v = 0; v < 8; ++v) n->W1[(size_t)u * D + k + v] -= lr * s[v];
        }
    }
    return loss;
}

static double accuracy(const Net *n, const uint8_t *x, const int32_t *lab, int count)
{
    int ok = 0;
    std::vector<float> h(n->H);
    for (int i = 0; i < count; ++i) {
        const uint8_t *xi = x + (size_t)i * n->D;
        float xf[1024];
        for (int k = 0; k < n->D; ++k) xf[k] = fmaf((float)xi[k], 1.0f / 255.0f, 0.0f);
        for (int u = 0; u < n->H; u += 8) {
            float s[8];
            for (int v = 0; v < 8; ++v) s[v] = n->b1[u + v];
            for (int k = 0; k < n->D; ++k)
                for (int v = 0; v < 8; ++v) s[v] = fmaf(xf[k], n->W1[(size_t)(u + v) * n->D + k], s[v]);
            for (int v = 0; v < 8; ++v) h[u + v] = s[v] > 0 ? s[v] : 0;
        }
        int arg = 0;
        float m = -1e30f;
        for (int c = 0; c < n->C; ++c) {
            float s = n->b2[c];
            for (int u = 0; u < n->H; ++u) s = fmaf(h[u], n->W2[(size_t)c * n->H + u], s);
            if (s > m) m = s, arg = c;
        }
        ok += arg == lab[i];
    }
    return 100.0 * ok / count;
}

static double maxrel(const std::vector<float> &a, const std::vector<float> &b)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d = std::max(d, (double)fabsf(a[i] - b[i]));
        m = std::max(m, (double)fabsf(b[i]));
    }
    return d / (m > 0 ? m : 1);
}

struct Gpu {
    int B, U, G, S, D, H, C;
    float *W1, *b1, *W2, *b2, *loss;
#ifdef LL
    unsigned long long *pz;
#else
    float *pz;
    unsigned *flags;
#endif
    int *ok;
    unsigned step;
    uint32_t *idx;
    size_t smem;
    void (*kern)(Args);
};

template <int B, int U, int S> static void gpu_setup(Gpu *g)
{
    g->smem = sizeof(float) * (size_t)Lay<B, U, S>::total;
    g->kern = k_mlp<B, U, S>;
    g->S = S;
    CK(cudaFuncSetAttribute(k_mlp<B, U, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g->smem));
}
/* the most clusters of g->S blocks resident at once */
static int max_clusters(const Gpu *g)
{
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[1];
    int maxc = 0;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3(g->G * g->S);
    cfg.blockDim = dim3(T);
    cfg.dynamicSmemBytes = g->smem;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = g->S, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaOccupancyMaxActiveClusters(&maxc, (void *)g->kern, &cfg));
    return maxc;
}

static void gpu_put(Gpu *g, const Net *n)
{
    CK(cudaMemcpy(g->W1, n->W1.data(), n->W1.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->b1, n->b1.data(), n->b1.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->W2, n->W2.data(), n->W2.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->b2, n->b2.data(), n->b2.size() * 4, cudaMemcpyHostToDevice));
}
static void gpu_get(Gpu *g, Net *n)
{
    CK(cudaMemcpy(n->W1.data(), g->W1, n->W1.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(n->b1.data(), g->b1, n->b1.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(n->W2.data(), g->W2, n->W2.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(n->b2.data(), g->b2, n->b2.size() * 4, cudaMemcpyDeviceToHost));
}

/* steps [0, nsteps) of an epoch over order idx (n samples) in one launch */
static cudaError_t gpu_run(Gpu *g, const uint8_t *dx, const int32_t *dl, int n, int nsteps, float lr)
{
    Args a;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[1];
    memset(&a, 0, sizeof a);
    a.x = dx, a.lab = dl, a.idx = g->idx, a.n = n, a.D = g->D, a.H = g->H, a.C = g->C, a.nsteps = nsteps;
#ifndef LL
    a.flags = g->flags;
#endif
    a.step0 = g->step, a.scale = 1.0f / 255.0f, a.shift = 0.0f, a.lr = lr;
    a.W1 = g->W1, a.b1 = g->b1, a.W2 = g->W2, a.b2 = g->b2, a.pz = g->pz, a.loss = g->loss, a.ok = g->ok;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3(g->G * g->S);
    cfg.blockDim = dim3(T);
    cfg.dynamicSmemBytes = g->smem;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = g->S, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    g->step += (unsigned)nsteps;
    return cudaLaunchKernelEx(&cfg, g->kern, a);
}

static int quick; /* argv[3] "quick": the parity checks only (for compute-sanitizer) */

static int run_config(const char *name, const mnistcu_idx *xi, const mnistcu_idx *li, const mnistcu_idx *txi,
                      const mnistcu_idx *tli, int n, int B, int H, float lr, int epochs, int shuffle)
{
    const int D = 784, C = 10, U = H / 16, G = 16;
    const int nsteps = (n + B - 1) / B;
    const uint8_t *x = (const uint8_t *)xi->data;
    std::vector<int32_t> lab(li->count), tlab(tli->count);
    Gpu g;
    uint8_t *dx;
    int32_t *dl;
    Net ref, net;
    std::vector<uint32_t> order(n);
    std::vector<float> times;
    int maxc = 0;
    for (size_t i = 0; i < li->count; ++i) lab[i] = ((const uint8_t *)li->data)[i];
    for (size_t i = 0; i < tli->count; ++i) tlab[i] = ((const uint8_t *)tli->data)[i];
    memset(&g, 0, sizeof g);
    g.B = B, g.U = U, g.G = G, g.D = D, g.H = H, g.C = C;
    /* the largest cluster (8, 6 or 4 blocks) of which G fit at once */
    if (B == 64 && U == 8) gpu_setup<64, 8, 8>(&g);
    else if (B == 32 && U == 64) gpu_setup<32, 64, 8>(&g);
    else return fprintf(stderr, "%s: no instance for B %d U %d\n", name, B, U), 1;
    maxc = max_clusters(&g);
    printf("%s: clusters of 8: at most %d resident\n", name, maxc);
    if (maxc < G) {
        if (B == 64) gpu_setup<64, 8, 6>(&g);
        else gpu_setup<32, 64, 6>(&g);
        maxc = max_clusters(&g);
        printf("%s: clusters of 6: at most %d resident\n", name, maxc);
    }
    if (maxc < G) {
        if (B == 64) gpu_setup<64, 8, 4>(&g);
        else gpu_setup<32, 64, 4>(&g);
        maxc = max_clusters(&g);
    }
    const int S = g.S;
    printf("%s: 784-%d-10, batch %d, %d steps an epoch; %d clusters of %d blocks (%d units each), %zu bytes of shared memory a block; at most %d clusters resident\n",
           name, H, B, nsteps, G, S, U, g.smem, maxc);
    if (maxc < G) return printf("%s: not all clusters fit at once; skipped\n", name), 0;
    CK(cudaMalloc(&dx, (size_t)n * D));
    CK(cudaMalloc(&dl, (size_t)n * 4));
    CK(cudaMemcpy(dx, x, (size_t)n * D, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dl, lab.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&g.W1, (size_t)H * D * 4));
    CK(cudaMalloc(&g.b1, (size_t)H * 4));
    CK(cudaMalloc(&g.W2, (size_t)C * H * 4));
    CK(cudaMalloc(&g.b2, (size_t)C * 4));
    CK(cudaMalloc(&g.pz, (size_t)2 * S * G * ((B + S - 1) / S) * C * sizeof *g.pz));
    CK(cudaMemset(g.pz, 0, (size_t)2 * S * G * ((B + S - 1) / S) * C * sizeof *g.pz)); /* step 0: no step's */
#ifndef LL
    CK(cudaMalloc(&g.flags, (size_t)G * S * 4));
    CK(cudaMemset(g.flags, 0, (size_t)G * S * 4));
#endif
    CK(cudaMalloc(&g.loss, (size_t)nsteps * B * 4));
    CK(cudaMalloc(&g.ok, (size_t)nsteps * B * 4));
    CK(cudaMalloc(&g.idx, (size_t)n * 4));
    for (int i = 0; i < n; ++i) order[i] = (uint32_t)i;
    init_net(&ref, D, H, C, 1);
    /* parity: 1 and 20 steps against the CPU; two runs of 20 steps bit for bit */
    {
        const int checks[2] = {1, 20};
        CK(cudaMemcpy(g.idx, order.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
        for (int ci = 0; ci < 2; ++ci) {
            Net cpu = ref, gpu = ref, gpu2 = ref;
            int cor = 0;
            for (int s = 0; s < checks[ci]; ++s) cpu_step(&cpu, x, lab.data(), order.data() + (size_t)s * B, B, lr, &cor);
            gpu_put(&g, &ref);
            CK(gpu_run(&g, dx, dl, checks[ci] * B, checks[ci], lr));
            CK(cudaDeviceSynchronize());
            gpu_get(&g, &gpu);
            gpu_put(&g, &ref);
            CK(gpu_run(&g, dx, dl, checks[ci] * B, checks[ci], lr));
            CK(cudaDeviceSynchronize());
            gpu_get(&g, &gpu2);
            printf("  after %2d steps: max |gpu - cpu| / max |cpu|: W1 %.2e b1 %.2e W2 %.2e b2 %.2e; two runs %s\n", checks[ci],
                   maxrel(gpu.W1, cpu.W1), maxrel(gpu.b1, cpu.b1), maxrel(gpu.W2, cpu.W2), maxrel(gpu.b2, cpu.b2),
                   gpu.W1 == gpu2.W1 && gpu.W2 == gpu2.W2 && gpu.b1 == gpu2.b1 && gpu.b2 == gpu2.b2 ? "bit for bit" : "DIFFER");
        }
    }
    if (quick) epochs = -1;
    /* epochs: one warm-up, then timed; the CPU reference alongside for the first epochs */
    net = ref;
    gpu_put(&g, &net);
    {
        cudaEvent_t e0, e1;
        uint64_t oseed = 7;
        Net cpu = ref;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int ep = 0; ep <= epochs; ++ep) {
            std::vector<float> ls((size_t)nsteps * B);
            std::vector<int> ok((size_t)nsteps * B);
            double lsum = 0, cl = 0;
            int okn = 0, cok = 0;
            float ms;
            if (shuffle)
                for (int i = n - 1; i > 0; --i) {
                    oseed = oseed * 6364136223846793005ULL + 1442695040888963407ULL;
                    std::swap(order[i], order[(oseed >> 33) % (uint64_t)(i + 1)]);
                }
            CK(cudaMemcpy(g.idx, order.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
            CK(cudaMemset(g.loss, 0, (size_t)nsteps * B * 4));
            CK(cudaMemset(g.ok, 0, (size_t)nsteps * B * 4));
            CK(cudaEventRecord(e0));
            CK(gpu_run(&g, dx, dl, n, nsteps, lr));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            CK(cudaMemcpy(ls.data(), g.loss, ls.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(ok.data(), g.ok, ok.size() * 4, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < ls.size(); ++i) lsum += ls[i], okn += ok[i];
            if (ep > 0) times.push_back(ms);
            if (ep < REF_EPOCHS) /* the CPU alongside for the first epochs */
                for (int s = 0; s < nsteps; ++s) {
                    const int b = std::min(B, n - s * B);
                    cl += cpu_step(&cpu, x, lab.data(), order.data() + (size_t)s * B, b, lr, &cok);
                }
            gpu_get(&g, &net);
            printf("  epoch %d: %.3f ms (%.2f us a step), loss %.4f, train accuracy %.2f%%", ep, ms, 1000.0 * ms / nsteps,
                   lsum / n, 100.0 * okn / n);
            if (ep < REF_EPOCHS || ep == epochs)
                printf(", test %.2f%%", accuracy(&net, (const uint8_t *)txi->data, tlab.data(), (int)tlab.size()));
            if (ep < REF_EPOCHS)
                printf("; CPU reference: loss %.4f, train %.2f%%, test %.2f%%, weights apart %.2e", cl / n, 100.0 * cok / n,
                       accuracy(&cpu, (const uint8_t *)txi->data, tlab.data(), (int)tlab.size()), maxrel(net.W1, cpu.W1));
            printf("\n");
        }
    }
#ifdef PHASES
    {
        static const char *const pn[NPH] = {"partial h", "cluster barrier a", "h of own rows, partial logits, flag",
                                            "next batch to floats, the one after's loads", "wait for the other clusters",
                                            "loss, dz, dh of own rows", "cluster barrier b",
                                            "W2/b updates, dW1 and W1 update", "logits of own rows: loads, max, sum",
                                            "gather h, dh, dz from the cluster"};
        unsigned long long h[NPH];
        int clk = 0;
        CK(cudaMemcpyFromSymbol(h, d_ph, sizeof h));
        CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
        const double steps = (double)g.step; /* every step run so far, block 0's clock */
        for (int i = 0; i < NPH; ++i) printf("  %-45s %7.3f us a step\n", pn[i], h[i] / (clk * 1e-3) / steps);
        unsigned long long z[NPH] = {0};
        CK(cudaMemcpyToSymbol(d_ph, z, sizeof z));
    }
#endif
    std::sort(times.begin(), times.end());
    if (!times.empty()) {
        float tot = 0;
        for (float v : times) tot += v;
        printf("%s: median epoch %.3f ms over %zu epochs (min %.3f, max %.3f), total %.3f ms\n", name, times[times.size() / 2],
               times.size(), times.front(), times.back(), tot);
    }
    cudaFree(dx), cudaFree(dl), cudaFree(g.W1), cudaFree(g.b1), cudaFree(g.W2), cudaFree(g.b2), cudaFree(g.pz);
#ifndef LL
    cudaFree(g.flags);
#endif
    cudaFree(g.loss), cudaFree(g.ok), cudaFree(g.idx);
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "data/mnist";
    const char *which = argc > 2 ? argv[2] : "P2 P1";
    quick = argc > 3 && !strcmp(argv[3], "quick");
    char p[4][512];
    const char *names[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                            "t10k-labels-idx1-ubyte.gz"};
    mnistcu_idx f[4];
    mnistcu_ctx *ctx = NULL;
    mnistcu_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = MNISTCU_DEVICE_CPU;
    cd.log_level = MNISTCU_LOG_SILENT;
    if (mnistcu_ctx_create(&ctx, &cd)) return 1;
    for (int i = 0; i < 4; ++i) {
        snprintf(p[i], sizeof p[i], "%s/%s", dir, names[i]);
        if (mnistcu_idx_load_file(ctx, p[i], &f[i])) return fprintf(stderr, "%s\n", mnistcu_ctx_error(ctx)), 1;
    }
    {
        cudaDeviceProp pr;
        CK(cudaGetDeviceProperties(&pr, 0));
        printf("%s, %d multiprocessors\n", pr.name, pr.multiProcessorCount);
    }
    if (strstr(which, "P2") && run_config("P2", &f[0], &f[1], &f[2], &f[3], 60000, 64, 128, 0.1f, 7, 1)) return 1;
    if (strstr(which, "P1") && run_config("P1", &f[0], &f[1], &f[2], &f[3], 10000, 32, 1024, 0.01f, 10, 0)) return 1;
    for (int i = 0; i < 4; ++i) mnistcu_idx_free(ctx, &f[i]);
    mnistcu_ctx_destroy(ctx);
    return 0;
}
