/* Kernel parameter structs shared by the CUDA kernels and the Rust launchers.
 *
 * This header is the single source of truth: src/backend/cuda/params.rs is
 * generated from it by tools/gen-bindings (bindgen) and CI regenerates and
 * diffs it, so the two sides cannot drift. Every struct is passed by value as
 * the only kernel argument. Device pointers are plain 64-bit integers
 * (CUdeviceptr); 0 means "not wanted" where a field says so.
 * Only fixed-width types, so the layout is the same on host and device. */
#ifndef FP8_PARAMS_H
#define FP8_PARAMS_H

#include <stdint.h>

/* Fp8FormatCode: the data format of a kernel's FP8 side. */
#define FP8_FORMAT_E4M3 0u
#define FP8_FORMAT_E5M2 1u

/* Fp8DequantScales: where dequantize finds each element's scale_inv. */
#define FP8_SCALES_PER_TENSOR 0u /* one f32 at scale_inv */
#define FP8_SCALES_F32_GRID 1u   /* f32 grid [ceil(rows/block_rows), ceil(cols/block_cols)] */
#define FP8_SCALES_E8M0_GRID 2u  /* E8M0 u8 grid, same shape */

/* Fp8AmaxAlgo: how the delayed-scaling update reduces the history. */
#define FP8_AMAX_ALGO_MAX 0u
#define FP8_AMAX_ALGO_MOST_RECENT 1u

/* Per-tensor cast (+ optional transpose) with a fused amax:
 * q = cast_sat(x * scale), both copies from one read of x. */
typedef struct Fp8CastParams {
    uint64_t src;            /* [rows, cols] f32/bf16/f16 (the kernel's type) */
    uint64_t dst_rowwise;    /* [rows, cols] codes */
    uint64_t dst_columnwise; /* [cols, rows] codes, 0 for none */
    uint64_t scale;          /* device f32: the scale to multiply by */
    uint64_t scale_inv_out;  /* device f32: receives 1/scale (0 for none) */
    uint64_t amax;           /* device f32, atomically fmaxf-ed with max|x| (0 for none) */
    uint64_t rows;
    uint64_t cols;
    uint32_t format; /* FP8_FORMAT_* */
    uint32_t pad0;
} Fp8CastParams;

/* Block quantizer with f32 scales (1x128, 128x128) or E8M0 scales (MXFP8). */
typedef struct Fp8BlockParams {
    uint64_t src;                /* [rows, cols] */
    uint64_t dst_rowwise;        /* [rows, cols] codes, 0 for none */
    uint64_t scales_rowwise;     /* f32 scale_inv or E8M0 codes of the row-wise copy */
    uint64_t dst_columnwise;     /* [cols, rows] codes, 0 for none */
    uint64_t scales_columnwise;  /* scales of the column-wise copy */
    uint64_t rows;
    uint64_t cols;
    uint32_t format;        /* FP8_FORMAT_* */
    uint32_t power_2_scale; /* 1: floor f32 scales to powers of two */
    float amax_epsilon;     /* lower bound on a block's amax (f32 scales only) */
    uint32_t pad0;
} Fp8BlockParams;

/* FP8 codes back to high precision: f32(q) * scale_inv of the element's block. */
typedef struct Fp8DequantParams {
    uint64_t src;       /* [rows, cols] codes */
    uint64_t dst;       /* [rows, cols] f32/bf16/f16 */
    uint64_t scale_inv; /* see scale_kind */
    uint64_t rows;
    uint64_t cols;
    uint32_t block_rows;
    uint32_t block_cols;
    uint32_t scale_kind; /* FP8_SCALES_* */
    uint32_t format;     /* FP8_FORMAT_* */
} Fp8DequantParams;

/* Delayed-scaling update of every slot of a step in one launch (spec 4.1). */
typedef struct Fp8DelayedUpdateParams {
    uint64_t history;    /* f32 [slots, history_len], history[s][0] = the step's amax */
    uint64_t scale;      /* f32 [slots], updated in place */
    uint64_t scaled_max; /* f32 [slots]: fp8_max * 2^-margin of each slot's format */
    uint32_t slots;
    uint32_t history_len;
    uint32_t algo; /* FP8_AMAX_ALGO_* */
    uint32_t pad0;
} Fp8DelayedUpdateParams;

/* max|x| of a tensor, atomically fmaxf-ed into *amax. */
typedef struct Fp8AmaxParams {
    uint64_t src;
    uint64_t len;
    uint64_t amax;
} Fp8AmaxParams;

/* FP8 statistics counted on the device: counts[0..4] += [saturated, underflow, nonzero,
   nonfinite] of an f32 tensor. With codes (a per-tensor cast): saturated when |x| > limit,
   flushed when the code's magnitude bits are 0; without (a value kept in high precision):
   the scaled magnitude |x * scale| decides, > max or <= half_min. A scale computed on the
   device (current scaling) is read at scale_at: with codes, limit = max * (1 / scale). Codes
   of a block-scaled copy (scale_kind not FP8_SCALES_PER_TENSOR) are judged by their block's
   scale_inv in the grid at block_scales: limit = max * scale_inv. */
typedef struct Fp8StatsParams {
    uint64_t src;    /* f32 [len] */
    uint64_t codes;  /* u8 [len] or 0 */
    uint64_t counts; /* u32 [4], added to */
    uint64_t len;
    float limit;     /* with codes: max_finite * scale_inv */
    float scale;     /* without codes */
    float max;       /* max_finite */
    float half_min;  /* without codes: half the smallest subnormal */
    uint64_t scale_at; /* device f32 scale replacing limit and scale, or 0 */
    uint64_t block_scales; /* with codes: the copy's scale_inv grid, see scale_kind */
    uint64_t cols;         /* columns of the copy (block scales) */
    uint32_t block_rows;
    uint32_t block_cols;
    uint32_t scale_kind; /* FP8_SCALES_*: PER_TENSOR uses limit / scale_at */
    uint32_t pad0;
} Fp8StatsParams;

/* A block cast's largest scale, 1 / min(scale_inv) over its grid (NaN dropped; 1 / inf = 0
   when none is left), found on the device in two launches: fp8_scale_inv_min max-es every
   scale_inv's key into *key (u32, zeroed: the complement of an order-preserving key, so the
   largest key is the smallest value), then fp8_largest_scale (one thread) writes *scale. */
typedef struct Fp8LargestScaleParams {
    uint64_t scale_inv; /* f32 [len], or E8M0 codes u8 [len] with e8m0 */
    uint64_t len;
    uint64_t key;   /* u32 */
    uint64_t scale; /* f32, receives the scale */
    uint32_t e8m0;
    uint32_t pad0;
} Fp8LargestScaleParams;

/* Current scaling's scale of an amax on the device (spec 4.2, ScaleRule::scale). */
typedef struct Fp8CurrentScaleParams {
    uint64_t amax;  /* device f32 */
    uint64_t scale; /* device f32, receives the scale */
    uint32_t format; /* FP8_FORMAT_* */
    uint32_t power_2_scale;
    float amax_epsilon;
    uint32_t pad0;
} Fp8CurrentScaleParams;

/* Fp8GemmScales: how the GEMM applies its inputs' scale_inv (spec 5). */
#define FP8_GEMM_SCALES_NONE 0u                 /* plain bf16/f16 inputs */
#define FP8_GEMM_SCALES_PER_TENSOR 1u           /* one f32 each at a_scale_inv, b_scale_inv */
#define FP8_GEMM_SCALES_1X128_BY_128X128 2u     /* A [m, k_blocks], B [ceil(n/128), k_blocks] */
#define FP8_GEMM_SCALES_1X128_BY_1X128 3u       /* A [m, k_blocks], B [n, k_blocks] */
#define FP8_GEMM_SCALES_MXFP8 4u                /* E8M0 u8: A [m, k_blocks], B [n, k_blocks], blocks of 32 */

/* Fp8GemmOut: the dtype of the GEMM's output D. */
#define FP8_GEMM_OUT_F32 0u
#define FP8_GEMM_OUT_BF16 1u
#define FP8_GEMM_OUT_F16 2u
#define FP8_GEMM_OUT_E4M3 3u
#define FP8_GEMM_OUT_E5M2 4u

/* Fp8GemmError: what a GEMM kernel writes to error_flag when it cannot run. */
#define FP8_GEMM_ERROR_ARCH 1u /* the variant does not exist on this GPU's architecture */

/* D = alpha * (A . B^T) * sA * sB (+ bias) (+ beta * D), A [m, k] and B [n, k]
 * K-major, D [m, n] row-major; the kernel name carries the input dtypes. */
typedef struct Fp8GemmParams {
    uint64_t a;           /* [m, k] FP8 codes or bf16/f16, rows 16-byte aligned */
    uint64_t b;           /* [n, k] likewise */
    uint64_t a_scale_inv; /* f32, see scale_mode (0 for FP8_GEMM_SCALES_NONE) */
    uint64_t b_scale_inv; /* f32, see scale_mode */
    uint64_t bias;        /* f32 [n], added after alpha; 0 for none */
    uint64_t d;           /* [m, n] of out_dtype; read too when beta != 0 (f32 only) */
    uint64_t d_scale;     /* device f32 output scale for an FP8 output, else 0 */
    uint64_t amax;        /* device f32 max-ed with max|D| before the output cast (NaN sticks); 0 for none */
    uint64_t error_flag;  /* device u32 receiving FP8_GEMM_ERROR_*; 0 for none */
    uint32_t m;
    uint32_t n;
    uint32_t k;
    uint32_t k_blocks;   /* ceil(k / 128), MXFP8 ceil(k / 32): the row length of the block-scale grids */
    float alpha;
    float beta;          /* 0 ignores the old D entirely (even NaN) */
    uint32_t scale_mode; /* FP8_GEMM_SCALES_* */
    uint32_t out_dtype;  /* FP8_GEMM_OUT_* */
    uint32_t split_accumulator; /* 1: promote the tensor-core sum to f32 every 128 of K */
    uint32_t pad0;
} Fp8GemmParams;

/* Hopper (sm_90a) warp-specialized wgmma GEMM: geometry shared by the kernel
 * and the launcher (the dynamic shared memory size is computed from these). */
#define FP8_WGMMA_THREADS 384u    /* 1 producer + 2 consumer warpgroups */
#define FP8_WGMMA_BLOCK_M 128u    /* 64 rows per consumer warpgroup */
#define FP8_WGMMA_BLOCK_K 128u    /* FP8 elements = bytes: one 128-byte swizzle row */
#define FP8_WGMMA_STAGES_N128 6u  /* ring depth with BLOCK_N = 128 (32 KiB per stage) */
#define FP8_WGMMA_STAGES_N256 4u  /* ring depth with BLOCK_N = 256 (48 KiB per stage) */
#define FP8_WGMMA_SMEM_ALIGN 1024u /* 128-byte swizzle atoms are 8 rows = 1024 bytes */
#define FP8_WGMMA_ERROR_SMEM 2u    /* error_flag: launched with less dynamic shared memory than the ring needs */
#define FP8_WGMMA_ERROR_HANG 3u    /* error_flag low byte: a _bounded variant's mbarrier wait timed out, then trapped */
#define FP8_WGMMA_HANG_STAGE_SHIFT 8u   /* error_flag bits 8..15 of a hang: the ring stage waited on */
#define FP8_WGMMA_HANG_PARITY_SHIFT 16u /* bit 16: the phase parity waited for */
#define FP8_WGMMA_HANG_ROLE_SHIFT 20u   /* bits 20..21: 0 producer waiting for a free stage, 1 its final drain */

/* An opaque CUtensorMap (cuTensorMapEncodeTiled output): 128 bytes, aligned
 * as CUDA 13 declares it (the hardware needs 64). */
typedef struct __attribute__((aligned(128))) Fp8TensorMap {
    uint64_t opaque[16];
} Fp8TensorMap;

/* D = alpha * (A . B^T) * sA * sB (+ bias) (+ beta * D) on sm_90a with FP8
 * inputs. Passed as one __grid_constant__ parameter so the kernel can give
 * TMA the address of its tensor maps. The kernel name carries BLOCK_N, the
 * A format (B is E4M3) and whether the sum is promoted every 128 of K. */
typedef struct Fp8WgmmaGemmParams {
    Fp8TensorMap map_a;  /* A [m, k] codes: box 128 x 128 bytes, 128-byte swizzle, zero fill */
    Fp8TensorMap map_b;  /* B [n, k] codes: box BLOCK_N x 128 bytes, likewise */
    uint64_t a_scale_inv; /* f32, see scale_mode */
    uint64_t b_scale_inv; /* f32, see scale_mode */
    uint64_t bias;        /* f32 [n], added after alpha; 0 for none */
    uint64_t d;           /* [m, n] of out_dtype, row-major; read too when beta != 0 (f32 only) */
    uint64_t d_scale;     /* device f32 output scale for an FP8 output, else 0 */
    uint64_t amax;        /* device f32 max-ed with max|D| before the output cast (NaN sticks); 0 for none */
    uint64_t error_flag;  /* device u32 receiving FP8_GEMM_ERROR_*; 0 for none */
    uint32_t m;
    uint32_t n;
    uint32_t k;
    uint32_t k_blocks; /* ceil(k / 128): the row length of the block-scale grids */
    float alpha;
    float beta;          /* 0 ignores the old D entirely (even NaN) */
    uint32_t scale_mode; /* FP8_GEMM_SCALES_PER_TENSOR or a block mode (block modes need the split variant) */
    uint32_t out_dtype;  /* FP8_GEMM_OUT_* */
    uint32_t group_m;    /* tile rasterization: m-blocks per group (>= 1), see hopper/scheduler.rs */
    uint32_t pad0;
} Fp8WgmmaGemmParams;

/* The layer ops' parameters (a header of their own). */
#include "fp8_ops_params.h"

#endif /* FP8_PARAMS_H */
