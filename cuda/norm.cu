// LayerNorm and RMSNorm, forward and backward, statistics in f32. Twins:
// ops::layernorm_forward/backward, ops::rmsnorm_forward/backward, the same
// formulas with the same rounding of every product and quotient; only the
// order of the row sums differs (a block tree here, left to right there), so
// the results agree within the reduction bound of docs/numerics.md.
//
// Forward: one block per row. It can also write the FP8 copy of y,
// cast_sat(y * scale), and fmaxf its amax into *amax (the fused norm + cast).
// Backward: one block per row block of `rows_per_block` rows (the CPU twin's
// blocking); it writes dx and the block's dgamma/dbeta partial, then
// fp8_norm_param_grads adds the partials to dgamma/dbeta in block order.
// Deterministic: no atomics on floats, fixed reduction orders.
#include "ops_device.cuh"

using namespace fp8ops;

__device__ __forceinline__ float weight(float gamma, uint32_t zero_centered) {
    return zero_centered ? add(1.0f, gamma) : gamma;
}

// 1 / max(cols, 1), rounded once, as the twins' inv_n.
__device__ __forceinline__ float inv_n(uint64_t cols) { return div(1.0f, (float)(cols > 0 ? cols : 1)); }

// 1 / sqrt(v + eps), each step correctly rounded.
__device__ __forceinline__ float rstd_of(float v, float eps) { return div(1.0f, __fsqrt_rn(add(v, eps))); }

// Writes y (if wanted) and its FP8 copy (if wanted); returns max|y| of this thread's elements.
__device__ __forceinline__ float emit(const Fp8NormParams& p, uint64_t at, float y, float scale) {
    if (p.y) reinterpret_cast<float*>(p.y)[at] = y;
    if (p.y_fp8) reinterpret_cast<uint8_t*>(p.y_fp8)[at] = fp8::to_fp8(mul(y, scale), p.format);
    return fabsf(y);
}

template <bool LAYER> __device__ void norm_forward(const Fp8NormParams& p) {
    __shared__ float scratch[WARPS];
    const uint64_t row = blockIdx.x, cols = p.cols;
    const float* x = reinterpret_cast<const float*>(p.x) + row * cols;
    const float* gamma = reinterpret_cast<const float*>(p.gamma);
    const float inv = inv_n(cols);
    float mu = 0.0f, rs;
    if (LAYER) {
        float s = 0.0f;
        for (uint64_t j = threadIdx.x; j < cols; j += THREADS) s = add(s, x[j]);
        mu = mul(block_sum(s, scratch), inv);
        float q = 0.0f;
        for (uint64_t j = threadIdx.x; j < cols; j += THREADS) {
            const float d = sub(x[j], mu);
            q = add(q, mul(d, d));
        }
        rs = rstd_of(mul(block_sum(q, scratch), inv), p.eps);
    } else {
        float q = 0.0f;
        for (uint64_t j = threadIdx.x; j < cols; j += THREADS) q = add(q, mul(x[j], x[j]));
        rs = rstd_of(mul(block_sum(q, scratch), inv), p.eps);
    }
    const float scale = p.y_fp8 ? *reinterpret_cast<const float*>(p.scale) : 1.0f;
    float amax = 0.0f;
    for (uint64_t j = threadIdx.x; j < cols; j += THREADS) {
        const float w = weight(gamma[j], p.zero_centered);
        float y;
        if (LAYER) y = add(mul(mul(sub(x[j], mu), rs), w), reinterpret_cast<const float*>(p.beta)[j]);
        else y = mul(mul(x[j], rs), w);
        amax = fmaxf(amax, emit(p, row * cols + j, y, scale));
    }
    if (threadIdx.x == 0) {
        if (LAYER) reinterpret_cast<float*>(p.mean)[row] = mu;
        reinterpret_cast<float*>(p.rstd)[row] = rs;
    }
    if (p.y_fp8) fp8::block_amax_to(amax, p.amax);
}

template <bool LAYER> __device__ void norm_backward(const Fp8NormParams& p) {
    __shared__ float scratch[WARPS];
    const uint64_t cols = p.cols;
    const uint64_t r0 = (uint64_t)blockIdx.x * p.rows_per_block;
    const uint64_t r1 = min(p.rows, r0 + p.rows_per_block);
    const float* gamma = reinterpret_cast<const float*>(p.gamma);
    float* pg = reinterpret_cast<float*>(p.partials) + (uint64_t)blockIdx.x * 2 * cols;
    float* pb = pg + cols;
    const float inv = inv_n(cols);
    // This thread's columns of the block's partial start at zero; only this thread touches them.
    for (uint64_t j = threadIdx.x; j < cols; j += THREADS) {
        pg[j] = 0.0f;
        if (LAYER) pb[j] = 0.0f;
    }
    for (uint64_t row = r0; row < r1; ++row) {
        const float* x = reinterpret_cast<const float*>(p.x) + row * cols;
        const float* dy = reinterpret_cast<const float*>(p.dy) + row * cols;
        float* dx = reinterpret_cast<float*>(p.dx) + row * cols;
        const float mu = LAYER ? reinterpret_cast<const float*>(p.mean)[row] : 0.0f;
        const float rs = reinterpret_cast<const float*>(p.rstd)[row];
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (uint64_t j = threadIdx.x; j < cols; j += THREADS) {
            const float d = dy[j];
            const float xhat = LAYER ? mul(sub(x[j], mu), rs) : mul(x[j], rs);
            const float g = mul(d, weight(gamma[j], p.zero_centered));
            if (LAYER) sum_g = add(sum_g, g);
            sum_gx = add(sum_gx, mul(g, xhat));
            pg[j] = add(pg[j], mul(d, xhat));
            if (LAYER) pb[j] = add(pb[j], d);
        }
        const float mean_g = LAYER ? mul(block_sum(sum_g, scratch), inv) : 0.0f;
        const float mean_gx = mul(block_sum(sum_gx, scratch), inv);
        for (uint64_t j = threadIdx.x; j < cols; j += THREADS) {
            const float g = mul(dy[j], weight(gamma[j], p.zero_centered));
            if (LAYER) {
                const float xhat = mul(sub(x[j], mu), rs);
                dx[j] = mul(rs, sub(sub(g, mean_g), mul(xhat, mean_gx)));
            } else {
                dx[j] = mul(rs, sub(g, mul(mul(x[j], rs), mean_gx)));
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) fp8_layernorm_forward(const Fp8NormParams p) {
    norm_forward<true>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) fp8_rmsnorm_forward(const Fp8NormParams p) {
    norm_forward<false>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) fp8_layernorm_backward(const Fp8NormParams p) {
    norm_backward<true>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) fp8_rmsnorm_backward(const Fp8NormParams p) {
    norm_backward<false>(p);
}

// dgamma[c] += partial_0[c] + partial_1[c] + ... in block order (dbeta likewise
// when p.dbeta is set), as the twins add their per-block partials.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_norm_param_grads(const Fp8NormParams p) {
    const uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= p.cols) return;
    const uint64_t blocks = (p.rows + p.rows_per_block - 1) / p.rows_per_block;
    const float* partials = reinterpret_cast<const float*>(p.partials);
    float g = reinterpret_cast<float*>(p.dgamma)[c];
    float b = p.dbeta ? reinterpret_cast<float*>(p.dbeta)[c] : 0.0f;
    for (uint64_t k = 0; k < blocks; ++k) {
        g = add(g, partials[k * 2 * p.cols + c]);
        if (p.dbeta) b = add(b, partials[k * 2 * p.cols + p.cols + c]);
    }
    reinterpret_cast<float*>(p.dgamma)[c] = g;
    if (p.dbeta) reinterpret_cast<float*>(p.dbeta)[c] = b;
}
