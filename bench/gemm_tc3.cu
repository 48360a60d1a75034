/* bench/gemm_tc3.cu - FP32 products on the tensor cores in three TF32 parts, against cuBLAS.

   Build:  nvcc -O3 -arch=sm_90 -std=c++17 bench/gemm_tc3.cu -o build/gemm_tc3 -lcublas
   Run:    build/gemm_tc3            (needs a GPU of sm_80 or later; exits 1 when a variant is wrong)

   C[M][N] = op(A)[M][K] op(B)[K][N], row-major, as bench/cuda_gemm.cu: P3's five products
   (784-1024-1024-10 at batch 512: the two forward products, W2's input gradient, the two weight
   gradients) and the Fashion CNN's second convolution at batch 64 as products over the columns.

   The kernel: a block computes a BM x BN tile of C over a slice of K, its warps WM x WN parts of
   it, from shared memory filled by cp.async in three stages of 32 k (zero-filled past the edges;
   every dimension a multiple of 4). Each operand stays in shared memory in its global order, with
   rows padded so that mma.sync's fragment loads meet no bank conflict: rows of k are padded by 4
   floats, rows of m or n by 8. A fragment value x is split at load into big = x rounded to TF32 (an
   integer add and a mask) and small = x - big (exact; the tensor cores take its top 10 bits), and
   each product is summed as a_small b_big + a_big b_small + a_big b_big on mma.sync m16n8k8 in
   FP32 (a_small b_small, under 2^-22 relative, is left out). Modes: "3xTF32+" sums each stage's
   32 k on the tensor cores from zero and adds them to an FP32 total rounded to nearest (the
   header's TF32X3, mnistcu.h >>cuda_x3); "3xTF32" lets the tensor cores sum all of K (their sums
   truncate: about 20 times FP32's error over K = 784); "1xTF32" is big only, the plain TF32
   product. K in S slices writes S partial tiles that a second kernel adds in slice order, so the
   bits repeat.

   Each variant is checked against a double-precision CPU product (relative Frobenius error printed;
   3xTF32+ must be within 2x cuBLAS FP32's error plus 1e-6, 3xTF32 below 1e-4, 1xTF32 below 2e-3),
   then timed with CUDA events: 20 launches back to back per event pair, median of 15 pairs after 3
   warm-ups, with the partial sums' kernel ("product": without it). The summary per shape is the
   best of each mode within FP32's error bound, and P3's five products a step and an epoch.
   bench/RESULTS.md (2026-11-28, seventh block) has the figures. */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                           \
    do {                                                                                                \
        cudaError_t e_ = (x);                                                                           \
        if (e_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "gemm_tc3: FAILED: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,               \
                    cudaGetErrorString(e_));                                                            \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)

#define BK 32
#define STAGES 3

/* x rounded to TF32's 10 bits, to nearest with ties away, by an integer add and a mask (cvt.rna.tf32.f32
   gives the same value at a quarter of their rate: with it the three parts ran 1.2 times slower,
   bench/RESULTS.md) */
static __device__ __forceinline__ uint32_t tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

static __device__ __forceinline__ void mma8(float *d, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

static __device__ __forceinline__ void cp16(float *dst, const float *src, bool in)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(in ? 16 : 0));
}

/* Shared-memory floats of one stage's operand: `rows` of k (padded by 4), or BK rows of `rows` (padded by 8). */
template <int T, int R> struct op_tile {
    static constexpr int KMAJOR = !T; /* rows of k: A untransposed (A[m][k]), B transposed (B[n][k]) */
    static constexpr int LD = KMAJOR ? BK + 4 : R + 8;
    static constexpr int FLOATS = KMAJOR ? R * LD : BK * LD;
    /* element (r, k) of the tile */
    static __device__ __forceinline__ int at(int r, int k) { return KMAJOR ? r * LD + k : k * LD + r; }
};

/* op(X) of R rows (m or n) of the block from r0, k from k0 to kend, stage buffer s: k-major when the
   global matrix is X[r][k] (ld per r), else X[k][r]. */
template <int KM, int R, int THREADS>
static __device__ __forceinline__ void load_tile(float *s, const float *X, int ld, int r0, int rlim, int k0, int kend)
{
    constexpr int CH = R * BK / 4;
    for (int c = (int)threadIdx.x; c < CH; c += THREADS) {
        if (KM) {
            const int r = c / (BK / 4), k = (c % (BK / 4)) * 4;
            const bool in = r0 + r < rlim && k0 + k < kend;
            cp16(s + r * (BK + 4) + k, in ? X + (size_t)(r0 + r) * ld + k0 + k : X, in);
        } else {
            const int k = c / (R / 4), r = (c % (R / 4)) * 4;
            const bool in = k0 + k < kend && r0 + r < rlim;
            cp16(s + k * (R + 8) + r, in ? X + (size_t)(k0 + k) * ld + r0 + r : X, in);
        }
    }
}

template <int BM, int BN, int WM, int WN, int TA, int TB, int X3, int PROMO>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
    k_tc(int M, int N, int K, int Ks, const float *__restrict__ A, int lda, const float *__restrict__ B, int ldb,
         float *__restrict__ C, int ldc)
{
    constexpr int THREADS = (BM / WM) * (BN / WN) * 32, MI = WM / 16, NJ = WN / 8;
    typedef op_tile<TA, BM> TA_;
    typedef op_tile<!TB, BN> TB_; /* B[n][k] (TB) is k-major */
    extern __shared__ __align__(16) float sm[];
    float *As = sm, *Bs = sm + STAGES * TA_::FLOATS;
    const int lane = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int wm0 = (w / (BN / WN)) * WM, wn0 = (w % (BN / WN)) * WN;
    const int m0 = (int)blockIdx.y * BM, n0 = (int)blockIdx.x * BN;
    const int kbeg = (int)blockIdx.z * Ks, kend = min(K, kbeg + Ks), nk = (kend - kbeg + BK - 1) / BK;
    float acc[MI][NJ][4], part[MI][NJ][4]; /* part: the k-tile's sums (PROMO), else unused */
    for (int i = 0; i < MI; ++i)
        for (int j = 0; j < NJ; ++j)
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    float(*sum)[NJ][4] = PROMO ? part : acc;
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) {
            load_tile<!TA, BM, THREADS>(As + s * TA_::FLOATS, A, lda, m0, M, kbeg + s * BK, kend);
            load_tile<TB, BN, THREADS>(Bs + s * TB_::FLOATS, B, ldb, n0, N, kbeg + s * BK, kend);
        }
        asm volatile("cp.async.commit_group;");
    }
    for (int kt = 0; kt < nk; ++kt) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
        __syncthreads(); /* tile kt is in; every warp is done with tile kt - 1, whose stage the next load takes */
        {
            const int nt = kt + STAGES - 1, st = nt % STAGES;
            if (nt < nk) {
                load_tile<!TA, BM, THREADS>(As + st * TA_::FLOATS, A, lda, m0, M, kbeg + nt * BK, kend);
                load_tile<TB, BN, THREADS>(Bs + st * TB_::FLOATS, B, ldb, n0, N, kbeg + nt * BK, kend);
            }
            asm volatile("cp.async.commit_group;");
        }
        const float *as = As + (kt % STAGES) * TA_::FLOATS, *bs = Bs + (kt % STAGES) * TB_::FLOATS;
        if (PROMO)
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NJ; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sum[i][j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            uint32_t ab[MI][4], asml[MI][4], bb[NJ][2], bsml[NJ][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int r = wm0 + 16 * i + g;
                const float v[4] = {as[TA_::at(r, kk + t)], as[TA_::at(r + 8, kk + t)], as[TA_::at(r, kk + t + 4)],
                                    as[TA_::at(r + 8, kk + t + 4)]};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    ab[i][e] = tf32(v[e]);
                    if (X3) asml[i][e] = __float_as_uint(v[e] - __uint_as_float(ab[i][e])); /* exact; the mma
                                                                                 truncates it to its top 10 bits */
                }
            }
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int n = wn0 + 8 * j + g;
                const float v[2] = {bs[TB_::at(n, kk + t)], bs[TB_::at(n, kk + t + 4)]};
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    bb[j][e] = tf32(v[e]);
                    if (X3) bsml[j][e] = __float_as_uint(v[e] - __uint_as_float(bb[j][e]));
                }
            }
            /* the three passes each over every (i, j): MI x NJ independent sums between two that depend */
            if (X3) {
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < NJ; ++j) mma8(sum[i][j], asml[i], bb[j]);
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < NJ; ++j) mma8(sum[i][j], ab[i], bsml[j]);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NJ; ++j) mma8(sum[i][j], ab[i], bb[j]);
        }
        if (PROMO) /* the tile's sum into the FP32 total, rounded to nearest: the tensor cores' own sum of a long
                      K loses more than FP32's round-to-nearest does */
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NJ; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][j][e] += part[i][j][e];
    }
    asm volatile("cp.async.wait_group 0;");
    float *out = C + (size_t)blockIdx.z * (gridDim.z > 1 ? (size_t)M * N : 0);
    const int ld = gridDim.z > 1 ? N : ldc;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int r = m0 + wm0 + 16 * i + g, c = n0 + wn0 + 8 * j + 2 * t;
            if (c < N) {
                if (r < M) *(float2 *)(out + (size_t)r * ld + c) = make_float2(acc[i][j][0], acc[i][j][1]);
                if (r + 8 < M) *(float2 *)(out + (size_t)(r + 8) * ld + c) = make_float2(acc[i][j][2], acc[i][j][3]);
            }
        }
}

/* C = the sum of S parts [S][M][N] in slice order, four outputs a thread (N a multiple of 4). */
__global__ void k_sum(const float *part, int S, int M, int N, float *C, int ldc)
{
    const size_t n4 = (size_t)M * N / 4;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n4; e += (size_t)gridDim.x * blockDim.x) {
        float4 a = ((const float4 *)part)[e];
        for (int s = 1; s < S; ++s) {
            const float4 b = ((const float4 *)part)[(size_t)s * n4 + e];
            a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
        }
        const size_t row = e / ((size_t)N / 4), col = (e % ((size_t)N / 4)) * 4;
        *(float4 *)(C + row * ldc + col) = a;
    }
}

struct shape {
    const char *name;
    int ta, tb, M, N, K;
    int p3; /* 1: one of P3's five products a step */
};
static const shape SHAPES[] = {
    {"P3 fwd1  NT 512x1024x784", 0, 1, 512, 1024, 784, 1},
    {"P3 fwd2  NT 512x1024x1024", 0, 1, 512, 1024, 1024, 1},
    {"P3 dX2   NN 512x1024x1024", 0, 0, 512, 1024, 1024, 1},
    {"P3 dW2   TN 1024x1024x512", 1, 0, 1024, 1024, 512, 1},
    {"P3 dW1   TN 1024x784x512", 1, 0, 1024, 784, 512, 1},
    {"conv2 fwd NN 128x7744x576", 0, 0, 128, 7744, 576, 0},
    {"conv2 dW  NT 128x576x7744", 0, 1, 128, 576, 7744, 0},
    {"conv2 dX  TN 576x7744x128", 1, 0, 576, 7744, 128, 0},
};

struct cfg {
    const char *name;
    int bm, bn, threads, smem_a, smem_b; /* per-stage floats of A and B for this shape's orientation */
    void (*kern)(int, int, int, int, const float *, int, const float *, int, float *, int);
};

template <int BM, int BN, int WM, int WN, int X3, int PROMO> static cfg make_cfg(const char *name, int ta, int tb)
{
    cfg c;
    c.name = name;
    c.bm = BM;
    c.bn = BN;
    c.threads = (BM / WM) * (BN / WN) * 32;
    c.smem_a = ta ? op_tile<1, BM>::FLOATS : op_tile<0, BM>::FLOATS;
    c.smem_b = tb ? op_tile<0, BN>::FLOATS : op_tile<1, BN>::FLOATS;
    if (!ta && !tb) c.kern = k_tc<BM, BN, WM, WN, 0, 0, X3, PROMO>;
    else if (!ta && tb) c.kern = k_tc<BM, BN, WM, WN, 0, 1, X3, PROMO>;
    else if (ta && !tb) c.kern = k_tc<BM, BN, WM, WN, 1, 0, X3, PROMO>;
    else c.kern = k_tc<BM, BN, WM, WN, 1, 1, X3, PROMO>;
    return c;
}

static cublasHandle_t g_blas;
static cudaEvent_t g_e0, g_e1;

/* One product of shape s by cfg c with S slices (part: S > 1's workspace). */
static void run_tc(const shape &s, const cfg &c, int S, const float *A, const float *B, float *C, float *part,
                   bool sum = true)
{
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    int Ks = (s.K + S - 1) / S;
    Ks = (Ks + BK - 1) / BK * BK;
    const int Sz = (s.K + Ks - 1) / Ks;
    const size_t bytes = (size_t)STAGES * (c.smem_a + c.smem_b) * sizeof(float);
    dim3 grid((unsigned)((s.N + c.bn - 1) / c.bn), (unsigned)((s.M + c.bm - 1) / c.bm), (unsigned)Sz);
    c.kern<<<grid, c.threads, bytes>>>(s.M, s.N, s.K, Ks, A, lda, B, ldb, Sz > 1 ? part : C, s.N);
    if (Sz > 1 && sum) k_sum<<<264, 256>>>(part, Sz, s.M, s.N, C, s.N);
}

static void run_blas(const shape &s, int tf32, const float *A, const float *B, float *C)
{
    const float one = 1.0f, zero = 0.0f;
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    cublasSetMathMode(g_blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (cublasSgemm(g_blas, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, s.N, s.M, s.K, &one, B,
                    ldb, A, lda, &zero, C, s.N) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "gemm_tc3: FAILED: cublasSgemm %s\n", s.name);
        exit(1);
    }
}

template <class F> static double time_us(F f)
{
    std::vector<float> t;
    for (int i = 0; i < 3; ++i) f();
    for (int p = 0; p < 15; ++p) {
        float ms = 0.0f;
        CK(cudaEventRecord(g_e0));
        for (int i = 0; i < 20; ++i) f();
        CK(cudaEventRecord(g_e1));
        CK(cudaEventSynchronize(g_e1));
        CK(cudaEventElapsedTime(&ms, g_e0, g_e1));
        t.push_back(ms * 1000.0f / 20.0f);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static double rel_err(const std::vector<float> &c, const std::vector<double> &ref)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < c.size(); ++i) {
        const double d = (double)c[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
}

int main()
{
    int dev = 0, major = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        fprintf(stderr, "gemm_tc3: no CUDA device\n");
        return 1;
    }
    major = prop.major;
    if (major < 8) {
        fprintf(stderr, "gemm_tc3: needs sm_80 or later\n");
        return 1;
    }
    printf("device: %s, %d multiprocessors\n", prop.name, prop.multiProcessorCount);
    CK(cudaEventCreate(&g_e0));
    CK(cudaEventCreate(&g_e1));
    if (cublasCreate(&g_blas) != CUBLAS_STATUS_SUCCESS) return 1;
    int bad = 0;
    double p3_blas = 0.0, p3_blas_tf32 = 0.0, p3_best3 = 0.0, p3_best1 = 0.0;
    srand(7);
    for (const shape &s : SHAPES) {
        const size_t na = (size_t)s.M * s.K, nb = (size_t)s.K * s.N, nc = (size_t)s.M * s.N;
        std::vector<float> ha(na), hb(nb), hc(nc);
        std::vector<double> ref(nc, 0.0);
        for (auto &v : ha) v = (float)rand() / RAND_MAX * 2.0f - 1.0f;
        for (auto &v : hb) v = ((float)rand() / RAND_MAX * 2.0f - 1.0f) * 0.05f;
        /* op(A)[m][k]: ta: A[k][m]; op(B)[k][n]: tb: B[n][k] */
        {
            std::vector<double> brow(s.N);
            for (int m = 0; m < s.M; ++m)
                for (int k = 0; k < s.K; ++k) {
                    const double a = s.ta ? ha[(size_t)k * s.M + m] : ha[(size_t)m * s.K + k];
                    double *r = &ref[(size_t)m * s.N];
                    if (s.tb)
                        for (int n = 0; n < s.N; ++n) r[n] += a * hb[(size_t)n * s.K + k];
                    else
                        for (int n = 0; n < s.N; ++n) r[n] += a * hb[(size_t)k * s.N + n];
                }
        }
        float *A, *B, *C, *part;
        CK(cudaMalloc(&A, na * 4));
        CK(cudaMalloc(&B, nb * 4));
        CK(cudaMalloc(&C, nc * 4));
        CK(cudaMalloc(&part, nc * 4 * 8));
        CK(cudaMemcpy(A, ha.data(), na * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(B, hb.data(), nb * 4, cudaMemcpyHostToDevice));
        const double flop = 2.0 * s.M * s.N * s.K;
        printf("\n%s (%.2f GFLOP)\n", s.name, flop * 1e-9);
        double eb = 0.0;
        double tb = 0.0, tbt = 0.0;
        for (int tf = 0; tf < 2; ++tf) {
            CK(cudaMemset(C, 0, nc * 4));
            run_blas(s, tf, A, B, C);
            CK(cudaMemcpy(hc.data(), C, nc * 4, cudaMemcpyDeviceToHost));
            const double e = rel_err(hc, ref);
            if (!tf) eb = e;
            const double us = time_us([&] { run_blas(s, tf, A, B, C); });
            (tf ? tbt : tb) = us;
            printf("  %-30s %9.2f us %7.1f TFLOP/s  err %.2e\n", tf ? "cuBLAS TF32" : "cuBLAS FP32", us,
                   flop / us * 1e-6, e);
        }
        cublasSetMathMode(g_blas, CUBLAS_DEFAULT_MATH);
        double best[3] = {1e30, 1e30, 1e30}; /* 1xTF32, 3xTF32, 3xTF32 with its sums promoted each 32 k */
        for (int mode = 2; mode >= 0; --mode) {
            cfg cs[3];
            if (mode == 2) {
                cs[0] = make_cfg<128, 128, 64, 32, 1, 1>("3xTF32+ 128x128 w64x32", s.ta, s.tb);
                cs[1] = make_cfg<128, 64, 32, 32, 1, 1>("3xTF32+ 128x64  w32x32", s.ta, s.tb);
                cs[2] = make_cfg<64, 64, 32, 32, 1, 1>("3xTF32+ 64x64   w32x32", s.ta, s.tb);
            } else if (mode == 1) {
                cs[0] = make_cfg<128, 128, 64, 32, 1, 0>("3xTF32 128x128 w64x32", s.ta, s.tb);
                cs[1] = make_cfg<128, 64, 32, 32, 1, 0>("3xTF32 128x64  w32x32", s.ta, s.tb);
                cs[2] = make_cfg<64, 64, 32, 32, 1, 0>("3xTF32 64x64   w32x32", s.ta, s.tb);
            } else {
                cs[0] = make_cfg<128, 128, 64, 32, 0, 0>("1xTF32 128x128 w64x32", s.ta, s.tb);
                cs[1] = make_cfg<128, 64, 32, 32, 0, 0>("1xTF32 128x64  w32x32", s.ta, s.tb);
                cs[2] = make_cfg<64, 64, 32, 32, 0, 0>("1xTF32 64x64   w32x32", s.ta, s.tb);
            }
            const int x3 = mode > 0;
            for (const cfg &c : cs) {
                const size_t bytes = (size_t)STAGES * (c.smem_a + c.smem_b) * sizeof(float);
                CK(cudaFuncSetAttribute(c.kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
                for (int S : {1, 2, 3, 4, 6, 8}) {
                    if ((s.K + S - 1) / S < 2 * BK) continue;
                    CK(cudaMemset(C, 0, nc * 4));
                    run_tc(s, c, S, A, B, C, part);
                    CK(cudaGetLastError());
                    CK(cudaMemcpy(hc.data(), C, nc * 4, cudaMemcpyDeviceToHost));
                    const double e = rel_err(hc, ref);
                    /* FP32's bound for the promoted sums; the plain 3xTF32 sums are shown against it, not held to it */
                    const bool ok = mode == 2 ? e <= 2.0 * eb + 1e-6 : mode == 1 ? e < 1e-4 : e < 2e-3;
                    const bool fp32 = e <= 2.0 * eb + 1e-6;
                    const double us = time_us([&] { run_tc(s, c, S, A, B, C, part); });
                    int Ks = ((s.K + S - 1) / S + BK - 1) / BK * BK;
                    const int blocks = ((s.N + c.bn - 1) / c.bn) * ((s.M + c.bm - 1) / c.bm) * ((s.K + Ks - 1) / Ks);
                    const double us_k = S > 1 ? time_us([&] { run_tc(s, c, S, A, B, C, part, false); }) : us;
                    printf("  %-24s S=%d %4d blocks %9.2f us (product %7.2f) %7.1f TFLOP/s  err %.2e%s\n", c.name, S,
                           blocks, us, us_k, flop / us * 1e-6, e,
                           !ok ? "  WRONG" : x3 && !fp32 ? "  (over FP32's bound)" : "");
                    if (!ok) bad = 1;
                    else if (mode == 0 || fp32) best[mode] = std::min(best[mode], us);
                }
            }
        }
        /* within FP32's bound: the promoted sums, or the plain ones where they stay within it */
        const double b3 = std::min(best[1], best[2]);
        printf("  best within FP32's error bound: 3xTF32 %.2f us (cuBLAS FP32 %.2fx its time); 1xTF32 %.2f us "
               "(cuBLAS TF32 %.2fx)\n", b3, tb / b3, best[0], tbt / best[0]);
        if (s.p3) {
            p3_blas += tb;
            p3_blas_tf32 += tbt;
            p3_best3 += b3;
            p3_best1 += best[0];
        }
        cudaFree(A);
        cudaFree(B);
        cudaFree(C);
        cudaFree(part);
    }
    /* 60,000 / 512: 118 steps an epoch, the last of 96 samples counted as a whole one */
    printf("\nP3's five products, a step and an epoch of 118 steps: cuBLAS FP32 %.1f us (%.2f ms), 3xTF32 %.1f us "
           "(%.2f ms); cuBLAS TF32 %.1f us (%.2f ms), 1xTF32 %.1f us (%.2f ms)\n",
           p3_blas, p3_blas * 0.118, p3_best3, p3_best3 * 0.118, p3_blas_tf32, p3_blas_tf32 * 0.118, p3_best1,
           p3_best1 * 0.118);
    cublasDestroy(g_blas);
    if (bad) fprintf(stderr, "gemm_tc3: FAILED: a variant is wrong\n");
    return bad;
}
