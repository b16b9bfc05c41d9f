#!/usr/bin/env bash
# The CPU speed side by side of issue 20 (docs/benchmarks.md): `fp8 train` on the issue's model
# for each precision and PyTorch eager (benches/pytorch_cpu_baseline.py, fp32 and bf16 autocast,
# where torch can be imported), RUNS times interleaved, so that both meet the same load on a
# shared machine; then the medians and the ratios. Not run by CI.
#
# Usage: benches/cpu_side_by_side.sh TEXT [RUNS] [PRECISIONS]
#   FP8=path/to/fp8 (default target/release/fp8), STEPS (default 30), WARMUP (default 5),
#   PYTHON (default python3; PYTHONPATH as torch needs it).
# Prints, per run, the summary's tokens/s (every step timed) and the tokens/s of the steps after
# the first WARMUP (what the PyTorch script times), then the medians of both, PyTorch's medians,
# and ours after warm-up over PyTorch's (fp32 and fp8 recipes against PyTorch fp32, bf16 and fp16
# against bf16 autocast).
set -euo pipefail
text=${1:?usage: benches/cpu_side_by_side.sh TEXT [RUNS] [PRECISIONS]}
runs=${2:-3}
precisions=${3:-fp32,bf16,fp8-delayed}
fp8=${FP8:-target/release/fp8}
steps=${STEPS:-30}
warmup=${WARMUP:-5}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

[ -x "$fp8" ] || { echo "no fp8 binary at $fp8 (cargo build --release, or set FP8=)" >&2; exit 1; }
echo "fp8: $fp8 ($("$fp8" --version)), $steps steps, warm-up $warmup, $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"

rate() { # summary.json tokens/s and post-warm-up tokens/s of one run directory
    "$python" - "$1" "$2" "$warmup" <<'EOF'
import json, sys
out, precision, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
total = json.load(open(f"{out}/summary.json"))[precision]["tokens_per_s"]
rates = [json.loads(l)["tokens_per_s"] for l in open(f"{out}/{precision}/metrics.jsonl")]
later = rates[warmup:] or rates
print(f"{total:.0f} {len(later) / sum(1 / r for r in later):.0f}")
EOF
}

declare -A all later torch
have_torch=0
"$python" -c "import torch" 2>/dev/null && have_torch=1
IFS=, read -r -a names <<<"$precisions"
for run in $(seq 1 "$runs"); do
    for p in "${names[@]}"; do
        out="$work/$p-$run"
        if ! "$fp8" train --text "$text" --hidden 256 --layers 4 --heads 8 --ffn 1024 --seq 64 --batch 16 \
            --steps "$steps" --precision "$p" --quiet --out "$out" >"$out.log" 2>&1; then
            cat "$out.log" >&2
            exit 1
        fi
        read -r a b < <(rate "$out" "$p")
        all[$p]+="$a "
        later[$p]+="$b "
        echo "run $run $p: $a tokens/s (all steps), $b tokens/s (after step $warmup)"
    done
    if [ "$have_torch" = 1 ]; then
        # Prints "pytorch VERSION MODE: N tokens/s (...)" per mode.
        while read -r line; do
            echo "run $run $line"
            mode=$(echo "$line" | sed -E 's/^pytorch [^ ]+ ([^:]+):.*/\1/')
            torch[$mode]+="$(echo "$line" | sed -E 's/.*: ([0-9]+) tokens.*/\1/') "
        done < <("$python" "$here/pytorch_cpu_baseline.py" "$text" --steps "$steps" --warmup "$warmup" 2>/dev/null | grep '^pytorch')
    fi
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR + 1) / 2)]}'; }
for p in "${names[@]}"; do
    echo "median $p: $(echo "${all[$p]}" | median) tokens/s (all steps), $(echo "${later[$p]}" | median) (after step $warmup)"
done
if [ "$have_torch" = 0 ]; then
    echo "pytorch: skipped (torch cannot be imported by $python)"
    exit 0
fi
for mode in fp32 bf16-autocast; do
    if [ -z "${torch[$mode]:-}" ]; then
        echo "pytorch $mode: no result (run $here/pytorch_cpu_baseline.py by hand to see why)"
        continue
    fi
    echo "median pytorch $mode: $(echo "${torch[$mode]}" | median) tokens/s"
done
for p in "${names[@]}"; do
    case $p in bf16 | fp16) ref=bf16-autocast ;; *) ref=fp32 ;; esac
    [ -n "${torch[$ref]:-}" ] || continue
    ours=$(echo "${later[$p]}" | median)
    theirs=$(echo "${torch[$ref]}" | median)
    echo "ratio $p / pytorch $ref: $(awk -v a="$ours" -v b="$theirs" 'BEGIN {printf "%.2f", a / b}')x"
done
