// GELU (tanh form) and SwiGLU, forward and backward, elementwise in f32.
// Twins: ops::gelu_forward/backward and ops::swiglu_forward/backward (the
// formulas of docs/numerics.md), the same operations in the same order, each
// rounded once; tanhf and expf are CUDA's (at most 2 ulp from the correctly
// rounded value), so results agree with the twins within the activation bound.
#include "ops_device.cuh"

using namespace fp8ops;

// The twins' constants: sqrt(2/pi) and the cubic coefficient.
constexpr float SQRT_2_OVER_PI = 0.7978846f;
constexpr float GELU_CUBIC = 0.044715f;

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), over a.len = rows * cols.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_gelu_forward(const Fp8EltwiseParams p) {
    const float* x = reinterpret_cast<const float*>(p.a);
    float* y = reinterpret_cast<float*>(p.out);
    const uint64_t n = p.rows * p.cols, stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        const float t = tanhf(mul(SQRT_2_OVER_PI, add(v, mul(mul(mul(GELU_CUBIC, v), v), v))));
        y[i] = mul(mul(0.5f, v), add(1.0f, t));
    }
}

// dx = dy (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)); a = dy, b = x.
extern "C" __global__ void __launch_bounds__(THREADS) fp8_gelu_backward(const Fp8EltwiseParams p) {
    const float* dy = reinterpret_cast<const float*>(p.a);
    const float* x = reinterpret_cast<const float*>(p.b);
    float* dx = reinterpret_cast<float*>(p.out);
    const uint64_t n = p.rows * p.cols, stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i], v2 = mul(v, v);
        const float t = tanhf(mul(SQRT_2_OVER_PI, add(v, mul(mul(GELU_CUBIC, v2), v))));
        const float dinner = mul(SQRT_2_OVER_PI, add(1.0f, mul(mul(3.0f, GELU_CUBIC), v2)));
        const float left = mul(0.5f, add(1.0f, t));
        const float right = mul(mul(mul(0.5f, v), sub(1.0f, mul(t, t))), dinner);
        dx[i] = mul(dy[i], add(left, right));
    }
}

// 1 / (1 + exp(-v)); exp overflows to inf for v < -88 and 1/inf = 0, as the twin.
__device__ __forceinline__ float sigmoid(float v) { return div(1.0f, add(1.0f, expf(-v))); }

// x [rows, 2 cols] = [gate | up] per row; y [rows, cols] = gate sigmoid(gate) up.
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
