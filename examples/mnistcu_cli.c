/* mnistcu_cli.c - the `mnistcu` command-line tool: train, evaluate and inspect.

   Build:  make build/mnistcu-cpu   (C99, CPU backend)
           make build/mnistcu       (nvcc: CUDA backend, CPU fallback)

   Commands (run `mnistcu --help` for every option):
     mnistcu train [options]        train an MLP or a CNN on MNIST or Fashion-MNIST, test it
     mnistcu eval --weights FILE    test weights saved by `train --save-weights`
     mnistcu info FILE              describe an IDX file (raw or .gz)

   Output: human-readable progress, tables and messages go to stderr; the LAST
   line on stdout of train, eval and info is one JSON object, for scripts: the
   results, or after an error "error" (a short name such as "diverged" or
   "not_found") and "message". It is always valid JSON: a number that is not
   finite is written as null, and strings are escaped (valid UTF-8 passes
   through; a byte that is not part of valid UTF-8 becomes \u00XX, its Latin-1
   reading).

   Exit status: 0 success, 1 a failed library call or file operation (the
   message is printed as "mnistcu: error: ..."), including training that
   diverged (a loss or weight not finite), 2 a usage error (unknown option,
   missing or invalid value; nothing on stdout).

   The whole program is a thin layer over mnistcu.h; read it top to bottom as a
   tour of the library's API. */

/* isatty() and fileno() are POSIX, not C99: ask for them before any include. */
#define _POSIX_C_SOURCE 200809L

#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#include <io.h>
#define isatty _isatty
#define fileno _fileno
#include <direct.h>
#else
#include <sys/stat.h>
#include <unistd.h>
#endif

enum { EXIT_OK = 0, EXIT_ERROR = 1, EXIT_USAGE = 2 };

/* ==========================================================================
   Help text
   ========================================================================== */

static void print_synopsis(FILE *f)
{
    fprintf(f,
            "usage: mnistcu train [options]\n"
            "       mnistcu eval --weights FILE [options]\n"
            "       mnistcu info FILE\n"
            "       mnistcu export --onnx OUT --model FILE\n"
            "       mnistcu predict --model FILE [--top K] [--save-preprocessed FILE] [--raw] IMAGE...\n"
            "       mnistcu --help | --version\n");
}

static void print_help(FILE *f)
{
    /* In pieces: C99 only promises string literals of up to 4095 characters. */
    print_synopsis(f);
    fprintf(f, "\n"
               "Train and test neural networks (MLPs and CNNs) on MNIST-style data (mnistcu %s).\n"
               "Progress and tables go to stderr; the last line on stdout is a JSON object.\n",
            MNISTCU_VERSION_STRING);
    fputs("\n"
          "Data and model (train and eval):\n"
          "  --data DIR            folder holding mnist/ and fashion-mnist/ (default: data)\n"
          "  --dataset NAME        mnist or fashion (default: mnist)\n"
          "  --init NAME           weights: torch (PyTorch's default), he, he_normal, xavier,\n"
          "                        xavier_normal (default: torch; a spec's :init= wins)\n"
          "  --model SPEC|FILE     the model: lenet5, fashion-cnn, a spec string of layers\n"
          "                        (see Models below), or a model file (train continues\n"
          "                        from its weights); overrides --layers and --act\n"
          "  --layers SPEC         an MLP's widths, input first (default: 784-128-10)\n"
          "  --act NAME            the MLP's hidden activation: relu, tanh, sigmoid, identity\n"
          "                        (default: relu)\n"
          "  --norm NAME           pixel scaling: standard (x/255, then zero mean and unit\n"
          "                        variance over the training set), unit (x/255), none\n"
          "                        (default: standard)\n"
          "  --limit N             use only the first N training samples\n"
          "  --device NAME         cpu, cuda or auto (default: auto; MNISTCU_DEVICE=cpu|cuda\n"
          "                        in the environment decides when auto)\n"
          "  --threads N           CPU threads, 0 = all cores (default: 0)\n"
          "  --precision P         GPU matrix products: fp32, or tf32 / bf16 on the tensor\n"
          "                        cores (sm_80+; FP32 weights and sums, faster, not the\n"
          "                        same bits; the CPU stays fp32), or tf32x3: FP32's\n"
          "                        accuracy from three TF32 products on the tensor cores\n"
          "                        (large products only; not FP32's bits; Hopper's wgmma\n"
          "                        where built for sm_90a) (default: fp32)\n"
          "  --loss NAME           ce (softmax cross-entropy), mse (against one-hot labels),\n"
          "                        bce (sigmoid per class, on logits), hinge (multi-class,\n"
          "                        as torch.nn.MultiMarginLoss) (default: ce)\n"
          "  --label-smoothing E   ce: smooth the targets by E in [0, 1] (default: 0)\n"
          "  --margin M            hinge: the margin (default: 1)\n"
          "  --hinge-p P           hinge: 1 or 2, the power of each violation (default: 1)\n"
          "  --reduction R         mean or sum over the batch, as PyTorch's (default: mean)\n"
          "  --quiet               no progress, summary or confusion matrix on stderr\n",
          f);
    fputs("\n"
          "Training (train only):\n"
          "  --epochs N            passes over the training set (default: 10)\n"
          "  --batch N             samples per step (default: 64)\n"
          "  --optim NAME          sgd, adam, adamw, rmsprop or adagrad, with torch.optim's\n"
          "                        rules (default: sgd)\n"
          "  --lr X                learning rate (default: 0.1 for sgd, 0.001 for adam and\n"
          "                        adamw, 0.01 for rmsprop and adagrad)\n"
          "  --momentum X          sgd and rmsprop momentum in [0, 1) (default: 0)\n"
          "  --nesterov            sgd: Nesterov momentum (needs --momentum > 0)\n"
          "  --dampening X         sgd: momentum dampening in [0, 1] (default: 0)\n"
          "  --betas B1,B2         adam, adamw: moment decay rates (default: 0.9,0.999)\n"
          "  --amsgrad             adam, adamw: the AMSGrad variant\n"
          "  --eps X               adam, adamw, rmsprop: 1e-8, adagrad: 1e-10 (defaults)\n"
          "  --alpha X             rmsprop: smoothing of the squared average (default: 0.99)\n"
          "  --centered            rmsprop: divide by the estimated variance\n"
          "  --lr-decay X          adagrad: rate lr / (1 + (t-1) X) at step t (default: 0)\n"
          "  --initial-accumulator X  adagrad: where the sums start (default: 0)\n"
          "  --weight-decay X      L2 added to the gradient; adamw: decoupled (default: 0;\n"
          "                        adamw: 0.01)\n"
          "  --l2 X                add X * ||W||^2 over dense and conv weights to the loss\n"
          "                        (default: 0)\n"
          "  --clip X              clip the gradient's global 2-norm to X (default: off)\n"
          "  --augment SPEC        warp each training image on the fly: affine (rotate=10,\n"
          "                        scale=0.1,shift=2), elastic (elastic=34,sigma=4, Simard\n"
          "                        2003), all, or KEY=VALUE,... of rotate (degrees), scale,\n"
          "                        shift (pixels), elastic (alpha), sigma; none (default)\n",
          f);
    fputs("  --schedule S          learning rate per epoch: constant, step:N:G (times G every\n"
          "                        N epochs), multistep:E1,E2,...:G (times G at each epoch\n"
          "                        E), exp:G (times G each epoch), expdecay:K (lr e^-Kt),\n"
          "                        cosine[:MIN] (cosine from --lr down to MIN at the end),\n"
          "                        onecycle (up from --lr/25 to --lr, then down: best with\n"
          "                        --per-step), plateau[:P[:F]] (times F (0.1) after more\n"
          "                        than P (10) epochs without a lower validation loss;\n"
          "                        needs --val) (default: constant)\n"
          "  --warmup N            the first N epochs ramp the rate linearly from 0.1x to\n"
          "                        --lr, then the schedule starts (default: 0)\n"
          "  --per-step            --schedule and --warmup count optimizer steps, not epochs\n"
          "  --early-stop N        stop once the validation loss has not improved for N\n"
          "                        epochs, and keep the best epoch's weights (needs --val)\n"
          "  --log FILE            one JSON line per epoch end (epoch, lr, losses, accuracies,\n"
          "                        seconds, images/s) written to FILE as training goes\n"
          "  --log-every N         a log line every N steps too (default: epoch ends only)\n"
          "  --plot DIR            after training, write into DIR: curves.svg (loss and\n"
          "                        accuracy per epoch), confusion.svg (test confusion heat\n"
          "                        map), misclassified.png (true > predicted), filters.png\n"
          "                        (the first layer's weights)\n"
          "  --seed N              seed of initialisation, shuffling and --val (default: 1)\n"
          "  --val N               hold out N random training samples for validation\n"
          "  --no-shuffle          keep the training order fixed\n"
          "  --no-fused            on the GPU, train a one-hidden-layer MLP step by step\n"
          "                        rather than in the fused kernel (same bits, slower;\n"
          "                        the fused kernel needs the own products, no --clip,\n"
          "                        --l2 or --augment, a batch that fits shared memory,\n"
          "                        more than 16 hidden units if 32 inputs or more)\n"
          "  --no-graph            on the GPU, launch each step's kernels one by one\n"
          "                        (default: each step replayed from a CUDA graph, with\n"
          "                        the same results)\n"
          "  --no-head             on the GPU, run the last dense layer, the loss and its\n"
          "                        input gradient step by step (default: in one kernel,\n"
          "                        the same bits with the own products, within rounding\n"
          "                        with cuBLAS's)\n"
          "  --no-fused-update     on the GPU, take every optimizer step in the optimizer's\n"
          "                        pass (default: with SGD, a wide dense layer's step in\n"
          "                        its weight gradient product where that is our kernel,\n"
          "                        the same bits)\n",
          f);
    fputs("  --fused-cnn           on the GPU (compute capability 9.0), train LeNet-5's\n"
          "                        shape (--model lenet5, batch at most 64, no --clip,\n"
          "                        --l2 or --augment, the own products) in one persistent\n"
          "                        kernel: about 4x faster, the same bits on every run,\n"
          "                        but its sums run in other orders, so its weights agree\n"
          "                        with the default path's to rounding, not bit for bit\n"
          "  --fused-mlp-clusters  on the GPU (compute capability 9.0), train a model of\n"
          "                        one hidden dense layer with a relu (784-128-10 and the\n"
          "                        like: at most 784 inputs, 1024 hidden units, 16\n"
          "                        classes; batch at most 64; no --clip, --l2, --augment\n"
          "                        or --label-smoothing; the cross-entropy loss) in one\n"
          "                        kernel of thread-block clusters, its products on the\n"
          "                        tensor cores in three TF32 parts (FP32's accuracy):\n"
          "                        about 2x faster than the default fused kernel, the\n"
          "                        same bits on every run, but its sums run in other\n"
          "                        orders, so its weights agree with the default path's\n"
          "                        to rounding, not bit for bit\n"
          "  --progress-every N    steps between progress-bar updates on a terminal\n"
          "                        (default: about 20 per epoch; 0: epoch lines only)\n"
          "  --save FILE           write the trained model as safetensors: weights under\n"
          "                        PyTorch's names, the architecture, normalisation, loss\n"
          "                        and class names (eval --model FILE needs nothing else)\n"
          "  --save-weights FILE   write the raw weights only (legacy format below)\n"
          "  --checkpoint FILE     write a checkpoint (the model file plus the optimizer,\n"
          "                        generators, position and settings) at every epoch end\n"
          "  --checkpoint-every N  ... every N epochs instead (default: 1)\n"
          "  --checkpoint-every-steps N  ... and every N steps inside an epoch too\n"
          "  --keep-checkpoints K  also keep the last K as FILE-eEEEE-sSSSSSS.safetensors\n"
          "  --checkpoint-best     also FILE-best.safetensors at each lowest --val loss\n"
          "  --resume FILE         continue from a checkpoint to the same bits as a run never\n"
          "                        stopped: model, data and settings come from it (--epochs\n"
          "                        may extend it; it goes on writing FILE)\n",
          f);
    fputs("\n"
          "Prediction (predict only): mnistcu predict --model FILE IMAGE...\n"
          "  IMAGE                 PNG (any colour type, depth, interlacing) or PGM (P2, P5):\n"
          "                        made MNIST-style (inverted when the background is light,\n"
          "                        cropped to the ink, fitted to 20x20, centred by centre of\n"
          "                        mass in 28x28); prints the top classes with probabilities\n"
          "  --top K               classes shown per image (default: 3)\n"
          "  --save-preprocessed FILE  write the 28x28 input made of each image (PGM; FILE-N\n"
          "                        for several images)\n"
          "  --raw                 no preprocessing: the image must be the model's input size\n"
          "\n"
          "Export: mnistcu export --onnx OUT --model FILE writes ONNX (opset 13) taking raw\n"
          "pixels 0..255, [batch, 1, 28, 28], and giving logits, for ONNX Runtime or TensorRT.\n"
          "\n"
          "Evaluation (eval only):\n"
          "  --model FILE          a model file written by train --save (or --model SPEC\n"
          "                        with --weights FILE from train --save-weights)\n"
          "  --save-logits FILE    write the test set's logits, raw float32 [N][classes]\n",
          f);
    fputs("\n"
          "Models (--model): a preset, or the input shape and one token per layer:\n"
          "  lenet5       1x28x28 conv5x5x6 relu maxpool2 conv5x5x16 relu maxpool2 flatten\n"
          "               dense120 relu dense84 relu dense10 (44,426 parameters)\n"
          "  fashion-cnn  1x28x28 conv3x3x64 maxpool2 relu conv3x3x128 maxpool2 relu flatten\n"
          "               dense256 relu dense10 (896,522 parameters)\n"
          "  tokens       denseN  convKHxKWxN[:s=S][:p=P][:bias=0]  maxpoolK[:s=S]  avgpoolK[:s=S]\n"
          "               batchnorm  dropout[P]  flatten  relu  leaky_relu[S]  sigmoid  tanh\n"
          "               softmax; a spec without an input shape takes the dataset's (1x28x28)\n"
          "  e.g.         --model \"conv3x3x32:p=1 batchnorm relu maxpool2 flatten dropout0.25 dense10\"\n"
          "The layer table (shapes and parameters) is printed before training.\n",
          f);
    fputs("\n"
          "Model files (--save, --checkpoint) are safetensors: the weights under the names\n"
          "torch.nn.Sequential gives them, and the architecture, normalisation, loss and\n"
          "class names in the metadata; PyTorch loads them strictly (tools/mnistcu_torch.py).\n"
          "Legacy weights file (--save-weights): raw little-endian float32 parameters, no\n"
          "header, in PyTorch's order; eval --weights needs the same --model (or --layers\n"
          "and --act) and, with --norm standard, the same --limit; no running statistics.\n"
          "\n"
          "Options take their value as `--lr 0.05` or `--lr=0.05`.\n"
          "\n"
          "Training stops when the loss or a weight becomes NaN or infinite (most often a\n"
          "learning rate too high), checked at each epoch end and progress update: the\n"
          "message names the epoch and step, and the exit status is 1.\n"
          "\n"
          "The last line on stdout of train, eval and info is a JSON object: the results,\n"
          "or \"error\" (e.g. \"diverged\", \"not_found\", \"io\") and \"message\", plus \"epoch\" and\n"
          "\"step\" when training diverged. Numbers that are not finite are null; strings\n"
          "are UTF-8, bytes of a name that are not valid UTF-8 are written as \\u00XX.\n"
          "Exit status: 0 success, 1 error (a failed library call or file operation, or\n"
          "training that diverged), 2 usage error (unknown option, missing or invalid\n"
          "value; nothing on stdout).\n"
          "\n"
          "Examples:\n"
          "  mnistcu train --layers 784-256-128-10 --epochs 20 --momentum 0.9 --val 5000\n"
          "  mnistcu train --model lenet5 --epochs 10 --lr 0.02 --momentum 0.9\n"
          "  mnistcu train --dataset fashion --model fashion-cnn --lr 0.02 --momentum 0.9\n"
          "  mnistcu train --layers 784-800-10 --epochs 60 --lr 0.05 --momentum 0.9 \\\n"
          "                --schedule cosine --augment elastic    (an MLP past 99% on MNIST)\n"
          "  mnistcu train --optim adam --lr 0.001 --loss ce --label-smoothing 0.1\n"
          "  mnistcu train --dataset fashion --model fashion-cnn --save fashion.safetensors\n"
          "  mnistcu eval --dataset fashion --model fashion.safetensors\n"
          "  mnistcu info fashion.safetensors\n"
          "  mnistcu predict --model fashion.safetensors shirt.png\n"
          "  mnistcu export --onnx fashion.onnx --model fashion.safetensors\n"
          "  mnistcu train --model lenet5 --epochs 20 --checkpoint run.safetensors\n"
          "  mnistcu train --resume run.safetensors        (after a stop: the same result)\n"
          "  mnistcu info data/mnist/train-labels-idx1-ubyte.gz\n",
          f);
}

/* A usage error: the message, the synopsis, and the caller exits with 2. */
static void usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "mnistcu: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    print_synopsis(stderr);
    fprintf(stderr, "Run `mnistcu --help` for the options.\n");
}

/* ==========================================================================
   Errors and logging

   Every library call returns MNISTCU_OK or an error code, and the context
   keeps a message naming the cause. We print that message exactly once, here,
   so the library's logger must not print errors too (see cli_log below).
   ========================================================================== */

/* The error that ends the run, for the JSON line: a short name ("diverged",
   "not_found", "io", ...) and the message printed. */
static struct {
    char kind[48];
    char message[1024];
} last_error;

/* Prints "mnistcu: error: ..." and keeps it for the JSON line. */
static void cli_error(const char *kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error.message, sizeof last_error.message, fmt, ap);
    va_end(ap);
    snprintf(last_error.kind, sizeof last_error.kind, "%s", kind);
    fprintf(stderr, "mnistcu: error: %s\n", last_error.message);
}

/* Returns 1 (and prints the context's message) when r is an error. */
static int failed(const mnistcu_ctx *ctx, mnistcu_result r)
{
    const char *msg, *name = mnistcu_result_name(r);
    char kind[48];
    size_t i;
    if (r == MNISTCU_OK) return 0;
    msg = ctx ? mnistcu_ctx_error(ctx) : "";
    if (msg[0] == '\0') msg = mnistcu_result_str(r); /* e.g. no context at all: out of memory */
    /* The kind is the result's name in lower case: MNISTCU_ERR_DIVERGED gives "diverged". */
    if (strncmp(name, "MNISTCU_ERR_", 12) == 0) name += 12;
    for (i = 0; name[i] && i + 1 < sizeof kind; ++i)
        kind[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] - 'A' + 'a' : name[i]);
    kind[i] = '\0';
    cli_error(kind, "%s", msg);
    return 1;
}

/* The library's logger. Errors are reported by failed() from the context's
   message; the per-epoch INFO lines are replaced by our own progress output.
   That leaves warnings (for example threads asked for in a build without OpenMP). */
static void cli_log(void *user, mnistcu_log_level level, const char *message)
{
    (void)user;
    if (level == MNISTCU_LOG_WARN) fprintf(stderr, "mnistcu: warning: %s\n", message);
}

/* ==========================================================================
   Parsing numbers and names

   strtol/strtod report where they stopped; a value is accepted only when the
   whole text was a number and it lies in range. (atoi("abc") would be 0.)
   ========================================================================== */

static int parse_integer(const char *opt, const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    long long v;
    errno = 0;
    v = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
        usage_error("%s: expected an integer from %lld to %lld, got '%s'", opt, lo, hi, text);
        return 0;
    }
    *out = v;
    return 1;
}

/* Any 64-bit unsigned value (strtoull would quietly negate "-1"). */
static int parse_u64(const char *opt, const char *text, uint64_t *out)
{
    char *end;
    unsigned long long v;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || errno == ERANGE) {
        usage_error("%s: expected an integer from 0 to 18446744073709551615, got '%s'", opt, text);
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

/* A finite number in float range (the library computes in float). */
static int parse_number(const char *opt, const char *text, double *out)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(text, &end);
    /* The range test also rejects "nan" (every comparison with NaN is false) and "inf". */
    if (end == text || *end != '\0' || errno == ERANGE || !(v >= -FLT_MAX && v <= FLT_MAX)) {
        usage_error("%s: expected a number, got '%s'", opt, text);
        return 0;
    }
    *out = v;
    return 1;
}

/* "784-128-10" -> {784, 128, 10, 0}. */
static int parse_layers(const char *text, int sizes[MNISTCU_MAX_LAYERS + 1])
{
    const char *p = text;
    int n = 0;
    for (;;) {
        char *end;
        long v;
        if (*p < '0' || *p > '9') break; /* strtol would also take signs and spaces */
        errno = 0;
        v = strtol(p, &end, 10);
        if (errno == ERANGE || v < 1 || v > (1L << 24) || n == MNISTCU_MAX_LAYERS + 1) break;
        sizes[n++] = (int)v;
        if (*end == '\0') {
            if (n < 2) break;
            if (n <= MNISTCU_MAX_LAYERS) sizes[n] = 0; /* zero-terminated unless full */
            return 1;
        }
        if (*end != '-') break;
        p = end + 1;
    }
    usage_error("--layers: expected 2 to %d widths from 1 to 16777216 joined by '-', e.g. 784-128-10; got '%s'",
                MNISTCU_MAX_LAYERS + 1, text);
    return 0;
}

/* {784, 128, 10, 0} -> "784-128-10" */
static void format_layers(const int *sizes, char *out, size_t size)
{
    size_t len = 0;
    int l;
    out[0] = '\0';
    for (l = 0; l <= MNISTCU_MAX_LAYERS && sizes[l] != 0; ++l) {
        int n = snprintf(out + len, size - len, l ? "-%d" : "%d", sizes[l]);
        if (n < 0 || (size_t)n >= size - len) break;
        len += (size_t)n;
    }
}

static const char *act_name(mnistcu_act act)
{
    switch (act) {
    case MNISTCU_ACT_TANH: return "tanh";
    case MNISTCU_ACT_SIGMOID: return "sigmoid";
    case MNISTCU_ACT_IDENTITY: return "identity";
    default: return "relu";
    }
}

static const char *norm_name(mnistcu_norm norm)
{
    switch (norm) {
    case MNISTCU_NORM_NONE: return "none";
    case MNISTCU_NORM_STANDARD: return "standard";
    default: return "unit";
    }
}

/* ==========================================================================
   Options of train and eval

   One table lists every option: its name, whether it takes a value, and the
   commands that accept it. parse_options() looks each argument up in the
   table, fetches its value, and a switch stores it.
   ========================================================================== */

enum { CMD_TRAIN = 1, CMD_EVAL = 2, CMD_BOTH = CMD_TRAIN | CMD_EVAL };

typedef enum option_id {
    OPT_HELP, OPT_DATA, OPT_DATASET, OPT_MODEL, OPT_LAYERS, OPT_ACT, OPT_NORM, OPT_LIMIT, OPT_DEVICE, OPT_THREADS, OPT_QUIET,
    OPT_EPOCHS, OPT_BATCH, OPT_LR, OPT_MOMENTUM, OPT_NESTEROV, OPT_WEIGHT_DECAY, OPT_SEED, OPT_VAL, OPT_NO_SHUFFLE,
    OPT_PROGRESS_EVERY, OPT_SAVE_WEIGHTS, OPT_WEIGHTS, OPT_SCHEDULE, OPT_WARMUP, OPT_PER_STEP, OPT_EARLY_STOP,
    OPT_LOG, OPT_LOG_EVERY, OPT_PLOT, OPT_INIT, OPT_OPTIM, OPT_BETAS, OPT_EPS, OPT_AMSGRAD, OPT_ALPHA, OPT_CENTERED,
    OPT_DAMPENING, OPT_LR_DECAY, OPT_INITIAL_ACC, OPT_L2, OPT_CLIP, OPT_LOSS, OPT_LABEL_SMOOTHING, OPT_MARGIN,
    OPT_HINGE_P, OPT_REDUCTION, OPT_AUGMENT, OPT_SAVE, OPT_SAVE_LOGITS, OPT_CHECKPOINT, OPT_CHECKPOINT_EVERY,
    OPT_CHECKPOINT_EVERY_STEPS, OPT_KEEP_CHECKPOINTS, OPT_CHECKPOINT_BEST, OPT_RESUME, OPT_NO_FUSED, OPT_NO_GRAPH,
    OPT_PRECISION, OPT_NO_HEAD, OPT_NO_FUSED_UPDATE, OPT_FUSED_CNN, OPT_FUSED_MLP_CLUSTERS
} option_id;

typedef struct option_spec {
    const char *name;
    option_id id;
    int takes_value;
    int commands; /* CMD_TRAIN, CMD_EVAL or both */
} option_spec;

static const option_spec option_table[] = {
    {"--help", OPT_HELP, 0, CMD_BOTH},
    {"--data", OPT_DATA, 1, CMD_BOTH},
    {"--dataset", OPT_DATASET, 1, CMD_BOTH},
    {"--model", OPT_MODEL, 1, CMD_BOTH},
    {"--layers", OPT_LAYERS, 1, CMD_BOTH},
    {"--act", OPT_ACT, 1, CMD_BOTH},
    {"--norm", OPT_NORM, 1, CMD_BOTH},
    {"--limit", OPT_LIMIT, 1, CMD_BOTH},
    {"--device", OPT_DEVICE, 1, CMD_BOTH},
    {"--threads", OPT_THREADS, 1, CMD_BOTH},
    {"--precision", OPT_PRECISION, 1, CMD_BOTH},
    {"--quiet", OPT_QUIET, 0, CMD_BOTH},
    {"--epochs", OPT_EPOCHS, 1, CMD_TRAIN},
    {"--batch", OPT_BATCH, 1, CMD_TRAIN},
    {"--lr", OPT_LR, 1, CMD_TRAIN},
    {"--momentum", OPT_MOMENTUM, 1, CMD_TRAIN},
    {"--nesterov", OPT_NESTEROV, 0, CMD_TRAIN},
    {"--schedule", OPT_SCHEDULE, 1, CMD_TRAIN},
    {"--warmup", OPT_WARMUP, 1, CMD_TRAIN},
    {"--per-step", OPT_PER_STEP, 0, CMD_TRAIN},
    {"--early-stop", OPT_EARLY_STOP, 1, CMD_TRAIN},
    {"--log", OPT_LOG, 1, CMD_TRAIN},
    {"--log-every", OPT_LOG_EVERY, 1, CMD_TRAIN},
    {"--plot", OPT_PLOT, 1, CMD_TRAIN},
    {"--init", OPT_INIT, 1, CMD_TRAIN},
    {"--weight-decay", OPT_WEIGHT_DECAY, 1, CMD_TRAIN},
    {"--seed", OPT_SEED, 1, CMD_TRAIN},
    {"--val", OPT_VAL, 1, CMD_TRAIN},
    {"--no-shuffle", OPT_NO_SHUFFLE, 0, CMD_TRAIN},
    {"--no-fused", OPT_NO_FUSED, 0, CMD_TRAIN},
    {"--no-graph", OPT_NO_GRAPH, 0, CMD_TRAIN},
    {"--no-head", OPT_NO_HEAD, 0, CMD_TRAIN},
    {"--no-fused-update", OPT_NO_FUSED_UPDATE, 0, CMD_TRAIN},
    {"--fused-cnn", OPT_FUSED_CNN, 0, CMD_TRAIN},
    {"--fused-mlp-clusters", OPT_FUSED_MLP_CLUSTERS, 0, CMD_TRAIN},
    {"--progress-every", OPT_PROGRESS_EVERY, 1, CMD_TRAIN},
    {"--save-weights", OPT_SAVE_WEIGHTS, 1, CMD_TRAIN},
    {"--weights", OPT_WEIGHTS, 1, CMD_EVAL},
    {"--optim", OPT_OPTIM, 1, CMD_TRAIN},
    {"--betas", OPT_BETAS, 1, CMD_TRAIN},
    {"--eps", OPT_EPS, 1, CMD_TRAIN},
    {"--amsgrad", OPT_AMSGRAD, 0, CMD_TRAIN},
    {"--alpha", OPT_ALPHA, 1, CMD_TRAIN},
    {"--centered", OPT_CENTERED, 0, CMD_TRAIN},
    {"--dampening", OPT_DAMPENING, 1, CMD_TRAIN},
    {"--lr-decay", OPT_LR_DECAY, 1, CMD_TRAIN},
    {"--initial-accumulator", OPT_INITIAL_ACC, 1, CMD_TRAIN},
    {"--l2", OPT_L2, 1, CMD_TRAIN},
    {"--clip", OPT_CLIP, 1, CMD_TRAIN},
    {"--loss", OPT_LOSS, 1, CMD_BOTH},
    {"--label-smoothing", OPT_LABEL_SMOOTHING, 1, CMD_BOTH},
    {"--margin", OPT_MARGIN, 1, CMD_BOTH},
    {"--hinge-p", OPT_HINGE_P, 1, CMD_BOTH},
    {"--reduction", OPT_REDUCTION, 1, CMD_BOTH},
    {"--augment", OPT_AUGMENT, 1, CMD_TRAIN},
    {"--save", OPT_SAVE, 1, CMD_TRAIN},
    {"--save-logits", OPT_SAVE_LOGITS, 1, CMD_EVAL},
    {"--checkpoint", OPT_CHECKPOINT, 1, CMD_TRAIN},
    {"--checkpoint-every", OPT_CHECKPOINT_EVERY, 1, CMD_TRAIN},
    {"--checkpoint-every-steps", OPT_CHECKPOINT_EVERY_STEPS, 1, CMD_TRAIN},
    {"--keep-checkpoints", OPT_KEEP_CHECKPOINTS, 1, CMD_TRAIN},
    {"--checkpoint-best", OPT_CHECKPOINT_BEST, 0, CMD_TRAIN},
    {"--resume", OPT_RESUME, 1, CMD_TRAIN},
};

typedef struct cli_options {
    /* data and model */
    const char *data_dir;
    const char *dataset;         /* "mnist" or "fashion" */
    int sizes[MNISTCU_MAX_LAYERS + 1];
    char layers[256];            /* the widths as text, "784-128-10" */
    const char *model;           /* --model: a preset or spec string; NULL: the MLP of --layers */
    char model_spec[1024];       /* the model's canonical spec, once made */
    mnistcu_act act;
    mnistcu_norm norm;
    size_t limit;                /* 0: every training sample */
    mnistcu_device device;
    mnistcu_precision precision; /* --precision */
    int threads;
    int quiet;
    /* training */
    int epochs;
    int batch;
    double lr, momentum, weight_decay;
    mnistcu_schedule_desc schedule; /* --schedule */
    const char *schedule_text;
    int warmup, per_step;           /* --warmup, --per-step */
    int early_stop;                 /* --early-stop */
    const char *log_path;           /* --log */
    size_t log_every;               /* --log-every */
    const char *plot_dir;           /* --plot */
    mnistcu_init init;              /* --init */
    int nesterov;
    int lr_given, weight_decay_given;
    mnistcu_optim_desc optim;       /* --optim and its options (lr, momentum, nesterov, weight decay above) */
    const char *optim_name;
    mnistcu_loss loss;              /* --loss */
    const char *loss_name;
    float label_smoothing, margin;
    int hinge_p, loss_sum;
    mnistcu_augment_desc augment;   /* --augment */
    const char *augment_text;
    uint64_t seed;
    size_t val;                  /* validation samples, 0: none */
    int no_shuffle;
    int no_fused;
    int no_graph;
    int no_head;
    int no_fused_update;
    int fused_cnn;
    int fused_mlp_clusters;
    long long progress_every;    /* -1: automatic */
    const char *save_weights;
    const char *save;            /* --save: the model file (safetensors) */
    const char *save_logits;     /* eval --save-logits */
    int model_file;              /* --model names a model file */
    const char *checkpoint;      /* --checkpoint */
    int checkpoint_every, keep_checkpoints, checkpoint_best;
    size_t checkpoint_every_steps;
    const char *resume;          /* --resume */
    const char *setting_given;   /* the first option given that --resume takes from the checkpoint */
    int epochs_given;
    /* evaluation */
    const char *weights;
} cli_options;

static void default_options(cli_options *o)
{
    memset(o, 0, sizeof *o);
    o->data_dir = "data";
    o->dataset = "mnist";
    parse_layers("784-128-10", o->sizes);
    format_layers(o->sizes, o->layers, sizeof o->layers);
    o->act = MNISTCU_ACT_RELU;
    o->norm = MNISTCU_NORM_STANDARD; /* the library's default for uint8 images */
    o->device = MNISTCU_DEVICE_AUTO;
    o->epochs = 10;
    o->batch = 64;
    o->lr = 0.1;
    o->optim_name = "sgd";
    o->optim.kind = MNISTCU_OPTIM_SGD;
    o->loss = MNISTCU_LOSS_SOFTMAX_CE;
    o->loss_name = "ce";
    o->seed = 1;
    o->progress_every = -1;
}

/* A number in [lo, hi] into a float; open_hi: hi itself excluded. */
static int parse_range(const char *opt, const char *text, double lo, double hi, int open_hi, float *out)
{
    double x;
    if (!parse_number(opt, text, &x)) return 0;
    if (!(x >= lo && (open_hi ? x < hi : x <= hi))) {
        usage_error("%s: expected a value in [%g, %g%s, got '%s'", opt, lo, hi, open_hi ? ")" : "]", text);
        return 0;
    }
    *out = (float)x;
    return 1;
}

/* --augment: none, affine, elastic, all, or KEY=VALUE[,KEY=VALUE...] with keys
   rotate (degrees), scale, shift (pixels), elastic (alpha), sigma. */
static int parse_augment(const char *v, cli_options *o)
{
    mnistcu_augment_desc *a = &o->augment;
    const char *p = v;
    memset(a, 0, sizeof *a);
    o->augment_text = v;
    if (strcmp(v, "none") == 0) {
        o->augment_text = NULL;
        return 1;
    }
    if (strcmp(v, "affine") == 0 || strcmp(v, "all") == 0) {
        a->rotate = 10.0f;
        a->scale = 0.1f;
        a->translate = 2.0f;
    }
    if (strcmp(v, "elastic") == 0 || strcmp(v, "all") == 0) {
        a->elastic_alpha = 34.0f;
        a->elastic_sigma = 4.0f;
    }
    if (strcmp(v, "affine") == 0 || strcmp(v, "elastic") == 0 || strcmp(v, "all") == 0) return 1;
    while (*p) {
        static const char *const keys[] = {"rotate", "scale", "shift", "elastic", "sigma"};
        static const double hi[] = {90.0, 0.5, 64.0, 1000.0, 8.0};
        float *dst[5];
        char *end;
        double x;
        int k;
        size_t len;
        dst[0] = &a->rotate; dst[1] = &a->scale; dst[2] = &a->translate; dst[3] = &a->elastic_alpha;
        dst[4] = &a->elastic_sigma;
        for (k = 0; k < 5; ++k) {
            len = strlen(keys[k]);
            if (strncmp(p, keys[k], len) == 0 && p[len] == '=') break;
        }
        if (k == 5) break;
        x = strtod(p + len + 1, &end);
        if (end == p + len + 1 || !(x >= 0.0 && x <= hi[k]) || (*end != ',' && *end != '\0') ||
            (k == 4 && x != 0.0 && x < 0.5))
            break;
        *dst[k] = (float)x;
        p = *end ? end + 1 : end;
        if (!*p) return 1;
    }
    usage_error("--augment: expected none, affine, elastic, all, or KEY=VALUE,... with rotate (0..90 degrees), scale "
                "(0..0.5), shift (0..64 pixels), elastic (alpha, 0..1000), sigma (0.5..8), got '%s'", v);
    return 0;
}

/* Stores one option's value; 0 (after a usage message) when it is invalid. */
static int set_option(cli_options *o, const char *name, option_id id, const char *v)
{
    long long n;
    switch (id) {
    case OPT_HELP: return 1; /* handled by the caller */
    case OPT_DATA: o->data_dir = v; return 1;
    case OPT_DATASET:
        if (strcmp(v, "mnist") == 0) o->dataset = "mnist";
        else if (strcmp(v, "fashion") == 0 || strcmp(v, "fashion-mnist") == 0) o->dataset = "fashion";
        else break;
        return 1;
    case OPT_MODEL:
        if (!v[0]) break;
        o->model = v;
        return 1;
    case OPT_LAYERS:
        if (!parse_layers(v, o->sizes)) return 0;
        format_layers(o->sizes, o->layers, sizeof o->layers);
        return 1;
    case OPT_ACT:
        if (strcmp(v, "relu") == 0) o->act = MNISTCU_ACT_RELU;
        else if (strcmp(v, "tanh") == 0) o->act = MNISTCU_ACT_TANH;
        else if (strcmp(v, "sigmoid") == 0) o->act = MNISTCU_ACT_SIGMOID;
        else if (strcmp(v, "identity") == 0) o->act = MNISTCU_ACT_IDENTITY;
        else break;
        return 1;
    case OPT_NORM:
        if (strcmp(v, "unit") == 0) o->norm = MNISTCU_NORM_UNIT;
        else if (strcmp(v, "standard") == 0) o->norm = MNISTCU_NORM_STANDARD;
        else if (strcmp(v, "none") == 0) o->norm = MNISTCU_NORM_NONE;
        else break;
        return 1;
    case OPT_DEVICE:
        if (strcmp(v, "auto") == 0) o->device = MNISTCU_DEVICE_AUTO;
        else if (strcmp(v, "cpu") == 0) o->device = MNISTCU_DEVICE_CPU;
        else if (strcmp(v, "cuda") == 0) o->device = MNISTCU_DEVICE_CUDA;
        else break;
        return 1;
    case OPT_LIMIT:
        if (!parse_integer(name, v, 1, 1LL << 40, &n)) return 0;
        o->limit = (size_t)n;
        return 1;
    case OPT_THREADS:
        if (!parse_integer(name, v, 0, 4096, &n)) return 0;
        o->threads = (int)n;
        return 1;
    case OPT_PRECISION:
        if (strcmp(v, "fp32") == 0) o->precision = MNISTCU_PRECISION_FP32;
        else if (strcmp(v, "tf32") == 0) o->precision = MNISTCU_PRECISION_TF32;
        else if (strcmp(v, "bf16") == 0) o->precision = MNISTCU_PRECISION_BF16;
        else if (strcmp(v, "tf32x3") == 0) o->precision = MNISTCU_PRECISION_TF32X3;
        else break;
        return 1;
    case OPT_QUIET: o->quiet = 1; return 1;
    case OPT_EPOCHS:
        if (!parse_integer(name, v, 1, 1000000, &n)) return 0;
        o->epochs = (int)n;
        return 1;
    case OPT_BATCH:
        if (!parse_integer(name, v, 1, 1000000, &n)) return 0;
        o->batch = (int)n;
        return 1;
    case OPT_LR:
        o->lr_given = 1;
        if (!parse_number(name, v, &o->lr)) return 0;
        /* (float) because a value that rounds to 0.0f would mean "default" to the library */
        if (!((float)o->lr > 0.0f)) {
            usage_error("--lr: the learning rate must be greater than 0, got '%s'", v);
            return 0;
        }
        return 1;
    case OPT_MOMENTUM:
        if (!parse_number(name, v, &o->momentum)) return 0;
        if (!(o->momentum >= 0.0 && (float)o->momentum < 1.0f)) {
            usage_error("--momentum: expected a value in [0, 1), got '%s'", v);
            return 0;
        }
        return 1;
    case OPT_NESTEROV: o->nesterov = 1; return 1;
    case OPT_WARMUP:
        if (!parse_integer(name, v, 0, 1000000000, &n)) return 0;
        o->warmup = (int)n;
        return 1;
    case OPT_PER_STEP: o->per_step = 1; return 1;
    case OPT_EARLY_STOP:
        if (!parse_integer(name, v, 1, 1000000, &n)) return 0;
        o->early_stop = (int)n;
        return 1;
    case OPT_LOG: o->log_path = v; return 1;
    case OPT_PLOT: o->plot_dir = v; return 1;
    case OPT_INIT:
        if (strcmp(v, "torch") == 0) o->init = MNISTCU_INIT_TORCH;
        else if (strcmp(v, "he") == 0) o->init = MNISTCU_INIT_HE_UNIFORM;
        else if (strcmp(v, "he_normal") == 0) o->init = MNISTCU_INIT_HE_NORMAL;
        else if (strcmp(v, "xavier") == 0) o->init = MNISTCU_INIT_XAVIER_UNIFORM;
        else if (strcmp(v, "xavier_normal") == 0) o->init = MNISTCU_INIT_XAVIER_NORMAL;
        else break;
        return 1;
    case OPT_LOG_EVERY:
        if (!parse_integer(name, v, 1, 1LL << 40, &n)) return 0;
        o->log_every = (size_t)n;
        return 1;
    case OPT_SCHEDULE: {
        char *end;
        memset(&o->schedule, 0, sizeof o->schedule);
        o->schedule_text = v;
        if (strcmp(v, "constant") == 0) {
            o->schedule.kind = MNISTCU_SCHEDULE_CONSTANT;
            return 1;
        }
        if (strncmp(v, "step:", 5) == 0) {
            long step = strtol(v + 5, &end, 10);
            double gamma;
            if (end != v + 5 && *end == ':' && step >= 1 && step <= 1000000) {
                gamma = strtod(end + 1, &end);
                if (*end == '\0' && gamma > 0.0 && gamma <= 1.0) {
                    o->schedule.kind = MNISTCU_SCHEDULE_STEP;
                    o->schedule.step_size = (int)step;
                    o->schedule.gamma = (float)gamma;
                    return 1;
                }
            }
        } else if (strncmp(v, "multistep:", 10) == 0) {
            const char *q = v + 10;
            int k = 0, okm = 1;
            double gamma;
            while (okm) {
                long e = strtol(q, &end, 10);
                if (end == q || e < 1 || e > 1000000000 || k == MNISTCU_MAX_MILESTONES ||
                    (k && e <= o->schedule.milestones[k - 1]))
                    okm = 0;
                else o->schedule.milestones[k++] = (int)e;
                if (!okm || *end != ',') break;
                q = end + 1;
            }
            if (okm && *end == ':') {
                gamma = strtod(end + 1, &end);
                if (*end == '\0' && gamma > 0.0 && gamma <= 1.0) {
                    o->schedule.kind = MNISTCU_SCHEDULE_MULTISTEP;
                    o->schedule.gamma = (float)gamma;
                    return 1;
                }
            }
        } else if (strncmp(v, "exp:", 4) == 0 || strncmp(v, "expdecay:", 9) == 0) {
            int cont = v[3] == 'd';
            double x = strtod(v + (cont ? 9 : 4), &end);
            if (end != v + (cont ? 9 : 4) && *end == '\0' && (cont ? x >= 0.0 && x <= 1e6 : x > 0.0 && x <= 1.0)) {
                o->schedule.kind = cont ? MNISTCU_SCHEDULE_EXP_DECAY : MNISTCU_SCHEDULE_EXPONENTIAL;
                if (cont) o->schedule.decay = (float)x;
                else o->schedule.gamma = (float)x;
                return 1;
            }
        } else if (strcmp(v, "onecycle") == 0) {
            o->schedule.kind = MNISTCU_SCHEDULE_ONE_CYCLE;
            return 1;
        } else if (strncmp(v, "plateau", 7) == 0 && (v[7] == '\0' || v[7] == ':')) {
            long pat = 0;
            double fac = 0.0;
            end = (char *)v + 7;
            if (*end == ':' && ((pat = strtol(v + 8, &end, 10)) < 1)) pat = -1; /* 0 would mean the default */
            if (*end == ':') fac = strtod(end + 1, &end);
            if (*end == '\0' && pat >= 0 && pat <= 1000000 && fac >= 0.0 && fac < 1.0) {
                o->schedule.kind = MNISTCU_SCHEDULE_PLATEAU;
                o->schedule.patience = (int)pat;
                o->schedule.factor = (float)fac;
                return 1;
            }
        } else if (strncmp(v, "cosine", 6) == 0 && (v[6] == '\0' || v[6] == ':')) {
            double mn = 0.0;
            end = (char *)v + 6;
            if (*end == ':') mn = strtod(v + 7, &end);
            if (*end == '\0' && mn >= 0.0 && mn <= FLT_MAX) {
                o->schedule.kind = MNISTCU_SCHEDULE_COSINE;
                o->schedule.min_lr = (float)mn;
                return 1;
            }
        }
        usage_error("--schedule: expected constant, step:N:G (N >= 1, 0 < G <= 1), multistep:E1,E2,...:G (increasing "
                    "epochs), exp:G, expdecay:K, cosine[:MIN], onecycle or plateau[:P[:F]], got '%s'", v);
        return 0;
    }
    case OPT_WEIGHT_DECAY:
        o->weight_decay_given = 1;
        if (!parse_number(name, v, &o->weight_decay)) return 0;
        if (!(o->weight_decay >= 0.0)) {
            usage_error("--weight-decay: expected a value >= 0, got '%s'", v);
            return 0;
        }
        return 1;
    case OPT_SEED: return parse_u64(name, v, &o->seed);
    case OPT_VAL:
        if (!parse_integer(name, v, 0, 1LL << 40, &n)) return 0;
        o->val = (size_t)n;
        return 1;
    case OPT_NO_SHUFFLE: o->no_shuffle = 1; return 1;
    case OPT_NO_FUSED: o->no_fused = 1; return 1;
    case OPT_NO_GRAPH: o->no_graph = 1; return 1;
    case OPT_NO_HEAD: o->no_head = 1; return 1;
    case OPT_NO_FUSED_UPDATE: o->no_fused_update = 1; return 1;
    case OPT_FUSED_CNN: o->fused_cnn = 1; return 1;
    case OPT_FUSED_MLP_CLUSTERS: o->fused_mlp_clusters = 1; return 1;
    case OPT_PROGRESS_EVERY: return parse_integer(name, v, 0, 1LL << 40, &o->progress_every);
    case OPT_SAVE_WEIGHTS: o->save_weights = v; return 1;
    case OPT_SAVE: o->save = v; return 1;
    case OPT_CHECKPOINT: o->checkpoint = v; return 1;
    case OPT_CHECKPOINT_EVERY:
        if (!parse_integer(name, v, 1, 1000000, &n)) return 0;
        o->checkpoint_every = (int)n;
        return 1;
    case OPT_CHECKPOINT_EVERY_STEPS:
        if (!parse_integer(name, v, 1, 1LL << 40, &n)) return 0;
        o->checkpoint_every_steps = (size_t)n;
        return 1;
    case OPT_KEEP_CHECKPOINTS:
        if (!parse_integer(name, v, 1, 100000, &n)) return 0;
        o->keep_checkpoints = (int)n;
        return 1;
    case OPT_CHECKPOINT_BEST: o->checkpoint_best = 1; return 1;
    case OPT_RESUME: o->resume = v; return 1;
    case OPT_SAVE_LOGITS: o->save_logits = v; return 1;
    case OPT_WEIGHTS: o->weights = v; return 1;
    case OPT_OPTIM: {
        static const char *const names[] = {"sgd", "adam", "adamw", "rmsprop", "adagrad"};
        int k;
        for (k = 0; k < 5; ++k)
            if (strcmp(v, names[k]) == 0) {
                o->optim.kind = (mnistcu_optim)(MNISTCU_OPTIM_SGD + k);
                o->optim_name = names[k];
                return 1;
            }
        break;
    }
    case OPT_BETAS: {
        char *end;
        double b1 = strtod(v, &end), b2 = -1.0;
        if (*end == ',') b2 = strtod(end + 1, &end);
        if (*end != '\0' || !(b1 > 0.0 && b1 < 1.0 && b2 > 0.0 && b2 < 1.0)) {
            usage_error("--betas: expected B1,B2 with both in (0, 1), got '%s'", v);
            return 0;
        }
        o->optim.beta1 = (float)b1;
        o->optim.beta2 = (float)b2;
        return 1;
    }
    case OPT_EPS: return parse_range(name, v, 1e-30, 1.0, 0, &o->optim.eps);
    case OPT_AMSGRAD: o->optim.amsgrad = 1; return 1;
    case OPT_ALPHA: return parse_range(name, v, 1e-30, 1.0, 1, &o->optim.alpha);
    case OPT_CENTERED: o->optim.centered = 1; return 1;
    case OPT_DAMPENING: return parse_range(name, v, 0.0, 1.0, 0, &o->optim.dampening);
    case OPT_LR_DECAY: return parse_range(name, v, 0.0, 1e30, 0, &o->optim.lr_decay);
    case OPT_INITIAL_ACC: return parse_range(name, v, 0.0, 1e30, 0, &o->optim.initial_accumulator_value);
    case OPT_L2: return parse_range(name, v, 0.0, 1e30, 0, &o->optim.l2);
    case OPT_CLIP: return parse_range(name, v, 0.0, 1e30, 0, &o->optim.clip_norm);
    case OPT_LOSS: {
        static const char *const names[] = {"ce", "mse", "bce", "hinge"};
        int k;
        for (k = 0; k < 4; ++k)
            if (strcmp(v, names[k]) == 0) {
                o->loss = (mnistcu_loss)(MNISTCU_LOSS_SOFTMAX_CE + k);
                o->loss_name = names[k];
                return 1;
            }
        break;
    }
    case OPT_LABEL_SMOOTHING: return parse_range(name, v, 0.0, 1.0, 0, &o->label_smoothing);
    case OPT_MARGIN: return parse_range(name, v, 1e-30, 1e30, 0, &o->margin);
    case OPT_HINGE_P:
        if (!parse_integer(name, v, 1, 2, &n)) return 0;
        o->hinge_p = (int)n;
        return 1;
    case OPT_REDUCTION:
        if (strcmp(v, "mean") == 0) o->loss_sum = 0;
        else if (strcmp(v, "sum") == 0) o->loss_sum = 1;
        else break;
        return 1;
    case OPT_AUGMENT: return parse_augment(v, o);
    }
    /* The name-valued options that matched nothing end up here. */
    usage_error("%s: unknown value '%s'", name, v);
    return 0;
}

enum { PARSE_OK, PARSE_HELP, PARSE_ERROR };

/* The options whose values a resumed run takes from its checkpoint. */
static int resume_fixed(option_id id)
{
    switch (id) {
    case OPT_DATASET: case OPT_MODEL: case OPT_LAYERS: case OPT_ACT: case OPT_NORM: case OPT_LIMIT: case OPT_BATCH:
    case OPT_LR: case OPT_MOMENTUM: case OPT_NESTEROV: case OPT_WEIGHT_DECAY: case OPT_SEED: case OPT_VAL:
    case OPT_NO_SHUFFLE: case OPT_SCHEDULE: case OPT_WARMUP: case OPT_PER_STEP: case OPT_EARLY_STOP: case OPT_INIT:
    case OPT_OPTIM: case OPT_BETAS: case OPT_EPS: case OPT_AMSGRAD: case OPT_ALPHA: case OPT_CENTERED:
    case OPT_DAMPENING: case OPT_LR_DECAY: case OPT_INITIAL_ACC: case OPT_L2: case OPT_CLIP: case OPT_LOSS:
    case OPT_LABEL_SMOOTHING: case OPT_MARGIN: case OPT_HINGE_P: case OPT_REDUCTION: case OPT_AUGMENT:
        return 1;
    default: return 0;
    }
}

static int parse_options(int argc, char **argv, int command, cli_options *o)
{
    const char *command_name = command == CMD_TRAIN ? "train" : "eval";
    int i;
    default_options(o);
    for (i = 0; i < argc; ++i) {
        const char *arg = argv[i], *value = NULL, *eq;
        const option_spec *spec = NULL;
        char name[32];
        size_t name_len, k;

        /* Split "--name=value"; otherwise the value is the next argument. */
        eq = strchr(arg, '=');
        name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (strncmp(arg, "--", 2) != 0) {
            usage_error("%s: unexpected argument '%s' (options start with --)", command_name, arg);
            return PARSE_ERROR;
        }
        if (name_len < sizeof name) {
            memcpy(name, arg, name_len);
            name[name_len] = '\0';
            for (k = 0; k < sizeof option_table / sizeof option_table[0]; ++k)
                if (strcmp(option_table[k].name, name) == 0) spec = &option_table[k];
        }
        if (!spec || !(spec->commands & command)) {
            usage_error("%s: unknown option '%.*s'", command_name, (int)name_len, arg);
            return PARSE_ERROR;
        }
        if (spec->id == OPT_HELP) return PARSE_HELP;
        if (!spec->takes_value) {
            if (eq) {
                usage_error("%s takes no value", name);
                return PARSE_ERROR;
            }
        } else if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            usage_error("%s needs a value", name);
            return PARSE_ERROR;
        }
        if (!set_option(o, name, spec->id, value)) return PARSE_ERROR;
        if (spec->id == OPT_EPOCHS) o->epochs_given = 1;
        if (!o->setting_given && resume_fixed(spec->id)) o->setting_given = spec->name;
    }
    if (o->resume && o->setting_given) {
        usage_error("%s: --resume takes the model, the data and the training settings from the checkpoint (only "
                    "--epochs, the checkpoint, output and device options may be given)", o->setting_given);
        return PARSE_ERROR;
    }
    if ((o->checkpoint_every || o->checkpoint_every_steps || o->keep_checkpoints || o->checkpoint_best) &&
        !o->checkpoint && !o->resume) {
        usage_error("--checkpoint-every, --checkpoint-every-steps, --keep-checkpoints and --checkpoint-best need "
                    "--checkpoint FILE");
        return PARSE_ERROR;
    }

    /* Checks that involve several options. */
    if (o->nesterov && o->momentum == 0.0) {
        usage_error("--nesterov needs --momentum greater than 0");
        return PARSE_ERROR;
    }
    {
        mnistcu_optim k = o->optim.kind;
        int sgd = k == MNISTCU_OPTIM_SGD, adam = k == MNISTCU_OPTIM_ADAM || k == MNISTCU_OPTIM_ADAMW;
        const char *bad = NULL;
        if (o->momentum != 0.0 && !sgd && k != MNISTCU_OPTIM_RMSPROP) bad = "--momentum";
        else if ((o->nesterov || o->optim.dampening != 0.0f) && !sgd) bad = o->nesterov ? "--nesterov" : "--dampening";
        else if ((o->optim.beta1 != 0.0f || o->optim.amsgrad) && !adam) bad = o->optim.amsgrad ? "--amsgrad" : "--betas";
        else if ((o->optim.alpha != 0.0f || o->optim.centered) && k != MNISTCU_OPTIM_RMSPROP)
            bad = o->optim.centered ? "--centered" : "--alpha";
        else if ((o->optim.lr_decay != 0.0f || o->optim.initial_accumulator_value != 0.0f) &&
                 k != MNISTCU_OPTIM_ADAGRAD)
            bad = o->optim.lr_decay != 0.0f ? "--lr-decay" : "--initial-accumulator";
        else if (o->optim.eps != 0.0f && sgd) bad = "--eps";
        if (bad) {
            usage_error("%s is not an option of --optim %s", bad, o->optim_name);
            return PARSE_ERROR;
        }
        if (o->nesterov && o->optim.dampening != 0.0f) {
            usage_error("--nesterov needs --dampening 0");
            return PARSE_ERROR;
        }
        if (!o->lr_given) o->lr = k == MNISTCU_OPTIM_SGD ? 0.1 : adam ? 0.001 : 0.01;
        if (!o->weight_decay_given && k == MNISTCU_OPTIM_ADAMW) o->weight_decay = 0.01;
    }
    if ((o->label_smoothing != 0.0f && o->loss != MNISTCU_LOSS_SOFTMAX_CE) ||
        ((o->margin != 0.0f || o->hinge_p) && o->loss != MNISTCU_LOSS_HINGE)) {
        usage_error("%s is not an option of --loss %s", o->label_smoothing != 0.0f ? "--label-smoothing"
                                                        : o->margin != 0.0f ? "--margin" : "--hinge-p", o->loss_name);
        return PARSE_ERROR;
    }
    if (o->model) { /* a file (a saved model) or a spec */
        FILE *f = fopen(o->model, "rb");
        o->model_file = f != NULL;
        if (f) fclose(f);
    }
    if (command == CMD_EVAL && !o->weights && !o->model_file) {
        usage_error("eval needs --model FILE (written by train --save) or --weights FILE (train --save-weights)");
        return PARSE_ERROR;
    }
    if (o->model_file && o->weights) {
        usage_error("--weights goes with a spec in --model, not with a model file (%s)", o->model);
        return PARSE_ERROR;
    }
    return PARSE_OK;
}

/* ==========================================================================
   Context, datasets and model
   ========================================================================== */

static int create_context(mnistcu_device device, uint64_t seed, int threads, mnistcu_precision precision,
                          mnistcu_ctx **ctx)
{
    mnistcu_ctx_desc desc;
    mnistcu_result r;
    memset(&desc, 0, sizeof desc); /* zero = default for every field */
    desc.device = device;
    desc.seed = seed;
    desc.threads = threads;
    desc.precision = precision;
    desc.log_level = MNISTCU_LOG_WARN; /* no INFO lines: we print our own progress */
    desc.log = cli_log;
    r = mnistcu_ctx_create(ctx, &desc); /* on failure *ctx may still hold the message */
    return !failed(*ctx, r);
}

/* The precision the context's matrix products use (after resolution). */
static const char *precision_name(const mnistcu_ctx *ctx)
{
    mnistcu_ctx_desc d;
    memset(&d, 0, sizeof d);
    mnistcu_ctx_resolved_desc(ctx, &d);
    return d.precision == MNISTCU_PRECISION_TF32     ? "tf32"
           : d.precision == MNISTCU_PRECISION_BF16   ? "bf16"
           : d.precision == MNISTCU_PRECISION_TF32X3 ? "tf32x3"
                                                     : "fp32";
}

/* Loads DIR/mnist or DIR/fashion-mnist, train or test split. */
static int load_split(mnistcu_ctx *ctx, const cli_options *o, mnistcu_split split, mnistcu_dataset **out)
{
    mnistcu_dataset_desc desc;
    mnistcu_result r;
    char dir[4096];
    int n = snprintf(dir, sizeof dir, "%s/%s", o->data_dir,
                     strcmp(o->dataset, "fashion") == 0 ? "fashion-mnist" : "mnist");
    if (n < 0 || (size_t)n >= sizeof dir) {
        cli_error("invalid_argument", "--data: folder name too long");
        return 0;
    }
    memset(&desc, 0, sizeof desc);
    desc.dir = dir;
    desc.split = split;
    desc.norm = o->norm;
    desc.limit = split == MNISTCU_SPLIT_TRAIN ? o->limit : 0; /* --limit trims the training set only */
    r = mnistcu_dataset_load(ctx, &desc, out);
    if (failed(ctx, r)) {
        if (r == MNISTCU_ERR_NOT_FOUND)
            fprintf(stderr, "mnistcu: hint: run `make data` first (it fetches MNIST and Fashion-MNIST into data/),\n"
                            "               or point --data at the folder that holds mnist/ and fashion-mnist/\n");
        return 0;
    }
    return 1;
}

/* The model of --model (a spec without an input shape takes the data's), or the MLP of --layers. */
static void set_loss(const cli_options *o, mnistcu_model_desc *d)
{
    d->loss = o->loss;
    d->label_smoothing = o->label_smoothing;
    d->margin = o->margin;
    d->hinge_p = o->hinge_p;
    d->loss_sum = o->loss_sum;
}

static int create_model(mnistcu_ctx *ctx, cli_options *o, const mnistcu_dataset *data, mnistcu_model **net)
{
    mnistcu_model_desc desc;
    mnistcu_result r;
    if (o->model_file) { /* everything comes from the file: architecture, weights, normalisation, loss */
        r = mnistcu_model_load(ctx, o->model, net);
    } else if (o->model) {
        char spec[1200];
        const char *s = o->model;
        while (*s == ' ') ++s;
        if (*s < '0' || *s > '9') {
            if (mnistcu_model_desc_parse(ctx, s, &desc) != MNISTCU_OK) { /* no input shape: the data's */
                mnistcu_dataset_info di;
                mnistcu_dataset_info_get(data, &di);
                mnistcu_ctx_clear_error(ctx);
                if (snprintf(spec, sizeof spec, "1x%dx%d %s", di.rows, di.cols, s) >= (int)sizeof spec) {
                    fprintf(stderr, "mnistcu: error: --model: spec too long\n");
                    return 0;
                }
                s = spec;
            }
        }
        r = mnistcu_model_desc_parse(ctx, s, &desc);
        if (r == MNISTCU_OK) {
            desc.init = o->init;
            set_loss(o, &desc);
            r = mnistcu_model_create(ctx, &desc, net);
        }
    } else {
        memset(&desc, 0, sizeof desc);
        memcpy(desc.sizes, o->sizes, sizeof desc.sizes);
        desc.hidden_act = o->act;
        desc.init = o->init;
        set_loss(o, &desc);
        r = mnistcu_model_create(ctx, &desc, net);
    }
    if (failed(ctx, r)) return 0;
    mnistcu_model_spec(*net, o->model_spec, sizeof o->model_spec);
    return 1;
}

/* The datasets' class names, kept in model files (a loaded model keeps its own). */
static void set_class_names(mnistcu_model *net, const cli_options *o)
{
    static const char *const fashion[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                            "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
    static const char *const digits[10] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
    mnistcu_model_info mi;
    mnistcu_model_info_get(net, &mi);
    if (mi.classes != 10 || mnistcu_model_class_name(net, 0)) return;
    mnistcu_model_set_class_names(net, strcmp(o->dataset, "fashion") == 0 ? fashion : digits, 10);
}

/* The layers, one line each: what a model summary shows. */
static void print_layer_table_to(FILE *out, const mnistcu_model *net)
{
    mnistcu_model_info info;
    int i;
    mnistcu_model_info_get(net, &info);
    fprintf(out, "  #  layer                 torch          output        params\n");
    for (i = 0; i < info.layer_count; ++i) {
        mnistcu_layer_info li;
        char shape[48];
        if (mnistcu_model_layer_info(net, i, &li) != MNISTCU_OK) return;
        if (li.out_shape[1] == 1 && li.out_shape[2] == 1) snprintf(shape, sizeof shape, "%d", li.out_shape[0]);
        else snprintf(shape, sizeof shape, "%dx%dx%d", li.out_shape[0], li.out_shape[1], li.out_shape[2]);
        fprintf(out, "%3d  %-20s  %-13s  %-12s  %7zu\n", i, li.spec, li.torch_name, shape, li.num_params);
    }
    fprintf(out, "     input %dx%dx%d, %zu parameters", info.input_shape[0], info.input_shape[1],
            info.input_shape[2], info.num_params);
    if (info.num_buffers) fprintf(out, ", %zu running statistics", info.num_buffers);
    fprintf(out, "\n");
}

static void print_layer_table(const mnistcu_model *net) { print_layer_table_to(stderr, net); }

/* ==========================================================================
   Progress on stderr

   On a terminal: one line redrawn in place with '\r' while an epoch runs,
   replaced by a permanent line when it ends. Elsewhere (a file, a pipe, CI
   logs): only the permanent per-epoch lines.
   ========================================================================== */

#define BAR_WIDTH 20

/* One epoch's figures, kept for --plot. */
typedef struct epoch_row { double train_loss, train_acc, val_loss, val_acc; int has_val; } epoch_row;

typedef struct progress_state {
    int tty;              /* stderr is a terminal */
    int quiet;            /* --quiet: record, print nothing */
    int line_len;         /* characters of the progress bar now on screen; 0: none */
    double prev_seconds;  /* training time at the end of the previous epoch */
    epoch_row *rows;      /* every epoch's figures, for --plot */
    int nrows, caprows;
} progress_state;

static int digits(long long v)
{
    int d = 1;
    while (v >= 10) {
        v /= 10;
        ++d;
    }
    return d;
}

/* Blanks the progress bar, so the next output starts on a clean line. */
static void progress_clear(progress_state *s)
{
    if (s->line_len > 0) {
        fprintf(stderr, "\r%*s\r", s->line_len, "");
        s->line_len = 0;
    }
}

static void progress_draw_bar(progress_state *s, const mnistcu_progress *p)
{
    char bar[BAR_WIDTH + 1], line[256];
    size_t filled = BAR_WIDTH * p->step / p->steps;
    int len;
    memset(bar, '#', filled);
    memset(bar + filled, '.', BAR_WIDTH - filled);
    bar[BAR_WIDTH] = '\0';
    len = snprintf(line, sizeof line, "epoch %d/%d [%s] %zu/%zu loss %.4f acc %.2f%% %.0f img/s", p->epoch, p->epochs,
                   bar, p->step, p->steps, p->train_loss, 100.0 * p->train_accuracy, p->images_per_second);
    if (len < 0) return;
    if (len >= (int)sizeof line) len = (int)sizeof line - 1;
    /* Overwrite the previous line; pad with spaces if it was longer. */
    fprintf(stderr, "\r%s%*s", line, s->line_len > len ? s->line_len - len : 0, "");
    fflush(stderr);
    s->line_len = len;
}

/* The mnistcu_progress_fn given to mnistcu_train. Returning non-zero would stop training. */
static int on_progress(void *user, const mnistcu_progress *p)
{
    progress_state *s = (progress_state *)user;
    double epoch_seconds;
    if (!p->epoch_end) {
        if (s->tty && !s->quiet) progress_draw_bar(s, p);
        return 0;
    }
    if (s->nrows == s->caprows) { /* keep the epoch's figures (a failed grow only loses plot points) */
        int cap = s->caprows ? 2 * s->caprows : 64;
        epoch_row *r = (epoch_row *)realloc(s->rows, (size_t)cap * sizeof *r);
        if (r) {
            s->rows = r;
            s->caprows = cap;
        }
    }
    if (s->nrows < s->caprows) {
        epoch_row *r = &s->rows[s->nrows++];
        r->train_loss = p->train_loss;
        r->train_acc = p->train_accuracy;
        r->val_loss = p->val_loss;
        r->val_acc = p->val_accuracy;
        r->has_val = p->has_validation;
    }
    if (s->quiet) return 0;
    progress_clear(s);
    epoch_seconds = p->seconds - s->prev_seconds;
    s->prev_seconds = p->seconds;
    fprintf(stderr, "epoch %*d/%d  loss %.4f  acc %6.2f%%", digits(p->epochs), p->epoch, p->epochs, p->train_loss,
            100.0 * p->train_accuracy);
    if (p->has_validation)
        fprintf(stderr, "  val loss %.4f  val acc %6.2f%%", p->val_loss, 100.0 * p->val_accuracy);
    fprintf(stderr, "  %.2f s  %.0f img/s  lr %g\n", epoch_seconds, p->images_per_second, p->learning_rate);
    return 0;
}

/* ==========================================================================
   Results: confusion matrix and JSON
   ========================================================================== */

/* Rows: true labels; columns: predictions; the last column is the per-class accuracy. */
static void print_confusion(const int64_t *confusion, size_t classes)
{
    size_t t, p;
    int64_t largest = 0;
    int w;
    if (classes > 20) {
        fprintf(stderr, "(confusion matrix omitted: %zu classes)\n", classes);
        return;
    }
    for (t = 0; t < classes * classes; ++t)
        if (confusion[t] > largest) largest = confusion[t];
    w = digits(largest) + 1;
    if (w < 4) w = 4;

    fprintf(stderr, "confusion matrix (rows: true label, columns: predicted label)\n     ");
    for (p = 0; p < classes; ++p) fprintf(stderr, "%*zu", w, p);
    fprintf(stderr, "   accuracy\n");
    for (t = 0; t < classes; ++t) {
        int64_t row_total = 0;
        fprintf(stderr, "%4zu ", t);
        for (p = 0; p < classes; ++p) {
            fprintf(stderr, "%*lld", w, (long long)confusion[t * classes + p]);
            row_total += confusion[t * classes + p];
        }
        if (row_total > 0)
            fprintf(stderr, "   %6.2f%%\n", 100.0 * (double)confusion[t * classes + t] / (double)row_total);
        else
            fprintf(stderr, "   %7s\n", "-");
    }
}

static void print_fashion_legend(void)
{
    fprintf(stderr, "classes: 0 T-shirt/top, 1 trouser, 2 pullover, 3 dress, 4 coat, 5 sandal, 6 shirt, "
                    "7 sneaker, 8 bag, 9 ankle boot\n");
}

/* Evaluates on `test`, printing the summary and confusion matrix unless quiet. */
static int evaluate_and_report(mnistcu_ctx *ctx, mnistcu_model *net, const mnistcu_dataset *test,
                               const cli_options *o, mnistcu_metrics *m)
{
    size_t classes;
    mnistcu_model_info info;
    int64_t *confusion;
    int ok;
    mnistcu_model_info_get(net, &info);
    classes = info.classes;
    confusion = (int64_t *)malloc(classes * classes * sizeof *confusion);
    if (!confusion) {
        cli_error("out_of_memory", "out of memory for the confusion matrix");
        return 0;
    }
    ok = !failed(ctx, mnistcu_evaluate(net, test, m, confusion));
    if (ok && !o->quiet) {
        fprintf(stderr, "test  loss %.4f  accuracy %.2f%%  (%zu of %zu correct)\n", m->loss, 100.0 * m->accuracy,
                m->correct, m->count);
        print_confusion(confusion, classes);
        if (strcmp(o->dataset, "fashion") == 0) print_fashion_legend();
    }
    free(confusion);
    return ok;
}

/* JSON output. Every line must parse, whatever the values: JSON has no NaN or
   infinity, so a number that is not finite is written as null; and a string
   is UTF-8 with " \ and control characters escaped. Names of files come from
   the user and can hold any bytes: valid UTF-8 passes through unchanged, and
   each byte that is not part of a valid UTF-8 sequence is written as \u00XX
   (read as Latin-1, the likeliest older encoding of such a name). */

/* The length of the valid UTF-8 sequence of 2 to 4 bytes at s, or 0 when the
   bytes there are not one: RFC 3629, so no overlong forms, no surrogates,
   nothing above U+10FFFF. It stops at the first byte that does not fit, so it
   never reads past a terminating zero. */
static int utf8_sequence(const unsigned char *s)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) lo = 0xA0; /* overlong below U+0800 */
        if (c == 0xED) hi = 0x9F; /* U+D800 to U+DFFF are surrogates */
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) lo = 0x90; /* overlong below U+10000 */
        if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80 ? 4 : 0;
    }
    return 0;
}

/* Writes text as a JSON string (see above). */
static void json_string(FILE *f, const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    fputc('"', f);
    while (*s) {
        unsigned char c = *s;
        int n = 1;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else if (c < 0x80) fputc(c, f);
        else if ((n = utf8_sequence(s)) > 0) fwrite(s, 1, (size_t)n, f);
        else {
            fprintf(f, "\\u%04x", c);
            n = 1;
        }
        s += n;
    }
    fputc('"', f);
}

/* ,"key":"value" */
static void json_field_str(const char *key, const char *value)
{
    printf(",\"%s\":", key);
    if (value) json_string(stdout, value);
    else printf("null");
}

/* ,"key":value in the printf format fmt, or ,"key":null when it is not finite. */
static void json_field_num(const char *key, const char *fmt, double value)
{
    printf(",\"%s\":", key);
    if (isfinite(value)) printf(fmt, value);
    else printf("null");
}

/* ,"error":"diverged","message":"..." from the error that ended the run. */
static void json_error_fields(void)
{
    json_field_str("error", last_error.kind[0] ? last_error.kind : "error");
    json_field_str("message", last_error.message);
}

/* ==========================================================================
   Weights files: raw little-endian float32, no header (see --help)

   Bytes are assembled by hand so the file is the same on every machine,
   whatever the host's byte order.
   ========================================================================== */

static void float_to_le(float f, unsigned char b[4])
{
    uint32_t u;
    memcpy(&u, &f, 4);
    b[0] = (unsigned char)(u & 0xFF);
    b[1] = (unsigned char)((u >> 8) & 0xFF);
    b[2] = (unsigned char)((u >> 16) & 0xFF);
    b[3] = (unsigned char)((u >> 24) & 0xFF);
}

static float float_from_le(const unsigned char b[4])
{
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int save_weights(mnistcu_ctx *ctx, const mnistcu_model *net, const char *path)
{
    size_t count = mnistcu_model_num_params(net), i;
    float *params = (float *)malloc(count * sizeof *params);
    unsigned char *bytes = (unsigned char *)malloc(count * 4);
    FILE *f = NULL;
    int ok = 0;
    if (!params || !bytes) {
        cli_error("out_of_memory", "out of memory for %zu parameters", count);
        goto done;
    }
    if (failed(ctx, mnistcu_model_get_params(net, params, count))) goto done;
    for (i = 0; i < count; ++i) float_to_le(params[i], bytes + 4 * i);
    f = fopen(path, "wb");
    if (!f) {
        cli_error("io", "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    if (fwrite(bytes, 4, count, f) != count) {
        cli_error("io", "%s: write failed: %s", path, strerror(errno));
        goto done;
    }
    ok = 1;
done:
    if (f && fclose(f) != 0 && ok) {
        cli_error("io", "%s: write failed: %s", path, strerror(errno));
        ok = 0;
    }
    free(params);
    free(bytes);
    return ok;
}

static int load_weights(mnistcu_ctx *ctx, mnistcu_model *net, const char *path, const char *layers)
{
    size_t count = mnistcu_model_num_params(net), i;
    float *params = NULL;
    unsigned char *bytes = NULL;
    long size;
    int ok = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_error("io", "%s: cannot open: %s", path, strerror(errno));
        return 0;
    }
    /* The file must hold exactly one float32 per parameter of this model. */
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        cli_error("io", "%s: cannot determine the file size", path);
        goto done;
    }
    if ((unsigned long)size != (unsigned long)(count * 4)) {
        cli_error("shape",
                  "%s: %ld bytes, but a %s model has %zu parameters (%zu bytes);\n"
                  "               give eval the --model or --layers the weights were trained with",
                  path, size, layers, count, count * 4);
        goto done;
    }
    params = (float *)malloc(count * sizeof *params);
    bytes = (unsigned char *)malloc(count * 4);
    if (!params || !bytes) {
        cli_error("out_of_memory", "out of memory for %zu parameters", count);
        goto done;
    }
    if (fread(bytes, 4, count, f) != count) {
        cli_error("io", "%s: read failed", path);
        goto done;
    }
    for (i = 0; i < count; ++i) params[i] = float_from_le(bytes + 4 * i);
    ok = !failed(ctx, mnistcu_model_set_params(net, params, count));
done:
    fclose(f);
    free(params);
    free(bytes);
    return ok;
}


/* ==========================================================================
   --plot DIR: what training looked like, as files any viewer opens

   curves.svg          loss and accuracy per epoch, training and validation
   confusion.svg       the test confusion matrix as a heat map with counts
   misclassified.png   up to 100 misclassified test images, true > predicted
   filters.png         the first layer's weights: a dense layer's rows as
                       images, a conv layer's kernels enlarged
   Each is written to a temporary name and renamed, so a file under its real
   name is always whole. PNGs are 8-bit grayscale with stored (uncompressed)
   deflate blocks: simple, and readable by every decoder.
   ========================================================================== */

/* Writes bytes to path through path.tmp and a rename. */
static int write_atomically(const char *path, const unsigned char *data, size_t size)
{
    char tmp[4200];
    FILE *f;
    int ok;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return 0;
    if (!(f = fopen(tmp, "wb"))) return 0;
    ok = fwrite(data, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) remove(tmp);
    return ok;
}

typedef struct bytes_buf { unsigned char *p; size_t n, cap; int failed; } bytes_buf;

static void buf_put(bytes_buf *b, const void *data, size_t n)
{
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        unsigned char *q;
        while (cap < b->n + n) cap *= 2;
        if (!(q = (unsigned char *)realloc(b->p, cap))) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void buf_be32(bytes_buf *b, uint32_t v)
{
    unsigned char q[4];
    q[0] = (unsigned char)(v >> 24); q[1] = (unsigned char)(v >> 16); q[2] = (unsigned char)(v >> 8); q[3] = (unsigned char)v;
    buf_put(b, q, 4);
}

static void buf_printf(bytes_buf *b, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0) buf_put(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* A grayscale image w x h, one byte a pixel, as a PNG file. */
static int write_png(const char *path, const unsigned char *px, int w, int h)
{
    bytes_buf png = {NULL, 0, 0, 0}, z = {NULL, 0, 0, 0};
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    unsigned char hdr[13], zero = 0;
    size_t raw = (size_t)h * ((size_t)w + 1), done = 0, row;
    uint32_t a = 1, b2 = 0;
    int ok;
    /* zlib stream: header, stored blocks of the filtered rows (filter 0 each), Adler-32 */
    buf_put(&z, "\x78\x01", 2);
    while (done < raw || raw == 0) {
        size_t len = raw - done < 65535 ? raw - done : 65535, k;
        unsigned char bh[5];
        bh[0] = done + len == raw ? 1 : 0;
        bh[1] = (unsigned char)len; bh[2] = (unsigned char)(len >> 8);
        bh[3] = (unsigned char)~len; bh[4] = (unsigned char)(~len >> 8);
        buf_put(&z, bh, 5);
        for (k = 0; k < len; ++k) {
            size_t at = done + k, r = at / ((size_t)w + 1), c = at % ((size_t)w + 1);
            unsigned char v = c == 0 ? zero : px[r * (size_t)w + c - 1];
            buf_put(&z, &v, 1);
            a = (a + v) % 65521u;
            b2 = (b2 + a) % 65521u;
        }
        done += len;
        if (raw == 0) break;
    }
    buf_be32(&z, (b2 << 16) | a);
    hdr[0] = (unsigned char)(w >> 24); hdr[1] = (unsigned char)(w >> 16); hdr[2] = (unsigned char)(w >> 8); hdr[3] = (unsigned char)w;
    hdr[4] = (unsigned char)(h >> 24); hdr[5] = (unsigned char)(h >> 16); hdr[6] = (unsigned char)(h >> 8); hdr[7] = (unsigned char)h;
    hdr[8] = 8; hdr[9] = 0; hdr[10] = 0; hdr[11] = 0; hdr[12] = 0; /* 8-bit grayscale, no interlace */
    buf_put(&png, sig, 8);
#define PNG_CHUNK(type_, data_, n_)                                                                 \
    do {                                                                                            \
        uint32_t crc_ = mnistcu_crc32(mnistcu_crc32(0, type_, 4), (data_), (n_));                  \
        buf_be32(&png, (uint32_t)(n_));                                                             \
        buf_put(&png, type_, 4);                                                                    \
        buf_put(&png, (data_), (n_));                                                               \
        buf_be32(&png, crc_);                                                                       \
    } while (0)
    PNG_CHUNK("IHDR", hdr, 13);
    PNG_CHUNK("IDAT", z.p, z.n);
    PNG_CHUNK("IEND", "", 0);
#undef PNG_CHUNK
    (void)row;
    ok = !png.failed && !z.failed && write_atomically(path, png.p, png.n);
    free(png.p);
    free(z.p);
    return ok;
}

/* Digits 0-9 and '>' in a 3x5 font, a row a byte (bits 2..0, left to right). */
static const unsigned char glyphs[11][5] = {
    {7, 5, 5, 5, 7}, {2, 6, 2, 2, 7}, {7, 1, 7, 4, 7}, {7, 1, 3, 1, 7}, {5, 5, 7, 1, 1}, {7, 4, 7, 1, 7},
    {7, 4, 7, 5, 7}, {7, 1, 1, 2, 2}, {7, 5, 7, 5, 7}, {7, 5, 7, 1, 7}, {4, 2, 1, 2, 4}};

static void draw_glyph(unsigned char *img, int W, int x0, int y0, int g, int scale)
{
    int r, c, i, j;
    for (r = 0; r < 5; ++r)
        for (c = 0; c < 3; ++c)
            if (glyphs[g][r] & (4 >> c))
                for (i = 0; i < scale; ++i)
                    for (j = 0; j < scale; ++j) img[(size_t)(y0 + r * scale + i) * W + x0 + c * scale + j] = 255;
}

/* Draws a class number (0-255) at x, y; returns the x after it. */
static int draw_number(unsigned char *img, int W, int x, int y, int v)
{
    char t[8];
    int i;
    snprintf(t, sizeof t, "%d", v);
    for (i = 0; t[i]; ++i, x += 8) draw_glyph(img, W, x, y, t[i] - '0', 2);
    return x;
}

/* values [n] scaled to 0..255 from their own range. */
static void to_gray(const float *v, size_t n, unsigned char *out)
{
    float lo = v[0], hi = v[0];
    size_t i;
    for (i = 1; i < n; ++i) {
        if (v[i] < lo) lo = v[i];
        if (v[i] > hi) hi = v[i];
    }
    for (i = 0; i < n; ++i) out[i] = (unsigned char)(hi > lo ? 255.0f * (v[i] - lo) / (hi - lo) + 0.5f : 0);
}

static int plot_misclassified(mnistcu_ctx *ctx, mnistcu_model *net, const mnistcu_dataset *test, const char *path)
{
    mnistcu_dataset_info di;
    size_t n, i, F, shown = 0;
    float *x;
    int32_t *pred, label = 0;
    unsigned char *img, tile[4096];
    const int cols = 10, cw = 64, ch = 80;
    int ok = 0, W, H;
    mnistcu_dataset_info_get(test, &di);
    F = di.features;
    n = di.count < 3000 ? di.count : 3000;
    if (di.rows * di.cols != (int)F || F > sizeof tile) return 1; /* not images: nothing to show */
    x = (float *)malloc(n * F * sizeof(float));
    pred = (int32_t *)malloc(n * sizeof(int32_t));
    W = cols * cw;
    H = 10 * ch;
    img = (unsigned char *)calloc((size_t)W * H, 1);
    if (!x || !pred || !img) goto done;
    for (i = 0; i < n; ++i) mnistcu_dataset_sample(test, i, x + i * F, NULL);
    if (failed(ctx, mnistcu_predict(net, x, n, pred, NULL))) goto done;
    for (i = 0; i < n && shown < 100; ++i) {
        int r, c, x0, y0, s2 = 2, xx;
        mnistcu_dataset_sample(test, i, NULL, &label);
        if (label == pred[i]) continue;
        to_gray(x + i * F, F, tile);
        x0 = (int)(shown % cols) * cw + (cw - di.cols * s2) / 2;
        y0 = (int)(shown / cols) * ch + 2;
        for (r = 0; r < di.rows * s2 && r < ch - 16; ++r)
            for (c = 0; c < di.cols * s2 && c < cw; ++c) img[(size_t)(y0 + r) * W + x0 + c] = tile[(r / s2) * di.cols + c / s2];
        xx = draw_number(img, W, (int)(shown % cols) * cw + 6, y0 + ch - 16, label);
        draw_glyph(img, W, xx, y0 + ch - 16, 10, 2);
        draw_number(img, W, xx + 8, y0 + ch - 16, pred[i]);
        shown++;
    }
    ok = write_png(path, img, W, H);
done:
    free(x); free(pred); free(img);
    return ok;
}

static int plot_filters(mnistcu_model *net, int rows, int cols, const char *path)
{
    mnistcu_tensor_info ti;
    float *w = NULL;
    unsigned char *img = NULL, *tile = NULL;
    int ok = 0, tiles, tw, th, scale, per, W, H, k, r, c;
    size_t in;
    if (mnistcu_model_num_tensors(net) < 1 || mnistcu_model_tensor_info(net, 0, &ti) != MNISTCU_OK) return 0;
    if (!(w = (float *)malloc(ti.count * sizeof(float))) || mnistcu_model_get_tensor(net, ti.name, w, ti.count)) goto done;
    if (ti.ndim == 4) { /* conv [out][in][kh][kw]: input channel 0 of each kernel, enlarged */
        th = (int)ti.shape[2]; tw = (int)ti.shape[3]; in = (size_t)(ti.shape[1] * ti.shape[2] * ti.shape[3]);
        scale = 48 / (th > tw ? th : tw); if (scale < 1) scale = 1;
    } else if (ti.ndim == 2 && ti.shape[1] == (int64_t)rows * cols) { /* dense [out][in]: each row as an image */
        th = rows; tw = cols; in = (size_t)ti.shape[1]; scale = 2;
    } else {
        ok = 1; /* nothing image-like to show */
        goto done;
    }
    tiles = (int)(ti.shape[0] < 64 ? ti.shape[0] : 64);
    per = 8;
    W = per * (tw * scale + 4);
    H = ((tiles + per - 1) / per) * (th * scale + 4);
    img = (unsigned char *)calloc((size_t)W * H, 1);
    tile = (unsigned char *)malloc((size_t)th * tw);
    if (!img || !tile) goto done;
    for (k = 0; k < tiles; ++k) {
        int x0 = (k % per) * (tw * scale + 4) + 2, y0 = (k / per) * (th * scale + 4) + 2;
        to_gray(w + (size_t)k * in, (size_t)th * tw, tile);
        for (r = 0; r < th * scale; ++r)
            for (c = 0; c < tw * scale; ++c) img[(size_t)(y0 + r) * W + x0 + c] = tile[(r / scale) * tw + c / scale];
    }
    ok = write_png(path, img, W, H);
done:
    free(w); free(img); free(tile);
    return ok;
}

/* A polyline of values [n] (one per epoch) in a panel at x0, y0 of size pw x ph, values in lo..hi. */
static void svg_line(bytes_buf *b, const double *v, int n, int stride, double lo, double hi, int x0, int y0, int pw,
                     int ph, const char *color, const char *dash)
{
    int i;
    buf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", color, dash);
    for (i = 0; i < n; ++i) {
        double val = v[(size_t)i * (size_t)stride], fx = n > 1 ? (double)i / (n - 1) : 0.5;
        double fy = hi > lo && val == val ? (val - lo) / (hi - lo) : 0.5;
        buf_printf(b, "%.1f,%.1f ", x0 + fx * pw, y0 + ph - fy * ph);
    }
    buf_printf(b, "\"/>\n");
}

static int plot_curves(const progress_state *s, const char *path)
{
    bytes_buf b = {NULL, 0, 0, 0};
    int panel, i, ok, n = s->nrows, has_val = n > 0 && s->rows[0].has_val;
    const int pw = 420, ph = 260;
    buf_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
                   "width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", 2 * pw + 120, ph + 90);
    buf_printf(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    for (panel = 0; panel < 2; ++panel) {
        int x0 = 50 + panel * (pw + 60), y0 = 30;
        double lo = panel ? 0.0 : 1e300, hi = panel ? 1.0 : -1e300;
        const double *tr = panel ? &s->rows[0].train_acc : &s->rows[0].train_loss;
        const double *va = panel ? &s->rows[0].val_acc : &s->rows[0].val_loss;
        int stride = (int)(sizeof(epoch_row) / sizeof(double));
        for (i = 0; i < n && !panel; ++i) {
            double t = s->rows[i].train_loss, v = s->rows[i].val_loss;
            if (t == t && t < lo) lo = t;
            if (t == t && t > hi && t < 1e30) hi = t;
            if (has_val && v == v && v < lo) lo = v;
            if (has_val && v == v && v > hi && v < 1e30) hi = v;
        }
        if (!(lo < hi)) { lo = 0.0; hi = 1.0; }
        buf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", x0, y0, pw, ph);
        buf_printf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"14\">%s per epoch</text>\n", x0, y0 - 10,
                   panel ? "accuracy" : "loss");
        buf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.3g</text>\n", x0 - 4, y0 + 10, hi);
        buf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.3g</text>\n", x0 - 4, y0 + ph, lo);
        buf_printf(&b, "<text x=\"%d\" y=\"%d\">epoch 1</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\">epoch %d</text>\n",
                   x0, y0 + ph + 16, x0 + pw, y0 + ph + 16, n);
        if (n > 0) {
            svg_line(&b, tr, n, stride, lo, hi, x0, y0, pw, ph, "#1f77b4", "");
            if (has_val) svg_line(&b, va, n, stride, lo, hi, x0, y0, pw, ph, "#d62728", " stroke-dasharray=\"6 3\"");
        }
    }
    buf_printf(&b, "<text x=\"50\" y=\"%d\" fill=\"#1f77b4\">training</text>", ph + 70);
    if (has_val) buf_printf(&b, "<text x=\"130\" y=\"%d\" fill=\"#d62728\">validation</text>", ph + 70);
    buf_printf(&b, "\n</svg>\n");
    ok = !b.failed && write_atomically(path, b.p, b.n);
    free(b.p);
    return ok;
}

static int plot_confusion(mnistcu_ctx *ctx, mnistcu_model *net, const mnistcu_dataset *test, const char *path)
{
    mnistcu_model_info info;
    mnistcu_metrics m;
    bytes_buf b = {NULL, 0, 0, 0};
    int64_t *cm;
    size_t C, i, j;
    int ok = 0, cell;
    mnistcu_model_info_get(net, &info);
    C = info.classes;
    cell = C <= 20 ? 40 : 12;
    if (!(cm = (int64_t *)calloc(C * C, sizeof *cm)) || failed(ctx, mnistcu_evaluate(net, test, &m, cm))) goto done;
    buf_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
                   "width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"11\">\n",
               (int)C * cell + 90, (int)C * cell + 90);
    buf_printf(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    buf_printf(&b, "<text x=\"60\" y=\"16\" font-size=\"13\">rows: true class, columns: predicted (test accuracy %.2f%%)</text>\n",
               100.0 * m.accuracy);
    for (i = 0; i < C; ++i) {
        int64_t row = 0;
        for (j = 0; j < C; ++j) row += cm[i * C + j];
        buf_printf(&b, "<text x=\"54\" y=\"%d\" text-anchor=\"end\">%d</text>", 60 + (int)i * cell + cell / 2 + 4, (int)i);
        buf_printf(&b, "<text x=\"%d\" y=\"52\" text-anchor=\"middle\">%d</text>\n", 60 + (int)i * cell + cell / 2, (int)i);
        for (j = 0; j < C; ++j) {
            double f = row ? (double)cm[i * C + j] / (double)row : 0.0;
            int shade = 255 - (int)(200.0 * f + 0.5);
            buf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"rgb(%d,%d,255)\" stroke=\"#ccc\"/>",
                       60 + (int)j * cell, 60 + (int)i * cell, cell, cell, shade, shade);
            if (C <= 20)
                buf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%lld</text>", 60 + (int)j * cell + cell / 2,
                           60 + (int)i * cell + cell / 2 + 4, (long long)cm[i * C + j]);
        }
        buf_printf(&b, "\n");
    }
    buf_printf(&b, "</svg>\n");
    ok = !b.failed && write_atomically(path, b.p, b.n);
done:
    free(cm);
    free(b.p);
    return ok;
}

/* All four into dir (made when missing). */
static int write_plots(mnistcu_ctx *ctx, mnistcu_model *net, const mnistcu_dataset *test, const progress_state *s,
                       const char *dir)
{
    char path[4096];
    mnistcu_dataset_info di;
    const char *names[4] = {"curves.svg", "confusion.svg", "misclassified.png", "filters.png"};
    int k;
#ifdef _WIN32
    _mkdir(dir);
#else
    mkdir(dir, 0777);
#endif
    mnistcu_dataset_info_get(test, &di);
    for (k = 0; k < 4; ++k) {
        int ok;
        if (snprintf(path, sizeof path, "%s/%s", dir, names[k]) >= (int)sizeof path) {
            cli_error("invalid_argument", "--plot: folder name too long");
            return 0;
        }
        ok = k == 0 ? plot_curves(s, path) : k == 1 ? plot_confusion(ctx, net, test, path)
           : k == 2 ? plot_misclassified(ctx, net, test, path) : plot_filters(net, di.rows, di.cols, path);
        if (!ok) {
            cli_error("io", "--plot: cannot write %s: %s", path, strerror(errno));
            return 0;
        }
    }
    return 1;
}

/* ==========================================================================
   mnistcu train
   ========================================================================== */

/* The settings of a training run, for its JSON line. */
static void print_train_settings(const cli_options *o)
{
    printf(",\"batch\":%d", o->batch);
    json_field_str("optim", o->optim_name);
    json_field_num("lr", "%.6g", o->lr);
    json_field_num("momentum", "%.6g", o->momentum);
    printf(",\"nesterov\":%s", o->nesterov ? "true" : "false");
    json_field_num("weight_decay", "%.6g", o->weight_decay);
    json_field_str("schedule", o->schedule_text ? o->schedule_text : "constant");
    json_field_str("loss", o->loss_name);
    if (o->label_smoothing != 0.0f) json_field_num("label_smoothing", "%.6g", (double)o->label_smoothing);
    if (o->optim.l2 != 0.0f) json_field_num("l2", "%.6g", (double)o->optim.l2);
    if (o->optim.clip_norm != 0.0f) json_field_num("clip", "%.6g", (double)o->optim.clip_norm);
    json_field_str("augment", o->augment_text ? o->augment_text : "none");
    printf(",\"warmup\":%d,\"per_step\":%s", o->warmup, o->per_step ? "true" : "false");
    if (!o->model) {
        json_field_str("layers", o->layers);
        json_field_str("act", act_name(o->act));
    }
    if (o->model_spec[0]) json_field_str("model", o->model_spec);
    else if (o->model) json_field_str("model", o->model);
    json_field_str("norm", norm_name(o->norm));
    json_field_str("dataset", o->dataset);
}

/* Fills o from the checkpoint o->resume: seed, data options (its note), model (the file itself) and
   training settings; --epochs, when given, extends the training. */
static int resume_options(cli_options *o)
{
    static const char *const optim_names[] = {"", "sgd", "adam", "adamw", "rmsprop", "adagrad"};
    static char dataset[32], data_dir[1024];
    mnistcu_ctx *ctx = NULL;
    mnistcu_checkpoint_info ci;
    const char *p;
    int ok = create_context(MNISTCU_DEVICE_CPU, 0, 1, MNISTCU_PRECISION_DEFAULT, &ctx) &&
             !failed(ctx, mnistcu_checkpoint_info_get(ctx, o->resume, &ci));
    mnistcu_ctx_destroy(ctx);
    if (!ok) return 0;
    o->seed = ci.seed;
    if ((p = strstr(ci.note, "dataset=")) && sscanf(p, "dataset=%31s", dataset) == 1) o->dataset = dataset;
    if ((p = strstr(ci.note, "limit="))) o->limit = (size_t)strtoull(p + 6, NULL, 10);
    if ((p = strstr(ci.note, "val="))) o->val = (size_t)strtoull(p + 4, NULL, 10);
    if ((p = strstr(ci.note, "norm="))) o->norm = (mnistcu_norm)atoi(p + 5);
    if ((p = strstr(ci.note, "data=")) && o->data_dir && !strcmp(o->data_dir, "data")) {
        snprintf(data_dir, sizeof data_dir, "%s", p + 5);
        o->data_dir = data_dir;
    }
    o->model = o->resume;
    o->model_file = 1;
    if (!o->epochs_given) o->epochs = ci.train.epochs;
    o->batch = ci.train.batch_size;
    o->no_shuffle = ci.train.no_shuffle;
    o->early_stop = ci.train.early_stop;
    o->optim = ci.train.optim;
    o->optim_name = (unsigned)ci.train.optim.kind <= 5 ? optim_names[ci.train.optim.kind] : "?";
    o->lr = ci.train.optim.learning_rate;
    o->momentum = ci.train.optim.momentum;
    o->nesterov = ci.train.optim.nesterov;
    o->weight_decay = ci.train.optim.weight_decay;
    o->schedule = ci.train.schedule;
    o->schedule_text = "from the checkpoint";
    o->warmup = ci.train.schedule.warmup;
    o->per_step = ci.train.schedule.per_step;
    o->augment = ci.train.augment;
    if (!o->checkpoint) o->checkpoint = o->resume;
    if (!o->quiet)
        fprintf(stderr, "resuming %s: epoch %d, step %zu of %zu (%zu steps so far), seed %llu\n", o->resume, ci.epoch,
                ci.step, ci.steps, ci.total_steps, (unsigned long long)ci.seed);
    return 1;
}

static int cmd_train(int argc, char **argv)
{
    cli_options o;
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset *all = NULL, *train = NULL, *val = NULL, *test = NULL;
    mnistcu_model *net = NULL;
    mnistcu_dataset_info train_info, test_info;
    mnistcu_train_desc desc;
    mnistcu_train_result result;
    mnistcu_metrics test_metrics;
    progress_state progress;
    mnistcu_result r;
    size_t steps;
    int status = EXIT_ERROR, diverged = 0;
    char note[1200];

    switch (parse_options(argc, argv, CMD_TRAIN, &o)) {
    case PARSE_HELP: print_help(stdout); return EXIT_OK;
    case PARSE_ERROR: return EXIT_USAGE;
    default: break;
    }

    /* --resume: everything but the device and the outputs comes from the checkpoint. */
    if (o.resume && !resume_options(&o)) goto done;

    /* 1. Context: device, seed (initialisation, shuffling, the validation split), threads. */
    if (!create_context(o.device, o.seed, o.threads, o.precision, &ctx)) goto done;

    /* 2. Data. Standard normalisation uses the training set's statistics for both sets. */
    if (!load_split(ctx, &o, MNISTCU_SPLIT_TRAIN, &all) || !load_split(ctx, &o, MNISTCU_SPLIT_TEST, &test)) goto done;
    if (o.norm == MNISTCU_NORM_STANDARD && failed(ctx, mnistcu_dataset_normalize_like(test, all))) goto done;
    mnistcu_dataset_info_get(all, &train_info);
    if (o.val > 0) {
        if (o.val >= train_info.count) {
            fprintf(stderr, "mnistcu: --val %zu leaves no training samples: the training set has %zu\n", o.val,
                    train_info.count);
            status = EXIT_USAGE;
            goto done;
        }
        /* A shuffled split: the first part trains, the rest validates. */
        if (failed(ctx, mnistcu_dataset_split(ctx, all, train_info.count - o.val, 1, &train, &val))) goto done;
        mnistcu_dataset_destroy(all); /* the two parts are copies */
        all = NULL;
    } else {
        train = all;
    }
    mnistcu_dataset_info_get(train, &train_info);
    mnistcu_dataset_info_get(test, &test_info);

    /* 3. Model. */
    if (!create_model(ctx, &o, train, &net)) goto done;
    if (!o.quiet) print_layer_table(net);
    set_class_names(net, &o);

    /* 4. Train. */
    memset(&desc, 0, sizeof desc);
    desc.epochs = o.epochs;
    desc.batch_size = o.batch;
    desc.optim = o.optim;
    desc.optim.learning_rate = (float)o.lr;
    desc.optim.momentum = (float)o.momentum;
    desc.optim.nesterov = o.nesterov;
    desc.optim.weight_decay = (float)o.weight_decay;
    desc.schedule = o.schedule;
    desc.schedule.warmup = o.warmup;
    desc.schedule.per_step = o.per_step;
    desc.early_stop = o.early_stop;
    desc.log_path = o.log_path;
    desc.log_every = o.log_every;
    desc.no_shuffle = o.no_shuffle;
    desc.no_fused = o.no_fused;
    desc.no_graph = o.no_graph;
    desc.no_head = o.no_head;
    desc.no_fused_update = o.no_fused_update;
    desc.fused_cnn = o.fused_cnn;
    desc.fused_mlp_clusters = o.fused_mlp_clusters;
    desc.validation = val;
    desc.augment = o.augment;
    desc.checkpoint_path = o.checkpoint;
    desc.checkpoint_every = o.checkpoint_every;
    desc.checkpoint_every_steps = o.checkpoint_every_steps;
    desc.checkpoint_keep = o.keep_checkpoints;
    desc.checkpoint_best = o.checkpoint_best;
    desc.resume_from = o.resume;
    snprintf(note, sizeof note, "dataset=%s limit=%zu val=%zu norm=%d data=%s", o.dataset, o.limit, o.val, (int)o.norm,
             o.data_dir);
    desc.checkpoint_note = note;

    memset(&progress, 0, sizeof progress);
    progress.tty = isatty(fileno(stderr));
    progress.quiet = o.quiet;
    if (o.plot_dir) { /* the curves need every epoch's figures */
        desc.progress = on_progress;
        desc.progress_user = &progress;
    }
    if (!o.quiet) {
        /* Every report inside an epoch reads the running loss back, which on a
           GPU waits for the queued work: about 20 per epoch cost nothing
           noticeable. Off a terminal there is no bar, so only epoch ends. */
        steps = (train_info.count + (size_t)o.batch - 1) / (size_t)o.batch;
        if (o.progress_every >= 0) desc.progress_every = (size_t)o.progress_every;
        else if (progress.tty) desc.progress_every = steps >= 20 ? steps / 20 : 1;
        desc.progress = on_progress;
        desc.progress_user = &progress;

        if (o.model) fprintf(stderr, "training %s on %s: %zu samples", o.model_spec, o.dataset, train_info.count);
        else fprintf(stderr, "training %s (%s) on %s: %zu samples", o.layers, act_name(o.act), o.dataset,
                     train_info.count);
        if (val) fprintf(stderr, " (+%zu for validation)", o.val);
        fprintf(stderr, ", %d epochs of batch %d, lr %g, on %s\n", o.epochs, o.batch, o.lr,
                mnistcu_ctx_device_name(ctx));
    }
    r = mnistcu_train(net, train, &desc, &result);
    progress_clear(&progress); /* an error may arrive while the bar is drawn */
    /* A loss or weight that is not finite stops training with MNISTCU_ERR_DIVERGED:
       the message says where and what to try, the JSON line below where too. */
    diverged = r == MNISTCU_ERR_DIVERGED;
    if (failed(ctx, r)) goto done;
    if (!o.quiet)
        fprintf(stderr, "trained %d epochs in %.2f s\n", result.epochs, result.seconds);

    if (o.save) {
        if (failed(ctx, mnistcu_model_save(net, o.save))) goto done;
        if (!o.quiet) fprintf(stderr, "model written to %s\n", o.save);
    }
    if (o.save_weights) {
        if (!save_weights(ctx, net, o.save_weights)) goto done;
        if (!o.quiet) fprintf(stderr, "weights written to %s\n", o.save_weights);
    }

    /* 5. Test. */
    if (!evaluate_and_report(ctx, net, test, &o, &test_metrics)) goto done;
    if (o.plot_dir) {
        if (!write_plots(ctx, net, test, &progress, o.plot_dir)) goto done;
        if (!o.quiet) fprintf(stderr, "plots written to %s/\n", o.plot_dir);
    }

    /* The result, as the last line on stdout. */
    printf("{\"command\":\"train\"");
    json_field_num("test_accuracy", "%.6f", test_metrics.accuracy);
    json_field_num("test_loss", "%.6f", test_metrics.loss);
    json_field_num("train_accuracy", "%.6f", result.train_accuracy);
    json_field_num("train_loss", "%.6f", result.train_loss);
    if (result.has_validation) {
        json_field_num("val_accuracy", "%.6f", result.val_accuracy);
        json_field_num("val_loss", "%.6f", result.val_loss);
        printf(",\"val_samples\":%zu", o.val);
    }
    printf(",\"epochs\":%d", result.epochs);
    print_train_settings(&o);
    printf(",\"params\":%zu,\"num_params\":%zu,\"train_samples\":%zu,\"test_samples\":%zu",
           mnistcu_model_num_params(net), mnistcu_model_num_params(net), train_info.count, test_info.count);
    if (result.best_epoch) {
        printf(",\"best_epoch\":%d", result.best_epoch);
        json_field_num("best_val_loss", "%.6f", result.best_val_loss);
    }
    printf(",\"early_stopped\":%s", result.early_stopped ? "true" : "false");
    printf(",\"fused_steps\":%zu,\"fused_cnn_steps\":%zu,\"fused_cluster_steps\":%zu,\"graph_steps\":%zu,"
           "\"head_steps\":%zu,\"fused_update_steps\":%zu",
           result.fused_steps, result.fused_cnn_steps, result.fused_cluster_steps, result.graph_steps,
           result.head_steps, result.fused_update_steps);
    json_field_num("train_seconds", "%.4f", result.seconds);
    json_field_num("images_per_second", "%.1f",
                   result.seconds > 0.0 ? (double)train_info.count * result.epochs / result.seconds : 0.0);
    json_field_str("device", mnistcu_ctx_device_name(ctx));
    json_field_str("precision", precision_name(ctx));
    printf(",\"seed\":%llu", (unsigned long long)o.seed);
    json_field_str("version", MNISTCU_VERSION_STRING);
    printf("}\n");
    status = EXIT_OK;

done:
    if (status == EXIT_ERROR) {
        /* A failed run ends with a JSON line too: what went wrong and, when
           training diverged, where, with the training statistics so far. */
        printf("{\"command\":\"train\"");
        json_error_fields();
        if (diverged) {
            printf(",\"epoch\":%d,\"step\":%zu", result.diverged_epoch, result.diverged_step);
            json_field_num("train_accuracy", "%.6f", result.train_accuracy);
            json_field_num("train_loss", "%.6f", result.train_loss);
        }
        print_train_settings(&o);
        if (ctx) json_field_str("device", mnistcu_ctx_device_name(ctx));
        printf(",\"seed\":%llu", (unsigned long long)o.seed);
        json_field_str("version", MNISTCU_VERSION_STRING);
        printf("}\n");
    }
    free(progress.rows);
    mnistcu_ctx_destroy(ctx); /* frees the datasets and the model too */
    return status;
}

/* ==========================================================================
   mnistcu eval
   ========================================================================== */

/* The logits of every sample of ds, raw float32 [count][classes] in the
   machine's byte order (for comparing with other frameworks:
   tools/mnistcu_torch.py check). */
static int save_logits(mnistcu_ctx *ctx, mnistcu_model *net, const mnistcu_dataset *ds, const char *path)
{
    mnistcu_dataset_info di;
    mnistcu_model_info mi;
    float *z;
    FILE *f;
    int ok;
    mnistcu_dataset_info_get(ds, &di);
    mnistcu_model_info_get(net, &mi);
    z = (float *)malloc(di.count * mi.classes * sizeof(float));
    if (!z) {
        cli_error("out_of_memory", "--save-logits: out of memory");
        return 0;
    }
    if (failed(ctx, mnistcu_evaluate_logits(net, ds, z))) {
        free(z);
        return 0;
    }
    f = fopen(path, "wb");
    ok = f && fwrite(z, sizeof(float), di.count * mi.classes, f) == di.count * mi.classes;
    if (f && fclose(f) != 0) ok = 0;
    free(z);
    if (!ok) cli_error("io", "--save-logits: cannot write %s: %s", path, strerror(errno));
    return ok;
}

static int cmd_eval(int argc, char **argv)
{
    cli_options o;
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset *train = NULL, *test = NULL;
    mnistcu_model *net = NULL;
    mnistcu_metrics m;
    int status = EXIT_ERROR;

    switch (parse_options(argc, argv, CMD_EVAL, &o)) {
    case PARSE_HELP: print_help(stdout); return EXIT_OK;
    case PARSE_ERROR: return EXIT_USAGE;
    default: break;
    }

    if (!create_context(o.device, o.seed, o.threads, o.precision, &ctx)) goto done;
    if (!load_split(ctx, &o, MNISTCU_SPLIT_TEST, &test)) goto done;
    if (o.norm == MNISTCU_NORM_STANDARD && !o.model_file) { /* a model file keeps its normalisation */
        /* The mean and deviation come from the training set, as in train. */
        if (!load_split(ctx, &o, MNISTCU_SPLIT_TRAIN, &train) ||
            failed(ctx, mnistcu_dataset_normalize_like(test, train)))
            goto done;
        mnistcu_dataset_destroy(train);
    }
    if (!create_model(ctx, &o, test, &net) ||
        (!o.model_file && !load_weights(ctx, net, o.weights, o.model ? o.model_spec : o.layers)))
        goto done;
    if (!o.quiet)
        fprintf(stderr, "evaluating %s (%s) from %s on the %s test set, on %s\n", o.model ? o.model_spec : o.layers,
                o.model ? "--model" : act_name(o.act), o.model_file ? o.model : o.weights, o.dataset,
                mnistcu_ctx_device_name(ctx));
    if (!evaluate_and_report(ctx, net, test, &o, &m)) goto done;
    if (o.save_logits && !save_logits(ctx, net, test, o.save_logits)) goto done;

    printf("{\"command\":\"eval\"");
    json_field_num("test_accuracy", "%.6f", m.accuracy);
    json_field_num("test_loss", "%.6f", m.loss);
    printf(",\"test_samples\":%zu", m.count);
    if (!o.model) {
        json_field_str("layers", o.layers);
        json_field_str("act", act_name(o.act));
    }
    json_field_str("norm", norm_name(o.norm));
    json_field_str("dataset", o.dataset);
    json_field_str("model", o.model_spec);
    if (o.model_file) json_field_str("model_file", o.model);
    else json_field_str("weights", o.weights);
    printf(",\"params\":%zu,\"num_params\":%zu", mnistcu_model_num_params(net), mnistcu_model_num_params(net));
    json_field_str("device", mnistcu_ctx_device_name(ctx));
    json_field_str("precision", precision_name(ctx));
    json_field_str("version", MNISTCU_VERSION_STRING);
    printf("}\n");
    status = EXIT_OK;

done:
    if (status == EXIT_ERROR) {
        printf("{\"command\":\"eval\"");
        json_error_fields();
        if (o.model_file) json_field_str("model_file", o.model);
        else json_field_str("weights", o.weights);
        json_field_str("layers", o.layers);
        json_field_str("dataset", o.dataset);
        json_field_str("version", MNISTCU_VERSION_STRING);
        printf("}\n");
    }
    mnistcu_ctx_destroy(ctx);
    return status;
}

/* ==========================================================================
   mnistcu info
   ========================================================================== */

/* Element i of an IDX tensor (data is in host byte order), as a double. */
static double idx_value(const mnistcu_idx *t, size_t i)
{
    switch (t->type) {
    case MNISTCU_IDX_U8: return ((const uint8_t *)t->data)[i];
    case MNISTCU_IDX_I8: return ((const int8_t *)t->data)[i];
    case MNISTCU_IDX_I16: return ((const int16_t *)t->data)[i];
    case MNISTCU_IDX_I32: return ((const int32_t *)t->data)[i];
    case MNISTCU_IDX_F32: return ((const float *)t->data)[i];
    case MNISTCU_IDX_F64: return ((const double *)t->data)[i];
    }
    return 0.0;
}

#define MAX_HISTOGRAM 20

typedef struct histogram {
    int n;                        /* distinct values found, kept sorted */
    int too_many;                 /* more than MAX_HISTOGRAM distinct values */
    long values[MAX_HISTOGRAM];
    size_t counts[MAX_HISTOGRAM];
} histogram;

static void histogram_add(histogram *h, long v)
{
    int i = 0, j;
    while (i < h->n && h->values[i] < v) ++i;
    if (i < h->n && h->values[i] == v) {
        h->counts[i]++;
        return;
    }
    if (h->n == MAX_HISTOGRAM) {
        h->too_many = 1;
        return;
    }
    for (j = h->n; j > i; --j) { /* insert at i, keeping the values sorted */
        h->values[j] = h->values[j - 1];
        h->counts[j] = h->counts[j - 1];
    }
    h->values[i] = v;
    h->counts[i] = 1;
    h->n++;
}

static const char *loss_name(mnistcu_loss l)
{
    return l == MNISTCU_LOSS_MSE ? "mse" : l == MNISTCU_LOSS_BCE ? "bce" : l == MNISTCU_LOSS_HINGE ? "hinge" : "ce";
}

/* info on a model file: its layers, parameters, normalisation and class names. */
static int info_model(const char *path)
{
    mnistcu_ctx *ctx = NULL;
    mnistcu_model *net = NULL;
    mnistcu_model_info mi;
    mnistcu_checkpoint_info ci;
    char spec[2048];
    size_t c;
    int is_checkpoint = 0;
    if (!create_context(MNISTCU_DEVICE_CPU, 0, 0, MNISTCU_PRECISION_DEFAULT, &ctx) ||
        failed(ctx, mnistcu_model_load(ctx, path, &net))) {
        printf("{\"command\":\"info\"");
        json_field_str("file", path);
        json_error_fields();
        json_field_str("version", MNISTCU_VERSION_STRING);
        printf("}\n");
        mnistcu_ctx_destroy(ctx);
        return EXIT_ERROR;
    }
    mnistcu_model_info_get(net, &mi);
    mnistcu_model_spec(net, spec, sizeof spec);
    printf("file      %s\nformat    safetensors, a mnistcu model\nmodel     %s\n", path, spec);
    print_layer_table_to(stdout, net);
    printf("loss      %s\n", loss_name(mi.loss));
    if (mi.has_norm) printf("inputs    x = pixel * %g %+g\n", (double)mi.norm_scale, (double)mi.norm_shift);
    else printf("inputs    no normalisation recorded (x = pixel / 255 for images)\n");
    if (mnistcu_checkpoint_info_get(ctx, path, &ci) == MNISTCU_OK) {
        is_checkpoint = 1;
        printf("checkpoint epoch %d of %d, step %zu of %zu (%zu optimizer steps so far), seed %llu, batch %d\n",
               ci.epoch, ci.train.epochs, ci.step, ci.steps, ci.total_steps, (unsigned long long)ci.seed,
               ci.train.batch_size);
        if (ci.note[0]) printf("note      %s\n", ci.note);
    }
    mnistcu_ctx_clear_error(ctx);
    if (mnistcu_model_class_name(net, 0)) {
        printf("classes   ");
        for (c = 0; c < mi.classes; ++c) printf("%s%s", c ? ", " : "", mnistcu_model_class_name(net, c));
        printf("\n");
    }
    printf("{\"command\":\"info\"");
    json_field_str("file", path);
    json_field_str("format", "safetensors");
    json_field_str("kind", is_checkpoint ? "checkpoint" : "weights");
    if (is_checkpoint)
        printf(",\"epoch\":%d,\"step\":%zu,\"steps\":%zu,\"total_steps\":%zu,\"seed\":%llu", ci.epoch, ci.step,
               ci.steps, ci.total_steps, (unsigned long long)ci.seed);
    json_field_str("model", spec);
    printf(",\"num_params\":%zu,\"num_buffers\":%zu,\"classes\":%zu", mi.num_params, mi.num_buffers, mi.classes);
    json_field_str("loss", loss_name(mi.loss));
    if (mi.has_norm) {
        json_field_num("norm_scale", "%.9g", (double)mi.norm_scale);
        json_field_num("norm_shift", "%.9g", (double)mi.norm_shift);
    }
    if (mnistcu_model_class_name(net, 0)) {
        printf(",\"class_names\":[");
        for (c = 0; c < mi.classes; ++c) {
            if (c) printf(",");
            json_string(stdout, mnistcu_model_class_name(net, c));
        }
        printf("]");
    }
    json_field_str("version", MNISTCU_VERSION_STRING);
    printf("}\n");
    mnistcu_ctx_destroy(ctx);
    return EXIT_OK;
}

static int cmd_info(int argc, char **argv)
{
    const char *path = NULL, *type_name;
    mnistcu_ctx *ctx = NULL;
    mnistcu_idx t;
    histogram h;
    double lo = 0.0, hi = 0.0, sum = 0.0;
    int integer, want_histogram, i, d;
    size_t k;

    for (i = 0; i < argc; ++i) {
        if (strcmp(argv[i], "--help") == 0) {
            print_help(stdout);
            return EXIT_OK;
        }
        if (argv[i][0] == '-' && argv[i][1] != '\0') {
            usage_error("info: unknown option '%s'", argv[i]);
            return EXIT_USAGE;
        }
        if (path) {
            usage_error("info takes one FILE, got '%s' and '%s'", path, argv[i]);
            return EXIT_USAGE;
        }
        path = argv[i];
    }
    if (!path) {
        usage_error("info needs a FILE");
        return EXIT_USAGE;
    }

    /* A model file (safetensors: a length, then a JSON object) or an IDX file. */
    {
        unsigned char head[9];
        FILE *f = fopen(path, "rb");
        int is_model = f && fread(head, 1, 9, f) == 9 && head[8] == '{' && (head[0] | head[1]) != 0;
        if (f) fclose(f);
        if (is_model) return info_model(path);
    }

    /* Reading a file needs no GPU: a CPU context starts instantly. */
    memset(&t, 0, sizeof t);
    if (!create_context(MNISTCU_DEVICE_CPU, 0, 0, MNISTCU_PRECISION_DEFAULT, &ctx) ||
        failed(ctx, mnistcu_idx_load_file(ctx, path, &t))) {
        printf("{\"command\":\"info\"");
        json_field_str("file", path);
        json_error_fields();
        json_field_str("version", MNISTCU_VERSION_STRING);
        printf("}\n");
        mnistcu_ctx_destroy(ctx);
        return EXIT_ERROR;
    }

    /* Statistics: min, max, mean; a histogram for a small set of integer labels. */
    integer = t.type != MNISTCU_IDX_F32 && t.type != MNISTCU_IDX_F64;
    want_histogram = integer && t.ndim == 1;
    memset(&h, 0, sizeof h);
    for (k = 0; k < t.count; ++k) {
        double v = idx_value(&t, k);
        if (k == 0 || v < lo) lo = v;
        if (k == 0 || v > hi) hi = v;
        sum += v;
        if (want_histogram && !h.too_many) histogram_add(&h, (long)v);
    }

    /* For people. */
    type_name = mnistcu_idx_type_name(t.type);
    printf("file      %s\n", path);
    printf("type      %s (0x%02X), %zu byte%s per element\n", type_name, (unsigned)t.type, t.elem_size,
           t.elem_size == 1 ? "" : "s");
    printf("dims      ");
    for (d = 0; d < t.ndim; ++d) printf(d ? " x %u" : "%u", (unsigned)t.dims[d]);
    printf("\nelements  %zu\n", t.count);
    if (t.count > 0) {
        printf("min       %g\nmax       %g\nmean      %.6f\n", lo, hi, sum / (double)t.count);
        if (want_histogram && h.too_many) {
            printf("histogram more than %d distinct values\n", MAX_HISTOGRAM);
        } else if (want_histogram) {
            printf("histogram (%d distinct value%s)\n", h.n, h.n == 1 ? "" : "s");
            for (i = 0; i < h.n; ++i)
                printf("  %8ld  %zu  (%.2f%%)\n", h.values[i], h.counts[i], 100.0 * (double)h.counts[i] / (double)t.count);
        }
    }

    /* For scripts: the last line. */
    printf("{\"command\":\"info\"");
    json_field_str("file", path);
    json_field_str("type", type_name);
    printf(",\"dims\":[");
    for (d = 0; d < t.ndim; ++d) printf(d ? ",%u" : "%u", (unsigned)t.dims[d]);
    printf("],\"count\":%zu", t.count);
    if (t.count > 0) { /* a float file can hold NaN or inf: those come out as null */
        json_field_num("min", "%.17g", lo);
        json_field_num("max", "%.17g", hi);
        json_field_num("mean", "%.6f", sum / (double)t.count);
    }
    if (want_histogram && !h.too_many && t.count > 0) {
        printf(",\"histogram\":{");
        for (i = 0; i < h.n; ++i) printf(i ? ",\"%ld\":%zu" : "\"%ld\":%zu", h.values[i], h.counts[i]);
        printf("}");
    }
    printf("}\n");

    mnistcu_idx_free(ctx, &t);
    mnistcu_ctx_destroy(ctx);
    return EXIT_OK;
}

/* ==========================================================================
   mnistcu predict
   ========================================================================== */

/* An 8-bit image as a binary PGM. */
static int write_pgm(const char *path, const uint8_t *px, int w, int h)
{
    FILE *f = fopen(path, "wb");
    int ok = f && fprintf(f, "P5\n%d %d\n255\n", w, h) > 0 && fwrite(px, 1, (size_t)w * h, f) == (size_t)w * h;
    if (f && fclose(f) != 0) ok = 0;
    return ok;
}

static int cmd_predict(int argc, char **argv)
{
    const char *model = NULL, *save = NULL, **images;
    int nimages = 0, top = 3, raw = 0, i, status = EXIT_ERROR, first = 1, flat, side, opened = 0;
    mnistcu_device device = MNISTCU_DEVICE_AUTO;
    mnistcu_ctx *ctx = NULL;
    mnistcu_model *net = NULL;
    mnistcu_model_info mi;
    float *probs = NULL;
    uint8_t *input = NULL;
    images = (const char **)malloc((size_t)(argc > 0 ? argc : 1) * sizeof *images);
    if (!images) return EXIT_ERROR;
    for (i = 0; i < argc; ++i) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            print_help(stdout);
            free(images);
            return EXIT_OK;
        } else if (!strcmp(a, "--raw")) {
            raw = 1;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--top") || !strcmp(a, "--save-preprocessed") ||
                   !strcmp(a, "--device")) {
            long long n;
            if (i + 1 == argc) {
                usage_error("%s needs a value", a);
                free(images);
                return EXIT_USAGE;
            }
            ++i;
            if (!strcmp(a, "--model")) model = argv[i];
            else if (!strcmp(a, "--save-preprocessed")) save = argv[i];
            else if (!strcmp(a, "--device")) {
                if (!strcmp(argv[i], "cpu")) device = MNISTCU_DEVICE_CPU;
                else if (!strcmp(argv[i], "cuda")) device = MNISTCU_DEVICE_CUDA;
                else if (strcmp(argv[i], "auto") != 0) {
                    usage_error("--device: cpu, cuda or auto, got '%s'", argv[i]);
                    free(images);
                    return EXIT_USAGE;
                }
            } else {
                if (!parse_integer(a, argv[i], 1, 256, &n)) {
                    free(images);
                    return EXIT_USAGE;
                }
                top = (int)n;
            }
        } else if (a[0] == '-' && a[1] == '-') {
            usage_error("predict: unknown option '%s'", a);
            free(images);
            return EXIT_USAGE;
        } else {
            images[nimages++] = a;
        }
    }
    if (!model || nimages == 0) {
        usage_error("predict needs --model FILE (written by train --save) and at least one IMAGE (PNG or PGM)");
        free(images);
        return EXIT_USAGE;
    }
    if (!create_context(device, 0, 0, MNISTCU_PRECISION_DEFAULT, &ctx) ||
        failed(ctx, mnistcu_model_load(ctx, model, &net)))
        goto done;
    mnistcu_model_info_get(net, &mi);
    /* flat models (1x1xN or Nx1x1) take a square image of N pixels; others one channel of HxH */
    flat = mi.input_shape[1] == 1 && (mi.input_shape[0] == 1 || mi.input_shape[2] == 1);
    if (flat) {
        for (side = 1; (size_t)side * (size_t)side < mi.inputs; ++side) {}
    } else {
        side = mi.input_shape[1];
    }
    if ((size_t)side * (size_t)side != mi.inputs || (!flat && (mi.input_shape[0] != 1 || mi.input_shape[2] != side))) {
        cli_error("invalid_argument", "predict: the model takes %dx%dx%d inputs; images give one square channel",
                  mi.input_shape[0], mi.input_shape[1], mi.input_shape[2]);
        goto done;
    }
    probs = (float *)malloc(mi.classes * sizeof(float));
    input = (uint8_t *)malloc(mi.inputs);
    if (!probs || !input) goto done;
    if (top > (int)mi.classes) top = (int)mi.classes;
    printf("{\"command\":\"predict\"");
    json_field_str("model_file", model);
    printf(",\"results\":[");
    opened = 1;
    for (i = 0; i < nimages; ++i) {
        mnistcu_image img;
        int k, c, best[256];
        size_t need = mi.inputs;
        int32_t label;
        if (failed(ctx, mnistcu_image_load(ctx, images[i], &img))) goto fail;
        if (raw) {
            if ((size_t)img.width * (size_t)img.height != need || img.width != side) {
                cli_error("invalid_argument", "%s: --raw needs a %dx%d image, this one is %dx%d", images[i], side, side,
                          img.width, img.height);
                mnistcu_image_free(ctx, &img);
                goto fail;
            }
            memcpy(input, img.gray, need);
        } else if (failed(ctx, mnistcu_image_to_mnist(ctx, &img, side, input))) {
            mnistcu_image_free(ctx, &img);
            goto fail;
        }
        mnistcu_image_free(ctx, &img);
        if (save) {
            char path[4096];
            const char *dot = strrchr(save, '.');
            if (nimages == 1 || !dot) snprintf(path, sizeof path, nimages == 1 ? "%s" : "%s-%d", save, i + 1);
            else snprintf(path, sizeof path, "%.*s-%d%s", (int)(dot - save), save, i + 1, dot);
            if (!write_pgm(path, input, side, side)) {
                cli_error("io", "--save-preprocessed: cannot write %s: %s", path, strerror(errno));
                goto fail;
            }
        }
        if (failed(ctx, mnistcu_predict_u8(net, input, 1, &label, probs))) goto fail;
        for (k = 0; k < top; ++k) { /* the top classes by probability */
            best[k] = -1;
            for (c = 0; c < (int)mi.classes; ++c) {
                int taken = 0, j;
                for (j = 0; j < k; ++j) taken |= best[j] == c;
                if (!taken && (best[k] < 0 || probs[c] > probs[best[k]])) best[k] = c;
            }
        }
        fprintf(stderr, "%s:", images[i]);
        printf("%s{\"file\":", first ? "" : ",");
        first = 0;
        json_string(stdout, images[i]);
        printf(",\"class\":%d", (int)label);
        if (mnistcu_model_class_name(net, (size_t)label)) json_field_str("name", mnistcu_model_class_name(net, (size_t)label));
        printf(",\"top\":[");
        for (k = 0; k < top; ++k) {
            const char *nm = mnistcu_model_class_name(net, (size_t)best[k]);
            if (nm) fprintf(stderr, "%s %s %.2f%%", k ? "," : "", nm, 100.0 * probs[best[k]]);
            else fprintf(stderr, "%s %d %.2f%%", k ? "," : "", best[k], 100.0 * probs[best[k]]);
            printf("%s{\"class\":%d", k ? "," : "", best[k]);
            if (nm) json_field_str("name", nm);
            json_field_num("p", "%.6f", probs[best[k]]);
            printf("}");
        }
        printf("]}");
        fprintf(stderr, "\n");
    }
    printf("]");
    json_field_str("version", MNISTCU_VERSION_STRING);
    printf("}\n");
    status = EXIT_OK;
    goto done;
fail:
    printf("]");
    json_error_fields();
    json_field_str("version", MNISTCU_VERSION_STRING);
    printf("}\n");
    status = EXIT_ERROR;
done:
    if (status == EXIT_ERROR && !opened) {
        printf("{\"command\":\"predict\"");
        json_error_fields();
        json_field_str("model_file", model);
        json_field_str("version", MNISTCU_VERSION_STRING);
        printf("}\n");
    }
    free(images);
    free(probs);
    free(input);
    mnistcu_ctx_destroy(ctx);
    return status;
}

/* ==========================================================================
   mnistcu export
   ========================================================================== */

static int cmd_export(int argc, char **argv)
{
    const char *onnx = NULL, *model = NULL;
    mnistcu_ctx *ctx = NULL;
    mnistcu_model *net = NULL;
    char spec[2048];
    int i, status = EXIT_ERROR;
    for (i = 0; i < argc; ++i) {
        const char **dst = !strcmp(argv[i], "--onnx") ? &onnx : !strcmp(argv[i], "--model") ? &model : NULL;
        if (!strcmp(argv[i], "--help")) {
            print_help(stdout);
            return EXIT_OK;
        }
        if (!dst) {
            usage_error("export: unknown argument '%s'", argv[i]);
            return EXIT_USAGE;
        }
        if (i + 1 == argc) {
            usage_error("%s needs a value", argv[i]);
            return EXIT_USAGE;
        }
        *dst = argv[++i];
    }
    if (!onnx || !model) {
        usage_error("export needs --onnx OUT and --model FILE (a model file written by train --save)");
        return EXIT_USAGE;
    }
    if (create_context(MNISTCU_DEVICE_CPU, 0, 0, MNISTCU_PRECISION_DEFAULT, &ctx) &&
        !failed(ctx, mnistcu_model_load(ctx, model, &net)) &&
        !failed(ctx, mnistcu_model_export_onnx(net, onnx))) {
        mnistcu_model_info mi;
        mnistcu_model_info_get(net, &mi);
        mnistcu_model_spec(net, spec, sizeof spec);
        printf("{\"command\":\"export\"");
        json_field_str("onnx", onnx);
        json_field_str("model_file", model);
        json_field_str("model", spec);
        json_field_str("input", mi.has_norm && mi.norm_u8 ? "pixels 0..255" : "features");
        printf(",\"opset\":13,\"num_params\":%zu", mi.num_params);
        json_field_str("version", MNISTCU_VERSION_STRING);
        printf("}\n");
        status = EXIT_OK;
    } else {
        printf("{\"command\":\"export\"");
        json_error_fields();
        json_field_str("onnx", onnx);
        json_field_str("model_file", model);
        json_field_str("version", MNISTCU_VERSION_STRING);
        printf("}\n");
    }
    mnistcu_ctx_destroy(ctx);
    return status;
}

/* ==========================================================================
   main
   ========================================================================== */

int main(int argc, char **argv)
{
    const char *command;
    if (argc < 2) {
        usage_error("no command given");
        return EXIT_USAGE;
    }
    command = argv[1];
    if (strcmp(command, "--help") == 0 || strcmp(command, "-h") == 0 || strcmp(command, "help") == 0) {
        print_help(stdout);
        return EXIT_OK;
    }
    if (strcmp(command, "--version") == 0) {
#ifdef __CUDACC__
        printf("mnistcu %s (CPU and CUDA backends)\n", MNISTCU_VERSION_STRING);
#else
        printf("mnistcu %s (CPU backend only)\n", MNISTCU_VERSION_STRING);
#endif
        return EXIT_OK;
    }
    if (strcmp(command, "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(command, "eval") == 0) return cmd_eval(argc - 2, argv + 2);
    if (strcmp(command, "info") == 0) return cmd_info(argc - 2, argv + 2);
    if (strcmp(command, "export") == 0) return cmd_export(argc - 2, argv + 2);
    if (strcmp(command, "predict") == 0) return cmd_predict(argc - 2, argv + 2);
    usage_error("unknown command '%s'", command);
    return EXIT_USAGE;
}
