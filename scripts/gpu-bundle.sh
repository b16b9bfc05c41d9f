#!/usr/bin/env bash
# Builds, in release, everything a GPU validation run needs into gpu-bundle/
# (ignored, < 64 MiB): the GPU test binaries (tests/gpu_*.rs and hopper_host;
# train_run is CPU-only), the `fp8` tool and run.sh. run.sh checks the driver
# first, then runs every step under `timeout` in the order of
# docs/gpu-validation.md (load everything, memory-bound kernels, the layer
# ops against their CPU twins, portable GEMMs, the Hopper probes and random
# cases, the self-check, sanitizers on the small Hopper cases, benches) and writes $OUT/summary.txt: one PASS / FAIL /
# SKIP line per step with its worst err/bound. `run.sh layers` runs the second
# part instead: the MXFP8 GEMM, every layer on the CUDA backend (resident by default) in shadow
# mode, NCCL and the layer bench (summary-layers.txt); `run.sh train` the third: `fp8 train`
# on both devices (fp32 included, resume across devices) and the tiny Llama
# model with generation (summary-train.txt); `run.sh benches` the GEMM cases the
# llm suite leaves out; `run.sh profile` ncu's counters of the Hopper GEMM and the
# cast + transpose (not yet run on a GPU); `run.sh fresh` what no GPU has run yet (the suites under
# the resident and tensor-core defaults, the staged variants, the larger model), most important first, for a short lease. Each part's step
# limits add up to under 15 minutes.
# `run.sh all` runs every part's steps (about 3 minutes on an H200), and
# BUDGET_S=N cuts each step's limit to what is left of N seconds. Copy the folder
# to a GPU machine (driver 580+, no toolkit needed) and run
# `BUDGET_S=300 OUT=/some/dir bash gpu-bundle/run.sh all` (or one part).
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
# The library's unit tests: the device-value arms against the host-value ones need the crate's
# private op trait (dispatch::device_values_tests).
bin=$(cargo test --release --no-run --lib --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]: print(m["executable"])' | tail -1)
cp "$bin" "$out/lib_tests"
cp target/release/fp8 "$out/fp8"
# The random checkpoint writer of the fine-tuning part (examples/hf_load.rs), with the configs
# and a tokenizer (any will do: its ids fit every Llama vocabulary).
cargo build --release --example hf_load
cp target/release/examples/hf_load "$out/hf_load"
cp tests/fixtures/plan/llama-2-7b.json tests/fixtures/plan/llama-2-13b.json "$out/"
cp tests/fixtures/hf/metaspace/tokenizer.json "$out/tokenizer.json"
# The tiny checkpoints and text of the staged-against-resident fine-tunes (`finetune_resident`).
cp -r tests/fixtures/hf/models/qwen2 tests/fixtures/hf/models/llama "$out/"
cp tests/fixtures/hf/text/finetune.txt "$out/finetune.txt"
strip --strip-debug "$out"/* 2>/dev/null || true
# Gzipped (lib_tests 14 -> 6 MiB, fp8 16 -> about 7) to keep the bundle under the 64 MiB a device
# call carries; run.sh unpacks them.
gzip -9 "$out/lib_tests" "$out/fp8" "$out/hf_load"
# The text the larger model of the train part reads (characters; any text of ~10 KB will do).
cp README.md "$out/text.txt"
git rev-parse HEAD > "$out/COMMIT" 2>/dev/null || echo unknown > "$out/COMMIT"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every GPU check of this bundle, each under `timeout` (a hang costs at
# most its step's limit; the limits add up to under 15 minutes). Everything
# goes under $OUT (default results/ here): summary.txt (one PASS/FAIL/SKIP
# line per step, with the worst err/bound the step printed), the GEMM bench
# outputs, and logs.tar.gz (one log per step). `run.sh layers` and `run.sh
# train` and `run.sh benches` run the other parts instead: summary-PART.txt
# and logs-PART.tar.gz.
# `run.sh all` runs the three parts' steps in one go, correctness before the
# long benches (summary-all.txt). `run.sh finetune` (not in `all`: it writes
# 40 GB of random checkpoints) measures issue 18's 7B and 13B fine-tunes; `run.sh finetune_7b`
# and `run.sh finetune_13b` one of them each. BUDGET_S=N cuts every step's limit to what is
# left of N seconds and skips the steps that no longer fit, so a leased GPU's
# time cannot be overrun (the summary and logs are always written).
part=${1:-kernels}
case $part in
    kernels) suffix="" ;;
    benches) suffix="-benches" ;;
    layers) suffix="-layers" ;;
    train) suffix="-train" ;;
    profile) suffix="-profile" ;;
    fresh) suffix="-fresh" ;;
    banks) suffix="-banks" ;;
    views) suffix="-views" ;;
    finetune) suffix="-finetune" ;;
    finetune_7b) suffix="-finetune_7b" ;;
    finetune_13b) suffix="-finetune_13b" ;;
    all) suffix="-all" ;;
    *) echo "usage: run.sh [kernels|benches|layers|train|profile|fresh|banks|views|finetune|finetune_7b|finetune_13b|all]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")"
# The library's unit tests and the fp8 tool travel gzipped (the bundle's size limit),
# unpacked beside it for the run (not /tmp, which may be mounted noexec) and removed at the end
# (so the bundle can be carried again).
lib_tests=$PWD/.lib_tests
gunzip -c lib_tests.gz > "$lib_tests" && chmod +x "$lib_tests"
gunzip -c fp8.gz > fp8 && chmod +x fp8
gunzip -c hf_load.gz > hf_load && chmod +x hf_load
trap 'rm -f "$lib_tests" fp8 hf_load' EXIT
OUT=${OUT:-$PWD/results}
export OUT # the steps run through `bash -c` (finetune keeps its memory samples there)
logs=$OUT/logs$suffix
mkdir -p "$logs"
summary=$OUT/summary$suffix.txt
budget=${BUDGET_S:-0}
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(cat COMMIT)"
    echo "part: $part$( ((budget > 0)) && echo ", budget $budget s")"
} > "$summary"
status=0
say() { echo "$*" | tee -a "$summary"; }

# cuBLASLt, NCCL and compute-sanitizer are found where a CUDA image keeps them
# when they are not on the default paths (the kernels themselves need only the driver).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    /usr/lib/python3*/site-packages/nvidia/*/lib /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
    /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
    [[ -d $d ]] && LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
done
export LD_LIBRARY_PATH
[[ -d /usr/local/cuda/bin ]] && PATH=$PATH:/usr/local/cuda/bin

# The worst "err/bound=X" a log printed, and how many it printed.
ratios() {
    grep -oE "err/bound=[0-9.eE+-]+|err/bound=inf" "$1" 2>/dev/null \
        | cut -d= -f2 | sort -g | awk 'END { if (NR) printf "; worst err/bound=%s over %d", $0, NR }'
}

# fit LIMIT: LIMIT cut to what is left of BUDGET_S (15 s kept for `timeout -k`
# and the archive); 0 when under 20 s would be left.
fit() {
    if ((budget <= 0)); then echo "$1"; return; fi
    local left=$((budget - SECONDS - 15))
    if ((left < 20)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}

# step NAME LIMIT_S COMMAND...: runs COMMAND under `timeout`, output to logs/NAME.log.
# SKIP when it exits 0 after printing "skipped:", PASS on 0, FAIL otherwise.
step() {
    local name=$1 limit; limit=$(fit "$2"); shift 2
    if ((limit == 0)); then say "SKIP $name: out of the run's time budget ($budget s)"; return; fi
    local log=$logs/$name.log start=$SECONDS rc
    timeout -k 10 "$limit" "$@" > "$log" 2>&1
    rc=$?
    local took="$((SECONDS - start)) s of $limit"
    if [[ $rc == 0 ]] && grep -q "skipped:" "$log"; then
        say "SKIP $name ($took): $(grep -m1 -o "skipped:.*" "$log")"
    elif [[ $rc == 0 ]]; then
        say "PASS $name ($took$(ratios "$log"))"
    elif [[ $rc == 124 || $rc == 137 ]]; then
        say "FAIL $name: timed out after $limit s (logs/$name.log$(ratios "$log"))"; status=1
    else
        say "FAIL $name: exit $rc (logs/$name.log$(ratios "$log"))"; status=1
        tail -n 3 "$log" | sed 's/^/    /' >> "$summary"
    fi
}

# step_out NAME LIMIT_S FILE COMMAND...: as step, stdout to $OUT/FILE (bench JSON or table).
step_out() {
    local name=$1 limit file=$3; limit=$(fit "$2"); shift 3
    if ((limit == 0)); then say "SKIP $name: out of the run's time budget ($budget s)"; return; fi
    local start=$SECONDS rc
    timeout -k 10 "$limit" "$@" > "$OUT/$file" 2> "$logs/$name.log"
    rc=$?
    cat "$OUT/$file" >> "$logs/$name.log"
    local took="$((SECONDS - start)) s of $limit"
    if [[ $rc == 0 ]]; then say "PASS $name ($took$(ratios "$logs/$name.log")) -> $file"
    elif [[ $rc == 124 || $rc == 137 ]]; then say "FAIL $name: timed out after $limit s"; status=1
    else say "FAIL $name: exit $rc (logs/$name.log$(ratios "$logs/$name.log"))"; status=1
        tail -n 3 "$logs/$name.log" | sed 's/^/    /' >> "$summary"; fi
}

# 0. The driver: the fatbins are built by CUDA 13.0 and need driver 580 or newer.
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
driver=$(cut -d, -f2 <<<"$gpu" | tr -d ' ')
if [[ -z $driver ]]; then
    say "SKIP driver: no NVIDIA driver (nvidia-smi missing or no GPU): the GPU steps below can only skip"
    no_gpu=1
elif (( ${driver%%.*} < 580 )); then
    say "FAIL driver: $driver is older than 580; this bundle's CUDA 13.0 kernels cannot load on it (install driver 580+)"
    say "result: FAILURES"
    exit 1
else
    say "PASS driver: $gpu"
fi

gpu_step() { # gpu_step step|step_out NAME ...: a step that needs a GPU, SKIP without one
    if [[ -n ${no_gpu:-} ]]; then say "SKIP $2: no GPU"; else "$@"; fi
}

# The order localizes failures: loading, memory-bound kernels (bit-exact), the
# layer ops (bit-exact or within their contract's bound), the portable GEMMs
# (the self-check's reference), the Hopper probes (exact, one tile first), its
# random cases, then the self-check, sanitizers and benches. A failed probe
# step skips the later Hopper steps: their kernels would be the ones that failed,
# and the production variants have no bounded waits.
hopper_step() { # hopper_step step|step_out NAME ...: SKIP once the probes failed
    if [[ -n ${hopper_failed:-} ]]; then say "SKIP $2: hopper_probes failed"; else gpu_step "$@"; fi
}
# part: kernels
part_kernels() {
step info 45 ./fp8 info --load-all
step gpu_kernels 60 ./gpu_kernels
step gpu_ops 90 ./gpu_ops
step device_values 40 "$lib_tests" dispatch::device_values_tests:: dispatch::gqa_device_tests:: model::ends_tests:: --test-threads=1 --nocapture
step gpu_gemm 75 ./gpu_gemm
local before=$status
step hopper_probes 90 ./hopper_host hopper_probes --test-threads=1 --nocapture
[[ $status != "$before" ]] && hopper_failed=1
hopper_step step hopper_random 90 ./hopper_host hopper_gemm_matches --test-threads=1 --nocapture
hopper_step step_out self_check 30 self-check.txt env FP8_GEMM_PATH=hopper ./fp8 bench gemm --backend cuda \
    --m 512 --n 512 --k 512 --repeat 1
sanitizer=$(command -v compute-sanitizer || true)
if [[ -z $sanitizer ]]; then
    say "SKIP sanitizers: compute-sanitizer not on PATH"
else
    # The small probes only (HOPPER_HOST_SMALL): a sanitizer slows kernels 10-100x.
    # Limits: both took 2-3 s on an H200 (first run, 2026-11-27).
    hopper_step step memcheck 60 env HOPPER_HOST_SMALL=1 "$sanitizer" --tool memcheck --error-exitcode 1 \
        ./hopper_host hopper_probes --test-threads=1
    hopper_step step synccheck 60 env HOPPER_HOST_SMALL=1 "$sanitizer" --tool synccheck --error-exitcode 1 \
        ./hopper_host hopper_probes --test-threads=1
    # The layer-op kernels under memcheck (it found the norm's missing rstd address and the
    # attention kernels' vector read past their shared rows on the first run).
    gpu_step step memcheck_ops 60 "$sanitizer" --tool memcheck --print-limit 5 --error-exitcode 1 ./gpu_ops
fi
gpu_step step bench_cast 30 ./fp8 bench cast --device cuda
gpu_step step_out bench_gemm_llm_portable 80 bench-gemm-llm-portable.jsonl \
    env FP8_GEMM_PATH=portable ./fp8 bench gemm --backend cuda --suite llm --json
hopper_step step_out bench_gemm_llm_hopper 80 bench-gemm-llm-hopper.jsonl \
    env FP8_GEMM_PATH=hopper ./fp8 bench gemm --backend cuda --suite llm --json
}
# end of part

# part: benches
# The GEMM cases the llm suite leaves out: bf16 (portable vs cuBLASLt), FP8 8192^3 with fast
# accumulation (the llm suite's 8192^3 row is split), block-scaled 4096x7168x16384.
part_benches() {
gpu_step step_out bench_gemm_bf16_8192 30 bench-gemm-bf16-8192.txt \
    ./fp8 bench gemm --backend cuda --m 8192 --n 8192 --k 8192 --a-format bf16 --b-format bf16
gpu_step step_out bench_gemm_fast_8192 30 bench-gemm-fast-8192.txt \
    ./fp8 bench gemm --backend cuda --m 8192 --n 8192 --k 8192 --split off
gpu_step step_out bench_gemm_block 40 bench-gemm-block.txt \
    ./fp8 bench gemm --backend cuda --m 4096 --n 7168 --k 16384 --scaling block
}
# end of part

# part: profile
# Hardware counters (ncu, clocks left alone) of the kernels that miss their targets: the
# Hopper GEMM at 8192^3 and the cast + transpose + amax at 8192^2. SKIP without ncu.
part_profile() {
local ncu
ncu=$(command -v ncu || true)
if [[ -z $ncu ]]; then say "SKIP profile: ncu not on PATH"; return; fi
local sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
    --section WarpStateStats --section LaunchStats --section Occupancy)
gpu_step step_out profile_gemm 90 profile-gemm.txt env FP8_GEMM_PATH=hopper "$ncu" --clock-control none \
    -k regex:fp8_gemm_wgmma_n256 --launch-skip 2 --launch-count 1 "${sections[@]}" \
    ./fp8 bench gemm --backend cuda --m 8192 --n 8192 --k 8192 --repeat 3
gpu_step step_out profile_cast 60 profile-cast.txt "$ncu" --clock-control none \
    -k regex:fp8_cast_transpose_amax --launch-skip 2 --launch-count 1 "${sections[@]}" \
    ./fp8 bench cast --device cuda
}
# end of part

# part: layers
# The MXFP8 GEMM kernels against the CPU GEMM (exact probes, then the bound), which the layers'
# MXFP8 cases use; every layer x precision on the staged CUDA backend, every op checked against
# its CPU twin; NCCL at world size 1 (skips without libnccl on the machine).
part_layers_checks() {
step gpu_mxfp8 45 ./gpu_mxfp8
step gpu_layers 200 ./gpu_layers
step gpu_nccl 60 ./gpu_nccl
}
# The issue's layer FP8 vs bf16 (default: resident, tensor-core attention), with the time per
# op family and, inside the ops, the copies, waits for the GPU, allocations and host work
# (--breakdown); then the same with every op waiting for its kernels (--sync-ops), which
# charges each family its own GPU time and leaves "outside ops" host work; then staged (every
# op's copies included) with the simple attention, the path of the first runs.
part_layers_bench() {
gpu_step step_out bench_layer 120 bench-layer.txt ./fp8 bench layer --device cuda \
    --hidden 4096 --heads 32 --ffn 16384 --seq 2048 --batch 2 --runs 3 --precision bf16,fp8-delayed --breakdown
gpu_step step_out bench_layer_sync 90 bench-layer-sync.txt ./fp8 bench layer --device cuda \
    --hidden 4096 --heads 32 --ffn 16384 --seq 2048 --batch 2 --runs 1 --precision bf16,fp8-delayed --breakdown --sync-ops
gpu_step step_out bench_layer_staged 90 bench-layer-staged.txt env FP8_CUDA_RESIDENT=0 FP8_CUDA_ATTENTION_MMA=0 \
    ./fp8 bench layer --device cuda --hidden 4096 --heads 32 --ffn 16384 --seq 2048 --batch 2 --runs 1 \
    --precision bf16,fp8-delayed --breakdown
}
# end of part
# part: fresh
# What no GPU has run yet, most important first, for a short lease (`run.sh fresh`; `run.sh
# all` runs `part_fresh_rest` after the other parts). Since the H200 run of 2026-11-28 the
# layers keep their activations on the GPU (FP8_CUDA_RESIDENT=0: staged) and the attention
# runs on tensor cores (FP8_CUDA_ATTENTION_MMA=0: the simple kernels) by default; that run's
# test fixes (device_values, gpu_ops' normwise attention bound) and the default suites under
# the new defaults (gpu_layers, gpu_train, gpu_llama) come first, then the staged variants,
# the larger model, and the issue's layer.
part_fresh() {
step device_values 30 "$lib_tests" dispatch::device_values_tests:: dispatch::gqa_device_tests:: model::ends_tests:: --test-threads=1 --nocapture
step gpu_ops 40 ./gpu_ops
step gpu_layers 60 ./gpu_layers
step gpu_train 60 ./gpu_train
step gpu_llama 30 ./gpu_llama
part_fresh_rest
part_banks
part_views
train_large
part_layers_bench
}
part_fresh_rest() {
# The staged path (every op's operands copied in and out): the same device tests and layers.
step device_values_staged 30 env FP8_CUDA_RESIDENT=0 "$lib_tests" dispatch::device_values_tests:: \
    dispatch::gqa_device_tests:: model::ends_tests:: --test-threads=1 --nocapture
step gpu_layers_staged 60 env FP8_CUDA_RESIDENT=0 ./gpu_layers
step attention_mma 30 "$lib_tests" backend::cuda::attention_mma::tests::gpu_ --test-threads=1 --nocapture
local sanitizer
sanitizer=$(command -v compute-sanitizer || true)
if [[ -z $sanitizer ]]; then
    say "SKIP memcheck_attention_mma: compute-sanitizer not on PATH"
else
    gpu_step step memcheck_attention_mma 60 "$sanitizer" --tool memcheck --print-limit 5 --error-exitcode 1 \
        "$lib_tests" backend::cuda::attention_mma::tests::gpu_self_check --test-threads=1
fi
gpu_step step gpu_ops_simple 40 env FP8_CUDA_ATTENTION_MMA=0 ./gpu_ops
# The whole Llama model on the simple attention kernels too: if `gpu_llama`'s gradients (fp16's
# bound is the tightest, and the tensor-core attention's gradients differ more from the CPU's)
# pass here and not there, the attention kernel is the difference.
gpu_step step gpu_llama_simple 30 env FP8_CUDA_ATTENTION_MMA=0 ./gpu_llama
# `fp8 train` staged (FP8_CUDA_RESIDENT=0) against the default (resident): the same kernels on
# the same values, so every step's loss, gradient norm and FP8 statistics must be the same;
# tokens/s of both.
gpu_step step_out train_resident 60 train-resident.txt bash -c '
fail=0
for run in staged resident; do
    dir=$(mktemp -d); eval "dir_$run=$dir"
    env $([[ $run == staged ]] && echo FP8_CUDA_RESIDENT=0) ./fp8 train --device cuda --steps 60 --micro-batches 2 \
        --compare fp32,bf16,fp8-delayed --quiet --out "$dir" > "$dir/log" 2>&1 || { echo "$run: failed"; tail -n 3 "$dir/log"; exit 1; }
    echo "$run: $(tr -d " \n" < "$dir/summary.json" | grep -o "\"[a-z0-9-]*\":{[^}]*tokens_per_s\":[0-9.]*" | sed "s/\":{.*tokens_per_s\":/ /; s/\"//g" | tr "\n" " ")tokens/s"
done
for p in fp32 bf16 fp8-delayed; do
    strip() { sed -E "s/\"tokens_per_s\":[0-9.eE+-]+,?//g" "$1/$p/metrics.jsonl"; }
    if diff <(strip "$dir_staged") <(strip "$dir_resident") > /dev/null; then
        echo "$p: every step the same (loss, gradient norm, FP8 statistics)"
    else
        echo "$p: the resident run differs:"; diff <(strip "$dir_staged") <(strip "$dir_resident") | head -c 800; echo; fail=1
    fi
done
exit $fail'
# Fine-tunes of the tiny checkpoints, staged against resident: a Qwen2 LoRA with dropout (untied
# head, q/k/v biases), recompute and two micro-batches, and a full Llama fine-tune (tied head):
# the models' ends, biases and dropout masks on the device must give every step's metrics, the
# checkpoint and the adapter files of the staged run.
gpu_step step_out finetune_resident 60 finetune-resident.txt bash -c '
fail=0
for case in "qwen2 --lora-rank 16 --lora-dropout 0.1 --recompute every" "llama"; do
    for run in staged resident; do
        dir=$(mktemp -d); eval "dir_$run=$dir"
        env $([[ $run == staged ]] && echo FP8_CUDA_RESIDENT=0) ./fp8 train --device cuda --init-from $case \
            --text finetune.txt --seq 16 --steps 8 --batch 4 --micro-batches 2 --compare bf16,fp8-delayed \
            --quiet --out "$dir" > "$dir/log" 2>&1 || { echo "$case, $run: failed"; tail -n 3 "$dir/log"; exit 1; }
    done
    for p in bf16 fp8-delayed; do
        strip() { sed -E "s/\"tokens_per_s\":[0-9.eE+-]+,?//g" "$1/$p/metrics.jsonl"; }
        same=1
        diff <(strip "$dir_staged") <(strip "$dir_resident") > /dev/null || same=0
        for f in checkpoint.safetensors adapter/adapter_model.safetensors; do
            [[ -f $dir_staged/$p/$f ]] && { cmp -s "$dir_staged/$p/$f" "$dir_resident/$p/$f" || same=0; }
        done
        if ((same)); then echo "${case%% *} $p: every step, the checkpoint and the adapters the same"
        else echo "${case%% *} $p: the resident run differs:"; diff <(strip "$dir_staged") <(strip "$dir_resident") | head -c 800; echo; fail=1
        fi
    done
done
exit $fail'
}
# Slot banks on the device (FP8_CUDA_DEVICE_BANKS=1: opt-in, not yet run on a GPU). The device
# tests with the banks of device-fed layers kept there, against host-fed layers whose banks
# stay home (same bits); `fp8 train` fp8-delayed with and without them (every step's loss,
# gradient norm and FP8 statistics the same; tokens/s of both); the issue's layer with them.
part_banks() {
step device_values_banks 30 env FP8_CUDA_DEVICE_BANKS=1 "$lib_tests" dispatch::device_values_tests:: \
    dispatch::gqa_device_tests:: model::ends_tests:: --test-threads=1 --nocapture
gpu_step step_out train_banks 45 train-banks.txt bash -c '
for run in host device; do
    dir=$(mktemp -d); eval "dir_$run=$dir"
    env $([[ $run == device ]] && echo FP8_CUDA_DEVICE_BANKS=1) ./fp8 train --device cuda --steps 60 --micro-batches 2 \
        --compare fp8-delayed --quiet --out "$dir" > "$dir/log" 2>&1 || { echo "$run: failed"; tail -n 3 "$dir/log"; exit 1; }
    echo "banks on the $run: $(tr -d " \n" < "$dir/summary.json" | grep -o "tokens_per_s\":[0-9.]*" | head -1) "
done
strip() { sed -E "s/\"tokens_per_s\":[0-9.eE+-]+,?//g" "$1/fp8-delayed/metrics.jsonl"; }
if diff <(strip "$dir_host") <(strip "$dir_device") > /dev/null; then
    echo "fp8-delayed: every step the same (loss, gradient norm, FP8 statistics)"
else
    echo "fp8-delayed: the run with device banks differs:"; diff <(strip "$dir_host") <(strip "$dir_device") | head -c 800; echo; exit 1
fi'
gpu_step step_out bench_layer_banks 60 bench-layer-banks.txt env FP8_CUDA_DEVICE_BANKS=1 ./fp8 bench layer \
    --device cuda --hidden 4096 --heads 32 --ffn 16384 --seq 2048 --batch 2 --runs 2 --precision bf16,fp8-delayed --breakdown
}
# Parameters in their arena ranges (FP8_CUDA_ARENA_VIEWS=1: opt-in, not yet run on a GPU): the
# optimizer's value and gradient arenas lend each parameter its range, which a parameter kept
# on the GPU holds instead of a device copy of its own. The device tests with it (a linear
# training in its ranges with the bits of host parameters), then `fp8 train` with and without
# it, with 1 and 2 micro-batches: every step the same; tokens/s and peak bytes of both.
part_views() {
step device_values_views 30 env FP8_CUDA_ARENA_VIEWS=1 "$lib_tests" dispatch::device_values_tests:: \
    dispatch::gqa_device_tests:: model::ends_tests:: --test-threads=1 --nocapture
gpu_step step_out train_views 60 train-views.txt bash -c '
fail=0
for mb in 1 2; do
    for run in own views; do
        dir=$(mktemp -d); eval "dir_$run=$dir"
        env $([[ $run == views ]] && echo FP8_CUDA_ARENA_VIEWS=1) ./fp8 train --device cuda --steps 40 \
            --micro-batches $mb --compare bf16,fp8-delayed --quiet --out "$dir" > "$dir/log" 2>&1 \
            || { echo "$run, $mb micro-batches: failed"; tail -n 3 "$dir/log"; exit 1; }
        echo "$run copies, $mb micro-batches: $(tr -d " \n" < "$dir/summary.json" | grep -o "\"[a-z0-9-]*\":{[^}]*\"peak_bytes\":[0-9]*" | sed -E "s/\":\{.*tokens_per_s\":([0-9.]*).*\"peak_bytes\":/ \1 tokens\/s, peak /; s/\"//g" | tr "\n" ";")"
    done
    for p in bf16 fp8-delayed; do
        strip() { sed -E "s/\"tokens_per_s\":[0-9.eE+-]+,?//g" "$1/$p/metrics.jsonl"; }
        if diff <(strip "$dir_own") <(strip "$dir_views") > /dev/null; then
            echo "$p, $mb micro-batches: every step the same (loss, gradient norm, FP8 statistics)"
        else
            echo "$p, $mb micro-batches: the run in arena ranges differs:"; diff <(strip "$dir_own") <(strip "$dir_views") | head -c 800; echo; fail=1
        fi
        # The ranges replace the device copies (8 bytes per trainable value): a lower peak says
        # the parameters held them. (The quote keeps `device_peak_bytes`, the count of the
        # driver, out: the ranges change the peak of the ledger, `peak_bytes`.)
        peak() { tr -d " \n" < "$1/summary.json" | grep -o "\"$p\":{[^}]*" | grep -o "\"peak_bytes\":[0-9]*" | grep -o "[0-9]*$"; }
        own=$(peak "$dir_own"); views=$(peak "$dir_views")
        if [[ -n $own && -n $views ]] && ((views < own)); then
            echo "$p, $mb micro-batches: peak $own -> $views bytes in arena ranges"
        else
            echo "$p, $mb micro-batches: the peak did not fall in arena ranges ($own -> $views bytes)"; fail=1
        fi
    done
done
exit $fail'
}
# end of part
# part: train
# The larger model of issue 15 (12 layers x 768, seq 512, 4096 tokens a step): tokens/s, model
# FLOP/s and MFU (the `model FLOPs:` line of `fp8 train`), one `fp8 train` per precision so a
# timeout keeps the precisions that finished (its first try, 20 steps of both in one call,
# timed out after 99 s on 2026-11-28 with nothing printed).
train_large() {
gpu_step step_out train_large 120 train-large.txt bash -c '
for p in bf16 fp8-delayed; do
    dir=$(mktemp -d)
    ./fp8 train --device cuda --text text.txt --seq 512 --layers 12 --hidden 768 --heads 12 --batch 8 \
        --steps 10 --compare $p --quiet --out "$dir" > "$dir/log" 2>&1
    rc=$?
    grep -E "^(precision|bf16 |fp8-delayed |model FLOPs|fp8: error)" "$dir/log"
    [[ $rc == 0 ]] || { tail -n 3 "$dir/log"; exit $rc; }
done'
}
# Short `fp8 train` runs on both devices (every op checked against its CPU twin), fp32 on
# cuBLASLt, the default --compare, resume across devices; then the tiny Llama model (rotary,
# grouped-query and cached attention) forward + backward and greedy generation.
part_train() {
step gpu_train 420 ./gpu_train
step gpu_llama 180 ./gpu_llama
# Per-op latency near the default model's size (hidden 64): where a staged step of `fp8 train` goes.
gpu_step step_out bench_layer_small 30 bench-layer-small.txt ./fp8 bench layer --device cuda --runs 20 --hidden 64 --ffn 256 \
    --precision fp32,bf16,fp8-delayed --breakdown
train_large
# tokens/s of the default model with the staged path's shortcuts on, then each one off
# (docs/cuda-backend.md: device mirrors of FP8 casts, AdamW over device arenas, pinned staging),
# then on again: the first setting ran faster off than on in both 2026-11-27 runs, so the
# second default line tells the order's effect from the setting's.
gpu_step step_out bench_train_shortcuts 120 bench-train-shortcuts.txt bash -c '
for setting in "" FP8_CUDA_MIRRORS=0 FP8_CUDA_ARENAS=0 FP8_CUDA_PINNED=0 ""; do
    dir=$(mktemp -d)
    env $setting ./fp8 train --device cuda --steps 300 --compare fp32,fp8-delayed --quiet --out "$dir" \
        > "$dir/log" 2>&1 || { echo "${setting:-default}: failed"; tail -n 3 "$dir/log"; exit 1; }
    echo "${setting:-default}: $(tr -d " \n" < "$dir/summary.json" | grep -o "\"[a-z0-9-]*\":{[^}]*tokens_per_s\":[0-9.]*" | sed "s/\":{.*tokens_per_s\":/ /; s/\"//g" | tr "\n" " ")tokens/s"
done'
}
# end of part

# part: finetune
# Issue 18 on the GPU: a random Llama-2-7B-shaped checkpoint (then 13B) written here, planned
# and fine-tuned for 2 steps with an FP8 base, LoRA r16 on q, k, v, o, seq 2048, micro-batch 1
# and recompute; the GPU's peak memory in use (nvidia-smi, every 50 ms, CUDA context included)
# beside the plan's total and the run's memory summary. Each checkpoint is removed after its run
# (13.5 and 26 GB).
# `run.sh finetune_7b` and `run.sh finetune_13b` run one model each (a 15-minute lease holds one
# of them beside `fresh`: their steps' limits add up to 375 s and 495 s).
part_finetune() {
part_finetune_7b
part_finetune_13b
}
part_finetune_7b() {
local dir=${FT_DIR:-$PWD/ft-models}
export -f generate plan finetune # `timeout` runs them through bash -c
rm -rf "$dir"
gpu_step step_out gen_llama_2_7b 120 gen-llama-2-7b.txt bash -c 'generate "$@"' _ "$dir" llama-2-7b
gpu_step step_out plan_llama_2_7b 15 plan-llama-2-7b.txt bash -c 'plan "$@"' _ "$dir" llama-2-7b
gpu_step step_out finetune_llama_2_7b 240 finetune-llama-2-7b.txt bash -c 'finetune "$@"' _ "$dir" llama-2-7b
rm -rf "$dir"
}
part_finetune_13b() {
local dir=${FT_DIR:-$PWD/ft-models}
export -f generate plan finetune
rm -rf "$dir"
gpu_step step_out gen_llama_2_13b 180 gen-llama-2-13b.txt bash -c 'generate "$@"' _ "$dir" llama-2-13b
gpu_step step_out plan_llama_2_13b 15 plan-llama-2-13b.txt bash -c 'plan "$@"' _ "$dir" llama-2-13b
gpu_step step_out finetune_llama_2_13b 300 finetune-llama-2-13b.txt bash -c 'finetune "$@"' _ "$dir" llama-2-13b
rm -rf "$dir"
}
# generate DIR MODEL: a random checkpoint of MODEL.json's shapes and a tokenizer in DIR/MODEL.
generate() { ./hf_load generate "$1/$2" "$2.json" && cp tokenizer.json "$1/$2/"; }
# plan DIR MODEL: the planner's prediction for the run below.
plan() {
    ./fp8 plan --model "$1/$2" --lora-rank 16 --base-precision fp8 --recompute every --seq 2048 --micro-batch 1 \
        --precision bf16 --device cpu
}
# finetune DIR MODEL: 2 steps of the fine-tune. Its output holds, after the memory summary, the
# driver's count of the allocations' peak (context excluded); beside it the GPU's memory in use before the run and
# sampled every 50 ms (context included) into $OUT/smi-MODEL.txt, kept if the step times out.
finetune() {
    local samples=$OUT/smi-$2.txt rc
    echo "GPU memory in use before the run: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1) MiB"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 > "$samples" &
    local smi=$!
    ./fp8 train --init-from "$1/$2" --text text.txt --device cuda --base-precision fp8 --lora-rank 16 \
        --recompute every --seq 2048 --batch 1 --steps 2 --precision bf16 --quiet --out "$1/out-$2" &
    local train=$!
    # `timeout` signals the whole group; the trap makes this shell stop at once (`wait` returns)
    # and takes the sampler down with the run.
    trap 'kill "$train" "$smi" 2>/dev/null; exit 143' TERM
    wait "$train"
    rc=$?
    kill "$smi"
    echo "peak GPU memory in use (nvidia-smi, every 50 ms, CUDA context included): $(sort -n "$samples" | tail -1) MiB"
    return $rc
}
# end of part

case $part in
    kernels) part_kernels ;;
    benches) part_benches ;;
    layers) part_layers_checks; part_layers_bench ;;
    train) part_train ;;
    fresh) part_fresh ;;
    banks) part_banks ;;
    views) part_views ;;
    finetune) part_finetune ;;
    finetune_7b) part_finetune_7b ;;
    finetune_13b) part_finetune_13b ;;
    profile) part_profile ;;
    all) part_kernels; part_benches; part_layers_checks; part_train; part_layers_bench; part_fresh_rest; part_banks; part_views; part_profile ;; # the long layer bench before the optional profiles
esac

say "result: $([[ $status == 0 ]] && echo "no failures" || echo FAILURES)"
tar -czf "$OUT/logs$suffix.tar.gz" -C "$OUT" "logs$suffix" && rm -rf "$logs"
exit $status
RUN
chmod +x "$out/run.sh"
size=$(du -sm "$out" | cut -f1)
echo "gpu-bundle: $out ($size MiB): $(ls "$out" | tr '\n' ' ')"
if (( size >= 64 )); then echo "gpu-bundle: over the 64 MiB limit" >&2; exit 1; fi
# The plan: in each part, every step's limit (timeout -k adds 10 s at most per step) under 15 minutes.
for part in kernels benches profile layers train fresh finetune; do
    limits=$(sed -n "/^# part: $part\$/,/^# end of part\$/p" "$out/run.sh" \
        | grep -oE "^ *((gpu|hopper)_step )?step(_out)? [a-z_0-9]+ [0-9]+" | awk '{s += $NF} END {print s + 0}')
    echo "gpu-bundle: $part step limits add up to $limits s (15 min = 900 s)"
    if (( limits == 0 || limits >= 900 )); then echo "gpu-bundle: $part step limits are 0 or exceed 15 minutes" >&2; exit 1; fi
done
