/* bench/cuda_conv.cu - convolution kernel variants for the conv layers of the presets "lenet5" and
   "fashion-cnn" at batch 64, validated and timed. Standalone: it does not include mnistcu.h.

   Build:  nvcc -O3 -arch=sm_90 -o build/cuda_conv bench/cuda_conv.cu
           nvcc -O3 -arch=sm_90 -DWITH_CUDNN -o build/cuda_conv bench/cuda_conv.cu -lcudnn   (adds v3, v4)
   Run:    build/cuda_conv [--reps N] [--shape L1|L2|F1|F2] [--seed S]
           (needs a CUDA GPU; exits 1 without one, or when a variant is wrong or not deterministic)

   Layout as mnistcu and PyTorch: X [B][Cin][H][W], W [Cout][Cin][k][k], b [Cout], Y [B][Cout][OH][OW];
   no padding, stride 1, so OH = H - k + 1. B = 64. The shapes:
     L1  LeNet-5 conv1        1 ->   6, 5x5, 28x28 -> 24x24   (K = Cin*k*k =  25, P = OH*OW = 576)
     L2  LeNet-5 conv2        6 ->  16, 5x5, 12x12 ->  8x8    (K = 150, P =  64)
     F1  Fashion CNN conv1    1 ->  64, 3x3, 28x28 -> 26x26   (K =   9, P = 676)
     F2  Fashion CNN conv2   64 -> 128, 3x3, 13x13 -> 11x11   (K = 576, P = 121)
   Passes: fwd  Y = conv(X, W) + b
           dX   dX = conv_transpose(dY, W)     (the input gradient; a first layer's is not needed in
                                                training, but it is timed here too)
           dW   dW = correlation of dY with X, and db = the sum of dY over batch and positions
   Variants:
     v1  im2col + register-tiled SGEMM: im2col writes col [K][B*P] (row k = (ci, r, s), column
         n = (b, oh, ow)); the SGEMM is a 64x64-tile kernel (256 threads, 4x4 outputs each) or a
         16x16-tile kernel (one output per thread), the two of bench/cuda_gemm.cu, picked by shape
         (64x64 when M >= 64 and N >= 64); when the product has fewer tiles than multiprocessors it is
         split over K (grid.z) into partial products that a second kernel adds in a fixed order.
           fwd: im2col, Ycol[Cout][B*P] = W[Cout][K] col, then permute + bias to NCHW   (3 launches)
           dX:  permute dY to dYcol[Cout][B*P], dcol[K][B*P] = W^T dYcol, col2im (a gather: each
                input pixel sums its k*k contributions in a fixed order)           (3 launches)
           dW:  im2col, permute dY, dW[Cout][K] = dYcol col^T (split-K, + the fixed-order reduction
                of the splits), db = row sums of dYcol (one block per channel, a fixed tree)  (4-5)
     v2  direct, for small channel counts: one thread per output element, the weights a block needs
         in shared memory, the data read through the read-only cache.
           fwd: block = (256 outputs of one image, a group of output channels whose weights fit in
                48 KB)                                                              (1 launch)
           dX:  one thread per input pixel, block = (an image, a group of input channels) (1 launch)
           dW:  block = (co, ci, a slice of the batch): each thread sums k*k products (and, for ci = 0,
                dY for db) over its positions, a fixed-order tree in shared memory per block, then a
                kernel adds the batch slices in order                              (2 launches)
     v5  v2 with what each block reads first copied into shared memory, all loads at once (fwd: the
         image's input; dX: its output gradient; dW: the slice's planes of ci and co), then v2's sums in
         v2's order from there. v2 where weights and staged data pass 48 KB.
     v3  cuDNN (WITH_CUDNN): cudnnConvolutionForward + cudnnAddTensor, cudnnConvolutionBackwardData,
         cudnnConvolutionBackwardFilter + cudnnConvolutionBackwardBias; FP32 with CUDNN_FMA_MATH (no
         TF32); the algorithm is the fastest by cudnnFind* that cuDNN marks deterministic and that
         passes the error check below (candidates tried in cudnnFind's order; the bitwise repeat is
         reported, "nondet" in the table, but cuDNN's results never fail the program).
     v4  cuDNN, the fastest algorithm that passes the check, deterministic or not (roughly what
         torch.backends.cudnn.benchmark = True picks). Reference only.
   No variant of ours uses atomics: every output is written by one thread, reductions run in a fixed
   order, so two runs are bitwise identical; the program checks that for every variant and exits 1 if
   v1 or v2 is wrong or not deterministic.

   Checks: every pass of every variant is compared with a CPU double-precision reference on random
   inputs in [-1, 1): ||out - ref||_F / ||ref||_F must be <= 1e-5 for each output (Y; dX; dW and db);
   outputs and intermediate buffers are poisoned with NaN before each checked run (an unwritten element
   fails); each is run twice and must give the same bits; and the check is repeated after timing.
   Timing: CUDA events around one pass (all its launches, back to back on one stream), 5 warm-ups,
   median of --reps (default 30, at least 20); and the pass captured 20 times in one CUDA graph, the
   median of 10 replays divided by 20 (launch gaps shrink to graph-node gaps, as in a captured
   training step). GFLOP/s = 2*B*Cout*P*K / time (the bias and db adds not counted). The inputs fit in
   L2 (50 MB on the H100) and are not rotated: in training the previous layer has just written them.

   ---- Floors (H100 SXM: FP32 FMA peak 67 TFLOP/s; device-to-device copy measured at about 3.0 TB/s,
   counting bytes read and written). FLOPs per pass = 2*B*Cout*P*K, the same for fwd, dX and dW. Bytes:
   each input read once, each output written once (fwd: X + W + b + Y; dX: dY + W + dX; dW: X + dY +
   dW + db), about the same in all three passes:
       shape   FLOP/pass   at 67 TFLOP/s   bytes/pass   at 3.0 TB/s   floor          bound by
       L1      11.06 M       0.17 us        1.09 MB       0.36 us      0.36 us        bytes
       L2      19.66 M       0.29 us        0.49 MB       0.16 us      0.29 us        arithmetic
       F1      49.84 M       0.74 us       11.28 MB       3.76 us      3.76 us        bytes (Y is 11 MB)
       F2    1141.90 M      17.04 us        7.03 MB       2.34 us     17.0 us         arithmetic
   Every floor but F2's is below the cost of launching one kernel (BENCHMARKS.md, H100: 4.3 us per
   back-to-back stream launch, about 1 us per node of a replayed graph): L1, L2 and F1 are bound by
   launches and latency, and the number of launches per pass decides the stream timings.
   A training step's conv work: LeNet-5 = L1 fwd + L1 dW + L2 fwd + L2 dX + L2 dW (5 passes, floor
   ~1.6 us, but 5 launches of ~1 us each even in a graph); the Fashion CNN = F1 fwd + F1 dW + F2 fwd +
   F2 dX + F2 dW (floor ~59 us, of which F2 is 3 x 17 = 51 us). Per epoch (938 steps) that is ~1.5 ms
   (LeNet-5; ~5 ms of graph nodes) and ~55 ms (Fashion CNN) at the floor, against P4's 25 ms and P5's
   80 ms FP32 goals: F2 at the FMA peak is most of P5's budget.

   ---- Predictions, written before the first run (H100; stream = events around back-to-back launches,
   graph = per pass inside a replayed graph):
     v1 (3-5 launches): small shapes L1, L2 launch-bound: stream 10-20 us per pass, graph 4-8 us.
        F1: fwd ~20 us stream (the 11 MB Y is written twice: Ycol, then permuted), dX ~25 us, dW ~30 us.
        F2: the 64x64 SGEMM ran at 12-16 TFLOP/s on 512x1024x784 (bench/RESULTS.md); here 242 tiles
        for fwd, 1089 for dX, 18 x 15 splits for dW: ~80-100 us each pass (10-14 TFLOP/s), plus im2col
        writing a 17.8 MB col matrix: ~90-110 us per pass, about 6 x the F2 floor.
     v2 (1-2 launches): L1, L2, F1 stream 5-10 us per pass, graph 2-6 us: the best of ours on the small
        shapes (fewer launches; no col matrix). F1 fwd ~6-8 us, bound by writing Y. F2: every FMA
        needs a shared and a global/L1 load, so ~1/8 of the FMA rate at best: 150-300 us per pass,
        the worst variant there. v2 is for small channel counts, as its name says.
     v3 cuDNN deterministic: small shapes 10-20 us stream (2 calls for fwd and dW, each with host
        overhead), F2 fwd ~40-60 us (implicit GEMM at 20-30 TFLOP/s), dX ~50-70 us, dW ~60-90 us.
     v4: F2 a little faster than v3 where a non-deterministic dW algorithm wins; otherwise the same.
     Expected winners: v2 on L1, L2, F1; cuDNN on F2, with v1 within 2x of it.
*/
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef WITH_CUDNN
#include <cudnn.h>
#endif

#define BATCH 64
#define PEAK_FLOPS 67e12 /* H100 SXM FP32 FMA rate */
#define PEAK_BYTES 3.0e12 /* H100 device-to-device copy, measured (KINDS.md) */
#define TOL 1e-5
#define GRAPH_COPIES 20
#define GRAPH_REPLAYS 10

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "cuda_conv: FAILED: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,           \
                    cudaGetErrorString(e_));                                                         \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

/* inside a pass: return the error instead of exiting (a pass may run during graph capture) */
#define RET(x)                                                                                       \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) return e_;                                                            \
    } while (0)
#define LAUNCHED() RET(cudaGetLastError())

static int g_nsm = 132;

/* ==== v1: im2col, SGEMM, permutes ================================================================ */

/* col[k][n] = X[b][ci][oh+r][ow+s], k = (ci*KS + r)*KS + s, n = b*P + oh*OW + ow */
__global__ void k_im2col(const float *__restrict__ X, float *__restrict__ col, int Cin, int H, int W, int KS, int B)
{
    const int OH = H - KS + 1, OW = W - KS + 1, P = OH * OW, KK = KS * KS;
    const size_t BP = (size_t)B * P, total = (size_t)Cin * KK * BP;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int k = (int)(e / BP), n = (int)(e % BP);
        int ci = k / KK, rs = k % KK, r = rs / KS, s = rs % KS;
        int b = n / P, p = n % P, oh = p / OW, ow = p % OW;
        col[e] = __ldg(X + (((size_t)b * Cin + ci) * H + oh + r) * W + ow + s);
    }
}

/* Y[b][co][p] = Ycol[co][b*P + p] + bias[co] */
__global__ void k_permute_bias(const float *__restrict__ Ycol, const float *__restrict__ bias, float *__restrict__ Y,
                               int Cout, int P, int B)
{
    const size_t total = (size_t)B * Cout * P, BP = (size_t)B * P;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int p = (int)(e % P), co = (int)((e / P) % Cout), b = (int)(e / ((size_t)P * Cout));
        Y[e] = Ycol[(size_t)co * BP + (size_t)b * P + p] + __ldg(bias + co);
    }
}

/* dYcol[co][b*P + p] = dY[b][co][p] */
__global__ void k_permute_dy(const float *__restrict__ dY, float *__restrict__ dYcol, int Cout, int P, int B)
{
    const size_t BP = (size_t)B * P, total = (size_t)Cout * BP;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int co = (int)(e / BP), n = (int)(e % BP), b = n / P, p = n % P;
        dYcol[e] = __ldg(dY + ((size_t)b * Cout + co) * P + p);
    }
}

/* dX[b][ci][ih][iw] = sum over (r, s), in that order, of dcol[(ci*KS + r)*KS + s][b*P + (ih-r)*OW + iw-s] */
__global__ void k_col2im(const float *__restrict__ dcol, float *__restrict__ dX, int Cin, int H, int W, int KS, int B)
{
    const int OH = H - KS + 1, OW = W - KS + 1, P = OH * OW, KK = KS * KS;
    const size_t BP = (size_t)B * P, total = (size_t)B * Cin * H * W;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int iw = (int)(e % W), ih = (int)((e / W) % H), ci = (int)((e / ((size_t)W * H)) % Cin);
        int b = (int)(e / ((size_t)W * H * Cin));
        float acc = 0.0f;
        for (int r = 0; r < KS; ++r) {
            int oh = ih - r;
            if (oh < 0 || oh >= OH) continue;
            for (int s = 0; s < KS; ++s) {
                int ow = iw - s;
                if (ow < 0 || ow >= OW) continue;
                acc += __ldg(dcol + (size_t)(ci * KK + r * KS + s) * BP + (size_t)b * P + oh * OW + ow);
            }
        }
        dX[e] = acc;
    }
}

/* db[co] = sum of the row dYcol[co][0..n): one block of 256 per channel, strided sums, a fixed tree */
__global__ void __launch_bounds__(256) k_rowsum(const float *__restrict__ rows, float *__restrict__ out, int n)
{
    __shared__ float red[256];
    const int t = (int)threadIdx.x;
    const float *row = rows + (size_t)blockIdx.x * n;
    float acc = 0.0f;
    for (int i = t; i < n; i += 256) acc += __ldg(row + i);
    red[t] = acc;
    __syncthreads();
    for (int st = 128; st > 0; st >>= 1) {
        if (t < st) red[t] += red[t + st];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = red[0];
}

/* out[i] = sum over z = 0..S-1, in order, of part[z][i] */
__global__ void k_sum_splits(const float *__restrict__ part, float *__restrict__ out, size_t n, int S)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int z = 0; z < S; ++z) acc += part[(size_t)z * n + i];
        out[i] = acc;
    }
}

/* C[M][N] = op(A)[M][K] op(B)[K][N] over k in [z*kchunk, min(K, (z+1)*kchunk)), z = blockIdx.z, written to
   C + z*M*ldc. The 64x64 tile of bench/cuda_gemm.cu's v3 (mnistcu's kernel): 256 threads, 4x4 outputs
   each (rows ty+16i, columns tx+16j), K-steps of 16 through shared memory, k in increasing order. */
template <int TA, int TB>
__global__ void __launch_bounds__(256) k_gemm64(int M, int N, int K, int kchunk, const float *__restrict__ A, int lda,
                                                 const float *__restrict__ B, int ldb, float *__restrict__ C, int ldc)
{
    __shared__ float As[16][64 + 4];
    __shared__ float Bs[16][64 + 4];
    const int t = (int)threadIdx.x, tx = t % 16, ty = t / 16;
    const int n0 = (int)blockIdx.x * 64, m0 = (int)blockIdx.y * 64;
    const int kbeg = (int)blockIdx.z * kchunk, kend = min(K, kbeg + kchunk);
    float acc[4][4];
    C += (size_t)blockIdx.z * M * ldc;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = kbeg; k0 < kend; k0 += 16) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            int m = TA ? t % 64 : t / 16 + 16 * r, k = TA ? t / 64 + 4 * r : t % 16;
            int gm = m0 + m, gk = k0 + k;
            As[k][m] = (gm < M && gk < kend) ? (TA ? A[(size_t)gk * lda + gm] : A[(size_t)gm * lda + gk]) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            int n = TB ? t / 16 + 16 * r : t % 64, k = TB ? t % 16 : t / 64 + 4 * r;
            int gn = n0 + n, gk = k0 + k;
            Bs[k][n] = (gn < N && gk < kend) ? (TB ? B[(size_t)gn * ldb + gk] : B[(size_t)gk * ldb + gn]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int gm = m0 + ty + 16 * i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int gn = n0 + tx + 16 * j;
            if (gn < N) C[(size_t)gm * ldc + gn] = acc[i][j];
        }
    }
}

/* The same product in 16x16 tiles, one output per thread (bench/cuda_gemm.cu's v5, mnistcu's kernel
   for products with few 64x64 tiles). */
template <int TA, int TB>
__global__ void __launch_bounds__(256) k_gemm16(int M, int N, int K, int kchunk, const float *__restrict__ A, int lda,
                                                 const float *__restrict__ B, int ldb, float *__restrict__ C, int ldc)
{
    __shared__ float As[16][17]; /* [m][k] */
    __shared__ float Bs[16][17]; /* [k][n] */
    const int tx = (int)threadIdx.x % 16, ty = (int)threadIdx.x / 16;
    const int n0 = (int)blockIdx.x * 16, m0 = (int)blockIdx.y * 16;
    const int kbeg = (int)blockIdx.z * kchunk, kend = min(K, kbeg + kchunk);
    float acc = 0.0f;
    C += (size_t)blockIdx.z * M * ldc;
    for (int k0 = kbeg; k0 < kend; k0 += 16) {
        int am = TA ? tx : ty, ak = TA ? ty : tx, bk = TB ? tx : ty, bn = TB ? ty : tx;
        int gm = m0 + am, gka = k0 + ak, gn = n0 + bn, gkb = k0 + bk;
        As[am][ak] = (gm < M && gka < kend) ? (TA ? A[(size_t)gka * lda + gm] : A[(size_t)gm * lda + gka]) : 0.0f;
        Bs[bk][bn] = (gn < N && gkb < kend) ? (TB ? B[(size_t)gn * ldb + gkb] : B[(size_t)gkb * ldb + gn]) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
        __syncthreads();
    }
    if (m0 + ty < M && n0 + tx < N) C[(size_t)(m0 + ty) * ldc + n0 + tx] = acc;
}

/* How a product is launched: tile kernel and K-split, decided by its shape alone. */
struct gemm_plan {
    int big;    /* 1: 64x64 tiles, 0: 16x16 */
    int splits; /* partial products over K (1: none) */
    int kchunk;
    int tiles;
};

static gemm_plan plan_gemm(int M, int N, int K)
{
    gemm_plan p;
    p.big = M >= 64 && N >= 64;
    p.tiles = p.big ? ((M + 63) / 64) * ((N + 63) / 64) : ((M + 15) / 16) * ((N + 15) / 16);
    p.splits = 1;
    p.kchunk = K;
    if (p.tiles < g_nsm && K >= 128) {
        int s = (2 * g_nsm + p.tiles - 1) / p.tiles, kc = (K + s - 1) / s;
        kc = (kc + 15) / 16 * 16;
        if (kc < 64) kc = 64;
        p.kchunk = kc;
        p.splits = (K + kc - 1) / kc;
    }
    return p;
}

/* C = op(A) op(B); with splits, the partial products go to ws ([splits][M][N]) and are added in order. */
static cudaError_t gemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
                        float *ws, size_t ws_floats, cudaStream_t st)
{
    gemm_plan p = plan_gemm(M, N, K);
    float *dst = p.splits > 1 ? ws : C;
    int ldc = N, sel = ta * 2 + tb;
    if (p.splits > 1 && (size_t)p.splits * M * N > ws_floats) return cudaErrorInvalidValue;
    if (p.big) {
        dim3 grid((unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64), (unsigned)p.splits);
        if (sel == 0) k_gemm64<0, 0><<<grid, 256, 0, st>>>(M, N, K, p.kchunk, A, lda, B, ldb, dst, ldc);
        else if (sel == 1) k_gemm64<0, 1><<<grid, 256, 0, st>>>(M, N, K, p.kchunk, A, lda, B, ldb, dst, ldc);
        else if (sel == 2) k_gemm64<1, 0><<<grid, 256, 0, st>>>(M, N, K, p.kchunk, A, lda, B, ldb, dst, ldc);
        else k_gemm64<1, 1><<<grid, 256, 0, st>>>(M, N, K, p.kchunk, A, lda, B, ldb, dst, ldc);
    } else {
        dim3 grid((unsigned)((N + 15) / 16), (unsigned)((M + 15) / 16), (unsigned)p.splits);
        if (sel == 0) k_gemm16<0, 0><<<grid, 256, 0, st>>>(M, N, K, p.kchunk, A, lda, B, ldb, dst, ldc);
        else if (sel == 1) k_gemm16<0, 1><<<grid, 256, 0, st>>>(M, N, K, p.kchunk, A, lda, B, ldb, dst, ldc);
        else if (sel == 2) k_gemm16<1, 0><<<grid, 256, 0, st>>>(M, N, K, p.kchunk, A, lda, B, ldb, dst, ldc);
        else k_gemm16<1, 1><<<grid, 256, 0, st>>>(M, N, K, p.kchunk, A, lda, B, ldb, dst, ldc);
    }
    LAUNCHED();
    if (p.splits > 1) {
        size_t n = (size_t)M * N;
        k_sum_splits<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(ws, C, n, p.splits);
        LAUNCHED();
    }
    return cudaSuccess;
}

/* ==== v2: direct kernels ========================================================================= */

/* Y[b][g0+c][p], one thread per output; block (x: 256 outputs of the group, y: channel group, z: image);
   the group's weights in shared memory. Sums over (ci, r, s) in order, then adds the bias. */
template <int KS>
__global__ void __launch_bounds__(256) k_direct_fwd(const float *__restrict__ X, const float *__restrict__ Wt,
                                                     const float *__restrict__ bias, float *__restrict__ Y, int Cin,
                                                     int H, int W, int Cout, int CG)
{
    extern __shared__ float wsm[]; /* [CG][Cin*KS*KS] */
    const int OH = H - KS + 1, OW = W - KS + 1, P = OH * OW, K = Cin * KS * KS;
    const int b = (int)blockIdx.z, g0 = (int)blockIdx.y * CG;
    for (int i = (int)threadIdx.x; i < CG * K; i += (int)blockDim.x) wsm[i] = Wt[(size_t)g0 * K + i];
    __syncthreads();
    const int idx = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (idx >= CG * P) return;
    const int c = idx / P, p = idx % P, oh = p / OW, ow = p % OW;
    const float *xb = X + ((size_t)b * Cin * H + oh) * W + ow;
    const float *w = wsm + c * K;
    float acc = 0.0f;
    for (int ci = 0; ci < Cin; ++ci) {
        const float *xc = xb + (size_t)ci * H * W;
        const float *wc = w + ci * KS * KS;
#pragma unroll
        for (int r = 0; r < KS; ++r)
#pragma unroll
            for (int s = 0; s < KS; ++s) acc = fmaf(wc[r * KS + s], __ldg(xc + r * W + s), acc);
    }
    Y[((size_t)b * Cout + g0 + c) * P + p] = acc + __ldg(bias + g0 + c);
}

/* dX[b][c0+c][ih][iw], one thread per input pixel; block (x: 256 pixels, y: input-channel group, z: image);
   W[:, group] in shared memory as [co][c][r][s]. Sums over (co, r, s) in order. */
template <int KS>
__global__ void __launch_bounds__(256) k_direct_dx(const float *__restrict__ dY, const float *__restrict__ Wt,
                                                    float *__restrict__ dX, int Cin, int H, int W, int Cout, int CIG)
{
    extern __shared__ float wsm[]; /* [Cout][CIG][KS*KS] */
    const int OH = H - KS + 1, OW = W - KS + 1, P = OH * OW, KK = KS * KS;
    const int b = (int)blockIdx.z, c0 = (int)blockIdx.y * CIG;
    for (int i = (int)threadIdx.x; i < Cout * CIG * KK; i += (int)blockDim.x) {
        int co = i / (CIG * KK), rem = i % (CIG * KK);
        wsm[i] = Wt[((size_t)co * Cin + c0) * KK + rem];
    }
    __syncthreads();
    const int idx = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (idx >= CIG * H * W) return;
    const int c = idx / (H * W), ih = (idx / W) % H, iw = idx % W;
    const float *g = dY + (size_t)b * Cout * P;
    float acc = 0.0f;
    for (int co = 0; co < Cout; ++co, g += P) {
        const float *w = wsm + (co * CIG + c) * KK;
#pragma unroll
        for (int r = 0; r < KS; ++r) {
            int oh = ih - r;
            if (oh < 0 || oh >= OH) continue;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                int ow = iw - s;
                if (ow >= 0 && ow < OW) acc = fmaf(w[r * KS + s], __ldg(g + oh * OW + ow), acc);
            }
        }
    }
    dX[(((size_t)b * Cin + c0 + c) * H + ih) * W + iw] = acc;
}

/* Partial dW (and db) of one (co, ci) pair over the images [split*bper, ...): each thread sums over its
   positions n = t, t+256, ... in order, then a fixed tree in shared memory. part [S][Cout*Cin][KK],
   partb [S][Cout] (written by the ci = 0 blocks). */
template <int KS>
__global__ void __launch_bounds__(256) k_direct_dw(const float *__restrict__ X, const float *__restrict__ dY,
                                                    float *__restrict__ part, float *__restrict__ partb, int Cin,
                                                    int H, int W, int Cout, int B, int bper)
{
    constexpr int KK = KS * KS;
    __shared__ float red[KK + 1][256];
    const int OH = H - KS + 1, OW = W - KS + 1, P = OH * OW, t = (int)threadIdx.x;
    const int pair = (int)blockIdx.x, co = pair / Cin, ci = pair % Cin, split = (int)blockIdx.y;
    const int b0 = split * bper, b1 = min(B, b0 + bper), n_total = max(0, b1 - b0) * P;
    float acc[KK], accb = 0.0f;
#pragma unroll
    for (int j = 0; j < KK; ++j) acc[j] = 0.0f;
    for (int n = t; n < n_total; n += 256) {
        int b = b0 + n / P, p = n % P, oh = p / OW, ow = p % OW;
        float g = __ldg(dY + ((size_t)b * Cout + co) * P + p);
        const float *x = X + (((size_t)b * Cin + ci) * H + oh) * W + ow;
        accb += g;
#pragma unroll
        for (int r = 0; r < KS; ++r)
#pragma unroll
            for (int s = 0; s < KS; ++s) acc[r * KS + s] = fmaf(g, __ldg(x + r * W + s), acc[r * KS + s]);
    }
#pragma unroll
    for (int j = 0; j < KK; ++j) red[j][t] = acc[j];
    red[KK][t] = accb;
    __syncthreads();
    for (int st = 128; st > 0; st >>= 1) {
        if (t < st)
            for (int j = 0; j <= KK; ++j) red[j][t] += red[j][t + st];
        __syncthreads();
    }
    if (t < KK) part[((size_t)split * Cout * Cin + pair) * KK + t] = red[t][0];
    if (t == KK && ci == 0) partb[(size_t)split * Cout + co] = red[KK][0];
}

/* dW[i] = sum over splits in order of part[s][i]; db[co] likewise from partb */
__global__ void k_direct_dw_sum(const float *__restrict__ part, const float *__restrict__ partb, float *__restrict__ dW,
                                float *__restrict__ db, int nw, int Cout, int S)
{
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < nw + Cout; i += (int)(gridDim.x * blockDim.x)) {
        float acc = 0.0f;
        if (i < nw) {
            for (int s = 0; s < S; ++s) acc += part[(size_t)s * nw + i];
            dW[i] = acc;
        } else {
            for (int s = 0; s < S; ++s) acc += partb[(size_t)s * Cout + i - nw];
            db[i - nw] = acc;
        }
    }
}

/* ==== the problem ================================================================================ */

struct shape {
    const char *id, *name;
    int Cin, H, Cout, KS;
};

static const shape SHAPES[] = {
    {"L1", "LeNet conv1 1->6 5x5 28x28", 1, 28, 6, 5},
    {"L2", "LeNet conv2 6->16 5x5 12x12", 6, 12, 16, 5},
    {"F1", "Fashion conv1 1->64 3x3 28x28", 1, 28, 64, 3},
    {"F2", "Fashion conv2 64->128 3x3 13x13", 64, 13, 128, 3},
};
#define NSHAPES 4
#define NPASS 3
static const char *PNAME[NPASS] = {"fwd", "dX", "dW+db"};
#define NVAR 5
#define NOURS 3 /* variants 0..NOURS-1 are ours, the rest cuDNN's */
static const char *VNAME[NVAR] = {"v1 im2col+gemm", "v2 direct", "v5 direct staged", "v3 cuDNN det", "v4 cuDNN any"};

struct conv {
    const shape *s;
    int Cin, H, W, Cout, KS, OH, OW, P, K, B;
    size_t nx, nw, ny;
    /* device: inputs */
    float *X, *Wt, *bias, *dY;
    /* device: outputs */
    float *Y, *dX, *dW, *db;
    /* device: work space */
    float *col, *ycol, *ws, *part, *partb;
    size_t col_floats, ycol_floats, ws_floats, part_floats;
    int v2_cg, v2_cig, v2_bper, v2_splits;
};

static double flops_of(const conv &c) { return 2.0 * c.B * c.Cout * (double)c.P * c.K; }
static double bytes_of(const conv &c, int pass)
{
    double x = 4.0 * (double)c.nx, w = 4.0 * (double)c.nw, b = 4.0 * c.Cout, y = 4.0 * (double)c.ny;
    return pass == 0 ? x + w + b + y : pass == 1 ? y + w + x : x + y + w + b;
}

/* ---- v1 and v2 passes --------------------------------------------------------------------------- */
static unsigned nblocks(size_t n) { size_t b = (n + 255) / 256; return (unsigned)(b > 65535u * 8u ? 65535u * 8u : b); }

static cudaError_t pass_v1(conv &c, int pass, cudaStream_t st)
{
    const int BP = c.B * c.P;
    if (pass == 0) {
        k_im2col<<<nblocks((size_t)c.K * BP), 256, 0, st>>>(c.X, c.col, c.Cin, c.H, c.W, c.KS, c.B);
        LAUNCHED();
        RET(gemm(0, 0, c.Cout, BP, c.K, c.Wt, c.K, c.col, BP, c.ycol, c.ws, c.ws_floats, st));
        k_permute_bias<<<nblocks(c.ny), 256, 0, st>>>(c.ycol, c.bias, c.Y, c.Cout, c.P, c.B);
        LAUNCHED();
    } else if (pass == 1) {
        k_permute_dy<<<nblocks(c.ny), 256, 0, st>>>(c.dY, c.ycol, c.Cout, c.P, c.B);
        LAUNCHED();
        RET(gemm(1, 0, c.K, BP, c.Cout, c.Wt, c.K, c.ycol, BP, c.col, c.ws, c.ws_floats, st));
        k_col2im<<<nblocks(c.nx), 256, 0, st>>>(c.col, c.dX, c.Cin, c.H, c.W, c.KS, c.B);
        LAUNCHED();
    } else {
        k_im2col<<<nblocks((size_t)c.K * BP), 256, 0, st>>>(c.X, c.col, c.Cin, c.H, c.W, c.KS, c.B);
        LAUNCHED();
        k_permute_dy<<<nblocks(c.ny), 256, 0, st>>>(c.dY, c.ycol, c.Cout, c.P, c.B);
        LAUNCHED();
        RET(gemm(0, 1, c.Cout, c.K, BP, c.ycol, BP, c.col, BP, c.dW, c.ws, c.ws_floats, st));
        k_rowsum<<<(unsigned)c.Cout, 256, 0, st>>>(c.ycol, c.db, BP);
        LAUNCHED();
    }
    return cudaSuccess;
}

static cudaError_t pass_v2(conv &c, int pass, cudaStream_t st)
{
    const int KK = c.KS * c.KS;
    if (pass == 0) {
        dim3 grid((unsigned)((c.v2_cg * c.P + 255) / 256), (unsigned)(c.Cout / c.v2_cg), (unsigned)c.B);
        size_t sm = (size_t)c.v2_cg * c.K * sizeof(float);
        if (c.KS == 5) k_direct_fwd<5><<<grid, 256, sm, st>>>(c.X, c.Wt, c.bias, c.Y, c.Cin, c.H, c.W, c.Cout, c.v2_cg);
        else k_direct_fwd<3><<<grid, 256, sm, st>>>(c.X, c.Wt, c.bias, c.Y, c.Cin, c.H, c.W, c.Cout, c.v2_cg);
        LAUNCHED();
    } else if (pass == 1) {
        dim3 grid((unsigned)((c.v2_cig * c.H * c.W + 255) / 256), (unsigned)(c.Cin / c.v2_cig), (unsigned)c.B);
        size_t sm = (size_t)c.Cout * c.v2_cig * KK * sizeof(float);
        if (c.KS == 5) k_direct_dx<5><<<grid, 256, sm, st>>>(c.dY, c.Wt, c.dX, c.Cin, c.H, c.W, c.Cout, c.v2_cig);
        else k_direct_dx<3><<<grid, 256, sm, st>>>(c.dY, c.Wt, c.dX, c.Cin, c.H, c.W, c.Cout, c.v2_cig);
        LAUNCHED();
    } else {
        dim3 grid((unsigned)(c.Cout * c.Cin), (unsigned)c.v2_splits);
        int nw = c.Cout * c.Cin * KK;
        if (c.KS == 5) k_direct_dw<5><<<grid, 256, 0, st>>>(c.X, c.dY, c.part, c.partb, c.Cin, c.H, c.W, c.Cout, c.B, c.v2_bper);
        else k_direct_dw<3><<<grid, 256, 0, st>>>(c.X, c.dY, c.part, c.partb, c.Cin, c.H, c.W, c.Cout, c.B, c.v2_bper);
        LAUNCHED();
        k_direct_dw_sum<<<(unsigned)((nw + c.Cout + 255) / 256), 256, 0, st>>>(c.part, c.partb, c.dW, c.db, nw, c.Cout,
                                                                                c.v2_splits);
        LAUNCHED();
    }
    return cudaSuccess;
}

/* ---- v5: v2 with each block's inputs staged in shared memory ----------------------------------------
   v2's chains of fmas each wait for their own load from L2 (latency-bound at batch 64: few threads per
   multiprocessor, each a long dependent chain). v5 first copies what the block reads (fwd: the image's
   input planes; dX: the image's output gradient; dW: the slice's input planes of ci and output gradient
   planes of co) into shared memory, all loads at once, then runs v2's sums in v2's order from there:
   the same sums in the same order. Falls back to v2 where weights and staged data pass 48 KB. */
template <int KS>
__global__ void __launch_bounds__(256) k_staged_fwd(const float *__restrict__ X, const float *__restrict__ Wt,
                                                     const float *__restrict__ bias, float *__restrict__ Y, int Cin,
                                                     int H, int W, int Cout, int CG)
{
    extern __shared__ float wsm[]; /* [CG][Cin*KS*KS], then the image [Cin][H][W] */
    const int OH = H - KS + 1, OW = W - KS + 1, P = OH * OW, K = Cin * KS * KS;
    const int b = (int)blockIdx.z, g0 = (int)blockIdx.y * CG;
    float *xs = wsm + CG * K;
    for (int i = (int)threadIdx.x; i < CG * K; i += (int)blockDim.x) wsm[i] = Wt[(size_t)g0 * K + i];
    for (int i = (int)threadIdx.x; i < Cin * H * W; i += (int)blockDim.x) xs[i] = __ldg(X + (size_t)b * Cin * H * W + i);
    __syncthreads();
    const int idx = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (idx >= CG * P) return;
    const int c = idx / P, p = idx % P, oh = p / OW, ow = p % OW;
    const float *xb = xs + oh * W + ow, *w = wsm + c * K;
    float acc = 0.0f;
    for (int ci = 0; ci < Cin; ++ci) {
        const float *xc = xb + ci * H * W, *wc = w + ci * KS * KS;
#pragma unroll
        for (int r = 0; r < KS; ++r)
#pragma unroll
            for (int s = 0; s < KS; ++s) acc = fmaf(wc[r * KS + s], xc[r * W + s], acc);
    }
    Y[((size_t)b * Cout + g0 + c) * P + p] = acc + __ldg(bias + g0 + c);
}

template <int KS>
__global__ void __launch_bounds__(256) k_staged_dx(const float *__restrict__ dY, const float *__restrict__ Wt,
                                                    float *__restrict__ dX, int Cin, int H, int W, int Cout, int CIG)
{
    extern __shared__ float wsm[]; /* [Cout][CIG][KS*KS], then the image's output gradient [Cout][P] */
    const int OH = H - KS + 1, OW = W - KS + 1, P = OH * OW, KK = KS * KS;
    const int b = (int)blockIdx.z, c0 = (int)blockIdx.y * CIG;
    float *gs = wsm + Cout * CIG * KK;
    for (int i = (int)threadIdx.x; i < Cout * CIG * KK; i += (int)blockDim.x) {
        int co = i / (CIG * KK), rem = i % (CIG * KK);
        wsm[i] = Wt[((size_t)co * Cin + c0) * KK + rem];
    }
    for (int i = (int)threadIdx.x; i < Cout * P; i += (int)blockDim.x) gs[i] = __ldg(dY + (size_t)b * Cout * P + i);
    __syncthreads();
    const int idx = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (idx >= CIG * H * W) return;
    const int c = idx / (H * W), ih = (idx / W) % H, iw = idx % W;
    const float *g = gs;
    float acc = 0.0f;
    for (int co = 0; co < Cout; ++co, g += P) {
        const float *w = wsm + (co * CIG + c) * KK;
#pragma unroll
        for (int r = 0; r < KS; ++r) {
            int oh = ih - r;
            if (oh < 0 || oh >= OH) continue;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                int ow = iw - s;
                if (ow >= 0 && ow < OW) acc = fmaf(w[r * KS + s], g[oh * OW + ow], acc);
            }
        }
    }
    dX[(((size_t)b * Cin + c0 + c) * H + ih) * W + iw] = acc;
}

template <int KS>
__global__ void __launch_bounds__(256) k_staged_dw(const float *__restrict__ X, const float *__restrict__ dY,
                                                    float *__restrict__ part, float *__restrict__ partb, int Cin,
                                                    int H, int W, int Cout, int B, int bper)
{
    constexpr int KK = KS * KS;
    __shared__ float red[KK + 1][256];
    extern __shared__ float sl[]; /* [nb][H*W] inputs of ci, then [nb][P] output gradients of co */
    const int OH = H - KS + 1, OW = W - KS + 1, P = OH * OW, HW = H * W, t = (int)threadIdx.x;
    const int pair = (int)blockIdx.x, co = pair / Cin, ci = pair % Cin, split = (int)blockIdx.y;
    const int b0 = split * bper, b1 = min(B, b0 + bper), nb = max(0, b1 - b0), n_total = nb * P;
    float acc[KK], accb = 0.0f;
#pragma unroll
    for (int j = 0; j < KK; ++j) acc[j] = 0.0f;
    for (int j = t; j < nb * HW; j += 256) sl[j] = __ldg(X + ((size_t)(b0 + j / HW) * Cin + ci) * HW + j % HW);
    for (int j = t; j < n_total; j += 256) sl[nb * HW + j] = __ldg(dY + ((size_t)(b0 + j / P) * Cout + co) * P + j % P);
    __syncthreads();
    for (int n = t; n < n_total; n += 256) {
        int bi = n / P, p = n % P, oh = p / OW, ow = p % OW;
        float g = sl[nb * HW + n];
        const float *x = sl + bi * HW + oh * W + ow;
        accb += g;
#pragma unroll
        for (int r = 0; r < KS; ++r)
#pragma unroll
            for (int s = 0; s < KS; ++s) acc[r * KS + s] = fmaf(g, x[r * W + s], acc[r * KS + s]);
    }
#pragma unroll
    for (int j = 0; j < KK; ++j) red[j][t] = acc[j];
    red[KK][t] = accb;
    __syncthreads();
    for (int st = 128; st > 0; st >>= 1) {
        if (t < st)
            for (int j = 0; j <= KK; ++j) red[j][t] += red[j][t + st];
        __syncthreads();
    }
    if (t < KK) part[((size_t)split * Cout * Cin + pair) * KK + t] = red[t][0];
    if (t == KK && ci == 0) partb[(size_t)split * Cout + co] = red[KK][0];
}

static cudaError_t pass_v5(conv &c, int pass, cudaStream_t st)
{
    const int KK = c.KS * c.KS;
    const size_t limit = 48 * 1024;
    if (pass == 0) {
        size_t sm = ((size_t)c.v2_cg * c.K + (size_t)c.Cin * c.H * c.W) * sizeof(float);
        dim3 grid((unsigned)((c.v2_cg * c.P + 255) / 256), (unsigned)(c.Cout / c.v2_cg), (unsigned)c.B);
        if (sm > limit) return pass_v2(c, pass, st);
        if (c.KS == 5) k_staged_fwd<5><<<grid, 256, sm, st>>>(c.X, c.Wt, c.bias, c.Y, c.Cin, c.H, c.W, c.Cout, c.v2_cg);
        else k_staged_fwd<3><<<grid, 256, sm, st>>>(c.X, c.Wt, c.bias, c.Y, c.Cin, c.H, c.W, c.Cout, c.v2_cg);
        LAUNCHED();
    } else if (pass == 1) {
        size_t sm = ((size_t)c.Cout * c.v2_cig * KK + (size_t)c.Cout * c.P) * sizeof(float);
        dim3 grid((unsigned)((c.v2_cig * c.H * c.W + 255) / 256), (unsigned)(c.Cin / c.v2_cig), (unsigned)c.B);
        if (sm > limit) return pass_v2(c, pass, st);
        if (c.KS == 5) k_staged_dx<5><<<grid, 256, sm, st>>>(c.dY, c.Wt, c.dX, c.Cin, c.H, c.W, c.Cout, c.v2_cig);
        else k_staged_dx<3><<<grid, 256, sm, st>>>(c.dY, c.Wt, c.dX, c.Cin, c.H, c.W, c.Cout, c.v2_cig);
        LAUNCHED();
    } else {
        size_t sm = (size_t)c.v2_bper * (c.H * c.W + c.P) * sizeof(float), red = (size_t)(KK + 1) * 256 * sizeof(float);
        dim3 grid((unsigned)(c.Cout * c.Cin), (unsigned)c.v2_splits);
        int nw = c.Cout * c.Cin * KK;
        if (sm + red > limit) return pass_v2(c, pass, st);
        if (c.KS == 5) k_staged_dw<5><<<grid, 256, sm, st>>>(c.X, c.dY, c.part, c.partb, c.Cin, c.H, c.W, c.Cout, c.B, c.v2_bper);
        else k_staged_dw<3><<<grid, 256, sm, st>>>(c.X, c.dY, c.part, c.partb, c.Cin, c.H, c.W, c.Cout, c.B, c.v2_bper);
        LAUNCHED();
        k_direct_dw_sum<<<(unsigned)((nw + c.Cout + 255) / 256), 256, 0, st>>>(c.part, c.partb, c.dW, c.db, nw, c.Cout,
                                                                                c.v2_splits);
        LAUNCHED();
    }
    return cudaSuccess;
}

/* ---- v3, v4: cuDNN ------------------------------------------------------------------------------ */
#ifdef WITH_CUDNN
static const char *FWD_ALGO[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
                                 "WINOGRAD", "WINOGRAD_NONFUSED"};
static const char *BWD_DATA_ALGO[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
static const char *BWD_FILTER_ALGO[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED",
                                        "FFT_TILING"};
#define MAXALGO 8

struct dnn_cand {
    int algo;
    size_t memory;
    int deterministic;
    float find_ms;
};

struct dnn_state {
    cudnnHandle_t h;
    cudnnTensorDescriptor_t xd, yd, bd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    dnn_cand cand[NPASS][MAXALGO];
    int ncand[NPASS];
    int chosen[2][NPASS]; /* [v3 or v4][pass]: index into cand, -1 none */
    void *wsp;
    size_t ws_size;
    int cur_algo; /* the algorithm the next pass runs */
};
static dnn_state g_dnn;

#define CKDNN(x)                                                                                     \
    do {                                                                                             \
        cudnnStatus_t s_ = (x);                                                                      \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                            \
            fprintf(stderr, "cuda_conv: FAILED: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,           \
                    cudnnGetErrorString(s_));                                                        \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static const char *dnn_algo_name(int pass, int algo)
{
    if (pass == 0) return algo >= 0 && algo < 8 ? FWD_ALGO[algo] : "?";
    if (pass == 1) return algo >= 0 && algo < 6 ? BWD_DATA_ALGO[algo] : "?";
    return algo >= 0 && algo < 7 ? BWD_FILTER_ALGO[algo] : "?";
}

static int dnn_fma_math(cudnnMathType_t m) { return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH; }

/* describe the problem to cuDNN and list the algorithms cudnnFind* times, fastest first */
static void dnn_setup(conv &c, cudaStream_t st)
{
    dnn_state &d = g_dnn;
    int n = 0, i;
    CKDNN(cudnnSetStream(d.h, st));
    CKDNN(cudnnSetTensor4dDescriptor(d.xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, c.B, c.Cin, c.H, c.W));
    CKDNN(cudnnSetTensor4dDescriptor(d.yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, c.B, c.Cout, c.OH, c.OW));
    CKDNN(cudnnSetTensor4dDescriptor(d.bd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, c.Cout, 1, 1));
    CKDNN(cudnnSetFilter4dDescriptor(d.wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, c.Cout, c.Cin, c.KS, c.KS));
    CKDNN(cudnnSetConvolution2dDescriptor(d.cd, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CKDNN(cudnnSetConvolutionMathType(d.cd, CUDNN_FMA_MATH)); /* FP32 FMA: no TF32 */
    {
        cudnnConvolutionFwdAlgoPerf_t pf[MAXALGO];
        CKDNN(cudnnFindConvolutionForwardAlgorithm(d.h, d.xd, d.wd, d.cd, d.yd, MAXALGO, &n, pf));
        d.ncand[0] = 0;
        for (i = 0; i < n; ++i)
            if (pf[i].status == CUDNN_STATUS_SUCCESS && dnn_fma_math(pf[i].mathType)) {
                dnn_cand &k = d.cand[0][d.ncand[0]++];
                k.algo = (int)pf[i].algo; k.memory = pf[i].memory; k.find_ms = pf[i].time;
                k.deterministic = pf[i].determinism == CUDNN_DETERMINISTIC;
            }
    }
    {
        cudnnConvolutionBwdDataAlgoPerf_t pd[MAXALGO];
        CKDNN(cudnnFindConvolutionBackwardDataAlgorithm(d.h, d.wd, d.yd, d.cd, d.xd, MAXALGO, &n, pd));
        d.ncand[1] = 0;
        for (i = 0; i < n; ++i)
            if (pd[i].status == CUDNN_STATUS_SUCCESS && dnn_fma_math(pd[i].mathType)) {
                dnn_cand &k = d.cand[1][d.ncand[1]++];
                k.algo = (int)pd[i].algo; k.memory = pd[i].memory; k.find_ms = pd[i].time;
                k.deterministic = pd[i].determinism == CUDNN_DETERMINISTIC;
            }
    }
    {
        cudnnConvolutionBwdFilterAlgoPerf_t pw[MAXALGO];
        CKDNN(cudnnFindConvolutionBackwardFilterAlgorithm(d.h, d.xd, d.yd, d.cd, d.wd, MAXALGO, &n, pw));
        d.ncand[2] = 0;
        for (i = 0; i < n; ++i)
            if (pw[i].status == CUDNN_STATUS_SUCCESS && dnn_fma_math(pw[i].mathType)) {
                dnn_cand &k = d.cand[2][d.ncand[2]++];
                k.algo = (int)pw[i].algo; k.memory = pw[i].memory; k.find_ms = pw[i].time;
                k.deterministic = pw[i].determinism == CUDNN_DETERMINISTIC;
            }
    }
    /* one work space for all candidates of this shape */
    size_t need = 0;
    for (int p = 0; p < NPASS; ++p)
        for (i = 0; i < d.ncand[p]; ++i)
            if (d.cand[p][i].memory > need && d.cand[p][i].memory <= ((size_t)1 << 30)) need = d.cand[p][i].memory;
    if (need > d.ws_size) {
        if (d.wsp) CK(cudaFree(d.wsp));
        d.wsp = NULL;
        CK(cudaMalloc(&d.wsp, need));
        d.ws_size = need;
    }
    CK(cudaStreamSynchronize(st));
}

static cudaError_t pass_dnn(conv &c, int pass, cudaStream_t st)
{
    dnn_state &d = g_dnn;
    const float one = 1.0f, zero = 0.0f;
    cudnnStatus_t s;
    (void)st; /* the handle is bound to st in dnn_setup */
    if (pass == 0) {
        s = cudnnConvolutionForward(d.h, &one, d.xd, c.X, d.wd, c.Wt, d.cd, (cudnnConvolutionFwdAlgo_t)d.cur_algo, d.wsp,
                                    d.ws_size, &zero, d.yd, c.Y);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnAddTensor(d.h, &one, d.bd, c.bias, &one, d.yd, c.Y);
    } else if (pass == 1) {
        s = cudnnConvolutionBackwardData(d.h, &one, d.wd, c.Wt, d.yd, c.dY, d.cd,
                                         (cudnnConvolutionBwdDataAlgo_t)d.cur_algo, d.wsp, d.ws_size, &zero, d.xd, c.dX);
    } else {
        s = cudnnConvolutionBackwardFilter(d.h, &one, d.xd, c.X, d.yd, c.dY, d.cd,
                                           (cudnnConvolutionBwdFilterAlgo_t)d.cur_algo, d.wsp, d.ws_size, &zero, d.wd,
                                           c.dW);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnConvolutionBackwardBias(d.h, &one, d.yd, c.dY, &zero, d.bd, c.db);
    }
    if (s != CUDNN_STATUS_SUCCESS) {
        fprintf(stderr, "cuda_conv: cuDNN %s %s: %s\n", PNAME[pass], dnn_algo_name(pass, d.cur_algo),
                cudnnGetErrorString(s));
        return cudaErrorUnknown;
    }
    return cudaGetLastError();
}
#endif

static cudaError_t run_pass(int v, conv &c, int pass, cudaStream_t st)
{
    if (v == 0) return pass_v1(c, pass, st);
    if (v == 1) return pass_v2(c, pass, st);
    if (v == 2) return pass_v5(c, pass, st);
#ifdef WITH_CUDNN
    return pass_dnn(c, pass, st);
#else
    return cudaErrorNotSupported;
#endif
}

/* ---- host reference in double ------------------------------------------------------------------- */
struct host_ref {
    double *Y, *dX, *dW, *db;
};

static void reference(const conv &c, const float *X, const float *Wt, const float *bias, const float *dY, host_ref &r)
{
    const int Cin = c.Cin, H = c.H, W = c.W, Cout = c.Cout, KS = c.KS, OH = c.OH, OW = c.OW, P = c.P;
    r.Y = (double *)calloc(c.ny, sizeof(double));
    r.dX = (double *)calloc(c.nx, sizeof(double));
    r.dW = (double *)calloc(c.nw, sizeof(double));
    r.db = (double *)calloc((size_t)Cout, sizeof(double));
    if (!r.Y || !r.dX || !r.dW || !r.db) { fprintf(stderr, "cuda_conv: FAILED: out of host memory\n"); exit(1); }
    for (int b = 0; b < c.B; ++b)
        for (int co = 0; co < Cout; ++co) {
            double *y = r.Y + ((size_t)b * Cout + co) * P;
            const float *g = dY + ((size_t)b * Cout + co) * P;
            for (int p = 0; p < P; ++p) { y[p] = bias[co]; r.db[co] += g[p]; }
            for (int ci = 0; ci < Cin; ++ci) {
                const float *x = X + ((size_t)b * Cin + ci) * H * W;
                double *dx = r.dX + ((size_t)b * Cin + ci) * H * W;
                for (int i = 0; i < KS; ++i)
                    for (int j = 0; j < KS; ++j) {
                        const size_t wi = (((size_t)co * Cin + ci) * KS + i) * KS + j;
                        const double w = Wt[wi];
                        double dw = 0.0;
                        for (int oh = 0; oh < OH; ++oh) {
                            const float *xr = x + (size_t)(oh + i) * W + j;
                            double *dxr = dx + (size_t)(oh + i) * W + j;
                            double *yr = y + (size_t)oh * OW;
                            const float *gr = g + (size_t)oh * OW;
                            for (int ow = 0; ow < OW; ++ow) {
                                yr[ow] += w * xr[ow];
                                dxr[ow] += w * gr[ow];
                                dw += (double)gr[ow] * xr[ow];
                            }
                        }
                        r.dW[wi] += dw;
                    }
            }
        }
}

static double rel_err(const float *got, const double *ref, size_t n)
{
    double e = 0.0, rn = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double d = (double)got[i] - ref[i];
        if (got[i] != got[i]) return INFINITY; /* NaN: unwritten or broken */
        e += d * d;
        rn += ref[i] * ref[i];
    }
    return rn > 0.0 ? sqrt(e / rn) : sqrt(e);
}

/* ---- running, checking and timing one (variant, shape, pass) ----------------------------------- */
struct result {
    int ran;            /* 1 when measured */
    double err;         /* worst relative error over the pass's outputs, before and after timing */
    int deterministic;  /* two runs gave the same bits */
    double us_stream;   /* median, events around the pass's launches */
    double us_graph;    /* per pass inside a replayed graph; < 0: could not capture */
};

static void poison(conv &c, cudaStream_t st)
{
    CK(cudaMemsetAsync(c.Y, 0xff, c.ny * sizeof(float), st));
    CK(cudaMemsetAsync(c.dX, 0xff, c.nx * sizeof(float), st));
    CK(cudaMemsetAsync(c.dW, 0xff, c.nw * sizeof(float), st));
    CK(cudaMemsetAsync(c.db, 0xff, (size_t)c.Cout * sizeof(float), st));
    CK(cudaMemsetAsync(c.col, 0xff, c.col_floats * sizeof(float), st));
    CK(cudaMemsetAsync(c.ycol, 0xff, c.ycol_floats * sizeof(float), st));
    CK(cudaMemsetAsync(c.ws, 0xff, c.ws_floats * sizeof(float), st));
    CK(cudaMemsetAsync(c.part, 0xff, c.part_floats * sizeof(float), st));
    CK(cudaMemsetAsync(c.partb, 0xff, (size_t)c.v2_splits * c.Cout * sizeof(float), st));
}

/* copy the pass's outputs to h (sized nx + ny + nw + Cout) and return the worst relative error */
static double check_pass(conv &c, int pass, const host_ref &r, float *h, size_t *nout)
{
    double e;
    if (pass == 0) {
        CK(cudaMemcpy(h, c.Y, c.ny * sizeof(float), cudaMemcpyDeviceToHost));
        *nout = c.ny;
        return rel_err(h, r.Y, c.ny);
    }
    if (pass == 1) {
        CK(cudaMemcpy(h, c.dX, c.nx * sizeof(float), cudaMemcpyDeviceToHost));
        *nout = c.nx;
        return rel_err(h, r.dX, c.nx);
    }
    CK(cudaMemcpy(h, c.dW, c.nw * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h + c.nw, c.db, (size_t)c.Cout * sizeof(float), cudaMemcpyDeviceToHost));
    *nout = c.nw + (size_t)c.Cout;
    e = rel_err(h, r.dW, c.nw);
    double eb = rel_err(h + c.nw, r.db, (size_t)c.Cout);
    return eb > e ? eb : e;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

static float median_f(float *t, int n)
{
    qsort(t, (size_t)n, sizeof(float), cmp_float);
    return n % 2 ? t[n / 2] : 0.5f * (t[n / 2 - 1] + t[n / 2]);
}

/* validate (error, NaN poison, determinism); returns the error, sets *det */
static double validate(int v, conv &c, int pass, const host_ref &r, float *h1, float *h2, cudaStream_t st, int *det)
{
    size_t n1 = 0, n2 = 0;
    double e;
    poison(c, st);
    if (run_pass(v, c, pass, st) != cudaSuccess) { cudaGetLastError(); return INFINITY; }
    CK(cudaStreamSynchronize(st));
    e = check_pass(c, pass, r, h1, &n1);
    poison(c, st);
    if (run_pass(v, c, pass, st) != cudaSuccess) { cudaGetLastError(); return INFINITY; }
    CK(cudaStreamSynchronize(st));
    double e2 = check_pass(c, pass, r, h2, &n2);
    *det = n1 == n2 && memcmp(h1, h2, n1 * sizeof(float)) == 0;
    return e2 > e ? e2 : e;
}

static void measure(int v, conv &c, int pass, const host_ref &r, float *h1, float *h2, cudaStream_t st, int reps,
                    result &res)
{
    cudaEvent_t e0, e1;
    float *t = (float *)malloc((size_t)(reps > GRAPH_REPLAYS ? reps : GRAPH_REPLAYS) * sizeof(float));
    int det = 0, i;
    if (!t) { fprintf(stderr, "cuda_conv: FAILED: out of host memory\n"); exit(1); }
    res.ran = 1;
    res.err = validate(v, c, pass, r, h1, h2, st, &det);
    res.deterministic = det;
    res.us_stream = res.us_graph = -1.0;
    if (!(res.err <= TOL)) { free(t); return; } /* wrong: not timed */
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (i = 0; i < 5; ++i) CK(run_pass(v, c, pass, st));
    for (i = 0; i < reps; ++i) {
        CK(cudaEventRecord(e0, st));
        CK(run_pass(v, c, pass, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    res.us_stream = 1e3 * median_f(t, reps);
    /* the pass captured GRAPH_COPIES times in one graph */
    {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        cudaError_t ce = cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed), ce2;
        for (i = 0; ce == cudaSuccess && i < GRAPH_COPIES; ++i) ce = run_pass(v, c, pass, st);
        ce2 = cudaStreamEndCapture(st, &g);
        if (ce == cudaSuccess) ce = ce2;
        if (ce == cudaSuccess) ce = cudaGraphInstantiate(&ge, g, 0);
        if (ce == cudaSuccess) {
            for (i = 0; i < 2; ++i) CK(cudaGraphLaunch(ge, st));
            for (i = 0; i < GRAPH_REPLAYS; ++i) {
                CK(cudaEventRecord(e0, st));
                CK(cudaGraphLaunch(ge, st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&t[i], e0, e1));
            }
            res.us_graph = 1e3 * median_f(t, GRAPH_REPLAYS) / GRAPH_COPIES;
        } else {
            fprintf(stderr, "cuda_conv: note: %s %s %s could not be captured in a graph: %s\n", VNAME[v], c.s->id,
                    PNAME[pass], cudaGetErrorString(ce));
            cudaGetLastError();
        }
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
    }
    CK(cudaStreamSynchronize(st));
    /* validate again after timing */
    {
        int det2 = 0;
        double e = validate(v, c, pass, r, h1, h2, st, &det2);
        if (e > res.err || !(e == e)) res.err = e;
        res.deterministic = res.deterministic && det2;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    free(t);
}

static int largest_divisor_fitting(int n, size_t floats_per_unit, size_t max_floats)
{
    int best = 1;
    for (int d = 1; d <= n; ++d)
        if (n % d == 0 && (size_t)d * floats_per_unit <= max_floats) best = d;
    return best;
}

int main(int argc, char **argv)
{
    int ndev = 0, reps = 30, si, v, p, i, bad = 0;
    const char *only = NULL;
    unsigned long long seed = 1;
    cudaDeviceProp prop;
    cudaStream_t st;
    static result R[NSHAPES][NVAR][NPASS];
    static char algo_note[NSHAPES][2][NPASS][40];
    int have_dnn = 0, dnn_bad = 0;

    setvbuf(stdout, NULL, _IOLBF, 0); /* lines in order with stderr's when both go to one file */
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: cuda_conv [--reps N (>= 20)] [--shape L1|L2|F1|F2] [--seed S]\n");
            return 2;
        }
    }
    if (reps < 20) reps = 20;
    cudaError_t de = cudaGetDeviceCount(&ndev);
    if (de != cudaSuccess || ndev == 0) {
        fprintf(stderr, "cuda_conv: FAILED: no CUDA GPU (%s)\n", de != cudaSuccess ? cudaGetErrorString(de) : "0 devices");
        return 1;
    }
    CK(cudaGetDeviceProperties(&prop, 0));
    g_nsm = prop.multiProcessorCount;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
#ifdef WITH_CUDNN
    have_dnn = 1;
    CKDNN(cudnnCreate(&g_dnn.h));
    CKDNN(cudnnCreateTensorDescriptor(&g_dnn.xd));
    CKDNN(cudnnCreateTensorDescriptor(&g_dnn.yd));
    CKDNN(cudnnCreateTensorDescriptor(&g_dnn.bd));
    CKDNN(cudnnCreateFilterDescriptor(&g_dnn.wd));
    CKDNN(cudnnCreateConvolutionDescriptor(&g_dnn.cd));
    printf("cuda_conv: cuDNN %zu (headers %d.%d.%d)\n", cudnnGetVersion(), CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
#endif
    printf("cuda_conv: %s (sm_%d%d, %d SMs, %.0f MB L2), FP32, batch %d; stream: median of %d passes after 5 "
           "warm-ups; graph: %d passes per graph, median of %d replays\n",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, BATCH, reps,
           GRAPH_COPIES, GRAPH_REPLAYS);
    memset(R, 0, sizeof R);
    memset(algo_note, 0, sizeof algo_note);

    for (si = 0; si < NSHAPES; ++si) {
        const shape &s = SHAPES[si];
        conv c;
        host_ref ref;
        if (only && strcmp(only, s.id)) continue;
        memset(&c, 0, sizeof c);
        c.s = &s;
        c.B = BATCH; c.Cin = s.Cin; c.H = c.W = s.H; c.Cout = s.Cout; c.KS = s.KS;
        c.OH = c.H - c.KS + 1; c.OW = c.W - c.KS + 1; c.P = c.OH * c.OW; c.K = c.Cin * c.KS * c.KS;
        c.nx = (size_t)c.B * c.Cin * c.H * c.W; c.nw = (size_t)c.Cout * c.K; c.ny = (size_t)c.B * c.Cout * c.P;
        /* v2 groups: the largest divisor whose weights fit in 48 KB of shared memory */
        c.v2_cg = largest_divisor_fitting(c.Cout, (size_t)c.K, 12288);
        c.v2_cig = largest_divisor_fitting(c.Cin, (size_t)c.Cout * c.KS * c.KS, 12288);
        {   /* dW: (co, ci) pairs x batch slices, at least two blocks per multiprocessor */
            int pairs = c.Cout * c.Cin, want = (2 * g_nsm + pairs - 1) / pairs;
            if (want > c.B) want = c.B;
            if (want < 1) want = 1;
            c.v2_bper = (c.B + want - 1) / want;
            c.v2_splits = (c.B + c.v2_bper - 1) / c.v2_bper;
        }
        c.col_floats = (size_t)c.K * c.B * c.P;
        c.ycol_floats = c.ny;
        {
            size_t BP = (size_t)c.B * c.P, need = 1;
            gemm_plan g0 = plan_gemm(c.Cout, (int)BP, c.K), g1 = plan_gemm(c.K, (int)BP, c.Cout),
                      g2 = plan_gemm(c.Cout, c.K, (int)BP);
            if (g0.splits > 1 && (size_t)g0.splits * c.Cout * BP > need) need = (size_t)g0.splits * c.Cout * BP;
            if (g1.splits > 1 && (size_t)g1.splits * c.K * BP > need) need = (size_t)g1.splits * c.K * BP;
            if (g2.splits > 1 && (size_t)g2.splits * c.Cout * c.K > need) need = (size_t)g2.splits * c.Cout * c.K;
            c.ws_floats = need;
            printf("\n== %s: %s, B=%d: K=%d P=%d, %.2f MFLOP per pass; floor %.2f us (%.2f us arithmetic, %.2f us "
                   "bytes)\n", s.id, s.name, c.B, c.K, c.P, flops_of(c) / 1e6,
                   fmax(flops_of(c) / PEAK_FLOPS, bytes_of(c, 0) / PEAK_BYTES) * 1e6, flops_of(c) / PEAK_FLOPS * 1e6,
                   bytes_of(c, 0) / PEAK_BYTES * 1e6);
            printf("   v1 gemm fwd %dx%dx%d %s x%d splits, dX %dx%dx%d %s x%d, dW %dx%dx%d %s x%d; v2 fwd %d "
                   "channels/block, dX %d, dW %d batch slices\n",
                   c.Cout, (int)BP, c.K, g0.big ? "64x64" : "16x16", g0.splits, c.K, (int)BP, c.Cout,
                   g1.big ? "64x64" : "16x16", g1.splits, c.Cout, c.K, (int)BP, g2.big ? "64x64" : "16x16", g2.splits,
                   c.v2_cg, c.v2_cig, c.v2_splits);
        }
        c.part_floats = (size_t)c.v2_splits * c.nw;
        CK(cudaMalloc((void **)&c.X, c.nx * sizeof(float)));
        CK(cudaMalloc((void **)&c.Wt, c.nw * sizeof(float)));
        CK(cudaMalloc((void **)&c.bias, (size_t)c.Cout * sizeof(float)));
        CK(cudaMalloc((void **)&c.dY, c.ny * sizeof(float)));
        CK(cudaMalloc((void **)&c.Y, c.ny * sizeof(float)));
        CK(cudaMalloc((void **)&c.dX, c.nx * sizeof(float)));
        CK(cudaMalloc((void **)&c.dW, c.nw * sizeof(float)));
        CK(cudaMalloc((void **)&c.db, (size_t)c.Cout * sizeof(float)));
        CK(cudaMalloc((void **)&c.col, c.col_floats * sizeof(float)));
        CK(cudaMalloc((void **)&c.ycol, c.ycol_floats * sizeof(float)));
        CK(cudaMalloc((void **)&c.ws, c.ws_floats * sizeof(float)));
        CK(cudaMalloc((void **)&c.part, c.part_floats * sizeof(float)));
        CK(cudaMalloc((void **)&c.partb, (size_t)c.v2_splits * c.Cout * sizeof(float)));

        /* random inputs in [-1, 1), fresh for each shape */
        float *hX = (float *)malloc(c.nx * sizeof(float)), *hW = (float *)malloc(c.nw * sizeof(float));
        float *hb = (float *)malloc((size_t)c.Cout * sizeof(float)), *hdY = (float *)malloc(c.ny * sizeof(float));
        size_t hmax = c.nx + c.ny + c.nw + (size_t)c.Cout;
        float *h1 = (float *)malloc(hmax * sizeof(float)), *h2 = (float *)malloc(hmax * sizeof(float));
        unsigned long long rs = 0x9E3779B97F4A7C15ull * (seed + 1) + (unsigned long long)si * 0xD1B54A32D192ED03ull;
        if (!hX || !hW || !hb || !hdY || !h1 || !h2) { fprintf(stderr, "cuda_conv: FAILED: out of host memory\n"); return 1; }
#define RND() (rs = rs * 6364136223846793005ull + 1442695040888963407ull, (float)((double)(rs >> 40) / 8388608.0 - 1.0))
        for (size_t j = 0; j < c.nx; ++j) hX[j] = RND();
        for (size_t j = 0; j < c.nw; ++j) hW[j] = RND();
        for (int j = 0; j < c.Cout; ++j) hb[j] = RND();
        for (size_t j = 0; j < c.ny; ++j) hdY[j] = RND();
#undef RND
        CK(cudaMemcpy(c.X, hX, c.nx * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(c.Wt, hW, c.nw * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(c.bias, hb, (size_t)c.Cout * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(c.dY, hdY, c.ny * sizeof(float), cudaMemcpyHostToDevice));
        reference(c, hX, hW, hb, hdY, ref);

        for (v = 0; v < NVAR; ++v) {
            if (v >= NOURS && !have_dnn) continue;
#ifdef WITH_CUDNN
            if (v == NOURS) dnn_setup(c, st);
#endif
            for (p = 0; p < NPASS; ++p) {
                result &res = R[si][v][p];
                if (v < NOURS) {
                    measure(v, c, p, ref, h1, h2, st, reps, res);
                } else {
#ifdef WITH_CUDNN
                    /* candidates in cudnnFind's order (fastest first): the first that passes the check
                       (and, for v3, that cuDNN calls deterministic and that is deterministic here) */
                    dnn_state &d = g_dnn;
                    int vi = v - NOURS, k;
                    d.chosen[vi][p] = -1;
                    res.ran = 0;
                    for (k = 0; k < d.ncand[p]; ++k) {
                        dnn_cand &cd = d.cand[p][k];
                        if (vi == 0 && !cd.deterministic) continue;
                        if (cd.memory > d.ws_size) continue;
                        d.cur_algo = cd.algo;
                        result tr;
                        memset(&tr, 0, sizeof tr);
                        measure(v, c, p, ref, h1, h2, st, reps, tr);
                        printf("   %s %s %s: %s (%s, %zu B work space): rel err %.2e%s%s\n", VNAME[v], s.id, PNAME[p],
                               dnn_algo_name(p, cd.algo), cd.deterministic ? "deterministic" : "non-deterministic",
                               cd.memory, tr.err, tr.err <= TOL ? "" : " > 1e-5: rejected",
                               tr.err <= TOL && !tr.deterministic ? ", two runs differed" : "");
                        if (tr.err <= TOL) {
                            res = tr;
                            d.chosen[vi][p] = k;
                            snprintf(algo_note[si][vi][p], sizeof algo_note[si][vi][p], "%s",
                                     dnn_algo_name(p, cd.algo));
                            break;
                        }
                    }
                    if (d.chosen[vi][p] < 0) {
                        snprintf(algo_note[si][vi][p], sizeof algo_note[si][vi][p], "none passed");
                        res.ran = 1;
                        res.err = INFINITY;
                        dnn_bad = 1;
                    }
#endif
                }
                if (res.ran) {
                    int wrong = !(res.err <= TOL), nondet = !res.deterministic && v != 3;
                    if ((wrong || nondet) && v < NOURS) bad = 1; /* cuDNN's own results fail nothing: see dnn_bad */
                    if (nondet && v == NOURS) dnn_bad = 1;
                    if (res.us_stream > 0)
                        printf("cuda_conv: %-2s %-5s %-16s rel err %.2e %s stream %9.2f us %8.1f GFLOP/s | graph "
                               "%9.2f us %8.1f GFLOP/s%s\n",
                               s.id, PNAME[p], VNAME[v], res.err, res.deterministic ? "det   " : "NONDET",
                               res.us_stream, flops_of(c) / (res.us_stream * 1e3),
                               res.us_graph, res.us_graph > 0 ? flops_of(c) / (res.us_graph * 1e3) : 0.0,
                               wrong ? "  WRONG" : nondet ? "  NOT DETERMINISTIC" : "");
                    else
                        printf("cuda_conv: %-2s %-5s %-16s rel err %.2e  FAILED (not timed)\n", s.id, PNAME[p],
                               VNAME[v], res.err);
                    if (wrong)
                        fprintf(stderr, "cuda_conv: FAILED: %s %s %s: relative error %.3e (limit 1e-5)\n", VNAME[v],
                                s.id, PNAME[p], res.err);
                    if (nondet)
                        fprintf(stderr, "cuda_conv: FAILED: %s %s %s: two runs differ\n", VNAME[v], s.id, PNAME[p]);
                }
            }
        }
        free(hX); free(hW); free(hb); free(hdY); free(h1); free(h2);
        free(ref.Y); free(ref.dX); free(ref.dW); free(ref.db);
        CK(cudaFree(c.X)); CK(cudaFree(c.Wt)); CK(cudaFree(c.bias)); CK(cudaFree(c.dY));
        CK(cudaFree(c.Y)); CK(cudaFree(c.dX)); CK(cudaFree(c.dW)); CK(cudaFree(c.db));
        CK(cudaFree(c.col)); CK(cudaFree(c.ycol)); CK(cudaFree(c.ws)); CK(cudaFree(c.part)); CK(cudaFree(c.partb));
    }

    /* ---- the tables ---- */
    printf("\nConvolution passes on %s, FP32, batch %d: microseconds per pass, stream (events around the pass's "
           "launches) / graph (per pass, 20 in one replayed graph); floor = max(FLOP / 67 TFLOP/s, bytes / 3.0 TB/s)\n",
           prop.name, BATCH);
    printf("| shape | pass | floor us |");
    for (v = 0; v < NVAR; ++v)
        if (v < NOURS || have_dnn) printf(" %s |", VNAME[v]);
    printf(" best of ours / v3 (graph) |\n|---|---|---|");
    for (v = 0; v < NVAR; ++v)
        if (v < NOURS || have_dnn) printf("---|");
    printf("---|\n");
    double step[2][NVAR]; /* per model: the five passes of a training step, graph us */
    int step_ok[2][NVAR];
    for (i = 0; i < 2; ++i)
        for (v = 0; v < NVAR; ++v) { step[i][v] = 0.0; step_ok[i][v] = 1; }
    for (si = 0; si < NSHAPES; ++si) {
        const shape &s = SHAPES[si];
        if (only && strcmp(only, s.id)) continue;
        conv c;
        memset(&c, 0, sizeof c);
        c.B = BATCH; c.Cin = s.Cin; c.H = c.W = s.H; c.Cout = s.Cout; c.KS = s.KS;
        c.OH = c.H - c.KS + 1; c.OW = c.OH; c.P = c.OH * c.OW; c.K = c.Cin * c.KS * c.KS;
        c.nx = (size_t)c.B * c.Cin * c.H * c.W; c.nw = (size_t)c.Cout * c.K; c.ny = (size_t)c.B * c.Cout * c.P;
        for (p = 0; p < NPASS; ++p) {
            double fl = fmax(flops_of(c) / PEAK_FLOPS, bytes_of(c, p) / PEAK_BYTES) * 1e6, ours = -1.0;
            int model = s.id[0] == 'F', in_step = !(p == 1 && s.Cin == 1); /* a first layer needs no dX */
            printf("| %s %s | %s%s | %.2f |", s.id, s.name, PNAME[p], in_step ? "" : " (not in training)", fl);
            for (v = 0; v < NVAR; ++v) {
                if (v >= NOURS && !have_dnn) continue;
                result &res = R[si][v][p];
                if (!res.ran || res.us_stream < 0) {
                    printf(" %s |", res.ran ? "WRONG" : "-");
                    step_ok[model][v] = 0;
                    continue;
                }
                printf(" %.1f / %s", res.us_stream, res.us_graph > 0 ? "" : "n/a");
                if (res.us_graph > 0) printf("%.1f", res.us_graph);
                if (v >= NOURS) printf(" (%s)", algo_note[si][v - NOURS][p]);
                if (!res.deterministic) printf(" nondet");
                printf(" |");
                if (v < NOURS && res.us_graph > 0 && (ours < 0 || res.us_graph < ours)) ours = res.us_graph;
                if (in_step) {
                    if (res.us_graph > 0) step[model][v] += res.us_graph;
                    else step_ok[model][v] = 0;
                }
            }
            if (have_dnn && ours > 0 && R[si][2][p].us_graph > 0) printf(" %.2f |\n", ours / R[si][2][p].us_graph);
            else printf(" - |\n");
        }
    }
    printf("\nGFLOP/s (graph time)\n| shape | pass |");
    for (v = 0; v < NVAR; ++v)
        if (v < NOURS || have_dnn) printf(" %s |", VNAME[v]);
    printf("\n|---|---|");
    for (v = 0; v < NVAR; ++v)
        if (v < NOURS || have_dnn) printf("---|");
    printf("\n");
    for (si = 0; si < NSHAPES; ++si) {
        const shape &s = SHAPES[si];
        if (only && strcmp(only, s.id)) continue;
        double fl = 2.0 * BATCH * s.Cout * (double)((s.H - s.KS + 1) * (s.H - s.KS + 1)) * s.Cin * s.KS * s.KS;
        for (p = 0; p < NPASS; ++p) {
            printf("| %s | %s |", s.id, PNAME[p]);
            for (v = 0; v < NVAR; ++v) {
                if (v >= NOURS && !have_dnn) continue;
                result &res = R[si][v][p];
                if (res.ran && res.us_graph > 0) printf(" %.0f |", fl / (res.us_graph * 1e3));
                else printf(" - |");
            }
            printf("\n");
        }
    }
    if (!only) {
        printf("\nA training step's conv passes (LeNet-5: L1 fwd, L1 dW, L2 fwd, L2 dX, L2 dW; Fashion CNN: F1 fwd, "
               "F1 dW, F2 fwd, F2 dX, F2 dW), graph us per step and ms per epoch of 938 steps\n| model |");
        for (v = 0; v < NVAR; ++v)
            if (v < NOURS || have_dnn) printf(" %s |", VNAME[v]);
        printf("\n|---|");
        for (v = 0; v < NVAR; ++v)
            if (v < NOURS || have_dnn) printf("---|");
        printf("\n");
        for (i = 0; i < 2; ++i) {
            printf("| %s |", i ? "Fashion CNN (P5)" : "LeNet-5 (P4)");
            for (v = 0; v < NVAR; ++v) {
                if (v >= NOURS && !have_dnn) continue;
                if (step_ok[i][v]) printf(" %.1f us, %.1f ms |", step[i][v], step[i][v] * 938.0 / 1e3);
                else printf(" - |");
            }
            printf("\n");
        }
    }
#ifndef WITH_CUDNN
    printf("(built without -DWITH_CUDNN: no cuDNN columns)\n");
#else
    if (g_dnn.wsp) CK(cudaFree(g_dnn.wsp));
    cudnnDestroyConvolutionDescriptor(g_dnn.cd);
    cudnnDestroyFilterDescriptor(g_dnn.wd);
    cudnnDestroyTensorDescriptor(g_dnn.bd);
    cudnnDestroyTensorDescriptor(g_dnn.yd);
    cudnnDestroyTensorDescriptor(g_dnn.xd);
    cudnnDestroy(g_dnn.h);
#endif
    CK(cudaStreamDestroy(st));
    if (dnn_bad)
        printf("cuda_conv: WARNING: for some pass no cuDNN algorithm passed the check, or v3's two runs differed "
               "(see the lines above); that does not fail this program\n");
    if (bad) {
        fprintf(stderr, "cuda_conv: FAILED: a variant of ours was wrong (relative error > 1e-5 or NaN) or not "
                        "deterministic\n");
        return 1;
    }
    printf("cuda_conv: v1 and v2 within 1e-5 of the double reference on every pass, and deterministic\n");
    return 0;
}
