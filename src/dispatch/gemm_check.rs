//! The shadow comparison of a GEMM result (`docs/numerics.md`, Tolerances): each
//! element is first held to the output format's row ([`gemm_tolerance`]), which
//! costs nothing; where it is outside, to the bound its contract states for the
//! call's operands ([`element_bound`]), formed from `S_ij = |alpha| sum_k |a_ik
//! b_jk| sA sB`: first with a lower estimate of `S_ij` read off the result itself
//! (O(1)), then with the exact `S_ij` (O(K), `gemm::cpu::abs_product_sum`).
//! A breach names the exact bound.

use super::contract::{Breach, GemmCall, GemmDtype, agrees, gemm_tolerance};
use crate::backend::cuda::error_bound::{Accumulation, OutputUlp, accumulation_bound, worst_ratio};
use crate::backend::cuda::gemm_f32::f32_order_bound;
use crate::format::Fp8Format;
use crate::gemm::Operand;
use crate::gemm::cpu::{abs_product_sum, abs_product_sum_max};

/// One GEMM result, primary and CPU, as the comparison reads it.
pub(super) struct GemmResult<'v> {
    pub dtype: GemmDtype,
    /// The output scale of an FP8 output (1 for the others).
    pub scale: f32,
    /// Values in output units (FP8: decoded codes, before dividing by `scale`).
    pub primary: &'v [f64],
    pub cpu: &'v [f64],
    /// The f32 output before the GEMM (what `beta` multiplies), if kept.
    pub before: Option<&'v [f32]>,
}

/// Bound on `|D_primary - D_cpu|` for one output of `call` whose `S_ij` (alpha
/// included) is `s`, and the two results `p`, `c` in D units: the accumulation
/// bound of the operand kind, plus one output ulp at the larger magnitude plus
/// the output's smallest subnormal (`error_bound::worst_ratio`). The operand
/// kinds (`docs/numerics.md`, GEMM contracts):
///
/// * FP8, any scaling: `S (K/32 + 2) 2^-12` (`accumulation_bound`). Fast
///   accumulation keeps the whole sum in the tensor core's accumulator (13
///   significant bits, truncated: measured on an H200), one truncation of at most
///   `2^-12 S` per k32 mma, so `(K/32) 2^-12 S`; split
///   accumulation truncates so only inside each 128 block and adds the K/128
///   blocks in f32 (`2^-24 S` each), which the `+2` covers up to K = 2^20:
///   one bound for both modes. Block and MXFP8 scales sit inside `S`, per product.
/// * bf16/fp16: `S (K/16 + 2) 2^-22` (k16 mma, ~22 bits kept).
/// * f32: `2 gamma_K S` (`gemm_f32::f32_order_bound`): the two f32 sums in
///   different orders.
///
/// Returns `(ratio, bound)`, ratio `|p - c| / bound` (0 for the same value).
fn element_bound(call: &GemmCall, dtype: GemmDtype, scale: f32, s: f64, p: f32, c: f32) -> (f64, f64) {
    let k = call.a.shape().1;
    let accumulation = match call.a {
        Operand::Fp8(..) => accumulation_bound(Accumulation::Fp8, s, k),
        Operand::Bf16(_) | Operand::F16(_) => accumulation_bound(Accumulation::Half, s, k),
        Operand::F32(_) => f32_order_bound(k, s),
    };
    let w = worst_ratio(&[p], &[c], &[accumulation], output_ulp(dtype), scale as f64);
    (w.ratio, w.bound)
}

/// The rounding of an output format (`error_bound::OutputUlp`).
fn output_ulp(dtype: GemmDtype) -> OutputUlp {
    match dtype {
        GemmDtype::F32 => OutputUlp::F32,
        GemmDtype::Bf16 => OutputUlp::BF16,
        GemmDtype::F16 => OutputUlp::F16,
        GemmDtype::Fp8(Fp8Format::E4M3) => OutputUlp::E4M3,
        GemmDtype::Fp8(Fp8Format::E5M2) => OutputUlp::E5M2,
    }
}

/// A ratio of difference to bound that keeps the bound (a NaN ratio, from a NaN bound, does not).
fn within(ratio: f64) -> bool {
    ratio <= 1.0
}

/// The first element of `result` outside both the output row and the call's bound.
pub(super) fn first_breach(call: &GemmCall, result: &GemmResult) -> Option<Breach> {
    let GemmResult {
        dtype,
        scale,
        primary,
        cpu,
        before,
    } = *result;
    let row = gemm_tolerance(dtype, call.a.shape().1);
    if primary.len() != cpu.len() {
        return Some(Breach::exact(
            primary.len().min(cpu.len()),
            primary.len() as f64,
            cpu.len() as f64,
        ));
    }
    let n = call.b.shape().0.max(1);
    let ulp = output_ulp(dtype);
    let (alpha, beta) = (call.params.alpha.abs() as f64, call.params.beta as f64);
    for (index, (&p, &c)) in primary.iter().zip(cpu).enumerate() {
        if agrees(row, p, c) {
            continue;
        }
        // D units: an FP8 code's value divided by the output scale, as the GEMM wrote it.
        let (pd, cd) = ((p as f32) / scale, (c as f32) / scale);
        // `alpha sum a b` = D - bias - beta C before the output's rounding, so |that| less
        // the rounding is <= S (up to the CPU's own f32 rounding): the bound with it is at
        // most the exact one, and a pass stays a pass.
        // A bias on a device gives no estimate (the twin read a download of it): the exact S.
        let bias = match call.params.bias {
            None => Some(0.0),
            Some(b) => b.as_host().map(|b| b[index % n] as f64),
        };
        // beta = 0 ignores C, even NaN.
        let c_before = match before {
            Some(d) if beta != 0.0 => beta * d[index] as f64,
            _ => 0.0,
        };
        let rounding = ulp.relative * (cd as f64).abs() + ulp.subnormal / scale as f64;
        if let Some(bias) = bias {
            let estimate = ((cd as f64 - bias - c_before).abs() - rounding).max(0.0);
            if estimate.is_finite() && within(element_bound(call, dtype, scale, estimate, pd, cd).0) {
                continue;
            }
        }
        let s = alpha * abs_product_sum(call.a, call.b, index / n, index % n);
        let (ratio, bound) = element_bound(call, dtype, scale, s, pd, cd);
        if !within(ratio) {
            return Some(Breach {
                index,
                primary: pd as f64,
                cpu: cd as f64,
                bound,
            });
        }
    }
    None
}

/// The amax of the f32 result before the output cast: the output row's f32 tolerance,
/// else the largest element bound, `max_ij S_ij` bounded by `gemm::cpu::abs_product_sum_max`
/// (`|max |p| - max |c|| <= max |p - c|`).
pub(super) fn amax_breach(call: &GemmCall, primary: f32, cpu: f32) -> Option<Breach> {
    let row = gemm_tolerance(GemmDtype::F32, call.a.shape().1);
    if agrees(row, primary as f64, cpu as f64) {
        return None;
    }
    let s = call.params.alpha.abs() as f64 * abs_product_sum_max(call.a, call.b);
    let (ratio, bound) = element_bound(call, GemmDtype::F32, 1.0, s, primary, cpu);
    (!within(ratio)).then_some(Breach {
        index: 0,
        primary: primary as f64,
        cpu: cpu as f64,
        bound,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{GemmParams, Mat};
    use crate::tensor::{QuantizedMatrix, Scales};

    /// A bf16 output adds its rounding: `2^-7 max(|p|, |c|)` on top of the FP8 accumulation
    /// bound `S (K/32 + 2) 2^-12`; with cancellation (D = 2, S = 95, K = 64) six bf16 steps
    /// of 2 (0.094) are outside the bf16 row (0.032) and inside the bound (0.109), seven are not.
    #[test]
    fn a_bf16_output_adds_its_rounding_to_the_bound() {
        let mut av = vec![1.5f32; 32];
        av.extend([-1.5f32; 31]);
        av.push(0.5);
        let (qa, qb) = (e4m3(&av), e4m3(&[1.0; 64]));
        let (a, b) = (Operand::Fp8(Fp8Format::E4M3, &qa), Operand::Fp8(Fp8Format::E4M3, &qb));
        let params = GemmParams::default();
        let call = GemmCall {
            a: &a,
            b: &b,
            params: &params,
        };
        let judge = |p: f64| {
            first_breach(
                &call,
                &GemmResult {
                    dtype: GemmDtype::Bf16,
                    scale: 1.0,
                    primary: &[p],
                    cpu: &[2.0],
                    before: None,
                },
            )
        };
        let step = 2f64.powi(-6);
        assert!(!agrees(gemm_tolerance(GemmDtype::Bf16, 64), 2.0 + 6.0 * step, 2.0));
        assert_eq!(judge(2.0 + 6.0 * step), None);
        let breach = judge(2.0 + 7.0 * step).expect("seven steps are beyond");
        let bound = 95.0 * (64.0 / 32.0 + 2.0) * 2f64.powi(-12) + (2.0 + 7.0 * step) / 128.0 + 1e-38;
        assert!((breach.bound - bound).abs() < 1e-15, "{} vs {bound}", breach.bound);
        assert!(breach.ratio() > 1.0 && breach.ratio() < 1.2, "{}", breach.ratio());
    }

    fn e4m3(values: &[f32]) -> QuantizedMatrix {
        let table = Fp8Format::E4M3.decode_table();
        let codes = values
            .iter()
            .map(|&v| table.iter().position(|&x| x == v).expect("exact in E4M3") as u8)
            .collect();
        QuantizedMatrix::new(codes, 1, values.len(), Scales::PerTensor(1.0)).unwrap()
    }

    /// A bias on a device gives no estimate of S from the result: each element outside the
    /// output row is held to its exact bound, with the verdicts of the same bias in host memory.
    #[test]
    fn a_device_bias_holds_each_element_to_its_exact_bound() {
        use crate::gemm::Bias;
        use crate::tensor::device_values::Values;
        let av = [1.5f32; 64];
        let a = Operand::F32(Mat::new(&av, 1, 64).unwrap());
        let host_bias = [10.0f32];
        let on_gpu = super::super::device_values_tests::stand_in(0, host_bias.to_vec());
        let judge = |bias: Bias, p: f64| {
            let params = GemmParams {
                bias: Some(bias),
                ..GemmParams::default()
            };
            let call = GemmCall {
                a: &a,
                b: &a,
                params: &params,
            };
            let result = GemmResult {
                dtype: GemmDtype::F32,
                scale: 1.0,
                primary: &[p],
                cpu: &[154.0],
                before: None,
            };
            first_breach(&call, &result).map(|b| b.bound)
        };
        // S = 144 (D = 144 + bias): the order bound 2 gamma_64 144 = 1.1e-3 either way.
        for bias in [Bias::host(&host_bias), Bias::of(Values::Device(&on_gpu))] {
            assert_eq!(judge(bias, 154.001), None, "{bias:?}");
            let bound = judge(bias, 154.002).expect("beyond the order bound");
            assert!((bound - f32_order_bound(64, 144.0)).abs() < 1e-12, "{bias:?}: {bound}");
        }
    }

    /// The amax is held to the largest element bound; the O((M + N) K) magnitude bounds it from above.
    #[test]
    fn the_amax_is_held_to_the_largest_element_bound() {
        let av = [1.5f32; 64];
        let a = Operand::F32(Mat::new(&av, 1, 64).unwrap());
        let params = GemmParams::default();
        let call = GemmCall {
            a: &a,
            b: &a,
            params: &params,
        };
        // S = 144: the order bound 2 gamma_64 144 = 1.1e-3; 1e-3 passes, 2e-3 does not.
        assert_eq!(amax_breach(&call, 144.001, 144.0), None);
        let breach = amax_breach(&call, 144.002, 144.0).expect("beyond the order bound");
        assert!((breach.bound - f32_order_bound(64, 144.0)).abs() < 1e-12);
    }
}
