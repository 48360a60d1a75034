/* CPU packing of a transposed op(B) (mnistcu.h >>cpu_ops, MNISTCU__PACK_B's transpose): B is [N][K]
   row-major (a dense layer's weights, PyTorch's layout) and the micro-kernel wants NR-column panels
   p[k][0..NR) of op(B) = B^T. P7's first layer packs its 128 x 784 weights so on every step. Each
   variant is checked equal to v0 (a copy: bitwise) before timing.
   Build: gcc -O3 -march=native bench/cpu_pack.c -o build/cpu_pack
   Run:   build/cpu_pack [N K NR reps] (default 128 784 32 2000) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* v0: the header's form: each packed row gathers one k of NR rows of B */
static void v0(const float *B, size_t ldb, size_t kc, int nr, float *p)
{
    size_t k;
    int j;
    for (k = 0; k < kc; ++k)
        for (j = 0; j < nr; ++j) p[k * nr + j] = B[j * ldb + k];
}

/* v1: each row of B read along k, written down a column of the panel, in blocks of 64 k (8 KB of panel) */
static void v1(const float *B, size_t ldb, size_t kc, int nr, float *p)
{
    size_t k0, k;
    int j;
    for (k0 = 0; k0 < kc; k0 += 64) {
        size_t ke = k0 + 64 < kc ? k0 + 64 : kc;
        for (j = 0; j < nr; ++j)
            for (k = k0; k < ke; ++k) p[k * nr + j] = B[j * ldb + k];
    }
}

/* v2: 8 x 8 blocks through a local tile, the compiler left to vectorise the two copies */
static void v2(const float *B, size_t ldb, size_t kc, int nr, float *p)
{
    size_t k0;
    int j0, a, b;
    float t[8][8];
    for (k0 = 0; k0 + 8 <= kc; k0 += 8)
        for (j0 = 0; j0 < nr; j0 += 8) {
            for (a = 0; a < 8; ++a)
                for (b = 0; b < 8; ++b) t[a][b] = B[(size_t)(j0 + a) * ldb + k0 + b];
            for (b = 0; b < 8; ++b)
                for (a = 0; a < 8; ++a) p[(k0 + b) * nr + j0 + a] = t[a][b];
        }
    for (; k0 < kc; ++k0)
        for (a = 0; a < nr; ++a) p[k0 * nr + a] = B[a * ldb + k0];
}

#if defined(__AVX2__)
/* v3: 8 x 8 transposes in AVX registers (unpack, shuffle, 128-bit lane permute) */
static void v3(const float *B, size_t ldb, size_t kc, int nr, float *p)
{
    size_t k0;
    int j0, a;
    for (k0 = 0; k0 + 8 <= kc; k0 += 8)
        for (j0 = 0; j0 < nr; j0 += 8) {
            const float *s = B + (size_t)j0 * ldb + k0;
            __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ldb), r2 = _mm256_loadu_ps(s + 2 * ldb),
                   r3 = _mm256_loadu_ps(s + 3 * ldb), r4 = _mm256_loadu_ps(s + 4 * ldb),
                   r5 = _mm256_loadu_ps(s + 5 * ldb), r6 = _mm256_loadu_ps(s + 6 * ldb),
                   r7 = _mm256_loadu_ps(s + 7 * ldb);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
            __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
            __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *d = p + k0 * nr + j0;
            _mm256_storeu_ps(d + 0 * nr, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(d + 1 * nr, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(d + 2 * nr, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(d + 3 * nr, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(d + 4 * nr, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(d + 5 * nr, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(d + 6 * nr, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(d + 7 * nr, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    for (; k0 < kc; ++k0)
        for (a = 0; a < nr; ++a) p[k0 * nr + a] = B[a * ldb + k0];
}
#endif

/* op(A) not transposed (a batch of inputs, [M][K] row-major) into MR = 6-row panels p[k][0..6):
   a0 the header's form (each row read along k, written down a column of the panel) */
static void a0(const float *A, size_t lda, size_t kc, float *p)
{
    size_t i, k;
    for (i = 0; i < 6; ++i)
        for (k = 0; k < kc; ++k) p[k * 6 + i] = A[i * lda + k];
}

/* a1: each packed row of 6 from the six rows at one k */
static void a1(const float *A, size_t lda, size_t kc, float *p)
{
    size_t i, k;
    for (k = 0; k < kc; ++k)
        for (i = 0; i < 6; ++i) p[k * 6 + i] = A[i * lda + k];
}

#if defined(__AVX2__)
/* a2: 8 k at a time, the 6 x 8 block transposed in AVX registers (two rows of zeros), each k's 6 values
   stored with a mask */
static void a2(const float *A, size_t lda, size_t kc, float *p)
{
    const __m256i m6 = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    const __m256 z = _mm256_setzero_ps();
    size_t k0, i;
    for (k0 = 0; k0 + 8 <= kc; k0 += 8) {
        const float *s = A + k0;
        __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + lda), r2 = _mm256_loadu_ps(s + 2 * lda),
               r3 = _mm256_loadu_ps(s + 3 * lda), r4 = _mm256_loadu_ps(s + 4 * lda),
               r5 = _mm256_loadu_ps(s + 5 * lda);
        __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
        __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
        __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        __m256 u4 = _mm256_shuffle_ps(t4, z, 0x44), u5 = _mm256_shuffle_ps(t4, z, 0xEE);
        __m256 u6 = _mm256_shuffle_ps(t5, z, 0x44), u7 = _mm256_shuffle_ps(t5, z, 0xEE);
        float *d = p + k0 * 6;
        _mm256_maskstore_ps(d + 0, m6, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_maskstore_ps(d + 6, m6, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_maskstore_ps(d + 12, m6, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_maskstore_ps(d + 18, m6, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_maskstore_ps(d + 24, m6, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_maskstore_ps(d + 30, m6, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_maskstore_ps(d + 36, m6, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_maskstore_ps(d + 42, m6, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
    for (; k0 < kc; ++k0)
        for (i = 0; i < 6; ++i) p[k0 * 6 + i] = A[i * lda + k0];
}
#endif

typedef void (*pack_a_fn)(const float *, size_t, size_t, float *);

typedef void (*pack_fn)(const float *, size_t, size_t, int, float *);

int main(int argc, char **argv)
{
    size_t N = argc > 1 ? (size_t)atol(argv[1]) : 128, K = argc > 2 ? (size_t)atol(argv[2]) : 784;
    int nr = argc > 3 ? atoi(argv[3]) : 32, reps = argc > 4 ? atoi(argv[4]) : 2000, v, r, pass;
    size_t i, panels = N / (size_t)nr, j;
    float *B = (float *)malloc(N * K * sizeof(float)), *ref = (float *)malloc(N * K * sizeof(float)),
          *p = (float *)malloc(N * K * sizeof(float));
    const char *names[] = {"v0 gather a row", "v1 rows down columns", "v2 8x8 local tile", "v3 8x8 AVX transpose"};
    pack_fn fns[4] = {v0, v1, v2, NULL};
#if defined(__AVX2__)
    fns[3] = v3;
#endif
    for (i = 0; i < N * K; ++i) B[i] = (float)((i * 2654435761u) % 1000) / 7.0f;
    for (j = 0; j < panels; ++j) v0(B + j * nr * K, K, K, nr, ref + j * nr * K);
    for (pass = 0; pass < 2; ++pass)
        for (v = 0; v < 4; ++v) {
            double t0, best = 1e9;
            if (!fns[v]) continue;
            memset(p, 0, N * K * sizeof(float));
            for (j = 0; j < panels; ++j) fns[v](B + j * nr * K, K, K, nr, p + j * nr * K);
            if (memcmp(p, ref, panels * nr * K * sizeof(float)) != 0) {
                printf("%s: differs from v0\n", names[v]);
                return 1;
            }
            for (r = 0; r < 5; ++r) {
                int q;
                t0 = now();
                for (q = 0; q < reps / 5; ++q)
                    for (j = 0; j < panels; ++j) fns[v](B + j * nr * K, K, K, nr, p + j * nr * K);
                t0 = (now() - t0) / (reps / 5);
                if (t0 < best) best = t0;
            }
            if (pass) printf("%-24s %8.2f us per %zu x %zu pack (best of 5), %.2f ns an element\n", names[v],
                             best * 1e6, N, K, best * 1e9 / (double)(N * K));
        }
    {
        const char *an[] = {"a0 rows down columns", "a1 a packed row at a time", "a2 6x8 AVX transpose"};
        pack_a_fn af[3] = {a0, a1, NULL};
        size_t M = 66, ap = M / 6;
#if defined(__AVX2__)
        af[2] = a2;
#endif
        for (j = 0; j < ap; ++j) a0(B + j * 6 * K, K, K, ref + j * 6 * K);
        for (pass = 0; pass < 2; ++pass)
            for (v = 0; v < 3; ++v) {
                double t0, best = 1e9;
                if (!af[v]) continue;
                memset(p, 0, M * K * sizeof(float));
                for (j = 0; j < ap; ++j) af[v](B + j * 6 * K, K, K, p + j * 6 * K);
                if (memcmp(p, ref, ap * 6 * K * sizeof(float)) != 0) {
                    printf("%s: differs from a0\n", an[v]);
                    return 1;
                }
                for (r = 0; r < 5; ++r) {
                    int q;
                    t0 = now();
                    for (q = 0; q < reps / 5; ++q)
                        for (j = 0; j < ap; ++j) af[v](B + j * 6 * K, K, K, p + j * 6 * K);
                    t0 = (now() - t0) / (reps / 5);
                    if (t0 < best) best = t0;
                }
                if (pass) printf("%-24s %8.2f us per %zu x %zu pack (best of 5), %.2f ns an element\n", an[v],
                                 best * 1e6, M, K, best * 1e9 / (double)(M * K));
            }
    }
    free(B); free(ref); free(p);
    return 0;
}
