#!/usr/bin/env bash
# Builds, in release, everything a GPU validation run needs into gpu-bundle/
# (ignored, < 64 MiB): the GPU test binaries (tests/gpu_*.rs and hopper_host;
# train_run is CPU-only), the `fp8` tool and run.sh, which runs them all (under
# compute-sanitizer memcheck, and racecheck on hopper_host, when present) and
# the CUDA GEMM benches, writing everything under $OUT (default: results/ next
# to run.sh). Copy the folder to a GPU machine (driver 580+, no toolkit needed)
# and run `OUT=/some/dir bash gpu-bundle/run.sh`.
# Usage: scripts/gpu-bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-bundle
if [[ -z "${NVCC:-}" ]] && ! command -v nvcc >/dev/null; then
    export NVCC="$(bash scripts/install-nvcc.sh | tail -1)"
fi
export FP8_DENY_SPILLS=1
rm -rf "$out" && mkdir -p "$out"
cargo build --release --bin fp8
# The test binaries that need a GPU: tests/gpu_*.rs.
gpu_tests="$(ls tests/gpu_*.rs | xargs -n1 basename | sed 's/\.rs$//') hopper_host"
for t in $gpu_tests; do
    bin=$(cargo test --release --no-run --test "$t" --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]: print(m["executable"])' | tail -1)
    cp "$bin" "$out/$t"
done
cp target/release/fp8 "$out/fp8"
strip --strip-debug "$out"/* 2>/dev/null || true
git rev-parse HEAD > "$out/COMMIT" 2>/dev/null || echo unknown > "$out/COMMIT"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every GPU check of this bundle. Everything goes under $OUT (default
# results/ here): summary.txt, the GEMM bench outputs, and logs.tar.gz (one log
# per step; the logs/ folder is removed once packed).
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/results}
mkdir -p "$OUT/logs"
logs=$OUT/logs
summary=$OUT/summary.txt
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(cat COMMIT)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
} > "$summary"
status=0
record() { # name, command... (stdout and stderr to logs/name.log)
    local name=$1; shift
    if "$@" > "$logs/$name.log" 2>&1; then echo "PASS $name" | tee -a "$summary"
    else echo "FAIL $name (logs/$name.log)" | tee -a "$summary"; status=1; fi
    tail -n 3 "$logs/$name.log" | sed 's/^/    /' >> "$summary"
}
record_out() { # name, file under $OUT for stdout, command... (stderr to logs/name.log)
    local name=$1 file=$2; shift 2
    if "$@" > "$OUT/$file" 2> "$logs/$name.log"; then echo "PASS $name ($file)" | tee -a "$summary"
    else echo "FAIL $name (logs/$name.log)" | tee -a "$summary"; status=1; fi
    tail -n 3 "$logs/$name.log" | sed 's/^/    /' >> "$summary"
}
record info ./fp8 info
sanitizer=$(command -v compute-sanitizer || true)
[[ -n $sanitizer ]] || echo "SKIP sanitizers: compute-sanitizer not on PATH" | tee -a "$summary"
for t in gpu_* hopper_host; do
    [[ -x $t ]] || continue
    record "$t" "./$t"
    if [[ -n $sanitizer ]]; then
        record "$t.memcheck" "$sanitizer" --tool memcheck --error-exitcode 1 "./$t"
        # racecheck on the warp-specialized Hopper kernel only (shared memory, mbarriers).
        [[ $t == hopper_host ]] && record "$t.racecheck" "$sanitizer" --tool racecheck --error-exitcode 1 "./$t"
    fi
done
record bench-cast ./fp8 bench cast --device cuda
record_out bench-gemm-llm-portable bench-gemm-llm-portable.jsonl \
    env FP8_GEMM_PATH=portable ./fp8 bench gemm --backend cuda --suite llm --json
record_out bench-gemm-llm-hopper bench-gemm-llm-hopper.jsonl \
    env FP8_GEMM_PATH=hopper ./fp8 bench gemm --backend cuda --suite llm --json
record_out bench-gemm-bf16-8192 bench-gemm-bf16-8192.txt \
    ./fp8 bench gemm --backend cuda --m 8192 --n 8192 --k 8192 --a-format bf16 --b-format bf16
echo "result: $([[ $status == 0 ]] && echo all passed || echo FAILURES)" | tee -a "$summary"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$logs"
exit $status
RUN
chmod +x "$out/run.sh"
size=$(du -sm "$out" | cut -f1)
echo "gpu-bundle: $out ($size MiB): $(ls "$out" | tr '\n' ' ')"
if (( size >= 64 )); then echo "gpu-bundle: over the 64 MiB limit" >&2; exit 1; fi
