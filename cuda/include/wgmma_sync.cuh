// Warpgroup-level PTX of sm_90a, one instruction per wrapper: wgmma
// fence/commit/wait, the shared-memory matrix descriptor, register
// reallocation (setmaxnreg) and named barriers. Everything outside sm_90a
// compiles to nothing (the kernels that use it are stubs there).
#pragma once

#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_SM90A 1
#else
#define WGMMA_SM90A 0
#endif

namespace wgmma {

// Orders earlier register/shared-memory accesses before the next wgmma.mma_async.
__device__ __forceinline__ void fence() {
#if WGMMA_SM90A
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

// Closes the group of wgmma.mma_async issued since the last commit.
__device__ __forceinline__ void commit_group() {
#if WGMMA_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most N committed groups are still in flight.
template <int N> __device__ __forceinline__ void wait_group() {
#if WGMMA_SM90A
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Keeps the compiler from moving accesses of an accumulator register across an async wgmma.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Shrinks (producer) or grows (consumer) this warpgroup's register allotment; REGS multiple of 8 in [24, 256].
template <int REGS> __device__ __forceinline__ void setmaxnreg_dec() {
#if WGMMA_SM90A
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}
template <int REGS> __device__ __forceinline__ void setmaxnreg_inc() {
#if WGMMA_SM90A
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

// bar.sync on named barrier `id` (1..15; 0 is __syncthreads) for `threads` threads (multiple of 32).
__device__ __forceinline__ void named_barrier(uint32_t id, uint32_t threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle
// layout TMA writes: rows of 128 B, 8-row atoms of 1024 B (stride byte offset),
// the leading byte offset unused for swizzled K-major tiles (1 by convention),
// base offset 0 because every tile starts on a 1024-byte boundary.
// Bits: [0,14) address >> 4, [16,30) LBO >> 4, [32,46) SBO >> 4, [62,64) swizzle (1 = 128 B).
__device__ __forceinline__ uint64_t desc_k_major_sw128(uint32_t smem_address) {
    uint64_t desc = (uint64_t)((smem_address & 0x3FFFFu) >> 4);
    desc |= (uint64_t)1 << 16;
    desc |= (uint64_t)(1024 >> 4) << 32;
    desc |= (uint64_t)1 << 62;
    return desc;
}

}  // namespace wgmma
