// Embedding gather and its deterministic scatter-add. Twins:
// ops::embedding_forward and ops::embedding_backward, same bits.
//
// The scatter-add sorts nothing on the device and uses no atomics: the host
// groups token positions by id, keeping each group in position order (a stable
// counting pass, backend::cuda::embedding::ScatterPlan), and one block per
// distinct id adds its tokens' rows into that id's table row in position
// order. Each table element therefore receives exactly the CPU twin's
// sequence of f32 additions, whatever the launch or the GPU.
#include "ops_device.cuh"

using namespace fp8ops;

// out [tokens, dim] = table[ids[i]] rows (ids checked by the host).
extern "C" __global__ void __launch_bounds__(THREADS) fp8_embedding_gather(const Fp8EmbeddingParams p) {
    const uint32_t* ids = reinterpret_cast<const uint32_t*>(p.ids);
    const float* table = reinterpret_cast<const float*>(p.src);
    float* out = reinterpret_cast<float*>(p.dst);
    const uint64_t n = p.tokens * p.dim, stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint64_t t = i / p.dim, c = i % p.dim;
        out[i] = table[(uint64_t)ids[t] * p.dim + c];
    }
}

// dtable[group_ids[g]] += dout[t] for t in the group's positions, in order; block g.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_embedding_scatter_add(const Fp8EmbeddingParams p) {
    const uint64_t g = blockIdx.x;
    if (g >= p.groups) return;
    const uint32_t* order = reinterpret_cast<const uint32_t*>(p.order);
    const uint32_t* starts = reinterpret_cast<const uint32_t*>(p.starts);
    const float* dout = reinterpret_cast<const float*>(p.src);
    float* row = reinterpret_cast<float*>(p.dst) + (uint64_t)reinterpret_cast<const uint32_t*>(p.group_ids)[g] * p.dim;
    const uint32_t begin = starts[g], end = starts[g + 1];
    for (uint64_t c = threadIdx.x; c < p.dim; c += THREADS) {
        float s = row[c];
        for (uint32_t k = begin; k < end; ++k) s = add(s, dout[(uint64_t)order[k] * p.dim + c]);
        row[c] = s;
    }
}
