#!/bin/bash
# Checkpoints through the programs themselves: save at step 5 of 10 and resume in the
# same layout (losses bit-identical to the uninterrupted run, threads and, with an MPI
# build, Open MPI), and resume a ZeRO-3 x 4 checkpoint as TP 2 x DP 2, PP 2, the
# baseline and a 3D mesh: each resumed run must match its own baseline (which resumes
# from the same checkpoint) within the chapters' tolerances (loss 1e-5, gradients 1e-6,
# parameters 1e-4). Each check prints the largest difference it saw; a negative control
# (a resumed run with another learning rate) must fail the same comparison. Then
# tools/checkpoint_read.py: its checksum lines, --out, an edited index, no numpy.
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
# 4. tools/checkpoint_read.py on the ZeRO-3 x 4 checkpoint: the checksum state it shows,
# what --out wrote, an edited index refused, and a python3 without numpy told what to
# install (a numpy.py first on the path that fails to import stands for its absence)
numpy_python=$python
for candidate in python3 /usr/bin/python3; do   # the first that has numpy
    if "$candidate" -c 'import numpy' 2>/dev/null; then numpy_python=$candidate; break; fi
done
reader() { "$numpy_python" tools/checkpoint_read.py "$@"; }
if [ -f "$work/z3/latest" ] && "$numpy_python" -c 'import numpy' 2>/dev/null; then
    out=$(reader "$work/z3" 2>&1)
    oks=$(printf '%s\n' "$out" | grep -c 'CRC-32 [0-9a-f]\{8\} ok')
    verdict "reader lists the checksum state" $([ "$oks" -eq 5 ]; echo $?) \
        "$oks lines 'CRC-32 ... ok' (index.json and 4 rank files): $(printf '%s\n' "$out" | sed -n 2p)"
    out=$(reader "$work/z3" --out "$work/whole.safetensors" 2>&1)
    verdict "reader says what --out wrote" $(printf '%s' "$out" | grep -q "^wrote .* to $work/whole.safetensors"; echo $?) "$out"
    cp -r "$work/z3/$(cat "$work/z3/latest")" "$work/edited"
    sed -i 's/"adam_step": 5/"adam_step": 6/' "$work/edited/index.json"
    out=$(reader "$work/edited" 2>&1)
    status=$?
    verdict "reader refuses an edited index" $([ $status -eq 2 ] && printf '%s' "$out" | grep -q 'index.json: CRC-32 .*edited'; echo $?) "status $status: $out"
else
    echo "skip reader checks: no checkpoint from check 1, or no python3 with numpy"
fi
mkdir -p "$work/no-numpy"
echo 'raise ImportError("No module named numpy")' >"$work/no-numpy/numpy.py"
out=$(PYTHONPATH="$work/no-numpy" reader "$work/z3" 2>&1)
status=$?
lines=$(printf '%s\n' "$out" | grep -c .)
verdict "reader without numpy" $([ $status -eq 2 ] && [ "$lines" -eq 1 ] && printf '%s' "$out" | grep -q python3-numpy; echo $?) \
    "status $status, $lines line(s): $out"
echo "checkpoint-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
