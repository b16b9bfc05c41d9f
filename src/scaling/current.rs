//! `docs/numerics.md`, current scaling: the just-in-time scale from an amax, also used per block by
//! block scaling (4.3).

/// `fp8_max / max(amax, amax_epsilon)`, with the spec's edge cases:
/// an amax that is inf, NaN or 0 (after the epsilon) gives 1.0; an infinite
/// quotient (tiny amax) gives `f32::MAX`; `power_2_scale` floors the result to
/// a power of two by clearing the mantissa bits.
///
/// The epsilon bound is `if amax < eps { eps }`, which keeps a NaN amax NaN
/// (and so scale 1.0) where `f32::max` would silently replace it.
///
/// ```
/// use fp8_engine::scaling::current_scale;
///
/// assert_eq!(current_scale(2.0, 448.0, false, 0.0), 224.0);
/// assert_eq!(current_scale(3.0, 448.0, true, 0.0), 128.0); // 149.33 floored
/// assert_eq!(current_scale(0.0, 448.0, false, 0.0), 1.0);
/// ```
pub fn current_scale(amax: f32, fp8_max: f32, power_2_scale: bool, amax_epsilon: f32) -> f32 {
    let amax = if amax < amax_epsilon { amax_epsilon } else { amax };
    if amax.is_nan() || amax.is_infinite() || amax == 0.0 {
        return 1.0;
    }
    let mut scale = fp8_max / amax;
    if scale.is_infinite() {
        scale = f32::MAX;
    }
    if power_2_scale {
        scale = f32::from_bits(scale.to_bits() & 0xFF80_0000);
    }
    scale
}
