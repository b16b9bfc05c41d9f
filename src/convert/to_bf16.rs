//! FP8 codes -> bf16, exactly (every finite FP8 value has at most 4 significant bits and an
//! exponent within bf16's range): the operands of the pair-order GEMMs (`gemm/cpu/pairs.rs`).
//! One 256-entry table per format, `bf16::from_f32(format.decode(code))`, NaNs included, so
//! the result is the general dequantizer's at scale 1 by construction; the AVX-512BW body
//! looks 32 codes up at a time in registers (four 64-entry `vpermt2w` lookups and two blends)
//! instead of decoding through f16 and f32 and rounding back.

use std::sync::OnceLock;

use half::bf16;

use crate::format::Fp8Format;

/// The bf16 bits of every code of `format`.
fn table(format: Fp8Format) -> &'static [u16; 256] {
    static TABLES: OnceLock<[[u16; 256]; 2]> = OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        [Fp8Format::E4M3, Fp8Format::E5M2].map(|f| std::array::from_fn(|c| bf16::from_f32(f.decode(c as u8)).to_bits()))
    });
    match format {
        Fp8Format::E4M3 => &tables[0],
        Fp8Format::E5M2 => &tables[1],
    }
}

/// `out[i] = ` the value of `codes[i]` in `format`, as bf16.
///
/// # Panics
/// If the lengths differ.
pub fn fp8_to_bf16(codes: &[u8], out: &mut [bf16], format: Fp8Format) {
    assert_eq!(codes.len(), out.len(), "fp8_to_bf16: lengths");
    let table = table(format);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU has AVX-512BW (and so AVX-512F), checked just above.
        unsafe { avx512::lookup(codes, out, table) };
        return;
    }
    lookup_scalar(codes, out, table);
}

fn lookup_scalar(codes: &[u8], out: &mut [bf16], table: &[u16; 256]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = bf16::from_bits(table[c as usize]);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use half::bf16;

    /// [`super::lookup_scalar`] 32 codes at a time.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX-512BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn lookup(codes: &[u8], out: &mut [bf16], table: &[u16; 256]) {
        // SAFETY (loads and stores): `table` is 256 u16, read in eight 32-entry vectors; each
        // step reads 32 codes and writes 32 values within the slices' equal lengths.
        let quarter = |q: usize| unsafe {
            (
                _mm512_loadu_si512(table.as_ptr().add(64 * q).cast()),
                _mm512_loadu_si512(table.as_ptr().add(64 * q + 32).cast()),
            )
        };
        let quarters = [quarter(0), quarter(1), quarter(2), quarter(3)];
        let (bit6, bit7) = (_mm512_set1_epi16(0x40), _mm512_set1_epi16(0x80));
        let mut code_steps = codes.chunks_exact(32);
        let mut out_steps = out.chunks_exact_mut(32);
        for (c, o) in (&mut code_steps).zip(&mut out_steps) {
            let index = _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(c.as_ptr().cast()) });
            // Each quarter's 64 entries, looked up by the code's low 6 bits.
            let [r0, r1, r2, r3] = quarters.map(|(lo, hi)| _mm512_permutex2var_epi16(lo, index, hi));
            let odd_quarter = _mm512_test_epi16_mask(index, bit6);
            let low_half = _mm512_mask_blend_epi16(odd_quarter, r0, r1);
            let high_half = _mm512_mask_blend_epi16(odd_quarter, r2, r3);
            let value = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(index, bit7), low_half, high_half);
            unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), value) };
        }
        // Within 32 of the end: the scalar loop.
        super::lookup_scalar(code_steps.remainder(), out_steps.into_remainder(), table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code of both formats, at every position of a 32-code step and in the tails, is
    /// `bf16::from_f32(decode(code))` to the bit (NaNs included), on the body this CPU runs and
    /// on the scalar one.
    #[test]
    fn every_code_is_its_decoded_value() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for len in [0, 1, 31, 32, 33, 256, 256 + 7, 1000] {
                for offset in [0usize, 5, 31] {
                    let codes: Vec<u8> = (0..len).map(|i| ((i * 7 + offset * 13) % 256) as u8).collect();
                    let (mut out, mut scalar) = (vec![bf16::from_bits(0x1234); len], vec![bf16::ZERO; len]);
                    fp8_to_bf16(&codes, &mut out, format);
                    lookup_scalar(&codes, &mut scalar, table(format));
                    for ((&c, got), s) in codes.iter().zip(&out).zip(&scalar) {
                        let want = bf16::from_f32(format.decode(c));
                        assert_eq!(got.to_bits(), want.to_bits(), "{format:?} code {c:#04x}, length {len}");
                        assert_eq!(s.to_bits(), want.to_bits(), "scalar, {format:?} code {c:#04x}");
                    }
                }
            }
        }
    }

    /// The general dequantizer at scale 1 gives the same bits (the path this replaces in the
    /// GEMM packing).
    #[test]
    fn equals_the_dequantizer_at_scale_one() {
        let codes: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let (mut fast, mut general) = (vec![bf16::ZERO; codes.len()], vec![bf16::ZERO; codes.len()]);
            fp8_to_bf16(&codes, &mut fast, format);
            crate::convert::dequantize(&codes, &mut general, format, 1.0).unwrap();
            for (i, (f, g)) in fast.iter().zip(&general).enumerate() {
                assert_eq!(f.to_bits(), g.to_bits(), "{format:?} code {:#04x}", codes[i]);
            }
        }
    }
}
