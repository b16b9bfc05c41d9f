//! A deliberately simple scalar reading of the numeric contract, shared by the
//! integration tests. Nothing here calls the code under test except the FP8
//! decode table (decoding is exact and tested exhaustively by the formats work).

#![allow(dead_code)]

use fp8_engine::format::Fp8Format;
use fp8_engine::scaling::AmaxComputeAlgo;

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

/// `docs/numerics.md`, current scaling: the current-scaling scale.
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

/// The MXFP8 rule of `docs/numerics.md` read as "smallest power of two >= v, clamped to [2^-127, 2^127]".
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

/// The delayed-scaling update (`docs/numerics.md`), step by step, with no cleverness.
#[derive(Clone, Debug)]
pub struct RefSlot {
    pub scale: f32,
    pub history: Vec<f32>,
}

impl RefSlot {
    pub fn new(len: usize) -> Self {
        RefSlot {
            scale: 1.0,
            history: vec![0.0; len],
        }
    }

    pub fn update(&mut self, algo: AmaxComputeAlgo, fp8_max: f32, margin: i32) {
        let len = self.history.len();
        let last = self.history[0];
        if last == 0.0 {
            return;
        }
        let amax = match algo {
            AmaxComputeAlgo::MostRecent => last,
            AmaxComputeAlgo::Max => {
                let mut window: Vec<f32> = self.history[1..].to_vec();
                window.push(last);
                let numbers: Vec<f32> = window.iter().copied().filter(|v| !v.is_nan()).collect();
                if numbers.is_empty() {
                    f32::NAN
                } else {
                    let mut best = numbers[0];
                    for &v in &numbers {
                        if v > best {
                            best = v;
                        }
                    }
                    best
                }
            }
        };
        let mut new = vec![0.0f32; len];
        #[allow(clippy::manual_memcpy)] // the spec's formula, element by element
        for i in 1..len.saturating_sub(1) {
            new[i] = self.history[i + 1];
        }
        if len > 1 {
            new[len - 1] = last;
        }
        self.history = new;
        if amax.is_finite() && amax > 0.0 {
            let mut numerator = fp8_max;
            for _ in 0..margin {
                numerator /= 2.0;
            }
            let s = numerator / amax;
            self.scale = if s.is_infinite() { f32::MAX } else { s };
        }
    }
}

/// Per-tensor: `ref_encode(x * scale)` per element.
pub fn ref_cast(x: &[f32], format: Fp8Format, scale: f32) -> Vec<u8> {
    x.iter().map(|&v| ref_encode(format, v * scale)).collect()
}

/// Block quantization of `[rows, cols]` with `bh x bw` blocks, each block's
/// scale from `scale_of(block amax)` -> (multiplier, stored value).
pub fn ref_blocks<S: Copy>(
    x: &[f32],
    rows: usize,
    cols: usize,
    (bh, bw): (usize, usize),
    format: Fp8Format,
    scale_of: impl Fn(f32) -> (f32, S),
) -> (Vec<u8>, Vec<S>) {
    let mut codes = vec![0u8; rows * cols];
    let mut scales = Vec::new();
    for bi in 0..rows.div_ceil(bh) {
        for bj in 0..cols.div_ceil(bw) {
            let rs = bi * bh..((bi + 1) * bh).min(rows);
            let cs = bj * bw..((bj + 1) * bw).min(cols);
            let mut block = Vec::new();
            for r in rs.clone() {
                for c in cs.clone() {
                    block.push(x[r * cols + c]);
                }
            }
            let (mult, stored) = scale_of(ref_amax(block));
            scales.push(stored);
            for r in rs.clone() {
                for c in cs.clone() {
                    codes[r * cols + c] = ref_encode(format, x[r * cols + c] * mult);
                }
            }
        }
    }
    (codes, scales)
}

pub fn ref_block_rule(format: Fp8Format, power_2_scale: bool, amax_epsilon: f32) -> impl Fn(f32) -> (f32, f32) {
    move |amax| {
        let s = ref_current(amax, fp8_max(format), power_2_scale, amax_epsilon);
        (s, 1.0 / s)
    }
}

pub fn ref_mx_rule(format: Fp8Format) -> impl Fn(f32) -> (f32, u8) {
    move |amax| {
        let e = ref_e8m0(amax, fp8_max(format));
        (e8m0_multiplier(e), e)
    }
}
