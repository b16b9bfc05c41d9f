// Causal attention of a few new queries against a key/value cache (one
// decode or prefill step of generation), forward only, grouped-query heads
// read in place. Twin: ops::attention_cached. One block per (query i, head
// h): the row's scores S_j = (q . k_j) scale (a left-to-right f32 dot, as the
// twin) go to dynamic shared memory (keys floats: the launcher checks the
// 48 KiB), then max, e_j = exp(S_j - max), total = sum e_j, P_j =
// round(e_j / total) to the dtype and out = round(sum_j P_j v_j), the sum in
// key order per feature as the twin. What differs from the twin is what the
// contract allows (docs/numerics.md): the order of the total (a block tree)
// and CUDA's expf. No atomics: each output row is written by one block.
#include "ops_device.cuh"

using namespace fp8ops;

extern "C" __global__ void __launch_bounds__(THREADS) fp8_attention_cached(const Fp8CachedAttentionParams p) {
    extern __shared__ float probs[];  // [last + 1]
    __shared__ float scratch[WARPS];
    const uint64_t i = blockIdx.x, h = blockIdx.y;
    const uint32_t d = p.head_dim;
    const uint64_t last = (uint64_t)p.keys - p.queries + i;
    const uint64_t kv_width = (uint64_t)p.kv_heads * d;
    const uint64_t kv = (h / (p.heads / p.kv_heads)) * d;
    const float* q = reinterpret_cast<const float*>(p.q) + (i * p.heads + h) * d;
    const float* k = reinterpret_cast<const float*>(p.k) + kv;
    const float* v = reinterpret_cast<const float*>(p.v) + kv;
    float m = __int_as_float(0xFF800000);  // -inf
    for (uint64_t j = threadIdx.x; j <= last; j += THREADS) {
        const float* kj = k + j * kv_width;
        float s = 0.0f;
        for (uint32_t c = 0; c < d; ++c) s = add(s, mul(q[c], kj[c]));
        s = mul(s, p.scale);
        probs[j] = s;
        m = fmaxf(m, s);
    }
    m = block_max(m, scratch);  // its barriers also publish probs[]
    float part = 0.0f;
    for (uint64_t j = threadIdx.x; j <= last; j += THREADS) {
        const float e = expf(sub(probs[j], m));
        probs[j] = e;
        part = add(part, e);
    }
    const float total = block_sum(part, scratch);  // its barriers publish the e_j
    for (uint64_t j = threadIdx.x; j <= last; j += THREADS) probs[j] = round_to(div(probs[j], total), p.dtype);
    __syncthreads();
    float* out = reinterpret_cast<float*>(p.out) + (i * p.heads + h) * d;
    for (uint32_t c = threadIdx.x; c < d; c += THREADS) {
        float o = 0.0f;
        for (uint64_t j = 0; j <= last; ++j) o = add(o, mul(probs[j], v[j * kv_width + c]));
        out[c] = round_to(o, p.dtype);
    }
}
