//! glibc's allocator settings for the tool's long runs.
//!
//! A training step allocates and frees the same large buffers every step (activations, GEMM
//! scratch: 0.25-4 MiB each in the issue-20 model). With glibc's defaults, blocks that size go
//! to fresh `mmap`s or are trimmed from the heap when freed, so every step faults its pages in
//! again (about 3 K minor faults a step there, `docs/benchmarks.md`). Keeping freed memory in
//! the heap, as PyTorch's caching allocator keeps its blocks, removes those faults; the
//! process's resident memory stays at its peak instead of shrinking between steps.
//!
//! Blocks over 32 MiB (glibc's largest mmap threshold) still got their own `mmap`, and so did
//! every large block of a thread other than the first: a thread's arena grows in heaps of at
//! most 64 MiB, and glibc maps what does not fit. The tool's work runs on a rayon thread, so the
//! issue-15 layer (hidden 4096, FFN 16384, 4096 tokens: 64-256 MiB activations) faulted in
//! ~780 K fresh pages (3.2 GB) per step on the CPU. No `mmap` at all and one arena (the first
//! thread's, which grows without a cap) keep every freed block for reuse: its CPU step went from
//! 29.3 to 23.2 s, host work between the ops from 1374 to 163 ms (2-core machine,
//! `docs/benchmarks.md`); the hidden-1024 layer was unchanged or faster.
//! Library users get the same with `MALLOC_MMAP_MAX_=0 MALLOC_ARENA_MAX=1
//! MALLOC_TRIM_THRESHOLD_=1073741824`.

/// Blocks up to this size come from the heap, not from their own `mmap` (glibc's default
/// starts at 128 KiB and adapts).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 32 << 20;
/// No block gets its own `mmap`: all come from the heap, where freed ones are reused.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_MAX: i32 = 0;
/// One arena for every thread: the first thread's heap, which is not capped at 64 MiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENA_MAX: i32 = 1;
/// Free memory at the heap's top is handed back to the kernel only above this size.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: i32 = 1 << 30;

/// Applies each setting above unless the user set it: through its glibc environment variable
/// or `GLIBC_TUNABLES` (theirs win, one by one: a container's `MALLOC_ARENA_MAX=2` keeps the
/// others). Elsewhere (musl, macOS, Windows) does nothing.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        let settings = [
            (
                "MALLOC_MMAP_THRESHOLD_",
                "glibc.malloc.mmap_threshold",
                libc::M_MMAP_THRESHOLD,
                MMAP_THRESHOLD,
            ),
            ("MALLOC_MMAP_MAX_", "glibc.malloc.mmap_max", libc::M_MMAP_MAX, MMAP_MAX),
            (
                "MALLOC_ARENA_MAX",
                "glibc.malloc.arena_max",
                libc::M_ARENA_MAX,
                ARENA_MAX,
            ),
            (
                "MALLOC_TRIM_THRESHOLD_",
                "glibc.malloc.trim_threshold",
                libc::M_TRIM_THRESHOLD,
                TRIM_THRESHOLD,
            ),
        ];
        for (variable, tunable, parameter, value) in settings {
            if std::env::var_os(variable).is_some() || tunables.contains(tunable) {
                continue;
            }
            // SAFETY: mallopt only changes allocator parameters; it is called before any other
            // thread exists, and its failure (return 0) leaves glibc's default, which is correct.
            unsafe { libc::mallopt(parameter, value) };
        }
    }
}
