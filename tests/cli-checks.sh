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
done
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
# ./run itself
expect_error ./run "N 'x' must be a positive whole number" x
expect_error ./run "N '0' must be a positive whole number" 0
rm -f "$short"
echo "cli-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
