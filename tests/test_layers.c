/* Layer tests: every layer kind of the general model (dense, conv2d, pools,
   batch norm, dropout, flatten, activations, softmax) against a reference
   written here, in double precision, from the definitions (PyTorch's
   semantics as documented in mnistcu.h): forward logits, finite-difference
   gradient checks, batch norm's running statistics, dropout's Philox mask bit
   for bit, spec strings, tensor names and layouts.

   Independence: the reference never calls the library. Models are built from
   a mnistcu_model_desc that this file's own small spec parser (tl_parse)
   makes, so a bug in the library's parser cannot hide in both sides; the
   library's parser is checked against tl_parse separately (spec_* tests).
   The file includes mnistcu.h without MNISTCU_IMPLEMENTATION and uses only
   the public API, so the same tests run on the GPU in the CUDA build: no
   check assumes the CPU's bits.

   Tests free what they allocate also when a check fails: TU_REQUIRE jumps to
   the cleanup at the end of the test, which reports the failure. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

#define TL_SEED 1234u /* the seed of tu_ctx's contexts: dropout's Philox key */

static mnistcu_ctx *tl_ctx(void) { return tu_ctx(MNISTCU_DEVICE_AUTO, 0); }

/* A silent context with the given seed, on the default device. */
static mnistcu_ctx *tl_ctx_seed(uint64_t seed)
{
    mnistcu_ctx_desc d;
    mnistcu_ctx *ctx = NULL;
    memset(&d, 0, sizeof d);
    d.log_level = MNISTCU_LOG_SILENT;
    d.seed = seed;
    if (mnistcu_ctx_create(&ctx, &d) != MNISTCU_OK) {
        mnistcu_ctx_destroy(ctx);
        return NULL;
    }
    return ctx;
}

static double *tl_dalloc(size_t n) { return (double *)calloc(n ? n : 1, sizeof(double)); }
static float *tl_falloc(size_t n) { return (float *)calloc(n ? n : 1, sizeof(float)); }

/* ========================================================================== */
/*           Philox4x32-10, written from Salmon et al. (SC 2011)              */
/* ========================================================================== */
/* The upstream Random123 order: the key is bumped before rounds 2..10. */
static void tl_philox4x32_10(uint32_t ctr[4], uint32_t key0, uint32_t key1)
{
    int round;
    for (round = 1; round <= 10; ++round) {
        uint64_t prod0, prod1;
        uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3];
        if (round > 1) {
            key0 += 0x9E3779B9u;
            key1 += 0xBB67AE85u;
        }
        prod0 = (uint64_t)0xD2511F53u * (uint64_t)x0; /* mulhilo32(M0, x0) */
        prod1 = (uint64_t)0xCD9E8D57u * (uint64_t)x2; /* mulhilo32(M1, x2) */
        ctr[0] = (uint32_t)(prod1 >> 32) ^ x1 ^ key0;
        ctr[1] = (uint32_t)(prod1 & 0xFFFFFFFFu);
        ctr[2] = (uint32_t)(prod0 >> 32) ^ x3 ^ key1;
        ctr[3] = (uint32_t)(prod0 & 0xFFFFFFFFu);
    }
}

/* Dropout's rule (mnistcu.h): element e of layer `layer`'s batch tensor at
   step `step` is kept iff (word[e & 3] >> 8) * 2^-24 >= p, word = philox(
   {e >> 2, layer, step lo, step hi}, {seed lo, seed hi}). */
static int tl_keep(uint64_t seed, int layer, uint64_t step, size_t e, float p)
{
    uint32_t c[4];
    c[0] = (uint32_t)(e >> 2);
    c[1] = (uint32_t)layer;
    c[2] = (uint32_t)(step & 0xFFFFFFFFu);
    c[3] = (uint32_t)(step >> 32);
    tl_philox4x32_10(c, (uint32_t)(seed & 0xFFFFFFFFu), (uint32_t)(seed >> 32));
    return (double)(c[e & 3] >> 8) / 16777216.0 >= (double)p;
}

/* The known-answer vectors of Random123 (kat_vectors, philox4x32 10). */
TEST philox_known_answers(void)
{
    static const uint32_t kat[3][10] = {
        {0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u,
         0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
         0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
         0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    int v, k;
    for (v = 0; v < 3; ++v) {
        uint32_t c[4];
        for (k = 0; k < 4; ++k) c[k] = kat[v][k];
        tl_philox4x32_10(c, kat[v][4], kat[v][5]);
        for (k = 0; k < 4; ++k) ASSERT_EQ_FMT(kat[v][6 + k], c[k], "0x%08x");
    }
    PASS();
}

/* ========================================================================== */
/*          The test's own spec parser (independent of the library's)         */
/* ========================================================================== */
/* Fills d from the grammar of mnistcu.h (the subset the tests use: every
   keyword and option), with every field equal to its default left zero, the
   form the documentation promises for mnistcu_model_desc_parse. Returns 0 on
   any syntax error. */
static int tl_num(const char **s, int *out)
{
    long v = 0;
    const char *p = *s;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') v = v * 10 + (*p++ - '0');
    *out = (int)v;
    *s = p;
    return 1;
}

static int tl_parse_layer(const char *tok, mnistcu_layer_desc *d)
{
    static const struct { const char *key; mnistcu_layer_kind kind; } keys[] = {
        {"leaky_relu", MNISTCU_LAYER_LEAKY_RELU}, {"batchnorm", MNISTCU_LAYER_BATCHNORM},
        {"maxpool", MNISTCU_LAYER_MAXPOOL2D},     {"avgpool", MNISTCU_LAYER_AVGPOOL2D},
        {"dropout", MNISTCU_LAYER_DROPOUT},       {"flatten", MNISTCU_LAYER_FLATTEN},
        {"sigmoid", MNISTCU_LAYER_SIGMOID},       {"softmax", MNISTCU_LAYER_SOFTMAX},
        {"dense", MNISTCU_LAYER_DENSE},           {"conv", MNISTCU_LAYER_CONV2D},
        {"relu", MNISTCU_LAYER_RELU},             {"tanh", MNISTCU_LAYER_TANH}};
    const char *p = tok;
    size_t k;
    int a, b;
    memset(d, 0, sizeof *d);
    for (k = 0; k < sizeof keys / sizeof keys[0]; ++k)
        if (strncmp(tok, keys[k].key, strlen(keys[k].key)) == 0) break;
    if (k == sizeof keys / sizeof keys[0]) return 0;
    d->kind = keys[k].kind;
    p = tok + strlen(keys[k].key);
    switch (d->kind) {
    case MNISTCU_LAYER_DENSE:
        if (!tl_num(&p, &d->units)) return 0;
        break;
    case MNISTCU_LAYER_CONV2D:
        if (!tl_num(&p, &d->kernel_h) || *p++ != 'x' || !tl_num(&p, &d->kernel_w) || *p++ != 'x' ||
            !tl_num(&p, &d->units))
            return 0;
        break;
    case MNISTCU_LAYER_MAXPOOL2D:
    case MNISTCU_LAYER_AVGPOOL2D:
        if (tl_num(&p, &d->kernel_h) && *p == 'x') {
            ++p;
            if (!tl_num(&p, &d->kernel_w)) return 0;
        }
        break;
    case MNISTCU_LAYER_DROPOUT:
    case MNISTCU_LAYER_LEAKY_RELU:
        if (*p && *p != ':') {
            char *end;
            double v = strtod(p, &end);
            if (end == p) return 0;
            if (d->kind == MNISTCU_LAYER_DROPOUT) d->p = (float)v;
            else d->slope = (float)v;
            p = end;
        }
        break;
    default: break;
    }
    while (*p == ':') {
        ++p;
        if (strncmp(p, "s=", 2) == 0) {
            p += 2;
            if (!tl_num(&p, &d->stride)) return 0;
        } else if (strncmp(p, "p=", 2) == 0) {
            p += 2;
            if (!tl_num(&p, &d->padding)) return 0;
        } else if (strncmp(p, "bias=", 5) == 0) {
            p += 5;
            if (!tl_num(&p, &a)) return 0;
            d->no_bias = a == 0;
        } else if (strncmp(p, "eps=", 4) == 0 || strncmp(p, "momentum=", 9) == 0) {
            int is_eps = p[0] == 'e';
            char *end;
            double v;
            p += is_eps ? 4 : 9;
            v = strtod(p, &end);
            if (end == p) return 0;
            if (is_eps) d->eps = (float)v;
            else d->momentum = (float)v;
            p = end;
        } else {
            return 0;
        }
    }
    if (*p) return 0;
    /* defaults as zero */
    if (d->kind == MNISTCU_LAYER_CONV2D) {
        if (d->kernel_w == d->kernel_h) d->kernel_w = 0;
        if (d->stride == 1) d->stride = 0;
    } else if (d->kind == MNISTCU_LAYER_MAXPOOL2D || d->kind == MNISTCU_LAYER_AVGPOOL2D) {
        a = d->kernel_h ? d->kernel_h : 2;
        b = d->kernel_w ? d->kernel_w : a;
        if (a == b && d->stride == a) d->stride = 0; /* the stride defaults to the kernel */
        d->kernel_w = a == b ? 0 : b;
        d->kernel_h = (a == 2 && b == 2) ? 0 : a;
    } else if (d->kind == MNISTCU_LAYER_BATCHNORM) {
        if (d->eps == 1e-5f) d->eps = 0.0f;
        if (d->momentum == 0.1f) d->momentum = 0.0f;
    } else if (d->kind == MNISTCU_LAYER_DROPOUT) {
        if (d->p == 0.5f) d->p = 0.0f;
    } else if (d->kind == MNISTCU_LAYER_LEAKY_RELU) {
        if (d->slope == 0.01f) d->slope = 0.0f;
    }
    return 1;
}

/* "CxHxW tok tok ..." or "N tok ..." (no presets, no MLP widths). */
static int tl_parse(const char *spec, mnistcu_model_desc *d)
{
    char tok[128];
    const char *p = spec;
    int n = 0, first = 1;
    memset(d, 0, sizeof *d);
    for (;;) {
        size_t len = 0;
        while (*p == ' ') ++p;
        if (!*p) break;
        while (p[len] && p[len] != ' ') ++len;
        if (len >= sizeof tok) return 0;
        memcpy(tok, p, len);
        tok[len] = 0;
        p += len;
        if (first) {
            const char *q = tok;
            int a, b, c;
            first = 0;
            if (!tl_num(&q, &a)) return 0;
            if (*q == 0) {
                d->input_c = d->input_h = 1;
                d->input_w = a;
                continue;
            }
            if (*q++ != 'x' || !tl_num(&q, &b) || *q++ != 'x' || !tl_num(&q, &c) || *q) return 0;
            d->input_c = a;
            d->input_h = b;
            d->input_w = c;
            continue;
        }
        if (n == MNISTCU_MAX_MODEL_LAYERS || !tl_parse_layer(tok, &d->layers[n++])) return 0;
    }
    return !first && n > 0;
}

/* ========================================================================== */
/*                  The double-precision reference network                    */
/* ========================================================================== */
typedef struct tl_rl {
    mnistcu_layer_kind kind;
    int c, h, w;            /* input shape of one sample (flat: N x 1 x 1) */
    int oc, oh, ow;         /* output shape */
    int kh, kw, sh, sw, pad;
    double slope, eps, mom;
    float p;                /* dropout: the probability as the float the library holds */
    size_t wo, nw, bo, nb;  /* parameter offsets and counts (arena order: weight, bias) */
    size_t in_size, out_size;
    double *rmean, *rvar;   /* batch norm: running statistics */
} tl_rl;

typedef struct tl_ref {
    int n;
    tl_rl L[MNISTCU_MAX_MODEL_LAYERS];
    size_t inputs, classes, np, max_size;
    int train;              /* TRAIN mode: batch statistics, dropout masks */
    uint64_t seed, step;    /* dropout's key and counter */
    size_t wsB;             /* batch the workspace holds */
    double *ws;
    double *act[MNISTCU_MAX_MODEL_LAYERS + 1]; /* act[0] = x, act[i+1] = output of layer i */
} tl_ref;

/* Distances to the kinks in the last pass: ReLU/LeakyReLU inputs from 0, and
   the gap between the largest and the second largest value of each max
   pool window. Finite differences are only trusted when both are large. */
typedef struct tl_margin { double relu, pool; } tl_margin;

static void tl_ref_free(tl_ref *r)
{
    int i;
    for (i = 0; i < r->n; ++i) {
        free(r->L[i].rmean);
        free(r->L[i].rvar);
    }
    free(r->ws);
    memset(r, 0, sizeof *r);
}

/* Shapes and offsets from the definitions; 0 (with tu_msg set) when the
   architecture is impossible. */
static int tl_ref_make(tl_ref *r, const mnistcu_model_desc *d, int line)
{
    int c = d->input_c ? d->input_c : 1, h = d->input_h ? d->input_h : 1, w = d->input_w, i, k;
    size_t off = 0;
    memset(r, 0, sizeof *r);
    r->seed = TL_SEED;
    r->train = 1;
    if (c == 1 && h == 1) { /* flat data */
        c = w;
        w = 1;
    }
    r->inputs = (size_t)c * h * w;
    r->max_size = r->inputs;
    for (i = 0; i < MNISTCU_MAX_MODEL_LAYERS && d->layers[i].kind != MNISTCU_LAYER_NONE; ++i) {
        const mnistcu_layer_desc *ld = &d->layers[i];
        tl_rl *L = &r->L[i];
        L->kind = ld->kind;
        L->c = c;
        L->h = h;
        L->w = w;
        L->oc = c;
        L->oh = h;
        L->ow = w;
        switch (ld->kind) {
        case MNISTCU_LAYER_DENSE:
            if (h != 1 || w != 1) {
                tu_setf(line, "reference: dense layer %d on a %dx%dx%d map", i, c, h, w);
                return 0;
            }
            L->oc = ld->units;
            L->nw = (size_t)ld->units * (size_t)c;
            L->nb = ld->no_bias ? 0 : (size_t)ld->units;
            break;
        case MNISTCU_LAYER_CONV2D:
            L->kh = ld->kernel_h;
            L->kw = ld->kernel_w ? ld->kernel_w : ld->kernel_h;
            L->sh = L->sw = ld->stride ? ld->stride : 1;
            L->pad = ld->padding;
            L->oc = ld->units;
            L->oh = (h + 2 * L->pad - L->kh) / L->sh + 1;
            L->ow = (w + 2 * L->pad - L->kw) / L->sw + 1;
            L->nw = (size_t)ld->units * (size_t)c * (size_t)L->kh * (size_t)L->kw;
            L->nb = ld->no_bias ? 0 : (size_t)ld->units;
            if (h + 2 * L->pad < L->kh || w + 2 * L->pad < L->kw) {
                tu_setf(line, "reference: conv layer %d does not fit", i);
                return 0;
            }
            break;
        case MNISTCU_LAYER_MAXPOOL2D:
        case MNISTCU_LAYER_AVGPOOL2D:
            L->kh = ld->kernel_h ? ld->kernel_h : 2;
            L->kw = ld->kernel_w ? ld->kernel_w : L->kh;
            L->sh = ld->stride ? ld->stride : L->kh;
            L->sw = ld->stride ? ld->stride : L->kw;
            if (h < L->kh || w < L->kw) {
                tu_setf(line, "reference: pool layer %d does not fit", i);
                return 0;
            }
            L->oh = (h - L->kh) / L->sh + 1;
            L->ow = (w - L->kw) / L->sw + 1;
            break;
        case MNISTCU_LAYER_BATCHNORM:
            L->eps = ld->eps != 0.0f ? (double)ld->eps : 1e-5;
            L->mom = ld->momentum != 0.0f ? (double)ld->momentum : 0.1;
            L->nw = L->nb = (size_t)c;
            L->rmean = tl_dalloc((size_t)c);
            L->rvar = tl_dalloc((size_t)c);
            if (!L->rmean || !L->rvar) {
                r->n = i + 1;
                tu_setf(line, "malloc");
                return 0;
            }
            for (k = 0; k < c; ++k) L->rvar[k] = 1.0; /* PyTorch's initial running statistics */
            break;
        case MNISTCU_LAYER_DROPOUT: L->p = ld->p != 0.0f ? ld->p : 0.5f; break;
        case MNISTCU_LAYER_LEAKY_RELU: L->slope = ld->slope != 0.0f ? (double)ld->slope : 0.01; break;
        case MNISTCU_LAYER_FLATTEN:
            L->oc = c * h * w;
            L->oh = L->ow = 1;
            break;
        default: break;
        }
        if (L->nw) {
            L->wo = off;
            off += L->nw;
        }
        if (L->nb) {
            L->bo = off;
            off += L->nb;
        }
        L->in_size = (size_t)c * h * w;
        L->out_size = (size_t)L->oc * L->oh * L->ow;
        if (L->out_size > r->max_size) r->max_size = L->out_size;
        c = L->oc;
        h = L->oh;
        w = L->ow;
        r->n = i + 1;
    }
    r->np = off;
    r->classes = (size_t)c;
    if (h != 1 || w != 1 || r->n == 0) {
        tu_setf(line, "reference: the last layer is not flat");
        return 0;
    }
    return 1;
}

static int tl_ref_reserve(tl_ref *r, size_t B)
{
    size_t total = 0;
    int i;
    double *p;
    if (B <= r->wsB) return 1;
    free(r->ws);
    total = B * r->inputs;
    for (i = 0; i < r->n; ++i) total += B * r->L[i].out_size;
    r->ws = tl_dalloc(total);
    if (!r->ws) {
        r->wsB = 0;
        return 0;
    }
    p = r->ws;
    r->act[0] = p;
    p += B * r->inputs;
    for (i = 0; i < r->n; ++i) {
        r->act[i + 1] = p;
        p += B * r->L[i].out_size;
    }
    r->wsB = B;
    return 1;
}

static void tl_margin_update(double *m, double v)
{
    if (v < *m) *m = v;
}

/* Layer i: act[i] [B][in] -> act[i+1] [B][out]. update: batch norm in TRAIN
   mode moves its running statistics (as a forward pass of the library does). */
static void tl_layer_forward(tl_ref *r, int i, const double *prm, size_t B, tl_margin *mg, int update)
{
    tl_rl *L = &r->L[i];
    const double *x = r->act[i];
    double *y = r->act[i + 1];
    size_t b, e, n = B * L->in_size, S = (size_t)L->h * (size_t)L->w;
    int o, c, oy, ox, ki, kj;
    switch (L->kind) {
    case MNISTCU_LAYER_DENSE:
        for (b = 0; b < B; ++b)
            for (o = 0; o < L->oc; ++o) {
                const double *wr = prm + L->wo + (size_t)o * (size_t)L->c;
                double s = L->nb ? prm[L->bo + (size_t)o] : 0.0;
                for (c = 0; c < L->c; ++c) s += wr[c] * x[b * L->in_size + (size_t)c];
                y[b * L->out_size + (size_t)o] = s;
            }
        break;
    case MNISTCU_LAYER_CONV2D:
        for (b = 0; b < B; ++b)
            for (o = 0; o < L->oc; ++o)
                for (oy = 0; oy < L->oh; ++oy)
                    for (ox = 0; ox < L->ow; ++ox) {
                        double s = L->nb ? prm[L->bo + (size_t)o] : 0.0;
                        for (c = 0; c < L->c; ++c)
                            for (ki = 0; ki < L->kh; ++ki)
                                for (kj = 0; kj < L->kw; ++kj) {
                                    int iy = oy * L->sh - L->pad + ki, ix = ox * L->sw - L->pad + kj;
                                    if (iy < 0 || iy >= L->h || ix < 0 || ix >= L->w) continue; /* zero padding */
                                    s += prm[L->wo + (((size_t)o * L->c + c) * L->kh + ki) * L->kw + kj] *
                                         x[b * L->in_size + ((size_t)c * L->h + iy) * L->w + ix];
                                }
                        y[b * L->out_size + ((size_t)o * L->oh + oy) * L->ow + ox] = s;
                    }
        break;
    case MNISTCU_LAYER_MAXPOOL2D:
    case MNISTCU_LAYER_AVGPOOL2D:
        for (b = 0; b < B; ++b)
            for (c = 0; c < L->c; ++c)
                for (oy = 0; oy < L->oh; ++oy)
                    for (ox = 0; ox < L->ow; ++ox) {
                        double best = -HUGE_VAL, second = -HUGE_VAL, sum = 0.0;
                        for (ki = 0; ki < L->kh; ++ki)
                            for (kj = 0; kj < L->kw; ++kj) {
                                double v = x[b * L->in_size + ((size_t)c * L->h + oy * L->sh + ki) * L->w +
                                             (size_t)(ox * L->sw + kj)];
                                sum += v;
                                if (v > best) {
                                    second = best;
                                    best = v;
                                } else if (v > second) {
                                    second = v;
                                }
                            }
                        /* a tie of exact zeros (a ReLU's or dropout's) stays one under perturbation */
                        if (L->kind == MNISTCU_LAYER_MAXPOOL2D && L->kh * L->kw > 1 && (best != 0.0 || second != 0.0))
                            tl_margin_update(&mg->pool, best - second);
                        y[b * L->out_size + ((size_t)c * L->oh + oy) * L->ow + ox] =
                            L->kind == MNISTCU_LAYER_MAXPOOL2D ? best : sum / (double)(L->kh * L->kw);
                    }
        break;
    case MNISTCU_LAYER_BATCHNORM:
        for (c = 0; c < L->c; ++c) {
            double cnt = (double)(B * S), mean = 0.0, var = 0.0, inv;
            size_t s;
            if (r->train) {
                for (b = 0; b < B; ++b)
                    for (s = 0; s < S; ++s) mean += x[(b * L->c + c) * S + s];
                mean /= cnt;
                for (b = 0; b < B; ++b)
                    for (s = 0; s < S; ++s) var += (x[(b * L->c + c) * S + s] - mean) * (x[(b * L->c + c) * S + s] - mean);
                var /= cnt; /* biased, for normalising */
                if (update) {
                    L->rmean[c] = (1.0 - L->mom) * L->rmean[c] + L->mom * mean;
                    L->rvar[c] = (1.0 - L->mom) * L->rvar[c] + L->mom * var * cnt / (cnt - 1.0); /* unbiased */
                }
            } else {
                mean = L->rmean[c];
                var = L->rvar[c];
            }
            inv = 1.0 / sqrt(var + L->eps);
            for (b = 0; b < B; ++b)
                for (s = 0; s < S; ++s) {
                    size_t at = (b * L->c + c) * S + s;
                    y[at] = (x[at] - mean) * inv * prm[L->wo + (size_t)c] + prm[L->bo + (size_t)c];
                }
        }
        break;
    case MNISTCU_LAYER_DROPOUT:
        for (e = 0; e < n; ++e) {
            if (!r->train) y[e] = x[e];
            else y[e] = tl_keep(r->seed, i, r->step, e, L->p) ? x[e] * (double)(1.0f / (1.0f - L->p)) : 0.0;
        }
        break;
    case MNISTCU_LAYER_RELU:
    case MNISTCU_LAYER_LEAKY_RELU:
        for (e = 0; e < n; ++e) {
            if (x[e] != 0.0) tl_margin_update(&mg->relu, fabs(x[e])); /* exact zeros are structural */
            y[e] = x[e] > 0.0 ? x[e] : (L->kind == MNISTCU_LAYER_RELU ? 0.0 : L->slope * x[e]);
        }
        break;
    case MNISTCU_LAYER_SIGMOID:
        for (e = 0; e < n; ++e) y[e] = 1.0 / (1.0 + exp(-x[e]));
        break;
    case MNISTCU_LAYER_TANH:
        for (e = 0; e < n; ++e) y[e] = tanh(x[e]);
        break;
    case MNISTCU_LAYER_SOFTMAX: /* over dim 1: the channels at each position */
        for (b = 0; b < B; ++b)
            for (e = 0; e < S; ++e) {
                const double *xs = x + b * L->in_size + e;
                double *ys = y + b * L->in_size + e, mx = xs[0], sum = 0.0;
                for (c = 1; c < L->c; ++c)
                    if (xs[(size_t)c * S] > mx) mx = xs[(size_t)c * S];
                for (c = 0; c < L->c; ++c) sum += exp(xs[(size_t)c * S] - mx);
                for (c = 0; c < L->c; ++c) ys[(size_t)c * S] = exp(xs[(size_t)c * S] - mx) / sum;
            }
        break;
    default: /* flatten: NCHW is already [C*H*W] */
        memcpy(y, x, n * sizeof(double));
        break;
    }
}

/* Mean softmax cross-entropy of logits [B][C]. */
static double tl_ce(const double *z, const int32_t *y, size_t B, size_t C)
{
    double total = 0.0;
    size_t b, j;
    for (b = 0; b < B; ++b) {
        const double *row = z + b * C;
        double m = row[0], s = 0.0;
        for (j = 1; j < C; ++j)
            if (row[j] > m) m = row[j];
        for (j = 0; j < C; ++j) s += exp(row[j] - m);
        total += m + log(s) - row[y[b]];
    }
    return total / (double)B;
}

/* One pass over x [B][inputs] (already in act[0]); returns the loss when
   labels are given. The logits are act[n]. */
static double tl_ref_run(tl_ref *r, const double *prm, size_t B, const int32_t *labels, tl_margin *mg, int update)
{
    tl_margin unused;
    int i;
    if (!mg) mg = &unused;
    mg->relu = mg->pool = HUGE_VAL;
    for (i = 0; i < r->n; ++i) tl_layer_forward(r, i, prm, B, mg, update);
    return labels ? tl_ce(r->act[r->n], labels, B, r->classes) : 0.0;
}

static void tl_ref_input(tl_ref *r, const float *x, size_t B)
{
    size_t i;
    for (i = 0; i < B * r->inputs; ++i) r->act[0][i] = (double)x[i];
}

/* Central differences of the reference loss over parameters idx[0..count)
   (all of them when idx is NULL). */
static void tl_ref_fd(tl_ref *r, double *prm, size_t B, const int32_t *labels, double h, const size_t *idx,
                      size_t count, double *fd)
{
    size_t k;
    for (k = 0; k < count; ++k) {
        size_t i = idx ? idx[k] : k;
        double keep = prm[i], up, down;
        prm[i] = keep + h;
        up = tl_ref_run(r, prm, B, labels, NULL, 0);
        prm[i] = keep - h;
        down = tl_ref_run(r, prm, B, labels, NULL, 0);
        prm[i] = keep;
        fd[k] = (up - down) / (2.0 * h);
    }
}

/* Random parameters in the arena's layout: weights +-sqrt(3/fan_in) (unit
   variance through a layer), biases +-0.3, batch norm gamma in [0.5, 1.5] and
   beta in [-0.3, 0.3]. */
static void tl_random_params(const tl_ref *r, tu_rng *rng, float *p)
{
    int i;
    size_t k;
    for (i = 0; i < r->n; ++i) {
        const tl_rl *L = &r->L[i];
        if (L->kind == MNISTCU_LAYER_BATCHNORM) {
            for (k = 0; k < L->nw; ++k) p[L->wo + k] = (float)tu_uniform(rng, 0.5, 1.5);
            for (k = 0; k < L->nb; ++k) p[L->bo + k] = (float)tu_uniform(rng, -0.3, 0.3);
        } else if (L->nw) {
            double bound = sqrt(3.0 / (double)(L->nw / (size_t)L->oc));
            for (k = 0; k < L->nw; ++k) p[L->wo + k] = (float)tu_uniform(rng, -bound, bound);
            for (k = 0; k < L->nb; ++k) p[L->bo + k] = (float)tu_uniform(rng, -0.3, 0.3);
        }
    }
}

/* ========================================================================== */
/*        Library against reference: forward logits and gradients             */
/* ========================================================================== */
/* Criteria |got - ref| <= atol + rtol*|ref|. The library computes in float32;
   the reference and its central differences (step TL_FD_STEP, truncation and
   rounding error below 1e-9) in double, so the differences measure the
   library's float error. The FD check is only trusted away from kinks: the
   inputs are redrawn until every ReLU/LeakyReLU input and every max pool's
   top-2 gap is at least TL_MARGIN (100x the step, and far above the float
   error of a pre-activation, so that the library takes the same branch).
   Measured over the 86 cases (run with -v to print each and the worst):
     CPU (2 threads):  logits max |d| 1.1e-6 (fashion-cnn), worst |d|/tol 0.24;
                       gradients max |g - fd| 4.0e-7, worst |d|/tol 0.12
     GPU (H100, cuBLAS): logits worst |d|/tol 0.05; gradients max |g - fd|
                       4.7e-7, worst |d|/tol 0.24 (batch norm, batch 3)
   so the tolerances keep a margin of about 4x and still fail gradients off by
   0.1% and logits off by 1e-4 (checks_detect_errors). */
#define TL_FD_STEP 1e-6
#define TL_MARGIN 1e-4
#define TL_FWD_ATOL 3e-6
#define TL_FWD_RTOL 3e-5
#define TL_GRAD_ATOL 1e-6
#define TL_GRAD_RTOL 1e-4
#define TL_LOSS_RTOL 1e-5

typedef struct tl_gstat {
    size_t nbad, worst;     /* failing elements, the worst one */
    double worst_score;     /* max |g - ref| / (atol + rtol |ref|) */
    double max_abs;         /* max |g - ref| */
    double max_rel;         /* max |g - ref| / |ref| over |ref| > 1e-3 */
    double max_ref;         /* max |ref| */
} tl_gstat;

/* 1 when every element meets the criterion (NaN never does). */
static int tl_compare(const float *g, const double *ref, size_t n, double atol, double rtol, tl_gstat *st)
{
    size_t i;
    memset(st, 0, sizeof *st);
    for (i = 0; i < n; ++i) {
        double e = fabs((double)g[i] - ref[i]), tol = atol + rtol * fabs(ref[i]), score = e / tol;
        if (score != score) score = HUGE_VAL;
        if (e > st->max_abs || e != e) st->max_abs = e;
        if (fabs(ref[i]) > st->max_ref) st->max_ref = fabs(ref[i]);
        if (fabs(ref[i]) > 1e-3 && e / fabs(ref[i]) > st->max_rel) st->max_rel = e / fabs(ref[i]);
        if (!(e <= tol)) st->nbad++;
        if (score > st->worst_score) {
            st->worst_score = score;
            st->worst = i;
        }
    }
    return st->nbad == 0;
}

typedef struct tl_case {
    const char *spec;   /* the architecture, in tl_parse's grammar */
    size_t B;           /* batch */
    int eval;           /* 1: EVAL mode, batch norm with random running statistics, no dropout */
    uint64_t seed;      /* inputs, parameters, labels */
    size_t subset;      /* 0: check every parameter's gradient; else this many random ones;
                           TL_FORWARD_ONLY: the logits only */
} tl_case;

#define TL_FORWARD_ONLY ((size_t)-1)

typedef struct tl_result {
    size_t np, nchk, classes, B;
    size_t *idx;        /* checked parameters */
    float *g;           /* the library's gradients at idx */
    double *fd;         /* central differences of the reference at idx */
    float *logits;      /* the library's forward [B][classes] */
    double *ref_logits;
    double loss_lib, loss_ref;
    tl_margin mg;
    int attempts;       /* input draws until the kinks were far enough */
} tl_result;

static void tl_result_free(tl_result *r)
{
    free(r->idx);
    free(r->g);
    free(r->fd);
    free(r->logits);
    free(r->ref_logits);
    memset(r, 0, sizeof *r);
}

/* Builds the case's model from tl_parse's desc, sets random parameters (and,
   in EVAL mode, random running statistics), draws inputs away from the kinks,
   and fills res with the library's logits, loss and gradients and the
   reference's. Returns 0 with tu_msg set on a failure to run. */
static int tl_case_run(const tl_case *c, tl_result *res, int line)
{
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    tl_ref r;
    tu_rng rng = tu_rng_make(c->seed);
    float *p = NULL, *x = NULL, *gall = NULL, *tmp = NULL;
    double *pd = NULL;
    int32_t *y = NULL;
    size_t i, k;
    int ok = 0, li;
    char name[64];
    memset(res, 0, sizeof *res);
    memset(&r, 0, sizeof r);
    if (!ctx) {
        tu_setf(line, "%s: no context", c->spec);
        goto done;
    }
    if (!tl_parse(c->spec, &d)) {
        tu_setf(line, "%s: the test's parser rejects it", c->spec);
        goto done;
    }
    if (!tl_ref_make(&r, &d, line)) goto done;
    if (mnistcu_model_create(ctx, &d, &m) != MNISTCU_OK) {
        tu_setf(line, "%s: create: %s", c->spec, mnistcu_ctx_error(ctx));
        goto done;
    }
    if (mnistcu_model_num_params(m) != r.np) {
        tu_setf(line, "%s: num_params %lu, reference %lu", c->spec, (unsigned long)mnistcu_model_num_params(m),
                (unsigned long)r.np);
        goto done;
    }
    res->np = r.np;
    res->classes = r.classes;
    res->B = c->B;
    res->nchk = c->subset == TL_FORWARD_ONLY ? 0 : c->subset && c->subset < r.np ? c->subset : r.np;
    p = tl_falloc(r.np);
    gall = tl_falloc(r.np);
    y = (int32_t *)malloc(c->B * sizeof(int32_t));
    res->idx = (size_t *)malloc((res->nchk ? res->nchk : 1) * sizeof(size_t));
    res->g = tl_falloc(res->nchk);
    res->fd = tl_dalloc(res->nchk);
    res->logits = tl_falloc(c->B * r.classes);
    res->ref_logits = tl_dalloc(c->B * r.classes);
    pd = tl_dalloc(r.np);
    if (!p || !gall || !y || !res->idx || !res->g || !res->fd || !res->logits || !res->ref_logits || !pd ||
        !tl_ref_reserve(&r, c->B)) {
        tu_setf(line, "malloc");
        goto done;
    }
    tl_random_params(&r, &rng, p);
    if (mnistcu_model_set_params(m, p, r.np) != MNISTCU_OK) {
        tu_setf(line, "%s: set_params: %s", c->spec, mnistcu_ctx_error(ctx));
        goto done;
    }
    for (i = 0; i < r.np; ++i) pd[i] = (double)p[i];
    for (k = 0; k < res->nchk; ++k) res->idx[k] = res->nchk == r.np ? k : (size_t)(tu_next(&rng) % r.np);
    for (i = 0; i < c->B; ++i) y[i] = (int32_t)(tu_next(&rng) % (uint64_t)r.classes);
    r.step = mnistcu_model_steps(m);
    if (c->eval) {
        mnistcu_model_set_mode(m, MNISTCU_MODE_EVAL);
        r.train = 0;
        for (li = 0; li < r.n; ++li) {
            tl_rl *L = &r.L[li];
            if (L->kind != MNISTCU_LAYER_BATCHNORM) continue;
            free(tmp);
            tmp = tl_falloc((size_t)L->c * 2);
            if (!tmp) {
                tu_setf(line, "malloc");
                goto done;
            }
            for (k = 0; k < (size_t)L->c; ++k) {
                tmp[k] = (float)tu_uniform(&rng, -0.5, 0.5);
                tmp[L->c + k] = (float)tu_uniform(&rng, 0.5, 2.0);
                L->rmean[k] = (double)tmp[k];
                L->rvar[k] = (double)tmp[L->c + k];
            }
            snprintf(name, sizeof name, "%d.running_mean", li);
            if (mnistcu_model_set_tensor(m, name, tmp, (size_t)L->c) != MNISTCU_OK) {
                tu_setf(line, "%s: set_tensor %s: %s", c->spec, name, mnistcu_ctx_error(ctx));
                goto done;
            }
            snprintf(name, sizeof name, "%d.running_var", li);
            if (mnistcu_model_set_tensor(m, name, tmp + L->c, (size_t)L->c) != MNISTCU_OK) {
                tu_setf(line, "%s: set_tensor %s: %s", c->spec, name, mnistcu_ctx_error(ctx));
                goto done;
            }
        }
    }
    for (res->attempts = 1;; ++res->attempts) {
        free(x);
        x = tu_random_floats(&rng, c->B * r.inputs, -1.0f, 1.0f);
        if (!x) {
            tu_setf(line, "malloc");
            goto done;
        }
        tl_ref_input(&r, x, c->B);
        res->loss_ref = tl_ref_run(&r, pd, c->B, y, &res->mg, 0);
        /* the forward pass is continuous at the kinks: only gradients need a margin */
        if (res->nchk == 0 || (res->mg.relu >= TL_MARGIN && res->mg.pool >= TL_MARGIN)) break;
        if (res->attempts == 500) {
            tu_setf(line, "%s: no inputs found with every kink %g away (relu %.3g, pool %.3g)", c->spec, TL_MARGIN,
                    res->mg.relu, res->mg.pool);
            goto done;
        }
    }
    memcpy(res->ref_logits, r.act[r.n], c->B * r.classes * sizeof(double));
    if (mnistcu_model_forward(m, x, c->B, res->logits) != MNISTCU_OK) {
        tu_setf(line, "%s: forward: %s", c->spec, mnistcu_ctx_error(ctx));
        goto done;
    }
    if (mnistcu_model_compute_grads(m, x, y, c->B, &res->loss_lib) != MNISTCU_OK ||
        mnistcu_model_get_grads(m, gall, r.np) != MNISTCU_OK) {
        tu_setf(line, "%s: compute_grads: %s", c->spec, mnistcu_ctx_error(ctx));
        goto done;
    }
    for (k = 0; k < res->nchk; ++k) res->g[k] = gall[res->idx[k]];
    tl_ref_fd(&r, pd, c->B, y, TL_FD_STEP, res->idx, res->nchk, res->fd);
    ok = 1;
done:
    free(p);
    free(x);
    free(y);
    free(pd);
    free(gall);
    free(tmp);
    tl_ref_free(&r);
    mnistcu_ctx_destroy(ctx);
    return ok;
}

/* The worst values seen over every case, printed at the end with -v. */
typedef struct tl_measured {
    double fwd_abs, fwd_rel, fwd_score, grad_abs, grad_rel, grad_score, loss_rel;
    int cases;
} tl_measured;
static tl_measured tl_worst;

static void tl_measure(double *slot, double v)
{
    if (v > *slot) *slot = v;
}

/* Runs a case and checks logits, loss and gradients. */
static int tl_case_check(const tl_case *c, int line)
{
    tl_result res;
    tl_gstat fs, gs;
    int ok = 0;
    double lrel;
    if (!tl_case_run(c, &res, line)) goto done;
    lrel = fabs(res.loss_lib - res.loss_ref) / fabs(res.loss_ref);
    if (!tl_compare(res.logits, res.ref_logits, res.B * res.classes, TL_FWD_ATOL, TL_FWD_RTOL, &fs)) {
        tu_setf(line, "%s (batch %lu%s): %lu of %lu logits off; worst [sample %lu, class %lu]: library %.9g, "
                      "reference %.9g",
                c->spec, (unsigned long)c->B, c->eval ? ", eval" : "", (unsigned long)fs.nbad,
                (unsigned long)(res.B * res.classes), (unsigned long)(fs.worst / res.classes),
                (unsigned long)(fs.worst % res.classes), (double)res.logits[fs.worst], res.ref_logits[fs.worst]);
        goto done;
    }
    if (!(lrel <= TL_LOSS_RTOL)) {
        tu_setf(line, "%s (batch %lu): loss %.9g, reference %.9g (rel err %.3g)", c->spec, (unsigned long)c->B,
                res.loss_lib, res.loss_ref, lrel);
        goto done;
    }
    ok = tl_compare(res.g, res.fd, res.nchk, TL_GRAD_ATOL, TL_GRAD_RTOL, &gs);
    tl_measure(&tl_worst.fwd_abs, fs.max_abs);
    tl_measure(&tl_worst.fwd_rel, fs.max_rel);
    tl_measure(&tl_worst.fwd_score, fs.worst_score);
    tl_measure(&tl_worst.grad_abs, gs.max_abs);
    tl_measure(&tl_worst.grad_rel, gs.max_rel);
    tl_measure(&tl_worst.grad_score, gs.worst_score);
    tl_measure(&tl_worst.loss_rel, lrel);
    tl_worst.cases++;
    if (GREATEST_IS_VERBOSE())
        printf("  %-58s B=%lu%s %5lu/%5lu params: max|fd| %.2g |g-fd| %.2g rel %.2g score %.2g; logits "
               "|d| %.2g score %.2g; draws %d\n",
               c->spec, (unsigned long)c->B, c->eval ? " eval" : "", (unsigned long)res.nchk, (unsigned long)res.np,
               gs.max_ref, gs.max_abs, gs.max_rel, gs.worst_score, fs.max_abs, fs.worst_score, res.attempts);
    if (!ok)
        tu_setf(line, "%s (batch %lu%s): %lu of %lu gradients off; worst: parameter %lu: library %.9g, finite "
                      "difference %.9g (|err| %.3g > %.3g + %.3g*|fd|)",
                c->spec, (unsigned long)c->B, c->eval ? ", eval" : "", (unsigned long)gs.nbad,
                (unsigned long)res.nchk, (unsigned long)res.idx[gs.worst], (double)res.g[gs.worst],
                res.fd[gs.worst], fabs((double)res.g[gs.worst] - res.fd[gs.worst]), TL_GRAD_ATOL, TL_GRAD_RTOL);
done:
    tl_result_free(&res);
    return ok;
}

static int tl_cases_check(const tl_case *cases, size_t count, int line)
{
    size_t i;
    for (i = 0; i < count; ++i)
        if (!tl_case_check(&cases[i], line)) return 0;
    return 1;
}

#define TL_CASES(cases) tl_cases_check(cases, sizeof cases / sizeof cases[0], __LINE__)

/* ========================================================================== */
/*       One test per layer kind: forward and gradients, every option         */
/* ========================================================================== */
TEST kind_dense(void)
{
    static const tl_case cases[] = {
        {"7 dense5 tanh dense3", 3, 0, 201, 0},
        {"7 dense5 tanh dense3", 1, 0, 202, 0},
        {"7 dense6:bias=0 sigmoid dense4:bias=0", 5, 0, 203, 0},
        {"9 dense4", 5, 0, 204, 0},
        {"1x1x6 dense5 relu dense2", 3, 0, 205, 0},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

TEST kind_conv2d(void)
{
    static const tl_case cases[] = {
        {"2x7x6 conv3x3x3 flatten dense3", 3, 0, 211, 0},                 /* odd sizes, no activation */
        {"2x7x7 conv3x3x4:s=2:p=1 tanh flatten dense3", 1, 0, 212, 0},    /* stride and padding */
        {"2x7x7 conv3x3x4:s=2:p=1 tanh flatten dense3", 5, 0, 213, 0},
        {"1x6x8 conv2x4x3:p=1 sigmoid flatten dense3", 3, 0, 214, 0},     /* rectangular kernel */
        {"3x5x6 conv3x2x2:bias=0:s=2 relu flatten dense3", 3, 0, 215, 0}, /* no bias, relu folded */
        {"2x8x7 conv4x3x2:s=3:p=2 flatten dense3", 5, 0, 216, 0},         /* stride 3, padding 2 */
        {"3x4x4 conv1x1x2 flatten dense2", 3, 0, 217, 0},                 /* 1x1 kernel */
        {"1x6x6 conv3x3x3 tanh conv2x2x2:p=1 flatten dense3", 3, 0, 218, 0}, /* dx through a conv */
        {"1x5x5 conv5x5x4:p=0 flatten dense3", 1, 0, 219, 0},             /* kernel = map: 1x1 output */
        {"1x8x8 conv2x2x2 tanh conv3x3x3:s=2:p=1 flatten dense3", 3, 0, 220, 0}, /* dx through stride, padding */
        {"2x9x8 conv1x1x2 sigmoid conv3x2x2:s=3:p=2:bias=0 flatten dense3", 5, 0, 228, 0},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

/* Max pool: windows with stride < kernel overlap, so an input can be the max
   of several windows (backward sums them); floor mode drops the last rows. */
TEST kind_maxpool2d(void)
{
    static const tl_case cases[] = {
        {"1x6x6 conv2x2x2 maxpool flatten dense3", 3, 0, 221, 0},           /* default kernel 2 */
        {"1x8x8 conv2x2x2 maxpool3:s=2 flatten dense3", 3, 0, 222, 0},      /* overlapping, odd 7x7 */
        {"1x8x8 conv2x2x2 maxpool3:s=1 flatten dense3", 1, 0, 223, 0},      /* heavy overlap */
        {"2x7x8 conv2x2x2 maxpool2x3 flatten dense3", 5, 0, 224, 0},        /* rectangular, stride (2,3) */
        {"1x8x9 conv2x2x2 maxpool3x2:s=2 flatten dense3", 3, 0, 225, 0},    /* rectangular, overlapping */
        {"1x9x9 conv2x2x2 maxpool2:s=3 flatten dense3", 3, 0, 226, 0},      /* stride > kernel: gaps */
        {"1x7x7 conv2x2x2 tanh maxpool3 flatten dense3", 3, 0, 227, 0},     /* 6x6 -> 2x2 */
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

TEST kind_avgpool2d(void)
{
    static const tl_case cases[] = {
        {"1x6x6 conv2x2x2 avgpool flatten dense3", 3, 0, 231, 0},
        {"1x8x8 conv2x2x2 avgpool3:s=2 flatten dense3", 3, 0, 232, 0},
        {"1x8x8 conv2x2x2 avgpool3:s=1 flatten dense3", 1, 0, 233, 0},
        {"2x7x8 conv2x2x2 avgpool2x3 flatten dense3", 5, 0, 234, 0},
        {"1x8x9 conv2x2x2 avgpool3x2:s=2 flatten dense3", 3, 0, 235, 0},
        {"1x9x9 conv2x2x2 avgpool2:s=3 flatten dense3", 3, 0, 236, 0},
        {"2x5x5 avgpool2 flatten dense3", 3, 0, 237, 0}, /* on the input: no gradient through it */
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

/* Batch norm in TRAIN mode (batch statistics, the gradient through the mean
   and variance) and EVAL mode (fixed running statistics), 2-D and 1-D. */
TEST kind_batchnorm(void)
{
    static const tl_case cases[] = {
        {"2x5x5 conv3x3x3 batchnorm relu flatten dense3", 3, 0, 241, 0},
        {"2x5x5 conv3x3x3 batchnorm relu flatten dense3", 1, 0, 242, 0}, /* 2-D: batch 1 has 9 values a channel */
        {"2x5x5 conv3x3x3 batchnorm:eps=0.01:momentum=0.2 tanh flatten dense3", 5, 0, 243, 0},
        {"6 dense5 batchnorm tanh dense3", 5, 0, 244, 0},                 /* BatchNorm1d */
        {"6 dense5 batchnorm:eps=0.001 dense3", 3, 0, 245, 0},
        {"6 dense5 batchnorm tanh dense3", 2, 0, 246, 0},                 /* the smallest 1-D batch */
        {"3x4x4 batchnorm flatten dense3", 3, 0, 247, 0},                 /* first layer: only gamma, beta */
        {"2x5x5 conv3x3x3 batchnorm relu flatten dense3", 3, 1, 248, 0},  /* EVAL */
        {"2x5x5 conv3x3x3 batchnorm relu flatten dense3", 1, 1, 249, 0},
        {"6 dense5 batchnorm:eps=0.01 tanh dense3", 1, 1, 250, 0},        /* EVAL 1-D, batch 1 */
        {"6 dense5 batchnorm tanh dense3", 5, 1, 251, 0},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

/* Dropout in TRAIN mode with the mask of step 0 (compute_grads does not
   advance the step, so the forward and the gradients see the same mask). */
TEST kind_dropout(void)
{
    static const tl_case cases[] = {
        {"6 dense8 dropout0.3 dense3", 3, 0, 261, 0},
        {"6 dense8 tanh dropout dense3", 5, 0, 262, 0},                    /* p 0.5 */
        {"2x5x5 conv3x3x3 dropout0.25 flatten dense3", 3, 0, 263, 0},      /* on maps */
        {"6 dense8 dropout0.9 dense3", 1, 0, 264, 0},
        {"6 dense8 dropout0.3 dropout0.4 dense3", 3, 0, 265, 0},           /* two layers: two masks */
        {"6 dense8 dropout0.3 dense3", 3, 1, 266, 0},                      /* EVAL: the identity */
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

/* Flatten reads [C][H][W] in NCHW order: the dense weights' gradients check it. */
TEST kind_flatten(void)
{
    static const tl_case cases[] = {
        {"2x3x4 conv1x1x3 flatten dense3", 3, 0, 271, 0},
        {"2x3x4 flatten dense3", 5, 0, 272, 0},
        {"5 flatten dense3", 3, 0, 273, 0}, /* flat input: nothing to do */
        {"2x4x3 conv2x2x2 flatten tanh dense3", 1, 0, 274, 0},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

/* ReLU folded into the layer before (dense, conv) and standing alone (after a
   pool, after batch norm, first layer). */
TEST kind_relu(void)
{
    static const tl_case cases[] = {
        {"6 dense7 relu dense3", 3, 0, 281, 0},
        {"1x6x6 conv3x3x2 relu flatten dense3", 3, 0, 282, 0},
        {"1x7x7 conv2x2x2 avgpool2 relu flatten dense3", 5, 0, 283, 0},
        {"6 dense7 batchnorm relu dense3", 3, 0, 284, 0},
        {"6 relu dense3", 3, 0, 285, 0},
        {"6 dense7 relu relu dense3", 1, 0, 286, 0},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

TEST kind_leaky_relu(void)
{
    static const tl_case cases[] = {
        {"6 dense7 leaky_relu dense3", 3, 0, 291, 0},               /* slope 0.01 */
        {"6 dense7 leaky_relu0.2 dense3", 5, 0, 292, 0},
        {"1x6x6 conv3x3x2 leaky_relu0.3 flatten dense3", 3, 0, 293, 0},
        {"6 dense7 leaky_relu-0.5 dense3", 1, 0, 294, 0},           /* negative slope */
        {"6 dense7 leaky_relu1.5 dense3", 3, 0, 295, 0},            /* slope above 1 */
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

TEST kind_sigmoid(void)
{
    static const tl_case cases[] = {
        {"6 dense7 sigmoid dense3", 3, 0, 301, 0},
        {"1x6x6 conv3x3x2 sigmoid flatten dense3", 3, 0, 302, 0},
        {"1x7x7 conv2x2x2 maxpool2 sigmoid flatten dense3", 5, 0, 303, 0},
        {"6 dense7 sigmoid sigmoid dense3", 1, 0, 304, 0},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

TEST kind_tanh(void)
{
    static const tl_case cases[] = {
        {"6 dense7 tanh dense3", 3, 0, 311, 0},
        {"1x6x6 conv3x3x2 tanh flatten dense3", 3, 0, 312, 0},
        {"1x7x7 conv2x2x2 avgpool2 tanh flatten dense3", 5, 0, 313, 0},
        {"6 dense7 batchnorm tanh dense3", 3, 0, 314, 0},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

/* Softmax over dim 1: the features of flat data, the channels at each
   position of a map; also as the last layer (the loss then applies its own
   softmax to the probabilities). */
TEST kind_softmax(void)
{
    static const tl_case cases[] = {
        {"6 dense5 softmax dense3", 3, 0, 321, 0},
        {"2x4x4 conv3x3x3 softmax flatten dense3", 3, 0, 322, 0},
        {"2x4x5 conv2x2x4 softmax conv2x2x2 flatten dense3", 5, 0, 323, 0},
        {"6 dense4 softmax", 5, 0, 324, 0},
        {"6 dense5 softmax dense3", 1, 0, 325, 0},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

/* Max pool with tied maxima (which the finite-difference cases avoid): the
   forward value is the max either way, the backward pass routes the gradient
   to the first maximum in row-major window order. Seen through a 1x1 conv
   from two channels with weights {1, 0}: the pooled values are channel 0,
   full of ties, while the gradient of the weight of channel 1 sums channel 1
   at the positions the gradient was routed to. */
TEST maxpool_ties_route_to_first(void)
{
    /* tie patterns in window order (0,0) (0,1) (1,0) (1,1) */
    static const int ties[4][4] = {{0, 1, 1, 0}, {1, 0, 0, 1}, {0, 0, 1, 1}, {1, 1, 1, 1}};
    const size_t B = 2;
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    tl_ref r;
    tu_rng rng = tu_rng_make(231);
    float x[2 * 2 * 16], p[18], g[18], logits[6], best;
    double pd[18], delta[2][4], z, gfirst = 0.0, glast = 0.0, gsum = 0.0;
    int32_t y[2] = {2, 0};
    size_t b, i, k;
    int failed = 0, o, wi, wj, first, last, at;
    memset(&r, 0, sizeof r);
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(tl_parse("2x4x4 conv1x1x1 maxpool2 flatten dense3", &d), "parse");
    TU_REQUIRE_OK(tl_ref_make(&r, &d, __LINE__));
    TU_REQUIRE(r.np == 18 && tl_ref_reserve(&r, B), "reference");
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "create");
    /* channel 0: every window has tied maxima; channel 1: distinct values */
    for (b = 0; b < B; ++b)
        for (o = 0; o < 4; ++o) {
            int pat = (o + (int)b) % 4;
            float top = (float)tu_uniform(&rng, 0.0, 1.0);
            for (wi = 0; wi < 2; ++wi)
                for (wj = 0; wj < 2; ++wj) {
                    at = ((o / 2) * 2 + wi) * 4 + (o % 2) * 2 + wj;
                    x[b * 32 + (size_t)at] = ties[pat][wi * 2 + wj] ? top : top - (float)tu_uniform(&rng, 0.1, 1.0);
                    x[b * 32 + 16 + (size_t)at] = (float)tu_uniform(&rng, -2.0, 2.0);
                }
        }
    p[0] = 1.0f;
    p[1] = 0.0f;
    p[2] = 0.0f;
    for (i = 3; i < 18; ++i) p[i] = (float)tu_uniform(&rng, -1.0, 1.0);
    for (i = 0; i < 18; ++i) pd[i] = (double)p[i];
    TU_REQUIRE(mnistcu_model_set_params(m, p, 18) == MNISTCU_OK, "set_params");
    TU_REQUIRE(mnistcu_model_forward(m, x, B, logits) == MNISTCU_OK, "forward");
    TU_REQUIRE(mnistcu_model_compute_grads(m, x, y, B, NULL) == MNISTCU_OK && mnistcu_model_get_grads(m, g, 18) == MNISTCU_OK,
               "compute_grads");
    tl_ref_input(&r, x, B);
    tl_ref_run(&r, pd, B, y, NULL, 0);
    for (i = 0; i < B * 3; ++i)
        TU_REQUIRE(fabs((double)logits[i] - r.act[r.n][i]) <= TL_FWD_ATOL + TL_FWD_RTOL * fabs(r.act[r.n][i]),
                   "logit %lu: %.9g, reference %.9g", (unsigned long)i, (double)logits[i], r.act[r.n][i]);
    /* delta[b][o] = dL/d(pooled o): (softmax - onehot)/B through the dense weights (at 3, [3][4]) */
    for (b = 0; b < B; ++b) {
        const double *zr = r.act[r.n] + b * 3;
        double mx = zr[0], sum = 0.0, pr[3];
        for (k = 1; k < 3; ++k) mx = zr[k] > mx ? zr[k] : mx;
        for (k = 0; k < 3; ++k) sum += (pr[k] = exp(zr[k] - mx));
        for (o = 0; o < 4; ++o) {
            delta[b][o] = 0.0;
            for (k = 0; k < 3; ++k) {
                z = (pr[k] / sum - (k == (size_t)y[b] ? 1.0 : 0.0)) / (double)B;
                delta[b][o] += z * pd[3 + k * 4 + (size_t)o];
            }
            gsum += delta[b][o];
            /* the window's maximum, then its first and last position in row-major order */
            best = -HUGE_VALF;
            for (wi = 0; wi < 4; ++wi) {
                at = ((o / 2) * 2 + wi / 2) * 4 + (o % 2) * 2 + wi % 2;
                best = x[b * 32 + (size_t)at] > best ? x[b * 32 + (size_t)at] : best;
            }
            first = last = -1;
            for (wi = 0; wi < 4; ++wi) {
                at = ((o / 2) * 2 + wi / 2) * 4 + (o % 2) * 2 + wi % 2;
                if (x[b * 32 + (size_t)at] == best) {
                    if (first < 0) first = at;
                    last = at;
                }
            }
            gfirst += delta[b][o] * (double)x[b * 32 + 16 + (size_t)first];
            glast += delta[b][o] * (double)x[b * 32 + 16 + (size_t)last];
        }
    }
    TU_REQUIRE(fabs(gfirst - glast) > 100.0 * (TL_GRAD_ATOL + TL_GRAD_RTOL * fabs(gfirst)),
               "the case cannot tell first from last (%.9g vs %.9g)", gfirst, glast);
    TU_REQUIRE(fabs((double)g[1] - gfirst) <= TL_GRAD_ATOL + TL_GRAD_RTOL * fabs(gfirst),
               "the gradient went elsewhere than the first maximum: weight of channel 1: %.9g; first max %.9g, "
               "last max %.9g", (double)g[1], gfirst, glast);
    TU_REQUIRE(fabs((double)g[2] - gsum) <= TL_GRAD_ATOL + TL_GRAD_RTOL * fabs(gsum),
               "conv bias gradient %.9g, expected %.9g (each window routes its gradient once)", (double)g[2], gsum);
done:
    tl_ref_free(&r);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* ---- the table of per-kind tests, indexed by kind ----------------------- */
typedef greatest_test_res (*tl_test_fn)(void);
typedef struct tl_kind_test {
    mnistcu_layer_kind kind;
    const char *name;
    tl_test_fn fn;
} tl_kind_test;

/* Entry k-1 tests kind k. A kind added to MNISTCU_LAYER_LIST without a test
   here changes MNISTCU_LAYER_KIND_COUNT and fails every_kind_has_a_test. */
static const tl_kind_test tl_kind_tests[] = {
    {MNISTCU_LAYER_DENSE, "kind_dense", kind_dense},
    {MNISTCU_LAYER_CONV2D, "kind_conv2d", kind_conv2d},
    {MNISTCU_LAYER_MAXPOOL2D, "kind_maxpool2d", kind_maxpool2d},
    {MNISTCU_LAYER_AVGPOOL2D, "kind_avgpool2d", kind_avgpool2d},
    {MNISTCU_LAYER_BATCHNORM, "kind_batchnorm", kind_batchnorm},
    {MNISTCU_LAYER_DROPOUT, "kind_dropout", kind_dropout},
    {MNISTCU_LAYER_FLATTEN, "kind_flatten", kind_flatten},
    {MNISTCU_LAYER_RELU, "kind_relu", kind_relu},
    {MNISTCU_LAYER_LEAKY_RELU, "kind_leaky_relu", kind_leaky_relu},
    {MNISTCU_LAYER_SIGMOID, "kind_sigmoid", kind_sigmoid},
    {MNISTCU_LAYER_TANH, "kind_tanh", kind_tanh},
    {MNISTCU_LAYER_SOFTMAX, "kind_softmax", kind_softmax},
};
#define TL_KIND_TESTS (sizeof tl_kind_tests / sizeof tl_kind_tests[0])

TEST every_kind_has_a_test(void)
{
    size_t i;
    ASSERT_EQ_FMTm("the table of per-kind tests must have one entry per layer kind",
                   (size_t)(MNISTCU_LAYER_KIND_COUNT - 1), TL_KIND_TESTS, "%lu");
    for (i = 0; i < TL_KIND_TESTS; ++i) {
        ASSERT_EQ_FMT((int)(i + 1), (int)tl_kind_tests[i].kind, "%d");
        ASSERT(tl_kind_tests[i].fn != NULL);
    }
    PASS();
}

/* ---- whole CNNs ------------------------------------------------------------ */
#define TL_MINI_LENET "1x12x12 conv3x3x4 relu maxpool2 conv3x3x8 relu maxpool2 flatten dense16 relu dense10"
/* Every kind in one model: 2-D and 1-D batch norm, both pools, dropout on maps,
   a rectangular pool, a conv without bias, activations folded and standalone. */
#define TL_EVERY_KIND                                                                                          \
    "2x9x9 conv3x3x4:p=1 batchnorm leaky_relu0.1 maxpool3:s=2 conv2x2x4:bias=0 tanh avgpool2x1:s=1 dropout0.25 " \
    "flatten dense12 sigmoid dense10 relu batchnorm softmax dense6"
#define TL_LENET5 "1x28x28 conv5x5x6 relu maxpool2 conv5x5x16 relu maxpool2 flatten dense120 relu dense84 relu dense10"
#define TL_FASHION_CNN "1x28x28 conv3x3x64 maxpool2 relu conv3x3x128 maxpool2 relu flatten dense256 relu dense10"

TEST cnn_mini_lenet(void)
{
    static const tl_case cases[] = {
        {TL_MINI_LENET, 1, 0, 401, 0},
        {TL_MINI_LENET, 3, 0, 402, 0},
        {TL_MINI_LENET, 5, 0, 403, 0},
        {"1x12x12 conv5x5x6:p=2 relu maxpool2 conv5x5x16 relu maxpool2 flatten dense32 relu dense10", 3, 0, 404, 600},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

TEST cnn_every_kind(void)
{
    static const tl_case cases[] = {
        {TL_EVERY_KIND, 3, 0, 411, 0},
        {TL_EVERY_KIND, 5, 0, 412, 0},
        {TL_EVERY_KIND, 1, 1, 413, 0}, /* EVAL: running statistics, no dropout; batch 1 */
        {TL_EVERY_KIND, 3, 1, 414, 0},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

/* The presets at full size: LeNet-5's gradients on a random subset of its
   44,426 parameters, fashion-cnn's logits. */
TEST cnn_presets(void)
{
    static const tl_case cases[] = {
        {TL_LENET5, 2, 0, 421, 300},
        {TL_FASHION_CNN, 2, 0, 422, TL_FORWARD_ONLY},
        {TL_FASHION_CNN, 3, 1, 423, TL_FORWARD_ONLY},
    };
    if (!TL_CASES(cases)) FAILm(tu_msg);
    PASS();
}

/* The checks have teeth: the same comparisons fail on gradients that are off
   by 0.1%, on one wrong element, on a kernel stored transposed, on NaN, and on
   logits off by 1e-4. */
TEST checks_detect_errors(void)
{
    tl_case c;
    tl_result r;
    tl_gstat st;
    float *bad = NULL;
    size_t i, big = 0, kh, kw;
    int failed = 0;
    c.spec = TL_MINI_LENET;
    c.B = 3;
    c.eval = 0;
    c.seed = 402;
    c.subset = 0;
    memset(&r, 0, sizeof r);
    TU_REQUIRE_OK(tl_case_run(&c, &r, __LINE__));
    bad = tl_falloc(r.nchk + r.B * r.classes);
    TU_REQUIRE(bad != NULL, "malloc");
    TU_REQUIRE(tl_compare(r.g, r.fd, r.nchk, TL_GRAD_ATOL, TL_GRAD_RTOL, &st),
               "the unmodified gradients fail (worst %.3g)", st.worst_score);
    for (i = 0; i < r.nchk; ++i)
        if (fabs(r.fd[i]) > fabs(r.fd[big])) big = i;
    for (i = 0; i < r.nchk; ++i) bad[i] = r.g[i] * 1.001f;
    TU_REQUIRE(!tl_compare(bad, r.fd, r.nchk, TL_GRAD_ATOL, TL_GRAD_RTOL, &st), "gradients * 1.001 pass");
    for (i = 0; i < r.nchk; ++i) bad[i] = r.g[i];
    bad[r.nchk / 2] += (float)(1e-3 * fabs(r.fd[big]));
    TU_REQUIRE(!tl_compare(bad, r.fd, r.nchk, TL_GRAD_ATOL, TL_GRAD_RTOL, &st), "one perturbed element passes");
    TU_REQUIRE(st.nbad == 1 && st.worst == r.nchk / 2, "the perturbed element not singled out (%lu bad, worst %lu)",
               (unsigned long)st.nbad, (unsigned long)st.worst);
    /* the first conv's 3x3 kernels transposed ([out][in][kw][kh]): a layout error */
    for (i = 0; i < r.nchk; ++i) bad[i] = r.g[i];
    for (i = 0; i < 4; ++i)
        for (kh = 0; kh < 3; ++kh)
            for (kw = 0; kw < 3; ++kw) bad[i * 9 + kh * 3 + kw] = r.g[i * 9 + kw * 3 + kh];
    TU_REQUIRE(!tl_compare(bad, r.fd, r.nchk, TL_GRAD_ATOL, TL_GRAD_RTOL, &st), "transposed kernels pass");
    for (i = 0; i < r.nchk; ++i) bad[i] = r.g[i];
    bad[0] = tu_nan();
    TU_REQUIRE(!tl_compare(bad, r.fd, r.nchk, TL_GRAD_ATOL, TL_GRAD_RTOL, &st), "NaN passes");
    /* logits */
    TU_REQUIRE(tl_compare(r.logits, r.ref_logits, r.B * r.classes, TL_FWD_ATOL, TL_FWD_RTOL, &st),
               "the unmodified logits fail");
    for (i = 0; i < r.B * r.classes; ++i) bad[i] = r.logits[i];
    bad[r.classes + 1] += (float)(1e-4 * (1.0 + fabs(r.ref_logits[r.classes + 1])));
    TU_REQUIRE(!tl_compare(bad, r.ref_logits, r.B * r.classes, TL_FWD_ATOL, TL_FWD_RTOL, &st),
               "a logit off by 1e-4 passes");
    TU_REQUIRE(st.nbad == 1 && st.worst == r.classes + 1, "the perturbed logit not singled out");
done:
    free(bad);
    tl_result_free(&r);
    TU_END();
}

/* ========================================================================== */
/*                     Batch norm's running statistics                        */
/* ========================================================================== */
/* Compares the library's running_mean and running_var of every batch norm
   layer with the reference's, and num_batches_tracked with `batches`. */
static int tl_check_running(mnistcu_model *m, const tl_ref *r, int64_t batches, const char *when, int line)
{
    float got[64], nbt;
    char name[64];
    int i;
    size_t k;
    for (i = 0; i < r->n; ++i) {
        const tl_rl *L = &r->L[i];
        if (L->kind != MNISTCU_LAYER_BATCHNORM) continue;
        if (L->c > 64) {
            tu_setf(line, "tl_check_running: %d channels, at most 64", L->c);
            return 0;
        }
        snprintf(name, sizeof name, "%d.running_mean", i);
        if (mnistcu_model_get_tensor(m, name, got, (size_t)L->c) != MNISTCU_OK) {
            tu_setf(line, "%s: get_tensor %s failed", when, name);
            return 0;
        }
        for (k = 0; k < (size_t)L->c; ++k)
            if (!(fabs((double)got[k] - L->rmean[k]) <= 1e-6 + 1e-5 * fabs(L->rmean[k]))) {
                tu_setf(line, "%s: %s[%lu] = %.9g, reference %.9g", when, name, (unsigned long)k, (double)got[k],
                        L->rmean[k]);
                return 0;
            }
        snprintf(name, sizeof name, "%d.running_var", i);
        if (mnistcu_model_get_tensor(m, name, got, (size_t)L->c) != MNISTCU_OK) {
            tu_setf(line, "%s: get_tensor %s failed", when, name);
            return 0;
        }
        for (k = 0; k < (size_t)L->c; ++k)
            if (!(fabs((double)got[k] - L->rvar[k]) <= 1e-6 + 1e-5 * fabs(L->rvar[k]))) {
                tu_setf(line, "%s: %s[%lu] = %.9g, reference %.9g", when, name, (unsigned long)k, (double)got[k],
                        L->rvar[k]);
                return 0;
            }
        snprintf(name, sizeof name, "%d.num_batches_tracked", i);
        if (mnistcu_model_get_tensor(m, name, &nbt, 1) != MNISTCU_OK || nbt != (float)batches) {
            tu_setf(line, "%s: %s = %g, expected %ld", when, name, (double)nbt, (long)batches);
            return 0;
        }
    }
    return 1;
}

/* TRAIN-mode passes (compute_grads, and forward as in PyTorch) move the
   running statistics: mean by momentum towards the batch mean, variance
   towards the unbiased batch variance; num_batches_tracked counts. EVAL-mode
   passes leave them alone and normalise with them. */
TEST batchnorm_running_statistics(void)
{
    static const size_t batches[] = {5, 3, 4, 2};
    const char *spec = "2x5x5 conv3x3x3 batchnorm:momentum=0.2 relu flatten dense6 batchnorm dense3";
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    tl_ref r;
    tu_rng rng = tu_rng_make(501);
    float *p = NULL, *x = NULL, *logits = NULL, *before = NULL, *after = NULL, val[8];
    double *pd = NULL;
    int32_t y[8];
    size_t i, k, B;
    int failed = 0;
    tl_gstat st;
    memset(&r, 0, sizeof r);
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(tl_parse(spec, &d), "parse");
    TU_REQUIRE_OK(tl_ref_make(&r, &d, __LINE__));
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "create: %s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(mnistcu_model_num_params(m) == r.np, "num_params");
    /* PyTorch's initial values */
    TU_REQUIRE(mnistcu_model_get_tensor(m, "1.weight", val, 3) == MNISTCU_OK && val[0] == 1.0f && val[1] == 1.0f &&
                   val[2] == 1.0f, "1.weight not initialised to 1");
    TU_REQUIRE(mnistcu_model_get_tensor(m, "1.bias", val, 3) == MNISTCU_OK && val[0] == 0.0f && val[1] == 0.0f &&
                   val[2] == 0.0f, "1.bias not initialised to 0");
    TU_REQUIRE_OK(tl_check_running(m, &r, 0, "fresh model", __LINE__));
    p = tl_falloc(r.np);
    pd = tl_dalloc(r.np);
    logits = tl_falloc(8 * r.classes);
    before = tl_falloc(64);
    after = tl_falloc(64);
    TU_REQUIRE(p && pd && logits && before && after && tl_ref_reserve(&r, 8), "malloc");
    tl_random_params(&r, &rng, p);
    for (i = 0; i < r.np; ++i) pd[i] = (double)p[i];
    TU_REQUIRE(mnistcu_model_set_params(m, p, r.np) == MNISTCU_OK, "set_params");
    for (k = 0; k < 4; ++k) {
        B = batches[k];
        free(x);
        x = tu_random_floats(&rng, B * r.inputs, -1.0f, 2.0f); /* mean away from 0 */
        TU_REQUIRE(x != NULL, "malloc");
        for (i = 0; i < B; ++i) y[i] = (int32_t)(tu_next(&rng) % 3);
        TU_REQUIRE(mnistcu_model_compute_grads(m, x, y, B, NULL) == MNISTCU_OK, "compute_grads: %s",
                   mnistcu_ctx_error(ctx));
        tl_ref_input(&r, x, B);
        tl_ref_run(&r, pd, B, NULL, NULL, 1);
        TU_REQUIRE_OK(tl_check_running(m, &r, (int64_t)(k + 1), "after compute_grads", __LINE__));
    }
    /* a TRAIN-mode forward pass updates them too */
    TU_REQUIRE(mnistcu_model_forward(m, x, B, logits) == MNISTCU_OK, "forward");
    tl_ref_run(&r, pd, B, NULL, NULL, 1);
    TU_REQUIRE_OK(tl_check_running(m, &r, 5, "after a TRAIN forward", __LINE__));
    /* EVAL: no update, and the output uses the running statistics */
    mnistcu_model_set_mode(m, MNISTCU_MODE_EVAL);
    TU_REQUIRE(mnistcu_model_mode(m) == MNISTCU_MODE_EVAL, "mode not EVAL");
    TU_REQUIRE(mnistcu_model_get_tensor(m, "5.running_var", before, 6) == MNISTCU_OK, "get");
    TU_REQUIRE(mnistcu_model_compute_grads(m, x, y, B, NULL) == MNISTCU_OK, "EVAL compute_grads");
    TU_REQUIRE(mnistcu_model_forward(m, x, 1, logits) == MNISTCU_OK, "EVAL forward of 1 sample");
    TU_REQUIRE(mnistcu_model_forward(m, x, B, logits) == MNISTCU_OK, "EVAL forward");
    TU_REQUIRE(mnistcu_model_get_tensor(m, "5.running_var", after, 6) == MNISTCU_OK, "get");
    TU_REQUIRE(memcmp(before, after, 6 * sizeof(float)) == 0, "EVAL passes changed running_var");
    TU_REQUIRE_OK(tl_check_running(m, &r, 5, "after EVAL passes", __LINE__));
    r.train = 0;
    tl_ref_run(&r, pd, B, NULL, NULL, 0);
    TU_REQUIRE(tl_compare(logits, r.act[r.n], B * r.classes, TL_FWD_ATOL, TL_FWD_RTOL, &st),
               "EVAL logits: %lu off, worst [%lu] %.9g vs reference %.9g", (unsigned long)st.nbad,
               (unsigned long)st.worst, (double)logits[st.worst], r.act[r.n][st.worst]);
    /* num_batches_tracked: a whole number, set and read as float */
    val[0] = 7.0f;
    TU_REQUIRE(mnistcu_model_set_tensor(m, "1.num_batches_tracked", val, 1) == MNISTCU_OK, "set nbt 7");
    val[0] = 0.0f;
    TU_REQUIRE(mnistcu_model_get_tensor(m, "1.num_batches_tracked", val, 1) == MNISTCU_OK && val[0] == 7.0f,
               "nbt read back %g", (double)val[0]);
    val[0] = 1.5f;
    TU_REQUIRE(mnistcu_model_set_tensor(m, "1.num_batches_tracked", val, 1) == MNISTCU_ERR_INVALID_ARGUMENT,
               "nbt 1.5 accepted");
    val[0] = -1.0f;
    TU_REQUIRE(mnistcu_model_set_tensor(m, "1.num_batches_tracked", val, 1) == MNISTCU_ERR_INVALID_ARGUMENT,
               "nbt -1 accepted");
    TU_REQUIRE(mnistcu_model_get_tensor(m, "1.num_batches_tracked", val, 1) == MNISTCU_OK && val[0] == 7.0f,
               "a refused set changed nbt to %g", (double)val[0]);
    TU_REQUIRE(mnistcu_model_get_tensor_grad(m, "1.running_mean", val, 3) == MNISTCU_ERR_INVALID_ARGUMENT,
               "a buffer has a gradient");
    TU_REQUIRE(mnistcu_model_get_tensor_grad(m, "1.num_batches_tracked", val, 1) == MNISTCU_ERR_INVALID_ARGUMENT,
               "num_batches_tracked has a gradient");
done:
    free(p);
    free(pd);
    free(x);
    free(logits);
    free(before);
    free(after);
    tl_ref_free(&r);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* TRAIN mode needs two values per channel (PyTorch raises): BatchNorm1d with
   batch 1 is refused, with a message; EVAL mode takes it. */
TEST batchnorm_batch1_flat(void)
{
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    float x[6] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f}, logits[3], nbt = -1.0f;
    int32_t y[1] = {1};
    mnistcu_result res;
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(mnistcu_model_create_spec(ctx, "6 dense5 batchnorm dense3", &m) == MNISTCU_OK, "create");
    res = mnistcu_model_compute_grads(m, x, y, 1, NULL);
    TU_REQUIRE(res == MNISTCU_ERR_INVALID_ARGUMENT, "batch 1 in TRAIN mode gave %s", mnistcu_result_name(res));
    TU_REQUIRE(mnistcu_ctx_error(ctx)[0] != '\0', "no message");
    TU_REQUIRE(mnistcu_model_get_tensor(m, "1.num_batches_tracked", &nbt, 1) == MNISTCU_OK && nbt == 0.0f,
               "a refused pass counted a batch (%g)", (double)nbt);
    mnistcu_model_set_mode(m, MNISTCU_MODE_EVAL);
    TU_REQUIRE(mnistcu_model_compute_grads(m, x, y, 1, NULL) == MNISTCU_OK, "EVAL batch 1: %s",
               mnistcu_ctx_error(ctx));
    TU_REQUIRE(mnistcu_model_forward(m, x, 1, logits) == MNISTCU_OK, "EVAL forward batch 1");
done:
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* ========================================================================== */
/*                 Dropout: the mask, bit for bit, and its counter             */
/* ========================================================================== */
/* Dropout's output observed directly: a model "N [relu ...] dropoutP denseN"
   whose dense layer is the identity (W = I, b = 0) gives logits equal to the
   dropout's output (a sum of one exact product and zeros). */
#define TL_DN 200 /* features (classes: at most 256) */

static int tl_set_identity(mnistcu_model *m, int line)
{
    float *w = tl_falloc((size_t)TL_DN * TL_DN), zero[TL_DN];
    mnistcu_tensor_info ti;
    size_t i;
    int ok;
    if (!w) {
        tu_setf(line, "malloc");
        return 0;
    }
    memset(zero, 0, sizeof zero);
    for (i = 0; i < TL_DN; ++i) w[i * TL_DN + i] = 1.0f;
    /* the model's only parameters: the last layer's weight and bias */
    ok = mnistcu_model_num_tensors(m) == 2 && mnistcu_model_tensor_info(m, 0, &ti) == MNISTCU_OK &&
         mnistcu_model_set_tensor(m, ti.name, w, (size_t)TL_DN * TL_DN) == MNISTCU_OK &&
         mnistcu_model_tensor_info(m, 1, &ti) == MNISTCU_OK && mnistcu_model_set_tensor(m, ti.name, zero, TL_DN) == MNISTCU_OK;
    free(w);
    if (!ok) tu_setf(line, "could not make the dense layer the identity");
    return ok;
}

/* Forward of x [B][TL_DN] in the model's mode, then every element against the
   reference: kept elements are x * (1.0f/(1.0f - p)) in float, dropped ones 0.
   *kept counts the kept elements. */
static int tl_check_mask(mnistcu_model *m, const float *x, size_t B, uint64_t seed, int layer, uint64_t step, float p,
                         float *out, size_t *kept, const char *what, int line)
{
    size_t e, n = B * TL_DN, bad = 0, first = 0;
    float scale = 1.0f / (1.0f - p);
    if (mnistcu_model_forward(m, x, B, out) != MNISTCU_OK) {
        tu_setf(line, "%s: forward failed", what);
        return 0;
    }
    *kept = 0;
    for (e = 0; e < n; ++e) {
        int keep = tl_keep(seed, layer, step, e, p);
        float want = keep ? x[e] * scale : 0.0f;
        *kept += (size_t)keep;
        if (out[e] != want) {
            if (!bad) first = e;
            bad++;
        }
    }
    if (bad) {
        tu_setf(line, "%s (seed %#llx, layer %d, step %llu, p %g): %lu of %lu elements differ from the Philox "
                      "mask; first: element %lu: library %.9g, expected %.9g (%s)",
                what, (unsigned long long)seed, layer, (unsigned long long)step, (double)p, (unsigned long)bad,
                (unsigned long)n, (unsigned long)first, (double)out[first],
                (double)(tl_keep(seed, layer, step, first, p) ? x[first] * scale : 0.0f),
                tl_keep(seed, layer, step, first, p) ? "kept" : "dropped");
        return 0;
    }
    return 1;
}

static float *tl_ones(size_t n)
{
    float *x = tl_falloc(n);
    size_t i;
    if (x)
        for (i = 0; i < n; ++i) x[i] = 1.0f;
    return x;
}

/* The library's mask is the documented Philox draw, bit for bit, for several
   layer positions, probabilities and seeds (one whose high word is non-zero);
   the kept fraction is 1-p within 5 standard deviations over 100,000 elements. */
TEST dropout_mask_is_philox(void)
{
    static const struct { const char *spec; int layer; float p; uint64_t seed; } cases[] = {
        {"200 dropout0.3 dense200", 0, 0.3f, TL_SEED},
        {"200 relu dropout dense200", 1, 0.5f, TL_SEED},
        {"200 relu tanh relu dropout0.9 dense200", 3, 0.9f, TL_SEED},
        {"200 dropout0.1 dense200", 0, 0.1f, 0x0123456789ABCDEFull},
        {"200 relu dropout0.5 dense200", 1, 0.5f, 0xFFFFFFFF00000001ull},
    };
    const size_t B = 500;
    mnistcu_ctx *ctx = NULL;
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    float *x = NULL, *out = NULL;
    size_t c, kept, n = B * TL_DN;
    double frac, sd;
    int failed = 0;
    x = tl_ones(n);
    out = tl_falloc(n);
    TU_REQUIRE(x && out, "malloc");
    for (c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        mnistcu_ctx_destroy(ctx);
        ctx = tl_ctx_seed(cases[c].seed);
        TU_REQUIRE(ctx != NULL, "no context");
        TU_REQUIRE(tl_parse(cases[c].spec, &d), "parse %s", cases[c].spec);
        TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "%s: %s", cases[c].spec, mnistcu_ctx_error(ctx));
        TU_REQUIRE_OK(tl_set_identity(m, __LINE__));
        TU_REQUIRE(mnistcu_model_steps(m) == 0, "a fresh model at step %llu", (unsigned long long)mnistcu_model_steps(m));
        if (!strstr(cases[c].spec, "tanh")) {
            TU_REQUIRE_OK(tl_check_mask(m, x, B, cases[c].seed, cases[c].layer, 0, cases[c].p, out, &kept,
                                        cases[c].spec, __LINE__));
        } else { /* the dropout sees relu(tanh(relu(1))), which the library computes in float */
            size_t e, bad = 0;
            TU_REQUIRE(mnistcu_model_forward(m, x, B, out) == MNISTCU_OK, "forward");
            kept = 0;
            for (e = 0; e < n; ++e) {
                int keep = tl_keep(cases[c].seed, cases[c].layer, 0, e, cases[c].p);
                kept += (size_t)keep;
                bad += (size_t)(keep != (out[e] != 0.0f));
                if (keep && !(fabs((double)out[e] - tanh(1.0) / (1.0 - (double)cases[c].p)) <= 1e-5))
                    bad++;
            }
            TU_REQUIRE(bad == 0, "%s: %lu elements differ from the Philox mask", cases[c].spec, (unsigned long)bad);
        }
        frac = (double)kept / (double)n;
        sd = sqrt((double)cases[c].p * (1.0 - (double)cases[c].p) / (double)n);
        TU_REQUIRE(fabs(frac - (1.0 - (double)cases[c].p)) <= 5.0 * sd, "%s: kept %.5f, expected %.5f +- %.5f",
                   cases[c].spec, frac, 1.0 - (double)cases[c].p, 5.0 * sd);
        mnistcu_model_destroy(m);
        m = NULL;
    }
done:
    free(x);
    free(out);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* The step counter: compute_grads and forward do not advance it (the same
   mask again), apply_grads does (a new mask, the documented one). */
TEST dropout_mask_follows_the_step(void)
{
    const size_t B = 50, n = 50 * TL_DN;
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    mnistcu_optim_desc o;
    tu_rng rng = tu_rng_make(601);
    float *x = NULL, *m0 = NULL, *m1 = NULL, *w = NULL;
    int32_t *y = NULL;
    size_t i, kept, differ = 0;
    uint64_t step;
    int failed = 0;
    memset(&o, 0, sizeof o);
    o.learning_rate = 0.01f;
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(tl_parse("200 dropout0.3 dense200", &d), "parse");
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "create");
    TU_REQUIRE_OK(tl_set_identity(m, __LINE__));
    x = tu_random_floats(&rng, n, 0.5f, 1.5f);
    m0 = tl_falloc(n);
    m1 = tl_falloc(n);
    w = tl_falloc(mnistcu_model_num_params(m));
    y = (int32_t *)calloc(B, sizeof(int32_t));
    TU_REQUIRE(x && m0 && m1 && w && y, "malloc");
    TU_REQUIRE(mnistcu_model_get_params(m, w, mnistcu_model_num_params(m)) == MNISTCU_OK, "get_params");
    TU_REQUIRE_OK(tl_check_mask(m, x, B, TL_SEED, 0, 0, 0.3f, m0, &kept, "step 0", __LINE__));
    TU_REQUIRE(mnistcu_model_compute_grads(m, x, y, B, NULL) == MNISTCU_OK, "compute_grads");
    TU_REQUIRE(mnistcu_model_steps(m) == 0, "compute_grads advanced the step to %llu",
               (unsigned long long)mnistcu_model_steps(m));
    TU_REQUIRE_OK(tl_check_mask(m, x, B, TL_SEED, 0, 0, 0.3f, m1, &kept, "step 0 again", __LINE__));
    TU_REQUIRE(memcmp(m0, m1, n * sizeof(float)) == 0, "two passes at step 0 differ");
    for (step = 1; step <= 3; ++step) {
        TU_REQUIRE(mnistcu_model_apply_grads(m, &o) == MNISTCU_OK, "apply_grads");
        TU_REQUIRE(mnistcu_model_steps(m) == step, "steps %llu after %llu apply_grads",
                   (unsigned long long)mnistcu_model_steps(m), (unsigned long long)step);
        TU_REQUIRE(mnistcu_model_set_params(m, w, mnistcu_model_num_params(m)) == MNISTCU_OK, "set_params");
        TU_REQUIRE_OK(tl_check_mask(m, x, B, TL_SEED, 0, step, 0.3f, m1, &kept, "after apply_grads", __LINE__));
    }
    for (i = 0; i < n; ++i) differ += (m0[i] != 0.0f) != (m1[i] != 0.0f);
    /* independent masks with p 0.3 disagree on 2 p (1-p) = 42% of the elements */
    TU_REQUIRE(differ > n / 3, "the masks of steps 0 and 3 differ in only %lu of %lu elements", (unsigned long)differ,
               (unsigned long)n);
done:
    free(x);
    free(m0);
    free(m1);
    free(w);
    free(y);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Same seed and step: the same mask (another context, another model); another
   layer index or another seed: a different one. */
TEST dropout_masks_by_layer_and_seed(void)
{
    const char *specs[3] = {"200 dropout dense200", "200 dropout dense200", "200 relu dropout dense200"};
    const uint64_t seeds[4] = {TL_SEED, TL_SEED, TL_SEED, 99};
    const size_t B = 50, n = 50 * TL_DN;
    mnistcu_ctx *ctx = NULL;
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    float *x = NULL, *out[4] = {NULL, NULL, NULL, NULL};
    size_t i, k, kept, diff_layer = 0, diff_seed = 0;
    int failed = 0;
    x = tl_ones(n);
    TU_REQUIRE(x != NULL, "malloc");
    for (k = 0; k < 4; ++k) {
        out[k] = tl_falloc(n);
        TU_REQUIRE(out[k] != NULL, "malloc");
        mnistcu_ctx_destroy(ctx);
        ctx = tl_ctx_seed(seeds[k]);
        TU_REQUIRE(ctx != NULL, "no context");
        TU_REQUIRE(tl_parse(specs[k < 3 ? k : 0], &d), "parse");
        TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "create");
        TU_REQUIRE_OK(tl_set_identity(m, __LINE__));
        TU_REQUIRE_OK(tl_check_mask(m, x, B, seeds[k], k == 2 ? 1 : 0, 0, 0.5f, out[k], &kept, specs[k < 3 ? k : 0],
                                    __LINE__));
        mnistcu_model_destroy(m);
        m = NULL;
    }
    TU_REQUIRE(memcmp(out[0], out[1], n * sizeof(float)) == 0, "the same seed, layer and step gave different masks");
    for (i = 0; i < n; ++i) {
        diff_layer += out[0][i] != out[2][i];
        diff_seed += out[0][i] != out[3][i];
    }
    TU_REQUIRE(diff_layer > n / 3, "layers 0 and 1 share their mask (%lu of %lu differ)", (unsigned long)diff_layer,
               (unsigned long)n);
    TU_REQUIRE(diff_seed > n / 3, "seeds 1234 and 99 share their mask (%lu of %lu differ)", (unsigned long)diff_seed,
               (unsigned long)n);
done:
    free(x);
    for (k = 0; k < 4; ++k) free(out[k]);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* EVAL mode: dropout is the identity, exactly. */
TEST dropout_eval_is_identity(void)
{
    const size_t B = 20, n = 20 * TL_DN;
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    tu_rng rng = tu_rng_make(611);
    float *x = NULL, *out = NULL;
    size_t i;
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(tl_parse("200 dropout0.6 dense200", &d), "parse");
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "create");
    TU_REQUIRE_OK(tl_set_identity(m, __LINE__));
    x = tu_random_floats(&rng, n, -2.0f, 2.0f);
    out = tl_falloc(n);
    TU_REQUIRE(x && out, "malloc");
    mnistcu_model_set_mode(m, MNISTCU_MODE_EVAL);
    TU_REQUIRE(mnistcu_model_forward(m, x, B, out) == MNISTCU_OK, "forward");
    for (i = 0; i < n; ++i)
        TU_REQUIRE(out[i] == x[i], "EVAL: element %lu: %.9g, input %.9g", (unsigned long)i, (double)out[i], (double)x[i]);
done:
    free(x);
    free(out);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* ========================================================================== */
/*                          TRAIN and EVAL modes                               */
/* ========================================================================== */
static int tl_forward_mode(mnistcu_model *m, mnistcu_mode mode, const float *x, size_t B, float *out)
{
    mnistcu_model_set_mode(m, mode);
    return mnistcu_model_forward(m, x, B, out) == MNISTCU_OK && mnistcu_model_mode(m) == mode;
}

/* set_mode changes what batch norm and dropout do, and nothing else; predict
   runs in EVAL mode and leaves the mode as it found it. */
TEST mode_changes_only_batchnorm_and_dropout(void)
{
    static const struct { const char *spec; int moded; } cases[] = {
        {"2x6x6 conv3x3x3 relu maxpool2 avgpool1 flatten dense8 leaky_relu sigmoid tanh softmax dense4", 0},
        {"6 dense5 batchnorm dense3", 1},
        {"6 dense5 dropout dense3", 1},
        {"2x4x4 conv3x3x3 batchnorm flatten dense3", 1},
    };
    const size_t B = 6;
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    tu_rng rng = tu_rng_make(701);
    float *x = NULL, train[6 * 4], eval[6 * 4], probs[6 * 4], nbt = 0.0f;
    int32_t labels[6];
    size_t c, i, C, differ;
    int failed = 0, j;
    TU_REQUIRE(ctx != NULL, "no context");
    for (c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        TU_REQUIRE(tl_parse(cases[c].spec, &d), "parse");
        TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "%s: create", cases[c].spec);
        TU_REQUIRE(mnistcu_model_mode(m) == MNISTCU_MODE_TRAIN, "%s: a new model is not in TRAIN mode", cases[c].spec);
        C = strstr(cases[c].spec, "dense4") ? 4 : 3;
        free(x);
        x = tu_random_floats(&rng, B * 72, -1.0f, 1.0f);
        TU_REQUIRE(x != NULL, "malloc");
        TU_REQUIRE(tl_forward_mode(m, MNISTCU_MODE_TRAIN, x, B, train) && tl_forward_mode(m, MNISTCU_MODE_EVAL, x, B, eval),
                   "%s: forward", cases[c].spec);
        for (differ = 0, i = 0; i < B * C; ++i) differ += fabs((double)train[i] - (double)eval[i]) > 1e-3;
        if (cases[c].moded)
            TU_REQUIRE(differ > 0, "%s: TRAIN and EVAL give the same logits", cases[c].spec);
        else
            TU_REQUIRE(memcmp(train, eval, B * C * sizeof(float)) == 0, "%s: the mode changed the logits",
                       cases[c].spec);
        /* predict: EVAL probabilities, the mode (TRAIN) kept, no batch counted */
        mnistcu_model_set_mode(m, MNISTCU_MODE_TRAIN);
        if (strstr(cases[c].spec, "batchnorm"))
            TU_REQUIRE(mnistcu_model_get_tensor(m, d.layers[1].kind == MNISTCU_LAYER_BATCHNORM ? "1.num_batches_tracked"
                                                                                                : "2.num_batches_tracked",
                                                &nbt, 1) == MNISTCU_OK, "get nbt");
        TU_REQUIRE(mnistcu_predict(m, x, B, labels, probs) == MNISTCU_OK, "%s: predict: %s", cases[c].spec,
                   mnistcu_ctx_error(ctx));
        TU_REQUIRE(mnistcu_model_mode(m) == MNISTCU_MODE_TRAIN, "%s: predict left the model in EVAL mode",
                   cases[c].spec);
        for (i = 0; i < B; ++i) {
            double mx = eval[i * C], sum = 0.0;
            for (j = 1; j < (int)C; ++j)
                if (eval[i * C + (size_t)j] > mx) mx = eval[i * C + (size_t)j];
            for (j = 0; j < (int)C; ++j) sum += exp((double)eval[i * C + (size_t)j] - mx);
            for (j = 0; j < (int)C; ++j) {
                double want = exp((double)eval[i * C + (size_t)j] - mx) / sum;
                TU_REQUIRE(fabs((double)probs[i * C + (size_t)j] - want) <= 1e-6 + 1e-5 * want,
                           "%s: predict's probability [%lu][%d] = %.9g, softmax of the EVAL logits %.9g",
                           cases[c].spec, (unsigned long)i, j, (double)probs[i * C + (size_t)j], want);
            }
        }
        if (strstr(cases[c].spec, "batchnorm")) {
            float after = -1.0f;
            TU_REQUIRE(mnistcu_model_get_tensor(m, d.layers[1].kind == MNISTCU_LAYER_BATCHNORM ? "1.num_batches_tracked"
                                                                                                : "2.num_batches_tracked",
                                                &after, 1) == MNISTCU_OK && after == nbt,
                       "%s: predict counted a batch (%g -> %g)", cases[c].spec, (double)nbt, (double)after);
        }
        mnistcu_model_destroy(m);
        m = NULL;
    }
done:
    free(x);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* mnistcu_model_forward in TRAIN mode over more samples than its internal
   chunk (1000): as in PyTorch, the n samples are one batch. Dropout's element
   index e runs over the whole [n][...] tensor, and batch norm normalises with
   the statistics of all n samples and counts one batch. */
#define TL_BIG_BATCH 1500

TEST train_forward_dropout_is_one_batch(void)
{
    const size_t B = TL_BIG_BATCH, n = TL_BIG_BATCH * TL_DN;
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    float *x = NULL, *out = NULL;
    size_t kept;
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    x = tl_ones(n);
    out = tl_falloc(n);
    TU_REQUIRE(x && out, "malloc");
    TU_REQUIRE(tl_parse("200 dropout0.3 dense200", &d), "parse");
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "create");
    TU_REQUIRE_OK(tl_set_identity(m, __LINE__));
    TU_REQUIRE_OK(tl_check_mask(m, x, B, TL_SEED, 0, 0, 0.3f, out, &kept, "a TRAIN forward of 1500 samples", __LINE__));
done:
    free(x);
    free(out);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

TEST train_forward_batchnorm_is_one_batch(void)
{
    const size_t B = TL_BIG_BATCH;
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    tl_ref r;
    tu_rng rng = tu_rng_make(711);
    float *x = NULL, *out = NULL, *p = NULL, nbt = 0.0f;
    double *pd = NULL;
    size_t i;
    int failed = 0;
    tl_gstat st;
    memset(&r, 0, sizeof r);
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(tl_parse("4 dense3 batchnorm dense3", &d), "parse");
    TU_REQUIRE_OK(tl_ref_make(&r, &d, __LINE__));
    TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_OK, "create");
    p = tl_falloc(r.np);
    pd = tl_dalloc(r.np);
    out = tl_falloc(B * 3);
    x = tu_random_floats(&rng, B * 4, -1.0f, 1.0f);
    TU_REQUIRE(p && pd && x && out && tl_ref_reserve(&r, B), "malloc");
    tl_random_params(&r, &rng, p);
    for (i = 0; i < r.np; ++i) pd[i] = (double)p[i];
    for (i = 0; i < B; ++i) x[i * 4] += 2.0f * (float)i / (float)B; /* a trend: parts of the batch differ */
    TU_REQUIRE(mnistcu_model_set_params(m, p, r.np) == MNISTCU_OK, "set_params");
    TU_REQUIRE(mnistcu_model_forward(m, x, B, out) == MNISTCU_OK, "forward");
    tl_ref_input(&r, x, B);
    tl_ref_run(&r, pd, B, NULL, NULL, 1);
    TU_REQUIRE(mnistcu_model_get_tensor(m, "1.num_batches_tracked", &nbt, 1) == MNISTCU_OK && nbt == 1.0f,
               "one TRAIN forward pass of 1500 samples counted %g batches", (double)nbt);
    TU_REQUIRE(tl_compare(out, r.act[r.n], B * 3, TL_FWD_ATOL, TL_FWD_RTOL, &st),
               "a TRAIN forward of 1500 samples: %lu of %lu logits off, worst [sample %lu]: %.9g vs reference %.9g",
               (unsigned long)st.nbad, (unsigned long)(B * 3), (unsigned long)(st.worst / 3), (double)out[st.worst],
               r.act[r.n][st.worst]);
    TU_REQUIRE_OK(tl_check_running(m, &r, 1, "after a TRAIN forward of 1500 samples", __LINE__));
done:
    free(x);
    free(out);
    free(p);
    free(pd);
    tl_ref_free(&r);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* ========================================================================== */
/*                              Spec strings                                   */
/* ========================================================================== */
/* Valid specs using every keyword and option; each builds. */
#define TL_OPTIONS_SPEC                                                                                          \
    "3x8x8 conv3x3x4:s=2:p=1:bias=0 batchnorm:eps=0.001:momentum=0.01 leaky_relu0.2 flatten dense5:bias=0 " \
    "dropout0.25 dense3"
static const char *const tl_valid_specs[] = {
    TL_LENET5,
    TL_FASHION_CNN,
    TL_EVERY_KIND,
    TL_MINI_LENET,
    TL_OPTIONS_SPEC,
    "1x9x9 conv2x3x2 maxpool3:s=2 avgpool2x1 flatten dense4",
    "1x9x9 conv3x3x2:s=1:p=0:bias=1 maxpool3:s=3 avgpool:s=1 flatten dense2", /* options at their defaults */
    "10 batchnorm dropout dropout0.5 leaky_relu leaky_relu0.01 sigmoid tanh softmax relu dense3",
    "1x1x784 dense10",
    "784 dense128 relu dense10",
    "2x6x6 maxpool2x2:s=2 avgpool1 flatten dense2",
    "1x7x5 conv3x1x2:p=2 maxpool1x2 avgpool3x2:s=2 flatten dense2",
    "12 dense6 batchnorm:momentum=0.5 dense6 batchnorm:eps=0.1 dropout0.75 dense2",
    "2x5x5 conv3x3x3 softmax flatten dense2",
    "4x3x3 batchnorm maxpool3 avgpool1x1 flatten leaky_relu-0.25 dense2",
};
#define TL_VALID_SPECS (sizeof tl_valid_specs / sizeof tl_valid_specs[0])

static int tl_same_desc(const mnistcu_model_desc *a, const mnistcu_model_desc *b)
{
    return a->input_c == b->input_c && a->input_h == b->input_h && a->input_w == b->input_w &&
           memcmp(a->layers, b->layers, sizeof a->layers) == 0 && memcmp(a->sizes, b->sizes, sizeof a->sizes) == 0 &&
           a->hidden_act == b->hidden_act && a->init == b->init && a->loss == b->loss;
}

/* The first layer where two descs differ, as text for a message. */
static void tl_desc_diff(const mnistcu_model_desc *a, const mnistcu_model_desc *b, char *out, size_t size)
{
    int i;
    if (a->input_c != b->input_c || a->input_h != b->input_h || a->input_w != b->input_w) {
        snprintf(out, size, "input %dx%dx%d vs %dx%dx%d", a->input_c, a->input_h, a->input_w, b->input_c, b->input_h,
                 b->input_w);
        return;
    }
    for (i = 0; i < MNISTCU_MAX_MODEL_LAYERS; ++i) {
        const mnistcu_layer_desc *x = &a->layers[i], *y = &b->layers[i];
        if (memcmp(x, y, sizeof *x) != 0) {
            snprintf(out, size,
                     "layer %d: kind %d/%d units %d/%d kernel %dx%d/%dx%d stride %d/%d pad %d/%d no_bias %d/%d p %g/%g "
                     "slope %g/%g eps %g/%g momentum %g/%g",
                     i, (int)x->kind, (int)y->kind, x->units, y->units, x->kernel_h, x->kernel_w, y->kernel_h,
                     y->kernel_w, x->stride, y->stride, x->padding, y->padding, x->no_bias, y->no_bias, (double)x->p,
                     (double)y->p, (double)x->slope, (double)y->slope, (double)x->eps, (double)y->eps,
                     (double)x->momentum, (double)y->momentum);
            return;
        }
    }
    snprintf(out, size, "sizes, hidden_act, init or loss");
}

/* The library's parser gives the desc this file's parser gives (defaults as
   zero), every spec builds, with the reference's parameter count and shapes. */
TEST spec_parse_valid(void)
{
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc lib, mine;
    mnistcu_model_info info;
    mnistcu_layer_info li;
    tl_ref r;
    char diff[512];
    size_t s;
    int failed = 0, i;
    memset(&r, 0, sizeof r);
    TU_REQUIRE(ctx != NULL, "no context");
    for (s = 0; s < TL_VALID_SPECS; ++s) {
        const char *spec = tl_valid_specs[s];
        TU_REQUIRE(tl_parse(spec, &mine), "the test's parser rejects \"%s\"", spec);
        TU_REQUIRE(mnistcu_model_desc_parse(ctx, spec, &lib) == MNISTCU_OK, "\"%s\": %s", spec, mnistcu_ctx_error(ctx));
        tl_desc_diff(&lib, &mine, diff, sizeof diff);
        TU_REQUIRE(tl_same_desc(&lib, &mine), "\"%s\": the parsed desc differs from the definition: %s (library/test)",
                   spec, diff);
        tl_ref_free(&r);
        TU_REQUIRE_OK(tl_ref_make(&r, &mine, __LINE__));
        TU_REQUIRE(mnistcu_model_create_spec(ctx, spec, &m) == MNISTCU_OK, "\"%s\": create_spec: %s", spec,
                   mnistcu_ctx_error(ctx));
        mnistcu_model_info_get(m, &info);
        TU_REQUIRE(info.num_params == r.np && info.layer_count == r.n && info.classes == r.classes &&
                       info.inputs == r.inputs,
                   "\"%s\": %lu params, %d layers, %lu classes, %lu inputs; reference %lu, %d, %lu, %lu", spec,
                   (unsigned long)info.num_params, info.layer_count, (unsigned long)info.classes,
                   (unsigned long)info.inputs, (unsigned long)r.np, r.n, (unsigned long)r.classes,
                   (unsigned long)r.inputs);
        for (i = 0; i < r.n; ++i) {
            const tl_rl *L = &r.L[i];
            TU_REQUIRE(mnistcu_model_layer_info(m, i, &li) == MNISTCU_OK, "layer_info");
            TU_REQUIRE(li.desc.kind == L->kind && li.in_shape[0] == L->c && li.in_shape[1] == L->h &&
                           li.in_shape[2] == L->w && li.out_shape[0] == L->oc && li.out_shape[1] == L->oh &&
                           li.out_shape[2] == L->ow && li.num_params == L->nw + L->nb,
                       "\"%s\" layer %d: kind %d, %dx%dx%d -> %dx%dx%d, %lu params; reference %d, %dx%dx%d -> "
                       "%dx%dx%d, %lu",
                       spec, i, (int)li.desc.kind, li.in_shape[0], li.in_shape[1], li.in_shape[2], li.out_shape[0],
                       li.out_shape[1], li.out_shape[2], (unsigned long)li.num_params, (int)L->kind, L->c, L->h, L->w,
                       L->oc, L->oh, L->ow, (unsigned long)(L->nw + L->nb));
        }
        mnistcu_model_destroy(m);
        m = NULL;
    }
    /* separators and number forms */
    {
        static const char *const same[][2] = {
            {"  10\tdense4,dense2\n ", "10 dense4 dense2"},
            {"10 dropout.25 dense2", "10 dropout0.25 dense2"},
            {"10 batchnorm:eps=1e-3:momentum=2.5e-1 dense2", "10 batchnorm:eps=0.001:momentum=0.25 dense2"},
            {"1x1x10 dense2", "10 dense2"},
            {"1x8x8 maxpool2x2:s=2 flatten dense2", "1x8x8 maxpool flatten dense2"},
            {"1x8x8 conv3x3x2:s=1:p=0:bias=1 flatten dense2", "1x8x8 conv3x3x2 flatten dense2"},
        };
        size_t k;
        for (k = 0; k < sizeof same / sizeof same[0]; ++k) {
            mnistcu_model_desc a, b;
            TU_REQUIRE(mnistcu_model_desc_parse(ctx, same[k][0], &a) == MNISTCU_OK &&
                           mnistcu_model_desc_parse(ctx, same[k][1], &b) == MNISTCU_OK,
                       "\"%s\" or \"%s\": %s", same[k][0], same[k][1], mnistcu_ctx_error(ctx));
            tl_desc_diff(&a, &b, diff, sizeof diff);
            TU_REQUIRE(tl_same_desc(&a, &b), "\"%s\" and \"%s\" parse differently: %s", same[k][0], same[k][1], diff);
        }
    }
done:
    tl_ref_free(&r);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* The presets are their documented specs, with the documented parameter
   counts (which the reference recomputes); MLP widths build the model of
   mnistcu_model_create_mlp. */
TEST spec_presets_and_mlp(void)
{
    static const struct { const char *name, *spec; size_t params; } presets[] = {
        {"lenet5", TL_LENET5, 44426},
        {"fashion-cnn", TL_FASHION_CNN, 896522},
    };
    mnistcu_ctx *ctx = tl_ctx(), *c1 = NULL, *c2 = NULL;
    mnistcu_model *m = NULL, *a = NULL, *b = NULL;
    mnistcu_model_desc d1, d2;
    mnistcu_model_info ia, ib;
    mnistcu_tensor_info ta, tb;
    tl_ref r;
    char buf[512], diff[512];
    float *pa = NULL, *pb = NULL;
    size_t k, np;
    int failed = 0, i;
    memset(&r, 0, sizeof r);
    TU_REQUIRE(ctx != NULL, "no context");
    for (k = 0; k < 2; ++k) {
        TU_REQUIRE(mnistcu_model_desc_parse(ctx, presets[k].name, &d1) == MNISTCU_OK, "%s: %s", presets[k].name,
                   mnistcu_ctx_error(ctx));
        TU_REQUIRE(tl_parse(presets[k].spec, &d2), "parse");
        tl_desc_diff(&d1, &d2, diff, sizeof diff);
        TU_REQUIRE(tl_same_desc(&d1, &d2), "%s is not \"%s\": %s", presets[k].name, presets[k].spec, diff);
        tl_ref_free(&r);
        TU_REQUIRE_OK(tl_ref_make(&r, &d2, __LINE__));
        TU_REQUIRE(r.np == presets[k].params, "%s: the reference counts %lu parameters, documented %lu",
                   presets[k].name, (unsigned long)r.np, (unsigned long)presets[k].params);
        TU_REQUIRE(mnistcu_model_create_spec(ctx, presets[k].name, &m) == MNISTCU_OK, "%s: %s", presets[k].name,
                   mnistcu_ctx_error(ctx));
        TU_REQUIRE(mnistcu_model_num_params(m) == presets[k].params, "%s: %lu parameters", presets[k].name,
                   (unsigned long)mnistcu_model_num_params(m));
        TU_REQUIRE(mnistcu_model_spec(m, buf, sizeof buf) == MNISTCU_OK && strcmp(buf, presets[k].spec) == 0,
                   "%s: the model's spec is \"%s\"", presets[k].name, buf);
        mnistcu_model_destroy(m);
        m = NULL;
    }
    /* "784-128-10" = mnistcu_model_create_mlp("784-128-10") = dense, relu, dense */
    TU_REQUIRE(mnistcu_model_desc_parse(ctx, "784-128-10", &d1) == MNISTCU_OK, "parse widths: %s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(tl_parse("784 dense128 relu dense10", &d2), "parse");
    tl_desc_diff(&d1, &d2, diff, sizeof diff);
    TU_REQUIRE(tl_same_desc(&d1, &d2), "784-128-10 is not \"784 dense128 relu dense10\": %s", diff);
    c1 = tl_ctx();
    c2 = tl_ctx();
    TU_REQUIRE(c1 && c2, "no context");
    TU_REQUIRE(mnistcu_model_create_spec(c1, "784-128-10", &a) == MNISTCU_OK, "create_spec: %s", mnistcu_ctx_error(c1));
    TU_REQUIRE(mnistcu_model_create_mlp(c2, "784-128-10", &b) == MNISTCU_OK, "create_mlp: %s", mnistcu_ctx_error(c2));
    mnistcu_model_info_get(a, &ia);
    mnistcu_model_info_get(b, &ib);
    TU_REQUIRE(ia.num_layers == 2 && ib.num_layers == 2 && ia.sizes[0] == 784 && ia.sizes[1] == 128 &&
                   ia.sizes[2] == 10 && memcmp(ia.sizes, ib.sizes, sizeof ia.sizes) == 0 &&
                   ia.hidden_act == MNISTCU_ACT_RELU && ib.hidden_act == MNISTCU_ACT_RELU &&
                   ia.layer_count == 3 && ib.layer_count == 3 && ia.num_params == 101770 && ib.num_params == 101770,
               "model info differs (dense layers %d/%d, layers %d/%d, params %lu/%lu)", ia.num_layers, ib.num_layers,
               ia.layer_count, ib.layer_count, (unsigned long)ia.num_params, (unsigned long)ib.num_params);
    TU_REQUIRE(mnistcu_model_num_tensors(a) == 4 && mnistcu_model_num_tensors(b) == 4, "tensor counts %d, %d",
               mnistcu_model_num_tensors(a), mnistcu_model_num_tensors(b));
    for (i = 0; i < 4; ++i) {
        static const char *const names[4] = {"0.weight", "0.bias", "2.weight", "2.bias"};
        TU_REQUIRE(mnistcu_model_tensor_info(a, i, &ta) == MNISTCU_OK && mnistcu_model_tensor_info(b, i, &tb) == MNISTCU_OK,
                   "tensor_info");
        TU_REQUIRE(strcmp(ta.name, names[i]) == 0 && strcmp(tb.name, names[i]) == 0 && ta.ndim == tb.ndim &&
                       memcmp(ta.shape, tb.shape, sizeof ta.shape) == 0 && ta.count == tb.count,
                   "tensor %d: \"%s\" / \"%s\", expected \"%s\"", i, ta.name, tb.name, names[i]);
    }
    /* the same seed, the same first object: the same initial parameters */
    np = ia.num_params;
    pa = tl_falloc(np);
    pb = tl_falloc(np);
    TU_REQUIRE(pa && pb, "malloc");
    TU_REQUIRE(mnistcu_model_get_params(a, pa, np) == MNISTCU_OK && mnistcu_model_get_params(b, pb, np) == MNISTCU_OK,
               "get_params");
    TU_REQUIRE(memcmp(pa, pb, np * sizeof(float)) == 0, "create_spec and create_mlp drew different parameters");
    TU_REQUIRE(mnistcu_model_spec(a, buf, sizeof buf) == MNISTCU_OK && strcmp(buf, "784 dense128 relu dense10") == 0,
               "the MLP's spec is \"%s\"", buf);
done:
    free(pa);
    free(pb);
    tl_ref_free(&r);
    mnistcu_ctx_destroy(ctx);
    mnistcu_ctx_destroy(c1);
    mnistcu_ctx_destroy(c2);
    TU_END();
}

/* parse -> desc_spec -> parse is the identity; a model's spec makes the same
   model, whose spec is the same string. */
TEST spec_round_trips(void)
{
    static const char *const extra[] = {"lenet5", "fashion-cnn", "784-128-10", "20-16-8-4"};
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL, *m2 = NULL;
    mnistcu_model_desc d1, d2, d3;
    mnistcu_layer_info l1, l2;
    char buf[1024], buf2[1024], buf3[1024], diff[512];
    const char *spec;
    size_t s;
    int failed = 0, i;
    TU_REQUIRE(ctx != NULL, "no context");
    for (s = 0; s < TL_VALID_SPECS + 4; ++s) {
        spec = s < TL_VALID_SPECS ? tl_valid_specs[s] : extra[s - TL_VALID_SPECS];
        TU_REQUIRE(mnistcu_model_desc_parse(ctx, spec, &d1) == MNISTCU_OK, "\"%s\": %s", spec, mnistcu_ctx_error(ctx));
        TU_REQUIRE(mnistcu_model_desc_spec(&d1, buf, sizeof buf) == MNISTCU_OK, "\"%s\": desc_spec", spec);
        TU_REQUIRE(mnistcu_model_desc_parse(ctx, buf, &d2) == MNISTCU_OK, "\"%s\" printed as \"%s\", which fails: %s",
                   spec, buf, mnistcu_ctx_error(ctx));
        tl_desc_diff(&d1, &d2, diff, sizeof diff);
        TU_REQUIRE(memcmp(d1.layers, d2.layers, sizeof d1.layers) == 0 && tl_same_desc(&d1, &d2),
                   "\"%s\" -> \"%s\" parses to another desc: %s", spec, buf, diff);
        /* the model's spec */
        TU_REQUIRE(mnistcu_model_create(ctx, &d1, &m) == MNISTCU_OK, "\"%s\": create: %s", spec, mnistcu_ctx_error(ctx));
        TU_REQUIRE(mnistcu_model_spec(m, buf2, sizeof buf2) == MNISTCU_OK, "\"%s\": model_spec", spec);
        TU_REQUIRE(strcmp(buf, buf2) == 0, "\"%s\": desc_spec \"%s\", model_spec \"%s\"", spec, buf, buf2);
        TU_REQUIRE(mnistcu_model_desc_parse(ctx, buf2, &d3) == MNISTCU_OK &&
                       mnistcu_model_create(ctx, &d3, &m2) == MNISTCU_OK,
                   "\"%s\": the model's spec \"%s\" fails: %s", spec, buf2, mnistcu_ctx_error(ctx));
        TU_REQUIRE(mnistcu_model_spec(m2, buf3, sizeof buf3) == MNISTCU_OK && strcmp(buf2, buf3) == 0,
                   "\"%s\": spec \"%s\" remade gives \"%s\"", spec, buf2, buf3);
        TU_REQUIRE(mnistcu_model_num_params(m) == mnistcu_model_num_params(m2) &&
                       mnistcu_model_num_tensors(m) == mnistcu_model_num_tensors(m2),
                   "\"%s\": the remade model differs in size", spec);
        for (i = 0; mnistcu_model_layer_info(m, i, &l1) == MNISTCU_OK; ++i) {
            TU_REQUIRE(mnistcu_model_layer_info(m2, i, &l2) == MNISTCU_OK, "\"%s\": the remade model lacks layer %d",
                       spec, i);
            TU_REQUIRE(memcmp(&l1.desc, &l2.desc, sizeof l1.desc) == 0 &&
                           memcmp(l1.out_shape, l2.out_shape, sizeof l1.out_shape) == 0 && strcmp(l1.spec, l2.spec) == 0,
                       "\"%s\": layer %d differs in the remade model (%s / %s)", spec, i, l1.spec, l2.spec);
        }
        TU_REQUIRE(mnistcu_model_layer_info(m2, i, &l2) != MNISTCU_OK, "\"%s\": the remade model has more layers", spec);
        mnistcu_model_destroy(m);
        mnistcu_model_destroy(m2);
        m = m2 = NULL;
    }
    /* too small a buffer: an error and an empty string */
    TU_REQUIRE(mnistcu_model_desc_parse(ctx, TL_LENET5, &d1) == MNISTCU_OK, "parse");
    strcpy(buf, "junk");
    TU_REQUIRE(mnistcu_model_desc_spec(&d1, buf, 20) == MNISTCU_ERR_INVALID_ARGUMENT && buf[0] == 0,
               "a 20-byte buffer: \"%s\"", buf);
    TU_REQUIRE(mnistcu_model_desc_spec(&d1, buf, strlen(TL_LENET5)) == MNISTCU_ERR_INVALID_ARGUMENT && buf[0] == 0,
               "a buffer one byte short");
    TU_REQUIRE(mnistcu_model_desc_spec(&d1, buf, strlen(TL_LENET5) + 1) == MNISTCU_OK && strcmp(buf, TL_LENET5) == 0,
               "an exact buffer: \"%s\"", buf);
    TU_REQUIRE(mnistcu_model_spec(NULL, buf, sizeof buf) == MNISTCU_ERR_INVALID_ARGUMENT, "model_spec(NULL)");
done:
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* msg holds v as a whole decimal number. */
static int tl_has_number(const char *msg, long v)
{
    char num[32];
    const char *p = msg;
    size_t len;
    snprintf(num, sizeof num, "%ld", v);
    len = strlen(num);
    while ((p = strstr(p, num)) != NULL) {
        int before = p > msg && p[-1] >= '0' && p[-1] <= '9', after = p[len] >= '0' && p[len] <= '9';
        if (!before && !after) return 1;
        p += 1;
    }
    return 0;
}

/* "layer K" with K the given index. */
static int tl_names_layer(const char *msg, int layer)
{
    char pat[32];
    const char *p = msg;
    size_t len;
    snprintf(pat, sizeof pat, "layer %d", layer);
    len = strlen(pat);
    while ((p = strstr(p, pat)) != NULL) {
        if (!(p[len] >= '0' && p[len] <= '9')) return 1;
        p += 1;
    }
    return 0;
}

/* Parse errors: ERR_INVALID_ARGUMENT, no model, a message that names the
   token and its character position in the spec given (0- or 1-based). */
TEST spec_invalid(void)
{
    static const struct { const char *spec, *token; int pos; } bad[] = {
        {"1x8x8 conv3x3x2 bogus5 flatten dense2", "bogus5", 16},          /* unknown keyword */
        {"10 Dense2", "Dense2", 3},                                        /* case-sensitive */
        {"10 dense4 relu6 dense2", "relu6", 9},                            /* a number on a kind without */
        {"10 flatten2 dense2", "flatten2", 3},
        {"1x8x8 conv3x3 flatten dense2", "conv3x3", 6},                    /* bad numbers */
        {"10 dense1x dense2", "dense1x", 3},
        {"10 dense0", "dense0", 3},
        {"10 dense-3 dense2", "dense-3", 3},
        {"10 dropout1.5 dense2", "dropout1.5", 3},
        {"10 dropout0 dense2", "dropout0", 3},
        {"10 leaky_relu0.1.2 dense2", "leaky_relu0.1.2", 3},
        {"10 leaky_relu-.0 dense2", "leaky_relu-.0", 3},                   /* 0 would read as the default */
        {"1x8x8 maxpool0 flatten dense2", "maxpool0", 6},
        {"1x8x8 maxpool2x2x2 flatten dense2", "maxpool2x2x2", 6},
        {"1x8x8 conv3x3x2:q=1 flatten dense2", "conv3x3x2:q=1", 6},        /* bad options */
        {"1x8x8 conv3x3x2:s=0 flatten dense2", "conv3x3x2:s=0", 6},
        {"1x8x8 conv3x3x2:s= flatten dense2", "conv3x3x2:s=", 6},
        {"1x8x8 conv3x3x2: flatten dense2", "conv3x3x2:", 6},
        {"1x8x8 conv3x3x2:bias=2 flatten dense2", "conv3x3x2:bias=2", 6},
        {"1x8x8 conv3x3x2:p=-1 flatten dense2", "conv3x3x2:p=-1", 6},
        {"10 batchnorm:eps=-1 dense2", "batchnorm:eps=-1", 3},
        {"10 batchnorm:momentum=x dense2", "batchnorm:momentum=x", 3},
        {"10 dense5:s=2 dense2", "dense5:s=2", 3},                         /* options on the wrong kind */
        {"10 relu:p=1 dense2", "relu:p=1", 3},
        {"1x8x8 maxpool2:p=1 flatten dense2", "maxpool2:p=1", 6},
        {"10 dropout:eps=0.1 dense2", "dropout:eps=0.1", 3},
        {"10 dense5:momentum=0.1 dense2", "dense5:momentum=0.1", 3},
        {"10 batchnorm:bias=0 dense2", "batchnorm:bias=0", 3},
        {"conv3x3x2 flatten dense2", "conv3x3x2", 0},                      /* no input shape */
        {"dense10", "dense10", 0},
        {"1x28 dense10", "1x28", 0},
        {"1x0x5 dense2", "1x0x5", 0},
        {"lenet6", "lenet6", 0},
        {"  10 bogus dense2", "bogus", 5},                                 /* the position in the string given */
    };
    char *many = NULL;
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    mnistcu_result r;
    const char *msg;
    size_t k, len;
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    for (k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        m = (mnistcu_model *)&d; /* not NULL: the call must clear it */
        r = mnistcu_model_create_spec(ctx, bad[k].spec, &m);
        msg = mnistcu_ctx_error(ctx);
        TU_REQUIRE(r == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "\"%s\" gave %s (%s)", bad[k].spec,
                   mnistcu_result_name(r), msg);
        TU_REQUIRE(strstr(msg, bad[k].token) != NULL, "\"%s\": the message does not name \"%s\": %s", bad[k].spec,
                   bad[k].token, msg);
        TU_REQUIRE(tl_has_number(msg, bad[k].pos) || tl_has_number(msg, bad[k].pos + 1),
                   "\"%s\": the message does not give the position %d of \"%s\": %s", bad[k].spec, bad[k].pos,
                   bad[k].token, msg);
        TU_REQUIRE(mnistcu_model_desc_parse(ctx, bad[k].spec, &d) == MNISTCU_ERR_INVALID_ARGUMENT,
                   "desc_parse accepts \"%s\"", bad[k].spec);
    }
    /* 64 layers are the most; the 65th is named */
    len = strlen("10") + 64 * strlen(" tanh") + strlen(" dense2") + 1;
    many = (char *)malloc(len);
    TU_REQUIRE(many != NULL, "malloc");
    strcpy(many, "10");
    for (k = 0; k < 63; ++k) strcat(many, " tanh");
    strcat(many, " dense2");
    TU_REQUIRE(mnistcu_model_create_spec(ctx, many, &m) == MNISTCU_OK, "64 layers: %s", mnistcu_ctx_error(ctx));
    mnistcu_model_destroy(m);
    m = NULL;
    strcpy(many, "10");
    for (k = 0; k < 64; ++k) strcat(many, " tanh");
    strcat(many, " dense2");
    r = mnistcu_model_create_spec(ctx, many, &m);
    msg = mnistcu_ctx_error(ctx);
    TU_REQUIRE(r == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "65 layers gave %s", mnistcu_result_name(r));
    TU_REQUIRE(strstr(msg, "dense2") != NULL && (tl_has_number(msg, 322) || tl_has_number(msg, 323)),
               "65 layers: the message does not name \"dense2\" at 322: %s", msg);
    /* nothing to name */
    {
        static const char *const empty[] = {"", "   ", "\t\n", "1x8x8", "10"};
        for (k = 0; k < sizeof empty / sizeof empty[0]; ++k) {
            mnistcu_ctx_clear_error(ctx);
            r = mnistcu_model_create_spec(ctx, empty[k], &m);
            TU_REQUIRE(r == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL && mnistcu_ctx_error(ctx)[0] != '\0',
                       "\"%s\" gave %s with message \"%s\"", empty[k], mnistcu_result_name(r), mnistcu_ctx_error(ctx));
        }
    }
    TU_REQUIRE(mnistcu_model_create_spec(ctx, NULL, &m) == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "NULL spec");
    TU_REQUIRE(mnistcu_model_desc_parse(ctx, TL_LENET5, NULL) == MNISTCU_ERR_INVALID_ARGUMENT, "NULL desc");
    /* the context still works */
    TU_REQUIRE(mnistcu_model_create_spec(ctx, "10 dense2", &m) == MNISTCU_OK, "context unusable after errors");
done:
    free(many);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Impossible shapes: ERR_SHAPE at creation, no model, a message naming the
   layer's index. */
TEST spec_shape_errors(void)
{
    static const struct { const char *spec; int layer; } bad[] = {
        {"1x3x3 conv5x5x2 flatten dense2", 0},                          /* kernel larger than the map */
        {"1x8x8 relu conv3x3x2 maxpool2 conv5x5x2 flatten dense2", 3},  /* 3x3 map by then */
        {"1x8x8 conv3x3x2:s=2 relu dense10", 2},                        /* dense on a 3x3 map */
        {"1x4x4 conv3x3x2 dense10", 1},
        {"1x5x5 relu maxpool7 flatten dense2", 1},                      /* pool larger than the map */
        {"1x6x6 conv3x3x2 maxpool2x5 flatten dense2", 1},
        {"1x6x6 conv3x3x2 avgpool5x2 flatten dense2", 1},
        {"1x8x8 conv3x3x4", 0},                                         /* last layer not flat */
        {"1x8x8 conv3x3x4 relu", 1},
        {"10 dense300", 0},                                             /* more than 256 classes */
        {"10 relu dense5 dense257", 2},
        {"2x3x3 flatten dense4 dense1", 2},                             /* fewer than 2 */
    };
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_desc d;
    mnistcu_result r;
    const char *msg;
    size_t k;
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    for (k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        TU_REQUIRE(tl_parse(bad[k].spec, &d), "parse");
        TU_REQUIRE(mnistcu_model_desc_parse(ctx, bad[k].spec, &d) == MNISTCU_OK, "\"%s\" does not parse: %s",
                   bad[k].spec, mnistcu_ctx_error(ctx));
        m = (mnistcu_model *)&d;
        r = mnistcu_model_create_spec(ctx, bad[k].spec, &m);
        msg = mnistcu_ctx_error(ctx);
        TU_REQUIRE(r == MNISTCU_ERR_SHAPE && m == NULL, "\"%s\" gave %s (%s)", bad[k].spec, mnistcu_result_name(r), msg);
        TU_REQUIRE(tl_names_layer(msg, bad[k].layer), "\"%s\": the message does not name layer %d: %s", bad[k].spec,
                   bad[k].layer, msg);
        m = (mnistcu_model *)&d;
        TU_REQUIRE(mnistcu_model_create(ctx, &d, &m) == MNISTCU_ERR_SHAPE && m == NULL, "create from desc");
    }
    /* descs the grammar cannot write */
    {
        mnistcu_model_desc e;
        memset(&e, 0, sizeof e);
        e.input_w = 10;
        e.layers[0].kind = MNISTCU_LAYER_DENSE;
        e.layers[0].units = 2;
        e.layers[0].stride = 2; /* a field dense does not use */
        TU_REQUIRE(mnistcu_model_create(ctx, &e, &m) == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "dense with a stride");
        e.layers[0].stride = 0;
        e.layers[0].units = 0;
        TU_REQUIRE(mnistcu_model_create(ctx, &e, &m) == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "dense0");
        e.layers[0].kind = MNISTCU_LAYER_DROPOUT;
        e.layers[0].p = 1.0f;
        e.layers[1].kind = MNISTCU_LAYER_DENSE;
        e.layers[1].units = 2;
        TU_REQUIRE(mnistcu_model_create(ctx, &e, &m) == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "dropout p = 1");
        e.layers[0].kind = (mnistcu_layer_kind)MNISTCU_LAYER_KIND_COUNT;
        e.layers[0].p = 0.0f;
        TU_REQUIRE(mnistcu_model_create(ctx, &e, &m) == MNISTCU_ERR_INVALID_ARGUMENT && m == NULL, "unknown kind");
    }
done:
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* ========================================================================== */
/*                     Tensor names, shapes and layouts                        */
/* ========================================================================== */
typedef struct tl_tensor_want {
    const char *name;
    int ndim;
    int64_t shape[4];
    size_t count;
    int is_buffer, is_int;
} tl_tensor_want;

typedef struct tl_layer_want {
    const char *keyword, *torch, *token;
    int in[3], out[3];
    size_t params, buffers;
} tl_layer_want;

static int tl_check_tensors(const mnistcu_model *m, const tl_tensor_want *want, int n, int line)
{
    mnistcu_tensor_info ti;
    int i, k;
    if (mnistcu_model_num_tensors(m) != n) {
        tu_setf(line, "%d tensors, expected %d", mnistcu_model_num_tensors(m), n);
        return 0;
    }
    for (i = 0; i < n; ++i) {
        if (mnistcu_model_tensor_info(m, i, &ti) != MNISTCU_OK) {
            tu_setf(line, "tensor_info %d failed", i);
            return 0;
        }
        if (strcmp(ti.name, want[i].name) != 0 || ti.ndim != want[i].ndim || ti.count != want[i].count ||
            ti.is_buffer != want[i].is_buffer || ti.is_int != want[i].is_int || ti.layer != atoi(want[i].name)) {
            tu_setf(line, "tensor %d: \"%s\" ndim %d count %lu buffer %d int %d layer %d; expected \"%s\" %d %lu %d %d",
                    i, ti.name, ti.ndim, (unsigned long)ti.count, ti.is_buffer, ti.is_int, ti.layer, want[i].name,
                    want[i].ndim, (unsigned long)want[i].count, want[i].is_buffer, want[i].is_int);
            return 0;
        }
        for (k = 0; k < want[i].ndim; ++k)
            if (ti.shape[k] != want[i].shape[k]) {
                tu_setf(line, "tensor \"%s\": shape[%d] = %lld, expected %lld", ti.name, k, (long long)ti.shape[k],
                        (long long)want[i].shape[k]);
                return 0;
            }
    }
    if (mnistcu_model_tensor_info(m, n, &ti) != MNISTCU_ERR_INVALID_ARGUMENT ||
        mnistcu_model_tensor_info(m, -1, &ti) != MNISTCU_ERR_INVALID_ARGUMENT) {
        tu_setf(line, "tensor_info out of range accepted");
        return 0;
    }
    return 1;
}

static int tl_check_layers(const mnistcu_model *m, const tl_layer_want *want, int n, int line)
{
    mnistcu_layer_info li;
    mnistcu_model_info info;
    size_t buffers = 0;
    int i;
    mnistcu_model_info_get(m, &info);
    if (info.layer_count != n) {
        tu_setf(line, "layer_count %d, expected %d", info.layer_count, n);
        return 0;
    }
    for (i = 0; i < n; ++i) {
        const tl_layer_want *w = &want[i];
        if (mnistcu_model_layer_info(m, i, &li) != MNISTCU_OK) {
            tu_setf(line, "layer_info %d failed", i);
            return 0;
        }
        if (strcmp(li.keyword, w->keyword) != 0 || strcmp(li.torch_name, w->torch) != 0 ||
            strcmp(li.spec, w->token) != 0 || memcmp(li.in_shape, w->in, sizeof w->in) != 0 ||
            memcmp(li.out_shape, w->out, sizeof w->out) != 0 || li.num_params != w->params ||
            li.num_buffers != w->buffers) {
            tu_setf(line, "layer %d: %s %s \"%s\" %dx%dx%d -> %dx%dx%d, %lu params, %lu buffers; expected %s %s \"%s\" "
                          "%dx%dx%d -> %dx%dx%d, %lu, %lu",
                    i, li.keyword, li.torch_name, li.spec, li.in_shape[0], li.in_shape[1], li.in_shape[2],
                    li.out_shape[0], li.out_shape[1], li.out_shape[2], (unsigned long)li.num_params,
                    (unsigned long)li.num_buffers, w->keyword, w->torch, w->token, w->in[0], w->in[1], w->in[2],
                    w->out[0], w->out[1], w->out[2], (unsigned long)w->params, (unsigned long)w->buffers);
            return 0;
        }
        buffers += w->buffers;
    }
    if (info.num_buffers != buffers) {
        tu_setf(line, "info.num_buffers %lu, expected %lu", (unsigned long)info.num_buffers, (unsigned long)buffers);
        return 0;
    }
    if (mnistcu_model_layer_info(m, n, &li) != MNISTCU_ERR_INVALID_ARGUMENT ||
        mnistcu_model_layer_info(m, -1, &li) != MNISTCU_ERR_INVALID_ARGUMENT) {
        tu_setf(line, "layer_info out of range accepted");
        return 0;
    }
    return 1;
}

/* LeNet-5: torch.nn.Sequential's names (activations, pools and flatten take
   indices too), conv weights [out][in][kh][kw], dense [out][in]; the layers'
   shapes; PyTorch's default initialisation bounds 1/sqrt(fan_in). */
TEST names_lenet5(void)
{
    static const tl_tensor_want tensors[] = {
        {"0.weight", 4, {6, 1, 5, 5}, 150, 0, 0},     {"0.bias", 1, {6}, 6, 0, 0},
        {"3.weight", 4, {16, 6, 5, 5}, 2400, 0, 0},   {"3.bias", 1, {16}, 16, 0, 0},
        {"7.weight", 2, {120, 256}, 30720, 0, 0},     {"7.bias", 1, {120}, 120, 0, 0},
        {"9.weight", 2, {84, 120}, 10080, 0, 0},      {"9.bias", 1, {84}, 84, 0, 0},
        {"11.weight", 2, {10, 84}, 840, 0, 0},        {"11.bias", 1, {10}, 10, 0, 0},
    };
    static const tl_layer_want layers[] = {
        {"conv", "Conv2d", "conv5x5x6", {1, 28, 28}, {6, 24, 24}, 156, 0},
        {"relu", "ReLU", "relu", {6, 24, 24}, {6, 24, 24}, 0, 0},
        {"maxpool", "MaxPool2d", "maxpool2", {6, 24, 24}, {6, 12, 12}, 0, 0},
        {"conv", "Conv2d", "conv5x5x16", {6, 12, 12}, {16, 8, 8}, 2416, 0},
        {"relu", "ReLU", "relu", {16, 8, 8}, {16, 8, 8}, 0, 0},
        {"maxpool", "MaxPool2d", "maxpool2", {16, 8, 8}, {16, 4, 4}, 0, 0},
        {"flatten", "Flatten", "flatten", {16, 4, 4}, {256, 1, 1}, 0, 0},
        {"dense", "Linear", "dense120", {256, 1, 1}, {120, 1, 1}, 30840, 0},
        {"relu", "ReLU", "relu", {120, 1, 1}, {120, 1, 1}, 0, 0},
        {"dense", "Linear", "dense84", {120, 1, 1}, {84, 1, 1}, 10164, 0},
        {"relu", "ReLU", "relu", {84, 1, 1}, {84, 1, 1}, 0, 0},
        {"dense", "Linear", "dense10", {84, 1, 1}, {10, 1, 1}, 850, 0},
    };
    static const int fan_in[] = {25, 25, 150, 150, 256, 256, 120, 120, 84, 84};
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_model_info info;
    float *t = NULL;
    size_t k;
    int failed = 0, i;
    double bound, mx;
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(mnistcu_model_create_spec(ctx, "lenet5", &m) == MNISTCU_OK, "create");
    TU_REQUIRE_OK(tl_check_tensors(m, tensors, 10, __LINE__));
    TU_REQUIRE_OK(tl_check_layers(m, layers, 12, __LINE__));
    mnistcu_model_info_get(m, &info);
    TU_REQUIRE(info.input_shape[0] == 1 && info.input_shape[1] == 28 && info.input_shape[2] == 28 &&
                   info.inputs == 784 && info.classes == 10 && info.num_params == 44426 && info.num_buffers == 0,
               "model info: input %dx%dx%d, %lu inputs, %lu classes, %lu params", info.input_shape[0],
               info.input_shape[1], info.input_shape[2], (unsigned long)info.inputs, (unsigned long)info.classes,
               (unsigned long)info.num_params);
    t = tl_falloc(30720);
    TU_REQUIRE(t != NULL, "malloc");
    for (i = 0; i < 10; ++i) {
        TU_REQUIRE(mnistcu_model_get_tensor(m, tensors[i].name, t, tensors[i].count) == MNISTCU_OK, "get %s",
                   tensors[i].name);
        bound = 1.0 / sqrt((double)fan_in[i]);
        for (mx = 0.0, k = 0; k < tensors[i].count; ++k) mx = fabs((double)t[k]) > mx ? fabs((double)t[k]) : mx;
        TU_REQUIRE(mx <= bound * (1.0 + 1e-6) && mx >= bound * (tensors[i].count >= 84 ? 0.9 : 0.3),
                   "%s: max |value| %.6g, PyTorch's bound 1/sqrt(%d) = %.6g", tensors[i].name, mx, fan_in[i], bound);
    }
done:
    free(t);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

#define TL_BN_MODEL "1x6x6 conv3x3x4 batchnorm relu flatten dense8 batchnorm dense3"

/* Batch norm's tensors: weight, bias, then the buffers running_mean,
   running_var and num_batches_tracked (a 0-d integer), as in a state_dict;
   BatchNorm2d on maps, BatchNorm1d on flat data. */
TEST names_batchnorm(void)
{
    static const tl_tensor_want tensors[] = {
        {"0.weight", 4, {4, 1, 3, 3}, 36, 0, 0}, {"0.bias", 1, {4}, 4, 0, 0},
        {"1.weight", 1, {4}, 4, 0, 0},           {"1.bias", 1, {4}, 4, 0, 0},
        {"1.running_mean", 1, {4}, 4, 1, 0},     {"1.running_var", 1, {4}, 4, 1, 0},
        {"1.num_batches_tracked", 0, {0}, 1, 1, 1},
        {"4.weight", 2, {8, 64}, 512, 0, 0},     {"4.bias", 1, {8}, 8, 0, 0},
        {"5.weight", 1, {8}, 8, 0, 0},           {"5.bias", 1, {8}, 8, 0, 0},
        {"5.running_mean", 1, {8}, 8, 1, 0},     {"5.running_var", 1, {8}, 8, 1, 0},
        {"5.num_batches_tracked", 0, {0}, 1, 1, 1},
        {"6.weight", 2, {3, 8}, 24, 0, 0},       {"6.bias", 1, {3}, 3, 0, 0},
    };
    static const tl_layer_want layers[] = {
        {"conv", "Conv2d", "conv3x3x4", {1, 6, 6}, {4, 4, 4}, 40, 0},
        {"batchnorm", "BatchNorm2d", "batchnorm", {4, 4, 4}, {4, 4, 4}, 8, 8},
        {"relu", "ReLU", "relu", {4, 4, 4}, {4, 4, 4}, 0, 0},
        {"flatten", "Flatten", "flatten", {4, 4, 4}, {64, 1, 1}, 0, 0},
        {"dense", "Linear", "dense8", {64, 1, 1}, {8, 1, 1}, 520, 0},
        {"batchnorm", "BatchNorm1d", "batchnorm", {8, 1, 1}, {8, 1, 1}, 16, 16},
        {"dense", "Linear", "dense3", {8, 1, 1}, {3, 1, 1}, 27, 0},
    };
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    int failed = 0;
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(mnistcu_model_create_spec(ctx, TL_BN_MODEL, &m) == MNISTCU_OK, "create");
    TU_REQUIRE_OK(tl_check_tensors(m, tensors, 16, __LINE__));
    TU_REQUIRE_OK(tl_check_layers(m, layers, 7, __LINE__));
    TU_REQUIRE(mnistcu_model_num_params(m) == 40 + 8 + 520 + 16 + 27, "num_params %lu",
               (unsigned long)mnistcu_model_num_params(m));
    mnistcu_model_destroy(m);
    /* options show in the layer's token and resolved desc */
    TU_REQUIRE(mnistcu_model_create_spec(ctx, "2x4x4 batchnorm:eps=0.001:momentum=0.3 flatten dense2", &m) == MNISTCU_OK,
               "create");
    {
        mnistcu_layer_info li;
        TU_REQUIRE(mnistcu_model_layer_info(m, 0, &li) == MNISTCU_OK && li.desc.eps == 0.001f &&
                       li.desc.momentum == 0.3f && strcmp(li.spec, "batchnorm:eps=0.001:momentum=0.3") == 0 &&
                       strcmp(li.torch_name, "BatchNorm2d") == 0,
                   "batch norm options: eps %g momentum %g token \"%s\"", (double)li.desc.eps, (double)li.desc.momentum,
                   li.spec);
    }
done:
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* The parameter arena is the trainable tensors in name order: set_params and
   set_tensor, get_params and get_tensor, get_grads and get_tensor_grad agree;
   buffers live apart. */
TEST names_layout_agrees(void)
{
    mnistcu_ctx *ctx = tl_ctx();
    mnistcu_model *m = NULL;
    mnistcu_tensor_info ti;
    tu_rng rng = tu_rng_make(801);
    float *p = NULL, *q = NULL, *t = NULL, *x = NULL, rm[8];
    int32_t y[4] = {0, 1, 2, 1};
    size_t np, off, k;
    int failed = 0, i, nt;
    TU_REQUIRE(ctx != NULL, "no context");
    TU_REQUIRE(mnistcu_model_create_spec(ctx, TL_BN_MODEL, &m) == MNISTCU_OK, "create");
    np = mnistcu_model_num_params(m);
    nt = mnistcu_model_num_tensors(m);
    p = tl_falloc(np);
    q = tl_falloc(np);
    t = tl_falloc(np);
    x = tu_random_floats(&rng, 4 * 36, -1.0f, 1.0f);
    TU_REQUIRE(p && q && t && x, "malloc");
    for (k = 0; k < np; ++k) p[k] = (float)k * 0.001f - 0.3f;
    TU_REQUIRE(mnistcu_model_set_params(m, p, np) == MNISTCU_OK, "set_params");
    for (off = 0, i = 0; i < nt; ++i) {
        TU_REQUIRE(mnistcu_model_tensor_info(m, i, &ti) == MNISTCU_OK, "tensor_info");
        TU_REQUIRE(mnistcu_model_get_tensor(m, ti.name, t, ti.count) == MNISTCU_OK, "get %s", ti.name);
        if (ti.is_buffer) {
            if (!ti.is_int)
                for (k = 0; k < ti.count; ++k)
                    TU_REQUIRE(t[k] == (strstr(ti.name, "running_var") ? 1.0f : 0.0f),
                               "%s[%lu] = %g: set_params reached a buffer", ti.name, (unsigned long)k, (double)t[k]);
            continue;
        }
        TU_REQUIRE(memcmp(t, p + off, ti.count * sizeof(float)) == 0, "%s is not arena slice %lu..%lu", ti.name,
                   (unsigned long)off, (unsigned long)(off + ti.count));
        off += ti.count;
    }
    TU_REQUIRE(off == np, "the trainable tensors hold %lu floats, the arena %lu", (unsigned long)off, (unsigned long)np);
    /* set by name, read the arena */
    for (k = 0; k < np; ++k) q[k] = (float)tu_uniform(&rng, -1.0, 1.0);
    for (off = 0, i = 0; i < nt; ++i) {
        TU_REQUIRE(mnistcu_model_tensor_info(m, i, &ti) == MNISTCU_OK, "tensor_info");
        if (ti.is_buffer) continue;
        TU_REQUIRE(mnistcu_model_set_tensor(m, ti.name, q + off, ti.count) == MNISTCU_OK, "set %s", ti.name);
        off += ti.count;
    }
    TU_REQUIRE(mnistcu_model_get_params(m, p, np) == MNISTCU_OK && memcmp(p, q, np * sizeof(float)) == 0,
               "set_tensor by name and get_params disagree");
    /* buffers by name */
    for (k = 0; k < 8; ++k) rm[k] = (float)k - 3.5f;
    TU_REQUIRE(mnistcu_model_set_tensor(m, "5.running_mean", rm, 8) == MNISTCU_OK, "set running_mean");
    memset(rm, 0, sizeof rm);
    TU_REQUIRE(mnistcu_model_get_tensor(m, "5.running_mean", rm, 8) == MNISTCU_OK && rm[0] == -3.5f && rm[7] == 3.5f,
               "running_mean round trip");
    TU_REQUIRE(mnistcu_model_get_params(m, p, np) == MNISTCU_OK && memcmp(p, q, np * sizeof(float)) == 0,
               "setting a buffer changed the parameters");
    /* gradients by name */
    TU_REQUIRE(mnistcu_model_compute_grads(m, x, y, 4, NULL) == MNISTCU_OK, "compute_grads: %s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(mnistcu_model_get_grads(m, p, np) == MNISTCU_OK, "get_grads");
    for (off = 0, i = 0; i < nt; ++i) {
        TU_REQUIRE(mnistcu_model_tensor_info(m, i, &ti) == MNISTCU_OK, "tensor_info");
        if (ti.is_buffer) continue;
        TU_REQUIRE(mnistcu_model_get_tensor_grad(m, ti.name, t, ti.count) == MNISTCU_OK &&
                       memcmp(t, p + off, ti.count * sizeof(float)) == 0,
                   "get_tensor_grad(%s) is not the slice of get_grads", ti.name);
        off += ti.count;
    }
    /* refusals */
    TU_REQUIRE(mnistcu_model_get_tensor(m, "2.weight", t, 1) == MNISTCU_ERR_NOT_FOUND, "a relu has a weight");
    TU_REQUIRE(mnistcu_model_get_tensor(m, "0.weight", t, 35) == MNISTCU_ERR_SHAPE, "a wrong count");
    TU_REQUIRE(mnistcu_model_set_tensor(m, "0.weight", t, 37) == MNISTCU_ERR_SHAPE, "a wrong count");
    TU_REQUIRE(mnistcu_model_get_tensor(m, NULL, t, 1) == MNISTCU_ERR_INVALID_ARGUMENT, "NULL name");
    TU_REQUIRE(mnistcu_model_get_tensor(m, "0.bias", NULL, 4) == MNISTCU_ERR_INVALID_ARGUMENT, "NULL array");
    TU_REQUIRE(mnistcu_model_get_params(m, p, np) == MNISTCU_OK && memcmp(p, q, np * sizeof(float)) == 0,
               "refused calls changed the parameters");
done:
    free(p);
    free(q);
    free(t);
    free(x);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

SUITE(layers_suite)
{
    size_t k;
    RUN_TEST(philox_known_answers);
    RUN_TEST(every_kind_has_a_test);
    for (k = 0; k < TL_KIND_TESTS; ++k)
        if (greatest_test_pre(tl_kind_tests[k].name)) greatest_test_post(tl_kind_tests[k].fn());
    RUN_TEST(maxpool_ties_route_to_first);
    RUN_TEST(cnn_mini_lenet);
    RUN_TEST(cnn_every_kind);
    RUN_TEST(cnn_presets);
    RUN_TEST(checks_detect_errors);
    RUN_TEST(batchnorm_running_statistics);
    RUN_TEST(batchnorm_batch1_flat);
    RUN_TEST(dropout_mask_is_philox);
    RUN_TEST(dropout_mask_follows_the_step);
    RUN_TEST(dropout_masks_by_layer_and_seed);
    RUN_TEST(dropout_eval_is_identity);
    RUN_TEST(mode_changes_only_batchnorm_and_dropout);
    RUN_TEST(train_forward_dropout_is_one_batch);
    RUN_TEST(train_forward_batchnorm_is_one_batch);
    RUN_TEST(spec_parse_valid);
    RUN_TEST(spec_presets_and_mlp);
    RUN_TEST(spec_round_trips);
    RUN_TEST(spec_invalid);
    RUN_TEST(spec_shape_errors);
    RUN_TEST(names_lenet5);
    RUN_TEST(names_batchnorm);
    RUN_TEST(names_layout_agrees);
    if (GREATEST_IS_VERBOSE()) {
        mnistcu_ctx *ctx = tl_ctx();
        printf("  layers_suite runs on %s\n", ctx ? mnistcu_ctx_device_name(ctx) : "(no context)");
        mnistcu_ctx_destroy(ctx);
    }
    if (GREATEST_IS_VERBOSE() && tl_worst.cases)
        printf("  worst over %d cases: logits |d| %.3g (rel %.3g, /tol %.3g); gradients |d| %.3g (rel %.3g, "
               "/tol %.3g); loss rel %.3g\n",
               tl_worst.cases, tl_worst.fwd_abs, tl_worst.fwd_rel, tl_worst.fwd_score, tl_worst.grad_abs,
               tl_worst.grad_rel, tl_worst.grad_score, tl_worst.loss_rel);
}
