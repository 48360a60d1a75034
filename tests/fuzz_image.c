/* tests/fuzz_image.c - a libFuzzer target for images (mnistcu_image_load_memory, PNG and PGM):
   whatever the bytes, decoding must not crash, read out of bounds, overflow or leak, and must
   refuse with a message or give an image whose MNIST-style input can be made (or is refused as
   blank). Allocations above 64 MB are refused.

   Build and run with clang:
       clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz_image.c -o fuzz_image -lm
       ./fuzz_image -max_total_time=60 tests/fixtures/images
   Without libFuzzer: -DMNISTCU_FUZZ_STANDALONE replays the files named on the command line. */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#define FUZZ_MAX_ALLOC ((size_t)64 << 20)
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mnistcu_image img;
    uint8_t out[28 * 28];
    mnistcu_result r;
    if (!fuzz_get_ctx()) return 0;
    r = mnistcu_image_load_memory(fuzz_ctx, data, size, &img);
    if (r != MNISTCU_OK) {
        if (img.gray || !mnistcu_ctx_error(fuzz_ctx)[0]) abort();
        return 0;
    }
    if (img.width < 1 || img.height < 1 || !img.gray) abort();
    if ((size_t)img.width * (size_t)img.height <= ((size_t)1 << 20)) {
        r = mnistcu_image_to_mnist(fuzz_ctx, &img, 28, out);
        if (r != MNISTCU_OK && r != MNISTCU_ERR_INVALID_ARGUMENT && r != MNISTCU_ERR_OUT_OF_MEMORY) abort();
    }
    mnistcu_image_free(fuzz_ctx, &img);
    return 0;
}
