// Device helpers of the layer-op kernels: arithmetic rounded like the CPU
// twins (every multiply, add and divide an explicitly rounded intrinsic, so
// nvcc cannot contract a*b+c into an FMA the Rust code does not do), rounding
// to a compute dtype, and block reductions in a fixed order (deterministic:
// the same inputs give the same bits on every run).
#pragma once

#include "fp8_device.cuh"

namespace fp8ops {

constexpr int THREADS = (int)FP8_OPS_THREADS;
constexpr int WARPS = THREADS / 32;

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }

// x rounded to the dtype and widened back (what Dtype::round does on the CPU).
__device__ __forceinline__ float round_to(float x, uint32_t dtype) {
    if (dtype == FP8_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn(x));
    if (dtype == FP8_DTYPE_F16) return __half2float(__float2half_rn(x));
    return x;
}

// Sum over the warp by a butterfly: every lane gets the same bits.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v = add(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o /= 2) v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

// Sum over a block of THREADS threads; every thread gets the result. The
// order is fixed by the thread layout alone. `scratch` holds WARPS values and
// may be reused after the call (the trailing barrier protects it).
template <typename T> __device__ __forceinline__ T block_sum(T v, T* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    T w = lane < WARPS ? scratch[lane] : T(0);
    w = warp_sum(w);
    __syncthreads();
    return w;
}

// fmaxf over a block (NaN ignored unless all are NaN); every thread gets it.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = fp8::group_max(v, 32);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float w = lane < WARPS ? scratch[lane] : __int_as_float(0xFF800000);  // -inf
    w = fp8::group_max(w, 32);
    __syncthreads();
    return w;
}

}  // namespace fp8ops
