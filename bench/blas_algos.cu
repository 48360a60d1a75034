/* bench/blas_algos.cu - how fast can NVIDIA's library make the products of training, at best?

   Build:  nvcc -O3 -arch=sm_90 bench/blas_algos.cu -o build/blas_algos -lcublasLt -lcublas
   Run:    build/blas_algos

   For each product shape of P3 (784-1024-1024-10 at batch 512) and of the Fashion CNN's second
   convolution (P5, as im2col products), in FP32 and in TF32:
     - "default": cublasGemmEx as the header calls it (the column-major mirror of a row-major
       product), the kernel cuBLAS's own heuristic picks;
     - "best of N": every algorithm cublasLt's heuristic returns (up to 32, 32 MiB of workspace), each
       timed, the fastest reported with its rank in the heuristic's list.
   Then two products that one step could run at the same time (P3's W2 gradient and its h1 gradient,
   both needing only dh2; the convolution's weight and input gradients) are timed one after the other
   on one stream and side by side on two streams: what a step with two branches would gain.

   Timing: 10 launches back to back between two events, the median of 15 such samples after 3 warm-up
   launches, in GFLOP/s (2MNK/t). Each result is checked against a double-precision product on the
   CPU (relative Frobenius error; FP32 must be below 1e-5, TF32 below 5e-3) so a wrong algorithm cannot
   win. C[M][N] = op(A)[M][K] op(B)[K][N], row-major, as in bench/cuda_gemm.cu. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "blas_algos: FAILED: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)
#define CB(x)                                                                                                  \
    do {                                                                                                       \
        cublasStatus_t s_ = (x);                                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                     \
            fprintf(stderr, "blas_algos: FAILED: %s:%d: %s: %d\n", __FILE__, __LINE__, #x, (int)s_);          \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

struct shape {
    const char *name;
    int ta, tb, M, N, K;
};
static const shape SHAPES[] = {
    {"P3 fwd1 NT 512x1024x784", 0, 1, 512, 1024, 784},   {"P3 fwd2 NT 512x1024x1024", 0, 1, 512, 1024, 1024},
    {"P3 dW1 TN 1024x784x512", 1, 0, 1024, 784, 512},    {"P3 dW2 TN 1024x1024x512", 1, 0, 1024, 1024, 512},
    {"P3 dh1 NN 512x1024x1024", 0, 0, 512, 1024, 1024},  {"P5 conv2 fwd NN 128x7744x576", 0, 0, 128, 7744, 576},
    {"P5 conv2 dW NT 128x576x7744", 0, 1, 128, 576, 7744}, {"P5 conv2 dX TN 576x7744x128", 1, 0, 576, 7744, 128},
    {"P5 dense1 fwd NT 64x256x3200", 0, 1, 64, 256, 3200},  {"P5 dense1 dW TN 256x3200x64", 1, 0, 256, 3200, 64},
    {"P5 dense1 dX NN 64x3200x256", 0, 0, 64, 3200, 256},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))
#define WS_BYTES ((size_t)32 << 20)
#define NALG 32

struct operands {
    float *A, *B, *C;
    double *ref, refn;
    float *hC;
};

static void make_operands(const shape &s, int seed, operands *o)
{
    int M = s.M, N = s.N, K = s.K, lda = s.ta ? M : K, ldb = s.tb ? K : N, i, j, k;
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *hA = (float *)malloc(na * 4), *hB = (float *)malloc(nb * 4);
    double *oA = (double *)malloc(na * 8), *oB = (double *)malloc(nb * 8);
    unsigned long long st = 0x9E3779B97F4A7C15ull + (unsigned long long)seed;
    o->ref = (double *)calloc(nc, 8);
    o->hC = (float *)malloc(nc * 4);
    if (!hA || !hB || !oA || !oB || !o->ref || !o->hC) { fprintf(stderr, "blas_algos: FAILED: host memory\n"); exit(1); }
    for (i = 0; i < (int)na; ++i) { st = st * 6364136223846793005ull + 1442695040888963407ull; hA[i] = (float)((double)(st >> 40) / 8388608.0 - 1.0); }
    for (i = 0; i < (int)nb; ++i) { st = st * 6364136223846793005ull + 1442695040888963407ull; hB[i] = (float)((double)(st >> 40) / 8388608.0 - 1.0); }
    for (i = 0; i < M; ++i)
        for (k = 0; k < K; ++k) oA[(size_t)i * K + k] = s.ta ? hA[(size_t)k * lda + i] : hA[(size_t)i * lda + k];
    for (k = 0; k < K; ++k)
        for (j = 0; j < N; ++j) oB[(size_t)k * N + j] = s.tb ? hB[(size_t)j * ldb + k] : hB[(size_t)k * ldb + j];
    for (i = 0; i < M; ++i)
        for (k = 0; k < K; ++k) {
            double a = oA[(size_t)i * K + k], *rr = o->ref + (size_t)i * N;
            const double *bb = oB + (size_t)k * N;
            for (j = 0; j < N; ++j) rr[j] += a * bb[j];
        }
    o->refn = 0.0;
    for (i = 0; i < (int)nc; ++i) o->refn += o->ref[i] * o->ref[i];
    o->refn = sqrt(o->refn);
    CK(cudaMalloc((void **)&o->A, na * 4));
    CK(cudaMalloc((void **)&o->B, nb * 4));
    CK(cudaMalloc((void **)&o->C, nc * 4));
    CK(cudaMemcpy(o->A, hA, na * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(o->B, hB, nb * 4, cudaMemcpyHostToDevice));
    free(hA), free(hB), free(oA), free(oB);
}

static double relerr(const shape &s, operands *o)
{
    size_t nc = (size_t)s.M * s.N, i;
    double e = 0.0;
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(o->hC, o->C, nc * 4, cudaMemcpyDeviceToHost));
    for (i = 0; i < nc; ++i) {
        double d = (double)o->hC[i] - o->ref[i];
        e += d * d;
    }
    return sqrt(e) / o->refn;
}

/* the header's call: the column-major mirror, C^T (N x M) = op(B)^T op(A)^T */
static void gemm_default(cublasHandle_t h, const shape &s, operands *o, int tf32)
{
    const float one = 1.0f, zero = 0.0f;
    int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    CB(cublasGemmEx(h, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, s.N, s.M, s.K, &one, o->B,
                    CUDA_R_32F, ldb, o->A, CUDA_R_32F, lda, &zero, o->C, CUDA_R_32F, s.N,
                    tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct lt_problem {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c; /* a: the first operand (B's mirror), b: the second (A's) */
};

static void lt_make(const shape &s, int tf32, lt_problem *p)
{
    cublasOperation_t opb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    CB(cublasLtMatmulDescCreate(&p->op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
    CB(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
    /* stored shapes (column-major): first operand N x K (or K x N transposed), second K x M (or M x K) */
    CB(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, s.tb ? s.K : s.N, s.tb ? s.N : s.K, ldb));
    CB(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, s.ta ? s.M : s.K, s.ta ? s.K : s.M, lda));
    CB(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, s.N, s.M, s.N));
}

static cublasStatus_t lt_run(cublasLtHandle_t lt, const lt_problem *p, const cublasLtMatmulAlgo_t *algo, operands *o,
                             void *ws, cudaStream_t st)
{
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(lt, p->op, &one, o->B, p->a, o->A, p->b, &zero, o->C, p->c, o->C, p->c, algo, ws, WS_BYTES, st);
}

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

static cudaEvent_t g_e0, g_e1;
/* median ms per call of `fn`, which launches `burst` calls */
#define TIME_MEDIAN(result, burst, body)                                                                       \
    do {                                                                                                       \
        float t_[15];                                                                                          \
        int r_, b_;                                                                                            \
        for (r_ = 0; r_ < 3; ++r_) { body; }                                                                   \
        for (r_ = 0; r_ < 15; ++r_) {                                                                          \
            CK(cudaEventRecord(g_e0, 0));                                                                      \
            for (b_ = 0; b_ < (burst); ++b_) { body; }                                                         \
            CK(cudaEventRecord(g_e1, 0));                                                                      \
            CK(cudaEventSynchronize(g_e1));                                                                    \
            CK(cudaEventElapsedTime(&t_[r_], g_e0, g_e1));                                                     \
            t_[r_] /= (float)(burst);                                                                          \
        }                                                                                                      \
        qsort(t_, 15, sizeof(float), cmpf);                                                                    \
        (result) = t_[7];                                                                                      \
    } while (0)

static void side_by_side(cublasHandle_t h, cublasHandle_t h2, const shape &x, operands *ox, const shape &y, operands *oy,
                         int tf32, cudaStream_t s1, cudaStream_t s2, cudaEvent_t fork, cudaEvent_t join)
{
    CK(cudaEventRecord(fork, 0));
    CK(cudaStreamWaitEvent(s1, fork, 0));
    CK(cudaStreamWaitEvent(s2, fork, 0));
    gemm_default(h, x, ox, tf32);
    gemm_default(h2, y, oy, tf32);
    CK(cudaEventRecord(join, s2));
    CK(cudaStreamWaitEvent(0, join, 0));
    CK(cudaEventRecord(fork, s1));
    CK(cudaStreamWaitEvent(0, fork, 0));
}

int main(void)
{
    cublasHandle_t h, h2;
    cublasLtHandle_t lt;
    cudaDeviceProp prop;
    void *ws, *ws2;
    int si, tf32, bad = 0, ndev = 0;
    operands ops[NSHAPES];
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "blas_algos: FAILED: no CUDA GPU\n");
        return 1;
    }
    CK(cudaGetDeviceProperties(&prop, 0));
    CB(cublasCreate(&h));
    CB(cublasCreate(&h2));
    CB(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, WS_BYTES));
    CK(cudaMalloc(&ws2, WS_BYTES));
    CB(cublasSetWorkspace(h, ws, WS_BYTES));
    CB(cublasSetWorkspace(h2, ws2, WS_BYTES));
    CK(cudaEventCreate(&g_e0));
    CK(cudaEventCreate(&g_e1));
    printf("blas_algos: %s (sm_%d%d, %d SMs), cuBLAS %d; GFLOP/s a launch, median of 15 bursts of 10\n", prop.name,
           prop.major, prop.minor, prop.multiProcessorCount, CUBLAS_VERSION);
    printf("| shape (M x N x K) | math | default | best of N (rank) | heuristic's first | algorithms |\n|---|---|---|---|---|---|\n");
    for (si = 0; si < NSHAPES; ++si) make_operands(SHAPES[si], si, &ops[si]);
    for (si = 0; si < NSHAPES; ++si)
        for (tf32 = 0; tf32 < 2; ++tf32) {
            const shape &s = SHAPES[si];
            operands *o = &ops[si];
            double gf = 2.0 * s.M * s.N * s.K * 1e-6, lim = tf32 ? 5e-3 : 1e-5, e;
            float t_def, t_best = 1e30f, t_first = 0.0f, t;
            int n = 0, a, best = -1;
            cublasLtMatmulHeuristicResult_t res[NALG];
            cublasLtMatmulPreference_t pref;
            lt_problem p;
            size_t wsb = WS_BYTES;
            CB(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
            gemm_default(h, s, o, tf32);
            if (!((e = relerr(s, o)) < lim)) bad = 1, fprintf(stderr, "blas_algos: FAILED: default %s: error %.3e\n", s.name, e);
            TIME_MEDIAN(t_def, 10, gemm_default(h, s, o, tf32));
            lt_make(s, tf32, &p);
            CB(cublasLtMatmulPreferenceCreate(&pref));
            CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
            CB(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, NALG, res, &n));
            for (a = 0; a < n; ++a) {
                if (res[a].state != CUBLAS_STATUS_SUCCESS || lt_run(lt, &p, &res[a].algo, o, ws, 0) != CUBLAS_STATUS_SUCCESS) continue;
                if (!((e = relerr(s, o)) < lim)) {
                    fprintf(stderr, "blas_algos: %s %s algorithm %d: error %.3e, skipped\n", s.name, tf32 ? "TF32" : "FP32", a, e);
                    continue;
                }
                TIME_MEDIAN(t, 10, lt_run(lt, &p, &res[a].algo, o, ws, 0));
                if (a == 0) t_first = t;
                if (t < t_best) t_best = t, best = a;
            }
            printf("| %s | %s | %.0f | %.0f (%d) | %.0f | %d |\n", s.name, tf32 ? "TF32" : "FP32", gf / t_def,
                   best >= 0 ? gf / t_best : 0.0, best, t_first > 0 ? gf / t_first : 0.0, n);
            fflush(stdout);
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatmulDescDestroy(p.op);
            cublasLtMatrixLayoutDestroy(p.a), cublasLtMatrixLayoutDestroy(p.b), cublasLtMatrixLayoutDestroy(p.c);
        }

    /* two independent products: one stream after the other, then two streams side by side */
    {
        static const int pairs[][2] = {{3, 4}, {2, 4}, {6, 7}};
        cudaStream_t s1, s2;
        cudaEvent_t fork, join;
        int pi;
        CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
        printf("\n| pair (default cuBLAS) | math | one stream, us | two streams, us | saved |\n|---|---|---|---|---|\n");
        for (pi = 0; pi < 3; ++pi)
            for (tf32 = 0; tf32 < 2; ++tf32) {
                const shape &x = SHAPES[pairs[pi][0]], &y = SHAPES[pairs[pi][1]];
                operands *ox = &ops[pairs[pi][0]], *oy = &ops[pairs[pi][1]];
                float t1, t2;
                CB(cublasSetStream(h, 0));
                CB(cublasSetStream(h2, 0));
                TIME_MEDIAN(t1, 10, (gemm_default(h, x, ox, tf32), gemm_default(h2, y, oy, tf32)));
                CB(cublasSetStream(h, s1));
                CB(cublasSetStream(h2, s2));
                TIME_MEDIAN(t2, 10, side_by_side(h, h2, x, ox, y, oy, tf32, s1, s2, fork, join));
                printf("| %s + %s | %s | %.1f | %.1f | %.1f |\n", x.name, y.name, tf32 ? "TF32" : "FP32", t1 * 1e3,
                       t2 * 1e3, (t1 - t2) * 1e3);
                fflush(stdout);
                CB(cublasSetStream(h, 0));
                CB(cublasSetStream(h2, 0));
            }
    }
    /* K in S slices as one strided batch (the header's split for products with a bias or an activation,
       mnistcu__blas_split), the product alone: the parts' sum is another pass (2-6 us in the steps) */
    printf("\n| NT shape, K in S slices (strided batch, FP32), us | S=1 | S=2 | S=4 | S=8 | S=16 |\n|---|---|---|---|---|---|\n");
    for (si = 0; si < NSHAPES; ++si) {
        const shape &s = SHAPES[si];
        operands *o = &ops[si];
        float *part;
        int S;
        if (s.ta || !s.tb) continue;
        CK(cudaMalloc((void **)&part, (size_t)16 * s.M * s.N * 4));
        printf("| %s |", s.name);
        for (S = 1; S <= 16; S *= 2) {
            const float one = 1.0f, zero = 0.0f;
            const int kc = s.K / S;
            float t;
            if (s.K % S) { printf(" - |"); continue; }
            TIME_MEDIAN(t, 10, CB(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, s.N, s.M, kc, &one, o->B, s.K, kc,
                                                            o->A, s.K, kc, &zero, part, s.N, (long long)s.M * s.N, S)));
            printf(" %.1f |", t * 1e3);
        }
        printf("\n");
        fflush(stdout);
        CK(cudaFree(part));
    }
    if (bad) printf("blas_algos: FAILED: a product was wrong\n");
    return bad;
}
