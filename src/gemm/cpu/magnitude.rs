//! `S_ij = sum_k |a_ik b_jk| sA sB`, the magnitude a GEMM's error bounds scale
//! with (`backend::cuda::error_bound`, `docs/numerics.md` GEMM), in f64: each
//! product times its own K block's scale_invs (1x128, 128x128, MXFP8) and the
//! per-tensor scale_invs once. `alpha` is the caller's to apply.

use super::super::operand::Operand;
use super::scales::{RowScales, tensor_scale};
use crate::tensor::Scales;

/// `|value|` of `op` at (`row`, `kk`) times its scale_inv there.
fn scaled_abs(op: &Operand, scales: RowScales, block: usize, row: usize, kk: usize) -> f64 {
    let k = op.shape().1;
    let (row_stride, k_stride) = op.strides();
    let at = row * row_stride + kk * k_stride;
    let value = match op {
        Operand::Fp8(format, q) => format.decode(q.data()[at]) as f64,
        Operand::F32(m) => m.data[at] as f64,
        Operand::Bf16(m) => m.data[at].to_f64(),
        Operand::F16(m) => m.data[at].to_f64(),
    };
    value.abs() * scales.get(row, kk / block, k.div_ceil(block)) as f64
}

/// The K block of an operand's block scales (MXFP8 32, block scales 128; 1 where none).
fn k_block(op: &Operand) -> usize {
    match op {
        Operand::Fp8(_, q) => match q.scales() {
            Scales::Mxfp8(_) => 32,
            Scales::Block1x128(_) | Scales::Block128x128(_) => 128,
            Scales::PerTensor(_) => 1,
        },
        _ => 1,
    }
}

/// `S_ij / |alpha|` of output (`i`, `j`) of `A B^T` (`i < rows of A`, `j < rows of B`).
/// O(K); NaN if a value or scale there is NaN.
pub(crate) fn abs_product_sum(a: &Operand, b: &Operand, i: usize, j: usize) -> f64 {
    let (sa, sb) = (RowScales::of(a), RowScales::of(b));
    let (ba, bb) = (k_block(a), k_block(b));
    let sum: f64 = (0..a.shape().1)
        .map(|kk| scaled_abs(a, sa, ba, i, kk) * scaled_abs(b, sb, bb, j, kk))
        .sum();
    sum * tensor_scale(a) as f64 * tensor_scale(b) as f64
}

/// An upper bound on `max_ij S_ij / |alpha|`: `sum_k max_i |a_ik| sA * max_j |b_jk| sB`,
/// in O((M + N) K) rather than the O(M N K) of every `S_ij` (the bound on an amax).
pub(crate) fn abs_product_sum_max(a: &Operand, b: &Operand) -> f64 {
    let column_max = |op: &Operand| -> Vec<f64> {
        let (scales, block) = (RowScales::of(op), k_block(op));
        let (rows, k) = op.shape();
        let mut max = vec![0.0f64; k];
        for row in 0..rows {
            for (kk, m) in max.iter_mut().enumerate() {
                // NaN wins, so a NaN anywhere makes the bound NaN (a breach, never a pass).
                let v = scaled_abs(op, scales, block, row, kk);
                if v > *m || v.is_nan() {
                    *m = v;
                }
            }
        }
        max
    };
    let sum: f64 = column_max(a).iter().zip(column_max(b)).map(|(x, y)| x * y).sum();
    sum * tensor_scale(a) as f64 * tensor_scale(b) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Fp8Format::E4M3;
    use crate::gemm::Mat;
    use crate::tensor::QuantizedMatrix;

    fn code(v: f32) -> u8 {
        E4M3.decode_table().iter().position(|&x| x == v).expect("exact in E4M3") as u8
    }

    /// Hand sums: each K block's products times that block's scale_invs.
    #[test]
    fn block_and_mxfp8_scales_weigh_their_own_k_block() {
        // K = 256: A row 0 is 1.5 then -2 (blocks of 128), row 1 all 0.5; B row 0 all 1.
        let mut a: Vec<u8> = vec![code(1.5); 128];
        a.extend(vec![code(-2.0); 128]);
        a.extend(vec![code(0.5); 256]);
        let b = vec![code(1.0); 256];
        let qa = QuantizedMatrix::new(a.clone(), 2, 256, Scales::Block1x128(vec![2.0, 0.25, 1.0, 4.0])).unwrap();
        let qb = QuantizedMatrix::new(b.clone(), 1, 256, Scales::Block1x128(vec![0.5, 8.0])).unwrap();
        let (oa, ob) = (Operand::Fp8(E4M3, &qa), Operand::Fp8(E4M3, &qb));
        // 128 (1.5 * 2 * 0.5) + 128 (2 * 0.25 * 8) = 192 + 512.
        assert_eq!(abs_product_sum(&oa, &ob, 0, 0), 704.0);
        // 128 (0.5 * 1 * 0.5) + 128 (0.5 * 4 * 8) = 32 + 2048.
        assert_eq!(abs_product_sum(&oa, &ob, 1, 0), 2080.0);
        // Column maxima: block 0 max(1.5 * 2, 0.5) = 3, block 1 max(0.5, 2) = 2 times 8.
        assert_eq!(abs_product_sum_max(&oa, &ob), 128.0 * 3.0 * 0.5 + 128.0 * 2.0 * 8.0);
        // MXFP8: E8M0 128 is 2^1, 125 is 2^-2, per 32 of K.
        let qa = QuantizedMatrix::new(a[..64].to_vec(), 1, 64, Scales::Mxfp8(vec![128, 125])).unwrap();
        let qb = QuantizedMatrix::new(b[..64].to_vec(), 1, 64, Scales::Mxfp8(vec![127, 127])).unwrap();
        let (oa, ob) = (Operand::Fp8(E4M3, &qa), Operand::Fp8(E4M3, &qb));
        assert_eq!(abs_product_sum(&oa, &ob, 0, 0), 32.0 * 1.5 * 2.0 + 32.0 * 1.5 * 0.25);
        // Per tensor: the two scale_invs once.
        let qa = QuantizedMatrix::new(a[..256].to_vec(), 1, 256, Scales::PerTensor(0.5)).unwrap();
        let qb = QuantizedMatrix::new(b, 1, 256, Scales::PerTensor(3.0)).unwrap();
        let (oa, ob) = (Operand::Fp8(E4M3, &qa), Operand::Fp8(E4M3, &qb));
        assert_eq!(abs_product_sum(&oa, &ob, 0, 0), (128.0 * 1.5 + 128.0 * 2.0) * 1.5);
    }

    #[test]
    fn plain_operands_read_through_their_strides() {
        // A = [[1, -2], [3, 4]] read from its transpose; B = [[-1, 0.5]].
        let at = [1.0f32, 3.0, -2.0, 4.0];
        let a = Operand::F32(Mat::transposed(&at, 2, 2).unwrap());
        let b = Operand::F32(Mat::new(&[-1.0f32, 0.5], 1, 2).unwrap());
        assert_eq!(abs_product_sum(&a, &b, 0, 0), 2.0);
        assert_eq!(abs_product_sum(&a, &b, 1, 0), 5.0);
        assert_eq!(abs_product_sum_max(&a, &b), 3.0 + 2.0);
        let nan = Operand::F32(Mat::new(&[f32::NAN, 1.0], 1, 2).unwrap());
        assert!(abs_product_sum(&nan, &b, 0, 0).is_nan());
        assert!(abs_product_sum_max(&nan, &b).is_nan());
    }
}
