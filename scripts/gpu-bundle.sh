#!/usr/bin/env bash
# Builds, in release, everything a GPU validation run needs into gpu-bundle/
# (ignored, < 64 MiB): the GPU test binaries, the `fp8` tool and run.sh,
# which runs them all (under compute-sanitizer memcheck and racecheck when
# present) and writes gpu-bundle/summary.txt. Copy the folder to a GPU
# machine (driver 580+, no toolkit needed) and run `bash gpu-bundle/run.sh`.
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
gpu_tests=$(ls tests/gpu_*.rs | xargs -n1 basename | sed 's/\.rs$//')
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
# Runs every GPU check of this bundle; writes summary.txt next to this script.
cd "$(dirname "$0")"
summary=summary.txt
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(cat COMMIT)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
} > "$summary"
status=0
record() { # name, command...
    local name=$1; shift
    if "$@" > "logs/$name.log" 2>&1; then echo "PASS $name" | tee -a "$summary"
    else echo "FAIL $name (logs/$name.log)" | tee -a "$summary"; status=1; fi
    tail -n 3 "logs/$name.log" | sed 's/^/    /' >> "$summary"
}
mkdir -p logs
record info ./fp8 info
for t in gpu_*; do
    [[ -x $t ]] || continue
    record "$t" "./$t"
    if command -v compute-sanitizer >/dev/null; then
        record "$t.memcheck" compute-sanitizer --tool memcheck --error-exitcode 1 "./$t"
        record "$t.racecheck" compute-sanitizer --tool racecheck --error-exitcode 1 "./$t"
    else
        echo "SKIP sanitizers: compute-sanitizer not on PATH" | tee -a "$summary"
    fi
done
record bench-cast ./fp8 bench cast --device cuda
record bench-cast-json ./fp8 bench cast --device cuda --json
echo "result: $([[ $status == 0 ]] && echo all passed || echo FAILURES)" | tee -a "$summary"
exit $status
RUN
chmod +x "$out/run.sh"
size=$(du -sm "$out" | cut -f1)
echo "gpu-bundle: $out ($size MiB): $(ls "$out" | tr '\n' ' ')"
if (( size >= 64 )); then echo "gpu-bundle: over the 64 MiB limit" >&2; exit 1; fi
