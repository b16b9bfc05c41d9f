// Softmax cross-entropy forward/backward with an f32 log-sum-exp and an
// ignored target, and the argmax of each row. Twins: ops::cross_entropy_forward
// and ops::cross_entropy_backward (same formulas, each operation rounded once;
// the row sums run as a block tree, and expf/logf are within 2 ulp, so the
// results agree within the reduction bound), and the greedy decoding's
// argmax_rows (same indices).
#include "ops_device.cuh"

using namespace fp8ops;

// lse[r] = m + log(sum exp(x - m)), m = max x (fmaxf: NaN skipped), and
// row_loss[r] = lse - x[target] (0 for an ignored row). One block per row.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_cross_entropy_rows(const Fp8CrossEntropyParams p) {
    __shared__ float scratch[WARPS];
    const uint64_t r = blockIdx.x, vocab = p.vocab;
    const float* x = reinterpret_cast<const float*>(p.logits) + r * vocab;
    float m = __int_as_float(0xFF800000);  // -inf, the twin's fold start
    for (uint64_t j = threadIdx.x; j < vocab; j += THREADS) m = fmaxf(m, x[j]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (uint64_t j = threadIdx.x; j < vocab; j += THREADS) s = add(s, expf(sub(x[j], m)));
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
        const float lse = add(m, logf(s));
        const uint32_t t = reinterpret_cast<const uint32_t*>(p.targets)[r];
        reinterpret_cast<float*>(p.lse)[r] = lse;
        reinterpret_cast<float*>(p.row_loss)[r] = t == p.ignore ? 0.0f : sub(lse, x[t]);
    }
}

// loss = (sum over blocks of (sum of the block's row losses in order)) / count,
// in the twin's order: each thread sums whole blocks of rows_per_block rows,
// thread 0 adds the block sums in order. One block of THREADS threads.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_cross_entropy_mean(const Fp8CrossEntropyParams p) {
    __shared__ float partial[THREADS];
    const float* row_loss = reinterpret_cast<const float*>(p.row_loss);
    const uint64_t per = p.rows_per_block, blocks = (p.rows + per - 1) / per;
    float total = -0.0f;  // the twin's f32 Sum starts at -0.0
    for (uint64_t b0 = 0; b0 < blocks; b0 += THREADS) {
        const uint64_t b = b0 + threadIdx.x;
        float s = 0.0f;
        if (b < blocks) {
            const uint64_t end = min(p.rows, (b + 1) * per);
            for (uint64_t r = b * per; r < end; ++r) s = add(s, row_loss[r]);
        }
        partial[threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            const uint64_t here = min((uint64_t)THREADS, blocks - b0);
            for (uint64_t k = 0; k < here; ++k) total = add(total, partial[k]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *reinterpret_cast<float*>(p.loss) = p.count == 0 ? 0.0f : div(total, (float)p.count);
}

// dlogits = grad (exp(x - lse) - [j == target]), 0 on ignored rows; over rows * vocab.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_cross_entropy_backward(const Fp8CrossEntropyParams p) {
    const float* x = reinterpret_cast<const float*>(p.logits);
    const float* lse = reinterpret_cast<const float*>(p.lse);
    const uint32_t* targets = reinterpret_cast<const uint32_t*>(p.targets);
    float* d = reinterpret_cast<float*>(p.dlogits);
    const uint64_t n = p.rows * p.vocab, stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint64_t r = i / p.vocab, j = i % p.vocab;
        const uint32_t t = targets[r];
        if (t == p.ignore) {
            d[i] = 0.0f;
            continue;
        }
        const float v = mul(p.grad, expf(sub(x[i], lse[r])));
        d[i] = j == t ? sub(v, p.grad) : v;
    }
}

// out[r] = the first index of the largest value of row r (NaN never wins; a
// NaN first element keeps index 0), as the twin's left-to-right scan. One
// block per row; a = logits [rows, cols], out = u32 [rows].
extern "C" __global__ void __launch_bounds__(THREADS) fp8_argmax(const Fp8EltwiseParams p) {
    __shared__ float best_v[WARPS];
    __shared__ uint32_t best_i[WARPS];
    const uint64_t r = blockIdx.x, cols = p.cols;
    const float* x = reinterpret_cast<const float*>(p.a) + r * cols;
    float bv = 0.0f;
    uint32_t bi = 0xFFFFFFFFu;  // none yet
    for (uint64_t j = threadIdx.x; j < cols; j += THREADS) {
        const float v = x[j];
        if (!isnan(v) && (bi == 0xFFFFFFFFu || v > bv)) bv = v, bi = (uint32_t)j;
    }
    // Tree merge: the larger value wins, a tie goes to the smaller index.
    for (int o = 16; o > 0; o /= 2) {
        const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
        const uint32_t oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        if (oi != 0xFFFFFFFFu && (bi == 0xFFFFFFFFu || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < WARPS; ++w) {
            const float ov = best_v[w];
            const uint32_t oi = best_i[w];
            if (oi != 0xFFFFFFFFu && (bi == 0xFFFFFFFFu || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        const bool first_nan = cols > 0 && isnan(x[0]);
        reinterpret_cast<uint32_t*>(p.out)[r] = (bi == 0xFFFFFFFFu || first_nan) ? 0u : bi;
    }
}
