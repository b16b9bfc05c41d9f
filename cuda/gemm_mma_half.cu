// 16-bit GEMMs on mma.sync, the fallback policies' GEMMs (spec 6): bf16 and fp16
// m16n8k16 for sm_80 and newer, and fp16 as two m16n8k8 for sm_75 (which also
// runs on every later GPU, so it can be tested anywhere). A variant that cannot
// exist on the compiled architecture only reports FP8_GEMM_ERROR_ARCH.
#include "gemm_mma.cuh"

using namespace fp8gemm;

#if __CUDA_ARCH__ >= 800
FP8GEMM_MMA_K16(MmaBf16, "bf16.bf16")
FP8GEMM_MMA_K16(MmaF16, "f16.f16")
#define FP8GEMM_BODY_SM80(OP) gemm_body<OP, false>(p, smem)
#else
#define FP8GEMM_BODY_SM80(OP) unsupported(p)
#endif

#if __CUDA_ARCH__ >= 750
#define FP8GEMM_BODY_SM75(OP) gemm_body<OP, false>(p, smem)
#else
#define FP8GEMM_BODY_SM75(OP) unsupported(p)
#endif

#define FP8GEMM_KERNEL(NAME, BODY)                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME(const Fp8GemmParams p) { \
        extern __shared__ __align__(128) uint8_t smem[];                                  \
        (void)smem;                                                                       \
        BODY;                                                                             \
    }

FP8GEMM_KERNEL(fp8_gemm_mma_bf16, FP8GEMM_BODY_SM80(MmaBf16))
FP8GEMM_KERNEL(fp8_gemm_mma_f16, FP8GEMM_BODY_SM80(MmaF16))
FP8GEMM_KERNEL(fp8_gemm_mma_f16_k8, FP8GEMM_BODY_SM75(MmaF16K8))
