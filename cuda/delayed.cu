// Delayed-scaling update (spec 4.1) of every slot of a step in one launch:
// one warp per slot reduces the amax history, rolls it and updates the scale.
#include "fp8_device.cuh"

using namespace fp8;

constexpr int THREADS = 256;

extern "C" __global__ void __launch_bounds__(THREADS) fp8_delayed_update(const Fp8DelayedUpdateParams p) {
    const int lane = threadIdx.x & 31;
    const uint64_t slot = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (slot >= p.slots) return;  // warp-uniform
    const uint32_t len = p.history_len;
    float* h = reinterpret_cast<float*>(p.history) + slot * len;
    const float last = h[0];
    if (last == 0.0f) return;  // the slot did not run this step; NaN != 0 rolls in
    float amax = last;
    if (p.algo == FP8_AMAX_ALGO_MAX) {
        // fmaxf ignores NaN unless every entry is NaN, like f32::max.
        for (uint32_t i = 1 + lane; i < len; i += 32) amax = fmaxf(amax, h[i]);
        amax = group_max(amax, 32);
    }
    __syncwarp();
    // Roll left by one over [1, len-1): each 32-entry chunk is read before it is written.
    for (uint32_t base = 1; base + 1 < len; base += 32) {
        const uint32_t i = base + lane;
        const float v = i + 1 < len ? h[i + 1] : 0.0f;
        __syncwarp();
        if (i + 1 < len) h[i] = v;
        __syncwarp();
    }
    if (lane == 0) {
        if (len > 1) h[len - 1] = last;
        h[0] = 0.0f;
        if (!isnan(amax) && !isinf(amax) && amax > 0.0f) {
            float* scale = reinterpret_cast<float*>(p.scale) + slot;
            const float s = __fdiv_rn(reinterpret_cast<const float*>(p.scaled_max)[slot], amax);
            *scale = isinf(s) ? FLT_MAX_F : s;
        }
    }
}
