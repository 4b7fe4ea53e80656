#!/bin/bash
# The flags every program shares, refused before any rank starts with one line and exit
# status 2 (or, for a run that diverges or waits on a slow link, exit 1); ./run's own
# input, its restarts, and ./run 2 under Open MPI: MPIRUN_ARGS, shared memory, a stopped
# mpirun. Each program's own flags: tests/cli-chapter-checks.sh; how both run the
# programs and judge a case: tests/cli-common.sh.
# Usage: tests/cli-checks.sh BUILD_DIR [mpi]
. "$(dirname "$0")/cli-common.sh"
for program in "${every_program[@]}"; do
    [ -x "$program" ] || continue
    expect_error "$program" "unknown flag '--bogus'" --bogus 1
    expect_error "$program" "--steps abc: not an integer" --steps abc
    expect_error "$program" "--dim 0: must be an integer from 1" --dim 0
    expect_error "$program" "--batch -3" --batch -3
    expect_error "$program" "--heads 3 does not divide --dim " --heads 3
    expect_training_error "$program" "--lr x: not a number" --lr x
    expect_error "$program" "--link warp: unknown value (valid: none, nvlink, ib, ethernet)" --link warp
    expect_error "$program" "--data /nonexistent: cannot open" --data /nonexistent
    expect_error "$program" "too short; a sequence of --ctx 64 needs at least 65 bytes" --data "$short"
    expect_error "$program" "--preset huge: unknown preset" --preset huge
    # a flag given twice is refused by name, not settled by the last value
    expect_error "$program" "--layers given twice (8, then 2): give it once" --layers 8 --layers=2
    json_twice="--json given twice: give it once"   # chapter 12 has no --json
    [ "$(basename "$program")" = chapter12 ] && json_twice="--json does nothing in chapter12"
    expect_error "$program" "$json_twice" --json --json
    # negative and overflowing integers: refused, never wrapped round
    expect_training_error "$program" "--seed -1: must be an integer from 0 to 18446744073709551615" --seed -1
    expect_training_error "$program" "--seed  -1: must be an integer from 0" --seed " -1"
    expect_training_error "$program" "--seed 18446744073709551616: must be an integer from 0" --seed 18446744073709551616
    expect_training_error "$program" "--seed 12abc: must be an integer from 0" --seed 12abc
    expect_training_error "$program" "--warmup -1: must be an integer from 0 to 1000000000" --warmup -1
    expect_error "$program" "--steps 4294967297: must be an integer from 1 to 1000000000" --steps 4294967297
    expect_error "$program" "--layers 99999999999999999999: must be an integer from 1" --layers 99999999999999999999
    expect_error "$program" "--ctx -2147483648: must be an integer from 1" --ctx -2147483648
    expect_training_error "$program" "--lr -1: must be at least 0" --lr -1
    expect_training_error "$program" "--lr 1e999: not a number" --lr 1e999
    # data that is not a regular file: refused by its kind, before it is opened
    expect_error "$program" "--data /dev/zero: not a regular file" --data /dev/zero
    expect_error "$program" "--data $scratch/fifo: not a regular file" --data "$scratch/fifo"
    expect_error "$program" "--data $scratch: is a directory" --data "$scratch"
    # waits that would never end, or end in a time_t overflow
    expect_training_error "$program" "--comm-timeout 1e300: must be at most 604800" --comm-timeout 1e300
    expect_training_error "$program" "--comm-timeout 1e19: must be at most 604800" --comm-timeout 1e19
    expect_training_error "$program" "--link-scale 1e6: must be at most 10000" --comm-timeout 5 --link ethernet --link-scale 1e6
    expect_error "$program" "--ranks 5000: must be at most 4096" --ranks 5000 --batch 5000
    # the two-tier network: all three flags or none, never with --link, nodes filled
    expect_training_error "$program" "--link-inter missing: a two-tier network takes" --link-intra nvlink
    expect_training_error "$program" "--link ib: one link for every transfer" --link-intra nvlink --link ib --link-inter ib --ranks-per-node 1
    expect_training_error "$program" "--link-intra none: a tier needs a link" --link-intra none --link-inter ib --ranks-per-node 1
    # sizes whose products overflow
    expect_error "$program" "--dim 1000000000: at most 536870911" --dim 1000000000 --vocab 1000000000
    expect_error "$program" "attention scores a sequence overflow" --ctx 1000000000
    expect_training_error "$program" "--trace $scratch/no/t.json: cannot write there" --trace "$scratch/no/t.json"
    # test hooks are accepted but never listed for a student
    if "$program" --help 2>&1 | grep -q -- "--save-test-crash"; then
        failed=$((failed + 1))
        echo "FAIL $(basename "$program") --help lists the test hook --save-test-crash"
    else
        passed=$((passed + 1))
        echo "ok   $(basename "$program") --help lists no test hook"
    fi
done
# programs that train: a run that cannot fit in memory is refused before it starts,
# and training that diverges stops at the first non-finite loss
for program in "$programs"/baseline "$programs"/chapter[1234]; do
    [ -x "$program" ] || continue
    for size in "--dim 1000000" "--layers 100000" "--batch 1000000"; do
        # shellcheck disable=SC2086
        expect_error "$program" "this run needs at least .* and this machine has" $size
    done
    expect_status "$program" 1 "training diverged: the loss is nan at step 2 on rank 0 (strategy" $tiny2 --lr 1e30
done
# a modelled wire slower than the timeout is reported as such, not a silent wait
# (the link model is the threads backend's)
for program in "$programs"/chapter[1234]; do
    [ -z "$mpi" ] || continue
    [ -x "$program" ] || continue
    # shellcheck disable=SC2086
    expect_status "$program" 1 "the modelled link is slower than the timeout: a .* takes .* s on --link ethernet x --link-scale 10000, more than --comm-timeout 0.05 s" \
        $tiny2 --ranks 2 --link ethernet --link-scale 1e4 --comm-timeout 0.05
done
# MPIRUN_ARGS reaches mpirun: --output-filename makes a folder per rank
if [ "$mpi" = mpi ] && [ -x "$programs"/baseline ]; then
    # shellcheck disable=SC2086
    MPIRUN_ARGS="--output-filename $scratch/by-rank" "$programs"/baseline $tiny >/dev/null 2>&1
    status=$?
    if [ $status -eq 0 ] && [ -f "$scratch/by-rank/1/rank.0/stdout" ]; then
        passed=$((passed + 1))
        echo "ok   MPIRUN_ARGS=\"--output-filename DIR\" ./run 1: exit 0, DIR/1/rank.0/stdout written"
    else
        failed=$((failed + 1))
        echo "FAIL MPIRUN_ARGS=\"--output-filename DIR\" ./run 1: exit $status, no DIR/1/rank.0/stdout"
    fi
fi
# ./run's ranks on one machine talk over shared memory (vader) wherever Open MPI's own
# settings do: with 256 KB fragments in vader's default segment they reached no one, and
# Open MPI fell back to loopback TCP without a word. The negative control forces TCP and
# must be told apart; a machine where plain mpirun has no shared memory skips the check.
transports() {   # COMMAND...: the transports its Open MPI processes say they used
    "$@" 2>&1 | grep -oE "Using (vader|tcp) btl" | sort -u | paste -sd, -
}
if [ "$mpi" = mpi ] && [ -x "$programs"/chapter1 ]; then
    # shellcheck disable=SC2086
    plain=$(transports mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
        --mca btl_base_verbose 30 -x OMPI_MCA_btl_vader_single_copy_mechanism=none \
        "$build"/chapter1 $tiny)
    # shellcheck disable=SC2086
    used=$(MPIRUN_ARGS="--mca btl_base_verbose 30" transports "$programs"/chapter1 $tiny)
    # shellcheck disable=SC2086
    forced=$(MPIRUN_ARGS="--mca btl_base_verbose 30 --mca btl self,tcp" \
        transports "$programs"/chapter1 $tiny)
    if [ "$plain" != "Using vader btl" ]; then
        echo "skip ./run 2 under Open MPI on shared memory: plain mpirun used '$plain' here"
    elif [ "$used" = "Using vader btl" ] && [ "$forced" = "Using tcp btl" ]; then
        passed=$((passed + 1))
        echo "ok   ./run 2 under Open MPI: ranks on shared memory ($used), as plain mpirun; negative control, --mca btl self,tcp: $forced"
    else
        failed=$((failed + 1))
        echo "FAIL ./run 2 under Open MPI: '$used' where plain mpirun used vader; with --mca btl self,tcp: '$forced' (want tcp)"
    fi
fi
# a run that failed prints no verdict: chapter 1's DDP diverges, and no table follows
if [ -x "$programs"/chapter1 ]; then
    # shellcheck disable=SC2086
    verdict=$("$programs"/chapter1 $tiny --ranks 2 --lr 1e30 2>/dev/null | grep -c "tolerance")
    if [ "$verdict" -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok   chapter1 --ranks 2 --lr 1e30: no verdict after the failed run"
    else
        failed=$((failed + 1))
        echo "FAIL chapter1 --ranks 2 --lr 1e30: printed a verdict after the failed run"
    fi
fi
# the largest seed is valid (the refusals above are not a blanket "no")
[ -x "$programs"/baseline ] && expect_ok "$programs"/baseline --seed 18446744073709551615 --steps 1 \
    --layers 1 --dim 16 --heads 2 --ctx 8 --batch 1 --quiet
# mixed precision: the precision's values, the loss scale's flags (fp16 alone) and the
# programs and strategies that train in fp32 alone so far. The programs parse these flags
# with the same code: under MPI (about 1.5 s a case) chapter 1 alone answers for them.
for program in "${every_program[@]}"; do
    [ -x "$program" ] || continue
    expect_error "$program" "--precision fp4: unknown value (valid: fp32, bf16, fp16, fp8)" --precision fp4
    expect_training_error "$program" "--loss-scale 0: must be at least 1" --loss-scale 0 --precision fp16
done
for program in $(mixed_programs "$programs"/baseline "$programs"/chapter[12345]); do   # 16 bits
    [ -x "$program" ] || continue
    expect_error "$program" "--loss-scale: only --precision fp16 takes a loss scale (this run computes in bf16" \
        --loss-scale 8 --precision bf16
    expect_error "$program" "--no-loss-scale: only --precision fp16 takes a loss scale (this run computes in fp32" \
        --no-loss-scale
    expect_error "$program" "--no-loss-scale: leave out --loss-scale" \
        --no-loss-scale --loss-scale 8 --precision fp16
done
# DataParallel (chapter 1) and chapter 7 train in bf16 and fp16 (test_chapter1, test_chapter7);
# what they still refuse, FP8, is in cli-chapter-checks.sh
[ -x "$programs"/chapter3 ] && [ -z "$mpi" ] && expect_error "$programs"/chapter3 \
    "--precision bf16: parts 1 and 2 show the split arithmetic in fp32; it applies to --part train" \
    --precision bf16 --part block
# --grad-dtype: fp32, or 16 bits in the run's own precision; chapters 3-5 keep fp32
# gradients so far, and DDP's --compress is a wire type for fp32 gradients
for program in "${every_program[@]}"; do
    [ -x "$program" ] || continue
    expect_training_error "$program" "--grad-dtype fp8: unknown value (valid: fp32, bf16, fp16)" --grad-dtype fp8
done
for program in $(mixed_programs "$programs"/baseline "$programs"/chapter[1-57]); do
    [ -x "$program" ] || continue
    expect_error "$program" "--grad-dtype bf16: 16-bit gradients take the precision the run computes in (this run: --precision fp32); valid: fp32$" \
        --grad-dtype bf16
done
for program in $(mixed_programs "$programs"/baseline "$programs"/chapter[1-5]); do
    [ -x "$program" ] || continue
    expect_error "$program" "--grad-dtype bf16: 16-bit gradients take the precision the run computes in (this run: --precision fp16); valid: fp32 or fp16$" \
        --grad-dtype bf16 --precision fp16
done
# --matmul: the fp32 linears' engine; a run whose linears are not fp32 products refuses it
for program in $(mixed_programs "$programs"/baseline "$programs"/chapter1); do
    [ -x "$program" ] || continue
    expect_error "$program" "--matmul mkl: unknown value (valid: openblas, onednn)" --matmul mkl
    expect_error "$program" "--matmul onednn: chooses the engine of fp32 products; this run computes its linears in bf16" \
        --matmul onednn --precision bf16
    # shellcheck disable=SC2086
    expect_ok "$program" $tiny --matmul onednn
done
# TP + SP with 16-bit gradients trains (tests/test_chapter9.c holds it to the baseline)
# shellcheck disable=SC2086
[ -x "$programs"/chapter3 ] && [ -z "$mpi" ] && expect_ok "$programs"/chapter3 $tiny \
    --ranks 4 --tp 2 --sp --part train --grad-dtype bf16 --precision bf16
[ -x "$programs"/chapter1 ] && expect_error "$programs"/chapter1 \
    "--compress bf16: DDP's wire type for fp32 gradients; --grad-dtype bf16 reduces 16-bit gradients as they are (valid: --compress none)" \
    --grad-dtype bf16 --precision bf16 --strategy ddp --compress bf16
# fp16's loss scale: a start that is no fp32 number, or with which every step of the run
# overflows fp16 and is skipped, is refused before any rank starts
for program in $(mixed_programs "$programs"/baseline "$programs"/chapter[123459]); do
    [ -x "$program" ] || continue
    fp16=(--precision fp16)   # a run that would start but for the scale
    case "$(basename "$program")" in
        chapter1) fp16+=(--strategy ddp) ;;
        chapter9) [ -z "$mpi" ] && fp16+=(--ranks 2) ;;
    esac
    expect_error "$program" "--loss-scale 1e39: more than fp32's largest number" "${fp16[@]}" --loss-scale 1e39
    expect_error "$program" "--loss-scale 1e38: every one of the .* steps would overflow fp16 and be skipped" \
        "${fp16[@]}" --loss-scale 1e38
done
for program in $(mixed_programs "$programs"/chapter2 "$programs"/chapter8 "$programs"/chapter9); do
    [ -x "$program" ] || continue
    p16=(--precision fp16)
    [ "$(basename "$program")" = chapter8 ] && p16=()   # chapter 8 runs fp16 itself
    [ "$(basename "$program")" = chapter9 ] && [ -z "$mpi" ] && p16+=(--ranks 2)
    expect_error "$program" "--loss-scale 3.5e38: more than fp32's largest number" "${p16[@]}" --loss-scale 3.5e38
done
[ -x "$programs"/chapter2 ] && expect_error "$programs"/chapter2 \
    "--loss-scale 2e10: every one of the 5 steps .* step 10 would be the first taken; valid: below 1.07e+09" \
    --precision fp16 --loss-scale 2e10
# shellcheck disable=SC2086
[ -x "$programs"/chapter2 ] && expect_ok "$programs"/chapter2 $tiny --precision fp16 --loss-scale 1e6
# the refusal comes first: nothing on stdout before it
for program in "${every_program[@]}"; do
    [ -x "$program" ] || continue
    out=$("$program" --data /dev/null 2>/dev/null)
    if [ -z "$out" ]; then
        passed=$((passed + 1)); echo "ok   $(basename "$program") --data /dev/null: nothing before the refusal"
    else
        failed=$((failed + 1)); echo "FAIL $(basename "$program") --data /dev/null: printed before the refusal: $out"
    fi
done
# --help lists only what a program accepts: chapters 8-10 keep no checkpoints, and
# chapter 10 trains no FP8 (chapter 8 runs every precision itself)
for program in "$programs"/chapter8 "$programs"/chapter9 "$programs"/chapter10; do
    [ -x "$program" ] && [ -z "$mpi" ] || continue
    refused="--save \|--save-every \|--resume \|--max-restarts \|--elastic "
    case "$(basename "$program")" in
        chapter8) refused="$refused\|--precision \|--grad-dtype \|--no-loss-scale \|--fp8-recipe \|--fp8-format " ;;
        chapter10) refused="$refused\|--fp8-recipe \|--fp8-format " ;;
    esac
    listed=$("$program" --help 2>&1 | grep -o -e "$refused" | tr '\n' ' ')
    if [ -z "$listed" ]; then
        passed=$((passed + 1)); echo "ok   $(basename "$program") --help lists no flag it refuses"
    else
        failed=$((failed + 1)); echo "FAIL $(basename "$program") --help lists flags it refuses: $listed"
    fi
done
# A stopped mpirun (killed, or Ctrl-C) leaves nothing behind: its processes' shared
# memory segments (found in their maps) and its session files (under the TMPDIR it had)
# go with the job. Ctrl-C is exit status 130 and one line, as on threads.
# stop_mpirun SIGNAL WANT_STATUS WANT_LINE: the verdict for one long ./run 2 so stopped
stop_mpirun() {
    local signal=$1 want=$2 line=$3 marker=$((RANDOM * 32768 + RANDOM)) tmp="$scratch/tmp-$1"
    mkdir -p "$tmp"
    # a background job of a script ignores SIGINT, and so would ./run: python gives it
    # back the default, as a terminal's job has
    TMPDIR=$tmp setsid python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])' "$programs"/chapter1 --strategy ddp --steps 100000 --quiet \
        --seed "$marker" >/dev/null 2>"$scratch/stop.err" &
    local job=$! segments="" ranks mpirun_pid tries
    for tries in $(seq 300); do   # until both ranks have mapped their segments
        ranks=$(pgrep -f "chapter1 --strategy ddp --steps 100000 --quiet --seed $marker" | grep -vx "$job")
        segments=$(for r in $ranks; do grep -o '/[^ ]*vader_segment[^ ]*' "/proc/$r/maps" 2>/dev/null; done | sort -u)
        [ "$(printf '%s' "$segments" | grep -c .)" -ge 2 ] && break
        sleep 0.1
    done
    mpirun_pid=$(pgrep -x mpirun -P "$job")
    if [ "$signal" = INT ]; then kill -INT -- "-$job"; else kill -KILL "$mpirun_pid"; fi
    # never a silent hang of the suite: a ./run still there 60 s on is killed, and fails
    (sleep 60; echo "./run was still running 60 s after its $signal" >>"$scratch/stop.err"
     kill -KILL -- "-$job") 2>/dev/null &
    local watchdog=$!
    wait "$job"
    local status=$? left
    kill "$watchdog" 2>/dev/null
    sleep 0.5   # the ranks, which mpirun's death leaves to exit on their own
    left=$(for f in $segments; do [ -e "$f" ] && echo "$f"; done; find "$tmp" -mindepth 1 -maxdepth 1)
    if [ -n "$segments" ] && [ -z "$left" ] && [ $status -eq "$want" ] &&
        { [ -z "$line" ] || grep -q -- "$line" "$scratch/stop.err"; }; then
        passed=$((passed + 1))
        echo "ok   ./run 2 under Open MPI, $signal to mpirun's job: exit $status, $(wc -l <"$scratch/stop.err") line(s), nothing left of $(echo $segments | wc -w) segments and the session files"
    else
        failed=$((failed + 1))
        echo "FAIL ./run 2 under Open MPI, $signal: exit $status (want $want), stderr: $(cat "$scratch/stop.err"); segments seen: $segments; left behind: $left"
    fi
}
if [ "$mpi" = mpi ] && [ -x "$programs"/chapter1 ]; then
    stop_mpirun KILL 137 ""
    stop_mpirun INT 130 "^run: interrupted (Ctrl-C): mpirun stopped the 2 ranks$"
fi
# ./run itself (once, on threads: RUN_LAST names this build's baseline, whatever was
# built last)
if [ -z "$mpi" ] && [ -x "$build"/baseline ]; then
    printf '%s\nthreads\n' "$build/baseline" >"$scratch/last"
    export RUN_LAST=$scratch/last
    expect_error ./run "N 'x' must be a positive whole number" x
    expect_error ./run "N '0' must be a positive whole number" 0
    expect_error ./run "N '-1' must be a positive whole number" -1
    expect_error ./run "--ranks 99999999999999999999: must be an integer from 1" 99999999999999999999
    expect_error ./run "--ranks 1000000: must be at most 4096" 1000000   # as typed, not 1e+06
    expect_error ./run "--ranks given twice (2, then 3): give it once" 2 --ranks 3   # ./run N gives it
fi
# the flag refused when given twice is only that one: flags whose names start alike, each
# given once, run (the negative control of the refusal)
# shellcheck disable=SC2086
[ -z "$mpi" ] && [ -x "$build"/baseline ] && expect_ok "$build"/baseline $tiny --precision fp16 \
    --loss-scale 1024 --loss-scale-window 4 --save "$scratch/once" --save-every 1
# with --max-restarts the loop gives each attempt its own --resume: a user's --resume given
# twice is still refused by the program, in one line
if [ -z "$mpi" ] && [ -x "$build"/chapter1 ]; then
    printf '%s\nthreads\n' "$build/chapter1" >"$scratch/last-twice"
    # shellcheck disable=SC2086
    RUN_LAST=$scratch/last-twice expect_error ./run "--resume given twice ($scratch/once, then $scratch/r): give it once" \
        2 $tiny --save "$scratch/r2" --max-restarts 1 --resume "$scratch/once" --resume "$scratch/r"
fi
# checkpoints' files are named under --save and --resume: a longer path is refused; and
# --device cuda in a build without GPU support (device_check). Both in cli_parse, which
# the threads and the MPI programs share: checked once, on threads
if [ -z "$mpi" ] && [ -x "$build"/chapter1 ]; then
    long_dir=$scratch/$(printf 'd%.0s' $(seq 1 2100))
    expect_error "$build"/chapter1 "--save: a path of ${#long_dir} characters; at most 2048" $tiny --save "$long_dir"
    expect_error "$build"/chapter1 "--resume: a path of ${#long_dir} characters; at most 2048" $tiny --resume "$long_dir"
    case "$(basename "$build")" in
    cpu | cpu-address)
        expect_error "$build"/chapter1 "--device cuda: this build has no GPU support (build with GPU=1, or use --device cpu)" $tiny --device cuda ;;
    esac
fi
# restarts after failures (./run --max-restarts, common/train/restart.c): they resume
# from --save's checkpoints, and ./run, outside the job, makes them
chapter1="$programs"/chapter1
if [ -x "$chapter1" ]; then
    expect_error "$chapter1" "--max-restarts 2: needs --save DIR (a restart resumes from the latest checkpoint there" $tiny --max-restarts 2
    if [ -z "$mpi" ]; then   # under MPI the wrapper is ./run, which answers the next one
        expect_error "$chapter1" "--max-restarts 2: ./run makes the restarts (it starts the job again after a failure); run it as ./run N ... --max-restarts 2" $tiny --max-restarts 2 --save "$scratch/r"
        expect_error "$chapter1" "--elastic: needs --max-restarts K" $tiny --elastic
        expect_error "$chapter1" "--max-restarts -1: must be an integer from 0" $tiny --max-restarts -1
        expect_error "$chapter1" "--restart-attempt and --restart-record: ./run gives them with --max-restarts" $tiny --restart-attempt 1
        expect_error "$chapter1" "--restart-record '1 2': ./run's record of the earlier attempts has 7 numbers" $tiny --max-restarts 1 --save "$scratch/r" --restart-attempt 1 --restart-record "1 2"
        printf '%s\nthreads\n' "$build/chapter1" >"$scratch/last1"
        RUN_LAST=$scratch/last1 expect_error ./run "--max-restarts 1: needs --save DIR" 2 $tiny --max-restarts 1
        RUN_LAST=$scratch/last1 expect_error ./run "--max-restarts x: not an integer" 2 $tiny --max-restarts x --save "$scratch/r"
        [ -x "$programs"/chapter6 ] && expect_error "$programs"/chapter6 "--max-restarts does nothing in chapter6 (the planner trains nothing)" --max-restarts 1
        [ -x "$programs"/chapter7 ] && expect_error "$programs"/chapter7 "--max-restarts 1: chapter 7 trains many short runs" --max-restarts 1
    fi
fi
# negative control: the checker fails a program that takes bad input without a word
before_passed=$passed before_failed=$failed
expect_error /bin/true "anything" --bogus 1 >/dev/null
if [ $failed -eq $((before_failed + 1)) ] && [ $passed -eq $before_passed ]; then
    passed=$((before_passed + 1)) failed=$before_failed
    echo "ok   negative control: /bin/true --bogus 1 (exit 0, no line) is counted as a failure"
else
    passed=$before_passed failed=$((before_failed + 1))
    echo "FAIL negative control: /bin/true --bogus 1 was not counted as a failure"
fi
cli_finish cli-checks
