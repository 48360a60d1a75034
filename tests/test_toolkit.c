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

/* ---- augmentation -------------------------------------------------------- */

/* n images H x W stored as bytes (through an in-memory IDX file): a bright
   5 x 5 square whose corner is at (r0, c0), on black; labels 0..9. */
static mnistcu_dataset *tk_images(mnistcu_ctx *ctx, int n, int H, int W, int r0, int c0)
{
    size_t isz = 16 + (size_t)n * H * W, k;
    unsigned char *img = (unsigned char *)calloc(isz, 1), *lab = (unsigned char *)calloc(8 + (size_t)n, 1);
    mnistcu_dataset_desc d;
    mnistcu_dataset *ds = NULL;
    int i, r, c;
    img[2] = 8; img[3] = 3;
    img[4] = (unsigned char)(n >> 24); img[5] = (unsigned char)(n >> 16); img[6] = (unsigned char)(n >> 8); img[7] = (unsigned char)n;
    img[10] = (unsigned char)(H >> 8); img[11] = (unsigned char)H; img[14] = (unsigned char)(W >> 8); img[15] = (unsigned char)W;
    lab[2] = 8; lab[3] = 1;
    for (k = 4; k < 8; ++k) lab[k] = img[k];
    for (i = 0; i < n; ++i) {
        lab[8 + i] = (unsigned char)(i % 10);
        for (r = 0; r < 5; ++r)
            for (c = 0; c < 5; ++c) img[16 + (size_t)i * H * W + (size_t)(r0 + r) * W + (c0 + c)] = (unsigned char)(200 + i % 50);
    }
    memset(&d, 0, sizeof d);
    d.images_data = img;
    d.images_size = isz;
    d.labels_data = lab;
    d.labels_size = 8 + (size_t)n;
    if (mnistcu_dataset_load(ctx, &d, &ds) != MNISTCU_OK) ds = NULL;
    free(img);
    free(lab);
    return ds;
}

/* Sum and centroid (row, col) of an image. */
static void tk_moments(const float *p, int H, int W, double *sum, double *cr, double *cc)
{
    int r, c;
    *sum = *cr = *cc = 0.0;
    for (r = 0; r < H; ++r)
        for (c = 0; c < W; ++c) {
            *sum += p[r * W + c];
            *cr += r * (double)p[r * W + c];
            *cc += c * (double)p[r * W + c];
        }
    *cr /= *sum;
    *cc /= *sum;
}

/* No transform is the identity; a (step, slot) pair always gives the same
   image and another pair another one; a zero desc leaves every pixel. */
TEST augment_identity_and_determinism(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_dataset *ds = ctx ? tk_images(ctx, 3, 28, 28, 9, 13) : NULL;
    mnistcu_augment_desc a;
    float orig[784], p1[784], p2[784], p3[784];
    int failed = 0;
    TU_REQUIRE(ds, "dataset");
    memset(&a, 0, sizeof a);
    TU_REQUIRE(mnistcu_augment_sample(ctx, ds, &a, 1, 7, 3, p1) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
    {
        mnistcu_dataset_info info;
        int j;
        mnistcu_dataset_info_get(ds, &info);
        TU_REQUIRE(mnistcu_dataset_sample(ds, 1, orig, NULL) == MNISTCU_OK, "sample");
        for (j = 0; j < 784; ++j) orig[j] = (float)floor((orig[j] - info.shift) / info.scale + 0.5);
    }
    TU_REQUIRE(memcmp(orig, p1, sizeof orig) == 0, "a zero augmentation changed the image");
    a.rotate = 15.0f; a.scale = 0.1f; a.translate = 2.0f; a.elastic_alpha = 34.0f;
    TU_REQUIRE(mnistcu_augment_sample(ctx, ds, &a, 1, 7, 3, p1) == MNISTCU_OK &&
                   mnistcu_augment_sample(ctx, ds, &a, 1, 7, 3, p2) == MNISTCU_OK &&
                   mnistcu_augment_sample(ctx, ds, &a, 1, 8, 3, p3) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(memcmp(p1, p2, sizeof p1) == 0, "the same step and slot gave two images");
    TU_REQUIRE(memcmp(p1, p3, sizeof p1) != 0, "two steps gave the same image");
    TU_REQUIRE(mnistcu_augment_sample(ctx, ds, &a, 1, 7, 4, p3) == MNISTCU_OK && memcmp(p1, p3, sizeof p1) != 0,
               "two slots gave the same image");
done:
    mnistcu_dataset_destroy(ds);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Each transform alone does what it says, over 200 draws:
   translate t moves the centroid by at most t on each axis, both ways;
   rotate r keeps the mass and the centroid's distance from the centre and
   turns it by at most r degrees, both ways; scale s scales that distance by a
   factor in [1 - s, 1 + s]; a tiny elastic alpha is nearly the identity and
   alpha 34 is not. */
TEST augment_transforms_do_what_they_say(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_dataset *ds = ctx ? tk_images(ctx, 1, 28, 28, 5, 16) : NULL; /* off centre: a centroid at (7, 18) */
    mnistcu_augment_desc a;
    float orig[784], p[784];
    double s0, r0, c0, s, r, c, lo[3] = {1e9, 1e9, 1e9}, hi[3] = {-1e9, -1e9, -1e9}, maxdiff;
    double rad0, ang0, ctr = 13.5;
    int k, j, failed = 0;
    TU_REQUIRE(ds, "dataset");
    memset(&a, 0, sizeof a);
    TU_REQUIRE(mnistcu_augment_sample(ctx, ds, &a, 0, 0, 0, orig) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
    tk_moments(orig, 28, 28, &s0, &r0, &c0);
    rad0 = hypot(r0 - ctr, c0 - ctr);
    ang0 = atan2(r0 - ctr, c0 - ctr);
    for (k = 0; k < 200; ++k) { /* translation */
        memset(&a, 0, sizeof a);
        a.translate = 3.0f;
        TU_REQUIRE(mnistcu_augment_sample(ctx, ds, &a, 0, (uint64_t)k, 0, p) == MNISTCU_OK, "translate");
        tk_moments(p, 28, 28, &s, &r, &c);
        TU_REQUIRE(fabs(s - s0) < 1e-3 * s0, "translation changed the mass: %g -> %g", s0, s);
        lo[0] = fmin(lo[0], r - r0); hi[0] = fmax(hi[0], r - r0);
        lo[1] = fmin(lo[1], c - c0); hi[1] = fmax(hi[1], c - c0);
    }
    TU_REQUIRE(lo[0] >= -3.001 && hi[0] <= 3.001 && lo[1] >= -3.001 && hi[1] <= 3.001 && lo[0] < -2 && hi[0] > 2 &&
                   lo[1] < -2 && hi[1] > 2,
               "translation by up to 3: rows moved %g..%g, columns %g..%g", lo[0], hi[0], lo[1], hi[1]);
    lo[2] = 1e9; hi[2] = -1e9;
    for (k = 0; k < 200; ++k) { /* rotation */
        memset(&a, 0, sizeof a);
        a.rotate = 30.0f;
        TU_REQUIRE(mnistcu_augment_sample(ctx, ds, &a, 0, (uint64_t)k, 1, p) == MNISTCU_OK, "rotate");
        tk_moments(p, 28, 28, &s, &r, &c);
        TU_REQUIRE(fabs(s - s0) < 0.02 * s0 && fabs(hypot(r - ctr, c - ctr) - rad0) < 0.15,
                   "rotation: mass %g -> %g, radius %g -> %g", s0, s, rad0, hypot(r - ctr, c - ctr));
        {
            double turn = (atan2(r - ctr, c - ctr) - ang0) * 180.0 / 3.14159265358979;
            lo[2] = fmin(lo[2], turn);
            hi[2] = fmax(hi[2], turn);
        }
    }
    TU_REQUIRE(lo[2] >= -30.5 && hi[2] <= 30.5 && lo[2] < -25 && hi[2] > 25, "rotation by up to 30: turned %g..%g",
               lo[2], hi[2]);
    lo[0] = 1e9; hi[0] = -1e9;
    for (k = 0; k < 200; ++k) { /* scale */
        memset(&a, 0, sizeof a);
        a.scale = 0.2f;
        TU_REQUIRE(mnistcu_augment_sample(ctx, ds, &a, 0, (uint64_t)k, 2, p) == MNISTCU_OK, "scale");
        tk_moments(p, 28, 28, &s, &r, &c);
        lo[0] = fmin(lo[0], hypot(r - ctr, c - ctr) / rad0);
        hi[0] = fmax(hi[0], hypot(r - ctr, c - ctr) / rad0);
    }
    TU_REQUIRE(lo[0] >= 0.79 && hi[0] <= 1.21 && lo[0] < 0.85 && hi[0] > 1.15, "scale by 1 +- 0.2: distance ratio %g..%g",
               lo[0], hi[0]);
    memset(&a, 0, sizeof a);
    a.elastic_alpha = 0.01f;
    TU_REQUIRE(mnistcu_augment_sample(ctx, ds, &a, 0, 5, 0, p) == MNISTCU_OK, "elastic");
    for (maxdiff = 0, j = 0; j < 784; ++j) maxdiff = fmax(maxdiff, fabs((double)p[j] - orig[j]));
    TU_REQUIRE(maxdiff < 1.0, "elastic alpha 0.01 changed a pixel by %g", maxdiff);
    a.elastic_alpha = 34.0f;
    TU_REQUIRE(mnistcu_augment_sample(ctx, ds, &a, 0, 5, 0, p) == MNISTCU_OK, "elastic");
    for (maxdiff = 0, j = 0; j < 784; ++j) maxdiff = fmax(maxdiff, fabs((double)p[j] - orig[j]));
    TU_REQUIRE(maxdiff > 50.0, "elastic alpha 34 changed no pixel by more than %g", maxdiff);
done:
    mnistcu_dataset_destroy(ds);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Training with augmentation: reproducible (two runs, the same weights), on
   the context's device; float datasets and bad ranges are refused. */
TEST augment_in_training(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds = ctx ? tk_images(ctx, 64, 28, 28, 8, 8) : NULL, *flat = NULL;
    mnistcu_model *m1 = NULL, *m2 = NULL;
    mnistcu_train_desc td;
    float *w1 = NULL, *w2 = NULL, *w0 = NULL, x[4] = {0, 1, 2, 3};
    int32_t y[2] = {0, 1};
    size_t np;
    int failed = 0;
    TU_REQUIRE(ds && mnistcu_model_create_spec(ctx, "784-32-10", &m1) == MNISTCU_OK &&
                   mnistcu_model_create_spec(ctx, "784-32-10", &m2) == MNISTCU_OK,
               "setup");
    np = mnistcu_model_num_params(m1);
    w1 = (float *)malloc(np * sizeof(float));
    w2 = (float *)malloc(np * sizeof(float));
    w0 = (float *)malloc(np * sizeof(float));
    TU_REQUIRE(mnistcu_model_get_params(m1, w0, np) == MNISTCU_OK && mnistcu_model_set_params(m2, w0, np) == MNISTCU_OK,
               "copy");
    memset(&td, 0, sizeof td);
    td.epochs = 2;
    td.batch_size = 16;
    td.no_shuffle = 1; /* each model shuffles with its own generator */
    td.augment.rotate = 10.0f;
    td.augment.translate = 2.0f;
    td.augment.elastic_alpha = 34.0f;
    TU_REQUIRE(mnistcu_train(m1, ds, &td, NULL) == MNISTCU_OK && mnistcu_train(m2, ds, &td, NULL) == MNISTCU_OK,
               "train: %s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(mnistcu_model_get_params(m1, w1, np) == MNISTCU_OK && mnistcu_model_get_params(m2, w2, np) == MNISTCU_OK &&
                   memcmp(w1, w2, np * sizeof(float)) == 0,
               "two runs with augmentation differ");
    memset(&td.augment, 0, sizeof td.augment);
    TU_REQUIRE(mnistcu_model_set_params(m2, w0, np) == MNISTCU_OK && mnistcu_train(m2, ds, &td, NULL) == MNISTCU_OK &&
                   mnistcu_model_get_params(m2, w2, np) == MNISTCU_OK && memcmp(w1, w2, np * sizeof(float)) != 0,
               "training without augmentation gave the same weights as with it");
    td.augment.rotate = 120.0f;
    TU_REQUIRE(mnistcu_train(m1, ds, &td, NULL) == MNISTCU_ERR_INVALID_ARGUMENT, "rotate 120 accepted");
    td.augment.rotate = 10.0f;
    TU_REQUIRE(mnistcu_dataset_create(ctx, x, y, 2, 2, 2, &flat) == MNISTCU_OK, "flat dataset");
    mnistcu_model_destroy(m2);
    m2 = NULL;
    TU_REQUIRE(mnistcu_model_create_spec(ctx, "2-2", &m2) == MNISTCU_OK, "model");
    td.batch_size = 2;
    TU_REQUIRE(mnistcu_train(m2, flat, &td, NULL) == MNISTCU_ERR_INVALID_ARGUMENT, "augmentation of floats accepted");
done:
    free(w0);
    free(w1);
    free(w2);
    mnistcu_dataset_destroy(ds);
    mnistcu_dataset_destroy(flat);
    mnistcu_model_destroy(m1);
    mnistcu_model_destroy(m2);
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
    RUN_TEST(augment_identity_and_determinism);
    RUN_TEST(augment_transforms_do_what_they_say);
    RUN_TEST(augment_in_training);
}
