//! `fp8 bench gemm` end to end on small shapes: the JSON lines carry exactly
//! the documented keys with consistent values, the two error figures measure
//! what they claim (f32 arithmetic vs format rounding), the table renders,
//! and bad requests exit 1 (or 2 for usage) with one line.

use std::collections::BTreeSet;
use std::process::{Command, Output};

use serde_json::Value;

fn fp8(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fp8"))
        .args(args)
        .output()
        .expect("start fp8")
}

/// `fp8 bench gemm ARGS --json`: one parsed object per stdout line.
fn json_cases(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["bench", "gemm", "--json"];
    all.extend(args);
    let out = fp8(&all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fp8 {all:?} failed: {stderr}");
    String::from_utf8(out.stdout)
        .expect("utf-8 stdout")
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

fn one_case(args: &[&str]) -> Value {
    let cases = json_cases(args);
    assert_eq!(cases.len(), 1, "{cases:?}");
    cases.into_iter().next().unwrap()
}

fn num(case: &Value, key: &str) -> f64 {
    case[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {case}"))
}

/// Expects exit `code`, empty stdout and one `fp8: error:` line; returns it.
fn fail(args: &[&str], code: i32) -> String {
    let out = fp8(args);
    let stderr = String::from_utf8(out.stderr).expect("utf-8 stderr");
    assert_eq!(out.status.code(), Some(code), "fp8 {args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "fp8 {args:?} wrote to stdout");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr:?}");
    assert!(lines[0].starts_with("fp8: error: "), "{}", lines[0]);
    lines[0].to_string()
}

#[test]
fn json_has_exactly_the_documented_keys_and_consistent_values() {
    let case = one_case(&["--m", "70", "--n", "90", "--k", "112", "--out", "f32", "--repeat", "1"]);
    let keys: BTreeSet<&str> = case.as_object().unwrap().keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = [
        "backend",
        "m",
        "n",
        "k",
        "a_format",
        "b_format",
        "scaling",
        "out",
        "split_accumulator",
        "tflops",
        "baseline_tflops",
        "ratio",
        "rel_err",
        "quant_err",
        "peak_pct",
    ]
    .into();
    assert_eq!(keys, expected);
    assert_eq!(case["backend"], "cpu");
    assert_eq!(
        (case["m"].as_u64(), case["n"].as_u64(), case["k"].as_u64()),
        (Some(70), Some(90), Some(112))
    );
    assert_eq!(
        (case["a_format"].as_str(), case["b_format"].as_str()),
        (Some("e4m3"), Some("e4m3"))
    );
    assert_eq!(
        (case["scaling"].as_str(), case["out"].as_str()),
        (Some("tensor"), Some("f32"))
    );
    assert_eq!(case["split_accumulator"], true);
    assert!(case["peak_pct"].is_null(), "the CPU has no datasheet peak");
    let (ours, theirs) = (num(&case, "tflops"), num(&case, "baseline_tflops"));
    assert!(ours > 0.0 && theirs > 0.0);
    assert!((num(&case, "ratio") - ours / theirs).abs() <= 1e-9 * ours / theirs);
    // f32 arithmetic on exact products: about sqrt(K) u; E4M3 rounding: a few %.
    let (rel, quant) = (num(&case, "rel_err"), num(&case, "quant_err"));
    assert!(rel < 1e-5, "rel_err {rel}");
    assert!((5e-3..0.1).contains(&quant), "quant_err {quant}");
}

#[test]
fn error_figures_follow_the_formats() {
    // bf16 output: rel_err is the output's rounding (2^-9 relative at most).
    let bf16_out = one_case(&["--m", "40", "--n", "50", "--k", "64", "--repeat", "1"]);
    assert_eq!(bf16_out["out"], "bf16");
    let rel = num(&bf16_out, "rel_err");
    assert!((1e-4..2f64.powi(-9)).contains(&rel), "bf16 output rel_err {rel}");

    // E5M2 has one mantissa bit less than E4M3: twice the quantization error, about.
    let e5 = one_case(&[
        "--m",
        "40",
        "--n",
        "50",
        "--k",
        "64",
        "--a-format",
        "e5m2",
        "--out",
        "f32",
        "--repeat",
        "1",
    ]);
    let e4 = one_case(&["--m", "40", "--n", "50", "--k", "64", "--out", "f32", "--repeat", "1"]);
    assert!(num(&e5, "quant_err") > 1.3 * num(&e4, "quant_err"), "{e5} vs {e4}");

    // Plain bf16 inputs: no scaling, bf16 rounding of the inputs only.
    let plain = one_case(&[
        "--m",
        "40",
        "--n",
        "50",
        "--k",
        "64",
        "--a-format",
        "bf16",
        "--b-format",
        "bf16",
        "--out",
        "f32",
        "--repeat",
        "1",
    ]);
    assert_eq!(plain["scaling"], "none");
    assert_eq!(plain["split_accumulator"], false, "split accumulation is an FP8 switch");
    assert!(num(&plain, "rel_err") < 1e-5);
    assert!(num(&plain, "quant_err") < 2f64.powi(-8), "{plain}");

    // Same seed, same inputs; another seed, other inputs.
    let again = one_case(&["--m", "40", "--n", "50", "--k", "64", "--out", "f32", "--repeat", "1"]);
    assert_eq!(again["quant_err"], e4["quant_err"]);
    let other = one_case(&[
        "--m", "40", "--n", "50", "--k", "64", "--out", "f32", "--repeat", "1", "--seed", "9",
    ]);
    assert_ne!(other["quant_err"], e4["quant_err"]);
}

#[test]
fn every_scaling_output_and_distribution_runs() {
    for scaling in ["tensor", "block", "block-1x128", "mxfp8"] {
        for out in ["f32", "bf16", "f16", "e4m3", "e5m2"] {
            let case = one_case(&[
                "--m",
                "33",
                "--n",
                "140",
                "--k",
                "272",
                "--scaling",
                scaling,
                "--out",
                out,
                "--split",
                "off",
                "--a-format",
                "e5m2",
                "--repeat",
                "1",
            ]);
            assert_eq!(
                (case["scaling"].as_str(), case["out"].as_str()),
                (Some(scaling), Some(out))
            );
            // Block scales force split accumulation.
            assert_eq!(case["split_accumulator"], scaling != "tensor", "{case}");
            let (rel, quant) = (num(&case, "rel_err"), num(&case, "quant_err"));
            assert!(rel.is_finite() && rel < 0.1 && quant < 0.2, "{case}");
        }
    }
    for dist in ["uniform", "lognormal"] {
        let case = one_case(&["--m", "20", "--n", "20", "--k", "32", "--dist", dist, "--repeat", "1"]);
        assert!(num(&case, "quant_err") < 0.1, "{case}");
    }
}

#[test]
fn small_suite_prints_one_line_per_case_with_progress() {
    let out = fp8(&[
        "bench", "gemm", "--suite", "small", "--json", "--repeat", "1", "--out", "f32",
    ]);
    assert!(out.status.success());
    let shapes: Vec<(u64, u64, u64)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["m"].as_u64().unwrap(),
                v["n"].as_u64().unwrap(),
                v["k"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shapes,
        [
            (256, 256, 256),
            (512, 512, 512),
            (1024, 1024, 1024),
            (2048, 2048, 2048),
            (1000, 1500, 784)
        ]
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().filter(|l| l.starts_with("case ")).count(), 5, "{stderr}");
}

#[test]
fn table_has_a_row_per_case_and_no_cpu_peak() {
    let out = fp8(&["bench", "gemm", "--m", "30", "--n", "40", "--k", "48", "--repeat", "1"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("device: cpu"), "{text}");
    let header: Vec<&str> = lines[1].split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(
        header,
        [
            "m",
            "n",
            "k",
            "split",
            "ours GFLOP/s",
            "f32 crate GFLOP/s",
            "ratio",
            "% peak",
            "rel_err",
            "quant_err"
        ]
    );
    assert_eq!(lines.len(), 4, "{text}");
    let row: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(&row[..4], ["30", "40", "48", "on"]);
    assert_eq!(row[7], "-");
}

#[test]
fn bad_requests_fail_with_one_line() {
    // Without a CUDA driver the CUDA runner cannot open a GPU: one line, exit 1.
    if !fp8_engine::backend::cuda::driver_present() {
        let cuda = fail(&["bench", "gemm", "--backend", "cuda", "--m", "16"], 1);
        assert!(cuda.contains("no usable GPU"), "{cuda}");
    }
    let e5e5 = fail(&["bench", "gemm", "--a-format", "e5m2", "--b-format", "e5m2"], 1);
    assert!(e5e5.contains("E5M2 x E5M2"), "{e5e5}");
    let k = fail(&["bench", "gemm", "--m", "8", "--n", "8", "--k", "24"], 1);
    assert!(k.contains("8x8x24") && k.contains("multiple of 16"), "{k}");
    let mixed = fail(&["bench", "gemm", "--a-format", "f32"], 1);
    assert!(mixed.contains("A is f32 and B is e4m3"), "{mixed}");
    for usage in [
        vec!["bench", "gemm", "--suite", "small", "--m", "5"],
        vec!["bench", "gemm", "--repeat", "0"],
        vec!["bench", "gemm", "--scaling", "2d"],
        vec!["bench", "gemm", "--out", "e8m0"],
    ] {
        fail(&usage, 2);
    }
}

#[test]
fn bench_cast_still_parses_its_options() {
    // The gemm subcommand moved `cast`'s options under it; they must still be accepted.
    let err = fail(&["bench", "cast", "--device", "cuda:99"], 1);
    assert!(!err.contains("unexpected argument"), "{err}");
}
