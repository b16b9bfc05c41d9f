//! Which GEMM path runs FP8 GEMMs on a device: the portable (mma.sync) one or
//! the Hopper fast path, and the fast path's self-check before first use.
//!
//! * `FP8_GEMM_PATH=auto|portable|hopper` (environment) or
//!   [`PathSelector::force`] (API, beats the environment) choose.
//! * `portable`: never the fast path.
//! * `hopper`: the fast path on a capable GPU (sm_90 with kernels compiled);
//!   an error elsewhere. It still checks itself once per device, and a
//!   mismatch is an error (the user asked for this path explicitly).
//! * `auto` (default): the fast path on a capable GPU after its self-check
//!   ([`HOPPER_AUTO_DEFAULT`], true since the first GPU run validated the kernel on an
//!   H200); the self-check runs once per device; on a mismatch (or a
//!   failure to run it) the fast path is disabled for the process with one
//!   warning and the portable path is used.
//!
//! The self-check itself is a closure the caller provides (it runs both paths
//! on [`SelfCheckProblem`] and returns both outputs); this module only decides.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::format::Fp8Format;

/// Environment variable that chooses the GEMM path.
pub const PATH_ENV: &str = "FP8_GEMM_PATH";

/// Whether `auto` may pick the Hopper path (after its self-check). True since the
/// first GPU run (H200, 2026-11-27): exact probes, random cases at both tile widths,
/// the self-check, memcheck and synccheck all passed, and it ran 3-4.5x the portable
/// path's TFLOPS on every shape of `--suite llm` (`docs/gpu-validation.md`).
pub const HOPPER_AUTO_DEFAULT: bool = true;

/// A GEMM implementation on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmPath {
    /// The mma.sync kernels every supported GPU runs.
    Portable,
    /// The sm_90a wgmma + TMA kernels.
    Hopper,
}

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathPreference {
    /// The fast path where it is enabled, capable and self-checked; else portable.
    Auto,
    /// Always the portable path.
    Portable,
    /// The fast path or an error.
    Hopper,
}

impl FromStr for PathPreference {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(PathPreference::Auto),
            "portable" => Ok(PathPreference::Portable),
            "hopper" => Ok(PathPreference::Hopper),
            _ => Err(Error::InvalidRecipe {
                setting: PATH_ENV,
                value: s.to_string(),
                reason: "expected auto, portable or hopper".to_string(),
            }),
        }
    }
}

/// Both outputs of the self-check problem.
#[derive(Clone, Debug, PartialEq)]
pub struct SelfCheckRun {
    /// The fast path's output (f32).
    pub fast: Vec<f32>,
    /// The portable (or CPU reference) path's output.
    pub reference: Vec<f32>,
}

/// The first element out of tolerance.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// Flat index of the element.
    pub index: usize,
    /// Fast-path value.
    pub fast: f32,
    /// Reference value.
    pub reference: f32,
    /// The tolerance it exceeded.
    pub tolerance: f32,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "element {}: fast path {} vs reference {} (tolerance {})",
            self.index, self.fast, self.reference, self.tolerance
        )
    }
}

/// Relative tolerance against the largest reference magnitude: both paths
/// promote to f32 every 128 of K, but tensor cores keep ~13 mantissa bits
/// inside a block and sum in a different order, so results agree to about
/// 2^-12 of the output scale; a layout or scale bug is off by O(1) of it.
pub const SELF_CHECK_RTOL: f32 = 1.0 / 256.0;

/// `Ok` when every element of `fast` is within `SELF_CHECK_RTOL * max|reference|`
/// (+ the same relative share of itself) of `reference`, NaN only where the reference is NaN.
pub fn compare(run: &SelfCheckRun) -> std::result::Result<(), Mismatch> {
    if run.fast.len() != run.reference.len() {
        return Err(Mismatch {
            index: run.fast.len().min(run.reference.len()),
            fast: f32::NAN,
            reference: f32::NAN,
            tolerance: 0.0,
        });
    }
    let scale = run
        .reference
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f32, |m, x| m.max(x.abs()));
    for (index, (&fast, &reference)) in run.fast.iter().zip(&run.reference).enumerate() {
        let tolerance = SELF_CHECK_RTOL * (scale + reference.abs());
        let ok = if reference.is_nan() {
            fast.is_nan()
        } else if reference.is_infinite() {
            fast == reference
        } else {
            (fast - reference).abs() <= tolerance
        };
        if !ok {
            return Err(Mismatch {
                index,
                fast,
                reference,
                tolerance,
            });
        }
    }
    Ok(())
}

/// The small problem the self-check runs: two m-blocks (the second ragged),
/// ragged n-blocks for both tile widths, three K-blocks with a partial last
/// one, E4M3 x E4M3 and E5M2 x E4M3, per-tensor scales that are not 1.
#[derive(Clone, Debug, PartialEq)]
pub struct SelfCheckProblem {
    /// Rows of A and D.
    pub m: usize,
    /// Rows of B, columns of D.
    pub n: usize,
    /// The reduction length (a multiple of 16, not of 128).
    pub k: usize,
    /// Format of A (B is E4M3).
    pub a_format: Fp8Format,
    /// `m * k` finite codes of A.
    pub a: Vec<u8>,
    /// `n * k` finite codes of B.
    pub b: Vec<u8>,
    /// scale_inv of A and of B.
    pub scale_inv: (f32, f32),
}

impl SelfCheckProblem {
    /// Deterministic inputs (a fixed linear congruential sequence, NaN/inf codes skipped).
    pub fn new(a_format: Fp8Format) -> Self {
        let (m, n, k) = (200, 300, 272);
        let mut state = 0x2545_f491u32 ^ (a_format as u32);
        let mut codes = |format: Fp8Format, len: usize| {
            let mut out = Vec::with_capacity(len);
            while out.len() < len {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let code = (state >> 24) as u8;
                if format.decode(code).is_finite() {
                    out.push(code);
                }
            }
            out
        };
        let a = codes(a_format, m * k);
        let b = codes(Fp8Format::E4M3, n * k);
        SelfCheckProblem {
            m,
            n,
            k,
            a_format,
            a,
            b,
            scale_inv: (0.5, 0.25),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum CheckState {
    Passed,
    Failed(String),
}

/// Chooses the GEMM path per device, remembering each device's self-check.
#[derive(Debug)]
pub struct PathSelector {
    env: Option<String>,
    auto_enables_hopper: bool,
    forced: Mutex<Option<PathPreference>>,
    checks: Mutex<HashMap<usize, CheckState>>,
    warnings: Mutex<Vec<String>>,
}

impl PathSelector {
    /// A selector reading `env` as the value of `FP8_GEMM_PATH`; `auto_enables_hopper`
    /// says whether `auto` may choose the fast path (the process-wide one uses [`HOPPER_AUTO_DEFAULT`]).
    pub fn new(env: Option<String>, auto_enables_hopper: bool) -> Self {
        PathSelector {
            env,
            auto_enables_hopper,
            forced: Mutex::new(None),
            checks: Mutex::new(HashMap::new()),
            warnings: Mutex::new(Vec::new()),
        }
    }

    /// The process-wide selector (environment read once).
    pub fn global() -> &'static PathSelector {
        static GLOBAL: OnceLock<PathSelector> = OnceLock::new();
        GLOBAL.get_or_init(|| PathSelector::new(std::env::var(PATH_ENV).ok(), HOPPER_AUTO_DEFAULT))
    }

    /// Forces a path for every later choice (`None` returns to the environment's choice).
    pub fn force(&self, preference: Option<PathPreference>) {
        *self.forced.lock().unwrap_or_else(|p| p.into_inner()) = preference;
    }

    /// The effective preference: the forced one, else the environment's, else `Auto`.
    pub fn preference(&self) -> Result<PathPreference> {
        if let Some(p) = *self.forced.lock().unwrap_or_else(|p| p.into_inner()) {
            return Ok(p);
        }
        match &self.env {
            Some(value) => value.parse(),
            None => Ok(PathPreference::Auto),
        }
    }

    /// Warnings issued so far (each also printed once to stderr).
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The path for device `ordinal`. `capable`: an sm_90 GPU and a build with
    /// kernels. `check` runs the self-check problem on both paths; it is called
    /// at most once per device, and only when the fast path might be used.
    pub fn select<F>(&self, ordinal: usize, capable: bool, check: F) -> Result<GemmPath>
    where
        F: FnOnce() -> Result<SelfCheckRun>,
    {
        let preference = self.preference()?;
        match preference {
            PathPreference::Portable => return Ok(GemmPath::Portable),
            PathPreference::Auto if !capable || !self.auto_enables_hopper => return Ok(GemmPath::Portable),
            PathPreference::Hopper if !capable => {
                return Err(Error::NoGpu {
                    reason: format!(
                        "{PATH_ENV}=hopper: GPU {ordinal} cannot run the sm_90a fast path \
                         (it needs compute capability 9.0 and a build with CUDA kernels)"
                    ),
                });
            }
            _ => {}
        }
        let state = {
            let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
            match checks.get(&ordinal) {
                Some(state) => state.clone(),
                None => {
                    let state = match check() {
                        Ok(run) => match compare(&run) {
                            Ok(()) => CheckState::Passed,
                            Err(m) => CheckState::Failed(m.to_string()),
                        },
                        Err(e) => CheckState::Failed(format!("the self-check did not run: {e}")),
                    };
                    if let CheckState::Failed(detail) = &state
                        && preference == PathPreference::Auto
                    {
                        let warning = format!(
                            "fp8-engine: warning: the Hopper GEMM fast path failed its self-check on GPU {ordinal} \
                             ({detail}); using the portable path for this process"
                        );
                        eprintln!("{warning}");
                        self.warnings.lock().unwrap_or_else(|p| p.into_inner()).push(warning);
                    }
                    checks.insert(ordinal, state.clone());
                    state
                }
            }
        };
        match (state, preference) {
            (CheckState::Passed, _) => Ok(GemmPath::Hopper),
            (CheckState::Failed(_), PathPreference::Auto) => Ok(GemmPath::Portable),
            (CheckState::Failed(detail), _) => Err(Error::KernelArgs {
                kernel: "gemm_wgmma",
                detail: format!("{PATH_ENV}=hopper but the fast path failed its self-check on GPU {ordinal}: {detail}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn good() -> Result<SelfCheckRun> {
        Ok(SelfCheckRun {
            fast: vec![1.0, -2.0, 3.0005],
            reference: vec![1.0, -2.0, 3.0],
        })
    }

    fn bad() -> Result<SelfCheckRun> {
        Ok(SelfCheckRun {
            fast: vec![1.0, -2.0, 2.0],
            reference: vec![1.0, -2.0, 3.0],
        })
    }

    #[test]
    fn parse_preferences() {
        assert_eq!("auto".parse::<PathPreference>().unwrap(), PathPreference::Auto);
        assert_eq!(
            " Portable ".parse::<PathPreference>().unwrap(),
            PathPreference::Portable
        );
        assert_eq!("HOPPER".parse::<PathPreference>().unwrap(), PathPreference::Hopper);
        assert_eq!("".parse::<PathPreference>().unwrap(), PathPreference::Auto);
        let e = "fast".parse::<PathPreference>().unwrap_err();
        assert!(e.to_string().contains("fast") && e.to_string().contains(PATH_ENV));
    }

    #[test]
    fn the_default_checks_once_per_device_then_takes_the_fast_path() {
        // No FP8_GEMM_PATH and the build's default: auto, with the fast path enabled.
        let s = PathSelector::new(None, HOPPER_AUTO_DEFAULT);
        let calls = Cell::new(0);
        for _ in 0..3 {
            let path = s
                .select(0, true, || {
                    calls.set(calls.get() + 1);
                    good()
                })
                .unwrap();
            assert_eq!(path, GemmPath::Hopper);
        }
        assert_eq!(calls.get(), 1);
        // Another device gets its own check.
        assert_eq!(s.select(1, true, good).unwrap(), GemmPath::Hopper);
        assert!(s.warnings().is_empty());
        // Not capable (not sm_90, or no kernels): portable, and no self-check.
        let path = s
            .select(2, false, || panic!("no self-check on an incapable GPU"))
            .unwrap();
        assert_eq!(path, GemmPath::Portable);
    }

    #[test]
    fn auto_mismatch_disables_with_one_warning() {
        let s = PathSelector::new(None, true);
        assert_eq!(s.select(0, true, bad).unwrap(), GemmPath::Portable);
        // Later calls neither re-check nor warn again, and stay portable.
        let path = s.select(0, true, || panic!("must not re-run the self-check")).unwrap();
        assert_eq!(path, GemmPath::Portable);
        let warnings = s.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("self-check") && warnings[0].contains("element 2"),
            "{warnings:?}"
        );
    }

    #[test]
    fn auto_check_that_cannot_run_disables_too() {
        let s = PathSelector::new(None, true);
        let path = s
            .select(0, true, || {
                Err(Error::NoGpu {
                    reason: "launch failed".into(),
                })
            })
            .unwrap();
        assert_eq!(path, GemmPath::Portable);
        assert!(s.warnings()[0].contains("launch failed"));
    }

    #[test]
    fn auto_on_incapable_device_is_portable_without_check() {
        let s = PathSelector::new(None, true);
        let path = s.select(0, false, || panic!("no check on an incapable GPU")).unwrap();
        assert_eq!(path, GemmPath::Portable);
    }

    #[test]
    fn forced_portable_never_checks() {
        let s = PathSelector::new(Some("portable".into()), true);
        let path = s
            .select(0, true, || panic!("no check when portable is forced"))
            .unwrap();
        assert_eq!(path, GemmPath::Portable);
    }

    #[test]
    fn forced_hopper_ignores_the_default_but_not_the_check() {
        // Even with auto disabled (this build), hopper forces the fast path after a passing check.
        let s = PathSelector::new(Some("hopper".into()), false);
        assert_eq!(s.select(0, true, good).unwrap(), GemmPath::Hopper);
        // A failing check is an error, every time, with no silent fallback.
        let s = PathSelector::new(Some("hopper".into()), false);
        let e = s.select(0, true, bad).unwrap_err();
        assert!(e.to_string().contains("self-check"), "{e}");
        assert!(s.select(0, true, good).is_err(), "the failure is remembered");
        assert!(s.warnings().is_empty());
    }

    #[test]
    fn forced_hopper_on_incapable_device_is_an_error() {
        let s = PathSelector::new(Some("hopper".into()), true);
        assert!(matches!(s.select(3, false, good), Err(Error::NoGpu { .. })));
    }

    #[test]
    fn api_force_beats_environment_and_can_be_cleared() {
        let s = PathSelector::new(Some("portable".into()), false);
        s.force(Some(PathPreference::Hopper));
        assert_eq!(s.preference().unwrap(), PathPreference::Hopper);
        assert_eq!(s.select(0, true, good).unwrap(), GemmPath::Hopper);
        s.force(None);
        assert_eq!(s.preference().unwrap(), PathPreference::Portable);
        assert_eq!(s.select(0, true, good).unwrap(), GemmPath::Portable);
    }

    #[test]
    fn bad_environment_value_is_an_error() {
        let s = PathSelector::new(Some("cuBLAS".into()), true);
        assert!(s.select(0, true, good).is_err());
        s.force(Some(PathPreference::Portable));
        assert_eq!(s.select(0, true, good).unwrap(), GemmPath::Portable);
    }

    #[test]
    fn compare_tolerance_and_specials() {
        let run = |fast: Vec<f32>, reference: Vec<f32>| SelfCheckRun { fast, reference };
        // Within 2^-8 of max|ref| (= 100): 0.3 off is fine, 1.0 off is not.
        assert!(compare(&run(vec![100.0, 0.3], vec![100.0, 0.0])).is_ok());
        let m = compare(&run(vec![100.0, 1.0], vec![100.0, 0.0])).unwrap_err();
        assert_eq!(m.index, 1);
        // NaN only where the reference has NaN; infinities must match exactly.
        assert!(compare(&run(vec![f32::NAN, 1.0], vec![f32::NAN, 1.0])).is_ok());
        assert!(compare(&run(vec![f32::NAN, 1.0], vec![0.0, 1.0])).is_err());
        assert!(compare(&run(vec![0.0, 1.0], vec![f32::NAN, 1.0])).is_err());
        assert!(compare(&run(vec![f32::INFINITY], vec![f32::INFINITY])).is_ok());
        assert!(compare(&run(vec![f32::NEG_INFINITY], vec![f32::INFINITY])).is_err());
        // Different lengths never pass.
        assert!(compare(&run(vec![1.0], vec![1.0, 2.0])).is_err());
    }

    #[test]
    fn self_check_problem_is_ragged_and_finite() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let p = SelfCheckProblem::new(format);
            assert_eq!(p.a.len(), p.m * p.k);
            assert_eq!(p.b.len(), p.n * p.k);
            assert!(
                p.m > 128 && !p.m.is_multiple_of(128),
                "two m-blocks, the second partial"
            );
            assert!(
                !p.n.is_multiple_of(128) && !p.n.is_multiple_of(256) && p.n > 256,
                "ragged for both tile widths"
            );
            assert!(
                p.k.is_multiple_of(16) && !p.k.is_multiple_of(128) && p.k > 256,
                "a partial third K-block"
            );
            assert!(p.a.iter().all(|&c| format.decode(c).is_finite()));
            assert!(p.b.iter().all(|&c| Fp8Format::E4M3.decode(c).is_finite()));
            // Not degenerate: many distinct codes, and deterministic.
            let distinct: std::collections::HashSet<u8> = p.a.iter().copied().collect();
            assert!(distinct.len() > 100);
            assert_eq!(p, SelfCheckProblem::new(format));
        }
    }
}
