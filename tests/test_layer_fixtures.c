/* mnistcu's layer model against PyTorch: the reference values in
   tests/fixtures/layer_*.txt were computed in float64 by
   tests/make_layer_fixtures.py (tests/fixtures/README.md describes the format and
   how to regenerate them); this test needs no PyTorch and uses the public API
   only, so it runs unchanged on the default device of the CUDA test build.

   Per fixture: the model of the fixture's spec (mnistcu_model_create_spec, a
   preset or a spec string) must have exactly the fixture's state_dict keys,
   shapes and kinds (mnistcu_model_tensor_info). Every tensor is then set by name
   (mnistcu_model_set_tensor) to the fixture's initial values, which this test
   draws itself from the splitmix64 recipe in the fixture (checked against the
   fixture's digest of them): Fashion-CNN's 896,522 parameters would print to
   ~18 MB. Then, with the fixture's context seed (dropout's Philox key):
     - a fresh model in TRAIN mode: mnistcu_model_forward's logits, and its
       batch-norm buffers after that pass (PyTorch updates them in any TRAIN
       forward pass);
     - another: `steps` rounds of mnistcu_model_compute_grads +
       mnistcu_model_apply_grads (SGD with momentum, a step counter that drives
       the dropout mask): the loss of each round, every gradient after the first
       (by name, and the gradient arena's layout), then every tensor after the
       last step (parameters and buffers) and the logits in EVAL mode; where the
       fixture has `logits_step:K` lines (the dropout-mask case), also a TRAIN
       forward pass before round K, to see the mask of step K.
   Big tensors are stored as a digest (n, sum, sum |v|, sum v^2, max |v| and 256
   sampled elements) instead of in full.

   Tolerances: see lf_tol_model below. Run with -v for the largest error of each class
   of quantity, -vv for every line. The tests run from the repository root; a
   missing fixture is a failure. */
#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fixture reader ------------------------------------------------------
   Lines of `name count v1 ... vcount`, single words separated by blanks; lines
   starting with '#' are comments. The values are decimal numbers (strtod's
   syntax), except on the `spec` and `keys` lines, whose values are words. A
   count may be 0 (the shape of a scalar, an empty key list). */
#define LF_NAME_SIZE 64
#define LF_WORD_SIZE 128
#define LF_MAX_COUNT 10000000ul /* values on one line: a sanity limit */
#define LF_MSG_SIZE 1024

#if defined(__GNUC__) || defined(__clang__)
#define LF_PRINTF_(fmt_arg, first_arg) __attribute__((format(printf, fmt_arg, first_arg)))
#else
#define LF_PRINTF_(fmt_arg, first_arg)
#endif

/* snprintf through vsnprintf: messages are cut at the buffer's end on purpose, and
   gcc's -Wformat-truncation (which looks at snprintf calls only) need not guess. */
static LF_PRINTF_(3, 4) void lf_fmt(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

typedef struct lf_line {
    char name[LF_NAME_SIZE];
    size_t count;
    double *v; /* count numbers; NULL on a word line */
    char **w;  /* count words on a word line */
} lf_line;

typedef struct lf_file {
    lf_line *line;
    int n, cap;
} lf_file;

static int lf_is_word_line(const char *name)
{
    return strcmp(name, "spec") == 0 || strcmp(name, "keys") == 0;
}

static void lf_free(lf_file *f)
{
    int i;
    size_t k;
    for (i = 0; i < f->n; ++i) {
        free(f->line[i].v);
        if (f->line[i].w) {
            for (k = 0; k < f->line[i].count; ++k) free(f->line[i].w[k]);
            free(f->line[i].w);
        }
    }
    free(f->line);
    memset(f, 0, sizeof *f);
}

/* The next character after blanks (spaces, tabs, carriage returns), left unread. */
static int lf_peek(FILE *f)
{
    int c;
    do c = getc(f);
    while (c == ' ' || c == '\t' || c == '\r');
    if (c != EOF) ungetc(c, f);
    return c;
}

/* Reads one word (up to a blank, a newline or the end) of 1..size-1 characters. */
static int lf_word(FILE *f, char *out, size_t size)
{
    size_t n = 0;
    int c;
    lf_peek(f);
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

/* Parses path into lf; on failure writes why into err and frees what it read. */
static int lf_load(const char *path, lf_file *lf, char *err, size_t err_size)
{
    FILE *f = fopen(path, "r");
    int lineno = 1;
    memset(lf, 0, sizeof *lf);
    if (!f) {
        lf_fmt(err, err_size, "cannot open %s (run the tests from the repository root; "
                 "tests/make_layer_fixtures.py writes the fixtures)", path);
        return 0;
    }
    for (;;) {
        lf_line *L;
        char word[LF_WORD_SIZE], *end;
        unsigned long count;
        size_t i;
        int j, c = lf_peek(f);
        if (c == EOF) break;
        if (c == '\n' || c == '#') { /* the end of a line, or a comment up to it */
            while ((c = getc(f)) != EOF && c != '\n') {
            }
            lineno += c == '\n';
            continue;
        }
        if (lf->n == lf->cap) {
            int cap = lf->cap ? 2 * lf->cap : 64;
            lf_line *grown = (lf_line *)realloc(lf->line, (size_t)cap * sizeof *grown);
            if (!grown) {
                lf_fmt(err, err_size, "%s:%d: out of memory", path, lineno);
                goto fail;
            }
            lf->line = grown;
            lf->cap = cap;
        }
        L = &lf->line[lf->n++];
        memset(L, 0, sizeof *L);
        if (!lf_word(f, L->name, sizeof L->name)) {
            lf_fmt(err, err_size, "%s:%d: expected a name of at most %d characters", path, lineno,
                     LF_NAME_SIZE - 1);
            goto fail;
        }
        for (j = 0; j + 1 < lf->n; ++j)
            if (strcmp(lf->line[j].name, L->name) == 0) {
                lf_fmt(err, err_size, "%s:%d: a second '%s' line", path, lineno, L->name);
                goto fail;
            }
        if (!lf_word(f, word, sizeof word) || (count = strtoul(word, &end, 10), *end != '\0') ||
            count > LF_MAX_COUNT) {
            lf_fmt(err, err_size, "%s:%d: '%s' needs a count in 0..%lu", path, lineno, L->name, LF_MAX_COUNT);
            goto fail;
        }
        L->count = (size_t)count;
        if (lf_is_word_line(L->name)) {
            L->w = (char **)calloc(L->count ? L->count : 1, sizeof(char *));
            if (!L->w) {
                lf_fmt(err, err_size, "%s:%d: out of memory", path, lineno);
                goto fail;
            }
            for (i = 0; i < L->count; ++i) {
                if (!lf_word(f, word, sizeof word) || !(L->w[i] = (char *)malloc(strlen(word) + 1))) {
                    lf_fmt(err, err_size, "%s:%d: '%s' word %lu of %lu missing or too long", path, lineno,
                             L->name, (unsigned long)i + 1, count);
                    goto fail;
                }
                strcpy(L->w[i], word);
            }
        } else {
            L->v = (double *)malloc((L->count ? L->count : 1) * sizeof(double));
            if (!L->v) {
                lf_fmt(err, err_size, "%s:%d: out of memory", path, lineno);
                goto fail;
            }
            for (i = 0; i < L->count; ++i) {
                char num[64];
                if (!lf_word(f, num, sizeof num) || (L->v[i] = strtod(num, &end), *end != '\0')) {
                    lf_fmt(err, err_size, "%s:%d: '%s' value %lu of %lu missing or not a number", path, lineno,
                             L->name, (unsigned long)i + 1, count);
                    goto fail;
                }
            }
        }
        c = lf_peek(f);
        if (c != '\n' && c != EOF) {
            lf_fmt(err, err_size, "%s:%d: '%s' has more than %lu values", path, lineno, L->name, count);
            goto fail;
        }
    }
    if (ferror(f)) {
        lf_fmt(err, err_size, "%s: read error", path);
        goto fail;
    }
    fclose(f);
    return 1;
fail:
    fclose(f);
    lf_free(lf);
    return 0;
}

static const lf_line *lf_find(const lf_file *lf, const char *name)
{
    int i;
    for (i = 0; i < lf->n; ++i)
        if (strcmp(lf->line[i].name, name) == 0) return &lf->line[i];
    return NULL;
}

/* A numeric line PREFIX:KEY (or PREFIX alone when key is NULL), or NULL. */
static const lf_line *lf_num(const lf_file *lf, const char *prefix, const char *key)
{
    char name[LF_NAME_SIZE * 2];
    const lf_line *L;
    if (key) lf_fmt(name, sizeof name, "%s:%s", prefix, key);
    else lf_fmt(name, sizeof name, "%s", prefix);
    L = lf_find(lf, name);
    return L && L->v ? L : NULL;
}

/* ---- tolerances -----------------------------------------------------------------
   An element passes when |got - ref| <= floor + srel * M + rtol * |ref|, M the
   largest |ref| of the same tensor (or logits array): float32 rounding in a sum
   is proportional to the size of its terms, so an element that nearly cancels
   to zero carries an error on the scale of its tensor, not of itself.

   The yardstick is each fixture's record of how far float32 PyTorch is from the
   float64 references (the `# float32 PyTorch vs ...` comment lines: max |d| and
   max |d| / M per quantity). The largest over the three conv fixtures, PyTorch
   1.13 (Debian, CPU) / 2.11 (CPU), in units of M (of |ref| for the loss):
   logits 4.6e-7 / 2.5e-7, loss 1.0e-7 / 1.2e-7, gradients 2.0e-6 / 2.1e-6
   (every_kind's first conv bias), parameters after the steps 1.4e-7 / 1.4e-7,
   running statistics 1.1e-7 / 1.1e-7. The bounds below leave about 20x on
   those, room for another summation order (mnistcu blocks its convolutions and
   matrix products its own way, and uses cuBLAS or its own kernels on the GPU),
   while a wrong formula, index or term misses by far more: a 1% error in one
   factor of batch norm's backward fails by 99x, a 0.1% one in softmax's by 17x,
   the biased instead of the unbiased running variance by 85x.

   Measured, all four fixtures, mnistcu on the CPU (gcc -O2, OpenMP) and on an
   H100 (nvcc, cuBLAS): at most 0.032 of the logits tolerance, 0.021 of the
   loss's, 0.028 of the gradients', 0.039 of the parameters', 0.027 of the
   buffers'; the dropout logits 0.961 of theirs (below).

   Digests: each sampled element by the rule above; n exactly; sum, sum |v| and
   sum v^2 as if every element were off by (srel + rtol) relative (rounding errors
   are unbiased, so the sums are far tighter in practice: the fixtures record
   float32 PyTorch's relative deviation of the sums, 8e-8 at most). */
typedef struct lf_tol {
    const char *what;
    double floor, srel, rtol;
} lf_tol;

enum { TOL_LOGITS, TOL_LOSS, TOL_GRAD, TOL_PARAM, TOL_BUFFER, TOL_EXACT, TOL_COUNT };

/* The conv / dense cases. */
static const lf_tol lf_tol_model[TOL_COUNT] = {
    {"logits", 0.0, 1e-5, 1e-5},  /* float32 PyTorch: <= 4.6e-7 of M */
    {"loss", 0.0, 0.0, 2e-6},     /* <= 1.2e-7 relative */
    {"grads", 1e-10, 4e-5, 4e-5}, /* <= 2.1e-6 of M */
    {"params", 0.0, 2e-6, 2e-6},  /* <= 1.4e-7 of M */
    {"buffers", 0.0, 2e-6, 2e-6}, /* running_mean/var: <= 1.1e-7 of M */
    {"exact", 0.0, 0.0, 0.0},     /* num_batches_tracked */
};

/* The dropout-mask case: the logits are relu(x) * keep * scale with scale the
   float 1.0f/(1.0f-p), as mnistcu defines it (>>layer_dropout); the reference is that product
   exact (in double), mnistcu's its one float32 rounding, within 2^-24 relative
   by IEEE round-to-nearest (0.96 of it is used). This checks the documented
   formula, not only the mask: a scale computed otherwise (x/(1-p), or in double)
   can be one ulp off and fail. A wrong mask bit is off by the whole value. */
static const lf_tol lf_tol_mask[TOL_COUNT] = {
    {"logits", 0.0, 0.0, 5.9604644775390625e-8},
    {"loss", 0.0, 0.0, 2e-6},
    {"grads", 0.0, 0.0, 0.0},
    {"params", 0.0, 0.0, 0.0},
    {"buffers", 0.0, 0.0, 0.0},
    {"exact", 0.0, 0.0, 0.0},
};

typedef struct lf_case {
    const char *name; /* tests/fixtures/NAME.txt */
    const lf_tol *tol;
} lf_case;

static const lf_case lf_cases[] = {
    {"layer_lenet5", lf_tol_model},
    {"layer_fashion_cnn", lf_tol_model},
    {"layer_every_kind", lf_tol_model},
    {"layer_dropout_mask", lf_tol_mask},
};

/* ---- the state of one test, freed by the wrapper whatever the outcome ----------- */
#define LF_MAX_KEYS 256

typedef struct lf_class_stat {
    double use;         /* the largest error / tolerance */
    double err;         /* its error */
    char where[LF_NAME_SIZE * 2];
    int checked;
} lf_class_stat;

typedef struct lf_state {
    lf_file lf;
    const lf_tol *tol;
    mnistcu_ctx *ctx;
    int nkeys;
    const char *key[LF_MAX_KEYS];
    mnistcu_tensor_info ti[LF_MAX_KEYS];
    float *init[LF_MAX_KEYS]; /* the initial values of each tensor */
    float *x, *buf, *buf2;
    int32_t *labels;
    size_t B, inputs, classes, num_params, max_count;
    lf_class_stat stat[TOL_COUNT];
    int failures;
    char first_failure[LF_MSG_SIZE];
    char failed_names[LF_MSG_SIZE];
} lf_state;

static void lf_state_free(lf_state *s)
{
    int k;
    lf_free(&s->lf);
    mnistcu_ctx_destroy(s->ctx); /* frees a model an assert left behind */
    for (k = 0; k < s->nkeys; ++k) free(s->init[k]);
    free(s->x);
    free(s->buf);
    free(s->buf2);
    free(s->labels);
    free(s);
}

/* The index of a flat element as [i][j]... in shape (ndim 0..4). */
static void lf_index(char *out, size_t size, size_t flat, const int64_t *shape, int ndim)
{
    size_t idx[4], used = 0;
    int d;
    if (ndim <= 1) {
        lf_fmt(out, size, "[%lu]", (unsigned long)flat);
        return;
    }
    for (d = ndim - 1; d >= 0; --d) {
        size_t dim = shape[d] > 0 ? (size_t)shape[d] : 1;
        idx[d] = flat % dim;
        flat /= dim;
    }
    out[0] = '\0';
    for (d = 0; d < ndim && used + 1 < size; ++d) {
        lf_fmt(out + used, size - used, "[%lu]", (unsigned long)idx[d]);
        used = strlen(out);
    }
}

/* Records a failed check: the first one in full, the others by name. */
static void lf_fail(lf_state *s, const char *name, const char *detail)
{
    size_t used = strlen(s->failed_names);
    if (s->failures++ == 0) lf_fmt(s->first_failure, sizeof s->first_failure, "%s", detail);
    else lf_fmt(s->failed_names + used, sizeof s->failed_names - used, "%s%s", used ? ", " : "", name);
    if (GREATEST_IS_VERBOSE()) printf("    mismatch: %s\n", detail);
}

static void lf_note(lf_state *s, int cls, const char *name, double err, double use)
{
    lf_class_stat *st = &s->stat[cls];
    if (greatest_info.verbosity > 1)
        printf("    %-36s max |err| %-9.2g %.3f of tol\n", name, err, use);
    if (!st->checked || use > st->use) {
        st->use = use;
        st->err = err;
        lf_fmt(st->where, sizeof st->where, "%s", name);
    }
    st->checked = 1;
}

static double lf_tolerance(const lf_tol *t, double ref, double M)
{
    return t->floor + t->srel * M + t->rtol * fabs(ref);
}

/* One element against the rule; returns its error / tolerance (HUGE_VAL for NaN,
   or for any difference under a zero tolerance). */
static double lf_use(const lf_tol *t, double got, double ref, double M)
{
    double d = fabs(got - ref), tol = lf_tolerance(t, ref, M);
    if (got != got || ref != ref) return HUGE_VAL;
    if (d == 0.0) return 0.0;
    return tol > 0.0 ? d / tol : HUGE_VAL;
}

/* got[n] against a full line of n reference values. */
static void lf_compare(lf_state *s, int cls, const char *name, const float *got, const lf_line *ref,
                       const int64_t *shape, int ndim)
{
    const lf_tol *t = &s->tol[cls];
    double M = 0.0, worst_use = -1.0, err = 0.0;
    size_t i, worst = 0, bad = 0;
    char msg[LF_MSG_SIZE], where[64];
    for (i = 0; i < ref->count; ++i)
        if (fabs(ref->v[i]) > M) M = fabs(ref->v[i]);
    for (i = 0; i < ref->count; ++i) {
        double u = lf_use(t, got[i], ref->v[i], M), d = fabs((double)got[i] - ref->v[i]);
        if (d > err || d != d) err = d;
        if (u > 1.0) bad++;
        if (u > worst_use) {
            worst_use = u;
            worst = i;
        }
    }
    lf_note(s, cls, name, err, worst_use < 0 ? 0.0 : worst_use);
    if (bad) {
        lf_index(where, sizeof where, worst, shape, ndim);
        lf_fmt(msg, sizeof msg, "%s: %lu of %lu elements off (%s tolerance %g + %g*max|ref| (%.3g) + %g*|ref|); "
                 "worst %s: got %.9g, ref %.17g, |err| %.3g = %.3g x its tolerance", name, (unsigned long)bad,
                 (unsigned long)ref->count, t->what, t->floor, t->srel, M, t->rtol, where, (double)got[worst],
                 ref->v[worst], fabs((double)got[worst] - ref->v[worst]), worst_use);
        lf_fail(s, name, msg);
    }
}

/* got[n] against a digest line: n, sum, sum |v|, sum v^2, max |v|, then (index, value) pairs. */
static void lf_compare_digest(lf_state *s, int cls, const char *name, const float *got, size_t n,
                              const lf_line *ref, const int64_t *shape, int ndim)
{
    const lf_tol *t = &s->tol[cls];
    const double *r = ref->v;
    double sum = 0.0, sum_abs = 0.0, sum_sq = 0.0, max_abs = 0.0, rel = t->srel + t->rtol;
    double worst_use = 0.0, err = 0.0, M, u, tol;
    size_t i, k, pairs, worst = 0, bad = 0;
    char msg[LF_MSG_SIZE], where[64];
    if (ref->count < 5 || (ref->count - 5) % 2 != 0 || r[0] != (double)n) {
        lf_fmt(msg, sizeof msg, "%s: a digest needs 5 + 2k values and n = %lu", name, (unsigned long)n);
        lf_fail(s, name, msg);
        return;
    }
    M = r[4];
    for (i = 0; i < n; ++i) {
        double g = got[i];
        sum += g;
        sum_abs += fabs(g);
        sum_sq += g * g;
        if (fabs(g) > max_abs || g != g) max_abs = fabs(g);
    }
    /* the sampled elements */
    pairs = (ref->count - 5) / 2;
    for (k = 0; k < pairs; ++k) {
        double idx = r[5 + 2 * k], v = r[6 + 2 * k];
        size_t j = (size_t)idx;
        if (!(idx >= 0 && idx < (double)n && (double)j == idx)) {
            lf_fmt(msg, sizeof msg, "%s: digest index %g out of range", name, idx);
            lf_fail(s, name, msg);
            return;
        }
        u = lf_use(t, got[j], v, M);
        if (fabs((double)got[j] - v) > err) err = fabs((double)got[j] - v);
        if (u > 1.0) bad++;
        if (u > worst_use) {
            worst_use = u;
            worst = k;
        }
    }
    lf_note(s, cls, name, err, worst_use);
    if (bad) {
        size_t j = (size_t)r[5 + 2 * worst];
        lf_index(where, sizeof where, j, shape, ndim);
        lf_fmt(msg, sizeof msg, "%s: %lu of %lu sampled elements off (%s tolerance %g + %g*max|ref| (%.3g) + "
                 "%g*|ref|); worst %s: got %.9g, ref %.17g, %.3g x its tolerance", name, (unsigned long)bad,
                 (unsigned long)pairs, t->what, t->floor, t->srel, M, t->rtol, where, (double)got[j],
                 r[6 + 2 * worst], worst_use);
        lf_fail(s, name, msg);
        return;
    }
    /* the sums, as if every element were off by rel relative (plus the floor) */
    {
        const char *which[4] = {"sum", "sum |v|", "sum v^2", "max |v|"};
        double gotv[4], tolv[4];
        int q;
        gotv[0] = sum;
        gotv[1] = sum_abs;
        gotv[2] = sum_sq;
        gotv[3] = max_abs;
        tolv[0] = rel * r[2] + (double)n * t->floor;
        tolv[1] = tolv[0];
        tolv[2] = (2.0 * rel + rel * rel) * r[3] + 2.0 * t->floor * r[2] + (double)n * t->floor * t->floor;
        tolv[3] = t->floor + rel * M;
        for (q = 0; q < 4; ++q) {
            tol = tolv[q];
            if (!(fabs(gotv[q] - r[1 + q]) <= tol)) {
                lf_fmt(msg, sizeof msg, "%s: %s %.17g, ref %.17g, |err| %.3g > %.3g (as if every element were "
                         "off by %g relative)", name, which[q], gotv[q], r[1 + q], fabs(gotv[q] - r[1 + q]), tol, rel);
                lf_fail(s, name, msg);
                return;
            }
        }
    }
}

/* A tensor result: the line PREFIX:KEY in full or PREFIX_digest:KEY. */
static int lf_compare_tensor(lf_state *s, int cls, const char *prefix, int k, const float *got)
{
    char dname[LF_NAME_SIZE * 2], name[LF_NAME_SIZE * 2];
    const lf_line *L = lf_num(&s->lf, prefix, s->key[k]);
    lf_fmt(name, sizeof name, "%s:%s", prefix, s->key[k]);
    if (L) {
        if (L->count != s->ti[k].count) return 0;
        lf_compare(s, cls, name, got, L, s->ti[k].shape, s->ti[k].ndim);
        return 1;
    }
    lf_fmt(dname, sizeof dname, "%s_digest", prefix);
    L = lf_num(&s->lf, dname, s->key[k]);
    if (!L) return 0;
    lf_compare_digest(s, cls, name, got, s->ti[k].count, L, s->ti[k].shape, s->ti[k].ndim);
    return 1;
}

static int lf_ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

static int lf_is_buffer_name(const char *key)
{
    return lf_ends_with(key, ".running_mean") || lf_ends_with(key, ".running_var") ||
           lf_ends_with(key, ".num_batches_tracked");
}

static int lf_class_of(const char *key)
{
    if (lf_ends_with(key, ".num_batches_tracked")) return TOL_EXACT;
    return lf_is_buffer_name(key) ? TOL_BUFFER : TOL_PARAM;
}

/* The splitmix64 recipe of tests/make_layer_fixtures.py: u = ((z >> 40) - 2^23) / 2^23,
   value = float32(a + b*u), exact in double for the recipes the script allows. */
static float lf_recipe_value(tu_rng *r, double a, double b)
{
    uint64_t z = tu_next(r);
    double u = ((double)(int64_t)(z >> 40) - 8388608.0) / 8388608.0;
    return (float)(a + b * u);
}

#define LF_API(call)                                                                                      \
    do {                                                                                                  \
        mnistcu_result lf_r_ = (call);                                                                    \
        if (lf_r_ != MNISTCU_OK) {                                                                        \
            lf_fmt(msg, sizeof msg, "%s: %s returned %d: %s", path, #call, (int)lf_r_,                 \
                     mnistcu_ctx_error(s->ctx));                                                          \
            FAILm(msg);                                                                                   \
        }                                                                                                 \
    } while (0)

/* Sets every tensor of m to its initial value and checks the round trip. */
static greatest_test_res lf_set_all(lf_state *s, mnistcu_model *m, const char *path)
{
    char msg[LF_MSG_SIZE];
    int k;
    size_t off = 0;
    for (k = 0; k < s->nkeys; ++k) {
        LF_API(mnistcu_model_set_tensor(m, s->key[k], s->init[k], s->ti[k].count));
        LF_API(mnistcu_model_get_tensor(m, s->key[k], s->buf, s->ti[k].count));
        if (memcmp(s->buf, s->init[k], s->ti[k].count * sizeof(float)) != 0) {
            lf_fmt(msg, sizeof msg, "%s: get_tensor('%s') does not return what set_tensor stored", path, s->key[k]);
            FAILm(msg);
        }
    }
    /* the parameter arena: the trainable tensors in state_dict order */
    ASSERT_EQ(s->num_params, mnistcu_model_num_params(m));
    if (s->num_params) LF_API(mnistcu_model_get_params(m, s->buf, s->num_params));
    for (k = 0; k < s->nkeys; ++k) {
        if (s->ti[k].is_buffer) continue;
        if (memcmp(s->buf + off, s->init[k], s->ti[k].count * sizeof(float)) != 0) {
            lf_fmt(msg, sizeof msg, "%s: get_params at offset %lu does not hold '%s' (the arena must be the "
                     "trainable tensors in state_dict order)", path, (unsigned long)off, s->key[k]);
            FAILm(msg);
        }
        off += s->ti[k].count;
    }
    PASS();
}

static greatest_test_res lf_run(lf_state *s, const lf_case *c)
{
    char path[256], msg[LF_MSG_SIZE], spec[2048];
    const lf_line *L, *keys, *xl, *labels, *optim, *loss0, *ctx_seed, *losses;
    mnistcu_model *m = NULL;
    mnistcu_model_info info;
    mnistcu_ctx_desc cd;
    mnistcu_optim_desc opt;
    tu_rng rng;
    size_t i, steps, step;
    double loss;
    int k, n;

    s->tol = c->tol;
    lf_fmt(path, sizeof path, "tests/fixtures/%s.txt", c->name);
    if (!lf_load(path, &s->lf, msg, sizeof msg)) FAILm(msg);

    /* the context: the fixture's seed keys dropout's Philox */
    ctx_seed = lf_num(&s->lf, "ctx_seed", NULL);
    ASSERTm("the fixture needs a 'ctx_seed' line of one whole number below 2^53",
            ctx_seed && ctx_seed->count == 1 && ctx_seed->v[0] >= 0 && ctx_seed->v[0] < 9007199254740992.0);
    memset(&cd, 0, sizeof cd);
    cd.device = MNISTCU_DEVICE_AUTO;
    cd.seed = (uint64_t)ctx_seed->v[0];
    cd.log_level = MNISTCU_LOG_SILENT;
    if (mnistcu_ctx_create(&s->ctx, &cd) != MNISTCU_OK) {
        lf_fmt(msg, sizeof msg, "context creation failed: %s", s->ctx ? mnistcu_ctx_error(s->ctx) : "");
        FAILm(msg);
    }

    /* the model */
    L = lf_find(&s->lf, "spec");
    ASSERTm("the fixture needs a 'spec' line of words", L && L->w && L->count >= 1);
    spec[0] = '\0';
    for (i = 0; i < L->count; ++i) {
        ASSERTm("the spec is too long", strlen(spec) + strlen(L->w[i]) + 2 < sizeof spec);
        if (i) strcat(spec, " ");
        strcat(spec, L->w[i]);
    }
    LF_API(mnistcu_model_create_spec(s->ctx, spec, &m));

    /* the state_dict: names, shapes, kinds */
    keys = lf_find(&s->lf, "keys");
    ASSERTm("the fixture needs a 'keys' line of words", keys && keys->w && keys->count <= LF_MAX_KEYS);
    s->nkeys = (int)keys->count;
    n = mnistcu_model_num_tensors(m);
    if (n != s->nkeys) {
        lf_fmt(msg, sizeof msg, "%s: mnistcu_model_num_tensors is %d, PyTorch's state_dict has %d keys", path, n,
                 s->nkeys);
        FAILm(msg);
    }
    s->num_params = 0;
    s->max_count = 1;
    for (k = 0; k < s->nkeys; ++k) {
        mnistcu_tensor_info *ti = &s->ti[k];
        const lf_line *shape;
        size_t count = 1;
        int d;
        s->key[k] = keys->w[k];
        LF_API(mnistcu_model_tensor_info(m, k, ti));
        if (strcmp(ti->name, s->key[k]) != 0) {
            lf_fmt(msg, sizeof msg, "%s: tensor %d is '%s', PyTorch's state_dict key is '%s'", path, k, ti->name,
                     s->key[k]);
            FAILm(msg);
        }
        shape = lf_num(&s->lf, "shape", s->key[k]);
        ASSERTm("the fixture needs a 'shape:KEY' line for every key", shape != NULL && shape->count <= 4);
        if (ti->ndim != (int)shape->count) {
            lf_fmt(msg, sizeof msg, "%s: '%s' has %d dimensions, PyTorch's %lu", path, s->key[k], ti->ndim,
                     (unsigned long)shape->count);
            FAILm(msg);
        }
        for (d = 0; d < ti->ndim; ++d) {
            if ((double)ti->shape[d] != shape->v[d]) {
                lf_fmt(msg, sizeof msg, "%s: '%s' dimension %d is %ld, PyTorch's %g", path, s->key[k], d,
                         (long)ti->shape[d], shape->v[d]);
                FAILm(msg);
            }
            count *= (size_t)shape->v[d];
        }
        if (ti->count != count || ti->is_buffer != lf_is_buffer_name(s->key[k]) ||
            ti->is_int != lf_ends_with(s->key[k], ".num_batches_tracked") ||
            ti->layer != atoi(s->key[k])) {
            lf_fmt(msg, sizeof msg, "%s: '%s': count %lu (expected %lu), is_buffer %d, is_int %d, layer %d "
                     "disagree with its name", path, s->key[k], (unsigned long)ti->count, (unsigned long)count,
                     ti->is_buffer, ti->is_int, ti->layer);
            FAILm(msg);
        }
        if (!ti->is_buffer) s->num_params += count;
        if (count > s->max_count) s->max_count = count;
    }
    mnistcu_model_info_get(m, &info);
    s->inputs = info.inputs;
    s->classes = info.classes;

    /* the initial values: the recipe's draws (checked against the fixture's digest) or explicit values */
    L = lf_num(&s->lf, "seed", NULL);
    ASSERTm("the fixture needs a 'seed' line of one whole number below 2^53",
            L && L->count == 1 && L->v[0] >= 0 && L->v[0] < 9007199254740992.0);
    rng.s = (uint64_t)L->v[0];
    for (k = 0; k < s->nkeys; ++k) {
        size_t cnt = s->ti[k].count;
        const lf_line *init = lf_num(&s->lf, "init", s->key[k]), *val = lf_num(&s->lf, "value", s->key[k]);
        s->init[k] = (float *)malloc((cnt ? cnt : 1) * sizeof(float));
        ASSERT(s->init[k] != NULL);
        if (init) {
            const lf_line *dg = lf_num(&s->lf, "init_digest", s->key[k]);
            double sum = 0.0;
            size_t p;
            ASSERTm("an 'init:KEY' line holds a b, and needs an 'init_digest:KEY' line",
                    init->count == 2 && dg && dg->count >= 5 && (dg->count - 5) % 2 == 0);
            for (i = 0; i < cnt; ++i) {
                s->init[k][i] = lf_recipe_value(&rng, init->v[0], init->v[1]);
                sum += s->init[k][i];
            }
            for (p = 0; p < (dg->count - 5) / 2; ++p) {
                size_t j = (size_t)dg->v[5 + 2 * p];
                if (j >= cnt || (double)s->init[k][j] != dg->v[6 + 2 * p]) break;
            }
            if (dg->v[0] != (double)cnt || p < (dg->count - 5) / 2 || !(fabs(sum - dg->v[1]) <= 1e-9 * dg->v[2])) {
                lf_fmt(msg, sizeof msg, "%s: the initial values drawn for '%s' differ from the script's (the "
                         "generator here and in tests/make_layer_fixtures.py must agree)", path, s->key[k]);
                FAILm(msg);
            }
        } else if (val) {
            float *f;
            ASSERTm("a 'value:KEY' line needs the tensor's count", val->count == cnt);
            f = s->init[k];
            for (i = 0; i < cnt; ++i) f[i] = (float)val->v[i];
        } else {
            lf_fmt(msg, sizeof msg, "%s: no 'init:' or 'value:' line for '%s'", path, s->key[k]);
            FAILm(msg);
        }
    }

    /* the batch */
    labels = lf_num(&s->lf, "labels", NULL);
    ASSERTm("the fixture needs a 'labels' line", labels && labels->count >= 1);
    s->B = labels->count;
    xl = lf_num(&s->lf, "x", NULL);
    if (!xl || xl->count != s->B * s->inputs) {
        lf_fmt(msg, sizeof msg, "%s: 'x' needs batch * inputs = %lu * %lu values", path, (unsigned long)s->B,
                 (unsigned long)s->inputs);
        FAILm(msg);
    }
    if (s->B * s->classes > s->max_count) s->max_count = s->B * s->classes;
    if (s->num_params > s->max_count) s->max_count = s->num_params;
    s->x = (float *)malloc(xl->count * sizeof(float));
    s->labels = (int32_t *)malloc(s->B * sizeof(int32_t));
    s->buf = (float *)malloc(s->max_count * sizeof(float));
    s->buf2 = (float *)malloc(s->max_count * sizeof(float));
    ASSERT(s->x && s->labels && s->buf && s->buf2);
    for (i = 0; i < xl->count; ++i) {
        s->x[i] = (float)xl->v[i];
        ASSERTm("x must hold float32 values (the fixture's premise)", (double)s->x[i] == xl->v[i]);
    }
    for (i = 0; i < s->B; ++i) {
        ASSERTm("labels are whole numbers in 0..classes-1", labels->v[i] >= 0 && labels->v[i] < (double)s->classes &&
                                                                labels->v[i] == (double)(int)labels->v[i]);
        s->labels[i] = (int32_t)labels->v[i];
    }

    /* model A: the TRAIN-mode logits of a fresh model, and its buffers after that one pass */
    CHECK_CALL(lf_set_all(s, m, path));
    mnistcu_model_set_mode(m, MNISTCU_MODE_TRAIN);
    L = lf_num(&s->lf, "logits", NULL);
    ASSERTm("the fixture needs 'logits' of batch * classes values", L && L->count == s->B * s->classes);
    LF_API(mnistcu_model_forward(m, s->x, s->B, s->buf));
    {
        int64_t shape[2];
        shape[0] = (int64_t)s->B;
        shape[1] = (int64_t)s->classes;
        lf_compare(s, TOL_LOGITS, "logits (TRAIN, step 0)", s->buf, L, shape, 2);
    }
    for (k = 0; k < s->nkeys; ++k) {
        if (!s->ti[k].is_buffer) continue;
        LF_API(mnistcu_model_get_tensor(m, s->key[k], s->buf, s->ti[k].count));
        if (!lf_compare_tensor(s, lf_class_of(s->key[k]), "after_forward", k, s->buf)) {
            lf_fmt(msg, sizeof msg, "%s: no 'after_forward:%s' line of its count", path, s->key[k]);
            FAILm(msg);
        }
    }
    mnistcu_model_destroy(m);
    m = NULL;

    /* model B: the optimizer sequence */
    optim = lf_num(&s->lf, "optim", NULL);
    ASSERTm("the fixture needs 'optim 3 steps lr momentum'", optim && optim->count == 3 && optim->v[0] >= 1 &&
                                                                  optim->v[0] <= 100);
    steps = (size_t)optim->v[0];
    memset(&opt, 0, sizeof opt);
    opt.kind = MNISTCU_OPTIM_SGD;
    opt.learning_rate = (float)optim->v[1];
    opt.momentum = (float)optim->v[2];
    ASSERTm("lr and momentum must be float32 values",
            (double)opt.learning_rate == optim->v[1] && (double)opt.momentum == optim->v[2]);
    losses = lf_num(&s->lf, "losses", NULL);
    ASSERTm("the fixture needs 'losses' of one value per step", losses && losses->count == steps);
    loss0 = lf_num(&s->lf, "loss", NULL);
    ASSERTm("the fixture needs 'loss' of one value", loss0 && loss0->count == 1);
    LF_API(mnistcu_model_create_spec(s->ctx, spec, &m));
    CHECK_CALL(lf_set_all(s, m, path));
    mnistcu_model_set_mode(m, MNISTCU_MODE_TRAIN);
    for (step = 0; step < steps; ++step) {
        char name[64];
        if (mnistcu_model_steps(m) != (uint64_t)step) {
            lf_fmt(msg, sizeof msg, "%s: mnistcu_model_steps is %lu after %lu apply_grads calls", path,
                     (unsigned long)mnistcu_model_steps(m), (unsigned long)step);
            FAILm(msg);
        }
        lf_fmt(name, sizeof name, "logits_step:%lu", (unsigned long)step);
        L = lf_num(&s->lf, name, NULL);
        if (L) { /* a TRAIN forward pass at this step (the dropout mask of this step) */
            int64_t shape[2];
            ASSERTm("'logits_step:K' needs batch * classes values", L->count == s->B * s->classes);
            shape[0] = (int64_t)s->B;
            shape[1] = (int64_t)s->classes;
            LF_API(mnistcu_model_forward(m, s->x, s->B, s->buf));
            lf_compare(s, TOL_LOGITS, name, s->buf, L, shape, 2);
        }
        LF_API(mnistcu_model_compute_grads(m, s->x, s->labels, s->B, &loss));
        lf_fmt(name, sizeof name, "loss at step %lu", (unsigned long)step);
        {
            /* the loss is a double: compare it as one */
            double u = lf_use(&s->tol[TOL_LOSS], loss, losses->v[step], fabs(losses->v[step]));
            lf_note(s, TOL_LOSS, name, fabs(loss - losses->v[step]), u);
            if (u > 1.0) {
                lf_fmt(msg, sizeof msg, "%s: got %.17g, ref %.17g, |err| %.3g = %.3g x the tolerance (%g relative)",
                         name, loss, losses->v[step], fabs(loss - losses->v[step]), u, s->tol[TOL_LOSS].rtol);
                lf_fail(s, name, msg);
            }
        }
        if (step == 0) {
            size_t off = 0;
            ASSERTm("'loss' and the first of 'losses' must agree", loss0->v[0] == losses->v[0]);
            for (k = 0; k < s->nkeys; ++k) {
                if (s->ti[k].is_buffer) continue;
                LF_API(mnistcu_model_get_tensor_grad(m, s->key[k], s->buf, s->ti[k].count));
                if (!lf_compare_tensor(s, TOL_GRAD, "grad", k, s->buf)) {
                    lf_fmt(msg, sizeof msg, "%s: no 'grad:%s' or 'grad_digest:%s' line of its count", path, s->key[k],
                             s->key[k]);
                    FAILm(msg);
                }
                memcpy(s->buf2 + off, s->buf, s->ti[k].count * sizeof(float));
                off += s->ti[k].count;
            }
            /* the gradient arena has the parameters' layout */
            if (s->num_params) {
                LF_API(mnistcu_model_get_grads(m, s->buf, s->num_params));
                if (memcmp(s->buf, s->buf2, s->num_params * sizeof(float)) != 0) {
                    lf_fmt(msg, sizeof msg, "%s: get_grads differs from the get_tensor_grad of each parameter in "
                             "state_dict order", path);
                    FAILm(msg);
                }
            }
        }
        LF_API(mnistcu_model_apply_grads(m, &opt));
    }
    if (mnistcu_model_steps(m) != (uint64_t)steps) {
        lf_fmt(msg, sizeof msg, "%s: mnistcu_model_steps is %lu after %lu apply_grads calls", path,
                 (unsigned long)mnistcu_model_steps(m), (unsigned long)steps);
        FAILm(msg);
    }
    for (k = 0; k < s->nkeys; ++k) {
        LF_API(mnistcu_model_get_tensor(m, s->key[k], s->buf, s->ti[k].count));
        if (!lf_compare_tensor(s, lf_class_of(s->key[k]), "after", k, s->buf)) {
            lf_fmt(msg, sizeof msg, "%s: no 'after:%s' or 'after_digest:%s' line of its count", path, s->key[k],
                     s->key[k]);
            FAILm(msg);
        }
    }
    mnistcu_model_set_mode(m, MNISTCU_MODE_EVAL);
    L = lf_num(&s->lf, "eval_logits", NULL);
    ASSERTm("the fixture needs 'eval_logits' of batch * classes values", L && L->count == s->B * s->classes);
    LF_API(mnistcu_model_forward(m, s->x, s->B, s->buf));
    {
        int64_t shape[2];
        shape[0] = (int64_t)s->B;
        shape[1] = (int64_t)s->classes;
        lf_compare(s, TOL_LOGITS, "eval_logits (after the steps)", s->buf, L, shape, 2);
    }
    mnistcu_model_destroy(m);
    m = NULL;

    if (s->failures) {
        /* room for everything; the harness keeps the first 1023 characters */
        static char all[sizeof path + 3 * LF_MSG_SIZE];
        lf_fmt(all, sizeof all, "%s: %d check%s failed; first: %s%s%s", path, s->failures,
                 s->failures == 1 ? "" : "s", s->first_failure, s->failures > 1 ? "; also: " : "",
                 s->failed_names);
        FAILm(all);
    }
    {
        size_t used = 0;
        int q;
        msg[0] = '\0';
        for (q = 0; q < TOL_COUNT; ++q) {
            const lf_class_stat *st = &s->stat[q];
            if (!st->checked) continue;
            lf_fmt(msg + used, sizeof msg - used, "%s%s %.2g (%.3f of tol, %s)", used ? ", " : "",
                     s->tol[q].what, st->err, st->use, st->where);
            used = strlen(msg);
        }
        PASSm(msg);
    }
}

TEST layer_fixture(const lf_case *c)
{
    lf_state *s = (lf_state *)calloc(1, sizeof *s);
    greatest_test_res r;
    if (!s) FAILm("out of memory");
    r = lf_run(s, c);
    lf_state_free(s);
    return r;
}

SUITE(layer_fixture_suite)
{
    size_t i;
    for (i = 0; i < sizeof lf_cases / sizeof lf_cases[0]; ++i) {
        greatest_set_test_suffix(lf_cases[i].name);
        RUN_TESTp(layer_fixture, &lf_cases[i]);
    }
}
