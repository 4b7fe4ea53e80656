#!/bin/bash
# make test's own counting (tools/suite-count.sh) on made-up suites: skips are not
# passes, failures and hangs are failures, a suite that ran nothing is not a pass; the
# mpirun filter; and the choice of OpenBLAS's kernels (tools/blas-kernel.sh).
# Usage: tests/harness-checks.sh
set -u
cd "$(dirname "$0")/.."
. tools/suite-count.sh
checks_passed=0
checks_failed=0

# expect_counts "PASSED FAILED SKIPPED" LABEL COMMAND...: the counts one suite adds
expect_counts() {
    local want=$1 label=$2
    shift 2
    passed=0 failed=0 skipped=0 failures=""
    run_suite "$label" "$@" >/dev/null 2>&1
    local got="$passed $failed $skipped"
    if [ "$got" = "$want" ]; then
        checks_passed=$((checks_passed + 1))
        echo "ok   $label: passed failed skipped = $got"
    else
        checks_failed=$((checks_failed + 1))
        echo "FAIL $label: passed failed skipped = $got, expected $want"
    fi
}

limit=2
expect_counts "0 0 1" "exit 77 with a SKIP line" bash -c 'echo "SKIP: no GPU"; exit 77'
expect_counts "0 0 1" "exit 77 alone" bash -c 'exit 77'
expect_counts "5 0 2" "Check suite, two tests left out" \
    bash -c 'echo "SKIP: a: needs 2 ranks"; echo "SKIP: b: needs 4"; echo "100%: Checks: 5, Failures: 0, Errors: 0"'
expect_counts "3 2 0" "Check suite with a failure and an error" \
    bash -c 'echo "60%: Checks: 5, Failures: 1, Errors: 1"; exit 1'
expect_counts "5 1 0" "Check suite passing, then crashing" \
    bash -c 'echo "100%: Checks: 5, Failures: 0, Errors: 0"; kill -ABRT $$'
expect_counts "0 1 0" "Check suite that ran nothing" \
    bash -c 'echo "100%: Checks: 0, Failures: 0, Errors: 0"'
expect_counts "0 0 1" "Check suite whose only test was left out" \
    bash -c 'echo "SKIP: a: needs 2 ranks"; echo "100%: Checks: 0, Failures: 0, Errors: 0"'
expect_counts "40 2 0" "script with its own tally" bash -c 'echo "x-checks: 40 passed, 2 failed"; exit 1'
expect_counts "1 0 0" "plain command passing" true
expect_counts "0 1 0" "plain command failing" false
expect_counts "0 1 0" "hang (limit $limit s)" \
    bash -c 'echo "100%: Checks: 5, Failures: 0, Errors: 0"; sleep 60'

# expect_make LABEL PATTERN STATUS MAKE_ARGS...: make -n's exit status and a line of its
# output (the commands, or the error) matching PATTERN (grep -E)
expect_make() {
    local label=$1 pattern=$2 want=$3
    shift 3
    local out status
    out=$(make -n -B MPI= GPU= DEBUG= O= "$@" 2>&1)
    status=$?
    if [ $status -eq "$want" ] && printf '%s\n' "$out" | grep -q -E -- "$pattern"; then
        checks_passed=$((checks_passed + 1))
        echo "ok   $label"
    else
        checks_failed=$((checks_failed + 1))
        echo "FAIL $label: make -n $* exited $status (expected $want), no line matching '$pattern'"
        printf '%s\n' "$out" | tail -n 3 | sed 's/^/     | /'
    fi
}
# SAN=undefined is UBSan alone: compiled and linked with it, and no AddressSanitizer
ubsan=build/cpu-undefined
expect_make "SAN=undefined compiles with -fsanitize=undefined" \
    '-fsanitize=undefined .*-c common/tensor/alloc.c' 0 SAN=undefined $ubsan/obj/common/tensor/alloc.o
expect_make "SAN=undefined links with -fsanitize=undefined" \
    "-o $ubsan/baseline[^ ]* .*-fsanitize=undefined" 0 SAN=undefined $ubsan/baseline
if make -n -B MPI= GPU= DEBUG= O= SAN=undefined $ubsan/baseline 2>&1 | grep -q -- '-fsanitize=address'; then
    checks_failed=$((checks_failed + 1))
    echo "FAIL SAN=undefined: a command has -fsanitize=address"
else
    checks_passed=$((checks_passed + 1))
    echo "ok   SAN=undefined: no command has -fsanitize=address"
fi
# an unknown SAN is refused by name, never built without a sanitizer
expect_make "SAN=bogus is refused with the valid values" \
    'SAN=bogus: unknown sanitizer \(valid: address, thread, undefined\)' 2 SAN=bogus all
# lanes (suites beside the others): a lane's counts and failures are added when it is
# joined; a lane that ends without them (a build in it failed) is a failure
two_suites() {
    run_suite "lane suite 1" bash -c 'echo "100%: Checks: 3, Failures: 0, Errors: 0"'
    run_suite "lane suite 2" bash -c 'echo "SKIP: x: no GPU"; echo "50%: Checks: 2, Failures: 1, Errors: 0"; exit 1'
}
expect_lanes() {   # expect_lanes "PASSED FAILED SKIPPED" LABEL COMMAND...
    local want=$1 label=$2
    shift 2
    passed=0 failed=0 skipped=0 failures=""
    lane harness "$@"
    join_lanes >/dev/null 2>&1
    if [ "$passed $failed $skipped" = "$want" ]; then
        checks_passed=$((checks_passed + 1)); echo "ok   lane: $label: passed failed skipped = $want"
    else
        checks_failed=$((checks_failed + 1))
        echo "FAIL lane: $label: passed failed skipped = $passed $failed $skipped, expected $want"
    fi
}
expect_lanes "4 1 1" "two suites' counts added" two_suites
exits_early() { run_suite "lane suite" true; exit 1; }   # as build() in a lane does
expect_lanes "0 1 0" "a lane that exits before its end" exits_early
if [ "${failures# }" = "lane:harness" ]; then
    checks_passed=$((checks_passed + 1)); echo "ok   lane: the lane is named among the failures"
else
    checks_failed=$((checks_failed + 1)); echo "FAIL lane: failures named '$failures'"
fi

# ./run's filter of mpirun's stderr: a peer-disconnected banner after a rank said why
# is dropped; with no rank's word before it, it is the only word and passes whole
# expect_filtered LABEL WANT_LINES INPUT: the filter prints WANT_LINES lines
expect_filtered() {
    local got
    got=$(printf '%s\n' "$3" | tools/mpirun-messages | grep -c .)
    if [ "$got" -eq "$2" ]; then
        checks_passed=$((checks_passed + 1)); echo "ok   mpirun-messages: $1"
    else
        checks_failed=$((checks_failed + 1)); echo "FAIL mpirun-messages: $1 ($got lines, expected $2)"
    fi
}
banner=$'-------------------------\nAn MPI communication peer process has unexpectedly disconnected.\n-------------------------'
expect_filtered "the peer banner after a rank's reason is dropped" 1 $'rank 0 failed: the loss is nan\n'"$banner"
expect_filtered "the peer banner alone passes whole" 3 "$banner"
# Open MPI's count of a banner's further copies, after the banner, says nothing more
aggregated=$'[vm:01234] 3 more processes have sent help message help-mpi-api.txt / mpi-abort\n[vm:01234] Set MCA parameter "orte_base_help_aggregate" to 0 to see all help / error messages'
expect_filtered "the count of a banner's copies is dropped" 1 $'rank 1 failed: the loss is nan\n'"$aggregated"
expect_filtered "one more process's copy is dropped too" 0 "${aggregated/3 more processes have/1 more process has}"
# libevent's warning as Open MPI drops the socket of a rank that already left
epoll='[warn] Epoll MOD(1) on fd 25 failed. Old events were 6; read change was 0 (none); write change was 2 (del); close change was 0 (none): Bad file descriptor'
expect_filtered "libevent's warning on a closed socket is dropped" 1 $'rank 0 failed: the loss is nan\n'"$epoll"
expect_filtered "another [warn] line passes" 1 "[warn] something else failed"

# tools/blas-kernel.sh: OpenBLAS's Prescott fallback gives way to what the CPU's flags
# allow; any other pick, and a machine's own OPENBLAS_CORETYPE, stand
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# expect_kernel LABEL DETECTED FLAGS WANT [ENV...]: OPENBLAS_CORETYPE after the choice
expect_kernel() {
    local label=$1 detected=$2 flags=$3 want=$4
    shift 4
    printf '#!/bin/sh\n[ -n "$RUN_BLAS_PROBE" ] && echo %s\n' "$detected" >"$scratch/program"
    chmod +x "$scratch/program"
    printf 'processor\t: 0\nflags\t\t: %s\n' "$flags" >"$scratch/cpuinfo"
    local got
    got=$(env -u OPENBLAS_CORETYPE -u RUN_BLAS_DETECTED "$@" RUN_CPUINFO="$scratch/cpuinfo" bash -c \
          '. tools/blas-kernel.sh; choose_blas_kernel "$1"; echo "${OPENBLAS_CORETYPE-unset}"' _ "$scratch/program")
    if [ "$got" = "$want" ]; then
        checks_passed=$((checks_passed + 1)); echo "ok   blas-kernel: $label -> $got"
    else
        checks_failed=$((checks_failed + 1)); echo "FAIL blas-kernel: $label -> $got, expected $want"
    fi
}
expect_kernel "Prescott on an AVX512_BF16 CPU" Prescott "sse avx2 avx512f avx512bw avx512_bf16" Cooperlake
expect_kernel "Prescott on an AVX-512 CPU" Prescott "sse avx2 avx512f avx512bw" SkylakeX
expect_kernel "Prescott on an AVX2 CPU" Prescott "sse fma avx2" Haswell
expect_kernel "Prescott on an SSE CPU" Prescott "sse sse3" unset
expect_kernel "OpenBLAS's own AVX-512 pick" SkylakeX "sse avx2 avx512f avx512bw avx512_bf16" unset
expect_kernel "the machine's own choice" Prescott "avx2 avx512f avx512bw" Haswell OPENBLAS_CORETYPE=Haswell
echo "harness-checks: $checks_passed passed, $checks_failed failed"
[ $checks_failed -eq 0 ]
