//! Medians of timed runs, shared by the bench subcommands: host times, and CUDA
//! event pairs on a device's stream.

use cudarc::driver::sys::CUevent_flags;
use fp8_engine::backend::cuda::CudaDevice;

/// The median of `times` (the upper one of an even count); `times` must not be empty.
pub fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn driver(call: &str) -> impl Fn(cudarc::driver::DriverError) -> fp8_engine::Error + '_ {
    move |err| fp8_engine::Error::KernelArgs {
        kernel: "bench timer",
        detail: format!("{call}: {err}"),
    }
}

/// Median milliseconds of `runs` calls of `f` (each timed by a pair of CUDA events on the
/// device's stream) after `warmup` untimed calls.
pub fn median_ms(
    device: &CudaDevice,
    warmup: usize,
    runs: usize,
    mut f: impl FnMut() -> fp8_engine::Result<()>,
) -> fp8_engine::Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let ctx = device.context();
    let mut times = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        let event = || {
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver("cuEventCreate"))
        };
        let (start, end) = (event()?, event()?);
        start.record(device.stream()).map_err(driver("cuEventRecord"))?;
        f()?;
        end.record(device.stream()).map_err(driver("cuEventRecord"))?;
        times.push(start.elapsed_ms(&end).map_err(driver("cuEventElapsedTime"))? as f64);
    }
    // Kernel-side errors of the timed launches (the device's error flag) surface here.
    device.synchronize()?;
    Ok(median(times))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
    }
}
