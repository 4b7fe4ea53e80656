# gpu/check.sh --self-test: the script's rules on made-up inputs (sourced by check.sh,
# whose verdict and bench_lines it calls). Prints every case and its result; the status
# is the number of cases that went wrong.
#   verdict: how a step's exit status and "SKIP:" line become ok / skipped / FAILED,
#            with and without a GPU seen (a skip with a GPU seen must be FAILED)
#   bench_lines: ours / eager and ours / fused from RESULT lines, targets 1.0x and 0.8x
#   compare_losses: a GPU run against the CPU's within a tolerance, on the GPU indeed
#   floor_line: a step's time next to cuBLAS's floor
#   --dry-run: lists every chapter, both precisions, the step times and their floors
self_dir=$(mktemp -d)
wrong=0
expect() {   # what, got, want
    if [ "$2" = "$3" ]; then
        printf 'ok     %-52s %s\n' "$1" "$2"
    else
        printf 'WRONG  %-52s got "%s", want "%s"\n' "$1" "$2" "$3"
        wrong=$((wrong + 1))
    fi
}
printf 'SKIP: no GPU to test on\n' >"$self_dir/skip"
printf '100%%: Checks: 3, Failures: 0, Errors: 0\n' >"$self_dir/pass"
case_verdict() {   # what, status, file, seen, want
    verdict "$2" "$self_dir/$3" "$4"
    expect "$1" "$verdict" "$5"
}
case_verdict "exit 0, no GPU seen" 0 pass 0 ok
case_verdict "exit 0, GPU seen" 0 pass 1 ok
case_verdict "exit 77 + SKIP, no GPU seen" 77 skip 0 skipped
case_verdict "exit 77 + SKIP, GPU seen (the case this rule is for)" 77 skip 1 FAILED
case_verdict "exit 0 + SKIP (a benchmark), GPU seen" 0 skip 1 FAILED
case_verdict "exit 0 + SKIP (a benchmark), no GPU seen" 0 skip 0 skipped
case_verdict "exit 1" 1 pass 0 FAILED
case_verdict "timed out (124)" 124 pass 1 FAILED
case_verdict "not run for lack of budget (200)" 200 pass 1 FAILED
verdict 77 "$self_dir/skip" 1
expect "the reason a GPU-seen skip gives" "$why" "skipped although a GPU is seen: no GPU to test on"

cat >"$self_dir/worst" <<'R'
WORST embedding_forward fp32               rel 0.000e+00  (tol 0e+00)
WORST layernorm_forward fp32               rel 3.100e-07  (tol 1e-05)
WORST linear_forward fp32                  rel 1.200e-06  (tol 1e-05)
WORST linear_forward tf32                  rel 7.700e-04  (tol 2e-03)
WORST linear_backward tf32                 rel 2.500e-03  (tol 2e-03)  FAILED
R
expect "worst fp32 error of test_gpu_ops" "$(worst "$self_dir/worst" fp32)" "1.20e-06 (tol 1e-05)"
expect "worst tf32 error, one over tolerance" "$(worst "$self_dir/worst" tf32)" "2.50e-03 (tol 2e-03)"
printf 'Running suite(s): x\n66%%: Checks: 3, Failures: 1, Errors: 0\n' >"$self_dir/summary"
expect "checks from Check's summary" "$(checks "$self_dir/summary")" "2/3 checks"

cat >"$self_dir/ours" <<'R'
RESULT impl=c precision=fp32 batch=16 ms=100.000 tokens_per_s=163840 tflops=40.000 loss=10.8
RESULT impl=c precision=tf32 batch=16 ms=50.000 tokens_per_s=327680 tflops=80.000 loss=10.8
R
cat >"$self_dir/eager" <<'R'
RESULT impl=pytorch precision=fp32 batch=16 ms=110.000 tokens_per_s=148945 tflops=36.000 loss=10.8
RESULT impl=pytorch precision=tf32 batch=16 ms=45.000 tokens_per_s=364088 tflops=88.000 loss=10.8
R
cat >"$self_dir/fused" <<'R'
RESULT impl=pytorch-sdpa precision=fp32 batch=16 ms=80.000 tokens_per_s=204800 tflops=50.000 loss=10.8
R
lines=$(bench_lines "$self_dir/ours" "$self_dir/eager" "$self_dir/fused")
expect "bench fp32: ours / eager, ours / fused" "$(echo "$lines" | grep '^fp32' | grep -Eo '/ eager [^;]*; / fused .*')" \
    "/ eager 1.10x (ok); / fused 0.80x (ok)"
expect "bench tf32: below eager, no fused result" "$(echo "$lines" | grep '^tf32' | grep -Eo '/ eager [^;]*; / fused .*')" \
    "/ eager 0.90x (BELOW 1.0x); / fused -"
expect "bench without our result" "$(bench_lines "$self_dir/eager" | cut -d'|' -f1,2 | tr '\n' ' ')" \
    "fp32|FAILED tf32|FAILED "
# compare_losses: GPU against CPU by the losses' places, the device, the fallbacks
json() {   # file, device, loss of the baseline, loss of ddp
    printf 'log line\n{"chapter": "01-ddp", "device": "%s", "runs": [{"strategy": "baseline", "loss": [5.5, %s]},\n {"strategy": "ddp", "loss": [5.5, %s], "diff_vs_baseline": {"loss": 0, "grads": 7e-8, "params": 1e-6}}]}\n' \
        "$2" "$3" "$4" >"$self_dir/$1"
}
json cpu cpu 5.25 5.25
json gpu-close cuda 5.250004 5.250002
json gpu-far cuda 5.25 5.2502
json gpu-on-cpu cpu 5.25 5.25
printf '{"chapter": "09-sequence", "device": "cuda", "sp": {"runs": [{"strategy": "tp", "diff_vs_baseline": {"grads": 6e-4}}]}}\n' >"$self_dir/own-only"
loss_case() {   # what, gpu file, tol, want status
    compare_losses "$self_dir/$2" "$self_dir/cpu" "$3" cuda >"$self_dir/line"
    expect "$1" "$? $(cut -c1-40 "$self_dir/line")" "$4"
}
loss_case "losses within fp32's tolerance" gpu-close 1e-5 "0 max |loss gpu - cpu| 4.0e-06 (tol 1e-05)"
loss_case "a loss 2e-4 apart fails fp32's tolerance" gpu-far 1e-5 "1 max |loss gpu - cpu| 2.0e-04 (tol 1e-05)"
loss_case "... and passes the 16-bit one" gpu-far 1e-3 "0 max |loss gpu - cpu| 2.0e-04 (tol 1e-03)"
loss_case "a 'GPU' run that ran on the CPU fails" gpu-on-cpu 1e-5 "1 ran on cpu, not cuda"
loss_case "no losses: the runs' own differences" own-only 1e-5 "0 no losses in the JSON: against its own b"
printf '{"chapter": "07-communication", "device": "cuda", "on_links": [{"strategy": "ddp", "ms_per_step": [1.5]}]}\n' >"$self_dir/timings"
loss_case "timings alone: the exit status" timings 1e-5 "0 its JSON reports no losses: its exit sta"
loss_case "no JSON at all" summary 1e-5 "2 nothing to compare (no JSON object)"

# floor_line: a step's time next to cuBLAS's floor
printf '{"chapter": "00-baseline", "runs": [{"strategy": "baseline", "ms_per_step": 12.5}]}\n' >"$self_dir/step"
printf 'RESULT impl=gemm-floor label=bench256 precision=bf16 ms=2.500 tflops=100.00\n' >"$self_dir/floor"
expect "step time against the floor" "$(floor_line bench256 bf16 "$self_dir/step" "$self_dir/floor")" \
    "step bench256 bf16|info|12.50 ms/step; cuBLAS products alone 2.50 ms (5.0x the floor)"
expect "no floor for that precision" "$(floor_line bench256 fp32 "$self_dir/step" "$self_dir/floor")" \
    "step bench256 fp32|info|12.5 ms/step; no cuBLAS floor measured"
expect "no step time" "$(floor_line bench256 bf16 "$self_dir/floor" "$self_dir/floor" | cut -d'|' -f2)" "FAILED"

# --dry-run: every chapter in fp32 and bf16 (or refused in one line), both step times in
# every precision next to their floors, and nothing run
dry=$(gpu/check.sh --dry-run 2>&1)
for d in chapters/[0-9]*/; do
    [ -f "$d/main.c" ] || continue
    n=${d#chapters/} && n=$((10#${n%%-*}))
    program=chapter$n
    [ "$n" = 0 ] && program=baseline
    expect "dry run builds and runs $program" \
        "$(echo "$dry" | grep -c "cpu-gpu/$program\( \|$\)" | awk '{print ($1 >= 2)}')" 1
done
for precision in fp32 bf16; do
    expect "dry run: the baseline in $precision on both devices" \
        "$(echo "$dry" | grep -c "^baseline-$precision-1-[cg]pu ")" 2
done
for model in bench256 gpt2-small; do
    expect "dry run: $model's floor and its steps in fp32, tf32, bf16" \
        "$(echo "$dry" | grep -cE "^(floor-$model|step-$model-(fp32|tf32|bf16)) ")" 4
done
expect "dry run: the CP and MoE parts refused on cuda" "$(echo "$dry" | grep -cE '^ch(9-context|10-moe)-cuda ')" 2
expect "dry run: says nothing ran" "$(echo "$dry" | tail -n 1)" \
    "dry run: the steps above, as on a machine with one GPU; nothing ran"
rm -rf "$self_dir"
echo "self-test: $wrong wrong"
exit "$wrong"
