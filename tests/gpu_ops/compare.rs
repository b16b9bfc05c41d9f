//! How a GPU result is held to its CPU twin: the contracts of `docs/numerics.md`
//! (Op contracts between backends), each reported as err/bound (0 for the same
//! bits; a check passes when err/bound <= 1).

/// The first index whose bits differ (NaN matches NaN), if any.
pub fn first_bit_difference(gpu: &[f32], cpu: &[f32]) -> Option<usize> {
    if gpu.len() != cpu.len() {
        return Some(gpu.len().min(cpu.len()));
    }
    gpu.iter()
        .zip(cpu)
        .position(|(g, c)| g.to_bits() != c.to_bits() && !(g.is_nan() && c.is_nan()))
}

/// Same bits: err/bound 0, or an error naming the first difference.
pub fn exact(what: &str, gpu: &[f32], cpu: &[f32]) -> Result<f64, String> {
    match first_bit_difference(gpu, cpu) {
        None => Ok(0.0),
        Some(i) if i >= gpu.len().min(cpu.len()) => Err(format!("{what}: {} vs {} values", gpu.len(), cpu.len())),
        Some(i) => Err(format!(
            "{what}: element {i}: gpu {:e} ({:#010x}), cpu {:e} ({:#010x})",
            gpu[i],
            gpu[i].to_bits(),
            cpu[i],
            cpu[i].to_bits()
        )),
    }
}

/// `|gpu - cpu| <= atol + rtol |cpu|` per element (or the same bits): the worst err/bound,
/// an error naming the worst element when it is above 1. Also prints the normwise
/// error max|gpu - cpu| / max|cpu| for diagnosis.
pub fn bounded(what: &str, gpu: &[f32], cpu: &[f32], rtol: f64, atol: f64) -> Result<f64, String> {
    judged(what, gpu, cpu, None, rtol, atol)
}

/// `|gpu - cpu| <= atol + rtol (|cpu| + magnitude)` per element: a sum whose terms may each
/// move by `rtol` of themselves, judged against the sum of their sizes (`magnitude`, an upper
/// bound on it) instead of the result alone, which cancellation can make arbitrarily small.
pub fn bounded_by_magnitude(
    what: &str,
    gpu: &[f32],
    cpu: &[f32],
    magnitude: &[f64],
    rtol: f64,
    atol: f64,
) -> Result<f64, String> {
    if magnitude.len() != cpu.len() {
        return Err(format!(
            "{what}: {} magnitudes for {} values",
            magnitude.len(),
            cpu.len()
        ));
    }
    judged(what, gpu, cpu, Some(magnitude), rtol, atol)
}

/// The normwise contract of `docs/numerics.md`: `|gpu - cpu| <= atol + rtol (|cpu| + max|cpu|)`
/// per element, the max over the whole output (finite values). For sums whose terms may each
/// move by `rtol` of themselves and cancel, where no bound per element alone holds.
pub fn normwise(what: &str, gpu: &[f32], cpu: &[f32], rtol: f64, atol: f64) -> Result<f64, String> {
    let largest = cpu
        .iter()
        .filter(|c| c.is_finite())
        .fold(0.0f64, |m, &c| m.max((c as f64).abs()));
    judged(what, gpu, cpu, Some(&vec![largest; cpu.len()]), rtol, atol)
}

/// Both of the above: element i's bound is `atol + rtol (|cpu_i| + magnitude_i)` (0 without one).
fn judged(
    what: &str,
    gpu: &[f32],
    cpu: &[f32],
    magnitude: Option<&[f64]>,
    rtol: f64,
    atol: f64,
) -> Result<f64, String> {
    if gpu.len() != cpu.len() {
        return Err(format!("{what}: {} vs {} values", gpu.len(), cpu.len()));
    }
    let size = |i: usize| magnitude.map_or(0.0, |m| m[i]);
    let (mut worst, mut at) = (0.0f64, 0usize);
    let (mut max_err, mut max_ref) = (0.0f64, 0.0f64);
    for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
        let ratio = if g.to_bits() == c.to_bits() || (g.is_nan() && c.is_nan()) {
            0.0
        } else {
            let err = (g as f64 - c as f64).abs();
            if err.is_finite() {
                max_err = max_err.max(err);
            }
            err / (atol + rtol * ((c as f64).abs() + size(i)))
        };
        if c.is_finite() {
            max_ref = max_ref.max((c as f64).abs());
        }
        if ratio.is_nan() || ratio > worst {
            worst = if ratio.is_nan() { f64::INFINITY } else { ratio };
            at = i;
        }
    }
    println!(
        "  {what}: normwise error {:.3e}",
        max_err / max_ref.max(f64::MIN_POSITIVE)
    );
    if worst <= 1.0 {
        return Ok(worst);
    }
    let magnitude_text = magnitude.map_or(String::new(), |m| format!(", magnitude {:e}", m[at]));
    Err(format!(
        "{what}: element {at}: gpu {:e}, cpu {:e}{magnitude_text}: err/bound={worst:.3} (rtol {rtol:e}, atol {atol:e})",
        gpu[at], cpu[at]
    ))
}

/// The reduction contract: rtol 1e-5, atol 1e-6.
pub fn reduction(what: &str, gpu: &[f32], cpu: &[f32]) -> Result<f64, String> {
    bounded(what, gpu, cpu, 1e-5, 1e-6)
}
