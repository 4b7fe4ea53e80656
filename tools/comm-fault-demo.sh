#!/bin/sh
# Runs the communicator's fault scenarios (tests/comm_faults.c) and shows that each
# ends quickly, non-zero, with a message naming the ranks: threads, and MPI if built.
#   tools/comm-fault-demo.sh [scenario...]      (default: all of them)
# Builds with O=comm: build/cpu-comm/tests/test_comm, build/cpu-mpi-comm/tests/test_mpi_comm.
set -u
cd "$(dirname "$0")/.." || exit 1
scenarios=${*:-"mismatch mismatch-count mismatch-root hang async-hang recv-hang recv-size abort fail"}
threads=build/cpu-comm/tests/test_comm
mpi=build/cpu-mpi-comm/tests/test_mpi_comm
make -s O=comm "$threads" || exit 1
make -s O=comm MPI=1 "$mpi" 2>/dev/null || mpi=""
failed=0

expect_failure() {   # name, seconds limit, command...
    name=$1 limit=$2
    shift 2
    start=$(date +%s.%N)
    "$@" 2>&1 | grep -v -e '^\[' -e '^NOTE' -e '^You may' -e '^exactly' -e '^---' -e '^$' \
                       -e '^with errorcode' -e '^MPI_ABORT'
    status=$(cat /tmp/comm-fault-demo.$$ 2>/dev/null || echo 1)
    took=$(echo "$(date +%s.%N) - $start" | bc)
    echo "  -> $name: exit status $status after ${took}s"
    if [ "$status" = 0 ] || [ "$(echo "$took > $limit" | bc)" = 1 ]; then failed=1; fi
}
status_of() { "$@"; echo $? > /tmp/comm-fault-demo.$$; }

for s in $scenarios; do
    echo "== threads, 3 ranks, timeout 2 s: $s"
    expect_failure "threads $s" 8 status_of "$threads" "$s" 3 2
    if [ -n "$mpi" ]; then
        echo "== mpi, 3 ranks, timeout 2 s: $s"
        expect_failure "mpi $s" 15 status_of mpirun --allow-run-as-root --oversubscribe -np 3 "$mpi" "$s" 2
    fi
done
rm -f /tmp/comm-fault-demo.$$
[ "$failed" = 0 ] && echo "every scenario ended non-zero within its limit" || echo "SOME SCENARIO DID NOT END AS IT SHOULD"
exit "$failed"
