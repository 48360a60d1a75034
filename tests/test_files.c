/* Model files: safetensors round trips for every layer kind, strict and
   hostile-input reading (every header field corrupted, truncation at every
   byte), atomic saving. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

#define TF_EVERY_KIND "1x12x12 conv3x3x4:p=1 batchnorm leaky_relu0.2 maxpool2 conv3x3x6:s=1:bias=0 relu avgpool2 " \
                      "flatten dropout0.3 dense16 sigmoid batchnorm tanh dense8 softmax"

static int tf_exists(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* A model of every layer kind with random parameters and running statistics,
   a normalisation (from one training step) and class names. */
static mnistcu_model *tf_every_kind(mnistcu_ctx *ctx)
{
    static const char *const names[8] = {"zero", "one", "two", "three", "four", "five", "six", "seven \"q\""};
    mnistcu_model *m = NULL;
    mnistcu_dataset *ds = NULL;
    mnistcu_train_desc td;
    tu_rng rng = tu_rng_make(11);
    float *x = tu_random_floats(&rng, 16 * 144, -1, 1);
    int32_t y[16];
    int i, n, ok;
    for (i = 0; i < 16; ++i) y[i] = i % 8;
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = 8;
    ok = mnistcu_model_create_spec(ctx, TF_EVERY_KIND, &m) == MNISTCU_OK &&
         mnistcu_dataset_create(ctx, x, y, 16, 144, 8, &ds) == MNISTCU_OK && mnistcu_train(m, ds, &td, NULL) == MNISTCU_OK &&
         mnistcu_model_set_class_names(m, names, 8) == MNISTCU_OK;
    n = ok ? mnistcu_model_num_tensors(m) : 0;
    for (i = 0; ok && i < n; ++i) { /* random values everywhere, running variances positive */
        mnistcu_tensor_info ti;
        float *v;
        size_t k;
        mnistcu_model_tensor_info(m, i, &ti);
        if (ti.is_int) continue;
        v = tu_random_floats(&rng, ti.count, strstr(ti.name, "running_var") ? 0.5f : -1.0f, 1.0f);
        for (k = 0; k < ti.count; ++k) v[k] += 0.0f;
        ok = mnistcu_model_set_tensor(m, ti.name, v, ti.count) == MNISTCU_OK;
        free(v);
    }
    free(x);
    mnistcu_dataset_destroy(ds);
    if (!ok) {
        mnistcu_model_destroy(m);
        return NULL;
    }
    return m;
}

/* Saved and loaded (in another context): the same spec, every tensor the same
   bits, the same class names, and the same logits in EVAL mode, bit for bit. */
TEST files_round_trip_every_kind(void)
{
    const char *path = "build/test_every_kind.safetensors";
    mnistcu_ctx *a = tu_ctx(MNISTCU_DEVICE_AUTO, 0), *b = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    mnistcu_model *m = NULL, *l = NULL;
    char sa[1024], sb[1024];
    tu_rng rng = tu_rng_make(12);
    float *x = tu_random_floats(&rng, 5 * 144, -1, 1), za[40], zb[40];
    int failed = 0, i, n;
    TU_REQUIRE(a && b && (m = tf_every_kind(a)) != NULL, "setup: %s", a ? mnistcu_ctx_error(a) : "no context");
    TU_REQUIRE(mnistcu_model_save(m, path) == MNISTCU_OK, "save: %s", mnistcu_ctx_error(a));
    TU_REQUIRE(!tf_exists("build/test_every_kind.safetensors.tmp"), "the temporary file is left behind");
    TU_REQUIRE(mnistcu_model_load(b, path, &l) == MNISTCU_OK, "load: %s", mnistcu_ctx_error(b));
    TU_REQUIRE(mnistcu_model_spec(m, sa, sizeof sa) == MNISTCU_OK && mnistcu_model_spec(l, sb, sizeof sb) == MNISTCU_OK &&
                   !strcmp(sa, sb), "spec %s became %s", sa, sb);
    n = mnistcu_model_num_tensors(m);
    TU_REQUIRE(n == mnistcu_model_num_tensors(l) && n == 17, "%d tensors, loaded %d", n, mnistcu_model_num_tensors(l));
    for (i = 0; i < n; ++i) {
        mnistcu_tensor_info ti;
        float *va, *vb;
        int same;
        mnistcu_model_tensor_info(m, i, &ti);
        va = (float *)malloc(ti.count * sizeof(float));
        vb = (float *)malloc(ti.count * sizeof(float));
        same = mnistcu_model_get_tensor(m, ti.name, va, ti.count) == MNISTCU_OK &&
               mnistcu_model_get_tensor(l, ti.name, vb, ti.count) == MNISTCU_OK &&
               memcmp(va, vb, ti.count * sizeof(float)) == 0 && (!ti.is_int || va[0] == 2.0f);
        free(va);
        free(vb);
        TU_REQUIRE(same, "tensor %s differs after the round trip", ti.name);
    }
    for (i = 0; i < 8; ++i)
        TU_REQUIRE(mnistcu_model_class_name(l, (size_t)i) &&
                       !strcmp(mnistcu_model_class_name(l, (size_t)i), mnistcu_model_class_name(m, (size_t)i)),
                   "class name %d", i);
    mnistcu_model_set_mode(m, MNISTCU_MODE_EVAL);
    mnistcu_model_set_mode(l, MNISTCU_MODE_EVAL);
    TU_REQUIRE(mnistcu_model_forward(m, x, 5, za) == MNISTCU_OK && mnistcu_model_forward(l, x, 5, zb) == MNISTCU_OK &&
                   memcmp(za, zb, sizeof za) == 0, "the loaded model computes other logits");
done:
    free(x);
    mnistcu_ctx_destroy(a);
    mnistcu_ctx_destroy(b);
    remove(path);
    TU_END();
}

/* ---- corrupting a small file's header ------------------------------------ */

/* file = 8-byte length + header + data: a new file with the header replaced. */
static unsigned char *tf_with_header(const unsigned char *file, size_t size, const char *header, size_t *out_size)
{
    uint64_t n = 0, hn = strlen(header);
    unsigned char *out;
    int k;
    for (k = 7; k >= 0; --k) n = (n << 8) | file[k];
    *out_size = 8 + hn + (size - 8 - (size_t)n);
    out = (unsigned char *)malloc(*out_size);
    for (k = 0; k < 8; ++k) out[k] = (unsigned char)(hn >> (8 * k));
    memcpy(out + 8, header, hn);
    memcpy(out + 8 + hn, file + 8 + n, size - 8 - (size_t)n);
    return out;
}

/* The header with the first `from` replaced by `to` (NULL when absent). */
static char *tf_replace(const char *h, const char *from, const char *to)
{
    const char *p = strstr(h, from);
    char *out;
    if (!p) return NULL;
    out = (char *)malloc(strlen(h) + strlen(to) + 1);
    memcpy(out, h, (size_t)(p - h));
    strcpy(out + (p - h), to);
    strcat(out, p + strlen(from));
    return out;
}

/* Each field of a header broken in turn gives its own result code. */
TEST files_corrupt_header_fields(void)
{
    static const struct { const char *from, *to; mnistcu_result want; } cases[] = {
        {"\"F32\"", "\"F33\"", MNISTCU_ERR_ST_DTYPE},
        {"\"F32\"", "\"I32\"", MNISTCU_ERR_ST_DTYPE},
        {"\"classes\":\"2\"", "\"classes\":\"3\"", MNISTCU_ERR_ST_METADATA},
        {"\"shape\":[3,4]", "\"shape\":[4,4]", MNISTCU_ERR_ST_SHAPE},
        {"\"shape\":[3,4]", "\"shape\":[3,4,-1]", MNISTCU_ERR_ST_JSON},
        {"\"shape\":[3,4]", "\"shape\":[3.0,4]", MNISTCU_ERR_ST_JSON},
        {"\"shape\":[3,4]", "\"shape\":[18446744073709551615,4]", MNISTCU_ERR_ST_JSON},
        {"\"shape\":[3,4]", "\"shape\":[4294967296,4294967296,4]", MNISTCU_ERR_ST_SHAPE},
        {"\"shape\":[3,4]", "\"shape\":[4,3]", MNISTCU_ERR_ST_SHAPE},
        {"\"data_offsets\":[0,48]", "\"data_offsets\":[4,52]", MNISTCU_ERR_ST_OFFSETS},
        {"\"data_offsets\":[0,48]", "\"data_offsets\":[0,48,4]", MNISTCU_ERR_ST_JSON},
        {"\"data_offsets\":[48,60]", "\"data_offsets\":[44,56]", MNISTCU_ERR_ST_OFFSETS},
        {"\"data_offsets\":[48,60]", "\"data_offsets\":[0,12]", MNISTCU_ERR_ST_OFFSETS},
        {"\"format\":\"mnistcu\"", "\"format\":\"other\"", MNISTCU_ERR_ST_METADATA},
        {"\"format_version\":\"1\"", "\"format_version\":\"2\"", MNISTCU_ERR_ST_METADATA},
        {"\"format_version\":\"1\"", "\"format_version\":1", MNISTCU_ERR_ST_METADATA},
        {"\"spec\":\"4 dense3 relu dense2\"", "\"spec\":\"4 dense3 relu dense2 conv\"", MNISTCU_ERR_ST_METADATA},
        {"\"spec\":\"4 dense3 relu dense2\"", "\"spec\":\"4 dense3 relu dense5\"", MNISTCU_ERR_ST_TENSORS},
        {"\"spec\":\"4 dense3 relu dense2\"", "\"spec\":\"4194304 dense64\"", MNISTCU_ERR_ST_TENSORS}, /* no GBs */
        {"\"classes\":\"2\"", "\"classes\":\"2.0\"", MNISTCU_ERR_ST_METADATA},
        {"\"loss_sum\":\"0\"", "\"loss_sum\":\"0.5\"", MNISTCU_ERR_ST_METADATA},
        {"\"spec\"", "\"sp\xED\xA0\x80" "c\"", MNISTCU_ERR_ST_JSON},
        {"\"spec\"", "\"sp\xE0\x80\xAF" "c\"", MNISTCU_ERR_ST_JSON},
        {"\"spec\"", "\"sp\xF4\x90\x80\x80" "c\"", MNISTCU_ERR_ST_JSON},
        {"\"norm_scale\":\"", "\"norm_scale\":\"x", MNISTCU_ERR_ST_METADATA},
        {"\"loss\":\"ce\"", "\"loss\":\"l1\"", MNISTCU_ERR_ST_METADATA},
        {"\"class_names\":\"[", "\"class_names\":\"[\\\"extra\\\",", MNISTCU_ERR_ST_METADATA},
        {"\"0.weight\"", "\"0.weights\"", MNISTCU_ERR_ST_TENSORS},
        {"\"__metadata__\"", "\"__metadata__\":{},\"__metadata__\"", MNISTCU_ERR_ST_JSON},
        {"{\"__metadata__\"", "[\"__metadata__\"", MNISTCU_ERR_ST_JSON},
        {"\"dtype\"", "\"type\"", MNISTCU_ERR_ST_JSON},
        {"\"dtype\"", "\"dtype\":\"F32\",\"dtype\"", MNISTCU_ERR_ST_JSON},
        {"\"spec\"", "\"sp\\u0000c\"", MNISTCU_ERR_ST_JSON},
        {"\"spec\"", "\"sp\\uD800c\"", MNISTCU_ERR_ST_JSON},
        {"\"spec\"", "\"sp\x01" "c\"", MNISTCU_ERR_ST_JSON},
        {"\"spec\"", "\"sp\xC3(c\"", MNISTCU_ERR_ST_JSON},
    };
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_model *m = NULL, *l = NULL;
    static const char *const names[2] = {"no", "yes"};
    unsigned char *file = NULL;
    char *header = NULL;
    size_t size = 0, k;
    uint64_t n = 0;
    int failed = 0, i;
    float x[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    int32_t y[4] = {0, 1, 0, 1};
    mnistcu_dataset *ds = NULL;
    mnistcu_train_desc td;
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = 4;
    TU_REQUIRE(ctx && mnistcu_model_create_spec(ctx, "4 dense3 relu dense2", &m) == MNISTCU_OK &&
                   mnistcu_dataset_create(ctx, x, y, 4, 4, 2, &ds) == MNISTCU_OK &&
                   mnistcu_train(m, ds, &td, NULL) == MNISTCU_OK && /* records a normalisation */
                   mnistcu_model_set_class_names(m, names, 2) == MNISTCU_OK &&
                   mnistcu_model_save(m, "build/test_small.safetensors") == MNISTCU_OK,
               "setup: %s", ctx ? mnistcu_ctx_error(ctx) : "no context");
    file = tu_read_file("build/test_small.safetensors", &size);
    TU_REQUIRE(file && size > 8, "reading back");
    for (i = 7; i >= 0; --i) n = (n << 8) | file[i];
    header = (char *)malloc((size_t)n + 1);
    memcpy(header, file + 8, (size_t)n);
    header[n] = 0;
    TU_REQUIRE(mnistcu_model_load_memory(ctx, file, size, &l) == MNISTCU_OK, "the intact file: %s",
               mnistcu_ctx_error(ctx));
    mnistcu_model_destroy(l);
    l = NULL;
    for (k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        char *h = tf_replace(header, cases[k].from, cases[k].to);
        unsigned char *bad;
        size_t bad_size;
        mnistcu_result r;
        TU_REQUIRE(h, "case %lu: \"%s\" not in the header %s", (unsigned long)k, cases[k].from, header);
        bad = tf_with_header(file, size, h, &bad_size);
        r = mnistcu_model_load_memory(ctx, bad, bad_size, &l);
        free(h);
        free(bad);
        TU_REQUIRE(r == cases[k].want && l == NULL && *mnistcu_ctx_error(ctx),
                   "case %lu (%s -> %s): %s, expected %s (%s)", (unsigned long)k, cases[k].from, cases[k].to,
                   mnistcu_result_name(r), mnistcu_result_name(cases[k].want), mnistcu_ctx_error(ctx));
    }
    { /* the length field: too large, too small, beyond the cap */
        uint64_t lens[3] = {0, 0, (uint64_t)1 << 40};
        lens[0] = n + 1;
        lens[1] = 1;
        for (i = 0; i < 3; ++i) {
            unsigned char *bad = (unsigned char *)malloc(size);
            int b;
            memcpy(bad, file, size);
            for (b = 0; b < 8; ++b) bad[b] = (unsigned char)(lens[i] >> (8 * b));
            if (i == 0) { /* one more byte of header: it now swallows the data's first byte */
                TU_REQUIRE(mnistcu_model_load_memory(ctx, bad, size, &l) != MNISTCU_OK, "length +1 accepted");
            } else {
                TU_REQUIRE(mnistcu_model_load_memory(ctx, bad, size, &l) == MNISTCU_ERR_ST_HEADER_SIZE,
                           "length %llu: %s", (unsigned long long)lens[i], mnistcu_ctx_error(ctx));
            }
            free(bad);
        }
    }
    /* truncation at every byte: never accepted, the right code for where the cut falls */
    for (k = 0; k < size; ++k) {
        mnistcu_result r = mnistcu_model_load_memory(ctx, file, k, &l);
        mnistcu_result want = k < 8 + n ? MNISTCU_ERR_ST_HEADER_SIZE : MNISTCU_ERR_ST_OFFSETS;
        TU_REQUIRE(r == want && l == NULL, "cut at byte %lu of %lu: %s (%s)", (unsigned long)k, (unsigned long)size,
                   mnistcu_result_name(r), mnistcu_ctx_error(ctx));
    }
    /* a byte appended */
    {
        unsigned char *longer = (unsigned char *)malloc(size + 1);
        memcpy(longer, file, size);
        longer[size] = 0;
        TU_REQUIRE(mnistcu_model_load_memory(ctx, longer, size + 1, &l) == MNISTCU_ERR_ST_OFFSETS, "a trailing byte: %s",
                   mnistcu_ctx_error(ctx));
        free(longer);
    }
done:
    free(file);
    free(header);
    mnistcu_ctx_destroy(ctx);
    remove("build/test_small.safetensors");
    TU_END();
}

/* Saving is atomic: a failed save leaves no file and no temporary; a save
   over an existing file replaces it whole. */
TEST files_save_is_atomic(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_model *a = NULL, *b = NULL, *l = NULL;
    float wa[15], wl[15];
    int failed = 0;
    TU_REQUIRE(ctx && mnistcu_model_create_spec(ctx, "4 dense3", &a) == MNISTCU_OK &&
                   mnistcu_model_create_spec(ctx, "4 dense3", &b) == MNISTCU_OK, "setup");
    TU_REQUIRE(mnistcu_model_save(a, "build/no-such-folder/x.safetensors") == MNISTCU_ERR_IO &&
                   !tf_exists("build/no-such-folder/x.safetensors.tmp"), "saving into a missing folder");
    TU_REQUIRE(mnistcu_model_save(b, "build/test_atomic.safetensors") == MNISTCU_OK &&
                   mnistcu_model_save(a, "build/test_atomic.safetensors") == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(mnistcu_model_load(ctx, "build/test_atomic.safetensors", &l) == MNISTCU_OK &&
                   mnistcu_model_get_params(a, wa, 15) == MNISTCU_OK && mnistcu_model_get_params(l, wl, 15) == MNISTCU_OK &&
                   memcmp(wa, wl, sizeof wa) == 0, "the second save did not replace the first");
    TU_REQUIRE(!tf_exists("build/test_atomic.safetensors.tmp"), "temporary file left");
    TU_REQUIRE(mnistcu_model_load(ctx, "build/missing.safetensors", &l) == MNISTCU_ERR_NOT_FOUND, "a missing file");
done:
    remove("build/test_atomic.safetensors");
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* ---- checkpoints: bit-exact resume ----------------------------------------- */

/* n images of H x W bytes in an in-memory IDX file: random strokes, labels 0..C-1. */
static mnistcu_dataset *tf_images(mnistcu_ctx *ctx, int n, int H, int W, int C, uint64_t seed)
{
    size_t isz = 16 + (size_t)n * H * W, k;
    unsigned char *img = (unsigned char *)calloc(isz, 1), *lab = (unsigned char *)calloc(8 + (size_t)n, 1);
    mnistcu_dataset_desc d;
    mnistcu_dataset *ds = NULL;
    tu_rng rng = tu_rng_make(seed);
    int i;
    img[2] = 8; img[3] = 3;
    img[4] = (unsigned char)(n >> 24); img[5] = (unsigned char)(n >> 16); img[6] = (unsigned char)(n >> 8); img[7] = (unsigned char)n;
    img[11] = (unsigned char)H; img[15] = (unsigned char)W;
    lab[2] = 8; lab[3] = 1;
    for (k = 4; k < 8; ++k) lab[k] = img[k];
    for (i = 0; i < n; ++i) {
        int c = i % C, r;
        lab[8 + i] = (unsigned char)c;
        for (r = 0; r < H; ++r) { /* a bar whose position says the class, and noise */
            int col;
            for (col = 0; col < W; ++col) {
                unsigned char v = (unsigned char)(tu_next(&rng) % 60);
                if (col == 2 + c * (W - 4) / C || r == 2 + c) v = (unsigned char)(200 + tu_next(&rng) % 55);
                img[16 + ((size_t)i * H + r) * W + col] = v;
            }
        }
    }
    memset(&d, 0, sizeof d);
    d.images_data = img;
    d.images_size = isz;
    d.labels_data = lab;
    d.labels_size = 8 + (size_t)n;
    d.num_classes = C;
    if (mnistcu_dataset_load(ctx, &d, &ds) != MNISTCU_OK) ds = NULL;
    free(img);
    free(lab);
    return ds;
}

typedef struct tf_stop { int epoch; size_t step; } tf_stop;

static int tf_stop_at(void *user, const mnistcu_progress *p)
{
    const tf_stop *s = (const tf_stop *)user;
    return p->epoch == s->epoch && p->step == s->step;
}

/* Everything that carries state: batch norm, dropout, Adam with amsgrad, a
   per-step cosine schedule after a warm-up, augmentation, clipping, a
   validation set with early stopping's best copies, a last partial batch. */
static void tf_resume_desc(mnistcu_train_desc *td, const mnistcu_dataset *val, const char *ck)
{
    memset(td, 0, sizeof *td);
    td->epochs = 3;
    td->batch_size = 16; /* 150 samples: 10 steps, the last of 6 */
    td->optim.kind = MNISTCU_OPTIM_ADAM;
    td->optim.learning_rate = 0.01f;
    td->optim.amsgrad = 1;
    td->optim.clip_norm = 5.0f;
    td->schedule.kind = MNISTCU_SCHEDULE_COSINE;
    td->schedule.per_step = 1;
    td->schedule.warmup = 4;
    td->augment.rotate = 10.0f;
    td->augment.translate = 1.0f;
    td->augment.elastic_alpha = 8.0f;
    td->augment.elastic_sigma = 2.0f;
    td->validation = val;
    td->early_stop = 5;
    td->progress_every = 3;
    td->checkpoint_path = ck;
    td->checkpoint_every_steps = 4;
}

#define TF_SPEC "1x12x12 conv3x3x4:p=1 batchnorm relu maxpool2 flatten dropout0.25 dense16 relu dense5"

/* Trains to the end, or stops at (epoch, step) and resumes in a new context
   from the checkpoint written there: the weights, running statistics and
   the last epoch's loss are the same bits, on the context's device. Stops
   inside an epoch and at an epoch's end. */
TEST files_resume_is_bit_exact(void)
{
    static const tf_stop stops[3] = {{2, 4}, {1, 10}, {3, 8}};
    mnistcu_ctx *ctx = NULL, *c2 = NULL;
    mnistcu_dataset *tr = NULL, *val = NULL, *tr2 = NULL, *val2 = NULL;
    mnistcu_model *a = NULL, *b = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result ra, rb;
    mnistcu_model_info info;
    float *pa = NULL, *pb = NULL;
    size_t np = 0;
    int failed = 0, k, i;
    ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    TU_REQUIRE(ctx && (tr = tf_images(ctx, 150, 12, 12, 5, 1)) && (val = tf_images(ctx, 40, 12, 12, 5, 2)) &&
                   mnistcu_model_create_spec(ctx, TF_SPEC, &a) == MNISTCU_OK, "setup: %s",
               ctx ? mnistcu_ctx_error(ctx) : "no context");
    tf_resume_desc(&td, val, "build/test_ck_full.safetensors");
    TU_REQUIRE(mnistcu_train(a, tr, &td, &ra) == MNISTCU_OK, "the whole run: %s", mnistcu_ctx_error(ctx));
    mnistcu_model_info_get(a, &info);
    np = info.num_params + info.num_buffers;
    pa = (float *)malloc(np * sizeof(float));
    pb = (float *)malloc(np * sizeof(float));
    TU_REQUIRE(mnistcu_model_get_params(a, pa, info.num_params) == MNISTCU_OK, "params");
    for (i = 0; i < mnistcu_model_num_tensors(a); ++i) { /* the running statistics after the parameters */
        mnistcu_tensor_info ti;
        static size_t at;
        mnistcu_model_tensor_info(a, i, &ti);
        if (i == 0) at = info.num_params;
        if (!ti.is_buffer || ti.is_int) continue;
        TU_REQUIRE(mnistcu_model_get_tensor(a, ti.name, pa + at, ti.count) == MNISTCU_OK, "buffers");
        at += ti.count;
    }
    for (k = 0; k < 3; ++k) {
        tf_stop s = stops[k];
        mnistcu_model *stopped = NULL;
        mnistcu_train_result rs;
        size_t at = info.num_params;
        /* the interrupted run, in a context of its own with the same seed */
        c2 = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
        TU_REQUIRE(c2 && (tr2 = tf_images(c2, 150, 12, 12, 5, 1)) && (val2 = tf_images(c2, 40, 12, 12, 5, 2)) &&
                       mnistcu_model_create_spec(c2, TF_SPEC, &stopped) == MNISTCU_OK, "setup 2");
        tf_resume_desc(&td, val2, "build/test_ck.safetensors");
        td.progress = tf_stop_at;
        td.progress_user = &s;
        TU_REQUIRE(mnistcu_train(stopped, tr2, &td, &rs) == MNISTCU_OK, "the stopped run: %s", mnistcu_ctx_error(c2));
        mnistcu_ctx_destroy(c2);
        c2 = NULL;
        /* resumed in a fresh context: a model made from the spec (other initial weights), the checkpoint does the rest */
        c2 = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
        TU_REQUIRE(c2 && (tr2 = tf_images(c2, 150, 12, 12, 5, 1)) && (val2 = tf_images(c2, 40, 12, 12, 5, 2)) &&
                       mnistcu_model_create_spec(c2, TF_SPEC, &b) == MNISTCU_OK, "setup 3");
        tf_resume_desc(&td, val2, "build/test_ck.safetensors");
        td.resume_from = "build/test_ck.safetensors";
        TU_REQUIRE(mnistcu_train(b, tr2, &td, &rb) == MNISTCU_OK, "resumed at epoch %d step %lu: %s", s.epoch,
                   (unsigned long)s.step, mnistcu_ctx_error(c2));
        TU_REQUIRE(mnistcu_model_get_params(b, pb, info.num_params) == MNISTCU_OK, "params");
        for (i = 0; i < mnistcu_model_num_tensors(b); ++i) {
            mnistcu_tensor_info ti;
            mnistcu_model_tensor_info(b, i, &ti);
            if (!ti.is_buffer || ti.is_int) continue;
            TU_REQUIRE(mnistcu_model_get_tensor(b, ti.name, pb + at, ti.count) == MNISTCU_OK, "buffers");
            at += ti.count;
        }
        TU_REQUIRE(memcmp(pa, pb, np * sizeof(float)) == 0, "stopped at epoch %d step %lu: the resumed weights differ",
                   s.epoch, (unsigned long)s.step);
        TU_REQUIRE(memcmp(&ra.train_loss, &rb.train_loss, sizeof ra.train_loss) == 0 && ra.steps == rb.steps &&
                       ra.best_epoch == rb.best_epoch && memcmp(&ra.val_loss, &rb.val_loss, sizeof ra.val_loss) == 0,
                   "stopped at epoch %d step %lu: loss %.17g vs %.17g, steps %lu vs %lu, best %d vs %d", s.epoch,
                   (unsigned long)s.step, ra.train_loss, rb.train_loss, (unsigned long)ra.steps, (unsigned long)rb.steps,
                   ra.best_epoch, rb.best_epoch);
        mnistcu_ctx_destroy(c2);
        c2 = NULL;
        b = NULL;
    }
done:
    free(pa);
    free(pb);
    mnistcu_ctx_destroy(ctx);
    mnistcu_ctx_destroy(c2);
    remove("build/test_ck.safetensors");
    remove("build/test_ck_full.safetensors");
    TU_END();
}

/* A resume that would not continue the same training is refused, naming what
   differs; kept and best checkpoints are where they should be. */
TEST files_resume_refuses_other_settings(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1), *other = NULL;
    mnistcu_dataset *tr = NULL, *val = NULL, *small = NULL;
    mnistcu_model *m = NULL, *b = NULL;
    mnistcu_train_desc td;
    mnistcu_checkpoint_info ci;
    int failed = 0;
    TU_REQUIRE(ctx && (tr = tf_images(ctx, 150, 12, 12, 5, 1)) && (val = tf_images(ctx, 40, 12, 12, 5, 2)) &&
                   (small = tf_images(ctx, 100, 12, 12, 5, 3)) && mnistcu_model_create_spec(ctx, TF_SPEC, &m) == MNISTCU_OK,
               "setup");
    tf_resume_desc(&td, val, "build/test_ck2.safetensors");
    td.epochs = 2;
    td.checkpoint_keep = 2;
    td.checkpoint_best = 1;
    td.checkpoint_note = "dataset=synthetic";
    TU_REQUIRE(mnistcu_train(m, tr, &td, NULL) == MNISTCU_OK, "train: %s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(tf_exists("build/test_ck2-e0002-s000010.safetensors") && tf_exists("build/test_ck2-e0002-s000008.safetensors") &&
                   !tf_exists("build/test_ck2-e0002-s000004.safetensors") && tf_exists("build/test_ck2-best.safetensors"),
               "kept checkpoints: the last two and the best");
    TU_REQUIRE(mnistcu_checkpoint_info_get(ctx, "build/test_ck2.safetensors", &ci) == MNISTCU_OK && ci.epoch == 2 &&
                   ci.step == 10 && ci.steps == 10 && ci.total_steps == 20 && ci.seed == 1234 &&
                   ci.train.optim.kind == MNISTCU_OPTIM_ADAM && ci.train.optim.learning_rate == 0.01f &&
                   ci.train.batch_size == 16 && !strcmp(ci.note, "dataset=synthetic") && !strcmp(ci.spec, TF_SPEC),
               "checkpoint info: %s", mnistcu_ctx_error(ctx));
    TU_REQUIRE(mnistcu_model_create_spec(ctx, TF_SPEC, &b) == MNISTCU_OK, "model");
    td.resume_from = "build/test_ck2.safetensors";
    td.checkpoint_path = "build/test_ck3.safetensors";
    td.checkpoint_keep = 0;
    td.checkpoint_best = 0;
    td.optim.learning_rate = 0.02f;
    TU_REQUIRE(mnistcu_train(b, tr, &td, NULL) == MNISTCU_ERR_INVALID_ARGUMENT && strstr(mnistcu_ctx_error(ctx), "optimizer"),
               "another learning rate accepted: %s", mnistcu_ctx_error(ctx));
    td.optim.learning_rate = 0.01f;
    td.batch_size = 32;
    TU_REQUIRE(mnistcu_train(b, tr, &td, NULL) == MNISTCU_ERR_INVALID_ARGUMENT, "another batch size accepted");
    td.batch_size = 16;
    TU_REQUIRE(mnistcu_train(b, small, &td, NULL) == MNISTCU_ERR_INVALID_ARGUMENT, "another dataset size accepted");
    td.epochs = 3; /* more epochs: allowed */
    TU_REQUIRE(mnistcu_train(b, tr, &td, NULL) == MNISTCU_OK, "a resume for more epochs: %s", mnistcu_ctx_error(ctx));
    other = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_model_destroy(b);
    b = NULL;
    {
        mnistcu_ctx_desc cd;
        mnistcu_ctx_destroy(other);
        other = NULL;
        memset(&cd, 0, sizeof cd);
        cd.device = MNISTCU_DEVICE_CPU;
        cd.log_level = MNISTCU_LOG_SILENT;
        cd.seed = 99;
        TU_REQUIRE(mnistcu_ctx_create(&other, &cd) == MNISTCU_OK, "context");
    }
    {
        mnistcu_dataset *t2 = tf_images(other, 150, 12, 12, 5, 1);
        TU_REQUIRE(t2 && mnistcu_model_create_spec(other, TF_SPEC, &b) == MNISTCU_OK, "model");
        td.validation = NULL;
        td.early_stop = 0;
        td.schedule.kind = MNISTCU_SCHEDULE_COSINE;
        TU_REQUIRE(mnistcu_train(b, t2, &td, NULL) == MNISTCU_ERR_INVALID_ARGUMENT, "another seed (or early stop) accepted");
    }
    td.resume_from = "build/test_small_missing.safetensors";
    TU_REQUIRE(mnistcu_train(m, tr, &td, NULL) == MNISTCU_ERR_NOT_FOUND, "a missing checkpoint");
done:
    mnistcu_ctx_destroy(ctx);
    mnistcu_ctx_destroy(other);
    remove("build/test_ck2.safetensors");
    remove("build/test_ck3.safetensors");
    remove("build/test_ck2-best.safetensors");
    remove("build/test_ck2-e0002-s000010.safetensors");
    remove("build/test_ck2-e0002-s000008.safetensors");
    TU_END();
}

/* Plain SGD (no optimizer state: the CLI's default) resumes to the same bits;
   a model trained with momentum and then with Adam (a state twice as large)
   keeps its divergence copies the right size. */
TEST files_resume_plain_sgd_and_optimizer_switch(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_AUTO, 0), *c2 = NULL;
    mnistcu_dataset *tr = NULL, *tr2 = NULL;
    mnistcu_model *a = NULL, *b = NULL;
    mnistcu_train_desc td;
    float pa[500], pb[500];
    size_t np;
    int failed = 0;
    TU_REQUIRE(ctx && (tr = tf_images(ctx, 96, 12, 12, 5, 4)) && mnistcu_model_create_spec(ctx, "144-3-5", &a) == MNISTCU_OK,
               "setup");
    np = mnistcu_model_num_params(a);
    memset(&td, 0, sizeof td);
    td.epochs = 3;
    td.batch_size = 32;
    td.checkpoint_path = "build/test_ck_sgd.safetensors";
    td.checkpoint_every = 2;
    TU_REQUIRE(mnistcu_train(a, tr, &td, NULL) == MNISTCU_OK, "train: %s", mnistcu_ctx_error(ctx));
    c2 = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    td.epochs = 2; /* the checkpoint of epoch 2, written at that run's end */
    TU_REQUIRE(c2 && (tr2 = tf_images(c2, 96, 12, 12, 5, 4)) && mnistcu_model_create_spec(c2, "144-3-5", &b) == MNISTCU_OK &&
                   mnistcu_train(b, tr2, &td, NULL) == MNISTCU_OK, "the shorter run: %s", mnistcu_ctx_error(c2));
    mnistcu_ctx_destroy(c2);
    c2 = tu_ctx(MNISTCU_DEVICE_AUTO, 0);
    td.epochs = 3;
    td.resume_from = "build/test_ck_sgd.safetensors";
    td.checkpoint_path = "build/test_ck_sgd2.safetensors";
    TU_REQUIRE(c2 && (tr2 = tf_images(c2, 96, 12, 12, 5, 4)) && mnistcu_model_create_spec(c2, "144-3-5", &b) == MNISTCU_OK &&
                   mnistcu_train(b, tr2, &td, NULL) == MNISTCU_OK, "resume: %s", mnistcu_ctx_error(c2));
    TU_REQUIRE(mnistcu_model_get_params(a, pa, np) == MNISTCU_OK && mnistcu_model_get_params(b, pb, np) == MNISTCU_OK &&
                   memcmp(pa, pb, np * sizeof(float)) == 0, "plain SGD: the resumed weights differ");
    memset(&td, 0, sizeof td); /* momentum, then Adam, checking every step */
    td.epochs = 1;
    td.batch_size = 16;
    td.optim.momentum = 0.9f;
    td.progress_every = 1;
    td.progress = tf_stop_at; /* never stops: epoch 0 does not exist */
    {
        tf_stop never = {0, 0};
        td.progress_user = &never;
        TU_REQUIRE(mnistcu_train(a, tr, &td, NULL) == MNISTCU_OK, "momentum: %s", mnistcu_ctx_error(ctx));
        td.optim.momentum = 0.0f;
        td.optim.kind = MNISTCU_OPTIM_ADAM;
        td.optim.learning_rate = 0.001f;
        TU_REQUIRE(mnistcu_train(a, tr, &td, NULL) == MNISTCU_OK, "Adam after momentum: %s", mnistcu_ctx_error(ctx));
    }
done:
    mnistcu_ctx_destroy(ctx);
    mnistcu_ctx_destroy(c2);
    remove("build/test_ck_sgd.safetensors");
    remove("build/test_ck_sgd2.safetensors");
    TU_END();
}

SUITE(files_suite)
{
    RUN_TEST(files_round_trip_every_kind);
    RUN_TEST(files_corrupt_header_fields);
    RUN_TEST(files_save_is_atomic);
    RUN_TEST(files_resume_is_bit_exact);
    RUN_TEST(files_resume_refuses_other_settings);
    RUN_TEST(files_resume_plain_sgd_and_optimizer_switch);
}
