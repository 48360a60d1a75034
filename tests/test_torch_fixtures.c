/* mnistcu against PyTorch: the reference values in tests/fixtures/NAME.txt were
   computed in float64 by tests/make_torch_fixtures.py (see tests/fixtures/README.md
   for the format and how to regenerate them); these tests need no PyTorch.

   For each fixture: a model of the fixture's sizes and hidden activation gets the
   fixture's initial parameters, then mnistcu's float32 results are compared with
   the float64 references: the logits of mnistcu_model_forward, the mean loss and
   the gradients of mnistcu_model_compute_grads, and the parameters after each
   optimizer sequence of compute_grads + apply_grads steps (a fresh model for each
   sequence, since the momentum buffer lives in the model).

   The fixtures' inputs and initial parameters are float32 values, so the only
   differences are mnistcu's float32 rounding. Run with -v to see the largest
   error of each quantity and how much of its tolerance it uses. The tests run
   from the repository root; a missing fixture is a failure. */
#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fixture parser ---------------------------------------------------
   A fixture is lines of `name count v1 ... vcount`, single words separated by
   blanks; lines starting with '#' are comments. The values are decimal numbers
   (read with strtod's syntax), except on the `act` line, whose one value is the
   activation's name. */
#define FX_MAX_LINES 32
#define FX_NAME_SIZE 48
#define FX_MAX_COUNT 10000000ul /* values on one line: a sanity limit */
#define FX_MSG_SIZE 1024

typedef struct fx_line {
    char name[FX_NAME_SIZE];
    size_t count;
    double *v;                /* count values; NULL on the act line */
    char word[FX_NAME_SIZE];  /* the act line's value */
} fx_line;

typedef struct fixture {
    fx_line line[FX_MAX_LINES];
    int n;
} fixture;

static void fx_free(fixture *fx)
{
    int i;
    for (i = 0; i < fx->n; ++i) free(fx->line[i].v);
    fx->n = 0;
}

/* The next character after blanks (spaces, tabs, carriage returns), left unread. */
static int fx_peek(FILE *f)
{
    int c;
    do c = getc(f);
    while (c == ' ' || c == '\t' || c == '\r');
    if (c != EOF) ungetc(c, f);
    return c;
}

/* Reads one word (up to a blank, a newline or the end) of 1..size-1 characters. */
static int fx_word(FILE *f, char *out, size_t size)
{
    size_t n = 0;
    int c;
    fx_peek(f);
    for (;;) {
        c = getc(f);
        if (c == EOF || c == ' ' || c == '\t' || c == '\r' || c == '\n') break;
        if (n + 1 >= size) return 0;
        out[n++] = (char)c;
    }
    if (c != EOF) ungetc(c, f);
    out[n] = '\0';
    return n > 0;
}

/* Parses path into fx; on failure writes why into err and frees what it read. */
static int fx_load(const char *path, fixture *fx, char *err, size_t err_size)
{
    FILE *f = fopen(path, "r");
    int lineno = 1;
    memset(fx, 0, sizeof *fx);
    if (!f) {
        snprintf(err, err_size, "cannot open %s (run the tests from the repository root; "
                 "tests/make_torch_fixtures.py writes the fixtures)", path);
        return 0;
    }
    for (;;) {
        fx_line *L;
        char word[FX_NAME_SIZE], *end;
        unsigned long count;
        size_t i;
        int c = fx_peek(f);
        if (c == EOF) break;
        if (c == '\n' || c == '#') { /* the end of a line, or a comment up to it */
            while ((c = getc(f)) != EOF && c != '\n') {
            }
            lineno += c == '\n';
            continue;
        }
        if (fx->n == FX_MAX_LINES) {
            snprintf(err, err_size, "%s:%d: more than %d lines", path, lineno, FX_MAX_LINES);
            goto fail;
        }
        L = &fx->line[fx->n++];
        if (!fx_word(f, L->name, sizeof L->name)) {
            snprintf(err, err_size, "%s:%d: expected a name of at most %d characters", path, lineno,
                     FX_NAME_SIZE - 1);
            goto fail;
        }
        for (i = 0; i + 1 < (size_t)fx->n; ++i)
            if (strcmp(fx->line[i].name, L->name) == 0) {
                snprintf(err, err_size, "%s:%d: a second '%s' line", path, lineno, L->name);
                goto fail;
            }
        if (!fx_word(f, word, sizeof word) || (count = strtoul(word, &end, 10), *end != '\0') || count == 0 ||
            count > FX_MAX_COUNT) {
            snprintf(err, err_size, "%s:%d: '%s' needs a count in 1..%lu", path, lineno, L->name, FX_MAX_COUNT);
            goto fail;
        }
        L->count = (size_t)count;
        if (strcmp(L->name, "act") == 0) {
            if (count != 1 || !fx_word(f, L->word, sizeof L->word)) {
                snprintf(err, err_size, "%s:%d: expected 'act 1 NAME'", path, lineno);
                goto fail;
            }
        } else {
            L->v = (double *)malloc(L->count * sizeof(double));
            if (!L->v) {
                snprintf(err, err_size, "%s:%d: out of memory", path, lineno);
                goto fail;
            }
            for (i = 0; i < L->count; ++i) {
                char num[64];
                if (!fx_word(f, num, sizeof num) || (L->v[i] = strtod(num, &end), *end != '\0')) {
                    snprintf(err, err_size, "%s:%d: '%s' value %lu of %lu missing or not a number", path, lineno,
                             L->name, (unsigned long)i + 1, count);
                    goto fail;
                }
            }
        }
        c = fx_peek(f);
        if (c != '\n' && c != EOF) {
            snprintf(err, err_size, "%s:%d: '%s' has more than %lu values", path, lineno, L->name, count);
            goto fail;
        }
    }
    if (ferror(f)) {
        snprintf(err, err_size, "%s: read error", path);
        goto fail;
    }
    fclose(f);
    return 1;
fail:
    fclose(f);
    fx_free(fx);
    return 0;
}

static const fx_line *fx_find(const fixture *fx, const char *name)
{
    int i;
    for (i = 0; i < fx->n; ++i)
        if (strcmp(fx->line[i].name, name) == 0) return &fx->line[i];
    return NULL;
}

/* ---- the tests --------------------------------------------------------------
   Tolerances: |got - ref| <= atol + rtol * |ref| per element. The references are
   of size ~0.1..3 (logits, loss, parameters) or ~1e-3..0.1 (gradients, hence
   their smaller atol). Largest errors measured over all six fixtures, on the
   CPU (gcc, OpenMP) and on an H100 (cuBLAS and the own GEMM kernel):
     logits 3.4e-7, loss 8.1e-8, grads 1.9e-7, parameters after steps 7.7e-8,
   which use at most 2%, 3%, 5% and 5% of the tolerances below: a margin of 20x
   or more for other compilers and devices, while a wrong formula (a missed
   factor, a dropped term, a step off by one) misses by 1e-4 or far more. */
#define TOL_LOGITS_ATOL 1e-5
#define TOL_LOGITS_RTOL 1e-5
#define TOL_LOSS_ATOL 1e-6
#define TOL_LOSS_RTOL 1e-6
#define TOL_GRADS_ATOL 1e-6
#define TOL_GRADS_RTOL 1e-5
#define TOL_STEP_ATOL 1e-6
#define TOL_STEP_RTOL 1e-6

typedef struct fx_case {
    const char *name;  /* tests/fixtures/NAME.txt */
    int optims;        /* optimizer sequences the fixture must hold */
} fx_case;

static const fx_case fx_cases[] = {
    {"relu_5_7_4_3", 4},
    {"tanh_6_8_5", 4},
    {"sigmoid_6_8_5", 4},
    {"identity_6_8_5", 4},
    {"relu_784_16_10", 0},
    {"relu_5_7_4_3_batch1", 4},
};

/* Everything one test allocates, freed by the test whatever the outcome. */
typedef struct fx_state {
    fixture fx;
    mnistcu_ctx *ctx;
    float *x, *params, *got;
    double *got_d;
    int32_t *labels;
    char report[FX_MSG_SIZE]; /* the largest errors, for the PASS message */
} fx_state;

/* Appends "what: max |err| E (U of tol)" to the report; got and ref have n elements. */
static void fx_measure(fx_state *s, const char *what, const double *got, const double *ref, size_t n, double atol,
                       double rtol)
{
    double err = 0.0, use = 0.0;
    size_t i, used = strlen(s->report);
    for (i = 0; i < n; ++i) {
        double d = fabs(got[i] - ref[i]), u = d / (atol + rtol * fabs(ref[i]));
        if (d > err) err = d;
        if (u > use) use = u;
    }
    snprintf(s->report + used, sizeof s->report - used, "%s%s %.2g (%.3f of tol)", used ? ", " : "", what, err, use);
}

static const fx_line *fx_need(const fixture *fx, const char *name, size_t count)
{
    const fx_line *L = fx_find(fx, name);
    return L && L->v && (count == 0 || L->count == count) ? L : NULL;
}

/* Copies n doubles that must be float32 values into a new float array. */
static float *fx_floats(const double *v, size_t n)
{
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    size_t i;
    if (!p) return NULL;
    for (i = 0; i < n; ++i) {
        p[i] = (float)v[i];
        if ((double)p[i] != v[i]) {
            free(p);
            return NULL;
        }
    }
    return p;
}

static int fx_act(const char *name, mnistcu_act *act)
{
    static const char *const names[] = {"relu", "identity", "sigmoid", "tanh"};
    static const mnistcu_act acts[] = {MNISTCU_ACT_RELU, MNISTCU_ACT_IDENTITY, MNISTCU_ACT_SIGMOID, MNISTCU_ACT_TANH};
    int i;
    for (i = 0; i < 4; ++i)
        if (strcmp(name, names[i]) == 0) {
            *act = acts[i];
            return 1;
        }
    return 0;
}

static greatest_test_res fx_run(fx_state *s, const fx_case *c)
{
    char path[256], msg[FX_MSG_SIZE];
    const fx_line *sizes, *act, *x, *labels, *params, *logits, *loss, *grads;
    mnistcu_model_desc desc;
    mnistcu_model *m = NULL;
    size_t B, P, C, i;
    double got_loss;
    int l, nopt = 0;

    snprintf(path, sizeof path, "tests/fixtures/%s.txt", c->name);
    if (!fx_load(path, &s->fx, msg, sizeof msg)) FAILm(msg);

    /* the model */
    sizes = fx_need(&s->fx, "sizes", 0);
    act = fx_find(&s->fx, "act");
    ASSERTm("the fixture needs a 'sizes' line of 2..MNISTCU_MAX_LAYERS+1 widths",
            sizes && sizes->count >= 2 && sizes->count <= MNISTCU_MAX_LAYERS + 1);
    ASSERTm("the fixture needs an 'act' line", act && !act->v);
    memset(&desc, 0, sizeof desc);
    for (l = 0; l < (int)sizes->count; ++l) {
        ASSERTm("widths are whole numbers in 1..2^24", sizes->v[l] >= 1 && sizes->v[l] <= 16777216.0 &&
                                                             sizes->v[l] == (double)(int)sizes->v[l]);
        desc.sizes[l] = (int)sizes->v[l];
    }
    if (!fx_act(act->word, &desc.hidden_act)) {
        snprintf(msg, sizeof msg, "%s: unknown activation '%s'", path, act->word);
        FAILm(msg);
    }
    s->ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    ASSERTm("context creation failed", s->ctx != NULL);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create(s->ctx, &desc, &m));
    P = mnistcu_model_num_params(m);
    C = (size_t)desc.sizes[sizes->count - 1];

    /* the batch and the initial parameters */
    labels = fx_need(&s->fx, "labels", 0);
    ASSERTm("the fixture needs a 'labels' line", labels != NULL);
    B = labels->count;
    x = fx_need(&s->fx, "x", B * (size_t)desc.sizes[0]);
    params = fx_need(&s->fx, "params", P);
    logits = fx_need(&s->fx, "logits", B * C);
    loss = fx_need(&s->fx, "loss", 1);
    grads = fx_need(&s->fx, "grads", P);
    ASSERTm("'x' needs batch*inputs values", x != NULL);
    ASSERTm("'params' needs the model's parameter count", params != NULL);
    ASSERTm("'logits' needs batch*classes values", logits != NULL);
    ASSERTm("'loss' needs one value", loss != NULL);
    ASSERTm("'grads' needs the model's parameter count", grads != NULL);
    s->x = fx_floats(x->v, x->count);
    s->params = fx_floats(params->v, P);
    ASSERTm("x and params must be float32 values (the fixture's premise)", s->x && s->params);
    s->labels = (int32_t *)malloc(B * sizeof(int32_t));
    s->got = (float *)malloc((P > B * C ? P : B * C) * sizeof(float));
    s->got_d = (double *)malloc((P > B * C ? P : B * C) * sizeof(double));
    ASSERT(s->labels && s->got && s->got_d);
    for (i = 0; i < B; ++i) {
        ASSERTm("labels are whole numbers in 0..classes-1",
                labels->v[i] >= 0 && labels->v[i] < (double)C && labels->v[i] == (double)(int)labels->v[i]);
        s->labels[i] = (int32_t)labels->v[i];
    }

    /* forward */
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(m, s->params, P));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_get_params(m, s->got, P));
    ASSERT_ARRAY_EQ_BITS_F(s->got, s->params, P);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_forward(m, s->x, B, s->got));
    for (i = 0; i < B * C; ++i) s->got_d[i] = s->got[i];
    fx_measure(s, "logits", s->got_d, logits->v, B * C, TOL_LOGITS_ATOL, TOL_LOGITS_RTOL);
    ASSERT_ARRAY_NEAR_D(s->got_d, logits->v, B * C, TOL_LOGITS_ATOL, TOL_LOGITS_RTOL);

    /* loss and gradients */
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(m, s->x, s->labels, B, &got_loss));
    fx_measure(s, "loss", &got_loss, loss->v, 1, TOL_LOSS_ATOL, TOL_LOSS_RTOL);
    ASSERT_NEAR(got_loss, loss->v[0], TOL_LOSS_ATOL, TOL_LOSS_RTOL);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_get_grads(m, s->got, P));
    for (i = 0; i < P; ++i) s->got_d[i] = s->got[i];
    fx_measure(s, "grads", s->got_d, grads->v, P, TOL_GRADS_ATOL, TOL_GRADS_RTOL);
    ASSERT_ARRAY_NEAR_D(s->got_d, grads->v, P, TOL_GRADS_ATOL, TOL_GRADS_RTOL);
    mnistcu_model_destroy(m);
    m = NULL;

    /* optimizer sequences: NAME_optim = steps lr momentum nesterov weight_decay, NAME = the parameters after */
    for (l = 0; l < s->fx.n; ++l) {
        const fx_line *O = &s->fx.line[l], *R;
        char name[FX_NAME_SIZE];
        size_t len = strlen(O->name), k;
        mnistcu_optim_desc opt;
        if (len <= 6 || strcmp(O->name + len - 6, "_optim") != 0) continue;
        memcpy(name, O->name, len - 6);
        name[len - 6] = '\0';
        R = fx_need(&s->fx, name, P);
        if (!O->v || O->count != 5 || !R || !(O->v[0] >= 1 && O->v[0] <= 1000)) {
            snprintf(msg, sizeof msg, "%s: '%s' needs 5 values (steps lr momentum nesterov weight_decay) and a "
                     "'%s' line of %lu parameters", path, O->name, name, (unsigned long)P);
            FAILm(msg);
        }
        memset(&opt, 0, sizeof opt);
        opt.kind = MNISTCU_OPTIM_SGD;
        opt.learning_rate = (float)O->v[1];
        opt.momentum = (float)O->v[2];
        opt.nesterov = O->v[3] != 0.0;
        opt.weight_decay = (float)O->v[4];
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_create(s->ctx, &desc, &m)); /* fresh optimizer state */
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(m, s->params, P));
        for (k = 0; k < (size_t)O->v[0]; ++k) {
            ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(m, s->x, s->labels, B, NULL));
            ASSERT_EQ(MNISTCU_OK, mnistcu_model_apply_grads(m, &opt));
        }
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_get_params(m, s->got, P));
        mnistcu_model_destroy(m);
        m = NULL;
        for (i = 0; i < P; ++i) s->got_d[i] = s->got[i];
        fx_measure(s, name, s->got_d, R->v, P, TOL_STEP_ATOL, TOL_STEP_RTOL);
        if (!asserts_array_near_d(s->got_d, R->v, P, TOL_STEP_ATOL, TOL_STEP_RTOL, "params", name))
            FAILm(asserts_msg);
        nopt++;
    }
    if (nopt != c->optims) {
        snprintf(msg, sizeof msg, "%s: %d optimizer sequences, expected %d", path, nopt, c->optims);
        FAILm(msg);
    }
    PASSm(s->report);
}

TEST torch_fixture(const fx_case *c)
{
    fx_state *s = (fx_state *)calloc(1, sizeof *s);
    greatest_test_res r;
    if (!s) FAILm("out of memory");
    r = fx_run(s, c);
    fx_free(&s->fx);
    mnistcu_ctx_destroy(s->ctx); /* frees a model an assert left behind */
    free(s->x);
    free(s->params);
    free(s->got);
    free(s->got_d);
    free(s->labels);
    free(s);
    return r;
}

SUITE(torch_fixture_suite)
{
    size_t i;
    for (i = 0; i < sizeof fx_cases / sizeof fx_cases[0]; ++i) {
        greatest_set_test_suffix(fx_cases[i].name);
        RUN_TESTp(torch_fixture, &fx_cases[i]);
    }
}
