/* mnistcu.h - v0.1.0 - train neural networks on MNIST-style data, on the CPU or a CUDA GPU.
   Public domain or MIT, your choice: see the end of this file.

   QUICK START
     Copy this file into your project. In exactly one .c or .cu file write

         #define MNISTCU_IMPLEMENTATION
         #include "mnistcu.h"

     and include it plainly everywhere else. Then:

         mnistcu_ctx *ctx = NULL; mnistcu_dataset *train, *test; mnistcu_model *net;
         mnistcu_metrics m;
         if (mnistcu_ctx_create(&ctx, NULL) ||
             mnistcu_dataset_load_dir(ctx, "data/mnist", MNISTCU_SPLIT_TRAIN, &train) ||
             mnistcu_dataset_load_dir(ctx, "data/mnist", MNISTCU_SPLIT_TEST, &test) ||
             mnistcu_model_create_mlp(ctx, "784-128-10", &net) ||
             mnistcu_train(net, train, NULL, NULL) ||
             mnistcu_evaluate(net, test, &m, NULL))
             fprintf(stderr, "error: %s\n", mnistcu_ctx_error(ctx));
         else
             printf("test accuracy %.2f%%\n", 100.0 * m.accuracy);
         mnistcu_ctx_destroy(ctx);  (frees every object made through ctx)

     Compiled with a C or C++ compiler it trains on the CPU. Compiled with nvcc
     (`nvcc train.cu -o train`) it trains on the GPU when there is one and on the
     CPU otherwise: the same program, the same API, results within float rounding.

   STEP BY STEP
     1. Context   mnistcu_ctx_create(&ctx, &desc): device, seed, threads, logger,
                  allocator. A NULL desc (or one zeroed) takes every default.
     2. Data      mnistcu_dataset_load_dir() finds the IDX files of a split in a
                  folder (train-images-idx3-ubyte or train-images.idx3-ubyte,
                  either with .gz); mnistcu_dataset_load() takes explicit paths or
                  memory; mnistcu_dataset_create() wraps your own arrays;
                  mnistcu_dataset_split() carves a validation set.
     3. Model     mnistcu_model_create_mlp(ctx, "784-256-128-10", &net), or
                  mnistcu_model_create() with a desc (activation, init).
     4. Train     mnistcu_train(net, train, &train_desc, &result): epochs, batch,
                  optimizer, shuffling, validation, a progress callback that can stop.
     5. Use       mnistcu_evaluate() (loss, accuracy, confusion matrix),
                  mnistcu_predict() / mnistcu_predict_u8() for your own images,
                  mnistcu_model_get_params() for the weights.

   WHAT IT DOES NOT DO (YET)
     Convolutions, pooling, batch norm, Adam and friends, checkpoints and export
     are planned; the API leaves room for them. No multi-GPU. No half precision.

   CONFIGURATION MACROS (define before including the implementation)
     MNISTCU_STATIC            make every function static to the including file
     MNISTCU_MALLOC(sz)        host allocation used when no allocator is given
     MNISTCU_FREE(p)           (default: malloc / free)
     MNISTCU_IDX_MAX_BYTES     largest decompressed file or IDX payload accepted
                               (default 1 GiB)
     MNISTCU_IDX_MAX_DIMS      largest IDX dimension count accepted (default 8)
     MNISTCU_CUBLAS            nvcc builds: make cuBLAS available for the matrix
                               products and the default (link with -lcublas);
                               mnistcu_ctx_desc.gemm chooses per context
     MNISTCU_DEBUG_SYNC        nvcc builds: synchronise after every launch so an
                               error names the kernel that caused it

   MEMORY & OWNERSHIP
     Every object (dataset, model) belongs to the context that made it and is
     freed by mnistcu_ctx_destroy() if you have not freed it before. Buffers the
     library hands you (mnistcu_gunzip, mnistcu_inflate, mnistcu_idx) are freed
     with mnistcu_free() / mnistcu_idx_free(). Every host allocation goes through
     the context's allocator. The library never keeps a pointer to your arrays
     after a call returns and never writes to the arrays you pass as input.

   ERRORS
     Every fallible call returns mnistcu_result: MNISTCU_OK (0) or an error code.
     mnistcu_ctx_error(ctx) returns a message naming the cause (file, field,
     value). Messages also go to the context's logger (stderr by default; pass a
     logger or MNISTCU_LOG_SILENT to change that). A failing call leaves your data
     untouched and the context usable. The library never calls exit or abort.
     Training that diverges fails loudly: at every progress report and epoch end
     mnistcu_train checks that the loss and every weight are finite, and if not
     returns MNISTCU_ERR_DIVERGED with a message naming the epoch and step and
     suggesting a lower learning rate. The model then holds the last weights
     (and momentum) seen finite at a check whose loss, on the batch after
     them, was finite too: those of the last check that passed, or of the one
     before when the very next step failed; the weights it started with if
     nothing better exists. The result's diverged_epoch and diverged_step say
     where. On the GPU the check costs no extra synchronisation (a flag
     computed on the device is read with the statistics).
     mnistcu_train_desc.no_divergence_check turns it off for those who want NaN
     to propagate; with it on, a model whose weights are already not finite is
     refused (MNISTCU_ERR_INVALID_ARGUMENT).

   CPU vs CUDA
     The CPU backend is plain C99, float32, with cache-blocked matrix products
     and optional OpenMP (-fopenmp); every CUDA kernel is tested against it.
     Results are deterministic: the same seed gives bitwise-identical weights on
     the same device, for any thread count. CPU and GPU agree to float rounding,
     not bitwise (with ReLU, a unit whose input rounds to opposite sides of zero
     on the two devices can make training runs drift further apart).

   LIMITS
     At most MNISTCU_MAX_LAYERS dense layers, widths up to 2^24, at most
     MNISTCU_MAX_CLASSES classes, at most MNISTCU_IDX_MAX_BYTES per file.
     Decompression is bounded by what the data claims. A gzip'd IDX file is
     sized by its IDX header, read as soon as its bytes are out: a header whose
     payload is above MNISTCU_IDX_MAX_BYTES, or larger than the compressed bytes
     can expand to (deflate's most is 1032 to 1), is refused at once; the output
     is allocated once, at the exact size, and holds the elements in the end (no
     second copy); the first byte beyond it is refused (MNISTCU_ERR_IDX_TRAILING,
     naming the offset). So a 1 MB file claiming 60000 x 28 x 28 images and
     holding 1 GiB of zeros costs one 47 MB buffer and a few tens of
     milliseconds. mnistcu_gunzip and mnistcu_inflate, with no size known, start
     from a guess (the size the gzip trailer states, at most 16 times the
     input; else 4 times the input) and grow by a quarter (at least 4 KiB) up
     to max_out: the most held at once, old and new buffer while it grows,
     stays under 2.25 times the final output plus 4 KiB (or the first guess).
*/
#ifndef MNISTCU_H
#define MNISTCU_H

#define MNISTCU_VERSION_MAJOR 0
#define MNISTCU_VERSION_MINOR 1
#define MNISTCU_VERSION_PATCH 0
#define MNISTCU_VERSION_STRING "0.1.0"

#include <stddef.h>
#include <stdint.h>

#ifndef MNISTCU_DEF
#  ifdef MNISTCU_STATIC
#    if defined(__GNUC__) || defined(__clang__)
#      define MNISTCU_DEF static __attribute__((unused))
#    else
#      define MNISTCU_DEF static
#    endif
#  else
#    define MNISTCU_DEF extern
#  endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MNISTCU_MAX_LAYERS 16   /* dense layers in one model */
#define MNISTCU_MAX_CLASSES 256 /* output classes */

/* ---- results --------------------------------------------------------------
   One list makes the enum, the names and the messages. */
#define MNISTCU_RESULT_LIST(X) \
    X(OK,                          "ok") \
    X(ERR_INVALID_ARGUMENT,        "invalid argument") \
    X(ERR_OUT_OF_MEMORY,           "out of memory") \
    X(ERR_OVERFLOW,                "size arithmetic overflows") \
    X(ERR_NOT_FOUND,               "file not found") \
    X(ERR_IO,                      "read failed") \
    X(ERR_UNSUPPORTED,             "not supported by this build or device") \
    X(ERR_SHAPE,                   "shapes do not match") \
    X(ERR_NO_DEVICE,               "the requested device is not available") \
    X(ERR_CUDA,                    "CUDA error") \
    X(ERR_CUBLAS,                  "cuBLAS error") \
    X(ERR_IDX_MAGIC,               "IDX: bytes 0-1 are not zero") \
    X(ERR_IDX_TYPE,                "IDX: unknown element type") \
    X(ERR_IDX_NDIM,                "IDX: dimension count is 0 or above the cap") \
    X(ERR_IDX_OVERFLOW,            "IDX: the size product overflows") \
    X(ERR_IDX_TOO_LARGE,           "IDX: payload above MNISTCU_IDX_MAX_BYTES") \
    X(ERR_IDX_TRUNCATED,           "IDX: shorter than header plus payload") \
    X(ERR_IDX_TRAILING,            "IDX: bytes after the payload") \
    X(ERR_IDX_SHAPE,               "IDX: shape not usable as images or labels") \
    X(ERR_COUNT_MISMATCH,          "image and label counts differ") \
    X(ERR_LABEL_RANGE,             "label outside the classes") \
    X(ERR_GZ_MAGIC,                "gzip: bad magic bytes") \
    X(ERR_GZ_METHOD,               "gzip: compression method is not deflate") \
    X(ERR_GZ_FLAGS,                "gzip: reserved flag bits set") \
    X(ERR_GZ_HEADER,               "gzip: header field runs past the end") \
    X(ERR_GZ_HEADER_CRC,           "gzip: header CRC mismatch") \
    X(ERR_GZ_TRUNCATED,            "gzip: member ends before its trailer") \
    X(ERR_GZ_CRC,                  "gzip: CRC-32 mismatch") \
    X(ERR_GZ_ISIZE,                "gzip: ISIZE mismatch") \
    X(ERR_GZ_TOO_LARGE,            "gzip: output above the limit") \
    X(ERR_GZ_TRAILING,             "gzip: bytes after the last member") \
    X(ERR_DEFLATE_BLOCK_TYPE,      "deflate: block type 3") \
    X(ERR_DEFLATE_STORED_LENGTH,   "deflate: stored block length mismatch") \
    X(ERR_DEFLATE_OVERSUBSCRIBED,  "deflate: over-subscribed code") \
    X(ERR_DEFLATE_INCOMPLETE,      "deflate: incomplete code") \
    X(ERR_DEFLATE_LENGTHS,         "deflate: invalid code lengths") \
    X(ERR_DEFLATE_NO_END_OF_BLOCK, "deflate: no end-of-block code") \
    X(ERR_DEFLATE_SYMBOL,          "deflate: invalid symbol") \
    X(ERR_DEFLATE_DISTANCE,        "deflate: distance too far back") \
    X(ERR_DEFLATE_TRUNCATED,       "deflate: input ends inside the stream") \
    X(ERR_DIVERGED,                "training diverged: the loss or a weight is not finite")

typedef enum mnistcu_result {
#define MNISTCU__RESULT_ENUM(name, text) MNISTCU_##name,
    MNISTCU_RESULT_LIST(MNISTCU__RESULT_ENUM)
#undef MNISTCU__RESULT_ENUM
    MNISTCU_RESULT_COUNT
} mnistcu_result;

MNISTCU_DEF const char *mnistcu_result_name(mnistcu_result r); /* "MNISTCU_ERR_IDX_MAGIC" */
MNISTCU_DEF const char *mnistcu_result_str(mnistcu_result r);  /* "IDX: bytes 0-1 are not zero" */

/* ---- context -------------------------------------------------------------- */
typedef struct mnistcu_ctx mnistcu_ctx;

typedef enum mnistcu_device {
    MNISTCU_DEVICE_AUTO = 0, /* CUDA when compiled in and a GPU is present, else CPU */
    MNISTCU_DEVICE_CPU,
    MNISTCU_DEVICE_CUDA
} mnistcu_device;

typedef enum mnistcu_log_level {
    MNISTCU_LOG_DEFAULT = 0, /* = MNISTCU_LOG_INFO */
    MNISTCU_LOG_SILENT,
    MNISTCU_LOG_ERROR,
    MNISTCU_LOG_WARN,
    MNISTCU_LOG_INFO,        /* errors, warnings, one line per epoch */
    MNISTCU_LOG_DEBUG
} mnistcu_log_level;

typedef void (*mnistcu_log_fn)(void *user, mnistcu_log_level level, const char *message);

typedef struct mnistcu_allocator {
    void *(*alloc)(void *user, size_t size);        /* NULL: MNISTCU_MALLOC */
    void (*free)(void *user, void *ptr);            /* NULL: MNISTCU_FREE */
    void *(*device_alloc)(void *user, size_t size); /* GPU memory; NULL: cudaMalloc */
    void (*device_free)(void *user, void *ptr);     /* NULL: cudaFree */
    void *user;
} mnistcu_allocator;

typedef enum mnistcu_gemm {
    MNISTCU_GEMM_DEFAULT = 0, /* cuBLAS when built with MNISTCU_CUBLAS, else OWN */
    MNISTCU_GEMM_OWN,         /* this file's register-tiled kernel */
    MNISTCU_GEMM_CUBLAS       /* needs MNISTCU_CUBLAS at build time */
} mnistcu_gemm;

typedef enum mnistcu_data_mode {
    MNISTCU_DATA_DEFAULT = 0, /* RESIDENT when the dataset fits in GPU memory, else STREAM */
    MNISTCU_DATA_RESIDENT,    /* upload each dataset once as uint8 (or float) */
    MNISTCU_DATA_STREAM       /* copy each batch from pinned host memory, overlapped with compute */
} mnistcu_data_mode;

typedef struct mnistcu_ctx_desc {
    mnistcu_device device;       /* AUTO; the environment variable MNISTCU_DEVICE=cpu|cuda overrides AUTO */
    int cuda_device;             /* 0: the first GPU */
    uint64_t seed;               /* 0 (any value is a valid seed) */
    int threads;                 /* 0: OpenMP's default (OMP_NUM_THREADS or all cores); 1 without OpenMP */
    mnistcu_log_level log_level; /* DEFAULT: INFO */
    mnistcu_log_fn log;          /* NULL: write to stderr */
    void *log_user;              /* passed to log */
    mnistcu_allocator allocator; /* zero: malloc/free (cudaMalloc/cudaFree on the GPU) */
    mnistcu_gemm gemm;           /* CUDA matrix products: DEFAULT (see mnistcu_gemm) */
    mnistcu_data_mode data_mode; /* CUDA datasets: DEFAULT (see mnistcu_data_mode) */
} mnistcu_ctx_desc;

/* On failure *out still holds a context carrying the error message (NULL only when
   even that could not be allocated): read mnistcu_ctx_error, then destroy it. */
MNISTCU_DEF mnistcu_result mnistcu_ctx_create(mnistcu_ctx **out, const mnistcu_ctx_desc *desc);
MNISTCU_DEF void mnistcu_ctx_destroy(mnistcu_ctx *ctx);       /* NULL is fine */
MNISTCU_DEF const char *mnistcu_ctx_error(const mnistcu_ctx *ctx);  /* last error message, "" if none */
MNISTCU_DEF mnistcu_result mnistcu_ctx_last_result(const mnistcu_ctx *ctx);
MNISTCU_DEF void mnistcu_ctx_clear_error(mnistcu_ctx *ctx);   /* a latched CUDA error stays */
MNISTCU_DEF mnistcu_device mnistcu_ctx_device(const mnistcu_ctx *ctx); /* CPU or CUDA */
MNISTCU_DEF const char *mnistcu_ctx_device_name(const mnistcu_ctx *ctx); /* "CPU (2 threads)", "NVIDIA H100 (sm_90)" */
MNISTCU_DEF int mnistcu_ctx_threads(const mnistcu_ctx *ctx);
MNISTCU_DEF void mnistcu_ctx_resolved_desc(const mnistcu_ctx *ctx, mnistcu_ctx_desc *out); /* defaults filled in */
MNISTCU_DEF void mnistcu_free(mnistcu_ctx *ctx, void *ptr);   /* for buffers the library returns */

/* ---- IDX files and gzip ---------------------------------------------------
   IDX: bytes 0-1 zero, byte 2 the element type, byte 3 the dimension count,
   then one big-endian uint32 per dimension, then the elements, big-endian.
   Raw and gzip-compressed files are told apart by their content. */
#ifndef MNISTCU_IDX_MAX_DIMS
#define MNISTCU_IDX_MAX_DIMS 8
#endif

typedef enum mnistcu_idx_type {
    MNISTCU_IDX_U8  = 0x08,
    MNISTCU_IDX_I8  = 0x09,
    MNISTCU_IDX_I16 = 0x0B,
    MNISTCU_IDX_I32 = 0x0C,
    MNISTCU_IDX_F32 = 0x0D,
    MNISTCU_IDX_F64 = 0x0E
} mnistcu_idx_type;

typedef struct mnistcu_idx {
    mnistcu_idx_type type;
    int ndim;
    uint32_t dims[MNISTCU_IDX_MAX_DIMS];
    size_t count;      /* product of dims */
    size_t elem_size;  /* bytes per element */
    void *data;        /* count elements of type, in host byte order */
} mnistcu_idx;

MNISTCU_DEF mnistcu_result mnistcu_idx_load_file(mnistcu_ctx *ctx, const char *path, mnistcu_idx *out);
MNISTCU_DEF mnistcu_result mnistcu_idx_load_memory(mnistcu_ctx *ctx, const void *bytes, size_t size,
                                                   const char *name, mnistcu_idx *out);
MNISTCU_DEF void mnistcu_idx_free(mnistcu_ctx *ctx, mnistcu_idx *idx);
MNISTCU_DEF const char *mnistcu_idx_type_name(mnistcu_idx_type type); /* "ubyte", ..., NULL if unknown */

/* gzip (RFC 1952, several members allowed) and raw deflate (RFC 1951).
   max_out 0 means MNISTCU_IDX_MAX_BYTES. *out is freed with mnistcu_free. The
   output grows by a quarter at a time, never past max_out: under 2.25 times
   the final size (plus 4 KiB) is held at once (see LIMITS). */
MNISTCU_DEF mnistcu_result mnistcu_gunzip(mnistcu_ctx *ctx, const void *in, size_t in_size, size_t max_out,
                                          void **out, size_t *out_size);
MNISTCU_DEF mnistcu_result mnistcu_inflate(mnistcu_ctx *ctx, const void *in, size_t in_size, size_t max_out,
                                           void **out, size_t *out_size, size_t *in_used);
MNISTCU_DEF uint32_t mnistcu_crc32(uint32_t crc, const void *data, size_t size); /* start with 0 */

/* ---- datasets --------------------------------------------------------------
   A dataset holds count samples of rows x cols features and one label each.
   Features are stored as loaded (uint8 or float) and normalised on the way
   into a batch: x = stored * scale + shift. Training records the training set's
   scale and shift in the model, and a trained model normalises every dataset
   it evaluates (and every image it predicts) the same way: test data is never
   normalised with its own statistics. Two exceptions: a dataset stored in the
   other way than the training set (float vs uint8) keeps its own scale and
   shift, and a model that was never trained by mnistcu_train (weights set with
   mnistcu_model_set_params) uses each dataset's own, and x/255 in
   mnistcu_predict_u8; use mnistcu_dataset_normalize_like to control them. */
typedef struct mnistcu_dataset mnistcu_dataset;

typedef enum mnistcu_split { MNISTCU_SPLIT_TRAIN = 0, MNISTCU_SPLIT_TEST } mnistcu_split;

typedef enum mnistcu_norm {
    MNISTCU_NORM_DEFAULT = 0, /* STANDARD for uint8 images, NONE for other types */
    MNISTCU_NORM_NONE,        /* values as stored */
    MNISTCU_NORM_UNIT,        /* uint8 pixels / 255; other types as stored */
    MNISTCU_NORM_STANDARD     /* UNIT, then zero mean and unit variance over this dataset */
} mnistcu_norm;

typedef struct mnistcu_dataset_desc {
    const char *dir;              /* a folder with the split's files (either naming style, .gz or not) */
    mnistcu_split split;          /* TRAIN: train-*, TEST: t10k-* */
    const char *images_path;      /* or explicit files, raw or gzip */
    const char *labels_path;
    const void *images_data;      /* or files already in memory (used when the paths are NULL) */
    size_t images_size;
    const void *labels_data;
    size_t labels_size;
    int num_classes;              /* 0: 10 */
    mnistcu_norm norm;            /* DEFAULT: STANDARD for uint8 images, NONE otherwise */
    size_t limit;                 /* 0: all samples; else only the first `limit` */
} mnistcu_dataset_desc;

typedef struct mnistcu_dataset_info {
    size_t count;        /* samples */
    int rows, cols;      /* 28 x 28 for MNIST; 1 x n for flat data */
    size_t features;     /* rows * cols */
    int num_classes;
    int stored_u8;       /* 1 when features are kept as uint8 */
    float scale, shift;  /* normalisation: x = stored * scale + shift */
} mnistcu_dataset_info;

MNISTCU_DEF mnistcu_result mnistcu_dataset_load(mnistcu_ctx *ctx, const mnistcu_dataset_desc *desc, mnistcu_dataset **out);
MNISTCU_DEF mnistcu_result mnistcu_dataset_load_dir(mnistcu_ctx *ctx, const char *dir, mnistcu_split split,
                                                    mnistcu_dataset **out);
/* Copies count samples of `features` floats (already normalised) and their labels. */
MNISTCU_DEF mnistcu_result mnistcu_dataset_create(mnistcu_ctx *ctx, const float *x, const int32_t *labels, size_t count,
                                                  size_t features, int num_classes, mnistcu_dataset **out);
/* The first `first_count` samples (after an optional shuffle with the context's RNG) go to *first, the rest to *second. */
MNISTCU_DEF mnistcu_result mnistcu_dataset_split(mnistcu_ctx *ctx, const mnistcu_dataset *src, size_t first_count,
                                                 int shuffle, mnistcu_dataset **first, mnistcu_dataset **second);
/* Use ref's normalisation (e.g. the training set's mean and deviation for the test set). */
MNISTCU_DEF mnistcu_result mnistcu_dataset_normalize_like(mnistcu_dataset *ds, const mnistcu_dataset *ref);
MNISTCU_DEF void mnistcu_dataset_info_get(const mnistcu_dataset *ds, mnistcu_dataset_info *info);
/* Normalised features of sample i (info.features floats) and its label; either pointer may be NULL. */
MNISTCU_DEF mnistcu_result mnistcu_dataset_sample(const mnistcu_dataset *ds, size_t i, float *x, int32_t *label);
MNISTCU_DEF void mnistcu_dataset_destroy(mnistcu_dataset *ds);

/* ---- models ----------------------------------------------------------------
   A stack of dense layers y = act(x W^T + b). Parameters live in one arena, in
   PyTorch's order and layout: for each layer W [out][in] then b [out]. */
typedef struct mnistcu_model mnistcu_model;

typedef enum mnistcu_act {
    MNISTCU_ACT_DEFAULT = 0, /* = RELU */
    MNISTCU_ACT_RELU,
    MNISTCU_ACT_IDENTITY,
    MNISTCU_ACT_SIGMOID,
    MNISTCU_ACT_TANH
} mnistcu_act;

typedef enum mnistcu_loss {
    MNISTCU_LOSS_DEFAULT = 0, /* = SOFTMAX_CE */
    MNISTCU_LOSS_SOFTMAX_CE   /* softmax over the last layer, mean cross-entropy over the batch */
} mnistcu_loss;

typedef enum mnistcu_init {
    MNISTCU_INIT_DEFAULT = 0, /* = TORCH */
    MNISTCU_INIT_TORCH,       /* PyTorch's nn.Linear: W and b uniform in +-1/sqrt(fan_in) */
    MNISTCU_INIT_HE_UNIFORM   /* W uniform in +-sqrt(6/fan_in), b zero */
} mnistcu_init;

typedef struct mnistcu_model_desc {
    int sizes[MNISTCU_MAX_LAYERS + 1]; /* widths, input first, zero-terminated: {784, 128, 10} */
    mnistcu_act hidden_act;            /* DEFAULT: RELU; the last layer gives logits (no activation) */
    mnistcu_loss loss;                 /* DEFAULT: SOFTMAX_CE */
    mnistcu_init init;                 /* DEFAULT: TORCH */
} mnistcu_model_desc;

typedef struct mnistcu_model_info {
    int num_layers;                      /* dense layers */
    int sizes[MNISTCU_MAX_LAYERS + 1];   /* widths, input first */
    size_t num_params;
    size_t inputs, classes;
    mnistcu_act hidden_act;
    mnistcu_device device;
} mnistcu_model_info;

typedef enum mnistcu_optim {
    MNISTCU_OPTIM_DEFAULT = 0, /* = SGD */
    MNISTCU_OPTIM_SGD
} mnistcu_optim;

typedef struct mnistcu_optim_desc {
    mnistcu_optim kind;    /* DEFAULT: SGD */
    float learning_rate;   /* 0: 0.1 */
    float momentum;        /* 0: none (PyTorch semantics, no dampening) */
    int nesterov;          /* 0: off; needs momentum > 0 */
    float weight_decay;    /* 0: none (L2 added to the gradient, as torch.optim.SGD) */
} mnistcu_optim_desc;

MNISTCU_DEF mnistcu_result mnistcu_model_create(mnistcu_ctx *ctx, const mnistcu_model_desc *desc, mnistcu_model **out);
MNISTCU_DEF mnistcu_result mnistcu_model_create_mlp(mnistcu_ctx *ctx, const char *spec, mnistcu_model **out); /* "784-128-10" */
MNISTCU_DEF void mnistcu_model_destroy(mnistcu_model *m);
MNISTCU_DEF void mnistcu_model_info_get(const mnistcu_model *m, mnistcu_model_info *info);
MNISTCU_DEF size_t mnistcu_model_num_params(const mnistcu_model *m);
MNISTCU_DEF mnistcu_result mnistcu_model_get_params(const mnistcu_model *m, float *dst, size_t count);
MNISTCU_DEF mnistcu_result mnistcu_model_set_params(mnistcu_model *m, const float *src, size_t count);
MNISTCU_DEF mnistcu_result mnistcu_model_get_grads(const mnistcu_model *m, float *dst, size_t count);
/* Logits [n][classes] for n samples of normalised features [n][inputs]. */
MNISTCU_DEF mnistcu_result mnistcu_model_forward(mnistcu_model *m, const float *x, size_t n, float *logits);
/* Forward and backward over one batch: the gradients of the mean loss replace the gradient arena. */
MNISTCU_DEF mnistcu_result mnistcu_model_compute_grads(mnistcu_model *m, const float *x, const int32_t *labels, size_t n,
                                                       double *loss);
/* One optimizer step with the gradients in the arena (optimizer state persists in the model). */
MNISTCU_DEF mnistcu_result mnistcu_model_apply_grads(mnistcu_model *m, const mnistcu_optim_desc *opt);

/* ---- training, evaluation, prediction ------------------------------------- */
typedef struct mnistcu_progress {
    int epoch, epochs;            /* 1-based epoch */
    size_t step, steps;           /* steps done in this epoch, steps per epoch */
    size_t samples;               /* samples trained in this epoch */
    double train_loss;            /* mean loss over this epoch so far */
    double train_accuracy;        /* over this epoch so far (training mode, before each step) */
    int epoch_end;                /* 1 at the end of an epoch */
    int has_validation;           /* 1 when val_* are set (at epoch ends, with a validation set) */
    double val_loss, val_accuracy;
    double seconds;               /* training time so far */
    double images_per_second;     /* over this epoch so far */
} mnistcu_progress;

/* Return non-zero to stop training after this step (early stopping). */
typedef int (*mnistcu_progress_fn)(void *user, const mnistcu_progress *p);

typedef struct mnistcu_train_desc {
    int epochs;                          /* 0: 10 */
    int batch_size;                      /* 0: 64; the last partial batch is trained too */
    mnistcu_optim_desc optim;            /* zero: SGD, learning rate 0.1 */
    int no_shuffle;                      /* 0: reshuffle every epoch with the model's RNG */
    const mnistcu_dataset *validation;   /* NULL: none; else evaluated at every epoch end */
    size_t progress_every;               /* 0: report at epoch ends only; else every N steps too */
    mnistcu_progress_fn progress;        /* NULL: none */
    void *progress_user;
    int no_divergence_check;             /* 0: stop with MNISTCU_ERR_DIVERGED when the loss or a weight is
                                            not finite (checked at each report); 1: let NaN and inf propagate */
} mnistcu_train_desc;

typedef struct mnistcu_train_result {
    int epochs;                  /* epochs run (fewer when stopped) */
    size_t steps;                /* optimizer steps */
    double train_loss;           /* mean over the last epoch */
    double train_accuracy;
    int has_validation;
    double val_loss, val_accuracy; /* at the end of the last completed epoch (not a stopped one) */
    double seconds;              /* training wall time, evaluation excluded */
    int diverged_epoch;          /* MNISTCU_ERR_DIVERGED: the epoch and the step in it (1-based) where the */
    size_t diverged_step;        /* loss or a weight was first seen not finite; 0 otherwise */
} mnistcu_train_result;

typedef struct mnistcu_metrics {
    size_t count, correct;
    double loss;      /* mean cross-entropy */
    double accuracy;  /* correct / count */
} mnistcu_metrics;

MNISTCU_DEF void mnistcu_train_desc_resolve(const mnistcu_train_desc *desc, mnistcu_train_desc *out);
/* MNISTCU_ERR_DIVERGED when the loss or a weight stops being finite (see ERRORS):
   the model keeps the last weights known to be finite with a finite loss, and
   *result describes the training up to there, diverged_epoch and diverged_step
   included. */
MNISTCU_DEF mnistcu_result mnistcu_train(mnistcu_model *m, const mnistcu_dataset *train, const mnistcu_train_desc *desc,
                                         mnistcu_train_result *result);
/* confusion: NULL or classes*classes counts, row = true label, column = prediction. */
MNISTCU_DEF mnistcu_result mnistcu_evaluate(mnistcu_model *m, const mnistcu_dataset *ds, mnistcu_metrics *out,
                                            int64_t *confusion);
/* Class and/or probabilities [n][classes] for n samples of normalised features. */
MNISTCU_DEF mnistcu_result mnistcu_predict(mnistcu_model *m, const float *x, size_t n, int32_t *labels, float *probs);
/* The same for raw uint8 images, normalised as the model's training set was. */
MNISTCU_DEF mnistcu_result mnistcu_predict_u8(mnistcu_model *m, const uint8_t *pixels, size_t n, int32_t *labels,
                                              float *probs);

#ifdef __cplusplus
}
#endif
#endif /* MNISTCU_H */

/* ========================================================================== */
/*                               IMPLEMENTATION                               */
/* ========================================================================== */
#ifdef MNISTCU_IMPLEMENTATION
#ifndef MNISTCU__IMPLEMENTED
#define MNISTCU__IMPLEMENTED
/* >>config ------------------------------------------------------------------ */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef MNISTCU_MALLOC
#define MNISTCU_MALLOC(sz) malloc(sz)
#define MNISTCU_FREE(p) free(p)
#endif
#ifndef MNISTCU_IDX_MAX_BYTES
#define MNISTCU_IDX_MAX_BYTES ((size_t)1 << 30)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MNISTCU__PRINTF(a, b) __attribute__((format(printf, a, b)))
#define MNISTCU__RESTRICT __restrict__
#else
#define MNISTCU__PRINTF(a, b)
#define MNISTCU__RESTRICT
#endif
/* Per-element math shared by the CPU reference and the CUDA kernels. */
#ifdef __CUDACC__
#define MNISTCU__HD __host__ __device__
#else
#define MNISTCU__HD
#endif
#define MNISTCU__MIN(a, b) ((a) < (b) ? (a) : (b))
#define MNISTCU__MAX(a, b) ((a) > (b) ? (a) : (b))
#define MNISTCU__ERROR_SIZE 512

/* >>types ------------------------------------------------------------------- */
typedef struct mnistcu__rng { uint64_t s[4]; } mnistcu__rng; /* xoshiro256** state */

/* Every object records its context and sits in the context's list, so that
   mnistcu_ctx_destroy can free what the caller did not. */
typedef struct mnistcu__object {
    struct mnistcu__object *prev, *next;
    void (*destroy)(struct mnistcu__object *self);
} mnistcu__object;

struct mnistcu_ctx {
    mnistcu_ctx_desc desc;       /* resolved: defaults filled in */
    mnistcu_device device;       /* CPU or CUDA after resolution */
    int threads;
    char device_name[320];
    mnistcu_result last_result;
    char error[MNISTCU__ERROR_SIZE];
    mnistcu__object objects;     /* list head of live datasets and models */
    uint64_t objects_made;       /* seeds each model's RNG stream */
    float *gemm_work;            /* CPU matrix-product packing buffers */
    size_t gemm_work_floats;
    void *cuda;                  /* mnistcu__cuda state when the device is CUDA */
};

/* >>errors ------------------------------------------------------------------ */
MNISTCU_DEF const char *mnistcu_result_name(mnistcu_result r)
{
    static const char *const names[] = {
#define MNISTCU__RESULT_NAME(name, text) "MNISTCU_" #name,
        MNISTCU_RESULT_LIST(MNISTCU__RESULT_NAME)
#undef MNISTCU__RESULT_NAME
    };
    return ((unsigned)r < (unsigned)MNISTCU_RESULT_COUNT) ? names[r] : "MNISTCU_(unknown)";
}

MNISTCU_DEF const char *mnistcu_result_str(mnistcu_result r)
{
    static const char *const texts[] = {
#define MNISTCU__RESULT_TEXT(name, text) text,
        MNISTCU_RESULT_LIST(MNISTCU__RESULT_TEXT)
#undef MNISTCU__RESULT_TEXT
    };
    return ((unsigned)r < (unsigned)MNISTCU_RESULT_COUNT) ? texts[r] : "unknown result";
}

static void mnistcu__log(const mnistcu_ctx *ctx, mnistcu_log_level level, const char *fmt, ...) MNISTCU__PRINTF(3, 4);
static void mnistcu__log(const mnistcu_ctx *ctx, mnistcu_log_level level, const char *fmt, ...)
{
    char msg[MNISTCU__ERROR_SIZE];
    va_list ap;
    if (!ctx || ctx->desc.log_level == MNISTCU_LOG_SILENT || level > ctx->desc.log_level) return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ctx->desc.log) {
        ctx->desc.log(ctx->desc.log_user, level, msg);
    } else {
        fprintf(stderr, "mnistcu: %s%s\n", level == MNISTCU_LOG_ERROR ? "error: " :
                                           level == MNISTCU_LOG_WARN ? "warning: " : "", msg);
    }
}

/* Records an error in the context (message and code), logs it, returns it. */
static mnistcu_result mnistcu__fail(mnistcu_ctx *ctx, mnistcu_result r, const char *fmt, ...) MNISTCU__PRINTF(3, 4);
static mnistcu_result mnistcu__fail(mnistcu_ctx *ctx, mnistcu_result r, const char *fmt, ...)
{
    va_list ap;
    if (!ctx) return r;
    va_start(ap, fmt);
    vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
    va_end(ap);
    ctx->last_result = r;
    mnistcu__log(ctx, MNISTCU_LOG_ERROR, "%s", ctx->error);
    return r;
}

/* >>alloc ------------------------------------------------------------------- */
static void *mnistcu__alloc(mnistcu_ctx *ctx, size_t size)
{
    if (size == 0) size = 1;
    if (ctx && ctx->desc.allocator.alloc) return ctx->desc.allocator.alloc(ctx->desc.allocator.user, size);
    return MNISTCU_MALLOC(size);
}

static void mnistcu__free(mnistcu_ctx *ctx, void *p)
{
    if (!p) return;
    if (ctx && ctx->desc.allocator.free) ctx->desc.allocator.free(ctx->desc.allocator.user, p);
    else MNISTCU_FREE(p);
}

static void *mnistcu__calloc(mnistcu_ctx *ctx, size_t size)
{
    void *p = mnistcu__alloc(ctx, size);
    if (p) memset(p, 0, size);
    return p;
}

MNISTCU_DEF void mnistcu_free(mnistcu_ctx *ctx, void *ptr) { mnistcu__free(ctx, ptr); }

/* Overflow-checked size arithmetic: return 1 and set *out on success. */
static int mnistcu__mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}
static int mnistcu__add(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}
/* a*b*sizeof-like element size, for allocations of arrays. */
static int mnistcu__mul3(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    return mnistcu__mul(a, b, &ab) && mnistcu__mul(ab, c, out);
}

/* >>time -------------------------------------------------------------------- */
static double mnistcu__now(void)
{
#if defined(_OPENMP)
    return omp_get_wtime();
#elif defined(CLOCK_MONOTONIC)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#elif defined(TIME_UTC) && defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#else
    return (double)clock() / (double)CLOCKS_PER_SEC; /* strict C99: processor time */
#endif
}

/* >>rng ----------------------------------------------------------------------
   Our own generator, so results never depend on the C library: xoshiro256**
   seeded through splitmix64. Streams for different objects come from
   different seeds mixed the same way. */
static uint64_t mnistcu__splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void mnistcu__rng_seed(mnistcu__rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    int i;
    for (i = 0; i < 4; ++i) r->s[i] = mnistcu__splitmix64(&x);
}

static uint64_t mnistcu__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t mnistcu__rng_next(mnistcu__rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = mnistcu__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = mnistcu__rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 24 random bits: exactly representable as float. */
static float mnistcu__rng_float(mnistcu__rng *r)
{
    return (float)(mnistcu__rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform integer in [0, n), unbiased (Lemire's multiply-and-reject). */
static uint64_t mnistcu__rng_below(mnistcu__rng *r, uint64_t n)
{
    uint64_t x, hi, lo, threshold;
    if (n <= 1) return 0;
    threshold = (0 - n) % n;
    for (;;) {
        x = mnistcu__rng_next(r);
        /* 64x64 -> 128 multiply from 32-bit halves, portable C99 */
        {
            uint64_t a = x >> 32, b = x & 0xFFFFFFFFu, c = n >> 32, d = n & 0xFFFFFFFFu;
            uint64_t ac = a * c, ad = a * d, bc = b * c, bd = b * d;
            uint64_t mid = (bd >> 32) + (ad & 0xFFFFFFFFu) + (bc & 0xFFFFFFFFu);
            hi = ac + (ad >> 32) + (bc >> 32) + (mid >> 32);
            lo = (mid << 32) | (bd & 0xFFFFFFFFu);
        }
        if (lo >= threshold) return hi;
    }
}

/* Fisher-Yates over an index array. */
static void mnistcu__shuffle(mnistcu__rng *r, uint32_t *idx, size_t n)
{
    size_t i;
    for (i = n; i > 1; --i) {
        size_t j = (size_t)mnistcu__rng_below(r, (uint64_t)i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

/* >>files ------------------------------------------------------------------- */
/* Reads a whole file, refusing more than max_size bytes. */
static mnistcu_result mnistcu__read_file(mnistcu_ctx *ctx, const char *path, size_t max_size,
                                         unsigned char **data, size_t *size)
{
    FILE *f;
    unsigned char *buf = NULL;
    size_t cap = 0, len = 0;
    *data = NULL;
    *size = 0;
    f = fopen(path, "rb");
    if (!f) return mnistcu__fail(ctx, MNISTCU_ERR_NOT_FOUND, "%s: cannot open file", path);
    /* Grow geometrically rather than trust ftell: works for pipes and special files. */
    for (;;) {
        size_t got;
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : ((size_t)1 << 16);
            unsigned char *nbuf;
            if (ncap > max_size + 1) ncap = max_size + 1;
            if (ncap <= cap) {
                fclose(f);
                mnistcu__free(ctx, buf);
                return mnistcu__fail(ctx, MNISTCU_ERR_IDX_TOO_LARGE, "%s: file larger than %lu bytes", path,
                                     (unsigned long)max_size);
            }
            nbuf = (unsigned char *)mnistcu__alloc(ctx, ncap);
            if (!nbuf) {
                fclose(f);
                mnistcu__free(ctx, buf);
                return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%s: out of memory reading %lu bytes", path,
                                     (unsigned long)ncap);
            }
            if (len) memcpy(nbuf, buf, len);
            mnistcu__free(ctx, buf);
            buf = nbuf;
            cap = ncap;
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        fclose(f);
        mnistcu__free(ctx, buf);
        return mnistcu__fail(ctx, MNISTCU_ERR_IO, "%s: read error", path);
    }
    fclose(f);
    if (len > max_size) {
        mnistcu__free(ctx, buf);
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_TOO_LARGE, "%s: file larger than %lu bytes", path,
                             (unsigned long)max_size);
    }
    *data = buf;
    *size = len;
    return MNISTCU_OK;
}
/* >>inflate ------------------------------------------------------------------
   gzip files (RFC 1952) wrap a deflate stream (RFC 1951) between a small
   header and an 8-byte trailer (CRC-32 and size of the data). This section
   holds the three pieces, written to be read:

     mnistcu_crc32    the CRC-32 of zlib and gzip, one table lookup per byte
     mnistcu_inflate  raw deflate: stored, fixed-Huffman and dynamic-Huffman
                      blocks; a 10-bit lookup table decodes most Huffman codes
                      in one step, a canonical walk decodes the longer ones
     mnistcu_gunzip   the gzip container, one or several members

   Nothing taken from the input is trusted: every read is bounds-checked, the
   output never grows past max_out, and sizes in the input are at most hints. */

/* CRC-32, reflected polynomial 0xEDB88320 (as zlib, gzip, PNG and Ethernet).
   Entry n is the CRC of the byte n alone, made by this loop:
       c = n; repeat 8 times: c = (c & 1) ? (c >> 1) ^ 0xEDB88320 : c >> 1;
   A constant table needs no initialisation, so it is safe from any thread. */
static const uint32_t mnistcu__crc_table[256] = {
    0x00000000, 0x77073096, 0xEE0E612C, 0x990951BA, 0x076DC419, 0x706AF48F, 0xE963A535, 0x9E6495A3,
    0x0EDB8832, 0x79DCB8A4, 0xE0D5E91E, 0x97D2D988, 0x09B64C2B, 0x7EB17CBD, 0xE7B82D07, 0x90BF1D91,
    0x1DB71064, 0x6AB020F2, 0xF3B97148, 0x84BE41DE, 0x1ADAD47D, 0x6DDDE4EB, 0xF4D4B551, 0x83D385C7,
    0x136C9856, 0x646BA8C0, 0xFD62F97A, 0x8A65C9EC, 0x14015C4F, 0x63066CD9, 0xFA0F3D63, 0x8D080DF5,
    0x3B6E20C8, 0x4C69105E, 0xD56041E4, 0xA2677172, 0x3C03E4D1, 0x4B04D447, 0xD20D85FD, 0xA50AB56B,
    0x35B5A8FA, 0x42B2986C, 0xDBBBC9D6, 0xACBCF940, 0x32D86CE3, 0x45DF5C75, 0xDCD60DCF, 0xABD13D59,
    0x26D930AC, 0x51DE003A, 0xC8D75180, 0xBFD06116, 0x21B4F4B5, 0x56B3C423, 0xCFBA9599, 0xB8BDA50F,
    0x2802B89E, 0x5F058808, 0xC60CD9B2, 0xB10BE924, 0x2F6F7C87, 0x58684C11, 0xC1611DAB, 0xB6662D3D,
    0x76DC4190, 0x01DB7106, 0x98D220BC, 0xEFD5102A, 0x71B18589, 0x06B6B51F, 0x9FBFE4A5, 0xE8B8D433,
    0x7807C9A2, 0x0F00F934, 0x9609A88E, 0xE10E9818, 0x7F6A0DBB, 0x086D3D2D, 0x91646C97, 0xE6635C01,
    0x6B6B51F4, 0x1C6C6162, 0x856530D8, 0xF262004E, 0x6C0695ED, 0x1B01A57B, 0x8208F4C1, 0xF50FC457,
    0x65B0D9C6, 0x12B7E950, 0x8BBEB8EA, 0xFCB9887C, 0x62DD1DDF, 0x15DA2D49, 0x8CD37CF3, 0xFBD44C65,
    0x4DB26158, 0x3AB551CE, 0xA3BC0074, 0xD4BB30E2, 0x4ADFA541, 0x3DD895D7, 0xA4D1C46D, 0xD3D6F4FB,
    0x4369E96A, 0x346ED9FC, 0xAD678846, 0xDA60B8D0, 0x44042D73, 0x33031DE5, 0xAA0A4C5F, 0xDD0D7CC9,
    0x5005713C, 0x270241AA, 0xBE0B1010, 0xC90C2086, 0x5768B525, 0x206F85B3, 0xB966D409, 0xCE61E49F,
    0x5EDEF90E, 0x29D9C998, 0xB0D09822, 0xC7D7A8B4, 0x59B33D17, 0x2EB40D81, 0xB7BD5C3B, 0xC0BA6CAD,
    0xEDB88320, 0x9ABFB3B6, 0x03B6E20C, 0x74B1D29A, 0xEAD54739, 0x9DD277AF, 0x04DB2615, 0x73DC1683,
    0xE3630B12, 0x94643B84, 0x0D6D6A3E, 0x7A6A5AA8, 0xE40ECF0B, 0x9309FF9D, 0x0A00AE27, 0x7D079EB1,
    0xF00F9344, 0x8708A3D2, 0x1E01F268, 0x6906C2FE, 0xF762575D, 0x806567CB, 0x196C3671, 0x6E6B06E7,
    0xFED41B76, 0x89D32BE0, 0x10DA7A5A, 0x67DD4ACC, 0xF9B9DF6F, 0x8EBEEFF9, 0x17B7BE43, 0x60B08ED5,
    0xD6D6A3E8, 0xA1D1937E, 0x38D8C2C4, 0x4FDFF252, 0xD1BB67F1, 0xA6BC5767, 0x3FB506DD, 0x48B2364B,
    0xD80D2BDA, 0xAF0A1B4C, 0x36034AF6, 0x41047A60, 0xDF60EFC3, 0xA867DF55, 0x316E8EEF, 0x4669BE79,
    0xCB61B38C, 0xBC66831A, 0x256FD2A0, 0x5268E236, 0xCC0C7795, 0xBB0B4703, 0x220216B9, 0x5505262F,
    0xC5BA3BBE, 0xB2BD0B28, 0x2BB45A92, 0x5CB36A04, 0xC2D7FFA7, 0xB5D0CF31, 0x2CD99E8B, 0x5BDEAE1D,
    0x9B64C2B0, 0xEC63F226, 0x756AA39C, 0x026D930A, 0x9C0906A9, 0xEB0E363F, 0x72076785, 0x05005713,
    0x95BF4A82, 0xE2B87A14, 0x7BB12BAE, 0x0CB61B38, 0x92D28E9B, 0xE5D5BE0D, 0x7CDCEFB7, 0x0BDBDF21,
    0x86D3D2D4, 0xF1D4E242, 0x68DDB3F8, 0x1FDA836E, 0x81BE16CD, 0xF6B9265B, 0x6FB077E1, 0x18B74777,
    0x88085AE6, 0xFF0F6A70, 0x66063BCA, 0x11010B5C, 0x8F659EFF, 0xF862AE69, 0x616BFFD3, 0x166CCF45,
    0xA00AE278, 0xD70DD2EE, 0x4E048354, 0x3903B3C2, 0xA7672661, 0xD06016F7, 0x4969474D, 0x3E6E77DB,
    0xAED16A4A, 0xD9D65ADC, 0x40DF0B66, 0x37D83BF0, 0xA9BCAE53, 0xDEBB9EC5, 0x47B2CF7F, 0x30B5FFE9,
    0xBDBDF21C, 0xCABAC28A, 0x53B39330, 0x24B4A3A6, 0xBAD03605, 0xCDD70693, 0x54DE5729, 0x23D967BF,
    0xB3667A2E, 0xC4614AB8, 0x5D681B02, 0x2A6F2B94, 0xB40BBE37, 0xC30C8EA1, 0x5A05DF1B, 0x2D02EF8D,
};

MNISTCU_DEF uint32_t mnistcu_crc32(uint32_t crc, const void *data, size_t size)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    if (!p) return crc;
    /* The register starts and ends inverted; doing both here lets calls chain:
       crc32(crc32(0, a), b) is the CRC of a followed by b. */
    crc = ~crc;
    for (i = 0; i < size; ++i) crc = mnistcu__crc_table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}

#define MNISTCU__ULL(x) ((unsigned long long)(x)) /* sizes in messages: %llu everywhere */

/* Deflate codes lengths 3..258 as symbols 257..285 plus extra bits, and
   distances 1..32768 as symbols 0..29 plus extra bits (RFC 1951, 3.2.5). */
static const uint16_t mnistcu__len_base[29] = {
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31,
    35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const unsigned char mnistcu__len_extra[29] = {
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2,
    3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t mnistcu__dist_base[30] = {
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193,
    257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const unsigned char mnistcu__dist_extra[30] = {
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6,
    7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
/* The order in which a dynamic block lists the code lengths of the code-length code. */
static const unsigned char mnistcu__clen_order[19] = {
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

/* A canonical Huffman code (RFC 1951, 3.2.2): only the code length of each
   symbol is sent; codes of one length are consecutive integers, given to the
   symbols in increasing order, and shorter codes come first.

   Decoding: `fast` is indexed by the next MNISTCU__FAST_BITS input bits. An
   entry holds (length << 9) | symbol for the code those bits start with, or
   0 when the code is longer (or the bits start no code). Then the slow path
   reads one bit at a time, using `count` and `symbol`: the codes of length L
   are first_L, first_L + 1, ... and belong to the next count[L] symbols of
   `symbol`, which lists the symbols by length, then by value. */
#define MNISTCU__FAST_BITS 10
#define MNISTCU__MAX_CODE_BITS 15

typedef struct mnistcu__huffman {
    uint16_t fast[1 << MNISTCU__FAST_BITS];
    uint16_t count[MNISTCU__MAX_CODE_BITS + 1]; /* number of codes of each length; count[0] unused */
    uint16_t symbol[288];                       /* symbols ordered by code */
    int used;                                   /* symbols with a code */
} mnistcu__huffman;

/* Builds the decoder for n code lengths (0: symbol unused). Returns OK, or
   ERR_DEFLATE_OVERSUBSCRIBED when the lengths ask for more codes than exist,
   or ERR_DEFLATE_INCOMPLETE when some bit patterns start no code. Deflate and
   zlib accept two incomplete codes: a single code of length 1 (allow_single)
   and, for distances, no code at all (allow_empty); decoding an unused
   pattern then fails with ERR_DEFLATE_SYMBOL. */
static mnistcu_result mnistcu__huff_build(mnistcu__huffman *h, const unsigned char *lengths, int n,
                                          int allow_single, int allow_empty)
{
    uint16_t offset[MNISTCU__MAX_CODE_BITS + 2];
    int sym, len, k, used = 0;
    long left = 1; /* code space still free, in units of the current length */
    unsigned code;

    memset(h->count, 0, sizeof h->count);
    for (sym = 0; sym < n; ++sym) h->count[lengths[sym]]++;
    for (len = 1; len <= MNISTCU__MAX_CODE_BITS; ++len) {
        left = left * 2 - h->count[len];
        if (left < 0) return MNISTCU_ERR_DEFLATE_OVERSUBSCRIBED;
        used += h->count[len];
    }
    if (left > 0) {
        int single = used == 1 && h->count[1] == 1;
        if (!((allow_single && single) || (allow_empty && used == 0))) return MNISTCU_ERR_DEFLATE_INCOMPLETE;
    }
    h->used = used;

    /* Sort the symbols by length (stable, so by value within one length). */
    offset[1] = 0;
    for (len = 1; len <= MNISTCU__MAX_CODE_BITS; ++len) offset[len + 1] = (uint16_t)(offset[len] + h->count[len]);
    for (sym = 0; sym < n; ++sym)
        if (lengths[sym]) h->symbol[offset[lengths[sym]]++] = (uint16_t)sym;

    /* Fill the fast table. Deflate sends a code's first bit first, so an
       input-ordered index holds the code bit-reversed; a code of length L
       fills every entry whose low L bits are that reversed code. */
    memset(h->fast, 0, sizeof h->fast);
    code = 0;
    sym = 0; /* index into h->symbol */
    for (len = 1; len <= MNISTCU__FAST_BITS; ++len) {
        for (k = 0; k < h->count[len]; ++k, ++code, ++sym) {
            unsigned rev = 0, i, fill;
            uint16_t entry = (uint16_t)((len << 9) | h->symbol[sym]);
            for (i = 0; i < (unsigned)len; ++i) rev |= ((code >> i) & 1u) << (len - 1 - (int)i);
            for (fill = rev; fill < (1u << MNISTCU__FAST_BITS); fill += 1u << len) h->fast[fill] = entry;
        }
        code <<= 1; /* the first code of the next length */
    }
    return MNISTCU_OK;
}

/* The decoder's state. Bits are consumed from the low end of `bits`. */
typedef struct mnistcu__inflater {
    mnistcu_ctx *ctx;
    const char *name;          /* starts every message when not NULL */
    const unsigned char *in;   /* the deflate stream */
    size_t in_size;
    size_t pos;                /* next byte of `in` to load into `bits` */
    size_t base;               /* offset of in[0] in the caller's data, for messages */
    uint64_t bits;             /* loaded bits not consumed yet, next bit lowest */
    unsigned nbits;            /* how many */
    unsigned char *out;        /* output so far (of every gzip member) */
    size_t out_len, out_cap, max_out;
    size_t out_start;          /* where this stream's output starts: no match reaches before it */
    int have_fixed;            /* fixed_lit and fixed_dist are built */
    mnistcu__huffman lit, dist, fixed_lit, fixed_dist;
    /* When the output is an IDX file (mnistcu__idx_load on gzip data), its header
       fixes the output size: out is then reallocated once, to exactly that. */
    int idx_mode;              /* read the IDX header as soon as it is out */
    int idx_sized;             /* done: out_cap == max_out == the size the header declares */
    size_t in_total;           /* all compressed bytes: the most a stream can expand to is 1032 times this */
} mnistcu__inflater;

/* Input offset of the byte holding the last bit read: where a problem was seen. */
static size_t mnistcu__inflate_where(const mnistcu__inflater *s)
{
    size_t consumed_bits = s->pos * 8 - s->nbits;
    return s->base + (consumed_bits ? (consumed_bits - 1) / 8 : 0);
}

static mnistcu_result mnistcu__inflate_fail(mnistcu__inflater *s, mnistcu_result r, const char *fmt, ...)
    MNISTCU__PRINTF(3, 4);
static mnistcu_result mnistcu__inflate_fail(mnistcu__inflater *s, mnistcu_result r, const char *fmt, ...)
{
    char what[MNISTCU__ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mnistcu__fail(s->ctx, r, "%s%sdeflate: %s (input byte %llu)", s->name ? s->name : "",
                         s->name ? ": " : "", what, MNISTCU__ULL(mnistcu__inflate_where(s)));
}

static mnistcu_result mnistcu__inflate_truncated(mnistcu__inflater *s)
{
    return mnistcu__fail(s->ctx, MNISTCU_ERR_DEFLATE_TRUNCATED,
                         "%s%sdeflate: the input ends inside the compressed stream (at byte %llu)",
                         s->name ? s->name : "", s->name ? ": " : "", MNISTCU__ULL(s->base + s->in_size));
}

/* Loads whole bytes until `bits` holds more than 56 bits or the input ends. */
static void mnistcu__inflate_refill(mnistcu__inflater *s)
{
    while (s->nbits <= 56 && s->pos < s->in_size) {
        s->bits |= (uint64_t)s->in[s->pos++] << s->nbits;
        s->nbits += 8;
    }
}

/* Reads n <= 32 bits, first bit lowest. Returns 0 if the input ends first. */
static int mnistcu__inflate_bits(mnistcu__inflater *s, unsigned n, unsigned *value)
{
    if (s->nbits < n) {
        mnistcu__inflate_refill(s);
        if (s->nbits < n) return 0;
    }
    *value = (unsigned)(s->bits & (((uint64_t)1 << n) - 1));
    s->bits >>= n;
    s->nbits -= n;
    return 1;
}

#define MNISTCU__DECODE_TRUNCATED (-1) /* the input ended inside a code */
#define MNISTCU__DECODE_INVALID (-2)   /* the bits start no code (incomplete code) */

/* Decodes one symbol, or returns a negative MNISTCU__DECODE_ value. */
static int mnistcu__huff_decode(mnistcu__inflater *s, const mnistcu__huffman *h)
{
    unsigned entry, len;
    int code = 0, first = 0, index = 0;
    if (s->nbits < MNISTCU__MAX_CODE_BITS) mnistcu__inflate_refill(s);
    /* Fast path. Past the end of the input the missing bits read as zeros,
       so a code found there is real only if it fits in the bits we have. */
    entry = h->fast[s->bits & ((1u << MNISTCU__FAST_BITS) - 1)];
    if (entry) {
        len = entry >> 9;
        if (len > s->nbits) return MNISTCU__DECODE_TRUNCATED;
        s->bits >>= len;
        s->nbits -= len;
        return (int)(entry & 511u);
    }
    /* Slow path, one bit at a time: `code` is the bits read so far, `first`
       the first code of length len, `index` where its symbols start. */
    for (len = 1; len <= MNISTCU__MAX_CODE_BITS; ++len) {
        int count = h->count[len];
        if (len > s->nbits) return MNISTCU__DECODE_TRUNCATED;
        code |= (int)((s->bits >> (len - 1)) & 1u);
        if (code - first < count) {
            s->bits >>= len;
            s->nbits -= len;
            return h->symbol[index + code - first];
        }
        index += count;
        if (index == h->used) break; /* no longer codes: an unused pattern of an incomplete code */
        first = (first + count) << 1;
        code <<= 1;
    }
    return MNISTCU__DECODE_INVALID;
}

static mnistcu_result mnistcu__inflate_bad_code(mnistcu__inflater *s, int decoded, const char *code_name)
{
    if (decoded == MNISTCU__DECODE_TRUNCATED) return mnistcu__inflate_truncated(s);
    return mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_SYMBOL, "the input bits match no %s code", code_name);
}

static mnistcu_result mnistcu__inflate_idx_size(mnistcu__inflater *s);
static mnistcu_result mnistcu__inflate_idx_overrun(mnistcu__inflater *s);

/* Makes room for `extra` more output bytes, copying what is there. The buffer
   grows by a quarter (at least 4 KiB), never past max_out: the old and the new
   buffer together, the most ever held, stay under 2.25 times the final output
   plus 4 KiB (it grows only for bytes that are then written, so the old one is
   smaller than the final output, and the new one at most a quarter larger, or
   4 KiB, or just what the bytes need). */
static mnistcu_result mnistcu__inflate_reserve(mnistcu__inflater *s, size_t extra)
{
    size_t need, cap, grow;
    unsigned char *grown;
    mnistcu_result r;
    if (s->out_cap - s->out_len >= extra) return MNISTCU_OK;
    if (s->idx_mode && !s->idx_sized) { /* the first time the probe buffer fills: read the IDX header */
        if ((r = mnistcu__inflate_idx_size(s)) != MNISTCU_OK) return r;
        if (s->out_cap - s->out_len >= extra) return MNISTCU_OK;
    }
    if (extra > s->max_out - s->out_len) {
        if (s->idx_sized) return mnistcu__inflate_idx_overrun(s);
        return mnistcu__inflate_fail(s, MNISTCU_ERR_GZ_TOO_LARGE, "the output would exceed the limit of %llu bytes",
                                     MNISTCU__ULL(s->max_out));
    }
    need = s->out_len + extra;
    grow = MNISTCU__MAX(s->out_cap / 4, (size_t)4096);
    cap = grow > s->max_out - s->out_cap ? s->max_out : s->out_cap + grow; /* out_cap <= max_out */
    if (cap < need) cap = need;
    grown = (unsigned char *)mnistcu__alloc(s->ctx, cap);
    if (!grown)
        return mnistcu__inflate_fail(s, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory growing the output to %llu bytes",
                                     MNISTCU__ULL(cap));
    if (s->out_len) memcpy(grown, s->out, s->out_len);
    mnistcu__free(s->ctx, s->out);
    s->out = grown;
    s->out_cap = cap;
    return MNISTCU_OK;
}

/* Block type 0: byte-aligned LEN, NLEN (its complement) and LEN raw bytes. */
static mnistcu_result mnistcu__inflate_stored(mnistcu__inflater *s)
{
    unsigned len, nlen;
    mnistcu_result r;
    s->bits >>= s->nbits & 7u; /* skip to the next byte boundary */
    s->nbits -= s->nbits & 7u;
    if (!mnistcu__inflate_bits(s, 16, &len) || !mnistcu__inflate_bits(s, 16, &nlen))
        return mnistcu__inflate_truncated(s);
    if (len != (~nlen & 0xFFFFu))
        return mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_STORED_LENGTH,
                                     "stored block LEN 0x%04x is not the complement of NLEN 0x%04x", len, nlen);
    /* Hand back the whole bytes still in the bit buffer and copy straight from the input. */
    s->pos -= s->nbits / 8;
    s->bits = 0;
    s->nbits = 0;
    if (s->in_size - s->pos < len) return mnistcu__inflate_truncated(s);
    r = mnistcu__inflate_reserve(s, len);
    if (r) return r;
    if (len) memcpy(s->out + s->out_len, s->in + s->pos, len);
    s->out_len += len;
    s->pos += len;
    return MNISTCU_OK;
}

/* Decodes literals and matches until the end-of-block symbol (256). */
static mnistcu_result mnistcu__inflate_codes(mnistcu__inflater *s, const mnistcu__huffman *lit,
                                             const mnistcu__huffman *dist)
{
    mnistcu_result r;
    for (;;) {
        int sym = mnistcu__huff_decode(s, lit);
        if (sym < 256) {
            if (sym < 0) return mnistcu__inflate_bad_code(s, sym, "literal/length");
            if (s->out_len == s->out_cap && (r = mnistcu__inflate_reserve(s, 1)) != MNISTCU_OK) return r;
            s->out[s->out_len++] = (unsigned char)sym;
        } else if (sym == 256) {
            return MNISTCU_OK;
        } else {
            /* A match: copy `length` bytes from `distance` bytes back. */
            unsigned extra, length, distance;
            unsigned char *dst;
            if (sym > 285)
                return mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_SYMBOL, "invalid literal/length symbol %d", sym);
            if (!mnistcu__inflate_bits(s, mnistcu__len_extra[sym - 257], &extra)) return mnistcu__inflate_truncated(s);
            length = mnistcu__len_base[sym - 257] + extra;
            sym = mnistcu__huff_decode(s, dist);
            if (sym < 0) return mnistcu__inflate_bad_code(s, sym, "distance");
            if (sym > 29) return mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_SYMBOL, "invalid distance symbol %d", sym);
            if (!mnistcu__inflate_bits(s, mnistcu__dist_extra[sym], &extra)) return mnistcu__inflate_truncated(s);
            distance = mnistcu__dist_base[sym] + extra;
            if (distance > s->out_len - s->out_start)
                return mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_DISTANCE,
                                             "a match reaches %u bytes back but only %llu bytes were written",
                                             distance, MNISTCU__ULL(s->out_len - s->out_start));
            if (s->out_cap - s->out_len < length && (r = mnistcu__inflate_reserve(s, length)) != MNISTCU_OK)
                return r;
            dst = s->out + s->out_len;
            if (distance == 1) {
                memset(dst, dst[-1], length); /* a run of one byte */
            } else if (distance >= length) {
                memcpy(dst, dst - distance, length);
            } else {
                unsigned i; /* the copy overlaps itself: it repeats the last `distance` bytes */
                for (i = 0; i < length; ++i) dst[i] = dst[(ptrdiff_t)i - (ptrdiff_t)distance];
            }
            s->out_len += length;
        }
    }
}

/* Block type 1: the fixed codes of RFC 1951, 3.2.6, built on first use. */
static mnistcu_result mnistcu__inflate_fixed(mnistcu__inflater *s)
{
    if (!s->have_fixed) {
        unsigned char lengths[288];
        int i;
        for (i = 0; i < 144; ++i) lengths[i] = 8;
        for (; i < 256; ++i) lengths[i] = 9;
        for (; i < 280; ++i) lengths[i] = 7;
        for (; i < 288; ++i) lengths[i] = 8;
        (void)mnistcu__huff_build(&s->fixed_lit, lengths, 288, 0, 0); /* both complete: cannot fail */
        for (i = 0; i < 32; ++i) lengths[i] = 5;
        (void)mnistcu__huff_build(&s->fixed_dist, lengths, 32, 0, 0);
        s->have_fixed = 1;
    }
    return mnistcu__inflate_codes(s, &s->fixed_lit, &s->fixed_dist);
}

/* Block type 2: the block starts with its own codes, themselves sent as code
   lengths compressed with a small "code-length code" (RFC 1951, 3.2.7). */
static mnistcu_result mnistcu__inflate_dynamic(mnistcu__inflater *s)
{
    unsigned char lengths[286 + 30], clen[19];
    unsigned nlit, ndist, nclen, i, n, v;
    mnistcu_result r;

    if (!mnistcu__inflate_bits(s, 5, &nlit) || !mnistcu__inflate_bits(s, 5, &ndist) ||
        !mnistcu__inflate_bits(s, 4, &nclen))
        return mnistcu__inflate_truncated(s);
    nlit += 257;
    ndist += 1;
    nclen += 4;
    if (nlit > 286 || ndist > 30)
        return mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_LENGTHS,
                                     "dynamic block declares %u literal/length codes (at most 286) and %u "
                                     "distance codes (at most 30)", nlit, ndist);

    memset(clen, 0, sizeof clen);
    for (i = 0; i < nclen; ++i) {
        if (!mnistcu__inflate_bits(s, 3, &v)) return mnistcu__inflate_truncated(s);
        clen[mnistcu__clen_order[i]] = (unsigned char)v;
    }
    r = mnistcu__huff_build(&s->lit, clen, 19, 0, 0);
    if (r) return mnistcu__inflate_fail(s, r, "the code-length code is %s", r == MNISTCU_ERR_DEFLATE_INCOMPLETE ?
                                                "incomplete" : "over-subscribed");

    /* The literal/length and distance code lengths form one sequence. */
    for (n = 0; n < nlit + ndist;) {
        int sym = mnistcu__huff_decode(s, &s->lit);
        unsigned repeat, value = 0;
        if (sym < 0) return mnistcu__inflate_bad_code(s, sym, "code-length");
        if (sym < 16) {
            lengths[n++] = (unsigned char)sym;
            continue;
        }
        if (sym == 16) { /* repeat the previous length 3..6 times */
            if (n == 0)
                return mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_LENGTHS,
                                             "code-length symbol 16 repeats a previous length, but there is none");
            value = lengths[n - 1];
            if (!mnistcu__inflate_bits(s, 2, &repeat)) return mnistcu__inflate_truncated(s);
            repeat += 3;
        } else if (sym == 17) { /* 3..10 zeros */
            if (!mnistcu__inflate_bits(s, 3, &repeat)) return mnistcu__inflate_truncated(s);
            repeat += 3;
        } else { /* 18: 11..138 zeros */
            if (!mnistcu__inflate_bits(s, 7, &repeat)) return mnistcu__inflate_truncated(s);
            repeat += 11;
        }
        if (repeat > nlit + ndist - n)
            return mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_LENGTHS,
                                         "a repeat of %u code lengths runs past the %u declared (%u given so far)",
                                         repeat, nlit + ndist, n);
        memset(lengths + n, (int)value, repeat);
        n += repeat;
    }

    if (lengths[256] == 0)
        return mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_NO_END_OF_BLOCK,
                                     "the end-of-block symbol 256 has no code");
    r = mnistcu__huff_build(&s->lit, lengths, (int)nlit, 1, 0);
    if (r) return mnistcu__inflate_fail(s, r, "the literal/length code is %s", r == MNISTCU_ERR_DEFLATE_INCOMPLETE ?
                                                "incomplete" : "over-subscribed");
    r = mnistcu__huff_build(&s->dist, lengths + nlit, (int)ndist, 1, 1);
    if (r) return mnistcu__inflate_fail(s, r, "the distance code is %s", r == MNISTCU_ERR_DEFLATE_INCOMPLETE ?
                                                "incomplete" : "over-subscribed");
    return mnistcu__inflate_codes(s, &s->lit, &s->dist);
}

/* Prepares an output buffer. size_hint (0: none) is only a first guess; without
   one the buffer starts at 4 times the input. At least 4 KiB, at most max_out;
   idx_mode starts with a probe just large enough for any IDX header accepted. */
#define MNISTCU__IDX_PROBE 64

static mnistcu_result mnistcu__inflater_start(mnistcu__inflater *s, mnistcu_ctx *ctx, const char *name,
                                              size_t max_out, size_t size_hint, size_t in_size, int idx_mode)
{
    size_t cap = size_hint;
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->name = name;
    s->max_out = max_out ? max_out : MNISTCU_IDX_MAX_BYTES;
    s->idx_mode = idx_mode;
    s->in_total = in_size;
    if (cap == 0 && !mnistcu__mul(in_size, 4, &cap)) cap = s->max_out;
    if (cap < 4096) cap = 4096;
    if (idx_mode) cap = MNISTCU__IDX_PROBE;
    if (cap > s->max_out) cap = s->max_out;
    s->out = (unsigned char *)mnistcu__alloc(ctx, cap);
    if (!s->out)
        return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%s%sdeflate: out of memory for %llu output bytes",
                             name ? name : "", name ? ": " : "", MNISTCU__ULL(cap));
    s->out_cap = cap;
    return MNISTCU_OK;
}

/* Decodes one deflate stream from in[0..in_size), appending to s->out. base is
   in[0]'s offset in the caller's data (for messages). *used: bytes consumed. */
static mnistcu_result mnistcu__inflate_stream(mnistcu__inflater *s, const unsigned char *in, size_t in_size,
                                              size_t base, size_t *used)
{
    unsigned final, type;
    mnistcu_result r;
    s->in = in;
    s->in_size = in_size;
    s->base = base;
    s->pos = 0;
    s->bits = 0;
    s->nbits = 0;
    s->out_start = s->out_len;
    do {
        if (!mnistcu__inflate_bits(s, 1, &final) || !mnistcu__inflate_bits(s, 2, &type))
            return mnistcu__inflate_truncated(s);
        if (type == 0) r = mnistcu__inflate_stored(s);
        else if (type == 1) r = mnistcu__inflate_fixed(s);
        else if (type == 2) r = mnistcu__inflate_dynamic(s);
        else r = mnistcu__inflate_fail(s, MNISTCU_ERR_DEFLATE_BLOCK_TYPE, "block type 3 is reserved");
        if (r) return r;
    } while (!final);
    /* Whole bytes still in the bit buffer were loaded ahead but not used. */
    *used = s->pos - s->nbits / 8;
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_inflate(mnistcu_ctx *ctx, const void *in, size_t in_size, size_t max_out,
                                           void **out, size_t *out_size, size_t *in_used)
{
    mnistcu__inflater s;
    size_t used = 0;
    mnistcu_result r;
    if (out) *out = NULL;
    if (out_size) *out_size = 0;
    if (in_used) *in_used = 0;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out || !out_size || (!in && in_size))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "mnistcu_inflate: %s is NULL",
                             !out ? "out" : !out_size ? "out_size" : "in");
    r = mnistcu__inflater_start(&s, ctx, NULL, max_out, 0, in_size, 0);
    if (r) return r;
    r = mnistcu__inflate_stream(&s, (const unsigned char *)in, in_size, 0, &used);
    if (r) {
        mnistcu__free(ctx, s.out);
        return r;
    }
    *out = s.out;
    *out_size = s.out_len;
    if (in_used) *in_used = used;
    return MNISTCU_OK;
}

/* gzip (RFC 1952). A file is one or more members, each:
     1f 8b, method 8, flags, mtime(4), xfl, os      10-byte header
     [FEXTRA: 2-byte length, data] [FNAME: text, 0] [FCOMMENT: text, 0]
     [FHCRC: low 16 bits of the CRC-32 of the header so far]
     deflate stream
     CRC-32 of the member's data, its size mod 2^32   both little-endian */
#define MNISTCU__GZ_FHCRC 0x02u
#define MNISTCU__GZ_FEXTRA 0x04u
#define MNISTCU__GZ_FNAME 0x08u
#define MNISTCU__GZ_FCOMMENT 0x10u
#define MNISTCU__GZ_RESERVED 0xE0u

static uint32_t mnistcu__le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Decodes every member into s->out (already started). */
static mnistcu_result mnistcu__gunzip_members(mnistcu__inflater *s, const unsigned char *p, size_t size)
{
    const char *pre = s->name ? s->name : "", *sep = s->name ? ": " : "";
    mnistcu_ctx *ctx = s->ctx;
    size_t pos = 0;
    int member;
    for (member = 1; member == 1 || pos < size; ++member) {
        size_t start = pos, avail = size - pos, hp, used = 0, out_start = s->out_len, out_len;
        unsigned flags;
        uint32_t crc, stored;
        mnistcu_result r;

        if (avail < 2 || p[pos] != 0x1F || p[pos + 1] != 0x8B) {
            if (member == 1)
                return mnistcu__fail(ctx, MNISTCU_ERR_GZ_MAGIC, "%s%sgzip: %s", pre, sep,
                                     avail < 2 ? "too short for a gzip header (needs 1f 8b ...)"
                                               : "does not start with the gzip magic bytes 1f 8b");
            return mnistcu__fail(ctx, MNISTCU_ERR_GZ_TRAILING,
                                 "%s%sgzip: %llu bytes after member %d (from byte %llu) are not another gzip member",
                                 pre, sep, MNISTCU__ULL(avail), member - 1, MNISTCU__ULL(pos));
        }
        if (avail >= 3 && p[pos + 2] != 8)
            return mnistcu__fail(ctx, MNISTCU_ERR_GZ_METHOD, "%s%sgzip: compression method %u at byte %llu (8 is deflate)",
                                 pre, sep, p[pos + 2], MNISTCU__ULL(pos + 2));
        if (avail >= 4 && (p[pos + 3] & MNISTCU__GZ_RESERVED))
            return mnistcu__fail(ctx, MNISTCU_ERR_GZ_FLAGS, "%s%sgzip: reserved flag bits set in 0x%02x at byte %llu",
                                 pre, sep, p[pos + 3], MNISTCU__ULL(pos + 3));
        if (avail < 10)
            return mnistcu__fail(ctx, MNISTCU_ERR_GZ_HEADER,
                                 "%s%sgzip: member %d at byte %llu ends inside its 10-byte header", pre, sep,
                                 member, MNISTCU__ULL(pos));
        flags = p[pos + 3];
        hp = pos + 10;
        if (flags & MNISTCU__GZ_FEXTRA) {
            size_t xlen;
            if (size - hp < 2 || (xlen = (size_t)p[hp] | ((size_t)p[hp + 1] << 8)) > size - hp - 2)
                return mnistcu__fail(ctx, MNISTCU_ERR_GZ_HEADER,
                                     "%s%sgzip: the extra field at byte %llu runs past the end", pre, sep,
                                     MNISTCU__ULL(hp));
            hp += 2 + xlen;
        }
        if (flags & MNISTCU__GZ_FNAME) {
            const unsigned char *end = (const unsigned char *)memchr(p + hp, 0, size - hp);
            if (!end)
                return mnistcu__fail(ctx, MNISTCU_ERR_GZ_HEADER,
                                     "%s%sgzip: the file name at byte %llu has no terminating zero", pre, sep,
                                     MNISTCU__ULL(hp));
            hp = (size_t)(end - p) + 1;
        }
        if (flags & MNISTCU__GZ_FCOMMENT) {
            const unsigned char *end = (const unsigned char *)memchr(p + hp, 0, size - hp);
            if (!end)
                return mnistcu__fail(ctx, MNISTCU_ERR_GZ_HEADER,
                                     "%s%sgzip: the comment at byte %llu has no terminating zero", pre, sep,
                                     MNISTCU__ULL(hp));
            hp = (size_t)(end - p) + 1;
        }
        if (flags & MNISTCU__GZ_FHCRC) {
            if (size - hp < 2)
                return mnistcu__fail(ctx, MNISTCU_ERR_GZ_HEADER,
                                     "%s%sgzip: the header CRC at byte %llu runs past the end", pre, sep,
                                     MNISTCU__ULL(hp));
            crc = mnistcu_crc32(0, p + start, hp - start) & 0xFFFFu;
            stored = (uint32_t)p[hp] | ((uint32_t)p[hp + 1] << 8);
            if (crc != stored)
                return mnistcu__fail(ctx, MNISTCU_ERR_GZ_HEADER_CRC,
                                     "%s%sgzip: header CRC at byte %llu is 0x%04x, the header's is 0x%04x", pre,
                                     sep, MNISTCU__ULL(hp), (unsigned)stored, (unsigned)crc);
            hp += 2;
        }

        r = mnistcu__inflate_stream(s, p + hp, size - hp, hp, &used);
        if (r) return r;
        pos = hp + used;

        if (size - pos < 8)
            return mnistcu__fail(ctx, MNISTCU_ERR_GZ_TRUNCATED,
                                 "%s%sgzip: member %d ends at byte %llu with %llu of its 8 trailer bytes", pre, sep,
                                 member, MNISTCU__ULL(size), MNISTCU__ULL(size - pos));
        out_len = s->out_len - out_start;
        crc = mnistcu_crc32(0, s->out + out_start, out_len);
        stored = mnistcu__le32(p + pos);
        if (crc != stored)
            return mnistcu__fail(ctx, MNISTCU_ERR_GZ_CRC,
                                 "%s%sgzip: member %d: stored CRC-32 0x%08lx (byte %llu), data's CRC-32 0x%08lx", pre,
                                 sep, member, (unsigned long)stored, MNISTCU__ULL(pos), (unsigned long)crc);
        stored = mnistcu__le32(p + pos + 4);
        if (stored != (uint32_t)(out_len & 0xFFFFFFFFu))
            return mnistcu__fail(ctx, MNISTCU_ERR_GZ_ISIZE,
                                 "%s%sgzip: member %d: stored size %lu (byte %llu), but it decompressed to %llu bytes",
                                 pre, sep, member, (unsigned long)stored, MNISTCU__ULL(pos + 4), MNISTCU__ULL(out_len));
        pos += 8;
    }
    return MNISTCU_OK;
}

/* mnistcu_gunzip with messages that start with `name` (none when NULL). With
   idx_mode the data must be an IDX file: its header, read as soon as it is out,
   sizes the output exactly (see mnistcu__inflate_idx_size). */
static mnistcu_result mnistcu__gunzip_named(mnistcu_ctx *ctx, const char *name, const void *in, size_t in_size,
                                            size_t max_out, int idx_mode, void **out, size_t *out_size)
{
    const unsigned char *p = (const unsigned char *)in;
    mnistcu__inflater s;
    size_t hint = 0, bound;
    mnistcu_result r;
    *out = NULL;
    *out_size = 0;
    if (max_out == 0) max_out = MNISTCU_IDX_MAX_BYTES;
    /* The last 4 bytes are the size of the last (usually only) member: a good
       first guess for the output buffer, but only a guess, since anyone can
       write anything there. So it is capped, by max_out and by 16 times the
       input (a lying header cannot make us allocate much); data that really
       expands more than that just grows the buffer as it goes. */
    if (in_size >= 18) {
        hint = mnistcu__le32(p + in_size - 4);
        if (!mnistcu__mul(in_size, 16, &bound)) bound = max_out;
        if (hint > bound) hint = bound;
    }
    r = mnistcu__inflater_start(&s, ctx, name, max_out, hint, in_size, idx_mode);
    if (r) return r;
    r = mnistcu__gunzip_members(&s, p, in_size);
    if (r) {
        mnistcu__free(ctx, s.out);
        return r;
    }
    *out = s.out;
    *out_size = s.out_len;
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_gunzip(mnistcu_ctx *ctx, const void *in, size_t in_size, size_t max_out,
                                          void **out, size_t *out_size)
{
    if (out) *out = NULL;
    if (out_size) *out_size = 0;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out || !out_size || (!in && in_size))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "mnistcu_gunzip: %s is NULL",
                             !out ? "out" : !out_size ? "out_size" : "in");
    return mnistcu__gunzip_named(ctx, NULL, in, in_size, max_out, 0, out, out_size);
}

/* >>idx ----------------------------------------------------------------------
   IDX (the MNIST file format): bytes 0-1 zero, byte 2 the element type, byte
   3 the number of dimensions, one big-endian uint32 per dimension, then the
   elements in row-major order, big-endian. The loader accepts the file raw or
   gzip-compressed, checks every size against the data before using it, and
   converts the elements to host byte order. */

/* Bytes per element of an IDX type code, 0 for an unknown code. */
static size_t mnistcu__idx_elem_size(unsigned type)
{
    switch (type) {
    case MNISTCU_IDX_U8: case MNISTCU_IDX_I8: return 1;
    case MNISTCU_IDX_I16: return 2;
    case MNISTCU_IDX_I32: case MNISTCU_IDX_F32: return 4;
    case MNISTCU_IDX_F64: return 8;
    default: return 0;
    }
}

MNISTCU_DEF const char *mnistcu_idx_type_name(mnistcu_idx_type type)
{
    switch ((unsigned)type) {
    case MNISTCU_IDX_U8: return "ubyte";
    case MNISTCU_IDX_I8: return "byte";
    case MNISTCU_IDX_I16: return "short";
    case MNISTCU_IDX_I32: return "int";
    case MNISTCU_IDX_F32: return "float";
    case MNISTCU_IDX_F64: return "double";
    default: return NULL;
    }
}

static uint32_t mnistcu__be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* "60000 x 28 x 28", for messages. */
static void mnistcu__idx_dims_text(const uint32_t *dims, int ndim, char *text, size_t size)
{
    size_t len = 0;
    int d;
    text[0] = '\0';
    for (d = 0; d < ndim && len < size; ++d) {
        int n = snprintf(text + len, size - len, d ? " x %lu" : "%lu", (unsigned long)dims[d]);
        if (n < 0) break;
        len += (size_t)n;
    }
}

#define MNISTCU__DIMS_TEXT 160 /* room for "4294967295 x ..." times MNISTCU_IDX_MAX_DIMS */

/* Reads the header at the start of an IDX file, p[0..size), and checks it:
   magic, element type, dimension count, and the payload size (overflow-checked,
   at most MNISTCU_IDX_MAX_BYTES). Fills *idx (all but data), *header and *payload
   (in bytes) and dims_text ("60000 x 28 x 28"). With `partial` (the output of a
   stream still being decoded) having fewer bytes than the header is not an
   error yet: *header is then 0. */
static mnistcu_result mnistcu__idx_header(mnistcu_ctx *ctx, const char *name, const unsigned char *p, size_t size,
                                          int partial, mnistcu_idx *idx, size_t *header, size_t *payload,
                                          char *dims_text, size_t dims_text_size)
{
    size_t count = 1, esize, hsize;
    int d, ndim, has_zero = 0;
    memset(idx, 0, sizeof *idx);
    *header = 0;
    *payload = 0;
    dims_text[0] = '\0';
    if (size < 4) {
        if (partial) return MNISTCU_OK;
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_TRUNCATED, "%s: IDX: file has %llu bytes, the header needs at least 4",
                             name, MNISTCU__ULL(size));
    }
    if (p[0] != 0 || p[1] != 0)
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_MAGIC,
                             "%s: IDX: bytes 0-1 are %02x %02x, not 00 00 (not an IDX file)", name, p[0], p[1]);
    esize = mnistcu__idx_elem_size(p[2]);
    if (esize == 0)
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_TYPE,
                             "%s: IDX: unknown element type 0x%02x (known: 08 ubyte, 09 byte, 0b short, 0c int, "
                             "0d float, 0e double)", name, p[2]);
    ndim = p[3];
    if (ndim == 0 || ndim > MNISTCU_IDX_MAX_DIMS)
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_NDIM, "%s: IDX: %d dimensions; 1 to %d are accepted", name, ndim,
                             MNISTCU_IDX_MAX_DIMS);
    hsize = 4 + 4 * (size_t)ndim;
    if (size < hsize) {
        if (partial) return MNISTCU_OK;
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_TRUNCATED,
                             "%s: IDX: file has %llu bytes, the header of %d dimensions needs %llu", name,
                             MNISTCU__ULL(size), ndim, MNISTCU__ULL(hsize));
    }
    idx->type = (mnistcu_idx_type)p[2]; /* a known code, checked above */
    idx->ndim = ndim;
    idx->elem_size = esize;
    for (d = 0; d < ndim; ++d) {
        idx->dims[d] = mnistcu__be32(p + 4 + 4 * d);
        if (idx->dims[d] == 0) has_zero = 1;
    }
    mnistcu__idx_dims_text(idx->dims, ndim, dims_text, dims_text_size);
    /* With a zero dimension the product is 0, however large the others. */
    for (d = 0; d < ndim && !has_zero; ++d)
        if (!mnistcu__mul(count, idx->dims[d], &count))
            return mnistcu__fail(ctx, MNISTCU_ERR_IDX_OVERFLOW, "%s: IDX: the element count %s overflows size_t",
                                 name, dims_text);
    if (has_zero) count = 0;
    if (!mnistcu__mul(count, esize, payload))
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_OVERFLOW,
                             "%s: IDX: the payload size (%s elements of %llu bytes) overflows size_t", name, dims_text,
                             MNISTCU__ULL(esize));
    if (*payload > MNISTCU_IDX_MAX_BYTES)
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_TOO_LARGE,
                             "%s: IDX: payload of %llu bytes (%s elements of %llu bytes) is above "
                             "MNISTCU_IDX_MAX_BYTES (%llu)", name, MNISTCU__ULL(*payload), dims_text,
                             MNISTCU__ULL(esize), MNISTCU__ULL(MNISTCU_IDX_MAX_BYTES));
    idx->count = count;
    *header = hsize;
    return MNISTCU_OK;
}

/* count big-endian elements of esize bytes at src to host order at dst, by
   assembling each value from its bytes and storing it with memcpy: no alignment
   or aliasing assumptions. dst == src is fine: each element is read whole
   before it is written. */
static void mnistcu__idx_to_host(unsigned char *dst, const unsigned char *src, size_t count, size_t esize)
{
    size_t i;
    switch (esize) {
    case 1:
        if (count && dst != src) memcpy(dst, src, count);
        break;
    case 2:
        for (i = 0; i < count; ++i, src += 2) {
            uint16_t v = (uint16_t)((src[0] << 8) | src[1]);
            memcpy(dst + 2 * i, &v, 2);
        }
        break;
    case 4:
        for (i = 0; i < count; ++i, src += 4) {
            uint32_t v = mnistcu__be32(src);
            memcpy(dst + 4 * i, &v, 4);
        }
        break;
    default: /* 8 */
        for (i = 0; i < count; ++i, src += 8) {
            uint64_t v = ((uint64_t)mnistcu__be32(src) << 32) | mnistcu__be32(src + 4);
            memcpy(dst + 8 * i, &v, 8);
        }
        break;
    }
}

/* Parses a whole IDX file held in p[0..size); fills *out only on success. With
   `own` (p itself, allocated through the context) the elements are moved to the
   front and converted in place, and *out takes the buffer; else they are copied
   into a new one. */
static mnistcu_result mnistcu__idx_parse(mnistcu_ctx *ctx, const char *name, const unsigned char *p, size_t size,
                                         unsigned char *own, mnistcu_idx *out)
{
    mnistcu_idx idx;
    char dims_text[MNISTCU__DIMS_TEXT];
    size_t header, payload, total;
    unsigned char *dst;
    mnistcu_result r = mnistcu__idx_header(ctx, name, p, size, 0, &idx, &header, &payload, dims_text, sizeof dims_text);
    if (r) return r;
    total = header + payload; /* cannot overflow: payload is at most MNISTCU_IDX_MAX_BYTES */
    if (size < total)
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_TRUNCATED,
                             "%s: IDX: file has %llu bytes, header and payload need %llu (dims %s)", name,
                             MNISTCU__ULL(size), MNISTCU__ULL(total), dims_text);
    if (size > total)
        return mnistcu__fail(ctx, MNISTCU_ERR_IDX_TRAILING,
                             "%s: IDX: file has %llu bytes, header and payload need only %llu (dims %s)", name,
                             MNISTCU__ULL(size), MNISTCU__ULL(total), dims_text);
    if (own) {
        dst = own;
        if (payload) memmove(dst, dst + header, payload);
        mnistcu__idx_to_host(dst, dst, idx.count, idx.elem_size);
    } else {
        dst = (unsigned char *)mnistcu__alloc(ctx, payload); /* 1 byte when the tensor is empty */
        if (!dst)
            return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%s: IDX: out of memory for %llu bytes of data", name,
                                 MNISTCU__ULL(payload));
        mnistcu__idx_to_host(dst, p + header, idx.count, idx.elem_size);
    }
    idx.data = dst;
    *out = idx;
    return MNISTCU_OK;
}

/* Deflate expands at most 1032 times: a 258-byte match (length code 285, no
   extra bits) costs at least 2 bits, a 1-bit length code and a 1-bit distance
   code, and every other symbol yields fewer bytes per bit. */
#define MNISTCU__DEFLATE_MAX_RATIO 1032

/* The stream produced more than the IDX header declares (total bytes). */
static mnistcu_result mnistcu__inflate_idx_overrun(mnistcu__inflater *s)
{
    return mnistcu__fail(s->ctx, MNISTCU_ERR_IDX_TRAILING,
                         "%s: IDX: the gzip data decompresses to more than the %llu bytes its header declares: refused "
                         "at decompressed byte %llu (compressed byte %llu)", s->name ? s->name : "<gzip data>",
                         MNISTCU__ULL(s->max_out), MNISTCU__ULL(s->max_out), MNISTCU__ULL(mnistcu__inflate_where(s)));
}

/* IDX mode, when the probe buffer is full: reads the header from the output so
   far and replaces the buffer by one of exactly the size it declares, which
   becomes max_out too, so the first byte beyond it is refused. Refuses at once
   a header that is invalid, declares a payload above MNISTCU_IDX_MAX_BYTES, or
   more bytes than the compressed input can expand to. Before the header is
   complete (a long first match) it does nothing: the buffer grows as usual. */
static mnistcu_result mnistcu__inflate_idx_size(mnistcu__inflater *s)
{
    const char *name = s->name ? s->name : "<gzip data>";
    mnistcu_idx idx;
    char dims_text[MNISTCU__DIMS_TEXT];
    size_t header, payload, total, most;
    unsigned char *exact;
    mnistcu_result r = mnistcu__idx_header(s->ctx, name, s->out, s->out_len, 1, &idx, &header, &payload, dims_text,
                                           sizeof dims_text);
    if (r || header == 0) return r;
    total = header + payload; /* cannot overflow: payload is at most MNISTCU_IDX_MAX_BYTES */
    if (total > s->max_out)
        return mnistcu__fail(s->ctx, MNISTCU_ERR_IDX_TOO_LARGE,
                             "%s: IDX: header and payload (%llu bytes, dims %s) exceed the limit of %llu bytes", name,
                             MNISTCU__ULL(total), dims_text, MNISTCU__ULL(s->max_out));
    if (!mnistcu__mul(s->in_total, MNISTCU__DEFLATE_MAX_RATIO, &most)) most = (size_t)-1;
    if (total > most)
        return mnistcu__fail(s->ctx, MNISTCU_ERR_IDX_TRUNCATED,
                             "%s: IDX: the header declares %llu bytes (dims %s), more than %llu bytes of gzip data "
                             "can hold (at most %llu)", name, MNISTCU__ULL(total), dims_text,
                             MNISTCU__ULL(s->in_total), MNISTCU__ULL(most));
    if (s->out_len > total) {
        s->max_out = total;
        return mnistcu__inflate_idx_overrun(s);
    }
    exact = (unsigned char *)mnistcu__alloc(s->ctx, total);
    if (!exact)
        return mnistcu__fail(s->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%s: IDX: out of memory for %llu bytes (dims %s)", name,
                             MNISTCU__ULL(total), dims_text);
    memcpy(exact, s->out, s->out_len);
    mnistcu__free(s->ctx, s->out);
    s->out = exact;
    s->out_cap = s->max_out = total;
    s->idx_sized = 1;
    return MNISTCU_OK;
}

/* Loads from memory; `name` (never NULL here) starts every message. gzip data
   is decoded in IDX mode, into one buffer of the exact size that then holds
   the elements: no second copy. */
static mnistcu_result mnistcu__idx_load(mnistcu_ctx *ctx, const unsigned char *p, size_t size, const char *name,
                                        mnistcu_idx *out)
{
    void *raw = NULL;
    size_t raw_size = 0;
    mnistcu_result r;
    if (size >= 2 && p[0] == 0x1F && p[1] == 0x8B) { /* gzip: decompress first */
        r = mnistcu__gunzip_named(ctx, name, p, size, MNISTCU_IDX_MAX_BYTES, 1, &raw, &raw_size);
        if (r) return r;
        r = mnistcu__idx_parse(ctx, name, (const unsigned char *)raw, raw_size, (unsigned char *)raw, out);
        if (r) mnistcu__free(ctx, raw);
        return r;
    }
    return mnistcu__idx_parse(ctx, name, p, size, NULL, out);
}

MNISTCU_DEF mnistcu_result mnistcu_idx_load_memory(mnistcu_ctx *ctx, const void *bytes, size_t size,
                                                   const char *name, mnistcu_idx *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!name) name = "<memory>";
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out || (!bytes && size))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: mnistcu_idx_load_memory: %s is NULL", name,
                             !out ? "out" : "bytes");
    return mnistcu__idx_load(ctx, (const unsigned char *)bytes, size, name, out);
}

MNISTCU_DEF mnistcu_result mnistcu_idx_load_file(mnistcu_ctx *ctx, const char *path, mnistcu_idx *out)
{
    unsigned char *data = NULL;
    size_t size = 0;
    mnistcu_result r;
    if (out) memset(out, 0, sizeof *out);
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!path || !out)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "mnistcu_idx_load_file: %s is NULL",
                             !path ? "path" : "out");
    /* One limit for raw and gzip files: a gzip file larger than MNISTCU_IDX_MAX_BYTES
       could not hold an IDX file the loader accepts. */
    r = mnistcu__read_file(ctx, path, MNISTCU_IDX_MAX_BYTES, &data, &size);
    if (r) return r;
    r = mnistcu__idx_load(ctx, data, size, path, out);
    mnistcu__free(ctx, data);
    return r;
}

MNISTCU_DEF void mnistcu_idx_free(mnistcu_ctx *ctx, mnistcu_idx *idx)
{
    if (!idx) return;
    mnistcu__free(ctx, idx->data);
    memset(idx, 0, sizeof *idx);
}
/* >>context ----------------------------------------------------------------- */
static void mnistcu__object_link(mnistcu_ctx *ctx, mnistcu__object *o, void (*destroy)(mnistcu__object *))
{
    o->destroy = destroy;
    o->next = ctx->objects.next;
    o->prev = &ctx->objects;
    ctx->objects.next->prev = o;
    ctx->objects.next = o;
}

static void mnistcu__object_unlink(mnistcu__object *o)
{
    o->prev->next = o->next;
    o->next->prev = o->prev;
    o->prev = o->next = o;
}

#ifdef __CUDACC__
static mnistcu_result mnistcu__cuda_ctx_init(mnistcu_ctx *ctx);
static void mnistcu__cuda_ctx_free(mnistcu_ctx *ctx);
static void mnistcu__cuda_dataset_free(mnistcu_dataset *ds);
#endif

MNISTCU_DEF mnistcu_result mnistcu_ctx_create(mnistcu_ctx **out, const mnistcu_ctx_desc *desc)
{
    mnistcu_ctx_desc d;
    mnistcu_ctx *ctx;
    mnistcu_device want;
    const char *env;
    int half_allocator;
    if (!out) return MNISTCU_ERR_INVALID_ARGUMENT;
    *out = NULL;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (d.log_level == MNISTCU_LOG_DEFAULT) d.log_level = MNISTCU_LOG_INFO;
    half_allocator = (d.allocator.alloc == NULL) != (d.allocator.free == NULL);
    if (half_allocator) { /* unusable: the context itself comes from malloc, to carry the message */
        d.allocator.alloc = NULL;
        d.allocator.free = NULL;
    }
    ctx = (mnistcu_ctx *)(d.allocator.alloc ? d.allocator.alloc(d.allocator.user, sizeof *ctx)
                                            : MNISTCU_MALLOC(sizeof *ctx));
    if (!ctx) return MNISTCU_ERR_OUT_OF_MEMORY;
    memset(ctx, 0, sizeof *ctx);
    ctx->desc = d;
    ctx->objects.next = ctx->objects.prev = &ctx->objects;
    ctx->device = MNISTCU_DEVICE_CPU;
    *out = ctx; /* from here on errors are reported in the context */
    if (half_allocator)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "allocator: give both alloc and free, or neither");

    if ((unsigned)d.device > MNISTCU_DEVICE_CUDA || (unsigned)d.log_level > MNISTCU_LOG_DEBUG ||
        d.threads < 0 || d.cuda_device < 0 || (unsigned)d.gemm > MNISTCU_GEMM_CUBLAS ||
        (unsigned)d.data_mode > MNISTCU_DATA_STREAM)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "context desc: device %d, log_level %d, threads %d, cuda_device %d, gemm %d or "
                             "data_mode %d out of range", (int)d.device, (int)d.log_level, d.threads, d.cuda_device,
                             (int)d.gemm, (int)d.data_mode);
    if ((d.allocator.device_alloc == NULL) != (d.allocator.device_free == NULL))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "allocator: give both device_alloc and device_free");
#ifndef MNISTCU_CUBLAS
    if (d.gemm == MNISTCU_GEMM_CUBLAS)
        return mnistcu__fail(ctx, MNISTCU_ERR_UNSUPPORTED, "gemm CUBLAS asked, but this build has no MNISTCU_CUBLAS");
#endif
#ifdef _OPENMP
    ctx->threads = d.threads ? d.threads : omp_get_max_threads();
#else
    if (d.threads > 1)
        mnistcu__log(ctx, MNISTCU_LOG_WARN, "%d threads asked, but this build has no OpenMP: using 1", d.threads);
    ctx->threads = 1;
#endif
    ctx->desc.threads = ctx->threads;

    want = d.device;
    env = getenv("MNISTCU_DEVICE");
    if (want == MNISTCU_DEVICE_AUTO && env && *env) {
        if (strcmp(env, "cpu") == 0) want = MNISTCU_DEVICE_CPU;
        else if (strcmp(env, "cuda") == 0 || strcmp(env, "gpu") == 0) want = MNISTCU_DEVICE_CUDA;
        else if (strcmp(env, "auto") != 0)
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                                 "MNISTCU_DEVICE=%s: expected cpu, cuda or auto", env);
    }
    if (want == MNISTCU_DEVICE_CUDA) {
#ifdef __CUDACC__
        mnistcu_result r = mnistcu__cuda_ctx_init(ctx);
        if (r) return r;
#else
        return mnistcu__fail(ctx, MNISTCU_ERR_NO_DEVICE,
                             "CUDA device asked, but this build has no CUDA backend (compile with nvcc)");
#endif
    } else if (want == MNISTCU_DEVICE_AUTO) {
#ifdef __CUDACC__
        /* No usable GPU is not an error here: the CPU backend takes over. */
        mnistcu_log_level level = ctx->desc.log_level;
        mnistcu_result r;
        ctx->desc.log_level = MNISTCU_LOG_SILENT;
        r = mnistcu__cuda_ctx_init(ctx);
        ctx->desc.log_level = level;
        if (r != MNISTCU_OK) {
            mnistcu__log(ctx, MNISTCU_LOG_INFO, "%s: training on the CPU", ctx->error);
            ctx->device = MNISTCU_DEVICE_CPU;
            ctx->error[0] = 0;
            ctx->last_result = MNISTCU_OK;
        }
#endif
    }
    if (ctx->device == MNISTCU_DEVICE_CPU)
        snprintf(ctx->device_name, sizeof ctx->device_name, "CPU (%d thread%s)", ctx->threads,
                 ctx->threads == 1 ? "" : "s");
    ctx->desc.device = ctx->device;
    return MNISTCU_OK;
}

MNISTCU_DEF void mnistcu_ctx_destroy(mnistcu_ctx *ctx)
{
    mnistcu_allocator a;
    if (!ctx) return;
    while (ctx->objects.next != &ctx->objects) {
        mnistcu__object *o = ctx->objects.next;
        mnistcu__object_unlink(o);
        o->destroy(o);
    }
    mnistcu__free(ctx, ctx->gemm_work);
#ifdef __CUDACC__
    mnistcu__cuda_ctx_free(ctx);
#endif
    a = ctx->desc.allocator;
    if (a.free) a.free(a.user, ctx);
    else MNISTCU_FREE(ctx);
}

MNISTCU_DEF const char *mnistcu_ctx_error(const mnistcu_ctx *ctx) { return ctx ? ctx->error : "no context"; }
MNISTCU_DEF mnistcu_result mnistcu_ctx_last_result(const mnistcu_ctx *ctx)
{
    return ctx ? ctx->last_result : MNISTCU_ERR_INVALID_ARGUMENT;
}
MNISTCU_DEF void mnistcu_ctx_clear_error(mnistcu_ctx *ctx)
{
    if (!ctx) return;
    ctx->error[0] = 0;
    ctx->last_result = MNISTCU_OK;
}
MNISTCU_DEF mnistcu_device mnistcu_ctx_device(const mnistcu_ctx *ctx) { return ctx ? ctx->device : MNISTCU_DEVICE_CPU; }
MNISTCU_DEF const char *mnistcu_ctx_device_name(const mnistcu_ctx *ctx) { return ctx ? ctx->device_name : ""; }
MNISTCU_DEF int mnistcu_ctx_threads(const mnistcu_ctx *ctx) { return ctx ? ctx->threads : 0; }
MNISTCU_DEF void mnistcu_ctx_resolved_desc(const mnistcu_ctx *ctx, mnistcu_ctx_desc *out)
{
    if (ctx && out) *out = ctx->desc;
}

/* >>dataset ----------------------------------------------------------------- */
struct mnistcu_dataset {
    mnistcu__object obj;  /* first member: the context's list */
    mnistcu_ctx *ctx;
    size_t count;         /* samples */
    size_t features;      /* rows * cols */
    int rows, cols, num_classes;
    uint8_t *u8;          /* [count][features] when stored as bytes, else NULL */
    float *f32;           /* [count][features] otherwise */
    int32_t *labels;      /* [count] */
    float scale, shift;   /* x = stored * scale + shift */
    void *device_copy;    /* CUDA: the uploaded copy, made on first use */
};

#define MNISTCU__MAX_FEATURES ((size_t)1 << 24)

static void mnistcu__dataset_free(mnistcu__object *o)
{
    mnistcu_dataset *ds = (mnistcu_dataset *)o;
    mnistcu_ctx *ctx = ds->ctx;
#ifdef __CUDACC__
    mnistcu__cuda_dataset_free(ds);
#endif
    mnistcu__free(ctx, ds->u8);
    mnistcu__free(ctx, ds->f32);
    mnistcu__free(ctx, ds->labels);
    mnistcu__free(ctx, ds);
}

MNISTCU_DEF void mnistcu_dataset_destroy(mnistcu_dataset *ds)
{
    if (!ds) return;
    mnistcu__object_unlink(&ds->obj);
    mnistcu__dataset_free(&ds->obj);
}

static mnistcu_dataset *mnistcu__dataset_new(mnistcu_ctx *ctx)
{
    mnistcu_dataset *ds = (mnistcu_dataset *)mnistcu__calloc(ctx, sizeof *ds);
    if (!ds) return NULL;
    ds->ctx = ctx;
    ds->scale = 1.0f;
    mnistcu__object_link(ctx, &ds->obj, mnistcu__dataset_free);
    return ds;
}

/* Normalised value of stored element i. */
static float mnistcu__ds_value(const mnistcu_dataset *ds, size_t i)
{
    return ds->u8 ? (float)ds->u8[i] * ds->scale + ds->shift : ds->f32[i] * ds->scale + ds->shift;
}

static void mnistcu__dataset_set_norm(mnistcu_dataset *ds, mnistcu_norm norm)
{
    float unit;
    if (norm == MNISTCU_NORM_DEFAULT) norm = ds->u8 ? MNISTCU_NORM_STANDARD : MNISTCU_NORM_NONE;
    unit = (ds->u8 && norm != MNISTCU_NORM_NONE) ? 1.0f / 255.0f : 1.0f;
    ds->scale = unit;
    ds->shift = 0.0f;
    if (norm == MNISTCU_NORM_STANDARD && ds->count) {
        /* Two passes in double, in a fixed order: mean, then variance. */
        size_t i, n = ds->count * ds->features;
        double sum = 0.0, var = 0.0, mean, sd;
        for (i = 0; i < n; ++i) sum += (double)mnistcu__ds_value(ds, i);
        mean = sum / (double)n;
        for (i = 0; i < n; ++i) {
            double dv = (double)mnistcu__ds_value(ds, i) - mean;
            var += dv * dv;
        }
        sd = sqrt(var / (double)n);
        if (!(sd > 0.0)) sd = 1.0;
        ds->scale = (float)(unit / sd);
        ds->shift = (float)(-mean / sd);
    }
}

MNISTCU_DEF mnistcu_result mnistcu_dataset_create(mnistcu_ctx *ctx, const float *x, const int32_t *labels, size_t count,
                                                  size_t features, int num_classes, mnistcu_dataset **out)
{
    mnistcu_dataset *ds;
    size_t i, nx;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_create: out is NULL");
    *out = NULL;
    if (!x || !labels || count == 0 || features == 0)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "dataset_create: x, labels, count and features must be non-zero");
    if (features > MNISTCU__MAX_FEATURES || count > UINT32_MAX)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "dataset_create: %lu samples of %lu features is above the limits (2^32, 2^24)",
                             (unsigned long)count, (unsigned long)features);
    if (num_classes < 2 || num_classes > MNISTCU_MAX_CLASSES)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_create: num_classes %d not in 2..%d",
                             num_classes, MNISTCU_MAX_CLASSES);
    for (i = 0; i < count; ++i)
        if (labels[i] < 0 || labels[i] >= num_classes)
            return mnistcu__fail(ctx, MNISTCU_ERR_LABEL_RANGE, "dataset_create: label %ld of sample %lu not in 0..%d",
                                 (long)labels[i], (unsigned long)i, num_classes - 1);
    if (!mnistcu__mul3(count, features, sizeof(float), &nx))
        return mnistcu__fail(ctx, MNISTCU_ERR_OVERFLOW, "dataset_create: size overflows");
    ds = mnistcu__dataset_new(ctx);
    if (!ds) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "dataset_create: out of memory");
    ds->f32 = (float *)mnistcu__alloc(ctx, nx);
    ds->labels = (int32_t *)mnistcu__alloc(ctx, count * sizeof(int32_t));
    if (!ds->f32 || !ds->labels) {
        mnistcu_dataset_destroy(ds);
        return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "dataset_create: out of memory for %lu bytes",
                             (unsigned long)nx);
    }
    memcpy(ds->f32, x, nx);
    memcpy(ds->labels, labels, count * sizeof(int32_t));
    ds->count = count;
    ds->features = features;
    ds->rows = 1;
    ds->cols = (int)features;
    ds->num_classes = num_classes;
    *out = ds;
    return MNISTCU_OK;
}

/* Finds "<dir>/<prefix>-<kind>-idx<n>-ubyte[.gz]" or "<dir>/<prefix>-<kind>.idx<n>-ubyte[.gz]". */
static mnistcu_result mnistcu__find_split_file(mnistcu_ctx *ctx, const char *dir, const char *prefix, const char *kind,
                                               int ndim, char *path, size_t path_size)
{
    static const char *const styles[] = {"%s/%s-%s-idx%d-ubyte.gz", "%s/%s-%s-idx%d-ubyte",
                                         "%s/%s-%s.idx%d-ubyte.gz", "%s/%s-%s.idx%d-ubyte"};
    int i;
    for (i = 0; i < 4; ++i) {
        FILE *f;
        int n = snprintf(path, path_size, styles[i], dir, prefix, kind, ndim);
        if (n < 0 || (size_t)n >= path_size)
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: folder name too long", dir);
        f = fopen(path, "rb");
        if (f) {
            fclose(f);
            return MNISTCU_OK;
        }
    }
    return mnistcu__fail(ctx, MNISTCU_ERR_NOT_FOUND,
                         "%s: no %s %s file (tried %s-%s-idx%d-ubyte and %s-%s.idx%d-ubyte, each with and without .gz;"
                         " run `make data`)", dir, prefix, kind, prefix, kind, ndim, prefix, kind, ndim);
}

MNISTCU_DEF mnistcu_result mnistcu_dataset_load(mnistcu_ctx *ctx, const mnistcu_dataset_desc *desc, mnistcu_dataset **out)
{
    mnistcu_dataset_desc d;
    mnistcu_idx img, lab;
    mnistcu_dataset *ds = NULL;
    mnistcu_result r;
    char img_path[1024], lab_path[1024];
    const char *img_name, *lab_name;
    size_t count, features, i;
    int classes;

    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out || !desc) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_load: desc or out is NULL");
    *out = NULL;
    d = *desc;
    memset(&img, 0, sizeof img);
    memset(&lab, 0, sizeof lab);
    classes = d.num_classes ? d.num_classes : 10;
    if (classes < 2 || classes > MNISTCU_MAX_CLASSES)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_load: num_classes %d not in 2..%d",
                             classes, MNISTCU_MAX_CLASSES);
    if ((unsigned)d.norm > MNISTCU_NORM_STANDARD || (unsigned)d.split > MNISTCU_SPLIT_TEST)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_load: norm %d or split %d out of range",
                             (int)d.norm, (int)d.split);

    /* Load the two IDX tensors from a folder, two paths, or memory. */
    if (d.dir) {
        const char *prefix = d.split == MNISTCU_SPLIT_TEST ? "t10k" : "train";
        if ((r = mnistcu__find_split_file(ctx, d.dir, prefix, "images", 3, img_path, sizeof img_path)) != MNISTCU_OK ||
            (r = mnistcu__find_split_file(ctx, d.dir, prefix, "labels", 1, lab_path, sizeof lab_path)) != MNISTCU_OK)
            return r;
        img_name = img_path;
        lab_name = lab_path;
    } else if (d.images_path || d.labels_path) {
        if (!d.images_path || !d.labels_path)
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_load: give both images_path and labels_path");
        img_name = d.images_path;
        lab_name = d.labels_path;
    } else {
        if (!d.images_data || !d.labels_data)
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                                 "dataset_load: give dir, both paths, or both images_data and labels_data");
        img_name = "<images in memory>";
        lab_name = "<labels in memory>";
    }
    if (d.dir || d.images_path) {
        r = mnistcu_idx_load_file(ctx, img_name, &img);
        if (r == MNISTCU_OK) r = mnistcu_idx_load_file(ctx, lab_name, &lab);
    } else {
        r = mnistcu_idx_load_memory(ctx, d.images_data, d.images_size, img_name, &img);
        if (r == MNISTCU_OK) r = mnistcu_idx_load_memory(ctx, d.labels_data, d.labels_size, lab_name, &lab);
    }
    if (r) goto fail;

    /* Shapes: images [N][rows][cols] or [N][features]; labels [N], integers. */
    if (img.ndim < 2 || img.ndim > 3) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_IDX_SHAPE, "%s: images have %d dimensions, expected 3 (N, rows, cols) or 2",
                          img_name, img.ndim);
        goto fail;
    }
    if (lab.ndim != 1 || lab.type == MNISTCU_IDX_F32 || lab.type == MNISTCU_IDX_F64) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_IDX_SHAPE, "%s: labels must be a 1-dimensional integer tensor (got %d dims, %s)",
                          lab_name, lab.ndim, mnistcu_idx_type_name(lab.type));
        goto fail;
    }
    count = img.dims[0];
    features = img.ndim == 3 ? (size_t)img.dims[1] * (size_t)img.dims[2] : (size_t)img.dims[1];
    if (img.ndim == 3 ? (img.dims[1] == 0 || img.dims[2] == 0) : img.dims[1] == 0) features = 0;
    if (features == 0 || features > MNISTCU__MAX_FEATURES || count == 0) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_IDX_SHAPE, "%s: %lu samples of %lu features (need at least 1, at most 2^24 features)",
                          img_name, (unsigned long)count, (unsigned long)features);
        goto fail;
    }
    if (lab.dims[0] != img.dims[0]) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_COUNT_MISMATCH, "%s has %lu images but %s has %lu labels", img_name,
                          (unsigned long)img.dims[0], lab_name, (unsigned long)lab.dims[0]);
        goto fail;
    }
    if (d.limit && d.limit < count) count = d.limit;

    ds = mnistcu__dataset_new(ctx);
    if (!ds || !(ds->labels = (int32_t *)mnistcu__alloc(ctx, count * sizeof(int32_t)))) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "dataset_load: out of memory");
        goto fail;
    }
    for (i = 0; i < count; ++i) {
        long v;
        switch (lab.type) {
        case MNISTCU_IDX_U8: v = ((const uint8_t *)lab.data)[i]; break;
        case MNISTCU_IDX_I8: v = ((const int8_t *)lab.data)[i]; break;
        case MNISTCU_IDX_I16: v = ((const int16_t *)lab.data)[i]; break;
        default: v = (long)((const int32_t *)lab.data)[i]; break;
        }
        if (v < 0 || v >= classes) {
            r = mnistcu__fail(ctx, MNISTCU_ERR_LABEL_RANGE, "%s: label %ld at index %lu is outside 0..%d", lab_name, v,
                              (unsigned long)i, classes - 1);
            goto fail;
        }
        ds->labels[i] = (int32_t)v;
    }
    if (img.type == MNISTCU_IDX_U8 && count == img.dims[0]) {
        ds->u8 = (uint8_t *)img.data; /* keep the bytes as they are: 4x less memory, uploaded as is */
        img.data = NULL;
    } else if (img.type == MNISTCU_IDX_U8) { /* a limit: keep only the samples asked for */
        if (!(ds->u8 = (uint8_t *)mnistcu__alloc(ctx, count * features))) {
            r = mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%s: out of memory", img_name);
            goto fail;
        }
        memcpy(ds->u8, img.data, count * features);
    } else {
        size_t n = count * features, bytes;
        if (!mnistcu__mul(n, sizeof(float), &bytes) || !(ds->f32 = (float *)mnistcu__alloc(ctx, bytes))) {
            r = mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%s: out of memory converting to float", img_name);
            goto fail;
        }
        for (i = 0; i < n; ++i) {
            switch (img.type) {
            case MNISTCU_IDX_I8: ds->f32[i] = (float)((const int8_t *)img.data)[i]; break;
            case MNISTCU_IDX_I16: ds->f32[i] = (float)((const int16_t *)img.data)[i]; break;
            case MNISTCU_IDX_I32: ds->f32[i] = (float)((const int32_t *)img.data)[i]; break;
            case MNISTCU_IDX_F32: ds->f32[i] = ((const float *)img.data)[i]; break;
            default: ds->f32[i] = (float)((const double *)img.data)[i]; break;
            }
        }
    }
    ds->count = count;
    ds->features = features;
    ds->rows = img.ndim == 3 ? (int)img.dims[1] : 1;
    ds->cols = img.ndim == 3 ? (int)img.dims[2] : (int)img.dims[1];
    ds->num_classes = classes;
    mnistcu__dataset_set_norm(ds, d.norm);
    mnistcu_idx_free(ctx, &img);
    mnistcu_idx_free(ctx, &lab);
    *out = ds;
    return MNISTCU_OK;
fail:
    if (ds) mnistcu_dataset_destroy(ds);
    mnistcu_idx_free(ctx, &img);
    mnistcu_idx_free(ctx, &lab);
    return r;
}

MNISTCU_DEF mnistcu_result mnistcu_dataset_load_dir(mnistcu_ctx *ctx, const char *dir, mnistcu_split split,
                                                    mnistcu_dataset **out)
{
    mnistcu_dataset_desc d;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!dir) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_load_dir: dir is NULL");
    memset(&d, 0, sizeof d);
    d.dir = dir;
    d.split = split;
    return mnistcu_dataset_load(ctx, &d, out);
}

MNISTCU_DEF mnistcu_result mnistcu_dataset_split(mnistcu_ctx *ctx, const mnistcu_dataset *src, size_t first_count,
                                                 int shuffle, mnistcu_dataset **first, mnistcu_dataset **second)
{
    mnistcu_dataset *part[2] = {NULL, NULL};
    uint32_t *order = NULL;
    size_t i, k, esize;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!src || !first || !second)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_split: NULL argument");
    *first = *second = NULL;
    if (first_count == 0 || first_count >= src->count)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "dataset_split: first_count %lu must be in 1..%lu (both parts non-empty)",
                             (unsigned long)first_count, (unsigned long)(src->count - 1));
    order = (uint32_t *)mnistcu__alloc(ctx, src->count * sizeof(uint32_t));
    if (!order) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "dataset_split: out of memory");
    for (i = 0; i < src->count; ++i) order[i] = (uint32_t)i;
    if (shuffle) {
        mnistcu__rng rng;
        mnistcu__rng_seed(&rng, ctx->desc.seed, 0x5B117u + ctx->objects_made++);
        mnistcu__shuffle(&rng, order, src->count);
    }
    esize = src->u8 ? 1 : sizeof(float);
    for (k = 0; k < 2; ++k) {
        size_t begin = k ? first_count : 0, n = k ? src->count - first_count : first_count;
        mnistcu__object link;
        mnistcu_dataset *ds = part[k] = mnistcu__dataset_new(ctx);
        if (!ds) goto oom;
        link = ds->obj; /* keep this object's own place in the context's list */
        *ds = *src;
        ds->obj = link;
        ds->ctx = ctx;
        ds->device_copy = NULL;
        ds->u8 = NULL;
        ds->f32 = NULL;
        ds->count = n;
        ds->labels = (int32_t *)mnistcu__alloc(ctx, n * sizeof(int32_t));
        if (src->u8) ds->u8 = (uint8_t *)mnistcu__alloc(ctx, n * src->features);
        else ds->f32 = (float *)mnistcu__alloc(ctx, n * src->features * sizeof(float));
        if (!ds->labels || (!ds->u8 && !ds->f32)) goto oom;
        for (i = 0; i < n; ++i) {
            size_t s = order[begin + i];
            ds->labels[i] = src->labels[s];
            if (src->u8) memcpy(ds->u8 + i * src->features, src->u8 + s * src->features, src->features * esize);
            else memcpy(ds->f32 + i * src->features, src->f32 + s * src->features, src->features * esize);
        }
    }
    mnistcu__free(ctx, order);
    *first = part[0];
    *second = part[1];
    return MNISTCU_OK;
oom:
    mnistcu__free(ctx, order);
    mnistcu_dataset_destroy(part[0]);
    mnistcu_dataset_destroy(part[1]);
    return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "dataset_split: out of memory");
}

MNISTCU_DEF mnistcu_result mnistcu_dataset_normalize_like(mnistcu_dataset *ds, const mnistcu_dataset *ref)
{
    if (!ds || !ref) return MNISTCU_ERR_INVALID_ARGUMENT;
    if ((ds->u8 == NULL) != (ref->u8 == NULL) || ds->features != ref->features)
        return mnistcu__fail(ds->ctx, MNISTCU_ERR_SHAPE,
                             "dataset_normalize_like: the datasets differ in feature count or storage type");
    ds->scale = ref->scale;
    ds->shift = ref->shift;
    return MNISTCU_OK;
}

MNISTCU_DEF void mnistcu_dataset_info_get(const mnistcu_dataset *ds, mnistcu_dataset_info *info)
{
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!ds) return;
    info->count = ds->count;
    info->rows = ds->rows;
    info->cols = ds->cols;
    info->features = ds->features;
    info->num_classes = ds->num_classes;
    info->stored_u8 = ds->u8 != NULL;
    info->scale = ds->scale;
    info->shift = ds->shift;
}

MNISTCU_DEF mnistcu_result mnistcu_dataset_sample(const mnistcu_dataset *ds, size_t i, float *x, int32_t *label)
{
    size_t j;
    if (!ds) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (i >= ds->count)
        return mnistcu__fail(ds->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_sample: index %lu, dataset has %lu",
                             (unsigned long)i, (unsigned long)ds->count);
    if (x)
        for (j = 0; j < ds->features; ++j) x[j] = mnistcu__ds_value(ds, i * ds->features + j);
    if (label) *label = ds->labels[i];
    return MNISTCU_OK;
}

/* >>cpu_ops ------------------------------------------------------------------
   The CPU backend is the reference for every operation. Shapes, row-major:
     B    samples in the batch          IN   inputs of a layer
     OUT  outputs of a layer            C    classes (OUT of the last layer)
   x [B][IN], W [OUT][IN], b [OUT], y = act(x W^T + b) [B][OUT].
   Every sum runs in a fixed order that does not depend on the thread count,
   so the results are bitwise the same for 1 or N threads. */

/* ---- matrix product: C[M][N] = op(A)[M][K] * op(B)[K][N] ----------------
   Blocked as in the classic BLIS layout: a KC x NC panel of op(B) and an
   MC x KC panel of op(A) are packed into contiguous micro-panels (packing
   also absorbs the transposes), then an MR x NR micro-kernel keeps its tile
   of C in registers. Each element of C sums over k in increasing order. */
#define MNISTCU__MR 6
#define MNISTCU__NR 16
/* Fused multiply-add where the target has it. Strict ISO modes (-std=c99) do not
   contract a*b+c, which halves the micro-kernel's speed; fmaf with FMA hardware
   compiles to the vector instruction. */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define MNISTCU__FMA(a, b, c) fmaf(a, b, c)
#else
#define MNISTCU__FMA(a, b, c) ((a) * (b) + (c))
#endif
#define MNISTCU__KC 256
#define MNISTCU__MC 144  /* multiple of MR */
#define MNISTCU__NC 1024 /* multiple of NR */
#define MNISTCU__GEMM_WORK_FLOATS ((size_t)MNISTCU__MC * MNISTCU__KC + (size_t)MNISTCU__KC * MNISTCU__NC)

static mnistcu_result mnistcu__cpu_reserve(mnistcu_ctx *ctx)
{
    if (ctx->gemm_work) return MNISTCU_OK;
    ctx->gemm_work = (float *)mnistcu__alloc(ctx, MNISTCU__GEMM_WORK_FLOATS * sizeof(float));
    if (!ctx->gemm_work) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory for matrix workspace");
    ctx->gemm_work_floats = MNISTCU__GEMM_WORK_FLOATS;
    return MNISTCU_OK;
}

/* C tile (mr x nr valid of MR x NR) = (accumulate ? C : 0) + sum_k a[k][:] * b[k][:].
   One accumulator array per row, the row loop written out: this is the form
   that GCC and Clang both keep in vector registers (a single 2-D array runs
   50x slower under GCC; see bench/cpu_microkernel.c). */
static void mnistcu__micro_kernel(size_t kc, const float *MNISTCU__RESTRICT a, const float *MNISTCU__RESTRICT b,
                                  float *MNISTCU__RESTRICT c, size_t ldc, int mr, int nr, int accumulate)
{
    float c0[MNISTCU__NR], c1[MNISTCU__NR], c2[MNISTCU__NR], c3[MNISTCU__NR], c4[MNISTCU__NR], c5[MNISTCU__NR];
    float *rows[MNISTCU__MR];
    size_t k;
    int i, j;
    rows[0] = c0; rows[1] = c1; rows[2] = c2; rows[3] = c3; rows[4] = c4; rows[5] = c5;
    for (i = 0; i < MNISTCU__MR; ++i)
        for (j = 0; j < MNISTCU__NR; ++j) rows[i][j] = (accumulate && i < mr && j < nr) ? c[i * ldc + j] : 0.0f;
    for (k = 0; k < kc; ++k) {
        const float *ak = a + k * MNISTCU__MR, *bk = b + k * MNISTCU__NR;
        float a0 = ak[0], a1 = ak[1], a2 = ak[2], a3 = ak[3], a4 = ak[4], a5 = ak[5];
        for (j = 0; j < MNISTCU__NR; ++j) {
            float bj = bk[j];
            c0[j] = MNISTCU__FMA(a0, bj, c0[j]);
            c1[j] = MNISTCU__FMA(a1, bj, c1[j]);
            c2[j] = MNISTCU__FMA(a2, bj, c2[j]);
            c3[j] = MNISTCU__FMA(a3, bj, c3[j]);
            c4[j] = MNISTCU__FMA(a4, bj, c4[j]);
            c5[j] = MNISTCU__FMA(a5, bj, c5[j]);
        }
    }
    for (i = 0; i < mr; ++i)
        for (j = 0; j < nr; ++j) c[i * ldc + j] = rows[i][j];
}

/* op(A)[i][k] for i in [i0, i0+mc), k in [k0, k0+kc) -> MR-row micro-panels, zero-padded.
   The loop order follows the source's contiguous direction. */
static void mnistcu__pack_a(int trans, const float *A, size_t lda, size_t i0, size_t mc, size_t k0, size_t kc,
                            float *dst, size_t panel)
{
    size_t i, k, ib = panel * MNISTCU__MR;
    float *p = dst + panel * MNISTCU__MR * kc;
    for (i = 0; i < MNISTCU__MR; ++i) {
        size_t r = ib + i;
        if (r >= mc) {
            for (k = 0; k < kc; ++k) p[k * MNISTCU__MR + i] = 0.0f;
        } else if (!trans) {
            const float *src = A + (i0 + r) * lda + k0;
            for (k = 0; k < kc; ++k) p[k * MNISTCU__MR + i] = src[k];
        } else {
            const float *src = A + k0 * lda + i0 + r;
            for (k = 0; k < kc; ++k) p[k * MNISTCU__MR + i] = src[k * lda];
        }
    }
}

/* op(B)[k][j] for k in [k0, k0+kc), j in [j0, j0+nc) -> NR-column micro-panels, zero-padded. */
static void mnistcu__pack_b(int trans, const float *B, size_t ldb, size_t k0, size_t kc, size_t j0, size_t nc,
                            float *dst, size_t panel)
{
    size_t j, k, jb = panel * MNISTCU__NR, valid = nc > jb ? MNISTCU__MIN((size_t)MNISTCU__NR, nc - jb) : 0;
    float *p = dst + panel * MNISTCU__NR * kc;
    if (!trans) {
        for (k = 0; k < kc; ++k) {
            const float *src = B + (k0 + k) * ldb + j0 + jb;
            float *row = p + k * MNISTCU__NR;
            for (j = 0; j < valid; ++j) row[j] = src[j];
            for (; j < MNISTCU__NR; ++j) row[j] = 0.0f;
        }
    } else {
        for (j = 0; j < MNISTCU__NR; ++j) {
            const float *src = B + (j0 + jb + j) * ldb + k0;
            if (j < valid)
                for (k = 0; k < kc; ++k) p[k * MNISTCU__NR + j] = src[k];
            else
                for (k = 0; k < kc; ++k) p[k * MNISTCU__NR + j] = 0.0f;
        }
    }
}

static void mnistcu__cpu_gemm(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K, const float *A,
                              size_t lda, const float *B, size_t ldb, float *C, size_t ldc)
{
    float *bp = ctx->gemm_work, *ap = ctx->gemm_work + (size_t)MNISTCU__KC * MNISTCU__NC;
#ifdef _OPENMP
    /* A product this small takes well under a millisecond on one core; its dozen
       barriers would cost more than a second thread saves, and far more when
       the cores are shared with other programs (a descheduled thread stalls
       every barrier for a whole time slice). */
    int threads = (double)M * (double)N * (double)K < 1.0e7 ? 1 : ctx->threads;
#endif
    if (K == 0) {
        size_t i;
        for (i = 0; i < M; ++i) memset(C + i * ldc, 0, N * sizeof(float));
        return;
    }
    /* Every thread walks the same block loops (their counters are private to
       the region); the packing and tile loops are shared out with `omp for`,
       whose closing barriers keep the packed panels consistent. */
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        size_t jc, pc, ic;
        for (jc = 0; jc < N; jc += MNISTCU__NC) {
            size_t nc = MNISTCU__MIN((size_t)MNISTCU__NC, N - jc), npanels = (nc + MNISTCU__NR - 1) / MNISTCU__NR;
            for (pc = 0; pc < K; pc += MNISTCU__KC) {
                size_t kc = MNISTCU__MIN((size_t)MNISTCU__KC, K - pc);
                long jp;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                for (jp = 0; jp < (long)npanels; ++jp) mnistcu__pack_b(tb, B, ldb, pc, kc, jc, nc, bp, (size_t)jp);
                for (ic = 0; ic < M; ic += MNISTCU__MC) {
                    size_t mc = MNISTCU__MIN((size_t)MNISTCU__MC, M - ic), mpanels = (mc + MNISTCU__MR - 1) / MNISTCU__MR;
                    long ip, t;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                    for (ip = 0; ip < (long)mpanels; ++ip) mnistcu__pack_a(ta, A, lda, ic, mc, pc, kc, ap, (size_t)ip);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                    for (t = 0; t < (long)(mpanels * npanels); ++t) {
                        size_t ipn = (size_t)t / npanels, jpn = (size_t)t % npanels;
                        size_t i0 = ipn * MNISTCU__MR, j0 = jpn * MNISTCU__NR;
                        mnistcu__micro_kernel(kc, ap + ipn * MNISTCU__MR * kc, bp + jpn * MNISTCU__NR * kc,
                                              C + (ic + i0) * ldc + jc + j0, ldc,
                                              (int)MNISTCU__MIN((size_t)MNISTCU__MR, mc - i0),
                                              (int)MNISTCU__MIN((size_t)MNISTCU__NR, nc - j0), pc > 0);
                    }
                }
            }
        }
    }
}

/* ---- activations: the derivative is taken from the output y ------------- */
static MNISTCU__HD float mnistcu__act_f(mnistcu_act act, float z)
{
    switch (act) {
    case MNISTCU_ACT_IDENTITY: return z;
    case MNISTCU_ACT_SIGMOID:
        if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
        else {
            float e = expf(z);
            return e / (1.0f + e);
        }
    case MNISTCU_ACT_TANH: return tanhf(z);
    default: return z > 0.0f ? z : 0.0f;
    }
}

/* dL/dz from dL/dy and y = act(z). ReLU selects rather than multiplies, so a
   gradient of inf or NaN where the unit is off does not leak through as NaN. */
static MNISTCU__HD float mnistcu__act_backward_one(mnistcu_act act, float dy, float y)
{
    switch (act) {
    case MNISTCU_ACT_IDENTITY: return dy;
    case MNISTCU_ACT_SIGMOID: return dy * (y * (1.0f - y));
    case MNISTCU_ACT_TANH: return dy * (1.0f - y * y);
    default: return y > 0.0f ? dy : 0.0f;
    }
}

/* y[B][OUT] = act(y + b), in place after the product. */
static void mnistcu__cpu_bias_act(mnistcu_ctx *ctx, float *y, const float *bias, size_t B, size_t OUT, mnistcu_act act)
{
    long i;
    (void)ctx;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (B * OUT > 32768)
#endif
    for (i = 0; i < (long)B; ++i) {
        float *row = y + (size_t)i * OUT;
        size_t j;
        if (act == MNISTCU_ACT_RELU) {
            for (j = 0; j < OUT; ++j) {
                float z = row[j] + bias[j];
                row[j] = z > 0.0f ? z : 0.0f;
            }
        } else if (act == MNISTCU_ACT_IDENTITY) {
            for (j = 0; j < OUT; ++j) row[j] += bias[j];
        } else {
            for (j = 0; j < OUT; ++j) row[j] = mnistcu__act_f(act, row[j] + bias[j]);
        }
    }
}

/* dz[B][OUT] *= act'(y), in place: turns dL/dy into dL/dz. */
static void mnistcu__cpu_act_backward(mnistcu_ctx *ctx, float *dz, const float *y, size_t n, mnistcu_act act)
{
    long i;
    (void)ctx;
    if (act == MNISTCU_ACT_IDENTITY) return;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (n > 65536)
#endif
    for (i = 0; i < (long)n; ++i) dz[i] = mnistcu__act_backward_one(act, dz[i], y[i]);
}

/* db[OUT] = sum over the batch of dz[B][OUT], rows added in order. */
static void mnistcu__cpu_bias_grad(float *db, const float *dz, size_t B, size_t OUT)
{
    size_t i, j;
    for (j = 0; j < OUT; ++j) db[j] = 0.0f;
    for (i = 0; i < B; ++i)
        for (j = 0; j < OUT; ++j) db[j] += dz[i * OUT + j];
}

/* Softmax cross-entropy of one row of C logits, fused with its gradient:
   loss = logsumexp(z) - z[label]; g = (softmax(z) - onehot(label)) * grad_scale.
   g may be NULL (evaluation); *pred gets the first arg-max. */
static MNISTCU__HD void mnistcu__softmax_ce_row(const float *z, int32_t label, size_t C, float grad_scale, float *g,
                                                float *loss, int32_t *pred)
{
    float m = z[0], s = 0.0f;
    size_t j, arg = 0;
    for (j = 1; j < C; ++j)
        if (z[j] > m) {
            m = z[j];
            arg = j;
        }
    for (j = 0; j < C; ++j) s += expf(z[j] - m);
    *loss = (m + logf(s)) - z[label];
    *pred = (int32_t)arg;
    if (g) {
        float inv = 1.0f / s;
        for (j = 0; j < C; ++j) g[j] = expf(z[j] - m) * inv * grad_scale;
        g[label] -= grad_scale;
    }
}

/* The same over a batch of logits [B][C]; grad may be NULL. */
static void mnistcu__cpu_softmax_ce(mnistcu_ctx *ctx, const float *logits, const int32_t *labels, size_t B, size_t C,
                                    float grad_scale, float *grad, float *loss, int32_t *pred)
{
    long i;
    (void)ctx;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (B * C > 65536)
#endif
    for (i = 0; i < (long)B; ++i)
        mnistcu__softmax_ce_row(logits + (size_t)i * C, labels[i], C, grad_scale, grad ? grad + (size_t)i * C : NULL,
                                &loss[i], &pred[i]);
}

/* SGD with optional momentum, Nesterov and weight decay (torch.optim.SGD rules,
   no dampening): d = g + wd*w; v = mu*v + d; d = nesterov ? d + mu*v : v; w -= lr*d.
   v is NULL without momentum. */
static MNISTCU__HD void mnistcu__sgd_one(float *w, float g, float *v, float lr, float mu, int nesterov, float wd)
{
    float d = g;
    if (wd != 0.0f) d += wd * *w;
    if (v) {
        *v = mu * *v + d;
        d = nesterov ? d + mu * *v : *v;
    }
    *w -= lr * d;
}

static void mnistcu__cpu_sgd(mnistcu_ctx *ctx, float *w, const float *g, float *v, size_t n, float lr, float mu,
                             int nesterov, float wd)
{
    long i;
    (void)ctx;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (n > 262144)
#endif
    for (i = 0; i < (long)n; ++i) mnistcu__sgd_one(&w[i], g[i], v ? &v[i] : NULL, lr, mu, nesterov, wd);
}

/* >>model --------------------------------------------------------------------- */
typedef struct mnistcu__layer {
    int in, out;       /* widths */
    mnistcu_act act;   /* IDENTITY for the last layer: it gives logits */
    size_t w, b;       /* offsets of W [out][in] and b [out] in the parameter arena */
} mnistcu__layer;

struct mnistcu_model {
    mnistcu__object obj;  /* first member: the context's list */
    mnistcu_ctx *ctx;
    mnistcu_device device;
    int num_layers;
    mnistcu__layer layers[MNISTCU_MAX_LAYERS];
    int sizes[MNISTCU_MAX_LAYERS + 1];
    mnistcu_act hidden_act;
    mnistcu_loss loss;
    mnistcu_init init;
    size_t num_params, max_width;
    /* The three arenas, on the model's device: one allocation each. */
    float *params;        /* [num_params] */
    float *grads;         /* [num_params] */
    float *velocity;      /* [num_params] momentum buffer, made on the first step that needs it */
    uint64_t steps;       /* optimizer steps taken */
    mnistcu__rng rng;     /* initialisation and shuffling */
    int has_norm;         /* the training set's normalisation, applied to what the model evaluates */
    int norm_u8;          /* ... when it was stored as uint8 */
    float norm_scale, norm_shift;
    /* Workspace for batches of up to ws_batch samples, on the model's device. */
    size_t ws_batch;
    float *ws;                            /* one block holding what follows */
    float *act[MNISTCU_MAX_LAYERS + 1];   /* act[0] = x [B][IN0]; act[l+1] = output of layer l [B][OUT_l] */
    float *dbuf[2];                       /* [B][max_width] gradient ping-pong */
    float *sample_loss;                   /* [B] */
    int32_t *iws;                         /* one block: labels [B], pred [B] */
    int32_t *labels, *pred;
    void *cuda;                           /* mnistcu__cuda_model when on the GPU */
};

#ifdef __CUDACC__
static mnistcu_result mnistcu__cuda_model_alloc(mnistcu_model *m);
static void mnistcu__cuda_model_free(mnistcu_model *m);
static mnistcu_result mnistcu__cuda_reserve(mnistcu_model *m, size_t batch);
static mnistcu_result mnistcu__cuda_copy(mnistcu_model *m, void *dst, const void *src, size_t bytes, int to_device);
static mnistcu_result mnistcu__cuda_forward(mnistcu_model *m, size_t B);
static mnistcu_result mnistcu__cuda_loss(mnistcu_model *m, size_t B, int with_grad);
static mnistcu_result mnistcu__cuda_backward(mnistcu_model *m, size_t B);
static mnistcu_result mnistcu__cuda_update(mnistcu_model *m, const mnistcu_optim_desc *o);
static mnistcu_result mnistcu__cuda_ensure_velocity(mnistcu_model *m);
#endif

static void mnistcu__model_free_ws(mnistcu_model *m)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return; /* the CUDA side owns its workspace */
#endif
    mnistcu__free(m->ctx, m->ws);
    mnistcu__free(m->ctx, m->iws);
    m->ws = NULL;
    m->iws = NULL;
    m->ws_batch = 0;
}

static void mnistcu__model_free(mnistcu__object *o)
{
    mnistcu_model *m = (mnistcu_model *)o;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) mnistcu__cuda_model_free(m);
    else
#endif
    {
        mnistcu__free(m->ctx, m->params);
        mnistcu__free(m->ctx, m->grads);
        mnistcu__free(m->ctx, m->velocity);
        mnistcu__model_free_ws(m);
    }
    mnistcu__free(m->ctx, m);
}

MNISTCU_DEF void mnistcu_model_destroy(mnistcu_model *m)
{
    if (!m) return;
    mnistcu__object_unlink(&m->obj);
    mnistcu__model_free(&m->obj);
}

/* Lays the workspace out for batches of B samples (one block of floats, one of ints). */
static void mnistcu__model_layout_ws(mnistcu_model *m, float *ws, int32_t *iws, size_t B)
{
    float *p = ws;
    int l;
    m->act[0] = p;
    p += B * (size_t)m->sizes[0];
    for (l = 0; l < m->num_layers; ++l) {
        m->act[l + 1] = p;
        p += B * (size_t)m->layers[l].out;
    }
    m->dbuf[0] = p;
    p += B * m->max_width;
    m->dbuf[1] = p;
    p += B * m->max_width;
    m->sample_loss = p;
    m->iws = iws;
    m->labels = iws;
    m->pred = iws + B;
}

/* Floats in the workspace for batches of B samples, or 0 on overflow. */
static size_t mnistcu__model_ws_floats(const mnistcu_model *m, size_t B)
{
    size_t per = (size_t)m->sizes[0] + 2 * m->max_width + 1, total;
    int l;
    for (l = 0; l < m->num_layers; ++l) per += (size_t)m->layers[l].out;
    return mnistcu__mul(per, B, &total) ? total : 0;
}

static mnistcu_result mnistcu__model_reserve(mnistcu_model *m, size_t B)
{
    size_t floats, bytes;
    float *ws;
    int32_t *iws;
    if (B <= m->ws_batch) return MNISTCU_OK;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_reserve(m, B);
#endif
    floats = mnistcu__model_ws_floats(m, B);
    if (!floats || !mnistcu__mul(floats, sizeof(float), &bytes))
        return mnistcu__fail(m->ctx, MNISTCU_ERR_OVERFLOW, "workspace for batch %lu overflows", (unsigned long)B);
    ws = (float *)mnistcu__alloc(m->ctx, bytes);
    iws = (int32_t *)mnistcu__alloc(m->ctx, 2 * B * sizeof(int32_t));
    if (!ws || !iws) {
        mnistcu__free(m->ctx, ws);
        mnistcu__free(m->ctx, iws);
        return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory for a batch of %lu (%lu bytes)",
                             (unsigned long)B, (unsigned long)bytes);
    }
    mnistcu__model_free_ws(m);
    m->ws = ws;
    mnistcu__model_layout_ws(m, ws, iws, B);
    m->ws_batch = B;
    return MNISTCU_OK;
}

static void mnistcu__model_init_params(mnistcu_model *m, float *host)
{
    int l;
    for (l = 0; l < m->num_layers; ++l) {
        const mnistcu__layer *L = &m->layers[l];
        size_t i, nw = (size_t)L->in * (size_t)L->out;
        float wb, bb;
        if (m->init == MNISTCU_INIT_HE_UNIFORM) {
            wb = sqrtf(6.0f / (float)L->in);
            bb = 0.0f;
        } else {
            wb = bb = 1.0f / sqrtf((float)L->in);
        }
        for (i = 0; i < nw; ++i) host[L->w + i] = (2.0f * mnistcu__rng_float(&m->rng) - 1.0f) * wb;
        for (i = 0; i < (size_t)L->out; ++i) host[L->b + i] = (2.0f * mnistcu__rng_float(&m->rng) - 1.0f) * bb;
    }
}

MNISTCU_DEF mnistcu_result mnistcu_model_create(mnistcu_ctx *ctx, const mnistcu_model_desc *desc, mnistcu_model **out)
{
    mnistcu_model *m;
    mnistcu_result r;
    float *host;
    size_t total = 0, bytes;
    int n = 0, l;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!desc || !out) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create: desc or out is NULL");
    *out = NULL;
    while (n <= MNISTCU_MAX_LAYERS && desc->sizes[n] != 0) ++n;
    if (n < 2)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "model_create: sizes needs an input and an output width, e.g. {784, 10}");
    for (l = 0; l < n; ++l)
        if (desc->sizes[l] < 1 || (size_t)desc->sizes[l] > MNISTCU__MAX_FEATURES)
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create: width %d (layer %d) not in 1..2^24",
                                 desc->sizes[l], l);
    if (desc->sizes[n - 1] < 2 || desc->sizes[n - 1] > MNISTCU_MAX_CLASSES)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create: %d outputs, need 2..%d classes",
                             desc->sizes[n - 1], MNISTCU_MAX_CLASSES);
    if ((unsigned)desc->hidden_act > MNISTCU_ACT_TANH || (unsigned)desc->loss > MNISTCU_LOSS_SOFTMAX_CE ||
        (unsigned)desc->init > MNISTCU_INIT_HE_UNIFORM)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create: hidden_act, loss or init out of range");
    m = (mnistcu_model *)mnistcu__calloc(ctx, sizeof *m);
    if (!m) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_create: out of memory");
    m->ctx = ctx;
    m->device = ctx->device;
    m->num_layers = n - 1;
    m->hidden_act = desc->hidden_act == MNISTCU_ACT_DEFAULT ? MNISTCU_ACT_RELU : desc->hidden_act;
    m->loss = MNISTCU_LOSS_SOFTMAX_CE;
    m->init = desc->init == MNISTCU_INIT_DEFAULT ? MNISTCU_INIT_TORCH : desc->init;
    for (l = 0; l < n; ++l) m->sizes[l] = desc->sizes[l];
    for (l = 0; l < m->num_layers; ++l) {
        mnistcu__layer *L = &m->layers[l];
        size_t nw, layer_total;
        L->in = desc->sizes[l];
        L->out = desc->sizes[l + 1];
        L->act = l + 1 == m->num_layers ? MNISTCU_ACT_IDENTITY : m->hidden_act;
        if (!mnistcu__mul((size_t)L->in, (size_t)L->out, &nw) || !mnistcu__add(nw, (size_t)L->out, &layer_total) ||
            !mnistcu__add(total, layer_total, &total)) {
            mnistcu__free(ctx, m);
            return mnistcu__fail(ctx, MNISTCU_ERR_OVERFLOW, "model_create: parameter count overflows");
        }
        L->w = total - layer_total;
        L->b = L->w + nw;
        if ((size_t)L->out > m->max_width) m->max_width = (size_t)L->out;
        if ((size_t)L->in > m->max_width) m->max_width = (size_t)L->in;
    }
    m->num_params = total;
    mnistcu__rng_seed(&m->rng, ctx->desc.seed, 1 + ctx->objects_made++);
    mnistcu__object_link(ctx, &m->obj, mnistcu__model_free);
    if (!mnistcu__mul(total, sizeof(float), &bytes)) {
        mnistcu_model_destroy(m);
        return mnistcu__fail(ctx, MNISTCU_ERR_OVERFLOW, "model_create: parameter bytes overflow");
    }
    host = (float *)mnistcu__alloc(ctx, bytes);
    if (!host) {
        mnistcu_model_destroy(m);
        return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_create: out of memory for %lu parameters",
                             (unsigned long)total);
    }
    mnistcu__model_init_params(m, host);
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) {
        r = mnistcu__cuda_model_alloc(m);
        if (r == MNISTCU_OK) r = mnistcu__cuda_copy(m, m->params, host, bytes, 1);
        mnistcu__free(ctx, host);
        if (r) {
            mnistcu_model_destroy(m);
            return r;
        }
        *out = m;
        return MNISTCU_OK;
    }
#endif
    m->params = host;
    m->grads = (float *)mnistcu__calloc(ctx, bytes);
    if (!m->grads || (r = mnistcu__cpu_reserve(ctx)) != MNISTCU_OK) {
        mnistcu_model_destroy(m);
        return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_create: out of memory for gradients");
    }
    *out = m;
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_model_create_mlp(mnistcu_ctx *ctx, const char *spec, mnistcu_model **out)
{
    mnistcu_model_desc d;
    const char *p = spec;
    int n = 0;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!spec || !out) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create_mlp: NULL argument");
    *out = NULL;
    memset(&d, 0, sizeof d);
    for (;;) {
        long v = 0;
        if (*p < '0' || *p > '9' || n == MNISTCU_MAX_LAYERS + 1)
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                                 "model spec \"%s\": expected widths joined by '-', e.g. 784-128-10 (at most %d)", spec,
                                 MNISTCU_MAX_LAYERS + 1);
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p++ - '0');
            if (v > (long)MNISTCU__MAX_FEATURES)
                return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model spec \"%s\": width above 2^24", spec);
        }
        d.sizes[n++] = (int)v;
        if (*p == 0) break;
        if (*p++ != '-')
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model spec \"%s\": unexpected '%c'", spec, p[-1]);
    }
    if (n <= MNISTCU_MAX_LAYERS) d.sizes[n] = 0;
    return mnistcu_model_create(ctx, &d, out);
}

MNISTCU_DEF void mnistcu_model_info_get(const mnistcu_model *m, mnistcu_model_info *info)
{
    int l;
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!m) return;
    info->num_layers = m->num_layers;
    for (l = 0; l <= m->num_layers; ++l) info->sizes[l] = m->sizes[l];
    info->num_params = m->num_params;
    info->inputs = (size_t)m->sizes[0];
    info->classes = (size_t)m->sizes[m->num_layers];
    info->hidden_act = m->hidden_act;
    info->device = m->device;
}

MNISTCU_DEF size_t mnistcu_model_num_params(const mnistcu_model *m) { return m ? m->num_params : 0; }

/* Copies between a host array and one of the model's arenas or workspace buffers. */
static mnistcu_result mnistcu__model_copy(mnistcu_model *m, void *dst, const void *src, size_t bytes, int to_model)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_copy(m, dst, src, bytes, to_model);
#endif
    (void)to_model;
    (void)m;
    memcpy(dst, src, bytes);
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__check_count(const mnistcu_model *m, const void *p, size_t count, const char *what)
{
    if (!p) return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: NULL array", what);
    if (count != m->num_params)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_SHAPE, "%s: %lu floats given, the model has %lu parameters", what,
                             (unsigned long)count, (unsigned long)m->num_params);
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_model_get_params(const mnistcu_model *m, float *dst, size_t count)
{
    mnistcu_result r;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if ((r = mnistcu__check_count(m, dst, count, "model_get_params"))) return r;
    return mnistcu__model_copy((mnistcu_model *)m, dst, m->params, count * sizeof(float), 0);
}

MNISTCU_DEF mnistcu_result mnistcu_model_set_params(mnistcu_model *m, const float *src, size_t count)
{
    mnistcu_result r;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if ((r = mnistcu__check_count(m, src, count, "model_set_params"))) return r;
    return mnistcu__model_copy(m, m->params, src, count * sizeof(float), 1);
}

MNISTCU_DEF mnistcu_result mnistcu_model_get_grads(const mnistcu_model *m, float *dst, size_t count)
{
    mnistcu_result r;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if ((r = mnistcu__check_count(m, dst, count, "model_get_grads"))) return r;
    return mnistcu__model_copy((mnistcu_model *)m, dst, m->grads, count * sizeof(float), 0);
}

/* ---- the four steps of a training step, dispatched to the model's device -- */

/* act[0] holds x [B][IN0]: fills act[1..L]. */
static mnistcu_result mnistcu__forward(mnistcu_model *m, size_t B)
{
    int l;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_forward(m, B);
#endif
    for (l = 0; l < m->num_layers; ++l) {
        const mnistcu__layer *L = &m->layers[l];
        mnistcu__cpu_gemm(m->ctx, 0, 1, B, (size_t)L->out, (size_t)L->in, m->act[l], (size_t)L->in, m->params + L->w,
                          (size_t)L->in, m->act[l + 1], (size_t)L->out);
        mnistcu__cpu_bias_act(m->ctx, m->act[l + 1], m->params + L->b, B, (size_t)L->out, L->act);
    }
    return MNISTCU_OK;
}

/* Loss of the logits against labels: sample_loss, pred, and (with_grad) dL/dlogits of the mean loss in dbuf[0]. */
static mnistcu_result mnistcu__loss(mnistcu_model *m, size_t B, int with_grad)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_loss(m, B, with_grad);
#endif
    mnistcu__cpu_softmax_ce(m->ctx, m->act[m->num_layers], m->labels, B, (size_t)m->sizes[m->num_layers],
                            1.0f / (float)B, with_grad ? m->dbuf[0] : NULL, m->sample_loss, m->pred);
    return MNISTCU_OK;
}

/* dbuf[0] holds dL/dlogits: fills the gradient arena. */
static mnistcu_result mnistcu__backward(mnistcu_model *m, size_t B)
{
    float *cur = m->dbuf[0];
    int l;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_backward(m, B);
#endif
    for (l = m->num_layers - 1; l >= 0; --l) {
        const mnistcu__layer *L = &m->layers[l];
        size_t in = (size_t)L->in, out = (size_t)L->out;
        mnistcu__cpu_act_backward(m->ctx, cur, m->act[l + 1], B * out, L->act);
        /* dW [out][in] = dz^T [out][B] . x [B][in] */
        mnistcu__cpu_gemm(m->ctx, 1, 0, out, in, B, cur, out, m->act[l], in, m->grads + L->w, in);
        mnistcu__cpu_bias_grad(m->grads + L->b, cur, B, out);
        if (l > 0) { /* dx [B][in] = dz [B][out] . W [out][in]; the input layer needs none */
            float *next = cur == m->dbuf[0] ? m->dbuf[1] : m->dbuf[0];
            mnistcu__cpu_gemm(m->ctx, 0, 0, B, in, out, cur, out, m->params + L->w, in, next, in);
            cur = next;
        }
    }
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__resolve_optim(mnistcu_ctx *ctx, const mnistcu_optim_desc *in, mnistcu_optim_desc *o)
{
    memset(o, 0, sizeof *o);
    if (in) *o = *in;
    if (o->kind == MNISTCU_OPTIM_DEFAULT) o->kind = MNISTCU_OPTIM_SGD;
    if (o->learning_rate == 0.0f) o->learning_rate = 0.1f;
    if (o->kind != MNISTCU_OPTIM_SGD)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "optimizer kind %d unknown", (int)o->kind);
    if (!(o->learning_rate > 0.0f && o->learning_rate < FLT_MAX))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "learning rate %g must be positive and finite",
                             (double)o->learning_rate);
    if (!(o->momentum >= 0.0f && o->momentum < 1.0f))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "momentum %g not in [0, 1)", (double)o->momentum);
    if (o->nesterov && o->momentum == 0.0f)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "Nesterov momentum needs momentum > 0");
    if (!(o->weight_decay >= 0.0f && o->weight_decay < FLT_MAX))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "weight decay %g must be >= 0 and finite",
                             (double)o->weight_decay);
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__update(mnistcu_model *m, const mnistcu_optim_desc *o)
{
    if (o->momentum > 0.0f && !m->velocity) {
#ifdef __CUDACC__
        if (m->device == MNISTCU_DEVICE_CUDA) {
            mnistcu_result r = mnistcu__cuda_ensure_velocity(m);
            if (r) return r;
        } else
#endif
        {
            m->velocity = (float *)mnistcu__calloc(m->ctx, m->num_params * sizeof(float));
            if (!m->velocity) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory for momentum");
        }
    }
    m->steps++;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_update(m, o);
#endif
    mnistcu__cpu_sgd(m->ctx, m->params, m->grads, o->momentum > 0.0f ? m->velocity : NULL, m->num_params,
                     o->learning_rate, o->momentum, o->nesterov, o->weight_decay);
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__check_labels(const mnistcu_model *m, const int32_t *labels, size_t n)
{
    size_t i;
    int classes = m->sizes[m->num_layers];
    for (i = 0; i < n; ++i)
        if (labels[i] < 0 || labels[i] >= classes)
            return mnistcu__fail(m->ctx, MNISTCU_ERR_LABEL_RANGE, "label %ld at index %lu not in 0..%d",
                                 (long)labels[i], (unsigned long)i, classes - 1);
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_model_compute_grads(mnistcu_model *m, const float *x, const int32_t *labels, size_t n,
                                                       double *loss)
{
    mnistcu_result r;
    size_t i, in;
    double sum = 0.0;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!x || !labels || n == 0)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_compute_grads: x, labels and n must be given");
    if ((r = mnistcu__check_labels(m, labels, n)) || (r = mnistcu__model_reserve(m, n))) return r;
    in = (size_t)m->sizes[0];
    if ((r = mnistcu__model_copy(m, m->act[0], x, n * in * sizeof(float), 1)) ||
        (r = mnistcu__model_copy(m, m->labels, labels, n * sizeof(int32_t), 1)) || (r = mnistcu__forward(m, n)) ||
        (r = mnistcu__loss(m, n, 1)) || (r = mnistcu__backward(m, n)))
        return r;
    if (loss) {
        float *host = m->sample_loss;
#ifdef __CUDACC__
        if (m->device == MNISTCU_DEVICE_CUDA) {
            host = (float *)mnistcu__alloc(m->ctx, n * sizeof(float));
            if (!host) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory");
            if ((r = mnistcu__cuda_copy(m, host, m->sample_loss, n * sizeof(float), 0))) {
                mnistcu__free(m->ctx, host);
                return r;
            }
        }
#endif
        for (i = 0; i < n; ++i) sum += (double)host[i];
        *loss = sum / (double)n;
        if (host != m->sample_loss) mnistcu__free(m->ctx, host);
    }
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_model_apply_grads(mnistcu_model *m, const mnistcu_optim_desc *opt)
{
    mnistcu_optim_desc o;
    mnistcu_result r;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if ((r = mnistcu__resolve_optim(m->ctx, opt, &o))) return r;
    return mnistcu__update(m, &o);
}

/* >>train ----------------------------------------------------------------------
   One epoch: a shuffled index (host RNG, so CPU and GPU see the same batches),
   then for each batch: gather, forward, loss, backward, update. The loss and
   the number of correct predictions of every step are kept per step and summed
   in step order only where a report is due, so the GPU never waits for the host
   inside an epoch unless the caller asks for progress. */
#ifdef __CUDACC__
static mnistcu_result mnistcu__cuda_epoch_begin(mnistcu_model *m, const mnistcu_dataset *ds, const uint32_t *idx,
                                                size_t n, size_t steps);
static mnistcu_result mnistcu__cuda_gather(mnistcu_model *m, const mnistcu_dataset *ds, size_t offset, size_t B,
                                           float scale, float shift);
static mnistcu_result mnistcu__cuda_step_stats(mnistcu_model *m, size_t B, size_t step);
static mnistcu_result mnistcu__cuda_read_stats(mnistcu_model *m, size_t from, size_t to, double *loss, int64_t *correct);
static double mnistcu__cuda_step_loss(const mnistcu_model *m, size_t step);
#endif

typedef struct mnistcu__stats {
    double *loss;      /* [steps] loss summed over each step's samples */
    int64_t *correct;  /* [steps] correct predictions of each step */
    size_t steps;
} mnistcu__stats;

static mnistcu_result mnistcu__epoch_begin(mnistcu_model *m, const mnistcu_dataset *ds, const uint32_t *idx, size_t n,
                                           mnistcu__stats *st)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_epoch_begin(m, ds, idx, n, st->steps);
#endif
    (void)m; (void)ds; (void)idx; (void)n; (void)st;
    return MNISTCU_OK;
}

/* How the model normalises ds: as its training set when it was trained on data
   stored the same way, else as the dataset says. */
static void mnistcu__norm_for(const mnistcu_model *m, const mnistcu_dataset *ds, float *scale, float *shift)
{
    int same_kind = m->norm_u8 == (ds->u8 != NULL);
    *scale = m->has_norm && same_kind ? m->norm_scale : ds->scale;
    *shift = m->has_norm && same_kind ? m->norm_shift : ds->shift;
}

/* x and labels of samples idx[offset .. offset+B) into act[0] and labels. */
static mnistcu_result mnistcu__gather(mnistcu_model *m, const mnistcu_dataset *ds, const uint32_t *idx, size_t offset,
                                      size_t B)
{
    size_t i, j, F = ds->features;
    float scale, shift;
    mnistcu__norm_for(m, ds, &scale, &shift);
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_gather(m, ds, offset, B, scale, shift);
#endif
    for (i = 0; i < B; ++i) {
        size_t s = idx[offset + i];
        float *x = m->act[0] + i * F;
        if (ds->u8) {
            const uint8_t *src = ds->u8 + s * F;
            for (j = 0; j < F; ++j) x[j] = (float)src[j] * scale + shift;
        } else {
            const float *src = ds->f32 + s * F;
            for (j = 0; j < F; ++j) x[j] = src[j] * scale + shift;
        }
        m->labels[i] = ds->labels[s];
    }
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__step_stats(mnistcu_model *m, size_t B, size_t step, mnistcu__stats *st)
{
    double sum = 0.0;
    int64_t correct = 0;
    size_t i;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_step_stats(m, B, step);
#endif
    for (i = 0; i < B; ++i) {
        sum += (double)m->sample_loss[i];
        correct += m->pred[i] == m->labels[i];
    }
    st->loss[step] = sum;
    st->correct[step] = correct;
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__read_stats(mnistcu_model *m, const mnistcu__stats *st, size_t from, size_t to,
                                          double *loss, int64_t *correct)
{
    size_t i;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_read_stats(m, from, to, loss, correct);
#endif
    (void)m;
    for (i = from; i < to; ++i) {
        *loss += st->loss[i];
        *correct += st->correct[i];
    }
    return MNISTCU_OK;
}

/* ---- divergence -------------------------------------------------------------
   Where training reads its statistics anyway (every progress report, every
   epoch end) it checks that the loss of the steps since the last check is
   finite, and so is every parameter (a non-finite gradient or momentum reaches
   the parameters in the same step). A check that passes copies the parameters
   and the momentum aside, on the model's device; one that fails puts a copy
   back and stops training with MNISTCU_ERR_DIVERGED.
   Which copy: the weights of a check are only known to give a finite loss once
   the next step has computed it. So two copies are kept, the newest and the one
   before; if the first step after the newest is the one whose loss is not
   finite, the one before is put back. Either way the model keeps finite
   weights whose loss was finite (or, if the very first step failed, those it
   started with). On the GPU a kernel checks the parameters into a flag in
   device memory, queued just before the statistics are read: the flag arrives
   with them, and no step waits for the host. */
typedef struct mnistcu__finite_copy_slot {
    float *params;     /* [num_params] parameters checked finite */
    float *velocity;   /* [num_params] their momentum; allocated once the model has a momentum buffer */
    int has_velocity;  /* velocity holds the momentum taken with params */
    int epoch;         /* where they were taken: the epoch (0: before training) */
    size_t step;       /* and the steps done in it */
} mnistcu__finite_copy_slot;

typedef struct mnistcu__finite_guard {
    int on;            /* 0: mnistcu_train_desc.no_divergence_check */
    float lr;          /* the learning rate, for the message */
    mnistcu__finite_copy_slot slot[2];
    int newest;        /* slot[newest] is the last copy, slot[!newest] the one before */
    int copies;        /* copies taken: 1 means slot[!newest] holds none yet */
    int *dev_flags;    /* CUDA: [MNISTCU__FINITE_BLOCKS] per-block flags, then the flag of all */
    int *host_flag;    /* CUDA: pinned host copy of that flag */
} mnistcu__finite_guard;

#ifdef __CUDACC__
static mnistcu_result mnistcu__cuda_malloc(mnistcu_ctx *ctx, void **p, size_t bytes, const char *what);
static void mnistcu__cuda_free(mnistcu_ctx *ctx, void *p);
static mnistcu_result mnistcu__cuda_device_copy(mnistcu_model *m, float *dst, const float *src, size_t n, int sync);
static mnistcu_result mnistcu__cuda_finite_begin(mnistcu_model *m, mnistcu__finite_guard *g);
static void mnistcu__cuda_finite_end(mnistcu_model *m, mnistcu__finite_guard *g);
static mnistcu_result mnistcu__cuda_finite_queue(mnistcu_model *m, mnistcu__finite_guard *g);
static mnistcu_result mnistcu__cuda_finite_flag(mnistcu_model *m, mnistcu__finite_guard *g, int *all_finite);
#endif

/* Not NaN and not +-inf: the exponent bits are not all ones. A bit test, so
   that -ffast-math (which may assume that no NaN exists) cannot remove it. */
static MNISTCU__HD int mnistcu__finite_f(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7F800000u) != 0x7F800000u;
}

static int mnistcu__finite_d(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7FF0000000000000ull) != 0x7FF0000000000000ull;
}

/* n floats on the model's device: dst = src, or dst = 0 when src is NULL. */
static mnistcu_result mnistcu__finite_copy(mnistcu_model *m, float *dst, const float *src, size_t n, int sync)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_device_copy(m, dst, src, n, sync);
#endif
    (void)m; (void)sync;
    if (src) memcpy(dst, src, n * sizeof(float));
    else memset(dst, 0, n * sizeof(float));
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__finite_alloc(mnistcu_model *m, float **p)
{
    *p = NULL;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA)
        return mnistcu__cuda_malloc(m->ctx, (void **)p, m->num_params * sizeof(float),
                                    "divergence check: a copy of the weights");
#endif
    *p = (float *)mnistcu__alloc(m->ctx, m->num_params * sizeof(float));
    if (!*p)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY,
                             "divergence check: out of memory for a copy of %llu weights", MNISTCU__ULL(m->num_params));
    return MNISTCU_OK;
}

static void mnistcu__finite_free(mnistcu_model *m, float *p)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) {
        mnistcu__cuda_free(m->ctx, p);
        return;
    }
#endif
    mnistcu__free(m->ctx, p);
}

/* Copies the parameters and momentum aside, over the older of the two copies,
   which becomes the newest. */
static mnistcu_result mnistcu__finite_snapshot(mnistcu_model *m, mnistcu__finite_guard *g, int epoch, size_t step)
{
    mnistcu__finite_copy_slot *c = &g->slot[g->copies ? !g->newest : g->newest];
    mnistcu_result r;
    if (!c->params && (r = mnistcu__finite_alloc(m, &c->params))) return r;
    if ((r = mnistcu__finite_copy(m, c->params, m->params, m->num_params, 0))) return r;
    c->has_velocity = m->velocity != NULL;
    if (m->velocity) {
        if (!c->velocity && (r = mnistcu__finite_alloc(m, &c->velocity))) return r;
        if ((r = mnistcu__finite_copy(m, c->velocity, m->velocity, m->num_params, 0))) return r;
    }
    c->epoch = epoch;
    c->step = step;
    g->newest = (int)(c - g->slot);
    g->copies++;
    return MNISTCU_OK;
}

/* Just before the statistics of a report are read: on the GPU, queue the check
   of the parameters, whose flag then comes back with the statistics. */
static mnistcu_result mnistcu__finite_queue(mnistcu_model *m, mnistcu__finite_guard *g)
{
#ifdef __CUDACC__
    if (g->on && m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_finite_queue(m, g);
#endif
    (void)m; (void)g;
    return MNISTCU_OK;
}

/* *all_finite: 1 when no parameter is NaN or infinite. On the GPU this reads
   the flag that mnistcu__finite_queue asked for. */
static mnistcu_result mnistcu__finite_params(mnistcu_model *m, mnistcu__finite_guard *g, int *all_finite)
{
    size_t i;
    int ok = 1;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_finite_flag(m, g, all_finite);
#endif
    (void)g;
    for (i = 0; i < m->num_params; ++i) ok &= mnistcu__finite_f(m->params[i]);
    *all_finite = ok;
    return MNISTCU_OK;
}

/* Before training: the weights must be finite (there would be nothing good to
   keep otherwise), and they are the first copy. */
static mnistcu_result mnistcu__finite_begin(mnistcu_model *m, mnistcu__finite_guard *g, int on, float lr)
{
    mnistcu_result r;
    int ok = 1;
    memset(g, 0, sizeof *g);
    g->on = on;
    g->lr = lr;
    if (!on) return MNISTCU_OK;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA && (r = mnistcu__cuda_finite_begin(m, g))) return r;
#endif
    if ((r = mnistcu__finite_queue(m, g)) || (r = mnistcu__finite_params(m, g, &ok))) return r;
    if (!ok)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "train: a weight of the model is not finite before training (NaN or infinite); give it "
                             "finite weights (mnistcu_model_set_params), or set no_divergence_check to train anyway");
    return mnistcu__finite_snapshot(m, g, 0, 0);
}

static void mnistcu__finite_end(mnistcu_model *m, mnistcu__finite_guard *g)
{
    int k;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) mnistcu__cuda_finite_end(m, g);
#endif
    for (k = 0; k < 2; ++k) {
        mnistcu__finite_free(m, g->slot[k].params);
        mnistcu__finite_free(m, g->slot[k].velocity);
    }
    memset(g, 0, sizeof *g);
}

/* Loss of step i of the epoch (summed over its samples), read at this report. */
static double mnistcu__step_loss(const mnistcu_model *m, const mnistcu__stats *st, size_t i)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_step_loss(m, i);
#endif
    (void)m;
    return st->loss[i];
}

/* At a report p, its statistics read: the check. On success the parameters
   are copied aside; on failure a copy is put back (see above), res describes
   the training so far, and the result is MNISTCU_ERR_DIVERGED. */
static mnistcu_result mnistcu__finite_check(mnistcu_model *m, mnistcu__finite_guard *g, const mnistcu__stats *st,
                                            const mnistcu_progress *p, mnistcu_train_result *res)
{
    const mnistcu__finite_copy_slot *c = &g->slot[g->newest];
    size_t from = c->epoch == p->epoch ? c->step : 0, bad_step = p->step, i;
    int loss_ok = 1, params_ok = 1, first_after;
    double bad_loss = 0.0;
    char kept[128];
    mnistcu_result r;
    if (!g->on) return MNISTCU_OK;
    /* Per-sample losses are >= 0, so the running mean is finite exactly when
       every step's loss is; only then do the parameters need looking at. */
    if (!mnistcu__finite_d(p->train_loss)) {
        loss_ok = 0;
        for (i = from; i < p->step; ++i) {
            bad_loss = mnistcu__step_loss(m, st, i);
            if (!mnistcu__finite_d(bad_loss)) {
                bad_step = i + 1;
                break;
            }
        }
    } else if ((r = mnistcu__finite_params(m, g, &params_ok))) {
        return r;
    }
    if (loss_ok && params_ok) return mnistcu__finite_snapshot(m, g, p->epoch, p->step);

    /* The newest copy's own loss is that of the step after it: when that is
       the step that failed, the copy before is the last good one. */
    first_after = c->epoch == 0 || c->step == p->steps ? p->epoch == c->epoch + 1 && bad_step == 1
                                                       : p->epoch == c->epoch && bad_step == c->step + 1;
    if (!loss_ok && first_after && g->copies > 1) c = &g->slot[!g->newest];
    if ((r = mnistcu__finite_copy(m, m->params, c->params, m->num_params, !m->velocity))) return r;
    if (m->velocity &&
        (r = mnistcu__finite_copy(m, m->velocity, c->has_velocity ? c->velocity : NULL, m->num_params, 1)))
        return r;
    res->epochs = p->epoch;
    res->train_loss = p->train_loss;
    res->train_accuracy = p->train_accuracy;
    res->seconds = p->seconds;
    res->diverged_epoch = p->epoch;
    res->diverged_step = bad_step;
    if (c->epoch == 0) snprintf(kept, sizeof kept, "the weights it had before training");
    else snprintf(kept, sizeof kept, "the weights of epoch %d, step %llu, the last ones finite with a finite loss",
                  c->epoch, MNISTCU__ULL(c->step));
    if (!loss_ok)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_DIVERGED,
                             "training diverged in epoch %d at step %llu of %llu: the loss is %s. The model keeps %s. "
                             "Try a lower learning rate (this run: %g).", p->epoch, MNISTCU__ULL(bad_step),
                             MNISTCU__ULL(p->steps), bad_loss != bad_loss ? "NaN" : "infinite", kept, (double)g->lr);
    return mnistcu__fail(m->ctx, MNISTCU_ERR_DIVERGED,
                         "training diverged in epoch %d by step %llu of %llu: a weight is not finite (the loss still "
                         "was). The model keeps %s. Try a lower learning rate (this run: %g).", p->epoch,
                         MNISTCU__ULL(bad_step), MNISTCU__ULL(p->steps), kept, (double)g->lr);
}

MNISTCU_DEF void mnistcu_train_desc_resolve(const mnistcu_train_desc *desc, mnistcu_train_desc *out)
{
    mnistcu_train_desc d;
    if (!out) return;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (d.epochs == 0) d.epochs = 10;
    if (d.batch_size == 0) d.batch_size = 64;
    if (d.optim.kind == MNISTCU_OPTIM_DEFAULT) d.optim.kind = MNISTCU_OPTIM_SGD;
    if (d.optim.learning_rate == 0.0f) d.optim.learning_rate = 0.1f;
    *out = d;
}

static mnistcu_result mnistcu__check_dataset(const mnistcu_model *m, const mnistcu_dataset *ds, const char *what)
{
    if (!ds) return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: dataset is NULL", what);
    if (ds->ctx != m->ctx)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: dataset and model belong to different contexts",
                             what);
    if (ds->features != (size_t)m->sizes[0])
        return mnistcu__fail(m->ctx, MNISTCU_ERR_SHAPE, "%s: samples have %lu features, the model takes %d inputs", what,
                             (unsigned long)ds->features, m->sizes[0]);
    if (ds->num_classes > m->sizes[m->num_layers])
        return mnistcu__fail(m->ctx, MNISTCU_ERR_SHAPE, "%s: dataset has %d classes, the model outputs %d", what,
                             ds->num_classes, m->sizes[m->num_layers]);
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_train(mnistcu_model *m, const mnistcu_dataset *train, const mnistcu_train_desc *desc,
                                         mnistcu_train_result *result)
{
    mnistcu_train_desc d;
    mnistcu_optim_desc o;
    mnistcu_ctx *ctx;
    mnistcu_result r;
    mnistcu__stats st;
    mnistcu__finite_guard guard;
    mnistcu_train_result res;
    uint32_t *idx = NULL;
    size_t n, B, steps, i;
    double t_train = 0.0;
    int epoch, stop = 0;

    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    ctx = m->ctx;
    memset(&res, 0, sizeof res);
    memset(&st, 0, sizeof st);
    memset(&guard, 0, sizeof guard);
    if (result) *result = res;
    if ((r = mnistcu__check_dataset(m, train, "train"))) return r;
    if (desc && desc->validation && (r = mnistcu__check_dataset(m, desc->validation, "train (validation set)")))
        return r;
    mnistcu_train_desc_resolve(desc, &d);
    if (d.epochs < 0 || d.batch_size < 0)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "train: epochs %d and batch_size %d must be positive",
                             d.epochs, d.batch_size);
    n = train->count;
    B = (size_t)d.batch_size;
    if (B > n)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "train: batch_size %lu is larger than the dataset (%lu)",
                             (unsigned long)B, (unsigned long)n);
    if ((r = mnistcu__resolve_optim(ctx, &d.optim, &o))) return r;
    if ((r = mnistcu__model_reserve(m, B))) return r;
    steps = (n + B - 1) / B; /* the last partial batch is trained too */
    idx = (uint32_t *)mnistcu__alloc(ctx, n * sizeof(uint32_t));
    st.steps = steps;
    st.loss = (double *)mnistcu__alloc(ctx, steps * sizeof(double));
    st.correct = (int64_t *)mnistcu__alloc(ctx, steps * sizeof(int64_t));
    if (!idx || !st.loss || !st.correct) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "train: out of memory for %lu indices", (unsigned long)n);
        goto done;
    }
    if ((r = mnistcu__finite_begin(m, &guard, !d.no_divergence_check, o.learning_rate))) goto done;
    m->has_norm = 1; /* evaluation and predict_u8 normalise as this training set does */
    m->norm_u8 = train->u8 != NULL;
    m->norm_scale = train->scale;
    m->norm_shift = train->shift;

    for (epoch = 1; epoch <= d.epochs && !stop; ++epoch) {
        double t_epoch = mnistcu__now(), loss_sum = 0.0;
        int64_t correct = 0;
        size_t step, reported = 0, seen = 0;
        for (i = 0; i < n; ++i) idx[i] = (uint32_t)i;
        if (!d.no_shuffle) mnistcu__shuffle(&m->rng, idx, n);
        if ((r = mnistcu__epoch_begin(m, train, idx, n, &st))) goto done;
        for (step = 0; step < steps && !stop; ++step) {
            size_t b = MNISTCU__MIN(B, n - step * B);
            if ((r = mnistcu__gather(m, train, idx, step * B, b)) || (r = mnistcu__forward(m, b)) ||
                (r = mnistcu__loss(m, b, 1)) || (r = mnistcu__step_stats(m, b, step, &st)) ||
                (r = mnistcu__backward(m, b)) || (r = mnistcu__update(m, &o)))
                goto done;
            seen += b;
            res.steps++;
            if (step + 1 == steps || (d.progress && d.progress_every && (step + 1) % d.progress_every == 0)) {
                mnistcu_progress p;
                if ((r = mnistcu__finite_queue(m, &guard)) ||
                    (r = mnistcu__read_stats(m, &st, reported, step + 1, &loss_sum, &correct)))
                    goto done;
                reported = step + 1;
                memset(&p, 0, sizeof p);
                p.epoch = epoch;
                p.epochs = d.epochs;
                p.step = step + 1;
                p.steps = steps;
                p.samples = seen;
                p.train_loss = loss_sum / (double)seen;
                p.train_accuracy = (double)correct / (double)seen;
                p.epoch_end = step + 1 == steps;
                p.seconds = t_train + (mnistcu__now() - t_epoch);
                p.images_per_second = (double)seen / MNISTCU__MAX(mnistcu__now() - t_epoch, 1e-9);
                if ((r = mnistcu__finite_check(m, &guard, &st, &p, &res))) goto done;
                if (p.epoch_end) {
                    t_train += mnistcu__now() - t_epoch;
                    p.seconds = t_train;
                    res.epochs = epoch;
                    res.train_loss = p.train_loss;
                    res.train_accuracy = p.train_accuracy;
                    res.seconds = t_train;
                    if (d.validation) {
                        mnistcu_metrics vm;
                        if ((r = mnistcu_evaluate(m, d.validation, &vm, NULL))) goto done;
                        p.has_validation = res.has_validation = 1;
                        p.val_loss = res.val_loss = vm.loss;
                        p.val_accuracy = res.val_accuracy = vm.accuracy;
                    }
                    if (p.has_validation)
                        mnistcu__log(ctx, MNISTCU_LOG_INFO,
                                     "epoch %d/%d  loss %.4f  acc %.2f%%  val loss %.4f  val acc %.2f%%  %.2f s  %.0f img/s",
                                     epoch, d.epochs, p.train_loss, 100.0 * p.train_accuracy, p.val_loss,
                                     100.0 * p.val_accuracy, p.seconds, p.images_per_second);
                    else
                        mnistcu__log(ctx, MNISTCU_LOG_INFO, "epoch %d/%d  loss %.4f  acc %.2f%%  %.2f s  %.0f img/s",
                                     epoch, d.epochs, p.train_loss, 100.0 * p.train_accuracy, p.seconds,
                                     p.images_per_second);
                }
                if (d.progress && d.progress(d.progress_user, &p)) stop = 1;
                if (stop && !p.epoch_end) { /* stopped inside an epoch: report what was trained */
                    t_train += mnistcu__now() - t_epoch;
                    res.epochs = epoch;
                    res.train_loss = p.train_loss;
                    res.train_accuracy = p.train_accuracy;
                    res.seconds = t_train;
                }
            }
        }
    }
    if (result) *result = res;
    r = MNISTCU_OK;
done:
    if (result && r == MNISTCU_ERR_DIVERGED) *result = res;
    mnistcu__finite_end(m, &guard);
    mnistcu__free(ctx, idx);
    mnistcu__free(ctx, st.loss);
    mnistcu__free(ctx, st.correct);
    return r;
}

/* >>evaluate ------------------------------------------------------------------- */
#define MNISTCU__EVAL_CHUNK 1000

MNISTCU_DEF mnistcu_result mnistcu_evaluate(mnistcu_model *m, const mnistcu_dataset *ds, mnistcu_metrics *out,
                                            int64_t *confusion)
{
    mnistcu_result r;
    mnistcu__stats st;
    uint32_t *idx = NULL;
    int32_t *pred = NULL, *labels;
    size_t n, i, chunk, steps, s, C;
    double loss = 0.0;
    int64_t correct = 0;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out) return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "evaluate: out is NULL");
    memset(out, 0, sizeof *out);
    if ((r = mnistcu__check_dataset(m, ds, "evaluate"))) return r;
    n = ds->count;
    C = (size_t)m->sizes[m->num_layers];
    chunk = MNISTCU__MIN(n, (size_t)MNISTCU__EVAL_CHUNK);
    if ((r = mnistcu__model_reserve(m, chunk))) return r;
    steps = (n + chunk - 1) / chunk;
    memset(&st, 0, sizeof st);
    st.steps = steps;
    idx = (uint32_t *)mnistcu__alloc(m->ctx, n * sizeof(uint32_t));
    st.loss = (double *)mnistcu__alloc(m->ctx, steps * sizeof(double));
    st.correct = (int64_t *)mnistcu__alloc(m->ctx, steps * sizeof(int64_t));
    if (confusion) pred = (int32_t *)mnistcu__alloc(m->ctx, chunk * sizeof(int32_t));
    if (!idx || !st.loss || !st.correct || (confusion && !pred)) {
        r = mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "evaluate: out of memory");
        goto done;
    }
    for (i = 0; i < n; ++i) idx[i] = (uint32_t)i;
    if (confusion) memset(confusion, 0, C * C * sizeof(int64_t));
    if ((r = mnistcu__epoch_begin(m, ds, idx, n, &st))) goto done;
    for (s = 0; s < steps; ++s) {
        size_t b = MNISTCU__MIN(chunk, n - s * chunk);
        if ((r = mnistcu__gather(m, ds, idx, s * chunk, b)) || (r = mnistcu__forward(m, b)) ||
            (r = mnistcu__loss(m, b, 0)) || (r = mnistcu__step_stats(m, b, s, &st)))
            goto done;
        if (confusion) {
            if ((r = mnistcu__model_copy(m, pred, m->pred, b * sizeof(int32_t), 0))) goto done;
            labels = ds->labels + s * chunk;
            for (i = 0; i < b; ++i) confusion[(size_t)labels[i] * C + (size_t)pred[i]]++;
        }
    }
    if ((r = mnistcu__read_stats(m, &st, 0, steps, &loss, &correct))) goto done;
    out->count = n;
    out->correct = (size_t)correct;
    out->loss = loss / (double)n;
    out->accuracy = (double)correct / (double)n;
done:
    mnistcu__free(m->ctx, idx);
    mnistcu__free(m->ctx, st.loss);
    mnistcu__free(m->ctx, st.correct);
    mnistcu__free(m->ctx, pred);
    return r;
}

/* >>predict --------------------------------------------------------------------- */
MNISTCU_DEF mnistcu_result mnistcu_model_forward(mnistcu_model *m, const float *x, size_t n, float *logits)
{
    mnistcu_result r;
    size_t off, in, C, chunk;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!x || !logits || n == 0)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_forward: x, logits and n must be given");
    in = (size_t)m->sizes[0];
    C = (size_t)m->sizes[m->num_layers];
    chunk = MNISTCU__MIN(n, (size_t)MNISTCU__EVAL_CHUNK);
    if ((r = mnistcu__model_reserve(m, chunk))) return r;
    for (off = 0; off < n; off += chunk) {
        size_t b = MNISTCU__MIN(chunk, n - off);
        if ((r = mnistcu__model_copy(m, m->act[0], x + off * in, b * in * sizeof(float), 1)) ||
            (r = mnistcu__forward(m, b)) ||
            (r = mnistcu__model_copy(m, logits + off * C, m->act[m->num_layers], b * C * sizeof(float), 0)))
            return r;
    }
    return MNISTCU_OK;
}

/* Softmax and arg-max of logits already on the host. */
static void mnistcu__host_softmax(float *z, size_t n, size_t C, int32_t *labels, int want_probs)
{
    size_t i, j;
    for (i = 0; i < n; ++i) {
        float *row = z + i * C, mx = row[0], s = 0.0f;
        size_t arg = 0;
        for (j = 1; j < C; ++j)
            if (row[j] > mx) {
                mx = row[j];
                arg = j;
            }
        if (labels) labels[i] = (int32_t)arg;
        if (want_probs) {
            for (j = 0; j < C; ++j) s += (row[j] = expf(row[j] - mx));
            for (j = 0; j < C; ++j) row[j] /= s;
        }
    }
}

MNISTCU_DEF mnistcu_result mnistcu_predict(mnistcu_model *m, const float *x, size_t n, int32_t *labels, float *probs)
{
    mnistcu_result r;
    float *z;
    size_t C, bytes;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!x || n == 0 || (!labels && !probs))
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "predict: x, n and labels or probs must be given");
    C = (size_t)m->sizes[m->num_layers];
    if (!mnistcu__mul3(n, C, sizeof(float), &bytes))
        return mnistcu__fail(m->ctx, MNISTCU_ERR_OVERFLOW, "predict: %lu samples overflow", (unsigned long)n);
    z = probs ? probs : (float *)mnistcu__alloc(m->ctx, bytes);
    if (!z) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "predict: out of memory");
    r = mnistcu_model_forward(m, x, n, z);
    if (r == MNISTCU_OK) mnistcu__host_softmax(z, n, C, labels, probs != NULL);
    if (z != probs) mnistcu__free(m->ctx, z);
    return r;
}

MNISTCU_DEF mnistcu_result mnistcu_predict_u8(mnistcu_model *m, const uint8_t *pixels, size_t n, int32_t *labels,
                                              float *probs)
{
    mnistcu_result r = MNISTCU_OK;
    float *x, scale, shift;
    size_t in, C, i, off, chunk, bytes;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!pixels || n == 0 || (!labels && !probs))
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "predict_u8: pixels, n and labels or probs must be given");
    in = (size_t)m->sizes[0];
    C = (size_t)m->sizes[m->num_layers];
    scale = m->has_norm && m->norm_u8 ? m->norm_scale : 1.0f / 255.0f;
    shift = m->has_norm && m->norm_u8 ? m->norm_shift : 0.0f;
    chunk = MNISTCU__MIN(n, (size_t)MNISTCU__EVAL_CHUNK);
    if (!mnistcu__mul3(chunk, in, sizeof(float), &bytes))
        return mnistcu__fail(m->ctx, MNISTCU_ERR_OVERFLOW, "predict_u8: %lu inputs overflow", (unsigned long)in);
    x = (float *)mnistcu__alloc(m->ctx, bytes);
    if (!x) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "predict_u8: out of memory");
    for (off = 0; off < n && r == MNISTCU_OK; off += chunk) {
        size_t b = MNISTCU__MIN(chunk, n - off);
        for (i = 0; i < b * in; ++i) x[i] = (float)pixels[off * in + i] * scale + shift;
        r = mnistcu_predict(m, x, b, labels ? labels + off : NULL, probs ? probs + off * C : NULL);
    }
    mnistcu__free(m->ctx, x);
    return r;
}
/* >>cuda ------------------------------------------------------------------------
   The CUDA backend: the same operations as >>cpu_ops, one kernel each, on one
   stream. Shapes as in the legend above >>cpu_ops. Every launch is checked;
   errors that leave the device unusable (illegal address, launch failure...) are
   latched in the context and reported by every later call. No kernel uses
   atomics: each output element is computed by one thread in a fixed order, and
   reductions run in a fixed tree, so two runs are bitwise identical. */
#ifdef __CUDACC__
#include <cuda_runtime.h>
#ifdef MNISTCU_CUBLAS
#include <cublas_v2.h>
#endif

typedef struct mnistcu__cuda {
    int device;
    cudaStream_t stream;       /* compute */
    cudaStream_t copy_stream;  /* streaming mode: host-to-device batch copies */
    cudaError_t sticky;        /* latched unrecoverable error, cudaSuccess if none */
    int use_cublas;
#ifdef MNISTCU_CUBLAS
    cublasHandle_t blas;
#endif
} mnistcu__cuda;

/* A dataset's copy on the GPU (resident mode). */
typedef struct mnistcu__cuda_dataset {
    uint8_t *u8;      /* [count][features] or NULL */
    float *f32;       /* [count][features] or NULL */
    int32_t *labels;  /* [count] */
} mnistcu__cuda_dataset;

#define MNISTCU__STREAM_SLOTS 2

/* A model's GPU state beyond the arenas and workspace kept in mnistcu_model. */
typedef struct mnistcu__cuda_model {
    uint32_t *idx;            /* [idx_cap] the epoch's sample order */
    size_t idx_cap;
    double *stats;            /* [2][stats_cap]: loss sums, then correct counts, per step */
    size_t stats_cap;
    double *host_stats;       /* pinned, [2][stats_cap] */
    const mnistcu_dataset *ds; /* the dataset of the current epoch */
    const uint32_t *host_idx;  /* its order on the host (streaming mode) */
    int streaming;
    /* streaming mode: per slot, a pinned host batch and its device copy */
    size_t slot_bytes;        /* bytes of each slot buffer */
    void *pinned[MNISTCU__STREAM_SLOTS];   /* [B][F] stored type, then labels [B] */
    void *staged[MNISTCU__STREAM_SLOTS];   /* same, on the device */
    cudaEvent_t copied[MNISTCU__STREAM_SLOTS], consumed[MNISTCU__STREAM_SLOTS];
    int slot_used[MNISTCU__STREAM_SLOTS];
    size_t step_counter;
} mnistcu__cuda_model;

static mnistcu__cuda *mnistcu__cu(const mnistcu_ctx *ctx) { return (mnistcu__cuda *)ctx->cuda; }

static int mnistcu__cuda_is_sticky(cudaError_t e)
{
    return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorHardwareStackError ||
           e == cudaErrorIllegalInstruction || e == cudaErrorMisalignedAddress || e == cudaErrorInvalidAddressSpace ||
           e == cudaErrorInvalidPc || e == cudaErrorAssert || e == cudaErrorLaunchTimeout ||
           e == cudaErrorECCUncorrectable || e == cudaErrorContextIsDestroyed;
}

/* Turns a CUDA error into a result; latches it when the device is now unusable. */
static mnistcu_result mnistcu__cuda_check(mnistcu_ctx *ctx, cudaError_t e, const char *what)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    if (e == cudaSuccess) return MNISTCU_OK;
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it so the context stays usable */
        return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%s: GPU out of memory", what);
    }
    if (mnistcu__cuda_is_sticky(e) && cu) cu->sticky = e;
    else (void)cudaGetLastError();
    return mnistcu__fail(ctx, MNISTCU_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Every GPU entry point starts here: a latched error is reported again. */
static mnistcu_result mnistcu__cuda_alive(mnistcu_ctx *ctx)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    if (cu && cu->sticky != cudaSuccess)
        return mnistcu__fail(ctx, MNISTCU_ERR_CUDA, "the GPU had an unrecoverable error earlier: %s (%s)",
                             cudaGetErrorString(cu->sticky), cudaGetErrorName(cu->sticky));
    return MNISTCU_OK;
}

/* After each launch: the launch error, and with MNISTCU_DEBUG_SYNC the kernel's own. */
static mnistcu_result mnistcu__cuda_launched(mnistcu_ctx *ctx, const char *kernel)
{
    cudaError_t e = cudaGetLastError();
#ifdef MNISTCU_DEBUG_SYNC
    if (e == cudaSuccess) e = cudaStreamSynchronize(mnistcu__cu(ctx)->stream);
#endif
    return mnistcu__cuda_check(ctx, e, kernel);
}
#define MNISTCU__LAUNCHED(ctx, name)                                    \
    do {                                                                \
        mnistcu_result launch_r_ = mnistcu__cuda_launched(ctx, name);   \
        if (launch_r_ != MNISTCU_OK) return launch_r_;                  \
    } while (0)

static mnistcu_result mnistcu__cuda_malloc(mnistcu_ctx *ctx, void **p, size_t bytes, const char *what)
{
    cudaError_t e;
    *p = NULL;
    if (bytes == 0) bytes = 1;
    if (ctx->desc.allocator.device_alloc) {
        *p = ctx->desc.allocator.device_alloc(ctx->desc.allocator.user, bytes);
        if (!*p)
            return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%s: GPU allocation of %lu bytes refused", what,
                                 (unsigned long)bytes);
        return MNISTCU_OK;
    }
    e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        *p = NULL;
        return mnistcu__cuda_check(ctx, e, what);
    }
    return MNISTCU_OK;
}

static void mnistcu__cuda_free(mnistcu_ctx *ctx, void *p)
{
    if (!p) return;
    if (ctx->desc.allocator.device_free) ctx->desc.allocator.device_free(ctx->desc.allocator.user, p);
    else cudaFree(p);
}

/* ---- kernels --------------------------------------------------------------- */
#define MNISTCU__THREADS 256

static unsigned mnistcu__blocks(size_t n)
{
    size_t b = (n + MNISTCU__THREADS - 1) / MNISTCU__THREADS;
    return (unsigned)(b < 65535u * 32u ? (b ? b : 1) : 65535u * 32u); /* grid-stride loops cover the rest */
}

/* The register-tiled matrix product, C[M][N] = op(A)[M][K] op(B)[K][N], with an
   optional fused epilogue C = act(C + bias[n]). A 64x64 tile of C per block of
   256 threads, 4x4 outputs per thread (rows ty+16i, columns tx+16j, so that
   stores are coalesced); op(A) and op(B) are staged through shared memory in
   K-steps of 16, read along their contiguous direction whatever the transpose.
   Each output sums over k in increasing order: deterministic. Variants and
   timings: bench/cuda_gemm.cu. */
#define MNISTCU__GBM 64
#define MNISTCU__GBN 64
#define MNISTCU__GBK 16

template <int TA, int TB, int FUSE>
__global__ void __launch_bounds__(256) mnistcu__k_gemm(int M, int N, int K, const float *__restrict__ A, int lda,
                                                        const float *__restrict__ B, int ldb, float *__restrict__ C,
                                                        int ldc, const float *__restrict__ bias, int act)
{
    __shared__ float As[MNISTCU__GBK][MNISTCU__GBM + 4];
    __shared__ float Bs[MNISTCU__GBK][MNISTCU__GBN + 4];
    const int t = (int)threadIdx.x, tx = t % 16, ty = t / 16;
    const int n0 = (int)blockIdx.x * MNISTCU__GBN;
    float acc[4][4];
    int i, j, r, k0, kk, m0;
    /* Rows of tiles beyond gridDim.y's limit (65535) are walked by the same blocks. */
    for (m0 = (int)blockIdx.y * MNISTCU__GBM; m0 < M; m0 += (int)gridDim.y * MNISTCU__GBM) {
        for (i = 0; i < 4; ++i)
            for (j = 0; j < 4; ++j) acc[i][j] = 0.0f;
        for (k0 = 0; k0 < K; k0 += MNISTCU__GBK) {
            for (r = 0; r < 4; ++r) {
                int m = TA ? t % 64 : t / 16 + 16 * r, k = TA ? t / 64 + 4 * r : t % 16;
                int gm = m0 + m, gk = k0 + k;
                float v = 0.0f;
                if (gm < M && gk < K) v = TA ? A[(size_t)gk * lda + gm] : A[(size_t)gm * lda + gk];
                As[k][m] = v;
            }
            for (r = 0; r < 4; ++r) {
                int n = TB ? t / 16 + 16 * r : t % 64, k = TB ? t % 16 : t / 64 + 4 * r;
                int gn = n0 + n, gk = k0 + k;
                float v = 0.0f;
                if (gn < N && gk < K) v = TB ? B[(size_t)gn * ldb + gk] : B[(size_t)gk * ldb + gn];
                Bs[k][n] = v;
            }
            __syncthreads();
#pragma unroll
            for (kk = 0; kk < MNISTCU__GBK; ++kk) {
                float a[4], b[4];
#pragma unroll
                for (i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
                for (j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
                for (i = 0; i < 4; ++i)
#pragma unroll
                    for (j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
            __syncthreads();
        }
#pragma unroll
        for (i = 0; i < 4; ++i) {
            int gm = m0 + ty + 16 * i;
            if (gm >= M) continue;
#pragma unroll
            for (j = 0; j < 4; ++j) {
                int gn = n0 + tx + 16 * j;
                if (gn < N) C[(size_t)gm * ldc + gn] = FUSE ? mnistcu__act_f((mnistcu_act)act, acc[i][j] + bias[gn]) : acc[i][j];
            }
        }
    }
}

/* The small-problem product: one output per thread in 16x16 tiles. Where the
   64x64 kernel would launch only a few blocks (batch 64: 2 to 16 of them), this
   one fills the GPU: measured 504 against 220 GFLOP/s at 64x128x784 and 3531
   against 1782 at 64x1024x784 on an H100 (bench/cuda_gemm.cu, v2 and v3). Each
   output is the same fmaf chain over k from zero as in the 64x64 kernel, so the
   choice between them changes no bit of the result. */
#define MNISTCU__GT 16

template <int TA, int TB, int FUSE>
__global__ void __launch_bounds__(256) mnistcu__k_gemm16(int M, int N, int K, const float *__restrict__ A, int lda,
                                                          const float *__restrict__ B, int ldb, float *__restrict__ C,
                                                          int ldc, const float *__restrict__ bias, int act)
{
    __shared__ float As[MNISTCU__GT][MNISTCU__GT + 1]; /* [m][k] */
    __shared__ float Bs[MNISTCU__GT][MNISTCU__GT + 1]; /* [k][n] */
    const int tx = (int)threadIdx.x % MNISTCU__GT, ty = (int)threadIdx.x / MNISTCU__GT;
    const int n0 = (int)blockIdx.x * MNISTCU__GT;
    int m0, k0, kk;
    for (m0 = (int)blockIdx.y * MNISTCU__GT; m0 < M; m0 += (int)gridDim.y * MNISTCU__GT) {
        float acc = 0.0f;
        for (k0 = 0; k0 < K; k0 += MNISTCU__GT) {
            /* each thread stages one element of each tile, reading along the
               source's contiguous direction */
            int am = TA ? tx : ty, ak = TA ? ty : tx, bk = TB ? tx : ty, bn = TB ? ty : tx;
            int gm = m0 + am, gka = k0 + ak, gn = n0 + bn, gkb = k0 + bk;
            As[am][ak] = (gm < M && gka < K) ? (TA ? A[(size_t)gka * lda + gm] : A[(size_t)gm * lda + gka]) : 0.0f;
            Bs[bk][bn] = (gn < N && gkb < K) ? (TB ? B[(size_t)gn * ldb + gkb] : B[(size_t)gkb * ldb + gn]) : 0.0f;
            __syncthreads();
#pragma unroll
            for (kk = 0; kk < MNISTCU__GT; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
            __syncthreads();
        }
        if (m0 + ty < M && n0 + tx < N)
            C[(size_t)(m0 + ty) * ldc + n0 + tx] = FUSE ? mnistcu__act_f((mnistcu_act)act, acc + bias[n0 + tx]) : acc;
    }
}

/* y[B][OUT] = act(y + b) in place (after a cuBLAS product). */
__global__ void mnistcu__k_bias_act(float *y, const float *bias, size_t n, int OUT, int act)
{
    size_t e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = mnistcu__act_f((mnistcu_act)act, y[e] + bias[e % (size_t)OUT]);
}

/* dz *= act'(y), from the output y. */
__global__ void mnistcu__k_act_backward(float *dz, const float *y, size_t n, int act)
{
    size_t e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        dz[e] = mnistcu__act_backward_one((mnistcu_act)act, dz[e], y[e]);
}

/* db[j] = sum over rows of dz[B][OUT], one thread per column, rows in order (as the CPU). */
__global__ void mnistcu__k_bias_grad(const float *dz, int B, int OUT, float *db)
{
    int j = (int)(blockIdx.x * blockDim.x + threadIdx.x), i;
    float s = 0.0f;
    if (j >= OUT) return;
    for (i = 0; i < B; ++i) s += dz[(size_t)i * OUT + j];
    db[j] = s;
}

/* Softmax cross-entropy with its gradient, one thread per sample (C <= 256). */
__global__ void mnistcu__k_softmax_ce(const float *logits, const int32_t *labels, int B, int C, float grad_scale,
                                      float *grad, float *loss, int32_t *pred)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < B)
        mnistcu__softmax_ce_row(logits + (size_t)i * C, labels[i], (size_t)C, grad_scale,
                                grad ? grad + (size_t)i * C : NULL, &loss[i], &pred[i]);
}

/* One block: the step's loss sum and correct count, in a fixed-order tree. */
__global__ void mnistcu__k_step_stats(const float *loss, const int32_t *pred, const int32_t *labels, int B,
                                      double *loss_out, double *correct_out)
{
    __shared__ double sl[MNISTCU__THREADS], sc[MNISTCU__THREADS];
    int t = (int)threadIdx.x, i, stride;
    double l = 0.0, c = 0.0;
    for (i = t; i < B; i += MNISTCU__THREADS) {
        l += (double)loss[i];
        c += pred[i] == labels[i] ? 1.0 : 0.0;
    }
    sl[t] = l;
    sc[t] = c;
    __syncthreads();
    for (stride = MNISTCU__THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) {
            sl[t] += sl[t + stride];
            sc[t] += sc[t + stride];
        }
        __syncthreads();
    }
    if (t == 0) {
        *loss_out = sl[0];
        *correct_out = sc[0];
    }
}

/* SGD over the flat parameter arena (torch.optim.SGD rules, see >>cpu_ops). */
__global__ void mnistcu__k_sgd(float *w, const float *g, float *v, size_t n, float lr, float mu, int nesterov, float wd)
{
    size_t i;
    for (i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        mnistcu__sgd_one(&w[i], g[i], v ? &v[i] : NULL, lr, mu, nesterov, wd);
}

/* x[i][:] = normalise(sample idx[offset+i]), labels[i] = its label. Either u8 or f32
   is given; idx NULL means samples offset, offset+1, ... (a staged batch). */
__global__ void mnistcu__k_gather(const uint8_t *u8, const float *f32, const int32_t *src_labels, const uint32_t *idx,
                                  size_t offset, int B, int F, float scale, float shift, float *x, int32_t *labels)
{
    size_t e, n = (size_t)B * F;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / (size_t)F, j = e % (size_t)F;
        size_t s = idx ? (size_t)idx[offset + i] : offset + i;
        float raw = u8 ? (float)u8[s * F + j] : f32[s * F + j];
        x[e] = raw * scale + shift;
        if (j == 0) labels[i] = src_labels[s];
    }
}

/* Divergence check (see >>train): partial[b] = 1 when block b's share of p[n]
   holds a value that is not finite, else 0; then one block ORs the partial
   flags into *flag. A fixed grid and fixed-order trees: no atomics. */
#define MNISTCU__FINITE_BLOCKS 64

__global__ void mnistcu__k_finite_partial(const float *p, size_t n, int *partial)
{
    __shared__ int bad[MNISTCU__THREADS];
    int t = (int)threadIdx.x, b = 0, stride;
    size_t i;
    for (i = (size_t)blockIdx.x * blockDim.x + t; i < n; i += (size_t)gridDim.x * blockDim.x)
        b |= !mnistcu__finite_f(p[i]);
    bad[t] = b;
    __syncthreads();
    for (stride = MNISTCU__THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) bad[t] |= bad[t + stride];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = bad[0];
}

__global__ void mnistcu__k_finite_flag(const int *partial, int nb, int *flag)
{
    __shared__ int bad[MNISTCU__THREADS];
    int t = (int)threadIdx.x, b = 0, i, stride;
    for (i = t; i < nb; i += MNISTCU__THREADS) b |= partial[i];
    bad[t] = b;
    __syncthreads();
    for (stride = MNISTCU__THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) bad[t] |= bad[t + stride];
        __syncthreads();
    }
    if (t == 0) *flag = bad[0];
}

/* ---- context ----------------------------------------------------------------- */
static mnistcu_result mnistcu__cuda_ctx_init(mnistcu_ctx *ctx)
{
    mnistcu__cuda *cu;
    struct cudaDeviceProp prop;
    struct cudaFuncAttributes fa;
    int count = 0, want = ctx->desc.cuda_device;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return mnistcu__fail(ctx, MNISTCU_ERR_NO_DEVICE, "no CUDA GPU available (%s)",
                             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (want >= count)
        return mnistcu__fail(ctx, MNISTCU_ERR_NO_DEVICE, "cuda_device %d asked, %d GPU(s) present", want, count);
    if ((e = cudaSetDevice(want)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, want)) != cudaSuccess) {
        (void)cudaGetLastError();
        return mnistcu__fail(ctx, MNISTCU_ERR_NO_DEVICE, "GPU %d: %s", want, cudaGetErrorString(e));
    }
    /* Is there code for this GPU in the binary? */
    e = cudaFuncGetAttributes(&fa, mnistcu__k_sgd);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mnistcu__fail(ctx, MNISTCU_ERR_NO_DEVICE,
                             "GPU %s (sm_%d%d) is not supported by this build (%s): rebuild with -arch=sm_%d%d",
                             prop.name, prop.major, prop.minor, cudaGetErrorString(e), prop.major, prop.minor);
    }
    cu = (mnistcu__cuda *)mnistcu__calloc(ctx, sizeof *cu);
    if (!cu) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory");
    cu->device = want;
    ctx->cuda = cu;
    if ((e = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&cu->copy_stream, cudaStreamNonBlocking)) != cudaSuccess) {
        mnistcu_result r = mnistcu__cuda_check(ctx, e, "creating CUDA streams");
        mnistcu__cuda_ctx_free(ctx);
        return r;
    }
#ifdef MNISTCU_CUBLAS
    cu->use_cublas = ctx->desc.gemm != MNISTCU_GEMM_OWN;
    if (cu->use_cublas) {
        cublasStatus_t s = cublasCreate(&cu->blas);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(cu->blas, cu->stream);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(cu->blas, CUBLAS_DEFAULT_MATH); /* FP32, no TF32 */
        if (s != CUBLAS_STATUS_SUCCESS) {
            mnistcu__cuda_ctx_free(ctx);
            return mnistcu__fail(ctx, MNISTCU_ERR_CUBLAS, "cuBLAS initialisation failed: %s", cublasGetStatusString(s));
        }
    }
#endif
    ctx->device = MNISTCU_DEVICE_CUDA;
    snprintf(ctx->device_name, sizeof ctx->device_name, "%.255s (sm_%d%d%s)", prop.name, prop.major, prop.minor,
             cu->use_cublas ? ", cuBLAS" : "");
    return MNISTCU_OK;
}

static void mnistcu__cuda_ctx_free(mnistcu_ctx *ctx)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    if (!cu) return;
#ifdef MNISTCU_CUBLAS
    if (cu->blas) cublasDestroy(cu->blas);
#endif
    if (cu->stream) cudaStreamDestroy(cu->stream);
    if (cu->copy_stream) cudaStreamDestroy(cu->copy_stream);
    mnistcu__free(ctx, cu);
    ctx->cuda = NULL;
}

/* ---- datasets ------------------------------------------------------------------ */
static void mnistcu__cuda_dataset_free(mnistcu_dataset *ds)
{
    mnistcu__cuda_dataset *dc = (mnistcu__cuda_dataset *)ds->device_copy;
    if (!dc) return;
    mnistcu__cuda_free(ds->ctx, dc->u8);
    mnistcu__cuda_free(ds->ctx, dc->f32);
    mnistcu__cuda_free(ds->ctx, dc->labels);
    mnistcu__free(ds->ctx, dc);
    ds->device_copy = NULL;
}

/* Uploads the dataset once (as stored: uint8 stays uint8). */
static mnistcu_result mnistcu__cuda_dataset_upload(mnistcu_dataset *ds)
{
    mnistcu_ctx *ctx = ds->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_dataset *dc;
    size_t n = ds->count * ds->features, bytes = ds->u8 ? n : n * sizeof(float);
    mnistcu_result r;
    cudaError_t e;
    if (ds->device_copy) return MNISTCU_OK;
    dc = (mnistcu__cuda_dataset *)mnistcu__calloc(ctx, sizeof *dc);
    if (!dc) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory");
    ds->device_copy = dc;
    if ((r = mnistcu__cuda_malloc(ctx, ds->u8 ? (void **)&dc->u8 : (void **)&dc->f32, bytes, "uploading a dataset")) ||
        (r = mnistcu__cuda_malloc(ctx, (void **)&dc->labels, ds->count * sizeof(int32_t), "uploading labels"))) {
        mnistcu__cuda_dataset_free(ds);
        return r;
    }
    e = cudaMemcpyAsync(ds->u8 ? (void *)dc->u8 : (void *)dc->f32, ds->u8 ? (const void *)ds->u8 : (const void *)ds->f32,
                        bytes, cudaMemcpyHostToDevice, cu->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dc->labels, ds->labels, ds->count * sizeof(int32_t), cudaMemcpyHostToDevice, cu->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream);
    if (e != cudaSuccess) {
        r = mnistcu__cuda_check(ctx, e, "uploading a dataset");
        mnistcu__cuda_dataset_free(ds);
        return r;
    }
    return MNISTCU_OK;
}

/* Resident unless the caller asks for streaming, or the dataset does not fit. */
static int mnistcu__cuda_wants_stream(const mnistcu_dataset *ds)
{
    size_t free_b = 0, total_b = 0, bytes = ds->count * ds->features * (ds->u8 ? 1 : sizeof(float));
    if (ds->device_copy) return 0;
    if (ds->ctx->desc.data_mode == MNISTCU_DATA_STREAM) return 1;
    if (ds->ctx->desc.data_mode == MNISTCU_DATA_RESIDENT) return 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return bytes > free_b / 2; /* leave room for models and other work */
}

/* ---- models -------------------------------------------------------------------- */
static mnistcu_result mnistcu__cuda_model_alloc(mnistcu_model *m)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu_result r;
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)mnistcu__calloc(ctx, sizeof *cm);
    size_t bytes = m->num_params * sizeof(float);
    if (!cm) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory");
    m->cuda = cm;
    if ((r = mnistcu__cuda_alive(ctx)) || (r = mnistcu__cuda_malloc(ctx, (void **)&m->params, bytes, "parameters")) ||
        (r = mnistcu__cuda_malloc(ctx, (void **)&m->grads, bytes, "gradients")))
        return r; /* the caller destroys the model, which frees what was made */
    return mnistcu__cuda_check(ctx, cudaMemsetAsync(m->grads, 0, bytes, mnistcu__cu(ctx)->stream), "zeroing gradients");
}

static void mnistcu__cuda_stream_free(mnistcu_model *m)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    int s;
    for (s = 0; s < MNISTCU__STREAM_SLOTS; ++s) {
        if (cm->pinned[s]) cudaFreeHost(cm->pinned[s]);
        mnistcu__cuda_free(m->ctx, cm->staged[s]);
        if (cm->copied[s]) cudaEventDestroy(cm->copied[s]);
        if (cm->consumed[s]) cudaEventDestroy(cm->consumed[s]);
        cm->pinned[s] = cm->staged[s] = NULL;
        cm->copied[s] = cm->consumed[s] = NULL;
        cm->slot_used[s] = 0;
    }
    cm->slot_bytes = 0;
}

static void mnistcu__cuda_model_free(mnistcu_model *m)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    mnistcu_ctx *ctx = m->ctx;
    if (mnistcu__cu(ctx) && mnistcu__cu(ctx)->sticky == cudaSuccess) cudaStreamSynchronize(mnistcu__cu(ctx)->stream);
    mnistcu__cuda_free(ctx, m->params);
    mnistcu__cuda_free(ctx, m->grads);
    mnistcu__cuda_free(ctx, m->velocity);
    mnistcu__cuda_free(ctx, m->ws);
    mnistcu__cuda_free(ctx, m->iws);
    if (cm) {
        mnistcu__cuda_free(ctx, cm->idx);
        mnistcu__cuda_free(ctx, cm->stats);
        if (cm->host_stats) cudaFreeHost(cm->host_stats);
        mnistcu__cuda_stream_free(m);
        mnistcu__free(ctx, cm);
    }
    m->cuda = NULL;
}

static mnistcu_result mnistcu__cuda_reserve(mnistcu_model *m, size_t B)
{
    mnistcu_ctx *ctx = m->ctx;
    size_t floats = mnistcu__model_ws_floats(m, B), bytes;
    float *ws = NULL;
    int32_t *iws = NULL;
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(ctx))) return r;
    if (!floats || !mnistcu__mul(floats, sizeof(float), &bytes))
        return mnistcu__fail(ctx, MNISTCU_ERR_OVERFLOW, "workspace for batch %lu overflows", (unsigned long)B);
    if ((r = mnistcu__cuda_malloc(ctx, (void **)&ws, bytes, "batch workspace")) ||
        (r = mnistcu__cuda_malloc(ctx, (void **)&iws, 2 * B * sizeof(int32_t), "batch workspace"))) {
        mnistcu__cuda_free(ctx, ws);
        return r;
    }
    cudaStreamSynchronize(mnistcu__cu(ctx)->stream); /* the old workspace may still be in use */
    mnistcu__cuda_free(ctx, m->ws);
    mnistcu__cuda_free(ctx, m->iws);
    m->ws = ws;
    mnistcu__model_layout_ws(m, ws, iws, B);
    m->ws_batch = B;
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__cuda_copy(mnistcu_model *m, void *dst, const void *src, size_t bytes, int to_device)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    cudaError_t e;
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(ctx))) return r;
    e = cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, cu->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream);
    return mnistcu__cuda_check(ctx, e, to_device ? "copying to the GPU" : "copying from the GPU");
}

static mnistcu_result mnistcu__cuda_ensure_velocity(mnistcu_model *m)
{
    mnistcu_result r = mnistcu__cuda_malloc(m->ctx, (void **)&m->velocity, m->num_params * sizeof(float), "momentum");
    if (r) return r;
    return mnistcu__cuda_check(m->ctx, cudaMemsetAsync(m->velocity, 0, m->num_params * sizeof(float),
                                                       mnistcu__cu(m->ctx)->stream), "zeroing momentum");
}

/* ---- the matrix product: our kernel or cuBLAS ------------------------------------ */
static mnistcu_result mnistcu__cuda_gemm(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K, const float *A,
                                         size_t lda, const float *B, size_t ldb, float *C, size_t ldc,
                                         const float *bias, int act)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    if (M == 0 || N == 0) return MNISTCU_OK;
#ifdef MNISTCU_CUBLAS
    if (cu->use_cublas) {
        /* cuBLAS is column-major: a row-major C = op(A) op(B) is, read column-major,
           C^T = op(B)^T op(A)^T, so the operands swap places and keep their flags. */
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t s = cublasSgemm(cu->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N,
                                       (int)M, (int)K, &one, B, (int)ldb, A, (int)lda, &zero, C, (int)ldc);
        if (s != CUBLAS_STATUS_SUCCESS)
            return mnistcu__fail(ctx, MNISTCU_ERR_CUBLAS, "cublasSgemm %lux%lux%lu: %s", (unsigned long)M,
                                 (unsigned long)N, (unsigned long)K, cublasGetStatusString(s));
        if (bias) {
            size_t n = M * N;
            mnistcu__k_bias_act<<<mnistcu__blocks(n), MNISTCU__THREADS, 0, cu->stream>>>(C, bias, n, (int)N, act);
            MNISTCU__LAUNCHED(ctx, "bias_act");
        }
        return MNISTCU_OK;
    }
#endif
    {
        /* Few 64x64 tiles (small batches): the 16x16 kernel keeps more of the GPU busy. */
        size_t tiles64 = ((M + MNISTCU__GBM - 1) / MNISTCU__GBM) * ((N + MNISTCU__GBN - 1) / MNISTCU__GBN);
        int small = tiles64 < 128;
        size_t tm = small ? MNISTCU__GT : MNISTCU__GBM, tn = small ? MNISTCU__GT : MNISTCU__GBN;
        size_t mtiles = (M + tm - 1) / tm;
        dim3 grid((unsigned)((N + tn - 1) / tn), (unsigned)(mtiles < 65535 ? mtiles : 65535));
        int m_ = (int)M, n_ = (int)N, k_ = (int)K, la = (int)lda, lb = (int)ldb, lc = (int)ldc;
        cudaStream_t st = cu->stream;
        if (bias && (ta || !tb)) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "fused gemm is only NT");
#define MNISTCU__GEMM_LAUNCH(TA_, TB_, FUSE_)                                                                   \
    do {                                                                                                        \
        if (small)                                                                                              \
            mnistcu__k_gemm16<TA_, TB_, FUSE_><<<grid, 256, 0, st>>>(m_, n_, k_, A, la, B, lb, C, lc, bias, act); \
        else                                                                                                    \
            mnistcu__k_gemm<TA_, TB_, FUSE_><<<grid, 256, 0, st>>>(m_, n_, k_, A, la, B, lb, C, lc, bias, act);   \
    } while (0)
        if (bias) MNISTCU__GEMM_LAUNCH(0, 1, 1);
        else if (!ta && tb) MNISTCU__GEMM_LAUNCH(0, 1, 0);
        else if (ta && !tb) MNISTCU__GEMM_LAUNCH(1, 0, 0);
        else if (!ta && !tb) MNISTCU__GEMM_LAUNCH(0, 0, 0);
        else MNISTCU__GEMM_LAUNCH(1, 1, 0);
#undef MNISTCU__GEMM_LAUNCH
        MNISTCU__LAUNCHED(ctx, "gemm");
    }
    return MNISTCU_OK;
}

/* ---- the steps of training, mirroring the CPU ones ------------------------------ */
static mnistcu_result mnistcu__cuda_forward(mnistcu_model *m, size_t B)
{
    mnistcu_result r;
    int l;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    for (l = 0; l < m->num_layers; ++l) {
        const mnistcu__layer *L = &m->layers[l];
        if ((r = mnistcu__cuda_gemm(m->ctx, 0, 1, B, (size_t)L->out, (size_t)L->in, m->act[l], (size_t)L->in,
                                    m->params + L->w, (size_t)L->in, m->act[l + 1], (size_t)L->out, m->params + L->b,
                                    (int)L->act)))
            return r;
    }
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__cuda_loss(mnistcu_model *m, size_t B, int with_grad)
{
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    mnistcu__k_softmax_ce<<<mnistcu__blocks(B), MNISTCU__THREADS, 0, mnistcu__cu(m->ctx)->stream>>>(
        m->act[m->num_layers], m->labels, (int)B, m->sizes[m->num_layers], 1.0f / (float)B,
        with_grad ? m->dbuf[0] : NULL, m->sample_loss, m->pred);
    MNISTCU__LAUNCHED(m->ctx, "softmax_ce");
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__cuda_backward(mnistcu_model *m, size_t B)
{
    mnistcu_ctx *ctx = m->ctx;
    cudaStream_t st = mnistcu__cu(ctx)->stream;
    float *cur = m->dbuf[0];
    mnistcu_result r;
    int l;
    if ((r = mnistcu__cuda_alive(ctx))) return r;
    for (l = m->num_layers - 1; l >= 0; --l) {
        const mnistcu__layer *L = &m->layers[l];
        size_t in = (size_t)L->in, out = (size_t)L->out;
        if (L->act != MNISTCU_ACT_IDENTITY) {
            mnistcu__k_act_backward<<<mnistcu__blocks(B * out), MNISTCU__THREADS, 0, st>>>(cur, m->act[l + 1], B * out,
                                                                                           (int)L->act);
            MNISTCU__LAUNCHED(ctx, "act_backward");
        }
        if ((r = mnistcu__cuda_gemm(ctx, 1, 0, out, in, B, cur, out, m->act[l], in, m->grads + L->w, in, NULL, 0)))
            return r;
        mnistcu__k_bias_grad<<<mnistcu__blocks(out), MNISTCU__THREADS, 0, st>>>(cur, (int)B, (int)out, m->grads + L->b);
        MNISTCU__LAUNCHED(ctx, "bias_grad");
        if (l > 0) {
            float *next = cur == m->dbuf[0] ? m->dbuf[1] : m->dbuf[0];
            if ((r = mnistcu__cuda_gemm(ctx, 0, 0, B, in, out, cur, out, m->params + L->w, in, next, in, NULL, 0)))
                return r;
            cur = next;
        }
    }
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__cuda_update(mnistcu_model *m, const mnistcu_optim_desc *o)
{
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    mnistcu__k_sgd<<<mnistcu__blocks(m->num_params), MNISTCU__THREADS, 0, mnistcu__cu(m->ctx)->stream>>>(
        m->params, m->grads, o->momentum > 0.0f ? m->velocity : NULL, m->num_params, o->learning_rate, o->momentum,
        o->nesterov, o->weight_decay);
    MNISTCU__LAUNCHED(m->ctx, "sgd");
    return MNISTCU_OK;
}

/* ---- epochs: sample order, batches (resident or streamed), per-step statistics --- */
static mnistcu_result mnistcu__cuda_epoch_begin(mnistcu_model *m, const mnistcu_dataset *ds, const uint32_t *idx,
                                                size_t n, size_t steps)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(ctx))) return r;
    if (steps > cm->stats_cap) {
        double *d = NULL, *h = NULL;
        cudaError_t e;
        if ((r = mnistcu__cuda_malloc(ctx, (void **)&d, 2 * steps * sizeof(double), "step statistics"))) return r;
        e = cudaMallocHost((void **)&h, 2 * steps * sizeof(double));
        if (e != cudaSuccess) {
            mnistcu__cuda_free(ctx, d);
            return mnistcu__cuda_check(ctx, e, "pinned step statistics");
        }
        cudaStreamSynchronize(cu->stream);
        mnistcu__cuda_free(ctx, cm->stats);
        if (cm->host_stats) cudaFreeHost(cm->host_stats);
        cm->stats = d;
        cm->host_stats = h;
        cm->stats_cap = steps;
    }
    cm->ds = ds;
    cm->host_idx = idx;
    cm->streaming = mnistcu__cuda_wants_stream(ds);
    if (!cm->streaming) {
        if ((r = mnistcu__cuda_dataset_upload((mnistcu_dataset *)ds))) {
            if (r != MNISTCU_ERR_OUT_OF_MEMORY || ctx->desc.data_mode == MNISTCU_DATA_RESIDENT) return r;
            cm->streaming = 1; /* did not fit after all: stream it */
            mnistcu__log(ctx, MNISTCU_LOG_WARN, "dataset does not fit on the GPU: streaming batches from the host");
        }
    }
    if (!cm->streaming) {
        if (n > cm->idx_cap) {
            uint32_t *d = NULL;
            if ((r = mnistcu__cuda_malloc(ctx, (void **)&d, n * sizeof(uint32_t), "sample order"))) return r;
            cudaStreamSynchronize(cu->stream);
            mnistcu__cuda_free(ctx, cm->idx);
            cm->idx = d;
            cm->idx_cap = n;
        }
        /* The host's order, so CPU and GPU train on the same batches. On the
           compute stream, so no gather still queued reads it while it changes
           and none that follows reads it early; synchronous, because the host
           reshuffles idx for the next epoch. */
        {
            cudaError_t e = cudaMemcpyAsync(cm->idx, idx, n * sizeof(uint32_t), cudaMemcpyHostToDevice, cu->stream);
            if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream);
            return mnistcu__cuda_check(ctx, e, "uploading the sample order");
        }
    }
    return MNISTCU_OK;
}

/* Streaming mode: two slots of (pinned host batch, device copy). For each batch,
   the host waits until the slot's previous batch was consumed (event), fills the
   pinned buffer, the copy stream uploads it and records `copied`, the compute
   stream waits for `copied` before the gather kernel reads the slot and records
   `consumed` after it. The host runs at most two batches ahead. */
static mnistcu_result mnistcu__cuda_stream_reserve(mnistcu_model *m, size_t B)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    const mnistcu_dataset *ds = cm->ds;
    size_t esize = ds->u8 ? 1 : sizeof(float), bytes = B * ds->features * esize + B * sizeof(int32_t);
    mnistcu_result r;
    int s;
    bytes += 16; /* labels follow the features, 16-byte aligned */
    /* The slots belong to the model and serve every dataset it meets: size them
       by bytes, since a float dataset needs four times a uint8 one's. */
    if (cm->slot_bytes >= bytes) return MNISTCU_OK;
    cudaStreamSynchronize(mnistcu__cu(m->ctx)->stream);
    mnistcu__cuda_stream_free(m);
    for (s = 0; s < MNISTCU__STREAM_SLOTS; ++s) {
        cudaError_t e = cudaMallocHost(&cm->pinned[s], bytes);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&cm->copied[s], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&cm->consumed[s], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            r = mnistcu__cuda_check(m->ctx, e, "streaming buffers");
            mnistcu__cuda_stream_free(m);
            return r;
        }
        if ((r = mnistcu__cuda_malloc(m->ctx, &cm->staged[s], bytes, "streaming buffers"))) {
            mnistcu__cuda_stream_free(m);
            return r;
        }
    }
    cm->slot_bytes = bytes;
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__cuda_gather(mnistcu_model *m, const mnistcu_dataset *ds, size_t offset, size_t B,
                                           float scale, float shift)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    size_t F = ds->features, n = B * F;
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(ctx))) return r;
    if (!cm->streaming) {
        const mnistcu__cuda_dataset *dc = (const mnistcu__cuda_dataset *)ds->device_copy;
        mnistcu__k_gather<<<mnistcu__blocks(n), MNISTCU__THREADS, 0, cu->stream>>>(
            dc->u8, dc->f32, dc->labels, cm->idx, offset, (int)B, (int)F, scale, shift, m->act[0], m->labels);
        MNISTCU__LAUNCHED(ctx, "gather");
        return MNISTCU_OK;
    } else {
        int s = (int)(cm->step_counter++ % MNISTCU__STREAM_SLOTS);
        size_t esize = ds->u8 ? 1 : sizeof(float), fbytes = n * esize, lab_off = (fbytes + 15) & ~(size_t)15, i;
        unsigned char *host;
        cudaError_t e = cudaSuccess;
        if ((r = mnistcu__cuda_stream_reserve(m, m->ws_batch))) return r;
        host = (unsigned char *)cm->pinned[s];
        if (cm->slot_used[s]) e = cudaEventSynchronize(cm->consumed[s]); /* the GPU is done with this slot */
        if (e != cudaSuccess) return mnistcu__cuda_check(ctx, e, "waiting for a streaming slot");
        for (i = 0; i < B; ++i) {
            size_t smp = cm->host_idx[offset + i];
            memcpy(host + i * F * esize, ds->u8 ? (const void *)(ds->u8 + smp * F) : (const void *)(ds->f32 + smp * F),
                   F * esize);
            memcpy(host + lab_off + i * sizeof(int32_t), &ds->labels[smp], sizeof(int32_t));
        }
        e = cudaMemcpyAsync(cm->staged[s], host, lab_off + B * sizeof(int32_t), cudaMemcpyHostToDevice,
                            cu->copy_stream);
        if (e == cudaSuccess) e = cudaEventRecord(cm->copied[s], cu->copy_stream);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(cu->stream, cm->copied[s], 0);
        if (e != cudaSuccess) return mnistcu__cuda_check(ctx, e, "streaming a batch");
        {
            const unsigned char *dev = (const unsigned char *)cm->staged[s];
            mnistcu__k_gather<<<mnistcu__blocks(n), MNISTCU__THREADS, 0, cu->stream>>>(
                ds->u8 ? dev : NULL, ds->u8 ? NULL : (const float *)dev, (const int32_t *)(dev + lab_off), NULL, 0,
                (int)B, (int)F, scale, shift, m->act[0], m->labels);
            MNISTCU__LAUNCHED(ctx, "gather (streamed)");
        }
        cm->slot_used[s] = 1;
        return mnistcu__cuda_check(ctx, cudaEventRecord(cm->consumed[s], cu->stream), "streaming a batch");
    }
}

static mnistcu_result mnistcu__cuda_step_stats(mnistcu_model *m, size_t B, size_t step)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    mnistcu__k_step_stats<<<1, MNISTCU__THREADS, 0, mnistcu__cu(m->ctx)->stream>>>(
        m->sample_loss, m->pred, m->labels, (int)B, cm->stats + step, cm->stats + cm->stats_cap + step);
    MNISTCU__LAUNCHED(m->ctx, "step_stats");
    return MNISTCU_OK;
}

/* The only host synchronisation of an epoch: where a report is due. */
static mnistcu_result mnistcu__cuda_read_stats(mnistcu_model *m, size_t from, size_t to, double *loss, int64_t *correct)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    cudaError_t e;
    mnistcu_result r;
    size_t i;
    if ((r = mnistcu__cuda_alive(ctx))) return r;
    if (to <= from) return MNISTCU_OK;
    e = cudaMemcpyAsync(cm->host_stats + from, cm->stats + from, (to - from) * sizeof(double), cudaMemcpyDeviceToHost,
                        cu->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(cm->host_stats + cm->stats_cap + from, cm->stats + cm->stats_cap + from,
                            (to - from) * sizeof(double), cudaMemcpyDeviceToHost, cu->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream);
    if (e != cudaSuccess) return mnistcu__cuda_check(ctx, e, "reading training statistics");
    for (i = from; i < to; ++i) {
        *loss += cm->host_stats[i];
        *correct += (int64_t)cm->host_stats[cm->stats_cap + i];
    }
    return MNISTCU_OK;
}

/* Loss of one step as read by the last mnistcu__cuda_read_stats. */
static double mnistcu__cuda_step_loss(const mnistcu_model *m, size_t step)
{
    const mnistcu__cuda_model *cm = (const mnistcu__cuda_model *)m->cuda;
    return cm->host_stats[step];
}

/* ---- divergence check (see >>train) ---------------------------------------------- */

/* n floats on the device, in stream order: dst = src, or 0 when src is NULL. */
static mnistcu_result mnistcu__cuda_device_copy(mnistcu_model *m, float *dst, const float *src, size_t n, int sync)
{
    cudaStream_t st = mnistcu__cu(m->ctx)->stream;
    cudaError_t e;
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    e = src ? cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, st)
            : cudaMemsetAsync(dst, 0, n * sizeof(float), st);
    if (e == cudaSuccess && sync) e = cudaStreamSynchronize(st);
    return mnistcu__cuda_check(m->ctx, e, "divergence check: copying the weights");
}

static mnistcu_result mnistcu__cuda_finite_begin(mnistcu_model *m, mnistcu__finite_guard *g)
{
    cudaError_t e;
    mnistcu_result r;
    if ((r = mnistcu__cuda_malloc(m->ctx, (void **)&g->dev_flags, (MNISTCU__FINITE_BLOCKS + 1) * sizeof(int),
                                  "divergence check flags")))
        return r;
    e = cudaMallocHost((void **)&g->host_flag, sizeof(int));
    if (e != cudaSuccess) {
        g->host_flag = NULL;
        return mnistcu__cuda_check(m->ctx, e, "divergence check: pinned flag");
    }
    *g->host_flag = 0;
    return MNISTCU_OK;
}

static void mnistcu__cuda_finite_end(mnistcu_model *m, mnistcu__finite_guard *g)
{
    mnistcu_ctx *ctx = m->ctx;
    /* the flag's copy may still be queued */
    if (g->host_flag && mnistcu__cu(ctx)->sticky == cudaSuccess) cudaStreamSynchronize(mnistcu__cu(ctx)->stream);
    mnistcu__cuda_free(ctx, g->dev_flags);
    if (g->host_flag) cudaFreeHost(g->host_flag);
    g->dev_flags = NULL;
    g->host_flag = NULL;
}

/* Queues the check of every parameter and the copy of its flag to the host;
   the synchronisation that reads the statistics next brings it back. */
static mnistcu_result mnistcu__cuda_finite_queue(mnistcu_model *m, mnistcu__finite_guard *g)
{
    cudaStream_t st = mnistcu__cu(m->ctx)->stream;
    int *flag = g->dev_flags + MNISTCU__FINITE_BLOCKS;
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    mnistcu__k_finite_partial<<<MNISTCU__FINITE_BLOCKS, MNISTCU__THREADS, 0, st>>>(m->params, m->num_params,
                                                                                   g->dev_flags);
    MNISTCU__LAUNCHED(m->ctx, "finite_partial");
    mnistcu__k_finite_flag<<<1, MNISTCU__THREADS, 0, st>>>(g->dev_flags, MNISTCU__FINITE_BLOCKS, flag);
    MNISTCU__LAUNCHED(m->ctx, "finite_flag");
    return mnistcu__cuda_check(m->ctx, cudaMemcpyAsync(g->host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost, st),
                               "divergence check: reading the flag");
}

/* The flag queued last. The stream is already idle here (the statistics were
   just read), so the synchronisation only makes that certain. */
static mnistcu_result mnistcu__cuda_finite_flag(mnistcu_model *m, mnistcu__finite_guard *g, int *all_finite)
{
    mnistcu_result r = mnistcu__cuda_check(m->ctx, cudaStreamSynchronize(mnistcu__cu(m->ctx)->stream),
                                           "divergence check: reading the flag");
    *all_finite = r == MNISTCU_OK && *g->host_flag == 0;
    return r;
}
#endif /* __CUDACC__ */
#endif /* MNISTCU__IMPLEMENTED */
#endif /* MNISTCU_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
This software is available under 2 licenses -- choose whichever you prefer.
------------------------------------------------------------------------------
ALTERNATIVE A - MIT License
Copyright (c) 2026 the mnistcu authors
Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:
The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
ALTERNATIVE B - Public Domain (www.unlicense.org)
This is free and unencumbered software released into the public domain.
Anyone is free to copy, modify, publish, use, compile, sell, or distribute this
software, either in source code form or as a compiled binary, for any purpose,
commercial or non-commercial, and by any means.
In jurisdictions that recognize copyright laws, the author or authors of this
software dedicate any and all copyright interest in the software to the public
domain. We make this dedication for the benefit of the public at large and to
the detriment of our heirs and successors. We intend this dedication to be an
overt act of relinquishment in perpetuation of all present and future rights to
this software under copyright law.
------------------------------------------------------------------------------
*/
