// Causal attention core on tensor cores (mma.sync m16n8k16, bf16 or f16
// operands, f32 accumulators), forward and backward, for sm_80 and newer; the
// fast twin of cuda/attention.cu, with the same rounding points (docs/numerics.md,
// Attention). Launchers: src/backend/cuda/attention_mma.rs, which picks these
// kernels only for compute dtypes bf16/fp16, head_dim a multiple of 16 up to
// 128, a device of compute capability 8.0 or newer, and after a per-device
// self-check against the simple kernels (opt-in: FP8_CUDA_ATTENTION_MMA=1).
// Older targets get a trapping body the launcher never picks.
//
// Layouts as in attention.cu: q/k/v/out/dout/dq/dk/dv are f32 [batch, seq,
// heads, head_dim] holding values already rounded to the dtype (so their
// 16-bit copies are exact), lse and delta f32 [batch, heads, seq]; row i
// attends to keys 0..=i. Every block has 4 warps (128 threads); each kernel
// exists for head_dim up to 64 (_d64) and up to 128 (_d128): a smaller
// head_dim is zero-padded to the variant's width in shared memory, which adds
// exact zeros to every dot product.
//
// Tiles go global f32 -> registers -> 16-bit shared memory rows of D elements
// (2D bytes), whose 16-byte chunks are XOR-swizzled by (row & 7), so the 8
// rows an ldmatrix reads hit 32 distinct banks. Rows past seq and columns past
// head_dim are zero-filled.
//
// Forward (grid: query tiles of 64 rows, heads, batch; warp w owns rows
// 16w..16w+15 of the tile, its Q fragments in registers): pass 1 walks the key
// tiles (64 keys) up to the diagonal with S = scale (Q K^T) and an online
// max/sum in f32, giving lse_i; pass 2 walks them again, recomputes S, forms
// P = round(exp(S - lse)) (rounded after normalisation, as the CPU twin
// does), and accumulates O += P V in f32. O is rounded to the dtype at the end.
// Shared: K and V tiles, 2 x 64 x D x 2 bytes (32 KiB at D = 128).
//
// Backward, two kernels in stream order (no atomics: every output row is
// written by one block, so results are deterministic):
// * dq (grid: query tiles of 64 rows): first delta_i = dO_i . O_i per row
//   (written to p.delta for the second kernel), Q and dO fragments in
//   registers, then over key tiles of 32 keys: S, dP = dO V^T, P = exp(S - lse),
//   dS = round(P == 0 ? 0 : P (dP - delta)), dQ += dS K; dQ = round(scale dQ).
//   Shared: K and V tiles, 2 x 32 x D x 2 bytes (16 KiB at D = 128).
// * dk/dv (grid: key tiles of 64 keys; warp w owns keys 16w..16w+15): K and V
//   stay in shared memory, the query tiles (32 rows of Q and dO) from the
//   diagonal on: S^T = K Q^T, dP^T = V dO^T, dV += round(P)^T dO, dK += dS^T Q;
//   dV = round(dV), dK = round(scale dK). Shared: (64 + 64 + 32 + 32) x D x 2
//   bytes (48 KiB at D = 128, the limit without an opt-in).
#include "ops_device.cuh"

using namespace fp8ops;

namespace attn_mma {
constexpr int NTHREADS = 128;  // 4 warps
}  // namespace attn_mma

// Everything below needs sm_80 (bf16 mma); older targets compile only the trapping kernels.
#if __CUDA_ARCH__ >= 800
namespace attn_mma {

constexpr int FWD_BQ = 64;     // forward: query rows per block (16 per warp)
constexpr int FWD_BK = 64;     // forward: keys per tile
constexpr int DQ_BQ = 64;      // dq: query rows per block
constexpr int DQ_BK = 32;      // dq: keys per tile
constexpr int KV_BK = 64;      // dk/dv: keys per block (16 per warp)
constexpr int KV_BQ = 32;      // dk/dv: query rows per tile

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Byte offset of element (row, col) in a tile of rows of D 16-bit values.
template <int D> __device__ __forceinline__ uint32_t swz(int row, int col) {
    static_assert(D == 64 || D == 128, "the swizzle needs at least 8 chunks per row");
    return (uint32_t)(row * (D * 2) + ((((col >> 3) ^ (row & 7))) << 4) + ((col & 7) << 1));
}

struct Bf16 {
    static constexpr uint32_t DTYPE = FP8_DTYPE_BF16;
    // Two values rounded to bf16 (nearest even, as round_to), the first in the low half.
    __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    }
    __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
};

struct F16 {
    static constexpr uint32_t DTYPE = FP8_DTYPE_F16;
    __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    }
    __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
};

// Four 8x8 16-bit matrices; lanes 8m..8m+7 give the row addresses of matrix m.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// ROWS rows of a [.., rs] f32 tensor from `src` (row 0 of the tile, column 0 of the head)
// into a 16-bit tile: rows >= rows_left and columns >= hd are zeros. Loads go out
// BATCH float4s per thread at a time, which bounds the registers they hold.
constexpr int BATCH = 4;
template <int D, int ROWS, class H>
__device__ __forceinline__ void load_tile(uint8_t* tile, const float* src, uint64_t rs, uint32_t rows_left,
                                          uint32_t hd) {
    constexpr int V4 = D / 4, PER = ROWS * V4 / NTHREADS;
    static_assert(ROWS * V4 % NTHREADS == 0 && PER % BATCH == 0, "whole batches of float4s per thread");
#pragma unroll 1
    for (int it0 = 0; it0 < PER; it0 += BATCH) {
        float4 x[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int idx = threadIdx.x + (it0 + u) * NTHREADS;
            const int r = idx / V4, c = (idx % V4) * 4;
            x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if ((uint32_t)r < rows_left && (uint32_t)c < hd)
                x[u] = __ldg(reinterpret_cast<const float4*>(src + (uint64_t)r * rs + c));
        }
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int idx = threadIdx.x + (it0 + u) * NTHREADS;
            const int r = idx / V4, c = (idx % V4) * 4;
            *reinterpret_cast<uint2*>(tile + swz<D>(r, c)) =
                make_uint2(H::pack(x[u].x, x[u].y), H::pack(x[u].z, x[u].w));
        }
    }
}

// A fragments (m16 x k16 per k-step) of the 16 rows row0.. of a tile, over all of D.
template <int D> __device__ __forceinline__ void load_a(uint32_t (&a)[D / 16][4], uint32_t tile, int row0, int lane) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) ldsm_x4(a[ks], tile + swz<D>(row0 + (lane & 15), ks * 16 + ((lane >> 4) << 3)));
}

// B fragments of keys n0..n0+15 (two n8 tiles) at k-step ks, from a [key][D] tile (B = tile^T).
template <int D> __device__ __forceinline__ void load_bt(uint32_t (&b)[4], uint32_t tile, int n0, int ks, int lane) {
    ldsm_x4(b, tile + swz<D>(n0 + (lane & 7) + ((lane >> 4) << 3), ks * 16 + (((lane >> 3) & 1) << 3)));
}

// c[NT][4] = A . tile^T: A from registers (16 rows x D), tile [NT * 8 rows][D] in shared memory.
template <int D, int NT, class H>
__device__ __forceinline__ void mma_abt(float (&c)[NT][4], const uint32_t (&a)[D / 16][4], uint32_t tile, int lane) {
#pragma unroll
    for (int n = 0; n < NT; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            uint32_t b[4];
            load_bt<D>(b, tile, np * 16, ks, lane);
            H::mma(c[2 * np], a[ks], b[0], b[1]);
            H::mma(c[2 * np + 1], a[ks], b[2], b[3]);
        }
    }
}

// acc[D/8][4] += A . tile: A (16 rows x 16 KK columns) in registers, tile [16 KK rows][D].
template <int D, int KK, class H>
__device__ __forceinline__ void mma_ab(float (&acc)[D / 8][4], const uint32_t (&a)[KK][4], uint32_t tile, int lane) {
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
            uint32_t b[4];
            ldsm_x4_t(b, tile + swz<D>(kk * 16 + (lane & 15), dn * 16 + ((lane >> 4) << 3)));
            H::mma(acc[2 * dn], a[kk], b[0], b[1]);
            H::mma(acc[2 * dn + 1], a[kk], b[2], b[3]);
        }
    }
}

// Accumulator fragments (16 x 8 NT, f32) rounded to 16-bit A fragments (16 x 16 per k-step).
template <int NT, class H>
__device__ __forceinline__ void to_a(uint32_t (&a)[NT / 2][4], const float (&c)[NT][4]) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        a[kk][0] = H::pack(c[2 * kk][0], c[2 * kk][1]);
        a[kk][1] = H::pack(c[2 * kk][2], c[2 * kk][3]);
        a[kk][2] = H::pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
        a[kk][3] = H::pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v = add(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
    return add(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

constexpr float NEG_INF = -__builtin_huge_valf();

// Stores a warp's 16 x D accumulator rows (row0.. of the tensor at `dst`), times `scale`
// when `scaled`, rounded to the dtype; rows >= seq and columns >= hd are skipped.
template <int D>
__device__ __forceinline__ void store_rows(float* dst, uint64_t rs, uint32_t row0, uint32_t seq, uint32_t hd,
                                           const float (&acc)[D / 8][4], bool scaled, float scale, uint32_t dtype,
                                           int lane) {
    const uint32_t g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const uint32_t row = row0 + g + 8 * half;
        if (row >= seq) continue;
        float* out = dst + (uint64_t)row * rs;
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn) {
            const uint32_t col = dn * 8 + 2 * t;
            if (col >= hd) continue;
            float v0 = acc[dn][2 * half], v1 = acc[dn][2 * half + 1];
            if (scaled) {
                v0 = mul(scale, v0);
                v1 = mul(scale, v1);
            }
            *reinterpret_cast<float2*>(out + col) = make_float2(round_to(v0, dtype), round_to(v1, dtype));
        }
    }
}

struct Head {
    uint64_t rs;    // heads * head_dim: elements between rows
    uint64_t base;  // element offset of (sequence b, row 0, head h)
    uint64_t stat;  // element offset of (b, h, row 0) in lse / delta
};

__device__ __forceinline__ Head head_of(const Fp8AttentionParams& p) {
    const uint64_t rs = (uint64_t)p.heads * p.head_dim;
    const uint64_t b = blockIdx.z, h = blockIdx.y;
    return Head{rs, b * p.seq * rs + h * p.head_dim, (b * p.heads + h) * p.seq};
}

template <int D, class H> __device__ __forceinline__ void forward(const Fp8AttentionParams& p) {
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int NT = FWD_BK / 8;
    uint8_t* k_tile = smem;
    uint8_t* v_tile = smem + FWD_BK * D * 2;
    const uint32_t sk = smem_addr(k_tile), sv = smem_addr(v_tile);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t g = lane >> 2, t = lane & 3;
    const uint32_t seq = p.seq, hd = p.head_dim;
    const Head hh = head_of(p);
    const float* q = reinterpret_cast<const float*>(p.q) + hh.base;
    const float* k = reinterpret_cast<const float*>(p.k) + hh.base;
    const float* v = reinterpret_cast<const float*>(p.v) + hh.base;
    // The longest rows first: the last query tile has the most key tiles.
    const uint32_t q0 = (gridDim.x - 1 - blockIdx.x) * FWD_BQ;
    const uint32_t key_tiles = (min(q0 + FWD_BQ, seq) - 1) / FWD_BK + 1;
    const uint32_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

    load_tile<D, FWD_BQ, H>(k_tile, q + (uint64_t)q0 * hh.rs, hh.rs, seq - q0, hd);
    __syncthreads();
    uint32_t qf[D / 16][4];
    load_a<D>(qf, sk, warp * 16, lane);
    __syncthreads();

    // Pass 1: lse_i = m_i + log(sum_j exp(S_ij - m_i)), online over the key tiles.
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    for (uint32_t kt = 0; kt < key_tiles; ++kt) {
        const uint32_t k0 = kt * FWD_BK;
        load_tile<D, FWD_BK, H>(k_tile, k + (uint64_t)k0 * hh.rs, hh.rs, seq - k0, hd);
        __syncthreads();
        float s[NT][4];
        mma_abt<D, NT, H>(s, qf, sk, lane);
        float tmax[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint32_t j = k0 + n * 8 + 2 * t + (e & 1);
                s[n][e] = j <= row[e >> 1] ? mul(p.scale, s[n][e]) : NEG_INF;
                tmax[e >> 1] = fmaxf(tmax[e >> 1], s[n][e]);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float mnew = fmaxf(m[r], quad_max(tmax[r]));
            // Rows with no key yet keep 0 (a -inf max would give inf - inf).
            const float base = mnew == NEG_INF ? 0.0f : mnew;
            l[r] = mul(l[r], expf(sub(m[r], base)));
            m[r] = mnew;
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float base = m[e >> 1] == NEG_INF ? 0.0f : m[e >> 1];
                l[e >> 1] = add(l[e >> 1], expf(sub(s[n][e], base)));
            }
        }
        __syncthreads();
    }
    float lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) lse[r] = add(m[r], logf(quad_sum(l[r])));

    // Pass 2: P = round(exp(S - lse)), O += P V.
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (uint32_t kt = 0; kt < key_tiles; ++kt) {
        const uint32_t k0 = kt * FWD_BK;
        load_tile<D, FWD_BK, H>(k_tile, k + (uint64_t)k0 * hh.rs, hh.rs, seq - k0, hd);
        load_tile<D, FWD_BK, H>(v_tile, v + (uint64_t)k0 * hh.rs, hh.rs, seq - k0, hd);
        __syncthreads();
        float s[NT][4];
        mma_abt<D, NT, H>(s, qf, sk, lane);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint32_t j = k0 + n * 8 + 2 * t + (e & 1);
                s[n][e] = j <= row[e >> 1] ? expf(sub(mul(p.scale, s[n][e]), lse[e >> 1])) : 0.0f;
            }
        }
        uint32_t pa[NT / 2][4];
        to_a<NT, H>(pa, s);
        mma_ab<D, NT / 2, H>(o, pa, sv, lane);
        __syncthreads();
    }
    store_rows<D>(reinterpret_cast<float*>(p.out) + hh.base, hh.rs, q0 + warp * 16, seq, hd, o, false, 1.0f, H::DTYPE,
                  lane);
    if (t == 0) {
        float* l_out = reinterpret_cast<float*>(p.lse) + hh.stat;
#pragma unroll
        for (int r = 0; r < 2; ++r)
            if (row[r] < seq) l_out[row[r]] = lse[r];
    }
}

template <int D, class H> __device__ __forceinline__ void backward_dq(const Fp8AttentionParams& p) {
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int NT = DQ_BK / 8;
    static_assert(2 * DQ_BK == DQ_BQ, "the K and V tiles together stage one Q or dO tile");
    uint8_t* k_tile = smem;
    uint8_t* v_tile = smem + DQ_BK * D * 2;
    const uint32_t sk = smem_addr(k_tile), sv = smem_addr(v_tile);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t g = lane >> 2, t = lane & 3;
    const uint32_t seq = p.seq, hd = p.head_dim;
    const Head hh = head_of(p);
    const float* q = reinterpret_cast<const float*>(p.q) + hh.base;
    const float* k = reinterpret_cast<const float*>(p.k) + hh.base;
    const float* v = reinterpret_cast<const float*>(p.v) + hh.base;
    const float* dout = reinterpret_cast<const float*>(p.dout) + hh.base;
    const float* out = reinterpret_cast<const float*>(p.out) + hh.base;
    const uint32_t q0 = (gridDim.x - 1 - blockIdx.x) * DQ_BQ;
    const uint32_t last = min(q0 + DQ_BQ, seq) - 1;
    const uint32_t key_tiles = last / DQ_BK + 1;
    const uint32_t warp_row0 = q0 + warp * 16;
    const uint32_t row[2] = {warp_row0 + g, warp_row0 + g + 8};

    // delta_i = dO_i . O_i for the warp's 16 rows, also written for the dk/dv kernel.
    float delta[2] = {0.0f, 0.0f};
    float* delta_out = reinterpret_cast<float*>(p.delta) + hh.stat;
#pragma unroll 1
    for (uint32_t r = 0; r < 16; ++r) {
        const uint32_t i = warp_row0 + r;
        if (i >= seq) break;  // warp-uniform
        float part = 0.0f;
        for (uint32_t c = 4 * lane; c < hd; c += 128) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(dout + (uint64_t)i * hh.rs + c));
            const float4 b = __ldg(reinterpret_cast<const float4*>(out + (uint64_t)i * hh.rs + c));
            part = add(part, mul(a.x, b.x));
            part = add(part, mul(a.y, b.y));
            part = add(part, mul(a.z, b.z));
            part = add(part, mul(a.w, b.w));
        }
        const float d = warp_sum(part);
        if (r == g) delta[0] = d;
        if (r == g + 8) delta[1] = d;
        if (lane == 0) delta_out[i] = d;
    }
    float lse[2];
    const float* lse_in = reinterpret_cast<const float*>(p.lse) + hh.stat;
#pragma unroll
    for (int r = 0; r < 2; ++r) lse[r] = row[r] < seq ? lse_in[row[r]] : 0.0f;

    uint32_t qf[D / 16][4], of[D / 16][4];
    load_tile<D, DQ_BQ, H>(k_tile, q + (uint64_t)q0 * hh.rs, hh.rs, seq - q0, hd);
    __syncthreads();
    load_a<D>(qf, sk, warp * 16, lane);
    __syncthreads();
    load_tile<D, DQ_BQ, H>(k_tile, dout + (uint64_t)q0 * hh.rs, hh.rs, seq - q0, hd);
    __syncthreads();
    load_a<D>(of, sk, warp * 16, lane);
    __syncthreads();

    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (uint32_t kt = 0; kt < key_tiles; ++kt) {
        const uint32_t k0 = kt * DQ_BK;
        load_tile<D, DQ_BK, H>(k_tile, k + (uint64_t)k0 * hh.rs, hh.rs, seq - k0, hd);
        load_tile<D, DQ_BK, H>(v_tile, v + (uint64_t)k0 * hh.rs, hh.rs, seq - k0, hd);
        __syncthreads();
        // A warp whose rows all precede the tile's keys adds only zeros: skip it.
        if (k0 <= warp_row0 + 15) {
            float s[NT][4], dp[NT][4];
            mma_abt<D, NT, H>(s, qf, sk, lane);
            mma_abt<D, NT, H>(dp, of, sv, lane);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const uint32_t j = k0 + n * 8 + 2 * t + (e & 1);
                    const float pr = j <= row[e >> 1] ? expf(sub(mul(p.scale, s[n][e]), lse[e >> 1])) : 0.0f;
                    s[n][e] = pr == 0.0f ? 0.0f : mul(pr, sub(dp[n][e], delta[e >> 1]));
                }
            }
            uint32_t da[NT / 2][4];
            to_a<NT, H>(da, s);
            mma_ab<D, NT / 2, H>(acc, da, sk, lane);
        }
        __syncthreads();
    }
    store_rows<D>(reinterpret_cast<float*>(p.dq) + hh.base, hh.rs, warp_row0, seq, hd, acc, true, p.scale, H::DTYPE,
                  lane);
}

template <int D, class H> __device__ __forceinline__ void backward_dkdv(const Fp8AttentionParams& p) {
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int NT = KV_BQ / 8;
    uint8_t* k_tile = smem;
    uint8_t* v_tile = k_tile + KV_BK * D * 2;
    uint8_t* q_tile = v_tile + KV_BK * D * 2;
    uint8_t* o_tile = q_tile + KV_BQ * D * 2;  // dO
    const uint32_t sk = smem_addr(k_tile), sv = smem_addr(v_tile), sq = smem_addr(q_tile), so = smem_addr(o_tile);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t g = lane >> 2, t = lane & 3;
    const uint32_t seq = p.seq, hd = p.head_dim;
    const Head hh = head_of(p);
    const float* q = reinterpret_cast<const float*>(p.q) + hh.base;
    const float* k = reinterpret_cast<const float*>(p.k) + hh.base;
    const float* v = reinterpret_cast<const float*>(p.v) + hh.base;
    const float* dout = reinterpret_cast<const float*>(p.dout) + hh.base;
    const float* lse_in = reinterpret_cast<const float*>(p.lse) + hh.stat;
    const float* delta_in = reinterpret_cast<const float*>(p.delta) + hh.stat;
    // The first key tiles have the most query rows: blockIdx.x 0 first.
    const uint32_t k0 = blockIdx.x * KV_BK;
    const uint32_t warp_key0 = k0 + warp * 16;
    const uint32_t key[2] = {warp_key0 + g, warp_key0 + g + 8};
    const uint32_t query_tiles = (seq + KV_BQ - 1) / KV_BQ;

    load_tile<D, KV_BK, H>(k_tile, k + (uint64_t)k0 * hh.rs, hh.rs, seq - k0, hd);
    load_tile<D, KV_BK, H>(v_tile, v + (uint64_t)k0 * hh.rs, hh.rs, seq - k0, hd);
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
        dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
    }
    for (uint32_t qt = k0 / KV_BQ; qt < query_tiles; ++qt) {
        const uint32_t q0 = qt * KV_BQ;
        load_tile<D, KV_BQ, H>(q_tile, q + (uint64_t)q0 * hh.rs, hh.rs, seq - q0, hd);
        load_tile<D, KV_BQ, H>(o_tile, dout + (uint64_t)q0 * hh.rs, hh.rs, seq - q0, hd);
        __syncthreads();
        // A warp whose keys all follow the tile's queries adds only zeros: skip it.
        if (warp_key0 <= q0 + KV_BQ - 1) {
            float s[NT][4], dp[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
                dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
            }
            // S^T = K Q^T and dP^T = V dO^T, A fragments straight from shared memory.
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks) {
                uint32_t ka[4], va[4];
                ldsm_x4(ka, sk + swz<D>(warp * 16 + (lane & 15), ks * 16 + ((lane >> 4) << 3)));
                ldsm_x4(va, sv + swz<D>(warp * 16 + (lane & 15), ks * 16 + ((lane >> 4) << 3)));
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    uint32_t b[4];
                    load_bt<D>(b, sq, np * 16, ks, lane);
                    H::mma(s[2 * np], ka, b[0], b[1]);
                    H::mma(s[2 * np + 1], ka, b[2], b[3]);
                    load_bt<D>(b, so, np * 16, ks, lane);
                    H::mma(dp[2 * np], va, b[0], b[1]);
                    H::mma(dp[2 * np + 1], va, b[2], b[3]);
                }
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const uint32_t i = q0 + n * 8 + 2 * t + c;
                    const bool in = i < seq;
                    const float lse_i = in ? __ldg(lse_in + i) : 0.0f;
                    const float delta_i = in ? __ldg(delta_in + i) : 0.0f;
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const int e = 2 * r + c;
                        const float pr = in && key[r] <= i ? expf(sub(mul(p.scale, s[n][e]), lse_i)) : 0.0f;
                        s[n][e] = pr;
                        dp[n][e] = pr == 0.0f ? 0.0f : mul(pr, sub(dp[n][e], delta_i));
                    }
                }
            }
            uint32_t a[NT / 2][4];
            to_a<NT, H>(a, s);  // round(P)^T
            mma_ab<D, NT / 2, H>(dv, a, so, lane);
            to_a<NT, H>(a, dp);  // dS^T, rounded
            mma_ab<D, NT / 2, H>(dk, a, sq, lane);
        }
        __syncthreads();
    }
    store_rows<D>(reinterpret_cast<float*>(p.dv) + hh.base, hh.rs, warp_key0, seq, hd, dv, false, 1.0f, H::DTYPE,
                  lane);
    store_rows<D>(reinterpret_cast<float*>(p.dk) + hh.base, hh.rs, warp_key0, seq, hd, dk, true, p.scale, H::DTYPE,
                  lane);
}

}  // namespace attn_mma
#endif  // __CUDA_ARCH__ >= 800

// The kernels: the tensor-core bodies on sm_80 and newer, a trap below (never launched there).
#if __CUDA_ARCH__ >= 800
#define FP8_ATTN_MMA_KERNEL(NAME, FN, D, H)                                                           \
    extern "C" __global__ void __launch_bounds__(attn_mma::NTHREADS) NAME(const Fp8AttentionParams p) { \
        attn_mma::FN<D, attn_mma::H>(p);                                                               \
    }
#else
#define FP8_ATTN_MMA_KERNEL(NAME, FN, D, H)                                                           \
    extern "C" __global__ void __launch_bounds__(attn_mma::NTHREADS) NAME(const Fp8AttentionParams p) { \
        (void)p;                                                                                       \
        __trap();                                                                                      \
    }
#endif

FP8_ATTN_MMA_KERNEL(fp8_attention_mma_forward_bf16_d64, forward, 64, Bf16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_forward_bf16_d128, forward, 128, Bf16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_forward_f16_d64, forward, 64, F16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_forward_f16_d128, forward, 128, F16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_backward_dq_bf16_d64, backward_dq, 64, Bf16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_backward_dq_bf16_d128, backward_dq, 128, Bf16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_backward_dq_f16_d64, backward_dq, 64, F16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_backward_dq_f16_d128, backward_dq, 128, F16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_backward_dkdv_bf16_d64, backward_dkdv, 64, Bf16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_backward_dkdv_bf16_d128, backward_dkdv, 128, Bf16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_backward_dkdv_f16_d64, backward_dkdv, 64, F16)
FP8_ATTN_MMA_KERNEL(fp8_attention_mma_backward_dkdv_f16_d128, backward_dkdv, 128, F16)
