// Dtype conversion (f32 values to f32/bf16/fp16 storage, optionally
// transposed through shared memory), the transpose of 16-bit values and of FP8 codes, the residual add rounded to the dtype,
// the rounding of f32 values to the dtype in place, and the column sum of a bias gradient.
// Twins: dispatch::plain::convert and convert_transposed, gemm::Mat::k_major (transpose_16),
// quantize::transpose_codes (transpose_8),
// ops::elementwise::residual_add, Dtype::round_slice and column_sum_accumulate;
// every result is the same bits as the twin's.
#include "ops_device.cuh"

using namespace fp8ops;

// Transpose tile: 32 x 32 elements, 256 threads as 32 columns x 8 rows.
constexpr int TILE = 32;

template <typename T> __device__ void convert(const Fp8EltwiseParams& p) {
    const float* src = reinterpret_cast<const float*>(p.a);
    T* dst = reinterpret_cast<T*>(p.out);
    const uint64_t n = p.rows * p.cols;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = fp8::from_f32<T>(src[i]);
}

// dst [cols, rows] = src [rows, cols]^T: a tile is read row-wise (coalesced),
// staged in shared memory (one padding column: no bank conflicts) and written
// row-wise of the transpose (coalesced).
template <typename T> __device__ void convert_transpose(const Fp8EltwiseParams& p) {
    __shared__ float tile[TILE][TILE + 1];
    const float* src = reinterpret_cast<const float*>(p.a);
    T* dst = reinterpret_cast<T*>(p.out);
    const uint64_t rows = p.rows, cols = p.cols;
    const uint64_t tile_cols = (cols + TILE - 1) / TILE;
    const uint64_t r0 = (blockIdx.x / tile_cols) * TILE, c0 = (blockIdx.x % tile_cols) * TILE;
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
    for (int r = ty; r < TILE; r += THREADS / TILE) {
        const uint64_t row = r0 + r, col = c0 + tx;
        if (row < rows && col < cols) tile[r][tx] = src[row * cols + col];
    }
    __syncthreads();
    for (int c = ty; c < TILE; c += THREADS / TILE) {
        const uint64_t col = c0 + c, row = r0 + tx;
        if (row < rows && col < cols) dst[col * rows + row] = fp8::from_f32<T>(tile[tx][c]);
    }
}

#define CONVERT_KERNELS(SUFFIX, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS) fp8_convert_##SUFFIX(const Fp8EltwiseParams p) { \
        convert<T>(p);                                                                                   \
    }                                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                \
        fp8_convert_transpose_##SUFFIX(const Fp8EltwiseParams p) {                                       \
        convert_transpose<T>(p);                                                                         \
    }

CONVERT_KERNELS(f32, float)
CONVERT_KERNELS(bf16, __nv_bfloat16)
CONVERT_KERNELS(f16, __half)

// dst [cols, rows] = src [rows, cols]^T for 16-bit values (bf16 or fp16 bits, moved as they
// are): the staged GEMM's K-major copy of a transposed 16-bit operand, made here instead of on
// the host; and for bytes (FP8 codes): a frozen FP8 weight's W^T for its dgrad GEMM, made from
// its device copy. Tiles as convert_transpose; the tile holds 32-bit words (no bank conflicts).
// A byte per thread is not the fastest transpose, but W^T of a 4096 x 4096 segment is 32 MiB of
// traffic (11 us at 3 TB/s, a few times that here) against ~0.3 ms of its dgrad GEMM at 2048
// tokens (69 GFLOP).
template <typename T> __device__ void transpose_bits(const Fp8EltwiseParams& p) {
    __shared__ uint32_t tile[TILE][TILE + 1];
    const T* src = reinterpret_cast<const T*>(p.a);
    T* dst = reinterpret_cast<T*>(p.out);
    const uint64_t rows = p.rows, cols = p.cols;
    const uint64_t tile_cols = (cols + TILE - 1) / TILE;
    const uint64_t r0 = (blockIdx.x / tile_cols) * TILE, c0 = (blockIdx.x % tile_cols) * TILE;
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
    for (int r = ty; r < TILE; r += THREADS / TILE) {
        const uint64_t row = r0 + r, col = c0 + tx;
        if (row < rows && col < cols) tile[r][tx] = src[row * cols + col];
    }
    __syncthreads();
    for (int c = ty; c < TILE; c += THREADS / TILE) {
        const uint64_t col = c0 + c, row = r0 + tx;
        if (row < rows && col < cols) dst[col * rows + row] = (T)tile[tx][c];
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) fp8_transpose_16(const Fp8EltwiseParams p) {
    transpose_bits<uint16_t>(p);
}

extern "C" __global__ void __launch_bounds__(THREADS) fp8_transpose_8(const Fp8EltwiseParams p) {
    transpose_bits<uint8_t>(p);
}

// out = round_dtype(a + b) over rows * cols elements (rows = 1 for a flat tensor).
extern "C" __global__ void __launch_bounds__(THREADS) fp8_residual_add(const Fp8EltwiseParams p) {
    const float* a = reinterpret_cast<const float*>(p.a);
    const float* b = reinterpret_cast<const float*>(p.b);
    float* out = reinterpret_cast<float*>(p.out);
    const uint64_t n = p.rows * p.cols;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = round_to(add(a[i], b[i]), p.dtype);
}

// out = round_dtype(out) in place over rows * cols elements: f32 values rounded to the compute
// dtype, as the layers store a bf16/fp16 value (twin: Dtype::round_slice).
extern "C" __global__ void __launch_bounds__(THREADS) fp8_round(const Fp8EltwiseParams p) {
    float* out = reinterpret_cast<float*>(p.out);
    const uint64_t n = p.rows * p.cols;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = round_to(out[i], p.dtype);
}

// A column range of one row-major matrix into another (rows x width values, moved as they
// are): the split of the fused QKV output into Q, K, V and the join of their gradients
// (twin: dispatch::columns::copy_columns). Grid-stride over the range; consecutive threads
// take consecutive columns of a row, so reads and writes are coalesced.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_copy_columns(const Fp8CopyColumnsParams p) {
    const float* a = reinterpret_cast<const float*>(p.a);
    float* out = reinterpret_cast<float*>(p.out);
    const uint64_t n = p.rows * p.width;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint64_t r = i / p.width, c = i % p.width;
        out[r * p.out_cols + p.out_first + c] = a[r * p.a_cols + p.a_first + c];
    }
}

// out[c] += a[r, c] for r = 0, 1, ... in order: one thread per column adds
// the rows in the CPU twin's order, so the sums are the twin's bits (and
// deterministic, no atomics). A warp reads 32 consecutive columns of a row.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_column_sum(const Fp8EltwiseParams p) {
    const float* a = reinterpret_cast<const float*>(p.a);
    float* out = reinterpret_cast<float*>(p.out);
    const uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= p.cols) return;
    float s = out[c];
    for (uint64_t r = 0; r < p.rows; ++r) s = add(s, a[r * p.cols + c]);
    out[c] = s;
}
