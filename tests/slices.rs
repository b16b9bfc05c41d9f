//! Every instruction set gives the scalar path's bits: each output byte, each
//! output element's bits (NaN payloads included) and the amax bits, for every
//! element type, format, overflow mode and several scales, all lengths 0..=257
//! at misaligned starts. Plus the parallel entry points and the errors.

use fp8_engine::Error;
use fp8_engine::convert::{self, HighPrecision, Isa, dequantize, dequantize_on, quantize, quantize_on, scalar};
use fp8_engine::format::{Fp8Format, Overflow};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MAX_LEN: usize = 257;
const OFFSETS: [usize; 4] = [0, 1, 2, 3];
const POOL_LEN: usize = 4096;
const OVERFLOWS: [Overflow; 2] = [Overflow::Saturate, Overflow::NonSaturating];
/// Neutral, halving, inexact, tiny, huge, subnormal, a typical amax-derived scale.
const SCALES: [f32; 8] = [1.0, 0.5, 3.7, 1e-30, f32::MAX, 1e-45, 1.0 / 448.0, 65536.0];

/// Raw bits of an element, so NaN payloads are compared too.
trait Element: HighPrecision + PartialEq + std::fmt::Debug {
    fn bits(self) -> u32;
    fn from_random_bits(bits: u32) -> Self;
}

impl Element for f32 {
    fn bits(self) -> u32 {
        self.to_bits()
    }
    fn from_random_bits(bits: u32) -> Self {
        f32::from_bits(bits)
    }
}

impl Element for bf16 {
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
    fn from_random_bits(bits: u32) -> Self {
        bf16::from_bits(bits as u16)
    }
}

impl Element for f16 {
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
    fn from_random_bits(bits: u32) -> Self {
        f16::from_bits(bits as u16)
    }
}

/// The values the brief singles out: zeros, f32 subnormals, both formats'
/// min-normal and max boundaries, overflow ties, infinities, NaNs; with neighbours.
fn edge_values() -> Vec<f32> {
    let mut v = vec![
        0.0,
        f32::from_bits(1),
        f32::from_bits(2),
        f32::from_bits(0x0040_0000),
        f32::from_bits(0x007F_FFFF),
        f32::MIN_POSITIVE,
        2f32.powi(-6),  // E4M3 min normal
        2f32.powi(-9),  // E4M3 min subnormal
        2f32.powi(-10), // half of it: a tie to zero
        2f32.powi(-14), // E5M2 min normal
        2f32.powi(-16), // E5M2 min subnormal
        2f32.powi(-17),
        0.875 * 2f32.powi(-6), // E4M3 max subnormal
        0.75 * 2f32.powi(-14), // E5M2 max subnormal
        416.0,
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
    let neighbours: Vec<f32> = v
        .iter()
        .filter(|x| x.is_finite())
        .flat_map(|&x| [x.next_up(), x.next_down()])
        .collect();
    v.extend(neighbours);
    v
}

/// Every FP8 value of both formats, each midpoint between neighbours (a
/// rounding tie) and the f32 on either side of it.
fn tie_values() -> Vec<f32> {
    let mut v = Vec::new();
    for format in Fp8Format::ALL {
        for code in 0..0x7Fu8 {
            let (low, high) = (format.decode(code), format.decode(code + 1));
            if low.is_finite() && high.is_finite() {
                let tie = low + (high - low) / 2.0;
                v.extend([low, tie, tie.next_down(), tie.next_up()]);
            }
        }
    }
    v
}

/// A pool of f32: random bit patterns, normals times random powers of two,
/// ties and edges, both signs, shuffled.
fn f32_pool(rng: &mut StdRng, special: &[f32]) -> Vec<f32> {
    let mut v: Vec<f32> = special.iter().flat_map(|&x| [x, -x]).collect();
    while v.len() < POOL_LEN {
        let x = match rng.random_range(0..3) {
            0 => f32::from_bits(rng.random()),
            1 => rng.random_range(1.0f32..2.0) * 2f32.powi(rng.random_range(-30..30)),
            _ => special[rng.random_range(0..special.len())],
        };
        v.push(if rng.random() { x } else { -x });
    }
    shuffle(rng, &mut v);
    v
}

fn shuffle<T>(rng: &mut StdRng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.random_range(0..=i));
    }
}

/// `pool` as `T`: rounded from f32, with a quarter replaced by random raw bits.
fn pool_of<T: Element>(rng: &mut StdRng, pool: &[f32]) -> Vec<T> {
    pool.iter()
        .map(|&x| {
            if rng.random_range(0..4) == 0 {
                T::from_random_bits(rng.random())
            } else {
                T::from_f32(x)
            }
        })
        .collect()
}

/// Every (length, offset) pair, each on a different window of the pool.
fn windows() -> impl Iterator<Item = (usize, usize, usize)> {
    (0..=MAX_LEN).flat_map(|len| {
        OFFSETS.into_iter().map(move |offset| {
            let base = (len * 131 + offset * 977) % (POOL_LEN - MAX_LEN - 4);
            (len, offset, base)
        })
    })
}

fn check_quantize_on<T: Element>(isa: Isa, pool: &[T], what: &str) {
    let mut want = [0u8; MAX_LEN + 4];
    let mut got = [0u8; MAX_LEN + 4];
    for format in Fp8Format::ALL {
        for overflow in OVERFLOWS {
            for scale in SCALES {
                for (len, offset, base) in windows() {
                    let src = &pool[base + offset..base + offset + len];
                    // The destination is misaligned differently from the source.
                    let dst_offset = (offset + 1) % 4;
                    let want = &mut want[dst_offset..dst_offset + len];
                    let got = &mut got[dst_offset..dst_offset + len];
                    let want_amax = scalar::quantize(src, want, format, scale, overflow);
                    let got_amax = quantize_on(isa, src, got, format, scale, overflow).unwrap();
                    let case = format!(
                        "{isa} {what} {} -> {format} {overflow:?} scale {scale:e} len {len} offset {offset}",
                        T::NAME
                    );
                    for k in 0..len {
                        assert_eq!(
                            got[k],
                            want[k],
                            "{case}: element {k} = {:?} (bits {:#x})",
                            src[k],
                            src[k].bits()
                        );
                    }
                    assert_eq!(
                        got_amax.to_bits(),
                        want_amax.to_bits(),
                        "{case}: amax {got_amax} vs {want_amax}"
                    );
                }
            }
        }
    }
}

fn check_dequantize_on<T: Element>(isa: Isa, codes: &[u8]) {
    let zero = T::from_f32(0.0);
    let mut want = [zero; MAX_LEN + 4];
    let mut got = [zero; MAX_LEN + 4];
    for format in Fp8Format::ALL {
        for scale_inv in SCALES {
            for (len, offset, base) in windows() {
                let src = &codes[base + offset..base + offset + len];
                let dst_offset = (offset + 3) % 4;
                let want = &mut want[dst_offset..dst_offset + len];
                let got = &mut got[dst_offset..dst_offset + len];
                scalar::dequantize(src, want, format, scale_inv);
                dequantize_on(isa, src, got, format, scale_inv).unwrap();
                for k in 0..len {
                    assert_eq!(
                        got[k].bits(),
                        want[k].bits(),
                        "{isa} dequantize {format} -> {} scale_inv {scale_inv:e} len {len} offset {offset}: \
                         code {:#04x} gave {:?}, scalar {:?}",
                        T::NAME,
                        src[k],
                        got[k],
                        want[k]
                    );
                }
            }
        }
    }
}

fn check_all_quantize<T: Element>() {
    let mut rng = StdRng::seed_from_u64(0x5EED_0001);
    let edges = edge_values();
    let ties = tie_values();
    let edge_pool = f32_pool(&mut rng, &edges);
    let tie_pool = f32_pool(&mut rng, &ties);
    let edge_pool: Vec<T> = pool_of(&mut rng, &edge_pool);
    let tie_pool: Vec<T> = pool_of(&mut rng, &tie_pool);
    for isa in Isa::available() {
        check_quantize_on(isa, &edge_pool, "edges+random");
        check_quantize_on(isa, &tie_pool, "ties+random");
    }
}

#[test]
fn quantize_f32_matches_scalar_on_every_isa() {
    check_all_quantize::<f32>();
}

#[test]
fn quantize_bf16_matches_scalar_on_every_isa() {
    check_all_quantize::<bf16>();
}

#[test]
fn quantize_f16_matches_scalar_on_every_isa() {
    check_all_quantize::<f16>();
}

fn check_all_dequantize<T: Element>() {
    let mut rng = StdRng::seed_from_u64(0x5EED_0002);
    // Every code many times over, in random order.
    let mut codes: Vec<u8> = (0..POOL_LEN).map(|i| i as u8).collect();
    shuffle(&mut rng, &mut codes);
    for isa in Isa::available() {
        check_dequantize_on::<T>(isa, &codes);
    }
}

#[test]
fn dequantize_f32_matches_scalar_on_every_isa() {
    check_all_dequantize::<f32>();
}

#[test]
fn dequantize_bf16_matches_scalar_on_every_isa() {
    check_all_dequantize::<bf16>();
}

#[test]
fn dequantize_f16_matches_scalar_on_every_isa() {
    check_all_dequantize::<f16>();
}

/// The scalar path itself against the per-element codec and `half`, so the
/// reference above is anchored to the format definitions.
#[test]
fn scalar_path_is_the_elementwise_definition() {
    let mut rng = StdRng::seed_from_u64(0x5EED_0003);
    let pool = f32_pool(&mut rng, &edge_values());
    for format in Fp8Format::ALL {
        for overflow in OVERFLOWS {
            let mut q = vec![0u8; pool.len()];
            let amax = scalar::quantize(&pool, &mut q, format, 3.7, overflow);
            let want_amax = pool
                .iter()
                .filter(|x| !x.is_nan())
                .fold(0.0f32, |m, x| if x.abs() > m { x.abs() } else { m });
            assert_eq!(amax.to_bits(), want_amax.to_bits());
            for (x, &code) in pool.iter().zip(&q) {
                assert_eq!(code, format.encode(x * 3.7, overflow), "{x:e}");
            }
        }
        let codes: Vec<u8> = (0..=255).collect();
        let mut out = vec![bf16::ZERO; 256];
        scalar::dequantize(&codes, &mut out, format, 0.3);
        for (&code, y) in codes.iter().zip(&out) {
            assert_eq!(y.to_bits(), bf16::from_f32(format.decode(code) * 0.3).to_bits());
        }
    }
}

fn parallel_input(len: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(0x5EED_0004);
    let mut v: Vec<f32> = (0..len).map(|_| rng.random_range(-600.0f32..600.0)).collect();
    // NaNs at the end of a chunk, of a SIMD step and in the scalar tail, and a
    // large value: chunk amaxes must combine with NaN ignored.
    for k in [(1 << 16) - 1, (1 << 16) + 63, len - 3] {
        v[k] = f32::NAN;
    }
    v[100] = -1.0e6; // in the chunk whose last element is NaN
    v
}

#[test]
fn parallel_quantize_matches_scalar() {
    let len = 3 * (1 << 20) + 12_345; // above the threshold, ragged last chunk
    assert!(len > convert::PARALLEL_MIN_LEN);
    let x = parallel_input(len);
    let x_bf16: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    for format in Fp8Format::ALL {
        for overflow in OVERFLOWS {
            let mut want = vec![0u8; len];
            let mut got = vec![0u8; len];
            let want_amax = scalar::quantize(&x, &mut want, format, 0.75, overflow);
            let got_amax = quantize(&x, &mut got, format, 0.75, overflow).unwrap();
            assert_eq!(got_amax.to_bits(), want_amax.to_bits());
            assert_eq!(got_amax, 1.0e6);
            assert!(
                got == want,
                "{format} {overflow:?}: parallel quantize differs from scalar"
            );

            let want_amax = scalar::quantize(&x_bf16, &mut want, format, 0.75, overflow);
            let got_amax = quantize(&x_bf16, &mut got, format, 0.75, overflow).unwrap();
            assert_eq!(got_amax.to_bits(), want_amax.to_bits());
            assert!(
                got == want,
                "{format} {overflow:?} bf16: parallel quantize differs from scalar"
            );
        }
    }
}

#[test]
fn parallel_dequantize_matches_scalar() {
    let len = (1 << 20) + 777;
    let codes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 256) as u8).collect();
    for format in Fp8Format::ALL {
        let mut want = vec![0.0f32; len];
        let mut got = vec![0.0f32; len];
        scalar::dequantize(&codes, &mut want, format, 1.5);
        dequantize(&codes, &mut got, format, 1.5).unwrap();
        assert!(
            want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{format}"
        );
    }
}

#[test]
fn small_entry_points_match_scalar() {
    let x = [1.0f32, -2.5, 1000.0, f32::NAN, 0.001];
    for format in Fp8Format::ALL {
        let mut want = [0u8; 5];
        let mut got = [0u8; 5];
        let want_amax = scalar::quantize(&x, &mut want, format, 2.0, Overflow::Saturate);
        let got_amax = quantize(&x, &mut got, format, 2.0, Overflow::Saturate).unwrap();
        assert_eq!((got, got_amax.to_bits()), (want, want_amax.to_bits()));
    }
}

const BAD_SCALES: [f32; 6] = [0.0, -0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];

#[test]
fn length_mismatch_is_an_error_everywhere() {
    let x = [1.0f32; 4];
    let mut q = [0u8; 3];
    let mismatch = |what| Err::<(), _>(Error::LengthMismatch { what, src: 4, dst: 3 });
    assert_eq!(
        quantize(&x, &mut q, Fp8Format::E4M3, 1.0, Overflow::Saturate).map(drop),
        mismatch("quantize")
    );
    let codes = [0u8; 4];
    let mut y = [0.0f32; 3];
    assert_eq!(dequantize(&codes, &mut y, Fp8Format::E5M2, 1.0), mismatch("dequantize"));
    for isa in Isa::ALL {
        // Lengths are checked before the instruction set.
        assert_eq!(
            quantize_on(isa, &x, &mut q, Fp8Format::E4M3, 1.0, Overflow::Saturate).map(drop),
            mismatch("quantize")
        );
        assert_eq!(
            dequantize_on(isa, &codes, &mut y, Fp8Format::E4M3, 1.0),
            mismatch("dequantize")
        );
    }
}

#[test]
fn invalid_scale_is_an_error_everywhere() {
    let x = [1.0f32; 4];
    let mut q = [0u8; 4];
    let codes = [0x38u8; 4];
    let mut y = [0.0f32; 4];
    for bad in BAD_SCALES {
        let invalid =
            |r: Result<(), Error>| matches!(r, Err(Error::InvalidScale { value }) if value.to_bits() == bad.to_bits());
        assert!(
            invalid(quantize(&x, &mut q, Fp8Format::E4M3, bad, Overflow::Saturate).map(drop)),
            "{bad}"
        );
        assert!(invalid(dequantize(&codes, &mut y, Fp8Format::E4M3, bad)), "{bad}");
        for isa in Isa::ALL {
            assert!(invalid(
                quantize_on(isa, &x, &mut q, Fp8Format::E5M2, bad, Overflow::Saturate).map(drop)
            ));
            assert!(invalid(dequantize_on(isa, &codes, &mut y, Fp8Format::E5M2, bad)));
        }
    }
    // Nothing was written on error.
    assert_eq!(q, [0; 4]);
    assert_eq!(y, [0.0; 4]);
}

#[test]
fn unavailable_isa_is_an_error() {
    let x = [1.0f32; 40];
    let mut q = [0u8; 40];
    let mut y = [0.0f32; 40];
    for isa in Isa::ALL.into_iter().filter(|isa| !isa.is_available()) {
        let unavailable = Err::<(), _>(Error::IsaUnavailable { isa: isa.name() });
        assert_eq!(
            quantize_on(isa, &x, &mut q, Fp8Format::E4M3, 1.0, Overflow::Saturate).map(drop),
            unavailable
        );
        assert_eq!(dequantize_on(isa, &q, &mut y, Fp8Format::E4M3, 1.0), unavailable);
        assert_eq!(isa.self_check(), unavailable);
    }
}

#[test]
fn isa_detection_is_consistent() {
    let available = Isa::available();
    assert_eq!(available.first(), Some(&Isa::Scalar));
    assert!(available.iter().all(|isa| isa.is_available()));
    assert!(available.contains(&Isa::best()));
    // `best` is the fastest available path unless AVX-512 failed its self-check.
    let fastest = *available.last().unwrap();
    assert!(Isa::best() == fastest || (fastest == Isa::Avx512 && Isa::Avx512.self_check().is_err()));
    let names: Vec<&str> = Isa::ALL.iter().map(|isa| isa.name()).collect();
    assert_eq!(names, ["scalar", "avx2", "avx512"]);
}

#[test]
fn every_available_isa_passes_its_self_check() {
    for isa in Isa::available() {
        assert_eq!(isa.self_check(), Ok(()), "{isa}");
    }
}
