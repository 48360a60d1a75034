/* bench/fused_parity.cu - which shapes the fused MLP kernel and the step by step path train to
   different bits.

   nvcc -O2 -arch=sm_90 -o build/fused_parity bench/fused_parity.cu && build/fused_parity

   The fused MLP kernel (>>cuda_fused) is meant to give the step by step path's weights bit for bit,
   and the GPU tests check that on shapes of at most 10 classes. With 256 classes (256 inputs, 16
   units, batch 8) the weights were measured to differ in the last bits, so the kernel takes at most
   MNISTCU__FUSED_MAX_C classes. This program lifts that limit and trains each shape below twice
   from the same seed, fused and with no_fused, on random inputs (a ReLU hidden layer, SGD, 3 batches
   less 3 samples), and prints how many of the parameters and last gradients differ. */
#define MNISTCU__FUSED_MAX_C 4096
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* params then last gradients (2 * *np floats, malloc'ed), or NULL */
static float *train(int D, int H, int C, int B, int chunk, int no_fused, size_t *np, size_t *fused)
{
    const int n = 3 * B - 3;
    mnistcu_ctx_desc cd;
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset *ds = NULL;
    mnistcu_model *m = NULL;
    mnistcu_model_desc md;
    mnistcu_train_desc td;
    mnistcu_train_result tr;
    float *x = (float *)malloc(sizeof(float) * (size_t)n * (size_t)D), *p = NULL;
    int32_t *y = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    unsigned long long s = 12345;
    int i, l = 0;
    for (i = 0; i < n * D; ++i) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)(s >> 40) / 16777216.0f;
    }
    for (i = 0; i < n; ++i) y[i] = i % C;
    memset(&cd, 0, sizeof cd);
    cd.device = MNISTCU_DEVICE_CUDA;
    cd.gemm = MNISTCU_GEMM_OWN;
    cd.log_level = MNISTCU_LOG_SILENT;
    cd.seed = 7;
    memset(&md, 0, sizeof md);
    md.input_c = 1;
    md.input_h = 1;
    md.input_w = D;
    md.layers[l].kind = MNISTCU_LAYER_DENSE;
    md.layers[l++].units = H;
    md.layers[l++].kind = MNISTCU_LAYER_RELU;
    md.layers[l].kind = MNISTCU_LAYER_DENSE;
    md.layers[l++].units = C;
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = (size_t)B;
    td.optim.learning_rate = 0.1f;
    td.no_fused = no_fused;
    td.progress_every = (size_t)chunk;
    if (mnistcu_ctx_create(&ctx, &cd) == MNISTCU_OK &&
        mnistcu_dataset_create(ctx, x, y, (size_t)n, (size_t)D, C, &ds) == MNISTCU_OK &&
        mnistcu_model_create(ctx, &md, &m) == MNISTCU_OK && mnistcu_train(m, ds, &td, &tr) == MNISTCU_OK) {
        *np = mnistcu_model_num_params(m);
        *fused = tr.fused_steps;
        p = (float *)malloc(2 * *np * sizeof(float));
        if (p && (mnistcu_model_get_params(m, p, *np) || mnistcu_model_get_grads(m, p + *np, *np))) {
            free(p);
            p = NULL;
        }
    } else if (ctx) {
        fprintf(stderr, "%s\n", mnistcu_ctx_error(ctx));
    }
    mnistcu_ctx_destroy(ctx);
    free(x);
    free(y);
    return p;
}

int main(void)
{
    static const int shapes[][5] = { /* inputs, units, classes, batch, steps a chunk (0: the epoch) */
        {256, 16, 256, 8, 0}, {256, 16, 64, 8, 0}, {256, 16, 33, 8, 0}, {256, 16, 32, 8, 0}, {256, 16, 16, 8, 0},
        {256, 16, 10, 8, 0},  {64, 64, 64, 32, 0}, {64, 64, 33, 32, 0}, {64, 64, 32, 32, 0}, {64, 64, 20, 32, 0},
        {40, 40, 48, 16, 0},  {40, 40, 48, 16, 1}, {784, 128, 64, 64, 0}};
    int k, bad = 0;
    for (k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); ++k) {
        const int *q = shapes[k];
        size_t na = 0, nb = 0, fa = 0, fb = 0, i, diff = 0;
        float *a = train(q[0], q[1], q[2], q[3], q[4], 0, &na, &fa);
        float *b = train(q[0], q[1], q[2], q[3], q[4], 1, &nb, &fb);
        if (!a || !b || na != nb) {
            printf("%d-%d-%d batch %d: failed\n", q[0], q[1], q[2], q[3]);
            bad = 1;
        } else {
            for (i = 0; i < 2 * na; ++i) diff += memcmp(a + i, b + i, sizeof(float)) != 0;
            printf("%4d-%3d-%3d batch %2d, chunk %d: %lu steps fused, %lu of %lu floats differ\n", q[0], q[1], q[2],
                   q[3], q[4], (unsigned long)fa, (unsigned long)diff, (unsigned long)(2 * na));
        }
        free(a);
        free(b);
    }
    return bad;
}
