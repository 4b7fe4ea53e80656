#!/bin/bash
# gpu/check.sh: every check of the GPU backend in one call, on a machine with a GPU
# (about 5-8 minutes on one H200). One short table comes last; the full log goes to
# $OUT/gpu-check.log when OUT is set (else build/gpu-check.log), with the chapters'
# JSON beside it.
#   1. build GPU=1 (nvcc for sm_90): OpenBLAS and Check from build/gpu-debs when the
#      machine has no Debian packages (tools/fetch-gpu-debs prepares them on Debian;
#      carry build/gpu-debs/debs), NCCL and cuBLAS from the CUDA toolkit or, failing
#      that, PyTorch's nvidia pip packages
#   2. tests/test_gpu_ops (every op against the CPU op) and tests/test_gpu_strategies
#      (collectives on GPU ranks, data-parallel training against the CPU baseline)
#   3. chapters 1-3 on the GPU and on the CPU, same flags: each against its own
#      baseline (exit status), and the GPU run's losses against the CPU run's
#   4. bench_gpu (GPT-2 small, FP32 and TF32) and bench/pytorch_gpt2.py (PyTorch eager,
#      the same model) on the same GPU
#   gpu/check.sh [--quick]    (--quick: no benchmark; O=name: build in build/cpu-gpu-name)
set -u
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
quick=0
[ "${1:-}" = --quick ] && quick=1
out_dir=${OUT:-$root/build}
mkdir -p "$out_dir" build
log=$out_dir/gpu-check.log
: >"$log"
t_begin=$(date +%s)
rows=()       # the final table: "what|result|detail"
failures=0

log() { printf '%s\n' "$*" >>"$log"; }
progress() { printf '%s\n' "$*"; log "$*"; }
row() {
    rows+=("$1|$2|$3")
    [ "$2" = ok ] || [ "$2" = skipped ] || failures=$((failures + 1))
}
# run LABEL SECONDS CMD...: output to the log (and to $out_dir/LABEL.out); status back
run() {
    local label=$1 limit=$2 t0 status
    shift 2
    t0=$(date +%s)
    log "== $label: $*"
    timeout "$limit" "$@" >"$out_dir/$label.out" 2>"$out_dir/$label.err"
    status=$?
    cat "$out_dir/$label.out" "$out_dir/$label.err" >>"$log"
    progress "-- $label: exit $status ($(($(date +%s) - t0)) s)"
    return $status
}

# ---- 0. the machine --------------------------------------------------------------------
cuda=${CUDA_HOME:-/usr/local/cuda}
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
progress "gpu/check.sh on ${gpu_name:-no GPU visible to nvidia-smi}; CUDA at $cuda"
{
    nvidia-smi 2>&1 | head -n 15
    "$cuda/bin/nvcc" --version 2>&1 | tail -n 2
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
} >>"$log"

# ---- 1. build --------------------------------------------------------------------------
extra_cflags="" extra_ldflags="" check_libs="" nvcc_include="" ldpath=""

# OpenBLAS and Check: the machine's, or the .debs unpacked into build/gpu-debs/root
debs=build/gpu-debs
if ! pkg-config --exists openblas check 2>/dev/null; then
    if [ ! -f "$debs/root/.complete" ] && ls "$debs"/debs/*.deb >/dev/null 2>&1; then
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
    fi
    if [ ! -f "$debs/root/.complete" ]; then
        progress "error: no OpenBLAS/Check here and no build/gpu-debs: run tools/fetch-gpu-debs"
        progress "       on a Debian machine and carry build/gpu-debs/debs"
        exit 1
    fi
    r=$root/$debs/root
    lib=$r/usr/lib/x86_64-linux-gnu
    extra_cflags="-I$r/usr/include -I$r/usr/include/x86_64-linux-gnu/openblas-pthread"
    extra_ldflags="-L$lib/openblas-pthread -lopenblas"
    check_libs="$lib/libcheck_pic.a $lib/libsubunit.a -lrt -lm -pthread"
    ldpath="$lib/openblas-pthread:$lib"
    log "OpenBLAS and Check from $debs/root"
fi

# NCCL and cuBLAS: the toolkit's, or PyTorch's pip packages (no unversioned .so there:
# links to the versioned ones go into build/gpu-links)
pip_dirs=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for d, _, _ in os.walk(p):
        if d.endswith(("/lib", "/include")): print(d)' 2>/dev/null)
mkdir -p build/gpu-links
for name in nccl cublas cublasLt cudart; do
    found=""
    for d in "$cuda/lib64" "$cuda/targets/x86_64-linux/lib" $pip_dirs; do
        f=$(ls "$d/lib$name.so" "$d"/lib"$name".so.[0-9]* 2>/dev/null | head -n 1)
        [ -n "$f" ] && { found=$f; break; }
    done
    if [ -z "$found" ]; then
        progress "error: lib$name not found in $cuda or PyTorch's nvidia packages"
        exit 1
    fi
    dir=$(dirname "$found")
    [ -e "$cuda/lib64/lib$name.so" ] && continue   # the Makefile links the toolkit's
    ln -sf "$found" "build/gpu-links/lib$name.so"
    extra_ldflags="$extra_ldflags -Wl,-rpath,$dir"
    ldpath="$ldpath:$dir"
    log "lib$name from $found"
done
extra_ldflags="-L$root/build/gpu-links $extra_ldflags"
for header in nccl.h cublas_v2.h; do
    [ -f "$cuda/include/$header" ] && continue
    for d in $pip_dirs; do
        if [ -f "$d/$header" ]; then
            extra_cflags="$extra_cflags -I$d"
            nvcc_include="$nvcc_include -I$d"
            log "$header from $d"
            break
        fi
    done
done
export LD_LIBRARY_PATH="${ldpath#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPENBLAS_NUM_THREADS=1

mkdir -p build && touch build/.deps-ok   # the packages are settled above, not by apt
make_args=(GPU=1 "CUDA_HOME=$cuda" "EXTRA_CFLAGS=$extra_cflags" "EXTRA_LDFLAGS=$extra_ldflags")
[ -n "$check_libs" ] && make_args+=("CHECK_LIBS=$check_libs")
[ -n "$nvcc_include" ] && make_args+=("NVCCFLAGS=-O3 -std=c++17 -Icommon -Igpu$nvcc_include \
-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90")
[ -n "${O:-}" ] && make_args+=("O=$O")
bin=build/cpu-gpu${O:+-$O}
if run build 400 make -j"$(nproc)" "${make_args[@]}" tests benches chapter1 chapter2 chapter3; then
    row "build GPU=1 (sm_90 + PTX)" ok "$bin: tests, benches, chapters 1-3"
else
    row "build GPU=1 (sm_90 + PTX)" FAILED "see $log"
    tail -n 30 "$log"
    exit 1
fi

# ---- 2. GPU test suites --------------------------------------------------------------------
checks() {   # "N/M checks" from Check's summary line
    grep -Eo 'Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$1" | tail -n 1 |
        awk -F'[:, ]+' '{printf "%d/%d checks", $2 - $4 - $6, $2}'
}
for suite in test_gpu_ops test_gpu_strategies; do
    if run "$suite" 300 "$bin/tests/$suite"; then status=ok; else status=FAILED; fi
    detail=$(checks "$out_dir/$suite.out")
    if [ "$suite" = test_gpu_ops ]; then
        worst=$(grep -Eo 'rel [0-9.e+-]+ +\(tol 1e-05\)' "$out_dir/$suite.out" | awk '{print $2}' | sort -g | tail -n 1)
        worst_tf32=$(grep -Eo 'rel [0-9.e+-]+ +\(tol 1e-03\)' "$out_dir/$suite.out" | awk '{print $2}' | sort -g | tail -n 1)
        detail="$detail; worst rel err fp32 ${worst:--} (< 1e-5), tf32 ${worst_tf32:--} (< 1e-3)"
    else
        worst=$(grep -Eo 'grads \(rel\) [0-9.e+-]+' "$out_dir/$suite.out" | awk '{print $3}' | sort -g | tail -n 1)
        detail="$detail; worst step-1 grads vs CPU baseline ${worst:--} (rel)"
    fi
    row "$suite" "$status" "$detail"
done

# ---- 3. chapters: GPU against CPU ---------------------------------------------------------
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
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
print(f"max |loss gpu-cpu| {loss_diff:.1e}; vs GPU baseline (loss/grads/params): "
      + ", ".join(own))
EOF
}
chapter() {   # label, ranks, program, flags...: exit 0 = within the chapter's tolerances
    local label=$1 ranks=$2 program=$3 result=ok how
    shift 3
    label=$label-$ranks
    run "$label-cpu" 240 "$bin/$program" --ranks "$ranks" --device cpu --json --steps 5 "$@" ||
        result=FAILED
    run "$label-gpu" 240 "$bin/$program" --ranks "$ranks" --device cuda --json --steps 5 "$@" ||
        result=FAILED
    if [ "$ranks" -le "$gpus" ]; then how="nccl"; else how="threads over a shared GPU"; fi
    row "$label ($how)" "$result" \
        "$(compare_json "$out_dir/$label-gpu.out" "$out_dir/$label-cpu.out")"
}
chapter ch1-ddp 4 chapter1 --strategy ddp
chapter ch1-ddp 1 chapter1 --strategy ddp
chapter ch2-zero 4 chapter2
chapter ch2-zero 1 chapter2
chapter ch3-tp4 4 chapter3 --part train
chapter ch3-tp2-dp2 4 chapter3 --part train --tp 2

# ---- 4. benchmark: ours against PyTorch eager ----------------------------------------------
bench_rows=()
if [ $quick = 0 ]; then
    run bench_gpu 300 "$bin/bench/bench_gpu" --precision both
    run pytorch 300 python3 bench/pytorch_gpt2.py --precision both
    run pytorch-sdpa 200 python3 bench/pytorch_gpt2.py --precision both --sdpa
    results=$(cat "$out_dir/bench_gpu.out" "$out_dir/pytorch.out" "$out_dir/pytorch-sdpa.out" |
              grep '^RESULT')
    value() { echo "$results" | grep "impl=$1 precision=$2 " | grep -Eo "$3=[0-9.]+" | cut -d= -f2; }
    for precision in fp32 tf32; do
        ours=$(value c $precision tokens_per_s)
        theirs=$(value pytorch $precision tokens_per_s)
        for impl in c pytorch pytorch-sdpa; do
            ms=$(value $impl $precision ms)
            [ -n "$ms" ] || continue
            bench_rows+=("$(printf '%-13s %-5s %9.1f %10.0f %8.2f' "$impl" "$precision" "$ms" \
                "$(value $impl $precision tokens_per_s)" "$(value $impl $precision tflops)")")
        done
        if [ -n "$ours" ] && [ -n "$theirs" ]; then
            ratio=$(awk -v a="$ours" -v b="$theirs" 'BEGIN {printf "%.2f", a / b}')
            verdict=$(awk -v r="$ratio" 'BEGIN {print (r >= 0.8 ? "ok" : "BELOW")}')
            rows+=("bench $precision: ours / PyTorch eager|$verdict|${ratio}x tokens/s (target >= 0.8x)")
        else
            row "bench $precision" FAILED "no result (see $log)"
        fi
    done
fi

# ---- the table ----------------------------------------------------------------------------
{
    echo
    echo "== GPU check: ${gpu_name:-?}, $gpus GPU(s), $(($(date +%s) - t_begin)) s; log: $log"
    for r in "${rows[@]}"; do
        IFS='|' read -r what result detail <<<"$r"
        printf '%-44s %-7s %s\n' "$what" "$result" "$detail"
    done
    if [ ${#bench_rows[@]} -gt 0 ]; then
        echo "GPT-2 small training step (batch 16 x 1024):  impl  prec   ms/step   tokens/s  TFLOP/s"
        for b in "${bench_rows[@]}"; do echo "    $b"; done
    fi
    echo "failures: $failures"
} | tee -a "$log"
[ "$failures" -eq 0 ]
