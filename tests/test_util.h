/* Small helpers shared by the test files: a seeded generator (tests never use
   rand()), NaN poison, contexts that stay silent, the data folder. */
#ifndef TEST_UTIL_H
#define TEST_UTIL_H
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../mnistcu.h"

typedef struct tu_rng { uint64_t s; } tu_rng;

static inline tu_rng tu_rng_make(uint64_t seed)
{
    tu_rng r;
    r.s = seed * 0x9E3779B97F4A7C15ull + 1;
    return r;
}

/* splitmix64: independent of the library's own generator */
static inline uint64_t tu_next(tu_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double tu_uniform(tu_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* malloc'ed array of n floats uniform in [lo, hi) */
static inline float *tu_random_floats(tu_rng *r, size_t n, float lo, float hi)
{
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    size_t i;
    for (i = 0; i < n; ++i) p[i] = (float)tu_uniform(r, lo, hi);
    return p;
}

static inline float tu_nan(void)
{
    uint32_t bits = 0x7FC00001u;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline int tu_isnan(float f) { return f != f; }

/* A silent context on the given device with the given thread count (0: default). */
static inline mnistcu_ctx *tu_ctx(mnistcu_device device, int threads)
{
    mnistcu_ctx_desc d;
    mnistcu_ctx *ctx = NULL;
    memset(&d, 0, sizeof d);
    d.device = device;
    d.threads = threads;
    d.log_level = MNISTCU_LOG_SILENT;
    d.seed = 1234;
    if (mnistcu_ctx_create(&ctx, &d) != MNISTCU_OK) {
        mnistcu_ctx_destroy(ctx);
        return NULL;
    }
    return ctx;
}

/* The MNIST folder: $MNISTCU_DATA when set, else data/mnist (run from the repository root). */
static inline const char *tu_mnist_dir(void)
{
    const char *env = getenv("MNISTCU_DATA");
    return env && *env ? env : "data/mnist";
}


/* A whole file, malloc'ed (NULL when it cannot be read). */
static inline unsigned char *tu_read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n;
    *size = 0;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    buf = (unsigned char *)malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* ---- failure messages and the cleanup jump -------------------------------- */
#if defined(__GNUC__) || defined(__clang__)
#define TU_PRINTF_(a, b) __attribute__((format(printf, a, b)))
#else
#define TU_PRINTF_(a, b)
#endif

static char tu_msg[2048];

static inline TU_PRINTF_(2, 3) void tu_setf(int line, const char *fmt, ...)
{
    va_list ap;
    int used = snprintf(tu_msg, sizeof tu_msg, "line %d: ", line);
    if (used < 0 || (size_t)used >= sizeof tu_msg) return;
    va_start(ap, fmt);
    vsnprintf(tu_msg + used, sizeof tu_msg - (size_t)used, fmt, ap);
    va_end(ap);
}

/* Needs a local `int failed` and a label `done:` (the cleanup). Every local is
   declared at the top of its function, so that the jump is valid C++ too. */
#define TU_REQUIRE(cond, ...)                 \
    do {                                      \
        if (!(cond)) {                        \
            tu_setf(__LINE__, __VA_ARGS__);   \
            failed = 1;                       \
            goto done;                        \
        }                                     \
    } while (0)

/* For a helper that has set tu_msg itself and returned 0. */
#define TU_REQUIRE_OK(call)                   \
    do {                                      \
        if (!(call)) {                        \
            failed = 1;                       \
            goto done;                        \
        }                                     \
    } while (0)

/* Ends a test that used TU_REQUIRE; needs harness.h's FAILm and PASS. */
#define TU_END()                              \
    do {                                      \
        if (failed) FAILm(tu_msg);            \
        PASS();                               \
    } while (0)

#endif
