/* LeNet-5's training steps in one persistent kernel, measured against the
   step-by-step path (P4: MNIST 60k, batch 64, SGD momentum 0.9, lr 0.02).

   nvcc -O3 -arch=sm_90 -o build/lenet_fused bench/lenet_fused.cu && build/lenet_fused data/mnist

   A prototype: the model is fixed (1x28x28 conv5x5x6 relu maxpool2 conv5x5x16
   relu maxpool2 flatten dense120 relu dense84 relu dense10, cross entropy,
   the mean over the batch); the library makes the initial weights, the
   reference steps and the test accuracy. One cooperative kernel runs the
   epoch's steps, one block of 256 threads or two per multiprocessor, each
   step in ten phases with a grid-wide barrier after each:
     1  conv1 + relu + max pool (4 lanes a pooling window, the batch read as bytes)
     2  conv2 + relu + max pool (a block per sample and half the channels, its
        input and weights in shared memory)
     3  dense120 + relu          (4 lanes an output, each a quarter of k)
     4  dense84 + relu
     5  dense10, the loss and its gradient in every block (all of it is small);
        then, shared out, dh2 and the gradient of dense10
     6  dh1 and the gradient of dense84
     7  the pooled gradient of conv2's output, routed by the pool's argmax and
        the relu; the gradient of dense120
     8  conv2's input gradient (a gather over the pooled gradients, as sparse as
        the pool leaves them), routed to conv1's pooled map; conv2's weight
        gradient in 8 slices of the batch; the dense layers' optimizer step
     9  conv1's weight gradient, a partial sum a sample and half a map; the sum
        of conv2's slices and its optimizer step
     10 the sum of conv1's partials and its optimizer step
   Every sum is in a fixed order and nothing uses atomics: the same bits on
   every run. The orders are not the step-by-step path's, so the weights agree
   with it to rounding, not bit for bit (printed: the largest difference
   against the largest change, per tensor). */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#include <cooperative_groups.h>
#include <algorithm>
#include <vector>

namespace cg = cooperative_groups;

#define NT 256
enum { IH = 28, KS = 5, C1 = 6, O1 = 24, Q1 = 12, C2 = 16, O2 = 8, Q2 = 4, D0 = 256, D1 = 120, D2 = 84, D3 = 10,
       BMAX = 64 };
enum { oW1 = 0, oB1 = 150, oW2 = 156, oB2 = 2556, oF1 = 2572, oG1 = 33292, oF2 = 33412, oG2 = 43492, oF3 = 43576,
       oG3 = 44416, NP = 44426 };
#define S2 8     /* slices of the batch in conv2's weight gradient */
#define NPART2 (C2 * 151)
#define NPART1 (C1 * 26)

struct LA {
    const uint8_t *u8;
    const int32_t *lab;
    const uint32_t *idx;
    size_t n;          /* samples in the epoch */
    int step0, nsteps; /* the chunk */
    float *w, *g, *mom;
    mnistcu__opt o_first, o_next;
    int first_step;    /* 1: the chunk's first step is the optimizer's first */
    float *p1, *p2, *h1, *h2, *dh2, *dh1, *g2, *g1, *part2, *part1;
    uint8_t *am1, *am2;
    double *loss;
    int *correct;
    long long *ph;     /* with PHASES: block 0's clock a phase, summed */
};

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
__device__ __forceinline__ float sum4(float v)
{
    v = v + __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__device__ __forceinline__ void opt_range(const LA &a, const mnistcu__opt *o, int from, int to, int gt, int GT)
{
    for (int i = from + gt; i < to; i += GT) mnistcu__opt_one(o, (size_t)i, a.w, a.g[i], a.mom);
}

__global__ void __launch_bounds__(NT, 2) k_lenet(LA a)
{
    extern __shared__ float sm[];
    cg::grid_group grid = cg::this_grid();
    const int tid = threadIdx.x, gt = blockIdx.x * NT + tid, GT = gridDim.x * NT;
    const int lane = tid & 31, q = lane & 3;
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

        /* 1: conv1 + relu + pool; 4 consecutive lanes hold a window's 4 positions */
        {
            const int N = Bs * C1 * Q1 * Q1 * 4; /* a multiple of 32 */
            const float *W = a.w + oW1;
            for (int i = gt; i < N; i += GT) {
                int win = i >> 2, px = win % Q1, t = win / Q1, py = t % Q1, c, b;
                t /= Q1; c = t % C1; b = t / C1;
                int oy = 2 * py + (q >> 1), ox = 2 * px + (q & 1);
                const uint8_t *xr = a.u8 + (size_t)bidx[b] * (IH * IH) + oy * IH + ox;
                const float *wc = W + c * 25;
                float acc = 0.0f;
#pragma unroll
                for (int ky = 0; ky < KS; ++ky)
#pragma unroll
                    for (int kx = 0; kx < KS; ++kx)
                        acc = fmaf(fmaf((float)xr[ky * IH + kx], 1.0f / 255.0f, 0.0f), wc[ky * KS + kx], acc);
                float m = relu(acc + a.w[oB1 + c]);
                int am = q;
                max4(m, am);
                if (q == 0) { a.p1[win] = m; a.am1[win] = (uint8_t)am; }
            }
        }
        grid.sync();
        MARK(0);

        /* 2: conv2 + relu + pool, a block per (sample, half of the channels) */
        {
            float *P = sm, *Wsm = sm + C1 * Q1 * Q1;
            for (int it = blockIdx.x; it < Bs * 2; it += gridDim.x) {
                int b = it >> 1, oc0 = (it & 1) * 8;
                __syncthreads();
                for (int j = tid; j < C1 * Q1 * Q1; j += NT) P[j] = a.p1[(size_t)b * (C1 * Q1 * Q1) + j];
                for (int j = tid; j < 8 * 150; j += NT) Wsm[j] = a.w[oW2 + oc0 * 150 + j];
                __syncthreads();
                for (int i = tid; i < 8 * 64; i += NT) {
                    int win = i >> 2, oc = win >> 4, pw = win & 15, py = pw >> 2, px = pw & 3;
                    int oy = 2 * py + (q >> 1), ox = 2 * px + (q & 1);
                    const float *wc = Wsm + oc * 150;
                    float acc = 0.0f;
                    for (int ic = 0; ic < C1; ++ic) {
                        const float *pr = P + ic * (Q1 * Q1) + oy * Q1 + ox;
#pragma unroll
                        for (int ky = 0; ky < KS; ++ky)
#pragma unroll
                            for (int kx = 0; kx < KS; ++kx) acc = fmaf(pr[ky * Q1 + kx], wc[ic * 25 + ky * KS + kx], acc);
                    }
                    float m = relu(acc + a.w[oB2 + oc0 + oc]);
                    int am = q;
                    max4(m, am);
                    if (q == 0) {
                        size_t k = (size_t)b * D0 + (oc0 + oc) * 16 + pw;
                        a.p2[k] = m;
                        a.am2[k] = (uint8_t)am;
                    }
                }
            }
        }
        grid.sync();
        MARK(1);

        /* 3: dense120 + relu; 4 lanes an output, lane q the k = q mod 4 */
        {
            const int N = Bs * D1 * 4;
            for (int i = gt; i < N; i += GT) {
                int o = i >> 2, b = o / D1, j = o - b * D1;
                const float *x = a.p2 + (size_t)b * D0, *wr = a.w + oF1 + j * D0;
                float acc = 0.0f;
#pragma unroll 8
                for (int t = 0; t < D0 / 4; ++t) acc = fmaf(x[4 * t + q], wr[4 * t + q], acc);
                acc = sum4(acc);
                if (q == 0) a.h1[o] = relu(acc + a.w[oG1 + j]);
            }
        }
        grid.sync();
        MARK(2);

        /* 4: dense84 + relu */
        {
            const int N = Bs * D2 * 4, NU = (N + 31) & ~31;
            for (int i = gt; i < NU; i += GT) {
                int o = i >> 2, b = o / D2, j = o - b * D2;
                float acc = 0.0f;
                if (i < N) {
                    const float *x = a.h1 + (size_t)b * D1, *wr = a.w + oF2 + j * D1;
#pragma unroll 6
                    for (int t = 0; t < D1 / 4; ++t) acc = fmaf(x[4 * t + q], wr[4 * t + q], acc);
                }
                acc = sum4(acc);
                if (q == 0 && i < N) a.h2[o] = relu(acc + a.w[oG2 + j]);
            }
        }
        grid.sync();
        MARK(3);

        /* 5: dense10 and the loss in every block; then dh2 and dense10's gradient, shared out */
        {
            float *H = sm, *W3 = H + BMAX * D2, *z = W3 + D3 * D2, *dz = z + BMAX * D3, *lrow = dz + BMAX * D3;
            int *crow = (int *)(lrow + BMAX);
            for (int j = tid; j < Bs * D2; j += NT) H[j] = a.h2[j];
            for (int j = tid; j < D3 * D2; j += NT) W3[j] = a.w[oF3 + j];
            __syncthreads();
            for (int o = tid; o < Bs * D3; o += NT) {
                int b = o / D3, c = o - b * D3;
                float acc = 0.0f;
                for (int j = 0; j < D2; ++j) acc = fmaf(H[b * D2 + j], W3[c * D2 + j], acc);
                z[o] = acc + a.w[oG3 + c];
            }
            __syncthreads();
            if (tid < Bs) {
                const float *zr = z + tid * D3;
                int y = a.lab[bidx[tid]], pred = 0;
                float mx = zr[0], se = 0.0f;
                for (int c = 1; c < D3; ++c)
                    if (zr[c] > mx) { mx = zr[c]; pred = c; }
                for (int c = 0; c < D3; ++c) se += expf(zr[c] - mx);
                lrow[tid] = logf(se) + mx - zr[y];
                crow[tid] = pred == y;
                for (int c = 0; c < D3; ++c) dz[tid * D3 + c] = (expf(zr[c] - mx) / se - (c == y ? 1.0f : 0.0f)) * rB;
            }
            __syncthreads();
            if (blockIdx.x == 0 && tid == 0) {
                double l = 0.0;
                int k = 0;
                for (int b = 0; b < Bs; ++b) { l += lrow[b]; k += crow[b]; }
                a.loss[a.step0 + st] = l / Bs;
                a.correct[a.step0 + st] = k;
            }
            const int N1 = Bs * D2, N2 = N1 + D3 * D2, N3 = N2 + D3;
            for (int i = gt; i < N3; i += GT) {
                if (i < N1) {
                    int b = i / D2, j = i - b * D2;
                    float acc = 0.0f;
                    for (int c = 0; c < D3; ++c) acc = fmaf(dz[b * D3 + c], W3[c * D2 + j], acc);
                    a.dh2[i] = H[i] > 0.0f ? acc : 0.0f;
                } else if (i < N2) {
                    int r = i - N1, c = r / D2, j = r - c * D2;
                    float acc = 0.0f;
                    for (int b = 0; b < Bs; ++b) acc = fmaf(dz[b * D3 + c], H[b * D2 + j], acc);
                    a.g[oF3 + r] = acc;
                } else {
                    int c = i - N2;
                    float acc = 0.0f;
                    for (int b = 0; b < Bs; ++b) acc += dz[b * D3 + c];
                    a.g[oG3 + c] = acc;
                }
            }
        }
        grid.sync();
        MARK(4);

        /* 6: dh1 (4 lanes an output) and dense84's gradient */
        {
            const int N1 = Bs * D1 * 4, N2 = N1 + D2 * D1, N3 = N2 + D2, NU = (N3 + 31) & ~31;
            for (int i = gt; i < NU; i += GT) {
                if (i < N1) { /* N1 is a multiple of 32: whole warps */
                    int o = i >> 2, b = o / D1, j = o - b * D1;
                    const float *d = a.dh2 + (size_t)b * D2, *wc = a.w + oF2 + j;
                    float acc = 0.0f;
#pragma unroll 7
                    for (int t = 0; t < D2 / 4; ++t) acc = fmaf(d[4 * t + q], wc[(4 * t + q) * D1], acc);
                    acc = sum4(acc);
                    if (q == 0) a.dh1[o] = a.h1[o] > 0.0f ? acc : 0.0f;
                } else if (i < N2) {
                    int r = i - N1, k = r / D1, j = r - k * D1;
                    float acc = 0.0f;
                    for (int b = 0; b < Bs; ++b) acc = fmaf(a.dh2[b * D2 + k], a.h1[b * D1 + j], acc);
                    a.g[oF2 + r] = acc;
                } else if (i < N3) {
                    int k = i - N2;
                    float acc = 0.0f;
                    for (int b = 0; b < Bs; ++b) acc += a.dh2[b * D2 + k];
                    a.g[oG2 + k] = acc;
                }
            }
        }
        grid.sync();
        MARK(5);

        /* 7: conv2's pooled output gradient (routed: zero where the pool's output is zero, the relu'),
           and dense120's gradient */
        {
            const int N1 = Bs * D0 * 4, N2 = N1 + D1 * D0, N3 = N2 + D1;
            for (int i = gt; i < N3; i += GT) {
                if (i < N1) {
                    int o = i >> 2, b = o / D0, k = o - b * D0;
                    const float *d = a.dh1 + (size_t)b * D1, *wc = a.w + oF1 + k;
                    float acc = 0.0f;
#pragma unroll 6
                    for (int t = 0; t < D1 / 4; ++t) acc = fmaf(d[4 * t + q], wc[(4 * t + q) * D0], acc);
                    acc = sum4(acc);
                    if (q == 0) a.g2[o] = a.p2[o] > 0.0f ? acc : 0.0f;
                } else if (i < N2) {
                    int r = i - N1, j = r / D0, k = r - j * D0;
                    float acc = 0.0f;
                    for (int b = 0; b < Bs; ++b) acc = fmaf(a.dh1[b * D1 + j], a.p2[b * D0 + k], acc);
                    a.g[oF1 + r] = acc;
                } else {
                    int j = i - N2;
                    float acc = 0.0f;
                    for (int b = 0; b < Bs; ++b) acc += a.dh1[b * D1 + j];
                    a.g[oG1 + j] = acc;
                }
            }
        }
        grid.sync();
        MARK(6);

        /* 8: conv2's input gradient routed to conv1's pooled map (items b*6+ic), conv2's weight
           gradient in S2 slices of the batch (items after them: slice*16+oc); the dense layers' step */
        {
            const int NA = Bs * C1, NB = S2 * C2;
            for (int it = blockIdx.x; it < NA + NB; it += gridDim.x) {
                __syncthreads();
                if (it < NA) {
                    int b = it / C1, ic = it - b * C1;
                    float *G = sm, *W = sm + D0;
                    uint8_t *AM = (uint8_t *)(W + C2 * 25);
                    for (int j = tid; j < D0; j += NT) { G[j] = a.g2[(size_t)b * D0 + j]; AM[j] = a.am2[(size_t)b * D0 + j]; }
                    for (int j = tid; j < C2 * 25; j += NT) {
                        int oc = j / 25, kk = j - oc * 25;
                        W[j] = a.w[oW2 + oc * 150 + ic * 25 + kk];
                    }
                    __syncthreads();
                    if (tid < Q1 * Q1) {
                        int y = tid / Q1, x = tid - y * Q1;
                        int py0 = y >= 4 ? (y - 4) >> 1 : 0, py1 = min(Q2 - 1, y >> 1);
                        int px0 = x >= 4 ? (x - 4) >> 1 : 0, px1 = min(Q2 - 1, x >> 1);
                        float acc = 0.0f;
                        for (int oc = 0; oc < C2; ++oc)
                            for (int py = py0; py <= py1; ++py)
                                for (int px = px0; px <= px1; ++px) {
                                    int k = oc * 16 + py * 4 + px, m = AM[k];
                                    int ky = y - (2 * py + (m >> 1)), kx = x - (2 * px + (m & 1));
                                    if ((unsigned)ky < KS && (unsigned)kx < KS) acc = fmaf(G[k], W[oc * 25 + ky * KS + kx], acc);
                                }
                        size_t k1 = (size_t)b * (C1 * Q1 * Q1) + ic * (Q1 * Q1) + tid;
                        a.g1[k1] = a.p1[k1] > 0.0f ? acc : 0.0f;
                    }
                } else {
                    int r = it - NA, sl = r / C2, oc = r - sl * C2;
                    int b0 = sl * BMAX / S2, b1 = min(Bs, (sl + 1) * BMAX / S2), nb = b1 > b0 ? b1 - b0 : 0;
                    float *P = sm, *G = sm + (BMAX / S2) * (C1 * Q1 * Q1);
                    uint8_t *AM = (uint8_t *)(G + (BMAX / S2) * 16);
                    for (int j = tid; j < nb * (C1 * Q1 * Q1); j += NT) P[j] = a.p1[(size_t)b0 * (C1 * Q1 * Q1) + j];
                    for (int j = tid; j < nb * 16; j += NT) {
                        int bl = j >> 4, w = j & 15;
                        G[j] = a.g2[(size_t)(b0 + bl) * D0 + oc * 16 + w];
                        AM[j] = a.am2[(size_t)(b0 + bl) * D0 + oc * 16 + w];
                    }
                    __syncthreads();
                    if (tid < 150) {
                        int ic = tid / 25, kk = tid - ic * 25, ky = kk / KS, kx = kk - ky * KS;
                        float acc = 0.0f;
                        for (int bl = 0; bl < nb; ++bl)
                            for (int w = 0; w < 16; ++w) {
                                int m = AM[bl * 16 + w];
                                int oy = 2 * (w >> 2) + (m >> 1), ox = 2 * (w & 3) + (m & 1);
                                acc = fmaf(G[bl * 16 + w], P[bl * (C1 * Q1 * Q1) + ic * (Q1 * Q1) + (oy + ky) * Q1 + ox + kx], acc);
                            }
                        a.part2[sl * NPART2 + oc * 151 + tid] = acc;
                    } else if (tid == 150) {
                        float acc = 0.0f;
                        for (int j = 0; j < nb * 16; ++j) acc += G[j];
                        a.part2[sl * NPART2 + oc * 151 + 150] = acc;
                    }
                }
            }
            opt_range(a, o, oF1, NP, gt, GT);
        }
        grid.sync();
        MARK(7);

        /* 9: conv1's weight gradient, a partial a (sample, half of the pooled map); conv2's sums and step */
        {
            const int NA = Bs * 2;
            for (int it = blockIdx.x; it < NA; it += gridDim.x) {
                int b = it >> 1, h = it & 1;
                float *X = sm, *G = sm + IH * IH;
                uint8_t *AM = (uint8_t *)(G + C1 * 72);
                __syncthreads();
                const uint8_t *xr = a.u8 + (size_t)bidx[b] * (IH * IH);
                for (int j = tid; j < IH * IH; j += NT) X[j] = fmaf((float)xr[j], 1.0f / 255.0f, 0.0f);
                for (int j = tid; j < C1 * 72; j += NT) {
                    int c = j / 72, w = j - c * 72;
                    size_t k = (size_t)b * (C1 * Q1 * Q1) + c * (Q1 * Q1) + h * 72 + w;
                    G[j] = a.g1[k];
                    AM[j] = a.am1[k];
                }
                __syncthreads();
                if (tid < 150) {
                    int c = tid / 25, kk = tid - c * 25, ky = kk / KS, kx = kk - ky * KS;
                    float acc = 0.0f;
                    for (int w = 0; w < 72; ++w) {
                        int m = AM[c * 72 + w], pw = h * 72 + w;
                        int oy = 2 * (pw / Q1) + (m >> 1), ox = 2 * (pw % Q1) + (m & 1);
                        acc = fmaf(G[c * 72 + w], X[(oy + ky) * IH + ox + kx], acc);
                    }
                    a.part1[it * NPART1 + c * 26 + kk] = acc;
                } else if (tid < 156) {
                    int c = tid - 150;
                    float acc = 0.0f;
                    for (int w = 0; w < 72; ++w) acc += G[c * 72 + w];
                    a.part1[it * NPART1 + c * 26 + 25] = acc;
                }
            }
            for (int i = gt; i < NPART2; i += GT) {
                float acc = 0.0f;
                for (int sl = 0; sl < S2; ++sl) acc += a.part2[sl * NPART2 + i];
                int oc = i / 151, r = i - oc * 151;
                int p = r < 150 ? oW2 + oc * 150 + r : oB2 + oc;
                mnistcu__opt_one(o, (size_t)p, a.w, acc, a.mom);
                a.g[p] = acc;
            }
        }
        grid.sync();
        MARK(8);

        /* 10: conv1's sums and step */
        for (int i = gt; i < NPART1; i += GT) {
            float acc = 0.0f;
            for (int it = 0; it < Bs * 2; ++it) acc += a.part1[it * NPART1 + i];
            int c = i / 26, r = i - c * 26;
            int p = r < 25 ? oW1 + c * 25 + r : oB1 + c;
            mnistcu__opt_one(o, (size_t)p, a.w, acc, a.mom);
            a.g[p] = acc;
        }
        grid.sync();
        MARK(9);
    }
}

/* ---- host ---- */
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define MK(x) do { if ((x) != MNISTCU_OK) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, mnistcu_ctx_error(ctx)); exit(1); } } while (0)

static size_t smem_bytes(void)
{
    size_t s2 = (C1 * Q1 * Q1 + 8 * 150) * 4;
    size_t s5 = (BMAX * D2 + D3 * D2 + 2 * BMAX * D3 + BMAX) * 4 + BMAX * 4;
    size_t s8a = (D0 + C2 * 25) * 4 + D0;
    size_t s8b = ((BMAX / S2) * (C1 * Q1 * Q1) + (BMAX / S2) * 16) * 4 + (BMAX / S2) * 16;
    size_t s9 = (IH * IH + C1 * 72) * 4 + C1 * 72;
    return std::max(std::max(std::max(s2, s5), std::max(s8a, s8b)), s9) + 16;
}

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
    uint8_t *d_u8, *d_am1, *d_am2;
    int32_t *d_lab;
    uint32_t *d_idx;
    float *d_w, *d_g, *d_mom, *d_p1, *d_p2, *d_h1, *d_h2, *d_dh2, *d_dh1, *d_g2, *d_g1, *d_part2, *d_part1;
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
    CK(cudaMalloc(&d_p1, BMAX * C1 * Q1 * Q1 * 4));
    CK(cudaMalloc(&d_am1, BMAX * C1 * Q1 * Q1));
    CK(cudaMalloc(&d_p2, BMAX * D0 * 4));
    CK(cudaMalloc(&d_am2, BMAX * D0));
    CK(cudaMalloc(&d_h1, BMAX * D1 * 4));
    CK(cudaMalloc(&d_h2, BMAX * D2 * 4));
    CK(cudaMalloc(&d_dh2, BMAX * D2 * 4));
    CK(cudaMalloc(&d_dh1, BMAX * D1 * 4));
    CK(cudaMalloc(&d_g2, BMAX * D0 * 4));
    CK(cudaMalloc(&d_g1, BMAX * C1 * Q1 * Q1 * 4));
    CK(cudaMalloc(&d_part2, S2 * NPART2 * 4));
    CK(cudaMalloc(&d_part1, 2 * BMAX * NPART1 * 4));
    CK(cudaMalloc(&d_loss, maxsteps * 8));
    CK(cudaMalloc(&d_corr, maxsteps * 4));
    CK(cudaMalloc(&d_ph, 16 * 8));
    CK(cudaMemset(d_ph, 0, 16 * 8));

    size_t smem = smem_bytes();
    int dev = 0, sms = 0, per = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaFuncSetAttribute(k_lenet, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_lenet, NT, smem));
    int G = sms * std::min(per, 2);
    if (want_blocks > 0 && want_blocks <= sms * per) G = want_blocks;
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, k_lenet));
    printf("lenet_fused: %d multiprocessors, %d blocks a multiprocessor fit, grid %d x %d, %zu B shared, %d registers\n",
           sms, per, G, NT, smem, fa.numRegs);

    LA a;
    memset(&a, 0, sizeof a);
    a.u8 = d_u8; a.lab = d_lab; a.idx = d_idx; a.n = n;
    a.w = d_w; a.g = d_g; a.mom = d_mom;
    a.p1 = d_p1; a.p2 = d_p2; a.h1 = d_h1; a.h2 = d_h2; a.dh2 = d_dh2; a.dh1 = d_dh1; a.g2 = d_g2; a.g1 = d_g1;
    a.part2 = d_part2; a.part1 = d_part1; a.am1 = d_am1; a.am2 = d_am2;
    a.loss = d_loss; a.correct = d_corr; a.ph = d_ph;
    mnistcu__opt_make(&od, 1, NP, &a.o_first);
    mnistcu__opt_make(&od, 2, NP, &a.o_next);

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
        CK(cudaMemset(d_ph, 0, 16 * 8));
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
        long long ph[16];
        CK(cudaMemcpy(ph, d_ph, sizeof ph, cudaMemcpyDeviceToHost));
        int clk = 0;
        CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
        printf("  phases (us a step, block 0's clock incl. its barrier):");
        for (int k = 0; k < 10; ++k) printf(" %d:%.2f", k + 1, (double)ph[k] / (clk * 1e-3) / maxsteps);
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
