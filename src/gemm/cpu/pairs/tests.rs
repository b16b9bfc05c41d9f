//! The pair order: the AMX and `VDPBF16PS` kernels against the portable one bit for bit (where
//! the CPU has them; the `VDPBF16PS` packing also through a scalar model of the instruction, on
//! every CPU), the portable kernel against its definition written out per element, and whole
//! GEMMs against f64 sums.

use super::*;
use half::bf16;

use crate::format::Fp8Format;
use crate::gemm::cpu::epilogue::Epilogue;

impl XorShift {
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

/// FP8 codes `rows x k`, K-major.
fn fp8<'a>(format: Fp8Format, codes: &'a [u8], rows: usize, k: usize) -> Source<'a> {
    Source {
        values: Values::Fp8(format, codes),
        rows,
        k,
        row_stride: k,
        k_stride: 1,
    }
}

/// bf16 values `rows x k`: K-major, or stored transposed (`[k, rows]`).
fn bf16s(values: &[bf16], rows: usize, k: usize, transposed: bool) -> Source<'_> {
    let (row_stride, k_stride) = if transposed { (1, rows) } else { (k, 1) };
    Source {
        values: Values::Bf16(values),
        rows,
        k,
        row_stride,
        k_stride,
    }
}

/// The `[k, rows]` storage of K-major `rows x k` values (what [`bf16s`] reads transposed).
fn transposed(values: &[bf16], rows: usize, k: usize) -> Vec<bf16> {
    (0..rows * k).map(|i| values[(i % rows) * k + i / rows]).collect()
}

fn codes(rng: &mut XorShift, format: Fp8Format, len: usize) -> Vec<u8> {
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

fn run(a: Source, b: Source, chunk: usize, kernel: Kernel) -> Vec<f32> {
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
    let mut rng = XorShift(0x1234_5678_9ABC_DEF1);
    for (m, n, k, chunk) in SHAPES {
        let (fa, fb) = (Fp8Format::E5M2, Fp8Format::E4M3);
        let (ca, cb) = (codes(&mut rng, fa, m * k), codes(&mut rng, fb, n * k));
        let a = fp8(fa, &ca, m, k);
        let b = fp8(fb, &cb, n, k);
        let got = run(a, b, chunk, Kernel::Portable);
        for i in 0..m {
            let ar: Vec<f32> = ca[i * k..][..k].iter().map(|&c| fa.decode(c)).collect();
            for j in 0..n {
                let br: Vec<f32> = cb[j * k..][..k].iter().map(|&c| fb.decode(c)).collect();
                let want = element(&ar, &br, chunk);
                assert_eq!(
                    got[i * n + j].to_bits(),
                    want.to_bits(),
                    "{m}x{n}x{k} chunk {chunk}: ({i}, {j})"
                );
            }
        }
    }
}

/// Each faster kernel this CPU has gives the portable kernel's bits on whole GEMMs (FP8 and bf16
/// operands, every shape).
fn fast_kernel_matches_the_portable_gemm(kernel: Kernel, available: bool, self_check: fn() -> Option<String>) {
    if !available {
        eprintln!("skipped: this CPU (or OS) has no {kernel:?}");
        return;
    }
    assert_eq!(self_check(), None);
    let mut rng = XorShift(0x0F0F_1234_5555_AAAA);
    for (m, n, k, chunk) in SHAPES.into_iter().chain([(256, 256, 1024, 128), (300, 200, 768, 384)]) {
        for (fa, fb) in [(Fp8Format::E4M3, Fp8Format::E4M3), (Fp8Format::E5M2, Fp8Format::E4M3)] {
            let (ca, cb) = (codes(&mut rng, fa, m * k), codes(&mut rng, fb, n * k));
            let a = fp8(fa, &ca, m, k);
            let b = fp8(fb, &cb, n, k);
            let (want, got) = (run(a, b, chunk, Kernel::Portable), run(a, b, chunk, kernel));
            let bad = (0..m * n).find(|&i| got[i].to_bits() != want[i].to_bits());
            assert_eq!(bad, None, "{kernel:?} {m}x{n}x{k} chunk {chunk} {fa:?} x {fb:?}");
        }
    }
    // bf16, odd K tails too, K-major and stored transposed (the packers' two paths).
    for (m, n, k, chunk) in SHAPES
        .into_iter()
        .chain([(33, 40, 45, 64), (17, 70, 1, 32), (40, 36, 99, 96)])
    {
        let (va, vb) = (bf16_values(&mut rng, m * k, 100), bf16_values(&mut rng, n * k, 100));
        let (ta, tb) = (transposed(&va, m, k), transposed(&vb, n, k));
        let want = run(
            bf16s(&va, m, k, false),
            bf16s(&vb, n, k, false),
            chunk,
            Kernel::Portable,
        );
        for transposed in [false, true] {
            let (a, b) = match transposed {
                false => (bf16s(&va, m, k, false), bf16s(&vb, n, k, false)),
                true => (bf16s(&ta, m, k, true), bf16s(&tb, n, k, true)),
            };
            let got = run(a, b, chunk, kernel);
            let bad = (0..m * n).find(|&i| got[i].to_bits() != want[i].to_bits());
            assert_eq!(
                bad, None,
                "{kernel:?} {m}x{n}x{k} chunk {chunk} bf16, transposed {transposed}"
            );
        }
    }
}

#[test]
fn amx_gemm_matches_the_portable_gemm_bit_for_bit() {
    fast_kernel_matches_the_portable_gemm(Kernel::Amx, amx::available(), amx::self_check);
}

#[test]
fn vdpbf16ps_gemm_matches_the_portable_gemm_bit_for_bit() {
    fast_kernel_matches_the_portable_gemm(Kernel::Dot, dot::available(), dot::self_check);
}

/// The `VDPBF16PS` packing puts each step's two terms of a chain in one word, the earlier K in
/// the high half (A: `[32 rows][32 K]` blocks; B: `[16 pairs][16 columns][2]`), whichever way
/// the operand is stored.
#[test]
fn vdpbf16ps_words_hold_consecutive_terms_of_one_chain() {
    // 32 rows x 64 K (two blocks), each value a distinct bf16 code naming its row and K (the
    // packers copy bits; only bf16 operands are read transposed).
    let k = 2 * EDGE;
    let code = |row: usize, kk: usize| bf16::from_bits((row * 64 + kk) as u16 + 1);
    let values: Vec<bf16> = (0..EDGE * k).map(|i| code(i / k, i % k)).collect();
    let stored = transposed(&values, EDGE, k);
    for transposed in [false, true] {
        let op = match transposed {
            false => bf16s(&values, EDGE, k, false),
            true => bf16s(&stored, EDGE, k, true),
        };
        let (mut a, mut b, mut row) = (vec![0u16; k * EDGE], vec![0u16; k * EDGE], vec![bf16::ZERO; k]);
        pack_a_strip(op, 0, &mut a, &mut row, KOrder::Dot);
        pack_b_strip(op, 0, &mut b, &mut row, KOrder::Dot);
        for kb in 0..k / EDGE {
            for s in 0..EDGE / 4 {
                for q in 0..2 {
                    let (lo, hi) = (kb * EDGE + 4 * s + 2 + q, kb * EDGE + 4 * s + q);
                    for r in 0..EDGE {
                        let w = &a[kb * BLOCK + r * EDGE + 4 * s + 2 * q..][..2];
                        let want = [code(r, lo).to_bits(), code(r, hi).to_bits()];
                        assert_eq!(
                            w, want,
                            "A row {r} block {kb} step {s} chain {q}, transposed {transposed}"
                        );
                    }
                    for col in 0..EDGE {
                        let at = kb * BLOCK + col / 16 * BLOCK / 2 + ((2 * s + q) * 16 + col % 16) * 2;
                        let want = [code(col, lo).to_bits(), code(col, hi).to_bits()];
                        assert_eq!(
                            b[at..at + 2],
                            want,
                            "B column {col} block {kb} step {s} chain {q}, transposed {transposed}"
                        );
                    }
                }
            }
        }
    }
}

/// The `VDPBF16PS` packing summed by a scalar model of the instruction gives the portable
/// kernel's bits, on every CPU (the hardware kernel itself is checked above where the CPU has
/// it).
#[test]
fn vdpbf16ps_model_on_its_packing_gives_the_portable_bits() {
    assert_eq!(check_against_portable(Kernel::Dot, dot::chunk_model), None);
}

/// Packing reads an operand stored transposed as its K-major copy, in both K orders, K tails
/// (odd K included) and rows past the end too.
#[test]
fn transposed_operands_pack_like_their_k_major_copies() {
    let mut rng = XorShift(0x7777_1111_2222_3333);
    for (rows, k, first) in [(32, 64, 0), (45, 99, 32), (20, 1, 0), (33, 40, 0), (70, 130, 64)] {
        let values = bf16_values(&mut rng, rows * k, 100);
        let stored = transposed(&values, rows, k);
        let (plain, moved) = (bf16s(&values, rows, k, false), bf16s(&stored, rows, k, true));
        let kp = padded_k(k);
        for order in [KOrder::Natural, KOrder::Dot] {
            let pack = |op: Source, b: bool| {
                let (mut out, mut row) = (vec![0xFFFFu16; kp * EDGE], vec![bf16::ZERO; kp]);
                match b {
                    false => pack_a_strip(op, first, &mut out, &mut row, order),
                    true => pack_b_strip(op, first, &mut out, &mut row, order),
                }
                out
            };
            for b in [false, true] {
                assert_eq!(
                    pack(plain, b),
                    pack(moved, b),
                    "{rows}x{k} from {first}, {order:?}, B {b}"
                );
            }
        }
    }
}

/// The sums are f32 sums of exact products: within the f32 bound `K u sum |a b|` of f64 sums.
#[test]
fn gemm_is_within_the_f32_bound_of_f64_sums() {
    let mut rng = XorShift(0xDEAD_BEEF_0000_0001);
    let (m, n, k) = (37, 45, 700);
    let fmt = Fp8Format::E4M3;
    let (ca, cb) = (codes(&mut rng, fmt, m * k), codes(&mut rng, fmt, n * k));
    let a = fp8(fmt, &ca, m, k);
    let b = fp8(fmt, &cb, n, k);
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
    let a = fp8(Fp8Format::E4M3, &ca, m, k);
    let b = fp8(Fp8Format::E4M3, &cb, n, k);
    for kernel in [Kernel::Portable, Kernel::best()] {
        assert!(run(a, b, 64, kernel).iter().all(|x| x.to_bits() == 0), "{kernel:?}");
    }
}

/// bf16 values of every sign and a wide range of exponents (all normal), a few zeros.
fn bf16_values(rng: &mut XorShift, len: usize, min_exponent: u64) -> Vec<bf16> {
    (0..len)
        .map(|_| {
            let r = rng.next();
            if r.is_multiple_of(17) {
                return bf16::ZERO;
            }
            let exponent = (min_exponent + (r >> 8) % 40) as u16;
            bf16::from_bits(((r as u16 & 1) << 15) | (exponent << 7) | ((r >> 32) as u16 & 0x7F))
        })
        .collect()
}

/// bf16 operands: every kernel agrees with the portable one where the sums stay normal, and a
/// transposed operand gives the bits of its K-major copy.
#[test]
fn bf16_operands_sum_in_the_same_order_on_every_kernel_and_layout() {
    let mut rng = XorShift(0x5151_7777_3333_9999);
    // bf16 K need not be even: odd K tails too.
    for (m, n, k, chunk) in SHAPES.into_iter().chain([(33, 40, 45, 64), (17, 70, 1, 32)]) {
        let (va, vb) = (bf16_values(&mut rng, m * k, 100), bf16_values(&mut rng, n * k, 100));
        let (a, b) = (bf16s(&va, m, k, false), bf16s(&vb, n, k, false));
        assert!(sums_stay_normal(&a, &b));
        let want = run(a, b, chunk, Kernel::Portable);
        let (ta, tb) = (transposed(&va, m, k), transposed(&vb, n, k));
        for kernel in [Kernel::Portable, Kernel::best()] {
            let got = run(bf16s(&ta, m, k, true), bf16s(&tb, n, k, true), chunk, kernel);
            let bad = (0..m * n).find(|&i| got[i].to_bits() != want[i].to_bits());
            assert_eq!(bad, None, "{m}x{n}x{k} chunk {chunk} {kernel:?}");
        }
    }
}

/// Values small enough for a subnormal sum (or subnormal themselves) fail the guard, so the
/// portable kernel (no flushing) runs them on every CPU.
#[test]
fn tiny_bf16_values_fail_the_guard() {
    let mut rng = XorShift(0x0123_4567_89AB_CDEF);
    let big = bf16_values(&mut rng, 64, 100);
    let tiny = bf16_values(&mut rng, 64, 1);
    assert!(!sums_stay_normal(
        &bf16s(&big, 2, 32, false),
        &bf16s(&tiny, 2, 32, false)
    ));
    let subnormal = [bf16::from_bits(1); 64];
    assert!(!sums_stay_normal(
        &bf16s(&subnormal, 2, 32, false),
        &bf16s(&big, 2, 32, false)
    ));
    // 2^-56 x 2^-56 with 7-bit mantissas: the grain 2^-126, just normal.
    let edge = [bf16::from_bits(71 << 7); 64];
    assert!(sums_stay_normal(
        &bf16s(&edge, 2, 32, false),
        &bf16s(&edge, 2, 32, false)
    ));
    let below = [bf16::from_bits(70 << 7); 64];
    assert!(!sums_stay_normal(
        &bf16s(&edge, 2, 32, false),
        &bf16s(&below, 2, 32, false)
    ));
}

/// Packing reads every FP8 code as its value (`Fp8Format::decode`, exact in bf16), NaN codes
/// with their sign, whichever conversion path the CPU takes.
#[test]
fn packed_fp8_rows_hold_the_decoded_value_of_every_code() {
    for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
        let codes: Vec<u8> = (0..=255).collect();
        let mut row = vec![bf16::ZERO; 256];
        fp8(format, &codes, 1, 256).row_to_bf16(0, &mut row);
        for (&c, got) in codes.iter().zip(&row) {
            let want = bf16::from_f32(format.decode(c));
            assert_eq!(got.to_bits(), want.to_bits(), "{format:?} code {c:#04x}");
        }
    }
}
