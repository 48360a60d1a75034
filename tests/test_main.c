/* The test program's entry point and the one translation unit that holds the
   implementation. The other test files include mnistcu.h plainly, so the test
   binary itself checks that the header links across translation units.
   Tests that need the library's internals (the CPU kernels, the RNG) live here. */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

/* ---- the CPU matrix product against a double-precision reference -------- */

/* C = op(A) op(B) in double, from the same float inputs. */
static void ref_gemm(int ta, int tb, size_t M, size_t N, size_t K, const float *A, size_t lda, const float *B,
                     size_t ldb, double *C)
{
    size_t i, j, k;
    for (i = 0; i < M; ++i)
        for (j = 0; j < N; ++j) {
            double s = 0.0;
            for (k = 0; k < K; ++k)
                s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (double)(tb ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * N + j] = s;
        }
}

typedef struct gemm_case { int ta, tb; size_t M, N, K; } gemm_case;

static int check_gemm(mnistcu_ctx *ctx, const gemm_case *c, tu_rng *rng, char *msg, size_t msg_size)
{
    size_t lda = c->ta ? c->M : c->K, ldb = c->tb ? c->K : c->N, ldc = c->N + 3; /* a padded C row */
    size_t na = c->M * c->K, nb = c->K * c->N, i, j;
    float *A = tu_random_floats(rng, na, -1.0f, 1.0f), *B = tu_random_floats(rng, nb, -1.0f, 1.0f);
    float *C = (float *)malloc((c->M * ldc + 1) * sizeof(float));
    double *R = (double *)malloc((c->M * c->N + 1) * sizeof(double));
    int ok = 1;
    for (i = 0; i < c->M * ldc; ++i) C[i] = tu_nan(); /* poison: every element must be written */
    mnistcu__cpu_gemm(ctx, c->ta, c->tb, c->M, c->N, c->K, A, lda, B, ldb, C, ldc);
    ref_gemm(c->ta, c->tb, c->M, c->N, c->K, A, lda, B, ldb, R);
    for (i = 0; i < c->M && ok; ++i) {
        for (j = 0; j < c->N && ok; ++j) {
            double got = C[i * ldc + j], ref = R[i * c->N + j];
            /* float sums of K terms of size <= 1: error grows like K * eps */
            if (!(fabs(got - ref) <= 1e-5 + 2e-7 * (double)c->K)) {
                snprintf(msg, msg_size, "gemm ta=%d tb=%d %lux%lux%lu: C[%lu][%lu] = %.9g, reference %.9g", c->ta, c->tb,
                         (unsigned long)c->M, (unsigned long)c->N, (unsigned long)c->K, (unsigned long)i,
                         (unsigned long)j, got, ref);
                ok = 0;
            }
        }
        for (j = c->N; j < ldc && ok; ++j)
            if (!tu_isnan(C[i * ldc + j])) {
                snprintf(msg, msg_size, "gemm wrote outside its %lu columns (row %lu col %lu)", (unsigned long)c->N,
                         (unsigned long)i, (unsigned long)j);
                ok = 0;
            }
    }
    free(A); free(B); free(C); free(R);
    return ok;
}

TEST cpu_gemm_matches_reference(void)
{
    /* Shapes on and off every block size: MR 6, NR 16 (32 where AVX-512 is compiled in and N, K >= 64), KC 256,
       MC 144, NC 1024. */
    static const size_t sizes[] = {1, 5, 6, 7, 16, 17, 33, 145, 257};
    static const size_t big[][3] = {{64, 128, 784}, {128, 784, 64}, {300, 1030, 300}, {1, 1025, 513}};
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 0);
    tu_rng rng = tu_rng_make(11);
    char msg[256];
    int ta, tb;
    size_t a, b, k, i;
    mnistcu__cpu_reserve(ctx);
    for (ta = 0; ta < 2; ++ta)
        for (tb = 0; tb < 2; ++tb) {
            for (a = 0; a < 9; a += 2)
                for (b = 0; b < 9; b += 3)
                    for (k = 0; k < 9; k += 4) {
                        gemm_case c;
                        c.ta = ta; c.tb = tb; c.M = sizes[a]; c.N = sizes[b]; c.K = sizes[k];
                        if (!check_gemm(ctx, &c, &rng, msg, sizeof msg)) { mnistcu_ctx_destroy(ctx); FAILm(msg); }
                    }
            for (i = 0; i < 4; ++i) {
                gemm_case c;
                c.ta = ta; c.tb = tb; c.M = big[i][0]; c.N = big[i][1]; c.K = big[i][2];
                if (!check_gemm(ctx, &c, &rng, msg, sizeof msg)) { mnistcu_ctx_destroy(ctx); FAILm(msg); }
            }
        }
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST cpu_gemm_same_bits_for_any_thread_count(void)
{
    mnistcu_ctx *c1 = tu_ctx(MNISTCU_DEVICE_CPU, 1), *c2 = tu_ctx(MNISTCU_DEVICE_CPU, 2), *c3 = tu_ctx(MNISTCU_DEVICE_CPU, 3);
    tu_rng rng = tu_rng_make(5);
    size_t M = 200, N = 300, K = 600;
    float *A = tu_random_floats(&rng, M * K, -1, 1), *B = tu_random_floats(&rng, K * N, -1, 1);
    float *C1 = (float *)malloc(M * N * 4), *C2 = (float *)malloc(M * N * 4), *C3 = (float *)malloc(M * N * 4);
    int same;
    mnistcu__cpu_reserve(c1); mnistcu__cpu_reserve(c2); mnistcu__cpu_reserve(c3);
    mnistcu__cpu_gemm(c1, 0, 1, M, N, K, A, K, B, K, C1, N);
    mnistcu__cpu_gemm(c2, 0, 1, M, N, K, A, K, B, K, C2, N);
    mnistcu__cpu_gemm(c3, 0, 1, M, N, K, A, K, B, K, C3, N);
    same = memcmp(C1, C2, M * N * 4) == 0 && memcmp(C1, C3, M * N * 4) == 0;
    free(A); free(B); free(C1); free(C2); free(C3);
    mnistcu_ctx_destroy(c1); mnistcu_ctx_destroy(c2); mnistcu_ctx_destroy(c3);
    ASSERTm("1, 2 and 3 threads must give bitwise-identical products", same);
    PASS();
}

/* A product wide and deep enough for the 32-wide tile (where AVX-512 is compiled
   in, mnistcu__gemm_nr) against the same outputs computed 50 columns at a time,
   which take the 16-wide tile: the same chains, so the same bits. */
TEST cpu_gemm_tile_width_changes_no_bit(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 2);
    tu_rng rng = tu_rng_make(7);
    const size_t M = 70, N = 300, K = 600;
    float *A = tu_random_floats(&rng, M * K, -1, 1), *B = tu_random_floats(&rng, K * N, -1, 1);
    float *C1 = (float *)malloc(M * N * 4), *C2 = (float *)malloc(M * N * 4);
    int tb, same = 1;
    size_t j0;
    mnistcu__cpu_reserve(ctx);
    ASSERT_EQ(MNISTCU__NR, (int)mnistcu__gemm_nr(50, K)); /* the narrow pieces really are narrow */
    for (tb = 0; tb < 2; ++tb) {
        const size_t ldb = tb ? K : N;
        mnistcu__cpu_gemm(ctx, 0, tb, M, N, K, A, K, B, ldb, C1, N);
        for (j0 = 0; j0 < N; j0 += 50)
            mnistcu__cpu_gemm(ctx, 0, tb, M, 50, K, A, K, tb ? B + j0 * ldb : B + j0, ldb, C2 + j0, N);
        same = same && memcmp(C1, C2, M * N * 4) == 0;
    }
    free(A); free(B); free(C1); free(C2);
    mnistcu_ctx_destroy(ctx);
    ASSERTm("the 16- and 32-wide tiles must give the same bits", same);
    PASS();
}

/* The packed panels hold exactly op(A)'s and op(B)'s values, zero past the matrix, in the micro-kernel's
   layout, whichever packing loops the build has (AVX's register transposes or plain loops): every depth
   left over from 8, panels cut short, rows of the sources padded, blocks that start inside them. */
static int check_packing(size_t kc, size_t len, size_t k0, size_t x0, char *msg, size_t msg_size)
{
    /* a square source, each of its rows 3 floats longer than either use of it needs */
    const size_t ld = (x0 + len > k0 + kc ? x0 + len : k0 + kc) + 3, wide = MNISTCU__NRW;
    float *S = (float *)malloc(ld * ld * sizeof(float)),
          *P = (float *)malloc(((len + 2 * wide + 2 * MNISTCU__MR) * kc + 1) * sizeof(float));
    const size_t widths[2] = {MNISTCU__NR, MNISTCU__NRW};
    size_t i, k, panel, nr, w;
    int tr, ok = 1;
    for (i = 0; i < ld * ld; ++i) S[i] = (float)i + 0.25f;
    /* op(B) as it is ([K][N], ld apart) and transposed ([N][K]), each tile width the build has */
    for (w = 0; w < (MNISTCU__NRW != MNISTCU__NR ? 2u : 1u) && ok; ++w)
        for (tr = 0, nr = widths[w]; tr < 2 && ok; ++tr)
            for (panel = 0; panel * nr < len + nr && ok; ++panel) {
                const size_t guard = nr * kc; /* the float after the panel must stay as it was */
                P[panel * nr * kc + guard] = -1.0f;
                if (nr == MNISTCU__NR) mnistcu__pack_b(tr, S, ld, k0, kc, x0, len, P, panel);
#if MNISTCU__NRW != MNISTCU__NR
                else mnistcu__pack_b_w(tr, S, ld, k0, kc, x0, len, P, panel);
#endif
                for (k = 0; k < kc && ok; ++k)
                    for (i = 0; i < nr && ok; ++i) {
                        size_t j = panel * nr + i;
                        float want = j >= len ? 0.0f : tr ? S[(x0 + j) * ld + k0 + k] : S[(k0 + k) * ld + x0 + j];
                        if (memcmp(&P[panel * nr * kc + k * nr + i], &want, sizeof want) != 0) ok = 0;
                    }
                if (ok && P[panel * nr * kc + guard] != -1.0f) ok = 0;
                if (!ok)
                    snprintf(msg, msg_size, "op(B) panel %lu of %lu columns, transposed %d, width %lu, depth %lu from %lu",
                             (unsigned long)panel, (unsigned long)len, tr, (unsigned long)nr, (unsigned long)kc,
                             (unsigned long)k0);
            }
    /* op(A) as it is ([M][K]) and transposed ([K][M]) */
    for (tr = 0; tr < 2 && ok; ++tr)
        for (panel = 0; panel * MNISTCU__MR < len + MNISTCU__MR && ok; ++panel) {
            const size_t guard = MNISTCU__MR * kc;
            P[panel * MNISTCU__MR * kc + guard] = -1.0f;
            mnistcu__pack_a(tr, S, ld, x0, len, k0, kc, P, panel);
            for (k = 0; k < kc && ok; ++k)
                for (i = 0; i < MNISTCU__MR && ok; ++i) {
                    size_t r = panel * MNISTCU__MR + i;
                    float want = r >= len ? 0.0f : tr ? S[(k0 + k) * ld + x0 + r] : S[(x0 + r) * ld + k0 + k];
                    if (memcmp(&P[panel * MNISTCU__MR * kc + k * MNISTCU__MR + i], &want, sizeof want) != 0) ok = 0;
                }
            if (ok && P[panel * MNISTCU__MR * kc + guard] != -1.0f) ok = 0;
            if (!ok)
                snprintf(msg, msg_size, "op(A) panel %lu of %lu rows, transposed %d, depth %lu from %lu",
                         (unsigned long)panel, (unsigned long)len, tr, (unsigned long)kc, (unsigned long)k0);
        }
    free(S);
    free(P);
    return ok;
}

TEST cpu_packing_lays_out_panels(void)
{
    static const size_t depths[] = {1, 7, 8, 9, 16, 23, 64, 785};
    static const size_t lens[] = {3, 6, 16, 21, 32, 45};
    char msg[256];
    size_t d, l;
    for (d = 0; d < sizeof depths / sizeof depths[0]; ++d)
        for (l = 0; l < sizeof lens / sizeof lens[0]; ++l)
            if (!check_packing(depths[d], lens[l], d % 3, l % 2 ? 5 : 0, msg, sizeof msg)) FAILm(msg);
    PASS();
}

/* ---- the random generator ------------------------------------------------ */
TEST rng_is_reproducible_and_streams_differ(void)
{
    mnistcu__rng a, b, c;
    int i, same_ab = 1, same_ac = 1;
    mnistcu__rng_seed(&a, 42, 1);
    mnistcu__rng_seed(&b, 42, 1);
    mnistcu__rng_seed(&c, 42, 2);
    for (i = 0; i < 1000; ++i) {
        uint64_t x = mnistcu__rng_next(&a), y = mnistcu__rng_next(&b), z = mnistcu__rng_next(&c);
        same_ab &= x == y;
        same_ac &= x == z;
    }
    ASSERT(same_ab);
    ASSERT_FALSE(same_ac);
    PASS();
}

TEST rng_float_and_below_ranges(void)
{
    mnistcu__rng r;
    int i, counts[7] = {0};
    double mean = 0.0;
    mnistcu__rng_seed(&r, 9, 0);
    for (i = 0; i < 70000; ++i) {
        float f = mnistcu__rng_float(&r);
        uint64_t k = mnistcu__rng_below(&r, 7);
        ASSERT(f >= 0.0f && f < 1.0f);
        ASSERT(k < 7);
        counts[k]++;
        mean += f;
    }
    mean /= 70000.0;
    ASSERT_IN_RANGE(0.5, mean, 0.01);
    for (i = 0; i < 7; ++i) ASSERT_IN_RANGE(10000, counts[i], 500); /* ~5 sigma */
    ASSERT_EQ(0, (int)mnistcu__rng_below(&r, 1));
    PASS();
}

/* Lemire's method as written first (the 128-bit product from 32-bit halves, the bound 2^64 mod n
   taken before every draw): mnistcu__rng_below must give the same values and leave the generator in
   the same place, for bounds where the rejection is rare (small n) and where it is frequent (n just
   over 2^63: about half the draws rejected) */
static uint64_t ref_below(mnistcu__rng *r, uint64_t n)
{
    uint64_t threshold;
    if (n <= 1) return 0;
    threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = mnistcu__rng_next(r), a = x >> 32, b = x & 0xFFFFFFFFu, c = n >> 32, d = n & 0xFFFFFFFFu;
        uint64_t ac = a * c, ad = a * d, bc = b * c, bd = b * d;
        uint64_t mid = (bd >> 32) + (ad & 0xFFFFFFFFu) + (bc & 0xFFFFFFFFu);
        uint64_t hi = ac + (ad >> 32) + (bc >> 32) + (mid >> 32), lo = (mid << 32) | (bd & 0xFFFFFFFFu);
        if (lo >= threshold) return hi;
    }
}

TEST rng_below_matches_lemire_reference(void)
{
    static const uint64_t bounds[] = {2, 3, 7, 1000, 60000, 0xFFFFFFFFull, 0x100000001ull, 0x8000000000000001ull,
                                      0xC000000000000000ull, 0xFFFFFFFFFFFFFFFFull};
    size_t b;
    int i, rejected = 0;
    for (b = 0; b < sizeof bounds / sizeof bounds[0]; ++b) {
        mnistcu__rng r, q;
        mnistcu__rng_seed(&r, 17, b);
        q = r;
        for (i = 0; i < 4000; ++i) {
            uint64_t v = mnistcu__rng_below(&r, bounds[b]), w = ref_below(&q, bounds[b]);
            ASSERT_EQ_FMT(MNISTCU__ULL(w), MNISTCU__ULL(v), "%llu");
            ASSERT(v < bounds[b]);
        }
        ASSERT_MEM_EQ(&q, &r, sizeof r); /* the same draws, rejected ones included */
        if (bounds[b] == 0x8000000000000001ull) { /* rejections did happen: more draws than values */
            mnistcu__rng z;
            mnistcu__rng_seed(&z, 17, b);
            for (i = 0; i < 4000; ++i) (void)mnistcu__rng_next(&z);
            rejected = memcmp(&z, &r, sizeof z) != 0;
        }
    }
    ASSERT(rejected);
    PASS();
}

TEST shuffle_is_a_permutation(void)
{
    mnistcu__rng r;
    uint32_t idx[1000];
    int seen[1000] = {0}, moved = 0, i;
    mnistcu__rng_seed(&r, 1, 0);
    for (i = 0; i < 1000; ++i) idx[i] = (uint32_t)i;
    mnistcu__shuffle(&r, idx, 1000);
    for (i = 0; i < 1000; ++i) {
        ASSERT(idx[i] < 1000);
        seen[idx[i]]++;
        moved += idx[i] != (uint32_t)i;
    }
    for (i = 0; i < 1000; ++i) ASSERT_EQ(1, seen[i]);
    ASSERT_GT(moved, 900);
    PASS();
}

/* The next epoch's order made ahead (mnistcu__order_ahead) is the shuffle it spares: the same order,
   the generator left where that shuffle would leave it; used once, and not where n differs or the
   generator has moved since */
TEST order_ahead_is_the_shuffle_it_spares(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 0);
    mnistcu_model *m = NULL;
    static uint32_t got[1000], want[1000];
    mnistcu__rng before, r;
    int i;
    ASSERT(ctx);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "16-8-4", &m));
    before = m->rng;
    mnistcu__order_ahead(m, 1000);
    ASSERT_MEM_EQ(&before, &m->rng, sizeof before); /* made from a copy */
    r = before;
    for (i = 0; i < 1000; ++i) want[i] = (uint32_t)i;
    mnistcu__shuffle(&r, want, 1000);
    ASSERT(mnistcu__order_take(m, got, 1000));
    ASSERT_MEM_EQ(want, got, sizeof want);
    ASSERT_MEM_EQ(&r, &m->rng, sizeof r);
    ASSERT_FALSE(mnistcu__order_take(m, got, 1000)); /* once */
    mnistcu__order_ahead(m, 1000);
    ASSERT_FALSE(mnistcu__order_take(m, got, 999));
    mnistcu__order_ahead(m, 1000);
    (void)mnistcu__rng_next(&m->rng);
    ASSERT_FALSE(mnistcu__order_take(m, got, 1000));
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* The fused kernels' scalars for a chunk of steps: one or two made where the
   step changes nothing else, each step's otherwise; step q reads entry
   min(q, made - 1), which must be the scalars mnistcu__opt_make makes for it. */
TEST opt_steps_are_opt_make_for_every_step(void)
{
    static const mnistcu_optim kinds[] = {MNISTCU_OPTIM_SGD, MNISTCU_OPTIM_ADAM, MNISTCU_OPTIM_ADAMW,
                                          MNISTCU_OPTIM_RMSPROP, MNISTCU_OPTIM_ADAGRAD};
    static const uint64_t starts[] = {1, 2, 938};
    static const float decays[] = {0.0f, 0.01f};
    mnistcu__opt ops[7], want;
    size_t k, si, di, count, s, made;
    for (k = 0; k < sizeof kinds / sizeof *kinds; ++k)
        for (di = 0; di < 2; ++di)
            for (si = 0; si < 3; ++si)
                for (count = 1; count <= 7; count += 3) {
                    mnistcu_optim_desc o;
                    mnistcu__opt_memo mm, mm2;
                    memset(&o, 0, sizeof o);
                    memset(&mm, 0, sizeof mm);
                    memset(&mm2, 0, sizeof mm2);
                    o.kind = kinds[k];
                    o.learning_rate = 0.1f;
                    o.momentum = 0.9f;
                    o.beta1 = 0.9f;
                    o.beta2 = 0.999f;
                    o.eps = 1e-8f;
                    o.alpha = 0.99f;
                    o.weight_decay = 0.01f;
                    o.lr_decay = decays[di];
                    made = mnistcu__opt_steps(&o, starts[si], count, 1234, ops, &mm);
                    ASSERT(made >= 1 && made <= count);
                    if ((o.kind == MNISTCU_OPTIM_SGD || o.kind == MNISTCU_OPTIM_RMSPROP) && di == 0)
                        ASSERT(made <= 2); /* the point: not a step's scalars for every step */
                    for (s = 0; s < count; ++s) {
                        mnistcu__opt_make(&o, starts[si] + s, 1234, &want, &mm2);
                        ASSERT_MEM_EQ(&want, &ops[s < made ? s : made - 1], sizeof want);
                    }
                }
    PASS();
}

/* ---- the fused CPU ops against double references ------------------------- */
TEST softmax_ce_matches_double_reference(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 0);
    tu_rng rng = tu_rng_make(3);
    size_t B = 9, C = 13, i, j;
    float *z = tu_random_floats(&rng, B * C, -20.0f, 20.0f), g[9 * 13], loss[9];
    int32_t labels[9], pred[9];
    for (i = 0; i < B; ++i) labels[i] = (int32_t)(i % C);
    z[5] = 80.0f; /* large logits must not overflow */
    {
        mnistcu__lossp lp;
        memset(&lp, 0, sizeof lp);
        lp.kind = MNISTCU_LOSS_SOFTMAX_CE;
        mnistcu__cpu_loss(ctx, &lp, z, labels, NULL, B, C, 1.0f / (float)B, g, loss, pred);
    }
    for (i = 0; i < B; ++i) {
        double mx = -1e300, s = 0.0;
        size_t arg = 0;
        for (j = 0; j < C; ++j)
            if (z[i * C + j] > mx) { mx = z[i * C + j]; arg = j; }
        for (j = 0; j < C; ++j) s += exp((double)z[i * C + j] - mx);
        ASSERT_NEAR(loss[i], mx + log(s) - z[i * C + (size_t)labels[i]], 1e-5, 1e-5);
        ASSERT_EQ((int32_t)arg, pred[i]);
        for (j = 0; j < C; ++j) {
            double p = exp((double)z[i * C + j] - mx) / s - (j == (size_t)labels[i] ? 1.0 : 0.0);
            ASSERT_NEAR(g[i * C + j], p / (double)B, 1e-7, 1e-5);
        }
    }
    free(z);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* ReduceLROnPlateau's rates for a fixed sequence of validation losses, from
   tests/fixtures/schedules.txt (tests/make_schedule_fixtures.py: the same losses). */
TEST plateau_matches_pytorch(void)
{
    static const double losses[16] = {1.0, 0.9, 0.95, 0.95, 0.95, 0.8, 0.81, 0.82, 0.83, 0.84, 0.85, 0.86, 0.87,
                                      0.7, 0.71, 0.72};
    mnistcu_schedule_desc sd;
    mnistcu__plateau pl;
    char line[4096];
    int t, found = 0;
    FILE *f = fopen("tests/fixtures/schedules.txt", "r");
    ASSERTm("tests/fixtures/schedules.txt is missing (run from the repository root)", f != NULL);
    memset(&sd, 0, sizeof sd);
    sd.kind = MNISTCU_SCHEDULE_PLATEAU;
    sd.patience = 2;
    sd.factor = 0.5f;
    sd.min_lr = 0.004f;
    while (fgets(line, sizeof line, f)) {
        char *p = line + strlen("plateau_2_0.5_0.004"), *end;
        if (strncmp(line, "plateau_2_0.5_0.004 ", 20) != 0) continue;
        ASSERT_EQ(16, (int)strtol(p, &end, 10));
        p = end;
        mnistcu__plateau_start(&pl, 0.05f);
        for (t = 0; t < 16; ++t) {
            double ref = strtod(p, &end);
            p = end;
            ASSERT_NEAR(ref, (double)(float)pl.lr, 1e-9, 1e-7);
            mnistcu__plateau_step(&pl, &sd, losses[t]);
        }
        found = 1;
    }
    fclose(f);
    ASSERT(found);
    PASS();
}

/* Augmentation's integer sine and cosine (Q24) against libm over the range
   it is used on, and its floor shift against division. */
TEST augment_fixed_point_math(void)
{
    int k;
    for (k = -1000; k <= 1000; ++k) {
        double x = 1.5707963267948966 * k / 1000.0;
        int64_t sn, cs, xq = (int64_t)floor(x * 16777216.0 + 0.5);
        mnistcu__sincos_q24(xq, &sn, &cs);
        ASSERT_NEAR((double)sn / 16777216.0, sin((double)xq / 16777216.0), 1e-6, 0);
        ASSERT_NEAR((double)cs / 16777216.0, cos((double)xq / 16777216.0), 1e-6, 0);
    }
    for (k = -70000; k <= 70000; k += 7) ASSERT_EQ((int64_t)floor(k / 256.0), mnistcu__asr(k, 8));
    PASS();
}

/* The optimizer's scalars made with the decimals kept between steps are the
   bits made from scratch, whichever of the seven floats changes, to a NaN or
   to negative zero included (a kept decimal that missed a change fails). */
TEST optimizer_scalars_with_kept_decimals(void)
{
    static const float vals[] = {0.1f, 0.1f, 0.01f, -0.0f, 0.0f, 0.9f, 0.999f, 1e-8f, 0.30000001f, 3e38f};
    mnistcu__opt_memo kept;
    mnistcu_optim_desc o;
    int i, f;
    memset(&kept, 0, sizeof kept);
    memset(&o, 0, sizeof o);
    o.kind = MNISTCU_OPTIM_ADAM;
    o.learning_rate = 0.001f, o.beta1 = 0.9f, o.beta2 = 0.999f, o.alpha = 0.99f, o.dampening = 0.0f;
    for (i = 0; i < 70; ++i) {
        mnistcu__opt a, b;
        mnistcu__opt_memo fresh;
        float v = i == 69 ? mnistcu__nan() : vals[(i * 7 + i / 10) % 10];
        f = i % 7;
        if (f == 0) o.learning_rate = v;
        if (f == 1) o.beta1 = v;
        if (f == 2) o.beta2 = v;
        if (f == 3) o.alpha = v;
        if (f == 4) o.dampening = v;
        if (f == 5) o.lr_decay = v;
        if (f == 6) o.weight_decay = v;
        memset(&fresh, 0, sizeof fresh);
        mnistcu__opt_make(&o, (uint64_t)(i + 1), 100, &a, &kept);
        mnistcu__opt_make(&o, (uint64_t)(i + 1), 100, &b, &fresh);
        ASSERT_MEM_EQ(&b, &a, sizeof a);
    }
    PASS();
}

SUITE(cpu_ops_suite)
{
    RUN_TEST(augment_fixed_point_math);
    RUN_TEST(optimizer_scalars_with_kept_decimals);
    RUN_TEST(plateau_matches_pytorch);
    RUN_TEST(cpu_gemm_matches_reference);
    RUN_TEST(cpu_gemm_same_bits_for_any_thread_count);
    RUN_TEST(cpu_gemm_tile_width_changes_no_bit);
    RUN_TEST(cpu_packing_lays_out_panels);
    RUN_TEST(rng_is_reproducible_and_streams_differ);
    RUN_TEST(rng_float_and_below_ranges);
    RUN_TEST(rng_below_matches_lemire_reference);
    RUN_TEST(shuffle_is_a_permutation);
    RUN_TEST(order_ahead_is_the_shuffle_it_spares);
    RUN_TEST(opt_steps_are_opt_make_for_every_step);
    RUN_TEST(softmax_ce_matches_double_reference);
}

#ifdef __CUDACC__
#include "test_cuda.h" /* SUITE(cuda_suite): every CUDA op against the CPU reference */
#endif

SUITE_EXTERN(gzip_suite);
SUITE_EXTERN(idx_suite);
SUITE_EXTERN(dataset_suite);
SUITE_EXTERN(model_suite);
SUITE_EXTERN(grad_suite);
SUITE_EXTERN(train_suite);
SUITE_EXTERN(api_suite);
SUITE_EXTERN(torch_fixture_suite);
SUITE_EXTERN(layers_suite);
SUITE_EXTERN(layer_fixture_suite);
SUITE_EXTERN(toolkit_suite);
SUITE_EXTERN(files_suite);
SUITE_EXTERN(images_suite);

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(cpu_ops_suite);
    RUN_SUITE(gzip_suite);
    RUN_SUITE(idx_suite);
    RUN_SUITE(dataset_suite);
    RUN_SUITE(model_suite);
    RUN_SUITE(grad_suite);
    RUN_SUITE(api_suite);
    RUN_SUITE(torch_fixture_suite);
    RUN_SUITE(layers_suite);
    RUN_SUITE(layer_fixture_suite);
    RUN_SUITE(toolkit_suite);
    RUN_SUITE(files_suite);
    RUN_SUITE(images_suite);
    RUN_SUITE(train_suite);
#ifdef __CUDACC__
    RUN_SUITE(cuda_suite);
#endif
    GREATEST_MAIN_END();
}
