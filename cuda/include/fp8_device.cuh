// Device helpers shared by every kernel family: element loads and stores of
// 16 elements (16-byte vector accesses), the FP8 conversions, the scale rules
// of the numeric contract (spec 3, 4.2, 4.4) and the amax reductions.
//
// Bit-exactness with the CPU twins: every multiply and divide goes through an
// explicitly rounded intrinsic (__fmul_rn, __fdiv_rn), so nvcc can neither
// contract nor approximate them whatever the flags; the FP8 conversion is
// cuda_fp8.h's RNE cvt with __NV_SATFINITE, the contract's saturating cast.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "fp8_params.h"

namespace fp8 {

// Elements one thread moves per vector step: 16 FP8 codes are one 16-byte store.
constexpr int VEC = 16;
constexpr float FLT_MAX_F = 3.40282346638528859812e+38f;

__device__ __forceinline__ float fp8_max(uint32_t format) {
    return format == FP8_FORMAT_E4M3 ? 448.0f : 57344.0f;
}

__device__ __forceinline__ uint8_t to_fp8(float x, uint32_t format) {
    return format == FP8_FORMAT_E4M3 ? (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
                                     : (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
}

// FP8 -> f32, exact: every E4M3/E5M2 value is an fp16 value.
__device__ __forceinline__ float from_fp8(uint8_t q, uint32_t format) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, format == FP8_FORMAT_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
}

// ---- high-precision element access -------------------------------------------------

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// Unpacks the two 16-bit halves of a word (low element first).
__device__ __forceinline__ void unpack2(uint32_t w, float& lo, float& hi, __nv_bfloat16*) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xFFFF0000u);
}
__device__ __forceinline__ void unpack2(uint32_t w, float& lo, float& hi, __half*) {
    lo = __half2float(__ushort_as_half((unsigned short)(w & 0xFFFFu)));
    hi = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
}

// 16 consecutive elements from a 16-byte aligned address.
__device__ __forceinline__ void load16(const float* p, float (&x)[VEC]) {
    const float4* q = reinterpret_cast<const float4*>(p);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float4 v = q[k];
        x[4 * k] = v.x;
        x[4 * k + 1] = v.y;
        x[4 * k + 2] = v.z;
        x[4 * k + 3] = v.w;
    }
}
template <typename T> __device__ __forceinline__ void load16(const T* p, float (&x)[VEC]) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        uint4 v = q[k];
        unpack2(v.x, x[8 * k], x[8 * k + 1], (T*)nullptr);
        unpack2(v.y, x[8 * k + 2], x[8 * k + 3], (T*)nullptr);
        unpack2(v.z, x[8 * k + 4], x[8 * k + 5], (T*)nullptr);
        unpack2(v.w, x[8 * k + 6], x[8 * k + 7], (T*)nullptr);
    }
}

// Up to 16 elements with bounds: missing ones read as 0 (which never raises an amax).
template <typename T> __device__ __forceinline__ void load_partial(const T* p, int n, float (&x)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) x[k] = k < n ? to_f32(p[k]) : 0.0f;
}

__device__ __forceinline__ uint32_t bits_of(float x, float*) { return __float_as_uint(x); }
__device__ __forceinline__ uint32_t bits_of(float x, __nv_bfloat16*) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ uint32_t bits_of(float x, __half*) { return (uint32_t)__half_as_ushort(__float2half_rn(x)); }

// Stores 16 values, rounded to T, at a 16-byte aligned address.
__device__ __forceinline__ void store16(float* p, const float (&y)[VEC]) {
    float4* q = reinterpret_cast<float4*>(p);
#pragma unroll
    for (int k = 0; k < 4; ++k) q[k] = make_float4(y[4 * k], y[4 * k + 1], y[4 * k + 2], y[4 * k + 3]);
}
template <typename T> __device__ __forceinline__ void store16(T* p, const float (&y)[VEC]) {
    uint32_t w[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = bits_of(y[2 * k], (T*)nullptr) | (bits_of(y[2 * k + 1], (T*)nullptr) << 16);
    uint4* q = reinterpret_cast<uint4*>(p);
    q[0] = make_uint4(w[0], w[1], w[2], w[3]);
    q[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// 16 codes as one 16-byte word (element k in byte k, little-endian).
__device__ __forceinline__ uint4 pack16(const uint8_t (&q)[VEC]) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
        w[k] = (uint32_t)q[4 * k] | ((uint32_t)q[4 * k + 1] << 8) | ((uint32_t)q[4 * k + 2] << 16) |
               ((uint32_t)q[4 * k + 3] << 24);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The first n (<= 16) codes, one byte at a time; unrolled so q stays in registers.
__device__ __forceinline__ void store_partial(uint8_t* out, int n, const uint8_t (&q)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k)
        if (k < n) out[k] = q[k];
}

__device__ __forceinline__ bool aligned16(uint64_t address) { return (address & 15u) == 0; }

// ---- scale rules ----------------------------------------------------------------------

// Spec 4.2: fp8_max / max(amax, eps); inf/NaN/0 amax -> 1; inf -> FLT_MAX; optional power-of-two floor.
__device__ __forceinline__ float current_scale(float amax, float max, bool power_2, float eps) {
    if (amax < eps) amax = eps;
    if (isnan(amax) || isinf(amax) || amax == 0.0f) return 1.0f;
    float s = __fdiv_rn(max, amax);
    if (isinf(s)) s = FLT_MAX_F;
    if (power_2) s = __uint_as_float(__float_as_uint(s) & 0xFF800000u);
    return s;
}

// Spec 4.4: the E8M0 exponent of an MXFP8 block, rounded up.
__device__ __forceinline__ uint8_t mxfp8_exponent(float amax, uint32_t format) {
    float v = __fmul_rn(amax, __fdiv_rn(1.0f, fp8_max(format)));
    if (isnan(v)) return 0xFF;
    if (isinf(v)) return 0xFE;
    if (v == 0.0f) return 0;
    uint32_t b = __float_as_uint(v);
    uint32_t e = (b >> 23) & 0xFFu;
    uint32_t m = b & 0x7FFFFFu;
    bool subnormal_at_most_half = e == 0 && m <= 0x400000u;
    return (uint8_t)((m != 0 && e != 0xFE && !subnormal_at_most_half) ? e + 1 : e);
}

// 2^(127-e): the multiplier of an MXFP8 block's data (NaN for 0xFF).
__device__ __forceinline__ float mxfp8_data_scale(uint8_t e) {
    if (e == 0xFF) return __uint_as_float(0x7FC00000u);
    if (e == 254) return __uint_as_float(0x00400000u);
    return __uint_as_float((254u - e) << 23);
}

// 2^(e-127): the E8M0 decode (NaN for 0xFF).
__device__ __forceinline__ float e8m0_decode(uint8_t e) {
    if (e == 0xFF) return __uint_as_float(0x7FC00000u);
    if (e == 0) return __uint_as_float(0x00400000u);
    return __uint_as_float((uint32_t)e << 23);
}

// ---- amax reductions ----------------------------------------------------------------

// fmaxf over `width` consecutive lanes (a power of two <= 32); every lane of the warp must call it.
__device__ __forceinline__ float group_max(float v, int width) {
    for (int o = width / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

// *target = fmaxf(*target, v) for v >= +0 and not NaN (a reduced amax), as the CPU
// twin's record_amax does whatever *target holds. Non-negative floats order like
// their bits as signed ints, and every negative float (-0 included) is a negative
// int, so a signed atomicMax is fmaxf, except for a NaN *target with the sign bit
// clear (its bits beat inf): fmaxf drops it, so swap it for v and max again.
__device__ __forceinline__ void atomic_max_nonneg(float* target, float v) {
    int* t = reinterpret_cast<int*>(target);
    const int bits = __float_as_int(v);
    int old = atomicMax(t, bits);
    while (isnan(__int_as_float(old)) && old >= 0) {
        if (atomicCAS(t, old, bits) == old) break;
        old = atomicMax(t, bits);
    }
}

// Block-wide fmaxf of `v`; thread 0 adds it to *target (if any). All threads must call it.
__device__ __forceinline__ void block_amax_to(float v, uint64_t target) {
    __shared__ float warp_max[32];
    v = group_max(v, 32);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_max[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + 31) >> 5;
        float w = lane < warps ? warp_max[lane] : 0.0f;
        w = group_max(w, 32);
        if (lane == 0 && target != 0) atomic_max_nonneg(reinterpret_cast<float*>(target), w);
    }
}

}  // namespace fp8
