# How make test runs and counts one suite (sourced by tools/run-tests and by
# tests/harness-checks.sh, which checks it). The caller sets passed, failed, skipped,
# failures (labels of failed suites) and limit (seconds a suite may run).
#
# Skips: a program that has nothing to run here prints "SKIP: <reason>" and exits 77;
# a suite that leaves out a test at this world size prints "SKIP: <test>: <reason>".
# Each such line counts as one skipped test, never as a pass.

# Adds one suite's counts. Its own tally is Check's "Checks: N, Failures: F, Errors: E"
# or a script's "<name>: N passed, N failed"; without one, the exit status is one test.
# A non-zero exit status with nothing failed in the tally still counts one failure.
count_suite() {   # label status log
    local label=$1 status=$2 log=$3 skips numbers
    skips=$(grep -c '^SKIP:' "$log")
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        echo "-- $label: TIMEOUT: still running after $limit s, stopped"
        failed=$((failed + 1))
        failures="$failures $label(timeout)"
        return
    fi
    if [ "$status" -eq 77 ]; then
        skipped=$((skipped + (skips > 0 ? skips : 1)))
        return
    fi
    numbers=$(grep -Eo 'Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$log" | tail -n 1 |
              grep -Eo '[0-9]+' | tr '\n' ' ')
    local ok=0 bad=0
    if [ -n "$numbers" ]; then
        local checks fails errors
        read -r checks fails errors <<<"$numbers"
        ok=$((checks - fails - errors))
        bad=$((fails + errors))
        if [ "$checks" -eq 0 ] && [ "$skips" -eq 0 ]; then   # e.g. a misspelt CK_RUN_CASE
            echo "-- $label: ran no checks and skipped none"
            bad=1
        fi
    else
        numbers=$(grep -Eo '^[A-Za-z0-9_-]+: [0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1 |
                  grep -Eo '[0-9]+' | tr '\n' ' ')
        if [ -n "$numbers" ]; then
            read -r ok bad <<<"$numbers"
        elif [ "$status" -eq 0 ]; then
            ok=1
        fi
    fi
    [ "$status" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    passed=$((passed + ok))
    failed=$((failed + bad))
    skipped=$((skipped + skips))
    [ "$bad" -gt 0 ] && failures="$failures $label"
}

# Runs one test command under the time limit and counts it.
run_suite() {
    local label=$1
    shift
    echo "== $label"
    local log start status
    log=$(mktemp)
    start=$(date +%s)
    timeout -k 20 "$limit" "$@" >"$log" 2>&1
    status=$?
    cat "$log"
    count_suite "$label" "$status" "$log"
    echo "-- $label: exit $status after $(($(date +%s) - start)) s"
    rm -f "$log"
}

# Lanes: suites that may run beside the others (a core of their own is enough, no time
# bound tighter than a loaded machine allows, or mostly waiting) run in a lane.
# `lane NAME COMMAND...` starts COMMAND (a function of run_suite calls) in the
# background with counts of its own; join_lanes waits for every lane, prints each one's
# output whole, in the order they were started, and adds its counts. A lane that ends
# without its counts (a build in it failed, or it was killed) counts one failure.
lane_names=()
lane_pids=()
lanes_dir=""
lane() {
    local name=$1
    shift
    [ -n "$lanes_dir" ] || lanes_dir=$(mktemp -d)
    (
        passed=0 failed=0 skipped=0 failures="" in_lane=$name
        "$@"
        echo "$passed $failed $skipped $failures" >"$lanes_dir/$name.counts"
    ) >"$lanes_dir/$name.log" 2>&1 &
    lane_pids+=($!)
    lane_names+=("$name")
}

join_lanes() {
    local i name p f s rest
    for i in "${!lane_names[@]}"; do
        name=${lane_names[i]}
        wait "${lane_pids[i]}"
        echo "== lane $name (ran beside the suites above)"
        cat "$lanes_dir/$name.log"
        if read -r p f s rest <"$lanes_dir/$name.counts" 2>/dev/null; then
            passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
            failures="$failures${rest:+ $rest}"
        else
            echo "-- lane $name: ended without its counts"
            failed=$((failed + 1))
            failures="$failures lane:$name"
        fi
        rm -f "$lanes_dir/$name.log" "$lanes_dir/$name.counts"
    done
    lane_names=()
    lane_pids=()
}
