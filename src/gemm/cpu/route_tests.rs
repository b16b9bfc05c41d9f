//! The fast routes of the CPU GEMM (our packed kernel for f32 outputs; a K-major B through its
//! transpose and f32 outputs finished in place on the crate) against the tile route they
//! replace: the same bits and amax on every shape, operand type, scale layout, epilogue and
//! output, ragged tiles and K tails included. Shapes whose
//! calls are not all layout-free take the tile route either way; they are here to show that
//! the gate keeps them there.

use half::{bf16, f16};

use super::{Route, gemm_routed};
use crate::format::Fp8Format;
use crate::gemm::{GemmParams, Mat, Operand, Output};
use crate::quantize::{ScaleRule, quantize_1x128, quantize_block_128x128, quantize_current, quantize_mxfp8};
use crate::tensor::QuantizedMatrix;

/// `[rows, k]` row-major values with wide magnitudes (sums that round) and a few exact zeros.
fn values(rows: usize, k: usize, seed: f32) -> Vec<f32> {
    (0..rows * k)
        .map(|i| (i as f32 * seed).sin() * 2f32.powi((i % 13) as i32 - 6))
        .collect()
}

/// The `[k, rows]` row-major transpose of `[rows, k]` values.
fn transpose(x: &[f32], rows: usize, k: usize) -> Vec<f32> {
    (0..rows * k).map(|i| x[(i % rows) * k + i / rows]).collect()
}

/// Every output type, as freshly made buffers holding `old` (f32) or its cast.
enum Out {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    Fp8(Vec<u8>),
}

impl Out {
    fn fresh(kind: usize, old: &[f32]) -> Out {
        match kind {
            0 => Out::F32(old.to_vec()),
            1 => Out::Bf16(old.iter().map(|&v| bf16::from_f32(v)).collect()),
            _ => Out::Fp8(vec![0x7f; old.len()]),
        }
    }

    fn output(&mut self) -> Output<'_> {
        match self {
            Out::F32(d) => Output::F32(d),
            Out::Bf16(d) => Output::Bf16(d),
            Out::Fp8(d) => Output::Fp8 {
                codes: d,
                format: Fp8Format::E4M3,
                scale: 4.0,
            },
        }
    }

    fn bits(&self) -> Vec<u32> {
        match self {
            Out::F32(d) => d.iter().map(|v| v.to_bits()).collect(),
            Out::Bf16(d) => d.iter().map(|v| u32::from(v.to_bits())).collect(),
            Out::Fp8(d) => d.iter().map(|&v| u32::from(v)).collect(),
        }
    }
}

/// Runs `a x b` on both routes with every epilogue the output allows and asserts equal bits.
fn assert_routes_agree(what: &str, a: &Operand, b: &Operand, m: usize, n: usize, split: &[bool]) {
    let bias = values(1, n, 0.219);
    let old = values(m, n, 0.113);
    for out_kind in 0..3 {
        // beta != 0 reads the old f32 output (and keeps the tile route); other outputs refuse it.
        let betas: &[f32] = if out_kind == 0 { &[0.0, 0.5] } else { &[0.0] };
        for &beta in betas {
            for (alpha, bias) in [(1.0, None), (0.375, Some(&bias[..]))] {
                for &split_accumulator in split {
                    let params = GemmParams {
                        alpha,
                        beta,
                        bias: bias.map(crate::gemm::Bias::host),
                        split_accumulator,
                        report_amax: true,
                    };
                    let [fast, fast_crate, tiles] = [Route::Fast, Route::FastCrate, Route::Tiles].map(|route| {
                        let mut out = Out::fresh(out_kind, &old);
                        let amax = gemm_routed(a, b, out.output(), &params, route).unwrap().amax;
                        (out.bits(), amax.to_bits())
                    });
                    for (route, (got, got_amax)) in [("fast", fast), ("fast crate", fast_crate)] {
                        let case = format!(
                            "{what} {m}x{n}, {route} route: output {out_kind}, alpha {alpha}, beta {beta}, \
                             bias {}, split {split_accumulator}",
                            bias.is_some()
                        );
                        assert_eq!(got_amax, tiles.1, "amax, {case}");
                        let first = got.iter().zip(tiles.0.iter()).position(|(x, y)| x != y);
                        assert!(first.is_none(), "element {first:?} differs, {case}");
                    }
                }
            }
        }
    }
}

/// Ragged M and N against every tile and band size, K with ragged 512-chunks and 128-blocks,
/// and (last three) shapes that must stay on the tile route (a K block of 2, tiny outputs, one row).
const SHAPES: [(usize, usize, usize); 9] = [
    (384, 320, 384),
    (1000, 700, 100),
    (300, 130, 1030),
    (130, 70, 260),
    (64, 640, 64),
    (192, 200, 33),
    (77, 65, 258),
    (16, 16, 64),
    (1, 64, 64),
];

/// The same for FP8, whose K is a multiple of 16: ragged 128- and 32-blocks (1040, 272, 48).
const FP8_SHAPES: [(usize, usize, usize); 7] = [
    (384, 320, 384),
    (1000, 700, 112),
    (300, 130, 1040),
    (130, 70, 272),
    (192, 200, 48),
    (16, 16, 64),
    (1, 64, 64),
];

#[test]
fn plain_operands_take_either_route_with_the_same_bits() {
    for (m, n, k) in SHAPES {
        let (a, b) = (values(m, k, 0.731), values(n, k, 0.377));
        let bt = transpose(&b, n, k);
        let f32_a = Operand::F32(Mat::new(&a, m, k).unwrap());
        // B K-major (transposed by the fast route) and stored transposed (read in place).
        for b_op in [
            Operand::F32(Mat::new(&b, n, k).unwrap()),
            Operand::F32(Mat::transposed(&bt, n, k).unwrap()),
        ] {
            assert_routes_agree("f32", &f32_a, &b_op, m, n, &[false]);
        }
        let (a16, b16): (Vec<bf16>, Vec<bf16>) = (
            a.iter().map(|&v| bf16::from_f32(v)).collect(),
            b.iter().map(|&v| bf16::from_f32(v)).collect(),
        );
        let (bf16_a, bf16_b) = (Mat::new(&a16, m, k).unwrap(), Mat::new(&b16, n, k).unwrap());
        assert_routes_agree("bf16", &Operand::Bf16(bf16_a), &Operand::Bf16(bf16_b), m, n, &[false]);
        let (ah, bh): (Vec<f16>, Vec<f16>) = (
            a.iter().map(|&v| f16::from_f32(v)).collect(),
            b.iter().map(|&v| f16::from_f32(v)).collect(),
        );
        let (f16_a, f16_b) = (Mat::new(&ah, m, k).unwrap(), Mat::new(&bh, n, k).unwrap());
        assert_routes_agree("f16", &Operand::F16(f16_a), &Operand::F16(f16_b), m, n, &[false]);
    }
}

#[test]
fn fp8_operands_take_either_route_with_the_same_bits() {
    let rule = |format| ScaleRule {
        format,
        power_2_scale: false,
        amax_epsilon: 0.0,
    };
    let e4m3 = rule(Fp8Format::E4M3);
    for (m, n, k) in FP8_SHAPES {
        let (a, b) = (values(m, k, 0.731), values(n, k, 0.377));
        let rowwise = |q: crate::tensor::QuantizedTensor| -> QuantizedMatrix { q.into_parts().1 };
        let per_tensor =
            |x: &[f32], rows, rule: &ScaleRule| rowwise(quantize_current(x, rows, k, rule, false).unwrap().0);
        // E4M3 x E4M3 and E4M3 x E5M2 (the backward's pair), per-tensor scales on both split modes.
        let qa = per_tensor(&a, m, &e4m3);
        for (format, qb) in [
            (Fp8Format::E4M3, per_tensor(&b, n, &e4m3)),
            (Fp8Format::E5M2, per_tensor(&b, n, &rule(Fp8Format::E5M2))),
        ] {
            let (oa, ob) = (Operand::Fp8(Fp8Format::E4M3, &qa), Operand::Fp8(format, &qb));
            assert_routes_agree("fp8 per-tensor", &oa, &ob, m, n, &[false, true]);
        }
        // Block scales: 1x128 x 128x128, 1x128 x 1x128, MXFP8 x MXFP8.
        let a_rows = rowwise(quantize_1x128(&a, m, k, &e4m3, false).unwrap());
        let b_rows = rowwise(quantize_1x128(&b, n, k, &e4m3, false).unwrap());
        let b_tiles = rowwise(quantize_block_128x128(&b, n, k, &e4m3, false).unwrap());
        let a_mx = rowwise(quantize_mxfp8(&a, m, k, Fp8Format::E4M3, false).unwrap());
        let b_mx = rowwise(quantize_mxfp8(&b, n, k, Fp8Format::E4M3, false).unwrap());
        for (what, qa, qb) in [
            ("fp8 1x128 x 128x128", &a_rows, &b_tiles),
            ("fp8 1x128 x 1x128", &a_rows, &b_rows),
            ("mxfp8", &a_mx, &b_mx),
        ] {
            let (oa, ob) = (Operand::Fp8(Fp8Format::E4M3, qa), Operand::Fp8(Fp8Format::E4M3, qb));
            assert_routes_agree(what, &oa, &ob, m, n, &[true]);
        }
    }
}
