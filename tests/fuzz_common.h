/* tests/fuzz_common.h - what the fuzz targets for model files and images share:
   an allocator that refuses more than FUZZ_MAX_ALLOC bytes at once (define it
   before including), one silent CPU context for the whole run, and, with
   -DMNISTCU_FUZZ_STANDALONE, a main that replays the files named on the
   command line (for example the crash-* files libFuzzer leaves) without
   libFuzzer. Include after mnistcu.h with MNISTCU_IMPLEMENTATION. */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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

/* The run's context (NULL if it cannot be made). */
static mnistcu_ctx *fuzz_get_ctx(void)
{
    if (!fuzz_ctx) {
        mnistcu_ctx_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.device = MNISTCU_DEVICE_CPU;
        cd.threads = 1;
        cd.log_level = MNISTCU_LOG_SILENT;
        cd.allocator.alloc = fuzz_alloc;
        cd.allocator.free = fuzz_free;
        if (mnistcu_ctx_create(&fuzz_ctx, &cd) != MNISTCU_OK) {
            mnistcu_ctx_destroy(fuzz_ctx);
            fuzz_ctx = NULL;
        }
    }
    return fuzz_ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef MNISTCU_FUZZ_STANDALONE
int main(int argc, char **argv)
{
    static uint8_t buf[1 << 22];
    int i;
    for (i = 1; i < argc; ++i) {
        FILE *f = fopen(argv[i], "rb");
        size_t n;
        if (!f) continue;
        n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
    }
    mnistcu_ctx_destroy(fuzz_ctx);
    return 0;
}
#endif
#endif
