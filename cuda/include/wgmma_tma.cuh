// Asynchronous-copy PTX of sm_90a, one instruction per wrapper: mbarrier
// init / arrive / arrive.expect_tx / try_wait.parity, 2D TMA tensor loads and
// stores, the async-proxy fence. Addresses of shared memory are 32-bit
// shared-window addresses (__cvta_generic_to_shared).
#pragma once

#include <stdint.h>

#include "wgmma_sync.cuh"

namespace wgmma {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// A barrier that completes a phase after `count` arrivals (and all expected transaction bytes).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if WGMMA_SM90A
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

// Makes barrier initialisation visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_mbar_init() {
#if WGMMA_SM90A
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival (release: this thread's earlier shared-memory writes are seen by waiters).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if WGMMA_SM90A
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// One arrival that also announces `bytes` of TMA transactions for this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if WGMMA_SM90A
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// Whether the phase of parity `parity` has completed (acquire); the hardware may suspend briefly.
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 1;
#if WGMMA_SM90A
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#endif
    return done != 0;
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    while (!mbar_try_wait(bar, parity)) {
    }
}

// How long a bounded wait spins before it gives up, in units of 2^20 ns
// (~1.05 ms; 32 bits of them wrap after ~52 days): 9537 units = 10 s. A
// healthy wait lasts microseconds and a first-run validation step about a
// minute in all, so 10 s in one wait is a hang.
constexpr uint32_t BOUNDED_WAIT_UNITS = 9537;

// %globaltimer (ns) >> 20: one 32-bit register instead of two (the producer
// that waits with it runs on 40 registers).
__device__ __forceinline__ uint32_t globaltimer_units() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return (uint32_t)(t >> 20);
}

// mbar_wait that gives up after BOUNDED_WAIT_UNITS: the timed-out thread calls
// `on_timeout()` (which records why; it is evaluated only then, so what it
// needs does not occupy registers while waiting), then traps, so the launch
// fails instead of spinning forever (data-centre GPUs have no watchdog). The
// timer is read only once the first try has failed.
template <typename OnTimeout>
__device__ __forceinline__ void mbar_wait_bounded(uint32_t bar, uint32_t parity, OnTimeout on_timeout) {
    if (mbar_try_wait(bar, parity)) return;
    const uint32_t start = globaltimer_units();
    while (!mbar_try_wait(bar, parity)) {
        if (globaltimer_units() - start > BOUNDED_WAIT_UNITS) {
            on_timeout();
            __threadfence_system();
            __trap();
        }
    }
}

// Pulls a tensor map (kernel parameter) into the descriptor cache.
__device__ __forceinline__ void prefetch_tensormap(const void* map) {
#if WGMMA_SM90A
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
#endif
}

// TMA: the box at element coordinates (x = inner, y = outer) of `map` into shared
// memory at `dst`, completing `bytes` of transactions on `bar`. Out-of-bounds
// elements are zero-filled (and still counted as transferred bytes).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, uint32_t bar, int32_t x, int32_t y) {
#if WGMMA_SM90A
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::
            "r"(dst),
        "l"((uint64_t)map), "r"(bar), "r"(x), "r"(y)
        : "memory");
#endif
}

// TMA: shared memory at `src` to the box at (x, y) of `map`; out-of-bounds elements are clipped.
__device__ __forceinline__ void tma_store_2d(const void* map, uint32_t src, int32_t x, int32_t y) {
#if WGMMA_SM90A
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     (uint64_t)map),
                 "r"(src), "r"(x), "r"(y)
                 : "memory");
#endif
}

// Closes the bulk group of TMA stores issued so far; waits until their shared-memory reads are done.
__device__ __forceinline__ void tma_store_commit() {
#if WGMMA_SM90A
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tma_store_wait_read() {
#if WGMMA_SM90A
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA, wgmma) accesses.
__device__ __forceinline__ void fence_proxy_async() {
#if WGMMA_SM90A
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace wgmma
