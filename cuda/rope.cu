// Rotary position embedding, rotate-half convention, forward and backward, in
// place. Twin: ops::rope_forward/backward, the same bits: the host uploads
// the twin's own cos/sin table rows, and each pair is rotated with the twin's
// f32 operations in its order (two rounded products and a rounded sum, no
// fused multiply-add): x1' = x1 c - x2 s, x2' = x2 c + x1 s, with s = -sin in
// the backward (an exact negation). One thread per (token, head, i < half)
// pair, grid-stride; each pair is read and written by one thread only.
#include "ops_device.cuh"

using namespace fp8ops;

extern "C" __global__ void __launch_bounds__(THREADS) fp8_rope(const Fp8RopeParams p) {
    float* x = reinterpret_cast<float*>(p.x);
    const float* cos_t = reinterpret_cast<const float*>(p.cos);
    const float* sin_t = reinterpret_cast<const float*>(p.sin);
    const uint64_t half = p.half, per_token = (uint64_t)p.heads * half;
    const uint64_t n = p.rows * per_token;
    for (uint64_t e = (uint64_t)blockIdx.x * THREADS + threadIdx.x; e < n; e += (uint64_t)gridDim.x * THREADS) {
        const uint64_t token = e / per_token, rest = e % per_token;
        const uint64_t head = rest / half, i = rest % half;
        const uint64_t t = (token % p.seq) * half + i;  // table row of the token's position
        const float c = cos_t[t];
        const float s = p.negate ? -sin_t[t] : sin_t[t];
        float* a = x + token * p.heads * p.head_dim + head * p.head_dim;
        const float x1 = a[i], x2 = a[i + half];
        a[i] = sub(mul(x1, c), mul(x2, s));
        a[i + half] = add(mul(x2, c), mul(x1, s));
    }
}
