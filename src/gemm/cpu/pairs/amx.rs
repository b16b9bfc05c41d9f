//! The pair-order chunk sum on Intel AMX: four 16 x 16 f32 tiles (a 32 x 32 output block), two
//! A tiles (16 rows x 32 bf16 of K) and two B tiles (16 pairs of K x 16 columns) per block of
//! 32 of K, four `TDPBF16PS` each.
//!
//! `TDPBF16PS` adds to each element of its accumulator tile `even + odd`, the two chains of
//! the 16 even and the 16 odd K products from +0 (Intel's pseudocode, measured bit for bit on
//! the machine of docs/benchmarks.md): the order [`super::portable`] spells out. Its inputs
//! and outputs flush subnormals, which FP8 products never make (module docs of `pairs.rs`).
//! Written with `asm!` because Rust's AMX intrinsics are not stable. A [`Tiles`] value loads
//! the tile configuration once (`LDTILECFG` cost about as much as a 32 x 32 x 128 chunk when
//! it ran per call) and releases the tiles when dropped; the tile registers keep their
//! configuration between `asm!` blocks because nothing else in the program uses them (the
//! compiler never allocates them; the OS saves them on context switches).

use super::{BLOCK, EDGE};

/// Bytes of one 16-row tile of a packed block (16 x 64 bytes).
const TILE_BYTES: usize = 1024;

/// Palette 1: tiles 0-7 of 16 rows x 64 bytes (f32 accumulators: 16 x 16; bf16 operands:
/// 16 x 32). Layout: palette, start row, 14 reserved bytes, 16 `colsb` (u16), 16 `rows` (u8).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut bytes = [0u8; 64];
    bytes[0] = 1;
    let mut t = 0;
    while t < 8 {
        bytes[16 + 2 * t] = 64;
        bytes[48 + t] = 16;
        t += 1;
    }
    TileConfig(bytes)
};

/// Whether this CPU has AMX-BF16 and the OS lets this process use the tile data (Linux asks
/// each process to request it; the request is process-wide and made here once).
pub(super) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn detect() -> bool {
    /// `arch_prctl` request for an extended state component, and the tile data's number.
    const ARCH_REQ_XCOMP_PERM: libc::c_int = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_ulong = 18;
    // CPUID leaf 7 (if leaf 0 reports it): EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
    let leaf7 = {
        if std::arch::x86_64::__cpuid(0).eax < 7 {
            return false;
        }
        std::arch::x86_64::__cpuid_count(7, 0)
    };
    if leaf7.edx & (1 << 22) == 0 || leaf7.edx & (1 << 24) == 0 {
        return false;
    }
    // SAFETY: a plain system call with integer arguments; it fails cleanly (non-zero) where
    // the kernel or CPU lacks the tile state.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
fn detect() -> bool {
    false
}

/// The tile configuration loaded on this thread, for as long as the value lives.
pub(super) struct Tiles(());

impl Tiles {
    /// Loads the configuration.
    ///
    /// # Safety
    /// [`available`] returned true. No other `Tiles` is alive on this thread.
    pub(super) unsafe fn load() -> Tiles {
        // SAFETY: AMX is available (caller); the configuration is 64 aligned bytes.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("ldtilecfg [{cfg}]", cfg = in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        }
        Tiles(())
    }

    /// `c = ` the chunk sums of `blocks` K blocks of the packed strips at `a` and `b`.
    ///
    /// # Safety
    /// `a` and `b` point to at least `blocks * BLOCK` values.
    #[cfg(target_arch = "x86_64")]
    pub(super) unsafe fn chunk(&mut self, a: *const u16, b: *const u16, blocks: usize, c: &mut [f32; BLOCK]) {
        if blocks == 0 {
            c.fill(0.0);
            return;
        }
        // SAFETY: the tiles are configured (`self`), the operand lengths are the caller's; `c`
        // holds 32 rows of 128 bytes, the four tiles' stores.
        unsafe {
            std::arch::asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "2:",
                "tileloadd tmm4, [{a} + {row}*1]",
                "tileloadd tmm6, [{b} + {row}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b} + {row}*1 + {tile}]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a} + {row}*1 + {tile}]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a}, {step}",
                "add {b}, {step}",
                "dec {n}",
                "jnz 2b",
                "tilestored [{c} + {c_row}*1], tmm0",
                "tilestored [{c} + {c_row}*1 + 64], tmm1",
                "tilestored [{c} + {c_row}*1 + {c_half}], tmm2",
                "tilestored [{c} + {c_row}*1 + {c_half} + 64], tmm3",
                a = inout(reg) a => _,
                b = inout(reg) b => _,
                n = inout(reg) blocks => _,
                row = in(reg) 64usize,
                c = in(reg) c.as_mut_ptr(),
                c_row = in(reg) EDGE * 4,
                tile = const TILE_BYTES,
                step = const 2 * TILE_BYTES,
                c_half = const 16 * EDGE * 4,
                options(nostack),
            );
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn chunk(&mut self, _: *const u16, _: *const u16, _: usize, _: &mut [f32; BLOCK]) {
        unreachable!("AMX is x86-64 only; `available` is false elsewhere")
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `load` (so AMX is available); releasing them
        // returns the tile state to its initial, unconfigured one.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem));
        }
    }
}

/// The first difference between this kernel and the portable one (`pairs.rs`,
/// [`super::check_against_portable`]); `None` if none.
pub(super) fn self_check() -> Option<String> {
    super::check_against_portable(super::Kernel::Amx, |a, b, blocks, c| {
        // SAFETY: only called where `available()` held, with no other `Tiles` on this thread;
        // both strips hold `blocks` blocks.
        unsafe { Tiles::load().chunk(a.as_ptr(), b.as_ptr(), blocks, c) }
    })
}
