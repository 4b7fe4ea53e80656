#!/bin/bash
# Restarts after failures (./run --max-restarts, tools/restart-loop.sh, common/train/restart.c).
# A rank killed (SIGKILL, the test hook) at a random step of a DDP run with --save-every 2
# --max-restarts 2 must end with exit 0 and final parameters equal, bit for bit, to an
# uninterrupted run's (every tensor of the two final checkpoints compared; the largest
# difference printed). So must a failure during a save (it restarts from the checkpoint
# before) and one before the first save (comm_abort; from the start). A rank failing on
# every attempt must end non-zero after K restarts with a line saying why, and so must a
# rank gone for good without --elastic. With --elastic, DDP, ZeRO-3, TP 2 x DP 2 and
# PP 2 x DP 2 finish on fewer ranks, their losses within 1e-5 (TOL_LOSS) of the
# uninterrupted run's. Negative controls: a restart resuming one step late
# (--test-resume-skew) must fail the bit-for-bit comparison, and the 1e-5 one.
# With `mpi` (an MPI=1 build): the same kill of a real Open MPI process and a stuck one
# (SIGSTOP, named by --comm-timeout), each restarted by a fresh mpirun that keeps
# MPIRUN_ARGS (a hostfile), and ZeRO-3 going on with 3 of 4 processes.
# Usage: tests/restart-checks.sh BUILD_DIR [mpi]
set -u
cd "$(dirname "$0")/.."
build=${1:-build/cpu}
backend=${2:-threads}
python=$(command -v python3 || echo /usr/bin/python3)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model="--layers 2 --dim 32 --heads 2 --ctx 16 --batch 8 --steps 8 --quiet --json"
passed=0
failed=0
programs="chapter1 chapter2 chapter3 chapter4"
[ "$backend" = mpi ] && programs="chapter1 chapter2"
for p in $programs; do
    [ -x "$build/$p" ] || { echo "SKIP: $build/$p is not built (make all)"; exit 77; }
done

verdict() {   # verdict NAME STATUS OUTPUT
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "ok   $1: $3"
    else failed=$((failed + 1)); echo "FAIL $1: $3"; sed 's/^/     | /' "$work/err" | tail -8; fi
}

# flags_once FLAGS...: FLAGS into the array `once` with each flag given once: a later
# value replaces the earlier one where it stood. The programs refuse a flag given twice,
# and a check overrides $model's --steps or --batch by giving its own after it.
flags_once() {
    local names=() values=() k at none=$'\n'
    while [ $# -gt 0 ]; do
        local value=$none
        [ $# -gt 1 ] && [[ $2 != --* ]] && value=$2
        at=-1
        for k in "${!names[@]}"; do [ "${names[k]}" = "$1" ] && at=$k; done
        if [ $at -ge 0 ]; then values[at]=$value; else names+=("$1") values+=("$value"); fi
        shift
        [ "$value" = "$none" ] || shift
    done
    once=()
    for k in "${!names[@]}"; do
        once+=("${names[k]}")
        [ "${values[k]}" = "$none" ] || once+=("${values[k]}")
    done
}

# job TAG BACKEND PROGRAM RANKS FLAGS...: ./run with RUN_LAST pointing at PROGRAM, each
# flag once (flags_once); the JSON in TAG.json, stderr in $work/err and TAG.err; returns
# the exit status
job() {
    local tag=$1 backend=$2 program=$3 ranks=$4 once
    shift 4
    flags_once "$@"
    printf '%s\n%s\n' "$program" "$backend" >"$work/last"
    RUN_LAST=$work/last ./run "$ranks" "${once[@]}" >"$work/$tag.json" 2>"$work/err"
    local status=$?
    cp "$work/err" "$work/$tag.err"
    return $status
}

# same_tensors A B [POINTER]: every tensor of the final checkpoints DIR A and B (the ones
# DIR/POINTER names, default latest), bit for bit
same_tensors() {
    "$python" - "$1" "$2" "${3:-latest}" <<'PY'
import array, glob, json, os, struct, sys
def tensors(d):
    d = os.path.join(d, open(os.path.join(d, sys.argv[3])).read().strip())
    out = {}
    for path in sorted(glob.glob(os.path.join(d, "rank-*.safetensors"))):
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        for name, t in json.loads(raw[8:8 + n]).items():
            if name == "__metadata__": continue
            a, b = t["data_offsets"]
            out[(os.path.basename(path), name)] = array.array("f", raw[8 + n + a:8 + n + b])
    return out
x, y = tensors(sys.argv[1]), tensors(sys.argv[2])
if x.keys() != y.keys(): print("the checkpoints hold different tensors"); sys.exit(1)
worst = max(max((abs(p - q) for p, q in zip(x[k], y[k])), default=0.0) for k in x)
same = all(x[k].tobytes() == y[k].tobytes() for k in x)
print(f"{len(x)} tensors, largest difference {worst:g}, {'bit for bit equal' if same else 'NOT bit-identical'}")
sys.exit(0 if same else 1)
PY
}

# losses_close FULL RESUMED STRATEGY: RESUMED's losses (the steps after its resume) next to
# the same steps of FULL, within 1e-5
losses_close() {
    "$python" - "$1" "$2" "$3" <<'PY'
import json, sys
# the run whose strategy starts with the name (TP x DP on 2 ranks is "tp", on 4 "tp+dp")
runs = lambda p: {sys.argv[3]: [r["loss"] for r in json.load(open(p))["runs"] if r["strategy"].startswith(sys.argv[3])][0]}
j = json.load(open(sys.argv[2]))
full, resumed = runs(sys.argv[1])[sys.argv[3]], runs(sys.argv[2])[sys.argv[3]]
d = max(abs(a - b) for a, b in zip(full[len(full) - len(resumed):], resumed))
print(f"world {j['world_at_start']} -> {j['world']}, {j['restarts']} restart, steps"
      f" {len(full) - len(resumed) + 1}-{len(full)}: largest loss difference {d:.3g} (tolerance 1e-5)")
sys.exit(0 if d <= 1e-5 and j["world"] < j["world_at_start"] else 1)
PY
}

# one_restart JSON: the report has the cost keys of docs/json.md, and 1 restart
one_restart() {
    "$python" -c '
import json, sys
j = json.load(open(sys.argv[1]))
keys = "max_restarts restarts elastic world_at_start lost_steps restart_seconds detect_seconds relaunch_seconds load_seconds".split()
sys.exit(0 if all(k in j for k in keys) and j["restarts"] == 1 else 1)' "$1"
}

# the line of ./run that PATTERN matches, in TAG.err
said() { grep -m 1 -- "$2" "$work/$1.err"; }

# 6. --elastic: rank 3 gone for good at step 5; the job goes on with fewer ranks
elastic() {   # elastic NAME PROGRAM STRATEGY FLAGS...
    local name=$1 program=$2 strategy=$3
    shift 3
    job "$strategy-full" "$backend" "$build/$program" 4 $model "$@" &&
        job "$strategy-elastic" "$backend" "$build/$program" 4 $model "$@" --save "$work/el-$strategy" \
            --save-every 2 --max-restarts 1 --elastic --test-fail-step 5 --test-fail-rank 3 \
            --test-fail-gone
    local status=$? out
    out=$(losses_close "$work/$strategy-full.json" "$work/$strategy-elastic.json" "$strategy" 2>&1)
    local same=$?
    verdict "elastic $name, rank 3 gone" $([ $status -eq 0 ] && [ $same -eq 0 ]; echo $?) "$out"
}

# on_ranks TAG FLAGS...: chapter 1 on loop_checks' backend and ranks; its files TAG-BACKEND
on_ranks() {
    local tag=$1
    shift
    job "$tag-$backend" "$backend" "$build/chapter1" "$ranks" "$@"
}

# The loop's own decisions, on BACKEND with RANKS ranks of chapter 1 (FULL: the final
# checkpoint DIR of the uninterrupted DDP run; FLAGS: what it ran with besides $model)
loop_checks() {   # loop_checks BACKEND RANKS FULL FLAGS...
    local backend=$1 ranks=$2 full=$3 status out same
    shift 3
    local ddp="$model --strategy ddp $* --save-every 2 --max-restarts 2" on="($backend)"
    local b=$backend
    # a. --save DIR holds another job's checkpoint (4 steps at another --lr); this job
    # fails before its own first save: it starts again from step 0, not from that one
    on_ranks other $model --strategy ddp "$@" --steps 4 --lr 2e-3 --save "$work/foreign-$b"
    on_ranks foreign $ddp --save-every 4 --save "$work/foreign-$b" --test-fail-step 3 \
        --test-fail-rank 1
    status=$?
    out=$(same_tensors "$full" "$work/foreign-$b")
    same=$?
    verdict "another job's checkpoint in --save DIR is never resumed $on" \
        $([ $status -eq 0 ] && [ $same -eq 0 ] && said "foreign-$b" 'resuming from step 0' >/dev/null &&
          said "foreign-$b" "another job's checkpoint (step-000004)" >/dev/null; echo $?) \
        "exit $status; $out; $(said "foreign-$b" 'run: warning' | cut -c1-80)"

    # b. a failure that a restart would meet again (a diverged loss: exit 1) is not restarted
    on_ranks diverged $ddp --save "$work/diverged-$b" --lr 1e30
    status=$?
    verdict "a diverged loss is not restarted $on" \
        $([ $status -eq 1 ] && ! said "diverged-$b" 'run: restart' >/dev/null &&
          [ "$(grep -c 'training diverged' "$work/diverged-$b.err")" -eq 1 ] &&
          said "diverged-$b" 'run: not restarting' >/dev/null; echo $?) \
        "exit $status: $(said "diverged-$b" 'run: not restarting' | cut -c1-80)"

    # e. bad input with --max-restarts --save: one attempt, exit 2, the program's one line
    on_ranks refused $ddp --save "$work/refused-$b" --batch 7
    status=$?
    out="$(wc -l <"$work/refused-$b.err") line(s): $(head -c 80 "$work/refused-$b.err")"
    verdict "bad input with --max-restarts --save DIR is not restarted $on" \
        $([ $status -eq 2 ] && [ "$(wc -l <"$work/refused-$b.err")" -eq 1 ]; echo $?) \
        "exit $status, $out"

    # ... also into a DIR holding another job's checkpoint: the refusal alone, no warning
    on_ranks refused-foreign $ddp --save "$work/foreign-$b" --batch 7
    status=$?
    out="$(wc -l <"$work/refused-foreign-$b.err") line(s): $(head -c 80 "$work/refused-foreign-$b.err")"
    verdict "bad input into another job's --save DIR says only why $on" \
        $([ $status -eq 2 ] && [ "$(wc -l <"$work/refused-foreign-$b.err")" -eq 1 ]; echo $?) \
        "exit $status, $out"

    # d. a refused run leaves nothing it made: no DIR (through the loop or not), and in a
    # DIR that was there, no restart-progress
    mkdir "$work/kept-$b"
    on_ranks refused-kept $ddp --batch 7 --save "$work/kept-$b"
    on_ranks refused-direct $model --strategy ddp --batch 7 --save "$work/direct-$b"
    out=$(ls -d "$work/refused-$b" "$work/direct-$b" "$work/kept-$b"/* 2>/dev/null)
    verdict "a refused run leaves nothing behind $on" $([ -z "$out" ]; echo $?) \
        "left: $(echo "$out" | xargs -r -n 1 basename | tr '\n' ' ')"
}

# f. the cost of a restart by hand: add_cost (tools/restart-loop.sh) fed known numbers,
# then a job failing twice (a stand-in program that stamps its own times) whose last
# attempt is handed the relaunch time it must report
cost_checks() {
    local out want="2 0.500 3.250 0.350 | 0 0.300 0 0 | 0 0 2.500 0"
    # shellcheck disable=SC2034   # add_cost's inputs
    out=$(. tools/restart-loop.sh
          restarts=1 lost=0 detect=0 relaunch=0.5 load=0.1 previous_exit=100 from=4 step=6
          first=103 load_now=0.25 failed_at=110 last_step_at=109; add_cost 110.5
          echo -n "$lost $detect $relaunch $load | "
          restarts=0 lost=0 detect=0 relaunch=0 load=0 from=0 step=0 failed_at="" last_step_at=9.7
          add_cost 10; echo -n "$lost $detect $relaunch $load | "
          restarts=2 lost=0 detect=0 relaunch=0 load=0 first="" failed_at="" last_step_at=""
          previous_exit=7.5; add_cost 10; echo "$lost $detect $relaunch $load")
    verdict "add_cost by hand: lost, detect, relaunch less the load, load" \
        $([ "$out" = "$want" ]; echo $?) "'$out' (want '$want')"

    # the stand-in: each attempt's first step 1 s after the failed job ended, 0.25 s of it
    # loading; the first two attempts lose a rank (exit 75)
    cat >"$work/twice" <<'SH'
#!/bin/bash
while [ $# -gt 0 ]; do
    case $1 in --save) dir=$2 ;; --restart-attempt) attempt=$2 ;; --restart-record) record=$2 ;; esac
    shift
done
set -- $record   # restarts lost detect relaunch load previous_exit world_at_start
echo "$attempt $*" >>"$dir/records"
now=$(date +%s.%N)
first=$(awk "BEGIN { printf \"%.6f\", ($6 > 0 ? $6 + 1 : $now) }")
printf '%-127s\n' "attempt $attempt first_step $first load 0.25 step 3 at $now" >"$dir/restart-progress"
[ "$attempt" -ge 2 ]
exit $(($? ? 75 : 0))
SH
    chmod +x "$work/twice"
    mkdir "$work/twice-dir"
    job twice threads "$(realpath --relative-to=. "$work/twice")" 2 --save "$work/twice-dir" \
        --max-restarts 2
    local status=$? last
    last=$(tail -n 1 "$work/twice-dir/records")
    # the record the third attempt got: 2 restarts, the second attempt's relaunch 1 s less
    # its 0.25 s load (the first attempt's is no restart's; the third counts its own)
    verdict "a job failing twice: relaunch less the load" \
        $([ $status -eq 0 ] && [ "$(echo "$last" | cut -d ' ' -f 2,5,6)" = "2 0.750 0.250" ]; echo $?) \
        "exit $status; the last attempt's record: $last"
}

# b. which exit statuses the loop restarts (curable, tools/restart-loop.sh): a rank lost
# (75) or a process killed from outside, not the job's own failure nor a crash of its own
rule_checks() {
    local status out="" want="1:no 2:no 75:yes 134:no 137:yes 139:no 143:yes"
    for status in 1 2 75 134 137 139 143; do
        out="$out $status:$(. tools/restart-loop.sh; curable $status && echo yes || echo no)"
    done
    verdict "the exit statuses restarted: $want" $([ "${out# }" = "$want" ]; echo $?) "${out# }"
}

threads_checks() {
    # 1. a rank SIGKILLed at a random step, threads: exit 0, the same final tensors
    ddp="--strategy ddp --save-every 2 --max-restarts 2"
    job full threads "$build/chapter1" 4 $model --strategy ddp --save "$work/full"
    kill_step=$((3 + RANDOM % 6))   # 3 .. 8
    kill_rank=$((RANDOM % 4))
    job killed threads "$build/chapter1" 4 $model $ddp --save "$work/killed" \
        --test-fail-step $kill_step --test-fail-rank $kill_rank
    status=$?
    out=$(same_tensors "$work/full" "$work/killed")
    same=$?
    verdict "DDP x4, rank $kill_rank SIGKILLed at step $kill_step (threads)" \
        $([ $status -eq 0 ] && [ $same -eq 0 ] && one_restart "$work/killed.json"; echo $?) \
        "exit $status; $out; $(said killed 'run: restart 1')"

    # 2. negative control: the restart resumes one step late (comm_abort on rank 2 at step 5)
    job skewed threads "$build/chapter1" 4 $model $ddp --save "$work/skewed" --test-fail-step 5 \
        --test-fail-rank 2 --test-fail-how abort --test-resume-skew 1
    if out=$(same_tensors "$work/full" "$work/skewed"); then
        failed=$((failed + 1)); echo "FAIL negative control passed: $out"
    else
        passed=$((passed + 1)); echo "ok   negative control (resumed from the wrong step) fails as it must: $out"
    fi

    # 3. a failure during a save (of step 4, before its rename): from step 2 again, and the
    # half-written checkpoint is never loaded (the next save removes it)
    job part threads "$build/chapter1" 4 $model --strategy ddp --steps 2 --save "$work/in-save"
    job in-save threads "$build/chapter1" 4 $model $ddp --save "$work/in-save" \
        --resume "$work/in-save/step-000002" --save-test-crash 20
    status=$?
    out=$(same_tensors "$work/full" "$work/in-save")
    same=$?
    verdict "a failure during the save of step 4" \
        $([ $status -eq 0 ] && [ $same -eq 0 ] && said in-save 'resuming from step 2' >/dev/null &&
          ! ls -a "$work/in-save" | grep -q '^\.tmp'; echo $?) \
        "exit $status; $out; $(said in-save 'run: restart 1')"

    # 4. a failure before the first save (comm_abort: the in-process failure path): from step 0
    job early threads "$build/chapter1" 4 $model $ddp --save-every 4 --save "$work/early" \
        --test-fail-step 3 --test-fail-rank 1 --test-fail-how abort
    status=$?
    out=$(same_tensors "$work/full" "$work/early")
    same=$?
    verdict "a failure before the first save" \
        $([ $status -eq 0 ] && [ $same -eq 0 ] && said early 'resuming from step 0' >/dev/null; echo $?) \
        "exit $status; $out; $(said early 'run: restart 1')"

    # 5. a rank that fails on every attempt: K restarts, then exit non-zero and why
    job beyond threads "$build/chapter1" 4 $model $ddp --save "$work/beyond" --test-fail-step 3 \
        --test-fail-rank 1 --test-fail-attempts 9
    status=$?
    line=$(said beyond 'run: giving up')
    verdict "restarts beyond --max-restarts 2" \
        $([ $status -ne 0 ] && [ $status -ne 2 ] && [ -n "$line" ] &&
          [ "$(grep -c 'run: restart' "$work/beyond.err")" -eq 2 ]; echo $?) "exit $status: $line"

    # a rank gone for good without --elastic: no restart on ranks that are not there
    job stranded threads "$build/chapter1" 4 $model $ddp --save "$work/stranded" \
        --test-fail-step 3 --test-fail-rank 1 --test-fail-gone
    status=$?
    line=$(said stranded 'run: giving up')
    verdict "a rank gone for good without --elastic" \
        $([ $status -ne 0 ] && [ -n "$line" ] && ! said stranded 'run: restart' >/dev/null; echo $?) \
        "exit $status: $line"

    loop_checks threads 4 "$work/full"
    cost_checks
    rule_checks

    elastic "DDP x4" chapter1 ddp --strategy ddp
    elastic "ZeRO-3 x4" chapter2 zero3 --stage 3
    elastic "TP 2 x DP 2" chapter3 tp --tp 2 --part train
    elastic "PP 2 x DP 2" chapter4 pp-1f1b --pp 2 --schedule 1f1b --micro 4
    # c. chapter 4's default model (no --layers): with --max-restarts its depth does not
    # follow the rank count, so its checkpoint loads on the 3 ranks left
    local c4="--dim 32 --heads 2 --ctx 16 --batch 8 --steps 4 --stage-ms 0 --quiet --json"
    job pp-1f1b-full threads "$build/chapter4" 4 $c4 --layers 4 &&
        job pp-1f1b-default threads "$build/chapter4" 4 $c4 --save "$work/el-default" \
            --save-every 2 --max-restarts 1 --elastic --test-fail-step 3 --test-fail-rank 3 \
            --test-fail-gone
    status=$?
    out=$(losses_close "$work/pp-1f1b-full.json" "$work/pp-1f1b-default.json" pp-1f1b 2>/dev/null)
    same=$?
    verdict "elastic chapter 4 with its default depth, rank 3 gone" \
        $([ $status -eq 0 ] && [ $same -eq 0 ]; echo $?) "exit $status; $out$(said pp-1f1b-default 'run: giving up')"

    # its negative control: the DDP restart resuming one step late leaves the tolerance
    job ddp-late threads "$build/chapter1" 4 $model $ddp --save "$work/el-late" --max-restarts 1 \
        --elastic --test-fail-step 5 --test-fail-rank 3 --test-fail-gone --test-resume-skew 1
    if out=$(losses_close "$work/ddp-full.json" "$work/ddp-late.json" ddp); then
        failed=$((failed + 1)); echo "FAIL negative control passed: $out"
    else
        passed=$((passed + 1)); echo "ok   negative control (elastic, resumed one step late) fails as it must: $out"
    fi

}

# 7. Open MPI: rank 1's process SIGKILLed, then a stuck one; fresh mpiruns, same hostfile
mpi_checks() {
    echo "localhost slots=8" >"$work/hosts"
    export MPIRUN_ARGS="--hostfile $work/hosts ${MPIRUN_ARGS:-}"
    local ddp="--strategy ddp --save-every 2 --max-restarts 2" status same out how kill_step
    job mpi-full mpi "$build/chapter1" 3 $model --strategy ddp --batch 6 --save "$work/mpi-full"
    for how in kill stop; do
        kill_step=$((3 + RANDOM % 6))
        job "mpi-$how" mpi "$build/chapter1" 3 $model $ddp --batch 6 --save "$work/mpi-$how" \
            --test-fail-step $kill_step --test-fail-rank 1 --test-fail-how $how --comm-timeout 1
        status=$?
        out=$(same_tensors "$work/mpi-full" "$work/mpi-$how")
        same=$?
        verdict "DDP x3, rank 1's process $([ $how = kill ] && echo SIGKILLed || echo stuck) at step $kill_step (Open MPI, --hostfile)" \
            $([ $status -eq 0 ] && [ $same -eq 0 ] && said "mpi-$how" 'run: restart 1' >/dev/null; echo $?) \
            "exit $status; $out; $(said "mpi-$how" 'was killed by signal 9\|it was stopped' | cut -c1-90); $(said "mpi-$how" 'run: restart 1')"
    done
    loop_checks mpi 3 "$work/mpi-full" --batch 6
    elastic "ZeRO-3 x4 (Open MPI)" chapter2 zero3 --stage 3
}

# 8. a program that runs several strategies (chapter 2's --stage 3: ZeRO-0, then ZeRO-3)
# killed in either: each resumes from its own newest checkpoint (DIR/latest-STRATEGY), one
# that had finished trains nothing more, and both final checkpoints equal the
# uninterrupted run's bit for bit, with no step saved twice (step-NNNNNN-2)
own_checkpoint_checks() {   # own_checkpoint_checks STRATEGY...: kill in each in turn
    local stages="--stage 3 --save-every 2" in status same out
    job own-full "$backend" "$build/chapter2" 4 $model $stages --save "$work/own-full"
    for in in "$@"; do
        job "own-$in" "$backend" "$build/chapter2" 4 $model $stages --save "$work/own-$in" \
            --max-restarts 1 --test-fail-step 5 --test-fail-rank 1 --test-fail-strategy "$in"
        status=$?
        out=$(for s in zero0 zero3; do
                  printf '%s: ' $s; same_tensors "$work/own-full" "$work/own-$in" "latest-$s" || echo FAILED
              done)
        same=$(printf '%s' "$out" | grep -c 'bit for bit equal')
        verdict "chapter 2 --stage 3 x4, rank 1 SIGKILLed at step 5 of $in ($backend)" \
            $([ $status -eq 0 ] && [ "$same" -eq 2 ] && one_restart "$work/own-$in.json" &&
              ! ls "$work/own-$in" | grep -q -- '-2$'; echo $?) \
            "exit $status; $(echo $out); $(said "own-$in" 'run: restart 1')"
    done
}

# ... and killed in ZeRO-3 before its first save, after ZeRO-0 had finished: ./run says
# it resumes ZeRO-3 from step 0, with its steps lost, not from ZeRO-0's last (DIR/latest)
own_checkpoint_unsaved_check() {
    job own-unsaved "$backend" "$build/chapter2" 4 $model --stage 3 --save-every 2 \
        --save "$work/own-unsaved" --max-restarts 1 --test-fail-step 2 --test-fail-rank 1 \
        --test-fail-strategy zero3
    local status=$? line
    line=$(said own-unsaved 'run: restart 1')
    verdict "chapter 2 --stage 3 x4, killed in ZeRO-3 before its first save: from its step 0" \
        $([ $status -eq 0 ] && [[ "$line" == *"resuming from step 0 on 4 rank(s); 1 step(s) of work lost" ]]
          echo $?) "exit $status; $line"
}

# ... and a strategy whose name follows its layout (chapter 3's tp+dp is tp on 2 ranks)
# still resumes after --elastic: from the newest checkpoint, step 4, not from step 0
own_checkpoint_renamed_check() {
    job own-tp "$backend" "$build/chapter3" 4 $model --tp 2 --part train --save "$work/own-tp" \
        --save-every 2 --max-restarts 1 --elastic --test-fail-step 5 --test-fail-rank 3 \
        --test-fail-gone
    local status=$? resumed
    resumed=$("$python" -c 'import json, sys
print(" ".join("%s:%d" % (r["strategy"], len(r["loss"])) for r in json.load(open(sys.argv[1]))["runs"]))' \
        "$work/own-tp.json" 2>&1)
    verdict "chapter 3 tp+dp x4 -> tp x2 (--elastic) resumes from tp+dp's step 4" \
        $([ $status -eq 0 ] && [ "$resumed" = "baseline:8 tp:4" ]; echo $?) \
        "exit $status; losses per run: $resumed"
}

if [ "$backend" = mpi ]; then
    mpi_checks
    own_checkpoint_checks zero3
else
    threads_checks
    own_checkpoint_checks zero0 zero3
    own_checkpoint_unsaved_check
    own_checkpoint_renamed_check
fi
echo "restart-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
