/* mnistcu.h - v0.3.0 - train neural networks on MNIST-style data, on the CPU or a CUDA GPU.
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
                  memory; mnistcu_dataset_create() wraps your own arrays (with
                  class labels), mnistcu_dataset_create_targets() with float
                  target vectors (regression, multi-label);
                  mnistcu_dataset_split() carves a validation set.
     3. Model     mnistcu_model_create_spec(ctx, "lenet5", &net) (a preset or a
                  spec string: MODELS below), mnistcu_model_create_mlp(ctx,
                  "784-256-128-10", &net), or mnistcu_model_create() with a desc.
     4. Train     mnistcu_train(net, train, &train_desc, &result): epochs, batch,
                  an optimizer (SGD, Adam, AdamW, RMSprop, Adagrad, with an L2
                  penalty and gradient clipping), a learning-rate schedule
                  (step, multi-step, exponential, cosine, one-cycle, plateau,
                  warm-up), augmentation (rotation, scale, shift, elastic),
                  shuffling, validation, early stopping, a JSON-lines log, a
                  progress callback that can stop. The loss is the model's
                  (mnistcu_model_desc.loss: cross-entropy with label smoothing,
                  MSE, BCE on logits, multi-class hinge).
     5. Use       mnistcu_evaluate() (loss, accuracy, confusion matrix),
                  mnistcu_predict() / mnistcu_predict_u8() for your own images,
                  mnistcu_model_get_params() for the weights.

   MODELS AND SPEC STRINGS
     A model is a sequence of layers, like torch.nn.Sequential, described by an
     array of mnistcu_layer_desc (zero means default) or by a spec string:
       mnistcu_model_create_spec(ctx, "1x28x28 conv5x5x6 relu maxpool2 conv5x5x16"
           " relu maxpool2 flatten dense120 relu dense84 relu dense10", &net);
     The first token is the shape of one sample, CxHxW (or N for flat data, the
     same as 1x1xN); then one token per layer, separated by spaces:
       denseN                  fully connected, N outputs (input must be flat)
       convKHxKWxN             2-D convolution, N output channels
       maxpoolK, avgpoolK      pooling over KxK (or maxpoolKHxKW) windows
       batchnorm               over channels (BatchNorm2d), or features when flat (1d)
       dropout, dropoutP       inverted dropout, P the probability of zeroing (0.5)
       flatten                 [C][H][W] to [C*H*W]
       relu sigmoid tanh softmax leaky_relu leaky_reluS   (S: negative slope, 0.01)
     Options follow a layer after colons: conv3x3x32:s=2:p=1:bias=0 (stride,
     zero padding, no bias), dense10:init=xavier (torch, he, he_normal, xavier,
     xavier_normal), maxpool3:s=2 (stride; default the kernel size),
     batchnorm:eps=0.001:momentum=0.01. Tokens are case-sensitive. Presets:
       lenet5       1x28x28 conv5x5x6 relu maxpool2 conv5x5x16 relu maxpool2
                    flatten dense120 relu dense84 relu dense10  (44,426 parameters)
       fashion-cnn  1x28x28 conv3x3x64 maxpool2 relu conv3x3x128 maxpool2 relu
                    flatten dense256 relu dense10  (896,522 parameters)
     and "784-128-10" is the MLP of mnistcu_model_create_mlp. Shapes are checked
     when the model is made: an impossible one is MNISTCU_ERR_SHAPE naming the
     layer. Parameters and buffers carry the names torch.nn.Sequential gives
     them ("0.weight", "4.running_mean"), so state_dicts move across unchanged.
     Dropout's masks come from Philox4x32-10 keyed by the context's seed and
     counted by (element, layer, step): the CPU and the GPU draw the same mask.

   MODEL FILES
     mnistcu_model_save / mnistcu_model_load (safetensors, PyTorch's names),
     checkpoints with bit-exact resume (mnistcu_train_desc.checkpoint_path,
     resume_from), mnistcu_model_export_onnx, and mnistcu_image_load for PNG
     and PGM files: see >>safetensors, >>checkpoint, >>onnx and >>image.

   WHAT IT DOES NOT DO (YET)
     No multi-GPU. No half-precision storage: weights, gradients and optimizer
     state are FP32 always (mnistcu_ctx_desc.precision only changes how the
     GPU's matrix products multiply). The fused training step covers
     one-hidden-layer MLPs (not those of at most 16 hidden units over 32
     inputs or more) and, opt-in, LeNet-5's shape; other models replay each
     step from a CUDA graph.

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
     MNISTCU_CUDNN             nvcc builds: make cuDNN 9 available for convolution,
                               pooling and batch norm, and the default (link with
                               -lcudnn); mnistcu_ctx_desc.cnn chooses per context
     MNISTCU_DEBUG_SYNC        nvcc builds: synchronise after every launch so an
                               error names the kernel that caused it
     MNISTCU_NO_PDL            nvcc builds: launch kernels plainly, without
                               programmatic dependent launch (>>cuda_pdl;
                               implied before CUDA 12.3)

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
     (and optimizer state) seen finite at a check whose loss, on the batch after
     them, was finite too: those of the last check that passed, or of the one
     before when the very next step failed; the weights it started with if
     nothing better exists. The result's diverged_epoch and diverged_step say
     where. On the GPU the check costs no extra synchronisation (a flag
     computed on the device is read with the statistics). Its two copies of
     the weights (and of the optimizer state) stay with the model, on its
     device, from one mnistcu_train call to the next, and go with it
     (mnistcu_model_destroy, or a training with the check off).
     mnistcu_train_desc.no_divergence_check turns it off for those who want NaN
     to propagate; with it on, a model whose weights are already not finite is
     refused (MNISTCU_ERR_INVALID_ARGUMENT).

   CPU vs CUDA
     The CPU backend is plain C99, float32, with cache-blocked matrix products
     and optional OpenMP (-fopenmp); every CUDA kernel is tested against it.
     Results are deterministic: the same seed gives bitwise-identical weights on
     the same device, for any thread count. CPU and GPU agree to float rounding,
     not bitwise (with ReLU, a unit whose input rounds to opposite sides of zero
     on the two devices can make training runs drift further apart); random
     draws are bitwise the same on both: dropout's masks and augmentation's
     warped images (computed in integer fixed point). On the GPU
     convolutions run as im2col + our matrix product, or, for square 3x3 and 5x5
     kernels over at most 16 input channels, as direct kernels; weight gradients
     are fixed-order sums, never float atomics (where a product is split, an
     integer ticket only picks which block adds the parts, in their fixed
     order). Dropout draws the same masks on both.

   LIMITS
     At most MNISTCU_MAX_MODEL_LAYERS layers of every kind (MNISTCU_MAX_LAYERS
     dense layers through the MLP desc), widths up to 2^24, at most
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
#define MNISTCU_VERSION_MINOR 3
#define MNISTCU_VERSION_PATCH 0
#define MNISTCU_VERSION_STRING "0.3.0"

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
    X(ERR_CUDNN,                   "cuDNN error") \
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
    X(ERR_DIVERGED,                "training diverged: the loss or a weight is not finite") \
    X(ERR_ST_HEADER_SIZE,          "safetensors: header length beyond the file or the cap") \
    X(ERR_ST_JSON,                 "safetensors: header is not valid JSON of the format") \
    X(ERR_ST_DTYPE,                "safetensors: unknown dtype, or not the one a tensor needs") \
    X(ERR_ST_SHAPE,                "safetensors: shape overflows, or disagrees with its bytes or the model") \
    X(ERR_ST_OFFSETS,              "safetensors: data offsets overlap, leave a gap or run past the data") \
    X(ERR_ST_METADATA,             "safetensors: metadata missing or invalid for a mnistcu file") \
    X(ERR_ST_TENSORS,              "safetensors: a tensor the model needs is missing, or an unknown one is present") \
    X(ERR_IMAGE_SIGNATURE,         "image: neither a PNG nor a PGM file") \
    X(ERR_IMAGE_TOO_LARGE,         "image: more pixels than MNISTCU_IMAGE_MAX_PIXELS") \
    X(ERR_PNG_CRC,                 "PNG: a chunk's CRC does not match") \
    X(ERR_PNG_IHDR,                "PNG: invalid IHDR (size, depth, colour type, methods)") \
    X(ERR_PNG_TRUNCATED,           "PNG: the file ends inside a chunk") \
    X(ERR_PNG_ZLIB,                "PNG: invalid zlib stream (header, deflate data, Adler-32)") \
    X(ERR_PNG_SIZE,                "PNG: the image data is shorter or longer than the image needs") \
    X(ERR_PNG_FILTER,              "PNG: unknown row filter type") \
    X(ERR_PNG_PALETTE,             "PNG: palette missing, malformed, or an index beyond it") \
    X(ERR_PNG_ORDER,               "PNG: chunks out of order, missing or unknown critical chunk") \
    X(ERR_PGM,                     "PGM: malformed header or samples")

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

typedef enum mnistcu_cnn {
    MNISTCU_CNN_DEFAULT = 0, /* cuDNN when built with MNISTCU_CUDNN, else OWN */
    MNISTCU_CNN_OWN,         /* this file's kernels for convolution, pooling and batch norm */
    MNISTCU_CNN_CUDNN        /* cuDNN's (deterministic algorithms, FP32); needs MNISTCU_CUDNN at build time */
} mnistcu_cnn;

/* How the GPU's matrix products (dense layers, im2col convolutions; own kernels
   or cuBLAS) multiply. FP32 is the default and the reference; TF32 and BF16 are
   opt-in and use the tensor cores (sm_80 and newer): the operands are rounded
   to TF32 (10 mantissa bits) or BF16 (7) as they are read, the products are
   summed in FP32, and weights, gradients and optimizer state stay FP32. Results
   are then no longer bitwise those of FP32 (each output within
   (2u + K 2^-23) sum |a_k b_k| of it, u = 2^-10 for TF32, 2^-8 for BF16;
   tests/test_cuda.h). It is a permission, not a demand: the own kernels keep
   products of fewer than 16 64x64 tiles of output (small batches' dense
   layers) in FP32, where the tensor cores do not pay, and cuBLAS picks its own
   kernels for its FAST_TF32 / FAST_16BF compute types. The CPU, the direct
   convolution kernels, cuDNN and the fused MLP kernel compute in FP32 whatever is asked; a context on the CPU, or
   on a GPU older than sm_80, resolves TF32, BF16 and TF32X3 to FP32 and says so in
   its log (mnistcu_ctx_resolved_desc reports what is used).
   TF32X3 is FP32's accuracy on the tensor cores: each operand v = hi + lo, two
   TF32 values, a b = ah bh + ah bl + al bh summed in FP32, every 32 terms' sum
   added to the total rounded to nearest (>>cuda_x3). Each product is within
   FP32's error of the exact one (relative 2.5e-7 against cuBLAS FP32's 2.9e-7
   on P3's products, bench/gemm_tc3.cu), not FP32's bits; on an H200 P3 takes
   20.0-20.3 ms an epoch against 21.6-21.9 with cuBLAS's FP32, P5 186.8 against
   205.8 (bench/RESULTS.md). It takes the products of
   16 or more 64x64 tiles whose dimensions are multiples of 4 (own kernels and
   cuBLAS builds alike: cuBLAS has no such mode); the rest stay FP32. */
typedef enum mnistcu_precision {
    MNISTCU_PRECISION_DEFAULT = 0, /* FP32 */
    MNISTCU_PRECISION_FP32,
    MNISTCU_PRECISION_TF32,
    MNISTCU_PRECISION_BF16,
    MNISTCU_PRECISION_TF32X3       /* FP32's accuracy, three TF32 products on the tensor cores */
} mnistcu_precision;

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
    mnistcu_cnn cnn;             /* CUDA convolution, pooling, batch norm: DEFAULT (see mnistcu_cnn) */
    mnistcu_precision precision; /* CUDA matrix products: DEFAULT = FP32 (see mnistcu_precision) */
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

/* ---- images ------------------------------------------------------------------
   PNG (every colour type and depth, interlaced or not) and PGM (P5, P2), read
   strictly (see >>image) into 8-bit grayscale, for predicting on your own
   images. mnistcu_image_to_mnist makes a size x size MNIST-style input (28
   for MNIST): light-background images inverted, cropped to the ink, scaled
   to fit 20/28 of the side keeping the aspect ratio, centred by centre of
   mass; the result feeds mnistcu_predict_u8. */
typedef struct mnistcu_image {
    int width, height;
    uint8_t *gray;        /* [height][width], 0 black .. 255 white; free with mnistcu_image_free */
} mnistcu_image;
MNISTCU_DEF mnistcu_result mnistcu_image_load(mnistcu_ctx *ctx, const char *path, mnistcu_image *img);
MNISTCU_DEF mnistcu_result mnistcu_image_load_memory(mnistcu_ctx *ctx, const void *data, size_t size, mnistcu_image *img);
MNISTCU_DEF void mnistcu_image_free(mnistcu_ctx *ctx, mnistcu_image *img);
MNISTCU_DEF mnistcu_result mnistcu_image_to_mnist(mnistcu_ctx *ctx, const mnistcu_image *img, int size, uint8_t *out);

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
    size_t target_dim;   /* 0: class labels; else float targets of this many values per sample */
} mnistcu_dataset_info;

MNISTCU_DEF mnistcu_result mnistcu_dataset_load(mnistcu_ctx *ctx, const mnistcu_dataset_desc *desc, mnistcu_dataset **out);
MNISTCU_DEF mnistcu_result mnistcu_dataset_load_dir(mnistcu_ctx *ctx, const char *dir, mnistcu_split split,
                                                    mnistcu_dataset **out);
/* Copies count samples of `features` floats (already normalised) and their labels. */
MNISTCU_DEF mnistcu_result mnistcu_dataset_create(mnistcu_ctx *ctx, const float *x, const int32_t *labels, size_t count,
                                                  size_t features, int num_classes, mnistcu_dataset **out);
/* Copies count samples of `features` floats (already normalised) and a vector of
   target_dim float targets each, for regression (MSE) and multi-label (BCE) or
   soft labels (SOFTMAX_CE): target_dim must equal the model's outputs. Such a
   dataset has no class labels (mnistcu_dataset_sample gives -1): accuracy is
   not reported for it, the loss is. */
MNISTCU_DEF mnistcu_result mnistcu_dataset_create_targets(mnistcu_ctx *ctx, const float *x, const float *targets,
                                                          size_t count, size_t features, size_t target_dim,
                                                          mnistcu_dataset **out);
/* The float targets of sample i (info.target_dim floats). */
MNISTCU_DEF mnistcu_result mnistcu_dataset_sample_targets(const mnistcu_dataset *ds, size_t i, float *targets);
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
   A model is a sequence of layers, as torch.nn.Sequential: each layer maps a
   batch of samples of shape [C][H][W] (NCHW, row-major) to the next shape.
   Flat data is [N][1][1] (a spec may write it 1x1xN or N). Parameters live in
   one arena in PyTorch's order and layouts (dense W [out][in] then b [out];
   conv W [out][in][kh][kw] then b [out]; batch norm weight then bias), running
   statistics of batch norm in a second one (the "buffers"), gradients in a
   third with the parameters' layout. */
typedef struct mnistcu_model mnistcu_model;

#define MNISTCU_MAX_MODEL_LAYERS 64 /* layers of every kind in one model */

/* One list makes the layer kinds: the enum, the spec keyword and the module
   name torch.nn gives it (BatchNorm is BatchNorm1d on flat data, else 2d). */
#define MNISTCU_LAYER_LIST(X)                          \
    X(DENSE,      "dense",      "Linear")             \
    X(CONV2D,     "conv",       "Conv2d")             \
    X(MAXPOOL2D,  "maxpool",    "MaxPool2d")          \
    X(AVGPOOL2D,  "avgpool",    "AvgPool2d")          \
    X(BATCHNORM,  "batchnorm",  "BatchNorm")          \
    X(DROPOUT,    "dropout",    "Dropout")            \
    X(FLATTEN,    "flatten",    "Flatten")            \
    X(RELU,       "relu",       "ReLU")               \
    X(LEAKY_RELU, "leaky_relu", "LeakyReLU")          \
    X(SIGMOID,    "sigmoid",    "Sigmoid")            \
    X(TANH,       "tanh",       "Tanh")               \
    X(SOFTMAX,    "softmax",    "Softmax")

typedef enum mnistcu_layer_kind {
    MNISTCU_LAYER_NONE = 0, /* ends an array of layer descs */
#define MNISTCU__LAYER_ENUM(name, key, torch) MNISTCU_LAYER_##name,
    MNISTCU_LAYER_LIST(MNISTCU__LAYER_ENUM)
#undef MNISTCU__LAYER_ENUM
    MNISTCU_LAYER_KIND_COUNT
} mnistcu_layer_kind;

typedef enum mnistcu_init {
    MNISTCU_INIT_DEFAULT = 0, /* = TORCH */
    MNISTCU_INIT_TORCH,       /* PyTorch's defaults: dense and conv W and b uniform in +-1/sqrt(fan_in);
                                 batch norm weight 1, bias 0 */
    MNISTCU_INIT_HE_UNIFORM,  /* W uniform in +-gain*sqrt(3/fan), gain sqrt(2): +-sqrt(6/fan_in); b zero
                                 (kaiming_uniform_ with PyTorch's default nonlinearity) */
    MNISTCU_INIT_XAVIER_UNIFORM, /* W uniform in +-gain*sqrt(6/(fan_in+fan_out)), gain 1; b zero (xavier_uniform_) */
    MNISTCU_INIT_XAVIER_NORMAL,  /* W normal, std gain*sqrt(2/(fan_in+fan_out)), gain 1; b zero (xavier_normal_) */
    MNISTCU_INIT_HE_NORMAL       /* W normal, std gain/sqrt(fan), gain sqrt(2); b zero (kaiming_normal_) */
} mnistcu_init;

/* One layer; zero means default in every field. Fields a kind does not use
   must stay zero. */
typedef struct mnistcu_layer_desc {
    mnistcu_layer_kind kind;
    int units;              /* DENSE: outputs; CONV2D: output channels (both required) */
    int kernel_h, kernel_w; /* CONV2D: required (kernel_w 0: = kernel_h); pools: 0: 2 */
    int stride;             /* CONV2D: 0: 1; pools: 0: the kernel size (as PyTorch) */
    int padding;            /* CONV2D: zeros added on each side (0: none) */
    int no_bias;            /* DENSE, CONV2D: 1 for no bias term */
    float p;                /* DROPOUT: probability of zeroing an element (0: 0.5) */
    float slope;            /* LEAKY_RELU: slope for negative inputs (0: 0.01) */
    float eps;              /* BATCHNORM: added to the variance (0: 1e-5) */
    float momentum;         /* BATCHNORM: running-statistics momentum (0: 0.1) */
    mnistcu_init init;      /* DENSE, CONV2D: this layer's initialisation (0: the model's) */
} mnistcu_layer_desc;

typedef enum mnistcu_act {
    MNISTCU_ACT_DEFAULT = 0, /* = RELU */
    MNISTCU_ACT_RELU,
    MNISTCU_ACT_IDENTITY,
    MNISTCU_ACT_SIGMOID,
    MNISTCU_ACT_TANH
} mnistcu_act;

/* The loss, as PyTorch defines it (see >>cpu_ops, losses). Against class labels,
   or float target vectors (mnistcu_dataset_create_targets): SOFTMAX_CE takes
   either (targets as probabilities), MSE and BCE compare a label's one-hot
   vector, HINGE needs labels. */
typedef enum mnistcu_loss {
    MNISTCU_LOSS_DEFAULT = 0, /* = SOFTMAX_CE */
    MNISTCU_LOSS_SOFTMAX_CE,  /* CrossEntropyLoss over the logits, optional label smoothing */
    MNISTCU_LOSS_MSE,         /* MSELoss: the outputs against the targets */
    MNISTCU_LOSS_BCE,         /* BCEWithLogitsLoss: a sigmoid per output, numerically stable; multi-label */
    MNISTCU_LOSS_HINGE        /* MultiMarginLoss: multi-class hinge, p 1 or 2, a margin */
} mnistcu_loss;


/* Two ways to describe a model: `sizes` for an MLP (dense layers with
   hidden_act between them), or `layers` with the input shape. */
typedef struct mnistcu_model_desc {
    int sizes[MNISTCU_MAX_LAYERS + 1]; /* MLP widths, input first, zero-terminated: {784, 128, 10};
                                          used when layers[0].kind is NONE */
    mnistcu_act hidden_act;            /* MLP: DEFAULT: RELU; the last layer gives logits (no activation) */
    mnistcu_loss loss;                 /* DEFAULT: SOFTMAX_CE */
    mnistcu_init init;                 /* DEFAULT: TORCH */
    int input_c, input_h, input_w;     /* layers: one sample's shape; input_w required, 0 in c or h: 1 */
    mnistcu_layer_desc layers[MNISTCU_MAX_MODEL_LAYERS]; /* in order; kind NONE ends the list */
    float init_gain;                   /* 0: the scheme's (HE sqrt(2), XAVIER 1); e.g. 5/3 before tanh */
    int init_fan_out;                  /* HE: 0 scales by fan_in (inputs of a unit), 1 by fan_out */
    int zero_bias;                     /* TORCH: 1 sets the biases to zero (the others always do) */
    float label_smoothing;             /* SOFTMAX_CE: in [0, 1] (0: none) */
    int loss_sum;                      /* 0: PyTorch's mean reduction; 1: the sum over the batch (and outputs) */
    float margin;                      /* HINGE: 0: 1 */
    int hinge_p;                       /* HINGE: 1 or 2 (0: 1) */
} mnistcu_model_desc;

typedef struct mnistcu_model_info {
    int num_layers;                      /* dense layers */
    int sizes[MNISTCU_MAX_LAYERS + 1];   /* input features, then each dense layer's outputs */
    size_t num_params;                   /* trained parameters (the parameter arena) */
    size_t inputs, classes;
    mnistcu_act hidden_act;              /* the MLP's; RELU for other models */
    mnistcu_device device;
    int layer_count;                     /* layers of every kind (mnistcu_model_layer_info) */
    int input_shape[3];                  /* C, H, W of one sample */
    size_t num_buffers;                  /* floats of running statistics (the buffer arena) */
    mnistcu_loss loss;                   /* resolved */
    int has_norm;                        /* 1 when the model normalises inputs as its training set (trained or
                                            loaded): x = stored * norm_scale + norm_shift */
    int norm_u8;                         /* ... for data stored as bytes */
    float norm_scale, norm_shift;
} mnistcu_model_info;

typedef struct mnistcu_layer_info {
    mnistcu_layer_desc desc;   /* resolved: defaults filled in */
    int in_shape[3];           /* C, H, W */
    int out_shape[3];
    size_t num_params;         /* trained parameters of this layer */
    size_t num_buffers;        /* running statistics of this layer */
    const char *keyword;       /* the spec keyword: "conv" */
    const char *torch_name;    /* the torch.nn module: "Conv2d", "BatchNorm1d" */
    char spec[64];             /* the layer as a spec token: "conv5x5x6", "maxpool3:s=2" */
} mnistcu_layer_info;

typedef enum mnistcu_mode {
    MNISTCU_MODE_TRAIN = 0, /* dropout draws masks, batch norm uses batch statistics (and updates its running ones) */
    MNISTCU_MODE_EVAL       /* dropout is the identity, batch norm uses its running statistics */
} mnistcu_mode;

/* A named tensor: the name and shape torch.nn.Sequential's state_dict gives it. */
typedef struct mnistcu_tensor_info {
    char name[32];       /* "0.weight", "3.running_mean", "3.num_batches_tracked" */
    int layer;           /* index of its layer */
    int ndim;
    int64_t shape[4];
    size_t count;        /* elements */
    int is_buffer;       /* 1: running statistics, kept apart from the trained parameters */
    int is_int;          /* 1: an integer in PyTorch (num_batches_tracked), given here as float */
} mnistcu_tensor_info;

typedef enum mnistcu_optim {
    MNISTCU_OPTIM_DEFAULT = 0, /* = SGD */
    MNISTCU_OPTIM_SGD,         /* torch.optim.SGD: momentum, dampening, Nesterov, weight decay */
    MNISTCU_OPTIM_ADAM,        /* torch.optim.Adam: betas, eps, bias correction, weight decay (L2), amsgrad */
    MNISTCU_OPTIM_ADAMW,       /* torch.optim.AdamW: Adam with decoupled weight decay (w *= 1 - lr*wd) */
    MNISTCU_OPTIM_RMSPROP,     /* torch.optim.RMSprop: alpha, eps, momentum, centered, weight decay */
    MNISTCU_OPTIM_ADAGRAD      /* torch.optim.Adagrad: lr_decay, initial_accumulator_value, eps, weight decay */
} mnistcu_optim;

/* An optimizer step, as torch.optim's (single-tensor rules, FP32). Zero means
   default in every field; the defaults are PyTorch's except where said. The
   optimizer's state (momentum, moments, sums) lives in one arena of the model,
   on its device, made zero (Adagrad: initial_accumulator_value) on the first
   step and again whenever the kind or a field that changes its layout
   (momentum on or off, amsgrad, centered) changes, as a new torch optimizer
   would be. Before the step, l2 and clip_norm act on the gradient arena in
   place: g += 2*l2*W for dense and conv weights, then g *= min(1, clip_norm /
   (||g|| + 1e-6)) over all parameters (torch.nn.utils.clip_grad_norm_). */
typedef struct mnistcu_optim_desc {
    mnistcu_optim kind;    /* DEFAULT: SGD */
    float learning_rate;   /* 0: 0.1 (SGD), 0.001 (ADAM, ADAMW), 0.01 (RMSPROP, ADAGRAD) */
    float momentum;        /* SGD, RMSPROP: 0: none */
    int nesterov;          /* SGD: 0: off; needs momentum > 0 and no dampening */
    float weight_decay;    /* 0: none. L2 added to the gradient (wd*w), except ADAMW: decoupled. Note
                              torch.optim.AdamW's default is 0.01: set it (the CLI does) */
    float dampening;       /* SGD: 0: none; the momentum buffer adds (1 - dampening) * g after its first step */
    float beta1, beta2;    /* ADAM, ADAMW: 0: 0.9 and 0.999 */
    float eps;             /* ADAM, ADAMW, RMSPROP: 0: 1e-8; ADAGRAD: 0: 1e-10 */
    int amsgrad;           /* ADAM, ADAMW: 1 keeps the maximum of the second moments */
    float alpha;           /* RMSPROP: the squared average's smoothing (0: 0.99) */
    int centered;          /* RMSPROP: 1 divides by the estimated variance instead */
    float lr_decay;        /* ADAGRAD: the rate is lr / (1 + (t-1) lr_decay) at step t (0: none) */
    float initial_accumulator_value; /* ADAGRAD: the sums start here (0: 0) */
    float l2;              /* lambda of an explicit penalty lambda * ||W||^2 on the loss, dense and conv
                              weights only (not biases or batch norm); 0: none */
    float clip_norm;       /* clip the gradient's global 2-norm to this; 0: no clipping */
} mnistcu_optim_desc;

MNISTCU_DEF mnistcu_result mnistcu_model_create(mnistcu_ctx *ctx, const mnistcu_model_desc *desc, mnistcu_model **out);
MNISTCU_DEF mnistcu_result mnistcu_model_create_mlp(mnistcu_ctx *ctx, const char *spec, mnistcu_model **out); /* "784-128-10" */
/* A model from a spec string (grammar under SPEC STRINGS above), a preset name
   ("lenet5", "fashion-cnn") or MLP widths ("784-128-10"). */
MNISTCU_DEF mnistcu_result mnistcu_model_create_spec(mnistcu_ctx *ctx, const char *spec, mnistcu_model **out);
/* Parses a spec into a desc without making a model (errors name the token and its position). */
MNISTCU_DEF mnistcu_result mnistcu_model_desc_parse(mnistcu_ctx *ctx, const char *spec, mnistcu_model_desc *out);
/* The canonical spec of a desc or a model ("1x28x28 conv5x5x6 relu ..."); parsing it gives the same model.
   Fails with ERR_INVALID_ARGUMENT (and an empty string) when size is too small. */
MNISTCU_DEF mnistcu_result mnistcu_model_desc_spec(const mnistcu_model_desc *d, char *buf, size_t size);
MNISTCU_DEF mnistcu_result mnistcu_model_spec(const mnistcu_model *m, char *buf, size_t size);
MNISTCU_DEF mnistcu_result mnistcu_model_layer_info(const mnistcu_model *m, int layer, mnistcu_layer_info *info);
/* TRAIN (the default, as PyTorch) or EVAL: used by mnistcu_model_forward and
   mnistcu_model_compute_grads. mnistcu_train trains in TRAIN mode, evaluate and
   predict run in EVAL mode; each leaves the model's mode as it found it. */
MNISTCU_DEF void mnistcu_model_set_mode(mnistcu_model *m, mnistcu_mode mode);
MNISTCU_DEF mnistcu_mode mnistcu_model_mode(const mnistcu_model *m);
/* Parameters and buffers by name, in state_dict order (each layer's weight, bias,
   running_mean, running_var, num_batches_tracked). count must equal the tensor's. */
MNISTCU_DEF int mnistcu_model_num_tensors(const mnistcu_model *m);
MNISTCU_DEF mnistcu_result mnistcu_model_tensor_info(const mnistcu_model *m, int i, mnistcu_tensor_info *info);
MNISTCU_DEF mnistcu_result mnistcu_model_get_tensor(const mnistcu_model *m, const char *name, float *dst, size_t count);
MNISTCU_DEF mnistcu_result mnistcu_model_set_tensor(mnistcu_model *m, const char *name, const float *src, size_t count);
/* The gradient of a trained parameter by name (after mnistcu_model_compute_grads). */
MNISTCU_DEF mnistcu_result mnistcu_model_get_tensor_grad(const mnistcu_model *m, const char *name, float *dst,
                                                         size_t count);
MNISTCU_DEF void mnistcu_model_destroy(mnistcu_model *m);
MNISTCU_DEF void mnistcu_model_info_get(const mnistcu_model *m, mnistcu_model_info *info);
MNISTCU_DEF size_t mnistcu_model_num_params(const mnistcu_model *m);
MNISTCU_DEF mnistcu_result mnistcu_model_get_params(const mnistcu_model *m, float *dst, size_t count);
MNISTCU_DEF mnistcu_result mnistcu_model_set_params(mnistcu_model *m, const float *src, size_t count);
MNISTCU_DEF mnistcu_result mnistcu_model_get_grads(const mnistcu_model *m, float *dst, size_t count);
/* Logits [n][classes] for n samples of normalised features [n][inputs], in the model's mode. */
MNISTCU_DEF mnistcu_result mnistcu_model_forward(mnistcu_model *m, const float *x, size_t n, float *logits);
/* Forward and backward over one batch, in the model's mode: the gradients of the loss (the model's
   reduction; *loss gets PyTorch's value of it, without the optimizer's l2 penalty) replace
   the gradient arena. Dropout draws its masks for the model's step count (mnistcu_model_steps). */
MNISTCU_DEF mnistcu_result mnistcu_model_compute_grads(mnistcu_model *m, const float *x, const int32_t *labels, size_t n,
                                                       double *loss);
/* The same against float targets [n][classes] (regression, multi-label; see mnistcu_loss). */
MNISTCU_DEF mnistcu_result mnistcu_model_compute_grads_targets(mnistcu_model *m, const float *x, const float *targets,
                                                               size_t n, double *loss);
/* One optimizer step with the gradients in the arena (optimizer state persists in the model). */
MNISTCU_DEF mnistcu_result mnistcu_model_apply_grads(mnistcu_model *m, const mnistcu_optim_desc *opt);
MNISTCU_DEF uint64_t mnistcu_model_steps(const mnistcu_model *m); /* optimizer steps taken */

/* ---- model files ------------------------------------------------------------
   safetensors (https://github.com/huggingface/safetensors): the parameters and
   buffers under torch.nn.Sequential's names and layouts (PyTorch loads them
   with load_state_dict(strict=True)), and metadata that makes the model from
   the file alone: its spec, input shape, normalisation, loss, class names,
   the library version. Written atomically (PATH.tmp, synced, renamed);
   read as hostile input (see >>safetensors; every problem has its own
   MNISTCU_ERR_ST_* code). A model loaded keeps the saved normalisation, so
   evaluate and predict need no other option. */
MNISTCU_DEF mnistcu_result mnistcu_model_save(mnistcu_model *m, const char *path);
MNISTCU_DEF mnistcu_result mnistcu_model_load(mnistcu_ctx *ctx, const char *path, mnistcu_model **out);
MNISTCU_DEF mnistcu_result mnistcu_model_load_memory(mnistcu_ctx *ctx, const void *data, size_t size,
                                                     mnistcu_model **out);
/* ONNX (IR 7, opset 13, see >>onnx): input "input" [batch, C, H, W] (flat data: [batch, N]), raw pixel
   values 0..255 when the model records a normalisation for images (Mul and Add nodes apply it), output
   "logits" [batch, classes]; EVAL mode, dropout left out. Written atomically. */
MNISTCU_DEF mnistcu_result mnistcu_model_export_onnx(mnistcu_model *m, const char *path);
/* Names of the outputs (count = the model's classes, 1-63 bytes each), kept in the model file; NULL, 0 clears. */
MNISTCU_DEF mnistcu_result mnistcu_model_set_class_names(mnistcu_model *m, const char *const *names, size_t count);
MNISTCU_DEF const char *mnistcu_model_class_name(const mnistcu_model *m, size_t i); /* NULL when none */

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
    double learning_rate;         /* this epoch's, after the schedule */
    int has_accuracy;             /* 0 for a dataset with float targets: the accuracies are NaN */
} mnistcu_progress;

/* Learning-rate schedules, as torch.optim.lr_scheduler stepped at each epoch's
   end (or, with per_step, after each optimizer step). t is the 0-based epoch
   (or step) of T in the whole training, lr the base rate. */
typedef enum mnistcu_schedule {
    MNISTCU_SCHEDULE_DEFAULT = 0, /* = CONSTANT */
    MNISTCU_SCHEDULE_CONSTANT,    /* lr */
    MNISTCU_SCHEDULE_STEP,        /* lr * gamma^floor(t / step_size) (StepLR) */
    MNISTCU_SCHEDULE_COSINE,      /* min_lr + (lr - min_lr) (1 + cos(pi t / T)) / 2 (CosineAnnealingLR, T_max = T) */
    MNISTCU_SCHEDULE_MULTISTEP,   /* lr * gamma^(milestones passed: those <= t) (MultiStepLR) */
    MNISTCU_SCHEDULE_EXPONENTIAL, /* lr * gamma^t (ExponentialLR) */
    MNISTCU_SCHEDULE_EXP_DECAY,   /* lr * e^(-decay t), the continuous form */
    MNISTCU_SCHEDULE_ONE_CYCLE,   /* OneCycleLR with lr as max_lr, cosine annealing: up from lr / div_factor over
                                     pct_start of T, then down to that / final_div_factor (momentum not cycled) */
    MNISTCU_SCHEDULE_PLATEAU      /* ReduceLROnPlateau (mode min, relative threshold 1e-4) on the validation loss,
                                     checked at each epoch end: times factor after more than patience epochs
                                     without improvement, not below min_lr; needs a validation set */
} mnistcu_schedule;

#define MNISTCU_MAX_MILESTONES 8

typedef struct mnistcu_schedule_desc {
    mnistcu_schedule kind;  /* DEFAULT: CONSTANT */
    int step_size;          /* STEP: epochs (steps) between decays (0: 1) */
    float gamma;            /* STEP, MULTISTEP: the factor (0: 0.1); EXPONENTIAL: required, in (0, 1] */
    float min_lr;           /* COSINE, PLATEAU: the floor (0: 0) */
    int milestones[MNISTCU_MAX_MILESTONES]; /* MULTISTEP: increasing epochs (steps), 0 ends the list */
    float decay;            /* EXP_DECAY: k >= 0 */
    int warmup;             /* any kind: the first `warmup` epochs (steps) ramp linearly from warmup_start * lr
                               towards lr, then the schedule runs from its own t = 0 over T - warmup
                               (SequentialLR of LinearLR and the schedule); 0: none */
    float warmup_start;     /* the warm-up's first factor (0: 0.1) */
    int per_step;           /* 0: t counts epochs; 1: t counts optimizer steps, the rate changes every step */
    float pct_start;        /* ONE_CYCLE: the rising part of T (0: 0.3) */
    float div_factor;       /* ONE_CYCLE: lr / div_factor is where it starts (0: 25) */
    float final_div_factor; /* ONE_CYCLE: and that / final_div_factor where it ends (0: 1e4) */
    int patience;           /* PLATEAU: epochs without improvement tolerated (0: 10) */
    float factor;           /* PLATEAU: the reduction (0: 0.1); min_lr is its floor */
} mnistcu_schedule_desc;

/* Data augmentation for image datasets (stored as bytes): each training image
   is warped on the fly, differently at every step, reproducibly by seed and
   identically on the CPU and the GPU (see >>augment). Zero everywhere: off. */
typedef struct mnistcu_augment_desc {
    float rotate;        /* degrees: a uniform angle in [-rotate, rotate], at most 90 (0: none) */
    float scale;         /* a uniform factor in [1 - scale, 1 + scale], scale at most 0.5 (0: none) */
    float translate;     /* pixels: a uniform shift in [-translate, translate] on each axis (0: none) */
    float elastic_alpha; /* elastic distortion (Simard et al. 2003): the field's scale in pixels (0: none; 34
                            in the paper for MNIST) */
    float elastic_sigma; /* its smoothing Gaussian's deviation in pixels, 0.5..8 (0: 4) */
} mnistcu_augment_desc;

/* What augmentation makes of sample `index` of ds when it sits at position
   `slot` of the batch of optimizer step `step`: rows x cols pixels in 0..255
   (before normalisation), computed on the CPU; mnistcu_train's GPU batches are
   the same bits. For looking at the augmentation, and for tests. */
MNISTCU_DEF mnistcu_result mnistcu_augment_sample(mnistcu_ctx *ctx, const mnistcu_dataset *ds,
                                                  const mnistcu_augment_desc *aug, size_t index, uint64_t step,
                                                  uint32_t slot, float *pixels);

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
    mnistcu_schedule_desc schedule;      /* zero: the learning rate stays optim.learning_rate */
    int early_stop;                      /* 0: off; N: stop once the validation loss has not improved for N
                                            epochs (needs a validation set) */
    int keep_last;                       /* with early_stop: 0 puts the weights of the best epoch back at the
                                            end (parameters and running statistics); 1 keeps the last ones */
    const char *log_path;                /* NULL: none; else one JSON line per epoch end (and every log_every
                                            steps) written to this file: epoch, step, lr, losses, accuracies,
                                            seconds, images/s; numbers that are not finite are null */
    size_t log_every;                    /* 0: epoch ends only */
    mnistcu_augment_desc augment;        /* zero: no augmentation */
    /* Checkpoints (model files of kind "checkpoint", see >>checkpoint): a run resumed from one continues
       to the same bits as the run that was not stopped, on the CPU and on the GPU. */
    const char *checkpoint_path;         /* NULL: none; else written there (atomically) every checkpoint_every
                                            epochs, every checkpoint_every_steps steps, and when training ends */
    int checkpoint_every;                /* epochs between checkpoints (0: 1) */
    size_t checkpoint_every_steps;       /* also every N steps inside an epoch (0: at epoch ends only) */
    int checkpoint_keep;                 /* 0: the latest only; K: also keep the last K as
                                            STEM-eEEEE-sSSSSSS.safetensors beside checkpoint_path */
    int checkpoint_best;                 /* 1: with a validation set, also STEM-best.safetensors at each epoch
                                            with a new lowest validation loss */
    const char *checkpoint_note;         /* NULL, or text kept in the checkpoint (mnistcu_checkpoint_info) */
    const char *resume_from;             /* NULL, or a checkpoint to continue from: the model's weights and
                                            optimizer state, the position in the epoch, the generators, the
                                            schedule and early stopping come from it. The settings (but epochs,
                                            which may grow), batch size, dataset size and the context's seed
                                            must be the checkpoint's */
    int no_fused;                        /* 0: on the GPU with the own kernels, a model with one hidden layer
                                            (but one of at most 16 units over 32 inputs or more) trains in the
                                            fused MLP kernel (see >>cuda_fused), which gives the same bits as
                                            the step by step path, faster; 1: step by step always */
    int no_graph;                        /* 0: on the GPU, a step that does not run in the fused kernel is
                                            captured once into a CUDA graph and replayed (same bits, fewer
                                            launches; see >>cuda_graph); 1: its kernels launched one by one */
    int no_head;                         /* 0: on the GPU, a model ending in a dense layer of at
                                            most 32 outputs runs that layer's forward pass, the loss and its
                                            gradients but the weights' in one kernel (see >>cuda_head; the
                                            same bits with the own products, within rounding with cuBLAS's);
                                            1: step by step */
    int no_fused_update;                 /* 0: on the GPU in FP32, SGD without l2 or clipping, a wide
                                            dense layer's optimizer step is taken in its weight gradient's
                                            product where that is our kernel (with cuBLAS: where it also
                                            sums the bias gradient; see >>cuda_update; the same bits, one
                                            pass over the weights fewer); 1: in the optimizer's pass */
    int fused_cnn;                       /* 1: on the GPU (compute capability 9.0 or later, 203 KB of shared
                                            memory a block), FP32, the own kernels, LeNet-5's shape (the
                                            "lenet5" preset: any optimizer and schedule without l2 or
                                            clipping, a loss against class labels, batches of at most 64,
                                            a resident dataset, no augmentation) trains in one persistent
                                            kernel (see >>cuda_fused_lenet): about 4x faster. Its sums run
                                            in other orders than the step by step path's, so its weights
                                            agree with that path's to rounding, not bit for bit (the same
                                            bits on every run of its own); 0: off */
    int fused_mlp_clusters;              /* 1: on the GPU (compute capability 9.0 or later, built with CUDA 12.1
                                            or later; otherwise the option declines), FP32, a model of one
                                            hidden dense layer with a relu (at most 784 inputs, a multiple of 4,
                                            at most 1024 hidden units, biases) and a dense output of at most 16
                                            classes, the softmax cross-entropy against class labels without
                                            smoothing, any optimizer and schedule without l2 or clipping,
                                            batches of at most 64, a resident dataset of bytes, no augmentation,
                                            trains in one kernel of thread-block clusters (see
                                            >>cuda_fused_clusters; its products on the tensor cores in three
                                            TF32 parts, FP32's accuracy): about 2x faster than the fused MLP
                                            kernel. Its sums run in other orders than the step by step path's, so its
                                            weights agree with that path's to rounding, not bit for bit (the
                                            same bits on every run of its own); 0: off */
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
    int best_epoch;              /* with a validation set: the epoch of the lowest validation loss (0: none) */
    double best_val_loss;        /* ... and that loss */
    int early_stopped;           /* 1 when early_stop ended training before desc.epochs */
    size_t fused_steps;          /* of steps, those the fused MLP kernel ran (see no_fused) */
    size_t graph_steps;          /* of steps, those replayed from a captured CUDA graph (see no_graph) */
    size_t head_steps;           /* of steps, those whose last layer and loss ran in the head (see no_head) */
    size_t fused_cnn_steps;      /* of fused_steps, those the fused LeNet-5 kernel ran (see fused_cnn) */
    size_t fused_cluster_steps;  /* of fused_steps, those the cluster MLP kernel ran (see fused_mlp_clusters) */
    size_t fused_update_steps;   /* of steps, those whose optimizer step was taken, in part, in the weight
                                    gradients' products (see no_fused_update) */
} mnistcu_train_result;

typedef struct mnistcu_metrics {
    size_t count, correct;
    double loss;      /* mean loss per sample (the model's loss; for the sum reduction, the sum over a batch / its size) */
    double accuracy;  /* correct / count; NaN for a dataset with float targets */
    int has_accuracy; /* 0 for a dataset with float targets */
} mnistcu_metrics;

MNISTCU_DEF void mnistcu_train_desc_resolve(const mnistcu_train_desc *desc, mnistcu_train_desc *out);

/* What a checkpoint holds: where training stood and the settings to resume with. */
typedef struct mnistcu_checkpoint_info {
    int epoch;                 /* the epoch it was taken in (1-based) */
    size_t step, steps;        /* steps done in that epoch, and per epoch (step == steps: at its end) */
    size_t total_steps;        /* optimizer steps of the training so far */
    uint64_t seed;             /* the context's seed: resume in a context made with it */
    mnistcu_train_desc train;  /* epochs, batch size, optimizer, schedule, augmentation, early stopping (no
                                  pointers: give the datasets, paths and callbacks again) */
    char spec[2048];           /* the model */
    char note[1024];           /* checkpoint_note, "" when none */
} mnistcu_checkpoint_info;
MNISTCU_DEF mnistcu_result mnistcu_checkpoint_info_get(mnistcu_ctx *ctx, const char *path, mnistcu_checkpoint_info *info);
/* The learning rate of 0-based epoch t of T under a schedule (NULL: constant), from the base rate lr. */
MNISTCU_DEF float mnistcu_schedule_lr(const mnistcu_schedule_desc *schedule, float lr, int t, int T);
/* MNISTCU_ERR_DIVERGED when the loss or a weight stops being finite (see ERRORS):
   the model keeps the last weights known to be finite with a finite loss, and
   *result describes the training up to there, diverged_epoch and diverged_step
   included. */
MNISTCU_DEF mnistcu_result mnistcu_train(mnistcu_model *m, const mnistcu_dataset *train, const mnistcu_train_desc *desc,
                                         mnistcu_train_result *result);
/* The logits [count][classes] of every sample of ds, in EVAL mode, normalised
   as mnistcu_evaluate normalises them. */
MNISTCU_DEF mnistcu_result mnistcu_evaluate_logits(mnistcu_model *m, const mnistcu_dataset *ds, float *logits);
/* confusion: NULL or classes*classes counts, row = true label, column = prediction. */
MNISTCU_DEF mnistcu_result mnistcu_evaluate(mnistcu_model *m, const mnistcu_dataset *ds, mnistcu_metrics *out,
                                            int64_t *confusion);
/* Class (the largest output) and/or probabilities [n][classes] for n samples of
   normalised features: softmax (SOFTMAX_CE, HINGE), a sigmoid per output (BCE),
   or the outputs themselves (MSE, regression). */
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
#include <errno.h>
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
/* A product that the compiler may not fuse with a following sum into an fma:
   in device code, whether it would depends on the kernel the function is
   inlined into, and the fused MLP kernel must round the loss as the loss
   kernel does. */
#ifdef __CUDA_ARCH__
#define MNISTCU__MUL(a, b) __fmul_rn(a, b)
#define MNISTCU__ADD(a, b) __fadd_rn(a, b) /* likewise a sum with a product inside a function (expf) */
#else
#define MNISTCU__MUL(a, b) ((a) * (b))
#define MNISTCU__ADD(a, b) ((a) + (b))
#endif
/* Fused multiply-add where the target has it: one rounding, whatever the
   compiler would fuse. Strict ISO modes (-std=c99) do not contract a*b+c, which
   halves the CPU micro-kernel's speed; fmaf with FMA hardware compiles to the
   vector instruction. And where a compiler may contract, its choice of which
   product of an expression to fuse can differ between a vectorised loop and
   its scalar remainder (so with the thread count) or between the kernels a
   function is inlined into: the optimizers' steps say which, with this. */
#if defined(__CUDA_ARCH__) || defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define MNISTCU__FMA(a, b, c) fmaf(a, b, c)
#else
#define MNISTCU__FMA(a, b, c) ((a) * (b) + (c))
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
    int trying;                  /* > 0: failures are not logged (an attempt with a fallback, whose
                                    caller restores the error state when it falls back) */
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
    char msg[sizeof ctx->error]; /* formatted apart: an argument may be the current message */
    va_list ap;
    if (!ctx) return r;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(ctx->error, msg, sizeof msg);
    ctx->last_result = r;
    if (!ctx->trying) mnistcu__log(ctx, MNISTCU_LOG_ERROR, "%s", ctx->error);
    return r;
}

#ifdef __CUDACC__
/* An attempt with a fallback: its failures are not logged (mnistcu_ctx.trying),
   and where it falls back, mnistcu__attempt_undo puts the error state back as it was. */
typedef struct mnistcu__attempt {
    mnistcu_result last_result;
    char error[MNISTCU__ERROR_SIZE];
} mnistcu__attempt;

static void mnistcu__attempt_begin(mnistcu_ctx *ctx, mnistcu__attempt *a)
{
    a->last_result = ctx->last_result;
    memcpy(a->error, ctx->error, sizeof a->error);
    ctx->trying++;
}

static void mnistcu__attempt_end(mnistcu_ctx *ctx) { ctx->trying--; }

static void mnistcu__attempt_undo(mnistcu_ctx *ctx, const mnistcu__attempt *a)
{
    memcpy(ctx->error, a->error, sizeof a->error);
    ctx->last_result = a->last_result;
}
#endif

/* Not NaN and not +-inf: the exponent bits are not all ones. A bit test, so
   that -ffast-math (which may assume that no NaN exists) cannot remove it. */
static MNISTCU__HD int mnistcu__finite_f(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7F800000u) != 0x7F800000u;
}

/* A quiet NaN, for values that do not apply (accuracy against float targets). */
static double mnistcu__nan(void)
{
    uint64_t u = 0x7FF8000000000000ull;
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static int mnistcu__finite_d(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7FF0000000000000ull) != 0x7FF0000000000000ull;
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

/* Standard normal (Box-Muller over two uniform draws; the first kept away from 0). */
static double mnistcu__rng_normal(mnistcu__rng *r)
{
    double u1 = 1.0 - (double)mnistcu__rng_float(r), u2 = (double)mnistcu__rng_float(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/* Uniform integer in [0, n), unbiased (Lemire's multiply-and-reject): the high half of x n, unless
   the low half is below 2^64 mod n. That bound is under n, so a low half of n or more passes
   without the 64-bit remainder (tens of cycles), which is taken only otherwise: the same draws and
   the same result either way. With the 128-bit product below, a 60,000-sample shuffle takes about
   a third of the time it did (bench/RESULTS.md). */
static uint64_t mnistcu__rng_below(mnistcu__rng *r, uint64_t n)
{
    uint64_t x, hi, lo, threshold = 0;
    int have_threshold = 0;
    if (n <= 1) return 0;
    for (;;) {
        x = mnistcu__rng_next(r);
#if defined(__SIZEOF_INT128__)
        { /* the compiler's 128-bit product: one instruction on 64-bit targets, three times faster
             (__extension__: -pedantic's ISO C has no such type) */
            __extension__ typedef unsigned __int128 mnistcu__u128;
            const mnistcu__u128 p = (mnistcu__u128)x * n;
            hi = (uint64_t)(p >> 64);
            lo = (uint64_t)p;
        }
#else
        /* 64x64 -> 128 multiply from 32-bit halves, portable C99 */
        {
            uint64_t a = x >> 32, b = x & 0xFFFFFFFFu, c = n >> 32, d = n & 0xFFFFFFFFu;
            uint64_t ac = a * c, ad = a * d, bc = b * c, bd = b * d;
            uint64_t mid = (bd >> 32) + (ad & 0xFFFFFFFFu) + (bc & 0xFFFFFFFFu);
            hi = ac + (ad >> 32) + (bc >> 32) + (mid >> 32);
            lo = (mid << 32) | (bd & 0xFFFFFFFFu);
        }
#endif
        if (lo >= n) return hi;
        if (!have_threshold) {
            threshold = (0 - n) % n;
            have_threshold = 1;
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
/* >>image ----------------------------------------------------------------------
   Images for prediction: PNG (every colour type and bit depth the format has,
   interlaced or not; inflated by >>inflate) and PGM (P5 binary, P2 text),
   read as hostile input (every chunk's CRC, the IHDR fields, chunk order,
   the zlib header and Adler-32, the exact decompressed size, filter types,
   palette indices; sizes capped before anything is allocated), and turned
   into 8-bit grayscale in integer arithmetic:
     16-bit samples      (v * 255 + 32767) / 65535
     gray below 8 bits   v * 255 / (2^depth - 1)
     RGB                 (299 R + 587 G + 114 B + 500) / 1000
     alpha a over white  (g * a + 255 * (255 - a) + 127) / 255
     PGM, maxval M       (v * 255 + M / 2) / M
   mnistcu_image_to_mnist then makes an MNIST-style input the way the dataset
   was made: inverted when the border is light (dark ink on paper), stretched
   so that the lightest pixel is 0 and the inkiest 255, cropped to the ink's
   bounding box (pixels above a quarter of the range), scaled by area
   averaging to fit 20x20 (keeping the aspect ratio), placed in 28x28 with its
   centre of mass at the centre. */
#ifndef MNISTCU_IMAGE_MAX_PIXELS
#define MNISTCU_IMAGE_MAX_PIXELS ((size_t)1 << 26)
#endif

typedef struct mnistcu__png {
    uint32_t w, h;
    int depth, ctype, interlace, channels;
    unsigned char plte[256][4]; /* RGBA */
    int nplte;
    int has_key;                /* tRNS for gray or RGB: the transparent colour */
    uint16_t key[3];
} mnistcu__png;

/* One sample (channel c of pixel x) of an unfiltered row, at the image's depth. */
static unsigned mnistcu__png_sample(const mnistcu__png *p, const unsigned char *row, size_t x, int c)
{
    if (p->depth == 16) {
        size_t o = (x * (size_t)p->channels + (size_t)c) * 2;
        return (unsigned)row[o] << 8 | row[o + 1];
    }
    if (p->depth == 8) return row[x * (size_t)p->channels + (size_t)c];
    {
        size_t bit = x * (size_t)p->depth;
        return (unsigned)(row[bit >> 3] >> (8 - p->depth - (int)(bit & 7))) & ((1u << p->depth) - 1);
    }
}

static unsigned mnistcu__to8(unsigned v, int depth)
{
    return depth == 16 ? (v * 255u + 32767u) / 65535u : depth == 8 ? v : v * 255u / ((1u << depth) - 1u);
}

/* Gray 0..255 of pixel x of an unfiltered row. */
static unsigned char mnistcu__png_gray(const mnistcu__png *p, const unsigned char *row, size_t x)
{
    unsigned g, a = 255;
    if (p->ctype == 3) {
        const unsigned char *e = p->plte[mnistcu__png_sample(p, row, x, 0)];
        g = (299u * e[0] + 587u * e[1] + 114u * e[2] + 500u) / 1000u;
        a = e[3];
    } else if (p->ctype == 2 || p->ctype == 6) {
        unsigned r = mnistcu__png_sample(p, row, x, 0), gg = mnistcu__png_sample(p, row, x, 1),
                 b = mnistcu__png_sample(p, row, x, 2);
        if (p->ctype == 2 && p->has_key && r == p->key[0] && gg == p->key[1] && b == p->key[2]) a = 0;
        if (p->ctype == 6) a = mnistcu__to8(mnistcu__png_sample(p, row, x, 3), p->depth);
        g = (299u * mnistcu__to8(r, p->depth) + 587u * mnistcu__to8(gg, p->depth) + 114u * mnistcu__to8(b, p->depth) +
             500u) / 1000u;
    } else {
        unsigned v = mnistcu__png_sample(p, row, x, 0);
        if (p->ctype == 0 && p->has_key && v == p->key[0]) a = 0;
        if (p->ctype == 4) a = mnistcu__to8(mnistcu__png_sample(p, row, x, 1), p->depth);
        g = mnistcu__to8(v, p->depth);
    }
    return (unsigned char)(a == 255 ? g : (g * a + 255u * (255u - a) + 127u) / 255u);
}

static int mnistcu__paeth(int a, int b, int c)
{
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* Undoes the filters of one pass's rows in place (each 1 + rowbytes long). */
static mnistcu_result mnistcu__png_unfilter(mnistcu_ctx *ctx, unsigned char *d, size_t rows, size_t rowbytes, size_t bpp,
                                            const char *what)
{
    size_t y, i;
    for (y = 0; y < rows; ++y) {
        unsigned char *row = d + y * (rowbytes + 1), *prev = y ? row - (rowbytes + 1) + 1 : NULL;
        int f = row[0];
        row++;
        if (f > 4)
            return mnistcu__fail(ctx, MNISTCU_ERR_PNG_FILTER, "%.300s: PNG: row %lu has filter type %d (0-4 exist)",
                                 what, (unsigned long)y, f);
        for (i = 0; i < rowbytes; ++i) {
            int a = i >= bpp ? row[i - bpp] : 0, b = prev ? prev[i] : 0, c = prev && i >= bpp ? prev[i - bpp] : 0;
            int v = f == 1 ? a : f == 2 ? b : f == 3 ? (a + b) / 2 : f == 4 ? mnistcu__paeth(a, b, c) : 0;
            row[i] = (unsigned char)(row[i] + v);
        }
    }
    return MNISTCU_OK;
}

static const int mnistcu__adam7[7][4] = { /* x0, y0, dx, dy */
    {0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4}, {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}};

static mnistcu_result mnistcu__png_decode(mnistcu_ctx *ctx, const unsigned char *f, size_t size, const char *what,
                                          mnistcu_image *img)
{
    mnistcu__png p;
    size_t pos = 8, idat_len = 0, idat_cap = 0, expected = 0, got = 0, used = 0;
    unsigned char *idat = NULL, *raw = NULL;
    int seen_ihdr = 0, seen_plte = 0, seen_idat = 0, idat_done = 0, seen_iend = 0, seen_trns = 0, pass;
    mnistcu_result r = MNISTCU_OK;
    memset(&p, 0, sizeof p);
#define MNISTCU__PNG_FAIL(code, ...)               \
    do {                                           \
        r = mnistcu__fail(ctx, code, __VA_ARGS__); \
        goto done;                                 \
    } while (0)
    while (!seen_iend) {
        uint32_t len;
        const unsigned char *type, *data;
        if (pos == size) MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ORDER, "%.300s: PNG: no IEND chunk before the end", what);
        if (size - pos < 12)
            MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_TRUNCATED, "%.300s: PNG: the file ends inside a chunk at byte %lu", what,
                              (unsigned long)pos);
        len = mnistcu__be32(f + pos);
        type = f + pos + 4;
        data = f + pos + 8;
        if (len > 0x7FFFFFFFu || (size_t)len > size - pos - 12)
            MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_TRUNCATED, "%.300s: PNG: chunk %.4s at byte %lu claims %lu bytes, past "
                              "the end", what, (const char *)type, (unsigned long)pos, (unsigned long)len);
        if (mnistcu_crc32(0, type, (size_t)len + 4) != mnistcu__be32(data + len))
            MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_CRC, "%.300s: PNG: chunk %.4s at byte %lu: CRC mismatch", what,
                              (const char *)type, (unsigned long)pos);
        if (!seen_ihdr && memcmp(type, "IHDR", 4) != 0)
            MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ORDER, "%.300s: PNG: the first chunk is %.4s, not IHDR", what,
                              (const char *)type);
        if (seen_idat && memcmp(type, "IDAT", 4) != 0) idat_done = 1;
        if (!memcmp(type, "IHDR", 4)) {
            uint64_t px;
            int ok_depth;
            if (seen_ihdr++) MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ORDER, "%.300s: PNG: a second IHDR", what);
            if (len != 13) MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_IHDR, "%.300s: PNG: IHDR is %lu bytes, not 13", what,
                                             (unsigned long)len);
            p.w = mnistcu__be32(data);
            p.h = mnistcu__be32(data + 4);
            p.depth = data[8];
            p.ctype = data[9];
            p.interlace = data[12];
            ok_depth = p.ctype == 0 ? (p.depth == 1 || p.depth == 2 || p.depth == 4 || p.depth == 8 || p.depth == 16)
                     : p.ctype == 3 ? (p.depth == 1 || p.depth == 2 || p.depth == 4 || p.depth == 8)
                     : (p.ctype == 2 || p.ctype == 4 || p.ctype == 6) ? (p.depth == 8 || p.depth == 16) : 0;
            if (p.w == 0 || p.h == 0 || p.w > 0x7FFFFFFFu || p.h > 0x7FFFFFFFu || !ok_depth || data[10] != 0 ||
                data[11] != 0 || p.interlace > 1)
                MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_IHDR,
                                  "%.300s: PNG: IHDR %lux%lu, bit depth %d, colour type %d, compression %d, filter %d, "
                                  "interlace %d is not a valid combination", what, (unsigned long)p.w,
                                  (unsigned long)p.h, p.depth, p.ctype, data[10], data[11], p.interlace);
            px = (uint64_t)p.w * p.h;
            if (px > MNISTCU_IMAGE_MAX_PIXELS)
                MNISTCU__PNG_FAIL(MNISTCU_ERR_IMAGE_TOO_LARGE, "%.300s: PNG: %lux%lu pixels, above the cap of %lu", what,
                                  (unsigned long)p.w, (unsigned long)p.h, (unsigned long)MNISTCU_IMAGE_MAX_PIXELS);
            p.channels = p.ctype == 2 ? 3 : p.ctype == 4 ? 2 : p.ctype == 6 ? 4 : 1;
        } else if (!memcmp(type, "PLTE", 4)) {
            uint32_t k;
            if (seen_plte++ || seen_idat)
                MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ORDER, "%.300s: PNG: PLTE %s", what,
                                  seen_idat ? "after the image data" : "twice");
            if (len == 0 || len % 3 || len / 3 > 256 || (p.ctype == 3 && len / 3 > (1u << p.depth)) ||
                p.ctype == 0 || p.ctype == 4)
                MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_PALETTE, "%.300s: PNG: a PLTE of %lu bytes does not fit colour type "
                                  "%d at depth %d", what, (unsigned long)len, p.ctype, p.depth);
            p.nplte = (int)(len / 3);
            for (k = 0; k < len / 3; ++k) {
                memcpy(p.plte[k], data + 3 * k, 3);
                p.plte[k][3] = 255;
            }
        } else if (!memcmp(type, "tRNS", 4)) {
            uint32_t k;
            if (seen_trns++ || seen_idat) MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ORDER, "%.300s: PNG: tRNS out of place", what);
            if (p.ctype == 3) {
                if (!seen_plte || len > (uint32_t)p.nplte)
                    MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_PALETTE, "%.300s: PNG: tRNS has %lu entries for a palette of %d",
                                      what, (unsigned long)len, p.nplte);
                for (k = 0; k < len; ++k) p.plte[k][3] = data[k];
            } else if ((p.ctype == 0 && len == 2) || (p.ctype == 2 && len == 6)) {
                for (k = 0; k < len / 2; ++k) p.key[k] = (uint16_t)(data[2 * k] << 8 | data[2 * k + 1]);
                p.has_key = 1;
            } else {
                MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_PALETTE, "%.300s: PNG: tRNS of %lu bytes for colour type %d", what,
                                  (unsigned long)len, p.ctype);
            }
        } else if (!memcmp(type, "IDAT", 4)) {
            if (idat_done) MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ORDER, "%.300s: PNG: IDAT chunks are not consecutive", what);
            seen_idat = 1;
            if (idat_len + len > idat_cap) {
                size_t cap = MNISTCU__MAX(idat_cap * 2, idat_len + len + 64);
                unsigned char *n = (unsigned char *)mnistcu__alloc(ctx, cap);
                if (!n) MNISTCU__PNG_FAIL(MNISTCU_ERR_OUT_OF_MEMORY, "%.300s: PNG: out of memory", what);
                if (idat_len) memcpy(n, idat, idat_len);
                mnistcu__free(ctx, idat);
                idat = n;
                idat_cap = cap;
            }
            memcpy(idat + idat_len, data, len);
            idat_len += len;
        } else if (!memcmp(type, "IEND", 4)) {
            seen_iend = 1;
        } else if (!(type[0] & 0x20)) {
            MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ORDER, "%.300s: PNG: unknown critical chunk %.4s", what, (const char *)type);
        }
        pos += 12 + (size_t)len;
    }
    if (pos != size) MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ORDER, "%.300s: PNG: %lu bytes after IEND", what,
                                       (unsigned long)(size - pos));
    if (!seen_idat) MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ORDER, "%.300s: PNG: no IDAT chunk", what);
    if (p.ctype == 3 && !seen_plte) MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_PALETTE, "%.300s: PNG: no PLTE", what);
    /* the size of the filtered data: every pass's rows, each a filter byte and its bytes */
    for (pass = 0; pass < (p.interlace ? 7 : 1); ++pass) {
        const int *a = mnistcu__adam7[pass];
        uint64_t pw = p.interlace ? (p.w + (uint32_t)(a[2] - a[0] - 1)) / (uint32_t)a[2] : p.w;
        uint64_t ph = p.interlace ? (p.h + (uint32_t)(a[3] - a[1] - 1)) / (uint32_t)a[3] : p.h;
        if (pw && ph) expected += (size_t)ph * (1 + (size_t)((pw * (uint64_t)p.channels * (uint64_t)p.depth + 7) / 8));
    }
    if (idat_len < 2 || (idat[0] & 0x0F) != 8 || (idat[0] >> 4) > 7 || ((unsigned)idat[0] << 8 | idat[1]) % 31 != 0 ||
        (idat[1] & 0x20))
        MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ZLIB, "%.300s: PNG: the image data does not start with a zlib header "
                          "(deflate, window up to 32 KiB, no preset dictionary)", what);
    r = mnistcu_inflate(ctx, idat + 2, idat_len - 2, expected, (void **)&raw, &got, &used);
    if (r == MNISTCU_ERR_GZ_TOO_LARGE)
        MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_SIZE, "%.300s: PNG: the image data holds more than the %lu bytes its size "
                          "needs", what, (unsigned long)expected);
    if (r) MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ZLIB, "%.300s: PNG: zlib stream: %.300s", what, mnistcu_ctx_error(ctx));
    if (got != expected)
        MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_SIZE, "%.300s: PNG: the image data holds %lu bytes, its size needs %lu", what,
                          (unsigned long)got, (unsigned long)expected);
    if (idat_len - 2 - used != 4)
        MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ZLIB, "%.300s: PNG: %lu bytes follow the deflate stream, the Adler-32 is 4",
                          what, (unsigned long)(idat_len - 2 - used));
    {
        uint32_t s1 = 1, s2 = 0;
        size_t i;
        for (i = 0; i < got; ++i) {
            s1 = (s1 + raw[i]) % 65521u;
            s2 = (s2 + s1) % 65521u;
        }
        if ((s2 << 16 | s1) != mnistcu__be32(idat + 2 + used))
            MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_ZLIB, "%.300s: PNG: Adler-32 mismatch", what);
    }
    img->width = (int)p.w;
    img->height = (int)p.h;
    img->gray = (uint8_t *)mnistcu__alloc(ctx, (size_t)p.w * p.h);
    if (!img->gray) MNISTCU__PNG_FAIL(MNISTCU_ERR_OUT_OF_MEMORY, "%.300s: PNG: out of memory", what);
    {
        size_t off = 0, bpp = MNISTCU__MAX((size_t)1, (size_t)(p.channels * p.depth) / 8);
        for (pass = 0; pass < (p.interlace ? 7 : 1); ++pass) {
            const int *a = mnistcu__adam7[pass];
            size_t pw = p.interlace ? (p.w + (uint32_t)(a[2] - a[0] - 1)) / (uint32_t)a[2] : p.w;
            size_t ph = p.interlace ? (p.h + (uint32_t)(a[3] - a[1] - 1)) / (uint32_t)a[3] : p.h;
            size_t rowbytes = (pw * (size_t)p.channels * (size_t)p.depth + 7) / 8, x, y;
            if (!pw || !ph) continue;
            if ((r = mnistcu__png_unfilter(ctx, raw + off, ph, rowbytes, bpp, what))) goto done;
            for (y = 0; y < ph; ++y) {
                const unsigned char *row = raw + off + y * (rowbytes + 1) + 1;
                for (x = 0; x < pw; ++x) {
                    size_t ox = p.interlace ? (size_t)a[0] + x * (size_t)a[2] : x;
                    size_t oy = p.interlace ? (size_t)a[1] + y * (size_t)a[3] : y;
                    if (p.ctype == 3 && (int)mnistcu__png_sample(&p, row, x, 0) >= p.nplte)
                        MNISTCU__PNG_FAIL(MNISTCU_ERR_PNG_PALETTE, "%.300s: PNG: pixel (%lu, %lu) uses palette entry "
                                          "%u of %d", what, (unsigned long)ox, (unsigned long)oy,
                                          mnistcu__png_sample(&p, row, x, 0), p.nplte);
                    img->gray[oy * p.w + ox] = mnistcu__png_gray(&p, row, x);
                }
            }
            off += ph * (rowbytes + 1);
        }
    }
done:
#undef MNISTCU__PNG_FAIL
    if (r) {
        mnistcu__free(ctx, img->gray);
        img->gray = NULL;
        img->width = img->height = 0;
    }
    mnistcu__free(ctx, idat);
    mnistcu__free(ctx, raw);
    return r;
}

/* PGM: "P5" or "P2", then width, height and maxval (decimal, separated by whitespace and '#' comments),
   one whitespace byte, then the samples (P5: bytes, big-endian pairs when maxval > 255; P2: decimals). */
static int mnistcu__pgm_token(const unsigned char *f, size_t size, size_t *pos, unsigned long *v)
{
    int digits = 0;
    for (;;) {
        while (*pos < size && (f[*pos] == ' ' || f[*pos] == '\t' || f[*pos] == '\n' || f[*pos] == '\r' ||
                               f[*pos] == '\v' || f[*pos] == '\f'))
            ++*pos;
        if (*pos < size && f[*pos] == '#') {
            while (*pos < size && f[*pos] != '\n' && f[*pos] != '\r') ++*pos;
            continue;
        }
        break;
    }
    *v = 0;
    while (*pos < size && f[*pos] >= '0' && f[*pos] <= '9') {
        if (*v > 100000000ul) return 0;
        *v = *v * 10 + (unsigned long)(f[*pos] - '0');
        ++*pos;
        ++digits;
    }
    return digits > 0 && (*pos == size || !(f[*pos] >= '!' && f[*pos] <= '~') || f[*pos] == '#');
}

static mnistcu_result mnistcu__pgm_decode(mnistcu_ctx *ctx, const unsigned char *f, size_t size, const char *what,
                                          mnistcu_image *img)
{
    size_t pos = 2, n, i;
    unsigned long w, h, maxval, v;
    int ascii = f[1] == '2';
    if (!mnistcu__pgm_token(f, size, &pos, &w) || !mnistcu__pgm_token(f, size, &pos, &h) ||
        !mnistcu__pgm_token(f, size, &pos, &maxval) || w == 0 || h == 0 || maxval == 0 || maxval > 65535)
        return mnistcu__fail(ctx, MNISTCU_ERR_PGM, "%.300s: PGM: the header needs a width, a height (positive) and a "
                                                   "maxval in 1..65535", what);
    if ((uint64_t)w * h > MNISTCU_IMAGE_MAX_PIXELS)
        return mnistcu__fail(ctx, MNISTCU_ERR_IMAGE_TOO_LARGE, "%.300s: PGM: %lux%lu pixels, above the cap of %lu", what,
                             w, h, (unsigned long)MNISTCU_IMAGE_MAX_PIXELS);
    n = (size_t)w * h;
    if (pos >= size) return mnistcu__fail(ctx, MNISTCU_ERR_PGM, "%.300s: PGM: no samples after the header", what);
    pos++; /* the one whitespace byte after maxval */
    if (!ascii && size - pos < n * (maxval > 255 ? 2 : 1))
        return mnistcu__fail(ctx, MNISTCU_ERR_PGM, "%.300s: PGM: %lu bytes of samples, %lu needed", what,
                             (unsigned long)(size - pos), (unsigned long)(n * (maxval > 255 ? 2 : 1)));
    img->gray = (uint8_t *)mnistcu__alloc(ctx, n);
    if (!img->gray) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%.300s: PGM: out of memory", what);
    for (i = 0; i < n; ++i) {
        if (ascii) {
            if (!mnistcu__pgm_token(f, size, &pos, &v)) {
                mnistcu__free(ctx, img->gray);
                img->gray = NULL;
                return mnistcu__fail(ctx, MNISTCU_ERR_PGM, "%.300s: PGM: sample %lu is missing or not a number", what,
                                     (unsigned long)i);
            }
        } else {
            v = maxval > 255 ? (unsigned long)f[pos + 2 * i] << 8 | f[pos + 2 * i + 1] : f[pos + i];
        }
        if (v > maxval) {
            mnistcu__free(ctx, img->gray);
            img->gray = NULL;
            return mnistcu__fail(ctx, MNISTCU_ERR_PGM, "%.300s: PGM: sample %lu is %lu, above maxval %lu", what,
                                 (unsigned long)i, v, maxval);
        }
        img->gray[i] = (uint8_t)((v * 255ul + maxval / 2) / maxval);
    }
    img->width = (int)w;
    img->height = (int)h;
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_image_load_memory(mnistcu_ctx *ctx, const void *data, size_t size, mnistcu_image *img)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    const unsigned char *f = (const unsigned char *)data;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!img || (!data && size)) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "image_load: NULL argument");
    memset(img, 0, sizeof *img);
    if (size >= 8 && !memcmp(f, sig, 8)) return mnistcu__png_decode(ctx, f, size, "image", img);
    if (size >= 2 && f[0] == 'P' && (f[1] == '5' || f[1] == '2')) return mnistcu__pgm_decode(ctx, f, size, "image", img);
    return mnistcu__fail(ctx, MNISTCU_ERR_IMAGE_SIGNATURE, "image: neither a PNG nor a PGM (P2, P5) file");
}

MNISTCU_DEF mnistcu_result mnistcu_image_load(mnistcu_ctx *ctx, const char *path, mnistcu_image *img)
{
    unsigned char *buf = NULL;
    size_t size = 0;
    mnistcu_result r;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!path || !img) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "image_load: NULL argument");
    memset(img, 0, sizeof *img);
    if ((r = mnistcu__read_file(ctx, path, MNISTCU_IDX_MAX_BYTES, &buf, &size))) return r;
    r = mnistcu_image_load_memory(ctx, buf, size, img);
    mnistcu__free(ctx, buf);
    if (r) { /* name the file instead of "image" */
        char msg[1024];
        const char *e = mnistcu_ctx_error(ctx);
        snprintf(msg, sizeof msg, "%s", !strncmp(e, "image", 5) ? e + 5 : e);
        mnistcu__fail(ctx, r, "%.300s%s", path, msg);
    }
    return r;
}

MNISTCU_DEF void mnistcu_image_free(mnistcu_ctx *ctx, mnistcu_image *img)
{
    if (!ctx || !img) return;
    mnistcu__free(ctx, img->gray);
    memset(img, 0, sizeof *img);
}

MNISTCU_DEF mnistcu_result mnistcu_image_to_mnist(mnistcu_ctx *ctx, const mnistcu_image *img, int size, uint8_t *out)
{
    int W, H, x, y, x0, y0, x1, y1, sw, sh, box;
    double border = 0.0, thresh, sx, sy, cx = 0.0, cy = 0.0, mass = 0.0, peak = 0.0, low = 255.0;
    long nborder = 0;
    int invert;
    float *patch;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!img || !img->gray || img->width < 1 || img->height < 1 || !out || size < 8 || size > 1024)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "image_to_mnist: no image, or size %d not in 8..1024",
                             size);
    W = img->width;
    H = img->height;
    for (x = 0; x < W; ++x) border += img->gray[x] + img->gray[(size_t)(H - 1) * W + x], nborder += 2;
    for (y = 0; y < H; ++y) border += img->gray[(size_t)y * W] + img->gray[(size_t)y * W + W - 1], nborder += 2;
    invert = border / (double)nborder > 127.5; /* a light border: dark ink on paper */
#define MNISTCU__INK(xx, yy) (invert ? 255 - img->gray[(size_t)(yy) * W + (xx)] : img->gray[(size_t)(yy) * W + (xx)])
    for (y = 0; y < H; ++y)
        for (x = 0; x < W; ++x) {
            peak = MNISTCU__MAX(peak, (double)MNISTCU__INK(x, y));
            low = MNISTCU__MIN(low, (double)MNISTCU__INK(x, y));
        }
    if (peak - low < 32.0)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "image_to_mnist: the image is blank (no ink)");
    thresh = low + 0.25 * (peak - low);
    x0 = W, y0 = H, x1 = -1, y1 = -1;
    for (y = 0; y < H; ++y)
        for (x = 0; x < W; ++x)
            if (MNISTCU__INK(x, y) > thresh && peak > 0) {
                x0 = MNISTCU__MIN(x0, x), x1 = MNISTCU__MAX(x1, x);
                y0 = MNISTCU__MIN(y0, y), y1 = MNISTCU__MAX(y1, y);
            }
    if (x1 < 0) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "image_to_mnist: the image is blank (no ink)");
    /* fit the ink's box into box x box (20 of 28), keeping the aspect ratio */
    box = (size * 20 + 14) / 28;
    sw = x1 - x0 + 1;
    sh = y1 - y0 + 1;
    if (sw >= sh) {
        sx = (double)sw / box;
        sy = sx;
    } else {
        sy = (double)sh / box;
        sx = sy;
    }
    {
        int pw = MNISTCU__MAX(1, (int)floor(sw / sx + 0.5)), ph = MNISTCU__MAX(1, (int)floor(sh / sy + 0.5)), px, py;
        int offx, offy;
        patch = (float *)mnistcu__alloc(ctx, (size_t)pw * ph * sizeof(float));
        if (!patch) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "image_to_mnist: out of memory");
        for (py = 0; py < ph; ++py) /* area average of the source rectangle under each target pixel */
            for (px = 0; px < pw; ++px) {
                double ax = x0 + px * sx, bx = x0 + (px + 1) * sx, ay = y0 + py * sy, by = y0 + (py + 1) * sy, acc = 0.0,
                       area = 0.0;
                int ix, iy;
                for (iy = (int)floor(ay); iy < (int)ceil(by) && iy <= y1; ++iy)
                    for (ix = (int)floor(ax); ix < (int)ceil(bx) && ix <= x1; ++ix) {
                        double wx = MNISTCU__MIN((double)ix + 1, bx) - MNISTCU__MAX((double)ix, ax);
                        double wy = MNISTCU__MIN((double)iy + 1, by) - MNISTCU__MAX((double)iy, ay);
                        if (wx <= 0 || wy <= 0) continue;
                        acc += wx * wy * (MNISTCU__INK(ix, iy) - low) * (255.0 / (peak - low)); /* stretched */
                        area += wx * wy;
                    }
                patch[(size_t)py * pw + px] = (float)(area > 0 ? acc / area : 0.0);
                mass += patch[(size_t)py * pw + px];
                cx += px * (double)patch[(size_t)py * pw + px];
                cy += py * (double)patch[(size_t)py * pw + px];
            }
        /* the centre of mass at the centre of the output */
        offx = (int)floor(size / 2.0 - (mass > 0 ? cx / mass : pw / 2.0) - 0.5 + 0.5);
        offy = (int)floor(size / 2.0 - (mass > 0 ? cy / mass : ph / 2.0) - 0.5 + 0.5);
        memset(out, 0, (size_t)size * size);
        for (py = 0; py < ph; ++py)
            for (px = 0; px < pw; ++px) {
                int ox = px + offx, oy = py + offy;
                if (ox >= 0 && ox < size && oy >= 0 && oy < size)
                    out[(size_t)oy * size + ox] = (uint8_t)MNISTCU__MIN(255.0, floor(patch[(size_t)py * pw + px] + 0.5));
            }
        mnistcu__free(ctx, patch);
    }
#undef MNISTCU__INK
    return MNISTCU_OK;
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

/* A resolved precision's name, as logs and device names give it. */
static const char *mnistcu__precision_name(int p)
{
    return p == MNISTCU_PRECISION_TF32 ? "TF32" : p == MNISTCU_PRECISION_BF16 ? "BF16"
           : p == MNISTCU_PRECISION_TF32X3 ? "TF32X3" : "FP32";
}

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
        d.threads < 0 || d.cuda_device < 0 || (unsigned)d.gemm > MNISTCU_GEMM_CUBLAS || (unsigned)d.cnn > MNISTCU_CNN_CUDNN ||
        (unsigned)d.data_mode > MNISTCU_DATA_STREAM || (unsigned)d.precision > MNISTCU_PRECISION_TF32X3)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "context desc: device %d, log_level %d, threads %d, cuda_device %d, gemm %d, "
                             "data_mode %d or precision %d out of range", (int)d.device, (int)d.log_level, d.threads,
                             d.cuda_device, (int)d.gemm, (int)d.data_mode, (int)d.precision);
    if (ctx->desc.precision == MNISTCU_PRECISION_DEFAULT) ctx->desc.precision = MNISTCU_PRECISION_FP32;
    if ((d.allocator.device_alloc == NULL) != (d.allocator.device_free == NULL))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "allocator: give both device_alloc and device_free");
#ifndef MNISTCU_CUBLAS
    if (d.gemm == MNISTCU_GEMM_CUBLAS)
        return mnistcu__fail(ctx, MNISTCU_ERR_UNSUPPORTED, "gemm CUBLAS asked, but this build has no MNISTCU_CUBLAS");
#endif
#ifndef MNISTCU_CUDNN
    if (d.cnn == MNISTCU_CNN_CUDNN)
        return mnistcu__fail(ctx, MNISTCU_ERR_UNSUPPORTED, "cnn CUDNN asked, but this build has no MNISTCU_CUDNN");
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
    if (ctx->device == MNISTCU_DEVICE_CPU) {
        snprintf(ctx->device_name, sizeof ctx->device_name, "CPU (%d thread%s)", ctx->threads,
                 ctx->threads == 1 ? "" : "s");
        if (ctx->desc.precision != MNISTCU_PRECISION_FP32) {
            mnistcu__log(ctx, MNISTCU_LOG_INFO, "precision %s applies to GPU matrix products: the CPU computes in FP32",
                         mnistcu__precision_name(ctx->desc.precision));
            ctx->desc.precision = MNISTCU_PRECISION_FP32;
        }
    } else if (d.precision > MNISTCU_PRECISION_FP32 && ctx->desc.precision == MNISTCU_PRECISION_FP32) {
        mnistcu__log(ctx, MNISTCU_LOG_WARN, "precision %s needs tensor cores (sm_80 or newer) and code for them in this "
                     "build, and %s has none: computing in FP32", mnistcu__precision_name(d.precision),
                     ctx->device_name);
    }
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
    int32_t *labels;      /* [count]; -1 each when the dataset has float targets */
    float *targets;       /* [count][target_dim] float targets, or NULL */
    size_t target_dim;    /* 0: class labels */
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
    mnistcu__free(ctx, ds->targets);
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

MNISTCU_DEF mnistcu_result mnistcu_dataset_create_targets(mnistcu_ctx *ctx, const float *x, const float *targets,
                                                          size_t count, size_t features, size_t target_dim,
                                                          mnistcu_dataset **out)
{
    mnistcu_dataset *ds = NULL;
    int32_t *labels;
    size_t i, nt;
    mnistcu_result r;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dataset_create_targets: out is NULL");
    *out = NULL;
    if (!targets || target_dim == 0 || target_dim > MNISTCU_MAX_CLASSES)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "dataset_create_targets: targets must be given, target_dim %lu in 1..%d",
                             (unsigned long)target_dim, MNISTCU_MAX_CLASSES);
    if (!mnistcu__mul3(count, target_dim, sizeof(float), &nt) || count > UINT32_MAX)
        return mnistcu__fail(ctx, MNISTCU_ERR_OVERFLOW, "dataset_create_targets: size overflows");
    for (i = 0; i < count * target_dim; ++i)
        if (!mnistcu__finite_f(targets[i]))
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                                 "dataset_create_targets: target %lu of sample %lu is not finite",
                                 (unsigned long)(i % target_dim), (unsigned long)(i / target_dim));
    labels = (int32_t *)mnistcu__calloc(ctx, (count ? count : 1) * sizeof(int32_t));
    if (!labels) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "dataset_create_targets: out of memory");
    r = mnistcu_dataset_create(ctx, x, labels, count, features, 2, &ds);
    mnistcu__free(ctx, labels);
    if (r) return r;
    ds->targets = (float *)mnistcu__alloc(ctx, nt);
    if (!ds->targets) {
        mnistcu_dataset_destroy(ds);
        return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "dataset_create_targets: out of memory");
    }
    memcpy(ds->targets, targets, nt);
    for (i = 0; i < count; ++i) ds->labels[i] = -1;
    ds->target_dim = target_dim;
    ds->num_classes = (int)target_dim;
    *out = ds;
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_dataset_sample_targets(const mnistcu_dataset *ds, size_t i, float *targets)
{
    if (!ds) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!ds->targets || !targets || i >= ds->count)
        return mnistcu__fail(ds->ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "dataset_sample_targets: %s", !ds->targets ? "the dataset has class labels, not targets"
                                                                        : "NULL array or index out of range");
    memcpy(targets, ds->targets + i * ds->target_dim, ds->target_dim * sizeof(float));
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
        ds->targets = NULL;
        ds->count = n;
        ds->labels = (int32_t *)mnistcu__alloc(ctx, n * sizeof(int32_t));
        if (src->targets && !(ds->targets = (float *)mnistcu__alloc(ctx, n * src->target_dim * sizeof(float))))
            goto oom;
        if (src->u8) ds->u8 = (uint8_t *)mnistcu__alloc(ctx, n * src->features);
        else ds->f32 = (float *)mnistcu__alloc(ctx, n * src->features * sizeof(float));
        if (!ds->labels || (!ds->u8 && !ds->f32)) goto oom;
        for (i = 0; i < n; ++i) {
            size_t s = order[begin + i];
            ds->labels[i] = src->labels[s];
            if (src->targets)
                memcpy(ds->targets + i * src->target_dim, src->targets + s * src->target_dim,
                       src->target_dim * sizeof(float));
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
    info->target_dim = ds->target_dim;
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
/* A wider tile where AVX-512 gives 32 vector registers: 6 x 32 accumulators
   (12 zmm, or 24 of the 32 ymm) against 6 x 16 in 12 of AVX2's 16 ymm. Taken
   for products at least MNISTCU__NRW_MIN wide and deep (mnistcu__gemm_nr): on
   a 2-core AVX-512 machine, P7 (784-128-10) took 0.8-0.9x the time with it,
   while LeNet-5's narrow, shallow convolution products ran slower on it and
   keep the 16-wide tile (bench/RESULTS.md). */
#if defined(__AVX512F__)
#define MNISTCU__NRW 32
#else
#define MNISTCU__NRW MNISTCU__NR
#endif
#ifndef MNISTCU__NRW_MIN
#define MNISTCU__NRW_MIN 64
#endif
#define MNISTCU__KC 256
#define MNISTCU__MC 144  /* multiple of MR */
#define MNISTCU__NC 1024 /* multiple of NR */
#define MNISTCU__KC_WHOLE 1024 /* up to this depth, a small op(B) is packed whole (see below) */
#define MNISTCU__GEMM_WORK_FLOATS ((size_t)MNISTCU__MC * MNISTCU__KC_WHOLE + (size_t)MNISTCU__KC * MNISTCU__NC)

static mnistcu_result mnistcu__cpu_reserve(mnistcu_ctx *ctx)
{
    if (ctx->gemm_work) return MNISTCU_OK;
    /* two sets: products may run on two threads at once (the convolutions' samples, >>layer_conv2d) */
    ctx->gemm_work = (float *)mnistcu__alloc(ctx, 2 * MNISTCU__GEMM_WORK_FLOATS * sizeof(float));
    if (!ctx->gemm_work) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory for matrix workspace");
    ctx->gemm_work_floats = 2 * MNISTCU__GEMM_WORK_FLOATS;
    return MNISTCU_OK;
}

/* C tile (mr x nr valid of MR x NR_) = (accumulate ? C : 0) + sum_k a[k][:] * b[k][:].
   One accumulator array per row, the row loop written out: this is the form
   that GCC and Clang both keep in vector registers (a single 2-D array runs
   50x slower under GCC; see bench/cpu_microkernel.c). Written once for both
   tile widths, each a function with constant bounds. */
#define MNISTCU__MICRO_KERNEL(NAME, NR_)                                                                          \
    static void NAME(size_t kc, const float *MNISTCU__RESTRICT a, const float *MNISTCU__RESTRICT b,                \
                     float *MNISTCU__RESTRICT c, size_t ldc, int mr, int nr, int accumulate)                        \
    {                                                                                                             \
        float c0[NR_], c1[NR_], c2[NR_], c3[NR_], c4[NR_], c5[NR_];                                               \
        float *rows[MNISTCU__MR];                                                                                 \
        size_t k;                                                                                                 \
        int i, j;                                                                                                 \
        rows[0] = c0; rows[1] = c1; rows[2] = c2; rows[3] = c3; rows[4] = c4; rows[5] = c5;                       \
        if (mr == MNISTCU__MR && nr == NR_) /* a whole tile: constant bounds, vector loads */                    \
            for (i = 0; i < MNISTCU__MR; ++i)                                                                     \
                for (j = 0; j < NR_; ++j) rows[i][j] = accumulate ? c[i * ldc + j] : 0.0f;                        \
        else                                                                                                      \
            for (i = 0; i < MNISTCU__MR; ++i)                                                                     \
                for (j = 0; j < NR_; ++j) rows[i][j] = (accumulate && i < mr && j < nr) ? c[i * ldc + j] : 0.0f;  \
        for (k = 0; k < kc; ++k) {                                                                                \
            const float *ak = a + k * MNISTCU__MR, *bk = b + k * NR_;                                             \
            float a0 = ak[0], a1 = ak[1], a2 = ak[2], a3 = ak[3], a4 = ak[4], a5 = ak[5];                         \
            for (j = 0; j < NR_; ++j) {                                                                           \
                float bj = bk[j];                                                                                 \
                c0[j] = MNISTCU__FMA(a0, bj, c0[j]);                                                              \
                c1[j] = MNISTCU__FMA(a1, bj, c1[j]);                                                              \
                c2[j] = MNISTCU__FMA(a2, bj, c2[j]);                                                              \
                c3[j] = MNISTCU__FMA(a3, bj, c3[j]);                                                              \
                c4[j] = MNISTCU__FMA(a4, bj, c4[j]);                                                              \
                c5[j] = MNISTCU__FMA(a5, bj, c5[j]);                                                              \
            }                                                                                                     \
        }                                                                                                         \
        if (mr == MNISTCU__MR && nr == NR_)                                                                       \
            for (i = 0; i < MNISTCU__MR; ++i)                                                                     \
                for (j = 0; j < NR_; ++j) c[i * ldc + j] = rows[i][j];                                            \
        else                                                                                                      \
            for (i = 0; i < mr; ++i)                                                                              \
                for (j = 0; j < nr; ++j) c[i * ldc + j] = rows[i][j];                                             \
    }
MNISTCU__MICRO_KERNEL(mnistcu__micro_kernel, MNISTCU__NR)
#if MNISTCU__NRW != MNISTCU__NR
MNISTCU__MICRO_KERNEL(mnistcu__micro_kernel_w, MNISTCU__NRW)
#endif

/* The tile width for an M x N x K product (each output's chain over k is the
   same either way: the width changes no result). */
static size_t mnistcu__gemm_nr(size_t N, size_t K)
{
    return MNISTCU__NRW != MNISTCU__NR && N >= MNISTCU__NRW_MIN && K >= MNISTCU__NRW_MIN ? MNISTCU__NRW : MNISTCU__NR;
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

/* op(B)[k][j] for k in [k0, k0+kc), j in [j0, j0+nc) -> NR_-column micro-panels,
   zero-padded; one function for each tile width, as the micro-kernel. */
#define MNISTCU__PACK_B(NAME, NR_)                                                                                \
    static void NAME(int trans, const float *B, size_t ldb, size_t k0, size_t kc, size_t j0, size_t nc,          \
                     float *dst, size_t panel)                                                                    \
    {                                                                                                             \
        size_t j, k, jb = panel * NR_, valid = nc > jb ? MNISTCU__MIN((size_t)NR_, nc - jb) : 0;                 \
        float *p = dst + panel * NR_ * kc;                                                                        \
        if (!trans) {                                                                                             \
            for (k = 0; k < kc; ++k) {                                                                            \
                const float *src = B + (k0 + k) * ldb + j0 + jb;                                                  \
                float *row = p + k * NR_;                                                                         \
                if (valid == NR_) { /* a whole row: a constant-length copy */                                     \
                    for (j = 0; j < NR_; ++j) row[j] = src[j];                                                    \
                    continue;                                                                                     \
                }                                                                                                 \
                for (j = 0; j < valid; ++j) row[j] = src[j];                                                      \
                for (; j < NR_; ++j) row[j] = 0.0f;                                                               \
            }                                                                                                     \
        } else if (valid == NR_) { /* a transpose: each packed row gathers one k of NR_ rows of B */             \
            const float *src = B + (j0 + jb) * ldb + k0;                                                          \
            for (k = 0; k < kc; ++k) {                                                                            \
                float *row = p + k * NR_;                                                                         \
                for (j = 0; j < NR_; ++j) row[j] = src[j * ldb + k];                                              \
            }                                                                                                     \
        } else {                                                                                                  \
            for (j = 0; j < NR_; ++j) {                                                                           \
                const float *src = B + (j0 + jb + j) * ldb + k0;                                                  \
                if (j < valid)                                                                                    \
                    for (k = 0; k < kc; ++k) p[k * NR_ + j] = src[k];                                             \
                else                                                                                              \
                    for (k = 0; k < kc; ++k) p[k * NR_ + j] = 0.0f;                                               \
            }                                                                                                     \
        }                                                                                                         \
    }
MNISTCU__PACK_B(mnistcu__pack_b, MNISTCU__NR)
#if MNISTCU__NRW != MNISTCU__NR
MNISTCU__PACK_B(mnistcu__pack_b_w, MNISTCU__NRW)
#endif

/* Which of the two sets of packing buffers a product on this thread uses. */
static size_t mnistcu__work_set(void)
{
#ifdef _OPENMP
    return omp_in_parallel() && omp_get_thread_num() == 1 ? 1 : 0;
#else
    return 0;
#endif
}

/* C = op(A) op(B), or C += op(A) op(B) with accumulate (each element then adds
   its new sum over k, in order, to what C held). */
static void mnistcu__cpu_gemm_acc(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K, const float *A,
                                  size_t lda, const float *B, size_t ldb, float *C, size_t ldc, int accumulate)
{
    /* The depth of a block: KC, or all of K when the whole of op(B) and an MC-row
       panel of op(A) fit the workspace (P2's first layer: K 784, N 128), which
       saves the packing and barriers of the blocks after the first. Either way
       each element of C is one fma chain over k in order (a later block goes on
       from the value the earlier left in C), so this changes no result. */
    size_t kc_max = K <= MNISTCU__KC_WHOLE && K * N <= (size_t)MNISTCU__KC * MNISTCU__NC / 2 ? K : MNISTCU__KC;
    /* called from inside a parallel region (thread 0 or 1 of two), a product takes that thread's set */
    float *bp = ctx->gemm_work + mnistcu__work_set() * MNISTCU__GEMM_WORK_FLOATS,
          *ap = bp + (size_t)MNISTCU__KC * MNISTCU__NC;
#ifdef _OPENMP
    /* Below a million multiply-adds (P7's output layer) a product takes a few
       microseconds, and its barriers would cost more than a second thread
       saves. Above it threads pay even for P7's 64x128x784 (about 160 us on one
       core, 110 on two, since whole-K packing leaves three barriers), though a
       descheduled thread on a shared machine stalls every barrier for a time
       slice. */
    int threads = (double)M * (double)N * (double)K < 1.0e6 ? 1 : ctx->threads;
#endif
    const size_t nr = mnistcu__gemm_nr(N, K);
    if (K == 0) {
        size_t i;
        if (!accumulate)
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
            size_t nc = MNISTCU__MIN((size_t)MNISTCU__NC, N - jc), npanels = (nc + nr - 1) / nr;
            for (pc = 0; pc < K; pc += kc_max) {
                size_t kc = MNISTCU__MIN(kc_max, K - pc);
                long jp;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                for (jp = 0; jp < (long)npanels; ++jp) {
#if MNISTCU__NRW != MNISTCU__NR
                    if (nr == MNISTCU__NRW) {
                        mnistcu__pack_b_w(tb, B, ldb, pc, kc, jc, nc, bp, (size_t)jp);
                        continue;
                    }
#endif
                    mnistcu__pack_b(tb, B, ldb, pc, kc, jc, nc, bp, (size_t)jp);
                }
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
                        /* column-panel major: a thread works on the panels of op(B) it packed
                           itself (the same static split), the larger operand staying in its cache */
                        size_t jpn = (size_t)t / mpanels, ipn = (size_t)t % mpanels;
                        size_t i0 = ipn * MNISTCU__MR, j0 = jpn * nr;
                        const float *at = ap + ipn * MNISTCU__MR * kc, *bt = bp + jpn * nr * kc;
                        float *ct = C + (ic + i0) * ldc + jc + j0;
                        const int mr = (int)MNISTCU__MIN((size_t)MNISTCU__MR, mc - i0), nv = (int)MNISTCU__MIN(nr, nc - j0);
#if MNISTCU__NRW != MNISTCU__NR
                        if (nr == MNISTCU__NRW) {
                            mnistcu__micro_kernel_w(kc, at, bt, ct, ldc, mr, nv, accumulate || pc > 0);
                            continue;
                        }
#endif
                        mnistcu__micro_kernel(kc, at, bt, ct, ldc, mr, nv, accumulate || pc > 0);
                    }
                }
            }
        }
    }
}

static void mnistcu__cpu_gemm(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K, const float *A,
                              size_t lda, const float *B, size_t ldb, float *C, size_t ldc)
{
    mnistcu__cpu_gemm_acc(ctx, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, 0);
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

/* y[B][OUT] = act(y + b), in place after the product; bias may be NULL. */
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
        if (!bias) {
            if (act != MNISTCU_ACT_IDENTITY)
                for (j = 0; j < OUT; ++j) row[j] = mnistcu__act_f(act, row[j]);
        } else if (act == MNISTCU_ACT_RELU) {
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

/* The first arg-max of a row of C logits (*arg) and its value. */
static MNISTCU__HD float mnistcu__row_max(const float *z, size_t C, size_t *arg)
{
    float m = z[0];
    size_t j;
    *arg = 0;
    for (j = 1; j < C; ++j)
        if (z[j] > m) {
            m = z[j];
            *arg = j;
        }
    return m;
}

/* Softmax cross-entropy's end for one row of logits z with max m, where s is
   the sum of e^(z[j] - m) in order and g (may be NULL) holds each e^(z[j] - m):
   the loss, and g = (softmax(z) - onehot(label)) * grad_scale. Its sums and
   products are each rounded (MNISTCU__ADD, MNISTCU__MUL), and so is s's, so the
   fused MLP kernel, which makes a row's e^(z[j] - m) on many threads and this
   end on one, has the same bits as mnistcu__softmax_ce_row in any kernel. */
static MNISTCU__HD void mnistcu__softmax_ce_end(const float *z, int32_t label, size_t C, float m, float s,
                                                float grad_scale, float *g, float *loss)
{
    size_t j;
    *loss = MNISTCU__ADD(m, logf(s)) - z[label];
    if (g) {
        const float inv = 1.0f / s;
        for (j = 0; j < C; ++j) g[j] = MNISTCU__MUL(MNISTCU__MUL(g[j], inv), grad_scale);
        g[label] -= grad_scale;
    }
}

/* Softmax cross-entropy of one row of C logits, fused with its gradient:
   loss = logsumexp(z) - z[label]; g = (softmax(z) - onehot(label)) * grad_scale.
   g may be NULL (evaluation), else must not overlap z; *pred gets the first arg-max. */
static MNISTCU__HD void mnistcu__softmax_ce_row(const float *z, int32_t label, size_t C, float grad_scale, float *g,
                                                float *loss, int32_t *pred)
{
    size_t j, arg;
    const float m = mnistcu__row_max(z, C, &arg);
    float s = 0.0f;
    for (j = 0; j < C; ++j) {
        const float e = expf(z[j] - m);
        s = MNISTCU__ADD(s, e);
        if (g) g[j] = e;
    }
    *pred = (int32_t)arg;
    mnistcu__softmax_ce_end(z, label, C, m, s, grad_scale, g, loss);
}

/* ---- losses ----------------------------------------------------------------
   One sample's loss against a class label, or against a float target vector t
   when t is given (regression, multi-label, soft labels), with PyTorch's
   definitions; g (may be NULL; not overlapping z) receives d(batch loss)/dz, grad_scale being 1/B
   for the mean reduction and 1 for the sum. *loss is the sample's share such
   that the mean over the batch is PyTorch's mean reduction (its sum, the sum
   reduction). pred is the argmax of z either way.
     SOFTMAX_CE  CrossEntropyLoss, label smoothing e: the target is
                 (1-e) onehot(y) + e/C (or (1-e) t + e/C)
     MSE         MSELoss: (z - t)^2 averaged over the C outputs (mean), t =
                 onehot(y) for class labels
     BCE         BCEWithLogitsLoss: max(z,0) - z t + log(1 + e^-|z|), averaged
                 over the C outputs (mean)
     HINGE       MultiMarginLoss: sum over j != y of max(0, margin - z_y + z_j)^p / C */
typedef struct mnistcu__lossp {
    int kind;          /* mnistcu_loss, resolved */
    int sum;           /* 1: sum reduction */
    int p;             /* HINGE: 1 or 2 */
    float smoothing;   /* SOFTMAX_CE */
    float margin;      /* HINGE */
} mnistcu__lossp;

static MNISTCU__HD void mnistcu__loss_row(const mnistcu__lossp *lp, const float *z, int32_t y, const float *t,
                                          size_t C, float grad_scale, float *g, float *loss, int32_t *pred)
{
    float acc = 0.0f, e = lp->sum ? grad_scale : grad_scale / (float)C;
    size_t j, arg;
    const float mx = mnistcu__row_max(z, C, &arg);
    switch (lp->kind) {
    case MNISTCU_LOSS_MSE:
        for (j = 0; j < C; ++j) {
            float d = z[j] - (t ? t[j] : (float)((int32_t)j == y));
            acc += MNISTCU__MUL(d, d);
            if (g) g[j] = 2.0f * d * e;
        }
        *loss = lp->sum ? acc : acc / (float)C;
        break;
    case MNISTCU_LOSS_BCE:
        for (j = 0; j < C; ++j) {
            float x = z[j], tj = t ? t[j] : (float)((int32_t)j == y), ex = expf(-fabsf(x));
            acc += (x > 0.0f ? x : 0.0f) - MNISTCU__MUL(x, tj) + log1pf(ex);
            if (g) g[j] = ((x >= 0.0f ? 1.0f / (1.0f + ex) : ex / (1.0f + ex)) - tj) * e;
        }
        *loss = lp->sum ? acc : acc / (float)C;
        break;
    case MNISTCU_LOSS_HINGE: {
        float zy = z[y], gy = 0.0f, inv = 1.0f / (float)C;
        for (j = 0; j < C; ++j) {
            float v = lp->margin - zy + z[j];
            if (g) g[j] = 0.0f;
            if ((int32_t)j == y || !(v > 0.0f)) continue;
            acc += lp->p == 2 ? MNISTCU__MUL(v, v) : v;
            if (g) {
                float d = (lp->p == 2 ? 2.0f * v : 1.0f) * inv * grad_scale;
                g[j] = d;
                gy -= d;
            }
        }
        if (g) g[y] = gy;
        *loss = acc * inv;
        break;
    }
    default: { /* SOFTMAX_CE */
        float s = 0.0f, lse, sum_t = 0.0f, eps = lp->smoothing, off = eps / (float)C;
        if (!t && eps == 0.0f) { /* a class label: the plain form */
            mnistcu__softmax_ce_row(z, y, C, grad_scale, g, loss, pred);
            return;
        }
        for (j = 0; j < C; ++j) s += expf(z[j] - mx);
        lse = mx + logf(s);
        for (j = 0; j < C; ++j) {
            float tj = (t ? t[j] : (float)((int32_t)j == y)) * (1.0f - eps) + off;
            sum_t += tj;
            acc -= tj * (z[j] - lse);
        }
        *loss = acc;
        if (g) {
            float inv = 1.0f / s;
            for (j = 0; j < C; ++j) {
                float tj = (t ? t[j] : (float)((int32_t)j == y)) * (1.0f - eps) + off;
                g[j] = (expf(z[j] - mx) * inv * sum_t - tj) * grad_scale;
            }
        }
    }
    }
    *pred = (int32_t)arg;
}

/* The same over a batch of logits [B][C]; targets [B][C] or NULL (class
   labels); grad may be NULL. */
static void mnistcu__cpu_loss(mnistcu_ctx *ctx, const mnistcu__lossp *lp, const float *logits, const int32_t *labels,
                              const float *targets, size_t B, size_t C, float grad_scale, float *grad, float *loss,
                              int32_t *pred)
{
    long i;
    (void)ctx;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (B * C > 65536)
#endif
    for (i = 0; i < (long)B; ++i)
        mnistcu__loss_row(lp, logits + (size_t)i * C, labels[i], targets ? targets + (size_t)i * C : NULL, C,
                          grad_scale, grad ? grad + (size_t)i * C : NULL, &loss[i], &pred[i]);
}

/* ---- optimizers ------------------------------------------------------------
   One element of one optimizer step, shared by the CPU loop and the CUDA
   kernel, in torch.optim's single-tensor order of operations. The state arena
   holds `slots` arrays of n floats (slot k of parameter i at s[k*n + i]):
     SGD      momentum buffer (with momentum)
     ADAM(W)  exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad)
     RMSPROP  square_avg, momentum_buffer (with momentum), grad_avg (centered)
     ADAGRAD  sum
   Scalars that depend on the step (bias corrections, Adagrad's rate) are
   computed once per step on the host, in double as Python does. */
typedef struct mnistcu__opt {
    int kind;            /* mnistcu_optim, resolved */
    int nesterov, amsgrad, centered, has_momentum;
    int first;           /* SGD: the momentum buffer's first step (it takes g itself) */
    float lr, mu, damp, wd, b1, b2, eps, alpha;
    float step_size;     /* ADAM(W): lr / (1 - b1^t) */
    float bc2_sqrt;      /* ADAM(W): sqrt(1 - b2^t) */
    float clr;           /* ADAGRAD: lr / (1 + (t-1) lr_decay) */
    float c1, c2, calpha, cdamp; /* 1 - b1, 1 - b2, 1 - alpha, 1 - damp (of the decimals, as Python computes them) */
    float decay_mult;    /* ADAMW: 1 - lr*wd */
    size_t n;            /* parameters */
} mnistcu__opt;

/* The decimals of an optimizer's seven scalars, kept by the model: a float's
   text is found by up to nine printings and parsings, and an epoch makes a
   thousand or more steps' scalars (the fused kernels make them all at once). A
   slot is made again only when its float's bits change (a schedule's rate). */
typedef struct mnistcu__opt_memo {
    int have[7];
    float key[7];
    double val[7];
} mnistcu__opt_memo;

/* Up to one range of the parameter arena per layer: where the dense and conv weights are. */
typedef struct mnistcu__ranges {
    int count;
    size_t off[MNISTCU_MAX_MODEL_LAYERS], len[MNISTCU_MAX_MODEL_LAYERS];
} mnistcu__ranges;

/* torch.lerp(a, b, w) for a scalar weight */
static MNISTCU__HD float mnistcu__lerp(float a, float b, float w)
{
    return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

/* Parameter i: w[i] and its state slots after a step with gradient g (clipped
   already), one function per kind; mnistcu__opt_one picks it per parameter (the
   kernels), the CPU loop once per step. */
static MNISTCU__HD void mnistcu__opt_adam(const mnistcu__opt *o, size_t i, float *w, float g, float *s)
{
    float p = w[i], denom, *m1 = &s[i], *m2 = &s[o->n + i], v2;
    if (o->kind == MNISTCU_OPTIM_ADAMW) p *= o->decay_mult;
    else if (o->wd != 0.0f) g = g + o->wd * p;
    *m1 = mnistcu__lerp(*m1, g, o->c1);
    *m2 = *m2 * o->b2 + o->c2 * g * g;
    v2 = *m2;
    if (o->amsgrad) {
        float *mx = &s[2 * o->n + i];
        if (v2 > *mx) *mx = v2;
        v2 = *mx;
    }
    denom = sqrtf(v2) / o->bc2_sqrt + o->eps;
    w[i] = p + (-o->step_size) * *m1 / denom;
}

static MNISTCU__HD void mnistcu__opt_rmsprop(const mnistcu__opt *o, size_t i, float *w, float g, float *s)
{
    float p = w[i], *sq = &s[i], avg, *v;
    size_t k = 1, n = o->n;
    if (o->wd != 0.0f) g = g + o->wd * p;
    *sq = *sq * o->alpha + o->calpha * g * g;
    v = o->has_momentum ? &s[(k++) * n + i] : NULL;
    if (o->centered) {
        float *ga = &s[k * n + i];
        *ga = mnistcu__lerp(*ga, g, o->calpha);
        avg = sqrtf(*sq - *ga * *ga);
    } else {
        avg = sqrtf(*sq);
    }
    avg = avg + o->eps;
    if (v) {
        *v = *v * o->mu + g / avg;
        w[i] = p + (-o->lr) * *v;
    } else {
        w[i] = p + (-o->lr) * g / avg;
    }
}

static MNISTCU__HD void mnistcu__opt_adagrad(const mnistcu__opt *o, size_t i, float *w, float g, float *s)
{
    float p = w[i], *sum = &s[i], denom;
    if (o->wd != 0.0f) g = g + o->wd * p;
    *sum = *sum + g * g;
    denom = sqrtf(*sum) + o->eps;
    w[i] = p + (-o->clr) * g / denom;
}

/* SGD's step of a parameter p with gradient g and, with momentum, its buffer
   *v: the new p (a value form, for kernels that load and store p themselves).
   Each add_(x, alpha) of torch.optim.SGD as one fused multiply-add, as
   PyTorch's own kernels do (buf * momentum rounded first): the same bits in
   every loop and kernel that runs it (MNISTCU__FMA). */
static MNISTCU__HD float mnistcu__sgd_step(const mnistcu__opt *o, float p, float g, float *v)
{
    float d = g;
    if (o->wd != 0.0f) d = MNISTCU__FMA(o->wd, p, d);
    if (o->has_momentum) {
        *v = o->first ? d : MNISTCU__FMA(o->cdamp, d, *v * o->mu);
        d = o->nesterov ? MNISTCU__FMA(o->mu, *v, d) : *v;
    }
    return MNISTCU__FMA(-o->lr, d, p);
}

static MNISTCU__HD void mnistcu__opt_sgd(const mnistcu__opt *o, size_t i, float *w, float g, float *s)
{
    w[i] = mnistcu__sgd_step(o, w[i], g, o->has_momentum ? &s[i] : NULL);
}

#ifdef __CUDACC__ /* the kernels' form; the CPU chooses per step (below) */
static __device__ void mnistcu__opt_one(const mnistcu__opt *o, size_t i, float *w, float g, float *s)
{
    switch (o->kind) {
    case MNISTCU_OPTIM_ADAM:
    case MNISTCU_OPTIM_ADAMW: mnistcu__opt_adam(o, i, w, g, s); return;
    case MNISTCU_OPTIM_RMSPROP: mnistcu__opt_rmsprop(o, i, w, g, s); return;
    case MNISTCU_OPTIM_ADAGRAD: mnistcu__opt_adagrad(o, i, w, g, s); return;
    default: mnistcu__opt_sgd(o, i, w, g, s); return;
    }
}
#endif

/* One step over the flat arena; coef scales every gradient (clipping; 1: none).
   The kind is chosen once, and the loop works on a private copy of the step's
   scalars, which no store through w or state can change: the compiler then
   takes the invariant tests out of the loop and vectorises it (plain SGD over
   P7's 101,770 parameters: 13 us a step, against 269 us with the choice made
   per parameter). */
#define MNISTCU__GI (coef == 1.0f ? g[i] : g[i] * coef)
static void mnistcu__cpu_optim(mnistcu_ctx *ctx, const mnistcu__opt *o, float *w, const float *g, float *state,
                               float coef)
{
    const mnistcu__opt k = *o;
    const long n = (long)k.n;
    long i;
    (void)ctx;
    switch (k.kind) {
    case MNISTCU_OPTIM_ADAM:
    case MNISTCU_OPTIM_ADAMW: { /* braces: C++ wants a statement after a label, a pragma is not one */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (n >= 65536)
#endif
        for (i = 0; i < n; ++i) mnistcu__opt_adam(&k, (size_t)i, w, MNISTCU__GI, state);
    } break;
    case MNISTCU_OPTIM_RMSPROP: {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (n >= 65536)
#endif
        for (i = 0; i < n; ++i) mnistcu__opt_rmsprop(&k, (size_t)i, w, MNISTCU__GI, state);
    } break;
    case MNISTCU_OPTIM_ADAGRAD: {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (n >= 65536)
#endif
        for (i = 0; i < n; ++i) mnistcu__opt_adagrad(&k, (size_t)i, w, MNISTCU__GI, state);
    } break;
    default:
        /* with and without momentum apart: one loop for both was vectorised with the momentum buffer's
           loads masked off, whose addresses (no buffer: from NULL) then cost P7 1.3-1.9x its epoch */
        if (k.has_momentum) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (n >= 65536)
#endif
            for (i = 0; i < n; ++i) mnistcu__opt_sgd(&k, (size_t)i, w, MNISTCU__GI, state);
        } else {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if (n >= 65536)
#endif
            for (i = 0; i < n; ++i) w[i] = mnistcu__sgd_step(&k, w[i], MNISTCU__GI, NULL);
        }
        break;
    }
}
#undef MNISTCU__GI

/* >>cuda_core -------------------------------------------------------------------
   What every CUDA kernel launcher needs: the context's GPU state, error checks
   that latch unrecoverable errors, device allocation through the hooks, launch
   sizes. The kernels of each operation sit in the operation's own section,
   right after its CPU reference; the matrix product and the data path are in
   >>cuda at the end. */
#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <type_traits>
#ifdef MNISTCU_CUBLAS
#include <cublas_v2.h>
#endif
#ifdef MNISTCU_CUDNN
#include <cudnn.h>
#endif

/* What a stream's products use: the stream, the split-K parts and counters, and a
   cuBLAS handle with its workspace. The context's own are fields of mnistcu__cuda;
   a step's branch swaps in a second set while it is launched (>>cuda_side). */
typedef struct mnistcu__cuda_lane {
    cudaStream_t stream;
    float *splitk;
    size_t splitk_floats;
    int *wide_flags;
#ifdef MNISTCU_CUBLAS
    cublasHandle_t blas;
    void *blas_ws, *blas_ws_raw;
    size_t blas_ws_bytes;
#endif
} mnistcu__cuda_lane;

typedef struct mnistcu__cuda {
    int device;
    cudaStream_t stream;       /* compute */
    cudaStream_t copy_stream;  /* streaming mode: host-to-device batch copies */
    cudaError_t sticky;        /* latched unrecoverable error, cudaSuccess if none */
    int use_cublas;
    int use_cudnn;
    int precision;             /* mnistcu_precision of the matrix products, resolved: FP32, TF32, BF16 or TF32X3 */
    int sms;                   /* multiprocessors */
    unsigned x3_smem;          /* bit 2 ta + tb: mnistcu__k_gemm_x3<ta, tb> was given its shared memory */
    size_t x3_products;        /* products mnistcu__cuda_gemm_x3 took (the tests read it) */
    size_t smem_optin;         /* the most shared memory a block may ask for */
    int mc_clusters[32];       /* the cluster MLP kernel's instances, each without and with 1-3 slots of W1's
                                  optimizer state in shared memory: 1 + the most clusters resident at once
                                  (0: not asked yet; 1: none, or the instance cannot run here) */
    float *splitk;             /* partial sums of split-K products, grown on demand */
    size_t splitk_floats;
    int *wide_flags;           /* the wide-tile product's arrival counters, one a tile, zero between products */
    int *finite_flag;          /* the divergence check's flag on the host, pinned: one for the context, made
                                  at its first check (cudaMallocHost took 1.1-1.4 ms, a third of an epoch of
                                  P1, each time a new model's first training made its own; bench/RESULTS.md) */
    uint64_t frees;            /* device buffers freed so far: a captured step graph whose count differs
                                  may hold a freed address, and is captured again (see >>cuda_graph) */
#ifdef MNISTCU_CUBLAS
    void *blas_ws;             /* cuBLAS's workspace, ours (made at the first product; 256-byte aligned
                                  in blas_ws_raw): the same in launched and captured products, and no
                                  allocation inside a capture. NULL after a failed try: cuBLAS's own */
    void *blas_ws_raw;
    size_t blas_ws_bytes;      /* its size: what cuBLAS suggests, 32 MiB from Hopper on, 4 MiB before
                                  (0 once a try failed: no step graphs with cuBLAS then) */
#endif
#ifdef MNISTCU_CUBLAS
    cublasHandle_t blas;
#endif
#ifdef MNISTCU_CUDNN
    cudnnHandle_t dnn;
    void *dnn_ws;              /* cuDNN's workspace, grown on demand */
    size_t dnn_ws_bytes;
#endif
    mnistcu__cuda_lane *side;  /* the second stream of a step's branches (>>cuda_side); NULL until the first */
    cudaEvent_t side_fork, side_join;
    int side_broken;           /* it could not be made: no branches */
    int side_off;              /* 1: no branches (the tests compare steps with and without) */
    uint64_t side_forks;       /* branches launched so far (the tests) */
} mnistcu__cuda;

/* A dataset's copy on the GPU (resident mode). */
typedef struct mnistcu__cuda_dataset {
    uint8_t *u8;      /* [count][features] or NULL */
    float *f32;       /* [count][features] or NULL */
    int32_t *labels;  /* [count] */
    float *targets;   /* [count][target_dim] or NULL */
} mnistcu__cuda_dataset;

#define MNISTCU__STREAM_SLOTS 2

/* What differs from one training step to the next, on the device: a step
   replayed from a CUDA graph reads it from here, where kernels launched one by
   one take it as arguments. The kernels that take it (gather, augmentation,
   dropout, statistics, optimizer) use these values when given a pointer, else
   their arguments. */
typedef struct mnistcu__dyn {
    mnistcu__opt opt;    /* the optimizer's scalars (the rate, bias corrections) */
    uint64_t step;       /* the model's step count before this step: dropout's and augmentation's counter */
    uint64_t offset;     /* the batch's first position in the epoch's sample order */
    uint64_t slot;       /* the step within its epoch: where its statistics go */
} mnistcu__dyn;

/* One captured training step, for batches of b samples. */
typedef struct mnistcu__step_graph {
    cudaGraphExec_t exec; /* NULL until captured */
    size_t b;             /* batch size it was captured for */
    uint64_t frees;       /* mnistcu__cuda.frees when it was captured */
    int warm;             /* a step of this size ran launched since the graphs were reset: buffers grown */
    int nodes;            /* kernels and copies in it */
    int head_off;         /* the model's head_off when it was captured (the head is in the graph or not) */
    int upd_off;          /* ... and its upd_off */
    int scratch_layer, batch_targets; /* the model's host state as the captured step left it, */
    size_t scratch_batch;             /* set again at each replay (mnistcu__step_host_effects) */
    int upd;                          /* the step took optimizer steps in its products (counted) */
} mnistcu__step_graph;

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
    void *prep;               /* l2 and clipping: per-block sums of squares (double), then the factor (float) */
    mnistcu__opt *fused_opt;  /* [fused_cap] the fused kernels' per-step optimizer scalars */
    size_t fused_cap;
    size_t fused_nops;        /* how many of them the chunk made (mnistcu__opt_steps): later steps take the last */
    mnistcu__opt fused_last[2]; /* what fused_opt holds when fused_last_n is 1 or 2: the same scalars are not */
    size_t fused_last_n;        /* uploaded again (with SGD, every chunk after the first step's) */
    float *lenet;             /* the fused LeNet-5 kernel's rows a sample (mnistcu__lenet_floats, and 16 bytes to
                                 align them), made on first use */
    unsigned long long *mc_pz; /* the cluster MLP kernel's partial logits with their steps, rows (made on first
                                  use), and */
    float *mc_rows;
    size_t mc_rows_cap;
    unsigned mc_step;         /* ... this model's steps in it so far (what the partial logits carry) */
    /* the training step as a CUDA graph (see >>cuda_graph) */
    mnistcu__dyn *dyn;        /* [dyn_cap] a chunk's per-step values, then the current step's, then the cursor */
    size_t dyn_cap;
    const mnistcu__dyn *dyn_cur; /* while a step is captured: where its kernels read the per-step values */
    mnistcu__step_graph graphs[2]; /* full batches, and an epoch's partial last batch */
} mnistcu__cuda_model;

static mnistcu__cuda *mnistcu__cu(const mnistcu_ctx *ctx) { return (mnistcu__cuda *)ctx->cuda; }
static const mnistcu__dyn *mnistcu__cuda_dyn(const mnistcu_model *m);

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
    if (mnistcu__cu(ctx)) mnistcu__cu(ctx)->frees++;
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

/* >>cuda_pdl -----------------------------------------------------------------------
   Programmatic dependent launch (Hopper and newer): each of our kernels is
   launched with cudaLaunchAttributeProgrammaticStreamSerialization and begins
   with MNISTCU__PDL_WAIT (griddepcontrol.wait), before its first access to
   memory. The next kernel's grid is then launched as the blocks of the one
   before exit, instead of after that kernel has completed, and waits there
   until the one before has completed and its writes are visible: the same
   order of every memory access as plain launches, and the launch's latency
   hidden (bench/pdl.cu: a kernel boundary in a graph 1.23 -> 0.92 us for
   small kernels, 2.52 -> 2.35 for 1M floats, on the H100). No kernel releases
   its dependents early (griddepcontrol.launch_dependents at a kernel's start
   made every step slower: the waiting blocks took the slots of blocks still to
   run, bench/RESULTS.md). Kernels of cuBLAS and cuDNN launch as before. On a
   GPU before sm_90, with code built for an older target (the instruction
   absent), with a driver older than CUDA 12.3 (graphs could not capture the
   launches), or with -DMNISTCU_NO_PDL (implied by a runtime before 12.3),
   kernels launch plainly: mnistcu__pdl_dev says per device, set where a
   context is made. The test every_cuda_kernel_waits_first checks that every
   kernel begins with the wait and that every launch comes through here. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MNISTCU__PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define MNISTCU__PDL_WAIT() ((void)0)
#endif
#define MNISTCU__PDL_DEVICES 64
static int mnistcu__pdl_dev[MNISTCU__PDL_DEVICES];

/* programmatic edges in captured graphs: CUDA 12.3; cudaLaunchKernelEx: 11.8 */
#if !defined(MNISTCU_NO_PDL) && CUDART_VERSION < 12030
#define MNISTCU_NO_PDL
#endif
template <typename T> struct mnistcu__as { typedef T type; }; /* the arguments take the kernel's types (NULL too) */
template <typename... P>
static void mnistcu__launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                            typename mnistcu__as<P>::type... a)
{
#ifdef MNISTCU_NO_PDL
    k<<<grid, block, smem, st>>>(a...);
#else
    cudaLaunchConfig_t c = cudaLaunchConfig_t();
    cudaLaunchAttribute at[1];
    int dev = 0;
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = st;
    if (cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < MNISTCU__PDL_DEVICES && mnistcu__pdl_dev[dev]) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        c.attrs = at;
        c.numAttrs = 1;
    }
    (void)cudaLaunchKernelEx(&c, k, a...); /* a failure is the last error, which MNISTCU__LAUNCHED reads */
#endif
}

static mnistcu_result mnistcu__cuda_gemm(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K, const float *A,
                                         size_t lda, const float *B, size_t ldb, float *C, size_t ldc,
                                         const float *bias, int act);
static int mnistcu__cuda_side_ready(mnistcu_ctx *ctx);
static mnistcu_result mnistcu__cuda_fork(mnistcu_ctx *ctx);
static mnistcu_result mnistcu__cuda_unfork(mnistcu_ctx *ctx, mnistcu_result r);
static mnistcu_result mnistcu__cuda_join(mnistcu_ctx *ctx);
/* A weight gradient's optimizer step in its product's epilogue (>>cuda_update):
   the layer's parameters and their state (w and s for the weights, bw and bs
   for the bias), the step's scalars (opt, or dyn's in a replayed graph). */
typedef struct mnistcu__wupd {
    float *w, *s, *bw, *bs;
    const struct mnistcu__dyn *dyn;
    mnistcu__opt opt;
} mnistcu__wupd;
static int mnistcu__cuda_gemm_x_takes(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K, const float *A,
                                      size_t lda, const float *B, size_t ldb, const float *C, size_t ldc,
                                      const float *db);
static mnistcu_result mnistcu__cuda_gemm_x(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K,
                                           const float *A, size_t lda, const float *B, size_t ldb, float *C,
                                           size_t ldc, int act, const float *y, float *db,
                                           const mnistcu__wupd *upd, int *done);
#ifdef MNISTCU_CUBLAS
static mnistcu_result mnistcu__cuda_dx_act(mnistcu_ctx *ctx, size_t M, size_t N, size_t K, const float *A,
                                           const float *B, float *C, const float *y, int act, int *done);
#endif
static cudaStream_t mnistcu__cuda_stream(const mnistcu_ctx *ctx) { return mnistcu__cu(ctx)->stream; }

/* a / b and a % b for sizes: 32-bit division when both fit, which the GPU does in a
   few instructions, where 64-bit division is a long emulated sequence. */
static __device__ __forceinline__ size_t mnistcu__div(size_t a, size_t b)
{
    return ((a | b) >> 32) ? a / b : (size_t)((unsigned)a / (unsigned)b);
}
static __device__ __forceinline__ size_t mnistcu__mod(size_t a, size_t b)
{
    return ((a | b) >> 32) ? a % b : (size_t)((unsigned)a % (unsigned)b);
}

/* A buffer of at least n floats for partial sums (split-K products, direct
   convolution weight gradients), kept in the context and grown on demand. */
static mnistcu_result mnistcu__cuda_partials(mnistcu_ctx *ctx, size_t n, float **out)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu_result r;
    if (n > cu->splitk_floats) {
        cudaStreamSynchronize(cu->stream); /* the old buffer may still be in use */
        mnistcu__cuda_free(ctx, cu->splitk);
        cu->splitk = NULL;
        cu->splitk_floats = 0;
        if ((r = mnistcu__cuda_malloc(ctx, (void **)&cu->splitk, n * sizeof(float), "partial sums"))) return r;
        cu->splitk_floats = n;
    }
    *out = cu->splitk;
    return MNISTCU_OK;
}

/* The wide-tile product's counters (split products of at most this many tiles). */
#define MNISTCU__WIDE_FLAGS 128
static mnistcu_result mnistcu__cuda_wide_flags(mnistcu_ctx *ctx, int **out)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu_result r;
    if (!cu->wide_flags) {
        int *f = NULL;
        if ((r = mnistcu__cuda_malloc(ctx, (void **)&f, MNISTCU__WIDE_FLAGS * sizeof(int), "split counters"))) return r;
        if ((r = mnistcu__cuda_check(ctx, cudaMemsetAsync(f, 0, MNISTCU__WIDE_FLAGS * sizeof(int), cu->stream), "split counters"))) {
            mnistcu__cuda_free(ctx, f);
            return r;
        }
        cu->wide_flags = f;
    }
    *out = cu->wide_flags;
    return MNISTCU_OK;
}
/* ---- cuDNN (MNISTCU_CUDNN): the optional path for convolution, pooling and batch
   norm, through cuDNN's legacy API (deprecated in cuDNN 9, still supported),
   with deterministic algorithms and FP32 arithmetic only (no TF32). */
#ifdef MNISTCU_CUDNN
static int mnistcu__use_cudnn(const mnistcu_ctx *ctx) { return mnistcu__cu(ctx)->use_cudnn; }

static mnistcu_result mnistcu__dnn_check(mnistcu_ctx *ctx, cudnnStatus_t s, const char *what)
{
    if (s == CUDNN_STATUS_SUCCESS) return MNISTCU_OK;
    return mnistcu__fail(ctx, MNISTCU_ERR_CUDNN, "cuDNN %s: %s", what, cudnnGetErrorString(s));
}

/* A workspace of at least bytes, kept in the context and grown when needed. */
static mnistcu_result mnistcu__dnn_workspace(mnistcu_ctx *ctx, size_t bytes, void **ws)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    if (bytes > cu->dnn_ws_bytes) {
        void *p = NULL;
        mnistcu_result r;
        cudaStreamSynchronize(cu->stream); /* the old one may still be in use */
        mnistcu__cuda_free(ctx, cu->dnn_ws);
        cu->dnn_ws = NULL;
        cu->dnn_ws_bytes = 0;
        if ((r = mnistcu__cuda_malloc(ctx, &p, bytes, "cuDNN workspace"))) return r;
        cu->dnn_ws = p;
        cu->dnn_ws_bytes = bytes;
    }
    *ws = cu->dnn_ws;
    return MNISTCU_OK;
}

/* y [B][C][P] = act(y + b[c]) in place (after a cuDNN convolution). */
__global__ void mnistcu__k_chan_bias_act(float *y, const float *bias, size_t n, int C, int P, int act)
{
    MNISTCU__PDL_WAIT();
    size_t e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = mnistcu__act_f((mnistcu_act)act, bias ? y[e] + bias[(e / (size_t)P) % (size_t)C] : y[e]);
}

/* db[c] = sum over b and p of dy [B][C][P]: one block per channel, warp w adding the maps of samples w,
   w + 8, ... (lane l their values l, l + 32, ...), then a fixed-order tree. */
__global__ void mnistcu__k_chan_sum(const float *dy, int B, int C, int P, float *db)
{
    MNISTCU__PDL_WAIT();
    __shared__ float part[MNISTCU__THREADS];
    int c = (int)blockIdx.x, t = (int)threadIdx.x, stride, b, p;
    float s = 0.0f;
    for (b = t / 32; b < B; b += MNISTCU__THREADS / 32) {
        const float *row = dy + ((size_t)b * C + (size_t)c) * P;
        for (p = t % 32; p < P; p += 32) s += row[p];
    }
    part[t] = s;
    __syncthreads();
    for (stride = MNISTCU__THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) part[t] += part[t + stride];
        __syncthreads();
    }
    if (t == 0) db[c] = part[0];
}
#endif /* MNISTCU_CUDNN */
#define MNISTCU__CUDA_FN(f) f
#else
#define MNISTCU__CUDA_FN(f) NULL
#endif /* __CUDACC__ */

/* >>model ---------------------------------------------------------------------
   A model is a list of layers. Each kind of layer has a section below
   (>>layer_dense, >>layer_conv2d, ...) holding, in the order a reader learns it:
   shape inference, the CPU reference forward and backward, then its CUDA
   kernels and their launchers. One table made from MNISTCU_LAYER_LIST
   (mnistcu__kinds) gives each kind's functions; the model picks the CPU or the
   CUDA column once, when it is made, and walks its layers with it. Shapes in
   comments, row-major:
     B            samples in the batch
     C, H, W      a layer's input channels, height and width (flat data: N, 1, 1)
     OC, OH, OW   its output's;  S = H*W, P = OH*OW positions
     KH, KW       kernel height and width;  K = C*KH*KW inputs of one conv output */

typedef struct mnistcu__layer {
    mnistcu_layer_desc d;      /* resolved: defaults filled in */
    int index;                 /* position in the model: the torch.nn.Sequential index */
    int c, h, w;               /* input shape of one sample */
    int oc, oh, ow;            /* output shape */
    int sh, sw;                /* conv and pools: strides */
    size_t in_size, out_size;  /* floats per sample: c*h*w, oc*oh*ow */
    size_t wo, nw;             /* parameter arena: weight (batch norm: gamma), nw floats at wo */
    size_t bo, nb;             /* bias (batch norm: beta), nb floats at bo; nb 0: no bias */
    size_t buf;                /* batch norm: running_mean [C] at buf, running_var [C] after it (buffer arena) */
    int64_t batches;           /* batch norm: num_batches_tracked */
    mnistcu_act act;           /* dense, conv: activation applied to the output (IDENTITY: none) */
    int passthrough;           /* the output is the input: flatten, or an activation done by the layer before */
    int need_dx;               /* backward computes the input gradient: a layer before has parameters */
    int trained;               /* the last forward ran in TRAIN mode (batch norm, dropout) */
    int dy_done;               /* dense and conv, CUDA: this step's output gradient has act' applied already (the
                                  head, or the pooling layer after, in a head step) */
    int db_done;               /* dense, CUDA: this step's bias gradient is computed already (the head) */
    int fwd_done;              /* max pool, CUDA: this step's output was made by the batch norm before it, in a head
                                  step (mnistcu__bn_pool_after) */
    int dy_pool;               /* batch norm, and a first convolution (its weight gradient), CUDA: this step's
                                  output gradient is the max pool's after it, which that pool's backward pass left
                                  as it was for ours to route (a head step) */
    int upd_done;              /* dense, CUDA: this step's optimizer step of the weights (2: and of the bias) was
                                  taken in the weight gradient's product (>>cuda_update) */
    uint64_t step;             /* dropout: the step its last mask was drawn for */
    float *in, *out;           /* workspace: x [B][in_size], y [B][out_size] */
    float *aux;                /* maxpool: argmax [B][out_size] (int32); batch norm: mean [C], invstd [C] */
    void *dnn;                 /* with cuDNN: the layer's descriptors (mnistcu__dnn_layer), made on first use */
} mnistcu__layer;

typedef struct mnistcu__tensor {
    char name[32];             /* "0.weight" */
    int layer, ndim, arena;    /* arena: 0 parameters, 1 buffers, 2 num_batches_tracked */
    int64_t shape[4];
    size_t offset, count;
} mnistcu__tensor;

struct mnistcu_model {
    mnistcu__object obj;  /* first member: the context's list */
    mnistcu_ctx *ctx;
    mnistcu_device device;
    int backend;          /* column of mnistcu__kinds: 0 CPU, 1 CUDA */
    int num_layers;       /* layers of every kind */
    mnistcu__layer layers[MNISTCU_MAX_MODEL_LAYERS];
    mnistcu_model_desc desc; /* resolved, in the layers form */
    mnistcu_act hidden_act;
    mnistcu_loss loss;
    mnistcu__lossp lossp;    /* the loss and its options */
    mnistcu_init init;
    size_t inputs, classes;  /* features of one sample, outputs of the last layer */
    size_t num_params, num_buffers, max_size;
    int num_tensors;
    mnistcu__tensor *tensors; /* state_dict order */
    mnistcu_mode mode;
    int head_off;            /* mnistcu_train_desc.no_head of the training running */
    int head_step;           /* 1 while a head step's backward pass runs (>>cuda_head) */
    int fwd_fuse;            /* 1 while a head step's forward pass runs: a batch norm may take the max pool after it */
    int dy_kept;             /* set by a layer's backward pass that left its output gradient as it was, to be the
                                layer before's (mnistcu__backward_from) */
    uint64_t bn_pool_steps;  /* passes in which a batch norm took the max pool after it (forward and backward each) */
    uint64_t conv_pool_steps; /* backward passes in which a first convolution's weight gradient routed the max
                                 pool's output gradient (mnistcu__conv_pool_route) */
    int upd_off;             /* mnistcu_train_desc.no_fused_update of the training running */
    int upd_on;              /* 1 while a training step's backward pass may take the optimizer's step in the
                                weight gradients' products (mnistcu__update_plan): upd_opt holds its scalars */
    mnistcu__opt upd_opt;
    mnistcu__opt_memo opt_memo; /* the optimizer's decimals (mnistcu__opt_make) */
    uint64_t upd_steps;      /* steps whose optimizer step was taken, in part, in the products; */
    int upd_last;            /* ... and whether the last one launched was (the graph captured from it is) */
    size_t upd_warm[2];      /* the batch sizes of the last two training steps that completed (0: none) */
    /* The arenas, on the model's device: one allocation each. */
    float *params;        /* [num_params] */
    float *grads;         /* [num_params] */
    float *state;         /* [state_floats] optimizer state (see >>cpu_ops, optimizers), made on the first step */
    size_t state_floats;  /* its size: slots * num_params */
    int state_sig;        /* the layout it was made for: kind and options (0: none yet) */
    uint64_t state_steps; /* steps taken with this state (Adam's and Adagrad's t) */
    float *buffers;       /* [num_buffers] running statistics */
    uint64_t steps;       /* optimizer steps taken */
    mnistcu__rng rng;     /* initialisation and shuffling */
    uint32_t *ahead;      /* [ahead_cap] the next epoch's sample order, made ahead (mnistcu__order_ahead) */
    size_t ahead_cap, ahead_n; /* ... its capacity, and n of the order in it (0: none) */
    mnistcu__rng ahead_from, ahead_to; /* rng before and after that shuffle */
    int has_norm;         /* the training set's normalisation, applied to what the model evaluates */
    int norm_u8;          /* ... when it was stored as uint8 */
    float norm_scale, norm_shift;
    /* Workspace for batches of up to ws_batch samples, on the model's device. */
    size_t ws_batch;
    float *ws;            /* one block holding what follows */
    float *input;         /* x [B][inputs] */
    float *logits;        /* [B][classes]: the last layer's output */
    float *dbuf[2];       /* [B][max_size] gradient ping-pong */
    float *scratch;       /* shared by the layers: im2col columns */
    int scratch_layer;    /* CUDA: 1 + the conv layer whose columns scratch holds, for its backward pass; 0: none */
    size_t scratch_batch; /* ... and for which batch size */
    float *sample_loss;   /* [B] */
    float *targets;       /* [B][classes] float targets of the batch, when batch_targets */
    int batch_targets;    /* the batch has float targets instead of class labels */
    int32_t *iws;         /* one block: labels [B], pred [B] */
    int32_t *labels, *pred;
    char *class_names;    /* classes names, each NUL-terminated, one after the other; NULL: none */
    void *finite_keep;    /* the divergence check's copies of the weights and its flags, kept on the model's
                             device from one training to the next (mnistcu__finite_end); NULL: none */
    void *cuda;           /* mnistcu__cuda_model when on the GPU */
};

typedef mnistcu_result (*mnistcu__forward_fn)(mnistcu_model *m, mnistcu__layer *L, size_t B);
/* dy [B][out_size] may be overwritten; dx [B][in_size] is NULL when no layer before needs it. */
typedef mnistcu_result (*mnistcu__backward_fn)(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx);

typedef struct mnistcu__kind {
    /* Resolves L->d's defaults, checks it, sets the output shape, strides and
       parameter counts from the input shape in L->c, L->h, L->w. */
    mnistcu_result (*shape)(mnistcu_ctx *ctx, mnistcu__layer *L);
    size_t (*aux_floats)(const mnistcu__layer *L, size_t B);                 /* NULL: none */
    size_t (*scratch_floats)(const mnistcu__layer *L, size_t B, int cuda);   /* NULL: none */
    /* forward and backward: besides computing, the CUDA ones may change host state per training step
       only as mnistcu__step_host_effects replays it (a step replayed from a CUDA graph runs no host
       code), and take what differs between steps from mnistcu__cuda_dyn when it is not NULL. */
    mnistcu__forward_fn forward[2];   /* [0] CPU, [1] CUDA (NULL in builds without CUDA) */
    mnistcu__backward_fn backward[2];
} mnistcu__kind;

static const char *const mnistcu__kind_keywords[] = {
    "",
#define MNISTCU__LAYER_KEY(name, key, torch) key,
    MNISTCU_LAYER_LIST(MNISTCU__LAYER_KEY)
#undef MNISTCU__LAYER_KEY
};
static const char *const mnistcu__kind_torch[] = {
    "",
#define MNISTCU__LAYER_TORCH(name, key, torch) torch,
    MNISTCU_LAYER_LIST(MNISTCU__LAYER_TORCH)
#undef MNISTCU__LAYER_TORCH
};

/* Initialisation schemes as spec options write them (":init=xavier"). */
static const char *const mnistcu__init_names[] = {"", "torch", "he", "xavier", "xavier_normal", "he_normal"};

static int mnistcu__is_flat(const mnistcu__layer *L) { return L->h == 1 && L->w == 1; }
static int mnistcu__train_mode(const mnistcu_model *m) { return m->mode == MNISTCU_MODE_TRAIN; }

/* Appends to buf (size bytes, *len used so far); returns 0 when it does not fit. */
static int mnistcu__cat(char *buf, size_t size, size_t *len, const char *fmt, ...) MNISTCU__PRINTF(4, 5);
static int mnistcu__cat(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    va_list ap;
    int n;
    if (*len >= size) return 0;
    va_start(ap, fmt);
    n = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= size - *len) {
        buf[*len] = 0;
        *len = size;
        return 0;
    }
    *len += (size_t)n;
    return 1;
}

/* A float as the shortest decimal that reads back as the same float. */
static float mnistcu__parse_float_text(const char *s, const char *end, int *ok);
static void mnistcu__float_text(float v, char *out, size_t size)
{
    int prec;
    for (prec = 1; prec <= 9; ++prec) {
        int ok = 0;
        snprintf(out, size, "%.*g", prec, (double)v);
        if (mnistcu__parse_float_text(out, out + strlen(out), &ok) == v && ok) return;
    }
}

/* The spec token of one layer desc, raw or resolved: "conv5x5x6:s=2". */
static int mnistcu__layer_token(const mnistcu_layer_desc *d, char *buf, size_t size)
{
    size_t len = 0;
    int ok = 1, kh = d->kernel_h, kw, pool = d->kind == MNISTCU_LAYER_MAXPOOL2D || d->kind == MNISTCU_LAYER_AVGPOOL2D;
    char num[32];
    if (size) buf[0] = 0;
    if ((unsigned)d->kind >= MNISTCU_LAYER_KIND_COUNT || d->kind == MNISTCU_LAYER_NONE)
        return mnistcu__cat(buf, size, &len, "?");
    if (pool && kh == 0) kh = 2;
    kw = d->kernel_w ? d->kernel_w : kh;
    ok &= mnistcu__cat(buf, size, &len, "%s", mnistcu__kind_keywords[d->kind]);
    switch (d->kind) {
    case MNISTCU_LAYER_DENSE:
        ok &= mnistcu__cat(buf, size, &len, "%d", d->units);
        break;
    case MNISTCU_LAYER_CONV2D:
        ok &= mnistcu__cat(buf, size, &len, "%dx%dx%d", kh, kw, d->units);
        if (d->stride > 1) ok &= mnistcu__cat(buf, size, &len, ":s=%d", d->stride);
        if (d->padding) ok &= mnistcu__cat(buf, size, &len, ":p=%d", d->padding);
        break;
    case MNISTCU_LAYER_MAXPOOL2D:
    case MNISTCU_LAYER_AVGPOOL2D:
        ok &= kh == kw ? mnistcu__cat(buf, size, &len, "%d", kh) : mnistcu__cat(buf, size, &len, "%dx%d", kh, kw);
        if (d->stride && !(kh == kw && d->stride == kh)) ok &= mnistcu__cat(buf, size, &len, ":s=%d", d->stride);
        break;
    case MNISTCU_LAYER_BATCHNORM:
        if (d->eps != 0.0f && d->eps != 1e-5f) {
            mnistcu__float_text(d->eps, num, sizeof num);
            ok &= mnistcu__cat(buf, size, &len, ":eps=%s", num);
        }
        if (d->momentum != 0.0f && d->momentum != 0.1f) {
            mnistcu__float_text(d->momentum, num, sizeof num);
            ok &= mnistcu__cat(buf, size, &len, ":momentum=%s", num);
        }
        break;
    case MNISTCU_LAYER_DROPOUT:
        if (d->p != 0.0f && d->p != 0.5f) {
            mnistcu__float_text(d->p, num, sizeof num);
            ok &= mnistcu__cat(buf, size, &len, "%s", num);
        }
        break;
    case MNISTCU_LAYER_LEAKY_RELU:
        if (d->slope != 0.0f && d->slope != 0.01f) {
            mnistcu__float_text(d->slope, num, sizeof num);
            ok &= mnistcu__cat(buf, size, &len, "%s", num);
        }
        break;
    default: break;
    }
    if ((d->kind == MNISTCU_LAYER_DENSE || d->kind == MNISTCU_LAYER_CONV2D) && d->no_bias)
        ok &= mnistcu__cat(buf, size, &len, ":bias=0");
    if ((d->kind == MNISTCU_LAYER_DENSE || d->kind == MNISTCU_LAYER_CONV2D) && d->init > MNISTCU_INIT_DEFAULT &&
        d->init <= MNISTCU_INIT_HE_NORMAL)
        ok &= mnistcu__cat(buf, size, &len, ":init=%s", mnistcu__init_names[d->init]);
    return ok;
}

/* Records a shape or desc error about layer L: "layer 3 (conv5x5x16): ...". */
static mnistcu_result mnistcu__layer_fail(mnistcu_ctx *ctx, const mnistcu__layer *L, mnistcu_result r, const char *fmt,
                                          ...) MNISTCU__PRINTF(4, 5);
static mnistcu_result mnistcu__layer_fail(mnistcu_ctx *ctx, const mnistcu__layer *L, mnistcu_result r, const char *fmt,
                                          ...)
{
    char tok[64], msg[MNISTCU__ERROR_SIZE];
    va_list ap;
    mnistcu__layer_token(&L->d, tok, sizeof tok);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mnistcu__fail(ctx, r, "model: layer %d (%s), input %dx%dx%d: %s", L->index, tok, L->c, L->h, L->w, msg);
}

/* Sizes of a sample, checked: c*h*w within 2^24 floats. */
static int mnistcu__shape_ok(int c, int h, int w)
{
    return c >= 1 && h >= 1 && w >= 1 && (size_t)c * (size_t)h * (size_t)w <= MNISTCU__MAX_FEATURES;
}
#define MNISTCU__MAX_KERNEL 4096 /* kernel sizes, strides and padding */

/* Shape of the elementwise kinds: the output is the input. */
static mnistcu_result mnistcu__same_shape(mnistcu_ctx *ctx, mnistcu__layer *L)
{
    (void)ctx;
    L->oc = L->c;
    L->oh = L->h;
    L->ow = L->w;
    return MNISTCU_OK;
}

/* The geometry of a window operation (conv, pools), small enough to pass to kernels by value. */
typedef struct mnistcu__geom { int c, h, w, kh, kw, sh, sw, pad, oh, ow; } mnistcu__geom;

static mnistcu__geom mnistcu__geom_of(const mnistcu__layer *L)
{
    mnistcu__geom g;
    g.c = L->c; g.h = L->h; g.w = L->w;
    g.kh = L->d.kernel_h; g.kw = L->d.kernel_w;
    g.sh = L->sh; g.sw = L->sw;
    g.pad = L->d.padding;
    g.oh = L->oh; g.ow = L->ow;
    return g;
}

#ifdef MNISTCU_CUDNN
/* A layer's cuDNN descriptors and workspace sizes, made once per batch size:
   making them costs more host time than the convolutions themselves. */
typedef struct mnistcu__dnn_layer {
    size_t batch;                          /* the batch size they describe */
    cudnnTensorDescriptor_t x, y, chan;    /* input [B][C][H][W], output, per channel [1][C][1][1] */
    cudnnFilterDescriptor_t w;             /* conv */
    cudnnConvolutionDescriptor_t conv;
    cudnnPoolingDescriptor_t pool;
    size_t ws_fwd, ws_filter, ws_data;     /* workspace bytes of the three convolution algorithms */
} mnistcu__dnn_layer;

#define MNISTCU__DNN_FWD CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
#define MNISTCU__DNN_FILTER CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 /* deterministic */
#define MNISTCU__DNN_DATA CUDNN_CONVOLUTION_BWD_DATA_ALGO_1     /* deterministic */

static void mnistcu__dnn_layer_free(mnistcu_ctx *ctx, mnistcu__layer *L)
{
    mnistcu__dnn_layer *d = (mnistcu__dnn_layer *)L->dnn;
    if (!d) return;
    if (d->x) cudnnDestroyTensorDescriptor(d->x);
    if (d->y) cudnnDestroyTensorDescriptor(d->y);
    if (d->chan) cudnnDestroyTensorDescriptor(d->chan);
    if (d->w) cudnnDestroyFilterDescriptor(d->w);
    if (d->conv) cudnnDestroyConvolutionDescriptor(d->conv);
    if (d->pool) cudnnDestroyPoolingDescriptor(d->pool);
    mnistcu__free(ctx, d);
    L->dnn = NULL;
}

static mnistcu_result mnistcu__dnn_layer_get(mnistcu_model *m, mnistcu__layer *L, size_t B, mnistcu__dnn_layer **out)
{
    mnistcu_ctx *ctx = m->ctx;
    cudnnHandle_t h = mnistcu__cu(ctx)->dnn;
    mnistcu__dnn_layer *d = (mnistcu__dnn_layer *)L->dnn;
    cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
    *out = d;
    if (d && d->batch == B) return MNISTCU_OK;
    mnistcu__dnn_layer_free(ctx, L);
    d = (mnistcu__dnn_layer *)mnistcu__calloc(ctx, sizeof *d);
    if (!d) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory for cuDNN descriptors");
    L->dnn = d;
    d->batch = B;
#define MNISTCU__DNN(call) if (s == CUDNN_STATUS_SUCCESS) s = (call)
    MNISTCU__DNN(cudnnCreateTensorDescriptor(&d->x));
    MNISTCU__DNN(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)B, L->c, L->h, L->w));
    MNISTCU__DNN(cudnnCreateTensorDescriptor(&d->y));
    MNISTCU__DNN(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)B, L->oc, L->oh, L->ow));
    if (L->d.kind == MNISTCU_LAYER_BATCHNORM) {
        MNISTCU__DNN(cudnnCreateTensorDescriptor(&d->chan));
        MNISTCU__DNN(cudnnSetTensor4dDescriptor(d->chan, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, L->c, 1, 1));
    } else if (L->d.kind == MNISTCU_LAYER_CONV2D) {
        MNISTCU__DNN(cudnnCreateFilterDescriptor(&d->w));
        MNISTCU__DNN(cudnnSetFilter4dDescriptor(d->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, L->oc, L->c, L->d.kernel_h,
                                                L->d.kernel_w));
        MNISTCU__DNN(cudnnCreateConvolutionDescriptor(&d->conv));
        MNISTCU__DNN(cudnnSetConvolution2dDescriptor(d->conv, L->d.padding, L->d.padding, L->sh, L->sw, 1, 1,
                                                     CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
        MNISTCU__DNN(cudnnSetConvolutionMathType(d->conv, CUDNN_FMA_MATH)); /* FP32: no TF32 */
        MNISTCU__DNN(cudnnGetConvolutionForwardWorkspaceSize(h, d->x, d->w, d->conv, d->y, MNISTCU__DNN_FWD, &d->ws_fwd));
        MNISTCU__DNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d->x, d->y, d->conv, d->w, MNISTCU__DNN_FILTER,
                                                                    &d->ws_filter));
        MNISTCU__DNN(cudnnGetConvolutionBackwardDataWorkspaceSize(h, d->w, d->y, d->conv, d->x, MNISTCU__DNN_DATA,
                                                                  &d->ws_data));
    } else {
        MNISTCU__DNN(cudnnCreatePoolingDescriptor(&d->pool));
        MNISTCU__DNN(cudnnSetPooling2dDescriptor(d->pool, L->d.kind == MNISTCU_LAYER_MAXPOOL2D
                                                              ? CUDNN_POOLING_MAX_DETERMINISTIC
                                                              : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                                 CUDNN_PROPAGATE_NAN, L->d.kernel_h, L->d.kernel_w, 0, 0, L->sh, L->sw));
    }
#undef MNISTCU__DNN
    if (s != CUDNN_STATUS_SUCCESS) {
        mnistcu__dnn_layer_free(ctx, L);
        return mnistcu__dnn_check(ctx, s, "descriptors");
    }
    *out = d;
    return MNISTCU_OK;
}
#endif

/* >>layer_dense ------------------------------------------------------------------
   torch.nn.Linear: y[B][OC] = act(x[B][C] W^T + b), W [OC][C], b [OC]; the
   activation of a relu, sigmoid or tanh layer right after it is folded in. */
static mnistcu_result mnistcu__dense_shape(mnistcu_ctx *ctx, mnistcu__layer *L)
{
    if (L->d.units < 1 || (size_t)L->d.units > MNISTCU__MAX_FEATURES)
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_INVALID_ARGUMENT, "units %d not in 1..2^24", L->d.units);
    if (!mnistcu__is_flat(L))
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_SHAPE,
                                   "a dense layer needs flat input: put flatten before it");
    L->oc = L->d.units;
    L->oh = L->ow = 1;
    L->nw = (size_t)L->d.units * (size_t)L->c;
    L->nb = L->d.no_bias ? 0 : (size_t)L->d.units;
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__dense_cpu_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    size_t in = (size_t)L->c, out = (size_t)L->oc;
    mnistcu__cpu_gemm(m->ctx, 0, 1, B, out, in, L->in, in, m->params + L->wo, in, L->out, out);
    mnistcu__cpu_bias_act(m->ctx, L->out, L->nb ? m->params + L->bo : NULL, B, out, L->act);
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__dense_cpu_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    size_t in = (size_t)L->c, out = (size_t)L->oc;
    mnistcu__cpu_act_backward(m->ctx, dy, L->out, B * out, L->act);
    /* dW [OC][C] = dz^T [OC][B] . x [B][C] */
    mnistcu__cpu_gemm(m->ctx, 1, 0, out, in, B, dy, out, L->in, in, m->grads + L->wo, in);
    if (L->nb) mnistcu__cpu_bias_grad(m->grads + L->bo, dy, B, out);
    /* dx [B][C] = dz [B][OC] . W [OC][C] */
    if (dx) mnistcu__cpu_gemm(m->ctx, 0, 0, B, in, out, dy, out, m->params + L->wo, in, dx, in);
    return MNISTCU_OK;
}

#ifdef __CUDACC__
/* y[B][OUT] = act(y + b) in place (after a cuBLAS product); bias may be NULL. */
__global__ void mnistcu__k_bias_act(float *y, const float *bias, size_t n, int OUT, int act)
{
    MNISTCU__PDL_WAIT();
    size_t e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = mnistcu__act_f((mnistcu_act)act, bias ? y[e] + bias[mnistcu__mod(e, (size_t)OUT)] : y[e]);
}

/* dz *= act'(y), from the output y. */
__global__ void mnistcu__k_act_backward(float *dz, const float *y, size_t n, int act)
{
    MNISTCU__PDL_WAIT();
    size_t e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        dz[e] = mnistcu__act_backward_one((mnistcu_act)act, dz[e], y[e]);
}

/* A dense layer's output gradient, finished, and its bias gradient, in one pass:
   dz[B][OUT] *= act'(y) in place (act IDENTITY: as it is), and, when db is
   given, db[j] = the sum over the rows of dz, rows in order from zero (as the
   CPU, and the fused MLP kernel): one sequential chain per column, which no
   split may reorder. Its loads need not wait in line, though: each block takes
   32 columns and stages MNISTCU__BG_ROWS rows of them in shared memory, its 8
   warps loading 16 rows each at once (the next pass's loads in flight while
   the chains run; each element is loaded, finished and written back by one
   thread), and one warp, a lane per column, runs the chains, its shared loads
   unrolled ahead of the adds. The same values as mnistcu__k_act_backward then
   a column sum. Measured on the H100 (bench/bias_grad.cu), the sum alone: 10.1
   us for P3's 512 x 1024 with the first version (a thread per column reading
   its column row by row), 6.0 us here, the same bits; with a ReLU: at batch 64,
   4.8 us against 6.2 for the two kernels, but at 512, 19.3 against 16.0 (the
   activation's loads stall each pass): the dense layer fuses them up to one
   pass of rows only. */
#define MNISTCU__BG_ROWS 128

__global__ void __launch_bounds__(256) mnistcu__k_bias_grad(float *dz, const float *y, int act, int B, int OUT,
                                                            float *db)
{
    MNISTCU__PDL_WAIT();
    __shared__ float tile[MNISTCU__BG_ROWS][33];
    float v[MNISTCU__BG_ROWS / 8];
    int lane = (int)threadIdx.x & 31, w = (int)threadIdx.x >> 5, j = (int)blockIdx.x * 32 + lane, r0, k;
    float s = 0.0f;
#pragma unroll
    for (k = 0; k < MNISTCU__BG_ROWS / 8; ++k) {
        int r = w + 8 * k;
        v[k] = r < B && j < OUT ? dz[(size_t)r * OUT + j] : 0.0f;
    }
    for (r0 = 0; r0 < B; r0 += MNISTCU__BG_ROWS) {
        int rows = B - r0 < MNISTCU__BG_ROWS ? B - r0 : MNISTCU__BG_ROWS;
        if (act != MNISTCU_ACT_IDENTITY) {
#pragma unroll
            for (k = 0; k < MNISTCU__BG_ROWS / 8; ++k) {
                int r = r0 + w + 8 * k;
                if (r < B && j < OUT) {
                    size_t e = (size_t)r * OUT + j;
                    v[k] = mnistcu__act_backward_one((mnistcu_act)act, v[k], y[e]);
                    dz[e] = v[k];
                }
            }
        }
        if (db) {
#pragma unroll
            for (k = 0; k < MNISTCU__BG_ROWS / 8; ++k) tile[w + 8 * k][lane] = v[k];
        }
        __syncthreads();
        if (r0 + MNISTCU__BG_ROWS < B) { /* the next pass's rows, loading while the chains run */
#pragma unroll
            for (k = 0; k < MNISTCU__BG_ROWS / 8; ++k) {
                int r = r0 + MNISTCU__BG_ROWS + w + 8 * k;
                v[k] = r < B && j < OUT ? dz[(size_t)r * OUT + j] : 0.0f;
            }
        }
        if (w == 0 && db) {
            if (rows == MNISTCU__BG_ROWS) { /* unrolled: the shared loads run ahead of the chain */
#pragma unroll
                for (k = 0; k < MNISTCU__BG_ROWS; ++k) s += tile[k][lane];
            } else
                for (k = 0; k < rows; ++k) s += tile[k][lane];
        }
        __syncthreads();
    }
    if (w == 0 && db && j < OUT) db[j] = s;
}

static mnistcu__layer *mnistcu__layer_before(const mnistcu_model *m, int i);
static mnistcu__layer *mnistcu__bn_pool_after(mnistcu_model *m, const mnistcu__layer *L);
/* 2x2 windows of stride 2 on a map of at least 2x2: mnistcu__k_pool2_forward and _backward's */
static int mnistcu__pool2(const mnistcu__layer *L)
{
    return L->d.kernel_h == 2 && L->d.kernel_w == 2 && L->sh == 2 && L->sw == 2 && L->h >= 2 && L->w >= 2;
}

static mnistcu_result mnistcu__dense_cuda_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    size_t in = (size_t)L->c, out = (size_t)L->oc;
    return mnistcu__cuda_gemm(m->ctx, 0, 1, B, out, in, L->in, in, m->params + L->wo, in, L->out, out,
                              L->nb ? m->params + L->bo : NULL, (int)L->act);
}

/* A dense layer's weight gradient from dy (act' applied): with its bias gradient db, or the optimizer's
   step u, in one wide-tile product (the caller checked that it takes them), else the plain product. */
static mnistcu_result mnistcu__dense_cuda_dw(mnistcu_model *m, mnistcu__layer *L, size_t B, const float *dy, float *db,
                                             const mnistcu__wupd *u)
{
    size_t in = (size_t)L->c, out = (size_t)L->oc;
    float *dw = m->grads + L->wo;
    mnistcu_result r;
    int done = 0;
    if (!db && !u) return mnistcu__cuda_gemm(m->ctx, 1, 0, out, in, B, dy, out, L->in, in, dw, in, NULL, 0);
    if ((r = mnistcu__cuda_gemm_x(m->ctx, 1, 0, out, in, B, dy, out, L->in, in, dw, in, 0, NULL, db, u, &done))) return r;
    if (!done) return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dense weight gradient: not taken");
    if (u) L->upd_done = db ? 2 : 1;
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__dense_cuda_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    mnistcu_ctx *ctx = m->ctx;
    cudaStream_t st = mnistcu__cuda_stream(ctx);
    size_t in = (size_t)L->c, out = (size_t)L->oc;
    const int act = L->dy_done ? (int)MNISTCU_ACT_IDENTITY : (int)L->act; /* the head may have applied it */
    float *db = L->nb && !L->db_done ? m->grads + L->bo : NULL, *dw = m->grads + L->wo;
    /* in a head step, the dense layer before may have its act' applied in this input gradient's product */
    mnistcu__layer *P = dx && m->head_step ? mnistcu__layer_before(m, (int)(L - m->layers)) : NULL;
    /* dy as it is and a bias: the weight and bias gradients in one product, where the wide-tile kernel takes it */
    const int dw_db = act == MNISTCU_ACT_IDENTITY && db &&
                      mnistcu__cuda_gemm_x_takes(ctx, 1, 0, out, in, B, dy, out, L->in, in, dw, in, db);
    mnistcu__wupd upd, *u = NULL;
    mnistcu_result r;
    int done = 0;
    if (P && (P->d.kind != MNISTCU_LAYER_DENSE || P->act == MNISTCU_ACT_IDENTITY || P->out != L->in)) P = NULL;
    if (m->upd_on && (dw_db || mnistcu__cuda_gemm_x_takes(ctx, 1, 0, out, in, B, dy, out, L->in, in, dw, in, NULL))) {
        /* the optimizer's step in the weight gradient's product, which then comes after every read of the
           weights (the input gradient's product) */
        u = &upd;
        upd.w = m->params + L->wo, upd.bw = m->params + L->bo;
        upd.s = m->state ? m->state + L->wo : NULL, upd.bs = m->state ? m->state + L->bo : NULL;
        upd.dyn = mnistcu__cuda_dyn(m);
        upd.opt = m->upd_opt;
    }
    if (!dw_db) {
        /* dy *= act'(y), and the bias gradient: one kernel up to a batch of MNISTCU__BG_ROWS (one pass);
           above, where the activation's loads would stall each pass, the elementwise kernel first */
        if (act != MNISTCU_ACT_IDENTITY && B > MNISTCU__BG_ROWS) {
            mnistcu__launch(mnistcu__k_act_backward, mnistcu__blocks(B * out), MNISTCU__THREADS, 0, st, dy, L->out, B * out, act);
            MNISTCU__LAUNCHED(ctx, "act_backward");
        }
        if ((act != MNISTCU_ACT_IDENTITY && B <= MNISTCU__BG_ROWS) || db) {
            mnistcu__launch(mnistcu__k_bias_grad, (unsigned)((out + 31) / 32), 256, 0, st,
                dy, L->out, B <= MNISTCU__BG_ROWS ? act : (int)MNISTCU_ACT_IDENTITY, (int)B, (int)out, db);
            MNISTCU__LAUNCHED(ctx, "bias_grad");
        }
    }
    /* the weight gradient first where it takes no optimizer's step, as before (P3 with our products: 29.9 ms
       an epoch in this order, 30.3-30.4 with the input gradient first, bench/RESULTS.md) */
    if (!u && (r = mnistcu__dense_cuda_dw(m, L, B, dy, dw_db ? db : NULL, NULL))) return r;
    /* the input gradient, from dy with act' applied */
    if (P && (r = mnistcu__cuda_gemm_x(ctx, 0, 0, B, in, out, dy, out, m->params + L->wo, in, dx, in, (int)P->act,
                                       L->in, NULL, NULL, &done)))
        return r;
#ifdef MNISTCU_CUBLAS
    if (P && !done && (r = mnistcu__cuda_dx_act(ctx, B, in, out, dy, m->params + L->wo, dx, L->in, (int)P->act, &done)))
        return r;
#endif
    if (done) P->dy_done = 1;
    else if (dx && (r = mnistcu__cuda_gemm(ctx, 0, 0, B, in, out, dy, out, m->params + L->wo, in, dx, in, NULL, 0)))
        return r;
    return u ? mnistcu__dense_cuda_dw(m, L, B, dy, dw_db ? db : NULL, u) : MNISTCU_OK;
}
#endif

static const mnistcu__kind mnistcu__kind_DENSE = {
    mnistcu__dense_shape, NULL, NULL,
    {mnistcu__dense_cpu_forward, MNISTCU__CUDA_FN(mnistcu__dense_cuda_forward)},
    {mnistcu__dense_cpu_backward, MNISTCU__CUDA_FN(mnistcu__dense_cuda_backward)}};

/* >>layer_conv2d -----------------------------------------------------------------
   torch.nn.Conv2d: y[B][OC][OH][OW] = act(W [OC][C][KH][KW] * x + b [OC]), zero
   padding `pad` on each side, stride s: OH = (H + 2 pad - KH) / s + 1.
   As a matrix product: the columns col [K][P] of a sample (im2col) hold, for
   each output position, the K inputs its window sees (k = (c, i, j) in that
   order), so that y_b [OC][P] = W [OC][K] col_b [K][P]. Backward:
   dW = sum_b dy_b col_b^T, db = sum of dy, dcol_b = W^T dy_b, and dx_b sums
   for each input the dcol entries it was copied to (col2im, a gather: no
   atomics). The CPU works one sample at a time; the GPU lays the whole batch
   side by side, col [K][B*P], and does each product in one launch. */
static mnistcu_result mnistcu__conv_shape(mnistcu_ctx *ctx, mnistcu__layer *L)
{
    mnistcu_layer_desc *d = &L->d;
    if (d->kernel_w == 0) d->kernel_w = d->kernel_h;
    if (d->stride == 0) d->stride = 1;
    if (d->units < 1 || (size_t)d->units > MNISTCU__MAX_FEATURES || d->kernel_h < 1 || d->kernel_w < 1 ||
        d->kernel_h > MNISTCU__MAX_KERNEL || d->kernel_w > MNISTCU__MAX_KERNEL || d->stride < 1 ||
        d->stride > MNISTCU__MAX_KERNEL || d->padding < 0 || d->padding > MNISTCU__MAX_KERNEL)
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_INVALID_ARGUMENT,
                                   "channels %d, kernel %dx%d, stride %d or padding %d out of range", d->units,
                                   d->kernel_h, d->kernel_w, d->stride, d->padding);
    if (L->h + 2 * d->padding < d->kernel_h || L->w + 2 * d->padding < d->kernel_w)
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_SHAPE, "a %dx%d kernel does not fit a %dx%d map with padding %d",
                                   d->kernel_h, d->kernel_w, L->h, L->w, d->padding);
    L->sh = L->sw = d->stride;
    L->oc = d->units;
    L->oh = (L->h + 2 * d->padding - d->kernel_h) / d->stride + 1;
    L->ow = (L->w + 2 * d->padding - d->kernel_w) / d->stride + 1;
    if (!mnistcu__shape_ok(L->oc, L->oh, L->ow) ||
        !mnistcu__mul3((size_t)L->oc, (size_t)L->c, (size_t)d->kernel_h * (size_t)d->kernel_w, &L->nw) ||
        L->nw > MNISTCU__MAX_FEATURES * (size_t)64)
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_SHAPE, "output %dx%dx%d or %d weights too large", L->oc, L->oh,
                                   L->ow, (int)MNISTCU__MIN(L->nw, (size_t)2147483647));
    L->nb = d->no_bias ? 0 : (size_t)d->units;
    return MNISTCU_OK;
}

/* The GPU's direct kernels (below) take square 3x3 and 5x5 kernels over few input
   channels, whose weights reaching one input channel fit in 32 KB of shared memory. */
#define MNISTCU__DIRECT_MAX_C 16
static int mnistcu__conv_direct(const mnistcu__layer *L)
{
    return L->c <= MNISTCU__DIRECT_MAX_C && L->d.kernel_h == L->d.kernel_w &&
           (L->d.kernel_h == 3 || L->d.kernel_h == 5) && (size_t)L->oc * L->d.kernel_h * L->d.kernel_w <= 8192;
}

/* CPU: col and dcol of one sample [K][P]. GPU: col [K][B*P], the product [OC][B*P] and dcol [K][B*P] (the
   input gradient's beside the weight gradient's branch, >>cuda_side); none for the direct kernels. */
static size_t mnistcu__conv_scratch(const mnistcu__layer *L, size_t B, int cuda)
{
    size_t K = (size_t)L->c * (size_t)L->d.kernel_h * (size_t)L->d.kernel_w, P = (size_t)L->oh * (size_t)L->ow, n;
    if (!cuda) return mnistcu__mul3(2, K, P, &n) ? n : SIZE_MAX;
    if (mnistcu__conv_direct(L)) return 0;
    return K <= SIZE_MAX / 2 - (size_t)L->oc && mnistcu__mul3(2 * K + (size_t)L->oc, B, P, &n) ? n : SIZE_MAX;
}

/* Input k = (c, i, j) of output position p of one sample x [C][H][W]; 0 in the padding. */
static MNISTCU__HD float mnistcu__im2col_at(const float *x, mnistcu__geom g, int k, int p)
{
    int j = k % g.kw, i = (k / g.kw) % g.kh, c = k / (g.kw * g.kh);
    int iy = (p / g.ow) * g.sh - g.pad + i, ix = (p % g.ow) * g.sw - g.pad + j;
    return (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) ? x[((size_t)c * g.h + iy) * g.w + ix] : 0.0f;
}

/* dx of input (c, iy, ix) of one sample: the sum, in (i, j) order, of the dcol
   entries it was copied to; dcol [K][ld], this sample's positions from column 0. */
static MNISTCU__HD float mnistcu__col2im_at(const float *dcol, size_t ld, mnistcu__geom g, int c, int iy, int ix)
{
    float s = 0.0f;
    int i, j;
    for (i = 0; i < g.kh; ++i) {
        int ty = iy + g.pad - i, oy;
        if (ty < 0 || ty % g.sh) continue;
        oy = ty / g.sh;
        if (oy >= g.oh) continue;
        for (j = 0; j < g.kw; ++j) {
            int tx = ix + g.pad - j, ox;
            if (tx < 0 || tx % g.sw) continue;
            ox = tx / g.sw;
            if (ox >= g.ow) continue;
            s += dcol[(size_t)((c * g.kh + i) * g.kw + j) * ld + (size_t)oy * g.ow + ox];
        }
    }
    return s;
}

static void mnistcu__cpu_im2col(const float *x, mnistcu__geom g, float *col)
{
    int k, K = g.c * g.kh * g.kw, P = g.oh * g.ow, p;
    for (k = 0; k < K; ++k) {
        float *row = col + (size_t)k * P;
        int j = k % g.kw, i = (k / g.kw) % g.kh, c = k / (g.kw * g.kh), oy;
        const float *plane = x + (size_t)c * g.h * g.w;
        if (g.pad == 0 && g.sw == 1) { /* the common case: whole rows copy */
            for (oy = 0; oy < g.oh; ++oy)
                memcpy(row + (size_t)oy * g.ow, plane + (size_t)(oy * g.sh + i) * g.w + j, (size_t)g.ow * sizeof(float));
            continue;
        }
        for (p = 0; p < P; ++p) row[p] = mnistcu__im2col_at(x, g, k, p); /* padding or strides */
    }
}

/* y[OC][P] = act(y + b[oc]) in place; bias may be NULL. */
static void mnistcu__cpu_chan_bias_act(float *y, const float *bias, size_t OC, size_t P, mnistcu_act act)
{
    size_t o, p;
    for (o = 0; o < OC; ++o) {
        float *row = y + o * P, b = bias ? bias[o] : 0.0f;
        if (!bias && act == MNISTCU_ACT_IDENTITY) continue;
        for (p = 0; p < P; ++p) row[p] = mnistcu__act_f(act, bias ? row[p] + b : row[p]);
    }
}

/* Samples are independent in the forward pass and in the input gradient: up to
   two threads take alternate samples, each with its half of the scratch (K*P
   floats; the products inside then run on the thread that calls them, with the
   same bits). The weight and bias gradients add the samples in order, on one. */
static int mnistcu__conv_cpu_threads(const mnistcu_model *m, size_t B)
{
    return m->ctx->threads >= 2 && B >= 2 ? 2 : 1;
}

static int mnistcu__thread_index(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static mnistcu_result mnistcu__conv_cpu_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    mnistcu__geom g = mnistcu__geom_of(L);
    size_t K = (size_t)g.c * g.kh * g.kw, P = (size_t)g.oh * g.ow, OC = (size_t)L->oc;
    long b, nb = (long)B;
    int T = mnistcu__conv_cpu_threads(m, B);
    (void)T;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
#endif
    for (b = 0; b < nb; ++b) {
        float *y = L->out + (size_t)b * L->out_size, *col = m->scratch + (size_t)mnistcu__thread_index() * K * P;
        mnistcu__cpu_im2col(L->in + (size_t)b * L->in_size, g, col);
        mnistcu__cpu_gemm(m->ctx, 0, 0, OC, P, K, m->params + L->wo, K, col, P, y, P);
        mnistcu__cpu_chan_bias_act(y, L->nb ? m->params + L->bo : NULL, OC, P, L->act);
    }
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__conv_cpu_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    mnistcu__geom g = mnistcu__geom_of(L);
    size_t K = (size_t)g.c * g.kh * g.kw, P = (size_t)g.oh * g.ow, OC = (size_t)L->oc, b, o, p;
    float *col = m->scratch, *dw = m->grads + L->wo, *db = m->grads + L->bo;
    long bb, nb = (long)B;
    int T = mnistcu__conv_cpu_threads(m, B);
    (void)T;
    for (b = 0; b < B; ++b) {
        float *dyb = dy + b * L->out_size;
        mnistcu__cpu_act_backward(m->ctx, dyb, L->out + b * L->out_size, OC * P, L->act);
        mnistcu__cpu_im2col(L->in + b * L->in_size, g, col);
        /* dW [OC][K] (+)= dy_b [OC][P] . col_b^T [P][K] */
        mnistcu__cpu_gemm_acc(m->ctx, 0, 1, OC, K, P, dyb, P, col, P, dw, K, b > 0);
        if (L->nb)
            for (o = 0; o < OC; ++o) {
                float s = 0.0f;
                for (p = 0; p < P; ++p) s += dyb[o * P + p];
                db[o] = b ? db[o] + s : s;
            }
    }
    if (!dx) return MNISTCU_OK;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(T) if (T > 1)
#endif
    for (bb = 0; bb < nb; ++bb) {
        float *dxb = dx + (size_t)bb * L->in_size, *dcol = m->scratch + (size_t)mnistcu__thread_index() * K * P;
        int c, iy, ix;
        /* dcol [K][P] = W^T [K][OC] . dy_b [OC][P] */
        mnistcu__cpu_gemm(m->ctx, 1, 0, K, P, OC, m->params + L->wo, K, dy + (size_t)bb * L->out_size, P, dcol, P);
        for (c = 0; c < g.c; ++c)
            for (iy = 0; iy < g.h; ++iy)
                for (ix = 0; ix < g.w; ++ix) *dxb++ = mnistcu__col2im_at(dcol, P, g, c, iy, ix);
    }
    return MNISTCU_OK;
}

#ifdef __CUDACC__
/* col [K][B*P]: sample b's positions in columns b*P .. b*P+P-1. */
__global__ void mnistcu__k_im2col(const float *x, mnistcu__geom g, int B, size_t in_size, float *col)
{
    MNISTCU__PDL_WAIT();
    size_t P = (size_t)g.oh * g.ow, BP = (size_t)B * P, n = (size_t)g.c * g.kh * g.kw * BP, e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t k = mnistcu__div(e, BP), q = mnistcu__mod(e, BP), b = mnistcu__div(q, P);
        col[e] = mnistcu__im2col_at(x + b * in_size, g, (int)k, (int)mnistcu__mod(q, P));
    }
}

/* y [B][OC][P] = act(prod [OC][B*P] + bias[oc]). */
__global__ void mnistcu__k_conv_out(const float *prod, const float *bias, int act, int B, int OC, int P, float *y)
{
    MNISTCU__PDL_WAIT();
    size_t n = (size_t)B * OC * P, e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t q = mnistcu__div(e, (size_t)P), p = e - q * (size_t)P, b = mnistcu__div(q, (size_t)OC), o = q - b * (size_t)OC;
        float v = prod[o * (size_t)B * P + b * P + p];
        y[e] = mnistcu__act_f((mnistcu_act)act, bias ? v + bias[o] : v);
    }
}

/* dprod [OC][B*P] = act'(y) dy, from dy and y [B][OC][P]. */
__global__ void mnistcu__k_conv_dout(const float *dy, const float *y, int act, int B, int OC, int P, float *dprod)
{
    MNISTCU__PDL_WAIT();
    size_t n = (size_t)B * OC * P, e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t q = mnistcu__div(e, (size_t)P), p = e - q * (size_t)P, b = mnistcu__div(q, (size_t)OC), o = q - b * (size_t)OC;
        dprod[o * (size_t)B * P + b * P + p] = mnistcu__act_backward_one((mnistcu_act)act, dy[e], y[e]);
    }
}

/* The same two passes, four elements a thread with their loads issued
   together (mnistcu__grid_1d_ok(n)): a warp takes 128 consecutive elements, lane l the
   l-th of each 32, so that every access stays coalesced, and steps its place
   by 32 without dividing. With one element a thread, each waited a load's
   latency (the Fashion CNN's conv2: 7.5 and 7.0 us for 2 MB each way, ncu);
   four consecutive elements a thread made every store a strided one (8.1 us).
   mnistcu__blocks4(n) threads. */
static unsigned mnistcu__blocks4(size_t n) { return mnistcu__blocks((n + 127) / 128 * 32); }
/* whether n threads, each knowing its index in 32 bits, fit one grid of mnistcu__blocks */
static int mnistcu__grid_1d_ok(size_t n) { return n <= (size_t)65535 * 32 * MNISTCU__THREADS; }
static __device__ __forceinline__ void mnistcu__step32(int *p, int *o, int *b, int P, int OC)
{
    *p += 32;
    while (*p >= P) {
        *p -= P;
        if (++*o == OC) {
            *o = 0;
            ++*b;
        }
    }
}
__global__ void mnistcu__k_conv_out4(const float *prod, const float *bias, int act, int B, int OC, int P, float *y)
{
    MNISTCU__PDL_WAIT();
    const int n = B * OC * P, t = (int)(blockIdx.x * blockDim.x + threadIdx.x), e0 = (t & ~31) * 4 + (t & 31);
    if (e0 >= n) return;
    const int q = e0 / P, BP = B * P;
    int p = e0 - q * P, b = q / OC, o = q - b * OC, k;
    float v[4], c[4];
#pragma unroll
    for (k = 0; k < 4; ++k)
        if (e0 + 32 * k < n) {
            v[k] = prod[o * BP + b * P + p];
            c[k] = bias ? bias[o] : 0.0f;
            mnistcu__step32(&p, &o, &b, P, OC);
        }
#pragma unroll
    for (k = 0; k < 4; ++k)
        if (e0 + 32 * k < n) y[e0 + 32 * k] = mnistcu__act_f((mnistcu_act)act, bias ? v[k] + c[k] : v[k]);
}
__global__ void mnistcu__k_conv_dout4(const float *dy, const float *y, int act, int B, int OC, int P, float *dprod)
{
    MNISTCU__PDL_WAIT();
    const int n = B * OC * P, t = (int)(blockIdx.x * blockDim.x + threadIdx.x), e0 = (t & ~31) * 4 + (t & 31);
    if (e0 >= n) return;
    const int q = e0 / P, BP = B * P;
    int p = e0 - q * P, b = q / OC, o = q - b * OC, k;
    float d[4], u[4];
#pragma unroll
    for (k = 0; k < 4; ++k)
        if (e0 + 32 * k < n) {
            d[k] = dy[e0 + 32 * k];
            u[k] = act != MNISTCU_ACT_IDENTITY ? y[e0 + 32 * k] : 0.0f;
        }
#pragma unroll
    for (k = 0; k < 4; ++k)
        if (e0 + 32 * k < n) {
            dprod[o * BP + b * P + p] = mnistcu__act_backward_one((mnistcu_act)act, d[k], u[k]);
            mnistcu__step32(&p, &o, &b, P, OC);
        }
}

/* dx [B][C][H][W] from dcol [K][B*P], one thread per input element. */
__global__ void mnistcu__k_col2im(const float *dcol, mnistcu__geom g, int B, float *dx)
{
    MNISTCU__PDL_WAIT();
    size_t S = (size_t)g.h * g.w, in_size = (size_t)g.c * S, n = (size_t)B * in_size, P = (size_t)g.oh * g.ow, e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t b = mnistcu__div(e, in_size), r = e - b * in_size, rs = mnistcu__div(r, S), rw = r - rs * S;
        int c = (int)rs, iy = (int)mnistcu__div(rw, (size_t)g.w), ix = (int)(rw - (size_t)iy * g.w);
        dx[e] = mnistcu__col2im_at(dcol + b * P, (size_t)B * P, g, c, iy, ix);
    }
}

/* The same passes with the batch and the channels (or the kernel rows) in the
   grid's y and z, so that a thread finds its element with one or two 32-bit
   divisions instead of seven (the Fashion CNN's conv2: im2col 48.7 -> 14.9 us,
   col2im 31.8 -> 21.4 us, ncu; bench/RESULTS.md); mnistcu__grid_yz_ok says where the grid can hold them.
   MNISTCU__PLANE_THREADS threads a block, x over one plane's positions. */
#define MNISTCU__PLANE_THREADS 128
static int mnistcu__grid_yz_ok(size_t y, size_t z) { return y >= 1 && y <= 65535 && z >= 1 && z <= 65535; }
static dim3 mnistcu__grid_plane(size_t n, size_t y, size_t z)
{
    return dim3((unsigned)((n + MNISTCU__PLANE_THREADS - 1) / MNISTCU__PLANE_THREADS), (unsigned)y, (unsigned)z);
}

/* col [K][B*P] as mnistcu__k_im2col: grid (positions, C kh, B); a thread copies
   its position's kw entries of kernel row (c, i). KW (3, 5; 0: g.kw at run
   time) known at compile time lets a thread load its KW entries together
   before it stores them (the Fashion CNN's conv2: 14.9 us, ncu, with the loads
   one after another, as the stores between them might have written x). */
template <int KW>
__global__ void mnistcu__k_im2col_rows(const float *x, mnistcu__geom g, int B, size_t in_size, float *col)
{
    MNISTCU__PDL_WAIT();
    const int P = g.oh * g.ow, p = (int)(blockIdx.x * blockDim.x + threadIdx.x), ci = (int)blockIdx.y;
    const int b = (int)blockIdx.z, c = ci / g.kh, i = ci - c * g.kh, oy = p / g.ow, ox = p - oy * g.ow;
    const int iy = oy * g.sh - g.pad + i, ix0 = ox * g.sw - g.pad, rowok = iy >= 0 && iy < g.h;
    const size_t BP = (size_t)B * (size_t)P;
    const float *xr = x + (size_t)b * in_size + ((size_t)c * g.h + (rowok ? iy : 0)) * g.w;
    float *o = col + (size_t)ci * g.kw * BP + (size_t)b * P + p;
    int j;
    if (p >= P) return;
    if (KW) {
        float v[KW ? KW : 1];
#pragma unroll
        for (j = 0; j < KW; ++j) {
            const int ix = ix0 + j;
            v[j] = rowok && ix >= 0 && ix < g.w ? xr[ix] : 0.0f;
        }
#pragma unroll
        for (j = 0; j < KW; ++j) o[(size_t)j * BP] = v[j];
    } else {
        for (j = 0; j < g.kw; ++j) {
            const int ix = ix0 + j;
            o[(size_t)j * BP] = rowok && ix >= 0 && ix < g.w ? xr[ix] : 0.0f;
        }
    }
}

/* dx as mnistcu__k_col2im for stride 1 (each input's terms in (i, j) order, as
   mnistcu__col2im_at): grid (positions, C, B). KS (3, 5; 0: the kernel size
   at run time) known at compile time: a thread's KS*KS loads issued together,
   then the terms inside the map added in order (skipped, not added as zero,
   so the bits stay the run-time loop's); with the loop at run time each load
   waited for the one before (the Fashion CNN's conv2: 16.7 us, ncu). */
template <int KS>
__global__ void mnistcu__k_col2im_s1(const float *dcol, mnistcu__geom g, int B, float *dx)
{
    MNISTCU__PDL_WAIT();
    const int S = g.h * g.w, P = g.oh * g.ow, e = (int)(blockIdx.x * blockDim.x + threadIdx.x), c = (int)blockIdx.y;
    const int b = (int)blockIdx.z, iy = e / g.w, ix = e - iy * g.w;
    const size_t ld = (size_t)B * (size_t)P;
    const float *d = dcol + (size_t)b * P;
    float s = 0.0f;
    int i, j;
    if (e >= S) return;
    if (KS) {
        float v[KS ? KS * KS : 1];
        int in[KS ? KS * KS : 1];
#pragma unroll
        for (i = 0; i < KS; ++i)
#pragma unroll
            for (j = 0; j < KS; ++j) {
                const int oy = iy + g.pad - i, ox = ix + g.pad - j, k = i * KS + j;
                in[k] = oy >= 0 && oy < g.oh && ox >= 0 && ox < g.ow;
                v[k] = in[k] ? d[(size_t)((c * KS + i) * KS + j) * ld + (size_t)oy * g.ow + ox] : 0.0f;
            }
#pragma unroll
        for (i = 0; i < KS * KS; ++i)
            if (in[i]) s += v[i];
    } else {
        for (i = 0; i < g.kh; ++i) {
            const int oy = iy + g.pad - i;
            if (oy < 0 || oy >= g.oh) continue;
            for (j = 0; j < g.kw; ++j) {
                const int ox = ix + g.pad - j;
                if (ox < 0 || ox >= g.ow) continue;
                s += d[(size_t)((c * g.kh + i) * g.kw + j) * ld + (size_t)oy * g.ow + ox];
            }
        }
    }
    dx[((size_t)b * g.c + c) * S + e] = s;
}

/* out[r] = sum of row r of a [rows][cols]: one block per row, a fixed-order tree. */
__global__ void mnistcu__k_row_sum(const float *a, size_t cols, float *out)
{
    MNISTCU__PDL_WAIT();
    __shared__ float part[MNISTCU__THREADS];
    const float *row = a + (size_t)blockIdx.x * cols;
    float s = 0.0f;
    size_t j;
    int t = (int)threadIdx.x, stride;
    for (j = (size_t)t; j < cols; j += MNISTCU__THREADS) s += row[j];
    part[t] = s;
    __syncthreads();
    for (stride = MNISTCU__THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) part[t] += part[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = part[0];
}

/* Direct kernels, for few input channels: LeNet's two convolutions, the Fashion
   CNN's first. No columns: one thread per output (forward) or input (input
   gradient), or per R of them (below), the weights in shared memory, each sum
   in (c, i, j) order as the product over columns does; the weight gradient of
   one (out, in) channel pair per block, summed over positions in a fixed tree
   and over batch slices in order (or, with many pairs, every pair of a batch
   slice per block: mnistcu__k_conv_dw_slice). Measured on an H100 against im2col + our product (bench/cuda_conv.cu,
   v2 against v1, microseconds per pass in a graph): LeNet conv1 forward 4.6
   against 18.7 and weight gradient 10.7 against 28.5; conv2 6.8 / 14.4 and
   11.9 / 18.2; the Fashion CNN's conv1 weight gradient 20.2 / 47.4. With 64
   input channels it loses by 2-7x (conv2 of the Fashion CNN), so square 3x3 and
   5x5 kernels over at most 16 input channels take this path.
   STAGE: the forward pass first copies the sample's whole input, and the input
   gradient the sample's whole output gradient, into shared memory with all
   their loads at once, where a chain of fmas that each waited for its own load
   from L2 was bound by that latency (LeNet's conv2 input gradient: 21 us a step
   at batch 64, its forward 16); the same sums in the same order. Where weights
   and sample do not fit in 48 KB, the loads stay in the chain. */
#define MNISTCU__CONV_STAGE_BYTES 49152 /* weights and a staged sample: within the 48 KB any GPU gives a block */
/* R: a thread computes R channels at its position (forward: output channels; input gradient: input
   channels), so that each value it reads from the sample feeds R fmas; each output's chain stays the
   same, in the same order, so R changes no bit. R = 4 where that still leaves at least
   MNISTCU__CONV_R4_THREADS threads (measured on an H100: a P6 step's 16 -> 32 channel 3x3 convolution
   at batch 128, 200,704 threads, forward 51 -> 36 us, input gradient (100,352) 67 -> 52; LeNet-5's
   second at batch 64, 25,600 threads, forward 10 -> 21 us: too few threads left to hide latency). */
#define MNISTCU__CONV_R4_THREADS 98304

template <int KS, int R, int STAGE>
__global__ void __launch_bounds__(256) mnistcu__k_conv_direct_fwd(const float *__restrict__ x, const float *__restrict__ w,
                                                                   const float *__restrict__ bias, float *__restrict__ y,
                                                                   mnistcu__geom g, int OC, int CG, int act)
{
    MNISTCU__PDL_WAIT();
    extern __shared__ float wsm[]; /* [CG][K] the weights of this block's CG output channels; STAGE: then the image */
    const int P = g.oh * g.ow, K = g.c * KS * KS, b = (int)blockIdx.z, g0 = (int)blockIdx.y * CG;
    int i, idx, c, p, y0, x0, ci, r, s2, j;
    const float *xb, *wc;
    float acc[R] = {0.0f};
    for (i = (int)threadIdx.x; i < CG * K; i += (int)blockDim.x) wsm[i] = w[(size_t)g0 * K + i];
    xb = x + (size_t)b * g.c * g.h * g.w;
    if (STAGE) { /* the sample's whole input, loaded at once, then read from shared memory */
        float *xs = wsm + CG * K;
        for (i = (int)threadIdx.x; i < g.c * g.h * g.w; i += (int)blockDim.x) xs[i] = __ldg(xb + i);
        xb = xs;
    }
    __syncthreads();
    idx = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (idx >= (CG + R - 1) / R * P) return;
    c = idx / P * R;
    p = idx % P;
    y0 = (p / g.ow) * g.sh - g.pad;
    x0 = (p % g.ow) * g.sw - g.pad;
    wc = wsm + c * K;
    for (ci = 0; ci < g.c; ++ci, wc += KS * KS) {
        const float *xc = xb + (size_t)ci * g.h * g.w;
#pragma unroll
        for (r = 0; r < KS; ++r) {
            int iy = y0 + r;
            if (iy < 0 || iy >= g.h) continue;
#pragma unroll
            for (s2 = 0; s2 < KS; ++s2) {
                int ix = x0 + s2;
                if (ix >= 0 && ix < g.w) {
                    float xv = STAGE ? xc[iy * g.w + ix] : __ldg(xc + iy * g.w + ix);
#pragma unroll
                    for (j = 0; j < R; ++j)
                        if (R == 1 || c + j < CG) acc[j] = fmaf(wc[j * K + r * KS + s2], xv, acc[j]);
                }
            }
        }
    }
#pragma unroll
    for (j = 0; j < R; ++j)
        if (R == 1 || c + j < CG)
            y[((size_t)b * OC + g0 + c + j) * P + p] =
                mnistcu__act_f((mnistcu_act)act, bias ? acc[j] + bias[g0 + c + j] : acc[j]);
}

/* UNIT: stride 1, where finding the outputs an input reaches needs no division. */
template <int KS, int R, int UNIT, int STAGE>
__global__ void __launch_bounds__(256) mnistcu__k_conv_direct_dx(const float *__restrict__ dy, const float *__restrict__ w,
                                                                  float *__restrict__ dx, mnistcu__geom g, int OC, int CIG)
{
    MNISTCU__PDL_WAIT();
    extern __shared__ float wsm[]; /* [OC][CIG][KS*KS] the weights reaching this block's CIG input channels;
                                      STAGE: then the sample's output gradient [OC][P] */
    const int P = g.oh * g.ow, KK = KS * KS, S = g.h * g.w, b = (int)blockIdx.z, c0 = (int)blockIdx.y * CIG;
    int i, idx, c, iy, ix, co, r, s2, j;
    const float *gb = dy + (size_t)b * OC * P;
    float acc[R] = {0.0f};
    for (i = (int)threadIdx.x; i < OC * CIG * KK; i += (int)blockDim.x)
        wsm[i] = w[((size_t)(i / (CIG * KK)) * g.c + c0) * KK + i % (CIG * KK)];
    if (STAGE) {
        float *gs = wsm + OC * CIG * KK;
        for (i = (int)threadIdx.x; i < OC * P; i += (int)blockDim.x) gs[i] = __ldg(gb + i);
        gb = gs;
    }
    __syncthreads();
    idx = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (idx >= (CIG + R - 1) / R * S) return;
    c = idx / S * R;
    iy = (idx % S) / g.w;
    ix = idx % g.w;
    for (co = 0; co < OC; ++co) {
        const float *gy = gb + (size_t)co * P, *wk = wsm + (co * CIG + c) * KK;
#pragma unroll
        for (r = 0; r < KS; ++r) {
            int ty = iy + g.pad - r, oy;
            if (ty < 0 || (!UNIT && ty % g.sh)) continue;
            oy = UNIT ? ty : ty / g.sh;
            if (oy >= g.oh) continue;
#pragma unroll
            for (s2 = 0; s2 < KS; ++s2) {
                int tx = ix + g.pad - s2, ox;
                if (tx < 0 || (!UNIT && tx % g.sw)) continue;
                ox = UNIT ? tx : tx / g.sw;
                if (ox < g.ow) {
                    float gv = STAGE ? gy[oy * g.ow + ox] : __ldg(gy + oy * g.ow + ox);
#pragma unroll
                    for (j = 0; j < R; ++j)
                        if (R == 1 || c + j < CIG) acc[j] = fmaf(wk[j * KK + r * KS + s2], gv, acc[j]);
                }
            }
        }
    }
#pragma unroll
    for (j = 0; j < R; ++j)
        if (R == 1 || c + j < CIG) dx[((size_t)b * g.c + c0 + c + j) * S + (size_t)iy * g.w + ix] = acc[j];
}

/* An index i = (a * n1 + b) * n0 + c walked in steps of d without a division a step: the three
   parts move by those of d, each carrying into the next (the staging loops of the tiles below). */
typedef struct mnistcu__walk3 { int c, b, a, dc, db, da; } mnistcu__walk3;
static __device__ __forceinline__ mnistcu__walk3 mnistcu__walk3_at(int i, int d, int n0, int n1)
{
    mnistcu__walk3 w;
    w.c = i % n0; w.b = i / n0 % n1; w.a = i / n0 / n1;
    w.dc = d % n0; w.db = d / n0 % n1; w.da = d / n0 / n1;
    return w;
}
static __device__ __forceinline__ void mnistcu__walk3_next(mnistcu__walk3 *w, int n0, int n1)
{
    w->c += w->dc;
    w->b += w->db;
    w->a += w->da;
    if (w->c >= n0) {
        w->c -= n0;
        ++w->b;
    }
    if (w->b >= n1) {
        w->b -= n1;
        ++w->a;
    }
}

/* Fills shared memory with n values, eight loads in flight a thread (a loop that stored each value
   as it arrived waited for every load in turn: 40% of the tiles' time, ncu). f.load(k, i, &at)
   reads value i, whose parts k walks as above with sizes n0 and n1, and says where it goes. */
template <typename F>
static __device__ __forceinline__ void mnistcu__stage8(int n, int n0, int n1, float *dst, F f)
{
    const int bd = (int)blockDim.x;
    mnistcu__walk3 k = mnistcu__walk3_at((int)threadIdx.x, bd, n0, n1);
    int i, u;
    for (i = (int)threadIdx.x; i < n; i += 8 * bd) {
        float v[8];
        int at[8];
#pragma unroll
        for (u = 0; u < 8; ++u) {
            at[u] = -1;
            v[u] = 0.0f;
            if (i + u * bd < n) v[u] = f.load(k, i + u * bd, &at[u]);
            mnistcu__walk3_next(&k, n0, n1);
        }
#pragma unroll
        for (u = 0; u < 8; ++u)
            if (at[u] >= 0) dst[at[u]] = v[u];
    }
}

/* Planes [a][n1 rows][n0 columns] with a border of pad zeros on each side, from src [a][ih][iw]. */
struct mnistcu__stage_planes {
    const float *src;
    int off, pad, ih, iw;
    __device__ float load(const mnistcu__walk3 &k, int i, int *at) const
    {
        const int iy = k.b - pad, ix = k.c - pad;
        *at = off + i;
        return iy >= 0 && iy < ih && ix >= 0 && ix < iw ? __ldg(src + ((size_t)k.a * ih + iy) * iw + ix) : 0.0f;
    }
};

/* Register tiles for stride 1. The forward pass and the input gradient are both a correlation of a
   stack of planes with KS x KS windows: forward, of the sample's input with the weights; input
   gradient, of its output gradient with the weights turned round (REV: weight (r, s) meets the
   window's row KS-1-r and column KS-1-s), so that every sum still runs over (channel, r, s) in
   ascending order, as in the kernels above. The block copies its sample's planes into shared
   memory with a border of zeros (pad wide on each side: forward the layer's padding, input gradient
   KS-1 less it), and its weights as [in channel][out group of R][r][s][R]. A thread then makes R
   consecutive output channels at QY rows of one column: for each input channel it holds the
   (QY+KS-1) x KS window in registers and reads R weights at once, 27 shared loads for 144 fmas at
   3x3, R = QY = 4, where the kernels above make one load (or five for four) a fma. The border's
   fmas add w x 0: for finite weights that leaves the sum's bits as they were (the sum is never -0,
   starting at +0), so the result is the same as the kernels above, bit for bit. */
typedef struct mnistcu__tgeom {
    int ic, ih, iw; /* the correlation's input planes a sample (forward x's, input gradient dy's) */
    int oc, oh, ow; /* its output planes a sample (forward y's, input gradient dx's) */
    int pad;        /* the border */
    int cg;         /* output channels a block, blockIdx.y their group */
    int sh, sw;     /* the staged planes: ceil(oh / QY) * QY + KS - 1 rows of ow + KS - 1 */
    int wcc, wci;   /* the weights of (out c, in i) start at (c * wcc + i * wci) * KS * KS */
} mnistcu__tgeom;

/* The weights as [in channel][group of R out channels][r][s][R], so that a thread's R weights of
   each (r, s) sit at a fixed offset from one base an input channel; read in their own order:
   forward (c, cc, rs) with n1 = in channels, input gradient (cc, c, rs) with n1 = the block's
   channels. rsh = log2 R. */
struct mnistcu__stage_tile_w {
    const float *w;
    int g0, wcc, wci, ng, kk, rev, rsh;
    __device__ float load(const mnistcu__walk3 &k, int i, int *at) const
    {
        const int c = rev ? k.b : k.a, cc = rev ? k.a : k.b;
        (void)i;
        *at = (((cc * ng + (c >> rsh)) * kk + k.c) << rsh) + (c & ((1 << rsh) - 1));
        return __ldg(w + ((size_t)(g0 + c) * wcc + (size_t)cc * wci) * kk + k.c);
    }
};

template <int KS, int R, int QY, int REV>
__global__ void __launch_bounds__(256) mnistcu__k_conv_tile(const float *__restrict__ in, const float *__restrict__ w,
                                                             const float *__restrict__ bias, float *__restrict__ out,
                                                             mnistcu__tgeom t, int act)
{
    MNISTCU__PDL_WAIT();
    extern __shared__ float4 mnistcu__tile_sm4[];
    const int KK = KS * KS, b = (int)blockIdx.z, g0 = (int)blockIdx.y * t.cg, NG = t.cg / R;
    float *ws = (float *)mnistcu__tile_sm4, *xs = ws + (size_t)t.ic * KK * t.cg;
    const float *inb = in + (size_t)b * t.ic * t.ih * t.iw;
    float acc[QY][R];
    int ci, r, s, q, j;
    {
        const mnistcu__stage_tile_w fw = {w, g0, t.wcc, t.wci, NG, KK, REV, R == 4 ? 2 : R == 2 ? 1 : 0};
        const mnistcu__stage_planes fx = {inb, 0, t.pad, t.ih, t.iw};
        mnistcu__stage8(t.cg * t.ic * KK, KK, REV ? t.cg : t.ic, ws, fw);
        mnistcu__stage8(t.ic * t.sh * t.sw, t.sw, t.sh, xs, fx);
    }
    __syncthreads();
    {
        const int idx = (int)(blockIdx.x * blockDim.x + threadIdx.x), QT = (t.oh + QY - 1) / QY;
        if (idx >= NG * QT * t.ow) return;
        const int ox = idx % t.ow, rest = idx / t.ow, gi = rest % NG, cl = gi * R, y0 = rest / NG * QY;
#pragma unroll
        for (q = 0; q < QY; ++q)
#pragma unroll
            for (j = 0; j < R; ++j) acc[q][j] = 0.0f;
        for (ci = 0; ci < t.ic; ++ci) {
            const float *xc = xs + ((size_t)ci * t.sh + y0) * t.sw + ox, *wc = ws + ((size_t)ci * NG + gi) * KK * R;
            float xv[QY + KS - 1][KS];
#pragma unroll
            for (r = 0; r < QY + KS - 1; ++r)
#pragma unroll
                for (s = 0; s < KS; ++s) xv[r][s] = xc[r * t.sw + s];
#pragma unroll
            for (r = 0; r < KS; ++r) {
#pragma unroll
                for (s = 0; s < KS; ++s) {
                    const float *wp = wc + (r * KS + s) * R;
                    float wv[R];
                    if (R == 4) {
                        const float4 v = *(const float4 *)wp;
                        wv[0] = v.x; wv[1 % R] = v.y; wv[2 % R] = v.z; wv[3 % R] = v.w;
                    } else if (R == 2) {
                        const float2 v = *(const float2 *)wp;
                        wv[0] = v.x; wv[1 % R] = v.y;
                    } else {
#pragma unroll
                        for (j = 0; j < R; ++j) wv[j] = wp[j];
                    }
#pragma unroll
                    for (q = 0; q < QY; ++q)
#pragma unroll
                        for (j = 0; j < R; ++j)
                            acc[q][j] = fmaf(wv[j], xv[q + (REV ? KS - 1 - r : r)][REV ? KS - 1 - s : s], acc[q][j]);
                }
            }
        }
#pragma unroll
        for (q = 0; q < QY; ++q) {
            if (y0 + q >= t.oh) break;
#pragma unroll
            for (j = 0; j < R; ++j) {
                const int c = g0 + cl + j;
                out[(((size_t)b * t.oc + c) * t.oh + y0 + q) * t.ow + ox] =
                    mnistcu__act_f((mnistcu_act)act, bias ? acc[q][j] + bias[c] : acc[q][j]);
            }
        }
    }
}

/* The register tiles where they fit: stride 1, output channels a multiple of 2 (R = 4 where a
   multiple of 4), the most of them a block whose weights and the staged planes fit in
   MNISTCU__CONV_TILE_BYTES (64 KB, or what the GPU gives a block if less: P6's second convolution's
   input gradient stages 32 planes of 18 x 16 and the weights of 16 channels, 55 KB), and enough
   threads to fill the GPU (MNISTCU__CONV_TILE_THREADS; below it the kernels above, a thread an
   output, keep more threads in flight). Fills *t and returns R, or 0 where the tiles do not apply. */
#define MNISTCU__CONV_TILE_QY 4
#define MNISTCU__CONV_TILE_BYTES 65536
#ifndef MNISTCU__CONV_TILE_THREADS
#define MNISTCU__CONV_TILE_THREADS 16384
#endif
/* The shared memory a tile kernel's block may stage: MNISTCU__CONV_TILE_BYTES, or less where the GPU
   gives less. */
static size_t mnistcu__conv_tile_bytes(const mnistcu_ctx *ctx)
{
    const size_t optin = mnistcu__cu(ctx)->smem_optin;
    return optin < MNISTCU__CONV_TILE_BYTES ? optin : MNISTCU__CONV_TILE_BYTES;
}

static int mnistcu__conv_tile_plan(const mnistcu_ctx *ctx, mnistcu__tgeom *t, int ks, size_t B)
{
    const size_t limit = mnistcu__conv_tile_bytes(ctx);
    const int QY = MNISTCU__CONV_TILE_QY, R = t->oc % 4 == 0 ? 4 : t->oc % 2 == 0 ? 2 : 0;
    size_t xs, need;
    int cg;
    if (!R || t->pad < 0 || t->pad > ks - 1) return 0;
    t->sh = (t->oh + QY - 1) / QY * QY + ks - 1;
    t->sw = t->ow + ks - 1;
    if ((size_t)(t->oc / R) * (size_t)((t->oh + QY - 1) / QY) * (size_t)t->ow * B < MNISTCU__CONV_TILE_THREADS) return 0;
    xs = (size_t)t->ic * t->sh * t->sw;
    for (cg = t->oc; cg >= R; cg -= R) {
        if (t->oc % cg || cg % R) continue;
        need = ((size_t)t->ic * ks * ks * cg + xs) * sizeof(float);
        if (need <= limit || need <= MNISTCU__CONV_STAGE_BYTES) {
            t->cg = cg;
            return R;
        }
    }
    return 0;
}

static void mnistcu__conv_tile_launch(cudaStream_t st, int ks, int R, int rev, const mnistcu__tgeom *t, size_t B,
                                      const float *in, const float *w, const float *bias, float *out, int act)
{
    const int QY = MNISTCU__CONV_TILE_QY;
    const size_t sm = ((size_t)t->ic * ks * ks * t->cg + (size_t)t->ic * t->sh * t->sw) * sizeof(float);
    dim3 grid((unsigned)(((size_t)(t->cg / R) * ((t->oh + QY - 1) / QY) * t->ow + 255) / 256), (unsigned)(t->oc / t->cg),
              (unsigned)B);
#define MNISTCU__TILE(KS_, R_, REV_)                                                                                 \
    do {                                                                                                             \
        if (sm > MNISTCU__CONV_STAGE_BYTES) /* above the 48 KB every GPU gives: asked for (the plan saw it fit) */ \
            (void)cudaFuncSetAttribute(mnistcu__k_conv_tile<KS_, R_, MNISTCU__CONV_TILE_QY, REV_>,                  \
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);                        \
        mnistcu__launch(mnistcu__k_conv_tile<KS_, R_, MNISTCU__CONV_TILE_QY, REV_>, grid, 256, sm, st, in, w, bias, \
                        out, *t, act);                                                                               \
    } while (0)
    if (ks == 5) {
        if (R == 4) { if (rev) MNISTCU__TILE(5, 4, 1); else MNISTCU__TILE(5, 4, 0); }
        else { if (rev) MNISTCU__TILE(5, 2, 1); else MNISTCU__TILE(5, 2, 0); }
    } else {
        if (R == 4) { if (rev) MNISTCU__TILE(3, 4, 1); else MNISTCU__TILE(3, 4, 0); }
        else { if (rev) MNISTCU__TILE(3, 2, 1); else MNISTCU__TILE(3, 2, 0); }
    }
#undef MNISTCU__TILE
}

/* The weight gradient in register tiles, stride 1: a unit is G output channels x H input
   channels, ps warps a unit (phases of the positions: lane l of phase ph takes positions
   32 ph + l, then every 32 ps, of each sample of the block's batch slice in order), the slice's
   input planes staged with a border of zeros and its output gradients for the block's units
   beside them. Each position's G output gradients and H x KS x KS inputs feed G x H x KS x KS
   fmas (72 for 22 loads at 3x3, G = 4, H = 2), where the kernels above make one or two loads a
   fma. At the end each warp's 32 lanes are added in a fixed butterfly (every lane gets the same
   bits), the phases in order, into the slice's row of part [Z][OC*C][KK] (partb [Z][OC] from the
   units of input group 0), which mnistcu__k_conv_direct_dw_sum adds over slices in order. Where the
   input channels make one group (a first convolution), each output gradient feeds one warp only: GDY
   reads them from global memory, a position ahead, instead of staging them (the same values in the same
   order; P6's first convolution 12.0 -> 9.5 us, its stage 54 -> 4 KB; bench/RESULTS.md). */
typedef struct mnistcu__dwgeom {
    mnistcu__geom g;
    int oc, B, bper, cb;     /* a block's slice of bper samples, staged cb at a time */
    int ub, ps;              /* ub units a block, each ps warps (phases of the positions) */
    int gdy;                 /* one group of input channels: each output gradient is read once, from global
                                memory, not staged (GDY below) */
    int sh, sw;          /* the staged input planes: h + 2 pad rows of w + 2 pad */
} mnistcu__dwgeom;

/* Output gradients [a][n1 channels from co_lo][n0 positions] of the samples from b0. */
struct mnistcu__stage_dy {
    const float *dy;
    int off, b0, oc, co_lo, p;
    __device__ float load(const mnistcu__walk3 &k, int i, int *at) const
    {
        *at = off + i;
        return __ldg(dy + ((size_t)(b0 + k.a) * oc + co_lo + k.b) * p + k.c);
    }
};

/* GDY 2: dy is the output gradient of the 2x2 max pool of stride 2 after the convolution (pooled
   planes oh x ow a channel), routed here as that pool's backward pass would have written it: a
   position gets its window's gradient where the window's argmax is that position and, with a ReLU
   folded into the convolution or the pool (y: the pool's output, else NULL), the pool's output is
   above zero, else zero. Above zero at the argmax is the same test as the ReLU' of the convolution's
   output there (the max is that output), so the values, and the sums over them, are the bits the
   unrouted path makes (mnistcu__conv_pool_route). */
typedef struct mnistcu__dyroute {
    const int32_t *arg;
    const float *y;
    int oh, ow;
} mnistcu__dyroute;

/* A position's G windows (channels P apart): their gradients, argmaxes and pool outputs loaded
   together, whether or not the position is its window's argmax (the test comes when they are used). */
template <int G>
static __device__ __forceinline__ void mnistcu__route_load(const float *gb, const mnistcu__dyroute &rt, int P, int oy,
                                                           int ox, int OW, float *dv, int32_t *av, float *yv, int *self)
{
    const int py = oy >> 1, px = ox >> 1, ok = py < rt.oh && px < rt.ow, o = ok ? py * rt.ow + px : 0;
    int j;
    *self = ok ? oy * OW + ox : -1; /* outside every window: matches no argmax */
#pragma unroll
    for (j = 0; j < G; ++j) {
        dv[j] = __ldg(gb + (size_t)j * P + o);
        av[j] = __ldg(rt.arg + (size_t)j * P + o);
        yv[j] = rt.y ? __ldg(rt.y + (size_t)j * P + o) : 1.0f;
    }
}

template <int KS, int G, int H, int GDY>
__global__ void __launch_bounds__(256) mnistcu__k_conv_dw_tile(const float *__restrict__ x, const float *__restrict__ dy,
                                                                float *__restrict__ part, float *__restrict__ partb,
                                                                mnistcu__dwgeom d, mnistcu__dyroute rt)
{
    MNISTCU__PDL_WAIT();
    extern __shared__ float4 mnistcu__dwt_sm4[];
    const int KK = KS * KS, NV = G * H * KK + G, C = d.g.c, P = d.g.oh * d.g.ow, OW = d.g.ow, NCI = C / H;
    const int U = d.oc / G * NCI, u0 = (int)blockIdx.x * d.ub, ulast = u0 + d.ub - 1 < U - 1 ? u0 + d.ub - 1 : U - 1;
    const int co_lo = u0 / NCI * G, nco = (ulast / NCI + 1) * G - co_lo, z = (int)blockIdx.y;
    const int b0 = z * d.bper, nb = b0 + d.bper < d.B ? d.bper : d.B - b0, XS = C * d.sh * d.sw;
    const int lane = (int)threadIdx.x & 31, wi = (int)threadIdx.x >> 5, ul = wi % d.ub, ph = wi / d.ub, u = u0 + ul;
    float *sm = (float *)mnistcu__dwt_sm4;
    float acc[G][H][KS * KS], accb[G];
    int i, j, h, r, s, bi, c0;
#pragma unroll
    for (j = 0; j < G; ++j) {
        accb[j] = 0.0f;
#pragma unroll
        for (h = 0; h < H; ++h)
#pragma unroll
            for (i = 0; i < KK; ++i) acc[j][h][i] = 0.0f;
    }
    for (c0 = 0; c0 < nb; c0 += d.cb) {
        const int cn = nb - c0 < d.cb ? nb - c0 : d.cb;
        if (c0) __syncthreads(); /* the last chunk's reads are done */
        { /* the chunk's input planes [cn][C][sh][sw] with their border, then its output gradients [cn][nco][P] */
            const mnistcu__stage_planes fx = {x + (size_t)(b0 + c0) * C * d.g.h * d.g.w, 0, d.g.pad, d.g.h, d.g.w};
            const mnistcu__stage_dy fg = {dy, cn * XS, b0 + c0, d.oc, co_lo, P};
            mnistcu__stage8(cn * XS, d.sw, d.sh, sm, fx);
            if (!GDY) mnistcu__stage8(cn * nco * P, P, nco, sm, fg);
        }
        __syncthreads();
        if (u > ulast) continue;
        { /* lane l of phase ph: positions ph * 32 + l, then every 32 * ps */
            const int co0 = u / NCI * G, ci0 = u % NCI * H, step = 32 * d.ps, dq = step / OW, dr = step % OW;
            for (bi = 0; bi < cn; ++bi) {
                const float *xb = sm + (size_t)bi * XS + (size_t)ci0 * d.sh * d.sw;
                const int PR = GDY == 2 ? rt.oh * rt.ow : P; /* the planes dy holds */
                const float *gb = GDY ? dy + ((size_t)(b0 + c0 + bi) * d.oc + co0) * PR
                                      : sm + (size_t)cn * XS + ((size_t)bi * nco + (co0 - co_lo)) * P;
                const mnistcu__dyroute rb = {GDY == 2 ? rt.arg + (gb - dy) : NULL, GDY == 2 && rt.y ? rt.y + (gb - dy) : NULL,
                                             rt.oh, rt.ow};
                int p = ph * 32 + lane, oy = p / OW, ox = p % OW, rself = -1;
                float gn[G]; /* GDY: the next position's output gradients, loaded a position ahead */
                int32_t ra[G]; /* GDY 2: and their windows' argmaxes and pool outputs */
                float ry[G];
                if (GDY == 2 && p < P) mnistcu__route_load<G>(gb, rb, PR, oy, ox, OW, gn, ra, ry, &rself);
                else {
#pragma unroll
                    for (j = 0; j < G; ++j) gn[j] = GDY && p < P ? __ldg(gb + j * P + p) : 0.0f;
                }
                for (; p < P; p += step) {
                    const float *xp = xb + oy * d.sw + ox;
                    float gv[G];
#pragma unroll
                    for (j = 0; j < G; ++j) {
                        gv[j] = GDY == 2 ? (ra[j] == rself && ry[j] > 0.0f ? gn[j] : 0.0f) : GDY ? gn[j] : gb[j * P + p];
                        accb[j] += gv[j];
                    }
                    if (GDY == 2 && p + step < P) {
                        const int ny = oy + dq + (ox + dr >= OW), nx = ox + dr >= OW ? ox + dr - OW : ox + dr;
                        mnistcu__route_load<G>(gb, rb, PR, ny, nx, OW, gn, ra, ry, &rself);
                    } else if (GDY && p + step < P) {
#pragma unroll
                        for (j = 0; j < G; ++j) gn[j] = __ldg(gb + j * P + p + step);
                    }
#pragma unroll
                    for (h = 0; h < H; ++h)
#pragma unroll
                        for (r = 0; r < KS; ++r)
#pragma unroll
                            for (s = 0; s < KS; ++s) {
                                const float xv = xp[(h * d.sh + r) * d.sw + s];
#pragma unroll
                                for (j = 0; j < G; ++j) acc[j][h][r * KS + s] = fmaf(gv[j], xv, acc[j][h][r * KS + s]);
                            }
                    ox += dr;
                    oy += dq;
                    if (ox >= OW) {
                        ox -= OW;
                        ++oy;
                    }
                }
            }
        }
    }
    __syncthreads(); /* the stage is free: each warp's sums go there, [ph][ul][NV] */
    /* the lanes' sums in a fixed butterfly (every lane gets the same bits); lane l stores values l, l + 32, ... */
#pragma unroll
    for (j = 0; j < G; ++j) {
#pragma unroll
        for (h = 0; h < H; ++h)
#pragma unroll
            for (i = 0; i < KK; ++i) {
                float v = acc[j][h][i];
                int m;
                for (m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
                if (lane == (((j * H + h) * KK + i) & 31)) sm[(size_t)wi * NV + (j * H + h) * KK + i] = v;
            }
        {
            float v = accb[j];
            int m;
            for (m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
            if (lane == j) sm[(size_t)wi * NV + G * H * KK + j] = v;
        }
    }
    __syncthreads();
    for (i = (int)threadIdx.x; i < d.ub * NV; i += (int)blockDim.x) { /* the phases' sums added in order */
        const int uu = u0 + i / NV, k = i % NV, co0 = uu / NCI * G, ci0 = uu % NCI * H;
        float v = 0.0f;
        int q;
        if (uu > ulast) continue;
        for (q = 0; q < d.ps; ++q) v += sm[((size_t)q * d.ub + i / NV) * NV + k];
        if (k < G * H * KK)
            part[((size_t)z * d.oc * C + (size_t)(co0 + k / (H * KK)) * C + ci0 + k / KK % H) * KK + k % KK] = v;
        else if (ci0 == 0)
            partb[(size_t)z * d.oc + co0 + (k - G * H * KK)] = v;
    }
}

/* Plans the tiles of the weight gradient: stride 1; 3x3 with G = 4 (output channels a multiple of
   4), 5x5 with G = 2 (a multiple of 2), H = 2 where the input channels are even, else 1; up to 8
   units a block, fewer where one sample's stage would not fit MNISTCU__CONV_TILE_BYTES; slices that
   make about two blocks a multiprocessor of an H100 (P6's second convolution: 4 samples, 256
   blocks), staged as many samples at a time as fit.
   Returns G, or 0 where the tiles do not apply. */
static int mnistcu__conv_dw_tile_plan(const mnistcu_ctx *ctx, mnistcu__dwgeom *d, size_t *smem, int *Z)
{
    const mnistcu__geom g = d->g;
    const size_t limit = mnistcu__conv_tile_bytes(ctx);
    const int G = g.kh == 3 ? 4 : 2, H = g.c % 2 ? 1 : 2, P = g.oh * g.ow;
    int U, ub, nblk, fit, want;
    size_t per = 0, xs;
    if (g.sh != 1 || g.sw != 1 || d->oc % G) return 0;
    U = d->oc / G * (g.c / H);
    d->sh = g.h + 2 * g.pad;
    d->sw = g.w + 2 * g.pad;
    xs = (size_t)g.c * d->sh * d->sw;
    d->gdy = g.c / H == 1;
    for (ub = U < 8 ? U : 8; ub >= 1; --ub) { /* ub units span at most ceil((ub - 1) / NCI) + 1 output groups */
        const int nco = ((ub - 1 + g.c / H - 1) / (g.c / H) + 1) * G;
        per = (xs + (d->gdy ? 0 : (size_t)(nco < d->oc ? nco : d->oc) * P)) * sizeof(float);
        if (per <= limit) break;
    }
    if (ub < 1) return 0;
    nblk = (U + ub - 1) / ub;
    d->ps = 8 / ub < (P + 31) / 32 ? 8 / ub : (P + 31) / 32;
    if (d->ps < 1) d->ps = 1;
    fit = (int)(limit / per);
    want = (int)(((size_t)d->B * nblk + 263) / 264);
    d->bper = want < 1 ? 1 : want;
    d->cb = d->bper < fit ? d->bper : fit;
    d->ub = ub;
    *Z = (d->B + d->bper - 1) / d->bper;
    *smem = per * (size_t)d->cb;
    { /* the warps' sums reuse the stage at the end */
        const size_t red = (size_t)ub * d->ps * (size_t)(G * H * g.kh * g.kw + G) * sizeof(float);
        if (*smem < red) *smem = red;
    }
    return G;
}

/* Slice z of the batch, (out, in) channel pair blockIdx.x: part [Z][OC*C][KK], partb [Z][OC].
   STAGE: the slice's input planes of channel ci and output gradient planes of channel co first
   copied into shared memory at once (see the forward kernel). */
template <int KS, int STAGE>
__global__ void __launch_bounds__(256) mnistcu__k_conv_direct_dw(const float *__restrict__ x, const float *__restrict__ dy,
                                                                  float *__restrict__ part, float *__restrict__ partb,
                                                                  mnistcu__geom g, int OC, int B, int bper)
{
    MNISTCU__PDL_WAIT();
    __shared__ float red[KS * KS + 1][MNISTCU__THREADS];
    extern __shared__ float sl[]; /* STAGE: [b1 - b0][H*W] inputs, then [b1 - b0][P] output gradients */
    const int P = g.oh * g.ow, HW = g.h * g.w, t = (int)threadIdx.x, pair = (int)blockIdx.x, co = pair / g.c;
    const int ci = pair % g.c, z = (int)blockIdx.y, b0 = z * bper, b1 = b0 + bper < B ? b0 + bper : B;
    const int n_total = b1 > b0 ? (b1 - b0) * P : 0;
    float acc[KS * KS], accb = 0.0f;
    int j, n, stride;
    for (j = 0; j < KS * KS; ++j) acc[j] = 0.0f;
    if (STAGE) {
        for (j = t; j < (b1 - b0) * HW; j += MNISTCU__THREADS)
            sl[j] = __ldg(x + ((size_t)(b0 + j / HW) * g.c + ci) * HW + j % HW);
        for (j = t; j < n_total; j += MNISTCU__THREADS)
            sl[(b1 - b0) * HW + j] = __ldg(dy + ((size_t)(b0 + j / P) * OC + co) * P + j % P);
        __syncthreads();
    }
    /* position n = t, t + 256, ...: sample b, output (oy, ox), stepped without a division */
    const int dqb = MNISTCU__THREADS / P, dpr = MNISTCU__THREADS - dqb * P, dqy = dpr / g.ow, dqx = dpr - dqy * g.ow;
    int sb = b0 + t / P, soy = (t % P) / g.ow, sox = (t % P) % g.ow;
    for (n = t; n < n_total; n += MNISTCU__THREADS) {
        const int b = sb, p = soy * g.ow + sox, y0 = soy * g.sh - g.pad, x0 = sox * g.sw - g.pad;
        int r, s2;
        float gv = STAGE ? sl[(b1 - b0) * HW + n] : __ldg(dy + ((size_t)b * OC + co) * P + p);
        sox += dqx;
        soy += dqy;
        sb += dqb;
        if (sox >= g.ow) {
            sox -= g.ow;
            ++soy;
        }
        if (soy >= g.oh) {
            soy -= g.oh;
            ++sb;
        }
        const float *xc = STAGE ? sl + (size_t)(b - b0) * HW : x + ((size_t)b * g.c + ci) * HW;
        accb += gv;
#pragma unroll
        for (r = 0; r < KS; ++r) {
            int iy = y0 + r;
            if (iy < 0 || iy >= g.h) continue;
#pragma unroll
            for (s2 = 0; s2 < KS; ++s2) {
                int ix = x0 + s2;
                if (ix >= 0 && ix < g.w)
                    acc[r * KS + s2] = fmaf(gv, STAGE ? xc[iy * g.w + ix] : __ldg(xc + iy * g.w + ix), acc[r * KS + s2]);
            }
        }
    }
#pragma unroll
    for (j = 0; j < KS * KS; ++j) red[j][t] = acc[j];
    red[KS * KS][t] = accb;
    __syncthreads();
    for (stride = MNISTCU__THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride)
            for (j = 0; j <= KS * KS; ++j) red[j][t] += red[j][t + stride];
        __syncthreads();
    }
    if (t < KS * KS) part[((size_t)z * OC * g.c + pair) * KS * KS + t] = red[t][0];
    if (t == KS * KS && ci == 0) partb[(size_t)z * OC + co] = red[KS * KS][0];
}

/* The weight gradient where a sample's input and output gradient fit in shared
   memory together (MNISTCU__CONV_STAGE_BYTES) and (out, in) channel pairs are
   few: block z takes batch slice z and every pair at once, so each sample is
   read from global memory once, not once per pair. Thread t works for unit
   u = t % U, U = OC/G x C units of G output channels and one input channel,
   on positions p = t/U, t/U + PS, ... (PS = 256/U threads a unit): for each
   position it reads G output gradients and the KS x KS window of its input
   channel and makes G x KS x KS fmas (11 reads for 18 at 3x3, G = 2). After
   the slice the PS sums of a unit are added in order; part and partb as the
   kernel above fills them. Taken from MNISTCU__CONV_SLICE_PAIRS pairs up:
   measured on an H100 (ncu) at a P6 step's 16 -> 32 channel 3x3 convolution,
   batch 128 (512 pairs), 118 us against 57 + 10 for the sum; LeNet-5's
   convolutions at batch 64 (6 and 96 pairs) lose, 15 + 5 against 17 + 9 and
   17 + 4 against 29 + 6: their blocks per pair are already few and short. */
#define MNISTCU__CONV_SLICE_PAIRS 256
template <int KS, int G>
__global__ void __launch_bounds__(256) mnistcu__k_conv_dw_slice(const float *__restrict__ x, const float *__restrict__ dy,
                                                                 float *__restrict__ part, float *__restrict__ partb,
                                                                 mnistcu__geom g, int OC, int B, int bper)
{
    MNISTCU__PDL_WAIT();
    extern __shared__ float sl[]; /* [C][H*W] the sample's input, [OC][P] its output gradient; at the end the sums */
    const int P = g.oh * g.ow, HW = g.h * g.w, KK = KS * KS, t = (int)threadIdx.x, U = OC / G * g.c;
    const int PS = MNISTCU__THREADS / U, u = t % U, ps = t / U, ci = u % g.c, co0 = u / g.c * G;
    const int b0 = (int)blockIdx.x * bper, b1 = b0 + bper < B ? b0 + bper : B, NV = G * KK + G;
    float acc[G][KS * KS], accb[G];
    float *xs = sl, *gs = sl + (size_t)g.c * HW;
    int b, p, i, j, r, s2;
#pragma unroll
    for (j = 0; j < G; ++j) {
        accb[j] = 0.0f;
#pragma unroll
        for (i = 0; i < KK; ++i) acc[j][i] = 0.0f;
    }
    for (b = b0; b < b1; ++b) {
        __syncthreads(); /* the last sample's reads are done */
        for (i = t; i < g.c * HW; i += MNISTCU__THREADS) xs[i] = __ldg(x + (size_t)b * g.c * HW + i);
        for (i = t; i < OC * P; i += MNISTCU__THREADS) gs[i] = __ldg(dy + (size_t)b * OC * P + i);
        __syncthreads();
        if (ps >= PS) continue;
        for (p = ps; p < P; p += PS) {
            const int y0 = (p / g.ow) * g.sh - g.pad, x0 = (p % g.ow) * g.sw - g.pad;
            const float *xc = xs + (size_t)ci * HW;
            float gv[G];
#pragma unroll
            for (j = 0; j < G; ++j) {
                gv[j] = gs[(co0 + j) * P + p];
                accb[j] += gv[j];
            }
#pragma unroll
            for (r = 0; r < KS; ++r) {
                int iy = y0 + r;
                if (iy < 0 || iy >= g.h) continue;
#pragma unroll
                for (s2 = 0; s2 < KS; ++s2) {
                    int ix = x0 + s2;
                    if (ix >= 0 && ix < g.w) {
                        float xv = xc[iy * g.w + ix];
#pragma unroll
                        for (j = 0; j < G; ++j) acc[j][r * KS + s2] = fmaf(gv[j], xv, acc[j][r * KS + s2]);
                    }
                }
            }
        }
    }
    __syncthreads(); /* the staging is free: each thread's sums go there, [ps][u][NV] */
    if (ps < PS) {
#pragma unroll
        for (j = 0; j < G; ++j) {
#pragma unroll
            for (i = 0; i < KK; ++i) sl[((size_t)ps * U + u) * NV + j * KK + i] = acc[j][i];
            sl[((size_t)ps * U + u) * NV + G * KK + j] = accb[j];
        }
    }
    __syncthreads();
    for (i = t; i < U * NV; i += MNISTCU__THREADS) {
        int uu = i / NV, k = i % NV, c = uu % g.c, o0 = uu / g.c * G, q;
        float v = 0.0f;
        for (q = 0; q < PS; ++q) v += sl[((size_t)q * U + uu) * NV + k];
        if (k < G * KK)
            part[((size_t)blockIdx.x * OC * g.c + (size_t)(o0 + k / KK) * g.c + c) * KK + k % KK] = v;
        else if (c == 0)
            partb[(size_t)blockIdx.x * OC + o0 + (k - G * KK)] = v;
    }
}

/* dW[i] = the sum over slices of part[z][i]: warp w adds slices w, w + 8, ... in order, then the
   eight warps' sums are added in order (with at most 8 slices: the order z = 0, 1, ...); db likewise
   from partb (when given). A block takes 32 neighbouring outputs, each warp reading them at once.
   (One thread adding all slices of an output took 15 us for the 128 slices of P6's first
   convolution, ncu.) */
#define MNISTCU__DW_SUM_OUTPUTS 32
__global__ void __launch_bounds__(256) mnistcu__k_conv_direct_dw_sum(const float *part, const float *partb, int Z, size_t nw,
                                                                      int OC, float *dw, float *db)
{
    MNISTCU__PDL_WAIT();
    __shared__ float ps[8][MNISTCU__DW_SUM_OUTPUTS];
    const int lane = (int)threadIdx.x & 31, w = (int)threadIdx.x >> 5;
    const size_t n = nw + (db ? (size_t)OC : 0), i = (size_t)blockIdx.x * MNISTCU__DW_SUM_OUTPUTS + (size_t)lane;
    float acc = 0.0f;
    int z;
    if (i < n)
        for (z = w; z < Z; z += 8) acc += i < nw ? part[(size_t)z * nw + i] : partb[(size_t)z * OC + (i - nw)];
    ps[w][lane] = acc;
    __syncthreads();
    if (w == 0 && i < n) {
        float sum = ps[0][lane];
        for (z = 1; z < 8; ++z) sum += ps[z][lane];
        if (i < nw) dw[i] = sum;
        else db[i - nw] = sum;
    }
}

/* The largest divisor of n not above cap (at least 1). */
static int mnistcu__divisor_below(int n, int cap)
{
    int d = cap < n ? cap : n;
    while (d > 1 && n % d) --d;
    return d < 1 ? 1 : d;
}

static mnistcu_result mnistcu__conv_direct_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    mnistcu__geom g = mnistcu__geom_of(L);
    int K = g.c * g.kh * g.kw, P = g.oh * g.ow, cg = mnistcu__divisor_below(L->oc, 8192 / K); /* <= 32 KB of weights */
    int R = (size_t)((cg + 3) / 4) * P * (L->oc / cg) * B >= MNISTCU__CONV_R4_THREADS ? 4 : 1;
    dim3 grid((unsigned)(((cg + R - 1) / R * P + 255) / 256), (unsigned)(L->oc / cg), (unsigned)B);
    size_t sm = (size_t)cg * K * sizeof(float), xin = (size_t)g.c * g.h * g.w * sizeof(float);
    const float *bias = L->nb ? m->params + L->bo : NULL, *w = m->params + L->wo;
    cudaStream_t st = mnistcu__cuda_stream(m->ctx);
    int stage = sm + xin <= MNISTCU__CONV_STAGE_BYTES;
    if (g.sh == 1 && g.sw == 1) {
        mnistcu__tgeom t;
        t.ic = g.c; t.ih = g.h; t.iw = g.w;
        t.oc = L->oc; t.oh = g.oh; t.ow = g.ow;
        t.pad = g.pad; t.wcc = g.c; t.wci = 1;
        const int tr = mnistcu__conv_tile_plan(m->ctx, &t, g.kh, B);
        if (tr) {
            mnistcu__conv_tile_launch(st, g.kh, tr, 0, &t, B, L->in, w, bias, L->out, (int)L->act);
            MNISTCU__LAUNCHED(m->ctx, "conv_tile_forward");
            return MNISTCU_OK;
        }
    }
    if (stage) sm += xin;
#define MNISTCU__FWD(KS_, STAGE_)                                                                                  \
    do {                                                                                                           \
        if (R == 4)                                                                                                \
            mnistcu__launch(mnistcu__k_conv_direct_fwd<KS_, 4, STAGE_>, grid, 256, sm, st, L->in, w, bias, L->out, g, L->oc, cg, \
                                                                               (int)L->act);                       \
        else                                                                                                       \
            mnistcu__launch(mnistcu__k_conv_direct_fwd<KS_, 1, STAGE_>, grid, 256, sm, st, L->in, w, bias, L->out, g, L->oc, cg, \
                                                                               (int)L->act);                       \
    } while (0)
    if (g.kh == 5 && stage) MNISTCU__FWD(5, 1);
    else if (g.kh == 5) MNISTCU__FWD(5, 0);
    else if (stage) MNISTCU__FWD(3, 1);
    else MNISTCU__FWD(3, 0);
#undef MNISTCU__FWD
    MNISTCU__LAUNCHED(m->ctx, "conv_direct_forward");
    return MNISTCU_OK;
}

/* In a head step, a first convolution (no input gradient) whose weight gradient reads its output
   gradients from global memory (the tiles' GDY) takes the output gradient of the 2x2 max pool of
   stride 2 right after it as that pool leaves it, routing each window's gradient to its argmax as
   it reads (GDY 2): the pool's backward pass launches nothing and its input gradient, a map of mostly
   zeros, is never written (the Fashion CNN's first pool: 9.8 us a step, ncu). ReLUs folded into
   either layer only (their derivative at the argmax is the pool's output above zero). The values are
   the ones the pool's pass would have written, so the sums keep their bits;
   cuda_head_step_matches_step_by_step compares them with the step by step path's. */
static int mnistcu__conv_pool_route(mnistcu_model *m, const mnistcu__layer *C, const mnistcu__layer *P, size_t B)
{
    mnistcu__dwgeom d;
    size_t sm;
    int Z;
#ifdef MNISTCU_CUDNN
    if (mnistcu__use_cudnn(m->ctx)) return 0;
#endif
    if (C->d.kind != MNISTCU_LAYER_CONV2D || C->need_dx || !mnistcu__conv_direct(C) || P->d.kind != MNISTCU_LAYER_MAXPOOL2D ||
        !mnistcu__pool2(P) || P->in != C->out || (C->act != MNISTCU_ACT_IDENTITY && C->act != MNISTCU_ACT_RELU) ||
        (P->act != MNISTCU_ACT_IDENTITY && P->act != MNISTCU_ACT_RELU) || B > (size_t)INT_MAX)
        return 0;
    d.g = mnistcu__geom_of(C);
    d.oc = C->oc;
    d.B = (int)B;
    return mnistcu__conv_dw_tile_plan(m->ctx, &d, &sm, &Z) && d.gdy;
}

static mnistcu_result mnistcu__conv_direct_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    mnistcu_ctx *ctx = m->ctx;
    cudaStream_t st = mnistcu__cuda_stream(ctx);
    mnistcu__geom g = mnistcu__geom_of(L);
    int KK = g.kh * g.kw, pairs = L->oc * g.c, Z, bper;
    size_t nw = L->nw, n = B * L->out_size;
    float *part;
    mnistcu_result r;
    mnistcu__dyroute rt;
    const mnistcu__layer *RP = NULL; /* the max pool whose output gradient dy is (mnistcu__conv_pool_route) */
    memset(&rt, 0, sizeof rt);
    if (L->dy_pool) {
        int i;
        for (i = (int)(L - m->layers) + 1; i < m->num_layers && m->layers[i].passthrough; ++i) {}
        RP = i < m->num_layers ? &m->layers[i] : NULL;
        L->dy_pool = 0;
        if (!RP || !mnistcu__conv_pool_route(m, L, RP, B))
            return mnistcu__fail(ctx, MNISTCU_ERR_UNSUPPORTED, "convolution: a routed output gradient without its max pool");
        rt.arg = (const int32_t *)RP->aux;
        rt.y = L->act == MNISTCU_ACT_RELU || RP->act == MNISTCU_ACT_RELU ? RP->out : NULL;
        rt.oh = RP->oh;
        rt.ow = RP->ow;
        m->conv_pool_steps++;
    }
    if (!RP && L->act != MNISTCU_ACT_IDENTITY && !L->dy_done) { /* dy_done: the pooling after applied it */
        mnistcu__launch(mnistcu__k_act_backward, mnistcu__blocks(n), MNISTCU__THREADS, 0, st, dy, L->out, n, (int)L->act);
        MNISTCU__LAUNCHED(ctx, "act_backward");
    }
    {
        mnistcu__dwgeom d;
        size_t sm;
        int G;
        d.g = g;
        d.oc = L->oc;
        d.B = (int)B;
        if ((G = mnistcu__conv_dw_tile_plan(ctx, &d, &sm, &Z))) {
            const int H = g.c % 2 ? 1 : 2, U = L->oc / G * (g.c / H);
            dim3 grid((unsigned)((U + d.ub - 1) / d.ub), (unsigned)Z);
            if ((r = mnistcu__cuda_partials(ctx, (size_t)Z * (nw + (size_t)L->oc), &part))) return r;
#define MNISTCU__DWT(KS_, G_, H_, GDY_)                                                                                \
    do {                                                                                                             \
        if (sm > MNISTCU__CONV_STAGE_BYTES)                                                                          \
            (void)cudaFuncSetAttribute(mnistcu__k_conv_dw_tile<KS_, G_, H_, GDY_>,                                   \
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);                        \
        mnistcu__launch(mnistcu__k_conv_dw_tile<KS_, G_, H_, GDY_>, grid, (unsigned)(32 * d.ub * d.ps), sm, st, L->in, dy, \
                        part, part + (size_t)Z * nw, d, rt);                                                         \
    } while (0)
            /* routed: one group of input channels (gdy), so H = 1 (mnistcu__conv_pool_route) */
            if (KK == 9) {
                if (RP) MNISTCU__DWT(3, 4, 1, 2);
                else if (d.gdy) { if (H == 2) MNISTCU__DWT(3, 4, 2, 1); else MNISTCU__DWT(3, 4, 1, 1); }
                else { if (H == 2) MNISTCU__DWT(3, 4, 2, 0); else MNISTCU__DWT(3, 4, 1, 0); }
            } else {
                if (RP) MNISTCU__DWT(5, 2, 1, 2);
                else if (d.gdy) { if (H == 2) MNISTCU__DWT(5, 2, 2, 1); else MNISTCU__DWT(5, 2, 1, 1); }
                else { if (H == 2) MNISTCU__DWT(5, 2, 2, 0); else MNISTCU__DWT(5, 2, 1, 0); }
            }
#undef MNISTCU__DWT
            MNISTCU__LAUNCHED(ctx, "conv_dw_tile");
            goto sum;
        }
    }
    /* the slice kernel where a sample fits (both sides) and the units fit a block: G = 2 output channels a
       unit at 3x3 (an even count of them), 1 at 5x5 */
    {
        size_t stage = ((size_t)g.c * g.h * g.w + (size_t)L->oc * g.oh * g.ow) * sizeof(float);
        int G = KK == 9 ? 2 : 1, U = L->oc / G * g.c;
        size_t red = (size_t)MNISTCU__THREADS * (size_t)(G * KK + G) * sizeof(float);
        if (pairs >= MNISTCU__CONV_SLICE_PAIRS && L->oc % G == 0 && U <= MNISTCU__THREADS &&
            stage <= MNISTCU__CONV_STAGE_BYTES && red <= MNISTCU__CONV_STAGE_BYTES) {
            size_t sm = stage > red ? stage : red;
            /* one slice a multiprocessor or so: about 132 blocks on an H100 */
            bper = ((int)B + 131) / 132;
            Z = ((int)B + bper - 1) / bper;
            if ((r = mnistcu__cuda_partials(ctx, (size_t)Z * (nw + (size_t)L->oc), &part))) return r;
#define MNISTCU__DWS(KS_, G_)                                                                                 \
    mnistcu__launch(mnistcu__k_conv_dw_slice<KS_, G_>, (unsigned)Z, MNISTCU__THREADS, sm, st, L->in, dy, part, part + (size_t)Z * nw, \
                                                                              g, L->oc, (int)B, bper)
            if (KK == 25) MNISTCU__DWS(5, 1);
            else MNISTCU__DWS(3, 2);
#undef MNISTCU__DWS
            MNISTCU__LAUNCHED(ctx, "conv_dw_slice");
            goto sum;
        }
    }
    /* about 264 blocks (two per H100 multiprocessor) over pairs x batch slices; fewer samples a slice
       (more blocks) where that lets a slice's inputs and output gradients sit in shared memory (the
       Fashion CNN's conv1: 5 slices of 13 samples read from global memory, 33.6 us; 11 of 6, staged,
       31.2 us; bench/RESULTS.md) */
    Z = (264 + pairs - 1) / pairs;
    if (Z > (int)B) Z = (int)B;
    bper = ((int)B + Z - 1) / Z;
    {
        const size_t red = (size_t)(KK + 1) * MNISTCU__THREADS * sizeof(float);
        const size_t one = (size_t)(g.h * g.w + g.oh * g.ow) * sizeof(float);
        if (red + (size_t)bper * one > MNISTCU__CONV_STAGE_BYTES && red + one <= MNISTCU__CONV_STAGE_BYTES)
            bper = (int)((MNISTCU__CONV_STAGE_BYTES - red) / one);
    }
    Z = ((int)B + bper - 1) / bper;
    if ((r = mnistcu__cuda_partials(ctx, (size_t)Z * (nw + (size_t)L->oc), &part))) return r;
    {
        size_t red = (size_t)(KK + 1) * MNISTCU__THREADS * sizeof(float);
        size_t sm = (size_t)bper * (g.h * g.w + g.oh * g.ow) * sizeof(float);
        int stage = red + sm <= MNISTCU__CONV_STAGE_BYTES;
        dim3 grid((unsigned)pairs, (unsigned)Z);
        if (!stage) sm = 0;
#define MNISTCU__DW(KS_, STAGE_) \
    mnistcu__launch(mnistcu__k_conv_direct_dw<KS_, STAGE_>, grid, 256, sm, st, L->in, dy, part, part + (size_t)Z * nw, g, L->oc, (int)B, bper)
        if (g.kh == 5 && stage) MNISTCU__DW(5, 1);
        else if (g.kh == 5) MNISTCU__DW(5, 0);
        else if (stage) MNISTCU__DW(3, 1);
        else MNISTCU__DW(3, 0);
#undef MNISTCU__DW
    }
    MNISTCU__LAUNCHED(ctx, "conv_direct_dw");
sum:
    mnistcu__launch(mnistcu__k_conv_direct_dw_sum,
                    (unsigned)((nw + (size_t)L->oc + MNISTCU__DW_SUM_OUTPUTS - 1) / MNISTCU__DW_SUM_OUTPUTS), 256, 0, st,
        part, part + (size_t)Z * nw, Z, nw, L->oc, m->grads + L->wo, L->nb ? m->grads + L->bo : NULL);
    MNISTCU__LAUNCHED(ctx, "conv_direct_dw_sum");
    if (dx && g.sh == 1 && g.sw == 1) {
        mnistcu__tgeom t;
        int R;
        t.ic = L->oc; t.ih = g.oh; t.iw = g.ow;
        t.oc = g.c; t.oh = g.h; t.ow = g.w;
        t.pad = g.kh - 1 - g.pad; t.wcc = 1; t.wci = g.c;
        if ((R = mnistcu__conv_tile_plan(ctx, &t, g.kh, B))) {
            mnistcu__conv_tile_launch(st, g.kh, R, 1, &t, B, dy, m->params + L->wo, NULL, dx, (int)MNISTCU_ACT_IDENTITY);
            MNISTCU__LAUNCHED(ctx, "conv_tile_dx");
            return MNISTCU_OK;
        }
    }
    if (dx) {
        int cig = mnistcu__divisor_below(g.c, 8192 / (L->oc * KK));
        int R = (size_t)((cig + 3) / 4) * g.h * g.w * (g.c / cig) * B >= MNISTCU__CONV_R4_THREADS ? 4 : 1;
        dim3 grid((unsigned)(((cig + R - 1) / R * g.h * g.w + 255) / 256), (unsigned)(g.c / cig), (unsigned)B);
        size_t sm = (size_t)L->oc * cig * KK * sizeof(float), gin = (size_t)L->oc * g.oh * g.ow * sizeof(float);
        const float *w = m->params + L->wo;
        int unit = g.sh == 1 && g.sw == 1, stage = sm + gin <= MNISTCU__CONV_STAGE_BYTES;
        if (stage) sm += gin;
#define MNISTCU__DX(KS_, UNIT_, STAGE_)                                                                      \
    do {                                                                                                     \
        if (R == 4) mnistcu__launch(mnistcu__k_conv_direct_dx<KS_, 4, UNIT_, STAGE_>, grid, 256, sm, st, dy, w, dx, g, L->oc, cig); \
        else mnistcu__launch(mnistcu__k_conv_direct_dx<KS_, 1, UNIT_, STAGE_>, grid, 256, sm, st, dy, w, dx, g, L->oc, cig);        \
    } while (0)
        if (stage) {
            if (g.kh == 5 && unit) MNISTCU__DX(5, 1, 1);
            else if (g.kh == 5) MNISTCU__DX(5, 0, 1);
            else if (unit) MNISTCU__DX(3, 1, 1);
            else MNISTCU__DX(3, 0, 1);
        } else {
            if (g.kh == 5 && unit) MNISTCU__DX(5, 1, 0);
            else if (g.kh == 5) MNISTCU__DX(5, 0, 0);
            else if (unit) MNISTCU__DX(3, 1, 0);
            else MNISTCU__DX(3, 0, 0);
        }
#undef MNISTCU__DX
        MNISTCU__LAUNCHED(ctx, "conv_direct_dx");
    }
    return MNISTCU_OK;
}

#ifdef MNISTCU_CUDNN
/* The same convolution through cuDNN (forward: implicit GEMM; backward: the
   deterministic algorithms 1), with our bias, activation and bias gradient.
   dy NULL: forward; else backward. */
static mnistcu_result mnistcu__conv_dnn(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    mnistcu_ctx *ctx = m->ctx;
    cudnnHandle_t h = mnistcu__cu(ctx)->dnn;
    cudaStream_t st = mnistcu__cuda_stream(ctx);
    mnistcu__dnn_layer *d;
    const float one = 1.0f, zero = 0.0f, *W = m->params + L->wo;
    size_t P = (size_t)L->oh * L->ow, n = B * L->out_size;
    void *ws = NULL;
    cudnnStatus_t s;
    mnistcu_result r = mnistcu__dnn_layer_get(m, L, B, &d);
    if (r) return r;
    if (!dy) {
        if ((r = mnistcu__dnn_workspace(ctx, d->ws_fwd, &ws))) return r;
        s = cudnnConvolutionForward(h, &one, d->x, L->in, d->w, W, d->conv, MNISTCU__DNN_FWD, ws, d->ws_fwd, &zero, d->y,
                                    L->out);
        if ((r = mnistcu__dnn_check(ctx, s, "convolution forward"))) return r;
        if (L->nb || L->act != MNISTCU_ACT_IDENTITY) {
            mnistcu__launch(mnistcu__k_chan_bias_act, mnistcu__blocks(n), MNISTCU__THREADS, 0, st,
                L->out, L->nb ? m->params + L->bo : NULL, n, L->oc, (int)P, (int)L->act);
            MNISTCU__LAUNCHED(ctx, "chan_bias_act");
        }
        return MNISTCU_OK;
    }
    if (L->act != MNISTCU_ACT_IDENTITY && !L->dy_done) {
        mnistcu__launch(mnistcu__k_act_backward, mnistcu__blocks(n), MNISTCU__THREADS, 0, st, dy, L->out, n, (int)L->act);
        MNISTCU__LAUNCHED(ctx, "act_backward");
    }
    if ((r = mnistcu__dnn_workspace(ctx, MNISTCU__MAX(d->ws_filter, dx ? d->ws_data : 0), &ws))) return r;
    s = cudnnConvolutionBackwardFilter(h, &one, d->x, L->in, d->y, dy, d->conv, MNISTCU__DNN_FILTER, ws, d->ws_filter,
                                       &zero, d->w, m->grads + L->wo);
    if ((r = mnistcu__dnn_check(ctx, s, "convolution weight gradient"))) return r;
    if (L->nb) {
        mnistcu__launch(mnistcu__k_chan_sum, (unsigned)L->oc, MNISTCU__THREADS, 0, st, dy, (int)B, L->oc, (int)P, m->grads + L->bo);
        MNISTCU__LAUNCHED(ctx, "chan_sum");
    }
    if (!dx) return MNISTCU_OK;
    s = cudnnConvolutionBackwardData(h, &one, d->w, W, d->y, dy, d->conv, MNISTCU__DNN_DATA, ws, d->ws_data, &zero, d->x,
                                     dx);
    return mnistcu__dnn_check(ctx, s, "convolution input gradient");
}
#endif

/* The columns of a batch: a thread a (position, kernel row) where the grid holds them, else one an entry. */
static void mnistcu__im2col(cudaStream_t st, const mnistcu__layer *L, mnistcu__geom g, size_t B, float *col)
{
    const size_t P = (size_t)g.oh * g.ow, K = (size_t)g.c * g.kh * g.kw;
    if (mnistcu__grid_yz_ok((size_t)g.c * g.kh, B))
        mnistcu__launch(g.kw == 3 ? mnistcu__k_im2col_rows<3> : g.kw == 5 ? mnistcu__k_im2col_rows<5> : mnistcu__k_im2col_rows<0>,
                        mnistcu__grid_plane(P, (size_t)g.c * g.kh, B), MNISTCU__PLANE_THREADS, 0, st, (const float *)L->in,
                        g, (int)B, L->in_size, col);
    else
        mnistcu__launch(mnistcu__k_im2col, mnistcu__blocks(K * B * P), MNISTCU__THREADS, 0, st, (const float *)L->in, g,
                        (int)B, L->in_size, col);
}

static mnistcu_result mnistcu__conv_cuda_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
#ifdef MNISTCU_CUDNN
    if (mnistcu__use_cudnn(m->ctx)) return mnistcu__conv_dnn(m, L, B, NULL, NULL);
#endif
    if (mnistcu__conv_direct(L)) return mnistcu__conv_direct_forward(m, L, B);
    mnistcu_ctx *ctx = m->ctx;
    cudaStream_t st = mnistcu__cuda_stream(ctx);
    mnistcu__geom g = mnistcu__geom_of(L);
    size_t K = (size_t)g.c * g.kh * g.kw, P = (size_t)g.oh * g.ow, BP = B * P, OC = (size_t)L->oc;
    float *col = m->scratch, *prod = m->scratch + K * BP;
    mnistcu_result r;
    mnistcu__im2col(st, L, g, B, col);
    MNISTCU__LAUNCHED(ctx, "im2col");
    m->scratch_layer = L->index + 1; /* the backward pass may find its columns still there */
    m->scratch_batch = B;
    if ((r = mnistcu__cuda_gemm(ctx, 0, 0, OC, BP, K, m->params + L->wo, K, col, BP, prod, BP, NULL, 0))) return r;
    if (mnistcu__grid_1d_ok(OC * BP))
        mnistcu__launch(mnistcu__k_conv_out4, mnistcu__blocks4(OC * BP), MNISTCU__THREADS, 0, st, prod,
                        L->nb ? m->params + L->bo : NULL, (int)L->act, (int)B, (int)OC, (int)P, L->out);
    else
        mnistcu__launch(mnistcu__k_conv_out, mnistcu__blocks(OC * BP), MNISTCU__THREADS, 0, st, prod,
                        L->nb ? m->params + L->bo : NULL, (int)L->act, (int)B, (int)OC, (int)P, L->out);
    MNISTCU__LAUNCHED(ctx, "conv_out");
    return MNISTCU_OK;
}

/* The columns path's weight gradient dW [OC][K] = dprod [OC][BP] . col^T [BP][K] and bias gradient,
   on the stream the context launches on now (the branch's, >>cuda_side). */
static mnistcu_result mnistcu__conv_cuda_dw(mnistcu_model *m, mnistcu__layer *L, size_t OC, size_t K, size_t BP,
                                            const float *dprod, const float *col)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu_result r;
    if ((r = mnistcu__cuda_gemm(ctx, 0, 1, OC, K, BP, dprod, BP, col, BP, m->grads + L->wo, K, NULL, 0))) return r;
    if (L->nb) {
        mnistcu__launch(mnistcu__k_row_sum, (unsigned)OC, MNISTCU__THREADS, 0, mnistcu__cuda_stream(ctx), dprod, BP,
                        m->grads + L->bo);
        MNISTCU__LAUNCHED(ctx, "row_sum");
    }
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__conv_cuda_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
#ifdef MNISTCU_CUDNN
    if (mnistcu__use_cudnn(m->ctx)) return mnistcu__conv_dnn(m, L, B, dy, dx);
#endif
    if (mnistcu__conv_direct(L)) return mnistcu__conv_direct_backward(m, L, B, dy, dx);
    mnistcu_ctx *ctx = m->ctx;
    cudaStream_t st = mnistcu__cuda_stream(ctx);
    mnistcu__geom g = mnistcu__geom_of(L);
    size_t K = (size_t)g.c * g.kh * g.kw, P = (size_t)g.oh * g.ow, BP = B * P, OC = (size_t)L->oc;
    float *col = m->scratch, *dprod = m->scratch + K * BP, *dcol;
    mnistcu_result r;
    int side;
    if (mnistcu__grid_1d_ok(OC * BP))
        mnistcu__launch(mnistcu__k_conv_dout4, mnistcu__blocks4(OC * BP), MNISTCU__THREADS, 0, st, dy, L->out,
                        L->dy_done ? (int)MNISTCU_ACT_IDENTITY : (int)L->act, (int)B, (int)OC, (int)P, dprod);
    else
        mnistcu__launch(mnistcu__k_conv_dout, mnistcu__blocks(OC * BP), MNISTCU__THREADS, 0, st, dy, L->out,
                        L->dy_done ? (int)MNISTCU_ACT_IDENTITY : (int)L->act, (int)B, (int)OC, (int)P, dprod);
    MNISTCU__LAUNCHED(ctx, "conv_dout");
    if (m->scratch_layer != L->index + 1 || m->scratch_batch != B) { /* another conv used the scratch since */
        mnistcu__im2col(st, L, g, B, col);
        MNISTCU__LAUNCHED(ctx, "im2col");
    }
    m->scratch_layer = 0;
    /* with an input gradient, the weight and bias gradients are a branch (>>cuda_side) beside it, which
       reads col while the input gradient's product writes dcol after dprod in the scratch */
    side = dx && mnistcu__cuda_side_ready(ctx);
    if (side && (r = mnistcu__cuda_fork(ctx))) return r;
    r = mnistcu__conv_cuda_dw(m, L, OC, K, BP, dprod, col);
    if (side && (r = mnistcu__cuda_unfork(ctx, r))) return r;
    if (r || !dx) return r;
    /* dcol [K][BP] = W^T [K][OC] . dprod [OC][BP], into col's place (or, beside the branch, after dprod) */
    dcol = side ? dprod + OC * BP : col;
    if ((r = mnistcu__cuda_gemm(ctx, 1, 0, K, BP, OC, m->params + L->wo, K, dprod, BP, dcol, BP, NULL, 0))) return r;
    if (g.sh == 1 && g.sw == 1 && mnistcu__grid_yz_ok((size_t)g.c, B))
        mnistcu__launch(g.kh == 3 && g.kw == 3   ? mnistcu__k_col2im_s1<3>
                        : g.kh == 5 && g.kw == 5 ? mnistcu__k_col2im_s1<5>
                                                 : mnistcu__k_col2im_s1<0>,
                        mnistcu__grid_plane((size_t)g.h * g.w, (size_t)g.c, B), MNISTCU__PLANE_THREADS, 0, st,
                        (const float *)dcol, g, (int)B, dx);
    else
        mnistcu__launch(mnistcu__k_col2im, mnistcu__blocks(B * L->in_size), MNISTCU__THREADS, 0, st, dcol, g, (int)B, dx);
    MNISTCU__LAUNCHED(ctx, "col2im");
    return side ? mnistcu__cuda_join(ctx) : MNISTCU_OK;
}
#endif

static const mnistcu__kind mnistcu__kind_CONV2D = {
    mnistcu__conv_shape, NULL, mnistcu__conv_scratch,
    {mnistcu__conv_cpu_forward, MNISTCU__CUDA_FN(mnistcu__conv_cuda_forward)},
    {mnistcu__conv_cpu_backward, MNISTCU__CUDA_FN(mnistcu__conv_cuda_backward)}};

/* >>layer_pool --------------------------------------------------------------------
   torch.nn.MaxPool2d and AvgPool2d: windows of KH x KW with strides (default
   the kernel size), no padding, OH = (H - KH) / s + 1. Max keeps, per output,
   the index in its plane of the first largest input (NaN counts as largest, as
   in PyTorch); the backward pass routes each output's gradient there. Average
   divides the window's sum by KH*KW. Both backward passes gather: each input
   sums over the windows that cover it, in order. A ReLU right after a max pool
   is folded into it (relu(max) = max(relu), exactly), as the Fashion CNN has. */
static mnistcu_result mnistcu__pool_shape(mnistcu_ctx *ctx, mnistcu__layer *L)
{
    mnistcu_layer_desc *d = &L->d;
    if (d->kernel_h == 0) d->kernel_h = 2;
    if (d->kernel_w == 0) d->kernel_w = d->kernel_h;
    if (d->kernel_h < 1 || d->kernel_w < 1 || d->kernel_h > MNISTCU__MAX_KERNEL || d->kernel_w > MNISTCU__MAX_KERNEL ||
        d->stride < 0 || d->stride > MNISTCU__MAX_KERNEL)
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_INVALID_ARGUMENT, "kernel %dx%d or stride %d out of range",
                                   d->kernel_h, d->kernel_w, d->stride);
    L->sh = d->stride ? d->stride : d->kernel_h;
    L->sw = d->stride ? d->stride : d->kernel_w;
    if (d->stride == 0 && d->kernel_h == d->kernel_w) d->stride = d->kernel_h;
    if (L->h < d->kernel_h || L->w < d->kernel_w)
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_SHAPE, "a %dx%d window does not fit a %dx%d map", d->kernel_h,
                                   d->kernel_w, L->h, L->w);
    L->oc = L->c;
    L->oh = (L->h - d->kernel_h) / L->sh + 1;
    L->ow = (L->w - d->kernel_w) / L->sw + 1;
    return MNISTCU_OK;
}

static size_t mnistcu__maxpool_aux(const mnistcu__layer *L, size_t B)
{
    size_t n;
    return mnistcu__mul(B, L->out_size, &n) ? n : SIZE_MAX; /* int32 argmax per output */
}

/* Output (oy, ox) of plane x [H][W]; *arg gets the max's index in the plane. */
static MNISTCU__HD float mnistcu__pool_at(const float *x, mnistcu__geom g, int oy, int ox, int is_max, int32_t *arg)
{
    int i, j, y0 = oy * g.sh, x0 = ox * g.sw;
    float best = -INFINITY, sum = 0.0f;
    int32_t bi = (int32_t)(y0 * g.w + x0);
    for (i = 0; i < g.kh; ++i)
        for (j = 0; j < g.kw; ++j) {
            int32_t at = (int32_t)((y0 + i) * g.w + x0 + j);
            float v = x[at];
            if (is_max) {
                if (v > best || v != v) {
                    best = v;
                    bi = at;
                }
            } else {
                sum += v;
            }
        }
    if (is_max) {
        *arg = bi;
        return best;
    }
    return sum / (float)(g.kh * g.kw);
}

/* dx of input (iy, ix) of one plane from dy [OH][OW] (and arg [OH][OW] for max;
   y [OH][OW] when a ReLU is folded into the max: only outputs above zero pass
   their gradient). Windows that do not overlap: the one window, directly. */
static MNISTCU__HD float mnistcu__pool_back_at(const float *dy, const int32_t *arg, const float *y, mnistcu__geom g,
                                               int iy, int ix)
{
    if (g.sh == g.kh && g.sw == g.kw) {
        int oy = iy / g.kh, ox = ix / g.kw, o = oy * g.ow + ox;
        if (oy >= g.oh || ox >= g.ow) return 0.0f;
        if (!arg) return dy[o] / (float)(g.kh * g.kw);
        return arg[o] == (int32_t)(iy * g.w + ix) && (!y || y[o] > 0.0f) ? dy[o] : 0.0f;
    }
    int oy0 = iy >= g.kh ? (iy - g.kh + g.sh) / g.sh : 0, ox0 = ix >= g.kw ? (ix - g.kw + g.sw) / g.sw : 0;
    int oy1 = MNISTCU__MIN(iy / g.sh, g.oh - 1), ox1 = MNISTCU__MIN(ix / g.sw, g.ow - 1), oy, ox;
    int32_t self = (int32_t)(iy * g.w + ix);
    float s = 0.0f, div = (float)(g.kh * g.kw);
    for (oy = oy0; oy <= oy1; ++oy)
        for (ox = ox0; ox <= ox1; ++ox) {
            int o = oy * g.ow + ox;
            if (arg) {
                if (arg[o] == self && (!y || y[o] > 0.0f)) s += dy[o];
            } else {
                s += dy[o] / div;
            }
        }
    return s;
}

/* The CPU passes, a plane per iteration across the context's threads (each
   plane's outputs are its own: any thread count gives the same bits). A 2x2
   max pool of stride 2, LeNet's and the Fashion CNN's, takes the same four
   comparisons in the same order unrolled; a backward pass whose windows do not
   overlap routes each output's gradient to its one input (the rest zero), as
   mnistcu__pool_back_at would find it. */
static float mnistcu__pool_max2(const float *x, int w, int y0, int x0, int32_t *arg)
{
    int32_t a = (int32_t)(y0 * w + x0), at[4];
    float v[4], best = -INFINITY;
    int k;
    at[0] = a;
    at[1] = a + 1;
    at[2] = a + w;
    at[3] = a + w + 1;
    for (k = 0; k < 4; ++k) v[k] = x[at[k]];
    *arg = a;
    for (k = 0; k < 4; ++k)
        if (v[k] > best || v[k] != v[k]) {
            best = v[k];
            *arg = at[k];
        }
    return best;
}

static void mnistcu__cpu_pool_forward(mnistcu_ctx *ctx, mnistcu__layer *L, size_t B, int is_max)
{
    mnistcu__geom g = mnistcu__geom_of(L);
    size_t S = (size_t)g.h * g.w, P = (size_t)g.oh * g.ow;
    long planes = (long)(B * (size_t)L->c), pl;
    int32_t *arg = (int32_t *)L->aux;
    int max2 = is_max && g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2;
    (void)ctx;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if ((size_t)planes * P >= 16384)
#endif
    for (pl = 0; pl < planes; ++pl) {
        const float *x = L->in + (size_t)pl * S;
        int32_t unused;
        int oy, ox;
        for (oy = 0; oy < g.oh; ++oy)
            for (ox = 0; ox < g.ow; ++ox) {
                size_t o = (size_t)pl * P + (size_t)oy * g.ow + ox;
                float v = max2 ? mnistcu__pool_max2(x, g.w, 2 * oy, 2 * ox, &arg[o])
                               : mnistcu__pool_at(x, g, oy, ox, is_max, is_max ? &arg[o] : &unused);
                L->out[o] = mnistcu__act_f(L->act, v);
            }
    }
}

static void mnistcu__cpu_pool_backward(mnistcu_ctx *ctx, mnistcu__layer *L, size_t B, const float *dy, float *dx,
                                       int is_max)
{
    mnistcu__geom g = mnistcu__geom_of(L);
    size_t S = (size_t)g.h * g.w, P = (size_t)g.oh * g.ow;
    long planes = (long)(B * (size_t)L->c), pl;
    int tiled = g.sh == g.kh && g.sw == g.kw;
    (void)ctx;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(ctx->threads) if ((size_t)planes * S >= 16384)
#endif
    for (pl = 0; pl < planes; ++pl) {
        const float *d = dy + (size_t)pl * P, *y = L->act == MNISTCU_ACT_RELU ? L->out + (size_t)pl * P : NULL;
        const int32_t *arg = is_max ? (const int32_t *)L->aux + (size_t)pl * P : NULL;
        float *out = dx + (size_t)pl * S;
        int iy, ix;
        if (tiled && is_max) { /* windows that do not overlap: each output to its one input */
            size_t o;
            memset(out, 0, S * sizeof(float));
            for (o = 0; o < P; ++o)
                if (!y || y[o] > 0.0f) out[arg[o]] = d[o];
            continue;
        }
        for (iy = 0; iy < g.h; ++iy)
            for (ix = 0; ix < g.w; ++ix) out[(size_t)iy * g.w + ix] = mnistcu__pool_back_at(d, arg, y, g, iy, ix);
    }
}

static mnistcu_result mnistcu__maxpool_cpu_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    mnistcu__cpu_pool_forward(m->ctx, L, B, 1);
    return MNISTCU_OK;
}
static mnistcu_result mnistcu__avgpool_cpu_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    mnistcu__cpu_pool_forward(m->ctx, L, B, 0);
    return MNISTCU_OK;
}
static mnistcu_result mnistcu__maxpool_cpu_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    if (dx) mnistcu__cpu_pool_backward(m->ctx, L, B, dy, dx, 1);
    return MNISTCU_OK;
}
static mnistcu_result mnistcu__avgpool_cpu_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    if (dx) mnistcu__cpu_pool_backward(m->ctx, L, B, dy, dx, 0);
    return MNISTCU_OK;
}

#ifdef __CUDACC__
__global__ void mnistcu__k_pool_forward(const float *x, mnistcu__geom g, size_t planes, int is_max, int act, float *y,
                                        int32_t *arg)
{
    MNISTCU__PDL_WAIT();
    size_t P = (size_t)g.oh * g.ow, S = (size_t)g.h * g.w, n = planes * P, e;
    int32_t unused;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t pl = mnistcu__div(e, P), o = e - pl * P, oy = mnistcu__div(o, (size_t)g.ow);
        y[e] = mnistcu__act_f((mnistcu_act)act, mnistcu__pool_at(x + pl * S, g, (int)oy,
                                                                 (int)(o - oy * g.ow), is_max,
                                                                 is_max ? &arg[e] : &unused));
    }
}

/* y_in (act_in not IDENTITY): the pooling's input, the output of a convolution
   with that activation, whose derivative dx then takes here (see
   mnistcu__cuda_pool_backward). */
__global__ void mnistcu__k_pool_backward(const float *dy, const int32_t *arg, const float *y, mnistcu__geom g,
                                         size_t planes, float *dx, int act_in, const float *y_in)
{
    MNISTCU__PDL_WAIT();
    size_t P = (size_t)g.oh * g.ow, S = (size_t)g.h * g.w, n = planes * S, e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t pl = mnistcu__div(e, S), i = e - pl * S, iy = mnistcu__div(i, (size_t)g.w);
        float v = mnistcu__pool_back_at(dy + pl * P, arg ? arg + pl * P : NULL, y ? y + pl * P : NULL, g, (int)iy,
                                        (int)(i - iy * g.w));
        if (act_in != MNISTCU_ACT_IDENTITY) v = mnistcu__act_backward_one((mnistcu_act)act_in, v, y_in[e]);
        dx[e] = v;
    }
}

/* The same two passes with the planes in the grid's y (mnistcu__grid_plane):
   one 32-bit division a thread. The backward one for windows that do not
   overlap (stride = window, as mnistcu__pool_back_at's first branch), K2 for
   2x2 windows (shifts). */
__global__ void mnistcu__k_pool_forward_y(const float *x, mnistcu__geom g, int is_max, int act, float *y, int32_t *arg)
{
    MNISTCU__PDL_WAIT();
    const int P = g.oh * g.ow, o = (int)(blockIdx.x * blockDim.x + threadIdx.x), oy = o / g.ow;
    const size_t pl = blockIdx.y, e = pl * P + o;
    int32_t unused;
    if (o >= P) return;
    y[e] = mnistcu__act_f((mnistcu_act)act, mnistcu__pool_at(x + pl * g.h * g.w, g, oy, o - oy * g.ow, is_max,
                                                             is_max ? &arg[e] : &unused));
}

template <int K2>
__global__ void mnistcu__k_pool_backward_y(const float *dy, const int32_t *arg, const float *y, mnistcu__geom g,
                                           float *dx, int act_in, const float *y_in)
{
    MNISTCU__PDL_WAIT();
    const int S = g.h * g.w, i = (int)(blockIdx.x * blockDim.x + threadIdx.x), iy = i / g.w, ix = i - iy * g.w;
    const int oy = K2 ? iy >> 1 : iy / g.kh, ox = K2 ? ix >> 1 : ix / g.kw;
    const size_t pl = blockIdx.y, e = pl * S + i, po = pl * g.oh * g.ow + (size_t)(oy * g.ow + ox);
    float v = 0.0f;
    if (i >= S) return;
    if (oy < g.oh && ox < g.ow) {
        if (!arg) v = dy[po] / (float)(g.kh * g.kw);
        else v = arg[po] == (int32_t)i && (!y || y[po] > 0.0f) ? dy[po] : 0.0f;
    }
    if (act_in != MNISTCU_ACT_IDENTITY) v = mnistcu__act_backward_one((mnistcu_act)act_in, v, y_in[e]);
    dx[e] = v;
}

/* 2x2 windows of stride 2 (LeNet's and the Fashion CNN's pools), mnistcu__grid_1d_ok(n): a
   thread a window forward, and a 2x2 cell of the input backward (the cells of
   an odd last row or column half outside: those inputs get zero, as no window
   covers them). Each thread issues its loads together, two rows of 8 bytes
   where the row pair is aligned, and finds its place with 32-bit divisions:
   the plane-per-grid-row passes above made a block of 128 threads for each
   plane of 121 to 676 positions, one dependent load a thread (the Fashion
   CNN's first pool backward: 20 us, ncu). The same comparisons in the same
   order as mnistcu__pool_at, the same selection as mnistcu__pool_back_at, the
   same derivative: the same bits. */
static __device__ __forceinline__ void mnistcu__ld_pair(const float *p, float *v)
{
    if (!((uintptr_t)p & 7)) {
        const float2 t = *(const float2 *)p;
        v[0] = t.x;
        v[1] = t.y;
    } else {
        v[0] = p[0];
        v[1] = p[1];
    }
}
static __device__ __forceinline__ void mnistcu__st_pair(float *p, float a, float b, int both)
{
    if (both && !((uintptr_t)p & 7)) {
        *(float2 *)p = make_float2(a, b);
    } else {
        p[0] = a;
        if (both) p[1] = b;
    }
}

__global__ void mnistcu__k_pool2_forward(const float *x, int h, int w, int oh, int ow, int n, int act, float *y,
                                         int32_t *arg)
{
    MNISTCU__PDL_WAIT();
    const int e = (int)(blockIdx.x * blockDim.x + threadIdx.x), P = oh * ow;
    if (e >= n) return;
    const int pl = e / P, o = e - pl * P, oy = o / ow, ox = o - oy * ow;
    const int32_t a = (int32_t)(2 * oy * w + 2 * ox), at[4] = {a, a + 1, a + w, a + w + 1};
    const float *r = x + (size_t)pl * h * w + a;
    float v[4], best = -INFINITY;
    int32_t bi = a;
    int k;
    mnistcu__ld_pair(r, v);
    mnistcu__ld_pair(r + w, v + 2);
    for (k = 0; k < 4; ++k)
        if (v[k] > best || v[k] != v[k]) {
            best = v[k];
            bi = at[k];
        }
    arg[e] = bi;
    y[e] = mnistcu__act_f((mnistcu_act)act, best);
}

__global__ void mnistcu__k_pool2_backward(const float *dy, const int32_t *arg, const float *y, int h, int w, int oh,
                                          int ow, int n, float *dx, int act_in, const float *y_in)
{
    MNISTCU__PDL_WAIT();
    const int e = (int)(blockIdx.x * blockDim.x + threadIdx.x), cw = (w + 1) >> 1, Q = ((h + 1) >> 1) * cw;
    if (e >= n) return;
    const int pl = e / Q, q = e - pl * Q, cy = q / cw, cx = q - cy * cw, iy = 2 * cy, ix = 2 * cx;
    const int32_t a = (int32_t)(iy * w + ix), at[4] = {a, a + 1, a + w, a + w + 1};
    const int right = ix + 1 < w, low = iy + 1 < h;
    const size_t base = (size_t)pl * h * w + a;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f}, yi[4];
    int k;
    if (cy < oh && cx < ow) {
        const size_t po = (size_t)pl * oh * ow + (size_t)(cy * ow + cx);
        const int32_t s = arg[po];
        const float d = dy[po];
        const int pass = !y || y[po] > 0.0f;
        for (k = 0; k < 4; ++k) v[k] = s == at[k] && pass ? d : 0.0f;
    }
    if (act_in != MNISTCU_ACT_IDENTITY) {
        if (right) mnistcu__ld_pair(y_in + base, yi);
        else yi[0] = y_in[base];
        if (low) {
            if (right) mnistcu__ld_pair(y_in + base + w, yi + 2);
            else yi[2] = y_in[base + w];
        }
        for (k = 0; k < 4; ++k)
            if ((k & 1) ? right : 1)
                if ((k & 2) ? low : 1) v[k] = mnistcu__act_backward_one((mnistcu_act)act_in, v[k], yi[k]);
    }
    mnistcu__st_pair(dx + base, v[0], v[1], right);
    if (low) mnistcu__st_pair(dx + base + w, v[2], v[3], right);
}

#ifdef MNISTCU_CUDNN
/* The same pooling through cuDNN (deterministic max). dy NULL: forward; else backward. */
static mnistcu_result mnistcu__pool_dnn(mnistcu_model *m, mnistcu__layer *L, size_t B, const float *dy, float *dx)
{
    cudnnHandle_t h = mnistcu__cu(m->ctx)->dnn;
    mnistcu__dnn_layer *d;
    const float one = 1.0f, zero = 0.0f;
    size_t n = B * L->out_size;
    cudaStream_t st = mnistcu__cuda_stream(m->ctx);
    cudnnStatus_t s;
    mnistcu_result r = mnistcu__dnn_layer_get(m, L, B, &d);
    if (r) return r;
    if (!dy) {
        s = cudnnPoolingForward(h, d->pool, &one, d->x, L->in, &zero, d->y, L->out);
        if ((r = mnistcu__dnn_check(m->ctx, s, "pooling forward")) || L->act == MNISTCU_ACT_IDENTITY) return r;
        mnistcu__launch(mnistcu__k_bias_act, mnistcu__blocks(n), MNISTCU__THREADS, 0, st, L->out, NULL, n, 1, (int)L->act);
        MNISTCU__LAUNCHED(m->ctx, "pool_relu");
        return MNISTCU_OK;
    }
    if (L->act != MNISTCU_ACT_IDENTITY) { /* the folded ReLU first; where it cut, the gradient is zero */
        mnistcu__launch(mnistcu__k_act_backward, mnistcu__blocks(n), MNISTCU__THREADS, 0, st, (float *)dy, L->out, n, (int)L->act);
        MNISTCU__LAUNCHED(m->ctx, "pool_relu_backward");
    }
    s = cudnnPoolingBackward(h, d->pool, &one, d->y, L->out, d->y, dy, d->x, L->in, &zero, d->x, dx);
    return mnistcu__dnn_check(m->ctx, s, "pooling backward");
}
#endif

static mnistcu_result mnistcu__cuda_pool_forward(mnistcu_model *m, mnistcu__layer *L, size_t B, int is_max)
{
    if (L->fwd_done) { /* the batch norm before made this step's output (mnistcu__bn_pool_after) */
        L->fwd_done = 0;
        return MNISTCU_OK;
    }
#ifdef MNISTCU_CUDNN
    if (mnistcu__use_cudnn(m->ctx)) return mnistcu__pool_dnn(m, L, B, NULL, NULL);
#endif
    size_t planes = B * (size_t)L->c, P = (size_t)L->oh * (size_t)L->ow;
    if (is_max && mnistcu__pool2(L) && mnistcu__grid_1d_ok(planes * P))
        mnistcu__launch(mnistcu__k_pool2_forward, mnistcu__blocks(planes * P), MNISTCU__THREADS, 0,
                        mnistcu__cuda_stream(m->ctx), (const float *)L->in, L->h, L->w, L->oh, L->ow, (int)(planes * P),
                        (int)L->act, L->out, (int32_t *)L->aux);
    else if (P >= MNISTCU__PLANE_THREADS / 2 && mnistcu__grid_yz_ok(planes, 1)) /* fewer: most of a block idle */
        mnistcu__launch(mnistcu__k_pool_forward_y, mnistcu__grid_plane(P, planes, 1), MNISTCU__PLANE_THREADS, 0,
                        mnistcu__cuda_stream(m->ctx), L->in, mnistcu__geom_of(L), is_max, (int)L->act, L->out,
                        (int32_t *)L->aux);
    else
        mnistcu__launch(mnistcu__k_pool_forward, mnistcu__blocks(planes * P), MNISTCU__THREADS, 0,
                        mnistcu__cuda_stream(m->ctx), L->in, mnistcu__geom_of(L), planes, is_max, (int)L->act, L->out,
                        (int32_t *)L->aux);
    MNISTCU__LAUNCHED(m->ctx, "pool_forward");
    return MNISTCU_OK;
}
static mnistcu_result mnistcu__cuda_pool_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, const float *dy,
                                                  float *dx, int is_max)
{
    size_t planes = B * (size_t)L->c;
    mnistcu__layer *C;
    if (!dx) return MNISTCU_OK;
#ifdef MNISTCU_CUDNN
    if (mnistcu__use_cudnn(m->ctx)) return mnistcu__pool_dnn(m, L, B, dy, dx);
#endif
    /* in a head step (m->head_step: a training step's backward pass, never a layer's pass alone), the
       convolution before takes its activation's derivative here, the same operation on the same values
       as its own pass (mnistcu__k_act_backward, or the columns path's k_conv_dout), and skips that pass
       (dy_done, cleared with the head's): one kernel less. LeNet-5 with our kernels 109.2-109.6 ->
       105.3-107.6 ms an epoch on the H100 (bench/RESULTS.md); cuda_head_step_matches_step_by_step
       compares its bits with the step by step path's */
    C = m->head_step ? mnistcu__layer_before(m, (int)(L - m->layers)) : NULL;
    if (C && is_max && C->trained && mnistcu__bn_pool_after(m, C) == L) { /* the batch norm before routes dy */
        C->dy_pool = 1;
        m->dy_kept = 1; /* and gets our dy as its own (mnistcu__backward_from) */
        return MNISTCU_OK;
    }
    if (C && is_max && mnistcu__conv_pool_route(m, C, L, B)) { /* the first convolution's weight gradient routes it */
        C->dy_pool = 1;
        m->dy_kept = 1;
        return MNISTCU_OK;
    }
    if (C && (C->d.kind != MNISTCU_LAYER_CONV2D || C->act == MNISTCU_ACT_IDENTITY || C->out != L->in || C->dy_done))
        C = NULL;
    {
        const mnistcu__geom g = mnistcu__geom_of(L);
        const int32_t *arg = is_max ? (const int32_t *)L->aux : NULL;
        const float *y = L->act == MNISTCU_ACT_RELU ? L->out : NULL, *y_in = C ? (const float *)L->in : NULL;
        const int act_in = C ? (int)C->act : (int)MNISTCU_ACT_IDENTITY;
        const size_t S = (size_t)L->h * (size_t)L->w;
        cudaStream_t st = mnistcu__cuda_stream(m->ctx);
        const size_t Q = (size_t)((L->h + 1) / 2) * (size_t)((L->w + 1) / 2);
        if (is_max && mnistcu__pool2(L) && mnistcu__grid_1d_ok(planes * Q)) {
            mnistcu__launch(mnistcu__k_pool2_backward, mnistcu__blocks(planes * Q), MNISTCU__THREADS, 0, st, dy, arg, y,
                            L->h, L->w, L->oh, L->ow, (int)(planes * Q), dx, act_in, y_in);
        } else if (g.sh == g.kh && g.sw == g.kw && mnistcu__grid_yz_ok(planes, 1)) { /* windows that do not overlap */
            if (g.kh == 2 && g.kw == 2)
                mnistcu__launch(mnistcu__k_pool_backward_y<1>, mnistcu__grid_plane(S, planes, 1),
                                MNISTCU__PLANE_THREADS, 0, st, dy, arg, y, g, dx, act_in, y_in);
            else
                mnistcu__launch(mnistcu__k_pool_backward_y<0>, mnistcu__grid_plane(S, planes, 1),
                                MNISTCU__PLANE_THREADS, 0, st, dy, arg, y, g, dx, act_in, y_in);
        } else {
            mnistcu__launch(mnistcu__k_pool_backward, mnistcu__blocks(planes * S), MNISTCU__THREADS, 0, st, dy, arg, y,
                            g, planes, dx, act_in, y_in);
        }
    }
    MNISTCU__LAUNCHED(m->ctx, "pool_backward");
    if (C) C->dy_done = 1;
    return MNISTCU_OK;
}
static mnistcu_result mnistcu__maxpool_cuda_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    return mnistcu__cuda_pool_forward(m, L, B, 1);
}
static mnistcu_result mnistcu__avgpool_cuda_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    return mnistcu__cuda_pool_forward(m, L, B, 0);
}
static mnistcu_result mnistcu__maxpool_cuda_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    return mnistcu__cuda_pool_backward(m, L, B, dy, dx, 1);
}
static mnistcu_result mnistcu__avgpool_cuda_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    return mnistcu__cuda_pool_backward(m, L, B, dy, dx, 0);
}
#endif

static const mnistcu__kind mnistcu__kind_MAXPOOL2D = {
    mnistcu__pool_shape, mnistcu__maxpool_aux, NULL,
    {mnistcu__maxpool_cpu_forward, MNISTCU__CUDA_FN(mnistcu__maxpool_cuda_forward)},
    {mnistcu__maxpool_cpu_backward, MNISTCU__CUDA_FN(mnistcu__maxpool_cuda_backward)}};
static const mnistcu__kind mnistcu__kind_AVGPOOL2D = {
    mnistcu__pool_shape, NULL, NULL,
    {mnistcu__avgpool_cpu_forward, MNISTCU__CUDA_FN(mnistcu__avgpool_cuda_forward)},
    {mnistcu__avgpool_cpu_backward, MNISTCU__CUDA_FN(mnistcu__avgpool_cuda_backward)}};

/* >>layer_batchnorm ----------------------------------------------------------------
   torch.nn.BatchNorm2d over the channels of maps, BatchNorm1d over the features
   of flat data: both normalise each of the C channels over its n = B*S values
   (S = H*W, 1 when flat). TRAIN: the batch's mean and biased variance; the
   running estimates move by momentum towards the mean and the unbiased variance
   (n/(n-1)); num_batches_tracked counts the batches. EVAL: the running
   estimates. y = (x - mean) * invstd * gamma + beta, invstd = 1/sqrt(var + eps).
   Sums run in double; the CPU adds in element order, the GPU in a fixed tree,
   so the two agree to the float. Backward, with the statistics the forward used:
     dgamma = sum dy (x - mean) invstd,  dbeta = sum dy,
     TRAIN: dx = (dy - sum dy / n - (x - mean) invstd^2 sum dy (x - mean) / n) invstd gamma
     EVAL:  dx = dy invstd gamma */
static mnistcu_result mnistcu__bn_shape(mnistcu_ctx *ctx, mnistcu__layer *L)
{
    mnistcu_layer_desc *d = &L->d;
    if (d->eps == 0.0f) d->eps = 1e-5f;
    if (d->momentum == 0.0f) d->momentum = 0.1f;
    if (!(d->eps > 0.0f && d->eps < 1.0f) || !(d->momentum > 0.0f && d->momentum <= 1.0f))
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_INVALID_ARGUMENT, "eps %g not in (0, 1) or momentum %g not in (0, 1]",
                                   (double)d->eps, (double)d->momentum);
    mnistcu__same_shape(ctx, L);
    L->nw = L->nb = (size_t)L->c;
    return MNISTCU_OK;
}

/* The GPU's partial sums (see mnistcu__bn_pieces) take room for min(64, B) pieces. */
static size_t mnistcu__bn_aux(const mnistcu__layer *L, size_t B)
{
    /* mean [C], invstd [C]; then, 8-byte aligned, two doubles per channel and piece (the GPU's partial sums) */
    size_t parts;
    if (!mnistcu__mul((size_t)L->c, MNISTCU__MIN(MNISTCU__MAX(B, (size_t)1), (size_t)64) * 4, &parts) ||
        parts > SIZE_MAX / 2)
        return SIZE_MAX;
    return 2 * (size_t)L->c + 1 + parts;
}

/* Training needs two values per channel for the unbiased variance, as in PyTorch. */
static mnistcu_result mnistcu__bn_check(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    if (mnistcu__train_mode(m) && B * (size_t)L->h * (size_t)L->w < 2)
        return mnistcu__layer_fail(m->ctx, L, MNISTCU_ERR_INVALID_ARGUMENT,
                                   "batch norm in training mode needs more than one value per channel (batch %lu)",
                                   (unsigned long)B);
    if (mnistcu__train_mode(m)) L->batches++;
    L->trained = mnistcu__train_mode(m);
    return MNISTCU_OK;
}

/* The new running estimates, in PyTorch's order of operations. */
static MNISTCU__HD void mnistcu__bn_running(float *rmean, float *rvar, double mean, double var, double n, float mom)
{
    *rmean = (float)((double)mom * mean + (1.0 - (double)mom) * (double)*rmean);
    *rvar = (float)((double)mom * (var * n / (n - 1.0)) + (1.0 - (double)mom) * (double)*rvar);
}

static mnistcu_result mnistcu__bn_cpu_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    size_t C = (size_t)L->c, S = (size_t)L->h * L->w, ch, b, s;
    const float *gamma = m->params + L->wo, *beta = m->params + L->bo;
    float *rmean = m->buffers + L->buf, *rvar = rmean + C;
    mnistcu_result r = mnistcu__bn_check(m, L, B);
    if (r) return r;
    for (ch = 0; ch < C; ++ch) {
        double n = (double)(B * S), sum = 0.0, var = 0.0, mean;
        float mf, inv;
        if (L->trained) {
            for (b = 0; b < B; ++b)
                for (s = 0; s < S; ++s) sum += (double)L->in[(b * C + ch) * S + s];
            mean = sum / n;
            for (b = 0; b < B; ++b)
                for (s = 0; s < S; ++s) {
                    double dv = (double)L->in[(b * C + ch) * S + s] - mean;
                    var += dv * dv;
                }
            var /= n;
            mnistcu__bn_running(&rmean[ch], &rvar[ch], mean, var, n, L->d.momentum);
        } else {
            mean = (double)rmean[ch];
            var = (double)rvar[ch];
        }
        mf = (float)mean;
        inv = (float)(1.0 / sqrt(var + (double)L->d.eps));
        L->aux[ch] = mf;
        L->aux[C + ch] = inv;
        for (b = 0; b < B; ++b)
            for (s = 0; s < S; ++s) {
                size_t e = (b * C + ch) * S + s;
                L->out[e] = (L->in[e] - mf) * inv * gamma[ch] + beta[ch];
            }
    }
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__bn_cpu_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    size_t C = (size_t)L->c, S = (size_t)L->h * L->w, ch, b, s;
    const float *gamma = m->params + L->wo;
    for (ch = 0; ch < C; ++ch) {
        double n = (double)(B * S), sdy = 0.0, dot = 0.0;
        float mf = L->aux[ch], inv = L->aux[C + ch];
        for (b = 0; b < B; ++b)
            for (s = 0; s < S; ++s) {
                size_t e = (b * C + ch) * S + s;
                sdy += (double)dy[e];
                dot += (double)dy[e] * (double)(L->in[e] - mf);
            }
        m->grads[L->wo + ch] = (float)(dot * (double)inv);
        m->grads[L->bo + ch] = (float)sdy;
        if (dx) {
            float a = inv * gamma[ch], c1 = L->trained ? (float)(sdy / n) : 0.0f,
                  c2 = L->trained ? (float)(dot * (double)inv * (double)inv / n) : 0.0f;
            for (b = 0; b < B; ++b)
                for (s = 0; s < S; ++s) {
                    size_t e = (b * C + ch) * S + s;
                    dx[e] = (dy[e] - c1 - (L->in[e] - mf) * c2) * a;
                }
        }
    }
    return MNISTCU_OK;
}

#ifdef __CUDACC__
/* Sum over threads of v in a fixed tree; every thread gets the result. */
static __device__ double mnistcu__block_sum(double v, double *part)
{
    int t = (int)threadIdx.x, stride;
    double total;
    part[t] = v;
    __syncthreads();
    for (stride = MNISTCU__THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) part[t] += part[t + stride];
        __syncthreads();
    }
    total = part[0];
    __syncthreads();
    return total;
}

/* The GPU splits each channel's batch into pieces of `chunk` samples, about
   MNISTCU__BN_PIECE values each and at most 64, so that C x pieces blocks share
   a pass (not one block per channel); *chunk may be NULL. The count is at most
   min(64, B) but does not grow with B everywhere (B = 128 at 28 x 28 gives 22,
   B = 115 gives 23), so the aux buffer is sized for min(64, B). */
#ifndef MNISTCU__BN_PIECE
#define MNISTCU__BN_PIECE 4096
#endif
static int mnistcu__bn_pieces(size_t B, size_t S, size_t *chunk)
{
    size_t p = (B * S + MNISTCU__BN_PIECE - 1) / MNISTCU__BN_PIECE, c;
    if (p > 64) p = 64;
    if (p > B) p = B;
    if (p < 1) p = 1;
    c = (B + p - 1) / p;
    if (chunk) *chunk = c;
    return B ? (int)((B + c - 1) / c) : 1;
}

/* The partial sums in aux, past mean and invstd, 8-byte aligned. */
static __device__ double *mnistcu__bn_parts(float *aux, int C)
{
    return (double *)(((uintptr_t)(aux + 2 * (size_t)C) + 7) & ~(uintptr_t)7);
}

/* Block (c, p) visits the values of channel c in samples [p chunk, (p+1) chunk) in groups of V_
   consecutive values of a map (V_ divides S: 4 where it can, else 1): thread t takes
   groups t, t + THREADS, ..., counted over those samples' maps in order and stepped without a division;
   at_ is the group's first value in the batch tensor, its values taken in order. With V_ = 1 a thread's
   values and their order are those of a loop over i = t, t + THREADS, ... */
#define MNISTCU__BN_VISIT(V_, at_, body_)                                                               \
    do {                                                                                                \
        const int sv_ = S / (V_), dq_ = MNISTCU__THREADS / sv_, dg_ = MNISTCU__THREADS - dq_ * sv_;     \
        const size_t b0_ = (size_t)blockIdx.y * (size_t)chunk;                                          \
        const int nb_ = (int)MNISTCU__MIN((size_t)chunk, (size_t)B - b0_);                              \
        int q_ = (int)threadIdx.x / sv_, g_ = (int)threadIdx.x - q_ * sv_;                              \
        while (q_ < nb_) {                                                                              \
            const size_t at_ = (((b0_ + (size_t)q_) * (size_t)C + blockIdx.x) * (size_t)sv_ + (size_t)g_) * (V_); \
            body_;                                                                                      \
            g_ += dg_;                                                                                  \
            q_ += dq_;                                                                                  \
            if (g_ >= sv_) {                                                                            \
                g_ -= sv_;                                                                              \
                ++q_;                                                                                   \
            }                                                                                           \
        }                                                                                               \
    } while (0)

/* V values from p into v, and back: one 16-byte access where p is aligned to it (the whole buffer is
   then, since groups start at multiples of 4), else one a value; either way the same values. */
template <int V>
static __device__ __forceinline__ void mnistcu__bn_ld(const float *p, float *v)
{
    int k;
    if (V == 4 && !((uintptr_t)p & 15)) {
        const float4 t = *(const float4 *)p;
        v[0] = t.x;
        v[1] = t.y;
        v[2] = t.z;
        v[3] = t.w;
    } else {
        for (k = 0; k < V; ++k) v[k] = p[k];
    }
}
template <int V>
static __device__ __forceinline__ void mnistcu__bn_st(float *p, const float *v)
{
    int k;
    if (V == 4 && !((uintptr_t)p & 15)) *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    else
        for (k = 0; k < V; ++k) p[k] = v[k];
}

/* One normalised value: the same expression in every kernel that makes one. */
static __device__ __forceinline__ float mnistcu__bn_y(float x, float mf, float inv, float g, float bt)
{
    return (x - mf) * inv * g + bt;
}

/* TRAIN statistics, pass 1: piece p of channel c writes its sum and the sum of squared
   deviations from its own mean (Chan et al.'s pairwise form, exact to combine). */
template <int V>
__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_bn_stats(const float *x, int B, int C, int S, int chunk,
                                                                          int pieces, float *aux)
{
    MNISTCU__PDL_WAIT();
    __shared__ double red[MNISTCU__THREADS];
    double s = 0.0, q = 0.0, sum, mean, n;
    double *part = mnistcu__bn_parts(aux, C) + 2 * ((size_t)blockIdx.x * pieces + blockIdx.y);
    n = (double)(MNISTCU__MIN((size_t)chunk, (size_t)B - (size_t)blockIdx.y * chunk) * (size_t)S);
    MNISTCU__BN_VISIT(V, e, {
        float v[V];
        int k;
        mnistcu__bn_ld<V>(x + e, v);
        for (k = 0; k < V; ++k) s += (double)v[k];
    });
    sum = mnistcu__block_sum(s, red);
    mean = sum / n;
    MNISTCU__BN_VISIT(V, e, {
        float v[V];
        int k;
        mnistcu__bn_ld<V>(x + e, v);
        for (k = 0; k < V; ++k) {
            const double d = (double)v[k] - mean;
            q += d * d;
        }
    });
    q = mnistcu__block_sum(q, red);
    if (threadIdx.x == 0) {
        part[0] = sum;
        part[1] = q;
    }
}

/* A channel's pieces added in a fixed tree by warp 0 (lane l holds pieces l and l + 32): every block gets
   the same bits. With `chan`: the sum of squares around the channel's mean, from each piece's
   (sum, squares about its mean, count); else plain sums of both values. */
static __device__ void mnistcu__bn_combine(const double *part, int pieces, int B, int chunk, int S, int chan,
                                           double *a, double *b)
{
    int l = (int)threadIdx.x, k;
    double sa = 0.0, sb = 0.0, n = (double)B * (double)S;
    for (k = l; k < pieces; k += 32) sa += part[2 * k];
    for (k = 16; k > 0; k >>= 1) sa += __shfl_down_sync(0xffffffffu, sa, k);
    sa = __shfl_sync(0xffffffffu, sa, 0);
    for (k = l; k < pieces; k += 32) {
        if (chan) {
            double nk = (double)MNISTCU__MIN(chunk, B - k * chunk) * (double)S, d = part[2 * k] / nk - sa / n;
            sb += part[2 * k + 1] + nk * d * d;
        } else {
            sb += part[2 * k + 1];
        }
    }
    for (k = 16; k > 0; k >>= 1) sb += __shfl_down_sync(0xffffffffu, sb, k);
    *a = sa;
    *b = __shfl_sync(0xffffffffu, sb, 0);
}

/* The mean and invstd that block (c, p) normalises with, into mi[0] and mi[1] for the whole block. TRAIN:
   warp 0 combines the channel's pieces (block (c, 0) keeps mean and invstd in aux and moves the running
   estimates); EVAL: the running estimates. */
static __device__ void mnistcu__bn_coeffs(int B, int C, int S, int chunk, int pieces, float *rmean, float *rvar,
                                          float *aux, int train, float eps, float mom, float *mi)
{
    int c = (int)blockIdx.x;
    if (threadIdx.x < 32) {
        double mean, var;
        if (train) {
            double sum, m2, n = (double)B * (double)S;
            mnistcu__bn_combine(mnistcu__bn_parts(aux, C) + 2 * (size_t)c * pieces, pieces, B, chunk, S, 1, &sum, &m2);
            mean = sum / n;
            var = m2 / n;
            if (threadIdx.x == 0 && blockIdx.y == 0) mnistcu__bn_running(&rmean[c], &rvar[c], mean, var, n, mom);
        } else {
            mean = (double)rmean[c];
            var = (double)rvar[c];
        }
        if (threadIdx.x == 0) {
            mi[0] = (float)mean;
            mi[1] = (float)(1.0 / sqrt(var + (double)eps));
            if (blockIdx.y == 0) {
                aux[c] = mi[0];
                aux[C + c] = mi[1];
            }
        }
    }
    __syncthreads();
}

/* y over the blocks of the statistics pass. */
template <int V>
__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_bn_apply(
    const float *x, float *y, int B, int C, int S, int chunk, int pieces, const float *gamma, const float *beta,
    float *rmean, float *rvar, float *aux, int train, float eps, float mom)
{
    MNISTCU__PDL_WAIT();
    __shared__ float mi[2];
    const float g = gamma[blockIdx.x], bt = beta[blockIdx.x];
    float mf, inv;
    mnistcu__bn_coeffs(B, C, S, chunk, pieces, rmean, rvar, aux, train, eps, mom, mi);
    mf = mi[0];
    inv = mi[1];
    MNISTCU__BN_VISIT(V, e, {
        float v[V];
        int k;
        mnistcu__bn_ld<V>(x + e, v);
        for (k = 0; k < V; ++k) v[k] = mnistcu__bn_y(v[k], mf, inv, g, bt);
        mnistcu__bn_st<V>(y + e, v);
    });
}

/* Where a max pool of 2x2 windows and stride 2 follows (mnistcu__bn_pool_after), the passes after the
   statistics visit a map by cells of 2x2 values, the pool's windows (cells past its last row or column
   hold the map's last row or column: 1 or 2 values): thread t of block (c, p) takes cells t, t + THREADS,
   ... of channel c in samples [p chunk, (p+1) chunk), stepped without a division, and a cell's values
   in row order, a row's pair in one 8-byte access where the width is even and the buffer aligned. The
   forward pass visits only the pool's windows. In a head step the pool leaves its output gradient as it
   is and the backward passes route it (POOL), each cell's window read once: the value the pool's backward
   pass (mnistcu__k_pool_backward_y<1>) would have written, the same operations in the same order whichever
   path, so the same bits. */
typedef struct mnistcu__bn_dyp {
    const float *dy;    /* POOL: the pool's output gradient [B][C][OH][OW]; else the batch norm's [B][C][H][W] */
    const int32_t *arg; /* POOL: the pool's argmax */
    const float *y;     /* POOL: the pool's output where a ReLU is folded into it, else NULL */
    int h, w, oh, ow;   /* the map; the pool's output */
} mnistcu__bn_dyp;

/* Thread t's cells of an ny_ x nx_ grid: plane pl_ (channel c of sample b0 + q), cell (cy_, cx_); body_
   without commas outside parentheses. */
#define MNISTCU__BN_CELLS(ny_, nx_, pl_, cy_, cx_, body_)                                               \
    do {                                                                                                \
        const int nx2_ = (nx_), ny2_ = (ny_), nc_ = nx2_ * ny2_, dq_ = MNISTCU__THREADS / nc_;          \
        const int dr_ = MNISTCU__THREADS - dq_ * nc_, dy_ = dr_ / nx2_, dx_ = dr_ - dy_ * nx2_;         \
        const size_t b0_ = (size_t)blockIdx.y * (size_t)chunk;                                          \
        const int nb_ = (int)MNISTCU__MIN((size_t)chunk, (size_t)B - b0_);                              \
        int q_ = (int)threadIdx.x / nc_, cy_ = ((int)threadIdx.x - q_ * nc_) / nx2_;                    \
        int cx_ = (int)threadIdx.x - q_ * nc_ - cy_ * nx2_;                                             \
        while (q_ < nb_) {                                                                              \
            const size_t pl_ = (b0_ + (size_t)q_) * (size_t)C + blockIdx.x;                             \
            body_;                                                                                      \
            cx_ += dx_;                                                                                 \
            cy_ += dy_;                                                                                 \
            q_ += dq_;                                                                                  \
            if (cx_ >= nx2_) {                                                                          \
                cx_ -= nx2_;                                                                            \
                ++cy_;                                                                                  \
            }                                                                                           \
            if (cy_ >= ny2_) {                                                                          \
                cy_ -= ny2_;                                                                            \
                ++q_;                                                                                   \
            }                                                                                           \
        }                                                                                               \
    } while (0)

/* The n (1 or 2) values of a cell's row at p; in one 8-byte load where n is 2, the width even and p
   aligned (the whole buffer is then). */
static __device__ __forceinline__ void mnistcu__bn_row(const float *p, int n, int w, float *v)
{
    if (n == 2 && !(w & 1) && !((uintptr_t)p & 7)) {
        const float2 t = *(const float2 *)p;
        v[0] = t.x;
        v[1] = t.y;
    } else {
        v[0] = p[0];
        v[1] = n > 1 ? p[1] : 0.0f;
    }
}

/* TRAIN, with the max pool after it (mnistcu__bn_pool_after): the pool's output and argmax straight from x,
   over the same blocks, the batch norm's own output not written. Each window's four values are
   normalised as mnistcu__k_bn_apply makes them and compared in mnistcu__pool_at's order, with the ReLU
   folded into the pool (act): the same bits as the two passes. */
__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_bn_apply_pool(
    const float *x, int B, int C, int H, int W, int OH, int OW, int chunk, int pieces, const float *gamma,
    const float *beta, float *rmean, float *rvar, float *aux, float eps, float mom, int act, float *py, int32_t *parg)
{
    MNISTCU__PDL_WAIT();
    __shared__ float mi[2];
    const size_t S = (size_t)H * W, P = (size_t)OH * OW;
    const float g = gamma[blockIdx.x], bt = beta[blockIdx.x];
    float mf, inv;
    mnistcu__bn_coeffs(B, C, (int)S, chunk, pieces, rmean, rvar, aux, 1, eps, mom, mi);
    mf = mi[0];
    inv = mi[1];
    MNISTCU__BN_CELLS(OH, OW, pl, oy, ox, {
        const float *xp = x + pl * S;
        float best = -INFINITY;
        int32_t bi = (int32_t)(2 * oy * W + 2 * ox);
        int r;
        int t;
        for (r = 0; r < 2; ++r) {
            float v[2];
            mnistcu__bn_row(xp + (2 * oy + r) * W + 2 * ox, 2, W, v);
            for (t = 0; t < 2; ++t) {
                const float u = mnistcu__bn_y(v[t], mf, inv, g, bt);
                if (u > best || u != u) {
                    best = u;
                    bi = (int32_t)((2 * oy + r) * W + 2 * ox + t);
                }
            }
        }
        py[pl * P + (size_t)(oy * OW + ox)] = mnistcu__act_f((mnistcu_act)act, best);
        parg[pl * P + (size_t)(oy * OW + ox)] = bi;
    });
}

/* The routed gradient of cell (cy, cx) of plane pl: *am the index in the plane that takes it (-1: none),
   the value returned. */
static __device__ __forceinline__ float mnistcu__bn_route(const mnistcu__bn_dyp &p, size_t pl, int cy, int cx,
                                                          int32_t *am)
{
    size_t po;
    *am = -1;
    if (cy >= p.oh || cx >= p.ow) return 0.0f;
    po = pl * (size_t)(p.oh * p.ow) + (size_t)(cy * p.ow + cx);
    if (p.y && !(p.y[po] > 0.0f)) return 0.0f;
    *am = p.arg[po];
    return p.dy[po];
}

/* Backward, pass 1: piece p of channel c writes its sums of dy and dy (x - mean). VISIT 0: groups of V
   values (MNISTCU__BN_VISIT); 1: by cells; 2: by cells, routing the pool's gradient (POOL above). */
template <int VISIT, int V>
__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_bn_dsums(const float *x, mnistcu__bn_dyp dyp, int B,
                                                                          int C, int S, int chunk, int pieces,
                                                                          float *aux)
{
    MNISTCU__PDL_WAIT();
    __shared__ double red[MNISTCU__THREADS];
    double sdy = 0.0, dot = 0.0;
    const float mf = aux[blockIdx.x];
    double *part = mnistcu__bn_parts(aux, C) + 2 * ((size_t)blockIdx.x * pieces + blockIdx.y);
    if (VISIT == 0) {
        MNISTCU__BN_VISIT(V, e, {
            float d[V];
            float v[V];
            int k;
            mnistcu__bn_ld<V>(dyp.dy + e, d);
            mnistcu__bn_ld<V>(x + e, v);
            for (k = 0; k < V; ++k) {
                sdy += (double)d[k];
                dot += (double)d[k] * (double)(v[k] - mf);
            }
        });
    } else {
        MNISTCU__BN_CELLS((dyp.h + 1) / 2, (dyp.w + 1) / 2, pl, cy, cx, {
            int32_t am = -1;
            const float g = VISIT == 2 ? mnistcu__bn_route(dyp, pl, cy, cx, &am) : 0.0f;
            const int nr = 2 * cy + 1 < dyp.h ? 2 : 1;
            const int nt = 2 * cx + 1 < dyp.w ? 2 : 1;
            int r;
            int t;
            for (r = 0; r < nr; ++r) {
                const int at = (2 * cy + r) * dyp.w + 2 * cx;
                float v[2];
                float d[2];
                mnistcu__bn_row(x + pl * (size_t)S + at, nt, dyp.w, v);
                if (VISIT == 2) {
                    d[0] = am == at ? g : 0.0f;
                    d[1] = am == at + 1 ? g : 0.0f;
                } else {
                    mnistcu__bn_row(dyp.dy + pl * (size_t)S + at, nt, dyp.w, d);
                }
                for (t = 0; t < nt; ++t) {
                    sdy += (double)d[t];
                    dot += (double)d[t] * (double)(v[t] - mf);
                }
            }
        });
    }
    sdy = mnistcu__block_sum(sdy, red);
    dot = mnistcu__block_sum(dot, red);
    if (threadIdx.x == 0) {
        part[0] = sdy;
        part[1] = dot;
    }
}

/* Backward, pass 2: each block combines its channel's sums (block (c, 0) writes dgamma and dbeta), then dx
   over its piece (dx NULL: launched with one block per channel, for the gradients only); POOL: by cells,
   routing the pool's gradient. */
template <int POOL, int V>
__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_bn_dx(
    const float *x, mnistcu__bn_dyp dyp, float *dx, int B, int C, int S, int chunk, int pieces, const float *gamma,
    float *aux, int train, float *dgamma, float *dbeta)
{
    MNISTCU__PDL_WAIT();
    __shared__ float k[2];
    int c = (int)blockIdx.x;
    float mf = aux[c], inv = aux[C + c], a = inv * gamma[c], c1, c2;
    if (threadIdx.x < 32) {
        double sdy, dot, n = (double)B * (double)S;
        mnistcu__bn_combine(mnistcu__bn_parts(aux, C) + 2 * (size_t)c * pieces, pieces, B, chunk, S, 0, &sdy, &dot);
        if (threadIdx.x == 0) {
            if (blockIdx.y == 0) {
                dgamma[c] = (float)(dot * (double)inv);
                dbeta[c] = (float)sdy;
            }
            k[0] = train ? (float)(sdy / n) : 0.0f;
            k[1] = train ? (float)(dot * (double)inv * (double)inv / n) : 0.0f;
        }
    }
    __syncthreads();
    c1 = k[0];
    c2 = k[1];
    if (!dx) return;
    if (!POOL) {
        MNISTCU__BN_VISIT(V, e, {
            float d[V];
            float v[V];
            int i;
            mnistcu__bn_ld<V>(dyp.dy + e, d);
            mnistcu__bn_ld<V>(x + e, v);
            for (i = 0; i < V; ++i) v[i] = (d[i] - c1 - (v[i] - mf) * c2) * a;
            mnistcu__bn_st<V>(dx + e, v);
        });
    } else {
        MNISTCU__BN_CELLS((dyp.h + 1) / 2, (dyp.w + 1) / 2, pl, cy, cx, {
            int32_t am;
            const float g = mnistcu__bn_route(dyp, pl, cy, cx, &am);
            const int nr = 2 * cy + 1 < dyp.h ? 2 : 1;
            const int nt = 2 * cx + 1 < dyp.w ? 2 : 1;
            int r;
            int t;
            for (r = 0; r < nr; ++r) {
                const int at = (2 * cy + r) * dyp.w + 2 * cx;
                float v[2];
                float *o = dx + pl * (size_t)S + at;
                mnistcu__bn_row(x + pl * (size_t)S + at, nt, dyp.w, v);
                for (t = 0; t < nt; ++t) v[t] = ((am == at + t ? g : 0.0f) - c1 - (v[t] - mf) * c2) * a;
                if (nt == 2 && !(dyp.w & 1) && !((uintptr_t)o & 7)) {
                    *(float2 *)o = make_float2(v[0], v[1]);
                } else {
                    for (t = 0; t < nt; ++t) o[t] = v[t];
                }
            }
        });
    }
}
#undef MNISTCU__BN_CELLS
#undef MNISTCU__BN_VISIT

/* In a head step (a training step's passes, never a layer's pass alone) a batch norm in TRAIN followed by a
   max pool of 2x2 windows and stride 2 takes the pool's passes into its own: the forward pass writes the
   pool's output and argmax (mnistcu__k_bn_apply_pool) and the pool launches nothing (fwd_done); the pool's
   backward pass leaves its output gradient to the batch norm's two passes, which route it themselves
   (dy_pool, MNISTCU__BN_CELLS). The batch norm's own output is then never written: nothing in the step reads
   it. Two kernels fewer for each such pair and no round trip of the map through memory, with the same
   operations on the same values (cuda_head_step_matches_step_by_step compares the bits). P6's step, ncu
   with warm caches on the H100: 261 -> 227 us (bench/RESULTS.md). The pool after L, where it is one; else
   NULL. */
static mnistcu__layer *mnistcu__bn_pool_after(mnistcu_model *m, const mnistcu__layer *L)
{
    int i = (int)(L - m->layers);
    mnistcu__layer *P = i + 1 < m->num_layers ? &m->layers[i + 1] : NULL;
#ifdef MNISTCU_CUDNN
    if (mnistcu__use_cudnn(m->ctx)) return NULL; /* both passes through cuDNN */
#endif
    if (!P || L->d.kind != MNISTCU_LAYER_BATCHNORM || P->d.kind != MNISTCU_LAYER_MAXPOOL2D || P->in != L->out ||
        L->h < 2 || L->w < 2 || P->d.kernel_h != 2 || P->d.kernel_w != 2 || P->sh != 2 || P->sw != 2)
        return NULL;
    return P;
}

/* The kernels count a piece's values in 32 bits. */
static mnistcu_result mnistcu__bn_cuda_check(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    size_t chunk;
    mnistcu__bn_pieces(B, (size_t)L->h * L->w, &chunk);
    if (chunk > (size_t)INT_MAX / ((size_t)L->h * L->w))
        return mnistcu__layer_fail(m->ctx, L, MNISTCU_ERR_INVALID_ARGUMENT,
                                   "batch norm: %lu samples of %d x %d values are too many for the GPU's kernels",
                                   (unsigned long)B, L->h, L->w);
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__bn_cuda_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    size_t C = (size_t)L->c;
    mnistcu_result r = mnistcu__bn_cuda_check(m, L, B);
    if (r || (r = mnistcu__bn_check(m, L, B))) return r;
#ifdef MNISTCU_CUDNN
    /* training mode through cuDNN; its saved mean and inverse deviation are our aux */
    if (mnistcu__use_cudnn(m->ctx) && L->trained && L->d.eps >= CUDNN_BN_MIN_EPSILON) {
        mnistcu__dnn_layer *d;
        const float one = 1.0f, zero = 0.0f;
        if ((r = mnistcu__dnn_layer_get(m, L, B, &d))) return r;
        return mnistcu__dnn_check(
            m->ctx,
            cudnnBatchNormalizationForwardTraining(mnistcu__cu(m->ctx)->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, d->x,
                                                   L->in, d->x, L->out, d->chan, m->params + L->wo, m->params + L->bo,
                                                   (double)L->d.momentum, m->buffers + L->buf, m->buffers + L->buf + C,
                                                   (double)L->d.eps, L->aux, L->aux + C),
            "batch norm forward");
    }
#endif
    {
        size_t S = (size_t)L->h * L->w, chunk;
        int pieces = mnistcu__bn_pieces(B, S, &chunk);
        dim3 grid((unsigned)C, (unsigned)pieces); /* channels in x: flat data may have more than 65,535 */
        cudaStream_t st = mnistcu__cuda_stream(m->ctx);
        mnistcu__layer *P = m->fwd_fuse && L->trained ? mnistcu__bn_pool_after(m, L) : NULL;
        const int v4 = S % 4 == 0; /* groups of 4 values (MNISTCU__BN_VISIT) */
        if (L->trained) {
            if (v4)
                mnistcu__launch(mnistcu__k_bn_stats<4>, grid, MNISTCU__THREADS, 0, st, L->in, (int)B, (int)C, (int)S,
                                (int)chunk, pieces, L->aux);
            else
                mnistcu__launch(mnistcu__k_bn_stats<1>, grid, MNISTCU__THREADS, 0, st, L->in, (int)B, (int)C, (int)S,
                                (int)chunk, pieces, L->aux);
            MNISTCU__LAUNCHED(m->ctx, "batchnorm_stats");
        }
        if (P) { /* the pool's output instead of ours (a head step's forward pass; see mnistcu__bn_pool_after) */
            mnistcu__launch(mnistcu__k_bn_apply_pool, grid, MNISTCU__THREADS, 0, st, L->in, (int)B, (int)C, L->h, L->w,
                            P->oh, P->ow, (int)chunk, pieces, m->params + L->wo, m->params + L->bo,
                            m->buffers + L->buf, m->buffers + L->buf + C, L->aux, L->d.eps, L->d.momentum,
                            (int)P->act, P->out, (int32_t *)P->aux);
            MNISTCU__LAUNCHED(m->ctx, "batchnorm_forward_pool");
            P->fwd_done = 1;
            m->bn_pool_steps++;
            return MNISTCU_OK;
        }
        if (v4)
            mnistcu__launch(mnistcu__k_bn_apply<4>, grid, MNISTCU__THREADS, 0, st, L->in, L->out, (int)B, (int)C, (int)S,
                            (int)chunk, pieces, m->params + L->wo, m->params + L->bo, m->buffers + L->buf,
                            m->buffers + L->buf + C, L->aux, L->trained, L->d.eps, L->d.momentum);
        else
            mnistcu__launch(mnistcu__k_bn_apply<1>, grid, MNISTCU__THREADS, 0, st, L->in, L->out, (int)B, (int)C, (int)S,
                            (int)chunk, pieces, m->params + L->wo, m->params + L->bo, m->buffers + L->buf,
                            m->buffers + L->buf + C, L->aux, L->trained, L->d.eps, L->d.momentum);
        MNISTCU__LAUNCHED(m->ctx, "batchnorm_forward");
    }
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__bn_cuda_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
#ifdef MNISTCU_CUDNN
    if (mnistcu__use_cudnn(m->ctx) && L->trained && dx && L->d.eps >= CUDNN_BN_MIN_EPSILON) {
        mnistcu__dnn_layer *d;
        const float one = 1.0f, zero = 0.0f;
        mnistcu_result r = mnistcu__dnn_layer_get(m, L, B, &d);
        if (r) return r;
        return mnistcu__dnn_check(
            m->ctx,
            cudnnBatchNormalizationBackward(mnistcu__cu(m->ctx)->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero,
                                            d->x, L->in, d->x, dy, d->x, dx, d->chan, m->params + L->wo,
                                            m->grads + L->wo, m->grads + L->bo, (double)L->d.eps, L->aux,
                                            L->aux + L->c),
            "batch norm backward");
    }
#endif
    {
        size_t S = (size_t)L->h * L->w, chunk;
        int pieces = mnistcu__bn_pieces(B, S, &chunk);
        dim3 grid((unsigned)L->c, (unsigned)pieces), grid_dx((unsigned)L->c, dx ? (unsigned)pieces : 1u);
        cudaStream_t st = mnistcu__cuda_stream(m->ctx);
        const mnistcu__layer *P = mnistcu__bn_pool_after(m, L);
        const int routed = P && L->dy_pool; /* the pool left its output gradient to us (a head step) */
        mnistcu__bn_dyp p;
        memset(&p, 0, sizeof p);
        p.dy = dy;
        p.h = L->h;
        p.w = L->w;
        if (P) { /* sums by the pool's windows, whether or not we route its gradient: the same order */
            p.arg = (const int32_t *)P->aux;
            p.y = P->act == MNISTCU_ACT_RELU ? P->out : NULL;
            p.oh = P->oh;
            p.ow = P->ow;
        }
        if (routed) m->bn_pool_steps++;
        L->dy_pool = 0;
#define MNISTCU__BN_DSUMS(VISIT_, V_)                                                                          \
    mnistcu__launch(mnistcu__k_bn_dsums<VISIT_, V_>, grid, MNISTCU__THREADS, 0, st, L->in, p, (int)B, L->c, (int)S,     \
                    (int)chunk, pieces, L->aux)
#define MNISTCU__BN_DX(POOL_, V_)                                                                              \
    mnistcu__launch(mnistcu__k_bn_dx<POOL_, V_>, grid_dx, MNISTCU__THREADS, 0, st, L->in, p, dx, (int)B, L->c, (int)S, \
                    (int)chunk, pieces, m->params + L->wo, L->aux, L->trained, m->grads + L->wo, m->grads + L->bo)
        if (routed) MNISTCU__BN_DSUMS(2, 1);
        else if (P) MNISTCU__BN_DSUMS(1, 1);
        else if (S % 4 == 0) MNISTCU__BN_DSUMS(0, 4);
        else MNISTCU__BN_DSUMS(0, 1);
        MNISTCU__LAUNCHED(m->ctx, "batchnorm_backward_sums");
        if (routed) MNISTCU__BN_DX(1, 1);
        else if (S % 4 == 0) MNISTCU__BN_DX(0, 4);
        else MNISTCU__BN_DX(0, 1);
#undef MNISTCU__BN_DSUMS
#undef MNISTCU__BN_DX
        MNISTCU__LAUNCHED(m->ctx, "batchnorm_backward");
    }
    return MNISTCU_OK;
}
#endif

static const mnistcu__kind mnistcu__kind_BATCHNORM = {
    mnistcu__bn_shape, mnistcu__bn_aux, NULL,
    {mnistcu__bn_cpu_forward, MNISTCU__CUDA_FN(mnistcu__bn_cuda_forward)},
    {mnistcu__bn_cpu_backward, MNISTCU__CUDA_FN(mnistcu__bn_cuda_backward)}};

/* >>layer_dropout ------------------------------------------------------------------
   torch.nn.Dropout, inverted: TRAIN keeps each element with probability 1-p
   and scales it by 1/(1-p); EVAL is the identity. The mask is drawn from
   Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
   2011), a counter-based generator: element e of the layer's batch tensor at
   optimizer step t uses word e%4 of philox(counter {e/4, layer, t lo, t hi},
   key {seed lo, seed hi}), so any thread on any device draws the same bit with
   no state to carry: the CPU and the GPU drop the same elements. The backward
   pass draws the mask again. */
static MNISTCU__HD void mnistcu__philox(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    int round;
    for (round = 0; round < 10; ++round) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = (uint32_t)p1;
        c[2] = n2;
        c[3] = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

/* 1 when element e is kept: its uniform draw (24 bits) is at least p. */
static MNISTCU__HD int mnistcu__dropout_keep(uint64_t seed, int layer, uint64_t step, size_t e, float p)
{
    uint32_t c[4];
    c[0] = (uint32_t)(e >> 2);
    c[1] = (uint32_t)layer;
    c[2] = (uint32_t)step;
    c[3] = (uint32_t)(step >> 32);
    mnistcu__philox(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    return (float)(c[e & 3u] >> 8) * (1.0f / 16777216.0f) >= p;
}

static mnistcu_result mnistcu__dropout_shape(mnistcu_ctx *ctx, mnistcu__layer *L)
{
    if (L->d.p == 0.0f) L->d.p = 0.5f;
    if (!(L->d.p > 0.0f && L->d.p < 1.0f))
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_INVALID_ARGUMENT, "probability %g not in (0, 1)", (double)L->d.p);
    return mnistcu__same_shape(ctx, L);
}

/* y = mask * x * scale (TRAIN) or x; the same for the gradient. */
static void mnistcu__cpu_dropout(const mnistcu_model *m, const mnistcu__layer *L, size_t n, const float *x, float *y)
{
    size_t e;
    float scale = 1.0f / (1.0f - L->d.p);
    if (!L->trained) {
        memcpy(y, x, n * sizeof(float));
        return;
    }
    for (e = 0; e < n; ++e)
        y[e] = mnistcu__dropout_keep(m->ctx->desc.seed, L->index, L->step, e, L->d.p) ? x[e] * scale : 0.0f;
}

static mnistcu_result mnistcu__dropout_cpu_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    L->trained = mnistcu__train_mode(m);
    L->step = m->steps;
    mnistcu__cpu_dropout(m, L, B * L->in_size, L->in, L->out);
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__dropout_cpu_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    if (dx) mnistcu__cpu_dropout(m, L, B * L->in_size, dy, dx);
    return MNISTCU_OK;
}

#ifdef __CUDACC__
__global__ void mnistcu__k_dropout(const float *x, float *y, size_t n, uint64_t seed, int layer, uint64_t step, float p,
                                   const mnistcu__dyn *dyn)
{
    MNISTCU__PDL_WAIT();
    size_t e;
    float scale = 1.0f / (1.0f - p);
    if (dyn) step = dyn->step; /* a step replayed from a graph */
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = mnistcu__dropout_keep(seed, layer, step, e, p) ? x[e] * scale : 0.0f;
}

static mnistcu_result mnistcu__cuda_dropout(mnistcu_model *m, const mnistcu__layer *L, size_t n, const float *x, float *y)
{
    cudaStream_t st = mnistcu__cuda_stream(m->ctx);
    if (!L->trained)
        return mnistcu__cuda_check(m->ctx, cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, st),
                                   "dropout (evaluation)");
    mnistcu__launch(mnistcu__k_dropout, mnistcu__blocks(n), MNISTCU__THREADS, 0, st, x, y, n, m->ctx->desc.seed, L->index, L->step,
                                                                       L->d.p, mnistcu__cuda_dyn(m));
    MNISTCU__LAUNCHED(m->ctx, "dropout");
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__dropout_cuda_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    L->trained = mnistcu__train_mode(m);
    L->step = m->steps;
    return mnistcu__cuda_dropout(m, L, B * L->in_size, L->in, L->out);
}

static mnistcu_result mnistcu__dropout_cuda_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    return dx ? mnistcu__cuda_dropout(m, L, B * L->in_size, dy, dx) : MNISTCU_OK;
}
#endif

static const mnistcu__kind mnistcu__kind_DROPOUT = {
    mnistcu__dropout_shape, NULL, NULL,
    {mnistcu__dropout_cpu_forward, MNISTCU__CUDA_FN(mnistcu__dropout_cuda_forward)},
    {mnistcu__dropout_cpu_backward, MNISTCU__CUDA_FN(mnistcu__dropout_cuda_backward)}};

/* >>layer_flatten ------------------------------------------------------------------
   torch.nn.Flatten: [C][H][W] read as [C*H*W]. NCHW is already laid out that
   way, so the layer moves no data: its output is its input, forward and back. */
static mnistcu_result mnistcu__flatten_shape(mnistcu_ctx *ctx, mnistcu__layer *L)
{
    (void)ctx;
    L->oc = L->c * L->h * L->w;
    L->oh = L->ow = 1;
    L->passthrough = 1;
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__noop_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    (void)m; (void)L; (void)B;
    return MNISTCU_OK;
}
static mnistcu_result mnistcu__noop_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    (void)m; (void)L; (void)B; (void)dy; (void)dx;
    return MNISTCU_OK;
}

static const mnistcu__kind mnistcu__kind_FLATTEN = {
    mnistcu__flatten_shape, NULL, NULL,
    {mnistcu__noop_forward, MNISTCU__CUDA_FN(mnistcu__noop_forward)},
    {mnistcu__noop_backward, MNISTCU__CUDA_FN(mnistcu__noop_backward)}};

/* >>layer_activations ----------------------------------------------------------------
   torch.nn.ReLU, LeakyReLU, Sigmoid, Tanh, elementwise. Right after a dense or
   conv layer, ReLU, Sigmoid and Tanh are folded into that layer's output, and a
   ReLU after a max pool into the pool's (the model marks them passthrough);
   elsewhere they run here. ReLU, Sigmoid and
   Tanh take their derivative from the output y, LeakyReLU from the input x. */
static mnistcu_act mnistcu__kind_act(mnistcu_layer_kind k)
{
    return k == MNISTCU_LAYER_RELU ? MNISTCU_ACT_RELU : k == MNISTCU_LAYER_SIGMOID ? MNISTCU_ACT_SIGMOID
         : k == MNISTCU_LAYER_TANH ? MNISTCU_ACT_TANH : MNISTCU_ACT_IDENTITY;
}

static mnistcu_result mnistcu__leaky_shape(mnistcu_ctx *ctx, mnistcu__layer *L)
{
    if (L->d.slope == 0.0f) L->d.slope = 0.01f;
    if (!(L->d.slope > -FLT_MAX && L->d.slope < FLT_MAX))
        return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_INVALID_ARGUMENT, "slope must be finite");
    return mnistcu__same_shape(ctx, L);
}

/* act < 0: leaky ReLU with that slope... written out: kind decides. */
static MNISTCU__HD float mnistcu__elt_forward(int leaky, int act, float slope, float x)
{
    return leaky ? (x > 0.0f ? x : x * slope) : mnistcu__act_f((mnistcu_act)act, x);
}
static MNISTCU__HD float mnistcu__elt_backward(int leaky, int act, float slope, float dy, float x, float y)
{
    return leaky ? (x > 0.0f ? dy : dy * slope) : mnistcu__act_backward_one((mnistcu_act)act, dy, y);
}

static mnistcu_result mnistcu__elt_cpu_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    size_t n = B * L->in_size, e;
    int leaky = L->d.kind == MNISTCU_LAYER_LEAKY_RELU, act = (int)mnistcu__kind_act(L->d.kind);
    (void)m;
    for (e = 0; e < n; ++e) L->out[e] = mnistcu__elt_forward(leaky, act, L->d.slope, L->in[e]);
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__elt_cpu_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    size_t n = B * L->in_size, e;
    int leaky = L->d.kind == MNISTCU_LAYER_LEAKY_RELU, act = (int)mnistcu__kind_act(L->d.kind);
    (void)m;
    if (dx)
        for (e = 0; e < n; ++e) dx[e] = mnistcu__elt_backward(leaky, act, L->d.slope, dy[e], L->in[e], L->out[e]);
    return MNISTCU_OK;
}

#ifdef __CUDACC__
__global__ void mnistcu__k_elt_forward(const float *x, float *y, size_t n, int leaky, int act, float slope)
{
    MNISTCU__PDL_WAIT();
    size_t e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        y[e] = mnistcu__elt_forward(leaky, act, slope, x[e]);
}
__global__ void mnistcu__k_elt_backward(const float *dy, const float *x, const float *y, float *dx, size_t n, int leaky,
                                        int act, float slope)
{
    MNISTCU__PDL_WAIT();
    size_t e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        dx[e] = mnistcu__elt_backward(leaky, act, slope, dy[e], x[e], y[e]);
}

static mnistcu_result mnistcu__elt_cuda_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    size_t n = B * L->in_size;
    mnistcu__launch(mnistcu__k_elt_forward, mnistcu__blocks(n), MNISTCU__THREADS, 0, mnistcu__cuda_stream(m->ctx),
        L->in, L->out, n, L->d.kind == MNISTCU_LAYER_LEAKY_RELU, (int)mnistcu__kind_act(L->d.kind), L->d.slope);
    MNISTCU__LAUNCHED(m->ctx, "activation_forward");
    return MNISTCU_OK;
}
static mnistcu_result mnistcu__elt_cuda_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    size_t n = B * L->in_size;
    if (!dx) return MNISTCU_OK;
    mnistcu__launch(mnistcu__k_elt_backward, mnistcu__blocks(n), MNISTCU__THREADS, 0, mnistcu__cuda_stream(m->ctx),
        dy, L->in, L->out, dx, n, L->d.kind == MNISTCU_LAYER_LEAKY_RELU, (int)mnistcu__kind_act(L->d.kind), L->d.slope);
    MNISTCU__LAUNCHED(m->ctx, "activation_backward");
    return MNISTCU_OK;
}
#endif

static const mnistcu__kind mnistcu__kind_RELU = {
    mnistcu__same_shape, NULL, NULL,
    {mnistcu__elt_cpu_forward, MNISTCU__CUDA_FN(mnistcu__elt_cuda_forward)},
    {mnistcu__elt_cpu_backward, MNISTCU__CUDA_FN(mnistcu__elt_cuda_backward)}};
static const mnistcu__kind mnistcu__kind_LEAKY_RELU = {
    mnistcu__leaky_shape, NULL, NULL,
    {mnistcu__elt_cpu_forward, MNISTCU__CUDA_FN(mnistcu__elt_cuda_forward)},
    {mnistcu__elt_cpu_backward, MNISTCU__CUDA_FN(mnistcu__elt_cuda_backward)}};
static const mnistcu__kind mnistcu__kind_SIGMOID = {
    mnistcu__same_shape, NULL, NULL,
    {mnistcu__elt_cpu_forward, MNISTCU__CUDA_FN(mnistcu__elt_cuda_forward)},
    {mnistcu__elt_cpu_backward, MNISTCU__CUDA_FN(mnistcu__elt_cuda_backward)}};
static const mnistcu__kind mnistcu__kind_TANH = {
    mnistcu__same_shape, NULL, NULL,
    {mnistcu__elt_cpu_forward, MNISTCU__CUDA_FN(mnistcu__elt_cuda_forward)},
    {mnistcu__elt_cpu_backward, MNISTCU__CUDA_FN(mnistcu__elt_cuda_backward)}};

/* >>layer_softmax ------------------------------------------------------------------
   torch.nn.Softmax(dim=1): over the features of flat data, over the channels
   at each position of a map. y = exp(x - max) / sum; dx = y (dy - sum dy y). */
static MNISTCU__HD void mnistcu__softmax_at(const float *x, float *y, int C, size_t S)
{
    float mx = x[0], s = 0.0f;
    int c;
    for (c = 1; c < C; ++c)
        if (x[(size_t)c * S] > mx) mx = x[(size_t)c * S];
    for (c = 0; c < C; ++c) s += (y[(size_t)c * S] = expf(x[(size_t)c * S] - mx));
    for (c = 0; c < C; ++c) y[(size_t)c * S] /= s;
}
static MNISTCU__HD void mnistcu__softmax_back_at(const float *dy, const float *y, float *dx, int C, size_t S)
{
    float dot = 0.0f;
    int c;
    for (c = 0; c < C; ++c) dot += dy[(size_t)c * S] * y[(size_t)c * S];
    for (c = 0; c < C; ++c) dx[(size_t)c * S] = y[(size_t)c * S] * (dy[(size_t)c * S] - dot);
}

static mnistcu_result mnistcu__softmax_cpu_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    size_t S = (size_t)L->h * L->w, i;
    (void)m;
    for (i = 0; i < B * S; ++i) {
        size_t off = (i / S) * L->in_size + i % S;
        mnistcu__softmax_at(L->in + off, L->out + off, L->c, S);
    }
    return MNISTCU_OK;
}
static mnistcu_result mnistcu__softmax_cpu_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    size_t S = (size_t)L->h * L->w, i;
    (void)m;
    if (dx)
        for (i = 0; i < B * S; ++i) {
            size_t off = (i / S) * L->in_size + i % S;
            mnistcu__softmax_back_at(dy + off, L->out + off, dx + off, L->c, S);
        }
    return MNISTCU_OK;
}

#ifdef __CUDACC__
__global__ void mnistcu__k_softmax_layer(const float *x, const float *y_in, float *out, size_t rows, int C, size_t S,
                                         size_t size, int backward)
{
    MNISTCU__PDL_WAIT();
    size_t i;
    for (i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += (size_t)gridDim.x * blockDim.x) {
        size_t off = (i / S) * size + i % S;
        if (backward) mnistcu__softmax_back_at(x + off, y_in + off, out + off, C, S);
        else mnistcu__softmax_at(x + off, out + off, C, S);
    }
}
static mnistcu_result mnistcu__softmax_cuda_forward(mnistcu_model *m, mnistcu__layer *L, size_t B)
{
    size_t rows = B * (size_t)L->h * L->w;
    mnistcu__launch(mnistcu__k_softmax_layer, mnistcu__blocks(rows), MNISTCU__THREADS, 0, mnistcu__cuda_stream(m->ctx),
        L->in, NULL, L->out, rows, L->c, (size_t)L->h * L->w, L->in_size, 0);
    MNISTCU__LAUNCHED(m->ctx, "softmax_forward");
    return MNISTCU_OK;
}
static mnistcu_result mnistcu__softmax_cuda_backward(mnistcu_model *m, mnistcu__layer *L, size_t B, float *dy, float *dx)
{
    size_t rows = B * (size_t)L->h * L->w;
    if (!dx) return MNISTCU_OK;
    mnistcu__launch(mnistcu__k_softmax_layer, mnistcu__blocks(rows), MNISTCU__THREADS, 0, mnistcu__cuda_stream(m->ctx),
        dy, L->out, dx, rows, L->c, (size_t)L->h * L->w, L->in_size, 1);
    MNISTCU__LAUNCHED(m->ctx, "softmax_backward");
    return MNISTCU_OK;
}
#endif

static const mnistcu__kind mnistcu__kind_SOFTMAX = {
    mnistcu__same_shape, NULL, NULL,
    {mnistcu__softmax_cpu_forward, MNISTCU__CUDA_FN(mnistcu__softmax_cuda_forward)},
    {mnistcu__softmax_cpu_backward, MNISTCU__CUDA_FN(mnistcu__softmax_cuda_backward)}};

/* The table of kinds, in the order of MNISTCU_LAYER_LIST: a kind added to the
   list without its section fails to compile here. */
static const mnistcu__kind *const mnistcu__kinds[] = {
    NULL,
#define MNISTCU__LAYER_KIND(name, key, torch) &mnistcu__kind_##name,
    MNISTCU_LAYER_LIST(MNISTCU__LAYER_KIND)
#undef MNISTCU__LAYER_KIND
};

/* >>augment ------------------------------------------------------------------------
   Data augmentation on the fly, in the training batch's gather: each image
   (uint8, one channel, H x W) is resampled through one affine warp (a rotation,
   a scale and a translation about its centre) plus an optional elastic
   distortion (Simard, Steinkraus and Platt, "Best practices for convolutional
   neural networks applied to visual document analysis", 2003: a random
   displacement field per pixel, uniform in [-1, 1], smoothed by a Gaussian of
   deviation sigma with reflected borders, times alpha), sampled bilinearly
   with zeros outside the image.
   The CPU and the GPU give the same batch, bit for bit: the random numbers
   come from Philox (as dropout's), keyed by the seed and counted by (word,
   sample position in the batch, optimizer step), and the whole warp runs in
   64-bit integer fixed point (Q24 coordinates, Q15 fields, Q16 Gaussian
   weights, Q8 interpolation weights; sine and cosine from their Taylor series
   in integers), which every compiler and device computes identically. The
   pixel that comes out, sum(w * pixel) / 65536, is exact in float; the
   normalisation x * scale + shift is one correctly rounded fmaf on both. */
#define MNISTCU__AUG_MAX_RADIUS 32
#define MNISTCU__AUG_MAX_PIXELS 3072 /* the GPU keeps 16 bytes per pixel in shared memory */
#define MNISTCU__Q24 ((int64_t)1 << 24)

typedef struct mnistcu__aug {
    int on, elastic;
    int64_t rot_q;      /* the largest angle, radians, Q24 */
    int64_t scale_q;    /* the largest relative scale change, Q24 */
    int64_t trans_q;    /* the largest shift, pixels, Q24 */
    int64_t alpha_q;    /* elastic: alpha, pixels, Q24 */
    int radius;         /* elastic: the Gaussian's half width */
    int32_t kq[MNISTCU__AUG_MAX_RADIUS + 1]; /* its weights, Q16, kq[|d|] */
    uint32_t k0, k1;    /* the seed */
} mnistcu__aug;

/* floor(v / 2^s) for any sign, without relying on how >> treats negatives. */
static MNISTCU__HD int64_t mnistcu__asr(int64_t v, int s)
{
    return v >= 0 ? v >> s : -((-v - 1) >> s) - 1;
}

/* sin and cos of x (Q24 radians, |x| <= pi/2) in Q24, Horner's rule on the Taylor series. */
static MNISTCU__HD void mnistcu__sincos_q24(int64_t x, int64_t *sn, int64_t *cs)
{
    int64_t x2 = mnistcu__asr(x * x, 24), t = MNISTCU__Q24;
    int k;
    for (k = 5; k >= 1; --k) t = MNISTCU__Q24 - mnistcu__asr(x2 * t, 24) / (2 * k * (2 * k + 1)); /* x^11/11! last */
    *sn = mnistcu__asr(x * t, 24);
    t = MNISTCU__Q24;
    for (k = 6; k >= 1; --k) t = MNISTCU__Q24 - mnistcu__asr(x2 * t, 24) / ((2 * k - 1) * 2 * k); /* x^12/12! */
    *cs = t;
}

/* The four Philox words of (word, sample i, step). */
static MNISTCU__HD void mnistcu__aug_draw(const mnistcu__aug *a, uint32_t word, uint32_t i, uint64_t step, uint32_t c[4])
{
    c[0] = word;
    c[1] = 0x80000000u | i; /* dropout's counters hold a layer index here: no overlap */
    c[2] = (uint32_t)step;
    c[3] = (uint32_t)(step >> 32);
    mnistcu__philox(c, a->k0, a->k1);
}

/* A draw as a signed Q24 number in [-1, 1). */
static MNISTCU__HD int64_t mnistcu__aug_signed(uint32_t u) { return (int64_t)(u >> 7) - MNISTCU__Q24; }

/* The elastic field's raw value k (0 <= k < 2*H*W: x displacement of pixel
   k/2 for even k, y for odd), Q15 in [-1, 1). */
static MNISTCU__HD int32_t mnistcu__aug_field(const mnistcu__aug *a, uint32_t i, uint64_t step, uint32_t k)
{
    uint32_t c[4];
    mnistcu__aug_draw(a, 1u + (k >> 2), i, step, c);
    return (int32_t)(c[k & 3u] >> 16) - 32768;
}

static MNISTCU__HD int mnistcu__reflect(int v, int n)
{
    int period = 2 * n;
    v %= period;
    if (v < 0) v += period;
    return v < n ? v : period - 1 - v;
}

/* The affine part of sample i's warp: cos, sin, 1/scale and the shift, Q24. */
typedef struct mnistcu__warp { int64_t cs, sn, inv_s, tx, ty; } mnistcu__warp;

static MNISTCU__HD void mnistcu__aug_warp(const mnistcu__aug *a, uint32_t i, uint64_t step, mnistcu__warp *w)
{
    uint32_t c[4];
    mnistcu__aug_draw(a, 0u, i, step, c);
    mnistcu__sincos_q24(mnistcu__asr(mnistcu__aug_signed(c[0]) * a->rot_q, 24), &w->sn, &w->cs);
    w->inv_s = ((int64_t)1 << 48) / (MNISTCU__Q24 + mnistcu__asr(mnistcu__aug_signed(c[1]) * a->scale_q, 24));
    w->tx = mnistcu__asr(mnistcu__aug_signed(c[2]) * a->trans_q, 24);
    w->ty = mnistcu__asr(mnistcu__aug_signed(c[3]) * a->trans_q, 24);
}

/* Horizontal pass of the field smoothing for row y, column x, component comp
   (0: x, 1: y), from the raw field: Q15. */
static MNISTCU__HD int32_t mnistcu__aug_hpass(const mnistcu__aug *a, const int32_t *raw, int H, int W, int y, int x)
{
    int64_t acc = 0;
    int d;
    (void)H;
    for (d = -a->radius; d <= a->radius; ++d)
        acc += (int64_t)a->kq[d < 0 ? -d : d] * raw[y * W + mnistcu__reflect(x + d, W)];
    return (int32_t)mnistcu__asr(acc, 16);
}

static MNISTCU__HD int32_t mnistcu__aug_vpass(const mnistcu__aug *a, const int32_t *h, int H, int W, int y, int x)
{
    int64_t acc = 0;
    int d;
    for (d = -a->radius; d <= a->radius; ++d)
        acc += (int64_t)a->kq[d < 0 ? -d : d] * h[mnistcu__reflect(y + d, H) * W + x];
    return (int32_t)mnistcu__asr(acc, 16);
}

/* Output pixel (ox, oy) of image src [H][W] under warp w plus displacement
   (ex, ey) (Q24 pixels): sum of weights times pixels, Q16. */
static MNISTCU__HD int32_t mnistcu__aug_pixel(const uint8_t *src, int H, int W, const mnistcu__warp *w, int ox, int oy,
                                              int64_t ex, int64_t ey)
{
    const int64_t half = (int64_t)1 << 23;
    int64_t dx = (int64_t)(2 * ox - (W - 1)) * half - w->tx, dy = (int64_t)(2 * oy - (H - 1)) * half - w->ty;
    int64_t sx = mnistcu__asr(w->cs * dx + w->sn * dy, 24), sy = mnistcu__asr(w->cs * dy - w->sn * dx, 24);
    int64_t X = mnistcu__asr(sx * w->inv_s, 24) + ex + (int64_t)(W - 1) * half;
    int64_t Y = mnistcu__asr(sy * w->inv_s, 24) + ey + (int64_t)(H - 1) * half;
    int64_t x0 = mnistcu__asr(X, 24), y0 = mnistcu__asr(Y, 24);
    int32_t fx = (int32_t)((X - x0 * MNISTCU__Q24) >> 16), fy = (int32_t)((Y - y0 * MNISTCU__Q24) >> 16), acc = 0;
    int k;
    for (k = 0; k < 4; ++k) {
        int64_t xx = x0 + (k & 1), yy = y0 + (k >> 1);
        int32_t wx = (k & 1) ? fx : 256 - fx, wy = (k >> 1) ? fy : 256 - fy;
        if (xx >= 0 && xx < W && yy >= 0 && yy < H) acc += wx * wy * (int32_t)src[yy * W + xx];
    }
    return acc;
}

/* The parameters of a desc, for a seed: the host's only floating-point part. */
static void mnistcu__aug_make(const mnistcu_augment_desc *d, uint64_t seed, mnistcu__aug *a)
{
    double pi = 3.14159265358979323846, sigma = d->elastic_sigma != 0.0f ? (double)d->elastic_sigma : 4.0, sum = 0.0;
    int k;
    memset(a, 0, sizeof *a);
    a->on = d->rotate != 0.0f || d->scale != 0.0f || d->translate != 0.0f || d->elastic_alpha != 0.0f;
    a->elastic = d->elastic_alpha != 0.0f;
    a->rot_q = (int64_t)floor((double)d->rotate * pi / 180.0 * 16777216.0 + 0.5);
    a->scale_q = (int64_t)floor((double)d->scale * 16777216.0 + 0.5);
    a->trans_q = (int64_t)floor((double)d->translate * 16777216.0 + 0.5);
    a->alpha_q = (int64_t)floor((double)d->elastic_alpha * 16777216.0 + 0.5);
    a->radius = (int)MNISTCU__MIN(floor(4.0 * sigma + 0.5), (double)MNISTCU__AUG_MAX_RADIUS); /* scipy's truncate 4 */
    for (k = -a->radius; k <= a->radius; ++k) sum += exp(-0.5 * k * k / (sigma * sigma));
    for (k = 0; k <= a->radius; ++k) a->kq[k] = (int32_t)floor(exp(-0.5 * k * k / (sigma * sigma)) / sum * 65536.0 + 0.5);
    a->k0 = (uint32_t)seed;
    a->k1 = (uint32_t)(seed >> 32);
}

static mnistcu_result mnistcu__aug_check(mnistcu_ctx *ctx, const mnistcu_augment_desc *d, const mnistcu_dataset *ds)
{
    if (!(d->rotate >= 0.0f && d->rotate <= 90.0f) || !(d->scale >= 0.0f && d->scale <= 0.5f) ||
        !(d->translate >= 0.0f && d->translate <= 64.0f) || !(d->elastic_alpha >= 0.0f && d->elastic_alpha <= 1000.0f) ||
        !(d->elastic_sigma >= 0.0f && d->elastic_sigma <= 8.0f) || (d->elastic_sigma != 0.0f && d->elastic_sigma < 0.5f))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "augment: rotate %g (0..90 degrees), scale %g (0..0.5), translate %g (0..64 pixels), "
                             "elastic_alpha %g (0..1000) or elastic_sigma %g (0.5..8) out of range", (double)d->rotate,
                             (double)d->scale, (double)d->translate, (double)d->elastic_alpha, (double)d->elastic_sigma);
    if (!ds->u8 || ds->rows < 2 || ds->cols < 2 || ds->features > MNISTCU__AUG_MAX_PIXELS)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "augment: needs images stored as bytes (IDX files), of at most %d pixels; this dataset is "
                             "%s, %d x %d", MNISTCU__AUG_MAX_PIXELS, ds->u8 ? "bytes" : "floats", ds->rows, ds->cols);
    return MNISTCU_OK;
}

/* Sample i of the batch at this step, on the CPU: x[F] = normalised warp of
   src. work: 4*H*W int32 (the field and its horizontal pass). */
static void mnistcu__cpu_augment(const mnistcu__aug *a, const uint8_t *src, int H, int W, uint32_t i, uint64_t step,
                                 float scale, float shift, float *x, int32_t *work)
{
    mnistcu__warp w;
    int n = H * W, p, comp;
    int32_t *raw = work, *h = work + 2 * n;
    mnistcu__aug_warp(a, i, step, &w);
    if (a->elastic) {
        for (p = 0; p < 2 * n; ++p) raw[(p & 1) * n + (p >> 1)] = mnistcu__aug_field(a, i, step, (uint32_t)p);
        for (comp = 0; comp < 2; ++comp)
            for (p = 0; p < n; ++p) h[comp * n + p] = mnistcu__aug_hpass(a, raw + comp * n, H, W, p / W, p % W);
    }
    for (p = 0; p < n; ++p) {
        int64_t ex = 0, ey = 0;
        if (a->elastic) {
            ex = mnistcu__asr((int64_t)mnistcu__aug_vpass(a, h, H, W, p / W, p % W) * a->alpha_q, 15);
            ey = mnistcu__asr((int64_t)mnistcu__aug_vpass(a, h + n, H, W, p / W, p % W) * a->alpha_q, 15);
        }
        x[p] = fmaf((float)mnistcu__aug_pixel(src, H, W, &w, p % W, p / W, ex, ey) * (1.0f / 65536.0f), scale, shift);
    }
}

MNISTCU_DEF mnistcu_result mnistcu_augment_sample(mnistcu_ctx *ctx, const mnistcu_dataset *ds,
                                                  const mnistcu_augment_desc *aug, size_t index, uint64_t step,
                                                  uint32_t slot, float *pixels)
{
    mnistcu__aug a;
    mnistcu_result r;
    int32_t *work;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!ds || !aug || !pixels || index >= ds->count)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "augment_sample: NULL argument or index out of range");
    if ((r = mnistcu__aug_check(ctx, aug, ds))) return r;
    mnistcu__aug_make(aug, ctx->desc.seed, &a);
    work = (int32_t *)mnistcu__alloc(ctx, 4 * ds->features * sizeof(int32_t));
    if (!work) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "augment_sample: out of memory");
    mnistcu__cpu_augment(&a, ds->u8 + index * ds->features, ds->rows, ds->cols, slot, step, 1.0f, 0.0f, pixels, work);
    mnistcu__free(ctx, work);
    return MNISTCU_OK;
}

#ifdef __CUDACC__
/* One block per sample: the field, its two smoothing passes in shared memory,
   then the warped pixels. Labels (and targets) as mnistcu__k_gather. */
__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_gather_augment(
    mnistcu__aug a, const uint8_t *u8, const int32_t *src_labels, const float *src_targets, int T, const uint32_t *idx,
    size_t offset, int H, int W, uint64_t step, float scale, float shift, float *x, int32_t *labels, float *targets,
    const mnistcu__dyn *dyn)
{
    MNISTCU__PDL_WAIT();
    extern __shared__ int32_t mnistcu__aug_smem[];
    int i = (int)blockIdx.x, n = H * W, p, t = (int)threadIdx.x;
    size_t s;
    if (dyn) { /* a step replayed from a graph: this step's offset and counter */
        offset = (size_t)dyn->offset;
        step = dyn->step;
    }
    s = idx ? (size_t)idx[offset + i] : offset + i;
    const uint8_t *src = u8 + s * (size_t)n;
    int32_t *raw = mnistcu__aug_smem, *h = raw + 2 * n;
    mnistcu__warp w;
    mnistcu__aug_warp(&a, (uint32_t)i, step, &w);
    if (a.elastic) {
        for (p = t; p < 2 * n; p += blockDim.x) raw[(p & 1) * n + (p >> 1)] = mnistcu__aug_field(&a, (uint32_t)i, step, (uint32_t)p);
        __syncthreads();
        for (p = t; p < 2 * n; p += blockDim.x) {
            int comp = p / n, q = p - comp * n;
            h[p] = mnistcu__aug_hpass(&a, raw + comp * n, H, W, q / W, q % W);
        }
        __syncthreads();
    }
    for (p = t; p < n; p += blockDim.x) {
        int64_t ex = 0, ey = 0;
        if (a.elastic) {
            ex = mnistcu__asr((int64_t)mnistcu__aug_vpass(&a, h, H, W, p / W, p % W) * a.alpha_q, 15);
            ey = mnistcu__asr((int64_t)mnistcu__aug_vpass(&a, h + n, H, W, p / W, p % W) * a.alpha_q, 15);
        }
        x[(size_t)i * n + p] =
            __fmaf_rn((float)mnistcu__aug_pixel(src, H, W, &w, p % W, p / W, ex, ey) * (1.0f / 65536.0f), scale, shift);
    }
    if (t == 0) labels[i] = src_labels[s];
    if (src_targets)
        for (p = t; p < T; p += blockDim.x) targets[(size_t)i * T + p] = src_targets[s * T + p];
}
#endif

/* >>model_build ------------------------------------------------------------------
   Making a model: the desc (MLP widths or layers) resolved into layers with
   their shapes, the parameter and buffer arenas laid out in state_dict order,
   the named tensors, the parameters drawn, the workspace sized per batch. */
#ifdef __CUDACC__
static mnistcu_result mnistcu__cuda_model_alloc(mnistcu_model *m);
static void mnistcu__cuda_model_free(mnistcu_model *m);
static mnistcu_result mnistcu__cuda_reserve(mnistcu_model *m, size_t batch);
static mnistcu_result mnistcu__cuda_copy(mnistcu_model *m, void *dst, const void *src, size_t bytes, int to_device);
static mnistcu_result mnistcu__cuda_loss(mnistcu_model *m, size_t B, int with_grad);
static mnistcu_result mnistcu__cuda_update(mnistcu_model *m, const mnistcu__opt *k, const mnistcu_optim_desc *o);
static mnistcu_result mnistcu__cuda_malloc(mnistcu_ctx *ctx, void **p, size_t bytes, const char *what);
static void mnistcu__cuda_free(mnistcu_ctx *ctx, void *p);
static mnistcu_result mnistcu__cuda_fill(mnistcu_model *m, float *p, size_t n, float v);
#endif

/* The desc fields each kind reads: the others must stay zero. */
enum {
    MNISTCU__F_UNITS = 1, MNISTCU__F_KERNEL = 2, MNISTCU__F_STRIDE = 4, MNISTCU__F_PAD = 8, MNISTCU__F_BIAS = 16,
    MNISTCU__F_P = 32, MNISTCU__F_SLOPE = 64, MNISTCU__F_BN = 128, MNISTCU__F_INIT = 256
};
static unsigned mnistcu__kind_fields(mnistcu_layer_kind k)
{
    switch (k) {
    case MNISTCU_LAYER_DENSE: return MNISTCU__F_UNITS | MNISTCU__F_BIAS | MNISTCU__F_INIT;
    case MNISTCU_LAYER_CONV2D:
        return MNISTCU__F_UNITS | MNISTCU__F_KERNEL | MNISTCU__F_STRIDE | MNISTCU__F_PAD | MNISTCU__F_BIAS | MNISTCU__F_INIT;
    case MNISTCU_LAYER_MAXPOOL2D: case MNISTCU_LAYER_AVGPOOL2D: return MNISTCU__F_KERNEL | MNISTCU__F_STRIDE;
    case MNISTCU_LAYER_BATCHNORM: return MNISTCU__F_BN;
    case MNISTCU_LAYER_DROPOUT: return MNISTCU__F_P;
    case MNISTCU_LAYER_LEAKY_RELU: return MNISTCU__F_SLOPE;
    default: return 0;
    }
}

static const char *mnistcu__stray_field(const mnistcu_layer_desc *d)
{
    unsigned f = mnistcu__kind_fields(d->kind);
    if (d->units && !(f & MNISTCU__F_UNITS)) return "units";
    if ((d->kernel_h || d->kernel_w) && !(f & MNISTCU__F_KERNEL)) return "kernel_h/kernel_w";
    if (d->stride && !(f & MNISTCU__F_STRIDE)) return "stride";
    if (d->padding && !(f & MNISTCU__F_PAD)) return "padding";
    if (d->no_bias && !(f & MNISTCU__F_BIAS)) return "no_bias";
    if (d->p != 0.0f && !(f & MNISTCU__F_P)) return "p";
    if (d->slope != 0.0f && !(f & MNISTCU__F_SLOPE)) return "slope";
    if ((d->eps != 0.0f || d->momentum != 0.0f) && !(f & MNISTCU__F_BN)) return "eps/momentum";
    if (d->init && !(f & MNISTCU__F_INIT)) return "init";
    if ((unsigned)d->init > MNISTCU_INIT_HE_NORMAL) return "init (unknown scheme)";
    return NULL;
}

/* An MLP desc (sizes) as layers: dense, activation, ..., dense. The sizes must be valid. */
static void mnistcu__desc_expand(const mnistcu_model_desc *in, mnistcu_model_desc *out)
{
    int n = 0, l, k = 0;
    mnistcu_act act = in->hidden_act == MNISTCU_ACT_DEFAULT ? MNISTCU_ACT_RELU : in->hidden_act;
    *out = *in;
    memset(out->layers, 0, sizeof out->layers);
    while (n <= MNISTCU_MAX_LAYERS && in->sizes[n] != 0) ++n;
    out->input_c = out->input_h = 1;
    out->input_w = in->sizes[0];
    for (l = 1; l < n; ++l) {
        out->layers[k].kind = MNISTCU_LAYER_DENSE;
        out->layers[k++].units = in->sizes[l];
        if (l + 1 < n && act != MNISTCU_ACT_IDENTITY)
            out->layers[k++].kind = act == MNISTCU_ACT_SIGMOID ? MNISTCU_LAYER_SIGMOID
                                  : act == MNISTCU_ACT_TANH    ? MNISTCU_LAYER_TANH
                                                               : MNISTCU_LAYER_RELU;
    }
}

/* Checks an MLP desc's widths (the messages of version 0.1). */
/* Classes need two outputs at least; a regression (MSE) or a multi-label or
   binary output (BCE) may have one. */
static int mnistcu__min_outputs(mnistcu_loss loss)
{
    return loss == MNISTCU_LOSS_MSE || loss == MNISTCU_LOSS_BCE ? 1 : 2;
}

static mnistcu_result mnistcu__check_sizes(mnistcu_ctx *ctx, const mnistcu_model_desc *desc)
{
    int n = 0, l;
    while (n <= MNISTCU_MAX_LAYERS && desc->sizes[n] != 0) ++n;
    if (n < 2)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "model_create: sizes needs an input and an output width, e.g. {784, 10}");
    for (l = 0; l < n; ++l)
        if (desc->sizes[l] < 1 || (size_t)desc->sizes[l] > MNISTCU__MAX_FEATURES)
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create: width %d (layer %d) not in 1..2^24",
                                 desc->sizes[l], l);
    if (desc->sizes[n - 1] < mnistcu__min_outputs(desc->loss) || desc->sizes[n - 1] > MNISTCU_MAX_CLASSES)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create: %d outputs, the loss needs %d..%d",
                             desc->sizes[n - 1], mnistcu__min_outputs(desc->loss), MNISTCU_MAX_CLASSES);
    return MNISTCU_OK;
}

/* Resolves m->desc (layers form) into m->layers: shapes, fusion, arenas. */
static mnistcu_result mnistcu__model_build(mnistcu_ctx *ctx, mnistcu_model *m)
{
    mnistcu_model_desc *d = &m->desc;
    int i, n = 0, params_before = 0, c, h, w;
    size_t total = 0, nbuf = 0;
    mnistcu_result r;
    c = d->input_c ? d->input_c : 1;
    h = d->input_h ? d->input_h : 1;
    w = d->input_w;
    if (!mnistcu__shape_ok(c, h, w))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "model: input shape %dx%dx%d: each at least 1 (input_w is required), at most 2^24 values",
                             c, h, w);
    d->input_c = c;
    d->input_h = h;
    if (c == 1 && h == 1) { /* flat data: N x 1 x 1 */
        c = w;
        w = 1;
    }
    while (n < MNISTCU_MAX_MODEL_LAYERS && d->layers[n].kind != MNISTCU_LAYER_NONE) ++n;
    if (n == 0) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model: no layers");
    m->inputs = (size_t)c * h * w;
    for (i = 0; i < n; ++i) {
        mnistcu__layer *L = &m->layers[i];
        const char *stray;
        memset(L, 0, sizeof *L);
        L->d = d->layers[i];
        L->index = i;
        L->c = c;
        L->h = h;
        L->w = w;
        L->act = MNISTCU_ACT_IDENTITY;
        if ((unsigned)L->d.kind >= MNISTCU_LAYER_KIND_COUNT)
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model: layer %d has unknown kind %d", i,
                                 (int)L->d.kind);
        if ((stray = mnistcu__stray_field(&L->d)) != NULL)
            return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_INVALID_ARGUMENT, "field %s does not apply to %s (keep it 0)",
                                       stray, mnistcu__kind_keywords[L->d.kind]);
        if ((r = mnistcu__kinds[L->d.kind]->shape(ctx, L))) return r;
        if (!mnistcu__shape_ok(L->oc, L->oh, L->ow))
            return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_SHAPE, "output %dx%dx%d above 2^24 values", L->oc, L->oh, L->ow);
        L->in_size = (size_t)c * h * w;
        L->out_size = (size_t)L->oc * L->oh * L->ow;
        if (i > 0 && mnistcu__kind_act(L->d.kind) != MNISTCU_ACT_IDENTITY) {
            mnistcu__layer *prev = &m->layers[i - 1];
            if ((prev->d.kind == MNISTCU_LAYER_DENSE || prev->d.kind == MNISTCU_LAYER_CONV2D ||
                 (prev->d.kind == MNISTCU_LAYER_MAXPOOL2D && L->d.kind == MNISTCU_LAYER_RELU)) &&
                prev->act == MNISTCU_ACT_IDENTITY) {
                prev->act = mnistcu__kind_act(L->d.kind); /* folded into the layer before */
                L->passthrough = 1;
            }
        }
        if (L->nw) {
            L->wo = total;
            if (!mnistcu__add(total, L->nw, &total)) return mnistcu__fail(ctx, MNISTCU_ERR_OVERFLOW, "model: too many parameters");
        }
        if (L->nb) {
            L->bo = total;
            if (!mnistcu__add(total, L->nb, &total)) return mnistcu__fail(ctx, MNISTCU_ERR_OVERFLOW, "model: too many parameters");
        }
        if (total > ((size_t)1 << 34) / sizeof(float))
            return mnistcu__layer_fail(ctx, L, MNISTCU_ERR_SHAPE, "the model would have %lu parameters (at most 2^32)",
                                       (unsigned long)total);
        if (L->d.kind == MNISTCU_LAYER_BATCHNORM) {
            L->buf = nbuf;
            nbuf += 2 * (size_t)L->c;
        }
        L->need_dx = params_before;
        if (L->nw + L->nb) params_before = 1;
        m->max_size = MNISTCU__MAX(m->max_size, MNISTCU__MAX(L->in_size, L->out_size));
        d->layers[i] = L->d;
        c = L->oc;
        h = L->oh;
        w = L->ow;
    }
    if (h != 1 || w != 1)
        return mnistcu__layer_fail(ctx, &m->layers[n - 1], MNISTCU_ERR_SHAPE,
                                   "the last layer gives %dx%dx%d maps, but the loss needs one score per class: end "
                                   "with flatten and a dense layer", c, h, w);
    if (c < mnistcu__min_outputs(m->loss) || c > MNISTCU_MAX_CLASSES)
        return mnistcu__layer_fail(ctx, &m->layers[n - 1], MNISTCU_ERR_SHAPE,
                                   "the last layer gives %d outputs, the loss needs %d..%d", c,
                                   mnistcu__min_outputs(m->loss), MNISTCU_MAX_CLASSES);
    m->num_layers = n;
    m->classes = (size_t)c;
    m->num_params = total;
    m->num_buffers = nbuf;
    return MNISTCU_OK;
}

/* The named tensors, in state_dict order. */
static mnistcu_result mnistcu__model_tensors(mnistcu_model *m)
{
    int i, n = 0;
    for (i = 0; i < m->num_layers; ++i) {
        const mnistcu__layer *L = &m->layers[i];
        n += (L->nw > 0) + (L->nb > 0) + (L->d.kind == MNISTCU_LAYER_BATCHNORM ? 3 : 0);
    }
    m->tensors = (mnistcu__tensor *)mnistcu__calloc(m->ctx, (size_t)(n ? n : 1) * sizeof(mnistcu__tensor));
    if (!m->tensors) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model: out of memory");
    m->num_tensors = n;
    for (n = 0, i = 0; i < m->num_layers; ++i) {
        const mnistcu__layer *L = &m->layers[i];
        mnistcu__tensor *t;
        if (L->nw) {
            t = &m->tensors[n++];
            snprintf(t->name, sizeof t->name, "%d.weight", i);
            t->offset = L->wo;
            t->count = L->nw;
            t->shape[0] = L->d.kind == MNISTCU_LAYER_BATCHNORM ? L->c : L->oc;
            t->ndim = 1;
            if (L->d.kind == MNISTCU_LAYER_DENSE) {
                t->ndim = 2;
                t->shape[1] = L->c;
            } else if (L->d.kind == MNISTCU_LAYER_CONV2D) {
                t->ndim = 4;
                t->shape[1] = L->c;
                t->shape[2] = L->d.kernel_h;
                t->shape[3] = L->d.kernel_w;
            }
        }
        if (L->nb) {
            t = &m->tensors[n++];
            snprintf(t->name, sizeof t->name, "%d.bias", i);
            t->offset = L->bo;
            t->count = L->nb;
            t->ndim = 1;
            t->shape[0] = (int64_t)L->nb;
        }
        if (L->d.kind == MNISTCU_LAYER_BATCHNORM) {
            static const char *const names[3] = {"running_mean", "running_var", "num_batches_tracked"};
            int k;
            for (k = 0; k < 3; ++k) {
                t = &m->tensors[n++];
                snprintf(t->name, sizeof t->name, "%d.%s", i, names[k]);
                t->arena = k < 2 ? 1 : 2;
                t->offset = L->buf + (size_t)k * L->c;
                t->count = k < 2 ? (size_t)L->c : 1;
                t->ndim = k < 2 ? 1 : 0;
                t->shape[0] = k < 2 ? L->c : 0;
            }
        }
    }
    for (i = 0; i < m->num_tensors; ++i) m->tensors[i].layer = atoi(m->tensors[i].name);
    return MNISTCU_OK;
}

/* PyTorch's default initialisation (or He uniform), in the arena's order, from the model's generator. */
static void mnistcu__model_init_params(mnistcu_model *m, float *host, float *buffers)
{
    int i;
    for (i = 0; i < m->num_layers; ++i) {
        const mnistcu__layer *L = &m->layers[i];
        size_t k;
        if (L->d.kind == MNISTCU_LAYER_BATCHNORM) {
            for (k = 0; k < (size_t)L->c; ++k) {
                host[L->wo + k] = 1.0f;
                host[L->bo + k] = 0.0f;
                buffers[L->buf + k] = 0.0f;
                buffers[L->buf + L->c + k] = 1.0f;
            }
        } else if (L->nw) {
            mnistcu_init init = L->d.init ? L->d.init : m->init;
            float fan_in = (float)(L->nw / (size_t)L->oc), wb, bb;
            double rf = (double)(L->nw / (size_t)L->oc / (size_t)L->c); /* kernel positions: 1 for dense */
            double fan_out = (double)L->oc * rf, gain = (double)m->desc.init_gain;
            double fan = m->desc.init_fan_out ? fan_out : (double)fan_in;
            if (init == MNISTCU_INIT_XAVIER_UNIFORM || init == MNISTCU_INIT_XAVIER_NORMAL) {
                double sd = (gain != 0.0 ? gain : 1.0) * sqrt(2.0 / ((double)fan_in + fan_out));
                for (k = 0; k < L->nw; ++k)
                    host[L->wo + k] = init == MNISTCU_INIT_XAVIER_NORMAL ? (float)(sd * mnistcu__rng_normal(&m->rng))
                                                                         : (2.0f * mnistcu__rng_float(&m->rng) - 1.0f) *
                                                                               (float)(sd * sqrt(3.0));
                for (k = 0; k < L->nb; ++k) host[L->bo + k] = 0.0f;
                continue;
            }
            if (init == MNISTCU_INIT_HE_NORMAL || (init == MNISTCU_INIT_HE_UNIFORM && (gain != 0.0 || m->desc.init_fan_out))) {
                double sd = (gain != 0.0 ? gain : sqrt(2.0)) / sqrt(fan);
                for (k = 0; k < L->nw; ++k)
                    host[L->wo + k] = init == MNISTCU_INIT_HE_NORMAL ? (float)(sd * mnistcu__rng_normal(&m->rng))
                                                                     : (2.0f * mnistcu__rng_float(&m->rng) - 1.0f) *
                                                                           (float)(sd * sqrt(3.0));
                for (k = 0; k < L->nb; ++k) host[L->bo + k] = 0.0f;
                continue;
            }
            if (init == MNISTCU_INIT_HE_UNIFORM) { /* the defaults, drawn as version 0.1 drew them */
                wb = sqrtf(6.0f / fan_in);
                bb = 0.0f;
            } else {
                wb = bb = 1.0f / sqrtf(fan_in);
            }
            for (k = 0; k < L->nw; ++k) host[L->wo + k] = (2.0f * mnistcu__rng_float(&m->rng) - 1.0f) * wb;
            if (m->desc.zero_bias)
                for (k = 0; k < L->nb; ++k) host[L->bo + k] = 0.0f;
            else
                for (k = 0; k < L->nb; ++k) host[L->bo + k] = (2.0f * mnistcu__rng_float(&m->rng) - 1.0f) * bb;
        }
    }
}

/* Lays the workspace out for batches of B samples from base, or (base NULL)
   only counts: returns the floats needed, 0 on overflow. */
static size_t mnistcu__model_layout(mnistcu_model *m, float *base, size_t B)
{
    size_t off = 0, scratch = 0, need;
    float *prev = NULL;
    int i, ok = 1;
#define MNISTCU__TAKE(dst, a, b)                                                      \
    do {                                                                              \
        size_t n_;                                                                    \
        if (!mnistcu__mul((a), (b), &n_) || !mnistcu__add(off, n_, &need)) ok = 0;    \
        else {                                                                        \
            if (base) (dst) = base + off;                                             \
            off = need;                                                               \
        }                                                                             \
    } while (0)
    MNISTCU__TAKE(m->input, B, m->inputs);
    if (base) prev = m->input;
    for (i = 0; i < m->num_layers && ok; ++i) {
        mnistcu__layer *L = &m->layers[i];
        const mnistcu__kind *k = mnistcu__kinds[L->d.kind];
        if (base) L->in = prev;
        if (L->passthrough) {
            if (base) L->out = prev;
        } else {
            MNISTCU__TAKE(L->out, B, L->out_size);
        }
        if (k->aux_floats) {
            size_t a = k->aux_floats(L, B);
            if (a == SIZE_MAX) ok = 0;
            MNISTCU__TAKE(L->aux, a, 1);
        }
        if (k->scratch_floats) {
            size_t s = k->scratch_floats(L, B, m->backend);
            if (s == SIZE_MAX) ok = 0;
            scratch = MNISTCU__MAX(scratch, s);
        }
        if (base) prev = L->out;
    }
    if (base) m->logits = prev;
    MNISTCU__TAKE(m->dbuf[0], B, m->max_size);
    MNISTCU__TAKE(m->dbuf[1], B, m->max_size);
    MNISTCU__TAKE(m->sample_loss, B, 1);
    MNISTCU__TAKE(m->targets, B, m->classes);
    MNISTCU__TAKE(m->scratch, scratch, 1);
#undef MNISTCU__TAKE
    if (base) m->scratch_layer = 0;
    return ok ? off : 0;
}

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

static void mnistcu__finite_keep_free(mnistcu_model *m);

static void mnistcu__model_free(mnistcu__object *o)
{
    mnistcu_model *m = (mnistcu_model *)o;
    mnistcu__finite_keep_free(m);
    mnistcu__free(m->ctx, m->ahead);
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) mnistcu__cuda_model_free(m);
    else
#endif
    {
        mnistcu__free(m->ctx, m->params);
        mnistcu__free(m->ctx, m->grads);
        mnistcu__free(m->ctx, m->state);
        mnistcu__free(m->ctx, m->buffers);
        mnistcu__model_free_ws(m);
    }
    mnistcu__free(m->ctx, m->class_names);
    mnistcu__free(m->ctx, m->tensors);
    mnistcu__free(m->ctx, m);
}

MNISTCU_DEF void mnistcu_model_destroy(mnistcu_model *m)
{
    if (!m) return;
    mnistcu__object_unlink(&m->obj);
    mnistcu__model_free(&m->obj);
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
    floats = mnistcu__model_layout(m, NULL, B);
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
    m->iws = iws;
    m->labels = iws;
    m->pred = iws + B;
    mnistcu__model_layout(m, ws, B);
    m->ws_batch = B;
    return MNISTCU_OK;
}

/* Samples per evaluation chunk: up to 1000, fewer where one sample's workspace is large (CNNs). */
#define MNISTCU__EVAL_CHUNK 1000
static size_t mnistcu__eval_chunk(mnistcu_model *m, size_t n)
{
    size_t per = mnistcu__model_layout(m, NULL, 1), chunk = per ? ((size_t)1 << 26) / per : 1;
    if (chunk < 1) chunk = 1;
    if (chunk > MNISTCU__EVAL_CHUNK) chunk = MNISTCU__EVAL_CHUNK;
    if (m->ws_batch > chunk) chunk = MNISTCU__MIN(m->ws_batch, (size_t)MNISTCU__EVAL_CHUNK);
    return MNISTCU__MIN(chunk, n);
}

MNISTCU_DEF mnistcu_result mnistcu_model_create(mnistcu_ctx *ctx, const mnistcu_model_desc *desc, mnistcu_model **out)
{
    mnistcu_model *m;
    mnistcu_result r;
    float *host, *host_buf;
    size_t bytes, buf_bytes;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!desc || !out) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create: desc or out is NULL");
    *out = NULL;
    if (desc->layers[0].kind == MNISTCU_LAYER_NONE && (r = mnistcu__check_sizes(ctx, desc))) return r;
    if ((unsigned)desc->hidden_act > MNISTCU_ACT_TANH || (unsigned)desc->loss > MNISTCU_LOSS_HINGE ||
        (unsigned)desc->init > MNISTCU_INIT_HE_NORMAL || !(desc->init_gain >= 0.0f && desc->init_gain < FLT_MAX))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create: hidden_act, loss, init or init_gain out of range");
    if (!(desc->label_smoothing >= 0.0f && desc->label_smoothing <= 1.0f) ||
        !(desc->margin >= 0.0f && desc->margin < FLT_MAX) || desc->hinge_p < 0 || desc->hinge_p > 2 ||
        (unsigned)desc->loss_sum > 1)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "model_create: label_smoothing %g (0..1), margin %g (>= 0), hinge_p %d (1 or 2) or loss_sum "
                             "%d (0 or 1) out of range", (double)desc->label_smoothing, (double)desc->margin,
                             desc->hinge_p, desc->loss_sum);
    m = (mnistcu_model *)mnistcu__calloc(ctx, sizeof *m);
    if (!m) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_create: out of memory");
    m->ctx = ctx;
    m->device = ctx->device;
    m->backend = ctx->device == MNISTCU_DEVICE_CUDA;
    m->hidden_act = desc->hidden_act == MNISTCU_ACT_DEFAULT ? MNISTCU_ACT_RELU : desc->hidden_act;
    m->loss = desc->loss == MNISTCU_LOSS_DEFAULT ? MNISTCU_LOSS_SOFTMAX_CE : desc->loss;
    m->lossp.kind = (int)m->loss;
    m->lossp.sum = desc->loss_sum;
    m->lossp.smoothing = desc->label_smoothing;
    m->lossp.margin = desc->margin != 0.0f ? desc->margin : 1.0f;
    m->lossp.p = desc->hinge_p ? desc->hinge_p : 1;
    m->init = desc->init == MNISTCU_INIT_DEFAULT ? MNISTCU_INIT_TORCH : desc->init;
    if (desc->layers[0].kind == MNISTCU_LAYER_NONE) mnistcu__desc_expand(desc, &m->desc);
    else m->desc = *desc;
    m->desc.hidden_act = m->hidden_act;
    m->desc.loss = m->loss;
    m->desc.label_smoothing = m->lossp.smoothing;
    m->desc.loss_sum = m->lossp.sum;
    m->desc.margin = m->lossp.margin;
    m->desc.hinge_p = m->lossp.p;
    m->desc.init = m->init;
    if ((r = mnistcu__model_build(ctx, m))) {
        mnistcu__free(ctx, m);
        return r;
    }
    mnistcu__rng_seed(&m->rng, ctx->desc.seed, 1 + ctx->objects_made++);
    mnistcu__object_link(ctx, &m->obj, mnistcu__model_free);
    if ((r = mnistcu__model_tensors(m))) {
        mnistcu_model_destroy(m);
        return r;
    }
    bytes = m->num_params * sizeof(float);
    buf_bytes = m->num_buffers * sizeof(float);
    host = (float *)mnistcu__alloc(ctx, bytes);
    host_buf = (float *)mnistcu__alloc(ctx, buf_bytes);
    if (!host || !host_buf) {
        size_t count = m->num_params; /* m is gone after the destroy */
        mnistcu__free(ctx, host);
        mnistcu__free(ctx, host_buf);
        mnistcu_model_destroy(m);
        return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_create: out of memory for %lu parameters",
                             (unsigned long)count);
    }
    mnistcu__model_init_params(m, host, host_buf);
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) {
        r = mnistcu__cuda_model_alloc(m);
        if (r == MNISTCU_OK) r = mnistcu__cuda_copy(m, m->params, host, bytes, 1);
        if (r == MNISTCU_OK && buf_bytes) r = mnistcu__cuda_copy(m, m->buffers, host_buf, buf_bytes, 1);
        mnistcu__free(ctx, host);
        mnistcu__free(ctx, host_buf);
        if (r) {
            mnistcu_model_destroy(m);
            return r;
        }
        *out = m;
        return MNISTCU_OK;
    }
#endif
    m->params = host;
    m->buffers = host_buf;
    m->grads = (float *)mnistcu__calloc(ctx, bytes);
    if (!m->grads || (r = mnistcu__cpu_reserve(ctx)) != MNISTCU_OK) {
        mnistcu_model_destroy(m);
        return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_create: out of memory for gradients");
    }
    *out = m;
    return MNISTCU_OK;
}

/* "784-128-10" into sizes (the messages of version 0.1). */
static mnistcu_result mnistcu__parse_widths(mnistcu_ctx *ctx, const char *spec, mnistcu_model_desc *d)
{
    const char *p = spec;
    int n = 0;
    memset(d, 0, sizeof *d);
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
        d->sizes[n++] = (int)v;
        if (*p == 0) break;
        if (*p++ != '-')
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model spec \"%s\": unexpected '%c'", spec, p[-1]);
    }
    if (n <= MNISTCU_MAX_LAYERS) d->sizes[n] = 0;
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_model_create_mlp(mnistcu_ctx *ctx, const char *spec, mnistcu_model **out)
{
    mnistcu_model_desc d;
    mnistcu_result r;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!spec || !out) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create_mlp: NULL argument");
    *out = NULL;
    if ((r = mnistcu__parse_widths(ctx, spec, &d))) return r;
    return mnistcu_model_create(ctx, &d, out);
}

/* >>spec ---------------------------------------------------------------------------
   Spec strings (grammar in the doc block): a preset name, MLP widths, or the
   input shape and one token per layer. Parsing gives a desc in which every
   field equal to its default is zero, so parse -> print -> parse is the
   identity; printing omits what is default. */
static const char *const mnistcu__presets[][2] = {
    {"lenet5", "1x28x28 conv5x5x6 relu maxpool2 conv5x5x16 relu maxpool2 flatten dense120 relu dense84 relu dense10"},
    {"fashion-cnn", "1x28x28 conv3x3x64 maxpool2 relu conv3x3x128 maxpool2 relu flatten dense256 relu dense10"},
};

static int mnistcu__is_digit(char c) { return c >= '0' && c <= '9'; }
static int mnistcu__is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ','; }

/* A decimal number filling [s, end): digits, an optional fraction and exponent, a sign. */
static float mnistcu__parse_float_text(const char *s, const char *end, int *ok)
{
    double mant = 0.0, v;
    int neg = 0, digits = 0, frac = 0, e = 0, eneg = 0;
    const char *p = s;
    *ok = 0;
    if (p < end && (*p == '-' || *p == '+')) neg = *p++ == '-';
    for (; p < end && mnistcu__is_digit(*p); ++p, ++digits) mant = mant * 10.0 + (*p - '0');
    if (p < end && *p == '.')
        for (++p; p < end && mnistcu__is_digit(*p); ++p, ++digits, ++frac) mant = mant * 10.0 + (*p - '0');
    if (!digits) return 0.0f;
    if (p < end && (*p == 'e' || *p == 'E')) {
        ++p;
        if (p < end && (*p == '-' || *p == '+')) eneg = *p++ == '-';
        if (p == end || !mnistcu__is_digit(*p)) return 0.0f;
        for (; p < end && mnistcu__is_digit(*p); ++p)
            if (e < 1000) e = e * 10 + (*p - '0');
    }
    if (p != end) return 0.0f;
    e = (eneg ? -e : e) - frac;
    v = e < 0 ? mant / pow(10.0, -e) : mant * pow(10.0, e);
    if (!(v <= FLT_MAX)) return 0.0f;
    *ok = 1;
    return (float)(neg ? -v : v);
}

/* A whole non-negative integer in [s, end), at most 2^24. */
static int mnistcu__parse_int_text(const char *s, const char *end, int *out)
{
    long v = 0;
    if (s == end) return 0;
    for (; s < end; ++s) {
        if (!mnistcu__is_digit(*s)) return 0;
        v = v * 10 + (*s - '0');
        if (v > (long)MNISTCU__MAX_FEATURES) return 0;
    }
    *out = (int)v;
    return 1;
}

/* Up to three integers joined by 'x' in [s, end); returns how many, 0 on a bad form. */
static int mnistcu__parse_dims(const char *s, const char *end, int *v)
{
    int n = 0;
    while (n < 3) {
        const char *x = s;
        while (x < end && *x != 'x') ++x;
        if (!mnistcu__parse_int_text(s, x, &v[n++])) return 0;
        if (x == end) return n;
        s = x + 1;
    }
    return 0;
}

static mnistcu_result mnistcu__spec_fail(mnistcu_ctx *ctx, const char *spec, const char *tok, size_t len, int index,
                                         const char *fmt, ...) MNISTCU__PRINTF(6, 7);
static mnistcu_result mnistcu__spec_fail(mnistcu_ctx *ctx, const char *spec, const char *tok, size_t len, int index,
                                         const char *fmt, ...)
{
    char msg[MNISTCU__ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model spec: token %d \"%.*s\" at position %d: %s", index,
                         (int)MNISTCU__MIN(len, (size_t)64), tok, (int)(tok - spec), msg);
}

/* Zeroes the fields of a layer desc that hold their default. */
static void mnistcu__layer_normalize(mnistcu_layer_desc *d)
{
    if (d->kind == MNISTCU_LAYER_CONV2D) {
        if (d->kernel_w == d->kernel_h) d->kernel_w = 0;
        if (d->stride == 1) d->stride = 0;
    } else if (d->kind == MNISTCU_LAYER_MAXPOOL2D || d->kind == MNISTCU_LAYER_AVGPOOL2D) {
        int kh = d->kernel_h ? d->kernel_h : 2, kw = d->kernel_w ? d->kernel_w : kh;
        if (kh == kw && d->stride == kh) d->stride = 0;
        d->kernel_w = kw == kh ? 0 : kw;
        d->kernel_h = kh == 2 && d->kernel_w == 0 ? 0 : kh;
    } else if (d->kind == MNISTCU_LAYER_BATCHNORM) {
        if (d->eps == 1e-5f) d->eps = 0.0f;
        if (d->momentum == 0.1f) d->momentum = 0.0f;
    } else if (d->kind == MNISTCU_LAYER_DROPOUT) {
        if (d->p == 0.5f) d->p = 0.0f;
    } else if (d->kind == MNISTCU_LAYER_LEAKY_RELU) {
        if (d->slope == 0.01f) d->slope = 0.0f;
    }
}

/* One layer token [tok, tok+len) into *d. */
static mnistcu_result mnistcu__parse_layer(mnistcu_ctx *ctx, const char *spec, const char *tok, size_t len, int index,
                                           mnistcu_layer_desc *d)
{
    const char *end = tok + len, *args, *aend, *o;
    int k, best = 0, v[3], nd, ok;
    size_t blen = 0;
    memset(d, 0, sizeof *d);
    for (k = 1; k < MNISTCU_LAYER_KIND_COUNT; ++k) {
        size_t kl = strlen(mnistcu__kind_keywords[k]);
        if (kl <= len && kl > blen && memcmp(tok, mnistcu__kind_keywords[k], kl) == 0) {
            best = k;
            blen = kl;
        }
    }
    if (!best)
        return mnistcu__spec_fail(ctx, spec, tok, len, index,
                                  "unknown layer (dense, conv, maxpool, avgpool, batchnorm, dropout, flatten, relu, "
                                  "leaky_relu, sigmoid, tanh, softmax)");
    d->kind = (mnistcu_layer_kind)best;
    args = tok + blen;
    for (aend = args; aend < end && *aend != ':'; ++aend) {}
    switch (d->kind) {
    case MNISTCU_LAYER_DENSE:
        if (!mnistcu__parse_int_text(args, aend, &d->units) || d->units < 1)
            return mnistcu__spec_fail(ctx, spec, tok, len, index, "expected denseN with N >= 1, e.g. dense128");
        break;
    case MNISTCU_LAYER_CONV2D:
        if (mnistcu__parse_dims(args, aend, v) != 3 || v[0] < 1 || v[1] < 1 || v[2] < 1)
            return mnistcu__spec_fail(ctx, spec, tok, len, index,
                                      "expected convKHxKWxN (kernel height, width, output channels), e.g. conv5x5x6");
        d->kernel_h = v[0];
        d->kernel_w = v[1];
        d->units = v[2];
        break;
    case MNISTCU_LAYER_MAXPOOL2D:
    case MNISTCU_LAYER_AVGPOOL2D:
        if (args == aend) break;
        nd = mnistcu__parse_dims(args, aend, v);
        if (nd < 1 || nd > 2 || v[0] < 1 || (nd == 2 && v[1] < 1))
            return mnistcu__spec_fail(ctx, spec, tok, len, index, "expected %sK or %sKHxKW, e.g. %s2",
                                      mnistcu__kind_keywords[best], mnistcu__kind_keywords[best],
                                      mnistcu__kind_keywords[best]);
        d->kernel_h = v[0];
        d->kernel_w = nd == 2 ? v[1] : 0;
        break;
    case MNISTCU_LAYER_DROPOUT:
    case MNISTCU_LAYER_LEAKY_RELU:
        if (args == aend) break;
        {
            float f = mnistcu__parse_float_text(args, aend, &ok);
            if (!ok || (d->kind == MNISTCU_LAYER_DROPOUT && !(f > 0.0f && f < 1.0f)) ||
                (d->kind == MNISTCU_LAYER_LEAKY_RELU && f == 0.0f)) /* 0 (or -0) would read as the default */
                return mnistcu__spec_fail(ctx, spec, tok, len, index, "%s",
                                          d->kind == MNISTCU_LAYER_DROPOUT
                                              ? "expected dropoutP with 0 < P < 1, e.g. dropout0.25"
                                              : "expected leaky_reluS with S a non-zero number, e.g. leaky_relu0.1 "
                                                "(a slope of 0 is relu)");
            if (d->kind == MNISTCU_LAYER_DROPOUT) d->p = f;
            else d->slope = f;
        }
        break;
    default:
        if (args != aend) return mnistcu__spec_fail(ctx, spec, tok, len, index, "%s takes no number", mnistcu__kind_keywords[best]);
    }
    for (o = aend; o < end;) {
        const char *oend = o + 1, *eq;
        int iv = 0;
        float fv = 0.0f;
        for (; oend < end && *oend != ':'; ++oend) {}
        for (eq = o + 1; eq < oend && *eq != '='; ++eq) {}
        if (eq == oend || eq == o + 1)
            return mnistcu__spec_fail(ctx, spec, tok, len, index, "expected an option key=value after ':'");
#define MNISTCU__KEY(name) ((size_t)(eq - o - 1) == strlen(name) && memcmp(o + 1, name, strlen(name)) == 0)
        if ((d->kind == MNISTCU_LAYER_CONV2D || d->kind == MNISTCU_LAYER_MAXPOOL2D ||
             d->kind == MNISTCU_LAYER_AVGPOOL2D) && MNISTCU__KEY("s")) {
            if (!mnistcu__parse_int_text(eq + 1, oend, &iv) || iv < 1)
                return mnistcu__spec_fail(ctx, spec, tok, len, index, "stride s= needs an integer >= 1");
            d->stride = iv;
        } else if (d->kind == MNISTCU_LAYER_CONV2D && MNISTCU__KEY("p")) {
            if (!mnistcu__parse_int_text(eq + 1, oend, &iv))
                return mnistcu__spec_fail(ctx, spec, tok, len, index, "padding p= needs an integer >= 0");
            d->padding = iv;
        } else if ((d->kind == MNISTCU_LAYER_CONV2D || d->kind == MNISTCU_LAYER_DENSE) && MNISTCU__KEY("init")) {
            int k2;
            for (k2 = 1; k2 <= (int)MNISTCU_INIT_HE_NORMAL; ++k2)
                if ((size_t)(oend - eq - 1) == strlen(mnistcu__init_names[k2]) &&
                    memcmp(eq + 1, mnistcu__init_names[k2], strlen(mnistcu__init_names[k2])) == 0)
                    break;
            if (k2 > (int)MNISTCU_INIT_HE_NORMAL)
                return mnistcu__spec_fail(ctx, spec, tok, len, index,
                                          "init= takes torch, he, he_normal, xavier or xavier_normal");
            d->init = (mnistcu_init)k2;
        } else if ((d->kind == MNISTCU_LAYER_CONV2D || d->kind == MNISTCU_LAYER_DENSE) && MNISTCU__KEY("bias")) {
            if (!mnistcu__parse_int_text(eq + 1, oend, &iv) || iv > 1)
                return mnistcu__spec_fail(ctx, spec, tok, len, index, "bias= takes 0 or 1");
            d->no_bias = !iv;
        } else if (d->kind == MNISTCU_LAYER_BATCHNORM && (MNISTCU__KEY("eps") || MNISTCU__KEY("momentum"))) {
            fv = mnistcu__parse_float_text(eq + 1, oend, &ok);
            if (!ok || !(fv > 0.0f))
                return mnistcu__spec_fail(ctx, spec, tok, len, index, "eps= and momentum= take a positive number");
            if (MNISTCU__KEY("eps")) d->eps = fv;
            else d->momentum = fv;
        } else {
            return mnistcu__spec_fail(ctx, spec, tok, len, index, "option \"%.*s\" does not apply to %s",
                                      (int)(eq - o - 1), o + 1, mnistcu__kind_keywords[best]);
        }
#undef MNISTCU__KEY
        o = oend;
    }
    mnistcu__layer_normalize(d);
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_model_desc_parse(mnistcu_ctx *ctx, const char *spec, mnistcu_model_desc *out)
{
    const char *text, *p, *tok;
    size_t len, k;
    int index = 0, nl = 0, v[3], nd, only_widths = 1, has_dash = 0;
    mnistcu_result r;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!spec || !out) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_desc_parse: NULL argument");
    memset(out, 0, sizeof *out);
    text = spec;
    while (mnistcu__is_space(*text)) ++text;
    len = strlen(text);
    while (len && mnistcu__is_space(text[len - 1])) --len;
    for (k = 0; k < sizeof mnistcu__presets / sizeof mnistcu__presets[0]; ++k)
        if (len == strlen(mnistcu__presets[k][0]) && memcmp(text, mnistcu__presets[k][0], len) == 0)
            return mnistcu_model_desc_parse(ctx, mnistcu__presets[k][1], out);
    for (k = 0; k < len; ++k) {
        if (text[k] == '-') has_dash = 1;
        else if (!mnistcu__is_digit(text[k])) only_widths = 0;
    }
    if (len && only_widths && has_dash) { /* MLP widths: dense layers with ReLU between */
        char widths[256];
        if (len >= sizeof widths)
            return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model spec: widths \"%.40s...\" too long", text);
        memcpy(widths, text, len);
        widths[len] = 0;
        if ((r = mnistcu__parse_widths(ctx, widths, out)) || (r = mnistcu__check_sizes(ctx, out))) return r;
        mnistcu__desc_expand(out, out);
        memset(out->sizes, 0, sizeof out->sizes);
        out->hidden_act = MNISTCU_ACT_DEFAULT;
        return MNISTCU_OK;
    }
    for (p = text; p < text + len;) {
        while (p < text + len && mnistcu__is_space(*p)) ++p;
        tok = p;
        while (p < text + len && !mnistcu__is_space(*p)) ++p;
        if (p == tok) break;
        ++index;
        if (index == 1) {
            nd = mnistcu__parse_dims(tok, p, v);
            if (nd == 1 && v[0] >= 1) {
                out->input_c = out->input_h = 1;
                out->input_w = v[0];
            } else if (nd == 3 && v[0] >= 1 && v[1] >= 1 && v[2] >= 1) {
                out->input_c = v[0];
                out->input_h = v[1];
                out->input_w = v[2];
            } else {
                return mnistcu__spec_fail(ctx, spec, tok, (size_t)(p - tok), index,
                                          "a spec starts with the shape of one sample, CxHxW or N (e.g. 1x28x28 "
                                          "or 784), or is a preset (lenet5, fashion-cnn) or widths (784-128-10)");
            }
            continue;
        }
        if (nl == MNISTCU_MAX_MODEL_LAYERS)
            return mnistcu__spec_fail(ctx, spec, tok, (size_t)(p - tok), index, "more than %d layers",
                                      MNISTCU_MAX_MODEL_LAYERS);
        if ((r = mnistcu__parse_layer(ctx, spec, tok, (size_t)(p - tok), index, &out->layers[nl++]))) return r;
    }
    if (index == 0) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model spec: empty");
    if (nl == 0)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model spec \"%.*s\": no layers after the input shape",
                             (int)MNISTCU__MIN(len, (size_t)64), text);
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_model_desc_spec(const mnistcu_model_desc *d, char *buf, size_t size)
{
    mnistcu_model_desc e;
    size_t len = 0;
    int i, ok = 1, c, h;
    if (!buf || !size) return MNISTCU_ERR_INVALID_ARGUMENT;
    buf[0] = 0;
    if (!d) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (d->layers[0].kind == MNISTCU_LAYER_NONE) {
        int n = 0;
        while (n <= MNISTCU_MAX_LAYERS && d->sizes[n] != 0) ++n;
        if (n < 2) return MNISTCU_ERR_INVALID_ARGUMENT;
        mnistcu__desc_expand(d, &e);
        d = &e;
    }
    c = d->input_c ? d->input_c : 1;
    h = d->input_h ? d->input_h : 1;
    ok &= c == 1 && h == 1 ? mnistcu__cat(buf, size, &len, "%d", d->input_w)
                           : mnistcu__cat(buf, size, &len, "%dx%dx%d", c, h, d->input_w);
    for (i = 0; i < MNISTCU_MAX_MODEL_LAYERS && d->layers[i].kind != MNISTCU_LAYER_NONE && ok; ++i) {
        char tok[64];
        ok &= mnistcu__layer_token(&d->layers[i], tok, sizeof tok);
        ok &= mnistcu__cat(buf, size, &len, " %s", tok);
    }
    if (!ok) {
        buf[0] = 0;
        return MNISTCU_ERR_INVALID_ARGUMENT;
    }
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_model_spec(const mnistcu_model *m, char *buf, size_t size)
{
    if (!m) {
        if (buf && size) buf[0] = 0;
        return MNISTCU_ERR_INVALID_ARGUMENT;
    }
    return mnistcu_model_desc_spec(&m->desc, buf, size);
}

MNISTCU_DEF mnistcu_result mnistcu_model_create_spec(mnistcu_ctx *ctx, const char *spec, mnistcu_model **out)
{
    mnistcu_model_desc d;
    mnistcu_result r;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_create_spec: out is NULL");
    *out = NULL;
    if ((r = mnistcu_model_desc_parse(ctx, spec, &d))) return r;
    return mnistcu_model_create(ctx, &d, out);
}

/* >>model_api ------------------------------------------------------------------------ */
MNISTCU_DEF void mnistcu_model_info_get(const mnistcu_model *m, mnistcu_model_info *info)
{
    int i, n = 0;
    if (!info) return;
    memset(info, 0, sizeof *info);
    if (!m) return;
    info->sizes[0] = (int)m->inputs;
    for (i = 0; i < m->num_layers; ++i)
        if (m->layers[i].d.kind == MNISTCU_LAYER_DENSE) {
            if (n < MNISTCU_MAX_LAYERS) info->sizes[n + 1] = m->layers[i].oc;
            ++n;
        }
    info->num_layers = n;
    info->num_params = m->num_params;
    info->inputs = m->inputs;
    info->classes = m->classes;
    info->hidden_act = m->hidden_act;
    info->device = m->device;
    info->layer_count = m->num_layers;
    info->input_shape[0] = m->desc.input_c;
    info->input_shape[1] = m->desc.input_h;
    info->input_shape[2] = m->desc.input_w;
    info->num_buffers = m->num_buffers;
    info->loss = m->loss;
    info->has_norm = m->has_norm;
    info->norm_u8 = m->norm_u8;
    info->norm_scale = m->norm_scale;
    info->norm_shift = m->norm_shift;
}

MNISTCU_DEF mnistcu_result mnistcu_model_layer_info(const mnistcu_model *m, int layer, mnistcu_layer_info *info)
{
    const mnistcu__layer *L;
    if (info) memset(info, 0, sizeof *info);
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!info || layer < 0 || layer >= m->num_layers)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_layer_info: layer %d of %d", layer,
                             m->num_layers);
    L = &m->layers[layer];
    info->desc = L->d;
    info->in_shape[0] = L->c;
    info->in_shape[1] = L->h;
    info->in_shape[2] = L->w;
    info->out_shape[0] = L->oc;
    info->out_shape[1] = L->oh;
    info->out_shape[2] = L->ow;
    info->num_params = L->nw + L->nb;
    info->num_buffers = L->d.kind == MNISTCU_LAYER_BATCHNORM ? 2 * (size_t)L->c : 0;
    info->keyword = mnistcu__kind_keywords[L->d.kind];
    info->torch_name = L->d.kind == MNISTCU_LAYER_BATCHNORM ? (mnistcu__is_flat(L) ? "BatchNorm1d" : "BatchNorm2d")
                                                           : mnistcu__kind_torch[L->d.kind];
    mnistcu__layer_token(&L->d, info->spec, sizeof info->spec);
    return MNISTCU_OK;
}

MNISTCU_DEF void mnistcu_model_set_mode(mnistcu_model *m, mnistcu_mode mode)
{
    if (m) m->mode = mode == MNISTCU_MODE_EVAL ? MNISTCU_MODE_EVAL : MNISTCU_MODE_TRAIN;
}
MNISTCU_DEF mnistcu_mode mnistcu_model_mode(const mnistcu_model *m) { return m ? m->mode : MNISTCU_MODE_TRAIN; }
MNISTCU_DEF size_t mnistcu_model_num_params(const mnistcu_model *m) { return m ? m->num_params : 0; }
MNISTCU_DEF uint64_t mnistcu_model_steps(const mnistcu_model *m) { return m ? m->steps : 0; }
MNISTCU_DEF int mnistcu_model_num_tensors(const mnistcu_model *m) { return m ? m->num_tensors : 0; }

MNISTCU_DEF mnistcu_result mnistcu_model_tensor_info(const mnistcu_model *m, int i, mnistcu_tensor_info *info)
{
    const mnistcu__tensor *t;
    int k;
    if (info) memset(info, 0, sizeof *info);
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!info || i < 0 || i >= m->num_tensors)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_tensor_info: tensor %d of %d", i,
                             m->num_tensors);
    t = &m->tensors[i];
    memcpy(info->name, t->name, sizeof info->name);
    info->layer = t->layer;
    info->ndim = t->ndim;
    for (k = 0; k < 4; ++k) info->shape[k] = t->shape[k];
    info->count = t->count;
    info->is_buffer = t->arena != 0;
    info->is_int = t->arena == 2;
    return MNISTCU_OK;
}

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

static const mnistcu__tensor *mnistcu__find_tensor(const mnistcu_model *m, const char *name, const float *array,
                                                   size_t count, const char *what)
{
    int i;
    if (!name || !array) {
        mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: NULL name or array", what);
        return NULL;
    }
    for (i = 0; i < m->num_tensors; ++i)
        if (strcmp(m->tensors[i].name, name) == 0) {
            if (m->tensors[i].count != count) {
                mnistcu__fail(m->ctx, MNISTCU_ERR_SHAPE, "%s: \"%s\" has %lu elements, %lu given", what, name,
                              (unsigned long)m->tensors[i].count, (unsigned long)count);
                return NULL;
            }
            return &m->tensors[i];
        }
    mnistcu__fail(m->ctx, MNISTCU_ERR_NOT_FOUND, "%s: the model has no tensor \"%.64s\"", what, name);
    return NULL;
}

static mnistcu_result mnistcu__tensor_io(mnistcu_model *m, const char *name, float *array, size_t count, int set,
                                         int grad, const char *what)
{
    const mnistcu__tensor *t;
    float *base;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    t = mnistcu__find_tensor(m, name, array, count, what);
    if (!t) return m->ctx->last_result;
    if (t->arena == 2) {
        mnistcu__layer *L = &m->layers[t->layer];
        if (grad) return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: \"%s\" is not trained", what, name);
        if (!set) {
            array[0] = (float)L->batches;
            return MNISTCU_OK;
        }
        if (!(array[0] >= 0.0f && array[0] <= 16777216.0f) || array[0] != floorf(array[0]))
            return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: \"%s\" must be a whole number in 0..2^24",
                                 what, name);
        L->batches = (int64_t)array[0];
        return MNISTCU_OK;
    }
    if (grad && t->arena != 0)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: \"%s\" is not trained", what, name);
    base = grad ? m->grads : t->arena == 0 ? m->params : m->buffers;
    return set ? mnistcu__model_copy(m, base + t->offset, array, count * sizeof(float), 1)
               : mnistcu__model_copy(m, array, base + t->offset, count * sizeof(float), 0);
}

MNISTCU_DEF mnistcu_result mnistcu_model_get_tensor(const mnistcu_model *m, const char *name, float *dst, size_t count)
{
    return mnistcu__tensor_io((mnistcu_model *)m, name, dst, count, 0, 0, "model_get_tensor");
}
MNISTCU_DEF mnistcu_result mnistcu_model_set_tensor(mnistcu_model *m, const char *name, const float *src, size_t count)
{
    return mnistcu__tensor_io(m, name, (float *)src, count, 1, 0, "model_set_tensor");
}
MNISTCU_DEF mnistcu_result mnistcu_model_get_tensor_grad(const mnistcu_model *m, const char *name, float *dst,
                                                         size_t count)
{
    return mnistcu__tensor_io((mnistcu_model *)m, name, dst, count, 0, 1, "model_get_tensor_grad");
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

/* ---- the steps of a training step: each walks the layers with the model's column of the table -- */

/* input holds x [B][inputs]: fills every layer's output, the logits last. */
static mnistcu_result mnistcu__forward(mnistcu_model *m, size_t B)
{
    mnistcu_result r;
    int i;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA && (r = mnistcu__cuda_alive(m->ctx))) return r;
#endif
    for (i = 0; i < m->num_layers; ++i) {
        mnistcu__layer *L = &m->layers[i];
        if (L->passthrough) continue;
        if ((r = mnistcu__kinds[L->d.kind]->forward[m->backend](m, L, B))) return r;
    }
    return MNISTCU_OK;
}

/* Loss of the logits against labels: sample_loss, pred, and (with_grad) dL/dlogits of the mean loss in dbuf[0]. */
static mnistcu_result mnistcu__loss(mnistcu_model *m, size_t B, int with_grad)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_loss(m, B, with_grad);
#endif
    mnistcu__cpu_loss(m->ctx, &m->lossp, m->logits, m->labels, m->batch_targets ? m->targets : NULL, B, m->classes,
                      m->lossp.sum ? 1.0f : 1.0f / (float)B, with_grad ? m->dbuf[0] : NULL, m->sample_loss, m->pred);
    return MNISTCU_OK;
}

/* cur holds the output gradient of layer last: fills the gradient arena from there down. */
static mnistcu_result mnistcu__backward_from(mnistcu_model *m, size_t B, int last, float *cur)
{
    mnistcu_result r;
    int i;
    for (i = last; i >= 0; --i) {
        mnistcu__layer *L = &m->layers[i];
        float *next;
        if (L->passthrough) continue;
        if (!L->need_dx && L->nw + L->nb == 0) break; /* nothing at or before it is trained */
        next = L->need_dx ? (cur == m->dbuf[0] ? m->dbuf[1] : m->dbuf[0]) : NULL;
        if ((r = mnistcu__kinds[L->d.kind]->backward[m->backend](m, L, B, cur, next))) return r;
        if (m->dy_kept) { /* next unused: the layer before takes cur (a max pool whose batch norm routes it) */
            m->dy_kept = 0;
            continue;
        }
        if (!next) break;
        cur = next;
    }
    return MNISTCU_OK;
}

/* dbuf[0] holds dL/dlogits: fills the gradient arena, last layer first. */
static mnistcu_result mnistcu__backward(mnistcu_model *m, size_t B)
{
#ifdef __CUDACC__
    mnistcu_result r;
    if (m->device == MNISTCU_DEVICE_CUDA && (r = mnistcu__cuda_alive(m->ctx))) return r;
#endif
    return mnistcu__backward_from(m, B, m->num_layers - 1, m->dbuf[0]);
}

/* n floats on the model's device (the optimizer state, the divergence check's
   and early stopping's copies of the weights); what names them in messages. */
static mnistcu_result mnistcu__model_floats(mnistcu_model *m, float **p, size_t n, const char *what)
{
    *p = NULL;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_malloc(m->ctx, (void **)p, n * sizeof(float), what);
#endif
    *p = (float *)mnistcu__alloc(m->ctx, n * sizeof(float));
    if (!*p)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory for %llu floats of %s", MNISTCU__ULL(n),
                             what);
    return MNISTCU_OK;
}

static void mnistcu__model_floats_free(mnistcu_model *m, float *p)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) {
        mnistcu__cuda_free(m->ctx, p);
        return;
    }
#endif
    mnistcu__free(m->ctx, p);
}

static mnistcu_result mnistcu__state_fill(mnistcu_model *m, float *p, size_t n, float v)
{
    size_t i;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_fill(m, p, n, v);
#endif
    (void)m;
    for (i = 0; i < n; ++i) p[i] = v;
    return MNISTCU_OK;
}

/* The learning rate an optimizer gets when none is given: PyTorch's, except SGD's 0.1. */
static float mnistcu__default_lr(mnistcu_optim kind)
{
    switch (kind) {
    case MNISTCU_OPTIM_ADAM:
    case MNISTCU_OPTIM_ADAMW: return 0.001f;
    case MNISTCU_OPTIM_RMSPROP:
    case MNISTCU_OPTIM_ADAGRAD: return 0.01f;
    default: return 0.1f;
    }
}

static int mnistcu__in(float v, float lo, float hi) { return v >= lo && v <= hi; }

/* Defaults filled in and every field checked. */
static mnistcu_result mnistcu__resolve_optim(mnistcu_ctx *ctx, const mnistcu_optim_desc *in, mnistcu_optim_desc *o)
{
    memset(o, 0, sizeof *o);
    if (in) *o = *in;
    if (o->kind == MNISTCU_OPTIM_DEFAULT) o->kind = MNISTCU_OPTIM_SGD;
    if ((unsigned)o->kind > MNISTCU_OPTIM_ADAGRAD)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "optimizer kind %d unknown", (int)o->kind);
    if (o->learning_rate == 0.0f) o->learning_rate = mnistcu__default_lr(o->kind);
    if (o->beta1 == 0.0f) o->beta1 = 0.9f;
    if (o->beta2 == 0.0f) o->beta2 = 0.999f;
    if (o->eps == 0.0f) o->eps = o->kind == MNISTCU_OPTIM_ADAGRAD ? 1e-10f : 1e-8f;
    if (o->alpha == 0.0f) o->alpha = 0.99f;
    if (!(o->learning_rate > 0.0f && o->learning_rate < FLT_MAX))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "learning rate %g must be positive and finite",
                             (double)o->learning_rate);
    if (!(o->momentum >= 0.0f && o->momentum < 1.0f))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "momentum %g not in [0, 1)", (double)o->momentum);
    if (o->momentum > 0.0f && o->kind != MNISTCU_OPTIM_SGD && o->kind != MNISTCU_OPTIM_RMSPROP)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "momentum is an option of SGD and RMSprop only");
    if (o->nesterov && (o->kind != MNISTCU_OPTIM_SGD || o->momentum == 0.0f || o->dampening != 0.0f))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "Nesterov momentum needs SGD with momentum > 0 and no "
                                                                 "dampening");
    if (!mnistcu__in(o->dampening, 0.0f, 1.0f))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "dampening %g not in [0, 1]", (double)o->dampening);
    if (!(o->weight_decay >= 0.0f && o->weight_decay < FLT_MAX) || !(o->l2 >= 0.0f && o->l2 < FLT_MAX) ||
        !(o->clip_norm >= 0.0f && o->clip_norm < FLT_MAX))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "weight decay %g, l2 %g and clip_norm %g must be >= 0 and finite", (double)o->weight_decay,
                             (double)o->l2, (double)o->clip_norm);
    if (!(o->beta1 > 0.0f && o->beta1 < 1.0f) || !(o->beta2 > 0.0f && o->beta2 < 1.0f))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "betas %g, %g not in (0, 1)", (double)o->beta1,
                             (double)o->beta2);
    if (!(o->eps > 0.0f && o->eps < FLT_MAX) || !(o->alpha > 0.0f && o->alpha < 1.0f) ||
        !(o->lr_decay >= 0.0f && o->lr_decay < FLT_MAX) ||
        !(o->initial_accumulator_value >= 0.0f && o->initial_accumulator_value < FLT_MAX))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "eps %g (> 0), alpha %g (in (0, 1)), lr_decay %g or initial_accumulator_value %g (>= 0) "
                             "out of range", (double)o->eps, (double)o->alpha, (double)o->lr_decay,
                             (double)o->initial_accumulator_value);
    if ((o->amsgrad && o->kind != MNISTCU_OPTIM_ADAM && o->kind != MNISTCU_OPTIM_ADAMW) ||
        (o->centered && o->kind != MNISTCU_OPTIM_RMSPROP))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "amsgrad is an option of Adam and AdamW, centered of "
                                                                 "RMSprop");
    return MNISTCU_OK;
}

/* Arrays of num_params floats of state the optimizer keeps (see >>cpu_ops). */
static int mnistcu__opt_slots(const mnistcu_optim_desc *o)
{
    switch (o->kind) {
    case MNISTCU_OPTIM_ADAM:
    case MNISTCU_OPTIM_ADAMW: return 2 + (o->amsgrad != 0);
    case MNISTCU_OPTIM_RMSPROP: return 1 + (o->momentum > 0.0f) + (o->centered != 0);
    case MNISTCU_OPTIM_ADAGRAD: return 1;
    default: return o->momentum > 0.0f;
    }
}

/* What the state's layout and meaning depend on: a change starts a new state. */
static int mnistcu__opt_sig(const mnistcu_optim_desc *o)
{
    return 1 + (int)o->kind * 8 + (o->momentum > 0.0f) + 2 * (o->amsgrad != 0) + 4 * (o->centered != 0);
}

/* The dense and conv weights, which the l2 penalty covers. */
static void mnistcu__weight_ranges(const mnistcu_model *m, mnistcu__ranges *rg)
{
    int i;
    rg->count = 0;
    for (i = 0; i < m->num_layers; ++i) {
        const mnistcu__layer *L = &m->layers[i];
        if ((L->d.kind == MNISTCU_LAYER_DENSE || L->d.kind == MNISTCU_LAYER_CONV2D) && L->nw) {
            rg->off[rg->count] = L->wo;
            rg->len[rg->count] = L->nw;
            rg->count++;
        }
    }
}

/* l2 and clipping on the CPU: the gradient arena in place; returns the clipping factor (1: none). */
static float mnistcu__cpu_grad_prep(mnistcu_model *m, const mnistcu_optim_desc *o)
{
    size_t i, j;
    double sum = 0.0, norm;
    float coef;
    if (o->l2 != 0.0f) {
        mnistcu__ranges rg;
        int k;
        mnistcu__weight_ranges(m, &rg);
        for (k = 0; k < rg.count; ++k)
            for (j = rg.off[k]; j < rg.off[k] + rg.len[k]; ++j) m->grads[j] = m->grads[j] + o->l2 * (2.0f * m->params[j]);
    }
    if (o->clip_norm == 0.0f) return 1.0f;
    for (i = 0; i < m->num_params; ++i) sum += (double)m->grads[i] * (double)m->grads[i];
    norm = sqrt(sum);
    coef = (float)((double)o->clip_norm / (norm + 1e-6));
    return coef < 1.0f ? coef : 1.0f;
}

/* The optimizer state for o: kept, or (first step, or another layout) made anew. */
static mnistcu_result mnistcu__opt_state(mnistcu_model *m, const mnistcu_optim_desc *o)
{
    size_t floats;
    float init = o->kind == MNISTCU_OPTIM_ADAGRAD ? o->initial_accumulator_value : 0.0f;
    mnistcu_result r;
    if (mnistcu__opt_sig(o) == m->state_sig) return MNISTCU_OK;
    if (!mnistcu__mul((size_t)mnistcu__opt_slots(o), m->num_params, &floats))
        return mnistcu__fail(m->ctx, MNISTCU_ERR_OVERFLOW, "optimizer state overflows");
    if (floats != m->state_floats) {
        mnistcu__model_floats_free(m, m->state);
        m->state = NULL;
        m->state_floats = 0;
        m->state_sig = 0;
        if (floats && (r = mnistcu__model_floats(m, &m->state, floats, "optimizer state"))) return r;
        m->state_floats = floats;
    }
    if (floats && (r = mnistcu__state_fill(m, m->state, floats, init))) return r;
    m->state_sig = mnistcu__opt_sig(o);
    m->state_steps = 0;
    return MNISTCU_OK;
}

/* A float as the decimal it was written as (its shortest representation), in
   double: 1 - 0.99f computed from it is the float Python's 1 - 0.99 gives. */
static double mnistcu__decimal(float v)
{
    char buf[32];
    mnistcu__float_text(v, buf, sizeof buf);
    return strtod(buf, NULL);
}

/* mnistcu__decimal(v) for slot i of mm. */
static double mnistcu__memo_decimal(mnistcu__opt_memo *mm, int i, float v)
{
    if (!mm->have[i] || memcmp(&mm->key[i], &v, sizeof v) != 0) {
        mm->val[i] = mnistcu__decimal(v);
        mm->key[i] = v;
        mm->have[i] = 1;
    }
    return mm->val[i];
}

/* The kernel's view of step t (1-based, of this state) of optimizer o over n
   parameters; mm keeps the scalars' decimals between calls. */
static void mnistcu__opt_make(const mnistcu_optim_desc *o, uint64_t step, size_t n, mnistcu__opt *k,
                              mnistcu__opt_memo *mm)
{
    double t = (double)step, b1 = mnistcu__memo_decimal(mm, 0, o->beta1), b2 = mnistcu__memo_decimal(mm, 1, o->beta2);
    double lr = mnistcu__memo_decimal(mm, 2, o->learning_rate);
    memset(k, 0, sizeof *k);
    k->kind = (int)o->kind;
    k->nesterov = o->nesterov;
    k->amsgrad = o->amsgrad;
    k->centered = o->centered;
    k->has_momentum = o->momentum > 0.0f;
    k->first = step == 1;
    k->lr = o->learning_rate;
    k->mu = o->momentum;
    k->damp = o->dampening;
    k->wd = o->weight_decay;
    k->b1 = o->beta1;
    k->b2 = o->beta2;
    k->eps = o->eps;
    k->alpha = o->alpha;
    k->c1 = (float)(1.0 - b1);
    k->c2 = (float)(1.0 - b2);
    k->calpha = (float)(1.0 - mnistcu__memo_decimal(mm, 3, o->alpha));
    k->cdamp = (float)(1.0 - mnistcu__memo_decimal(mm, 4, o->dampening));
    if (o->kind == MNISTCU_OPTIM_ADAM || o->kind == MNISTCU_OPTIM_ADAMW) { /* their bias corrections alone:
        two pow() a step were most of the time the fused kernels' thousand steps' scalars took */
        k->step_size = (float)(lr / (1.0 - pow(b1, t)));
        k->bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    }
    k->clr = (float)(lr / (1.0 + (t - 1.0) * mnistcu__memo_decimal(mm, 5, o->lr_decay)));
    k->decay_mult = (float)(1.0 - lr * mnistcu__memo_decimal(mm, 6, o->weight_decay));
    k->n = n;
}

/* The scalars of `count` steps from step t0 (1-based) at o's rate, as
   mnistcu__opt_make makes each, in ops[count]; returns how many it wrote:
   steps from there on are the last one's. Only `first` (step 1) and the
   bias corrections and Adagrad's decayed rate change with the step; without
   those the scalars are one or two, not an epoch's thousand made and uploaded
   (the fused kernels read step q's as ops[min(q, returned - 1)]). */
#if defined(__GNUC__) || defined(__clang__) /* the CUDA backend's and the tests': unused in a C build */
#define MNISTCU__CUDA_HELPER __attribute__((unused))
#else
#define MNISTCU__CUDA_HELPER
#endif
static MNISTCU__CUDA_HELPER size_t mnistcu__opt_steps(const mnistcu_optim_desc *o, uint64_t t0, size_t count,
                                                      size_t n, mnistcu__opt *ops, mnistcu__opt_memo *mm)
{
    size_t s;
    if (!count) return 0;
    mnistcu__opt_make(o, t0, n, &ops[0], mm);
    if (o->kind != MNISTCU_OPTIM_ADAM && o->kind != MNISTCU_OPTIM_ADAMW && o->lr_decay == 0.0f) {
        if (count == 1 || !ops[0].first) return 1;
        ops[1] = ops[0];
        ops[1].first = 0;
        return 2;
    }
    for (s = 1; s < count; ++s) mnistcu__opt_make(o, t0 + s, n, &ops[s], mm);
    return count;
}

/* A training step's optimizer step, taken where it can be in the weight
   gradients' products (>>cuda_update): on the GPU, for SGD without l2 or
   clipping (each parameter's step then needs its own gradient only), unless
   mnistcu_train_desc.no_fused_update; and only in a step of b samples after
   one of b completed, so that every buffer its products need was made then:
   a backward pass that fails (out of memory) after a layer took its step
   would leave the model half stepped. Makes the state and this step's scalars
   before the backward pass that uses them; mnistcu__update steps the rest. */
static mnistcu_result mnistcu__update_plan(mnistcu_model *m, const mnistcu_optim_desc *o, size_t b)
{
    mnistcu_result r;
    m->upd_on = 0;
    if (m->device != MNISTCU_DEVICE_CUDA || m->upd_off || o->kind != MNISTCU_OPTIM_SGD || o->l2 != 0.0f ||
        o->clip_norm != 0.0f || (b != m->upd_warm[0] && b != m->upd_warm[1]))
        return MNISTCU_OK;
    if ((r = mnistcu__opt_state(m, o))) return r;
    mnistcu__opt_make(o, m->state_steps + 1, m->num_params, &m->upd_opt, &m->opt_memo); /* as mnistcu__update will */
    m->upd_on = 1;
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__update(mnistcu_model *m, const mnistcu_optim_desc *o)
{
    mnistcu__opt k;
    mnistcu_result r;
    m->upd_on = 0;
    if ((r = mnistcu__opt_state(m, o))) return r;
    m->steps++;
    m->state_steps++;
    mnistcu__opt_make(o, m->state_steps, m->num_params, &k, &m->opt_memo);
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_update(m, &k, o);
#endif
    mnistcu__cpu_optim(m->ctx, &k, m->params, m->grads, m->state, mnistcu__cpu_grad_prep(m, o));
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__check_labels(const mnistcu_model *m, const int32_t *labels, size_t n)
{
    size_t i;
    int classes = (int)m->classes;
    for (i = 0; i < n; ++i)
        if (labels[i] < 0 || labels[i] >= classes)
            return mnistcu__fail(m->ctx, MNISTCU_ERR_LABEL_RANGE, "label %ld at index %lu not in 0..%d",
                                 (long)labels[i], (unsigned long)i, classes - 1);
    return MNISTCU_OK;
}

/* labels [n] or targets [n][classes]. */
static mnistcu_result mnistcu__compute_grads(mnistcu_model *m, const float *x, const int32_t *labels,
                                             const float *targets, size_t n, double *loss, const char *what)
{
    mnistcu_result r;
    size_t i, in;
    double sum = 0.0;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!x || (!labels && !targets) || n == 0)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: x, %s and n must be given", what,
                             targets || !labels ? "targets" : "labels");
    if (targets && m->loss == MNISTCU_LOSS_HINGE)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: the hinge loss needs class labels", what);
    if ((labels && (r = mnistcu__check_labels(m, labels, n))) || (r = mnistcu__model_reserve(m, n))) return r;
    in = m->inputs;
    m->batch_targets = targets != NULL;
    if ((r = mnistcu__model_copy(m, m->input, x, n * in * sizeof(float), 1)) ||
        (labels && (r = mnistcu__model_copy(m, m->labels, labels, n * sizeof(int32_t), 1))) ||
        (targets && (r = mnistcu__model_copy(m, m->targets, targets, n * m->classes * sizeof(float), 1))) ||
        (r = mnistcu__forward(m, n)) || (r = mnistcu__loss(m, n, 1)) || (r = mnistcu__backward(m, n)))
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
        *loss = m->lossp.sum ? sum : sum / (double)n;
        if (host != m->sample_loss) mnistcu__free(m->ctx, host);
    }
    return MNISTCU_OK;
}

MNISTCU_DEF mnistcu_result mnistcu_model_compute_grads(mnistcu_model *m, const float *x, const int32_t *labels, size_t n,
                                                       double *loss)
{
    return mnistcu__compute_grads(m, x, labels, NULL, n, loss, "model_compute_grads");
}

MNISTCU_DEF mnistcu_result mnistcu_model_compute_grads_targets(mnistcu_model *m, const float *x, const float *targets,
                                                               size_t n, double *loss)
{
    return mnistcu__compute_grads(m, x, NULL, targets, n, loss, "model_compute_grads_targets");
}

MNISTCU_DEF mnistcu_result mnistcu_model_apply_grads(mnistcu_model *m, const mnistcu_optim_desc *opt)
{
    mnistcu_optim_desc o;
    mnistcu_result r;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if ((r = mnistcu__resolve_optim(m->ctx, opt, &o))) return r;
    return mnistcu__update(m, &o);
}

/* >>safetensors -----------------------------------------------------------------
   Model files in the safetensors format (https://github.com/huggingface/safetensors):
   8 bytes, the little-endian length N of a JSON header; N bytes of header
   (an object: each tensor's name -> {"dtype", "shape", "data_offsets": [begin,
   end]} relative to the data buffer, plus "__metadata__", an object of string
   -> string); then the data buffer, tensors little-endian, row-major, one
   after the other. The header is padded with spaces so that the data starts
   at a multiple of 8.
   Tensors carry the names and layouts torch.nn.Sequential's state_dict gives
   ("0.weight", "3.num_batches_tracked" as I64), so PyTorch loads a weights
   file strictly. The metadata makes a model from the file alone:
     format "mnistcu", format_version "1", kind "weights" or "checkpoint",
     spec (mnistcu_model_spec), input_shape "C,H,W", classes, class_names (a
     JSON array, when known), norm_scale, norm_shift, norm_u8 (when the model
     was trained), loss, label_smoothing, loss_sum, margin, hinge_p,
     library_version.
   A checkpoint adds tensors named "mnistcu.*" and keys "train.*" (see
   >>checkpoint). Reading trusts nothing: the header's length is capped and
   must fit the file, the JSON is parsed strictly (UTF-8, escapes, no duplicate
   keys, integers only where integers belong), every dtype must be known and
   the one the tensor needs, every shape product is overflow-checked against
   its byte range, and the ranges must tile the data buffer exactly: sorted,
   starting at 0, each beginning where the last ended, the last ending at the
   end of the file. Each problem has its own result code. Files are written
   atomically: to PATH.tmp, flushed and synced, then renamed over PATH. */
#ifndef MNISTCU_MODEL_MAX_BYTES
#define MNISTCU_MODEL_MAX_BYTES ((size_t)1 << 30)
#endif
#define MNISTCU__ST_MAX_HEADER ((size_t)100 << 20) /* the safetensors reference's own cap */
#define MNISTCU__ST_MAX_TENSORS 4096
#define MNISTCU__ST_MAX_META 128
#define MNISTCU__ST_NAME 96

static const struct { const char *name; int size; } mnistcu__st_dtypes[] = {
    {"F32", 4}, {"I64", 8}, {"F64", 8}, {"U32", 4}, {"I32", 4}, {"U64", 8}, {"F16", 2}, {"BF16", 2}, {"I16", 2},
    {"U16", 2}, {"I8", 1}, {"U8", 1}, {"BOOL", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}};
enum { MNISTCU__ST_F32 = 0, MNISTCU__ST_I64 = 1, MNISTCU__ST_F64 = 2, MNISTCU__ST_U32 = 3 };

typedef struct mnistcu__st_tensor {
    char name[MNISTCU__ST_NAME];
    int dtype;                 /* index into mnistcu__st_dtypes */
    int ndim;
    uint64_t shape[8];
    uint64_t count;            /* elements */
    uint64_t begin, end;       /* bytes of the data buffer */
} mnistcu__st_tensor;

typedef struct mnistcu__st_file {
    unsigned char *buf;        /* the whole file (owned) */
    size_t size;
    const unsigned char *data; /* the data buffer */
    size_t data_size;
    mnistcu__st_tensor *t;     /* [nt] in header order */
    int nt;
    char *meta_key[MNISTCU__ST_MAX_META], *meta_val[MNISTCU__ST_MAX_META];
    int nmeta;
} mnistcu__st_file;

static int mnistcu__little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* n elements of esize bytes from src (little-endian) to dst in host order, or back. */
static void mnistcu__le_copy(void *dst, const void *src, size_t n, int esize)
{
    size_t i;
    int k;
    if (mnistcu__little_endian()) {
        memcpy(dst, src, n * (size_t)esize);
        return;
    }
    for (i = 0; i < n; ++i)
        for (k = 0; k < esize; ++k)
            ((unsigned char *)dst)[i * esize + k] = ((const unsigned char *)src)[i * esize + esize - 1 - k];
}

static void mnistcu__st_free(mnistcu_ctx *ctx, mnistcu__st_file *f)
{
    int k;
    for (k = 0; k < f->nmeta; ++k) {
        mnistcu__free(ctx, f->meta_key[k]);
        mnistcu__free(ctx, f->meta_val[k]);
    }
    mnistcu__free(ctx, f->t);
    mnistcu__free(ctx, f->buf);
    memset(f, 0, sizeof *f);
}

/* ---- a strict JSON reader for the header ---------------------------------- */
typedef struct mnistcu__json {
    const unsigned char *start, *p, *end;
    mnistcu_ctx *ctx;
    const char *what;     /* the file, for messages */
} mnistcu__json;

static mnistcu_result mnistcu__json_fail(mnistcu__json *j, const char *why)
{
    return mnistcu__fail(j->ctx, MNISTCU_ERR_ST_JSON, "%.300s: safetensors header: %s (at header byte %lu)", j->what,
                         why, (unsigned long)(j->p - j->start));
}

static void mnistcu__json_ws(mnistcu__json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) ++j->p;
}

static int mnistcu__json_eat(mnistcu__json *j, char c)
{
    mnistcu__json_ws(j);
    if (j->p < j->end && *j->p == (unsigned char)c) {
        ++j->p;
        return 1;
    }
    return 0;
}

static int mnistcu__hex4(const unsigned char *p, uint32_t *v)
{
    int k;
    *v = 0;
    for (k = 0; k < 4; ++k) {
        int c = p[k], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v * 16 + (uint32_t)d;
    }
    return 1;
}

/* The n continuation bytes p after lead byte c form a valid UTF-8 sequence. */
static int mnistcu__utf8_tail(unsigned char c, const unsigned char *p, int n)
{
    int k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;      /* overlong */
    else if (c == 0xED) hi = 0x9F; /* surrogates */
    else if (c == 0xF0) lo = 0x90; /* overlong */
    else if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
    for (k = 0; k < n; ++k)
        if (p[k] < (k ? 0x80 : lo) || p[k] > (k ? 0xBF : hi)) return 0;
    return 1;
}

/* s is valid UTF-8 without control characters. */
static int mnistcu__utf8_text(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned char c = *p++;
        int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 1 : (c & 0xF0) == 0xE0 ? 2
              : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 3 : -1;
        int k;
        if (c < 0x20 || c == 0x7F || n < 0) return 0;
        for (k = 0; k < n; ++k)
            if (!p[k]) return 0;
        if (!mnistcu__utf8_tail(c, p, n)) return 0;
        p += n;
    }
    return 1;
}

/* A string into a new allocation (*out, NUL-terminated, at most cap bytes): escapes
   decoded, raw bytes checked to be UTF-8, no control characters, no NUL. */
static mnistcu_result mnistcu__json_string(mnistcu__json *j, char **out, size_t cap)
{
    size_t len = 0;
    char *s;
    *out = NULL;
    mnistcu__json_ws(j);
    if (j->p >= j->end || *j->p != '"') return mnistcu__json_fail(j, "expected a string");
    ++j->p;
    s = (char *)mnistcu__alloc(j->ctx, cap + 1);
    if (!s) return mnistcu__fail(j->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "safetensors header: out of memory");
    for (;;) {
        unsigned char c;
        uint32_t u;
        int n, k;
        if (j->p >= j->end) goto bad_end;
        c = *j->p++;
        if (c == '"') break;
        if (c < 0x20) {
            mnistcu__free(j->ctx, s);
            return mnistcu__json_fail(j, "control character inside a string");
        }
        if (c == '\\') {
            if (j->p >= j->end) goto bad_end;
            c = *j->p++;
            switch (c) {
            case '"': case '\\': case '/': u = c; break;
            case 'b': u = 8; break;
            case 'f': u = 12; break;
            case 'n': u = 10; break;
            case 'r': u = 13; break;
            case 't': u = 9; break;
            case 'u':
                if (j->end - j->p < 4 || !mnistcu__hex4(j->p, &u)) goto bad_escape;
                j->p += 4;
                if (u >= 0xD800 && u <= 0xDBFF) { /* a surrogate pair */
                    uint32_t lo;
                    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || !mnistcu__hex4(j->p + 2, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        goto bad_escape;
                    j->p += 6;
                    u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    goto bad_escape;
                }
                break;
            default: goto bad_escape;
            }
            if (u == 0) goto bad_escape;
            n = u < 0x80 ? 1 : u < 0x800 ? 2 : u < 0x10000 ? 3 : 4;
            if (len + (size_t)n > cap) goto too_long;
            if (n == 1) s[len++] = (char)u;
            else {
                s[len++] = (char)((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | (u >> (6 * (n - 1))));
                for (k = n - 2; k >= 0; --k) s[len++] = (char)(0x80 | ((u >> (6 * k)) & 0x3F));
            }
            continue;
        }
        /* raw UTF-8: the lead byte says how many continuation bytes follow; no overlong forms,
           surrogates or code points above U+10FFFF (RFC 3629) */
        n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 1 : (c & 0xF0) == 0xE0 ? 2
          : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 3 : -1;
        if (n < 0 || j->end - j->p < n || !mnistcu__utf8_tail(c, j->p, n)) {
            mnistcu__free(j->ctx, s);
            return mnistcu__json_fail(j, "a string is not valid UTF-8");
        }
        if (len + 1 + (size_t)n > cap) goto too_long;
        s[len++] = (char)c;
        for (k = 0; k < n; ++k) s[len++] = (char)*j->p++;
    }
    s[len] = 0;
    *out = s;
    return MNISTCU_OK;
bad_end:
    mnistcu__free(j->ctx, s);
    return mnistcu__json_fail(j, "the header ends inside a string");
bad_escape:
    mnistcu__free(j->ctx, s);
    return mnistcu__json_fail(j, "invalid escape in a string");
too_long:
    mnistcu__free(j->ctx, s);
    return mnistcu__json_fail(j, "a string is longer than allowed");
}

/* A non-negative integer (no sign, fraction, exponent or leading zero), at most 2^63 - 1. */
static mnistcu_result mnistcu__json_uint(mnistcu__json *j, uint64_t *v)
{
    const unsigned char *start;
    mnistcu__json_ws(j);
    start = j->p;
    *v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        uint64_t d = (uint64_t)(*j->p - '0');
        if (*v > (UINT64_C(0x7FFFFFFFFFFFFFFF) - d) / 10) return mnistcu__json_fail(j, "an integer is too large");
        *v = *v * 10 + d;
        ++j->p;
    }
    if (j->p == start) return mnistcu__json_fail(j, "expected a non-negative integer");
    if (j->p - start > 1 && *start == '0') return mnistcu__json_fail(j, "an integer has a leading zero");
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return mnistcu__json_fail(j, "expected an integer, found a fraction or exponent");
    return MNISTCU_OK;
}

/* [int, int, ...] into v (at most max values). */
static mnistcu_result mnistcu__json_uints(mnistcu__json *j, uint64_t *v, int max, int *n)
{
    mnistcu_result r;
    *n = 0;
    if (!mnistcu__json_eat(j, '[')) return mnistcu__json_fail(j, "expected an array");
    if (mnistcu__json_eat(j, ']')) return MNISTCU_OK;
    do {
        if (*n == max) return mnistcu__json_fail(j, "an array is longer than allowed");
        if ((r = mnistcu__json_uint(j, &v[(*n)++]))) return r;
    } while (mnistcu__json_eat(j, ','));
    if (!mnistcu__json_eat(j, ']')) return mnistcu__json_fail(j, "expected ',' or ']'");
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__st_tensor_entry(mnistcu__json *j, mnistcu__st_tensor *t)
{
    int seen = 0, k, n;
    mnistcu_result r;
    uint64_t off[3];
    if (!mnistcu__json_eat(j, '{')) return mnistcu__json_fail(j, "a tensor entry is not an object");
    if (mnistcu__json_eat(j, '}')) return mnistcu__json_fail(j, "a tensor entry is empty");
    do {
        char *key = NULL;
        int which;
        if ((r = mnistcu__json_string(j, &key, 32))) return r;
        which = !strcmp(key, "dtype") ? 1 : !strcmp(key, "shape") ? 2 : !strcmp(key, "data_offsets") ? 4 : 0;
        mnistcu__free(j->ctx, key);
        if (!which) return mnistcu__json_fail(j, "a tensor entry has a key other than dtype, shape, data_offsets");
        if (seen & which) return mnistcu__json_fail(j, "a tensor entry repeats a key");
        seen |= which;
        if (!mnistcu__json_eat(j, ':')) return mnistcu__json_fail(j, "expected ':'");
        if (which == 1) {
            char *dt = NULL;
            if ((r = mnistcu__json_string(j, &dt, 16))) return r;
            t->dtype = -1;
            for (k = 0; k < (int)(sizeof mnistcu__st_dtypes / sizeof mnistcu__st_dtypes[0]); ++k)
                if (!strcmp(dt, mnistcu__st_dtypes[k].name)) t->dtype = k;
            if (t->dtype < 0) {
                r = mnistcu__fail(j->ctx, MNISTCU_ERR_ST_DTYPE, "%.300s: tensor \"%s\": unknown dtype \"%.20s\"", j->what,
                                  t->name, dt);
                mnistcu__free(j->ctx, dt);
                return r;
            }
            mnistcu__free(j->ctx, dt);
        } else if (which == 2) {
            if ((r = mnistcu__json_uints(j, t->shape, 8, &t->ndim))) return r;
        } else {
            if ((r = mnistcu__json_uints(j, off, 3, &n))) return r;
            if (n != 2) return mnistcu__json_fail(j, "data_offsets must hold two integers");
            t->begin = off[0];
            t->end = off[1];
        }
    } while (mnistcu__json_eat(j, ','));
    if (!mnistcu__json_eat(j, '}')) return mnistcu__json_fail(j, "expected ',' or '}'");
    if (seen != 7) return mnistcu__json_fail(j, "a tensor entry lacks dtype, shape or data_offsets");
    return MNISTCU_OK;
}

/* Parses and validates a whole file held in f->buf (see the rules above). */
static mnistcu_result mnistcu__st_parse(mnistcu_ctx *ctx, mnistcu__st_file *f, const char *what)
{
    mnistcu__json j;
    uint64_t n = 0;
    mnistcu_result r;
    int k, i, meta_seen = 0;
    if (f->size < 8)
        return mnistcu__fail(ctx, MNISTCU_ERR_ST_HEADER_SIZE, "%.300s: %lu bytes, too short for a safetensors file",
                             what, (unsigned long)f->size);
    for (k = 7; k >= 0; --k) n = (n << 8) | f->buf[k];
    if (n < 2 || n > MNISTCU__ST_MAX_HEADER || n > f->size - 8)
        return mnistcu__fail(ctx, MNISTCU_ERR_ST_HEADER_SIZE,
                             "%.300s: the header length %llu is %s (the file holds %lu bytes after it; at most %lu)", what,
                             MNISTCU__ULL(n), n < 2 ? "too small" : "beyond the file or the cap",
                             (unsigned long)(f->size - 8), (unsigned long)MNISTCU__ST_MAX_HEADER);
    f->data = f->buf + 8 + n;
    f->data_size = f->size - 8 - (size_t)n;
    j.start = j.p = f->buf + 8;
    j.end = f->buf + 8 + n;
    j.ctx = ctx;
    j.what = what;
    f->t = (mnistcu__st_tensor *)mnistcu__calloc(ctx, 16 * sizeof *f->t);
    if (!f->t) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%.300s: out of memory", what);
    if (!mnistcu__json_eat(&j, '{')) return mnistcu__json_fail(&j, "the header is not a JSON object");
    if (!mnistcu__json_eat(&j, '}')) {
        int cap = 16;
        do {
            char *key = NULL;
            if ((r = mnistcu__json_string(&j, &key, MNISTCU__ST_NAME - 1))) return r;
            if (!mnistcu__json_eat(&j, ':')) {
                mnistcu__free(ctx, key);
                return mnistcu__json_fail(&j, "expected ':'");
            }
            if (!strcmp(key, "__metadata__")) {
                mnistcu__free(ctx, key);
                if (meta_seen++) return mnistcu__json_fail(&j, "__metadata__ appears twice");
                if (!mnistcu__json_eat(&j, '{')) return mnistcu__json_fail(&j, "__metadata__ is not an object");
                if (mnistcu__json_eat(&j, '}')) continue;
                do {
                    if (f->nmeta == MNISTCU__ST_MAX_META) return mnistcu__json_fail(&j, "too many metadata keys");
                    if ((r = mnistcu__json_string(&j, &f->meta_key[f->nmeta], 63))) return r;
                    f->nmeta++;
                    for (i = 0; i + 1 < f->nmeta; ++i)
                        if (!strcmp(f->meta_key[i], f->meta_key[f->nmeta - 1]))
                            return mnistcu__json_fail(&j, "a metadata key appears twice");
                    if (!mnistcu__json_eat(&j, ':')) return mnistcu__json_fail(&j, "expected ':'");
                    if ((r = mnistcu__json_string(&j, &f->meta_val[f->nmeta - 1], 65536))) {
                        if (r == MNISTCU_ERR_ST_JSON)
                            return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA,
                                                 "%.300s: metadata \"%s\": values must be strings (%s)", what,
                                                 f->meta_key[f->nmeta - 1], mnistcu_ctx_error(ctx));
                        return r;
                    }
                } while (mnistcu__json_eat(&j, ','));
                if (!mnistcu__json_eat(&j, '}')) return mnistcu__json_fail(&j, "expected ',' or '}' in __metadata__");
                continue;
            }
            if (f->nt == MNISTCU__ST_MAX_TENSORS) {
                mnistcu__free(ctx, key);
                return mnistcu__json_fail(&j, "more tensors than allowed");
            }
            if (f->nt == cap) {
                mnistcu__st_tensor *nt = (mnistcu__st_tensor *)mnistcu__calloc(ctx, 2 * (size_t)cap * sizeof *nt);
                if (!nt) {
                    mnistcu__free(ctx, key);
                    return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%.300s: out of memory", what);
                }
                memcpy(nt, f->t, (size_t)cap * sizeof *nt);
                mnistcu__free(ctx, f->t);
                f->t = nt;
                cap *= 2;
            }
            if (!key[0]) {
                mnistcu__free(ctx, key);
                return mnistcu__json_fail(&j, "a tensor has an empty name");
            }
            snprintf(f->t[f->nt].name, MNISTCU__ST_NAME, "%s", key);
            mnistcu__free(ctx, key);
            for (i = 0; i < f->nt; ++i)
                if (!strcmp(f->t[i].name, f->t[f->nt].name)) return mnistcu__json_fail(&j, "a tensor name appears twice");
            if ((r = mnistcu__st_tensor_entry(&j, &f->t[f->nt]))) return r;
            f->nt++;
        } while (mnistcu__json_eat(&j, ','));
        if (!mnistcu__json_eat(&j, '}')) return mnistcu__json_fail(&j, "expected ',' or '}'");
    }
    mnistcu__json_ws(&j);
    if (j.p != j.end) return mnistcu__json_fail(&j, "bytes after the header object");
    /* Shapes against byte ranges, then the ranges must tile the data buffer. */
    for (i = 0; i < f->nt; ++i) {
        mnistcu__st_tensor *t = &f->t[i];
        uint64_t count = 1, bytes;
        for (k = 0; k < t->ndim; ++k) {
            if (t->shape[k] && count > UINT64_C(0xFFFFFFFFFFFFFFFF) / t->shape[k])
                return mnistcu__fail(ctx, MNISTCU_ERR_ST_SHAPE, "%.300s: tensor \"%s\": the shape's product overflows",
                                     what, t->name);
            count *= t->shape[k];
        }
        if (count > UINT64_C(0xFFFFFFFFFFFFFFFF) / 8)
            return mnistcu__fail(ctx, MNISTCU_ERR_ST_SHAPE, "%.300s: tensor \"%s\": too many elements", what, t->name);
        bytes = count * (uint64_t)mnistcu__st_dtypes[t->dtype].size;
        t->count = count;
        if (t->end < t->begin || t->end - t->begin != bytes)
            return mnistcu__fail(ctx, MNISTCU_ERR_ST_SHAPE,
                                 "%.300s: tensor \"%s\": shape and dtype make %llu bytes, its offsets [%llu, %llu) %llu",
                                 what, t->name, MNISTCU__ULL(bytes), MNISTCU__ULL(t->begin), MNISTCU__ULL(t->end),
                                 MNISTCU__ULL(t->end >= t->begin ? t->end - t->begin : 0));
    }
    {
        uint64_t at = 0;
        int done;
        for (done = 0; done < f->nt; ++done) { /* the tensor that begins where the last one ended (empty ones first) */
            int next = -1, sized = -1;
            for (i = 0; i < f->nt && next < 0; ++i) {
                if (f->t[i].begin != at) continue; /* visited ones carry bit 63 and never match */
                if (f->t[i].end == at) next = i;
                else if (sized >= 0)
                    return mnistcu__fail(ctx, MNISTCU_ERR_ST_OFFSETS,
                                         "%.300s: tensors \"%s\" and \"%s\" overlap at data byte %llu", what,
                                         f->t[sized].name, f->t[i].name, MNISTCU__ULL(at));
                else sized = i;
            }
            if (next < 0) next = sized;
            if (next < 0)
                return mnistcu__fail(ctx, MNISTCU_ERR_ST_OFFSETS,
                                     "%.300s: no tensor begins at data byte %llu: the offsets leave a gap or overlap",
                                     what, MNISTCU__ULL(at));
            at = f->t[next].end;
            f->t[next].begin |= UINT64_C(1) << 63; /* visited */
        }
        for (i = 0; i < f->nt; ++i) f->t[i].begin &= ~(UINT64_C(1) << 63);
        if (at != (uint64_t)f->data_size)
            return mnistcu__fail(ctx, MNISTCU_ERR_ST_OFFSETS,
                                 "%.300s: the tensors cover %llu bytes of data, the file holds %lu after the header", what,
                                 MNISTCU__ULL(at), (unsigned long)f->data_size);
    }
    return MNISTCU_OK;
}

/* ---- writing ---------------------------------------------------------------- */
typedef struct mnistcu__text {
    char *p;
    size_t len, cap;
    int oom;
    mnistcu_ctx *ctx;
} mnistcu__text;

static void mnistcu__text_put(mnistcu__text *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *np;
        while (cap < b->len + n + 1) cap *= 2;
        np = (char *)mnistcu__alloc(b->ctx, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        if (b->len) memcpy(np, b->p, b->len);
        mnistcu__free(b->ctx, b->p);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void mnistcu__text_printf(mnistcu__text *b, const char *fmt, ...) MNISTCU__PRINTF(2, 3);
static void mnistcu__text_printf(mnistcu__text *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) b->oom = 1;
    else mnistcu__text_put(b, tmp, (size_t)n);
}

/* s as a JSON string: quotes, backslashes and control characters escaped. */
static void mnistcu__text_json(mnistcu__text *b, const char *s)
{
    mnistcu__text_put(b, "\"", 1);
    for (; *s; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            mnistcu__text_put(b, e, 2);
        } else if (c < 0x20) {
            mnistcu__text_printf(b, "\\u%04x", c);
        } else {
            mnistcu__text_put(b, s, 1);
        }
    }
    mnistcu__text_put(b, "\"", 1);
}

typedef struct mnistcu__st_out {
    const char *name;
    int dtype;                 /* MNISTCU__ST_F32, _I64, _F64, _U32 */
    int ndim;
    int64_t shape[4];
    const void *data;          /* host order */
    size_t count;
} mnistcu__st_out;

/* fsync where POSIX declares it (a strict -std=c99 build hides it: then the
   file is flushed, and the rename still never exposes a partial file). */
#ifndef MNISTCU_FSYNC
#if (defined(__unix__) || defined(__APPLE__)) && (!defined(__STRICT_ANSI__) || defined(_POSIX_C_SOURCE))
#include <unistd.h>
#define MNISTCU_FSYNC(f) fsync(fileno(f))
#else
#define MNISTCU_FSYNC(f) 0
#endif
#endif

/* size bytes to path, atomically (PATH.tmp, synced, renamed). */
static mnistcu_result mnistcu__write_atomic(mnistcu_ctx *ctx, const char *path, const void *data, size_t size)
{
    char tmp[4200];
    FILE *f;
    int ok;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%.300s: path too long", path);
    f = fopen(tmp, "wb");
    if (!f) return mnistcu__fail(ctx, MNISTCU_ERR_IO, "%.300s: cannot create the file (%s)", tmp, strerror(errno));
    ok = fwrite(data, 1, size, f) == size && fflush(f) == 0 && MNISTCU_FSYNC(f) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        remove(tmp);
        return mnistcu__fail(ctx, MNISTCU_ERR_IO, "%.300s: writing failed (%s); %.300s is unchanged", tmp,
                             strerror(errno), path);
    }
#ifdef _WIN32
    remove(path);
#endif
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return mnistcu__fail(ctx, MNISTCU_ERR_IO, "%.300s: cannot rename %.300s over it (%s)", path, tmp, strerror(errno));
    }
    return MNISTCU_OK;
}

/* Writes a safetensors file (atomically, see mnistcu__write_atomic). */
static mnistcu_result mnistcu__st_write(mnistcu_ctx *ctx, const char *path, const mnistcu__st_out *t, int nt,
                                        const char *const *mk, const char *const *mv, int nm)
{
    mnistcu__text h, file;
    uint64_t off = 0, n;
    unsigned char len8[8], chunk[4096];
    mnistcu_result r;
    int i, k;
    memset(&h, 0, sizeof h);
    memset(&file, 0, sizeof file);
    h.ctx = file.ctx = ctx;
    mnistcu__text_put(&h, "{\"__metadata__\":{", 17);
    for (i = 0; i < nm; ++i) {
        if (i) mnistcu__text_put(&h, ",", 1);
        mnistcu__text_json(&h, mk[i]);
        mnistcu__text_put(&h, ":", 1);
        mnistcu__text_json(&h, mv[i]);
    }
    mnistcu__text_put(&h, "}", 1);
    for (i = 0; i < nt; ++i) {
        uint64_t bytes = (uint64_t)t[i].count * (uint64_t)mnistcu__st_dtypes[t[i].dtype].size;
        mnistcu__text_put(&h, ",", 1);
        mnistcu__text_json(&h, t[i].name);
        mnistcu__text_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", mnistcu__st_dtypes[t[i].dtype].name);
        for (k = 0; k < t[i].ndim; ++k) mnistcu__text_printf(&h, "%s%lld", k ? "," : "", (long long)t[i].shape[k]);
        mnistcu__text_printf(&h, "],\"data_offsets\":[%llu,%llu]}", MNISTCU__ULL(off), MNISTCU__ULL(off + bytes));
        off += bytes;
    }
    mnistcu__text_put(&h, "}", 1);
    while (!h.oom && (8 + h.len) % 8) mnistcu__text_put(&h, " ", 1);
    n = h.len;
    for (k = 0; k < 8; ++k) len8[k] = (unsigned char)(n >> (8 * k));
    mnistcu__text_put(&file, (const char *)len8, 8);
    mnistcu__text_put(&file, h.p ? h.p : "", h.len);
    for (i = 0; i < nt && !file.oom; ++i) { /* the tensors, little-endian */
        int es = mnistcu__st_dtypes[t[i].dtype].size;
        size_t per = sizeof chunk / (size_t)es, done_n;
        for (done_n = 0; done_n < t[i].count; done_n += per) {
            size_t c = MNISTCU__MIN(per, t[i].count - done_n);
            mnistcu__le_copy(chunk, (const unsigned char *)t[i].data + done_n * (size_t)es, c, es);
            mnistcu__text_put(&file, (const char *)chunk, c * (size_t)es);
        }
    }
    r = h.oom || file.oom ? mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%.300s: out of memory", path)
                          : mnistcu__write_atomic(ctx, path, file.p, file.len);
    mnistcu__free(ctx, h.p);
    mnistcu__free(ctx, file.p);
    return r;
}

static const char *mnistcu__st_meta(const mnistcu__st_file *f, const char *key)
{
    int k;
    for (k = 0; k < f->nmeta; ++k)
        if (!strcmp(f->meta_key[k], key)) return f->meta_val[k];
    return NULL;
}

static const mnistcu__st_tensor *mnistcu__st_find(const mnistcu__st_file *f, const char *name)
{
    int k;
    for (k = 0; k < f->nt; ++k)
        if (!strcmp(f->t[k].name, name)) return &f->t[k];
    return NULL;
}

static const char *const mnistcu__loss_names[] = {"", "ce", "mse", "bce", "hinge"};

/* A metadata number: the whole string a finite decimal. */
static int mnistcu__meta_double(const char *s, double *v)
{
    char *end;
    if (!s || !((*s >= '0' && *s <= '9') || *s == '-' || *s == '+' || *s == '.')) return 0;
    *v = strtod(s, &end);
    return *end == 0 && mnistcu__finite_d(*v);
}

/* ---- the model's file ---------------------------------------------------------- */
static int mnistcu__has_tensor(const mnistcu_model *m, const char *name)
{
    int i;
    for (i = 0; i < m->num_tensors; ++i)
        if (!strcmp(m->tensors[i].name, name)) return 1;
    return 0;
}


/* The tensors of m as host arrays in *host (params, buffers, then the
   num_batches_tracked counters), described in out[] (room for num_tensors). */
static mnistcu_result mnistcu__model_tensors_out(mnistcu_model *m, mnistcu__st_out *out, float **host)
{
    size_t np = m->num_params, nb = m->num_buffers;
    int64_t *counts;
    mnistcu_result r;
    int i, k;
    *host = (float *)mnistcu__alloc(m->ctx, (np + nb) * sizeof(float) + (size_t)m->num_tensors * sizeof(int64_t) + 8);
    if (!*host) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_save: out of memory");
    counts = (int64_t *)(void *)(((uintptr_t)(*host + np + nb) + 7) & ~(uintptr_t)7);
    if ((r = mnistcu__model_copy(m, *host, m->params, np * sizeof(float), 0)) ||
        (nb && (r = mnistcu__model_copy(m, *host + np, m->buffers, nb * sizeof(float), 0))))
        return r;
    for (i = 0; i < m->num_tensors; ++i) {
        const mnistcu__tensor *t = &m->tensors[i];
        out[i].name = t->name;
        out[i].ndim = t->ndim;
        for (k = 0; k < t->ndim; ++k) out[i].shape[k] = t->shape[k];
        out[i].count = t->count;
        if (t->arena == 2) {
            counts[i] = m->layers[t->layer].batches;
            out[i].dtype = MNISTCU__ST_I64;
            out[i].data = &counts[i];
        } else {
            out[i].dtype = MNISTCU__ST_F32;
            out[i].data = (t->arena == 0 ? *host : *host + np) + t->offset;
        }
    }
    return MNISTCU_OK;
}

#define MNISTCU__META_TEXT 48
/* The metadata of a model file: keys and values (values in vals[k][MNISTCU__META_TEXT], the spec and the
   class names in their own buffers). */
typedef struct mnistcu__model_meta {
    const char *key[40], *val[40];
    char num[40][MNISTCU__META_TEXT];
    int n;
    char spec[2048];
    mnistcu__text names;
} mnistcu__model_meta;

static void mnistcu__meta_add(mnistcu__model_meta *mm, const char *key, const char *val)
{
    mm->key[mm->n] = key;
    mm->val[mm->n] = val;
    mm->n++;
}

static void mnistcu__meta_num(mnistcu__model_meta *mm, const char *key, double v, int as_float)
{
    if (as_float) mnistcu__float_text((float)v, mm->num[mm->n], MNISTCU__META_TEXT);
    else snprintf(mm->num[mm->n], MNISTCU__META_TEXT, "%.17g", v);
    mnistcu__meta_add(mm, key, mm->num[mm->n]);
}

static mnistcu_result mnistcu__model_meta_make(mnistcu_model *m, const char *kind, mnistcu__model_meta *mm)
{
    mnistcu_result r;
    memset(mm, 0, sizeof *mm);
    mm->names.ctx = m->ctx;
    if ((r = mnistcu_model_spec(m, mm->spec, sizeof mm->spec)))
        return mnistcu__fail(m->ctx, r, "model_save: the spec does not fit in %lu bytes", (unsigned long)sizeof mm->spec);
    mnistcu__meta_add(mm, "format", "mnistcu");
    mnistcu__meta_add(mm, "format_version", "1");
    mnistcu__meta_add(mm, "kind", kind);
    mnistcu__meta_add(mm, "spec", mm->spec);
    snprintf(mm->num[mm->n], MNISTCU__META_TEXT, "%d,%d,%d", m->desc.input_c, m->desc.input_h, m->desc.input_w);
    mnistcu__meta_add(mm, "input_shape", mm->num[mm->n]);
    mnistcu__meta_num(mm, "classes", (double)m->classes, 0);
    if (m->class_names) {
        const char *p = m->class_names;
        size_t c;
        mnistcu__text_put(&mm->names, "[", 1);
        for (c = 0; c < m->classes; ++c) {
            if (c) mnistcu__text_put(&mm->names, ",", 1);
            mnistcu__text_json(&mm->names, p);
            p += strlen(p) + 1;
        }
        mnistcu__text_put(&mm->names, "]", 1);
        if (mm->names.oom) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_save: out of memory");
        mnistcu__meta_add(mm, "class_names", mm->names.p);
    }
    if (m->has_norm) {
        mnistcu__meta_num(mm, "norm_scale", m->norm_scale, 1);
        mnistcu__meta_num(mm, "norm_shift", m->norm_shift, 1);
        mnistcu__meta_add(mm, "norm_u8", m->norm_u8 ? "1" : "0");
    }
    mnistcu__meta_add(mm, "loss", mnistcu__loss_names[m->loss]);
    mnistcu__meta_num(mm, "label_smoothing", m->lossp.smoothing, 1);
    mnistcu__meta_num(mm, "loss_sum", m->lossp.sum, 0);
    mnistcu__meta_num(mm, "margin", m->lossp.margin, 1);
    mnistcu__meta_num(mm, "hinge_p", m->lossp.p, 0);
    mnistcu__meta_add(mm, "library_version", MNISTCU_VERSION_STRING);
    return MNISTCU_OK;
}

/* Saves m with extra tensors and metadata (checkpoints). */
static mnistcu_result mnistcu__model_save(mnistcu_model *m, const char *path, const char *kind,
                                          const mnistcu__st_out *extra, int nextra, const char *const *xk,
                                          const char *const *xv, int nx)
{
    mnistcu__model_meta *mm;
    mnistcu__st_out *out;
    float *host = NULL;
    mnistcu_result r;
    int i;
    if (!path || !*path) return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_save: no path given");
    mm = (mnistcu__model_meta *)mnistcu__alloc(m->ctx, sizeof *mm);
    out = (mnistcu__st_out *)mnistcu__alloc(m->ctx, ((size_t)m->num_tensors + (size_t)nextra) * sizeof *out + 1);
    if (!mm || !out) {
        mnistcu__free(m->ctx, mm);
        mnistcu__free(m->ctx, out);
        return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_save: out of memory");
    }
    if (!(r = mnistcu__model_meta_make(m, kind, mm)) && !(r = mnistcu__model_tensors_out(m, out, &host))) {
        for (i = 0; i < nextra; ++i) out[m->num_tensors + i] = extra[i];
        for (i = 0; i < nx && mm->n < 40; ++i) mnistcu__meta_add(mm, xk[i], xv[i]);
        r = mnistcu__st_write(m->ctx, path, out, m->num_tensors + nextra, mm->key, mm->val, mm->n);
    }
    mnistcu__free(m->ctx, host);
    mnistcu__free(m->ctx, mm->names.p);
    mnistcu__free(m->ctx, mm);
    mnistcu__free(m->ctx, out);
    return r;
}

MNISTCU_DEF mnistcu_result mnistcu_model_save(mnistcu_model *m, const char *path)
{
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    return mnistcu__model_save(m, path, "weights", NULL, 0, NULL, NULL, 0);
}

MNISTCU_DEF mnistcu_result mnistcu_model_set_class_names(mnistcu_model *m, const char *const *names, size_t count)
{
    size_t c, bytes = 0;
    char *buf, *p;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!names || count == 0) {
        mnistcu__free(m->ctx, m->class_names);
        m->class_names = NULL;
        return MNISTCU_OK;
    }
    if (count != m->classes)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_SHAPE, "model_set_class_names: %lu names for %lu outputs",
                             (unsigned long)count, (unsigned long)m->classes);
    for (c = 0; c < count; ++c) {
        size_t n = names[c] ? strlen(names[c]) : 0;
        if (n == 0 || n > 63 || !mnistcu__utf8_text(names[c]))
            return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_set_class_names: name %lu is %s",
                                 (unsigned long)c, !n ? "empty" : n > 63 ? "longer than 63 bytes"
                                                                : "not UTF-8 text (or holds control characters)");
        bytes += n + 1;
    }
    buf = (char *)mnistcu__alloc(m->ctx, bytes);
    if (!buf) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_set_class_names: out of memory");
    for (p = buf, c = 0; c < count; ++c) {
        size_t n = strlen(names[c]) + 1;
        memcpy(p, names[c], n);
        p += n;
    }
    mnistcu__free(m->ctx, m->class_names);
    m->class_names = buf;
    return MNISTCU_OK;
}

MNISTCU_DEF const char *mnistcu_model_class_name(const mnistcu_model *m, size_t i)
{
    const char *p;
    if (!m || !m->class_names || i >= m->classes) return NULL;
    for (p = m->class_names; i; --i) p += strlen(p) + 1;
    return p;
}

/* class_names metadata: a JSON array of count strings, into m. */
static mnistcu_result mnistcu__meta_class_names(mnistcu_model *m, const char *text, const char *what)
{
    mnistcu__json j;
    char *names[MNISTCU_MAX_CLASSES];
    size_t n = 0, k;
    mnistcu_result r = MNISTCU_OK;
    j.start = j.p = (const unsigned char *)text;
    j.end = j.p + strlen(text);
    j.ctx = m->ctx;
    j.what = what;
    if (!mnistcu__json_eat(&j, '[')) r = MNISTCU_ERR_ST_JSON;
    while (!r && n < MNISTCU_MAX_CLASSES) {
        if ((r = mnistcu__json_string(&j, &names[n], 63))) break;
        n++;
        if (!mnistcu__json_eat(&j, ',')) break;
    }
    if (!r && !mnistcu__json_eat(&j, ']')) r = MNISTCU_ERR_ST_JSON;
    mnistcu__json_ws(&j);
    if (!r && j.p != j.end) r = MNISTCU_ERR_ST_JSON;
    if (!r) r = mnistcu_model_set_class_names(m, (const char *const *)names, n);
    for (k = 0; k < n; ++k) mnistcu__free(m->ctx, names[k]);
    if (r)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_ST_METADATA,
                             "%.300s: metadata class_names must be a JSON array of one name (1-63 bytes) per output",
                             what);
    return MNISTCU_OK;
}

/* The tensors of m from a parsed file, strictly: every tensor of the model with
   its dtype and shape, no other (but the mnistcu.* of checkpoints), finite values. */
static mnistcu_result mnistcu__st_load_tensors(mnistcu_model *m, const mnistcu__st_file *f, const char *what)
{
    mnistcu_ctx *ctx = m->ctx;
    float *host = NULL;
    mnistcu_result r;
    int i, k;
    /* Every tensor of the model, with its dtype and shape; no other (but mnistcu.* of checkpoints). */
    for (i = 0; i < f->nt; ++i)
        if (strncmp(f->t[i].name, "mnistcu.", 8) != 0 && !mnistcu__has_tensor(m, f->t[i].name)) {
            r = mnistcu__fail(ctx, MNISTCU_ERR_ST_TENSORS, "%.300s: tensor \"%s\" is not one of the model's (%.200s)",
                              what, f->t[i].name, mnistcu__st_meta(f, "spec"));
            goto done;
        }
    host = (float *)mnistcu__alloc(ctx, (m->num_params + m->num_buffers + 1) * sizeof(float));
    if (!host) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "%.300s: out of memory", what);
        goto done;
    }
    for (i = 0; i < m->num_tensors; ++i) {
        const mnistcu__tensor *mt = &m->tensors[i];
        const mnistcu__st_tensor *t = mnistcu__st_find(f, mt->name);
        int want = mt->arena == 2 ? MNISTCU__ST_I64 : MNISTCU__ST_F32, same = t && t->ndim == mt->ndim;
        if (!t) {
            r = mnistcu__fail(ctx, MNISTCU_ERR_ST_TENSORS, "%.300s: tensor \"%s\" of the model is missing", what,
                              mt->name);
            goto done;
        }
        if (t->dtype != want) {
            r = mnistcu__fail(ctx, MNISTCU_ERR_ST_DTYPE, "%.300s: tensor \"%s\" is %s, the model needs %s", what,
                              mt->name, mnistcu__st_dtypes[t->dtype].name, mnistcu__st_dtypes[want].name);
            goto done;
        }
        for (k = 0; same && k < mt->ndim; ++k) same = t->shape[k] == (uint64_t)mt->shape[k];
        if (!same) {
            r = mnistcu__fail(ctx, MNISTCU_ERR_ST_SHAPE, "%.300s: tensor \"%s\" has another shape than the model's", what,
                              mt->name);
            goto done;
        }
        if (mt->arena == 2) {
            int64_t c;
            mnistcu__le_copy(&c, f->data + t->begin, 1, 8);
            if (c < 0) {
                r = mnistcu__fail(ctx, MNISTCU_ERR_ST_SHAPE, "%.300s: tensor \"%s\" is negative", what, mt->name);
                goto done;
            }
            m->layers[mt->layer].batches = c;
        } else {
            float *dst = (mt->arena == 0 ? host : host + m->num_params) + mt->offset;
            size_t e;
            mnistcu__le_copy(dst, f->data + t->begin, mt->count, 4);
            for (e = 0; e < mt->count; ++e)
                if (!mnistcu__finite_f(dst[e])) {
                    r = mnistcu__fail(ctx, MNISTCU_ERR_ST_SHAPE, "%.300s: tensor \"%s\" holds a value that is not "
                                                                 "finite at element %lu", what, mt->name,
                                      (unsigned long)e);
                    goto done;
                }
        }
    }
    if ((r = mnistcu__model_copy(m, m->params, host, m->num_params * sizeof(float), 1)) ||
        (m->num_buffers &&
         (r = mnistcu__model_copy(m, m->buffers, host + m->num_params, m->num_buffers * sizeof(float), 1))))
        goto done;
    r = MNISTCU_OK;
done:
    mnistcu__free(ctx, host);
    return r;
}

/* The floats of parameters and buffers a desc makes, from its shapes alone (nothing allocated but the
   model struct): a file must hold that many bytes before the model is made. */
static mnistcu_result mnistcu__desc_counts(mnistcu_ctx *ctx, const mnistcu_model_desc *desc, size_t *np, size_t *nb)
{
    mnistcu_model *m;
    mnistcu_result r;
    if (desc->layers[0].kind == MNISTCU_LAYER_NONE && (r = mnistcu__check_sizes(ctx, desc))) return r;
    m = (mnistcu_model *)mnistcu__calloc(ctx, sizeof *m);
    if (!m) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model: out of memory");
    m->ctx = ctx;
    m->device = MNISTCU_DEVICE_CPU;
    m->loss = desc->loss == MNISTCU_LOSS_DEFAULT ? MNISTCU_LOSS_SOFTMAX_CE : desc->loss;
    m->hidden_act = desc->hidden_act == MNISTCU_ACT_DEFAULT ? MNISTCU_ACT_RELU : desc->hidden_act;
    if (desc->layers[0].kind == MNISTCU_LAYER_NONE) mnistcu__desc_expand(desc, &m->desc);
    else m->desc = *desc;
    m->desc.hidden_act = m->hidden_act;
    r = mnistcu__model_build(ctx, m);
    *np = m->num_params;
    *nb = m->num_buffers;
    mnistcu__free(ctx, m);
    return r;
}

/* The model a parsed file describes, with its weights (strict: every tensor present, none unknown). */
static mnistcu_result mnistcu__model_from_st(mnistcu_ctx *ctx, const mnistcu__st_file *f, const char *what,
                                             mnistcu_model **out)
{
    mnistcu_model_desc d;
    mnistcu_model *m = NULL;
    const char *v;
    mnistcu_result r;
    double x;
    int k;
    *out = NULL;
    v = mnistcu__st_meta(f, "format");
    if (!v || strcmp(v, "mnistcu") != 0)
        return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA,
                             "%.300s: not a mnistcu model file (its metadata has no format \"mnistcu\": the model's "
                             "architecture is unknown)", what);
    v = mnistcu__st_meta(f, "format_version");
    if (!v || strcmp(v, "1") != 0)
        return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: format_version \"%.20s\", this library reads \"1\"",
                             what, v ? v : "(none)");
    v = mnistcu__st_meta(f, "spec");
    if (!v) return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: the metadata has no spec", what);
    if ((r = mnistcu_model_desc_parse(ctx, v, &d)))
        return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: metadata spec: %.400s", what, mnistcu_ctx_error(ctx));
    if ((v = mnistcu__st_meta(f, "loss"))) {
        for (k = 1; k <= MNISTCU_LOSS_HINGE; ++k)
            if (!strcmp(v, mnistcu__loss_names[k])) d.loss = (mnistcu_loss)k;
        if (d.loss == MNISTCU_LOSS_DEFAULT)
            return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: metadata loss \"%.20s\" unknown", what, v);
    }
#define MNISTCU__META_NUM(key, lo, hi, dst, cast)                                                                \
    if ((v = mnistcu__st_meta(f, key))) {                                                                          \
        if (!mnistcu__meta_double(v, &x) || x < (lo) || x > (hi))                                                  \
            return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: metadata %s \"%.40s\" out of range", what, \
                                 key, v);                                                                          \
        dst = (cast)x;                                                                                             \
    }
    MNISTCU__META_NUM("label_smoothing", 0.0, 1.0, d.label_smoothing, float)
    MNISTCU__META_NUM("loss_sum", 0.0, 1.0, d.loss_sum, int)
    MNISTCU__META_NUM("margin", 0.0, 1e30, d.margin, float)
    MNISTCU__META_NUM("hinge_p", 1.0, 2.0, d.hinge_p, int)
    if ((v = mnistcu__st_meta(f, "loss_sum")) && strcmp(v, "0") && strcmp(v, "1"))
        return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: metadata loss_sum must be 0 or 1", what);
    if ((v = mnistcu__st_meta(f, "hinge_p")) && strcmp(v, "1") && strcmp(v, "2"))
        return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: metadata hinge_p must be 1 or 2", what);
    if (d.loss_sum != 0 && d.loss_sum != 1)
        return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: metadata loss_sum must be 0 or 1", what);
    {   /* the file must hold the weights before they are allocated: a short file cannot ask for gigabytes */
        size_t np = 0, nb = 0;
        if ((r = mnistcu__desc_counts(ctx, &d, &np, &nb)))
            return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: the model it describes cannot be made: %.400s",
                                 what, mnistcu_ctx_error(ctx));
        if (np > f->data_size / 4 || nb > f->data_size / 4 - np)
            return mnistcu__fail(ctx, MNISTCU_ERR_ST_TENSORS,
                                 "%.300s: its spec has %lu parameters and %lu buffer values, the file holds %lu bytes of "
                                 "data", what, (unsigned long)np, (unsigned long)nb, (unsigned long)f->data_size);
    }
    if ((r = mnistcu_model_create(ctx, &d, &m)))
        return mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: the model it describes cannot be made: %.400s", what,
                             mnistcu_ctx_error(ctx));
    if ((v = mnistcu__st_meta(f, "classes")) &&
        (strspn(v, "0123456789") != strlen(v) || !*v || strtoul(v, NULL, 10) != (unsigned long)m->classes)) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: metadata classes \"%.20s\", the spec gives %lu", what,
                          v, (unsigned long)m->classes);
        goto fail;
    }
    if ((v = mnistcu__st_meta(f, "class_names")) && (r = mnistcu__meta_class_names(m, v, what))) goto fail;
    {
        const char *sc = mnistcu__st_meta(f, "norm_scale"), *sh = mnistcu__st_meta(f, "norm_shift");
        const char *u8 = mnistcu__st_meta(f, "norm_u8");
        double a, b;
        if (sc || sh) {
            if (!mnistcu__meta_double(sc, &a) || !mnistcu__meta_double(sh, &b) || fabs(a) > FLT_MAX ||
                fabs(b) > FLT_MAX || (u8 && strcmp(u8, "0") && strcmp(u8, "1"))) {
                r = mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA,
                                  "%.300s: metadata norm_scale, norm_shift and norm_u8 must be finite numbers (and 0 or "
                                  "1)", what);
                goto fail;
            }
            m->has_norm = 1;
            m->norm_scale = (float)a;
            m->norm_shift = (float)b;
            m->norm_u8 = !u8 || !strcmp(u8, "1");
        }
    }
    if ((r = mnistcu__st_load_tensors(m, f, what))) goto fail;
    *out = m;
    return MNISTCU_OK;
fail:
    mnistcu_model_destroy(m);
    return r;
#undef MNISTCU__META_NUM
}

MNISTCU_DEF mnistcu_result mnistcu_model_load_memory(mnistcu_ctx *ctx, const void *data, size_t size,
                                                     mnistcu_model **out)
{
    mnistcu__st_file f;
    mnistcu_result r;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out || (!data && size))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_load_memory: NULL argument");
    *out = NULL;
    memset(&f, 0, sizeof f);
    f.buf = (unsigned char *)mnistcu__alloc(ctx, size ? size : 1);
    if (!f.buf) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_load_memory: out of memory");
    if (size) memcpy(f.buf, data, size);
    f.size = size;
    r = mnistcu__st_parse(ctx, &f, "model in memory");
    if (!r) r = mnistcu__model_from_st(ctx, &f, "model in memory", out);
    mnistcu__st_free(ctx, &f);
    return r;
}

static mnistcu_result mnistcu__st_read(mnistcu_ctx *ctx, const char *path, mnistcu__st_file *f)
{
    mnistcu_result r;
    memset(f, 0, sizeof *f);
    if ((r = mnistcu__read_file(ctx, path, MNISTCU_MODEL_MAX_BYTES, &f->buf, &f->size))) return r;
    if ((r = mnistcu__st_parse(ctx, f, path))) mnistcu__st_free(ctx, f);
    return r;
}

MNISTCU_DEF mnistcu_result mnistcu_model_load(mnistcu_ctx *ctx, const char *path, mnistcu_model **out)
{
    mnistcu__st_file f;
    mnistcu_result r;
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!path || !out) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_load: NULL argument");
    *out = NULL;
    if ((r = mnistcu__st_read(ctx, path, &f))) return r;
    r = mnistcu__model_from_st(ctx, &f, path, out);
    mnistcu__st_free(ctx, &f);
    return r;
}

/* >>onnx -----------------------------------------------------------------------
   ONNX export: the model as a ModelProto (IR version 7, opset 13), written by
   hand in protobuf's wire format (a field is a varint key, (number << 3) |
   wire type, then a varint, 4 bytes, or a varint length and bytes; a nested
   message is written into its own buffer first, then added with its length).
   The graph takes "input", [batch, C, H, W] (or [batch, N] for flat data),
   with a named dynamic batch dimension, and gives "logits", [batch, classes],
   in EVAL mode: one node per layer (Gemm with transB, Conv, MaxPool,
   AveragePool, BatchNormalization, Flatten, Relu, LeakyRelu, Sigmoid, Tanh,
   Softmax on axis 1); dropout is the identity and left out. A model that
   records a normalisation for byte images takes the raw pixel values 0..255
   (as floats) and starts with Mul and Add nodes that normalise them; one
   without takes its features as they are. Initializers carry the state_dict
   names ("0.weight"), so the file reads like torch.onnx.export's. */
typedef mnistcu__text mnistcu__pb; /* a growable byte buffer */

static void mnistcu__pb_varint(mnistcu__pb *b, uint64_t v)
{
    unsigned char tmp[10];
    size_t n = 0;
    do {
        tmp[n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    mnistcu__text_put(b, (const char *)tmp, n);
}

static void mnistcu__pb_key(mnistcu__pb *b, int field, int wire) { mnistcu__pb_varint(b, (uint64_t)(field << 3 | wire)); }
static void mnistcu__pb_int(mnistcu__pb *b, int field, int64_t v) /* negative: ten bytes, two's complement */
{
    mnistcu__pb_key(b, field, 0);
    mnistcu__pb_varint(b, (uint64_t)v);
}
static void mnistcu__pb_bytes(mnistcu__pb *b, int field, const void *p, size_t n)
{
    mnistcu__pb_key(b, field, 2);
    mnistcu__pb_varint(b, n);
    mnistcu__text_put(b, (const char *)p, n);
}
static void mnistcu__pb_str(mnistcu__pb *b, int field, const char *s) { mnistcu__pb_bytes(b, field, s, strlen(s)); }
static void mnistcu__pb_msg(mnistcu__pb *b, int field, mnistcu__pb *sub) /* appends sub, then empties it */
{
    mnistcu__pb_bytes(b, field, sub->p ? sub->p : "", sub->len);
    if (sub->oom) b->oom = 1;
    sub->len = 0;
}

/* ---- attributes (AttributeProto: name 1, f 2, i 3, ints 8, type 20) ---------- */
static void mnistcu__onnx_attr_int(mnistcu__pb *node, mnistcu__pb *tmp, const char *name, int64_t v)
{
    mnistcu__pb_str(tmp, 1, name);
    mnistcu__pb_int(tmp, 3, v);
    mnistcu__pb_int(tmp, 20, 2); /* INT */
    mnistcu__pb_msg(node, 5, tmp);
}
static void mnistcu__onnx_attr_float(mnistcu__pb *node, mnistcu__pb *tmp, const char *name, float v)
{
    unsigned char le[4];
    mnistcu__pb_str(tmp, 1, name);
    mnistcu__pb_key(tmp, 2, 5);
    mnistcu__le_copy(le, &v, 1, 4);
    mnistcu__text_put(tmp, (const char *)le, 4);
    mnistcu__pb_int(tmp, 20, 1); /* FLOAT */
    mnistcu__pb_msg(node, 5, tmp);
}
static void mnistcu__onnx_attr_ints(mnistcu__pb *node, mnistcu__pb *tmp, const char *name, const int64_t *v, int n)
{
    int k;
    mnistcu__pb_str(tmp, 1, name);
    for (k = 0; k < n; ++k) mnistcu__pb_int(tmp, 8, v[k]);
    mnistcu__pb_int(tmp, 20, 7); /* INTS */
    mnistcu__pb_msg(node, 5, tmp);
}

/* NodeProto (input 1, output 2, name 3, op_type 4, attribute 5): the node is in *node, finished into graph. */
static void mnistcu__onnx_node_begin(mnistcu__pb *node, const char *op, const char *name, const char *const *in, int nin,
                                     const char *out)
{
    int k;
    for (k = 0; k < nin; ++k) mnistcu__pb_str(node, 1, in[k]);
    mnistcu__pb_str(node, 2, out);
    mnistcu__pb_str(node, 3, name);
    mnistcu__pb_str(node, 4, op);
}

/* TensorProto (dims 1, data_type 2, name 8, raw_data 9) of n floats. */
static void mnistcu__onnx_initializer(mnistcu__pb *graph, mnistcu__pb *tmp, const char *name, const int64_t *dims,
                                      int ndim, const float *v, size_t n)
{
    int k;
    size_t i;
    unsigned char le[4];
    for (k = 0; k < ndim; ++k) mnistcu__pb_int(tmp, 1, dims[k]);
    mnistcu__pb_int(tmp, 2, 1); /* FLOAT */
    mnistcu__pb_str(tmp, 8, name);
    mnistcu__pb_key(tmp, 9, 2);
    mnistcu__pb_varint(tmp, 4 * n);
    for (i = 0; i < n; ++i) {
        mnistcu__le_copy(le, &v[i], 1, 4);
        mnistcu__text_put(tmp, (const char *)le, 4);
    }
    mnistcu__pb_msg(graph, 5, tmp);
}

/* ValueInfoProto (name 1, type 2 -> tensor_type 1 -> elem_type 1, shape 2 -> dim 1 -> dim_value 1 | dim_param 2):
   a float tensor whose first dimension is "batch". */
static void mnistcu__onnx_value_info(mnistcu__pb *graph, int field, const char *name, const int64_t *dims, int ndim)
{
    mnistcu__pb vi, type, tt, shape, dim;
    int k;
    memset(&vi, 0, sizeof vi);
    vi.ctx = type.ctx = tt.ctx = shape.ctx = dim.ctx = graph->ctx;
    memset(&type, 0, sizeof type), memset(&tt, 0, sizeof tt), memset(&shape, 0, sizeof shape), memset(&dim, 0, sizeof dim);
    vi.ctx = type.ctx = tt.ctx = shape.ctx = dim.ctx = graph->ctx;
    mnistcu__pb_str(&dim, 2, "batch");
    mnistcu__pb_msg(&shape, 1, &dim);
    for (k = 0; k < ndim; ++k) {
        mnistcu__pb_int(&dim, 1, dims[k]);
        mnistcu__pb_msg(&shape, 1, &dim);
    }
    mnistcu__pb_int(&tt, 1, 1); /* FLOAT */
    mnistcu__pb_msg(&tt, 2, &shape);
    mnistcu__pb_msg(&type, 1, &tt);
    mnistcu__pb_str(&vi, 1, name);
    mnistcu__pb_msg(&vi, 2, &type);
    mnistcu__pb_msg(graph, field, &vi);
    if (vi.oom || type.oom || tt.oom || shape.oom || dim.oom) graph->oom = 1;
    mnistcu__free(graph->ctx, vi.p);
    mnistcu__free(graph->ctx, type.p);
    mnistcu__free(graph->ctx, tt.p);
    mnistcu__free(graph->ctx, shape.p);
    mnistcu__free(graph->ctx, dim.p);
}

MNISTCU_DEF mnistcu_result mnistcu_model_export_onnx(mnistcu_model *m, const char *path)
{
    mnistcu_ctx *ctx;
    mnistcu__pb model, graph, node, tmp, opset;
    float *host = NULL;
    char cur[32], next[32], nname[32];
    int64_t in_dims[3];
    int i, t = 0, flat_input;
    mnistcu_result r = MNISTCU_OK;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    ctx = m->ctx;
    if (!path || !*path) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_export_onnx: no path given");
    memset(&model, 0, sizeof model);
    memset(&graph, 0, sizeof graph);
    memset(&node, 0, sizeof node);
    memset(&tmp, 0, sizeof tmp);
    memset(&opset, 0, sizeof opset);
    model.ctx = graph.ctx = node.ctx = tmp.ctx = opset.ctx = ctx;
    host = (float *)mnistcu__alloc(ctx, (m->num_params + m->num_buffers + 1) * sizeof(float));
    if (!host) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_export_onnx: out of memory");
    if ((r = mnistcu__model_copy(m, host, m->params, m->num_params * sizeof(float), 0)) ||
        (m->num_buffers &&
         (r = mnistcu__model_copy(m, host + m->num_params, m->buffers, m->num_buffers * sizeof(float), 0))))
        goto done;
    flat_input = m->layers[0].h == 1 && m->layers[0].w == 1; /* flat data: [batch, N] */
    in_dims[0] = flat_input ? (int64_t)m->inputs : m->layers[0].c;
    in_dims[1] = m->layers[0].h;
    in_dims[2] = m->layers[0].w;
    snprintf(cur, sizeof cur, "input");
    if (m->has_norm && m->norm_u8) { /* pixels 0..255 in, x = pixel * scale + shift */
        const char *in[2];
        int64_t one = 1;
        mnistcu__onnx_initializer(&graph, &tmp, "norm_scale", &one, 1, &m->norm_scale, 1);
        mnistcu__onnx_initializer(&graph, &tmp, "norm_shift", &one, 1, &m->norm_shift, 1);
        in[0] = "input";
        in[1] = "norm_scale";
        mnistcu__onnx_node_begin(&node, "Mul", "normalize_scale", in, 2, "scaled");
        mnistcu__pb_msg(&graph, 1, &node);
        in[0] = "scaled";
        in[1] = "norm_shift";
        mnistcu__onnx_node_begin(&node, "Add", "normalize_shift", in, 2, "normalized");
        mnistcu__pb_msg(&graph, 1, &node);
        snprintf(cur, sizeof cur, "normalized");
    }
    for (i = 0; i < m->num_layers; ++i) {
        const mnistcu__layer *L = &m->layers[i];
        const char *in[5];
        char wn[40], bn[40], mn[40], vn[40];
        int64_t dims[4], ints[4];
        int last = i == m->num_layers - 1, nin = 1;
        if (L->d.kind == MNISTCU_LAYER_DROPOUT && !last) continue; /* the identity in EVAL mode */
        if (last) snprintf(next, sizeof next, "logits");
        else snprintf(next, sizeof next, "t%d", t++);
        snprintf(nname, sizeof nname, "%d", L->index);
        snprintf(wn, sizeof wn, "%d.weight", L->index);
        snprintf(bn, sizeof bn, "%d.bias", L->index);
        in[0] = cur;
        switch (L->d.kind) {
        case MNISTCU_LAYER_DENSE:
            dims[0] = L->oc;
            dims[1] = (int64_t)L->in_size;
            mnistcu__onnx_initializer(&graph, &tmp, wn, dims, 2, host + L->wo, L->nw);
            in[nin++] = wn;
            if (L->nb) {
                mnistcu__onnx_initializer(&graph, &tmp, bn, dims, 1, host + L->bo, L->nb);
                in[nin++] = bn;
            }
            mnistcu__onnx_node_begin(&node, "Gemm", nname, in, nin, next);
            mnistcu__onnx_attr_int(&node, &tmp, "transB", 1);
            break;
        case MNISTCU_LAYER_CONV2D:
            dims[0] = L->oc;
            dims[1] = L->c;
            dims[2] = L->d.kernel_h;
            dims[3] = L->d.kernel_w;
            mnistcu__onnx_initializer(&graph, &tmp, wn, dims, 4, host + L->wo, L->nw);
            in[nin++] = wn;
            if (L->nb) {
                mnistcu__onnx_initializer(&graph, &tmp, bn, dims, 1, host + L->bo, L->nb);
                in[nin++] = bn;
            }
            mnistcu__onnx_node_begin(&node, "Conv", nname, in, nin, next);
            ints[0] = L->d.kernel_h, ints[1] = L->d.kernel_w;
            mnistcu__onnx_attr_ints(&node, &tmp, "kernel_shape", ints, 2);
            ints[0] = L->sh, ints[1] = L->sw;
            mnistcu__onnx_attr_ints(&node, &tmp, "strides", ints, 2);
            ints[0] = ints[1] = ints[2] = ints[3] = L->d.padding;
            mnistcu__onnx_attr_ints(&node, &tmp, "pads", ints, 4);
            break;
        case MNISTCU_LAYER_MAXPOOL2D:
        case MNISTCU_LAYER_AVGPOOL2D:
            mnistcu__onnx_node_begin(&node, L->d.kind == MNISTCU_LAYER_MAXPOOL2D ? "MaxPool" : "AveragePool", nname, in, 1,
                                     next);
            ints[0] = L->d.kernel_h, ints[1] = L->d.kernel_w;
            mnistcu__onnx_attr_ints(&node, &tmp, "kernel_shape", ints, 2);
            ints[0] = L->sh, ints[1] = L->sw;
            mnistcu__onnx_attr_ints(&node, &tmp, "strides", ints, 2);
            break;
        case MNISTCU_LAYER_BATCHNORM:
            dims[0] = L->c;
            snprintf(mn, sizeof mn, "%d.running_mean", L->index);
            snprintf(vn, sizeof vn, "%d.running_var", L->index);
            mnistcu__onnx_initializer(&graph, &tmp, wn, dims, 1, host + L->wo, L->nw);
            mnistcu__onnx_initializer(&graph, &tmp, bn, dims, 1, host + L->bo, L->nb);
            mnistcu__onnx_initializer(&graph, &tmp, mn, dims, 1, host + m->num_params + L->buf, (size_t)L->c);
            mnistcu__onnx_initializer(&graph, &tmp, vn, dims, 1, host + m->num_params + L->buf + L->c, (size_t)L->c);
            in[1] = wn, in[2] = bn, in[3] = mn, in[4] = vn;
            mnistcu__onnx_node_begin(&node, "BatchNormalization", nname, in, 5, next);
            mnistcu__onnx_attr_float(&node, &tmp, "epsilon", L->d.eps);
            break;
        case MNISTCU_LAYER_FLATTEN:
            mnistcu__onnx_node_begin(&node, "Flatten", nname, in, 1, next);
            mnistcu__onnx_attr_int(&node, &tmp, "axis", 1);
            break;
        case MNISTCU_LAYER_DROPOUT: /* the last layer: an Identity so that the graph still ends in logits */
            mnistcu__onnx_node_begin(&node, "Identity", nname, in, 1, next);
            break;
        case MNISTCU_LAYER_RELU: mnistcu__onnx_node_begin(&node, "Relu", nname, in, 1, next); break;
        case MNISTCU_LAYER_SIGMOID: mnistcu__onnx_node_begin(&node, "Sigmoid", nname, in, 1, next); break;
        case MNISTCU_LAYER_TANH: mnistcu__onnx_node_begin(&node, "Tanh", nname, in, 1, next); break;
        case MNISTCU_LAYER_LEAKY_RELU:
            mnistcu__onnx_node_begin(&node, "LeakyRelu", nname, in, 1, next);
            mnistcu__onnx_attr_float(&node, &tmp, "alpha", L->d.slope);
            break;
        case MNISTCU_LAYER_SOFTMAX:
            mnistcu__onnx_node_begin(&node, "Softmax", nname, in, 1, next);
            mnistcu__onnx_attr_int(&node, &tmp, "axis", 1);
            break;
        default:
            r = mnistcu__fail(ctx, MNISTCU_ERR_UNSUPPORTED, "model_export_onnx: layer %d has no ONNX operator", i);
            goto done;
        }
        mnistcu__pb_msg(&graph, 1, &node);
        snprintf(cur, sizeof cur, "%s", next);
    }
    mnistcu__pb_str(&graph, 2, "mnistcu");
    mnistcu__onnx_value_info(&graph, 11, "input", in_dims, flat_input ? 1 : 3);
    {
        int64_t out_dims[1];
        out_dims[0] = (int64_t)m->classes;
        mnistcu__onnx_value_info(&graph, 12, "logits", out_dims, 1);
    }
    mnistcu__pb_int(&model, 1, 7);              /* ir_version */
    mnistcu__pb_str(&model, 2, "mnistcu");      /* producer_name */
    mnistcu__pb_str(&model, 3, MNISTCU_VERSION_STRING);
    mnistcu__pb_msg(&model, 7, &graph);         /* graph */
    mnistcu__pb_str(&opset, 1, "");
    mnistcu__pb_int(&opset, 2, 13);
    mnistcu__pb_msg(&model, 8, &opset);         /* opset_import */
    if (model.oom || graph.oom || node.oom || tmp.oom || opset.oom) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "model_export_onnx: out of memory");
        goto done;
    }
    r = mnistcu__write_atomic(ctx, path, model.p, model.len);
done:
    mnistcu__free(ctx, host);
    mnistcu__free(ctx, model.p);
    mnistcu__free(ctx, graph.p);
    mnistcu__free(ctx, node.p);
    mnistcu__free(ctx, tmp.p);
    mnistcu__free(ctx, opset.p);
    return r;
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
                                           float scale, float shift, const mnistcu__aug *aug);
static mnistcu_result mnistcu__cuda_step_stats(mnistcu_model *m, size_t B, size_t step);
#define MNISTCU__LOSS_STATS_ROWS 256 /* batches whose loss and statistics one block computes, one launch */
static mnistcu_result mnistcu__cuda_loss_stats(mnistcu_model *m, size_t B, size_t step);
static int mnistcu__cuda_head_layer(const mnistcu_model *m);
static mnistcu_result mnistcu__cuda_head_step(mnistcu_model *m, int h, size_t B, size_t step);
static mnistcu_result mnistcu__cuda_read_stats(mnistcu_model *m, size_t from, size_t to, double *loss, int64_t *correct);
static double mnistcu__cuda_step_loss(const mnistcu_model *m, size_t step);
typedef struct mnistcu__fused_plan {
    int ok;
    int lenet;               /* 1: the fused LeNet-5 kernel (mnistcu_train_desc.fused_cnn), 0: the MLP kernel */
    int pair;                /* the LeNet-5 kernel in clusters of 2 blocks a sample (a helper beside each) */
    int mc, mc_bm, mc_u;     /* the cluster MLP kernel (mnistcu_train_desc.fused_mlp_clusters): its instance's
                                largest batch and units a cluster */
    int mc_sst;              /* ... with W1's optimizer state in shared memory (mnistcu__mc_args.sst) */
    int grid, nu_max, per_max, slots, prefetch;
    size_t smem;
    const mnistcu__layer *L1, *L2;
} mnistcu__fused_plan;
static void mnistcu__fused_plan_make(mnistcu_model *m, const mnistcu_dataset *ds, size_t B, size_t n,
                                     const mnistcu_optim_desc *o, int aug_on, int cnn, int clusters,
                                     mnistcu__fused_plan *pl);
static mnistcu_result mnistcu__cuda_fused_steps(mnistcu_model *m, const mnistcu_dataset *ds,
                                                const mnistcu__fused_plan *pl, const mnistcu__opt *ops, size_t nops,
                                                size_t B, size_t n, size_t step0, size_t nsteps);
static int mnistcu__cuda_graph_usable(const mnistcu_model *m);
static void mnistcu__cuda_graphs_reset(mnistcu_model *m);
static mnistcu_result mnistcu__cuda_dyn_upload(mnistcu_model *m, const mnistcu__dyn *h, size_t count, size_t cap);
static mnistcu_result mnistcu__cuda_step_begin(mnistcu_model *m);
static mnistcu__step_graph *mnistcu__cuda_graph_for(mnistcu_model *m, size_t b, int partial);
static mnistcu_result mnistcu__cuda_capture_begin(mnistcu_model *m);
static int mnistcu__cuda_capture_end(mnistcu_model *m, mnistcu__step_graph *g, int ok, const char **why);
static mnistcu_result mnistcu__cuda_graph_launch(mnistcu_model *m, const mnistcu__step_graph *g);
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

static void mnistcu__gather_row(mnistcu_model *m, const mnistcu_dataset *ds, size_t s, size_t i, float scale,
                                float shift);

/* x and labels of samples idx[offset .. offset+B) into act[0] and labels;
   aug: NULL, or the training batch's augmentation. */
static mnistcu_result mnistcu__gather(mnistcu_model *m, const mnistcu_dataset *ds, const uint32_t *idx, size_t offset,
                                      size_t B, const mnistcu__aug *aug)
{
    size_t i, F = ds->features;
    float scale, shift;
    mnistcu__norm_for(m, ds, &scale, &shift);
    m->batch_targets = ds->targets != NULL;
    if (aug && !aug->on) aug = NULL;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) return mnistcu__cuda_gather(m, ds, offset, B, scale, shift, aug);
#endif
    if (aug) {
        int32_t *work = (int32_t *)mnistcu__alloc(m->ctx, 4 * F * sizeof(int32_t));
        if (!work) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "augment: out of memory");
        for (i = 0; i < B; ++i) {
            size_t smp = idx[offset + i];
            mnistcu__cpu_augment(aug, ds->u8 + smp * F, ds->rows, ds->cols, (uint32_t)i, m->steps, scale, shift,
                                 m->input + i * F, work);
            m->labels[i] = ds->labels[smp];
            if (ds->targets)
                memcpy(m->targets + i * ds->target_dim, ds->targets + smp * ds->target_dim,
                       ds->target_dim * sizeof(float));
        }
        mnistcu__free(m->ctx, work);
        return MNISTCU_OK;
    }
    {
        long li;
        /* Rows from all over the dataset: memory latency more than work, which two
           threads halve (P7: 64 rows of 784 bytes a step). */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(m->ctx->threads) if (B * F >= 16384)
#endif
        for (li = 0; li < (long)B; ++li)
            mnistcu__gather_row(m, ds, idx[offset + (size_t)li], (size_t)li, scale, shift);
    }
    return MNISTCU_OK;
}

/* Row i of the batch: sample s, normalised, with its label and targets. */
static void mnistcu__gather_row(mnistcu_model *m, const mnistcu_dataset *ds, size_t s, size_t i, float scale,
                                float shift)
{
    size_t j, F = ds->features;
    float *x = m->input + i * F;
    if (ds->u8) {
        const uint8_t *src = ds->u8 + s * F;
        for (j = 0; j < F; ++j) x[j] = (float)src[j] * scale + shift;
    } else {
        const float *src = ds->f32 + s * F;
        for (j = 0; j < F; ++j) x[j] = src[j] * scale + shift;
    }
    m->labels[i] = ds->labels[s];
    if (ds->targets)
        memcpy(m->targets + i * ds->target_dim, ds->targets + s * ds->target_dim, ds->target_dim * sizeof(float));
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
    float *state;      /* [state_floats] the optimizer state; allocated once the model has one */
    float *buffers;    /* [num_buffers] batch norm's running statistics taken with them */
    int has_state;     /* state holds the optimizer state taken with params */
    size_t state_floats, state_used; /* state's capacity, and the floats taken */
    int state_sig;     /* ... its layout, and the steps taken with it */
    uint64_t state_steps;
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

/* Copies the parameters and momentum aside, over the older of the two copies,
   which becomes the newest. */
static mnistcu_result mnistcu__finite_snapshot(mnistcu_model *m, mnistcu__finite_guard *g, int epoch, size_t step)
{
    mnistcu__finite_copy_slot *c = &g->slot[g->copies ? !g->newest : g->newest];
    mnistcu_result r;
    if (!c->params && (r = mnistcu__model_floats(m, &c->params, m->num_params, "a copy of the weights"))) return r;
    if ((r = mnistcu__finite_copy(m, c->params, m->params, m->num_params, 0))) return r;
    if (m->num_buffers) {
        if (!c->buffers && (r = mnistcu__model_floats(m, &c->buffers, m->num_buffers, "a copy of the weights"))) return r;
        if ((r = mnistcu__finite_copy(m, c->buffers, m->buffers, m->num_buffers, 0))) return r;
    }
    c->has_state = m->state_sig != 0 && m->state_floats != 0;
    c->state_sig = m->state_sig;
    c->state_steps = m->state_steps;
    if (c->has_state) { /* the state grows when another optimizer takes over: the copy grows with it */
        if (c->state && c->state_floats < m->state_floats) {
            mnistcu__model_floats_free(m, c->state);
            c->state = NULL;
            c->state_floats = 0;
        }
        if (!c->state) {
            if ((r = mnistcu__model_floats(m, &c->state, m->state_floats, "a copy of the weights"))) return r;
            c->state_floats = m->state_floats;
        }
        if ((r = mnistcu__finite_copy(m, c->state, m->state, m->state_floats, 0))) return r;
    }
    c->state_used = c->has_state ? m->state_floats : 0;
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
    int ok = 1, k;
    memset(g, 0, sizeof *g);
    g->on = on;
    g->lr = lr;
    if (!on) return MNISTCU_OK;
    if (m->finite_keep) { /* the last training's buffers (mnistcu__finite_end): their memory, none of their state */
        mnistcu__finite_guard *kept = (mnistcu__finite_guard *)m->finite_keep;
        for (k = 0; k < 2; ++k) {
            g->slot[k].params = kept->slot[k].params;
            g->slot[k].buffers = kept->slot[k].buffers;
            g->slot[k].state = kept->slot[k].state;
            g->slot[k].state_floats = kept->slot[k].state_floats;
        }
        g->dev_flags = kept->dev_flags;
        mnistcu__free(m->ctx, kept);
        m->finite_keep = NULL;
    }
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

/* The guard's buffers and flags freed */
static void mnistcu__finite_release(mnistcu_model *m, mnistcu__finite_guard *g)
{
    int k;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) mnistcu__cuda_finite_end(m, g);
#endif
    for (k = 0; k < 2; ++k) {
        mnistcu__model_floats_free(m, g->slot[k].params);
        mnistcu__model_floats_free(m, g->slot[k].state);
        mnistcu__model_floats_free(m, g->slot[k].buffers);
    }
    memset(g, 0, sizeof *g);
}

/* At a training's end the guard's buffers stay with the model for the next one (m->finite_keep):
   allocating them (cudaMalloc) and freeing them (each free waits for the device), with the pinned
   flag the context now keeps (mnistcu__cuda.finite_flag), took 0.1-0.2 ms of each call, 3-7% of an
   epoch of P1 or P2 (bench/RESULTS.md). They go with the model (mnistcu__finite_keep_free). */
static void mnistcu__finite_end(mnistcu_model *m, mnistcu__finite_guard *g)
{
    mnistcu__finite_guard *kept;
#ifdef __CUDACC__
    /* the flag's copy may still be queued: done before the next training writes the flag */
    if (g->host_flag && mnistcu__cu(m->ctx)->sticky == cudaSuccess) cudaStreamSynchronize(mnistcu__cu(m->ctx)->stream);
#endif
    mnistcu__finite_keep_free(m);
    if (!g->on || !(kept = (mnistcu__finite_guard *)mnistcu__alloc(m->ctx, sizeof *kept))) {
        mnistcu__finite_release(m, g);
        return;
    }
    *kept = *g;
    kept->on = 0;
    m->finite_keep = kept;
    memset(g, 0, sizeof *g);
}

static void mnistcu__finite_keep_free(mnistcu_model *m)
{
    if (!m->finite_keep) return;
    mnistcu__finite_release(m, (mnistcu__finite_guard *)m->finite_keep);
    mnistcu__free(m->ctx, m->finite_keep);
    m->finite_keep = NULL;
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
    int loss_ok = 1, params_ok = 1, first_after, restore_state;
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
    if (m->num_buffers && (r = mnistcu__finite_copy(m, m->buffers, c->buffers, m->num_buffers, 0))) return r;
    /* the optimizer state as it was, when it had the layout the model's has now; else none: the next
       step makes it anew (the snapshot's belonged to an optimizer the training replaced) */
    restore_state = c->has_state && c->state_used == m->state_floats;
    if ((r = mnistcu__finite_copy(m, m->params, c->params, m->num_params, !restore_state))) return r;
    if (restore_state && (r = mnistcu__finite_copy(m, m->state, c->state, m->state_floats, 1))) return r;
    m->state_sig = restore_state ? c->state_sig : 0;
    m->state_steps = restore_state ? c->state_steps : 0;
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

MNISTCU_DEF float mnistcu_schedule_lr(const mnistcu_schedule_desc *schedule, float lr, int t, int T)
{
    double pi = 3.14159265358979323846, base = (double)lr, g;
    int k, passed = 0;
    if (!schedule || t < 0) return lr;
    if (schedule->warmup > 0) {
        if (t < schedule->warmup) {
            double s0 = schedule->warmup_start != 0.0f ? (double)schedule->warmup_start : 0.1;
            return (float)(base * (s0 + (1.0 - s0) * (double)t / (double)schedule->warmup));
        }
        t -= schedule->warmup;
        T -= schedule->warmup;
    }
    g = schedule->gamma != 0.0f ? (double)schedule->gamma : 0.1;
    switch (schedule->kind) {
    case MNISTCU_SCHEDULE_STEP:
        return (float)(base * pow(g, (double)(t / (schedule->step_size > 0 ? schedule->step_size : 1))));
    case MNISTCU_SCHEDULE_COSINE:
        if (T <= 0) return lr;
        return (float)((double)schedule->min_lr +
                       (base - (double)schedule->min_lr) * (1.0 + cos(pi * (double)t / (double)T)) / 2.0);
    case MNISTCU_SCHEDULE_MULTISTEP:
        for (k = 0; k < MNISTCU_MAX_MILESTONES && schedule->milestones[k] > 0; ++k) passed += schedule->milestones[k] <= t;
        return (float)(base * pow(g, (double)passed));
    case MNISTCU_SCHEDULE_EXPONENTIAL: return (float)(base * pow((double)schedule->gamma, (double)t));
    case MNISTCU_SCHEDULE_EXP_DECAY: return (float)(base * exp(-(double)schedule->decay * (double)t));
    case MNISTCU_SCHEDULE_ONE_CYCLE: {
        double pct = schedule->pct_start != 0.0f ? (double)schedule->pct_start : 0.3;
        double lo = base / (schedule->div_factor != 0.0f ? (double)schedule->div_factor : 25.0);
        double end = lo / (schedule->final_div_factor != 0.0f ? (double)schedule->final_div_factor : 1e4);
        double up = pct * (double)T - 1.0, top = (double)T - 1.0, a, b, f;
        if ((double)t <= up) a = lo, b = base, f = up > 0.0 ? (double)t / up : 1.0;
        else a = base, b = end, f = top > up ? ((double)t - up) / (top - up) : 1.0;
        return (float)(b + (a - b) / 2.0 * (cos(pi * f) + 1.0));
    }
    default: return lr; /* CONSTANT; PLATEAU moves with the validation loss, in mnistcu_train */
    }
}

/* ReduceLROnPlateau's state (mode min, relative threshold 1e-4, no cooldown):
   the best loss so far, the epochs since, the rate. */
typedef struct mnistcu__plateau { double best, lr; int bad; } mnistcu__plateau;

static void mnistcu__plateau_start(mnistcu__plateau *p, float lr)
{
    p->best = HUGE_VAL;
    p->lr = (double)lr;
    p->bad = 0;
}

/* After an epoch whose validation loss was metric: the rate for the next. */
static void mnistcu__plateau_step(mnistcu__plateau *p, const mnistcu_schedule_desc *s, double metric)
{
    double factor = s->factor != 0.0f ? (double)s->factor : 0.1, next;
    int patience = s->patience ? s->patience : 10;
    if (metric < p->best * (1.0 - 1e-4)) {
        p->best = metric;
        p->bad = 0;
    } else {
        p->bad++;
    }
    if (p->bad > patience) {
        next = MNISTCU__MAX(p->lr * factor, (double)s->min_lr);
        if (p->lr - next > 1e-8) p->lr = next;
        p->bad = 0;
    }
}

static mnistcu_result mnistcu__check_schedule(mnistcu_ctx *ctx, const mnistcu_schedule_desc *s, float lr)
{
    int k, ok = 1;
    if ((unsigned)s->kind > MNISTCU_SCHEDULE_PLATEAU || s->step_size < 0 || s->patience < 0 ||
        !(s->pct_start >= 0.0f && s->pct_start < 1.0f) || !(s->div_factor >= 0.0f && s->div_factor < FLT_MAX) ||
        !(s->final_div_factor >= 0.0f && s->final_div_factor < FLT_MAX) || !(s->factor >= 0.0f && s->factor < 1.0f) || !(s->gamma >= 0.0f && s->gamma <= 1.0f) ||
        !(s->min_lr >= 0.0f && s->min_lr <= lr) || !(s->decay >= 0.0f && s->decay < FLT_MAX) || s->warmup < 0 ||
        !(s->warmup_start >= 0.0f && s->warmup_start <= 1.0f) || (s->kind == MNISTCU_SCHEDULE_EXPONENTIAL && s->gamma == 0.0f))
        ok = 0;
    for (k = 0; k < MNISTCU_MAX_MILESTONES && ok; ++k)
        if (s->milestones[k] < 0 || (k > 0 && s->milestones[k] && s->milestones[k] <= s->milestones[k - 1]) ||
            (k > 0 && s->milestones[k] && !s->milestones[k - 1]))
            ok = 0;
    if (!ok)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "train: schedule kind %d, step_size %d, gamma %g (0..1; EXPONENTIAL needs one), min_lr %g "
                             "(0..the learning rate), decay %g, warmup %d, warmup_start %g (0..1) or milestones "
                             "(increasing, then 0) out of range", (int)s->kind, s->step_size, (double)s->gamma,
                             (double)s->min_lr, (double)s->decay, s->warmup, (double)s->warmup_start);
    return MNISTCU_OK;
}

/* One JSON number: null when it is not finite, as JSON has no NaN or infinity. */
static void mnistcu__json_num(FILE *f, const char *key, double v)
{
    if (v == v && v <= DBL_MAX && v >= -DBL_MAX) fprintf(f, ",\"%s\":%.9g", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

/* The training log's line for a report. */
static int mnistcu__log_line(FILE *f, const mnistcu_progress *p)
{
    fprintf(f, "{\"epoch\":%d,\"step\":%llu,\"steps\":%llu,\"epoch_end\":%s", p->epoch, MNISTCU__ULL(p->step),
            MNISTCU__ULL(p->steps), p->epoch_end ? "true" : "false");
    mnistcu__json_num(f, "lr", p->learning_rate);
    mnistcu__json_num(f, "train_loss", p->train_loss);
    mnistcu__json_num(f, "train_accuracy", p->train_accuracy);
    if (p->has_validation) {
        mnistcu__json_num(f, "val_loss", p->val_loss);
        mnistcu__json_num(f, "val_accuracy", p->val_accuracy);
    }
    mnistcu__json_num(f, "seconds", p->seconds);
    mnistcu__json_num(f, "images_per_second", p->images_per_second);
    fprintf(f, "}\n");
    return fflush(f) == 0 && !ferror(f);
}

/* >>checkpoint -----------------------------------------------------------------
   A checkpoint is a model file (kind "checkpoint") that also holds everything
   training needs to go on as if it had never stopped: the optimizer's state
   (mnistcu.optim_state) and the step count it was made with, the model's
   generator (mnistcu.rng: the next epoch's shuffle), the position in the epoch
   (its sample order, mnistcu.order, and the loss and correct count so far),
   the optimizer steps taken (dropout's and augmentation's counters), the
   plateau schedule's and early stopping's state with the best epoch's weights
   (mnistcu.best_params, mnistcu.best_buffers), the context's seed, and the
   training settings (train.optim, train.schedule, train.augment,
   train.settings: "name=value ..." of every field), which a resumed run must
   repeat: mnistcu_train refuses a resume whose settings, batch size, dataset
   size or seed differ, naming the difference. The epoch count may grow: the
   run then continues past the checkpoint's end (schedules that depend on the
   total, cosine and one-cycle, follow the new count from there on). Numbered
   copies (checkpoint_keep) are counted per mnistcu_train call: a resumed run
   does not remove the copies of the run before it. */
typedef struct mnistcu__field { const char *name; size_t off; char type; } mnistcu__field; /* type: i int, f float, z size_t */
#define MNISTCU__FIELD(st, f, t) {#f, offsetof(st, f), t}
static const mnistcu__field mnistcu__optim_fields[] = {
    MNISTCU__FIELD(mnistcu_optim_desc, kind, 'i'), MNISTCU__FIELD(mnistcu_optim_desc, learning_rate, 'f'),
    MNISTCU__FIELD(mnistcu_optim_desc, momentum, 'f'), MNISTCU__FIELD(mnistcu_optim_desc, nesterov, 'i'),
    MNISTCU__FIELD(mnistcu_optim_desc, weight_decay, 'f'), MNISTCU__FIELD(mnistcu_optim_desc, dampening, 'f'),
    MNISTCU__FIELD(mnistcu_optim_desc, beta1, 'f'), MNISTCU__FIELD(mnistcu_optim_desc, beta2, 'f'),
    MNISTCU__FIELD(mnistcu_optim_desc, eps, 'f'), MNISTCU__FIELD(mnistcu_optim_desc, amsgrad, 'i'),
    MNISTCU__FIELD(mnistcu_optim_desc, alpha, 'f'), MNISTCU__FIELD(mnistcu_optim_desc, centered, 'i'),
    MNISTCU__FIELD(mnistcu_optim_desc, lr_decay, 'f'), MNISTCU__FIELD(mnistcu_optim_desc, initial_accumulator_value, 'f'),
    MNISTCU__FIELD(mnistcu_optim_desc, l2, 'f'), MNISTCU__FIELD(mnistcu_optim_desc, clip_norm, 'f'), {NULL, 0, 0}};
static const mnistcu__field mnistcu__schedule_fields[] = {
    MNISTCU__FIELD(mnistcu_schedule_desc, kind, 'i'), MNISTCU__FIELD(mnistcu_schedule_desc, step_size, 'i'),
    MNISTCU__FIELD(mnistcu_schedule_desc, gamma, 'f'), MNISTCU__FIELD(mnistcu_schedule_desc, min_lr, 'f'),
    {"milestone0", offsetof(mnistcu_schedule_desc, milestones) + 0 * sizeof(int), 'i'},
    {"milestone1", offsetof(mnistcu_schedule_desc, milestones) + 1 * sizeof(int), 'i'},
    {"milestone2", offsetof(mnistcu_schedule_desc, milestones) + 2 * sizeof(int), 'i'},
    {"milestone3", offsetof(mnistcu_schedule_desc, milestones) + 3 * sizeof(int), 'i'},
    {"milestone4", offsetof(mnistcu_schedule_desc, milestones) + 4 * sizeof(int), 'i'},
    {"milestone5", offsetof(mnistcu_schedule_desc, milestones) + 5 * sizeof(int), 'i'},
    {"milestone6", offsetof(mnistcu_schedule_desc, milestones) + 6 * sizeof(int), 'i'},
    {"milestone7", offsetof(mnistcu_schedule_desc, milestones) + 7 * sizeof(int), 'i'},
    MNISTCU__FIELD(mnistcu_schedule_desc, decay, 'f'), MNISTCU__FIELD(mnistcu_schedule_desc, warmup, 'i'),
    MNISTCU__FIELD(mnistcu_schedule_desc, warmup_start, 'f'), MNISTCU__FIELD(mnistcu_schedule_desc, per_step, 'i'),
    MNISTCU__FIELD(mnistcu_schedule_desc, pct_start, 'f'), MNISTCU__FIELD(mnistcu_schedule_desc, div_factor, 'f'),
    MNISTCU__FIELD(mnistcu_schedule_desc, final_div_factor, 'f'), MNISTCU__FIELD(mnistcu_schedule_desc, patience, 'i'),
    MNISTCU__FIELD(mnistcu_schedule_desc, factor, 'f'), {NULL, 0, 0}};
static const mnistcu__field mnistcu__augment_fields[] = {
    MNISTCU__FIELD(mnistcu_augment_desc, rotate, 'f'), MNISTCU__FIELD(mnistcu_augment_desc, scale, 'f'),
    MNISTCU__FIELD(mnistcu_augment_desc, translate, 'f'), MNISTCU__FIELD(mnistcu_augment_desc, elastic_alpha, 'f'),
    MNISTCU__FIELD(mnistcu_augment_desc, elastic_sigma, 'f'), {NULL, 0, 0}};
static const mnistcu__field mnistcu__train_fields[] = {
    MNISTCU__FIELD(mnistcu_train_desc, epochs, 'i'), MNISTCU__FIELD(mnistcu_train_desc, batch_size, 'i'),
    MNISTCU__FIELD(mnistcu_train_desc, no_shuffle, 'i'), MNISTCU__FIELD(mnistcu_train_desc, early_stop, 'i'),
    MNISTCU__FIELD(mnistcu_train_desc, keep_last, 'i'), MNISTCU__FIELD(mnistcu_train_desc, no_divergence_check, 'i'),
    {NULL, 0, 0}};
#undef MNISTCU__FIELD

/* "name=value name=value ..." of a struct's fields (floats as their shortest exact decimal). */
static void mnistcu__fields_text(const mnistcu__field *f, const void *st, char *out, size_t size)
{
    size_t len = 0;
    out[0] = 0;
    for (; f->name; ++f) {
        const char *p = (const char *)st + f->off;
        char num[40];
        if (f->type == 'f') {
            float v;
            memcpy(&v, p, sizeof v);
            mnistcu__float_text(v, num, sizeof num);
        } else if (f->type == 'i') {
            int v;
            memcpy(&v, p, sizeof v);
            snprintf(num, sizeof num, "%d", v);
        } else {
            size_t v;
            memcpy(&v, p, sizeof v);
            snprintf(num, sizeof num, "%llu", MNISTCU__ULL(v));
        }
        mnistcu__cat(out, size, &len, "%s%s=%s", len ? " " : "", f->name, num);
    }
}

/* The inverse: 0 when a token is malformed or names no field. */
static int mnistcu__fields_parse(const mnistcu__field *fields, const char *text, void *st)
{
    const char *p = text;
    while (*p) {
        const mnistcu__field *f;
        const char *eq = strchr(p, '='), *end;
        char *stop;
        size_t nlen;
        if (!eq) return 0;
        nlen = (size_t)(eq - p);
        for (f = fields; f->name; ++f)
            if (strlen(f->name) == nlen && !strncmp(p, f->name, nlen)) break;
        if (!f->name) return 0;
        end = strchr(eq, ' ');
        if (!end) end = eq + strlen(eq);
        if (f->type == 'f') {
            int ok = 0;
            float v = mnistcu__parse_float_text(eq + 1, end, &ok);
            if (!ok) return 0;
            memcpy((char *)st + f->off, &v, sizeof v);
        } else {
            long long v = strtoll(eq + 1, &stop, 10);
            if (stop != end || stop == eq + 1 || v < 0 || (f->type == 'i' && v > 2147483647)) return 0;
            if (f->type == 'i') {
                int iv = (int)v;
                memcpy((char *)st + f->off, &iv, sizeof iv);
            } else {
                size_t zv = (size_t)v;
                memcpy((char *)st + f->off, &zv, sizeof zv);
            }
        }
        p = *end ? end + 1 : end;
    }
    return 1;
}

/* Where training stands, for a checkpoint. */
typedef struct mnistcu__train_state {
    int epoch;              /* the epoch in progress or just ended (1-based) */
    size_t step, steps;     /* steps done in it; per epoch */
    size_t total_steps;
    double loss_sum;        /* the epoch so far */
    int64_t correct;
    size_t seen;
    double seconds;
    mnistcu__plateau plateau;
    int best_epoch, since_best;
    double best_val_loss;
    const uint32_t *order;  /* the epoch's sample order, when inside it */
    size_t n;               /* samples */
    uint64_t seed;
} mnistcu__train_state;

static mnistcu_result mnistcu__checkpoint_write(mnistcu_model *m, const mnistcu_train_desc *d,
                                                const mnistcu_optim_desc *o, const mnistcu__train_state *ts,
                                                const float *best_params, const float *best_buffers, const char *path)
{
    char optim[1024], sched[1024], aug[512], settings[512], pos[512], plateau[256], best[256], misc[256];
    const char *mk[9], *mv[9];
    mnistcu__st_out ex[5];
    float *state = NULL, *bp = NULL, *bb = NULL;
    uint64_t rng[4];
    mnistcu_result r = MNISTCU_OK;
    int nx = 0, k;
    size_t len = 0;
    mnistcu__fields_text(mnistcu__optim_fields, o, optim, sizeof optim);
    mnistcu__fields_text(mnistcu__schedule_fields, &d->schedule, sched, sizeof sched);
    mnistcu__fields_text(mnistcu__augment_fields, &d->augment, aug, sizeof aug);
    mnistcu__fields_text(mnistcu__train_fields, d, settings, sizeof settings);
    mnistcu__cat(pos, sizeof pos, &len, "epoch=%d step=%llu steps=%llu total_steps=%llu model_steps=%llu state_sig=%d "
                 "state_steps=%llu samples=%llu seen=%llu correct=%lld loss_sum=%.17g seconds=%.17g", ts->epoch,
                 MNISTCU__ULL(ts->step), MNISTCU__ULL(ts->steps), MNISTCU__ULL(ts->total_steps), MNISTCU__ULL(m->steps),
                 m->state_sig, MNISTCU__ULL(m->state_steps), MNISTCU__ULL(ts->n), MNISTCU__ULL(ts->seen),
                 (long long)ts->correct, ts->loss_sum, ts->seconds);
    snprintf(plateau, sizeof plateau, "best=%.17g lr=%.17g bad=%d", ts->plateau.best, ts->plateau.lr, ts->plateau.bad);
    snprintf(best, sizeof best, "best_epoch=%d since_best=%d best_val_loss=%.17g", ts->best_epoch, ts->since_best,
             ts->best_val_loss);
    snprintf(misc, sizeof misc, "%llu", MNISTCU__ULL(ts->seed));
    mk[0] = "train.optim"; mv[0] = optim;
    mk[1] = "train.schedule"; mv[1] = sched;
    mk[2] = "train.augment"; mv[2] = aug;
    mk[3] = "train.settings"; mv[3] = settings;
    mk[4] = "train.position"; mv[4] = pos;
    mk[5] = "train.plateau"; mv[5] = plateau;
    mk[6] = "train.best"; mv[6] = best;
    mk[7] = "train.seed"; mv[7] = misc;
    memset(ex, 0, sizeof ex);
    if (m->state_floats && m->state_sig) {
        state = (float *)mnistcu__alloc(m->ctx, m->state_floats * sizeof(float));
        if (!state || (r = mnistcu__model_copy(m, state, m->state, m->state_floats * sizeof(float), 0))) goto done;
        ex[nx].name = "mnistcu.optim_state";
        ex[nx].dtype = MNISTCU__ST_F32;
        ex[nx].ndim = 1;
        ex[nx].shape[0] = (int64_t)m->state_floats;
        ex[nx].data = state;
        ex[nx++].count = m->state_floats;
    }
    for (k = 0; k < 4; ++k) rng[k] = m->rng.s[k];
    ex[nx].name = "mnistcu.rng";
    ex[nx].dtype = MNISTCU__ST_I64;
    ex[nx].ndim = 1;
    ex[nx].shape[0] = 4;
    ex[nx].data = rng;
    ex[nx++].count = 4;
    if (ts->order && ts->step < ts->steps) {
        ex[nx].name = "mnistcu.order";
        ex[nx].dtype = MNISTCU__ST_U32;
        ex[nx].ndim = 1;
        ex[nx].shape[0] = (int64_t)ts->n;
        ex[nx].data = ts->order;
        ex[nx++].count = ts->n;
    }
    if (best_params) {
        bp = (float *)mnistcu__alloc(m->ctx, m->num_params * sizeof(float));
        if (!bp || (r = mnistcu__model_copy(m, bp, best_params, m->num_params * sizeof(float), 0))) goto done;
        ex[nx].name = "mnistcu.best_params";
        ex[nx].dtype = MNISTCU__ST_F32;
        ex[nx].ndim = 1;
        ex[nx].shape[0] = (int64_t)m->num_params;
        ex[nx].data = bp;
        ex[nx++].count = m->num_params;
    }
    if (best_buffers && m->num_buffers) {
        bb = (float *)mnistcu__alloc(m->ctx, m->num_buffers * sizeof(float));
        if (!bb || (r = mnistcu__model_copy(m, bb, best_buffers, m->num_buffers * sizeof(float), 0))) goto done;
        ex[nx].name = "mnistcu.best_buffers";
        ex[nx].dtype = MNISTCU__ST_F32;
        ex[nx].ndim = 1;
        ex[nx].shape[0] = (int64_t)m->num_buffers;
        ex[nx].data = bb;
        ex[nx++].count = m->num_buffers;
    }
    mk[8] = "note"; /* the caller's own text (the CLI's data options) */
    mv[8] = d->checkpoint_note;
    r = mnistcu__model_save(m, path, "checkpoint", ex, nx, mk, mv, d->checkpoint_note ? 9 : 8);
done:
    if (!r && ((state == NULL && m->state_floats && m->state_sig) || (best_params && !bp) ||
               (best_buffers && m->num_buffers && !bb)))
        r = mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
    mnistcu__free(m->ctx, state);
    mnistcu__free(m->ctx, bp);
    mnistcu__free(m->ctx, bb);
    return r;
}

/* "key=value" of a space-separated list, as a double; 0 when absent or malformed. */
static int mnistcu__kv(const char *text, const char *key, double *v)
{
    size_t klen = strlen(key);
    const char *p = text;
    while (p && *p) {
        if (!strncmp(p, key, klen) && p[klen] == '=') {
            char *end;
            *v = strtod(p + klen + 1, &end);
            return end != p + klen + 1 && (*end == ' ' || *end == 0); /* NaN and inf too: the caller checks */
        }
        p = strchr(p, ' ');
        if (p) ++p;
    }
    return 0;
}

/* The same for a whole number in 0..max (no fraction, no sign, finite). */
static int mnistcu__kv_uint(const char *text, const char *key, double max, double *v)
{
    return mnistcu__kv(text, key, v) && *v >= 0.0 && *v <= max && *v == floor(*v);
}

/* The tensors of m from a parsed file (strict, as for loading a model). */
static mnistcu_result mnistcu__st_load_tensors(mnistcu_model *m, const mnistcu__st_file *f, const char *what);

/* Restores m and the training state from the checkpoint at d->resume_from. order: [n] filled when the
   checkpoint is inside an epoch; best_params/best_buffers: early stopping's copies, filled when saved. */
static mnistcu_result mnistcu__checkpoint_resume(mnistcu_model *m, const mnistcu_train_desc *d,
                                                 const mnistcu_optim_desc *o, size_t n, size_t steps,
                                                 mnistcu__train_state *ts, uint32_t *order, float *best_params,
                                                 float *best_buffers)
{
    mnistcu_ctx *ctx = m->ctx;
    const char *path = d->resume_from, *v;
    mnistcu__st_file f;
    mnistcu_train_desc now, then;
    char a[1024], b[1024], spec[2048];
    const mnistcu__st_tensor *t;
    mnistcu_result r;
    double x[12];
    int k;
    memset(ts, 0, sizeof *ts);
    if ((r = mnistcu__st_read(ctx, path, &f))) return r;
#define MNISTCU__RESUME_FAIL(code, ...)            \
    do {                                           \
        r = mnistcu__fail(ctx, code, __VA_ARGS__); \
        goto done;                                 \
    } while (0)
    v = mnistcu__st_meta(&f, "kind");
    if (!v || strcmp(v, "checkpoint") != 0)
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_METADATA, "resume: %.300s is not a checkpoint (kind \"%.20s\")", path,
                             v ? v : "none");
    if ((r = mnistcu_model_spec(m, spec, sizeof spec))) goto done;
    v = mnistcu__st_meta(&f, "spec");
    if (!v || strcmp(v, spec) != 0)
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_SHAPE, "resume: %.300s holds the model \"%.300s\", this one is \"%.300s\"",
                             path, v ? v : "?", spec);
#define MNISTCU__SAME(key, fields, st, what_)                                                                    \
    mnistcu__fields_text(fields, st, a, sizeof a);                                                               \
    v = mnistcu__st_meta(&f, key);                                                                               \
    if (!v || strcmp(v, a) != 0)                                                                                 \
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_INVALID_ARGUMENT,                                                       \
                             "resume: the %s differ from the checkpoint's: now \"%.300s\", then \"%.300s\"", what_, \
                             a, v ? v : "(none)");
    MNISTCU__SAME("train.optim", mnistcu__optim_fields, o, "optimizer settings")
    MNISTCU__SAME("train.schedule", mnistcu__schedule_fields, &d->schedule, "schedule settings")
    MNISTCU__SAME("train.augment", mnistcu__augment_fields, &d->augment, "augmentation settings")
#undef MNISTCU__SAME
    /* every setting but the epoch count, which may grow */
    memset(&then, 0, sizeof then);
    v = mnistcu__st_meta(&f, "train.settings");
    if (!v || !mnistcu__fields_parse(mnistcu__train_fields, v, &then))
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_METADATA, "resume: %.300s: train.settings missing or malformed", path);
    now = *d;
    now.epochs = then.epochs;
    mnistcu__fields_text(mnistcu__train_fields, &now, a, sizeof a);
    mnistcu__fields_text(mnistcu__train_fields, &then, b, sizeof b);
    if (strcmp(a, b) != 0)
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_INVALID_ARGUMENT,
                             "resume: the training settings differ from the checkpoint's: now \"%s\", then \"%s\"", a, b);
    v = mnistcu__st_meta(&f, "train.seed");
    if (!v || strtoull(v, NULL, 10) != ctx->desc.seed)
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_INVALID_ARGUMENT,
                             "resume: the checkpoint was made with seed %.30s; create the context with that seed (this "
                             "one has %llu)", v ? v : "?", MNISTCU__ULL(ctx->desc.seed));
    v = mnistcu__st_meta(&f, "train.position");
    if (!v || !mnistcu__kv_uint(v, "epoch", 2147483647.0, &x[0]) || !mnistcu__kv_uint(v, "step", 4e15, &x[1]) ||
        !mnistcu__kv_uint(v, "steps", 4e15, &x[2]) || !mnistcu__kv_uint(v, "total_steps", 4e15, &x[3]) ||
        !mnistcu__kv_uint(v, "model_steps", 4e15, &x[4]) || !mnistcu__kv_uint(v, "state_sig", 1e6, &x[5]) ||
        !mnistcu__kv_uint(v, "state_steps", 4e15, &x[6]) || !mnistcu__kv_uint(v, "samples", 4294967295.0, &x[7]) ||
        !mnistcu__kv_uint(v, "seen", 4e15, &x[8]) || !mnistcu__kv_uint(v, "correct", 4e15, &x[9]) ||
        !mnistcu__kv(v, "loss_sum", &x[10]) || !mnistcu__kv(v, "seconds", &x[11]) || x[0] < 1 || x[1] > x[2] ||
        x[9] > x[8] || !(x[11] >= 0.0 && x[11] < 1e15))
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_METADATA, "resume: %.300s: train.position missing or malformed", path);
    if ((size_t)x[7] != n || (size_t)x[2] != steps)
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_INVALID_ARGUMENT,
                             "resume: the checkpoint trained on %.0f samples in %.0f steps per epoch, now %lu in %lu: "
                             "give the same training set and batch size", x[7], x[2], (unsigned long)n,
                             (unsigned long)steps);
    ts->epoch = (int)x[0];
    ts->step = (size_t)x[1];
    ts->steps = steps;
    ts->total_steps = (size_t)x[3];
    ts->seen = (size_t)x[8];
    ts->correct = (int64_t)x[9];
    ts->loss_sum = x[10];
    ts->seconds = x[11];
    ts->n = n;
    v = mnistcu__st_meta(&f, "train.plateau");
    if (!v || !mnistcu__kv(v, "best", &ts->plateau.best) || !mnistcu__kv(v, "lr", &ts->plateau.lr) ||
        !mnistcu__kv_uint(v, "bad", 2147483647.0, &x[0]) || !mnistcu__finite_d(ts->plateau.lr))
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_METADATA, "resume: %.300s: train.plateau missing or malformed", path);
    ts->plateau.bad = (int)x[0];
    v = mnistcu__st_meta(&f, "train.best");
    if (!v || !mnistcu__kv_uint(v, "best_epoch", 2147483647.0, &x[0]) ||
        !mnistcu__kv_uint(v, "since_best", 2147483647.0, &x[1]) || !mnistcu__kv(v, "best_val_loss", &ts->best_val_loss))
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_METADATA, "resume: %.300s: train.best missing or malformed", path);
    ts->best_epoch = (int)x[0];
    ts->since_best = (int)x[1];
    /* the weights, then the optimizer's state in the layout o makes */
    if ((r = mnistcu__st_load_tensors(m, &f, path))) goto done;
    m->state_sig = 0;
    if ((int)x[5] != 0) { /* the optimizer had a state (of no floats for plain SGD) */
        if ((r = mnistcu__opt_state(m, o))) goto done;
        t = mnistcu__st_find(&f, "mnistcu.optim_state");
        if (m->state_sig != (int)x[5] ||
            (m->state_floats && (!t || t->dtype != MNISTCU__ST_F32 || t->count != m->state_floats)) ||
            (!m->state_floats && t))
            MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_TENSORS, "resume: %.300s: the optimizer state does not fit the optimizer",
                                 path);
        if (m->state_floats) {
            float *host = (float *)mnistcu__alloc(ctx, m->state_floats * sizeof(float));
            if (!host) MNISTCU__RESUME_FAIL(MNISTCU_ERR_OUT_OF_MEMORY, "resume: out of memory");
            mnistcu__le_copy(host, f.data + t->begin, m->state_floats, 4);
            r = mnistcu__model_copy(m, m->state, host, m->state_floats * sizeof(float), 1);
            mnistcu__free(ctx, host);
            if (r) goto done;
        }
    }
    m->steps = (uint64_t)x[4];
    m->state_steps = (uint64_t)x[6];
    t = mnistcu__st_find(&f, "mnistcu.rng");
    if (!t || t->dtype != MNISTCU__ST_I64 || t->count != 4)
        MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_TENSORS, "resume: %.300s: mnistcu.rng missing", path);
    mnistcu__le_copy(m->rng.s, f.data + t->begin, 4, 8);
    if (ts->step < steps) {
        size_t i;
        t = mnistcu__st_find(&f, "mnistcu.order");
        if (!t || t->dtype != MNISTCU__ST_U32 || t->count != n)
            MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_TENSORS, "resume: %.300s: mnistcu.order missing", path);
        mnistcu__le_copy(order, f.data + t->begin, n, 4);
        { /* a permutation of 0..n-1: each index once */
            unsigned char *seen = (unsigned char *)mnistcu__calloc(ctx, n);
            int bad = 0;
            if (!seen) MNISTCU__RESUME_FAIL(MNISTCU_ERR_OUT_OF_MEMORY, "resume: out of memory");
            for (i = 0; i < n && !bad; ++i) {
                bad = order[i] >= n || seen[order[i]];
                if (!bad) seen[order[i]] = 1;
            }
            mnistcu__free(ctx, seen);
            if (bad)
                MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_SHAPE, "resume: %.300s: the sample order is not a permutation", path);
        }
    }
    for (k = 0; k < 2; ++k) {
        float *dst = k ? best_buffers : best_params;
        size_t cnt = k ? m->num_buffers : m->num_params;
        t = mnistcu__st_find(&f, k ? "mnistcu.best_buffers" : "mnistcu.best_params");
        if (!dst || !t || !cnt) continue;
        if (t->dtype != MNISTCU__ST_F32 || t->count != cnt)
            MNISTCU__RESUME_FAIL(MNISTCU_ERR_ST_TENSORS, "resume: %.300s: %s has the wrong size", path, t->name);
        {
            float *host = (float *)mnistcu__alloc(ctx, cnt * sizeof(float));
            if (!host) MNISTCU__RESUME_FAIL(MNISTCU_ERR_OUT_OF_MEMORY, "resume: out of memory");
            mnistcu__le_copy(host, f.data + t->begin, cnt, 4);
            r = mnistcu__model_copy(m, dst, host, cnt * sizeof(float), 1);
            mnistcu__free(ctx, host);
            if (r) goto done;
        }
    }
    r = MNISTCU_OK;
done:
#undef MNISTCU__RESUME_FAIL
    mnistcu__st_free(ctx, &f);
    return r;
}

/* STEM-SUFFIX.safetensors for PATH = STEM.safetensors (or STEM). */
static int mnistcu__checkpoint_name(const char *path, const char *suffix, char *out, size_t size)
{
    size_t len = strlen(path);
    if (len >= 12 && !strcmp(path + len - 12, ".safetensors")) len -= 12;
    return snprintf(out, size, "%.*s-%s.safetensors", (int)len, path, suffix) < (int)size;
}

MNISTCU_DEF mnistcu_result mnistcu_checkpoint_info_get(mnistcu_ctx *ctx, const char *path, mnistcu_checkpoint_info *info)
{
    mnistcu__st_file f;
    mnistcu_result r;
    const char *v;
    double x[4];
    if (!ctx) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!path || !info) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "checkpoint_info: NULL argument");
    memset(info, 0, sizeof *info);
    if ((r = mnistcu__st_read(ctx, path, &f))) return r;
    v = mnistcu__st_meta(&f, "kind");
    if (!v || strcmp(v, "checkpoint") != 0) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s is not a checkpoint", path);
        goto done;
    }
    v = mnistcu__st_meta(&f, "train.position");
    if (!v || !mnistcu__kv_uint(v, "epoch", 2147483647.0, &x[0]) || !mnistcu__kv_uint(v, "step", 4e15, &x[1]) ||
        !mnistcu__kv_uint(v, "steps", 4e15, &x[2]) || !mnistcu__kv_uint(v, "total_steps", 4e15, &x[3]) ||
        !mnistcu__fields_parse(mnistcu__train_fields,
                                                                         mnistcu__st_meta(&f, "train.settings")
                                                                             ? mnistcu__st_meta(&f, "train.settings") : "?",
                                                                         &info->train) ||
        !mnistcu__fields_parse(mnistcu__optim_fields, mnistcu__st_meta(&f, "train.optim") ? mnistcu__st_meta(&f, "train.optim") : "?",
                               &info->train.optim) ||
        !mnistcu__fields_parse(mnistcu__schedule_fields,
                               mnistcu__st_meta(&f, "train.schedule") ? mnistcu__st_meta(&f, "train.schedule") : "?",
                               &info->train.schedule) ||
        !mnistcu__fields_parse(mnistcu__augment_fields,
                               mnistcu__st_meta(&f, "train.augment") ? mnistcu__st_meta(&f, "train.augment") : "?",
                               &info->train.augment) ||
        !mnistcu__st_meta(&f, "train.seed") || !mnistcu__st_meta(&f, "spec")) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_ST_METADATA, "%.300s: the training metadata is missing or malformed", path);
        goto done;
    }
    info->epoch = (int)x[0];
    info->step = (size_t)x[1];
    info->steps = (size_t)x[2];
    info->total_steps = (size_t)x[3];
    info->seed = strtoull(mnistcu__st_meta(&f, "train.seed"), NULL, 10);
    snprintf(info->spec, sizeof info->spec, "%s", mnistcu__st_meta(&f, "spec"));
    v = mnistcu__st_meta(&f, "note");
    snprintf(info->note, sizeof info->note, "%s", v ? v : "");
done:
    mnistcu__st_free(ctx, &f);
    return r;
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
    if (d.schedule.kind == MNISTCU_SCHEDULE_DEFAULT) d.schedule.kind = MNISTCU_SCHEDULE_CONSTANT;
    if (d.schedule.kind == MNISTCU_SCHEDULE_STEP && d.schedule.step_size == 0) d.schedule.step_size = 1;
    if ((d.schedule.kind == MNISTCU_SCHEDULE_STEP || d.schedule.kind == MNISTCU_SCHEDULE_MULTISTEP) &&
        d.schedule.gamma == 0.0f)
        d.schedule.gamma = 0.1f;
    if (d.schedule.warmup > 0 && d.schedule.warmup_start == 0.0f) d.schedule.warmup_start = 0.1f;
    *out = d;
}

static mnistcu_result mnistcu__check_dataset(const mnistcu_model *m, const mnistcu_dataset *ds, const char *what)
{
    if (!ds) return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: dataset is NULL", what);
    if (ds->ctx != m->ctx)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "%s: dataset and model belong to different contexts",
                             what);
    if (ds->features != m->inputs)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_SHAPE, "%s: samples have %lu features, the model takes %lu inputs", what,
                             (unsigned long)ds->features, (unsigned long)m->inputs);
    if ((size_t)ds->num_classes > m->classes)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_SHAPE, "%s: dataset has %d classes, the model outputs %lu", what,
                             ds->num_classes, (unsigned long)m->classes);
    if (ds->targets && ds->target_dim != m->classes)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_SHAPE, "%s: dataset has %lu targets per sample, the model outputs %lu",
                             what, (unsigned long)ds->target_dim, (unsigned long)m->classes);
    if (ds->targets && m->loss == MNISTCU_LOSS_HINGE)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "%s: the hinge loss needs class labels; this dataset has float targets", what);
    return MNISTCU_OK;
}

/* Whether training reports (progress, log line, checkpoint, the epoch's end)
   after 0-based step `step` of `steps`: where the host must look at the GPU. */
/* A per-step schedule's rate at step s (0-based) of epoch `epoch` (1-based), `steps` an epoch. */
static float mnistcu__step_lr(const mnistcu_train_desc *d, int epoch, size_t steps, size_t s)
{
    return mnistcu_schedule_lr(&d->schedule, d->optim.learning_rate, (int)((size_t)(epoch - 1) * steps + s),
                               (int)(steps * (size_t)d->epochs));
}

static int mnistcu__report_due(const mnistcu_train_desc *d, int logging, size_t step, size_t steps)
{
    return step + 1 == steps || (d->progress && d->progress_every && (step + 1) % d->progress_every == 0) ||
           (logging && d->log_every && (step + 1) % d->log_every == 0) ||
           (d->checkpoint_path && d->checkpoint_every_steps && (step + 1) % d->checkpoint_every_steps == 0);
}

#ifdef __CUDACC__
/* Steps [step, end) of an epoch in the fused MLP kernel, each step's optimizer
   scalars made as mnistcu__update makes them; o's rate ends as the last step's. */
static mnistcu_result mnistcu__fused_chunk(mnistcu_model *m, const mnistcu_dataset *ds, const mnistcu__fused_plan *pl,
                                           const mnistcu_train_desc *d, mnistcu_optim_desc *o, int epoch, size_t steps,
                                           size_t n, size_t step, size_t end)
{
    size_t s, nops = end - step;
    mnistcu__opt *ops;
    mnistcu_result r;
    if ((r = mnistcu__opt_state(m, o))) return r;
    ops = (mnistcu__opt *)mnistcu__alloc(m->ctx, (end - step) * sizeof *ops);
    if (!ops) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "train: out of memory for %lu steps",
                                   (unsigned long)(end - step));
    if (d->schedule.per_step) {
        for (s = step; s < end; ++s) {
            o->learning_rate = mnistcu__step_lr(d, epoch, steps, s);
            mnistcu__opt_make(o, m->state_steps + 1 + (s - step), m->num_params, &ops[s - step], &m->opt_memo);
        }
    } else
        nops = mnistcu__opt_steps(o, m->state_steps + 1, end - step, m->num_params, ops, &m->opt_memo);
    m->steps += end - step;
    m->state_steps += end - step;
    m->batch_targets = 0;
    r = mnistcu__cuda_fused_steps(m, ds, pl, ops, nops, (size_t)d->batch_size, n, step, end - step);
    mnistcu__free(m->ctx, ops);
    return r;
}
#endif

/* A training step up to the optimizer's: the batch, the forward pass, the loss, the gradients. */
static mnistcu_result mnistcu__train_grads(mnistcu_model *m, const mnistcu_dataset *ds, const uint32_t *idx, size_t B,
                                           size_t b, size_t step, const mnistcu__aug *aug, mnistcu__stats *st)
{
    mnistcu_result r;
#ifdef __CUDACC__
    int head = m->device == MNISTCU_DEVICE_CUDA ? mnistcu__cuda_head_layer(m) : -1;
    if (head >= 0) { /* the last layer, the loss and the statistics in one kernel (>>cuda_head) */
        if ((r = mnistcu__gather(m, ds, idx, step * B, b, aug))) return r;
        return mnistcu__cuda_head_step(m, head, b, step);
    }
#endif
    if ((r = mnistcu__gather(m, ds, idx, step * B, b, aug)) || (r = mnistcu__forward(m, b))) return r;
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA && b <= MNISTCU__LOSS_STATS_ROWS) { /* one launch for both */
        if ((r = mnistcu__cuda_loss_stats(m, b, step))) return r;
    } else
#endif
    if ((r = mnistcu__loss(m, b, 1)) || (r = mnistcu__step_stats(m, b, step, st)))
        return r;
    return mnistcu__backward(m, b);
}

/* One step of b samples at position step of the epoch, its kernels launched one by one. */
static mnistcu_result mnistcu__train_step(mnistcu_model *m, const mnistcu_dataset *ds, const uint32_t *idx, size_t B,
                                          size_t b, size_t step, const mnistcu__aug *aug, mnistcu__stats *st,
                                          const mnistcu_optim_desc *o)
{
    mnistcu_result r;
    int i;
    if ((r = mnistcu__update_plan(m, o, b))) return r;
    r = mnistcu__train_grads(m, ds, idx, B, b, step, aug, st);
    if (!r) r = mnistcu__update(m, o);
    if (r) { /* no mark of a fused step left for another update to trust */
        m->upd_on = 0;
        for (i = 0; i < m->num_layers; ++i) m->layers[i].upd_done = 0;
    } else if (b != m->upd_warm[0] && b != m->upd_warm[1]) { /* the last two batch sizes that completed */
        m->upd_warm[1] = m->upd_warm[0];
        m->upd_warm[0] = b;
    }
    return r;
}

#ifdef __CUDACC__
/* What a training step's host code changes besides launching kernels, applied
   for a step replayed from its graph (see >>cuda_graph): as mnistcu__forward
   (batch norm counts the batch, dropout notes the step) then mnistcu__update. */
static void mnistcu__step_host_effects(mnistcu_model *m, const mnistcu__step_graph *g)
{
    int i;
    for (i = 0; i < m->num_layers; ++i) {
        mnistcu__layer *L = &m->layers[i];
        if (L->passthrough) continue;
        if (L->d.kind == MNISTCU_LAYER_BATCHNORM) {
            L->batches++;
            L->trained = 1;
        }
        if (L->d.kind == MNISTCU_LAYER_DROPOUT) {
            L->step = m->steps;
            L->trained = 1;
        }
    }
    m->scratch_layer = g->scratch_layer; /* as the step's host code leaves them */
    m->scratch_batch = g->scratch_batch;
    m->batch_targets = g->batch_targets;
    m->steps++;
    m->state_steps++;
    m->upd_steps += (uint64_t)g->upd;
}

/* The host state mnistcu__step_host_effects changes, to undo a failed capture's. */
typedef struct mnistcu__host_saved {
    uint64_t steps, state_steps, upd_steps, step[MNISTCU_MAX_MODEL_LAYERS];
    int64_t batches[MNISTCU_MAX_MODEL_LAYERS];
} mnistcu__host_saved;

static void mnistcu__host_save(const mnistcu_model *m, mnistcu__host_saved *h, int restore)
{
    int i;
    mnistcu_model *w = (mnistcu_model *)m;
    for (i = 0; i < m->num_layers && i < MNISTCU_MAX_MODEL_LAYERS; ++i) {
        if (restore) {
            w->layers[i].step = h->step[i];
            w->layers[i].batches = h->batches[i];
        } else {
            h->step[i] = m->layers[i].step;
            h->batches[i] = m->layers[i].batches;
        }
    }
    if (restore) {
        w->steps = h->steps;
        w->state_steps = h->state_steps;
        w->upd_steps = h->upd_steps;
    } else {
        h->steps = m->steps;
        h->state_steps = m->state_steps;
        h->upd_steps = m->upd_steps;
    }
}

/* Steps [step, end) of an epoch, each replayed from the captured graph of its
   batch size where there is one (see >>cuda_graph), else launched (the first
   step of a size, which the next one's capture follows). *graphed counts the
   steps replayed; *off becomes 1 when a capture failed (the caller runs launched
   from then on). o's rate ends as the last step's. */
static mnistcu_result mnistcu__graph_chunk(mnistcu_model *m, const mnistcu_dataset *ds, const uint32_t *idx,
                                           const mnistcu_train_desc *d, mnistcu_optim_desc *o, const mnistcu__aug *aug,
                                           mnistcu__stats *st, int epoch, size_t steps, size_t n, size_t step,
                                           size_t end, size_t *graphed, int *off)
{
    size_t B = (size_t)d->batch_size, s, k;
    mnistcu__dyn *h;
    mnistcu_result r;
    float lr = o->learning_rate;
    if ((r = mnistcu__opt_state(m, o))) return r; /* before the scalars: a new state restarts its step count */
    h = (mnistcu__dyn *)mnistcu__calloc(m->ctx, (end - step) * sizeof *h);
    if (!h) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "train: out of memory for %lu steps",
                                 (unsigned long)(end - step));
    for (s = step, k = 0; s < end; ++s, ++k) {
        if (d->schedule.per_step)
            o->learning_rate = mnistcu__step_lr(d, epoch, steps, s);
        mnistcu__opt_make(o, m->state_steps + k + 1, m->num_params, &h[k].opt, &m->opt_memo);
        h[k].step = m->steps + k;
        h[k].offset = s * B;
        h[k].slot = s;
    }
    o->learning_rate = lr;
    {
        mnistcu__attempt at;
        mnistcu__attempt_begin(m->ctx, &at);
        r = mnistcu__cuda_dyn_upload(m, h, end - step, steps);
        mnistcu__attempt_end(m->ctx);
        if (r == MNISTCU_ERR_OUT_OF_MEMORY) { /* no room for the graphs' values: this call runs launched */
            mnistcu__log(m->ctx, MNISTCU_LOG_INFO, "train: %s: the steps run launched, not from CUDA graphs",
                         m->ctx->error);
            mnistcu__attempt_undo(m->ctx, &at);
            *off = 1;
            mnistcu__free(m->ctx, h);
            o->learning_rate = lr;
            r = MNISTCU_OK;
            for (s = step; s < end && !r; ++s) {
                if (d->schedule.per_step)
                    o->learning_rate = mnistcu__step_lr(d, epoch, steps, s);
                r = mnistcu__train_step(m, ds, idx, B, MNISTCU__MIN(B, n - s * B), s, aug, st, o);
            }
            return r;
        }
    }
    mnistcu__free(m->ctx, h);
    for (s = step; s < end && !r; ++s) {
        size_t b = MNISTCU__MIN(B, n - s * B);
        mnistcu__step_graph *g = *off ? NULL : mnistcu__cuda_graph_for(m, b, b != B);
        if (d->schedule.per_step)
            o->learning_rate = mnistcu__step_lr(d, epoch, steps, s);
        if (g && g->exec) { /* replayed */
            mnistcu__step_host_effects(m, g);
            r = mnistcu__cuda_graph_launch(m, g);
            ++*graphed;
            continue;
        }
        if (g && g->warm) { /* captured, then replayed */
            mnistcu__host_saved saved;
            mnistcu__attempt at; /* a failure here is not the call's: it falls back */
            char why[sizeof m->ctx->error];
            const char *cause = NULL;
            int ok = 0, captured = 0;
            mnistcu__host_save(m, &saved, 0);
            mnistcu__attempt_begin(m->ctx, &at);
            if (mnistcu__cuda_capture_begin(m) == MNISTCU_OK) {
                ok = mnistcu__train_step(m, ds, idx, B, b, s, aug, st, o) == MNISTCU_OK;
                captured = mnistcu__cuda_capture_end(m, g, ok, &cause);
            }
            mnistcu__attempt_end(m->ctx);
            if (captured) {
                g->scratch_layer = m->scratch_layer;
                g->scratch_batch = m->scratch_batch;
                g->batch_targets = m->batch_targets;
                g->upd = m->upd_last;
                r = mnistcu__cuda_graph_launch(m, g);
                ++*graphed;
                continue;
            }
            snprintf(why, sizeof why, "%s", cause && ok ? cause : m->ctx->error);
            mnistcu__attempt_undo(m->ctx, &at);
            mnistcu__host_save(m, &saved, 1); /* nothing of the step ran: run it launched */
            mnistcu__log(m->ctx, MNISTCU_LOG_INFO, "train: a step of %lu samples could not be captured in a CUDA "
                         "graph (%.300s): the steps run launched", (unsigned long)b, why);
            *off = 1;
        }
        if (!(r = mnistcu__cuda_step_begin(m)) && !(r = mnistcu__train_step(m, ds, idx, B, b, s, aug, st, o)) && g &&
            !*off) {
            g = mnistcu__cuda_graph_for(m, b, b != B); /* buffers made or freed by this step count as done */
            g->frees = mnistcu__cu(m->ctx)->frees;
            g->warm = 1;
        }
    }
    return r;
}
#endif

/* 1 while the model's device still works on what was queued (the GPU's stream busy; a query that
   finds it so may leave cudaErrorNotReady as the last error: cleared, while an error of the device's
   own stays, and the next synchronisation returns it); the CPU never is */
static int mnistcu__device_busy(mnistcu_model *m)
{
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA && cudaStreamQuery(mnistcu__cu(m->ctx)->stream) == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 1;
    }
#endif
    (void)m;
    return 0;
}

/* The next epoch's order of n samples, shuffled ahead from a copy of the model's generator: made while
   the GPU still trains this epoch's last steps (the host would only wait), it spares the next epoch's
   start the shuffle (0.2-0.5 ms for 60,000 samples, a tenth of an epoch of P2; bench/RESULTS.md).
   mnistcu__order_take uses it only where the generator is still where it was copied from, so the
   order is the one the shuffle would make then, whoever trains next; else it is not used. Without
   memory for it, nothing is made. */
static void mnistcu__order_ahead(mnistcu_model *m, size_t n)
{
    mnistcu__rng r = m->rng;
    size_t i;
    m->ahead_n = 0;
    if (n > m->ahead_cap) {
        uint32_t *p = (uint32_t *)mnistcu__alloc(m->ctx, n * sizeof *p);
        if (!p) return;
        mnistcu__free(m->ctx, m->ahead);
        m->ahead = p;
        m->ahead_cap = n;
    }
    for (i = 0; i < n; ++i) m->ahead[i] = (uint32_t)i;
    mnistcu__shuffle(&r, m->ahead, n);
    m->ahead_from = m->rng;
    m->ahead_to = r;
    m->ahead_n = n;
}

/* idx: the order made ahead, if there is one for n samples from the generator as it is now; 0: none */
static int mnistcu__order_take(mnistcu_model *m, uint32_t *idx, size_t n)
{
    if (m->ahead_n != n || memcmp(&m->ahead_from, &m->rng, sizeof m->rng) != 0) return 0;
    memcpy(idx, m->ahead, n * sizeof *idx);
    m->rng = m->ahead_to;
    m->ahead_n = 0;
    return 1;
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
    int epoch, stop = 0, since_best = 0;
    mnistcu_mode mode;
    mnistcu__plateau plateau;
    FILE *logf = NULL;
    float *best_params = NULL, *best_buffers = NULL; /* early stopping: the best epoch's, on the model's device */
    mnistcu__aug aug;
    mnistcu__train_state ts;               /* resume: where the checkpoint left off */
    mnistcu_optim_desc o0;                 /* the optimizer as given (o's rate follows the schedule) */
    int start_epoch = 1, new_best = 0, ck_now = 0, nkept = 0, *kept = NULL; /* kept: (epoch, step) ring */
    size_t start_step = 0, resumed_steps = 0; /* resumed_steps: the checkpoint's, counted in res.steps */
    uint64_t upd_steps0 = m ? m->upd_steps : 0;
#ifdef __CUDACC__
    mnistcu__fused_plan fused;             /* the fused MLP kernel, when it applies */
    int graph_off = 0;                     /* 1: a step could not be captured, or no_graph */
#endif

    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    ctx = m->ctx;
    mode = m->mode;
    memset(&res, 0, sizeof res);
    memset(&st, 0, sizeof st);
    memset(&guard, 0, sizeof guard);
    if (result) *result = res;
    if ((r = mnistcu__check_dataset(m, train, "train"))) return r;
    if (desc && desc->validation && (r = mnistcu__check_dataset(m, desc->validation, "train (validation set)")))
        return r;
    mnistcu_train_desc_resolve(desc, &d);
    m->head_off = d.no_head;
    m->upd_off = d.no_fused_update;
    if (d.epochs < 0 || d.batch_size < 0)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "train: epochs %d and batch_size %d must be positive",
                             d.epochs, d.batch_size);
    n = train->count;
    B = (size_t)d.batch_size;
    if (B > n)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "train: batch_size %lu is larger than the dataset (%lu)",
                             (unsigned long)B, (unsigned long)n);
    if ((r = mnistcu__resolve_optim(ctx, &d.optim, &o)) || (r = mnistcu__check_schedule(ctx, &d.schedule, o.learning_rate)))
        return r;
    if ((r = mnistcu__model_reserve(m, B))) return r;
    steps = (n + B - 1) / B; /* the last partial batch is trained too */
    if (d.schedule.per_step && steps * (size_t)d.epochs > 2147483647u)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "train: a per-step schedule counts at most 2^31 - 1 steps");
    if (d.early_stop < 0 || (d.early_stop && !d.validation))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "train: early_stop %d: give a patience of 1 or more epochs, and a validation set",
                             d.early_stop);
    if (d.schedule.kind == MNISTCU_SCHEDULE_PLATEAU && (!d.validation || d.schedule.per_step))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                             "train: the PLATEAU schedule follows the validation loss at each epoch's end: give a "
                             "validation set, and no per_step");
    mnistcu__aug_make(&d.augment, ctx->desc.seed, &aug);
    if (aug.on && (r = mnistcu__aug_check(ctx, &d.augment, train))) return r;
    mnistcu__plateau_start(&plateau, d.optim.learning_rate);
    idx = (uint32_t *)mnistcu__alloc(ctx, n * sizeof(uint32_t));
    st.steps = steps;
    st.loss = (double *)mnistcu__alloc(ctx, steps * sizeof(double));
    st.correct = (int64_t *)mnistcu__alloc(ctx, steps * sizeof(int64_t));
    if (!idx || !st.loss || !st.correct) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "train: out of memory for %lu indices", (unsigned long)n);
        goto done;
    }
    if (d.early_stop && !d.keep_last &&
        ((r = mnistcu__model_floats(m, &best_params, m->num_params, "a copy of the weights")) ||
         (m->num_buffers && (r = mnistcu__model_floats(m, &best_buffers, m->num_buffers, "a copy of the weights")))))
        goto done;
    o0 = o;
    memset(&ts, 0, sizeof ts);
    if (d.checkpoint_every < 0 || d.checkpoint_keep < 0 || d.checkpoint_keep > 100000 ||
        (unsigned)d.checkpoint_best > 1 || ((d.checkpoint_keep || d.checkpoint_best) && !d.checkpoint_path)) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT,
                          "train: checkpoint_every %d, checkpoint_keep %d (0..100000), checkpoint_best %d (0 or 1) "
                          "out of range, or no checkpoint_path", d.checkpoint_every, d.checkpoint_keep,
                          d.checkpoint_best);
        goto done;
    }
    if (d.resume_from) { /* the model, optimizer, generators and position of the checkpoint */
        if ((r = mnistcu__checkpoint_resume(m, &d, &o0, n, steps, &ts, idx, best_params, best_buffers))) goto done;
        start_epoch = ts.epoch;
        start_step = ts.step;
        if (start_step == steps) start_epoch++, start_step = 0; /* taken at an epoch's end */
        t_train = ts.seconds;
        res.steps = resumed_steps = ts.total_steps;
        res.epochs = ts.epoch - (ts.step < steps);
        plateau = ts.plateau;
        res.best_epoch = ts.best_epoch;
        res.best_val_loss = ts.best_val_loss;
        since_best = ts.since_best;
    }
    if (d.checkpoint_keep > 0) {
        kept = (int *)mnistcu__calloc(ctx, 2 * (size_t)d.checkpoint_keep * sizeof(int));
        if (!kept) {
            r = mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "train: out of memory");
            goto done;
        }
    }
    if ((r = mnistcu__finite_begin(m, &guard, !d.no_divergence_check, o.learning_rate))) goto done;
    if (d.resume_from && guard.on) { /* the first copy stands where the checkpoint does */
        guard.slot[guard.newest].epoch = ts.epoch;
        guard.slot[guard.newest].step = ts.step;
    }
    if (d.log_path && !(logf = fopen(d.log_path, d.resume_from ? "a" : "w"))) {
        r = mnistcu__fail(ctx, MNISTCU_ERR_IO, "train: cannot open the log %.300s for writing", d.log_path);
        goto done;
    }
    m->mode = MNISTCU_MODE_TRAIN;
    m->has_norm = 1; /* evaluation and predict_u8 normalise as this training set does */
    m->norm_u8 = train->u8 != NULL;
    m->norm_scale = train->scale;
    m->norm_shift = train->shift;

    for (epoch = start_epoch; epoch <= d.epochs && !stop; ++epoch) {
        int resumed = epoch == start_epoch && start_step > 0; /* inside the epoch a checkpoint was taken in */
        double t_epoch = mnistcu__now(), loss_sum = resumed ? ts.loss_sum : 0.0;
        int64_t correct = resumed ? ts.correct : 0;
        size_t step, reported = resumed ? start_step : 0, seen = resumed ? ts.seen : 0;
        if (!d.schedule.per_step)
            o.learning_rate = d.schedule.kind == MNISTCU_SCHEDULE_PLATEAU && epoch > d.schedule.warmup
                                  ? (float)plateau.lr
                                  : mnistcu_schedule_lr(&d.schedule, d.optim.learning_rate, epoch - 1, d.epochs);
        if (!resumed) { /* a resumed epoch has its order from the checkpoint */
            if (d.no_shuffle || !mnistcu__order_take(m, idx, n)) {
                for (i = 0; i < n; ++i) idx[i] = (uint32_t)i;
                if (!d.no_shuffle) mnistcu__shuffle(&m->rng, idx, n);
            }
        }
        if ((r = mnistcu__epoch_begin(m, train, idx, n, &st))) goto done;
#ifdef __CUDACC__
        memset(&fused, 0, sizeof fused);
        if (!d.no_fused && m->device == MNISTCU_DEVICE_CUDA)
            mnistcu__fused_plan_make(m, train, B, n, &o, aug.on, d.fused_cnn, d.fused_mlp_clusters, &fused);
        if (d.no_graph || !mnistcu__cuda_graph_usable(m)) graph_off = 1;
#endif
        for (step = resumed ? start_step : 0; step < steps && !stop; ++step) {
            size_t b = MNISTCU__MIN(B, n - step * B);
            if (d.schedule.per_step)
                o.learning_rate = mnistcu__step_lr(&d, epoch, steps, step);
#ifdef __CUDACC__
            if (fused.ok) { /* every step up to the next report in one kernel */
                size_t end = step + 1;
                while (!mnistcu__report_due(&d, logf != NULL, end - 1, steps)) ++end;
                if ((r = mnistcu__fused_chunk(m, train, &fused, &d, &o, epoch, steps, n, step, end))) goto done;
                seen += (end - 1 - step) * B; /* full batches: only an epoch's last may be partial */
                res.steps += end - 1 - step;
                res.fused_steps += end - step;
                if (fused.lenet) res.fused_cnn_steps += end - step;
                if (fused.mc) res.fused_cluster_steps += end - step;
                step = end - 1;
                b = MNISTCU__MIN(B, n - step * B);
            } else if (!graph_off) { /* every step up to the next report, each one graph launch */
                size_t end = step + 1;
                while (!mnistcu__report_due(&d, logf != NULL, end - 1, steps)) ++end;
                if ((r = mnistcu__graph_chunk(m, train, idx, &d, &o, &aug, &st, epoch, steps, n, step, end,
                                              &res.graph_steps, &graph_off)))
                    goto done;
                seen += (end - 1 - step) * B;
                res.steps += end - 1 - step;
                step = end - 1;
                b = MNISTCU__MIN(B, n - step * B);
            } else
#endif
            if ((r = mnistcu__train_step(m, train, idx, B, b, step, &aug, &st, &o)))
                goto done;
            seen += b;
            res.steps++;
            ck_now = d.checkpoint_path && d.checkpoint_every_steps && (step + 1) % d.checkpoint_every_steps == 0 &&
                     step + 1 < steps;
            if (mnistcu__report_due(&d, logf != NULL, step, steps)) {
                mnistcu_progress p;
                if ((r = mnistcu__finite_queue(m, &guard))) goto done;
                /* the epoch's end, the GPU still at work: the next epoch's order meanwhile */
                if (step + 1 == steps && !d.no_shuffle && mnistcu__device_busy(m)) mnistcu__order_ahead(m, n);
                if ((r = mnistcu__read_stats(m, &st, reported, step + 1, &loss_sum, &correct))) goto done;
                reported = step + 1;
                memset(&p, 0, sizeof p);
                p.epoch = epoch;
                p.epochs = d.epochs;
                p.step = step + 1;
                p.steps = steps;
                p.samples = seen;
                p.train_loss = loss_sum / (double)seen;
                p.has_accuracy = train->targets == NULL;
                p.train_accuracy = p.has_accuracy ? (double)correct / (double)seen : mnistcu__nan();
                p.epoch_end = step + 1 == steps;
                p.seconds = t_train + (mnistcu__now() - t_epoch);
                p.images_per_second = (double)seen / MNISTCU__MAX(mnistcu__now() - t_epoch, 1e-9);
                p.learning_rate = o.learning_rate;
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
                        if (d.schedule.kind == MNISTCU_SCHEDULE_PLATEAU && epoch > d.schedule.warmup)
                            mnistcu__plateau_step(&plateau, &d.schedule, vm.loss);
                        if (!res.best_epoch || vm.loss < res.best_val_loss) { /* a new best: keep its weights */
                            new_best = 1;
                            res.best_epoch = epoch;
                            res.best_val_loss = vm.loss;
                            since_best = 0;
                            if (best_params &&
                                ((r = mnistcu__finite_copy(m, best_params, m->params, m->num_params, 0)) ||
                                 (best_buffers &&
                                  (r = mnistcu__finite_copy(m, best_buffers, m->buffers, m->num_buffers, 0)))))
                                goto done;
                        } else if (d.early_stop && ++since_best >= d.early_stop && epoch < d.epochs) {
                            stop = 1;
                            res.early_stopped = 1;
                        }
                    }
                    if (!p.has_accuracy && p.has_validation)
                        mnistcu__log(ctx, MNISTCU_LOG_INFO,
                                     "epoch %d/%d  loss %.6g  val loss %.6g  %.2f s  %.0f img/s  lr %g", epoch, d.epochs,
                                     p.train_loss, p.val_loss, p.seconds, p.images_per_second, p.learning_rate);
                    else if (!p.has_accuracy)
                        mnistcu__log(ctx, MNISTCU_LOG_INFO, "epoch %d/%d  loss %.6g  %.2f s  %.0f img/s  lr %g", epoch,
                                     d.epochs, p.train_loss, p.seconds, p.images_per_second, p.learning_rate);
                    else if (p.has_validation)
                        mnistcu__log(ctx, MNISTCU_LOG_INFO,
                                     "epoch %d/%d  loss %.4f  acc %.2f%%  val loss %.4f  val acc %.2f%%  %.2f s  %.0f img/s"
                                     "  lr %g", epoch, d.epochs, p.train_loss, 100.0 * p.train_accuracy, p.val_loss,
                                     100.0 * p.val_accuracy, p.seconds, p.images_per_second, p.learning_rate);
                    else
                        mnistcu__log(ctx, MNISTCU_LOG_INFO,
                                     "epoch %d/%d  loss %.4f  acc %.2f%%  %.2f s  %.0f img/s  lr %g", epoch, d.epochs,
                                     p.train_loss, 100.0 * p.train_accuracy, p.seconds, p.images_per_second,
                                     p.learning_rate);
                }
                if (logf && !mnistcu__log_line(logf, &p)) {
                    r = mnistcu__fail(ctx, MNISTCU_ERR_IO, "train: writing the log %.300s failed", d.log_path);
                    goto done;
                }
                if (d.progress && d.progress(d.progress_user, &p)) stop = 1;
                if (d.checkpoint_path &&
                    (ck_now || stop || (p.epoch_end && (epoch % (d.checkpoint_every > 0 ? d.checkpoint_every : 1) == 0 ||
                                                        epoch == d.epochs)))) {
                    mnistcu__train_state ts_now;
                    char name[4096], suffix[32];
                    /* early stopping's copies hold a best epoch's weights only once there is one */
                    const float *ck_best = res.best_epoch ? best_params : NULL;
                    const float *ck_best_buf = res.best_epoch ? best_buffers : NULL;
                    memset(&ts_now, 0, sizeof ts_now);
                    ts_now.epoch = epoch;
                    ts_now.step = step + 1;
                    ts_now.steps = steps;
                    ts_now.total_steps = res.steps;
                    ts_now.loss_sum = loss_sum;
                    ts_now.correct = correct;
                    ts_now.seen = seen;
                    ts_now.seconds = p.epoch_end ? t_train : t_train + (mnistcu__now() - t_epoch);
                    ts_now.plateau = plateau;
                    ts_now.best_epoch = res.best_epoch;
                    ts_now.since_best = since_best;
                    ts_now.best_val_loss = res.best_val_loss;
                    ts_now.order = idx;
                    ts_now.n = n;
                    ts_now.seed = ctx->desc.seed;
                    if ((r = mnistcu__checkpoint_write(m, &d, &o0, &ts_now, ck_best, ck_best_buf,
                                                       d.checkpoint_path)))
                        goto done;
                    if (kept) { /* a numbered copy; the oldest beyond checkpoint_keep goes */
                        int slot = nkept % d.checkpoint_keep;
                        snprintf(suffix, sizeof suffix, "e%04d-s%06lu", epoch, (unsigned long)(step + 1));
                        if (nkept >= d.checkpoint_keep) {
                            char old[32];
                            snprintf(old, sizeof old, "e%04d-s%06lu", kept[2 * slot], (unsigned long)kept[2 * slot + 1]);
                            if (mnistcu__checkpoint_name(d.checkpoint_path, old, name, sizeof name)) remove(name);
                        }
                        if (!mnistcu__checkpoint_name(d.checkpoint_path, suffix, name, sizeof name)) {
                            r = mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "train: checkpoint path too long");
                            goto done;
                        }
                        if ((r = mnistcu__checkpoint_write(m, &d, &o0, &ts_now, ck_best, ck_best_buf, name)))
                            goto done;
                        kept[2 * slot] = epoch;
                        kept[2 * slot + 1] = (int)(step + 1);
                        nkept++;
                    }
                    if (new_best && d.checkpoint_best && p.epoch_end) {
                        if (!mnistcu__checkpoint_name(d.checkpoint_path, "best", name, sizeof name)) {
                            r = mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "train: checkpoint path too long");
                            goto done;
                        }
                        if ((r = mnistcu__checkpoint_write(m, &d, &o0, &ts_now, ck_best, ck_best_buf, name)))
                            goto done;
                    }
                }
                new_best = 0;
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
    /* early stopping: the best epoch's weights back, unless it was the last */
    if (best_params && res.best_epoch && res.best_epoch != res.epochs &&
        ((r = mnistcu__finite_copy(m, m->params, best_params, m->num_params, 1)) ||
         (best_buffers && (r = mnistcu__finite_copy(m, m->buffers, best_buffers, m->num_buffers, 1)))))
        goto done;
    r = MNISTCU_OK;
done:
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA && mnistcu__cuda_head_layer(m) >= 0) /* this run's steps, but the fused kernel's */
        res.head_steps = res.steps - resumed_steps - res.fused_steps;
#endif
    res.fused_update_steps = (size_t)(m->upd_steps - upd_steps0);
    if (result && (r == MNISTCU_OK || r == MNISTCU_ERR_DIVERGED)) *result = res;
    if (logf && fclose(logf) != 0 && r == MNISTCU_OK)
        r = mnistcu__fail(ctx, MNISTCU_ERR_IO, "train: closing the log %.300s failed", d.log_path);
    mnistcu__model_floats_free(m, best_params);
    mnistcu__model_floats_free(m, best_buffers);
    mnistcu__finite_end(m, &guard);
#ifdef __CUDACC__
    if (m->device == MNISTCU_DEVICE_CUDA) mnistcu__cuda_graphs_reset(m);
#endif
    mnistcu__free(ctx, kept);
    m->mode = mode;
    mnistcu__free(ctx, idx);
    mnistcu__free(ctx, st.loss);
    mnistcu__free(ctx, st.correct);
    return r;
}

/* >>evaluate ------------------------------------------------------------------- */

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
    mnistcu_mode mode;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!out) return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "evaluate: out is NULL");
    memset(out, 0, sizeof *out);
    if ((r = mnistcu__check_dataset(m, ds, "evaluate"))) return r;
    n = ds->count;
    C = m->classes;
    chunk = mnistcu__eval_chunk(m, n);
    if ((r = mnistcu__model_reserve(m, chunk))) return r;
    mode = m->mode;
    m->mode = MNISTCU_MODE_EVAL;
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
    if (confusion && ds->targets) {
        r = mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "evaluate: no confusion matrix for float targets");
        goto done;
    }
    if (confusion) memset(confusion, 0, C * C * sizeof(int64_t));
    if ((r = mnistcu__epoch_begin(m, ds, idx, n, &st))) goto done;
    for (s = 0; s < steps; ++s) {
        size_t b = MNISTCU__MIN(chunk, n - s * chunk);
        if ((r = mnistcu__gather(m, ds, idx, s * chunk, b, NULL)) || (r = mnistcu__forward(m, b)) ||
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
    out->has_accuracy = ds->targets == NULL;
    out->accuracy = out->has_accuracy ? (double)correct / (double)n : mnistcu__nan();
done:
    m->mode = mode;
    mnistcu__free(m->ctx, idx);
    mnistcu__free(m->ctx, st.loss);
    mnistcu__free(m->ctx, st.correct);
    mnistcu__free(m->ctx, pred);
    return r;
}

MNISTCU_DEF mnistcu_result mnistcu_evaluate_logits(mnistcu_model *m, const mnistcu_dataset *ds, float *logits)
{
    mnistcu_result r;
    mnistcu__stats st;
    uint32_t *idx;
    size_t n, i, chunk, s;
    mnistcu_mode mode;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!logits) return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "evaluate_logits: logits is NULL");
    if ((r = mnistcu__check_dataset(m, ds, "evaluate_logits"))) return r;
    n = ds->count;
    chunk = mnistcu__eval_chunk(m, n);
    if ((r = mnistcu__model_reserve(m, chunk))) return r;
    idx = (uint32_t *)mnistcu__alloc(m->ctx, n * sizeof(uint32_t));
    if (!idx) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "evaluate_logits: out of memory");
    for (i = 0; i < n; ++i) idx[i] = (uint32_t)i;
    mode = m->mode;
    m->mode = MNISTCU_MODE_EVAL;
    memset(&st, 0, sizeof st);
    st.steps = (n + chunk - 1) / chunk;
    r = mnistcu__epoch_begin(m, ds, idx, n, &st);
    for (s = 0; !r && s * chunk < n; ++s) {
        size_t b = MNISTCU__MIN(chunk, n - s * chunk);
        if (!(r = mnistcu__gather(m, ds, idx, s * chunk, b, NULL)) && !(r = mnistcu__forward(m, b)))
            r = mnistcu__model_copy(m, logits + s * chunk * m->classes, m->logits, b * m->classes * sizeof(float), 0);
    }
    m->mode = mode;
    mnistcu__free(m->ctx, idx);
    return r;
}

/* >>predict --------------------------------------------------------------------- */
MNISTCU_DEF mnistcu_result mnistcu_model_forward(mnistcu_model *m, const float *x, size_t n, float *logits)
{
    mnistcu_result r;
    size_t off, in, C, chunk;
    int i;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!x || !logits || n == 0)
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "model_forward: x, logits and n must be given");
    in = m->inputs;
    C = m->classes;
    chunk = mnistcu__eval_chunk(m, n);
    /* In TRAIN mode the n samples are one batch, as in PyTorch: batch norm's
       statistics and dropout's element count must not restart in chunks. */
    for (i = 0; i < m->num_layers && m->mode == MNISTCU_MODE_TRAIN; ++i)
        if (m->layers[i].d.kind == MNISTCU_LAYER_BATCHNORM || m->layers[i].d.kind == MNISTCU_LAYER_DROPOUT) chunk = n;
    if ((r = mnistcu__model_reserve(m, chunk))) return r;
    for (off = 0; off < n; off += chunk) {
        size_t b = MNISTCU__MIN(chunk, n - off);
        if ((r = mnistcu__model_copy(m, m->input, x + off * in, b * in * sizeof(float), 1)) ||
            (r = mnistcu__forward(m, b)) ||
            (r = mnistcu__model_copy(m, logits + off * C, m->logits, b * C * sizeof(float), 0)))
            return r;
    }
    return MNISTCU_OK;
}

/* Softmax and arg-max of logits already on the host. */
/* Class (argmax) and probabilities of logits z [n][C], in place: a softmax for
   SOFTMAX_CE and HINGE, a sigmoid per output for BCE, the outputs themselves for MSE. */
static void mnistcu__host_softmax(float *z, size_t n, size_t C, int32_t *labels, int want_probs, mnistcu_loss loss)
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
        if (want_probs && loss == MNISTCU_LOSS_BCE) {
            for (j = 0; j < C; ++j) {
                float e = expf(-fabsf(row[j]));
                row[j] = row[j] >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
            }
        } else if (want_probs && loss != MNISTCU_LOSS_MSE) {
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
    mnistcu_mode mode;
    if (!m) return MNISTCU_ERR_INVALID_ARGUMENT;
    if (!x || n == 0 || (!labels && !probs))
        return mnistcu__fail(m->ctx, MNISTCU_ERR_INVALID_ARGUMENT, "predict: x, n and labels or probs must be given");
    C = m->classes;
    if (!mnistcu__mul3(n, C, sizeof(float), &bytes))
        return mnistcu__fail(m->ctx, MNISTCU_ERR_OVERFLOW, "predict: %lu samples overflow", (unsigned long)n);
    z = probs ? probs : (float *)mnistcu__alloc(m->ctx, bytes);
    if (!z) return mnistcu__fail(m->ctx, MNISTCU_ERR_OUT_OF_MEMORY, "predict: out of memory");
    mode = m->mode;
    m->mode = MNISTCU_MODE_EVAL;
    r = mnistcu_model_forward(m, x, n, z);
    m->mode = mode;
    if (r == MNISTCU_OK) mnistcu__host_softmax(z, n, C, labels, probs != NULL, m->loss);
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
    in = m->inputs;
    C = m->classes;
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
   float atomics: each output element is computed by one thread in a fixed order,
   and reductions run in a fixed tree, so two runs are bitwise identical (the
   integer tickets of the head and of the split wide-tile product only choose
   which block adds the parts, in their fixed order). */
#ifdef __CUDACC__
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

/* Split K (gridDim.z > 1): slice z sums k in [kz0, kz0 + kc) only, kc a multiple
   of 16, and writes its partial product to the z-th [M][ldc] matrix after C; a
   second kernel adds the slices in order. With gridDim.z = 1 the slice is all
   of K, and nothing changes. K becomes the slice's end. */
#define MNISTCU__GEMM_SLICE()                                                                         \
    const int kc_ = gridDim.z == 1 ? K : ((K + (int)gridDim.z - 1) / (int)gridDim.z + 15) / 16 * 16; \
    const int kz0 = (int)blockIdx.z * kc_;                                                            \
    K = kz0 + kc_ < K ? kz0 + kc_ : K;                                                                \
    C += (size_t)blockIdx.z * (size_t)M * (size_t)ldc

template <int TA, int TB, int FUSE>
__global__ void __launch_bounds__(256) mnistcu__k_gemm(int M, int N, int K, const float *__restrict__ A, int lda,
                                                        const float *__restrict__ B, int ldb, float *__restrict__ C,
                                                        int ldc, const float *__restrict__ bias, int act)
{
    MNISTCU__PDL_WAIT();
    __shared__ float As[MNISTCU__GBK][MNISTCU__GBM + 4];
    __shared__ float Bs[MNISTCU__GBK][MNISTCU__GBN + 4];
    const int t = (int)threadIdx.x, tx = t % 16, ty = t / 16;
    const int n0 = (int)blockIdx.x * MNISTCU__GBN;
    float acc[4][4];
    int i, j, r, k0, kk, m0;
    MNISTCU__GEMM_SLICE();
    /* Rows of tiles beyond gridDim.y's limit (65535) are walked by the same blocks. */
    for (m0 = (int)blockIdx.y * MNISTCU__GBM; m0 < M; m0 += (int)gridDim.y * MNISTCU__GBM) {
        for (i = 0; i < 4; ++i)
            for (j = 0; j < 4; ++j) acc[i][j] = 0.0f;
        for (k0 = kz0; k0 < K; k0 += MNISTCU__GBK) {
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
                if (gn < N)
                    C[(size_t)gm * ldc + gn] =
                        FUSE ? mnistcu__act_f((mnistcu_act)act, bias ? acc[i][j] + bias[gn] : acc[i][j]) : acc[i][j];
            }
        }
    }
}

/* The small-problem product: one output per thread in 16x16 tiles. Where the
   64x64 kernel would launch only a few blocks (batch 64: 2 to 16 of them), this
   one fills the GPU: measured 504 against 220 GFLOP/s at 64x128x784 and 3531
   against 1782 at 64x1024x784 on an H100 (bench/cuda_gemm.cu, v2 and v3). Each
   output is the same fmaf chain over k from zero as in the 64x64 kernel, so the
   choice between them changes no bit of the result. The tiles are staged
   MNISTCU__GTK values of k at a time, each thread's 8 + 8 loads issued
   together: staged 16 at a time, each step waited a load's latency for 16
   fmas (LeNet-5's first dense layer, 64 x 120 x 256: 11.2 us, ncu). The zeros
   past the end of k still go through the chain up to a multiple of 16, as in
   mnistcu__k_gemm, so the bits do not change. */
#define MNISTCU__GT 16
#define MNISTCU__GTK 128

template <int TA, int TB, int FUSE>
__global__ void __launch_bounds__(256) mnistcu__k_gemm16(int M, int N, int K, const float *__restrict__ A, int lda,
                                                          const float *__restrict__ B, int ldb, float *__restrict__ C,
                                                          int ldc, const float *__restrict__ bias, int act)
{
    MNISTCU__PDL_WAIT();
    __shared__ float As[MNISTCU__GT][MNISTCU__GTK + 1]; /* [m][k] */
    __shared__ float Bs[MNISTCU__GTK][MNISTCU__GT + 1]; /* [k][n] */
    enum { R = MNISTCU__GT * MNISTCU__GTK / 256 };      /* values of each tile a thread stages */
    const int t = (int)threadIdx.x, tx = t % MNISTCU__GT, ty = t / MNISTCU__GT;
    const int n0 = (int)blockIdx.x * MNISTCU__GT;
    int m0, k0, kk, r;
    MNISTCU__GEMM_SLICE();
    for (m0 = (int)blockIdx.y * MNISTCU__GT; m0 < M; m0 += (int)gridDim.y * MNISTCU__GT) {
        float acc = 0.0f;
        for (k0 = kz0; k0 < K; k0 += MNISTCU__GTK) {
            const int nk = MNISTCU__MIN(MNISTCU__GTK, (K - k0 + 15) / 16 * 16); /* whole steps of 16 */
            float a[R], b[R];
            /* value e = t + 256 r of each tile, read along the source's contiguous direction */
#pragma unroll
            for (r = 0; r < R; ++r) {
                const int e = t + 256 * r;
                const int am = TA ? e % MNISTCU__GT : e / MNISTCU__GTK, ak = TA ? e / MNISTCU__GT : e % MNISTCU__GTK;
                const int bn = TB ? e / MNISTCU__GTK : e % MNISTCU__GT, bk = TB ? e % MNISTCU__GTK : e / MNISTCU__GT;
                const int gm = m0 + am, gka = k0 + ak, gn = n0 + bn, gkb = k0 + bk;
                a[r] = (gm < M && gka < K) ? (TA ? A[(size_t)gka * lda + gm] : A[(size_t)gm * lda + gka]) : 0.0f;
                b[r] = (gn < N && gkb < K) ? (TB ? B[(size_t)gn * ldb + gkb] : B[(size_t)gkb * ldb + gn]) : 0.0f;
            }
#pragma unroll
            for (r = 0; r < R; ++r) {
                const int e = t + 256 * r;
                const int am = TA ? e % MNISTCU__GT : e / MNISTCU__GTK, ak = TA ? e / MNISTCU__GT : e % MNISTCU__GTK;
                const int bn = TB ? e / MNISTCU__GTK : e % MNISTCU__GT, bk = TB ? e % MNISTCU__GTK : e / MNISTCU__GT;
                As[am][ak] = a[r];
                Bs[bk][bn] = b[r];
            }
            __syncthreads();
            for (kk = 0; kk < nk; kk += 16) {
                int j;
#pragma unroll
                for (j = 0; j < 16; ++j) acc = fmaf(As[ty][kk + j], Bs[kk + j][tx], acc);
            }
            __syncthreads();
        }
        if (m0 + ty < M && n0 + tx < N)
            C[(size_t)(m0 + ty) * ldc + n0 + tx] =
                FUSE ? mnistcu__act_f((mnistcu_act)act, bias ? acc + bias[n0 + tx] : acc) : acc;
    }
}

/* The wide-tile product, for large products: a 128 x BN tile of C per block of
   256 threads (BN 128: 8x8 outputs a thread, rows 4ty.. and 64+4ty.., columns
   likewise; BN 64: 8x4), op(A) and op(B) staged in K-steps of BK with 16-byte
   loads into two shared buffers, the next step's loads in flight while this one
   is summed, so one barrier a step. Each output is the same fmaf chain as in
   mnistcu__k_gemm: over the slice's k in increasing order from zero, zeros past
   K up to a multiple of 16, so the choice between the kernels changes no bit.
   It reads each operand 16 bytes at a time along its contiguous direction, so
   that direction's length and leading dimension must be multiples of 4 and the
   pointers 16-byte aligned (mnistcu__gemm_wide_ok). Where an operand is read
   along k, a warp's loads cover 16 rows x 2 groups of 4 k, so that its
   transposed stores hit 32 different banks (rows 4 k apart are 16 banks apart).
   Variants and timings: bench/cuda_gemm.cu. */
#define MNISTCU__WBM 128
#define MNISTCU__WBN 64 /* the tile's columns as the header launches it */

/* One operand's tile (R rows of m or n, BK of k) from global memory into
   registers (ld) and from registers into shared memory [k][R + 4] (st). KC: the
   operand is contiguous along k (A not transposed, B transposed). Each
   thread's rows, columns and addresses are worked out once (at), so a K-step
   costs its loads and an add. */
template <int R, int BK, int KC> struct mnistcu__wtile {
    enum { F = R * BK / 4, Q = (F + 255) / 256 }; /* float4s in the tile, per thread */
    float4 v[Q];
    const float *src[Q]; /* this thread's float4 at k = 0; NULL: its row is past the end */
    int kq[Q];           /* its k within the tile */
    static __device__ __forceinline__ void at(int idx, int &row, int &k)
    {
        if (KC) {
            const int lane = idx % 32, wv = idx / 32;
            row = (wv % (R / 16)) * 16 + lane / 2;
            k = 4 * (2 * (wv / (R / 16)) + lane % 2);
        } else {
            k = idx / (R / 4);
            row = (idx % (R / 4)) * 4;
        }
    }
    __device__ __forceinline__ void init(const float *__restrict__ p, int ld_, int r0, int rows, int t)
    {
        int q;
#pragma unroll
        for (q = 0; q < Q; ++q) {
            const int idx = t + 256 * q;
            int row, k;
            at(idx, row, k);
            kq[q] = k;
            src[q] = idx < F && r0 + row < rows ? (KC ? p + (size_t)(r0 + row) * ld_ + k : p + (size_t)k * ld_ + r0 + row)
                                                : NULL;
        }
    }
    __device__ __forceinline__ void ld(int ld_, int k0, int K)
    {
        int q;
#pragma unroll
        for (q = 0; q < Q; ++q) {
            v[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (src[q] && k0 + kq[q] < K) v[q] = __ldg((const float4 *)(src[q] + (KC ? (size_t)k0 : (size_t)k0 * ld_)));
        }
    }
    __device__ __forceinline__ void st(float *s, int t) const /* s: [BK][R + 4] */
    {
        int q;
#pragma unroll
        for (q = 0; q < Q; ++q) {
            const int idx = t + 256 * q;
            int row, k;
            at(idx, row, k);
            if (idx >= F) continue;
            if (KC) {
                s[k * (R + 4) + row] = v[q].x, s[(k + 1) * (R + 4) + row] = v[q].y;
                s[(k + 2) * (R + 4) + row] = v[q].z, s[(k + 3) * (R + 4) + row] = v[q].w;
            } else {
                *(float4 *)&s[k * (R + 4) + row] = v[q];
            }
        }
    }
};

/* A wide-tile product's arguments. FUSE 1: C = act(sum + bias); 3: the same for
   ReLU, with no other activation's code in the kernel (inlined 64 times in the
   generic epilogue, sigmoid's and tanh's code slowed the main loop of P3's
   forward products: 38.8 -> 55.6 and 47.7 -> 64.3 us, ncu); 2: C = act'(y) *
   sum (y laid out as C: an input gradient times the derivative of the
   activation that made the input; a ReLU-only form, as 3 is of 1, spilled
   where this one does not); 4: C = sum, a weight gradient, and the optimizer's
   step of each of its entries (SGD, mnistcu__opt_sgd: the parameters at w,
   their state at s, laid out as C; the step's scalars from dyn in a replayed
   graph, else opt), the operations of mnistcu__k_optim on the same values, so
   the same bits without the optimizer's pass over them (>>cuda_update). db
   (TN, one slice): also the sums of op(A)'s rows, k in increasing order from
   zero, as mnistcu__k_bias_grad's: a dense layer's bias gradient beside its
   weight gradient (FUSE 4: and the bias's step, at bw and bs). Split over K
   (gridDim.z = S > 1): each slice writes its part to part[z][M][N], and the
   last slice of a tile to arrive (an integer counter a tile in flags, put back
   to zero by it) adds the S parts in order, as mnistcu__k_splitk_sum does, and
   applies the epilogue: the same bits, no second kernel, no float atomics. */
typedef struct mnistcu__wargs {
    int M, N, K, lda, ldb, ldc, act;
    const float *A, *B, *bias, *y;
    float *C, *part, *db;
    int *flags;
    float *w, *s, *bw, *bs; /* FUSE 4 */
    const mnistcu__dyn *dyn;
    mnistcu__opt opt;
} mnistcu__wargs;

template <int FUSE>
static __device__ __forceinline__ float mnistcu__wide_epi(const mnistcu__wargs &p, const mnistcu__opt &o, float v,
                                                          int gm, int gn)
{
    if (FUSE == 3) { /* bias and ReLU, as mnistcu__act_f */
        const float z = p.bias ? v + p.bias[gn] : v;
        return z > 0.0f ? z : 0.0f;
    }
    if (FUSE == 1) return mnistcu__act_f((mnistcu_act)p.act, p.bias ? v + p.bias[gn] : v);
    if (FUSE == 2) return mnistcu__act_backward_one((mnistcu_act)p.act, v, p.y[(size_t)gm * p.ldc + gn]);
    if (FUSE == 4) mnistcu__opt_sgd(&o, (size_t)gm * p.ldc + gn, p.w, v, p.s);
    return v;
}

/* FUSE 4, one slice: a thread's 8 x 4 NJ weight gradients stored, and the
   optimizer's step of those weights, their values (and momentum buffers)
   loaded first, 16 bytes at a time, H rows of them at once (all 8 with one
   block's registers, 4 with two blocks': 8 spilled there), so that the loads
   are in flight together (one at a time, as each step reads it, made P3's
   weight gradients 6 us slower than the plain product, ncu); edges and
   unaligned rows step one entry at a time. */
template <int NJ, int H>
static __device__ __forceinline__ void mnistcu__wide_step(const mnistcu__wargs &p, const mnistcu__opt &o,
                                                          const float (&acc)[8][4 * NJ], int m0, int n0, int ty, int tx)
{
    const int mom = o.has_momentum, ldc = p.ldc, M = p.M, N = p.N;
    const int v4 = ldc % 4 == 0 && ((uintptr_t)p.C & 15) == 0 && ((uintptr_t)p.w & 15) == 0 &&
                   (!mom || ((uintptr_t)p.s & 15) == 0);
    int h, i, j, q;
#pragma unroll
    for (h = 0; h < 8; h += H) {
        float4 w4[H][NJ], s4[H][NJ];
#pragma unroll
        for (i = 0; i < H; ++i) {
            const int r = h + i, gm = m0 + (r < 4 ? 4 * ty + r : 64 + 4 * ty + r - 4);
#pragma unroll
            for (j = 0; j < NJ; ++j) {
                const int gn = n0 + 64 * j + 4 * tx;
                const size_t e = (size_t)gm * ldc + gn;
                w4[i][j] = s4[i][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (v4 && gm < M && gn + 3 < N) {
                    w4[i][j] = *(const float4 *)&p.w[e];
                    if (mom) s4[i][j] = *(const float4 *)&p.s[e];
                }
            }
        }
#pragma unroll
        for (i = 0; i < H; ++i) {
            const int r = h + i, gm = m0 + (r < 4 ? 4 * ty + r : 64 + 4 * ty + r - 4);
            if (gm >= M) continue;
#pragma unroll
            for (j = 0; j < NJ; ++j) {
                const int gn = n0 + 64 * j + 4 * tx;
                const size_t e = (size_t)gm * ldc + gn;
                const float *g = &acc[r][4 * j];
                if (v4 && gn + 3 < N) {
                    float w[4] = {w4[i][j].x, w4[i][j].y, w4[i][j].z, w4[i][j].w};
                    float s[4] = {s4[i][j].x, s4[i][j].y, s4[i][j].z, s4[i][j].w};
#pragma unroll
                    for (q = 0; q < 4; ++q) w[q] = mnistcu__sgd_step(&o, w[q], g[q], &s[q]);
                    *(float4 *)&p.C[e] = make_float4(g[0], g[1], g[2], g[3]);
                    *(float4 *)&p.w[e] = make_float4(w[0], w[1], w[2], w[3]);
                    if (mom) *(float4 *)&p.s[e] = make_float4(s[0], s[1], s[2], s[3]);
                } else {
                    for (q = 0; q < 4; ++q)
                        if (gn + q < N) {
                            p.C[e + q] = g[q];
                            mnistcu__opt_sgd(&o, e + q, p.w, g[q], p.s);
                        }
                }
            }
        }
    }
}

template <int TA, int TB, int FUSE, int BN, int BK, int MINB>
__global__ void __launch_bounds__(256, MINB) mnistcu__k_gemm_wide(mnistcu__wargs p)
{
    MNISTCU__PDL_WAIT();
    enum { NJ = BN / 64 }; /* groups of 4 columns a thread */
    __shared__ __align__(16) float As[2][BK][MNISTCU__WBM + 4]; /* [k][m] */
    __shared__ __align__(16) float Bs[2][BK][BN + 4];           /* [k][n] */
    __shared__ int last;
    const int t = (int)threadIdx.x, tx = t % 16, ty = t / 16, S = (int)gridDim.z;
    const int n0 = (int)blockIdx.x * BN, M = p.M, N = p.N;
    const float *__restrict__ A = p.A;
    const float *__restrict__ B = p.B;
    float *C = S > 1 ? p.part : p.C;
    int K = p.K, ldc = S > 1 ? N : p.ldc;
    const int rowsum = p.db && S == 1 && TA && blockIdx.x == 0 && t < MNISTCU__WBM;
    mnistcu__wtile<MNISTCU__WBM, BK, !TA> ta_;
    mnistcu__wtile<BN, BK, TB> tb_;
    float acc[8][4 * NJ], rs;
    int i, j, q, k0, kk, m0, cur, kend;
    MNISTCU__GEMM_SLICE();
    const int vec = ldc % 4 == 0 && ((uintptr_t)C & 15) == 0, ovec = p.ldc % 4 == 0 && ((uintptr_t)p.C & 15) == 0;
    const int pvec = N % 4 == 0 && ((uintptr_t)p.part & 15) == 0; /* the parts summed 16 bytes at a time */
    const mnistcu__opt o = FUSE == 4 && p.dyn ? p.dyn->opt : p.opt; /* a replayed step's scalars */
    kend = kz0 + (K - kz0 + 15) / 16 * 16; /* as mnistcu__k_gemm: zeros up to a multiple of 16 */
    tb_.init(B, p.ldb, n0, N, t);
    for (m0 = (int)blockIdx.y * MNISTCU__WBM; m0 < M; m0 += (int)gridDim.y * MNISTCU__WBM) {
#pragma unroll
        for (i = 0; i < 8; ++i)
#pragma unroll
            for (j = 0; j < 4 * NJ; ++j) acc[i][j] = 0.0f;
        rs = 0.0f;
        cur = 0;
        ta_.init(A, p.lda, m0, M, t);
        if (kz0 < kend) {
            ta_.ld(p.lda, kz0, K);
            tb_.ld(p.ldb, kz0, K);
            ta_.st(&As[0][0][0], t);
            tb_.st(&Bs[0][0][0], t);
        }
        __syncthreads();
        for (k0 = kz0; k0 < kend; k0 += BK) {
            const int more = k0 + BK < kend;
            const float *as = &As[cur][0][4 * ty], *bs = &Bs[cur][0][4 * tx];
            float a[2][8], b[2][4 * NJ];
            if (more) {
                ta_.ld(p.lda, k0 + BK, K);
                tb_.ld(p.ldb, k0 + BK, K);
            }
            /* the fragments of step kk + 1 load while step kk's fmas run */
#define MNISTCU__WIDE_FRAG(kk_, f_)                                                                          \
    do {                                                                                                     \
        const float4 a0_ = *(const float4 *)(as + (kk_) * (MNISTCU__WBM + 4));                               \
        const float4 a1_ = *(const float4 *)(as + (kk_) * (MNISTCU__WBM + 4) + 64);                          \
        a[f_][0] = a0_.x, a[f_][1] = a0_.y, a[f_][2] = a0_.z, a[f_][3] = a0_.w;                              \
        a[f_][4] = a1_.x, a[f_][5] = a1_.y, a[f_][6] = a1_.z, a[f_][7] = a1_.w;                              \
        for (j = 0; j < NJ; ++j) {                                                                           \
            const float4 b_ = *(const float4 *)(bs + (kk_) * (BN + 4) + 64 * j);                             \
            b[f_][4 * j] = b_.x, b[f_][4 * j + 1] = b_.y, b[f_][4 * j + 2] = b_.z, b[f_][4 * j + 3] = b_.w;  \
        }                                                                                                    \
    } while (0)
            MNISTCU__WIDE_FRAG(0, 0);
#pragma unroll
            for (kk = 0; kk < BK; ++kk) {
                if (kk + 1 < BK) MNISTCU__WIDE_FRAG(kk + 1, (kk + 1) & 1);
#pragma unroll
                for (i = 0; i < 8; ++i)
#pragma unroll
                    for (j = 0; j < 4 * NJ; ++j) acc[i][j] = fmaf(a[kk & 1][i], b[kk & 1][j], acc[i][j]);
            }
#undef MNISTCU__WIDE_FRAG
            if (rowsum)
                for (kk = 0; kk < BK; ++kk) rs += As[cur][kk][t];
            if (more) {
                ta_.st(&As[cur ^ 1][0][0], t);
                tb_.st(&Bs[cur ^ 1][0][0], t);
            }
            __syncthreads();
            cur ^= 1;
        }
        if (rowsum && m0 + t < M) {
            p.db[m0 + t] = rs;
            if (FUSE == 4 && p.bw) mnistcu__opt_sgd(&o, (size_t)(m0 + t), p.bw, rs, p.bs);
        }
        if (FUSE == 4 && S == 1) {
            mnistcu__wide_step<NJ, MINB == 1 ? 8 : 4>(p, o, acc, m0, n0, ty, tx);
            continue;
        }
        /* this slice's outputs: the result (one slice) or a part */
#pragma unroll
        for (i = 0; i < 8; ++i) {
            const int gm = m0 + (i < 4 ? 4 * ty + i : 64 + 4 * ty + i - 4);
            if (gm >= M) continue;
#pragma unroll
            for (j = 0; j < NJ; ++j) {
                const int gn = n0 + 64 * j + 4 * tx;
                float v[4];
#pragma unroll
                for (q = 0; q < 4; ++q) v[q] = S > 1 || gn + q >= N ? acc[i][4 * j + q] : mnistcu__wide_epi<FUSE>(p, o, acc[i][4 * j + q], gm, gn + q);
                if (vec && gn + 3 < N)
                    *(float4 *)&C[(size_t)gm * ldc + gn] = make_float4(v[0], v[1], v[2], v[3]);
                else
                    for (q = 0; q < 4; ++q)
                        if (gn + q < N) C[(size_t)gm * ldc + gn + q] = v[q];
            }
        }
        if (S == 1) continue;
        /* the last slice of this tile to arrive adds the parts in order */
        __threadfence();
        __syncthreads();
        if (t == 0) {
            int *flag = p.flags + (size_t)(m0 / MNISTCU__WBM) * gridDim.x + blockIdx.x;
            last = atomicAdd(flag, 1) == S - 1;
            if (last) *flag = 0; /* every slice has arrived: ready for the next product */
        }
        __syncthreads();
        if (!last) continue;
        __threadfence();
#pragma unroll
        for (i = 0; i < 8; ++i) {
            const int gm = m0 + (i < 4 ? 4 * ty + i : 64 + 4 * ty + i - 4);
            if (gm >= M) continue;
#pragma unroll
            for (j = 0; j < NJ; ++j) {
                const int gn = n0 + 64 * j + 4 * tx;
                const float *src = p.part + (size_t)gm * N + gn;
                const size_t slab = (size_t)M * N;
                float v[4];
                int z;
                if (pvec && gn + 3 < N) {
                    float4 s4 = __ldcg((const float4 *)src);
                    for (z = 1; z < S; ++z) {
                        const float4 u = __ldcg((const float4 *)(src + z * slab));
                        s4.x += u.x, s4.y += u.y, s4.z += u.z, s4.w += u.w;
                    }
                    v[0] = s4.x, v[1] = s4.y, v[2] = s4.z, v[3] = s4.w;
                } else {
                    for (q = 0; q < 4; ++q) {
                        v[q] = 0.0f;
                        if (gn + q >= N) continue;
                        v[q] = __ldcg(src + q);
                        for (z = 1; z < S; ++z) v[q] += __ldcg(src + z * slab + q);
                    }
                }
                for (q = 0; q < 4; ++q)
                    if (gn + q < N) v[q] = mnistcu__wide_epi<FUSE>(p, o, v[q], gm, gn + q);
                if (ovec && gn + 3 < N)
                    *(float4 *)&p.C[(size_t)gm * p.ldc + gn] = make_float4(v[0], v[1], v[2], v[3]);
                else
                    for (q = 0; q < 4; ++q)
                        if (gn + q < N) p.C[(size_t)gm * p.ldc + gn + q] = v[q];
            }
        }
    }
}

/* The tensor-core product (mnistcu_ctx_desc.precision TF32 or BF16): the same
   64x64 tiles of C, K-steps of 16 and split-K slices as mnistcu__k_gemm, with
   the operands rounded as they are staged (BF16) or loaded into fragments
   (TF32, round to nearest) and each warp's 16x32 part of the tile summed by
   the tensor cores in FP32 (wmma: 16x16x8 TF32, 16x16x16 BF16). The sum's
   order within a K-step is the hardware's; it is fixed, so two runs give the
   same bits. The tile goes through shared memory for the epilogue. Compiled to
   nothing before sm_80, where mnistcu__k_tc_probe reports 0 and the context
   keeps FP32. */
__global__ void mnistcu__k_tc_probe(int *ok)
{
    MNISTCU__PDL_WAIT();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    *ok = 1;
#else
    *ok = 0;
#endif
}

/* Products of fewer 64x64 tiles stay on the FP32 kernels even in a TF32 or BF16
   context: LeNet-5's dense layers at batch 64 (1 to 7 tiles) ran 1.14x slower
   per epoch on the tensor-core kernel than on the 16x16 one (bench/RESULTS.md). */
#define MNISTCU__TC_MIN_TILES 16
#define MNISTCU__TC_LDA 24 /* As [64][k]: 16 + 8, rows 32-byte aligned as wmma asks, fewer bank conflicts */
#define MNISTCU__TC_LDB 72 /* Bs [16][n] */
#define MNISTCU__TC_LDC 68 /* Cs [64][n] */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
/* Staging an operand: BF16 rounds to nearest here, TF32 keeps the float (the
   fragment rounds it). Explicit, so that builds with __CUDA_NO_BFLOAT16_CONVERSIONS__ work. */
static __device__ __forceinline__ void mnistcu__tc_put(float *p, float v) { *p = v; }
static __device__ __forceinline__ void mnistcu__tc_put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
template <int BF16> struct mnistcu__tc_round { /* BF16 fragments hold rounded values already */
    template <class F> static __device__ __forceinline__ void run(F &) {}
};
template <> struct mnistcu__tc_round<0> { /* TF32: round each loaded float to nearest */
    template <class F> static __device__ __forceinline__ void run(F &f)
    {
        int i;
        for (i = 0; i < f.num_elements; ++i) f.x[i] = nvcuda::wmma::__float_to_tf32(f.x[i]);
    }
};
#endif

template <int TA, int TB, int FUSE, int BF16>
__global__ void __launch_bounds__(256) mnistcu__k_gemm_tc(int M, int N, int K, const float *__restrict__ A, int lda,
                                                           const float *__restrict__ B, int ldb, float *__restrict__ C,
                                                           int ldc, const float *__restrict__ bias, int act)
{
    MNISTCU__PDL_WAIT();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    namespace wm = nvcuda::wmma;
    typedef typename std::conditional<BF16, __nv_bfloat16, float>::type st_t;       /* staged element */
    typedef typename std::conditional<BF16, __nv_bfloat16, wm::precision::tf32>::type op_t; /* fragment element */
    const int KF = BF16 ? 16 : 8; /* the fragments' K */
    __shared__ __align__(32) st_t As[MNISTCU__GBM * MNISTCU__TC_LDA];
    __shared__ __align__(32) st_t Bs[MNISTCU__GBK * MNISTCU__TC_LDB];
    __shared__ __align__(32) float Cs[MNISTCU__GBM * MNISTCU__TC_LDC];
    const int t = (int)threadIdx.x, w = t / 32, wm0 = 16 * (w / 2), wn0 = 32 * (w % 2);
    const int n0 = (int)blockIdx.x * MNISTCU__GBN;
    int r, k0, kk, m0, f, i;
    MNISTCU__GEMM_SLICE();
    for (m0 = (int)blockIdx.y * MNISTCU__GBM; m0 < M; m0 += (int)gridDim.y * MNISTCU__GBM) {
        wm::fragment<wm::accumulator, 16, 16, BF16 ? 16 : 8, float> acc[2];
        wm::fill_fragment(acc[0], 0.0f);
        wm::fill_fragment(acc[1], 0.0f);
        for (k0 = kz0; k0 < K; k0 += MNISTCU__GBK) {
            for (r = 0; r < 4; ++r) { /* read along each source's contiguous direction, as mnistcu__k_gemm */
                int m = TA ? t % 64 : t / 16 + 16 * r, k = TA ? t / 64 + 4 * r : t % 16;
                int gm = m0 + m, gk = k0 + k;
                float v = 0.0f;
                if (gm < M && gk < K) v = TA ? A[(size_t)gk * lda + gm] : A[(size_t)gm * lda + gk];
                mnistcu__tc_put(&As[m * MNISTCU__TC_LDA + k], v);
            }
            for (r = 0; r < 4; ++r) {
                int n = TB ? t / 16 + 16 * r : t % 64, k = TB ? t % 16 : t / 64 + 4 * r;
                int gn = n0 + n, gk = k0 + k;
                float v = 0.0f;
                if (gn < N && gk < K) v = TB ? B[(size_t)gn * ldb + gk] : B[(size_t)gk * ldb + gn];
                mnistcu__tc_put(&Bs[k * MNISTCU__TC_LDB + n], v);
            }
            __syncthreads();
            for (kk = 0; kk < MNISTCU__GBK; kk += KF) {
                wm::fragment<wm::matrix_a, 16, 16, BF16 ? 16 : 8, op_t, wm::row_major> fa;
                wm::load_matrix_sync(fa, As + wm0 * MNISTCU__TC_LDA + kk, MNISTCU__TC_LDA);
                mnistcu__tc_round<BF16>::run(fa);
#pragma unroll
                for (f = 0; f < 2; ++f) {
                    wm::fragment<wm::matrix_b, 16, 16, BF16 ? 16 : 8, op_t, wm::row_major> fb;
                    wm::load_matrix_sync(fb, Bs + kk * MNISTCU__TC_LDB + wn0 + 16 * f, MNISTCU__TC_LDB);
                    mnistcu__tc_round<BF16>::run(fb);
                    wm::mma_sync(acc[f], fa, fb, acc[f]);
                }
            }
            __syncthreads();
        }
        wm::store_matrix_sync(Cs + wm0 * MNISTCU__TC_LDC + wn0, acc[0], MNISTCU__TC_LDC, wm::mem_row_major);
        wm::store_matrix_sync(Cs + wm0 * MNISTCU__TC_LDC + wn0 + 16, acc[1], MNISTCU__TC_LDC, wm::mem_row_major);
        __syncthreads();
        for (i = t; i < MNISTCU__GBM * MNISTCU__GBN; i += 256) { /* coalesced: consecutive threads, consecutive n */
            int m = i / MNISTCU__GBN, n = i % MNISTCU__GBN, gm = m0 + m, gn = n0 + n;
            float v = Cs[m * MNISTCU__TC_LDC + n];
            if (gm < M && gn < N)
                C[(size_t)gm * ldc + gn] = FUSE ? mnistcu__act_f((mnistcu_act)act, bias ? v + bias[gn] : v) : v;
        }
        __syncthreads(); /* Cs is read before the next row of tiles overwrites it */
    }
#else
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc, (void)bias, (void)act;
#endif
}

/* >>cuda_x3 -----------------------------------------------------------------------
   FP32's accuracy on the tensor cores (mnistcu_ctx_desc.precision TF32X3).
   C = op(A) op(B) in 64x64 tiles, a block of four warps each taking 32x32 of
   its tile, over a slice of K (blockIdx.z; Ks each). The operands come into
   shared memory by cp.async, three stages of 32 k ahead, zero-filled past the
   edges, each in its global order: A [m][k] and B [n][k] as rows of k padded
   by 4 floats, A [k][m] and B [k][n] as rows of m or n padded by 8, so that
   mma.sync's fragment loads meet no bank conflict either way. Each value v is
   split as it is loaded into hi + lo (mnistcu__tf32_split: an integer add and a
   mask, full rate, where cvt.rna.tf32 is quarter rate and measured 1.2 times
   slower here), and a b = al bh + ah bl + ah bh on mma.sync m16n8k8. The
   tensor cores' own FP32 sums truncate, which over P3's K lost 20 times FP32's
   error (bench/gemm_tc3.cu); so each stage's 32 k are summed there from zero
   and added to the FP32 total rounded to nearest, which costs nothing measurable
   and gives FP32's error (2.5e-7 relative against cuBLAS's 2.9e-7). The sum's
   order is fixed, so two runs give the same bits. With few tiles K is split
   and the parts added in order (mnistcu__splitk_sum), as the other kernels do.
   Every dimension and leading dimension a multiple of 4, the operands 16-byte
   aligned (mnistcu__x3_ok). Compiled to nothing before sm_80 (the context
   then keeps FP32). */
#define MNISTCU__X3_T 64       /* the tile of C */
#define MNISTCU__X3_BK 32      /* k a stage */
#define MNISTCU__X3_STAGES 3
#define MNISTCU__X3_LDK (MNISTCU__X3_BK + 4) /* a row of k */
#define MNISTCU__X3_LDR (MNISTCU__X3_T + 8)  /* a row of m or n */
#define MNISTCU__X3_OPF (MNISTCU__X3_T * MNISTCU__X3_LDK) /* an operand's stage, floats: 64 x 36 = 32 x 72 */
#define MNISTCU__X3_SMEM ((size_t)MNISTCU__X3_STAGES * 2 * MNISTCU__X3_OPF * sizeof(float))
typedef char mnistcu__x3_same_stage[MNISTCU__X3_BK * MNISTCU__X3_LDR == MNISTCU__X3_OPF ? 1 : -1];

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
/* Three TF32 parts for FP32's accuracy on the tensor cores: v = hi + lo, hi = v rounded to TF32's 10
   bits (to nearest, ties away: an integer add and a mask, full-rate instructions where cvt.rna.tf32
   is quarter-rate), lo = v - hi exactly (|lo| <= 2^-11 |v|), of which the tensor cores take the top
   10 bits (truncated: an error under 2^-21 |v|). a b is then ah bh + ah bl + al bh (al bl, under
   2^-22 |a b|, is left out) */
static __device__ __forceinline__ void mnistcu__tf32_split(float v, uint32_t &hi, uint32_t &lo)
{
    hi = (__float_as_uint(v) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(v - __uint_as_float(hi));
}
/* d += a b for a 16x8 tile over 8 of K (PTX's m16n8k8 TF32 fragments: lane = 4 g + q holds A (g, q),
   (g + 8, q), (g, q + 4), (g + 8, q + 4); B (q, g), (q + 4, g); D (g, 2q), (g, 2q + 1), (g + 8, 2q),
   (g + 8, 2q + 1)) */
static __device__ __forceinline__ void mnistcu__tf32_mma(float *d, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* One stage of an operand: 64 rows (m or n) from r0 (rows past rlim zero), k from k0 (past kend zero). KM:
   the global matrix is X[r][k] (ld a row), kept as rows of k; else X[k][r], kept as rows of r. */
template <int KM>
static __device__ __forceinline__ void mnistcu__x3_stage(float *s, const float *X, int ld, int r0, int rlim, int k0,
                                                         int kend)
{
    int c;
    for (c = (int)threadIdx.x; c < MNISTCU__X3_T * MNISTCU__X3_BK / 4; c += 128) {
        const int r = KM ? c / (MNISTCU__X3_BK / 4) : (c % (MNISTCU__X3_T / 4)) * 4;
        const int k = KM ? (c % (MNISTCU__X3_BK / 4)) * 4 : c / (MNISTCU__X3_T / 4);
        const bool in = r0 + r < rlim && k0 + k < kend;
        const float *src = in ? X + (KM ? (size_t)(r0 + r) * ld + k0 + k : (size_t)(k0 + k) * ld + r0 + r) : X;
        float *dst = s + (KM ? r * MNISTCU__X3_LDK + k : k * MNISTCU__X3_LDR + r);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                     "l"(src), "r"(in ? 16 : 0));
    }
}
/* Element (r, k) of a stage kept as rows of k (KM) or of r. */
template <int KM> static __device__ __forceinline__ float mnistcu__x3_at(const float *s, int r, int k)
{
    return KM ? s[r * MNISTCU__X3_LDK + k] : s[k * MNISTCU__X3_LDR + r];
}
#endif

template <int TA, int TB>
__global__ void __launch_bounds__(128) mnistcu__k_gemm_x3(int M, int N, int K, int Ks, const float *__restrict__ A,
                                                          int lda, const float *__restrict__ B, int ldb,
                                                          float *__restrict__ C, int ldc)
{
    MNISTCU__PDL_WAIT();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) float mnistcu__x3_sm[];
    float *As = mnistcu__x3_sm, *Bs = mnistcu__x3_sm + MNISTCU__X3_STAGES * MNISTCU__X3_OPF;
    const int lane = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32, g = lane / 4, q = lane % 4;
    const int wm0 = 32 * (w / 2), wn0 = 32 * (w % 2);
    const int m0 = (int)blockIdx.y * MNISTCU__X3_T, n0 = (int)blockIdx.x * MNISTCU__X3_T;
    const int kbeg = (int)blockIdx.z * Ks, kend = min(K, kbeg + Ks);
    const int nk = (kend - kbeg + MNISTCU__X3_BK - 1) / MNISTCU__X3_BK;
    float acc[2][4][4], part[2][4][4];
    int i, j, e, st, kt, kk;
    for (i = 0; i < 2; ++i)
        for (j = 0; j < 4; ++j)
            for (e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    for (st = 0; st < MNISTCU__X3_STAGES - 1; ++st) {
        if (st < nk) {
            mnistcu__x3_stage<!TA>(As + st * MNISTCU__X3_OPF, A, lda, m0, M, kbeg + st * MNISTCU__X3_BK, kend);
            mnistcu__x3_stage<TB>(Bs + st * MNISTCU__X3_OPF, B, ldb, n0, N, kbeg + st * MNISTCU__X3_BK, kend);
        }
        asm volatile("cp.async.commit_group;");
    }
    for (kt = 0; kt < nk; ++kt) {
        const float *as = As + (kt % MNISTCU__X3_STAGES) * MNISTCU__X3_OPF;
        const float *bs = Bs + (kt % MNISTCU__X3_STAGES) * MNISTCU__X3_OPF;
        asm volatile("cp.async.wait_group %0;" ::"n"(MNISTCU__X3_STAGES - 2));
        __syncthreads(); /* stage kt is in; every warp is done with kt - 1, whose buffer the next load takes */
        {
            const int nt = kt + MNISTCU__X3_STAGES - 1, sb = nt % MNISTCU__X3_STAGES;
            if (nt < nk) {
                mnistcu__x3_stage<!TA>(As + sb * MNISTCU__X3_OPF, A, lda, m0, M, kbeg + nt * MNISTCU__X3_BK, kend);
                mnistcu__x3_stage<TB>(Bs + sb * MNISTCU__X3_OPF, B, ldb, n0, N, kbeg + nt * MNISTCU__X3_BK, kend);
            }
            asm volatile("cp.async.commit_group;");
        }
#pragma unroll
        for (i = 0; i < 2; ++i)
#pragma unroll
            for (j = 0; j < 4; ++j)
#pragma unroll
                for (e = 0; e < 4; ++e) part[i][j][e] = 0.0f;
#pragma unroll
        for (kk = 0; kk < MNISTCU__X3_BK; kk += 8) {
            uint32_t ah[2][4], al[2][4], bh[4][2], bl[4][2];
#pragma unroll
            for (i = 0; i < 2; ++i) { /* A's m16n8k8 fragment: (g, q), (g + 8, q), (g, q + 4), (g + 8, q + 4) */
                const int r = wm0 + 16 * i + g;
                mnistcu__tf32_split(mnistcu__x3_at<!TA>(as, r, kk + q), ah[i][0], al[i][0]);
                mnistcu__tf32_split(mnistcu__x3_at<!TA>(as, r + 8, kk + q), ah[i][1], al[i][1]);
                mnistcu__tf32_split(mnistcu__x3_at<!TA>(as, r, kk + q + 4), ah[i][2], al[i][2]);
                mnistcu__tf32_split(mnistcu__x3_at<!TA>(as, r + 8, kk + q + 4), ah[i][3], al[i][3]);
            }
#pragma unroll
            for (j = 0; j < 4; ++j) { /* B's: (k q, n g), (k q + 4, n g) */
                const int n = wn0 + 8 * j + g;
                mnistcu__tf32_split(mnistcu__x3_at<TB>(bs, n, kk + q), bh[j][0], bl[j][0]);
                mnistcu__tf32_split(mnistcu__x3_at<TB>(bs, n, kk + q + 4), bh[j][1], bl[j][1]);
            }
            /* each pass over all eight (i, j): eight independent sums between two that depend */
#pragma unroll
            for (i = 0; i < 2; ++i)
#pragma unroll
                for (j = 0; j < 4; ++j) mnistcu__tf32_mma(part[i][j], al[i], bh[j]);
#pragma unroll
            for (i = 0; i < 2; ++i)
#pragma unroll
                for (j = 0; j < 4; ++j) mnistcu__tf32_mma(part[i][j], ah[i], bl[j]);
#pragma unroll
            for (i = 0; i < 2; ++i)
#pragma unroll
                for (j = 0; j < 4; ++j) mnistcu__tf32_mma(part[i][j], ah[i], bh[j]);
        }
#pragma unroll
        for (i = 0; i < 2; ++i) /* the stage's sums into the total, rounded to nearest */
#pragma unroll
            for (j = 0; j < 4; ++j)
#pragma unroll
                for (e = 0; e < 4; ++e) acc[i][j][e] += part[i][j][e];
    }
    asm volatile("cp.async.wait_group 0;");
    C += (size_t)blockIdx.z * (size_t)M * (size_t)N; /* slice z's part (ldc = N then); slice 0 with one slice */
#pragma unroll
    for (i = 0; i < 2; ++i)
#pragma unroll
        for (j = 0; j < 4; ++j) { /* D's: (g, 2q), (g, 2q + 1), (g + 8, 2q), (g + 8, 2q + 1) */
            const int r = m0 + wm0 + 16 * i + g, c = n0 + wn0 + 8 * j + 2 * q;
            if (c < N) {
                if (r < M) *(float2 *)(C + (size_t)r * ldc + c) = make_float2(acc[i][j][0], acc[i][j][1]);
                if (r + 8 < M) *(float2 *)(C + (size_t)(r + 8) * ldc + c) = make_float2(acc[i][j][2], acc[i][j][3]);
            }
        }
#else
    (void)M, (void)N, (void)K, (void)Ks, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc;
#endif
}

/* C = epilogue(sum over s of part [S][M][N]), slices added in order. fuse 1:
   act(sum + bias); 2: act'(y) * sum, y laid out as C (an input gradient times
   the derivative of the activation that made the input, see >>cuda_head). */
__global__ void mnistcu__k_splitk_sum(const float *part, int S, int M, int N, float *C, int ldc, const float *bias,
                                      int act, int fuse, const float *y)
{
    MNISTCU__PDL_WAIT();
    size_t n = (size_t)M * N, e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float acc = part[e];
        int s2;
        size_t col = mnistcu__mod(e, (size_t)N);
        for (s2 = 1; s2 < S; ++s2) acc += part[(size_t)s2 * n + e];
        size_t at = mnistcu__div(e, (size_t)N) * (size_t)ldc + col;
        if (fuse == 1) acc = mnistcu__act_f((mnistcu_act)act, bias ? acc + bias[col] : acc);
        if (fuse == 2) acc = mnistcu__act_backward_one((mnistcu_act)act, acc, y[at]);
        C[at] = acc;
    }
}

/* mnistcu__k_splitk_sum four outputs a thread (16-byte loads of the parts,
   16-byte stores): N and ldc multiples of 4, part, C and y 16-byte aligned
   (mnistcu__splitk_sum decides). Each output's sums and epilogue are the same
   operations in the same order, so the same bits. */
__global__ void mnistcu__k_splitk_sum4(const float *part, int S, int M, int N, float *C, int ldc, const float *bias,
                                       int act, int fuse, const float *y)
{
    MNISTCU__PDL_WAIT();
    const size_t n4 = (size_t)M * N / 4, N4 = (size_t)N / 4;
    const float4 *p4 = (const float4 *)part;
    size_t e;
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n4; e += (size_t)gridDim.x * blockDim.x) {
        float4 acc = p4[e];
        const size_t row = mnistcu__div(e, N4), col = (e - row * N4) * 4, at = row * (size_t)ldc + col;
        float v[4];
        int s2, q;
        for (s2 = 1; s2 < S; ++s2) {
            const float4 b = p4[(size_t)s2 * n4 + e];
            acc.x += b.x, acc.y += b.y, acc.z += b.z, acc.w += b.w;
        }
        v[0] = acc.x, v[1] = acc.y, v[2] = acc.z, v[3] = acc.w;
        if (fuse == 1)
            for (q = 0; q < 4; ++q) v[q] = mnistcu__act_f((mnistcu_act)act, bias ? v[q] + bias[col + q] : v[q]);
        if (fuse == 2) {
            const float4 yy = *(const float4 *)(y + at);
            const float y4[4] = {yy.x, yy.y, yy.z, yy.w};
            for (q = 0; q < 4; ++q) v[q] = mnistcu__act_backward_one((mnistcu_act)act, v[q], y4[q]);
        }
        *(float4 *)(C + at) = make_float4(v[0], v[1], v[2], v[3]);
    }
}

/* The split product's parts added (mnistcu__k_splitk_sum), four outputs a
   thread where the shapes and addresses allow. Measured on the H100: P3 with
   cuBLAS's products 24.6 -> 23.6 ms an epoch (means of six alternated runs),
   though ncu with flushed caches times each sum slower (7.4-7.8 -> 9.4-10.0
   us): in the step the parts are still in L2. Loading up to four parts at
   once measured slower again (24.1 ms), bench/RESULTS.md. */
static void mnistcu__splitk_sum(cudaStream_t st, const float *part, int S, int M, int N, float *C, int ldc,
                                const float *bias, int act, int fuse, const float *y)
{
    const size_t n = (size_t)M * N;
    if (N % 4 == 0 && ldc % 4 == 0 && ((uintptr_t)part & 15) == 0 && ((uintptr_t)C & 15) == 0 &&
        (fuse != 2 || ((uintptr_t)y & 15) == 0))
        mnistcu__launch(mnistcu__k_splitk_sum4, mnistcu__blocks(n / 4), MNISTCU__THREADS, 0, st, part, S, M, N, C, ldc,
                        bias, act, fuse, y);
    else
        mnistcu__launch(mnistcu__k_splitk_sum, mnistcu__blocks(n), MNISTCU__THREADS, 0, st, part, S, M, N, C, ldc,
                        bias, act, fuse, y);
}

/* >>cuda_skinny --------------------------------------------------------------------
   A weight gradient of few outputs, C [M][N] = A^T B with A [K][M] (dy, M at
   most MNISTCU__SKINNY_M: a classifier's last layer) and B [K][N] (its
   input): the generic kernels tile M by 16 or 64 and leave most of each tile
   empty, and cuBLAS's kernel for it took 11.7 us of P3's step (10 x 1024 x
   512, ncu). Here a block takes MNISTCU__SKINNY_CW columns of C, all M rows,
   and splits K into MNISTCU__SKINNY_SL slices of ceil(K / SL) rows, a thread
   per column and slice: each output's chain of fmaf over its slice's rows in
   order, then the slices' sums added in order from slice 0 (a fixed order, so
   the same bits every run; K is at most MNISTCU__SKINNY_MAX_K, so a slice's
   loads are all in flight in a few rounds). db: also each column of A summed
   over its rows in order from 0.0f, mnistcu__k_bias_grad's sums, in one more
   block. upd: the optimizer's step of each weight (and bias entry) as its
   gradient is written, as FUSE 4 of mnistcu__k_gemm_wide (>>cuda_update). */
#define MNISTCU__SKINNY_M 16
#define MNISTCU__SKINNY_SL 32
#define MNISTCU__SKINNY_CW (MNISTCU__THREADS / MNISTCU__SKINNY_SL)
#define MNISTCU__SKINNY_MAX_K 1024
#define MNISTCU__SKINNY_UNROLL 8 /* a slice's rows loaded at once */
#define MNISTCU__SKINNY_SMEM 8192 /* floats of shared memory a block */
#define MNISTCU__SKINNY_MAX_N 16384 /* wider (im2col's input gradients of 1-channel 3x3 kernels): the tiled kernels */
static_assert(MNISTCU__THREADS % MNISTCU__SKINNY_SL == 0 && MNISTCU__SKINNY_M * MNISTCU__SKINNY_CW <= MNISTCU__THREADS &&
                  MNISTCU__SKINNY_SL * MNISTCU__SKINNY_M * (MNISTCU__SKINNY_CW + 1) <= MNISTCU__SKINNY_SMEM,
              "the skinny kernel's block shape and shared memory");

/* The shapes the skinny kernel takes (its products stay FP32 in every
   precision: too few outputs for the tensor cores), and the order of their
   sums, which the fused MLP kernel's W2 gradient follows (>>cuda_fused). */
static MNISTCU__HD int mnistcu__skinny_shape(size_t M, size_t N, size_t K)
{
    return M >= 1 && M <= MNISTCU__SKINNY_M && N >= 32 && N <= MNISTCU__SKINNY_MAX_N && K >= 1 &&
           K <= MNISTCU__SKINNY_MAX_K;
}

typedef struct mnistcu__skinp {
    const float *A, *B;
    float *C, *db;
    int M, N, K, lda, ldb, ldc;
    float *w, *s, *bw, *bs; /* upd: the weights, their momentum buffers, the bias and its buffers */
    const mnistcu__dyn *dyn;
    mnistcu__opt opt;
    int upd;
} mnistcu__skinp;

__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_gemm_skinny(mnistcu__skinp p)
{
    MNISTCU__PDL_WAIT();
    enum { MC = MNISTCU__SKINNY_M, SL = MNISTCU__SKINNY_SL, CW = MNISTCU__SKINNY_CW, U = MNISTCU__SKINNY_UNROLL };
    /* the slices' sums part [SL][MC][CW + 1]; in the bias gradient's block, rows of A */
    __shared__ float sbuf[MNISTCU__SKINNY_SMEM];
    float(*part)[MC][CW + 1] = (float(*)[MC][CW + 1])sbuf;
    const int t = (int)threadIdx.x, M = p.M;
    const mnistcu__opt o = p.upd && p.dyn ? p.dyn->opt : p.opt; /* a replayed step's scalars */
    int c, u;
    if (p.db && blockIdx.x == gridDim.x - 1) { /* the bias gradient: rows staged, then a chain a column */
        const int rows_at_once = (int)(sizeof sbuf / sizeof(float)) / M;
        float sum = 0.0f, bw = 0.0f, bs = 0.0f;
        int r0, k;
        if (p.upd && p.bw && t < M) { /* the step's operands, loading while the sums run */
            bw = p.bw[t];
            if (o.has_momentum) bs = p.bs[t];
        }
        for (r0 = 0; r0 < p.K; r0 += rows_at_once) {
            const int n = p.K - r0 < rows_at_once ? p.K - r0 : rows_at_once;
            __syncthreads();
            for (k = t; k < n * M; k += 8 * MNISTCU__THREADS) { /* 8 loads in flight a thread */
                float v[8];
#pragma unroll
                for (u = 0; u < 8; ++u) {
                    const int e = k + u * MNISTCU__THREADS, r = e / M;
                    v[u] = e < n * M ? p.A[(size_t)(r0 + r) * p.lda + (e - r * M)] : 0.0f;
                }
#pragma unroll
                for (u = 0; u < 8; ++u)
                    if (k + u * MNISTCU__THREADS < n * M) sbuf[k + u * MNISTCU__THREADS] = v[u];
            }
            __syncthreads();
            if (t < M) {
#pragma unroll 32
                for (k = 0; k < n; ++k) sum += sbuf[k * M + t];
            }
        }
        if (t < M) {
            p.db[t] = sum;
            if (p.upd && p.bw) {
                p.bw[t] = mnistcu__sgd_step(&o, bw, sum, o.has_momentum ? &bs : NULL);
                if (o.has_momentum) p.bs[t] = bs;
            }
        }
        return;
    }
    {
        const int col = t % CW, sl = t / CW, n = (int)blockIdx.x * CW + col;
        const int R = (p.K + SL - 1) / SL, r1 = (sl + 1) * R < p.K ? (sl + 1) * R : p.K;
        /* thread t < M * CW writes output (t / CW, t % CW) of the block: its weight and buffer, early */
        const int oc = t / CW, on = (int)blockIdx.x * CW + t % CW, mine = t < M * CW && on < p.N;
        const size_t oi = (size_t)oc * p.ldc + (size_t)on;
        float acc[MC], wv = 0.0f, sv = 0.0f;
        int r;
        if (p.upd && mine) {
            wv = p.w[oi];
            if (o.has_momentum) sv = p.s[oi];
        }
#pragma unroll
        for (c = 0; c < MC; ++c) acc[c] = 0.0f;
        if (n < p.N)
            for (r = sl * R; r < r1; r += U) { /* U rows' loads, then their fmaf in row order */
                float a[U][MC], x[U];
#pragma unroll
                for (u = 0; u < U; ++u) {
                    const int ok = r + u < r1;
                    x[u] = ok ? p.B[(size_t)(r + u) * p.ldb + n] : 0.0f;
#pragma unroll
                    for (c = 0; c < MC; ++c) a[u][c] = ok && c < M ? __ldg(p.A + (size_t)(r + u) * p.lda + c) : 0.0f;
                }
#pragma unroll
                for (u = 0; u < U; ++u)
                    if (r + u < r1) {
#pragma unroll
                        for (c = 0; c < MC; ++c) acc[c] = fmaf(a[u][c], x[u], acc[c]);
                    }
            }
#pragma unroll
        for (c = 0; c < MC; ++c) part[sl][c][col] = acc[c];
        __syncthreads();
        if (mine) {
            const int slices = (p.K + R - 1) / R, cc = t % CW; /* those with rows */
            float v = part[0][oc][cc];
            int s2;
#pragma unroll 8
            for (s2 = 1; s2 < slices; ++s2) v += part[s2][oc][cc];
            p.C[oi] = v;
            if (p.upd) {
                p.w[oi] = mnistcu__sgd_step(&o, wv, v, o.has_momentum ? &sv : NULL);
                if (o.has_momentum) p.s[oi] = sv;
            }
        }
    }
}

/* The loss and its gradient (mnistcu__loss_row), one thread per sample. */
__global__ void mnistcu__k_loss(mnistcu__lossp lp, const float *logits, const int32_t *labels, const float *targets,
                                int B, int C, float grad_scale, float *grad, float *loss, int32_t *pred)
{
    MNISTCU__PDL_WAIT();
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < B)
        mnistcu__loss_row(&lp, logits + (size_t)i * C, labels[i], targets ? targets + (size_t)i * C : NULL, (size_t)C,
                          grad_scale, grad ? grad + (size_t)i * C : NULL, &loss[i], &pred[i]);
}

/* One block of MNISTCU__THREADS threads (all of them call it): the step's loss
   sum and correct count in a fixed order (each warp's values by shuffles, then
   the warps' sums in order), so the same bits every run. sl and sc: shared,
   MNISTCU__THREADS / 32 each. The step kernels, the fused MLP kernel and the
   head all use it (or mnistcu__stats_warp, its sums by one warp), so their
   sums agree. Volatile loads: the head's last block reads rows other blocks
   wrote (not from its own L1). */
static __device__ void mnistcu__stats_block(const volatile float *loss, const volatile int32_t *pred,
                                            const int32_t *labels, int B, double *sl, double *sc, double *loss_out,
                                            double *correct_out)
{
    int t = (int)threadIdx.x, i, o;
    double l = 0.0, c = 0.0;
    for (i = t; i < B; i += MNISTCU__THREADS) {
        l += (double)loss[i];
        c += pred[i] == labels[i] ? 1.0 : 0.0;
    }
    for (o = 16; o > 0; o >>= 1) {
        l += __shfl_down_sync(0xffffffffu, l, o);
        c += __shfl_down_sync(0xffffffffu, c, o);
    }
    if ((t & 31) == 0) {
        sl[t >> 5] = l;
        sc[t >> 5] = c;
    }
    __syncthreads();
    if (t == 0) {
        l = c = 0.0;
        for (i = 0; i < MNISTCU__THREADS / 32; ++i) {
            l += sl[i];
            c += sc[i];
        }
        *loss_out = l;
        *correct_out = c;
    }
}

/* mnistcu__stats_block's sums made by one warp, the same bits: each of the
   block's warps' shuffle trees in turn, then their results in order. */
static __device__ void mnistcu__stats_warp(const float *loss, const int32_t *pred, const int32_t *labels, int B,
                                           double *loss_out, double *correct_out)
{
    const int lane = (int)(threadIdx.x & 31u);
    double lsum = 0.0, csum = 0.0;
    int w, i, o;
    for (w = 0; w < MNISTCU__THREADS / 32; ++w) {
        double l = 0.0, c = 0.0;
        for (i = 32 * w + lane; i < B; i += MNISTCU__THREADS) {
            l += (double)loss[i];
            c += pred[i] == labels[i] ? 1.0 : 0.0;
        }
        for (o = 16; o > 0; o >>= 1) {
            l += __shfl_down_sync(0xffffffffu, l, o);
            c += __shfl_down_sync(0xffffffffu, c, o);
        }
        lsum += l; /* lane 0's: warp w's sum */
        csum += c;
    }
    if (lane == 0) {
        *loss_out = lsum;
        *correct_out = csum;
    }
}

__global__ void mnistcu__k_step_stats(const float *loss, const int32_t *pred, const int32_t *labels, int B,
                                      double *loss_out, double *correct_out, const mnistcu__dyn *dyn)
{
    MNISTCU__PDL_WAIT();
    __shared__ double sl[MNISTCU__THREADS / 32], sc[MNISTCU__THREADS / 32];
    if (dyn) { /* a step replayed from a graph: the outputs are the epoch's arrays, indexed by its slot */
        loss_out += dyn->slot;
        correct_out += dyn->slot;
    }
    mnistcu__stats_block(loss, pred, labels, B, sl, sc, loss_out, correct_out);
}

/* A training step's loss rows and its statistics in one block, one launch
   instead of two: mnistcu__k_loss's rows (a thread each, in turn), then
   mnistcu__k_step_stats's sums over them, the same functions, so the same bits.
   For batches up to MNISTCU__LOSS_STATS_ROWS (see >>train): on the H100 (bench/
   bias_grad.cu) 4.4 us against 6.4 for the two kernels at batch 64, but 9.0
   against 8.1 at 512, where the rows take a block two turns. */

__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_loss_stats(
    mnistcu__lossp lp, const float *logits, const int32_t *labels, const float *targets, int B, int C, float grad_scale,
    float *grad, float *loss, int32_t *pred, double *loss_out, double *correct_out, const mnistcu__dyn *dyn)
{
    MNISTCU__PDL_WAIT();
    __shared__ double sl[MNISTCU__THREADS / 32], sc[MNISTCU__THREADS / 32];
    int i;
    for (i = (int)threadIdx.x; i < B; i += MNISTCU__THREADS)
        mnistcu__loss_row(&lp, logits + (size_t)i * C, labels[i], targets ? targets + (size_t)i * C : NULL, (size_t)C,
                          grad_scale, grad + (size_t)i * C, &loss[i], &pred[i]);
    __syncthreads(); /* every row's loss and prediction, to every thread of the block */
    if (dyn) { /* a step replayed from a graph: the outputs are the epoch's arrays, indexed by its slot */
        loss_out += dyn->slot;
        correct_out += dyn->slot;
    }
    mnistcu__stats_block(loss, pred, labels, B, sl, sc, loss_out, correct_out);
}

/* >>cuda_head ----------------------------------------------------------------------
   The classifier head: a training step's last dense layer (identity, at
   most MNISTCU__HEAD_MAX_C outputs), its loss and the step's statistics, its bias
   gradient and its input gradient, in one kernel, where the step by step path
   takes a product, the loss kernel(s), a column sum, a second product and the
   previous layer's activation derivative (the weight gradient stays a product). Each block takes MNISTCU__HEAD_ROWS rows, two warps each; it
   stages the weights and its rows MNISTCU__HEAD_KC inputs at a time in shared
   memory, the next pass's loads in flight while the chains run.
   The arithmetic is the product kernels' own: each logit one chain of fmaf over
   the inputs in order from 0, the padding's +0 where the inputs are not a
   whole number of 16-wide K steps, the bias after (mnistcu__k_gemm16's); the
   loss by mnistcu__loss_row; each input gradient one chain over the classes
   in order (mnistcu__k_gemm's), then the previous dense layer's act' from its
   output (mnistcu__act_backward_one). So with our products, where
   mnistcu__gemm_split leaves the logits' product whole (under 2048 inputs; with
   32 classes, under 1024 or a batch under 32), a step gives the same bits with
   the head as without; with cuBLAS's the products' order is cuBLAS's, and the two agree
   within rounding (cuda_head_step test). The statistics: the block that
   finishes last (an integer ticket; no float atomics) sums every row's loss in
   mnistcu__stats_block's fixed order, and each class's bias gradient over the
   rows in order (mnistcu__k_bias_grad's sums; where the skinny kernel takes
   the layer's weight gradient, it sums them there instead, the same bits,
   >>cuda_skinny), and puts the ticket back to 0.
   In TF32 and BF16 contexts the head computes in FP32 too (reduced precision
   is a permission): its logits' product has at most 32 outputs a row, which
   our kernels keep in FP32 up to a batch of 1024 (MNISTCU__TC_MIN_TILES); the
   step by step path may run the input gradient's product (K = the classes)
   and, with cuBLAS, the logits' on the tensor cores, so there the two agree
   within the reduced precision's bound, not to the bit. Measured on the H200
   (ncu, caches flushed, P3 in TF32 with cuBLAS): the step by step path's last
   layer, loss, statistics, column sum, input gradient product and ReLU
   derivative took 41 us of the step, the head 16-20; epochs in TF32 with
   cuBLAS, same call: P3 16.3 -> 14.3-14.7 ms, P2 35.9 -> 27.6, LeNet-5 108.4
   -> 97.0, the Fashion CNN 163 -> 154 (bench/RESULTS.md).
   Measured on the H100 (ncu, one replayed step, caches flushed): P3's head
   (512 rows, 1024 inputs) 15.9 us where the step by step path took 14.4 for
   the product with its bias, 8 for the loss and statistics, a second product
   and 4.6 for the ReLU derivative; LeNet-5's (64 rows, 84 inputs) 7.6 us.
   Epochs, same call: LeNet-5 118.4/117.6 -> 114.5/114.2 ms (own products),
   135.1/134.3 -> 123.4/123.2 (cuBLAS's), the Fashion CNN 376.4 -> 363.6/365.7.
   Earlier versions, a warp a row: 52-72 us for P3, its time in lane 0 reading
   the logits back from global memory, in 32 predicated loads per class loop
   and in the input gradient's loads waiting one after another (bench/RESULTS.md). */
#define MNISTCU__HEAD_ROWS (MNISTCU__THREADS / 64)
#define MNISTCU__HEAD_KC MNISTCU__THREADS /* thread t stages input t of each pass */
#define MNISTCU__HEAD_LDW (MNISTCU__HEAD_KC + 4)
#define MNISTCU__HEAD_MAX_C 32
#define MNISTCU__HEAD_DB_ROWS MNISTCU__HEAD_LDW /* rows of C <= NC gradients: within ws [NC][LDW] */

typedef struct mnistcu__headp {
    const float *x, *w, *bias; /* x [B][IN] the layer's input (the previous layer's output), w [C][IN], bias or NULL */
    float *logits, *g, *dx;    /* [B][C], the loss gradient [B][C], the input gradient [B][IN] or NULL */
    float *db;                 /* the bias gradient [C], or NULL */
    const int32_t *labels;
    const float *targets;      /* [B][C] or NULL */
    float *loss;               /* [B] */
    int32_t *pred;             /* [B] */
    double *loss_out, *correct_out; /* the step's statistics */
    const mnistcu__dyn *dyn;   /* a step replayed from a graph: the statistics' slot */
    unsigned *ticket;          /* 0 before and after */
    mnistcu__lossp lp;
    float grad_scale;
    int B, IN, C, act;         /* act: the previous dense layer's, applied to dx (IDENTITY: none) */
} mnistcu__headp;

/* Thread t's share of staging pass k0 into registers: input kk = t of the
   weights' NC rows (those past C zero) and of the block's rows, the last pass
   padded with zeros. mnistcu__k_head writes them to shared memory. */
template <int NC>
static __device__ __forceinline__ void mnistcu__head_get(const mnistcu__headp &p, int k0, int r0, float *wv, float *xv)
{
    const int t = (int)threadIdx.x, kn = p.IN - k0 < MNISTCU__HEAD_KC ? p.IN - k0 : MNISTCU__HEAD_KC;
    int u;
#pragma unroll
    for (u = 0; u < NC; ++u)
        wv[u] = u < p.C && t < kn ? __ldg(p.w + (size_t)u * p.IN + k0 + t) : 0.0f;
#pragma unroll
    for (u = 0; u < MNISTCU__HEAD_ROWS; ++u)
        xv[u] = r0 + u < p.B && t < kn ? p.x[(size_t)(r0 + u) * p.IN + k0 + t] : 0.0f;
}

/* CT: the number of classes when the kernel is made for it (10), so that its
   loops over the classes are exact; 0: any C up to MNISTCU__HEAD_MAX_C. Each
   row has two warps: the first runs the logits' chains (a lane per class), both
   the input gradient (a lane per input). */
template <int CT>
__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_head(mnistcu__headp p)
{
    MNISTCU__PDL_WAIT();
    enum { NC = CT ? CT : MNISTCU__HEAD_MAX_C };
    /* rows MNISTCU__HEAD_LDW apart: a quarter warp's 16-byte loads of 8 rows fall in distinct banks */
    __shared__ __align__(16) float ws[NC][MNISTCU__HEAD_LDW];
    __shared__ __align__(16) float xs[MNISTCU__HEAD_ROWS][MNISTCU__HEAD_KC];
    __shared__ float zs[MNISTCU__HEAD_ROWS][NC], gs[MNISTCU__HEAD_ROWS][NC];
    __shared__ double sl[MNISTCU__THREADS / 32], sc[MNISTCU__THREADS / 32];
    __shared__ int last;
    const int t = (int)threadIdx.x, lane = t & 31, wp = t >> 5, row = wp >> 1, half = wp & 1;
    const int r0 = (int)blockIdx.x * MNISTCU__HEAD_ROWS, r = r0 + row, IN = p.IN, C = CT ? CT : p.C;
    const int live = r < p.B;
    mnistcu__lossp lp = p.lp;
    float acc = 0.0f, wv[NC], xv[MNISTCU__HEAD_ROWS];
    int k0, k, u;
    mnistcu__head_get<NC>(p, 0, r0, wv, xv);
    for (k0 = 0; k0 < IN; k0 += MNISTCU__HEAD_KC) { /* the logits: a lane per class */
        /* the last pass's zeros (to a multiple of 4) are added last, as the product kernel's padding */
        const int kn = IN - k0 < MNISTCU__HEAD_KC ? IN - k0 : MNISTCU__HEAD_KC, k4 = (kn + 3) & ~3;
        __syncthreads(); /* the last pass has read its chunk */
#pragma unroll
        for (u = 0; u < NC; ++u) ws[u][t] = wv[u];
#pragma unroll
        for (u = 0; u < MNISTCU__HEAD_ROWS; ++u) xs[u][t] = xv[u];
        __syncthreads();
        if (k0 + MNISTCU__HEAD_KC < IN) mnistcu__head_get<NC>(p, k0 + MNISTCU__HEAD_KC, r0, wv, xv); /* in flight */
        if (half == 0 && lane < C && live) {
            const float4 *xq = (const float4 *)xs[row], *wq = (const float4 *)ws[lane];
#pragma unroll 8
            for (k = 0; k < k4 / 4; ++k) { /* 16-byte shared loads: a broadcast, and 8 rows a quarter warp */
                float4 a = xq[k], b = wq[k];
                acc = fmaf(a.x, b.x, acc);
                acc = fmaf(a.y, b.y, acc);
                acc = fmaf(a.z, b.z, acc);
                acc = fmaf(a.w, b.w, acc);
            }
        }
    }
    if (half == 0 && lane < C && live) {
        if (IN % 16) acc = acc + 0.0f; /* the product kernel's zero padding to 16: -0 becomes +0 */
        acc = p.bias ? acc + p.bias[lane] : acc;
        zs[row][lane] = acc;
        p.logits[(size_t)r * C + lane] = acc;
    }
    __syncwarp();
    if (half == 0 && lane == 0 && live) /* from shared memory: the row's logits in, its gradient out */
        mnistcu__loss_row(&lp, zs[row], p.labels[r], p.targets ? p.targets + (size_t)r * C : NULL, (size_t)C,
                          p.grad_scale, gs[row], &p.loss[r], &p.pred[r]);
    __syncthreads(); /* the row's gradient, to both its warps */
    if (half == 0 && lane < C && live) p.g[(size_t)r * C + lane] = gs[row][lane];
    if (p.dx && live) /* the input gradient: a lane per input, 4 inputs a warp a pass, weights along their rows */
        for (k0 = half * 32 + lane; k0 < IN; k0 += 256) {
            float a[4], y[4], w[4][NC];
            int c;
#pragma unroll
            for (u = 0; u < 4; ++u) { /* every load of the pass at once */
                k = k0 + 64 * u;
                a[u] = 0.0f;
                y[u] = p.act != MNISTCU_ACT_IDENTITY && k < IN ? p.x[(size_t)r * IN + k] : 0.0f;
#pragma unroll
                for (c = 0; c < NC; ++c) w[u][c] = c < C && k < IN ? __ldg(p.w + (size_t)c * IN + k) : 0.0f;
            }
#pragma unroll
            for (c = 0; c < NC; ++c)
                if (c < C) {
                    float gc = gs[row][c];
#pragma unroll
                    for (u = 0; u < 4; ++u) a[u] = fmaf(gc, w[u][c], a[u]); /* each input's chain over c in order */
                }
#pragma unroll
            for (u = 0; u < 4; ++u) {
                k = k0 + 64 * u;
                if (k < IN) {
                    float v = C % 16 ? a[u] + 0.0f : a[u];
                    if (p.act != MNISTCU_ACT_IDENTITY) v = mnistcu__act_backward_one((mnistcu_act)p.act, v, y[u]);
                    p.dx[(size_t)r * IN + k] = v;
                }
            }
        }
    __threadfence(); /* the rows' losses, predictions and loss gradients, visible before the block's ticket */
    __syncthreads();
    if (t == 0) last = atomicAdd(p.ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last) { /* every block's rows are written: the step's sums, in the fixed order */
        double *lo = p.loss_out, *co = p.correct_out;
        __threadfence();
        if (p.dyn) {
            lo += p.dyn->slot;
            co += p.dyn->slot;
        }
        mnistcu__stats_block(p.loss, p.pred, p.labels, p.B, sl, sc, lo, co);
        if (p.db) { /* the bias gradient: each class's sum over the rows in order from 0, as mnistcu__k_bias_grad;
                       the rows staged MNISTCU__HEAD_DB_ROWS at a time in the weights' place */
            float *tile = &ws[0][0], sum = 0.0f;
            const volatile float *g = p.g;
            int r1, n, e;
            for (r1 = 0; r1 < p.B; r1 += MNISTCU__HEAD_DB_ROWS) {
                n = p.B - r1 < MNISTCU__HEAD_DB_ROWS ? p.B - r1 : MNISTCU__HEAD_DB_ROWS;
                __syncthreads();
                for (e = t; e < n * C; e += MNISTCU__THREADS) tile[e] = g[(size_t)r1 * C + e];
                __syncthreads();
                if (t < C)
                    for (k = 0; k < n; ++k) sum += tile[k * C + t];
            }
            if (t < C) p.db[t] = sum;
        }
        if (t == 0) *p.ticket = 0;
    }
}

/* The ranges of the parameter arena the optimizer's pass steps, in order:
   all of it, but the weights and biases whose step was taken in their
   gradient's product (>>cuda_update). */
#define MNISTCU__SEGS (2 * MNISTCU_MAX_MODEL_LAYERS + 1)
typedef struct mnistcu__segs {
    int count;
    size_t total; /* the sum of len */
    size_t off[MNISTCU__SEGS], len[MNISTCU__SEGS];
} mnistcu__segs;

/* One optimizer step over the ranges todo of the flat parameter arena
   (mnistcu__opt_one, see >>cpu_ops); coef: NULL, or the clipping factor in
   device memory. SGD, with or without momentum, takes MNISTCU__OPT_ILP
   parameters a thread a pass, a block's stride apart (each load coalesced),
   every load of the pass issued before the first step: one parameter a
   thread waited for its loads each time. P3's pass over 1.86 million
   parameters in TF32: 15.3 -> 8.2 us (ncu on the H200, caches flushed), its
   epoch 14.3-14.5 -> 12.8 ms. The same operations on the same values
   (mnistcu__sgd_step), so the same bits. */
#define MNISTCU__OPT_ILP 4

static __device__ __forceinline__ size_t mnistcu__seg_index(const mnistcu__segs &todo, size_t j)
{
    int q = 0;
    while (j >= todo.len[q]) j -= todo.len[q++];
    return j + todo.off[q];
}

__global__ void mnistcu__k_optim(mnistcu__opt o, float *w, const float *g, float *state, const float *coef,
                                 const mnistcu__dyn *dyn, mnistcu__segs todo)
{
    MNISTCU__PDL_WAIT();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t j;
    float c = coef ? *coef : 1.0f;
    if (dyn) o = dyn->opt; /* a step replayed from a graph: this step's scalars */
    if (o.kind == MNISTCU_OPTIM_SGD) {
        const int keep_v = o.has_momentum, read_v = o.has_momentum && !o.first; /* the first step sets v */
        for (j = (size_t)blockIdx.x * blockDim.x * MNISTCU__OPT_ILP + threadIdx.x; j < todo.total;
             j += stride * MNISTCU__OPT_ILP) {
            size_t ix[MNISTCU__OPT_ILP];
            float p[MNISTCU__OPT_ILP], d[MNISTCU__OPT_ILP], v[MNISTCU__OPT_ILP];
            int u;
#pragma unroll
            for (u = 0; u < MNISTCU__OPT_ILP; ++u) {
                const size_t jj = j + (size_t)u * blockDim.x;
                ix[u] = jj < todo.total ? mnistcu__seg_index(todo, jj) : 0;
            }
#pragma unroll
            for (u = 0; u < MNISTCU__OPT_ILP; ++u)
                if (j + (size_t)u * blockDim.x < todo.total) {
                    d[u] = coef ? g[ix[u]] * c : g[ix[u]];
                    p[u] = w[ix[u]];
                    v[u] = read_v ? state[ix[u]] : 0.0f;
                }
#pragma unroll
            for (u = 0; u < MNISTCU__OPT_ILP; ++u)
                if (j + (size_t)u * blockDim.x < todo.total) {
                    w[ix[u]] = mnistcu__sgd_step(&o, p[u], d[u], &v[u]);
                    if (keep_v) state[ix[u]] = v[u];
                }
        }
        return;
    }
    for (j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < todo.total; j += stride) {
        const size_t i = mnistcu__seg_index(todo, j);
        mnistcu__opt_one(&o, i, w, coef ? g[i] * c : g[i], state);
    }
}

__global__ void mnistcu__k_fill(float *p, size_t n, float v)
{
    MNISTCU__PDL_WAIT();
    size_t i;
    for (i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

/* Before the step: g += l2 * 2w over the weight ranges, then each of a fixed
   grid of MNISTCU__PREP_BLOCKS blocks sums the squares of its share of g in a
   fixed-order tree (clipping only), and one block turns the partial sums into
   the clipping factor. No atomics: the same bits every run. */
#define MNISTCU__PREP_BLOCKS 64

__global__ void mnistcu__k_grad_prep(const float *w, float *g, size_t n, mnistcu__ranges rg, float l2, int clip,
                                     double *partial)
{
    MNISTCU__PDL_WAIT();
    __shared__ double acc[MNISTCU__THREADS];
    int t = (int)threadIdx.x, stride, k;
    double sum = 0.0;
    size_t i;
    for (i = (size_t)blockIdx.x * blockDim.x + t; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        if (l2 != 0.0f) {
            for (k = 0; k < rg.count; ++k)
                if (i - rg.off[k] < rg.len[k]) {
                    gi = gi + l2 * (2.0f * w[i]);
                    g[i] = gi;
                    break;
                }
        }
        sum += (double)gi * (double)gi;
    }
    if (!clip) return;
    acc[t] = sum;
    __syncthreads();
    for (stride = MNISTCU__THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) acc[t] += acc[t + stride];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = acc[0];
}

__global__ void mnistcu__k_clip_coef(const double *partial, int nb, float clip_norm, float *coef)
{
    MNISTCU__PDL_WAIT();
    __shared__ double acc[MNISTCU__THREADS];
    int t = (int)threadIdx.x, i, stride;
    double sum = 0.0;
    for (i = t; i < nb; i += MNISTCU__THREADS) sum += partial[i];
    acc[t] = sum;
    __syncthreads();
    for (stride = MNISTCU__THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) acc[t] += acc[t + stride];
        __syncthreads();
    }
    if (t == 0) {
        float c = (float)((double)clip_norm / (sqrt(acc[0]) + 1e-6));
        *coef = c < 1.0f ? c : 1.0f;
    }
}

/* x[i][:] = normalise(sample idx[offset+i]), labels[i] = its label, targets[i][:]
   its T float targets when src_targets is given. Either u8 or f32 is given;
   idx NULL means samples offset, offset+1, ... (a staged batch). */
__global__ void mnistcu__k_gather(const uint8_t *u8, const float *f32, const int32_t *src_labels,
                                  const float *src_targets, int T, const uint32_t *idx, size_t offset, int B, int F,
                                  float scale, float shift, float *x, int32_t *labels, float *targets,
                                  const mnistcu__dyn *dyn)
{
    MNISTCU__PDL_WAIT();
    size_t e, n = (size_t)B * F;
    if (dyn) offset = (size_t)dyn->offset; /* a step replayed from a graph */
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = mnistcu__div(e, (size_t)F), j = e - i * (size_t)F, k;
        size_t s = idx ? (size_t)idx[offset + i] : offset + i;
        float raw = u8 ? (float)u8[s * F + j] : f32[s * F + j];
        x[e] = fmaf(raw, scale, shift); /* one rounding, as the fused MLP kernel's */
        if (j == 0) labels[i] = src_labels[s];
        if (src_targets)
            for (k = j; k < (size_t)T; k += (size_t)F) targets[i * T + k] = src_targets[s * T + k];
    }
}

/* mnistcu__k_gather for bytes without targets and F a multiple of 4, the rows
   and the batch 4- and 16-byte aligned: four features a thread, one 4-byte load
   and one 16-byte store, each value the same fmaf (P3's gather 5.4 us with one
   feature a thread, ncu). */
__global__ void mnistcu__k_gather4(const uint8_t *u8, const int32_t *src_labels, const uint32_t *idx, size_t offset,
                                   int B, int F, float scale, float shift, float *x, int32_t *labels,
                                   const mnistcu__dyn *dyn)
{
    MNISTCU__PDL_WAIT();
    const size_t F4 = (size_t)F / 4, n4 = (size_t)B * F4;
    size_t e;
    if (dyn) offset = (size_t)dyn->offset; /* a step replayed from a graph */
    for (e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n4; e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = mnistcu__div(e, F4), j4 = e - i * F4;
        const size_t s = idx ? (size_t)idx[offset + i] : offset + i;
        const uchar4 v = ((const uchar4 *)(u8 + s * (size_t)F))[j4];
        float4 o;
        o.x = fmaf((float)v.x, scale, shift);
        o.y = fmaf((float)v.y, scale, shift);
        o.z = fmaf((float)v.z, scale, shift);
        o.w = fmaf((float)v.w, scale, shift);
        ((float4 *)x)[e] = o;
        if (j4 == 0) labels[i] = src_labels[s];
    }
}

/* Whether mnistcu__k_gather4 takes a batch. */
static int mnistcu__gather4_ok(const uint8_t *u8, const float *targets, size_t F, const float *x)
{
    return u8 && !targets && F % 4 == 0 && ((uintptr_t)u8 & 3) == 0 && ((uintptr_t)x & 15) == 0;
}

/* Divergence check (see >>train): partial[b] = 1 when block b's share of p[n]
   holds a value that is not finite, else 0; then one block ORs the partial
   flags into *flag. A fixed grid and fixed-order trees: no atomics. */
#define MNISTCU__FINITE_BLOCKS 64

__global__ void mnistcu__k_finite_partial(const float *p, size_t n, int *partial)
{
    MNISTCU__PDL_WAIT();
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
    MNISTCU__PDL_WAIT();
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
    e = cudaFuncGetAttributes(&fa, mnistcu__k_fill);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mnistcu__fail(ctx, MNISTCU_ERR_NO_DEVICE,
                             "GPU %s (sm_%d%d) is not supported by this build (%s): rebuild with -arch=sm_%d%d",
                             prop.name, prop.major, prop.minor, cudaGetErrorString(e), prop.major, prop.minor);
    }
#ifndef MNISTCU_NO_PDL
    /* >>cuda_pdl: a Hopper or newer GPU running code built for it (ptxVersion: the target the code came from) */
    {
        int drv = 0;
        if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
        if (want < MNISTCU__PDL_DEVICES) mnistcu__pdl_dev[want] = prop.major >= 9 && fa.ptxVersion >= 90 && drv >= 12030;
    }
#endif
    cu = (mnistcu__cuda *)mnistcu__calloc(ctx, sizeof *cu);
    if (!cu) return mnistcu__fail(ctx, MNISTCU_ERR_OUT_OF_MEMORY, "out of memory");
    cu->device = want;
    cu->smem_optin = prop.sharedMemPerBlockOptin;
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
        cu->blas_ws_bytes = (size_t)(prop.major >= 9 ? 32 : 4) << 20;
    }
#endif
    cu->precision = ctx->desc.precision;
    cu->sms = prop.multiProcessorCount;
    if (cu->precision != MNISTCU_PRECISION_FP32) { /* is there tensor-core code for this GPU? (ctx_create logs a no) */
        int *probe = NULL, tc = 0;
        mnistcu_allocator al = ctx->desc.allocator;
        if (al.device_alloc) probe = (int *)al.device_alloc(al.user, sizeof(int));
        else if (cudaMalloc((void **)&probe, sizeof(int)) != cudaSuccess) probe = NULL;
        if (probe) {
            mnistcu__launch(mnistcu__k_tc_probe, 1, 1, 0, cu->stream, probe);
            if (cudaMemcpyAsync(&tc, probe, sizeof(int), cudaMemcpyDeviceToHost, cu->stream) != cudaSuccess ||
                cudaStreamSynchronize(cu->stream) != cudaSuccess)
                tc = 0;
            mnistcu__cuda_free(ctx, probe);
        }
        (void)cudaGetLastError();
        if (!tc) cu->precision = ctx->desc.precision = MNISTCU_PRECISION_FP32;
    }
#ifdef MNISTCU_CUDNN
    cu->use_cudnn = ctx->desc.cnn != MNISTCU_CNN_OWN;
    if (cu->use_cudnn) {
        cudnnStatus_t s = cudnnCreate(&cu->dnn);
        if (s == CUDNN_STATUS_SUCCESS) s = cudnnSetStream(cu->dnn, cu->stream);
        if (s != CUDNN_STATUS_SUCCESS) {
            mnistcu__cuda_ctx_free(ctx);
            return mnistcu__fail(ctx, MNISTCU_ERR_CUDNN, "cuDNN initialisation failed: %s", cudnnGetErrorString(s));
        }
    }
#endif
    ctx->device = MNISTCU_DEVICE_CUDA;
    snprintf(ctx->device_name, sizeof ctx->device_name, "%.255s (sm_%d%d%s%s%s%s)", prop.name, prop.major, prop.minor,
             cu->use_cublas ? ", cuBLAS" : "", cu->use_cudnn ? ", cuDNN" : "",
             cu->precision != MNISTCU_PRECISION_FP32 ? ", " : "",
             cu->precision != MNISTCU_PRECISION_FP32 ? mnistcu__precision_name(cu->precision) : "");
    return MNISTCU_OK;
}

/* >>cuda_side ----------------------------------------------------------------------
   A step's branches. Some of a backward pass's work needs nothing that the work
   after it makes: a convolution's weight and bias gradients (read by nothing
   but the optimizer) beside its input gradient. A product that fills few of the
   multiprocessors leaves room for the other: P5's second convolution, its two
   gradient products side by side on two streams, 82.2 -> 71.4 us (cuBLAS's,
   bench/blas_algos.cu, H200). The branch runs on a second stream, from an event
   the main stream records (mnistcu__cuda_fork), with its own split-K parts and
   counters and its own cuBLAS handle and workspace, swapped into the context's
   fields while it is launched, so that every launch path of the products
   serves it unchanged; the main stream waits for its end event
   (mnistcu__cuda_join) before anything reads what it wrote or rewrites what it
   reads. The same kernels on the same values: the same bits (tests). A CUDA
   graph captures the branch as two paths from a fork. The second stream is
   made the first time a branch is wanted outside a capture (a capture cannot
   allocate), and a step without it runs the branch's work in line. The
   columns path's scratch holds dcol apart from col for it (17.8 MB more for
   P5). Measured on the H200, one call, the same losses to the bit: P5 with
   cuBLAS's products 223.5-224.1 -> 207.7-207.9 ms an epoch, with ours 316.3
   -> 283.1, in TF32 149.0 -> 142.7 (bench/RESULTS.md). */
static void mnistcu__cuda_lane_swap(mnistcu__cuda *cu, mnistcu__cuda_lane *l)
{
#define MNISTCU__SWAP(T, a, b) \
    do {                       \
        T t_ = a;              \
        a = b;                 \
        b = t_;                \
    } while (0)
    MNISTCU__SWAP(cudaStream_t, cu->stream, l->stream);
    MNISTCU__SWAP(float *, cu->splitk, l->splitk);
    MNISTCU__SWAP(size_t, cu->splitk_floats, l->splitk_floats);
    MNISTCU__SWAP(int *, cu->wide_flags, l->wide_flags);
#ifdef MNISTCU_CUBLAS
    MNISTCU__SWAP(cublasHandle_t, cu->blas, l->blas);
    MNISTCU__SWAP(void *, cu->blas_ws, l->blas_ws);
    MNISTCU__SWAP(void *, cu->blas_ws_raw, l->blas_ws_raw);
    MNISTCU__SWAP(size_t, cu->blas_ws_bytes, l->blas_ws_bytes);
#endif
#undef MNISTCU__SWAP
}

static void mnistcu__cuda_side_free(mnistcu_ctx *ctx)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_lane *l = cu->side;
    if (l) {
        if (l->stream) cudaStreamSynchronize(l->stream);
#ifdef MNISTCU_CUBLAS
        if (l->blas) cublasDestroy(l->blas);
        mnistcu__cuda_free(ctx, l->blas_ws_raw);
#endif
        mnistcu__cuda_free(ctx, l->splitk);
        mnistcu__cuda_free(ctx, l->wide_flags);
        if (l->stream) cudaStreamDestroy(l->stream);
        mnistcu__free(ctx, l);
        cu->side = NULL;
    }
    if (cu->side_fork) cudaEventDestroy(cu->side_fork);
    if (cu->side_join) cudaEventDestroy(cu->side_join);
    cu->side_fork = cu->side_join = NULL;
}

/* Can a branch run now? Makes the second stream the first time (not in a capture). */
static int mnistcu__cuda_side_ready(mnistcu_ctx *ctx)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    mnistcu__cuda_lane *l;
    int ok;
    if (cu->side_off || cu->side_broken) return 0;
    if (cu->side) return 1;
    if (cudaStreamIsCapturing(cu->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return 0;
    }
    l = (mnistcu__cuda_lane *)mnistcu__calloc(ctx, sizeof *l);
    ok = l != NULL && cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking) == cudaSuccess &&
         cudaEventCreateWithFlags(&cu->side_fork, cudaEventDisableTiming) == cudaSuccess &&
         cudaEventCreateWithFlags(&cu->side_join, cudaEventDisableTiming) == cudaSuccess;
#ifdef MNISTCU_CUBLAS
    if (ok && cu->use_cublas) /* its own handle, on its stream, our workspace made at its first product */
        ok = cublasCreate(&l->blas) == CUBLAS_STATUS_SUCCESS &&
             cublasSetStream(l->blas, l->stream) == CUBLAS_STATUS_SUCCESS &&
             cublasSetMathMode(l->blas, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS;
    if (l) l->blas_ws_bytes = cu->blas_ws_bytes;
#endif
    cu->side = l;
    if (!ok) {
        mnistcu__cuda_side_free(ctx);
        (void)cudaGetLastError();
        cu->side_broken = 1;
        mnistcu__log(ctx, MNISTCU_LOG_INFO, "no second stream: a step's branches run in line");
        return 0;
    }
    return 1;
}

/* From here the launches go to the second stream, after what the main stream has queued. */
static mnistcu_result mnistcu__cuda_fork(mnistcu_ctx *ctx)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    cudaError_t e = cudaEventRecord(cu->side_fork, cu->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(cu->side->stream, cu->side_fork, 0);
    if (e != cudaSuccess) return mnistcu__cuda_check(ctx, e, "a step's branch");
    mnistcu__cuda_lane_swap(cu, cu->side);
    cu->side_forks++;
    return MNISTCU_OK;
}

/* Back to the main stream; the branch's end recorded. r: the branch's result, returned. */
static mnistcu_result mnistcu__cuda_unfork(mnistcu_ctx *ctx, mnistcu_result r)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    cudaError_t e;
    mnistcu__cuda_lane_swap(cu, cu->side);
    e = cudaEventRecord(cu->side_join, cu->side->stream);
    if (r) { /* a failed branch: joined at once */
        if (e == cudaSuccess) cudaStreamWaitEvent(cu->stream, cu->side_join, 0);
        return r;
    }
    return mnistcu__cuda_check(ctx, e, "a step's branch");
}

/* The main stream waits for the branch. */
static mnistcu_result mnistcu__cuda_join(mnistcu_ctx *ctx)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    return mnistcu__cuda_check(ctx, cudaStreamWaitEvent(cu->stream, cu->side_join, 0), "a step's branch");
}

static void mnistcu__cuda_ctx_free(mnistcu_ctx *ctx)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    if (!cu) return;
    mnistcu__cuda_side_free(ctx);
#ifdef MNISTCU_CUBLAS
    if (cu->blas) cublasDestroy(cu->blas);
#endif
#ifdef MNISTCU_CUDNN
    if (cu->dnn) cudnnDestroy(cu->dnn);
#endif
    if (cu->stream) cudaStreamSynchronize(cu->stream);
#ifdef MNISTCU_CUDNN
    mnistcu__cuda_free(ctx, cu->dnn_ws);
#endif
#ifdef MNISTCU_CUBLAS
    mnistcu__cuda_free(ctx, cu->blas_ws_raw);
#endif
    mnistcu__cuda_free(ctx, cu->splitk);
    mnistcu__cuda_free(ctx, cu->wide_flags);
    if (cu->finite_flag) cudaFreeHost(cu->finite_flag);
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
    mnistcu__cuda_free(ds->ctx, dc->targets);
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
        (r = mnistcu__cuda_malloc(ctx, (void **)&dc->labels, ds->count * sizeof(int32_t), "uploading labels")) ||
        (ds->targets && (r = mnistcu__cuda_malloc(ctx, (void **)&dc->targets,
                                                  ds->count * ds->target_dim * sizeof(float), "uploading targets")))) {
        mnistcu__cuda_dataset_free(ds);
        return r;
    }
    e = cudaMemcpyAsync(ds->u8 ? (void *)dc->u8 : (void *)dc->f32, ds->u8 ? (const void *)ds->u8 : (const void *)ds->f32,
                        bytes, cudaMemcpyHostToDevice, cu->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dc->labels, ds->labels, ds->count * sizeof(int32_t), cudaMemcpyHostToDevice, cu->stream);
    if (e == cudaSuccess && ds->targets)
        e = cudaMemcpyAsync(dc->targets, ds->targets, ds->count * ds->target_dim * sizeof(float), cudaMemcpyHostToDevice,
                            cu->stream);
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
        (r = mnistcu__cuda_malloc(ctx, (void **)&m->grads, bytes, "gradients")) ||
        (r = mnistcu__cuda_malloc(ctx, (void **)&m->buffers, m->num_buffers * sizeof(float), "running statistics")))
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
    mnistcu__cuda_free(ctx, m->state);
    mnistcu__cuda_free(ctx, m->buffers);
#ifdef MNISTCU_CUDNN
    {
        int l;
        for (l = 0; l < m->num_layers; ++l) mnistcu__dnn_layer_free(ctx, &m->layers[l]);
    }
#endif
    mnistcu__cuda_free(ctx, m->ws);
    mnistcu__cuda_free(ctx, m->iws);
    if (cm) {
        mnistcu__cuda_free(ctx, cm->idx);
        mnistcu__cuda_free(ctx, cm->stats);
        mnistcu__cuda_free(ctx, cm->prep);
        mnistcu__cuda_free(ctx, cm->fused_opt);
        mnistcu__cuda_free(ctx, cm->lenet);
        mnistcu__cuda_free(ctx, cm->mc_pz);
        mnistcu__cuda_free(ctx, cm->mc_rows);
        mnistcu__cuda_graphs_reset(m);
        mnistcu__cuda_free(ctx, cm->dyn);
        if (cm->host_stats) cudaFreeHost(cm->host_stats);
        mnistcu__cuda_stream_free(m);
        mnistcu__free(ctx, cm);
    }
    m->cuda = NULL;
}

static mnistcu_result mnistcu__cuda_reserve(mnistcu_model *m, size_t B)
{
    mnistcu_ctx *ctx = m->ctx;
    size_t floats = mnistcu__model_layout(m, NULL, B), bytes;
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
    m->iws = iws;
    m->labels = iws;
    m->pred = iws + B;
    mnistcu__model_layout(m, ws, B);
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

static mnistcu_result mnistcu__cuda_fill(mnistcu_model *m, float *p, size_t n, float v)
{
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    mnistcu__launch(mnistcu__k_fill, mnistcu__blocks(n), MNISTCU__THREADS, 0, mnistcu__cu(m->ctx)->stream, p, n, v);
    MNISTCU__LAUNCHED(m->ctx, "fill");
    return MNISTCU_OK;
}

/* ---- the matrix product: our kernel or cuBLAS ------------------------------------ */
/* How the own kernels compute an M x N x K product: *small picks the 16x16
   kernel (few 64x64 tiles, small batches: it keeps more of the GPU busy), and
   the result is the number of K slices (1: one fmaf chain per output over all
   of K). Long sums over few outputs (a convolution's weight gradient sums over
   batch x positions, 7,744 terms for the Fashion CNN's second one) are split so
   that about 264 blocks (two per H100 multiprocessor) share the work, each
   slice at least 128 long; only for K >= 1024, so that the MLPs' products keep
   their single launch. Large products with aligned operands take the wide-tile
   kernel instead (mnistcu__gemm_wide_split). The fused MLP kernel asks both: it
   reproduces unsplit products only. */
static size_t mnistcu__gemm_split(size_t M, size_t N, size_t K, int *small)
{
    size_t tiles64 = ((M + MNISTCU__GBM - 1) / MNISTCU__GBM) * ((N + MNISTCU__GBN - 1) / MNISTCU__GBN);
    size_t tiles16 = ((M + MNISTCU__GT - 1) / MNISTCU__GT) * ((N + MNISTCU__GT - 1) / MNISTCU__GT), S = 1;
    *small = tiles64 < 128;
    if (tiles64 < 128 && K >= 1024 && M >= 32 && N >= 32) {
        *small = 0; /* a convolution's weight gradient, a wide dense layer's forward pass */
        S = MNISTCU__MIN((2 * 132 + tiles64 - 1) / tiles64, K / 128);
    } else if (K >= 2048 || (K >= 512 && M < 16 && tiles16 >= 64)) {
        *small = 1; /* few outputs: LeNet's convolutions, a 1-channel input's, a 10-class layer's weight
                       gradient over a batch of 512 */
        S = MNISTCU__MIN((4 * 132 + tiles16 - 1) / tiles16, K / 128);
    }
    return S > 1 ? S : 1;
}

/* Where the own kernels take the wide-tile kernel (FP32): products of at least
   128 tiles of 64x64, and K slices for those of few 128x64 tiles, added by the
   kernel itself. 0: not taken. Measured on the H100 (bench/cuda_gemm.cu, v9,
   launch included): P3's 512 x 1024 forward products 12.6 TFLOP/s in one slice,
   22.8 in four (the 64x64 kernel: 10.7); its weight gradients, 104 and 128
   tiles, fastest in one (19.6 and 25.5 against 14.3 and 18.7); the Fashion
   CNN's convolution products as columns 22.4 and 24.0 against 18.6 and 19.1. */
static size_t mnistcu__gemm_wide_split(size_t M, size_t N, size_t K)
{
    size_t tiles64 = ((M + 63) / 64) * ((N + 63) / 64), tiles = ((M + 127) / 128) * ((N + MNISTCU__WBN - 1) / MNISTCU__WBN);
    /* a whole tile each way at least: a layer of few outputs (the logits) keeps the unsplit product the
       classifier head reproduces (>>cuda_head) */
    if (tiles64 < 128 || M < MNISTCU__WBM || N < MNISTCU__WBN) return 0;
    if (tiles > 66) return 1; /* half the GPU's multiprocessors at least */
    return K >= 512 ? 4 : K >= 256 ? 2 : 1;
}

/* The wide-tile kernel reads each operand 16 bytes at a time along its
   contiguous direction (not both operands transposed: no user). */
static int mnistcu__gemm_wide_ok(int ta, int tb, size_t M, size_t N, size_t K, const float *A, size_t lda,
                                 const float *B, size_t ldb, const float *C, size_t ldc)
{
    if (ta && tb) return 0;
    if ((ta ? M : K) % 4 || lda % 4 || ((uintptr_t)A & 15)) return 0;
    if ((tb ? K : N) % 4 || ldb % 4 || ((uintptr_t)B & 15)) return 0;
    return ldc >= N && M <= INT_MAX / 2 && N <= INT_MAX / 2 && K <= INT_MAX / 2 && lda <= INT_MAX && ldb <= INT_MAX &&
           ldc <= INT_MAX && C != NULL;
}

#ifdef MNISTCU_CUBLAS
/* An FP32 cuBLAS product that a bias or an activation follows (NT: a dense
   layer's forward pass), with a large output in few tiles and a long K, is
   split over K by us, not by cuBLAS: the parts as one strided batch, then one
   pass adds them in order and applies the bias and activation, where cuBLAS's
   own split would add them in a kernel of its own and ours would follow. Measured on the H100 (ncu, one P3 step):
   784 -> 1024 at batch 512, 32.2 us against 25.2 + 6.1 + 4.5; 1024 -> 1024,
   38.5 against 31.4 + 7.6 + 4.5. It loses where the output is narrow or short
   (1024 -> 10: 15.8 against 14.4) and in TF32 (P3 4-7% slower), hence the
   limits. Few rows over a long K take 16 parts: the Fashion CNN's first dense
   layer at batch 64 (3200 -> 256) in 4 made P5 4-7% slower, but in 16 it takes
   10.3 + 5.3 us against cuBLAS's 10.2 + 6.6 and a bias pass of 2.4 (ncu, H200,
   caches flushed), P5 223.8-224.2 -> 222.5-222.6 ms an epoch in one call.
   0 < K / S, S | K. */
static size_t mnistcu__blas_split(size_t M, size_t N, size_t K)
{
    size_t tiles = ((M + 127) / 128) * ((N + 63) / 64), S;
    if (M < 256 && tiles <= 8 && K >= 2048) { /* few rows, a long K: up to 16 parts */
        for (S = 16; S > 1; S /= 2)
            if (K % S == 0 && K / S >= 128) return S;
        return 1;
    }
    if (M < 256 || N < 256 || tiles >= 132 || K < 512) return 1;
    for (S = 4; S > 1; S /= 2)
        if (K % S == 0 && K / S >= 128) return S;
    return 1;
}
#endif

/* The wide-tile kernel's launch: S slices of K (S > 1: the kernel adds them);
   upd (TN: a weight gradient): the optimizer's step in the epilogue (FUSE 4). */
static mnistcu_result mnistcu__cuda_gemm_wide(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K,
                                              const float *A, size_t lda, const float *B, size_t ldb, float *C,
                                              size_t ldc, const float *bias, int act, const float *y, float *db,
                                              size_t S, const mnistcu__wupd *upd)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    const size_t mtiles = (M + MNISTCU__WBM - 1) / MNISTCU__WBM, ntiles = (N + MNISTCU__WBN - 1) / MNISTCU__WBN;
    /* act 0 without a bias: a plain product; with one, ReLU (MNISTCU_ACT_DEFAULT), as mnistcu__act_f */
    const int relu = act == MNISTCU_ACT_RELU || act == MNISTCU_ACT_DEFAULT;
    const int fuse = upd ? 4 : y ? 2 : bias != NULL || (act != 0 && act != MNISTCU_ACT_IDENTITY) ? (relu ? 3 : 1) : 0;
    const dim3 grid((unsigned)ntiles, (unsigned)(mtiles < 65535 ? mtiles : 65535), (unsigned)S);
    mnistcu__wargs p;
    mnistcu_result r;
    if (upd && !(ta && !tb))
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "an update in the product's epilogue is only TN");
    memset(&p, 0, sizeof p);
    p.M = (int)M, p.N = (int)N, p.K = (int)K, p.lda = (int)lda, p.ldb = (int)ldb, p.ldc = (int)ldc, p.act = act;
    p.A = A, p.B = B, p.bias = bias, p.y = y, p.C = C, p.db = db;
    if (upd) {
        p.w = upd->w, p.s = upd->s, p.bw = db ? upd->bw : NULL, p.bs = upd->bs;
        p.dyn = upd->dyn, p.opt = upd->opt;
    }
    if (S > 1 && mtiles * ntiles > MNISTCU__WIDE_FLAGS)
        return mnistcu__fail(ctx, MNISTCU_ERR_UNSUPPORTED, "split product of %lu tiles: more than its counters",
                             (unsigned long)(mtiles * ntiles));
    if (S > 1 && ((r = mnistcu__cuda_partials(ctx, S * M * N, &p.part)) || (r = mnistcu__cuda_wide_flags(ctx, &p.flags))))
        return r;
    /* one block a multiprocessor's worth of registers where there is at most a block a multiprocessor
       (a weight gradient: 35 against 46 us for P3's, ncu); two where there are more (P3's split
       forward products: 54 against 71 us) */
    const int one = ntiles * mtiles * S <= 132;
#define MNISTCU__WIDE_LAUNCH(TA_, TB_)                                                                   \
    do {                                                                                                 \
        if (fuse == 2) mnistcu__launch(mnistcu__k_gemm_wide<TA_, TB_, 2, 64, 16, 2>, grid, 256, 0, cu->stream, p);    \
        else if (fuse == 3) mnistcu__launch(mnistcu__k_gemm_wide<TA_, TB_, 3, 64, 16, 2>, grid, 256, 0, cu->stream, p); \
        else if (fuse) mnistcu__launch(mnistcu__k_gemm_wide<TA_, TB_, 1, 64, 16, 2>, grid, 256, 0, cu->stream, p);    \
        else if (one) mnistcu__launch(mnistcu__k_gemm_wide<TA_, TB_, 0, 64, 16, 1>, grid, 256, 0, cu->stream, p);     \
        else mnistcu__launch(mnistcu__k_gemm_wide<TA_, TB_, 0, 64, 16, 2>, grid, 256, 0, cu->stream, p);              \
    } while (0)
    if (fuse == 4) { /* weight gradients only */
        if (one) mnistcu__launch(mnistcu__k_gemm_wide<1, 0, 4, 64, 16, 1>, grid, 256, 0, cu->stream, p);
        else mnistcu__launch(mnistcu__k_gemm_wide<1, 0, 4, 64, 16, 2>, grid, 256, 0, cu->stream, p);
    } else if (!ta && tb) MNISTCU__WIDE_LAUNCH(0, 1);
    else if (ta) MNISTCU__WIDE_LAUNCH(1, 0);
    else MNISTCU__WIDE_LAUNCH(0, 0);
#undef MNISTCU__WIDE_LAUNCH
    MNISTCU__LAUNCHED(ctx, "gemm_wide");
    return MNISTCU_OK;
}

/* Whether mnistcu__k_gemm_skinny takes this product (>>cuda_skinny): a weight
   gradient (TN) of at most MNISTCU__SKINNY_M outputs, 32 to MNISTCU__SKINNY_MAX_N inputs and
   at most MNISTCU__SKINNY_MAX_K samples, whatever the context's product path
   and precision, so that a layer's gradient comes from one kernel whether its
   bias gradient or optimizer's step goes with it or not. */
static int mnistcu__gemm_skinny_ok(int ta, int tb, size_t M, size_t N, size_t K)
{
    return ta && !tb && mnistcu__skinny_shape(M, N, K);
}

static mnistcu_result mnistcu__cuda_gemm_skinny(mnistcu_ctx *ctx, size_t M, size_t N, size_t K, const float *A,
                                                size_t lda, const float *B, size_t ldb, float *C, size_t ldc,
                                                float *db, const mnistcu__wupd *upd)
{
    mnistcu__skinp p;
    const size_t blocks = (N + MNISTCU__SKINNY_CW - 1) / MNISTCU__SKINNY_CW + (db ? 1 : 0);
    if (lda > (size_t)INT_MAX || ldb > (size_t)INT_MAX || ldc > (size_t)INT_MAX)
        return mnistcu__fail(ctx, MNISTCU_ERR_OVERFLOW, "product's row stride too large");
    memset(&p, 0, sizeof p);
    p.A = A, p.B = B, p.C = C, p.db = db;
    p.M = (int)M, p.N = (int)N, p.K = (int)K, p.lda = (int)lda, p.ldb = (int)ldb, p.ldc = (int)ldc;
    if (upd) {
        p.upd = 1;
        p.w = upd->w, p.s = upd->s, p.bw = db ? upd->bw : NULL, p.bs = upd->bs;
        p.dyn = upd->dyn, p.opt = upd->opt;
    }
    mnistcu__launch(mnistcu__k_gemm_skinny, (unsigned)blocks, MNISTCU__THREADS, 0, mnistcu__cu(ctx)->stream, p);
    MNISTCU__LAUNCHED(ctx, "gemm_skinny");
    return MNISTCU_OK;
}

/* Whether mnistcu__cuda_gemm_x takes this product: -1 for the skinny kernel
   (>>cuda_skinny), else the wide-tile kernel's slices of K, or 0.
   With cuBLAS's products too, a weight gradient (TN) that sums the bias
   gradient beside it (db): one kernel where cuBLAS's product and a bias
   gradient pass follow each other (P3: 27.0-27.7 -> 25.5-26.6 ms an epoch,
   bench/RESULTS.md); other products stay cuBLAS's, which is faster than ours
   alone. Whether the product also takes the optimizer's step does not enter
   the choice, so that it never changes which kernel sums the gradient. */
static int mnistcu__cuda_gemm_x_takes(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K, const float *A,
                                      size_t lda, const float *B, size_t ldb, const float *C, size_t ldc,
                                      const float *db)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    size_t S;
    const int blas = cu->use_cublas && !(ta && !tb && db);
    if (mnistcu__gemm_skinny_ok(ta, tb, M, N, K)) /* mnistcu__k_gemm_skinny: FP32 in every context, as the plain path's */
        return -1;
    if (M == 0 || N == 0 || blas || cu->precision != MNISTCU_PRECISION_FP32 ||
        !mnistcu__gemm_wide_ok(ta, tb, M, N, K, A, lda, B, ldb, C, ldc) ||
        (S = mnistcu__gemm_wide_split(M, N, K)) == 0 || (db && (S > 1 || !ta || tb)))
        return 0;
    return (int)S;
}

/* A product with more done in its epilogue, where the own kernels' wide-tile
   kernel takes it: y, C = act'(y) * product (act the activation that made y);
   db (ta, !tb), also the row sums of op(A), a dense layer's bias gradient;
   upd (ta, !tb: C a weight gradient), also the optimizer's step of the weights
   (and, with db, of the bias). *done 0: nothing launched (cuBLAS, another
   kernel): the caller does it the plain way. */
static mnistcu_result mnistcu__cuda_gemm_x(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K,
                                           const float *A, size_t lda, const float *B, size_t ldb, float *C,
                                           size_t ldc, int act, const float *y, float *db,
                                           const mnistcu__wupd *upd, int *done)
{
    const int S = mnistcu__cuda_gemm_x_takes(ctx, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, db);
    mnistcu_result r;
    *done = 0;
    if (!S) return MNISTCU_OK;
    if (S < 0) { /* TN, a weight gradient of few outputs: no y */
        if ((r = mnistcu__cuda_gemm_skinny(ctx, M, N, K, A, lda, B, ldb, C, ldc, db, upd))) return r;
        *done = 1;
        return MNISTCU_OK;
    }
    if ((r = mnistcu__cuda_gemm_wide(ctx, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, NULL, act, y, db, (size_t)S, upd)))
        return r;
    *done = 1;
    return MNISTCU_OK;
}

#ifdef MNISTCU_CUBLAS
/* cuBLAS's workspace, made once, before the first product or the first capture. */
static void mnistcu__cuda_blas_workspace(mnistcu_ctx *ctx)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    if (!cu->blas_ws && cu->blas_ws_bytes) {
        /* Our own workspace, through the allocation hooks: a product captured in a
           step graph (>>cuda_graph) then picks the same algorithm with the same
           workspace as one launched, and capturing never makes cuBLAS allocate.
           (cublasSetStream would reset it: the stream is set once, before.) Where
           it cannot be had, cuBLAS keeps its own and the steps run launched. */
        mnistcu__attempt at;
        mnistcu_result r;
        mnistcu__attempt_begin(ctx, &at);
        r = mnistcu__cuda_malloc(ctx, &cu->blas_ws_raw, cu->blas_ws_bytes + 255, "cuBLAS workspace");
        mnistcu__attempt_end(ctx);
        if (r == MNISTCU_OK) {
            void *al = (void *)(((uintptr_t)cu->blas_ws_raw + 255) & ~(uintptr_t)255); /* cuBLAS asks 256 */
            if (cublasSetWorkspace(cu->blas, al, cu->blas_ws_bytes) == CUBLAS_STATUS_SUCCESS) cu->blas_ws = al;
        }
        if (!cu->blas_ws) {
            mnistcu__cuda_free(ctx, cu->blas_ws_raw);
            cu->blas_ws_raw = NULL;
            mnistcu__attempt_undo(ctx, &at);
            mnistcu__log(ctx, MNISTCU_LOG_INFO, "no %lu-byte cuBLAS workspace of ours: cuBLAS keeps its own, "
                         "and training steps are not captured in CUDA graphs", (unsigned long)cu->blas_ws_bytes);
            cu->blas_ws_bytes = 0;
        }
    }
}
#endif

/* Whether mnistcu__cuda_gemm_x3 takes a product (>>cuda_x3): a TF32X3 context,
   16 or more 64x64 tiles (fewer stay FP32's, as in TF32, MNISTCU__TC_MIN_TILES),
   every dimension and leading dimension a multiple of 4 and the operands
   16-byte aligned (its 16-byte copies), each below 2^31. */
static int mnistcu__x3_ok(const mnistcu__cuda *cu, size_t M, size_t N, size_t K, const float *A, size_t lda,
                          const float *B, size_t ldb, const float *C, size_t ldc)
{
    const size_t big = (size_t)INT_MAX;
    if (cu->precision != MNISTCU_PRECISION_TF32X3 || ((M | N | K | lda | ldb | ldc) & 3) != 0 ||
        (((uintptr_t)A | (uintptr_t)B | (uintptr_t)C) & 15) != 0 || M > big || N > big || K > big || lda > big ||
        ldb > big || ldc > big || (M && N > SIZE_MAX / 16 / M)) /* 16 slices of M x N at most */
        return 0;
    return ((M + MNISTCU__X3_T - 1) / MNISTCU__X3_T) * ((N + MNISTCU__X3_T - 1) / MNISTCU__X3_T) >=
           MNISTCU__TC_MIN_TILES;
}

/* mnistcu__k_gemm_x3's slices of K: one where the tiles are 1.5 a multiprocessor or more, else enough for
   two blocks a multiprocessor, each of 128 k or more, at most 16. Measured on P3's and the Fashion CNN's
   products on an H200 (bench/gemm_tc3.cu, 64x64 tiles): 512x1024x784 best in 3 slices, 1024x1024x512 in 1,
   128x576x7744 in 6 (108 blocks) of those tried. */
static size_t mnistcu__x3_split(size_t M, size_t N, size_t K, int sms)
{
    const size_t tiles = ((M + MNISTCU__X3_T - 1) / MNISTCU__X3_T) * ((N + MNISTCU__X3_T - 1) / MNISTCU__X3_T);
    size_t S;
    if (sms <= 0) sms = 1;
    if (2 * tiles >= 3 * (size_t)sms) return 1;
    S = MNISTCU__MIN((2 * (size_t)sms + tiles - 1) / tiles, MNISTCU__MIN(K / 128, (size_t)16));
    return S ? S : 1;
}

/* C = act(op(A) op(B) + bias) in TF32X3 (mnistcu__x3_ok said yes). */
static mnistcu_result mnistcu__cuda_gemm_x3(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K,
                                            const float *A, size_t lda, const float *B, size_t ldb, float *C,
                                            size_t ldc, const float *bias, int act)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    const int fuse = bias != NULL || (act != 0 && act != MNISTCU_ACT_IDENTITY), which = 2 * !!ta + !!tb;
    const size_t S0 = mnistcu__x3_split(M, N, K, cu->sms);
    const size_t Ks = ((K + S0 - 1) / S0 + MNISTCU__X3_BK - 1) / MNISTCU__X3_BK * MNISTCU__X3_BK;
    const size_t S = Ks ? (K + Ks - 1) / Ks : 1; /* K 0: one slice, of zeros */
    const dim3 grid((unsigned)((N + MNISTCU__X3_T - 1) / MNISTCU__X3_T),
                    (unsigned)((M + MNISTCU__X3_T - 1) / MNISTCU__X3_T), (unsigned)(S ? S : 1));
    void (*k)(int, int, int, int, const float *, int, const float *, int, float *, int) =
        which == 0 ? mnistcu__k_gemm_x3<0, 0> : which == 1 ? mnistcu__k_gemm_x3<0, 1>
                                              : which == 2 ? mnistcu__k_gemm_x3<1, 0> : mnistcu__k_gemm_x3<1, 1>;
    float *out = C;
    size_t ldo = ldc;
    if (S > 1) {
        mnistcu_result r = mnistcu__cuda_partials(ctx, S * M * N, &out);
        if (r) return r;
        ldo = N;
    }
    if (!(cu->x3_smem & (1u << which))) { /* above the 48 KB every GPU gives */
        cudaError_t e = cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)MNISTCU__X3_SMEM);
        if (e != cudaSuccess) return mnistcu__cuda_check(ctx, e, "the TF32X3 product's shared memory");
        cu->x3_smem |= 1u << which;
    }
    mnistcu__launch(k, grid, 128, MNISTCU__X3_SMEM, cu->stream, (int)M, (int)N, (int)K, (int)Ks, A, (int)lda, B,
                    (int)ldb, out, (int)ldo);
    MNISTCU__LAUNCHED(ctx, "gemm_x3");
    cu->x3_products++;
    if (S > 1) { /* the parts added in order, with the bias and the activation */
        mnistcu__splitk_sum(cu->stream, out, (int)S, (int)M, (int)N, C, (int)ldc, bias, act, fuse, NULL);
        MNISTCU__LAUNCHED(ctx, "splitk_sum");
    } else if (fuse) {
        size_t n = M * N;
        mnistcu__launch(mnistcu__k_bias_act, mnistcu__blocks(n), MNISTCU__THREADS, 0, cu->stream, C, bias, n, (int)N,
                        act);
        MNISTCU__LAUNCHED(ctx, "bias_act");
    }
    return MNISTCU_OK;
}

static mnistcu_result mnistcu__cuda_gemm(mnistcu_ctx *ctx, int ta, int tb, size_t M, size_t N, size_t K, const float *A,
                                         size_t lda, const float *B, size_t ldb, float *C, size_t ldc,
                                         const float *bias, int act)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    if (M == 0 || N == 0) return MNISTCU_OK;
    if (!bias && (act == 0 || act == MNISTCU_ACT_IDENTITY) && mnistcu__gemm_skinny_ok(ta, tb, M, N, K))
        return mnistcu__cuda_gemm_skinny(ctx, M, N, K, A, lda, B, ldb, C, ldc, NULL, NULL);
    if (mnistcu__x3_ok(cu, M, N, K, A, lda, B, ldb, C, ldc)) /* before cuBLAS, which has no such mode */
        return mnistcu__cuda_gemm_x3(ctx, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, bias, act);
#ifdef MNISTCU_CUBLAS
    if (cu->use_cublas) {
        /* cuBLAS is column-major: a row-major C = op(A) op(B) is, read column-major,
           C^T = op(B)^T op(A)^T, so the operands swap places and keep their flags. */
        const float one = 1.0f, zero = 0.0f;
        const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        mnistcu__cuda_blas_workspace(ctx);
        const int fuse = bias || (act != 0 && act != MNISTCU_ACT_IDENTITY);
        /* TF32X3's products that mnistcu__x3_ok declines are FP32's */
        const int fp32 = cu->precision == MNISTCU_PRECISION_FP32 || cu->precision == MNISTCU_PRECISION_TF32X3;
        const size_t S = fuse && !ta && tb && fp32 ? mnistcu__blas_split(M, N, K) : 1,
                     kc = K / S; /* part s: the columns s*kc.. of A [M][K] and of B [N][K] */
        float *out = C;
        int ldo = (int)ldc;
        cublasStatus_t s;
        if (S > 1) {
            mnistcu_result r = mnistcu__cuda_partials(ctx, S * M * N, &out);
            if (r) return r;
            ldo = (int)N;
        }
        if (S > 1) /* FP32 only */
            s = cublasSgemmStridedBatched(cu->blas, opb, opa, (int)N, (int)M, (int)kc, &one, B, (int)ldb,
                                          (long long)kc, A, (int)lda, (long long)kc, &zero, out, ldo,
                                          (long long)(M * N), (int)S);
        else if (fp32)
            s = cublasSgemm(cu->blas, opb, opa, (int)N, (int)M, (int)K, &one, B, (int)ldb, A, (int)lda, &zero, C,
                            (int)ldc);
        else /* FP32 operands and results, the products on the tensor cores in TF32 or BF16 */
            s = cublasGemmEx(cu->blas, opb, opa, (int)N, (int)M, (int)K, &one, B, CUDA_R_32F, (int)ldb, A, CUDA_R_32F,
                             (int)lda, &zero, C, CUDA_R_32F, (int)ldc,
                             cu->precision == MNISTCU_PRECISION_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                                     : CUBLAS_COMPUTE_32F_FAST_TF32,
                             CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS)
            return mnistcu__fail(ctx, MNISTCU_ERR_CUBLAS, "cuBLAS product %lux%lux%lu: %s", (unsigned long)M,
                                 (unsigned long)N, (unsigned long)K, cublasGetStatusString(s));
        if (S > 1) { /* the parts added in order, with the bias and the activation */
            mnistcu__splitk_sum(cu->stream, out, (int)S, (int)M, (int)N, C, (int)ldc, bias, act, 1, NULL);
            MNISTCU__LAUNCHED(ctx, "splitk_sum");
        } else if (fuse) {
            size_t n = M * N;
            mnistcu__launch(mnistcu__k_bias_act, mnistcu__blocks(n), MNISTCU__THREADS, 0, cu->stream, C, bias, n, (int)N, act);
            MNISTCU__LAUNCHED(ctx, "bias_act");
        }
        return MNISTCU_OK;
    }
#endif
    {
        size_t S;
        int small;
        size_t tm, tn, mtiles;
        dim3 grid;
        int m_ = (int)M, n_ = (int)N, k_ = (int)K, la = (int)lda, lb = (int)ldb, lc = (int)ldc;
        cudaStream_t st = cu->stream;
        float *out = C;
        int fuse = bias != NULL || (act != 0 && act != MNISTCU_ACT_IDENTITY);
        int tc = cu->precision == MNISTCU_PRECISION_TF32 ? 1 : cu->precision == MNISTCU_PRECISION_BF16 ? 2 : 0;
        if (fuse && (ta || !tb)) return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "fused gemm is only NT");
        if (!tc && mnistcu__gemm_wide_ok(ta, tb, M, N, K, A, lda, B, ldb, C, ldc) &&
            (S = mnistcu__gemm_wide_split(M, N, K)) > 0)
            return mnistcu__cuda_gemm_wide(ctx, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, bias, act, NULL, NULL, S,
                                           NULL);
        S = mnistcu__gemm_split(M, N, K, &small);
        if (tc) { /* 64x64 tiles on the tensor cores; with few of them, K split so that about 264 blocks work */
            size_t tiles = ((M + MNISTCU__GBM - 1) / MNISTCU__GBM) * ((N + MNISTCU__GBN - 1) / MNISTCU__GBN);
            if (tiles < MNISTCU__TC_MIN_TILES) {
                tc = 0; /* too small to pay: the FP32 kernels, as in an FP32 context */
            } else {
                small = 0;
                S = tiles < 132 && K >= 256 ? MNISTCU__MIN((2 * 132 + tiles - 1) / tiles, K / 128) : 1;
            }
        }
        if (S > 1) {
            mnistcu_result r = mnistcu__cuda_partials(ctx, S * M * N, &out);
            if (r) return r;
            lc = n_;
        } else {
            S = 1;
        }
        tm = small ? MNISTCU__GT : MNISTCU__GBM;
        tn = small ? MNISTCU__GT : MNISTCU__GBN;
        mtiles = (M + tm - 1) / tm;
        grid = dim3((unsigned)((N + tn - 1) / tn), (unsigned)(mtiles < 65535 ? mtiles : 65535), (unsigned)S);
#define MNISTCU__GEMM_LAUNCH(TA_, TB_, FUSE_)                                                                     \
    do {                                                                                                          \
        if (tc == 1)                                                                                              \
            mnistcu__launch(mnistcu__k_gemm_tc<TA_, TB_, FUSE_, 0>, grid, 256, 0, st, m_, n_, k_, A, la, B, lb, out, lc, bias, act); \
        else if (tc == 2)                                                                                         \
            mnistcu__launch(mnistcu__k_gemm_tc<TA_, TB_, FUSE_, 1>, grid, 256, 0, st, m_, n_, k_, A, la, B, lb, out, lc, bias, act); \
        else if (small)                                                                                           \
            mnistcu__launch(mnistcu__k_gemm16<TA_, TB_, FUSE_>, grid, 256, 0, st, m_, n_, k_, A, la, B, lb, out, lc, bias, act); \
        else                                                                                                      \
            mnistcu__launch(mnistcu__k_gemm<TA_, TB_, FUSE_>, grid, 256, 0, st, m_, n_, k_, A, la, B, lb, out, lc, bias, act);   \
    } while (0)
        if (fuse && S == 1) MNISTCU__GEMM_LAUNCH(0, 1, 1);
        else if (!ta && tb) MNISTCU__GEMM_LAUNCH(0, 1, 0);
        else if (ta && !tb) MNISTCU__GEMM_LAUNCH(1, 0, 0);
        else if (!ta && !tb) MNISTCU__GEMM_LAUNCH(0, 0, 0);
        else MNISTCU__GEMM_LAUNCH(1, 1, 0);
#undef MNISTCU__GEMM_LAUNCH
        MNISTCU__LAUNCHED(ctx, "gemm");
        if (S > 1) {
            mnistcu__splitk_sum(st, out, (int)S, m_, n_, C, (int)ldc, bias, act, fuse, NULL);
            MNISTCU__LAUNCHED(ctx, "splitk_sum");
        }
    }
    return MNISTCU_OK;
}

#ifdef MNISTCU_CUBLAS
/* A dense layer's input gradient dx [M][N] = dy [M][K] . W [K][N] with the
   derivative of the activation that made its input y [M][N] applied, in a
   head step (>>cuda_head) with cuBLAS's FP32 products where mnistcu__blas_split
   splits the product: the parts as one strided batch, then the pass that adds
   them applies act'(y), so the layer before skips its own elementwise pass.
   *done 0: not taken (the caller runs the plain product). */
static mnistcu_result mnistcu__cuda_dx_act(mnistcu_ctx *ctx, size_t M, size_t N, size_t K, const float *A,
                                           const float *B, float *C, const float *y, int act, int *done)
{
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    const float one = 1.0f, zero = 0.0f;
    size_t S, kc;
    float *out;
    mnistcu_result r;
    cublasStatus_t s;
    *done = 0;
    if (!cu->use_cublas || !cu->blas_ws || cu->precision != MNISTCU_PRECISION_FP32 ||
        (S = mnistcu__blas_split(M, N, K)) < 2)
        return MNISTCU_OK;
    kc = K / S; /* part s: the columns s*kc.. of dy, the rows s*kc.. of W */
    if ((r = mnistcu__cuda_partials(ctx, S * M * N, &out))) return r;
    s = cublasSgemmStridedBatched(cu->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)M, (int)kc, &one, B, (int)N,
                                  (long long)(kc * N), A, (int)K, (long long)kc, &zero, out, (int)N,
                                  (long long)(M * N), (int)S);
    if (s != CUBLAS_STATUS_SUCCESS)
        return mnistcu__fail(ctx, MNISTCU_ERR_CUBLAS, "cuBLAS product %lux%lux%lu: %s", (unsigned long)M,
                             (unsigned long)N, (unsigned long)K, cublasGetStatusString(s));
    mnistcu__splitk_sum(cu->stream, out, (int)S, (int)M, (int)N, C, (int)N, NULL, act, 2, y);
    MNISTCU__LAUNCHED(ctx, "splitk_sum");
    *done = 1;
    return MNISTCU_OK;
}
#endif

/* ---- the steps of training, mirroring the CPU ones ------------------------------ */
static mnistcu_result mnistcu__cuda_loss(mnistcu_model *m, size_t B, int with_grad)
{
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    mnistcu__launch(mnistcu__k_loss, mnistcu__blocks(B), MNISTCU__THREADS, 0, mnistcu__cu(m->ctx)->stream,
        m->lossp, m->logits, m->labels, m->batch_targets ? m->targets : NULL, (int)B, (int)m->classes,
        m->lossp.sum ? 1.0f : 1.0f / (float)B, with_grad ? m->dbuf[0] : NULL, m->sample_loss, m->pred);
    MNISTCU__LAUNCHED(m->ctx, "loss");
    return MNISTCU_OK;
}

/* A training step's loss, its gradient and its statistics (slot step of the epoch's), one launch. */
static mnistcu_result mnistcu__cuda_loss_stats(mnistcu_model *m, size_t B, size_t step)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    const mnistcu__dyn *dyn = mnistcu__cuda_dyn(m);
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    if (dyn) step = 0; /* the kernel adds the step's slot */
    mnistcu__launch(mnistcu__k_loss_stats, 1, MNISTCU__THREADS, 0, mnistcu__cu(m->ctx)->stream,
        m->lossp, m->logits, m->labels, m->batch_targets ? m->targets : NULL, (int)B, (int)m->classes,
        m->lossp.sum ? 1.0f : 1.0f / (float)B, m->dbuf[0], m->sample_loss, m->pred, cm->stats + step,
        cm->stats + cm->stats_cap + step, dyn);
    MNISTCU__LAUNCHED(m->ctx, "loss_stats");
    return MNISTCU_OK;
}

/* The layer before layer i that is not a passthrough, or NULL. */
static mnistcu__layer *mnistcu__layer_before(const mnistcu_model *m, int i)
{
    for (--i; i >= 0; --i)
        if (!m->layers[i].passthrough) return (mnistcu__layer *)&m->layers[i];
    return NULL;
}

/* The classifier head (>>cuda_head) applies to a training step: the index of the model's last layer, or -1. */
static int mnistcu__cuda_head_layer(const mnistcu_model *m)
{
    int h = m->num_layers - 1;
    const mnistcu__layer *H;
    while (h >= 0 && m->layers[h].passthrough) --h;
    /* in TF32 and BF16 contexts too, its products in FP32 (>>cuda_head) */
    if (m->head_off || h < 0) return -1;
    H = &m->layers[h];
    if (H->d.kind != MNISTCU_LAYER_DENSE || H->act != MNISTCU_ACT_IDENTITY || H->oc < 1 ||
        H->oc > MNISTCU__HEAD_MAX_C || (size_t)H->oc != m->classes || H->out != m->logits || H->c < 1)
        return -1;
    return h;
}

/* A training step's passes with the head: the layers before it, the head's
   kernel, the head layer's weight and bias gradients, then the layers before
   from the input gradient it left in dbuf[1]. When the layer before is dense
   with an activation, the head applied act' and that layer skips it (dy_done). */
static mnistcu_result mnistcu__cuda_head_step(mnistcu_model *m, int h, size_t B, size_t step)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    mnistcu__layer *H = &m->layers[h], *P = mnistcu__layer_before(m, h);
    const mnistcu__dyn *dyn = mnistcu__cuda_dyn(m);
    mnistcu__headp p;
    mnistcu_result r;
    int i, fold = P && H->need_dx && P->d.kind == MNISTCU_LAYER_DENSE && P->act != MNISTCU_ACT_IDENTITY &&
                  P->out == H->in;
    /* the bias gradient in the weight gradient's product where the skinny kernel takes it (the same sums) */
    const int db_later = H->nb && mnistcu__gemm_skinny_ok(1, 0, (size_t)H->oc, (size_t)H->c, B);
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    m->fwd_fuse = 1; /* a batch norm may take the max pool after it (mnistcu__bn_pool_after) */
    for (i = 0; i < h && !r; ++i) {
        mnistcu__layer *L = &m->layers[i];
        if (!L->passthrough) r = mnistcu__kinds[L->d.kind]->forward[m->backend](m, L, B);
    }
    m->fwd_fuse = 0;
    for (i = 0; i < m->num_layers; ++i) m->layers[i].fwd_done = 0;
    if (r) return r;
    memset(&p, 0, sizeof p);
    p.x = H->in;
    p.w = m->params + H->wo;
    p.bias = H->nb ? m->params + H->bo : NULL;
    p.logits = m->logits;
    p.g = m->dbuf[0];
    p.dx = H->need_dx ? m->dbuf[1] : NULL;
    p.db = H->nb && !db_later ? m->grads + H->bo : NULL;
    p.labels = m->labels;
    p.targets = m->batch_targets ? m->targets : NULL;
    p.loss = m->sample_loss;
    p.pred = m->pred;
    if (dyn) step = 0; /* the kernel adds the step's slot */
    p.loss_out = cm->stats + step;
    p.correct_out = cm->stats + cm->stats_cap + step;
    p.dyn = dyn;
    p.ticket = (unsigned *)(cm->stats + 2 * cm->stats_cap);
    p.lp = m->lossp;
    p.grad_scale = m->lossp.sum ? 1.0f : 1.0f / (float)B;
    p.B = (int)B;
    p.IN = H->c;
    p.C = H->oc;
    p.act = fold ? (int)P->act : (int)MNISTCU_ACT_IDENTITY;
    if (p.C == 10) /* MNIST's classes: the loops over them exact */
        mnistcu__launch(mnistcu__k_head<10>, (unsigned)((B + MNISTCU__HEAD_ROWS - 1) / MNISTCU__HEAD_ROWS), MNISTCU__THREADS, 0,
                              mnistcu__cu(m->ctx)->stream, p);
    else
        mnistcu__launch(mnistcu__k_head<0>, (unsigned)((B + MNISTCU__HEAD_ROWS - 1) / MNISTCU__HEAD_ROWS), MNISTCU__THREADS, 0,
                             mnistcu__cu(m->ctx)->stream, p);
    MNISTCU__LAUNCHED(m->ctx, "head");
    H->db_done = !db_later; /* its weight gradient only, or with the bias gradient */
    r = mnistcu__kinds[H->d.kind]->backward[m->backend](m, H, B, m->dbuf[0], NULL);
    H->db_done = 0;
    if (r) return r;
    if (!H->need_dx) return MNISTCU_OK;
    if (fold) P->dy_done = 1;
    m->head_step = 1; /* dense layers' input gradients may take the act' of the layer before (mnistcu__cuda_dx_act) */
    r = mnistcu__backward_from(m, B, h - 1, m->dbuf[1]);
    m->head_step = 0;
    for (i = 0; i < m->num_layers; ++i) {
        m->layers[i].dy_done = 0;
        m->layers[i].dy_pool = 0;
    }
    return r;
}

/* >>cuda_update ------------------------------------------------------------------
   The optimizer's step on the GPU. With SGD and neither l2 nor clipping, a
   parameter's step needs its own gradient and nothing else, so the wide-tile
   product that computes a dense layer's weight gradient takes the step of each
   weight as it writes its gradient (and of each bias entry as it writes the
   bias gradient, where that product computes it): FUSE 4 in
   mnistcu__k_gemm_wide, with mnistcu__sgd_step on the same values as the pass
   below, so the same bits, and one kernel and one read of the gradients fewer
   (mnistcu__update_plan decides; the layer's backward pass computes its input
   gradient first, the last read of the weights in the step; L->upd_done marks
   what was done). The pass then steps what is left: the ranges of the arena
   mnistcu__update_todo lists. The gradients are written as before, so the
   gradient arena holds the same values either way. Measured on the H100 it is
   neutral (P3's step 271 -> 270 us, ncu): the pass goes, but the product's one
   wave ends with the weights' traffic, which nothing overlaps (bench/RESULTS.md). */

/* The arena's ranges not stepped yet, in order; clears the layers' marks. */
static void mnistcu__update_todo(mnistcu_model *m, mnistcu__segs *todo)
{
    size_t off[2 * MNISTCU_MAX_MODEL_LAYERS], len[2 * MNISTCU_MAX_MODEL_LAYERS], at = 0;
    int n = 0, i, j;
    for (i = 0; i < m->num_layers; ++i) { /* the ranges done, sorted by offset */
        mnistcu__layer *L = &m->layers[i];
        if (L->upd_done) {
            off[n] = L->wo, len[n++] = L->nw;
            if (L->upd_done == 2) off[n] = L->bo, len[n++] = L->nb;
        }
        L->upd_done = 0;
    }
    for (i = 1; i < n; ++i)
        for (j = i; j > 0 && off[j - 1] > off[j]; --j) {
            size_t t = off[j];
            off[j] = off[j - 1], off[j - 1] = t;
            t = len[j], len[j] = len[j - 1], len[j - 1] = t;
        }
    todo->count = 0;
    todo->total = 0;
    for (i = 0; i <= n; ++i) { /* the gaps between them */
        const size_t end = i < n ? off[i] : m->num_params;
        if (end > at) {
            todo->off[todo->count] = at, todo->len[todo->count++] = end - at;
            todo->total += end - at;
        }
        if (i < n && off[i] + len[i] > at) at = off[i] + len[i];
    }
}

static mnistcu_result mnistcu__cuda_update(mnistcu_model *m, const mnistcu__opt *k, const mnistcu_optim_desc *o)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    cudaStream_t st = mnistcu__cu(m->ctx)->stream;
    mnistcu__segs todo;
    mnistcu_result r;
    float *coef = NULL;
    mnistcu__update_todo(m, &todo);
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    m->upd_last = todo.total < m->num_params;
    m->upd_steps += (uint64_t)m->upd_last;
    if (o->l2 != 0.0f || o->clip_norm != 0.0f) {
        mnistcu__ranges rg;
        if (!cm->prep && (r = mnistcu__cuda_malloc(m->ctx, &cm->prep, MNISTCU__PREP_BLOCKS * sizeof(double) + 16,
                                                   "gradient clipping")))
            return r;
        mnistcu__weight_ranges(m, &rg);
        mnistcu__launch(mnistcu__k_grad_prep, MNISTCU__PREP_BLOCKS, MNISTCU__THREADS, 0, st, m->params, m->grads, m->num_params, rg,
                                                                               o->l2, o->clip_norm != 0.0f,
                                                                               (double *)cm->prep);
        MNISTCU__LAUNCHED(m->ctx, "grad_prep");
        if (o->clip_norm != 0.0f) {
            coef = (float *)((double *)cm->prep + MNISTCU__PREP_BLOCKS);
            mnistcu__launch(mnistcu__k_clip_coef, 1, MNISTCU__THREADS, 0, st, (const double *)cm->prep, MNISTCU__PREP_BLOCKS,
                                                                 o->clip_norm, coef);
            MNISTCU__LAUNCHED(m->ctx, "clip_coef");
        }
    }
    if (!todo.total) return MNISTCU_OK;
    mnistcu__launch(mnistcu__k_optim,
                    mnistcu__blocks(k->kind == MNISTCU_OPTIM_SGD ? (todo.total + MNISTCU__OPT_ILP - 1) / MNISTCU__OPT_ILP
                                                                 : todo.total),
                    MNISTCU__THREADS, 0, st, *k, m->params, m->grads, m->state,
                                                                               coef, mnistcu__cuda_dyn(m), todo);
    MNISTCU__LAUNCHED(m->ctx, "optimizer");
    return MNISTCU_OK;
}

/* >>cuda_fused ---------------------------------------------------------------------
   The fused MLP step: many training steps in one kernel.
   For the commonest small model, one hidden layer (dense with its activation,
   then dense), the dozen launches of a step (gather, two products forward,
   loss, statistics, three products and a bias sum backward, the optimizer) cost
   far more than their arithmetic: 784-128-10 at batch 64 is 39 MFLOP a step,
   under a microsecond of the GPU's time, while each kernel of the step takes
   about 5 us (bench/graph_step.cu). Here one cooperative kernel, one block per
   multiprocessor, runs the steps of an epoch up to the next report, with two
   grid-wide barriers per step. Block j of G owns hidden units j, j+G, j+2G...:
   their rows of W1, their entries of b1, their columns of W2.
     1. Each block gathers and normalises the batch x [b][D] into shared
        memory and computes its units' activations h [b][u] (to global memory).
     -- barrier: all of h is written --
     2. The b*C logits are shared out, a few consecutive ones per block:
        z = act2(h W2^T + b2).
     -- barrier: all of z is written --
     3. Each block computes the loss gradient dz [b][C] of the whole batch (it
        is small; softmax cross-entropy's e^(z - max) a thread each, the rest
        a thread a row), block 0 also the step's statistics (where the next
        step's phase 1 leaves its last warp idle, that warp makes them then,
        off the path to the next barrier; measured, bench/RESULTS.md).
     4. Each block, for its units only: dh = (dz W2[:,u]) * act1', then the
        gradients of its W2 columns, b1 entries and W1 rows and their optimizer
        update; the last block updates b2.
   Nothing is written while another block may still read it: W2 and b2 are read
   in phase 2 and updated in phase 4, after the second barrier, and read again
   only after the next step's first; h is rewritten in the next step's phase 1,
   after every block passed this step's second barrier, so after phase 2; z is
   rewritten in the next step's phase 2, after every block passed the next
   step's first barrier, so after phase 3.

   Exactness: every value is computed with the operations of the unfused path's
   kernels in their order: each product output one fmaf chain over k from zero
   as in >>cuda's products (which pad k to 16 with zeros: the one fmaf(0, 0, acc)
   below is what those padded terms do; W2's gradient, where the skinny kernel
   takes it, in that kernel's slices, >>cuda_skinny), the bias sums in row
   order, and the same functions for the activations, the loss row (softmax
   cross-entropy's in its parts, mnistcu__softmax_ce_end), the statistics tree
   (one warp walking the block's trees, mnistcu__stats_warp) and the
   optimizer. So the weights after any number of steps are the same bits as the
   unfused path's, and the fused path is the default where it applies (the own
   kernels, see mnistcu__fused_plan). The price is a dependent chain of K fmafs
   per output, 784 for the first layer: a split sum would be faster but would
   change the bits. */
typedef struct mnistcu__fused_args {
    const uint8_t *u8;       /* the dataset on the device: u8 or f32 [count][D] */
    const float *f32;
    const int32_t *labels;   /* [count] */
    const uint32_t *idx;     /* the epoch's sample order */
    size_t n, step0;         /* samples in the epoch; the chunk's first step */
    int nsteps, B;           /* steps in the chunk; batch size (the last batch may be smaller) */
    int D, H, C, act1, act2; /* inputs, hidden units, outputs; the layers' activations */
    int has_b1, has_b2, slots; /* biases; optimizer state slots */
    int nu_max, per_max;     /* most units, most logits of a block */
    int prefetch;            /* the next batch's bytes are loaded into registers during a step */
    float scale, shift;      /* normalisation */
    float *params, *grads, *state;
    size_t np;               /* parameters (the state's slot stride) */
    size_t w1, b1, w2, b2;   /* offsets in the arenas */
    float *h, *z;            /* [B][H] hidden activations, [B][C] logits (the layers' outputs) */
    const mnistcu__opt *opt; /* [nops] each step's optimizer scalars; steps from nops on take opt[nops - 1] */
    int nops;
    mnistcu__lossp lp;
    double *stats;           /* [2][stats_cap]: per step loss sums, then correct counts */
    size_t stats_cap;
} mnistcu__fused_args;

/* What a block keeps in shared memory, in floats, each part 16-byte aligned:
     x     [B][ldx]       the batch (ldx >= D, ldx = 4 mod 32: float4 rows
                          whose reads by 8 threads, one row each, hit distinct
                          banks)
     loc   [nloc]         the block's own parameters, for the whole chunk: its
                          W1 rows [nu][ldw], b1 entries [nu], W2 columns [nu][C]
     lst   [slots][nloc]  their optimizer state
     hs    [nu][B]        its units' activations
     dh    [B][nu4]       their gradients (nu4: nu rounded up to 4)
     dz    [B][C]         the loss gradient; zs [B][C] the logits
     stg   [per][sh]      phase 2: a row of h at 0 and a row of W2 at ldw2;
                          in phase 4, where the skinny kernel's order applies,
                          the W2 gradient's slice sums [nu][C][SL + 1]
     gs    [nu][ldw]      the gradients of its W1 rows, before their update
     ls    [B]            losses; then the int32 predictions [B], and labels
                          and sample indices [2][B] each (this step's, the next's) */
typedef struct mnistcu__fused_layout {
    int ldx, ldw, nu4, ldw2, sh;
    size_t nloc, x, loc, lst, hs, dh, dz, zs, stg, gs, ls, ints, total;
} mnistcu__fused_layout;

static MNISTCU__HD size_t mnistcu__r4(size_t v) { return (v + 3) / 4 * 4; }
static MNISTCU__HD int mnistcu__mod32_4(int v) { return (v + 27) / 32 * 32 + 4; } /* the least >= v that is 4 mod 32 */

static MNISTCU__HD void mnistcu__fused_layout_make(int B, int D, int H, int C, int nu, int per, int slots,
                                                   mnistcu__fused_layout *l)
{
    size_t o = 0;
    l->ldx = mnistcu__mod32_4(D);
    l->ldw = (int)mnistcu__r4((size_t)D);
    l->nu4 = (int)mnistcu__r4((size_t)nu);
    l->ldw2 = (int)mnistcu__r4((size_t)H);
    l->sh = mnistcu__mod32_4(2 * l->ldw2);
    l->nloc = mnistcu__r4((size_t)nu * (size_t)(l->ldw + 1 + C));
    l->x = o; o += (size_t)B * (size_t)l->ldx;
    l->loc = o; o += l->nloc;
    l->lst = o; o += (size_t)slots * l->nloc;
    l->hs = o; o += mnistcu__r4((size_t)nu * (size_t)B);
    l->dh = o; o += (size_t)B * (size_t)l->nu4;
    l->dz = o; o += mnistcu__r4((size_t)B * (size_t)C);
    l->zs = o; o += mnistcu__r4((size_t)B * (size_t)C);
    l->stg = o; o += MNISTCU__MAX((size_t)per * (size_t)l->sh,
                                  mnistcu__skinny_shape((size_t)C, (size_t)H, 1)
                                      ? mnistcu__r4((size_t)nu * (size_t)C * (MNISTCU__SKINNY_SL + 1)) : 0);
    l->gs = o; o += (size_t)nu * (size_t)l->ldw;
    l->ls = o; o += mnistcu__r4((size_t)B);
    l->ints = o; o += 5 * (size_t)B;
    l->total = o;
}

/* The most 16-byte loads of the next batch a thread keeps in registers. */
#define MNISTCU__FUSED_PV 13 /* 784-byte images at batch 64: 12.25 a thread */

/* xs[r][k] = the batch, normalised as mnistcu__k_gather does: each thread keeps
   four loads in flight (a load's latency is what this costs). */
static __device__ void mnistcu__fused_stage_x(const mnistcu__fused_args *a, const uint32_t *srow, int b, int ldx,
                                              float *xs)
{
    const int t = (int)threadIdx.x, T = (int)blockDim.x, D = a->D, n = b * D;
    int e0, u;
    for (e0 = t; e0 < n; e0 += 4 * T) {
        float v[4];
#pragma unroll
        for (u = 0; u < 4; ++u) {
            int e = e0 + u * T, r = e / D;
            if (e < n) { /* r < b: srow has b entries */
                size_t at = (size_t)srow[r] * (size_t)D + (size_t)(e - r * D);
                v[u] = a->u8 ? (float)a->u8[at] : a->f32[at];
            }
        }
#pragma unroll
        for (u = 0; u < 4; ++u) {
            int e = e0 + u * T, r = e / D;
            if (e < n) xs[r * ldx + e - r * D] = fmaf(v[u], a->scale, a->shift);
        }
    }
}

/* The prefetching path (bytes, D a multiple of 16): the batch of rows srow as
   16-byte loads into v, the thread's loads e = t, t + T, ...; (row, word)
   stepped without a division. */
static __device__ void mnistcu__fused_load_x(const mnistcu__fused_args *a, const uint32_t *srow, int b,
                                             uint4 v[MNISTCU__FUSED_PV])
{
    const int t = (int)threadIdx.x, T = (int)blockDim.x, V = a->D / 16, n = b * V, dq = T / V, dr = T - dq * V;
    int u, r = t / V, c = t - r * V;
#pragma unroll
    for (u = 0; u < MNISTCU__FUSED_PV; ++u) {
        if (t + u * T >= n) break;
        v[u] = ((const uint4 *)(a->u8 + (size_t)srow[r] * (size_t)a->D))[c];
        r += dq;
        c += dr;
        if (c >= V) {
            c -= V;
            ++r;
        }
    }
}

/* Then into xs: a load's sixteen floats are four float4 stores 16 bytes
   apart, which thread t makes in the order q = (t / 2) % 4, ... (a rotation),
   so that the warp's 32 stores of each round meet in no bank (in order, the
   even threads' stores would all fall in the same four banks). */
static __device__ void mnistcu__fused_store_x(const mnistcu__fused_args *a, int b, int ldx,
                                              const uint4 v[MNISTCU__FUSED_PV], float *xs)
{
    const int t = (int)threadIdx.x, T = (int)blockDim.x, V = a->D / 16, n = b * V, dq = T / V, dr = T - dq * V;
    const int rot = (t >> 1) & 3;
    const float sc = a->scale, sh = a->shift;
    int u, q, r = t / V, c = t - r * V;
#pragma unroll
    for (u = 0; u < MNISTCU__FUSED_PV; ++u) {
        float *x = xs + r * ldx + 16 * c;
        if (t + u * T >= n) break;
#pragma unroll
        for (q = 0; q < 4; ++q) {
            const int qq = (q + rot) & 3;
            const unsigned w = (qq & 2) ? ((qq & 1) ? v[u].w : v[u].z) : ((qq & 1) ? v[u].y : v[u].x);
            *(float4 *)(x + 4 * qq) =
                make_float4(fmaf((float)(w & 255u), sc, sh), fmaf((float)((w >> 8) & 255u), sc, sh),
                            fmaf((float)((w >> 16) & 255u), sc, sh), fmaf((float)(w >> 24), sc, sh));
        }
        r += dq;
        c += dr;
        if (c >= V) {
            c -= V;
            ++r;
        }
    }
}

/* The block's own parameters and state between global memory and loc/lst:
   W1 rows, b1 entries, W2 columns; out 0 loads them, 1 stores them back. */
static __device__ void mnistcu__fused_own(const mnistcu__fused_args *a, const mnistcu__fused_layout *l, int nu,
                                          float *loc, float *lst, int out)
{
    const int t = (int)threadIdx.x, T = (int)blockDim.x, j = (int)blockIdx.x, G = (int)gridDim.x;
    const int D = a->D, C = a->C, ldw = l->ldw, nb1 = a->nu_max * ldw, nw2 = nb1 + a->nu_max;
    const int n = nu * (D + 1 + C);
    int e, sl;
    for (e = t; e < n; e += T) {
        int li, ui, k;
        size_t gi;
        if (e < nu * D) { /* W1 [u][k] */
            ui = e / D;
            k = e - ui * D;
            li = ui * ldw + k;
            gi = a->w1 + (size_t)(j + ui * G) * (size_t)D + (size_t)k;
        } else if (e < nu * (D + 1)) { /* b1 [u] */
            ui = e - nu * D;
            if (!a->has_b1) continue;
            li = nb1 + ui;
            gi = a->b1 + (size_t)(j + ui * G);
        } else { /* W2 [c][u] */
            int f = e - nu * (D + 1);
            ui = f / C;
            k = f - ui * C;
            li = nw2 + ui * C + k;
            gi = a->w2 + (size_t)k * (size_t)a->H + (size_t)(j + ui * G);
        }
        if (out) a->params[gi] = loc[li];
        else loc[li] = a->params[gi];
        for (sl = 0; sl < a->slots; ++sl) {
            if (out) a->state[(size_t)sl * a->np + gi] = lst[(size_t)sl * l->nloc + (size_t)li];
            else lst[(size_t)sl * l->nloc + (size_t)li] = a->state[(size_t)sl * a->np + gi];
        }
    }
}

/* acc + a[0] b[0] + a[1] b[1] + ... over n float4 pairs, one fmaf at a time in
   order (one output of the products), sixteen terms loaded at once, and the
   next sixteen loaded before this sixteen's fmafs, so that the loads' latency
   hides behind the chain. */
static __device__ __forceinline__ float mnistcu__fma16(const float4 av[4], const float4 bv[4], float acc)
{
    int u;
#pragma unroll
    for (u = 0; u < 4; ++u) {
        acc = fmaf(av[u].x, bv[u].x, acc);
        acc = fmaf(av[u].y, bv[u].y, acc);
        acc = fmaf(av[u].z, bv[u].z, acc);
        acc = fmaf(av[u].w, bv[u].w, acc);
    }
    return acc;
}
static __device__ float mnistcu__dot_chain(const float4 *a, const float4 *b, int n, float acc)
{
    int k = 0, u;
    if (n >= 4) { /* the next sixteen terms are loaded before this sixteen's fmafs */
        float4 av[4], bv[4];
#pragma unroll
        for (u = 0; u < 4; ++u) {
            av[u] = a[u];
            bv[u] = b[u];
        }
        for (k = 4; k + 4 <= n; k += 4) {
            float4 an[4], bn[4];
#pragma unroll
            for (u = 0; u < 4; ++u) {
                an[u] = a[k + u];
                bn[u] = b[k + u];
            }
            acc = mnistcu__fma16(av, bv, acc);
#pragma unroll
            for (u = 0; u < 4; ++u) {
                av[u] = an[u];
                bv[u] = bn[u];
            }
        }
        acc = mnistcu__fma16(av, bv, acc);
    }
    for (; k < n; ++k) {
        float4 av = a[k], bv = b[k];
        acc = fmaf(av.x, bv.x, acc);
        acc = fmaf(av.y, bv.y, acc);
        acc = fmaf(av.z, bv.z, acc);
        acc = fmaf(av.w, bv.w, acc);
    }
    return acc;
}

/* Two chains of mnistcu__dot_chain's order at once, a[] against b0[] and b1[]
   from 0.0f into acc[0] and acc[1], a loaded once for both. */
static __device__ void mnistcu__dot_chain2(const float4 *a, const float4 *b0, const float4 *b1, int n, float acc[2])
{
    float s0 = 0.0f, s1 = 0.0f;
    int k = 0, u;
    if (n >= 4) {
        float4 av[4], bv[4], cv[4];
#pragma unroll
        for (u = 0; u < 4; ++u) {
            av[u] = a[u];
            bv[u] = b0[u];
            cv[u] = b1[u];
        }
        for (k = 4; k + 4 <= n; k += 4) {
            float4 an[4], bn[4], cn[4];
#pragma unroll
            for (u = 0; u < 4; ++u) {
                an[u] = a[k + u];
                bn[u] = b0[k + u];
                cn[u] = b1[k + u];
            }
            s0 = mnistcu__fma16(av, bv, s0);
            s1 = mnistcu__fma16(av, cv, s1);
#pragma unroll
            for (u = 0; u < 4; ++u) {
                av[u] = an[u];
                bv[u] = bn[u];
                cv[u] = cn[u];
            }
        }
        s0 = mnistcu__fma16(av, bv, s0);
        s1 = mnistcu__fma16(av, cv, s1);
    }
    for (; k < n; ++k) {
        float4 av = a[k], bv = b0[k], cv = b1[k];
        s0 = fmaf(av.x, bv.x, s0);
        s0 = fmaf(av.y, bv.y, s0);
        s0 = fmaf(av.z, bv.z, s0);
        s0 = fmaf(av.w, bv.w, s0);
        s1 = fmaf(av.x, cv.x, s1);
        s1 = fmaf(av.y, cv.y, s1);
        s1 = fmaf(av.z, cv.z, s1);
        s1 = fmaf(av.w, cv.w, s1);
    }
    acc[0] = s0;
    acc[1] = s1;
}

/* The W1 gradient of a block's nu units into gs: tiles of TU units x 4 inputs
   a thread (a row's four x and TU dh in one load each), every output one fmaf
   chain over the rows in order, as the unfused product makes it. TU 1 where
   a block has one unit (P2's shape), 8 where it has a multiple of 8 (P1's:
   one tile a thread, 196 of them, where 4 made 392 in two rounds), else 4. */
template <int TU>
static __device__ void mnistcu__fused_dw1(const float *xs, const float *dhs, float *gs, int D, int nu, int b, int ldx,
                                          int ldw, int nu4)
{
    const int t = (int)threadIdx.x, T = (int)blockDim.x;
    const int ntk = (D + 3) / 4, ntiles = ntk * ((nu + TU - 1) / TU);
    int e;
    for (e = t; e < ntiles; e += T) {
        const int k0 = 4 * (e % ntk), u0 = TU * (e / ntk);
        float acc[TU][4];
        int r, uu, kk;
#pragma unroll
        for (uu = 0; uu < TU; ++uu)
#pragma unroll
            for (kk = 0; kk < 4; ++kk) acc[uu][kk] = 0.0f;
#pragma unroll 2
        for (r = 0; r < b; ++r) {
            const float4 xv = *(const float4 *)(xs + r * ldx + k0);
            const float x4[4] = {xv.x, xv.y, xv.z, xv.w};
            float d4[TU];
            if (TU >= 4) {
#pragma unroll
                for (uu = 0; uu < TU; uu += 4) {
                    const float4 dv = *(const float4 *)(dhs + r * nu4 + u0 + uu);
                    d4[uu] = dv.x;
                    d4[TU > 1 ? uu + 1 : 0] = dv.y;
                    d4[TU > 2 ? uu + 2 : 0] = dv.z;
                    d4[TU > 3 ? uu + 3 : 0] = dv.w;
                }
            } else {
                d4[0] = dhs[r * nu4 + u0];
            }
#pragma unroll
            for (uu = 0; uu < TU; ++uu)
#pragma unroll
                for (kk = 0; kk < 4; ++kk) acc[uu][kk] = fmaf(d4[uu], x4[kk], acc[uu][kk]);
        }
#pragma unroll
        for (uu = 0; uu < TU; ++uu)
#pragma unroll
            for (kk = 0; kk < 4; ++kk) {
                const int ui = u0 + uu, k = k0 + kk;
                float g = acc[uu][kk];
                if (ui >= nu || k >= D) continue;
                if (b % 16) g = fmaf(0.0f, 0.0f, g);
                gs[ui * ldw + k] = g;
            }
    }
}

/* bench/fused_phases.cu defines MNISTCU_FUSED_PROFILE: block 0 then sums the
   clock cycles its thread 0 spends in each phase over all steps. */
#ifdef MNISTCU_FUSED_PROFILE
__device__ long long mnistcu__fused_prof[16];
#define MNISTCU__FPROF(i)                                 \
    do {                                                  \
        if (j == 0 && t == 0) {                           \
            long long c_ = clock64();                     \
            prof_acc[i] += c_ - prof_last;                \
            prof_last = c_;                               \
        }                                                 \
    } while (0)
#else
#define MNISTCU__FPROF(i) ((void)0)
#endif

__global__ void __launch_bounds__(MNISTCU__THREADS) mnistcu__k_fused_mlp(mnistcu__fused_args a)
{
    MNISTCU__PDL_WAIT();
    extern __shared__ float4 mnistcu__fsm4[];
    __shared__ double sl[MNISTCU__THREADS / 32], sc[MNISTCU__THREADS / 32];
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    const int t = (int)threadIdx.x, T = (int)blockDim.x, G = (int)gridDim.x, j = (int)blockIdx.x;
    const int D = a.D, H = a.H, C = a.C, B = a.B, D4 = D & ~3, H4 = H & ~3;
    const int nu = (H - j + G - 1) / G; /* this block's units: j, j + G, ... */
    mnistcu__fused_layout l;
    float *sm = (float *)mnistcu__fsm4, *xs, *loc, *lst, *hs, *dhs, *dzs, *zs, *stg, *gs, *ls;
    int32_t *labs, *labs_next, *prs;
    uint32_t *srow, *srow_next;
    int pend = 0, pb = 0; /* block 0: step pstep's statistics (pb rows) wait for the next step's idle warp */
    size_t pstep = 0;
    float *P = a.params, *Gd = a.grads;
    int q, ldx, ldw, nu4, nb1, nw2;
    uint4 v[MNISTCU__FUSED_PV];
#ifdef MNISTCU_FUSED_PROFILE
    long long prof_acc[16] = {0}, prof_last = clock64();
#endif
    mnistcu__fused_layout_make(B, D, H, C, a.nu_max, a.per_max, a.slots, &l);
    ldx = l.ldx;
    ldw = l.ldw;
    nu4 = l.nu4;
    nb1 = a.nu_max * ldw; /* where b1 and the W2 columns sit in loc */
    nw2 = nb1 + a.nu_max;
    xs = sm + l.x;
    loc = sm + l.loc;
    lst = sm + l.lst;
    hs = sm + l.hs;
    dhs = sm + l.dh;
    dzs = sm + l.dz;
    zs = sm + l.zs;
    stg = sm + l.stg;
    gs = sm + l.gs;
    ls = sm + l.ls;
    prs = (int32_t *)(sm + l.ints);
    labs = prs + B;
    labs_next = labs + B;
    srow = (uint32_t *)(labs_next + B);
    srow_next = srow + B;
    mnistcu__fused_own(&a, &l, nu, loc, lst, 0);
    {   /* the first batch's rows */
        const size_t off = a.step0 * (size_t)B;
        const int b = (int)MNISTCU__MIN((size_t)B, a.n - off);
        for (q = t; q < b; q += T) srow[q] = a.idx[off + (size_t)q];
        __syncthreads();
        for (q = t; q < b; q += T) labs[q] = a.labels[srow[q]];
        if (a.prefetch) mnistcu__fused_load_x(&a, srow, b, v);
    }
    MNISTCU__FPROF(0);
    for (q = 0; q < a.nsteps; ++q) {
        const size_t step = a.step0 + (size_t)q, off = step * (size_t)B;
        const int b = (int)MNISTCU__MIN((size_t)B, a.n - off);
        const int more = q + 1 < a.nsteps; /* else the gradients stay in Gd, as the unfused path leaves them */
        const int bn = more ? (int)MNISTCU__MIN((size_t)B, a.n - off - (size_t)B) : 0; /* the next batch */
        const mnistcu__opt o = a.opt[q < a.nops ? q : a.nops - 1];
        mnistcu__opt ol = o; /* the same step over the block's own arena */
        const float gscale = a.lp.sum ? 1.0f : 1.0f / (float)b;
        /* the W2 gradient in mnistcu__k_gemm_skinny's order where it applies:
           S slices of R rows, their parts in stg (free after phase 2) */
        const int skin = mnistcu__skinny_shape((size_t)C, (size_t)H, (size_t)b);
        const int R = (b + MNISTCU__SKINNY_SL - 1) / MNISTCU__SKINNY_SL, S = (b + R - 1) / R;
        float *parts = stg;
        int e, per, i0, cnt, e0, u;
        /* the next batch's first T sample indices, loaded now and stored after
           phase 1, so that their latency hides behind it */
        const uint32_t nidx = t < bn ? a.idx[off + (size_t)B + (size_t)t] : 0u;
        int32_t nlab;
        ol.n = l.nloc;
        /* 1. the batch into xs, then h for this block's units; then the next
           batch's sample indices */
        if (a.prefetch) mnistcu__fused_store_x(&a, b, ldx, v, xs);
        else mnistcu__fused_stage_x(&a, srow, b, ldx, xs);
        __syncthreads();
        MNISTCU__FPROF(1);
        /* consecutive threads: consecutive rows of two units (one where the
           block has one, or the last of an odd count), a chain each, x loaded
           once for both */
        for (e = t; e < (nu + 1) / 2 * b; e += T) {
            const int pi = e / b, r = e - pi * b, ua = 2 * pi, ub = ua + 1 < nu ? ua + 1 : ua;
            const float *xr = xs + r * ldx;
            float acc[2];
            int k, w;
            if (nu == 1) acc[0] = mnistcu__dot_chain((const float4 *)xr, (const float4 *)loc, D4 / 4, 0.0f);
            else
                mnistcu__dot_chain2((const float4 *)xr, (const float4 *)(loc + ua * ldw),
                                    (const float4 *)(loc + ub * ldw), D4 / 4, acc);
#pragma unroll
            for (w = 0; w < 2; ++w) {
                const int ui = w ? ub : ua;
                float v = acc[w];
                if (w && ub == ua) break;
                for (k = D4; k < D; ++k) v = fmaf(xr[k], loc[ui * ldw + k], v);
                if (D % 16) v = fmaf(0.0f, 0.0f, v);
                v = mnistcu__act_f((mnistcu_act)a.act1, a.has_b1 ? v + loc[nb1 + ui] : v);
                a.h[(size_t)r * H + (j + ui * G)] = v;
                hs[ui * B + r] = v;
            }
        }
        if (pend && t >= T - 32) /* the step before's labels are in labs_next until this step's end */
            mnistcu__stats_warp(ls, prs, labs_next, pb, a.stats + pstep, a.stats + a.stats_cap + pstep);
        pend = 0;
        if (t < bn) srow_next[t] = nidx;
        for (e = t + T; e < bn; e += T) srow_next[e] = a.idx[off + (size_t)B + (size_t)e]; /* batches above T */
        MNISTCU__FPROF(2);
        grid.sync();
        MNISTCU__FPROF(3);
        /* the next batch's labels and bytes travel while this step goes on (the
           labels reach shared memory at the step's end) */
        nlab = t < bn ? a.labels[srow_next[t]] : 0;
        if (more && a.prefetch) mnistcu__fused_load_x(&a, srow_next, bn, v);
        /* 2. logits i0 .. i0+cnt-1 (row-major over [b][C]), each from staged rows */
        per = (b * C + G - 1) / G;
        i0 = j * per;
        cnt = MNISTCU__MIN(per, b * C - i0);
        {   /* sixteen loads of each in flight a thread; element e of the staging is
               entry k of logit qi, i = i0 + qi = r C + c, stepped without a division */
            const int n2 = cnt * H, dq = T / H, dr = T - dq * H;
            int qi = t / H, k = t - qi * H, r = (i0 + qi) / C, c = i0 + qi - r * C;
            for (e0 = t; e0 < n2; e0 += 16 * T) {
                float hv[16], wv[16];
                int so[16];
#pragma unroll
                for (u = 0; u < 16; ++u) {
                    int d = dq;
                    if (e0 + u * T >= n2) break;
                    so[u] = qi * l.sh + k;
                    hv[u] = a.h[(size_t)r * H + k];
                    wv[u] = P[a.w2 + (size_t)c * H + (size_t)k];
                    k += dr;
                    if (k >= H) {
                        k -= H;
                        ++d;
                    }
                    qi += d;
                    for (c += d; c >= C; c -= C) ++r;
                }
#pragma unroll
                for (u = 0; u < 16; ++u) {
                    if (e0 + u * T >= n2) break;
                    stg[so[u]] = hv[u];
                    stg[so[u] + l.ldw2] = wv[u];
                }
            }
        }
        __syncthreads();
        MNISTCU__FPROF(4);
        if (t < cnt) {
            int i = i0 + t, c = i % C, k;
            const float *hr = stg + t * l.sh, *wr = hr + l.ldw2;
            float acc = mnistcu__dot_chain((const float4 *)hr, (const float4 *)wr, H4 / 4, 0.0f);
            for (k = H4; k < H; ++k) acc = fmaf(hr[k], wr[k], acc);
            if (H % 16) acc = fmaf(0.0f, 0.0f, acc);
            a.z[i] = mnistcu__act_f((mnistcu_act)a.act2, a.has_b2 ? acc + P[a.b2 + (size_t)c] : acc);
        }
        MNISTCU__FPROF(5);
        grid.sync();
        MNISTCU__FPROF(6);
        /* 3. the loss and its gradient for every row; the statistics */
        for (e = t; e < b * C; e += 4 * T) { /* four loads in flight a thread */
            float zv[4];
#pragma unroll
            for (u = 0; u < 4; ++u)
                if (e + u * T < b * C) zv[u] = a.z[e + u * T];
#pragma unroll
            for (u = 0; u < 4; ++u)
                if (e + u * T < b * C) zs[e + u * T] = zv[u];
        }
        __syncthreads();
        if (a.lp.kind == MNISTCU_LOSS_SOFTMAX_CE && a.lp.smoothing == 0.0f) {
            /* mnistcu__softmax_ce_row's steps, its e^(z - max) a thread each (one
               thread a row took about 2 us here): a row's max (in ls, until its
               loss), every e, then a row's sum in order and the end */
            for (e = t; e < b; e += T) {
                size_t arg;
                ls[e] = mnistcu__row_max(zs + e * C, (size_t)C, &arg);
                prs[e] = (int32_t)arg;
            }
            __syncthreads();
            {   /* row r of element e, stepped without a division */
                const int dq = T / C, dr = T - dq * C;
                int r = t / C, c = t - r * C;
                for (e = t; e < b * C; e += T) {
                    dzs[e] = expf(zs[e] - ls[r]);
                    r += dq;
                    c += dr;
                    if (c >= C) {
                        c -= C;
                        ++r;
                    }
                }
            }
            __syncthreads();
        }
        for (e = t; e < b; e += T) {
            int c;
            if (a.lp.kind == MNISTCU_LOSS_SOFTMAX_CE && a.lp.smoothing == 0.0f) {
                float sum = 0.0f;
                for (c = 0; c < C; ++c) sum = MNISTCU__ADD(sum, dzs[e * C + c]);
                mnistcu__softmax_ce_end(zs + e * C, labs[e], (size_t)C, ls[e], sum, gscale, dzs + e * C, &ls[e]);
            } else {
                mnistcu__loss_row(&a.lp, zs + e * C, labs[e], NULL, (size_t)C, gscale, dzs + e * C, &ls[e], &prs[e]);
            }
            if (a.act2 != MNISTCU_ACT_IDENTITY)
                for (c = 0; c < C; ++c)
                    dzs[e * C + c] = mnistcu__act_backward_one((mnistcu_act)a.act2, dzs[e * C + c], zs[e * C + c]);
        }
        __syncthreads();
        MNISTCU__FPROF(7);
        /* block 0's statistics, on the path every block waits for: where the next
           step's phase 1 leaves the last warp idle, that warp makes them then */
        if (j == 0 && more && (nu + 1) / 2 * bn <= T - 32) {
            pend = 1;
            pstep = step;
            pb = b;
        } else if (j == 0) {
            mnistcu__stats_block(ls, prs, labs, b, sl, sc, a.stats + step, a.stats + a.stats_cap + step);
        }
        MNISTCU__FPROF(8);
        /* 4. this block's units: dh with the old W2 columns; where the skinny
           kernel takes the W2 gradient, its slice sums (a thread each); then
           every update */
        for (e = t; e < nu * b; e += T) {
            int ui = e / b, r = e - ui * b, c;
            float acc = 0.0f;
            for (c = 0; c < C; ++c) acc = fmaf(dzs[r * C + c], loc[nw2 + ui * C + c], acc);
            if (C % 16) acc = fmaf(0.0f, 0.0f, acc);
            dhs[r * nu4 + ui] = mnistcu__act_backward_one((mnistcu_act)a.act1, acc, hs[ui * B + r]);
        }
        if (skin) { /* parts [ui][c][si], rows si R .. of unit ui and logit c; stepped without a division */
            const int dq = T / S, dr = T - dq * S;
            int oc = t / S, si = t - oc * S, ui = oc / C, c = oc - ui * C;
            for (e = t; e < nu * C * S; e += T) {
                const int r0 = si * R, r1 = r0 + R < b ? r0 + R : b;
                float part = 0.0f;
                int r, d = dq;
                for (r = r0; r < r1; ++r) part = fmaf(dzs[r * C + c], hs[ui * B + r], part);
                parts[oc * (MNISTCU__SKINNY_SL + 1) + si] = part;
                si += dr;
                if (si >= S) {
                    si -= S;
                    ++d;
                }
                oc += d;
                for (c += d; c >= C; c -= C) ++ui;
            }
        }
        __syncthreads();
        MNISTCU__FPROF(9);
        /* W2 [c][u] (written through: other blocks read it), b1 [u], and in the
           last block (block 0 has the statistics) b2 [c]: one thread each */
        for (e = t; e < nu * C + nu + (j == G - 1 ? C : 0); e += T) {
            int r;
            float acc = 0.0f;
            if (e < nu * C) {
                int ui = e / C, c = e - ui * C, li = nw2 + ui * C + c;
                size_t gi = a.w2 + (size_t)c * H + (size_t)(j + ui * G);
                if (skin) { /* mnistcu__k_gemm_skinny's sums: the slices' parts in order */
                    const float *pp = parts + (ui * C + c) * (MNISTCU__SKINNY_SL + 1);
                    acc = pp[0];
#pragma unroll 8
                    for (r = 1; r < S; ++r) acc += pp[r];
                } else {
#pragma unroll 4
                    for (r = 0; r < b; ++r) acc = fmaf(dzs[r * C + c], hs[ui * B + r], acc);
                    if (b % 16) acc = fmaf(0.0f, 0.0f, acc);
                }
                if (!more) Gd[gi] = acc;
                mnistcu__opt_one(&ol, (size_t)li, loc, acc, lst);
                P[gi] = loc[li];
            } else if (e < nu * C + nu) {
                int ui = e - nu * C;
                if (!a.has_b1) continue;
#pragma unroll 4
                for (r = 0; r < b; ++r) acc += dhs[r * nu4 + ui];
                if (!more) Gd[a.b1 + (size_t)(j + ui * G)] = acc;
                mnistcu__opt_one(&ol, (size_t)(nb1 + ui), loc, acc, lst);
            } else {
                int c = e - nu * C - nu;
                if (!a.has_b2) continue;
#pragma unroll 4
                for (r = 0; r < b; ++r) acc += dzs[r * C + c];
                if (!more) Gd[a.b2 + (size_t)c] = acc;
                mnistcu__opt_one(&o, a.b2 + (size_t)c, P, acc, a.state);
            }
        }
        MNISTCU__FPROF(10);
        /* W1 [u][k]: the gradient in register tiles, then each weight's step */
        if (nu == 1) mnistcu__fused_dw1<1>(xs, dhs, gs, D, nu, b, ldx, ldw, nu4);
        else if (nu % 8 == 0) mnistcu__fused_dw1<8>(xs, dhs, gs, D, nu, b, ldx, ldw, nu4);
        else mnistcu__fused_dw1<4>(xs, dhs, gs, D, nu, b, ldx, ldw, nu4);
        __syncthreads();
        MNISTCU__FPROF(11);
        {   /* consecutive threads, consecutive k; (ui, k) stepped without a division */
            int ui = t / D, k = t - ui * D;
            const int sgd = ol.kind != MNISTCU_OPTIM_ADAM && ol.kind != MNISTCU_OPTIM_ADAMW &&
                            ol.kind != MNISTCU_OPTIM_RMSPROP && ol.kind != MNISTCU_OPTIM_ADAGRAD; /* opt_one's default */
            if (sgd && ldw == D) { /* rows without padding: the block's W1 is one run of nu D, four weights a float4 */
                const int mom = ol.has_momentum;
                for (e = 4 * t; e < nu * D; e += 4 * T) {
                    const float4 g4 = *(const float4 *)(gs + e), p4 = *(const float4 *)(loc + e);
                    const float g[4] = {g4.x, g4.y, g4.z, g4.w};
                    float p[4] = {p4.x, p4.y, p4.z, p4.w}, v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    if (mom) {
                        const float4 v4 = *(const float4 *)(lst + e);
                        v[0] = v4.x;
                        v[1] = v4.y;
                        v[2] = v4.z;
                        v[3] = v4.w;
                    }
#pragma unroll
                    for (u = 0; u < 4; ++u) p[u] = mnistcu__sgd_step(&ol, p[u], g[u], &v[u]); /* v unread without momentum */
                    *(float4 *)(loc + e) = make_float4(p[0], p[1], p[2], p[3]);
                    if (mom) *(float4 *)(lst + e) = make_float4(v[0], v[1], v[2], v[3]);
                    if (!more) {
                        const int ui4 = e / D, k4 = e - ui4 * D;
#pragma unroll
                        for (u = 0; u < 4; ++u) Gd[a.w1 + (size_t)(j + ui4 * G) * D + (size_t)(k4 + u)] = g[u];
                    }
                }
            } else if (sgd) { /* four weights' loads at once */
                const int mom = ol.has_momentum;
                for (e = t; e < nu * D; e += 4 * T) {
                    float g[4], p[4], v[4];
                    int li[4], wi[4];
#pragma unroll
                    for (u = 0; u < 4; ++u) {
                        li[u] = ui * ldw + k;
                        wi[u] = (j + ui * G) * D + k;
                        if (e + u * T < nu * D) {
                            g[u] = gs[li[u]];
                            p[u] = loc[li[u]];
                            v[u] = mom ? lst[li[u]] : 0.0f;
                        }
                        for (k += T; k >= D; k -= D) ++ui;
                    }
#pragma unroll
                    for (u = 0; u < 4; ++u)
                        if (e + u * T < nu * D) {
                            float vu = v[u];
                            if (!more) Gd[a.w1 + (size_t)wi[u]] = g[u];
                            loc[li[u]] = mnistcu__sgd_step(&ol, p[u], g[u], &vu); /* vu unread without momentum */
                            if (mom) lst[li[u]] = vu;
                        }
                }
            } else {
                for (e = t; e < nu * D; e += T) {
                    float g = gs[ui * ldw + k];
                    if (!more) Gd[a.w1 + (size_t)(j + ui * G) * D + (size_t)k] = g;
                    mnistcu__opt_one(&ol, (size_t)(ui * ldw + k), loc, g, lst);
                    for (k += T; k >= D; k -= D) ++ui;
                }
            }
        }
        if (t < bn) labs_next[t] = nlab;
        for (e = t + T; e < bn; e += T) labs_next[e] = a.labels[srow_next[e]];
        MNISTCU__FPROF(12);
        __syncthreads(); /* the next step overwrites xs, hs and the sample rows */
        {
            uint32_t *sw = srow;
            int32_t *lw = labs;
            srow = srow_next;
            srow_next = sw;
            labs = labs_next;
            labs_next = lw;
        }
    }
    mnistcu__fused_own(&a, &l, nu, loc, lst, 1);
    MNISTCU__FPROF(13);
#ifdef MNISTCU_FUSED_PROFILE
    if (j == 0 && t == 0)
        for (q = 0; q < 14; ++q) mnistcu__fused_prof[q] += prof_acc[q];
#endif
}

/* >>cuda_fused_lenet ---------------------------------------------------------------
   The fused LeNet-5 step: a block a sample, then a thread group a parameter group.
   With mnistcu_train_desc.fused_cnn, LeNet-5's shape (1x28x28 conv5x5x6 relu
   maxpool2 conv5x5x16 relu maxpool2 flatten dense120 relu dense84 relu
   dense10) trains in one cooperative kernel of one block of 1024 threads a
   multiprocessor, the steps up to the next report in one launch. The step by
   step path launches about 23 kernels a step, each a few microseconds of ramp
   and latency for a few microseconds of work; the arithmetic of a step is 108
   MFLOP. Here a step is two phases with a grid-wide barrier after each:
     A  a block a sample. Everything of one sample, forward and backward,
        depends on that sample alone but the weight gradients (sums over the
        batch): so its forward pass and its backward pass through every layer
        run in the block's shared memory, block barriers between the layers.
        The dense layers' weights (163 KB) arrive in bulk copies (the tensor
        memory accelerator) while the convolutions run. The block leaves in
        global memory what the dense weight gradients need (the layers' inputs
        and output gradients, a row a sample) and its sample's share of the
        convolutions' weight gradients. It also fetches its sample of the next
        step (index, label, bytes) while this one runs. Where as many clusters
        of 2 blocks as samples fit at once (sm_90), a sample has a pair: its
        block hands conv1's pooled maps, conv2's pooled gradient and the
        pool's argmax to the other by bulk copies; that helper makes half of
        conv2's input gradient (sent back the same way) and the sample's
        share of conv2's weight gradient while the sample's block goes on
        (about 2.7 us a step less; the same bits).
     B  a block a task (a tile of a dense layer's weights, or a run of
        parameters whose gradient is a row sum): the task's rows of the batch
        staged into shared memory in one round of loads, the sums over the
        batch from there, and the optimizer steps.
   The max pools route by the first maximum of each window, the relus' gradient
   is taken where the output is above zero, as the step by step path does.
   Every sum is in a fixed order and nothing uses atomics: the same bits on
   every run. The orders are not the step by step path's, so the weights agree
   with it to rounding, not bit for bit; hence opt-in. Measured on an H100 (P4,
   bench/RESULTS.md): 23.9-27.4 ms an epoch against 90.6 step by step; where the
   time goes, phase by phase: bench/fused_phases.cu. bench/lenet_fused.cu is
   the design's first form as a standalone program. */
enum { MNISTCU__LN_IH = 28, MNISTCU__LN_K = 5, MNISTCU__LN_C1 = 6, MNISTCU__LN_Q1 = 12, MNISTCU__LN_C2 = 16,
       MNISTCU__LN_O2 = 8, MNISTCU__LN_Q2 = 4, MNISTCU__LN_D0 = 256, MNISTCU__LN_D1 = 120, MNISTCU__LN_D2 = 84,
       MNISTCU__LN_D3 = 10, MNISTCU__LN_B = 64, MNISTCU__LN_T = 1024 };
/* the parameter arena: conv1 weight, bias, conv2 weight, bias, then the dense layers' */
enum { MNISTCU__LN_W1 = 0, MNISTCU__LN_B1 = 150, MNISTCU__LN_W2 = 156, MNISTCU__LN_B2 = 2556,
       MNISTCU__LN_F1 = 2572, MNISTCU__LN_G1 = 33292, MNISTCU__LN_F2 = 33412, MNISTCU__LN_G2 = 43492,
       MNISTCU__LN_F3 = 43576, MNISTCU__LN_G3 = 44416, MNISTCU__LN_NP = 44426,
       MNISTCU__LN_P1 = 156, MNISTCU__LN_P2 = 2416 /* conv1's and conv2's parameters */ };
/* shared memory, in floats, each part 16-byte aligned (the mbarrier 8-byte): the dense weights F1 [120][256],
   F2 [84][120], conv2's weights and bias, dense10's (850 in 852), conv1's, the sample, conv1's argmax
   offsets, conv2's pooled output, argmax offsets and argmax (bytes), the dense activations, logits and
   their gradients, conv2's pooled gradient G2, conv1's G1, four partial rows, the mbarrier, conv1's
   pooled maps P1 (6 planes of 152), the step's optimizer scalars; then what the block fetches for its
   next step's sample while this step runs (NI: [0] its index, [1] its label, [2] the label of the sample
   in X, [3] whether it came so; NX: its 784 bytes or floats); phase B's task (mnistcu__ln_task) */
enum { MNISTCU__LS_F1 = 0, MNISTCU__LS_F2 = 30720, MNISTCU__LS_W2 = 40800, MNISTCU__LS_W3 = 43216,
       MNISTCU__LS_W1 = 44068, MNISTCU__LS_X = 44224, MNISTCU__LS_OF1 = 45008,
       MNISTCU__LS_P2 = 45872, MNISTCU__LS_OF2 = 46128, MNISTCU__LS_AM2 = 46384, MNISTCU__LS_H1 = 46448,
       MNISTCU__LS_H2 = 46568, MNISTCU__LS_Z = 46652, MNISTCU__LS_DZ = 46668, MNISTCU__LS_DH2 = 46684,
       MNISTCU__LS_DH1 = 46768, MNISTCU__LS_G2 = 46888, MNISTCU__LS_G1 = 47144, MNISTCU__LS_PART = 48008,
       MNISTCU__LS_MB = 49032, MNISTCU__LS_P1X = 49036, MNISTCU__LS_OPT = MNISTCU__LS_P1X + 6 * 152,
       MNISTCU__LS_NI = MNISTCU__LS_OPT + 32, MNISTCU__LS_NX = MNISTCU__LS_NI + 4,
       MNISTCU__LS_TASK = MNISTCU__LS_NX + 784, MNISTCU__LS_END = MNISTCU__LS_TASK + 16 };
typedef char mnistcu__ln_opt_fits[sizeof(mnistcu__opt) <= 32 * sizeof(float) ? 1 : -1];
/* conv1's pooled maps P1 [6][12 x 12] lie at LS_P1X in planes of 152 floats: conv2's two-channel lanes
   (ic 2g, 2g + 1) then read distinct banks (2 * 152 = 16 mod 32) */
enum { MNISTCU__LN_PS = 152 };
/* after the gradient of conv2's pooled output, F1's place is free for the step: conv2's output gradient
   with a border of 4 zeros, rows of 44 floats (the 8 lanes of a quarter warp read 8 distinct bank
   groups), then 4 partial sums of conv2's input gradient */
enum { MNISTCU__LS_DA = 0, MNISTCU__LN_DAOC = 704, MNISTCU__LN_DAROW = 44, MNISTCU__LS_PT = 16 * 704 };
/* rows a sample in global memory, in floats (at most MNISTCU__LN_B samples) */
enum { MNISTCU__LR_P2 = 0, MNISTCU__LR_H1 = 64 * 256, MNISTCU__LR_H2 = 64 * 376, MNISTCU__LR_DZ = 64 * 460,
       MNISTCU__LR_DH2 = 64 * 470, MNISTCU__LR_DH1 = 64 * 554, MNISTCU__LR_PART2 = 64 * 674,
       MNISTCU__LR_PART1 = 64 * 3090, MNISTCU__LR_LOSS = 64 * 3246, MNISTCU__LR_OK = 64 * 3247,
       MNISTCU__LR_END = 64 * 3248 };
static size_t mnistcu__lenet_floats(void) { return (size_t)MNISTCU__LR_END; }

typedef struct mnistcu__lenet_args {
    const uint8_t *u8;   /* the dataset on the device: u8 or f32 [count][784] */
    const float *f32;
    const int32_t *labels;
    const uint32_t *idx; /* the epoch's sample order */
    size_t n, step0;     /* samples in the epoch; the chunk's first step */
    int nsteps, B;       /* steps in the chunk; batch size (the last batch may be smaller) */
    float scale, shift;  /* normalisation */
    float *params, *grads, *state;
    const mnistcu__opt *opt; /* [nops] each step's optimizer scalars; steps from nops on take opt[nops - 1] */
    int nops;
    mnistcu__lossp lp;
    double *stats;       /* [2][stats_cap]: per step loss sums, then correct counts */
    size_t stats_cap;
    float *rows;         /* mnistcu__lenet_floats() */
    int slots;           /* optimizer state slots (at most 3) */
    int fetch;           /* the dataset is 16-byte aligned: each block fetches its next sample early */
    int pair;            /* launched in clusters of 2: block 2c takes the sample, block 2c + 1 helps it */
} mnistcu__lenet_args;

/* bench/fused_phases.cu defines MNISTCU_FUSED_PROFILE: thread 0 of block 0 then sums the clock cycles
   from one mark to the next (slot 31 holds the last mark). */
#ifdef MNISTCU_FUSED_PROFILE
__device__ long long mnistcu__lenet_prof[32];
#define MNISTCU__LPROF(i)                                                 \
    do {                                                                  \
        if (blockIdx.x == 0 && threadIdx.x == 0) {                        \
            long long c_ = clock64();                                     \
            mnistcu__lenet_prof[i] += c_ - mnistcu__lenet_prof[31];       \
            mnistcu__lenet_prof[31] = c_;                                 \
        }                                                                 \
    } while (0)
#else
#define MNISTCU__LPROF(i) ((void)0)
#endif

static __device__ __forceinline__ float mnistcu__ln_relu(float v) { return v > 0.0f ? v : 0.0f; }
/* sums over groups of 2^k lanes, the same bits in each lane of a group */
static __device__ __forceinline__ float mnistcu__ln_sum(float v, int lanes)
{
    int off;
    for (off = 1; off < lanes; off <<= 1) v = v + __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
/* the first maximum of a 2x2 window's four values (row-major) and its position */
static __device__ __forceinline__ float mnistcu__ln_max4(float a0, float a1, float a2, float a3, int *am)
{
    float m = a0;
    *am = 0;
    if (a1 > m) { m = a1; *am = 1; }
    if (a2 > m) { m = a2; *am = 2; }
    if (a3 > m) { m = a3; *am = 3; }
    return m;
}

/* The dense layers' weights into shared memory: bulk copies completing on an mbarrier where the
   tensor memory accelerator is (sm_90), each block starting at another chunk; elsewhere a plain copy. */
static __device__ void mnistcu__ln_dense_begin(float *sm, const float *w, unsigned mbar, int b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
        int c, k;
        const unsigned s = (unsigned)__cvta_generic_to_shared(sm);
        asm volatile("fence.proxy.async;\n" ::: "memory"); /* after the generic writes to F1's place */
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar),
                     "r"((unsigned)((MNISTCU__LN_D1 * MNISTCU__LN_D0 + MNISTCU__LN_D2 * MNISTCU__LN_D1) * 4))
                     : "memory");
        for (c = 0; c < 12; ++c) {
            unsigned dst, bytes;
            const float *src;
            if (c < 8) { /* F1 in 8 chunks */
                k = (c + b) & 7;
                bytes = MNISTCU__LN_D1 * MNISTCU__LN_D0 / 8 * 4;
                dst = s + (unsigned)(MNISTCU__LS_F1 * 4) + (unsigned)k * bytes;
                src = w + MNISTCU__LN_F1 + k * (MNISTCU__LN_D1 * MNISTCU__LN_D0 / 8);
            } else { /* F2 in 4 */
                k = (c - 8 + b) & 3;
                bytes = MNISTCU__LN_D2 * MNISTCU__LN_D1 / 4 * 4;
                dst = s + (unsigned)(MNISTCU__LS_F2 * 4) + (unsigned)k * bytes;
                src = w + MNISTCU__LN_F2 + k * (MNISTCU__LN_D2 * MNISTCU__LN_D1 / 4);
            }
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                             dst),
                         "l"(src), "r"(bytes), "r"(mbar)
                         : "memory");
        }
    }
#else
    int j;
    (void)mbar;
    (void)b;
    for (j = (int)threadIdx.x; j < MNISTCU__LN_D1 * MNISTCU__LN_D0 / 4; j += MNISTCU__LN_T)
        ((float4 *)(sm + MNISTCU__LS_F1))[j] = ((const float4 *)(w + MNISTCU__LN_F1))[j];
    for (j = (int)threadIdx.x; j < MNISTCU__LN_D2 * MNISTCU__LN_D1 / 4; j += MNISTCU__LN_T)
        ((float4 *)(sm + MNISTCU__LS_F2))[j] = ((const float4 *)(w + MNISTCU__LN_F2))[j];
#endif
}
/* waits for them (the caller's block barrier follows) */
static __device__ void mnistcu__ln_dense_end(unsigned mbar, unsigned *phase)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned ok = 0;
    while (!ok)
        asm volatile("{\n .reg .pred P;\n mbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\n selp.b32 %0, 1, 0, P;\n}\n"
                     : "=r"(ok)
                     : "r"(mbar), "r"(*phase)
                     : "memory");
    *phase ^= 1u;
#else
    (void)mbar;
    (void)phase;
#endif
}

/* A dense layer's forward pass with its relu, from shared memory: N outputs of K inputs (K a multiple
   of 4), 8 lanes an output, lane r the float4s r, r + 8, ... of the input, then the sum over the lanes
   (whole warps: N * 8 is a multiple of 32). The output goes to h (shared) and row (global). */
template <int N, int K>
static __device__ __forceinline__ void mnistcu__ln_dense_relu(const float *W, const float *x, const float *bias, float *h,
                                                              float *row)
{
    const int tid = (int)threadIdx.x;
    if (tid < N * 8) {
        int jo = tid >> 3, r = tid & 7, t;
        const float4 *wr = (const float4 *)(W + jo * K), *xv = (const float4 *)x;
        float acc = 0.0f;
#pragma unroll
        for (t = 0; t < (K / 4 + 7) / 8; ++t)
            if (r + 8 * t < K / 4) {
                float4 wv = wr[r + 8 * t], x4 = xv[r + 8 * t];
                acc = fmaf(x4.x, wv.x, acc);
                acc = fmaf(x4.y, wv.y, acc);
                acc = fmaf(x4.z, wv.z, acc);
                acc = fmaf(x4.w, wv.w, acc);
            }
        acc = mnistcu__ln_sum(acc, 8);
        if (r == 0) {
            float v = mnistcu__ln_relu(acc + bias[jo]);
            h[jo] = v;
            row[jo] = v;
        }
    }
}

/* A copy of 4 or 16 bytes (bytes) from global to shared memory: asynchronous where it can be (the
   caller waits), else plain. */
static __device__ __forceinline__ void mnistcu__ln_copy(void *dst, const void *src, int bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                     "l"(src)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                     "l"(src)
                     : "memory");
#else
    if (bytes == 16) *(float4 *)dst = *(const float4 *)src;
    else *(float *)dst = *(const float *)src;
#endif
}

/* This sample's share of conv2's weight gradient into its row: a thread a weight, its 16 windows. */
static __device__ void mnistcu__ln_conv2_share(const float *sm, float *rows, int b)
{
    const float *P1 = sm + MNISTCU__LS_P1X, *G2 = sm + MNISTCU__LS_G2;
    const int *OF2 = (const int *)(sm + MNISTCU__LS_OF2);
    int j;
    for (j = (int)threadIdx.x; j < MNISTCU__LN_P2; j += MNISTCU__LN_T) {
        float acc = 0.0f;
        int wi;
        if (j < 2400) {
            int oc = j / 150, rr = j - oc * 150, ic = rr / 25, kk = rr - ic * 25, ky = kk / MNISTCU__LN_K;
            const float *base = P1 + ic * MNISTCU__LN_PS + ky * MNISTCU__LN_Q1 + (kk - ky * MNISTCU__LN_K);
#pragma unroll
            for (wi = 0; wi < 16; ++wi) acc = fmaf(G2[oc * 16 + wi], base[OF2[oc * 16 + wi]], acc);
        } else {
            for (wi = 0; wi < 16; ++wi) acc += G2[(j - 2400) * 16 + wi];
        }
        rows[MNISTCU__LR_PART2 + b * MNISTCU__LN_P2 + j] = acc;
    }
}

/* conv2's pooled gradient G2 routed through the pool's argmax offsets into conv2's output map, with a
   border of 4 zeros (DA, in F1's place). */
static __device__ void mnistcu__ln_route(float *sm)
{
    const float *G2 = sm + MNISTCU__LS_G2;
    const uint8_t *AM2 = (const uint8_t *)(sm + MNISTCU__LS_AM2);
    float *DA = sm + MNISTCU__LS_DA;
    int j;
    for (j = (int)threadIdx.x; j < MNISTCU__LN_C2 * 256; j += MNISTCU__LN_T) {
        int oc = j >> 8, yy = (j >> 4) & 15, xx = j & 15, y = yy - 4, x = xx - 4;
        float v = 0.0f;
        if ((unsigned)y < MNISTCU__LN_O2 && (unsigned)x < MNISTCU__LN_O2) {
            int k = oc * 16 + (y >> 1) * 4 + (x >> 1);
            if (AM2[k] == ((y & 1) << 1 | (x & 1))) v = G2[k];
        }
        DA[oc * MNISTCU__LN_DAOC + yy * MNISTCU__LN_DAROW + xx] = v;
    }
}

/* conv2's input gradient, output channel groups og0 .. og0 + nog - 1 of 4 (4 channels each): a thread
   4 outputs of a row for a group, the partial sums PT[og] (their sum, G1, is the caller's). */
static __device__ void mnistcu__ln_conv2_dx(float *sm, int og0, int nog)
{
    enum { KS = MNISTCU__LN_K, C1 = MNISTCU__LN_C1, Q1 = MNISTCU__LN_Q1, QQ = MNISTCU__LN_Q1 * MNISTCU__LN_Q1 };
    const float *W2s = sm + MNISTCU__LS_W2, *DA = sm + MNISTCU__LS_DA;
    float *PT = sm + MNISTCU__LS_PT;
    const int tid = (int)threadIdx.x;
    if (tid < nog * 216) {
        int og = og0 + tid / 216, tile = tid % 216, ic = tile / 36, rem = tile - ic * 36, y = rem / 3, oi, ky, kx, i;
        int x0 = 4 * (rem - y * 3);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float *dst = PT + og * (C1 * QQ) + ic * QQ + y * Q1 + x0;
        for (oi = 0; oi < 4; ++oi) {
            int oc = 4 * og + oi;
            const float *wc = W2s + oc * 150 + ic * 25;
#pragma unroll
            for (ky = 0; ky < KS; ++ky) {
                const float4 *row =
                    (const float4 *)(DA + oc * MNISTCU__LN_DAOC + (y + 4 - ky) * MNISTCU__LN_DAROW + x0);
                float4 u0 = row[0], u1 = row[1];
                float vals[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
                for (kx = 0; kx < KS; ++kx) {
                    float wv = wc[ky * KS + kx];
#pragma unroll
                    for (i = 0; i < 4; ++i) acc[i] = fmaf(vals[i + 4 - kx], wv, acc[i]);
                }
            }
        }
#pragma unroll
        for (i = 0; i < 4; ++i) dst[i] = acc[i];
    }
}

/* A pair's handovers (sm_90), each by bulk copies of the tensor memory accelerator from this block's
   shared memory into the same places in the other block's, completing on the other's mbarrier (no
   fence at the cluster's scope, whose release would wait for the block's global writes). Once conv2's
   pooled gradient is made, the sample's block sends conv1's pooled maps, that gradient and the pool's
   argmax and its offsets (SEND bytes); the helper sends back its half of conv2's input gradient's
   partial sums (BACK bytes). Neither block rewrites what it sent before the step's grid barrier A, and
   the other waits for the copies before it reaches that barrier. */
enum { MNISTCU__LN_SEND = (6 * MNISTCU__LN_PS + 2 * 256 + 64) * 4,
       MNISTCU__LN_BACK = 2 * MNISTCU__LN_C1 * MNISTCU__LN_Q1 * MNISTCU__LN_Q1 * 4 };
static __device__ void mnistcu__ln_bulk_to(float *sm, unsigned rank, int n, const int *off, const int *len)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned rmb, src, dst;
    int i;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* the block's writes, to the copies */
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(rmb)
                 : "r"((unsigned)__cvta_generic_to_shared(sm + MNISTCU__LS_MB)), "r"(rank));
    for (i = 0; i < n; ++i) {
        src = (unsigned)__cvta_generic_to_shared(sm + off[i]);
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(dst) : "r"(src), "r"(rank));
        asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         dst),
                     "r"(src), "r"(len[i]), "r"(rmb)
                     : "memory");
    }
#else
    (void)sm;
    (void)rank;
    (void)n;
    (void)off;
    (void)len;
#endif
}
/* This block's mbarrier's arrival for a phase that also waits for bytes copies will bring (sm_90). */
static __device__ __forceinline__ void mnistcu__ln_expect(unsigned mbar, unsigned bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar), "r"(bytes) : "memory");
#else
    (void)mbar;
    (void)bytes;
#endif
}
static __device__ void mnistcu__ln_pair_send(float *sm)
{
    const int off[4] = {MNISTCU__LS_P1X, MNISTCU__LS_G2, MNISTCU__LS_OF2, MNISTCU__LS_AM2};
    const int len[4] = {6 * MNISTCU__LN_PS * 4, 256 * 4, 256 * 4, 256};
    mnistcu__ln_bulk_to(sm, 1, 4, off, len);
}

/* The cluster barrier of a pair (sm_90): after the mbarriers' initialisation, and before either block
   leaves (its shared memory must outlive the other's copies). */
static __device__ __forceinline__ void mnistcu__ln_pair_sync(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

/* The helper of a pair, for sample b: conv2's weights into its shared memory; it waits for its sample
   block's handover on its own mbarrier, routes conv2's pooled gradient itself, makes output channel
   groups 2 and 3 of conv2's input gradient and sends their partial sums back (the sample's block makes
   groups 0 and 1 meanwhile), then the sample's share of conv2's weight gradient. */
static __device__ void mnistcu__ln_helper(const float *w, float *sm, float *rows, int b, unsigned mbar, unsigned *mph)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int tid = (int)threadIdx.x;
    int j;
    for (j = tid; j < 2400 / 4; j += MNISTCU__LN_T)
        mnistcu__ln_copy(sm + MNISTCU__LS_W2 + 4 * j, w + MNISTCU__LN_W2 + 4 * j, 16);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    if (tid == 0) mnistcu__ln_expect(mbar, MNISTCU__LN_SEND);
    mnistcu__ln_dense_end(mbar, mph); /* every thread waits for the phase */
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    mnistcu__ln_route(sm);
    __syncthreads();
    mnistcu__ln_conv2_dx(sm, 2, 2);
    __syncthreads();
    if (tid == 0) {
        const int off[1] = {MNISTCU__LS_PT + 2 * MNISTCU__LN_C1 * MNISTCU__LN_Q1 * MNISTCU__LN_Q1};
        const int len[1] = {MNISTCU__LN_BACK};
        mnistcu__ln_bulk_to(sm, 0, 1, off, len);
    }
    mnistcu__ln_conv2_share(sm, rows, b);
#else
    (void)w;
    (void)sm;
    (void)rows;
    (void)b;
    (void)mbar;
    (void)mph;
#endif
}

/* Phase A for sample b of the batch, in block-shared memory sm; first: the block's first sample of
   the step, more: a step follows in this launch. The block's first sample of each step after the
   launch's first comes early: fetched during the last (NI[3] says so, its bytes in NX, its label in
   NI[1]); the copies are in flight through phase A and B (phase B waits for them). The flag lives in
   shared memory, not in a register kept through the step. */
static __device__ void mnistcu__ln_sample(const mnistcu__lenet_args *a, float *sm, int b, int bsz, size_t s0,
                                          unsigned mbar, unsigned *mph, int first, int more, int unit)
{
    enum { IH = MNISTCU__LN_IH, KS = MNISTCU__LN_K, C1 = MNISTCU__LN_C1, Q1 = MNISTCU__LN_Q1, C2 = MNISTCU__LN_C2,
           O2 = MNISTCU__LN_O2, D0 = MNISTCU__LN_D0, D1 = MNISTCU__LN_D1, D2 = MNISTCU__LN_D2, D3 = MNISTCU__LN_D3,
           NT = MNISTCU__LN_T, QQ = MNISTCU__LN_Q1 * MNISTCU__LN_Q1 };
    const int tid = (int)threadIdx.x, lane = tid & 31;
    const float *w = a->params;
    float *F1s = sm + MNISTCU__LS_F1, *F2s = sm + MNISTCU__LS_F2, *W2s = sm + MNISTCU__LS_W2;
    float *W3s = sm + MNISTCU__LS_W3, *W1s = sm + MNISTCU__LS_W1, *X = sm + MNISTCU__LS_X, *P1 = sm + MNISTCU__LS_P1X;
    float *P2 = sm + MNISTCU__LS_P2, *H1 = sm + MNISTCU__LS_H1, *H2 = sm + MNISTCU__LS_H2, *Z = sm + MNISTCU__LS_Z;
    float *DZ = sm + MNISTCU__LS_DZ, *DH2 = sm + MNISTCU__LS_DH2, *DH1 = sm + MNISTCU__LS_DH1;
    const int PS = MNISTCU__LN_PS;
    float *G2 = sm + MNISTCU__LS_G2, *G1 = sm + MNISTCU__LS_G1, *PART = sm + MNISTCU__LS_PART;
    float *PT = sm + MNISTCU__LS_PT, *rows = a->rows;
    int *OF1 = (int *)(sm + MNISTCU__LS_OF1), *OF2 = (int *)(sm + MNISTCU__LS_OF2);
    uint8_t *AM2 = (uint8_t *)(sm + MNISTCU__LS_AM2);
    int *NI = (int *)(sm + MNISTCU__LS_NI);
    const float *NX = sm + MNISTCU__LS_NX;
    const int pre = first && NI[3], fetch = first && more && a->fetch && s0 + (size_t)a->B + (size_t)unit < a->n;
    const uint32_t src = pre ? 0u : a->idx[s0 + (size_t)b];
    int j;

    /* the convolutions' and dense10's weights and the sample first (asynchronous copies where there
       are); the dense layers' 163 KB after the block barrier below, so that none of the block's small
       copies queues behind them */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    for (j = tid; j < MNISTCU__LN_P1 / 4 + MNISTCU__LN_P2 / 4 + (D3 * D2 + 8) / 4 + 2; j += NT) {
        float *d;
        const float *g;
        int bytes = 16;
        if (j < MNISTCU__LN_P1 / 4) { d = W1s + 4 * j; g = w + MNISTCU__LN_W1 + 4 * j; }
        else if (j < (MNISTCU__LN_P1 + MNISTCU__LN_P2) / 4) {
            int k = j - MNISTCU__LN_P1 / 4;
            d = W2s + 4 * k; g = w + MNISTCU__LN_W2 + 4 * k;
        } else if (j < (MNISTCU__LN_P1 + MNISTCU__LN_P2 + D3 * D2 + 8) / 4) {
            int k = j - (MNISTCU__LN_P1 + MNISTCU__LN_P2) / 4;
            d = W3s + 4 * k; g = w + MNISTCU__LN_F3 + 4 * k;
        } else { /* dense10's last 2 biases, 4 bytes each */
            int k = D3 * D2 + 8 + j - (MNISTCU__LN_P1 + MNISTCU__LN_P2 + D3 * D2 + 8) / 4;
            d = W3s + k; g = w + MNISTCU__LN_F3 + k; bytes = 4;
        }
        if (bytes == 16)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(d)), "l"(g)
                         : "memory");
        else
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((unsigned)__cvta_generic_to_shared(d)), "l"(g)
                         : "memory");
    }
    if (fetch && tid == 0) mnistcu__ln_copy(NI, a->idx + s0 + (size_t)a->B + (size_t)unit, 4);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    for (j = tid; j < MNISTCU__LN_P1; j += NT) W1s[j] = w[MNISTCU__LN_W1 + j];
    for (j = tid; j < MNISTCU__LN_P2; j += NT) W2s[j] = w[MNISTCU__LN_W2 + j];
    for (j = tid; j < D3 * D2 + D3; j += NT) W3s[j] = w[MNISTCU__LN_F3 + j];
    if (fetch && tid == 0) NI[0] = (int)a->idx[s0 + (size_t)a->B + (size_t)unit];
#endif
    for (j = tid; j < IH * IH; j += NT) {
        float raw = pre ? (a->u8 ? (float)((const uint8_t *)NX)[j] : NX[j])
                        : a->u8 ? (float)a->u8[(size_t)src * (IH * IH) + j] : a->f32[(size_t)src * (IH * IH) + j];
        X[j] = fmaf(raw, a->scale, a->shift); /* as the gather's one rounding */
    }
    if (tid == 0) NI[2] = pre ? NI[1] : a->labels[src];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
    __syncthreads();
    mnistcu__ln_dense_begin(sm, w, mbar, b);
    if (first && tid == 0) NI[3] = fetch; /* read by the next step's first sample only: block barriers between */
    if (fetch) { /* the next sample's bytes (49 or 196 copies of 16) and label, waited for in phase B */
        const uint32_t ns = (uint32_t)NI[0];
        if (tid < (a->u8 ? 49 : 196))
            mnistcu__ln_copy((float *)NX + 4 * tid,
                             a->u8 ? (const void *)(a->u8 + (size_t)ns * (IH * IH) + 16 * tid)
                                   : (const void *)(a->f32 + (size_t)ns * (IH * IH) + 4 * tid),
                             16);
        if (tid == 0) mnistcu__ln_copy(NI + 1, a->labels + ns, 4);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
    }
    MNISTCU__LPROF(0);
    /* conv1 + relu + pool: a thread a window's 4 outputs */
    if (tid < C1 * QQ) {
        int c = tid / QQ, pw = tid - c * QQ, py = pw / Q1, px = pw - py * Q1, ky, kx, am;
        const float *xp = X + 2 * py * IH + 2 * px, *wc = W1s + c * 25;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f, bb = W1s[150 + c];
#pragma unroll
        for (ky = 0; ky < KS; ++ky)
#pragma unroll
            for (kx = 0; kx < KS; ++kx) {
                float wv = wc[ky * KS + kx];
                const float *r = xp + ky * IH + kx;
                a0 = fmaf(r[0], wv, a0);
                a1 = fmaf(r[1], wv, a1);
                a2 = fmaf(r[IH], wv, a2);
                a3 = fmaf(r[IH + 1], wv, a3);
            }
        P1[c * PS + pw] = mnistcu__ln_max4(mnistcu__ln_relu(a0 + bb), mnistcu__ln_relu(a1 + bb), mnistcu__ln_relu(a2 + bb),
                                   mnistcu__ln_relu(a3 + bb), &am);
        OF1[tid] = (2 * py + (am >> 1)) * IH + 2 * px + (am & 1); /* the argmax's place in X */
    }
    __syncthreads();
    MNISTCU__LPROF(1);
    /* conv2 + relu + pool: 4 lanes a window, 8 apart (3 of them two input channels each), a thread the
       window's 4 outputs, then the sum over the lanes */
    {
        int win = (tid >> 5) * 8 + (lane & 7), g = lane >> 3, oc = win >> 4, pw = win & 15, py = pw >> 2, px = pw & 3;
        int ii, ky, kx, t;
        float c00 = 0.0f, c01 = 0.0f, c10 = 0.0f, c11 = 0.0f;
        if (g < 3) {
#pragma unroll
            for (ii = 0; ii < 2; ++ii) {
                int ic = 2 * g + ii;
                const float *pr = P1 + ic * PS + 2 * py * Q1 + 2 * px, *wc = W2s + oc * 150 + ic * 25;
                float r0[6], r1[6];
#pragma unroll
                for (t = 0; t < 3; ++t) {
                    float2 v = *(const float2 *)(pr + 2 * t);
                    r1[2 * t] = v.x;
                    r1[2 * t + 1] = v.y;
                }
#pragma unroll
                for (ky = 0; ky < KS; ++ky) {
#pragma unroll
                    for (t = 0; t < 6; ++t) r0[t] = r1[t];
#pragma unroll
                    for (t = 0; t < 3; ++t) {
                        float2 v = *(const float2 *)(pr + (ky + 1) * Q1 + 2 * t);
                        r1[2 * t] = v.x;
                        r1[2 * t + 1] = v.y;
                    }
#pragma unroll
                    for (kx = 0; kx < KS; ++kx) {
                        float wv = wc[ky * KS + kx];
                        c00 = fmaf(r0[kx], wv, c00);
                        c01 = fmaf(r0[kx + 1], wv, c01);
                        c10 = fmaf(r1[kx], wv, c10);
                        c11 = fmaf(r1[kx + 1], wv, c11);
                    }
                }
            }
        }
        for (t = 8; t < 32; t <<= 1) {
            c00 = c00 + __shfl_xor_sync(0xffffffffu, c00, t);
            c01 = c01 + __shfl_xor_sync(0xffffffffu, c01, t);
            c10 = c10 + __shfl_xor_sync(0xffffffffu, c10, t);
            c11 = c11 + __shfl_xor_sync(0xffffffffu, c11, t);
        }
        if (g == 0) {
            int am;
            float bb = W2s[2400 + oc];
            float m = mnistcu__ln_max4(mnistcu__ln_relu(c00 + bb), mnistcu__ln_relu(c01 + bb), mnistcu__ln_relu(c10 + bb),
                                       mnistcu__ln_relu(c11 + bb), &am);
            P2[win] = m;
            AM2[win] = (uint8_t)am;
            OF2[win] = (2 * py + (am >> 1)) * Q1 + 2 * px + (am & 1); /* the argmax's place in a P1 plane */
            rows[MNISTCU__LR_P2 + b * D0 + win] = m;
        }
    }
    mnistcu__ln_dense_end(mbar, mph);
    __syncthreads();
    MNISTCU__LPROF(2);
    /* dense120 + relu: 8 lanes an output, lane r the float4s r, r+8, ... of k */
    mnistcu__ln_dense_relu<D1, D0>(F1s, P2, w + MNISTCU__LN_G1, H1, rows + MNISTCU__LR_H1 + b * D1);
    __syncthreads();
    MNISTCU__LPROF(3);
    /* dense84 + relu */
    mnistcu__ln_dense_relu<D2, D1>(F2s, H1, w + MNISTCU__LN_G2, H2, rows + MNISTCU__LR_H2 + b * D2);
    __syncthreads();
    MNISTCU__LPROF(4);
    /* dense10: a warp an output */
    if (tid < D3 * 32) {
        int c = tid >> 5, k;
        float acc = 0.0f;
        for (k = lane; k < D2; k += 32) acc = fmaf(H2[k], W3s[c * D2 + k], acc);
        acc = mnistcu__ln_sum(acc, 32);
        if (lane == 0) Z[c] = acc + W3s[D3 * D2 + c];
    }
    __syncthreads();
    MNISTCU__LPROF(5);
    /* the loss row, its gradient and the prediction, as the loss kernel makes them */
    if (tid == 0) {
        int32_t y = NI[2], pred;
        float loss;
        mnistcu__loss_row(&a->lp, Z, y, NULL, (size_t)D3, a->lp.sum ? 1.0f : 1.0f / (float)bsz, DZ, &loss, &pred);
        rows[MNISTCU__LR_LOSS + b] = loss;
        rows[MNISTCU__LR_OK + b] = pred == y ? 1.0f : 0.0f;
    }
    __syncthreads();
    MNISTCU__LPROF(6);
    if (tid < D3) rows[MNISTCU__LR_DZ + b * D3 + tid] = DZ[tid];
    /* dh2 */
    if (tid < D2) {
        int c;
        float acc = 0.0f;
        for (c = 0; c < D3; ++c) acc = fmaf(DZ[c], W3s[c * D2 + tid], acc);
        acc = H2[tid] > 0.0f ? acc : 0.0f;
        DH2[tid] = acc;
        rows[MNISTCU__LR_DH2 + b * D2 + tid] = acc;
    }
    __syncthreads();
    MNISTCU__LPROF(7);
    /* dh1: 8 lanes an output */
    if (tid < D1 * 8) {
        int jo = tid >> 3, r = tid & 7, i;
        float acc = 0.0f;
        for (i = r; i < D2; i += 8) acc = fmaf(DH2[i], F2s[i * D1 + jo], acc);
        acc = mnistcu__ln_sum(acc, 8);
        if (r == 0) {
            acc = H1[jo] > 0.0f ? acc : 0.0f;
            DH1[jo] = acc;
            rows[MNISTCU__LR_DH1 + b * D1 + jo] = acc;
        }
    }
    __syncthreads();
    MNISTCU__LPROF(8);
    /* the gradient of conv2's pooled output: four quarters of the sum over dense120's outputs */
    {
        int r = tid >> 8, k = tid & 255, t;
        float acc = 0.0f;
#pragma unroll 6
        for (t = 0; t < D1 / 4; ++t) acc = fmaf(DH1[r * 30 + t], F1s[(r * 30 + t) * D0 + k], acc);
        PART[r * D0 + k] = acc;
    }
    __syncthreads();
    MNISTCU__LPROF(9);
    if (tid < D0) {
        float s = (PART[tid] + PART[D0 + tid]) + (PART[2 * D0 + tid] + PART[3 * D0 + tid]);
        G2[tid] = P2[tid] > 0.0f ? s : 0.0f; /* the relu' */
    }
    __syncthreads();
    if (a->pair && tid == 0) mnistcu__ln_pair_send(sm); /* to the helper */
    MNISTCU__LPROF(10);
    mnistcu__ln_route(sm); /* conv2's pooled gradient through the pool's argmax into conv2's output map */
    __syncthreads();
    MNISTCU__LPROF(11);
    if (a->pair) { /* half of conv2's input gradient here, half in the helper, whose partial sums arrive on
                      this block's mbarrier */
        if (tid == 0) mnistcu__ln_expect(mbar, MNISTCU__LN_BACK);
        mnistcu__ln_conv2_dx(sm, 0, 2);
        mnistcu__ln_dense_end(mbar, mph);
    } else {
        mnistcu__ln_conv2_dx(sm, 0, 4);
    }
    __syncthreads();
    MNISTCU__LPROF(12);
    /* their sum, with conv1's relu' (G1) */
    if (tid < C1 * QQ) {
        float s = (PT[tid] + PT[C1 * QQ + tid]) + (PT[2 * C1 * QQ + tid] + PT[3 * C1 * QQ + tid]);
        G1[tid] = P1[tid / QQ * PS + tid % QQ] > 0.0f ? s : 0.0f;
    }
    if (!a->pair) mnistcu__ln_conv2_share(sm, rows, b); /* else the helper's */
    __syncthreads();
    MNISTCU__LPROF(13);
    /* this sample's share of conv1's weight gradient: 8 lanes a kernel row (5 weights), each 18 windows;
       whole warps, as the sums are over lanes */
    if (tid < 36 * 8) {
        int p = tid >> 3, r = tid & 7, t, kx;
        float acc[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (p < 30) {
            int c = p / 5, ky = p - c * 5;
            for (t = 0; t < 18; ++t) {
                int wi = c * QQ + r + 8 * t;
                float gv = G1[wi];
                const float *pp = X + OF1[wi] + ky * IH;
#pragma unroll
                for (kx = 0; kx < KS; ++kx) acc[kx] = fmaf(gv, pp[kx], acc[kx]);
            }
        } else {
            for (t = 0; t < 18; ++t) acc[0] += G1[(p - 30) * QQ + r + 8 * t];
        }
#pragma unroll
        for (kx = 0; kx < KS; ++kx) acc[kx] = mnistcu__ln_sum(acc[kx], 8);
        if (r == 0) {
            float *dst = rows + MNISTCU__LR_PART1 + b * MNISTCU__LN_P1;
            if (p < 30) {
#pragma unroll
                for (kx = 0; kx < KS; ++kx) dst[p * KS + kx] = acc[kx];
            } else {
                dst[150 + p - 30] = acc[0];
            }
        }
    }
}

/* Phase B's tasks: each a block's share of the gradients' sums over the batch. A task stages what it
   needs of the rows a sample into shared memory in one round of loads, then sums from there; so each
   row reaches a multiprocessor once, not once a parameter. Two kinds:
     a weight tile: outputs o0 .. o0+O-1 of a dense layer and inputs i0 .. i0+I-1, each gradient the
       output gradient's column times the input's row over the batch (the rows' fields xf and yf);
     a row sum: entries i0 .. i0+I-1 of field yf over the batch (the biases, the convolutions' shares).
   In order: F1 in 60 tiles of 8 x 64, F2 in 21 of 12 x 40, dense10 in one, conv2's shares in 38 sums
   of 64 (the last 48), conv1's in 2 (80 and 76), the three dense biases: 125 tasks, at most one a
   block on an H100's 132 multiprocessors. The weight tiles are summed in register tiles (8 lanes a
   2 x 4 block of weights, each lane a float4 of inputs and a float2 of output gradients a sample: 8
   fmas for 2 loads), the row sums 8 lanes a parameter. */
enum { MNISTCU__LT_F1 = 60, MNISTCU__LT_F2 = MNISTCU__LT_F1 + 21, MNISTCU__LT_F3 = MNISTCU__LT_F2 + 1,
       MNISTCU__LT_C2 = MNISTCU__LT_F3 + 38, MNISTCU__LT_C1 = MNISTCU__LT_C2 + 2, MNISTCU__LT_END = MNISTCU__LT_C1 + 3 };
typedef struct mnistcu__ln_task {
    int p0;      /* the parameter of (o0, i0), or of entry i0 */
    int ld;      /* a weight tile: the weight's row length (its input field's too) */
    int xf, xs;  /* a weight tile: the output gradient's field and row length; xf < 0: a row sum */
    int yf, ys;  /* the input's field (or the summed one) and its row length */
    int o0, O, i0, I;
    int quad;    /* a weight tile, summed in 2 x 4 register tiles */
    int v4, xv4; /* the summed (or input) rows, the output gradient's, staged in 16-byte copies (their
                    column counts, offsets and strides multiples of 4), else in 4-byte ones */
    int L;       /* lanes a parameter (quad: a 2 x 4 tile), a power of 2 */
    int S;       /* the staged rows' stride: I rounded up to 32, plus 32 / L (the lanes' rows in distinct banks) */
} mnistcu__ln_task;
typedef char mnistcu__ln_task_fits[sizeof(mnistcu__ln_task) <= 16 * sizeof(float) ? 1 : -1]; /* LS_TASK */

static __device__ mnistcu__ln_task mnistcu__ln_task_of(int k)
{
    enum { D0 = MNISTCU__LN_D0, D1 = MNISTCU__LN_D1, D2 = MNISTCU__LN_D2, D3 = MNISTCU__LN_D3 };
    mnistcu__ln_task t;
    t.xf = -1;
    t.xs = 0;
    t.o0 = 0;
    t.O = 1;
    t.quad = 0;
    t.v4 = 1;
    t.xv4 = 1;
    t.L = 8;
    if (k < MNISTCU__LT_F1) {
        t.O = 8; t.o0 = 8 * (k >> 2); t.I = 64; t.i0 = 64 * (k & 3); t.quad = 1;
        t.p0 = MNISTCU__LN_F1; t.ld = D0; t.xf = MNISTCU__LR_DH1; t.xs = D1; t.yf = MNISTCU__LR_P2; t.ys = D0;
    } else if (k < MNISTCU__LT_F2) {
        k -= MNISTCU__LT_F1;
        t.O = 12; t.o0 = 12 * (k / 3); t.I = 40; t.i0 = 40 * (k % 3); t.quad = 1;
        t.p0 = MNISTCU__LN_F2; t.ld = D1; t.xf = MNISTCU__LR_DH2; t.xs = D2; t.yf = MNISTCU__LR_H1; t.ys = D1;
    } else if (k < MNISTCU__LT_F3) { /* dense10's output gradient rows of 10: 4-byte copies */
        t.O = D3; t.I = D2; t.i0 = 0; t.quad = 1; t.xv4 = 0;
        t.p0 = MNISTCU__LN_F3; t.ld = D2; t.xf = MNISTCU__LR_DZ; t.xs = D3; t.yf = MNISTCU__LR_H2; t.ys = D2;
    } else if (k < MNISTCU__LT_C2) {
        k -= MNISTCU__LT_F3;
        t.i0 = 64 * k; t.I = MNISTCU__MIN(64, MNISTCU__LN_P2 - t.i0);
        t.p0 = MNISTCU__LN_W2; t.yf = MNISTCU__LR_PART2; t.ys = MNISTCU__LN_P2;
    } else if (k < MNISTCU__LT_C1) {
        k -= MNISTCU__LT_C2;
        t.i0 = 80 * k; t.I = k ? MNISTCU__LN_P1 - 80 : 80;
        t.p0 = MNISTCU__LN_W1; t.yf = MNISTCU__LR_PART1; t.ys = MNISTCU__LN_P1;
    } else {
        k -= MNISTCU__LT_C1;
        t.i0 = 0;
        t.I = k == 0 ? D1 : k == 1 ? D2 : D3;
        t.v4 = k < 2;
        t.p0 = k == 0 ? MNISTCU__LN_G1 : k == 1 ? MNISTCU__LN_G2 : MNISTCU__LN_G3;
        t.yf = k == 0 ? MNISTCU__LR_DH1 : k == 1 ? MNISTCU__LR_DH2 : MNISTCU__LR_DZ;
        t.ys = t.I;
    }
    t.S = (t.I + 31) / 32 * 32 + 32 / t.L;
    t.p0 += t.xf >= 0 ? t.o0 * t.ld + t.i0 : t.i0;
    return t;
}

/* The task's rows of the batch into shared memory: the input's (or summed) columns at Ys [b][S], a
   weight tile's output gradient columns at Xs [b][O]; asynchronous copies of 16 bytes (v4) or 4 where
   there are (no registers held, all in flight at once: one round of loads), the caller's block
   barrier after. */
static __device__ void mnistcu__ln_stage(const float *rows, const mnistcu__ln_task *t, int bsz, float *Ys, float *Xs)
{
    const int w = t->v4 ? 4 : 1, wx = t->xv4 ? 4 : 1, I = t->I / w, O = t->xf >= 0 ? t->O / wx : 0;
    const int ny = bsz * I, n = ny + bsz * O;
    int e;
    for (e = (int)threadIdx.x; e < n; e += MNISTCU__LN_T) {
        const float *src;
        float *dst;
        if (e < ny) {
            const int b = e / I, c = e - b * I;
            src = rows + t->yf + b * t->ys + t->i0 + w * c;
            dst = Ys + b * t->S + w * c;
            mnistcu__ln_copy(dst, src, 4 * w);
        } else {
            const int f = e - ny, b = f / O, c = f - b * O;
            src = rows + t->xf + b * t->xs + t->o0 + wx * c;
            dst = Xs + wx * f;
            mnistcu__ln_copy(dst, src, 4 * wx);
        }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/* A task's sums over the batch (from the staging) and each parameter's optimizer step. */
static __device__ void mnistcu__ln_task_run(const mnistcu__lenet_args *a, const mnistcu__ln_task *tk, int bsz,
                                           const mnistcu__opt *os, float *Ys, float *Xs)
{
    const int tid = (int)threadIdx.x, e = tid / tk->L, l = tid & (tk->L - 1);
    int oi = 0, ii = e, p = -1, s, b;
    float g = 0.0f, wl = 0.0f, st[3] = {0.0f, 0.0f, 0.0f};
    if (tk->quad) { /* tile e: outputs 2 oi, 2 oi + 1 and inputs 4 ii .. 4 ii + 3; lane l's parameter, (l >> 2, l & 3) */
        oi = e / (tk->I / 4);
        ii = e - oi * (tk->I / 4);
        if (e < tk->O * tk->I / 8) p = tk->p0 + (2 * oi + (l >> 2)) * tk->ld + 4 * ii + (l & 3);
    } else if (tk->xf >= 0) {
        oi = e / tk->I;
        ii = e - oi * tk->I;
        if (l == 0 && e < tk->O * tk->I) p = tk->p0 + oi * tk->ld + ii;
    } else if (l == 0 && e < tk->I) {
        p = tk->p0 + ii;
    }
    if (p >= 0) { /* the parameter and its state, in flight with the rows' loads */
        wl = a->params[p];
        for (s = 0; s < a->slots; ++s) st[s] = a->state[(size_t)s * MNISTCU__LN_NP + (size_t)p];
    }
    mnistcu__ln_stage(a->rows, tk, bsz, Ys, Xs);
    __syncthreads();
    MNISTCU__LPROF(19);
    if (tk->quad && (tid & ~31) < tk->O * tk->I) { /* the warps with tiles (8 lanes a tile of 8) */
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        int u;
        if (e < tk->O * tk->I / 8) {
            const float *y = Ys + 4 * ii, *x = Xs + 2 * oi;
#pragma unroll 2
            for (b = l; b < bsz; b += 8) {
                const float4 yv = *(const float4 *)(y + b * tk->S);
                const float2 xv = *(const float2 *)(x + b * tk->O);
                acc[0] = fmaf(xv.x, yv.x, acc[0]);
                acc[1] = fmaf(xv.x, yv.y, acc[1]);
                acc[2] = fmaf(xv.x, yv.z, acc[2]);
                acc[3] = fmaf(xv.x, yv.w, acc[3]);
                acc[4] = fmaf(xv.y, yv.x, acc[4]);
                acc[5] = fmaf(xv.y, yv.y, acc[5]);
                acc[6] = fmaf(xv.y, yv.z, acc[6]);
                acc[7] = fmaf(xv.y, yv.w, acc[7]);
            }
        }
        /* the sums over the 8 lanes, each lane keeping half of what is left at each of 3 levels: lane l
           ends with tile entry l's (7 shuffles, not 24) */
#pragma unroll
        for (u = 0; u < 4; ++u) {
            const float keep = (l & 4) ? acc[u + 4] : acc[u], give = (l & 4) ? acc[u] : acc[u + 4];
            acc[u] = keep + __shfl_xor_sync(0xffffffffu, give, 4);
        }
#pragma unroll
        for (u = 0; u < 2; ++u) {
            const float keep = (l & 2) ? acc[u + 2] : acc[u], give = (l & 2) ? acc[u] : acc[u + 2];
            acc[u] = keep + __shfl_xor_sync(0xffffffffu, give, 2);
        }
        {
            const float keep = (l & 1) ? acc[1] : acc[0], give = (l & 1) ? acc[0] : acc[1];
            g = keep + __shfl_xor_sync(0xffffffffu, give, 1);
        }
    } else if (!tk->quad) {
        if (e < tk->O * tk->I) {
            const float *y = Ys + ii;
            if (tk->xf >= 0) {
                const float *x = Xs + oi;
#pragma unroll 4
                for (b = l; b < bsz; b += tk->L) g = fmaf(x[b * tk->O], y[b * tk->S], g);
            } else {
#pragma unroll 4
                for (b = l; b < bsz; b += tk->L) g += y[b * tk->S];
            }
        }
        g = mnistcu__ln_sum(g, tk->L);
    }
    MNISTCU__LPROF(20);
    if (p >= 0) { /* the step on the copies, then stored */
        mnistcu__opt_one(os, 0, &wl, g, st);
        a->grads[p] = g;
        a->params[p] = wl;
        for (s = 0; s < a->slots; ++s) a->state[(size_t)s * MNISTCU__LN_NP + (size_t)p] = st[s];
    }
    MNISTCU__LPROF(21);
}

__global__ void __launch_bounds__(MNISTCU__LN_T, 1) mnistcu__k_fused_lenet(mnistcu__lenet_args a)
{
    MNISTCU__PDL_WAIT(); /* launched cooperatively, never as a dependent: a no-op kept for the rule */
    extern __shared__ float mnistcu__ln_sm[];
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    float *sm = mnistcu__ln_sm;
    const int tid = (int)threadIdx.x;
    const unsigned mbar = (unsigned)__cvta_generic_to_shared(sm + MNISTCU__LS_MB);
    unsigned mph = 0;
    int q;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(mbar) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); /* for the other block's copies */
    }
#elif defined(__CUDA_ARCH__)
    a.pair = 0; /* code built for an older GPU has no bulk copies: a block a sample (the plan checks too) */
#endif
    if (tid == 0) ((int *)(sm + MNISTCU__LS_NI))[3] = 0; /* the launch's first samples come by their own loads */
    __syncthreads();
    if (a.pair) mnistcu__ln_pair_sync(); /* the helper's mbarrier is ready before any copy reaches it */
    MNISTCU__LPROF(18);
    for (q = 0; q < a.nsteps; ++q) {
        const size_t step = a.step0 + (size_t)q, s0 = step * (size_t)a.B;
        const int bsz = (int)MNISTCU__MIN((size_t)a.B, a.n - s0);
        mnistcu__opt *os = (mnistcu__opt *)(sm + MNISTCU__LS_OPT);
        int b, k;
        if (tid == 0) { /* the step's optimizer scalars, for one parameter at a time (its slots 1 apart);
                           the grid barrier below publishes them to the block */
            *os = a.opt[q < a.nops ? q : a.nops - 1];
            os->n = 1;
        }
        {   /* a unit a sample: a block, or a pair of them (the sample's block and its helper) */
            const int unit = a.pair ? (int)(blockIdx.x >> 1) : (int)blockIdx.x;
            const int units = a.pair ? (int)(gridDim.x >> 1) : (int)gridDim.x;
            for (b = unit; b < bsz; b += units) {
                __syncthreads(); /* the block's shared memory is free again */
                if (a.pair && (blockIdx.x & 1)) mnistcu__ln_helper(a.params, sm, a.rows, b, mbar, &mph);
                else mnistcu__ln_sample(&a, sm, b, bsz, s0, mbar, &mph, b == unit, q + 1 < a.nsteps, unit);
            }
        }
        MNISTCU__LPROF(14);
        grid.sync();
        MNISTCU__LPROF(15);
        /* the tasks, a block each (then again from the grid's size on a GPU of fewer multiprocessors) */
        for (k = (int)blockIdx.x; k < MNISTCU__LT_END; k += (int)gridDim.x) {
            mnistcu__ln_task *tk = (mnistcu__ln_task *)(sm + MNISTCU__LS_TASK); /* read from shared memory
                                                                                    when needed, not kept */
            float *Ys = sm + MNISTCU__LS_F1; /* F1's place: free until the next step */
            __syncthreads(); /* the last task's reads of the staging and of tk are done */
            if (tid == 0) *tk = mnistcu__ln_task_of(k);
            __syncthreads();
            mnistcu__ln_task_run(&a, tk, bsz, os, Ys, Ys + 64 * tk->S);
        }
        if (blockIdx.x == gridDim.x - 1 && tid >= MNISTCU__LN_T - 32) { /* the step's statistics, by the last warp (with a task only on a GPU of fewer
                                than 127 multiprocessors, and then after it): each lane the samples
                                lane, lane + 32, then a fixed tree */
            double l = 0.0, c = 0.0;
            int lane = tid & 31, off;
            for (b = lane; b < bsz; b += 32) {
                l += (double)a.rows[MNISTCU__LR_LOSS + b];
                c += (double)a.rows[MNISTCU__LR_OK + b];
            }
            for (off = 16; off; off >>= 1) {
                l += __shfl_down_sync(0xffffffffu, l, off);
                c += __shfl_down_sync(0xffffffffu, c, off);
            }
            if (lane == 0) {
                a.stats[step] = l;
                a.stats[a.stats_cap + step] = c;
            }
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm volatile("cp.async.wait_all;\n" ::: "memory"); /* the next sample's copies: the barrier publishes them */
#endif
        MNISTCU__LPROF(16);
        grid.sync();
        MNISTCU__LPROF(17);
    }
    if (a.pair) mnistcu__ln_pair_sync(); /* neither block of a pair leaves while the other may copy */
}

#if CUDART_VERSION >= 12000
/* The fused LeNet-5 kernel's launch in clusters of 2 blocks (a pair a sample), cooperative or not
   (the occupancy query takes it without). at holds 2 attributes. */
static void mnistcu__lenet_pairs(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *at, int cooperative, int grid,
                                 size_t smem, cudaStream_t stream)
{
    memset(at, 0, 2 * sizeof *at);
    cfg->gridDim = dim3((unsigned)grid);
    cfg->blockDim = dim3(MNISTCU__LN_T);
    cfg->dynamicSmemBytes = smem;
    cfg->stream = stream;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 2;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeCooperative;
    at[1].val.cooperative = 1;
    cfg->attrs = at;
    cfg->numAttrs = cooperative ? 2 : 1;
}
#endif

/* Whether model m is LeNet-5's shape for the fused kernel at batch size B (the caller checked the
   device, dataset and optimizer): fills pl and returns 1, or returns 0. */
static int mnistcu__lenet_plan(mnistcu_model *m, size_t B, const mnistcu_optim_desc *o, mnistcu__fused_plan *pl)
{
    static const struct { int kind, oc, oh, ow, relu; size_t wo, bo; } want[7] = {
        {MNISTCU_LAYER_CONV2D, 6, 24, 24, 1, MNISTCU__LN_W1, MNISTCU__LN_B1},
        {MNISTCU_LAYER_MAXPOOL2D, 6, 12, 12, 1, 0, 0},
        {MNISTCU_LAYER_CONV2D, 16, 8, 8, 1, MNISTCU__LN_W2, MNISTCU__LN_B2},
        {MNISTCU_LAYER_MAXPOOL2D, 16, 4, 4, 1, 0, 0},
        {MNISTCU_LAYER_DENSE, 120, 1, 1, 1, MNISTCU__LN_F1, MNISTCU__LN_G1},
        {MNISTCU_LAYER_DENSE, 84, 1, 1, 1, MNISTCU__LN_F2, MNISTCU__LN_G2},
        {MNISTCU_LAYER_DENSE, 10, 1, 1, 0, MNISTCU__LN_F3, MNISTCU__LN_G3}};
    mnistcu__cuda *cu = mnistcu__cu(m->ctx);
    mnistcu_act prev_act = MNISTCU_ACT_IDENTITY;
    int i, k = 0, relu = 0, major = 0, coop = 0, sms = 0, optin = 0, per_sm = 0;
    const size_t bytes = (size_t)MNISTCU__LS_END * sizeof(float);
    if (B > MNISTCU__LN_B || m->inputs != 784 || m->classes != 10 || m->num_params != MNISTCU__LN_NP ||
        m->mode != MNISTCU_MODE_TRAIN || cu->use_cublas || cu->use_cudnn) /* the own kernels' path only */
        return 0;
    if ((uintptr_t)m->params & 15) return 0; /* 16-byte copies of the weights (an allocation hook may not align) */
    if (m->layers[0].c != 1 || m->layers[0].h != 28 || m->layers[0].w != 28) return 0;
    for (i = 0; i < m->num_layers; ++i) {
        const mnistcu__layer *L = &m->layers[i];
        if (L->passthrough) continue;
        if (k == 7 || (int)L->d.kind != want[k].kind || L->oc != want[k].oc || L->oh != want[k].oh ||
            L->ow != want[k].ow)
            return 0;
        if (L->d.kind == MNISTCU_LAYER_CONV2D &&
            (L->d.kernel_h != 5 || L->d.kernel_w != 5 || L->sh != 1 || L->sw != 1 || L->d.padding != 0))
            return 0;
        if (L->d.kind == MNISTCU_LAYER_MAXPOOL2D &&
            (L->d.kernel_h != 2 || L->d.kernel_w != 2 || L->sh != 2 || L->sw != 2))
            return 0;
        if (L->d.kind != MNISTCU_LAYER_MAXPOOL2D && (L->wo != want[k].wo || L->bo != want[k].bo || !L->nb)) return 0;
        /* a relu after each convolution (on it or on its pool) and each hidden dense layer */
        if (L->act == MNISTCU_ACT_RELU) ++relu;
        else if (L->act != MNISTCU_ACT_IDENTITY) return 0;
        if (L->d.kind == MNISTCU_LAYER_DENSE && (L->act == MNISTCU_ACT_RELU) != want[k].relu) return 0;
        if (L->d.kind == MNISTCU_LAYER_MAXPOOL2D && (L->act == MNISTCU_ACT_RELU) == (prev_act == MNISTCU_ACT_RELU))
            return 0; /* exactly one of a convolution and its pool has the relu */
        prev_act = L->act;
        ++k;
    }
    if (k != 7 || relu != 4) return 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cu->device) != cudaSuccess || major < 9 ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, cu->device) != cudaSuccess || !coop ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cu->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cu->device) != cudaSuccess ||
        (size_t)optin < bytes ||
        cudaFuncSetAttribute(mnistcu__k_fused_lenet, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mnistcu__k_fused_lenet, MNISTCU__LN_T, bytes) !=
            cudaSuccess ||
        per_sm < 1) {
        (void)cudaGetLastError();
        return 0;
    }
    pl->slots = mnistcu__opt_slots(o);
    if (pl->slots > 3) return 0;
    pl->lenet = 1;
    pl->grid = sms; /* a block a multiprocessor: samples to the first B, parameters to all */
    pl->smem = bytes;
    pl->pair = 0;
#if CUDART_VERSION >= 12000
    {   /* clusters of 2, a pair a sample, where the kernel's code was built for sm_90 or later (ptxVersion:
           the target it came from; the pair's copies are compiled only there) and as many pairs as samples
           fit at once (then a pair never takes two samples of a step: the helper's copies of one are done
           before the step's barrier) */
        cudaLaunchConfig_t cfg = cudaLaunchConfig_t(); /* zeroed: dim3's constructors forbid memset */
        cudaLaunchAttribute at[2];
        cudaFuncAttributes fa;
        int nc = 0;
        mnistcu__lenet_pairs(&cfg, at, 0, sms & ~1, bytes, cu->stream);
        memset(&fa, 0, sizeof fa);
        if (cudaFuncGetAttributes(&fa, mnistcu__k_fused_lenet) == cudaSuccess && fa.ptxVersion >= 90 &&
            cudaOccupancyMaxActiveClusters(&nc, (const void *)mnistcu__k_fused_lenet, &cfg) == cudaSuccess &&
            (size_t)MNISTCU__MIN(nc, sms / 2) >= B) {
            pl->pair = 1;
            pl->grid = 2 * MNISTCU__MIN(nc, sms / 2);
        }
        (void)cudaGetLastError();
    }
#endif
    pl->ok = 1;
    return 1;
}

/* Steps [step0, step0 + nsteps) of the epoch in the fused LeNet-5 kernel; the optimizer's scalars
   are in cm->fused_opt already. */
static mnistcu_result mnistcu__lenet_launch(mnistcu_model *m, const mnistcu_dataset *ds, const mnistcu__fused_plan *pl,
                                            size_t B, size_t n, size_t step0, size_t nsteps)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    const mnistcu__cuda_dataset *dc = (const mnistcu__cuda_dataset *)ds->device_copy;
    mnistcu__lenet_args a;
    void *args[1];
    cudaError_t e;
    memset(&a, 0, sizeof a);
    a.u8 = dc->u8;
    a.f32 = dc->f32;
    a.labels = dc->labels;
    a.idx = cm->idx;
    a.n = n;
    a.step0 = step0;
    a.nsteps = (int)nsteps;
    a.B = (int)B;
    mnistcu__norm_for(m, ds, &a.scale, &a.shift);
    a.params = m->params;
    a.grads = m->grads;
    a.state = m->state;
    a.opt = cm->fused_opt;
    a.nops = (int)cm->fused_nops;
    a.lp = m->lossp;
    a.stats = cm->stats;
    a.stats_cap = cm->stats_cap;
    a.rows = (float *)(((uintptr_t)cm->lenet + 15) & ~(uintptr_t)15); /* float4 rows, whatever the hook's alignment */
    a.slots = pl->slots;
    a.fetch = ((uintptr_t)(dc->u8 ? (const void *)dc->u8 : (const void *)dc->f32) & 15) == 0;
    args[0] = &a;
    e = cudaErrorNotSupported;
#if CUDART_VERSION >= 12000
    if (pl->pair) { /* cooperative, in clusters of 2 */
        cudaLaunchConfig_t cfg = cudaLaunchConfig_t();
        cudaLaunchAttribute at[2];
        mnistcu__lenet_pairs(&cfg, at, 1, pl->grid, pl->smem, cu->stream);
        a.pair = 1;
        e = cudaLaunchKernelExC(&cfg, (const void *)mnistcu__k_fused_lenet, args);
        if (e != cudaSuccess) (void)cudaGetLastError(); /* then without clusters, a block a sample */
    }
#endif
    if (e != cudaSuccess) {
        a.pair = 0;
        e = cudaLaunchCooperativeKernel((const void *)mnistcu__k_fused_lenet, dim3((unsigned)pl->grid),
                                        dim3(MNISTCU__LN_T), args, pl->smem, cu->stream);
    }
    if (e != cudaSuccess) return mnistcu__cuda_check(ctx, e, "the fused LeNet-5 kernel");
    MNISTCU__LAUNCHED(ctx, "fused_lenet");
    return MNISTCU_OK;
}

/* >>cuda_fused_clusters -------------------------------------------------------------
   The one-hidden-layer MLP in thread-block clusters, its sums reordered (opt-in:
   mnistcu_train_desc.fused_mlp_clusters). The fused MLP kernel (>>cuda_fused)
   keeps the step by step path's bits, and pays for them: each output is one
   chain of fmafs (784 long for the first layer), every block converts the
   whole batch, and a step has two grid-wide barriers. Here the sums run in
   parallel parts, in a fixed order (the same bits on every run of its own, not
   the step by step path's), and a step needs no grid-wide barrier:
     - G <= 16 clusters of S = 6 blocks (sm_90's clusters: the blocks of a
       cluster read each other's shared memory). Cluster g owns hidden units
       [g U, g U + U) (U = 8, 16, 32 or 64, the fewest that cover H in 16
       clusters; units past H are zeros that stay zeros): their rows of W1,
       entries of b1 and columns of W2. Block r of a cluster owns the r-th
       slice of the inputs (D / S of them, in words of 4) for those units, and
       rows [r R, r R + R) of the batch (R = B / S rounded up).
     - A step: 1. the block's partial sums of h over its input slice, for every
       row of the batch (on the tensor cores, below), pushed to each row's
       owner (st.async into its shared memory, counted on its mbarrier); 2.
       once the S partials of its own rows are in, h of them (in rank order),
       pushed to every block of the cluster, and the cluster's partial logits
       over its U units, stored to global memory each with its step in one
       64-bit word; 3. while the other clusters catch up, the next batch's
       slice (bytes loaded a step ahead) into floats; 4. it polls the partial
       logits of its rows from the blocks of rank r of the other clusters
       until each carries this step (the only data that crosses clusters); 5.
       its rows' logits (the G partials in cluster order, a half warp a row),
       their loss, dz and dh, pushed to every block of the cluster; 6. once
       the batch's h, dh and dz are in, every block updates W2's columns, b1
       and b2 (every block the same sums, so the copies stay equal) and its
       slice of W1. No cluster barrier in a step: each one's arrive carries a
       GPU-wide fence, about 700 cycles a warp (ncu, bench/RESULTS.md).
   The products (h's partial sums; the gradients of W1 and b1 as one product,
   x having a column of ones; those of W2 and b2 as another, h having one) run
   on the tensor cores, in TF32 parts that keep FP32's accuracy: each operand
   v = hi + lo, both TF32 values, and a b = ah bh + ah bl + al bh (mma.sync
   m16n8k8, FP32 sums; mnistcu__tf32_split). About 2^-21 of each term is lost,
   against 2^-24 for an FP32 product; the sums' order differs from fmafs' in
   any case. Where the normalisation has no shift (x / 255, say), x's bytes
   are TF32 values as they are: x holds them, its products take two parts
   (ah bh + ah bl, exact in a), and the scale multiplies their sums
   (mnistcu__mc_args.xb; P1 2-6% faster, bench/RESULTS.md). The FP32 fmafs
   these replaced were bound by shared-memory loads, a few per fmaf (P1's
   phase 1 took 6300 cycles a step, now 3400; its update phase 8600, now
   5000; bench/RESULTS.md).
   Weights stay in shared memory for the whole chunk of steps, and so does the
   optimizer's state (that of W1 where it fits beside the rest: every instance
   but batches of 33-64 with more than 512 hidden units, which read and write
   it in the arena, each element by one thread only; mnistcu__mc_args.sst); all
   go back to the arenas at its end. The steps the partial logits carry count
   this model's steps in the kernel across launches, so a launch never takes a
   stale one. Each row's
   loss and whether it was predicted right go to global memory; a small kernel
   sums them per step in row order (the statistics).
   Measured (bench/RESULTS.md, sixth block): P2 (784-128-10, batch 64) 4.95-5.03
   ms an epoch on an H200 (JAX 26.55; the fused MLP kernel 15.5-16 on an H100),
   P1 (784-1024-10, batch 32) 0.0277-0.0285 s for 10 epochs (JAX 0.0985).
   bench/mlp_cluster.cu is the design's first standalone form, with the CPU
   reference it was checked against. */
enum { MNISTCU__MC_T = 384, MNISTCU__MC_S = 6, MNISTCU__MC_G = 16, MNISTCU__MC_CM = 16, MNISTCU__MC_DMAX = 784,
       MNISTCU__MC_BMAX = 64, MNISTCU__MC_HMAX = 16 * 64 };

typedef struct mnistcu__mc_args {
    const uint8_t *x;        /* the dataset's bytes [count][D] */
    const int32_t *lab;      /* [count] */
    const uint32_t *idx;     /* the sample order from the chunk's first step */
    int n;                   /* samples from the chunk's first step to the epoch's end */
    int B, D, H, C, nsteps;  /* batch size; inputs, hidden units, outputs; steps in the chunk */
    int lsum, slots;         /* the loss's sum reduction; optimizer state slots */
    int sst;                 /* 1: W1's optimizer state in shared memory for the launch (past the layout's
                                total, mnistcu__mc_lay::SST floats a slot), 0: read and written in the arena */
    unsigned step0;          /* this model's steps in the kernel before the chunk */
    float scale, shift;      /* the bytes into the floats of xs: the normalisation, or 1 and 0 with xb */
    int xb;                  /* 1 (where the normalisation's shift is 0): xs holds the bytes themselves, exact
                                in TF32, so the products with x take two TF32 parts, not three, and the
                                normalisation's scale (xsc) multiplies their sums */
    float xsc;               /* the scale with xb, else 1 (a product by 1 changes no bits) */
    float *params, *grads, *state; /* the arenas (the chunk's last step leaves its gradients) */
    size_t np;               /* parameters (the state's slot stride) */
    size_t w1, b1, w2, b2;   /* offsets in the arenas */
    const mnistcu__opt *opt; /* [nops] each step's optimizer scalars; steps from nops on take opt[nops - 1] */
    int nops;
    unsigned long long *pz;  /* partial logits, each with its step (mnistcu__mc_put), by step parity: with fewer
                                than 32 units a cluster [2][S][R][G / 2][C][2] (MNISTCU__MC_G for G: a half
                                warp's load of a pair of clusters, 16 bytes a lane, is C whole 16-byte pieces
                                in a row), else [2][S][G][R C] (each cluster's words its own; measured faster
                                there, bench/RESULTS.md) */
    float *rows;             /* [nsteps][B] each row's loss, then [nsteps][B] 1 where predicted right */
} mnistcu__mc_args;

/* Shared memory, in floats (each part 16-byte aligned), for batches of at most BM and U units a cluster */
template <int BM, int U> struct mnistcu__mc_lay {
    enum : int {
        S = MNISTCU__MC_S, CM = MNISTCU__MC_CM,
        R = (BM + S - 1) / S,                             /* most rows a block */
        KMAX = 4 * ((MNISTCU__MC_DMAX / 4 + S - 1) / S) + 4, /* the longest input slice, and a word */
        /* strides for the tensor cores' fragments: LDX = 12 mod 32, LDW = 8 or 24 mod 32, LDH = 4 or 12
           mod 16 and LDZ = 4 mod 16 (with rows taken in pairs, see mnistcu__mc_tc_dw) put a warp's 32
           loads in 32 banks; x has a column of ones at kn (b1's gradient), h at U (b2's) */
        LDX = KMAX + 4, LDW = U == 8 ? 24 : U + 8, LDH = U + 4, LDZ = CM + 4,
        /* h of own rows: a row of U + 4 floats puts the partial logits' loads of 8 rows in distinct banks */
        HS = U + 4,
        /* phase 1: BM / 16 by U / 8 tiles, MW1 by NW1 a warp, the 8 warps in KP parts of K */
        NT1 = BM / 16 * (U / 8), MW1 = NT1 == 32 ? 2 : 1, NW1 = NT1 >= 16 ? 2 : 1, KP = 8 * MW1 * NW1 / NT1,
        NREP = CM * U + U + CM,                           /* the copied parameters: W2's columns, b1, b2 */
        NPART = KP * BM * U,
        OPTF = (int)((3 * sizeof(mnistcu__opt) + 15) / 16 * 4),
        SST = KMAX * LDW,           /* a slot of W1's optimizer state in shared memory (a.sst), laid out as w1s */
        w1s = 0,                    /* [KMAX][LDW] the slice of W1, units contiguous */
        xs = w1s + KMAX * LDW,      /* [2][BM][LDX] the batch's slice, by step parity */
        ph = xs + 2 * BM * LDX,     /* [KP][BM][U] phase 1's parts (and what x's last row's tiles read past it) */
        rcv = ph + NPART,           /* [S][R][U] the partial h of own rows from each block, by rank (pushed) */
        hrow = rcv + S * R * U,     /* [R][HS] h of own rows */
        dhrow = hrow + R * HS,      /* [R][U] */
        dzrow = dhrow + R * U,      /* [R][CM] */
        hall = dzrow + R * CM,      /* [BM][LDH] the batch's, pushed by the cluster's blocks */
        dhall = hall + BM * LDH,    /* [BM][LDH] */
        dzall = dhall + BM * LDH,   /* [BM][LDZ] */
        w2s = dzall + BM * LDZ,     /* [CM][U] W2's columns, then b1 [U], b2 [CM]: NREP */
        b1s = w2s + CM * U,
        b2s = b1s + U,
        str = b2s + CM,             /* [3][NREP] their optimizer state */
        opt = str + 3 * NREP,       /* the step's scalars: [0] W1's (state stride np), [1] the copies' (NREP),
                                       [2] W1's with its state in shared memory (SST) */
        bars = opt + OPTF,          /* two mbarriers (8 bytes each): the partial h's pushes, then h's, dh's, dz's */
        ints = bars + 4,            /* sample indices [4][BM] (steps q .. q + 3), own rows' labels [2][R] */
        total = ints + 4 * BM + 2 * R,
        w1st = (total + 3) / 4 * 4  /* with a.sst: W1's optimizer state [slots][SST], as w1s */
    };
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && CUDART_VERSION >= 12010
#define MNISTCU__MC_ON 1
/* The exchanges inside a cluster are pushed: a block stores into another block's shared memory with
   st.async, whose bytes count down a transaction count on that block's mbarrier; the receiver's
   threads wait on its phase (acquire, cluster scope). A cluster barrier's arrive carries a GPU-wide
   fence (MEMBAR.ALL.GPU; about 700 cycles a warp at each of a step's two, measured with ncu,
   bench/RESULTS.md), and a pull is a round trip; a push waits on neither. Each receiving buffer
   (rcv; hall, dhall, dzall) is single: a block pushes into one again only after it has received
   something that the buffer's owner sends once done reading it (the partial h of the next step after
   the gather's data of this one, and those after the partials). p's address in cluster block `rank`'s
   shared memory: */
static __device__ __forceinline__ uint32_t mnistcu__mc_mapa(const void *p, int rank)
{
    uint32_t d;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(rank));
    return d;
}
static __device__ __forceinline__ void mnistcu__mc_push4(uint32_t dst, float4 v, uint32_t bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                 ::"r"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar) : "memory");
}
static __device__ __forceinline__ void mnistcu__mc_push2(uint32_t dst, float x, float y, uint32_t bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                 ::"r"(dst), "f"(x), "f"(y), "r"(bar) : "memory");
}
/* A step's phase of mbarrier `bar` (one arrival, this block's): the bytes it waits for. Pushes may come
   before it (the count goes below zero); the phase completes once both are in */
static __device__ __forceinline__ void mnistcu__mc_expect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mnistcu__mc_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    while (!done);
}
/* Across clusters, a partial logit goes with its step in one 64-bit word (single-copy atomic), stored
   and loaded relaxed at GPU scope: the reader polls the value itself, with no flag and no fence between */
static __device__ __forceinline__ void mnistcu__mc_put(unsigned long long *p, unsigned step, float v)
{
    const unsigned long long w = (unsigned long long)step << 32 | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
/* One word, or two at once (16 bytes aligned): PTX takes a vector access as one access an element, so each word
   stays single-copy atomic. No "memory" clobber: the words carry all that the reader orders, and with
   one the compiler read the kernel's parameters and rebuilt every address in each round of a poll */
static __device__ __forceinline__ void mnistcu__mc_get2(const unsigned long long *p, unsigned long long &w0,
                                                        unsigned long long &w1)
{
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(p));
}
static __device__ __forceinline__ unsigned long long mnistcu__mc_get(const unsigned long long *p)
{
    unsigned long long w;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(w) : "l"(p));
    return w;
}
/* (mnistcu__tf32_split and mnistcu__tf32_mma: >>cuda_x3) */
/* The three parts' products in two chains: d[0] += ah bh, d[1] += ah bl + al bh; the sum d[0] + d[1]
   at the end (mnistcu__mc_sum3) */
static __device__ __forceinline__ void mnistcu__mc_mma3(float (*d)[4], const uint32_t *ah, const uint32_t *al,
                                                        const uint32_t *bh, const uint32_t *bl)
{
    mnistcu__tf32_mma(d[0], ah, bh);
    mnistcu__tf32_mma(d[1], ah, bl);
    mnistcu__tf32_mma(d[1], al, bh);
}
static __device__ __forceinline__ float mnistcu__mc_sum3(const float (*d)[4], int e) { return d[0][e] + d[1][e]; }
/* ... or, where a is exact in TF32 (XB: the bytes of x, mnistcu__mc_args.xb; al unread), two: ah bh + ah bl */
template <bool XB>
static __device__ __forceinline__ void mnistcu__mc_mma_x(float (*d)[4], const uint32_t *ah, const uint32_t *al,
                                                         const uint32_t *bh, const uint32_t *bl)
{
    if (XB) {
        mnistcu__tf32_mma(d[0], ah, bh);
        mnistcu__tf32_mma(d[1], ah, bl);
    } else
        mnistcu__mc_mma3(d, ah, al, bh, bl);
}
/* x's split: with XB the value is its own TF32 part */
template <bool XB> static __device__ __forceinline__ void mnistcu__mc_split_x(float v, uint32_t &hi, uint32_t &lo)
{
    if (XB) hi = __float_as_uint(v), lo = 0u;
    else mnistcu__tf32_split(v, hi, lo);
}
#endif

/* A parameter's optimizer step: p with gradient g, its state at s (slot stride o->n), for optimizer kind
   K known at compile time (-1: plain SGD, p - lr g, the state unread). Inlined: where o is a thread's
   private copy, its scalars stay in registers across the elements of a loop (read through a pointer to
   shared memory, each element would load them again after the last one's stores, one after another,
   since those stores might have changed them) */
template <int K>
static __device__ __forceinline__ float mnistcu__mc_step_k(const mnistcu__opt *o, float p, float g, float *s)
{
    switch (K) {
    case -1: return fmaf(-o->lr, g, p);
    case MNISTCU_OPTIM_ADAM:
    case MNISTCU_OPTIM_ADAMW: mnistcu__opt_adam(o, 0, &p, g, s); return p;
    case MNISTCU_OPTIM_RMSPROP: mnistcu__opt_rmsprop(o, 0, &p, g, s); return p;
    case MNISTCU_OPTIM_ADAGRAD: mnistcu__opt_adagrad(o, 0, &p, g, s); return p;
    default: return mnistcu__sgd_step(o, p, g, o->has_momentum ? s : NULL);
    }
}

/* ... the kind chosen at run time */
static __device__ __forceinline__ float mnistcu__mc_step(const mnistcu__opt *o, float p, float g, float *s)
{
    switch (o->kind) {
    case MNISTCU_OPTIM_ADAM:
    case MNISTCU_OPTIM_ADAMW: return mnistcu__mc_step_k<MNISTCU_OPTIM_ADAM>(o, p, g, s);
    case MNISTCU_OPTIM_RMSPROP: return mnistcu__mc_step_k<MNISTCU_OPTIM_RMSPROP>(o, p, g, s);
    case MNISTCU_OPTIM_ADAGRAD: return mnistcu__mc_step_k<MNISTCU_OPTIM_ADAGRAD>(o, p, g, s);
    default: return mnistcu__mc_step_k<MNISTCU_OPTIM_SGD>(o, p, g, s);
    }
}

/* The words of the batch's slice a thread fetches (pm[i] = row << 8 | word), rows below n from the
   sample indices rows[]: pre[i] four bytes each */
template <int NW>
static __device__ __forceinline__ void mnistcu__mc_load(uint32_t *pre, const int *pm, int n, const uint8_t *x,
                                                        const uint32_t *rows, int D, int k0)
{
#pragma unroll
    for (int i = 0; i < NW; ++i) {
        const int row = pm[i] >> 8;
        pre[i] = row < n ? *(const uint32_t *)(x + (size_t)rows[row] * (size_t)D + k0 + 4 * (pm[i] & 255)) : 0u;
    }
}
/* ... and those words normalised into dst [row][LDX], rows below n */
template <int NW, int LDX>
static __device__ __forceinline__ void mnistcu__mc_floats(const uint32_t *pre, const int *pm, int n, float *dst,
                                                          float scale, float shift)
{
#pragma unroll
    for (int i = 0; i < NW; ++i) {
        const int row = pm[i] >> 8;
        if (row < n) {
            float *xr = dst + row * LDX + 4 * (pm[i] & 255);
            const uint32_t p = pre[i];
            xr[0] = fmaf((float)(p & 255u), scale, shift);
            xr[1] = fmaf((float)((p >> 8) & 255u), scale, shift);
            xr[2] = fmaf((float)((p >> 16) & 255u), scale, shift);
            xr[3] = fmaf((float)(p >> 24), scale, shift);
        }
    }
}

/* The copied parameter e (W2's columns [C][U], then b1 [U], then b2 [C]) in shared memory */
static __device__ __forceinline__ float *mnistcu__mc_rep(float *w2s, float *b1s, float *b2s, int e, int C, int U)
{
    return e < C * U ? w2s + e : e < C * U + U ? b1s + (e - C * U) : b2s + (e - C * U - U);
}

/* ... and its place in the arenas (units u0 .. of H) */
static __device__ __forceinline__ size_t mnistcu__mc_gi(const mnistcu__mc_args &a, int e, int U, int u0)
{
    const int C = a.C;
    if (e < C * U) return a.w2 + (size_t)(e / U) * a.H + u0 + e % U;
    return e < C * U + U ? a.b1 + u0 + (e - C * U) : a.b2 + (e - C * U - U);
}

/* Block r of S owns words [r W / S, (r + 1) W / S) of the W = D / 4 words of a sample: inputs k0, kn of them */
static __host__ __device__ __forceinline__ void mnistcu__mc_slice(int D, int r, int *k0, int *kn)
{
    const int W = D / 4, w0 = r * W / MNISTCU__MC_S, w1 = (r + 1) * W / MNISTCU__MC_S;
    *k0 = 4 * w0;
    *kn = 4 * (w1 - w0);
}

#ifdef MNISTCU__MC_ON
/* Phase 1 on the tensor cores: the partial h [BM][U] over the slice's kn inputs, x [BM][LDX] times W1's
   slice [k][LDW], by warps 0-7 (mnistcu__mc_lay's NT1, MW1, NW1, KP): warp w takes MW1 by NW1 tiles of
   16 rows by 8 units, tile group w % (8 / KP), and part w / (8 / KP) of K's steps of 8 (up to kn
   rounded up: x and W1 are zeros there, or ones by zeros in column kn); two chains a tile. One part
   goes straight to the rows' owners (row's block row / Rr, its slot r of rcv, pushed: mnistcu__mc_push2),
   KP parts to ph [KP][BM][U] (the caller adds them in order and pushes them). XB: x holds bytes
   (mnistcu__mc_args.xb), each sum times xsc */
template <int BM, int U, bool XB>
static __device__ __forceinline__ void mnistcu__mc_tc_h(const float *xc, const float *w1s, float *ph, float *rcv,
                                                        const void *bar, int r, int Rr, int kn, int warp, int lane,
                                                        float xsc)
{
    typedef mnistcu__mc_lay<BM, U> L;
    enum { LDX = L::LDX, LDW = L::LDW, MW = L::MW1, NW = L::NW1, KP = L::KP, NTG = 8 / KP, MB = BM / 16 / MW };
    const int gq = lane >> 2, q = lane & 3, tg = warp % NTG, kp = warp / NTG;
    const int m0 = 16 * MW * (tg % MB), n0 = 8 * NW * (tg / MB), nks = (kn + 7) / 8;
    const int ka = kp * nks / KP, kb = (kp + 1) * nks / KP;
    float acc[MW][NW][2][4];
#pragma unroll
    for (int m = 0; m < MW; ++m)
#pragma unroll
        for (int n = 0; n < NW; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][n][0][e] = acc[m][n][1][e] = 0.0f;
#pragma unroll 2
    for (int ks = ka; ks < kb; ++ks) {
        const int k = 8 * ks + q;
        uint32_t ah[MW][4], al[MW][4], bh[NW][2], bl[NW][2];
#pragma unroll
        for (int m = 0; m < MW; ++m) {
            const float *xr = xc + (m0 + 16 * m + gq) * LDX + k;
            mnistcu__mc_split_x<XB>(xr[0], ah[m][0], al[m][0]);
            mnistcu__mc_split_x<XB>(xr[8 * LDX], ah[m][1], al[m][1]);
            mnistcu__mc_split_x<XB>(xr[4], ah[m][2], al[m][2]);
            mnistcu__mc_split_x<XB>(xr[8 * LDX + 4], ah[m][3], al[m][3]);
        }
#pragma unroll
        for (int n = 0; n < NW; ++n) {
            const float *wr = w1s + k * LDW + n0 + 8 * n + gq;
            mnistcu__tf32_split(wr[0], bh[n][0], bl[n][0]);
            mnistcu__tf32_split(wr[4 * LDW], bh[n][1], bl[n][1]);
        }
#pragma unroll
        for (int m = 0; m < MW; ++m)
#pragma unroll
            for (int n = 0; n < NW; ++n) mnistcu__mc_mma_x<XB>(acc[m][n], ah[m], al[m], bh[n], bl[n]);
    }
#pragma unroll
    for (int m = 0; m < MW; ++m)
#pragma unroll
        for (int n = 0; n < NW; ++n)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) { /* rows gq and gq + 8 of the tile */
                const int row = m0 + 16 * m + gq + 8 * h2, col = n0 + 8 * n + 2 * q, blk = row / Rr;
                const float v0 = mnistcu__mc_sum3(acc[m][n], 2 * h2) * xsc;
                const float v1 = mnistcu__mc_sum3(acc[m][n], 2 * h2 + 1) * xsc;
                if (KP > 1)
                    *(float2 *)(ph + kp * BM * U + row * U + col) = make_float2(v0, v1);
                else if (blk < L::S) /* rows past S Rr have no owner */
                    mnistcu__mc_push2(mnistcu__mc_mapa(rcv + (r * L::R + row - blk * Rr) * U + col, blk), v0, v1,
                                      mnistcu__mc_mapa(bar, blk));
            }
}

/* The update phase's sums on the tensor cores, over the BM rows in steps of 8 (rows past b are zeros
   in dh and dz: a fixed count of steps, unrolled, costs less than fewer steps in a loop), a step's 8 rows taken as k = q -> row 2 q and k = q + 4 -> row 2 q + 1, the same
   in both operands (a sum in another order; this one puts the loads of x, dh and dz in distinct banks):
     - mnistcu__mc_tc_dw: W1's gradient transposed, x^T [kn + 1][rows] times dh [rows][U], one tile of
       16 inputs (mt) by NW tiles of 8 units from n0: row k < kn of it is input k's, row kn (x's column
       of ones) b1's. The 12 warps (mnistcu__mc_dwl): U / 8 tiles of units in NB blocks of NW, WPB warps
       a block, MW tiles of inputs a warp from MW (w % WPB): 144 inputs covered, tiles past kn skipped;
     - mnistcu__mc_tc_dz: W2's and b2's, dz^T [16][rows] times h [rows][U + 8] (h's column U is ones):
       tile j of 8 units on warp 11 - j. */
template <int BM, int U> struct mnistcu__mc_dwl {
    enum { NT = U / 8, NW = NT >= 2 ? 2 : 1, NB = NT / NW, WPB = 12 / NB, MW = (9 + WPB - 1) / WPB, NZ = NT + 1 };
};
template <int BM, int U, bool XB>
static __device__ __forceinline__ void mnistcu__mc_tc_dw(const float *xc, const float *dhall, int mt, int n0,
                                                         int lane, float (*acc)[2][4])
{
    typedef mnistcu__mc_lay<BM, U> L;
    enum { LDX = L::LDX, LDH = L::LDH, NW = mnistcu__mc_dwl<BM, U>::NW };
    const int gq = lane >> 2, q = lane & 3;
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][0][e] = acc[n][1][e] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < BM / 8; ++ks) {
        const int r0 = 8 * ks + 2 * q;
        const float *x0 = xc + r0 * LDX + 16 * mt + gq;
        uint32_t ah[4], al[4], bh[NW][2], bl[NW][2];
        mnistcu__mc_split_x<XB>(x0[0], ah[0], al[0]);
        mnistcu__mc_split_x<XB>(x0[8], ah[1], al[1]);
        mnistcu__mc_split_x<XB>(x0[LDX], ah[2], al[2]);
        mnistcu__mc_split_x<XB>(x0[LDX + 8], ah[3], al[3]);
#pragma unroll
        for (int n = 0; n < NW; ++n) {
            const float *dr = dhall + r0 * LDH + n0 + 8 * n + gq;
            mnistcu__tf32_split(dr[0], bh[n][0], bl[n][0]);
            mnistcu__tf32_split(dr[LDH], bh[n][1], bl[n][1]);
        }
#pragma unroll
        for (int n = 0; n < NW; ++n) mnistcu__mc_mma_x<XB>(acc[n], ah, al, bh[n], bl[n]);
    }
}
template <int BM, int U>
static __device__ __forceinline__ void mnistcu__mc_tc_dz(const float *hall, const float *dzall, int jz, int lane,
                                                         float (*az)[4])
{
    typedef mnistcu__mc_lay<BM, U> L;
    enum { LDH = L::LDH, LDZ = L::LDZ };
    const int gq = lane >> 2, q = lane & 3;
#pragma unroll
    for (int e = 0; e < 4; ++e) az[0][e] = az[1][e] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < BM / 8; ++ks) {
        const int r0 = 8 * ks + 2 * q;
        const float *zr = dzall + r0 * LDZ + gq, *hr = hall + r0 * LDH + 8 * jz + gq;
        uint32_t zh[4], zl[4], hh[2], hl[2];
        mnistcu__tf32_split(zr[0], zh[0], zl[0]);
        mnistcu__tf32_split(zr[8], zh[1], zl[1]);
        mnistcu__tf32_split(zr[LDZ], zh[2], zl[2]);
        mnistcu__tf32_split(zr[LDZ + 8], zh[3], zl[3]);
        mnistcu__tf32_split(hr[0], hh[0], hl[0]);
        mnistcu__tf32_split(hr[LDH], hh[1], hl[1]);
        mnistcu__mc_mma3(az, zh, zl, hh, hl);
    }
}
/* The general steps of one of W1's gradient tiles (mnistcu__mc_tc_dw; g[4 n + j] its element (n, j)) for
   optimizer kind K (mnistcu__mc_step_k): W1's with a thread's private copy of the step's scalars (ow) and
   its state in shared memory (w1st, a.sst) or the arena, b1's (x's row of ones) with the copies' (o1)
   and their state (b1st). A tile of 8 or more elements that are all W1's below H, with the state in
   shared memory and no gradient kept, is unrolled with one kind's step; any other in a loop, each
   gradient picked from registers by compile-time indices (unrolled with every kind's step, the
   tiles' steps were about 5,000 instructions, bench/RESULTS.md). With the last step, the gradients
   go to the arena. */
template <int BM, int U, int K>
static __device__ __forceinline__ void mnistcu__mc_w1_steps(const mnistcu__mc_args &a, const mnistcu__opt &ow,
                                                            const mnistcu__opt *o1, const float *g, float *w1s,
                                                            float *w1st, float *b1s, float *b1st, int mt, int n0,
                                                            int lane, int kn, int nown, int k0, int u0, bool last,
                                                            int r)
{
    enum { LDW = mnistcu__mc_lay<BM, U>::LDW, NV = 4 * mnistcu__mc_dwl<BM, U>::NW };
    const int gq = lane >> 2, q4 = lane & 3;
    if (NV >= 8 && a.sst && !last && n0 + NV * 2 <= nown && 16 * mt + 16 <= kn) {
        /* the common tile: every element a weight of W1 below H, its state in shared memory, no
           gradient kept; unrolled with no branch between the elements, so that their steps overlap
           (one element at a time, each step's dependent chain of selects, branches, loads and stores
           took about 400 cycles with three warps a scheduler: ncu, bench/RESULTS.md). 784-1024-10
           trains 9-13% faster so; tiles of 4 elements (8 units a cluster) measured level or slower */
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            const int n = v >> 2, j = v & 3;
            const int k = 16 * mt + gq + 8 * (j >> 1), u = n0 + 8 * n + 2 * q4 + (j & 1);
            float *w = w1s + k * LDW + u;
            *w = mnistcu__mc_step_k<K>(&ow, *w, g[v], w1st + k * LDW + u);
        }
        return;
    }
#pragma unroll 1
    for (int v = 0; v < NV; ++v) {
        const int n = v >> 2, j = v & 3;
        const int k = 16 * mt + gq + 8 * (j >> 1), u = n0 + 8 * n + 2 * q4 + (j & 1);
        float gv = g[0];
#pragma unroll
        for (int z = 1; z < NV; ++z) gv = v == z ? g[z] : gv;
        if (u >= nown || k > kn) continue;
        if (k < kn) {
            float *w = w1s + k * LDW + u;
            const size_t gi = a.w1 + (size_t)(u0 + u) * a.D + k0 + k;
            /* the state's two places apart: through one pointer that may be either, its loads and stores
               would be generic ones */
            if (a.sst) *w = mnistcu__mc_step_k<K>(&ow, *w, gv, w1st + k * LDW + u);
            else *w = mnistcu__mc_step_k<K>(&ow, *w, gv, a.state + gi);
            if (last) a.grads[gi] = gv;
        } else {
            b1s[u] = mnistcu__mc_step_k<K>(o1, b1s[u], gv, b1st + u);
            if (last && r == 0) a.grads[a.b1 + u0 + u] = gv;
        }
    }
}
#endif

template <int BM, int U>
__global__ void __launch_bounds__(MNISTCU__MC_T, 1) mnistcu__k_mc(mnistcu__mc_args a)
{
    MNISTCU__PDL_WAIT();
#ifdef MNISTCU__MC_ON
    typedef mnistcu__mc_lay<BM, U> L;
    enum { S = MNISTCU__MC_S, T = MNISTCU__MC_T, GM = MNISTCU__MC_G, CM = L::CM,
           LDX = L::LDX, LDW = L::LDW, LDH = L::LDH, LDZ = L::LDZ, HS = L::HS, NREP = L::NREP,
           NW = (BM * (L::KMAX / 4) + T - 1) / T /* words a thread fetches */ };
    constexpr bool PAIRS = U < 32; /* the partial logits' layout (mnistcu__mc_args.pz) */
    extern __shared__ float4 mnistcu__mc_sm4[];
    float *sm = (float *)mnistcu__mc_sm4;
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const int t = (int)threadIdx.x, lane = t & 31, warp = t >> 5;
    const int r = (int)cl.block_rank(), g = (int)blockIdx.x / S, G = (int)gridDim.x / S;
    const int B = a.B, D = a.D, H = a.H, C = a.C, u0 = g * U, Rr = (B + S - 1) / S;
    const int nown = H - u0 < U ? H - u0 : U; /* units of this cluster below H */
    int k0, kn, e;
    mnistcu__mc_slice(D, r, &k0, &kn);
    const int nw = kn / 4;
    float *w1s = sm + L::w1s, *xs = sm + L::xs, *ph = sm + L::ph, *rcv = sm + L::rcv, *hrow = sm + L::hrow;
    float *dhrow = sm + L::dhrow, *dzrow = sm + L::dzrow, *hall = sm + L::hall, *dhall = sm + L::dhall;
    float *dzall = sm + L::dzall, *w2s = sm + L::w2s, *b1s = sm + L::b1s, *b2s = sm + L::b2s, *str = sm + L::str;
    float *w1st = sm + L::w1st; /* only with a.sst */
    float *barA = sm + L::bars, *barB = barA + 2; /* the mbarriers (mnistcu__mc_push4) */
    const uint32_t bA = (uint32_t)__cvta_generic_to_shared(barA), bB = (uint32_t)__cvta_generic_to_shared(barB);
    /* the bytes a step pushes into this block: the S blocks' partial h of its rows below BM (A); h, dh
       and dz of the batch's rows below BM (B) */
    const uint32_t txa = (uint32_t)(S * max(0, min(Rr, BM - r * Rr)) * U * 4);
    const uint32_t txb = (uint32_t)(min(BM, S * Rr) * (2 * U + CM) * 4);
    mnistcu__opt *sopt = (mnistcu__opt *)(sm + L::opt);
    uint32_t *sidx = (uint32_t *)(sm + L::ints);
    int32_t *labs = (int32_t *)(sidx + 4 * BM);
    uint32_t pre[NW];
    int pm[NW]; /* the words this thread fetches: row << 8 | word, the same every step */
    const int p1blk = t / (U / 4) / Rr; /* the owner of the row whose phase 1 parts thread t adds (KP > 1) */
#pragma unroll
    for (int i = 0; i < NW; ++i) {
        const int w = t + i * T, row = w / nw;
        pm[i] = row << 8 | (w - row * nw);
    }
    /* own parameters and the copies' optimizer state in (and W1's, where shared memory holds it); units
       past H are zeros */
    for (e = t; e < L::KMAX * U; e += T) {
        const int k = e / U, u = e - k * U;
        const bool in = k < kn && u < nown;
        const size_t gi = a.w1 + (size_t)(u0 + u) * D + k0 + k;
        int s;
        w1s[k * LDW + u] = in ? a.params[gi] : 0.0f;
        if (a.sst)
            for (s = 0; s < a.slots; ++s) w1st[s * L::SST + k * LDW + u] = in ? a.state[(size_t)s * a.np + gi] : 0.0f;
    }
    for (e = t; e < C * U + U + C; e += T) {
        const size_t gi = mnistcu__mc_gi(a, e, U, u0);
        const int live = e < C * U ? e % U < nown : e < C * U + U ? e - C * U < nown : 1;
        int s;
        *mnistcu__mc_rep(w2s, b1s, b2s, e, C, U) = live ? a.params[gi] : 0.0f;
        for (s = 0; s < 3; ++s) str[s * NREP + e] = live && s < a.slots ? a.state[(size_t)s * a.np + gi] : 0.0f;
    }
    /* the batch's slice: zeros past the slice (and in rows past a short first batch); with the tensor
       cores, ones in column kn, which make W1's gradient's row kn b1's (mnistcu__mc_tc_dw) */
    for (e = t; e < 2 * BM * LDX; e += T) xs[e] = e % LDX == kn ? 1.0f : 0.0f;
    /* h, dh and dz of the batch: zeros in rows past R S, which are never gathered; h's ones (column U) */
    for (e = t; e < L::w2s - L::hall; e += T) hall[e] = e < BM * LDH && e % LDH == U ? 1.0f : 0.0f;
    if (t == 0) { /* the mbarriers and step 0's bytes; the cluster barrier puts them (and hall's zeros)
                     before any block's first push */
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bA) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bB) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if (a.nsteps > 0) {
            mnistcu__mc_expect(bA, txa);
            mnistcu__mc_expect(bB, txb);
        }
    }
    cl.sync();
    {   /* steps 0 and 1's indices, step 0's labels and bytes (into xs[0]), step 1's bytes (in flight) */
        const int b0 = min(B, a.n), b1 = a.nsteps > 1 ? min(B, a.n - B) : 0;
        __syncthreads();
        for (e = t; e < b0; e += T) sidx[e] = a.idx[e];
        for (e = t; e < b1; e += T) sidx[BM + e] = a.idx[B + e];
        __syncthreads();
        if (t < Rr && r * Rr + t < b0) labs[t] = a.lab[sidx[r * Rr + t]];
        mnistcu__mc_load<NW>(pre, pm, b0, a.x, sidx, D, k0);
        mnistcu__mc_floats<NW, LDX>(pre, pm, b0, xs, a.scale, a.shift);
        mnistcu__mc_load<NW>(pre, pm, b1, a.x, sidx + BM, D, k0);
        __syncthreads();
    }
    for (int q = 0; q < a.nsteps; ++q) {
        const int off = q * B, b = min(B, a.n - off);
        const int bn = q + 1 < a.nsteps ? min(B, a.n - off - B) : 0;
        const int bnn = q + 2 < a.nsteps ? min(B, a.n - off - 2 * B) : 0;
        const unsigned gstep = a.step0 + (unsigned)q + 1u;
        const float inv_b = a.lsum ? 1.0f : 1.0f / (float)b;
        const bool last = q == a.nsteps - 1; /* its gradients stay in the arena */
        float *xc = xs + (q & 1) * BM * LDX, *xn = xs + ((q + 1) & 1) * BM * LDX;
        const uint32_t *inx = sidx + ((q + 1) & 3) * BM; /* step q + 1's indices */
        uint32_t *inn = sidx + ((q + 2) & 3) * BM;       /* step q + 2's, stored during this step */
        /* started now, used later: step q + 2's indices, step q + 1's labels of own rows */
        const uint32_t idx2 = t < bnn ? a.idx[off + 2 * B + t] : 0u;
        const int32_t labn = t < Rr && r * Rr + t < bn ? a.lab[inx[r * Rr + t]] : 0;
        if (t == 8 * 32) { /* the step's scalars, for W1 (state in the arena) and for the copies (in sopt's
                              stride), by a warp that phase 1 leaves idle (the load's latency off its path) */
            sopt[0] = a.opt[q < a.nops ? q : a.nops - 1];
            sopt[1] = sopt[0];
            sopt[1].n = NREP;
            sopt[2] = sopt[0];
            sopt[2].n = L::SST;
        }
        /* 1. partial h over the slice, on the tensor cores, pushed to the rows' owners (A) */
        if (warp < 8) {
            if (a.xb) mnistcu__mc_tc_h<BM, U, true>(xc, w1s, ph, rcv, barA, r, Rr, kn, warp, lane, a.xsc);
            else mnistcu__mc_tc_h<BM, U, false>(xc, w1s, ph, rcv, barA, r, Rr, kn, warp, lane, 1.0f);
        }
        if (L::KP > 1) { /* the parts in order, four units a thread (t's row's owner p1blk), pushed */
            enum { NP = L::KP };
            static_assert(L::KP == 1 || BM * U / 4 <= T, "phase 1's parts: a thread a word");
            __syncthreads();
            if (t < BM * U / 4 && p1blk < S) { /* rows past S Rr have no owner */
                const int e = t, row = e / (U / 4), blk = p1blk;
                float4 s = ((const float4 *)ph)[e];
#pragma unroll
                for (int p = 1; p < NP; ++p) {
                    const float4 v = ((const float4 *)(ph + p * BM * U))[e];
                    s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
                }
                mnistcu__mc_push4(mnistcu__mc_mapa(rcv + (r * L::R + row - blk * Rr) * U + 4 * (e - row * (U / 4)), blk),
                                  s, mnistcu__mc_mapa(barA, blk));
            }
        }
        /* 2. own rows, once the cluster's partials are in: h from them (in rank order), then the
           cluster's partial logits */
        mnistcu__mc_wait(bA, (uint32_t)q & 1u);
        if (t == 0 && q + 1 < a.nsteps) mnistcu__mc_expect(bA, txa); /* the next step's bytes */
        for (e = t; e < Rr * U; e += T) {
            const int i = e / U, u = e - i * U, row = r * Rr + i;
            float s = b1s[u];
            if (row >= b) { /* rows past the batch */
                hrow[i * HS + u] = 0.0f;
                continue;
            }
#pragma unroll
            for (int q2 = 0; q2 < S; ++q2) s += rcv[(q2 * L::R + i) * U + u];
            hrow[i * HS + u] = s > 0.0f ? s : 0.0f;
        }
        __syncthreads();
        {   /* the partial logits to global memory (mnistcu__mc_put): with 32 or 64 units four chains
               (unit u in chain u % 4) on four lanes, added as (s0 + s1) + (s2 + s3); with fewer, a
               thread an output */
            /* output (i, c)'s word at dst + i * oi + c * oc (the layout: mnistcu__mc_args.pz) */
            unsigned long long *dst = a.pz + (size_t)((gstep & 1u) * S + r) * (size_t)(Rr * C) * GM +
                                      (PAIRS ? (g >> 1) * 2 * C + (g & 1) : g * (Rr * C));
            const int oi = PAIRS ? C * GM : C, oc = PAIRS ? 2 : 1;
            if (U >= 32) {
                const int n4 = 4 * Rr * C;
                for (e = t; e < (n4 + 31) / 32 * 32; e += T) { /* whole warps, for the shuffles */
                    const int o = e >> 2, j = e & 3, i = o % Rr, c = o / Rr;
                    float s = 0.0f;
                    if (e < n4)
#pragma unroll 4
                        for (int u = j; u < U; u += 4) s = fmaf(hrow[i * HS + u], w2s[c * U + u], s);
                    s += __shfl_xor_sync(0xffffffffu, s, 1);
                    s += __shfl_xor_sync(0xffffffffu, s, 2);
                    if (e < n4 && j == 0) mnistcu__mc_put(dst + i * oi + c * oc, gstep, s);
                }
            } else
                for (e = t; e < Rr * C; e += T) {
                    const int i = e / C, c = e - i * C;
                    float s = 0.0f;
#pragma unroll 8
                    for (int u = 0; u < U; ++u) s = fmaf(hrow[i * HS + u], w2s[c * U + u], s);
                    mnistcu__mc_put(dst + i * oi + c * oc, gstep, s);
                }
        }
        for (e = t; e < Rr * (U / 4); e += T) { /* h of own rows (below BM) to every block's hall (B) */
            const int i = e / (U / 4), u4 = e - i * (U / 4);
            if (r * Rr + i < BM) {
                const float4 v = *(const float4 *)(hrow + i * HS + 4 * u4);
#pragma unroll
                for (int blk = 0; blk < S; ++blk)
                    mnistcu__mc_push4(mnistcu__mc_mapa(hall + (r * Rr + i) * LDH + 4 * u4, blk), v, mnistcu__mc_mapa(barB, blk));
            }
        }
        /* 3. while the other clusters catch up: the next batch's bytes into xn, the batch after's loads */
        if (t < bnn) inn[t] = idx2;
        mnistcu__mc_floats<NW, LDX>(pre, pm, bn, xn, a.scale, a.shift);
        __syncthreads();
        mnistcu__mc_load<NW>(pre, pm, bnn, a.x, inn, D, k0);
        {   /* 4, 5. the logits of own rows, a half warp a row (lane c: class c), their loss, dz, then dh */
            const int i = warp * 2 + (lane >> 4), c = lane & 15, row = r * Rr + i;
            const bool live = i < Rr && row < b, lc = live && c < C;
            float z = -INFINITY, m, sum, ex, zy;
            int am = c, y = 0;
            if (lc) { /* 4. the G clusters' partials, polled until each carries this step */
                const unsigned long long *src = a.pz + (size_t)((gstep & 1u) * S + r) * (size_t)(Rr * C) * GM +
                                                (PAIRS ? (i * C * GM + 2 * c) : i * C + c);
                asm volatile("" : "+l"(src)); /* one register, the loads at offsets from it (else the compiler
                                                  rebuilds each load's address in each round) */
                unsigned long long v[GM];
                unsigned wait = (1u << G) - 1u; /* the clusters whose word has not carried this step yet */
                float s2 = 0.0f;
#pragma unroll
                for (int gg = 0; gg < GM; ++gg) v[gg] = 0ull;
                /* a round that still misses a word sleeps about 64 ns (__nanosleep: 0-128) before the next.
                   Every block polls in every round, and the 96 blocks' rounds load the same few hundred
                   lines of L2: fewer rounds leave those lines' slices freer for the stores they wait
                   for and for the round that finds them (on an H200, P2 5.30 -> 4.95-5.03 ms an epoch,
                   P1 0.0281-0.0285 -> 0.0277-0.0283 s; 128 ns: 4.98-5.01 ms, 256: 5.11-5.13, 512:
                   5.05-5.20; bench/RESULTS.md, sixth block) */
                do { /* a round: the missing words (the pairs with one), loaded together */
                    if (PAIRS) {
#pragma unroll
                        for (int gg = 0; gg < GM; gg += 2)
                            if (wait >> gg & 3u) mnistcu__mc_get2(src + gg * C, v[gg], v[gg + 1]);
                    } else {
#pragma unroll
                        for (int gg = 0; gg < GM; ++gg)
                            if (wait >> gg & 1u) v[gg] = mnistcu__mc_get(src + gg * (Rr * C));
                    }
#pragma unroll
                    for (int gg = 0; gg < GM; ++gg)
                        if ((unsigned)(v[gg] >> 32) == gstep) wait &= ~(1u << gg);
                    if (wait) __nanosleep(64);
                } while (wait);
#pragma unroll
                for (int gg = 0; gg < GM; ++gg) s2 += gg < G ? __uint_as_float((unsigned)v[gg]) : 0.0f;
                z = s2 + b2s[c];
            }
            m = z;
#pragma unroll
            for (int o = 8; o; o >>= 1) { /* the first maximum */
                const float m2 = __shfl_xor_sync(0xffffffffu, m, o, 16);
                const int a2 = __shfl_xor_sync(0xffffffffu, am, o, 16);
                if (m2 > m || (m2 == m && a2 < am)) {
                    m = m2;
                    am = a2;
                }
            }
            ex = lc ? expf(z - m) : 0.0f;
            sum = ex;
#pragma unroll
            for (int o = 8; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o, 16);
            if (live) y = labs[(q & 1) * L::R + i];
            zy = __shfl_sync(0xffffffffu, z, y & 15, 16);
            if (i < Rr) dzrow[i * CM + c] = lc ? (ex / sum - (c == y ? 1.0f : 0.0f)) * inv_b : 0.0f;
            if (live && c == 0 && g == 0) {
                a.rows[(size_t)q * B + row] = logf(sum) - (zy - m);
                a.rows[((size_t)a.nsteps + q) * B + row] = am == y ? 1.0f : 0.0f;
            }
        }
        __syncthreads();
        for (e = t; e < Rr * U; e += T) { /* dh of own rows, a thread a value (the classes' chain in order) */
            const int i = e / U, u = e - i * U;
            float s2 = 0.0f;
#pragma unroll 4
            for (int cc = 0; cc < C; ++cc) s2 = fmaf(dzrow[i * CM + cc], w2s[cc * U + u], s2);
            dhrow[e] = r * Rr + i < b && hrow[i * HS + u] > 0.0f ? s2 : 0.0f;
        }
        __syncthreads();
        {   /* dh and dz of own rows (below BM) to every block's dhall and dzall (B); then the batch's
               h, dh and dz, once in */
            enum { F = U / 4 + CM / 4 };
            for (e = t; e < Rr * F; e += T) { /* a thread a word, to the S blocks */
                const int i = e / F, w = e - i * F, row = r * Rr + i;
                if (row >= BM) continue;
                const bool h = w < U / 4;
                const float4 v = *(const float4 *)(h ? dhrow + i * U + 4 * w : dzrow + i * CM + 4 * (w - U / 4));
                float *d = h ? dhall + row * LDH + 4 * w : dzall + row * LDZ + 4 * (w - U / 4);
#pragma unroll
                for (int blk = 0; blk < S; ++blk) mnistcu__mc_push4(mnistcu__mc_mapa(d, blk), v, mnistcu__mc_mapa(barB, blk));
            }
            mnistcu__mc_wait(bB, (uint32_t)q & 1u);
            if (t == 0 && q + 1 < a.nsteps) mnistcu__mc_expect(bB, txb); /* the next step's bytes */
        }
        /* plain SGD's step, w - lr g, is what mnistcu__mc_step takes too (one fmaf): here without its
           loads of the scalars per weight */
        const bool plain = sopt[0].kind == MNISTCU_OPTIM_SGD && !sopt[0].has_momentum && sopt[0].wd == 0.0f;
        const float nlr = -sopt[0].lr;
        {   /* the sums on the tensor cores (mnistcu__mc_tc_dw, _dz), each tile's steps after it: plain
               SGD's (no gradients kept) apart, without the general step's call in its loop */
            typedef mnistcu__mc_dwl<BM, U> W;
            const int gq = lane >> 2, q4 = lane & 3, jz = 11 - warp, n0 = 8 * W::NW * (warp / W::WPB);
            const int mneed = (kn + 16) / 16;
            const bool fast = plain && !last;
#pragma unroll 1
            for (int m = 0; m < W::MW; ++m) {
                const int mt = W::MW * (warp % W::WPB) + m;
                float acc[W::NW][2][4];
                if (mt >= mneed) break;
                if (a.xb) mnistcu__mc_tc_dw<BM, U, true>(xc, dhall, mt, n0, lane, acc);
                else mnistcu__mc_tc_dw<BM, U, false>(xc, dhall, mt, n0, lane, acc);
                if (fast) {
#pragma unroll
                    for (int n = 0; n < W::NW; ++n)
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            const int k = 16 * mt + gq + 8 * (j >> 1), u = n0 + 8 * n + 2 * q4 + (j & 1);
                            float *w = k < kn ? w1s + k * LDW + u : b1s + u; /* x's ones: b1's */
                            const float gk = mnistcu__mc_sum3(acc[n], j) * (k < kn ? a.xsc : 1.0f);
                            if (u < nown && k <= kn) *w = fmaf(nlr, gk, *w);
                        }
                    continue;
                }
                float gvs[W::NW * 4]; /* the general steps (mnistcu__mc_w1_steps), one kind's loop */
#pragma unroll
                for (int n = 0; n < W::NW; ++n)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int k = 16 * mt + gq + 8 * (j >> 1);
                        gvs[4 * n + j] = mnistcu__mc_sum3(acc[n], j) * (k < kn ? a.xsc : 1.0f);
                    }
                const mnistcu__opt ow = sopt[a.sst ? 2 : 0];
#define MNISTCU__MC_STEPS(K_)                                                                                  \
    mnistcu__mc_w1_steps<BM, U, K_>(a, ow, &sopt[1], gvs, w1s, w1st, b1s, str + C * U, mt, n0, lane, kn, nown, k0, \
                                    u0, last, r)
                if (plain) MNISTCU__MC_STEPS(-1);
                else if (ow.kind == MNISTCU_OPTIM_ADAM || ow.kind == MNISTCU_OPTIM_ADAMW) MNISTCU__MC_STEPS(MNISTCU_OPTIM_ADAM);
                else if (ow.kind == MNISTCU_OPTIM_RMSPROP) MNISTCU__MC_STEPS(MNISTCU_OPTIM_RMSPROP);
                else if (ow.kind == MNISTCU_OPTIM_ADAGRAD) MNISTCU__MC_STEPS(MNISTCU_OPTIM_ADAGRAD);
                else MNISTCU__MC_STEPS(MNISTCU_OPTIM_SGD);
#undef MNISTCU__MC_STEPS
            }
            if (jz < W::NZ) {
                float az[2][4];
                mnistcu__mc_tc_dz<BM, U>(hall, dzall, jz, lane, az);
                if (fast) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int c = gq + 8 * (j >> 1), u = 8 * jz + 2 * q4 + (j & 1);
                        float *w = u < nown ? w2s + c * U + u : b2s + c; /* h's ones: b2's */
                        if (c < C && (u < nown || u == U)) *w = fmaf(nlr, mnistcu__mc_sum3(az, j), *w);
                    }
                } else {
                    float gz[4]; /* the general steps in a loop, as W1's */
#pragma unroll
                    for (int j = 0; j < 4; ++j) gz[j] = mnistcu__mc_sum3(az, j);
#pragma unroll 1
                    for (int j = 0; j < 4; ++j) {
                        const int c = gq + 8 * (j >> 1), u = 8 * jz + 2 * q4 + (j & 1);
                        float gv = gz[0];
#pragma unroll
                        for (int z = 1; z < 4; ++z) gv = j == z ? gz[z] : gv;
                        if (c >= C || (u >= nown && u != U)) continue;
                        if (u < nown) {
                            float *w = w2s + c * U + u;
                            *w = plain ? fmaf(nlr, gv, *w) : mnistcu__mc_step(&sopt[1], *w, gv, str + c * U + u);
                            if (last && r == 0) a.grads[mnistcu__mc_gi(a, c * U + u, U, u0)] = gv;
                        } else {
                            b2s[c] = plain ? fmaf(nlr, gv, b2s[c]) : mnistcu__mc_step(&sopt[1], b2s[c], gv, str + C * U + U + c);
                            if (last && r == 0 && g == 0) a.grads[a.b2 + c] = gv;
                        }
                    }
                }
            }
        }
        if (t < Rr) labs[((q + 1) & 1) * L::R + t] = labn;
        __syncthreads();
    }
    /* own parameters out: each block its W1 slice (and its state, from shared memory); block 0 of each
       cluster W2's columns, b1 and their state; block 0 of cluster 0 b2 and its state */
    for (e = t; e < kn * U; e += T) {
        const int k = e / U, u = e - k * U;
        const size_t gi = a.w1 + (size_t)(u0 + u) * D + k0 + k;
        int s;
        if (u >= nown) continue;
        a.params[gi] = w1s[k * LDW + u];
        if (a.sst)
            for (s = 0; s < a.slots; ++s) a.state[(size_t)s * a.np + gi] = w1st[s * L::SST + k * LDW + u];
    }
    if (r == 0)
        for (e = t; e < C * U + U + C; e += T) {
            const size_t gi = mnistcu__mc_gi(a, e, U, u0);
            int s;
            if (e < C * U ? e % U >= nown : e < C * U + U ? e - C * U >= nown : g != 0) continue;
            a.params[gi] = *mnistcu__mc_rep(w2s, b1s, b2s, e, C, U);
            for (s = 0; s < a.slots; ++s) a.state[(size_t)s * a.np + gi] = str[s * NREP + e];
        }
    cl.sync(); /* no block leaves while another may read its shared memory */
#else
    (void)a;
#endif
}

/* The statistics of steps [0, nsteps) from the rows the kernel left: loss sums and correct counts in row order */
__global__ void mnistcu__k_mc_stats(const float *rows, int nsteps, int B, int n, double *stats, size_t cap, size_t s0)
{
    MNISTCU__PDL_WAIT();
    const int q = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (q < nsteps) {
        const int b = min(B, n - q * B);
        double l = 0.0, c = 0.0;
        for (int i = 0; i < b; ++i) {
            l += (double)rows[(size_t)q * B + i];
            c += (double)rows[((size_t)nsteps + q) * B + i];
        }
        stats[s0 + q] = l;
        stats[cap + s0 + q] = c;
    }
}

typedef void (*mnistcu__mc_kernel)(mnistcu__mc_args);
/* The instance for batches of at most 32 or 64 and U units a cluster (8, 16, 32 or 64), with its shared memory */
static mnistcu__mc_kernel mnistcu__mc_pick(int bm, int u, size_t *bytes, int *slot)
{
    *slot = (bm == 64) * 4 + (u == 16) + 2 * (u == 32) + 3 * (u == 64);
#define MNISTCU__MC_CASE(BM_, U_)                                                                   \
    if (bm == BM_ && u == U_) {                                                                    \
        *bytes = (size_t)mnistcu__mc_lay<BM_, U_>::total * sizeof(float);                            \
        return mnistcu__k_mc<BM_, U_>;                                                              \
    }
    MNISTCU__MC_CASE(32, 8) MNISTCU__MC_CASE(32, 16) MNISTCU__MC_CASE(32, 32) MNISTCU__MC_CASE(32, 64)
    MNISTCU__MC_CASE(64, 8) MNISTCU__MC_CASE(64, 16) MNISTCU__MC_CASE(64, 32) MNISTCU__MC_CASE(64, 64)
#undef MNISTCU__MC_CASE
    *bytes = 0;
    return NULL;
}

/* ... and its shared memory with `slots` slots of W1's optimizer state in it too (mnistcu__mc_args.sst) */
static size_t mnistcu__mc_sst_bytes(int bm, int u, int slots)
{
#define MNISTCU__MC_CASE(BM_, U_)                                                                   \
    if (bm == BM_ && u == U_)                                                                      \
        return ((size_t)mnistcu__mc_lay<BM_, U_>::w1st + (size_t)slots * mnistcu__mc_lay<BM_, U_>::SST) * sizeof(float);
    MNISTCU__MC_CASE(32, 8) MNISTCU__MC_CASE(32, 16) MNISTCU__MC_CASE(32, 32) MNISTCU__MC_CASE(32, 64)
    MNISTCU__MC_CASE(64, 8) MNISTCU__MC_CASE(64, 16) MNISTCU__MC_CASE(64, 32) MNISTCU__MC_CASE(64, 64)
#undef MNISTCU__MC_CASE
    return 0;
}

/* The most clusters of instance k with `bytes` of shared memory a block resident at once on this
   device (cache entry `slot`), 0 where it cannot run: asked once a context, the queries cost more
   than an epoch's launch */
#if CUDART_VERSION >= 12010
static int mnistcu__mc_resident(mnistcu__cuda *cu, mnistcu__mc_kernel k, size_t bytes, int slot)
{
    if (!cu->mc_clusters[slot]) {
        cudaFuncAttributes fa;
        cudaLaunchConfig_t cfg = cudaLaunchConfig_t();
        cudaLaunchAttribute at[1];
        int major = 0, coop = 0, optin = 0, nc = 0;
        memset(&fa, 0, sizeof fa);
        memset(at, 0, sizeof at);
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = MNISTCU__MC_S;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)(MNISTCU__MC_G * MNISTCU__MC_S));
        cfg.blockDim = dim3(MNISTCU__MC_T);
        cfg.dynamicSmemBytes = bytes;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cu->device) != cudaSuccess ||
            major < 9 || cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, cu->device) != cudaSuccess ||
            !coop ||
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cu->device) != cudaSuccess ||
            (size_t)optin < bytes || cudaFuncGetAttributes(&fa, (const void *)k) != cudaSuccess ||
            fa.ptxVersion < 90 ||
            cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) !=
                cudaSuccess ||
            cudaOccupancyMaxActiveClusters(&nc, (const void *)k, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();
            nc = 0;
        }
        cu->mc_clusters[slot] = 1 + nc;
    }
    return cu->mc_clusters[slot] - 1;
}
#endif

/* Whether model m trains on ds at batch size B in the cluster kernel (the caller checked the device,
   the dataset's residence and kind, augmentation, l2, clipping and the precision): one hidden dense
   layer with a relu and biases, a dense output of at most 16 classes without activation, the
   softmax cross-entropy against class labels (no smoothing), inputs stored as bytes, at most 784 of
   them in words of 4, at most 1024 hidden units, batches of at most 64, and a device that runs the
   clusters (compute capability 9.0, a kernel built for it, G clusters resident at once). */
static int mnistcu__mc_plan(mnistcu_model *m, const mnistcu_dataset *ds, size_t B, size_t n,
                            const mnistcu_optim_desc *o, mnistcu__fused_plan *pl)
{
#if CUDART_VERSION >= 12010
    mnistcu__cuda *cu = mnistcu__cu(m->ctx);
    const mnistcu__cuda_dataset *dc = (const mnistcu__cuda_dataset *)ds->device_copy;
    const mnistcu__layer *L[2] = {NULL, NULL};
    int i, nl = 0, u, G, slot = 0;
    size_t D, H, C, bytes = 0;
    mnistcu__mc_kernel k;
    if (m->mode != MNISTCU_MODE_TRAIN || m->lossp.kind != MNISTCU_LOSS_SOFTMAX_CE || m->lossp.smoothing != 0.0f ||
        !ds->u8 || !dc || !dc->u8 || ((uintptr_t)dc->u8 & 3) || B < 1 || B > MNISTCU__MC_BMAX ||
        n > (size_t)INT_MAX / 2)
        return 0;
    for (i = 0; i < m->num_layers; ++i) {
        const mnistcu__layer *Li = &m->layers[i];
        if (Li->passthrough) continue;
        if (Li->d.kind != MNISTCU_LAYER_DENSE || nl == 2 || !Li->nb) return 0;
        L[nl++] = Li;
    }
    if (nl != 2 || L[0]->act != MNISTCU_ACT_RELU || L[1]->act != MNISTCU_ACT_IDENTITY) return 0;
    D = (size_t)L[0]->c;
    H = (size_t)L[0]->oc;
    C = (size_t)L[1]->oc;
    if (D != m->inputs || D % 4 || D > MNISTCU__MC_DMAX || D / 4 < MNISTCU__MC_S || (size_t)L[1]->c != H ||
        H > MNISTCU__MC_HMAX || C != m->classes || C > MNISTCU__MC_CM)
        return 0;
    pl->slots = mnistcu__opt_slots(o);
    if (pl->slots > 3) return 0;
    for (u = 8; (size_t)(16 * u) < H; u *= 2) {}
    G = (int)((H + (size_t)u - 1) / (size_t)u);
    k = mnistcu__mc_pick(B <= 32 ? 32 : 64, u, &bytes, &slot);
    if (!k) return 0;
    /* W1's optimizer state in shared memory where it fits beside the rest: each element is read and
       written at every step by one thread, one after another (its step follows the last one's stores,
       which may alias); 784-1024-10 trains 15-20% faster so with momentum or Adam (bench/RESULTS.md) */
    pl->mc_sst = pl->slots > 0 && mnistcu__mc_sst_bytes(B <= 32 ? 32 : 64, u, pl->slots) <= cu->smem_optin;
    if (pl->mc_sst) {
        bytes = mnistcu__mc_sst_bytes(B <= 32 ? 32 : 64, u, pl->slots);
        slot += 8 * pl->slots; /* an entry for each size the instance launches with */
    }
    if (pl->mc_sst && mnistcu__mc_resident(cu, k, bytes, slot) < G) { /* then without */
        pl->mc_sst = 0;
        slot &= 7;
        mnistcu__mc_pick(B <= 32 ? 32 : 64, u, &bytes, &slot);
    }
    if (mnistcu__mc_resident(cu, k, bytes, slot) < G) return 0;
    pl->mc = 1;
    pl->mc_bm = B <= 32 ? 32 : 64;
    pl->mc_u = u;
    pl->grid = G * MNISTCU__MC_S;
    pl->smem = bytes;
    pl->L1 = L[0];
    pl->L2 = L[1];
    pl->ok = 1;
    return 1;
#else
    (void)m; (void)ds; (void)B; (void)n; (void)o; (void)pl;
    return 0;
#endif
}

/* Steps [step0, step0 + nsteps) of the epoch in the cluster kernel, then their statistics; the
   optimizer's scalars are in cm->fused_opt already. */
static mnistcu_result mnistcu__mc_launch(mnistcu_model *m, const mnistcu_dataset *ds, const mnistcu__fused_plan *pl,
                                         size_t B, size_t n, size_t step0, size_t nsteps)
{
#if CUDART_VERSION >= 12010
    mnistcu_ctx *ctx = m->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    const mnistcu__cuda_dataset *dc = (const mnistcu__cuda_dataset *)ds->device_copy;
    const size_t pz = 2 * (size_t)MNISTCU__MC_S * MNISTCU__MC_G *
                      ((MNISTCU__MC_BMAX + MNISTCU__MC_S - 1) / MNISTCU__MC_S) * MNISTCU__MC_CM;
    mnistcu__mc_args a;
    mnistcu__mc_kernel k;
    cudaLaunchConfig_t cfg = cudaLaunchConfig_t();
    cudaLaunchAttribute at[2];
    void *args[1];
    size_t bytes = 0, rows = 2 * nsteps * B;
    int slot = 0;
    mnistcu_result r;
    cudaError_t e;
    if (!cm->mc_pz) { /* kept only once made and zeroed (step 0, which no step carries): a failure leaves none */
        unsigned long long *dz = NULL;
        if ((r = mnistcu__cuda_malloc(ctx, (void **)&dz, pz * sizeof *dz, "cluster kernel's partial logits"))) return r;
        if ((e = cudaMemsetAsync(dz, 0, pz * sizeof *dz, cu->stream)) != cudaSuccess) {
            mnistcu__cuda_free(ctx, dz);
            return mnistcu__cuda_check(ctx, e, "cluster kernel's partial logits");
        }
        cm->mc_pz = dz;
        cm->mc_step = 0;
    }
    if (rows > cm->mc_rows_cap) {
        float *d = NULL;
        if ((r = mnistcu__cuda_malloc(ctx, (void **)&d, rows * sizeof(float), "cluster kernel's rows"))) return r;
        cudaStreamSynchronize(cu->stream);
        mnistcu__cuda_free(ctx, cm->mc_rows);
        cm->mc_rows = d;
        cm->mc_rows_cap = rows;
    }
    k = mnistcu__mc_pick(pl->mc_bm, pl->mc_u, &bytes, &slot);
    if (pl->mc_sst) slot += 8 * pl->slots;
    bytes = pl->smem;
    memset(&a, 0, sizeof a);
    a.x = dc->u8;
    a.lab = dc->labels;
    a.idx = cm->idx + step0 * B;
    a.n = (int)(n - step0 * B);
    a.B = (int)B;
    a.D = pl->L1->c;
    a.H = pl->L1->oc;
    a.C = pl->L2->oc;
    a.nsteps = (int)nsteps;
    a.lsum = m->lossp.sum != 0;
    a.slots = pl->slots;
    a.sst = pl->mc_sst;
    a.step0 = cm->mc_step;
    mnistcu__norm_for(m, ds, &a.scale, &a.shift);
    a.xb = a.shift == 0.0f;
    a.xsc = a.xb ? a.scale : 1.0f;
    if (a.xb) a.scale = 1.0f;
    a.params = m->params;
    a.grads = m->grads;
    a.state = m->state;
    a.np = m->num_params;
    a.w1 = pl->L1->wo;
    a.b1 = pl->L1->bo;
    a.w2 = pl->L2->wo;
    a.b2 = pl->L2->bo;
    a.opt = cm->fused_opt;
    a.nops = (int)cm->fused_nops;
    a.pz = cm->mc_pz;
    a.rows = cm->mc_rows;
    args[0] = &a;
    memset(at, 0, sizeof at);
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = MNISTCU__MC_S;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeCooperative; /* every cluster resident at once, or no launch: the blocks wait
                                                  on each other's flags */
    at[1].val.cooperative = 1;
    cfg.gridDim = dim3((unsigned)pl->grid);
    cfg.blockDim = dim3(MNISTCU__MC_T);
    cfg.dynamicSmemBytes = bytes;
    cfg.stream = cu->stream;
    cfg.attrs = at;
    cfg.numAttrs = 2;
    /* the instance's limit as this launch needs it: the plan's query set it, for this size or another */
    e = cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess) e = cudaLaunchKernelExC(&cfg, (const void *)k, args);
    if (e != cudaSuccess) { /* not resident after all (another process's work, say): off for this context,
                               so the next training takes another path */
        cu->mc_clusters[slot] = 1;
        return mnistcu__cuda_check(ctx, e, "the cluster MLP kernel (it is now off for this context)");
    }
    cm->mc_step += (unsigned)nsteps; /* launched: its partial logits will carry these steps */
    MNISTCU__LAUNCHED(ctx, "fused_mlp_clusters");
    mnistcu__launch(mnistcu__k_mc_stats, dim3((unsigned)((nsteps + 127) / 128)), dim3(128), 0, cu->stream,
                    (const float *)cm->mc_rows, (int)nsteps, (int)B, a.n, cm->stats, cm->stats_cap, step0);
    MNISTCU__LAUNCHED(ctx, "fused_mlp_clusters_stats");
    return MNISTCU_OK;
#else
    (void)m; (void)ds; (void)pl; (void)B; (void)n; (void)step0; (void)nsteps;
    return mnistcu__fail(m->ctx, MNISTCU_ERR_UNSUPPORTED, "the cluster MLP kernel needs CUDA 12.1");
#endif
}

/* Whether (and how) the fused kernel can train model m on ds at batch size B:
   one hidden layer, the own kernels, a resident labelled dataset, no
   augmentation, gradient clipping or l2 penalty, the unfused products unsplit
   (so that the chains are the same), and shared memory enough for a batch. */
static void mnistcu__fused_plan_make(mnistcu_model *m, const mnistcu_dataset *ds, size_t B, size_t n,
                                     const mnistcu_optim_desc *o, int aug_on, int cnn, int clusters,
                                     mnistcu__fused_plan *pl)
{
    mnistcu__cuda *cu = mnistcu__cu(m->ctx);
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    const mnistcu__layer *L[2] = {NULL, NULL};
    int i, nl = 0, sms = 0, coop = 0, optin = 0, per_sm = 0, small, last;
    size_t D, H, C, nu, per, bytes, tail = n % B;
    memset(pl, 0, sizeof *pl);
    if (m->device != MNISTCU_DEVICE_CUDA || !cm || cm->streaming || !ds->device_copy || ds->targets || aug_on ||
        o->l2 != 0.0f || o->clip_norm != 0.0f || cu->precision != MNISTCU_PRECISION_FP32)
        return;
    if (cnn && mnistcu__lenet_plan(m, B, o, pl)) return;
    if (clusters && mnistcu__mc_plan(m, ds, B, n, o, pl)) return;
    memset(pl, 0, sizeof *pl);
#ifdef MNISTCU_CUBLAS
    if (cu->use_cublas) return;
#endif
    for (i = 0; i < m->num_layers; ++i) {
        const mnistcu__layer *Li = &m->layers[i];
        if (Li->passthrough) continue;
        if (Li->d.kind != MNISTCU_LAYER_DENSE || nl == 2) return;
        L[nl++] = Li;
    }
    if (nl != 2) return;
    D = (size_t)L[0]->c;
    H = (size_t)L[0]->oc;
    C = (size_t)L[1]->oc;
    if (D != m->inputs || (size_t)L[1]->c != H || C != m->classes || D > 65536 || H > 65536 || C > 65536 ||
        B > 4096)
        return;
    /* every product as the unfused path makes it: one chain per output (either tile kernel); W1's
       gradient not in the skinny kernel's slices (at most MNISTCU__SKINNY_M units: the kernel follows
       those slices for W2's gradient only; 16 units over 256 inputs were measured to differ in the last
       bits, bench/fused_parity.cu) */
    for (last = 0; last < 2; ++last) {
        size_t b = last ? (tail ? tail : B) : B;
        if (mnistcu__skinny_shape(H, D, b) || mnistcu__gemm_split(b, H, D, &small) > 1 ||
            mnistcu__gemm_split(b, C, H, &small) > 1 || mnistcu__gemm_split(C, H, b, &small) > 1 ||
            mnistcu__gemm_split(H, D, b, &small) > 1 || mnistcu__gemm_split(b, H, C, &small) > 1 ||
            mnistcu__gemm_wide_split(b, H, D) > 1 ||
            mnistcu__gemm_wide_split(b, C, H) > 1 || mnistcu__gemm_wide_split(C, H, b) > 1 ||
            mnistcu__gemm_wide_split(H, D, b) > 1 || mnistcu__gemm_wide_split(b, H, C) > 1)
            return;
    }
    if (cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, cu->device) != cudaSuccess || !coop ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cu->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cu->device) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    /* one block per multiprocessor (the shared batch is large), the units shared out evenly */
    nu = (H + (size_t)sms - 1) / (size_t)sms;
    pl->grid = (int)((H + nu - 1) / nu);
    per = (B * C + (size_t)pl->grid - 1) / (size_t)pl->grid;
    pl->slots = mnistcu__opt_slots(o);
    {
        mnistcu__fused_layout l;
        mnistcu__fused_layout_make((int)B, (int)D, (int)H, (int)C, (int)nu, (int)per, pl->slots, &l);
        bytes = l.total * sizeof(float);
    }
    if (per > MNISTCU__THREADS || bytes + MNISTCU__THREADS / 16 * sizeof(double) > (size_t)optin) return;
    /* bytes, whole 16-byte rows, few enough to keep the next batch in registers */
    pl->prefetch = ds->u8 && D % 16 == 0 && B * (D / 16) <= (size_t)MNISTCU__FUSED_PV * MNISTCU__THREADS;
    if (cudaFuncSetAttribute(mnistcu__k_fused_mlp, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mnistcu__k_fused_mlp, MNISTCU__THREADS, bytes) !=
            cudaSuccess ||
        (size_t)per_sm * (size_t)sms < (size_t)pl->grid) {
        (void)cudaGetLastError();
        return;
    }
    pl->nu_max = (int)nu;
    pl->per_max = (int)per;
    pl->smem = bytes;
    pl->L1 = L[0];
    pl->L2 = L[1];
    pl->ok = 1;
}

/* Steps [step0, step0 + nsteps) of the epoch, with ops[nsteps] the optimizer's
   scalars of each (host memory). */
static mnistcu_result mnistcu__cuda_fused_steps(mnistcu_model *m, const mnistcu_dataset *ds,
                                                const mnistcu__fused_plan *pl, const mnistcu__opt *ops, size_t nops,
                                                size_t B, size_t n, size_t step0, size_t nsteps)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    const mnistcu__cuda_dataset *dc = (const mnistcu__cuda_dataset *)ds->device_copy;
    mnistcu__fused_args a;
    void *args[1];
    mnistcu_result r;
    cudaError_t e;
    if ((r = mnistcu__cuda_alive(ctx))) return r;
    if (pl->lenet && !cm->lenet &&
        (r = mnistcu__cuda_malloc(ctx, (void **)&cm->lenet, (mnistcu__lenet_floats() + 4) * sizeof(float),
                                  "fused LeNet-5 rows")))
        return r;
    if (!nops || nops > nsteps)
        return mnistcu__fail(ctx, MNISTCU_ERR_INVALID_ARGUMENT, "fused steps: %lu scalars for %lu steps",
                             (unsigned long)nops, (unsigned long)nsteps);
    if (nops > cm->fused_cap) {
        mnistcu__opt *d = NULL;
        if ((r = mnistcu__cuda_malloc(ctx, (void **)&d, nops * sizeof(mnistcu__opt), "fused step scalars")))
            return r;
        cudaStreamSynchronize(cu->stream);
        mnistcu__cuda_free(ctx, cm->fused_opt);
        cm->fused_opt = d;
        cm->fused_cap = nops;
        cm->fused_last_n = 0;
    }
    cm->fused_nops = nops;
    if (nops != cm->fused_last_n || memcmp(cm->fused_last, ops, nops * sizeof *ops) != 0) {
        /* ops may be pinned (an allocation hook's choice), when the copy would read it after the caller
           frees it: wait for it, at a chunk's start, where the report before has emptied the stream anyway */
        cm->fused_last_n = 0;
        e = cudaMemcpyAsync(cm->fused_opt, ops, nops * sizeof(mnistcu__opt), cudaMemcpyHostToDevice, cu->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream);
        if (e != cudaSuccess) return mnistcu__cuda_check(ctx, e, "fused step scalars");
        if (nops <= 2) {
            memcpy(cm->fused_last, ops, nops * sizeof *ops);
            cm->fused_last_n = nops;
        }
    }
    if (pl->lenet) return mnistcu__lenet_launch(m, ds, pl, B, n, step0, nsteps);
    if (pl->mc) return mnistcu__mc_launch(m, ds, pl, B, n, step0, nsteps);
    memset(&a, 0, sizeof a);
    a.u8 = dc->u8;
    a.f32 = dc->f32;
    a.labels = dc->labels;
    a.idx = cm->idx;
    a.n = n;
    a.step0 = step0;
    a.nsteps = (int)nsteps;
    a.B = (int)B;
    a.D = pl->L1->c;
    a.H = pl->L1->oc;
    a.C = pl->L2->oc;
    a.act1 = (int)pl->L1->act;
    a.act2 = (int)pl->L2->act;
    a.has_b1 = pl->L1->nb != 0;
    a.has_b2 = pl->L2->nb != 0;
    a.prefetch = pl->prefetch;
    a.slots = pl->slots;
    a.np = m->num_params;
    a.nu_max = pl->nu_max;
    a.per_max = pl->per_max;
    mnistcu__norm_for(m, ds, &a.scale, &a.shift);
    a.params = m->params;
    a.grads = m->grads;
    a.state = m->state;
    a.w1 = pl->L1->wo;
    a.b1 = pl->L1->bo;
    a.w2 = pl->L2->wo;
    a.b2 = pl->L2->bo;
    a.h = pl->L1->out;
    a.z = pl->L2->out;
    a.opt = cm->fused_opt;
    a.nops = (int)cm->fused_nops;
    a.lp = m->lossp;
    a.stats = cm->stats;
    a.stats_cap = cm->stats_cap;
    args[0] = &a;
    e = cudaLaunchCooperativeKernel((const void *)mnistcu__k_fused_mlp, dim3((unsigned)pl->grid),
                                    dim3(MNISTCU__THREADS), args, pl->smem, cu->stream);
    if (e != cudaSuccess) return mnistcu__cuda_check(ctx, e, "the fused MLP kernel");
    MNISTCU__LAUNCHED(ctx, "fused_mlp");
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
        /* and one more: the head's ticket (>>cuda_head), 0 */
        if ((r = mnistcu__cuda_malloc(ctx, (void **)&d, (2 * steps + 1) * sizeof(double), "step statistics")))
            return r;
        if ((e = cudaMemsetAsync(d + 2 * steps, 0, sizeof(double), cu->stream)) != cudaSuccess) {
            mnistcu__cuda_free(ctx, d);
            return mnistcu__cuda_check(ctx, e, "step statistics");
        }
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
    bytes += 32 + B * ds->target_dim * sizeof(float); /* labels, then targets, follow the features, 16-byte aligned */
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
                                           float scale, float shift, const mnistcu__aug *aug)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    size_t F = ds->features, n = B * F;
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(ctx))) return r;
    if (!cm->streaming) {
        const mnistcu__cuda_dataset *dc = (const mnistcu__cuda_dataset *)ds->device_copy;
        if (aug) {
            mnistcu__launch(mnistcu__k_gather_augment, (unsigned)B, MNISTCU__THREADS, aug->elastic ? 16 * F : 0, cu->stream,
                *aug, dc->u8, dc->labels, dc->targets, (int)ds->target_dim, cm->idx, offset, ds->rows, ds->cols,
                m->steps, scale, shift, m->input, m->labels, m->targets, mnistcu__cuda_dyn(m));
            MNISTCU__LAUNCHED(ctx, "gather_augment");
            return MNISTCU_OK;
        }
        if (mnistcu__gather4_ok(dc->u8, dc->targets, F, m->input)) {
            mnistcu__launch(mnistcu__k_gather4, mnistcu__blocks(n / 4), MNISTCU__THREADS, 0, cu->stream, dc->u8,
                            dc->labels, cm->idx, offset, (int)B, (int)F, scale, shift, m->input, m->labels,
                            mnistcu__cuda_dyn(m));
            MNISTCU__LAUNCHED(ctx, "gather");
            return MNISTCU_OK;
        }
        mnistcu__launch(mnistcu__k_gather, mnistcu__blocks(n), MNISTCU__THREADS, 0, cu->stream,
            dc->u8, dc->f32, dc->labels, dc->targets, (int)ds->target_dim, cm->idx, offset, (int)B, (int)F, scale, shift,
            m->input, m->labels, m->targets, mnistcu__cuda_dyn(m));
        MNISTCU__LAUNCHED(ctx, "gather");
        return MNISTCU_OK;
    } else {
        int s = (int)(cm->step_counter++ % MNISTCU__STREAM_SLOTS);
        size_t esize = ds->u8 ? 1 : sizeof(float), fbytes = n * esize, lab_off = (fbytes + 15) & ~(size_t)15, i;
        size_t tgt_off = lab_off + ((B * sizeof(int32_t) + 15) & ~(size_t)15), T = ds->target_dim;
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
            if (T) memcpy(host + tgt_off + i * T * sizeof(float), ds->targets + smp * T, T * sizeof(float));
        }
        e = cudaMemcpyAsync(cm->staged[s], host, T ? tgt_off + B * T * sizeof(float) : lab_off + B * sizeof(int32_t),
                            cudaMemcpyHostToDevice, cu->copy_stream);
        if (e == cudaSuccess) e = cudaEventRecord(cm->copied[s], cu->copy_stream);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(cu->stream, cm->copied[s], 0);
        if (e != cudaSuccess) return mnistcu__cuda_check(ctx, e, "streaming a batch");
        {
            const unsigned char *dev = (const unsigned char *)cm->staged[s];
            if (aug) {
                mnistcu__launch(mnistcu__k_gather_augment, (unsigned)B, MNISTCU__THREADS, aug->elastic ? 16 * F : 0, cu->stream,
                    *aug, dev, (const int32_t *)(dev + lab_off), T ? (const float *)(dev + tgt_off) : NULL, (int)T, NULL,
                    0, ds->rows, ds->cols, m->steps, scale, shift, m->input, m->labels, m->targets, NULL);
                MNISTCU__LAUNCHED(ctx, "gather_augment (streamed)");
            } else {
                mnistcu__launch(mnistcu__k_gather, mnistcu__blocks(n), MNISTCU__THREADS, 0, cu->stream,
                    ds->u8 ? dev : NULL, ds->u8 ? NULL : (const float *)dev, (const int32_t *)(dev + lab_off),
                    T ? (const float *)(dev + tgt_off) : NULL, (int)T, NULL, 0, (int)B, (int)F, scale, shift, m->input,
                    m->labels, m->targets, NULL);
                MNISTCU__LAUNCHED(ctx, "gather (streamed)");
            }
        }
        cm->slot_used[s] = 1;
        return mnistcu__cuda_check(ctx, cudaEventRecord(cm->consumed[s], cu->stream), "streaming a batch");
    }
}

static mnistcu_result mnistcu__cuda_step_stats(mnistcu_model *m, size_t B, size_t step)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    const mnistcu__dyn *dyn = mnistcu__cuda_dyn(m);
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    if (dyn) step = 0; /* the kernel adds the step's slot */
    mnistcu__launch(mnistcu__k_step_stats, 1, MNISTCU__THREADS, 0, mnistcu__cu(m->ctx)->stream,
        m->sample_loss, m->pred, m->labels, (int)B, cm->stats + step, cm->stats + cm->stats_cap + step, dyn);
    MNISTCU__LAUNCHED(m->ctx, "step_stats");
    return MNISTCU_OK;
}

/* >>cuda_graph ------------------------------------------------------------------
   The training step as a CUDA graph. Launched one by one, a step's kernels
   (gather, each layer forward, loss, statistics, each layer backward, the
   optimizer: a dozen for an MLP, thirty for a CNN) each cost the host a launch
   and the GPU a gap; captured once into a graph and replayed, the whole step is
   one launch and its kernels follow each other with the driver's smallest gaps.
   What differs between steps (the batch's offset in the sample order, the step
   counter of dropout and augmentation, the statistics slot, the optimizer's
   scalars) is read on the device: the host writes the values of every step up
   to the next report into an array (mnistcu__dyn) once, and the graph's first
   kernel copies the next entry to where the step's kernels read it and moves a
   cursor. So replays need no host work but the launch. Each batch size has its
   graph: full batches, and an epoch's partial last batch, captured the first
   time each size comes (after one launched step of that size, which grows every
   lazily made buffer, since a capture cannot allocate). A graph holds the
   addresses of every buffer it touches: it is captured again when any device
   buffer of the context was freed since (mnistcu__cuda.frees), and dropped when
   mnistcu_train returns. The replayed kernels are the launched ones with the
   same arguments, so the results are the same bits (the GPU tests compare them,
   for every layer kind). Where capturing fails (a cuDNN call that will not be
   captured, say), the rest of the call runs launched, with a note in the log.
   The host-side effects of a step (the model's step counters, batch norm's
   batch count, dropout's step) are applied by mnistcu__step_host_effects:
   a layer kind whose forward or backward changes host state must be listed there. */
__global__ void mnistcu__k_step_begin(mnistcu__dyn *dyn, size_t cap)
{
    MNISTCU__PDL_WAIT();
    unsigned long long *cursor = (unsigned long long *)(dyn + cap + 1);
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        dyn[cap] = dyn[*cursor];
        *cursor += 1;
    }
}

static const mnistcu__dyn *mnistcu__cuda_dyn(const mnistcu_model *m)
{
    const mnistcu__cuda_model *cm = (const mnistcu__cuda_model *)m->cuda;
    return cm ? cm->dyn_cur : NULL;
}

/* Can this model's steps run as graphs now? Not with batches streamed from the
   host (the host fills each one), nor with a synchronisation after every launch. */
static int mnistcu__cuda_graph_usable(const mnistcu_model *m)
{
#ifdef MNISTCU_DEBUG_SYNC
    (void)m;
    return 0;
#else
    const mnistcu__cuda_model *cm = (const mnistcu__cuda_model *)m->cuda;
    return m->device == MNISTCU_DEVICE_CUDA && cm && !cm->streaming;
#endif
}

static void mnistcu__cuda_graphs_reset(mnistcu_model *m)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    int i;
    if (!cm) return;
    for (i = 0; i < 2; ++i)
        if (cm->graphs[i].exec) cudaGraphExecDestroy(cm->graphs[i].exec);
    memset(cm->graphs, 0, sizeof cm->graphs);
    cm->dyn_cur = NULL;
}

/* The per-step values of the next count steps, to the device; the cursor to the
   first. cap: the most steps a chunk will have (room is made for that many). */
static mnistcu_result mnistcu__cuda_dyn_upload(mnistcu_model *m, const mnistcu__dyn *h, size_t count, size_t cap)
{
    mnistcu_ctx *ctx = m->ctx;
    mnistcu__cuda *cu = mnistcu__cu(ctx);
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    mnistcu_result r;
    cudaError_t e;
    if ((r = mnistcu__cuda_alive(ctx))) return r;
    if (cap < count) cap = count;
    if (cap > cm->dyn_cap) {
        mnistcu__dyn *d = NULL;
        if ((r = mnistcu__cuda_malloc(ctx, (void **)&d, (cap + 1) * sizeof(mnistcu__dyn) + sizeof(unsigned long long),
                                      "per-step values")))
            return r;
        cudaStreamSynchronize(cu->stream);
        mnistcu__cuda_free(ctx, cm->dyn); /* a graph holding the old address is captured again */
        cm->dyn = d;
        cm->dyn_cap = cap;
    }
    /* h may be pinned (an allocation hook's choice), when the copy would read it later: wait for it,
       at a chunk's start, where the report before has emptied the stream anyway */
    e = cudaMemcpyAsync(cm->dyn, h, count * sizeof(mnistcu__dyn), cudaMemcpyHostToDevice, cu->stream);
    if (e == cudaSuccess)
        e = cudaMemsetAsync((void *)(cm->dyn + cm->dyn_cap + 1), 0, sizeof(unsigned long long), cu->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream);
    return mnistcu__cuda_check(ctx, e, "per-step values");
}

/* A launched step takes its entry too, so the cursor stays with the steps. */
static mnistcu_result mnistcu__cuda_step_begin(mnistcu_model *m)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    mnistcu__launch(mnistcu__k_step_begin, 1, 32, 0, mnistcu__cu(m->ctx)->stream, cm->dyn, cm->dyn_cap);
    MNISTCU__LAUNCHED(m->ctx, "step_begin");
    return MNISTCU_OK;
}

/* The graph for batches of b (partial: an epoch's last batch, smaller), NULL
   in *g->exec when none is captured or the one captured is stale. */
static mnistcu__step_graph *mnistcu__cuda_graph_for(mnistcu_model *m, size_t b, int partial)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    mnistcu__step_graph *g = &cm->graphs[partial ? 1 : 0];
    if (g->b != b || g->frees != mnistcu__cu(m->ctx)->frees || g->head_off != m->head_off ||
        g->upd_off != m->upd_off) {
        /* another size, a buffer freed since, or the head or the fused update turned on or off */
        if (g->exec) cudaGraphExecDestroy(g->exec);
        memset(g, 0, sizeof *g);
        g->b = b;
        g->frees = mnistcu__cu(m->ctx)->frees;
        g->head_off = m->head_off;
        g->upd_off = m->upd_off;
    }
    return g;
}

/* Capturing: what the step's host code launches from here on is recorded, not run. */
static mnistcu_result mnistcu__cuda_capture_begin(mnistcu_model *m)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    cudaStream_t st = mnistcu__cu(m->ctx)->stream;
    cudaError_t e;
#ifdef MNISTCU_CUBLAS
    /* made here too: a step may capture before its first cuBLAS product (the skinny kernel takes a model's only
       weight gradient, cuDNN its convolutions) */
    if (mnistcu__cu(m->ctx)->use_cublas) mnistcu__cuda_blas_workspace(m->ctx);
    if (mnistcu__cu(m->ctx)->use_cublas && !mnistcu__cu(m->ctx)->blas_ws) /* cuBLAS would allocate, or choose anew */
        return mnistcu__fail(m->ctx, MNISTCU_ERR_CUBLAS, "cuBLAS has no workspace of ours");
#endif
    e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return mnistcu__cuda_check(m->ctx, e, "capturing a step");
    mnistcu__launch(mnistcu__k_step_begin, 1, 32, 0, st, cm->dyn, cm->dyn_cap);
    cm->dyn_cur = cm->dyn + cm->dyn_cap;
    return MNISTCU_OK;
}

/* Ends the capture begun above; ok: the step's host code succeeded. On success
   g holds the graph, else (*why says what failed) nothing was captured, and
   nothing of the step ran. */
static int mnistcu__cuda_capture_end(mnistcu_model *m, mnistcu__step_graph *g, int ok, const char **why)
{
    mnistcu__cuda_model *cm = (mnistcu__cuda_model *)m->cuda;
    cudaStream_t st = mnistcu__cu(m->ctx)->stream;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamEndCapture(st, &graph);
    size_t nodes = 0;
    cm->dyn_cur = NULL;
    *why = NULL;
    if (!ok) *why = "a call of the step failed while captured";
    else if (e != cudaSuccess || !graph) *why = cudaGetErrorString(e != cudaSuccess ? e : cudaErrorUnknown);
    else if ((e = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess) *why = cudaGetErrorString(e);
    if (graph) {
        if (!*why) cudaGraphGetNodes(graph, NULL, &nodes);
        cudaGraphDestroy(graph);
    }
    (void)cudaGetLastError(); /* a failed capture's errors are not the device's */
    if (*why) return 0;
    g->exec = exec;
    g->nodes = (int)nodes;
    g->frees = mnistcu__cu(m->ctx)->frees;
    return 1;
}

static mnistcu_result mnistcu__cuda_graph_launch(mnistcu_model *m, const mnistcu__step_graph *g)
{
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    return mnistcu__cuda_check(m->ctx, cudaGraphLaunch(g->exec, mnistcu__cu(m->ctx)->stream), "a step's graph");
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

/* The flags: the device's, unless kept from the last training (mnistcu__finite_end); the host's, the
   context's (one check runs at a time: each reads its flag before another can queue one) */
static mnistcu_result mnistcu__cuda_finite_begin(mnistcu_model *m, mnistcu__finite_guard *g)
{
    mnistcu__cuda *cu = mnistcu__cu(m->ctx);
    cudaError_t e;
    mnistcu_result r;
    if (!g->dev_flags &&
        (r = mnistcu__cuda_malloc(m->ctx, (void **)&g->dev_flags, (MNISTCU__FINITE_BLOCKS + 1) * sizeof(int),
                                  "divergence check flags")))
        return r;
    if (!cu->finite_flag && (e = cudaMallocHost((void **)&cu->finite_flag, sizeof(int))) != cudaSuccess) {
        cu->finite_flag = NULL;
        return mnistcu__cuda_check(m->ctx, e, "divergence check: pinned flag");
    }
    g->host_flag = cu->finite_flag;
    *g->host_flag = 0;
    return MNISTCU_OK;
}

static void mnistcu__cuda_finite_end(mnistcu_model *m, mnistcu__finite_guard *g)
{
    mnistcu_ctx *ctx = m->ctx;
    /* the flag's copy may still be queued */
    if (g->host_flag && mnistcu__cu(ctx)->sticky == cudaSuccess) cudaStreamSynchronize(mnistcu__cu(ctx)->stream);
    mnistcu__cuda_free(ctx, g->dev_flags);
    g->dev_flags = NULL;
    g->host_flag = NULL; /* the context's */
}

/* Queues the check of every parameter and the copy of its flag to the host;
   the synchronisation that reads the statistics next brings it back. */
static mnistcu_result mnistcu__cuda_finite_queue(mnistcu_model *m, mnistcu__finite_guard *g)
{
    cudaStream_t st = mnistcu__cu(m->ctx)->stream;
    int *flag = g->dev_flags + MNISTCU__FINITE_BLOCKS;
    mnistcu_result r;
    if ((r = mnistcu__cuda_alive(m->ctx))) return r;
    mnistcu__launch(mnistcu__k_finite_partial, MNISTCU__FINITE_BLOCKS, MNISTCU__THREADS, 0, st, m->params, m->num_params,
                                                                                   g->dev_flags);
    MNISTCU__LAUNCHED(m->ctx, "finite_partial");
    mnistcu__launch(mnistcu__k_finite_flag, 1, MNISTCU__THREADS, 0, st, g->dev_flags, MNISTCU__FINITE_BLOCKS, flag);
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
