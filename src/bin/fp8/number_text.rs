//! Exact text for binary floating-point values. Every finite float is a dyadic
//! rational `m * 2^e`, so its decimal expansion ends; we print that, or `2^e`
//! / `m*2^e` with an approximation when the expansion is too long to read.

/// Longest exact decimal printed as is (2^-24 = 0.000000059604644775390625 fits).
const MAX_EXACT_CHARS: usize = 28;

/// `|x| = m * 2^e` with `m` odd, for finite nonzero `x`.
fn odd_mantissa_exponent(x: f64) -> (u64, i32) {
    let bits = x.abs().to_bits();
    let biased = (bits >> 52) as i32;
    let fraction = bits & ((1u64 << 52) - 1);
    // Subnormals have no implicit bit and the exponent of the smallest normal.
    let (mut m, mut e) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1u64 << 52), biased - 1075)
    };
    let zeros = m.trailing_zeros();
    m >>= zeros;
    e += zeros as i32;
    (m, e)
}

/// Decimal digits of `n`, least significant first.
fn digits_of(mut n: u64) -> Vec<u8> {
    let mut digits = Vec::new();
    loop {
        digits.push((n % 10) as u8);
        n /= 10;
        if n == 0 {
            return digits;
        }
    }
}

/// `digits *= factor` (factor 2 or 5), least significant digit first.
fn multiply(digits: &mut Vec<u8>, factor: u8) {
    let mut carry = 0u8;
    for d in digits.iter_mut() {
        let product = *d * factor + carry; // at most 9 * 5 + 4 = 49
        *d = product % 10;
        carry = product / 10;
    }
    if carry > 0 {
        digits.push(carry);
    }
}

/// The exact decimal expansion of a finite `x`, e.g. `0.001953125` or `-448`.
/// Tiny and huge values give long strings (2^-149 has 149 decimals).
pub fn exact_decimal(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    if !x.is_finite() {
        return special(x);
    }
    let sign = if x < 0.0 { "-" } else { "" };
    let (m, e) = odd_mantissa_exponent(x);
    let mut digits = digits_of(m);
    if e >= 0 {
        (0..e).for_each(|_| multiply(&mut digits, 2));
        let text: String = digits.iter().rev().map(|d| char::from(b'0' + d)).collect();
        return format!("{sign}{text}");
    }
    // m * 2^-k = m * 5^k / 10^k: the digits of m * 5^k with the point k places from the right.
    let k = (-e) as usize;
    (0..k).for_each(|_| multiply(&mut digits, 5));
    digits.resize(digits.len().max(k + 1), 0);
    let text: String = digits.iter().rev().map(|d| char::from(b'0' + d)).collect();
    let (int_part, frac_part) = text.split_at(text.len() - k);
    format!("{sign}{int_part}.{frac_part}")
}

fn special(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// `x` as a person reads it best, always exact:
/// * a short exact decimal as is: `448`, `-2.5`, `0.5`;
/// * a power of two at most 1/4 as `2^-9 (0.001953125)`, or `2^-127 (~5.8775e-39)` when long;
/// * anything else long as `255*2^120 (~3.3895e38)`;
/// * the parentheses repeat the whole value, sign included: `-2^-9 (-0.001953125)`;
/// * `inf`, `-inf`, `nan`.
pub fn readable(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return exact_decimal(x);
    }
    let exact = exact_decimal(x);
    let (m, e) = odd_mantissa_exponent(x);
    let sign = if x < 0.0 { "-" } else { "" };
    let short = exact.len() <= MAX_EXACT_CHARS;
    let approx = || format!("~{x:.4e}");
    match (m, short) {
        (1, true) if e <= -2 => format!("{sign}2^{e} ({exact})"),
        (_, true) => exact,
        (1, false) => format!("{sign}2^{e} ({})", approx()),
        (_, false) => format!("{sign}{m}*2^{e} ({})", approx()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_decimals_of_dyadic_rationals() {
        assert_eq!(exact_decimal(448.0), "448");
        assert_eq!(exact_decimal(-2.5), "-2.5");
        assert_eq!(exact_decimal(2f64.powi(-9)), "0.001953125");
        assert_eq!(exact_decimal(0.1f32 as f64), "0.100000001490116119384765625");
        assert_eq!(exact_decimal(2f64.powi(70)), "1180591620717411303424");
        assert_eq!(exact_decimal(-0.0), "-0");
        // The smallest f64 subnormal has 1074 decimals and ends in ...625.
        let tiny = exact_decimal(f64::from_bits(1));
        assert_eq!(tiny.len(), 2 + 1074);
        assert!(tiny.ends_with("625"));
    }

    #[test]
    fn exact_decimals_parse_back_to_the_same_value() {
        for bits in [1u32, 0x0040_0000, 0x3DCC_CCCD, 0x447A_0000, 0x7F7F_FFFF, 0x0080_0000] {
            let x = f32::from_bits(bits);
            assert_eq!(exact_decimal(x as f64).parse::<f32>().unwrap(), x, "bits {bits:#x}");
        }
    }

    #[test]
    fn readable_forms() {
        assert_eq!(readable(448.0), "448");
        assert_eq!(readable(0.5), "0.5");
        assert_eq!(readable(2f64.powi(-9)), "2^-9 (0.001953125)");
        assert_eq!(readable(-(2f64.powi(-2))), "-2^-2 (-0.25)");
        assert_eq!(readable(-(2f64.powi(-133))), "-2^-133 (~-9.1835e-41)");
        assert_eq!(readable(2f64.powi(-127)), "2^-127 (~5.8775e-39)");
        assert_eq!(readable(255.0 * 2f64.powi(120)), "255*2^120 (~3.3895e38)");
        assert_eq!(readable(f64::NEG_INFINITY), "-inf");
        assert_eq!(readable(f64::NAN), "nan");
    }
}
