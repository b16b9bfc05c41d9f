//! Bounded fuzz loop (proptest) over the command-line number parsers: every
//! numeric flag of `train`, `cast`, `show` and `bench gemm` given arbitrary
//! text (numbers of every size and sign, NaN, inf, junk) must parse or give an
//! error, and a parsed `train` line must turn into a run config or an error,
//! never a panic. `FUZZ_CASES` (default 256) sets the case count.

use proptest::prelude::*;

use crate::{Command, parse};

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// Text that looks like a number more often than not.
fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        any::<f32>().prop_map(|v| format!("{v:e}")),
        Just("nan".to_string()),
        Just("-inf".to_string()),
        Just("18446744073709551616".to_string()),
        "[-+0-9.eExX_a-f]{0,24}",
        ".{0,12}",
    ]
}

const TRAIN_FLAGS: [&str; 16] = [
    "--steps",
    "--batch",
    "--micro-batches",
    "--lr",
    "--warmup",
    "--clip",
    "--layers",
    "--hidden",
    "--heads",
    "--ffn",
    "--loss-scale",
    "--seed",
    "--digits",
    "--seq",
    "--checkpoint-every",
    "--max-text-bytes",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn train_numbers_parse_or_fail_cleanly(flag in 0..TRAIN_FLAGS.len(), value in number_text(), equals in any::<bool>()) {
        let flag = TRAIN_FLAGS[flag];
        let args: Vec<String> = if equals {
            vec!["fp8".into(), "train".into(), format!("{flag}={value}")]
        } else {
            vec!["fp8".into(), "train".into(), flag.into(), value.clone()]
        };
        if let Ok(cli) = parse(args) {
            let Command::Train(train) = cli.command else {
                panic!("parsed as another command");
            };
            let _ = crate::train::run_config(&train);
        }
    }

    #[test]
    fn other_numbers_parse_or_fail_cleanly(which in 0..4usize, value in number_text()) {
        let args: Vec<String> = match which {
            0 => vec!["fp8".into(), "cast".into(), "--to".into(), "e4m3".into(), "--scale".into(), value],
            1 => vec!["fp8".into(), "show".into(), value, "--format".into(), "e4m3".into()],
            2 => vec!["fp8".into(), "recipe".into(), "replay".into(), "--margin".into(), value],
            _ => vec!["fp8".into(), "bench".into(), "gemm".into(), "--m".into(), value],
        };
        let _ = parse(args);
    }
}

/// `--clip -1` and `--steps -1` reach a value check instead of clap's "unexpected argument".
#[test]
fn negative_values_are_values() {
    for args in [["fp8", "train", "--clip", "-1"], ["fp8", "train", "--steps", "-1"]] {
        match parse(args) {
            Ok(cli) => {
                let Command::Train(train) = cli.command else { panic!() };
                let err = crate::train::run_config(&train).expect_err("a negative clip is refused");
                assert!(err.0.contains("--clip -1"), "{}", err.0);
            }
            Err(err) => assert!(err.to_string().contains("invalid value '-1'"), "{err}"),
        }
    }
}
