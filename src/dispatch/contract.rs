//! The op contract between a backend and its CPU twin (`docs/numerics.md`, Op
//! contracts between backends): the one place that maps an op to how its
//! result is compared, and the element-wise comparison itself.

use crate::backend::cuda::gemm_f32::f32_order_bound;
use crate::format::Fp8Format;
use crate::gemm::{GemmParams, Operand};
use crate::tensor::Dtype;

/// How an op's result must agree with its CPU twin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Contract<'a> {
    /// Same bits.
    Exact,
    /// `|primary - cpu| <= atol + rtol * |cpu|` per element (or the same bits: infinities, NaN).
    Close { rtol: f64, atol: f64 },
    /// `|primary - cpu| <= atol + rtol * (|cpu| + max |cpu|)`, the max over the whole compared
    /// result: sums whose terms may each move by `rtol` of themselves and cancel, judged
    /// against the result's scale (attention: [`attention`]).
    Normwise { rtol: f64, atol: f64 },
    /// The GEMM tolerance of the output's format for sums of `k` products per output
    /// (`docs/numerics.md`, Tolerances): [`gemm_tolerance`], and where an element is
    /// outside it, the bound of the call's operands (`dispatch::gemm_check`).
    Gemm { k: usize, call: Option<GemmCall<'a>> },
}

/// The operands and scalars of one GEMM call, which its per-element bound is formed from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmCall<'a> {
    pub a: &'a Operand<'a>,
    pub b: &'a Operand<'a>,
    pub params: &'a GemmParams<'a>,
}

/// Two calls are the same call: the same operands and scalars in memory.
impl PartialEq for GemmCall<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.a, other.a) && std::ptr::eq(self.b, other.b) && std::ptr::eq(self.params, other.params)
    }
}

/// Reductions, `exp`/`rsqrt`/`tanh`: f32 results in another summation order, a few ulp apart.
const REDUCTION: Contract<'static> = Contract::Close { rtol: 1e-5, atol: 1e-6 };

/// GELU-tanh: each implementation within `4 eps max(|exact|, 1)` of the exact value
/// (`docs/numerics.md`, Activations; the CPU's is within 2 eps), so two differ by at most
/// `8 eps max(|y|, 1)` = 9.5e-7 max(|y|, 1), inside `atol + rtol |y|`.
const GELU: Contract<'static> = Contract::Close { rtol: 1e-5, atol: 1e-6 };

/// The attention ops' contract in compute dtype `dtype` (`docs/numerics.md`, Op contracts):
/// normwise, because `O = P V` (and the gradients) sum terms that cancel, and each `P` is
/// rounded to the dtype from `exp`s that may differ by an ulp between backends, so a `P` can
/// land one dtype step apart (the first GPU run: bf16 outputs of 0.07 one bf16 step apart,
/// 250x past the per-element reduction bound). f32: the reduction's rtol; 16-bit: the dtype's.
pub(crate) fn attention(dtype: Dtype) -> Contract<'static> {
    let (rtol, atol) = crate::ops::attention::contract_tolerances(dtype);
    Contract::Normwise { rtol, atol }
}

/// The contract of `op` (a `Kernels` method name), as `docs/numerics.md` tabulates it.
pub(crate) fn contract(op: &str) -> Contract<'static> {
    match op {
        "quantize" | "transpose_fp8" | "convert" | "convert_transposed" | "delayed_update" | "record_amax"
        | "current_scale" | "cast_stats" | "uncast_stats" | "residual_add" | "multiply" | "round" | "copy_columns"
        | "embedding_forward" | "unscale_and_check" | "rope_forward" | "rope_backward" | "dropout" | "dropout_add" => {
            Contract::Exact
        }
        // K and the operands are the call's: the shadow runner sets them ([`Contract::for_gemm`]).
        "gemm" | "gemm_into" => Contract::Gemm { k: 0, call: None },
        // Correctly rounded `sqrt` and division, no fused multiply-add: only the ulp of a reordering.
        "adamw" => Contract::Close { rtol: 1e-6, atol: 0.0 },
        "column_sum"
        | "embedding_backward"
        | "sum_squares"
        | "layernorm_forward"
        | "layernorm_backward"
        | "rmsnorm_forward"
        | "rmsnorm_backward"
        | "cross_entropy_forward"
        | "cross_entropy_backward"
        | "attention_forward"
        | "attention_backward"
        | "swiglu_forward"
        | "swiglu_backward"
        | "attention_cached" => REDUCTION, // shadow mode: [`attention`] of the call's dtype
        "gelu_forward" | "gelu_backward" => GELU,
        // An op with no stated bound yet is held to the strictest contract.
        _ => Contract::Exact,
    }
}

impl Contract<'_> {
    /// This contract for the GEMM call `call`: a GEMM's tolerance depends on its K
    /// ([`gemm_tolerance`]) and its bound on the operands; every other contract on neither.
    pub(crate) fn for_gemm<'a>(self, call: GemmCall<'a>) -> Contract<'a> {
        match self {
            Contract::Gemm { .. } => Contract::Gemm {
                k: call.a.shape().1,
                call: Some(call),
            },
            Contract::Exact => Contract::Exact,
            Contract::Close { rtol, atol } => Contract::Close { rtol, atol },
            Contract::Normwise { rtol, atol } => Contract::Normwise { rtol, atol },
        }
    }
}

/// The f32 row's rtol where K is small (about 11 to 22 ulp).
const F32_GEMM_RTOL: f64 = 1.3e-6;

/// The rtol/atol a GEMM result in `dtype`, a sum of `k` products per output, is held to
/// first: an element outside it is judged again by the bound of the call's operands,
/// which forms `sum |a b|` (`dispatch::gemm_check`).
///
/// f32: two f32 sums of the same `k` products in different orders differ by at most
/// `2 gamma_k sum |a b|` (`backend::cuda::gemm_f32::f32_order_bound`); taken here relative
/// to `|D|`, never below 1.3e-6, which `2 gamma_k` passes at K = 11 (4.9e-4 at K = 4096). The other
/// rows, the output format's own rounding, are far wider than `2 gamma_k` at the layers' K
/// (2e-3 at K = 16384) and do not depend on it.
pub(crate) fn gemm_tolerance(dtype: GemmDtype, k: usize) -> Contract<'static> {
    let (rtol, atol) = match dtype {
        GemmDtype::F32 => (F32_GEMM_RTOL.max(f32_order_bound(k, 1.0)), 1e-5),
        GemmDtype::Bf16 => (1.6e-2, 1e-5),
        GemmDtype::F16 => (1e-3, 1e-5),
        GemmDtype::Fp8(Fp8Format::E4M3) => (0.125, 0.0675),
        GemmDtype::Fp8(Fp8Format::E5M2) => (0.25, 0.125),
    };
    Contract::Close { rtol, atol }
}

/// The dtype of a GEMM result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum GemmDtype {
    F32,
    Bf16,
    F16,
    Fp8(Fp8Format),
}

/// The first element where a result breaks its contract.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Breach {
    pub index: usize,
    pub primary: f64,
    pub cpu: f64,
    /// How far apart the contract allowed the two there (0: the same bits).
    pub bound: f64,
}

impl Breach {
    /// A breach of the same-bits contract (lengths or kinds that differ).
    pub(crate) fn exact(index: usize, primary: f64, cpu: f64) -> Breach {
        Breach {
            index,
            primary,
            cpu,
            bound: 0.0,
        }
    }

    /// `|primary - cpu| / bound` (infinite where the bound is 0).
    pub(crate) fn ratio(&self) -> f64 {
        let diff = (self.primary - self.cpu).abs();
        if self.bound > 0.0 {
            diff / self.bound
        } else {
            f64::INFINITY
        }
    }
}

/// The distance `contract` allows between `primary` and `cpu` (0: the same bits).
/// (`Normwise` counts its scale only once [`resolved`] over a whole result.)
pub(crate) fn allowed(contract: Contract, cpu: f64) -> f64 {
    match contract {
        Contract::Exact | Contract::Gemm { .. } => 0.0,
        Contract::Close { rtol, atol } | Contract::Normwise { rtol, atol } => atol + rtol * cpu.abs(),
    }
}

/// `contract` for one whole result `cpu`: `Normwise` becomes the `Close` its scale gives
/// (`atol + rtol * max |cpu|`, finite values only); every other contract stays.
pub(crate) fn resolved<'a>(contract: Contract<'a>, cpu: &[f64]) -> Contract<'a> {
    match contract {
        Contract::Normwise { rtol, atol } => {
            let scale = cpu.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
            Contract::Close {
                rtol,
                atol: atol + rtol * scale,
            }
        }
        other => other,
    }
}

/// Whether one pair of values keeps `contract` (`Gemm` must be resolved to `Close` first).
pub(crate) fn agrees(contract: Contract, primary: f64, cpu: f64) -> bool {
    match contract {
        Contract::Exact | Contract::Gemm { .. } => primary.to_bits() == cpu.to_bits(),
        Contract::Close { rtol, atol } | Contract::Normwise { rtol, atol } => {
            primary.to_bits() == cpu.to_bits() || (primary - cpu).abs() <= atol + rtol * cpu.abs()
        }
    }
}

/// The first breach of `contract` between two equally long f32 results (a length
/// difference is a breach at the first missing index).
pub(crate) fn first_breach_f32(contract: Contract, primary: &[f32], cpu: &[f32]) -> Option<Breach> {
    // Exact compares the f32 bits themselves (f64 widening keeps them distinct, NaN payloads too).
    first_breach(
        contract,
        primary.iter().map(|&v| v as f64),
        cpu.iter().map(|&v| v as f64),
    )
}

/// The first breach of `contract` between two sequences of values.
pub(crate) fn first_breach(
    contract: Contract,
    primary: impl ExactSizeIterator<Item = f64>,
    cpu: impl ExactSizeIterator<Item = f64>,
) -> Option<Breach> {
    if let Contract::Normwise { .. } = contract {
        // Its scale needs the whole result first; every other contract reads it once, in place.
        let cpu: Vec<f64> = cpu.collect();
        return first_breach(resolved(contract, &cpu), primary, cpu.into_iter());
    }
    let (p_len, c_len) = (primary.len(), cpu.len());
    for (index, (p, c)) in primary.zip(cpu).enumerate() {
        if !agrees(contract, p, c) {
            return Some(Breach {
                index,
                primary: p,
                cpu: c,
                bound: allowed(contract, c),
            });
        }
    }
    (p_len != c_len).then(|| Breach::exact(p_len.min(c_len), p_len as f64, c_len as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normwise_judges_each_element_against_the_results_scale() {
        // The first GPU run's bf16 attention case: 0.0947 vs 0.0942 (one bf16 step) in an
        // output whose largest value is 1: inside 1.6e-2 * (0.0942 + 1), far outside per element.
        let cpu = [1.0f32, 0.094_238_28, -0.5];
        let mut gpu = cpu;
        gpu[1] = 0.094_726_56;
        let normwise = attention(Dtype::Bf16);
        assert_eq!(first_breach_f32(normwise, &gpu, &cpu), None);
        assert!(first_breach_f32(REDUCTION, &gpu, &cpu).is_some());
        // One percent of the scale past the bound is a breach, its bound the resolved one.
        gpu[1] = 0.094_238_28 + 1.6e-2 * (1.0 + 0.094_238_28) + 1e-5 + 1e-2;
        let breach = first_breach_f32(normwise, &gpu, &cpu).expect("beyond the scale's share");
        assert_eq!(breach.index, 1);
        assert!(
            (breach.bound - (1e-5 + 1.6e-2 * (1.0 + f64::from(0.094_238_28f32)))).abs() < 1e-9,
            "{}",
            breach.bound
        );
        // f32 keeps the reduction's rtol, against the scale.
        assert_eq!(attention(Dtype::F32), Contract::Normwise { rtol: 1e-5, atol: 1e-6 });
        let f32_cpu = [1.0f32, 0.0];
        assert_eq!(first_breach_f32(attention(Dtype::F32), &[1.0, 1.05e-6], &f32_cpu), None);
        assert!(first_breach_f32(attention(Dtype::F32), &[1.0, 2e-5], &f32_cpu).is_some());
    }

    #[test]
    fn exact_catches_one_ulp_and_close_allows_it() {
        let a = [1.0f32, 2.0, 3.0];
        let mut b = a;
        b[2] = f32::from_bits(b[2].to_bits() + 1);
        let breach = first_breach_f32(Contract::Exact, &b, &a).expect("one ulp is not the same bits");
        assert_eq!(breach.index, 2);
        assert_eq!(breach.primary, b[2] as f64);
        assert!(first_breach_f32(contract("gelu_forward"), &b, &a).is_none());
        b[1] = 2.0 * (1.0 + 2e-5);
        assert_eq!(
            first_breach_f32(contract("gelu_forward"), &b, &a).map(|x| x.index),
            Some(1)
        );
    }

    /// The derivation of [`GELU`]: two results `8 eps max(|y|, 1)` apart agree, at every magnitude.
    #[test]
    fn gelu_admits_two_results_eight_eps_apart() {
        let eps = f32::EPSILON as f64;
        for y in [0.0f64, -1e-3, 0.3, -1.0, 7.5, -300.0, 1e5] {
            let apart = y + 8.0 * eps * y.abs().max(1.0);
            for op in ["gelu_forward", "gelu_backward"] {
                assert!(agrees(contract(op), apart, y), "{op} at {y}");
            }
        }
    }

    #[test]
    fn same_nan_bits_agree_and_lengths_must_match() {
        assert!(first_breach_f32(REDUCTION, &[f32::NAN], &[f32::NAN]).is_none());
        assert_eq!(
            first_breach_f32(Contract::Exact, &[1.0], &[1.0, 2.0]).map(|b| b.index),
            Some(1)
        );
    }

    /// The f32 row follows `2 gamma_K = 2 K u / (1 - K u)` (u = 2^-24) above K = 10 and keeps
    /// 1.3e-6 below; the other rows do not move with K.
    #[test]
    fn the_f32_gemm_tolerance_grows_with_k_from_the_order_bound() {
        let rtol = |k| match gemm_tolerance(GemmDtype::F32, k) {
            Contract::Close { rtol, atol } => {
                assert_eq!(atol, 1e-5, "K = {k}");
                rtol
            }
            other => panic!("K = {k}: {other:?}"),
        };
        let u = 2f64.powi(-24);
        let two_gamma = |k: f64| 2.0 * k * u / (1.0 - k * u);
        for k in [0, 1, 10] {
            assert_eq!(rtol(k), 1.3e-6, "K = {k}");
        }
        assert!(two_gamma(10.0) < 1.3e-6 && two_gamma(11.0) > 1.3e-6);
        for k in [11usize, 64, 4096, 16384] {
            let expected = two_gamma(k as f64);
            assert!(
                (rtol(k) - expected).abs() <= 1e-12 * expected,
                "K = {k}: {} vs {expected}",
                rtol(k)
            );
        }
        assert!((rtol(4096) - 4.883e-4).abs() < 1e-6);
        // 1e-4 apart at |D| = 1: inside the order bound of K = 4096, outside the old fixed row (K = 8).
        let (cpu, primary) = (1.0, 1.0 + 1e-4);
        assert!(agrees(gemm_tolerance(GemmDtype::F32, 4096), primary, cpu));
        assert!(!agrees(gemm_tolerance(GemmDtype::F32, 8), primary, cpu));
        assert!(!agrees(gemm_tolerance(GemmDtype::F32, 4096), 1.0 + 1e-3, cpu));
        for k in [0, 64, 4096, 1 << 20] {
            assert_eq!(
                gemm_tolerance(GemmDtype::Bf16, k),
                Contract::Close {
                    rtol: 1.6e-2,
                    atol: 1e-5
                }
            );
            assert_eq!(
                gemm_tolerance(GemmDtype::Fp8(Fp8Format::E4M3), k),
                Contract::Close {
                    rtol: 0.125,
                    atol: 0.0675
                }
            );
        }
        let a = Operand::F32(crate::gemm::Mat::new(&[1.0f32; 4096], 1, 4096).unwrap());
        let params = GemmParams::default();
        let call = GemmCall {
            a: &a,
            b: &a,
            params: &params,
        };
        assert_eq!(
            contract("gemm").for_gemm(call),
            Contract::Gemm {
                k: 4096,
                call: Some(call)
            }
        );
        assert_eq!(contract("adamw").for_gemm(call), contract("adamw"));
    }

    #[test]
    fn the_table_of_docs_numerics_md() {
        for op in [
            "quantize",
            "transpose_fp8",
            "convert",
            "delayed_update",
            "residual_add",
            "multiply",
            "round",
            "copy_columns",
            "embedding_forward",
            "unscale_and_check",
            "rope_forward",
            "rope_backward",
        ] {
            assert_eq!(contract(op), Contract::Exact, "{op}");
        }
        for op in [
            "column_sum",
            "sum_squares",
            "layernorm_backward",
            "attention_forward",
            "attention_cached",
            "swiglu_backward",
        ] {
            assert_eq!(contract(op), REDUCTION, "{op}");
        }
        assert_eq!(contract("gelu_backward"), Contract::Close { rtol: 1e-5, atol: 1e-6 });
        assert_eq!(contract("gemm"), Contract::Gemm { k: 0, call: None });
        assert_eq!(contract("adamw"), Contract::Close { rtol: 1e-6, atol: 0.0 });
        assert_eq!(contract("an_op_with_no_stated_bound"), Contract::Exact);
    }
}
