//! Every one of the 2^32 f32 bit patterns, through every encoder, against the
//! nearest-code reference in `common`. Release mode, all cores: about a
//! minute on two cores (see docs/numerics.md for the measured time).
//!
//! Magnitudes are swept upwards in chunks (f32 bit order is value order for
//! non-negative floats), so the reference advances its grid index instead of
//! searching; each magnitude is checked with both signs and both overflow
//! modes, through the scalar encoder and through the slice path
//! (`convert::quantize`, the SIMD code on this CPU).

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{NearestCode, Rounded, fp8_expected, fp8_matches};
use fp8_engine::convert::quantize;
use fp8_engine::format::{Fp8Format, Overflow, encode_e8m0};
use half::{bf16, f16};
use rayon::prelude::*;

const MAGNITUDES: u64 = 1 << 31;
const CHUNK: u64 = 1 << 20;
const BLOCK: usize = 4096;
const MODES: [Overflow; 2] = [Overflow::Saturate, Overflow::NonSaturating];

/// Mismatch counter that keeps the first few examples for the message.
#[derive(Default)]
struct Mismatches {
    count: AtomicU64,
    examples: Mutex<Vec<String>>,
}

impl Mismatches {
    fn record(&self, what: impl FnOnce() -> String) {
        if self.count.fetch_add(1, Ordering::Relaxed) < 10 {
            self.examples.lock().unwrap().push(what());
        }
    }

    fn assert_none(&self, name: &str) {
        let n = self.count.load(Ordering::Relaxed);
        assert_eq!(
            n,
            0,
            "{name}: {n} mismatches, first: {:#?}",
            self.examples.lock().unwrap()
        );
    }
}

/// Expected code for the f32 with these bits (`None`: some NaN).
fn expected_for(format: Fp8Format, bits: u32, r: Option<Rounded>, overflow: Overflow) -> Option<u8> {
    r.and_then(|r| fp8_expected(format, r, bits >> 31 == 1, overflow))
}

fn sweep_fp8(format: Fp8Format) {
    let reference = NearestCode::fp8(format);
    let bad = Mismatches::default();
    (0..MAGNITUDES / CHUNK).into_par_iter().for_each(|chunk| {
        let start = (chunk * CHUNK) as u32;
        let mut index = reference.floor_index(f32::from_bits(start) as f64);
        let mut inputs = Vec::with_capacity(2 * BLOCK);
        let mut expected: [Vec<Option<Rounded>>; 1] = [Vec::with_capacity(2 * BLOCK)];
        let mut out = vec![0u8; 2 * BLOCK];
        for block_start in (start..start + CHUNK as u32).step_by(BLOCK) {
            inputs.clear();
            expected[0].clear();
            for abs in block_start..block_start + BLOCK as u32 {
                let rounded = if abs > 0x7F80_0000 {
                    None // NaN
                } else {
                    let (r, i) = reference.round_from(f32::from_bits(abs) as f64, index);
                    index = i;
                    Some(r)
                };
                for bits in [abs, abs | 0x8000_0000] {
                    inputs.push(f32::from_bits(bits));
                    expected[0].push(rounded);
                }
            }
            for overflow in MODES {
                for (x, &r) in inputs.iter().zip(&expected[0]) {
                    let want = expected_for(format, x.to_bits(), r, overflow);
                    let got = format.encode(*x, overflow);
                    if !fp8_matches(format, want, got) {
                        bad.record(|| {
                            format!(
                                "scalar {format} {overflow:?} {:#010x}: {got:#04x} != {want:x?}",
                                x.to_bits()
                            )
                        });
                    }
                }
                quantize(&inputs, &mut out, format, 1.0, overflow).expect("valid scale and lengths");
                for ((x, &r), &got) in inputs.iter().zip(&expected[0]).zip(&out) {
                    let want = expected_for(format, x.to_bits(), r, overflow);
                    if !fp8_matches(format, want, got) {
                        bad.record(|| {
                            format!(
                                "slice {format} {overflow:?} {:#010x}: {got:#04x} != {want:x?}",
                                x.to_bits()
                            )
                        });
                    }
                }
            }
        }
    });
    bad.assert_none(format.name());
}

#[test]
fn e4m3_encoders_match_the_reference_on_every_f32() {
    sweep_fp8(Fp8Format::E4M3);
}

#[test]
fn e5m2_encoders_match_the_reference_on_every_f32() {
    sweep_fp8(Fp8Format::E5M2);
}

#[test]
fn e8m0_encoder_matches_the_reference_on_every_f32() {
    let reference = NearestCode::e8m0();
    let bad = Mismatches::default();
    (0..MAGNITUDES / CHUNK).into_par_iter().for_each(|chunk| {
        let start = (chunk * CHUNK) as u32;
        let mut index = reference.floor_index(f32::from_bits(start) as f64);
        for abs in start..start + CHUNK as u32 {
            let rounded = (abs <= 0x7F80_0000).then(|| {
                let (r, i) = reference.round_from(f32::from_bits(abs) as f64, index);
                index = i;
                r
            });
            for overflow in MODES {
                // No sign: negative nonzero inputs are NaN, -0 is +0.
                let positive = match (rounded, overflow) {
                    (None, _) => 0xFF,
                    (Some(Rounded::Code(c)), _) => c,
                    (Some(Rounded::Overflow), Overflow::Saturate) => 0xFE,
                    (Some(Rounded::Overflow), Overflow::NonSaturating) => 0xFF,
                };
                let negative = if abs == 0 { positive } else { 0xFF };
                for (bits, want) in [(abs, positive), (abs | 0x8000_0000, negative)] {
                    let got = encode_e8m0(f32::from_bits(bits), overflow);
                    if got != want {
                        bad.record(|| format!("e8m0 {overflow:?} {bits:#010x}: {got:#04x} != {want:#04x}"));
                    }
                }
            }
        }
    });
    bad.assert_none("e8m0");
}

/// Every bf16 and every f16 value through the slice quantizer with a few
/// scales: the widened value times the scale, rounded by the reference.
#[test]
fn sixteen_bit_inputs_quantize_like_the_reference_on_every_code() {
    let scales = [1.0f32, 0.5, 3.7, 1.0e-30, f32::MAX];
    let bf: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let hf: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let widened: [Vec<f32>; 2] = [
        bf.iter().map(|x| x.to_f32()).collect(),
        hf.iter().map(|x| x.to_f32()).collect(),
    ];
    let mut out = vec![0u8; 1 << 16];
    for format in Fp8Format::ALL {
        let reference = NearestCode::fp8(format);
        for overflow in MODES {
            for scale in scales {
                for (which, wide) in widened.iter().enumerate() {
                    let amax = if which == 0 {
                        quantize(&bf, &mut out, format, scale, overflow)
                    } else {
                        quantize(&hf, &mut out, format, scale, overflow)
                    }
                    .expect("valid scale");
                    let want_amax = wide.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    assert_eq!(amax.to_bits(), want_amax.to_bits(), "amax");
                    for (x, &got) in wide.iter().zip(&out) {
                        let y = x * scale;
                        let r = (!y.is_nan()).then(|| reference.round(y.abs() as f64));
                        let want = expected_for(format, y.to_bits(), r, overflow);
                        assert!(
                            fp8_matches(format, want, got),
                            "{format} {overflow:?} input {which} {x} * {scale}: {got:#04x} != {want:x?}"
                        );
                    }
                }
            }
        }
    }
}
