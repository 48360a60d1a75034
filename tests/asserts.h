/*
 * asserts.h - NaN-safe numeric asserts for tests/harness.h.
 *
 * Include it after harness.h, or after the real greatest.h: the macros use
 * nothing but the public FAILm(), so they work with either.
 *
 *   ASSERT_NEAR(got, ref, atol, rtol)               one value
 *   ASSERT_ARRAY_NEAR_F(got, ref, n, atol, rtol)     float arrays
 *   ASSERT_ARRAY_NEAR_D(got, ref, n, atol, rtol)     double arrays
 *   ASSERT_ARRAY_EQ_BITS_F(a, b, n)                  float arrays, bit for bit
 *
 * "Near" means |got - ref| <= atol + rtol * |ref|, computed in double, with
 * ref the trusted value.  NaN never passes, and an infinity only matches
 * the same infinity.  n is a size_t.
 *
 * Each check is a static function that returns 1 (pass) or 0 (fail) and on
 * failure writes an explanation into asserts_msg, which the macro hands to
 * FAILm.  The buffer is static, so it is still valid when the harness prints
 * it after the test has returned (greatest keeps only the pointer).
 */
#ifndef TESTS_ASSERTS_H
#define TESTS_ASSERTS_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* `static inline` as in harness.h: a private copy per .c file, and no
 * warning when a file does not use some of the functions. */
#if defined(__GNUC__) || defined(__clang__)
#define ASSERTS_PRINTF_(fmt_arg, first_arg) \
    __attribute__((format(printf, fmt_arg, first_arg)))
#else
#define ASSERTS_PRINTF_(fmt_arg, first_arg)
#endif

#define ASSERTS_MSG_SIZE 1024
#define ASSERTS_MAX_LISTED 5 /* mismatches listed by the array asserts */

#define ASSERT_NEAR(GOT, REF, ATOL, RTOL)                                   \
    do {                                                                    \
        if (!asserts_near((GOT), (REF), (ATOL), (RTOL), #GOT, #REF))        \
            FAILm(asserts_msg);                                             \
    } while (0)

#define ASSERT_ARRAY_NEAR_F(GOT, REF, N, ATOL, RTOL)                        \
    do {                                                                    \
        if (!asserts_array_near_f((GOT), (REF), (N), (ATOL), (RTOL),        \
                                  #GOT, #REF))                              \
            FAILm(asserts_msg);                                             \
    } while (0)

#define ASSERT_ARRAY_NEAR_D(GOT, REF, N, ATOL, RTOL)                        \
    do {                                                                    \
        if (!asserts_array_near_d((GOT), (REF), (N), (ATOL), (RTOL),        \
                                  #GOT, #REF))                              \
            FAILm(asserts_msg);                                             \
    } while (0)

#define ASSERT_ARRAY_EQ_BITS_F(A, B, N)                                     \
    do {                                                                    \
        if (!asserts_array_eq_bits_f((A), (B), (N), #A, #B))                \
            FAILm(asserts_msg);                                             \
    } while (0)

/* The message of the last failed check. */
static char asserts_msg[ASSERTS_MSG_SIZE];

/* Append printf-style text to asserts_msg; too long a text is cut off. */
static inline ASSERTS_PRINTF_(1, 2)
void asserts_appendf(const char *fmt, ...)
{
    size_t used = strlen(asserts_msg);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(asserts_msg + used, sizeof asserts_msg - used, fmt, ap);
    va_end(ap);
}

/* Plain code instead of fabs(), so that no test needs to link with -lm. */
static inline double asserts_abs(double x)
{
    return x < 0 ? -x : x;
}

/* The "near" rule for one pair of values. */
static inline int asserts_is_near(double got, double ref, double atol,
                                  double rtol)
{
    if (isnan(got) || isnan(ref)) return 0;
    if (got == ref) return 1;                 /* also inf == inf */
    /* Without this, rtol * |inf| would make any finite got "near" inf. */
    if (isinf(got) || isinf(ref)) return 0;
    return asserts_abs(got - ref) <= atol + rtol * asserts_abs(ref);
}

static inline int asserts_near(double got, double ref, double atol,
                               double rtol, const char *got_expr,
                               const char *ref_expr)
{
    if (asserts_is_near(got, ref, atol, rtol)) return 1;
    asserts_msg[0] = '\0';
    asserts_appendf("ASSERT_NEAR(%s, %s): got %.17g, ref %.17g, "
                    "|got-ref| = %.3g > atol + rtol*|ref| = %.3g",
                    got_expr, ref_expr, got, ref, asserts_abs(got - ref),
                    atol + rtol * asserts_abs(ref));
    if (isnan(got) || isnan(ref)) asserts_appendf(" (NaN never matches)");
    else if (isinf(got) || isinf(ref))
        asserts_appendf(" (inf only matches the same inf)");
    return 0;
}

/* Element i of a float or double array, as a double.  This lets one loop
 * below serve both array types. */
static inline double asserts_elem(const void *array, size_t i, int is_double)
{
    if (is_double) return ((const double *)array)[i];
    return (double)((const float *)array)[i];
}

/* The body of ASSERT_ARRAY_NEAR_F/_D.  The worst mismatch is the first NaN
 * if there is one, otherwise the one with the largest
 * |got - ref| / (atol + rtol * |ref|). */
static inline int asserts_array_near(const char *macro, const void *got,
                                     const void *ref, size_t n, int is_double,
                                     double atol, double rtol,
                                     const char *got_expr,
                                     const char *ref_expr)
{
    /* Digits that print a float or a double exactly. */
    int digits = is_double ? 17 : 9;
    size_t listed[ASSERTS_MAX_LISTED];
    size_t nlisted = 0, nbad = 0, worst = 0, i;
    int worst_is_nan = 0;
    double worst_score = 0;

    asserts_msg[0] = '\0';
    if (n > 0 && (got == NULL || ref == NULL)) {
        asserts_appendf("%s(%s, %s): %s is NULL", macro, got_expr, ref_expr,
                        got == NULL ? got_expr : ref_expr);
        return 0;
    }

    for (i = 0; i < n; i++) {
        double g = asserts_elem(got, i, is_double);
        double r = asserts_elem(ref, i, is_double);
        double tol = atol + rtol * asserts_abs(r);
        double score;
        int is_nan;

        if (asserts_is_near(g, r, atol, rtol)) continue;

        if (nlisted < ASSERTS_MAX_LISTED) listed[nlisted++] = i;
        is_nan = isnan(g) || isnan(r);
        score = tol > 0 ? asserts_abs(g - r) / tol : HUGE_VAL;
        if (isnan(score)) score = HUGE_VAL; /* e.g. inf vs -inf */
        if (nbad == 0 || (is_nan && !worst_is_nan) ||
            (is_nan == worst_is_nan && score > worst_score)) {
            worst = i;
            worst_is_nan = is_nan;
            worst_score = score;
        }
        nbad++;
    }
    if (nbad == 0) return 1;

    asserts_appendf("%s(%s, %s): %lu of %lu elements differ by more than "
                    "%g + %g*|ref|; worst [%lu]: got %.*g, ref %.*g; first:",
                    macro, got_expr, ref_expr, (unsigned long)nbad,
                    (unsigned long)n, atol, rtol, (unsigned long)worst,
                    digits, asserts_elem(got, worst, is_double),
                    digits, asserts_elem(ref, worst, is_double));
    for (i = 0; i < nlisted; i++) {
        asserts_appendf("%s [%lu] got %.*g ref %.*g", i > 0 ? "," : "",
                        (unsigned long)listed[i],
                        digits, asserts_elem(got, listed[i], is_double),
                        digits, asserts_elem(ref, listed[i], is_double));
    }
    return 0;
}

/* Typed entry points, so that passing the wrong array type is a compile
 * error instead of garbage numbers. */
static inline int asserts_array_near_f(const float *got, const float *ref,
                                       size_t n, double atol, double rtol,
                                       const char *got_expr,
                                       const char *ref_expr)
{
    return asserts_array_near("ASSERT_ARRAY_NEAR_F", got, ref, n, 0, atol,
                              rtol, got_expr, ref_expr);
}

static inline int asserts_array_near_d(const double *got, const double *ref,
                                       size_t n, double atol, double rtol,
                                       const char *got_expr,
                                       const char *ref_expr)
{
    return asserts_array_near("ASSERT_ARRAY_NEAR_D", got, ref, n, 1, atol,
                              rtol, got_expr, ref_expr);
}

/* The 32 bits of an IEEE single-precision float, for the message. */
static inline unsigned long asserts_float_bits(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (unsigned long)bits;
}

/* Bitwise equality: tells apart 0.0 and -0.0, and NaNs with different bits,
 * which == cannot. */
static inline int asserts_array_eq_bits_f(const float *a, const float *b,
                                          size_t n, const char *a_expr,
                                          const char *b_expr)
{
    size_t i, first = 0, ndiff = 0;

    asserts_msg[0] = '\0';
    if (n == 0 || a == b) return 1;
    if (a == NULL || b == NULL) {
        asserts_appendf("ASSERT_ARRAY_EQ_BITS_F(%s, %s): %s is NULL", a_expr,
                        b_expr, a == NULL ? a_expr : b_expr);
        return 0;
    }
    if (memcmp(a, b, n * sizeof *a) == 0) return 1;

    for (i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof *a) != 0) {
            if (ndiff == 0) first = i;
            ndiff++;
        }
    }
    asserts_appendf("ASSERT_ARRAY_EQ_BITS_F(%s, %s): %lu of %lu floats "
                    "differ; first [%lu]: %a (0x%08lx) vs %a (0x%08lx)",
                    a_expr, b_expr, (unsigned long)ndiff, (unsigned long)n,
                    (unsigned long)first, (double)a[first],
                    asserts_float_bits(a[first]), (double)b[first],
                    asserts_float_bits(b[first]));
    return 0;
}

#endif /* TESTS_ASSERTS_H */
