# Sourced by ./run for `./run N [flags] --save DIR --max-restarts K [--elastic]`:
# restart_loop N FLAGS... runs the job (run_once, ./run's), and after each failure that
# a restart may cure starts it again from its latest save in DIR, up to K times
# (common/train/restart.h, docs/restarts.md).
#
# Why a loop out here, not in the program: a SIGKILL (the OOM killer, a lost node, the
# test hook) takes the whole threads process with it, and under Open MPI a dead rank
# takes its mpirun job: only a parent outside the job survives to start it again. A
# fresh process also means a clean state (no rank stopped half-way through a library
# call, MPI initialised afresh), which is what torchrun does with its workers too.
#
# Each attempt is told --restart-attempt k and --restart-record "restarts lost detect
# relaunch load previous_exit world_at_start" (the cost so far, for its report); it
# writes DIR/restart-progress, which says after a failure which step was done last,
# when, and whether the failed rank is gone for good.
#
# Only what a restart may cure is restarted: a process killed by a signal, or exit 75, a
# rank lost or stuck (curable). A restart resumes only this job's own saves (next_resume).

# calc EXPR: floating-point arithmetic, 3 decimals
calc() { awk "BEGIN { printf \"%.3f\", $* }"; }

# checkpoint_step PATH: the step of checkpoint PATH (DIR/step-NNNNNN[-k], or a DIR whose
# latest names one); empty when PATH names none
checkpoint_step() {
    local name=${1%/}
    [ -f "$name/latest" ] && name=$(cat "$name/latest")
    name=${name##*/}
    name=${name#step-}
    name=${name%%-*}
    case "$name" in '' | *[!0-9]*) return 0 ;; esac
    echo $((10#$name))
}

# saves_in DIR: the checkpoints DIR holds, one name a line (step-NNNNNN[-k])
saves_in() { ls -1 -- "$1" 2>/dev/null | grep '^step-' || true; }

# field FILE LINE NAME: the value after NAME on line LINE of DIR/restart-progress
field() {
    sed -n "$2p" "$1" 2>/dev/null | awk -v k="$3" '{ for (i = 1; i < NF; i++) if ($i == k) print $(i + 1) }'
}

# why STATUS: what the exit status says (comm.h's COMM_EXIT_*)
why() {
    if [ "$1" -gt 128 ]; then
        echo "exit $1: killed by signal $(($1 - 128)) ($(kill -l $(($1 - 128)) 2>/dev/null || echo ?))"
    elif [ "$1" -eq 75 ]; then
        echo "exit 75: a rank lost or stuck"
    else
        echo "exit $1"
    fi
}

# curable STATUS: whether a fresh start may cure what ended the job: 75, a rank lost or
# stuck past --comm-timeout (COMM_EXIT_RANK_LOST), or a process killed from outside by a
# signal (the OOM killer, a lost node, a preemption). Not a process that crashed itself
# (SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV: a bug), nor exit 1, the job's own failure (a
# diverged loss, a failed comparison, a collective mismatch, a full disk): the same job
# meets them again; 2 is bad input.
curable() {
    case "$1" in
        75) return 0 ;;
        132 | 134 | 135 | 136 | 139) return 1 ;;
    esac
    [ "$1" -gt 128 ]
}

# layout_refusal N ARGS...: the program's line refusing these flags on N ranks
layout_refusal() {
    local n=$1
    shift
    RUN_LAYOUT_PROBE=1 "$program" --ranks "$n" "$@" 2>&1 >/dev/null | head -n 1
}

# largest_layout MOST ARGS...: the most ranks, at most MOST, that the program accepts
# with these flags (it answers before starting any rank: RUN_LAYOUT_PROBE in launch.c)
largest_layout() {
    local n=$1
    shift
    while [ "$n" -ge 1 ]; do
        if RUN_LAYOUT_PROBE=1 "$program" --ranks "$n" "$@" >/dev/null 2>&1; then
            echo "$n"
            return 0
        fi
        n=$((n - 1))
    done
    return 1
}

# restart_flags FLAGS...: args (the flags less --resume: each attempt gets its own),
# resume (the user's --resume, every one given: the program refuses one given twice, as
# without the loop), save, most (K) and elastic
restart_flags() {
    args=() resume=() save="" most="" elastic=0
    local i=1 a next value
    while [ $i -le $# ]; do
        a=${!i} next=$((i + 1))
        value=${!next:-}
        case "$a" in
            --save) save=$value ;;
            --save=*) save=${a#--save=} ;;
            --max-restarts) most=$value ;;
            --max-restarts=*) most=${a#--max-restarts=} ;;
            --elastic) elastic=1 ;;
        esac
        case "$a" in
            --resume) resume+=(--resume "$value"); i=$((i + 2)); continue ;;
            --resume=*) resume+=("$a"); i=$((i + 1)); continue ;;
        esac
        args+=("$a")
        i=$((i + 1))
    done
}

# read_failure PROGRESS: what the failed attempt wrote (restart.c): step (the last done
# by every rank) of strategy (the training loop that ran then: a chapter may run several
# one after another), first (its first step's start), load_now, and from the failing rank,
# when it said so: failed_rank, failed_at, failed_step and gone
read_failure() {
    step=$(field "$1" 1 step); step=${step:-0}
    strategy=$(field "$1" 1 strategy)
    first=$(field "$1" 1 first_step)
    load_now=$(field "$1" 1 load)
    last_step_at=$(field "$1" 1 at)
    failed_rank=$(field "$1" 2 rank)
    failed_at=$(field "$1" 2 at)
    failed_step=$(field "$1" 2 step)
    gone=$(field "$1" 2 gone); gone=${gone:-0}
    # a rank that fails as step K starts has seen step K - 1 end on every rank
    if [ -n "$failed_step" ] && [ $((failed_step - 1)) -gt "$step" ]; then
        step=$((failed_step - 1))
    fi
}

# next_resume: from and from_text, the step the next attempt starts after (for the
# report): the failed strategy's latest save in DIR (DIR/latest-STRATEGY; DIR/latest may
# be another strategy's, one that had finished), else the job's own --resume, else the
# start.
# The next attempt keeps the job's own --resume: told it is a restart, the program resumes
# each strategy from its own newest checkpoint in DIR (DIR/latest-STRATEGY), never one
# that DIR held as the job began (--restart-saves-before: another job's; a save never
# reuses a name), else as the job began.
next_resume() {
    local name
    name=$(cat "$save/latest${strategy:+-$strategy}" 2>/dev/null)
    if [ -n "$name" ] && ! grep -qxF -- "$name" <<<"$saves_before"; then
        from=$(checkpoint_step "$save/$name")
        from_text="step $from"
        return
    fi
    if [ ${#resume[@]} -eq 0 ]; then
        from=0 from_text="step 0"
        return
    fi
    from=$(checkpoint_step "${resume[-1]#--resume=}")
    from_text="step $from"
    [ -n "$from" ] || from_text="the checkpoint of ${resume[*]}"
}

# warn_foreign: one line when DIR holds a checkpoint that this job does not go on from
# (its --resume names neither DIR nor a checkpoint in it): another job's. Not for flags
# the program refuses: then its own line is the only one (it answers the layout probe
# before any rank starts)
warn_foreign() {
    local name value there
    name=$(cat "$save/latest" 2>/dev/null)
    [ -n "$name" ] || return 0
    there=$(realpath -m -- "$save")
    if [ ${#resume[@]} -gt 0 ]; then
        value=${resume[-1]#--resume=}
        [ "$(realpath -m -- "$value")" = "$there" ] && return 0
        [ "$(realpath -m -- "$(dirname -- "$value")")" = "$there" ] && return 0
    fi
    RUN_LAYOUT_PROBE=1 "$program" --ranks "$world" "${args[@]}" "${resume[@]}" \
        --restart-attempt 0 --restart-record "0 0 0 0 0 0 $world" >/dev/null 2>&1 || return 0
    echo "run: warning: --save $save holds another job's checkpoint ($name): this job's" \
         "restarts resume only its own saves, which move $save/latest on (to go on from" \
         "that job instead: --resume $save)" >&2
}

# add_cost END: this failure's lost steps, detection and (for an attempt that was itself
# a restart) relaunch and load, added to the totals
add_cost() {
    lost_now=0
    [ -n "$from" ] && [ "$step" -gt "$from" ] && lost_now=$((step - from))
    lost=$((lost + lost_now))
    local failed_when=${failed_at:-$last_step_at}   # else: the last step's end
    [ -n "$failed_when" ] && detect=$(calc "$detect + $1 - $failed_when")
    [ $restarts -gt 0 ] || return 0
    if [ -n "$first" ]; then
        relaunch=$(calc "$relaunch + $first - $previous_exit - $load_now")
        load=$(calc "$load + $load_now")
    else
        relaunch=$(calc "$relaunch + $1 - $previous_exit")
    fi
}

# next_world: the ranks of the next attempt (fewer with --elastic when a rank is gone for
# good); returns non-zero, after a line saying why, when there is no going on
next_world() {
    if [ "$restarts" -ge "$most" ]; then
        echo "run: giving up: $what after $restarts restart(s), and --max-restarts $most" \
             "allows no more; the latest checkpoint is $from_text of $save" >&2
        return 1
    fi
    [ "$gone" -gt 0 ] || return 0
    if [ $elastic -eq 0 ]; then
        echo "run: giving up: $what and rank $failed_rank is gone for good; --elastic would" \
             "go on with the $((world - gone)) ranks left" >&2
        return 1
    fi
    local left=$((world - gone)) probe
    probe=("${args[@]}" "${resume[@]}" --restart-attempt $((restarts + 1)) --restart-record "$record")
    if ! world=$(largest_layout $left "${probe[@]}"); then
        echo "run: giving up: $what, and no layout of this job fits the $left rank(s) left;" \
             "on $left: $(layout_refusal $left "${probe[@]}")" >&2
        return 1
    fi
}

# not_restarting STATUS: why the loop ends on a failure that a restart would meet again
not_restarting() {
    if [ "$1" -eq 2 ]; then   # bad input: the program's line says why
        [ "$restarts" -eq 0 ] ||
            echo "run: giving up: restart $restarts was refused (exit 2: the line above says why)" >&2
        return 0
    fi
    echo "run: not restarting: the job failed ($(why "$1")): its own failure (a diverged" \
         "loss, a failed comparison, a crash, ...), which a restart would meet again; a" \
         "restart cures a rank lost or stuck (killed from outside, or exit 75)" >&2
}

restart_loop() {
    local world=$1 start_world=$1
    shift
    local args resume save most elastic
    restart_flags "$@"
    set +e
    case "$most" in ''|*[!0-9]*) run_once "$world" "$@"; return ;; esac   # the program says why
    [ -n "$save" ] || { run_once "$world" "$@"; return; }
    local restarts=0 lost=0 detect=0 relaunch=0 load=0 previous_exit=0 interrupted=0
    local progress=$save/restart-progress record status end before what
    local step strategy first load_now last_step_at failed_rank failed_at failed_step gone
    local from from_text lost_now saves_before
    saves_before=$(saves_in "$save")   # another job's: never resumed
    [ -n "$saves_before" ] && args+=(--restart-saves-before "$(paste -sd ' ' <<<"$saves_before")")
    warn_foreign
    trap 'interrupted=1' INT TERM
    while :; do
        record="$restarts $lost $detect $relaunch $load $previous_exit $start_world"
        # the attempt writes it afresh (restart.c; and DIR, which a refused run never gets)
        rm -f -- "$progress"
        run_once "$world" "${args[@]}" "${resume[@]}" --restart-attempt "$restarts" \
            --restart-record "$record"
        status=$?
        end=$(date +%s.%N)
        [ $status -eq 0 ] && { restart_summary "$progress" "$most"; return 0; }
        [ $interrupted -eq 1 ] && return $status
        curable $status || { not_restarting $status; return $status; }
        read_failure "$progress"
        next_resume
        add_cost "$end"
        what="the job failed ($(why $status))"
        [ -n "$failed_rank" ] && what="rank $failed_rank failed ($(why $status))"
        before=$world
        next_world || return $status
        restarts=$((restarts + 1))
        previous_exit=$end
        echo "run: restart $restarts of $most: $what $([ -n "$failed_step" ] &&
             echo "at step $failed_step" || echo "after step $step, the last done");" \
             "resuming from $from_text on $world rank(s)$([ "$world" != "$before" ] &&
             echo " (was $before: $gone gone for good)"); $lost_now step(s) of work lost" >&2
    done
}

# restart_summary PROGRESS K: the last attempt's totals (line 3), in one line
restart_summary() {
    local n l d r ld
    n=$(field "$1" 3 restarts)
    [ -n "$n" ] || return 0
    l=$(field "$1" 3 lost); d=$(field "$1" 3 detect); r=$(field "$1" 3 relaunch); ld=$(field "$1" 3 load)
    if [ "$n" -eq 0 ]; then
        echo "run: completed without a restart (--max-restarts $2)" >&2
    else
        echo "run: completed after $n restart(s) of $2 allowed: $l step(s) of work lost;" \
             "$(calc "$d + $r + $ld") s to restart: detect $d s, relaunch $r s, load $ld s" >&2
    fi
}
