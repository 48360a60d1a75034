/* tests/fuzz_model.c - a libFuzzer target for model files (mnistcu_model_load_memory):
   whatever the bytes, reading must not crash, read out of bounds, overflow or
   leak, and must refuse with a message or give a model that runs: its spec
   prints, and a forward pass over one sample of zeros succeeds. Allocations
   above 16 MB are refused, as a hostile header must not make the loader ask
   for more than the file can back.

   Build and run with clang:
       clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz_model.c -o fuzz_model -lm
       ./fuzz_model -max_total_time=60 tests/fixtures/safetensors
   Without libFuzzer: -DMNISTCU_FUZZ_STANDALONE replays the files named on the command line. */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#define FUZZ_MAX_ALLOC ((size_t)16 << 20)
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char spec[8192];
    static float x[1 << 16], z[MNISTCU_MAX_CLASSES];
    mnistcu_model *m = NULL;
    mnistcu_model_info info;
    if (!fuzz_get_ctx()) return 0;
    if (mnistcu_model_load_memory(fuzz_ctx, data, size, &m) != MNISTCU_OK) {
        if (m || !mnistcu_ctx_error(fuzz_ctx)[0]) abort(); /* refused: no model, and a message */
        return 0;
    }
    if (mnistcu_model_spec(m, spec, sizeof spec) != MNISTCU_OK) abort();
    mnistcu_model_info_get(m, &info);
    if (info.inputs <= sizeof x / sizeof x[0]) {
        mnistcu_model_set_mode(m, MNISTCU_MODE_EVAL);
        if (mnistcu_model_forward(m, x, 1, z) != MNISTCU_OK && mnistcu_ctx_last_result(fuzz_ctx) != MNISTCU_ERR_OUT_OF_MEMORY)
            abort();
    }
    mnistcu_model_destroy(m);
    return 0;
}
