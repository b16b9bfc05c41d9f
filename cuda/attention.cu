// Causal attention core, forward and backward: a simple, correct fused
// kernel (not yet a fast one). Twins: ops::attention_forward/backward, whose
// module docs give the formulas. Tensors are [batch, seq, heads, head_dim],
// lse and delta [batch, heads, seq]; row i attends to keys 0..=i.
//
// Forward, one block per (query row i, head, sequence): the scores of the row
// are computed once into shared memory, their max and sum give lse in f32
// (the online softmax's statistics, here over the whole row at once), then
// P_ij = exp(S_ij - lse_i) is rounded to the compute dtype, exactly where the
// CPU twin rounds it (docs/numerics.md, Attention), before O = P V, which is
// rounded to the dtype too. The row's scores live in dynamic shared memory:
// seq floats (dq: seq, dk/dv: 2 seq), so seq is bounded by the 48 KiB a block
// gets without opt-in; the launcher checks it.
//
// Backward, two kernels in stream order: dq (one block per query row) first
// writes delta_i = sum dO_i O_i, then dk/dv (one block per key row j) sums
// over the query rows i >= j. P is recomputed from q, k and lse in both; dS =
// round(P (dP - delta)) and round(P) as the twin rounds them. No atomics: each
// output row is written by one block, so results are deterministic.
#include "ops_device.cuh"

using namespace fp8ops;

struct Head {
    uint64_t row_stride;  // heads * head_dim
    uint64_t base;        // element offset of (sequence b, row 0, head h)
    __device__ uint64_t at(uint64_t row) const { return base + row * row_stride; }
};

__device__ __forceinline__ Head head_of(const Fp8AttentionParams& p, uint64_t b, uint64_t h) {
    const uint64_t stride = (uint64_t)p.heads * p.head_dim;
    return Head{stride, b * p.seq * stride + h * p.head_dim};
}

// a . b over head_dim elements, left to right, each step rounded.
__device__ __forceinline__ float dot(const float* a, const float* b, uint32_t d) {
    float s = 0.0f;
    for (uint32_t c = 0; c < d; ++c) s = add(s, mul(a[c], b[c]));
    return s;
}

extern "C" __global__ void __launch_bounds__(THREADS) fp8_attention_forward(const Fp8AttentionParams p) {
    extern __shared__ float probs[];  // [i + 1]
    __shared__ float scratch[WARPS];
    const uint64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const uint32_t d = p.head_dim;
    const Head hd = head_of(p, b, h);
    const float* q = reinterpret_cast<const float*>(p.q) + hd.at(i);
    const float* k = reinterpret_cast<const float*>(p.k);
    const float* v = reinterpret_cast<const float*>(p.v);
    float m = __int_as_float(0xFF800000);  // -inf
    for (uint64_t j = threadIdx.x; j <= i; j += THREADS) {
        const float s = mul(p.scale, dot(q, k + hd.at(j), d));
        probs[j] = s;
        m = fmaxf(m, s);
    }
    m = block_max(m, scratch);  // its barriers also publish probs[]
    float sum = 0.0f;
    for (uint64_t j = threadIdx.x; j <= i; j += THREADS) sum = add(sum, expf(sub(probs[j], m)));
    const float lse = add(m, logf(block_sum(sum, scratch)));
    for (uint64_t j = threadIdx.x; j <= i; j += THREADS) probs[j] = round_to(expf(sub(probs[j], lse)), p.dtype);
    __syncthreads();
    float* out = reinterpret_cast<float*>(p.out) + hd.at(i);
    for (uint32_t c = threadIdx.x; c < d; c += THREADS) {
        float o = 0.0f;
        for (uint64_t j = 0; j <= i; ++j) o = add(o, mul(probs[j], v[hd.at(j) + c]));
        out[c] = round_to(o, p.dtype);
    }
    if (threadIdx.x == 0) reinterpret_cast<float*>(p.lse)[(b * p.heads + h) * p.seq + i] = lse;
}

// P_ij and dS_ij of one (query i, key j) pair, recomputed: returns round(P), sets ds = round(P (dP - delta)).
__device__ __forceinline__ float p_and_ds(const Fp8AttentionParams& p, const float* q, const float* k, const float* dO,
                                          const float* v, float lse, float delta, float& ds) {
    const uint32_t d = p.head_dim;
    const float pr = expf(sub(mul(p.scale, dot(q, k, d)), lse));
    const float dp = dot(dO, v, d);
    ds = round_to(pr == 0.0f ? 0.0f : mul(pr, sub(dp, delta)), p.dtype);
    return round_to(pr, p.dtype);
}

extern "C" __global__ void __launch_bounds__(THREADS) fp8_attention_backward_dq(const Fp8AttentionParams p) {
    extern __shared__ float ds_row[];  // [i + 1]
    __shared__ float scratch[WARPS];
    const uint64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const uint32_t d = p.head_dim;
    const Head hd = head_of(p, b, h);
    const float* q = reinterpret_cast<const float*>(p.q);
    const float* k = reinterpret_cast<const float*>(p.k);
    const float* v = reinterpret_cast<const float*>(p.v);
    const float* dO = reinterpret_cast<const float*>(p.dout) + hd.at(i);
    const float* o = reinterpret_cast<const float*>(p.out) + hd.at(i);
    float part = 0.0f;
    for (uint32_t c = threadIdx.x; c < d; c += THREADS) part = add(part, mul(dO[c], o[c]));
    const float delta = block_sum(part, scratch);
    const uint64_t stat = (b * p.heads + h) * p.seq + i;
    const float lse = reinterpret_cast<const float*>(p.lse)[stat];
    for (uint64_t j = threadIdx.x; j <= i; j += THREADS) {
        float ds;
        p_and_ds(p, q + hd.at(i), k + hd.at(j), dO, v + hd.at(j), lse, delta, ds);
        ds_row[j] = ds;
    }
    __syncthreads();
    float* dq = reinterpret_cast<float*>(p.dq) + hd.at(i);
    for (uint32_t c = threadIdx.x; c < d; c += THREADS) {
        float acc = 0.0f;
        for (uint64_t j = 0; j <= i; ++j) acc = add(acc, mul(ds_row[j], k[hd.at(j) + c]));
        dq[c] = round_to(mul(p.scale, acc), p.dtype);
    }
    if (threadIdx.x == 0) reinterpret_cast<float*>(p.delta)[stat] = delta;
}

extern "C" __global__ void __launch_bounds__(THREADS) fp8_attention_backward_dkdv(const Fp8AttentionParams p) {
    extern __shared__ float shared[];  // probs [seq - j], ds [seq - j]
    const uint64_t j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const uint64_t rows = p.seq - j;  // query rows i = j .. seq-1
    float* probs = shared;
    float* ds_col = shared + rows;
    const uint32_t d = p.head_dim;
    const Head hd = head_of(p, b, h);
    const float* q = reinterpret_cast<const float*>(p.q);
    const float* k = reinterpret_cast<const float*>(p.k) + hd.at(j);
    const float* v = reinterpret_cast<const float*>(p.v) + hd.at(j);
    const float* dO = reinterpret_cast<const float*>(p.dout);
    const float* lse = reinterpret_cast<const float*>(p.lse) + (b * p.heads + h) * p.seq;
    const float* delta = reinterpret_cast<const float*>(p.delta) + (b * p.heads + h) * p.seq;
    for (uint64_t r = threadIdx.x; r < rows; r += THREADS) {
        const uint64_t i = j + r;
        float ds;
        probs[r] = p_and_ds(p, q + hd.at(i), k, dO + hd.at(i), v, lse[i], delta[i], ds);
        ds_col[r] = ds;
    }
    __syncthreads();
    float* dk = reinterpret_cast<float*>(p.dk) + hd.at(j);
    float* dv = reinterpret_cast<float*>(p.dv) + hd.at(j);
    for (uint32_t c = threadIdx.x; c < d; c += THREADS) {
        float acc_k = 0.0f, acc_v = 0.0f;
        for (uint64_t r = 0; r < rows; ++r) {
            acc_v = add(acc_v, mul(probs[r], dO[hd.at(j + r) + c]));
            acc_k = add(acc_k, mul(ds_col[r], q[hd.at(j + r) + c]));
        }
        dv[c] = round_to(acc_v, p.dtype);
        dk[c] = round_to(mul(p.scale, acc_k), p.dtype);
    }
}
