//! Deliberately simple references shared by the format tests.
#![allow(dead_code)] // each test binary uses a different subset

pub mod out_buf;

use fp8_engine::format::{Fp8Format, Overflow};

/// The value of an IEEE-style 8-bit code from its fields (numerics.md section 1):
/// normal `(-1)^s 2^(e-bias) (1 + m/2^M)`, subnormal `(-1)^s 2^(1-bias) m/2^M`.
pub fn value_from_fields(code: u8, exp_bits: u32, man_bits: u32, bias: i32) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> man_bits) as u32 & ((1 << exp_bits) - 1)) as i32;
    let m = (code as u32 & ((1 << man_bits) - 1)) as f64;
    let frac = m / f64::from(1u32 << man_bits);
    if e == 0 {
        sign * 2f64.powi(1 - bias) * frac
    } else {
        sign * 2f64.powi(e - bias) * (1.0 + frac)
    }
}

/// What a reference cast of a magnitude gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounded {
    Code(u8),
    Overflow,
}

/// Nearest-code search in f64 over the non-negative representable values,
/// ties to the even code. One virtual value above max finite (the next value
/// the exponent range would give) decides the top tie as IEEE does: rounding
/// to it means overflow.
pub struct NearestCode {
    values: Vec<f64>,
    codes: Vec<u8>,
}

impl NearestCode {
    /// Grid of an FP8 data format, from the field formula.
    pub fn fp8(format: Fp8Format) -> Self {
        let (exp_bits, man_bits, bias, max_code) = match format {
            Fp8Format::E4M3 => (4, 3, 7, 0x7Eu8),
            Fp8Format::E5M2 => (5, 2, 15, 0x7Bu8),
        };
        let mut codes: Vec<u8> = (0..=max_code).collect();
        let mut values: Vec<f64> = codes
            .iter()
            .map(|&c| value_from_fields(c, exp_bits, man_bits, bias))
            .collect();
        let top = values[max_code as usize];
        let ulp_top = top - values[max_code as usize - 1];
        values.push(top + ulp_top); // E4M3: 480 (code 0x7F), E5M2: 65536 (code 0x7C)
        codes.push(max_code + 1);
        NearestCode { values, codes }
    }

    /// Grid of E8M0: 2^-127 ..= 2^127, then virtual 2^128 (code 0xFF).
    pub fn e8m0() -> Self {
        let codes: Vec<u8> = (0..=255).collect();
        let values = codes.iter().map(|&c| 2f64.powi(c as i32 - 127)).collect();
        NearestCode { values, codes }
    }

    /// Index of the largest grid value <= a (0 when a is below the grid).
    pub fn floor_index(&self, a: f64) -> usize {
        self.values.partition_point(|&v| v <= a).saturating_sub(1)
    }

    /// Rounds magnitude `a` (>= 0, not NaN), starting from `floor_index(a)`:
    /// callers sweeping `a` upwards can advance the index themselves.
    pub fn round_from(&self, a: f64, mut i: usize) -> (Rounded, usize) {
        let last = self.values.len() - 1;
        while i < last && self.values[i + 1] <= a {
            i += 1;
        }
        let pick = if i == last {
            last
        } else if a <= self.values[i] {
            i // below the grid or exactly on a value
        } else {
            let (down, up) = (a - self.values[i], self.values[i + 1] - a);
            if down < up || (down == up && self.codes[i].is_multiple_of(2)) {
                i
            } else {
                i + 1
            }
        };
        let rounded = if pick == last {
            Rounded::Overflow
        } else {
            Rounded::Code(self.codes[pick])
        };
        (rounded, i)
    }

    pub fn round(&self, a: f64) -> Rounded {
        self.round_from(a, self.floor_index(a)).0
    }
}

/// The code the spec demands for a *signed* finite-or-inf input whose
/// magnitude rounded to `r`; `None` means "some NaN".
pub fn fp8_expected(format: Fp8Format, r: Rounded, negative: bool, overflow: Overflow) -> Option<u8> {
    let sign = if negative { 0x80 } else { 0 };
    match (r, overflow, format) {
        (Rounded::Code(c), _, _) => Some(c | sign),
        (Rounded::Overflow, Overflow::Saturate, Fp8Format::E4M3) => Some(0x7E | sign),
        (Rounded::Overflow, Overflow::Saturate, Fp8Format::E5M2) => Some(0x7B | sign),
        (Rounded::Overflow, Overflow::NonSaturating, Fp8Format::E4M3) => None,
        (Rounded::Overflow, Overflow::NonSaturating, Fp8Format::E5M2) => Some(0x7C | sign),
    }
}

/// Whether an encoder's output satisfies an expectation (`None`: any NaN).
pub fn fp8_matches(format: Fp8Format, expected: Option<u8>, got: u8) -> bool {
    match expected {
        Some(code) => got == code,
        None => format.is_nan(got),
    }
}
