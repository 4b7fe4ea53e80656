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
#      of each), test_gpu_mixed (every 16-bit op, bf16 and fp16, against the CPU's),
#      test_gpu_strategies (collectives on GPU ranks, training vs the CPU)
#   3. every chapter on the one GPU and on the CPU, same flags, in fp32 and bf16: each
#      against its own baseline (exit status), and the GPU run's losses against the CPU
#      run's within tolerances.h's loss tolerance; a part that does not run on a GPU
#      yet must refuse --device cuda in one line (and run on the CPU)
#   4. the bench256 and GPT-2 small (124M) steps in fp32, TF32 and bf16 next to
#      cuBLAS's floor for the same products (bench/bench_gpu_gemms); then bench_gpu
#      against PyTorch eager and fused (bench/pytorch_gpt2.py) as the budget allows
# A step that skips ("SKIP: ..." or exit 77) counts as FAILED when nvidia-smi or the
# driver sees a GPU: a GPU that CUDA cannot use is the failure. Without a GPU the same
# script is a dry run of the CPU path: it builds, the GPU suites and benchmarks skip,
# the chapters' "GPU" side runs with --device auto (= the CPU), and the table says so.
#   gpu/check.sh [--quick] [--times] [--dry-run] [--self-test]
#     --quick      no step times, no benchmark
#     --times      the build, then the step times and the benchmark alone (steps 0, 1, 4)
#     --dry-run    prints every step it would run (as a GPU machine would), runs none
#     --self-test  checks this script's verdict and table rules on made-up inputs
#   O=name: build in build/cpu-gpu-name
set -u
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
quick=0
times_only=0
self_test=0
dry_run=0
for arg in "$@"; do
    case $arg in
    --quick) quick=1 ;;
    --times) times_only=1 ;;
    --dry-run) dry_run=1 ;;
    --self-test) self_test=1 ;;
    *) echo "gpu/check.sh: unknown argument '$arg' (valid: --quick, --times, --dry-run, --self-test)" >&2; exit 2 ;;
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

. gpu/check_lib.sh   # the verdicts and the other rules (checked by --self-test)

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
[ $dry_run = 1 ] && out_dir=$(mktemp -d)   # nothing of a dry run is kept
mkdir -p "$out_dir" build
log=$out_dir/gpu-check.log
: >"$log"
export NCCL_DEBUG=WARN OPENBLAS_NUM_THREADS=1

finish() {
    trap - EXIT
    if [ $dry_run = 1 ]; then
        rm -rf "$out_dir"
        echo "dry run: the steps above, as on a machine with one GPU; nothing ran"
        exit 0
    fi
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
    if [ $dry_run = 1 ]; then
        printf '%-28s %3s s  %s\n' "$label" "$limit" "$*"
        return 0
    fi
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

# Sections 0 and 1 look at this machine and prepare the build; a dry run skips them and
# lists the steps as they would run with one GPU seen.
cuda=${CUDA_HOME:-/usr/local/cuda}
make_args=(GPU=1 "CUDA_HOME=$cuda")
gpu_seen=1 gpus=1
if [ $dry_run = 0 ]; then
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
fi   # sections 0 and 1's probes
bin=build/cpu-gpu${O:+-$O}
# every program by file name: the baseline and each chapter with a main.c (11, 12, ...
# as they come); `make all` would point ./run at this build
programs=()
for d in chapters/[0-9]*/; do
    [ -f "$d/main.c" ] || continue
    n=${d#chapters/} && n=$((10#${n%%-*}))
    if [ "$n" = 0 ]; then programs+=(baseline); else programs+=("chapter$n"); fi
done
run build 240 make -j"$(nproc)" "${make_args[@]}" tests benches "${programs[@]/#/$bin/}"
status=$?
[ $dry_run = 1 ] || verdict $status "$out_dir/build.out" 0
if [ $dry_run = 1 ]; then :
elif [ "$verdict" != ok ]; then
    row "build GPU=1 (sm_90 + PTX)" FAILED "${why}: $(grep -m 1 -E 'error|Error' "$out_dir/build.err" | cut -c1-120)"
    tail -n 30 "$out_dir/build.err"
    row "suites, chapters, benchmarks" FAILED "not run: nothing was built"
    exit 1
fi
[ $dry_run = 1 ] || warnings=$(grep -c 'warning:' "$out_dir/build.err")
[ $dry_run = 1 ] || row "build GPU=1 (sm_90 + PTX)" ok "$bin: tests, benches, ${programs[*]} ($warnings compiler warnings)"

# ---- 2. test suites -----------------------------------------------------------------------
first_error() {   # " (the first error line)" of a step, or nothing
    local line
    line=$(grep -m 1 -iE 'error|fail' "$out_dir/$1.err" 2>/dev/null | cut -c1-140)
    [ -n "$line" ] && echo " ($line)"
}
gpu_device=cuda
[ $gpu_seen = 1 ] || gpu_device=auto   # without a GPU: the CPU, through the same code
if [ $times_only = 0 ]; then   # sections 2 and 3
for suite in test_gpu_host test_gpu_ops test_gpu_mixed test_gpu_strategies; do
    limit=120
    [ $suite = test_gpu_host ] && limit=60
    run "$suite" $limit "$bin/tests/$suite"
    st=$?
    [ $dry_run = 1 ] && continue
    verdict $st "$out_dir/$suite.out" $([ $suite = test_gpu_host ] && echo 0 || echo $gpu_seen)
    detail=$(checks "$out_dir/$suite.out")
    [ -n "$why" ] && detail="${detail:+$detail; }$why"
    [ "$verdict" = FAILED ] && detail="$detail$(first_error "$suite")"
    if [ $suite = test_gpu_ops ] && grep -q '^WORST' "$out_dir/$suite.out"; then
        detail="$detail; worst rel error fp32 $(worst "$out_dir/$suite.out" fp32), tf32 $(worst "$out_dir/$suite.out" tf32)"
        while read -r line; do notes+=("$line"); done < <(grep '^WORST' "$out_dir/$suite.out")
    elif [ $suite = test_gpu_mixed ] && grep -q '^WORST' "$out_dir/$suite.out"; then
        detail="$detail; worst rel error bf16 $(worst "$out_dir/$suite.out" bf16), fp16 $(worst "$out_dir/$suite.out" fp16)"
        while read -r line; do notes+=("$line"); done < <(grep '^WORST' "$out_dir/$suite.out")
    elif [ $suite = test_gpu_strategies ]; then
        w=$(grep -Eo 'grads \(rel\) [0-9.e+-]+' "$out_dir/$suite.out" | awk '{print $3}' | sort -g | tail -n 1)
        [ -n "$w" ] && detail="$detail; worst step-1 grads vs CPU baseline $w (rel)"
    fi
    row "$suite" "$verdict" "$detail"
done

# ---- 3. chapters: GPU against CPU, fp32 and bf16 ----------------------------------------
# Each case runs on the CPU and on the GPU at once (the CPU run on the cores, the GPU run
# on the GPU), same flags, --json; each run's exit status is its chapter's verdict
# against its own baseline, and the GPU run's losses must match the CPU run's within
# the project's loss tolerance for its precision (common/train/tolerances.h: TOL_LOSS
# in fp32, MIXED_TOL_LOSS in 16 bits). Two ranks on the one GPU share it (threads over
# a shared GPU); one rank on it is NCCL's world of one.
tol_of() { grep -Eo "^#define $1 [0-9.e+-]+" common/train/tolerances.h | awk '{print $3}'; }
tol_fp32=$(tol_of TOL_LOSS)
tol_16=$(tol_of MIXED_TOL_LOSS)
steps=3
chapter() {   # label, ranks, program, precision (- : the chapter runs its own), flags...
    local label=$1 ranks=$2 program=$3 precision=$4 result=ok how detail="" tol pcs gs cs
    shift 4
    local pflag=()
    tol=$tol_16
    if [ "$precision" != - ]; then
        pflag=(--precision "$precision")
        [ "$precision" = fp32 ] && tol=$tol_fp32
        label=$label-$precision
    fi
    label=$label-$ranks
    if [ $dry_run = 1 ]; then
        run "$label-cpu" 90 "$bin/$program" --ranks "$ranks" --device cpu --json "$@" "${pflag[@]}"
        run "$label-gpu" 90 "$bin/$program" --ranks "$ranks" --device $gpu_device --json "$@" "${pflag[@]}"
        return
    fi
    run "$label-cpu" 90 "$bin/$program" --ranks "$ranks" --device cpu --json "$@" "${pflag[@]}" &
    pcs=$!
    run "$label-gpu" 90 "$bin/$program" --ranks "$ranks" --device $gpu_device --json "$@" "${pflag[@]}"
    gs=$?
    wait $pcs
    cs=$?
    verdict $cs "$out_dir/$label-cpu.out" 0
    [ "$verdict" = ok ] || { result=FAILED detail="cpu: $why$(first_error "$label-cpu"); "; }
    verdict $gs "$out_dir/$label-gpu.out" 0
    [ "$verdict" = ok ] || { result=FAILED detail="$detail$gpu_device: $why$(first_error "$label-gpu"); "; }
    if [ "$ranks" -le "${gpus:-0}" ]; then how="nccl"; else how="threads, shared GPU"; fi
    [ $gpu_seen = 1 ] || how="no GPU: cpu twice"
    if [ $result = ok ]; then
        detail=$(compare_losses "$out_dir/$label-gpu.out" "$out_dir/$label-cpu.out" "$tol" \
            "$([ $gpu_seen = 1 ] && echo cuda || echo cpu)")
        [ $? = 0 ] || result=FAILED
    fi
    row "$label ($how)" "$result" "${detail%; }"
}
# refused LABEL RANKS PROGRAM FLAGS...: a part that does not run on a GPU yet must say
# so in one line (exit 2) with --device cuda; it still runs on the CPU.
refused() {
    local label=$1 ranks=$2 program=$3 result=ok detail lines
    shift 3
    run "$label-cuda" 30 "$bin/$program" --ranks "$ranks" --device cuda "$@"
    local status=$?
    run "$label-cpu" 90 "$bin/$program" --ranks "$ranks" --device cpu "$@"
    local cpu_status=$?
    [ $dry_run = 1 ] && return
    lines=$(grep -c . "$out_dir/$label-cuda.err")
    detail="--device cuda: exit $status, $lines line: $(head -n 1 "$out_dir/$label-cuda.err" | cut -c1-110)"
    if [ $gpu_seen = 1 ] && { [ $status != 2 ] || [ "$lines" != 1 ] ||
        ! grep -q -- '--device cuda' "$out_dir/$label-cuda.err"; }; then
        result=FAILED
    fi
    [ $cpu_status = 0 ] || { result=FAILED detail="$detail; cpu: exit $cpu_status"; }
    row "$label (refused on cuda)" "$result" "$detail"
}
for precision in fp32 bf16; do
    chapter baseline 1 baseline $precision --steps $steps
    chapter ch1-ddp 1 chapter1 $precision --strategy ddp --steps $steps
    chapter ch1-ddp 2 chapter1 $precision --strategy ddp --steps $steps
    chapter ch2-zero 2 chapter2 $precision --steps $steps
    chapter ch3-tp 2 chapter3 $precision --part train --steps $steps
    chapter ch4-1f1b 2 chapter4 $precision --schedule 1f1b --steps $steps
    chapter ch5-3d 2 chapter5 $precision --steps $steps
    chapter ch9-sp 2 chapter9 $precision --part sp --steps $steps
done
chapter ch7-strategies 2 chapter7 fp32 --part strategies --steps 2   # fp32 alone so far
chapter ch8-wire 2 chapter8 - --part wire --wire-steps $steps   # fp32, bf16 and fp16 itself
refused ch9-context 2 chapter9 --json --part context --steps $steps
refused ch10-moe 2 chapter10 --json --part ep --steps $steps
# chapter 12 prints the tables of many runs (no JSON of one): held to its exit status
refused ch12 4 chapter12 --steps $steps
# the planner trains nothing (no --device): it runs, in the GPU build
run ch6-planner 60 "$bin/chapter6" --json
status=$?
if [ $dry_run = 0 ]; then
    verdict $status "$out_dir/ch6-planner.out" 0
    row "ch6-planner (trains nothing)" "$verdict" "$why"
fi
# chapters added later (11, 12, ...): run as they are, on the GPU, against their baseline
for n in "${programs[@]}"; do
    case $n in chapter[0-9] | chapter10 | chapter12 | baseline) continue ;; esac
    chapter "${n/chapter/ch}" 2 "$n" fp32 --steps $steps
    chapter "${n/chapter/ch}" 2 "$n" bf16 --steps $steps
done
fi   # sections 2 and 3

# ---- 4. step times next to cuBLAS's floor; then PyTorch ---------------------------------
# bench256 and GPT-2 small (124M), one training step of the baseline on one GPU in fp32,
# TF32 and bf16 (its --json ms_per_step), next to the sum of the same step's products
# timed alone (bench_gpu_gemms), in the same precision.
gpt2_small=(--layers 12 --heads 12 --dim 768 --ctx 1024 --vocab 50304 --batch 8)
if [ $quick = 0 ] && [ $gpu_seen = 0 ]; then   # the CPU would time nothing of the GPU's
    row "step times, benchmark" skipped "no GPU seen"
elif [ $quick = 0 ]; then
    for model in bench256 gpt2-small; do
        if [ $model = bench256 ]; then flags=(--preset bench256) step_count=20
        else flags=("${gpt2_small[@]}") step_count=6; fi
        run "floor-$model" 60 "$bin/bench/bench_gpu_gemms" "${flags[@]}" --label $model
        for precision in fp32 tf32 bf16; do
            case $precision in
            fp32) pflags=() ;; tf32) pflags=(--tf32) ;; bf16) pflags=(--precision bf16) ;;
            esac
            run "step-$model-$precision" 90 "$bin/baseline" --device $gpu_device --json --quiet \
                --steps $step_count "${flags[@]}" "${pflags[@]}"
            st=$?
            [ $dry_run = 1 ] && continue
            verdict $st "$out_dir/step-$model-$precision.out" 0
            if [ "$verdict" != ok ]; then
                row "step $model $precision" FAILED "$why$(first_error "step-$model-$precision")"
                continue
            fi
            IFS='|' read -r what result detail < <(floor_line $model $precision \
                "$out_dir/step-$model-$precision.out" "$out_dir/floor-$model.out")
            row "$what" "$result" "$detail"
        done
    done
    # PyTorch eager against ours, GPT-2 small fp32 and TF32, as the budget allows
    for step in "bench_gpu|$bin/bench/bench_gpu --math both" \
        "pytorch|python3 bench/pytorch_gpt2.py --precision both" \
        "pytorch-sdpa|python3 bench/pytorch_gpt2.py --precision both --sdpa"; do
        label=${step%%|*}
        # shellcheck disable=SC2086
        run "$label" 120 ${step#*|}
        st=$?
        [ $dry_run = 1 ] && continue
        verdict $st "$out_dir/$label.out" $gpu_seen
        [ "$verdict" = ok ] || row "$label" "$verdict" "$why"
        [ $label = bench_gpu ] && bench_verdict=$verdict
    done
    if [ $dry_run = 0 ] && [ "$bench_verdict" = ok ]; then
        while IFS='|' read -r precision result detail; do
            row "GPT-2 small step vs PyTorch, $precision" "$result" "$detail"
        done < <(bench_lines "$out_dir/bench_gpu.out" "$out_dir/pytorch.out" "$out_dir/pytorch-sdpa.out")
    fi
fi
