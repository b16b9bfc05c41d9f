// The optimizer-side ops of a training step: AdamW over every parameter in
// one launch, the sum of squares behind gradient clipping, and the unscale +
// finite check of dynamic loss scaling. Twins: ops::adamw_update (same bits:
// every operation is the twin's, correctly rounded, no FMA), ops::sum_of_squares
// (f64, see fp8_sum_squares), ops::unscale_and_check (same bits, same verdict).
#include "ops_device.cuh"

using namespace fp8ops;

// One block per work item; items cover the parameters of the arenas.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_adamw(const Fp8AdamWParams p) {
    const Fp8AdamWItemParams item = reinterpret_cast<const Fp8AdamWItemParams*>(p.items)[blockIdx.x];
    float* value = reinterpret_cast<float*>(p.value);
    const float* grad = reinterpret_cast<const float*>(p.grad);
    float* m = reinterpret_cast<float*>(p.m);
    float* v = reinterpret_cast<float*>(p.v);
    const float decay = item.decayed ? p.decay : 1.0f;
    for (uint64_t i = item.offset + threadIdx.x; i < item.offset + item.len; i += THREADS) {
        const float g = grad[i];
        const float w = mul(value[i], decay);
        const float mi = add(mul(m[i], p.beta1), mul(g, p.c1));
        const float vi = add(mul(v[i], p.beta2), mul(mul(g, g), p.c2));
        const float denom = add(div(__fsqrt_rn(vi), p.bc2_sqrt), p.eps);
        m[i] = mi;
        v[i] = vi;
        value[i] = sub(w, mul(p.step_size, div(mi, denom)));
    }
}

// Sum of squares in f64, two stages with a fixed layout (deterministic): block
// b sums the squares of elements [b, b + 1) * FP8_SUMSQ_PER_BLOCK into
// out[b]; then fp8_sum_squares_total (one block) sums those partials. Each square of an f32 is exact in f64 (48 significant
// bits), so the result differs from the twin's in-order f64 sum only by the
// order of the additions: |gpu - cpu| <= 2 (n - 1) 2^-53 sum x^2.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_sum_squares(const Fp8EltwiseParams p) {
    __shared__ double scratch[WARPS];
    const float* x = reinterpret_cast<const float*>(p.a);
    const uint64_t n = p.rows * p.cols;
    const uint64_t begin = (uint64_t)blockIdx.x * FP8_SUMSQ_PER_BLOCK;
    const uint64_t end = min(n, begin + FP8_SUMSQ_PER_BLOCK);
    double s = 0.0;
    for (uint64_t i = begin + threadIdx.x; i < end; i += THREADS) {
        const double v = (double)x[i];
        s = __dadd_rn(s, __dmul_rn(v, v));
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) reinterpret_cast<double*>(p.out)[blockIdx.x] = s;
}

// out[0] = sum of the rows f64 partials at a (one block).
extern "C" __global__ void __launch_bounds__(THREADS) fp8_sum_squares_total(const Fp8EltwiseParams p) {
    __shared__ double scratch[WARPS];
    const double* partials = reinterpret_cast<const double*>(p.a);
    double s = 0.0;
    for (uint64_t i = threadIdx.x; i < p.rows; i += THREADS) s = __dadd_rn(s, partials[i]);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) *reinterpret_cast<double*>(p.out) = s;
}

// a *= scalar for every element; *flag = 1 if any result is not finite (every
// element is scaled, also after a non-finite one; the flag is only ever set).
extern "C" __global__ void __launch_bounds__(THREADS) fp8_unscale_check(const Fp8EltwiseParams p) {
    float* a = reinterpret_cast<float*>(p.a);
    const uint64_t n = p.rows * p.cols, stride = (uint64_t)gridDim.x * blockDim.x;
    bool finite = true;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = mul(a[i], p.scalar);
        a[i] = v;
        finite = finite && isfinite(v);
    }
    if (!finite) *reinterpret_cast<uint32_t*>(p.flag) = 1u;
}
