// GELU (tanh form) and SwiGLU, forward and backward, elementwise in f32, and inverted
// dropout. Twins: ops::gelu_forward/backward, ops::swiglu_forward/backward and
// ops::dropout/dropout_add. The CPU
// twins evaluate exp themselves (ops::fast_exp, docs/numerics.md
// "Activations") in plain f32 multiplies and adds without fused multiply-add;
// this file repeats every operation in the same order with explicitly
// rounded intrinsics (no contraction), so the kernels give the twins' bits.

#include "ops_device.cuh"

using namespace fp8ops;

// The twins' constants, written as the same decimals (both compilers round a
// decimal literal to the nearest f32).
constexpr float SQRT_2_OVER_PI = 0.7978846f;
constexpr float GELU_CUBIC = 0.044715f;
constexpr float EXP_HI = 89.0f;
constexpr float EXP_LO = -86.5f;
constexpr float LOG2_E = 1.44269504088896340736f;
constexpr float LN2_HI = 0.6933594f;
constexpr float LN2_LO = -2.1219444e-4f;
constexpr float ROUNDER = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
constexpr float Q0 = 0.49999994f, Q1 = 0.16666521f, Q2 = 0.04166839f, Q3 = 0.008368718f, Q4 = 0.0013814614f;

// ops::fast_exp::exp: n = round(x log2 e), r = x - n ln2 (two steps),
// e^r = 1 + (r + r^2 q(r)), times 2^(n-1), times 2; 0 below EXP_LO.
__device__ __forceinline__ float fast_exp(float x) {
    float xc = x > EXP_HI ? EXP_HI : x;
    xc = xc < EXP_LO ? EXP_LO : xc;
    const float shifted = add(mul(xc, LOG2_E), ROUNDER);
    const float n = sub(shifted, ROUNDER);
    const float r = sub(sub(xc, mul(n, LN2_HI)), mul(n, LN2_LO));
    const float q = add(Q0, mul(r, add(Q1, mul(r, add(Q2, mul(r, add(Q3, mul(r, Q4))))))));
    const float p = add(1.0f, add(r, mul(mul(r, r), q)));
    const int n_int = __float_as_int(shifted) - __float_as_int(ROUNDER);
    const float half_scale = __int_as_float((int)((uint32_t)(n_int + 126) << 23));
    const float e = mul(mul(p, half_scale), 2.0f);
    return x < EXP_LO ? 0.0f : e;
}

// 1 / (1 + exp(-v)).
__device__ __forceinline__ float sigmoid(float v) { return div(1.0f, add(1.0f, fast_exp(-v))); }

// sqrt(2/pi) (x + 0.044715 x^3), the products left to right as the twin.
__device__ __forceinline__ float gelu_inner(float v) {
    return mul(SQRT_2_OVER_PI, add(v, mul(mul(mul(GELU_CUBIC, v), v), v)));
}

// y = x sigmoid(2u) (= 0.5 x (1 + tanh u)), over a.len = rows * cols.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_gelu_forward(const Fp8EltwiseParams p) {
    const float* x = reinterpret_cast<const float*>(p.a);
    float* y = reinterpret_cast<float*>(p.out);
    const uint64_t n = p.rows * p.cols, stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        y[i] = mul(v, sigmoid(mul(2.0f, gelu_inner(v))));
    }
}

// With e = exp(-2u), s = 1 / (1 + e), 1 - s as e s when e <= 1:
// dx = dy (s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2)); a = dy, b = x.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_gelu_backward(const Fp8EltwiseParams p) {
    const float* dy = reinterpret_cast<const float*>(p.a);
    const float* x = reinterpret_cast<const float*>(p.b);
    float* dx = reinterpret_cast<float*>(p.out);
    const uint64_t n = p.rows * p.cols, stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        const float e = fast_exp(mul(-2.0f, gelu_inner(v)));
        const float s = div(1.0f, add(1.0f, e));
        const float one_minus_s = e > 1.0f ? sub(1.0f, s) : mul(e, s);
        const float dinner = mul(SQRT_2_OVER_PI, add(1.0f, mul(mul(mul(3.0f, GELU_CUBIC), v), v)));
        dx[i] = mul(dy[i], add(s, mul(mul(mul(mul(2.0f, v), s), one_minus_s), dinner)));
    }
}

// x [rows, 2 cols] = [gate | up] per row; y [rows, cols] = g sigmoid(g) up.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_swiglu_forward(const Fp8EltwiseParams p) {
    const float* x = reinterpret_cast<const float*>(p.a);
    float* y = reinterpret_cast<float*>(p.out);
    const uint64_t cols = p.cols, n = p.rows * cols, stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint64_t r = i / cols, j = i % cols;
        const float g = x[r * 2 * cols + j], u = x[r * 2 * cols + cols + j];
        y[i] = mul(mul(g, sigmoid(g)), u);
    }
}

// dx [rows, 2 cols] = [dy up s (1 + g (1 - s)) | dy g s] with s = sigmoid(g); a = dy, b = x.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_swiglu_backward(const Fp8EltwiseParams p) {
    const float* dy = reinterpret_cast<const float*>(p.a);
    const float* x = reinterpret_cast<const float*>(p.b);
    float* dx = reinterpret_cast<float*>(p.out);
    const uint64_t cols = p.cols, n = p.rows * cols, stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint64_t r = i / cols, j = i % cols;
        const uint64_t at = r * 2 * cols + j;
        const float d = dy[i], g = x[at], u = x[at + cols];
        const float s = sigmoid(g);
        dx[at] = mul(mul(mul(d, u), s), add(1.0f, mul(g, sub(1.0f, s))));
        dx[at + cols] = mul(mul(d, g), s);
    }
}

// Inverted dropout with a counter-based mask (twin: ops::dropout). Element i's multiplier comes
// from SplitMix64 output i of the stream `state`: the counter jumps to state + (i + 1) * gamma
// and is mixed, so each thread draws its own elements without a stored mask. The comparison
// u < p runs in f64 on the 53-bit fraction, exactly as the twin's.
__device__ __forceinline__ float dropout_multiplier(const Fp8DropoutParams& p, uint64_t i) {
    uint64_t z = p.state + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = __dmul_rn((double)(z >> 11), 1.0 / 9007199254740992.0);  // exact: 2^-53
    return u < p.p ? 0.0f : p.keep;
}

// out = x * m, rounded to the dtype.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_dropout(const Fp8DropoutParams p) {
    const float* x = reinterpret_cast<const float*>(p.x);
    float* out = reinterpret_cast<float*>(p.out);
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride)
        out[i] = round_to(mul(x[i], dropout_multiplier(p, i)), p.dtype);
}

// out = out + g * m, rounded to the dtype (the input gradient through dropout, added).
extern "C" __global__ void __launch_bounds__(THREADS) fp8_dropout_add(const Fp8DropoutParams p) {
    const float* g = reinterpret_cast<const float*>(p.x);
    float* out = reinterpret_cast<float*>(p.out);
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride)
        out[i] = round_to(add(out[i], mul(g[i], dropout_multiplier(p, i))), p.dtype);
}
