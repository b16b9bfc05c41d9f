// Per-tensor FP8 casts with a fused amax (delayed and current scaling), the
// fused cast + transpose, and the amax of a tensor.
#include "fp8_device.cuh"

using namespace fp8;

// Threads per block of every kernel in this file.
constexpr int THREADS = 256;
// Cast + transpose tile: 64 x 64 elements, 256 threads x 16 elements.
constexpr int TILE = 64;

// q = cast_sat(x * scale) over the flat tensor; 16 elements per thread step.
template <typename T> __device__ void cast_amax(const Fp8CastParams& p) {
    const T* src = reinterpret_cast<const T*>(p.src);
    uint8_t* dst = reinterpret_cast<uint8_t*>(p.dst_rowwise);
    const uint64_t n = p.rows * p.cols;
    const float scale = *reinterpret_cast<const float*>(p.scale);
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool vec = aligned16(p.src) && aligned16(p.dst_rowwise);
    const uint64_t chunks = vec ? n / VEC : 0;
    float amax = 0.0f;
    for (uint64_t c = tid; c < chunks; c += stride) {
        float x[VEC];
        uint8_t q[VEC];
        load16(src + c * VEC, x);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            amax = fmaxf(amax, fabsf(x[k]));
            q[k] = to_fp8(__fmul_rn(x[k], scale), p.format);
        }
        *reinterpret_cast<uint4*>(dst + c * VEC) = pack16(q);
    }
    for (uint64_t i = chunks * VEC + tid; i < n; i += stride) {
        const float x = to_f32(src[i]);
        amax = fmaxf(amax, fabsf(x));
        dst[i] = to_fp8(__fmul_rn(x, scale), p.format);
    }
    block_amax_to(amax, p.amax);
    if (tid == 0 && p.scale_inv_out != 0) *reinterpret_cast<float*>(p.scale_inv_out) = __fdiv_rn(1.0f, scale);
}

// Both copies from one read: a 64 x 64 tile is cast, stored row-wise, staged
// as codes in shared memory and written transposed.
template <typename T> __device__ void cast_transpose_amax(const Fp8CastParams& p) {
    __shared__ __align__(16) uint8_t tile[TILE][TILE + 16];
    const T* src = reinterpret_cast<const T*>(p.src);
    uint8_t* dst = reinterpret_cast<uint8_t*>(p.dst_rowwise);
    uint8_t* dst_t = reinterpret_cast<uint8_t*>(p.dst_columnwise);
    const uint64_t rows = p.rows, cols = p.cols;
    const float scale = *reinterpret_cast<const float*>(p.scale);
    const uint64_t tile_cols = (cols + TILE - 1) / TILE;
    const uint64_t r0 = (blockIdx.x / tile_cols) * TILE, c0 = (blockIdx.x % tile_cols) * TILE;
    // Row phase: thread -> (tile row t/4, 16-column segment t%4).
    const int r = threadIdx.x / 4, seg = threadIdx.x % 4;
    const uint64_t row = r0 + r, col = c0 + VEC * seg;
    float amax = 0.0f;
    if (row < rows && col < cols) {
        const bool vec = cols % VEC == 0 && aligned16(p.src) && aligned16(p.dst_rowwise);
        const int n = (int)min((uint64_t)VEC, cols - col);
        float x[VEC];
        uint8_t q[VEC];
        if (vec) load16(src + row * cols + col, x);
        else load_partial(src + row * cols + col, n, x);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            amax = fmaxf(amax, fabsf(x[k]));
            q[k] = to_fp8(__fmul_rn(x[k], scale), p.format);
        }
        if (vec) {
            const uint4 packed = pack16(q);
            *reinterpret_cast<uint4*>(dst + row * cols + col) = packed;
            *reinterpret_cast<uint4*>(&tile[r][VEC * seg]) = packed;
        } else {
            for (int k = 0; k < n; ++k) {
                dst[row * cols + col + k] = q[k];
                tile[r][VEC * seg + k] = q[k];
            }
        }
    }
    __syncthreads();
    // Column phase: thread -> (tile column t%64, 16-row segment t/64); a warp
    // reads 32 consecutive bytes of each tile row, so no bank conflicts.
    if (dst_t != nullptr) {
        const int jj = threadIdx.x % TILE, s = threadIdx.x / TILE;
        const uint64_t j = c0 + jj, i = r0 + VEC * s;
        if (j < cols && i < rows) {
            uint8_t q[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) q[k] = tile[VEC * s + k][jj];
            const int n = (int)min((uint64_t)VEC, rows - i);
            if (rows % VEC == 0 && aligned16(p.dst_columnwise)) {
                *reinterpret_cast<uint4*>(dst_t + j * rows + i) = pack16(q);
            } else {
                store_partial(dst_t + j * rows + i, n, q);
            }
        }
    }
    block_amax_to(amax, p.amax);
    if (blockIdx.x == 0 && threadIdx.x == 0 && p.scale_inv_out != 0)
        *reinterpret_cast<float*>(p.scale_inv_out) = __fdiv_rn(1.0f, scale);
}

// The saturation limit of element i of a block-scaled copy: max * its block's scale_inv
// (twin: fp8_cast::element_scale_inv). 32-bit index math: the launcher keeps len below 2^32.
__device__ __forceinline__ float block_limit(const Fp8StatsParams& p, uint32_t i, uint32_t grid_cols) {
    const uint32_t cols = (uint32_t)p.cols, row = i / cols, col = i - row * cols;
    const uint32_t index = (row / p.block_rows) * grid_cols + col / p.block_cols;
    const float scale_inv = p.scale_kind == FP8_SCALES_F32_GRID
                                ? reinterpret_cast<const float*>(p.block_scales)[index]
                                : e8m0_decode(reinterpret_cast<const uint8_t*>(p.block_scales)[index]);
    return __fmul_rn(p.max, scale_inv);
}

// FP8 statistics of an f32 tensor (twin: dispatch::fp8_cast::cast_stats for a cast's codes,
// per-tensor or block-scaled, uncast_stats without codes): each thread counts its grid-stride
// share in 32-bit counters (the launcher keeps len below 2^32), each warp sums them with shuffles and
// one lane adds them to counts[4]. Integer counts: the same totals in any order.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_count_stats(const Fp8StatsParams p) {
    const float* src = reinterpret_cast<const float*>(p.src);
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(p.codes);
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    // Columns of a block-scaled copy's scale grid.
    const uint32_t grid_cols =
        p.scale_kind == FP8_SCALES_PER_TENSOR ? 0u : ((uint32_t)p.cols + p.block_cols - 1) / p.block_cols;
    // A scale left on the device by current scaling: the host's `max * (1 / scale)` limit.
    float limit = p.limit, scale_of = p.scale;
    if (p.scale_at != 0) {
        scale_of = *reinterpret_cast<const float*>(p.scale_at);
        limit = __fmul_rn(p.max, __fdiv_rn(1.0f, scale_of));
    }
    uint32_t c[4] = {0u, 0u, 0u, 0u}; // saturated, underflow, nonzero, nonfinite
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.len; i += stride) {
        const float x = src[i];
        const bool finite = fabsf(x) < INFINITY; // false for NaN too
        const bool live = finite && x != 0.0f;
        bool flushed, saturates;
        if (codes != nullptr) {
            // E4M3 and E5M2 codes decode to zero exactly when their magnitude bits are 0.
            flushed = (codes[i] & 0x7Fu) == 0u;
            // A block-scaled copy: max * its block's scale_inv (the twin's limit).
            const float lim = p.scale_kind == FP8_SCALES_PER_TENSOR ? limit : block_limit(p, (uint32_t)i, grid_cols);
            saturates = fabsf(x) > lim;
        } else {
            const float scaled = fabsf(__fmul_rn(x, scale_of));
            flushed = scaled <= p.half_min;
            saturates = scaled > p.max;
        }
        c[0] += (finite && saturates) ? 1u : 0u;
        c[1] += (live && flushed) ? 1u : 0u;
        c[2] += live ? 1u : 0u;
        c[3] += finite ? 0u : 1u;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        uint32_t v = c[k];
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        if ((threadIdx.x & 31) == 0 && v != 0u) atomicAdd(reinterpret_cast<unsigned int*>(p.counts) + k, v);
    }
}

// Current scaling's scale of an amax left on the device (twin: ScaleRule::scale), so a cast
// reads it by address and nothing comes back to the host in between. One thread works.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_current_scale(const Fp8CurrentScaleParams p) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const float amax = *reinterpret_cast<const float*>(p.amax);
    *reinterpret_cast<float*>(p.scale) = current_scale(amax, fp8_max(p.format), p.power_2_scale != 0, p.amax_epsilon);
}

// The complement of an order-preserving u32 key of a float (a larger float has a larger key):
// a zeroed key stands above every number, so an atomic max of these finds the minimum.
__device__ __forceinline__ uint32_t min_key(float v) {
    const uint32_t u = __float_as_uint(v);
    return ~((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}

// The smallest scale_inv of a block cast's grid, as its key max-ed into *key (NaN dropped, as
// f32::min drops it in the twin, fp8_cast::largest_scale).
extern "C" __global__ void __launch_bounds__(THREADS) fp8_scale_inv_min(const Fp8LargestScaleParams p) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint32_t best = 0u;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.len; i += stride) {
        const float s = p.e8m0 ? e8m0_decode(reinterpret_cast<const uint8_t*>(p.scale_inv)[i])
                               : reinterpret_cast<const float*>(p.scale_inv)[i];
        if (!isnan(s)) best = max(best, min_key(s));
    }
    for (int o = 16; o > 0; o /= 2) best = max(best, __shfl_xor_sync(0xFFFFFFFFu, best, o));
    if ((threadIdx.x & 31) == 0 && best != 0u) atomicMax(reinterpret_cast<unsigned int*>(p.key), best);
}

// 1 / the smallest scale_inv that fp8_scale_inv_min left in *key (inf when none: scale 0).
// One thread works.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_largest_scale(const Fp8LargestScaleParams p) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const uint32_t key = *reinterpret_cast<const uint32_t*>(p.key);
    float smallest = INFINITY;
    if (key != 0u) {
        const uint32_t k = ~key;
        smallest = __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
    }
    *reinterpret_cast<float*>(p.scale) = __fdiv_rn(1.0f, smallest);
}

// max|x| of a flat tensor, max-ed into *amax.
template <typename T> __device__ void amax_only(const Fp8AmaxParams& p) {
    const T* src = reinterpret_cast<const T*>(p.src);
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t chunks = aligned16(p.src) ? p.len / VEC : 0;
    float amax = 0.0f;
    for (uint64_t c = tid; c < chunks; c += stride) {
        float x[VEC];
        load16(src + c * VEC, x);
#pragma unroll
        for (int k = 0; k < VEC; ++k) amax = fmaxf(amax, fabsf(x[k]));
    }
    for (uint64_t i = chunks * VEC + tid; i < p.len; i += stride) amax = fmaxf(amax, fabsf(to_f32(src[i])));
    block_amax_to(amax, p.amax);
}

#define FP8_CAST_KERNELS(SUFFIX, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS) fp8_cast_amax_##SUFFIX(const Fp8CastParams p) { \
        cast_amax<T>(p);                                                                                 \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                \
        fp8_cast_transpose_amax_##SUFFIX(const Fp8CastParams p) {                                        \
        cast_transpose_amax<T>(p);                                                                       \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS) fp8_amax_##SUFFIX(const Fp8AmaxParams p) {     \
        amax_only<T>(p);                                                                                 \
    }

FP8_CAST_KERNELS(f32, float)
FP8_CAST_KERNELS(bf16, __nv_bfloat16)
FP8_CAST_KERNELS(f16, __half)
