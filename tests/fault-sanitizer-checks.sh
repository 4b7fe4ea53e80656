#!/bin/bash
# The failure path under the sanitizers: every fault scenario of the communicator
# (tests/comm_faults.c: timeouts, mismatches, an abort, a failed rank) must end with its
# report, and ThreadSanitizer must see no race and AddressSanitizer no leak or bad
# access while the job is torn down: stopped communication threads joined before their
# comms are freed, the stopped ranks' buffers and unwaited requests given back. Last, a
# training rank that fails half-way (chapter 1's DDP with a diverging loss).
# Usage: tests/fault-sanitizer-checks.sh   (builds test_comm with SAN=thread, SAN=address)
set -u
cd "$(dirname "$0")/.."
passed=0
failed=0
ranks=3
comm_timeout=0.5

# judge LABEL STATUS LOG: the scenario failed as it should (exit 1, a report), and the
# sanitizer said nothing
judge() {
    local label=$1 status=$2 log=$3
    local report sanitizer
    report=$(grep -E -m 1 'TIMEOUT|MISMATCH|failed' "$log")
    sanitizer=$(grep -E -m 1 'WARNING: ThreadSanitizer|ERROR: (Leak|Address)Sanitizer|runtime error' "$log")
    if [ "$status" -eq 1 ] && [ -n "$report" ] && [ -z "$sanitizer" ]; then
        passed=$((passed + 1))
        echo "ok   $label: exit 1, clean: $report"
    else
        failed=$((failed + 1))
        echo "FAIL $label: exit $status; report: ${report:-none}; sanitizer: ${sanitizer:-none}"
        sed 's/^/     | /' "$log" | head -40
    fi
}

log=$(mktemp)
# negative control: the judge fails a report that comes with a sanitizer's finding
printf 'comm: TIMEOUT: rank 0 waited\n==1==ERROR: LeakSanitizer: detected memory leaks\n' >"$log"
before=$failed
judge "negative control" 1 "$log" >/dev/null
if [ $failed -eq $((before + 1)) ]; then
    failed=$before passed=$((passed + 1))
    echo "ok   negative control: a report with a LeakSanitizer finding is judged a failure"
else
    failed=$((failed + 1))
    echo "FAIL negative control: a LeakSanitizer finding was not caught"
fi

# async-hang five times: the race it once had (a communication thread still copying
# from a peer's comm while that comm was freed) showed in about one run in five
scenarios="hang async-hang async-hang async-hang async-hang async-hang recv-hang abort fail
           mismatch mismatch-count mismatch-root recv-size"
for san in thread address; do
    program=build/cpu-$san/tests/test_comm
    make -s -j2 SAN=$san "$program" >/dev/null || { echo "FAIL make SAN=$san test_comm"; failed=$((failed + 1)); continue; }
    for scenario in $scenarios; do
        TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ASAN_OPTIONS=detect_leaks=1 \
            timeout -k 5 60 "$program" "$scenario" $ranks $comm_timeout >"$log" 2>&1
        judge "$scenario ($san sanitizer)" $? "$log"
    done
done
# a rank that fails in the middle of training (the loss diverges) is stopped with
# everything it held: its model, buckets and training loop's arrays given back too
program=build/cpu-address/chapter1
if make -s -j2 SAN=address "$program" >/dev/null; then
    ASAN_OPTIONS=detect_leaks=1 OPENBLAS_NUM_THREADS=1 timeout -k 5 120 "$program" --ranks 2 \
        --layers 1 --dim 16 --heads 2 --ctx 8 --batch 8 --steps 30 --lr 1e6 --quiet \
        --strategy ddp >"$log" 2>&1
    judge "a DDP rank whose loss diverges (address sanitizer)" $? "$log"
else
    echo "FAIL make SAN=address chapter1"; failed=$((failed + 1))
fi
rm -f "$log"
echo "fault-sanitizer-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
