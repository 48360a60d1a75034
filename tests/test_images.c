/* Images: every fixture of tests/fixtures/images/MANIFEST.txt (written by
   tests/make_image_fixtures.py with its own encoder, checked by Pillow):
   valid PNG and PGM files decode to the grayscale it computed, pixel for
   pixel; malformed ones are refused with the result code of their class;
   every truncation of a few files is refused. Then the MNIST-style
   preprocessing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../mnistcu.h"
#include "harness.h"
#include "asserts.h"
#include "test_util.h"

#define TI_DIR "tests/fixtures/images/"

static mnistcu_result ti_class(const char *c)
{
    static const struct { const char *name; mnistcu_result r; } classes[] = {
        {"crc", MNISTCU_ERR_PNG_CRC}, {"signature", MNISTCU_ERR_IMAGE_SIGNATURE}, {"ihdr", MNISTCU_ERR_PNG_IHDR},
        {"truncated", MNISTCU_ERR_PNG_TRUNCATED}, {"zlib", MNISTCU_ERR_PNG_ZLIB}, {"size", MNISTCU_ERR_PNG_SIZE},
        {"filter", MNISTCU_ERR_PNG_FILTER}, {"palette", MNISTCU_ERR_PNG_PALETTE}, {"order", MNISTCU_ERR_PNG_ORDER},
        {"pgm", MNISTCU_ERR_PGM}, {"huge", MNISTCU_ERR_IMAGE_TOO_LARGE}};
    size_t k;
    for (k = 0; k < sizeof classes / sizeof classes[0]; ++k)
        if (!strcmp(c, classes[k].name)) return classes[k].r;
    return MNISTCU_OK;
}

TEST images_match_the_fixtures(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    FILE *man = fopen(TI_DIR "MANIFEST.txt", "r");
    char line[512], name[128], expect[32], path[256];
    long long w, h;
    int valid = 0, invalid = 0, failed = 0;
    TU_REQUIRE(ctx && man, "tests/fixtures/images/MANIFEST.txt missing (run from the repository root)");
    while (fgets(line, sizeof line, man)) {
        mnistcu_image img;
        unsigned char *file, *gray;
        size_t size, gsize;
        mnistcu_result r, want;
        if (line[0] == '#' || sscanf(line, "%127s %lld %lld %31s", name, &w, &h, expect) != 4) continue;
        snprintf(path, sizeof path, TI_DIR "%s", name);
        file = tu_read_file(path, &size);
        TU_REQUIRE(file, "%s missing", path);
        r = mnistcu_image_load_memory(ctx, file, size, &img);
        free(file);
        if (!strcmp(expect, "ok")) {
            int same;
            snprintf(path, sizeof path, TI_DIR "%s.gray", name);
            gray = tu_read_file(path, &gsize);
            TU_REQUIRE(r == MNISTCU_OK, "%s: %s", name, mnistcu_ctx_error(ctx));
            same = gray && img.width == w && img.height == h && gsize == (size_t)(w * h) &&
                   memcmp(img.gray, gray, gsize) == 0;
            if (!same && gray && gsize == (size_t)(w * h) && img.gray) {
                size_t k;
                for (k = 0; k < gsize && img.gray[k] == gray[k]; ++k) {}
                tu_setf(__LINE__, "%s: pixel %lu is %d, expected %d", name, (unsigned long)k, img.gray[k], gray[k]);
            }
            mnistcu_image_free(ctx, &img);
            free(gray);
            if (!same) {
                failed = 1;
                if (!tu_msg[0]) tu_setf(__LINE__, "%s: %dx%d, expected %lldx%lld", name, img.width, img.height, w, h);
                goto done;
            }
            valid++;
        } else {
            want = ti_class(expect);
            TU_REQUIRE(want != MNISTCU_OK, "%s: unknown class %s", name, expect);
            TU_REQUIRE(r == want && img.gray == NULL && *mnistcu_ctx_error(ctx),
                       "%s (%s): %s, expected %s (%s)", name, expect, mnistcu_result_name(r), mnistcu_result_name(want),
                       mnistcu_ctx_error(ctx));
            invalid++;
        }
    }
    TU_REQUIRE(valid >= 60 && invalid >= 60, "only %d valid and %d malformed fixtures", valid, invalid);
done:
    if (man) fclose(man);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* Every prefix of an interlaced PNG and of a P5 PGM is refused, and never crashes. */
TEST images_every_truncation_is_refused(void)
{
    static const char *const files[] = {TI_DIR "g8i.png", TI_DIR "p4t.png", TI_DIR "p5_8.pgm", TI_DIR "rgba16.png"};
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    int failed = 0;
    size_t f, k;
    TU_REQUIRE(ctx, "context");
    for (f = 0; f < sizeof files / sizeof files[0]; ++f) {
        size_t size;
        unsigned char *file = tu_read_file(files[f], &size);
        TU_REQUIRE(file, "%s missing", files[f]);
        for (k = 0; k < size; ++k) {
            mnistcu_image img;
            mnistcu_result r = mnistcu_image_load_memory(ctx, file, k, &img);
            if (r == MNISTCU_OK) {
                mnistcu_image_free(ctx, &img);
                free(file);
                TU_REQUIRE(0, "%s cut to %lu of %lu bytes was accepted", files[f], (unsigned long)k, (unsigned long)size);
            }
        }
        free(file);
    }
done:
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

/* The MNIST-style input: a dark stroke on white becomes a bright one on black,
   fitted to 20 pixels on its longer side, with its centre of mass at the
   centre (within half a pixel); a blank image is refused. */
TEST images_to_mnist(void)
{
    mnistcu_ctx *ctx = tu_ctx(MNISTCU_DEVICE_CPU, 1);
    mnistcu_image img;
    uint8_t out[28 * 28];
    double m = 0, cx = 0, cy = 0;
    int x, y, x0 = 28, x1 = -1, y0 = 28, y1 = -1, failed = 0;
    TU_REQUIRE(ctx, "context");
    img.width = 90;
    img.height = 60;
    img.gray = (uint8_t *)malloc(90 * 60);
    memset(img.gray, 250, 90 * 60);
    for (y = 10; y < 50; ++y) /* an L: a vertical bar and a foot, dark on light, off centre */
        for (x = 60; x < 66; ++x) img.gray[y * 90 + x] = 10;
    for (y = 44; y < 50; ++y)
        for (x = 60; x < 80; ++x) img.gray[y * 90 + x] = 10;
    TU_REQUIRE(mnistcu_image_to_mnist(ctx, &img, 28, out) == MNISTCU_OK, "%s", mnistcu_ctx_error(ctx));
    for (y = 0; y < 28; ++y)
        for (x = 0; x < 28; ++x)
            if (out[y * 28 + x] > 64) {
                x0 = x < x0 ? x : x0, x1 = x > x1 ? x : x1, y0 = y < y0 ? y : y0, y1 = y > y1 ? y : y1;
            }
    for (y = 0; y < 28; ++y)
        for (x = 0; x < 28; ++x) m += out[y * 28 + x], cx += x * out[y * 28 + x], cy += y * out[y * 28 + x];
    TU_REQUIRE(out[0] == 0 && y1 - y0 + 1 == 20 && x1 - x0 + 1 == 10, "ink box %dx%d (expected 10x20), corner %d",
               x1 - x0 + 1, y1 - y0 + 1, out[0]);
    TU_REQUIRE(cx / m > 13.0 && cx / m < 14.0 && cy / m > 13.0 && cy / m < 14.0, "centre of mass (%.2f, %.2f)", cx / m,
               cy / m);
    memset(img.gray, 250, 90 * 60);
    TU_REQUIRE(mnistcu_image_to_mnist(ctx, &img, 28, out) == MNISTCU_ERR_INVALID_ARGUMENT, "a blank image accepted");
done:
    free(img.gray);
    mnistcu_ctx_destroy(ctx);
    TU_END();
}

SUITE(images_suite)
{
    RUN_TEST(images_match_the_fixtures);
    RUN_TEST(images_every_truncation_is_refused);
    RUN_TEST(images_to_mnist);
}
