/*
 * Second translation unit of the harness self-test: a suite defined in its
 * own .c file, run from test_harness_selftest.c through SUITE_EXTERN.  It
 * proves that the harness state links across files and that a file using
 * only a few of the harness helpers compiles without warnings.
 */
#include "harness.h"
#include "asserts.h"

TEST second_unit_counts(void)
{
    unsigned sum = 0, i;
    for (i = 1; i <= 10; i++) sum += i;
    ASSERT_EQ(55u, sum);
    PASS();
}

TEST second_unit_near(void)
{
    float got[3] = {0.1f, 0.2f, 0.3f};
    double ref[3] = {0.1, 0.2, 0.3};
    size_t i;
    for (i = 0; i < 3; i++) ASSERT_NEAR(got[i], ref[i], 0.0, 1e-6);
    PASS();
}

SUITE(second_unit)
{
    RUN_TEST(second_unit_counts);
    RUN_TEST(second_unit_near);
}
