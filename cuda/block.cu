// Block quantizers (spec 4.3, 4.4): 1x128 and MXFP8 (1x32) row-wise and
// column-wise copies, and 128x128 tiles, each block scaled from its own amax.
// Partial blocks at the right and bottom edges get their own scale, as on the CPU.
#include "fp8_device.cuh"

using namespace fp8;

constexpr int THREADS = 256;

// What a block's amax becomes: the multiplier of its data and the stored scale.
struct F32Rule {  // 1x128 / 128x128: f32 scale_inv
    uint32_t format;
    bool power_2;
    float eps;
    __device__ float scale(float amax, float& stored) const {
        const float s = current_scale(amax, fp8_max(format), power_2, eps);
        stored = __fdiv_rn(1.0f, s);
        return s;
    }
    __device__ void store(uint64_t scales, uint64_t index, float stored) const {
        reinterpret_cast<float*>(scales)[index] = stored;
    }
};

struct E8m0Rule {  // MXFP8: E8M0 exponent
    uint32_t format;
    __device__ float scale(float amax, float& stored) const {
        const uint8_t e = mxfp8_exponent(amax, format);
        stored = (float)e;
        return mxfp8_data_scale(e);
    }
    __device__ void store(uint64_t scales, uint64_t index, float stored) const {
        reinterpret_cast<uint8_t*>(scales)[index] = (uint8_t)stored;
    }
};

// Row-wise copy with blocks of BLOCK consecutive elements: a group of
// BLOCK/16 lanes per block, 16 elements per lane; warps loop over blocks.
template <int BLOCK, typename T, typename Rule> __device__ void quantize_rowwise(const Fp8BlockParams& p, Rule rule) {
    constexpr int LANES = BLOCK / VEC, BLOCKS_PER_WARP = 32 / LANES;
    const T* src = reinterpret_cast<const T*>(p.src);
    uint8_t* dst = reinterpret_cast<uint8_t*>(p.dst_rowwise);
    const uint64_t blocks_per_row = (p.cols + BLOCK - 1) / BLOCK;
    const uint64_t total = p.rows * blocks_per_row;
    const bool vec = p.cols % VEC == 0 && aligned16(p.src) && aligned16(p.dst_rowwise);
    const int lane = threadIdx.x & 31;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const uint64_t warps = (uint64_t)gridDim.x * blockDim.x / 32;
    // The loop bound is warp-uniform so every lane reaches the shuffles.
    for (uint64_t base = warp * BLOCKS_PER_WARP; base < total; base += warps * BLOCKS_PER_WARP) {
        const uint64_t b = base + lane / LANES;
        const uint64_t row = b / blocks_per_row;
        const uint64_t col = (b % blocks_per_row) * BLOCK + VEC * (lane % LANES);
        const bool active = b < total && col < p.cols;
        const int n = active ? (int)min((uint64_t)VEC, p.cols - col) : 0;
        float x[VEC];
        if (active && vec) load16(src + row * p.cols + col, x);
        else load_partial(src + row * p.cols + col, n, x);
        float amax = 0.0f;
#pragma unroll
        for (int k = 0; k < VEC; ++k) amax = fmaxf(amax, fabsf(x[k]));
        amax = group_max(amax, LANES);
        float stored;
        const float scale = rule.scale(amax, stored);
        if (active) {
            uint8_t q[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) q[k] = to_fp8(__fmul_rn(x[k], scale), p.format);
            uint8_t* out = dst + row * p.cols + col;
            if (vec) *reinterpret_cast<uint4*>(out) = pack16(q);
            else
                store_partial(out, n, q);
            if (lane % LANES == 0) rule.store(p.scales_rowwise, b, stored);
        }
    }
}

// Column-wise copy (blocks of BLOCK rows of one column, written as rows of
// X^T): a CTA stages a BLOCK x WIDTH tile of the source as f32 in shared
// memory; thread -> (column t % WIDTH, 16-row part t / WIDTH); parts meet
// through shared memory for the block amax. WIDTH * BLOCK = 4096 elements (16 KB).
template <int BLOCK, typename T, typename Rule> __device__ void quantize_columnwise(const Fp8BlockParams& p, Rule rule) {
    constexpr int WIDTH = THREADS * VEC / BLOCK, PARTS = BLOCK / VEC, SEGS = WIDTH / VEC;
    __shared__ float tile[BLOCK][WIDTH + 1];
    __shared__ float part_max[PARTS][WIDTH];
    const T* src = reinterpret_cast<const T*>(p.src);
    uint8_t* dst = reinterpret_cast<uint8_t*>(p.dst_columnwise);
    const uint64_t rows = p.rows, cols = p.cols;
    const uint64_t tile_cols = (cols + WIDTH - 1) / WIDTH;
    const uint64_t blocks_per_col = (rows + BLOCK - 1) / BLOCK;
    const uint64_t rb = blockIdx.x / tile_cols;
    const uint64_t r0 = rb * BLOCK, c0 = (blockIdx.x % tile_cols) * WIDTH;
    {  // load: thread -> (tile row t / SEGS, 16-column segment t % SEGS)
        const int i = threadIdx.x / SEGS, seg = threadIdx.x % SEGS;
        const uint64_t row = r0 + i, col = c0 + VEC * seg;
        const int n = (row < rows && col < cols) ? (int)min((uint64_t)VEC, cols - col) : 0;
        float x[VEC];
        if (n == VEC && cols % VEC == 0 && aligned16(p.src)) load16(src + row * cols + col, x);
        else load_partial(src + row * cols + col, n, x);
#pragma unroll
        for (int k = 0; k < VEC; ++k) tile[i][VEC * seg + k] = x[k];
    }
    __syncthreads();
    const int jj = threadIdx.x % WIDTH, part = threadIdx.x / WIDTH;
    float x[VEC];
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        x[k] = tile[VEC * part + k][jj];
        amax = fmaxf(amax, fabsf(x[k]));
    }
    part_max[part][jj] = amax;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < PARTS; ++k) amax = fmaxf(amax, part_max[k][jj]);
    float stored;
    const float scale = rule.scale(amax, stored);
    const uint64_t j = c0 + jj, i = r0 + VEC * part;
    if (j < cols && i < rows) {
        uint8_t q[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) q[k] = to_fp8(__fmul_rn(x[k], scale), p.format);
        uint8_t* out = dst + j * rows + i;
        if (rows % VEC == 0 && aligned16(p.dst_columnwise)) *reinterpret_cast<uint4*>(out) = pack16(q);
        else
            store_partial(out, (int)min((uint64_t)VEC, rows - i), q);
        if (part == 0) rule.store(p.scales_columnwise, j * blocks_per_col + rb, stored);
    }
}

// 128 x 128 tiles, one CTA each: amax pass, then cast pass (the tile is in
// L1/L2), codes staged in shared memory for the optional transposed copy.
template <typename T> __device__ void quantize_128x128(const Fp8BlockParams& p) {
    constexpr int B = 128, SEGS = B / VEC, ROW_STEP = THREADS / SEGS, STEPS = B / ROW_STEP;
    __shared__ __align__(16) uint8_t codes[B][B + 16];
    __shared__ float warp_max[THREADS / 32];
    const T* src = reinterpret_cast<const T*>(p.src);
    uint8_t* dst = reinterpret_cast<uint8_t*>(p.dst_rowwise);
    uint8_t* dst_t = reinterpret_cast<uint8_t*>(p.dst_columnwise);
    const uint64_t rows = p.rows, cols = p.cols;
    const uint64_t grid_cols = (cols + B - 1) / B, grid_rows = (rows + B - 1) / B;
    const uint64_t tr = blockIdx.x / grid_cols, tc = blockIdx.x % grid_cols;
    const uint64_t r0 = tr * B, c0 = tc * B;
    const int seg = threadIdx.x % SEGS, sub = threadIdx.x / SEGS;
    const uint64_t col = c0 + VEC * seg;
    const bool vec = cols % VEC == 0 && aligned16(p.src) && aligned16(p.dst_rowwise);
    const int n = col < cols ? (int)min((uint64_t)VEC, cols - col) : 0;
    float amax = 0.0f;
    for (int s = 0; s < STEPS; ++s) {
        const uint64_t row = r0 + sub + s * ROW_STEP;
        if (row >= rows) break;
        float x[VEC];
        if (vec && n == VEC) load16(src + row * cols + col, x);
        else load_partial(src + row * cols + col, n, x);
#pragma unroll
        for (int k = 0; k < VEC; ++k) amax = fmaxf(amax, fabsf(x[k]));
    }
    amax = group_max(amax, 32);
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    const F32Rule rule{p.format, p.power_2_scale != 0, p.amax_epsilon};
    float stored;
    const float scale = rule.scale(amax, stored);
    for (int s = 0; s < STEPS; ++s) {
        const int i = sub + s * ROW_STEP;
        const uint64_t row = r0 + i;
        if (row >= rows || n == 0) break;
        float x[VEC];
        uint8_t q[VEC];
        if (vec && n == VEC) load16(src + row * cols + col, x);
        else load_partial(src + row * cols + col, n, x);
#pragma unroll
        for (int k = 0; k < VEC; ++k) q[k] = to_fp8(__fmul_rn(x[k], scale), p.format);
        const uint4 packed = pack16(q);
        *reinterpret_cast<uint4*>(&codes[i][VEC * seg]) = packed;
        if (p.dst_rowwise == 0) continue;
        if (vec && n == VEC) *reinterpret_cast<uint4*>(dst + row * cols + col) = packed;
        else
            store_partial(dst + row * cols + col, n, q);
    }
    if (threadIdx.x == 0) {
        if (p.scales_rowwise != 0) reinterpret_cast<float*>(p.scales_rowwise)[tr * grid_cols + tc] = stored;
        if (p.scales_columnwise != 0) reinterpret_cast<float*>(p.scales_columnwise)[tc * grid_rows + tr] = stored;
    }
    if (dst_t == nullptr) return;
    __syncthreads();
    // Transposed copy: thread -> (tile column t % 128, 16-row segment t / 128 + 2 s).
    const int jj = threadIdx.x % B;
    const uint64_t j = c0 + jj;
    if (j >= cols) return;
    const bool vec_t = rows % VEC == 0 && aligned16(p.dst_columnwise);
    for (int s = threadIdx.x / B; s < SEGS; s += THREADS / B) {
        const uint64_t i = r0 + VEC * s;
        if (i >= rows) break;
        uint8_t q[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) q[k] = codes[VEC * s + k][jj];
        uint8_t* out = dst_t + j * rows + i;
        if (vec_t) *reinterpret_cast<uint4*>(out) = pack16(q);
        else
            store_partial(out, (int)min((uint64_t)VEC, rows - i), q);
    }
}

#define FP8_BLOCK_KERNELS(SUFFIX, T)                                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) fp8_block_1x128_rowwise_##SUFFIX(const Fp8BlockParams p) { \
        quantize_rowwise<128, T>(p, F32Rule{p.format, p.power_2_scale != 0, p.amax_epsilon});                  \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                      \
        fp8_block_1x128_columnwise_##SUFFIX(const Fp8BlockParams p) {                                          \
        quantize_columnwise<128, T>(p, F32Rule{p.format, p.power_2_scale != 0, p.amax_epsilon});               \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS) fp8_mxfp8_rowwise_##SUFFIX(const Fp8BlockParams p) { \
        quantize_rowwise<32, T>(p, E8m0Rule{p.format});                                                        \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS) fp8_mxfp8_columnwise_##SUFFIX(const Fp8BlockParams p) { \
        quantize_columnwise<32, T>(p, E8m0Rule{p.format});                                                     \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS) fp8_block_128x128_##SUFFIX(const Fp8BlockParams p) { \
        quantize_128x128<T>(p);                                                                                \
    }

FP8_BLOCK_KERNELS(f32, float)
FP8_BLOCK_KERNELS(bf16, __nv_bfloat16)
FP8_BLOCK_KERNELS(f16, __half)
