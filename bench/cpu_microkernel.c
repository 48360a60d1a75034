/* CPU micro-kernel variants for the packed matrix product (see mnistcu.h >>cpu_ops).
   Each computes C[6][16] = sum_k a[k][0..5] * b[k][0..15] from packed panels and is
   checked against a double-precision reference before timing.
   Build: gcc -O3 -march=native bench/cpu_microkernel.c -o build/cpu_microkernel -lm */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#define MR 6
#define NR 16

/* v1: one 2-D accumulator array; relies on scalar replacement of the array. */
static void v1(size_t kc, const float *a, const float *b, float *c)
{
    float acc[MR][NR];
    size_t k; int i, j;
    memset(acc, 0, sizeof acc);
    for (k = 0; k < kc; ++k)
        for (i = 0; i < MR; ++i)
            for (j = 0; j < NR; ++j) acc[i][j] += a[k * MR + i] * b[k * NR + j];
    memcpy(c, acc, sizeof acc);
}

/* v2: one accumulator array per row, the row loop written out. */
static void v2(size_t kc, const float *a, const float *b, float *c)
{
    float c0[NR] = {0}, c1[NR] = {0}, c2[NR] = {0}, c3[NR] = {0}, c4[NR] = {0}, c5[NR] = {0};
    size_t k; int j;
    for (k = 0; k < kc; ++k) {
        const float *ak = a + k * MR, *bk = b + k * NR;
        float a0 = ak[0], a1 = ak[1], a2 = ak[2], a3 = ak[3], a4 = ak[4], a5 = ak[5];
        for (j = 0; j < NR; ++j) {
            float bj = bk[j];
            c0[j] += a0 * bj; c1[j] += a1 * bj; c2[j] += a2 * bj;
            c3[j] += a3 * bj; c4[j] += a4 * bj; c5[j] += a5 * bj;
        }
    }
    memcpy(c + 0 * NR, c0, sizeof c0); memcpy(c + 1 * NR, c1, sizeof c1); memcpy(c + 2 * NR, c2, sizeof c2);
    memcpy(c + 3 * NR, c3, sizeof c3); memcpy(c + 4 * NR, c4, sizeof c4); memcpy(c + 5 * NR, c5, sizeof c5);
}

#if defined(__GNUC__)
/* v3: GCC/Clang vector extension, 8 floats per vector, 2 vectors per row. */
typedef float v8 __attribute__((vector_size(32)));
static void v3(size_t kc, const float *a, const float *b, float *c)
{
    v8 acc[MR][2];
    size_t k; int i;
    memset(acc, 0, sizeof acc);
    for (k = 0; k < kc; ++k) {
        v8 b0, b1;
        memcpy(&b0, b + k * NR, sizeof b0);
        memcpy(&b1, b + k * NR + 8, sizeof b1);
        for (i = 0; i < MR; ++i) {
            float ai = a[k * MR + i];
            acc[i][0] += ai * b0;
            acc[i][1] += ai * b1;
        }
    }
    memcpy(c, acc, sizeof acc);
}
#endif

typedef void (*kern)(size_t, const float *, const float *, float *);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void run(const char *name, kern f, size_t kc, const float *a, const float *b)
{
    float c[MR * NR];
    double ref, err = 0, t;
    int i, j, r, reps = 200000;
    size_t k;
    f(kc, a, b, c);
    for (i = 0; i < MR; ++i)
        for (j = 0; j < NR; ++j) {
            ref = 0;
            for (k = 0; k < kc; ++k) ref += (double)a[k * MR + i] * b[k * NR + j];
            err = fmax(err, fabs(c[i * NR + j] - ref) / (fabs(ref) + 1e-6));
        }
    t = now();
    for (r = 0; r < reps; ++r) f(kc, a, b, c);
    t = now() - t;
    printf("%-4s kc=%zu  max rel err %.1e  %.1f GFLOP/s\n", name, kc, err, 2.0 * MR * NR * kc * reps / t / 1e9);
}

int main(void)
{
    size_t kc = 256, i;
    float *a = malloc(kc * MR * 4), *b = malloc(kc * NR * 4);
    srand(1);
    for (i = 0; i < kc * MR; ++i) a[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (i = 0; i < kc * NR; ++i) b[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    run("v1", v1, kc, a, b);
    run("v2", v2, kc, a, b);
#if defined(__GNUC__)
    run("v3", v3, kc, a, b);
#endif
    return 0;
}
