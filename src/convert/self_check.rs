//! The check a SIMD path passes before `Isa::best` trusts it: every
//! conversion on edge and random inputs, compared bit for bit with the scalar
//! path. Kept small (a few ms) because it runs on the first conversion.

use half::{bf16, f16};

use super::{HighPrecision, Isa, dispatch, scalar};
use crate::format::{Fp8Format, Overflow};

/// Quantize scales: neutral, halving, inexact, tiny, huge, subnormal.
const QUANTIZE_SCALES: [f32; 7] = [1.0, 0.5, 3.7, 1e-30, f32::MAX, 1e-45, 0.012_345];
/// Dequantize scales: the same spirit, with underflow and overflow of the product.
const DEQUANTIZE_SCALES: [f32; 7] = [1.0, 0.5, 3.7, 1e-30, f32::MAX, 1e-45, 1.0 / 448.0];
/// Slice lengths swept to cover every tail of a 64-element step, twice over.
const MAX_SWEPT_LEN: usize = 2 * 64 + 3;

/// Conversion kernels to compare with the scalar path.
pub(super) trait Kernels {
    fn quantize<T: HighPrecision>(&self, src: &[T], dst: &mut [u8], format: Fp8Format, scale: f32, o: Overflow) -> f32;
    fn dequantize<T: HighPrecision>(&self, src: &[u8], dst: &mut [T], format: Fp8Format, scale_inv: f32);
}

/// The kernels of an instruction set this CPU has.
struct Available(Isa);

impl Kernels for Available {
    fn quantize<T: HighPrecision>(&self, src: &[T], dst: &mut [u8], format: Fp8Format, scale: f32, o: Overflow) -> f32 {
        // SAFETY: `Available` is only built for an instruction set that `is_available`.
        unsafe { dispatch::quantize(self.0, src, dst, format, scale, o) }
    }

    fn dequantize<T: HighPrecision>(&self, src: &[u8], dst: &mut [T], format: Fp8Format, scale_inv: f32) {
        // SAFETY: as above.
        unsafe { dispatch::dequantize(self.0, src, dst, format, scale_inv) }
    }
}

/// The first difference between `isa` and the scalar path, described; `None` if none.
pub(super) fn first_mismatch(isa: Isa) -> Option<String> {
    if !isa.is_available() {
        return Some(format!("{isa} is not available"));
    }
    first_mismatch_of(&Available(isa))
}

/// The first difference between `kernels` and the scalar path, described.
pub(super) fn first_mismatch_of(kernels: &impl Kernels) -> Option<String> {
    let values = f32_inputs();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let bf16_values: Vec<bf16> = values
        .iter()
        .map(|&x| bf16::from_f32(x))
        .chain((0..512).map(|_| bf16::from_bits(rng.next() as u16)))
        .collect();
    let f16_values: Vec<f16> = values
        .iter()
        .map(|&x| f16::from_f32(x))
        .chain((0..512).map(|_| f16::from_bits(rng.next() as u16)))
        .collect();
    // NaNs as the last element of every lane: a max that lets NaN through shows here.
    let nan_last: Vec<f32> = values[..256]
        .iter()
        .copied()
        .chain([f32::NAN, -f32::NAN].repeat(64))
        .collect();
    let codes: Vec<u8> = (0..1024u32)
        .map(|i| (i.wrapping_mul(37).wrapping_add(i / 256)) as u8)
        .collect();
    quantize_mismatch(kernels, &values)
        .or_else(|| quantize_mismatch(kernels, &nan_last))
        .or_else(|| quantize_mismatch(kernels, &bf16_values))
        .or_else(|| quantize_mismatch(kernels, &f16_values))
        .or_else(|| dequantize_mismatch::<f32>(kernels, &codes))
        .or_else(|| dequantize_mismatch::<bf16>(kernels, &codes))
        .or_else(|| dequantize_mismatch::<f16>(kernels, &codes))
}

fn quantize_mismatch<T: HighPrecision + Bits>(kernels: &impl Kernels, values: &[T]) -> Option<String> {
    for format in Fp8Format::ALL {
        for overflow in [Overflow::Saturate, Overflow::NonSaturating] {
            for (i, &scale) in QUANTIZE_SCALES.iter().enumerate() {
                // The whole set once per scale; the tail sweep for two scales keeps this quick.
                let ranges = std::iter::once((0, values.len()))
                    .chain((0..=MAX_SWEPT_LEN).filter(|_| i < 3).map(|len| (1 + len % 5, len)));
                for (start, len) in ranges {
                    let src = &values[start..start + len];
                    let mut want = vec![0u8; len];
                    let mut got = vec![0u8; len];
                    let want_amax = scalar::quantize(src, &mut want, format, scale, overflow);
                    let got_amax = kernels.quantize(src, &mut got, format, scale, overflow);
                    let case = || {
                        format!(
                            "quantize {} -> {format} {overflow:?} scale {scale:e} len {len}",
                            T::NAME
                        )
                    };
                    if let Some(k) = (0..len).find(|&k| want[k] != got[k]) {
                        return Some(format!(
                            "{}: element {k} (bits {:#x}) gave {:#04x}, scalar {:#04x}",
                            case(),
                            src[k].bits(),
                            got[k],
                            want[k]
                        ));
                    }
                    if want_amax.to_bits() != got_amax.to_bits() {
                        return Some(format!("{}: amax {got_amax:e}, scalar {want_amax:e}", case()));
                    }
                }
            }
        }
    }
    None
}

fn dequantize_mismatch<T: HighPrecision + Bits>(kernels: &impl Kernels, codes: &[u8]) -> Option<String> {
    for format in Fp8Format::ALL {
        for (i, &scale_inv) in DEQUANTIZE_SCALES.iter().enumerate() {
            let ranges = std::iter::once((0, codes.len()))
                .chain((0..=MAX_SWEPT_LEN).filter(|_| i < 3).map(|len| (1 + len % 5, len)));
            for (start, len) in ranges {
                let src = &codes[start..start + len];
                let mut want = vec![T::from_f32(0.0); len];
                let mut got = vec![T::from_f32(0.0); len];
                scalar::dequantize(src, &mut want, format, scale_inv);
                kernels.dequantize(src, &mut got, format, scale_inv);
                if let Some(k) = (0..len).find(|&k| want[k].bits() != got[k].bits()) {
                    return Some(format!(
                        "dequantize {format} -> {} scale_inv {scale_inv:e} len {len}: code {:#04x} gave bits {:#x}, scalar {:#x}",
                        T::NAME,
                        src[k],
                        got[k].bits(),
                        want[k].bits()
                    ));
                }
            }
        }
    }
    None
}

/// Raw bits, to compare outputs NaN payloads included.
pub(super) trait Bits {
    fn bits(self) -> u32;
}

impl Bits for f32 {
    fn bits(self) -> u32 {
        self.to_bits()
    }
}

impl Bits for bf16 {
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
}

impl Bits for f16 {
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
}

/// Edge values, every FP8 value with its rounding ties and their neighbours,
/// and random values: about 3,500 f32.
fn f32_inputs() -> Vec<f32> {
    let mut values = vec![
        0.0,
        f32::from_bits(1),
        f32::from_bits(0x007F_FFFF),
        f32::MIN_POSITIVE,
        448.0,
        464.0,
        480.0,
        512.0,
        57344.0,
        61440.0,
        65536.0,
        f32::MAX,
        f32::INFINITY,
        f32::NAN,
        f32::from_bits(0x7F80_0001), // signalling NaN
        f32::from_bits(0x7FFF_FFFF),
    ];
    for format in Fp8Format::ALL {
        let table = format.decode_table();
        for code in 0..0x7Fu8 {
            let (low, high) = (table[code as usize], table[code as usize + 1]);
            if !low.is_finite() || !high.is_finite() {
                continue;
            }
            let tie = (low + high) / 2.0; // exact: FP8 values have few mantissa bits
            values.extend([low, tie, tie.next_down(), tie.next_up()]);
        }
    }
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    for _ in 0..1024 {
        values.push(f32::from_bits(rng.next() as u32));
        // A normal in [1, 2) times 2^-24..2^23: dense around both formats' ranges.
        let mantissa = 1.0 + (rng.next() >> 41) as f32 / (1u64 << 23) as f32;
        values.push(mantissa * 2f32.powi((rng.next() % 48) as i32 - 24));
    }
    let negated: Vec<f32> = values.iter().map(|x| -x).collect();
    values.extend(negated);
    // Shuffle so that edge values land in every lane position and tail.
    for i in (1..values.len()).rev() {
        values.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    values
}

/// xorshift64*: a fixed, dependency-free stream of random bits.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar path with one deliberate fault, to show the check catches it.
    enum Fault {
        /// The E4M3 non-saturating tie at 464 rounds up (to NaN) instead of to even.
        TieAt464,
        /// The amax lets a NaN through, as a max with the wrong operand order would.
        NanInAmax,
        /// The last element of slices longer than 64 is left unwritten.
        SkippedTail,
        /// NaN codes dequantize to a NaN with a different payload.
        NanPayload,
        /// f16 outputs round toward zero.
        F16Truncates,
    }

    impl Kernels for Fault {
        fn quantize<T: HighPrecision>(
            &self,
            src: &[T],
            dst: &mut [u8],
            format: Fp8Format,
            scale: f32,
            o: Overflow,
        ) -> f32 {
            let amax = scalar::quantize(src, dst, format, scale, o);
            match self {
                Fault::TieAt464 => {
                    for (x, q) in src.iter().zip(dst.iter_mut()) {
                        if format == Fp8Format::E4M3 && (x.to_f32() * scale).abs() == 464.0 {
                            *q |= 0x7F;
                        }
                    }
                }
                Fault::NanInAmax if src.last().is_some_and(|x| x.to_f32().is_nan()) => return f32::NAN,
                Fault::SkippedTail if src.len() > 64 => dst[src.len() - 1] = 0,
                _ => {}
            }
            amax
        }

        fn dequantize<T: HighPrecision>(&self, src: &[u8], dst: &mut [T], format: Fp8Format, scale_inv: f32) {
            scalar::dequantize(src, dst, format, scale_inv);
            for (&q, y) in src.iter().zip(dst.iter_mut()) {
                let exact = format.decode(q) * scale_inv;
                match self {
                    Fault::NanPayload if format.is_nan(q) => *y = T::from_f32(f32::from_bits(0x7FE0_0000)),
                    Fault::F16Truncates if T::NAME == "f16" && exact.is_finite() => {
                        let rounded = f16::from_f32(exact);
                        if rounded.to_f32().abs() > exact.abs() {
                            // One f16 step toward zero; exactly representable, so `from_f32` keeps it.
                            *y = T::from_f32(f16::from_bits(rounded.to_bits() - 1).to_f32());
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn scalar_passes() {
        assert_eq!(first_mismatch(Isa::Scalar), None);
    }

    #[test]
    fn every_fault_is_caught() {
        for (fault, expected) in [
            (Fault::TieAt464, "quantize f32 -> e4m3"),
            (Fault::NanInAmax, "amax"),
            (Fault::SkippedTail, "quantize f32"),
            (Fault::NanPayload, "dequantize e4m3 -> f32"),
            (Fault::F16Truncates, "-> f16"),
        ] {
            let report = first_mismatch_of(&fault).unwrap_or_else(|| panic!("fault not caught: {expected}"));
            assert!(report.contains(expected), "{report}");
        }
    }
}
