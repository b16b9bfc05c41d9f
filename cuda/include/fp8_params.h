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

#endif /* FP8_PARAMS_H */
