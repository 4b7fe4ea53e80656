#!/bin/bash
# Bad input must give one clear error line naming the value, and exit status 2, before
# any rank starts. Usage: tests/cli-checks.sh BUILD_DIR
set -u
build=${1:-build/cpu}
passed=0
failed=0
short=$(mktemp)
head -c 20 /etc/hostname >"$short" 2>/dev/null || printf 'too short' >"$short"

# expect_error PROGRAM PATTERN ARGS...: exit 2, exactly one stderr line matching PATTERN
expect_error() {
    local program=$1 pattern=$2
    shift 2
    local err status
    err=$("$program" "$@" 2>&1 >/dev/null)
    status=$?
    local lines
    lines=$(printf '%s\n' "$err" | grep -c .)
    if [ $status -eq 2 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -q -- "$pattern"; then
        passed=$((passed + 1))
        echo "ok   $(basename "$program") $*  ->  $err"
    else
        failed=$((failed + 1))
        echo "FAIL $(basename "$program") $*  (status $status, $lines lines): $err"
    fi
}

for program in "$build"/baseline "$build"/chapter*; do
    [ -x "$program" ] || continue
    expect_error "$program" "unknown flag '--bogus'" --bogus 1
    expect_error "$program" "--steps abc: not an integer" --steps abc
    expect_error "$program" "--dim 0: must be an integer from 1" --dim 0
    expect_error "$program" "--batch -3" --batch -3
    expect_error "$program" "--heads 3 does not divide --dim 128" --heads 3
    expect_error "$program" "--lr x: not a number" --lr x
    expect_error "$program" "--link warp: unknown value (valid: none, nvlink, ib, ethernet)" --link warp
    expect_error "$program" "--data /nonexistent: cannot open" --data /nonexistent
    expect_error "$program" "too short; a sequence of --ctx 64 needs at least 65 bytes" --data "$short"
    expect_error "$program" "--preset huge: unknown preset" --preset huge
    # negative and overflowing integers: refused, never wrapped round
    expect_error "$program" "--seed -1: must be an integer from 0 to 18446744073709551615" --seed -1
    expect_error "$program" "--seed  -1: must be an integer from 0" --seed " -1"
    expect_error "$program" "--seed 18446744073709551616: must be an integer from 0" --seed 18446744073709551616
    expect_error "$program" "--seed 12abc: must be an integer from 0" --seed 12abc
    expect_error "$program" "--warmup -1: must be an integer from 0 to 1000000000" --warmup -1
    expect_error "$program" "--steps 4294967297: must be an integer from 1 to 1000000000" --steps 4294967297
    expect_error "$program" "--layers 99999999999999999999: must be an integer from 1" --layers 99999999999999999999
    expect_error "$program" "--ctx -2147483648: must be an integer from 1" --ctx -2147483648
    expect_error "$program" "--lr -1: must be at least 0" --lr -1
    expect_error "$program" "--lr 1e999: not a number" --lr 1e999
done
# chapter 4: pipeline sizes and schedules
chapter4="$build"/chapter4
if [ -x "$chapter4" ]; then
    expect_error "$chapter4" "--pp 5: more stages than the 4 layers" --simulate --pp 5
    expect_error "$chapter4" "--pp 0: must be an integer from 1" --simulate --pp 0
    expect_error "$chapter4" "--micro 3 does not divide --batch 8" --simulate --pp 2 --micro 3
    expect_error "$chapter4" "--micro 0: must be an integer from 1" --simulate --micro 0
    expect_error "$chapter4" "--virtual 3 x --pp 2 = 6 chunks, more than the 4 layers" --simulate --pp 2 --schedule interleaved --virtual 3
    expect_error "$chapter4" "--virtual 0: must be an integer from 1" --simulate --virtual 0
    expect_error "$chapter4" "--micro 2: interleaved 1F1B takes micro-batches in groups of --pp 4" --simulate --pp 4 --layers 8 --micro 2 --schedule interleaved
    expect_error "$chapter4" "--stage-ms -1: must be at least 0" --simulate --stage-ms -1
    expect_error "$chapter4" "--schedule fast: unknown value (valid: naive, gpipe, 1f1b, interleaved, zb-h1, all)" --simulate --schedule fast
fi
# the largest seed is valid (the refusals above are not a blanket "no")
expect_ok() {
    local program=$1
    shift
    local out status
    out=$("$program" "$@" 2>&1)
    status=$?
    if [ $status -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok   $(basename "$program") $*  ->  exit 0"
    else
        failed=$((failed + 1))
        echo "FAIL $(basename "$program") $*  (status $status): $out"
    fi
}
[ -x "$build"/baseline ] && expect_ok "$build"/baseline --seed 18446744073709551615 --steps 1 \
    --layers 1 --dim 16 --heads 2 --ctx 8 --batch 1 --quiet
# chapter 6, the planner: sizes, shapes and meshes
planner="$build"/chapter6
if [ -x "$planner" ]; then
    expect_error "$planner" "--params abc: not a number" --params abc
    expect_error "$planner" "--params -5: must be at least 1" --params -5
    expect_error "$planner" "--gpus 0: must be an integer from 1" --gpus 0
    expect_error "$planner" "--heads 100 does not divide --dim 12288" --hidden 12288 --heads 100
    expect_error "$planner" "--tp 8 x --pp 4 x --dp 4 = 128 does not multiply to --gpus 64" --params 70e9 --gpus 64 --tp 8 --pp 4 --dp 4
    expect_error "$planner" "--tp 3 x --pp 1 = 3 does not divide --gpus 64" --params 70e9 --gpus 64 --tp 3
    expect_error "$planner" "--tp 8 does not divide the 4 heads" --gpus 8 --tp 8
    expect_error "$planner" "--params 7e+10 and --layers both given" --params 70e9 --layers 80
    expect_error "$planner" "--mfu 2: must be a fraction of peak in (0, 1]" --mfu 2
    expect_error "$planner" "--gpu-mem x: not a number" --gpu-mem x
    expect_error "$planner" "--batch 100 does not split into --dp 64" --params 70e9 --gpus 64 --dp 64 --batch 100
    expect_error "$planner" "--zero 3 belongs to a mesh" --params 70e9 --zero 3
fi
# chapter 5: meshes that do not fit, with meshes that would
chapter5="$build"/chapter5
if [ -x "$chapter5" ]; then
    expect_error "$chapter5" "--tp 2 --pp 2 --dp 2 needs 8 ranks, not 6; with that many ranks try --tp 2 --pp 3 --dp 1" --ranks 6 --tp 2 --pp 2 --dp 2
    expect_error "$chapter5" "--tp 3 does not divide --heads 4" --ranks 3 --tp 3 --pp 1 --dp 1
    expect_error "$chapter5" "--pp 5: more stages than the 4 layers" --ranks 5 --tp 1 --pp 5 --dp 1
    expect_error "$chapter5" "--batch 8 does not split over --dp 3 replicas" --ranks 3 --tp 1 --pp 1 --dp 3
    expect_error "$chapter5" "--micro 8 does not divide --batch 4" --ranks 4 --dp 2 --micro 8
    expect_error "$chapter5" "--mesh-only needs --world N" --mesh-only
    expect_error "$chapter5" "--json lists every rank: at most --world 4096" --mesh-only --world 8192 --tp 8 --pp 16 --json
    expect_error "$chapter5" "--zero 2: this chapter composes ZeRO-1" --zero 2
fi
# chapter 7, communication: sweep sizes, the ladder's calibration, the plot
chapter7="$build"/chapter7
if [ -x "$chapter7" ]; then
    expect_error "$chapter7" "--max-mib 2000: at most 1024" --max-mib 2000
    expect_error "$chapter7" "--sweep-ranks 1: must be an integer from 2" --sweep-ranks 1
    expect_error "$chapter7" "--start-efficiency 1.5: a fraction between 0 and 1" --start-efficiency 1.5
    expect_error "$chapter7" "--svg needs the strategies part" --svg x.svg --part ladder
    expect_error "$chapter7" "--batch 6 does not split evenly over 4 ranks" --ranks 4 --batch 6
    expect_error "$chapter7" "--ladder-scale -1: must be at least 0" --ladder-scale -1
    expect_error "$chapter7" "--allreduce tree: unknown value (valid: ring, naive, doubling)" --allreduce tree
fi
# ./run itself
expect_error ./run "N 'x' must be a positive whole number" x
expect_error ./run "N '0' must be a positive whole number" 0
expect_error ./run "N '-1' must be a positive whole number" -1
expect_error ./run "--ranks 99999999999999999999: must be an integer from 1" 99999999999999999999
rm -f "$short"
echo "cli-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
