// Hopper (sm_90a) FP8 GEMM fast path: D = alpha * (A . B^T) * sA * sB (+ bias) (+ beta * D),
// A [m, k] and B [n, k] FP8 codes, both K-major; D [m, n] row-major f32/bf16/f16/FP8.
//
// Warp-specialized, persistent: 384 threads = one producer warpgroup (TMA
// loads, register allotment cut to 40) and two consumer warpgroups (wgmma,
// promotion, epilogue; 232 registers each). A tile is BLOCK_M 128 x BLOCK_N
// (128 or 256); consumer warpgroup w owns rows 64w..64w+63 of it. K advances
// in blocks of 128 bytes = 128 FP8 elements: one 128-byte swizzle row per tile
// row, four m64nNk32 wgmma per block, and the natural promotion / block-scale
// granularity. A ring of STAGES shared-memory stages, each guarded by a
// "full" mbarrier (TMA bytes + producer arrivals) and an "empty" one (one
// arrival per consumer warp), carries A and B tiles (and, for block scales,
// the K-block's per-row and per-column scale_inv) from producer to consumers.
// Every CTA walks tiles blockIdx.x, +gridDim.x, ... in the grouped order of
// tile_coords (the same formula as src/backend/cuda/hopper/scheduler.rs).
//
// Epilogue: straight from the accumulator registers to global memory with
// bounds checks (two adjacent columns per store), not through shared memory
// and TMA store: it handles any M, N and row alignment the same way.
//
// Only sm_90a has wgmma/setmaxnreg; every other target gets a stub that
// reports FP8_GEMM_ERROR_ARCH (the launcher never starts it there).
#include "fp8_device.cuh"
#include "wgmma_mma.cuh"
#include "wgmma_sync.cuh"
#include "wgmma_tma.cuh"

// The kernel bodies exist for sm_90a only (other targets would not even use them).
#if WGMMA_SM90A
namespace {

constexpr int THREADS = (int)FP8_WGMMA_THREADS;
constexpr int BLOCK_M = (int)FP8_WGMMA_BLOCK_M;
constexpr int BLOCK_K = (int)FP8_WGMMA_BLOCK_K;
constexpr int WG_THREADS = 128;
constexpr int CONSUMER_WARPS = 8;
constexpr int K_STEP = 32;  // K of one wgmma for FP8
// Register allotments after setmaxnreg: 128 x 40 + 256 x 232 = 64512 <= 65536.
constexpr int PRODUCER_REGS = 40;
constexpr int CONSUMER_REGS = 232;
// Shared memory a CTA may use on sm_90 (227 KiB).
constexpr int MAX_SMEM = 232448;

static_assert(THREADS == 3 * WG_THREADS, "one producer and two consumer warpgroups");
static_assert(BLOCK_M == 2 * 64, "each consumer warpgroup owns 64 rows (one m64 wgmma)");
static_assert(BLOCK_K == 128, "one 128-byte swizzle row of FP8 per K-block, promotion every 128 of K");
static_assert(PRODUCER_REGS * WG_THREADS + CONSUMER_REGS * 2 * WG_THREADS <= 65536, "register file");

// Shared-memory layout of one CTA (offsets from a 1024-aligned base). Mirrored
// by dynamic_smem_bytes() in src/backend/cuda/hopper/launch.rs.
template <int BLOCK_N> struct Geometry {
    static constexpr int STAGES = BLOCK_N == 128 ? (int)FP8_WGMMA_STAGES_N128 : (int)FP8_WGMMA_STAGES_N256;
    static constexpr int A_BYTES = BLOCK_M * BLOCK_K;
    static constexpr int B_BYTES = BLOCK_N * BLOCK_K;
    static constexpr int A_OFF = 0;
    static constexpr int B_OFF = A_OFF + STAGES * A_BYTES;
    static constexpr int SA_OFF = B_OFF + STAGES * B_BYTES;          // f32 [STAGES][BLOCK_M]
    static constexpr int SB_OFF = SA_OFF + STAGES * BLOCK_M * 4;     // f32 [STAGES][BLOCK_N]
    static constexpr int FULL_OFF = SB_OFF + STAGES * BLOCK_N * 4;   // u64 [STAGES]
    static constexpr int EMPTY_OFF = FULL_OFF + STAGES * 8;          // u64 [STAGES]
    static constexpr int AMAX_OFF = EMPTY_OFF + STAGES * 8;          // u32 [CONSUMER_WARPS]
    static constexpr int BYTES = AMAX_OFF + CONSUMER_WARPS * 4;
    static constexpr int DYNAMIC_SMEM = BYTES + (int)FP8_WGMMA_SMEM_ALIGN;  // slack to align the base
    static constexpr uint32_t TX_BYTES = A_BYTES + B_BYTES;  // TMA counts zero-filled bytes too

    static_assert(BLOCK_N == 128 || BLOCK_N == 256, "BLOCK_N is 128 or 256 (TMA box <= 256 rows)");
    static_assert(A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0, "tiles start on swizzle-atom boundaries");
    static_assert(DYNAMIC_SMEM <= MAX_SMEM, "ring does not fit in 227 KiB");
    static_assert(STAGES >= 2, "a ring needs two stages to overlap");
};

// The producer's wait for ring slot `it` to be free (empty barrier of stage
// it % STAGES, parity `parity`). The _bounded variants give up after ~10 s,
// record FP8_WGMMA_ERROR_HANG with the stage, parity and role in the error
// flag (first writer wins) and trap. Role 0: waiting inside the loop; role 1:
// the final drain (see produce). Only the producer's waits are bounded: it has
// registers to spare, while a consumer wait with a timer makes the 256-wide
// split consumer spill, and a consumer stuck on a full barrier never releases
// its stage, which the producer's next wait or the drain then reports.
template <int STAGES, bool BOUNDED>
__device__ __forceinline__ void wait_free(const Fp8WgmmaGemmParams& p, uint32_t bar, uint32_t parity, uint32_t it,
                                          uint32_t role) {
    if constexpr (BOUNDED) {
        wgmma::mbar_wait_bounded(bar, parity, [&] {
            const uint32_t code = FP8_WGMMA_ERROR_HANG | ((it % STAGES) << FP8_WGMMA_HANG_STAGE_SHIFT) |
                                  (parity << FP8_WGMMA_HANG_PARITY_SHIFT) | (role << FP8_WGMMA_HANG_ROLE_SHIFT);
            if (p.error_flag != 0) atomicCAS(reinterpret_cast<uint32_t*>(p.error_flag), 0u, code);
        });
    } else {
        wgmma::mbar_wait(bar, parity);
    }
}

// The persistent tile order: groups of group_m m-blocks, m fastest inside a
// group, so CTAs running at the same time share A rows and B columns in L2.
__device__ __forceinline__ void tile_coords(uint32_t tile, uint32_t m_blocks, uint32_t n_blocks, uint32_t group_m,
                                            uint32_t& mb, uint32_t& nb) {
    const uint32_t per_group = group_m * n_blocks;
    const uint32_t group = tile / per_group;
    const uint32_t first_m = group * group_m;
    const uint32_t rows = min(m_blocks - first_m, group_m);
    const uint32_t in_group = tile - group * per_group;
    mb = first_m + in_group % rows;
    nb = in_group / rows;
}

// One m64nNk32 FP8 wgmma into d (N/2 floats per thread).
template <int N, bool A_E5M2>
__device__ __forceinline__ void mma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    if constexpr (N == 128) {
        if constexpr (A_E5M2) wgmma::mma_m64n128k32_e5m2_e4m3(d, desc_a, desc_b, scale_d);
        else wgmma::mma_m64n128k32_e4m3_e4m3(d, desc_a, desc_b, scale_d);
    } else {
        static_assert(N == 256, "wgmma N is 128 or 256 here");
        if constexpr (A_E5M2) wgmma::mma_m64n256k32_e5m2_e4m3(d, desc_a, desc_b, scale_d);
        else wgmma::mma_m64n256k32_e4m3_e4m3(d, desc_a, desc_b, scale_d);
    }
}

template <int N> __device__ __forceinline__ void fence_fragment(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) wgmma::fence_operand(d[i]);
}

// The four k32 wgmma of one 128-byte K-block: d (+)= A_tile(64 x 128) . B_chunk(N x 128)^T.
// Inside a 128-byte swizzled row, the k-th 32-byte slice starts 32k bytes further
// (the hardware applies the XOR swizzle to the computed addresses): +2 in the
// descriptor's address field (bytes >> 4).
template <int N, bool A_E5M2>
__device__ __forceinline__ void mma_k_block(float (&d)[N / 2], uint32_t a_tile, uint32_t b_chunk, bool accumulate) {
    const uint64_t da = wgmma::desc_k_major_sw128(a_tile);
    const uint64_t db = wgmma::desc_k_major_sw128(b_chunk);
    fence_fragment(d);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BLOCK_K / K_STEP; ++kk)
        mma<N, A_E5M2>(d, da + 2 * kk, db + 2 * kk, (accumulate || kk > 0) ? 1 : 0);
    wgmma::commit_group();
    wgmma::wait_group<0>();
    fence_fragment(d);
}

// |v| as bits: unsigned order of non-negative floats is numeric order, and any
// NaN (sign cleared) beats +inf, so a max over these bits is a NaN-sticky amax.
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

// Writes D[row][col], D[row][col+1] (col even, row < m, col < n) as out_dtype.
__device__ __forceinline__ void store_pair(const Fp8WgmmaGemmParams& p, uint32_t row, uint32_t col, float v0, float v1,
                                           float d_scale, bool pair) {
    const uint64_t i = (uint64_t)row * p.n + col;
    switch (p.out_dtype) {
        case FP8_GEMM_OUT_F32: {
            float* d = reinterpret_cast<float*>(p.d) + i;
            if (pair) *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
            else d[0] = v0;
            break;
        }
        case FP8_GEMM_OUT_BF16: {
            __nv_bfloat16* d = reinterpret_cast<__nv_bfloat16*>(p.d) + i;
            if (pair) *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(v0, v1);
            else d[0] = __float2bfloat16_rn(v0);
            break;
        }
        case FP8_GEMM_OUT_F16: {
            __half* d = reinterpret_cast<__half*>(p.d) + i;
            if (pair) *reinterpret_cast<__half2*>(d) = __floats2half2_rn(v0, v1);
            else d[0] = __float2half_rn(v0);
            break;
        }
        default: {
            const uint32_t format = p.out_dtype == FP8_GEMM_OUT_E4M3 ? FP8_FORMAT_E4M3 : FP8_FORMAT_E5M2;
            uint8_t* d = reinterpret_cast<uint8_t*>(p.d) + i;
            const uint8_t q0 = fp8::to_fp8(__fmul_rn(v0, d_scale), format);
            if (pair) {
                const uint8_t q1 = fp8::to_fp8(__fmul_rn(v1, d_scale), format);
                *reinterpret_cast<uint16_t*>(d) = (uint16_t)(q0 | (q1 << 8));
            } else {
                d[0] = q0;
            }
        }
    }
}

// Producer warpgroup: waits for a free stage, (block scales: stages the K-block's
// scale_inv of the tile's rows and columns), then starts the two TMA loads;
// the bounded variants end with a drain that waits for every stage's release.
template <int BLOCK_N, bool BOUNDED>
__device__ __forceinline__ void produce(const Fp8WgmmaGemmParams& p, uint32_t base, float* sa, float* sb, bool blocked,
                                        uint32_t m_blocks, uint32_t n_blocks, uint32_t tiles) {
    using G = Geometry<BLOCK_N>;
    const int t = threadIdx.x;  // 0..127
    const float* a_scale = reinterpret_cast<const float*>(p.a_scale_inv);
    const float* b_scale = reinterpret_cast<const float*>(p.b_scale_inv);
    const bool b_per_row = p.scale_mode == FP8_GEMM_SCALES_1X128_BY_1X128;
    uint32_t it = 0;
    for (uint32_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        uint32_t mb, nb;
        tile_coords(tile, m_blocks, n_blocks, p.group_m, mb, nb);
        const uint32_t m0 = mb * BLOCK_M, n0 = nb * BLOCK_N;
        for (uint32_t kb = 0; kb < p.k_blocks; ++kb, ++it) {
            const uint32_t s = it % G::STAGES;
            const uint32_t phase = (it / G::STAGES) & 1u;
            const uint32_t full = base + G::FULL_OFF + 8 * s;
            // First pass over the ring: parity phase^1 = 1 names the phase "before"
            // the barrier's first one, which counts as complete, so no wait.
            wait_free<G::STAGES, BOUNDED>(p, base + G::EMPTY_OFF + 8 * s, phase ^ 1u, it, 0);
            if (blocked) {
                const uint32_t row = m0 + t;
                sa[s * BLOCK_M + t] = row < p.m ? a_scale[(uint64_t)row * p.k_blocks + kb] : 0.0f;
#pragma unroll
                for (int j = t; j < BLOCK_N; j += WG_THREADS) {
                    const uint32_t col = n0 + j;
                    const uint64_t r = b_per_row ? col : col / 128u;
                    sb[s * BLOCK_N + j] = col < p.n ? b_scale[r * p.k_blocks + kb] : 0.0f;
                }
            }
            if (t == 0) {
                wgmma::mbar_arrive_expect_tx(full, G::TX_BYTES);
                wgmma::tma_load_2d(base + G::A_OFF + s * G::A_BYTES, &p.map_a, full, (int32_t)(kb * BLOCK_K),
                                   (int32_t)m0);
                wgmma::tma_load_2d(base + G::B_OFF + s * G::B_BYTES, &p.map_b, full, (int32_t)(kb * BLOCK_K),
                                   (int32_t)n0);
            } else {
                wgmma::mbar_arrive(full);
            }
        }
    }
    if constexpr (BOUNDED) {
        // Drain: wait, as for STAGES more slots, until the consumers have released
        // every stage, so a consumer stuck on a full barrier (wrong expect_tx, a TMA
        // that never lands) is reported even after the producer's last load.
        if (t == 0)
            for (uint32_t i = 0; i < (uint32_t)G::STAGES; ++i, ++it)
                wait_free<G::STAGES, true>(p, base + G::EMPTY_OFF + 8 * (it % G::STAGES),
                                           ((it / G::STAGES) & 1u) ^ 1u, it, 1);
    }
}

// Consumer warpgroup cw (0, 1): rows 64cw..64cw+63 of every tile of this CTA.
// Returns this thread's amax bits over everything it wrote.
template <int BLOCK_N, bool A_E5M2, bool SPLIT>
__device__ __forceinline__ uint32_t consume(const Fp8WgmmaGemmParams& p, uint32_t base, const float* sa,
                                            const float* sb, bool blocked, uint32_t m_blocks, uint32_t n_blocks,
                                            uint32_t tiles, int cw) {
    using G = Geometry<BLOCK_N>;
    // With promotion, the tensor-core partial sum of a K-block lives next to the
    // f32 accumulator: one n256 partial (128 floats) + 128 would not fit in 232
    // registers, so BLOCK_N 256 runs as two n128 chunks sharing one partial.
    constexpr int CHUNK_N = SPLIT ? 128 : BLOCK_N;
    constexpr int CHUNKS = BLOCK_N / CHUNK_N;
    constexpr int FRAG = CHUNK_N / 2;
    const int t = threadIdx.x % WG_THREADS, warp = t / 32, lane = t % 32;
    const uint32_t row_in_tile = cw * 64 + warp * 16 + lane / 4;  // and +8
    const uint32_t col_in_chunk = 2 * (lane % 4);                  // + 8g, and +1

    const float* a_scale = reinterpret_cast<const float*>(p.a_scale_inv);
    const float* b_scale = reinterpret_cast<const float*>(p.b_scale_inv);
    // Spec 5 / the CPU reference: per-tensor scales multiply the whole sum once.
    const float factor = blocked ? p.alpha : __fmul_rn(__fmul_rn(p.alpha, a_scale[0]), b_scale[0]);
    const float* bias = reinterpret_cast<const float*>(p.bias);
    const float d_scale = p.d_scale != 0 ? *reinterpret_cast<const float*>(p.d_scale) : 1.0f;
    const bool pair_stores = p.n % 2 == 0;  // then every (row, even col) pair is 2-element aligned

    float acc[CHUNKS][FRAG];
    float part[SPLIT ? FRAG : 1];
    uint32_t amax = 0;
    uint32_t it = 0;
    for (uint32_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        uint32_t mb, nb;
        tile_coords(tile, m_blocks, n_blocks, p.group_m, mb, nb);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
            for (int i = 0; i < FRAG; ++i) acc[c][i] = 0.0f;

        for (uint32_t kb = 0; kb < p.k_blocks; ++kb, ++it) {
            const uint32_t s = it % G::STAGES;
            const uint32_t phase = (it / G::STAGES) & 1u;
            wgmma::mbar_wait(base + G::FULL_OFF + 8 * s, phase);
            const uint32_t a_tile = base + G::A_OFF + s * G::A_BYTES + cw * 64 * BLOCK_K;
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) {
                const uint32_t b_chunk = base + G::B_OFF + s * G::B_BYTES + c * CHUNK_N * BLOCK_K;
                if constexpr (SPLIT) {
                    mma_k_block<CHUNK_N, A_E5M2>(part, a_tile, b_chunk, false);
                    if (blocked) {
                        // Block scales apply at promotion: acc += partial * (sA[row] * sB[col]),
                        // each step rounded like the CPU reference (no fused multiply-add).
                        const float sa0 = sa[s * BLOCK_M + row_in_tile];
                        const float sa1 = sa[s * BLOCK_M + row_in_tile + 8];
#pragma unroll
                        for (int g = 0; g < FRAG / 4; ++g) {
                            const float2 sbv =
                                *reinterpret_cast<const float2*>(&sb[s * BLOCK_N + c * CHUNK_N + 8 * g + col_in_chunk]);
                            acc[c][4 * g + 0] =
                                __fadd_rn(acc[c][4 * g + 0], __fmul_rn(part[4 * g + 0], __fmul_rn(sa0, sbv.x)));
                            acc[c][4 * g + 1] =
                                __fadd_rn(acc[c][4 * g + 1], __fmul_rn(part[4 * g + 1], __fmul_rn(sa0, sbv.y)));
                            acc[c][4 * g + 2] =
                                __fadd_rn(acc[c][4 * g + 2], __fmul_rn(part[4 * g + 2], __fmul_rn(sa1, sbv.x)));
                            acc[c][4 * g + 3] =
                                __fadd_rn(acc[c][4 * g + 3], __fmul_rn(part[4 * g + 3], __fmul_rn(sa1, sbv.y)));
                        }
                    } else {
#pragma unroll
                        for (int i = 0; i < FRAG; ++i) acc[c][i] += part[i];
                    }
                } else {
                    mma_k_block<CHUNK_N, A_E5M2>(acc[c], a_tile, b_chunk, true);
                }
            }
            // This warp's wgmma reads of the stage are complete (wait_group 0): release it.
            __syncwarp();
            if (lane == 0) wgmma::mbar_arrive(base + G::EMPTY_OFF + 8 * s);
        }

        // Epilogue: v = acc * factor (+ bias) (+ beta * D_old), amax, cast, store.
        const uint32_t row0 = mb * BLOCK_M + row_in_tile;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
#pragma unroll
            for (int g = 0; g < FRAG / 4; ++g) {
                const uint32_t col = nb * BLOCK_N + c * CHUNK_N + 8 * g + col_in_chunk;
                if (col >= p.n) continue;
                const bool pair = pair_stores && col + 1 < p.n;
                const float b0 = bias ? bias[col] : 0.0f;
                const float b1 = (bias && col + 1 < p.n) ? bias[col + 1] : 0.0f;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t row = row0 + 8 * h;
                    if (row >= p.m) continue;
                    float v0 = __fmul_rn(acc[c][4 * g + 2 * h], factor);
                    float v1 = __fmul_rn(acc[c][4 * g + 2 * h + 1], factor);
                    if (bias) {
                        v0 = __fadd_rn(v0, b0);
                        v1 = __fadd_rn(v1, b1);
                    }
                    if (p.beta != 0.0f) {
                        const float* old = reinterpret_cast<const float*>(p.d) + (uint64_t)row * p.n + col;
                        v0 = __fadd_rn(v0, __fmul_rn(p.beta, old[0]));
                        if (col + 1 < p.n) v1 = __fadd_rn(v1, __fmul_rn(p.beta, old[1]));
                    }
                    amax = max(amax, abs_bits(v0));
                    if (col + 1 < p.n) amax = max(amax, abs_bits(v1));
                    if (pair) {
                        store_pair(p, row, col, v0, v1, d_scale, true);
                    } else {
                        store_pair(p, row, col, v0, 0.0f, d_scale, false);
                        if (col + 1 < p.n) store_pair(p, row, col + 1, v1, 0.0f, d_scale, false);
                    }
                }
            }
        }
    }
    return amax;
}

template <int BLOCK_N, bool A_E5M2, bool SPLIT, bool BOUNDED>
__device__ __forceinline__ void gemm(const Fp8WgmmaGemmParams& p) {
    using G = Geometry<BLOCK_N>;
    extern __shared__ uint8_t smem_raw[];
    // 128-byte swizzle atoms must start on 1024-byte boundaries: align the base up.
    const uint32_t raw = wgmma::smem_u32(smem_raw);
    const uint32_t base = (raw + FP8_WGMMA_SMEM_ALIGN - 1) & ~(FP8_WGMMA_SMEM_ALIGN - 1);
    uint8_t* smem = smem_raw + (base - raw);
    float* sa = reinterpret_cast<float*>(smem + G::SA_OFF);
    float* sb = reinterpret_cast<float*>(smem + G::SB_OFF);
    uint32_t* amax_slots = reinterpret_cast<uint32_t*>(smem + G::AMAX_OFF);

    const bool blocked = p.scale_mode != FP8_GEMM_SCALES_PER_TENSOR;
    const uint32_t m_blocks = (p.m + BLOCK_M - 1) / BLOCK_M;
    const uint32_t n_blocks = (p.n + BLOCK_N - 1) / BLOCK_N;
    const uint32_t tiles = m_blocks * n_blocks;
    const int wg = threadIdx.x / WG_THREADS;

    // The launcher computes the ring's size on the host; refuse to run on a short allocation.
    uint32_t dynamic_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_smem));
    if (dynamic_smem < (uint32_t)G::DYNAMIC_SMEM) {
        if (threadIdx.x == 0 && p.error_flag != 0) *reinterpret_cast<uint32_t*>(p.error_flag) = FP8_WGMMA_ERROR_SMEM;
        return;
    }

    if (threadIdx.x == 0) {
        wgmma::prefetch_tensormap(&p.map_a);
        wgmma::prefetch_tensormap(&p.map_b);
        // Full: the producer leader's expect_tx arrival, plus the other 127
        // producer threads when they stage block scales. Empty: one per consumer warp.
        for (int s = 0; s < G::STAGES; ++s) {
            wgmma::mbar_init(base + G::FULL_OFF + 8 * s, blocked ? WG_THREADS : 1);
            wgmma::mbar_init(base + G::EMPTY_OFF + 8 * s, CONSUMER_WARPS);
        }
        wgmma::fence_mbar_init();
    }
    __syncthreads();

    if (wg == 0) {
        wgmma::setmaxnreg_dec<PRODUCER_REGS>();
        // Per-tensor scales: only the leader has work; the others leave (no block-wide barrier follows).
        if (blocked || threadIdx.x == 0) produce<BLOCK_N, BOUNDED>(p, base, sa, sb, blocked, m_blocks, n_blocks, tiles);
        return;
    }
    wgmma::setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = wg - 1;
    uint32_t amax = consume<BLOCK_N, A_E5M2, SPLIT>(p, base, sa, sb, blocked, m_blocks, n_blocks, tiles, cw);

    // Output amax: warp max, then the CTA's 8 consumer warps, then one atomic per CTA.
    amax = __reduce_max_sync(0xFFFFFFFFu, amax);
    const int warp = (threadIdx.x - WG_THREADS) / 32;
    if ((threadIdx.x & 31) == 0) amax_slots[warp] = amax;
    wgmma::named_barrier(1, 2 * WG_THREADS);
    if (threadIdx.x == WG_THREADS && p.amax != 0) {
        uint32_t cta = 0;
        for (int w = 0; w < CONSUMER_WARPS; ++w) cta = max(cta, amax_slots[w]);
        fp8::atomic_max_nonneg(reinterpret_cast<float*>(p.amax), __uint_as_float(cta));
    }
}

}  // namespace
#endif  // WGMMA_SM90A

#if WGMMA_SM90A
#define FP8_WGMMA_BODY(BLOCK_N, A_E5M2, SPLIT, BOUNDED) gemm<BLOCK_N, A_E5M2, SPLIT, BOUNDED>(p)
#else
// Not sm_90a: no wgmma here. Say so through error_flag (the launcher checks the
// compute capability first, so this only runs if that check is bypassed).
#define FP8_WGMMA_BODY(BLOCK_N, A_E5M2, SPLIT, BOUNDED)                                          \
    do {                                                                                        \
        if (threadIdx.x == 0 && blockIdx.x == 0 && p.error_flag != 0)                           \
            *reinterpret_cast<uint32_t*>(p.error_flag) = FP8_GEMM_ERROR_ARCH;                   \
    } while (0)
#endif

// fp8_gemm_wgmma_n<BLOCK_N>_<A format>_<split|fast>[_bounded]: B is always E4M3;
// "split" promotes to f32 every 128 of K (required for block scales), "fast"
// keeps the whole sum in the tensor-core accumulator (per-tensor scales only);
// "_bounded" twins (tests and the self-check) give up on a wait after ~10 s.
#define FP8_WGMMA_KERNEL(NAME, BLOCK_N, A_E5M2, SPLIT, BOUNDED)                                         \
    extern "C" __global__ void __launch_bounds__(FP8_WGMMA_THREADS, 1)                                  \
        NAME(const __grid_constant__ Fp8WgmmaGemmParams p) {                                            \
        FP8_WGMMA_BODY(BLOCK_N, A_E5M2, SPLIT, BOUNDED);                                                \
    }
#define FP8_WGMMA_KERNELS(BOUNDED, SUFFIX)                                                             \
    FP8_WGMMA_KERNEL(fp8_gemm_wgmma_n128_e4m3_split##SUFFIX, 128, false, true, BOUNDED)                 \
    FP8_WGMMA_KERNEL(fp8_gemm_wgmma_n128_e5m2_split##SUFFIX, 128, true, true, BOUNDED)                  \
    FP8_WGMMA_KERNEL(fp8_gemm_wgmma_n256_e4m3_split##SUFFIX, 256, false, true, BOUNDED)                 \
    FP8_WGMMA_KERNEL(fp8_gemm_wgmma_n256_e5m2_split##SUFFIX, 256, true, true, BOUNDED)                  \
    FP8_WGMMA_KERNEL(fp8_gemm_wgmma_n128_e4m3_fast##SUFFIX, 128, false, false, BOUNDED)                 \
    FP8_WGMMA_KERNEL(fp8_gemm_wgmma_n128_e5m2_fast##SUFFIX, 128, true, false, BOUNDED)                  \
    FP8_WGMMA_KERNEL(fp8_gemm_wgmma_n256_e4m3_fast##SUFFIX, 256, false, false, BOUNDED)                 \
    FP8_WGMMA_KERNEL(fp8_gemm_wgmma_n256_e5m2_fast##SUFFIX, 256, true, false, BOUNDED)

FP8_WGMMA_KERNELS(false, )
FP8_WGMMA_KERNELS(true, _bounded)
