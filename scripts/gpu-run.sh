#!/usr/bin/env bash
# Runs parts of the GPU bundle on a leased machine and leaves two files under $OUT (the folder a
# device call brings back): results.tar.gz (every summary, log archive and bench output) and
# summaries.txt. A device call brings back only a few files, so the results travel as one archive
# (the first call of 2026-11-28 lost its logs to that limit).
# Usage (on the device, from the repository root, after scripts/gpu-bundle.sh built gpu-bundle/
# here and the call carried it): bash scripts/gpu-run.sh BUDGET_S PART [PART...]
# BUDGET_S is shared by the parts in order: each gets what the ones before it left.
set -uo pipefail
if (($# < 2)); then
    echo "usage: scripts/gpu-run.sh BUDGET_S PART [PART...]" >&2
    exit 2
fi
budget=$1
shift
out=${OUT:?"OUT must name the folder the device call brings back"}
results=$(mktemp -d)
nvidia-smi > "$results/nvidia-smi.txt" 2>&1
for part in "$@"; do
    left=$((budget - SECONDS))
    if ((left < 30)); then
        echo "skipped part $part: $left s of the budget left" | tee -a "$results/skipped.txt"
        continue
    fi
    BUDGET_S=$left OUT=$results timeout $((left + 10)) bash gpu-bundle/run.sh "$part" \
        > "$results/console-$part.txt" 2>&1
done
tar -czf "$out/results.tar.gz" -C "$results" .
for part in "$@"; do
    cat "$results/summary-$part.txt" 2>/dev/null || cat "$results/summary.txt" 2>/dev/null
done > "$out/summaries.txt"
cat "$results/skipped.txt" >> "$out/summaries.txt" 2>/dev/null
cat "$out/summaries.txt"
