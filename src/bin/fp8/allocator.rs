//! glibc's allocator settings for the tool's long runs.
//!
//! A training step allocates and frees the same large buffers every step (activations, GEMM
//! scratch: 0.25-4 MiB each in the issue-20 model). With glibc's defaults, blocks that size go
//! to fresh `mmap`s or are trimmed from the heap when freed, so every step faults its pages in
//! again (about 3 K minor faults a step there, `docs/benchmarks.md`). Keeping freed memory in
//! the heap, as PyTorch's caching allocator keeps its blocks, removes those faults; the
//! process's resident memory stays at its peak instead of shrinking between steps.
//! Library users get the same with `MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824`.

/// Blocks up to this size come from the heap, not from their own `mmap` (glibc's default
/// starts at 128 KiB and adapts).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the heap's top is handed back to the kernel only above this size.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: i32 = 1 << 30;

/// Applies the settings above unless the user set either through glibc's environment
/// variables (theirs win). Elsewhere (musl, macOS, Windows) does nothing.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let user_set = ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
            .iter()
            .any(|name| std::env::var_os(name).is_some());
        if user_set {
            return;
        }
        // SAFETY: mallopt only changes allocator parameters; it is called before any other
        // thread exists, and its failure (return 0) leaves glibc's defaults, which are correct.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}
