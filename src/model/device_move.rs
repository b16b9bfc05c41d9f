//! Moving a whole model between devices, all or nothing.

use crate::error::Result;
use crate::tensor::DeviceKind;

/// Runs `move_to(device)`, which moves every module of a model currently on `from` and stops at
/// the first that cannot move (a frozen FP8 base that does not fit the GPU); on that error the
/// modules already moved go back to `from`, so the model stays usable where it was (as after
/// any `to_device`, shadow mode is off). Back to the CPU cannot fail; back to another GPU
/// re-uploads frozen FP8 copies and could, which is said.
pub(super) fn all_or_nothing(
    from: DeviceKind,
    device: DeviceKind,
    mut move_to: impl FnMut(DeviceKind) -> Result<()>,
) -> Result<()> {
    let moved = move_to(device);
    if let Err(err) = &moved
        && from != device
        && let Err(back) = move_to(from)
    {
        eprintln!(
            "fp8-engine: warning: the model could not move to {device} ({err}) nor back to {from} ({back}): \
             its modules are split across devices; move it again before using it"
        );
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn a_failed_move_goes_back_to_where_it_was() {
        let gpu = DeviceKind::Cuda(3);
        let fail = |device: DeviceKind| Error::NoGpu {
            reason: format!("{device}"),
        };
        let mut calls = Vec::new();
        let err = all_or_nothing(DeviceKind::Cpu, gpu, |d| {
            calls.push(d);
            if d == gpu { Err(fail(d)) } else { Ok(()) }
        })
        .unwrap_err();
        assert_eq!(err, fail(gpu));
        assert_eq!(calls, vec![gpu, DeviceKind::Cpu], "moved back after the failure");
        // A move that succeeds, or fails where it already is, is not undone.
        let mut calls = Vec::new();
        all_or_nothing(DeviceKind::Cpu, gpu, |d| {
            calls.push(d);
            Ok(())
        })
        .unwrap();
        let _ = all_or_nothing(gpu, gpu, |d| {
            calls.push(d);
            Err(fail(d))
        });
        assert_eq!(calls, vec![gpu, gpu]);
    }
}
