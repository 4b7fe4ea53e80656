# gpu/check.sh --self-test: the script's rules on made-up inputs (sourced by check.sh,
# whose verdict and bench_lines it calls). Prints every case and its result; the status
# is the number of cases that went wrong.
#   verdict: how a step's exit status and "SKIP:" line become ok / skipped / FAILED,
#            with and without a GPU seen (a skip with a GPU seen must be FAILED)
#   bench_lines: ours / eager and ours / fused from RESULT lines, targets 1.0x and 0.8x
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
rm -rf "$self_dir"
echo "self-test: $wrong wrong"
exit "$wrong"
