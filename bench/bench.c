/* bench/bench.c - time mnistcu on the benchmark configurations of BENCHMARKS.md.

   CPU:  cc -std=c99 -O3 -march=native -fopenmp -o build/bench_cpu bench/bench.c -lm
   GPU:  nvcc -x cu -O3 -arch=sm_90 -DMNISTCU_CUBLAS -o build/bench_cuda bench/bench.c -lcublas
         (add -DMNISTCU_CUDNN -I$CUDNN_DIR/include ... -lcudnn for --cnn cudnn; bench/run.sh finds cuDNN)

   Usage: bench --build-info   prints what this build has, a word each: cuda (or cpu), then cublas and
                               cudnn where built with them (bench/run.sh reads it when PREBUILT=1)
          bench CONFIG [--device cpu|cuda] [--gemm own|cublas] [--cnn own|cudnn] [--epochs N] [--data DIR]
                       [--threads N] [--seed S] [--limit N] [--warmup-limit N] [--fused on|off]
                       [--graph on|off] [--head on|off] [--fused-update on|off]
                       [--precision fp32|tf32|bf16|tf32x3]
     CONFIG  P1  first 10,000 train images in file order, 784-1024-10, batch 32, SGD lr 0.01,
                 10 epochs: the total training time of the 10 epochs
             P2  MNIST 60k shuffled, 784-128-10, batch 64, SGD lr 0.1: time per epoch
             P3  MNIST 60k shuffled, 784-1024-1024-10, batch 512, SGD lr 0.1: time per epoch
             P4  MNIST 60k shuffled, LeNet-5 (the preset "lenet5"), batch 64, SGD momentum 0.9,
                 lr 0.02: time per epoch
             P5  Fashion-MNIST 60k shuffled (default --data data/fashion-mnist), the preset
                 "fashion-cnn", batch 64, SGD momentum 0.9, lr 0.02: time per epoch
             P6  time to 99.0% MNIST test accuracy: a fresh model trained by a recipe (defaults below; any
                 of it can be changed with the P6 options), the test set evaluated at every epoch end
                 (not timed), stopped at the first epoch end whose test accuracy reaches --target
                 (default 0.99); reported: the training seconds up to there (the sum of the epochs'
                 wall times, graph capture included), or a miss when --epochs (default 1) end first.
                 Default recipe: MNIST 60k shuffled, inputs x/255, P6_SPEC below (conv3x3x16, conv3x3x32,
                 batch norm, dense128), batch 128, SGD momentum 0.9, lr 0.15 one-cycle stepped per batch
                 over the --epochs, weight decay 5e-4, label smoothing 0.1, one epoch (chosen over 36
                 variants on an H100: bench/RESULTS.md).
                 Before it, one warm-up epoch of the same recipe on the first 10,000 images, on a
                 model of its own. Run it once per --seed for the spread.
             P7  P2 on the CPU
     --device   default cuda (P7: cpu); P4 and P5 also run on the CPU with --device cpu
     --gemm     CUDA matrix products: own kernels or cuBLAS (default: the build's default)
     --cnn      CUDA convolution/pooling: own kernels or cuDNN (default: the build's default, which is
                cuDNN in a build with MNISTCU_CUDNN)
     --fused    off trains P1/P2 step by step instead of in the fused MLP kernel (same bits; default on)
     --graph    off launches each step's kernels one by one instead of replaying the step's CUDA graph
                (same bits; default on)
     --head     off runs the last dense layer, the loss and its input gradient step by step instead of in
                the classifier head kernel (same bits with own products; default on)
     --fused-cnn  on trains P4 (LeNet-5) in the fused LeNet-5 kernel (opt-in: its sums run in other
                orders, so the weights agree with the step by step path's to rounding, not bit for bit;
                needs compute capability 9.0; the run fails if the kernel did not take every step)
     --fused-mlp-clusters  on trains P1/P2 in the cluster MLP kernel (opt-in, likewise not bitwise;
                compute capability 9.0; the run fails if the kernel did not take every step)
     --fused-update  off takes every optimizer step in the optimizer's pass instead of in the dense
                layers' weight gradient products (own products, SGD; same bits; default on)
     --precision  the GPU's matrix products: fp32 (default), tf32 or bf16 on the tensor cores, or
                tf32x3 (FP32's accuracy in three TF32 products; the context must resolve to it,
                else the run fails)
     --limit N  train on the first N images only (quick tests; not a benchmark configuration)
     --warmup-limit N  the warm-up epoch trains on the first N images only (slow CPU runs;
                 default: a whole epoch)

   Protocol: inputs x/255 (MNISTCU_NORM_UNIT) as on the PyTorch side. One warm-up epoch that is not
   timed (P1: a whole separate 1-epoch run on its own model, since P1's model must start fresh), then
   every epoch is one call of mnistcu_train with epochs=1 on the same model (weights and optimizer
   state persist across calls), timed by the wall clock around the call: the call returns only after
   the epoch's statistics are read back from the device, so its GPU work is complete. Reported: the
   median and every epoch (P2-P5, P7), the total (P1), then the test accuracy, evaluated after timing,
   and the last epoch's mean training loss. Human-readable lines go to stderr, one JSON line to stdout.
   Self-checks: the model must have the configuration's parameter count (P4 44,426, P5 896,522), the
   device, GEMM and CNN path asked for must be the ones the context resolved to, and every epoch's loss must be
   finite; otherwise the program fails (non-zero exit, no JSON line). */
#define _POSIX_C_SOURCE 200809L
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#include <math.h>
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

/* P6's model: two 3x3 convolutions with batch norm (the ReLU after the pooling, where it folds into it:
   max and ReLU commute), a hidden dense layer */
#define P6_SPEC                                                                                          \
    "1x28x28 conv3x3x16:p=1 batchnorm maxpool2 relu conv3x3x32:p=1 batchnorm maxpool2 relu flatten dense128 " \
    "relu dense10"

/* P6: record the first epoch end at which the test accuracy reaches the target, and stop there */
typedef struct p6_watch {
    double target;
    int hit_epoch;           /* 0: not yet */
    double hit_seconds;      /* training seconds at that epoch's end */
    int epochs_seen;
    double acc[64], sec[64]; /* per epoch: test accuracy, training seconds so far */
} p6_watch;

static int p6_progress(void *user, const mnistcu_progress *p)
{
    p6_watch *w = (p6_watch *)user;
    if (!p->epoch_end || !p->has_validation) return 0;
    if (w->epochs_seen < 64) {
        w->acc[w->epochs_seen] = p->val_accuracy;
        w->sec[w->epochs_seen] = p->seconds;
    }
    w->epochs_seen++;
    fprintf(stderr, "bench: P6 epoch %d: %.4f s of training, train loss %.4f, test accuracy %.2f%%\n", p->epoch,
            p->seconds, p->train_loss, 100.0 * p->val_accuracy);
    if (p->val_accuracy >= w->target) {
        w->hit_epoch = p->epoch;
        w->hit_seconds = p->seconds;
        return 1;
    }
    return 0;
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
    fprintf(stderr, "usage: bench --build-info\n"
                    "       bench P1|P2|P3|P4|P5|P7 [--device cpu|cuda] [--gemm own|cublas] [--cnn own|cudnn]\n"
                    "                               [--epochs N] [--data DIR] [--threads N] [--seed S] [--limit N]\n"
                    "                               [--warmup-limit N] [--fused on|off] [--graph on|off]\n"
                    "                               [--head on|off] [--fused-update on|off] [--fused-cnn on|off]\n"
                    "                               [--fused-mlp-clusters on|off]\n"
                    "                               [--precision fp32|tf32|bf16|tf32x3] [--batch N (P4, P5; else 64)]\n"
                    "       bench P6 [the options above] [--spec SPEC] [--batch N] [--optim sgd|adam|adamw] [--lr X]\n"
                    "                [--momentum X] [--nesterov on|off] [--wd X] [--schedule onecycle|cosine|constant]\n"
                    "                [--target ACC] [--label-smoothing E]\n");
}

static int fail(mnistcu_ctx *ctx, const char *what)
{
    fprintf(stderr, "bench: FAILED: %s: %s\n", what, ctx ? mnistcu_ctx_error(ctx) : "no context");
    mnistcu_ctx_destroy(ctx);
    return 1;
}

int main(int argc, char **argv)
{
    const char *config, *data = NULL, *device_arg = NULL, *gemm_arg = NULL, *cnn_arg = NULL, *layers;
    const char *dev_json, *gemm_json, *cnn_json, *precision_json, *precision_arg = NULL;
    int epochs = -1, threads = 0, batch, no_shuffle = 0, no_fused = 0, no_graph = 0, no_head = 0, no_upd = 0, is_p1 = 0, fused_cnn = 0;
    int fused_mc = 0;
    int is_spec = 0, i, e;
    unsigned long long seed = 0;
    size_t limit = 0, warmup_limit = 0, want_params, warmup_images;
    float lr, momentum = 0.0f;
    mnistcu_ctx_desc cd;
    mnistcu_ctx_desc resolved;
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset_desc dd;
    mnistcu_dataset *train = NULL, *test = NULL, *warm = NULL, *warm_rest = NULL;
    mnistcu_model *net = NULL;
    mnistcu_train_desc td;
    mnistcu_train_result tr;
    mnistcu_metrics met;
    mnistcu_dataset_info info, test_info;
    double *ms, t0, t_all0, total_s = 0.0, med;
    /* P6's recipe */
    const char *p6_spec = P6_SPEC, *p6_optim = "sgd", *p6_schedule = "onecycle";
    int p6_batch = 128, p6_nesterov = 0, batch_arg = 0; /* --batch: P6's, and P4's or P5's in place of 64 */
    float p6_lr = 0.15f, p6_momentum = 0.9f, p6_wd = 5e-4f, p6_smoothing = 0.1f;
    double p6_target = 0.99;

    if (argc == 2 && !strcmp(argv[1], "--build-info")) {
        printf("%s%s%s\n",
#ifdef __CUDACC__
               "cuda",
#else
               "cpu",
#endif
#ifdef MNISTCU_CUBLAS
               " cublas",
#else
               "",
#endif
#ifdef MNISTCU_CUDNN
               " cudnn"
#else
               ""
#endif
        );
        return 0;
    }
    if (argc < 2 || argv[1][0] == '-') { usage(); return 2; }
    config = argv[1];
    for (i = 2; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench: %s needs a value\n", a); usage(); return 2; }
        if (!strcmp(a, "--device")) device_arg = v;
        else if (!strcmp(a, "--gemm")) gemm_arg = v;
        else if (!strcmp(a, "--cnn")) cnn_arg = v;
        else if (!strcmp(a, "--epochs")) epochs = atoi(v);
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--limit")) limit = (size_t)strtoull(v, NULL, 10);
        else if (!strcmp(a, "--warmup-limit")) warmup_limit = (size_t)strtoull(v, NULL, 10);
        else if (!strcmp(a, "--fused")) no_fused = !strcmp(v, "off");
        else if (!strcmp(a, "--graph")) no_graph = !strcmp(v, "off");
        else if (!strcmp(a, "--head")) no_head = !strcmp(v, "off");
        else if (!strcmp(a, "--fused-update")) no_upd = !strcmp(v, "off");
        else if (!strcmp(a, "--fused-cnn")) fused_cnn = !strcmp(v, "on");
        else if (!strcmp(a, "--fused-mlp-clusters")) fused_mc = !strcmp(v, "on");
        else if (!strcmp(a, "--precision")) precision_arg = v;
        else if (!strcmp(a, "--spec")) p6_spec = v;
        else if (!strcmp(a, "--batch")) p6_batch = batch_arg = atoi(v);
        else if (!strcmp(a, "--optim")) p6_optim = v;
        else if (!strcmp(a, "--lr")) p6_lr = (float)atof(v);
        else if (!strcmp(a, "--momentum")) p6_momentum = (float)atof(v);
        else if (!strcmp(a, "--nesterov")) p6_nesterov = !strcmp(v, "on");
        else if (!strcmp(a, "--wd")) p6_wd = (float)atof(v);
        else if (!strcmp(a, "--schedule")) p6_schedule = v;
        else if (!strcmp(a, "--target")) p6_target = atof(v);
        else if (!strcmp(a, "--label-smoothing")) p6_smoothing = (float)atof(v);
        else { fprintf(stderr, "bench: unknown option %s\n", a); usage(); return 2; }
        ++i;
    }

    if (!strcmp(config, "P1")) {
        layers = "784-1024-10"; batch = 32; lr = 0.01f; no_shuffle = 1; is_p1 = 1; want_params = 814090;
        if (!limit) limit = 10000;
        if (epochs < 0) epochs = 10;
    } else if (!strcmp(config, "P2") || !strcmp(config, "P7")) {
        layers = "784-128-10"; batch = 64; lr = 0.1f; want_params = 101770;
        if (epochs < 0) epochs = 5;
    } else if (!strcmp(config, "P3")) {
        layers = "784-1024-1024-10"; batch = 512; lr = 0.1f; want_params = 1863690;
        if (epochs < 0) epochs = 5;
    } else if (!strcmp(config, "P4")) {
        layers = "lenet5"; is_spec = 1; batch = batch_arg > 0 ? batch_arg : 64; lr = 0.02f; momentum = 0.9f;
        want_params = 44426;
        if (epochs < 0) epochs = 5;
    } else if (!strcmp(config, "P5")) {
        layers = "fashion-cnn"; is_spec = 1; batch = batch_arg > 0 ? batch_arg : 64; lr = 0.02f; momentum = 0.9f;
        want_params = 896522;
        if (!data) data = "data/fashion-mnist";
        if (epochs < 0) epochs = 5;
    } else if (!strcmp(config, "P6")) {
        layers = p6_spec; is_spec = 1; batch = p6_batch; lr = p6_lr; momentum = p6_momentum; want_params = 0;
        if (epochs < 0) epochs = 1;
        if (!warmup_limit) warmup_limit = 10000;
        if (batch < 1 || !(p6_target > 0.0 && p6_target <= 1.0) || epochs > 64 ||
            (strcmp(p6_optim, "sgd") && strcmp(p6_optim, "adam") && strcmp(p6_optim, "adamw")) ||
            (strcmp(p6_schedule, "onecycle") && strcmp(p6_schedule, "cosine") && strcmp(p6_schedule, "constant"))) {
            fprintf(stderr, "bench: P6: --batch >= 1, --target in (0, 1], --epochs <= 64, --optim sgd|adam|adamw, "
                            "--schedule onecycle|cosine|constant\n");
            return 2;
        }
    } else {
        fprintf(stderr, "bench: unknown config %s (P1, P2, P3, P4, P5, P6, P7)\n", config);
        return 2;
    }
    if (!data) data = "data/mnist";
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
    if (!cnn_arg) cd.cnn = MNISTCU_CNN_DEFAULT;
    else if (!strcmp(cnn_arg, "own")) cd.cnn = MNISTCU_CNN_OWN;
    else if (!strcmp(cnn_arg, "cudnn")) {
#ifndef MNISTCU_CUDNN
        fprintf(stderr, "bench: --cnn cudnn needs a build with nvcc -DMNISTCU_CUDNN ... -lcudnn\n");
        return 2;
#else
        cd.cnn = MNISTCU_CNN_CUDNN;
#endif
    } else { fprintf(stderr, "bench: --cnn must be own or cudnn\n"); return 2; }
    if (!precision_arg || !strcmp(precision_arg, "fp32")) cd.precision = MNISTCU_PRECISION_FP32;
    else if (!strcmp(precision_arg, "tf32")) cd.precision = MNISTCU_PRECISION_TF32;
    else if (!strcmp(precision_arg, "bf16")) cd.precision = MNISTCU_PRECISION_BF16;
    else if (!strcmp(precision_arg, "tf32x3")) cd.precision = MNISTCU_PRECISION_TF32X3;
    else { fprintf(stderr, "bench: --precision must be fp32, tf32, bf16 or tf32x3\n"); return 2; }
    if (cd.device == MNISTCU_DEVICE_CPU && (gemm_arg || cnn_arg || cd.precision != MNISTCU_PRECISION_FP32)) {
        fprintf(stderr, "bench: --gemm, --cnn and --precision apply to --device cuda only\n");
        return 2;
    }

    if (mnistcu_ctx_create(&ctx, &cd)) return fail(ctx, "creating the context");
    if (mnistcu_ctx_device(ctx) != cd.device) {
        fprintf(stderr, "bench: FAILED: asked for %s, got %s\n", device_arg, mnistcu_ctx_device_name(ctx));
        mnistcu_ctx_destroy(ctx);
        return 1;
    }
    mnistcu_ctx_resolved_desc(ctx, &resolved);
    if (resolved.precision != cd.precision) {
        fprintf(stderr, "bench: FAILED: asked for precision %s, the context resolved to FP32 (%s)\n", precision_arg,
                mnistcu_ctx_device_name(ctx));
        mnistcu_ctx_destroy(ctx);
        return 1;
    }
    precision_json = resolved.precision == MNISTCU_PRECISION_TF32     ? "tf32"
                     : resolved.precision == MNISTCU_PRECISION_BF16   ? "bf16"
                     : resolved.precision == MNISTCU_PRECISION_TF32X3 ? "tf32x3"
                                                                      : "fp32";
    if (cd.device == MNISTCU_DEVICE_CPU) {
        dev_json = "cpu"; gemm_json = "cpu"; cnn_json = "cpu";
    } else {
        dev_json = "cuda";
        /* DEFAULT means the build's default: cuBLAS / cuDNN when built with them */
#ifdef MNISTCU_CUBLAS
        gemm_json = resolved.gemm == MNISTCU_GEMM_OWN ? "own" : "cublas";
#else
        gemm_json = resolved.gemm == MNISTCU_GEMM_CUBLAS ? "cublas" : "own";
#endif
#ifdef MNISTCU_CUDNN
        cnn_json = resolved.cnn == MNISTCU_CNN_OWN ? "own" : "cudnn";
#else
        cnn_json = resolved.cnn == MNISTCU_CNN_CUDNN ? "cudnn" : "own";
#endif
        if ((gemm_arg && strcmp(gemm_arg, gemm_json)) || (cnn_arg && strcmp(cnn_arg, cnn_json))) {
            fprintf(stderr, "bench: FAILED: asked for gemm %s, cnn %s; the context resolved to gemm %s, cnn %s\n",
                    gemm_arg ? gemm_arg : "default", cnn_arg ? cnn_arg : "default", gemm_json, cnn_json);
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
    mnistcu_dataset_info_get(test, &test_info);
    /* --warmup-limit: the warm-up epoch on the first N training images (a copy, in file order) */
    warm = train;
    if (warmup_limit && warmup_limit < info.count) {
        if (mnistcu_dataset_split(ctx, train, warmup_limit, 0, &warm, &warm_rest))
            return fail(ctx, "splitting off the warm-up images");
    }

    if (!strcmp(config, "P6")) {
        p6_watch w;
        mnistcu_model_desc md;
        mnistcu_dataset_info wi;
        memset(&td, 0, sizeof td);
        td.batch_size = batch;
        td.optim.kind = !strcmp(p6_optim, "adam")    ? MNISTCU_OPTIM_ADAM
                        : !strcmp(p6_optim, "adamw") ? MNISTCU_OPTIM_ADAMW
                                                     : MNISTCU_OPTIM_SGD;
        td.optim.learning_rate = lr;
        if (td.optim.kind == MNISTCU_OPTIM_SGD) {
            td.optim.momentum = momentum;
            td.optim.nesterov = p6_nesterov && momentum > 0.0f;
        }
        td.optim.weight_decay = p6_wd;
        td.schedule.kind = !strcmp(p6_schedule, "onecycle") ? MNISTCU_SCHEDULE_ONE_CYCLE
                           : !strcmp(p6_schedule, "cosine") ? MNISTCU_SCHEDULE_COSINE
                                                            : MNISTCU_SCHEDULE_CONSTANT;
        td.schedule.per_step = 1;
        td.no_graph = no_graph;
        td.no_head = no_head;
        td.no_fused_update = no_upd;
        if (mnistcu_model_desc_parse(ctx, layers, &md)) return fail(ctx, "parsing --spec");
        md.label_smoothing = p6_smoothing;
        /* warm-up: one epoch of the recipe on the first images, on a model of its own */
        if (mnistcu_model_create(ctx, &md, &net)) return fail(ctx, "creating the model");
        mnistcu_dataset_info_get(warm, &wi);
        warmup_images = wi.count;
        td.epochs = 1;
        t0 = now_s();
        if (mnistcu_train(net, warm, &td, &tr)) return fail(ctx, "warm-up epoch");
        fprintf(stderr, "bench: P6 warm-up (%lu images) %.2f ms, loss %.4f (not timed)\n", (unsigned long)warmup_images,
                1e3 * (now_s() - t0), tr.train_loss);
        mnistcu_model_destroy(net);
        net = NULL;
        /* the timed run */
        if (mnistcu_model_create(ctx, &md, &net)) return fail(ctx, "creating the model");
        fprintf(stderr, "bench: P6 on %s, gemm %s, cnn %s, precision %s, model %s (%lu params), %lu training images, "
                "batch %d, %s lr %g%s momentum %g, weight decay %g, schedule %s, label smoothing %g, at most %d "
                "epochs, target %.2f%%\n", mnistcu_ctx_device_name(ctx), gemm_json, cnn_json, precision_json, layers,
                (unsigned long)mnistcu_model_num_params(net), (unsigned long)info.count, batch, p6_optim, (double)lr,
                td.optim.nesterov ? " nesterov" : "", (double)td.optim.momentum, (double)p6_wd, p6_schedule,
                (double)p6_smoothing, epochs, 100.0 * p6_target);
        memset(&w, 0, sizeof w);
        w.target = p6_target;
        td.epochs = epochs;
        td.validation = test;
        td.progress = p6_progress;
        td.progress_user = &w;
        if (mnistcu_train(net, train, &td, &tr)) return fail(ctx, "the timed run");
        if (w.hit_epoch)
            fprintf(stderr, "bench: P6 reached %.2f%% after %d epoch(s), %.4f s of training\n", 100.0 * p6_target,
                    w.hit_epoch, w.hit_seconds);
        else
            fprintf(stderr, "bench: P6 MISSED %.2f%% in %d epochs (best %.2f%%)\n", 100.0 * p6_target, epochs,
                    100.0 * tr.val_accuracy);
        printf("{\"impl\":\"mnistcu\",\"config\":\"P6\",\"device\":\"%s\",\"device_name\":\"%s\",\"gemm\":\"%s\","
               "\"cnn\":\"%s\",\"precision\":\"%s\",\"model\":\"%s\",\"params\":%lu,\"batch\":%d,\"optim\":\"%s\","
               "\"lr\":%g,\"momentum\":%g,\"nesterov\":%d,\"weight_decay\":%g,\"schedule\":\"%s\","
               "\"label_smoothing\":%g,\"seed\":%llu,\"max_epochs\":%d,\"target\":%g,\"reached\":%s,"
               "\"epochs_to_target\":%d,\"seconds_to_target\":",
               dev_json, mnistcu_ctx_device_name(ctx), gemm_json, cnn_json, precision_json, layers,
               (unsigned long)mnistcu_model_num_params(net), batch, p6_optim, (double)lr, (double)td.optim.momentum,
               td.optim.nesterov, (double)p6_wd, p6_schedule, (double)p6_smoothing, seed, epochs, p6_target,
               w.hit_epoch ? "true" : "false", w.hit_epoch);
        if (w.hit_epoch) printf("%.6f", w.hit_seconds); else printf("null");
        printf(",\"test_accuracy_all\":[");
        for (e = 0; e < w.epochs_seen && e < 64; ++e) printf("%s%.6f", e ? "," : "", w.acc[e]);
        printf("],\"seconds_all\":[");
        for (e = 0; e < w.epochs_seen && e < 64; ++e) printf("%s%.6f", e ? "," : "", w.sec[e]);
        printf("],\"train_loss\":%.6f,\"graph_steps\":%lu,\"head_steps\":%lu,\"fused_update_steps\":%lu}\n",
               tr.train_loss, (unsigned long)tr.graph_steps, (unsigned long)tr.head_steps,
               (unsigned long)tr.fused_update_steps);
        fflush(stdout);
        mnistcu_ctx_destroy(ctx);
        return 0;
    }

    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = batch;
    td.optim.kind = MNISTCU_OPTIM_SGD;
    td.optim.learning_rate = lr;
    td.optim.momentum = momentum;
    td.no_shuffle = no_shuffle;
    td.no_fused = no_fused;
    td.no_graph = no_graph;
    td.no_head = no_head;
    td.no_fused_update = no_upd;
    td.fused_cnn = fused_cnn;
    td.fused_mlp_clusters = fused_mc;

    /* warm-up: P1 on a model of its own (P1's timed model starts fresh), else one epoch of the timed model */
    if (is_spec ? mnistcu_model_create_spec(ctx, layers, &net) : mnistcu_model_create_mlp(ctx, layers, &net))
        return fail(ctx, "creating the model");
    if (mnistcu_model_num_params(net) != want_params) {
        fprintf(stderr, "bench: FAILED: the %s model (%s) has %lu parameters, expected %lu\n", config, layers,
                (unsigned long)mnistcu_model_num_params(net), (unsigned long)want_params);
        mnistcu_ctx_destroy(ctx);
        return 1;
    }
    fprintf(stderr, "bench: %s on %s, gemm %s, cnn %s, model %s (%lu params), %lu training images, batch %d, lr %g, "
            "momentum %g, %s, %d timed epochs\n",
            config, mnistcu_ctx_device_name(ctx), gemm_json, cnn_json, layers, (unsigned long)want_params,
            (unsigned long)info.count, batch, (double)lr, (double)momentum, no_shuffle ? "file order" : "shuffled",
            epochs);
    {
        mnistcu_dataset_info wi;
        mnistcu_dataset_info_get(warm, &wi);
        warmup_images = wi.count;
    }
    t0 = now_s();
    if (mnistcu_train(net, warm, &td, &tr)) return fail(ctx, "warm-up epoch");
    fprintf(stderr, "bench: warm-up epoch (%lu images) %.2f ms, loss %.4f (not timed)\n", (unsigned long)warmup_images,
            1e3 * (now_s() - t0), tr.train_loss);
    if (!isfinite(tr.train_loss)) {
        fprintf(stderr, "bench: FAILED: the warm-up loss is not finite (%g)\n", tr.train_loss);
        mnistcu_ctx_destroy(ctx);
        return 1;
    }
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
        if (fused_cnn && tr.fused_cnn_steps != tr.steps) {
            fprintf(stderr, "bench: FAILED: --fused-cnn on, but the fused LeNet-5 kernel ran %lu of %lu steps\n",
                    (unsigned long)tr.fused_cnn_steps, (unsigned long)tr.steps);
            free(ms);
            mnistcu_ctx_destroy(ctx);
            return 1;
        }
        if (fused_mc && tr.fused_cluster_steps != tr.steps) {
            fprintf(stderr, "bench: FAILED: --fused-mlp-clusters on, but the cluster MLP kernel ran %lu of %lu steps\n",
                    (unsigned long)tr.fused_cluster_steps, (unsigned long)tr.steps);
            free(ms);
            mnistcu_ctx_destroy(ctx);
            return 1;
        }
        ms[e] = 1e3 * (now_s() - t0);
        fprintf(stderr, "bench: epoch %d: %.3f ms, loss %.4f, train acc %.2f%%\n", e + 1, ms[e], tr.train_loss,
                100.0 * tr.train_accuracy);
        if (!isfinite(tr.train_loss)) {
            fprintf(stderr, "bench: FAILED: the loss of epoch %d is not finite (%g)\n", e + 1, tr.train_loss);
            free(ms);
            mnistcu_ctx_destroy(ctx);
            return 1;
        }
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
           "\"cnn\":\"%s\",\"precision\":\"%s\",\"threads\":%d,\"model\":\"%s\",\"params\":%lu,\"batch\":%d,\"lr\":%g,\"momentum\":%g,"
           "\"train_images\":%lu,\"warmup_images\":%lu,\"test_images\":%lu,\"epochs\":%d,"
           "\"epoch_ms_median\":%.4f,\"epoch_ms_all\":[",
           config, dev_json, mnistcu_ctx_device_name(ctx), gemm_json, cnn_json, precision_json, mnistcu_ctx_threads(ctx),
           layers,
           (unsigned long)want_params, batch, (double)lr, (double)momentum, (unsigned long)info.count,
           (unsigned long)warmup_images, (unsigned long)test_info.count, epochs, med);
    for (e = 0; e < epochs; ++e) printf("%s%.4f", e ? "," : "", ms[e]);
    printf("],\"total_s\":%.6f,\"test_accuracy\":%.6f,\"train_loss\":%.6f,\"fused_steps\":%lu,\"fused_cnn_steps\":%lu,"
           "\"fused_cluster_steps\":%lu,\"graph_steps\":%lu,\"fused_update_steps\":%lu}\n",
           total_s, met.accuracy, tr.train_loss, (unsigned long)tr.fused_steps, (unsigned long)tr.fused_cnn_steps,
           (unsigned long)tr.fused_cluster_steps,
           (unsigned long)tr.graph_steps,
           (unsigned long)tr.fused_update_steps);
    fflush(stdout);

    free(ms);
    mnistcu_ctx_destroy(ctx);
    return 0;
}
