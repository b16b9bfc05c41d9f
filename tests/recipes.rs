//! Recipes and scaling state against a deliberately simple scalar reading of
//! `docs/numerics.md`, scaling recipes: exact, zero mismatches, every edge case.

mod reference;

use fp8_engine::Error;
use fp8_engine::format::Fp8Format;
use fp8_engine::scaling::{
    AmaxComputeAlgo, BlockDims, BlockScaling, CurrentScaling, DelayedScaling, DelayedSlot, MAX_AMAX_HISTORY_LEN,
    MAX_MARGIN, Mxfp8Format, Mxfp8Scaling, Recipe, RecipeFormat, ScalingState, TensorRole, current_scale, fmax_reduce,
    mxfp8_scale_exponent,
};
use proptest::prelude::*;
use reference::{RefSlot, fp8_max, ref_current, ref_e8m0, same};

// ---------------------------------------------------------------- reference

fn assert_same_slice(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(same(g, w), "{what}[{i}]: got {g:e} ({:#010x}), want {w:e}", g.to_bits());
    }
}

fn delayed(len: usize, algo: AmaxComputeAlgo, margin: i32) -> DelayedScaling {
    DelayedScaling {
        margin,
        amax_history_len: len,
        amax_compute_algo: algo,
        ..DelayedScaling::default()
    }
}

/// Runs `amaxes` (one per step) through the engine's slot and the reference,
/// comparing scale and history after every step.
fn check_trace(amaxes: &[f32], len: usize, algo: AmaxComputeAlgo, margin: i32, format: Fp8Format) {
    let recipe = delayed(len, algo, margin);
    recipe.validate().unwrap();
    let mut slot = DelayedSlot::new(len);
    let mut reference = RefSlot::new(len);
    for (step, &amax) in amaxes.iter().enumerate() {
        slot.set_current_amax(amax);
        reference.history[0] = amax;
        slot.update(&recipe, format);
        reference.update(algo, fp8_max(format), margin);
        let ctx = format!("step {step} amax {amax:e} len {len} {algo:?} margin {margin} {format}");
        assert!(
            same(slot.scale, reference.scale),
            "{ctx}: scale {} want {}",
            slot.scale,
            reference.scale
        );
        assert_same_slice(&ctx, &slot.history, &reference.history);
    }
}

const ALGOS: [AmaxComputeAlgo; 2] = [AmaxComputeAlgo::Max, AmaxComputeAlgo::MostRecent];

// ---------------------------------------------------------------- defaults & validation

#[test]
fn defaults_are_the_specs() {
    let d = DelayedScaling::default();
    assert_eq!(d.margin, 0);
    assert_eq!(d.format, RecipeFormat::Hybrid);
    assert_eq!(d.amax_history_len, 1024);
    assert_eq!(d.amax_compute_algo, AmaxComputeAlgo::Max);
    assert!(d.reduce_amax);

    let c = CurrentScaling::default();
    assert_eq!(c.format, RecipeFormat::Hybrid);
    assert!(!c.power_2_scale);
    assert_eq!(c.amax_epsilon, 0.0);

    let b = BlockScaling::default();
    assert_eq!(b.format, RecipeFormat::E4M3);
    assert!(b.power_2_scale);
    assert_eq!(b.input_block.shape(), (1, 128));
    assert_eq!(b.grad_block.shape(), (1, 128));
    assert_eq!(b.weight_block.shape(), (128, 128));
    b.validate().unwrap();

    assert_eq!(Mxfp8Scaling::default().format, Mxfp8Format::E4M3);
    assert_eq!(Mxfp8Scaling::BLOCK, 32);
}

#[test]
fn hybrid_is_e4m3_forward_e5m2_backward() {
    for role in TensorRole::FORWARD {
        assert_eq!(RecipeFormat::Hybrid.for_role(role), Fp8Format::E4M3);
        assert_eq!(RecipeFormat::E4M3.for_role(role), Fp8Format::E4M3);
    }
    for role in TensorRole::BACKWARD {
        assert_eq!(RecipeFormat::Hybrid.for_role(role), Fp8Format::E5M2);
        assert_eq!(RecipeFormat::E4M3.for_role(role), Fp8Format::E4M3);
    }
    let mx = Recipe::Mxfp8(Mxfp8Scaling::default());
    assert_eq!(mx.format_for(TensorRole::OutputGrad), Fp8Format::E4M3);
}

fn invalid_setting(result: fp8_engine::Result<()>) -> &'static str {
    match result {
        Err(Error::InvalidRecipe { setting, .. }) => setting,
        other => panic!("expected InvalidRecipe, got {other:?}"),
    }
}

#[test]
fn invalid_delayed_settings_are_typed_errors() {
    let base = DelayedScaling::default();
    let zero_len = DelayedScaling {
        amax_history_len: 0,
        ..base.clone()
    };
    assert_eq!(invalid_setting(zero_len.validate()), "amax_history_len");
    let huge_len = DelayedScaling {
        amax_history_len: MAX_AMAX_HISTORY_LEN + 1,
        ..base.clone()
    };
    assert_eq!(invalid_setting(huge_len.validate()), "amax_history_len");
    for margin in [-1, -100, i32::MIN, MAX_MARGIN + 1, i32::MAX] {
        let bad = DelayedScaling { margin, ..base.clone() };
        assert_eq!(invalid_setting(bad.validate()), "margin", "margin {margin}");
        assert!(ScalingState::new(bad, 1).is_err());
    }
    for margin in 0..=MAX_MARGIN {
        DelayedScaling { margin, ..base.clone() }.validate().unwrap();
    }
    let msg = Recipe::Delayed(DelayedScaling { margin: -3, ..base })
        .validate()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("margin") && msg.contains("-3"), "{msg}");
}

#[test]
fn invalid_epsilons_are_rejected() {
    for eps in [-1.0f32, -f32::MIN_POSITIVE, f32::NAN, f32::INFINITY] {
        let c = CurrentScaling {
            amax_epsilon: eps,
            ..CurrentScaling::default()
        };
        assert_eq!(invalid_setting(c.validate()), "amax_epsilon");
        let b = BlockScaling {
            amax_epsilon: eps,
            ..BlockScaling::default()
        };
        assert_eq!(invalid_setting(b.validate()), "amax_epsilon");
    }
}

#[test]
fn two_d_by_two_d_block_gemms_are_rejected() {
    use BlockDims::{Rows1x128 as D1, Tiles128x128 as D2};
    for input in [D1, D2] {
        for weight in [D1, D2] {
            for grad in [D1, D2] {
                let recipe = BlockScaling {
                    input_block: input,
                    weight_block: weight,
                    grad_block: grad,
                    ..BlockScaling::default()
                };
                // The three GEMMs of a linear layer: X.W^T, dY.W, dY^T.X.
                let has_2d_pair = (input.is_2d() && weight.is_2d())
                    || (grad.is_2d() && weight.is_2d())
                    || (grad.is_2d() && input.is_2d());
                match recipe.validate() {
                    Ok(()) => assert!(!has_2d_pair, "{input:?} {weight:?} {grad:?} accepted"),
                    Err(Error::InvalidRecipe { setting, .. }) => {
                        assert!(has_2d_pair, "{input:?} {weight:?} {grad:?} rejected");
                        assert_eq!(setting, "block dims");
                    }
                    Err(other) => panic!("unexpected error {other:?}"),
                }
            }
        }
    }
}

// ---------------------------------------------------------------- delayed scaling

#[test]
fn delayed_edge_cases_match_reference() {
    let tiny = f32::from_bits(1); // 2^-149: 448 / tiny overflows to inf
    let traces: Vec<Vec<f32>> = vec![
        vec![0.0, 0.0, 0.0],                         // never ran
        vec![2.0, 0.0, 4.0, 0.0, 1.0],               // skipped steps keep everything
        vec![3.0, f32::INFINITY, 1.0, 1.0, 1.0],     // inf amax keeps the old scale while in the window
        vec![3.0, f32::NAN, 1.0, f32::NAN, 0.5],     // NaN rolls in, ignored by max
        vec![f32::NAN, f32::NAN, f32::NAN, 2.0],     // all-NaN window keeps the scale
        vec![tiny, 1e-40, 1e-38, f32::MIN_POSITIVE], // scale inf -> f32::MAX
        vec![f32::MAX, 1.0, f32::MAX, 448.0, 57344.0],
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.25],
        vec![-0.0, 1.0, -0.0, 2.0],
    ];
    for trace in &traces {
        for len in [1, 2, 3, 4, 16] {
            for algo in ALGOS {
                for margin in [0, 1, 3, MAX_MARGIN] {
                    for format in Fp8Format::ALL {
                        check_trace(trace, len, algo, margin, format);
                    }
                }
            }
        }
    }
}

#[test]
fn first_step_uses_one_and_scale_lags_one_step() {
    let recipe = delayed(4, AmaxComputeAlgo::Max, 0);
    let mut slot = DelayedSlot::new(4);
    assert_eq!(slot.scale, 1.0);
    slot.record_cast(2.0);
    assert_eq!(slot.scale_inv, 1.0);
    slot.update(&recipe, Fp8Format::E4M3);
    assert_eq!(slot.scale, 224.0); // 448 / 2
    // scale_inv is written by the next cast, not by the update.
    assert_eq!(slot.scale_inv, 1.0);
    slot.record_cast(1.0);
    assert_eq!(slot.scale_inv, 1.0 / 224.0);
}

#[test]
fn record_amax_takes_the_max_of_the_steps_casts() {
    let mut slot = DelayedSlot::new(3);
    for amax in [1.0, 5.0, f32::NAN, 3.0] {
        slot.record_amax(amax);
    }
    assert_eq!(slot.current_amax(), 5.0);
    slot.record_amax(f32::INFINITY);
    assert_eq!(slot.current_amax(), f32::INFINITY);
}

#[test]
fn history_len_one_is_just_zero_after_update() {
    let recipe = delayed(1, AmaxComputeAlgo::Max, 0);
    let mut slot = DelayedSlot::new(1);
    slot.set_current_amax(7.0);
    slot.update(&recipe, Fp8Format::E4M3);
    assert_eq!(slot.history, vec![0.0]);
    assert_eq!(slot.scale, 64.0);
}

fn amax_strategy() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => Just(0.0f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::MAX),
        1 => (1u32..0x0080_0000).prop_map(f32::from_bits), // subnormals
        8 => 0.0f32..1000.0,
        4 => (0u32..0x7F80_0000).prop_map(f32::from_bits), // any non-negative finite
    ]
}

fn algo_strategy() -> impl Strategy<Value = AmaxComputeAlgo> {
    prop_oneof![Just(AmaxComputeAlgo::Max), Just(AmaxComputeAlgo::MostRecent)]
}

fn format_strategy() -> impl Strategy<Value = Fp8Format> {
    prop_oneof![Just(Fp8Format::E4M3), Just(Fp8Format::E5M2)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn delayed_random_traces_match_reference(
        trace in prop::collection::vec(amax_strategy(), 0..40),
        len in 1usize..8,
        algo in algo_strategy(),
        margin in 0..=MAX_MARGIN,
        format in format_strategy(),
    ) {
        check_trace(&trace, len, algo, margin, format);
    }

    #[test]
    fn current_scale_matches_reference(
        amax in amax_strategy(),
        eps in prop_oneof![Just(0.0f32), Just(1e-12f32), (0.0f32..10.0)],
        pow2 in any::<bool>(),
        format in format_strategy(),
    ) {
        let got = current_scale(amax, fp8_max(format), pow2, eps);
        let want = ref_current(amax, fp8_max(format), pow2, eps);
        prop_assert!(same(got, want), "amax {amax:e} eps {eps:e} pow2 {pow2}: got {got:e} want {want:e}");
    }

    #[test]
    fn pow2_current_scales_are_powers_of_two(amax in amax_strategy(), format in format_strategy()) {
        let s = current_scale(amax, fp8_max(format), true, 0.0);
        prop_assert!(s.is_finite() && s > 0.0);
        prop_assert_eq!(s.to_bits() & 0x007F_FFFF, 0, "{} has mantissa bits", s);
    }

    #[test]
    fn state_update_matches_reference_per_slot(
        steps in prop::collection::vec(prop::collection::vec(amax_strategy(), 10), 1..12),
        len in 1usize..6,
        algo in algo_strategy(),
        hybrid in any::<bool>(),
    ) {
        // 2 modules x 5 roles; each step records one amax per slot, then updates both passes.
        let format = if hybrid { RecipeFormat::Hybrid } else { RecipeFormat::E4M3 };
        let recipe = DelayedScaling { format, ..delayed(len, algo, 0) };
        let mut state = ScalingState::new(recipe, 2).unwrap();
        let roles: Vec<TensorRole> = TensorRole::FORWARD.into_iter().chain(TensorRole::BACKWARD).collect();
        let mut reference = vec![RefSlot::new(len); 10];
        for amaxes in &steps {
            for (i, &amax) in amaxes.iter().enumerate() {
                let (module, role) = (i / 5, roles[i % 5]);
                state.record_cast(module, role, amax).unwrap();
                // record_cast accumulates with fmaxf into a zeroed slot 0.
                reference[i].history[0] = reference[i].history[0].max(amax);
            }
            state.update_forward();
            for i in 0..10 {
                if roles[i % 5].is_forward() {
                    reference[i].update(algo, 448.0, 0);
                }
            }
            // Backward slots are untouched by the forward update.
            for i in 0..10 {
                let slot = state.slot(i / 5, roles[i % 5]).unwrap();
                assert_same_slice("after forward", &slot.history, &reference[i].history);
            }
            state.update_backward();
            for i in 0..10 {
                let role = roles[i % 5];
                if !role.is_forward() {
                    reference[i].update(algo, fp8_max(format.for_role(role)), 0);
                }
                let slot = state.slot(i / 5, role).unwrap();
                prop_assert!(same(slot.scale, reference[i].scale), "slot {i}: {} vs {}", slot.scale, reference[i].scale);
                assert_same_slice("after backward", &slot.history, &reference[i].history);
            }
        }
    }

    #[test]
    fn mxfp8_exponent_matches_reference(amax in amax_strategy(), format in format_strategy()) {
        let got = mxfp8_scale_exponent(amax, format);
        let want = ref_e8m0(amax, fp8_max(format));
        prop_assert_eq!(got, want, "amax {:e}", amax);
    }
}

// ---------------------------------------------------------------- current & mxfp8 sweeps

/// Every 9973rd f32 bit pattern (both signs, NaNs and infs included) plus neighbours of powers of two.
fn sweep() -> impl Iterator<Item = f32> {
    let strided = (0..=u32::MAX / 9973).map(|i| f32::from_bits(i * 9973));
    let around_pow2 = (0u32..255).flat_map(|e| {
        let p = e << 23;
        [p.saturating_sub(1), p, p + 1, p | 0x40_0000, (p | 0x40_0000) + 1]
    });
    strided.chain(around_pow2.map(f32::from_bits))
}

#[test]
fn current_scale_sweep_matches_reference() {
    for amax in sweep() {
        for format in Fp8Format::ALL {
            for pow2 in [false, true] {
                for eps in [0.0, 1e-30, 0.5] {
                    let got = current_scale(amax, fp8_max(format), pow2, eps);
                    let want = ref_current(amax, fp8_max(format), pow2, eps);
                    assert!(
                        same(got, want),
                        "amax {amax:e} {format} pow2 {pow2} eps {eps}: {got:e} vs {want:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn current_scale_edge_cases() {
    assert_eq!(current_scale(0.0, 448.0, false, 0.0), 1.0);
    assert_eq!(current_scale(f32::INFINITY, 448.0, false, 0.0), 1.0);
    assert_eq!(current_scale(f32::NAN, 448.0, false, 0.0), 1.0);
    assert_eq!(current_scale(f32::from_bits(1), 448.0, false, 0.0), f32::MAX);
    assert_eq!(current_scale(f32::from_bits(1), 448.0, true, 0.0), 2f32.powi(127));
    // The epsilon bounds the amax from below.
    assert_eq!(current_scale(0.0, 448.0, false, 2.0), 224.0);
    assert_eq!(current_scale(1e-9, 448.0, false, 2.0), 224.0);
}

#[test]
fn mxfp8_exponent_sweep_matches_reference() {
    for amax in sweep() {
        for format in Fp8Format::ALL {
            let got = mxfp8_scale_exponent(amax, format);
            let want = ref_e8m0(amax, fp8_max(format));
            assert_eq!(got, want, "amax {amax:e} ({:#010x}) {format}", amax.to_bits());
        }
    }
}

#[test]
fn mxfp8_exponent_edge_cases() {
    let e4 = Fp8Format::E4M3;
    assert_eq!(mxfp8_scale_exponent(f32::NAN, e4), 0xFF);
    assert_eq!(mxfp8_scale_exponent(f32::INFINITY, e4), 0xFE);
    assert_eq!(mxfp8_scale_exponent(0.0, e4), 0);
    assert_eq!(mxfp8_scale_exponent(f32::MAX, e4), 247); // 2^128/448 < 2^120
    // Powers of two times 448 land exactly; one ulp above rounds up.
    for k in -20..20 {
        let amax = 448.0 * 2f32.powi(k);
        let e = mxfp8_scale_exponent(amax, e4);
        assert!(
            amax * 2f32.powi(127 - e as i32) <= 448.0 * (1.0 + 2f32.powi(-20)),
            "k {k}: e {e}"
        );
    }
    // Subnormal v: mantissa <= 0x400000 stays at 0, above rounds up to 1.
    let r = 1.0f32 / 448.0;
    let at_half = f32::from_bits(0x0040_0000) / r; // v ~= 2^-127
    let e = mxfp8_scale_exponent(at_half, e4);
    assert!(e <= 1);
    assert_eq!(e, ref_e8m0(at_half, 448.0));
}

// ---------------------------------------------------------------- state

#[test]
fn forward_update_leaves_backward_slots_alone() {
    let mut state = ScalingState::new(delayed(3, AmaxComputeAlgo::Max, 0), 1).unwrap();
    for role in TensorRole::FORWARD.into_iter().chain(TensorRole::BACKWARD) {
        state.record_cast(0, role, 2.0).unwrap();
    }
    state.update_forward();
    for role in TensorRole::FORWARD {
        assert_eq!(state.scale(0, role).unwrap(), 224.0);
    }
    for role in TensorRole::BACKWARD {
        assert_eq!(state.scale(0, role).unwrap(), 1.0);
        assert_eq!(state.slot(0, role).unwrap().history[0], 2.0);
    }
    state.update_backward();
    for role in TensorRole::BACKWARD {
        assert_eq!(state.scale(0, role).unwrap(), 57344.0 / 2.0); // HYBRID: E5M2 gradients
    }
}

#[test]
fn out_of_range_module_is_an_error() {
    let mut state = ScalingState::new(DelayedScaling::default(), 2).unwrap();
    assert_eq!(
        state.record_cast(2, TensorRole::Input, 1.0),
        Err(Error::NoSuchModule { module: 2, modules: 2 })
    );
    assert!(state.slot(5, TensorRole::Weight).is_err());
}

#[test]
fn reduce_amax_max_reduces_across_ranks_before_the_update() {
    let recipe = delayed(4, AmaxComputeAlgo::MostRecent, 0);
    let mut ranks = [
        ScalingState::new(recipe.clone(), 2).unwrap(),
        ScalingState::new(recipe, 2).unwrap(),
    ];
    let amaxes = [[1.0, 8.0, f32::NAN, 2.0, 0.0, 3.0], [4.0, 2.0, 5.0, 0.0, 0.0, 1.0]];
    for (rank, values) in ranks.iter_mut().zip(amaxes) {
        for (i, amax) in values.into_iter().enumerate() {
            rank.record_cast(i / 3, TensorRole::FORWARD[i % 3], amax).unwrap();
        }
    }
    // All-reduce: every rank sees the element-wise fmaxf of everybody's amaxes.
    let gathered: Vec<Vec<f32>> = ranks.iter().map(|r| r.current_amaxes(&TensorRole::FORWARD)).collect();
    for rank in &mut ranks {
        rank.update_forward_with(|local| {
            for other in &gathered {
                fmax_reduce(local, other);
            }
        });
    }
    assert_eq!(ranks[0], ranks[1]);
    // record_cast drops the NaN (fmaxf), so slot 2 of module 0 sees max(0, 5) = 5.
    let want = [4.0f32, 8.0, 5.0, 2.0, 0.0, 3.0];
    for (i, &amax) in want.iter().enumerate() {
        let scale = ranks[0].scale(i / 3, TensorRole::FORWARD[i % 3]).unwrap();
        let expected = if amax == 0.0 { 1.0 } else { 448.0 / amax };
        assert_eq!(scale, expected, "slot {i}");
    }
}

#[test]
fn reduce_amax_off_never_calls_the_reducer() {
    let recipe = DelayedScaling {
        reduce_amax: false,
        ..delayed(2, AmaxComputeAlgo::Max, 0)
    };
    let mut state = ScalingState::new(recipe, 1).unwrap();
    state.record_cast(0, TensorRole::Input, 4.0).unwrap();
    state.update_forward_with(|_| panic!("reducer called with reduce_amax = false"));
    assert_eq!(state.scale(0, TensorRole::Input).unwrap(), 112.0);
}

#[test]
fn state_serializes_bit_exactly() {
    let mut state = ScalingState::new(delayed(5, AmaxComputeAlgo::Max, 2), 3).unwrap();
    let values = [
        f32::NAN,
        f32::INFINITY,
        f32::from_bits(1),
        f32::MAX,
        0.1,
        1.0 / 3.0,
        7.000001,
        448.0,
        1e-40,
        123456.79,
    ];
    let roles: Vec<TensorRole> = TensorRole::FORWARD.into_iter().chain(TensorRole::BACKWARD).collect();
    for step in 0..7 {
        for module in 0..3 {
            for (r, &role) in roles.iter().enumerate() {
                let amax = values[(step * 7 + module * 5 + r) % values.len()];
                state.record_cast(module, role, amax).unwrap();
            }
        }
        state.update_forward();
        state.update_backward();
        for module in 0..3 {
            for &role in &roles {
                state
                    .record_cast(module, role, values[(step + module) % values.len()])
                    .unwrap();
            }
        }
    }
    let json = serde_json::to_string(&state).unwrap();
    let back: ScalingState = serde_json::from_str(&json).unwrap();
    for module in 0..3 {
        for &role in &roles {
            let (a, b) = (back.slot(module, role).unwrap(), state.slot(module, role).unwrap());
            assert_eq!(a.scale.to_bits(), b.scale.to_bits());
            assert_eq!(a.scale_inv.to_bits(), b.scale_inv.to_bits());
            assert_same_slice("history", &a.history, &b.history);
        }
    }
    assert_eq!(back.recipe(), state.recipe());
    // Serializing again gives the same text: nothing was lost or reformatted.
    assert_eq!(serde_json::to_string(&back).unwrap(), json);
}

#[test]
fn deserializing_an_inconsistent_state_fails() {
    let state = ScalingState::new(delayed(3, AmaxComputeAlgo::Max, 0), 1).unwrap();
    let mut value: serde_json::Value = serde_json::to_value(&state).unwrap();
    value["modules"][0]["weight"]["history"] = serde_json::json!(["0", "1"]);
    let err = serde_json::from_value::<ScalingState>(value.clone())
        .unwrap_err()
        .to_string();
    assert!(err.contains("Weight"), "{err}");
    value["recipe"]["amax_history_len"] = serde_json::json!(0);
    assert!(serde_json::from_value::<ScalingState>(value).is_err());
    let not_a_number = serde_json::json!({"scale": "abc", "scale_inv": "1", "history": ["0"]});
    assert!(serde_json::from_value::<DelayedSlot>(not_a_number).is_err());
}

#[test]
fn recipes_round_trip_through_serde() {
    let recipes = [
        Recipe::Delayed(delayed(7, AmaxComputeAlgo::MostRecent, 3)),
        Recipe::Current(CurrentScaling {
            format: RecipeFormat::E4M3,
            power_2_scale: true,
            amax_epsilon: 1e-7,
        }),
        Recipe::Block(BlockScaling::default()),
        Recipe::Mxfp8(Mxfp8Scaling {
            format: Mxfp8Format::Hybrid,
        }),
    ];
    for recipe in recipes {
        let json = serde_json::to_string(&recipe).unwrap();
        let back: Recipe = serde_json::from_str(&json).unwrap();
        assert_eq!(back, recipe);
    }
}
