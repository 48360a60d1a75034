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

/* ---- losses -------------------------------------------------------------- */

typedef struct tk_loss_case {
    char name[64];
    mnistcu_loss loss;
    float smoothing, margin;
    int sum, p, targets;
} tk_loss_case;

static void tk_loss_parse(const char *rest, tk_loss_case *c)
{
    double v;
    memset(c, 0, sizeof *c);
    sscanf(rest, "%63s", c->name);
    c->loss = strstr(rest, "loss=mse") ? MNISTCU_LOSS_MSE : strstr(rest, "loss=bce") ? MNISTCU_LOSS_BCE
            : strstr(rest, "loss=hinge") ? MNISTCU_LOSS_HINGE : MNISTCU_LOSS_SOFTMAX_CE;
    if (tk_field(rest, "smoothing", &v)) c->smoothing = (float)v;
    if (tk_field(rest, "margin", &v)) c->margin = (float)v;
    if (tk_field(rest, "sum", &v)) c->sum = (int)v;
    if (tk_field(rest, "p", &v)) c->p = (int)v;
    if (tk_field(rest, "targets", &v)) c->targets = (int)v;
}

/* A Linear(6, 4) with the case's loss, on the context's device. */
static mnistcu_result tk_linear(mnistcu_ctx *ctx, const tk_loss_case *c, mnistcu_model **m)
{
    mnistcu_model_desc d;
    memset(&d, 0, sizeof d);
    d.input_c = 1; d.input_h = 1; d.input_w = 6;
    d.layers[0].kind = MNISTCU_LAYER_DENSE;
    d.layers[0].units = 4;
    d.loss = c->loss;
    d.label_smoothing = c->smoothing;
    d.loss_sum = c->sum;
    d.margin = c->margin;
    d.hinge_p = c->p;
    return mnistcu_model_create(ctx, &d, m);
}

static mnistcu_result tk_grads(mnistcu_model *m, const tk_loss_case *c, const float *x, const int32_t *y,
                               const float *t, double *loss)
{
    return c->targets ? mnistcu_model_compute_grads_targets(m, x, t, 5, loss)
                      : mnistcu_model_compute_grads(m, x, y, 5, loss);
}

/* Every case of the fixture: the loss within 1e-5 relative of PyTorch's and
   the weight and bias gradients within 1e-5 of theirs (relative to the
   largest gradient); then, on the CPU, central differences of the loss in
   double over each of the 28 parameters agree with the gradient. */
TEST losses_match_pytorch(void)
{
    FILE *f = fopen("tests/fixtures/losses.txt", "r");
    tk_line L;
    tk_loss_case c;
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_model *m = NULL;
    float x[30], w[24], b[4], t[20], gw[24], gb[4];
    double ref_loss = 0, dw[24], db[4];
    int32_t y[5];
    int cases = 0, failed = 0, kinds = 0;
    size_t i;
    memset(&L, 0, sizeof L);
    memset(&c, 0, sizeof c);
    TU_REQUIRE(f && ctx, "tests/fixtures/losses.txt missing (run from the repository root) or no context");
    while (tk_read(f, &L)) {
        if (!strcmp(L.key, "case")) {
            tk_loss_parse(L.rest, &c);
            continue;
        }
#define TK_TAKE(K_, A_, N_)                                                                       \
        if (!strcmp(L.key, K_)) {                                                                 \
            TU_REQUIRE(L.n == (N_), "%s: %s has %lu values", c.name, K_, (unsigned long)L.n);    \
            for (i = 0; i < (N_); ++i) A_[i] = (float)L.v[i];                                     \
            continue;                                                                             \
        }
        TK_TAKE("x", x, 30)
        TK_TAKE("weight", w, 24)
        TK_TAKE("bias", b, 4)
        TK_TAKE("t", t, 20)
#undef TK_TAKE
        if (!strcmp(L.key, "y")) {
            for (i = 0; i < 5; ++i) y[i] = (int32_t)L.v[i];
        } else if (!strcmp(L.key, "loss")) {
            ref_loss = L.v[0];
        } else if (!strcmp(L.key, "dweight")) {
            for (i = 0; i < 24; ++i) dw[i] = L.v[i];
        } else if (!strcmp(L.key, "dbias")) {
            double got, scale = 0.0, worst;
            size_t at;
            for (i = 0; i < 4; ++i) db[i] = L.v[i];
            for (i = 0; i < 24; ++i) scale = fmax(scale, fabs(dw[i]));
            for (i = 0; i < 4; ++i) scale = fmax(scale, fabs(db[i]));
            mnistcu_model_destroy(m);
            m = NULL;
            TU_REQUIRE(tk_linear(ctx, &c, &m) == MNISTCU_OK, "%s: %s", c.name, mnistcu_ctx_error(ctx));
            TU_REQUIRE(mnistcu_model_set_tensor(m, "0.weight", w, 24) == MNISTCU_OK &&
                           mnistcu_model_set_tensor(m, "0.bias", b, 4) == MNISTCU_OK &&
                           tk_grads(m, &c, x, y, t, &got) == MNISTCU_OK &&
                           mnistcu_model_get_tensor_grad(m, "0.weight", gw, 24) == MNISTCU_OK &&
                           mnistcu_model_get_tensor_grad(m, "0.bias", gb, 4) == MNISTCU_OK,
                       "%s: %s", c.name, mnistcu_ctx_error(ctx));
            TU_REQUIRE(fabs(got - ref_loss) <= 1e-5 * fabs(ref_loss) + 1e-7, "%s: loss %.9g, PyTorch %.9g", c.name, got,
                       ref_loss);
            worst = tk_worst(gw, dw, 24, scale, &at);
            TU_REQUIRE(worst <= 1e-5, "%s: dweight[%lu] %.9g, PyTorch %.9g", c.name, (unsigned long)at,
                       (double)gw[at], dw[at]);
            worst = tk_worst(gb, db, 4, scale, &at);
            TU_REQUIRE(worst <= 1e-5, "%s: dbias[%lu] %.9g, PyTorch %.9g", c.name, (unsigned long)at, (double)gb[at],
                       db[at]);
            cases++;
            kinds |= 1 << c.loss;
        }
    }
    TU_REQUIRE(cases >= 14 && kinds == (1 << MNISTCU_LOSS_SOFTMAX_CE | 1 << MNISTCU_LOSS_MSE |
                                        1 << MNISTCU_LOSS_BCE | 1 << MNISTCU_LOSS_HINGE),
               "the fixture has %d cases, not every loss", cases);
done:
    if (f) fclose(f);
    free(L.v);
    mnistcu_model_destroy(m);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Central differences of each loss (through a dense layer, on the CPU) against
   its gradient: every loss kind, labels and targets, mean and sum. Inputs in
   [-1, 1] and a margin that keeps the hinge away from its kinks for h. */
TEST losses_match_finite_differences(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_model *m = NULL;
    tu_rng rng = tu_rng_make(77);
    float *x = tu_random_floats(&rng, 30, -1, 1), *t = tu_random_floats(&rng, 20, 0, 1), w[28], g[28];
    int32_t y[5] = {0, 3, 1, 2, 3};
    int k, failed = 0;
    size_t i;
    for (k = 0; k < 10; ++k) {
        tk_loss_case c;
        memset(&c, 0, sizeof c);
        c.loss = (mnistcu_loss)(MNISTCU_LOSS_SOFTMAX_CE + k % 4);
        c.targets = (k / 4 == 1) && c.loss != MNISTCU_LOSS_HINGE;
        c.sum = k >= 8;
        c.smoothing = c.loss == MNISTCU_LOSS_SOFTMAX_CE && k >= 4 ? 0.15f : 0.0f;
        c.p = k == 7 ? 2 : 1;
        c.margin = 0.7f;
        snprintf(c.name, sizeof c.name, "loss %d targets %d sum %d", (int)c.loss, c.targets, c.sum);
        mnistcu_model_destroy(m);
        m = NULL;
        TU_REQUIRE(ctx && tk_linear(ctx, &c, &m) == MNISTCU_OK, "%s", c.name);
        for (i = 0; i < 28; ++i) w[i] = (float)tu_uniform(&rng, -0.5, 0.5);
        TU_REQUIRE(mnistcu_model_set_params(m, w, 28) == MNISTCU_OK &&
                       tk_grads(m, &c, x, y, t, NULL) == MNISTCU_OK && mnistcu_model_get_grads(m, g, 28) == MNISTCU_OK,
                   "%s: %s", c.name, mnistcu_ctx_error(ctx));
        for (i = 0; i < 28; ++i) {
            double lp, lm, fd, h = 1e-2;
            float keep = w[i];
            w[i] = keep + (float)h;
            TU_REQUIRE(mnistcu_model_set_params(m, w, 28) == MNISTCU_OK && tk_grads(m, &c, x, y, t, &lp) == MNISTCU_OK,
                       "%s", c.name);
            w[i] = keep - (float)h;
            TU_REQUIRE(mnistcu_model_set_params(m, w, 28) == MNISTCU_OK && tk_grads(m, &c, x, y, t, &lm) == MNISTCU_OK,
                       "%s", c.name);
            w[i] = keep;
            fd = (lp - lm) / (2 * h);
            TU_REQUIRE(fabs(fd - g[i]) <= 2e-3 * (1.0 + fabs(fd)), "%s: parameter %lu: gradient %.6g, differences %.6g",
                       c.name, (unsigned long)i, (double)g[i], fd);
        }
    }
done:
    free(x);
    free(t);
    mnistcu_model_destroy(m);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Float targets through mnistcu_train: a linear regression learnt with MSE
   (the loss falls to the noise floor), accuracy not reported, predictions are
   the outputs; the hinge loss refuses targets. */
TEST regression_with_float_targets(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_model *m = NULL;
    mnistcu_dataset *ds = NULL;
    mnistcu_model_desc d;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    mnistcu_metrics met;
    tu_rng rng = tu_rng_make(5);
    size_t n = 512, i, j;
    float *x = tu_random_floats(&rng, n * 3, -1, 1), *t = (float *)malloc(n * 2 * sizeof(float)), probs[2];
    int failed = 0;
    for (i = 0; i < n; ++i)
        for (j = 0; j < 2; ++j)
            t[i * 2 + j] = (j ? -1.0f : 2.0f) * x[i * 3] + 0.5f * x[i * 3 + 1 + j] + 0.25f;
    memset(&d, 0, sizeof d);
    d.input_c = d.input_h = 1;
    d.input_w = 3;
    d.layers[0].kind = MNISTCU_LAYER_DENSE;
    d.layers[0].units = 2;
    d.loss = MNISTCU_LOSS_MSE;
    TU_REQUIRE(ctx && mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK &&
                   mnistcu_dataset_create_targets(ctx, x, t, n, 3, 2, &ds) == MNISTCU_OK,
               "setup: %s", ctx ? mnistcu_ctx_error(ctx) : "no context");
    memset(&td, 0, sizeof td);
    td.epochs = 40;
    td.batch_size = 32;
    td.optim.learning_rate = 0.1f;
    TU_REQUIRE(mnistcu_train(m, ds, &td, &res) == MNISTCU_OK, "train: %s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(res.train_loss < 1e-4 && res.train_accuracy != res.train_accuracy, "loss %.3g, accuracy %g",
               res.train_loss, res.train_accuracy);
    TU_REQUIRE(mnistcu_evaluate(m, ds, &met, NULL) == MNISTCU_OK && !met.has_accuracy && met.loss < 1e-4,
               "evaluate: loss %g has_accuracy %d", met.loss, met.has_accuracy);
    TU_REQUIRE(mnistcu_predict(m, x, 1, NULL, probs) == MNISTCU_OK && fabs(probs[0] - t[0]) < 0.02 &&
                   fabs(probs[1] - t[1]) < 0.02,
               "prediction %g %g, target %g %g", (double)probs[0], (double)probs[1], (double)t[0], (double)t[1]);
    mnistcu_model_destroy(m);
    m = NULL;
    d.loss = MNISTCU_LOSS_HINGE;
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "hinge model");
    TU_REQUIRE(mnistcu_train(m, ds, &td, &res) == MNISTCU_ERR_INVALID_ARGUMENT, "hinge accepted float targets");
done:
    free(x);
    free(t);
    mnistcu_dataset_destroy(ds);
    mnistcu_model_destroy(m);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

SUITE(toolkit_suite)
{
    RUN_TEST(optimizers_match_pytorch);
    RUN_TEST(optimizer_state_restarts_on_change);
    RUN_TEST(optimizer_options_are_checked);
    RUN_TEST(losses_match_pytorch);
    RUN_TEST(losses_match_finite_differences);
    RUN_TEST(regression_with_float_targets);
}
