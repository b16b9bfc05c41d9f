// The portable tensor-core GEMM (mma.sync), shared by the FP8 and the 16-bit
// kernels: D = alpha * (A . B^T) * sA * sB (+ bias) (+ beta * D), A [m, k] and
// B [n, k] K-major ("TN"), D [m, n] row-major (spec 5).
//
// Tiling: a CTA computes a 128 x 128 tile of D with 8 warps (2 along M x 4
// along N, 64 x 32 each). A k-tile is 64 bytes of every row: 64 FP8 or 32
// 16-bit elements, so both families share the loads and the shared-memory
// layout (8 KiB per operand per stage, 4 cp.async stages = 64 KiB). One mma
// consumes 32 bytes of K per row (m16n8k32 FP8, m16n8k16 bf16/f16, or two
// m16n8k8 f16 on sm_75), whose A/B fragments have the same byte layout, so one
// ldmatrix.x4 feeds every variant.
//
// Shared memory: a 64-byte row is four 16-byte chunks; chunk c of row r lives
// at chunk c ^ ((r >> 1) & 3). ldmatrix reads one chunk of 8 consecutive rows:
// rows 2i and 2i+1 sit 64 bytes apart (banks 0-15 vs 16-31) and the XOR moves
// each pair to a different 16-byte column, so the 8 rows hit 32 distinct banks.
//
// Ragged edges: rows past m/n and chunks past k are zero-filled by the loads
// (cp.async with src-size 0), so the mma adds exact zeros; the epilogue writes
// and measures only in-range elements.
#pragma once

#include "fp8_device.cuh"

namespace fp8gemm {

constexpr int BM = 128;        // CTA tile rows (M)
constexpr int BN = 128;        // CTA tile columns (N)
constexpr int BK_BYTES = 64;   // bytes of K per row per stage
constexpr int STAGES = 4;      // cp.async pipeline depth
constexpr int THREADS = 256;   // 8 warps
constexpr int WM = 64;         // warp tile rows
constexpr int WN = 32;         // warp tile columns
constexpr int MT = WM / 16;    // m16 fragments per warp
constexpr int NT = WN / 8;     // n8 fragments per warp
constexpr int TILE_BYTES = BM * BK_BYTES;
constexpr int STAGE_BYTES = 2 * TILE_BYTES;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;  // 64 KiB, dynamic
constexpr int GROUP_M = 8;     // CTA raster: 8 M-tiles sweep N together (L2 reuse of B)
constexpr int PROMOTE_K = 128; // split accumulation / block-scale granularity (elements)

static_assert(BM == BN && BM * BK_BYTES / 16 == 2 * THREADS, "each thread copies 2 chunks per operand per stage");

// sm_90a and sm_100a run FP8 mma.sync as f16 HMMA after unpacking every fragment
// (their fast FP8 paths are wgmma / tcgen05), which doubles the fragment registers:
// one k-step at a time keeps the split-accumulation kernel under 255 without spills.
#if __CUDA_ARCH__ == 900 || __CUDA_ARCH__ == 1000
constexpr int KS_UNROLL = 1;
#else
constexpr int KS_UNROLL = 2;
#endif

// ---- shared-memory addressing and loads ---------------------------------------------

__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
    return (uint32_t)(row * BK_BYTES + ((chunk ^ ((row >> 1) & 3)) << 4));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, or 16 zero bytes when !valid.
__device__ __forceinline__ void copy16(uint32_t dst, const uint8_t* src, bool valid) {
#if __CUDA_ARCH__ >= 800
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
#else
    // sm_75 has no cp.async: a synchronous copy through registers (the fallback's speed is not a target).
    uint4 v = make_uint4(0, 0, 0, 0);
    if (valid) v = *reinterpret_cast<const uint4*>(src);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
#endif
}

__device__ __forceinline__ void copy_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N> __device__ __forceinline__ void copy_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// One operand's k-tile: rows [row0, row0 + 128) x bytes [kbyte, kbyte + 64) into `tile`.
__device__ __forceinline__ void load_tile(uint32_t tile, const uint8_t* base, uint32_t rows, uint64_t row_bytes,
                                          uint32_t row0, uint64_t kbyte) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int idx = threadIdx.x + i * THREADS;
        const int r = idx >> 2, c = idx & 3;
        const uint64_t col = kbyte + 16 * c;
        const bool valid = row0 + r < rows && col < row_bytes;
        const uint8_t* src = valid ? base + (uint64_t)(row0 + r) * row_bytes + col : base;
        copy16(tile + swizzle(r, c), src, valid);
    }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// ---- the tensor-core ops: 16 x 8 outputs += 16 x 32 bytes . (8 x 32 bytes)^T ---------

#define FP8GEMM_MMA_K32(NAME, TYPES)                                                                           \
    struct NAME {                                                                                              \
        __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,       \
                                                   uint32_t b1) {                                              \
            asm("mma.sync.aligned.m16n8k32.row.col.f32." TYPES ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "     \
                "{%8, %9}, {%0, %1, %2, %3};\n"                                                                \
                : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                               \
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                               \
        }                                                                                                      \
    };

#define FP8GEMM_MMA_K16(NAME, TYPES)                                                                           \
    struct NAME {                                                                                              \
        __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,       \
                                                   uint32_t b1) {                                              \
            asm("mma.sync.aligned.m16n8k16.row.col.f32." TYPES ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "     \
                "{%8, %9}, {%0, %1, %2, %3};\n"                                                                \
                : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                               \
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                               \
        }                                                                                                      \
    };

// sm_75: m16n8k16 is two m16n8k8 (registers a0,a1 / b0 hold k 0-7, a2,a3 / b1 hold k 8-15).
struct MmaF16K8 {
    __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(b0));
        asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[2]), "r"(a[3]), "r"(b1));
    }
};

// ---- CTA raster -----------------------------------------------------------------------

// Linear block id -> (M tile, N tile): GROUP_M consecutive M tiles walk N together, so
// the B tiles they share stay in L2. The Rust launcher mirrors this in its unit tests.
__device__ __forceinline__ void tile_of_block(uint32_t pid, uint32_t tiles_m, uint32_t tiles_n, uint32_t& tm,
                                              uint32_t& tn) {
    const uint32_t group_size = GROUP_M * tiles_n;
    const uint32_t first_m = (pid / group_size) * GROUP_M;
    const uint32_t group_m = min(tiles_m - first_m, (uint32_t)GROUP_M);
    const uint32_t in_group = pid % group_size;
    tm = first_m + in_group % group_m;
    tn = in_group / group_m;
}

// ---- epilogue -------------------------------------------------------------------------

// Stores one or two adjacent results (columns col, col + 1 of `row`).
__device__ __forceinline__ void store_out(const Fp8GemmParams& p, uint64_t at, float v0, float v1, bool pair,
                                          bool vec, float out_scale) {
    switch (p.out_dtype) {
    case FP8_GEMM_OUT_F32: {
        float* d = reinterpret_cast<float*>(p.d) + at;
        if (vec) *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
        else {
            d[0] = v0;
            if (pair) d[1] = v1;
        }
        break;
    }
    case FP8_GEMM_OUT_BF16: {
        __nv_bfloat16* d = reinterpret_cast<__nv_bfloat16*>(p.d) + at;
        if (vec) *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(v0, v1);
        else {
            d[0] = __float2bfloat16_rn(v0);
            if (pair) d[1] = __float2bfloat16_rn(v1);
        }
        break;
    }
    case FP8_GEMM_OUT_F16: {
        __half* d = reinterpret_cast<__half*>(p.d) + at;
        if (vec) *reinterpret_cast<__half2*>(d) = __floats2half2_rn(v0, v1);
        else {
            d[0] = __float2half_rn(v0);
            if (pair) d[1] = __float2half_rn(v1);
        }
        break;
    }
    default: {  // FP8: cast_sat(D * scale), the CPU twin's quantize
        const uint32_t format = p.out_dtype == FP8_GEMM_OUT_E4M3 ? FP8_FORMAT_E4M3 : FP8_FORMAT_E5M2;
        uint8_t* d = reinterpret_cast<uint8_t*>(p.d) + at;
        const uint8_t q0 = fp8::to_fp8(__fmul_rn(v0, out_scale), format);
        const uint8_t q1 = fp8::to_fp8(__fmul_rn(v1, out_scale), format);
        if (vec) *reinterpret_cast<uint16_t*>(d) = (uint16_t)(q0 | (q1 << 8));
        else {
            d[0] = q0;
            if (pair) d[1] = q1;
        }
        break;
    }
    }
}

// acc += partial * (sA * sB) for K-block kb, in the CPU reference's order (sA = sB = 1
// unless block-scaled), then partial = 0. The scales are read here, after the
// mma, rather than before it: held across the mma loop they cost 16 registers
// and made the sm_100a build spill; the L2 latency is paid once per 128 of K.
__device__ __forceinline__ void promote_partial(const Fp8GemmParams& p, float (&acc)[MT][NT][4],
                                                float (&part)[MT][NT][4], bool blocked, uint32_t kb, uint32_t row0,
                                                uint32_t n0, uint32_t col0) {
    const float* asc = reinterpret_cast<const float*>(p.a_scale_inv);
    const float* bsc = reinterpret_cast<const float*>(p.b_scale_inv);
    float sb[NT][2];
    const float tile_b =
        p.scale_mode == FP8_GEMM_SCALES_1X128_BY_128X128 ? __ldg(bsc + (uint64_t)(n0 / 128) * p.k_blocks + kb) : 1.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint32_t col = col0 + 8 * j + e;
            sb[j][e] = p.scale_mode == FP8_GEMM_SCALES_1X128_BY_1X128 && col < p.n
                           ? __ldg(bsc + (uint64_t)col * p.k_blocks + kb)
                           : tile_b;
        }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t row = row0 + 16 * i + 8 * h;
            const float sa = blocked && row < p.m ? __ldg(asc + (uint64_t)row * p.k_blocks + kb) : 1.0f;
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& pv = part[i][j][2 * h + e];
                    const float s = __fmul_rn(sa, sb[j][e]);
                    acc[i][j][2 * h + e] = __fadd_rn(acc[i][j][2 * h + e], __fmul_rn(pv, s));
                    pv = 0.0f;
                }
        }
}

// MXFP8: acc += part * (2^(ea-127) * 2^(eb-127)) for the 32-wide K block kb, with ea
// A's E8M0 exponent of (row, kb) and eb B's of (col, kb), in the CPU reference's order
// (the product of the two decoded scales, then partial * scales, then the add: three
// roundings, no fused multiply-add), then part = 0. E8M0 0xFF decodes to NaN and 0 to
// the subnormal 2^-127, as on the CPU; out-of-range rows and columns (never stored) take 1.
// One k32 mma spans exactly one scale block, so this runs after every k-step.
__device__ __forceinline__ void promote_e8m0(const Fp8GemmParams& p, float (&acc)[MT][NT][4],
                                             float (&part)[MT][NT][4], uint32_t kb, uint32_t row0, uint32_t col0) {
    const uint8_t* asc = reinterpret_cast<const uint8_t*>(p.a_scale_inv);
    const uint8_t* bsc = reinterpret_cast<const uint8_t*>(p.b_scale_inv);
    float sb[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint32_t col = col0 + 8 * j + e;
            sb[j][e] = col < p.n ? fp8::e8m0_decode(__ldg(bsc + (uint64_t)col * p.k_blocks + kb)) : 1.0f;
        }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t row = row0 + 16 * i + 8 * h;
            const float sa = row < p.m ? fp8::e8m0_decode(__ldg(asc + (uint64_t)row * p.k_blocks + kb)) : 1.0f;
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& pv = part[i][j][2 * h + e];
                    const float s = __fmul_rn(sa, sb[j][e]);
                    acc[i][j][2 * h + e] = __fadd_rn(acc[i][j][2 * h + e], __fmul_rn(pv, s));
                    pv = 0.0f;
                }
        }
}

// ---- the kernel body ------------------------------------------------------------------

// Op: the mma wrapper. PARTIAL: keep the tensor-core sum in a separate register set
// and promote it into the f32 accumulator (FP8: at the end, or every 128 of K when
// splitting, times the block scales if any). 16-bit inputs accumulate directly.
// MX (with PARTIAL): MXFP8 operands, promoted after every k32 mma times their E8M0 scales.
template <class Op, bool PARTIAL, bool MX = false>
__device__ __forceinline__ void gemm_body(const Fp8GemmParams& p, uint8_t* smem) {
    static_assert(PARTIAL || !MX, "MXFP8 promotes a partial sum");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp >> 2, warp_n = warp & 3;
    const uint32_t tiles_m = (p.m + BM - 1) / BM, tiles_n = (p.n + BN - 1) / BN;
    uint32_t tm, tn;
    tile_of_block(blockIdx.x, tiles_m, tiles_n, tm, tn);
    const uint32_t m0 = tm * BM, n0 = tn * BN;

    const uint32_t elem = PARTIAL ? 1 : 2;
    const uint64_t row_bytes = (uint64_t)p.k * elem;
    const int ktiles = (int)((row_bytes + BK_BYTES - 1) / BK_BYTES);
    const uint8_t* a = reinterpret_cast<const uint8_t*>(p.a);
    const uint8_t* b = reinterpret_cast<const uint8_t*>(p.b);
    const uint32_t sbase = smem_addr(smem);

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    float part[MT][NT][4];  // unused (and dropped by the compiler) without PARTIAL
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[i][j][e] = 0.0f;

    const bool blocked = p.scale_mode == FP8_GEMM_SCALES_1X128_BY_128X128 || p.scale_mode == FP8_GEMM_SCALES_1X128_BY_1X128;
    const bool split = PARTIAL && (blocked || p.split_accumulator != 0);
    constexpr int TILES_PER_PROMOTION = PROMOTE_K / BK_BYTES;  // FP8: 1 byte per element

    // Rows and columns this thread's accumulators cover, relative to the CTA tile.
    const int g = lane >> 2, t = lane & 3;
    const int row_base = warp_m * WM + g;      // + 16 * mt + 8 * h
    const int col_base = warp_n * WN + 2 * t;  // + 8 * nt + e

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) {
            const uint32_t st = sbase + s * STAGE_BYTES;
            load_tile(st, a, p.m, row_bytes, m0, (uint64_t)s * BK_BYTES);
            load_tile(st + TILE_BYTES, b, p.n, row_bytes, n0, (uint64_t)s * BK_BYTES);
        }
        copy_commit();
    }

    for (int kt = 0; kt < ktiles; ++kt) {
        copy_wait<STAGES - 2>();
        __syncthreads();
        {
            const int next = kt + STAGES - 1;
            if (next < ktiles) {
                const uint32_t st = sbase + (next % STAGES) * STAGE_BYTES;
                load_tile(st, a, p.m, row_bytes, m0, (uint64_t)next * BK_BYTES);
                load_tile(st + TILE_BYTES, b, p.n, row_bytes, n0, (uint64_t)next * BK_BYTES);
            }
            copy_commit();
        }
        const bool promote = PARTIAL && (kt == ktiles - 1 || (split && kt % TILES_PER_PROMOTION == TILES_PER_PROMOTION - 1));
        const uint32_t sa_tile = sbase + (kt % STAGES) * STAGE_BYTES;
        const uint32_t sb_tile = sa_tile + TILE_BYTES;
#pragma unroll KS_UNROLL
        for (int ks = 0; ks < BK_BYTES / 32; ++ks) {
            // The swizzle term depends on row bits 1-2 only, which the 16-row steps keep,
            // so each fragment is this lane's offset plus a multiple of 16 rows.
            const uint32_t a_lane = sa_tile + swizzle(warp_m * WM + (lane & 15), 2 * ks + (lane >> 4));
            const uint32_t b_lane =
                sb_tile + swizzle(warp_n * WN + ((lane >> 4) << 3) + (lane & 7), 2 * ks + ((lane >> 3) & 1));
            uint32_t af[MT][4];
#pragma unroll
            for (int i = 0; i < MT; ++i) ldmatrix_x4(af[i], a_lane + i * 16 * BK_BYTES);
#pragma unroll
            for (int jj = 0; jj < NT / 2; ++jj) {
                uint32_t bf[4];  // b0, b1 of n-tile 2jj, then of 2jj + 1
                ldmatrix_x4(bf, b_lane + jj * 16 * BK_BYTES);
#pragma unroll
                for (int i = 0; i < MT; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int j = 2 * jj + h;
                        if constexpr (PARTIAL) Op::mma(part[i][j], af[i], bf[2 * h], bf[2 * h + 1]);
                        else Op::mma(acc[i][j], af[i], bf[2 * h], bf[2 * h + 1]);
                    }
            }
            if constexpr (MX) {
                // The k32 block this step summed; past the last one (K % 64 <= 32) only zeros were added.
                const uint32_t kb = (uint32_t)kt * (BK_BYTES / 32) + (uint32_t)ks;
                if (kb < p.k_blocks) promote_e8m0(p, acc, part, kb, m0 + row_base, n0 + col_base);
            }
        }

        if constexpr (PARTIAL && !MX) {
            if (promote) promote_partial(p, acc, part, blocked, (uint32_t)(kt / TILES_PER_PROMOTION), m0 + row_base,
                                         n0, n0 + col_base);
        }
    }
    copy_wait<0>();

    // Epilogue, in the CPU reference's order: v = acc * factor; v += bias; v += beta * D_old.
    float factor = p.alpha;
    if (p.scale_mode == FP8_GEMM_SCALES_PER_TENSOR)
        factor = __fmul_rn(__fmul_rn(p.alpha, *reinterpret_cast<const float*>(p.a_scale_inv)),
                           *reinterpret_cast<const float*>(p.b_scale_inv));
    const float out_scale = p.d_scale != 0 ? *reinterpret_cast<const float*>(p.d_scale) : 1.0f;
    const float* bias = reinterpret_cast<const float*>(p.bias);
    const float* d_old = reinterpret_cast<const float*>(p.d);
    const bool n_even = (p.n & 1u) == 0;
    // |v| as int bits: non-negative floats order like ints and a NaN beats inf, so an
    // integer max is a NaN-propagating max (the CPU reference's amax).
    int amax_bits = 0;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t row = m0 + row_base + 16 * i + 8 * h;
                const uint32_t col = n0 + col_base + 8 * j;
                if (row >= p.m || col >= p.n) continue;
                const bool pair = col + 1 < p.n;
                const uint64_t at = (uint64_t)row * p.n + col;
                float v[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float x = __fmul_rn(acc[i][j][2 * h + e], factor);
                    if (e == 0 || pair) {
                        if (bias != nullptr) x = __fadd_rn(x, __ldg(bias + col + e));
                        if (p.beta != 0.0f) x = __fadd_rn(x, __fmul_rn(p.beta, d_old[at + e]));
                        amax_bits = max(amax_bits, __float_as_int(fabsf(x)));
                    }
                    v[e] = x;
                }
                store_out(p, at, v[0], v[1], pair, pair && n_even, out_scale);
            }

    if (p.amax != 0) {
        for (int o = 16; o > 0; o /= 2) amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, o));
        int* warp_max = reinterpret_cast<int*>(smem);
        __syncthreads();  // every warp is done reading the stages
        if (lane == 0) warp_max[warp] = amax_bits;
        __syncthreads();
        if (tid == 0) {
            int m = 0;
            for (int w = 0; w < THREADS / 32; ++w) m = max(m, warp_max[w]);
            // Target holds a non-negative float or a +NaN: a signed max keeps a NaN and orders the rest.
            if (m != 0) atomicMax(reinterpret_cast<int*>(p.amax), m);
        }
    }
}

// The body of a variant that does not exist on the compiled architecture: report, do nothing.
__device__ __forceinline__ void unsupported(const Fp8GemmParams& p) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && p.error_flag != 0)
        *reinterpret_cast<uint32_t*>(p.error_flag) = FP8_GEMM_ERROR_ARCH;
}

}  // namespace fp8gemm
