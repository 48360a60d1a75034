/* CUDA parity tests: every CUDA op against its CPU reference, training parity,
   determinism, both matrix-product paths, streaming, out-of-memory handling.
   Included by test_main.c under nvcc, so the library's internals are in scope.
   Outputs are poisoned with NaN before each call and every element is checked. */
#include <cuda_runtime.h>

/* ---- device buffers for the tests -------------------------------------------- */
/* The library's streams do not wait for the legacy default stream, and a copy
   from pageable memory may return before its data has landed, so every upload
   and poisoning here ends with a device-wide synchronisation before any kernel
   of the library can read it. */
static float *tc_up(const float *h, size_t n)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, (n ? n : 1) * sizeof(float)) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    return d;
}

static float *tc_poisoned(size_t n)
{
    float *d = NULL, *h = (float *)malloc((n ? n : 1) * sizeof(float));
    size_t i;
    for (i = 0; i < n; ++i) h[i] = tu_nan();
    d = tc_up(h, n);
    free(h);
    return d;
}

static float *tc_down(const float *d, size_t n)
{
    float *h = (float *)malloc((n ? n : 1) * sizeof(float));
    cudaDeviceSynchronize();
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
}

/* Normwise relative error ||got - ref|| / ||ref|| over n elements; NaN anywhere gives +inf. */
static double tc_relerr(const float *got, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) {
        double d = (double)got[i] - (double)ref[i];
        if (got[i] != got[i] || ref[i] != ref[i]) return INFINITY;
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* The CNN path of the contexts tc_ctx and tc_ctx_prec make. */
static mnistcu_cnn tc_cnn_path = MNISTCU_CNN_OWN;

/* A GPU context with the given matrix-product path and precision, and the CNN path in tc_cnn_path. */
static mnistcu_ctx *tc_ctx_prec(mnistcu_gemm gemm, mnistcu_precision prec)
{
    mnistcu_ctx_desc d;
    mnistcu_ctx *ctx = NULL;
    memset(&d, 0, sizeof d);
    d.device = MNISTCU_DEVICE_CUDA;
    d.log_level = MNISTCU_LOG_SILENT;
    d.seed = 1234;
    d.gemm = gemm;
    d.cnn = tc_cnn_path;
    d.precision = prec;
    if (mnistcu_ctx_create(&ctx, &d) != MNISTCU_OK) {
        mnistcu_ctx_destroy(ctx);
        return NULL;
    }
    return ctx;
}

static mnistcu_ctx *tc_ctx(mnistcu_gemm gemm) { return tc_ctx_prec(gemm, MNISTCU_PRECISION_DEFAULT); }

#define TC_MAX_REL 1e-5

/* ---- ops ------------------------------------------------------------------------- */
static int tc_gemm_case(mnistcu_ctx *g, mnistcu_ctx *c, int ta, int tb, size_t M, size_t N, size_t K, int fuse, int act,
                        double *err)
{
    tu_rng rng = tu_rng_make(M * 131 + N * 7 + K + (size_t)ta * 3 + (size_t)tb * 5 + (size_t)act);
    size_t lda = ta ? M : K, ldb = tb ? K : N;
    float *A = tu_random_floats(&rng, M * K, -1, 1), *B = tu_random_floats(&rng, K * N, -1, 1);
    float *bias = tu_random_floats(&rng, N, -1, 1), *ref = (float *)malloc(M * N * sizeof(float) + 4), *got;
    float *dA = tc_up(A, M * K), *dB = tc_up(B, K * N), *dbias = tc_up(bias, N), *dC = tc_poisoned(M * N);
    mnistcu_result r;
    mnistcu__cpu_gemm(c, ta, tb, M, N, K, A, lda, B, ldb, ref, N);
    if (fuse) mnistcu__cpu_bias_act(c, ref, bias, M, N, (mnistcu_act)act);
    r = mnistcu__cuda_gemm(g, ta, tb, M, N, K, dA, lda, dB, ldb, dC, N, fuse ? dbias : NULL, act);
    got = tc_down(dC, M * N);
    *err = r == MNISTCU_OK ? tc_relerr(got, ref, M * N) : INFINITY;
    free(A); free(B); free(bias); free(ref); free(got);
    cudaFree(dA); cudaFree(dB); cudaFree(dbias); cudaFree(dC);
    return *err <= TC_MAX_REL;
}

/* Products large enough for the wide-tile kernel (split and not), against the CPU: a test of their own,
   kept out of the sanitizer runs, which they would slow by minutes. */
static const size_t tc_wide_dims[][3] = {{512, 1024, 784}, {520, 1028, 100}};

static int tc_gemm_dims(mnistcu_gemm path, const size_t (*dims)[3], size_t ndims, char *msg, size_t msg_size);

static int tc_gemm_all(mnistcu_gemm path, char *msg, size_t msg_size)
{
    static const size_t dims[][3] = {{1, 1, 1}, {1, 10, 784}, {7, 37, 100}, {33, 100, 784}, {64, 128, 784},
                                     {65, 63, 17}, {128, 784, 64}, {100, 784, 33}, {200, 1024, 300},
                                     {6, 25, 36864}, {128, 576, 7744}, {131, 300, 1000}, {576, 7744, 128},
                                     {256, 512, 784}, {10, 1024, 512}, {16, 33, 1024}, {3, 40, 1}, {1, 300, 5},
                                     {64, 256, 3200}, {40, 100, 2056}};
    return tc_gemm_dims(path, dims, sizeof dims / sizeof dims[0], msg, msg_size);
}

static int tc_gemm_dims(mnistcu_gemm path, const size_t (*dims)[3], size_t ndims, char *msg, size_t msg_size)
{
    mnistcu_ctx *g = tc_ctx(path), *c = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    size_t i;
    int ta, tb, act, ok = 1;
    double err;
    if (!g || !c) {
        snprintf(msg, msg_size, "no CUDA context for gemm path %d", (int)path);
        ok = 0;
    }
    mnistcu__cpu_reserve(c);
    for (i = 0; ok && i < ndims; ++i) {
        for (ta = 0; ok && ta < 2; ++ta)
            for (tb = 0; ok && tb < 2; ++tb)
                if (!tc_gemm_case(g, c, ta, tb, dims[i][0], dims[i][1], dims[i][2], 0, 0, &err)) {
                    snprintf(msg, msg_size, "gemm path %d ta=%d tb=%d %lux%lux%lu: relative error %.3g", (int)path, ta,
                             tb, (unsigned long)dims[i][0], (unsigned long)dims[i][1], (unsigned long)dims[i][2], err);
                    ok = 0;
                }
        /* with a bias and an activation: NT, the dense layers' forward pass (through cuBLAS, 256x512x784 is
           split over K in parts that the bias pass adds: mnistcu__blas_split) */
        for (act = MNISTCU_ACT_RELU; ok && act <= MNISTCU_ACT_TANH; ++act)
            if (!tc_gemm_case(g, c, 0, 1, dims[i][0], dims[i][1], dims[i][2], 1, act, &err)) {
                snprintf(msg, msg_size, "fused gemm path %d act %d %lux%lux%lu: relative error %.3g", (int)path, act,
                         (unsigned long)dims[i][0], (unsigned long)dims[i][1], (unsigned long)dims[i][2], err);
                ok = 0;
            }
    }
    mnistcu_ctx_destroy(g);
    mnistcu_ctx_destroy(c);
    return ok;
}

TEST cuda_gemm_own_kernel_matches_cpu(void)
{
    char msg[256];
    if (!tc_gemm_all(MNISTCU_GEMM_OWN, msg, sizeof msg)) FAILm(msg);
    PASS();
}

TEST cuda_gemm_wide_matches_cpu(void)
{
    char msg[256];
    ASSERT_EQ((size_t)4, mnistcu__gemm_wide_split(512, 1024, 784)); /* split, */
    ASSERT_EQ((size_t)1, mnistcu__gemm_wide_split(520, 1028, 100)); /* whole */
    if (!tc_gemm_dims(MNISTCU_GEMM_OWN, tc_wide_dims, sizeof tc_wide_dims / sizeof tc_wide_dims[0], msg, sizeof msg))
        FAILm(msg);
    PASS();
}

TEST cuda_gemm_cublas_matches_cpu(void)
{
#ifdef MNISTCU_CUBLAS
    char msg[256];
    /* few rows over a long K: the fused forward products of tc_gemm_all split in 16 and 8 parts */
    ASSERT_EQ((size_t)16, mnistcu__blas_split(64, 256, 3200));
    ASSERT_EQ((size_t)8, mnistcu__blas_split(40, 100, 2056));
    if (!tc_gemm_all(MNISTCU_GEMM_CUBLAS, msg, sizeof msg)) FAILm(msg);
    PASS();
#else
    SKIPm("built without MNISTCU_CUBLAS");
#endif
}

/* ---- reduced precision (mnistcu_ctx_desc.precision) ------------------------------ */
/* Whether this GPU has tensor cores for TF32 and BF16 (sm_80 and newer). */
static int tc_has_tensor_cores(void)
{
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return 0;
    return major >= 8;
}

/* The reduced precisions' unit u of the bound below, and their names. TF32X3 (three TF32 products,
   >>cuda_x3): each term within 2^-21 + 2^-22 of its value, so 2^-20, 1024 times TF32's. */
static double tc_prec_unit(int prec)
{
    return prec == MNISTCU_PRECISION_TF32 ? ldexp(1.0, -10) : prec == MNISTCU_PRECISION_BF16 ? ldexp(1.0, -8)
                                                                                            : ldexp(1.0, -20);
}
static const char *tc_prec_name(int prec) { return mnistcu__precision_name(prec); }
/* Whether a TF32X3 context's product of these dimensions is mnistcu__cuda_gemm_x3's (the tests' operands are
   aligned; leading dimensions are the dimensions) */
static int tc_x3_takes(size_t M, size_t N, size_t K)
{
    return (M | N | K) % 4 == 0 && (((M + 63) / 64) * ((N + 63) / 64) >= MNISTCU__TC_MIN_TILES ||
                                    K >= MNISTCU__X3_LONG_K);
}

/* One product in reduced precision against a double-precision reference, element
   by element: |got - ref| <= (2u + u^2 + K 2^-23) sum_k |a_k b_k| + 1e-6, the
   rounding of both operands (unit u: 2^-10 covers TF32 whether rounded or
   truncated, 2^-8 BF16 rounded to nearest) and an FP32 sum of K terms that may
   truncate (as the tensor cores' additions may); the
   activations applied after are 1-Lipschitz. *differs counts the outputs that
   are not bitwise the FP32 product's (0 would mean the tensor cores were not used). */
static int tc_gemm_prec_case(mnistcu_ctx *g, mnistcu_ctx *g32, double u, int ta, int tb, size_t M, size_t N, size_t K,
                             int act, size_t *differs, double *e2, char *msg, size_t msg_size)
{
    tu_rng rng = tu_rng_make(M * 131 + N * 7 + K + (size_t)ta * 3 + (size_t)tb * 5 + (size_t)act);
    size_t lda = ta ? M : K, ldb = tb ? K : N, i, j, k;
    float *A = tu_random_floats(&rng, M * K, -1, 1), *B = tu_random_floats(&rng, K * N, -1, 1);
    float *bias = tu_random_floats(&rng, N, -1, 1), *got, *got32;
    float *dA = tc_up(A, M * K), *dB = tc_up(B, K * N), *dbias = tc_up(bias, N), *dC = tc_poisoned(M * N);
    float *dC32 = tc_poisoned(M * N);
    int ok = 1;
    if (mnistcu__cuda_gemm(g, ta, tb, M, N, K, dA, lda, dB, ldb, dC, N, act ? dbias : NULL, act) != MNISTCU_OK ||
        mnistcu__cuda_gemm(g32, ta, tb, M, N, K, dA, lda, dB, ldb, dC32, N, act ? dbias : NULL, act) != MNISTCU_OK) {
        snprintf(msg, msg_size, "%lux%lux%lu: %.200s", (unsigned long)M, (unsigned long)N, (unsigned long)K,
                 mnistcu_ctx_error(g));
        ok = 0;
    }
    got = tc_down(dC, M * N);
    got32 = tc_down(dC32, M * N);
    for (i = 0; ok && i < M; ++i)
        for (j = 0; ok && j < N; ++j) {
            double ref = 0.0, mag = 0.0, bound, v;
            for (k = 0; k < K; ++k) {
                double a = ta ? A[k * lda + i] : A[i * lda + k], b = tb ? B[j * ldb + k] : B[k * ldb + j];
                ref += a * b;
                mag += fabs(a * b);
            }
            if (act) ref = mnistcu__act_f((mnistcu_act)act, (float)(ref + bias[j]));
            bound = (2.0 * u + u * u + (double)K * ldexp(1.0, -23)) * mag + 1e-6;
            v = got[i * N + j];
            if (!(fabs(v - ref) <= bound)) {
                snprintf(msg, msg_size, "ta=%d tb=%d act=%d %lux%lux%lu: C[%lu][%lu] = %.9g, reference %.9g, bound %.3g",
                         ta, tb, act, (unsigned long)M, (unsigned long)N, (unsigned long)K, (unsigned long)i,
                         (unsigned long)j, v, ref, bound);
                ok = 0;
            }
            if (memcmp(&got[i * N + j], &got32[i * N + j], sizeof(float)) != 0) ++*differs;
            if (e2) { /* squared errors of the product and of FP32's, and the reference's square */
                e2[0] += (v - ref) * (v - ref);
                e2[1] += ((double)got32[i * N + j] - ref) * ((double)got32[i * N + j] - ref);
                e2[2] += ref * ref;
            }
        }
    free(A); free(B); free(bias); free(got); free(got32);
    cudaFree(dA); cudaFree(dB); cudaFree(dbias); cudaFree(dC); cudaFree(dC32);
    return ok;
}

TEST cuda_gemm_reduced_precision_within_bound(void)
{
    /* the first three and the ninth on the tensor cores in the own path (16 tiles or more; the second with K
       split; TF32X3 declines the first, 1030 not a multiple of 4, and takes the ninth's edge tiles in both m
       and n, and its K that ends inside a stage), the rest small products that it keeps in FP32, except in
       TF32X3 the last two: few tiles over a long K, in slices (the Fashion CNN's first dense layer, and
       edge tiles with a K that ends inside a stage) */
    static const size_t dims[][3] = {{520, 1030, 200}, {128, 576, 1100}, {200, 1024, 300}, {1, 10, 784},
                                     {7, 37, 100}, {64, 128, 784}, {65, 63, 17}, {6, 25, 36864},
                                     {260, 1036, 204}, {64, 256, 3200}, {68, 92, 2060}};
    int path, prec, ta, tb, act;
    if (!tc_has_tensor_cores()) SKIPm("no tensor cores (sm_80+): TF32 and BF16 resolve to FP32");
    for (path = 0; path < 2; ++path) {
        mnistcu_gemm gemm = path ? MNISTCU_GEMM_CUBLAS : MNISTCU_GEMM_OWN;
#ifndef MNISTCU_CUBLAS
        if (path) break;
#endif
        for (prec = MNISTCU_PRECISION_TF32; prec <= MNISTCU_PRECISION_TF32X3; ++prec) {
            mnistcu_ctx *g = tc_ctx_prec(gemm, (mnistcu_precision)prec), *g32 = tc_ctx_prec(gemm, MNISTCU_PRECISION_FP32);
            mnistcu_ctx_desc rd;
            const int x3 = prec == MNISTCU_PRECISION_TF32X3;
            double u = tc_prec_unit(prec), e2[3] = {0.0, 0.0, 0.0};
            size_t i, differs = 0, tc_outputs = 0, x3_before, x3_want = 0;
            char msg[320], name[16];
            ASSERT(g && g32);
            mnistcu_ctx_resolved_desc(g, &rd);
            ASSERT_EQ((int)prec, (int)rd.precision); /* the test GPUs have tensor cores (sm_80+) */
            snprintf(name, sizeof name, ", %s)", tc_prec_name(prec));
            ASSERT(strstr(mnistcu_ctx_device_name(g), name));
            x3_before = mnistcu__cu(g)->x3_products;
            for (i = 0; i < sizeof dims / sizeof dims[0]; ++i) {
                size_t dif = 0, tiles = ((dims[i][0] + 63) / 64) * ((dims[i][1] + 63) / 64);
                const int x3_takes = x3 && tc_x3_takes(dims[i][0], dims[i][1], dims[i][2]);
                if (x3 ? x3_takes : tiles >= MNISTCU__TC_MIN_TILES) tc_outputs += 7 * dims[i][0] * dims[i][1];
                for (ta = 0; ta < 2; ++ta)
                    for (tb = 0; tb < 2; ++tb) {
                        if (!tc_gemm_prec_case(g, g32, u, ta, tb, dims[i][0], dims[i][1], dims[i][2], 0, &dif,
                                               x3_takes ? e2 : NULL, msg, sizeof msg))
                            FAILm(msg);
                        x3_want += (size_t)x3_takes;
                    }
                for (act = MNISTCU_ACT_RELU; act <= MNISTCU_ACT_TANH; ++act) {
                    if (!tc_gemm_prec_case(g, g32, u, 0, 1, dims[i][0], dims[i][1], dims[i][2], act, &dif, NULL, msg,
                                           sizeof msg))
                        FAILm(msg);
                    x3_want += (size_t)x3_takes;
                }
                if (!path && tiles < MNISTCU__TC_MIN_TILES && !x3_takes) ASSERT_EQ((size_t)0, dif); /* FP32: its bits */
                if (x3 && !x3_takes) ASSERT_EQ((size_t)0, dif); /* TF32X3 declines: FP32's product, FP32's bits */
                differs += dif;
            }
            printf("    %s %s: %lu outputs differ from FP32's bits (%lu on the own tensor-core path)\n",
                   path ? "cuBLAS" : "own", tc_prec_name(prec), (unsigned long)differs, (unsigned long)tc_outputs);
            if (x3) { /* every product it takes, in both builds, and FP32's accuracy: the RMS error within twice
                         FP32's (the tensor cores' own sums over the whole K measured 20 times FP32's) */
                printf("    %s TF32X3: relative RMS error %.3g, FP32's %.3g\n", path ? "cuBLAS" : "own",
                       sqrt(e2[0] / e2[2]), sqrt(e2[1] / e2[2]));
                ASSERT_EQ(x3_want, mnistcu__cu(g)->x3_products - x3_before);
                ASSERT(x3_want > 0);
                ASSERT(e2[2] > 0.0 && e2[0] <= 4.0 * e2[1]);
                ASSERT(differs > 0);
            } else if (!path)
                /* the own kernels: most tensor-core outputs are not FP32's bits; cuBLAS may keep FP32 kernels for
                   some shapes, but not one output differing would mean it never took the reduced-precision call */
                ASSERT(differs > tc_outputs / 2);
            else
                ASSERT(differs > 0);
            mnistcu_ctx_destroy(g);
            mnistcu_ctx_destroy(g32);
        }
    }
    PASS();
}

/* The tensor-core kernels on small products (the least tiles they take; K split into slices; on an
   sm_90 GPU the last two on the warp-group kernel in TF32 and TF32X3, in 128 x 128 and 128 x 64 tiles),
   each precision, plain and fused: small enough for racecheck. */
TEST cuda_gemm_reduced_precision_small(void)
{
    static const size_t dims[][3] = {{256, 256, 40}, {128, 576, 1100}, {512, 512, 256}, {256, 256, 2048}};
    int prec, i, ta, tb;
    if (!tc_has_tensor_cores()) SKIPm("no tensor cores (sm_80+): TF32 and BF16 resolve to FP32");
    for (prec = MNISTCU_PRECISION_TF32; prec <= MNISTCU_PRECISION_TF32X3; ++prec) {
        mnistcu_ctx *g = tc_ctx_prec(MNISTCU_GEMM_OWN, (mnistcu_precision)prec);
        mnistcu_ctx *g32 = tc_ctx_prec(MNISTCU_GEMM_OWN, MNISTCU_PRECISION_FP32);
        double u = tc_prec_unit(prec);
        char msg[320];
        ASSERT(g && g32);
        for (i = 0; i < (int)(sizeof dims / sizeof dims[0]); ++i) {
            size_t dif = 0, x3_before = mnistcu__cu(g)->x3_products, wg_before = mnistcu__cu(g)->wg_products;
            for (ta = 0; ta < 2; ++ta)
                for (tb = 0; tb < 2; ++tb)
                    if (!tc_gemm_prec_case(g, g32, u, ta, tb, dims[i][0], dims[i][1], dims[i][2], 0, &dif, NULL, msg,
                                           sizeof msg))
                        FAILm(msg);
            if (!tc_gemm_prec_case(g, g32, u, 0, 1, dims[i][0], dims[i][1], dims[i][2], MNISTCU_ACT_RELU, &dif, NULL,
                                   msg, sizeof msg))
                FAILm(msg);
            /* the last two on the warp-group kernel on an sm_90 GPU, in TF32 and TF32X3 */
            if (mnistcu__cu(g)->wg && prec != MNISTCU_PRECISION_BF16)
                ASSERT_EQ(i >= 2 ? (size_t)5 : (size_t)0, mnistcu__cu(g)->wg_products - wg_before);
            if (prec == MNISTCU_PRECISION_TF32X3) /* every one its kernel's (the second with K split) */
                ASSERT_EQ((size_t)5, mnistcu__cu(g)->x3_products - x3_before);
            else
                ASSERT(dif > 5 * dims[i][0] * dims[i][1] / 2); /* most outputs are not FP32's bits */
        }
        mnistcu_ctx_destroy(g);
        mnistcu_ctx_destroy(g32);
    }
    PASS();
}

/* TF32X3 on Hopper's warp-group kernel (mnistcu__k_gemm_wg) and, forced, on the mma.sync one
   (mnistcu__k_gemm_x3), the same products: every output within the bound above, the RMS error within twice
   FP32's, and each kernel took exactly the products it should. The shapes: edge tiles in m and n, K ending
   inside a stage and inside a slice, K in 2, 5 and 8 slices, and, with the multiprocessors counted as 16,
   all in one slice (the bias and activation then in the product's kernel). Then TF32 (one part) on the
   warp-group kernel and, forced off it, on mnistcu__k_gemm_tc: the bound with TF32's unit, and the RMS
   error within 2^-10.5 of the products' (TF32 rounds each operand to within 2^-11 of it) and far above
   FP32's. */
TEST cuda_gemm_tf32x3_both_kernels(void)
{
    /* 128 x 128 tiles; the last two, 128 x 64 (fewer than 16 tiles of 128 x 128 over a long K), with edges */
    static const size_t dims[][3] = {{200, 1024, 300}, {260, 1036, 300}, {256, 1024, 784}, {1024, 512, 256},
                                     {128, 2048, 1024}, {128, 576, 2048}, {196, 300, 2100}};
    mnistcu_ctx *g, *g32;
    int wg, i, ta, tb, sms, one, x3;
    char msg[320];
    if (!tc_has_tensor_cores()) SKIPm("no tensor cores (sm_80+): TF32X3 resolves to FP32");
    g32 = tc_ctx_prec(MNISTCU_GEMM_OWN, MNISTCU_PRECISION_FP32);
    ASSERT(g32);
    for (x3 = 1; x3 >= 0; --x3) {
        const int prec = x3 ? MNISTCU_PRECISION_TF32X3 : MNISTCU_PRECISION_TF32;
        g = tc_ctx_prec(MNISTCU_GEMM_OWN, (mnistcu_precision)prec);
        ASSERT(g);
        if (!mnistcu__cu(g)->wg) {
            mnistcu_ctx_destroy(g);
            mnistcu_ctx_destroy(g32);
            SKIPm("the warp-group kernel needs an sm_90 GPU and a build for sm_90a");
        }
        sms = mnistcu__cu(g)->sms;
        for (one = 0; one < 2; ++one)
            for (wg = 1; wg >= 0; --wg) {
                const size_t x3_before = mnistcu__cu(g)->x3_products, wg_before = mnistcu__cu(g)->wg_products;
                double e2[3] = {0.0, 0.0, 0.0};
                size_t dif = 0, want = 0;
                mnistcu__cu(g)->wg = wg;
                mnistcu__cu(g)->sms = one ? 16 : sms; /* 16 tiles or more: one slice */
                for (i = 0; i < (int)(sizeof dims / sizeof dims[0]); ++i) {
                    mnistcu__cu(g)->wg = 1;
                    ASSERT_EQ(i < 5 ? 128 : 64, mnistcu__wg_takes(mnistcu__cu(g), dims[i][0], dims[i][1], dims[i][2]));
                    mnistcu__cu(g)->wg = wg;
                    for (ta = 0; ta < 2; ++ta)
                        for (tb = 0; tb < 2; ++tb)
                            if (!tc_gemm_prec_case(g, g32, tc_prec_unit(prec), ta, tb, dims[i][0], dims[i][1],
                                                   dims[i][2], 0, &dif, e2, msg, sizeof msg))
                                FAILm(msg);
                    if (!tc_gemm_prec_case(g, g32, tc_prec_unit(prec), 0, 1, dims[i][0], dims[i][1], dims[i][2],
                                           MNISTCU_ACT_RELU, &dif, NULL, msg, sizeof msg))
                        FAILm(msg);
                    want += 5;
                }
                printf("    %s on the %s kernel%s: relative RMS error %.3g, FP32's %.3g\n", x3 ? "TF32X3" : "TF32",
                       wg ? "warp-group" : x3 ? "mma.sync" : "wmma", one ? ", one slice" : "", sqrt(e2[0] / e2[2]),
                       sqrt(e2[1] / e2[2]));
                ASSERT_EQ(x3 ? want : (size_t)0, mnistcu__cu(g)->x3_products - x3_before);
                ASSERT_EQ(wg ? want : (size_t)0, mnistcu__cu(g)->wg_products - wg_before);
                if (x3)
                    ASSERT(e2[2] > 0.0 && e2[0] <= 4.0 * e2[1]);
                else
                    ASSERT(e2[2] > 0.0 && e2[0] <= ldexp(1.0, -21) * e2[2] && e2[0] > 16.0 * e2[1]);
                ASSERT(dif > 0);
            }
        mnistcu_ctx_destroy(g);
    }
    mnistcu_ctx_destroy(g32);
#ifdef MNISTCU_CUBLAS
    g = tc_ctx_prec(MNISTCU_GEMM_CUBLAS, MNISTCU_PRECISION_TF32); /* TF32 keeps cuBLAS's products there */
    ASSERT(g);
    ASSERT_EQ(0, mnistcu__wg_ok(mnistcu__cu(g), 512, 1024, 1024, (const float *)NULL, 1024, (const float *)NULL, 1024,
                                (const float *)NULL, 1024));
    mnistcu__cu(g)->use_cublas = 0;
    ASSERT(mnistcu__wg_ok(mnistcu__cu(g), 512, 1024, 1024, (const float *)NULL, 1024, (const float *)NULL, 1024,
                          (const float *)NULL, 1024));
    mnistcu__cu(g)->use_cublas = 1;
    mnistcu_ctx_destroy(g);
#endif
    PASS();
}

/* Training with TF32, BF16 or TF32X3 products follows FP32's loss closely (TF32X3 closer), on an MLP and
   on a CNN whose second convolution goes through im2col and the product (more
   than 16 input channels), for the own kernels and cuBLAS; it is not FP32 (the
   weights differ) and it repeats to the bit; the fused MLP kernel declines it. */
static int tc_prec_train(mnistcu_gemm gemm, mnistcu_precision prec, const char *spec, int steps, double *loss,
                         float **params, size_t *np, size_t *x3_products)
{
    mnistcu_ctx *g = tc_ctx_prec(gemm, prec);
    mnistcu_model *m = NULL;
    tu_rng rng = tu_rng_make(11);
    float *x = tu_random_floats(&rng, 32 * 100, -1, 1);
    int32_t labels[32];
    mnistcu_optim_desc o;
    int i, ok = g != NULL;
    memset(&o, 0, sizeof o);
    o.learning_rate = 0.05f;
    o.momentum = 0.9f;
    for (i = 0; i < 32; ++i) labels[i] = (int32_t)(i % 10);
    ok = ok && mnistcu_model_create_spec(g, spec, &m) == MNISTCU_OK;
    for (i = 0; ok && i < steps; ++i)
        ok = mnistcu_model_compute_grads(m, x, labels, 32, loss) == MNISTCU_OK &&
             mnistcu_model_apply_grads(m, &o) == MNISTCU_OK;
    if (ok) {
        *np = m->num_params;
        *params = tc_down(m->params, *np);
        if (x3_products) *x3_products = mnistcu__cu(g)->x3_products;
    } else if (g) {
        printf("    %s\n", mnistcu_ctx_error(g));
    }
    free(x);
    mnistcu_ctx_destroy(g);
    return ok;
}

TEST cuda_training_reduced_precision_close_to_fp32(void)
{
    static const char *const specs[2] = {"1x10x10 flatten dense1024 relu dense256 relu dense10",
                                         "1x10x10 conv3x3x20:p=1 relu conv3x3x8 relu maxpool2 flatten dense32 relu dense10"};
    int path, prec, sp;
    if (!tc_has_tensor_cores()) SKIPm("no tensor cores (sm_80+): TF32 and BF16 resolve to FP32");
    for (path = 0; path < 2; ++path) {
        mnistcu_gemm gemm = path ? MNISTCU_GEMM_CUBLAS : MNISTCU_GEMM_OWN;
#ifndef MNISTCU_CUBLAS
        if (path) break;
#endif
        for (sp = 0; sp < 2; ++sp) {
            double l32 = 0.0, first = 0.0;
            float *p32 = NULL;
            size_t n32 = 0;
            ASSERT(tc_prec_train(gemm, MNISTCU_PRECISION_FP32, specs[sp], 1, &first, &p32, &n32, NULL));
            free(p32);
            ASSERT(tc_prec_train(gemm, MNISTCU_PRECISION_FP32, specs[sp], 40, &l32, &p32, &n32, NULL));
            for (prec = MNISTCU_PRECISION_TF32; prec <= MNISTCU_PRECISION_TF32X3; ++prec) {
                double l = 0.0, l2 = 0.0;
                float *p = NULL, *p2 = NULL;
                size_t n = 0, n2 = 0, i, same = 0, x3n = 0;
                ASSERT(tc_prec_train(gemm, (mnistcu_precision)prec, specs[sp], 40, &l, &p, &n, &x3n));
                ASSERT(tc_prec_train(gemm, (mnistcu_precision)prec, specs[sp], 40, &l2, &p2, &n2, NULL));
                printf("    %s %s %s: loss after 40 steps %.6f (FP32 %.6f, first step %.6f)\n", path ? "cuBLAS" : "own",
                       tc_prec_name(prec), sp ? "CNN" : "MLP", l, l32, first);
                ASSERT_EQ(n32, n);
                ASSERT(l32 < 0.5 * first);                   /* FP32 learns */
                ASSERT_IN_RANGE(l32, l, 0.05 * first);       /* and the reduced precision follows it */
                ASSERT_ARRAY_EQ_BITS_F(p, p2, n);            /* repeatable */
                for (i = 0; i < n; ++i) same += memcmp(&p[i], &p32[i], sizeof(float)) == 0;
                if (prec == MNISTCU_PRECISION_TF32X3) {
                    ASSERT_IN_RANGE(l32, l, 0.002 * first); /* FP32's accuracy: far closer than TF32 needs to be */
                    if (!sp) ASSERT(x3n >= 40);             /* the MLP's first layer's products are its kernel's */
                } else if (!path)
                    ASSERT(same < n / 2); /* not FP32 (the own kernels; cuBLAS may keep FP32 kernels) */
                free(p); free(p2);
            }
            free(p32);
        }
    }
    PASS();
}

TEST cuda_elementwise_ops_match_cpu(void)
{
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN), *c = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    tu_rng rng = tu_rng_make(77);
    size_t B = 33, OUT = 37, n = B * OUT;
    int act;
    ASSERT(g && c);
    for (act = MNISTCU_ACT_RELU; act <= MNISTCU_ACT_TANH; ++act) {
        float *y = tu_random_floats(&rng, n, -3, 3), *dz = tu_random_floats(&rng, n, -1, 1);
        float *ref_dz = (float *)malloc(n * sizeof(float)), *got;
        float *dy, *ddz;
        size_t i;
        /* act_backward takes the activation's output: make y a valid output first */
        for (i = 0; i < n; ++i) y[i] = mnistcu__act_f((mnistcu_act)act, y[i]);
        memcpy(ref_dz, dz, n * sizeof(float));
        mnistcu__cpu_act_backward(c, ref_dz, y, n, (mnistcu_act)act);
        dy = tc_up(y, n);
        ddz = tc_up(dz, n);
        mnistcu__k_act_backward<<<mnistcu__blocks(n), MNISTCU__THREADS>>>(ddz, dy, n, act);
        got = tc_down(ddz, n);
        ASSERT_ARRAY_NEAR_F(got, ref_dz, n, 1e-7, TC_MAX_REL);
        free(y); free(dz); free(ref_dz); free(got); cudaFree(dy); cudaFree(ddz);
    }
    { /* a dense layer's gradient finished (times act'(y)) and its bias gradient, column sums with rows in
         order, in one kernel: the CPU's bits for both, on shapes around the kernel's 32 columns per block
         and 128 rows per pass, with and without an activation and a bias */
        static const size_t shapes[][2] = {{33, 37}, {1, 1}, {64, 120}, {128, 32}, {129, 31}, {512, 1024}, {300, 10},
                                           {257, 65}};
        static const mnistcu_act acts[] = {MNISTCU_ACT_IDENTITY, MNISTCU_ACT_RELU, MNISTCU_ACT_SIGMOID, MNISTCU_ACT_TANH};
        size_t k, a;
        for (k = 0; k < sizeof shapes / sizeof shapes[0]; ++k)
            for (a = 0; a < sizeof acts / sizeof acts[0]; ++a) {
                size_t Bk = shapes[k][0], On = shapes[k][1], nk = Bk * On;
                int with_bias = a != 2 || k % 2; /* sigmoid without a bias on half the shapes: the gradient alone */
                float *dz = tu_random_floats(&rng, nk, -1, 1), *y = tu_random_floats(&rng, nk, -1, 1);
                float *ref = (float *)malloc(On * sizeof(float)), *got, *got_dz;
                float *ddz = tc_up(dz, nk), *dy = tc_up(y, nk), *ddb = tc_poisoned(On);
                if (acts[a] != MNISTCU_ACT_IDENTITY) mnistcu__cpu_act_backward(c, dz, y, nk, acts[a]);
                mnistcu__cpu_bias_grad(ref, dz, Bk, On);
                mnistcu__k_bias_grad<<<(unsigned)((On + 31) / 32), 256>>>(ddz, dy, (int)acts[a], (int)Bk, (int)On,
                                                                          with_bias ? ddb : NULL, (float *)NULL,
                                                                          (float *)NULL, (const mnistcu__dyn *)NULL,
                                                                          mnistcu__opt());
                got = tc_down(ddb, On);
                got_dz = tc_down(ddz, nk);
                ASSERT_ARRAY_EQ_BITS_F(got_dz, dz, nk);
                if (with_bias) ASSERT_ARRAY_EQ_BITS_F(got, ref, On);
                else ASSERT(got[0] != got[0]); /* untouched: still the poison */
                if (with_bias && a == 1) { /* the bias's SGD step in the same kernel (bw), against the host's
                    mnistcu__opt_sgd on its gradient (mnistcu__k_optim's operations): plain, the momentum buffer's
                    first step, then momentum with weight decay, dampening and Nesterov */
                    int v;
                    for (v = 0; v < 3; ++v) {
                        mnistcu__opt o;
                        float *bw = tu_random_floats(&rng, On, -1, 1), *bs = tu_random_floats(&rng, On, -1, 1);
                        float *dbw = tc_up(bw, On), *dbs = tc_up(bs, On), *gw, *gs;
                        size_t j;
                        memset(&o, 0, sizeof o);
                        o.kind = MNISTCU_OPTIM_SGD;
                        o.lr = 0.05f;
                        o.has_momentum = v > 0;
                        o.first = v == 1;
                        o.mu = 0.9f;
                        o.cdamp = v == 2 ? 0.75f : 1.0f;
                        o.wd = v == 2 ? 1e-3f : 0.0f;
                        o.nesterov = v == 2;
                        cudaMemcpy(ddz, dz, nk * sizeof(float), cudaMemcpyHostToDevice); /* act' applied */
                        mnistcu__k_bias_grad<<<(unsigned)((On + 31) / 32), 256>>>(
                            ddz, dy, (int)MNISTCU_ACT_IDENTITY, (int)Bk, (int)On, ddb, dbw, o.has_momentum ? dbs : NULL,
                            (const mnistcu__dyn *)NULL, o);
                        ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
                        for (j = 0; j < On; ++j) mnistcu__opt_sgd(&o, j, bw, ref[j], bs);
                        gw = tc_down(dbw, On);
                        gs = tc_down(dbs, On);
                        ASSERT_ARRAY_EQ_BITS_F(gw, bw, On);
                        ASSERT_ARRAY_EQ_BITS_F(gs, bs, On); /* set on the first step, untouched without momentum */
                        free(bw); free(bs); free(gw); free(gs); cudaFree(dbw); cudaFree(dbs);
                    }
                }
                free(dz); free(y); free(ref); free(got); free(got_dz); cudaFree(ddz); cudaFree(dy); cudaFree(ddb);
            }
    }
    { /* every loss with gradient, loss, predictions; labels and float targets */
        size_t C = 10, Bs = 33;
        float *z = tu_random_floats(&rng, Bs * C, -8, 8), *t = tu_random_floats(&rng, Bs * C, 0, 1);
        float g_ref[330], l_ref[33], *gg, *gl, *dt = tc_up(t, Bs * C);
        int32_t lab[33], p_ref[33], p_got[33], *dlab, *dpred;
        float *dz_ = tc_up(z, Bs * C), *dg = tc_poisoned(Bs * C), *dl = tc_poisoned(Bs);
        size_t i;
        int v;
        for (i = 0; i < Bs; ++i) lab[i] = (int32_t)(tu_next(&rng) % C);
        cudaMalloc((void **)&dlab, sizeof lab);
        cudaMalloc((void **)&dpred, sizeof lab);
        cudaMemcpy(dlab, lab, sizeof lab, cudaMemcpyHostToDevice);
        for (v = 0; v < 9; ++v) {
            mnistcu__lossp lp;
            int targets = v == 2 || v == 4 || v == 6;
            float scale = v == 5 ? 1.0f : 1.0f / (float)Bs;
            memset(&lp, 0, sizeof lp);
            lp.kind = v < 3 ? MNISTCU_LOSS_SOFTMAX_CE : v < 5 ? MNISTCU_LOSS_MSE : v < 7 ? MNISTCU_LOSS_BCE
                                                                                       : MNISTCU_LOSS_HINGE;
            lp.smoothing = v == 1 || v == 2 ? 0.1f : 0.0f;
            lp.sum = v == 5;
            lp.margin = v == 8 ? 0.5f : 1.0f;
            lp.p = v == 8 ? 2 : 1;
            mnistcu__cpu_loss(c, &lp, z, lab, targets ? t : NULL, Bs, C, scale, g_ref, l_ref, p_ref);
            mnistcu__k_loss<<<1, MNISTCU__THREADS>>>(lp, dz_, dlab, targets ? dt : NULL, (int)Bs, (int)C, scale, dg, dl,
                                                     dpred);
            gg = tc_down(dg, Bs * C);
            gl = tc_down(dl, Bs);
            cudaMemcpy(p_got, dpred, sizeof p_got, cudaMemcpyDeviceToHost);
            ASSERT_ARRAY_NEAR_F(gg, g_ref, Bs * C, 1e-7, TC_MAX_REL);
            ASSERT_ARRAY_NEAR_F(gl, l_ref, Bs, 1e-6, TC_MAX_REL);
            ASSERT_MEM_EQ(p_ref, p_got, sizeof p_ref);
            free(gg); free(gl);
        }
        free(z); free(t); cudaFree(dz_); cudaFree(dg); cudaFree(dl); cudaFree(dt); cudaFree(dlab); cudaFree(dpred);
    }
    mnistcu_ctx_destroy(g);
    mnistcu_ctx_destroy(c);
    PASS();
}

/* The augmented batch from the GPU's gather equals the CPU's, bit for bit:
   every transform at once, several samples, steps, a batch order. */
TEST cuda_augment_matches_cpu_bitwise(void)
{
    mnistcu_ctx *c = tu_ctx(MNISTCU_DEVICE_CPU, 1), *g = tc_ctx(MNISTCU_GEMM_OWN);
    tu_rng rng = tu_rng_make(99);
    mnistcu_augment_desc d;
    mnistcu__aug a;
    int H = 28, W = 28, n = 784, B = 7, N = 11, i, k, step;
    uint8_t *img = (uint8_t *)malloc((size_t)N * n), *dimg;
    int32_t lab[11], *dlab, *dlab_out, work[4 * 784];
    uint32_t idx[7] = {3, 10, 0, 7, 7, 1, 5}, *didx;
    float cpu[7 * 784], gpu[7 * 784], *dx, *dt_unused = NULL;
    ASSERT(c && g);
    for (i = 0; i < N * n; ++i) img[i] = (uint8_t)(tu_next(&rng) % 7 == 0 ? tu_next(&rng) % 256 : 0);
    for (i = 0; i < N; ++i) lab[i] = i % 10;
    cudaMalloc((void **)&dimg, (size_t)N * n);
    cudaMalloc((void **)&dlab, sizeof lab);
    cudaMalloc((void **)&dlab_out, sizeof lab);
    cudaMalloc((void **)&didx, sizeof idx);
    cudaMalloc((void **)&dx, sizeof gpu);
    cudaMemcpy(dimg, img, (size_t)N * n, cudaMemcpyHostToDevice);
    cudaMemcpy(dlab, lab, sizeof lab, cudaMemcpyHostToDevice);
    cudaMemcpy(didx, idx, sizeof idx, cudaMemcpyHostToDevice);
    for (k = 0; k < 3; ++k) {
        memset(&d, 0, sizeof d);
        d.rotate = k == 1 ? 0.0f : 20.0f;
        d.scale = 0.15f;
        d.translate = 2.5f;
        d.elastic_alpha = k == 2 ? 0.0f : 34.0f;
        d.elastic_sigma = k == 1 ? 3.0f : 0.0f;
        mnistcu__aug_make(&d, 0x1234567890abcdefull + (uint64_t)k, &a);
        for (step = 0; step < 3; ++step) {
            uint64_t t = (uint64_t)step * 1000003u + ((uint64_t)k << 33);
            for (i = 0; i < B; ++i)
                mnistcu__cpu_augment(&a, img + (size_t)idx[i] * n, H, W, (uint32_t)i, t, 0.0078125f, -0.42f,
                                     cpu + (size_t)i * n, work);
            mnistcu__k_gather_augment<<<B, MNISTCU__THREADS, a.elastic ? 16 * n : 0>>>(
                a, dimg, dlab, dt_unused, 0, didx, 0, H, W, t, 0.0078125f, -0.42f, dx, dlab_out, dt_unused, NULL);
            ASSERT_EQ(cudaSuccess, cudaMemcpy(gpu, dx, sizeof gpu, cudaMemcpyDeviceToHost));
            ASSERT_MEM_EQ(cpu, gpu, sizeof cpu);
        }
    }
    free(img);
    cudaFree(dimg); cudaFree(dlab); cudaFree(dlab_out); cudaFree(didx); cudaFree(dx);
    mnistcu_ctx_destroy(g);
    mnistcu_ctx_destroy(c);
    PASS();
}

/* Every optimizer and option: three steps of the kernel against the CPU loop. */
TEST cuda_optimizers_match_cpu(void)
{
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN), *c = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    tu_rng rng = tu_rng_make(8);
    size_t n = 100003, slots = 3;
    mnistcu_optim_desc cases[12];
    int variant;
    ASSERT(g && c);
    memset(cases, 0, sizeof cases);
    cases[0].kind = MNISTCU_OPTIM_SGD;
    cases[1].kind = MNISTCU_OPTIM_SGD; cases[1].momentum = 0.9f;
    cases[2].kind = MNISTCU_OPTIM_SGD; cases[2].momentum = 0.9f; cases[2].nesterov = 1; cases[2].weight_decay = 0.01f;
    cases[3].kind = MNISTCU_OPTIM_SGD; cases[3].momentum = 0.8f; cases[3].dampening = 0.3f;
    cases[4].kind = MNISTCU_OPTIM_ADAM;
    cases[5].kind = MNISTCU_OPTIM_ADAM; cases[5].amsgrad = 1; cases[5].weight_decay = 0.02f;
    cases[6].kind = MNISTCU_OPTIM_ADAMW; cases[6].weight_decay = 0.05f;
    cases[7].kind = MNISTCU_OPTIM_RMSPROP;
    cases[8].kind = MNISTCU_OPTIM_RMSPROP; cases[8].momentum = 0.9f;
    cases[9].kind = MNISTCU_OPTIM_RMSPROP; cases[9].centered = 1; cases[9].momentum = 0.5f; cases[9].weight_decay = 0.01f;
    cases[10].kind = MNISTCU_OPTIM_ADAGRAD; cases[10].lr_decay = 0.1f;
    cases[11].kind = MNISTCU_OPTIM_ADAGRAD; cases[11].initial_accumulator_value = 0.1f; cases[11].weight_decay = 0.01f;
    for (variant = 0; variant < 12; ++variant) {
        mnistcu_optim_desc o;
        float *w = tu_random_floats(&rng, n, -1, 1), *gr = tu_random_floats(&rng, n, -1, 1);
        float *v = tu_random_floats(&rng, slots * n, 0.5f, 1), *dw, *dg, *dv;
        float *gw, *gv;
        mnistcu__segs all;
        mnistcu__opt_memo mm;
        char msg[64];
        size_t i;
        int step;
        ASSERT_EQ(MNISTCU_OK, mnistcu__resolve_optim(c, &cases[variant], &o));
        for (i = 0; i < n; ++i) v[2 * n + i] *= 0.1f; /* RMSprop centered: grad_avg^2 below square_avg */
        dw = tc_up(w, n), dg = tc_up(gr, n), dv = tc_up(v, slots * n);
        memset(&all, 0, sizeof all);
        all.count = 1, all.total = all.len[0] = n;
        memset(&mm, 0, sizeof mm);
        for (step = 1; step <= 3; ++step) {
            mnistcu__opt k;
            mnistcu__opt_make(&o, (uint64_t)step, n, &k, &mm);
            mnistcu__cpu_optim(c, &k, w, gr, v, 1.0f);
            mnistcu__k_optim<<<mnistcu__blocks(n), MNISTCU__THREADS>>>(k, dw, dg, dv, NULL, NULL, all);
        }
        gw = tc_down(dw, n);
        gv = tc_down(dv, slots * n);
        snprintf(msg, sizeof msg, "optimizer case %d", variant);
        if (!asserts_array_near_f(gw, w, n, 1e-6, TC_MAX_REL, msg, "CPU weights") ||
            !asserts_array_near_f(gv, v, slots * n, 1e-6, TC_MAX_REL, msg, "CPU state"))
            FAILm(asserts_msg);
        free(w); free(gr); free(v); free(gw); free(gv); cudaFree(dw); cudaFree(dg); cudaFree(dv);
    }
    mnistcu_ctx_destroy(g);
    mnistcu_ctx_destroy(c);
    PASS();
}

TEST cuda_step_stats_and_gather(void)
{
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN);
    tu_rng rng = tu_rng_make(21);
    size_t B = 300, i;
    float *loss = tu_random_floats(&rng, B, 0, 5), *dl = tc_up(loss, B);
    int32_t pred[300], lab[300], *dp, *dlab;
    double *dout, out[2], ref_l = 0.0, ref_c = 0.0;
    ASSERT(g);
    for (i = 0; i < B; ++i) {
        pred[i] = (int32_t)(tu_next(&rng) % 3);
        lab[i] = (int32_t)(tu_next(&rng) % 3);
        ref_l += loss[i];
        ref_c += pred[i] == lab[i];
    }
    cudaMalloc((void **)&dp, sizeof pred);
    cudaMalloc((void **)&dlab, sizeof lab);
    cudaMalloc((void **)&dout, sizeof out);
    cudaMemcpy(dp, pred, sizeof pred, cudaMemcpyHostToDevice);
    cudaMemcpy(dlab, lab, sizeof lab, cudaMemcpyHostToDevice);
    mnistcu__k_step_stats<<<1, MNISTCU__THREADS>>>(dl, dp, dlab, (int)B, dout, dout + 1, NULL);
    cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
    ASSERT_NEAR(out[0], ref_l, 1e-9, 1e-12);
    ASSERT_EQ((long)ref_c, (long)out[1]);
    { /* the training step's loss and statistics in one block: the bits of the loss kernel then the
         statistics kernel, for batches below, at and above the block's width */
        static const int batches[] = {1, 33, 256, 257, 300};
        const int C = 10;
        mnistcu__lossp lp;
        size_t k;
        memset(&lp, 0, sizeof lp);
        lp.kind = MNISTCU_LOSS_SOFTMAX_CE;
        lp.smoothing = 0.1f;
        for (k = 0; k < sizeof batches / sizeof batches[0]; ++k) {
            int Bk = batches[k];
            float *z = tu_random_floats(&rng, (size_t)Bk * C, -6, 6), *dz = tc_up(z, (size_t)Bk * C);
            float *g1 = tc_poisoned((size_t)Bk * C), *g2 = tc_poisoned((size_t)Bk * C);
            float *l1 = tc_poisoned((size_t)Bk), *l2 = tc_poisoned((size_t)Bk), *h1, *h2;
            int32_t *p1, *p2;
            double *o1, *o2, r1[2], r2[2];
            for (i = 0; i < (size_t)Bk; ++i) lab[i] = (int32_t)(tu_next(&rng) % C);
            cudaMemcpy(dlab, lab, (size_t)Bk * sizeof(int32_t), cudaMemcpyHostToDevice);
            cudaMalloc((void **)&p1, (size_t)Bk * sizeof(int32_t));
            cudaMalloc((void **)&p2, (size_t)Bk * sizeof(int32_t));
            cudaMalloc((void **)&o1, 2 * sizeof(double));
            cudaMalloc((void **)&o2, 2 * sizeof(double));
            mnistcu__k_loss<<<mnistcu__blocks((size_t)Bk), MNISTCU__THREADS>>>(lp, dz, dlab, NULL, Bk, C, 1.0f / Bk, g1,
                                                                               l1, p1);
            mnistcu__k_step_stats<<<1, MNISTCU__THREADS>>>(l1, p1, dlab, Bk, o1, o1 + 1, NULL);
            mnistcu__k_loss_stats<<<1, MNISTCU__THREADS>>>(lp, dz, dlab, NULL, Bk, C, 1.0f / Bk, g2, l2, p2, o2, o2 + 1,
                                                           NULL);
            cudaMemcpy(r1, o1, sizeof r1, cudaMemcpyDeviceToHost);
            cudaMemcpy(r2, o2, sizeof r2, cudaMemcpyDeviceToHost);
            ASSERT_MEM_EQ(r1, r2, sizeof r1);
            h1 = tc_down(g1, (size_t)Bk * C);
            h2 = tc_down(g2, (size_t)Bk * C);
            ASSERT_ARRAY_EQ_BITS_F(h1, h2, (size_t)Bk * C);
            free(h1); free(h2);
            h1 = tc_down(l1, (size_t)Bk);
            h2 = tc_down(l2, (size_t)Bk);
            ASSERT_ARRAY_EQ_BITS_F(h1, h2, (size_t)Bk);
            free(h1); free(h2); free(z);
            cudaFree(dz); cudaFree(g1); cudaFree(g2); cudaFree(l1); cudaFree(l2);
            cudaFree(p1); cudaFree(p2); cudaFree(o1); cudaFree(o2);
        }
    }
    { /* the batch from bytes, four or sixteen features a thread, against one a thread: the same bits, labels
         too; the step's start (beg) in each width */
        static const int shapes[][3] = {{300, 784, 0}, {300, 784, 1}, {7, 20, 0}, {64, 4, 0}, {9, 48, 1}};
        const size_t count = 500;
        size_t k;
        for (k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
            const int Bk = shapes[k][0], F = shapes[k][1], wide = shapes[k][2], V = wide ? 16 : 4;
            const size_t nb = count * (size_t)F, nx = (size_t)Bk * F, off = 37;
            uint8_t *bytes = (uint8_t *)malloc(nb), *dbytes;
            uint32_t *perm = (uint32_t *)malloc(count * sizeof(uint32_t)), *dperm;
            int32_t *labs = (int32_t *)malloc(count * sizeof(int32_t)), *dlabs, *l1, *l2;
            float *x1 = tc_poisoned(nx), *x2 = tc_poisoned(nx), *h1, *h2;
            int32_t hl1[300], hl2[300];
            for (i = 0; i < nb; ++i) bytes[i] = (uint8_t)(tu_next(&rng) >> 56);
            for (i = 0; i < count; ++i) perm[i] = (uint32_t)((i * 211 + 5) % count), labs[i] = (int32_t)(i % 10);
            cudaMalloc((void **)&dbytes, nb);
            cudaMalloc((void **)&dperm, count * sizeof(uint32_t));
            cudaMalloc((void **)&dlabs, count * sizeof(int32_t));
            cudaMalloc((void **)&l1, (size_t)Bk * sizeof(int32_t));
            cudaMalloc((void **)&l2, (size_t)Bk * sizeof(int32_t));
            cudaMemcpy(dbytes, bytes, nb, cudaMemcpyHostToDevice);
            cudaMemcpy(dperm, perm, count * sizeof(uint32_t), cudaMemcpyHostToDevice);
            cudaMemcpy(dlabs, labs, count * sizeof(int32_t), cudaMemcpyHostToDevice);
            ASSERT(mnistcu__gather4_ok(dbytes, NULL, (size_t)F, x2));
            ASSERT_EQ(F % 16 == 0, mnistcu__gather_wide(dbytes, (size_t)F));
            mnistcu__k_gather<<<mnistcu__blocks(nx), MNISTCU__THREADS>>>(dbytes, NULL, dlabs, NULL, 0, dperm, off, Bk, F,
                                                                        1.0f / 255.0f, -0.1307f, x1, l1, NULL, NULL);
            mnistcu__k_gather4<<<mnistcu__blocks(nx / V), MNISTCU__THREADS>>>(dbytes, dlabs, dperm, off, Bk, F,
                                                                             1.0f / 255.0f, -0.1307f, x2, l2, NULL,
                                                                             NULL, 0, wide);
            ASSERT_EQ(cudaSuccess, cudaGetLastError());
            h1 = tc_down(x1, nx), h2 = tc_down(x2, nx);
            ASSERT_ARRAY_EQ_BITS_F(h1, h2, nx);
            if (k < 2 || k == 4) { /* the step's start in the gather (beg): the cursor's entry's offset where dyn
                                      is given, the entry copied to [cap], the cursor moved on, the ticket back to 0;
                                      twice; in one block and in several */
                enum { CAP = 3 };
                mnistcu__dyn hd[CAP + 1], back[CAP + 1], *dd;
                unsigned long long ctl[2] = {1, 0}, bctl[2];
                const size_t bytes = (CAP + 1) * sizeof(mnistcu__dyn) + sizeof ctl;
                float *h3;
                int pass;
                memset(hd, 0, sizeof hd);
                for (i = 0; i < CAP; ++i) hd[i].offset = i == 1 ? off : 100 + i, hd[i].slot = 7 + i, hd[i].step = 40 + i;
                cudaMalloc((void **)&dd, bytes);
                cudaMemcpy(dd, hd, sizeof hd, cudaMemcpyHostToDevice);
                cudaMemcpy((char *)dd + sizeof hd, ctl, sizeof ctl, cudaMemcpyHostToDevice);
                for (pass = 0; pass < 2; ++pass) {
                    /* pass 0 replayed (the offset argument, 0, ignored), pass 1 launched (the argument's) */
                    cudaMemset(x2, 0xff, nx * sizeof(float));
                    mnistcu__k_gather4<<<mnistcu__blocks(nx / V), MNISTCU__THREADS>>>(
                        dbytes, dlabs, dperm, pass == 0 ? (size_t)0 : off, Bk, F, 1.0f / 255.0f, -0.1307f, x2, l2,
                        pass == 0 ? dd + CAP : NULL, dd, (size_t)CAP, wide);
                    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
                    h3 = tc_down(x2, nx);
                    ASSERT_ARRAY_EQ_BITS_F(h1, h3, nx);
                    free(h3);
                    cudaMemcpy(back, dd, sizeof back, cudaMemcpyDeviceToHost);
                    cudaMemcpy(bctl, (char *)dd + sizeof hd, sizeof bctl, cudaMemcpyDeviceToHost);
                    ASSERT_EQ(0, memcmp(&back[CAP], &hd[1 + pass], sizeof(mnistcu__dyn)));
                    ASSERT_EQ((unsigned long long)(2 + pass), bctl[0]);
                    ASSERT_EQ((unsigned long long)0, bctl[1]);
                }
                cudaFree(dd);
            }
            cudaMemcpy(hl1, l1, (size_t)Bk * sizeof(int32_t), cudaMemcpyDeviceToHost);
            cudaMemcpy(hl2, l2, (size_t)Bk * sizeof(int32_t), cudaMemcpyDeviceToHost);
            ASSERT_MEM_EQ(hl1, hl2, (size_t)Bk * sizeof(int32_t));
            for (i = 0; i < (size_t)Bk; ++i) ASSERT_EQ(labs[perm[off + i]], hl2[i]);
            free(h1); free(h2); free(bytes); free(perm); free(labs);
            cudaFree(x1); cudaFree(x2); cudaFree(dbytes); cudaFree(dperm); cudaFree(dlabs); cudaFree(l1); cudaFree(l2);
        }
    }
    free(loss); cudaFree(dl); cudaFree(dp); cudaFree(dlab); cudaFree(dout);
    mnistcu_ctx_destroy(g);
    PASS();
}

/* ---- whole-model parity ------------------------------------------------------------- */
static mnistcu_dataset *tc_synthetic(mnistcu_ctx *ctx, size_t n, size_t F, int classes, uint64_t seed)
{
    tu_rng rng = tu_rng_make(seed);
    float *x = tu_random_floats(&rng, n * F, 0, 1);
    int32_t *y = (int32_t *)malloc(n * sizeof(int32_t));
    mnistcu_dataset *ds = NULL;
    size_t i, j, m = (size_t)classes < F ? (size_t)classes : F;
    for (i = 0; i < n; ++i) { /* a learnable rule: the class of the largest of the first `classes` features
                                 (of all F where there are fewer) */
        size_t best = 0;
        for (j = 1; j < m; ++j)
            if (x[i * F + j] > x[i * F + best]) best = j;
        y[i] = (int32_t)best;
    }
    mnistcu_dataset_create(ctx, x, y, n, F, classes, &ds);
    free(x);
    free(y);
    return ds;
}

typedef struct tc_curve { double loss[256]; int n; } tc_curve;

static int tc_record(void *user, const mnistcu_progress *p)
{
    tc_curve *c = (tc_curve *)user;
    if (c->n < 256) c->loss[c->n++] = p->train_loss;
    return 0;
}

/* Trains 784-100-37-10 (hidden activation act) for 200 steps of batch B on ctx;
   returns the params (malloc'ed) and the loss curve. */
static float *tc_train_act(mnistcu_ctx *ctx, mnistcu_act act, size_t B, float momentum, tc_curve *curve, size_t *np)
{
    mnistcu_dataset *ds = tc_synthetic(ctx, 200 * B, 784, 10, 99);
    mnistcu_model *m = NULL;
    mnistcu_model_desc md;
    mnistcu_train_desc td;
    float *p;
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = (int)B;
    td.optim.learning_rate = 0.05f;
    td.optim.momentum = momentum;
    td.progress_every = 1;
    td.progress = tc_record;
    td.progress_user = curve;
    curve->n = 0;
    memset(&md, 0, sizeof md);
    md.sizes[0] = 784;
    md.sizes[1] = 100;
    md.sizes[2] = 37;
    md.sizes[3] = 10;
    md.hidden_act = act;
    if (!ds || mnistcu_model_create(ctx, &md, &m) || mnistcu_train(m, ds, &td, NULL)) return NULL;
    *np = mnistcu_model_num_params(m);
    p = (float *)malloc(*np * sizeof(float));
    mnistcu_model_get_params(m, p, *np);
    return p;
}

static float *tc_train(mnistcu_ctx *ctx, const char *spec, size_t B, float momentum, tc_curve *curve, size_t *np)
{
    (void)spec; /* always 784-100-37-10 */
    return tc_train_act(ctx, MNISTCU_ACT_RELU, B, momentum, curve, np);
}

/* The largest relative gap between the GPU's and the CPU's loss curves over 200
   steps, or +inf if training failed. */
static double tc_curve_gap(mnistcu_gemm path, mnistcu_act act, size_t B, double *param_gap)
{
    mnistcu_ctx *g = tc_ctx(path), *c = tu_ctx(MNISTCU_DEVICE_CPU, 0);
    tc_curve cg, cc;
    size_t np = 0, i;
    float *pg = NULL, *pc = NULL;
    double worst = INFINITY;
    *param_gap = INFINITY;
    if (g && c) {
        /* Plain SGD: momentum would amplify the rounding differences between the
           devices' summation orders and FMA use. */
        pg = tc_train_act(g, act, B, 0.0f, &cg, &np);
        pc = tc_train_act(c, act, B, 0.0f, &cc, &np);
    }
    if (pg && pc && cg.n == 200 && cc.n == 200) {
        worst = 0.0;
        for (i = 0; i < 200; ++i) {
            double rel = fabs(cg.loss[i] - cc.loss[i]) / fabs(cc.loss[i]);
            if (!(rel <= worst)) worst = rel; /* NaN propagates as the worst */
        }
        *param_gap = tc_relerr(pg, pc, np);
    }
    free(pg);
    free(pc);
    mnistcu_ctx_destroy(g);
    mnistcu_ctx_destroy(c);
    return worst;
}

TEST cuda_training_matches_cpu_for_200_steps(void)
{
    static const size_t batches[] = {1, 7, 33};
    static const mnistcu_act acts[] = {MNISTCU_ACT_RELU, MNISTCU_ACT_TANH};
    char msg[256] = "";
    int path, a, ok = 1;
    size_t i;
    printf("\n    loss-curve gap GPU vs CPU, 784-100-37-10, 200 steps (path, act, batch: curve, params)\n");
    for (path = MNISTCU_GEMM_OWN; path <= MNISTCU_GEMM_CUBLAS; ++path) {
#ifndef MNISTCU_CUBLAS
        if (path == MNISTCU_GEMM_CUBLAS) break;
#endif
        for (a = 0; a < 2; ++a)
            for (i = 0; i < 3; ++i) {
                double pgap, gap = tc_curve_gap((mnistcu_gemm)path, acts[a], batches[i], &pgap);
                printf("    %s %s B=%-2lu  %.2e  %.2e\n", path == MNISTCU_GEMM_OWN ? "own   " : "cublas",
                       acts[a] == MNISTCU_ACT_RELU ? "relu" : "tanh", (unsigned long)batches[i], gap, pgap);
                /* Smooth activations must agree to 1e-4 (measured on an H100: about 1e-8).
                   With ReLU a pre-activation within rounding of zero can fall on different
                   sides of the kink on the two devices, a discrete change that no summation
                   order avoids (measured: 2.1e-4 at batch 33, identical for both GPU paths,
                   while tanh stays at 1e-8), so ReLU gets 1e-3. */
                double limit = acts[a] == MNISTCU_ACT_RELU ? 1e-3 : 1e-4;
                if (!(gap <= limit) && ok) {
                    snprintf(msg, sizeof msg, "path %d act %d batch %lu: loss curves differ by %.3g (> %.0e)", path,
                             (int)acts[a], (unsigned long)batches[i], gap, limit);
                    ok = 0;
                }
            }
    }
    if (!ok) FAILm(msg);
    PASS();
}

TEST cuda_two_runs_are_bitwise_identical(void)
{
    int path;
    for (path = MNISTCU_GEMM_OWN; path <= MNISTCU_GEMM_CUBLAS; ++path) {
        mnistcu_ctx *a, *b;
        tc_curve ca, cb;
        size_t np = 0;
        float *pa, *pb;
#ifndef MNISTCU_CUBLAS
        if (path == MNISTCU_GEMM_CUBLAS) break;
#endif
        a = tc_ctx((mnistcu_gemm)path);
        b = tc_ctx((mnistcu_gemm)path);
        ASSERT(a && b);
        pa = tc_train(a, "784-100-37-10", 33, 0.9f, &ca, &np);
        pb = tc_train(b, "784-100-37-10", 33, 0.9f, &cb, &np);
        ASSERT(pa && pb);
        ASSERT_ARRAY_EQ_BITS_F(pa, pb, np);
        free(pa); free(pb);
        mnistcu_ctx_destroy(a);
        mnistcu_ctx_destroy(b);
    }
    PASS();
}

TEST cuda_streaming_equals_resident(void)
{
    mnistcu_ctx_desc d;
    mnistcu_ctx *res = tc_ctx(MNISTCU_GEMM_OWN), *str = NULL;
    tc_curve c1, c2;
    size_t np = 0;
    float *p1, *p2;
    memset(&d, 0, sizeof d);
    d.device = MNISTCU_DEVICE_CUDA;
    d.log_level = MNISTCU_LOG_SILENT;
    d.seed = 1234;
    d.gemm = MNISTCU_GEMM_OWN;
    d.data_mode = MNISTCU_DATA_STREAM;
    ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&str, &d));
    ASSERT(res);
    p1 = tc_train(res, "784-100-37-10", 33, 0.0f, &c1, &np);
    p2 = tc_train(str, "784-100-37-10", 33, 0.0f, &c2, &np);
    ASSERT(p1 && p2);
    ASSERT_ARRAY_EQ_BITS_F(p1, p2, np);
    free(p1); free(p2);
    mnistcu_ctx_destroy(res);
    mnistcu_ctx_destroy(str);
    PASS();
}

/* The two matrix kernels run the same fmaf chain per output: bitwise equal, so
   the shape-based choice between them never changes a result. */
TEST cuda_gemm_kernels_agree_bitwise(void)
{
    /* M, N, K, K slices (grid z), tiny values: products of about 1e-46, which round to -0 or +0 by their
       sign, so a chain that left out the zeros past the end of its slice (up to a multiple of 16: fmaf(0,
       0, -0) is +0) would end at -0 where the other kernel ends at +0 */
    static const int dims[][5] = {{33, 100, 784, 1, 0}, {64, 128, 785, 1, 0}, {7, 37, 16, 1, 0}, {130, 70, 33, 1, 0},
                                  {9, 20, 1, 1, 1}, {19, 21, 301, 3, 1}, {33, 40, 700, 4, 0}, {17, 18, 260, 2, 1}};
    size_t d;
    int ta, tb;
    for (d = 0; d < sizeof dims / sizeof dims[0]; ++d)
        for (ta = 0; ta < 2; ++ta)
            for (tb = 0; tb < 2; ++tb) {
                int M = dims[d][0], N = dims[d][1], K = dims[d][2], S = dims[d][3], lda = ta ? M : K, ldb = tb ? K : N;
                const float scale = dims[d][4] ? 1e-23f : 1.0f;
                tu_rng rng = tu_rng_make((uint64_t)(d * 4 + (size_t)ta * 2 + (size_t)tb));
                float *A = tu_random_floats(&rng, (size_t)M * K, -scale, scale), *B = tu_random_floats(&rng, (size_t)K * N, -scale, scale);
                float *dA = tc_up(A, (size_t)M * K), *dB = tc_up(B, (size_t)K * N);
                float *d64 = tc_poisoned((size_t)S * M * N), *d16 = tc_poisoned((size_t)S * M * N), *h64, *h16;
                dim3 g64((unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64), (unsigned)S),
                    g16((unsigned)((N + 15) / 16), (unsigned)((M + 15) / 16), (unsigned)S);
#define TC_BOTH(TA_, TB_)                                                                                      \
    do {                                                                                                       \
        mnistcu__k_gemm<TA_, TB_, 0><<<g64, 256>>>(M, N, K, dA, lda, dB, ldb, d64, N, NULL, 0);               \
        mnistcu__k_gemm16<TA_, TB_, 0><<<g16, 256>>>(M, N, K, dA, lda, dB, ldb, d16, N, NULL, 0);             \
    } while (0)
                if (!ta && !tb) TC_BOTH(0, 0);
                else if (!ta && tb) TC_BOTH(0, 1);
                else if (ta && !tb) TC_BOTH(1, 0);
                else TC_BOTH(1, 1);
#undef TC_BOTH
                h64 = tc_down(d64, (size_t)S * M * N);
                h16 = tc_down(d16, (size_t)S * M * N);
                ASSERT_ARRAY_EQ_BITS_F(h64, h16, (size_t)S * M * N);
                free(A); free(B); free(h64); free(h16);
                cudaFree(dA); cudaFree(dB); cudaFree(d64); cudaFree(d16);
            }
    PASS();
}

/* The wide-tile kernel against the 64x64 one, bit for bit: the same K slices
   (1, 2, 4; the 64x64 kernel's parts added by mnistcu__k_splitk_sum, the wide
   kernel's by the last slice of each tile to arrive, into a buffer of parts of
   its own, poisoned first), every transposition it takes, each epilogue (none,
   bias + activation, act'(y)), both register budgets, the bias gradient's row
   sums against mnistcu__k_bias_grad, edge tiles in both directions, a row
   stride wider than the output, a width that is not a multiple of 4 (scalar
   stores and sums), tiles of more than one row of blocks, and each product
   run twice, its outputs poisoned again and the arrival counters checked back
   at zero after each. */
static int tc_wide_flags_zero(const int *dflags)
{
    int h[MNISTCU__WIDE_FLAGS], i;
    if (cudaMemcpy(h, dflags, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
    for (i = 0; i < MNISTCU__WIDE_FLAGS; ++i)
        if (h[i] != 0) return 0;
    return 1;
}

TEST cuda_gemm_wide_agrees_bitwise(void)
{
    /* M, N, K, the output's row stride beyond N */
    static const int dims[][4] = {{256, 256, 272, 0}, {132, 196, 52, 4}, {8, 64, 16, 0}, {388, 68, 100, 0},
                                  {136, 70, 260, 3}};
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN);
    size_t d;
    int form, S, fuse, minb, rep, *dflags = NULL;
    float *dpart = NULL, *dpart2 = NULL;
    ASSERT(g != NULL);
    ASSERT_EQ(cudaSuccess, cudaMalloc((void **)&dpart, 4 * 388 * 512 * sizeof(float)));
    ASSERT_EQ(cudaSuccess, cudaMalloc((void **)&dpart2, 4 * 388 * 512 * sizeof(float)));
    ASSERT_EQ(cudaSuccess, cudaMalloc((void **)&dflags, MNISTCU__WIDE_FLAGS * sizeof(int)));
    ASSERT_EQ(cudaSuccess, cudaMemset(dflags, 0, MNISTCU__WIDE_FLAGS * sizeof(int)));
    for (d = 0; d < sizeof dims / sizeof dims[0]; ++d)
        for (form = 0; form < 3; ++form) /* NN, NT, TN */
            for (S = 1; S <= 4; S *= 2)
                for (fuse = 0; fuse < 4; ++fuse) /* 3: bias and ReLU, the kernel made for them */
                    for (minb = fuse == 0 ? 1 : 2; minb <= 2; ++minb) { /* the fused forms run at two blocks */
                        const int ta = form == 2, tb = form == 1, M = dims[d][0], N = dims[d][1], K = dims[d][2];
                        const int ldc = N + dims[d][3], lda = ta ? M : K, ldb = tb ? K : N;
                        const int act = fuse == 1 ? MNISTCU_ACT_TANH : MNISTCU_ACT_RELU;
                        const int rowsum = ta && S == 1 && fuse == 0;
                        const size_t nc = (size_t)M * ldc;
                        tu_rng rng;
                        float *A, *B, *bias, *y, *dA, *dB, *dbias, *dy, *dref, *dw, *dbr, *dbw, *href, *hw;
                        dim3 g64((unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64), (unsigned)S);
                        dim3 gw((unsigned)((N + 63) / 64), (unsigned)(d == 3 ? 1 : (M + 127) / 128), (unsigned)S);
                        mnistcu__wargs p;
                        if (!tb && N % 4) continue; /* B read along N: the kernel asks N % 4 == 0 */
                        rng = tu_rng_make((uint64_t)(d * 100 + (size_t)form * 10 + (size_t)S + 7 * (size_t)fuse));
                        A = tu_random_floats(&rng, (size_t)M * K, -1, 1);
                        B = tu_random_floats(&rng, (size_t)K * N, -1, 1);
                        bias = tu_random_floats(&rng, (size_t)N, -1, 1);
                        y = tu_random_floats(&rng, nc, -1, 1);
                        dA = tc_up(A, (size_t)M * K), dB = tc_up(B, (size_t)K * N), dbias = tc_up(bias, (size_t)N);
                        dy = tc_up(y, nc), dref = tc_poisoned(nc), dw = NULL;
                        dbr = tc_poisoned((size_t)M), dbw = NULL;
                        memset(&p, 0, sizeof p);
                        p.M = M, p.N = N, p.K = K, p.lda = lda, p.ldb = ldb, p.ldc = ldc, p.act = act;
                        p.A = dA, p.B = dB, p.bias = fuse == 1 || fuse == 3 ? dbias : NULL, p.y = fuse == 2 ? dy : NULL;
                        p.part = dpart2, p.flags = dflags;
#define TC_REF(TA_, TB_) mnistcu__k_gemm<TA_, TB_, 0><<<g64, 256>>>(M, N, K, dA, lda, dB, ldb, dpart, N, NULL, 0)
#define TC_WIDE(TA_, TB_, F_)                                                                                 \
    do {                                                                                                      \
        if (minb == 2) mnistcu__k_gemm_wide<TA_, TB_, F_, 64, 16, 2><<<gw, 256>>>(p);                         \
        else mnistcu__k_gemm_wide<TA_, TB_, F_, 64, 16, 1><<<gw, 256>>>(p);                                   \
    } while (0)
                        if (form == 0) TC_REF(0, 0);
                        else if (form == 1) TC_REF(0, 1);
                        else TC_REF(1, 0);
                        mnistcu__k_splitk_sum<<<mnistcu__blocks((size_t)M * N), MNISTCU__THREADS>>>(
                            dpart, S, M, N, dref, ldc, fuse == 1 || fuse == 3 ? dbias : NULL, act, fuse == 3 ? 1 : fuse,
                            fuse == 2 ? dy : NULL);
                        if (rowsum)
                            mnistcu__k_bias_grad<<<(unsigned)((M + 31) / 32), 256>>>(
                                dA, NULL, MNISTCU_ACT_IDENTITY, K, M, dbr, (float *)NULL, (float *)NULL,
                                (const mnistcu__dyn *)NULL, mnistcu__opt());
                        ASSERT_EQ(cudaSuccess, cudaGetLastError());
                        for (rep = 0; rep < 2; ++rep) {
                            /* fresh poison: outputs, and parts the wide kernel must write itself */
                            cudaFree(dw);
                            cudaFree(dbw);
                            dw = tc_poisoned(nc);
                            dbw = tc_poisoned((size_t)M);
                            p.C = dw, p.db = rowsum ? dbw : NULL;
                            ASSERT_EQ(cudaSuccess, cudaMemset(dpart2, 0xff, 4 * 388 * 512 * sizeof(float)));
                            if (form == 0) { if (fuse == 0) TC_WIDE(0, 0, 0); else if (fuse == 1) TC_WIDE(0, 0, 1); else if (fuse == 2) TC_WIDE(0, 0, 2); else TC_WIDE(0, 0, 3); }
                            else if (form == 1) { if (fuse == 0) TC_WIDE(0, 1, 0); else if (fuse == 1) TC_WIDE(0, 1, 1); else if (fuse == 2) TC_WIDE(0, 1, 2); else TC_WIDE(0, 1, 3); }
                            else { if (fuse == 0) TC_WIDE(1, 0, 0); else if (fuse == 1) TC_WIDE(1, 0, 1); else if (fuse == 2) TC_WIDE(1, 0, 2); else TC_WIDE(1, 0, 3); }
                            ASSERT_EQ(cudaSuccess, cudaGetLastError());
                            ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
                            ASSERTm("split counters not back at zero", tc_wide_flags_zero(dflags));
                            href = tc_down(dref, nc);
                            hw = tc_down(dw, nc);
                            ASSERT_ARRAY_EQ_BITS_F(href, hw, nc); /* the stride's gap stays poisoned on both */
                            free(href); free(hw);
                            if (rowsum) {
                                href = tc_down(dbr, (size_t)M);
                                hw = tc_down(dbw, (size_t)M);
                                ASSERT_ARRAY_EQ_BITS_F(href, hw, (size_t)M);
                                free(href); free(hw);
                            }
                        }
#undef TC_REF
#undef TC_WIDE
                        free(A); free(B); free(bias); free(y);
                        cudaFree(dA); cudaFree(dB); cudaFree(dbias); cudaFree(dy); cudaFree(dref); cudaFree(dw);
                        cudaFree(dbr); cudaFree(dbw);
                    }
    cudaFree(dpart);
    cudaFree(dpart2);
    cudaFree(dflags);
    mnistcu_ctx_destroy(g);
    PASS();
}

/* The skinny weight-gradient kernel (>>cuda_skinny) against its stated order,
   bit for bit: each output a chain of fmaf over its slice's rows, the slices'
   sums added in order (computed here on the host with fmaf); its bias
   gradient against mnistcu__k_bias_grad's; its optimizer's step against the
   optimizer's pass on the same gradients (weights and momentum buffers). */
TEST cuda_gemm_skinny_agrees_bitwise(void)
{
    /* M, N, K, the output's row stride beyond N */
    static const int dims[][4] = {{10, 1024, 512, 0}, {16, 33, 1024, 3}, {1, 40, 1, 0}, {7, 100, 37, 0},
                                  {3, 64, 5, 2}, {10, 84, 64, 0}};
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN);
    size_t d;
    ASSERT(g != NULL);
    for (d = 0; d < sizeof dims / sizeof dims[0]; ++d) {
        const int M = dims[d][0], N = dims[d][1], K = dims[d][2], ldc = N + dims[d][3];
        const int R = (K + MNISTCU__SKINNY_SL - 1) / MNISTCU__SKINNY_SL;
        const size_t nc = (size_t)M * ldc, nw = nc + (size_t)M; /* weights then bias, as a layer's arena */
        tu_rng rng = tu_rng_make((uint64_t)(d + 77));
        float *A = tu_random_floats(&rng, (size_t)K * M, -1, 1), *B = tu_random_floats(&rng, (size_t)K * N, -1, 1);
        float *w0 = tu_random_floats(&rng, nw, -1, 1), *v0 = tu_random_floats(&rng, nw, -1, 1);
        float *ref = (float *)malloc(nc * sizeof(float)), *dbh = (float *)malloc((size_t)M * sizeof(float));
        float *dA = tc_up(A, (size_t)K * M), *dB = tc_up(B, (size_t)K * N), *dC, *ddb, *dbr, *h, *h2;
        float *dw1 = tc_up(w0, nw), *dv1 = tc_up(v0, nw), *dw2 = tc_up(w0, nw), *dv2 = tc_up(v0, nw), *dg;
        mnistcu_optim_desc od;
        mnistcu__opt_memo mm;
        mnistcu__wupd u;
        mnistcu__segs todo;
        int c, n, r, s;
        size_t i;
        ASSERT(mnistcu__gemm_skinny_ok(1, 0, (size_t)M, (size_t)N, (size_t)K));
        for (i = 0; i < nc; ++i) ref[i] = tu_nan(); /* the stride's gap stays poisoned */
        for (c = 0; c < M; ++c) {
            float sum = 0.0f;
            for (r = 0; r < K; ++r) sum += A[(size_t)r * M + c];
            dbh[c] = sum;
            for (n = 0; n < N; ++n) {
                float v = 0.0f;
                for (s = 0; s * R < K; ++s) {
                    float a = 0.0f;
                    for (r = s * R; r < (s + 1) * R && r < K; ++r) a = fmaf(A[(size_t)r * M + c], B[(size_t)r * N + n], a);
                    v = s ? v + a : a;
                }
                ref[(size_t)c * ldc + n] = v;
            }
        }
        /* the product alone, then with the bias gradient, against the host and mnistcu__k_bias_grad */
        dC = tc_poisoned(nc);
        ASSERT_EQ(MNISTCU_OK, mnistcu__cuda_gemm(g, 1, 0, (size_t)M, (size_t)N, (size_t)K, dA, (size_t)M, dB, (size_t)N,
                                                 dC, (size_t)ldc, NULL, 0));
        h = tc_down(dC, nc);
        ASSERT_ARRAY_EQ_BITS_F(ref, h, nc);
        free(h);
        cudaFree(dC);
        dC = tc_poisoned(nc), ddb = tc_poisoned((size_t)M), dbr = tc_poisoned((size_t)M);
        ASSERT_EQ(MNISTCU_OK, mnistcu__cuda_gemm_skinny(g, (size_t)M, (size_t)N, (size_t)K, dA, (size_t)M, dB,
                                                        (size_t)N, dC, (size_t)ldc, ddb, NULL));
        mnistcu__k_bias_grad<<<(unsigned)((M + 31) / 32), 256>>>(dA, NULL, MNISTCU_ACT_IDENTITY, K, M, dbr, (float *)NULL,
                                                                 (float *)NULL, (const mnistcu__dyn *)NULL,
                                                                 mnistcu__opt());
        ASSERT_EQ(cudaSuccess, cudaGetLastError());
        h = tc_down(dC, nc);
        ASSERT_ARRAY_EQ_BITS_F(ref, h, nc);
        free(h);
        h = tc_down(ddb, (size_t)M), h2 = tc_down(dbr, (size_t)M);
        ASSERT_ARRAY_EQ_BITS_F(h2, h, (size_t)M);
        ASSERT_ARRAY_EQ_BITS_F(dbh, h, (size_t)M);
        free(h); free(h2);
        /* with the step (momentum, Nesterov, weight decay, not the first step): the pass over the same
           gradients gives the same weights, bias and buffers */
        memset(&od, 0, sizeof od);
        od.kind = MNISTCU_OPTIM_SGD;
        od.learning_rate = 0.05f, od.momentum = 0.9f, od.nesterov = 1, od.weight_decay = 0.01f;
        memset(&u, 0, sizeof u);
        memset(&mm, 0, sizeof mm);
        mnistcu__opt_make(&od, 3, nw, &u.opt, &mm);
        u.w = dw1, u.s = dv1, u.bw = dw1 + nc, u.bs = dv1 + nc;
        cudaFree(ddb);
        cudaFree(dC);
        ddb = tc_poisoned((size_t)M), dC = tc_poisoned(nc);
        ASSERT_EQ(MNISTCU_OK, mnistcu__cuda_gemm_skinny(g, (size_t)M, (size_t)N, (size_t)K, dA, (size_t)M, dB,
                                                        (size_t)N, dC, (size_t)ldc, ddb, &u));
        ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
        h = tc_down(dC, nc), h2 = tc_down(ddb, (size_t)M);
        ASSERT_ARRAY_EQ_BITS_F(ref, h, nc); /* the gradients as without the step */
        ASSERT_ARRAY_EQ_BITS_F(dbh, h2, (size_t)M);
        for (i = 0; i < nc; ++i)
            if (i % (size_t)ldc >= (size_t)N) h[i] = 0.0f; /* the stride's gap: no gradient, no step there */
        {
            float *gall = (float *)malloc(nw * sizeof(float));
            memcpy(gall, h, nc * sizeof(float));
            memcpy(gall + nc, h2, (size_t)M * sizeof(float));
            dg = tc_up(gall, nw);
            free(gall);
        }
        free(h); free(h2);
        memset(&todo, 0, sizeof todo);
        todo.count = 1, todo.total = nw, todo.off[0] = 0, todo.len[0] = nw;
        if (dims[d][3]) { /* the gap's entries are not weights: the pass leaves them too */
            size_t at = 0;
            todo.count = 0;
            for (c = 0; c < M; ++c) {
                todo.off[todo.count] = at, todo.len[todo.count++] = (size_t)N;
                at += (size_t)ldc;
            }
            todo.off[todo.count] = nc, todo.len[todo.count++] = (size_t)M;
            todo.total = (size_t)M * N + (size_t)M;
            ASSERT(todo.count <= MNISTCU__SEGS);
        }
        mnistcu__k_optim<<<mnistcu__blocks(todo.total), MNISTCU__THREADS>>>(u.opt, dw2, dg, dv2, NULL, NULL, todo);
        ASSERT_EQ(cudaSuccess, cudaGetLastError());
        h = tc_down(dw1, nw), h2 = tc_down(dw2, nw);
        ASSERT_ARRAY_EQ_BITS_F(h2, h, nw);
        free(h); free(h2);
        h = tc_down(dv1, nw), h2 = tc_down(dv2, nw);
        ASSERT_ARRAY_EQ_BITS_F(h2, h, nw);
        free(h); free(h2);
        free(A); free(B); free(w0); free(v0); free(ref); free(dbh);
        cudaFree(dA); cudaFree(dB); cudaFree(dC); cudaFree(ddb); cudaFree(dbr);
        cudaFree(dw1); cudaFree(dv1); cudaFree(dw2); cudaFree(dv2); cudaFree(dg);
    }
    mnistcu_ctx_destroy(g);
    PASS();
}

/* The split product's sum four outputs a thread against one a thread: the same bits for every epilogue
   (plain, bias and activation, the derivative from y), 1 to 4 parts and, on the small shapes, 9, 17 and 25
   (the parts loaded eight at a time: a last group of one, of eight, and the Fashion CNN's first dense
   layer's count), a row stride wider than N; both the part a load and eight parts at a time. */
TEST cuda_splitk_sum4_agrees_bitwise(void)
{
    static const int dims[][3] = {{3, 8, 8}, {512, 1024, 1024}, {5, 12, 16}, {7, 4, 4}, {64, 256, 256}};
    static const int parts[] = {1, 2, 3, 4, 9, 17, 25};
    size_t d, si;
    int S, fuse, ahead;
    for (d = 0; d < sizeof dims / sizeof dims[0]; ++d)
        for (si = 0; si < sizeof parts / sizeof parts[0] && (parts[si] <= 4 || dims[d][0] * dims[d][1] <= 65536); ++si)
            for (fuse = 0, S = parts[si]; fuse < 3; ++fuse) {
                const int M = dims[d][0], N = dims[d][1], ldc = dims[d][2];
                const size_t np = (size_t)S * M * N, nc = (size_t)M * ldc;
                const int act = fuse == 1 ? MNISTCU_ACT_TANH : MNISTCU_ACT_RELU;
                tu_rng rng = tu_rng_make((uint64_t)(d * 100 + (size_t)S * 10 + (size_t)fuse));
                float *part = tu_random_floats(&rng, np, -1, 1), *bias = tu_random_floats(&rng, (size_t)N, -1, 1);
                float *y = tu_random_floats(&rng, nc, -1, 1);
                float *dp = tc_up(part, np), *db = tc_up(bias, (size_t)N), *dy = tc_up(y, nc);
                float *c1 = tc_poisoned(nc), *c4, *h1, *h4;
                mnistcu__k_splitk_sum<<<mnistcu__blocks((size_t)M * N), MNISTCU__THREADS>>>(dp, S, M, N, c1, ldc, db, act,
                                                                                           fuse, dy);
                h1 = tc_down(c1, nc);
                for (ahead = 0; ahead < 2; ++ahead) {
                    c4 = tc_poisoned(nc);
                    if (ahead)
                        mnistcu__k_splitk_sum4<8><<<mnistcu__blocks((size_t)M * N / 4), MNISTCU__THREADS>>>(
                            dp, S, M, N, c4, ldc, db, act, fuse, dy);
                    else
                        mnistcu__k_splitk_sum4<1><<<mnistcu__blocks((size_t)M * N / 4), MNISTCU__THREADS>>>(
                            dp, S, M, N, c4, ldc, db, act, fuse, dy);
                    ASSERT_EQ(cudaSuccess, cudaGetLastError());
                    h4 = tc_down(c4, nc);
                    cudaFree(c4);
                    ASSERT_ARRAY_EQ_BITS_F(h1, h4, nc); /* the stride's gap stays poisoned on both */
                    free(h4);
                }
                free(h1); free(part); free(bias); free(y);
                cudaFree(dp); cudaFree(db); cudaFree(dy); cudaFree(c1);
            }
    PASS();
}

/* The register-tiled convolution kernels against the kernels of one output a thread, bit for bit:
   the same sums in the same order, the tiles' border of zeros adding nothing. Forward with a bias
   and an activation, or neither; the input gradient; 3x3 and 5x5, padded or not, 2 and 4 channels a
   thread, channel groups a block, and stages past 48 KB of shared memory. The last two columns are
   the R the plan must pick for the forward pass and the input gradient (0: not the tiles). */
template <int KS>
static void tc_conv_direct_ref(int dir, mnistcu__geom g, int oc, int B, const float *x, const float *w,
                               const float *bias, int act, float *y)
{
    const int K = g.c * KS * KS, P = g.oh * g.ow, HW = g.h * g.w;
    if (dir == 0) {
        const int cg = mnistcu__divisor_below(oc, 8192 / K);
        dim3 grid((unsigned)((cg * P + 255) / 256), (unsigned)(oc / cg), (unsigned)B);
        mnistcu__k_conv_direct_fwd<KS, 1, 0><<<grid, 256, (size_t)cg * K * sizeof(float)>>>(x, w, bias, y, g, oc, cg, act);
    } else {
        const int cig = mnistcu__divisor_below(g.c, 8192 / (oc * KS * KS));
        dim3 grid((unsigned)((cig * HW + 255) / 256), (unsigned)(g.c / cig), (unsigned)B);
        mnistcu__k_conv_direct_dx<KS, 1, 1, 0><<<grid, 256, (size_t)oc * cig * KS * KS * sizeof(float)>>>(x, w, y, g, oc, cig);
    }
}

TEST cuda_conv_tile_equals_direct_bitwise(void)
{
    /* c, h, w, out channels, kernel, padding, batch, R forward, R input gradient */
    static const int cs[][9] = {
        {1, 28, 28, 6, 5, 0, 64, 2, 0},    {6, 12, 12, 16, 5, 0, 300, 4, 2}, {16, 14, 14, 32, 3, 1, 128, 4, 4},
        {1, 28, 28, 64, 3, 0, 64, 4, 0},   {16, 12, 12, 64, 5, 2, 32, 4, 0}, {3, 13, 11, 10, 3, 1, 200, 2, 0},
        {16, 20, 17, 12, 5, 2, 80, 4, 4},  {6, 28, 28, 10, 3, 1, 64, 2, 2},  {6, 12, 12, 16, 5, 0, 8, 0, 0}};
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN);
    char msg[160];
    size_t k;
    int dir;
    ASSERT(g != NULL);
    for (k = 0; k < sizeof cs / sizeof cs[0]; ++k)
        for (dir = 0; dir < 2; ++dir) {
            const int *c = cs[k], ks = c[4], B = c[6], act = k % 2 ? MNISTCU_ACT_TANH : MNISTCU_ACT_RELU;
            mnistcu__geom ge;
            mnistcu__tgeom t;
            size_t nx, nw = (size_t)c[3] * c[0] * ks * ks, ny;
            tu_rng rng = tu_rng_make(500 + k * 2 + (size_t)dir);
            float *hx, *hw, *hb, *dxp, *dwp, *dbp, *y1, *y2, *h1, *h2;
            int R;
            ge.c = c[0]; ge.h = c[1]; ge.w = c[2]; ge.kh = ge.kw = ks; ge.sh = ge.sw = 1; ge.pad = c[5];
            ge.oh = c[1] + 2 * c[5] - ks + 1; ge.ow = c[2] + 2 * c[5] - ks + 1;
            if (dir == 0) {
                t.ic = ge.c; t.ih = ge.h; t.iw = ge.w; t.oc = c[3]; t.oh = ge.oh; t.ow = ge.ow;
                t.pad = ge.pad; t.wcc = ge.c; t.wci = 1;
            } else {
                t.ic = c[3]; t.ih = ge.oh; t.iw = ge.ow; t.oc = ge.c; t.oh = ge.h; t.ow = ge.w;
                t.pad = ks - 1 - ge.pad; t.wcc = 1; t.wci = ge.c;
            }
            R = mnistcu__conv_tile_plan(g, &t, ks, (size_t)B);
            if (R != c[7 + dir]) {
                snprintf(msg, sizeof msg, "case %d %s: the plan picked R = %d, not %d", (int)k, dir ? "dx" : "forward", R,
                         c[7 + dir]);
                FAILm(msg);
            }
            if (!R) continue;
            nx = (size_t)B * t.ic * t.ih * t.iw;
            ny = (size_t)B * t.oc * t.oh * t.ow;
            hx = tu_random_floats(&rng, nx, -1, 1);
            hw = tu_random_floats(&rng, nw, -1, 1);
            hb = tu_random_floats(&rng, (size_t)c[3], -1, 1);
            dxp = tc_up(hx, nx); dwp = tc_up(hw, nw); dbp = k % 3 == 2 || dir ? NULL : tc_up(hb, (size_t)c[3]);
            y1 = tc_poisoned(ny); y2 = tc_poisoned(ny);
            mnistcu__conv_tile_launch(mnistcu__cuda_stream(g), ks, R, dir, &t, (size_t)B, dxp, dwp, dbp, y1,
                                      dir ? (int)MNISTCU_ACT_IDENTITY : act);
            ASSERT_EQ(cudaSuccess, cudaGetLastError());
            ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
            if (ks == 5) tc_conv_direct_ref<5>(dir, ge, c[3], B, dxp, dwp, dbp, act, y2);
            else tc_conv_direct_ref<3>(dir, ge, c[3], B, dxp, dwp, dbp, act, y2);
            ASSERT_EQ(cudaSuccess, cudaGetLastError());
            h1 = tc_down(y1, ny); h2 = tc_down(y2, ny);
            ASSERT_ARRAY_EQ_BITS_F(h2, h1, ny);
            free(hx); free(hw); free(hb); free(h1); free(h2);
            cudaFree(dxp); cudaFree(dwp); if (dbp) cudaFree(dbp); cudaFree(y1); cudaFree(y2);
        }
    mnistcu_ctx_destroy(g);
    PASS();
}

/* A model meets a uint8 dataset and then a float one in streaming mode: the
   slots sized for the first must grow for the second (4 bytes a feature). */
TEST cuda_streaming_mixed_storage(void)
{
    mnistcu_ctx_desc d;
    mnistcu_ctx *ctx[2] = {NULL, NULL};
    mnistcu_metrics got[2][2];
    tu_rng rng = tu_rng_make(4);
    float *x = tu_random_floats(&rng, 1500 * 784, 0, 1), *params = NULL;
    int32_t *y = (int32_t *)malloc(1500 * sizeof(int32_t));
    size_t i, np = 0;
    int k;
    for (i = 0; i < 1500; ++i) y[i] = (int32_t)(tu_next(&rng) % 10);
    for (k = 0; k < 2; ++k) { /* k = 0: resident, k = 1: streaming; same weights */
        mnistcu_dataset *u8 = NULL, *f32 = NULL;
        mnistcu_model *m = NULL;
        memset(&d, 0, sizeof d);
        d.device = MNISTCU_DEVICE_CUDA;
        d.log_level = MNISTCU_LOG_SILENT;
        d.gemm = MNISTCU_GEMM_OWN;
        d.data_mode = k ? MNISTCU_DATA_STREAM : MNISTCU_DATA_RESIDENT;
        ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&ctx[k], &d));
        if (mnistcu_dataset_load_dir(ctx[k], tu_mnist_dir(), MNISTCU_SPLIT_TEST, &u8) != MNISTCU_OK) {
            mnistcu_ctx_destroy(ctx[0]);
            mnistcu_ctx_destroy(ctx[1]);
            free(x); free(y);
            SKIPm("MNIST test set not found");
        }
        ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_create(ctx[k], x, y, 1500, 784, 10, &f32));
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx[k], "784-32-10", &m));
        if (k == 0) {
            np = mnistcu_model_num_params(m);
            params = (float *)malloc(np * sizeof(float));
            mnistcu_model_get_params(m, params, np);
        } else {
            ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(m, params, np));
        }
        ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, u8, &got[k][0], NULL));
        ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, f32, &got[k][1], NULL));
    }
    for (k = 0; k < 2; ++k) {
        ASSERT_EQ(got[0][k].correct, got[1][k].correct);
        ASSERT_EQ_FMT(got[0][k].loss, got[1][k].loss, "%.17g");
    }
    free(params); free(x); free(y);
    mnistcu_ctx_destroy(ctx[0]);
    mnistcu_ctx_destroy(ctx[1]);
    PASS();
}

/* More rows of tiles than gridDim.y allows (65535 x 64): the kernel walks them. */
TEST cuda_gemm_beyond_grid_rows(void)
{
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN), *c = tu_ctx(MNISTCU_DEVICE_CPU, 0);
    size_t M = (size_t)65535 * 64 + 100, N = 3, K = 5;
    tu_rng rng = tu_rng_make(12);
    float *A = tu_random_floats(&rng, M * K, -1, 1), *B = tu_random_floats(&rng, N * K, -1, 1);
    float *ref = (float *)malloc(M * N * sizeof(float)), *got;
    float *dA = tc_up(A, M * K), *dB = tc_up(B, N * K), *dC = tc_poisoned(M * N);
    ASSERT(g && c && dA && dB && dC);
    mnistcu__cpu_reserve(c);
    mnistcu__cpu_gemm(c, 0, 1, M, N, K, A, K, B, K, ref, N);
    ASSERT_EQ(MNISTCU_OK, mnistcu__cuda_gemm(g, 0, 1, M, N, K, dA, K, dB, K, dC, N, NULL, 0));
    got = tc_down(dC, M * N);
    ASSERT(tc_relerr(got, ref, M * N) <= TC_MAX_REL);
    free(A); free(B); free(ref); free(got);
    cudaFree(dA); cudaFree(dB); cudaFree(dC);
    mnistcu_ctx_destroy(g);
    mnistcu_ctx_destroy(c);
    PASS();
}

/* ---- out of memory: a device allocator that refuses after N allocations ----------- */
typedef struct tc_alloc { int left, live; } tc_alloc;
static void *tc_dev_alloc(void *user, size_t size)
{
    tc_alloc *a = (tc_alloc *)user;
    void *p = NULL;
    if (a->left-- <= 0) return NULL;
    if (cudaMalloc(&p, size) != cudaSuccess) return NULL;
    a->live++;
    return p;
}
static void tc_dev_free(void *user, void *p)
{
    tc_alloc *a = (tc_alloc *)user;
    a->live--;
    cudaFree(p);
}

TEST cuda_out_of_memory_frees_and_stays_usable(void)
{
    int limit, failures = 0;
    for (limit = 0; limit < 16; ++limit) {
        tc_alloc a;
        mnistcu_ctx_desc d;
        mnistcu_ctx *ctx = NULL;
        mnistcu_dataset *ds;
        mnistcu_model *m = NULL, *m2 = NULL;
        mnistcu_train_desc td;
        mnistcu_result r;
        a.left = limit;
        a.live = 0;
        memset(&d, 0, sizeof d);
        d.device = MNISTCU_DEVICE_CUDA;
        d.log_level = MNISTCU_LOG_SILENT;
        d.allocator.device_alloc = tc_dev_alloc;
        d.allocator.device_free = tc_dev_free;
        d.allocator.user = &a;
        ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&ctx, &d));
        ds = tc_synthetic(ctx, 100, 784, 10, 5);
        memset(&td, 0, sizeof td);
        td.epochs = 1;
        td.batch_size = 10;
        td.optim.momentum = 0.9f;
        r = mnistcu_model_create_mlp(ctx, "784-32-10", &m);
        if (r == MNISTCU_OK) r = mnistcu_train(m, ds, &td, NULL);
        if (r != MNISTCU_OK) {
            failures++;
            ASSERT_EQ_FMT((int)MNISTCU_ERR_OUT_OF_MEMORY, (int)r, "%d");
            /* the context stays usable: with memory back, the same work succeeds */
            a.left = 1000;
            mnistcu_model_destroy(m);
            ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "784-32-10", &m2));
            ASSERT_EQ(MNISTCU_OK, mnistcu_train(m2, ds, &td, NULL));
        }
        mnistcu_ctx_destroy(ctx);
        ASSERT_EQ_FMT(0, a.live, "%d"); /* every device allocation was freed */
    }
    ASSERT_GT(failures, 3);
    PASS();
}

/* The divergence check's kernels against the CPU's bit test: one value that is
   not finite (NaN of either sign and any payload, +-inf), placed in the first
   or last element, at block and grid-pass boundaries, sets the flag; extreme
   finite values (FLT_MAX, denormals, -0) do not. */
TEST cuda_finite_flag_matches_cpu(void)
{
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN);
    static const size_t sizes[] = {1, 255, 256, 257, 64 * 256, 64 * 256 + 1, 1000003};
    static const uint32_t bad_bits[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FFFFFFFu, 0x7F800000u, 0xFF800000u};
    static const uint32_t good_bits[] = {0x7F7FFFFFu, 0xFF7FFFFFu, 0x00000001u, 0x80000000u, 0x807FFFFFu};
    tu_rng rng = tu_rng_make(44);
    int *dflags = NULL, flag = -1;
    size_t s, k, b;
    ASSERT(g);
    ASSERT_EQ(cudaSuccess, cudaMalloc((void **)&dflags, (MNISTCU__FINITE_BLOCKS + 1) * sizeof(int)));
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        size_t n = sizes[s], where[7];
        float *h = tu_random_floats(&rng, n, -1e30f, 1e30f), *d;
        where[0] = 0; where[1] = n - 1; where[2] = n / 2; where[3] = MNISTCU__MIN(n - 1, (size_t)255);
        where[4] = MNISTCU__MIN(n - 1, (size_t)256); where[5] = MNISTCU__MIN(n - 1, (size_t)64 * 256 - 1);
        where[6] = MNISTCU__MIN(n - 1, (size_t)64 * 256);
        for (k = 0; k < 5; ++k) memcpy(&h[(k * 7919) % n], &good_bits[k], 4);
        d = tc_up(h, n);
        ASSERT(d != NULL);
        mnistcu__k_finite_partial<<<MNISTCU__FINITE_BLOCKS, MNISTCU__THREADS>>>(d, n, dflags);
        mnistcu__k_finite_flag<<<1, MNISTCU__THREADS>>>(dflags, MNISTCU__FINITE_BLOCKS, dflags + MNISTCU__FINITE_BLOCKS);
        ASSERT_EQ(cudaSuccess, cudaMemcpy(&flag, dflags + MNISTCU__FINITE_BLOCKS, sizeof flag, cudaMemcpyDeviceToHost));
        ASSERT_EQm("finite values set the flag", 0, flag);
        for (k = 0; k < 5; ++k) ASSERT(mnistcu__finite_f(h[(k * 7919) % n]));
        for (k = 0; k < 7; ++k)
            for (b = 0; b < sizeof bad_bits / sizeof bad_bits[0]; ++b) {
                float v, keep = h[where[k]];
                memcpy(&v, &bad_bits[b], 4);
                ASSERT_FALSE(mnistcu__finite_f(v));
                ASSERT_EQ(cudaSuccess, cudaMemcpy(d + where[k], &v, 4, cudaMemcpyHostToDevice));
                mnistcu__k_finite_partial<<<MNISTCU__FINITE_BLOCKS, MNISTCU__THREADS>>>(d, n, dflags);
                mnistcu__k_finite_flag<<<1, MNISTCU__THREADS>>>(dflags, MNISTCU__FINITE_BLOCKS,
                                                               dflags + MNISTCU__FINITE_BLOCKS);
                ASSERT_EQ(cudaSuccess,
                          cudaMemcpy(&flag, dflags + MNISTCU__FINITE_BLOCKS, sizeof flag, cudaMemcpyDeviceToHost));
                ASSERT_EQm("a value that is not finite must set the flag", 1, flag);
                ASSERT_EQ(cudaSuccess, cudaMemcpy(d + where[k], &keep, 4, cudaMemcpyHostToDevice));
            }
        free(h);
        cudaFree(d);
    }
    cudaFree(dflags);
    mnistcu_ctx_destroy(g);
    PASS();
}

TEST cuda_reports_device(void)
{
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_DEFAULT);
    ASSERT(g);
    ASSERT_EQ(MNISTCU_DEVICE_CUDA, mnistcu_ctx_device(g));
    ASSERT(strstr(mnistcu_ctx_device_name(g), "sm_") != NULL);
    mnistcu_ctx_destroy(g);
    PASS();
}

/* Run alone (it breaks the CUDA context of the process): -t cuda_sticky */
__global__ void tc_k_bad_write(float *p) { p[(size_t)1 << 40] = 1.0f; }
TEST cuda_sticky_error_is_latched(void)
{
    mnistcu_ctx *g;
    mnistcu_model *m = NULL;
    mnistcu_result r;
    if (!getenv("MNISTCU_TEST_STICKY")) SKIPm("set MNISTCU_TEST_STICKY=1 and run alone (-t cuda_sticky)");
    g = tc_ctx(MNISTCU_GEMM_OWN);
    ASSERT(g);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(g, "4-3-2", &m));
    tc_k_bad_write<<<1, 1, 0, mnistcu__cu(g)->stream>>>(m->params);
    r = mnistcu__cuda_check(g, cudaStreamSynchronize(mnistcu__cu(g)->stream), "planted bad write");
    ASSERT_EQ(MNISTCU_ERR_CUDA, r);
    /* every later call reports it */
    {
        float p[23]; /* 4*3 + 3 + 3*2 + 2 */
        ASSERT_EQ(23, (int)mnistcu_model_num_params(m));
        ASSERT_EQ(MNISTCU_ERR_CUDA, mnistcu_model_get_params(m, p, 23));
        ASSERT(strstr(mnistcu_ctx_error(g), "unrecoverable") != NULL);
        ASSERT_EQ(MNISTCU_ERR_CUDA, mnistcu_model_set_params(m, p, 23));
        ASSERT_EQ(MNISTCU_ERR_CUDA, mnistcu_model_create_mlp(g, "4-3-2", &m));
    }
    mnistcu_ctx_destroy(g);
    PASS();
}

/* ---- layers: every kind's kernels against its CPU reference ---------------------
   One small model per kind (the kind where it needs its input gradient, after a
   layer with parameters), built with the same seed on the CPU and the GPU, so
   they start from the same parameters. The GPU's whole workspace and gradient
   arena are poisoned with NaN before each pass; then every layer's output, the
   loss, every gradient and the running statistics are compared with the CPU's. */
typedef struct tc_layer_case { mnistcu_layer_kind kind; const char *spec; size_t batch; } tc_layer_case;

static const tc_layer_case tc_layer_cases[] = {
    {MNISTCU_LAYER_DENSE, "13 dense7:bias=0 sigmoid dense9 dense5", 5},
    {MNISTCU_LAYER_CONV2D, "2x9x9 conv3x3x4:s=2:p=1 relu conv2x3x3:bias=0 tanh conv1x1x2 flatten dense5", 3},
    {MNISTCU_LAYER_MAXPOOL2D, "2x11x10 conv3x3x3 maxpool3:s=2 maxpool2x1 flatten dense5", 4},
    {MNISTCU_LAYER_AVGPOOL2D, "2x10x10 conv3x3x3 avgpool2 avgpool3x2:s=1 flatten dense5", 3},
    {MNISTCU_LAYER_BATCHNORM, "2x6x6 conv3x3x4:bias=0 batchnorm:momentum=0.3 relu flatten dense8:bias=0 batchnorm dense5", 6},
    /* the GPU splits each channel's batch into pieces of about 4096 values: 4 pieces (the last of 7 samples,
       the others 10), 43 (two a lane when they are combined; the last of 6 samples), and 3 of flat features */
    {MNISTCU_LAYER_BATCHNORM, "2x20x20 conv3x3x4:p=1:bias=0 batchnorm relu flatten dense5", 37},
    {MNISTCU_LAYER_BATCHNORM, "1x24x24 conv3x3x2:p=1:bias=0 batchnorm flatten dense5", 300},
    {MNISTCU_LAYER_BATCHNORM, "40 dense6:bias=0 batchnorm relu dense5", 9000},
    /* a 2x2 max pool after it: the backward sums by the pool's windows (MNISTCU__BN_CELLS); 34x34 maps have
       more groups of four and more cells than a block's 256 threads; 13x13, first (no input gradient),
       cells of one row or column at the edges and groups of one value */
    {MNISTCU_LAYER_BATCHNORM, "2x34x34 conv3x3x3:p=1:bias=0 batchnorm maxpool2 relu flatten dense5", 5},
    {MNISTCU_LAYER_BATCHNORM, "3x13x13 batchnorm maxpool2 flatten dense5", 7},
    {MNISTCU_LAYER_DROPOUT, "30 dense20 dropout0.3 dense12 relu dropout dense5", 7},
    {MNISTCU_LAYER_FLATTEN, "3x4x4 conv3x3x2 flatten dense5", 2},
    /* the first relu is folded into the max pool, the second runs on its own */
    {MNISTCU_LAYER_RELU, "2x7x7 conv3x3x3 maxpool2 relu avgpool2:s=1 relu flatten dense5", 3},
    {MNISTCU_LAYER_LEAKY_RELU, "20 dense10 leaky_relu0.2 dense9 leaky_relu dense5", 5},
    {MNISTCU_LAYER_SIGMOID, "2x6x6 conv3x3x3 avgpool2 sigmoid flatten dense5", 3},
    {MNISTCU_LAYER_TANH, "20 dense10 dropout tanh dense5", 4},
    {MNISTCU_LAYER_SOFTMAX, "3x4x4 conv1x1x4 softmax flatten dense6 softmax dense5", 3},
    /* the direct kernels (<= 16 input channels, 3x3 or 5x5) with stride, padding, no bias, a fold */
    {MNISTCU_LAYER_CONV2D, "3x11x9 conv1x1x3 conv5x5x8:s=2:p=2:bias=0 relu conv3x3x7:p=1 sigmoid flatten dense5", 4},
    /* too large to stage in shared memory (weights and sample over 48 KB): the direct kernels that read
       their inputs from global memory. 3x3: forward and input gradient (the weight gradient now takes
       slices of 6 samples, which fit); 3x3, stride 2, 64 channels: forward and input gradient; 5x5: forward and input
       gradient */
    {MNISTCU_LAYER_CONV2D, "16x28x28 conv1x1x16 conv3x3x16 flatten dense5", 14},
    {MNISTCU_LAYER_CONV2D, "16x28x28 conv1x1x16 conv3x3x64:s=2 flatten dense5", 2},
    {MNISTCU_LAYER_CONV2D, "16x28x28 conv1x1x16 conv5x5x16 flatten dense5", 2},
    {MNISTCU_LAYER_CONV2D, "16x20x20 conv5x5x16 relu conv3x3x2 flatten dense5", 20},
    /* weight gradients whose one sample (a 72x72 plane and its 70x70 or 68x68 output gradient) does not
       fit in shared memory beside the sums: read from global memory */
    {MNISTCU_LAYER_CONV2D, "1x72x72 conv3x3x2 flatten dense5", 2},
    {MNISTCU_LAYER_CONV2D, "1x72x72 conv5x5x3 flatten dense5", 2},
    /* enough threads for the register tiles: 6 and 10 channels (2 a thread); 32 output channels over 16
       inputs at batch 128 (P6's second convolution: a 55 KB stage in the input gradient, the weight
       gradient's tiles of 4 x 2 channels) */
    {MNISTCU_LAYER_CONV2D, "1x28x28 conv3x3x6:p=1 relu conv3x3x10:p=1 flatten dense5", 64},
    {MNISTCU_LAYER_CONV2D, "16x14x14 conv1x1x16 conv3x3x32:p=1 relu flatten dense5", 128},
    {MNISTCU_LAYER_CONV2D, "1x28x28 conv3x3x16:p=1 relu conv3x3x16:p=1 flatten dense5", 32},
    /* the weight gradient's tiles over uneven batch slices (201 samples), and at 5x5 with padding */
    {MNISTCU_LAYER_CONV2D, "16x14x14 conv1x1x16 conv3x3x16:p=1 relu flatten dense5", 201},
    {MNISTCU_LAYER_CONV2D, "8x12x12 conv1x1x8 conv5x5x32:p=2 flatten dense5", 20},
    /* the slice kernel where the weight gradient's tiles do not apply: 3x3 over 18 output channels (not a
       multiple of 4), 5x5 at stride 2 */
    {MNISTCU_LAYER_CONV2D, "16x14x14 conv1x1x16 conv3x3x18:p=1 relu flatten dense5", 133},
    {MNISTCU_LAYER_CONV2D, "8x12x12 conv1x1x8 conv5x5x32:s=2:p=2 flatten dense5", 20},
    /* register tiles (stride 1, enough threads): 5x5 with 2 channels a thread, padded and not; 5x5 with 4,
       12 output channels over 16 inputs, odd width */
    {MNISTCU_LAYER_CONV2D, "1x28x28 conv5x5x6 relu conv5x5x10:p=1 flatten dense5", 64},
    /* one group of two input channels (H = 2) at 5x5: the weight gradient reads the output gradient from
       global memory (gdy), as the first convolutions above do with one channel */
    {MNISTCU_LAYER_CONV2D, "2x16x16 conv5x5x4:p=2 relu flatten dense5", 9},
    {MNISTCU_LAYER_CONV2D, "16x20x17 conv1x1x16 conv5x5x12:p=2 relu flatten dense5", 80},
    /* the columns path (more than 16 input channels): stride 2 with padding, and stride 1 with padding (the
       columns a window a thread, the input gradient a position a thread) */
    {MNISTCU_LAYER_CONV2D, "18x9x9 conv3x3x6:s=2:p=1 relu conv3x3x20:p=1 relu conv3x3x4:p=1 flatten dense5", 3},
    /* 5x5 on the columns path at stride 1 (mnistcu__k_im2col_win<5>, mnistcu__k_col2im_s1<5>), a max pool
       of 2x2 on a 9x7 map after it */
    {MNISTCU_LAYER_CONV2D, "2x11x9 conv1x1x18 conv5x5x7:p=1 relu maxpool2 flatten dense5", 3},
    /* a rectangular kernel on the columns path (mnistcu__k_im2col_rows<5>: the window kernel takes squares) */
    {MNISTCU_LAYER_CONV2D, "18x9x9 conv3x5x6:p=1 relu flatten dense5", 3},
    /* the window kernel past its first block of positions (14x14 and 16x16 outputs, P > 128), and 5x5 at
       stride 2 with padding on the columns path */
    {MNISTCU_LAYER_CONV2D, "18x14x14 conv3x3x5:p=1 relu flatten dense5", 3},
    {MNISTCU_LAYER_CONV2D, "18x16x16 conv5x5x4:p=2 flatten dense5", 2},
    {MNISTCU_LAYER_CONV2D, "18x14x13 conv5x5x6:s=2:p=2 relu conv3x3x4:p=1 flatten dense5", 3},
    {MNISTCU_LAYER_CONV2D, "lenet5", 3},
    {MNISTCU_LAYER_CONV2D, "fashion-cnn", 2},
    {MNISTCU_LAYER_DENSE, "784-128-10", 1},
};

/* The normwise relative error ||got - ref|| / ||ref|| of a tensor at most 1e-5
   (NaN anywhere fails); *at is the element that differs most, for the message.
   Elementwise relative bounds do not fit sums that cancel to near zero. */
static int tc_close(const float *got, const float *ref, size_t n, double *err, size_t *at)
{
    double worst = -1.0;
    size_t i;
    *at = 0;
    for (i = 0; i < n; ++i) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (got[i] != got[i] || ref[i] != ref[i]) d = INFINITY;
        if (d > worst) {
            worst = d;
            *at = i;
        }
    }
    *err = tc_relerr(got, ref, n);
    return *err <= TC_MAX_REL;
}

static double tc_worst_err; /* the largest error seen by the per-kernel checks that passed */

static float *tc_up_into(float *dev, const float *host, size_t n)
{
    cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize(); /* landed before the library's stream reads it (see tc_up) */
    return dev;
}

/* Each kernel gets exactly the CPU's inputs: layer by layer, the CPU runs its
   forward, the GPU layer is given the CPU's input and its own output poisoned,
   and the two outputs are compared; then backward, layer by layer from the
   loss, with the CPU's output gradient given to both. Pass 0 in TRAIN mode,
   pass 1 in EVAL mode after an SGD step (the GPU then takes the CPU's
   parameters and running statistics, so both start the pass equal). */
static int tc_layer_case_run(const tc_layer_case *c, mnistcu_gemm path, char *msg, size_t msg_size)
{
    mnistcu_ctx *g = tc_ctx(path), *h = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_model *mg = NULL, *mh = NULL;
    tu_rng rng = tu_rng_make(77 + c->batch);
    float *x = NULL, *got = NULL, *dy = NULL, *tmp = NULL;
    int32_t *labels = NULL;
    double lh, worst;
    size_t i, at, n, B = c->batch, ws;
    int pass, l, ok = 1;
    mnistcu_optim_desc o;
    memset(&o, 0, sizeof o);
    o.learning_rate = 0.05f;
    o.momentum = 0.9f;
    if (!g || !h || mnistcu_model_create_spec(g, c->spec, &mg) || mnistcu_model_create_spec(h, c->spec, &mh)) {
        snprintf(msg, msg_size, "%s: cannot make the models", c->spec);
        ok = 0;
        goto done;
    }
    n = mg->num_params;
    x = tu_random_floats(&rng, B * mg->inputs, -1.5f, 1.5f);
    labels = (int32_t *)malloc(B * sizeof(int32_t));
    dy = (float *)malloc(B * mh->max_size * sizeof(float));
    tmp = (float *)malloc((B * mh->max_size > n ? B * mh->max_size : n) * sizeof(float));
    for (i = 0; i < B; ++i) labels[i] = (int32_t)(tu_next(&rng) % mg->classes);
    mnistcu__model_reserve(mg, B);
    mnistcu__model_reserve(mh, B);
    ws = mnistcu__model_layout(mg, NULL, mg->ws_batch);
#define TC_CHECK(what_, gdev_, href_, count_)                                                                     \
    do {                                                                                                          \
        free(got);                                                                                                \
        got = tc_down((gdev_), (count_));                                                                         \
        if (ok && tc_close(got, (href_), (count_), &worst, &at) && worst > tc_worst_err) tc_worst_err = worst;    \
        if (ok && !tc_close(got, (href_), (count_), &worst, &at)) {                                               \
            snprintf(msg, msg_size, "%.60s pass %d: layer %d (%s) %s [%lu] = %.9g, CPU %.9g (error %.3g)", c->spec, \
                     pass, l, mnistcu__kind_keywords[mg->layers[l].d.kind], what_, (unsigned long)at, got[at],     \
                     (href_)[at], worst);                                                                         \
            ok = 0;                                                                                               \
        }                                                                                                         \
    } while (0)
    for (pass = 0; pass < 2 && ok; ++pass) {
        float *cur_h, *cur_g;
        if (pass == 1) { /* an SGD step on the CPU, its result given to the GPU; then EVAL mode */
            if (mnistcu_model_compute_grads(mh, x, labels, B, &lh) || mnistcu_model_apply_grads(mh, &o)) {
                ok = 0;
                break;
            }
            mnistcu_model_set_params(mg, mh->params, n);
            if (mh->num_buffers) tc_up_into(mg->buffers, mh->buffers, mh->num_buffers);
            mnistcu_model_set_mode(mg, MNISTCU_MODE_EVAL);
            mnistcu_model_set_mode(mh, MNISTCU_MODE_EVAL);
            mg->steps = mh->steps;
        }
        cudaMemset(mg->ws, 0xFF, ws * sizeof(float)); /* all ones: a NaN */
        cudaMemset(mg->grads, 0xFF, n * sizeof(float));
        memcpy(mh->input, x, B * mh->inputs * sizeof(float));
        memcpy(mh->labels, labels, B * sizeof(int32_t));
        cudaMemcpy(mg->labels, labels, B * sizeof(int32_t), cudaMemcpyHostToDevice);
        cudaDeviceSynchronize(); /* the poison and the labels in place before the library's stream runs */
        for (l = 0; l < mg->num_layers && ok; ++l) {
            mnistcu__layer *Lg = &mg->layers[l], *Lh = &mh->layers[l];
            if (Lg->passthrough) continue;
            mnistcu__kinds[Lh->d.kind]->forward[0](mh, Lh, B);
            tc_up_into(Lg->in, Lh->in, B * Lg->in_size);
            if (mnistcu__kinds[Lg->d.kind]->forward[1](mg, Lg, B) != MNISTCU_OK) {
                snprintf(msg, msg_size, "%.60s: layer %d forward failed: %.300s", c->spec, l, mnistcu_ctx_error(g));
                ok = 0;
                break;
            }
            TC_CHECK("output", Lg->out, Lh->out, B * Lg->out_size);
            if (mh->num_buffers && Lh->d.kind == MNISTCU_LAYER_BATCHNORM)
                TC_CHECK("running statistics", mg->buffers, mh->buffers, mh->num_buffers);
        }
        if (!ok) break;
        /* the loss and its gradient from the same logits */
        l = mg->num_layers - 1;
        tc_up_into(mg->logits, mh->logits, B * mg->classes);
        mnistcu__loss(mh, B, 1);
        mnistcu__loss(mg, B, 1);
        TC_CHECK("loss gradient", mg->dbuf[0], mh->dbuf[0], B * mg->classes);
        /* backward, each layer given the CPU's output gradient */
        memcpy(dy, mh->dbuf[0], B * mh->classes * sizeof(float));
        for (l = mg->num_layers - 1; l >= 0 && ok; --l) {
            mnistcu__layer *Lg = &mg->layers[l], *Lh = &mh->layers[l];
            size_t ny = B * Lh->out_size, nx = B * Lh->in_size;
            if (Lg->passthrough) continue;
            if (!Lh->need_dx && Lh->nw + Lh->nb == 0) break;
            cur_h = mh->dbuf[0];
            cur_g = mg->dbuf[0];
            memcpy(cur_h, dy, ny * sizeof(float));
            tc_up_into(cur_g, dy, ny);
            if (Lg->need_dx) cudaMemset(mg->dbuf[1], 0xFF, nx * sizeof(float));
            cudaDeviceSynchronize();
            mnistcu__kinds[Lh->d.kind]->backward[0](mh, Lh, B, cur_h, Lh->need_dx ? mh->dbuf[1] : NULL);
            if (mnistcu__kinds[Lg->d.kind]->backward[1](mg, Lg, B, cur_g, Lg->need_dx ? mg->dbuf[1] : NULL) !=
                MNISTCU_OK) {
                snprintf(msg, msg_size, "%.60s: layer %d backward failed: %.300s", c->spec, l, mnistcu_ctx_error(g));
                ok = 0;
                break;
            }
            if (Lh->nw) TC_CHECK("weight gradient", mg->grads + Lg->wo, mh->grads + Lh->wo, Lh->nw);
            if (Lh->nb) TC_CHECK("bias gradient", mg->grads + Lg->bo, mh->grads + Lh->bo, Lh->nb);
            if (!Lh->need_dx) break;
            TC_CHECK("input gradient", mg->dbuf[1], mh->dbuf[1], nx);
            memcpy(dy, mh->dbuf[1], nx * sizeof(float));
        }
    }
#undef TC_CHECK
done:
    free(x); free(got); free(dy); free(tmp); free(labels);
    mnistcu_ctx_destroy(g);
    mnistcu_ctx_destroy(h);
    return ok;
}

/* Whole passes chained, each device on its own: the same loss and gradients
   after forward and backward through every layer (rounding differences
   compound through the layers, so 1e-4). */
static int tc_layer_case_chained(const tc_layer_case *c, char *msg, size_t msg_size)
{
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN), *h = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_model *mg = NULL, *mh = NULL;
    tu_rng rng = tu_rng_make(99 + c->batch);
    float *x = NULL, *gg = NULL, *gh = NULL;
    int32_t *labels = NULL;
    double lg = 0.0, lh = 0.0, num = 0.0, den = 0.0;
    size_t i, n, B = c->batch;
    int ok = 1;
    if (!g || !h || mnistcu_model_create_spec(g, c->spec, &mg) || mnistcu_model_create_spec(h, c->spec, &mh)) {
        snprintf(msg, msg_size, "%s: cannot make the models", c->spec);
        ok = 0;
        goto done;
    }
    n = mg->num_params;
    x = tu_random_floats(&rng, B * mg->inputs, -1.5f, 1.5f);
    labels = (int32_t *)malloc(B * sizeof(int32_t));
    gg = (float *)malloc(n * sizeof(float));
    gh = (float *)malloc(n * sizeof(float));
    for (i = 0; i < B; ++i) labels[i] = (int32_t)(tu_next(&rng) % mg->classes);
    if (mnistcu_model_compute_grads(mg, x, labels, B, &lg) || mnistcu_model_compute_grads(mh, x, labels, B, &lh) ||
        mnistcu_model_get_grads(mg, gg, n) || mnistcu_model_get_grads(mh, gh, n)) {
        snprintf(msg, msg_size, "%s: compute_grads failed", c->spec);
        ok = 0;
        goto done;
    }
    for (i = 0; i < n; ++i) {
        num += ((double)gg[i] - gh[i]) * ((double)gg[i] - gh[i]);
        den += (double)gh[i] * gh[i];
    }
    if (!(fabs(lg - lh) <= 1e-5 * fabs(lh) + 1e-7) || !(sqrt(num / (den > 0 ? den : 1)) <= 1e-4)) {
        snprintf(msg, msg_size, "%.60s chained: loss %.9g vs CPU %.9g, gradient relative error %.3g", c->spec, lg, lh,
                 sqrt(num / (den > 0 ? den : 1)));
        ok = 0;
    }
done:
    free(x); free(gg); free(gh); free(labels);
    mnistcu_ctx_destroy(g);
    mnistcu_ctx_destroy(h);
    return ok;
}

TEST cuda_layers_match_cpu(void)
{
    char msg[512] = "";
    int covered[MNISTCU_LAYER_KIND_COUNT] = {0}, k, path;
    size_t i;
    for (i = 0; i < sizeof tc_layer_cases / sizeof tc_layer_cases[0]; ++i) covered[tc_layer_cases[i].kind] = 1;
    for (k = 1; k < MNISTCU_LAYER_KIND_COUNT; ++k)
        if (!covered[k]) {
            snprintf(msg, sizeof msg, "layer kind %s has no CUDA parity case", mnistcu__kind_keywords[k]);
            FAILm(msg);
        }
    /* own kernels with our product, with cuBLAS's, and (built with MNISTCU_CUDNN) cuDNN's */
    for (path = 0; path < 3; ++path) {
#ifndef MNISTCU_CUBLAS
        if (path == 1) continue;
#endif
#ifndef MNISTCU_CUDNN
        if (path == 2) continue;
#endif
        tc_cnn_path = path == 2 ? MNISTCU_CNN_CUDNN : MNISTCU_CNN_OWN;
        for (i = 0; i < sizeof tc_layer_cases / sizeof tc_layer_cases[0]; ++i)
            if (!tc_layer_case_run(&tc_layer_cases[i], path == 1 ? MNISTCU_GEMM_CUBLAS : MNISTCU_GEMM_OWN, msg,
                                   sizeof msg) ||
                (path == 0 && !tc_layer_case_chained(&tc_layer_cases[i], msg, sizeof msg))) {
                tc_cnn_path = MNISTCU_CNN_OWN;
                FAILm(msg);
            }
        tc_cnn_path = MNISTCU_CNN_OWN;
        printf("\n    layer parity: %s ok, largest normwise relative error %.2e", path == 0 ? "own kernels" :
               path == 1 ? "cuBLAS products" : "cuDNN", tc_worst_err);
        tc_worst_err = 0.0;
    }
    PASS();
}

/* Batch norm's partial sums stay inside its aux buffer when a batch smaller than the workspace's
   splits into more pieces (128 samples of 28 x 28 make 22 pieces, 115 make 23): the floats after
   the buffer keep their poison through a forward and a backward pass at 115. */
TEST cuda_batchnorm_pieces_stay_in_aux(void)
{
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN);
    mnistcu_model *m = NULL;
    mnistcu__layer *L;
    tu_rng rng = tu_rng_make(115);
    float *x, *dy, *after;
    size_t B = 115, aux, ws, i, bad = 0;
    ASSERT(g != NULL);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_spec(g, "1x28x28 conv3x3x4:p=1:bias=0 batchnorm flatten dense10", &m));
    ASSERT_EQ(MNISTCU_OK, mnistcu__model_reserve(m, 128));
    L = &m->layers[1];
    ASSERT_EQ(MNISTCU_LAYER_BATCHNORM, (int)L->d.kind);
    ASSERT(mnistcu__bn_pieces(B, 784, NULL) > mnistcu__bn_pieces(m->ws_batch, 784, NULL)); /* the case it is about */
    aux = mnistcu__kinds[MNISTCU_LAYER_BATCHNORM]->aux_floats(L, m->ws_batch);
    ws = mnistcu__model_layout(m, NULL, m->ws_batch);
    ASSERT((size_t)(L->aux + aux - m->ws) + 64 <= ws);
    cudaMemset(m->ws, 0xFF, ws * sizeof(float));
    x = tu_random_floats(&rng, B * L->in_size, -2.0f, 2.0f);
    dy = tu_random_floats(&rng, B * L->out_size, -1.0f, 1.0f);
    tc_up_into(L->in, x, B * L->in_size);
    tc_up_into(m->dbuf[0], dy, B * L->out_size);
    mnistcu_model_set_mode(m, MNISTCU_MODE_TRAIN);
    ASSERT_EQ(MNISTCU_OK, mnistcu__kinds[MNISTCU_LAYER_BATCHNORM]->forward[1](m, L, B));
    ASSERT_EQ(MNISTCU_OK, mnistcu__kinds[MNISTCU_LAYER_BATCHNORM]->backward[1](m, L, B, m->dbuf[0], m->dbuf[1]));
    after = tc_down(L->aux + aux, 64);
    for (i = 0; i < 64; ++i) {
        uint32_t u;
        memcpy(&u, &after[i], sizeof u);
        bad += u != 0xFFFFFFFFu;
    }
    free(x); free(dy); free(after);
    mnistcu_ctx_destroy(g);
    ASSERT_EQ(0, (int)bad);
    PASS();
}

/* The dropout masks of the two devices are the same bits, at every step. */
TEST cuda_dropout_mask_matches_cpu_bitwise(void)
{
    mnistcu_ctx *g = tc_ctx(MNISTCU_GEMM_OWN), *h = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_model *mg = NULL, *mh = NULL;
    const size_t B = 9, F = 1000;
    float *x = (float *)malloc(B * F * sizeof(float)), *yg = NULL;
    int32_t labels[9] = {0};
    mnistcu_optim_desc o;
    double loss;
    size_t i, kept = 0;
    int step, same = 1, differs = 0;
    memset(&o, 0, sizeof o);
    ASSERT(g && h);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_spec(g, "1000 dropout0.3 dense2", &mg));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_spec(h, "1000 dropout0.3 dense2", &mh));
    for (i = 0; i < B * F; ++i) x[i] = 1.0f + (float)(i % 7);
    for (step = 0; step < 3; ++step) {
        float *prev = yg;
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(mg, x, labels, B, &loss));
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(mh, x, labels, B, &loss));
        yg = tc_down(mg->layers[0].out, B * F);
        if (memcmp(yg, mh->layers[0].out, B * F * sizeof(float)) != 0) same = 0;
        if (prev && memcmp(prev, yg, B * F * sizeof(float)) != 0) differs = 1;
        for (i = 0; i < B * F; ++i) kept += yg[i] != 0.0f;
        free(prev);
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_apply_grads(mg, &o));
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_apply_grads(mh, &o));
    }
    free(yg);
    free(x);
    mnistcu_ctx_destroy(g);
    mnistcu_ctx_destroy(h);
    ASSERTm("the GPU's dropout output must equal the CPU's bit for bit", same);
    ASSERTm("the mask must change from step to step", differs);
    ASSERT_IN_RANGE(0.7, (double)kept / (3.0 * B * F), 0.02);
    PASS();
}

/* A CNN with every stateful kind trains to the same bits twice on the GPU. */
TEST cuda_cnn_runs_are_bitwise_identical(void)
{
    const char *spec = "1x12x12 conv3x3x6:p=1 batchnorm relu maxpool2 conv3x3x8 avgpool2 flatten dropout0.2 dense16 "
                       "relu dense10";
    float *p[2] = {NULL, NULL}, *b[2] = {NULL, NULL};
    size_t np = 0, nb = 0, i;
    int run, step;
    for (run = 0; run < 4; ++run) {
        mnistcu_ctx *g;
        mnistcu_model *m = NULL;
        tu_rng rng = tu_rng_make(5);
#ifndef MNISTCU_CUDNN
        if (run >= 2) break;
#endif
        tc_cnn_path = run >= 2 ? MNISTCU_CNN_CUDNN : MNISTCU_CNN_OWN; /* runs 2 and 3: cuDNN, also repeatable */
        g = tc_ctx(MNISTCU_GEMM_OWN);
        tc_cnn_path = MNISTCU_CNN_OWN;
        if (run == 2) {
            ASSERT_ARRAY_EQ_BITS_F(p[0], p[1], np);
            ASSERT_ARRAY_EQ_BITS_F(b[0], b[1], nb);
            free(p[0]); free(p[1]); free(b[0]); free(b[1]);
        }
        float *x = tu_random_floats(&rng, 16 * 144, -1, 1);
        int32_t labels[16];
        mnistcu_optim_desc o;
        double loss;
        memset(&o, 0, sizeof o);
        o.learning_rate = 0.05f;
        o.momentum = 0.9f;
        for (i = 0; i < 16; ++i) labels[i] = (int32_t)(i % 10);
        ASSERT(g);
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_spec(g, spec, &m));
        for (step = 0; step < 20; ++step) {
            ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(m, x, labels, 16, &loss));
            ASSERT_EQ(MNISTCU_OK, mnistcu_model_apply_grads(m, &o));
        }
        np = m->num_params;
        nb = m->num_buffers;
        p[run % 2] = tc_down(m->params, np);
        b[run % 2] = tc_down(m->buffers, nb);
        free(x);
        mnistcu_ctx_destroy(g);
    }
    ASSERT_ARRAY_EQ_BITS_F(p[0], p[1], np);
    ASSERT_ARRAY_EQ_BITS_F(b[0], b[1], nb);
    free(p[0]); free(p[1]); free(b[0]); free(b[1]);
    PASS();
}

/* ---- the fused MLP kernel ------------------------------------------------------------
   Same bits as the step-by-step path: each case trains twice in fresh contexts of
   the same seed, fused (the default) and with no_fused, and the weights, the mean
   loss and the accuracy must be identical, and the fused run must have run every
   step in the fused kernel (else the comparison would prove nothing). */
typedef struct tc_fused_case {
    const char *name;
    int D, H, C, B;
    size_t n;
    int epochs, hidden, out; /* activation layers after each dense (a layer kind; 0: none) */
    int no_bias1, no_bias2, u8, no_shuffle, progress_every, cosine_per_step, loss_sum, hinge_p;
    mnistcu_loss loss;
    float smoothing;
    mnistcu_optim_desc optim;
    mnistcu_precision precision;
} tc_fused_case;

/* count images of D = 28 x 28 bytes, or 1 x D, as IDX files in memory: a u8 dataset. */
static mnistcu_dataset *tc_u8_dataset(mnistcu_ctx *ctx, size_t count, int D, int classes, uint64_t seed)
{
    tu_rng rng = tu_rng_make(seed);
    int rows = D == 784 ? 28 : 1, cols = D / rows;
    size_t isz = 16 + count * (size_t)D, lsz = 8 + count, i;
    unsigned char *img = (unsigned char *)calloc(isz, 1), *lab = (unsigned char *)calloc(lsz, 1);
    mnistcu_dataset_desc dd;
    mnistcu_dataset *ds = NULL;
    img[2] = 8; img[3] = 3;
    img[4] = (unsigned char)(count >> 24); img[5] = (unsigned char)(count >> 16);
    img[6] = (unsigned char)(count >> 8); img[7] = (unsigned char)count;
    img[11] = (unsigned char)rows; img[15] = (unsigned char)cols;
    lab[2] = 8; lab[3] = 1;
    memcpy(lab + 4, img + 4, 4);
    for (i = 0; i < count * (size_t)D; ++i) img[16 + i] = (unsigned char)(tu_next(&rng) >> 56);
    for (i = 0; i < count; ++i) lab[8 + i] = (unsigned char)(img[16 + i * (size_t)D + 3] % classes);
    memset(&dd, 0, sizeof dd);
    dd.images_data = img;
    dd.images_size = isz;
    dd.labels_data = lab;
    dd.labels_size = lsz;
    dd.num_classes = classes;
    if (mnistcu_dataset_load(ctx, &dd, &ds) != MNISTCU_OK) ds = NULL;
    free(img);
    free(lab);
    return ds;
}

/* A training's progress reports every progress_every steps into curve (0: none), and a cosine schedule
   stepped per batch after warmup epochs (cosine_per_step 0: none). */
static void tc_train_extras(mnistcu_train_desc *td, int progress_every, tc_curve *curve, int cosine_per_step, int warmup)
{
    if (progress_every) {
        curve->n = 0;
        td->progress_every = (size_t)progress_every;
        td->progress = tc_record;
        td->progress_user = curve;
    }
    if (cosine_per_step) {
        td->schedule.kind = MNISTCU_SCHEDULE_COSINE;
        td->schedule.per_step = 1;
        td->schedule.warmup = warmup;
    }
}

static float *tc_fused_train(const tc_fused_case *c, int no_fused, size_t *np, mnistcu_train_result *res)
{
    mnistcu_ctx *ctx = tc_ctx_prec(MNISTCU_GEMM_OWN, c->precision);
    mnistcu_dataset *ds = NULL;
    mnistcu_model *m = NULL;
    mnistcu_model_desc md;
    mnistcu_train_desc td;
    tc_curve curve;
    float *p = NULL;
    int l = 0;
    if (!ctx) return NULL;
    ds = c->u8 ? tc_u8_dataset(ctx, c->n, c->D, c->C, 7) : tc_synthetic(ctx, c->n, (size_t)c->D, c->C, 7);
    memset(&md, 0, sizeof md);
    md.input_c = 1;
    md.input_h = 1;
    md.input_w = c->D;
    md.layers[l].kind = MNISTCU_LAYER_DENSE;
    md.layers[l].units = c->H;
    md.layers[l++].no_bias = c->no_bias1;
    if (c->hidden) md.layers[l++].kind = (mnistcu_layer_kind)c->hidden;
    md.layers[l].kind = MNISTCU_LAYER_DENSE;
    md.layers[l].units = c->C;
    md.layers[l++].no_bias = c->no_bias2;
    if (c->out) md.layers[l++].kind = (mnistcu_layer_kind)c->out;
    md.loss = c->loss;
    md.label_smoothing = c->smoothing;
    md.loss_sum = c->loss_sum;
    md.hinge_p = c->hinge_p;
    memset(&td, 0, sizeof td);
    td.epochs = c->epochs;
    td.batch_size = c->B;
    td.optim = c->optim;
    td.no_shuffle = c->no_shuffle;
    td.no_fused = no_fused;
    tc_train_extras(&td, c->progress_every, &curve, c->cosine_per_step, 3);
    if (!ds || mnistcu_model_create(ctx, &md, &m) != MNISTCU_OK || mnistcu_train(m, ds, &td, res) != MNISTCU_OK)
        printf("    %s (%s): %s\n", c->name, no_fused ? "step by step" : "fused", mnistcu_ctx_error(ctx));
    else {
        size_t n = mnistcu_model_num_params(m);
        *np = 2 * n; /* the parameters, then the last step's gradients */
        p = (float *)malloc(*np * sizeof(float));
        if (p && (mnistcu_model_get_params(m, p, n) != MNISTCU_OK || mnistcu_model_get_grads(m, p + n, n) != MNISTCU_OK)) {
            free(p);
            p = NULL;
        }
    }
    mnistcu_ctx_destroy(ctx);
    return p;
}

TEST cuda_fused_mlp_equals_unfused_bitwise(void)
{
    static tc_fused_case cases[13];
    int i, ncases = 0;
    tc_fused_case *c;
    memset(cases, 0, sizeof cases);
    /* P2's shape on bytes, a partial last batch */
    c = &cases[ncases++];
    c->name = "784-128-10 relu, u8, batch 64, SGD";
    c->D = 784; c->H = 128; c->C = 10; c->B = 64; c->n = 1000; c->epochs = 1;
    c->hidden = MNISTCU_LAYER_RELU; c->u8 = 1;
    c->optim.learning_rate = 0.1f;
    /* P1's shape: 8 units per block, three logits per block, file order, smoothing */
    c = &cases[ncases++];
    c->name = "784-1024-10 relu, batch 32, no shuffle, smoothing";
    c->D = 784; c->H = 1024; c->C = 10; c->B = 32; c->n = 336; c->epochs = 1;
    c->hidden = MNISTCU_LAYER_RELU; c->no_shuffle = 1; c->smoothing = 0.1f;
    c->optim.learning_rate = 0.01f;
    /* odd shapes (every chain padded), chunks of 3 steps, momentum */
    c = &cases[ncases++];
    c->name = "37-19-7 tanh, batch 13, Nesterov, chunks of 3";
    c->D = 37; c->H = 19; c->C = 7; c->B = 13; c->n = 100; c->epochs = 2;
    c->hidden = MNISTCU_LAYER_TANH; c->progress_every = 3;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f; c->optim.nesterov = 1; c->optim.weight_decay = 1e-3f;
    /* Adam, a rate that changes every step, no output bias */
    c = &cases[ncases++];
    c->name = "50-300-3 sigmoid, Adam amsgrad, per-step cosine";
    c->D = 50; c->H = 300; c->C = 3; c->B = 16; c->n = 170; c->epochs = 2;
    c->hidden = MNISTCU_LAYER_SIGMOID; c->no_bias2 = 1; c->cosine_per_step = 1;
    c->optim.kind = MNISTCU_OPTIM_ADAM; c->optim.learning_rate = 1e-3f; c->optim.amsgrad = 1;
    c->optim.weight_decay = 1e-4f;
    /* no hidden activation, a sigmoid on the outputs, MSE summed, RMSprop */
    c = &cases[ncases++];
    c->name = "20-40-5 identity/sigmoid, MSE sum, RMSprop centered";
    c->D = 20; c->H = 40; c->C = 5; c->B = 8; c->n = 50; c->epochs = 2;
    c->out = MNISTCU_LAYER_SIGMOID; c->loss = MNISTCU_LOSS_MSE; c->loss_sum = 1; c->no_bias1 = 1;
    c->optim.kind = MNISTCU_OPTIM_RMSPROP; c->optim.learning_rate = 0.01f; c->optim.momentum = 0.5f;
    c->optim.centered = 1;
    /* more units than multiprocessors: two per block, hinge, Adagrad */
    c = &cases[ncases++];
    c->name = "30-133-4 relu, hinge p2, Adagrad";
    c->D = 30; c->H = 133; c->C = 4; c->B = 64; c->n = 130; c->epochs = 2;
    c->hidden = MNISTCU_LAYER_RELU; c->loss = MNISTCU_LOSS_HINGE; c->hinge_p = 2;
    c->optim.kind = MNISTCU_OPTIM_ADAGRAD; c->optim.learning_rate = 0.05f;
    /* BCE on labels, AdamW */
    c = &cases[ncases++];
    c->name = "25-64-6 relu, BCE, AdamW, batch 100 (W2's gradient 4 rows a slice, 2 in the last batch)";
    c->D = 25; c->H = 64; c->C = 6; c->B = 100; c->n = 250; c->epochs = 2;
    c->hidden = MNISTCU_LAYER_RELU; c->loss = MNISTCU_LOSS_BCE;
    c->optim.kind = MNISTCU_OPTIM_ADAMW; c->optim.learning_rate = 1e-3f; c->optim.weight_decay = 0.01f;
    /* bytes for a width other than 784, no biases, dampening */
    c = &cases[ncases++];
    c->name = "64-32-10 sigmoid, u8, no biases, SGD dampening";
    c->D = 64; c->H = 32; c->C = 10; c->B = 20; c->n = 90; c->epochs = 2;
    c->hidden = MNISTCU_LAYER_SIGMOID; c->u8 = 1; c->no_bias1 = 1; c->no_bias2 = 1;
    c->optim.learning_rate = 0.1f; c->optim.momentum = 0.9f; c->optim.dampening = 0.3f;
    /* bytes of a width that is 4 mod 16 (the batch loads are 4 bytes each), a partial last batch */
    c = &cases[ncases++];
    c->name = "52-48-10 relu, u8, batch 40, momentum";
    c->D = 52; c->H = 48; c->C = 10; c->B = 40; c->n = 150; c->epochs = 2;
    c->hidden = MNISTCU_LAYER_RELU; c->u8 = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    /* a batch over the block's 256 threads: its statistics made by one warp in the next step's
       phase 1 (the batch after it has 50 rows), and in place where the next has 300 */
    c = &cases[ncases++];
    c->name = "40-64-10 relu, batch 300 of 650, statistics by one warp";
    c->D = 40; c->H = 64; c->C = 10; c->B = 300; c->n = 650; c->epochs = 1;
    c->hidden = MNISTCU_LAYER_RELU;
    c->optim.learning_rate = 0.1f;
    /* 13 classes (9 logits a block), units not a multiple of 16, chunks of 5 steps, Adam */
    c = &cases[ncases++];
    c->name = "48-100-13 relu, batch 64, chunks of 5, Adam";
    c->D = 48; c->H = 100; c->C = 13; c->B = 64; c->n = 400; c->epochs = 2;
    c->hidden = MNISTCU_LAYER_RELU; c->progress_every = 5;
    c->optim.kind = MNISTCU_OPTIM_ADAM; c->optim.learning_rate = 1e-3f;
    /* many classes: a block's logits over several rows, the loss rows' e^(z - max) in rounds, Adam */
    c = &cases[ncases++];
    c->name = "256-64-256 relu, 256 classes, batch 16, Adam";
    c->D = 256; c->H = 64; c->C = 256; c->B = 16; c->n = 60; c->epochs = 2;
    c->hidden = MNISTCU_LAYER_RELU;
    c->optim.kind = MNISTCU_OPTIM_ADAM; c->optim.learning_rate = 1e-3f;
    for (i = 0; i < ncases; ++i) {
        mnistcu_train_result ra, rb;
        size_t na = 0, nb = 0, steps;
        float *pa, *pb;
        c = &cases[i];
        memset(&ra, 0, sizeof ra);
        memset(&rb, 0, sizeof rb);
        pa = tc_fused_train(c, 0, &na, &ra);
        pb = tc_fused_train(c, 1, &nb, &rb);
        printf("    %-52s fused steps %lu of %lu, loss %.9g / %.9g\n", c->name, (unsigned long)ra.fused_steps,
               (unsigned long)ra.steps, ra.train_loss, rb.train_loss);
        steps = (c->n + (size_t)c->B - 1) / (size_t)c->B * (size_t)c->epochs;
        ASSERTm(c->name, pa && pb && na == nb);
        ASSERT_EQm(c->name, steps, ra.steps);
        ASSERT_EQm(c->name, steps, ra.fused_steps); /* the fused kernel ran them all */
        ASSERT_EQm(c->name, (size_t)0, rb.fused_steps);
        ASSERT_ARRAY_EQ_BITS_F(pa, pb, na);
        ASSERT_EQm(c->name, 0, memcmp(&ra.train_loss, &rb.train_loss, sizeof(double)));
        ASSERT_EQm(c->name, 0, memcmp(&ra.train_accuracy, &rb.train_accuracy, sizeof(double)));
        free(pa);
        free(pb);
    }
    PASS();
}

/* Where the fused kernel does not apply, training runs step by step and says so. */
TEST cuda_fused_mlp_declines_what_it_cannot_do(void)
{
    tc_fused_case c;
    mnistcu_train_result r;
    size_t np = 0;
    float *p;
    memset(&c, 0, sizeof c);
    c.name = "clipping";
    c.D = 20; c.H = 16; c.C = 3; c.B = 8; c.n = 40; c.epochs = 1;
    c.hidden = MNISTCU_LAYER_RELU;
    c.optim.learning_rate = 0.1f; c.optim.clip_norm = 1.0f;
    p = tc_fused_train(&c, 0, &np, &r);
    ASSERT(p);
    ASSERT_EQ((size_t)5, r.steps);
    ASSERT_EQ((size_t)0, r.fused_steps);
    free(p);
    c.optim.clip_norm = 0.0f;
    c.precision = MNISTCU_PRECISION_TF32; /* FP32 products only (without tensor cores the context is FP32) */
    p = tc_fused_train(&c, 0, &np, &r);
    ASSERT(p);
    ASSERT_EQ(tc_has_tensor_cores() ? (size_t)0 : (size_t)5, r.fused_steps);
    free(p);
    c.precision = MNISTCU_PRECISION_FP32;
    p = tc_fused_train(&c, 0, &np, &r);
    ASSERT(p);
    ASSERT_EQ((size_t)5, r.fused_steps);
    free(p);
    c.name = "16 units over 64 inputs"; /* W1's gradient in the skinny kernel's slices step by step */
    c.D = 64;
    p = tc_fused_train(&c, 0, &np, &r);
    ASSERT(p);
    ASSERT_EQ((size_t)5, r.steps);
    ASSERT_EQ((size_t)0, r.fused_steps);
    free(p);
    PASS();
}

/* ---- the fused LeNet-5 kernel ----------------------------------------------------------
   Opt-in (mnistcu_train_desc.fused_cnn) and not bitwise: its sums run in other
   orders. Each case trains LeNet-5 from the same initial weights fused and step
   by step; the fused run must have run every step in the kernel, and, per
   tensor, the largest difference between the two runs' weights must stay within
   1e-3 of the largest change the step by step run made (what a wrong gradient
   of any one weight, or a wrong scale of the partial last batch, exceeds by
   orders of magnitude: the kernel's orders measured 1e-7 to 1e-4 of it over
   1 to 20 steps, bench/RESULTS.md), the last step's gradients within 1e-3 of
   their largest, the mean loss within 1e-5 relative. A second fused run must
   repeat the first to the bit. On a GPU without what the kernel needs (compute
   capability 9.0, 203 KB of shared memory a block) it must decline, and the
   training run step by step. */
typedef struct tc_lenet_case {
    const char *name;
    size_t n;
    int B, epochs, progress_every, cosine_per_step, pool_relu, cublas, f32;
    float smoothing;
    mnistcu_optim_desc optim;
} tc_lenet_case;

static int tc_lenet_fits(void)
{
    int dev = 0, major = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return 0;
    return major >= 9 && (size_t)optin >= (size_t)MNISTCU__LS_END * sizeof(float);
}

/* the initial weights, then the trained ones, then the last step's gradients: 3 * *np floats */
static float *tc_lenet_train(const tc_lenet_case *c, int fused, size_t *np, mnistcu_train_result *res)
{
    mnistcu_ctx *ctx = tc_ctx_prec(c->cublas ? MNISTCU_GEMM_CUBLAS : MNISTCU_GEMM_OWN, MNISTCU_PRECISION_FP32);
    mnistcu_dataset *ds = NULL;
    mnistcu_model *m = NULL;
    mnistcu_model_desc md;
    mnistcu_train_desc td;
    tc_curve curve;
    float *p = NULL;
    const char *spec = c->pool_relu ? "1x28x28 conv5x5x6 maxpool2 relu conv5x5x16 relu maxpool2 flatten dense120 relu "
                                      "dense84 relu dense10"
                                    : "lenet5";
    if (!ctx) return NULL;
    ds = c->f32 ? tc_synthetic(ctx, c->n, 784, 10, 11) : tc_u8_dataset(ctx, c->n, 784, 10, 11);
    memset(&td, 0, sizeof td);
    td.epochs = c->epochs;
    td.batch_size = c->B;
    td.optim = c->optim;
    td.fused_cnn = fused;
    tc_train_extras(&td, c->progress_every, &curve, c->cosine_per_step, 2);
    if (ds && mnistcu_model_desc_parse(ctx, spec, &md) == MNISTCU_OK) {
        md.label_smoothing = c->smoothing;
        if (mnistcu_model_create(ctx, &md, &m) == MNISTCU_OK) {
            size_t n = mnistcu_model_num_params(m);
            p = (float *)malloc(3 * n * sizeof(float));
            *np = n;
            if (!p || mnistcu_model_get_params(m, p, n) != MNISTCU_OK || mnistcu_train(m, ds, &td, res) != MNISTCU_OK ||
                mnistcu_model_get_params(m, p + n, n) != MNISTCU_OK ||
                mnistcu_model_get_grads(m, p + 2 * n, n) != MNISTCU_OK) {
                free(p);
                p = NULL;
            }
        }
    }
    if (!p) printf("    %s (%s): %s\n", c->name, fused ? "fused" : "step by step", mnistcu_ctx_error(ctx));
    mnistcu_ctx_destroy(ctx);
    return p;
}

TEST cuda_fused_lenet_close_to_step_by_step(void)
{
    static tc_lenet_case cases[3];
    int i, ncases = 0, fits = tc_lenet_fits();
    tc_lenet_case *c;
    memset(cases, 0, sizeof cases);
    /* P4's recipe, a partial last batch of 8 */
    c = &cases[ncases++];
    c->name = "lenet5, batch 64, SGD momentum, 200 samples";
    c->n = 200; c->B = 64; c->epochs = 1;
    c->optim.learning_rate = 0.02f; c->optim.momentum = 0.9f;
    /* the relu on the first pool, smaller batches, chunks of 2 steps, Adam with a rate each step, smoothing */
    c = &cases[ncases++];
    c->name = "relu after pool 1, batch 24, Adam, per-step cosine, chunks of 2";
    c->n = 100; c->B = 24; c->epochs = 2; c->progress_every = 2; c->cosine_per_step = 1; c->pool_relu = 1;
    c->smoothing = 0.1f;
    c->optim.kind = MNISTCU_OPTIM_ADAM; c->optim.learning_rate = 1e-3f;
    /* Nesterov with weight decay, one sample in the last batch, float images */
    c = &cases[ncases++];
    c->name = "batch 50, Nesterov, weight decay, 101 float samples";
    c->n = 101; c->B = 50; c->epochs = 1; c->f32 = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f; c->optim.nesterov = 1; c->optim.weight_decay = 5e-4f;
    for (i = 0; i < ncases; ++i) {
        mnistcu_train_result ra, rb, rc;
        size_t na = 0, nb = 0, nc = 0, steps, k, t;
        float *pa, *pb, *pc;
        double worst = 0.0, worst_g = 0.0, gmax = 0.0;
        mnistcu_ctx *ctx = tc_ctx_prec(MNISTCU_GEMM_OWN, MNISTCU_PRECISION_FP32);
        mnistcu_model *m = NULL;
        c = &cases[i];
        memset(&ra, 0, sizeof ra);
        memset(&rb, 0, sizeof rb);
        memset(&rc, 0, sizeof rc);
        pa = tc_lenet_train(c, 1, &na, &ra);
        pb = tc_lenet_train(c, 0, &nb, &rb);
        pc = tc_lenet_train(c, 1, &nc, &rc);
        steps = (c->n + (size_t)c->B - 1) / (size_t)c->B * (size_t)c->epochs;
        ASSERTm(c->name, ctx && pa && pb && pc && na == nb && nc == na);
        ASSERT_EQm(c->name, steps, ra.steps);
        ASSERT_EQm(c->name, fits ? steps : (size_t)0, ra.fused_cnn_steps);
        ASSERT_EQm(c->name, ra.fused_cnn_steps, ra.fused_steps);
        ASSERT_EQm(c->name, (size_t)0, rb.fused_steps);
        ASSERT_EQm(c->name, 0, memcmp(pa, pc, 3 * na * sizeof(float))); /* its own run again: the same bits */
        ASSERT_EQm(c->name, 0, memcmp(pa, pb, na * sizeof(float)));      /* the same initial weights */
        ASSERT_EQm(c->name, MNISTCU_OK, mnistcu_model_create_spec(ctx, "lenet5", &m));
        for (t = 0; t < (size_t)mnistcu_model_num_tensors(m); ++t) { /* per tensor, the layouts are the same */
            mnistcu_tensor_info ti;
            size_t off = 0, u;
            double dmax = 0.0, cmax = 0.0;
            ASSERT_EQm(c->name, MNISTCU_OK, mnistcu_model_tensor_info(m, (int)t, &ti));
            for (u = 0; u < t; ++u) {
                mnistcu_tensor_info tu;
                mnistcu_model_tensor_info(m, (int)u, &tu);
                off += tu.count;
            }
            for (k = off; k < off + ti.count; ++k) {
                double d = fabs((double)pa[na + k] - (double)pb[na + k]), ch = fabs((double)pb[na + k] - (double)pb[k]);
                ASSERTm(c->name, d == d);
                if (d > dmax) dmax = d;
                if (ch > cmax) cmax = ch;
            }
            ASSERTm(c->name, cmax > 0.0); /* it trained */
            if (dmax / cmax > worst) worst = dmax / cmax;
            ASSERT_LTEm(ti.name, dmax, 1e-3 * cmax);
        }
        for (k = 0; k < na; ++k) {
            double d = fabs((double)pa[2 * na + k] - (double)pb[2 * na + k]);
            if (fabs((double)pb[2 * na + k]) > gmax) gmax = fabs((double)pb[2 * na + k]);
            if (d > worst_g) worst_g = d;
        }
        printf("    %-64s fused %lu of %lu steps, loss %.9g / %.9g, weights %.2e, gradients %.2e\n", c->name,
               (unsigned long)ra.fused_cnn_steps, (unsigned long)ra.steps, ra.train_loss, rb.train_loss, worst,
               gmax > 0.0 ? worst_g / gmax : worst_g);
        ASSERT_LTEm(c->name, worst_g, 1e-3 * gmax);
        ASSERT_IN_RANGEm(c->name, rb.train_loss, ra.train_loss, 1e-5 * (1.0 + fabs(rb.train_loss)));
        mnistcu_model_destroy(m);
        mnistcu_ctx_destroy(ctx);
        free(pa);
        free(pb);
        free(pc);
    }
    PASS();
}

/* What it cannot do, it declines: training runs step by step and says so. */
TEST cuda_fused_lenet_declines_what_it_cannot_do(void)
{
    tc_lenet_case c;
    mnistcu_train_result r;
    size_t np = 0;
    float *p;
    memset(&c, 0, sizeof c);
    c.name = "batch 65";
    c.n = 70; c.B = 65; c.epochs = 1;
    c.optim.learning_rate = 0.02f;
    p = tc_lenet_train(&c, 1, &np, &r);
    ASSERT(p);
    ASSERT_EQ((size_t)2, r.steps);
    ASSERT_EQ((size_t)0, r.fused_cnn_steps);
    free(p);
    c.name = "clipping";
    c.B = 64; c.optim.clip_norm = 1.0f;
    p = tc_lenet_train(&c, 1, &np, &r);
    ASSERT(p);
    ASSERT_EQ((size_t)0, r.fused_cnn_steps);
    free(p);
#ifdef MNISTCU_CUBLAS
    c.name = "cuBLAS's products";
    c.optim.clip_norm = 0.0f;
    c.cublas = 1;
    p = tc_lenet_train(&c, 1, &np, &r);
    ASSERT(p);
    ASSERT_EQ((size_t)0, r.fused_cnn_steps);
    free(p);
    c.cublas = 0;
#endif
    c.name = "batch 64";
    c.optim.clip_norm = 0.0f;
    p = tc_lenet_train(&c, 1, &np, &r);
    ASSERT(p);
    ASSERT_EQ(tc_lenet_fits() ? (size_t)2 : (size_t)0, r.fused_cnn_steps);
    free(p);
    PASS();
}

/* ---- the cluster MLP kernel ------------------------------------------------------------
   Opt-in (mnistcu_train_desc.fused_mlp_clusters) and not bitwise: its sums run
   in other orders. Each case trains a one-hidden-layer MLP from the same initial
   weights in the kernel and step by step (no_fused); the first run must have run
   every step in the kernel where the device holds its clusters, and, per tensor,
   the largest difference between the two runs' weights must stay within 1e-3 of
   the largest change the step by step run made (a wrong gradient of any one
   weight, a unit past H that moved, or a wrong scale of the partial last batch
   exceeds it by orders of magnitude: bench/mlp_cluster.cu measured the orders'
   difference at 2.3e-7 of the largest weight after 20 steps), the last step's
   gradients and each slot of the optimizer's state, per tensor too, within 1e-3
   of the tensor's largest, the mean loss and accuracy within 1e-5. A second run
   must repeat the first to the bit. The cases hold every instance of the kernel
   (batches up to 32 and 64; 8, 16, 32 and 64 units a cluster, with units past
   H), every optimizer, W1's state in shared memory (1, 2 and 3 slots) and in
   the arena (the 64-row, 64-unit instance has no room for it), several
   launches an epoch, a sum reduction, 16 classes and inputs that are not 784, and both forms of x:
   the standard normalisation (a shift: x's floats, three TF32 parts a product) and x / 255 (no
   shift: x's bytes, two parts; mnistcu__mc_args.xb). */
typedef struct tc_mc_case {
    const char *name, *spec;
    size_t n;
    int D, C, B, epochs, progress_every, cosine_per_step, loss_sum;
    int unit; /* x / 255 (MNISTCU_NORM_UNIT), not the standard normalisation */
    mnistcu_optim_desc optim;
} tc_mc_case;

/* whether the device holds the cluster kernel's G clusters for H units at batch B */
static int tc_mc_fits(int B, int H)
{
    int dev = 0, major = 0, u, G, nc = 0, slot = 0;
    size_t bytes = 0;
    mnistcu__mc_kernel k;
    cudaLaunchConfig_t cfg = cudaLaunchConfig_t();
    cudaLaunchAttribute at[1];
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 9)
        return 0;
    for (u = 8; 16 * u < H; u *= 2) {}
    G = (H + u - 1) / u;
    k = mnistcu__mc_pick(B <= 32 ? 32 : 64, u, &bytes, &slot);
    memset(at, 0, sizeof at);
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = MNISTCU__MC_S;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)(G * MNISTCU__MC_S));
    cfg.blockDim = dim3(MNISTCU__MC_T);
    cfg.dynamicSmemBytes = bytes;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    if (cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&nc, (const void *)k, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return nc >= G;
}

/* the initial weights, then the trained ones, then the last step's gradients, then the optimizer's
   state (mnistcu__opt_slots slots): (3 + slots) * *np floats */
static float *tc_mc_train(const tc_mc_case *c, int clusters, size_t *np, mnistcu_train_result *res, int f32, int clip)
{
    mnistcu_ctx *ctx = tc_ctx_prec(MNISTCU_GEMM_OWN, MNISTCU_PRECISION_FP32);
    mnistcu_dataset *ds = NULL;
    mnistcu_model *m = NULL;
    mnistcu_model_desc md;
    mnistcu_train_desc td;
    tc_curve curve;
    float *p = NULL;
    if (!ctx) return NULL;
    ds = f32 ? tc_synthetic(ctx, c->n, (size_t)c->D, c->C, 11) : tc_u8_dataset(ctx, c->n, c->D, c->C, 11);
    if (ds && c->unit) mnistcu__dataset_set_norm(ds, MNISTCU_NORM_UNIT);
    memset(&td, 0, sizeof td);
    td.epochs = c->epochs;
    td.batch_size = c->B;
    td.optim = c->optim;
    if (clip) td.optim.clip_norm = 1.0f;
    td.fused_mlp_clusters = clusters;
    td.no_fused = !clusters;
    tc_train_extras(&td, c->progress_every, &curve, c->cosine_per_step, 2);
    if (ds && mnistcu_model_desc_parse(ctx, c->spec, &md) == MNISTCU_OK) {
        md.loss_sum = c->loss_sum;
        if (mnistcu_model_create(ctx, &md, &m) == MNISTCU_OK) {
            size_t n = mnistcu_model_num_params(m), slots = (size_t)mnistcu__opt_slots(&td.optim);
            p = (float *)malloc((3 + slots) * n * sizeof(float));
            *np = n;
            if (!p || mnistcu_model_get_params(m, p, n) != MNISTCU_OK || mnistcu_train(m, ds, &td, res) != MNISTCU_OK ||
                mnistcu_model_get_params(m, p + n, n) != MNISTCU_OK ||
                mnistcu_model_get_grads(m, p + 2 * n, n) != MNISTCU_OK || m->state_floats != slots * n ||
                (slots && cudaMemcpy(p + 3 * n, m->state, slots * n * sizeof(float), cudaMemcpyDeviceToHost) !=
                              cudaSuccess)) {
                free(p);
                p = NULL;
            }
        }
    }
    if (!p) printf("    %s (%s): %s\n", c->name, clusters ? "clusters" : "step by step", mnistcu_ctx_error(ctx));
    mnistcu_ctx_destroy(ctx);
    return p;
}

TEST cuda_fused_mlp_clusters_close_to_step_by_step(void)
{
    static tc_mc_case cases[20];
    int i, ncases = 0;
    tc_mc_case *c;
    memset(cases, 0, sizeof cases);
    /* P2's shape and recipe, two epochs (two launches, the flags' count going on), a last batch of 8 */
    c = &cases[ncases++];
    c->name = "784-128-10, batch 64, SGD, 200 samples, 2 epochs";
    c->spec = "784 dense128 relu dense10"; c->D = 784; c->C = 10;
    c->n = 200; c->B = 64; c->epochs = 2;
    c->optim.learning_rate = 0.1f;
    /* units past H (13 clusters of 8, the last with 4), batch 50 in the 64 instance, AdamW with amsgrad (3
       state slots), a rate each step, chunks of 2 steps */
    c = &cases[ncases++];
    c->name = "784-100-10, batch 50, AdamW amsgrad, per-step cosine, chunks of 2";
    c->spec = "784 dense100 relu dense10"; c->D = 784; c->C = 10;
    c->n = 130; c->B = 50; c->epochs = 2; c->progress_every = 2; c->cosine_per_step = 1;
    c->optim.kind = MNISTCU_OPTIM_ADAMW; c->optim.learning_rate = 1e-3f; c->optim.weight_decay = 0.01f;
    c->optim.amsgrad = 1;
    /* P1's shape: 64 units a cluster (12 warps of W1's gradient tiles), Nesterov with weight decay, a last batch of 5 */
    c = &cases[ncases++];
    c->name = "784-1024-10, batch 32, Nesterov, weight decay, 101 samples";
    c->spec = "784 dense1024 relu dense10"; c->D = 784; c->C = 10;
    c->n = 101; c->B = 32; c->epochs = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f; c->optim.nesterov = 1; c->optim.weight_decay = 5e-4f;
    /* 32 units a cluster in 10 clusters, 196 inputs (slices of 8 and 9 words), 16 classes, the sum reduction,
       RMSprop centered with momentum */
    c = &cases[ncases++];
    c->name = "196-300-16, batch 20, RMSprop centered, momentum, sum loss";
    c->spec = "196 dense300 relu dense16"; c->D = 196; c->C = 16;
    c->n = 90; c->B = 20; c->epochs = 1; c->loss_sum = 1;
    c->optim.kind = MNISTCU_OPTIM_RMSPROP; c->optim.learning_rate = 1e-3f; c->optim.momentum = 0.5f;
    c->optim.centered = 1;
    /* 16 units a cluster, batches of one (the first block's row alone), 3 classes, Adagrad (a small rate:
       Adagrad's first steps are about lr sign(g), and with a rate that saturates the softmax, dz = p - y
       near 0 has no correct bits in any order of the sums, so two orders' steps differ by the rate) */
    c = &cases[ncases++];
    c->name = "784-200-3, batch 1, Adagrad, 7 samples";
    c->spec = "784 dense200 relu dense3"; c->D = 784; c->C = 3;
    c->n = 7; c->B = 1; c->epochs = 1;
    c->optim.kind = MNISTCU_OPTIM_ADAGRAD; c->optim.learning_rate = 1e-4f;
    /* the other instances: 64 units a cluster at batch 64 (the largest shared memory), the last cluster
       40 units, plain SGD (its fast steps skip the units past H); 16 units at batch 40, with momentum;
       32 units at batch 64; 8 units at batch 16 */
    c = &cases[ncases++];
    c->name = "784-1000-10, batch 64, SGD, 150 samples";
    c->spec = "784 dense1000 relu dense10"; c->D = 784; c->C = 10;
    c->n = 150; c->B = 64; c->epochs = 1;
    c->optim.learning_rate = 0.05f;
    c = &cases[ncases++];
    c->name = "784-256-10, batch 40, SGD momentum, 100 samples";
    c->spec = "784 dense256 relu dense10"; c->D = 784; c->C = 10;
    c->n = 100; c->B = 40; c->epochs = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    c = &cases[ncases++];
    c->name = "784-512-10, batch 64, SGD, 131 samples";
    c->spec = "784 dense512 relu dense10"; c->D = 784; c->C = 10;
    c->n = 131; c->B = 64; c->epochs = 1;
    c->optim.learning_rate = 0.05f;
    c = &cases[ncases++];
    c->name = "784-120-10, batch 16, SGD, 50 samples";
    c->spec = "784 dense120 relu dense10"; c->D = 784; c->C = 10;
    c->n = 50; c->B = 16; c->epochs = 1;
    c->optim.learning_rate = 0.1f;
    /* few inputs: 196 with 16 units a cluster (slices of 32 and 36 inputs: x's column of ones in the tiles'
       middle), and 64 with 64 units (slices of 8 and 12 inputs: one tile of inputs, most of its rows past kn) */
    c = &cases[ncases++];
    c->name = "196-200-10, batch 24, SGD, 60 samples";
    c->spec = "196 dense200 relu dense10"; c->D = 196; c->C = 10;
    c->n = 60; c->B = 24; c->epochs = 1;
    c->optim.learning_rate = 0.1f;
    c = &cases[ncases++];
    c->name = "64-700-10, batch 8, SGD momentum, 30 samples";
    c->spec = "64 dense700 relu dense10"; c->D = 64; c->C = 10;
    c->n = 30; c->B = 8; c->epochs = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.5f;
    /* the 64-row, 64-unit instance with momentum: W1's state in the arena, two epochs (two launches) */
    c = &cases[ncases++];
    c->name = "784-1000-10, batch 64, SGD momentum, 100 samples, 2 epochs";
    c->spec = "784 dense1000 relu dense10"; c->D = 784; c->C = 10;
    c->n = 100; c->B = 64; c->epochs = 2;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    /* x / 255, x's bytes in the products: P1's and P2's recipes, momentum with weight decay and W1's
       state in the arena, and the sum reduction in the 32-row, 32-unit instance with inputs that are not
       784 (SGD: Adam's, RMSprop's and Adagrad's first steps are about lr sign(g), and the sign of a
       gradient that cancels to near 0 differs between two orders of the sums, by a whole step) */
    c = &cases[ncases++];
    c->name = "784-1024-10, batch 32, SGD, 101 samples, x / 255";
    c->spec = "784 dense1024 relu dense10"; c->D = 784; c->C = 10;
    c->n = 101; c->B = 32; c->epochs = 1; c->unit = 1;
    c->optim.learning_rate = 0.05f;
    /* plain SGD in the 32-row, 64-unit instance: with x's floats over chunks of 2 steps and a short
       last batch, and with x / 255 at batch 30 over 2 epochs with a rate each step */
    c = &cases[ncases++];
    c->name = "784-1024-10, batch 32, SGD, 101 samples, chunks of 2";
    c->spec = "784 dense1024 relu dense10"; c->D = 784; c->C = 10;
    c->n = 101; c->B = 32; c->epochs = 1; c->progress_every = 2;
    c->optim.learning_rate = 0.05f;
    c = &cases[ncases++];
    c->name = "784-700-10, batch 30, SGD, 200 samples, 2 epochs, per-step cosine, x / 255";
    c->spec = "784 dense700 relu dense10"; c->D = 784; c->C = 10;
    c->n = 200; c->B = 30; c->epochs = 2; c->cosine_per_step = 1; c->unit = 1;
    c->optim.learning_rate = 0.05f;
    c = &cases[ncases++];
    c->name = "784-128-10, batch 64, SGD, 200 samples, 2 epochs, x / 255";
    c->spec = "784 dense128 relu dense10"; c->D = 784; c->C = 10;
    c->n = 200; c->B = 64; c->epochs = 2; c->unit = 1;
    c->optim.learning_rate = 0.1f;
    c = &cases[ncases++];
    c->name = "784-1000-10, batch 64, SGD momentum, weight decay, 150 samples, x / 255";
    c->spec = "784 dense1000 relu dense10"; c->D = 784; c->C = 10;
    c->n = 150; c->B = 64; c->epochs = 1; c->unit = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f; c->optim.weight_decay = 1e-3f;
    c = &cases[ncases++];
    c->name = "196-300-16, batch 20, SGD, sum loss, 90 samples, x / 255";
    c->spec = "196 dense300 relu dense16"; c->D = 196; c->C = 16;
    c->n = 90; c->B = 20; c->epochs = 1; c->unit = 1; c->loss_sum = 1;
    c->optim.learning_rate = 0.01f;
    for (i = 0; i < ncases; ++i) {
        mnistcu_train_result ra, rb, rc;
        size_t na = 0, nb = 0, nc = 0, steps, k, t, s, slots;
        float *pa, *pb, *pc;
        double worst = 0.0, worst_g = 0.0, worst_s = 0.0;
        int H = 0;
        mnistcu_ctx *ctx = tc_ctx_prec(MNISTCU_GEMM_OWN, MNISTCU_PRECISION_FP32);
        mnistcu_model *m = NULL;
        c = &cases[i];
        sscanf(c->spec, "%*d dense%d", &H);
        memset(&ra, 0, sizeof ra);
        memset(&rb, 0, sizeof rb);
        memset(&rc, 0, sizeof rc);
        pa = tc_mc_train(c, 1, &na, &ra, 0, 0);
        pb = tc_mc_train(c, 0, &nb, &rb, 0, 0);
        pc = tc_mc_train(c, 1, &nc, &rc, 0, 0);
        steps = (c->n + (size_t)c->B - 1) / (size_t)c->B * (size_t)c->epochs;
        ASSERTm(c->name, ctx && pa && pb && pc && na == nb && nc == na);
        slots = (size_t)mnistcu__opt_slots(&c->optim);
        ASSERT_EQm(c->name, steps, ra.steps);
        ASSERT_EQm(c->name, tc_mc_fits(c->B, H) ? steps : (size_t)0, ra.fused_cluster_steps);
        ASSERT_EQm(c->name, (size_t)0, rb.fused_steps);
        ASSERT_EQm(c->name, 0, memcmp(pa, pc, (3 + slots) * na * sizeof(float))); /* its own run again: the same bits */
        ASSERT_EQm(c->name, 0, memcmp(pa, pb, na * sizeof(float)));      /* the same initial weights */
        ASSERT_EQm(c->name, MNISTCU_OK, mnistcu_model_create_spec(ctx, c->spec, &m));
        for (t = 0; t < (size_t)mnistcu_model_num_tensors(m); ++t) { /* per tensor */
            mnistcu_tensor_info ti;
            size_t off = 0, u;
            double dmax = 0.0, cmax = 0.0;
            ASSERT_EQm(c->name, MNISTCU_OK, mnistcu_model_tensor_info(m, (int)t, &ti));
            for (u = 0; u < t; ++u) {
                mnistcu_tensor_info tu;
                mnistcu_model_tensor_info(m, (int)u, &tu);
                off += tu.count;
            }
            double gd = 0.0, gm = 0.0;
            for (k = off; k < off + ti.count; ++k) {
                double d = fabs((double)pa[na + k] - (double)pb[na + k]), ch = fabs((double)pb[na + k] - (double)pb[k]);
                double dg = fabs((double)pa[2 * na + k] - (double)pb[2 * na + k]);
                ASSERTm(c->name, d == d && dg == dg);
                if (d > dmax) dmax = d;
                if (ch > cmax) cmax = ch;
                if (dg > gd) gd = dg;
                if (fabs((double)pb[2 * na + k]) > gm) gm = fabs((double)pb[2 * na + k]);
            }
            ASSERTm(c->name, cmax > 0.0 && gm > 0.0); /* it trained, and the last step had gradients */
            if (dmax / cmax > worst) worst = dmax / cmax;
            if (gd / gm > worst_g) worst_g = gd / gm;
            ASSERT_LTEm(ti.name, dmax, 1e-3 * cmax);
            ASSERT_LTEm(ti.name, gd, 1e-3 * gm); /* per tensor: W1's gradients are far smaller than b2's */
            for (s = 0; s < slots; ++s) { /* the state the next launch (or a checkpoint) takes on */
                const float *sa = pa + (3 + s) * na, *sb = pb + (3 + s) * na;
                double sd = 0.0, sm = 0.0;
                for (k = off; k < off + ti.count; ++k) {
                    const double d = fabs((double)sa[k] - (double)sb[k]);
                    ASSERTm(c->name, d == d);
                    if (d > sd) sd = d;
                    if (fabs((double)sb[k]) > sm) sm = fabs((double)sb[k]);
                }
                ASSERTm(c->name, sm > 0.0); /* every slot took steps */
                if (sd / sm > worst_s) worst_s = sd / sm;
                ASSERT_LTEm(ti.name, sd, 1e-3 * sm);
            }
        }
        printf("    %-64s clusters %lu of %lu steps, loss %.9g / %.9g, weights %.2e, gradients %.2e, state %.2e\n",
               c->name, (unsigned long)ra.fused_cluster_steps, (unsigned long)ra.steps, ra.train_loss, rb.train_loss,
               worst, worst_g, worst_s);
        if (!tc_mc_fits(c->B, H))
            printf("    (this device does not hold the kernel's clusters: the declined path was compared)\n");
        ASSERT_IN_RANGEm(c->name, rb.train_loss, ra.train_loss, 1e-5 * (1.0 + fabs(rb.train_loss)));
        ASSERT_IN_RANGEm(c->name, rb.train_accuracy, ra.train_accuracy, 1e-5);
        mnistcu_model_destroy(m);
        mnistcu_ctx_destroy(ctx);
        free(pa);
        free(pb);
        free(pc);
    }
    PASS();
}

/* The kernel alone, twice, at 8 and at 64 units a cluster (the latter with momentum, whose state of W1
   is in shared memory, and with plain SGD and x / 255): the same bits, every step in it where the
   device holds its clusters. Small enough for compute-sanitizer's racecheck (tests/run_gpu_tests.sh),
   which takes minutes over the test above. */
TEST cuda_fused_mlp_clusters_repeats(void)
{
    static tc_mc_case cases[3];
    int i;
    memset(cases, 0, sizeof cases);
    cases[0].name = "784-128-10, batch 64, 130 samples";
    cases[0].spec = "784 dense128 relu dense10";
    cases[0].n = 130; cases[0].B = 64;
    cases[1].name = "784-1024-10, batch 32, 70 samples, x / 255";
    cases[1].spec = "784 dense1024 relu dense10";
    cases[1].n = 70; cases[1].B = 32; cases[1].unit = 1; /* x's bytes in the products (mnistcu__mc_args.xb) */
    cases[2].name = "784-1024-10, batch 32, 70 samples, plain SGD, x / 255";
    cases[2].spec = "784 dense1024 relu dense10";
    cases[2].n = 70; cases[2].B = 32; cases[2].unit = 1;
    for (i = 0; i < 3; ++i) {
        tc_mc_case *c = &cases[i];
        mnistcu_train_result ra, rb;
        size_t na = 0, nb = 0, steps = (c->n + (size_t)c->B - 1) / (size_t)c->B;
        float *pa, *pb;
        int H = 0;
        c->D = 784; c->C = 10; c->epochs = 1;
        c->optim.learning_rate = 0.05f;
        c->optim.momentum = i == 1 ? 0.9f : 0.0f;
        sscanf(c->spec, "%*d dense%d", &H);
        memset(&ra, 0, sizeof ra);
        memset(&rb, 0, sizeof rb);
        pa = tc_mc_train(c, 1, &na, &ra, 0, 0);
        pb = tc_mc_train(c, 1, &nb, &rb, 0, 0);
        ASSERTm(c->name, pa && pb && na == nb);
        ASSERT_EQm(c->name, tc_mc_fits(c->B, H) ? steps : (size_t)0, ra.fused_cluster_steps);
        ASSERT_EQm(c->name, ra.fused_cluster_steps, rb.fused_cluster_steps);
        ASSERTm(c->name, memcmp(pa, pa + na, na * sizeof(float)) != 0); /* it trained */
        ASSERT_EQm(c->name, 0, memcmp(pa, pb, 3 * na * sizeof(float)));
        free(pa);
        free(pb);
    }
    PASS();
}

/* What it cannot do, it declines: training runs in the fused MLP kernel or step by step. */
TEST cuda_fused_mlp_clusters_declines_what_it_cannot_do(void)
{
    static const struct { const char *name, *spec; int B, f32, clip; } no[] = {
        {"batch 65", "784 dense128 relu dense10", 65, 0, 0},
        {"a tanh", "784 dense128 tanh dense10", 64, 0, 0},
        {"two hidden layers", "784 dense64 relu dense32 relu dense10", 64, 0, 0},
        {"1025 hidden units", "784 dense1025 relu dense10", 32, 0, 0},
        {"17 classes", "784 dense128 relu dense17", 64, 0, 0},
        {"float images", "784 dense128 relu dense10", 64, 1, 0},
        {"clipping", "784 dense128 relu dense10", 64, 0, 1},
    };
    size_t i;
    for (i = 0; i < sizeof no / sizeof no[0]; ++i) {
        tc_mc_case c;
        mnistcu_train_result r;
        size_t np = 0;
        float *p;
        memset(&c, 0, sizeof c);
        memset(&r, 0, sizeof r);
        c.name = no[i].name;
        c.spec = no[i].spec;
        c.D = 784;
        c.C = strstr(c.spec, "dense17") ? 17 : 10;
        c.n = 70; c.B = no[i].B; c.epochs = 1;
        c.optim.learning_rate = 0.02f;
        p = tc_mc_train(&c, 1, &np, &r, no[i].f32, no[i].clip);
        ASSERTm(c.name, p);
        ASSERT_EQm(c.name, (size_t)((70 + c.B - 1) / c.B), r.steps);
        ASSERT_EQm(c.name, (size_t)0, r.fused_cluster_steps);
        free(p);
    }
    PASS();
}

/* ---- the training step as a CUDA graph ------------------------------------------------
   Same bits as launching the kernels one by one: each case trains twice in fresh
   contexts of the same seed, with graphs (the default) and with no_graph, and
   the weights, the last gradients, the running statistics, the host's counters
   (steps, batch norm's batches), the mean loss and accuracy, and every report's
   loss must be identical. The cases together hold every layer kind (checked),
   both batch sizes of an epoch, several chunks per epoch, the per-step values
   (a per-step schedule, Adam's bias corrections, dropout, augmentation), the
   clipping and l2 kernels, a validation set evaluated between epochs, and the
   cuBLAS and cuDNN paths. */
typedef struct tc_graph_case {
    const char *name, *spec;
    mnistcu_gemm gemm;
    mnistcu_cnn cnn;
    size_t n, B;
    int epochs, u8, progress_every, cosine_per_step, augment, validation;
    mnistcu_optim_desc optim;
    size_t F;                 /* features (0: 784) */
    int classes;              /* 0: 10 */
    mnistcu_loss loss;        /* DEFAULT: the model's (softmax cross-entropy) */
    int loss_sum, hinge_p;
    float smoothing;
} tc_graph_case;

typedef struct tc_graph_run {
    float *p;                 /* parameters, gradients, buffers; then, with tc_want_state, the optimizer state */
    size_t np, nb, ns;
    uint64_t steps;
    uint64_t bn_pool;         /* passes in which a batch norm took the max pool after it */
    uint64_t conv_pool;       /* backward passes in which a first convolution routed its max pool's gradient */
    uint64_t col_pool;        /* forward passes in which a convolution on the columns path made its pool's output */
    size_t col_pool_parts;    /* ... from its product's K slices (likewise) */
    uint64_t col_pool_back;   /* backward passes in which that pool wrote the convolution's output gradient */
    uint64_t pool_cols;       /* forward passes in which a max pool wrote the next convolution's columns */
    int wg;                   /* the context had Hopper's warp-group kernel */
    int sms;                  /* ... and counted that many multiprocessors */
    uint64_t side_forks;      /* branches launched on the second stream (graph captures count once) */
    size_t wg_epi;            /* Hopper's TF32X3 products with act' or the optimizer's step in them (likewise) */
    size_t wg64;              /* ... of them all, in 128 x 64 tiles (likewise) */
    uint64_t bias_steps;      /* dense layers' biases stepped by their gradients' kernel (likewise) */
    uint64_t side_head_forks; /* of side_forks, the head layer's weight gradient's */
    size_t head_res;          /* head kernels with the weights and rows all in shared memory (likewise) */
    size_t begin_gathers;     /* steps whose gather took the step's start (likewise) */
    uint64_t side_dw_forks;   /* of side_forks, dense weight gradients with their step (likewise) */
    int64_t batches[MNISTCU_MAX_MODEL_LAYERS];
    mnistcu_train_result res;
    tc_curve curve;
} tc_graph_run;

static int tc_upd_off;    /* mnistcu_train_desc.no_fused_update of the runs below */
static int tc_side_off;   /* the runs below without a second stream (>>cuda_side) */
static int tc_want_state; /* tc_graph_train also copies the optimizer state (ns floats after the buffers) */
static int tc_wg_epi_off; /* the runs below with mnistcu__k_gemm_wg's epilogues left to the plain path */
static int tc_sms;        /* the runs below as if the GPU had this many multiprocessors (0: as it has) */
static int tc_head_res_off; /* the runs below with the head staging its weights and rows in passes */
static mnistcu_precision tc_graph_prec = MNISTCU_PRECISION_DEFAULT; /* the runs' desc.precision */

static int tc_graph_train(const tc_graph_case *c, int no_graph, int no_head, tc_graph_run *out)
{
    mnistcu_ctx *ctx;
    mnistcu_dataset *ds = NULL, *val = NULL;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    int ok = 0, l;
    tc_cnn_path = c->cnn;
    ctx = tc_ctx_prec(c->gemm, tc_graph_prec);
    tc_cnn_path = MNISTCU_CNN_OWN;
    memset(out, 0, sizeof *out);
    if (!ctx) return 0;
    mnistcu__cu(ctx)->side_off = tc_side_off;
    mnistcu__cu(ctx)->wg_epi_off = tc_wg_epi_off;
    mnistcu__cu(ctx)->head_res_off = tc_head_res_off;
    if (tc_sms) mnistcu__cu(ctx)->sms = tc_sms;
    ds = c->u8 ? tc_u8_dataset(ctx, c->n, c->F ? (int)c->F : 784, c->classes ? c->classes : 10, 11)
               : tc_synthetic(ctx, c->n, c->F ? c->F : 784, c->classes ? c->classes : 10, 11);
    if (c->validation) val = tc_synthetic(ctx, 50, 784, 10, 12);
    memset(&td, 0, sizeof td);
    td.epochs = c->epochs;
    td.batch_size = (int)c->B;
    td.optim = c->optim;
    td.no_graph = no_graph;
    td.no_head = no_head;
    td.no_fused_update = tc_upd_off;
    td.no_fused = 1; /* the step path, which a one-hidden-layer case would leave for the fused MLP kernel */
    td.validation = val;
    td.progress_every = (size_t)c->progress_every;
    td.progress = tc_record;
    td.progress_user = &out->curve;
    if (c->cosine_per_step) {
        td.schedule.kind = MNISTCU_SCHEDULE_COSINE;
        td.schedule.per_step = 1;
        td.schedule.warmup = 3;
    }
    if (c->augment) {
        td.augment.rotate = 10.0f;
        td.augment.translate = 2.0f;
        td.augment.elastic_alpha = 8.0f;
    }
    if (ds && (!c->validation || val) && mnistcu_model_create_spec(ctx, c->spec, &m) == MNISTCU_OK && c->loss) {
        m->loss = c->loss; /* the loss as a model description would give it */
        m->lossp.kind = (int)c->loss;
        m->lossp.sum = c->loss_sum;
        m->lossp.smoothing = c->smoothing;
        m->lossp.p = c->hinge_p ? c->hinge_p : 1;
        m->lossp.margin = 1.0f;
    }
    if (!ds || (c->validation && !val) || !m || mnistcu_train(m, ds, &td, &out->res) != MNISTCU_OK)
        printf("    %s (%s): %s\n", c->name, no_graph ? "launched" : "graphs", mnistcu_ctx_error(ctx));
    else {
        size_t n = m->num_params;
        out->np = n;
        out->nb = m->num_buffers;
        out->ns = tc_want_state ? m->state_floats : 0;
        out->p = (float *)malloc((2 * n + out->nb + out->ns + 1) * sizeof(float));
        ok = out->p && mnistcu_model_get_params(m, out->p, n) == MNISTCU_OK &&
             mnistcu_model_get_grads(m, out->p + n, n) == MNISTCU_OK &&
             cudaMemcpy(out->p + 2 * n, m->buffers, out->nb * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess &&
             (!out->ns || cudaMemcpy(out->p + 2 * n + out->nb, m->state, out->ns * sizeof(float),
                                     cudaMemcpyDeviceToHost) == cudaSuccess);
        out->steps = m->steps;
        out->bn_pool = m->bn_pool_steps;
        out->conv_pool = m->conv_pool_steps;
        out->col_pool = m->col_pool_steps;
        out->col_pool_parts = mnistcu__cu(ctx)->col_pool_parts;
        out->col_pool_back = m->col_pool_back_steps;
        out->pool_cols = m->pool_cols_steps;
        out->wg = mnistcu__cu(ctx)->wg;
        out->sms = mnistcu__cu(ctx)->sms;
        out->side_forks = mnistcu__cu(ctx)->side_forks;
        out->wg_epi = mnistcu__cu(ctx)->wg_epi;
        out->wg64 = mnistcu__cu(ctx)->wg64_products;
        out->bias_steps = mnistcu__cu(ctx)->bias_steps;
        out->side_head_forks = mnistcu__cu(ctx)->side_head_forks;
        out->head_res = mnistcu__cu(ctx)->head_res;
        out->begin_gathers = mnistcu__cu(ctx)->begin_gathers;
        out->side_dw_forks = mnistcu__cu(ctx)->side_dw_forks;
        for (l = 0; l < m->num_layers && l < MNISTCU_MAX_MODEL_LAYERS; ++l) out->batches[l] = m->layers[l].batches;
    }
    mnistcu_ctx_destroy(ctx);
    return ok;
}

/* A dense layer's bias gradient as a branch on a second stream beside its weight and input gradients
   (a batch over MNISTCU__BG_ROWS, so that the branch only reads dy), and the head layer's weight gradient
   beside the layers before it: the same bits as in line, with our products and cuBLAS's, in FP32 and
   TF32X3, launched and in graphs, with the optimizer's step in the products and in its pass. */
TEST cuda_dense_bias_branch_equals_in_line_bitwise(void)
{
    tc_graph_case c;
    int path, no_graph, k;
    memset(&c, 0, sizeof c);
    c.spec = "784 dense96 relu dense40 tanh dense10";
    c.n = 400; c.B = 160; c.epochs = 2; /* a partial last batch: two graphs */
    c.optim.learning_rate = 0.05f; c.optim.momentum = 0.9f;
    for (k = 0; k < 4; ++k)
        for (path = 0; path < 2; ++path) {
            const int upd = k >> 1, x3 = k & 1;
#ifndef MNISTCU_CUBLAS
            if (path) break;
#endif
            c.gemm = path ? MNISTCU_GEMM_CUBLAS : MNISTCU_GEMM_OWN;
            for (no_graph = 0; no_graph < 2; ++no_graph) {
                tc_graph_run a, b;
                c.name = path ? "cuBLAS" : "own products";
                tc_graph_prec = x3 ? MNISTCU_PRECISION_TF32X3 : MNISTCU_PRECISION_FP32;
                tc_upd_off = !upd;
                tc_side_off = 0;
                ASSERTm(c.name, tc_graph_train(&c, no_graph, 0, &a));
                tc_side_off = 1;
                ASSERTm(c.name, tc_graph_train(&c, no_graph, 0, &b));
                tc_side_off = 0;
                tc_graph_prec = MNISTCU_PRECISION_DEFAULT;
                printf("    %s, %s, %s, %s: %lu branches (%lu weight gradients), loss %.9g / %.9g\n", c.name,
                       x3 ? "TF32X3" : "FP32", no_graph ? "launched" : "graphs",
                       upd ? "steps in the products" : "steps in the pass", (unsigned long)a.side_forks,
                       (unsigned long)a.side_dw_forks, a.res.train_loss, b.res.train_loss);
                /* the second layer's weight gradient (with or without its step) a branch too */
                ASSERTm(c.name, a.side_dw_forks > 0);
                ASSERT_EQm(c.name, a.res.fused_update_steps, b.res.fused_update_steps);
                ASSERTm(c.name, upd ? a.res.fused_update_steps > 0 : a.res.fused_update_steps == 0);
                ASSERTm(c.name, a.side_forks > a.side_head_forks && a.side_head_forks > 0); /* the bias's too */
                ASSERT_EQm(c.name, (uint64_t)0, b.side_forks);
                ASSERTm(c.name, no_graph ? a.res.graph_steps == 0 : a.res.graph_steps > 0);
                ASSERT_EQm(c.name, a.np, b.np);
                ASSERT_ARRAY_EQ_BITS_F(a.p, b.p, 2 * a.np + a.nb);
                ASSERT_EQm(c.name, 0, memcmp(&a.res.train_loss, &b.res.train_loss, sizeof(double)));
                free(a.p);
                free(b.p);
            }
        }
    tc_upd_off = 0;
    PASS();
}

/* Hopper's TF32X3 and TF32 kernel (mnistcu__k_gemm_wg) with more in its epilogue: an input gradient times act'(y)
   and a weight gradient with the optimizer's step, in the sum of K's slices (K whole: in the kernel),
   against the same products plain with mnistcu__k_act_backward and the optimizer's pass after them: the
   same operations on the same values, so the parameters, gradients, buffers, momentum and losses to the
   bit; our products and cuBLAS's (whose TF32X3 products are ours), graphs and launched, K in slices and,
   as if the GPU had 16 multiprocessors, whole. P3's shape with a partial last batch (76 rows: products
   the kernel declines). */
TEST cuda_wg_epilogue_equals_passes_bitwise(void)
{
    /* P3's shape (128 x 128 tiles); 128 x 64 tiles with act' (256 -> 2048's input gradient, K 2048) and
       with the step (the weight gradients over a batch of 2048) */
    static const struct {
        const char *spec;
        size_t F, n, B;
        int bn64;
    } cases[] = {{"784 dense1024 relu dense1024 relu dense10", 784, 1100, 512, 0},
                 {"256 dense256 relu dense2048 relu dense10", 256, 1100, 512, 1},
                 {"256 dense256 relu dense256 relu dense10", 256, 4200, 2048, 1}};
    tc_graph_case c;
    int path, no_graph, one, i, x3;
    mnistcu_ctx *g;
    if (!tc_has_tensor_cores()) SKIPm("no tensor cores (sm_80+): TF32X3 resolves to FP32");
    g = tc_ctx_prec(MNISTCU_GEMM_OWN, MNISTCU_PRECISION_TF32X3);
    ASSERT(g != NULL);
    one = mnistcu__cu(g)->wg;
    mnistcu_ctx_destroy(g);
    if (!one) SKIPm("TF32X3's warp-group kernel needs an sm_90 GPU and a build for sm_90a");
    tc_want_state = 1;
    for (x3 = 1; x3 >= 0; --x3) /* three TF32 parts, and one (TF32) */
    for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); ++i)
        for (one = 0; one < 2; ++one)
            for (path = 0; path < 2; ++path) {
#ifndef MNISTCU_CUBLAS
                if (path) break;
#endif
                if (path && !x3) break; /* TF32 with cuBLAS keeps cuBLAS's products (mnistcu__wg_ok) */
                memset(&c, 0, sizeof c);
                c.spec = cases[i].spec;
                c.F = cases[i].F; c.n = cases[i].n; c.B = cases[i].B; c.epochs = 2; c.progress_every = 1;
                c.optim.learning_rate = 0.05f; c.optim.momentum = 0.9f;
                c.gemm = path ? MNISTCU_GEMM_CUBLAS : MNISTCU_GEMM_OWN;
                c.name = path ? "cuBLAS" : "own products";
                tc_graph_prec = x3 ? MNISTCU_PRECISION_TF32X3 : MNISTCU_PRECISION_TF32;
                for (no_graph = 0; no_graph < 2; ++no_graph) {
                    tc_graph_run a, b, d;
                    tc_sms = one ? 16 : 0;
                    tc_wg_epi_off = 0;
                    ASSERTm(c.name, tc_graph_train(&c, no_graph, 0, &a));
                    tc_side_off = 1; /* the bias gradients in line beside the fused steps: the same bits */
                    ASSERTm(c.name, tc_graph_train(&c, no_graph, 0, &d));
                    tc_side_off = 0;
                    tc_wg_epi_off = 1;
                    ASSERTm(c.name, tc_graph_train(&c, no_graph, 0, &b));
                    tc_wg_epi_off = 0;
                    tc_sms = 0;
                    printf("    %s, %s, %s, %s%s: %lu products with the epilogue (%lu in 128 x 64 tiles), %lu of "
                           "%lu steps fused, loss %.9g / %.9g\n", c.spec, x3 ? "TF32X3" : "TF32", c.name,
                           no_graph ? "launched" : "graphs", one ? ", one slice" : "", (unsigned long)a.wg_epi,
                           (unsigned long)a.wg64,
                           (unsigned long)a.res.fused_update_steps, (unsigned long)a.res.steps, a.res.train_loss,
                           b.res.train_loss);
                    ASSERTm(c.name, a.wg_epi > 0);
                    /* the second layer's weight gradient with its step beside the first layer's passes */
                    ASSERTm(c.name, a.side_dw_forks > 0);
                    /* the hidden biases stepped by their gradients' kernel (the pass would give the same bits) */
                    ASSERTm(c.name, a.bias_steps > 0 && d.bias_steps > 0);
                    ASSERT_EQm(c.name, (uint64_t)0, b.bias_steps);
                    ASSERTm(c.name, cases[i].bn64 ? a.wg64 > 0 : a.wg64 == 0);
                    ASSERT_EQm(c.name, (size_t)0, b.wg_epi);
                    ASSERT_EQm(c.name, a.res.steps - 2, a.res.fused_update_steps); /* all but each size's first */
                    ASSERTm(c.name, no_graph ? a.res.graph_steps == 0 : a.res.graph_steps > 0);
                    ASSERT_EQm(c.name, a.np, b.np);
                    ASSERT_EQm(c.name, a.ns, b.ns);
                    ASSERT_ARRAY_EQ_BITS_F(a.p, b.p, 2 * a.np + a.nb + a.ns);
                    ASSERT_ARRAY_EQ_BITS_F(a.p, d.p, 2 * a.np + a.nb + a.ns);
                    ASSERT_EQm(c.name, 0, memcmp(&a.res.train_loss, &b.res.train_loss, sizeof(double)));
                    ASSERT_EQm(c.name, 0, memcmp(&a.res.train_loss, &d.res.train_loss, sizeof(double)));
                    ASSERT_EQm(c.name, a.curve.n, b.curve.n);
                    ASSERT_EQm(c.name, 0, memcmp(a.curve.loss, b.curve.loss, (size_t)a.curve.n * sizeof(double)));
                    free(a.p);
                    free(b.p);
                    free(d.p);
                }
            }
    tc_want_state = 0;
    tc_graph_prec = MNISTCU_PRECISION_DEFAULT;
    PASS();
}

/* A columns-path convolution's weight and bias gradients as a branch on a second stream beside its input
   gradient (>>cuda_side): the same bits as in line, with our products and cuBLAS's, launched and in graphs. */
TEST cuda_conv_branch_equals_in_line_bitwise(void)
{
    tc_graph_case c;
    int path, no_graph;
    memset(&c, 0, sizeof c);
    c.spec = "1x12x12 conv3x3x20 relu conv3x3x24 relu maxpool2 flatten dense10"; /* 20 channels in: columns */
    c.F = 144;
    c.n = 72; c.B = 16; c.epochs = 2; /* a partial last batch: two graphs */
    c.optim.learning_rate = 0.05f; c.optim.momentum = 0.9f;
    for (path = 0; path < 2; ++path) {
#ifndef MNISTCU_CUBLAS
        if (path) break;
#endif
        c.gemm = path ? MNISTCU_GEMM_CUBLAS : MNISTCU_GEMM_OWN;
        for (no_graph = 0; no_graph < 2; ++no_graph) {
            tc_graph_run a, b;
            c.name = path ? "cuBLAS" : "own products";
            tc_side_off = 0;
            ASSERTm(c.name, tc_graph_train(&c, no_graph, 0, &a));
            tc_side_off = 1;
            ASSERTm(c.name, tc_graph_train(&c, no_graph, 0, &b));
            tc_side_off = 0;
            printf("    %s, %s: %lu branches, loss %.9g / %.9g\n", c.name, no_graph ? "launched" : "graphs",
                   (unsigned long)a.side_forks, a.res.train_loss, b.res.train_loss);
            ASSERTm(c.name, a.side_forks > a.side_head_forks); /* the convolution's too, not only the head's */
            ASSERT_EQm(c.name, (uint64_t)0, b.side_forks);
            ASSERTm(c.name, no_graph ? a.res.graph_steps == 0 : a.res.graph_steps > 0);
            ASSERT_EQm(c.name, a.res.graph_steps, b.res.graph_steps);
            ASSERT_EQm(c.name, a.np, b.np);
            ASSERT_ARRAY_EQ_BITS_F(a.p, b.p, 2 * a.np + a.nb);
            ASSERT_EQm(c.name, 0, memcmp(&a.res.train_loss, &b.res.train_loss, sizeof(double)));
            free(a.p);
            free(b.p);
        }
    }
    PASS();
}

TEST cuda_graph_step_equals_launched_bitwise(void)
{
    static tc_graph_case cases[9];
    int covered[MNISTCU_LAYER_KIND_COUNT] = {0}, i, k, ncases = 0;
    tc_graph_case *c;
    memset(cases, 0, sizeof cases);
    /* every kind, a partial last batch, reports every 4 steps, Adam with a per-step cosine rate */
    c = &cases[ncases++];
    c->name = "every layer kind, own kernels, Adam, per-step cosine";
    c->spec = "1x28x28 conv5x5x6:p=2 batchnorm relu maxpool2 conv3x3x8 leaky_relu avgpool2 flatten dropout0.25 "
              "dense32 sigmoid dense16 tanh dense12 softmax dense10";
    c->gemm = MNISTCU_GEMM_OWN; c->cnn = MNISTCU_CNN_OWN;
    c->n = 150; c->B = 16; c->epochs = 2; c->progress_every = 4; c->cosine_per_step = 1;
    c->optim.kind = MNISTCU_OPTIM_ADAM; c->optim.learning_rate = 1e-3f;
    /* bytes, augmentation in the gather, SGD with momentum */
    c = &cases[ncases++];
    c->name = "LeNet-like on bytes, augmentation, SGD momentum";
    c->spec = "1x28x28 conv5x5x6:p=2 relu maxpool2 conv5x5x16 relu maxpool2 flatten dense84 relu dropout0.5 dense10";
    c->gemm = MNISTCU_GEMM_OWN; c->cnn = MNISTCU_CNN_OWN;
    c->n = 200; c->B = 32; c->epochs = 2; c->u8 = 1; c->augment = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    /* a first layer without parameters before the head, which takes no input gradient: no branch is left
       unjoined (the capture would fail) */
    c = &cases[ncases++];
    c->name = "dropout first, then the head alone, momentum";
    c->spec = "784 dropout0.2 dense10";
    c->gemm = MNISTCU_GEMM_OWN; c->cnn = MNISTCU_CNN_OWN;
    c->n = 150; c->B = 32; c->epochs = 2;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    /* bytes without augmentation: the step's start in its gather (mnistcu__k_gather4's beg), a partial last
       batch, with the head */
    c = &cases[ncases++];
    c->name = "MLP on bytes, the step's start in its gather";
    c->spec = "784 dense64 relu dense32 relu dense10";
    c->gemm = MNISTCU_GEMM_OWN; c->cnn = MNISTCU_CNN_OWN;
    c->n = 200; c->B = 48; c->epochs = 3; c->u8 = 1; c->progress_every = 3;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    /* clipping and l2 (their kernels in the graph), a validation set between epochs, batches above and
       below the one-pass bias gradient's 128 rows */
    c = &cases[ncases++];
    c->name = "MLP, clipping and l2, validation, RMSprop, batch 150";
    c->spec = "784 dense64 relu dense32 relu dense10";
    c->gemm = MNISTCU_GEMM_OWN; c->cnn = MNISTCU_CNN_OWN;
    c->n = 400; c->B = 150; c->epochs = 3; c->validation = 1; c->progress_every = 2;
    c->optim.kind = MNISTCU_OPTIM_RMSPROP; c->optim.learning_rate = 1e-3f; c->optim.clip_norm = 0.5f;
    c->optim.l2 = 1e-4f;
#ifdef MNISTCU_CUBLAS
    c = &cases[ncases++];
    c->name = "CNN with batch norm and dropout, cuBLAS products";
    c->spec = "1x28x28 conv3x3x8 batchnorm relu maxpool2 flatten dropout0.2 dense32 relu dense10";
    c->gemm = MNISTCU_GEMM_CUBLAS; c->cnn = MNISTCU_CNN_OWN;
    c->n = 100; c->B = 24; c->epochs = 2;
    c->optim.kind = MNISTCU_OPTIM_ADAMW; c->optim.learning_rate = 1e-3f; c->optim.weight_decay = 0.01f;
#endif
#ifdef MNISTCU_CUDNN
    c = &cases[ncases++];
    c->name = "CNN with batch norm, cuDNN and cuBLAS";
    c->spec = "1x28x28 conv5x5x6:p=2 batchnorm relu maxpool2 conv5x5x16 relu avgpool2 flatten dense10";
    c->gemm = MNISTCU_GEMM_CUBLAS; c->cnn = MNISTCU_CNN_CUDNN;
    c->n = 100; c->B = 16; c->epochs = 2; c->u8 = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f; c->optim.nesterov = 1;
#endif
    for (i = 0; i < ncases; ++i) {
        const char *sp = cases[i].spec;
        for (k = 1; k < MNISTCU_LAYER_KIND_COUNT; ++k)
            if (strstr(sp, mnistcu__kind_keywords[k])) covered[k] = 1;
    }
    for (k = 1; k < MNISTCU_LAYER_KIND_COUNT; ++k) {
        char msg[128];
        snprintf(msg, sizeof msg, "layer kind %s is in no graph case", mnistcu__kind_keywords[k]);
        ASSERTm(msg, covered[k]);
    }
    for (i = 0; i < ncases; ++i) {
        tc_graph_run a, b;
        size_t steps, per_epoch, j;
        c = &cases[i];
        ASSERTm(c->name, tc_graph_train(c, 0, 0, &a));
        ASSERTm(c->name, tc_graph_train(c, 1, 0, &b));
        per_epoch = (c->n + c->B - 1) / c->B;
        steps = per_epoch * (size_t)c->epochs;
        printf("    %-56s %lu of %lu steps from graphs, loss %.9g / %.9g\n", c->name,
               (unsigned long)a.res.graph_steps, (unsigned long)steps, a.res.train_loss, b.res.train_loss);
        ASSERT_EQm(c->name, steps, a.res.steps);
        ASSERT_EQm(c->name, (size_t)0, b.res.graph_steps);
        ASSERT_EQm(c->name, (size_t)0, b.begin_gathers); /* launched: no per-step values on the device */
        if (c->u8 && !c->augment) /* each launched step's gather took its start, and each capture's */
            ASSERT_EQm(c->name, steps - a.res.graph_steps + 2, a.begin_gathers); /* two sizes captured */
        else { /* floats, or augmentation: mnistcu__k_step_begin */
            ASSERT_EQm(c->name, (size_t)0, a.begin_gathers);
        }
        /* one launched step per batch size before its capture, one more per size after each validation
           (the evaluation may have grown the workspace) */
        ASSERT_GTEm(c->name, a.res.graph_steps, steps - 2 - (c->validation ? 2 * (size_t)c->epochs : 0));
        ASSERT_EQm(c->name, a.np, b.np);
        ASSERT_EQm(c->name, a.nb, b.nb);
        ASSERT_ARRAY_EQ_BITS_F(a.p, b.p, 2 * a.np + a.nb);
        ASSERT_EQm(c->name, a.steps, b.steps);
        ASSERT_EQm(c->name, (uint64_t)steps, a.steps);
        for (j = 0; j < MNISTCU_MAX_MODEL_LAYERS; ++j) ASSERT_EQm(c->name, a.batches[j], b.batches[j]);
        ASSERT_EQm(c->name, 0, memcmp(&a.res.train_loss, &b.res.train_loss, sizeof(double)));
        ASSERT_EQm(c->name, 0, memcmp(&a.res.train_accuracy, &b.res.train_accuracy, sizeof(double)));
        ASSERT_EQm(c->name, 0, memcmp(&a.res.val_loss, &b.res.val_loss, sizeof(double)));
        ASSERT_EQm(c->name, a.curve.n, b.curve.n);
        ASSERT_EQm(c->name, 0, memcmp(a.curve.loss, b.curve.loss, (size_t)a.curve.n * sizeof(double)));
        free(a.p);
        free(b.p);
    }
    PASS();
}

/* ---- the classifier head (>>cuda_head) ------------------------------------------------
   A step with the head against the same step by step (no_head): each case
   trains twice in fresh contexts of the same seed. With our products unsplit
   the head does the same arithmetic, so the weights, the last gradients, the
   mean loss and every report are identical to the bit; where the step by step
   path splits the logits' product (2048 inputs or more) or takes cuBLAS's, the
   order of the sums differs and the bound is a normwise relative difference of
   1e-5 on the weights and gradients together, 1e-5 on the mean loss. With
   cuBLAS at batch 300 a dense layer's input gradient also takes the ReLU' of
   the layer before in its split's sum (mnistcu__cuda_dx_act). The cases
   hold an activation before the head folded (tanh, sigmoid, relu), a layer
   before it that is not dense (dropout, a leaky relu layer), no layer before it
   (no input gradient), every loss, 3, 10 and 32 classes, a head without a bias, batches
   above and below 128 rows, partial last batches, more inputs than one staged
   pass, graphs and launched steps. */

/* MNISTCU_TEST_HEAD_CASES (e.g. "0-6,9"): the test below runs only the cases listed, 0-based in the
   order of its table, as ranges A-B or single numbers with commas between; unset, every case; a list
   that does not parse, none (and the test fails, having run none). make test-gpu's racecheck uses it
   (tests/run_gpu_tests.sh), as racecheck over the whole test did not finish in 7 minutes on an H200. */
static int tc_head_case_wanted(int i)
{
    const char *e = getenv("MNISTCU_TEST_HEAD_CASES");
    int hit = 0;
    if (!e) return 1;
    for (;;) {
        char *end;
        long a = strtol(e, &end, 10), b = a;
        if (end == e) return 0;
        if (*end == '-') {
            const char *s = end + 1;
            b = strtol(s, &end, 10);
            if (end == s) return 0;
        }
        hit |= i >= a && i <= b;
        if (*end == '\0') return hit;
        if (*end != ',') return 0;
        e = end + 1;
    }
}

TEST cuda_head_step_matches_step_by_step(void)
{
    static tc_graph_case cases[24];
    int exact[24], pairs[24] = {0}, routes[24] = {0}, colpools[24] = {0}, poolcols[24] = {0}, x3[24] = {0}, i,
        ncases = 0, ran = 0;
    tc_graph_case *c;
    memset(cases, 0, sizeof cases);
    c = &cases[ncases];
    exact[ncases++] = 1;
    c->name = "MLP, tanh before the head, batch 150, momentum";
    c->spec = "784 dense64 relu dense32 tanh dense10";
    c->n = 400; c->B = 150; c->epochs = 2; c->progress_every = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    c = &cases[ncases];
    routes[ncases] = 1; /* the first convolution's weight gradient routes the pool's (mnistcu__conv_pool_route) */
    exact[ncases++] = 1;
    c->name = "LeNet-5 on bytes, relu before the head, Adam";
    c->spec = "1x28x28 conv5x5x6:p=2 relu maxpool2 conv5x5x16 relu maxpool2 flatten dense120 relu dense84 relu dense10";
    c->n = 150; c->B = 32; c->epochs = 2; c->u8 = 1;
    c->optim.kind = MNISTCU_OPTIM_ADAM; c->optim.learning_rate = 1e-3f;
    c = &cases[ncases];
    exact[ncases++] = 1;
    c->name = "one layer (no input gradient), MSE summed";
    c->spec = "784 dense10";
    c->n = 100; c->B = 20; c->epochs = 2; c->loss = MNISTCU_LOSS_MSE; c->loss_sum = 1;
    c->optim.learning_rate = 0.001f;
    c = &cases[ncases];
    exact[ncases++] = 1;
    c->name = "sigmoid before a head of 3 without bias, hinge p=2";
    c->spec = "20 dense12 sigmoid dense3:bias=0";
    c->F = 20; c->classes = 3; c->n = 90; c->B = 16; c->epochs = 3; c->loss = MNISTCU_LOSS_HINGE; c->hinge_p = 2;
    c->optim.learning_rate = 0.1f;
    c = &cases[ncases];
    exact[ncases++] = 1;
    c->name = "dropout before the head, label smoothing";
    c->spec = "784 dense48 relu dropout0.3 dense10";
    c->n = 130; c->B = 64; c->epochs = 2; c->smoothing = 0.1f; c->loss = MNISTCU_LOSS_SOFTMAX_CE;
    c->optim.learning_rate = 0.1f;
    c = &cases[ncases];
    exact[ncases++] = 1;
    c->name = "5 classes, softmax cross-entropy on its lanes, batch 13";
    c->spec = "20 dense12 relu dense5";
    c->F = 20; c->classes = 5; c->n = 70; c->B = 13; c->epochs = 2;
    c->optim.learning_rate = 0.1f;
    c = &cases[ncases];
    exact[ncases++] = 1;
    c->name = "32 classes, leaky relu before, BCE, batch 7";
    c->spec = "40 dense24 leaky_relu dense32";
    c->F = 40; c->classes = 32; c->n = 50; c->B = 7; c->epochs = 2; c->loss = MNISTCU_LOSS_BCE;
    c->optim.learning_rate = 0.1f;
    c = &cases[ncases];
    exact[ncases++] = 0;
    c->name = "2100 inputs to the head (the product split), nine passes";
    c->spec = "784 dense2100 relu dense10";
    c->n = 64; c->B = 16; c->epochs = 1;
    c->optim.learning_rate = 0.05f;
    c = &cases[ncases];
    exact[ncases++] = 1;
    c->name = "batch 512: wide tiles, K split, act' and bias gradients fused";
    c->spec = "784 dense1024 relu dense1024 relu dense10";
    c->n = 1100; c->B = 512; c->epochs = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    /* the forward and input-gradient products of 512 x 1024 split in four, the weight gradients whole */
    ASSERT_EQ((size_t)4, mnistcu__gemm_wide_split(512, 1024, 784));
    ASSERT_EQ((size_t)1, mnistcu__gemm_wide_split(1024, 1024, 512));
    /* batch norm taking the max pool after it (mnistcu__bn_pool_after), with and without a folded ReLU, a
       partial last batch (cases 9-11, which tests/run_gpu_tests.sh names) */
    c = &cases[ncases];
    pairs[ncases] = 2;
    exact[ncases++] = 1;
    c->name = "batch norm with the max pools after it, momentum";
    c->spec = "1x28x28 conv3x3x8:p=1 batchnorm maxpool2 relu conv3x3x12:p=1 batchnorm maxpool2 flatten dense10";
    c->n = 150; c->B = 32; c->epochs = 2;
    c->optim.learning_rate = 0.01f; c->optim.momentum = 0.9f;
    /* 13 x 13 maps: the last row and column in no window, their gradient zero */
    c = &cases[ncases];
    pairs[ncases] = 1;
    exact[ncases++] = 1;
    c->name = "batch norm and max pool on 13x13 maps, batch 13";
    c->spec = "1x15x15 conv3x3x6 batchnorm maxpool2 relu flatten dense16 relu dense10";
    c->F = 225; c->n = 90; c->B = 13; c->epochs = 2;
    c->optim.learning_rate = 0.1f;
    /* batch norm first (no input gradient) on 34x34 maps: more groups and cells than a block's threads */
    c = &cases[ncases];
    pairs[ncases] = 2;
    exact[ncases++] = 1;
    c->name = "batch norm first on 34x34 maps, then 15x15";
    c->spec = "1x34x34 batchnorm maxpool2 relu conv3x3x4 batchnorm maxpool2 flatten dense10";
    c->F = 1156; c->n = 60; c->B = 12; c->epochs = 2;
    c->optim.learning_rate = 0.05f;
    /* the columns path (20 input channels) with a ReLU folded, then a max pool on 11x11 maps: the pool's
       backward pass takes the convolution's ReLU' (mnistcu__k_pool2_backward's act_in), the last row and
       column in no window */
    c = &cases[ncases];
    exact[ncases++] = 1;
    c->name = "columns convolution, relu, max pool on 11x11 maps";
    c->spec = "1x15x15 conv3x3x20 relu conv3x3x24 relu maxpool2 flatten dense16 relu dense10";
    c->F = 225; c->n = 70; c->B = 11; c->epochs = 2;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    /* a first convolution taking its max pool's gradient as it is: the ReLU folded into the pool (the
       Fashion CNN's order) on 13x13 maps, whose last row and column no window covers; no ReLU at all */
    c = &cases[ncases];
    routes[ncases] = 1;
    exact[ncases++] = 1;
    c->name = "first convolution routing its pool's gradient, 13x13";
    c->spec = "1x15x15 conv3x3x8 maxpool2 relu flatten dense16 relu dense10";
    c->F = 225; c->n = 75; c->B = 14; c->epochs = 2;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
    /* a tanh folded into the convolution: not routed; the pool's backward pass takes its derivative (act_in) */
    c = &cases[ncases];
    exact[ncases++] = 1;
    c->name = "convolution with tanh, then a max pool, 12x12";
    c->spec = "1x14x14 conv3x3x6 tanh maxpool2 flatten dense10";
    c->F = 196; c->n = 50; c->B = 10; c->epochs = 2;
    c->optim.learning_rate = 0.05f;
    c = &cases[ncases];
    routes[ncases] = 1;
    exact[ncases++] = 1;
    c->name = "first convolution routing, no ReLU, 5x5";
    c->spec = "1x20x20 conv5x5x4:p=1 maxpool2 flatten dense10";
    c->F = 400; c->n = 60; c->B = 9; c->epochs = 2;
    c->optim.learning_rate = 0.02f;
    /* a convolution on the columns path (over 16 input channels), no activation, then a max pool with the
       ReLU folded: the convolution makes the pool's output (mnistcu__col_pool_after); 11x11 maps, whose last
       row and column no window covers. Then one whose product is Hopper's TF32X3 kernel's in two slices of
       K, which the convolution adds itself (keep_parts; elsewhere the mma.sync kernel's, summed before) */
    c = &cases[ncases];
    colpools[ncases] = 1;
    exact[ncases++] = 1;
    c->name = "columns-path convolution making its pool's output, 11x11";
    c->spec = "18x13x13 conv3x3x8 maxpool2 relu flatten dense16 relu dense10";
    c->F = 18 * 169; c->n = 40; c->B = 12; c->epochs = 2;
    c->optim.learning_rate = 0.02f; c->optim.momentum = 0.9f;
    c = &cases[ncases];
    colpools[ncases] = 1;
    x3[ncases] = 1;
    exact[ncases++] = 1;
    c->name = "the same from TF32X3's K slices, 128 channels, batch 20";
    c->spec = "32x13x13 conv3x3x128 maxpool2 relu flatten dense16 relu dense10";
    c->F = 32 * 169; c->n = 40; c->B = 20; c->epochs = 2;
    c->optim.learning_rate = 0.01f;
    /* a max pool writing the columns of the columns-path convolution after it (mnistcu__pool_cols_after),
       3x3 on a 7x7 map, then that convolution making its own pool's output; and 5x5 on a 9x9 map */
    c = &cases[ncases];
    routes[ncases] = -1; /* the first convolution's routing as its tiles' plan decides, not asserted */
    colpools[ncases] = poolcols[ncases] = 1;
    exact[ncases++] = 1;
    c->name = "a pool writing the next convolution's columns, 3x3";
    c->spec = "1x16x16 conv3x3x18 maxpool2 relu conv3x3x20 maxpool2 relu flatten dense16 relu dense10";
    c->F = 256; c->n = 45; c->B = 10; c->epochs = 2;
    c->optim.learning_rate = 0.02f; c->optim.momentum = 0.9f;
    c = &cases[ncases];
    routes[ncases] = -1;
    poolcols[ncases] = 1;
    exact[ncases++] = 1;
    c->name = "a pool writing the next convolution's columns, 5x5";
    c->spec = "1x20x20 conv3x3x18 maxpool2 relu conv5x5x8 relu flatten dense10";
    c->F = 400; c->n = 45; c->B = 10; c->epochs = 2;
    c->optim.learning_rate = 0.02f;
    /* a pool whose output the columns-path convolution before it makes (fwd_done) launches nothing, so it
       does not write the next convolution's columns either: that one makes its own */
    c = &cases[ncases];
    colpools[ncases] = 1;
    exact[ncases++] = 1;
    c->name = "a pool made by the convolution before, then a convolution";
    c->spec = "18x12x12 conv3x3x18 maxpool2 relu conv3x3x20 flatten dense10";
    c->F = 18 * 144; c->n = 30; c->B = 8; c->epochs = 2;
    c->optim.learning_rate = 0.02f;
#ifdef MNISTCU_CUBLAS
    c = &cases[ncases];
    exact[ncases++] = 0;
    c->name = "cuBLAS products, batch 100";
    c->spec = "784 dense256 relu dense10";
    c->gemm = MNISTCU_GEMM_CUBLAS;
    c->n = 300; c->B = 100; c->epochs = 2;
    c->optim.learning_rate = 0.1f;
    /* the middle layer's input gradient split over K by us, the first layer's ReLU' in the pass that adds
       the parts (mnistcu__cuda_dx_act) */
    ASSERT(mnistcu__blas_split(300, 512, 512) > 1);
    c = &cases[ncases];
    exact[ncases++] = 0;
    c->name = "cuBLAS, batch 300: ReLU' in the input gradient's split";
    c->spec = "784 dense512 relu dense512 relu dense10";
    c->gemm = MNISTCU_GEMM_CUBLAS;
    c->n = 600; c->B = 300; c->epochs = 2;
    c->optim.learning_rate = 0.1f;
#endif
    ASSERT(ncases <= (int)(sizeof cases / sizeof cases[0]));
    for (i = 0; i < ncases; ++i) { /* the cases tests/run_gpu_tests.sh names for racecheck, by their index */
        ASSERT_EQm("batch norm's cases are 9-11", i >= 9 && i <= 11, pairs[i] != 0);
        ASSERT_EQm("the routing cases are 1, 13 and 15", i == 1 || i == 13 || i == 15, routes[i] > 0);
    }
    for (i = 0; i < ncases; ++i) {
        tc_graph_run a, b;
        size_t j;
        double num = 0.0, den = 0.0, rel;
        if (!tc_head_case_wanted(i)) continue;
        ++ran;
        c = &cases[i];
        if (c->gemm == MNISTCU_GEMM_DEFAULT) c->gemm = MNISTCU_GEMM_OWN;
        c->cnn = MNISTCU_CNN_OWN;
        tc_graph_prec = x3[i] ? MNISTCU_PRECISION_TF32X3 : MNISTCU_PRECISION_DEFAULT;
        ASSERTm(c->name, tc_graph_train(c, 0, 0, &a));
        ASSERTm(c->name, tc_graph_train(c, 0, 1, &b));
        ASSERT_EQm(c->name, a.res.steps, a.res.head_steps); /* the head ran every step of one, */
        ASSERT_EQm(c->name, (size_t)0, b.res.head_steps);  /* none of the other */
        { /* the head's weights and rows all in shared memory, or staged in passes: the same bits */
            tc_graph_run l;
            tc_head_res_off = 1;
            ASSERTm(c->name, tc_graph_train(c, 0, 0, &l));
            tc_head_res_off = 0;
            ASSERT_EQm(c->name, (size_t)0, l.head_res);
            /* 2100 inputs: (10 + 4) x 2104 floats, over the 96 KB; every other case's fit, its inputs 4 n */
            ASSERTm(c->name, strstr(c->name, "2100") ? a.head_res == 0 : a.head_res > 0);
            ASSERT_EQm(c->name, a.np, l.np);
            ASSERT_ARRAY_EQ_BITS_F(l.p, a.p, 2 * a.np + a.nb);
            ASSERT_EQm(c->name, 0, memcmp(&a.res.train_loss, &l.res.train_loss, sizeof(double)));
            free(l.p);
        }
        /* The fusions of a head step, counted (replays of a graph count none): batch norm taking the max pool
           after it (in both passes), a first convolution routing its pool's gradient (backward), a
           columns-path convolution making its pool's output (forward; with TF32X3 on Hopper from the
           product's K slices) and the pool writing that convolution's output gradient (backward), a max pool
           writing the next convolution's columns (forward). Step by step runs none of them; the head steps
           each fusion the case names and no other (routes -1: as the tiles' plan decides, not asserted). */
        ASSERT_EQm(c->name, (uint64_t)0, b.bn_pool);
        ASSERT_EQm(c->name, (uint64_t)0, b.conv_pool);
        ASSERT_EQm(c->name, (uint64_t)0, b.col_pool);
        ASSERT_EQm(c->name, (uint64_t)0, b.col_pool_back);
        ASSERT_EQm(c->name, (uint64_t)0, b.pool_cols);
        ASSERTm(c->name, pairs[i] ? a.bn_pool >= (uint64_t)(2 * pairs[i]) : a.bn_pool == 0);
        if (routes[i] >= 0) ASSERTm(c->name, routes[i] ? a.conv_pool >= 1 : a.conv_pool == 0);
        ASSERTm(c->name, colpools[i] ? a.col_pool >= 1 && a.col_pool_back >= 1
                                     : a.col_pool == 0 && a.col_pool_back == 0);
        ASSERTm(c->name, poolcols[i] ? a.pool_cols >= 1 : a.pool_cols == 0);
        if (pairs[i] || routes[i] > 0 || colpools[i] || poolcols[i]) {
            /* launched without graphs: each of them in every step, with the same bits as step by step */
            tc_graph_run l;
            uint64_t steps;
            ASSERTm(c->name, tc_graph_train(c, 1, 0, &l));
            steps = (uint64_t)l.res.steps;
            if (pairs[i]) ASSERT_EQm(c->name, (uint64_t)(2 * pairs[i]) * steps, l.bn_pool);
            if (routes[i] > 0) ASSERT_EQm(c->name, steps, l.conv_pool);
            if (colpools[i]) {
                ASSERT_EQm(c->name, steps, l.col_pool);
                ASSERT_EQm(c->name, steps, l.col_pool_back);
            }
            if (x3[i] && colpools[i]) { /* the product (128 x 20*121 x 288) in slices where the GPU has the SMs */
                const int sliced = l.wg && mnistcu__wg_split(mnistcu__wg_tiles(128, c->B * 121, 128), 288, l.sms) > 1;
                ASSERT_EQm(c->name, sliced ? (size_t)steps : (size_t)0, l.col_pool_parts);
            } else {
                ASSERT_EQm(c->name, (size_t)0, l.col_pool_parts);
            }
            if (poolcols[i]) ASSERT_EQm(c->name, steps, l.pool_cols);
            ASSERT_EQm(c->name, a.np, l.np);
            ASSERT_ARRAY_EQ_BITS_F(l.p, b.p, 2 * a.np + a.nb);
            free(l.p);
        }
        tc_graph_prec = MNISTCU_PRECISION_DEFAULT;
        ASSERT_EQm(c->name, a.np, b.np);
        for (j = 0; j < 2 * a.np; ++j) {
            num += ((double)a.p[j] - b.p[j]) * ((double)a.p[j] - b.p[j]);
            den += (double)b.p[j] * b.p[j];
        }
        rel = sqrt(num / (den > 0.0 ? den : 1.0));
        printf("    %-58s %s, weights and gradients %.2e apart, loss %.9g / %.9g\n", c->name,
               exact[i] ? "bitwise" : "bound", rel, a.res.train_loss, b.res.train_loss);
        ASSERT_EQm(c->name, a.res.steps, b.res.steps);
        ASSERT_EQm(c->name, a.res.graph_steps, b.res.graph_steps);
        if (exact[i]) {
            ASSERT_ARRAY_EQ_BITS_F(a.p, b.p, 2 * a.np + a.nb);
            ASSERT_EQm(c->name, 0, memcmp(&a.res.train_loss, &b.res.train_loss, sizeof(double)));
            ASSERT_EQm(c->name, 0, memcmp(&a.res.train_accuracy, &b.res.train_accuracy, sizeof(double)));
            ASSERT_EQm(c->name, a.curve.n, b.curve.n);
            ASSERT_EQm(c->name, 0, memcmp(a.curve.loss, b.curve.loss, (size_t)a.curve.n * sizeof(double)));
        } else {
            ASSERTm(c->name, rel <= 1e-5);
            ASSERT_IN_RANGEm(c->name, b.res.train_loss, a.res.train_loss, 1e-5 * fabs(b.res.train_loss));
        }
        free(a.p);
        free(b.p);
    }
    if (getenv("MNISTCU_TEST_HEAD_CASES")) {
        printf("    %d of %d cases (MNISTCU_TEST_HEAD_CASES=%s)\n", ran, ncases, getenv("MNISTCU_TEST_HEAD_CASES"));
        ASSERTm("MNISTCU_TEST_HEAD_CASES names no case of this build's", ran > 0);
    }
    if (tc_has_tensor_cores()) {
        /* TF32 asked: the head takes the last layer in FP32 all the same. With our products, the step by step
           path keeps the last layer's products (4 and 8 output tiles here) in FP32 too, and puts the first
           layer's weight gradient (26 tiles) on the tensor cores: so the same bits with and without the head,
           and not FP32's. With cuBLAS's, whose step by step path runs the last layer in TF32: within TF32's
           rounding. */
        int gp;
        for (gp = 0; gp < 2; ++gp) {
            float *w[3] = {NULL, NULL, NULL}; /* TF32 with the head, without it, FP32 with it */
            size_t np = 0, k, differs = 0;
            int run;
#ifndef MNISTCU_CUBLAS
            if (gp) break;
#endif
            for (run = 0; run < 3; ++run) {
                mnistcu_ctx *g = tc_ctx_prec(gp ? MNISTCU_GEMM_CUBLAS : MNISTCU_GEMM_OWN,
                                             run == 2 ? MNISTCU_PRECISION_FP32 : MNISTCU_PRECISION_TF32);
                mnistcu_dataset *ds = g ? tc_synthetic(g, 512, 784, 10, 11) : NULL;
                mnistcu_model *m = NULL;
                mnistcu_train_desc td;
                mnistcu_train_result res;
                memset(&td, 0, sizeof td);
                td.epochs = 1;
                td.batch_size = 256;
                td.no_fused = 1;
                td.no_head = run == 1;
                td.optim.learning_rate = 0.05f;
                ASSERT(ds != NULL);
                ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_spec(g, "784 dense128 relu dense10", &m));
                ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, &res));
                ASSERT_EQ((size_t)2, res.steps);
                ASSERT_EQ((size_t)(run == 1 ? 0 : 2), res.head_steps);
                np = m->num_params;
                w[run] = tc_down(m->params, np);
                mnistcu_ctx_destroy(g);
            }
            for (k = 0; k < np; ++k) differs += memcmp(&w[0][k], &w[2][k], sizeof(float)) != 0;
            printf("    TF32 (%s products), head against step by step: weights %.2e apart; %lu of %lu not FP32's\n",
                   gp ? "cuBLAS's" : "our", tc_relerr(w[0], w[1], np), (unsigned long)differs, (unsigned long)np);
            if (!gp) {
                ASSERT_ARRAY_EQ_BITS_F(w[0], w[1], np);
                ASSERT(differs > 0); /* the tensor cores took the first layer's weight gradient */
            } else {
                ASSERT(tc_relerr(w[0], w[1], np) <= 1e-3);
            }
            free(w[0]), free(w[1]), free(w[2]);
        }
    }
    PASS();
}

/* ---- the optimizer's step in the weight gradients' products (>>cuda_update) -------------
   Each case trains twice in fresh contexts of the same seed, with the step
   taken in the products and in the optimizer's pass (no_fused_update): the
   same operations on the same values, so the weights, the gradients, the
   momentum buffers and every report are identical to the bit. A step takes it
   once a step of its batch size has completed: every step but the first of
   each size. The cases hold the weight and bias gradients in one product (the
   head's steps, where the activation's derivative is applied before) and apart
   (no head: the derivative in its own pass, the bias stepped by its gradient's kernel), a
   weight gradient split over K and one whole, partial last batches, momentum
   with Nesterov, dampening and weight decay, a per-step rate read from the
   graph's step values, graphs and launched steps, a layer of 1000 outputs (a
   last tile partly past the end) whose weights start 8 bytes past a 16-byte
   boundary (after a convolution's 50 parameters: the step one entry at a
   time), and a cuBLAS context (whose weight gradients that sum the bias
   gradient are ours); then what it must leave to the pass: Adam, l2,
   clipping, a product too narrow for the wide kernel, a cuBLAS context
   without the head (cuBLAS's weight gradients), TF32 (where mnistcu__k_gemm_wg does not take it). */
TEST cuda_fused_update_equals_pass_bitwise(void)
{
    static tc_graph_case cases[5];
    int no_head[5], no_graph[5], i, ncases = 0;
    tc_graph_case *c;
    memset(cases, 0, sizeof cases);
    c = &cases[ncases];
    no_head[ncases] = 0, no_graph[ncases++] = 0;
    c->name = "P3's shape, head, weight and bias gradients in one product";
    c->gemm = MNISTCU_GEMM_OWN;
    c->spec = "784 dense1024 relu dense1024 relu dense10";
    c->n = 1100; c->B = 512; c->epochs = 2; c->progress_every = 1;
    c->optim.learning_rate = 0.05f;
    c = &cases[ncases];
    no_head[ncases] = 1, no_graph[ncases++] = 0;
    c->name = "no head, Nesterov and weight decay, per-step cosine";
    c->gemm = MNISTCU_GEMM_OWN;
    c->spec = "784 dense1024 relu dense1024 relu dense10";
    c->n = 1100; c->B = 512; c->epochs = 2; c->cosine_per_step = 1;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f; c->optim.nesterov = 1; c->optim.weight_decay = 0.01f;
    c = &cases[ncases];
    no_head[ncases] = 0, no_graph[ncases++] = 1;
    c->name = "weight gradients split in two, sigmoid and tanh, dampening, launched";
    c->gemm = MNISTCU_GEMM_OWN;
    c->spec = "1024 dense512 sigmoid dense1024 tanh dense10";
    c->F = 1024; c->n = 600; c->B = 256; c->epochs = 2;
    c->optim.learning_rate = 0.1f; c->optim.momentum = 0.8f; c->optim.dampening = 0.3f;
    /* 512 x 1024 and 1024 x 512 weight gradients over 256 rows: two slices; over the last 88, one */
    ASSERT_EQ((size_t)2, mnistcu__gemm_wide_split(512, 1024, 256));
    ASSERT_EQ((size_t)2, mnistcu__gemm_wide_split(1024, 512, 256));
    ASSERT_EQ((size_t)1, mnistcu__gemm_wide_split(1024, 512, 88));
    c = &cases[ncases];
    no_head[ncases] = 0, no_graph[ncases++] = 0;
    c->name = "1000 outputs, weights 8 bytes off 16, momentum";
    c->gemm = MNISTCU_GEMM_OWN;
    c->spec = "1x28x28 conv3x3x5 relu flatten dense1000 relu dense10";
    c->n = 250; c->B = 100; c->epochs = 2;
    c->optim.learning_rate = 0.02f; c->optim.momentum = 0.9f;
#ifdef MNISTCU_CUBLAS
    c = &cases[ncases];
    no_head[ncases] = 0, no_graph[ncases++] = 0;
    c->name = "cuBLAS's products, our weight gradients, momentum";
    c->gemm = MNISTCU_GEMM_CUBLAS;
    c->spec = "784 dense1024 relu dense1024 relu dense10";
    c->n = 1100; c->B = 512; c->epochs = 2;
    c->optim.learning_rate = 0.05f; c->optim.momentum = 0.9f;
#endif
    tc_want_state = 1;
    for (i = 0; i < ncases; ++i) {
        tc_graph_run a, b;
        size_t steps, sizes;
        c = &cases[i];
        tc_upd_off = 0;
        ASSERTm(c->name, tc_graph_train(c, no_graph[i], no_head[i], &a));
        tc_upd_off = 1;
        ASSERTm(c->name, tc_graph_train(c, no_graph[i], no_head[i], &b));
        tc_upd_off = 0;
        steps = (c->n + c->B - 1) / c->B * (size_t)c->epochs;
        sizes = c->n % c->B ? 2 : 1;
        printf("    %-66s %lu of %lu steps fused, loss %.9g / %.9g\n", c->name,
               (unsigned long)a.res.fused_update_steps, (unsigned long)steps, a.res.train_loss, b.res.train_loss);
        ASSERT_EQm(c->name, steps, a.res.steps);
        ASSERT_EQm(c->name, steps - sizes, a.res.fused_update_steps); /* all but each size's first */
        ASSERT_EQm(c->name, (size_t)0, b.res.fused_update_steps);
        ASSERT_EQm(c->name, a.res.graph_steps, b.res.graph_steps);
        ASSERTm(c->name, no_graph[i] ? a.res.graph_steps == 0 : a.res.graph_steps > 0);
        ASSERT_EQm(c->name, a.np, b.np);
        ASSERT_EQm(c->name, a.ns, b.ns);
        ASSERTm(c->name, c->optim.momentum > 0.0f ? a.ns == a.np : a.ns == 0);
        ASSERT_ARRAY_EQ_BITS_F(a.p, b.p, 2 * a.np + a.nb + a.ns);
        ASSERT_EQm(c->name, 0, memcmp(&a.res.train_loss, &b.res.train_loss, sizeof(double)));
        ASSERT_EQm(c->name, a.curve.n, b.curve.n);
        ASSERT_EQm(c->name, 0, memcmp(a.curve.loss, b.curve.loss, (size_t)a.curve.n * sizeof(double)));
        free(a.p);
        free(b.p);
    }
    tc_want_state = 0;
    { /* what needs more than a parameter's own gradient stays in the pass; so do products not ours */
        const char *wide = "784 dense1024 relu dense10";
        tc_graph_case d;
        for (i = 0; i < 7; ++i) {
            tc_graph_run a;
            memset(&d, 0, sizeof d);
            d.name = i == 0 ? "SGD" : i == 1 ? "Adam" : i == 2 ? "l2" : i == 3 ? "clipping" : i == 4 ? "narrow" : i == 5 ? "cuBLAS, no head" : "TF32";
            /* narrow: no layer the wide kernel takes, nor the skinny kernel (its last layer's 20 inputs);
               cuBLAS without the head: the same, 1024 -> 20 a product of cuBLAS's */
            d.spec = i == 4 ? "784 dense20 relu dense10" : i == 5 ? "784 dense1024 relu dense20 relu dense10" : wide;
            d.gemm = i == 5 ? MNISTCU_GEMM_CUBLAS : MNISTCU_GEMM_OWN;
            d.n = 200; d.B = 100; d.epochs = 1;
            d.optim.learning_rate = 0.01f;
            if (i == 1) d.optim.kind = MNISTCU_OPTIM_ADAM;
            if (i == 2) d.optim.l2 = 1e-4f;
            if (i == 3) d.optim.clip_norm = 1.0f;
#ifndef MNISTCU_CUBLAS
            if (i == 5) continue;
#endif
            if (i == 6) {
                /* TF32: the first layer's product, on the tensor cores, leaves its step to the pass; the last
                   layer's, the skinny kernel's (FP32 in every context), takes it: the same bits as without */
                float *w[2] = {NULL, NULL};
                size_t np = 0;
                int run;
                if (!tc_has_tensor_cores()) continue;
                for (run = 0; run < 2; ++run) {
                    mnistcu_ctx *g = tc_ctx_prec(MNISTCU_GEMM_OWN, MNISTCU_PRECISION_TF32);
                    mnistcu_dataset *ds = g ? tc_synthetic(g, d.n, 784, 10, 11) : NULL;
                    mnistcu_model *m = NULL;
                    mnistcu_train_desc td;
                    mnistcu_train_result res;
                    memset(&td, 0, sizeof td);
                    td.epochs = 1;
                    td.batch_size = (int)d.B;
                    td.no_fused = 1;
                    td.no_fused_update = run;
                    td.optim = d.optim;
                    ASSERT(ds != NULL);
                    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_spec(g, wide, &m));
                    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, run ? &res : &a.res));
                    if (run) ASSERT_EQ((size_t)0, res.fused_update_steps);
                    np = m->num_params;
                    w[run] = tc_down(m->params, np);
                    mnistcu_ctx_destroy(g);
                }
                ASSERT_ARRAY_EQ_BITS_F(w[0], w[1], np);
                free(w[0]), free(w[1]);
            } else {
                ASSERTm(d.name, tc_graph_train(&d, 0, i == 5, &a));
                free(a.p);
            }
            ASSERT_EQm(d.name, (size_t)2, a.res.steps);
            ASSERT_EQm(d.name, (size_t)(i == 0 || i == 6 ? 1 : 0), a.res.fused_update_steps);
        }
    }
    PASS();
}

/* Before each test: the knobs above as a test that failed midway (an ASSERT returns at once) may have
   left them, so that one failure cannot change the tests after it. */
static void tc_reset_knobs(void *unused)
{
    (void)unused;
    tc_cnn_path = MNISTCU_CNN_OWN;
    tc_upd_off = 0;
    tc_side_off = 0;
    tc_want_state = 0;
    tc_wg_epi_off = 0;
    tc_sms = 0;
    tc_head_res_off = 0;
    tc_graph_prec = MNISTCU_PRECISION_DEFAULT;
}

SUITE(cuda_suite)
{
    SET_SETUP(tc_reset_knobs, NULL);
    RUN_TEST(cuda_reports_device);
    RUN_TEST(cuda_gemm_own_kernel_matches_cpu);
    RUN_TEST(cuda_gemm_wide_matches_cpu);
    RUN_TEST(cuda_gemm_cublas_matches_cpu);
    RUN_TEST(cuda_gemm_kernels_agree_bitwise);
    RUN_TEST(cuda_gemm_wide_agrees_bitwise);
    RUN_TEST(cuda_gemm_skinny_agrees_bitwise);
    RUN_TEST(cuda_splitk_sum4_agrees_bitwise);
    RUN_TEST(cuda_conv_tile_equals_direct_bitwise);
    RUN_TEST(cuda_gemm_reduced_precision_within_bound);
    RUN_TEST(cuda_gemm_reduced_precision_small);
    RUN_TEST(cuda_gemm_tf32x3_both_kernels);
    RUN_TEST(cuda_training_reduced_precision_close_to_fp32);
    RUN_TEST(cuda_elementwise_ops_match_cpu);
    RUN_TEST(cuda_optimizers_match_cpu);
    RUN_TEST(cuda_augment_matches_cpu_bitwise);
    RUN_TEST(cuda_step_stats_and_gather);
    RUN_TEST(cuda_finite_flag_matches_cpu);
    RUN_TEST(cuda_training_matches_cpu_for_200_steps);
    RUN_TEST(cuda_two_runs_are_bitwise_identical);
    RUN_TEST(cuda_streaming_equals_resident);
    RUN_TEST(cuda_streaming_mixed_storage);
    RUN_TEST(cuda_gemm_beyond_grid_rows);
    RUN_TEST(cuda_out_of_memory_frees_and_stays_usable);
    RUN_TEST(cuda_layers_match_cpu);
    RUN_TEST(cuda_batchnorm_pieces_stay_in_aux);
    RUN_TEST(cuda_dropout_mask_matches_cpu_bitwise);
    RUN_TEST(cuda_cnn_runs_are_bitwise_identical);
    RUN_TEST(cuda_fused_mlp_equals_unfused_bitwise);
    RUN_TEST(cuda_fused_mlp_declines_what_it_cannot_do);
    RUN_TEST(cuda_fused_lenet_close_to_step_by_step);
    RUN_TEST(cuda_fused_lenet_declines_what_it_cannot_do);
    RUN_TEST(cuda_fused_mlp_clusters_close_to_step_by_step);
    RUN_TEST(cuda_fused_mlp_clusters_repeats);
    RUN_TEST(cuda_fused_mlp_clusters_declines_what_it_cannot_do);
    RUN_TEST(cuda_graph_step_equals_launched_bitwise);
    RUN_TEST(cuda_conv_branch_equals_in_line_bitwise);
    RUN_TEST(cuda_dense_bias_branch_equals_in_line_bitwise);
    RUN_TEST(cuda_wg_epilogue_equals_passes_bitwise);
    RUN_TEST(cuda_head_step_matches_step_by_step);
    RUN_TEST(cuda_fused_update_equals_pass_bitwise);
    RUN_TEST(cuda_sticky_error_is_latched);
}
