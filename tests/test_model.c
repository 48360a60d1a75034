/* Model tests: the MLP spec parser, model info, initialisation statistics,
   the parameter layout (checked through a forward pass recomputed here in
   double), prediction, finite-difference gradient checks and the SGD step.

   Every reference below is computed in this file, in double precision, from
   the parameters and inputs the library was given: never from the library's
   own outputs. The file includes mnistcu.h without MNISTCU_IMPLEMENTATION
   (tests/test_main.c holds it) and uses only the public API.

   Tests free what they allocate also when a check fails: checks inside a test
   jump to the cleanup at its end (TU_REQUIRE) and the failure is reported
   from there, so that valgrind and ASan stay quiet on failing runs too. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

static mnistcu_ctx *mt_ctx(void) { return tu_ctx(MNISTCU_DEVICE_AUTO, 0); }

static const char *mt_act_name(mnistcu_act a)
{
    switch (a) {
    case MNISTCU_ACT_IDENTITY: return "identity";
    case MNISTCU_ACT_SIGMOID: return "sigmoid";
    case MNISTCU_ACT_TANH: return "tanh";
    default: return "relu";
    }
}

/* A model from explicit widths, activation and initialisation. */
static mnistcu_result mt_model(mnistcu_ctx *ctx, const int *sizes, int count, mnistcu_act act, mnistcu_init init,
                               mnistcu_model **out)
{
    mnistcu_model_desc d;
    int i;
    memset(&d, 0, sizeof d);
    for (i = 0; i < count; ++i) d.sizes[i] = sizes[i];
    d.hidden_act = act;
    d.init = init;
    return mnistcu_model_create(ctx, &d, out);
}

/* ---- the double-precision reference MLP -----------------------------------
   Layout as documented: for each layer W [out][in] row-major, then b [out].
   Hidden layers apply the activation, the last layer gives logits. */
typedef struct rnet {
    int L;                                  /* dense layers */
    int sz[MNISTCU_MAX_LAYERS + 1];         /* widths, input first */
    mnistcu_act act;                        /* hidden activation */
    size_t w[MNISTCU_MAX_LAYERS];           /* offset of W of layer l */
    size_t b[MNISTCU_MAX_LAYERS];           /* offset of b of layer l */
    size_t np;                              /* parameters */
    size_t maxw;                            /* widest layer */
} rnet;

static void rnet_make(rnet *n, const int *sizes, int count, mnistcu_act act)
{
    size_t off = 0;
    int l;
    memset(n, 0, sizeof *n);
    n->L = count - 1;
    n->act = act;
    for (l = 0; l < count; ++l) {
        n->sz[l] = sizes[l];
        if ((size_t)sizes[l] > n->maxw) n->maxw = (size_t)sizes[l];
    }
    for (l = 0; l < n->L; ++l) {
        n->w[l] = off;
        off += (size_t)sizes[l + 1] * (size_t)sizes[l];
        n->b[l] = off;
        off += (size_t)sizes[l + 1];
    }
    n->np = off;
}

static double ref_act(mnistcu_act a, double z)
{
    switch (a) {
    case MNISTCU_ACT_IDENTITY: return z;
    case MNISTCU_ACT_SIGMOID: return 1.0 / (1.0 + exp(-z));
    case MNISTCU_ACT_TANH: return tanh(z);
    default: return z > 0.0 ? z : 0.0;
    }
}

static mnistcu_act ref_layer_act(const rnet *n, int l) { return l == n->L - 1 ? MNISTCU_ACT_IDENTITY : n->act; }

/* Pre-activation of unit j of layer l for one input row. */
static double ref_unit(const rnet *n, const double *p, int l, int j, const double *in)
{
    const double *w = p + n->w[l] + (size_t)j * (size_t)n->sz[l];
    double s = p[n->b[l] + (size_t)j];
    int i;
    for (i = 0; i < n->sz[l]; ++i) s += w[i] * in[i];
    return s;
}

/* out [B][sz[l+1]] = act(in [B][sz[l]] W^T + b); *zmin (if given) tracks the
   smallest |pre-activation| of the hidden layers (distance to relu's kink). */
static void ref_layer(const rnet *n, const double *p, int l, const double *in, size_t B, double *out, double *zmin)
{
    int j, I = n->sz[l], O = n->sz[l + 1];
    mnistcu_act a = ref_layer_act(n, l);
    size_t r;
    for (r = 0; r < B; ++r)
        for (j = 0; j < O; ++j) {
            double z = ref_unit(n, p, l, j, in + r * (size_t)I);
            if (zmin && l < n->L - 1 && fabs(z) < *zmin) *zmin = fabs(z);
            out[r * (size_t)O + (size_t)j] = ref_act(a, z);
        }
}

/* Mean softmax cross-entropy of logits [B][C]. */
static double ref_ce(const double *z, const int32_t *y, size_t B, int C)
{
    double total = 0.0;
    size_t r;
    int j;
    for (r = 0; r < B; ++r) {
        const double *row = z + r * (size_t)C;
        double m = row[0], s = 0.0;
        for (j = 1; j < C; ++j)
            if (row[j] > m) m = row[j];
        for (j = 0; j < C; ++j) s += exp(row[j] - m);
        total += m + log(s) - row[y[r]];
    }
    return total / (double)B;
}

/* Buffers of one reference pass: acts[0] = x, acts[l+1] = output of layer l,
   t0/t1 scratch for the finite differences. */
typedef struct rws {
    double *mem;
    double *acts[MNISTCU_MAX_LAYERS + 1];
    double *t0, *t1;
} rws;

static int rws_make(rws *w, const rnet *n, size_t B, const float *x)
{
    size_t total = B * (size_t)n->sz[0] + 2 * B * n->maxw, i;
    double *p;
    int l;
    memset(w, 0, sizeof *w);
    for (l = 0; l < n->L; ++l) total += B * (size_t)n->sz[l + 1];
    w->mem = (double *)malloc(total * sizeof(double));
    if (!w->mem) return 0;
    p = w->mem;
    w->acts[0] = p;
    for (i = 0; i < B * (size_t)n->sz[0]; ++i) p[i] = (double)x[i];
    p += B * (size_t)n->sz[0];
    for (l = 0; l < n->L; ++l) {
        w->acts[l + 1] = p;
        p += B * (size_t)n->sz[l + 1];
    }
    w->t0 = p;
    w->t1 = p + B * n->maxw;
    return 1;
}

/* Fills acts[1..L]; returns the mean loss when y is given. */
static double ref_forward(const rnet *n, const double *p, rws *w, size_t B, const int32_t *y, double *zmin)
{
    int l;
    for (l = 0; l < n->L; ++l) ref_layer(n, p, l, w->acts[l], B, w->acts[l + 1], zmin);
    return y ? ref_ce(w->acts[n->L], y, B, n->sz[n->L]) : 0.0;
}

/* The loss after a change to one parameter of unit j of layer l, given the
   unperturbed pass in w->acts: layers before l are unchanged, layer l changes
   only in column j, the layers after it are recomputed in full. */
static double ref_loss_changed(const rnet *n, const double *p, rws *w, size_t B, const int32_t *y, int l, int j)
{
    int I = n->sz[l], O = n->sz[l + 1], m;
    double *cur = w->t0, *nxt = w->t1, *tmp;
    size_t r;
    memcpy(cur, w->acts[l + 1], B * (size_t)O * sizeof(double));
    for (r = 0; r < B; ++r)
        cur[r * (size_t)O + (size_t)j] = ref_act(ref_layer_act(n, l), ref_unit(n, p, l, j, w->acts[l] + r * (size_t)I));
    for (m = l + 1; m < n->L; ++m) {
        ref_layer(n, p, m, cur, B, nxt, NULL);
        tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    return ref_ce(cur, y, B, n->sz[n->L]);
}

/* Central differences of the reference loss w.r.t. every parameter, in double. */
static void ref_fd(const rnet *n, double *p, rws *w, size_t B, const int32_t *y, double h, double *fd)
{
    int l;
    (void)ref_forward(n, p, w, B, y, NULL);
    for (l = 0; l < n->L; ++l) {
        size_t I = (size_t)n->sz[l], O = (size_t)n->sz[l + 1], k;
        for (k = 0; k < O * (I + 1); ++k) {
            size_t idx = k < O * I ? n->w[l] + k : n->b[l] + (k - O * I);
            int j = (int)(k < O * I ? k / I : k - O * I);
            double save = p[idx], xp = save + h, xm = save - h, lp, lm;
            p[idx] = xp;
            lp = ref_loss_changed(n, p, w, B, y, l, j);
            p[idx] = xm;
            lm = ref_loss_changed(n, p, w, B, y, l, j);
            p[idx] = save;
            fd[idx] = (lp - lm) / (xp - xm);
        }
    }
}

static double *mt_to_double(const float *f, size_t n)
{
    double *d = (double *)malloc((n ? n : 1) * sizeof(double));
    size_t i;
    if (d)
        for (i = 0; i < n; ++i) d[i] = (double)f[i];
    return d;
}

/* ========================================================================== */
/*                                model_suite                                 */
/* ========================================================================== */

typedef struct mt_spec {
    const char *spec;
    int count;
    int sizes[MNISTCU_MAX_LAYERS + 1];
} mt_spec;

TEST mlp_spec_valid(void)
{
    static const mt_spec specs[] = {
        {"784-128-10", 3, {784, 128, 10}},
        {"2-2", 2, {2, 2}},
        {"1-3", 2, {1, 3}},
        {"784-256-128-10", 4, {784, 256, 128, 10}},
        {"5-256", 2, {5, 256}}, /* MNISTCU_MAX_CLASSES classes */
        /* 17 numbers: MNISTCU_MAX_LAYERS layers, the most allowed */
        {"3-4-5-6-7-8-9-3-4-5-6-7-8-9-3-4-2", 17, {3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7, 8, 9, 3, 4, 2}},
    };
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_info info;
    mnistcu_result r;
    size_t s, expect;
    int failed = 0, l;
    TU_REQUIRE(ctx != NULL, "no context");
    for (s = 0; s < sizeof specs / sizeof specs[0]; ++s) {
        const mt_spec *t = &specs[s];
        m = NULL;
        r = mnistcu_model_create_mlp(ctx, t->spec, &m);
        TU_REQUIRE(r == MNISTCU_OK && m != NULL, "\"%s\": %s (%s)", t->spec, mnistcu_result_name(r),
                   mnistcu_ctx_error(ctx));
        expect = 0;
        for (l = 0; l + 1 < t->count; ++l) expect += (size_t)t->sizes[l + 1] * ((size_t)t->sizes[l] + 1);
        TU_REQUIRE(mnistcu_model_num_params(m) == expect, "\"%s\": num_params %lu, expected %lu", t->spec,
                   (unsigned long)mnistcu_model_num_params(m), (unsigned long)expect);
        mnistcu_model_info_get(m, &info);
        TU_REQUIRE(info.num_layers == t->count - 1, "\"%s\": num_layers %d", t->spec, info.num_layers);
        for (l = 0; l < t->count; ++l)
            TU_REQUIRE(info.sizes[l] == t->sizes[l], "\"%s\": sizes[%d] = %d", t->spec, l, info.sizes[l]);
        if (t->count <= MNISTCU_MAX_LAYERS)
            TU_REQUIRE(info.sizes[t->count] == 0, "\"%s\": sizes not zero-terminated", t->spec);
        TU_REQUIRE(info.num_params == expect, "\"%s\": info.num_params %lu", t->spec, (unsigned long)info.num_params);
        TU_REQUIRE(info.inputs == (size_t)t->sizes[0], "\"%s\": inputs %lu", t->spec, (unsigned long)info.inputs);
        TU_REQUIRE(info.classes == (size_t)t->sizes[t->count - 1], "\"%s\": classes %lu", t->spec,
                   (unsigned long)info.classes);
        TU_REQUIRE(info.hidden_act == MNISTCU_ACT_RELU, "\"%s\": hidden_act %d, expected RELU", t->spec,
                   (int)info.hidden_act);
        TU_REQUIRE(info.device == mnistcu_ctx_device(ctx), "\"%s\": device %d", t->spec, (int)info.device);
        mnistcu_model_destroy(m);
        m = NULL;
    }
done:
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

TEST mlp_spec_invalid(void)
{
    static const char *const bad[] = {
        "", "784", "784-", "-10", "784--10", "784-x-10", "784-0-10", "0-10", "10-1", "784-1", "784-257",
        "16777217-10", "784-16777217-10", "99999999999999999999999999-10", " 784-10", "784-10 ", "+784-10",
        "784-10-", "784 -10", "784-10x", "784.5-10", "-",
        /* 18 numbers: one more than MNISTCU_MAX_LAYERS + 1 */
        "2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2",
    };
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    mnistcu_result r;
    size_t s;
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    for (s = 0; s < sizeof bad / sizeof bad[0]; ++s) {
        mnistcu_ctx_clear_error(ctx);
        m = (mnistcu_model *)&s; /* a non-NULL sentinel that the call must overwrite */
        r = mnistcu_model_create_mlp(ctx, bad[s], &m);
        TU_REQUIRE(r == MNISTCU_ERR_INVALID_ARGUMENT || r == MNISTCU_ERR_OVERFLOW, "\"%s\" gave %s", bad[s],
                   mnistcu_result_name(r));
        TU_REQUIRE(m == NULL, "\"%s\": *out not NULL after an error", bad[s]);
        TU_REQUIRE(mnistcu_ctx_error(ctx) != NULL && mnistcu_ctx_error(ctx)[0] != '\0', "\"%s\": empty error message",
                   bad[s]);
    }
    m = NULL;
    /* NULL arguments */
    r = mnistcu_model_create_mlp(ctx, NULL, &m);
    TU_REQUIRE(r == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "NULL spec gave %s", mnistcu_result_name(r));
    r = mnistcu_model_create_mlp(ctx, "784-10", NULL);
    TU_REQUIRE(r == MNISTCU_ERR_INVALID_ARGUMENT, "NULL out gave %s", mnistcu_result_name(r));
    /* the context stays usable */
    r = mnistcu_model_create_mlp(ctx, "4-3", &m);
    TU_REQUIRE(r == MNISTCU_OK && m != NULL, "context unusable after errors: %s", mnistcu_result_name(r));
done:
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

TEST model_create_desc_info(void)
{
    static const int sizes[] = {5, 4, 3};
    static const mnistcu_act acts[] = {MNISTCU_ACT_DEFAULT, MNISTCU_ACT_RELU, MNISTCU_ACT_IDENTITY, MNISTCU_ACT_SIGMOID,
                                       MNISTCU_ACT_TANH};
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_info info;
    mnistcu_model_desc d;
    mnistcu_result r;
    size_t a;
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    for (a = 0; a < sizeof acts / sizeof acts[0]; ++a) {
        mnistcu_act want = acts[a] == MNISTCU_ACT_DEFAULT ? MNISTCU_ACT_RELU : acts[a];
        r = mt_model(ctx, sizes, 3, acts[a], MNISTCU_INIT_DEFAULT, &m);
        TU_REQUIRE(r == MNISTCU_OK, "create: %s", mnistcu_result_name(r));
        mnistcu_model_info_get(m, &info);
        TU_REQUIRE(info.num_layers == 2 && info.sizes[0] == 5 && info.sizes[1] == 4 && info.sizes[2] == 3 &&
                       info.sizes[3] == 0,
                   "info sizes");
        TU_REQUIRE(info.num_params == 4 * 6 + 3 * 5, "info.num_params %lu", (unsigned long)info.num_params);
        TU_REQUIRE(info.inputs == 5 && info.classes == 3, "inputs %lu classes %lu", (unsigned long)info.inputs,
                   (unsigned long)info.classes);
        TU_REQUIRE(info.hidden_act == want, "hidden_act %d, expected %d", (int)info.hidden_act, (int)want);
        TU_REQUIRE(info.device == mnistcu_ctx_device(ctx), "device");
        mnistcu_model_destroy(m);
        m = NULL;
    }
    /* out-of-range enums and a desc without an output width */
    memset(&d, 0, sizeof d);
    d.sizes[0] = 5;
    d.sizes[1] = 3;
    d.hidden_act = (mnistcu_act)(MNISTCU_ACT_TANH + 1);
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "bad hidden_act");
    d.hidden_act = MNISTCU_ACT_DEFAULT;
    d.init = (mnistcu_init)(MNISTCU_INIT_HE_NORMAL + 1);
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "bad init");
    d.init = MNISTCU_INIT_DEFAULT;
    d.sizes[1] = 0;
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "one width");
    d.sizes[1] = -3;
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "negative width");
    /* NULL model: zeroed info, 0 parameters */
    memset(&info, 0xAB, sizeof info);
    mnistcu_model_info_get(NULL, &info);
    TU_REQUIRE(info.num_layers == 0 && info.num_params == 0, "info of NULL not zeroed");
    TU_REQUIRE(mnistcu_model_num_params(NULL) == 0, "num_params(NULL)");
done:
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Statistics of values p[0..n): all within +-bound (float rounding of the
   bound allowed), mean and variance, largest |value|. */
typedef struct mt_stats {
    double mean, var, maxabs;
    size_t outside;
} mt_stats;

static void mt_stats_of(const float *p, size_t n, double bound, mt_stats *s)
{
    double sum = 0.0, sq = 0.0;
    size_t i;
    memset(s, 0, sizeof *s);
    for (i = 0; i < n; ++i) {
        double v = (double)p[i];
        sum += v;
        if (fabs(v) > s->maxabs) s->maxabs = fabs(v);
        if (!(fabs(v) <= bound * (1.0 + 1e-6))) s->outside++;
    }
    s->mean = sum / (double)n;
    for (i = 0; i < n; ++i) sq += ((double)p[i] - s->mean) * ((double)p[i] - s->mean);
    s->var = sq / (double)n;
}

/* Uniform(-b, b): mean 0 with deviation b/sqrt(3n) (checked to 6 deviations);
   variance b^2/3 with a relative deviation of sqrt(0.8/n): 1.4e-3 for the
   401408 weights of a 784-512 layer, 1.3e-2 for 5120 (checked to 1%, so only
   on the big layers: check_var). */
static int mt_check_uniform(const char *what, const float *p, size_t n, double bound, int check_var, int line)
{
    mt_stats s;
    mt_stats_of(p, n, bound, &s);
    if (s.outside) {
        tu_setf(line, "%s: %lu of %lu values outside +-%.9g (max |v| %.9g)", what, (unsigned long)s.outside,
                (unsigned long)n, bound, s.maxabs);
        return 0;
    }
    /* n uniform draws all stay below (1 - 30/n) * bound with probability
       about e^-30: a bound off by 0.01% fails on a 784-512 layer */
    if (s.maxabs < (1.0 - 30.0 / (double)n) * bound) {
        tu_setf(line, "%s: max |v| %.9g covers too little of +-%.9g", what, s.maxabs, bound);
        return 0;
    }
    if (check_var) {
        double mean_tol = 6.0 * bound / sqrt(3.0 * (double)n), var_ref = bound * bound / 3.0;
        if (fabs(s.mean) > mean_tol) {
            tu_setf(line, "%s: mean %.6g, |mean| should be below %.3g", what, s.mean, mean_tol);
            return 0;
        }
        if (fabs(s.var - var_ref) > 0.01 * var_ref) {
            tu_setf(line, "%s: variance %.6g, expected %.6g (bound^2/3) within 1%%", what, s.var, var_ref);
            return 0;
        }
    }
    return 1;
}

TEST init_torch_statistics(void)
{
    static const int sizes[] = {784, 512, 10};
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL, *m2 = NULL;
    float *p = NULL, *p2 = NULL;
    size_t np = 0, w1 = 784 * 512, b1 = w1 + 512, w2 = b1 + 512 * 10; /* ends of W1, b1, W2 */
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    /* the default (create_mlp, zeroed desc) is TORCH */
    TU_REQUIRE(mnistcu_model_create_mlp(ctx, "784-512-10", &m) == MNISTCU_OK, "create");
    TU_REQUIRE(mt_model(ctx, sizes, 3, MNISTCU_ACT_DEFAULT, MNISTCU_INIT_TORCH, &m2) == MNISTCU_OK, "create torch");
    np = mnistcu_model_num_params(m);
    TU_REQUIRE(np == w2 + 10, "num_params %lu", (unsigned long)np);
    p = (float *)malloc(np * sizeof(float));
    p2 = (float *)malloc(np * sizeof(float));
    TU_REQUIRE(p && p2, "malloc");
    TU_REQUIRE(mnistcu_model_get_params(m, p, np) == MNISTCU_OK, "get_params");
    TU_REQUIRE(mnistcu_model_get_params(m2, p2, np) == MNISTCU_OK, "get_params");
    if (!mt_check_uniform("W1", p, w1, 1.0 / sqrt(784.0), 1, __LINE__) ||
        !mt_check_uniform("b1", p + w1, 512, 1.0 / sqrt(784.0), 0, __LINE__) ||
        !mt_check_uniform("W2", p + b1, 5120, 1.0 / sqrt(512.0), 0, __LINE__) ||
        !mt_check_uniform("explicit TORCH: W1", p2, w1, 1.0 / sqrt(784.0), 1, __LINE__)) {
        failed = 1;
        goto done;
    }
    {
        mt_stats s;
        mt_stats_of(p + w2, 10, 1.0 / sqrt(512.0), &s);
        TU_REQUIRE(s.outside == 0 && s.maxabs > 0.0, "b2: %lu outside +-1/sqrt(512), max %.6g",
                   (unsigned long)s.outside, s.maxabs);
    }
done:
    free(p);
    free(p2);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

TEST init_he_uniform(void)
{
    static const int sizes[] = {784, 512, 10};
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    float *p = NULL;
    size_t np = 0, i, w1 = 784 * 512, b1 = w1 + 512, w2 = b1 + 512 * 10; /* ends of W1, b1, W2 */
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(mt_model(ctx, sizes, 3, MNISTCU_ACT_RELU, MNISTCU_INIT_HE_UNIFORM, &m) == MNISTCU_OK, "create");
    np = mnistcu_model_num_params(m);
    p = (float *)malloc(np * sizeof(float));
    TU_REQUIRE(p != NULL, "malloc");
    TU_REQUIRE(mnistcu_model_get_params(m, p, np) == MNISTCU_OK, "get_params");
    if (!mt_check_uniform("He W1", p, w1, sqrt(6.0 / 784.0), 1, __LINE__) ||
        !mt_check_uniform("He W2", p + b1, 5120, sqrt(6.0 / 512.0), 0, __LINE__)) {
        failed = 1;
        goto done;
    }
    for (i = 0; i < 512; ++i) TU_REQUIRE(p[w1 + i] == 0.0f, "He b1[%lu] = %.9g, not 0", (unsigned long)i, (double)p[w1 + i]);
    for (i = 0; i < 10; ++i) TU_REQUIRE(p[w2 + i] == 0.0f, "He b2[%lu] = %.9g, not 0", (unsigned long)i, (double)p[w2 + i]);
done:
    free(p);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Mean and standard deviation of n floats, in double. */
static void mt_moments(const float *p, size_t n, double *mean, double *sd)
{
    double s1 = 0.0, s2 = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) s1 += p[i];
    *mean = s1 / (double)n;
    for (i = 0; i < n; ++i) s2 += ((double)p[i] - *mean) * ((double)p[i] - *mean);
    *sd = sqrt(s2 / (double)n);
}

/* Xavier and He, uniform and normal, with fan-out and a gain, per model and per layer (desc and spec):
   the weights' spread as PyTorch's torch.nn.init functions define it, biases zero. */
TEST init_schemes_match_torch_nn_init(void)
{
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    float *w = NULL, *b = NULL;
    double mean, sd, want, fi, fo;
    int k, failed = 0;
    char spec[256];
    TU_REQUIRE(ctx != NULL, "no context");
    w = (float *)malloc(64 * 3 * 5 * 5 * 40 * sizeof(float));
    b = (float *)malloc(64 * sizeof(float));
    TU_REQUIRE(w && b, "malloc");
    for (k = 0; k < 8; ++k) {
        /* a conv layer: fan_in = 40*5*5 = 1000, fan_out = 64*25 = 1600 */
        static const mnistcu_init kinds[8] = {MNISTCU_INIT_XAVIER_UNIFORM, MNISTCU_INIT_XAVIER_NORMAL,
                                              MNISTCU_INIT_HE_UNIFORM,     MNISTCU_INIT_HE_NORMAL,
                                              MNISTCU_INIT_HE_NORMAL,      MNISTCU_INIT_XAVIER_UNIFORM,
                                              MNISTCU_INIT_HE_UNIFORM,     MNISTCU_INIT_TORCH};
        memset(&d, 0, sizeof d);
        d.input_c = 40; d.input_h = 9; d.input_w = 9;
        d.layers[0].kind = MNISTCU_LAYER_CONV2D;
        d.layers[0].units = 64; d.layers[0].kernel_h = 5;
        d.layers[1].kind = MNISTCU_LAYER_FLATTEN;
        d.layers[2].kind = MNISTCU_LAYER_DENSE; d.layers[2].units = 10;
        d.init = kinds[k];
        if (k == 4) d.init_fan_out = 1;               /* He by fan_out */
        if (k == 5) d.init_gain = 5.0f / 3.0f;        /* Xavier with tanh's gain */
        if (k == 6) { d.init = MNISTCU_INIT_TORCH; d.layers[0].init = MNISTCU_INIT_HE_UNIFORM; } /* per layer */
        if (k == 7) d.zero_bias = 1;
        TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "case %d: create: %s", k, mnistcu_ctx_error(ctx));
        TU_REQUIRE(mnistcu_model_get_tensor(m, "0.weight", w, 64000) == MNISTCU_OK, "case %d: weight", k);
        TU_REQUIRE(mnistcu_model_get_tensor(m, "0.bias", b, 64) == MNISTCU_OK, "case %d: bias", k);
        fi = 1000.0; fo = 1600.0;
        mt_moments(w, 64000, &mean, &sd);
        switch (k) {
        case 0: want = sqrt(2.0 / (fi + fo)); break;               /* bound sqrt(6/(fi+fo)) -> sd bound/sqrt(3) */
        case 1: want = sqrt(2.0 / (fi + fo)); break;
        case 2: case 6: want = sqrt(2.0) / sqrt(fi); break;
        case 3: want = sqrt(2.0) / sqrt(fi); break;
        case 4: want = sqrt(2.0) / sqrt(fo); break;
        case 5: want = 5.0 / 3.0 * sqrt(2.0 / (fi + fo)); break;
        default: want = 1.0 / sqrt(fi) / sqrt(3.0); break;          /* PyTorch's default, +-1/sqrt(fan_in) */
        }
        TU_REQUIRE(fabs(mean) < 0.05 * want, "case %d: weight mean %.3g (sd %.3g)", k, mean, want);
        TU_REQUIRE(fabs(sd / want - 1.0) < 0.03, "case %d: weight sd %.5g, want %.5g", k, sd, want);
        if (kinds[k] == MNISTCU_INIT_XAVIER_UNIFORM || kinds[k] == MNISTCU_INIT_HE_UNIFORM || k >= 6) {
            double bound = want * sqrt(3.0) * (1.0 + 1e-6);
            size_t i;
            for (i = 0; i < 64000; ++i) TU_REQUIRE(fabs(w[i]) <= bound, "case %d: w[%lu] = %g beyond %g", k, (unsigned long)i, w[i], bound);
        }
        {
            size_t i;
            /* zero biases for every scheme but TORCH, and for TORCH with zero_bias (case 7);
               case 6 (TORCH with an HE_UNIFORM layer) draws them as version 0.1's He did: zero */
            int all0 = 1;
            for (i = 0; i < 64; ++i) all0 &= b[i] == 0.0f;
            TU_REQUIRE(all0, "case %d: biases not zero", k);
        }
        mnistcu_model_destroy(m);
        m = NULL;
    }
    /* the spec option, printed back */
    TU_REQUIRE(mnistcu_model_create_spec(ctx, "1x8x8 conv3x3x4:init=xavier_normal flatten dense10:init=he", &m) == MNISTCU_OK,
               "spec: %s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(mnistcu_model_spec(m, spec, sizeof spec) == MNISTCU_OK &&
                   strcmp(spec, "1x8x8 conv3x3x4:init=xavier_normal flatten dense10:init=he") == 0,
               "spec printed back as \"%s\"", spec);
    mnistcu_model_destroy(m);
    m = NULL;
    TU_REQUIRE(mnistcu_model_create_spec(ctx, "10 dense5:init=glorot", &m) == MNISTCU_ERR_INVALID_ARGUMENT, "bad init name");
    TU_REQUIRE(mnistcu_model_create_spec(ctx, "10 relu:init=he dense5", &m) == MNISTCU_ERR_INVALID_ARGUMENT, "init on relu");
done:
    free(w);
    free(b);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

TEST init_seed_determinism(void)
{
    mnistcu_ctx *a = mt_ctx(), *b = mt_ctx(), *c = NULL;
    mnistcu_ctx_desc d;
    mnistcu_model *ma = NULL, *mb = NULL, *mc = NULL;
    float *pa = NULL, *pb = NULL, *pc = NULL;
    size_t np = 0, i, same = 0;
    int failed = 0;
    memset(&d, 0, sizeof d);
    d.device = MNISTCU_DEVICE_AUTO;
    d.log_level = MNISTCU_LOG_SILENT;
    d.seed = 99;
    TU_REQUIRE(a && b, "no context");
    TU_REQUIRE(mnistcu_ctx_create(&c, &d) == MNISTCU_OK, "ctx with seed 99");
    TU_REQUIRE(mnistcu_model_create_mlp(a, "20-16-10", &ma) == MNISTCU_OK, "create a");
    TU_REQUIRE(mnistcu_model_create_mlp(b, "20-16-10", &mb) == MNISTCU_OK, "create b");
    TU_REQUIRE(mnistcu_model_create_mlp(c, "20-16-10", &mc) == MNISTCU_OK, "create c");
    np = mnistcu_model_num_params(ma);
    pa = (float *)malloc(np * sizeof(float));
    pb = (float *)malloc(np * sizeof(float));
    pc = (float *)malloc(np * sizeof(float));
    TU_REQUIRE(pa && pb && pc, "malloc");
    TU_REQUIRE(mnistcu_model_get_params(ma, pa, np) == MNISTCU_OK && mnistcu_model_get_params(mb, pb, np) == MNISTCU_OK &&
                   mnistcu_model_get_params(mc, pc, np) == MNISTCU_OK,
               "get_params");
    TU_REQUIRE(memcmp(pa, pb, np * sizeof(float)) == 0, "same seed (1234) gave different initial parameters");
    for (i = 0; i < np; ++i) same += pa[i] == pc[i];
    TU_REQUIRE(same < np / 10, "seeds 1234 and 99 share %lu of %lu initial parameters", (unsigned long)same,
               (unsigned long)np);
done:
    free(pa);
    free(pb);
    free(pc);
    mnistcu_ctx_destroy(a);
    mnistcu_ctx_destroy(b);
    mnistcu_ctx_destroy(c);
    TU_END();
}

/* set_params / get_params round trip, and the documented layout: logits of
   mnistcu_model_forward against a double forward pass from the same params. */
static int mt_forward_case(const int *sizes, int count, mnistcu_act act, size_t B, uint64_t seed, int line)
{
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    rnet n;
    rws w;
    float *p = NULL, *back = NULL, *x = NULL, *logits = NULL;
    double *pd = NULL, *ref = NULL, maxerr = 0.0;
    tu_rng rng = tu_rng_make(seed);
    size_t i, C;
    int ok = 0, l;
    memset(&w, 0, sizeof w);
    rnet_make(&n, sizes, count, act);
    C = (size_t)sizes[count - 1];
    if (!ctx || mt_model(ctx, sizes, count, act, MNISTCU_INIT_DEFAULT, &m) != MNISTCU_OK) {
        tu_setf(line, "create (%s)", mt_act_name(act));
        goto done;
    }
    if (mnistcu_model_num_params(m) != n.np) {
        tu_setf(line, "num_params %lu, expected %lu", (unsigned long)mnistcu_model_num_params(m), (unsigned long)n.np);
        goto done;
    }
    /* known values, different from the library's initialisation: weights
       +-1.2/sqrt(in), biases in [-0.5, 0.5] */
    p = (float *)malloc(n.np * sizeof(float));
    back = (float *)malloc(n.np * sizeof(float));
    x = tu_random_floats(&rng, B * (size_t)sizes[0], -1.0f, 1.0f);
    logits = (float *)malloc(B * C * sizeof(float));
    ref = (double *)malloc(B * C * sizeof(double));
    if (!p || !back || !x || !logits || !ref) goto done;
    for (l = 0; l < n.L; ++l) {
        double bw = 1.2 / sqrt((double)sizes[l]);
        for (i = n.w[l]; i < n.b[l]; ++i) p[i] = (float)tu_uniform(&rng, -bw, bw);
        for (i = n.b[l]; i < n.b[l] + (size_t)sizes[l + 1]; ++i) p[i] = (float)tu_uniform(&rng, -0.5, 0.5);
    }
    if (mnistcu_model_set_params(m, p, n.np) != MNISTCU_OK || mnistcu_model_get_params(m, back, n.np) != MNISTCU_OK) {
        tu_setf(line, "set/get params failed: %s", mnistcu_ctx_error(ctx));
        goto done;
    }
    if (memcmp(p, back, n.np * sizeof(float)) != 0) {
        tu_setf(line, "get_params after set_params differs");
        goto done;
    }
    if (mnistcu_model_forward(m, x, B, logits) != MNISTCU_OK) {
        tu_setf(line, "forward: %s", mnistcu_ctx_error(ctx));
        goto done;
    }
    pd = mt_to_double(p, n.np);
    if (!pd || !rws_make(&w, &n, B, x)) goto done;
    (void)ref_forward(&n, pd, &w, B, NULL, NULL);
    for (i = 0; i < B * C; ++i) ref[i] = w.acts[n.L][i];
    for (i = 0; i < B * C; ++i)
        if (fabs((double)logits[i] - ref[i]) > maxerr) maxerr = fabs((double)logits[i] - ref[i]);
    if (GREATEST_IS_VERBOSE())
        printf("  forward %-8s %d layers, in %d: max |logit - double| %.3g\n", mt_act_name(act), n.L, sizes[0], maxerr);
    for (i = 0; i < B * C; ++i) {
        /* float forward vs double: measured max |err| 3.2e-7 (784 inputs), 8e-8 (13) on logits up to ~3 */
        if (!(fabs((double)logits[i] - ref[i]) <= 2e-6 + 2e-6 * fabs(ref[i]))) {
            tu_setf(line, "%s: logit [%lu][%lu] = %.9g, double reference %.9g", mt_act_name(act),
                    (unsigned long)(i / C), (unsigned long)(i % C), (double)logits[i], ref[i]);
            goto done;
        }
    }
    ok = 1;
done:
    if (!ok && tu_msg[0] == '\0') tu_setf(line, "out of memory");
    free(p);
    free(back);
    free(x);
    free(logits);
    free(ref);
    free(pd);
    free(w.mem);
    mnistcu_ctx_destroy(ctx);
    return ok;
}

TEST forward_matches_reference(mnistcu_act act)
{
    static const int small[] = {13, 11, 7, 5};
    static const int wide[] = {784, 64, 10}; /* K above the CPU product's 256 block */
    int failed = 0;
    tu_msg[0] = '\0';
    TU_REQUIRE_OK(mt_forward_case(small, 4, act, 9, 11 + (uint64_t)act, __LINE__));
    tu_msg[0] = '\0';
    TU_REQUIRE_OK(mt_forward_case(wide, 3, act, 3, 21 + (uint64_t)act, __LINE__));
done:
    TU_END();
}

TEST params_wrong_count(void)
{
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    float *buf = NULL, *before = NULL, *after = NULL;
    size_t np = 0, i;
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(mnistcu_model_create_mlp(ctx, "7-5-3", &m) == MNISTCU_OK, "create");
    np = mnistcu_model_num_params(m);
    buf = (float *)malloc((np + 1) * sizeof(float));
    before = (float *)malloc(np * sizeof(float));
    after = (float *)malloc(np * sizeof(float));
    TU_REQUIRE(buf && before && after, "malloc");
    for (i = 0; i <= np; ++i) buf[i] = 7.0f;
    TU_REQUIRE(mnistcu_model_get_params(m, before, np) == MNISTCU_OK, "get_params");
    TU_REQUIRE(mnistcu_model_get_params(m, buf, np - 1) == MNISTCU_ERR_SHAPE, "get_params(np-1)");
    TU_REQUIRE(mnistcu_model_get_params(m, buf, np + 1) == MNISTCU_ERR_SHAPE, "get_params(np+1)");
    TU_REQUIRE(mnistcu_model_get_params(m, buf, 0) == MNISTCU_ERR_SHAPE, "get_params(0)");
    TU_REQUIRE(mnistcu_model_set_params(m, buf, np - 1) == MNISTCU_ERR_SHAPE, "set_params(np-1)");
    TU_REQUIRE(mnistcu_model_set_params(m, buf, np + 1) == MNISTCU_ERR_SHAPE, "set_params(np+1)");
    TU_REQUIRE(mnistcu_model_get_grads(m, buf, np - 1) == MNISTCU_ERR_SHAPE, "get_grads(np-1)");
    TU_REQUIRE(mnistcu_model_get_grads(m, buf, np + 1) == MNISTCU_ERR_SHAPE, "get_grads(np+1)");
    TU_REQUIRE(mnistcu_ctx_error(ctx)[0] != '\0', "no error message");
    TU_REQUIRE(mnistcu_model_get_params(m, NULL, np) == MNISTCU_ERR_INVALID_ARGUMENT, "get_params(NULL)");
    TU_REQUIRE(mnistcu_model_set_params(m, NULL, np) == MNISTCU_ERR_INVALID_ARGUMENT, "set_params(NULL)");
    TU_REQUIRE(mnistcu_model_get_params(m, after, np) == MNISTCU_OK, "get_params");
    TU_REQUIRE(memcmp(before, after, np * sizeof(float)) == 0, "a refused set_params changed the parameters");
    for (i = 0; i <= np; ++i) TU_REQUIRE(buf[i] == 7.0f, "a refused get wrote element %lu", (unsigned long)i);
    /* gradients of a fresh model are zero */
    TU_REQUIRE(mnistcu_model_get_grads(m, after, np) == MNISTCU_OK, "get_grads");
    for (i = 0; i < np; ++i) TU_REQUIRE(after[i] == 0.0f, "fresh gradient %lu = %g", (unsigned long)i, (double)after[i]);
done:
    free(buf);
    free(before);
    free(after);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

TEST predict_probabilities(void)
{
    static const int sizes[] = {20, 16, 10};
    enum { N = 37, C = 10 };
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    tu_rng rng = tu_rng_make(77);
    float *x = NULL, *logits = NULL, *probs = NULL, *p = NULL;
    double *pd = NULL;
    int32_t labels[N], labels2[N];
    rnet n;
    rws w;
    size_t i, j, np;
    int failed = 0;
    memset(&w, 0, sizeof w);
    rnet_make(&n, sizes, 3, MNISTCU_ACT_RELU);
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(mt_model(ctx, sizes, 3, MNISTCU_ACT_RELU, MNISTCU_INIT_DEFAULT, &m) == MNISTCU_OK, "create");
    np = mnistcu_model_num_params(m);
    /* larger weights than the initialisation, so the probabilities spread out */
    p = tu_random_floats(&rng, np, -1.0f, 1.0f);
    x = tu_random_floats(&rng, (size_t)N * 20, -1.0f, 1.0f);
    logits = (float *)malloc((size_t)N * C * sizeof(float));
    probs = (float *)malloc((size_t)N * C * sizeof(float));
    pd = mt_to_double(p, np);
    TU_REQUIRE(p && x && logits && probs && pd && rws_make(&w, &n, N, x), "malloc");
    TU_REQUIRE(mnistcu_model_set_params(m, p, np) == MNISTCU_OK, "set_params");
    TU_REQUIRE(mnistcu_model_forward(m, x, N, logits) == MNISTCU_OK, "forward");
    for (i = 0; i < N; ++i) labels[i] = labels2[i] = -1;
    TU_REQUIRE(mnistcu_predict(m, x, N, labels, probs) == MNISTCU_OK, "predict: %s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(mnistcu_predict(m, x, N, labels2, NULL) == MNISTCU_OK, "predict (labels only)");
    (void)ref_forward(&n, pd, &w, N, NULL, NULL);
    for (i = 0; i < N; ++i) {
        const double *z = w.acts[2] + i * C;
        double sum = 0.0, mx = z[0], se = 0.0;
        size_t arg = 0;
        for (j = 0; j < C; ++j) sum += (double)probs[i * C + j];
        TU_REQUIRE(fabs(sum - 1.0) <= 1e-5, "row %lu: probabilities sum to %.9g", (unsigned long)i, sum);
        for (j = 1; j < C; ++j)
            if (logits[i * C + j] > logits[i * C + arg]) arg = j;
        TU_REQUIRE(labels[i] == (int32_t)arg, "row %lu: label %d, arg-max of the logits %lu", (unsigned long)i,
                   (int)labels[i], (unsigned long)arg);
        TU_REQUIRE(labels2[i] == labels[i], "row %lu: labels-only predict gave %d, not %d", (unsigned long)i,
                   (int)labels2[i], (int)labels[i]);
        for (j = 1; j < C; ++j)
            if (z[j] > mx) mx = z[j];
        for (j = 0; j < C; ++j) se += exp(z[j] - mx);
        for (j = 0; j < C; ++j) {
            double ref = exp(z[j] - mx) / se;
            TU_REQUIRE(fabs((double)probs[i * C + j] - ref) <= 1e-6 + 1e-5 * ref,
                       "prob [%lu][%lu] = %.9g, double softmax %.9g", (unsigned long)i, (unsigned long)j,
                       (double)probs[i * C + j], ref);
        }
    }
done:
    free(x);
    free(logits);
    free(probs);
    free(p);
    free(pd);
    free(w.mem);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

TEST predict_u8_untrained(void)
{
    static const int sizes[] = {784, 32, 10};
    enum { N = 5, C = 10, IN = 784 };
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    tu_rng rng = tu_rng_make(5);
    uint8_t *pix = NULL;
    float *x = NULL, *p1 = NULL, *p2 = NULL, *p = NULL;
    double *pd = NULL;
    int32_t l1[N], l2[N];
    rnet n;
    rws w;
    size_t i, j, np;
    int failed = 0;
    memset(&w, 0, sizeof w);
    rnet_make(&n, sizes, 3, MNISTCU_ACT_RELU);
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(mnistcu_model_create_mlp(ctx, "784-32-10", &m) == MNISTCU_OK, "create");
    np = mnistcu_model_num_params(m);
    pix = (uint8_t *)malloc((size_t)N * IN);
    x = (float *)malloc((size_t)N * IN * sizeof(float));
    p1 = (float *)malloc((size_t)N * C * sizeof(float));
    p2 = (float *)malloc((size_t)N * C * sizeof(float));
    p = (float *)malloc(np * sizeof(float));
    TU_REQUIRE(pix && x && p1 && p2 && p, "malloc");
    for (i = 0; i < (size_t)N * IN; ++i) {
        pix[i] = (uint8_t)(tu_next(&rng) & 0xFF);
        x[i] = (float)pix[i] / 255.0f;
    }
    TU_REQUIRE(mnistcu_model_get_params(m, p, np) == MNISTCU_OK, "get_params");
    pd = mt_to_double(p, np);
    TU_REQUIRE(pd && rws_make(&w, &n, N, x), "malloc");
    for (i = 0; i < (size_t)N * IN; ++i) w.acts[0][i] = (double)pix[i] / 255.0; /* exact pixels / 255 */
    TU_REQUIRE(mnistcu_predict(m, x, N, l1, p1) == MNISTCU_OK, "predict");
    TU_REQUIRE(mnistcu_predict_u8(m, pix, N, l2, p2) == MNISTCU_OK, "predict_u8: %s", mnistcu_ctx_error(ctx));
    (void)ref_forward(&n, pd, &w, N, NULL, NULL);
    for (i = 0; i < N; ++i) {
        const double *z = w.acts[2] + i * C;
        double mx = z[0], se = 0.0;
        TU_REQUIRE(l1[i] == l2[i], "sample %lu: predict_u8 label %d, predict on pixels/255 %d", (unsigned long)i,
                   (int)l2[i], (int)l1[i]);
        for (j = 1; j < C; ++j)
            if (z[j] > mx) mx = z[j];
        for (j = 0; j < C; ++j) se += exp(z[j] - mx);
        for (j = 0; j < C; ++j) {
            double ref = exp(z[j] - mx) / se;
            TU_REQUIRE(fabs((double)p2[i * C + j] - (double)p1[i * C + j]) <= 1e-6 + 1e-5 * fabs((double)p1[i * C + j]),
                       "prob [%lu][%lu]: predict_u8 %.9g, predict on pixels/255 %.9g", (unsigned long)i,
                       (unsigned long)j, (double)p2[i * C + j], (double)p1[i * C + j]);
            TU_REQUIRE(fabs((double)p2[i * C + j] - ref) <= 1e-6 + 1e-5 * ref,
                       "prob [%lu][%lu]: predict_u8 %.9g, double reference %.9g", (unsigned long)i, (unsigned long)j,
                       (double)p2[i * C + j], ref);
        }
    }
done:
    free(pix);
    free(x);
    free(p1);
    free(p2);
    free(p);
    free(pd);
    free(w.mem);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* The library's CUDA kernels, read from the header's text (the tests run from the
   repository's root): every kernel's body begins with MNISTCU__PDL_WAIT() (>>cuda_pdl:
   launched as a dependent, a kernel that read or wrote memory before it would race
   with the kernel before), and every launch goes through mnistcu__launch. */
TEST every_cuda_kernel_waits_first(void)
{
    FILE *f = fopen("mnistcu.h", "rb");
    char *src = NULL, *at;
    long size;
    int kernels = 0, waiting = 0;
    ASSERTm("mnistcu.h not found: run the tests from the repository's root", f != NULL);
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, 0, SEEK_SET);
    src = (char *)malloc((size_t)size + 1);
    ASSERT(src != NULL);
    ASSERT_EQ((size_t)size, fread(src, 1, (size_t)size, f));
    fclose(f);
    src[size] = 0;
    for (at = strstr(src, "\n__global__ "); at; at = strstr(at + 1, "\n__global__ ")) {
        char *body = strstr(at, "\n{\n"), *next = strstr(at + 1, "\n__global__ ");
        ++kernels;
        if (!body || (next && body > next)) continue;
        body += 3;
        while (*body == ' ') ++body;
        if (!strncmp(body, "MNISTCU__PDL_WAIT();", 20)) ++waiting;
        else {
            char name[96];
            snprintf(name, sizeof name, "%.80s", at + 1);
            free(src);
            FAILm(name);
        }
    }
    { /* the one <<< >>> is mnistcu__launch's own, for builds without programmatic dependent launch */
        const char *plain = strstr(src, "k<<<grid, block, smem, st>>>(a...);"), *first = strstr(src, "<<<");
        ASSERTm("mnistcu__launch's plain launch not found", plain != NULL);
        ASSERT_EQm("a launch not through mnistcu__launch", plain + 1, first);
        ASSERT_EQm("a launch not through mnistcu__launch", NULL, strstr(first + 3, "<<<"));
    }
    free(src);
    ASSERT_GTE(kernels, 40);
    ASSERT_EQ(kernels, waiting);
    PASS();
}

SUITE(model_suite)
{
    RUN_TEST(every_cuda_kernel_waits_first);
    RUN_TEST(mlp_spec_valid);
    RUN_TEST(mlp_spec_invalid);
    RUN_TEST(model_create_desc_info);
    RUN_TEST(init_torch_statistics);
    RUN_TEST(init_he_uniform);
    RUN_TEST(init_schemes_match_torch_nn_init);
    RUN_TEST(init_seed_determinism);
    greatest_set_test_suffix("relu");
    RUN_TEST1(forward_matches_reference, MNISTCU_ACT_RELU);
    greatest_set_test_suffix("identity");
    RUN_TEST1(forward_matches_reference, MNISTCU_ACT_IDENTITY);
    greatest_set_test_suffix("sigmoid");
    RUN_TEST1(forward_matches_reference, MNISTCU_ACT_SIGMOID);
    greatest_set_test_suffix("tanh");
    RUN_TEST1(forward_matches_reference, MNISTCU_ACT_TANH);
    RUN_TEST(params_wrong_count);
    RUN_TEST(predict_probabilities);
    RUN_TEST(predict_u8_untrained);
}

/* ========================================================================== */
/*                                 grad_suite                                 */
/* ========================================================================== */

/* The gradient criterion |g - fd| <= GRAD_ATOL + GRAD_RTOL * |fd|, fd the
   central difference (step 1e-6) of the double reference loss; the
   truncation and rounding error of fd itself is below 1e-9, so the
   difference measures the library's float error. Measured on the CPU backend
   over the 16 cases below (gradients up to 0.72 in size; run with -v to print
   them): max |g - fd| 2.3e-7 (784-32-10), max |g - fd| / |fd| over |fd| > 1e-3
   2.6e-5, worst |g - fd| / tolerance 0.036; the loss is within 1.1e-7
   relative of the double reference. The tolerances keep a margin of ~4x on
   each term and still fail gradients that are off by 0.1% (see
   grad_check_detects_errors). */
#define GRAD_ATOL 1e-6
#define GRAD_RTOL 1e-4
#define GRAD_FD_STEP 1e-6
#define LOSS_RTOL 1e-5

typedef struct gstat {
    size_t nbad, worst;     /* failing elements, the worst one */
    double worst_score;     /* max |g - fd| / (atol + rtol |fd|) */
    double max_abs;         /* max |g - fd| */
    double max_rel;         /* max |g - fd| / |fd| over |fd| > 1e-3 */
    double max_fd;          /* max |fd| */
} gstat;

/* Returns 1 when every element meets the criterion (NaN never does). */
static int grad_compare(const float *g, const double *fd, size_t n, double atol, double rtol, gstat *st)
{
    size_t i;
    memset(st, 0, sizeof *st);
    for (i = 0; i < n; ++i) {
        double e = fabs((double)g[i] - fd[i]), tol = atol + rtol * fabs(fd[i]), score = e / tol;
        if (score != score) score = HUGE_VAL;
        if (e > st->max_abs || e != e) st->max_abs = e;
        if (fabs(fd[i]) > st->max_fd) st->max_fd = fabs(fd[i]);
        if (fabs(fd[i]) > 1e-3 && e / fabs(fd[i]) > st->max_rel) st->max_rel = e / fabs(fd[i]);
        if (!(e <= tol)) st->nbad++;
        if (score > st->worst_score) {
            st->worst_score = score;
            st->worst = i;
        }
    }
    return st->nbad == 0;
}

typedef struct gcase {
    const int *sizes;
    int count;
    mnistcu_act act;
    size_t B;
    float xlo, xhi;
    uint64_t seed;
} gcase;

typedef struct gres {
    size_t np;
    float *g;           /* the library's gradients */
    double *fd;         /* central differences of the double reference */
    double loss_lib, loss_ref;
    double zmin;        /* smallest |hidden pre-activation| */
} gres;

static void gres_free(gres *r)
{
    free(r->g);
    free(r->fd);
    memset(r, 0, sizeof *r);
}

/* Builds the case's model with random parameters (weights +-1.5/sqrt(in),
   biases +-0.3), random labels and inputs in [xlo, xhi), gets the library's
   loss and gradients and the double reference's loss and finite differences.
   For relu the inputs are redrawn until no hidden pre-activation is within
   1e-3 of zero, so that no difference straddles the kink (a step of 1e-6
   moves a pre-activation by at most ~1e-6 * 784). */
static int grad_case_run(const gcase *c, gres *res, int line)
{
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    tu_rng rng = tu_rng_make(c->seed);
    rnet n;
    rws w;
    float *p = NULL, *x = NULL;
    double *pd = NULL;
    int32_t *y = NULL;
    size_t i, in0 = (size_t)c->sizes[0];
    int ok = 0, l, attempt, relu = c->act == MNISTCU_ACT_RELU || c->act == MNISTCU_ACT_DEFAULT;
    memset(res, 0, sizeof *res);
    memset(&w, 0, sizeof w);
    rnet_make(&n, c->sizes, c->count, c->act);
    if (!ctx || mt_model(ctx, c->sizes, c->count, c->act, MNISTCU_INIT_DEFAULT, &m) != MNISTCU_OK) {
        tu_setf(line, "create failed");
        goto done;
    }
    res->np = n.np;
    if (mnistcu_model_num_params(m) != n.np) {
        tu_setf(line, "num_params %lu, expected %lu", (unsigned long)mnistcu_model_num_params(m), (unsigned long)n.np);
        goto done;
    }
    p = (float *)malloc(n.np * sizeof(float));
    y = (int32_t *)malloc(c->B * sizeof(int32_t));
    res->g = (float *)malloc(n.np * sizeof(float));
    res->fd = (double *)malloc(n.np * sizeof(double));
    if (!p || !y || !res->g || !res->fd) {
        tu_setf(line, "malloc");
        goto done;
    }
    for (l = 0; l < n.L; ++l) {
        double bw = 1.5 / sqrt((double)c->sizes[l]);
        for (i = n.w[l]; i < n.b[l]; ++i) p[i] = (float)tu_uniform(&rng, -bw, bw);
        for (i = n.b[l]; i < n.b[l] + (size_t)c->sizes[l + 1]; ++i) p[i] = (float)tu_uniform(&rng, -0.3, 0.3);
    }
    for (i = 0; i < c->B; ++i) y[i] = (int32_t)(tu_next(&rng) % (uint64_t)c->sizes[c->count - 1]);
    if (mnistcu_model_set_params(m, p, n.np) != MNISTCU_OK || mnistcu_model_get_params(m, p, n.np) != MNISTCU_OK) {
        tu_setf(line, "set/get params: %s", mnistcu_ctx_error(ctx));
        goto done;
    }
    pd = mt_to_double(p, n.np);
    if (!pd) goto done;
    for (attempt = 0;; ++attempt) {
        free(x);
        free(w.mem);
        w.mem = NULL;
        x = tu_random_floats(&rng, c->B * in0, c->xlo, c->xhi);
        if (!x || !rws_make(&w, &n, c->B, x)) {
            tu_setf(line, "malloc");
            goto done;
        }
        res->zmin = HUGE_VAL;
        res->loss_ref = ref_forward(&n, pd, &w, c->B, y, &res->zmin);
        if (!relu || res->zmin > 1e-3) break;
        if (attempt == 1000) {
            tu_setf(line, "no inputs found with every relu pre-activation away from 0");
            goto done;
        }
    }
    if (mnistcu_model_compute_grads(m, x, y, c->B, &res->loss_lib) != MNISTCU_OK ||
        mnistcu_model_get_grads(m, res->g, n.np) != MNISTCU_OK) {
        tu_setf(line, "compute_grads: %s", mnistcu_ctx_error(ctx));
        goto done;
    }
    ref_fd(&n, pd, &w, c->B, y, GRAD_FD_STEP, res->fd);
    ok = 1;
done:
    free(p);
    free(x);
    free(y);
    free(pd);
    free(w.mem);
    mnistcu_ctx_destroy(ctx);
    return ok;
}

/* Runs a case and checks loss and gradients. */
static int grad_case_check(const gcase *c, const char *name, int line)
{
    gres r;
    gstat st;
    int ok = 0;
    if (!grad_case_run(c, &r, line)) goto done;
    if (!(fabs(r.loss_lib - r.loss_ref) <= LOSS_RTOL * fabs(r.loss_ref))) {
        tu_setf(line, "%s: loss %.9g, double reference %.9g (rel err %.3g)", name, r.loss_lib, r.loss_ref,
                fabs(r.loss_lib - r.loss_ref) / fabs(r.loss_ref));
        goto done;
    }
    ok = grad_compare(r.g, r.fd, r.np, GRAD_ATOL, GRAD_RTOL, &st);
    if (GREATEST_IS_VERBOSE())
        printf("  %-24s %6lu params: max|fd| %.3g  max|g-fd| %.3g  max rel (|fd|>1e-3) %.3g  worst/tol %.3g  "
               "loss rel err %.3g  relu margin %.3g\n",
               name, (unsigned long)r.np, st.max_fd, st.max_abs, st.max_rel, st.worst_score,
               fabs(r.loss_lib - r.loss_ref) / fabs(r.loss_ref), r.zmin);
    if (!ok)
        tu_setf(line, "%s: %lu of %lu gradients off; worst [%lu]: library %.9g, finite difference %.9g "
                      "(|err| %.3g > %.3g + %.3g*|fd|)",
                name, (unsigned long)st.nbad, (unsigned long)r.np, (unsigned long)st.worst, (double)r.g[st.worst],
                r.fd[st.worst], fabs((double)r.g[st.worst] - r.fd[st.worst]), GRAD_ATOL, GRAD_RTOL);
done:
    gres_free(&r);
    return ok;
}

static const int g_small[] = {7, 5, 4, 3};

#define GRAD_TEST(NAME, SIZES, ACT, BATCH, XLO, XHI, SEED)                                   \
    TEST NAME(void)                                                                      \
    {                                                                                    \
        gcase c;                                                                         \
        c.sizes = SIZES;                                                                 \
        c.count = (int)(sizeof SIZES / sizeof SIZES[0]);                                 \
        c.act = ACT;                                                                     \
        c.B = BATCH;                                                                     \
        c.xlo = XLO;                                                                     \
        c.xhi = XHI;                                                                     \
        c.seed = SEED;                                                                   \
        if (!grad_case_check(&c, #NAME, __LINE__)) FAILm(tu_msg);                        \
        PASS();                                                                          \
    }

static const int g_deep[] = {6, 9, 8, 7, 6, 4};     /* 5 layers */
static const int g_odd[] = {11, 17, 9, 5};
static const int g_mnist[] = {784, 32, 10};

GRAD_TEST(grad_relu_7_5_4_3, g_small, MNISTCU_ACT_RELU, 6, -1.0f, 1.0f, 101)
GRAD_TEST(grad_identity_7_5_4_3, g_small, MNISTCU_ACT_IDENTITY, 6, -1.0f, 1.0f, 102)
GRAD_TEST(grad_sigmoid_7_5_4_3, g_small, MNISTCU_ACT_SIGMOID, 6, -1.0f, 1.0f, 103)
GRAD_TEST(grad_tanh_7_5_4_3, g_small, MNISTCU_ACT_TANH, 6, -1.0f, 1.0f, 104)
GRAD_TEST(grad_default_act_7_5_4_3, g_small, MNISTCU_ACT_DEFAULT, 6, -1.0f, 1.0f, 105)
GRAD_TEST(grad_deep_relu, g_deep, MNISTCU_ACT_RELU, 5, -1.0f, 1.0f, 106)
GRAD_TEST(grad_deep_tanh, g_deep, MNISTCU_ACT_TANH, 5, -1.0f, 1.0f, 107)
GRAD_TEST(grad_deep_sigmoid, g_deep, MNISTCU_ACT_SIGMOID, 5, -1.0f, 1.0f, 108)
GRAD_TEST(grad_batch1_relu, g_small, MNISTCU_ACT_RELU, 1, -1.0f, 1.0f, 109)
GRAD_TEST(grad_batch1_tanh, g_small, MNISTCU_ACT_TANH, 1, -1.0f, 1.0f, 110)
GRAD_TEST(grad_batch13_relu, g_small, MNISTCU_ACT_RELU, 13, -1.0f, 1.0f, 111)
GRAD_TEST(grad_batch13_sigmoid, g_small, MNISTCU_ACT_SIGMOID, 13, -1.0f, 1.0f, 112)
GRAD_TEST(grad_odd_11_17_9_5_relu, g_odd, MNISTCU_ACT_RELU, 7, -1.0f, 1.0f, 113)
GRAD_TEST(grad_odd_11_17_9_5_tanh, g_odd, MNISTCU_ACT_TANH, 7, -1.0f, 1.0f, 114)
GRAD_TEST(grad_784_32_10_relu, g_mnist, MNISTCU_ACT_RELU, 4, 0.0f, 1.0f, 115)
GRAD_TEST(grad_784_32_10_tanh, g_mnist, MNISTCU_ACT_TANH, 3, 0.0f, 1.0f, 116)

/* The check has teeth: the same comparison fails on gradients that are off
   by 0.1%, on one wrong element, on a sign flip and on a layout mix-up. */
TEST grad_check_detects_errors(void)
{
    gcase c;
    gres r;
    gstat st;
    float *bad = NULL;
    size_t i, big = 0, last_b;
    int failed = 0;
    c.sizes = g_small;
    c.count = 4;
    c.act = MNISTCU_ACT_TANH;
    c.B = 6;
    c.xlo = -1.0f;
    c.xhi = 1.0f;
    c.seed = 104;
    memset(&r, 0, sizeof r);
    TU_REQUIRE_OK(grad_case_run(&c, &r, __LINE__));
    bad = (float *)calloc(r.np, sizeof(float));
    TU_REQUIRE(bad != NULL, "malloc");
    TU_REQUIRE(grad_compare(r.g, r.fd, r.np, GRAD_ATOL, GRAD_RTOL, &st), "the unmodified gradients fail (worst %.3g)",
               st.worst_score);
    for (i = 0; i < r.np; ++i)
        if (fabs(r.fd[i]) > fabs(r.fd[big])) big = i;
    /* every element scaled by 1.001 */
    for (i = 0; i < r.np; ++i) bad[i] = r.g[i] * 1.001f;
    TU_REQUIRE(!grad_compare(bad, r.fd, r.np, GRAD_ATOL, GRAD_RTOL, &st), "gradients * 1.001 pass");
    /* one element off by 0.1% of the largest gradient */
    for (i = 0; i < r.np; ++i) bad[i] = r.g[i];
    bad[r.np / 2] += (float)(1e-3 * fabs(r.fd[big]));
    TU_REQUIRE(!grad_compare(bad, r.fd, r.np, GRAD_ATOL, GRAD_RTOL, &st), "one perturbed element passes");
    TU_REQUIRE(st.nbad == 1 && st.worst == r.np / 2, "the perturbed element not singled out (%lu bad, worst %lu)",
               (unsigned long)st.nbad, (unsigned long)st.worst);
    /* the largest element with its sign flipped */
    for (i = 0; i < r.np; ++i) bad[i] = r.g[i];
    bad[big] = -bad[big];
    TU_REQUIRE(!grad_compare(bad, r.fd, r.np, GRAD_ATOL, GRAD_RTOL, &st), "a sign flip passes");
    /* last layer's bias gradients rotated by one (a layout error) */
    last_b = r.np - 3;
    for (i = 0; i < r.np; ++i) bad[i] = r.g[i];
    for (i = 0; i < 3; ++i) bad[last_b + i] = r.g[last_b + (i + 1) % 3];
    TU_REQUIRE(!grad_compare(bad, r.fd, r.np, GRAD_ATOL, GRAD_RTOL, &st), "rotated bias gradients pass");
    /* NaN never passes */
    for (i = 0; i < r.np; ++i) bad[i] = r.g[i];
    bad[0] = tu_nan();
    TU_REQUIRE(!grad_compare(bad, r.fd, r.np, GRAD_ATOL, GRAD_RTOL, &st), "NaN passes");
done:
    free(bad);
    gres_free(&r);
    TU_END();
}

/* ---- SGD: mnistcu_model_apply_grads against torch.optim.SGD in double -----
   d = g + wd*w; buf = mu*buf + d (buf = d on the first step); d = nesterov ?
   d + mu*buf : buf; w -= lr*d. */
static int sgd_case(const mnistcu_optim_desc *o, int steps, const char *name, int line)
{
    static const int sizes[] = {7, 5, 4, 3};
    enum { B = 5 };
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    tu_rng rng = tu_rng_make(31);
    float *x = NULL, *g = NULL, *p = NULL;
    double *wref = NULL, *vref = NULL, *w0 = NULL;
    double lr = 0.1, mu = 0.0, wd = 0.0, moved = 0.0, maxerr = 0.0;
    int32_t y[B];
    size_t np = 0, i;
    int ok = 0, s, nesterov = 0;
    if (o) {
        lr = o->learning_rate == 0.0f ? 0.1 : (double)o->learning_rate;
        mu = (double)o->momentum;
        wd = (double)o->weight_decay;
        nesterov = o->nesterov;
    }
    if (!ctx || mnistcu_model_create_mlp(ctx, "7-5-4-3", &m) != MNISTCU_OK) {
        tu_setf(line, "%s: create", name);
        goto done;
    }
    np = mnistcu_model_num_params(m);
    x = tu_random_floats(&rng, (size_t)B * (size_t)sizes[0], -1.0f, 1.0f);
    g = (float *)malloc(np * sizeof(float));
    p = (float *)malloc(np * sizeof(float));
    wref = (double *)malloc(np * sizeof(double));
    vref = (double *)calloc(np, sizeof(double));
    if (!x || !g || !p || !wref || !vref) {
        tu_setf(line, "malloc");
        goto done;
    }
    for (i = 0; i < B; ++i) y[i] = (int32_t)(tu_next(&rng) % 3);
    if (mnistcu_model_get_params(m, p, np) != MNISTCU_OK) goto done;
    for (i = 0; i < np; ++i) wref[i] = (double)p[i];
    w0 = mt_to_double(p, np);
    if (!w0) goto done;
    for (s = 0; s < steps; ++s) {
        /* gradients recomputed at the library's current parameters */
        if (mnistcu_model_compute_grads(m, x, y, B, NULL) != MNISTCU_OK ||
            mnistcu_model_get_grads(m, g, np) != MNISTCU_OK || mnistcu_model_apply_grads(m, o) != MNISTCU_OK ||
            mnistcu_model_get_params(m, p, np) != MNISTCU_OK) {
            tu_setf(line, "%s: step %d: %s", name, s + 1, mnistcu_ctx_error(ctx));
            goto done;
        }
        for (i = 0; i < np; ++i) {
            double d = (double)g[i] + wd * wref[i];
            if (mu > 0.0) {
                vref[i] = s == 0 ? d : mu * vref[i] + d;
                d = nesterov ? d + mu * vref[i] : vref[i];
            }
            wref[i] -= lr * d;
        }
        /* float update vs double: measured max |err| 3.8e-8 after 3 steps that move w by up to 0.4 */
        for (i = 0; i < np; ++i)
            if (fabs((double)p[i] - wref[i]) > maxerr) maxerr = fabs((double)p[i] - wref[i]);
        for (i = 0; i < np; ++i)
            if (!(fabs((double)p[i] - wref[i]) <= 1e-6 + 1e-6 * fabs(wref[i]))) {
                tu_setf(line, "%s: step %d, param %lu = %.9g, torch.optim.SGD reference %.9g", name, s + 1,
                        (unsigned long)i, (double)p[i], wref[i]);
                goto done;
            }
    }
    for (i = 0; i < np; ++i)
        if (fabs(wref[i] - w0[i]) > moved) moved = fabs(wref[i] - w0[i]);
    if (GREATEST_IS_VERBOSE())
        printf("  sgd %-30s %d step(s): max |w - reference| %.3g, max |w - w0| %.3g\n", name, steps, maxerr, moved);
    if (moved < 1e-3) { /* else the check above would not tell a step from none */
        tu_setf(line, "%s: the parameters moved only %.3g", name, moved);
        goto done;
    }
    ok = 1;
done:
    free(x);
    free(g);
    free(p);
    free(wref);
    free(vref);
    free(w0);
    mnistcu_ctx_destroy(ctx);
    return ok;
}

static void mt_optim(mnistcu_optim_desc *o, float lr, float mu, int nesterov, float wd)
{
    memset(o, 0, sizeof *o);
    o->learning_rate = lr;
    o->momentum = mu;
    o->nesterov = nesterov;
    o->weight_decay = wd;
}

TEST sgd_plain(void)
{
    mnistcu_optim_desc o;
    int failed = 0;
    mt_optim(&o, 0.5f, 0.0f, 0, 0.0f);
    TU_REQUIRE_OK(sgd_case(&o, 1, "lr 0.5", __LINE__));
    TU_REQUIRE_OK(sgd_case(&o, 3, "lr 0.5, 3 steps", __LINE__));
    mt_optim(&o, 0.0f, 0.0f, 0, 0.0f); /* 0: the default 0.1 */
    TU_REQUIRE_OK(sgd_case(&o, 1, "zeroed desc", __LINE__));
    TU_REQUIRE_OK(sgd_case(NULL, 1, "NULL desc", __LINE__));
done:
    TU_END();
}

TEST sgd_weight_decay(void)
{
    mnistcu_optim_desc o;
    int failed = 0;
    mt_optim(&o, 0.3f, 0.0f, 0, 0.25f);
    TU_REQUIRE_OK(sgd_case(&o, 1, "weight decay", __LINE__));
    TU_REQUIRE_OK(sgd_case(&o, 3, "weight decay, 3 steps", __LINE__));
done:
    TU_END();
}

TEST sgd_momentum(void)
{
    mnistcu_optim_desc o;
    int failed = 0;
    mt_optim(&o, 0.2f, 0.9f, 0, 0.0f);
    TU_REQUIRE_OK(sgd_case(&o, 3, "momentum 0.9", __LINE__));
    mt_optim(&o, 0.2f, 0.5f, 0, 0.1f);
    TU_REQUIRE_OK(sgd_case(&o, 3, "momentum 0.5 + weight decay", __LINE__));
done:
    TU_END();
}

TEST sgd_nesterov(void)
{
    mnistcu_optim_desc o;
    int failed = 0;
    mt_optim(&o, 0.2f, 0.9f, 1, 0.0f);
    TU_REQUIRE_OK(sgd_case(&o, 3, "Nesterov 0.9", __LINE__));
    mt_optim(&o, 0.1f, 0.7f, 1, 0.05f);
    TU_REQUIRE_OK(sgd_case(&o, 3, "Nesterov 0.7 + weight decay", __LINE__));
done:
    TU_END();
}

TEST sgd_invalid_settings(void)
{
    mnistcu_ctx *ctx = mt_ctx();
    mnistcu_model *m = NULL;
    mnistcu_optim_desc bad[9];
    tu_rng rng = tu_rng_make(41);
    float *x = NULL, *p0 = NULL, *p1 = NULL;
    int32_t y[4] = {0, 1, 2, 1};
    size_t np = 0, k;
    mnistcu_result r;
    int failed = 0;
    mt_optim(&bad[0], -0.1f, 0.0f, 0, 0.0f);      /* negative learning rate */
    mt_optim(&bad[1], tu_nan(), 0.0f, 0, 0.0f);   /* NaN learning rate */
    mt_optim(&bad[2], (float)HUGE_VAL, 0.0f, 0, 0.0f); /* infinite learning rate */
    mt_optim(&bad[3], 0.1f, 1.0f, 0, 0.0f);       /* momentum 1 */
    mt_optim(&bad[4], 0.1f, 1.5f, 0, 0.0f);       /* momentum above 1 */
    mt_optim(&bad[5], 0.1f, -0.1f, 0, 0.0f);      /* negative momentum */
    mt_optim(&bad[6], 0.1f, 0.0f, 1, 0.0f);       /* Nesterov without momentum */
    mt_optim(&bad[7], 0.1f, 0.0f, 0, -0.01f);     /* negative weight decay */
    mt_optim(&bad[8], 0.1f, tu_nan(), 0, 0.0f);   /* NaN momentum */
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(mnistcu_model_create_mlp(ctx, "7-5-4-3", &m) == MNISTCU_OK, "create");
    np = mnistcu_model_num_params(m);
    x = tu_random_floats(&rng, 4 * 7, -1.0f, 1.0f);
    p0 = (float *)malloc(np * sizeof(float));
    p1 = (float *)malloc(np * sizeof(float));
    TU_REQUIRE(x && p0 && p1, "malloc");
    TU_REQUIRE(mnistcu_model_compute_grads(m, x, y, 4, NULL) == MNISTCU_OK, "compute_grads");
    TU_REQUIRE(mnistcu_model_get_params(m, p0, np) == MNISTCU_OK, "get_params");
    for (k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        mnistcu_ctx_clear_error(ctx);
        r = mnistcu_model_apply_grads(m, &bad[k]);
        TU_REQUIRE(r == MNISTCU_ERR_INVALID_ARGUMENT, "setting %lu (lr %g, momentum %g, nesterov %d, wd %g) gave %s",
                   (unsigned long)k, (double)bad[k].learning_rate, (double)bad[k].momentum, bad[k].nesterov,
                   (double)bad[k].weight_decay, mnistcu_result_name(r));
        TU_REQUIRE(mnistcu_ctx_error(ctx)[0] != '\0', "setting %lu: no error message", (unsigned long)k);
        TU_REQUIRE(mnistcu_model_get_params(m, p1, np) == MNISTCU_OK, "get_params");
        TU_REQUIRE(memcmp(p0, p1, np * sizeof(float)) == 0, "setting %lu changed the parameters", (unsigned long)k);
    }
done:
    free(x);
    free(p0);
    free(p1);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

SUITE(grad_suite)
{
    RUN_TEST(grad_relu_7_5_4_3);
    RUN_TEST(grad_identity_7_5_4_3);
    RUN_TEST(grad_sigmoid_7_5_4_3);
    RUN_TEST(grad_tanh_7_5_4_3);
    RUN_TEST(grad_default_act_7_5_4_3);
    RUN_TEST(grad_deep_relu);
    RUN_TEST(grad_deep_tanh);
    RUN_TEST(grad_deep_sigmoid);
    RUN_TEST(grad_batch1_relu);
    RUN_TEST(grad_batch1_tanh);
    RUN_TEST(grad_batch13_relu);
    RUN_TEST(grad_batch13_sigmoid);
    RUN_TEST(grad_odd_11_17_9_5_relu);
    RUN_TEST(grad_odd_11_17_9_5_tanh);
    RUN_TEST(grad_784_32_10_relu);
    RUN_TEST(grad_784_32_10_tanh);
    RUN_TEST(grad_check_detects_errors);
    RUN_TEST(sgd_plain);
    RUN_TEST(sgd_weight_decay);
    RUN_TEST(sgd_momentum);
    RUN_TEST(sgd_nesterov);
    RUN_TEST(sgd_invalid_settings);
}
