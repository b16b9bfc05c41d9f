// FP8 codes back to f32/bf16/f16: f32(q) * scale_inv of the element's block,
// rounded to the destination type (RNE).
#include "fp8_device.cuh"

using namespace fp8;

constexpr int THREADS = 256;

__device__ __forceinline__ float scale_inv_at(const Fp8DequantParams& p, uint64_t row, uint64_t col) {
    if (p.scale_kind == FP8_SCALES_PER_TENSOR) return *reinterpret_cast<const float*>(p.scale_inv);
    const uint64_t grid_cols = (p.cols + p.block_cols - 1) / p.block_cols;
    const uint64_t index = (row / p.block_rows) * grid_cols + col / p.block_cols;
    if (p.scale_kind == FP8_SCALES_F32_GRID) return reinterpret_cast<const float*>(p.scale_inv)[index];
    return e8m0_decode(reinterpret_cast<const uint8_t*>(p.scale_inv)[index]);
}

template <typename T> __device__ void dequantize(const Fp8DequantParams& p) {
    const uint8_t* src = reinterpret_cast<const uint8_t*>(p.src);
    T* dst = reinterpret_cast<T*>(p.dst);
    const uint64_t n = p.rows * p.cols;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    // 16 codes of one chunk share a row and a block when rows are whole chunks
    // and blocks are whole chunks wide.
    const bool vec = p.cols % VEC == 0 && (p.scale_kind == FP8_SCALES_PER_TENSOR || p.block_cols % VEC == 0) &&
                     aligned16(p.src) && aligned16(p.dst);
    const uint64_t chunks = vec ? n / VEC : 0;
    for (uint64_t c = tid; c < chunks; c += stride) {
        const uint64_t e = c * VEC;
        const float s = scale_inv_at(p, e / p.cols, e % p.cols);
        const uint4 packed = *reinterpret_cast<const uint4*>(src + e);
        const uint32_t w[4] = {packed.x, packed.y, packed.z, packed.w};
        float y[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[k] = __fmul_rn(from_fp8((uint8_t)(w[k / 4] >> (8 * (k % 4))), p.format), s);
        store16(dst + e, y);
    }
    for (uint64_t e = chunks * VEC + tid; e < n; e += stride) {
        const float s = scale_inv_at(p, e / p.cols, e % p.cols);
        dst[e] = from_f32<T>(__fmul_rn(from_fp8(src[e], p.format), s));
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) fp8_dequantize_f32(const Fp8DequantParams p) {
    dequantize<float>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) fp8_dequantize_bf16(const Fp8DequantParams p) {
    dequantize<__nv_bfloat16>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) fp8_dequantize_f16(const Fp8DequantParams p) {
    dequantize<__half>(p);
}
