/* The training toolkit against PyTorch: optimizer trajectories
   (tests/fixtures/optimizers.txt from tests/make_optim_fixtures.py), losses and
   their gradients (tests/fixtures/losses.txt from tests/make_loss_fixtures.py),
   central differences for every loss, float targets, augmentation. On the
   device the context picks (MNISTCU_DEVICE), so make test-gpu runs them on
   the GPU too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

/* ---- a fixture file: lines of a keyword and numbers -------------------------- */

typedef struct tk_line {
    char key[32];
    char rest[512];   /* after the keyword, for `case` lines: NAME key=value ... */
    double *v;
    size_t n;
} tk_line;

/* Reads the next non-comment line of f (any length); 0 at the end. */
static int tk_read(FILE *f, tk_line *L)
{
    size_t cap = 0, len = 0, nv = 0, vcap = 0;
    char *buf = NULL, *p, *end;
    int c;
    free(L->v);
    memset(L, 0, sizeof *L);
    for (;;) {
        len = 0;
        while ((c = fgetc(f)) != EOF && c != '\n') {
            if (len + 2 > cap) {
                cap = cap ? 2 * cap : 4096;
                buf = (char *)realloc(buf, cap);
            }
            buf[len++] = (char)c;
        }
        if (len == 0 && c == EOF) {
            free(buf);
            return 0;
        }
        if (!buf) continue;
        buf[len] = 0;
        if (buf[0] != '#' && len) break;
    }
    p = buf;
    while (*p && *p != ' ' && (size_t)(p - buf) < sizeof L->key - 1) ++p;
    memcpy(L->key, buf, (size_t)(p - buf));
    L->key[p - buf] = 0;
    if (*p == ' ') ++p;
    snprintf(L->rest, sizeof L->rest, "%s", p);
    if (strcmp(L->key, "case") != 0) {
        for (;;) {
            double d = strtod(p, &end);
            if (end == p) break;
            if (nv == vcap) {
                vcap = vcap ? 2 * vcap : 256;
                L->v = (double *)realloc(L->v, vcap * sizeof(double));
            }
            L->v[nv++] = d;
            p = end;
        }
    }
    L->n = nv;
    free(buf);
    return 1;
}

/* key=value in a case line; 0 when absent. */
static int tk_field(const char *rest, const char *key, double *out)
{
    char pat[40];
    const char *p;
    snprintf(pat, sizeof pat, " %s=", key);
    p = strstr(rest, pat);
    if (!p) return 0;
    *out = strtod(p + strlen(pat), NULL);
    return 1;
}

static mnistcu_optim tk_kind(const char *rest)
{
    const char *p = strstr(rest, " kind=");
    if (!p) return MNISTCU_OPTIM_DEFAULT;
    p += 6;
    if (!strncmp(p, "sgd", 3)) return MNISTCU_OPTIM_SGD;
    if (!strncmp(p, "adamw", 5)) return MNISTCU_OPTIM_ADAMW;
    if (!strncmp(p, "adam", 4)) return MNISTCU_OPTIM_ADAM;
    if (!strncmp(p, "rmsprop", 7)) return MNISTCU_OPTIM_RMSPROP;
    if (!strncmp(p, "adagrad", 7)) return MNISTCU_OPTIM_ADAGRAD;
    return MNISTCU_OPTIM_DEFAULT;
}

static void tk_optim(const char *rest, mnistcu_optim_desc *o)
{
    double v;
    memset(o, 0, sizeof *o);
    o->kind = tk_kind(rest);
#define TK_F(name) if (tk_field(rest, #name, &v)) o->name = (float)v
#define TK_I(name) if (tk_field(rest, #name, &v)) o->name = (int)v
    if (tk_field(rest, "lr", &v)) o->learning_rate = (float)v;
    TK_F(momentum); TK_I(nesterov); TK_F(weight_decay); TK_F(dampening); TK_F(beta1); TK_F(beta2); TK_F(eps);
    TK_I(amsgrad); TK_F(alpha); TK_I(centered); TK_F(lr_decay); TK_F(initial_accumulator_value); TK_F(l2);
    TK_F(clip_norm);
#undef TK_F
#undef TK_I
}

static float *tk_floats(const tk_line *L)
{
    float *p = (float *)malloc((L->n ? L->n : 1) * sizeof(float));
    size_t i;
    for (i = 0; i < L->n; ++i) p[i] = (float)L->v[i];
    return p;
}

static double tk_rms(const double *v, size_t n)
{
    double s = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) s += v[i] * v[i];
    return sqrt(s / (double)(n ? n : 1));
}

/* Worst |a - b| / (atol + |b|) over n. */
static double tk_worst(const float *a, const double *b, size_t n, double atol, size_t *at)
{
    double worst = 0.0;
    size_t i;
    *at = 0;
    for (i = 0; i < n; ++i) {
        double e = fabs((double)a[i] - b[i]) / (atol + fabs(b[i]));
        if (!(e <= worst)) {
            worst = e;
            *at = i;
        }
    }
    return worst;
}

/* Every case: the same initial weights and batches, STEPS steps through
   compute_grads and apply_grads, then each parameter within 1e-6 of PyTorch's,
   relative to its size or, for parameters near zero, to the root mean square
   of all of them; and each step's loss within 1e-5. */
TEST optimizers_match_pytorch(void)
{
    FILE *f = fopen("tests/fixtures/optimizers.txt", "r");
    tk_line L;
    float *x = NULL, *init = NULL, *got = NULL;
    int32_t *y = NULL;
    size_t nx = 0, ny = 0, i, at;
    int cases = 0, failed = 0;
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_model *m = NULL;
    memset(&L, 0, sizeof L);
    TU_REQUIRE(f && ctx, "tests/fixtures/optimizers.txt missing (run from the repository root) or no context");
    while (tk_read(f, &L)) {
        if (!strcmp(L.key, "x")) {
            x = tk_floats(&L);
            nx = L.n;
        } else if (!strcmp(L.key, "y")) {
            ny = L.n;
            y = (int32_t *)malloc(ny * sizeof(int32_t));
            for (i = 0; i < ny; ++i) y[i] = (int32_t)L.v[i];
        } else if (!strcmp(L.key, "case")) {
            char name[64];
            mnistcu_optim_desc o;
            size_t batches = ny / 8, np, s;
            double loss, worst;
            tk_optim(L.rest, &o);
            sscanf(L.rest, "%63s", name);
            TU_REQUIRE(x && y && nx == ny * 10 && o.kind != MNISTCU_OPTIM_DEFAULT, "%s: malformed fixture", name);
            TU_REQUIRE(tk_read(f, &L) && !strcmp(L.key, "init"), "%s: no init line", name);
            mnistcu_model_destroy(m);
            m = NULL;
            TU_REQUIRE(mnistcu_model_create_spec(ctx, "10-12-4", &m) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
            np = mnistcu_model_num_params(m);
            TU_REQUIRE(np == L.n, "%s: %lu parameters, the fixture has %lu", name, (unsigned long)np,
                       (unsigned long)L.n);
            free(init);
            init = tk_floats(&L);
            TU_REQUIRE(mnistcu_model_set_params(m, init, np) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
            TU_REQUIRE(tk_read(f, &L) && !strcmp(L.key, "loss"), "%s: no loss line", name);
            for (s = 0; s < L.n; ++s) {
                size_t b = s % batches;
                TU_REQUIRE(mnistcu_model_compute_grads(m, x + b * 80, y + b * 8, 8, &loss) == MNISTCU_OK &&
                               mnistcu_model_apply_grads(m, &o) == MNISTCU_OK,
                           "%s step %lu: %s", name, (unsigned long)s, mnistcu_ctx_error(ctx));
                TU_REQUIRE(fabs(loss - L.v[s]) <= 1e-5 * (1.0 + fabs(L.v[s])), "%s: step %lu loss %.9g, PyTorch %.9g",
                           name, (unsigned long)s, loss, L.v[s]);
            }
            TU_REQUIRE(tk_read(f, &L) && !strcmp(L.key, "final") && L.n == np, "%s: no final line", name);
            free(got);
            got = (float *)malloc(np * sizeof(float));
            TU_REQUIRE(mnistcu_model_get_params(m, got, np) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
            worst = tk_worst(got, L.v, np, tk_rms(L.v, np), &at);
            TU_REQUIRE(worst <= 1e-6, "%s: parameter %lu after %d steps is %.9g, PyTorch %.9g (relative %.3g)", name,
                       (unsigned long)at, 50, (double)got[at], L.v[at], worst);
            cases++;
        }
    }
    TU_REQUIRE(cases >= 12, "only %d optimizer cases in the fixture", cases);
done:
    if (f) fclose(f);
    free(L.v);
    free(x); free(y); free(init); free(got);
    mnistcu_model_destroy(m);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* A step with another optimizer starts a fresh state, as a new torch
   optimizer would: Adam after SGD with momentum equals Adam from the start. */
TEST optimizer_state_restarts_on_change(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_model *a = NULL, *b = NULL;
    mnistcu_optim_desc sgd, adam;
    tu_rng rng = tu_rng_make(3);
    float *x = tu_random_floats(&rng, 8 * 10, -1, 1), pa[200], pb[200], *start = NULL;
    int32_t y[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    size_t np = 0;
    int failed = 0, k;
    TU_REQUIRE(ctx && mnistcu_model_create_spec(ctx, "10-12-4", &a) == MNISTCU_OK &&
                   mnistcu_model_create_spec(ctx, "10-12-4", &b) == MNISTCU_OK,
               "models: %s", ctx ? mnistcu_ctx_error(ctx) : "no context");
    np = mnistcu_model_num_params(a);
    TU_REQUIRE(np <= 200, "unexpected size");
    memset(&sgd, 0, sizeof sgd);
    sgd.momentum = 0.9f;
    memset(&adam, 0, sizeof adam);
    adam.kind = MNISTCU_OPTIM_ADAM;
    adam.learning_rate = 0.01f;
    for (k = 0; k < 3; ++k)
        TU_REQUIRE(mnistcu_model_compute_grads(a, x, y, 8, NULL) == MNISTCU_OK &&
                       mnistcu_model_apply_grads(a, &sgd) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
    start = (float *)malloc(np * sizeof(float));
    TU_REQUIRE(mnistcu_model_get_params(a, start, np) == MNISTCU_OK &&
                   mnistcu_model_set_params(b, start, np) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
    for (k = 0; k < 4; ++k)
        TU_REQUIRE(mnistcu_model_compute_grads(a, x, y, 8, NULL) == MNISTCU_OK &&
                       mnistcu_model_apply_grads(a, &adam) == MNISTCU_OK &&
                       mnistcu_model_compute_grads(b, x, y, 8, NULL) == MNISTCU_OK &&
                       mnistcu_model_apply_grads(b, &adam) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(mnistcu_model_get_params(a, pa, np) == MNISTCU_OK && mnistcu_model_get_params(b, pb, np) == MNISTCU_OK,
               "%s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(memcmp(pa, pb, np * sizeof(float)) == 0, "Adam after SGD differs from a fresh Adam");
done:
    free(x);
    free(start);
    mnistcu_model_destroy(a);
    mnistcu_model_destroy(b);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Invalid combinations name their cause. */
TEST optimizer_options_are_checked(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_model *m = NULL;
    mnistcu_optim_desc o[6];
    int k, failed = 0;
    TU_REQUIRE(ctx && mnistcu_model_create_spec(ctx, "4-3", &m) == MNISTCU_OK, "model");
    memset(o, 0, sizeof o);
    o[0].kind = MNISTCU_OPTIM_ADAM; o[0].momentum = 0.9f;
    o[1].kind = MNISTCU_OPTIM_SGD; o[1].nesterov = 1; o[1].momentum = 0.9f; o[1].dampening = 0.1f;
    o[2].kind = MNISTCU_OPTIM_ADAM; o[2].beta2 = 1.0f;
    o[3].kind = MNISTCU_OPTIM_RMSPROP; o[3].amsgrad = 1;
    o[4].kind = (mnistcu_optim)99;
    o[5].kind = MNISTCU_OPTIM_SGD; o[5].clip_norm = -1.0f;
    for (k = 0; k < 6; ++k)
        TU_REQUIRE(mnistcu_model_apply_grads(m, &o[k]) == MNISTCU_ERR_INVALID_ARGUMENT && *mnistcu_ctx_error(ctx),
                   "case %d accepted", k);
done:
    mnistcu_model_destroy(m);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

SUITE(toolkit_suite)
{
    RUN_TEST(optimizers_match_pytorch);
    RUN_TEST(optimizer_state_restarts_on_change);
    RUN_TEST(optimizer_options_are_checked);
}
