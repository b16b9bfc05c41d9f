//! Unit tests of the GEMM dispatch's host logic (no GPU needed).

use super::*;

const E4: Fp8Format = Fp8Format::E4M3;
const E5: Fp8Format = Fp8Format::E5M2;

fn fp8(format: Fp8Format, rows: usize, k: usize, kind: ScaleKind) -> OperandDesc {
    let (r, c) = kind.scale_shape(rows, k);
    OperandDesc {
        dtype: InputDtype::Fp8(format),
        rows,
        cols: k,
        len: rows * k,
        scales: Some((kind, r * c)),
    }
}

fn plain(dtype: InputDtype, rows: usize, k: usize) -> OperandDesc {
    OperandDesc {
        dtype,
        rows,
        cols: k,
        len: rows * k,
        scales: None,
    }
}

fn detail(e: Error) -> String {
    match e {
        Error::KernelArgs { detail, .. } => detail,
        other => panic!("expected KernelArgs, got {other:?}"),
    }
}

#[test]
fn dispatch_table_by_compute_capability() {
    let fp8_pairs = [
        GemmInputs::Fp8(E4, E4),
        GemmInputs::Fp8(E4, E5),
        GemmInputs::Fp8(E5, E4),
    ];
    for cc in [(8, 9), (9, 0), (10, 0), (12, 0)] {
        for inputs in fp8_pairs {
            let k = select_kernel(cc, inputs).unwrap();
            assert_eq!(k.module, "gemm_mma_fp8");
            assert!(k.mma.starts_with("m16n8k32"));
        }
        assert_eq!(select_kernel(cc, GemmInputs::F16).unwrap().function, "fp8_gemm_mma_f16");
    }
    let names: Vec<_> = fp8_pairs
        .iter()
        .map(|&i| select_kernel((9, 0), i).unwrap().function)
        .collect();
    assert_eq!(
        names,
        [
            "fp8_gemm_mma_e4m3_e4m3",
            "fp8_gemm_mma_e4m3_e5m2",
            "fp8_gemm_mma_e5m2_e4m3"
        ]
    );
    for cc in [(7, 5), (8, 0), (8, 6), (8, 7)] {
        let e = detail(select_kernel(cc, GemmInputs::Fp8(E4, E4)).unwrap_err());
        assert!(e.contains("8.9") && e.contains(&format!("{}.{}", cc.0, cc.1)), "{e}");
    }
    assert_eq!(
        select_kernel((8, 0), GemmInputs::Bf16).unwrap().function,
        "fp8_gemm_mma_bf16"
    );
    assert_eq!(
        select_kernel((8, 6), GemmInputs::F16).unwrap().function,
        "fp8_gemm_mma_f16"
    );
    assert_eq!(
        select_kernel((7, 5), GemmInputs::F16).unwrap().function,
        "fp8_gemm_mma_f16_k8"
    );
    assert!(detail(select_kernel((7, 5), GemmInputs::Bf16).unwrap_err()).contains("8.0"));
    assert!(select_kernel((7, 0), GemmInputs::F16).is_err());
    assert!(select_kernel((9, 0), GemmInputs::Fp8(E5, E5)).is_err());
}

#[test]
fn cached_dispatch_agrees_with_the_table() {
    for cc in [(7, 5), (8, 0), (8, 9), (9, 0)] {
        for inputs in [GemmInputs::Fp8(E4, E4), GemmInputs::Bf16, GemmInputs::F16] {
            for _ in 0..2 {
                assert_eq!(
                    cached_kernel(cc, inputs).ok(),
                    select_kernel(cc, inputs).ok(),
                    "{cc:?} {inputs:?}"
                );
            }
        }
    }
}

#[test]
fn kernel_overrides_must_fit_inputs_and_gpu() {
    let k8 = select_kernel((7, 5), GemmInputs::F16).unwrap();
    let bf = select_kernel((8, 0), GemmInputs::Bf16).unwrap();
    let e4 = select_kernel((9, 0), GemmInputs::Fp8(E4, E4)).unwrap();
    assert!(check_override(k8, GemmInputs::F16, (9, 0)).is_ok());
    assert!(check_override(k8, GemmInputs::F16, (7, 5)).is_ok());
    assert!(check_override(bf, GemmInputs::F16, (9, 0)).is_err());
    assert!(check_override(bf, GemmInputs::Bf16, (7, 5)).is_err());
    assert!(check_override(e4, GemmInputs::Fp8(E4, E4), (8, 6)).is_err());
    assert!(check_override(e4, GemmInputs::Fp8(E4, E5), (9, 0)).is_err());
    assert!(check_override(e4, GemmInputs::Fp8(E4, E4), (12, 0)).is_ok());
}

#[test]
fn grid_covers_every_tile_once() {
    for (m, n) in [
        (1, 1),
        (128, 128),
        (129, 1),
        (1000, 300),
        (128 * 17, 128 * 3 + 5),
        (4096, 8192),
    ] {
        let blocks = grid_blocks(m, n).unwrap();
        let (tm, tn) = (m.div_ceil(TILE_M) as u32, n.div_ceil(TILE_N) as u32);
        assert_eq!(blocks, tm * tn);
        let mut seen = vec![false; blocks as usize];
        for pid in 0..blocks {
            let (i, j) = tile_of_block(pid, tm, tn);
            assert!(i < tm && j < tn, "{m}x{n}: block {pid} -> ({i}, {j})");
            let at = (i * tn + j) as usize;
            assert!(!seen[at], "{m}x{n}: tile ({i}, {j}) twice");
            seen[at] = true;
        }
    }
    // Within a full group, consecutive blocks walk down GROUP_M rows of tiles first.
    assert_eq!(tile_of_block(0, 64, 64), (0, 0));
    assert_eq!(tile_of_block(1, 64, 64), (1, 0));
    assert_eq!(tile_of_block(GROUP_M, 64, 64), (0, 1));
    assert!(grid_blocks(usize::MAX / 2, 1 << 20).is_err());
    assert_eq!(SMEM_BYTES, 65536);
}

#[test]
fn valid_launches_plan_the_kernel() {
    let a = fp8(E4, 300, 4096 + 64, ScaleKind::Block1x128);
    let b = fp8(E4, 200, 4096 + 64, ScaleKind::Block128x128);
    let p = check_launch(&a, &b, OutputDtype::Bf16, 300 * 200, Some(200), 0.0).unwrap();
    assert_eq!((p.m, p.n, p.k, p.k_blocks), (300, 200, 4160, 33));
    assert_eq!(p.scale_mode, FP8_GEMM_SCALES_1X128_BY_128X128);
    assert_eq!(p.blocks, 3 * 2);
    assert_eq!(p.inputs, GemmInputs::Fp8(E4, E4));
    let a = fp8(E5, 3, 16, ScaleKind::Block1x128);
    let b = fp8(E4, 5, 16, ScaleKind::Block1x128);
    let p = check_launch(&a, &b, OutputDtype::F32, 15, None, 1.0).unwrap();
    assert_eq!(p.scale_mode, FP8_GEMM_SCALES_1X128_BY_1X128);
    let a = fp8(E4, 3, 32, ScaleKind::PerTensor);
    let p = check_launch(
        &a,
        &fp8(E5, 5, 32, ScaleKind::PerTensor),
        OutputDtype::Fp8(E4),
        15,
        None,
        0.0,
    )
    .unwrap();
    assert_eq!(
        (p.scale_mode, p.out.code()),
        (FP8_GEMM_SCALES_PER_TENSOR, FP8_GEMM_OUT_E4M3)
    );
    let p = check_launch(
        &plain(InputDtype::Bf16, 7, 24),
        &plain(InputDtype::Bf16, 9, 24),
        OutputDtype::F16,
        63,
        None,
        0.0,
    )
    .unwrap();
    assert_eq!((p.inputs, p.scale_mode), (GemmInputs::Bf16, FP8_GEMM_SCALES_NONE));
    // An empty output launches nothing.
    let p = check_launch(
        &plain(InputDtype::F16, 0, 8),
        &plain(InputDtype::F16, 4, 8),
        OutputDtype::F32,
        0,
        None,
        0.0,
    )
    .unwrap();
    assert_eq!(p.blocks, 0);
}

#[test]
fn invalid_launches_name_the_problem() {
    let pt = ScaleKind::PerTensor;
    type Case = (
        OperandDesc,
        OperandDesc,
        OutputDtype,
        usize,
        Option<usize>,
        f32,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            fp8(E4, 4, 32, pt),
            fp8(E4, 4, 48, pt),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "same K",
        ),
        (
            fp8(E5, 4, 32, pt),
            fp8(E5, 4, 32, pt),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "E5M2 x E5M2",
        ),
        (
            fp8(E4, 4, 40, pt),
            fp8(E4, 4, 40, pt),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "multiple of 16",
        ),
        (
            plain(InputDtype::Bf16, 4, 12),
            plain(InputDtype::Bf16, 4, 12),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "bf16 GEMM 4x4x12: K must be a multiple of 8",
        ),
        (
            fp8(E4, 4, 32, ScaleKind::Mxfp8),
            fp8(E4, 4, 32, ScaleKind::Block1x128),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "Mxfp8 (A) x Block1x128 (B) are not a supported pair",
        ),
        (
            fp8(E5, 4, 32, ScaleKind::Mxfp8),
            fp8(E5, 4, 32, ScaleKind::Mxfp8),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "E5M2 x E5M2",
        ),
        (
            fp8(E4, 4, 32, ScaleKind::Block128x128),
            fp8(E4, 4, 32, ScaleKind::Block1x128),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "not a supported pair",
        ),
        (
            plain(InputDtype::F32, 4, 8),
            plain(InputDtype::F32, 4, 8),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "no f32 CUDA GEMM",
        ),
        (
            plain(InputDtype::Bf16, 4, 8),
            plain(InputDtype::F16, 4, 8),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "A is bf16 and B is f16",
        ),
        (
            fp8(E4, 4, 32, pt),
            plain(InputDtype::Bf16, 4, 32),
            OutputDtype::F32,
            16,
            None,
            0.0,
            "FP8 goes",
        ),
        (
            fp8(E4, 4, 32, pt),
            fp8(E4, 4, 32, pt),
            OutputDtype::F32,
            16,
            Some(5),
            0.0,
            "bias has 5",
        ),
        (
            fp8(E4, 4, 32, pt),
            fp8(E4, 4, 32, pt),
            OutputDtype::Bf16,
            16,
            None,
            0.5,
            "beta = 0.5",
        ),
    ];
    for (a, b, out, len, bias, beta, needle) in cases {
        let e = detail(check_launch(&a, &b, out, len, bias, beta).unwrap_err());
        assert!(e.contains(needle), "expected '{needle}' in '{e}'");
    }
    let mut short = fp8(E4, 300, 256, ScaleKind::Block1x128);
    short.scales = Some((ScaleKind::Block1x128, 300));
    let e = detail(
        check_launch(
            &short,
            &fp8(E4, 4, 256, ScaleKind::Block1x128),
            OutputDtype::F32,
            1200,
            None,
            0.0,
        )
        .unwrap_err(),
    );
    assert!(
        e.contains("A's Block1x128 scale_inv buffer has 300 values, 300x256 needs 600"),
        "{e}"
    );
    let a = fp8(E4, 4, 32, pt);
    assert!(matches!(
        check_launch(&a, &a, OutputDtype::F32, 15, None, 0.0),
        Err(Error::ShapeMismatch {
            expected: 16,
            got: 15,
            ..
        })
    ));
    let mut bad = a;
    bad.len = 3;
    assert!(matches!(
        check_launch(&bad, &a, OutputDtype::F32, 16, None, 0.0),
        Err(Error::ShapeMismatch { .. })
    ));
    let huge = plain(InputDtype::Bf16, 1 << 31, 8);
    let e = detail(
        check_launch(
            &huge,
            &plain(InputDtype::Bf16, 1, 8),
            OutputDtype::F32,
            1 << 31,
            None,
            0.0,
        )
        .unwrap_err(),
    );
    assert!(e.contains("M = 2147483648"), "{e}");
}

#[test]
fn mxfp8_launches_plan_the_e8m0_kernel_with_blocks_of_32() {
    // K = 48: one full block of 32 and a tail of 16 (the CPU's layout allows K % 32 != 0).
    for (k, blocks) in [(16, 1), (32, 1), (48, 2), (64, 2), (4096 + 16, 129)] {
        let a = fp8(E4, 130, k, ScaleKind::Mxfp8);
        let b = fp8(E4, 7, k, ScaleKind::Mxfp8);
        assert_eq!(a.scales, Some((ScaleKind::Mxfp8, 130 * blocks)), "K = {k}");
        let p = check_launch(&a, &b, OutputDtype::F32, 130 * 7, Some(7), 1.0).unwrap();
        assert_eq!((p.k, p.k_blocks), (k as u32, blocks as u32), "K = {k}");
        assert_eq!(p.scale_mode, FP8_GEMM_SCALES_MXFP8);
        assert_eq!(p.inputs, GemmInputs::Mxfp8(E4, E4));
        assert_eq!(p.blocks, 2);
    }
    // The backward pairs, into every output type.
    for (fa, fb) in [(E5, E4), (E4, E5)] {
        for out in [OutputDtype::Bf16, OutputDtype::F16, OutputDtype::Fp8(E4)] {
            let p = check_launch(
                &fp8(fa, 3, 96, ScaleKind::Mxfp8),
                &fp8(fb, 5, 96, ScaleKind::Mxfp8),
                out,
                15,
                None,
                0.0,
            )
            .unwrap();
            assert_eq!((p.inputs, p.k_blocks), (GemmInputs::Mxfp8(fa, fb), 3));
        }
    }
    // Per-tensor and 1x128 plans keep blocks of 128.
    let p = check_launch(
        &fp8(E4, 3, 160, ScaleKind::Block1x128),
        &fp8(E4, 5, 160, ScaleKind::Block1x128),
        OutputDtype::F32,
        15,
        None,
        0.0,
    )
    .unwrap();
    assert_eq!(p.k_blocks, 2);
}

#[test]
fn mxfp8_scale_buffers_must_hold_one_exponent_per_row_and_block_of_32() {
    // 300 x 80 needs 300 x ceil(80/32) = 900 exponents; a 1x128-sized buffer (300) is short.
    let mut a = fp8(E4, 300, 80, ScaleKind::Mxfp8);
    a.scales = Some((ScaleKind::Mxfp8, 300));
    let b = fp8(E4, 4, 80, ScaleKind::Mxfp8);
    let e = detail(check_launch(&a, &b, OutputDtype::F32, 1200, None, 0.0).unwrap_err());
    assert!(
        e.contains("A's Mxfp8 scale_inv buffer has 300 values, 300x80 needs 900"),
        "{e}"
    );
    let mut b_long = b;
    b_long.scales = Some((ScaleKind::Mxfp8, 13));
    let a = fp8(E4, 300, 80, ScaleKind::Mxfp8);
    let e = detail(check_launch(&a, &b_long, OutputDtype::F32, 1200, None, 0.0).unwrap_err());
    assert!(
        e.contains("B's Mxfp8 scale_inv buffer has 13 values, 4x80 needs 12"),
        "{e}"
    );
    // K % 16 is still every FP8 GEMM's rule.
    let odd = fp8(E4, 4, 40, ScaleKind::Mxfp8);
    let e = detail(check_launch(&odd, &odd, OutputDtype::F32, 16, None, 0.0).unwrap_err());
    assert!(e.contains("multiple of 16"), "{e}");
}

#[test]
fn mxfp8_kernels_need_fp8_tensor_cores_and_are_not_the_per_tensor_ones() {
    let pairs = [(E4, E4), (E4, E5), (E5, E4)];
    for cc in [(8, 9), (9, 0), (10, 0), (12, 0)] {
        for (fa, fb) in pairs {
            let k = select_kernel(cc, GemmInputs::Mxfp8(fa, fb)).unwrap();
            assert_eq!(k.module, "gemm_mma_mxfp8");
            assert!(k.function.starts_with("fp8_gemm_mma_mxfp8_"), "{}", k.function);
            assert_eq!(k.mma, select_kernel(cc, GemmInputs::Fp8(fa, fb)).unwrap().mma);
            assert_eq!(cached_kernel(cc, GemmInputs::Mxfp8(fa, fb)).ok(), Some(k));
        }
    }
    assert_eq!(
        select_kernel((8, 9), GemmInputs::Mxfp8(E5, E4)).unwrap().function,
        "fp8_gemm_mma_mxfp8_e5m2_e4m3"
    );
    // Below sm_89 the answer is the per-tensor FP8 path's: a typed error naming the GPU.
    for cc in [(7, 5), (8, 0), (8, 6)] {
        let e = detail(select_kernel(cc, GemmInputs::Mxfp8(E4, E4)).unwrap_err());
        let gpu = format!("this GPU is {}.{}", cc.0, cc.1);
        assert!(
            e.contains("MXFP8 GEMM needs compute capability 8.9") && e.contains(&gpu),
            "{e}"
        );
    }
    assert!(select_kernel((9, 0), GemmInputs::Mxfp8(E5, E5)).is_err());
    // A per-tensor kernel cannot stand in for an MXFP8 one, nor the reverse.
    let fp8_kernel = select_kernel((9, 0), GemmInputs::Fp8(E4, E4)).unwrap();
    let mx_kernel = select_kernel((9, 0), GemmInputs::Mxfp8(E4, E4)).unwrap();
    assert!(check_override(fp8_kernel, GemmInputs::Mxfp8(E4, E4), (9, 0)).is_err());
    assert!(check_override(mx_kernel, GemmInputs::Fp8(E4, E4), (9, 0)).is_err());
    assert!(check_override(mx_kernel, GemmInputs::Mxfp8(E4, E4), (8, 9)).is_ok());
    assert!(check_override(mx_kernel, GemmInputs::Mxfp8(E4, E4), (8, 6)).is_err());
}
