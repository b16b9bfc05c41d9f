//! Which instruction set the slice conversions run on: detection, caching and
//! the one-time self-check of the AVX-512 path.

use std::fmt;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// An instruction set the slice conversions can run on.
///
/// Every path produces the same bits as [`Isa::Scalar`], the portable reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, one element at a time.
    Scalar,
    /// x86-64 AVX2 + F16C, 8 lanes of f32.
    Avx2,
    /// x86-64 AVX-512 F + BW (with AVX2 + F16C), 16 lanes of f32.
    Avx512,
}

impl Isa {
    /// Every instruction set, slowest first.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// Lower-case name, as benches and messages spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU (and OS) can run the path.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available() && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// The paths this CPU can run, slowest first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|isa| isa.is_available()).collect()
    }

    /// The fastest path this CPU can run, detected once.
    ///
    /// The first time AVX-512 would be chosen its kernels are compared with the
    /// scalar path on edge and random inputs (see [`Isa::self_check`]); on any
    /// difference this falls back to AVX2 and says so once on stderr.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let fastest = Isa::available().pop().unwrap_or(Isa::Scalar);
            if fastest != Isa::Avx512 {
                return fastest;
            }
            match Isa::Avx512.self_check() {
                Ok(()) => Isa::Avx512,
                Err(err) => {
                    let fallback = if Isa::Avx2.is_available() {
                        Isa::Avx2
                    } else {
                        Isa::Scalar
                    };
                    eprintln!("fp8-engine: warning: {err}; using {fallback} conversions instead");
                    fallback
                }
            }
        })
    }

    /// Runs every conversion of this path on edge and random inputs (all formats,
    /// overflow modes, element types, several scales, lengths covering the tails)
    /// and compares every output bit and the amax with [`Isa::Scalar`].
    pub fn self_check(self) -> Result<()> {
        self.ensure_available()?;
        match super::self_check::first_mismatch(self) {
            None => Ok(()),
            Some(detail) => Err(Error::IsaMismatch {
                isa: self.name(),
                detail,
            }),
        }
    }

    pub(crate) fn ensure_available(self) -> Result<()> {
        if self.is_available() {
            Ok(())
        } else {
            Err(Error::IsaUnavailable { isa: self.name() })
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
