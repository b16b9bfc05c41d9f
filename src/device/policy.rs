//! The precision policy the engine picks for a device (docs: gpu.md targets table).

/// How training runs on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrecisionPolicy {
    /// FP8 GEMMs, E4M3 forward / E5M2 backward (HYBRID), delayed scaling.
    Fp8Hybrid,
    /// bf16 GEMMs, no loss scaling.
    Bf16,
    /// fp16 GEMMs with dynamic loss scaling.
    Fp16LossScaling,
}

impl PrecisionPolicy {
    /// The policy for a GPU of compute capability `(major, minor)`, and why; `None` below sm_75.
    pub fn for_compute_capability(cc: (u32, u32)) -> Option<(PrecisionPolicy, &'static str)> {
        match cc {
            (10.., _) => Some((PrecisionPolicy::Fp8Hybrid, "Blackwell: FP8 tensor cores")),
            (9, _) => Some((PrecisionPolicy::Fp8Hybrid, "Hopper: FP8 wgmma tensor cores")),
            (8, 9) => Some((PrecisionPolicy::Fp8Hybrid, "Ada: FP8 mma.sync tensor cores")),
            (8, _) => Some((PrecisionPolicy::Bf16, "Ampere: bf16 tensor cores, no FP8")),
            (7, 5..) => Some((PrecisionPolicy::Fp16LossScaling, "Turing: fp16 tensor cores only")),
            _ => None,
        }
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            PrecisionPolicy::Fp8Hybrid => "FP8 HYBRID (E4M3 fwd / E5M2 bwd), delayed scaling",
            PrecisionPolicy::Bf16 => "bf16",
            PrecisionPolicy::Fp16LossScaling => "fp16 + dynamic loss scaling",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_only_where_fp8_tensor_cores_exist() {
        let policy = |cc| PrecisionPolicy::for_compute_capability(cc).map(|(p, _)| p);
        assert_eq!(policy((9, 0)), Some(PrecisionPolicy::Fp8Hybrid));
        assert_eq!(policy((8, 9)), Some(PrecisionPolicy::Fp8Hybrid));
        assert_eq!(policy((10, 0)), Some(PrecisionPolicy::Fp8Hybrid));
        assert_eq!(policy((12, 0)), Some(PrecisionPolicy::Fp8Hybrid));
        assert_eq!(policy((8, 6)), Some(PrecisionPolicy::Bf16));
        assert_eq!(policy((8, 0)), Some(PrecisionPolicy::Bf16));
        assert_eq!(policy((7, 5)), Some(PrecisionPolicy::Fp16LossScaling));
        assert_eq!(policy((7, 0)), None);
    }
}
