//! The defects of an adversarial probe of the `fp8` tool (docs/reliability.md),
//! one test per class: outputs that are not regular files, planted temporary
//! files, late shape failures, huge sizes, unbounded inputs, end-of-run
//! bookkeeping, resume robustness, and the smaller input checks.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fp8(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fp8"))
        .args(args)
        .output()
        .expect("run fp8")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fp8-cli-hard-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A failure (exit code 1, or 2 for clap's usage errors) whose last stderr line is one
/// `fp8: error:` line containing every piece of `expected`.
fn fails_with(out: &Output, expected: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(1 | 2)), "stderr: {stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("fp8: error: "), "{stderr}");
    for piece in expected {
        assert!(last.contains(piece), "'{piece}' not in: {stderr}");
    }
}

fn succeeds(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A safetensors file with one 16x16 F32 tensor per name.
fn safetensors(path: &Path, names: &[&str]) {
    let mut header = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": [16, 16], "data_offsets": [i * 1024, (i + 1) * 1024]}),
        );
    }
    let json = serde_json::to_vec(&header).unwrap();
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    for i in 0..names.len() * 256 {
        bytes.extend_from_slice(&((i % 97) as f32 * 0.25 - 3.0).to_le_bytes());
    }
    fs::write(path, bytes).unwrap();
}

const TINY: &[&str] = &[
    "train", "--hidden", "16", "--heads", "2", "--layers", "1", "--batch", "16", "--quiet",
];

fn train(out: &Path, extra: &[&str]) -> Output {
    let mut args = TINY.to_vec();
    args.extend_from_slice(&["--out", s(out)]);
    args.extend_from_slice(extra);
    fp8(&args)
}

#[cfg(unix)]
#[test]
fn outputs_replace_only_regular_files() {
    let dir = scratch("outputs");
    let input = dir.join("in.safetensors");
    safetensors(&input, &["w"]);
    // A character device: refused, and still a device afterwards.
    fails_with(
        &fp8(&["quantize", s(&input), "/dev/null", "--recipe", "current"]),
        &["/dev/null", "character device"],
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    // A directory and a symlink (the file it points to is left alone).
    fs::create_dir(dir.join("sub")).unwrap();
    fails_with(
        &fp8(&["quantize", s(&input), s(&dir.join("sub")), "--recipe", "current"]),
        &["a directory"],
    );
    fs::write(dir.join("victim"), b"keep").unwrap();
    std::os::unix::fs::symlink(dir.join("victim"), dir.join("link.safetensors")).unwrap();
    fails_with(
        &fp8(&[
            "quantize",
            s(&input),
            s(&dir.join("link.safetensors")),
            "--recipe",
            "current",
        ]),
        &["a symbolic link"],
    );
    assert_eq!(fs::read(dir.join("victim")).unwrap(), b"keep");
    // Training checks its outputs before the first step.
    let out = dir.join("run");
    fs::create_dir_all(out.join("summary.json")).unwrap();
    fails_with(&train(&out, &["--steps", "1"]), &["summary.json", "a directory"]);
    assert!(!out.join("fp32").exists() && !out.join("fp8-delayed").exists());
    // A replaced regular file keeps its permissions.
    use std::os::unix::fs::PermissionsExt;
    let output = dir.join("out.safetensors");
    fs::write(&output, b"old").unwrap();
    fs::set_permissions(&output, fs::Permissions::from_mode(0o600)).unwrap();
    succeeds(&fp8(&["quantize", s(&input), s(&output), "--recipe", "current"]));
    assert_eq!(fs::metadata(&output).unwrap().permissions().mode() & 0o777, 0o600);
}

#[cfg(unix)]
#[test]
fn planted_temp_names_are_never_followed_and_stale_temps_are_removed() {
    let dir = scratch("temps");
    let input = dir.join("in.safetensors");
    safetensors(&input, &["w"]);
    fs::write(dir.join("victim"), b"keep").unwrap();
    // Symlinks at names of the old predictable pattern and of the new one: never followed.
    for pid in 0..4 {
        for name in [
            format!(".out.st.{pid}.0.tmp"),
            format!(".out.st.{pid}.aaaaaaaaaaaa.fp8tmp"),
        ] {
            std::os::unix::fs::symlink(dir.join("victim"), dir.join(name)).unwrap();
        }
    }
    // A full-size temporary file left by a killed writer (PID 0 is never a live user process).
    let stale = dir.join(".out.st.0.bbbbbbbbbbbb.fp8tmp");
    fs::write(&stale, vec![0u8; 4096]).unwrap();
    succeeds(&fp8(&[
        "quantize",
        s(&input),
        s(&dir.join("out.st")),
        "--recipe",
        "current",
    ]));
    assert_eq!(fs::read(dir.join("victim")).unwrap(), b"keep");
    assert!(!stale.exists(), "the stale temporary file is removed");
    let temps: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".fp8tmp") && !n.contains("aaaa"))
        .collect();
    assert!(temps.is_empty(), "no temporary file of ours is left: {temps:?}");
}

#[test]
fn fp8_shape_rules_fail_before_any_training() {
    let dir = scratch("shapes");
    // The held-out split of the 1-digit task leaves a batch of 8 x 5 tokens: refused at once.
    let out = dir.join("heldout");
    let started = std::time::Instant::now();
    fails_with(
        &train(&out, &["--precision", "fp8-delayed", "--digits", "1", "--steps", "200"]),
        &["held-out", "multiples of 16", "40"],
    );
    assert!(started.elapsed().as_secs() < 20, "failed late: {:?}", started.elapsed());
    assert!(!out.join("fp8-delayed").exists(), "nothing trained");
    // --batch 3 fails for fp8 before the fp32 run trains.
    let out = dir.join("batch3");
    fails_with(
        &fp8(&[
            "train",
            "--compare",
            "fp32,fp8-delayed",
            "--steps",
            "2",
            "--batch",
            "3",
            "--quiet",
            "--out",
            s(&out),
        ]),
        &["fp8-delayed", "3 sequences per micro-batch x 8 tokens = 24"],
    );
    assert!(!out.join("fp32").exists());
    // FP8 widths too.
    let width = dir.join("width");
    fails_with(
        &fp8(&[
            "train",
            "--compare",
            "fp32,fp8-delayed",
            "--hidden",
            "24",
            "--steps",
            "1",
            "--out",
            s(&width),
        ]),
        &["multiples of 16"],
    );
    assert!(!width.join("fp32").exists());
}

#[test]
fn huge_sizes_are_errors_naming_needed_and_available_bytes() {
    let dir = scratch("huge");
    for extra in [
        ["--hidden", "4611686018427387920"],
        ["--hidden", "1048576"],
        ["--ffn", "100000000000"],
        ["--batch", "1000000000"],
        ["--layers", "100000000"],
    ] {
        let mut args = vec!["train", "--steps", "1", "--quiet", "--out", s(&dir)];
        args.extend_from_slice(&extra);
        let out = fp8(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(
            stderr.contains("needs") || stderr.contains("too large"),
            "{extra:?}: {stderr}"
        );
    }
    for bench in [
        vec!["bench", "gemm", "--m", "10000000", "--n", "10000000", "--k", "16"],
        vec!["bench", "gemm", "--m", "18446744073709551615", "--n", "2", "--k", "16"],
        vec!["bench", "layer", "--hidden", "1048576", "--ffn", "4194304"],
        vec!["bench", "layer", "--batch", "18446744073709551615"],
    ] {
        fails_with(&fp8(&bench), &["needs", "available"]);
    }
    let text = dir.join("t.txt");
    fs::write(&text, "some text to train on. ".repeat(50)).unwrap();
    fails_with(
        &fp8(&[
            "train",
            "--text",
            s(&text),
            "--seq",
            "18446744073709551615",
            "--steps",
            "1",
            "--out",
            s(&dir),
        ]),
        &["seq_len", "too large"],
    );
}

#[cfg(unix)]
#[test]
fn inputs_must_be_regular_files_of_bounded_size() {
    let dir = scratch("inputs");
    for args in [
        vec!["inspect", "/dev/zero"],
        vec!["quantize", "/dev/zero", s(&dir.join("o.st")), "--recipe", "current"],
        vec!["train", "--text", "/dev/zero", "--steps", "1", "--out", s(&dir)],
        vec![
            "train",
            "--precision",
            "fp32",
            "--resume",
            "/dev/zero",
            "--steps",
            "1",
            "--out",
            s(&dir),
        ],
    ] {
        fails_with(&fp8(&args), &["/dev/zero", "not a regular file"]);
    }
    // A header that does not account for the data is refused before the data is read.
    let file = dir.join("padded.safetensors");
    safetensors(&file, &["w"]);
    let mut bytes = fs::read(&file).unwrap();
    bytes.resize(bytes.len() + (1 << 20), 0);
    fs::write(&file, &bytes).unwrap();
    fails_with(&fp8(&["inspect", s(&file)]), &["describes 1024 bytes of tensor data"]);
    let mut zero = 0u64.to_le_bytes().to_vec();
    zero.resize(1 << 20, 0);
    fs::write(&file, &zero).unwrap();
    fails_with(&fp8(&["inspect", s(&file)]), &["not a valid safetensors file"]);
    // --text is capped, and the cap can be raised.
    let text = dir.join("t.txt");
    fs::write(&text, "abcdefgh ".repeat(100)).unwrap();
    fails_with(
        &fp8(&[
            "train",
            "--text",
            s(&text),
            "--max-text-bytes",
            "100",
            "--steps",
            "1",
            "--out",
            s(&dir),
        ]),
        &["900 bytes", "limit of 100 bytes", "--max-text-bytes"],
    );
}

fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_str(&fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn nothing_to_do_is_not_an_error_and_summaries_merge_per_precision() {
    let dir = scratch("bookkeeping");
    succeeds(&train(&dir.join("zero"), &["--steps", "0"]));
    succeeds(&train(&dir.join("stop0"), &["--steps", "4", "--stop-after", "0"]));
    let out = dir.join("compare");
    succeeds(&train(&out, &["--steps", "3"]));
    let before = summary(&out);
    assert!(before["fp32"]["final_train_loss"].is_number());
    // Resuming the finished fp32 run: exit 0, both entries kept, the training loss kept.
    let ckpt = out.join("fp32/checkpoint.safetensors");
    succeeds(&train(
        &out,
        &["--steps", "3", "--precision", "fp32", "--resume", s(&ckpt)],
    ));
    let after = summary(&out);
    assert_eq!(after["fp32"]["final_train_loss"], before["fp32"]["final_train_loss"]);
    assert_eq!(after["fp8-delayed"], before["fp8-delayed"]);
}

#[test]
fn resume_survives_a_torn_line_and_names_what_differs() {
    let dir = scratch("resume");
    let out = dir.join("run");
    succeeds(&train(
        &out,
        &["--precision", "fp32", "--steps", "20", "--stop-after", "2"],
    ));
    let metrics = out.join("fp32/metrics.jsonl");
    let text = fs::read_to_string(&metrics).unwrap();
    fs::write(&metrics, format!("{text}{{\"step\": 2, \"lo")).unwrap();
    let ckpt = out.join("fp32/checkpoint.safetensors");
    // Extending the run (--steps) and checkpointing more often may change; the default warmup
    // is the checkpoint's (20 / 10 = 2), not a tenth of the new --steps (4).
    succeeds(&train(
        &out,
        &[
            "--precision",
            "fp32",
            "--steps",
            "40",
            "--stop-after",
            "6",
            "--checkpoint-every",
            "1",
            "--resume",
            s(&ckpt),
        ],
    ));
    let steps: Vec<u64> = fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, (0..6).collect::<Vec<_>>());
    // Another learning rate is another run: the field is named.
    fails_with(
        &train(
            &out,
            &[
                "--precision",
                "fp32",
                "--steps",
                "40",
                "--lr",
                "0.1",
                "--resume",
                s(&ckpt),
            ],
        ),
        &["run.lr is 0.00300000", "in the checkpoint and 0.100000", "in this run"],
    );
    // An edited step counter in the metadata is caught by the checksum.
    let bytes = fs::read(&ckpt).unwrap();
    let pattern = br#"\"step\":6"#;
    let at = bytes
        .windows(pattern.len())
        .position(|w| w == pattern)
        .expect("step in the progress metadata");
    let mut edited = bytes.clone();
    edited[at + 9] = b'5';
    fs::write(&ckpt, edited).unwrap();
    fails_with(
        &train(
            &out,
            &[
                "--precision",
                "fp32",
                "--steps",
                "8",
                "--warmup",
                "0",
                "--resume",
                s(&ckpt),
            ],
        ),
        &["checksum mismatch"],
    );
}

#[test]
fn small_input_checks() {
    let dir = scratch("small");
    for clip in ["--clip=nan", "--clip=-1"] {
        fails_with(
            &train(&dir, &["--steps", "1", clip]),
            &["--clip", "expected a gradient norm"],
        );
    }
    fails_with(&train(&dir, &["--steps", "1", "--clip", "-1"]), &["--clip -1"]);
    succeeds(&train(&dir, &["--precision", "fp32", "--steps", "1", "--clip", "inf"]));
    fails_with(&fp8(&["train", "--steps", "-1"]), &["'-1'", "--steps"]);
    // A diverging run exits 1 unless asked to go on.
    let diverge = ["--precision", "fp32", "--steps", "6", "--lr", "1e30", "--clip", "0"];
    let out = train(&dir.join("nan"), &diverge);
    fails_with(&out, &["diverged"]);
    let mut go_on = diverge.to_vec();
    go_on.push("--allow-non-finite-loss");
    succeeds(&train(&dir.join("nan"), &go_on));
    // Names from input files are escaped in tables and errors.
    let input = dir.join("names.safetensors");
    safetensors(&input, &["evil\n\u{1b}[31mname"]);
    let quantized = dir.join("q.safetensors");
    succeeds(&fp8(&["quantize", s(&input), s(&quantized), "--recipe", "current"]));
    let table = succeeds(&fp8(&["inspect", s(&quantized)]));
    assert!(
        table.contains("evil\\n\\u{1b}[31mname") && !table.contains('\u{1b}'),
        "{table}"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn cast_to_a_closed_stdout_is_an_error() {
    let dir = scratch("closed");
    let input = dir.join("x.f32");
    fs::write(
        &input,
        [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' cast --to e4m3 < '{}' >&-",
            env!("CARGO_BIN_EXE_fp8"),
            s(&input)
        ))
        .output()
        .unwrap();
    fails_with(&out, &["stdout is closed"]);
}

/// A reader that stops early (`fp8 train | head -1`) stops the tool with one `fp8: error:`
/// line and status 1, as a closed stdout does for `cast`, instead of a panic and backtrace.
#[test]
fn a_reader_that_stops_early_stops_the_tool_with_an_error() {
    use std::process::Stdio;
    let out = scratch("reader-stops");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fp8"))
        .args(["train", "--steps", "20", "--device", "cpu", "--out", s(&out)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fp8");
    // The reader goes away before the tool prints anything (its table comes after training),
    // so its first `println!` meets a closed pipe, however the machine schedules the two.
    drop(child.stdout.take());
    let done = child.wait_with_output().expect("wait for fp8");
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(1), "stderr: {stderr}");
    fails_with(&done, &["stdout was closed by its reader"]);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
