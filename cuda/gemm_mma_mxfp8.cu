// MXFP8 x MXFP8 GEMMs on mma.sync.m16n8k32 (sm_89 and newer): one k32 mma spans
// exactly one 32-wide E8M0 scale block of K, so each k-step's tensor-core sum is
// promoted into the f32 accumulator times its two block scales (gemm_mma.cuh,
// promote_e8m0). The forward pair (E4M3 x E4M3) and the backward pairs; E5M2 x
// E5M2 is not a GEMM the engine runs. Elsewhere each kernel only reports
// FP8_GEMM_ERROR_ARCH; the host's dispatch never launches it there.
#include "gemm_mma.cuh"

using namespace fp8gemm;

#if __CUDA_ARCH__ >= 890
FP8GEMM_MMA_K32(MmaE4M3E4M3, "e4m3.e4m3")
FP8GEMM_MMA_K32(MmaE4M3E5M2, "e4m3.e5m2")
FP8GEMM_MMA_K32(MmaE5M2E4M3, "e5m2.e4m3")
#define FP8GEMM_BODY(OP) gemm_body<OP, true, true>(p, smem)
#else
#define FP8GEMM_BODY(OP) unsupported(p)
#endif

#define FP8GEMM_KERNEL(NAME, OP)                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME(const Fp8GemmParams p) { \
        extern __shared__ __align__(128) uint8_t smem[];                                  \
        (void)smem;                                                                       \
        FP8GEMM_BODY(OP);                                                                 \
    }

FP8GEMM_KERNEL(fp8_gemm_mma_mxfp8_e4m3_e4m3, MmaE4M3E4M3)
FP8GEMM_KERNEL(fp8_gemm_mma_mxfp8_e4m3_e5m2, MmaE4M3E5M2)
FP8GEMM_KERNEL(fp8_gemm_mma_mxfp8_e5m2_e4m3, MmaE5M2E4M3)
