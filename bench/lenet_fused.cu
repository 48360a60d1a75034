/* LeNet-5's training steps in one persistent kernel, measured against the
   step-by-step path (P4: MNIST 60k, batch 64, SGD momentum 0.9, lr 0.02).

   nvcc -O3 -arch=sm_90 -o build/lenet_fused bench/lenet_fused.cu && build/lenet_fused data/mnist [blocks] [epochs]
   (-DPHASES: block 0's clock a phase)

   A prototype: the model is fixed (1x28x28 conv5x5x6 relu maxpool2 conv5x5x16
   relu maxpool2 flatten dense120 relu dense84 relu dense10, cross entropy,
   the mean over the batch); the library makes the initial weights, the
   reference steps and the test accuracy. One cooperative kernel of one block
   of 1024 threads a multiprocessor runs the epoch's steps, each in two phases
   with a grid-wide barrier after each. Everything of one sample, forward and
   backward, depends on that sample alone, except the weight gradients, which
   sum over the batch: so
     A  a block a sample: its forward pass and its backward pass through every
        layer in shared memory, block barriers between the layers; it leaves
        what the weight gradients need (the dense layers' inputs and output
        gradients) and its own share of the convolutions' weight gradients
        (a partial sum a sample) in global memory;
     B  a thread a parameter: its gradient, the sum over the batch in sample
        order, and its optimizer step.
   (A first design, ten phases a step with each layer shared out over the
   whole grid, took 77 us a step: the barriers and the thin phases between
   them were the time.) Every sum is in a fixed order and nothing uses
   atomics: the same bits on every run. The orders are not the step-by-step
   path's, so the weights agree with it to rounding, not bit for bit (printed:
   the largest difference against the largest change, per tensor). */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#include <cooperative_groups.h>
#include <algorithm>
#include <vector>

namespace cg = cooperative_groups;

#define NT 1024
enum { IH = 28, KS = 5, C1 = 6, Q1 = 12, C2 = 16, O2 = 8, Q2 = 4, D0 = 256, D1 = 120, D2 = 84, D3 = 10, BMAX = 64 };
enum { oW1 = 0, oB1 = 150, oW2 = 156, oB2 = 2556, oF1 = 2572, oG1 = 33292, oF2 = 33412, oG2 = 43492, oF3 = 43576,
       oG3 = 44416, NP = 44426 };
#define NPART1 156  /* conv1's parameters: a partial sum of each a sample */
#define NPART2 2416 /* conv2's */

/* shared memory, in floats (each part 16-byte aligned): the dense layers' weights F1, F2 (copied in
   with cp.async while the convolutions run), conv weights, then the sample's maps */
enum { sF1 = 0, sF2 = 30720, sW2 = 40800, sW3 = 43216, sW1 = 44068, sX = 44224, sP1 = 45008, sOF1 = 45872,
       sP2 = 46736, sOF2 = 46992, sAM2 = 47248, sH1 = 47312, sH2 = 47432, sZ = 47516, sDZ = 47532, sDH2 = 47548,
       sDH1 = 47632, sG2 = 47752, sSPARE = 48008, sG1 = 52104, sPART = 52968, sMB = 53992, sEND = 53994 };
/* after the gradient of conv2's pooled output, F1's copy is free for the step: */
enum { sDA = sF1, DA_OC = 704, DA_ROW = 44, sPT = sF1 + 16 * DA_OC };

struct LA {
    const uint8_t *u8;
    const int32_t *lab;
    const uint32_t *idx;
    size_t n;          /* samples in the epoch */
    int step0, nsteps; /* the chunk */
    float *w, *g, *mom;
    mnistcu__opt o_first, o_next;
    int first_step;    /* 1: the chunk's first step is the optimizer's first */
    /* a row a sample: */
    float *p2, *h1, *h2, *dz, *dh2, *dh1, *part2, *part1, *lrow;
    int *crow;
    double *loss;
    int *correct;
    long long *ph;     /* with PHASES: block 0's clock a phase, summed */
};

__device__ __forceinline__ void cp16(float *s, const float *g)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g));
}
__device__ __forceinline__ void cp4(float *s, const float *g)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(g));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
/* one bulk copy (the tensor memory accelerator) global -> shared, completing on an mbarrier */
__device__ __forceinline__ void bulk_copy(float *s, const float *g, unsigned bytes, unsigned mbar)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(sa),
                 "l"(g), "r"(bytes), "r"(mbar)
                 : "memory");
}
__device__ __forceinline__ void mbar_expect(unsigned mbar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned mbar, unsigned parity)
{
    unsigned ok = 0;
    while (!ok)
        asm volatile("{\n .reg .pred P;\n mbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\n selp.b32 %0, 1, 0, P;\n}\n"
                     : "=r"(ok)
                     : "r"(mbar), "r"(parity)
                     : "memory");
}

__device__ __forceinline__ float relu(float v) { return v > 0.0f ? v : 0.0f; }

/* the max of 4 lanes' values and the lowest lane holding it */
__device__ __forceinline__ void max4(float &m, int &am)
{
    for (int off = 1; off < 4; off <<= 1) {
        float om = __shfl_xor_sync(0xffffffffu, m, off);
        int oa = __shfl_xor_sync(0xffffffffu, am, off);
        if (om > m || (om == m && oa < am)) { m = om; am = oa; }
    }
}
/* sums over groups of 2^k lanes, the same bits in each lane of a group */
__device__ __forceinline__ float sumx(float v, int lanes)
{
    for (int off = 1; off < lanes; off <<= 1) v = v + __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__global__ void __launch_bounds__(NT, 1) k_lenet(LA a)
{
    extern __shared__ float sm[];
    cg::grid_group grid = cg::this_grid();
    const int tid = threadIdx.x, lane = tid & 31, gt = blockIdx.x * NT + tid, GT = gridDim.x * NT;
    float *F1s = sm + sF1, *F2s = sm + sF2, *W2s = sm + sW2, *W3s = sm + sW3, *W1s = sm + sW1, *X = sm + sX;
    float *P1 = sm + sP1, *P2 = sm + sP2, *H1 = sm + sH1, *H2 = sm + sH2, *Z = sm + sZ, *DZ = sm + sDZ;
    float *DH2 = sm + sDH2, *DH1 = sm + sDH1, *G2 = sm + sG2, *G1 = sm + sG1, *PART = sm + sPART;
    int *OF1 = (int *)(sm + sOF1), *OF2 = (int *)(sm + sOF2);
    uint8_t *AM2 = (uint8_t *)(sm + sAM2);
    float *DA = sm + sDA, *PT = sm + sPT;
    const unsigned mbar = (unsigned)__cvta_generic_to_shared(sm + sMB);
    unsigned mph = 0;
    if (tid == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(mbar) : "memory");
    __syncthreads();
    const float *w = a.w;
#ifdef PHASES
    long long t0 = clock64();
#define MARK(k) do { if (gt == 0) { long long t1 = clock64(); a.ph[k] += t1 - t0; t0 = t1; } } while (0)
#else
#define MARK(k) do { } while (0)
#endif
    for (int st = 0; st < a.nsteps; ++st) {
        const size_t s0 = (size_t)(a.step0 + st) * BMAX;
        const int Bs = (int)(a.n - s0 < BMAX ? a.n - s0 : BMAX);
        const uint32_t *bidx = a.idx + s0;
        const mnistcu__opt *o = (a.first_step && st == 0) ? &a.o_first : &a.o_next;
        const float rB = 1.0f / (float)Bs;

        /* ---- A: a block a sample ---- */
        for (int b = blockIdx.x; b < Bs; b += gridDim.x) {
            __syncthreads();
            /* the weights into shared memory: the convolutions' and dense10's first, then the large two */
            for (int j = tid; j < NPART1 / 4; j += NT) cp16(W1s + 4 * j, w + oW1 + 4 * j);
            for (int j = tid; j < NPART2 / 4; j += NT) cp16(W2s + 4 * j, w + oW2 + 4 * j);
            for (int j = tid; j < (D3 * D2 + D3) / 4; j += NT) cp16(W3s + 4 * j, w + oF3 + 4 * j);
            if (tid < 2) cp4(W3s + D3 * D2 + 8 + tid, w + oF3 + D3 * D2 + 8 + tid);
            cp_commit();
            if (tid == 0) { /* the dense layers' 163 KB in bulk copies, in the background, each block
                              starting at another chunk */
                asm volatile("fence.proxy.async;\n" ::: "memory");
                mbar_expect(mbar, (D1 * D0 + D2 * D1) * 4);
                for (int c = 0; c < 8; ++c) {
                    int k = (c + b) & 7;
                    bulk_copy(F1s + k * (D1 * D0 / 8), w + oF1 + k * (D1 * D0 / 8), D1 * D0 / 8 * 4, mbar);
                }
                for (int c = 0; c < 4; ++c) {
                    int k = (c + b) & 3;
                    bulk_copy(F2s + k * (D2 * D1 / 4), w + oF2 + k * (D2 * D1 / 4), D2 * D1 / 4 * 4, mbar);
                }
            }
            {
                const uint8_t *xr = a.u8 + (size_t)bidx[b] * (IH * IH);
                for (int j = tid; j < IH * IH; j += NT) X[j] = fmaf((float)xr[j], 1.0f / 255.0f, 0.0f);
            }
            cp_wait<0>();
            __syncthreads();
            MARK(2);
            /* conv1 + relu + pool: a thread a window of 4 outputs */
            if (tid < C1 * Q1 * Q1) {
                int c = tid / (Q1 * Q1), pw = tid - c * (Q1 * Q1), py = pw / Q1, px = pw - py * Q1;
                const float *xp = X + 2 * py * IH + 2 * px, *wc = W1s + c * 25;
                float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma unroll
                for (int ky = 0; ky < KS; ++ky)
#pragma unroll
                    for (int kx = 0; kx < KS; ++kx) {
                        float wv = wc[ky * KS + kx];
                        const float *r = xp + ky * IH + kx;
                        a0 = fmaf(r[0], wv, a0);
                        a1 = fmaf(r[1], wv, a1);
                        a2 = fmaf(r[IH], wv, a2);
                        a3 = fmaf(r[IH + 1], wv, a3);
                    }
                float bb = W1s[150 + c], m = relu(a0 + bb), v;
                int am = 0;
                v = relu(a1 + bb); if (v > m) { m = v; am = 1; }
                v = relu(a2 + bb); if (v > m) { m = v; am = 2; }
                v = relu(a3 + bb); if (v > m) { m = v; am = 3; }
                P1[tid] = m;
                OF1[tid] = (2 * py + (am >> 1)) * IH + 2 * px + (am & 1);
            }
            __syncthreads();
            MARK(3);
            /* conv2 + relu + pool: 4 lanes a window (3 of them two input channels each), a thread the
               window's 4 outputs */
            {
                int win = tid >> 2, g = tid & 3, oc = win >> 4, pw = win & 15, py = pw >> 2, px = pw & 3;
                float c00 = 0.0f, c01 = 0.0f, c10 = 0.0f, c11 = 0.0f;
                if (g < 3) {
#pragma unroll
                    for (int ii = 0; ii < 2; ++ii) {
                        int ic = 2 * g + ii;
                        const float *pr = P1 + ic * (Q1 * Q1) + 2 * py * Q1 + 2 * px, *wc = W2s + oc * 150 + ic * 25;
                        float r0[6], r1[6];
#pragma unroll
                        for (int t = 0; t < 3; ++t) {
                            float2 v = *(const float2 *)(pr + 2 * t);
                            r1[2 * t] = v.x;
                            r1[2 * t + 1] = v.y;
                        }
#pragma unroll
                        for (int ky = 0; ky < KS; ++ky) {
#pragma unroll
                            for (int t = 0; t < 6; ++t) r0[t] = r1[t];
#pragma unroll
                            for (int t = 0; t < 3; ++t) {
                                float2 v = *(const float2 *)(pr + (ky + 1) * Q1 + 2 * t);
                                r1[2 * t] = v.x;
                                r1[2 * t + 1] = v.y;
                            }
#pragma unroll
                            for (int kx = 0; kx < KS; ++kx) {
                                float wv = wc[ky * KS + kx];
                                c00 = fmaf(r0[kx], wv, c00);
                                c01 = fmaf(r0[kx + 1], wv, c01);
                                c10 = fmaf(r1[kx], wv, c10);
                                c11 = fmaf(r1[kx + 1], wv, c11);
                            }
                        }
                    }
                }
                c00 = sumx(c00, 4);
                c01 = sumx(c01, 4);
                c10 = sumx(c10, 4);
                c11 = sumx(c11, 4);
                if (g == 0) {
                    float bb = W2s[2400 + oc], m = relu(c00 + bb), v;
                    int am = 0;
                    v = relu(c01 + bb); if (v > m) { m = v; am = 1; }
                    v = relu(c10 + bb); if (v > m) { m = v; am = 2; }
                    v = relu(c11 + bb); if (v > m) { m = v; am = 3; }
                    P2[win] = m;
                    AM2[win] = (uint8_t)am;
                    OF2[win] = (2 * py + (am >> 1)) * Q1 + 2 * px + (am & 1);
                    a.p2[(size_t)b * D0 + win] = m;
                }
            }
            mbar_wait(mbar, mph);
            mph ^= 1;
            __syncthreads();
            MARK(4);
            /* dense120 + relu: 8 lanes an output, lane r the float4s r, r+8, ... of k */
            if (tid < D1 * 8) {
                int j = tid >> 3, r = tid & 7;
                const float4 *wr = (const float4 *)(F1s + j * D0), *xv = (const float4 *)P2;
                float acc = 0.0f;
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    float4 wv = wr[r + 8 * t], x4 = xv[r + 8 * t];
                    acc = fmaf(x4.x, wv.x, acc);
                    acc = fmaf(x4.y, wv.y, acc);
                    acc = fmaf(x4.z, wv.z, acc);
                    acc = fmaf(x4.w, wv.w, acc);
                }
                acc = sumx(acc, 8);
                if (r == 0) {
                    float h = relu(acc + w[oG1 + j]);
                    H1[j] = h;
                    a.h1[(size_t)b * D1 + j] = h;
                }
            }
            __syncthreads();
            MARK(5);
            /* dense84 + relu: 8 lanes an output */
            if (tid < D2 * 8) {
                int j = tid >> 3, r = tid & 7;
                const float4 *wr = (const float4 *)(F2s + j * D1), *xv = (const float4 *)H1;
                float acc = 0.0f;
#pragma unroll
                for (int t = 0; t < 4; ++t)
                    if (r + 8 * t < D1 / 4) {
                        float4 wv = wr[r + 8 * t], x4 = xv[r + 8 * t];
                        acc = fmaf(x4.x, wv.x, acc);
                        acc = fmaf(x4.y, wv.y, acc);
                        acc = fmaf(x4.z, wv.z, acc);
                        acc = fmaf(x4.w, wv.w, acc);
                    }
                acc = sumx(acc, 8);
                if (r == 0) {
                    float h = relu(acc + w[oG2 + j]);
                    H2[j] = h;
                    a.h2[(size_t)b * D2 + j] = h;
                }
            }
            __syncthreads();
            MARK(6);
            /* dense10: a warp an output */
            if (tid < D3 * 32) {
                int c = tid >> 5;
                float acc = 0.0f;
                for (int k = lane; k < D2; k += 32) acc = fmaf(H2[k], W3s[c * D2 + k], acc);
                acc = sumx(acc, 32);
                if (lane == 0) Z[c] = acc + W3s[D3 * D2 + c];
            }
            __syncthreads();
            MARK(7);
            /* the loss and its gradient (the mean over the batch: 1/B a sample) */
            if (tid < 32) {
                int y = a.lab[bidx[b]];
                float z = lane < D3 ? Z[lane] : -INFINITY, mx = z, e, se;
                for (int off = 16; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                e = lane < D3 ? expf(z - mx) : 0.0f;
                se = sumx(e, 32);
                unsigned top = __ballot_sync(0xffffffffu, lane < D3 && z == mx);
                if (lane < D3) {
                    float d = (e / se - (lane == y ? 1.0f : 0.0f)) * rB;
                    DZ[lane] = d;
                    a.dz[(size_t)b * D3 + lane] = d;
                }
                if (lane == 0) {
                    a.lrow[b] = logf(se) + mx - Z[y];
                    a.crow[b] = (__ffs(top) - 1) == y;
                }
            }
            __syncthreads();
            MARK(8);
            /* dh2 */
            if (tid < D2) {
                float acc = 0.0f;
                for (int c = 0; c < D3; ++c) acc = fmaf(DZ[c], W3s[c * D2 + tid], acc);
                acc = H2[tid] > 0.0f ? acc : 0.0f;
                DH2[tid] = acc;
                a.dh2[(size_t)b * D2 + tid] = acc;
            }
            __syncthreads();
            MARK(9);
            /* dh1: 8 lanes an output */
            if (tid < D1 * 8) {
                int j = tid >> 3, r = tid & 7;
                float acc = 0.0f;
                for (int i = r; i < D2; i += 8) acc = fmaf(DH2[i], F2s[i * D1 + j], acc);
                acc = sumx(acc, 8);
                if (r == 0) {
                    acc = H1[j] > 0.0f ? acc : 0.0f;
                    DH1[j] = acc;
                    a.dh1[(size_t)b * D1 + j] = acc;
                }
            }
            __syncthreads();
            MARK(10);
            /* the gradient of conv2's pooled output: four quarters of the sum over dense120's outputs */
            {
                int r = tid >> 8, k = tid & 255;
                float acc = 0.0f;
#pragma unroll 6
                for (int t = 0; t < D1 / 4; ++t) acc = fmaf(DH1[r * 30 + t], F1s[(r * 30 + t) * D0 + k], acc);
                PART[r * D0 + k] = acc;
            }
            __syncthreads();
            MARK(11);
            if (tid < D0) {
                float s = (PART[tid] + PART[D0 + tid]) + (PART[2 * D0 + tid] + PART[3 * D0 + tid]);
                G2[tid] = P2[tid] > 0.0f ? s : 0.0f; /* the relu' */
            }
            __syncthreads();
            MARK(12);
            /* routed through the pool's argmax into conv2's output map, with a border of 4 zeros (rows of
               DA_ROW floats: the 8 lanes of a quarter warp below read 8 distinct bank groups) */
            for (int e = tid; e < C2 * 256; e += NT) {
                int oc = e >> 8, yy = (e >> 4) & 15, xx = e & 15, y = yy - 4, x = xx - 4;
                float v = 0.0f;
                if ((unsigned)y < O2 && (unsigned)x < O2) {
                    int k = oc * 16 + (y >> 1) * 4 + (x >> 1);
                    if (AM2[k] == ((y & 1) << 1 | (x & 1))) v = G2[k];
                }
                DA[oc * DA_OC + yy * DA_ROW + xx] = v;
            }
            __syncthreads();
            MARK(13);
            /* conv2's input gradient: a thread 4 outputs of a row for 4 of the 16 output channels (og), the
               partial sums PT[og], then their sum with conv1's relu' (G1) */
            if (tid < 4 * 216) {
                int og = tid / 216, tile = tid - og * 216, ic = tile / 36, rem = tile - ic * 36, y = rem / 3;
                int x0 = 4 * (rem - y * 3);
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (int oi = 0; oi < 4; ++oi) {
                    int oc = 4 * og + oi;
                    const float *wc = W2s + oc * 150 + ic * 25;
#pragma unroll
                    for (int ky = 0; ky < KS; ++ky) {
                        const float4 *row = (const float4 *)(DA + oc * DA_OC + (y + 4 - ky) * DA_ROW + x0);
                        float4 u0 = row[0], u1 = row[1];
                        float vals[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
                        for (int kx = 0; kx < KS; ++kx) {
                            float wv = wc[ky * KS + kx];
#pragma unroll
                            for (int i = 0; i < 4; ++i) acc[i] = fmaf(vals[i + 4 - kx], wv, acc[i]);
                        }
                    }
                }
                float *dst = PT + og * (C1 * Q1 * Q1) + ic * (Q1 * Q1) + y * Q1 + x0;
#pragma unroll
                for (int i = 0; i < 4; ++i) dst[i] = acc[i];
            }
            __syncthreads();
            if (tid < C1 * Q1 * Q1) {
                const int n1 = C1 * Q1 * Q1;
                float s = (PT[tid] + PT[n1 + tid]) + (PT[2 * n1 + tid] + PT[3 * n1 + tid]);
                G1[tid] = P1[tid] > 0.0f ? s : 0.0f;
            }
            /* this sample's share of conv2's weight gradient: a thread a weight, its 16 windows */
            for (int p = tid; p < NPART2; p += NT) {
                float acc = 0.0f;
                if (p < 2400) {
                    int oc = p / 150, rr = p - oc * 150, ic = rr / 25, kk = rr - ic * 25, ky = kk / KS;
                    const float *base = P1 + ic * (Q1 * Q1) + ky * Q1 + (kk - ky * KS);
#pragma unroll
                    for (int wi = 0; wi < 16; ++wi) acc = fmaf(G2[oc * 16 + wi], base[OF2[oc * 16 + wi]], acc);
                } else {
                    int oc = p - 2400;
                    for (int wi = 0; wi < 16; ++wi) acc += G2[oc * 16 + wi];
                }
                a.part2[(size_t)b * NPART2 + p] = acc;
            }
            __syncthreads();
            MARK(14);
            /* this sample's share of conv1's weight gradient: 8 lanes a kernel row, each 18 windows */
            if (tid < 36 * 8) {
                int p = tid >> 3, r = tid & 7;
                float acc[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                if (p < 30) {
                    int c = p / 5, ky = p - c * 5;
                    for (int t = 0; t < 18; ++t) {
                        int wi = c * 144 + r + 8 * t;
                        float gv = G1[wi];
                        const float *pp = X + OF1[wi] + ky * IH;
#pragma unroll
                        for (int kx = 0; kx < KS; ++kx) acc[kx] = fmaf(gv, pp[kx], acc[kx]);
                    }
                } else {
                    int c = p - 30;
                    for (int t = 0; t < 18; ++t) acc[0] += G1[c * 144 + r + 8 * t];
                }
#pragma unroll
                for (int kx = 0; kx < KS; ++kx) acc[kx] = sumx(acc[kx], 8);
                if (r == 0) {
                    float *dst = a.part1 + (size_t)b * NPART1;
                    if (p < 30) {
#pragma unroll
                        for (int kx = 0; kx < KS; ++kx) dst[p * KS + kx] = acc[kx];
                    } else {
                        dst[150 + p - 30] = acc[0];
                    }
                }
            }
        }
        grid.sync();
        MARK(0);

        /* ---- B: two lanes a parameter (the even and the odd samples), then its step ---- */
        for (int i = gt; i < (2 * NP + 31) / 32 * 32; i += GT) {
            int p = i >> 1, h = i & 1;
            float acc = 0.0f;
            if (p >= NP) {
            } else if (p < oW2) {
                for (int b = h; b < Bs; b += 2) acc += a.part1[(size_t)b * NPART1 + p];
            } else if (p < oF1) {
                for (int b = h; b < Bs; b += 2) acc += a.part2[(size_t)b * NPART2 + (p - oW2)];
            } else if (p < oG1) {
                int r = p - oF1, j = r >> 8, k = r & 255;
#pragma unroll 16
                for (int b = h; b < Bs; b += 2) acc = fmaf(a.dh1[(size_t)b * D1 + j], a.p2[(size_t)b * D0 + k], acc);
            } else if (p < oF2) {
                for (int b = h; b < Bs; b += 2) acc += a.dh1[(size_t)b * D1 + (p - oG1)];
            } else if (p < oG2) {
                int r = p - oF2, ii = r / D1, j = r - ii * D1;
#pragma unroll 16
                for (int b = h; b < Bs; b += 2) acc = fmaf(a.dh2[(size_t)b * D2 + ii], a.h1[(size_t)b * D1 + j], acc);
            } else if (p < oF3) {
                for (int b = h; b < Bs; b += 2) acc += a.dh2[(size_t)b * D2 + (p - oG2)];
            } else if (p < oG3) {
                int r = p - oF3, c = r / D2, ii = r - c * D2;
                for (int b = h; b < Bs; b += 2) acc = fmaf(a.dz[(size_t)b * D3 + c], a.h2[(size_t)b * D2 + ii], acc);
            } else {
                for (int b = h; b < Bs; b += 2) acc += a.dz[(size_t)b * D3 + (p - oG3)];
            }
            acc = acc + __shfl_xor_sync(0xffffffffu, acc, 1);
            if (h == 0 && p < NP) {
                a.g[p] = acc;
                mnistcu__opt_one(o, (size_t)p, a.w, acc, a.mom);
            }
        }
        if (gt == 0) {
            double l = 0.0;
            int k = 0;
            for (int b = 0; b < Bs; ++b) { l += a.lrow[b]; k += a.crow[b]; }
            a.loss[a.step0 + st] = l / Bs;
            a.correct[a.step0 + st] = k;
        }
        grid.sync();
        MARK(1);
    }
}

/* ---- host ---- */
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define MK(x) do { if ((x) != MNISTCU_OK) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, mnistcu_ctx_error(ctx)); exit(1); } } while (0)

static size_t smem_bytes(void) { return (size_t)sEND * 4; }
static_assert(sPT + 4 * 864 <= sF2, "DA and PT fit in F1's place");

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "data/mnist";
    int want_blocks = argc > 2 ? atoi(argv[2]) : 0, epochs = argc > 3 ? atoi(argv[3]) : 3;
    char path[512];
    mnistcu_ctx *ctx = NULL;
    mnistcu_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = MNISTCU_DEVICE_CUDA;
    cd.gemm = MNISTCU_GEMM_OWN;
    cd.log_level = MNISTCU_LOG_WARN;
    MK(mnistcu_ctx_create(&ctx, &cd));
    mnistcu_idx xi, yi;
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
    MK(mnistcu_idx_load_file(ctx, path, &xi));
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte.gz", dir);
    MK(mnistcu_idx_load_file(ctx, path, &yi));
    const size_t n = yi.count;
    std::vector<int32_t> labels(n);
    for (size_t i = 0; i < n; ++i) labels[i] = ((const uint8_t *)yi.data)[i];
    mnistcu_dataset_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.dir = dir;
    dd.split = MNISTCU_SPLIT_TEST;
    dd.norm = MNISTCU_NORM_UNIT;
    mnistcu_dataset *test = NULL;
    MK(mnistcu_dataset_load(ctx, &dd, &test));

    mnistcu_model *ref = NULL;
    MK(mnistcu_model_create_spec(ctx, "lenet5", &ref));
    if (mnistcu_model_num_params(ref) != NP) { fprintf(stderr, "unexpected parameter count\n"); return 1; }
    const int offs[] = {oW1, oB1, oW2, oB2, oF1, oG1, oF2, oG2, oF3, oG3, NP};
    for (int t = 0; t < 10; ++t) {
        mnistcu_tensor_info ti;
        MK(mnistcu_model_tensor_info(ref, t, &ti));
        if (ti.count != (size_t)(offs[t + 1] - offs[t])) { fprintf(stderr, "tensor %d: unexpected size\n", t); return 1; }
    }
    std::vector<float> w0(NP), wr(NP), wf(NP);
    MK(mnistcu_model_get_params(ref, w0.data(), NP));

    mnistcu_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = MNISTCU_OPTIM_SGD;
    od.learning_rate = 0.02f;
    od.momentum = 0.9f;

    /* device buffers */
    uint8_t *d_u8;
    int32_t *d_lab;
    uint32_t *d_idx;
    float *d_w, *d_g, *d_mom, *d_p2, *d_h1, *d_h2, *d_dz, *d_dh2, *d_dh1, *d_part2, *d_part1, *d_lrow;
    int *d_crow;
    double *d_loss;
    int *d_corr;
    long long *d_ph;
    const int maxsteps = (int)((n + BMAX - 1) / BMAX);
    CK(cudaMalloc(&d_u8, n * 784));
    CK(cudaMemcpy(d_u8, xi.data, n * 784, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_lab, n * 4));
    CK(cudaMemcpy(d_lab, labels.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_idx, n * 4));
    CK(cudaMalloc(&d_w, NP * 4));
    CK(cudaMalloc(&d_g, NP * 4));
    CK(cudaMalloc(&d_mom, NP * 4));
    CK(cudaMalloc(&d_p2, BMAX * D0 * 4));
    CK(cudaMalloc(&d_h1, BMAX * D1 * 4));
    CK(cudaMalloc(&d_h2, BMAX * D2 * 4));
    CK(cudaMalloc(&d_dz, BMAX * D3 * 4));
    CK(cudaMalloc(&d_dh2, BMAX * D2 * 4));
    CK(cudaMalloc(&d_dh1, BMAX * D1 * 4));
    CK(cudaMalloc(&d_part2, BMAX * NPART2 * 4));
    CK(cudaMalloc(&d_part1, BMAX * NPART1 * 4));
    CK(cudaMalloc(&d_lrow, BMAX * 4));
    CK(cudaMalloc(&d_crow, BMAX * 4));
    CK(cudaMalloc(&d_loss, maxsteps * 8));
    CK(cudaMalloc(&d_corr, maxsteps * 4));
    CK(cudaMalloc(&d_ph, 32 * 8));
    CK(cudaMemset(d_ph, 0, 32 * 8));

    size_t smem = smem_bytes();
    int dev = 0, sms = 0, per = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaFuncSetAttribute(k_lenet, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_lenet, NT, smem));
    int G = sms * std::min(per, 1);
    if (want_blocks > 0 && want_blocks <= sms * per) G = want_blocks;
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, k_lenet));
    printf("lenet_fused: %d multiprocessors, %d blocks a multiprocessor fit, grid %d x %d, %zu B shared, %d registers\n",
           sms, per, G, NT, smem, fa.numRegs);

    LA a;
    memset(&a, 0, sizeof a);
    a.u8 = d_u8; a.lab = d_lab; a.idx = d_idx; a.n = n;
    a.w = d_w; a.g = d_g; a.mom = d_mom;
    a.p2 = d_p2; a.h1 = d_h1; a.h2 = d_h2; a.dz = d_dz; a.dh2 = d_dh2; a.dh1 = d_dh1;
    a.part2 = d_part2; a.part1 = d_part1; a.lrow = d_lrow; a.crow = d_crow;
    a.loss = d_loss; a.correct = d_corr; a.ph = d_ph;
    mnistcu__opt_memo memo;
    memset(&memo, 0, sizeof memo);
    mnistcu__opt_make(&od, 1, NP, &a.o_first, &memo);
    mnistcu__opt_make(&od, 2, NP, &a.o_next, &memo);

    auto launch = [&](int step0, int nsteps, int first) {
        a.step0 = step0; a.nsteps = nsteps; a.first_step = first;
        void *args[] = {&a};
        CK(cudaLaunchCooperativeKernel((void *)k_lenet, G, NT, args, smem, 0));
    };
    auto reset = [&]() {
        CK(cudaMemcpy(d_w, w0.data(), NP * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(d_mom, 0, NP * 4));
    };

    /* the epoch's order: a fixed shuffle per epoch */
    std::vector<uint32_t> perm(n);
    uint64_t rng = 12345;
    auto shuffle = [&]() {
        for (size_t i = 0; i < n; ++i) perm[i] = (uint32_t)i;
        for (size_t i = n - 1; i > 0; --i) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t j = (size_t)((rng >> 33) % (i + 1));
            std::swap(perm[i], perm[j]);
        }
        CK(cudaMemcpy(d_idx, perm.data(), n * 4, cudaMemcpyHostToDevice));
    };
    shuffle();

    /* 1. against the step-by-step path: the same batches from the same weights */
    const int checks[] = {1, 20, 200};
    int done = 0;
    std::vector<float> xb(BMAX * 784);
    std::vector<int32_t> yb(BMAX);
    reset();
    for (int ci = 0; ci < 3; ++ci) {
        int upto = checks[ci];
        launch(done, upto - done, done == 0);
        CK(cudaDeviceSynchronize());
        for (int s = done; s < upto; ++s) {
            for (int b = 0; b < BMAX; ++b) {
                uint32_t k = perm[(size_t)s * BMAX + b];
                for (int j = 0; j < 784; ++j) xb[b * 784 + j] = fmaf((float)((const uint8_t *)xi.data)[(size_t)k * 784 + j], 1.0f / 255.0f, 0.0f);
                yb[b] = labels[k];
            }
            double l;
            MK(mnistcu_model_compute_grads(ref, xb.data(), yb.data(), BMAX, &l));
            MK(mnistcu_model_apply_grads(ref, &od));
            if (s == upto - 1) {
                double lf;
                CK(cudaMemcpy(&lf, d_loss + s, 8, cudaMemcpyDeviceToHost));
                printf("step %d: loss %.7f (step by step) %.7f (fused)\n", s + 1, l, lf);
            }
        }
        done = upto;
        MK(mnistcu_model_get_params(ref, wr.data(), NP));
        CK(cudaMemcpy(wf.data(), d_w, NP * 4, cudaMemcpyDeviceToHost));
        const char *names[] = {"conv1.w", "conv1.b", "conv2.w", "conv2.b", "fc1.w", "fc1.b", "fc2.w", "fc2.b", "fc3.w", "fc3.b"};
        printf("after %d steps, max |fused - step by step| / max |step by step - initial|:", upto);
        for (int t = 0; t < 10; ++t) {
            double md = 0, mc = 0;
            for (int i = offs[t]; i < offs[t + 1]; ++i) {
                md = std::max(md, (double)fabsf(wf[i] - wr[i]));
                mc = std::max(mc, (double)fabsf(wr[i] - w0[i]));
            }
            printf(" %s %.2e", names[t], mc > 0 ? md / mc : md);
        }
        printf("\n");
    }

    /* 2. determinism: the first 200 steps again */
    {
        std::vector<float> w2(NP);
        reset();
        launch(0, 200, 1);
        CK(cudaMemcpy(w2.data(), d_w, NP * 4, cudaMemcpyDeviceToHost));
        printf("200 steps twice: %s\n", memcmp(w2.data(), wf.data(), NP * 4) ? "DIFFERENT bits" : "the same bits");
    }

    /* 3. epochs: one warm-up, then `epochs` timed, each a new shuffle; the test accuracy after */
    reset();
    std::vector<double> ms;
    std::vector<double> lossv(maxsteps);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int e = 0; e <= epochs; ++e) {
        if (e) shuffle();
        CK(cudaMemset(d_ph, 0, 32 * 8));
        CK(cudaEventRecord(e0));
        launch(0, maxsteps, e == 0);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        CK(cudaMemcpy(lossv.data(), d_loss, maxsteps * 8, cudaMemcpyDeviceToHost));
        double ls = 0;
        for (int s = 0; s < maxsteps; ++s) ls += lossv[s];
        printf("epoch %d: %.3f ms (%.2f us a step), mean loss %.4f%s\n", e, t, 1e3 * t / maxsteps, ls / maxsteps,
               e ? "" : " (warm-up)");
        if (e) ms.push_back(t);
#ifdef PHASES
        long long ph[32];
        CK(cudaMemcpy(ph, d_ph, sizeof ph, cudaMemcpyDeviceToHost));
        int clk = 0;
        CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
        printf("  phases (us a step, block 0's clock incl. its barrier):");
        for (int k = 0; k < 16; ++k) printf(" %d:%.2f", k, (double)ph[k] / (clk * 1e-3) / maxsteps);
        printf("\n");
#endif
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaMemcpy(wf.data(), d_w, NP * 4, cudaMemcpyDeviceToHost));
    MK(mnistcu_model_set_params(ref, wf.data(), NP));
    mnistcu_metrics met;
    MK(mnistcu_evaluate(ref, test, &met, NULL));
    printf("RESULT lenet_fused: median %.3f ms an epoch over %d epochs, test accuracy %.2f%% after %d epochs, grid %d\n",
           ms[ms.size() / 2], epochs, 100.0 * met.accuracy, epochs + 1, G);
    mnistcu_model_destroy(ref);
    mnistcu_dataset_destroy(test);
    mnistcu_ctx_destroy(ctx);
    return 0;
}
