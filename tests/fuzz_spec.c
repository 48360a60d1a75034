/* tests/fuzz_spec.c - a libFuzzer target for model spec strings (the CLI's
   --model, mnistcu_model_create_spec): whatever the bytes, parsing must not
   crash, read out of bounds, overflow or leak; a spec that parses must print
   back (mnistcu_model_desc_spec) to a spec that parses to the same desc; and
   making the model (shape inference, arenas, tensor names) must succeed or
   fail cleanly, within an allocator that refuses more than 16 MB at once.

   Build and run with clang:
       clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz_spec.c -o fuzz_spec
       ./fuzz_spec -max_total_time=60 CORPUS   (seeds: sh tests/make_fuzz_corpus.sh --spec CORPUS)
   Without libFuzzer: -DMNISTCU_FUZZ_STANDALONE replays the files named on the command line. */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_MAX_ALLOC ((size_t)16 << 20)
#define FUZZ_MAX_SPEC 4096

static void *fuzz_alloc(void *user, size_t size)
{
    (void)user;
    return size > FUZZ_MAX_ALLOC ? NULL : malloc(size);
}

static void fuzz_free(void *user, void *ptr)
{
    (void)user;
    free(ptr);
}

static mnistcu_ctx *fuzz_ctx;

/* A property broke: stop here so that the fuzzer keeps the input. */
static void fuzz_broken(const char *what, const char *spec)
{
    fprintf(stderr, "fuzz_spec: %s: \"%s\"\n", what, spec);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char spec[FUZZ_MAX_SPEC + 1], printed[8192];
    mnistcu_model_desc d, again;
    mnistcu_model *m = NULL;
    int i;
    if (!fuzz_ctx) {
        mnistcu_ctx_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.device = MNISTCU_DEVICE_CPU;
        cd.log_level = MNISTCU_LOG_SILENT;
        cd.allocator.alloc = fuzz_alloc;
        cd.allocator.free = fuzz_free;
        if (mnistcu_ctx_create(&fuzz_ctx, &cd) != MNISTCU_OK) return 0;
    }
    if (size > FUZZ_MAX_SPEC) size = FUZZ_MAX_SPEC;
    memcpy(spec, data, size);
    spec[size] = 0;
    if (mnistcu_model_desc_parse(fuzz_ctx, spec, &d) != MNISTCU_OK) {
        if (!mnistcu_ctx_error(fuzz_ctx)[0]) fuzz_broken("a refused spec left no message", spec);
        return 0;
    }
    if (mnistcu_model_desc_spec(&d, printed, sizeof printed) != MNISTCU_OK) fuzz_broken("no canonical spec", spec);
    if (mnistcu_model_desc_parse(fuzz_ctx, printed, &again) != MNISTCU_OK) fuzz_broken("the canonical spec does not parse", spec);
    if (memcmp(d.layers, again.layers, sizeof d.layers) != 0 || d.input_c != again.input_c ||
        d.input_h != again.input_h || d.input_w != again.input_w)
        fuzz_broken("the canonical spec parses to another desc", spec);
    if (mnistcu_model_create(fuzz_ctx, &d, &m) == MNISTCU_OK) {
        mnistcu_model_info info;
        mnistcu_layer_info li;
        mnistcu_tensor_info ti;
        mnistcu_model_info_get(m, &info);
        for (i = 0; i < info.layer_count; ++i)
            if (mnistcu_model_layer_info(m, i, &li) != MNISTCU_OK) fuzz_broken("layer_info", spec);
        for (i = 0; i < mnistcu_model_num_tensors(m); ++i)
            if (mnistcu_model_tensor_info(m, i, &ti) != MNISTCU_OK) fuzz_broken("tensor_info", spec);
        if (mnistcu_model_spec(m, printed, sizeof printed) != MNISTCU_OK) fuzz_broken("model_spec", spec);
        mnistcu_model_destroy(m);
    }
    return 0;
}

#ifdef MNISTCU_FUZZ_STANDALONE
int main(int argc, char **argv)
{
    int i;
    for (i = 1; i < argc; ++i) {
        static unsigned char buf[FUZZ_MAX_SPEC];
        size_t len;
        FILE *f = fopen(argv[i], "rb");
        if (!f) continue;
        len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, len);
    }
    printf("fuzz_spec: ran %d input%s\n", argc - 1, argc == 2 ? "" : "s");
    mnistcu_ctx_destroy(fuzz_ctx);
    return 0;
}
#endif
