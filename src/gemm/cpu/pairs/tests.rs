//! The pair order: the AMX kernel against the portable one bit for bit (where the CPU has AMX),
//! the portable kernel against its definition written out per element, and whole GEMMs
//! against f64 sums.

use super::*;
use crate::format::Fp8Format;
use crate::gemm::cpu::epilogue::Epilogue;

/// A small xorshift stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A finite code of `format` (every finite code equally likely).
    fn code(&mut self, format: Fp8Format) -> u8 {
        loop {
            let c = self.next() as u8;
            if format.decode(c).is_finite() {
                return c;
            }
        }
    }
}

fn codes(rng: &mut Rng, format: Fp8Format, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.code(format)).collect()
}

/// The pair order of one element, spelled out: `a` and `b` its K values.
fn element(a: &[f32], b: &[f32], chunk: usize) -> f32 {
    let mut d = 0.0f32;
    for (ac, bc) in a.chunks(chunk).zip(b.chunks(chunk)) {
        let mut t = 0.0f32;
        for (ab, bb) in ac.chunks(EDGE).zip(bc.chunks(EDGE)) {
            let (mut e, mut o) = (0.0f32, 0.0f32);
            for (kk, (x, y)) in ab.iter().zip(bb).enumerate() {
                if kk % 2 == 0 {
                    e = x.mul_add(*y, e);
                } else {
                    o = x.mul_add(*y, o);
                }
            }
            t += e + o;
        }
        d += t;
    }
    d
}

fn run(a: Codes, b: Codes, chunk: usize, kernel: Kernel) -> Vec<f32> {
    let mut d = vec![f32::NAN; a.rows * b.rows];
    let epilogue = Epilogue {
        factor: 1.0,
        bias: None,
        beta: 0.0,
    };
    gemm(a, b, chunk, &epilogue, Output::F32(&mut d), kernel).unwrap();
    d
}

/// Ragged M, N and K (tails of a block, of a strip, of a band), one- and many-chunk K.
const SHAPES: [(usize, usize, usize, usize); 7] = [
    (1, 1, 16, 32),
    (33, 31, 48, 32),
    (70, 65, 272, 128),
    (64, 96, 512, 512),
    (5, 130, 1040, 544),
    (129, 40, 128, 128),
    (40, 33, 400, 416),
];

#[test]
fn portable_gemm_is_the_pair_order_of_every_element() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    for (m, n, k, chunk) in SHAPES {
        let (fa, fb) = (Fp8Format::E5M2, Fp8Format::E4M3);
        let (ca, cb) = (codes(&mut rng, fa, m * k), codes(&mut rng, fb, n * k));
        let a = Codes { format: fa, codes: &ca, rows: m, k };
        let b = Codes { format: fb, codes: &cb, rows: n, k };
        let got = run(a, b, chunk, Kernel::Portable);
        for i in 0..m {
            let ar: Vec<f32> = ca[i * k..][..k].iter().map(|&c| fa.decode(c)).collect();
            for j in 0..n {
                let br: Vec<f32> = cb[j * k..][..k].iter().map(|&c| fb.decode(c)).collect();
                let want = element(&ar, &br, chunk);
                assert_eq!(got[i * n + j].to_bits(), want.to_bits(), "{m}x{n}x{k} chunk {chunk}: ({i}, {j})");
            }
        }
    }
}

#[test]
fn amx_gemm_matches_the_portable_gemm_bit_for_bit() {
    if !amx::available() {
        eprintln!("skipped: this CPU (or OS) has no AMX-BF16");
        return;
    }
    assert_eq!(amx::self_check(), None);
    let mut rng = Rng(0x0F0F_1234_5555_AAAA);
    for (m, n, k, chunk) in SHAPES.into_iter().chain([(256, 256, 1024, 128), (300, 200, 768, 384)]) {
        for (fa, fb) in [(Fp8Format::E4M3, Fp8Format::E4M3), (Fp8Format::E5M2, Fp8Format::E4M3)] {
            let (ca, cb) = (codes(&mut rng, fa, m * k), codes(&mut rng, fb, n * k));
            let a = Codes { format: fa, codes: &ca, rows: m, k };
            let b = Codes { format: fb, codes: &cb, rows: n, k };
            let (want, got) = (run(a, b, chunk, Kernel::Portable), run(a, b, chunk, Kernel::Amx));
            let bad = (0..m * n).find(|&i| got[i].to_bits() != want[i].to_bits());
            assert_eq!(bad, None, "{m}x{n}x{k} chunk {chunk} {fa:?} x {fb:?}");
        }
    }
}

/// The sums are f32 sums of exact products: within the f32 bound `K u sum |a b|` of f64 sums.
#[test]
fn gemm_is_within_the_f32_bound_of_f64_sums() {
    let mut rng = Rng(0xDEAD_BEEF_0000_0001);
    let (m, n, k) = (37, 45, 700);
    let fmt = Fp8Format::E4M3;
    let (ca, cb) = (codes(&mut rng, fmt, m * k), codes(&mut rng, fmt, n * k));
    let a = Codes { format: fmt, codes: &ca, rows: m, k };
    let b = Codes { format: fmt, codes: &cb, rows: n, k };
    let got = run(a, b, 512, Kernel::best());
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut magnitude) = (0.0f64, 0.0f64);
            for kk in 0..k {
                let p = fmt.decode(ca[i * k + kk]) as f64 * fmt.decode(cb[j * k + kk]) as f64;
                exact += p;
                magnitude += p.abs();
            }
            let bound = k as f64 * f32::EPSILON as f64 / 2.0 * magnitude;
            let err = (got[i * n + j] as f64 - exact).abs();
            assert!(err <= bound, "({i}, {j}): error {err:e} > bound {bound:e}");
        }
    }
}

/// Zero codes of either sign give +0 sums (never -0), like the tile unit.
#[test]
fn zero_products_sum_to_positive_zero() {
    let (m, n, k) = (3, 4, 64);
    let ca: Vec<u8> = (0..m * k).map(|i| if i % 2 == 0 { 0x80 } else { 0x00 }).collect();
    let cb: Vec<u8> = (0..n * k).map(|i| if i % 3 == 0 { 0xB8 } else { 0x38 }).collect();
    let a = Codes { format: Fp8Format::E4M3, codes: &ca, rows: m, k };
    let b = Codes { format: Fp8Format::E4M3, codes: &cb, rows: n, k };
    for kernel in [Kernel::Portable, Kernel::best()] {
        assert!(run(a, b, 64, kernel).iter().all(|x| x.to_bits() == 0), "{kernel:?}");
    }
}
