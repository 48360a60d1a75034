/*
 * harness.h - a small single-header unit-test harness for C, C++ and CUDA.
 *
 * It keeps the API of greatest.h (github.com/silentbicycle/greatest), so the
 * same tests also build against the real greatest.h.  Differences on purpose:
 *
 *   - ASSERT_IN_RANGE fails when a value is NaN (greatest lets NaN pass).
 *   - The last line of a run is always "N passed, N failed, N skipped",
 *     easy for scripts to check; each suite prints its wall time.
 *   - Messages given to FAILm/PASSm/SKIPm are copied, so a message built in
 *     a local buffer is fine (with greatest it must outlive the test).
 *
 * A test program:
 *
 *     #include "harness.h"
 *
 *     TEST two_plus_two(void) {
 *         ASSERT_EQ(4, 2 + 2);
 *         PASS();
 *     }
 *
 *     SUITE(arithmetic) {
 *         RUN_TEST(two_plus_two);
 *     }
 *
 *     GREATEST_MAIN_DEFS();               (in exactly one .c file)
 *
 *     int main(int argc, char **argv) {
 *         GREATEST_MAIN_BEGIN();          (parses the command line)
 *         RUN_SUITE(arithmetic);
 *         GREATEST_MAIN_END();            (prints the report, returns)
 *     }
 *
 * Suites may live in other .c files of the same program: there, include
 * harness.h and write SUITE(name) { ... }; the file with main() declares the
 * suite with SUITE_EXTERN(name); before running it.
 *
 * How it works: a test is a function returning a greatest_test_res.  Every
 * assert macro `return`s a failure from the test as soon as its check fails,
 * so a test stops at its first failing assert (and a helper function that
 * asserts must be called through CHECK_CALL).  All shared state lives in one
 * global struct, greatest_info, defined by GREATEST_MAIN_DEFS().  The helper
 * functions are `static inline`: each .c file gets a private copy, so
 * nothing but greatest_info has to be linked across files.
 *
 * Run the program with -h to see its command-line options.
 */
#ifndef TESTS_HARNESS_H
#define TESTS_HARNESS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Plain C99 has no clock finer than a second that measures wall time:
 * TIME_UTC (timespec_get) only exists from C11 on.  On Unix fall back to
 * POSIX gettimeofday, declared in <sys/time.h>. */
#if !defined(TIME_UTC) && (defined(__unix__) || defined(__APPLE__))
#include <sys/time.h>
#define GREATEST_HAVE_GETTIMEOFDAY_ 1
#endif

/* The helper functions below are `static inline`.  `static` gives each .c
 * file its own private copy, so nothing clashes at link time.  `inline`
 * does not force inlining here: it tells the compiler that a function from
 * a header may go unused in a file (a file that only defines a suite calls
 * few of them), so it does not warn about that.
 *
 * gcc and clang check the arguments of printf-like functions marked with
 * the `format` attribute. */
#if defined(__GNUC__) || defined(__clang__)
#define GREATEST_PRINTF_(fmt_arg, first_arg) \
    __attribute__((format(printf, fmt_arg, first_arg)))
#else
#define GREATEST_PRINTF_(fmt_arg, first_arg)
#endif

#ifndef GREATEST_TESTNAME_BUF_SIZE
#define GREATEST_TESTNAME_BUF_SIZE 128
#endif
#define GREATEST_MSG_SIZE_ 1024    /* PASSm/FAILm/SKIPm message */
#define GREATEST_DETAIL_SIZE_ 1024 /* "Expected/Got" text of an assert */
#define GREATEST_LINE_WIDTH_ 72    /* progress characters per line */

/* ------------------------------------------------------------------------
 * Types and the global state
 * ------------------------------------------------------------------------ */

/* What a test returns. */
typedef enum greatest_test_res {
    GREATEST_TEST_RES_PASS = 0,
    GREATEST_TEST_RES_FAIL = -1,
    GREATEST_TEST_RES_SKIP = 1
} greatest_test_res;

/* SET_SETUP / SET_TEARDOWN callbacks; they get the udata pointer back. */
typedef void greatest_setup_cb(void *udata);
typedef void greatest_teardown_cb(void *udata);

struct greatest_counts {
    unsigned passed, failed, skipped;
};

struct greatest_run_info {
    /* Command-line options. */
    unsigned verbosity;                /* -v, once per -v */
    int list_only;                     /* -l */
    int stop_at_first_fail;            /* -f */
    int exact_match;                   /* -e */
    const char *suite_filter;          /* -s */
    const char *test_filter;           /* -t */
    const char *test_exclude;          /* -x */

    /* Results. */
    struct greatest_counts total;      /* whole run */
    struct greatest_counts suite;      /* current suite */
    unsigned assertions;
    unsigned suites_shown;             /* suites that had a test to show */
    double run_start, suite_start;     /* greatest_now() values */

    /* The suite being run; suite_name is NULL outside RUN_SUITE. */
    const char *suite_name;
    int suite_header_shown;            /* header is printed lazily */
    greatest_setup_cb *setup;
    void *setup_udata;
    greatest_teardown_cb *teardown;
    void *teardown_udata;

    /* The test being run. */
    int running_test;
    const char *name_suffix;           /* greatest_set_test_suffix() */
    char name[GREATEST_TESTNAME_BUF_SIZE];
    char msg[GREATEST_MSG_SIZE_];      /* "" when there is none */
    const char *fail_file;
    int fail_line;
    char detail[GREATEST_DETAIL_SIZE_];
    int detail_pending;                /* detail written by a failing assert */
    int fail_has_detail;               /* detail belongs to this failure */

    unsigned col;                      /* progress characters on this line */
};

/* C linkage for what files share (greatest_info and the suites), so that a
 * program may mix C files with C++ or CUDA (.cu) files. */
#ifdef __cplusplus
#define GREATEST_EXTERN_C_ extern "C"
#else
#define GREATEST_EXTERN_C_ extern
#endif

/* The one global, defined by GREATEST_MAIN_DEFS() in the main .c file.  The
 * user's `;` after the macro ends the definition: ISO C forbids a stray `;`
 * at file scope, so the macro must not bring its own. */
GREATEST_EXTERN_C_ struct greatest_run_info greatest_info;
#define GREATEST_MAIN_DEFS() struct greatest_run_info greatest_info

/* ------------------------------------------------------------------------
 * The public macros
 * ------------------------------------------------------------------------ */

#define TEST static greatest_test_res

/* A suite is a plain function that runs tests; the prototype before the
 * definition keeps -Wmissing-prototypes quiet. */
#define SUITE(NAME) GREATEST_EXTERN_C_ void NAME(void); void NAME(void)
#define SUITE_EXTERN(NAME) GREATEST_EXTERN_C_ void NAME(void)
#define RUN_SUITE(NAME) greatest_run_suite(NAME, #NAME)

/* Run one test: greatest_test_pre() applies the filters and calls setup,
 * greatest_test_post() calls teardown and records the result. */
#define RUN_TEST(FN)                                                        \
    do {                                                                    \
        if (greatest_test_pre(#FN)) greatest_test_post(FN());               \
    } while (0)
#define RUN_TEST1(FN, ARG)                                                  \
    do {                                                                    \
        if (greatest_test_pre(#FN)) greatest_test_post(FN(ARG));            \
    } while (0)
#define RUN_TESTp(FN, ...)                                                  \
    do {                                                                    \
        if (greatest_test_pre(#FN)) greatest_test_post(FN(__VA_ARGS__));    \
    } while (0)

#define SET_SETUP(FN, UDATA) greatest_set_setup((FN), (UDATA))
#define SET_TEARDOWN(FN, UDATA) greatest_set_teardown((FN), (UDATA))

/* End the test.  Each records its message, then returns the result. */
#define PASS() PASSm(NULL)
#define PASSm(MSG) return greatest_pass(MSG)
#define FAIL() FAILm(NULL)
#define FAILm(MSG) return greatest_fail_at(__FILE__, __LINE__, (MSG))
#define SKIP() SKIPm(NULL)
#define SKIPm(MSG) return greatest_skip(MSG)

/* Call a helper that itself uses asserts; pass on anything but a PASS. */
#define CHECK_CALL(CALL)                                                    \
    do {                                                                    \
        greatest_test_res greatest_res_ = (CALL);                           \
        if (greatest_res_ != GREATEST_TEST_RES_PASS) return greatest_res_;  \
    } while (0)

/* Every assert counts itself, then fails the test with MSG unless OK. */
#define GREATEST_CHECK_(MSG, OK)                                            \
    do {                                                                    \
        greatest_info.assertions++;                                         \
        if (!(OK)) FAILm(MSG);                                              \
    } while (0)

/* The message of the plain asserts is the source text of the check. */
#define ASSERT(COND) ASSERTm(#COND, COND)
#define ASSERTm(MSG, COND) GREATEST_CHECK_(MSG, (COND))
#define ASSERT_FALSE(COND) ASSERT_FALSEm(#COND, COND)
#define ASSERT_FALSEm(MSG, COND) GREATEST_CHECK_(MSG, !(COND))

#define ASSERT_EQ(EXP, GOT) ASSERT_EQm(#EXP " != " #GOT, EXP, GOT)
#define ASSERT_EQm(MSG, EXP, GOT) GREATEST_CHECK_(MSG, (EXP) == (GOT))
#define ASSERT_NEQ(EXP, GOT) ASSERT_NEQm(#EXP " == " #GOT, EXP, GOT)
#define ASSERT_NEQm(MSG, EXP, GOT) GREATEST_CHECK_(MSG, (EXP) != (GOT))
#define ASSERT_GT(EXP, GOT) ASSERT_GTm(#EXP " <= " #GOT, EXP, GOT)
#define ASSERT_GTm(MSG, EXP, GOT) GREATEST_CHECK_(MSG, (EXP) > (GOT))
#define ASSERT_GTE(EXP, GOT) ASSERT_GTEm(#EXP " < " #GOT, EXP, GOT)
#define ASSERT_GTEm(MSG, EXP, GOT) GREATEST_CHECK_(MSG, (EXP) >= (GOT))
#define ASSERT_LT(EXP, GOT) ASSERT_LTm(#EXP " >= " #GOT, EXP, GOT)
#define ASSERT_LTm(MSG, EXP, GOT) GREATEST_CHECK_(MSG, (EXP) < (GOT))
#define ASSERT_LTE(EXP, GOT) ASSERT_LTEm(#EXP " > " #GOT, EXP, GOT)
#define ASSERT_LTEm(MSG, EXP, GOT) GREATEST_CHECK_(MSG, (EXP) <= (GOT))

/* Like ASSERT_EQ, and on failure shows both values printed with FMT.  The
 * type of EXP and GOT is unknown here, so this must stay a macro, and EXP
 * and GOT are evaluated again when printing. */
#define ASSERT_EQ_FMT(EXP, GOT, FMT)                                        \
    ASSERT_EQ_FMTm(#EXP " != " #GOT, EXP, GOT, FMT)
#define ASSERT_EQ_FMTm(MSG, EXP, GOT, FMT)                                  \
    do {                                                                    \
        greatest_info.assertions++;                                         \
        if ((EXP) != (GOT)) {                                               \
            greatest_detailf("Expected: ");                                 \
            greatest_detailf(FMT, EXP);                                     \
            greatest_detailf("\n     Got: ");                               \
            greatest_detailf(FMT, GOT);                                     \
            FAILm(MSG);                                                     \
        }                                                                   \
    } while (0)

/* |EXP - GOT| <= TOL, in double.  Fails on NaN, unlike greatest. */
#define ASSERT_IN_RANGE(EXP, GOT, TOL)                                      \
    ASSERT_IN_RANGEm(#EXP " != " #GOT " +/- " #TOL, EXP, GOT, TOL)
#define ASSERT_IN_RANGEm(MSG, EXP, GOT, TOL)                                \
    GREATEST_CHECK_(MSG, greatest_in_range((EXP), (GOT), (TOL)))

#define ASSERT_STR_EQ(EXP, GOT) ASSERT_STR_EQm(#EXP " != " #GOT, EXP, GOT)
#define ASSERT_STR_EQm(MSG, EXP, GOT)                                       \
    GREATEST_CHECK_(MSG, greatest_str_eq((EXP), (GOT), 0, 0))
#define ASSERT_STRN_EQ(EXP, GOT, SIZE)                                      \
    ASSERT_STRN_EQm(#EXP " != " #GOT, EXP, GOT, SIZE)
#define ASSERT_STRN_EQm(MSG, EXP, GOT, SIZE)                                \
    GREATEST_CHECK_(MSG, greatest_str_eq((EXP), (GOT), 1, (SIZE)))

/* The first SIZE bytes at EXP and GOT are equal (memcmp). */
#define ASSERT_MEM_EQ(EXP, GOT, SIZE)                                       \
    ASSERT_MEM_EQm(#EXP " != " #GOT, EXP, GOT, SIZE)
#define ASSERT_MEM_EQm(MSG, EXP, GOT, SIZE)                                 \
    GREATEST_CHECK_(MSG, greatest_mem_eq((EXP), (GOT), (SIZE)))

/* Enum values are equal; on failure both are shown as ENUM_STR(value),
 * where ENUM_STR is a function like `const char *name(int value)`. */
#define ASSERT_ENUM_EQ(EXP, GOT, ENUM_STR)                                  \
    ASSERT_ENUM_EQm(#EXP " != " #GOT, EXP, GOT, ENUM_STR)
#define ASSERT_ENUM_EQm(MSG, EXP, GOT, ENUM_STR)                            \
    do {                                                                    \
        greatest_info.assertions++;                                         \
        if ((EXP) != (GOT)) {                                               \
            greatest_detailf("Expected: %s\n     Got: %s",                  \
                             ENUM_STR(EXP), ENUM_STR(GOT));                 \
            FAILm(MSG);                                                     \
        }                                                                   \
    } while (0)

#define GREATEST_IS_VERBOSE() (greatest_info.verbosity > 0)

#define GREATEST_MAIN_BEGIN() greatest_main_begin(argc, argv)
/* Expands to a `return` statement: use it as the last line of main(). */
#define GREATEST_MAIN_END() return greatest_main_end()

/* ------------------------------------------------------------------------
 * Small utilities
 * ------------------------------------------------------------------------ */

/* Copy src into dst[size], cutting it if too long; NULL copies as "". */
static inline void greatest_copy(char *dst, size_t size, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= size) n = size - 1;
    if (n > 0) memcpy(dst, src, n);
    dst[n] = '\0';
}

static inline const char *greatest_plural(unsigned n)
{
    return n == 1 ? "" : "s";
}

/* Seconds of wall time since some fixed moment. */
static inline double greatest_now(void)
{
#if defined(TIME_UTC)
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#elif defined(GREATEST_HAVE_GETTIMEOFDAY_)
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
#else
    /* Last resort: this counts CPU time of the process, not wall time. */
    return (double)clock() / CLOCKS_PER_SEC;
#endif
}

/* Add printf-style text to the details of the assert that is failing right
 * now; they are printed under its FAIL line.  The first call after a
 * failure was recorded starts a fresh text. */
static inline GREATEST_PRINTF_(1, 2)
void greatest_detailf(const char *fmt, ...)
{
    struct greatest_run_info *g = &greatest_info;
    size_t used;
    va_list ap;

    if (!g->detail_pending) {
        g->detail[0] = '\0';
        g->detail_pending = 1;
    }
    used = strlen(g->detail);
    va_start(ap, fmt);
    vsnprintf(g->detail + used, sizeof g->detail - used, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------
 * Printing progress and results
 * ------------------------------------------------------------------------ */

/* End the current line of progress characters, if one is open. */
static inline void greatest_end_line(void)
{
    if (greatest_info.col > 0) {
        putchar('\n');
        greatest_info.col = 0;
    }
}

/* One character per test: '.' pass, 'F' fail, 's' skip. */
static inline void greatest_progress(char c)
{
    putchar(c);
    if (++greatest_info.col >= GREATEST_LINE_WIDTH_) greatest_end_line();
}

/* Print text, indenting the lines after the first one, so that multi-line
 * details stay visibly attached to their FAIL line. */
static inline void greatest_print_indented(const char *text)
{
    for (; *text != '\0'; text++) {
        putchar(*text);
        if (*text == '\n') fputs("    ", stdout);
    }
}

/* "PASS name", "SKIP name: msg", ... on a line of its own. */
static inline void greatest_result_line(const char *result)
{
    struct greatest_run_info *g = &greatest_info;
    greatest_end_line();
    printf("%s %s", result, g->name);
    if (g->msg[0] != '\0') printf(": %s", g->msg);
    putchar('\n');
}

static inline void greatest_fail_line(void)
{
    struct greatest_run_info *g = &greatest_info;
    greatest_end_line();
    printf("FAIL %s: ", g->name);
    greatest_print_indented(g->msg[0] != '\0' ? g->msg : "(no message)");
    if (g->fail_file != NULL) printf(" (%s:%d)", g->fail_file, g->fail_line);
    putchar('\n');
    if (g->fail_has_detail) {
        fputs("    ", stdout);
        greatest_print_indented(g->detail);
        putchar('\n');
    }
}

/* The suite header is printed before the first test that is shown, so
 * suites whose tests are all filtered out stay silent. */
static inline void greatest_show_suite_header(void)
{
    struct greatest_run_info *g = &greatest_info;
    if (g->suite_name == NULL || g->suite_header_shown) return;
    greatest_end_line();
    printf("\n* Suite %s:\n", g->suite_name);
    g->suite_header_shown = 1;
    g->suites_shown++;
}

/* ------------------------------------------------------------------------
 * Running tests and suites
 * ------------------------------------------------------------------------ */

/* No filter matches every name.  Otherwise the filter must occur in the
 * name, or with -e be the whole name. */
static inline int greatest_name_matches(const char *name, const char *filter)
{
    if (filter == NULL) return 1;
    if (greatest_info.exact_match) return strcmp(name, filter) == 0;
    return strstr(name, filter) != NULL;
}

/* -f: once something failed, run nothing more. */
static inline int greatest_stopped(void)
{
    return greatest_info.stop_at_first_fail && greatest_info.total.failed > 0;
}

/* Called by RUN_TEST* before a test.  Decides whether it runs (filters,
 * -l, -f) and calls the suite's setup.  Returns 1 to run the test. */
static inline int greatest_test_pre(const char *name)
{
    struct greatest_run_info *g = &greatest_info;
    const char *suffix = g->name_suffix;

    g->name_suffix = NULL; /* a suffix names one test only */
    if (g->running_test) return 0; /* RUN_TEST inside a test: ignored */

    if (suffix != NULL)
        snprintf(g->name, sizeof g->name, "%s_%s", name, suffix);
    else
        greatest_copy(g->name, sizeof g->name, name);

    if (greatest_stopped()) return 0;
    if (!greatest_name_matches(g->name, g->test_filter)) return 0;
    if (g->test_exclude != NULL && strstr(g->name, g->test_exclude) != NULL)
        return 0;

    greatest_show_suite_header();
    if (g->list_only) {
        printf("  %s\n", g->name);
        return 0;
    }

    g->msg[0] = '\0';
    g->fail_file = NULL;
    g->fail_line = 0;
    g->detail_pending = 0;
    g->fail_has_detail = 0;
    if (g->setup != NULL) g->setup(g->setup_udata);
    g->running_test = 1;
    return 1;
}

/* Called by RUN_TEST* with the test's result: teardown, count, print. */
static inline void greatest_test_post(greatest_test_res res)
{
    struct greatest_run_info *g = &greatest_info;
    int verbose = g->verbosity > 0;

    g->running_test = 0;
    if (g->teardown != NULL) g->teardown(g->teardown_udata);

    if (res == GREATEST_TEST_RES_PASS) {
        g->suite.passed++;
        g->total.passed++;
        if (verbose) greatest_result_line("PASS");
        else greatest_progress('.');
    } else if (res == GREATEST_TEST_RES_SKIP) {
        g->suite.skipped++;
        g->total.skipped++;
        if (!verbose) greatest_progress('s');
        /* Without -v a skip's message is still worth a line. */
        if (verbose || g->msg[0] != '\0') greatest_result_line("SKIP");
    } else {
        g->suite.failed++;
        g->total.failed++;
        if (!verbose) greatest_progress('F');
        greatest_fail_line();
    }
    /* Flush now, so that a crash in a later test still shows this one. */
    fflush(stdout);
}

/* PASSm / SKIPm / FAILm store their message and give the result back. */
static inline greatest_test_res greatest_pass(const char *msg)
{
    greatest_copy(greatest_info.msg, sizeof greatest_info.msg, msg);
    greatest_info.detail_pending = 0;
    return GREATEST_TEST_RES_PASS;
}

static inline greatest_test_res greatest_skip(const char *msg)
{
    greatest_copy(greatest_info.msg, sizeof greatest_info.msg, msg);
    greatest_info.detail_pending = 0;
    return GREATEST_TEST_RES_SKIP;
}

static inline greatest_test_res greatest_fail_at(const char *file, int line,
                                                 const char *msg)
{
    struct greatest_run_info *g = &greatest_info;
    greatest_copy(g->msg, sizeof g->msg, msg);
    g->fail_file = file;
    g->fail_line = line;
    /* Details count only if the assert failing now wrote them. */
    g->fail_has_detail = g->detail_pending;
    g->detail_pending = 0;
    return GREATEST_TEST_RES_FAIL;
}

/* Run one suite, unless -s filters it out or -f has stopped the run. */
static inline void greatest_run_suite(void (*suite)(void), const char *name)
{
    struct greatest_run_info *g = &greatest_info;

    if (greatest_stopped()) return;
    if (!greatest_name_matches(name, g->suite_filter)) return;

    g->suite_name = name;
    g->suite_header_shown = 0;
    memset(&g->suite, 0, sizeof g->suite);
    g->suite_start = greatest_now();

    suite();

    if (g->suite_header_shown && !g->list_only) {
        struct greatest_counts *c = &g->suite;
        unsigned n = c->passed + c->failed + c->skipped;
        greatest_end_line();
        printf("%u test%s - %u passed, %u failed, %u skipped (%.3f s)\n",
               n, greatest_plural(n), c->passed, c->failed, c->skipped,
               greatest_now() - g->suite_start);
    }
    /* Setup and teardown belong to one suite (as in greatest). */
    g->setup = NULL;
    g->setup_udata = NULL;
    g->teardown = NULL;
    g->teardown_udata = NULL;
    g->suite_name = NULL;
    fflush(stdout);
}

static inline void greatest_set_setup(greatest_setup_cb *fn, void *udata)
{
    greatest_info.setup = fn;
    greatest_info.setup_udata = udata;
}

static inline void greatest_set_teardown(greatest_teardown_cb *fn, void *udata)
{
    greatest_info.teardown = fn;
    greatest_info.teardown_udata = udata;
}

/* Name the next test "name_suffix", e.g. to tell apart the runs of a
 * RUN_TESTp test with different arguments.  -t and -x see the suffix. */
static inline void greatest_set_test_suffix(const char *suffix)
{
    greatest_info.name_suffix = suffix;
}

/* ------------------------------------------------------------------------
 * Helpers of the asserts that explain their failure
 * ------------------------------------------------------------------------ */

static inline int greatest_in_range(double exp, double got, double tol)
{
    double diff = exp > got ? exp - got : got - exp;
    /* Equal values pass even when both are infinite (inf - inf is NaN). */
    int ok = exp == got || diff <= tol;
    /* Any NaN fails, the tolerance included.  x != x holds only for NaN
     * (every comparison with a NaN is false, even x == x). */
    if (exp != exp || got != got || tol != tol) ok = 0;
    if (!ok) {
        greatest_detailf("Expected: %.9g +/- %.9g\n     Got: %.9g",
                         exp, tol, got);
    }
    return ok;
}

static inline void greatest_detail_str(const char *label, const char *s)
{
    if (s == NULL) greatest_detailf("%s(null)", label);
    else greatest_detailf("%s\"%s\"", label, s);
}

/* bounded: compare only the first size characters (ASSERT_STRN_EQ). */
static inline int greatest_str_eq(const char *exp, const char *got,
                                  int bounded, size_t size)
{
    int same;
    if (exp == NULL || got == NULL) same = exp == got;
    else if (bounded) same = strncmp(exp, got, size) == 0;
    else same = strcmp(exp, got) == 0;
    if (!same) {
        greatest_detail_str("Expected: ", exp);
        greatest_detail_str("\n     Got: ", got);
    }
    return same;
}

/* On failure shows the 16-byte row around the first difference:
 *     Expected @0010: 00 01 02 ...
 *          Got @0010: 00 ff 02 ...
 *                        ^^       */
static inline int greatest_mem_eq(const void *exp, const void *got,
                                  size_t size)
{
    const unsigned char *e = (const unsigned char *)exp;
    const unsigned char *g = (const unsigned char *)got;
    size_t i, first = 0, ndiff = 0, row, row_end;

    if (size == 0 || exp == got) return 1;
    if (exp == NULL || got == NULL) {
        greatest_detailf("%s is NULL", exp == NULL ? "expected" : "got");
        return 0;
    }
    if (memcmp(exp, got, size) == 0) return 1;

    for (i = 0; i < size; i++) {
        if (e[i] != g[i]) {
            if (ndiff == 0) first = i;
            ndiff++;
        }
    }
    row = first - first % 16;
    row_end = row + 16 < size ? row + 16 : size;

    greatest_detailf("%lu of %lu bytes differ, the first at offset %lu",
                     (unsigned long)ndiff, (unsigned long)size,
                     (unsigned long)first);
    greatest_detailf("\nExpected @%04lx:", (unsigned long)row);
    for (i = row; i < row_end; i++) greatest_detailf(" %02x", e[i]);
    greatest_detailf("\n     Got @%04lx:", (unsigned long)row);
    for (i = row; i < row_end; i++) greatest_detailf(" %02x", g[i]);
    greatest_detailf("\n               ");
    while (row_end > row && e[row_end - 1] == g[row_end - 1]) row_end--;
    for (i = row; i < row_end; i++)
        greatest_detailf("%s", e[i] != g[i] ? " ^^" : "   ");
    return 0;
}

/* ------------------------------------------------------------------------
 * Command line and final report
 * ------------------------------------------------------------------------ */

static inline void greatest_usage(FILE *out, const char *prog)
{
    fprintf(out,
            "Usage: %s [-hlvfe] [-s SUITE] [-t TEST] [-x EXCLUDE] [-- ...]\n"
            "  -h, --help  print this help\n"
            "  -l          list suites and tests, run nothing\n"
            "  -v          verbose: one line per test with its result\n"
            "  -f          stop at the first failure\n"
            "  -s SUITE    only run suites whose name contains SUITE\n"
            "  -t TEST     only run tests whose name contains TEST\n"
            "  -x EXCLUDE  do not run tests whose name contains EXCLUDE\n"
            "  -e          -s and -t must match the whole name\n"
            "Arguments after -- are left to the program.\n",
            prog);
}

static inline void greatest_bad_arg(const char *prog, const char *problem,
                                    const char *arg)
{
    fprintf(stderr, "%s: %s: %s\n", prog, problem, arg);
    greatest_usage(stderr, prog);
    exit(EXIT_FAILURE);
}

/* Flags may be grouped (-vf).  The value of -s/-t/-x is either the rest of
 * the same argument (-tname) or the next argument (-t name). */
static inline void greatest_parse_args(int argc, char **argv)
{
    struct greatest_run_info *g = &greatest_info;
    const char *prog = argc > 0 ? argv[0] : "test";
    int i;

    for (i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *p;

        if (strcmp(arg, "--") == 0) break;
        if (strcmp(arg, "--help") == 0) {
            greatest_usage(stdout, prog);
            exit(EXIT_SUCCESS);
        }
        if (arg[0] != '-' || arg[1] == '\0')
            greatest_bad_arg(prog, "unexpected argument", arg);

        for (p = arg + 1; *p != '\0'; p++) {
            if (*p == 's' || *p == 't' || *p == 'x') {
                const char *value = NULL;
                if (p[1] != '\0') value = p + 1;
                else if (i + 1 < argc) value = argv[++i];
                else greatest_bad_arg(prog, "option needs a value", arg);

                if (*p == 's') g->suite_filter = value;
                else if (*p == 't') g->test_filter = value;
                else g->test_exclude = value;
                break; /* the value used up the rest of the argument */
            }
            switch (*p) {
            case 'h':
                greatest_usage(stdout, prog);
                exit(EXIT_SUCCESS);
            case 'l': g->list_only = 1; break;
            case 'v': g->verbosity++; break;
            case 'f': g->stop_at_first_fail = 1; break;
            case 'e': g->exact_match = 1; break;
            default: greatest_bad_arg(prog, "unknown option", arg);
            }
        }
    }
}

static inline void greatest_main_begin(int argc, char **argv)
{
    greatest_parse_args(argc, argv);
    greatest_info.run_start = greatest_now();
}

/* Print the report; the result is main()'s exit status. */
static inline int greatest_main_end(void)
{
    struct greatest_run_info *g = &greatest_info;
    struct greatest_counts *c = &g->total;
    unsigned n = c->passed + c->failed + c->skipped;

    if (g->list_only) return EXIT_SUCCESS;

    greatest_end_line();
    if (greatest_stopped()) printf("\nStopped at the first failure (-f).\n");
    if (n == 0 && (g->suite_filter || g->test_filter || g->test_exclude))
        printf("\nNo test matched the -s/-t/-x filters.\n");
    printf("\nTotal: %u test%s in %u suite%s, %u assertion%s (%.3f s)\n",
           n, greatest_plural(n), g->suites_shown,
           greatest_plural(g->suites_shown), g->assertions,
           greatest_plural(g->assertions), greatest_now() - g->run_start);
    /* Scripts read this last line; keep its format stable. */
    printf("%u passed, %u failed, %u skipped\n",
           c->passed, c->failed, c->skipped);
    fflush(stdout);
    return c->failed > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif /* TESTS_HARNESS_H */
