/* tests/test_idx.c - tests of the gzip / deflate decoder and the IDX loader.

   Two suites, gzip_suite and idx_suite, run by a test program whose main()
   (in another file, which also defines MNISTCU_IMPLEMENTATION) does
       SUITE_EXTERN(gzip_suite); SUITE_EXTERN(idx_suite);
       ... RUN_SUITE(gzip_suite); RUN_SUITE(idx_suite);
   Only the public API is used. zlib is the reference: it compresses the data
   of the round trips and decodes the MNIST files independently (link -lz).
   Streams zlib never writes (every kind of broken deflate data) are built
   bit by bit with the small bit writer below.

   The MNIST tests read data/mnist/ (or the folder in the environment variable
   MNISTCU_DATA) and are skipped when the files are not there. */
#include "../mnistcu.h"
#include "harness.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>
#ifdef _WIN32
#include <process.h>
#define TEST_GETPID() ((long)_getpid())
#else
#include <unistd.h>
#define TEST_GETPID() ((long)getpid())
#endif

/* The library's default cap (the header documents 1 GiB). */
#define TEST_IDX_MAX_BYTES ((size_t)1 << 30)

/* ---- fixtures ---------------------------------------------------------------- */

/* Every test gets a fresh silent context (made by the suite's setup), so the
   errors the tests provoke do not fill stderr. */
static mnistcu_ctx *tctx;

static void ctx_setup(void *udata)
{
    mnistcu_ctx_desc desc;
    (void)udata;
    memset(&desc, 0, sizeof desc);
    desc.device = MNISTCU_DEVICE_CPU;
    desc.log_level = MNISTCU_LOG_SILENT;
    if (mnistcu_ctx_create(&tctx, &desc) != MNISTCU_OK) {
        mnistcu_ctx_destroy(tctx);
        tctx = NULL;
    }
}

static void ctx_teardown(void *udata)
{
    (void)udata;
    mnistcu_ctx_destroy(tctx);
    tctx = NULL;
}

#define NEED_CTX() ASSERTm("could not create a context", tctx != NULL)

/* xorshift32: deterministic test data. */
static uint32_t rnd(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

static void fill_random(unsigned char *p, size_t n, uint32_t seed)
{
    size_t i;
    for (i = 0; i < n; ++i) p[i] = (unsigned char)(rnd(&seed) >> 24);
}

/* Compressible data: words from a small vocabulary, runs of one byte, a few
   random bytes, and copies of earlier stretches up to 40000 bytes back (so
   matches use the whole 32 KiB window and reach past it). */
static void fill_compressible(unsigned char *p, size_t n, uint32_t seed)
{
    static const char *const words[] = {"the ", "MNIST ", "digit ", "zero ", "seven ", "gradient ",
                                        "descent ", "0123456789", "\n", "deflate "};
    size_t i = 0;
    while (i < n) {
        uint32_t r = rnd(&seed), kind = r % 16;
        size_t len;
        if (kind < 9) { /* a word */
            const char *w = words[(r >> 8) % 10];
            len = strlen(w);
            if (len > n - i) len = n - i;
            memcpy(p + i, w, len);
        } else if (kind < 11) { /* a run */
            len = 1 + (r >> 8) % 300;
            if (len > n - i) len = n - i;
            memset(p + i, (int)(r >> 20) & 0xFF, len);
        } else if (kind < 13) { /* noise */
            len = 1 + (r >> 8) % 8;
            if (len > n - i) len = n - i;
            fill_random(p + i, len, r);
        } else { /* an earlier stretch */
            size_t back = 1 + (r >> 8) % 40000, k;
            len = 3 + rnd(&seed) % 300;
            if (len > n - i) len = n - i;
            if (back > i) back = i ? i : 1;
            for (k = 0; k < len; ++k) p[i + k] = i ? p[i + k - back] : 'x';
        }
        i += len;
    }
}

/* zlib deflate with the given settings: window_bits 31 makes a gzip member,
   -15 a raw deflate stream. Returns malloc'd data, or NULL. */
static unsigned char *zlib_compress(const unsigned char *in, size_t n, int level, int window_bits, int strategy,
                                    size_t *out_n)
{
    z_stream z;
    unsigned char *out;
    uLong bound;
    int rc;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, level, Z_DEFLATED, window_bits, 8, strategy) != Z_OK) return NULL;
    bound = deflateBound(&z, (uLong)n) + 64;
    out = (unsigned char *)malloc(bound);
    if (!out) {
        deflateEnd(&z);
        return NULL;
    }
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)bound;
    rc = deflate(&z, Z_FINISH);
    *out_n = (size_t)z.total_out;
    deflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    return out;
}

/* zlib's own gzip decoder (one member), for reference values. */
static unsigned char *zlib_gunzip(const unsigned char *in, size_t n, size_t *out_n)
{
    z_stream z;
    size_t cap = n * 4 + 1024, len = 0;
    unsigned char *out = (unsigned char *)malloc(cap);
    int rc = Z_OK;
    if (!out) return NULL;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + 15) != Z_OK) {
        free(out);
        return NULL;
    }
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    while (rc == Z_OK) {
        if (len == cap) {
            unsigned char *bigger = (unsigned char *)realloc(out, cap * 2);
            if (!bigger) break;
            out = bigger;
            cap *= 2;
        }
        z.next_out = out + len;
        z.avail_out = (uInt)(cap - len);
        rc = inflate(&z, Z_NO_FLUSH);
        len = cap - z.avail_out;
    }
    inflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    *out_n = len;
    return out;
}

/* A whole file into malloc'd memory, or NULL. */
static unsigned char *read_whole(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t cap = 0, len = 0, got;
    if (!f) return NULL;
    do {
        if (len == cap) {
            unsigned char *bigger = (unsigned char *)realloc(buf, cap ? cap * 2 : 65536);
            if (!bigger) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = bigger;
            cap = cap ? cap * 2 : 65536;
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    fclose(f);
    *n = len;
    return buf;
}

static int write_whole(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok;
    if (!f) return 0;
    ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* A fresh file name in the temp folder, with the pid. */
static void temp_path(char *buf, size_t size, const char *suffix)
{
    static int counter;
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    snprintf(buf, size, "%s/mnistcu_test_idx_%ld_%d%s", dir, TEST_GETPID(), counter++, suffix);
}

/* The path of an MNIST file: $MNISTCU_DATA/file or data/mnist/file. */
static void data_path(char *buf, size_t size, const char *file)
{
    const char *dir = getenv("MNISTCU_DATA");
    if (!dir || !*dir) dir = "data/mnist";
    snprintf(buf, size, "%s/%s", dir, file);
}

static void put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Wraps a raw deflate stream into a gzip member (no optional fields); data is
   what the stream decodes to, for the trailer. Returns the member's size. */
static size_t gzip_wrap(unsigned char *dst, const unsigned char *deflated, size_t n, const unsigned char *data,
                        size_t data_n)
{
    static const unsigned char header[10] = {0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF};
    memcpy(dst, header, 10);
    if (n) memcpy(dst + 10, deflated, n);
    put_le32(dst + 10 + n, (uint32_t)crc32(0L, data, (uInt)data_n));
    put_le32(dst + 14 + n, (uint32_t)data_n);
    return 18 + n;
}

/* ---- a bit writer for hand-made deflate streams --------------------------------
   Deflate packs values starting at the lowest bit of each byte; Huffman codes
   go most significant bit first (RFC 1951, 3.1.1). */
typedef struct bitw {
    unsigned char buf[2048];
    size_t len;
    unsigned acc;
    int n;
} bitw;

static void bw_init(bitw *w) { memset(w, 0, sizeof *w); }

static void bw_bits(bitw *w, unsigned value, int count)
{
    int i;
    for (i = 0; i < count; ++i) {
        w->acc |= ((value >> i) & 1u) << w->n;
        if (++w->n == 8) {
            if (w->len < sizeof w->buf) w->buf[w->len++] = (unsigned char)w->acc;
            w->acc = 0;
            w->n = 0;
        }
    }
}

static void bw_code(bitw *w, unsigned code, int len)
{
    int i;
    for (i = len - 1; i >= 0; --i) bw_bits(w, (code >> i) & 1u, 1);
}

static void bw_align(bitw *w)
{
    if (w->n) bw_bits(w, 0, 8 - w->n);
}

/* Flush, then add `pad` zero bytes (so that running out of input is not the
   first problem the decoder meets). */
static void bw_finish(bitw *w, int pad)
{
    bw_align(w);
    while (pad-- > 0 && w->len < sizeof w->buf) w->buf[w->len++] = 0;
}

/* Block header: BFINAL, then BTYPE. */
static void bw_block(bitw *w, int final, unsigned type)
{
    bw_bits(w, (unsigned)final, 1);
    bw_bits(w, type, 2);
}

/* A symbol of the fixed code (RFC 1951, 3.2.6). */
static void bw_fixed_lit(bitw *w, unsigned sym)
{
    if (sym < 144) bw_code(w, 0x30 + sym, 8);
    else if (sym < 256) bw_code(w, 0x190 + sym - 144, 9);
    else if (sym < 280) bw_code(w, sym - 256, 7);
    else bw_code(w, 0xC0 + sym - 280, 8);
}

static void bw_fixed_dist(bitw *w, unsigned sym) { bw_code(w, sym, 5); }

/* Canonical codes from code lengths, as RFC 1951, 3.2.2 describes. */
static void canonical_codes(const unsigned char *lens, int n, unsigned *codes)
{
    unsigned count[16], next[16], code = 0;
    int i, bits;
    memset(count, 0, sizeof count);
    for (i = 0; i < n; ++i) count[lens[i]]++;
    count[0] = 0;
    for (bits = 1; bits < 16; ++bits) {
        code = (code + count[bits - 1]) << 1;
        next[bits] = code;
    }
    for (i = 0; i < n; ++i) codes[i] = lens[i] ? next[lens[i]]++ : 0;
}

/* A dynamic block under construction. lens holds the nlit literal/length
   lengths, then the ndist distance lengths. The code-length code gives all
   19 symbols a code: 0..12 get 4 bits, 13..18 get 5 (13/16 + 6/32 = 1). */
typedef struct dyn {
    int nlit, ndist;
    unsigned char lens[288 + 32];
    unsigned char clen_lens[19];
    unsigned clen_codes[19], lit_codes[288], dist_codes[32];
} dyn;

static const unsigned char clen_order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

static void dyn_init(dyn *d, int nlit, int ndist)
{
    int i;
    memset(d, 0, sizeof *d);
    d->nlit = nlit;
    d->ndist = ndist;
    for (i = 0; i < 19; ++i) d->clen_lens[i] = (unsigned char)(i < 13 ? 4 : 5);
}

/* Header and code-length code; the lengths themselves follow with dyn_clen. */
static void dyn_header(bitw *w, dyn *d, int final)
{
    int i;
    bw_block(w, final, 2);
    bw_bits(w, (unsigned)(d->nlit - 257), 5);
    bw_bits(w, (unsigned)(d->ndist - 1), 5);
    bw_bits(w, 19 - 4, 4);
    for (i = 0; i < 19; ++i) bw_bits(w, d->clen_lens[clen_order[i]], 3);
    canonical_codes(d->clen_lens, 19, d->clen_codes);
}

/* One code-length symbol and its extra bits. */
static void dyn_clen(bitw *w, const dyn *d, unsigned sym, unsigned extra, int extra_bits)
{
    bw_code(w, d->clen_codes[sym], d->clen_lens[sym]);
    bw_bits(w, extra, extra_bits);
}

/* The whole header, every length sent as itself; then codes for the data. */
static void dyn_begin(bitw *w, dyn *d, int final)
{
    int i;
    dyn_header(w, d, final);
    for (i = 0; i < d->nlit + d->ndist; ++i) dyn_clen(w, d, d->lens[i], 0, 0);
    canonical_codes(d->lens, d->nlit, d->lit_codes);
    canonical_codes(d->lens + d->nlit, d->ndist, d->dist_codes);
}

static void dyn_lit(bitw *w, const dyn *d, unsigned sym) { bw_code(w, d->lit_codes[sym], d->lens[sym]); }
static void dyn_dist(bitw *w, const dyn *d, unsigned sym)
{
    bw_code(w, d->dist_codes[sym], d->lens[d->nlit + sym]);
}

/* ---- checks shared by many tests ---------------------------------------------- */

/* A failed call must leave *out NULL, *out_size 0, and a message. */
static greatest_test_res check_failure(mnistcu_result r, const void *out, size_t out_size)
{
    ASSERT_ENUM_EQ(r, mnistcu_ctx_last_result(tctx), mnistcu_result_name);
    ASSERTm("no output expected after an error", out == NULL);
    ASSERT_EQ((size_t)0, out_size);
    ASSERTm("the error message is empty", mnistcu_ctx_error(tctx)[0] != '\0');
    PASS();
}

static greatest_test_res expect_inflate(const unsigned char *in, size_t n, size_t max_out, mnistcu_result expected)
{
    void *out = (void *)&n;
    size_t out_size = 77, used = 77;
    mnistcu_result r;
    mnistcu_ctx_clear_error(tctx);
    r = mnistcu_inflate(tctx, in, n, max_out, &out, &out_size, &used);
    if (r == MNISTCU_OK) mnistcu_free(tctx, out);
    ASSERT_ENUM_EQ(expected, r, mnistcu_result_name);
    if (r != MNISTCU_OK) CHECK_CALL(check_failure(r, out, out_size));
    PASS();
}

static greatest_test_res expect_gunzip(const unsigned char *in, size_t n, size_t max_out, mnistcu_result expected)
{
    void *out = (void *)&n;
    size_t out_size = 77;
    mnistcu_result r;
    mnistcu_ctx_clear_error(tctx);
    r = mnistcu_gunzip(tctx, in, n, max_out, &out, &out_size);
    if (r == MNISTCU_OK) mnistcu_free(tctx, out);
    ASSERT_ENUM_EQ(expected, r, mnistcu_result_name);
    if (r != MNISTCU_OK) CHECK_CALL(check_failure(r, out, out_size));
    PASS();
}

/* Decodes a hand-made stream raw and wrapped as gzip: both must fail with
   `expected` (or both succeed when expected is OK). */
static greatest_test_res expect_deflate(const bitw *w, mnistcu_result expected)
{
    static unsigned char gz[sizeof(bitw) + 32];
    size_t n;
    CHECK_CALL(expect_inflate(w->buf, w->len, 0, expected));
    n = gzip_wrap(gz, w->buf, w->len, NULL, 0); /* the trailer is never reached when deflate fails */
    if (expected != MNISTCU_OK) CHECK_CALL(expect_gunzip(gz, n, 0, expected));
    PASS();
}

/* Inflates a hand-made stream that must succeed, and compares its output. */
static greatest_test_res expect_inflate_output(const bitw *w, const char *expected)
{
    void *out = NULL;
    size_t out_size = 0, used = 0, n = strlen(expected);
    mnistcu_result r = mnistcu_inflate(tctx, w->buf, w->len, 0, &out, &out_size, &used);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(n, out_size);
    ASSERT_MEM_EQ(expected, out, n);
    mnistcu_free(tctx, out);
    PASS();
}

/* An IDX load that must fail with `expected`, with a message naming the file
   and `out` left zeroed. */
static greatest_test_res expect_idx(const unsigned char *bytes, size_t n, mnistcu_result expected)
{
    static const char name[] = "unit/test-file.idx";
    mnistcu_idx idx;
    mnistcu_result r;
    memset(&idx, 0xAB, sizeof idx);
    mnistcu_ctx_clear_error(tctx);
    r = mnistcu_idx_load_memory(tctx, bytes, n, name, &idx);
    if (r == MNISTCU_OK) mnistcu_idx_free(tctx, &idx);
    ASSERT_ENUM_EQ(expected, r, mnistcu_result_name);
    if (r != MNISTCU_OK) {
        mnistcu_idx zero_idx;
        memset(&zero_idx, 0, sizeof zero_idx);
        ASSERT_ENUM_EQ(r, mnistcu_ctx_last_result(tctx), mnistcu_result_name);
        ASSERTm("the message must start with the file name",
                strncmp(mnistcu_ctx_error(tctx), name, strlen(name)) == 0);
        ASSERTm("out must be zeroed after a failure", memcmp(&idx, &zero_idx, sizeof idx) == 0);
    }
    PASS();
}

/* ==== gzip_suite ================================================================ */

TEST crc32_known_values(void)
{
    static const char fox[] = "The quick brown fox jumps over the lazy dog";
    ASSERT_EQ_FMT(0xCBF43926u, (unsigned)mnistcu_crc32(0, "123456789", 9), "0x%08x");
    ASSERT_EQ_FMT(0x414FA339u, (unsigned)mnistcu_crc32(0, fox, strlen(fox)), "0x%08x");
    ASSERT_EQ_FMT(0xE8B7BE43u, (unsigned)mnistcu_crc32(0, "a", 1), "0x%08x");
    ASSERT_EQ_FMT(0u, (unsigned)mnistcu_crc32(0, "", 0), "0x%08x");
    ASSERT_EQ_FMT(0u, (unsigned)mnistcu_crc32(0, NULL, 0), "0x%08x");
    /* Chaining: the CRC of "1234" continued with "56789". */
    ASSERT_EQ_FMT(0xCBF43926u, (unsigned)mnistcu_crc32(mnistcu_crc32(0, "1234", 4), "56789", 5), "0x%08x");
    PASS();
}

TEST crc32_matches_zlib(void)
{
    static const size_t sizes[] = {0, 1, 2, 3, 7, 8, 15, 16, 31, 255, 256, 1000, 4096, 65537, 300001};
    unsigned char *buf = (unsigned char *)malloc(300001);
    size_t i;
    ASSERT(buf != NULL);
    fill_random(buf, 300001, 12345);
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        uint32_t ours = mnistcu_crc32(0, buf, sizes[i]);
        uint32_t ref = (uint32_t)crc32(0L, buf, (uInt)sizes[i]);
        /* continuing from a non-zero CRC as well */
        uint32_t ours2 = mnistcu_crc32(0xDEADBEEFu, buf + 1, sizes[i] ? sizes[i] - 1 : 0);
        uint32_t ref2 = (uint32_t)crc32(0xDEADBEEFuL, buf + 1, (uInt)(sizes[i] ? sizes[i] - 1 : 0));
        if (ours != ref || ours2 != ref2) {
            free(buf);
            FAILm("mnistcu_crc32 differs from zlib's crc32");
        }
    }
    free(buf);
    PASS();
}

/* Compresses data with zlib (gzip and raw) and decodes it with both entry points. */
static greatest_test_res roundtrip(const unsigned char *data, size_t n, int level, int strategy)
{
    unsigned char *z;
    void *out = NULL;
    size_t zn = 0, out_size = 0, used = 0;
    mnistcu_result r;

    z = zlib_compress(data, n, level, 31, strategy, &zn);
    ASSERTm("zlib failed to compress", z != NULL);
    r = mnistcu_gunzip(tctx, z, zn, 0, &out, &out_size);
    free(z);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(n, out_size);
    ASSERT_MEM_EQ(data, out, n);
    mnistcu_free(tctx, out);

    z = zlib_compress(data, n, level, -15, strategy, &zn);
    ASSERTm("zlib failed to compress", z != NULL);
    r = mnistcu_inflate(tctx, z, zn, 0, &out, &out_size, &used);
    free(z);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(zn, used);
    ASSERT_EQ(n, out_size);
    ASSERT_MEM_EQ(data, out, n);
    mnistcu_free(tctx, out);
    PASS();
}

TEST roundtrip_levels_and_sizes(void)
{
    static const size_t sizes[] = {0, 1, 65537};
    unsigned char *data = (unsigned char *)malloc(65537);
    size_t s;
    int level, kind;
    NEED_CTX();
    ASSERT(data != NULL);
    for (kind = 0; kind < 2; ++kind) {
        for (s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
            if (kind == 0) fill_random(data, sizes[s], (uint32_t)(7 + s));
            else fill_compressible(data, sizes[s], (uint32_t)(11 + s));
            for (level = 0; level <= 9; ++level) {
                greatest_test_res res = roundtrip(data, sizes[s], level, Z_DEFAULT_STRATEGY);
                if (res != GREATEST_TEST_RES_PASS) {
                    free(data);
                    return res;
                }
            }
        }
    }
    free(data);
    PASS();
}

TEST roundtrip_strategies(void)
{
    static const int strategies[] = {Z_FIXED, Z_HUFFMAN_ONLY, Z_RLE, Z_FILTERED};
    static const size_t sizes[] = {1, 100, 65537, 300000};
    unsigned char *data = (unsigned char *)malloc(300000);
    size_t s, k;
    NEED_CTX();
    ASSERT(data != NULL);
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        fill_compressible(data, sizes[s], (uint32_t)(100 + s));
        for (k = 0; k < sizeof strategies / sizeof strategies[0]; ++k) {
            greatest_test_res res = roundtrip(data, sizes[s], 6, strategies[k]);
            if (res == GREATEST_TEST_RES_PASS) res = roundtrip(data, sizes[s], 1, strategies[k]);
            if (res != GREATEST_TEST_RES_PASS) {
                free(data);
                return res;
            }
        }
    }
    free(data);
    PASS();
}

/* 3 MB with long runs (matches of 258 bytes at distance 1) and copies from
   the far end of the window, in many blocks. */
TEST roundtrip_large(void)
{
    size_t n = 3u << 20;
    unsigned char *data = (unsigned char *)malloc(n);
    greatest_test_res res;
    NEED_CTX();
    ASSERT(data != NULL);
    fill_compressible(data, n, 99);
    memset(data + 1000000, 0, 100000);
    res = roundtrip(data, n, 9, Z_DEFAULT_STRATEGY);
    free(data);
    return res;
}

/* The output starts small and grows: check a stream whose output is far
   larger than any first guess. */
TEST roundtrip_high_ratio(void)
{
    size_t n = 20u << 20;
    unsigned char *data = (unsigned char *)calloc(n, 1);
    greatest_test_res res;
    NEED_CTX();
    ASSERT(data != NULL);
    data[n / 2] = 1;
    res = roundtrip(data, n, 9, Z_DEFAULT_STRATEGY);
    free(data);
    return res;
}

TEST inflate_reports_input_used(void)
{
    unsigned char data[5000], *z, *padded;
    void *out = NULL;
    size_t zn = 0, out_size = 0, used = 0;
    mnistcu_result r;
    NEED_CTX();
    fill_compressible(data, sizeof data, 5);
    z = zlib_compress(data, sizeof data, 6, -15, Z_DEFAULT_STRATEGY, &zn);
    ASSERT(z != NULL);
    padded = (unsigned char *)malloc(zn + 100);
    ASSERT(padded != NULL);
    memcpy(padded, z, zn);
    memset(padded + zn, 0x5A, 100); /* bytes after the stream are not part of it */
    free(z);
    r = mnistcu_inflate(tctx, padded, zn + 100, 0, &out, &out_size, &used);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(zn, used);
    ASSERT_EQ(sizeof data, out_size);
    ASSERT_MEM_EQ(data, out, sizeof data);
    mnistcu_free(tctx, out);
    /* in_used may be NULL */
    r = mnistcu_inflate(tctx, padded, zn, 0, &out, &out_size, NULL);
    free(padded);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(sizeof data, out_size);
    mnistcu_free(tctx, out);
    PASS();
}

TEST mnist_file_roundtrip(void)
{
    char path[1024];
    unsigned char *gz, *ref, *z;
    void *out = NULL;
    size_t gz_n = 0, ref_n = 0, zn = 0, out_size = 0, used = 0;
    mnistcu_result r;
    clock_t t0;
    double seconds;
    NEED_CTX();
    data_path(path, sizeof path, "train-images-idx3-ubyte.gz");
    gz = read_whole(path, &gz_n);
    if (!gz) SKIPm("data/mnist/train-images-idx3-ubyte.gz not found (set MNISTCU_DATA)");
    ref = zlib_gunzip(gz, gz_n, &ref_n);
    ASSERTm("zlib could not decode the MNIST file", ref != NULL);

    t0 = clock();
    r = mnistcu_gunzip(tctx, gz, gz_n, 0, &out, &out_size);
    seconds = (double)(clock() - t0) / CLOCKS_PER_SEC;
    free(gz);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(ref_n, out_size);
    ASSERT_MEM_EQ(ref, out, ref_n);
    mnistcu_free(tctx, out);
    if (GREATEST_IS_VERBOSE())
        printf("    gunzip of %lu bytes: %.3f s\n", (unsigned long)ref_n, seconds);

    /* The same content through zlib's raw deflate at the fastest level. */
    z = zlib_compress(ref, ref_n, 1, -15, Z_DEFAULT_STRATEGY, &zn);
    ASSERT(z != NULL);
    r = mnistcu_inflate(tctx, z, zn, 0, &out, &out_size, &used);
    free(z);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(zn, used);
    ASSERT_EQ(ref_n, out_size);
    ASSERT_MEM_EQ(ref, out, ref_n);
    mnistcu_free(tctx, out);
    free(ref);
    PASS();
}

/* ---- gzip containers ---- */

/* Two members a and b, gzip'd separately by zlib, concatenated. */
static unsigned char *two_members(const unsigned char *a, size_t an, const unsigned char *b, size_t bn,
                                  size_t *n, size_t *first_n)
{
    size_t za_n = 0, zb_n = 0;
    unsigned char *za = zlib_compress(a, an, 6, 31, Z_DEFAULT_STRATEGY, &za_n);
    unsigned char *zb = zlib_compress(b, bn, 6, 31, Z_DEFAULT_STRATEGY, &zb_n);
    unsigned char *both = (unsigned char *)malloc(za_n + zb_n + 1);
    if (!za || !zb || !both) {
        free(za);
        free(zb);
        free(both);
        return NULL;
    }
    memcpy(both, za, za_n);
    memcpy(both + za_n, zb, zb_n);
    free(za);
    free(zb);
    *n = za_n + zb_n;
    if (first_n) *first_n = za_n;
    return both;
}

TEST gzip_multi_member(void)
{
    unsigned char a[3000], b[7000], ab[10000];
    unsigned char *gz;
    void *out = NULL;
    size_t n = 0, out_size = 0;
    mnistcu_result r;
    NEED_CTX();
    fill_compressible(a, sizeof a, 1);
    fill_random(b, sizeof b, 2);
    memcpy(ab, a, sizeof a);
    memcpy(ab + sizeof a, b, sizeof b);
    gz = two_members(a, sizeof a, b, sizeof b, &n, NULL);
    ASSERT(gz != NULL);
    r = mnistcu_gunzip(tctx, gz, n, 0, &out, &out_size);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(sizeof ab, out_size);
    ASSERT_MEM_EQ(ab, out, sizeof ab);
    mnistcu_free(tctx, out);
    /* The limit counts the output of all members together. */
    CHECK_CALL(expect_gunzip(gz, n, sizeof ab, MNISTCU_OK));
    CHECK_CALL(expect_gunzip(gz, n, sizeof ab - 1, MNISTCU_ERR_GZ_TOO_LARGE));
    CHECK_CALL(expect_gunzip(gz, n, sizeof a + 10, MNISTCU_ERR_GZ_TOO_LARGE));
    /* A broken second member is reported: its CRC. */
    gz[n - 5] ^= 0x01;
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_CRC));
    free(gz);
    PASS();
}

TEST gzip_empty_members(void)
{
    unsigned char a[100];
    unsigned char *gz;
    void *out = NULL;
    size_t n = 0, out_size = 0;
    mnistcu_result r;
    NEED_CTX();
    fill_compressible(a, sizeof a, 3);
    /* empty member, then a */
    gz = two_members(a, 0, a, sizeof a, &n, NULL);
    ASSERT(gz != NULL);
    r = mnistcu_gunzip(tctx, gz, n, 0, &out, &out_size);
    free(gz);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(sizeof a, out_size);
    ASSERT_MEM_EQ(a, out, sizeof a);
    mnistcu_free(tctx, out);
    /* a, then an empty member */
    gz = two_members(a, sizeof a, a, 0, &n, NULL);
    ASSERT(gz != NULL);
    r = mnistcu_gunzip(tctx, gz, n, 0, &out, &out_size);
    free(gz);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(sizeof a, out_size);
    ASSERT_MEM_EQ(a, out, sizeof a);
    mnistcu_free(tctx, out);
    /* one empty member alone: success, no bytes */
    gz = two_members(a, 0, a, 0, &n, NULL);
    ASSERT(gz != NULL);
    r = mnistcu_gunzip(tctx, gz, n / 2, 0, &out, &out_size);
    free(gz);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ((size_t)0, out_size);
    ASSERT(out != NULL);
    mnistcu_free(tctx, out);
    PASS();
}

/* Each member is a stream of its own: a match may not reach into the output
   of the member before. */
TEST gzip_member_cannot_reach_back(void)
{
    unsigned char gz[200], first[64];
    bitw w;
    size_t n, first_n = 0;
    unsigned char *z;
    static const unsigned char text[] = "abc";
    NEED_CTX();
    z = zlib_compress(text, 3, 6, 31, Z_DEFAULT_STRATEGY, &first_n);
    ASSERT(z != NULL && first_n <= sizeof first);
    memcpy(first, z, first_n);
    free(z);
    /* second member: a match of 3 at distance 3, right at its start */
    bw_init(&w);
    bw_block(&w, 1, 1);
    bw_fixed_lit(&w, 257);
    bw_fixed_dist(&w, 2);
    bw_fixed_lit(&w, 256);
    bw_finish(&w, 0);
    memcpy(gz, first, first_n);
    n = first_n + gzip_wrap(gz + first_n, w.buf, w.len, text, 3);
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_DEFLATE_DISTANCE));
    PASS();
}

/* A small gzip member with every optional header field and a valid FHCRC. */
static size_t fancy_gzip(unsigned char *dst, const unsigned char *data, size_t n, unsigned flags_extra)
{
    size_t zn = 0, pos = 0;
    unsigned char *z = zlib_compress(data, n, 6, -15, Z_DEFAULT_STRATEGY, &zn);
    uint32_t hcrc;
    if (!z) return 0;
    dst[pos++] = 0x1F;
    dst[pos++] = 0x8B;
    dst[pos++] = 8;
    dst[pos++] = (unsigned char)(0x02 | 0x04 | 0x08 | 0x10 | flags_extra); /* FHCRC FEXTRA FNAME FCOMMENT */
    memset(dst + pos, 0, 4); /* mtime */
    pos += 4;
    dst[pos++] = 0;
    dst[pos++] = 3; /* Unix */
    dst[pos++] = 4; /* XLEN = 4 */
    dst[pos++] = 0;
    memcpy(dst + pos, "AB\0\0", 4);
    pos += 4;
    memcpy(dst + pos, "name.idx", 9);
    pos += 9;
    memcpy(dst + pos, "a comment", 10);
    pos += 10;
    hcrc = (uint32_t)crc32(0L, dst, (uInt)pos);
    dst[pos++] = (unsigned char)hcrc;
    dst[pos++] = (unsigned char)(hcrc >> 8);
    memcpy(dst + pos, z, zn);
    pos += zn;
    free(z);
    put_le32(dst + pos, (uint32_t)crc32(0L, data, (uInt)n));
    put_le32(dst + pos + 4, (uint32_t)n);
    return pos + 8;
}

TEST gzip_optional_header_fields(void)
{
    unsigned char data[500], gz[1200];
    void *out = NULL;
    size_t n, out_size = 0;
    mnistcu_result r;
    NEED_CTX();
    fill_compressible(data, sizeof data, 4);
    n = fancy_gzip(gz, data, sizeof data, 0);
    ASSERT(n > 0);
    /* zlib agrees that the member is valid */
    {
        size_t ref_n = 0;
        unsigned char *ref = zlib_gunzip(gz, n, &ref_n);
        ASSERTm("zlib rejects the test's own gzip member", ref != NULL);
        free(ref);
    }
    r = mnistcu_gunzip(tctx, gz, n, 0, &out, &out_size);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(sizeof data, out_size);
    ASSERT_MEM_EQ(data, out, sizeof data);
    mnistcu_free(tctx, out);
    /* The header CRC covers the header: change the name, it no longer matches. */
    gz[18] ^= 0x20;
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_HEADER_CRC));
    gz[18] ^= 0x20;
    gz[35] ^= 0x01; /* the stored header CRC itself (10 + 2 + 4 + 9 + 10 = 35) */
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_HEADER_CRC));
    PASS();
}

/* A valid small gzip member made by zlib (no optional fields). */
static unsigned char *small_gzip(size_t *n, unsigned char *data, size_t data_n)
{
    fill_compressible(data, data_n, 77);
    return zlib_compress(data, data_n, 9, 31, Z_DEFAULT_STRATEGY, n);
}

TEST gzip_bad_magic(void)
{
    unsigned char data[300], *gz;
    size_t n = 0;
    NEED_CTX();
    gz = small_gzip(&n, data, sizeof data);
    ASSERT(gz != NULL);
    gz[0] = 0x1E;
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_MAGIC));
    gz[0] = 0x1F;
    gz[1] = 0x8C;
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_MAGIC));
    CHECK_CALL(expect_gunzip(gz, 0, 0, MNISTCU_ERR_GZ_MAGIC));
    CHECK_CALL(expect_gunzip(gz, 1, 0, MNISTCU_ERR_GZ_MAGIC));
    free(gz);
    PASS();
}

TEST gzip_bad_method(void)
{
    unsigned char data[300], *gz;
    size_t n = 0;
    NEED_CTX();
    gz = small_gzip(&n, data, sizeof data);
    ASSERT(gz != NULL);
    gz[2] = 7;
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_METHOD));
    gz[2] = 0;
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_METHOD));
    free(gz);
    PASS();
}

TEST gzip_reserved_flags(void)
{
    unsigned char data[300], *gz;
    size_t n = 0;
    unsigned bit;
    NEED_CTX();
    gz = small_gzip(&n, data, sizeof data);
    ASSERT(gz != NULL);
    for (bit = 0x20; bit <= 0x80; bit <<= 1) {
        gz[3] = (unsigned char)bit;
        CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_FLAGS));
    }
    free(gz);
    PASS();
}

TEST gzip_header_fields_past_end(void)
{
    unsigned char data[300], gz[1200], cut[64];
    size_t n;
    NEED_CTX();
    fill_compressible(data, sizeof data, 8);
    n = fancy_gzip(gz, data, sizeof data, 0);
    ASSERT(n > 40);
    /* every cut inside the optional fields (bytes 10..35) */
    memcpy(cut, gz, 40);
    CHECK_CALL(expect_gunzip(cut, 9, 0, MNISTCU_ERR_GZ_HEADER));  /* the fixed 10 bytes */
    CHECK_CALL(expect_gunzip(cut, 11, 0, MNISTCU_ERR_GZ_HEADER)); /* XLEN */
    CHECK_CALL(expect_gunzip(cut, 14, 0, MNISTCU_ERR_GZ_HEADER)); /* extra data */
    CHECK_CALL(expect_gunzip(cut, 20, 0, MNISTCU_ERR_GZ_HEADER)); /* name without its zero */
    CHECK_CALL(expect_gunzip(cut, 30, 0, MNISTCU_ERR_GZ_HEADER)); /* comment without its zero */
    CHECK_CALL(expect_gunzip(cut, 36, 0, MNISTCU_ERR_GZ_HEADER)); /* half the header CRC */
    /* an extra field longer than the whole file */
    gz[10] = 0xFF;
    gz[11] = 0xFF;
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_HEADER));
    PASS();
}

TEST gzip_trailer_crc_and_isize(void)
{
    unsigned char data[300], *gz;
    size_t n = 0;
    NEED_CTX();
    gz = small_gzip(&n, data, sizeof data);
    ASSERT(gz != NULL);
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_OK));
    gz[n - 8] ^= 0x40; /* CRC */
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_CRC));
    gz[n - 8] ^= 0x40;
    gz[n - 1] ^= 0x01; /* ISIZE, high byte */
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_ISIZE));
    gz[n - 1] ^= 0x01;
    gz[n - 4] ^= 0x01; /* ISIZE, low byte */
    CHECK_CALL(expect_gunzip(gz, n, 0, MNISTCU_ERR_GZ_ISIZE));
    free(gz);
    PASS();
}

TEST gzip_missing_trailer(void)
{
    unsigned char data[300], *gz;
    size_t n = 0, k;
    NEED_CTX();
    gz = small_gzip(&n, data, sizeof data);
    ASSERT(gz != NULL);
    for (k = 1; k <= 8; ++k) CHECK_CALL(expect_gunzip(gz, n - k, 0, MNISTCU_ERR_GZ_TRUNCATED));
    free(gz);
    PASS();
}

TEST gzip_trailing_garbage(void)
{
    unsigned char data[300], *gz, *longer;
    size_t n = 0;
    NEED_CTX();
    gz = small_gzip(&n, data, sizeof data);
    ASSERT(gz != NULL);
    longer = (unsigned char *)malloc(n + 16);
    ASSERT(longer != NULL);
    memcpy(longer, gz, n);
    free(gz);
    longer[n] = 'x';
    CHECK_CALL(expect_gunzip(longer, n + 1, 0, MNISTCU_ERR_GZ_TRAILING));
    memset(longer + n, 0, 16); /* zero padding is garbage too */
    CHECK_CALL(expect_gunzip(longer, n + 16, 0, MNISTCU_ERR_GZ_TRAILING));
    CHECK_CALL(expect_gunzip(longer, n + 1, 0, MNISTCU_ERR_GZ_TRAILING));
    longer[n] = 0x1F; /* half a magic number */
    CHECK_CALL(expect_gunzip(longer, n + 1, 0, MNISTCU_ERR_GZ_TRAILING));
    longer[n + 1] = 0x8B; /* a whole one starts a member, which is then cut short */
    CHECK_CALL(expect_gunzip(longer, n + 2, 0, MNISTCU_ERR_GZ_HEADER));
    free(longer);
    PASS();
}

TEST gzip_output_limit(void)
{
    unsigned char data[5000], *gz;
    size_t n = 0;
    NEED_CTX();
    fill_compressible(data, sizeof data, 12);
    gz = zlib_compress(data, sizeof data, 6, 31, Z_DEFAULT_STRATEGY, &n);
    ASSERT(gz != NULL);
    CHECK_CALL(expect_gunzip(gz, n, sizeof data, MNISTCU_OK));
    CHECK_CALL(expect_gunzip(gz, n, sizeof data - 1, MNISTCU_ERR_GZ_TOO_LARGE));
    CHECK_CALL(expect_gunzip(gz, n, 100, MNISTCU_ERR_GZ_TOO_LARGE));
    CHECK_CALL(expect_gunzip(gz, n, 1, MNISTCU_ERR_GZ_TOO_LARGE));
    free(gz);
    /* stored blocks too (level 0) */
    gz = zlib_compress(data, sizeof data, 0, -15, Z_DEFAULT_STRATEGY, &n);
    ASSERT(gz != NULL);
    CHECK_CALL(expect_inflate(gz, n, sizeof data, MNISTCU_OK));
    CHECK_CALL(expect_inflate(gz, n, 4000, MNISTCU_ERR_GZ_TOO_LARGE));
    free(gz);
    PASS();
}

/* Every prefix of a valid member fails, with the code of the part cut. */
TEST gzip_truncated_everywhere(void)
{
    unsigned char data[2000], *gz;
    size_t n = 0, len;
    NEED_CTX();
    gz = small_gzip(&n, data, sizeof data);
    ASSERT(gz != NULL);
    for (len = 0; len < n; ++len) {
        mnistcu_result expected = len < 2 ? MNISTCU_ERR_GZ_MAGIC
                                : len < 10 ? MNISTCU_ERR_GZ_HEADER
                                : len < n - 8 ? MNISTCU_ERR_DEFLATE_TRUNCATED
                                : MNISTCU_ERR_GZ_TRUNCATED;
        greatest_test_res res = expect_gunzip(gz, len, 0, expected);
        if (res != GREATEST_TEST_RES_PASS) {
            free(gz);
            return res;
        }
    }
    free(gz);
    PASS();
}

TEST inflate_truncated_everywhere(void)
{
    unsigned char data[3000], *z;
    size_t n = 0, len;
    int level;
    NEED_CTX();
    fill_compressible(data, sizeof data, 13);
    for (level = 0; level <= 9; level += 3) { /* stored, fast, default, best */
        z = zlib_compress(data, sizeof data, level, -15, Z_DEFAULT_STRATEGY, &n);
        ASSERT(z != NULL);
        for (len = 0; len < n; ++len) {
            greatest_test_res res = expect_inflate(z, len, 0, MNISTCU_ERR_DEFLATE_TRUNCATED);
            if (res != GREATEST_TEST_RES_PASS) {
                free(z);
                return res;
            }
        }
        free(z);
    }
    PASS();
}

/* Random damage anywhere: any result, but never a crash, and consistent outputs. */
TEST gzip_random_bit_flips(void)
{
    unsigned char data[4000], *gz, *bad;
    size_t n = 0;
    uint32_t seed = 2024;
    int i, ok = 0;
    NEED_CTX();
    gz = small_gzip(&n, data, sizeof data);
    ASSERT(gz != NULL);
    bad = (unsigned char *)malloc(n);
    ASSERT(bad != NULL);
    for (i = 0; i < 3000; ++i) {
        void *out = (void *)bad;
        size_t out_size = 77;
        int flips = 1 + (int)(rnd(&seed) % 4), f;
        mnistcu_result r;
        memcpy(bad, gz, n);
        for (f = 0; f < flips; ++f) {
            uint32_t at = rnd(&seed);
            bad[at % n] ^= (unsigned char)(1u << (at >> 29));
        }
        r = mnistcu_gunzip(tctx, bad, n, 1u << 20, &out, &out_size);
        if (r == MNISTCU_OK) {
            ok++;
            mnistcu_free(tctx, out);
        } else if (out != NULL || out_size != 0) {
            free(bad);
            free(gz);
            FAILm("a failed gunzip returned output");
        }
    }
    free(bad);
    free(gz);
    /* Flips in the mtime, xfl and os bytes are harmless; nearly all the others are caught by the CRC. */
    ASSERT(ok < 3000);
    PASS();
}

TEST gzip_invalid_arguments(void)
{
    unsigned char byte = 0;
    void *out = NULL;
    size_t out_size = 0;
    NEED_CTX();
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_gunzip(NULL, &byte, 1, 0, &out, &out_size),
                   mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_gunzip(tctx, &byte, 1, 0, NULL, &out_size),
                   mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_gunzip(tctx, &byte, 1, 0, &out, NULL),
                   mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_gunzip(tctx, NULL, 5, 0, &out, &out_size),
                   mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_inflate(NULL, &byte, 1, 0, &out, &out_size, NULL),
                   mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_inflate(tctx, NULL, 5, 0, &out, &out_size, NULL),
                   mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_inflate(tctx, &byte, 1, 0, NULL, &out_size, NULL),
                   mnistcu_result_name);
    ASSERT(out == NULL);
    /* empty input is not an argument error: there is just no stream */
    CHECK_CALL(expect_inflate(NULL, 0, 0, MNISTCU_ERR_DEFLATE_TRUNCATED));
    CHECK_CALL(expect_gunzip(NULL, 0, 0, MNISTCU_ERR_GZ_MAGIC));
    PASS();
}

/* ---- hand-made deflate streams ---- */

TEST deflate_stored_block(void)
{
    bitw w;
    NEED_CTX();
    bw_init(&w);
    bw_block(&w, 0, 0); /* a non-final empty stored block, then a final one */
    bw_align(&w);
    bw_bits(&w, 0x0000, 16);
    bw_bits(&w, 0xFFFF, 16);
    bw_block(&w, 1, 0);
    bw_align(&w);
    bw_bits(&w, 5, 16);
    bw_bits(&w, 0xFFFF ^ 5, 16);
    bw_bits(&w, 'h', 8);
    bw_bits(&w, 'e', 8);
    bw_bits(&w, 'l', 8);
    bw_bits(&w, 'l', 8);
    bw_bits(&w, 'o', 8);
    CHECK_CALL(expect_inflate_output(&w, "hello"));
    PASS();
}

TEST deflate_stored_length_mismatch(void)
{
    bitw w;
    NEED_CTX();
    bw_init(&w);
    bw_block(&w, 1, 0);
    bw_align(&w);
    bw_bits(&w, 5, 16);
    bw_bits(&w, 0xFFFF ^ 4, 16);
    bw_finish(&w, 8);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_STORED_LENGTH));
    PASS();
}

TEST deflate_stored_truncated(void)
{
    bitw w;
    NEED_CTX();
    bw_init(&w);
    bw_block(&w, 1, 0);
    bw_align(&w);
    bw_bits(&w, 100, 16);
    bw_bits(&w, 0xFFFF ^ 100, 16);
    bw_finish(&w, 99); /* one byte short */
    CHECK_CALL(expect_inflate(w.buf, w.len, 0, MNISTCU_ERR_DEFLATE_TRUNCATED));
    PASS();
}

TEST deflate_block_type_3(void)
{
    bitw w;
    NEED_CTX();
    bw_init(&w);
    bw_block(&w, 1, 3);
    bw_finish(&w, 4);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_BLOCK_TYPE));
    /* also after a valid non-final block */
    bw_init(&w);
    bw_block(&w, 0, 1);
    bw_fixed_lit(&w, 'x');
    bw_fixed_lit(&w, 256);
    bw_block(&w, 1, 3);
    bw_finish(&w, 4);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_BLOCK_TYPE));
    PASS();
}

TEST deflate_message_names_offset(void)
{
    unsigned char gz[64];
    bitw w;
    size_t n;
    void *out = NULL;
    size_t out_size = 0;
    NEED_CTX();
    bw_init(&w);
    bw_block(&w, 1, 3);
    bw_finish(&w, 4);
    n = gzip_wrap(gz, w.buf, w.len, NULL, 0);
    ASSERT_ENUM_EQ(MNISTCU_ERR_DEFLATE_BLOCK_TYPE, mnistcu_gunzip(tctx, gz, n, 0, &out, &out_size),
                   mnistcu_result_name);
    /* the deflate data starts after the 10-byte header */
    ASSERTm(mnistcu_ctx_error(tctx), strstr(mnistcu_ctx_error(tctx), "byte 10") != NULL);
    PASS();
}

TEST deflate_fixed_block(void)
{
    bitw w;
    NEED_CTX();
    bw_init(&w);
    bw_block(&w, 1, 1);
    bw_fixed_lit(&w, 'a');
    bw_fixed_lit(&w, 'b');
    bw_fixed_lit(&w, 257); /* length 3 */
    bw_fixed_dist(&w, 1);  /* distance 2 */
    bw_fixed_lit(&w, 256);
    bw_finish(&w, 0);
    CHECK_CALL(expect_inflate_output(&w, "ababa"));
    /* length 258 (symbol 285) at distance 1, which overlaps itself */
    bw_init(&w);
    bw_block(&w, 1, 1);
    bw_fixed_lit(&w, 'z');
    bw_fixed_lit(&w, 285);
    bw_fixed_dist(&w, 0);
    bw_fixed_lit(&w, 256);
    bw_finish(&w, 0);
    {
        char expected[260];
        memset(expected, 'z', 259);
        expected[259] = '\0';
        CHECK_CALL(expect_inflate_output(&w, expected));
    }
    PASS();
}

TEST deflate_invalid_length_symbols(void)
{
    bitw w;
    unsigned sym;
    NEED_CTX();
    for (sym = 286; sym <= 287; ++sym) {
        bw_init(&w);
        bw_block(&w, 1, 1);
        bw_fixed_lit(&w, 'a');
        bw_fixed_lit(&w, sym);
        bw_finish(&w, 4);
        CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_SYMBOL));
    }
    PASS();
}

TEST deflate_invalid_distance_symbols(void)
{
    bitw w;
    unsigned sym;
    NEED_CTX();
    for (sym = 30; sym <= 31; ++sym) {
        bw_init(&w);
        bw_block(&w, 1, 1);
        bw_fixed_lit(&w, 'a');
        bw_fixed_lit(&w, 257);
        bw_fixed_dist(&w, sym);
        bw_finish(&w, 4);
        CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_SYMBOL));
    }
    PASS();
}

TEST deflate_distance_too_far(void)
{
    bitw w;
    NEED_CTX();
    /* one byte written, a match 2 back */
    bw_init(&w);
    bw_block(&w, 1, 1);
    bw_fixed_lit(&w, 'a');
    bw_fixed_lit(&w, 257);
    bw_fixed_dist(&w, 1);
    bw_fixed_lit(&w, 256);
    bw_finish(&w, 2);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_DISTANCE));
    /* nothing written yet, a match 1 back */
    bw_init(&w);
    bw_block(&w, 1, 1);
    bw_fixed_lit(&w, 257);
    bw_fixed_dist(&w, 0);
    bw_fixed_lit(&w, 256);
    bw_finish(&w, 2);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_DISTANCE));
    /* 32768 back (symbol 29 + 8191) after only 1000 bytes of output */
    bw_init(&w);
    bw_block(&w, 1, 1);
    {
        int i;
        for (i = 0; i < 1000; ++i) bw_fixed_lit(&w, 'q');
    }
    bw_fixed_lit(&w, 257);
    bw_fixed_dist(&w, 29);
    bw_bits(&w, 8191, 13);
    bw_fixed_lit(&w, 256);
    bw_finish(&w, 2);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_DISTANCE));
    PASS();
}

TEST deflate_truncated_fixed(void)
{
    bitw w;
    NEED_CTX();
    bw_init(&w);
    bw_block(&w, 1, 1);
    bw_fixed_lit(&w, 'a');
    bw_fixed_lit(&w, 'b');
    bw_finish(&w, 0); /* no end-of-block */
    CHECK_CALL(expect_inflate(w.buf, w.len, 0, MNISTCU_ERR_DEFLATE_TRUNCATED));
    bw_init(&w);
    bw_block(&w, 0, 1); /* a complete non-final block, then nothing */
    bw_fixed_lit(&w, 256);
    bw_finish(&w, 0);
    CHECK_CALL(expect_inflate(w.buf, w.len, 0, MNISTCU_ERR_DEFLATE_TRUNCATED));
    PASS();
}

TEST deflate_dynamic_block(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    /* literals 'a' 'b' and end-of-block (2, 2, 1 bits), 257 (length 3) with 2
       bits; two distance codes of 1 bit */
    dyn_init(&d, 258, 2);
    d.lens[(int)'a'] = 2;
    d.lens[(int)'b'] = 3;
    d.lens[256] = 1;
    d.lens[257] = 3;
    d.lens[258] = 1;
    d.lens[259] = 1;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    dyn_lit(&w, &d, 'a');
    dyn_lit(&w, &d, 'b');
    dyn_lit(&w, &d, 257);
    dyn_dist(&w, &d, 1); /* distance 2 */
    dyn_lit(&w, &d, 256);
    bw_finish(&w, 0);
    CHECK_CALL(expect_inflate_output(&w, "ababa"));
    PASS();
}

TEST deflate_too_many_length_codes(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    dyn_init(&d, 287, 1); /* HLIT > 286 */
    bw_init(&w);
    dyn_header(&w, &d, 1);
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_LENGTHS));
    dyn_init(&d, 288, 1);
    bw_init(&w);
    dyn_header(&w, &d, 1);
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_LENGTHS));
    PASS();
}

TEST deflate_too_many_distance_codes(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    dyn_init(&d, 257, 31); /* HDIST > 30 */
    bw_init(&w);
    dyn_header(&w, &d, 1);
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_LENGTHS));
    dyn_init(&d, 257, 32);
    bw_init(&w);
    dyn_header(&w, &d, 1);
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_LENGTHS));
    PASS();
}

TEST deflate_code_length_code_bad(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    /* over-subscribed: three code-length symbols of 1 bit */
    dyn_init(&d, 257, 1);
    memset(d.clen_lens, 0, sizeof d.clen_lens);
    d.clen_lens[0] = 1;
    d.clen_lens[1] = 1;
    d.clen_lens[18] = 1;
    bw_init(&w);
    dyn_header(&w, &d, 1);
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_OVERSUBSCRIBED));
    /* incomplete: two symbols of 2 bits */
    d.clen_lens[0] = 2;
    d.clen_lens[1] = 2;
    d.clen_lens[18] = 0;
    bw_init(&w);
    dyn_header(&w, &d, 1);
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_INCOMPLETE));
    /* a single code of 1 bit is incomplete too: only literal/length and distance codes may be */
    d.clen_lens[0] = 1;
    d.clen_lens[1] = 0;
    bw_init(&w);
    dyn_header(&w, &d, 1);
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_INCOMPLETE));
    /* no code at all */
    d.clen_lens[0] = 0;
    bw_init(&w);
    dyn_header(&w, &d, 1);
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_INCOMPLETE));
    PASS();
}

TEST deflate_repeat_without_previous(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    dyn_init(&d, 257, 1);
    bw_init(&w);
    dyn_header(&w, &d, 1);
    dyn_clen(&w, &d, 16, 0, 2); /* "repeat the previous length 3 times", first */
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_LENGTHS));
    PASS();
}

TEST deflate_repeat_past_end(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    /* 258 lengths expected: 138 + 138 zeros run past them */
    dyn_init(&d, 257, 1);
    bw_init(&w);
    dyn_header(&w, &d, 1);
    dyn_clen(&w, &d, 18, 127, 7);
    dyn_clen(&w, &d, 18, 127, 7);
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_LENGTHS));
    /* 257 lengths given, then a repeat of 3 with only 1 left */
    bw_init(&w);
    dyn_header(&w, &d, 1);
    dyn_clen(&w, &d, 18, 127, 7); /* 138 */
    dyn_clen(&w, &d, 18, 107, 7); /* 118: 256 so far */
    dyn_clen(&w, &d, 1, 0, 0);    /* 257 */
    dyn_clen(&w, &d, 16, 0, 2);   /* 3 more: only 1 fits */
    bw_finish(&w, 40);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_LENGTHS));
    /* exactly filling them is fine: 256 zeros, then 256 gets 1 bit, distance 1 bit (single code) */
    bw_init(&w);
    dyn_header(&w, &d, 1);
    dyn_clen(&w, &d, 18, 127, 7);
    dyn_clen(&w, &d, 18, 107, 7);
    dyn_clen(&w, &d, 1, 0, 0);
    dyn_clen(&w, &d, 1, 0, 0);
    bw_bits(&w, 0, 1); /* end of block: the single literal/length code, "0" */
    bw_finish(&w, 0);
    CHECK_CALL(expect_inflate_output(&w, ""));
    PASS();
}

TEST deflate_no_end_of_block(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    dyn_init(&d, 257, 1);
    d.lens[(int)'a'] = 1;
    d.lens[(int)'b'] = 1;
    d.lens[257] = 1; /* distance code: one code of 1 bit */
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    bw_finish(&w, 8);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_NO_END_OF_BLOCK));
    PASS();
}

TEST deflate_literal_code_bad(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    /* over-subscribed: three codes of 1 bit */
    dyn_init(&d, 257, 1);
    d.lens[(int)'a'] = 1;
    d.lens[(int)'b'] = 1;
    d.lens[256] = 1;
    d.lens[257] = 1;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    bw_finish(&w, 8);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_OVERSUBSCRIBED));
    /* incomplete: 1 + 2 bits */
    dyn_init(&d, 257, 1);
    d.lens[(int)'a'] = 1;
    d.lens[256] = 2;
    d.lens[257] = 1;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    bw_finish(&w, 8);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_INCOMPLETE));
    /* incomplete: a single code, but of 2 bits */
    dyn_init(&d, 257, 1);
    d.lens[256] = 2;
    d.lens[257] = 1;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    bw_finish(&w, 8);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_INCOMPLETE));
    PASS();
}

TEST deflate_distance_code_bad(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    /* over-subscribed */
    dyn_init(&d, 257, 3);
    d.lens[(int)'a'] = 1;
    d.lens[256] = 1;
    d.lens[257] = 1;
    d.lens[258] = 1;
    d.lens[259] = 1;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    bw_finish(&w, 8);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_OVERSUBSCRIBED));
    /* incomplete: 1 + 2 bits */
    dyn_init(&d, 257, 2);
    d.lens[(int)'a'] = 1;
    d.lens[256] = 1;
    d.lens[257] = 1;
    d.lens[258] = 2;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    bw_finish(&w, 8);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_INCOMPLETE));
    /* incomplete: a single code of 3 bits */
    dyn_init(&d, 257, 2);
    d.lens[(int)'a'] = 1;
    d.lens[256] = 1;
    d.lens[258] = 3;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    bw_finish(&w, 8);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_INCOMPLETE));
    PASS();
}

/* The incomplete codes deflate allows: one code of 1 bit (literal/length or
   distance), and no distance code at all. Using their unused bit patterns is
   an invalid symbol. */
TEST deflate_allowed_incomplete_codes(void)
{
    bitw w;
    dyn d;
    NEED_CTX();
    /* only end-of-block, 1 bit; no distance codes */
    dyn_init(&d, 257, 1);
    d.lens[256] = 1;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    dyn_lit(&w, &d, 256);
    bw_finish(&w, 0);
    CHECK_CALL(expect_inflate_output(&w, ""));
    /* ... and its unused pattern "1" */
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    bw_code(&w, 1, 1);
    bw_finish(&w, 4);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_SYMBOL));

    /* literals and matches with a single distance code of 1 bit */
    dyn_init(&d, 258, 1);
    d.lens[(int)'a'] = 1;
    d.lens[256] = 2;
    d.lens[257] = 2;
    d.lens[258] = 1;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    dyn_lit(&w, &d, 'a');
    dyn_lit(&w, &d, 257);
    dyn_dist(&w, &d, 0); /* distance 1 */
    dyn_lit(&w, &d, 256);
    bw_finish(&w, 0);
    CHECK_CALL(expect_inflate_output(&w, "aaaa"));
    /* ... and its unused pattern "1" */
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    dyn_lit(&w, &d, 'a');
    dyn_lit(&w, &d, 257);
    bw_code(&w, 1, 1);
    dyn_lit(&w, &d, 256);
    bw_finish(&w, 4);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_SYMBOL));

    /* no distance code: literals only are fine */
    dyn_init(&d, 258, 1);
    d.lens[(int)'a'] = 1;
    d.lens[256] = 2;
    d.lens[257] = 2;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    dyn_lit(&w, &d, 'a');
    dyn_lit(&w, &d, 'a');
    dyn_lit(&w, &d, 256);
    bw_finish(&w, 0);
    CHECK_CALL(expect_inflate_output(&w, "aa"));
    /* ... but a match has no distance to decode */
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    dyn_lit(&w, &d, 'a');
    dyn_lit(&w, &d, 257);
    bw_code(&w, 0, 1);
    dyn_lit(&w, &d, 256);
    bw_finish(&w, 4);
    CHECK_CALL(expect_deflate(&w, MNISTCU_ERR_DEFLATE_SYMBOL));
    PASS();
}

/* Codes longer than the decoder's lookup table: 15-bit codes. */
TEST deflate_long_codes(void)
{
    bitw w;
    dyn d;
    int i;
    char expected[40];
    NEED_CTX();
    /* lengths 1, 2, ..., 14, 15, 15: a complete code reaching the 15-bit maximum */
    dyn_init(&d, 257, 1);
    for (i = 0; i < 14; ++i) d.lens['A' + i] = (unsigned char)(i + 1);
    d.lens['A' + 14] = 15;
    d.lens[256] = 15;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    for (i = 14; i >= 0; --i) {
        dyn_lit(&w, &d, (unsigned)('A' + i));
        expected[14 - i] = (char)('A' + i);
    }
    expected[15] = '\0';
    dyn_lit(&w, &d, 256);
    bw_finish(&w, 0);
    CHECK_CALL(expect_inflate_output(&w, expected));
    PASS();
}

/* ==== idx_suite ================================================================== */

/* IDX bytes: header, then the payload given (already big-endian). */
static size_t make_idx(unsigned char *dst, unsigned type, int ndim, const uint32_t *dims, const void *payload,
                       size_t payload_n)
{
    int d;
    dst[0] = 0;
    dst[1] = 0;
    dst[2] = (unsigned char)type;
    dst[3] = (unsigned char)ndim;
    for (d = 0; d < ndim; ++d) put_be32(dst + 4 + 4 * d, dims[d]);
    if (payload_n) memcpy(dst + 4 + 4 * ndim, payload, payload_n);
    return 4 + 4 * (size_t)ndim + payload_n;
}

/* Loads `bytes` four ways (memory and file, raw and gzip) and checks the
   result against the expected header and host-order values. */
static greatest_test_res check_idx_all_ways(const unsigned char *bytes, size_t n, mnistcu_idx_type type, int ndim,
                                            const uint32_t *dims, size_t elem_size, const void *expected,
                                            size_t count)
{
    int way;
    size_t gz_n = 0;
    unsigned char *gz = zlib_compress(bytes, n, 9, 31, Z_DEFAULT_STRATEGY, &gz_n);
    ASSERT(gz != NULL);
    for (way = 0; way < 4; ++way) {
        mnistcu_idx idx;
        mnistcu_result r;
        const unsigned char *src = way & 1 ? gz : bytes;
        size_t src_n = way & 1 ? gz_n : n;
        int d;
        char path[512];
        if (way < 2) {
            r = mnistcu_idx_load_memory(tctx, src, src_n, way ? "mem.idx.gz" : "mem.idx", &idx);
        } else {
            temp_path(path, sizeof path, way & 1 ? ".idx.gz" : ".idx");
            ASSERTm("cannot write a temp file", write_whole(path, src, src_n));
            r = mnistcu_idx_load_file(tctx, path, &idx);
            remove(path);
        }
        if (r != MNISTCU_OK) free(gz);
        ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
        ASSERT_EQ((int)type, (int)idx.type);
        ASSERT_EQ(ndim, idx.ndim);
        for (d = 0; d < ndim; ++d) ASSERT_EQ(dims[d], idx.dims[d]);
        ASSERT_EQ(count, idx.count);
        ASSERT_EQ(elem_size, idx.elem_size);
        ASSERT(idx.data != NULL);
        ASSERT_MEM_EQ(expected, idx.data, count * elem_size);
        mnistcu_idx_free(tctx, &idx);
        ASSERT(idx.data == NULL);
    }
    free(gz);
    PASS();
}

TEST idx_u8(void)
{
    static const unsigned char be[6] = {0, 1, 127, 128, 254, 255};
    static const uint8_t host[6] = {0, 1, 127, 128, 254, 255};
    unsigned char buf[64];
    uint32_t dims[2] = {2, 3};
    NEED_CTX();
    CHECK_CALL(check_idx_all_ways(buf, make_idx(buf, 0x08, 2, dims, be, sizeof be), MNISTCU_IDX_U8, 2, dims, 1,
                                  host, 6));
    PASS();
}

TEST idx_i8(void)
{
    static const unsigned char be[5] = {0x80, 0xFF, 0x00, 0x01, 0x7F};
    static const int8_t host[5] = {-128, -1, 0, 1, 127};
    unsigned char buf[64];
    uint32_t dims[1] = {5};
    NEED_CTX();
    CHECK_CALL(check_idx_all_ways(buf, make_idx(buf, 0x09, 1, dims, be, sizeof be), MNISTCU_IDX_I8, 1, dims, 1,
                                  host, 5));
    PASS();
}

TEST idx_i16(void)
{
    static const unsigned char be[10] = {0x80, 0x00, 0xFF, 0xFE, 0x00, 0x00, 0x01, 0x02, 0x7F, 0xFF};
    static const int16_t host[5] = {-32768, -2, 0, 258, 32767};
    unsigned char buf[64];
    uint32_t dims[3] = {1, 5, 1};
    NEED_CTX();
    CHECK_CALL(check_idx_all_ways(buf, make_idx(buf, 0x0B, 3, dims, be, sizeof be), MNISTCU_IDX_I16, 3, dims, 2,
                                  host, 5));
    PASS();
}

TEST idx_i32(void)
{
    static const unsigned char be[20] = {0x80, 0x00, 0x00, 0x00, 0xF8, 0xA4, 0x32, 0xEB, 0x00, 0x00,
                                         0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x7F, 0xFF, 0xFF, 0xFF};
    static const int32_t host[5] = {(-2147483647 - 1), -123456789, 0, 256, 2147483647};
    unsigned char buf[64];
    uint32_t dims[1] = {5};
    NEED_CTX();
    CHECK_CALL(check_idx_all_ways(buf, make_idx(buf, 0x0C, 1, dims, be, sizeof be), MNISTCU_IDX_I32, 1, dims, 4,
                                  host, 5));
    PASS();
}

TEST idx_f32(void)
{
    /* IEEE 754 single, big-endian: -1.5, 0.1f, FLT_MAX, -0.0, 123.456f, smallest subnormal */
    static const unsigned char be[24] = {0xBF, 0xC0, 0x00, 0x00, 0x3D, 0xCC, 0xCC, 0xCD, 0x7F, 0x7F, 0xFF, 0xFF,
                                         0x80, 0x00, 0x00, 0x00, 0x42, 0xF6, 0xE9, 0x79, 0x00, 0x00, 0x00, 0x01};
    float host[6];
    unsigned char buf[64];
    uint32_t dims[2] = {3, 2};
    NEED_CTX();
    host[0] = -1.5f;
    host[1] = 0.1f;
    host[2] = FLT_MAX;
    host[3] = -0.0f;
    host[4] = 123.456f;
    host[5] = 1.40129846e-45f;
    CHECK_CALL(check_idx_all_ways(buf, make_idx(buf, 0x0D, 2, dims, be, sizeof be), MNISTCU_IDX_F32, 2, dims, 4,
                                  host, 6));
    PASS();
}

TEST idx_f64(void)
{
    /* IEEE 754 double, big-endian: -2.25, 0.1, pi, DBL_MAX, -1e-300 */
    static const unsigned char be[40] = {
        0xC0, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3F, 0xB9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9A,
        0x40, 0x09, 0x21, 0xFB, 0x54, 0x44, 0x2D, 0x18, 0x7F, 0xEF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
        0x81, 0xA5, 0x6E, 0x1F, 0xC2, 0xF8, 0xF3, 0x59};
    double host[5];
    unsigned char buf[64];
    uint32_t dims[1] = {5};
    NEED_CTX();
    host[0] = -2.25;
    host[1] = 0.1;
    host[2] = 3.141592653589793;
    host[3] = DBL_MAX;
    host[4] = -1e-300;
    CHECK_CALL(check_idx_all_ways(buf, make_idx(buf, 0x0E, 1, dims, be, sizeof be), MNISTCU_IDX_F64, 1, dims, 8,
                                  host, 5));
    PASS();
}

TEST idx_type_names(void)
{
    ASSERT_STR_EQ("ubyte", mnistcu_idx_type_name(MNISTCU_IDX_U8));
    ASSERT_STR_EQ("byte", mnistcu_idx_type_name(MNISTCU_IDX_I8));
    ASSERT_STR_EQ("short", mnistcu_idx_type_name(MNISTCU_IDX_I16));
    ASSERT_STR_EQ("int", mnistcu_idx_type_name(MNISTCU_IDX_I32));
    ASSERT_STR_EQ("float", mnistcu_idx_type_name(MNISTCU_IDX_F32));
    ASSERT_STR_EQ("double", mnistcu_idx_type_name(MNISTCU_IDX_F64));
    ASSERT(mnistcu_idx_type_name((mnistcu_idx_type)0x0A) == NULL);
    ASSERT(mnistcu_idx_type_name((mnistcu_idx_type)0) == NULL);
    PASS();
}

TEST idx_empty_dimension(void)
{
    unsigned char buf[64];
    uint32_t dims[3] = {0, 28, 28};
    mnistcu_idx idx;
    NEED_CTX();
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_idx_load_memory(tctx, buf, make_idx(buf, 0x08, 3, dims, NULL, 0), "e", &idx),
                   mnistcu_result_name);
    ASSERT_EQ((size_t)0, idx.count);
    ASSERT_EQ(3, idx.ndim);
    ASSERT_EQ((uint32_t)28, idx.dims[2]);
    mnistcu_idx_free(tctx, &idx);
    /* a zero anywhere makes the product zero, however large the other dimensions */
    dims[0] = 0xFFFFFFFFu;
    dims[1] = 0xFFFFFFFFu;
    dims[2] = 0;
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_idx_load_memory(tctx, buf, make_idx(buf, 0x0E, 3, dims, NULL, 0), "e", &idx),
                   mnistcu_result_name);
    ASSERT_EQ((size_t)0, idx.count);
    mnistcu_idx_free(tctx, &idx);
    /* but then no payload may follow */
    buf[make_idx(buf, 0x0E, 3, dims, NULL, 0)] = 1;
    CHECK_CALL(expect_idx(buf, 4 + 12 + 1, MNISTCU_ERR_IDX_TRAILING));
    PASS();
}

TEST idx_max_dims(void)
{
    unsigned char buf[128];
    uint32_t dims[MNISTCU_IDX_MAX_DIMS + 1];
    unsigned char payload[2] = {42, 43};
    mnistcu_idx idx;
    int d;
    NEED_CTX();
    for (d = 0; d <= MNISTCU_IDX_MAX_DIMS; ++d) dims[d] = 1;
    dims[0] = 2;
    ASSERT_ENUM_EQ(MNISTCU_OK,
                   mnistcu_idx_load_memory(tctx, buf, make_idx(buf, 0x08, MNISTCU_IDX_MAX_DIMS, dims, payload, 2),
                                           "max", &idx),
                   mnistcu_result_name);
    ASSERT_EQ(MNISTCU_IDX_MAX_DIMS, idx.ndim);
    ASSERT_EQ((size_t)2, idx.count);
    ASSERT_MEM_EQ(payload, idx.data, 2);
    mnistcu_idx_free(tctx, &idx);
    CHECK_CALL(expect_idx(buf, make_idx(buf, 0x08, MNISTCU_IDX_MAX_DIMS + 1, dims, payload, 2),
                          MNISTCU_ERR_IDX_NDIM));
    CHECK_CALL(expect_idx(buf, make_idx(buf, 0x08, 0, dims, payload, 2), MNISTCU_ERR_IDX_NDIM));
    buf[3] = 255; /* the dimension count is checked before the header's length */
    CHECK_CALL(expect_idx(buf, 4, MNISTCU_ERR_IDX_NDIM));
    PASS();
}

TEST idx_too_short_for_header(void)
{
    static const unsigned char bytes[4] = {0, 0, 8, 1};
    size_t n;
    NEED_CTX();
    for (n = 0; n < 4; ++n) CHECK_CALL(expect_idx(bytes, n, MNISTCU_ERR_IDX_TRUNCATED));
    CHECK_CALL(expect_idx(NULL, 0, MNISTCU_ERR_IDX_TRUNCATED));
    PASS();
}

TEST idx_bad_magic(void)
{
    unsigned char buf[64];
    uint32_t dims[1] = {1};
    unsigned char one = 7;
    NEED_CTX();
    make_idx(buf, 0x08, 1, dims, &one, 1);
    buf[0] = 1;
    CHECK_CALL(expect_idx(buf, 9, MNISTCU_ERR_IDX_MAGIC));
    buf[0] = 0;
    buf[1] = 0x80;
    CHECK_CALL(expect_idx(buf, 9, MNISTCU_ERR_IDX_MAGIC));
    buf[0] = 0x1F; /* 1f but not 8b: not gzip either */
    buf[1] = 0x00;
    CHECK_CALL(expect_idx(buf, 9, MNISTCU_ERR_IDX_MAGIC));
    PASS();
}

TEST idx_bad_type(void)
{
    static const unsigned types[] = {0x00, 0x01, 0x07, 0x0A, 0x0F, 0x10, 0x88, 0xFF};
    unsigned char buf[64];
    uint32_t dims[1] = {1};
    unsigned char eight[8] = {0};
    size_t i;
    NEED_CTX();
    for (i = 0; i < sizeof types / sizeof types[0]; ++i)
        CHECK_CALL(expect_idx(buf, make_idx(buf, types[i], 1, dims, eight, 8), MNISTCU_ERR_IDX_TYPE));
    PASS();
}

TEST idx_truncated_header(void)
{
    unsigned char buf[64];
    uint32_t dims[3] = {1, 1, 1};
    unsigned char one = 1;
    size_t n;
    NEED_CTX();
    make_idx(buf, 0x08, 3, dims, &one, 1);
    for (n = 4; n < 16; ++n) CHECK_CALL(expect_idx(buf, n, MNISTCU_ERR_IDX_TRUNCATED));
    PASS();
}

TEST idx_size_overflow(void)
{
    unsigned char buf[64];
    uint32_t dims[4] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    NEED_CTX();
    /* (2^32 - 1)^4 elements overflow any size_t up to 64 bits */
    CHECK_CALL(expect_idx(buf, make_idx(buf, 0x08, 4, dims, NULL, 0), MNISTCU_ERR_IDX_OVERFLOW));
    if (sizeof(size_t) == 8) {
        /* 2^62 elements fit, times 8 bytes do not */
        dims[0] = 0x80000000u;
        dims[1] = 0x80000000u;
        CHECK_CALL(expect_idx(buf, make_idx(buf, 0x0E, 2, dims, NULL, 0), MNISTCU_ERR_IDX_OVERFLOW));
    }
    PASS();
}

TEST idx_payload_too_large(void)
{
    unsigned char buf[64];
    uint32_t dims[2];
    NEED_CTX();
    /* one byte above the cap, in bytes and in doubles */
    dims[0] = (uint32_t)(TEST_IDX_MAX_BYTES / 2);
    dims[1] = 2;
    CHECK_CALL(expect_idx(buf, make_idx(buf, 0x08, 2, dims, NULL, 0), MNISTCU_ERR_IDX_TRUNCATED)); /* = cap: fine */
    dims[1] = 3;
    CHECK_CALL(expect_idx(buf, make_idx(buf, 0x08, 2, dims, NULL, 0), MNISTCU_ERR_IDX_TOO_LARGE));
    dims[0] = (uint32_t)(TEST_IDX_MAX_BYTES / 8 + 1);
    CHECK_CALL(expect_idx(buf, make_idx(buf, 0x0E, 1, dims, NULL, 0), MNISTCU_ERR_IDX_TOO_LARGE));
    PASS();
}

TEST idx_payload_truncated_and_trailing(void)
{
    unsigned char buf[128], *gz;
    uint32_t dims[2] = {3, 4};
    unsigned char payload[24];
    size_t n, gz_n = 0;
    NEED_CTX();
    fill_random(payload, sizeof payload, 3);
    n = make_idx(buf, 0x0B, 2, dims, payload, 24); /* 12 shorts */
    CHECK_CALL(expect_idx(buf, n, MNISTCU_OK));
    CHECK_CALL(expect_idx(buf, n - 1, MNISTCU_ERR_IDX_TRUNCATED));
    CHECK_CALL(expect_idx(buf, 4 + 8, MNISTCU_ERR_IDX_TRUNCATED));
    buf[n] = 0;
    CHECK_CALL(expect_idx(buf, n + 1, MNISTCU_ERR_IDX_TRAILING));
    /* the same through gzip */
    gz = zlib_compress(buf, n - 1, 6, 31, Z_DEFAULT_STRATEGY, &gz_n);
    ASSERT(gz != NULL);
    CHECK_CALL(expect_idx(gz, gz_n, MNISTCU_ERR_IDX_TRUNCATED));
    free(gz);
    gz = zlib_compress(buf, n + 1, 6, 31, Z_DEFAULT_STRATEGY, &gz_n);
    ASSERT(gz != NULL);
    CHECK_CALL(expect_idx(gz, gz_n, MNISTCU_ERR_IDX_TRAILING));
    free(gz);
    PASS();
}

TEST idx_message_has_numbers(void)
{
    unsigned char buf[64];
    uint32_t dims[1] = {10};
    mnistcu_idx idx;
    NEED_CTX();
    memset(buf, 0, sizeof buf);
    make_idx(buf, 0x08, 1, dims, NULL, 0);
    ASSERT_ENUM_EQ(MNISTCU_ERR_IDX_TRUNCATED, mnistcu_idx_load_memory(tctx, buf, 8 + 9, "x.idx", &idx),
                   mnistcu_result_name);
    ASSERTm(mnistcu_ctx_error(tctx), strstr(mnistcu_ctx_error(tctx), "17") != NULL);
    ASSERTm(mnistcu_ctx_error(tctx), strstr(mnistcu_ctx_error(tctx), "18") != NULL);
    /* a NULL name reads "<memory>" */
    ASSERT_ENUM_EQ(MNISTCU_ERR_IDX_TRUNCATED, mnistcu_idx_load_memory(tctx, buf, 8 + 9, NULL, &idx),
                   mnistcu_result_name);
    ASSERTm(mnistcu_ctx_error(tctx), strncmp(mnistcu_ctx_error(tctx), "<memory>", 8) == 0);
    PASS();
}

/* gzip errors inside the loader carry the file name too. */
TEST idx_gzip_errors(void)
{
    unsigned char buf[64], *gz;
    uint32_t dims[1] = {20};
    unsigned char payload[20];
    size_t n, gz_n = 0;
    NEED_CTX();
    fill_random(payload, sizeof payload, 9);
    n = make_idx(buf, 0x08, 1, dims, payload, sizeof payload);
    gz = zlib_compress(buf, n, 6, 31, Z_DEFAULT_STRATEGY, &gz_n);
    ASSERT(gz != NULL);
    CHECK_CALL(expect_idx(gz, gz_n, MNISTCU_OK));
    gz[gz_n - 6] ^= 1;
    CHECK_CALL(expect_idx(gz, gz_n, MNISTCU_ERR_GZ_CRC));
    gz[gz_n - 6] ^= 1;
    CHECK_CALL(expect_idx(gz, gz_n - 1, MNISTCU_ERR_GZ_TRUNCATED));
    CHECK_CALL(expect_idx(gz, 5, MNISTCU_ERR_GZ_HEADER));
    CHECK_CALL(expect_idx(gz, 14, MNISTCU_ERR_DEFLATE_TRUNCATED));
    gz[3] = 0x80;
    CHECK_CALL(expect_idx(gz, gz_n, MNISTCU_ERR_GZ_FLAGS));
    free(gz);
    PASS();
}

TEST idx_file_errors(void)
{
    char path[512];
    mnistcu_idx idx;
    unsigned char buf[64];
    uint32_t dims[1] = {4};
    NEED_CTX();
    temp_path(path, sizeof path, "/does-not-exist.idx");
    memset(&idx, 0xCD, sizeof idx);
    ASSERT_ENUM_EQ(MNISTCU_ERR_NOT_FOUND, mnistcu_idx_load_file(tctx, path, &idx), mnistcu_result_name);
    ASSERT(idx.data == NULL && idx.ndim == 0);
    ASSERTm(mnistcu_ctx_error(tctx), strstr(mnistcu_ctx_error(tctx), path) != NULL);
    /* a broken file: the message names its path */
    temp_path(path, sizeof path, ".idx");
    ASSERT(write_whole(path, buf, make_idx(buf, 0x08, 1, dims, buf, 3)));
    ASSERT_ENUM_EQ(MNISTCU_ERR_IDX_TRUNCATED, mnistcu_idx_load_file(tctx, path, &idx), mnistcu_result_name);
    remove(path);
    ASSERTm(mnistcu_ctx_error(tctx), strncmp(mnistcu_ctx_error(tctx), path, strlen(path)) == 0);
    PASS();
}

TEST idx_invalid_arguments(void)
{
    unsigned char buf[16] = {0, 0, 8, 1, 0, 0, 0, 1, 5};
    mnistcu_idx idx;
    NEED_CTX();
    memset(&idx, 0xCD, sizeof idx);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_idx_load_memory(NULL, buf, 9, "x", &idx),
                   mnistcu_result_name);
    ASSERT(idx.data == NULL);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_idx_load_memory(tctx, buf, 9, "x", NULL),
                   mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_idx_load_memory(tctx, NULL, 9, "x", &idx),
                   mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_idx_load_file(NULL, "x", &idx), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_idx_load_file(tctx, NULL, &idx), mnistcu_result_name);
    ASSERT_ENUM_EQ(MNISTCU_ERR_INVALID_ARGUMENT, mnistcu_idx_load_file(tctx, "x", NULL), mnistcu_result_name);
    /* a good load, then free twice and free NULL: all fine */
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_idx_load_memory(tctx, buf, 9, "x", &idx), mnistcu_result_name);
    ASSERT_EQ(5, ((const unsigned char *)idx.data)[0]);
    mnistcu_idx_free(tctx, &idx);
    ASSERT(idx.data == NULL && idx.count == 0);
    mnistcu_idx_free(tctx, &idx);
    mnistcu_idx_free(tctx, NULL);
    PASS();
}

/* Random damage to a small gzip'd IDX file: never a crash, out zeroed on failure. */
TEST idx_random_damage(void)
{
    unsigned char buf[600], *gz, *bad;
    uint32_t dims[2] = {20, 7};
    unsigned char payload[560];
    size_t n, gz_n = 0;
    uint32_t seed = 77;
    int i;
    NEED_CTX();
    fill_compressible(payload, sizeof payload, 1);
    n = make_idx(buf, 0x0C, 2, dims, payload, sizeof payload);
    gz = zlib_compress(buf, n, 6, 31, Z_DEFAULT_STRATEGY, &gz_n);
    ASSERT(gz != NULL);
    bad = (unsigned char *)malloc(n > gz_n ? n : gz_n);
    ASSERT(bad != NULL);
    for (i = 0; i < 2000; ++i) {
        int use_gz = i & 1;
        size_t len = use_gz ? gz_n : n;
        mnistcu_idx idx;
        mnistcu_result r;
        memcpy(bad, use_gz ? gz : buf, len);
        bad[rnd(&seed) % len] ^= (unsigned char)(1u << (rnd(&seed) % 8));
        if (rnd(&seed) % 4 == 0) len = rnd(&seed) % len;
        r = mnistcu_idx_load_memory(tctx, bad, len, "damaged", &idx);
        if (r == MNISTCU_OK) {
            mnistcu_idx_free(tctx, &idx);
        } else if (idx.data != NULL || idx.count != 0 || idx.ndim != 0) {
            free(bad);
            free(gz);
            FAILm("a failed load left data in out");
        }
    }
    free(bad);
    free(gz);
    PASS();
}

/* ---- bounded decompression --------------------------------------------------------
   gzip'd IDX data is sized by its header, read as soon as it is out: a header
   above the cap, or declaring more than the input can expand to, is refused at
   once; the output is allocated once at the exact size; one byte beyond it is
   refused. The memory is counted through the context's allocator hooks. */

/* An allocator that counts the bytes live and their peak. */
typedef struct peak_alloc {
    size_t live, peak, count, largest;
} peak_alloc;

#define PEAK_HEADER 16 /* each block starts with its size; 16 bytes keep malloc's alignment */

static void *peak_alloc_fn(void *user, size_t size)
{
    peak_alloc *a = (peak_alloc *)user;
    unsigned char *p = size <= (size_t)-1 - PEAK_HEADER ? (unsigned char *)malloc(size + PEAK_HEADER) : NULL;
    if (!p) return NULL;
    memcpy(p, &size, sizeof size);
    a->live += size;
    a->count++;
    if (a->live > a->peak) a->peak = a->live;
    if (size > a->largest) a->largest = size;
    return p + PEAK_HEADER;
}

static void peak_free_fn(void *user, void *ptr)
{
    peak_alloc *a = (peak_alloc *)user;
    unsigned char *p;
    size_t size;
    if (!ptr) return;
    p = (unsigned char *)ptr - PEAK_HEADER;
    memcpy(&size, p, sizeof size);
    a->live -= size;
    free(p);
}

/* A silent CPU context whose host memory goes through a. */
static mnistcu_ctx *peak_ctx(peak_alloc *a)
{
    mnistcu_ctx_desc desc;
    mnistcu_ctx *ctx = NULL;
    memset(a, 0, sizeof *a);
    memset(&desc, 0, sizeof desc);
    desc.device = MNISTCU_DEVICE_CPU;
    desc.log_level = MNISTCU_LOG_SILENT;
    desc.allocator.alloc = peak_alloc_fn;
    desc.allocator.free = peak_free_fn;
    desc.allocator.user = a;
    if (mnistcu_ctx_create(&ctx, &desc) != MNISTCU_OK) {
        mnistcu_ctx_destroy(ctx);
        return NULL;
    }
    return ctx;
}

/* Measures from here: the peak is then what one call adds to what is live. */
static void peak_start(peak_alloc *a)
{
    a->peak = a->live;
    a->count = 0;
    a->largest = 0;
}

static size_t peak_added(const peak_alloc *a, size_t live_before) { return a->peak - live_before; }

/* The CRC-32 of n zero bytes, in O(log n) steps with zlib's crc32_combine. */
static uLong crc32_of_zeros(size_t n)
{
    static const unsigned char zero = 0;
    uLong acc = crc32(0L, Z_NULL, 0), pow_crc = crc32(0L, &zero, 1);
    size_t pow_len = 1;
    while (n) {
        if (n & 1) acc = crc32_combine(acc, pow_crc, (z_off_t)pow_len);
        pow_crc = crc32_combine(pow_crc, pow_crc, (z_off_t)pow_len);
        pow_len *= 2;
        n >>= 1;
    }
    return acc;
}

static void big_bit(unsigned char *buf, size_t *bit, unsigned value)
{
    if (value & 1u) buf[*bit >> 3] |= (unsigned char)(1u << (*bit & 7));
    (*bit)++;
}

static void big_code(unsigned char *buf, size_t *bit, unsigned code, int len)
{
    int i;
    for (i = len - 1; i >= 0; --i) big_bit(buf, bit, (code >> i) & 1u);
}

/* A decompression bomb, made bit by bit: an IDX header for n0 x 28 x 28 ubyte
   images, then `zeros` zero bytes, as a gzip file with one dynamic block whose
   codes give length symbol 285 (258 bytes) and distance 1 one bit each, so each
   run of 258 zeros costs 2 bits: deflate's largest ratio, 1032 to 1, as gzip -9
   nearly reaches on zeros. 2^30 zeros take about 1 MB. The CRC-32 and ISIZE
   are right. Returns malloc'd bytes, *n of them. */
static unsigned char *make_bomb(uint32_t n0, size_t zeros, size_t *n)
{
    static const unsigned char gz_header[10] = {0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF};
    unsigned char hdr[16], *out;
    uint32_t dims[3];
    size_t runs = (zeros - 1) / 258, rest = (zeros - 1) % 258, bit, cap, i;
    uLong crc;
    dyn d;
    bitw w;
    dims[0] = n0;
    dims[1] = 28;
    dims[2] = 28;
    make_idx(hdr, 0x08, 3, dims, NULL, 0);
    /* literal/length code: 285 one bit, end-of-block two, every byte ten (1/2 + 1/4 + 256/1024 = 1);
       distance code: the single code of distance 1, one bit */
    dyn_init(&d, 286, 1);
    for (i = 0; i < 256; ++i) d.lens[i] = 10;
    d.lens[256] = 2;
    d.lens[285] = 1;
    d.lens[286] = 1;
    bw_init(&w);
    dyn_begin(&w, &d, 1);
    for (i = 0; i < 16; ++i) dyn_lit(&w, &d, hdr[i]);
    dyn_lit(&w, &d, 0); /* the first zero: the runs copy it */
    cap = 10 + w.len + 1 + runs / 4 + (rest * 10 + 2) / 8 + 2 + 8;
    out = (unsigned char *)calloc(cap, 1);
    if (!out) return NULL;
    memcpy(out, gz_header, 10);
    memcpy(out + 10, w.buf, w.len);
    out[10 + w.len] = (unsigned char)w.acc;
    bit = (10 + w.len) * 8 + (size_t)w.n;
    bit += 2 * runs; /* each run: length code 0, distance code 0 */
    for (i = 0; i < rest; ++i) big_code(out, &bit, d.lit_codes[0], d.lens[0]);
    big_code(out, &bit, d.lit_codes[256], d.lens[256]);
    *n = (bit + 7) / 8;
    crc = crc32_combine(crc32(0L, hdr, 16), crc32_of_zeros(zeros), (z_off_t)zeros);
    put_le32(out + *n, (uint32_t)crc);
    put_le32(out + *n + 4, (uint32_t)((16 + zeros) & 0xFFFFFFFFu));
    *n += 8;
    return out;
}

/* The bomb maker itself, checked by zlib on a small one. */
TEST bomb_maker_makes_valid_gzip(void)
{
    size_t n = 0, out_n = 0, i, zeros = 100000;
    unsigned char *bomb = make_bomb(60000, zeros, &n), *out;
    ASSERT(bomb != NULL);
    out = zlib_gunzip(bomb, n, &out_n);
    free(bomb);
    ASSERTm("zlib rejects the bomb", out != NULL);
    ASSERT_EQ(16 + zeros, out_n);
    ASSERT_EQ(0xEA, out[6]);
    ASSERT_EQ(0x60, out[7]);
    for (i = 16; i < out_n && out[i] == 0; ++i) {}
    ASSERT_EQ(out_n, i);
    free(out);
    PASS();
}

/* Loads bytes from memory, or from a temp file when via_file, through the
   counting context; returns the result, and the bytes the call added at its
   peak in *peak (the file's read buffer included). */
static mnistcu_result load_counted(mnistcu_ctx *ctx, peak_alloc *a, const unsigned char *bytes, size_t n,
                                   int via_file, size_t *peak, char *msg, size_t msg_size)
{
    mnistcu_idx idx;
    mnistcu_result r;
    char path[512];
    size_t before = a->live;
    if (via_file) {
        temp_path(path, sizeof path, ".idx.gz");
        if (!write_whole(path, bytes, n)) return MNISTCU_ERR_IO;
    }
    peak_start(a);
    r = via_file ? mnistcu_idx_load_file(ctx, path, &idx) : mnistcu_idx_load_memory(ctx, bytes, n, "bomb.gz", &idx);
    *peak = peak_added(a, before);
    if (via_file) remove(path);
    snprintf(msg, msg_size, "%s", mnistcu_ctx_error(ctx));
    if (r == MNISTCU_OK) mnistcu_idx_free(ctx, &idx);
    return r;
}

#define BOMB_MAX_PEAK ((size_t)64 << 20) /* the bound: tens of megabytes at most */

/* A 1 MB gzip file: an IDX header for 60000 x 28 x 28 (47040016 bytes) and
   then 1 GiB of zeros. Refused at decompressed byte 47040016, having held one
   buffer of exactly that size. */
TEST idx_gzip_bomb_more_than_its_header(void)
{
    peak_alloc a;
    mnistcu_ctx *ctx = peak_ctx(&a);
    size_t n = 0, peak = 0, live;
    unsigned char *bomb = make_bomb(60000, (size_t)1 << 30, &n);
    char msg[512];
    int via_file;
    ASSERT(ctx != NULL && bomb != NULL);
    ASSERT(n > 1000000 && n < 1100000);
    live = a.live;
    for (via_file = 0; via_file < 2; ++via_file) {
        mnistcu_result r = load_counted(ctx, &a, bomb, n, via_file, &peak, msg, sizeof msg);
        ASSERT_ENUM_EQm(msg, MNISTCU_ERR_IDX_TRAILING, r, mnistcu_result_name);
        ASSERTm(msg, strstr(msg, "more than the 47040016 bytes its header declares") != NULL);
        ASSERTm(msg, strstr(msg, "refused at decompressed byte 47040016") != NULL);
        ASSERT_EQ((size_t)47040016, a.largest); /* the output, allocated once at the exact size */
        ASSERTm("peak above 64 MB", peak < BOMB_MAX_PEAK);
        ASSERT_EQ(live, a.live); /* everything the call made was freed */
    }
    free(bomb);
    mnistcu_ctx_destroy(ctx);
    ASSERT_EQ((size_t)0, a.live);
    PASS();
}

/* A header claiming 2^31 x 28 x 28: refused as soon as it is out. */
TEST idx_gzip_bomb_header_too_large(void)
{
    peak_alloc a;
    mnistcu_ctx *ctx = peak_ctx(&a);
    size_t n = 0, peak = 0;
    unsigned char *bomb = make_bomb(0x80000000u, (size_t)1 << 30, &n);
    char msg[512];
    mnistcu_result r;
    ASSERT(ctx != NULL && bomb != NULL);
    r = load_counted(ctx, &a, bomb, n, 0, &peak, msg, sizeof msg);
    ASSERT_ENUM_EQm(msg, sizeof(size_t) > 4 ? MNISTCU_ERR_IDX_TOO_LARGE : MNISTCU_ERR_IDX_OVERFLOW, r,
                    mnistcu_result_name);
    ASSERTm(msg, strstr(msg, "2147483648 x 28 x 28") != NULL);
    ASSERTm("more than the probe of the header was allocated", peak <= 64);
    r = load_counted(ctx, &a, bomb, n, 1, &peak, msg, sizeof msg);
    ASSERT(r == MNISTCU_ERR_IDX_TOO_LARGE || r == MNISTCU_ERR_IDX_OVERFLOW);
    ASSERTm("peak above 4 MB reading a 1 MB file", peak < ((size_t)4 << 20));
    free(bomb);
    mnistcu_ctx_destroy(ctx);
    ASSERT_EQ((size_t)0, a.live);
    PASS();
}

/* The bomb cut short: 10 KB of it can expand to at most 10 MB, less than its
   header declares, so it is refused at once; 100 KB of it still hold more
   than declared, and are refused at the byte past the payload. */
TEST idx_gzip_bomb_truncated(void)
{
    peak_alloc a;
    mnistcu_ctx *ctx = peak_ctx(&a);
    size_t n = 0, peak = 0;
    unsigned char *bomb = make_bomb(60000, (size_t)1 << 30, &n);
    char msg[512];
    mnistcu_result r;
    ASSERT(ctx != NULL && bomb != NULL);
    r = load_counted(ctx, &a, bomb, 10000, 0, &peak, msg, sizeof msg);
    ASSERT_ENUM_EQm(msg, MNISTCU_ERR_IDX_TRUNCATED, r, mnistcu_result_name);
    ASSERTm(msg, strstr(msg, "declares 47040016 bytes") != NULL && strstr(msg, "10000 bytes of gzip data") != NULL);
    ASSERTm("more than the probe of the header was allocated", peak <= 64);
    r = load_counted(ctx, &a, bomb, 100000, 0, &peak, msg, sizeof msg);
    ASSERT_ENUM_EQm(msg, MNISTCU_ERR_IDX_TRAILING, r, mnistcu_result_name);
    ASSERT_EQ((size_t)47040016 + 64, peak); /* the probe and the exact buffer, for a moment both */
    free(bomb);
    mnistcu_ctx_destroy(ctx);
    ASSERT_EQ((size_t)0, a.live);
    PASS();
}

/* Every element type through gzip with the header read early: the elements
   are converted in place in the one buffer of the exact size; a stream one
   byte short or one byte long is refused. */
TEST idx_gzip_sized_by_its_header(void)
{
    static const unsigned types[6] = {0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E};
    static const size_t esizes[6] = {1, 1, 2, 4, 4, 8};
    peak_alloc a;
    mnistcu_ctx *ctx = peak_ctx(&a);
    unsigned char *buf = (unsigned char *)malloc(16 + 3000 * 8 + 1), *gz;
    unsigned char payload[3000 * 8];
    uint32_t dims[2] = {300, 10};
    size_t gz_n = 0, before;
    int k;
    ASSERT(ctx != NULL && buf != NULL);
    fill_compressible(payload, sizeof payload, 5);
    for (k = 0; k < 6; ++k) {
        size_t n = make_idx(buf, types[k], 2, dims, payload, 3000 * esizes[k]);
        mnistcu_idx raw, via_gz;
        mnistcu_result r;
        ASSERT_EQ(MNISTCU_OK, mnistcu_idx_load_memory(ctx, buf, n, "raw", &raw));
        gz = zlib_compress(buf, n, 6, 31, Z_DEFAULT_STRATEGY, &gz_n);
        ASSERT(gz != NULL);
        before = a.live;
        peak_start(&a);
        r = mnistcu_idx_load_memory(ctx, gz, gz_n, "gz", &via_gz);
        ASSERT_ENUM_EQm(mnistcu_ctx_error(ctx), MNISTCU_OK, r, mnistcu_result_name);
        ASSERT_EQ((size_t)2, a.count);               /* the probe, then the exact buffer */
        ASSERT_EQ(n + 64, peak_added(&a, before));
        ASSERT_EQ(n, a.largest);
        ASSERT_EQ(raw.count, via_gz.count);
        ASSERT_MEM_EQ(raw.data, via_gz.data, raw.count * raw.elem_size);
        mnistcu_idx_free(ctx, &raw);
        mnistcu_idx_free(ctx, &via_gz);
        free(gz);
        /* one byte short: found at the end; one byte long: refused at that byte */
        gz = zlib_compress(buf, n - 1, 6, 31, Z_DEFAULT_STRATEGY, &gz_n);
        ASSERT(gz != NULL);
        ASSERT_ENUM_EQ(MNISTCU_ERR_IDX_TRUNCATED, mnistcu_idx_load_memory(ctx, gz, gz_n, "gz", &via_gz),
                       mnistcu_result_name);
        free(gz);
        buf[n] = 7;
        gz = zlib_compress(buf, n + 1, 6, 31, Z_DEFAULT_STRATEGY, &gz_n);
        ASSERT(gz != NULL);
        ASSERT_ENUM_EQ(MNISTCU_ERR_IDX_TRAILING, mnistcu_idx_load_memory(ctx, gz, gz_n, "gz", &via_gz),
                       mnistcu_result_name);
        {
            char want[64];
            snprintf(want, sizeof want, "refused at decompressed byte %lu", (unsigned long)n);
            ASSERTm(mnistcu_ctx_error(ctx), strstr(mnistcu_ctx_error(ctx), want) != NULL);
        }
        free(gz);
    }
    free(buf);
    mnistcu_ctx_destroy(ctx);
    ASSERT_EQ((size_t)0, a.live);
    PASS();
}

/* Without a size to go by, the output grows by a quarter at a time: the old and
   the new buffer together stay under 2.25 times the final size (plus the
   4 KiB smallest step). A gzip file whose trailer understates the size (its
   last member is tiny) and a raw deflate stream show it. */
TEST gunzip_growth_is_bounded(void)
{
    peak_alloc a;
    mnistcu_ctx *ctx = peak_ctx(&a);
    size_t big = (size_t)6 << 20, n1 = 0, n2 = 0, out_n = 0, before, peak;
    unsigned char *data = (unsigned char *)malloc(big), *m1, *m2, *two;
    void *out = NULL;
    ASSERT(ctx != NULL && data != NULL);
    fill_compressible(data, big, 31);
    m1 = zlib_compress(data, big, 9, 31, Z_DEFAULT_STRATEGY, &n1);
    m2 = zlib_compress(data, 10, 9, 31, Z_DEFAULT_STRATEGY, &n2);
    ASSERT(m1 != NULL && m2 != NULL);
    two = (unsigned char *)malloc(n1 + n2);
    memcpy(two, m1, n1);
    memcpy(two + n1, m2, n2);
    before = a.live;
    peak_start(&a);
    ASSERT_EQ(MNISTCU_OK, mnistcu_gunzip(ctx, two, n1 + n2, 0, &out, &out_n));
    peak = peak_added(&a, before);
    ASSERT_EQ(big + 10, out_n);
    ASSERT_MEM_EQ(data, out, big);
    ASSERTm("the buffer grew in several steps", a.count > 3);
    ASSERTm("peak above 2.25 times the output", (double)peak <= 2.25 * (double)out_n + 4096.0);
    mnistcu_free(ctx, out);
    free(two); free(m2); free(m1);
    m1 = zlib_compress(data, big, 9, -15, Z_DEFAULT_STRATEGY, &n1);
    ASSERT(m1 != NULL);
    before = a.live;
    peak_start(&a);
    ASSERT_EQ(MNISTCU_OK, mnistcu_inflate(ctx, m1, n1, 0, &out, &out_n, NULL));
    peak = peak_added(&a, before);
    ASSERT_EQ(big, out_n);
    ASSERTm("peak above 2.25 times the output", (double)peak <= 2.25 * (double)out_n + 4096.0);
    mnistcu_free(ctx, out);
    free(m1); free(data);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

/* ---- the real MNIST files ---- */

TEST mnist_train_images(void)
{
    char path[1024];
    unsigned char *gz, *ref;
    size_t gz_n = 0, ref_n = 0, i;
    mnistcu_idx idx;
    mnistcu_result r;
    uint64_t sum_ref = 0, sum = 0, sum_first = 0;
    NEED_CTX();
    data_path(path, sizeof path, "train-images-idx3-ubyte.gz");
    gz = read_whole(path, &gz_n);
    if (!gz) SKIPm("data/mnist/train-images-idx3-ubyte.gz not found (set MNISTCU_DATA)");
    ref = zlib_gunzip(gz, gz_n, &ref_n);
    free(gz);
    ASSERT(ref != NULL);
    ASSERT_EQ((size_t)(16 + 60000 * 784), ref_n);
    for (i = 16; i < ref_n; ++i) sum_ref += ref[i];

    r = mnistcu_idx_load_file(tctx, path, &idx);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ((int)MNISTCU_IDX_U8, (int)idx.type);
    ASSERT_EQ(3, idx.ndim);
    ASSERT_EQ((uint32_t)60000, idx.dims[0]);
    ASSERT_EQ((uint32_t)28, idx.dims[1]);
    ASSERT_EQ((uint32_t)28, idx.dims[2]);
    ASSERT_EQ((size_t)60000 * 784, idx.count);
    ASSERT_EQ((size_t)1, idx.elem_size);
    for (i = 0; i < idx.count; ++i) sum += ((const unsigned char *)idx.data)[i];
    for (i = 0; i < 784; ++i) sum_first += ref[16 + i];
    ASSERT_EQ(sum_ref, sum);
    ASSERT(sum_first > 0); /* the first digit is not blank */
    ASSERT_MEM_EQ(ref + 16, idx.data, idx.count);
    mnistcu_idx_free(tctx, &idx);
    free(ref);
    PASS();
}

TEST mnist_train_labels(void)
{
    /* the published class counts of the 60000 MNIST training labels */
    static const size_t expected[10] = {5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949};
    size_t counts[10] = {0}, i;
    char path[1024];
    mnistcu_idx idx;
    mnistcu_result r;
    FILE *f;
    NEED_CTX();
    data_path(path, sizeof path, "train-labels-idx1-ubyte.gz");
    f = fopen(path, "rb");
    if (!f) SKIPm("data/mnist/train-labels-idx1-ubyte.gz not found (set MNISTCU_DATA)");
    fclose(f);
    r = mnistcu_idx_load_file(tctx, path, &idx);
    ASSERT_ENUM_EQ(MNISTCU_OK, r, mnistcu_result_name);
    ASSERT_EQ(1, idx.ndim);
    ASSERT_EQ((uint32_t)60000, idx.dims[0]);
    for (i = 0; i < idx.count; ++i) {
        unsigned label = ((const unsigned char *)idx.data)[i];
        if (label < 10) counts[label]++;
    }
    mnistcu_idx_free(tctx, &idx);
    for (i = 0; i < 10; ++i) ASSERT_EQ(expected[i], counts[i]);
    PASS();
}

/* The real training images cut in half: the header sizes the output (one
   buffer of 47040016 bytes), and the stream ends inside it. Whole, the file
   is loaded with that one buffer and the probe before it. */
TEST mnist_train_images_one_buffer(void)
{
    peak_alloc a;
    mnistcu_ctx *ctx = peak_ctx(&a);
    char path[1024];
    unsigned char *gz;
    size_t gz_n = 0, before;
    mnistcu_idx idx;
    ASSERT(ctx != NULL);
    data_path(path, sizeof path, "train-images-idx3-ubyte.gz");
    gz = read_whole(path, &gz_n);
    if (!gz) {
        mnistcu_ctx_destroy(ctx);
        SKIPm("data/mnist/train-images-idx3-ubyte.gz not found (set MNISTCU_DATA)");
    }
    before = a.live;
    peak_start(&a);
    ASSERT_ENUM_EQ(MNISTCU_OK, mnistcu_idx_load_memory(ctx, gz, gz_n, "train-images", &idx), mnistcu_result_name);
    ASSERT_EQ((size_t)2, a.count);
    ASSERT_EQ((size_t)47040016, a.largest);
    ASSERT_EQ((size_t)47040016 + 64, peak_added(&a, before));
    ASSERT_EQ((size_t)47040000, idx.count);
    mnistcu_idx_free(ctx, &idx);
    peak_start(&a);
    ASSERT_ENUM_EQ(MNISTCU_ERR_DEFLATE_TRUNCATED, mnistcu_idx_load_memory(ctx, gz, gz_n / 2, "half", &idx),
                   mnistcu_result_name);
    ASSERT_EQ((size_t)47040016 + 64, peak_added(&a, before));
    ASSERT_EQ(before, a.live);
    free(gz);
    mnistcu_ctx_destroy(ctx);
    PASS();
}

SUITE(gzip_suite)
{
    SET_SETUP(ctx_setup, NULL);
    SET_TEARDOWN(ctx_teardown, NULL);
    RUN_TEST(crc32_known_values);
    RUN_TEST(crc32_matches_zlib);
    RUN_TEST(roundtrip_levels_and_sizes);
    RUN_TEST(roundtrip_strategies);
    RUN_TEST(roundtrip_large);
    RUN_TEST(roundtrip_high_ratio);
    RUN_TEST(inflate_reports_input_used);
    RUN_TEST(mnist_file_roundtrip);
    RUN_TEST(gzip_multi_member);
    RUN_TEST(gzip_empty_members);
    RUN_TEST(gzip_member_cannot_reach_back);
    RUN_TEST(gzip_optional_header_fields);
    RUN_TEST(gzip_bad_magic);
    RUN_TEST(gzip_bad_method);
    RUN_TEST(gzip_reserved_flags);
    RUN_TEST(gzip_header_fields_past_end);
    RUN_TEST(gzip_trailer_crc_and_isize);
    RUN_TEST(gzip_missing_trailer);
    RUN_TEST(gzip_trailing_garbage);
    RUN_TEST(gzip_output_limit);
    RUN_TEST(gzip_truncated_everywhere);
    RUN_TEST(inflate_truncated_everywhere);
    RUN_TEST(gzip_random_bit_flips);
    RUN_TEST(gzip_invalid_arguments);
    RUN_TEST(deflate_stored_block);
    RUN_TEST(deflate_stored_length_mismatch);
    RUN_TEST(deflate_stored_truncated);
    RUN_TEST(deflate_block_type_3);
    RUN_TEST(deflate_message_names_offset);
    RUN_TEST(deflate_fixed_block);
    RUN_TEST(deflate_invalid_length_symbols);
    RUN_TEST(deflate_invalid_distance_symbols);
    RUN_TEST(deflate_distance_too_far);
    RUN_TEST(deflate_truncated_fixed);
    RUN_TEST(deflate_dynamic_block);
    RUN_TEST(deflate_too_many_length_codes);
    RUN_TEST(deflate_too_many_distance_codes);
    RUN_TEST(deflate_code_length_code_bad);
    RUN_TEST(deflate_repeat_without_previous);
    RUN_TEST(deflate_repeat_past_end);
    RUN_TEST(deflate_no_end_of_block);
    RUN_TEST(deflate_literal_code_bad);
    RUN_TEST(deflate_distance_code_bad);
    RUN_TEST(deflate_allowed_incomplete_codes);
    RUN_TEST(deflate_long_codes);
    RUN_TEST(gunzip_growth_is_bounded);
}

SUITE(idx_suite)
{
    SET_SETUP(ctx_setup, NULL);
    SET_TEARDOWN(ctx_teardown, NULL);
    RUN_TEST(idx_u8);
    RUN_TEST(idx_i8);
    RUN_TEST(idx_i16);
    RUN_TEST(idx_i32);
    RUN_TEST(idx_f32);
    RUN_TEST(idx_f64);
    RUN_TEST(idx_type_names);
    RUN_TEST(idx_empty_dimension);
    RUN_TEST(idx_max_dims);
    RUN_TEST(idx_too_short_for_header);
    RUN_TEST(idx_bad_magic);
    RUN_TEST(idx_bad_type);
    RUN_TEST(idx_truncated_header);
    RUN_TEST(idx_size_overflow);
    RUN_TEST(idx_payload_too_large);
    RUN_TEST(idx_payload_truncated_and_trailing);
    RUN_TEST(idx_message_has_numbers);
    RUN_TEST(idx_gzip_errors);
    RUN_TEST(idx_file_errors);
    RUN_TEST(idx_invalid_arguments);
    RUN_TEST(idx_random_damage);
    RUN_TEST(bomb_maker_makes_valid_gzip);
    RUN_TEST(idx_gzip_sized_by_its_header);
    RUN_TEST(idx_gzip_bomb_more_than_its_header);
    RUN_TEST(idx_gzip_bomb_header_too_large);
    RUN_TEST(idx_gzip_bomb_truncated);
    RUN_TEST(mnist_train_images);
    RUN_TEST(mnist_train_images_one_buffer);
    RUN_TEST(mnist_train_labels);
}
