#!/bin/bash
# gpu/check.sh: every check of the GPU backend in one call, on a machine with a GPU,
# within a fixed budget (GPU_CHECK_BUDGET, 420 s by default, the table included). One
# short table comes last, always: also when the build or a step fails or the budget
# runs out (a step the budget could not fit is a failure, "not run"). The full log goes
# to $OUT/gpu-check.log when OUT is set (else build/gpu-check.log), each step's output
# beside it.
#   0. the machine: nvidia-smi, the driver, nvcc, glibc; whether a GPU is seen
#   1. build GPU=1 (nvcc for sm_90), warnings not fatal (another gcc or CUDA may warn
#      where ours does not): OpenBLAS and Check from the system or from build/gpu-debs
#      (tools/fetch-gpu-debs prepares them on Debian; carry build/gpu-debs/debs), probed
#      first by a small program that must link and load; NCCL's and, when the toolkit
#      lacks them, cuBLAS's headers through a private include folder holding only those
#      (build/gpu-include), the libraries from the toolkit or PyTorch's nvidia packages
#   2. tests/test_gpu_host, test_gpu_ops (every op against the CPU op, the worst error
#      of each), test_gpu_strategies (collectives on GPU ranks, training vs the CPU)
#   3. chapters 1-5 on the GPU and on the CPU, same flags: each against its own
#      baseline (exit status), and the GPU run's losses against the CPU run's
#   4. bench_gpu (GPT-2 small, FP32 and TF32) and bench/pytorch_gpt2.py (PyTorch eager,
#      naive and fused attention), same GPU: ours / eager (target >= 1.0x) and ours /
#      fused (target >= 0.8x)
# A step that skips ("SKIP: ..." or exit 77) counts as FAILED when nvidia-smi or the
# driver sees a GPU: a GPU that CUDA cannot use is the failure. Without a GPU the same
# script is a dry run of the CPU path: it builds, the GPU suites and benchmarks skip,
# the chapters' "GPU" side runs with --device auto (= the CPU), and the table says so.
#   gpu/check.sh [--quick] [--self-test]
#     --quick      no benchmark
#     --self-test  checks this script's verdict and table rules on made-up inputs
#   O=name: build in build/cpu-gpu-name
set -u
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
quick=0
self_test=0
for arg in "$@"; do
    case $arg in
    --quick) quick=1 ;;
    --self-test) self_test=1 ;;
    *) echo "gpu/check.sh: unknown argument '$arg' (valid: --quick, --self-test)" >&2; exit 2 ;;
    esac
done
budget=${GPU_CHECK_BUDGET:-420}
case $budget in
'' | *[!0-9]*) echo "gpu/check.sh: GPU_CHECK_BUDGET '$budget' must be whole seconds (e.g. 420)" >&2; exit 2 ;;
esac
reserve=10    # seconds kept back for the table
t_begin=$(date +%s)
deadline=$((t_begin + budget))

rows=()       # the table: "what|result|detail"
notes=()      # lines printed under the table
failures=0

log() { printf '%s\n' "$*" >>"$log"; }
progress() { printf '%s\n' "$*"; log "$*"; }
row() {
    rows+=("$1|$2|$3")
    case $2 in ok | skipped | info) ;; *) failures=$((failures + 1)) ;; esac
}

# ---- verdicts and the table (pure functions of their inputs; see --self-test) ---------
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

print_table() {
    echo
    echo "== GPU check: ${gpu_name:-no GPU seen}; $(($(date +%s) - t_begin)) s of $budget s; log: $log"
    [ "${gpu_seen:-0}" = 1 ] ||
        echo "   (no GPU seen: a dry run of the CPU path; nothing ran on a GPU)"
    local r what result detail
    for r in "${rows[@]}"; do
        IFS='|' read -r what result detail <<<"$r"
        printf '%-40s %-8s %s\n' "$what" "$result" "$detail"
    done
    for r in "${notes[@]}"; do echo "    $r"; done
    echo "failures: $failures"
}

if [ $self_test = 1 ]; then   # before the log exists: a self-test leaves it alone
    . gpu/check_self_test.sh
    exit $?
fi

out_dir=${OUT:-$root/build}
mkdir -p "$out_dir" build
log=$out_dir/gpu-check.log
: >"$log"
export NCCL_DEBUG=WARN OPENBLAS_NUM_THREADS=1

finish() {
    trap - EXIT
    print_table | tee -a "$log"
    [ "$failures" -eq 0 ]
    exit $?
}
trap finish EXIT
trap 'row "gpu/check.sh" FAILED "stopped by a signal"; exit 1' INT TERM

# run LABEL SECONDS CMD...: output to $out_dir/LABEL.out and .err (and the log); the
# command's status back, 124 past its time, 200 when the budget has no room for it.
run() {
    local label=$1 limit=$2 t0 status left
    shift 2
    left=$((deadline - $(date +%s) - reserve))
    : >"$out_dir/$label.out"
    if [ "$left" -lt 5 ]; then
        progress "-- $label: not run (budget spent)"
        return 200
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    t0=$(date +%s)
    log "== $label (limit ${limit} s): $*"
    timeout -k 5 "$limit" "$@" >"$out_dir/$label.out" 2>"$out_dir/$label.err"
    status=$?
    cat "$out_dir/$label.out" "$out_dir/$label.err" >>"$log"
    progress "-- $label: exit $status ($(($(date +%s) - t0)) s)"
    return $status
}

# ---- 0. the machine --------------------------------------------------------------------
cuda=${CUDA_HOME:-/usr/local/cuda}
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
gpu_seen=0
if [ "$gpus" -gt 0 ]; then
    gpu_seen=1
elif ls /proc/driver/nvidia/gpus/* /dev/nvidia[0-9]* >/dev/null 2>&1; then
    gpu_seen=1 gpus=$(ls -d /proc/driver/nvidia/gpus/* 2>/dev/null | wc -l)
    gpu_name="a GPU the driver lists (nvidia-smi does not answer)"
fi
glibc=$(ldd --version 2>/dev/null | head -n 1 | grep -Eo '[0-9]+\.[0-9]+$')
progress "gpu/check.sh on ${gpu_name:-no GPU seen by nvidia-smi or the driver}; CUDA at $cuda;" \
    "glibc ${glibc:-?}; budget $budget s"
{
    nvidia-smi 2>&1 | head -n 15
    "$cuda/bin/nvcc" --version 2>&1 | tail -n 2
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
} >>"$log"
[ -x "$cuda/bin/nvcc" ] || { row "nvcc" FAILED "$cuda/bin/nvcc not found (set CUDA_HOME)"; exit 1; }

# ---- 1. build --------------------------------------------------------------------------
extra_cflags="-Wno-error" extra_ldflags="" check_libs="" ldpath=""

# OpenBLAS and Check: the machine's, or the .debs unpacked into build/gpu-debs/root
debs=build/gpu-debs
unpack_debs() {
    mkdir -p "$debs/root"
    for deb in "$debs"/debs/*.deb; do
        if command -v dpkg >/dev/null; then
            dpkg -x "$deb" "$debs/root"
        else   # a .deb is an ar archive holding data.tar.*
            python3 - "$deb" "$debs/root" <<'EOF'
import io, sys, tarfile
data, dest = open(sys.argv[1], "rb").read(), sys.argv[2]
pos = 8
while pos < len(data):
    name, size = data[pos:pos + 16].decode().strip(), int(data[pos + 48:pos + 58])
    body, pos = data[pos + 60:pos + 60 + size], pos + 60 + size + (size & 1)
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(dest)
EOF
        fi
    done
    touch "$debs/root/.complete"
}
blas_flags="$(pkg-config --cflags openblas 2>/dev/null)"
blas_libs="$(pkg-config --libs openblas 2>/dev/null)"
check_flags="$(pkg-config --cflags --libs check 2>/dev/null)"
if ! pkg-config --exists openblas check 2>/dev/null; then
    if [ ! -f "$debs/root/.complete" ] && ls "$debs"/debs/*.deb >/dev/null 2>&1; then
        unpack_debs
    fi
    if [ ! -f "$debs/root/.complete" ]; then
        row "OpenBLAS + Check" FAILED "none here and no $debs: run tools/fetch-gpu-debs on Debian, carry $debs/debs"
        exit 1
    fi
    r=$root/$debs/root
    lib=$r/usr/lib/x86_64-linux-gnu
    blas_flags="-I$r/usr/include/x86_64-linux-gnu/openblas-pthread"
    blas_libs="-L$lib/openblas-pthread -lopenblas"
    check_flags="-I$r/usr/include"
    check_libs="$lib/libcheck_pic.a $lib/libsubunit.a -lrt -lm -pthread"
    extra_cflags="$extra_cflags $blas_flags $check_flags"
    extra_ldflags="$blas_libs -L$lib -Wl,-rpath,$lib/openblas-pthread:$lib"   # -L: oneDNN
    ldpath="$lib/openblas-pthread:$lib"
    log "OpenBLAS and Check from $debs/root"
fi
export LD_LIBRARY_PATH="${ldpath}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The probe: a program that calls OpenBLAS and runs a Check suite must link and load
# here. Debian 12's libraries want glibc 2.36's symbols; an older system says so here.
probe=build/gpu-probe
mkdir -p "$probe"
cat >"$probe/probe.c" <<'EOF'
#include <cblas.h>
#include <check.h>
START_TEST(dot) { float x[2] = {1, 2}; ck_assert(cblas_sdot(2, x, 1, x, 1) == 5.0f); }
END_TEST
int main(void) {
    Suite *s = suite_create("probe");
    TCase *tc = tcase_create("probe");
    tcase_add_test(tc, dot);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}
EOF
# shellcheck disable=SC2086
if ! cc -pthread $blas_flags $check_flags "$probe/probe.c" -o "$probe/probe" $blas_libs \
    ${check_libs:-$check_flags} -lm >"$probe/out" 2>&1 || ! "$probe/probe" >>"$probe/out" 2>&1; then
    cat "$probe/out" >>"$log"
    missing=$(grep -Eo "(GLIBC|GLIBCXX)_[0-9.]+' not found|cannot find -l[A-Za-z0-9_]+|lib[A-Za-z0-9_.+-]+: cannot open shared object file|undefined reference to [^ ]+" "$probe/out" | sort -u | head -n 3 | tr '\n' ';')
    row "probe OpenBLAS + Check" FAILED "they do not link or load here (glibc ${glibc:-?}): ${missing:-see $log}"
    exit 1
fi
row "probe OpenBLAS + Check" ok "link and load (glibc ${glibc:-?})"

# NCCL and cuBLAS: the toolkit's, or PyTorch's pip packages (no unversioned .so there:
# links to the versioned ones go into build/gpu-links; their headers, and only those,
# into build/gpu-include, so that no other CUDA's headers come along)
pip_dirs=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for d, _, _ in os.walk(p):
        if d.endswith(("/lib", "/include")): print(d)' 2>/dev/null)
rm -rf build/gpu-links build/gpu-include
mkdir -p build/gpu-links build/gpu-include
for name in nccl cublas cublasLt cudart; do
    found=""
    for d in "$cuda/lib64" "$cuda/targets/x86_64-linux/lib" $pip_dirs; do
        f=$(ls "$d/lib$name.so" "$d"/lib"$name".so.[0-9]* 2>/dev/null | head -n 1)
        [ -n "$f" ] && { found=$f; break; }
    done
    if [ -z "$found" ]; then
        row "CUDA libraries" FAILED "lib$name not found in $cuda or PyTorch's nvidia packages"
        exit 1
    fi
    [ -e "$cuda/lib64/lib$name.so" ] && continue   # the Makefile links the toolkit's
    dir=$(dirname "$found")
    ln -sf "$found" "build/gpu-links/lib$name.so"
    extra_ldflags="$extra_ldflags -Wl,-rpath,$dir"
    export LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH"
    log "lib$name from $found"
done
extra_ldflags="-L$root/build/gpu-links $extra_ldflags"
for header in nccl.h cublas_v2.h; do
    [ -f "$cuda/include/$header" ] && continue
    for d in $pip_dirs; do
        [ -f "$d/$header" ] || continue
        if [ "$header" = nccl.h ]; then
            ln -sf "$d/nccl.h" build/gpu-include/
        else
            ln -sf "$d"/cublas*.h build/gpu-include/
        fi
        log "$header from $d"
        break
    done
done
extra_cflags="$extra_cflags -I$root/build/gpu-include"
export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:+$NVCC_APPEND_FLAGS }-I$root/build/gpu-include"

mkdir -p build && touch build/.deps-ok   # the packages are settled above, not by apt
make_args=(GPU=1 "CUDA_HOME=$cuda" "EXTRA_CFLAGS=$extra_cflags" "EXTRA_LDFLAGS=$extra_ldflags")
[ -n "$check_libs" ] && make_args+=("CHECK_LIBS=$check_libs")
[ -n "${O:-}" ] && make_args+=("O=$O")
bin=build/cpu-gpu${O:+-$O}
run build 240 make -j"$(nproc)" "${make_args[@]}" tests benches \
    "$bin/chapter1" "$bin/chapter2" "$bin/chapter3" "$bin/chapter4" "$bin/chapter5"
status=$?
verdict $status "$out_dir/build.out" 0
if [ "$verdict" != ok ]; then
    row "build GPU=1 (sm_90 + PTX)" FAILED "${why}: $(grep -m 1 -E 'error|Error' "$out_dir/build.err" | cut -c1-120)"
    tail -n 30 "$out_dir/build.err"
    row "suites, chapters, benchmarks" FAILED "not run: nothing was built"
    exit 1
fi
warnings=$(grep -c 'warning:' "$out_dir/build.err")
row "build GPU=1 (sm_90 + PTX)" ok "$bin: tests, benches, chapters 1-5 ($warnings compiler warnings)"

# ---- 2. test suites -----------------------------------------------------------------------
first_error() {   # " (the first error line)" of a step, or nothing
    local line
    line=$(grep -m 1 -iE 'error|fail' "$out_dir/$1.err" 2>/dev/null | cut -c1-140)
    [ -n "$line" ] && echo " ($line)"
}
for suite in test_gpu_host test_gpu_ops test_gpu_strategies; do
    limit=120
    [ $suite = test_gpu_host ] && limit=60
    run "$suite" $limit "$bin/tests/$suite"
    verdict $? "$out_dir/$suite.out" $([ $suite = test_gpu_host ] && echo 0 || echo $gpu_seen)
    detail=$(checks "$out_dir/$suite.out")
    [ -n "$why" ] && detail="${detail:+$detail; }$why"
    [ "$verdict" = FAILED ] && detail="$detail$(first_error "$suite")"
    if [ $suite = test_gpu_ops ] && grep -q '^WORST' "$out_dir/$suite.out"; then
        detail="$detail; worst rel error fp32 $(worst "$out_dir/$suite.out" fp32), tf32 $(worst "$out_dir/$suite.out" tf32)"
        while read -r line; do notes+=("$line"); done < <(grep '^WORST' "$out_dir/$suite.out")
    elif [ $suite = test_gpu_strategies ]; then
        w=$(grep -Eo 'grads \(rel\) [0-9.e+-]+' "$out_dir/$suite.out" | awk '{print $3}' | sort -g | tail -n 1)
        [ -n "$w" ] && detail="$detail; worst step-1 grads vs CPU baseline $w (rel)"
    fi
    row "$suite" "$verdict" "$detail"
done

# ---- 3. chapters: GPU against CPU ---------------------------------------------------------
compare_json() {   # GPU json, CPU json -> "loss gpu-cpu X; vs own baseline: ..."
    python3 - "$1" "$2" <<'EOF'
import json, sys
def load(path):   # the JSON object, whatever a library printed around it
    text = open(path).read()
    return json.JSONDecoder().raw_decode(text[text.index('{"chapter"'):])[0]
try:
    gpu, cpu = (load(p) for p in sys.argv[1:3])
except Exception as e:
    print(f"no JSON ({e.__class__.__name__})"); sys.exit(0)
cpu_runs = {r["strategy"]: r for r in cpu["runs"]}
loss_diff, own = 0.0, []
for r in gpu["runs"]:
    c = cpu_runs.get(r["strategy"])
    if c:
        loss_diff = max([loss_diff] + [abs(a - b) for a, b in zip(r["loss"], c["loss"])])
    if r["strategy"] != "baseline":
        d = r["diff_vs_baseline"]
        own.append(f"{r['strategy']} " + "/".join("-" if d[k] is None else f"{d[k]:.0e}"
                                                  for k in ("loss", "grads", "params")))
print(f"{gpu['device']}: max |loss - cpu| {loss_diff:.1e}; vs own baseline (loss/grads/params): "
      + ", ".join(own))
EOF
}
# Without a GPU the "GPU" side asks for auto: the CPU, through the same code.
gpu_device=cuda
[ $gpu_seen = 1 ] || gpu_device=auto
chapter() {   # label, ranks, program, flags...: exit 0 = within the chapter's tolerances
    local label=$1 ranks=$2 program=$3 result=ok how detail=""
    shift 3
    label=$label-$ranks
    run "$label-cpu" 60 "$bin/$program" --ranks "$ranks" --device cpu --json --steps 5 "$@"
    verdict $? "$out_dir/$label-cpu.out" 0
    [ "$verdict" = ok ] || { result=FAILED detail="cpu: $why$(first_error "$label-cpu"); "; }
    run "$label-gpu" 60 "$bin/$program" --ranks "$ranks" --device $gpu_device --json --steps 5 "$@"
    verdict $? "$out_dir/$label-gpu.out" 0
    [ "$verdict" = ok ] || { result=FAILED detail="$detail$gpu_device: $why$(first_error "$label-gpu"); "; }
    if [ "$ranks" -le "$gpus" ]; then how="nccl"; else how="threads, shared GPU"; fi
    [ $gpu_seen = 1 ] || how="no GPU: cpu twice"
    [ $result = ok ] && detail=$(compare_json "$out_dir/$label-gpu.out" "$out_dir/$label-cpu.out")
    row "$label ($how)" "$result" "${detail%; }"
}
chapter ch1-ddp 4 chapter1 --strategy ddp
chapter ch1-ddp 1 chapter1 --strategy ddp
chapter ch2-zero 4 chapter2
chapter ch2-zero 1 chapter2
chapter ch3-tp4 4 chapter3 --part train
chapter ch3-tp2-dp2 4 chapter3 --part train --tp 2
chapter ch4-1f1b 4 chapter4 --schedule 1f1b
chapter ch5-3d 8 chapter5

# ---- 4. benchmark: ours against PyTorch eager -------------------------------------------
if [ $quick = 0 ]; then
    for step in "bench_gpu|$bin/bench/bench_gpu --precision both" \
        "pytorch|python3 bench/pytorch_gpt2.py --precision both" \
        "pytorch-sdpa|python3 bench/pytorch_gpt2.py --precision both --sdpa"; do
        label=${step%%|*}
        # shellcheck disable=SC2086
        run "$label" 120 ${step#*|}
        verdict $? "$out_dir/$label.out" $gpu_seen
        [ "$verdict" = ok ] || row "$label" "$verdict" "$why"
        [ $label = bench_gpu ] && bench_verdict=$verdict
    done
    if [ "$bench_verdict" = ok ]; then
        while IFS='|' read -r precision result detail; do
            row "GPT-2 small step, $precision" "$result" "$detail"
        done < <(bench_lines "$out_dir/bench_gpu.out" "$out_dir/pytorch.out" "$out_dir/pytorch-sdpa.out")
    fi
fi
