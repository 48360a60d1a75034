/* bench/bench.c - time mnistcu on the benchmark configurations of BENCHMARKS.md.

   CPU:  cc -std=c99 -O3 -march=native -fopenmp -o build/bench_cpu bench/bench.c -lm
   GPU:  nvcc -x cu -O3 -arch=sm_90 -DMNISTCU_CUBLAS -o build/bench_cuda bench/bench.c -lcublas

   Usage: bench CONFIG [--device cpu|cuda] [--gemm own|cublas] [--epochs N] [--data DIR]
                       [--threads N] [--seed S] [--limit N]
     CONFIG  P1  first 10,000 train images in file order, 784-1024-10, batch 32, SGD lr 0.01,
                 10 epochs: the total training time of the 10 epochs
             P2  MNIST 60k shuffled, 784-128-10, batch 64, SGD lr 0.1: time per epoch
             P3  MNIST 60k shuffled, 784-1024-1024-10, batch 512, SGD lr 0.1: time per epoch
             P7  P2 on the CPU
     --limit N  train on the first N images only (quick tests; not a benchmark configuration)

   Protocol: inputs x/255 (MNISTCU_NORM_UNIT) as on the PyTorch side. One warm-up epoch that is not
   timed (P1: a whole separate 1-epoch run on its own model, since P1's model must start fresh), then
   every epoch is one call of mnistcu_train with epochs=1 on the same model (weights and optimizer
   state persist across calls), timed by the wall clock around the call: the call returns only after
   the epoch's statistics are read back from the device, so its GPU work is complete. Reported: the
   median and every epoch (P2/P3/P7), the total (P1), then the test accuracy, evaluated after timing,
   and the last epoch's mean training loss. Human-readable lines go to stderr, one JSON line to stdout. */
#define _POSIX_C_SOURCE 200809L
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

static double median(const double *v, int n)
{
    double *s = (double *)malloc((size_t)n * sizeof(double)), m;
    if (!s || n <= 0) { free(s); return -1.0; }
    memcpy(s, v, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench P1|P2|P3|P7 [--device cpu|cuda] [--gemm own|cublas] [--epochs N] [--data DIR]\n"
                    "                         [--threads N] [--seed S] [--limit N]\n");
}

static int fail(mnistcu_ctx *ctx, const char *what)
{
    fprintf(stderr, "bench: FAILED: %s: %s\n", what, ctx ? mnistcu_ctx_error(ctx) : "no context");
    mnistcu_ctx_destroy(ctx);
    return 1;
}

int main(int argc, char **argv)
{
    const char *config, *data = "data/mnist", *device_arg = NULL, *gemm_arg = NULL, *layers;
    const char *dev_json, *gemm_json;
    int epochs = -1, threads = 0, batch, no_shuffle = 0, is_p1 = 0, i, e;
    unsigned long long seed = 0;
    size_t limit = 0;
    float lr;
    mnistcu_ctx_desc cd;
    mnistcu_ctx_desc resolved;
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset_desc dd;
    mnistcu_dataset *train = NULL, *test = NULL;
    mnistcu_model *net = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result tr;
    mnistcu_metrics met;
    mnistcu_dataset_info info;
    double *ms, t0, t_all0, total_s = 0.0, med;

    if (argc < 2 || argv[1][0] == '-') { usage(); return 2; }
    config = argv[1];
    for (i = 2; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench: %s needs a value\n", a); usage(); return 2; }
        if (!strcmp(a, "--device")) device_arg = v;
        else if (!strcmp(a, "--gemm")) gemm_arg = v;
        else if (!strcmp(a, "--epochs")) epochs = atoi(v);
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--limit")) limit = (size_t)strtoull(v, NULL, 10);
        else { fprintf(stderr, "bench: unknown option %s\n", a); usage(); return 2; }
        ++i;
    }

    if (!strcmp(config, "P1")) {
        layers = "784-1024-10"; batch = 32; lr = 0.01f; no_shuffle = 1; is_p1 = 1;
        if (!limit) limit = 10000;
        if (epochs < 0) epochs = 10;
    } else if (!strcmp(config, "P2") || !strcmp(config, "P7")) {
        layers = "784-128-10"; batch = 64; lr = 0.1f;
        if (epochs < 0) epochs = 5;
    } else if (!strcmp(config, "P3")) {
        layers = "784-1024-1024-10"; batch = 512; lr = 0.1f;
        if (epochs < 0) epochs = 5;
    } else {
        fprintf(stderr, "bench: unknown config %s (P1, P2, P3, P7; P4-P6 need convolutions)\n", config);
        return 2;
    }
    if (epochs < 1) { fprintf(stderr, "bench: --epochs must be >= 1\n"); return 2; }
    if (!device_arg) device_arg = !strcmp(config, "P7") ? "cpu" : "cuda";
    if (!strcmp(config, "P7") && strcmp(device_arg, "cpu")) {
        fprintf(stderr, "bench: P7 is the CPU configuration (use P2 for the GPU)\n");
        return 2;
    }

    memset(&cd, 0, sizeof cd);
    cd.seed = (uint64_t)seed;
    cd.threads = threads;
    cd.log_level = MNISTCU_LOG_WARN;
    if (!strcmp(device_arg, "cpu")) cd.device = MNISTCU_DEVICE_CPU;
    else if (!strcmp(device_arg, "cuda")) cd.device = MNISTCU_DEVICE_CUDA;
    else { fprintf(stderr, "bench: --device must be cpu or cuda\n"); return 2; }
    if (!gemm_arg) cd.gemm = MNISTCU_GEMM_DEFAULT;
    else if (!strcmp(gemm_arg, "own")) cd.gemm = MNISTCU_GEMM_OWN;
    else if (!strcmp(gemm_arg, "cublas")) {
#ifndef MNISTCU_CUBLAS
        fprintf(stderr, "bench: --gemm cublas needs a build with nvcc -DMNISTCU_CUBLAS ... -lcublas\n");
        return 2;
#else
        cd.gemm = MNISTCU_GEMM_CUBLAS;
#endif
    } else { fprintf(stderr, "bench: --gemm must be own or cublas\n"); return 2; }
    if (cd.device == MNISTCU_DEVICE_CPU && gemm_arg) {
        fprintf(stderr, "bench: --gemm applies to --device cuda only\n");
        return 2;
    }

    if (mnistcu_ctx_create(&ctx, &cd)) return fail(ctx, "creating the context");
    if (mnistcu_ctx_device(ctx) != cd.device) {
        fprintf(stderr, "bench: FAILED: asked for %s, got %s\n", device_arg, mnistcu_ctx_device_name(ctx));
        mnistcu_ctx_destroy(ctx);
        return 1;
    }
    mnistcu_ctx_resolved_desc(ctx, &resolved);
    if (cd.device == MNISTCU_DEVICE_CPU) {
        dev_json = "cpu"; gemm_json = "cpu";
    } else {
        dev_json = "cuda";
        gemm_json = resolved.gemm == MNISTCU_GEMM_CUBLAS ? "cublas" : "own";
        if (gemm_arg && strcmp(gemm_arg, gemm_json)) {
            fprintf(stderr, "bench: FAILED: asked for gemm %s, the context resolved to %s\n", gemm_arg, gemm_json);
            mnistcu_ctx_destroy(ctx);
            return 1;
        }
    }

    memset(&dd, 0, sizeof dd);
    dd.dir = data;
    dd.split = MNISTCU_SPLIT_TRAIN;
    dd.norm = MNISTCU_NORM_UNIT;
    dd.limit = limit;
    if (mnistcu_dataset_load(ctx, &dd, &train)) return fail(ctx, "loading the training set");
    dd.split = MNISTCU_SPLIT_TEST;
    dd.limit = 0;
    if (mnistcu_dataset_load(ctx, &dd, &test)) return fail(ctx, "loading the test set");
    mnistcu_dataset_info_get(train, &info);

    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = batch;
    td.optim.kind = MNISTCU_OPTIM_SGD;
    td.optim.learning_rate = lr;
    td.no_shuffle = no_shuffle;

    fprintf(stderr, "bench: %s on %s, gemm %s, layers %s, %lu training images, batch %d, lr %g, %s, %d timed epochs\n",
            config, mnistcu_ctx_device_name(ctx), gemm_json, layers, (unsigned long)info.count, batch, (double)lr,
            no_shuffle ? "file order" : "shuffled", epochs);

    /* warm-up: P1 on a model of its own (P1's timed model starts fresh), else one epoch of the timed model */
    if (mnistcu_model_create_mlp(ctx, layers, &net)) return fail(ctx, "creating the model");
    t0 = now_s();
    if (mnistcu_train(net, train, &td, &tr)) return fail(ctx, "warm-up epoch");
    fprintf(stderr, "bench: warm-up epoch %.2f ms, loss %.4f (not timed)\n", 1e3 * (now_s() - t0), tr.train_loss);
    if (is_p1) {
        mnistcu_model_destroy(net);
        net = NULL;
        if (mnistcu_model_create_mlp(ctx, layers, &net)) return fail(ctx, "creating the model");
    }

    ms = (double *)malloc((size_t)epochs * sizeof(double));
    if (!ms) { fprintf(stderr, "bench: out of memory\n"); mnistcu_ctx_destroy(ctx); return 1; }
    t_all0 = now_s();
    for (e = 0; e < epochs; ++e) {
        t0 = now_s();
        if (mnistcu_train(net, train, &td, &tr)) { free(ms); return fail(ctx, "timed epoch"); }
        ms[e] = 1e3 * (now_s() - t0);
        fprintf(stderr, "bench: epoch %d: %.3f ms, loss %.4f, train acc %.2f%%\n", e + 1, ms[e], tr.train_loss,
                100.0 * tr.train_accuracy);
    }
    total_s = now_s() - t_all0;
    med = median(ms, epochs);

    /* validate after timing */
    if (mnistcu_evaluate(net, test, &met, NULL)) { free(ms); return fail(ctx, "evaluating the test set"); }
    if (is_p1)
        fprintf(stderr, "bench: %s total %.4f s for %d epochs (median epoch %.3f ms), test accuracy %.2f%%, train loss %.4f\n",
                config, total_s, epochs, med, 100.0 * met.accuracy, tr.train_loss);
    else
        fprintf(stderr, "bench: %s median %.3f ms/epoch over %d epochs, test accuracy %.2f%%, train loss %.4f\n",
                config, med, epochs, 100.0 * met.accuracy, tr.train_loss);

    printf("{\"impl\":\"mnistcu\",\"config\":\"%s\",\"device\":\"%s\",\"device_name\":\"%s\",\"gemm\":\"%s\","
           "\"threads\":%d,\"train_images\":%lu,\"epochs\":%d,\"epoch_ms_median\":%.4f,\"epoch_ms_all\":[",
           config, dev_json, mnistcu_ctx_device_name(ctx), gemm_json, mnistcu_ctx_threads(ctx),
           (unsigned long)info.count, epochs, med);
    for (e = 0; e < epochs; ++e) printf("%s%.4f", e ? "," : "", ms[e]);
    printf("],\"total_s\":%.6f,\"test_accuracy\":%.6f,\"train_loss\":%.6f}\n", total_s, met.accuracy, tr.train_loss);
    fflush(stdout);

    free(ms);
    mnistcu_ctx_destroy(ctx);
    return 0;
}
