#!/bin/bash
# The documents: every relative link, every docs/X and X.md a file of the repository
# cites, and every path of the repository a Markdown file names, exist; and every
# program's --json output parses and has the keys docs/json.md lists as required; and a
# header counts the model that runs.
# Usage: tests/docs-checks.sh [BUILD_DIR]   (default build/cpu; a threads build)
set -u
cd "$(dirname "$0")/.."
build=${1:-build/cpu}
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }

# ---- 1. citations -------------------------------------------------------------------
tracked=$(git ls-files 2>/dev/null) || tracked=$(find . -path ./build -prune -o -type f -print | sed 's|^\./||')
markdown=$(printf '%s\n' "$tracked" | grep '\.md$')
# cited_paths: "FILE<TAB>TARGET" for every citation to check
cited_paths() {
    local f
    for f in $markdown; do   # relative Markdown links, from the citing file's folder
        grep -oE '\]\([^)#[:space:]]+' "$f" | sed 's/^](//' | grep -vE '^[a-z]+:' |
            while read -r target; do printf '%s\t%s\n' "$f" "$(dirname "$f")/$target"; done
        # repository paths a Markdown file names (not inside a longer path)
        grep -oE '(^|[^A-Za-z0-9_./-])(common|chapters|tests|tools|bench|gpu|fuzz|docs)/[A-Za-z0-9_./-]*[A-Za-z0-9_]' "$f" |
            sed -E 's/^[^A-Za-z]//' | while read -r target; do printf '%s\t%s\n' "$f" "$target"; done
        grep -oE '\.\./[A-Za-z0-9_./-]*[A-Za-z0-9_]' "$f" |
            while read -r target; do printf '%s\t%s\n' "$f" "$(dirname "$f")/$target"; done
    done
    for f in $tracked; do   # docs/X and X.md in any file (code, help texts, scripts)
        [ -f "$f" ] && [ "$f" != tests/docs-checks.sh ] || continue   # this one names examples
        grep -IoE '(^|[^A-Za-z0-9_./-])docs/[A-Za-z0-9_.-]+' "$f" | sed -E 's/^[^d]//' |
            while read -r target; do printf '%s\t%s\n' "$f" "$target"; done
        grep -IoE '(^|[^A-Za-z0-9_./:-])[A-Za-z0-9_][A-Za-z0-9_./-]*\.md\b' "$f" | sed -E 's/^[^A-Za-z0-9_]//' |
            while read -r target; do printf '%s\t%s\t%s\n' "$f" "$target" md; done
    done
}
# an X.md with no folder may live anywhere: found when some tracked file ends in /X.md
exists() {
    local target=$1 kind=${2:-}
    [ -e "$target" ] && return 0
    [ "$kind" = md ] && [ "${target#*/}" = "$target" ] && printf '%s\n' "$tracked" | grep -qE "(^|/)${target//./\\.}$"
}
missing=0 checked=0
while IFS=$'\t' read -r file target kind; do
    checked=$((checked + 1))
    if ! exists "$target" "$kind"; then
        bad "$file cites $target, which the repository does not contain"
        missing=$((missing + 1))
    fi
done < <(cited_paths | sort -u)
[ $missing -eq 0 ] && ok "$checked citations, every one in the repository"
# negative control: the citations this repository once made of documents it lacked
if exists shared/DESIGN.md md || exists TOOLCHAIN.md md || exists docs/DESIGN.md md; then
    bad "negative control: a missing document was taken as present"
else
    ok "negative control: shared/DESIGN.md, TOOLCHAIN.md and docs/DESIGN.md are reported missing"
fi

# ---- 2. a header says what runs: chapter 10's MoE, not its dense shape, and the precision
if [ -x "$build/chapter10" ]; then
    out=$(OPENBLAS_NUM_THREADS=1 "$build/chapter10" --ranks 1 --part cost 2>&1)
    header=$(sed -n 's/^model: .* = \([0-9]*\) parameters;.*/\1/p' <<<"$out")
    moe=$(awk '$1 == "MoE" { print $2 }' <<<"$out")
    dense=$(awk '$1 == "dense" && NF == 4 { print $2 }' <<<"$out")
    # (the MoE holds more than the dense model: equal counts would not tell them apart)
    if [ -n "$moe" ] && [ "$header" = "$moe" ] && [ "$moe" != "$dense" ]; then
        ok "chapter10's header counts the MoE's $header parameters (the dense shape: $dense)"
    else
        bad "chapter10's header says '$header' parameters; the MoE holds '$moe' (dense '$dense')"
    fi
fi

# ... and the precision that runs: 16-bit gradients are not called fp32
if [ -x "$build/chapter1" ]; then
    out=$(OPENBLAS_NUM_THREADS=1 "$build/chapter1" --ranks 2 --strategy ddp --precision bf16 \
          --grad-dtype bf16 --layers 1 --dim 16 --heads 2 --ctx 8 --batch 4 --steps 1 --quiet 2>&1 |
          grep '^precision:')
    case "$out" in
        *"and gradients, fp32 master weights and AdamW") ok "chapter1 --grad-dtype bf16: $out" ;;
        *) bad "chapter1 --grad-dtype bf16 says: '$out' (its gradients are bf16)" ;;
    esac
fi

# ---- 3. --json against docs/json.md --------------------------------------------------
python=$(command -v python3 || echo /usr/bin/python3)
if ! "$python" -c 'import json' 2>/dev/null; then
    echo "SKIP: --json keys: no python3 to parse the output with"
    echo "docs-checks: $passed passed, $failed failed"
    [ $failed -eq 0 ]
    exit
fi
tiny="--layers 2 --dim 16 --heads 2 --ctx 8 --batch 8 --steps 2 --quiet"
# has_keys KEY...: stdin's JSON has every KEY (a.b nested, a[].b in every element)
has_keys() {
    "$python" -c '
import json, sys
def has(value, path):
    if not path: return True
    head, rest = path[0], path[1:]
    if head.endswith("[]"):
        items = value.get(head[:-2]) if isinstance(value, dict) else None
        return isinstance(items, list) and all(has(item, rest) for item in items)
    return isinstance(value, dict) and head in value and has(value[head], rest)
try:
    doc = json.load(sys.stdin)
except ValueError as e:
    print("does not parse: %s" % e); sys.exit(1)
lost = [k for k in sys.argv[1:] if not has(doc, k.split("."))]
if lost: print("missing: " + " ".join(lost)); sys.exit(1)
' "$@"
}
# plausible_losses: every "loss" list in stdin's JSON holds finite losses between 1 and
# twice ln(256), the byte vocabulary's uniform guess: these runs train a few steps from
# about ln(256) = 5.55 (a report read from freed memory printed 7738400 and 3.09e-41)
plausible_losses() {
    "$python" -c '
import json, math, sys
def losses(v):
    if isinstance(v, dict):
        for k, x in v.items():
            if k == "loss" and isinstance(x, list): yield from x
            else: yield from losses(x)
    elif isinstance(v, list):
        for x in v: yield from losses(x)
bad = [x for x in losses(json.load(sys.stdin))
       if not isinstance(x, (int, float)) or not math.isfinite(x) or not 1 < x < 2 * math.log(256)]
if bad: print("implausible losses: %s" % bad[:3]); sys.exit(1)
'
}
spec=$(sed -n '/^```keys$/,/^```$/p' docs/json.md | sed '1d;$d')
report=$(printf '%s\n' "$spec" | sed -n 's/^report = //p')
[ -n "$report" ] || bad "docs/json.md has no keys block with a report line"
example=""
while IFS= read -r line; do
    case "$line" in report\ =*|'') continue ;; esac
    run=${line%% : *}
    keys=${line#* : }
    keys=${keys//@report/$report}
    read -r -a words <<<"${run//TINY/$tiny}"
    program=$build/${words[0]}
    if [ ! -x "$program" ]; then bad "$program is not built (make all)"; continue; fi
    out=$(OPENBLAS_NUM_THREADS=1 "$program" --ranks "${words[1]}" "${words[@]:2}" --json 2>/dev/null)
    # shellcheck disable=SC2086
    if why=$(printf '%s' "$out" | has_keys $keys) && why=$(printf '%s' "$out" | plausible_losses); then
        ok "${words[0]} ${words[*]:1}: --json has its $(wc -w <<<"$keys") keys"
        [ -z "$example" ] && [ "${words[0]}" = baseline ] && example=$out
    else
        bad "${words[0]} ${words[*]:1} --json: $why"
    fi
done <<<"$spec"
# negative control: the baseline's report without one required key must fail
if [ -n "$example" ]; then
    # shellcheck disable=SC2086
    if why=$(printf '%s' "$example" | "$python" -c '
import json, sys
d = json.load(sys.stdin); del d["runs"][0]["memory_per_rank"]["activations"]; print(json.dumps(d))' |
             has_keys $report); then
        bad "negative control: a report without runs[].memory_per_rank.activations passed"
    else
        ok "negative control: a report without runs[].memory_per_rank.activations fails ($why)"
    fi
else
    bad "negative control: no baseline report to take a key from"
fi
# negative control: a loss read from freed memory must fail
if why=$(printf '{"runs": [{"loss": [5.57, 3.09e-41]}]}' | plausible_losses); then
    bad "negative control: a loss of 3.09e-41 passed"
else
    ok "negative control: a loss of 3.09e-41 fails ($why)"
fi
echo "docs-checks: $passed passed, $failed failed"
[ $failed -eq 0 ]
