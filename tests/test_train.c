/* Training through the public API: learning a separable problem, batching and
   progress reports, early stopping, validation, determinism, evaluation and
   its normalisation, and real MNIST. References (accuracy, loss, confusion
   counts, normalised features) are computed here from logits or raw bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

#ifndef MNIST_EPOCHS
#define MNIST_EPOCHS 3 /* see real_mnist_reaches_97_percent */
#endif

/* ---- helpers --------------------------------------------------------------- */

/* Linearly separable data: label = argmax_c w_c . x for random w, x uniform
   in [-1, 1]^F, keeping only samples with a margin >= 0.2 between the two
   best classes. x [n][F], labels [n], both malloc'ed. */
static void separable_data(uint64_t seed, size_t n, size_t F, int C, float **xo, int32_t **lo)
{
    tu_rng rng = tu_rng_make(seed);
    float *w = tu_random_floats(&rng, (size_t)C * F, -1.0f, 1.0f);
    float *x = (float *)malloc(n * F * sizeof(float));
    int32_t *lab = (int32_t *)malloc(n * sizeof(int32_t));
    size_t i = 0, j;
    while (i < n) {
        double best = -1e300, second = -1e300;
        int c, arg = 0;
        for (j = 0; j < F; ++j) x[i * F + j] = (float)tu_uniform(&rng, -1.0, 1.0);
        for (c = 0; c < C; ++c) {
            double s = 0.0;
            for (j = 0; j < F; ++j) s += (double)w[(size_t)c * F + j] * (double)x[i * F + j];
            if (s > best) {
                second = best;
                best = s;
                arg = c;
            } else if (s > second) {
                second = s;
            }
        }
        if (best - second < 0.2) continue;
        lab[i++] = arg;
    }
    free(w);
    *xo = x;
    *lo = lab;
}

static mnistcu_dataset *separable_dataset(mnistcu_ctx *ctx, uint64_t seed, size_t n, size_t F, int C)
{
    float *x;
    int32_t *lab;
    mnistcu_dataset *ds = NULL;
    separable_data(seed, n, F, C, &x, &lab);
    if (mnistcu_dataset_create(ctx, x, lab, n, F, C, &ds) != MNISTCU_OK) ds = NULL;
    free(x);
    free(lab);
    return ds;
}

/* Mean cross-entropy (double) and correct count of logits [n][C] against labels. */
static double ref_ce(const float *logits, const int32_t *labels, size_t n, size_t C, size_t *correct)
{
    double total = 0.0;
    size_t i, j;
    *correct = 0;
    for (i = 0; i < n; ++i) {
        const float *z = logits + i * C;
        double mx = z[0], s = 0.0;
        size_t arg = 0;
        for (j = 1; j < C; ++j)
            if (z[j] > mx) {
                mx = z[j];
                arg = j;
            }
        for (j = 0; j < C; ++j) s += exp((double)z[j] - mx);
        total += mx + log(s) - (double)z[labels[i]];
        *correct += arg == (size_t)labels[i];
    }
    return total / (double)n;
}

/* Loss and correct count of the model on a dataset's normalised features
   (as dataset_sample gives them), through forward + ref_ce. */
static double ref_metrics_of(mnistcu_model *m, const mnistcu_dataset *ds, size_t *correct)
{
    mnistcu_dataset_info info;
    mnistcu_model_info mi;
    float *x, *z;
    int32_t *lab;
    size_t i;
    double loss = -1.0;
    mnistcu_dataset_info_get(ds, &info);
    mnistcu_model_info_get(m, &mi);
    x = (float *)malloc(info.count * info.features * sizeof(float));
    z = (float *)malloc(info.count * mi.classes * sizeof(float));
    lab = (int32_t *)malloc(info.count * sizeof(int32_t));
    *correct = 0;
    for (i = 0; i < info.count; ++i)
        if (mnistcu_dataset_sample(ds, i, x + i * info.features, lab + i) != MNISTCU_OK) goto done;
    if (mnistcu_model_forward(m, x, info.count, z) != MNISTCU_OK) goto done;
    loss = ref_ce(z, lab, info.count, mi.classes, correct);
done:
    free(x); free(z); free(lab);
    return loss;
}

static float *params_of(const mnistcu_model *m)
{
    size_t n = mnistcu_model_num_params(m);
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    if (mnistcu_model_get_params(m, p, n) != MNISTCU_OK) memset(p, 0xFF, n * sizeof(float));
    return p;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0.0;
    size_t i;
    for (i = 0; i < n; ++i)
        if (fabs((double)a[i] - (double)b[i]) > d) d = fabs((double)a[i] - (double)b[i]);
    return d;
}

/* Records every progress report; stops when stop_at_call (1-based) is reached. */
#define REC_MAX 64
typedef struct recorder {
    int calls, stop_at_call;
    mnistcu_progress p[REC_MAX];
} recorder;

static int record_progress(void *user, const mnistcu_progress *p)
{
    recorder *r = (recorder *)user;
    if (r->calls < REC_MAX) r->p[r->calls] = *p;
    r->calls++;
    return r->stop_at_call && r->calls >= r->stop_at_call;
}

/* ---- tests ----------------------------------------------------------------- */

TEST learns_separable_data(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    mnistcu_metrics before, after;
    recorder rec;
    float *x;
    int32_t *lab, *pred;
    size_t n = 2000, F = 20, i, correct = 0, ref_correct;
    double ref_loss;
    ASSERT(ctx != NULL);
    separable_data(1, n, F, 4, &x, &lab);
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_create(ctx, x, lab, n, F, 4, &ds));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "20-32-4", &m));
    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, ds, &before, NULL));
    memset(&td, 0, sizeof td);
    memset(&rec, 0, sizeof rec);
    td.epochs = 20;
    td.batch_size = 32;
    td.progress = record_progress;
    td.progress_user = &rec;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, &res));
    ASSERT_EQ(20, res.epochs);
    ASSERT_EQ((size_t)20 * 63, res.steps);
    ASSERT_EQ(20, rec.calls);
    /* the training loss of the epochs goes down */
    ASSERT_LT(rec.p[19].train_loss, 0.5 * rec.p[0].train_loss);
    ASSERT_LT(rec.p[19].train_loss, rec.p[4].train_loss);
    ASSERT_NEAR(res.train_loss, rec.p[19].train_loss, 0, 0);
    ASSERT_NEAR(res.train_accuracy, rec.p[19].train_accuracy, 0, 0);
    /* the accuracy, from predict's labels and from evaluate */
    pred = (int32_t *)malloc(n * sizeof(int32_t));
    ASSERT_EQ(MNISTCU_OK, mnistcu_predict(m, x, n, pred, NULL));
    for (i = 0; i < n; ++i) correct += pred[i] == lab[i];
    ASSERT_GT((double)correct / (double)n, 0.98);
    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, ds, &after, NULL));
    ASSERT_EQ(n, after.count);
    ASSERT_EQ(correct, after.correct);
    ASSERT_NEAR(after.accuracy, (double)correct / (double)n, 1e-12, 0);
    ASSERT_LT(after.loss, 0.25 * before.loss);
    /* evaluate's loss against a double reference from the logits */
    ref_loss = ref_metrics_of(m, ds, &ref_correct);
    ASSERT_NEAR(after.loss, ref_loss, 1e-6, 1e-4);
    ASSERT_EQ(ref_correct, after.correct);
    free(x); free(lab); free(pred);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* 130 samples in batches of 64: 64 + 64 + 2, and the 2 are trained. */
TEST last_partial_batch_is_trained(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds;
    mnistcu_model *m = NULL, *full = NULL, *part = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    recorder rec;
    float *x, *p0, *pm, *pf, *pp;
    int32_t *lab;
    size_t np, k;
    int e;
    ASSERT(ctx != NULL);
    separable_data(2, 130, 8, 3, &x, &lab);
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_create(ctx, x, lab, 130, 8, 3, &ds));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "8-5-3", &m));
    p0 = params_of(m);
    np = mnistcu_model_num_params(m);

    /* reports at epoch ends only */
    memset(&td, 0, sizeof td);
    memset(&rec, 0, sizeof rec);
    td.epochs = 2;
    td.progress = record_progress;
    td.progress_user = &rec;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, &res)); /* default batch 64 */
    ASSERT_EQ(2, res.epochs);
    ASSERT_EQ((size_t)6, res.steps);
    ASSERT_EQ(2, rec.calls);
    for (e = 0; e < 2; ++e) {
        ASSERT_EQ(e + 1, rec.p[e].epoch);
        ASSERT_EQ(2, rec.p[e].epochs);
        ASSERT_EQ((size_t)3, rec.p[e].step);
        ASSERT_EQ((size_t)3, rec.p[e].steps);
        ASSERT_EQ((size_t)130, rec.p[e].samples);
        ASSERT_EQ(1, rec.p[e].epoch_end);
        ASSERT_EQ(0, rec.p[e].has_validation);
        ASSERT(rec.p[e].train_accuracy >= 0.0 && rec.p[e].train_accuracy <= 1.0);
    }
    ASSERT(rec.p[1].seconds >= rec.p[0].seconds);

    /* reports every step */
    memset(&rec, 0, sizeof rec);
    td.epochs = 1;
    td.progress_every = 1;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, &res));
    ASSERT_EQ((size_t)3, res.steps);
    ASSERT_EQ(3, rec.calls);
    ASSERT_EQ((size_t)64, rec.p[0].samples);
    ASSERT_EQ((size_t)128, rec.p[1].samples);
    ASSERT_EQ((size_t)130, rec.p[2].samples);
    for (k = 0; k < 3; ++k) {
        ASSERT_EQ(k + 1, rec.p[k].step);
        ASSERT_EQ(k == 2, rec.p[k].epoch_end);
    }

    /* one unshuffled epoch equals three manual steps on rows 0-63, 64-127, 128-129 */
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(m, p0, np));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "8-5-3", &full));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "8-5-3", &part));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(full, p0, np));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(part, p0, np));
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.no_shuffle = 1;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, &res));
    for (k = 0; k < 3; ++k) {
        size_t off = k * 64, b = k < 2 ? 64 : 2;
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(full, x + off * 8, lab + off, b, NULL));
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_apply_grads(full, NULL));
        if (k < 2) {
            ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(part, x + off * 8, lab + off, b, NULL));
            ASSERT_EQ(MNISTCU_OK, mnistcu_model_apply_grads(part, NULL));
        }
    }
    pm = params_of(m); pf = params_of(full); pp = params_of(part);
    ASSERT_ARRAY_NEAR_F(pm, pf, np, 1e-6, 1e-5);
    ASSERTm("the last two samples changed the weights", max_abs_diff(pm, pp, np) > 1e-4);
    free(x); free(lab); free(p0); free(pm); free(pf); free(pp);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST progress_callback_stops_training(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds;
    mnistcu_model *m = NULL, *ref = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    recorder rec;
    float *p0, *pa, *pb;
    size_t np;
    ASSERT(ctx != NULL);
    ds = separable_dataset(ctx, 3, 130, 8, 3);
    ASSERT(ds != NULL);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "8-5-3", &m));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "8-5-3", &ref));
    np = mnistcu_model_num_params(m);
    p0 = params_of(m);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(ref, p0, np));

    /* stop at the end of epoch 2 of 5 */
    memset(&td, 0, sizeof td);
    memset(&rec, 0, sizeof rec);
    rec.stop_at_call = 2;
    td.epochs = 5;
    td.no_shuffle = 1;
    td.progress = record_progress;
    td.progress_user = &rec;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, &res));
    ASSERT_EQ(2, rec.calls);
    ASSERT_EQ(2, res.epochs);
    ASSERT_EQ((size_t)6, res.steps);
    ASSERT_NEAR(res.train_loss, rec.p[1].train_loss, 0, 0);
    /* the same as asking for 2 epochs */
    td.progress = NULL;
    td.epochs = 2;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(ref, ds, &td, &res));
    pa = params_of(m); pb = params_of(ref);
    ASSERT_ARRAY_EQ_BITS_F(pa, pb, np);
    free(pa); free(pb);

    /* stop inside an epoch: after step 2 of epoch 2 (the 5th step) */
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(m, p0, np));
    memset(&rec, 0, sizeof rec);
    rec.stop_at_call = 5;
    td.epochs = 5;
    td.progress = record_progress;
    td.progress_every = 1;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, &res));
    ASSERT_EQ(5, rec.calls);
    ASSERT_EQ(2, rec.p[4].epoch);
    ASSERT_EQ((size_t)2, rec.p[4].step);
    ASSERT_EQ(0, rec.p[4].epoch_end);
    ASSERT_EQ(2, res.epochs);
    ASSERT_EQ((size_t)5, res.steps);
    ASSERT_NEAR(res.train_loss, rec.p[4].train_loss, 0, 0);
    free(p0);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

TEST validation_metrics_match_evaluate(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *all, *tr = NULL, *va = NULL;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    mnistcu_metrics met;
    recorder rec;
    int k, ends = 0;
    ASSERT(ctx != NULL);
    all = separable_dataset(ctx, 4, 600, 10, 3);
    ASSERT(all != NULL);
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_split(ctx, all, 450, 1, &tr, &va));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "10-16-3", &m));
    memset(&td, 0, sizeof td);
    memset(&rec, 0, sizeof rec);
    td.epochs = 3;
    td.batch_size = 50;
    td.validation = va;
    td.progress = record_progress;
    td.progress_user = &rec;
    td.progress_every = 4;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, tr, &td, &res));
    ASSERT_EQ(3 * 3, rec.calls); /* steps 4, 8, 9 of each epoch */
    for (k = 0; k < rec.calls; ++k) {
        ASSERT_EQ(rec.p[k].epoch_end, rec.p[k].has_validation);
        ends += rec.p[k].epoch_end;
        if (rec.p[k].has_validation) {
            ASSERT(rec.p[k].val_loss > 0.0);
            ASSERT(rec.p[k].val_accuracy >= 0.0 && rec.p[k].val_accuracy <= 1.0);
        }
    }
    ASSERT_EQ(3, ends);
    ASSERT_EQ(1, res.has_validation);
    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, va, &met, NULL));
    ASSERT_NEAR(res.val_loss, met.loss, 1e-12, 1e-12);
    ASSERT_NEAR(res.val_accuracy, met.accuracy, 1e-12, 0);
    ASSERT_NEAR(rec.p[8].val_loss, met.loss, 1e-12, 1e-12);
    ASSERT_NEAR(rec.p[8].val_accuracy, met.accuracy, 1e-12, 0);
    ASSERT(rec.p[2].val_loss != rec.p[8].val_loss); /* measured again at each epoch end */
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* Same seed: the same bits; another seed or no shuffling: other weights. */
TEST deterministic_for_a_seed(void)
{
    mnistcu_ctx *c[4];
    mnistcu_ctx_desc d;
    mnistcu_train_desc td;
    float *p[4];
    size_t np = 0;
    int k;
    memset(&d, 0, sizeof d);
    d.seed = 777;
    d.log_level = MNISTCU_LOG_SILENT;
    c[0] = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    c[1] = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    c[2] = NULL;
    ASSERT_EQ(MNISTCU_OK, mnistcu_ctx_create(&c[2], &d));
    c[3] = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    ASSERT(c[0] && c[1] && c[3]);
    for (k = 0; k < 4; ++k) {
        mnistcu_dataset *ds = separable_dataset(c[k], 5, 300, 12, 4);
        mnistcu_model *m = NULL;
        ASSERT(ds != NULL);
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(c[k], "12-24-4", &m));
        memset(&td, 0, sizeof td);
        td.epochs = 3;
        td.batch_size = 16;
        td.no_shuffle = k == 3;
        ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, NULL));
        np = mnistcu_model_num_params(m);
        p[k] = params_of(m);
    }
    ASSERT_ARRAY_EQ_BITS_F(p[0], p[1], np);
    ASSERTm("another seed gives other weights", max_abs_diff(p[0], p[2], np) > 1e-3);
    ASSERTm("no_shuffle gives other weights", max_abs_diff(p[0], p[3], np) > 1e-4);
    for (k = 0; k < 4; ++k) {
        free(p[k]);
        mnistcu_ctx_destroy(c[k]);
    }
    PASS();
}

/* Trains the model `spec` on separable data in a 1-thread and a 2-thread CPU context and
   compares the weights bit for bit. */
static greatest_test_res threads_same_bits(const char *spec, uint64_t seed, size_t n, size_t F, int epochs,
                                           int batch)
{
    mnistcu_ctx *c[2];
    float *p[2];
    size_t np = 0;
    int k;
    c[0] = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    c[1] = tu_ctx(MNISTCU_DEVICE_CPU, 2);
    ASSERT(c[0] && c[1]);
    ASSERT_EQ(1, mnistcu_ctx_threads(c[0]));
    for (k = 0; k < 2; ++k) {
        mnistcu_dataset *ds = separable_dataset(c[k], seed, n, F, 10);
        mnistcu_model *m = NULL;
        mnistcu_train_desc td;
        ASSERT(ds != NULL);
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_spec(c[k], spec, &m));
        memset(&td, 0, sizeof td);
        td.epochs = epochs;
        td.batch_size = batch;
        td.optim.momentum = 0.9f;
        ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, NULL));
        np = mnistcu_model_num_params(m);
        p[k] = params_of(m);
    }
    ASSERT_ARRAY_EQ_BITS_F(p[0], p[1], np);
    free(p[0]); free(p[1]);
    mnistcu_ctx_destroy(c[0]);
    mnistcu_ctx_destroy(c[1]);
    PASS();
}

/* The CPU backend: 1 and 2 threads give the same bits (products big enough to be split). */
TEST cpu_threads_same_bits(void)
{
    CHECK_CALL(threads_same_bits("300-1024-10", 6, 400, 300, 2, 100));
    PASS();
}

/* The same for a CNN whose pooling passes are split across the threads (a 2x2 max pool, the unrolled
   path; an overlapping one with a ReLU folded in; an average pool; each above the size where the
   planes are shared out) and whose convolutions take alternate samples on the two threads. */
TEST cpu_threads_same_bits_cnn(void)
{
    CHECK_CALL(threads_same_bits("1x28x28 conv3x3x8 relu maxpool2 conv3x3x8 maxpool3:s=1 relu avgpool2 flatten dense10",
                                 7, 256, 784, 1, 128));
    PASS();
}

TEST confusion_matrix_counts(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_metrics met;
    int64_t conf[5 * 5 + 1], ref[5 * 5], trace = 0, total = 0;
    float *x;
    int32_t *lab, pred[1500];
    size_t n = 1500, i, ref_correct;
    ASSERT(ctx != NULL);
    separable_data(7, n, 6, 5, &x, &lab);
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_create(ctx, x, lab, n, 6, 5, &ds)); /* 1500: evaluated in two chunks */
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "6-5", &m));
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = 500; /* barely trained: some errors */
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, NULL));
    conf[25] = 12345; /* must stay: the matrix is classes x classes */
    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, ds, &met, conf));
    ASSERT_EQ((int64_t)12345, conf[25]);
    ASSERT_EQ(MNISTCU_OK, mnistcu_predict(m, x, n, pred, NULL));
    memset(ref, 0, sizeof ref);
    for (i = 0; i < n; ++i) ref[lab[i] * 5 + pred[i]]++;
    for (i = 0; i < 25; ++i) {
        total += conf[i];
        if (i % 6 == 0) trace += conf[i];
        ASSERT_EQ(ref[i], conf[i]);
    }
    ASSERT_EQ((int64_t)n, total);
    ASSERT_EQ((int64_t)met.correct, trace);
    ASSERT(met.correct < n && met.correct > n / 5);
    ASSERT_NEAR(ref_metrics_of(m, ds, &ref_correct), met.loss, 1e-6, 1e-4);
    ASSERT_EQ(ref_correct, met.correct);
    free(x); free(lab);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* u8 IDX bytes in memory: images [n][2][3], labels = argmax of the sums of the two rows + (first pixel odd). */
static unsigned char *u8_idx(const uint8_t *pix, size_t n, int labels, size_t *size)
{
    size_t header = labels ? 8 : 16, body = labels ? n : n * 6, i;
    unsigned char *b = (unsigned char *)malloc(header + body);
    memset(b, 0, header);
    b[2] = 0x08;
    b[3] = (unsigned char)(labels ? 1 : 3);
    b[4] = (unsigned char)(n >> 24); b[5] = (unsigned char)(n >> 16); b[6] = (unsigned char)(n >> 8); b[7] = (unsigned char)n;
    if (!labels) {
        b[11] = 2;
        b[15] = 3;
    }
    for (i = 0; i < body; ++i) b[header + i] = pix[i];
    *size = header + body;
    return b;
}

static mnistcu_dataset *u8_dataset(mnistcu_ctx *ctx, tu_rng *rng, size_t n, int lo, int hi, uint8_t **pix_out)
{
    uint8_t *pix = (uint8_t *)malloc(n * 6), *lab = (uint8_t *)malloc(n);
    unsigned char *ib, *lb;
    size_t is, ls, i;
    mnistcu_dataset_desc d;
    mnistcu_dataset *ds = NULL;
    for (i = 0; i < n; ++i) {
        int s0 = 0, s1 = 0, j;
        for (j = 0; j < 6; ++j) pix[i * 6 + j] = (uint8_t)(lo + (int)(tu_next(rng) % (uint64_t)(hi - lo + 1)));
        for (j = 0; j < 3; ++j) {
            s0 += pix[i * 6 + j];
            s1 += pix[i * 6 + 3 + j];
        }
        lab[i] = (uint8_t)(s0 > s1 ? 0 : 1);
    }
    ib = u8_idx(pix, n, 0, &is);
    lb = u8_idx(lab, n, 1, &ls);
    memset(&d, 0, sizeof d);
    d.images_data = ib;
    d.images_size = is;
    d.labels_data = lb;
    d.labels_size = ls;
    d.num_classes = 2;
    if (mnistcu_dataset_load(ctx, &d, &ds) != MNISTCU_OK) ds = NULL;
    free(ib); free(lb); free(lab);
    *pix_out = pix;
    return ds;
}

/* A trained model evaluates every dataset with its training set's normalisation. */
TEST evaluate_uses_the_training_normalisation(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    tu_rng rng = tu_rng_make(91), rng2;
    mnistcu_dataset *tr, *te, *te2;
    mnistcu_dataset_info itr, ite;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_metrics met, met2;
    uint8_t *ptr, *pte, *pte2;
    float *x, *z;
    int32_t *lab;
    size_t ntr = 400, nte = 300, i, ref_correct, own_correct;
    double mean = 0.0, var = 0.0, sd, ref_loss, own_loss;
    ASSERT(ctx != NULL);
    tr = u8_dataset(ctx, &rng, ntr, 0, 120, &ptr);   /* dark */
    rng2 = rng;
    te = u8_dataset(ctx, &rng, nte, 90, 255, &pte);  /* bright: other statistics */
    te2 = u8_dataset(ctx, &rng2, nte, 90, 255, &pte2); /* the same bytes again */
    ASSERT(tr && te && te2);
    ASSERT_MEM_EQ(pte, pte2, nte * 6);
    mnistcu_dataset_info_get(tr, &itr);
    mnistcu_dataset_info_get(te, &ite);
    ASSERT(fabs((double)itr.shift - (double)ite.shift) > 0.5); /* the two standardisations differ a lot */
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "6-8-2", &m));
    memset(&td, 0, sizeof td);
    td.epochs = 3;
    td.batch_size = 20;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, tr, &td, NULL));

    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, te, &met, NULL));
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_normalize_like(te2, tr));
    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, te2, &met2, NULL));
    ASSERT_NEAR(met.loss, met2.loss, 1e-12, 1e-12);
    ASSERT_EQ(met.correct, met2.correct);

    /* the reference: features standardised with the training bytes' statistics, computed here */
    for (i = 0; i < ntr * 6; ++i) mean += ptr[i] / 255.0;
    mean /= (double)(ntr * 6);
    for (i = 0; i < ntr * 6; ++i) var += (ptr[i] / 255.0 - mean) * (ptr[i] / 255.0 - mean);
    sd = sqrt(var / (double)(ntr * 6));
    x = (float *)malloc(nte * 6 * sizeof(float));
    z = (float *)malloc(nte * 2 * sizeof(float));
    lab = (int32_t *)malloc(nte * sizeof(int32_t));
    for (i = 0; i < nte * 6; ++i) x[i] = (float)((pte[i] / 255.0 - mean) / sd);
    for (i = 0; i < nte; ++i) ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_sample(te, i, NULL, lab + i));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_forward(m, x, nte, z));
    ref_loss = ref_ce(z, lab, nte, 2, &ref_correct);
    ASSERT_NEAR(met.loss, ref_loss, 1e-5, 1e-4);
    ASSERT_IN_RANGE((double)ref_correct, (double)met.correct, 1.0); /* a tie at rounding level at most */
    /* and the test set's own statistics would have given something else */
    own_loss = ref_metrics_of(m, te, &own_correct);
    ASSERTm("own-statistics loss must differ", fabs(own_loss - met.loss) > 1e-2 * met.loss);
    /* predict_u8 normalises raw bytes the same way */
    {
        int32_t *p1 = (int32_t *)malloc(nte * sizeof(int32_t)), *p2 = (int32_t *)malloc(nte * sizeof(int32_t));
        size_t same = 0;
        ASSERT_EQ(MNISTCU_OK, mnistcu_predict_u8(m, pte, nte, p1, NULL));
        ASSERT_EQ(MNISTCU_OK, mnistcu_predict(m, x, nte, p2, NULL));
        for (i = 0; i < nte; ++i) same += p1[i] == p2[i];
        free(p1); free(p2);
        ASSERT_GTE(same + 1, nte);
    }
    free(ptr); free(pte); free(pte2); free(x); free(z); free(lab);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* ---- divergence ---------------------------------------------------------------
   A learning rate of 1000 (with momentum) sends these random-label problems to
   NaN within ten or so steps, on the CPU and on the GPU alike. */

/* 640 samples of 20 features uniform in [-3, 3], labels i % 4: nothing to learn,
   so a large step only grows the weights. x is malloc'ed. */
static float *noise_data(int32_t lab[640])
{
    tu_rng rng = tu_rng_make(17);
    size_t i;
    for (i = 0; i < 640; ++i) lab[i] = (int32_t)(i % 4);
    return tu_random_floats(&rng, 640 * 20, -3.0f, 3.0f);
}

static mnistcu_dataset *noise_dataset(mnistcu_ctx *ctx)
{
    int32_t lab[640];
    float *x = noise_data(lab);
    mnistcu_dataset *ds = NULL;
    if (mnistcu_dataset_create(ctx, x, lab, 640, 20, 4, &ds) != MNISTCU_OK) ds = NULL;
    free(x);
    return ds;
}

/* A progress callback for the divergence tests: counts the reports (which come
   only after a check that passed), keeps the last, stops training at report
   stop_at (0: never), and at report poison_at saves the weights into saved and
   then puts a NaN into the first weight of the first layer. */
typedef struct watch {
    int calls, stop_at, poison_at;
    mnistcu_progress last;
    mnistcu_model *m;
    float *saved;
} watch;

static int watch_progress(void *user, const mnistcu_progress *p)
{
    watch *w = (watch *)user;
    w->calls++;
    w->last = *p;
    if (w->poison_at && w->calls == w->poison_at) {
        size_t n = mnistcu_model_num_params(w->m);
        float *q = params_of(w->m);
        memcpy(w->saved, q, n * sizeof(float));
        q[0] = tu_nan();
        if (mnistcu_model_set_params(w->m, q, n) != MNISTCU_OK) w->calls = -1000;
        free(q);
    }
    return w->stop_at && w->calls >= w->stop_at;
}

static int all_finite(const float *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; ++i)
        if (!(fabsf(p[i]) <= FLT_MAX)) return 0;
    return 1;
}

/* Checked every step and every third step: training stops with
   MNISTCU_ERR_DIVERGED and a message naming epoch and step. The model keeps
   the copy of the last check that passed, or of the one before when the step
   right after that check is the one that failed (its loss came from those
   weights): either way finite weights whose loss, on the batch that followed
   them, was finite. A run stopped by its callback at that check ends with the
   same bits, and so does a tame epoch from both (the momentum is restored). */
TEST divergence_stops_with_the_last_finite_weights(void)
{
    static const size_t every[2] = {1, 3};
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds;
    float *x, *p0, *pa, *pb;
    int32_t lab[640];
    size_t np;
    int e;
    ASSERT(ctx != NULL);
    x = noise_data(lab);
    ASSERT_EQ(MNISTCU_OK, mnistcu_dataset_create(ctx, x, lab, 640, 20, 4, &ds));
    for (e = 0; e < 2; ++e) {
        mnistcu_model *a = NULL, *b = NULL;
        mnistcu_train_desc td;
        mnistcu_train_result res, res_b;
        mnistcu_result r;
        watch wa, wb;
        char where[64];
        double loss = 0.0;
        int kept, first_after;
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "20-32-4", &a));
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "20-32-4", &b));
        np = mnistcu_model_num_params(a);
        p0 = params_of(a);
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_set_params(b, p0, np));
        memset(&td, 0, sizeof td);
        memset(&wa, 0, sizeof wa);
        td.epochs = 3;
        td.batch_size = 32;
        td.no_shuffle = 1;
        td.optim.learning_rate = 1000.0f;
        td.optim.momentum = 0.9f;
        td.progress = watch_progress;
        td.progress_user = &wa;
        td.progress_every = every[e];
        memset(&res, 0xAB, sizeof res);
        r = mnistcu_train(a, ds, &td, &res);
        ASSERT_ENUM_EQ(MNISTCU_ERR_DIVERGED, r, mnistcu_result_name);
        ASSERT_ENUM_EQ(MNISTCU_ERR_DIVERGED, mnistcu_ctx_last_result(ctx), mnistcu_result_name);
        /* where: the first step whose loss was not finite, after the last check that passed */
        ASSERT(res.diverged_epoch >= 1 && res.diverged_epoch <= 3);
        ASSERT(res.diverged_step >= 1 && res.diverged_step <= 20);
        ASSERT_EQ(res.diverged_epoch, res.epochs);
        if (wa.calls > 0 && wa.last.epoch == res.diverged_epoch) ASSERT_GT(res.diverged_step, wa.last.step);
        ASSERT_FALSE(fabs(res.train_loss) <= DBL_MAX); /* not finite */
        snprintf(where, sizeof where, "epoch %d at step %lu of 20", res.diverged_epoch, (unsigned long)res.diverged_step);
        ASSERTm(mnistcu_ctx_error(ctx), strstr(mnistcu_ctx_error(ctx), where) != NULL);
        ASSERTm(mnistcu_ctx_error(ctx), strstr(mnistcu_ctx_error(ctx), "lower learning rate") != NULL);
        pa = params_of(a);
        ASSERTm("the weights kept must be finite", all_finite(pa, np));

        /* which check's weights: the last, or the one before when the next step failed */
        first_after = wa.calls > 0 && (wa.last.epoch_end ? res.diverged_epoch == wa.last.epoch + 1 && res.diverged_step == 1
                                                         : res.diverged_epoch == wa.last.epoch &&
                                                               res.diverged_step == wa.last.step + 1);
        kept = first_after ? wa.calls - 1 : wa.calls;
        if (every[e] == 1) ASSERTm("checked every step, the step after the last check fails", first_after);
        if (kept == 0) {
            ASSERT_ARRAY_EQ_BITS_F(pa, p0, np); /* nothing better: the weights it started with */
        } else {
            memset(&wb, 0, sizeof wb);
            wb.stop_at = kept;
            td.progress_user = &wb;
            ASSERT_EQ(MNISTCU_OK, mnistcu_train(b, ds, &td, &res_b));
            ASSERT_EQ(kept, wb.calls);
            pb = params_of(b);
            ASSERT_ARRAY_EQ_BITS_F(pa, pb, np);
            free(pb);
            /* their loss on the batch that followed them was finite */
            {
                size_t off = wb.last.epoch_end ? 0 : wb.last.step * 32;
                ASSERT_EQ(MNISTCU_OK, mnistcu_model_compute_grads(a, x + off * 20, lab + off, 32, &loss));
                ASSERTm("the kept weights' loss must be finite", fabs(loss) <= DBL_MAX);
            }
            /* and the momentum: a tame epoch from there ends in the same bits on both */
            memset(&td, 0, sizeof td);
            td.epochs = 1;
            td.batch_size = 32;
            td.no_shuffle = 1;
            td.optim.learning_rate = 0.001f;
            td.optim.momentum = 0.9f;
            ASSERT_EQ(MNISTCU_OK, mnistcu_train(a, ds, &td, NULL));
            ASSERT_EQ(MNISTCU_OK, mnistcu_train(b, ds, &td, NULL));
            free(pa);
            pa = params_of(a);
            pb = params_of(b);
            ASSERT_ARRAY_EQ_BITS_F(pa, pb, np);
            free(pb);
        }
        free(p0); free(pa);
        mnistcu_model_destroy(a);
        mnistcu_model_destroy(b);
    }
    free(x);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* Without a progress callback the check runs at each epoch end: a run that
   diverges in its first epoch gives back the weights it started with. */
TEST divergence_checked_at_epoch_ends(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    float *p0, *p1;
    size_t np;
    ASSERT(ctx != NULL);
    ds = noise_dataset(ctx);
    ASSERT(ds != NULL);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "20-32-4", &m));
    np = mnistcu_model_num_params(m);
    p0 = params_of(m);
    memset(&td, 0, sizeof td);
    td.epochs = 2;
    td.batch_size = 32;
    td.optim.learning_rate = 1000.0f;
    td.optim.momentum = 0.9f;
    ASSERT_ENUM_EQ(MNISTCU_ERR_DIVERGED, mnistcu_train(m, ds, &td, &res), mnistcu_result_name);
    ASSERT_EQ(1, res.diverged_epoch);
    ASSERT(res.diverged_step >= 1 && res.diverged_step <= 20);
    ASSERT_EQ((size_t)20, res.steps); /* found at the end of the epoch */
    ASSERTm(mnistcu_ctx_error(ctx), strstr(mnistcu_ctx_error(ctx), "before training") != NULL);
    p1 = params_of(m);
    ASSERT_ARRAY_EQ_BITS_F(p1, p0, np);
    free(p0); free(p1);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* A NaN weight that only silences a ReLU unit leaves the loss finite: the check
   of the weights finds it (on the GPU, the kernel's flag), and the model gets
   back the weights of the check before. */
TEST divergence_of_a_weight_with_a_finite_loss(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    watch w;
    float *p;
    size_t np;
    ASSERT(ctx != NULL);
    ds = noise_dataset(ctx);
    ASSERT(ds != NULL);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "20-32-4", &m)); /* ReLU */
    np = mnistcu_model_num_params(m);
    memset(&w, 0, sizeof w);
    w.m = m;
    w.poison_at = 3;
    w.saved = (float *)malloc(np * sizeof(float));
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = 32;
    td.no_shuffle = 1;
    td.optim.learning_rate = 0.01f;
    td.optim.momentum = 0.9f;
    td.progress = watch_progress;
    td.progress_user = &w;
    td.progress_every = 1;
    ASSERT_ENUM_EQ(MNISTCU_ERR_DIVERGED, mnistcu_train(m, ds, &td, &res), mnistcu_result_name);
    ASSERT_EQ(3, w.calls);
    ASSERT_EQ(1, res.diverged_epoch);
    ASSERT_EQ((size_t)4, res.diverged_step);
    ASSERTm("the loss stayed finite", fabs(res.train_loss) <= DBL_MAX);
    ASSERTm(mnistcu_ctx_error(ctx), strstr(mnistcu_ctx_error(ctx), "a weight is not finite") != NULL);
    ASSERTm(mnistcu_ctx_error(ctx), strstr(mnistcu_ctx_error(ctx), "of epoch 1, step 3") != NULL);
    p = params_of(m);
    ASSERT_ARRAY_EQ_BITS_F(p, w.saved, np);
    free(p); free(w.saved);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* no_divergence_check lets NaN through; a model whose weights are not finite
   is then refused by a checked run, and accepted again with the check off. */
TEST divergence_check_can_be_turned_off(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *ds;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td, resolved;
    mnistcu_train_result res;
    float *p, *q;
    size_t np;
    ASSERT(ctx != NULL);
    ds = noise_dataset(ctx);
    ASSERT(ds != NULL);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "20-32-4", &m));
    np = mnistcu_model_num_params(m);
    memset(&td, 0, sizeof td);
    mnistcu_train_desc_resolve(&td, &resolved);
    ASSERT_EQ(0, resolved.no_divergence_check); /* on by default */
    td.epochs = 2;
    td.batch_size = 32;
    td.optim.learning_rate = 1000.0f;
    td.optim.momentum = 0.9f;
    td.no_divergence_check = 1;
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, &res), mnistcu_result_name);
    ASSERT_EQ(2, res.epochs);
    ASSERT_EQ(0, res.diverged_epoch);
    ASSERT_FALSE(fabs(res.train_loss) <= DBL_MAX);
    p = params_of(m);
    ASSERT_FALSE(all_finite(p, np));
    td.no_divergence_check = 0;
    td.optim.learning_rate = 0.01f;
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_train(m, ds, &td, &res), mnistcu_result_name);
    ASSERTm(mnistcu_ctx_error(ctx), strstr(mnistcu_ctx_error(ctx), "not finite before training") != NULL);
    ASSERT_EQ((size_t)0, res.steps);
    q = params_of(m);
    ASSERT_EQ(0, memcmp(p, q, np * sizeof(float))); /* untouched */
    td.no_divergence_check = 1;
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_train(m, ds, &td, &res), mnistcu_result_name);
    free(p); free(q);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* 784-128-10, SGD 0.1, batch 64, STANDARD normalisation, 3 epochs.
   Seen on the CPU (seed 1234, any thread count): test accuracy ~97.5 %, loss ~0.08;
   about 1.3 s of training on 2 cores. */
TEST real_mnist_reaches_97_percent(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_dataset *tr = NULL, *te = NULL;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    mnistcu_metrics met;
    char msg[256];
    mnistcu_result r = mnistcu_dataset_load_dir(ctx, tu_mnist_dir(), MNISTCU_SPLIT_TRAIN, &tr);
    if (r == MNISTCU_ERR_NOT_FOUND) {
        mnistcu_ctx_destroy(ctx);
        SKIPm("MNIST not found (make data)");
    }
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_dataset_load_dir(ctx, tu_mnist_dir(), MNISTCU_SPLIT_TEST, &te),
                   mnistcu_result_name);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "784-128-10", &m));
    memset(&td, 0, sizeof td);
    td.epochs = MNIST_EPOCHS;
    td.batch_size = 64;
    td.optim.learning_rate = 0.1f;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, tr, &td, &res));
    ASSERT_EQ(MNISTCU_OK, mnistcu_evaluate(m, te, &met, NULL));
    snprintf(msg, sizeof msg, "test accuracy %.2f%%, loss %.4f after %d epochs (%.1f s, %s)", 100.0 * met.accuracy,
             met.loss, res.epochs, res.seconds, mnistcu_ctx_device_name(ctx));
    if (getenv("MNISTCU_TEST_VERBOSE")) printf("\n%s\n", msg);
    ASSERT_EQ((size_t)10000, met.count);
    ASSERTm(msg, met.accuracy >= 0.970);
    ASSERTm(msg, met.loss > 0.01 && met.loss < 0.12);
    ASSERTm(msg, res.train_accuracy > 0.95);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

#define M_PI_ 3.14159265358979323846
/* ---- learning-rate schedules ------------------------------------------------- */

/* The rates torch.optim.lr_scheduler gives when stepped at each epoch's end,
   written out here in double: StepLR and CosineAnnealingLR (T_max = epochs). */
static double ref_schedule(const mnistcu_schedule_desc *s, double lr, int t, int T)
{
    if (s->kind == MNISTCU_SCHEDULE_STEP) return lr * pow(s->gamma, (double)(t / s->step_size));
    if (s->kind == MNISTCU_SCHEDULE_COSINE) return s->min_lr + (lr - s->min_lr) * (1.0 + cos(M_PI_ * t / T)) / 2.0;
    return lr;
}

TEST schedule_rates_follow_pytorch(void)
{
    mnistcu_schedule_desc s;
    int t, T = 7, k;
    for (k = 0; k < 4; ++k) {
        memset(&s, 0, sizeof s);
        if (k == 0) { s.kind = MNISTCU_SCHEDULE_STEP; s.step_size = 3; s.gamma = 0.5f; }
        if (k == 1) { s.kind = MNISTCU_SCHEDULE_STEP; s.step_size = 1; s.gamma = 0.1f; }
        if (k == 2) { s.kind = MNISTCU_SCHEDULE_COSINE; }
        if (k == 3) { s.kind = MNISTCU_SCHEDULE_COSINE; s.min_lr = 0.001f; }
        for (t = 0; t < T; ++t) {
            double got = mnistcu_schedule_lr(&s, 0.05f, t, T), ref = ref_schedule(&s, (double)0.05f, t, T);
            ASSERT_NEAR(ref, got, 1e-9, 1e-6);
        }
    }
    /* the first epoch always has the base rate; a constant schedule never moves */
    memset(&s, 0, sizeof s);
    ASSERT_EQ(0.05f, mnistcu_schedule_lr(&s, 0.05f, 5, 7));
    ASSERT_EQ(0.05f, mnistcu_schedule_lr(NULL, 0.05f, 5, 7));
    s.kind = MNISTCU_SCHEDULE_COSINE;
    ASSERT_EQ(0.05f, mnistcu_schedule_lr(&s, 0.05f, 0, 7));
    PASS();
}

typedef struct lr_log { int n; double lr[16]; } lr_log;
static int record_lr(void *user, const mnistcu_progress *p)
{
    lr_log *l = (lr_log *)user;
    if (p->epoch_end && l->n < 16) l->lr[l->n++] = p->learning_rate;
    return 0;
}
static int record_step_lr(void *user, const mnistcu_progress *p)
{
    lr_log *l = (lr_log *)user;
    if (l->n < 16) l->lr[l->n++] = p->learning_rate;
    return 0;
}

/* Training uses the schedule's rate in each epoch: the progress report says so,
   and the weights equal those of epochs trained one by one at those rates. */
TEST schedule_applied_per_epoch(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 1), *ctx2 = tu_ctx(MNISTCU_DEVICE_AUTO, 1);
    mnistcu_dataset *ds = separable_dataset(ctx, 3, 200, 8, 3), *ds2 = separable_dataset(ctx2, 3, 200, 8, 3);
    mnistcu_model *m = NULL, *m2 = NULL;
    mnistcu_train_desc d;
    lr_log log;
    float *a = NULL, *b = NULL;
    size_t n;
    int e;
    ASSERT(ctx && ctx2 && ds && ds2);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "8-6-3", &m));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx2, "8-6-3", &m2));
    memset(&d, 0, sizeof d);
    memset(&log, 0, sizeof log);
    d.epochs = 4;
    d.batch_size = 16;
    d.optim.learning_rate = 0.2f;
    d.schedule.kind = MNISTCU_SCHEDULE_STEP;
    d.schedule.step_size = 2;
    d.schedule.gamma = 0.25f;
    d.progress = record_lr;
    d.progress_user = &log;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &d, NULL));
    ASSERT_EQ(4, log.n);
    ASSERT_NEAR(0.2, log.lr[0], 1e-7, 1e-6);
    ASSERT_NEAR(0.2, log.lr[1], 1e-7, 1e-6);
    ASSERT_NEAR(0.05, log.lr[2], 1e-7, 1e-6);
    ASSERT_NEAR(0.05, log.lr[3], 1e-7, 1e-6);
    /* the same four epochs, one call each at the scheduled rate (the model's
       generator carries the shuffling from call to call) */
    memset(&d, 0, sizeof d);
    d.epochs = 1;
    d.batch_size = 16;
    for (e = 0; e < 4; ++e) {
        d.optim.learning_rate = e < 2 ? 0.2f : 0.05f;
        ASSERT_EQ(MNISTCU_OK, mnistcu_train(m2, ds2, &d, NULL));
    }
    n = mnistcu_model_num_params(m);
    a = (float *)malloc(n * sizeof(float));
    b = (float *)malloc(n * sizeof(float));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_get_params(m, a, n));
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_get_params(m2, b, n));
    ASSERT_ARRAY_EQ_BITS_F(a, b, n);
    free(a);
    free(b);
    /* out-of-range settings are refused before training */
    memset(&d, 0, sizeof d);
    d.schedule.kind = MNISTCU_SCHEDULE_STEP;
    d.schedule.gamma = 1.5f;
    ASSERT_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_train(m, ds, &d, NULL));
    d.schedule.kind = MNISTCU_SCHEDULE_COSINE;
    d.schedule.gamma = 0.0f;
    d.schedule.min_lr = 5.0f; /* above the learning rate */
    ASSERT_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_train(m, ds, &d, NULL));
    d.schedule.min_lr = 0.0f;
    d.schedule.kind = (mnistcu_schedule)99;
    ASSERT_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_train(m, ds, &d, NULL));
    d.schedule.kind = MNISTCU_SCHEDULE_PLATEAU; /* needs a validation set */
    ASSERT_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_train(m, ds, &d, NULL));
    mnistcu_ctx_destroy(ctx);
    mnistcu_ctx_destroy(ctx2);
    PASS();
}

/* The rates of torch.optim.lr_scheduler for the same cases (tests/fixtures/schedules.txt, written by
   tests/make_schedule_fixtures.py), epoch by epoch, within float rounding. */
TEST schedules_match_pytorch(void)
{
    static const char *const names[] = {"step_3_0.5", "multistep_2_5_9_0.3", "exponential_0.8", "cosine_min_0.001",
                                        "exp_decay_0.15", "warmup3_0.25_cosine", "warmup2_0.1_step_2_0.5",
                                        "one_cycle_20", "one_cycle_15_0.4_10_100"};
    mnistcu_schedule_desc s[9];
    char line[4096], msg[256];
    int k, found = 0;
    FILE *f = fopen("tests/fixtures/schedules.txt", "r");
    ASSERTm("tests/fixtures/schedules.txt is missing (run from the repository root)", f != NULL);
    memset(s, 0, sizeof s);
    s[0].kind = MNISTCU_SCHEDULE_STEP; s[0].step_size = 3; s[0].gamma = 0.5f;
    s[1].kind = MNISTCU_SCHEDULE_MULTISTEP; s[1].milestones[0] = 2; s[1].milestones[1] = 5; s[1].milestones[2] = 9;
    s[1].gamma = 0.3f;
    s[2].kind = MNISTCU_SCHEDULE_EXPONENTIAL; s[2].gamma = 0.8f;
    s[3].kind = MNISTCU_SCHEDULE_COSINE; s[3].min_lr = 0.001f;
    s[4].kind = MNISTCU_SCHEDULE_EXP_DECAY; s[4].decay = 0.15f;
    s[5].kind = MNISTCU_SCHEDULE_COSINE; s[5].warmup = 3; s[5].warmup_start = 0.25f;
    s[6].kind = MNISTCU_SCHEDULE_STEP; s[6].step_size = 2; s[6].gamma = 0.5f; s[6].warmup = 2;
    s[7].kind = MNISTCU_SCHEDULE_ONE_CYCLE;
    s[8].kind = MNISTCU_SCHEDULE_ONE_CYCLE; s[8].pct_start = 0.4f; s[8].div_factor = 10.0f; s[8].final_div_factor = 100.0f;
    while (fgets(line, sizeof line, f)) {
        char *p = line, *end;
        int T, t;
        if (line[0] == '#' || line[0] == '\n') continue;
        for (k = 0; k < 9; ++k)
            if (strncmp(line, names[k], strlen(names[k])) == 0 && line[strlen(names[k])] == ' ') break;
        if (k == 9) continue;
        p += strlen(names[k]);
        T = (int)strtol(p, &end, 10);
        p = end;
        for (t = 0; t < T; ++t) {
            double ref = strtod(p, &end), got;
            if (end == p) break;
            p = end;
            got = mnistcu_schedule_lr(&s[k], 0.05f, t, T);
            if (!(fabs(got - ref) <= 1e-9 + 2e-7 * fabs(ref))) {
                fclose(f);
                snprintf(msg, sizeof msg, "%s: epoch %d of %d: %.9g, PyTorch %.9g", names[k], t, T, got, ref);
                FAILm(msg);
            }
        }
        ASSERT_EQ(T, t);
        found++;
    }
    fclose(f);
    ASSERT_EQ(9, found);
    PASS();
}

typedef struct val_log { int n; double lr[32], val[32]; } val_log;
static int record_val(void *user, const mnistcu_progress *p)
{
    val_log *l = (val_log *)user;
    if (p->epoch_end && l->n < 32) {
        l->lr[l->n] = p->learning_rate;
        l->val[l->n++] = p->val_loss;
    }
    return 0;
}

/* PLATEAU in training: each epoch's rate follows ReduceLROnPlateau's rule (written out here)
   applied to the validation losses the reports gave. */
TEST schedule_plateau_in_training(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 1);
    mnistcu_dataset *ds = separable_dataset(ctx, 5, 160, 8, 3), *val = separable_dataset(ctx, 6, 64, 8, 3);
    mnistcu_model *m = NULL;
    mnistcu_train_desc d;
    val_log log;
    double best = HUGE_VAL, lr = 0.5;
    int e, bad = 0, reduced = 0;
    ASSERT(ctx && ds && val);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "8-6-3", &m));
    memset(&d, 0, sizeof d);
    memset(&log, 0, sizeof log);
    d.epochs = 14;
    d.batch_size = 16;
    d.optim.learning_rate = 0.5f; /* large enough that the validation loss stalls and bounces */
    d.optim.momentum = 0.9f;
    d.validation = val;
    d.schedule.kind = MNISTCU_SCHEDULE_PLATEAU;
    d.schedule.patience = 1;
    d.schedule.factor = 0.5f;
    d.progress = record_val;
    d.progress_user = &log;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &d, NULL));
    ASSERT_EQ(14, log.n);
    for (e = 0; e < 14; ++e) {
        ASSERT_NEAR(lr, log.lr[e], 1e-9, 1e-6);
        if (log.val[e] < best * (1.0 - 1e-4)) {
            best = log.val[e];
            bad = 0;
        } else if (++bad > 1) {
            lr *= 0.5;
            bad = 0;
            reduced++;
        }
    }
    ASSERTm("the validation loss never stalled: the test proves nothing", reduced > 0);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* Random labels: a wide network memorises the training half and its loss on the
   other half climbs after a few epochs, which is what early stopping watches. */
static void overfit_sets(mnistcu_ctx *ctx, mnistcu_dataset **tr, mnistcu_dataset **va)
{
    tu_rng rng = tu_rng_make(77);
    float *x = tu_random_floats(&rng, 200 * 16, -1.0f, 1.0f);
    int32_t lab[200];
    int i;
    for (i = 0; i < 200; ++i) lab[i] = (int32_t)(tu_next(&rng) % 4);
    *tr = *va = NULL;
    if (mnistcu_dataset_create(ctx, x, lab, 120, 16, 4, tr) != MNISTCU_OK ||
        mnistcu_dataset_create(ctx, x + 120 * 16, lab + 120, 80, 16, 4, va) != MNISTCU_OK)
        *tr = *va = NULL;
    free(x);
}

/* Trains "16-64-4" with the given desc in a fresh context (seed 1234); the parameters in *p. */
static mnistcu_result overfit_run(mnistcu_train_desc *d, mnistcu_train_result *res, float **p, size_t *n)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 1);
    mnistcu_dataset *tr, *va;
    mnistcu_model *m = NULL;
    mnistcu_result r = MNISTCU_ERR_INVALID_ARGUMENT;
    *p = NULL;
    if (!ctx) return r;
    overfit_sets(ctx, &tr, &va);
    if (tr && va && mnistcu_model_create_mlp(ctx, "16-64-4", &m) == MNISTCU_OK) {
        d->validation = va;
        r = mnistcu_train(m, tr, d, res);
        *n = mnistcu_model_num_params(m);
        *p = (float *)malloc(*n * sizeof(float));
        if (r == MNISTCU_OK) r = mnistcu_model_get_params(m, *p, *n);
    }
    mnistcu_ctx_destroy(ctx);
    return r;
}

/* Early stopping ends training once the validation loss has not improved for `early_stop` epochs and
   puts the best epoch's weights back: the same weights as a run of exactly that many epochs. */
TEST early_stopping_restores_the_best_epoch(void)
{
    mnistcu_train_desc d;
    mnistcu_train_result a, b, c;
    float *pa = NULL, *pb = NULL, *pc = NULL;
    size_t n = 0;
    memset(&d, 0, sizeof d);
    d.epochs = 60;
    d.batch_size = 16;
    d.optim.learning_rate = 0.1f;
    d.optim.momentum = 0.9f;
    d.early_stop = 3;
    ASSERT_EQ(MNISTCU_OK, overfit_run(&d, &a, &pa, &n));
    ASSERTm("the validation loss never rose: the test proves nothing", a.early_stopped);
    ASSERT(a.epochs < 60);
    ASSERT_EQ(a.best_epoch + 3, a.epochs);
    /* the same training for exactly best_epoch epochs, no early stopping */
    d.epochs = a.best_epoch;
    d.early_stop = 0;
    ASSERT_EQ(MNISTCU_OK, overfit_run(&d, &b, &pb, &n));
    ASSERT_ARRAY_EQ_BITS_F(pb, pa, n);
    ASSERT_NEAR(a.best_val_loss, b.val_loss, 0.0, 1e-12);
    /* keep_last: the weights of the last epoch trained */
    d.epochs = 60;
    d.early_stop = 3;
    d.keep_last = 1;
    ASSERT_EQ(MNISTCU_OK, overfit_run(&d, &c, &pc, &n));
    ASSERT_EQ(a.epochs, c.epochs);
    free(pb);
    d.epochs = a.epochs;
    d.early_stop = 0;
    d.keep_last = 0;
    ASSERT_EQ(MNISTCU_OK, overfit_run(&d, &b, &pb, &n));
    ASSERT_ARRAY_EQ_BITS_F(pb, pc, n);
    free(pa); free(pb); free(pc);
    /* no validation set: refused */
    {
        mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 1);
        mnistcu_dataset *tr, *va;
        mnistcu_model *m = NULL;
        overfit_sets(ctx, &tr, &va);
        ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "16-8-4", &m));
        memset(&d, 0, sizeof d);
        d.early_stop = 2;
        ASSERT_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_train(m, tr, &d, NULL));
        mnistcu_ctx_destroy(ctx);
    }
    PASS();
}

/* The training log: one JSON line per report, the epoch ends marked, validation where there is one. */
TEST training_log_lines(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 1);
    mnistcu_dataset *tr, *va;
    mnistcu_model *m = NULL;
    mnistcu_train_desc d;
    char path[64], line[1024];
    FILE *f;
    int lines = 0, ends = 0, with_val = 0, epoch, last_epoch = 0;
    ASSERT(ctx);
    overfit_sets(ctx, &tr, &va);
    ASSERT(tr && va);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "16-8-4", &m));
    snprintf(path, sizeof path, "build/test_train_log.jsonl");
    memset(&d, 0, sizeof d);
    d.epochs = 3;
    d.batch_size = 16; /* 8 steps per epoch: reports at steps 3 and 6, and at 8 */
    d.validation = va;
    d.log_path = path;
    d.log_every = 3;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, tr, &d, NULL));
    f = fopen(path, "r");
    ASSERT(f != NULL);
    while (fgets(line, sizeof line, f)) {
        lines++;
        ASSERT_EQ(1, sscanf(line, "{\"epoch\":%d,", &epoch));
        ASSERT(epoch >= last_epoch);
        last_epoch = epoch;
        if (strstr(line, "\"epoch_end\":true")) ends++;
        if (strstr(line, "\"val_loss\":")) with_val++;
        ASSERT(strstr(line, "\"lr\":0.1") != NULL);
        ASSERT_EQ('}', line[strlen(line) - 2]);
    }
    fclose(f);
    remove(path);
    ASSERT_EQ(9, lines);
    ASSERT_EQ(3, ends);
    ASSERT_EQ(3, with_val);
    /* a log that cannot be opened is an error before any step */
    d.log_path = "build/no-such-folder/log.jsonl";
    ASSERT_EQ(MNISTCU_ERR_IO, mnistcu_train(m, tr, &d, NULL));
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* With per_step the rate changes every optimizer step: the report after step k gives step k's rate. */
TEST schedule_per_step(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 1);
    mnistcu_dataset *ds = separable_dataset(ctx, 4, 64, 8, 3);
    mnistcu_model *m = NULL;
    mnistcu_train_desc d;
    lr_log log;
    int k;
    ASSERT(ctx && ds);
    ASSERT_EQ(MNISTCU_OK, mnistcu_model_create_mlp(ctx, "8-5-3", &m));
    memset(&d, 0, sizeof d);
    memset(&log, 0, sizeof log);
    d.epochs = 2;
    d.batch_size = 16; /* 4 steps per epoch, 8 in all */
    d.optim.learning_rate = 0.1f;
    d.schedule.kind = MNISTCU_SCHEDULE_COSINE;
    d.schedule.per_step = 1;
    d.progress = record_step_lr;
    d.progress_every = 1;
    d.progress_user = &log;
    ASSERT_EQ(MNISTCU_OK, mnistcu_train(m, ds, &d, NULL));
    ASSERT_EQ(8, log.n);
    for (k = 0; k < 8; ++k) ASSERT_NEAR(0.05 * (1.0 + cos(M_PI_ * k / 8.0)) * 2.0 * 0.5, log.lr[k], 1e-8, 1e-6);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

SUITE(train_suite)
{
    RUN_TEST(learns_separable_data);
    RUN_TEST(last_partial_batch_is_trained);
    RUN_TEST(progress_callback_stops_training);
    RUN_TEST(validation_metrics_match_evaluate);
    RUN_TEST(deterministic_for_a_seed);
    RUN_TEST(cpu_threads_same_bits);
    RUN_TEST(cpu_threads_same_bits_cnn);
    RUN_TEST(confusion_matrix_counts);
    RUN_TEST(evaluate_uses_the_training_normalisation);
    RUN_TEST(divergence_stops_with_the_last_finite_weights);
    RUN_TEST(divergence_checked_at_epoch_ends);
    RUN_TEST(divergence_of_a_weight_with_a_finite_loss);
    RUN_TEST(divergence_check_can_be_turned_off);
    RUN_TEST(schedule_rates_follow_pytorch);
    RUN_TEST(schedule_applied_per_epoch);
    RUN_TEST(schedules_match_pytorch);
    RUN_TEST(schedule_per_step);
    RUN_TEST(schedule_plateau_in_training);
    RUN_TEST(early_stopping_restores_the_best_epoch);
    RUN_TEST(training_log_lines);
    RUN_TEST(real_mnist_reaches_97_percent);
}
