/* bench/fused_phases.cu - where the fused MLP kernel's time goes, phase by phase; and the fused
   LeNet-5 kernel's (P4, mnistcu_train_desc.fused_cnn).

   nvcc -O3 -arch=sm_90 -o build/fused_phases bench/fused_phases.cu && build/fused_phases [data/mnist [P4]]

   Builds the header with MNISTCU_FUSED_PROFILE, so that block 0 of the fused kernel sums the clock
   cycles its first thread spends in each phase; trains P2 (784-128-10, batch 64, one epoch after a
   warm-up epoch) and P1 (784-1024-10, batch 32, 10,000 images, file order), and prints microseconds
   per step for each phase at the multiprocessor clock. Phases after a __syncthreads or a grid barrier
   are the block's; the barrier rows include the wait for the slowest block. */
#define MNISTCU_IMPLEMENTATION
#define MNISTCU_FUSED_PROFILE
#include "../mnistcu.h"
#include <stdio.h>
#include <string.h>

#define NPHASES 14 /* the kernel's MNISTCU__FPROF(0) .. (13) */
static const char *const names[NPHASES] = {
    "own params, first batch (chunk)", "batch x into shared memory", "phase 1: h = act(x W1^T + b1)",
    "grid barrier 1", "next batch's loads; stage h, W2", "phase 2: logits", "grid barrier 2", "loss rows",
    "statistics (block 0)", "dh; W2 gradient slice sums", "W2, b2, b1 updates", "dW1 tiles", "W1 update",
    "store own params (chunk)"};

#define LPHASES 22 /* the LeNet-5 kernel's MNISTCU__LPROF(0) .. (21); (18) marks its start */
static const char *const lnames[LPHASES] = {
    "A: weights, the sample into smem", "A: conv1 + relu + pool", "A: conv2 + relu + pool; F1, F2 in",
    "A: dense120", "A: dense84", "A: dense10", "A: the loss row", "A: dh2", "A: dh1",
    "A: conv2's pooled gradient, 4 parts", "A: their sum (G2)", "A: routed into conv2's map",
    "A: conv2's input gradient, 4 parts", "A: G1; conv2's weight gradient", "A: conv1's weight gradient",
    "grid barrier A", "B: stats; next sample's copies", "grid barrier B", "", "B: rows staged (with param loads)",
    "B: sums", "B: steps stored"};
static const int lorder[LPHASES - 1] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 19, 20, 21, 16, 17};

/* A GPU context (the own kernels) and the first limit training images of dir (0: all), x/255. */
static int open_train(const char *dir, size_t limit, mnistcu_ctx **ctx, mnistcu_dataset **train)
{
    mnistcu_ctx_desc cd;
    mnistcu_dataset_desc dd;
    memset(&cd, 0, sizeof cd);
    cd.device = MNISTCU_DEVICE_CUDA;
    cd.gemm = MNISTCU_GEMM_OWN;
    cd.log_level = MNISTCU_LOG_SILENT;
    if (mnistcu_ctx_create(ctx, &cd)) return 1;
    memset(&dd, 0, sizeof dd);
    dd.dir = dir;
    dd.split = MNISTCU_SPLIT_TRAIN;
    dd.norm = MNISTCU_NORM_UNIT;
    dd.limit = limit;
    if (mnistcu_dataset_load(*ctx, &dd, train)) {
        fprintf(stderr, "%s\n", mnistcu_ctx_error(*ctx));
        return 1;
    }
    return 0;
}

/* P4 in the fused LeNet-5 kernel: one epoch after a warm-up epoch */
static int run_lenet(const char *dir)
{
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset *train = NULL;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result tr;
    long long prof[32], zero[32];
    int khz = 0, i;
    if (open_train(dir, 0, &ctx, &train)) return 1;
    if (mnistcu_model_create_spec(ctx, "lenet5", &m)) {
        fprintf(stderr, "%s\n", mnistcu_ctx_error(ctx));
        return 1;
    }
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = 64;
    td.optim.learning_rate = 0.02f;
    td.optim.momentum = 0.9f;
    td.fused_cnn = 1;
    if (mnistcu_train(m, train, &td, &tr)) return 1; /* warm-up */
    memset(zero, 0, sizeof zero);
    cudaMemcpyToSymbol(mnistcu__lenet_prof, zero, sizeof zero);
    if (mnistcu_train(m, train, &td, &tr)) return 1;
    cudaMemcpyFromSymbol(prof, mnistcu__lenet_prof, sizeof prof);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    printf("P4: %lu steps (%lu in the fused LeNet-5 kernel), %.3f ms, loss %.4f; clock %.0f MHz; us per step:\n",
           (unsigned long)tr.steps, (unsigned long)tr.fused_cnn_steps, 1e3 * tr.seconds, tr.train_loss, khz / 1e3);
    for (i = 0; i < LPHASES - 1; ++i)
        printf("  %-36s %8.3f\n", lnames[lorder[i]], (double)prof[lorder[i]] / (khz * 1e-3) / (double)tr.steps);
    mnistcu_ctx_destroy(ctx);
    return 0;
}

static int run(const char *dir, const char *cfg, const char *spec, int batch, float lr, size_t limit, int no_shuffle)
{
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset *train = NULL;
    mnistcu_model *m = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result tr;
    long long prof[16], zero[16];
    int khz = 0, i;
    size_t steps;
    if (open_train(dir, limit, &ctx, &train)) return 1;
    if (mnistcu_model_create_mlp(ctx, spec, &m)) {
        fprintf(stderr, "%s\n", mnistcu_ctx_error(ctx));
        return 1;
    }
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = batch;
    td.optim.learning_rate = lr;
    td.no_shuffle = no_shuffle;
    if (mnistcu_train(m, train, &td, &tr)) return 1; /* warm-up */
    memset(zero, 0, sizeof zero);
    cudaMemcpyToSymbol(mnistcu__fused_prof, zero, sizeof zero);
    if (mnistcu_train(m, train, &td, &tr)) return 1;
    cudaMemcpyFromSymbol(prof, mnistcu__fused_prof, sizeof prof);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    steps = tr.steps;
    printf("%s: %lu steps (%lu fused), %.3f ms, loss %.4f; clock %.0f MHz; us per step:\n", cfg,
           (unsigned long)steps, (unsigned long)tr.fused_steps, 1e3 * tr.seconds, tr.train_loss, khz / 1e3);
    for (i = 0; i < NPHASES; ++i)
        printf("  %-32s %8.3f\n", names[i], (double)prof[i] / (khz * 1e-3) / (double)steps);
    mnistcu_ctx_destroy(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "data/mnist";
    if (argc > 2 && !strcmp(argv[2], "P4")) return run_lenet(dir);
    return run(dir, "P2", "784-128-10", 64, 0.1f, 0, 0) || run(dir, "P1", "784-1024-10", 32, 0.01f, 10000, 1) ||
           run_lenet(dir);
}
