/* Datasets (create, load from memory and folders, normalisation, split, real
   MNIST) and the public API's contracts (argument checks, result names, the
   environment, allocators, logging). Public API only: the implementation lives
   in test_main.c. References are computed here, in double, from the bytes the
   tests build themselves. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, mkdir, rmdir, unlink, getpid under -std=c99 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>
#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

/* ---- helpers: IDX bytes built by hand ------------------------------------- */

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static size_t idx_elem_size(unsigned type)
{
    switch (type) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    default: return 8;
    }
}

/* A malloc'ed IDX file: header, then the n values (given as doubles) encoded
   big-endian as `type`. *size receives its length. */
static unsigned char *build_idx(unsigned type, int ndim, const uint32_t *dims, const double *values, size_t n,
                                size_t *size)
{
    size_t es = idx_elem_size(type), header = 4 + 4 * (size_t)ndim, i;
    unsigned char *buf = (unsigned char *)malloc(header + n * es + 1);
    int d, b;
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = (unsigned char)type;
    buf[3] = (unsigned char)ndim;
    for (d = 0; d < ndim; ++d) put_be32(buf + 4 + 4 * d, dims[d]);
    for (i = 0; i < n; ++i) {
        unsigned char *p = buf + header + i * es;
        uint64_t bits = 0;
        if (type == 0x0D) {
            float f = (float)values[i];
            uint32_t u;
            memcpy(&u, &f, 4);
            bits = u;
        } else if (type == 0x0E) {
            memcpy(&bits, &values[i], 8);
        } else {
            int64_t v = (int64_t)values[i];
            bits = (uint64_t)v; /* two's complement; the low es bytes are written */
        }
        for (b = 0; b < (int)es; ++b) p[b] = (unsigned char)(bits >> (8 * ((int)es - 1 - b)));
    }
    *size = header + n * es;
    return buf;
}

/* Loads a dataset from IDX bytes in memory. */
static mnistcu_result load_mem(mnistcu_ctx *ctx, const unsigned char *img, size_t img_size, const unsigned char *lab,
                               size_t lab_size, int num_classes, mnistcu_norm norm, size_t limit, mnistcu_dataset **out)
{
    mnistcu_dataset_desc d;
    memset(&d, 0, sizeof d);
    d.images_data = img;
    d.images_size = img_size;
    d.labels_data = lab;
    d.labels_size = lab_size;
    d.num_classes = num_classes;
    d.norm = norm;
    d.limit = limit;
    return mnistcu_dataset_load(ctx, &d, out);
}

/* A u8 image set [n][rows][cols] and u8 labels, random bytes in [lo, hi]. */
typedef struct u8_set {
    size_t n, features;
    double *pix, *lab;      /* values as doubles (for build_idx) */
    unsigned char *img_bytes, *lab_bytes;
    size_t img_size, lab_size;
} u8_set;

static void u8_set_make(u8_set *s, tu_rng *rng, size_t n, uint32_t rows, uint32_t cols, int lo, int hi, int classes)
{
    uint32_t idims[3], ldims[1];
    size_t i;
    s->n = n;
    s->features = (size_t)rows * cols;
    s->pix = (double *)malloc(n * s->features * sizeof(double));
    s->lab = (double *)malloc(n * sizeof(double));
    for (i = 0; i < n * s->features; ++i) s->pix[i] = (double)(lo + (int)(tu_next(rng) % (uint64_t)(hi - lo + 1)));
    for (i = 0; i < n; ++i) s->lab[i] = (double)(tu_next(rng) % (uint64_t)classes);
    idims[0] = (uint32_t)n; idims[1] = rows; idims[2] = cols;
    ldims[0] = (uint32_t)n;
    s->img_bytes = build_idx(0x08, 3, idims, s->pix, n * s->features, &s->img_size);
    s->lab_bytes = build_idx(0x08, 1, ldims, s->lab, n, &s->lab_size);
}

static void u8_set_free(u8_set *s)
{
    free(s->pix); free(s->lab); free(s->img_bytes); free(s->lab_bytes);
}

/* Mean and standard deviation (population) of v/255 over all values, in double. */
static void unit_stats(const double *v, size_t n, double *mean, double *sd)
{
    double s = 0.0, q = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) s += v[i] / 255.0;
    *mean = s / (double)n;
    for (i = 0; i < n; ++i) q += (v[i] / 255.0 - *mean) * (v[i] / 255.0 - *mean);
    *sd = sqrt(q / (double)n);
}

/* All normalised features of a dataset, [count][features], malloc'ed. */
static float *all_samples(const mnistcu_dataset *ds, int32_t *labels)
{
    mnistcu_dataset_info info;
    float *x;
    size_t i;
    mnistcu_dataset_info_get(ds, &info);
    x = (float *)malloc((info.count * info.features + 1) * sizeof(float));
    for (i = 0; i < info.count; ++i)
        if (mnistcu_dataset_sample(ds, i, x + i * info.features, labels ? labels + i : NULL) != MNISTCU_OK) {
            free(x);
            return NULL;
        }
    return x;
}

/* Mean and variance of the n floats, in double. */
static void float_moments(const float *x, size_t n, double *mean, double *var)
{
    double s = 0.0, q = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) s += x[i];
    *mean = s / (double)n;
    for (i = 0; i < n; ++i) q += ((double)x[i] - *mean) * ((double)x[i] - *mean);
    *var = q / (double)n;
}

static char not_set_target[16];
#define NOT_SET ((mnistcu_dataset *)(void *)not_set_target) /* poison for out pointers */

/* ---- temp folders ------------------------------------------------------- */
static void temp_dir_name(char *buf, size_t size, const char *tag)
{
    snprintf(buf, size, "/tmp/mnistcu_test_%ld_%s", (long)getpid(), tag);
}

static int write_file(const char *path, const unsigned char *data, size_t size, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        int ok;
        if (!f) return 0;
        ok = gzwrite(f, data, (unsigned)size) == (int)size;
        return gzclose(f) == Z_OK && ok;
    } else {
        FILE *f = fopen(path, "wb");
        int ok;
        if (!f) return 0;
        ok = fwrite(data, 1, size, f) == size;
        return fclose(f) == 0 && ok;
    }
}

/* ======================================================================== */
/*                               dataset_suite                              */
/* ======================================================================== */

TEST create_copies_and_never_writes_input(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(101);
    size_t n = 37, F = 13, i;
    float *x = tu_random_floats(&rng, n * F, -3.0f, 3.0f), *x0 = (float *)malloc(n * F * sizeof(float)), *got;
    int32_t labels[37], labels0[37], glab[37];
    mnistcu_dataset *ds = NOT_SET;
    mnistcu_dataset_info info;
    ASSERT(ctx != NULL);
    for (i = 0; i < n; ++i) labels[i] = (int32_t)(i % 5);
    memcpy(x0, x, n * F * sizeof(float));
    memcpy(labels0, labels, sizeof labels);
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_dataset_create(ctx, x, labels, n, F, 5, &ds), mnistcu_result_name);
    ASSERT(ds != NULL && ds != NOT_SET);
    ASSERT_MEM_EQ(x0, x, n * F * sizeof(float));          /* the caller's arrays are never modified */
    ASSERT_MEM_EQ(labels0, labels, sizeof labels);
    for (i = 0; i < n * F; ++i) x[i] = 1e6f;              /* changing them afterwards changes nothing */
    for (i = 0; i < n; ++i) labels[i] = 4 - labels[i];
    mnistcu_dataset_info_get(ds, &info);
    ASSERT_EQ((size_t)37, info.count);
    ASSERT_EQ((size_t)13, info.features);
    ASSERT_EQ(1, info.rows);
    ASSERT_EQ(13, info.cols);
    ASSERT_EQ(5, info.num_classes);
    ASSERT_EQ(0, info.stored_u8);
    got = all_samples(ds, glab);
    ASSERT(got != NULL);
    {   /* a label outside the classes is refused */
        mnistcu_dataset *bad = NOT_SET;
        ASSERT_ENUM_EQ(MNISTCU_ERR_LABEL_RANGE, mnistcu_dataset_create(ctx, x0, glab, n, F, 4, &bad),
                       mnistcu_result_name);
        ASSERT(bad == NULL);
        ASSERT(strstr(mnistcu_ctx_error(ctx), "label") != NULL);
    }
    ASSERT_ARRAY_EQ_BITS_F(got, x0, n * F);               /* created data is "already normalised" */
    ASSERT_MEM_EQ(labels0, glab, sizeof glab);
    free(got); free(x); free(x0);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST sample_gives_normalised_features(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(7);
    u8_set s;
    mnistcu_dataset *unit = NULL, *std = NULL;
    double mean, sd;
    float row[12];
    int32_t label = -1;
    size_t i, j;
    u8_set_make(&s, &rng, 20, 3, 4, 0, 255, 10);
    unit_stats(s.pix, s.n * s.features, &mean, &sd);
    ASSERT_ENUM_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0, MNISTCU_NORM_UNIT, 0,
                                        &unit), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0,
                                        MNISTCU_NORM_STANDARD, 0, &std), mnistcu_result_name);
    for (i = 0; i < s.n; ++i) {
        ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(unit, i, row, &label));
        ASSERT_EQ((int32_t)s.lab[i], label);
        for (j = 0; j < 12; ++j) ASSERT_NEAR(row[j], s.pix[i * 12 + j] / 255.0, 1e-7, 1e-6);
        ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(std, i, row, NULL));
        for (j = 0; j < 12; ++j) ASSERT_NEAR(row[j], (s.pix[i * 12 + j] / 255.0 - mean) / sd, 1e-5, 1e-5);
    }
    /* either pointer may be NULL; an index past the end is an error */
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(std, 3, NULL, &label));
    ASSERT_EQ((int32_t)s.lab[3], label);
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(std, 3, NULL, NULL));
    ASSERT_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_dataset_sample(std, 20, row, &label));
    ASSERT(mnistcu_ctx_error(ctx)[0] != 0);
    u8_set_free(&s);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* u8 3-d images with every integer label type: the values come back exactly. */
TEST load_u8_images_every_label_type(void)
{
    static const unsigned types[] = {0x08, 0x09, 0x0B, 0x0C};
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(3);
    u8_set s;
    double lab[6] = {0, 9, 3, 200, 1, 77};
    uint32_t ldims[1] = {6};
    float row[35];
    int32_t label;
    size_t t, i, j;
    u8_set_make(&s, &rng, 6, 5, 7, 0, 255, 10);
    for (t = 0; t < 4; ++t) {
        size_t lsize;
        unsigned char *lb;
        mnistcu_dataset *ds = NOT_SET;
        mnistcu_dataset_info info;
        if (types[t] == 0x09) lab[3] = 100; /* int8 holds at most 127 */
        else lab[3] = 200;
        lb = build_idx(types[t], 1, ldims, lab, 6, &lsize);
        ASSERT_ENUM_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, lb, lsize, 256, MNISTCU_NORM_NONE, 0, &ds),
                       mnistcu_result_name);
        mnistcu_dataset_info_get(ds, &info);
        ASSERT_EQ((size_t)6, info.count);
        ASSERT_EQ(5, info.rows);
        ASSERT_EQ(7, info.cols);
        ASSERT_EQ((size_t)35, info.features);
        ASSERT_EQ(256, info.num_classes);
        ASSERT_EQ(1, info.stored_u8);
        ASSERT_EQ(1.0f, info.scale);
        ASSERT_EQ(0.0f, info.shift);
        for (i = 0; i < 6; ++i) {
            ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(ds, i, row, &label));
            ASSERT_EQm(mnistcu_idx_type_name((mnistcu_idx_type)types[t]), (int32_t)lab[i], label);
            for (j = 0; j < 35; ++j) ASSERT_EQ((float)s.pix[i * 35 + j], row[j]);
        }
        mnistcu_dataset_destroy(ds);
        free(lb);
    }
    u8_set_free(&s);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* float images, 2-d ([N][features]) and 3-d: stored as floats, NONE by default. */
TEST load_float_images_2d_and_3d(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(17);
    double pix[8 * 6], lab[8];
    uint32_t d2[2] = {8, 6}, d3[3] = {8, 2, 3}, dl[1] = {8};
    unsigned char *i2, *i3, *lb, *i2d;
    size_t s2, s3, sl, s2d, i, j;
    mnistcu_dataset *a = NULL, *b = NULL, *c = NULL;
    mnistcu_dataset_info info;
    float row[6];
    int32_t label;
    for (i = 0; i < 48; ++i) pix[i] = (double)(float)tu_uniform(&rng, -50.0, 50.0);
    for (i = 0; i < 8; ++i) lab[i] = (double)(i % 3);
    i2 = build_idx(0x0D, 2, d2, pix, 48, &s2);
    i3 = build_idx(0x0D, 3, d3, pix, 48, &s3);
    i2d = build_idx(0x0E, 2, d2, pix, 48, &s2d); /* float64 images too */
    lb = build_idx(0x0C, 1, dl, lab, 8, &sl);
    ASSERT_ENUM_EQ(MNISTCU_OK, load_mem(ctx, i2, s2, lb, sl, 3, MNISTCU_NORM_DEFAULT, 0, &a), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_OK, load_mem(ctx, i3, s3, lb, sl, 3, MNISTCU_NORM_UNIT, 0, &b), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_OK, load_mem(ctx, i2d, s2d, lb, sl, 3, MNISTCU_NORM_NONE, 0, &c), mnistcu_result_name);
    mnistcu_dataset_info_get(a, &info);
    ASSERT_EQ(1, info.rows);
    ASSERT_EQ(6, info.cols);
    ASSERT_EQ(0, info.stored_u8);
    ASSERT_EQ(1.0f, info.scale);
    ASSERT_EQ(0.0f, info.shift);
    mnistcu_dataset_info_get(b, &info);
    ASSERT_EQ(2, info.rows);
    ASSERT_EQ(3, info.cols);
    ASSERT_EQ((size_t)6, info.features);
    for (i = 0; i < 8; ++i) {
        ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(a, i, row, &label));
        ASSERT_EQ((int32_t)lab[i], label);
        for (j = 0; j < 6; ++j) ASSERT_EQ((float)pix[i * 6 + j], row[j]); /* NONE: as stored */
        ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(b, i, row, NULL));
        for (j = 0; j < 6; ++j) ASSERT_EQ((float)pix[i * 6 + j], row[j]); /* UNIT only scales uint8 */
        ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(c, i, row, NULL));
        for (j = 0; j < 6; ++j) ASSERT_EQ((float)pix[i * 6 + j], row[j]);
    }
    free(i2); free(i3); free(i2d); free(lb);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* STANDARD gives zero mean and unit variance (in double, over the whole set),
   DEFAULT is STANDARD for uint8 and NONE for floats. */
TEST norm_modes(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(23);
    u8_set s;
    mnistcu_dataset *none = NULL, *unit = NULL, *std = NULL, *def = NULL, *fstd = NULL, *fdef = NULL;
    float *xn, *xu, *xs, *xd, *xfs, *xfd;
    double mean, var, fpix[40 * 10], flab[40];
    uint32_t fd[2] = {40, 10}, fl[1] = {40};
    unsigned char *fi, *fb;
    size_t fis, fbs, i, N;
    u8_set_make(&s, &rng, 40, 2, 5, 10, 200, 10);
    N = s.n * s.features;
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0, MNISTCU_NORM_NONE, 0, &none));
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0, MNISTCU_NORM_UNIT, 0, &unit));
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0, MNISTCU_NORM_STANDARD, 0, &std));
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0, MNISTCU_NORM_DEFAULT, 0, &def));
    xn = all_samples(none, NULL); xu = all_samples(unit, NULL); xs = all_samples(std, NULL); xd = all_samples(def, NULL);
    for (i = 0; i < N; ++i) {
        ASSERT_EQ((float)s.pix[i], xn[i]);
        ASSERT_NEAR(xu[i], s.pix[i] / 255.0, 1e-7, 1e-6);
    }
    float_moments(xs, N, &mean, &var);
    ASSERT_NEAR(mean, 0.0, 1e-5, 0);
    ASSERT_NEAR(var, 1.0, 1e-4, 0);
    ASSERT_ARRAY_NEAR_F(xd, xs, N, 1e-6, 1e-6);

    /* floats: DEFAULT is NONE, STANDARD standardises the raw values */
    for (i = 0; i < 400; ++i) fpix[i] = (double)(float)tu_uniform(&rng, 3.0, 11.0);
    for (i = 0; i < 40; ++i) flab[i] = (double)(i % 10);
    fi = build_idx(0x0D, 2, fd, fpix, 400, &fis);
    fb = build_idx(0x08, 1, fl, flab, 40, &fbs);
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, fi, fis, fb, fbs, 0, MNISTCU_NORM_STANDARD, 0, &fstd));
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, fi, fis, fb, fbs, 0, MNISTCU_NORM_DEFAULT, 0, &fdef));
    xfs = all_samples(fstd, NULL); xfd = all_samples(fdef, NULL);
    float_moments(xfs, 400, &mean, &var);
    ASSERT_NEAR(mean, 0.0, 1e-5, 0);
    ASSERT_NEAR(var, 1.0, 1e-4, 0);
    for (i = 0; i < 400; ++i) ASSERT_EQ((float)fpix[i], xfd[i]);
    free(xn); free(xu); free(xs); free(xd); free(xfs); free(xfd); free(fi); free(fb);
    u8_set_free(&s);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* normalize_like: the features of ds follow ref's statistics, computed here. */
TEST normalize_like_uses_the_reference_statistics(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(29);
    u8_set a, b, c;
    mnistcu_dataset *da = NULL, *db = NULL, *dc = NULL, *df = NULL;
    mnistcu_dataset_info ia, ib;
    double mean_a, sd_a;
    float *x;
    float fx[4 * 6];
    int32_t fl[4] = {0, 1, 0, 1};
    size_t i;
    u8_set_make(&a, &rng, 30, 2, 3, 0, 120, 10);   /* dark */
    u8_set_make(&b, &rng, 25, 2, 3, 100, 255, 10); /* bright: different statistics */
    u8_set_make(&c, &rng, 5, 1, 5, 0, 255, 10);    /* another feature count */
    unit_stats(a.pix, a.n * a.features, &mean_a, &sd_a);
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, a.img_bytes, a.img_size, a.lab_bytes, a.lab_size, 0, MNISTCU_NORM_DEFAULT, 0, &da));
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, b.img_bytes, b.img_size, b.lab_bytes, b.lab_size, 0, MNISTCU_NORM_DEFAULT, 0, &db));
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, c.img_bytes, c.img_size, c.lab_bytes, c.lab_size, 0, MNISTCU_NORM_DEFAULT, 0, &dc));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_normalize_like(db, da));
    mnistcu_dataset_info_get(da, &ia);
    mnistcu_dataset_info_get(db, &ib);
    ASSERT_EQ(ia.scale, ib.scale);
    ASSERT_EQ(ia.shift, ib.shift);
    x = all_samples(db, NULL);
    for (i = 0; i < b.n * b.features; ++i) ASSERT_NEAR(x[i], (b.pix[i] / 255.0 - mean_a) / sd_a, 1e-5, 1e-5);
    free(x);
    /* a different feature count or storage type is refused, and changes nothing */
    ASSERT_ENUM_EQ(MNISTCU_ERR_SHAPE, mnistcu_dataset_normalize_like(dc, da), mnistcu_result_name);
    for (i = 0; i < 24; ++i) fx[i] = (float)i;
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_create(ctx, fx, fl, 4, 6, 2, &df));
    ASSERT_ENUM_EQ(MNISTCU_ERR_SHAPE, mnistcu_dataset_normalize_like(df, da), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_SHAPE, mnistcu_dataset_normalize_like(da, df), mnistcu_result_name);
    ASSERT(mnistcu_ctx_error(ctx)[0] != 0);
    mnistcu_dataset_info_get(da, &ib);
    ASSERT_EQ(ia.scale, ib.scale);
    ASSERT_EQ(ia.shift, ib.shift);
    u8_set_free(&a); u8_set_free(&b); u8_set_free(&c);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST limit_keeps_the_first_samples(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(31);
    u8_set s;
    mnistcu_dataset *l4 = NULL, *big = NULL, *std4 = NULL;
    mnistcu_dataset_info info;
    float *x;
    int32_t labels[10];
    double mean, var;
    size_t i;
    u8_set_make(&s, &rng, 10, 3, 3, 0, 255, 10);
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0, MNISTCU_NORM_NONE, 4, &l4));
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0, MNISTCU_NORM_NONE, 100, &big));
    ASSERT_EQ(MNISTCU_OK,
              load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0, MNISTCU_NORM_STANDARD, 4, &std4));
    mnistcu_dataset_info_get(l4, &info);
    ASSERT_EQ((size_t)4, info.count);
    mnistcu_dataset_info_get(big, &info);
    ASSERT_EQ((size_t)10, info.count);
    x = all_samples(l4, labels);
    for (i = 0; i < 4 * 9; ++i) ASSERT_EQ((float)s.pix[i], x[i]);
    for (i = 0; i < 4; ++i) ASSERT_EQ((int32_t)s.lab[i], labels[i]);
    free(x);
    x = all_samples(std4, NULL); /* statistics over the kept samples only */
    float_moments(x, 4 * 9, &mean, &var);
    ASSERT_NEAR(mean, 0.0, 1e-5, 0);
    ASSERT_NEAR(var, 1.0, 1e-4, 0);
    free(x);
    u8_set_free(&s);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* Every failing load: the expected code, *out NULL, a message in the context. */
static greatest_test_res expect_load_error(mnistcu_ctx *ctx, const unsigned char *img, size_t img_size,
                                           const unsigned char *lab, size_t lab_size, int classes, mnistcu_result want)
{
    mnistcu_dataset *ds = NOT_SET;
    mnistcu_ctx_clear_error(ctx);
    ASSERT_ENUM_EQ(want, load_mem(ctx, img, img_size, lab, lab_size, classes, MNISTCU_NORM_DEFAULT, 0, &ds),
                   mnistcu_result_name);
    ASSERT(ds == NULL);
    ASSERT(mnistcu_ctx_error(ctx)[0] != 0);
    ASSERT_ENUM_EQ(want, mnistcu_ctx_last_result(ctx), mnistcu_result_name);
    PASS();
}

TEST load_errors(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    double v[64], lab[4] = {0, 1, 2, 3}, big[4] = {0, 1, 10, 3}, neg[4] = {0, -1, 2, 3};
    uint32_t d3[3] = {4, 2, 2}, d1[1] = {4}, d1x[1] = {16}, d4[4] = {4, 1, 2, 2}, d3x[3] = {5, 2, 2}, d2l[2] = {4, 1};
    unsigned char *img, *img1, *img4, *img5, *lb, *lbig, *lneg, *lf32, *lf64, *l2;
    size_t si, si1, si4, si5, sl, slb, sln, slf, slf64, sl2;
    int i;
    for (i = 0; i < 64; ++i) v[i] = (double)(i * 3);
    img = build_idx(0x08, 3, d3, v, 16, &si);
    img1 = build_idx(0x08, 1, d1x, v, 16, &si1);
    img4 = build_idx(0x08, 4, d4, v, 16, &si4);
    img5 = build_idx(0x08, 3, d3x, v, 20, &si5);
    lb = build_idx(0x08, 1, d1, lab, 4, &sl);
    lbig = build_idx(0x08, 1, d1, big, 4, &slb);
    lneg = build_idx(0x09, 1, d1, neg, 4, &sln);
    lf32 = build_idx(0x0D, 1, d1, lab, 4, &slf);
    lf64 = build_idx(0x0E, 1, d1, lab, 4, &slf64);
    l2 = build_idx(0x08, 2, d2l, lab, 4, &sl2);
    ASSERT(ctx != NULL);
    {   /* the well-formed pair loads */
        mnistcu_dataset *ds = NULL;
        ASSERT_EQ(MNISTCU_OK, load_mem(ctx, img, si, lb, sl, 0, MNISTCU_NORM_DEFAULT, 0, &ds));
        mnistcu_dataset_destroy(ds);
    }
    CHECK_CALL(expect_load_error(ctx, img5, si5, lb, sl, 0, MNISTCU_ERR_COUNT_MISMATCH));
    CHECK_CALL(expect_load_error(ctx, img, si, lbig, slb, 0, MNISTCU_ERR_LABEL_RANGE));   /* 10 >= 10 classes */
    CHECK_CALL(expect_load_error(ctx, img, si, lb, sl, 3, MNISTCU_ERR_LABEL_RANGE));      /* 3 >= 3 classes */
    CHECK_CALL(expect_load_error(ctx, img, si, lneg, sln, 0, MNISTCU_ERR_LABEL_RANGE));   /* -1 */
    CHECK_CALL(expect_load_error(ctx, img, si, lf32, slf, 0, MNISTCU_ERR_IDX_SHAPE));     /* float labels */
    CHECK_CALL(expect_load_error(ctx, img, si, lf64, slf64, 0, MNISTCU_ERR_IDX_SHAPE));
    CHECK_CALL(expect_load_error(ctx, img, si, l2, sl2, 0, MNISTCU_ERR_IDX_SHAPE));       /* 2-d labels */
    CHECK_CALL(expect_load_error(ctx, img1, si1, lb, sl, 0, MNISTCU_ERR_IDX_SHAPE));      /* 1-d images */
    CHECK_CALL(expect_load_error(ctx, img4, si4, lb, sl, 0, MNISTCU_ERR_IDX_SHAPE));      /* 4-d images */
    CHECK_CALL(expect_load_error(ctx, img, si - 1, lb, sl, 0, MNISTCU_ERR_IDX_TRUNCATED));
    CHECK_CALL(expect_load_error(ctx, img, si, lb, sl, 1, MNISTCU_ERR_INVALID_ARGUMENT)); /* 1 class */
    CHECK_CALL(expect_load_error(ctx, img, si, NULL, 0, 0, MNISTCU_ERR_INVALID_ARGUMENT));
    free(img); free(img1); free(img4); free(img5); free(lb); free(lbig); free(lneg); free(lf32); free(lf64); free(l2);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST load_dir_empty_folder_is_not_found(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds = NOT_SET;
    char dir[256];
    mnistcu_result r;
    temp_dir_name(dir, sizeof dir, "empty");
    ASSERT(ctx != NULL);
    ASSERTm("mkdir under /tmp", mkdir(dir, 0700) == 0);
    r = mnistcu_dataset_load_dir(ctx, dir, MNISTCU_SPLIT_TRAIN, &ds);
    rmdir(dir);
    ASSERT_ENUM_EQ(MNISTCU_ERR_NOT_FOUND, r, mnistcu_result_name);
    ASSERT(ds == NULL);
    ASSERTm("the message names the folder", strstr(mnistcu_ctx_error(ctx), dir) != NULL);
    ds = NOT_SET;
    ASSERT_ENUM_EQ(MNISTCU_ERR_NOT_FOUND, mnistcu_dataset_load_dir(ctx, dir, MNISTCU_SPLIT_TEST, &ds),
                   mnistcu_result_name); /* the folder is gone now */
    ASSERT(ds == NULL);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* train-images.idx3-ubyte style, gzipped and raw, both splits. */
TEST load_dir_other_naming_style(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(41);
    u8_set tr, te;
    char dir[256], p[4][320];
    mnistcu_dataset *dtr = NULL, *dte = NULL;
    mnistcu_dataset_desc d;
    mnistcu_dataset_info info;
    float *x;
    int32_t labels[9];
    int ok = 1, k;
    size_t i;
    mnistcu_result r1, r2;
    u8_set_make(&tr, &rng, 9, 4, 3, 0, 255, 10);
    u8_set_make(&te, &rng, 5, 4, 3, 0, 255, 10);
    temp_dir_name(dir, sizeof dir, "style");
    ASSERT(ctx != NULL);
    ASSERTm("mkdir under /tmp", mkdir(dir, 0700) == 0);
    snprintf(p[0], sizeof p[0], "%s/train-images.idx3-ubyte.gz", dir);
    snprintf(p[1], sizeof p[1], "%s/train-labels.idx1-ubyte", dir);
    snprintf(p[2], sizeof p[2], "%s/t10k-images.idx3-ubyte", dir);
    snprintf(p[3], sizeof p[3], "%s/t10k-labels.idx1-ubyte.gz", dir);
    ok &= write_file(p[0], tr.img_bytes, tr.img_size, 1);
    ok &= write_file(p[1], tr.lab_bytes, tr.lab_size, 0);
    ok &= write_file(p[2], te.img_bytes, te.img_size, 0);
    ok &= write_file(p[3], te.lab_bytes, te.lab_size, 1);
    r1 = mnistcu_dataset_load_dir(ctx, dir, MNISTCU_SPLIT_TRAIN, &dtr);
    memset(&d, 0, sizeof d);
    d.dir = dir;
    d.split = MNISTCU_SPLIT_TEST;
    d.norm = MNISTCU_NORM_NONE;
    r2 = mnistcu_dataset_load(ctx, &d, &dte);
    for (k = 0; k < 4; ++k) unlink(p[k]);
    rmdir(dir);
    ASSERTm("writing the files", ok);
    ASSERT_ENUM_EQ(MNISTCU_OK, r1, mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_OK, r2, mnistcu_result_name);
    mnistcu_dataset_info_get(dtr, &info);
    ASSERT_EQ((size_t)9, info.count);
    ASSERT_EQ(4, info.rows);
    ASSERT_EQ(3, info.cols);
    ASSERT_EQ(1, info.stored_u8);
    mnistcu_dataset_info_get(dte, &info);
    ASSERT_EQ((size_t)5, info.count);
    x = all_samples(dtr, labels); /* DEFAULT on uint8: STANDARD */
    {
        double mean, sd;
        unit_stats(tr.pix, 9 * 12, &mean, &sd);
        for (i = 0; i < 9 * 12; ++i) ASSERT_NEAR(x[i], (tr.pix[i] / 255.0 - mean) / sd, 1e-5, 1e-5);
        for (i = 0; i < 9; ++i) ASSERT_EQ((int32_t)tr.lab[i], labels[i]);
    }
    free(x);
    x = all_samples(dte, labels);
    for (i = 0; i < 5 * 12; ++i) ASSERT_EQ((float)te.pix[i], x[i]);
    for (i = 0; i < 5; ++i) ASSERT_EQ((int32_t)te.lab[i], labels[i]);
    free(x);
    u8_set_free(&tr); u8_set_free(&te);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* A dataset whose feature 0 is the sample's id and label id % 3. */
static mnistcu_dataset *id_dataset(mnistcu_ctx *ctx, size_t n, size_t F)
{
    float *x = (float *)malloc(n * F * sizeof(float));
    int32_t *lab = (int32_t *)malloc(n * sizeof(int32_t));
    mnistcu_dataset *ds = NULL;
    size_t i, j;
    for (i = 0; i < n; ++i) {
        for (j = 0; j < F; ++j) x[i * F + j] = (float)i + 0.25f * (float)j;
        lab[i] = (int32_t)(i % 3);
    }
    if (mnistcu_dataset_create(ctx, x, lab, n, F, 3, &ds) != MNISTCU_OK) ds = NULL;
    free(x); free(lab);
    return ds;
}

/* ids[k] = the id of every sample of ds, checking each sample is intact. */
static int read_ids(const mnistcu_dataset *ds, size_t F, long *ids, size_t *count)
{
    mnistcu_dataset_info info;
    float row[8];
    int32_t label;
    size_t i, j;
    mnistcu_dataset_info_get(ds, &info);
    *count = info.count;
    for (i = 0; i < info.count; ++i) {
        if (mnistcu_dataset_sample(ds, i, row, &label) != MNISTCU_OK) return 0;
        ids[i] = (long)row[0];
        for (j = 0; j < F; ++j)
            if (row[j] != (float)ids[i] + 0.25f * (float)j) return 0;
        if (label != (int32_t)(ids[i] % 3)) return 0;
    }
    return 1;
}

static greatest_test_res check_partition(const mnistcu_dataset *a, const mnistcu_dataset *b, size_t n, size_t first,
                                         long *order)
{
    long *ids = (long *)malloc(n * sizeof(long));
    int *seen = (int *)calloc(n, sizeof(int));
    size_t na = 0, nb = 0, i;
    int ok = read_ids(a, 4, ids, &na) && read_ids(b, 4, ids + na, &nb);
    if (ok) {
        for (i = 0; i < n; ++i) {
            if (ids[i] < 0 || ids[i] >= (long)n) ok = 0;
            else seen[ids[i]]++;
        }
        for (i = 0; i < n; ++i) ok &= seen[i] == 1;
        memcpy(order, ids, n * sizeof(long));
    }
    free(ids); free(seen);
    ASSERT_EQ(first, na);
    ASSERT_EQ(n - first, nb);
    ASSERTm("every sample lands in exactly one part, intact", ok);
    PASS();
}

TEST split_partitions_the_samples(void)
{
    mnistcu_ctx *c1 = tu_ctx(MNISTCU_DEVICE_AUTO, 0), *c2 = tu_ctx(MNISTCU_DEVICE_AUTO, 0), *c3;
    mnistcu_ctx_desc desc;
    mnistcu_dataset *s1, *s2, *s3, *a = NULL, *b = NULL;
    long plain[50], sh1[50], sh2[50], sh3[50];
    size_t i, moved = 0;
    int same12, same13;
    memset(&desc, 0, sizeof desc);
    desc.seed = 99;
    desc.log_level = MNISTCU_LOG_SILENT;
    ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&c3, &desc));
    s1 = id_dataset(c1, 50, 4); s2 = id_dataset(c2, 50, 4); s3 = id_dataset(c3, 50, 4);
    ASSERT(s1 && s2 && s3);

    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c1, s1, 20, 0, &a, &b)); /* no shuffle: order kept */
    CHECK_CALL(check_partition(a, b, 50, 20, plain));
    for (i = 0; i < 50; ++i) ASSERT_EQ((long)i, plain[i]);
    mnistcu_dataset_destroy(a); mnistcu_dataset_destroy(b);

    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c1, s1, 1, 1, &a, &b));
    CHECK_CALL(check_partition(a, b, 50, 1, sh1));
    mnistcu_dataset_destroy(a); mnistcu_dataset_destroy(b);
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c1, s1, 49, 1, &a, &b));
    CHECK_CALL(check_partition(a, b, 50, 49, sh1));
    mnistcu_dataset_destroy(a); mnistcu_dataset_destroy(b);

    /* shuffled: a permutation, the same for the same seed and calls, another for another seed */
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c1, s1, 30, 1, &a, &b));
    CHECK_CALL(check_partition(a, b, 50, 30, sh1));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c2, s2, 1, 1, &a, &b));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c2, s2, 49, 1, &a, &b));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c2, s2, 30, 1, &a, &b));
    CHECK_CALL(check_partition(a, b, 50, 30, sh2));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c3, s3, 1, 1, &a, &b));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c3, s3, 49, 1, &a, &b));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(c3, s3, 30, 1, &a, &b));
    CHECK_CALL(check_partition(a, b, 50, 30, sh3));
    for (i = 0; i < 50; ++i) moved += sh1[i] != (long)i;
    same12 = memcmp(sh1, sh2, sizeof sh1) == 0;
    same13 = memcmp(sh1, sh3, sizeof sh1) == 0;
    ASSERT_GT(moved, (size_t)40);
    ASSERTm("same seed, same calls: same split", same12);
    ASSERTm("another seed: another split", !same13);

    /* bad first_count: an error, both parts NULL */
    {
        size_t bad[3] = {0, 50, 51};
        for (i = 0; i < 3; ++i) {
            mnistcu_dataset *f = NOT_SET, *g = NOT_SET;
            ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_dataset_split(c1, s1, bad[i], 1, &f, &g),
                           mnistcu_result_name);
            ASSERT(f == NULL && g == NULL);
            ASSERT(mnistcu_ctx_error(c1)[0] != 0);
        }
    }
    mnistcu_ctx_destroy(c1); mnistcu_ctx_destroy(c2); mnistcu_ctx_destroy(c3);
    PASS();
}

/* Splitting a uint8 dataset keeps the bytes and the parent's normalisation. */
TEST split_u8_keeps_bytes_and_normalisation(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(43);
    u8_set s;
    mnistcu_dataset *ds = NULL, *a = NULL, *b = NULL;
    mnistcu_dataset_info i0, ia, ib;
    float *x, *xa, *xb;
    u8_set_make(&s, &rng, 12, 2, 2, 0, 255, 10);
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 0, MNISTCU_NORM_STANDARD, 0, &ds));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(ctx, ds, 5, 0, &a, &b));
    mnistcu_dataset_info_get(ds, &i0);
    mnistcu_dataset_info_get(a, &ia);
    mnistcu_dataset_info_get(b, &ib);
    ASSERT_EQ(1, ia.stored_u8);
    ASSERT_EQ(2, ia.rows);
    ASSERT_EQ(2, ib.cols);
    ASSERT_EQ(i0.scale, ia.scale);
    ASSERT_EQ(i0.shift, ib.shift);
    x = all_samples(ds, NULL); xa = all_samples(a, NULL); xb = all_samples(b, NULL);
    ASSERT_ARRAY_EQ_BITS_F(x, xa, (size_t)5 * 4);
    ASSERT_ARRAY_EQ_BITS_F(x + 20, xb, (size_t)7 * 4);
    free(x); free(xa); free(xb);
    u8_set_free(&s);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST real_mnist(void)
{
    static const size_t train_hist[10] = {5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949};
    static const size_t test_hist[10] = {980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009};
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *tr = NULL, *te = NULL;
    mnistcu_dataset_info info;
    mnistcu_dataset_desc d;
    mnistcu_idx img;
    char path[512];
    size_t hist[10], i, bytes_hist[256];
    double mean = 0.0, var = 0.0, sd;
    mnistcu_result r = mnistcu_dataset_load_dir(ctx, tu_mnist_dir(), MNISTCU_SPLIT_TRAIN, &tr);
    if (r == MNISTCU_ERR_NOT_FOUND) {
        mnistcu_ctx_destroy(ctx);
        SKIPm("MNIST not found (make data)");
    }
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_dataset_load_dir(ctx, tu_mnist_dir(), MNISTCU_SPLIT_TEST, &te),
                   mnistcu_result_name);
    mnistcu_dataset_info_get(tr, &info);
    ASSERT_EQ((size_t)60000, info.count);
    ASSERT_EQ(28, info.rows);
    ASSERT_EQ(28, info.cols);
    ASSERT_EQ((size_t)784, info.features);
    ASSERT_EQ(10, info.num_classes);
    ASSERT_EQ(1, info.stored_u8);
    /* STANDARD over the training set: the statistics from the raw bytes, here */
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", tu_mnist_dir());
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_idx_load_file(ctx, path, &img), mnistcu_result_name);
    ASSERT_EQ((size_t)60000 * 784, img.count);
    memset(bytes_hist, 0, sizeof bytes_hist);
    for (i = 0; i < img.count; ++i) bytes_hist[((const uint8_t *)img.data)[i]]++;
    mnistcu_idx_free(ctx, &img);
    for (i = 0; i < 256; ++i) mean += (double)bytes_hist[i] * ((double)i / 255.0);
    mean /= 60000.0 * 784.0;
    for (i = 0; i < 256; ++i) var += (double)bytes_hist[i] * ((double)i / 255.0 - mean) * ((double)i / 255.0 - mean);
    sd = sqrt(var / (60000.0 * 784.0));
    ASSERT_NEAR(mean, 0.1307, 1e-4, 0); /* the well-known values */
    ASSERT_NEAR(sd, 0.3081, 1e-4, 0);
    ASSERT_NEAR(info.scale, 1.0 / 255.0 / sd, 0, 1e-5);
    ASSERT_NEAR(info.shift, -mean / sd, 0, 1e-5);

    memset(hist, 0, sizeof hist);
    for (i = 0; i < 60000; ++i) {
        int32_t l = -1;
        ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(tr, i, NULL, &l));
        ASSERT(l >= 0 && l < 10);
        hist[l]++;
    }
    for (i = 0; i < 10; ++i) ASSERT_EQ(train_hist[i], hist[i]);
    mnistcu_dataset_info_get(te, &info);
    ASSERT_EQ((size_t)10000, info.count);
    ASSERT_EQ(28, info.rows);
    ASSERT_EQ(28, info.cols);
    memset(hist, 0, sizeof hist);
    for (i = 0; i < 10000; ++i) {
        int32_t l = -1;
        ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(te, i, NULL, &l));
        ASSERT(l >= 0 && l < 10);
        hist[l]++;
    }
    for (i = 0; i < 10; ++i) ASSERT_EQ(test_hist[i], hist[i]);
    /* limit on real files */
    memset(&d, 0, sizeof d);
    d.dir = tu_mnist_dir();
    d.split = MNISTCU_SPLIT_TEST;
    d.limit = 100;
    mnistcu_dataset_destroy(te);
    te = NULL;
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_load(ctx, &d, &te));
    mnistcu_dataset_info_get(te, &info);
    ASSERT_EQ((size_t)100, info.count);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

SUITE(dataset_suite)
{
    RUN_TEST(create_copies_and_never_writes_input);
    RUN_TEST(sample_gives_normalised_features);
    RUN_TEST(load_u8_images_every_label_type);
    RUN_TEST(load_float_images_2d_and_3d);
    RUN_TEST(norm_modes);
    RUN_TEST(normalize_like_uses_the_reference_statistics);
    RUN_TEST(limit_keeps_the_first_samples);
    RUN_TEST(load_errors);
    RUN_TEST(load_dir_empty_folder_is_not_found);
    RUN_TEST(load_dir_other_naming_style);
    RUN_TEST(split_partitions_the_samples);
    RUN_TEST(split_u8_keeps_bytes_and_normalisation);
    RUN_TEST(real_mnist);
}

/* ======================================================================== */
/*                                 api_suite                                */
/* ======================================================================== */

/* A tiny float dataset: n samples of F features, labels i % classes. */
static mnistcu_dataset *tiny_dataset(mnistcu_ctx *ctx, size_t n, size_t F, int classes, uint64_t seed)
{
    tu_rng rng = tu_rng_make(seed);
    float *x = tu_random_floats(&rng, n * F, -1.0f, 1.0f);
    int32_t *lab = (int32_t *)malloc(n * sizeof(int32_t));
    mnistcu_dataset *ds = NULL;
    size_t i;
    for (i = 0; i < n; ++i) lab[i] = (int32_t)(i % (size_t)classes);
    if (mnistcu_dataset_create(ctx, x, lab, n, F, classes, &ds) != MNISTCU_OK) ds = NULL;
    free(x); free(lab);
    return ds;
}

#define ASSERT_ERR(CALL) ASSERT_NEQm(#CALL " must fail", MNISTCU_OK, (CALL))

TEST null_arguments_are_errors(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds, *dout = NULL, *d2 = NULL;
    mnistcu_model *m, *mout = NULL;
    mnistcu_model_desc md;
    mnistcu_dataset_desc dd;
    mnistcu_dataset_info dinfo;
    mnistcu_model_info minfo;
    mnistcu_ctx_desc cd;
    mnistcu_train_desc td;
    mnistcu_metrics met;
    mnistcu_idx idx;
    float x[8 * 4], logits[8 * 3], probs[8 * 3], params[64];
    uint8_t px[8 * 4];
    int32_t lab[8] = {0, 1, 2, 0, 1, 2, 0, 1}, pred[8];
    double loss;
    void *buf = NULL;
    size_t bsize = 0, used = 0, np;
    unsigned char gz[20] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    ASSERT(ctx != NULL);
    ds = tiny_dataset(ctx, 8, 4, 3, 1);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "4-5-3", &m));
    np = mnistcu_model_num_params(m);
    ASSERT_EQ((size_t)(4 * 5 + 5 + 5 * 3 + 3), np);
    memset(x, 0, sizeof x);
    memset(px, 0, sizeof px);
    memset(&md, 0, sizeof md);
    md.sizes[0] = 4; md.sizes[1] = 3;
    memset(&dd, 0, sizeof dd);
    memset(&td, 0, sizeof td);

    /* context */
    ASSERT_ERR(mnistcu_ctx_create(NULL, NULL));
    mnistcu_ctx_destroy(NULL);
    ASSERT(mnistcu_ctx_error(NULL) != NULL);
    ASSERT_ERR(mnistcu_ctx_last_result(NULL));
    mnistcu_ctx_clear_error(NULL);
    (void)mnistcu_ctx_device(NULL);
    ASSERT(mnistcu_ctx_device_name(NULL) != NULL);
    (void)mnistcu_ctx_threads(NULL);
    mnistcu_ctx_resolved_desc(NULL, &cd);
    mnistcu_ctx_resolved_desc(ctx, NULL);
    mnistcu_free(ctx, NULL);
    mnistcu_free(NULL, NULL);
    /* IDX and gzip */
    ASSERT_ERR(mnistcu_idx_load_file(NULL, "x", &idx));
    ASSERT_ERR(mnistcu_idx_load_file(ctx, NULL, &idx));
    ASSERT_ERR(mnistcu_idx_load_file(ctx, "x", NULL));
    ASSERT_ERR(mnistcu_idx_load_memory(NULL, gz, sizeof gz, "m", &idx));
    ASSERT_ERR(mnistcu_idx_load_memory(ctx, NULL, 10, "m", &idx));
    ASSERT_ERR(mnistcu_idx_load_memory(ctx, gz, sizeof gz, "m", NULL));
    mnistcu_idx_free(ctx, NULL);
    mnistcu_idx_free(NULL, NULL);
    ASSERT(mnistcu_idx_type_name((mnistcu_idx_type)0) == NULL);
    ASSERT_ERR(mnistcu_gunzip(NULL, gz, sizeof gz, 0, &buf, &bsize));
    ASSERT_ERR(mnistcu_gunzip(ctx, NULL, 10, 0, &buf, &bsize));
    ASSERT_ERR(mnistcu_gunzip(ctx, gz, sizeof gz, 0, NULL, &bsize));
    ASSERT_ERR(mnistcu_gunzip(ctx, gz, sizeof gz, 0, &buf, NULL));
    ASSERT_ERR(mnistcu_inflate(NULL, gz + 10, 2, 0, &buf, &bsize, &used));
    ASSERT_ERR(mnistcu_inflate(ctx, NULL, 2, 0, &buf, &bsize, &used));
    ASSERT_ERR(mnistcu_inflate(ctx, gz + 10, 2, 0, NULL, &bsize, &used));
    ASSERT_ERR(mnistcu_inflate(ctx, gz + 10, 2, 0, &buf, NULL, &used));
    ASSERT(buf == NULL);
    /* datasets */
    ASSERT_ERR(mnistcu_dataset_load(NULL, &dd, &dout));
    ASSERT_ERR(mnistcu_dataset_load(ctx, NULL, &dout));
    ASSERT_ERR(mnistcu_dataset_load(ctx, &dd, NULL));
    ASSERT_ERR(mnistcu_dataset_load(ctx, &dd, &dout)); /* a desc naming no data */
    ASSERT_ERR(mnistcu_dataset_load_dir(NULL, "data", MNISTCU_SPLIT_TRAIN, &dout));
    ASSERT_ERR(mnistcu_dataset_load_dir(ctx, NULL, MNISTCU_SPLIT_TRAIN, &dout));
    ASSERT_ERR(mnistcu_dataset_load_dir(ctx, "data", MNISTCU_SPLIT_TRAIN, NULL));
    ASSERT_ERR(mnistcu_dataset_create(NULL, x, lab, 8, 4, 3, &dout));
    ASSERT_ERR(mnistcu_dataset_create(ctx, NULL, lab, 8, 4, 3, &dout));
    ASSERT_ERR(mnistcu_dataset_create(ctx, x, NULL, 8, 4, 3, &dout));
    ASSERT_ERR(mnistcu_dataset_create(ctx, x, lab, 8, 4, 3, NULL));
    ASSERT_ERR(mnistcu_dataset_create(ctx, x, lab, 0, 4, 3, &dout));
    ASSERT_ERR(mnistcu_dataset_create(ctx, x, lab, 8, 0, 3, &dout));
    ASSERT_ERR(mnistcu_dataset_create(ctx, x, lab, 8, 4, 1, &dout));
    ASSERT(dout == NULL);
    ASSERT_ERR(mnistcu_dataset_split(NULL, ds, 4, 0, &dout, &d2));
    ASSERT_ERR(mnistcu_dataset_split(ctx, NULL, 4, 0, &dout, &d2));
    ASSERT_ERR(mnistcu_dataset_split(ctx, ds, 4, 0, NULL, &d2));
    ASSERT_ERR(mnistcu_dataset_split(ctx, ds, 4, 0, &dout, NULL));
    ASSERT_ERR(mnistcu_dataset_normalize_like(NULL, ds));
    ASSERT_ERR(mnistcu_dataset_normalize_like(ds, NULL));
    mnistcu_dataset_info_get(NULL, &dinfo);
    ASSERT_EQ((size_t)0, dinfo.count);
    mnistcu_dataset_info_get(ds, NULL);
    ASSERT_ERR(mnistcu_dataset_sample(NULL, 0, x, lab));
    mnistcu_dataset_destroy(NULL);
    /* models */
    ASSERT_ERR(mnistcu_model_create(NULL, &md, &mout));
    ASSERT_ERR(mnistcu_model_create(ctx, NULL, &mout));
    ASSERT_ERR(mnistcu_model_create(ctx, &md, NULL));
    ASSERT_ERR(mnistcu_model_create_mlp(NULL, "4-3", &mout));
    ASSERT_ERR(mnistcu_model_create_mlp(ctx, NULL, &mout));
    ASSERT_ERR(mnistcu_model_create_mlp(ctx, "4-3", NULL));
    ASSERT(mout == NULL);
    mnistcu_model_destroy(NULL);
    mnistcu_model_info_get(NULL, &minfo);
    ASSERT_EQ(0, minfo.num_layers);
    mnistcu_model_info_get(m, NULL);
    ASSERT_EQ((size_t)0, mnistcu_model_num_params(NULL));
    ASSERT_ERR(mnistcu_model_get_params(NULL, params, np));
    ASSERT_ERR(mnistcu_model_get_params(m, NULL, np));
    ASSERT_ERR(mnistcu_model_set_params(NULL, params, np));
    ASSERT_ERR(mnistcu_model_set_params(m, NULL, np));
    ASSERT_ERR(mnistcu_model_get_grads(NULL, params, np));
    ASSERT_ERR(mnistcu_model_get_grads(m, NULL, np));
    ASSERT_ERR(mnistcu_model_forward(NULL, x, 8, logits));
    ASSERT_ERR(mnistcu_model_forward(m, NULL, 8, logits));
    ASSERT_ERR(mnistcu_model_forward(m, x, 8, NULL));
    ASSERT_ERR(mnistcu_model_compute_grads(NULL, x, lab, 8, &loss));
    ASSERT_ERR(mnistcu_model_compute_grads(m, NULL, lab, 8, &loss));
    ASSERT_ERR(mnistcu_model_compute_grads(m, x, NULL, 8, &loss));
    ASSERT_ERR(mnistcu_model_apply_grads(NULL, NULL));
    /* training, evaluation, prediction */
    mnistcu_train_desc_resolve(NULL, NULL);
    mnistcu_train_desc_resolve(&td, NULL);
    ASSERT_ERR(mnistcu_train(NULL, ds, NULL, NULL));
    ASSERT_ERR(mnistcu_train(m, NULL, NULL, NULL));
    ASSERT_ERR(mnistcu_evaluate(NULL, ds, &met, NULL));
    ASSERT_ERR(mnistcu_evaluate(m, NULL, &met, NULL));
    ASSERT_ERR(mnistcu_evaluate(m, ds, NULL, NULL));
    ASSERT_ERR(mnistcu_predict(NULL, x, 8, pred, probs));
    ASSERT_ERR(mnistcu_predict(m, NULL, 8, pred, probs));
    ASSERT_ERR(mnistcu_predict(m, x, 8, NULL, NULL));
    ASSERT_ERR(mnistcu_predict_u8(NULL, px, 8, pred, probs));
    ASSERT_ERR(mnistcu_predict_u8(m, NULL, 8, pred, probs));
    ASSERT_ERR(mnistcu_predict_u8(m, px, 8, NULL, NULL));
    /* the context is still usable after all of that */
    mnistcu_ctx_clear_error(ctx);
    ASSERT_STR_EQ("", mnistcu_ctx_error(ctx));
    ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_last_result(ctx));
    ASSERT_EQ(MNISTCU_OK, mnistcu_predict(m, x, 8, pred, probs));
    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, ds, &met, NULL));
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST zero_count_is_an_error(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_model *m = NULL;
    float x[4] = {0, 0, 0, 0}, out[3];
    uint8_t px[4] = {0, 0, 0, 0};
    int32_t lab[1] = {0}, pred[1];
    double loss;
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "4-3", &m));
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_model_forward(m, x, 0, out), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_predict(m, x, 0, pred, out), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_predict_u8(m, px, 0, pred, out), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_model_compute_grads(m, x, lab, 0, &loss), mnistcu_result_name);
    ASSERT(mnistcu_ctx_error(ctx)[0] != 0);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST train_and_evaluate_argument_checks(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0), *other = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds20, *ds100, *foreign, *many_classes;
    mnistcu_model *m = NULL, *big = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    mnistcu_metrics met;
    float before[128], after[128];
    size_t np;
    ASSERT(ctx && other);
    ds20 = tiny_dataset(ctx, 20, 4, 3, 2);
    ds100 = tiny_dataset(ctx, 10, 100, 3, 3);
    foreign = tiny_dataset(other, 20, 4, 3, 4);
    many_classes = tiny_dataset(ctx, 20, 4, 5, 5);
    ASSERT(ds20 && ds100 && foreign && many_classes);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "4-6-3", &m));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "784-10", &big));
    np = mnistcu_model_num_params(m);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_get_params(m, before, np));

    memset(&td, 0, sizeof td);
    td.batch_size = 21; /* larger than the dataset */
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_train(m, ds20, &td, &res), mnistcu_result_name);
    ASSERT_EQ(0, res.epochs);
    td.batch_size = 20; /* exactly the dataset: fine */
    td.epochs = 1;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds20, &td, &res));
    ASSERT_EQ((size_t)1, res.steps);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(m, before, np));
    td.batch_size = -1;
    ASSERT_ERR(mnistcu_train(m, ds20, &td, NULL));
    td.batch_size = 4;
    td.epochs = -1;
    ASSERT_ERR(mnistcu_train(m, ds20, &td, NULL));
    td.epochs = 1;
    td.optim.learning_rate = -0.5f;
    ASSERT_ERR(mnistcu_train(m, ds20, &td, NULL));
    td.optim.learning_rate = 0.0f;
    ASSERT_ENUM_EQ(MNISTCU_ERR_SHAPE, mnistcu_train(big, ds100, &td, NULL), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_SHAPE, mnistcu_evaluate(big, ds100, &met, NULL), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_SHAPE, mnistcu_train(m, ds100, &td, NULL), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_SHAPE, mnistcu_train(m, many_classes, &td, NULL), mnistcu_result_name);
    ASSERT_ERR(mnistcu_train(m, foreign, &td, NULL));
    ASSERT_ERR(mnistcu_evaluate(m, foreign, &met, NULL));
    td.validation = foreign;
    ASSERT_ERR(mnistcu_train(m, ds20, &td, NULL));
    td.validation = ds100;
    ASSERT_ENUM_EQ(MNISTCU_ERR_SHAPE, mnistcu_train(m, ds20, &td, NULL), mnistcu_result_name);
    ASSERT(mnistcu_ctx_error(ctx)[0] != 0);
    /* failing calls left the model as it was */
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_get_params(m, after, np));
    ASSERT_ARRAY_EQ_BITS_F(before, after, np);
    ASSERT_ERR(mnistcu_model_get_params(m, after, np - 1));
    ASSERT_ERR(mnistcu_model_set_params(m, after, np + 1));
    mnistcu_ctx_destroy(ctx);
    mnistcu_ctx_destroy(other);
    PASS();
}

TEST compute_grads_label_range(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_model *m = NULL;
    float x[2 * 4] = {0.1f, 0.2f, 0.3f, 0.4f, -0.1f, -0.2f, -0.3f, -0.4f};
    int32_t hi[2] = {0, 3}, lo[2] = {-1, 0}, ok[2] = {2, 0};
    double loss = -1.0;
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "4-3", &m));
    ASSERT_ENUM_EQ(MNISTCU_ERR_LABEL_RANGE, mnistcu_model_compute_grads(m, x, hi, 2, &loss), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_LABEL_RANGE, mnistcu_model_compute_grads(m, x, lo, 2, &loss), mnistcu_result_name);
    ASSERT(mnistcu_ctx_error(ctx)[0] != 0);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(m, x, ok, 2, &loss));
    ASSERT(loss > 0.0);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST result_names_and_strings(void)
{
    int i, j;
    const char *unknown_name = mnistcu_result_name(MNISTCU_RESULT_COUNT);
    const char *unknown_str = mnistcu_result_str(MNISTCU_RESULT_COUNT);
    ASSERT_STR_EQ("MNISTCU_OK", mnistcu_result_name(MNISTCU_OK));
    ASSERT_STR_EQ("MNISTCU_ERR_IDX_MAGIC", mnistcu_result_name(MNISTCU_ERR_IDX_MAGIC));
    ASSERT_STR_EQ("MNISTCU_ERR_DEFLATE_TRUNCATED", mnistcu_result_name(MNISTCU_ERR_DEFLATE_TRUNCATED));
    for (i = 0; i < (int)MNISTCU_RESULT_COUNT; ++i) {
        const char *n = mnistcu_result_name((mnistcu_result)i), *s = mnistcu_result_str((mnistcu_result)i);
        ASSERT(n != NULL && s != NULL);
        ASSERT(n[0] != 0 && s[0] != 0);
        ASSERT_EQ(0, strncmp(n, "MNISTCU_", 8));
        for (j = 0; j < i; ++j) {
            ASSERT(strcmp(n, mnistcu_result_name((mnistcu_result)j)) != 0);
            ASSERT(strcmp(s, mnistcu_result_str((mnistcu_result)j)) != 0);
        }
        ASSERT(strcmp(n, unknown_name) != 0);
    }
    ASSERT(unknown_name != NULL && unknown_name[0] != 0);
    ASSERT(unknown_str != NULL && unknown_str[0] != 0);
    /* values that still fit the enum's bits (well-defined in C++ too) */
    ASSERT_STR_EQ(unknown_name, mnistcu_result_name((mnistcu_result)(MNISTCU_RESULT_COUNT + 7)));
    ASSERT_STR_EQ(unknown_str, mnistcu_result_str((mnistcu_result)(MNISTCU_RESULT_COUNT + 7)));
    PASS();
}

/* A log sink that keeps the last message. */
typedef struct log_sink { int calls, errors; char last[1024]; mnistcu_log_level last_level; } log_sink;

static void sink_log(void *user, mnistcu_log_level level, const char *message)
{
    log_sink *s = (log_sink *)user;
    s->calls++;
    s->errors += level == MNISTCU_LOG_ERROR;
    s->last_level = level;
    snprintf(s->last, sizeof s->last, "%s", message);
}

static void plain_free(void *user, void *p)
{
    (void)user;
    free(p);
}

TEST ctx_create_rejects_out_of_range_fields(void)
{
    int k;
    log_sink sink;
    for (k = 0; k < 8; ++k) {
        mnistcu_ctx_desc d;
        mnistcu_ctx *ctx = NULL;
        mnistcu_result r;
        memset(&d, 0, sizeof d);
        memset(&sink, 0, sizeof sink);
        d.device = MNISTCU_DEVICE_CPU;
        d.log = sink_log;
        d.log_user = &sink;
        switch (k) {
        case 0: d.device = (mnistcu_device)3; break;
        case 1: d.log_level = (mnistcu_log_level)7; break;
        case 2: d.threads = -1; break;
        case 3: d.cuda_device = -1; break;
        case 4: d.gemm = (mnistcu_gemm)3; break;
        case 5: d.data_mode = (mnistcu_data_mode)3; break;
        case 6: d.precision = (mnistcu_precision)(MNISTCU_PRECISION_TF32X3 + 1); break;
        default: d.allocator.free = plain_free; break; /* free without alloc */
        }
        r = mnistcu_ctx_create(&ctx, &d);
        ASSERT_ENUM_EQm("an out-of-range desc field", MNISTCU_ERR_INVALID_ARGUMENT, r, mnistcu_result_name);
        if (ctx) { /* the context carries the message; it must be destroyed */
            ASSERT(mnistcu_ctx_error(ctx)[0] != 0);
            mnistcu_ctx_destroy(ctx);
        }
    }
    PASS();
}

/* TF32 and BF16 are GPU product modes: a CPU context resolves them to FP32 and
   says so in its log; DEFAULT resolves to FP32 everywhere. */
TEST precision_on_the_cpu_resolves_to_fp32(void)
{
    int k;
    for (k = MNISTCU_PRECISION_DEFAULT; k <= MNISTCU_PRECISION_TF32X3 + 1; ++k) {
        mnistcu_ctx_desc d, rd;
        mnistcu_ctx *ctx = NULL;
        log_sink sink;
        memset(&d, 0, sizeof d);
        memset(&sink, 0, sizeof sink);
        d.device = MNISTCU_DEVICE_CPU;
        d.log = sink_log;
        d.log_user = &sink;
        d.precision = (mnistcu_precision)k;
        if (k > MNISTCU_PRECISION_TF32X3) { /* past the last: refused */
            ASSERT_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_ctx_create(&ctx, &d));
            mnistcu_ctx_destroy(ctx);
            continue;
        }
        ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&ctx, &d));
        mnistcu_ctx_resolved_desc(ctx, &rd);
        ASSERT_EQ((int)MNISTCU_PRECISION_FP32, (int)rd.precision);
        if (k >= MNISTCU_PRECISION_TF32) ASSERT(strstr(sink.last, "the CPU computes in FP32") != NULL);
        else ASSERT(strstr(sink.last, "precision") == NULL);
        if (k == MNISTCU_PRECISION_TF32X3) ASSERT(strstr(sink.last, "precision TF32X3 ") != NULL);
        mnistcu_ctx_destroy(ctx);
    }
    PASS();
}

TEST device_environment_variable(void)
{
    const char *old = getenv("MNISTCU_DEVICE");
    char saved[64];
    int had = old != NULL;
    mnistcu_ctx_desc d;
    mnistcu_ctx *ctx = NULL, *ctx2 = NULL;
    mnistcu_result r, r2;
    mnistcu_device dev;
    char msg[512];
    if (had) snprintf(saved, sizeof saved, "%s", old);
    memset(&d, 0, sizeof d);
    d.log_level = MNISTCU_LOG_SILENT;
    setenv("MNISTCU_DEVICE", "cpu", 1);
    r = mnistcu_ctx_create(&ctx, &d); /* device AUTO */
    dev = ctx ? mnistcu_ctx_device(ctx) : MNISTCU_DEVICE_AUTO;
    mnistcu_ctx_destroy(ctx);
    ctx = NULL;
    setenv("MNISTCU_DEVICE", "bogus", 1);
    r2 = mnistcu_ctx_create(&ctx, &d);
    snprintf(msg, sizeof msg, "%s", ctx ? mnistcu_ctx_error(ctx) : "");
    mnistcu_ctx_destroy(ctx);
    d.device = MNISTCU_DEVICE_CPU; /* the variable only overrides AUTO */
    ctx = NULL;
    ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&ctx2, &d));
    mnistcu_ctx_destroy(ctx2);
    if (had) setenv("MNISTCU_DEVICE", saved, 1);
    else unsetenv("MNISTCU_DEVICE");
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQm("MNISTCU_DEVICE=cpu with AUTO gives the CPU", (int)MNISTCU_DEVICE_CPU, (int)dev);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, r2, mnistcu_result_name);
    ASSERTm("the message quotes the value", strstr(msg, "bogus") != NULL);
    PASS();
}

/* A host allocator that counts, and fails every allocation after the first fail_after (-1: never). */
typedef struct counting_alloc { long live, total, failed, fail_after; } counting_alloc;

static void *ca_alloc(void *user, size_t size)
{
    counting_alloc *a = (counting_alloc *)user;
    void *p;
    if (a->fail_after >= 0 && a->total >= a->fail_after) {
        a->failed++;
        return NULL;
    }
    p = malloc(size);
    if (p) {
        a->total++;
        a->live++;
    }
    return p;
}

static void ca_free(void *user, void *p)
{
    counting_alloc *a = (counting_alloc *)user;
    if (!p) return;
    a->live--;
    free(p);
}

static mnistcu_ctx_desc counting_desc(counting_alloc *a, long fail_after)
{
    mnistcu_ctx_desc d;
    memset(a, 0, sizeof *a);
    a->fail_after = fail_after;
    memset(&d, 0, sizeof d);
    d.device = MNISTCU_DEVICE_CPU;
    d.seed = 5;
    d.log_level = MNISTCU_LOG_SILENT;
    d.allocator.alloc = ca_alloc;
    d.allocator.free = ca_free;
    d.allocator.user = a;
    return d;
}

TEST custom_allocator_sees_every_allocation_freed(void)
{
    counting_alloc a;
    mnistcu_ctx_desc d = counting_desc(&a, -1);
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset *ds, *p1 = NULL, *p2 = NULL, *loaded = NULL;
    mnistcu_model *m = NULL, *m2 = NULL;
    mnistcu_train_desc td;
    mnistcu_metrics met;
    tu_rng rng = tu_rng_make(61);
    u8_set s;
    float x[3 * 6], probs[3 * 3];
    int32_t pred[3];
    void *out = NULL;
    size_t out_size = 0;
    const unsigned char empty_gz[20] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    u8_set_make(&s, &rng, 30, 2, 3, 0, 255, 3);
    ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&ctx, &d));
    ASSERT(a.live > 0);
    ds = tiny_dataset(ctx, 30, 6, 3, 7);
    ASSERT(ds != NULL);
    ASSERT_EQ(MNISTCU_OK, load_mem(ctx, s.img_bytes, s.img_size, s.lab_bytes, s.lab_size, 3, MNISTCU_NORM_DEFAULT, 0,
                                   &loaded));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(ctx, ds, 20, 1, &p1, &p2));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "6-8-3", &m));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "6-3", &m2));
    memset(&td, 0, sizeof td);
    td.epochs = 2;
    td.batch_size = 8;
    td.validation = p2;
    td.optim.momentum = 0.9f; /* the velocity arena too */
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, p1, &td, NULL));
    td.validation = NULL;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m2, loaded, &td, NULL));
    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, ds, &met, NULL));
    memset(x, 0, sizeof x);
    ASSERT_EQ(MNISTCU_OK, mnistcu_predict(m, x, 3, pred, NULL));
    ASSERT_EQ(MNISTCU_OK, mnistcu_predict(m, x, 3, NULL, probs));
    ASSERT_EQ(MNISTCU_OK, mnistcu_gunzip(ctx, empty_gz, sizeof empty_gz, 0, &out, &out_size));
    mnistcu_free(ctx, out);
    mnistcu_model_destroy(m2);     /* some objects freed by hand, */
    mnistcu_dataset_destroy(p1);
    mnistcu_ctx_destroy(ctx);      /* the rest by the context */
    u8_set_free(&s);
    ASSERT_EQ(0L, a.live);
    ASSERT(a.total > 10);
    PASS();
}

/* Runs ctx_create, dataset_create, model_create and a one-epoch train with an
   allocator that fails after fail_after allocations (then evaluate and split).
   Returns the step reached (6: all succeeded) or -1 when a call failed with something other than
   MNISTCU_ERR_OUT_OF_MEMORY or leaked. */
static int oom_run(long fail_after, long *total, char *why, size_t why_size)
{
    counting_alloc a;
    mnistcu_ctx_desc d = counting_desc(&a, fail_after);
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset *ds = NULL;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_result r;
    float x[12 * 5];
    int32_t lab[12];
    int step = 0, i;
    for (i = 0; i < 60; ++i) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    for (i = 0; i < 12; ++i) lab[i] = i % 3;
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = 5;
    r = mnistcu_ctx_create(&ctx, &d);
    if (r == MNISTCU_OK) {
        step = 1;
        r = mnistcu_dataset_create(ctx, x, lab, 12, 5, 3, &ds);
    }
    if (r == MNISTCU_OK) {
        step = 2;
        r = mnistcu_model_create_mlp(ctx, "5-4-3", &m);
    }
    if (r == MNISTCU_OK) {
        step = 3;
        r = mnistcu_train(m, ds, &td, NULL);
    }
    if (r == MNISTCU_OK) {
        mnistcu_metrics met;
        int64_t conf[9];
        step = 4;
        r = mnistcu_evaluate(m, ds, &met, conf);
    }
    if (r == MNISTCU_OK) {
        mnistcu_dataset *a = NULL, *b = NULL;
        step = 5;
        r = mnistcu_dataset_split(ctx, ds, 4, 1, &a, &b);
        if (r != MNISTCU_OK && (a != NULL || b != NULL)) {
            snprintf(why, why_size, "fail_after %ld: a failed split left a part set", fail_after);
            mnistcu_ctx_destroy(ctx);
            return -1;
        }
    }
    if (r == MNISTCU_OK) step = 6;
    if (r != MNISTCU_OK && r != MNISTCU_ERR_OUT_OF_MEMORY) {
        snprintf(why, why_size, "fail_after %ld: step %d returned %s (%s)", fail_after, step, mnistcu_result_name(r),
                 ctx ? mnistcu_ctx_error(ctx) : "");
        step = -1;
    } else if (r == MNISTCU_ERR_OUT_OF_MEMORY && step > 0 && mnistcu_ctx_error(ctx)[0] == 0) {
        snprintf(why, why_size, "fail_after %ld: out of memory without a message", fail_after);
        step = -1;
    } else if (r == MNISTCU_ERR_OUT_OF_MEMORY && step == 0 && ctx != NULL) {
        snprintf(why, why_size, "fail_after %ld: ctx_create failed but left *out set", fail_after);
        step = -1;
    }
    mnistcu_ctx_destroy(ctx);
    if (step >= 0 && a.live != 0) {
        snprintf(why, why_size, "fail_after %ld: %ld allocations not freed after ctx_destroy", fail_after, a.live);
        step = -1;
    }
    *total = a.total;
    return step;
}

TEST failing_allocator_gives_out_of_memory(void)
{
    char why[512];
    long n, total = 0, needed;
    int step, k, reached[7] = {0, 0, 0, 0, 0, 0, 0};
    why[0] = 0;
    ASSERT_EQ(6, oom_run(-1, &needed, why, sizeof why)); /* how many allocations the whole run makes */
    for (n = 0; n <= 60 || n <= needed; ++n) {
        step = oom_run(n, &total, why, sizeof why);
        if (step < 0) FAILm(why);
        reached[step]++;
        if (n >= needed) ASSERT_EQ(6, step);
        else ASSERTm("fewer allocations than needed cannot succeed", step < 6);
    }
    /* every call was made to fail somewhere in the sweep */
    for (k = 0; k < 6; ++k) ASSERT(reached[k] > 0);
    PASS();
}

/* Train, evaluate, predict and compute_grads never write to their inputs. */
TEST inputs_unchanged(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(71);
    size_t n = 40, F = 6, i;
    float *x = tu_random_floats(&rng, n * F, -1, 1), *x0 = (float *)malloc(n * F * sizeof(float));
    float *ds_before, *ds_after, probs[40 * 3], logits[40 * 3];
    int32_t lab[40], lab0[40], pred[40], dl_before[40], dl_after[40];
    uint8_t px[40 * 6], px0[40 * 6];
    mnistcu_dataset *ds = NULL;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_optim_desc od;
    mnistcu_metrics met;
    double loss;
    for (i = 0; i < n; ++i) lab[i] = (int32_t)(i % 3);
    for (i = 0; i < n * F; ++i) px[i] = (uint8_t)(tu_next(&rng) & 0xFF);
    memcpy(x0, x, n * F * sizeof(float));
    memcpy(lab0, lab, sizeof lab);
    memcpy(px0, px, sizeof px);
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_create(ctx, x, lab, n, F, 3, &ds));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "6-7-3", &m));
    ds_before = all_samples(ds, dl_before);
    memset(&td, 0, sizeof td);
    td.epochs = 2;
    td.batch_size = 16;
    td.validation = ds;
    memset(&od, 0, sizeof od);
    od.momentum = 0.5f;
    od.kind = MNISTCU_OPTIM_SGD;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, NULL));
    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, ds, &met, NULL));
    ASSERT_EQ(MNISTCU_OK, mnistcu_predict(m, x, n, pred, probs));
    ASSERT_EQ(MNISTCU_OK, mnistcu_predict_u8(m, px, n, pred, probs));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_forward(m, x, n, logits));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(m, x, lab, n, &loss));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_apply_grads(m, &od));
    ASSERT_EQ(0.5f, od.momentum);
    ASSERT_EQ(0.0f, od.learning_rate); /* the desc is read, not resolved in place */
    ds_after = all_samples(ds, dl_after);
    ASSERT_ARRAY_EQ_BITS_F(x0, x, n * F);
    ASSERT_MEM_EQ(lab0, lab, sizeof lab);
    ASSERT_MEM_EQ(px0, px, sizeof px);
    ASSERT_ARRAY_EQ_BITS_F(ds_before, ds_after, n * F);
    ASSERT_MEM_EQ(dl_before, dl_after, sizeof dl_after);
    ASSERT_EQ(2, td.epochs);
    ASSERT_EQ(16, td.batch_size);
    free(x); free(x0); free(ds_before); free(ds_after);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST log_callback_and_silent(void)
{
    mnistcu_ctx_desc d;
    mnistcu_ctx *ctx = NULL;
    mnistcu_model *m = NULL;
    mnistcu_dataset *ds;
    mnistcu_train_desc td;
    log_sink sink;
    memset(&d, 0, sizeof d);
    memset(&sink, 0, sizeof sink);
    d.log = sink_log;
    d.log_user = &sink;
    d.log_level = MNISTCU_LOG_ERROR;
    ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&ctx, &d));
    ASSERT_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_model_create_mlp(ctx, "784-x-10", &m));
    ASSERT_EQ(1, sink.calls);
    ASSERT_EQ(MNISTCU_LOG_ERROR, sink.last_level);
    ASSERT(sink.last[0] != 0);
    ASSERT_STR_EQ(mnistcu_ctx_error(ctx), sink.last);
    ASSERTm("the message quotes the spec", strstr(sink.last, "784-x-10") != NULL);
    mnistcu_ctx_destroy(ctx);

    /* INFO: one line per epoch as well */
    memset(&sink, 0, sizeof sink);
    d.log_level = MNISTCU_LOG_INFO;
    ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&ctx, &d));
    ds = tiny_dataset(ctx, 10, 3, 2, 9);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "3-2", &m));
    memset(&td, 0, sizeof td);
    td.epochs = 3;
    td.batch_size = 5;
    sink.calls = 0;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, NULL));
    ASSERT_EQ(3, sink.calls);
    ASSERT_EQ(0, sink.errors);
    ASSERT(strstr(sink.last, "epoch 3/3") != NULL);
    mnistcu_ctx_destroy(ctx);

    /* SILENT: the callback never runs, the message is still kept */
    memset(&sink, 0, sizeof sink);
    d.log_level = MNISTCU_LOG_SILENT;
    ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&ctx, &d));
    ds = tiny_dataset(ctx, 10, 3, 2, 9);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "3-2", &m));
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, NULL));
    ASSERT_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_model_create_mlp(ctx, "784-x-10", &m));
    ASSERT_EQ(0, sink.calls);
    ASSERT(mnistcu_ctx_error(ctx)[0] != 0);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST train_desc_resolve_defaults(void)
{
    mnistcu_train_desc in, out;
    memset(&in, 0, sizeof in);
    memset(&out, 0xAB, sizeof out);
    mnistcu_train_desc_resolve(&in, &out);
    ASSERT_EQ(10, out.epochs);
    ASSERT_EQ(64, out.batch_size);
    ASSERT_EQ(MNISTCU_OPTIM_SGD, out.optim.kind);
    ASSERT_EQ(0.1f, out.optim.learning_rate);
    ASSERT_EQ(0.0f, out.optim.momentum);
    ASSERT_EQ(0, out.no_shuffle);
    ASSERT(out.validation == NULL && out.progress == NULL);
    memset(&out, 0xAB, sizeof out);
    mnistcu_train_desc_resolve(NULL, &out);
    ASSERT_EQ(10, out.epochs);
    ASSERT_EQ(64, out.batch_size);
    ASSERT_EQ(0.1f, out.optim.learning_rate);
    in.epochs = 3;
    in.batch_size = 7;
    in.optim.learning_rate = 0.25f;
    in.no_shuffle = 1;
    mnistcu_train_desc_resolve(&in, &out);
    ASSERT_EQ(3, out.epochs);
    ASSERT_EQ(7, out.batch_size);
    ASSERT_EQ(0.25f, out.optim.learning_rate);
    ASSERT_EQ(1, out.no_shuffle);
    PASS();
}

SUITE(api_suite)
{
    RUN_TEST(null_arguments_are_errors);
    RUN_TEST(zero_count_is_an_error);
    RUN_TEST(train_and_evaluate_argument_checks);
    RUN_TEST(compute_grads_label_range);
    RUN_TEST(result_names_and_strings);
    RUN_TEST(ctx_create_rejects_out_of_range_fields);
    RUN_TEST(precision_on_the_cpu_resolves_to_fp32);
    RUN_TEST(device_environment_variable);
    RUN_TEST(custom_allocator_sees_every_allocation_freed);
    RUN_TEST(failing_allocator_gives_out_of_memory);
    RUN_TEST(inputs_unchanged);
    RUN_TEST(log_callback_and_silent);
    RUN_TEST(train_desc_resolve_defaults);
}
