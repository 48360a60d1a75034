/* tests/fuzz_idx.c - a libFuzzer target for the IDX loader and the gzip and
   deflate decoders: whatever the bytes, they must not crash, hang, read or
   write out of bounds, overflow or leak, and a failure must leave no output.
   The IDX loader must also keep its memory bound: on gzip data no allocation
   above what the input can expand to (deflate's 1032 to 1), since the header
   sizes the output and a header that claims more is refused at once.

   Build and run with clang (seeds: sh tests/make_fuzz_corpus.sh fuzz-corpus):
       clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz_idx.c -o fuzz_idx
       ./fuzz_idx -max_total_time=60 fuzz-corpus
   Without libFuzzer, a replay driver that runs every file named on its
   command line (for example the crash-* files libFuzzer leaves):
       gcc -g -O1 -fsanitize=address,undefined -DMNISTCU_FUZZ_STANDALONE tests/fuzz_idx.c -o fuzz_replay -lm
       ./fuzz_replay crash-1234...  */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The decoders may ask for up to MNISTCU_IDX_MAX_BYTES (1 GiB); refusing more
   than this keeps the fuzzer within its memory limit and exercises the
   out-of-memory paths. */
#define FUZZ_MAX_ALLOC ((size_t)64 << 20)
#define FUZZ_MAX_OUT ((size_t)1 << 20) /* max_out for gunzip and inflate */

static size_t fuzz_largest; /* the largest allocation asked for since it was reset */

static void *fuzz_alloc(void *user, size_t size)
{
    (void)user;
    if (size > fuzz_largest) fuzz_largest = size;
    return size > FUZZ_MAX_ALLOC ? NULL : malloc(size);
}

static void fuzz_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

/* One silent context for the whole run. */
static mnistcu_ctx *fuzz_ctx;

static mnistcu_ctx *fuzz_get_ctx(void)
{
    if (!fuzz_ctx) {
        mnistcu_ctx_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.device = MNISTCU_DEVICE_CPU;
        desc.log_level = MNISTCU_LOG_SILENT;
        desc.allocator.alloc = fuzz_alloc;
        desc.allocator.free = fuzz_free;
        if (mnistcu_ctx_create(&fuzz_ctx, &desc) != MNISTCU_OK) {
            mnistcu_ctx_destroy(fuzz_ctx);
            fuzz_ctx = NULL;
        }
    }
    return fuzz_ctx;
}

/* A broken promise of the API is a bug: stop so the fuzzer records the input. */
static void fuzz_check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_idx: %s\n", what);
        abort();
    }
}

/* Reads every output byte, so that the sanitizers check the whole buffer. */
static unsigned fuzz_touch(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    unsigned sum = 0;
    size_t i;
    for (i = 0; i < n; ++i) sum += b[i];
    return sum;
}

#ifdef __cplusplus
extern "C"
#endif
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef __cplusplus
extern "C"
#endif
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mnistcu_ctx *ctx = fuzz_get_ctx();
    mnistcu_idx idx;
    void *out = NULL;
    size_t out_size = 0, used = 0, small_max;
    volatile unsigned sink = 0;
    mnistcu_result r;

    if (!ctx) return 0;

    /* The IDX loader (raw, or gzip when the data starts with 1f 8b). Raw data
       needs at most its own size; gzip data at most 1032 times its size, plus
       the small buffers used before the header is out (a first stored block
       can hold 65535 bytes). */
    fuzz_largest = 0;
    r = mnistcu_idx_load_memory(ctx, data, size, "fuzz", &idx);
    fuzz_check(fuzz_largest <= size * 1032 + 65536 + 4096, "the IDX loader asked for more than the input can hold");
    if (r == MNISTCU_OK) {
        fuzz_check(idx.ndim >= 1 && idx.ndim <= MNISTCU_IDX_MAX_DIMS && idx.data != NULL, "bad idx after OK");
        sink += fuzz_touch(idx.data, idx.count * idx.elem_size);
        mnistcu_idx_free(ctx, &idx);
    } else {
        fuzz_check(idx.data == NULL && idx.count == 0 && idx.ndim == 0, "idx not zeroed after an error");
        fuzz_check(mnistcu_ctx_error(ctx)[0] != '\0', "no error message");
    }

    /* gzip. */
    if (mnistcu_gunzip(ctx, data, size, FUZZ_MAX_OUT, &out, &out_size) == MNISTCU_OK) {
        fuzz_check(out != NULL && out_size <= FUZZ_MAX_OUT, "bad gunzip output");
        sink += fuzz_touch(out, out_size);
        mnistcu_free(ctx, out);
    } else {
        fuzz_check(out == NULL && out_size == 0, "gunzip output after an error");
    }

    /* Raw deflate, with the usual limit and with a small one taken from the size. */
    if (mnistcu_inflate(ctx, data, size, FUZZ_MAX_OUT, &out, &out_size, &used) == MNISTCU_OK) {
        fuzz_check(out != NULL && out_size <= FUZZ_MAX_OUT && used <= size && used > 0, "bad inflate output");
        sink += fuzz_touch(out, out_size);
        mnistcu_free(ctx, out);
    } else {
        fuzz_check(out == NULL && out_size == 0, "inflate output after an error");
    }
    small_max = 1 + size % 300;
    if (mnistcu_inflate(ctx, data, size, small_max, &out, &out_size, NULL) == MNISTCU_OK) {
        fuzz_check(out != NULL && out_size <= small_max, "inflate output above max_out");
        mnistcu_free(ctx, out);
    } else {
        fuzz_check(out == NULL && out_size == 0, "inflate output after an error");
    }
    (void)sink;
    return 0;
}

#ifdef MNISTCU_FUZZ_STANDALONE
/* Replays the files named on the command line. */
int main(int argc, char **argv)
{
    int i, ran = 0;
    for (i = 1; i < argc; ++i) {
        FILE *f = fopen(argv[i], "rb");
        unsigned char *buf = NULL;
        size_t len = 0, cap = 0, got;
        if (!f) {
            fprintf(stderr, "%s: cannot open\n", argv[i]);
            continue;
        }
        do {
            if (len == cap) {
                unsigned char *bigger = (unsigned char *)realloc(buf, cap ? cap * 2 : 4096);
                if (!bigger) break;
                buf = bigger;
                cap = cap ? cap * 2 : 4096;
            }
            got = fread(buf + len, 1, cap - len, f);
            len += got;
        } while (got > 0);
        fclose(f);
        LLVMFuzzerTestOneInput(buf ? buf : (const unsigned char *)"", len);
        free(buf);
        ran++;
    }
    printf("fuzz_idx: ran %d input%s\n", ran, ran == 1 ? "" : "s");
    mnistcu_ctx_destroy(fuzz_ctx);
    return 0;
}
#endif
