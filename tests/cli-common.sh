# Sourced by the command-line checks (tests/cli-checks.sh, the flags every program
# shares, ./run and its Open MPI processes; tests/cli-chapter-checks.sh, each program's
# own flags): bad input must give one clear error line naming the value, and exit status
# 2, before any rank starts. Usage of both: SCRIPT BUILD_DIR [mpi]
# With "mpi" (BUILD_DIR an MPI=1 build), every program runs as 2 Open MPI processes
# through ./run, and the checks whose answer depends on the rank count are left out.
# Gives them: build, mpi, programs, every_program, scratch, short, tiny, the tallies
# passed and failed, the checks (expect_*) and cli_finish.
set -u
cd "$(dirname "$0")/.."
build=${1:-build/cpu}
mpi=${2:-}
passed=0
failed=0
short=$(mktemp)
head -c 20 /etc/hostname >"$short" 2>/dev/null || printf 'too short' >"$short"
scratch=$(mktemp -d)   # a FIFO, a directory, an unwritable place for outputs
mkfifo "$scratch/fifo"
programs=$build
if [ "$mpi" = mpi ]; then   # a wrapper per program: ./run 2 with RUN_LAST naming it
    # A rank that refuses its flags exits without MPI_Finalize; mpirun then waits its
    # SIGTERM-to-SIGKILL grace (1 s) before it exits too. Nothing is left to clean up
    # here, so the checks skip that second (60 cases: a minute of make test).
    export MPIRUN_ARGS="--mca odls_base_sigkill_timeout 0"
    programs=$scratch/mpi
    mkdir -p "$programs"
    for program in "$build"/baseline "$build"/chapter*; do
        [ -x "$program" ] || continue
        name=$(basename "$program")
        ranks=2
        [ "$name" = baseline ] && ranks=1   # the baseline runs on one rank only
        printf '%s\nmpi\n' "$program" >"$programs/$name.last"
        printf '#!/bin/bash\nRUN_LAST=%q exec %q %d "$@"\n' "$programs/$name.last" "$PWD/run" \
            $ranks >"$programs/$name"
        chmod +x "$programs/$name"
    done
fi
# a model small enough that a run of a few steps takes well under a second
# (tiny2: the same with 2 layers; a flag is given once, so a case that needs another
# value writes the list out)
tiny="--layers 1 --dim 16 --heads 2 --ctx 8 --batch 8 --steps 3 --quiet"
tiny2="--layers 2 --dim 16 --heads 2 --ctx 8 --batch 8 --steps 3 --quiet"

# expect_status PROGRAM STATUS PATTERN ARGS...: exit STATUS, exactly one stderr line
# matching PATTERN (grep's basic expressions)
expect_status() {
    local program=$1 want=$2 pattern=$3
    shift 3
    local err status
    err=$("$program" "$@" 2>&1 >/dev/null)
    status=$?
    local lines
    lines=$(printf '%s\n' "$err" | grep -c .)
    if [ $status -eq "$want" ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -q -- "$pattern"; then
        passed=$((passed + 1))
        echo "ok   $(basename "$program") $*  ->  $err"
    else
        failed=$((failed + 1))
        echo "FAIL $(basename "$program") $*  (status $status, expected $want; $lines lines): $err"
    fi
}
# expect_error PROGRAM PATTERN ARGS...: bad input, refused with exit 2
expect_error() {
    local program=$1
    shift
    expect_status "$program" 2 "$@"
}
# expect_training_error PROGRAM PATTERN FLAG ARGS...: as expect_error for a program that
# trains; the planner (chapter 6), which trains nothing, refuses FLAG by name instead
expect_training_error() {
    local program=$1 pattern=$2
    shift 2
    [ "$(basename "$program")" = chapter6 ] && pattern="$1 does nothing in chapter6"
    # chapter 12 prints the tables of many runs: no JSON or trace of one
    case "$(basename "$program") $1" in
        "chapter12 --trace" | "chapter12 --json") pattern="$1 does nothing in chapter12" ;;
    esac
    expect_error "$program" "$pattern" "$@"
}

# Under MPI each case starts mpirun (about 1.5 s): the flag cases run on chapter 1 only,
# which parses them with the same code as every program.
every_program=("$programs"/baseline "$programs"/chapter*)
[ "$mpi" = mpi ] && every_program=("$programs"/chapter1)
# expect_ok PROGRAM ARGS...: the program accepts ARGS and exits 0
expect_ok() {
    local program=$1
    shift
    local out status
    out=$("$program" "$@" 2>&1)
    status=$?
    if [ $status -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok   $(basename "$program") $*  ->  exit 0"
    else
        failed=$((failed + 1))
        echo "FAIL $(basename "$program") $*  (status $status): $out"
    fi
}
# mixed_programs PROGRAM...: the programs among them that a run of these scripts checks:
# under MPI (about 1.5 s a case) chapter 1 alone answers for the flags every program
# parses with the same code
mixed_programs() {
    if [ "$mpi" = mpi ]; then
        for p in "$@"; do [ "$(basename "$p")" = chapter1 ] && echo "$p"; done
    else
        printf '%s\n' "$@"
    fi
}
# cli_finish NAME: removes the scratch files, prints the tally, and fails if a check did
cli_finish() {
    rm -f "$short"
    rm -rf "$scratch"
    echo "$1: $passed passed, $failed failed"
    [ $failed -eq 0 ]
}
