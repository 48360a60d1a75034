/*
 * Self-test of tests/harness.h and tests/asserts.h.
 *
 * A normal run must pass (with a few deliberate skips).  Failures are
 * checked in two ways:
 *   - the "failures_in_process" suite calls failing test bodies directly,
 *     not through RUN_TEST, so their failure is not counted, and asserts
 *     that they returned GREATEST_TEST_RES_FAIL with the right message;
 *   - with the environment variable HARNESS_SELFTEST_FAIL=1 the suite
 *     "deliberate_failures" runs as well, and tests/harness_selftest.sh
 *     checks that each of its tests is reported as a failure.
 *
 * Build and check (tests/harness_selftest.sh lists the checks):
 *   cc -std=c99 -Wall -Wextra -Werror -pedantic \
 *      -o build/test_harness_selftest \
 *      tests/test_harness_selftest.c tests/test_harness_selftest2.c
 *   sh tests/harness_selftest.sh build/test_harness_selftest
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "asserts.h"

/* ------------------------------------------------------------------------
 * Passing asserts of every kind
 * ------------------------------------------------------------------------ */

enum color { COLOR_RED, COLOR_GREEN };

static const char *color_name(int c)
{
    return c == COLOR_RED ? "red" : c == COLOR_GREEN ? "green" : "?";
}

TEST assert_true_and_false(void)
{
    int x = 3;
    ASSERT(x == 3);
    ASSERTm("x should be positive", x > 0);
    ASSERT_FALSE(x == 4);
    ASSERT_FALSEm("x should not be negative", x < 0);
    PASS();
}

TEST assert_comparisons(void)
{
    int x = 3;
    ASSERT_EQ(3, x);
    ASSERT_EQm("x should be 3", 3, x);
    ASSERT_NEQ(4, x);
    ASSERT_GT(4, x);
    ASSERT_GTE(3, x);
    ASSERT_LT(2, x);
    ASSERT_LTE(3, x);
    PASS();
}

TEST assert_eq_fmt_and_in_range(void)
{
    int x = 42;
    double y = 0.95;
    ASSERT_EQ_FMT(42, x, "%d");
    ASSERT_EQ_FMTm("x should be 42", 42, x, "%d");
    ASSERT_IN_RANGE(1.0, y, 0.1);
    ASSERT_IN_RANGEm("y should be about 1", 1.0, y, 0.1);
    ASSERT_IN_RANGE(INFINITY, INFINITY, 0.0); /* equal values always pass */
    PASS();
}

TEST assert_strings_and_memory(void)
{
    const char *s = "hello world";
    unsigned char a[20], b[20];
    memset(a, 7, sizeof a);
    memset(b, 7, sizeof b);
    ASSERT_STR_EQ("hello world", s);
    ASSERT_STR_EQm("greeting", "hello world", s);
    ASSERT_STRN_EQ("hello there", s, 6);
    ASSERT_MEM_EQ(a, b, sizeof a);
    PASS();
}

TEST assert_enum(void)
{
    enum color c = COLOR_GREEN;
    ASSERT_ENUM_EQ(COLOR_GREEN, c, color_name);
    PASS();
}

/* A helper that asserts: call it through CHECK_CALL. */
static greatest_test_res check_is_even(int n)
{
    ASSERT_EQ(0, n % 2);
    PASS();
}

TEST check_call_passes(void)
{
    CHECK_CALL(check_is_even(4));
    CHECK_CALL(check_is_even(10));
    PASSm("a message on a passing test");
}

TEST would_fail_if_run(void)
{
    FAILm("a RUN_TEST inside a test must be ignored");
}

TEST nested_run_test_is_ignored(void)
{
    RUN_TEST(would_fail_if_run);
    PASS();
}

SUITE(basic_asserts)
{
    RUN_TEST(assert_true_and_false);
    RUN_TEST(assert_comparisons);
    RUN_TEST(assert_eq_fmt_and_in_range);
    RUN_TEST(assert_strings_and_memory);
    RUN_TEST(assert_enum);
    RUN_TEST(check_call_passes);
    RUN_TEST(nested_run_test_is_ignored);
}

/* ------------------------------------------------------------------------
 * asserts.h, passing
 * ------------------------------------------------------------------------ */

TEST near_scalars(void)
{
    ASSERT_NEAR(1.0 + 1e-9, 1.0, 1e-8, 0.0);
    ASSERT_NEAR(100.5f, 100.0, 0.0, 0.01);  /* relative tolerance */
    ASSERT_NEAR(INFINITY, INFINITY, 0.0, 0.0);
    ASSERT_NEAR(-INFINITY, -INFINITY, 0.0, 0.0);
    ASSERT_NEAR(-0.0, 0.0, 0.0, 0.0);
    ASSERT_NEAR(3, 3, 0, 0);                /* integers convert to double */
    PASS();
}

TEST near_arrays_float_and_double(void)
{
    float gf[4] = {1.0f, 2.0f, 3.0f, -4.0f};
    float rf[4] = {1.0f, 2.000001f, 3.0f, -4.0f};
    double gd[3] = {1e-300, 0.5, 1e10};
    double rd[3] = {0.0, 0.5, 1e10 + 1.0};
    ASSERT_ARRAY_NEAR_F(gf, rf, 4, 1e-5, 0.0);
    ASSERT_ARRAY_NEAR_D(gd, rd, 3, 1e-12, 1e-9);
    ASSERT_ARRAY_NEAR_F(gf, rf, (size_t)0, 0.0, 0.0); /* empty: passes */
    PASS();
}

TEST array_bits_equal(void)
{
    float a[3] = {0.0f, -1.5f, 0.0f};
    float b[3];
    a[2] = (float)NAN;
    memcpy(b, a, sizeof a); /* same bits, NaN included */
    ASSERT_ARRAY_EQ_BITS_F(a, b, 3);
    PASS();
}

SUITE(numeric_asserts)
{
    RUN_TEST(near_scalars);
    RUN_TEST(near_arrays_float_and_double);
    RUN_TEST(array_bits_equal);
}

/* ------------------------------------------------------------------------
 * Failures checked in-process
 *
 * The body_* functions are tests that must fail.  Calling one directly
 * (not through RUN_TEST) gives its result without counting it.
 * ------------------------------------------------------------------------ */

TEST body_in_range_nan_got(void)
{
    ASSERT_IN_RANGE(1.0, NAN, 10.0);
    PASS();
}

TEST body_in_range_nan_expected(void)
{
    ASSERT_IN_RANGE(NAN, 1.0, 10.0);
    PASS();
}

TEST body_in_range_nan_tolerance(void)
{
    ASSERT_IN_RANGE(1.0, 1.0 + 1e-3, NAN);
    PASS();
}

TEST body_in_range_too_far(void)
{
    ASSERT_IN_RANGE(1.0, 1.5, 0.1);
    PASS();
}

TEST in_range_fails_on_nan(void)
{
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_in_range_nan_got());
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_in_range_nan_expected());
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_in_range_nan_tolerance());
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_in_range_too_far());
    PASS();
}

TEST body_near_nan(void)
{
    ASSERT_NEAR(NAN, 1.0, 1.0, 1.0);
    PASS();
}

TEST body_near_nan_both(void)
{
    ASSERT_NEAR(NAN, NAN, 1.0, 1.0);
    PASS();
}

TEST body_near_finite_vs_inf(void)
{
    /* rtol * |inf| is inf: a naive check would let this pass. */
    ASSERT_NEAR(1.0, INFINITY, 0.0, 1.0);
    PASS();
}

TEST body_near_inf_vs_minus_inf(void)
{
    ASSERT_NEAR(INFINITY, -INFINITY, 1.0, 1.0);
    PASS();
}

TEST body_near_too_far(void)
{
    ASSERT_NEAR(1.1, 1.0, 0.01, 0.01);
    PASS();
}

TEST near_fails_on_nan_and_inf(void)
{
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_near_nan());
    ASSERT(strstr(asserts_msg, "NaN never matches") != NULL);
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_near_nan_both());
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_near_finite_vs_inf());
    ASSERT(strstr(asserts_msg, "inf only matches") != NULL);
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_near_inf_vs_minus_inf());
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_near_too_far());
    ASSERT(strstr(asserts_msg, "ASSERT_NEAR(1.1, 1.0)") != NULL);
    PASS();
}

/* Mismatches at 1, 3 (a NaN), 5 (the largest finite one), 6, 7, 8. */
static const float arr_got[10] = {0, 1.5f, 2, NAN, 4, 9, 6.5f, 7.5f, 8.5f, 9};
static const float arr_ref[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};

TEST body_array_near_f_mismatches(void)
{
    ASSERT_ARRAY_NEAR_F(arr_got, arr_ref, 10, 0.1, 0.0);
    PASS();
}

TEST body_array_near_f_no_nan(void)
{
    /* The same without index 3, so the worst is the largest difference. */
    ASSERT_ARRAY_NEAR_F(arr_got + 4, arr_ref + 4, 6, 0.1, 0.0);
    PASS();
}

TEST body_array_near_d_nan_ref(void)
{
    double got[3] = {1, 2, 3};
    double ref[3] = {1, 2, 3};
    ref[1] = NAN;
    ASSERT_ARRAY_NEAR_D(got, ref, 3, 1.0, 1.0);
    PASS();
}

TEST array_near_reports_mismatches(void)
{
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_array_near_f_mismatches());
    ASSERT(strstr(asserts_msg, "6 of 10 elements") != NULL);
    ASSERT(strstr(asserts_msg, "worst [3]: got nan") != NULL);
    /* Only the first 5 mismatches are listed. */
    ASSERT(strstr(asserts_msg, "[1] got 1.5 ref 1") != NULL);
    ASSERT(strstr(asserts_msg, "[7] got 7.5 ref 7") != NULL);
    ASSERT(strstr(asserts_msg, "[8] got") == NULL);

    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_array_near_f_no_nan());
    ASSERT(strstr(asserts_msg, "4 of 6 elements") != NULL);
    ASSERT(strstr(asserts_msg, "worst [1]: got 9, ref 5") != NULL);

    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_array_near_d_nan_ref());
    ASSERT(strstr(asserts_msg, "ASSERT_ARRAY_NEAR_D") != NULL);
    ASSERT(strstr(asserts_msg, "worst [1]") != NULL);
    PASS();
}

TEST body_bits_signed_zero(void)
{
    float a[4] = {1, 2, 0.0f, 3};
    float b[4] = {1, 2, -0.0f, 3};
    ASSERT_ARRAY_EQ_BITS_F(a, b, 4);
    PASS();
}

TEST bits_report_first_difference(void)
{
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_bits_signed_zero());
    ASSERT(strstr(asserts_msg, "1 of 4 floats differ; first [2]") != NULL);
    ASSERT(strstr(asserts_msg, "(0x80000000)") != NULL);
    PASS();
}

TEST body_check_call_fails(void)
{
    CHECK_CALL(check_is_even(3));
    PASS();
}

TEST body_skips(void)
{
    SKIPm("skipped on purpose");
}

TEST results_propagate(void)
{
    ASSERT_EQ(GREATEST_TEST_RES_FAIL, body_check_call_fails());
    ASSERT_EQ(GREATEST_TEST_RES_SKIP, body_skips());
    PASS();
}

SUITE(failures_in_process)
{
    RUN_TEST(in_range_fails_on_nan);
    RUN_TEST(near_fails_on_nan_and_inf);
    RUN_TEST(array_near_reports_mismatches);
    RUN_TEST(bits_report_first_difference);
    RUN_TEST(results_propagate);
}

/* ------------------------------------------------------------------------
 * Setup and teardown
 * ------------------------------------------------------------------------ */

struct fixture {
    int value;
    unsigned setups, teardowns;
};

static struct fixture the_fixture;

static void fixture_setup(void *udata)
{
    struct fixture *f = (struct fixture *)udata;
    f->value = 42;
    f->setups++;
}

static void fixture_teardown(void *udata)
{
    struct fixture *f = (struct fixture *)udata;
    f->value = 0;
    f->teardowns++;
}

/* Whichever tests the filters select, each one sees its own setup done
 * and the teardown of every earlier test done. */
TEST setup_ran_before_test(void)
{
    ASSERT_EQ(42, the_fixture.value);
    ASSERT_EQ(the_fixture.setups, the_fixture.teardowns + 1);
    the_fixture.value = 7; /* teardown must reset it */
    PASS();
}

TEST teardown_ran_after_previous(void)
{
    ASSERT_EQ(42, the_fixture.value);
    ASSERT_EQ(the_fixture.setups, the_fixture.teardowns + 1);
    PASS();
}

SUITE(fixtures)
{
    memset(&the_fixture, 0, sizeof the_fixture);
    SET_SETUP(fixture_setup, &the_fixture);
    SET_TEARDOWN(fixture_teardown, &the_fixture);
    RUN_TEST(setup_ran_before_test);
    RUN_TEST(teardown_ran_after_previous);
    RUN_TEST(setup_ran_before_test);
}

/* Setup and teardown end with their suite. */
TEST no_setup_after_suite_end(void)
{
    ASSERT_EQ(the_fixture.setups, the_fixture.teardowns);
    ASSERT_EQ(0, the_fixture.value);
    PASS();
}

SUITE(fixtures_reset)
{
    RUN_TEST(no_setup_after_suite_end);
}

/* ------------------------------------------------------------------------
 * Tests with arguments
 * ------------------------------------------------------------------------ */

struct square_case {
    int n, square;
};

TEST square_is(const struct square_case *c)
{
    ASSERT_EQ_FMT(c->square, c->n * c->n, "%d");
    PASS();
}

TEST sum_is(int a, int b, int sum)
{
    ASSERT_EQ(sum, a + b);
    PASS();
}

TEST near_with_args(float got, double ref, double atol)
{
    ASSERT_NEAR(got, ref, atol, 0.0);
    ASSERT_IN_RANGE(ref, got, atol);
    PASS();
}

SUITE(parametric)
{
    static const struct square_case cases[] = {{2, 4}, {-3, 9}, {0, 0}};
    const char *names[] = {"two", "minus_three", "zero"};
    size_t i;

    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        greatest_set_test_suffix(names[i]);
        RUN_TEST1(square_is, &cases[i]);
    }
    RUN_TESTp(sum_is, 2, 3, 5);
    greatest_set_test_suffix("negative");
    RUN_TESTp(sum_is, -2, -3, -5);
    RUN_TESTp(near_with_args, 0.1f, 0.1, 1e-6);
}

/* ------------------------------------------------------------------------
 * Skips
 * ------------------------------------------------------------------------ */

TEST skip_plain(void)
{
    SKIP();
}

TEST skip_with_message(void)
{
    SKIPm("not relevant in this build");
}

SUITE(skips)
{
    RUN_TEST(skip_plain);
    RUN_TEST(skip_with_message);
}

/* ------------------------------------------------------------------------
 * Deliberate failures, run only with HARNESS_SELFTEST_FAIL=1.
 * tests/harness_selftest.sh expects a FAIL line for every test here except
 * teardown_ran_after_failures, which passes.
 * ------------------------------------------------------------------------ */

static unsigned fail_setups, fail_teardowns;

static void count_setup(void *udata)
{
    (void)udata;
    fail_setups++;
}

static void count_teardown(void *udata)
{
    (void)udata;
    fail_teardowns++;
}

TEST fail_assert(void)
{
    int x = 1;
    ASSERT(x == 2);
    PASS();
}

TEST fail_eq_fmt(void)
{
    int two = 2;
    ASSERT_EQ_FMT(1, two, "%d");
    PASS();
}

TEST fail_in_range_nan(void)
{
    ASSERT_IN_RANGE(0.5, NAN, 1.0);
    PASS();
}

TEST fail_in_range_nan_expected(void)
{
    ASSERT_IN_RANGEm("custom in-range message", NAN, 0.5, 1.0);
    PASS();
}

TEST fail_near_nan(void)
{
    ASSERT_NEAR(NAN, 1.0, 1e-3, 1e-3);
    PASS();
}

TEST fail_near_inf(void)
{
    ASSERT_NEAR(1.0, INFINITY, 0.0, 1.0);
    PASS();
}

TEST fail_array_near_f_nan(void)
{
    float got[3] = {1, 2, 3};
    float ref[3] = {1, 2, 3};
    got[1] = (float)NAN;
    ASSERT_ARRAY_NEAR_F(got, ref, 3, 1.0, 1.0);
    PASS();
}

TEST fail_array_near_f_values(void)
{
    ASSERT_ARRAY_NEAR_F(arr_got + 4, arr_ref + 4, 6, 1e-3, 1e-3);
    PASS();
}

TEST fail_array_near_d(void)
{
    double got[2] = {1.0, 2.0 + 1e-9};
    double ref[2] = {1.0, 2.0};
    ASSERT_ARRAY_NEAR_D(got, ref, 2, 0.0, 1e-12);
    PASS();
}

TEST fail_bits(void)
{
    float a[2] = {1.0f, 0.0f};
    float b[2] = {1.0f, -0.0f};
    ASSERT_ARRAY_EQ_BITS_F(a, b, 2);
    PASS();
}

TEST fail_str_eq(void)
{
    ASSERT_STR_EQ("expected text", "actual text");
    PASS();
}

TEST fail_strn_eq(void)
{
    ASSERT_STRN_EQ("abcdef", "abcxyz", 4);
    PASS();
}

TEST fail_mem_eq(void)
{
    unsigned char a[40], b[40];
    memset(a, 0x11, sizeof a);
    memcpy(b, a, sizeof b);
    b[21] = 0xff;
    b[23] = 0xee;
    ASSERT_MEM_EQ(a, b, sizeof a);
    PASS();
}

TEST fail_enum_eq(void)
{
    enum color c = COLOR_GREEN;
    ASSERT_ENUM_EQ(COLOR_RED, c, color_name);
    PASS();
}

TEST fail_failm(void)
{
    char local[32];
    strcpy(local, "message from a local buffer");
    FAILm(local); /* copied by the harness, so a local buffer is fine */
}

TEST fail_plain(void)
{
    FAIL();
}

TEST fail_check_call(void)
{
    CHECK_CALL(check_is_even(7));
    PASS();
}

TEST fail_with_args(int a, int b)
{
    ASSERT_LT(a, b);
    PASS();
}

TEST teardown_ran_after_failures(void)
{
    ASSERT_EQ(fail_setups, fail_teardowns + 1);
    PASS();
}

SUITE(deliberate_failures)
{
    SET_SETUP(count_setup, NULL);
    SET_TEARDOWN(count_teardown, NULL);
    RUN_TEST(fail_assert);
    RUN_TEST(fail_eq_fmt);
    RUN_TEST(fail_in_range_nan);
    RUN_TEST(fail_in_range_nan_expected);
    RUN_TEST(fail_near_nan);
    RUN_TEST(fail_near_inf);
    RUN_TEST(fail_array_near_f_nan);
    RUN_TEST(fail_array_near_f_values);
    RUN_TEST(fail_array_near_d);
    RUN_TEST(fail_bits);
    RUN_TEST(fail_str_eq);
    RUN_TEST(fail_strn_eq);
    RUN_TEST(fail_mem_eq);
    RUN_TEST(fail_enum_eq);
    RUN_TEST(fail_failm);
    RUN_TEST(fail_plain);
    RUN_TEST(fail_check_call);
    greatest_set_test_suffix("5_3");
    RUN_TESTp(fail_with_args, 5, 3);
    RUN_TEST(teardown_ran_after_failures);
}

/* ------------------------------------------------------------------------ */

SUITE_EXTERN(second_unit); /* defined in test_harness_selftest2.c */

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    const char *fail = getenv("HARNESS_SELFTEST_FAIL");

    GREATEST_MAIN_BEGIN();
    RUN_SUITE(basic_asserts);
    RUN_SUITE(numeric_asserts);
    RUN_SUITE(failures_in_process);
    RUN_SUITE(fixtures);
    RUN_SUITE(fixtures_reset);
    RUN_SUITE(parametric);
    RUN_SUITE(skips);
    RUN_SUITE(second_unit);
    if (fail != NULL && strcmp(fail, "1") == 0) RUN_SUITE(deliberate_failures);
    GREATEST_MAIN_END();
}
