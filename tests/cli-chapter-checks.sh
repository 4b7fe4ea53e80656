#!/bin/bash
# Each program's own flags and modes (chapters 1-10, the baseline's --trace, --resume of
# a checkpoint that cannot be used): refused before any rank starts with one line naming
# the value and exit status 2, and the outputs and README commands that must run. The
# flags every program shares: tests/cli-checks.sh; the checks: tests/cli-common.sh.
# Usage: tests/cli-chapter-checks.sh BUILD_DIR [mpi]
. "$(dirname "$0")/cli-common.sh"
[ -x "$programs"/baseline ] && expect_error "$programs"/baseline "the baseline has no ranks or communication to trace" --trace "$scratch/t.json"
chapter1="$programs"/chapter1
if [ -x "$chapter1" ] && [ -z "$mpi" ]; then   # --ranks is mpirun's -np under MPI
    expect_error "$chapter1" "(try --batch 268435456)" --ranks 4096 --grad-accum 65536 --batch 8
    expect_error "$chapter1" "--ranks 4096 x --grad-accum 300000 = 1228800000 sequences a step at least: more than the largest --batch 1000000000" --ranks 4096 --grad-accum 300000
fi
# under Open MPI the rank count is mpirun's -np: a --ranks of the user's is refused, not ignored
[ -x "$chapter1" ] && [ "$mpi" = mpi ] && expect_error "$chapter1" \
    "--ranks 4 does nothing under Open MPI: the ranks are mpirun's 2 processes" $tiny --ranks 4
# --precision fp8 (chapter 1's DDP and chapter 2): --fp8-recipe with it alone, delayed's
# flags with delayed alone; one line in the programs without it
if [ -x "$chapter1" ] && [ -z "$mpi" ]; then
    expect_error "$chapter1" "--fp8-recipe rowwise: only --precision fp8 takes a recipe (this run computes in bf16)" $tiny --strategy ddp --precision bf16 --fp8-recipe rowwise
    expect_error "$chapter1" "--fp8-format hybrid: only --precision fp8 takes an FP8 format (this run computes in bf16)" $tiny --strategy ddp --precision bf16 --fp8-format hybrid
    expect_error "$chapter1" "--fp8-format e5m2: unknown value (valid: e4m3, hybrid)" $tiny --strategy ddp --precision fp8 --fp8-format e5m2
    expect_error "$chapter1" "--fp8-margin 2: only --fp8-recipe delayed keeps an amax history (this run: blockwise)" $tiny --strategy ddp --precision fp8 --fp8-margin 2
    expect_error "$chapter1" "--fp8-amax-history 8: only --fp8-recipe delayed keeps an amax history (this run: bf16)" $tiny --strategy ddp --precision bf16 --fp8-amax-history 8
    expect_error "$chapter1" "--fp8-amax-history 2000 --fp8-margin 0: the amax history holds 1 to 1024 steps" $tiny --strategy ddp --ranks 1 --precision fp8 --fp8-recipe delayed --fp8-amax-history 2000
    expect_error "$chapter1" "--precision fp8: DataParallel trains in fp32, bf16 and fp16 (its threads share no FP8 amax reduction); add --strategy ddp" $tiny --precision fp8
fi
# --precision fp8 switches FP8 on: the baseline's report says fp8 and its recipe, and its
# losses are not bf16's (a flag that quietly ran bf16 would pass every comparison)
if [ -x "$programs"/baseline ] && [ -z "$mpi" ]; then
    last_loss() { "$programs"/baseline "$@" $tiny --json 2>/dev/null | tr -d '\n' |
                  sed -n 's/.*"precision": "\([a-z0-9]*\)".*"loss": \[[^]]*, \([0-9.e+-]*\)\].*/\1 \2/p'; }
    bf16=$(last_loss --precision bf16)
    fp8=$(last_loss --precision fp8)
    if [ "${fp8%% *}" = fp8 ] && [ "${bf16%% *}" = bf16 ] && [ -n "${fp8#* }" ] &&
       [ "${fp8#* }" != "${bf16#* }" ]; then
        passed=$((passed + 1)); echo "ok   baseline --precision fp8: '$fp8' against bf16's '$bf16'"
    else
        failed=$((failed + 1)); echo "FAIL baseline --precision fp8: '$fp8' against bf16's '$bf16'"
    fi
fi
for p in $(mixed_programs "$programs"/chapter3 "$programs"/chapter4 "$programs"/chapter5 "$programs"/chapter9); do
    [ -x "$p" ] && expect_error "$p" "--precision fp8: $(basename "$p") does not train in FP8 yet (the baseline, chapter 1's --strategy ddp and chapter 2 do); valid here: fp32, bf16, fp16" $tiny --precision fp8
done
chapter2="$programs"/chapter2
if [ -x "$chapter2" ]; then
    expect_error "$chapter2" "--estimate 1e308: must be at most 1e+15" --estimate 1e308 --world 1000000000
    expect_error "$chapter2" "--gpu-mem 1e300: must be at most 1e+06" --estimate 7e9 --world 8 --gpu-mem 1e300
    # ZeRO++: options of ZeRO-3 alone, fp32, no prefetch, hpZ on two or more nodes
    tiers=(--link-intra nvlink --link-inter ib --ranks-per-node 2)
    expect_error "$chapter2" "--zeropp qwZ: ZeRO++ is an option of ZeRO-3 (valid with --stage 3)" --zeropp qwz
    expect_error "$chapter2" "--zeropp qgZ: ZeRO++ is an option of ZeRO-3" --stage 2 --zeropp qgz
    expect_error "$chapter2" "--zeropp qwz,foo: no piece 'foo' (valid: qwz, hpz, qgz" --stage 3 --zeropp qwz,foo
    expect_error "$chapter2" "--zeropp hpz,hpz: twice 'hpz'" --stage 3 --zeropp hpz,hpz
    expect_error "$chapter2" "--zeropp hpZ: hpZ's secondary shard lives inside a node" --stage 3 --zeropp hpz
    if [ -z "$mpi" ]; then   # one node of 4; the tiers are modelled on threads only
        expect_error "$chapter2" "--zeropp hpZ: hpZ's secondary shard lives inside a node" --ranks 4 --stage 3 --zeropp hpz --link-intra nvlink --link-inter ib --ranks-per-node 4
        expect_error "$chapter2" "--zeropp qgZ: ZeRO++ is an option of ZeRO-3" --ranks 4 --stage 2 --zeropp qgz "${tiers[@]}"
    else
        expect_error "$chapter2" "--zeropp hpz with --ranks-per-node: the two tiers of links are modelled on the threads backend" --stage 3 --zeropp hpz --link-intra nvlink --link-inter ib --ranks-per-node 1
    fi
    expect_error "$chapter2" "--zeropp qwZ: the int8 and int4 block codecs take fp32" --stage 3 --zeropp qwz --precision bf16
    expect_error "$chapter2" "--prefetch with --zeropp qgZ: the quantised gathers block" --stage 3 --zeropp qgz --prefetch
    expect_error "$chapter2" "--zeropp qwz with --estimate: the estimate trains nothing" --estimate 7e9 --world 8 --zeropp qwz
fi
chapter3="$programs"/chapter3
[ -x "$chapter3" ] && [ -z "$mpi" ] && expect_error "$chapter3" "TP sizes that work on 4 ranks: 1, 2\$" --ranks 4 --heads 6 --dim 96 --tp 4
# chapter 4: pipeline sizes and schedules
chapter4="$programs"/chapter4
# dualpipev's least m, before any rank trains (threads, and mpirun's 2 processes)
ranks2=(--ranks 2)
[ "$mpi" = mpi ] && ranks2=()
[ -x "$chapter4" ] && expect_error "$chapter4" "--micro 2: dualpipev takes 2 x --pp = 4 micro-batches or more" \
    --layers 4 --dim 16 --heads 2 --ctx 8 --batch 8 --steps 3 --quiet "${ranks2[@]}" --schedule dualpipev --micro 2
if [ -x "$chapter4" ] && [ -z "$mpi" ]; then
    expect_error "$chapter4" "--pp 5: more stages than the 4 layers" --simulate --pp 5
    expect_error "$chapter4" "--pp 0: must be an integer from 1" --simulate --pp 0
    expect_error "$chapter4" "--micro 3 does not divide --batch 8" --simulate --pp 2 --micro 3
    expect_error "$chapter4" "--micro 0: must be an integer from 1" --simulate --micro 0
    expect_error "$chapter4" "--grad-dtype does nothing with --simulate (the simulator trains no model)" --simulate --precision bf16 --grad-dtype bf16
    expect_error "$chapter4" "--virtual 3 x --pp 2 = 6 chunks, more than the 4 layers" --simulate --pp 2 --schedule interleaved --virtual 3
    expect_error "$chapter4" "--virtual 0: must be an integer from 1" --simulate --virtual 0
    expect_error "$chapter4" "--micro 2: interleaved 1F1B takes micro-batches in groups of --pp 4" --simulate --pp 4 --layers 8 --micro 2 --schedule interleaved
    expect_error "$chapter4" "--stage-ms -1: must be at least 0" --simulate --stage-ms -1
    expect_error "$chapter4" "--schedule fast: unknown value (valid: naive, gpipe, 1f1b, interleaved, zb-h1, zb-v, dualpipev, all)" --simulate --schedule fast
    expect_error "$chapter4" "--micro 4: dualpipev takes 2 x --pp = 8 micro-batches or more (DeepSeek's DualPipeV refuses fewer" --simulate --pp 4 --layers 8 --micro 4 --schedule dualpipev
    expect_error "$chapter4" "--pp 4: zb-v cuts the model into 2 x 4 = 8 chunks, more than the 6 layers" --simulate --pp 4 --layers 6 --schedule zb-v
    expect_error "$chapter4" "--virtual does nothing with --schedule zb-v (a V always places 2 chunks" --simulate --schedule zb-v --virtual 3
    expect_error "$chapter4" "--fb-overlap 2: must be at most 1" --simulate --fb-overlap 2
    expect_error "$chapter4" "--time-f 0: a forward must take some time" --simulate --time-f 0
    expect_error "$chapter4" "--time-w -1: must be at least 0" --simulate --time-w -1
    expect_error "$chapter4" "--fb-overlap does nothing with training" $tiny2 --ranks 2 --fb-overlap 0.5
    # training: p stages per pipeline, the other ranks data parallel
    expect_error "$chapter4" "--pp 4: more stages than the 2 ranks" --ranks 2 --pp 4 --layers 4 --dim 16 --heads 2 --ctx 8 --batch 8 --steps 3 --quiet
    expect_error "$chapter4" "--pp 3 does not divide the 4 ranks" --ranks 4 --pp 3 --layers 4 --dim 16 --heads 2 --ctx 8 --batch 8 --steps 3 --quiet
    expect_error "$chapter4" "--batch 6 does not split over 4 pipelines" --ranks 4 --pp 1 --layers 1 --dim 16 --heads 2 --ctx 8 --batch 6 --steps 3 --quiet
    # sizes whose waits or lists would never end
    expect_error "$chapter4" "--stage-ms 1e200: must be at most 60000" --stage-ms 1e200
    expect_error "$chapter4" "--pp 100000: at most 1024 stages" --simulate --pp 100000 --micro 100000 --layers 100000 --batch 100000
    expect_error "$chapter4" "--pp 1000000: at most 1024 stages" --simulate --pp 1000000 --layers 1000000
    expect_error "$chapter4" "--pp 1024 x --micro 2048 = 2097152 forwards through a chunk, more than 1048576" --simulate --pp 1024 --micro 2048 --layers 1024 --batch 2048 --schedule 1f1b
    # flags a mode ignores, and outputs that cannot be written, before any work
    mkdir -p "$scratch/pipe-1f1b.svg"
    expect_error "$chapter4" "--svg $scratch/pipe-1f1b.svg: is a directory" --simulate --svg "$scratch/pipe"
    expect_error "$chapter4" "--svg $scratch/pipe-1f1b.svg: is a directory" $tiny2 --ranks 2 --svg "$scratch/pipe.svg"
    expect_error "$chapter4" "--save $scratch/ck4: does nothing with --simulate" --simulate --save "$scratch/ck4"
    # refused before the directory is made: nothing left behind
    if [ -e "$scratch/ck4" ]; then
        failed=$((failed + 1))
        echo "FAIL chapter4 --simulate --save $scratch/ck4  (left the directory behind)"
    else
        passed=$((passed + 1))
        echo "ok   chapter4 --simulate --save $scratch/ck4  ->  no directory left behind"
    fi
    if "$chapter4" $tiny2 --ranks 2 --schedule 1f1b --steps 2 --stage-ms 0 --save "$scratch/ck4" >/dev/null 2>&1; then
        expect_error "$chapter4" "--resume $scratch/ck4: does nothing with --simulate" $tiny2 --simulate --resume "$scratch/ck4"
    fi
    expect_error "$chapter4" "--virtual does nothing with --schedule 1f1b (only the interleaved" --simulate --schedule 1f1b --virtual 2
    expect_error "$chapter4" "--comm-order does nothing with training" $tiny2 --ranks 2 --comm-order eager
    # the default run on 4 ranks shows every schedule: the default 4 layers grow to v x p
    for mode in --simulate --quiet; do
        out=$("$chapter4" --ranks 4 --dim 16 --heads 2 --ctx 8 --batch 8 --steps 1 --stage-ms 0 $mode 2>&1)
        if [ $? -eq 0 ] && printf '%s' "$out" | grep -q "^ *\(pp-\)\{0,1\}interleaved  " &&
            ! printf '%s' "$out" | grep -q "^skipped" &&
            printf '%s' "$out" | grep -q -- "--layers 8 rather than the default 4"; then
            passed=$((passed + 1))
            echo "ok   chapter4 --ranks 4 $mode  ->  every schedule, interleaved on 8 layers"
        else
            failed=$((failed + 1))
            echo "FAIL chapter4 --ranks 4 $mode  (interleaved skipped or unsaid): $out"
        fi
    done
fi
# chapter 6, the planner: sizes, shapes and meshes
planner="$programs"/chapter6
if [ -x "$planner" ] && [ -z "$mpi" ]; then
    expect_error "$planner" "--params abc: not a number" --params abc
    expect_error "$planner" "--params -5: must be at least 1" --params -5
    expect_error "$planner" "--gpus 0: must be an integer from 1" --gpus 0
    expect_error "$planner" "--heads 100 does not divide --dim 12288" --hidden 12288 --heads 100
    expect_error "$planner" "--tp 8 x --pp 4 x --dp 4 = 128 does not multiply to --gpus 64" --params 70e9 --gpus 64 --tp 8 --pp 4 --dp 4
    expect_error "$planner" "--tp 3 x --pp 1 = 3 does not divide --gpus 64" --params 70e9 --gpus 64 --tp 3
    expect_error "$planner" "--tp 8 does not divide the 4 heads" --gpus 8 --tp 8
    expect_error "$planner" "--params 7e+10 and --layers both given" --params 70e9 --layers 80
    expect_error "$planner" "--mfu 2: must be a fraction of peak in (0, 1]" --mfu 2
    expect_error "$planner" "--gpu-mem x: not a number" --gpu-mem x
    expect_error "$planner" "--batch 100 does not split into --dp 64" --params 70e9 --gpus 64 --dp 64 --batch 100
    expect_error "$planner" "--zero 3 belongs to a mesh" --params 70e9 --zero 3
    expect_error "$planner" "--dp-shard 8 belongs to a mesh" --params 40e9 --gpus 64 --dp-shard 8
    expect_error "$planner" "--dp-shard 8: HSDP shards ZeRO-3 over a group that divides dp; give --zero 3" --params 40e9 --gpus 64 --dp 64 --zero 1 --dp-shard 8
    expect_error "$planner" "--dp-shard 6: HSDP shards ZeRO-3 over a group that divides dp; give --zero 3 and a divisor of dp 64" --params 40e9 --gpus 64 --dp 64 --zero 3 --dp-shard 6
    # products of sizes up to 1e9 are formed in 64 bits, and refused by name
    expect_error "$planner" "--tp 65536 x --pp 65536 = 4294967296 GPUs, more than --gpus 8" --params 70e9 --tp 65536 --pp 65536
    expect_error "$planner" "--tp 46341 x --pp 46341 = 2147488281 GPUs, more than --gpus 8" --params 70e9 --tp 46341 --pp 46341
    expect_error "$planner" "--gpus 1000000000: must be at most 1e+08" --gpus 1000000000
    # it trains nothing: training flags are refused and not listed, and modes that
    # ignore a flag refuse it
    expect_error "$planner" "--save does nothing in chapter6 (the planner trains nothing)" --save "$scratch/ckpt"
    if [ -e "$scratch/ckpt" ]; then
        failed=$((failed + 1))
        echo "FAIL chapter6 --save: created $scratch/ckpt"
    fi
    expect_error "$planner" "--profile does nothing in chapter6" --profile
    expect_error "$planner" "--steps does nothing with a plan (only --predict-chapters runs programs)" --params 70e9 --steps 3
    expect_error "$planner" "--link-scale does nothing with a plan" --link-scale 2
    expect_error "$planner" "--link-scale 1e6: must be at most 10000" --predict-chapters --link-scale 1e6
    expect_error "$planner" "--gpus does nothing with --predict-chapters" --predict-chapters --gpus 64
    expect_error "$planner" "--json does nothing with --course (it prints its checks as text)" --course --json
    expect_error "$planner" "--tokens does nothing with --max-params without a model" --gpus 1024 --max-params --tokens 1e12
    # it plans in a precision (bf16 unless told) and says which; fp16's loss scale is a
    # training flag, and --course's numbers are the course's own
    expect_error "$planner" "--loss-scale does nothing in chapter6" --params 70e9 --precision fp16 --loss-scale 8
    expect_error "$planner" "--no-loss-scale does nothing in chapter6" --params 70e9 --no-loss-scale
    expect_error "$planner" "--precision does nothing with --course (the course's numbers are mixed precision's)" --course --precision fp32
    # expect_output PATTERN ARGS...: the planner exits 0 and prints a line matching PATTERN
    expect_output() {
        local pattern=$1 out
        shift
        out=$("$planner" "$@" 2>&1)
        if [ $? -eq 0 ] && printf '%s\n' "$out" | grep -q -- "$pattern"; then
            passed=$((passed + 1))
            echo "ok   chapter6 $*  ->  prints $pattern"
        else
            failed=$((failed + 1))
            echo "FAIL chapter6 $*: no line matches $pattern"
        fi
    }
    expect_output '^precision bf16: 16-bit weights 2 B + gradients 2 B + fp32 master, m, v 12 B' --params 70e9 --gpus 64
    expect_output '^precision fp32: fp32 weights 4 B + gradients 4 B + Adam m, v 8 B per parameter, 4 B activations' --params 70e9 --gpus 64 --precision fp32
    expect_output 'The decision tree .*, in fp16:' --params 70e9 --gpus 64 --precision fp16
    expect_output '^ddp .* 279.22 GB  279.22 GB  558.44 GB' --params 70e9 --gpus 64 --precision fp32
    expect_output '"precision": "bf16", "params"' --params 70e9 --gpus 64 --json
    expect_output '"precision": "fp32", "params"' --params 70e9 --gpus 64 --json --precision fp32
    expect_output '"flops_per_gpu": 2.68e+13' --params 70e9 --gpus 64 --json --precision fp32
    expect_output '"flops_per_gpu": 3e+13' --params 70e9 --gpus 64 --json --precision fp32 --gpu-tflops 30
    expect_output '"precision": "fp32", "cluster"' --gpus 1024 --max-params --json --precision fp32
    expect_output 'model states only .*, in fp32:' --gpus 1024 --max-params --precision fp32
    listed=$("$planner" --help 2>&1 | grep -o -e "--lr \|--save \|--profile \|--seed \|--trace " | tr '\n' ' ')
    if [ -z "$listed" ]; then
        passed=$((passed + 1))
        echo "ok   chapter6 --help lists no training flag"
    else
        failed=$((failed + 1))
        echo "FAIL chapter6 --help lists training flags: $listed"
    fi
    # the README's commands run (--predict-chapters is test_chapter6's)
    expect_ok "$planner" --params 70e9 --gpus 64 --gpu-mem 80
    expect_ok "$planner" --layers 96 --hidden 12288 --heads 96 --vocab 51200 --seq 2048 --gpus 1024
    expect_ok "$planner" --params 70e9 --gpus 64 --tp 8 --pp 4 --zero 1
    expect_ok "$planner" --params 70e9 --gpus 64 --tokens 1e12 --max-params
    expect_ok "$planner" --course
    expect_ok "$planner" --params 70e9 --gpus 64 --json
    expect_ok "$planner" --gpus 1024 --gpu-mem 32 --tp 16 --max-params
    expect_ok "$planner" --params 70e9 --gpus 64 --gpu-mem 80 --precision fp32
fi
# checkpoints: a --resume that cannot be used is one line before any rank starts
ckpt=$(mktemp -d)
small="--layers 1 --dim 16 --heads 2 --ctx 8 --batch 2 --quiet"
if [ -n "$mpi" ]; then
    :   # checked on the threads build only: they stop before any rank starts
elif [ -x "$build"/baseline ] && "$build"/baseline $small --steps 2 --save "$ckpt/good" >/dev/null 2>&1; then
    cp -r "$ckpt/good/step-000002" "$ckpt/flipped"
    printf 'X' | dd of="$ckpt/flipped/rank-00000.safetensors" bs=1 seek=900 conv=notrunc 2>/dev/null
    cp -r "$ckpt/good/step-000002" "$ckpt/cut"
    truncate -s 500 "$ckpt/cut/rank-00000.safetensors"
    cp -r "$ckpt/good/step-000002" "$ckpt/edited"   # AdamW's step changed by hand
    sed -i 's/"adam_step": 2/"adam_step": 7/' "$ckpt/edited/index.json"
    # files that are not files: reading them would block (a FIFO) or never end (/dev/zero)
    for name in latest-fifo index-fifo rank-fifo index-zero; do
        mkdir -p "$ckpt/$name"
        cp -r "$ckpt/good/step-000002" "$ckpt/$name/step-000002"
        echo step-000002 >"$ckpt/$name/latest"
    done
    rm "$ckpt/latest-fifo/latest" && mkfifo "$ckpt/latest-fifo/latest"
    rm "$ckpt/index-fifo/step-000002/index.json" && mkfifo "$ckpt/index-fifo/step-000002/index.json"
    rm "$ckpt/rank-fifo/step-000002/rank-00000.safetensors"
    mkfifo "$ckpt/rank-fifo/step-000002/rank-00000.safetensors"
    ln -sf /dev/zero "$ckpt/index-zero/step-000002/index.json"
    # a save killed before: its leftovers go when the next run starts
    mkdir -p "$ckpt/stale/.tmp-step-000009" && echo x >"$ckpt/stale/.tmp-step-000009/rank-00000.safetensors"
    for program in "$build"/baseline "$build"/chapter2; do
        [ -x "$program" ] || continue
        # a hang is a failure: the program runs under timeout, under its own name
        printf '#!/bin/bash\nexec timeout 20 %q "$@"\n' "$(realpath "$program")" >"$ckpt/$(basename "$program")"
        chmod +x "$ckpt/$(basename "$program")"
        in_time="$ckpt/$(basename "$program")"
        expect_error "$in_time" "edited/index.json: CRC-32 .* (edited or corrupted)" $small --steps 4 --resume "$ckpt/edited"
        expect_error "$in_time" "latest-fifo/latest: not a regular file (a FIFO)" $small --steps 4 --resume "$ckpt/latest-fifo"
        expect_error "$in_time" "index-fifo/step-000002/index.json: not a regular file (a FIFO)" $small --steps 4 --resume "$ckpt/index-fifo"
        expect_error "$in_time" "rank-fifo/step-000002/rank-00000.safetensors: not a regular file (a FIFO)" $small --steps 4 --resume "$ckpt/rank-fifo"
        expect_error "$in_time" "index-zero/step-000002/index.json: not a regular file (a device" $small --steps 4 --resume "$ckpt/index-zero"
        if "$in_time" $small --steps 2 --save "$ckpt/stale" >/dev/null 2>&1 &&
            [ -z "$(ls -A "$ckpt/stale" | grep '^\.tmp')" ]; then
            passed=$((passed + 1)); echo "ok   $(basename "$program") --save over a killed save's .tmp-step-000009: removed"
        else
            failed=$((failed + 1)); echo "FAIL $(basename "$program") --save over a killed save's .tmp-step-000009: $(ls -A "$ckpt/stale")"
        fi
        expect_error "$program" "--resume $ckpt/none: no checkpoint there" --resume "$ckpt/none"
        expect_error "$program" "--save-every 2: needs --save DIR" --save-every 2
        expect_error "$program" "--save /nonexistent/ckpt: cannot create it" --save /nonexistent/ckpt
        expect_error "$program" "saved from another model (--dim 16 there, 32 here)" --layers 1 --dim 32 --heads 2 --ctx 8 --batch 2 --quiet --resume "$ckpt/good"
        expect_error "$program" "--steps 2: the checkpoint in $ckpt/good/step-000002 is at step 2" $small --steps 2 --resume "$ckpt/good"
        expect_error "$program" "flipped/rank-00000.safetensors: CRC-32" $small --steps 4 --resume "$ckpt/flipped"
        expect_error "$program" "cut/rank-00000.safetensors: 500 bytes, the index says" $small --steps 4 --resume "$ckpt/cut"
        expect_error "$program" "saved with --seed 1234, this run has --seed 7" $small --seed 7 --steps 4 --resume "$ckpt/good"
    done
else
    failed=$((failed + 1))
    echo "FAIL baseline --save: could not write the checkpoint the checks need"
fi
rm -rf "$ckpt"
# chapter 11: the mesh's sizes and what the model or the trainers refuse, one line each
chapter11="$build"/chapter11
if [ -x "$chapter11" ]; then
    expect_error "$chapter11" "--tp 4 does not divide the 6 ranks" --ranks 6 --tp 4
    expect_error "$chapter11" "--cp 3 does not divide the 4 ranks" --ranks 4 --cp 3
    expect_error "$chapter11" "--dp-shard 3 does not divide the 2 data-parallel ranks" --ranks 4 --dp-shard 3
    # CP in 16 bits and with SP train now (test_mesh_matrix holds them against the baseline)
    expect_ok "$chapter11" --ranks 4 --tp 1 --cp 2 --dp-shard 2 --steps 2 --quiet
    # SP with stages trains now (test_mesh_matrix holds tp+sp x pp under every schedule)
    expect_ok "$chapter11" --ranks 4 --tp 2 --pp 2 --sp --steps 2 --quiet
    expect_ok "$chapter11" --ranks 4 --tp 2 --dp-shard 2 --steps 1 --quiet
    expect_error "$chapter11" "sequence parallelism splits the sequence over the tensor-parallel ranks: it needs --tp 2" --ranks 4 --tp 1 --pp 2 --sp
    # EP with PP trains with micro-batches, each routed by itself, and with TP + SP
    # (test_mesh_moe holds them against one device); EP with CP trains without dropping
    expect_ok "$chapter11" --ranks 4 --tp 1 --pp 2 --ep 2 --micro 1 --schedule 1f1b --steps 2 --quiet
    expect_ok "$chapter11" --ranks 8 --ep 2 --pp 2 --tp 1 --steps 2 --quiet
    expect_ok "$chapter11" --ranks 4 --ep 2 --tp 1 --micro 2 --steps 2 --quiet
    expect_ok "$chapter11" --ranks 4 --tp 2 --sp --ep 2 --steps 2 --quiet
    # 10 steps of EP x PP with 4 micro-batches in bf16: past TOL_STEPS the loss is held
    # within twice one device's distance from fp32 (it strayed past MIXED_TOL_LOSS alone)
    expect_ok "$chapter11" --ranks 4 --tp 1 --pp 2 --ep 2 --schedule 1f1b --quiet
    # an expert's rows sit elsewhere than on one device (ep 2 of dp 4): where 16-bit
    # products are widened, 16 rows a call, a row may round one unit apart
    # (tolerances_with_moe_rows); it failed at step 1's TOL_GRADS alone
    expect_ok "$chapter11" --ranks 4 --tp 1 --ep 2 --precision bf16 --grad-dtype fp32 --steps 3 --quiet
    # fp32 MoE past 5 steps: a near-tied routing choice flips once AdamW has moved the
    # runs apart, and the losses part (1.5e-2 at step 9 here); the loss is then not held,
    # the parameters within AdamW's drift bound (tolerances_with_moe_routing)
    expect_ok "$chapter11" --ranks 4 --tp 1 --ep 2 --dp-shard 4 --micro 1 --preset bench256 --precision fp32 --quiet
    expect_error "$chapter11" "--experts with --cp 2 and capacity factor 1.25" --ranks 4 --tp 1 --cp 2 --ep 2
    expect_error "$chapter11" "EP 4 does not divide --experts 2" --ranks 4 --ep 4 --experts 2 --tp 1
    expect_error "$chapter11" "--experts with a schedule that splits the backward" --ranks 4 --tp 1 --pp 2 --ep 2 --schedule zb-h1
    expect_error "$chapter11" "--top-k does nothing with a dense mesh (no --ep)" --top-k 1
    expect_error "$chapter11" "--top-k 3: must be 1 or 2" --ranks 4 --ep 2 --top-k 3
    expect_error "$chapter11" "--zero 4: ZeRO has stages 0-3" --zero 4
    expect_error "$chapter11" "--cp-attention does nothing without --cp 2 or more" --cp-attention ulysses
    expect_error "$chapter11" "--experts and --moe-every go with --ep" --experts 8
    expect_error "$chapter11" "--mesh-only needs --world N" --mesh-only
    expect_error "$chapter11" "--sp does nothing with --mesh-only" --mesh-only --world 8 --sp
    expect_error "$chapter11" "--world 8 belongs to --mesh-only" --world 8
    expect_error "$chapter11" "--save $scratch/c11: chapter 11 trains a short run" --save "$scratch/c11"
fi
# chapter 5: meshes that do not fit, with meshes that would
chapter5="$build"/chapter5
if [ -x "$chapter5" ]; then
    expect_error "$chapter5" "--tp 2 --pp 2 --dp 2 needs 8 ranks, not 6; with that many ranks try --tp 2 --pp 3 --dp 1" --ranks 6 --tp 2 --pp 2 --dp 2
    expect_error "$chapter5" "--tp 3 does not divide --heads 4" --ranks 3 --tp 3 --pp 1 --dp 1
    expect_error "$chapter5" "--pp 5: more stages than the 4 layers" --ranks 5 --tp 1 --pp 5 --dp 1
    expect_error "$chapter5" "--batch 8 does not split over --dp 3 replicas" --ranks 3 --tp 1 --pp 1 --dp 3
    expect_error "$chapter5" "--micro 8 does not divide --batch 4" --ranks 4 --dp 2 --micro 8
    expect_error "$chapter5" "--mesh-only needs --world N" --mesh-only
    expect_error "$chapter5" "--json lists every rank: at most --world 4096" --mesh-only --world 8192 --tp 8 --pp 16 --json
    expect_error "$chapter5" "--zero 4: ZeRO has stages 0-3" --zero 4
    expect_error "$chapter5" "--tp 3 does not divide the 8 ranks" --ranks 8 --tp 3
    expect_error "$chapter5" "--tp 3 x --pp 2 = 6 does not divide the 8 ranks" --ranks 8 --tp 3 --pp 2
    # the arithmetic modes train nothing: what only training uses is refused, and --save
    # leaves no directory behind
    expect_error "$chapter5" "--save $scratch/c5: --mesh-only and --examples train nothing" --mesh-only --world 8 --save "$scratch/c5"
    expect_error "$chapter5" "--save $scratch/c5: --mesh-only and --examples train nothing" --examples --save "$scratch/c5"
    if [ -e "$scratch/c5" ]; then
        failed=$((failed + 1))
        echo "FAIL chapter5 --mesh-only / --examples --save: created $scratch/c5"
    fi
    expect_error "$chapter5" "--resume $scratch: --mesh-only and --examples train nothing" --mesh-only --world 8 --resume "$scratch"
    expect_error "$chapter5" "--resume $scratch: --mesh-only and --examples train nothing" --examples --resume "$scratch"
    expect_error "$chapter5" "--json does nothing with --examples" --examples --json
    expect_error "$chapter5" "--steps does nothing with --mesh-only" --mesh-only --world 8 --steps 3
    expect_error "$chapter5" "--grad-dtype does nothing with --mesh-only" --mesh-only --world 8 --precision bf16 --grad-dtype bf16
    expect_error "$chapter5" "--schedule does nothing with --examples" --examples --schedule gpipe
    expect_ok "$chapter5" --mesh-only --world 1024 --tp 8 --pp 16 --dp 8
    expect_ok "$chapter5" --mesh-only --world 1024 --tp 8 --pp 16 --dp 8 --json
    expect_ok "$chapter5" --examples
    # more ranks than cores: the table says why comm % is high
    if [ "$(nproc)" -lt 8 ] && [ -z "$mpi" ]; then
        # shellcheck disable=SC2086
        if "$chapter5" $tiny2 --ranks 8 | grep -q "8 ranks share $(nproc) cores, so that wait includes"; then
            passed=$((passed + 1))
            echo "ok   chapter5 --ranks 8 on $(nproc) cores: the note on comm % is printed"
        else
            failed=$((failed + 1))
            echo "FAIL chapter5 --ranks 8 on $(nproc) cores: no note on why comm % is high"
        fi
    fi
fi
# chapter 7, communication: sweep sizes, the ladder's calibration, the plot
chapter7="$build"/chapter7
if [ -x "$chapter7" ]; then
    expect_error "$chapter7" "--max-mib 2000: at most 1024" --max-mib 2000
    expect_error "$chapter7" "--sweep-ranks 1: must be an integer from 2" --sweep-ranks 1
    expect_error "$chapter7" "--start-efficiency 1.5: a fraction from 0.01 to 0.99" --start-efficiency 1.5
    # refused before any rank starts (with a tiny model, a late refusal fails fast)
    expect_error "$chapter7" "--start-efficiency 1e-300: a fraction from 0.01 to 0.99" --start-efficiency 1e-300 --part ladder $tiny
    expect_error "$chapter7" "--ladder-scale 1e308: must be at most 10000" --ladder-scale 1e308 --part ladder $tiny
    expect_error "$chapter7" "--svg needs the strategies part" --svg x.svg --part ladder
    expect_error "$chapter7" "--svg $scratch/no/e.svg: cannot write there" --svg "$scratch/no/e.svg" --part strategies $tiny
    # bf16 and fp16 train (test_chapter7 holds the ladder to the baseline); FP8 not yet
    expect_error "$chapter7" "--precision fp8: chapter7 does not train in FP8 yet" --precision fp8
    expect_error "$chapter7" "--save ckpt: chapter 7 trains many short runs" --save ckpt
    expect_error "$chapter7" "--resume ckpt: chapter 7 trains many short runs" --resume ckpt
    expect_error "$chapter7" "--batch 6 does not split evenly over 4 ranks" --ranks 4 --batch 6
    expect_error "$chapter7" "--ladder-scale -1: must be at least 0" --ladder-scale -1
    expect_error "$chapter7" "--allreduce tree: unknown value (valid: ring, naive, doubling)" --allreduce tree
fi
# chapter 8, mixed precision: it runs every precision itself, and each part reads its own
# flags
chapter8="$programs"/chapter8
if [ -x "$chapter8" ] && [ "$mpi" = mpi ]; then   # chapter 8 as Open MPI processes: a few
    expect_error "$chapter8" "--precision bf16: chapter 8 runs fp32, bf16 and fp16 itself (leave it out)" --precision bf16
    expect_error "$chapter8" "--part fast: unknown value (valid: all, bytes, speed, accuracy, wire, fp8)" --part fast
    expect_error "$chapter8" "--steps does nothing with --part bytes (only part accuracy reads it)" --part bytes --steps 50
elif [ -x "$chapter8" ]; then
    expect_error "$chapter8" "--precision bf16: chapter 8 runs fp32, bf16 and fp16 itself (leave it out)" --precision bf16
    expect_error "$chapter8" "--precision fp32: chapter 8 runs fp32, bf16 and fp16 itself" --precision fp32
    expect_error "$chapter8" "--grad-dtype fp32: chapter 8 runs fp32, bf16 and fp16 itself" --grad-dtype fp32
    expect_error "$chapter8" "--grad-dtype bf16: chapter 8 runs fp32, bf16 and fp16 itself" --grad-dtype bf16
    expect_error "$chapter8" "--no-loss-scale does nothing in chapter8" --no-loss-scale
    expect_error "$chapter8" "--profile does nothing in chapter8" --profile
    expect_error "$chapter8" "--trace $scratch/t8.json: chapter 8 runs many strategies" --trace "$scratch/t8.json"
    expect_error "$chapter8" "--part fast: unknown value (valid: all, bytes, speed, accuracy, wire, fp8)" --part fast
    expect_error "$chapter8" "--steps does nothing with --part bytes (only part accuracy reads it)" --part bytes --steps 50
    expect_error "$chapter8" "--svg does nothing with --part speed (only part accuracy reads it)" --part speed --svg x.svg
    expect_error "$chapter8" "--probe-batch does nothing with --part wire" --part wire --probe-batch 8
    expect_error "$chapter8" "--wire-steps does nothing with --part accuracy (only part wire reads it)" --part accuracy --wire-steps 5
    expect_error "$chapter8" "--loss-scale does nothing with --part wire (part wire runs no fp16)" --part wire --loss-scale 8
    expect_error "$chapter8" "--loss-scale does nothing with --part fp8 (part fp8 runs no fp16)" --part fp8 --loss-scale 8
    expect_error "$chapter8" "--steps does nothing with --part fp8 (only part accuracy reads it)" --part fp8 --steps 50
    expect_error "$chapter8" "--fp8-steps does nothing with --part wire (only part fp8 reads it)" --part wire --fp8-steps 50
    expect_error "$chapter8" "--fp8-steps 0: must be an integer from 1" --fp8-steps 0
    expect_error "$chapter8" "--loss-scale 0: must be at least 1" --loss-scale 0
    expect_error "$chapter8" "--probe-batch 5000: must be at most 4096" --probe-batch 5000
    expect_error "$chapter8" "--probe-batch 0: must be an integer from 1" --probe-batch 0
    expect_error "$chapter8" "--wire-steps 0: must be an integer from 1" --wire-steps 0
    expect_error "$chapter8" "--svg $scratch/no/l.svg: cannot write there" --svg "$scratch/no/l.svg"
    expect_error "$chapter8" "--save ckpt: chapter 8 trains many short runs" --save ckpt
    if [ -z "$mpi" ]; then   # the rank count is ./run's under MPI
        expect_error "$chapter8" "--batch 6 does not split evenly over 4 ranks" --ranks 4 --batch 6
    fi
fi
# chapter 6's mixture of experts and checkpoint interval: flags where they do not apply,
# values that do not fit, and the numbers tests/test_chapter6_moe.c and
# test_chapter6_failures.c compute by hand, as printed
if [ -x "$planner" ] && [ -z "$mpi" ]; then
    expect_error "$planner" "--moe-top-k 3 is more than the 2 experts (at most 2)" --moe-experts 2 --moe-top-k 3
    expect_error "$planner" "--ep does nothing with a dense model (it has no experts: give --moe-experts)" --ep 4
    expect_error "$planner" "--ep 3 does not divide both the 16 experts and dp 64 (try a divisor of 16)" --moe-experts 16 --gpus 64 --ep 3
    expect_error "$planner" "--layers does nothing with --model (the preset fixes the model" --model gpt4-moe --layers 4
    expect_error "$planner" "--max-params does nothing with a mixture of experts" --model gpt4-moe --max-params
    expect_error "$planner" "--model gpt5: unknown value (valid: gpt3, gpt4-moe)" --model gpt5
    expect_error "$planner" "--tp 8 x --pp 15 = 120 does not divide --gpus 1000" --model gpt4-moe --gpus 1000
    expect_error "$planner" "--mtbf-hours 3 and --gpu-mtbf-hours 50000 both given" --mtbf-hours 3 --gpu-mtbf-hours 5e4
    expect_error "$planner" "--save-seconds 10 and --save-bandwidth 1 both given" --save-seconds 10 --save-bandwidth 1
    expect_error "$planner" "--save-seconds 0: must be at least 1e-06" --save-seconds 0
    expect_error "$planner" "--mtbf-hours does nothing with --course" --course --mtbf-hours 3
    expect_error "$planner" "--moe-experts does nothing with --predict-chapters" --predict-chapters --moe-experts 8
    expect_error "$planner" "--save-seconds does nothing with --max-params without a model" --gpus 1024 --max-params --save-seconds 10
    expect_output '^  parameters  *1.832e+12  *2.778e+11$' --model gpt4-moe
    expect_output '^  active parameters a token  *2.787e+11  *2.778e+11$' --model gpt4-moe
    expect_output '= 161.28 KB a token per MoE layer' --model gpt4-moe
    expect_output '^  moe  *8  *15  *64  *16  *1 .* yes$' --model gpt4-moe
    expect_output '"alltoall_bytes_per_token_per_layer": 161280' --model gpt4-moe --json
    expect_output 'save every sqrt(2 x 16.8 s x 49.5 h) = 40.7 min of work' --model gpt3
    expect_output 'save every sqrt(2 x 10.0 s x 5.0 h) = 10.0 min of work' --mtbf-hours 5 --save-seconds 10 --restart-seconds 30
    expect_output '= 3.5% of its time' --mtbf-hours 5 --save-seconds 10 --restart-seconds 30
    expect_output '"interval_seconds": 600,' --mtbf-hours 5 --save-seconds 10 --json
    expect_ok "$planner" --model gpt4-moe --gpu-mem 141
    expect_ok "$planner" --params 70e9 --gpus 64 --moe-experts 8 --moe-top-k 1 --moe-every 2
fi
# chapter 9, the sequence split: sequence parallelism needs a TP size of 2 or more that
# divides ctx, 16-bit gradients take the run's precision, and each part reads its own flags
chapter9="$programs"/chapter9
if [ -x "$chapter9" ]; then
    expect_error "$chapter9" "--part fast: unknown value (valid: all, sp, memory, context)" --part fast
    ranks9=(--ranks 2)
    [ "$mpi" = mpi ] && ranks9=()   # ./run 2
    expect_error "$chapter9" "sequence parallelism with TP 2: --ctx 7 does not split into 2 equal parts" "${ranks9[@]}" --tp 2 --ctx 7
    expect_error "$chapter9" "--grad-dtype fp16: 16-bit gradients take the precision the run computes in (this run: --precision bf16)" --precision bf16 --grad-dtype fp16
fi
if [ -x "$chapter9" ] && [ -z "$mpi" ]; then   # under MPI the three above answer for the parser
    expect_error "$chapter9" "--recompute sometimes: unknown value (valid: none, selective, full)" --ranks 2 --recompute sometimes
    expect_error "$chapter9" "--recompute does nothing with --part memory (only part sp reads it)" --ranks 2 --part memory --recompute selective
    expect_error "$chapter9" "--svg does nothing with --part sp (only part memory reads it)" --ranks 2 --part sp --svg x.svg
    expect_error "$chapter9" "--trace does nothing with --part memory (only part sp reads it)" --ranks 2 --part memory --trace "$scratch/t9.json"
    expect_error "$chapter9" "--tp does nothing with --part context" --ranks 2 --part context --tp 2
    expect_error "$chapter9" "sequence parallelism splits the sequence over the tensor-parallel ranks: it needs --tp 2 or more, not 1" --ranks 2 --tp 1
    expect_error "$chapter9" "./run 1: sequence parallelism needs a TP group of 2 or more ranks" --ranks 1
    expect_error "$chapter9" "--tp 3 does not divide --heads 4" --ranks 4 --tp 3
    expect_error "$chapter9" "--svg $scratch/no/m.svg: cannot write there" --ranks 2 --svg "$scratch/no/m.svg"
    expect_error "$chapter9" "--save ckpt: chapter 9 compares short runs" --ranks 2 --save ckpt
    # one step: the step's bytes are its formula's (step 1's gradients gathered for the
    # comparison are not counted), TP's in bf16 with 16-bit gradients
    expect_ok "$chapter9" --ranks 2 --part sp --precision bf16 --grad-dtype bf16 --steps 1 --quiet
fi
if [ -x "$programs"/chapter3 ] && [ -z "$mpi" ]; then   # chapter 3's --sp: part 3, TP 2 or more
    # one step: its bytes alone, the setup's and step 1's checking gathers left out
    out=$("$programs"/chapter3 --ranks 4 --steps 1 --quiet 2>&1)
    if printf '%s\n' "$out" | grep -q 'bytes sent per rank per step: \([0-9.]* [KMG]*B\) measured, \1 by the ring formula'; then
        passed=$((passed + 1)); echo "ok   chapter3 --ranks 4 --steps 1: measured bytes = formula"
    else
        failed=$((failed + 1)); echo "FAIL chapter3 --ranks 4 --steps 1: measured bytes differ from the formula: $(printf '%s\n' "$out" | grep 'bytes sent per rank per step')"
    fi
    expect_error "$programs"/chapter3 "--sp does nothing with --part block" --ranks 2 --part block --sp
    expect_error "$programs"/chapter3 "sequence parallelism splits the sequence over the tensor-parallel ranks: it needs --tp 2 or more, not 1" --sp
    expect_error "$programs"/chapter3 "sequence parallelism with TP 4: --ctx 6 does not split into 4 equal parts" --ranks 4 --sp --ctx 6
fi
# chapter 12: two tiers of links, the collective matmul's chunks
chapter12="$programs"/chapter12
if [ -x "$chapter12" ] && [ -z "$mpi" ]; then
    expect_error "$chapter12" "--link ib: chapter 12 runs on two tiers of links" --ranks 8 --link ib
    expect_error "$chapter12" "./run 5: chapter 12 runs 2 nodes of 2 or more ranks" --ranks 5
    expect_error "$chapter12" "--tp-overlap 100 chunks: a rank holds 16 positions of each sequence" --ranks 8 --tp-overlap 100
    expect_error "$chapter12" "--ranks-per-node 8 of 8 ranks: chapter 12 needs 2 or more nodes" --ranks 8 --link-intra nvlink --link-inter ib --ranks-per-node 8
    expect_error "$chapter12" "--steps does nothing with --part layer" --ranks 8 --part layer --steps 3
    expect_error "$chapter12" "--json does nothing in chapter12" --ranks 8 --json
    expect_error "$chapter12" "--precision bf16: chapter 12's table trains ZeRO++" --ranks 8 --precision bf16
    expect_error "$chapter12" "--svg p.svg with --part layer: the plot is the table's" --ranks 8 --part layer --svg p.svg
    expect_error "$chapter12" "--svg $scratch/no/p.svg: cannot write there" --ranks 8 --svg "$scratch/no/p.svg"
fi
# chapter 9's context-parallel flags (chapters/09-sequence/context.c): sizes that do not
# split the ranks, the sequence or the heads, a split Ulysses does not take, and the
# flags in the parts that run no context parallelism
chapter9="$programs"/chapter9
if [ -x "$chapter9" ]; then
    expect_error "$chapter9" "--cp-attention bogus: unknown value (valid: both, ring, ulysses)" --cp-attention bogus
    expect_error "$chapter9" "--cp 3 does not divide the" $tiny --part context --cp 3
    if [ -z "$mpi" ]; then   # under MPI the two above answer for the parser and the checks
        expect_error "$chapter9" "--cp 0: must be an integer from 1" --cp 0
        expect_error "$chapter9" "--cp-split balanced does nothing with --cp-attention ulysses" $tiny --part context --cp-attention ulysses --cp-split balanced
        expect_error "$chapter9" "--cp does nothing with --part sp (it runs no context parallelism)" $tiny --part sp --cp 2
        expect_error "$chapter9" "--cp-split does nothing with --part memory" $tiny --part memory --cp-split balanced
        # shellcheck disable=SC2086
        expect_ok "$chapter9" $tiny --ranks 2 --part context --cp-attention ring --cp-split contiguous --precision bf16 --grad-dtype bf16
        # shellcheck disable=SC2086
        expect_ok "$chapter9" $tiny --ranks 4 --part sp --tp 2 --precision fp16 --grad-dtype fp16
        expect_error "$chapter9" "--ctx 12 does not split into 8 equal chunks (--cp 4 balanced" --ranks 4 --layers 1 --dim 16 --heads 2 --ctx 12 --batch 8 --steps 3 --quiet --part context
        expect_error "$chapter9" "--ctx 12 does not split into 8 equal chunks (--cp 8)" --ranks 8 --layers 1 --dim 16 --heads 2 --ctx 12 --batch 8 --steps 3 --quiet --part context --cp-attention ring --cp-split contiguous
        expect_error "$chapter9" "--cp 4 does not divide --heads 2 (Ulysses" --ranks 4 $tiny --part context --cp-attention ulysses
        expect_error "$chapter9" "--batch 3 does not split over 2 data-parallel groups" --ranks 4 --cp 2 --layers 1 --dim 16 --heads 2 --ctx 8 --batch 3 --steps 3 --quiet --part context
    fi
fi
# chapter 10, mixture of experts: the MoE flags' values, and each part reads its own flags
chapter10="$programs"/chapter10
if [ -x "$chapter10" ] && [ "$mpi" = mpi ]; then   # as Open MPI processes: a few
    expect_error "$chapter10" "--top-k 3: must be 1 or 2" --top-k 3
    expect_error "$chapter10" "--capacity-factor does nothing with --part routing" --part routing --capacity-factor 2
elif [ -x "$chapter10" ]; then
    expect_error "$chapter10" "--experts 0: must be an integer from 1" --experts 0
    expect_error "$chapter10" "--experts 5000: must be at most 1024" --experts 5000
    expect_error "$chapter10" "--top-k 3: must be 1 or 2" --top-k 3
    expect_error "$chapter10" "--top-k 2 needs at least 2 experts, not --experts 1" --experts 1
    expect_error "$chapter10" "--moe-every 3: must be 1 (every block) or 2 (every other)" --moe-every 3
    expect_error "$chapter10" "--moe-every 2 with --layers 1 leaves no MoE block" --moe-every 2 --layers 1
    expect_error "$chapter10" "--capacity-factor 0.001: must be 0 (no dropping) or between 0.01 and 1000" --capacity-factor 0.001
    expect_error "$chapter10" "--capacity-factor -1: must be at least 0" --capacity-factor -1
    expect_error "$chapter10" "--aux-loss 1000: must be between 0 and 100" --aux-loss 1000
    expect_error "$chapter10" "--precision fp8: chapter10 does not train in FP8 yet" --precision fp8
    # 16 bits: EP against one device in bf16 with 16-bit gradients, 7 steps (past 5 the
    # loss bound is twice one device's distance from fp32)
    expect_ok "$chapter10" --ranks 2 --part ep --precision bf16 --grad-dtype bf16 --steps 7 --quiet
    expect_error "$chapter10" "--profile does nothing in chapter10" --profile
    expect_error "$chapter10" "--save ckpt: chapter 10 trains short runs to compare" --save ckpt
    expect_error "$chapter10" "--part fast: unknown value (valid: all, ep, routing, cost)" --part fast
    expect_error "$chapter10" "--steps does nothing with --part cost (part cost trains nothing)" --part cost --steps 5
    expect_error "$chapter10" "--aux-loss does nothing with --part cost" --part cost --aux-loss 0.1
    expect_error "$chapter10" "--capacity-factor does nothing with --part routing" --part routing --capacity-factor 2
    expect_error "$chapter10" "--trace does nothing with --part routing" --part routing --trace "$scratch/t10.json"
    expect_error "$chapter10" "--svg does nothing with --part ep (only part routing reads it)" --part ep --svg x.svg
    expect_error "$chapter10" "--curve-steps does nothing with --part cost" --part cost --curve-steps 5
    expect_error "$chapter10" "--curve-steps 1: must be an integer from 2" --curve-steps 1
    expect_error "$chapter10" "--svg $scratch/no/i.svg: cannot write there" --svg "$scratch/no/i.svg"
    expect_error "$chapter10" "--trace $scratch/t.json with 1 rank: the trace is of the first expert-parallel run" --ranks 1 --trace "$scratch/t.json"
    expect_error "$chapter10" "--batch 6 does not split evenly over 4 ranks" --ranks 4 --batch 6
fi
# chapter 10's runs that fail: a diverging EP run is one line and exit 1 (it freed runs
# it never made), an EP run off the one-device run prints the table, then one line; the
# experts count in the memory check
if [ -x "$chapter10" ]; then
    ranks10=(--ranks 4)
    [ "$mpi" = mpi ] && ranks10=()   # ./run 2
    # shellcheck disable=SC2086
    expect_status "$chapter10" 1 "training diverged: the loss is nan at step 2 on rank 0 (strategy ep)" \
        $tiny "${ranks10[@]}" --lr 1e30 --part ep
    # shellcheck disable=SC2086
    expect_status "$chapter10" 1 "part ep: an expert-parallel run differs from one device by .* of its tolerance" \
        $tiny "${ranks10[@]}" --aux-loss 100 --part ep
    # shellcheck disable=SC2086
    if "$chapter10" $tiny "${ranks10[@]}" --aux-loss 100 --part ep 2>/dev/null | grep -q "MISMATCH"; then
        passed=$((passed + 1)); echo "ok   chapter10 --aux-loss 100 --part ep: the table says MISMATCH"
    else
        failed=$((failed + 1)); echo "FAIL chapter10 --aux-loss 100 --part ep: no table"
    fi
    expect_error "$chapter10" "this run needs at least .* TB of memory (6.88e+10 parameters" \
        --experts 1024 --dim 2048 --part ep
fi
# chapter 6's context parallelism (--cp, --cp-attention): sizes that do not split the
# GPUs, the sequence or the heads, the flags where they do nothing, and the figures
# tests/test_chapter6_cp.c computes by hand, as printed for a 128k sequence
if [ -x "$planner" ] && [ -z "$mpi" ]; then
    expect_error "$planner" "--tp 1 x --pp 1 x --cp 3 = 3 does not divide --gpus 8" --cp 3
    expect_error "$planner" "--cp 4 does not split the sequence of 100 into 8 equal chunks (the balanced ring takes 2 cp" --cp 4 --seq 100
    expect_error "$planner" "--cp 4 with --cp-attention ulysses: the 6 heads do not split over tp 1 x cp 4" --cp 4 --cp-attention ulysses --layers 2 --hidden 768 --heads 6 --seq 64
    expect_error "$planner" "--cp-attention ulysses without --cp 2 or more" --cp-attention ulysses
    expect_error "$planner" "--cp-attention ring without --cp 2 or more" --cp 1 --cp-attention ring
    expect_error "$planner" "--cp-attention sideways: unknown value (valid: ring, ulysses)" --cp 2 --cp-attention sideways
    expect_error "$planner" "--cp 0: must be an integer from 1" --cp 0
    expect_error "$planner" "--cp does nothing with --predict-chapters" --predict-chapters --cp 2
    expect_error "$planner" "--cp does nothing with --course" --course --cp 2
    expect_error "$planner" "--cp does nothing with a mixture of experts" --moe-experts 8 --cp 2
    expect_error "$planner" "--cp does nothing with --max-params without a model" --gpus 1024 --max-params --cp 2
    expect_output 'a GPU sends 44 chunks of b x s/cp x h/t = 37.75 MB: 2.26 GB (ring' --params 70e9 --gpus 64 --seq 131072 --tp 8 --cp 8 --recompute selective
    expect_output 'a GPU sends 7 chunks of b x s/cp x h/t = 37.75 MB: 264.24 MB (Ulysses' --layers 67 --hidden 9216 --heads 64 --gpus 64 --seq 131072 --tp 8 --cp 8 --cp-attention ulysses --recompute selective
    # --precision fp8: ZeRO-3's gathered weights at a byte plus scales, the FP8 peak
    expect_output 'fp8: ZeRO-3 gathers weights at 1.0002 B (a byte and a scale a 128 x 128 block), and the step time assumes the GPU' --params 70e9 --gpus 64 --precision fp8
    expect_output '791 TFLOP/s achieved per GPU' --params 70e9 --gpus 64 --precision fp8
    expect_output '"precision": "fp8"' --params 70e9 --gpus 64 --precision fp8 --json
    expect_error "$planner" "--precision fp8: --predict-chapters runs the chapters in fp32, bf16 or fp16" --predict-chapters --precision fp8
    expect_error "$planner" "--fp8-recipe does nothing in chapter6" --precision fp8 --fp8-recipe rowwise
    # the search splits the sequence when nothing fits without it
    expect_output 'no mesh fits without splitting the sequence (its activations): the fastest with context parallelism is tp 8 x cp 2 x pp 1 x dp 4' --params 8e9 --gpus 64 --seq 131072
    expect_output '"cp": 8, "cp_attention": "ulysses"' --layers 67 --hidden 9216 --heads 64 --gpus 64 --seq 131072 --tp 8 --cp 8 --cp-attention ulysses --recompute selective --json
fi
cli_finish cli-chapter-checks
