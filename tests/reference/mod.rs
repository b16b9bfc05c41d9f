//! A deliberately simple scalar reading of the numeric contract, shared by the
//! integration tests. Nothing here calls the code under test except the FP8
//! decode table (decoding is exact and tested exhaustively by the formats work).

#![allow(dead_code)]

use fp8_engine::format::Fp8Format;

/// Same f32, NaN equal to NaN (payloads are not part of the contract).
pub fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

pub fn fp8_max(format: Fp8Format) -> f32 {
    match format {
        Fp8Format::E4M3 => 448.0,
        Fp8Format::E5M2 => 57344.0,
    }
}

/// Largest power of two <= s, found by walking (s is a positive normal f32).
pub fn floor_pow2(s: f32) -> f32 {
    let s = s as f64;
    let mut p = 1.0f64;
    if s >= 1.0 {
        while p * 2.0 <= s {
            p *= 2.0;
        }
    } else {
        while p > s {
            p /= 2.0;
        }
    }
    p as f32
}

/// Spec 4.2: the current-scaling scale.
pub fn ref_current(amax: f32, fp8_max: f32, pow2: bool, eps: f32) -> f32 {
    if amax.is_nan() {
        return 1.0;
    }
    let amax = if eps > amax { eps } else { amax };
    if amax.is_infinite() || amax == 0.0 {
        return 1.0;
    }
    let mut s = fp8_max / amax;
    if s.is_infinite() {
        s = f32::MAX;
    }
    if pow2 { floor_pow2(s) } else { s }
}

/// Spec 4.4 read as "smallest power of two >= v, clamped to [2^-127, 2^127]".
pub fn ref_e8m0(amax: f32, fp8_max: f32) -> u8 {
    let r = (1.0f64 / fp8_max as f64) as f32;
    let v = amax * r; // an f32 multiply, as the spec says
    if v.is_nan() {
        return 0xFF;
    }
    if v.is_infinite() {
        return 0xFE;
    }
    if v == 0.0 {
        return 0;
    }
    let v = v.abs() as f64;
    let mut k: i32 = -127;
    let mut p = 2f64.powi(-127);
    while p < v && k < 127 {
        p *= 2.0;
        k += 1;
    }
    (k + 127) as u8
}

/// `2^(127 - e)` as f32 (exact), via f64.
pub fn e8m0_multiplier(e: u8) -> f32 {
    2f64.powi(127 - e as i32) as f32
}

/// `max |x|`: NaN ignored (a comparison with NaN is false), inf kept, 0 if empty.
pub fn ref_amax(values: impl IntoIterator<Item = f32>) -> f32 {
    let mut m = 0.0f32;
    for x in values {
        if x.abs() > m {
            m = x.abs();
        }
    }
    m
}

/// Saturating round-to-nearest-even cast by searching the decode table: the
/// nearest non-negative code to `|x|` (clamped to max finite), ties to the even
/// code, sign copied from `x`.
pub fn ref_encode(format: Fp8Format, x: f32) -> u8 {
    let max_code: u8 = match format {
        Fp8Format::E4M3 => 0x7E,
        Fp8Format::E5M2 => 0x7B,
    };
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = (x.abs() as f64).min(fp8_max(format) as f64);
    let value = |c: u8| format.decode(c) as f64;
    // Codes 0..=max_code are increasing in value: find the first one >= a.
    let (mut lo, mut hi) = (0u8, max_code);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if value(mid) < a { lo = mid + 1 } else { hi = mid }
    }
    let above = lo;
    let best = if above == 0 {
        0
    } else {
        let below = above - 1;
        let (d_below, d_above) = (a - value(below), value(above) - a);
        if d_below < d_above || (d_below == d_above && below % 2 == 0) {
            below
        } else {
            above
        }
    };
    best | sign
}

/// Codes are equal, or both NaN.
pub fn same_code(format: Fp8Format, a: u8, b: u8) -> bool {
    a == b || (format.is_nan(a) && format.is_nan(b))
}

/// `[rows, cols]` -> `[cols, rows]`.
pub fn transpose<T: Copy>(x: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for j in 0..cols {
        for i in 0..rows {
            out.push(x[i * cols + j]);
        }
    }
    out
}

/// Half the FP8 spacing at magnitude `y` (below max finite).
pub fn half_ulp(format: Fp8Format, y: f64) -> f64 {
    let (man_bits, min_normal_exp) = match format {
        Fp8Format::E4M3 => (3, -6),
        Fp8Format::E5M2 => (2, -14),
    };
    let exp = if y < 2f64.powi(min_normal_exp) {
        min_normal_exp
    } else {
        y.log2().floor() as i32
    };
    2f64.powi(exp - man_bits) / 2.0
}
