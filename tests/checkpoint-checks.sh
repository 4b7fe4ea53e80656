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
# a kernel choice forced for this run (make test runs these checks under both) reaches
# every process
[ -n "${OPENBLAS_CORETYPE:-}" ] && mpirun_flags="$mpirun_flags -x OPENBLAS_CORETYPE"
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

# loss_gap FULL RESUMED STRATEGY [SAVED]: prints the gap; status 0 when the steps after
# SAVED (5 unless given) of FULL equal RESUMED's bit for bit
loss_gap() {
    "$python" - "$1" "$2" "$3" "${4:-5}" <<'PY'
import json, sys
runs = lambda p: {r["strategy"]: r["loss"] for r in json.load(open(p))["runs"]}
full, resumed = runs(sys.argv[1])[sys.argv[3]], runs(sys.argv[2])[sys.argv[3]]
saved = int(sys.argv[4])
d = max(abs(a - b) for a, b in zip(full[saved:], resumed)) if len(resumed) == len(full) - saved else float("inf")
print(f"steps {saved + 1}-{len(full)} of {sys.argv[3]}: {len(resumed)} losses, largest difference {d:g} (tolerance 0)")
sys.exit(0 if d == 0 else 1)
PY
}
same_losses() {   # same_losses NAME FULL RESUMED STRATEGY [SAVED]
    local out status
    out=$(loss_gap "$2" "$3" "$4" "${5:-5}")
    status=$?
    verdict "$1" $status "$out"
}

# within_tolerance NAME JSON [STEPS]: every strategy's difference from its (resumed)
# baseline, each having run STEPS steps (5 unless given)
within_tolerance() {
    local out status
    out=$("$python" - "$2" "${3:-5}" <<'PY'
import json, sys
tol = {"loss": 1e-5, "grads": 1e-6, "params": 1e-4}
runs, steps = json.load(open(sys.argv[1]))["runs"], int(sys.argv[2])
worst, text = 0.0, []
for r in runs:
    d = r["diff_vs_baseline"]
    text.append(f"{r['strategy']} steps {len(r['loss'])} loss {d['loss']:g} grads {d['grads']:g} params {d['params']:g}")
    worst = max([worst] + [d[k] / tol[k] for k in tol] + [0 if len(r["loss"]) == steps else 9])
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
# 5. mixed precision: a checkpoint holds the fp32 masters, the precision and fp16's loss
# scale. Saved at step 2 of 4 and resumed, the baseline, DDP and every ZeRO stage in
# bf16 end bit-identical, and so does fp16, whose loss scale continues from the
# checkpoint: 2^20 after the overflow forced at step 2, with 1 skipped step (started
# afresh, the resumed run would end at 2^21 with none).
mixed_pair() {   # mixed_pair TAG LAUNCHER... : 4 steps, 2 with --save, 4 with --resume
    local tag=$1
    shift
    "$@" $model --steps 4 >"$work/$tag-full.json" &&
        "$@" $model --steps 2 --save "$work/$tag" >"$work/$tag-a.json" 2>/dev/null &&
        "$@" $model --steps 4 --resume "$work/$tag" >"$work/$tag-b.json"
}
mixed_same() {   # mixed_same NAME TAG STRATEGY...: steps 3-4 bit for bit, each strategy
    local name=$1 tag=$2 strategy
    shift 2
    for strategy in "$@"; do
        same_losses "$name $strategy" "$work/$tag-full.json" "$work/$tag-b.json" "$strategy" 2
    done
}
# same_scale NAME FULL RESUMED STRATEGY: the final loss scale and skipped steps agree
same_scale() {
    local out status
    out=$("$python" - "$2" "$3" "$4" <<'PY'
import json, sys
runs = lambda p: {r["strategy"]: r for r in json.load(open(p))["runs"]}
got = [(runs(p)[sys.argv[3]]["loss_scale"], runs(p)[sys.argv[3]]["skipped_steps"]) for p in sys.argv[1:3]]
print(f"{sys.argv[3]} (loss scale, skipped steps): uninterrupted {got[0]}, resumed {got[1]}")
sys.exit(0 if got[0] == got[1] else 1)
PY
)
    status=$?
    verdict "$1" $status "$out"
}
mixed_checks() {   # mixed_checks BACKEND LAUNCHER...: bf16 stages $bf16_stages, fp16 stage 2
    local backend=$1 stage
    shift
    for stage in $bf16_stages; do
        if mixed_pair "$backend-bf16-z$stage" "$@" --stage $stage --precision bf16; then
            mixed_same "bf16 x2 resumed ($backend):" "$backend-bf16-z$stage" zero$stage \
                $([ $stage = 0 ] && echo baseline)
        else
            verdict "bf16 zero$stage x2 save and resume ($backend)" 1 "a run failed"
        fi
    done
    if mixed_pair "$backend-fp16" "$@" --stage 2 $fp16_flags; then
        mixed_same "fp16 x2 resumed ($backend):" "$backend-fp16" baseline zero2
        same_scale "fp16 zero2 x2 resumed, its loss scale ($backend)" "$work/$backend-fp16-full.json" \
            "$work/$backend-fp16-b.json" zero2
    else
        verdict "fp16 zero2 x2 save and resume ($backend)" 1 "a run failed"
    fi
}
fp16_flags="--precision fp16 --loss-scale 2097152 --test-overflow-step 2"
bf16_stages="0 1 2 3"   # the checks below read the threads' stage 1 and 3 checkpoints
mixed_checks threads "$build"/chapter2 --ranks 2
if mixed_pair bf16-ddp "$build"/chapter1 --ranks 2 --strategy ddp --precision bf16; then
    mixed_same "bf16 x2 resumed (threads):" bf16-ddp ddp
else
    verdict "bf16 ddp x2 save and resume (threads)" 1 "a run failed"
fi
if "$build"/chapter2 --ranks 3 --stage 1 --precision bf16 $model --steps 4 \
    --resume "$work/threads-bf16-z3" >"$work/bf16-across.json"; then
    within_tolerance "bf16 zero3 x2 -> zero1 x3" "$work/bf16-across.json" 2
else
    verdict "bf16 zero3 x2 -> zero1 x3" 1 "exit status non-zero"
fi
if [ -n "$mpi_build" ] && [ -x "$mpi_build/chapter2" ]; then
    # MPI_BF16_STAGES: fewer, where a second pass needs only some (make test's under
    # OpenBLAS's other kernels, which bf16's products do not run on)
    bf16_stages=${MPI_BF16_STAGES:-0 1 2 3}
    mixed_checks "Open MPI" mpirun $mpirun_flags -np 2 "$mpi_build"/chapter2
fi

# 6. across precisions (the masters are fp32 either way): an fp32 checkpoint resumes a
# bf16 run and a bf16 one an fp32 run; steps 3-4 stay as close to the uninterrupted run
# in the new precision as the two precisions' uninterrupted runs are to each other over
# steps 1-4 (the band); a resumed run with another --lr leaves the band.
# band_check NAME TARGET_FULL OTHER_FULL RESUMED: zero1's losses
band_check() {
    "$python" - "$2" "$3" "$4" zero1 <<'PY'
import json, sys
runs = lambda p: {r["strategy"]: r["loss"] for r in json.load(open(p))["runs"]}
target, other, resumed = (runs(p)[sys.argv[4]] for p in sys.argv[1:4])
band = max(abs(a - b) for a, b in zip(target, other))
d = max(abs(a - b) for a, b in zip(target[2:], resumed)) if len(resumed) == 2 else float("inf")
print(f"steps 3-4 {d:.3g} from the uninterrupted run, band {band:.3g} (bf16 vs fp32, steps 1-4)")
sys.exit(0 if d <= band else 1)
PY
}
stage1="--ranks 2 --stage 1"
if mixed_pair fp32-z1 "$build"/chapter2 $stage1 &&
    "$build"/chapter2 $stage1 --precision bf16 $model --steps 4 --resume "$work/fp32-z1" \
        >"$work/to-bf16.json" &&
    "$build"/chapter2 $stage1 $model --steps 4 --resume "$work/threads-bf16-z1" \
        >"$work/to-fp32.json" &&
    "$build"/chapter2 $stage1 --precision bf16 $model --steps 4 --resume "$work/fp32-z1" \
        --lr 2e-3 >"$work/to-bf16-lr.json"; then
    full16="$work/threads-bf16-z1-full.json" full32="$work/fp32-z1-full.json"
    out=$(band_check x "$full16" "$full32" "$work/to-bf16.json")
    verdict "fp32 checkpoint -> bf16 run" $? "$out"
    out=$(band_check x "$full32" "$full16" "$work/to-fp32.json")
    verdict "bf16 checkpoint -> fp32 run" $? "$out"
    if out=$(band_check x "$full16" "$full32" "$work/to-bf16-lr.json"); then
        verdict "negative control: fp32 -> bf16 with --lr 2e-3" 1 "passed: $out"
    else
        verdict "negative control: fp32 -> bf16 with --lr 2e-3 fails as it must" 0 "$out"
    fi
else
    verdict "resume across precisions" 1 "a run failed"
fi
# the line a resumed run starts with names the checkpoint's precision and the scale
line=$("$build"/chapter2 --ranks 2 --stage 2 $fp16_flags ${model/--quiet/} --steps 4 \
    --resume "$work/threads-fp16" 2>&1 >/dev/null | grep -m1 'resumed from')
verdict "resumed line (fp16)" $(printf '%s' "$line" | grep -q 'at step 2, saved in fp16; loss scale 1048576 restored (0 clean, 1 skipped steps)'; echo $?) "$line"
line=$("$build"/chapter2 $stage1 ${model/--quiet/} --steps 4 --resume "$work/threads-bf16-z1" \
    2>&1 >/dev/null | grep -m1 'resumed from')
verdict "resumed line (bf16 into fp32)" $(printf '%s' "$line" | grep -q 'at step 2, saved in bf16$'; echo $?) "$line"
# an FP8 checkpoint names its recipe; a resume in another recipe (or precision) warns in
# one line, the same recipe does not
"$build"/baseline $model --steps 2 --precision fp8 --fp8-recipe tensorwise --save "$work/fp8" \
    >/dev/null 2>&1
line=$("$build"/baseline ${model/--quiet/} --steps 3 --resume "$work/fp8" --precision fp8 \
    --fp8-recipe tensorwise 2>&1 >/dev/null | grep 'checkpoint:' | tr '\n' ' ')
verdict "resumed line (fp8 tensorwise into the same)" $(printf '%s' "$line" | grep -q 'saved in fp8 (tensorwise, e4m3) $'; echo $?) "$line"
line=$("$build"/baseline ${model/--quiet/} --steps 3 --resume "$work/fp8" --precision bf16 \
    2>&1 >/dev/null | grep 'checkpoint: warning')
verdict "resumed line (fp8 tensorwise into bf16 warns)" $(printf '%s' "$line" | grep -q 'saved in fp8 tensorwise e4m3, resumed in bf16: the weights carry over, the FP8 scales start afresh$'; echo $?) "$line"
# the format is recorded next to the recipe: hybrid resumed in e4m3 warns
"$build"/baseline $model --steps 2 --precision fp8 --fp8-recipe tensorwise --fp8-format hybrid \
    --save "$work/fp8-hybrid" >/dev/null 2>&1
line=$("$build"/baseline ${model/--quiet/} --steps 3 --resume "$work/fp8-hybrid" --precision fp8 \
    --fp8-recipe tensorwise 2>&1 >/dev/null | grep 'checkpoint: warning')
verdict "resumed line (fp8 hybrid into e4m3 warns)" $(printf '%s' "$line" | grep -q 'saved in fp8 tensorwise hybrid, resumed in fp8 tensorwise e4m3: the weights carry over, the FP8 scales start afresh$'; echo $?) "$line"
# --resume DIR --save DIR: chapter 1's dp and ddp each resume from their own checkpoint
# (DIR/latest-dp, DIR/latest-ddp), the baseline from the one DIR/latest named at the
# start, although each save moves DIR/latest on
"$build"/chapter1 --ranks 2 $model --steps 2 --save "$work/same-dir" >/dev/null 2>&1
expected=$(for s in latest latest-dp latest-ddp; do
               echo "resumed from $work/same-dir/$(cat "$work/same-dir/$s") at step 2"
           done | sort)
out=$("$build"/chapter1 --ranks 2 ${model/--quiet/} --steps 4 --resume "$work/same-dir" \
    --save "$work/same-dir" 2>&1 >"$work/same-dir.json" | grep -o 'resumed from .* at step [0-9]*' | sort)
verdict "--resume and --save one directory: dp and ddp from their own checkpoints, the baseline from latest" \
    $([ "$out" = "$expected" ] && [ "$(printf '%s\n' "$out" | sort -u | wc -l)" -eq 2 ]; echo $?) \
    "$(echo $out | sed "s|$work/||g")"
# ... and a damaged checkpoint that only a strategy's own pointer names (dp's or ddp's,
# whichever saved first) is refused before any rank starts, as DIR/latest's would be
"$build"/chapter1 --ranks 2 $model --steps 2 --save "$work/own-bad" >/dev/null 2>&1
own_only=$(cat "$work/own-bad/latest-dp" "$work/own-bad/latest-ddp" | grep -vx "$(cat "$work/own-bad/latest")")
damaged=$work/own-bad/$own_only/rank-00000.safetensors
printf 'X' | dd of="$damaged" bs=1 seek=100 conv=notrunc status=none
out=$("$build"/chapter1 --ranks 2 $model --steps 4 --resume "$work/own-bad" 2>&1 >/dev/null)
status=$?
verdict "--resume DIR with a checkpoint only latest-STRATEGY names damaged: refused, the file named" \
    $([ $status -eq 2 ] && printf '%s' "$out" | grep -q "$damaged: CRC-32"; echo $?) \
    "exit $status: $(echo $out | sed "s|$work/||g")"
echo "checkpoint-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
