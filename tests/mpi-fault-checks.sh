#!/bin/bash
# The communicator's fault scenarios (tests/comm_faults.c) under Open MPI. Each must
# end the whole job quickly, with a non-zero exit status and the report that says what
# went wrong: MISMATCH naming both calls, TIMEOUT naming the operation, or the rank
# that failed. (tests/test_comm.c checks the same scenarios on the threads backend.)
# Usage: tests/mpi-fault-checks.sh BUILD_DIR      (BUILD_DIR/tests/test_mpi_comm)
set -u
program=${1:-build/cpu-mpi}/tests/test_mpi_comm
ranks=3
comm_timeout=1    # seconds a rank waits before it reports a TIMEOUT
limit=15          # seconds the whole job may take to end
mpirun_flags="--allow-run-as-root --oversubscribe --bind-to none -x OMPI_MCA_btl_vader_single_copy_mechanism=none"
passed=0
failed=0

# expect_fault SCENARIO PATTERN...: exit status non-zero within $limit s (a job still
# running after twice that is stopped), and every PATTERN in its output.
expect_fault() {
    local scenario=$1
    shift
    local start out status took missing=""
    start=$(date +%s%N)
    out=$(timeout -k 5 $((2 * limit)) mpirun $mpirun_flags -np $ranks "$program" "$scenario" \
          $comm_timeout 2>&1)
    status=$?
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    for pattern in "$@"; do
        printf '%s\n' "$out" | grep -qF -- "$pattern" || missing="$missing \"$pattern\""
    done
    local report
    report=$(printf '%s\n' "$out" | grep -E -m 1 'MISMATCH|TIMEOUT|failed')
    if [ $status -ne 0 ] && [ $status -ne 124 ] && [ $status -ne 137 ] &&
       [ $took -le $((1000 * limit)) ] && [ -z "$missing" ]; then
        passed=$((passed + 1))
        printf 'ok   %-15s exit %d after %d.%03d s: %s\n' "$scenario" $status \
               $((took / 1000)) $((took % 1000)) "$report"
    else
        failed=$((failed + 1))
        printf 'FAIL %-15s exit %d after %d.%03d s (limit %d s)%s\n' "$scenario" $status \
               $((took / 1000)) $((took % 1000)) $limit "${missing:+; output lacks$missing}"
        printf '%s\n' "$out" | sed 's/^/     | /'
    fi
}

if [ ! -x "$program" ]; then
    echo "SKIP: $program is not built (make MPI=1 tests)"
    exit 77
fi
expect_fault mismatch "collective MISMATCH on group 'world' #2" \
    "rank 0 calls allreduce(16 x f32, sum) but rank 1 calls allgather(16 x f32)"
expect_fault mismatch-count "collective MISMATCH on group 'world' #2" \
    "rank 0 calls allreduce(16 x f32, sum) but rank 1 calls allreduce(15 x f32, sum)"
expect_fault mismatch-root "collective MISMATCH on group 'world' #2" \
    "rank 0 calls broadcast(16 x f32, root 0) but rank 1 calls broadcast(16 x f32, root 1)"
expect_fault hang "TIMEOUT" "in allreduce(16 x f32, sum) #2 on group 'world'" \
    "comm: rank 2 had returned from rank_main: it skipped a collective the others are in" \
    "stuck in allreduce #2 on group 'world'"
expect_fault async-hang "TIMEOUT" "in allreduce(16 x f32, sum) #2 on group 'world'"
expect_fault recv-hang "TIMEOUT: rank 0 waited" "in recv(16 x f32, peer 2, tag 7)" \
    "waiting for rank 2"
expect_fault recv-size "rank 1 failed: recv on 'world': rank 0 sent 64 bytes with tag 5, rank 1 expects 60"
expect_fault abort "rank 2 failed: boom: loss is NaN at step 7"
expect_fault fail "rank 1 failed: rank_main returned 3"
expect_fault alltoall-hang "TIMEOUT" "in alltoall(2 x f32 per rank) #2 on group 'world'" \
    "comm: rank 2 had returned from rank_main: it skipped a collective the others are in"
expect_fault alltoallv-count \
    "rank 1 failed: comm_alltoallv on 'world': rank 0 sends 2 elements to rank 1, which expects 1 (its recv_counts[0])"
echo "mpi-fault-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
