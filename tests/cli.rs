//! The `fp8` binary end to end: `cast` and `decode` against the library's scalar
//! codec element by element, `formats` against the numbers of the numeric
//! contract (`docs/numerics.md`), `show` flags on hand-picked values, and the
//! one-line error convention on every kind of bad input.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::process::{Command, Output, Stdio};

use fp8_engine::format::{Format, Fp8Format, Overflow, decode_e8m0};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------- running the tool

/// Runs `fp8 ARGS` with `stdin` piped in (from a thread, so large outputs cannot deadlock).
fn fp8(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fp8"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fp8");
    let mut pipe = child.stdin.take().expect("stdin pipe");
    let input = stdin.to_vec();
    // The tool may exit before reading everything (bad arguments): a broken pipe is fine.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let output = child.wait_with_output().expect("wait for fp8");
    writer.join().expect("stdin writer");
    output
}

/// Runs the tool, expects success and a quiet stderr, returns stdout.
fn succeed(args: &[&str], stdin: &[u8]) -> Vec<u8> {
    let out = fp8(args, stdin);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fp8 {args:?} failed: {stderr}");
    assert!(stderr.is_empty(), "fp8 {args:?} wrote to stderr: {stderr}");
    out.stdout
}

/// Runs the tool, expects a non-zero exit, nothing on stdout and exactly one
/// `fp8: error: ...` line on stderr; returns that line.
fn fail(args: &[&str], stdin: &[u8]) -> String {
    let out = fp8(args, stdin);
    let stderr = String::from_utf8(out.stderr).expect("utf-8 stderr");
    assert!(!out.status.success(), "fp8 {args:?} should fail; stderr: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "fp8 {args:?} wrote {} bytes to stdout",
        out.stdout.len()
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "fp8 {args:?} should print one line, got: {stderr:?}");
    assert!(lines[0].starts_with("fp8: error: "), "{}", lines[0]);
    lines[0].to_string()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    assert_eq!(bytes.len() % 4, 0, "output is not whole f32 values");
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Same value, NaN matching any NaN (payloads are not part of the contract).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

// ---------------------------------------------------------------- test data

/// f32 values that exercise every branch of a cast: arbitrary bit patterns
/// (NaN, inf, f32 subnormals, huge), the FP8 range, the FP8 subnormal range,
/// and exact midpoints between neighbouring FP8 values (round-half-even ties).
fn awkward_values(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let sign = if rng.random::<bool>() { -1.0 } else { 1.0 };
            match rng.random_range(0..5) {
                0 => f32::from_bits(rng.random()),
                1 => rng.random_range(-70000.0f32..70000.0),
                2 => sign * rng.random_range(1.0f32..2.0) * 2f32.powi(rng.random_range(-20..-4)),
                3 => {
                    let format = if rng.random() { Fp8Format::E4M3 } else { Fp8Format::E5M2 };
                    let code = rng.random_range(0u8..0x7A);
                    let (lo, hi) = (format.decode(code), format.decode(code + 1));
                    sign * (lo + hi) / 2.0
                }
                _ => rng.random_range(-600.0f32..600.0),
            }
        })
        .collect()
}

// ---------------------------------------------------------------- cast and decode

#[test]
fn cast_agrees_with_the_scalar_codec_per_element() {
    let mut rng = StdRng::seed_from_u64(0xF8);
    let values = awkward_values(&mut rng, 20_000);
    let input = f32_bytes(&values);
    for format in Fp8Format::ALL {
        for (flag, overflow) in [
            (None, Overflow::Saturate),
            (Some("--no-saturate"), Overflow::NonSaturating),
        ] {
            for scale in [1.0f32, 0.37, 1024.0] {
                let scale_text = scale.to_string();
                let mut args = vec!["cast", "--to", format.name(), "--scale", &scale_text];
                args.extend(flag);
                let codes = succeed(&args, &input);
                assert_eq!(codes.len(), values.len());
                for (&x, &code) in values.iter().zip(&codes) {
                    let expected = format.encode(x * scale, overflow);
                    let ok = code == expected || (format.is_nan(code) && format.is_nan(expected));
                    assert!(
                        ok,
                        "{args:?}: x = {x:e}: got {code:#04x}, scalar codec gives {expected:#04x}"
                    );
                }
            }
        }
    }
}

#[test]
fn cast_handles_inputs_larger_than_one_chunk() {
    // An odd length, so the last parallel chunk is partial.
    let mut rng = StdRng::seed_from_u64(7);
    let values = awkward_values(&mut rng, 1_000_003);
    let codes = succeed(&["cast", "--to", "e5m2"], &f32_bytes(&values));
    assert_eq!(codes.len(), values.len());
    for (i, (&x, &code)) in values.iter().zip(&codes).enumerate() {
        let expected = Fp8Format::E5M2.encode(x, Overflow::Saturate);
        assert!(
            code == expected || Fp8Format::E5M2.is_nan(code) && x.is_nan(),
            "element {i}: x = {x:e}"
        );
    }
}

#[test]
fn decode_agrees_with_the_scalar_codec_per_element() {
    let mut rng = StdRng::seed_from_u64(0xDEC0DE);
    // Every code once, then random ones.
    let codes: Vec<u8> = (0..=255u8).chain((0..30_000).map(|_| rng.random())).collect();
    for scale in [1.0f32, 3.5, 2f32.powi(-20)] {
        let scale_text = scale.to_string();
        for name in ["e4m3", "e5m2", "e8m0"] {
            let values = f32s(&succeed(&["decode", "--from", name, "--scale", &scale_text], &codes));
            assert_eq!(values.len(), codes.len());
            for (&code, &y) in codes.iter().zip(&values) {
                let exact = match name {
                    "e4m3" => Fp8Format::E4M3.decode(code),
                    "e5m2" => Fp8Format::E5M2.decode(code),
                    _ => decode_e8m0(code),
                };
                assert!(
                    same(y, exact * scale),
                    "{name} code {code:#04x} scale {scale}: got {y:e}"
                );
            }
        }
    }
}

#[test]
fn cast_then_decode_round_trips() {
    // Every finite FP8 value divided by a power-of-two scale comes back exactly.
    for format in Fp8Format::ALL {
        let values: Vec<f32> = (0..=255u8)
            .map(|c| format.decode(c))
            .filter(|v| v.is_finite())
            .map(|v| v / 64.0)
            .collect();
        let codes = succeed(&["cast", "--to", format.name(), "--scale", "64"], &f32_bytes(&values));
        let back = f32s(&succeed(
            &["decode", "--from", format.name(), "--scale", "0.015625"],
            &codes,
        ));
        for (x, y) in values.iter().zip(&back) {
            assert_eq!(x.to_bits(), y.to_bits(), "{format}: {x:e} came back as {y:e}");
        }
    }
    // Arbitrary values come back as the nearest FP8 value, i.e. decode(encode(x)).
    let mut rng = StdRng::seed_from_u64(99);
    let values: Vec<f32> = (0..5000).map(|_| rng.random_range(-400.0f32..400.0)).collect();
    let codes = succeed(&["cast", "--to", "e4m3"], &f32_bytes(&values));
    let back = f32s(&succeed(&["decode", "--from", "e4m3"], &codes));
    for (&x, &y) in values.iter().zip(&back) {
        // y is representable and no representable value is nearer to x.
        let nearest = (0..=255u8)
            .map(|c| Fp8Format::E4M3.decode(c))
            .filter(|v| v.is_finite())
            .map(|v| (v - x).abs())
            .fold(f32::INFINITY, f32::min);
        assert_eq!((y - x).abs(), nearest, "x = {x}: got {y}");
    }
}

#[test]
fn empty_input_gives_empty_output() {
    assert!(succeed(&["cast", "--to", "e4m3"], &[]).is_empty());
    assert!(succeed(&["decode", "--from", "e8m0"], &[]).is_empty());
}

/// Casts one value and decodes the byte (the decode itself is checked above).
fn cast_one(x: f32, args: &[&str]) -> f32 {
    let to = args[args.iter().position(|&a| a == "--to").expect("--to") + 1];
    let code = succeed(args, &f32_bytes(&[x]));
    assert_eq!(code.len(), 1);
    f32s(&succeed(&["decode", "--from", to], &code))[0]
}

#[test]
fn scale_and_no_saturate_change_results_as_the_contract_says() {
    // Saturating by default: 1000 clamps to E4M3's 448, -1000 to -448, 1e6 to E5M2's 57344.
    assert_eq!(cast_one(1000.0, &["cast", "--to", "e4m3"]), 448.0);
    assert_eq!(cast_one(-1000.0, &["cast", "--to", "e4m3"]), -448.0);
    assert_eq!(cast_one(1e6, &["cast", "--to", "e5m2"]), 57344.0);
    assert_eq!(cast_one(f32::INFINITY, &["cast", "--to", "e4m3"]), 448.0);
    // Non-saturating: E4M3 has no inf, so NaN; E5M2 goes to inf.
    assert!(cast_one(1000.0, &["cast", "--to", "e4m3", "--no-saturate"]).is_nan());
    assert_eq!(cast_one(1e6, &["cast", "--to", "e5m2", "--no-saturate"]), f32::INFINITY);
    assert_eq!(
        cast_one(-1e6, &["cast", "--to", "e5m2", "--no-saturate"]),
        f32::NEG_INFINITY
    );
    // 464 is the tie between 448 and the first overflow: it rounds to even, 448, in both modes.
    assert_eq!(cast_one(464.0, &["cast", "--to", "e4m3", "--no-saturate"]), 448.0);
    assert!(cast_one(465.0, &["cast", "--to", "e4m3", "--no-saturate"]).is_nan());
    // The scale applies before the cast: 1000 * 0.25 = 250, nearest E4M3 value 256 (240 is farther).
    assert_eq!(cast_one(1000.0, &["cast", "--to", "e4m3", "--scale", "0.25"]), 256.0);
    assert_eq!(
        cast_one(1000.0, &["cast", "--to", "e4m3", "--scale", "0.25", "--no-saturate"]),
        256.0
    );
    // ... and can push a value that fit into saturation.
    assert_eq!(cast_one(300.0, &["cast", "--to", "e4m3", "--scale", "2"]), 448.0);
    // Tiny values flush to zero unless scaled up into range: 2^-12 -> 0, but 2^-12 * 2^6 = 2^-6.
    let tiny = 2f32.powi(-12);
    assert_eq!(cast_one(tiny, &["cast", "--to", "e4m3"]), 0.0);
    assert_eq!(
        cast_one(tiny, &["cast", "--to", "e4m3", "--scale", "64"]),
        2f32.powi(-6)
    );
}

// ---------------------------------------------------------------- bad input

#[test]
fn input_that_is_not_whole_f32_values_is_refused() {
    for len in [1usize, 5, 4099] {
        let line = fail(&["cast", "--to", "e4m3"], &vec![0u8; len]);
        assert!(line.contains(&len.to_string()), "length {len} not named: {line}");
    }
}

#[test]
fn unknown_formats_are_refused_with_the_known_ones_listed() {
    let line = fail(&["cast", "--to", "e9m9"], &[0; 8]);
    assert!(
        line.contains("e9m9") && line.contains("e4m3") && line.contains("e5m2"),
        "{line}"
    );
    let line = fail(&["cast", "--to", "bf16"], &[0; 8]);
    assert!(
        line.contains("bf16") && line.contains("e4m3") && line.contains("e5m2"),
        "{line}"
    );
    let line = fail(&["decode", "--from", "int8"], &[0; 8]);
    assert!(
        ["int8", "e4m3", "e5m2", "e8m0"].iter().all(|w| line.contains(w)),
        "{line}"
    );
    let line = fail(&["decode", "--from", "fp16"], &[0; 8]);
    assert!(
        ["fp16", "e4m3", "e5m2", "e8m0"].iter().all(|w| line.contains(w)),
        "{line}"
    );
    let line = fail(&["show", "1", "--format", "fp32"], &[]);
    assert!(
        ["fp32", "e4m3", "e5m2", "e8m0", "bf16", "fp16"]
            .iter()
            .all(|w| line.contains(w)),
        "{line}"
    );
}

#[test]
fn scales_that_are_not_finite_and_positive_are_refused() {
    for bad in ["0", "-0", "-2", "inf", "-inf", "nan", "1e-50", "1e39", "two"] {
        let line = fail(&["cast", "--to", "e4m3", "--scale", bad], &f32_bytes(&[1.0]));
        assert!(line.contains(bad), "cast: scale {bad} not named: {line}");
        let line = fail(&["decode", "--from", "e5m2", "--scale", bad], &[0x3C]);
        assert!(line.contains(bad), "decode: scale {bad} not named: {line}");
    }
}

#[test]
fn other_usage_errors_are_one_line_too() {
    fail(&["cast"], &[]);
    fail(&["cast", "--to", "e4m3", "--frobnicate"], &[]);
    fail(&["frobnicate"], &[]);
    let line = fail(&["show", "twelve"], &[]);
    assert!(line.contains("twelve"), "{line}");
}

// ---------------------------------------------------------------- tables

/// Splits a table line into cells: columns are separated by two or more spaces.
fn cells(line: &str) -> Vec<String> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

/// The rows of a table printed by the tool, keyed by their first cell, each as column title -> cell.
fn table_rows(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with("format"));
    let header = cells(lines.next().expect("a header line"));
    let rule = lines.next().expect("a rule under the header");
    assert!(rule.chars().all(|c| c == '-' || c == ' '), "{rule}");
    lines
        .map(|line| {
            let row = cells(line);
            assert_eq!(row.len(), header.len(), "row {line:?} does not fit header {header:?}");
            (row[0].clone(), header.iter().cloned().zip(row).collect())
        })
        .collect()
}

/// Reads the tool's exact number notation back, written independently here:
/// `448`, `-2.5`, `2^-9 (0.001953125)`, `-255*2^120 (~-3.3895e38)`, `inf`, `nan`;
/// `-` is "none". A parenthesised decimal must agree with the exact form.
fn number(cell: &str) -> Option<f64> {
    if cell == "-" {
        return None;
    }
    let (exact, note) = match cell.split_once(" (") {
        Some((exact, note)) => (exact, Some(note.strip_suffix(')').expect("closing parenthesis"))),
        None => (cell, None),
    };
    let value = match exact.split_once("2^") {
        Some((factor, exponent)) => {
            let factor: f64 = match factor.trim_end_matches('*') {
                "" => 1.0,
                "-" => -1.0,
                digits => digits.parse().expect("integer factor"),
            };
            factor * 2f64.powi(exponent.parse().expect("integer exponent"))
        }
        None => exact.parse().unwrap_or_else(|_| panic!("not a number: {cell:?}")),
    };
    match note {
        Some(approx) if approx.starts_with('~') => {
            let approx: f64 = approx[1..].parse().expect("approximation");
            assert!(
                ((approx - value) / value).abs() < 1e-4,
                "{cell:?}: approximation is off"
            );
        }
        Some(decimal) => assert_eq!(decimal.parse::<f64>().expect("decimal"), value, "{cell:?}"),
        None => {}
    }
    Some(value)
}

fn hex(text: &str) -> u16 {
    u16::from_str_radix(text.strip_prefix("0x").expect("0x prefix"), 16).expect("hex code")
}

/// The codes a cell lists: `none`, `0xFF`, `0x7D-0x7F, 0xFD-0xFF`.
fn code_set(cell: &str) -> BTreeSet<u16> {
    if cell == "none" {
        return BTreeSet::new();
    }
    cell.split(", ")
        .flat_map(|part| match part.split_once('-') {
            Some((lo, hi)) => hex(lo)..=hex(hi),
            None => hex(part)..=hex(part),
        })
        .collect()
}

/// One row of the format table of the numeric contract.
struct Limits {
    name: &'static str,
    bits: &'static str,
    bias: i32,
    max: f64,
    min_normal: f64,
    min_subnormal: Option<f64>,
    eps: Option<f64>,
}

#[test]
fn formats_table_has_the_numbers_of_the_contract() {
    let text = String::from_utf8(succeed(&["formats"], &[])).expect("utf-8");
    let rows = table_rows(&text);
    assert_eq!(rows.len(), Format::ALL.len());
    let p = |e: i32| 2f64.powi(e);
    // Section 1 of the numeric contract.
    let contract = [
        Limits {
            name: "e4m3",
            bits: "1/4/3",
            bias: 7,
            max: 448.0,
            min_normal: p(-6),
            min_subnormal: Some(p(-9)),
            eps: Some(p(-3)),
        },
        Limits {
            name: "e5m2",
            bits: "1/5/2",
            bias: 15,
            max: 57344.0,
            min_normal: p(-14),
            min_subnormal: Some(p(-16)),
            eps: Some(p(-2)),
        },
        Limits {
            name: "e8m0",
            bits: "0/8/0",
            bias: 127,
            max: p(127),
            min_normal: p(-127),
            min_subnormal: None,
            eps: None,
        },
        Limits {
            name: "bf16",
            bits: "1/8/7",
            bias: 127,
            max: (2.0 - p(-7)) * p(127),
            min_normal: p(-126),
            min_subnormal: Some(p(-133)),
            eps: Some(p(-7)),
        },
        Limits {
            name: "fp16",
            bits: "1/5/10",
            bias: 15,
            max: 65504.0,
            min_normal: p(-14),
            min_subnormal: Some(p(-24)),
            eps: Some(p(-10)),
        },
    ];
    for Limits {
        name,
        bits,
        bias,
        max,
        min_normal,
        min_subnormal,
        eps,
    } in contract
    {
        let row = &rows[name];
        assert_eq!(row["s/e/m"], bits, "{name}");
        assert_eq!(row["bias"].parse::<i32>().unwrap(), bias, "{name}");
        assert_eq!(number(&row["max finite"]), Some(max), "{name} max");
        assert_eq!(number(&row["min normal"]), Some(min_normal), "{name} min normal");
        assert_eq!(number(&row["min subnormal"]), min_subnormal, "{name} min subnormal");
        assert_eq!(number(&row["eps"]), eps, "{name} eps");
    }
    // The codes listed must be what the codecs do, checked over every code.
    for format in Format::ALL {
        let row = &rows[format.name()];
        let max_code = hex(&row["max code"]);
        assert_eq!(
            Some(format.decode(max_code) as f64),
            number(&row["max finite"]),
            "{format} max code"
        );
        let codes = 0..format.code_count();
        let nan: BTreeSet<u16> = codes
            .clone()
            .map(|c| c as u16)
            .filter(|&c| format.decode(c).is_nan())
            .collect();
        assert_eq!(code_set(&row["NaN codes"]), nan, "{format} NaN codes");
        let inf: Vec<u16> = codes
            .map(|c| c as u16)
            .filter(|&c| format.decode(c).is_infinite())
            .collect();
        let listed: Vec<u16> = match row["inf (+/-)"].split_once('/') {
            Some((pos, neg)) => {
                assert_eq!(format.decode(hex(pos)), f32::INFINITY, "{format} +inf");
                assert_eq!(format.decode(hex(neg)), f32::NEG_INFINITY, "{format} -inf");
                vec![hex(pos), hex(neg)]
            }
            None => vec![],
        };
        assert_eq!(
            listed.iter().copied().collect::<BTreeSet<_>>(),
            inf.into_iter().collect(),
            "{format} inf"
        );
    }
}

// ---------------------------------------------------------------- show

fn show(args: &[&str]) -> HashMap<String, HashMap<String, String>> {
    let mut all = vec!["show"];
    all.extend(args);
    table_rows(&String::from_utf8(succeed(&all, &[])).expect("utf-8"))
}

fn flags(row: &HashMap<String, String>) -> BTreeSet<String> {
    row["flags"]
        .split(',')
        .filter(|f| *f != "-")
        .map(String::from)
        .collect()
}

fn flag_set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn show_flags_saturation_overflow_and_flush() {
    let row = &show(&["1000", "--format", "e4m3"])["e4m3"];
    assert_eq!(number(&row["value"]), Some(448.0));
    assert_eq!(flags(row), flag_set(&["saturated"]));
    // 464 rounds (ties to even) to 448: rounding, not saturation.
    assert_eq!(flags(&show(&["464", "--format", "e4m3"])["e4m3"]), flag_set(&[]));
    assert_eq!(
        flags(&show(&["465", "--format", "e4m3"])["e4m3"]),
        flag_set(&["saturated"])
    );
    assert_eq!(
        flags(&show(&["-inf", "--format", "e4m3"])["e4m3"]),
        flag_set(&["saturated"])
    );

    let row = &show(&["1000", "--format", "e4m3", "--no-saturate"])["e4m3"];
    assert!(number(&row["value"]).unwrap().is_nan());
    assert_eq!(flags(row), flag_set(&["overflow-to-nan"]));
    let row = &show(&["-1e6", "--format", "e5m2", "--no-saturate"])["e5m2"];
    assert_eq!(number(&row["value"]), Some(f64::NEG_INFINITY));
    assert_eq!(flags(row), flag_set(&["overflow-to-inf"]));
    let row = &show(&["1e6", "--format", "e5m2"])["e5m2"];
    assert_eq!(
        (number(&row["value"]), flags(row)),
        (Some(57344.0), flag_set(&["saturated"]))
    );

    // 1e-10 is below half the smallest subnormal of e4m3 (2^-10), e5m2 (2^-17) and fp16 (2^-25), not of bf16.
    let rows = show(&["1e-10"]);
    for name in ["e4m3", "e5m2", "fp16"] {
        assert_eq!(number(&rows[name]["value"]), Some(0.0), "{name}");
        assert_eq!(flags(&rows[name]), flag_set(&["flushed-to-zero"]), "{name}");
    }
    assert_eq!(flags(&rows["bf16"]), flag_set(&[]));
    // 2^-10 is exactly half e4m3's smallest subnormal: the tie goes to the even code, zero.
    assert_eq!(
        flags(&show(&["0.0009765625", "--format", "e4m3"])["e4m3"]),
        flag_set(&["flushed-to-zero"])
    );
    // 2^-9 is e4m3's smallest subnormal, exactly.
    let row = &show(&["0.001953125", "--format", "e4m3"])["e4m3"];
    assert_eq!(flags(row), flag_set(&["subnormal"]));
    assert_eq!(row["rel error"], "0");
    // Zero is not flushed; NaN is just NaN; e8m0 has no sign.
    assert!(show(&["0"]).values().all(|row| flags(row).is_empty()));
    assert!(
        show(&["nan"])
            .values()
            .all(|row| flags(row).is_empty() && number(&row["value"]).unwrap().is_nan())
    );
    assert_eq!(
        flags(&show(&["-5", "--format", "e8m0"])["e8m0"]),
        flag_set(&["negative-to-nan"])
    );
}

#[test]
fn show_reports_the_codec_values_and_true_neighbours() {
    for text in ["-0.3", "1000", "3.14159", "2e-5", "-7e4"] {
        let x: f32 = text.parse().unwrap();
        let rows = show(&[text]);
        assert_eq!(rows.len(), Format::ALL.len());
        for format in Format::ALL {
            let row = &rows[format.name()];
            let code = hex(&row["code"]);
            assert_eq!(code, format.encode(x, Overflow::Saturate), "{format} {text}");
            let bits: String = row["bits s/e/m"].split(' ').collect();
            assert_eq!(
                u16::from_str_radix(&bits, 2).unwrap(),
                code,
                "{format} {text}: bit fields"
            );
            let value = number(&row["value"]).unwrap();
            assert!(
                same(value as f32, format.decode(code)),
                "{format} {text}: value {value}"
            );
            if value.is_nan() {
                continue;
            }
            // Neighbours: representable, on the right side, and nothing representable in between.
            let all: Vec<f64> = (0..format.code_count())
                .map(|c| format.decode(c as u16) as f64)
                .collect();
            let below = number(&row["below"]);
            let above = number(&row["above"]);
            for v in &all {
                let inside = below.is_none_or(|b| *v > b) && above.is_none_or(|a| *v < a);
                assert!(
                    !inside || *v == value || v.is_nan(),
                    "{format} {text}: {v} lies between the neighbours"
                );
            }
            assert!(below.is_none_or(|b| b < value && all.contains(&b)), "{format} {text}");
            assert!(above.is_none_or(|a| a > value && all.contains(&a)), "{format} {text}");
            // Relative error, printed to 5 digits.
            let expected = (value - x as f64) / x as f64;
            let printed: f64 = row["rel error"].parse().unwrap();
            assert!(
                (printed - expected).abs() <= 1e-4 * expected.abs(),
                "{format} {text}: {printed} vs {expected}"
            );
        }
    }
}
