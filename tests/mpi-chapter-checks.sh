#!/bin/bash
# Every chapter program as Open MPI processes, the way a reader runs it (./run N):
#  1. its default run in an AddressSanitizer + UBSan build: no bad access, no undefined
#     behaviour, from the first rank's start to the last table drawn after the job;
#  2. in the plain build, $runs (5) times in a row on a small model: a crash that shows in
#     one run of two (memory written after the job was freed) cannot pass by luck.
# Leak checking is off: Open MPI's own allocations are reported as leaks at exit (the
# threads backend's failure path is leak-checked in tests/fault-sanitizer-checks.sh).
# Usage: tests/mpi-chapter-checks.sh [sanitized|repeated]: part 1 (with the judge's own
# negative control) or part 2; both by default. Each builds what it runs (MPI=1 SAN=
# address all, MPI=1 all). make test runs the two parts in different lanes.
set -u
part=${1:-both}
case $part in
    sanitized | repeated | both) ;;
    *) echo "usage: $0 [sanitized|repeated] (got '$part')" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
passed=0
failed=0
runs=5
sanitized=build/cpu-mpi-address
plain=build/cpu-mpi
scratch=$(mktemp -d)
log=$scratch/log
trap 'rm -rf "$scratch"' EXIT
export ASAN_OPTIONS=detect_leaks=0 MPIRUN_ARGS="-x ASAN_OPTIONS"
# a small model, run for 3 steps (small); a run of other steps takes small_model, since
# the programs refuse a flag given twice
small_model=(--layers 2 --dim 16 --heads 2 --ctx 8 --batch 8 --quiet)
small=("${small_model[@]}" --steps 3)

# judge LABEL STATUS WANT: exit WANT and no sanitizer report in $log
judge() {
    local label=$1 status=$2 want=$3 sanitizer
    sanitizer=$(grep -E -m 1 'ERROR: (Address|Leak)Sanitizer|runtime error' "$log")
    if [ "$status" -eq "$want" ] && [ -z "$sanitizer" ]; then
        passed=$((passed + 1))
        echo "ok   $label: exit $status, clean"
        return 0
    fi
    failed=$((failed + 1))
    echo "FAIL $label: exit $status (expected $want); sanitizer: ${sanitizer:-none}"
    grep -v '^  0x\|^Shadow\|^  [A-Z][a-z]' "$log" | tail -n 25 | sed 's/^/     | /'
    return 1
}

# run_program BUILD PROGRAM RANKS FLAGS...: ./run RANKS FLAGS on BUILD/PROGRAM into $log
run_program() {
    local build=$1 program=$2 ranks=$3
    shift 3
    printf '%s\nmpi\n' "$build/$program" >"$scratch/last"
    RUN_LAST=$scratch/last timeout -k 5 300 ./run "$ranks" "$@" >"$log" 2>&1
}

# 1. every program's default run, and chapter 10's and 11's, under AddressSanitizer
sanitized_runs() {
    # negative control: the judge fails a clean exit that came with a sanitizer's report
    printf '==1==ERROR: AddressSanitizer: heap-use-after-free on address 0x1\n' >"$log"
    local before=$failed
    judge "negative control" 0 0 >/dev/null
    if [ $failed -eq $((before + 1)) ]; then
        failed=$before passed=$((passed + 1))
        echo "ok   negative control: an AddressSanitizer report is judged a failure"
    else
        passed=$((passed - 1)) failed=$((failed + 1))
        echo "FAIL negative control: an AddressSanitizer report was not caught"
    fi
    make -s -j2 MPI=1 SAN=address all >/dev/null ||
        { echo "FAIL make MPI=1 SAN=address all"; failed=$((failed + 1)); }

    # Ranks: 4 where the program is meant for several (the baseline runs on one).
    # Chapter 4 trains 1 step instead of 5 (its five schedules take half a minute under
    # the sanitizer on 2 cores); chapter 7 models the wire on threads only, so under MPI
    # it must refuse cleanly (exit 2); chapter 8's whole default takes minutes under the
    # sanitizer: its parts run one by one below, accuracy over 20 steps.
    local program ranks flags want part
    for program in baseline chapter1 chapter2 chapter3 chapter4 chapter5 chapter6 chapter7 chapter8 chapter9; do
        ranks=4 flags=() want=0
        case $program in
            baseline) ranks=1 ;;
            chapter4) ranks=2 flags=(--steps 1) ;;
            chapter7) ranks=2 want=2 ;;
            chapter8) continue ;;
            chapter9) flags=(--part sp "${small[@]}") ;;   # TP 2 + SP x DP 2; part memory in test_chapter9
        esac
        run_program "$sanitized" $program $ranks "${flags[@]}"
        judge "$program on $ranks ranks${flags[*]:+ ${flags[*]}} (AddressSanitizer)" $? $want
    done
    # bytes, speed, wire and accuracy (20 steps) on a 2-layer model of width 32: their
    # code is the same at any width, and the default model took most of this script's time
    local narrow="--layers 2 --dim 32 --heads 2 --ctx 16 --batch 8"
    for part in "bytes $narrow" "speed $narrow" "wire $narrow" \
        "accuracy $narrow --steps 20 --probe-batch 8 --svg $scratch/curves.svg" \
        "fp8 --dim 32 --heads 2 --ctx 16 --fp8-steps 20"; do
        # shellcheck disable=SC2086
        run_program "$sanitized" chapter8 2 --part $part --quiet
        judge "chapter8 on 2 ranks --part ${part%% *} (AddressSanitizer)" $? 0
    done

    # chapter 10: every part on 4 ranks (EP 4, and EP 2 x DP 2, each against one device)
    # on the small model
    run_program "$sanitized" chapter10 4 "${small[@]}" --curve-steps 4
    judge "chapter10 on 4 ranks, small model (AddressSanitizer)" $? 0
    # chapter 11: the 16-rank mesh (tp 2 x cp 2 x pp 2 x dp 2, ZeRO-3, bf16) as 16 Open
    # MPI processes on the small model; MoE on the mesh: tp 2 x ep 2 (bf16, ZeRO-3)
    # against the MoE model on one device
    run_program "$sanitized" chapter11 16 "${small[@]}"
    judge "chapter11 on 16 ranks, small model (AddressSanitizer)" $? 0
    run_program "$sanitized" chapter11 4 "${small[@]}" --tp 2 --ep 2
    judge "chapter11 on 4 ranks --tp 2 --ep 2, small model (AddressSanitizer)" $? 0
}

# 2. each program under MPI, RUNS times in a row in the plain build (the planner,
# chapter 6, trains nothing and refuses the training flags: its default plan); the
# first failure of a program is shown and ends its runs
repeated_runs() {
    make -s -j2 MPI=1 all >/dev/null || { echo "FAIL make MPI=1 all"; failed=$((failed + 1)); }
    local program ranks flags run
    for program in baseline chapter1 chapter2 chapter3 chapter4 chapter5 chapter6 chapter8 chapter9; do
        ranks=2 flags=("${small[@]}")
        case $program in
            baseline) ranks=1 ;;
            chapter4) flags=("${small_model[@]}" --micro 4 --steps 1) ;;   # 2 stages of 1 layer
            chapter5) ranks=4 ;;                          # a 3D mesh of 2 x 2
            chapter6) flags=() ;;
            chapter8) flags=(--part wire --layers 2 --dim 16 --heads 2 --ctx 8 --batch 8 --quiet) ;;
            chapter9) flags+=(--part sp) ;;
        esac
        for run in $(seq $runs); do
            run_program "$plain" $program $ranks "${flags[@]}"
            judge "$program on $ranks ranks${flags[*]:+, small model}, run $run of $runs" $? 0 || break
        done
    done
    # chapter 10's EP part on 4 ranks
    for run in $(seq $runs); do
        run_program "$plain" chapter10 4 "${small[@]}" --part ep
        judge "chapter10 on 4 ranks --part ep, small model, run $run of $runs" $? 0 || break
    done

    # chapter 11: 8 ranks of CP 2 x PP 2 x 2 HSDP replicas in fp32 and tp 2 x ep 2, each
    # twice (its suites run these paths on threads)
    local mesh_runs=2
    for run in $(seq $mesh_runs); do
        run_program "$plain" chapter11 8 "${small[@]}" --tp 1 --cp 2 --pp 2 --dp-replicate 2 --precision fp32
        judge "chapter11 on 8 ranks --cp 2 --pp 2 --dp-replicate 2, small model, run $run of $mesh_runs" $? 0 || break
    done
    for run in $(seq $mesh_runs); do
        run_program "$plain" chapter11 4 "${small[@]}" --tp 2 --ep 2
        judge "chapter11 on 4 ranks --tp 2 --ep 2, small model, run $run of $mesh_runs" $? 0 || break
    done
    # EP x PP (every stage's MoE blocks, one micro-batch) and EP x CP (no dropping), once
    # each (test_mesh_moe holds both against one device on threads)
    run_program "$plain" chapter11 4 "${small[@]}" --tp 1 --pp 2 --ep 2 --micro 1 --schedule 1f1b
    judge "chapter11 on 4 ranks --pp 2 --ep 2 --micro 1, small model" $? 0
    run_program "$plain" chapter11 4 "${small[@]}" --tp 1 --cp 2 --ep 2 --capacity-factor 0
    judge "chapter11 on 4 ranks --cp 2 --ep 2 --capacity-factor 0, small model" $? 0
    # MoE with micro-batches and TP + SP: tp 2 + sp x pp 2 x ep 2, 4 micro-batches, fp32
    run_program "$plain" chapter11 8 "${small[@]}" --tp 2 --sp --pp 2 --ep 2 --micro 4 --precision fp32
    judge "chapter11 on 8 ranks --tp 2 --sp --pp 2 --ep 2 --micro 4, small model" $? 0
}

[ "$part" != repeated ] && sanitized_runs
[ "$part" != sanitized ] && repeated_runs
echo "mpi-chapter-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
