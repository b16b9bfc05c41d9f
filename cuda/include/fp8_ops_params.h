/* Kernel parameter structs of the layer ops (cuda/convert.cu, norm.cu,
 * activation.cu, embedding.cu, loss.cu, optim.cu, attention.cu, rope.cu,
 * attention_cached.cu), included by
 * fp8_params.h so tools/gen-bindings generates their Rust side with the rest.
 * Every tensor is a device address (0: none); f32 unless a field says otherwise. */
#ifndef FP8_OPS_PARAMS_H
#define FP8_OPS_PARAMS_H

#include <stdint.h>

/* Fp8Dtype: a compute dtype values are rounded to (round to nearest even). */
#define FP8_DTYPE_F32 0u
#define FP8_DTYPE_BF16 1u
#define FP8_DTYPE_F16 2u

/* Threads per block of the layer-op kernels; row kernels run one block per row. */
#define FP8_OPS_THREADS 256u
/* Elements per block of the two-stage sum of squares (first stage). */
#define FP8_SUMSQ_PER_BLOCK 8192u
/* Elements of one AdamW work item at most (one block each). */
#define FP8_ADAMW_ITEM 4096u

/* Elementwise ops and simple reductions over row-major [rows, cols] tensors:
 * convert (a -> out in the kernel's dtype, transposed or not), residual add
 * (a + b rounded to dtype), column sum (out[c] += sum of a[:, c]), GELU and
 * SwiGLU (a = x or dy, b = x), unscale (a *= scalar, flag), sum of squares
 * (f64 partials), argmax (u32 out per row). */
typedef struct Fp8EltwiseParams {
    uint64_t a;
    uint64_t b;
    uint64_t out;
    uint64_t flag; /* device u32: unscale sets it to 1 when a result is not finite */
    uint64_t rows;
    uint64_t cols;
    float scalar;   /* unscale: the factor */
    uint32_t dtype; /* FP8_DTYPE_*: rounding of the result where the op rounds */
} Fp8EltwiseParams;

/* Inverted dropout with a counter-based mask (twin: ops::dropout): element i's
 * multiplier is 0 when the top 53 bits of SplitMix64 output i of the stream
 * `state`, as a fraction of 2^53, are below p, else keep. dropout: out = x * m;
 * dropout_add: out = out + x * m; each result rounded to dtype. */
typedef struct Fp8DropoutParams {
    uint64_t x;     /* [n] input (dropout_add: the gradient to add) */
    uint64_t out;   /* [n] */
    uint64_t n;
    uint64_t state; /* SplitMix64 stream of this forward */
    double p;       /* drop probability */
    float keep;     /* 1 / (1 - p), rounded once */
    uint32_t dtype; /* FP8_DTYPE_*: rounding of the results */
} Fp8DropoutParams;

/* A column range copied between two row-major matrices of the same rows:
 * out[r * out_cols + out_first + c] = a[r * a_cols + a_first + c] for c < width
 * (the attention's split of the fused QKV projection into Q, K, V, and the join
 * of their gradients). */
typedef struct Fp8CopyColumnsParams {
    uint64_t a;
    uint64_t out;
    uint64_t rows;
    uint64_t width;
    uint64_t a_cols;
    uint64_t a_first;
    uint64_t out_cols;
    uint64_t out_first;
} Fp8CopyColumnsParams;

/* LayerNorm / RMSNorm forward and backward, one block per row; the backward's
 * dgamma/dbeta go through per-row-block partials reduced in a fixed order. */
typedef struct Fp8NormParams {
    uint64_t x;        /* [rows, cols] */
    uint64_t gamma;    /* [cols] */
    uint64_t beta;     /* [cols], LayerNorm only */
    uint64_t y;        /* [rows, cols] forward output (0: only the FP8 copy) */
    uint64_t mean;     /* [rows] saved mean, LayerNorm only */
    uint64_t rstd;     /* [rows] saved 1/sqrt(var + eps) */
    uint64_t dy;       /* [rows, cols] */
    uint64_t dx;       /* [rows, cols], overwritten */
    uint64_t partials; /* [ceil(rows / rows_per_block), 2 * cols]: dgamma then dbeta partials of each row block */
    uint64_t dgamma;   /* [cols], accumulated */
    uint64_t dbeta;    /* [cols], accumulated, LayerNorm only */
    uint64_t y_fp8;    /* [rows, cols] codes cast_sat(y * scale) (0: none) */
    uint64_t scale;    /* device f32 scale of the FP8 copy */
    uint64_t amax;     /* device f32 fmaxf-ed with max|y| (0: none) */
    uint64_t rows;
    uint64_t cols;
    float eps;
    uint32_t zero_centered; /* 1: the weight is 1 + gamma */
    uint32_t format;        /* FP8_FORMAT_* of y_fp8 */
    uint32_t rows_per_block; /* backward: rows of one dgamma/dbeta partial (the CPU twin's blocking) */
} Fp8NormParams;

/* Embedding gather (out[i] = table[ids[i]]) and the deterministic scatter-add:
 * the host groups token positions by id (stable), one block per distinct id
 * adds its tokens' rows in position order: dtable[id] += dout[t] for t ascending. */
typedef struct Fp8EmbeddingParams {
    uint64_t ids;       /* u32 [tokens] (gather) */
    uint64_t order;     /* u32 [tokens]: positions grouped by id, ascending within a group (scatter) */
    uint64_t starts;    /* u32 [groups + 1]: group g is order[starts[g] .. starts[g + 1]] */
    uint64_t group_ids; /* u32 [groups]: the id of each group */
    uint64_t src;       /* table [vocab, dim] (gather) or dout [tokens, dim] (scatter) */
    uint64_t dst;       /* out [tokens, dim] (gather) or dtable [vocab, dim] (scatter) */
    uint64_t tokens;
    uint64_t dim;
    uint64_t groups;
} Fp8EmbeddingParams;

/* Softmax cross-entropy, one block per row; the loss is reduced in the CPU
 * twin's order: partial sums of rows_per_block rows, then the partials in order. */
typedef struct Fp8CrossEntropyParams {
    uint64_t logits;   /* [rows, vocab] */
    uint64_t targets;  /* u32 [rows], checked by the host */
    uint64_t lse;      /* [rows]: written by the forward, read by the backward */
    uint64_t row_loss; /* [rows]: lse - logit of the target, 0 for ignored rows */
    uint64_t loss;     /* device f32: the mean over counted rows */
    uint64_t dlogits;  /* [rows, vocab], overwritten */
    uint64_t rows;
    uint64_t vocab;
    uint32_t ignore; /* target that does not count */
    uint32_t count;  /* rows whose target is not ignore */
    float grad;      /* dloss / max(count, 1) */
    uint32_t rows_per_block; /* rows of one partial loss sum (the CPU twin's blocking) */
} Fp8CrossEntropyParams;

/* One AdamW work item: up to FP8_ADAMW_ITEM elements of one parameter (an
 * array of them is a kernel argument; named *Params so the bindings include it). */
typedef struct Fp8AdamWItemParams {
    uint64_t offset;  /* first element in the arenas */
    uint32_t len;     /* elements */
    uint32_t decayed; /* 1: weight decay applies to this parameter */
} Fp8AdamWItemParams;

/* AdamW over every parameter in one launch (one block per work item): value,
 * grad, m and v are the arenas, all f32 and laid out alike. */
typedef struct Fp8AdamWParams {
    uint64_t value;
    uint64_t grad;
    uint64_t m;
    uint64_t v;
    uint64_t items; /* Fp8AdamWItemParams [n_items] */
    uint64_t n_items;
    float decay; /* 1 - lr * weight_decay, for decayed items; the others use 1 */
    float step_size;
    float bc2_sqrt;
    float beta1;
    float beta2;
    float c1;
    float c2;
    float eps;
} Fp8AdamWParams;

/* Causal attention core, [batch, seq, heads, head_dim] tensors, lse and delta
 * [batch, heads, seq]; one block per (query row, head, sequence) forward and
 * for dq, one per (key row, head, sequence) for dk and dv. */
typedef struct Fp8AttentionParams {
    uint64_t q;
    uint64_t k;
    uint64_t v;
    uint64_t out;
    uint64_t lse;
    uint64_t dout;
    uint64_t delta; /* D_i = sum dout_i * out_i, written by the dq kernel's first pass */
    uint64_t dq;
    uint64_t dk;
    uint64_t dv;
    uint32_t batch;
    uint32_t seq;
    uint32_t heads;
    uint32_t head_dim;
    float scale;    /* softmax scale */
    uint32_t dtype; /* FP8_DTYPE_*: probabilities and outputs rounded to it */
} Fp8AttentionParams;

/* Rotary position embedding (rotate-half), in place on x [rows, heads *
 * head_dim]; one thread per (row, head, i < half) pair. cos/sin hold only the
 * rows of the table the call reads: [table_rows, half], row r being position
 * first_position + r. Token t is at position first_position + t % seq. */
typedef struct Fp8RopeParams {
    uint64_t x;
    uint64_t cos;
    uint64_t sin;
    uint64_t rows;
    uint64_t seq;
    uint32_t heads;
    uint32_t head_dim;
    uint32_t half;   /* rotary_dim / 2 */
    uint32_t negate; /* 1: backward, the rotation by the negative angle */
} Fp8RopeParams;

/* Causal attention of new queries against a key/value cache (generation),
 * forward only, grouped-query heads read in place: q and out [queries, heads *
 * head_dim], k and v [keys, kv_heads * head_dim]; query i attends to keys
 * 0 ..= keys - queries + i; query head h reads key/value head h / (heads /
 * kv_heads). One block per (query, head); the row's scores in shared memory. */
typedef struct Fp8CachedAttentionParams {
    uint64_t q;
    uint64_t k;
    uint64_t v;
    uint64_t out;
    uint32_t queries;
    uint32_t keys;
    uint32_t heads;
    uint32_t kv_heads;
    uint32_t head_dim;
    float scale;    /* softmax scale */
    uint32_t dtype; /* FP8_DTYPE_*: probabilities and outputs rounded to it */
    uint32_t pad;
} Fp8CachedAttentionParams;

#endif /* FP8_OPS_PARAMS_H */
