#!/bin/bash
# Checkpoints through the programs themselves: save at step 5 of 10 and resume in the
# same layout (losses bit-identical to the uninterrupted run, threads and, with an MPI
# build, Open MPI), and resume a ZeRO-3 x 4 checkpoint as TP 2 x DP 2, PP 2, the
# baseline and a 3D mesh: each resumed run must match its own baseline (which resumes
# from the same checkpoint) within the chapters' tolerances (loss 1e-5, gradients 1e-6,
# parameters 1e-4). Each check prints the largest difference it saw; a negative control
# (a resumed run with another learning rate) must fail the same comparison.
# Usage: tests/checkpoint-checks.sh BUILD_DIR [MPI_BUILD_DIR]
set -u
build=${1:-build/cpu}
mpi_build=${2:-}
mpirun_flags="--allow-run-as-root --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS=1 -x OMPI_MCA_btl_vader_single_copy_mechanism=none"
python=$(command -v python3 || echo /usr/bin/python3)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model="--layers 2 --dim 32 --heads 2 --ctx 16 --batch 8 --quiet --json"
passed=0
failed=0

verdict() {   # verdict NAME STATUS OUTPUT
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "ok   $1: $3"
    else failed=$((failed + 1)); echo "FAIL $1: $3"; fi
}

# loss_gap FULL RESUMED STRATEGY: prints the gap; status 0 when steps 6-10 of FULL equal
# RESUMED's bit for bit
loss_gap() {
    "$python" - "$1" "$2" "$3" <<'PY'
import json, sys
runs = lambda p: {r["strategy"]: r["loss"] for r in json.load(open(p))["runs"]}
full, resumed = runs(sys.argv[1])[sys.argv[3]], runs(sys.argv[2])[sys.argv[3]]
d = max(abs(a - b) for a, b in zip(full[5:], resumed)) if len(resumed) == 5 else float("inf")
print(f"steps 6-10 of {sys.argv[3]}: {len(resumed)} losses, largest difference {d:g} (tolerance 0)")
sys.exit(0 if d == 0 else 1)
PY
}
same_losses() {   # same_losses NAME FULL RESUMED STRATEGY
    local out status
    out=$(loss_gap "$2" "$3" "$4")
    status=$?
    verdict "$1" $status "$out"
}

# within_tolerance NAME JSON: every strategy's difference from its (resumed) baseline
within_tolerance() {
    local out status
    out=$("$python" - "$2" <<'PY'
import json, sys
tol = {"loss": 1e-5, "grads": 1e-6, "params": 1e-4}
runs = json.load(open(sys.argv[1]))["runs"]
worst, text = 0.0, []
for r in runs:
    d = r["diff_vs_baseline"]
    text.append(f"{r['strategy']} steps {len(r['loss'])} loss {d['loss']:g} grads {d['grads']:g} params {d['params']:g}")
    worst = max([worst] + [d[k] / tol[k] for k in tol] + [0 if len(r["loss"]) == 5 else 9])
print("; ".join(text) + f" (worst {worst:.2g} of tolerance)")
sys.exit(0 if worst <= 1 else 1)
PY
)
    status=$?
    verdict "$1" $status "$out"
}

# negative control NAME FULL RESUMED STRATEGY: the comparison must fail
negate() {
    local out
    if out=$(loss_gap "$2" "$3" "$4"); then failed=$((failed + 1)); echo "FAIL $1: passed: $out"
    else passed=$((passed + 1)); echo "ok   $1 fails as it must: $out"; fi
}

run_pair() {   # run_pair LAUNCHER... : full, first half with --save, second with --resume
    local tag=$1
    shift
    "$@" $model --steps 10 >"$work/$tag-full.json" &&
        "$@" $model --steps 5 --save "$work/$tag" >"$work/$tag-a.json" 2>/dev/null &&
        "$@" $model --steps 10 --resume "$work/$tag" >"$work/$tag-b.json"
}

# 1. same layout, threads: ZeRO-3 on 4 ranks (its checkpoint is the directory's latest)
if run_pair z3 "$build"/chapter2 --ranks 4 --stage 3; then
    same_losses "zero3 x4 resumed (threads)" "$work/z3-full.json" "$work/z3-b.json" zero3
    "$build"/chapter2 --ranks 4 --stage 3 $model --steps 10 --resume "$work/z3" --lr 2e-3 \
        >"$work/z3-lr.json"
    negate "negative control: zero3 x4 resumed with --lr 2e-3" "$work/z3-full.json" \
        "$work/z3-lr.json" zero3
else
    verdict "zero3 x4 save and resume (threads)" 1 "a run failed"
fi

# 2. the ZeRO-3 x 4 checkpoint in other layouts
across() {   # across NAME PROGRAM ARGS...
    local name=$1
    shift
    if "$@" $model --steps 10 --resume "$work/z3" >"$work/across.json"; then
        within_tolerance "zero3 x4 -> $name" "$work/across.json"
    else
        verdict "zero3 x4 -> $name" 1 "exit status non-zero"
    fi
}
across "tp 2 x dp 2" "$build"/chapter3 --ranks 4 --tp 2 --part train
across "pp 2 (1F1B)" "$build"/chapter4 --ranks 2 --pp 2 --schedule 1f1b --micro 4
across "baseline" "$build"/baseline
across "tp 2 x pp 2 x dp 2 + ZeRO-1" "$build"/chapter5 --ranks 8 --tp 2 --pp 2 --dp 2 --zero 1 --micro 2
across "ddp x 2" "$build"/chapter1 --ranks 2 --strategy ddp

# 3. same layout under Open MPI (when an MPI build of chapter 2 is there)
if [ -n "$mpi_build" ] && [ -x "$mpi_build/chapter2" ]; then
    if run_pair mpi mpirun $mpirun_flags -np 4 "$mpi_build"/chapter2 --stage 3; then
        same_losses "zero3 x4 resumed (Open MPI)" "$work/mpi-full.json" "$work/mpi-b.json" zero3
    else
        verdict "zero3 x4 save and resume (Open MPI)" 1 "a run failed"
    fi
fi
echo "checkpoint-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
