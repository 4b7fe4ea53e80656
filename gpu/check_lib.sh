# shellcheck shell=bash disable=SC2034,SC2154  # sourced: its results are the caller's globals
# gpu/check_lib.sh: gpu/check.sh's rules, pure functions of their inputs (files and
# arguments), sourced by check.sh and by its self-test (gpu/check_self_test.sh), which
# checks each on made-up inputs.
# verdict STATUS OUTPUT_FILE GPU_SEEN: sets $verdict (ok, skipped, FAILED) and $why.
# STATUS 200 means the step was not run for lack of budget.
verdict() {
    local status=$1 file=$2 seen=$3 skip_line
    skip_line=$(grep -m 1 '^SKIP:' "$file" 2>/dev/null)
    why=""
    if [ "$status" -eq 200 ]; then
        verdict=FAILED why="not run: the ${budget} s budget was spent"
    elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        verdict=FAILED why="timed out"
    elif [ "$status" -eq 77 ] || { [ "$status" -eq 0 ] && [ -n "$skip_line" ]; }; then
        why=${skip_line#SKIP: }
        if [ "$seen" = 1 ]; then
            verdict=FAILED why="skipped although a GPU is seen: ${why:-exit 77}"
        else
            verdict=skipped
        fi
    elif [ "$status" -eq 0 ]; then
        verdict=ok
    else
        verdict=FAILED why="exit $status"
    fi
}

checks() {   # "N/M checks" from Check's summary line
    grep -Eo 'Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$1" | tail -n 1 |
        awk -F'[:, ]+' '{printf "%d/%d checks", $2 - $4 - $6, $2}'
}

# worst FILE PRECISION: the largest error of test_gpu_ops' "WORST <op> <precision> rel
# E  (tol T)" lines of that precision, and the largest tolerance: "E (tol T)".
worst() {
    grep "^WORST [^ ]* $2 " "$1" | tr -d '()' |
        awk '{ if ($5 + 0 > w) w = $5 + 0; if ($7 + 0 > t) t = $7 + 0 }
             END { if (NR) printf "%.2e (tol %.0e)", w, t }'
}

# bench_lines RESULT_FILES...: one line per precision: ours against eager and fused.
bench_lines() {
    local results precision ours eager fused
    results=$(cat "$@" 2>/dev/null | grep '^RESULT')
    value() { echo "$results" | grep "impl=$1 precision=$2 " | grep -Eo "$3=[0-9.]+" | cut -d= -f2; }
    ratio() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN {r = a / b; v = (r >= t) ? "ok" : ("BELOW " t "x"); printf "%.2fx (%s)", r, v}'; }
    for precision in fp32 tf32; do
        ours=$(value c $precision tokens_per_s)
        eager=$(value pytorch $precision tokens_per_s)
        fused=$(value pytorch-sdpa $precision tokens_per_s)
        [ -n "$ours" ] || { echo "$precision|FAILED|no result from bench_gpu"; continue; }
        printf '%s|info|ours %s tok/s (%s ms/step, %s TFLOP/s); / eager %s; / fused %s\n' \
            "$precision" "$ours" "$(value c $precision ms)" "$(value c $precision tflops)" \
            "$([ -n "$eager" ] && ratio "$ours" "$eager" 1.0 || echo -)" \
            "$([ -n "$fused" ] && ratio "$ours" "$fused" 0.8 || echo -)"
    done
}

# compare_losses GPU_OUT CPU_OUT TOL WANT_DEVICE: every "loss" (a list of per-step
# losses, or one number) and "final_loss" (chapter 8) in the two runs' JSON, matched by where it stands (the runs'
# strategies name their places), the largest |gpu - cpu| against TOL; the GPU run's
# "device" must be WANT_DEVICE (a run that fell back to the CPU is a failure). Prints
# one line; status 0 within TOL (or, with no losses, the runs' own differences or exit
# status alone), 1 over it (or the wrong device), 2 no JSON to compare.
compare_losses() {
    python3 - "$@" <<'PY'
import json, sys
def load(path):
    text = open(path, errors="replace").read()
    start = text.find('{"chapter"')
    if start < 0:
        raise ValueError("no JSON object")
    return json.JSONDecoder().raw_decode(text[start:])[0]
def walk(node, path, losses, own):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("loss", "final_loss") and isinstance(v, (int, float)):
                losses[f"{path}/{k}"] = [v]
            elif k == "loss" and isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
                losses[f"{path}/{k}"] = v
            elif k == "diff_vs_baseline" and isinstance(v, dict):
                own.append(v)
            else:
                walk(v, f"{path}/{k}", losses, own)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            name = v.get("strategy", i) if isinstance(v, dict) else i
            walk(v, f"{path}[{name}]", losses, own)
gpu_path, cpu_path, tol, want = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
try:
    gpu, cpu = load(gpu_path), load(cpu_path)
except Exception as e:
    print(f"nothing to compare ({e})"); sys.exit(2)
g, c, own = {}, {}, []
walk(gpu, "", g, own)
walk(cpu, "", c, [])
device = gpu.get("device")
if device is not None and device != want:
    print(f"ran on {device}, not {want}"); sys.exit(1)
common = [k for k in g if k in c]
worst_own = max((d.get("grads") or 0 for d in own), default=None)
if not common and worst_own is None:   # timings alone (chapter 7's links): its verdict
    print("its JSON reports no losses: its exit status alone"); sys.exit(0)
if not common:   # a chapter that reports its runs' differences only (chapter 9's sp)
    print(f"no losses in the JSON: against its own baseline alone, step-1 grads <= {worst_own:.1e}")
    sys.exit(0)
diff = max(abs(a - b) for k in common for a, b in zip(g[k], c[k]))
line = f"max |loss gpu - cpu| {diff:.1e} (tol {tol:.0e}) over {len(common)} runs"
if worst_own is not None:
    line += f"; step-1 grads vs own baseline <= {worst_own:.1e}"
print(line)
sys.exit(0 if diff <= tol else 1)
PY
}

# floor_line LABEL PRECISION STEP_OUT FLOOR_OUT: "LABEL PRECISION|result|detail" for the
# step-time table: the step's ms_per_step (its --json) next to cuBLAS's floor under it
# (bench_gpu_gemms' RESULT line of that label and precision) and their ratio.
floor_line() {
    local label=$1 precision=$2 ms floor
    ms=$(grep -Eo '"ms_per_step": [0-9.]+' "$3" 2>/dev/null | head -n 1 | awk '{print $2}')
    floor=$(grep "^RESULT impl=gemm-floor label=$label precision=$precision " "$4" 2>/dev/null |
        grep -Eo 'ms=[0-9.]+' | cut -d= -f2)
    if [ -z "$ms" ]; then
        echo "step $label $precision|FAILED|no ms_per_step from the run"
    elif [ -z "$floor" ]; then
        echo "step $label $precision|info|$ms ms/step; no cuBLAS floor measured"
    else
        awk -v l="$label" -v p="$precision" -v ms="$ms" -v f="$floor" 'BEGIN {
            printf "step %s %s|info|%.2f ms/step; cuBLAS products alone %.2f ms (%.1fx the floor)\n",
                   l, p, ms, f, ms / f }'
    fi
}
