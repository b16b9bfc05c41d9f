//! Writing the fine-grained FP8 layout: the exported directory loads back with its
//! quantization_config, every decoder linear weight is the engine's 128x128 E4M3 quantization of
//! the original (codes and scales bit for bit), everything else is copied byte for byte.

use std::path::Path;

use fp8_engine::format::Fp8Format;
use fp8_engine::hf::{HfModelDir, write_hf_fp8};
use fp8_engine::quantize::{ScaleRule, quantize_128x128};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf/models")
        .join(name)
}

#[test]
fn exported_fp8_checkpoint_round_trips() {
    let src = HfModelDir::open(&fixture("qwen2")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let summary = write_hf_fp8(&src, out.path(), false, &[]).unwrap();
    assert_eq!(summary.quantized.len(), 2 * 7);
    assert!(summary.side_files.contains(&"tokenizer.json".to_string()));
    let fp8 = HfModelDir::open(out.path()).unwrap();
    assert_eq!(fp8.config.fp8.as_ref().unwrap().block, [128, 128]);
    assert_eq!(fp8.config.qkv_bias, src.config.qkv_bias);
    let rule = ScaleRule {
        format: Fp8Format::E4M3,
        power_2_scale: false,
        amax_epsilon: 0.0,
    };
    for name in &summary.quantized {
        let original = src.read_f32(name).unwrap();
        let shape = &src.shards.entry(name).unwrap().shape;
        let (rows, cols) = (shape[0], shape[1]);
        let mut codes = vec![0u8; rows * cols];
        let mut scale_inv = vec![0f32; rows.div_ceil(128) * cols.div_ceil(128)];
        quantize_128x128(&original, rows, cols, &rule, &mut codes, &mut scale_inv).unwrap();
        assert_eq!(fp8.shards.bytes(name).unwrap(), &codes[..], "{name}");
        let stored: Vec<f32> = fp8
            .shards
            .bytes(&format!("{name}_scale_inv"))
            .unwrap()
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(stored, scale_inv, "{name}");
        // E4M3 keeps 3 mantissa bits: relative error at most 2^-4 above the subnormal range.
        let amax = original.iter().fold(0f32, |m, v| m.max(v.abs()));
        let loaded = fp8.read_f32(name).unwrap();
        for (a, b) in original.iter().zip(&loaded) {
            assert!(
                (a - b).abs() <= a.abs() / 16.0 + amax * 2f32.powi(-15),
                "{name}: {a} vs {b}"
            );
        }
    }
    for name in &summary.copied {
        assert_eq!(
            src.shards.bytes(name).unwrap(),
            fp8.shards.bytes(name).unwrap(),
            "{name}"
        );
    }
    assert_eq!(
        std::fs::read(out.path().join("tokenizer.json")).unwrap(),
        std::fs::read(fixture("qwen2").join("tokenizer.json")).unwrap()
    );

    // Exporting again from the FP8 directory, or into the source directory, is refused.
    let again = tempfile::tempdir().unwrap();
    assert!(
        write_hf_fp8(&fp8, again.path(), false, &[])
            .unwrap_err()
            .to_string()
            .contains("already")
    );
    assert!(
        write_hf_fp8(&src, &fixture("qwen2"), false, &[])
            .unwrap_err()
            .to_string()
            .contains("input directory")
    );
}

#[test]
fn kept_modules_stay_in_their_dtype() {
    let src = HfModelDir::open(&fixture("llama")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let summary = write_hf_fp8(&src, out.path(), true, &["down_proj".to_string()]).unwrap();
    assert_eq!(summary.quantized.len(), 2 * 6);
    assert!(summary.copied.iter().any(|n| n.ends_with("down_proj.weight")));
    let fp8 = HfModelDir::open(out.path()).unwrap();
    assert_eq!(
        fp8.config.fp8.as_ref().unwrap().modules_to_not_convert,
        vec!["down_proj".to_string()]
    );
    // Power-of-two scales when asked.
    let scales = fp8
        .read_f32("model.layers.0.self_attn.q_proj.weight_scale_inv")
        .unwrap();
    assert!(scales.iter().all(|s| s.to_bits() & 0x007f_ffff == 0), "{scales:?}");
}
