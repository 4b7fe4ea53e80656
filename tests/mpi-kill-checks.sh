#!/bin/bash
# A rank that dies or stops under ./run with Open MPI is named, and the job ends
# non-zero within seconds: kill -9 and SIGTERM of one rank's process (found by its pid)
# must give a line naming that rank and the signal; a rank stopped with SIGSTOP must be
# caught by --comm-timeout. A run nobody touches is the control: exit 0, no such line.
# Usage: tests/mpi-kill-checks.sh BUILD_DIR        (BUILD_DIR/chapter1, an MPI=1 build)
set -u
cd "$(dirname "$0")/.."
build=${1:-build/cpu-mpi}
program=$build/chapter1
ranks=3
victim=1          # the world rank whose process is signalled
limit=10          # seconds from the signal to the end of the job
comm_timeout=2
passed=0
failed=0
if [ ! -x "$program" ]; then
    echo "SKIP: $program is not built (make MPI=1 chapter1)"
    exit 77
fi
last=$(mktemp)
printf '%s\nmpi\n' "$program" >"$last"
err=$(mktemp)
marker=$((RANDOM * 32768 + RANDOM))   # --seed: finds this test's processes, no other's

# pid_of_rank RANK: the pid of that rank's process (waits up to 30 s for it to start)
pid_of_rank() {
    local rank=$1 pid
    for _ in $(seq 300); do
        for pid in $(pgrep -f -- "$program .*--seed $marker"); do
            if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
                echo "$pid"
                return 0
            fi
        done
        sleep 0.1
    done
    return 1
}

# start STEPS: ./run in the background; sets run_pid
start() {
    RUN_LAST=$last ./run $ranks --batch 6 --steps "$1" --quiet --strategy ddp --seed $marker \
        --comm-timeout $comm_timeout >/dev/null 2>"$err" &
    run_pid=$!
}

# expect_named SIGNAL PATTERN: signal the victim; the job ends non-zero within $limit s
# and its stderr has PATTERN
expect_named() {
    local signal=$1 pattern=$2 pid status start took
    start 100000
    if ! pid=$(pid_of_rank $victim); then
        failed=$((failed + 1)); echo "FAIL $signal: rank $victim never started"
        kill "$run_pid" 2>/dev/null; wait "$run_pid"; return
    fi
    sleep 1   # let it train
    start=$(date +%s%N)
    kill -s "$signal" "$pid"
    ( sleep $((2 * limit)); kill -9 "$run_pid" 2>/dev/null ) &
    local guard=$!
    wait "$run_pid"
    status=$?
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    kill "$guard" 2>/dev/null; wait "$guard" 2>/dev/null
    local line
    line=$(grep -m 1 -- "$pattern" "$err")
    if [ $status -ne 0 ] && [ $took -le $((1000 * limit)) ] && [ -n "$line" ]; then
        passed=$((passed + 1))
        printf 'ok   kill -%s rank %d (pid %d): exit %d after %d.%03d s: %s\n' "$signal" $victim \
               "$pid" $status $((took / 1000)) $((took % 1000)) "$line"
    else
        failed=$((failed + 1))
        printf 'FAIL kill -%s rank %d: exit %d after %d ms (limit %d s); stderr lacks "%s":\n' \
               "$signal" $victim $status $took $limit "$pattern"
        sed 's/^/     | /' "$err" | head -20
    fi
}

expect_named KILL "run: rank $victim (node .*) was killed by signal 9 (Killed)"
expect_named TERM "run: rank $victim (node .*) was killed by signal 15 (Terminated)"
expect_named STOP "comm: rank $victim reported no timeout within 1 s of rank 0.s: it was stopped"

# the control: an untouched run ends 0 and names no rank as killed
start 2
wait "$run_pid"
status=$?
if [ $status -eq 0 ] && ! grep -q "was killed" "$err"; then
    passed=$((passed + 1))
    echo "ok   control: an untouched run exits 0 and names no killed rank"
else
    failed=$((failed + 1))
    echo "FAIL control: exit $status"; sed 's/^/     | /' "$err" | head -20
fi
rm -f "$last" "$err"
echo "mpi-kill-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
