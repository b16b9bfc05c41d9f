#!/usr/bin/env bash
# Compile-time check of the Hopper FP8 GEMM: the sm_90a SASS of the wgmma
# fatbin must contain QGMMA (FP8 wgmma) in every kernel, each of which must get
# exactly 168 registers (what its setmaxnreg split assumes), and no kernel of
# any file may spill. Every layer-op kernel (convert, norm, activation,
# embedding, loss, optim, attention, attention_cached, rope, and the statistics count of cast) must exist in the SASS of all seven
# targets without local memory; their register counts are printed per target. So must the
# three MXFP8 GEMM kernels, with QMMA (the FP8 mma) on sm_89 and sm_120.
# Installs cuobjdump + nvdisasm 13.x from PyPI into .cache/cuobjdump (once).
# Reads the newest build: target/{release,debug}/build/fp8-engine-*/out/.
# Usage: scripts/check-sass.sh [OUT_DIR]      (quiet on success: one summary line per kernel)
set -euo pipefail
cd "$(dirname "$0")/.."

prefix="$PWD/.cache/cuobjdump"
bin="$prefix/nvidia/cu13/bin"
if [[ ! -x "$bin/cuobjdump" || ! -x "$bin/nvdisasm" ]]; then
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --target "$prefix" \
        "nvidia-cuda-cuobjdump==13.*" "nvidia-cuda-nvdisasm==13.*" >&2
fi
[[ -x "$bin/cuobjdump" && -x "$bin/nvdisasm" ]] || { echo "check-sass: no cuobjdump/nvdisasm in $bin" >&2; exit 1; }
export PATH="$bin:$PATH"

out="${1:-}"
if [[ -z "$out" ]]; then
    fatbin=$(ls -t target/*/build/fp8-engine-*/out/gemm_wgmma_sm90.fatbin 2>/dev/null | head -1 || true)
    [[ -n "$fatbin" ]] || { echo "check-sass: no gemm_wgmma_sm90.fatbin under target/*/build: build with nvcc first (NVCC=... cargo build --release)" >&2; exit 1; }
    out=$(dirname "$fatbin")
fi
fatbin="$out/gemm_wgmma_sm90.fatbin"
[[ -f "$fatbin" ]] || { echo "check-sass: $fatbin missing" >&2; exit 1; }

fail=0
# 1. No spills anywhere (the ptxas -v reports build.rs saved next to each fatbin).
spills=$(grep -H "spill" "$out"/*.ptxas.txt | grep -Ev " 0 bytes spill stores, 0 bytes spill loads" || true)
if [[ -n "$spills" ]]; then
    echo "check-sass: register spills:" >&2
    echo "$spills" >&2
    fail=1
fi

# 2. ptxas did not serialize the wgmma (it says so when accumulator registers are touched in flight).
if grep -qi "wgmma.*serialized" "$out/gemm_wgmma_sm90.ptxas.txt"; then
    echo "check-sass: ptxas serialized wgmma:" >&2
    grep -i "serialized" "$out/gemm_wgmma_sm90.ptxas.txt" >&2
    fail=1
fi

# 3. QGMMA in every sm_90a kernel of the wgmma fatbin.
sass=$(cuobjdump -sass -arch sm_90a "$fatbin")
kernels=$(grep -oE "Function : [A-Za-z0-9_]+" <<<"$sass" | awk '{print $3}')
[[ -n "$kernels" ]] || { echo "check-sass: no sm_90a kernels in $fatbin" >&2; exit 1; }
usage=$(cuobjdump --dump-resource-usage -arch sm_90a "$fatbin")
for k in $kernels; do
    body=$(awk -v k="$k" '/Function : /{on = ($3 == k)} on' <<<"$sass")
    q=$(grep -c "QGMMA" <<<"$body" || true)
    regs=$(grep -A1 "Function $k:" <<<"$usage" | grep -oE "REG:[0-9]+" | cut -d: -f2)
    local_mem=$(grep -A1 "Function $k:" <<<"$usage" | grep -oE "LOCAL:[0-9]+" | cut -d: -f2)
    printf 'check-sass: %-34s regs %-4s local %-3s QGMMA %s\n' "$k" "$regs" "$local_mem" "$q"
    if [[ "$q" -eq 0 ]]; then
        echo "check-sass: $k has no QGMMA in its sm_90a SASS (FP8 wgmma missing: slow path)" >&2
        fail=1
    fi
    # setmaxnreg moves registers between warpgroups: 12 warps x 168 = 4 x 40 + 8 x 232
    # balances only at exactly 168; with fewer, setmaxnreg.inc 232 waits forever.
    if [[ "${regs:-0}" -ne 168 ]]; then
        echo "check-sass: $k has ${regs:-?} registers, the setmaxnreg split needs exactly 168" >&2
        fail=1
    fi
    if [[ "${local_mem:-0}" -ne 0 ]]; then
        echo "check-sass: $k uses $local_mem bytes of local memory" >&2
        fail=1
    fi
done
# 4. The layer-op kernels: present in every target's SASS, no local memory.
targets="sm_75 sm_80 sm_86 sm_89 sm_90a sm_100a sm_120"
declare -A layer_ops=(
    [convert]="fp8_convert_f32 fp8_convert_bf16 fp8_convert_f16 fp8_convert_transpose_f32 fp8_convert_transpose_bf16 fp8_convert_transpose_f16 fp8_transpose_16 fp8_transpose_8 fp8_residual_add fp8_round fp8_copy_columns fp8_column_sum"
    [norm]="fp8_layernorm_forward fp8_rmsnorm_forward fp8_layernorm_backward fp8_rmsnorm_backward fp8_norm_param_grads"
    [activation]="fp8_gelu_forward fp8_gelu_backward fp8_swiglu_forward fp8_swiglu_backward fp8_dropout fp8_dropout_add"
    [embedding]="fp8_embedding_gather fp8_embedding_scatter_add"
    [loss]="fp8_cross_entropy_rows fp8_cross_entropy_mean fp8_cross_entropy_backward fp8_argmax"
    [optim]="fp8_adamw fp8_sum_squares fp8_sum_squares_total fp8_unscale_check"
    [attention]="fp8_attention_forward fp8_attention_backward_dq fp8_attention_backward_dkdv"
    [attention_cached]="fp8_attention_cached"
    [attention_mma]="fp8_attention_mma_forward_bf16_d64 fp8_attention_mma_forward_bf16_d128 fp8_attention_mma_forward_f16_d64 fp8_attention_mma_forward_f16_d128 fp8_attention_mma_backward_dq_bf16_d64 fp8_attention_mma_backward_dq_bf16_d128 fp8_attention_mma_backward_dq_f16_d64 fp8_attention_mma_backward_dq_f16_d128 fp8_attention_mma_backward_dkdv_bf16_d64 fp8_attention_mma_backward_dkdv_bf16_d128 fp8_attention_mma_backward_dkdv_f16_d64 fp8_attention_mma_backward_dkdv_f16_d128"
    [rope]="fp8_rope"
    [cast]="fp8_count_stats fp8_current_scale fp8_scale_inv_min fp8_largest_scale"
)
op_kernels=0
for module in convert norm activation embedding loss optim attention attention_cached attention_mma rope cast; do
    file="$out/$module.fatbin"
    [[ -f "$file" ]] || { echo "check-sass: $file missing" >&2; fail=1; continue; }
    declare -A regs_of=()
    for arch in $targets; do
        usage=$(cuobjdump --dump-resource-usage -arch "$arch" "$file" 2>/dev/null || true)
        for k in ${layer_ops[$module]}; do
            line=$(grep -A1 "Function $k:" <<<"$usage" | tail -1)
            if [[ -z "$line" ]]; then
                echo "check-sass: $k missing from the $arch SASS of $module.fatbin" >&2
                fail=1
                continue
            fi
            local_mem=$(grep -oE "LOCAL:[0-9]+" <<<"$line" | cut -d: -f2)
            if [[ "${local_mem:-0}" -ne 0 ]]; then
                echo "check-sass: $k ($arch) uses $local_mem bytes of local memory" >&2
                fail=1
            fi
            regs_of[$k]="${regs_of[$k]:-}$(grep -oE "REG:[0-9]+" <<<"$line" | cut -d: -f2) "
        done
    done
    for k in ${layer_ops[$module]}; do
        printf 'check-sass: %-34s regs %s(%s)\n' "$k" "${regs_of[$k]:-none }" "$targets"
        op_kernels=$((op_kernels + 1))
    done
    unset regs_of
done

# 5. The MXFP8 GEMM kernels: in every target without local memory (stubs below sm_89),
# and built on the FP8 mma where it exists natively (QMMA on sm_89 and sm_120; sm_90a and
# sm_100a lower it to an f16 unpack + HMMA, docs/gpu-validation.md).
mx_file="$out/gemm_mma_mxfp8.fatbin"
mx_kernels="fp8_gemm_mma_mxfp8_e4m3_e4m3 fp8_gemm_mma_mxfp8_e4m3_e5m2 fp8_gemm_mma_mxfp8_e5m2_e4m3"
if [[ ! -f "$mx_file" ]]; then
    echo "check-sass: $mx_file missing" >&2
    fail=1
else
    declare -A mx_regs=()
    for arch in $targets; do
        usage=$(cuobjdump --dump-resource-usage -arch "$arch" "$mx_file" 2>/dev/null || true)
        mx_sass=""
        if [[ $arch == sm_89 || $arch == sm_120 ]]; then mx_sass=$(cuobjdump -sass -arch "$arch" "$mx_file"); fi
        for k in $mx_kernels; do
            line=$(grep -A1 "Function $k:" <<<"$usage" | tail -1)
            if [[ -z "$line" ]]; then
                echo "check-sass: $k missing from the $arch SASS of gemm_mma_mxfp8.fatbin" >&2
                fail=1
                continue
            fi
            local_mem=$(grep -oE "LOCAL:[0-9]+" <<<"$line" | cut -d: -f2)
            if [[ "${local_mem:-0}" -ne 0 ]]; then
                echo "check-sass: $k ($arch) uses $local_mem bytes of local memory" >&2
                fail=1
            fi
            if [[ -n "$mx_sass" ]]; then
                body=$(awk -v k="$k" '/Function : /{on = ($3 == k)} on' <<<"$mx_sass")
                if ! grep -q "QMMA" <<<"$body"; then
                    echo "check-sass: $k has no QMMA in its $arch SASS" >&2
                    fail=1
                fi
            fi
            mx_regs[$k]="${mx_regs[$k]:-}$(grep -oE "REG:[0-9]+" <<<"$line" | cut -d: -f2) "
        done
    done
    for k in $mx_kernels; do printf 'check-sass: %-34s regs %s(%s)\n' "$k" "${mx_regs[$k]:-none }" "$targets"; done
fi

[[ "$fail" -eq 0 ]] || exit 1
echo "check-sass: ok: $op_kernels layer-op kernels in all 7 targets without local memory"
echo "check-sass: ok: 3 MXFP8 GEMM kernels in all 7 targets without local memory, QMMA on sm_89 and sm_120"
echo "check-sass: ok: $(wc -w <<<"$kernels") sm_90a kernels with QGMMA and 168 registers, wgmma not serialized, no spills or local memory"
