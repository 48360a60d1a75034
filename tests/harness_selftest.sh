#!/bin/sh
# Checks tests/harness.h from the outside: runs the self-test program
# (tests/test_harness_selftest.c + tests/test_harness_selftest2.c) with
# various flags and checks its exit status and output.
#
# usage: sh tests/harness_selftest.sh path/to/test_harness_selftest
#
# Prints "harness selftest: ok" and exits 0 when every check passes,
# otherwise prints the failed checks and exits 1.

bin=$1
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "usage: $0 path/to/test_harness_selftest" >&2
    exit 2
fi
case $bin in
*/*) ;;
*) bin=./$bin ;; # a bare name would be looked up in $PATH
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/harness_selftest.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
out=$tmp/out
errors=0

# The tests of the suite deliberate_failures that must fail (all but the
# last one, teardown_ran_after_failures).
expected_failures="fail_assert fail_eq_fmt fail_in_range_nan
fail_in_range_nan_expected fail_near_nan fail_near_inf fail_array_near_f_nan
fail_array_near_f_values fail_array_near_d fail_bits fail_str_eq fail_strn_eq
fail_mem_eq fail_enum_eq fail_failm fail_plain fail_check_call
fail_with_args_5_3"

# bad MESSAGE: record a failed check and show the end of the run's output.
bad() {
    echo "harness selftest: FAILED: $*"
    tail -n 8 "$out" | sed 's/^/    | /'
    errors=$((errors + 1))
}

# run ARGS...: run the self-test without the deliberate failures.
# run_failing ARGS...: run it with them.
# Both leave stdout and stderr in $out and the exit status in $rc.
run() {
    HARNESS_SELFTEST_FAIL=0 "$bin" "$@" >"$out" 2>&1
    rc=$?
}
run_failing() {
    HARNESS_SELFTEST_FAIL=1 "$bin" "$@" >"$out" 2>&1
    rc=$?
}

# counts: parse the last line, "P passed, F failed, S skipped", into
# $passed, $failed, $skipped and $total; fails if the line is not like that.
counts() {
    set -- $(sed -n '$s/^\([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed, \([0-9][0-9]*\) skipped$/\1 \2 \3/p' "$out")
    [ $# -eq 3 ] || return 1
    passed=$1 failed=$2 skipped=$3
    total=$((passed + failed + skipped))
}

# listed_tests SUBSTRING: how many tests `-l` listed whose name contains
# SUBSTRING.  listed_in_suites SUBSTRING: how many tests it listed in suites
# whose name contains SUBSTRING.  Both read the listing saved in $tmp/list.
listed_tests() {
    awk -v s="$1" '/^  / && index(substr($0, 3), s) { n++ }
                   END { print n + 0 }' "$tmp/list"
}
listed_in_suites() {
    awk -v s="$1" '/^\* Suite / { name = substr($0, 9); sub(/:$/, "", name)
                                  on = index(name, s) > 0 }
                   /^  / && on { n++ }
                   END { print n + 0 }' "$tmp/list"
}

# --- A normal run passes, with a well-formed report. ---------------------
run
[ "$rc" -eq 0 ] || bad "normal run: exit status $rc, expected 0"
tail -n 1 "$out" | grep -Eq '^[0-9]+ passed, 0 failed, [0-9]+ skipped$' ||
    bad "normal run: last line is not 'N passed, 0 failed, N skipped'"
if counts; then
    all_total=$total all_passed=$passed
    [ "$skipped" -eq 2 ] || bad "normal run: $skipped skipped, expected 2"
else
    all_total=0 all_passed=0
    bad "normal run: cannot parse the last line"
fi
grep -Eq '^[0-9]+ tests? - [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped \([0-9]+\.[0-9]+ s\)$' "$out" ||
    bad "normal run: no per-suite summary with the elapsed time"
grep -q '^\* Suite second_unit:$' "$out" ||
    bad "normal run: the suite from the second .c file did not run"
grep -q '^SKIP skip_with_message: not relevant in this build$' "$out" ||
    bad "normal run: no SKIP line for a skip with a message"
grep -q '^FAIL' "$out" && bad "normal run: printed a FAIL line"

# --- -v prints one line per test. ----------------------------------------
run -v
n=$(grep -Ec '^(PASS|FAIL|SKIP) ' "$out")
[ "$rc" -eq 0 ] && [ "$n" -eq "$all_total" ] ||
    bad "-v: $n result lines (exit status $rc), expected $all_total"
grep -q '^PASS square_is_minus_three$' "$out" ||
    bad "-v: no line 'PASS square_is_minus_three' (test name suffix)"

# --- -l lists every test and runs none. ----------------------------------
run -l
cp "$out" "$tmp/list"
[ "$rc" -eq 0 ] || bad "-l: exit status $rc, expected 0"
grep -q '^  assert_comparisons$' "$out" ||
    bad "-l: test assert_comparisons is not listed"
grep -q '^\* Suite numeric_asserts:$' "$out" ||
    bad "-l: suite numeric_asserts is not listed"
grep -q ' passed, ' "$out" && bad "-l: tests were run"
n=$(listed_tests "")
[ "$n" -eq "$all_total" ] || bad "-l: listed $n tests, expected $all_total"

# --- -t runs only the tests whose name contains the filter. --------------
want=$(listed_tests near)
run -t near
if [ "$want" -gt 0 ] && [ "$rc" -eq 0 ] && counts; then
    [ "$total" -eq "$want" ] || bad "-t near: $total tests ran, expected $want"
else
    bad "-t near: exit status $rc, or no report, or no test lists as 'near'"
fi

run -e -t assert_comparisons
counts && [ "$total" -eq 1 ] && [ "$passed" -eq 1 ] ||
    bad "-e -t assert_comparisons: expected exactly 1 test to run"

run -t no_such_test_anywhere
[ "$rc" -eq 0 ] && [ "$(tail -n 1 "$out")" = "0 passed, 0 failed, 0 skipped" ] ||
    bad "-t with no match: expected exit 0 and '0 passed, 0 failed, 0 skipped'"

# --- -x leaves out the tests whose name contains the filter. -------------
run -x near
if counts; then
    [ "$total" -eq $((all_total - want)) ] ||
        bad "-x near: $total tests ran, expected $((all_total - want))"
else
    bad "-x near: no report"
fi

# --- -s runs only the matching suites. -----------------------------------
want=$(listed_in_suites fixtures)
run -s fixtures
if [ "$want" -gt 0 ] && counts; then
    [ "$total" -eq "$want" ] || bad "-s fixtures: $total ran, expected $want"
else
    bad "-s fixtures: no report, or no suite lists as 'fixtures'"
fi
run -e -s fixtures
want=$(awk '/^\* Suite fixtures:$/ { on = 1; next } /^\*/ { on = 0 }
            /^  / && on { n++ } END { print n + 0 }' "$tmp/list")
counts && [ "$total" -eq "$want" ] ||
    bad "-e -s fixtures: expected the $want tests of suite fixtures only"

# --- Bad usage. -----------------------------------------------------------
run -q
[ "$rc" -ne 0 ] && grep -q 'Usage' "$out" ||
    bad "unknown flag -q: expected usage and a non-zero exit status"
run -t
[ "$rc" -ne 0 ] || bad "-t without a value: expected a non-zero exit status"
run -h
[ "$rc" -eq 0 ] && grep -q 'Usage' "$out" ||
    bad "-h: expected usage and exit status 0"

# --- Deliberate failures are reported. ------------------------------------
run_failing
[ "$rc" -ne 0 ] || bad "failing run: exit status 0, expected non-zero"
nexpected=$(echo $expected_failures | wc -w)
if counts; then
    fail_total=$total
    [ "$failed" -eq "$nexpected" ] ||
        bad "failing run: $failed failed, expected $nexpected"
    # The other tests, teardown_ran_after_failures included, still pass.
    [ "$passed" -eq $((all_passed + 1)) ] ||
        bad "failing run: $passed passed, expected $((all_passed + 1))"
else
    fail_total=0
    bad "failing run: last line is not 'N passed, N failed, N skipped'"
fi
for name in $expected_failures; do
    grep -q "^FAIL $name: " "$out" || bad "failing run: no 'FAIL $name:' line"
done
grep -q '^FAIL fail_in_range_nan: .*(.*test_harness_selftest\.c:[0-9][0-9]*)$' "$out" ||
    bad "failing run: FAIL line without '(file:line)'"
grep -q '^FAIL fail_in_range_nan_expected: custom in-range message ' "$out" ||
    bad "failing run: custom message of ASSERT_IN_RANGEm not shown"
grep -q '^    Expected: 1$' "$out" && grep -q '^         Got: 2$' "$out" ||
    bad "failing run: ASSERT_EQ_FMT did not show 'Expected: 1' / 'Got: 2'"
grep -q '^FAIL fail_failm: message from a local buffer ' "$out" ||
    bad "failing run: FAILm message from a local buffer not shown"

# --- -f stops at the first failure. ---------------------------------------
run_failing -f
[ "$rc" -ne 0 ] || bad "-f: exit status 0, expected non-zero"
n=$(grep -c '^FAIL ' "$out")
if counts; then
    [ "$failed" -eq 1 ] && [ "$n" -eq 1 ] && [ "$total" -lt "$fail_total" ] ||
        bad "-f: $failed failed, $n FAIL lines, $total of $fail_total ran;" \
            "expected 1, 1 and fewer"
else
    bad "-f: last line is not 'N passed, N failed, N skipped'"
fi

if [ "$errors" -eq 0 ]; then
    echo "harness selftest: ok"
    exit 0
fi
echo "harness selftest: $errors check(s) failed"
exit 1
