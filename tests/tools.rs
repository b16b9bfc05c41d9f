//! The `fp8 recipe replay`, `quantize`, `dequantize` and `inspect` behaviour
//! through the library functions, against the scalar reference; then a few
//! runs of the real binary for exit codes and one-line errors.

mod reference;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use fp8_engine::Error;
use fp8_engine::format::Fp8Format;
use fp8_engine::scaling::{AmaxComputeAlgo, DelayedScaling};
use fp8_engine::tools::inspect::{inspect_bytes, inspect_file, render};
use fp8_engine::tools::replay::{parse_amax_trace, render as render_replay, replay};
use fp8_engine::tools::safetensors_quant::{
    FileRecipe, QuantizeOptions, dequantize_bytes, dequantize_file, quantize_bytes, quantize_file,
};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reference::*;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

// ---------------------------------------------------------------- helpers

/// A tensor of the test files: dtype, shape, values (as f32 for float dtypes).
struct Spec {
    name: &'static str,
    dtype: Dtype,
    shape: Vec<usize>,
    values: Vec<f32>,
}

fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let row_scale = 2f32.powi((i / 97 % 20) as i32 - 10);
            rng.random_range(-1.0f32..1.0) * row_scale
        })
        .collect()
}

fn encode(spec: &Spec) -> Vec<u8> {
    match spec.dtype {
        Dtype::F32 => spec.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::BF16 => spec
            .values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
        Dtype::F16 => spec
            .values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
        Dtype::I64 => spec.values.iter().flat_map(|v| (*v as i64).to_le_bytes()).collect(),
        Dtype::U8 | Dtype::F8_E4M3 | Dtype::F8_E5M2 | Dtype::F8_E8M0 => spec.values.iter().map(|v| *v as u8).collect(),
        other => panic!("test helper does not encode {other}"),
    }
}

/// The f32 values a stored tensor holds (exact widening).
fn stored_values(spec: &Spec) -> Vec<f32> {
    match spec.dtype {
        Dtype::BF16 => spec.values.iter().map(|v| bf16::from_f32(*v).to_f32()).collect(),
        Dtype::F16 => spec.values.iter().map(|v| f16::from_f32(*v).to_f32()).collect(),
        _ => spec.values.clone(),
    }
}

fn write_safetensors(specs: &[Spec], metadata: Option<HashMap<String, String>>) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = specs.iter().map(encode).collect();
    let views: Vec<(&str, TensorView<'_>)> = specs
        .iter()
        .zip(&bytes)
        .map(|(s, b)| (s.name, TensorView::new(s.dtype, s.shape.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, metadata).unwrap()
}

fn model_specs() -> Vec<Spec> {
    let w = random_values(130 * 257, 1);
    let b = random_values(64 * 300, 2);
    let h = random_values(3 * 5, 3);
    vec![
        Spec {
            name: "layer.w",
            dtype: Dtype::F32,
            shape: vec![130, 257],
            values: w,
        },
        Spec {
            name: "layer.b16",
            dtype: Dtype::BF16,
            shape: vec![64, 300],
            values: b,
        },
        Spec {
            name: "small.h",
            dtype: Dtype::F16,
            shape: vec![3, 5],
            values: h,
        },
        Spec {
            name: "layer.bias",
            dtype: Dtype::F32,
            shape: vec![7],
            values: random_values(7, 4),
        },
        Spec {
            name: "steps",
            dtype: Dtype::I64,
            shape: vec![2, 2],
            values: vec![1.0, 2.0, 3.0, 4.0],
        },
        Spec {
            name: "temp",
            dtype: Dtype::F32,
            shape: vec![],
            values: vec![0.5],
        },
        Spec {
            name: "cube",
            dtype: Dtype::F32,
            shape: vec![2, 2, 2],
            values: random_values(8, 5),
        },
    ]
}

fn metadata(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn f32s(data: &[u8]) -> Vec<f32> {
    data.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn file_metadata(bytes: &[u8]) -> HashMap<String, String> {
    let (_, header) = SafeTensors::read_metadata(bytes).unwrap();
    header.metadata().clone().unwrap_or_default()
}

/// A fresh directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("fp8-tools-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tensor_name_of(err: &Error) -> &str {
    match err {
        Error::InvalidTensor { name, .. } => name,
        other => panic!("expected an error naming a tensor, got {other:?}"),
    }
}

// ---------------------------------------------------------------- replay

#[test]
fn replay_matches_the_reference_and_prints_round_trip_numbers() {
    let mut rng = StdRng::seed_from_u64(7);
    let specials = [0.0f32, f32::NAN, f32::INFINITY, f32::from_bits(1), f32::MAX, 1e-30];
    let trace: Vec<f32> = (0..300)
        .map(|_| {
            if rng.random_range(0..5) == 0 {
                specials[rng.random_range(0..specials.len())]
            } else {
                rng.random_range(0.0f32..3.0) * 2f32.powi(rng.random_range(-20..20))
            }
        })
        .collect();
    for len in [1usize, 2, 5, 64] {
        for algo in [AmaxComputeAlgo::Max, AmaxComputeAlgo::MostRecent] {
            for margin in [0, 2] {
                for format in Fp8Format::ALL {
                    let recipe = DelayedScaling {
                        margin,
                        amax_history_len: len,
                        amax_compute_algo: algo,
                        ..DelayedScaling::default()
                    };
                    let steps = replay(&recipe, format, &trace).unwrap();
                    let mut slot = RefSlot::new(len);
                    for (i, (step, &amax)) in steps.iter().zip(&trace).enumerate() {
                        slot.history[0] = amax;
                        slot.update(algo, fp8_max(format), margin);
                        assert_eq!(step.step, i + 1);
                        assert!(same(step.amax, amax));
                        assert!(
                            same(step.scale, slot.scale),
                            "step {i}: {} vs {}",
                            step.scale,
                            slot.scale
                        );
                    }
                    // Every printed number parses back to the same f32.
                    let text = render_replay(&steps);
                    assert_eq!(text.lines().count(), steps.len());
                    for (line, step) in text.lines().zip(&steps) {
                        let fields: Vec<&str> = line.split(' ').collect();
                        assert_eq!(fields.len(), 3, "{line}");
                        assert_eq!(fields[0].parse::<usize>().unwrap(), step.step);
                        assert!(same(fields[1].parse::<f32>().unwrap(), step.amax), "{line}");
                        assert!(same(fields[2].parse::<f32>().unwrap(), step.scale), "{line}");
                    }
                }
            }
        }
    }
}

#[test]
fn trace_parsing_accepts_specials_and_names_bad_lines() {
    let parsed = parse_amax_trace("1.5\n  nan \n\n# comment\ninf\n0\nNaN\n1e-45\n3e38\n").unwrap();
    let want = [1.5, f32::NAN, f32::INFINITY, 0.0, f32::NAN, f32::from_bits(1), 3e38];
    assert_eq!(parsed.len(), want.len());
    for (g, w) in parsed.iter().zip(want) {
        assert!(same(*g, w), "{g} vs {w}");
    }
    for (text, line) in [("1\n2\nabc\n", 3), ("1\n\n-0.5\n", 3), ("-inf\n", 1), ("0x10\n", 1)] {
        match parse_amax_trace(text) {
            Err(Error::InvalidLine { line: got, .. }) => assert_eq!(got, line, "{text:?}"),
            other => panic!("{text:?}: {other:?}"),
        }
    }
    let bad = DelayedScaling {
        amax_history_len: 0,
        ..DelayedScaling::default()
    };
    assert!(matches!(
        replay(&bad, Fp8Format::E4M3, &[1.0]),
        Err(Error::InvalidRecipe { .. })
    ));
}

// ---------------------------------------------------------------- quantize / dequantize

/// What one quantized tensor in a file must look like, from the reference.
fn expected_quantization(
    values: &[f32],
    rows: usize,
    cols: usize,
    opts: &QuantizeOptions,
) -> (Vec<u8>, Dtype, Vec<usize>, Vec<u8>) {
    let format = opts.format;
    let pow2 = opts.power_2_scale();
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>();
    match opts.recipe {
        FileRecipe::Current => {
            let scale = ref_current(ref_amax(values.iter().copied()), fp8_max(format), pow2, 0.0);
            (
                ref_cast(values, format, scale),
                Dtype::F32,
                vec![],
                f32_bytes(&[1.0 / scale]),
            )
        }
        FileRecipe::Block1x128 => {
            let (codes, s) = ref_blocks(values, rows, cols, (1, 128), format, ref_block_rule(format, pow2, 0.0));
            (codes, Dtype::F32, vec![rows, cols.div_ceil(128)], f32_bytes(&s))
        }
        FileRecipe::Block128 => {
            let (codes, s) = ref_blocks(
                values,
                rows,
                cols,
                (128, 128),
                format,
                ref_block_rule(format, pow2, 0.0),
            );
            (
                codes,
                Dtype::F32,
                vec![rows.div_ceil(128), cols.div_ceil(128)],
                f32_bytes(&s),
            )
        }
        FileRecipe::Mxfp8 => {
            let (codes, e) = ref_blocks(values, rows, cols, (1, 32), format, ref_mx_rule(format));
            (codes, Dtype::U8, vec![rows, cols.div_ceil(32)], e)
        }
    }
}

fn all_options() -> Vec<QuantizeOptions> {
    let mut all = Vec::new();
    for recipe in FileRecipe::ALL {
        for format in Fp8Format::ALL {
            for power_2_scale in [None, Some(true), Some(false)] {
                if recipe == FileRecipe::Mxfp8 && power_2_scale == Some(false) {
                    continue;
                }
                all.push(QuantizeOptions {
                    recipe,
                    format,
                    power_2_scale,
                });
            }
        }
    }
    all
}

#[test]
fn pow2_defaults_follow_the_issue() {
    assert!(!QuantizeOptions::new(FileRecipe::Current).power_2_scale());
    assert!(QuantizeOptions::new(FileRecipe::Block1x128).power_2_scale());
    assert!(QuantizeOptions::new(FileRecipe::Block128).power_2_scale());
    assert_eq!(QuantizeOptions::new(FileRecipe::Current).format, Fp8Format::E4M3);
    for recipe in FileRecipe::ALL {
        assert_eq!(recipe.name().parse::<FileRecipe>().unwrap(), recipe);
    }
    assert!("block64".parse::<FileRecipe>().is_err());
}

#[test]
fn quantize_writes_reference_codes_scales_and_metadata() {
    let specs = model_specs();
    let input = write_safetensors(&specs, Some(metadata(&[("author", "me"), ("fp8.recipe", "stale")])));
    for opts in all_options() {
        let ctx = format!("{opts:?}");
        let (out, summary) = quantize_bytes(&input, "in", &opts).unwrap();
        assert_eq!(summary.converted, vec!["layer.b16", "layer.w", "small.h"], "{ctx}");
        assert_eq!(summary.copied, vec!["cube", "layer.bias", "steps", "temp"], "{ctx}");
        let file = SafeTensors::deserialize(&out).unwrap();
        let meta = file_metadata(&out);
        assert_eq!(meta["author"], "me");
        assert_eq!(meta["fp8.recipe"], opts.recipe.name());
        assert_eq!(meta["fp8.format"], opts.format.name());
        if opts.recipe != FileRecipe::Mxfp8 {
            assert_eq!(meta["fp8.power_2_scale"], opts.power_2_scale().to_string());
        }
        for spec in &specs {
            let view = file.tensor(spec.name).unwrap();
            let quantized = spec.shape.len() == 2 && spec.dtype != Dtype::I64;
            if !quantized {
                assert_eq!(view.dtype(), spec.dtype, "{ctx} {}", spec.name);
                assert_eq!(view.data(), &encode(spec)[..], "{ctx}: {} copied unchanged", spec.name);
                continue;
            }
            assert_eq!(meta[&format!("fp8.source_dtype.{}", spec.name)], spec.dtype.to_string());
            let (rows, cols) = (spec.shape[0], spec.shape[1]);
            let want_dtype = match opts.format {
                Fp8Format::E4M3 => Dtype::F8_E4M3,
                Fp8Format::E5M2 => Dtype::F8_E5M2,
            };
            assert_eq!(view.dtype(), want_dtype);
            assert_eq!(view.shape(), &spec.shape[..]);
            let (codes, scale_dtype, scale_shape, scale_bytes) =
                expected_quantization(&stored_values(spec), rows, cols, &opts);
            let bad = view.data().iter().zip(&codes).filter(|(a, b)| a != b).count();
            assert_eq!(bad, 0, "{ctx} {}: {bad} code mismatches", spec.name);
            let suffix = if opts.recipe == FileRecipe::Mxfp8 {
                "scale_e8m0"
            } else {
                "scale_inv"
            };
            let scale = file.tensor(&format!("{}.{suffix}", spec.name)).unwrap();
            assert_eq!(scale.dtype(), scale_dtype, "{ctx}");
            assert_eq!(scale.shape(), &scale_shape[..], "{ctx} {}", spec.name);
            assert_eq!(scale.data(), &scale_bytes[..], "{ctx} {} scales", spec.name);
        }
        assert_eq!(file.len(), specs.len() + 3);
    }
}

#[test]
fn dequantize_reverses_quantize() {
    let specs = model_specs();
    let input = write_safetensors(&specs, Some(metadata(&[("author", "me")])));
    for opts in all_options() {
        let ctx = format!("{opts:?}");
        let (quantized, _) = quantize_bytes(&input, "in", &opts).unwrap();
        let (restored, summary) = dequantize_bytes(&quantized, "q").unwrap();
        assert_eq!(summary.converted.len(), 3);
        assert_eq!(
            file_metadata(&restored),
            metadata(&[("author", "me")]),
            "{ctx}: fp8 keys removed"
        );
        let q = SafeTensors::deserialize(&quantized).unwrap();
        let file = SafeTensors::deserialize(&restored).unwrap();
        assert_eq!(file.len(), specs.len(), "{ctx}: scale tensors dropped");
        for spec in &specs {
            let view = file.tensor(spec.name).unwrap();
            assert_eq!(view.dtype(), spec.dtype, "{ctx} {}", spec.name);
            assert_eq!(view.shape(), &spec.shape[..]);
            let quantized = spec.shape.len() == 2 && spec.dtype != Dtype::I64;
            if !quantized {
                assert_eq!(view.data(), &encode(spec)[..]);
                continue;
            }
            // Reference: decode(q) * scale_inv of the element's block, rounded to the original dtype.
            let (rows, cols) = (spec.shape[0], spec.shape[1]);
            let format = opts.format;
            let codes = q.tensor(spec.name).unwrap().data().to_vec();
            let suffix = if opts.recipe == FileRecipe::Mxfp8 {
                "scale_e8m0"
            } else {
                "scale_inv"
            };
            let scale = q.tensor(&format!("{}.{suffix}", spec.name)).unwrap().data().to_vec();
            let scale_inv = |r: usize, c: usize| -> f32 {
                match opts.recipe {
                    FileRecipe::Current => f32s(&scale)[0],
                    FileRecipe::Block1x128 => f32s(&scale)[r * cols.div_ceil(128) + c / 128],
                    FileRecipe::Block128 => f32s(&scale)[(r / 128) * cols.div_ceil(128) + c / 128],
                    FileRecipe::Mxfp8 => 2f64.powi(scale[r * cols.div_ceil(32) + c / 32] as i32 - 127) as f32,
                }
            };
            let mut want = Vec::new();
            for r in 0..rows {
                for c in 0..cols {
                    want.push(format.decode(codes[r * cols + c]) * scale_inv(r, c));
                }
            }
            let want_spec = Spec {
                name: spec.name,
                dtype: spec.dtype,
                shape: spec.shape.clone(),
                values: want,
            };
            assert_eq!(view.data(), &encode(&want_spec)[..], "{ctx} {}", spec.name);
            // And it is close to the original: the per-element error bound of the format.
            let restored = f32s_or_half(view.data(), spec.dtype);
            for (&x, &y) in stored_values(spec).iter().zip(&restored) {
                let tolerance = match format {
                    Fp8Format::E4M3 => 0.0675 + 0.125 * x.abs(),
                    Fp8Format::E5M2 => 0.125 + 0.25 * x.abs(),
                };
                assert!((x - y).abs() <= tolerance, "{ctx} {}: {x} -> {y}", spec.name);
            }
        }
    }
}

fn f32s_or_half(data: &[u8], dtype: Dtype) -> Vec<f32> {
    let words = || data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    match dtype {
        Dtype::BF16 => words().map(|w| bf16::from_bits(w).to_f32()).collect(),
        Dtype::F16 => words().map(|w| f16::from_bits(w).to_f32()).collect(),
        _ => f32s(data),
    }
}

#[test]
fn bad_inputs_are_errors_naming_the_file_or_tensor() {
    let opts = QuantizeOptions::new(FileRecipe::Block1x128);
    // Corrupt header and truncated file name the input.
    for bytes in [
        b"not a safetensors file at all".to_vec(),
        write_safetensors(&model_specs(), None)[..40].to_vec(),
    ] {
        match quantize_bytes(&bytes, "broken.safetensors", &opts) {
            Err(Error::InvalidFile { path, .. }) => assert_eq!(path, "broken.safetensors"),
            other => panic!("{other:?}"),
        }
    }
    // An empty 2-D float tensor.
    let empty = write_safetensors(
        &[Spec {
            name: "empty.w",
            dtype: Dtype::F32,
            shape: vec![0, 16],
            values: vec![],
        }],
        None,
    );
    let err = quantize_bytes(&empty, "in", &opts).unwrap_err();
    assert_eq!(tensor_name_of(&err), "empty.w");
    assert!(err.to_string().contains("empty"), "{err}");
    // An input tensor that is already FP8.
    let fp8 = write_safetensors(
        &[Spec {
            name: "already",
            dtype: Dtype::F8_E4M3,
            shape: vec![2, 2],
            values: vec![1.0; 4],
        }],
        None,
    );
    assert_eq!(
        tensor_name_of(&quantize_bytes(&fp8, "in", &opts).unwrap_err()),
        "already"
    );
    // A name clash with the scale tensor to be written.
    let clash = write_safetensors(
        &[
            Spec {
                name: "w",
                dtype: Dtype::F32,
                shape: vec![2, 2],
                values: vec![1.0; 4],
            },
            Spec {
                name: "w.scale_inv",
                dtype: Dtype::F32,
                shape: vec![1],
                values: vec![1.0],
            },
        ],
        None,
    );
    assert_eq!(tensor_name_of(&quantize_bytes(&clash, "in", &opts).unwrap_err()), "w");
    // --no-pow2 cannot apply to MXFP8.
    let mx = QuantizeOptions {
        power_2_scale: Some(false),
        ..QuantizeOptions::new(FileRecipe::Mxfp8)
    };
    assert!(matches!(
        quantize_bytes(&clash, "in", &mx),
        Err(Error::InvalidRecipe { .. })
    ));
}

#[test]
fn bad_quantized_files_are_errors_naming_the_tensor() {
    let recipe = |name: &str| Some(metadata(&[("fp8.recipe", name)]));
    // No fp8 metadata at all.
    let plain = write_safetensors(&model_specs(), None);
    assert!(matches!(
        dequantize_bytes(&plain, "plain"),
        Err(Error::InvalidFile { .. })
    ));
    // Unknown recipe name.
    let unknown = write_safetensors(&[], recipe("block64"));
    assert!(matches!(
        dequantize_bytes(&unknown, "u"),
        Err(Error::InvalidFile { .. })
    ));
    let cases: Vec<(Vec<Spec>, &str, &str)> = vec![
        // Rank 3 FP8 tensor.
        (
            vec![
                Spec {
                    name: "t",
                    dtype: Dtype::F8_E4M3,
                    shape: vec![2, 2, 2],
                    values: vec![0.0; 8],
                },
                Spec {
                    name: "t.scale_inv",
                    dtype: Dtype::F32,
                    shape: vec![],
                    values: vec![1.0],
                },
            ],
            "current",
            "t",
        ),
        // Unsupported FP8 data dtype.
        (
            vec![Spec {
                name: "e",
                dtype: Dtype::F8_E8M0,
                shape: vec![2, 2],
                values: vec![0.0; 4],
            }],
            "current",
            "e",
        ),
        // Missing scale tensor.
        (
            vec![Spec {
                name: "m",
                dtype: Dtype::F8_E5M2,
                shape: vec![2, 2],
                values: vec![0.0; 4],
            }],
            "block128",
            "m",
        ),
        // Scale tensor of the wrong shape: named by the scale tensor.
        (
            vec![
                Spec {
                    name: "s",
                    dtype: Dtype::F8_E4M3,
                    shape: vec![2, 200],
                    values: vec![0.0; 400],
                },
                Spec {
                    name: "s.scale_inv",
                    dtype: Dtype::F32,
                    shape: vec![2, 1],
                    values: vec![1.0; 2],
                },
            ],
            "block1x128",
            "s.scale_inv",
        ),
        // Scale tensor of the wrong dtype.
        (
            vec![
                Spec {
                    name: "x",
                    dtype: Dtype::F8_E4M3,
                    shape: vec![1, 40],
                    values: vec![0.0; 40],
                },
                Spec {
                    name: "x.scale_e8m0",
                    dtype: Dtype::F32,
                    shape: vec![1, 2],
                    values: vec![1.0; 2],
                },
            ],
            "mxfp8",
            "x.scale_e8m0",
        ),
        // A scale_inv that is not a usable scale (0).
        (
            vec![
                Spec {
                    name: "z",
                    dtype: Dtype::F8_E4M3,
                    shape: vec![1, 3],
                    values: vec![56.0; 3],
                },
                Spec {
                    name: "z.scale_inv",
                    dtype: Dtype::F32,
                    shape: vec![],
                    values: vec![0.0],
                },
            ],
            "current",
            "z",
        ),
    ];
    for (specs, recipe_name, bad) in cases {
        let bytes = write_safetensors(&specs, recipe(recipe_name));
        let err = dequantize_bytes(&bytes, "q").unwrap_err();
        assert_eq!(tensor_name_of(&err), bad, "{err}");
        // inspect reads quantized tensors the same way.
        if bad != "e" {
            assert!(inspect_bytes(&bytes, "q", None).is_err());
        }
    }
}

#[test]
fn files_are_written_atomically() {
    let dir = TempDir::new("atomic");
    let input = dir.path("in.safetensors");
    let output = dir.path("out.safetensors");
    std::fs::write(&input, write_safetensors(&model_specs(), None)).unwrap();
    std::fs::write(&output, b"previous contents").unwrap();
    let opts = QuantizeOptions::new(FileRecipe::Block128);
    // Success: the output is replaced, no temporary file is left behind.
    let summary = quantize_file(&input, &output, &opts).unwrap();
    assert_eq!(summary.converted.len(), 3);
    assert_eq!(dir.entries(), vec!["in.safetensors", "out.safetensors"]);
    let (want, _) = quantize_bytes(&std::fs::read(&input).unwrap(), "x", &opts).unwrap();
    assert_eq!(std::fs::read(&output).unwrap(), want);
    // Failure (an empty tensor): the previous output stays as it was.
    std::fs::write(&output, b"previous contents").unwrap();
    let bad = dir.path("bad.safetensors");
    std::fs::write(
        &bad,
        write_safetensors(
            &[Spec {
                name: "e",
                dtype: Dtype::F32,
                shape: vec![3, 0],
                values: vec![],
            }],
            None,
        ),
    )
    .unwrap();
    assert!(quantize_file(&bad, &output, &opts).is_err());
    assert_eq!(std::fs::read(&output).unwrap(), b"previous contents");
    // A missing input names its path; nothing is created.
    let missing = dir.path("missing.safetensors");
    match quantize_file(&missing, &dir.path("never.safetensors"), &opts) {
        Err(Error::Io { path, .. }) => assert!(path.ends_with("missing.safetensors")),
        other => panic!("{other:?}"),
    }
    // An output directory that does not exist: an error, no file anywhere.
    let nowhere = dir.path("no/such/dir/out.safetensors");
    assert!(matches!(quantize_file(&input, &nowhere, &opts), Err(Error::Io { .. })));
    assert_eq!(
        dir.entries(),
        vec!["bad.safetensors", "in.safetensors", "out.safetensors"]
    );
    // Dequantize writes the same way.
    let restored = dir.path("restored.safetensors");
    quantize_file(&input, &output, &opts).unwrap();
    dequantize_file(&output, &restored).unwrap();
    assert_eq!(
        dir.entries(),
        vec![
            "bad.safetensors",
            "in.safetensors",
            "out.safetensors",
            "restored.safetensors"
        ]
    );
}

// ---------------------------------------------------------------- inspect

#[test]
fn inspect_reports_amax_saturation_flushing_and_sqnr() {
    // Row 0: an inf forces the per-tensor scale to 1, so 1000 and inf clip to 448 and 1e-10 flushes.
    let mut values = random_values(4 * 64, 11);
    values[0] = f32::INFINITY;
    values[1] = 1000.0;
    values[2] = -600.0;
    values[3] = 1e-10;
    values[4] = 0.0;
    values[5] = f32::NAN;
    let specs = vec![
        Spec {
            name: "a",
            dtype: Dtype::F32,
            shape: vec![4, 64],
            values: values.clone(),
        },
        Spec {
            name: "ids",
            dtype: Dtype::I64,
            shape: vec![3],
            values: vec![1.0, 2.0, 3.0],
        },
        Spec {
            name: "v",
            dtype: Dtype::BF16,
            shape: vec![2, 3],
            values: vec![-7.5, 1.0, 2.0, 3.0, 4.0, 5.0],
        },
    ];
    let original = write_safetensors(&specs, None);
    let opts = QuantizeOptions::new(FileRecipe::Current);
    let (quantized, _) = quantize_bytes(&original, "orig", &opts).unwrap();

    // The original: plain amaxes.
    let plain = inspect_bytes(&original, "orig", None).unwrap();
    let names: Vec<&str> = plain.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["a", "ids", "v"]);
    assert_eq!(plain[0].amax, Some(f32::INFINITY));
    assert_eq!(plain[1].amax, None);
    assert_eq!(plain[2].amax, Some(7.5));
    assert!(plain.iter().all(|r| r.quality.is_none()));

    // Quantized, no reference: codes at max and zero codes; scale tensors not listed.
    let reports = inspect_bytes(&quantized, "q", None).unwrap();
    let names: Vec<&str> = reports.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["a", "ids", "v"]);
    let a = &reports[0];
    assert_eq!(a.dtype, "F8_E4M3");
    assert_eq!(a.shape, vec![4, 64]);
    let codes: Vec<u8> = values.iter().map(|&x| ref_encode(Fp8Format::E4M3, x)).collect();
    let decoded: Vec<f32> = codes.iter().map(|&c| Fp8Format::E4M3.decode(c)).collect();
    assert_eq!(a.amax, Some(ref_amax(decoded.iter().copied())));
    let q = a.quality.as_ref().unwrap();
    assert!(!q.against_reference && q.sqnr_db.is_none());
    assert_eq!(q.elements, 256);
    assert_eq!(q.saturated, codes.iter().filter(|&&c| c & 0x7F == 0x7E).count());
    assert_eq!(q.flushed, codes.iter().filter(|&&c| c & 0x7F == 0).count());

    // With the reference: clipped originals, flushed nonzero originals, SQNR over finite pairs.
    let reports = inspect_bytes(&quantized, "q", Some((&original, "orig"))).unwrap();
    let q = reports[0].quality.as_ref().unwrap();
    assert!(q.against_reference);
    assert_eq!(q.saturated, 3, "inf, 1000, -600 are beyond 464 at scale 1");
    let flushed = values
        .iter()
        .zip(&decoded)
        .filter(|(x, d)| x.is_finite() && **x != 0.0 && **d == 0.0)
        .count();
    assert!(flushed >= 1);
    assert_eq!(q.flushed, flushed);
    let (mut signal, mut noise) = (0.0f64, 0.0f64);
    for (&x, &d) in values.iter().zip(&decoded) {
        if x.is_finite() && d.is_finite() {
            signal += (x as f64).powi(2);
            noise += (x as f64 - d as f64).powi(2);
        }
    }
    let want = 10.0 * (signal / noise).log10();
    assert!((q.sqnr_db.unwrap() - want).abs() < 1e-9, "{:?} vs {want}", q.sqnr_db);
    let v = reports[2].quality.as_ref().unwrap();
    assert_eq!(v.saturated, 0);
    assert!(v.sqnr_db.unwrap() > 20.0);

    // The rendered table has a header and a line per tensor.
    let text = render(&reports);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("name") && lines[0].contains("sqnr_db"));
    assert!(lines[1].starts_with("a ") && lines[1].contains("F8_E4M3") && lines[1].contains("[4, 64]"));
    assert_eq!(lines.len(), 4);
    assert!(render(&inspect_bytes(&quantized, "q", None).unwrap()).contains("--reference"));
}

#[test]
fn inspect_reference_problems_name_the_tensor() {
    let specs = vec![Spec {
        name: "a",
        dtype: Dtype::F32,
        shape: vec![2, 3],
        values: vec![1.0; 6],
    }];
    let (quantized, _) = quantize_bytes(
        &write_safetensors(&specs, None),
        "o",
        &QuantizeOptions::new(FileRecipe::Current),
    )
    .unwrap();
    let other_shape = write_safetensors(
        &[Spec {
            name: "a",
            dtype: Dtype::F32,
            shape: vec![3, 2],
            values: vec![1.0; 6],
        }],
        None,
    );
    let other_dtype = write_safetensors(
        &[Spec {
            name: "a",
            dtype: Dtype::I64,
            shape: vec![2, 3],
            values: vec![1.0; 6],
        }],
        None,
    );
    let missing = write_safetensors(
        &[Spec {
            name: "b",
            dtype: Dtype::F32,
            shape: vec![2, 3],
            values: vec![1.0; 6],
        }],
        None,
    );
    for reference in [other_shape, other_dtype, missing] {
        let err = inspect_bytes(&quantized, "q", Some((&reference, "r"))).unwrap_err();
        assert_eq!(tensor_name_of(&err), "a", "{err}");
    }
    let dir = TempDir::new("inspect");
    match inspect_file(&dir.path("nope.safetensors"), None) {
        Err(Error::Io { path, .. }) => assert!(path.ends_with("nope.safetensors")),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------- the binary

fn fp8(args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_fp8"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_line_error(result: &(i32, String, String), code: i32, needle: &str) {
    let (status, _, stderr) = result;
    assert_eq!(*status, code, "stderr: {stderr}");
    assert!(stderr.starts_with("fp8: error: "), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(needle), "{stderr} should mention {needle}");
}

#[test]
fn binary_replay_prints_the_library_result() {
    let trace = "1\n2\n0\nnan\ninf\n0.5\n";
    let (status, stdout, stderr) = fp8(
        &["recipe", "replay", "--history-len", "3", "--algo", "most-recent"],
        trace,
    );
    assert_eq!(status, 0, "{stderr}");
    let recipe = DelayedScaling {
        amax_history_len: 3,
        amax_compute_algo: AmaxComputeAlgo::MostRecent,
        ..DelayedScaling::default()
    };
    let want = render_replay(&replay(&recipe, Fp8Format::E4M3, &parse_amax_trace(trace).unwrap()).unwrap());
    assert_eq!(stdout, want);
    let (status, e5m2, _) = fp8(&["recipe", "replay", "--format", "e5m2", "--margin", "1"], "2\n");
    assert_eq!(status, 0);
    assert_eq!(e5m2, "1 2 14336\n"); // 57344 * 2^-1 / 2
}

#[test]
fn binary_errors_exit_non_zero_with_one_line() {
    assert_one_line_error(&fp8(&["recipe", "replay"], "1\nfoo\n"), 1, "line 2");
    assert_one_line_error(&fp8(&["recipe", "replay", "--margin", "-1"], ""), 1, "margin");
    assert_one_line_error(
        &fp8(&["recipe", "replay", "--history-len", "0"], ""),
        1,
        "amax_history_len",
    );
    assert_one_line_error(&fp8(&["recipe", "replay", "--algo", "mean"], ""), 2, "mean");

    let dir = TempDir::new("binary");
    let missing = dir.path("missing.safetensors");
    let out = dir.path("out.safetensors");
    let (m, o) = (missing.to_str().unwrap(), out.to_str().unwrap());
    assert_one_line_error(
        &fp8(&["quantize", m, o, "--recipe", "current"], ""),
        1,
        "missing.safetensors",
    );
    assert_one_line_error(&fp8(&["quantize", m, o, "--recipe", "block64"], ""), 2, "block64");
    assert_one_line_error(
        &fp8(&["quantize", m, o, "--recipe", "current", "--pow2", "--no-pow2"], ""),
        2,
        "--pow2",
    );

    let corrupt = dir.path("corrupt.safetensors");
    std::fs::write(&corrupt, b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage").unwrap();
    let c = corrupt.to_str().unwrap();
    assert_one_line_error(
        &fp8(&["quantize", c, o, "--recipe", "mxfp8"], ""),
        1,
        "corrupt.safetensors",
    );
    assert_one_line_error(&fp8(&["inspect", c], ""), 1, "corrupt.safetensors");
    assert_one_line_error(&fp8(&["dequantize", c, o], ""), 1, "corrupt.safetensors");

    let empty = dir.path("empty.safetensors");
    std::fs::write(
        &empty,
        write_safetensors(
            &[Spec {
                name: "layers.0.w",
                dtype: Dtype::BF16,
                shape: vec![0, 4],
                values: vec![],
            }],
            None,
        ),
    )
    .unwrap();
    assert_one_line_error(
        &fp8(&["quantize", empty.to_str().unwrap(), o, "--recipe", "block128"], ""),
        1,
        "layers.0.w",
    );
    assert!(!Path::new(o).exists(), "a failed run leaves no output");

    // A good run, then inspect with the reference, through the binary.
    let good = dir.path("good.safetensors");
    std::fs::write(&good, write_safetensors(&model_specs(), None)).unwrap();
    let g = good.to_str().unwrap();
    let (status, stdout, stderr) = fp8(&["quantize", g, o, "--recipe", "block1x128", "--format", "e5m2"], "");
    assert_eq!(status, 0, "{stderr}");
    assert!(stdout.contains("quantized 3 tensors"), "{stdout}");
    let (status, stdout, _) = fp8(&["inspect", o, "--reference", g], "");
    assert_eq!(status, 0);
    assert!(stdout.contains("layer.w") && stdout.contains("F8_E5M2"), "{stdout}");
    assert_one_line_error(&fp8(&["dequantize", g, o], ""), 1, "fp8.recipe");
}
