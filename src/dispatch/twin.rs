//! How one op argument or result takes part in a shadow run: what is saved
//! before the primary op runs (the in-place state a `&mut` argument starts
//! from), what the CPU twin gets, and how the two results compare.

use half::{bf16, f16};

use super::contract::{Breach, Contract, GemmDtype, first_breach, first_breach_f32, gemm_tolerance};
use super::gemm_check::{self, GemmResult};
use super::{Cast, Fp8Stats, PlainMat};
use crate::error::Result;
use crate::format::Fp8Format;
use crate::gemm::{Bias, GemmParams, GemmReport, Output};
use crate::scaling::{Fp8TensorStats, SlotBank};
use crate::tensor::device_values::{Deferred, Values, ValuesMut};
use crate::tensor::{QuantizedMatrix, Scales};

/// One argument of an op, seen by the shadow runner.
pub(crate) trait Twin {
    /// What the twin starts from: a copy of in-place state, nothing for inputs.
    type Saved;
    /// The argument as an op takes it.
    type Arg<'s>
    where
        Self: 's;
    /// Fails only where saving downloads device values. `contract`: the op's (an output whose
    /// contract is a GEMM's also keeps its values before the call, what `beta` multiplies).
    fn save(&self, contract: Contract) -> Result<Self::Saved>;
    /// The argument for the primary op (a reborrow).
    fn primary(&mut self) -> Self::Arg<'_>;
    /// The argument for the CPU twin: the same input, or the saved copy of in-place state.
    fn twin<'s>(&'s self, saved: &'s mut Self::Saved) -> Self::Arg<'s>;
    /// After both ran: the first breach between the primary's state and the twin's (an error
    /// only where reading the primary's state downloads device values).
    fn check(&self, _saved: &Self::Saved, _contract: Contract) -> Result<Option<Breach>> {
        Ok(None)
    }
    /// Test-only perturbation: moves element `index` by `ulps`; says whether it did.
    #[cfg(test)]
    fn nudge(&mut self, _index: usize, _ulps: i32) -> bool {
        false
    }
}

/// Inputs passed by value: both ops get the same value.
macro_rules! twin_by_value {
    ($($ty:ty),*) => {$(
        impl Twin for $ty {
            type Saved = ();
            type Arg<'s> = $ty;
            fn save(&self, _: Contract) -> Result<()> {
                Ok(())
            }
            fn primary(&mut self) -> $ty {
                self.clone()
            }
            fn twin<'s>(&'s self, _: &'s mut ()) -> $ty {
                self.clone()
            }
        }
    )*};
}

by_value_args!(twin_by_value);

/// Shared inputs: both ops read the same memory.
impl<'a, T: ?Sized> Twin for &'a T {
    type Saved = ();
    type Arg<'s>
        = &'a T
    where
        Self: 's;
    fn save(&self, _: Contract) -> Result<()> {
        Ok(())
    }
    fn primary(&mut self) -> &'a T {
        self
    }
    fn twin<'s>(&'s self, _: &'s mut ()) -> &'a T {
        self
    }
}

/// An f32 output or `+=` accumulator: the twin starts from a copy taken before the primary op.
impl Twin for &mut [f32] {
    type Saved = Vec<f32>;
    type Arg<'s>
        = &'s mut [f32]
    where
        Self: 's;
    fn save(&self, _: Contract) -> Result<Vec<f32>> {
        Ok(self.to_vec())
    }
    fn primary(&mut self) -> &mut [f32] {
        self
    }
    fn twin<'s>(&'s self, saved: &'s mut Vec<f32>) -> &'s mut [f32] {
        saved
    }
    fn check(&self, saved: &Vec<f32>, contract: Contract) -> Result<Option<Breach>> {
        Ok(first_breach_f32(contract, self, saved))
    }
    #[cfg(test)]
    fn nudge(&mut self, index: usize, ulps: i32) -> bool {
        match self.get_mut(index) {
            Some(v) => {
                *v = f32::from_bits(v.to_bits().wrapping_add_signed(ulps));
                true
            }
            None => false,
        }
    }
}

/// Input values: the twin reads host values in place and a download of device ones (made
/// before the primary op runs; an input is never written).
impl<'a> Twin for Values<'a> {
    type Saved = Option<Vec<f32>>;
    type Arg<'s>
        = Values<'s>
    where
        Self: 's;
    fn save(&self, _: Contract) -> Result<Option<Vec<f32>>> {
        match self {
            Values::Host(_) => Ok(None),
            Values::Device(d) => d.to_vec().map(Some),
        }
    }
    fn primary(&mut self) -> Values<'_> {
        *self
    }
    fn twin<'s>(&'s self, saved: &'s mut Option<Vec<f32>>) -> Values<'s> {
        match saved {
            Some(downloaded) => Values::Host(downloaded),
            None => *self,
        }
    }
}

/// A GEMM's scalars: the twin gets the same, with a bias on a device downloaded (before the
/// primary op runs) into host memory, where the CPU GEMM reads it.
impl<'a> Twin for GemmParams<'a> {
    type Saved = Option<Vec<f32>>;
    type Arg<'s>
        = GemmParams<'s>
    where
        Self: 's;
    fn save(&self, contract: Contract) -> Result<Option<Vec<f32>>> {
        match self.bias {
            Some(bias) => bias.values().save(contract),
            None => Ok(None),
        }
    }
    fn primary(&mut self) -> GemmParams<'_> {
        *self
    }
    fn twin<'s>(&'s self, saved: &'s mut Option<Vec<f32>>) -> GemmParams<'s> {
        match saved {
            Some(downloaded) => GemmParams {
                bias: Some(Bias::host(downloaded)),
                ..*self
            },
            None => *self,
        }
    }
}

/// Output or in-place values: the twin starts from a host copy of what the primary starts
/// from, and the primary's result is read back (downloaded from a device) to compare.
impl<'a> Twin for ValuesMut<'a> {
    type Saved = SavedValues;
    type Arg<'s>
        = ValuesMut<'s>
    where
        Self: 's;
    fn save(&self, contract: Contract) -> Result<SavedValues> {
        let twin = self.as_values().to_host()?.into_owned();
        let before = matches!(contract, Contract::Gemm { .. }).then(|| twin.clone());
        Ok(SavedValues { twin, before })
    }
    fn primary(&mut self) -> ValuesMut<'_> {
        self.reborrow()
    }
    fn twin<'s>(&'s self, saved: &'s mut SavedValues) -> ValuesMut<'s> {
        ValuesMut::Host(&mut saved.twin)
    }
    fn check(&self, saved: &SavedValues, contract: Contract) -> Result<Option<Breach>> {
        let primary = self.as_values().to_host()?;
        Ok(match contract {
            Contract::Gemm { .. } => gemm_breach(
                contract,
                GemmDtype::F32,
                1.0,
                primary.iter().map(|&v| v as f64).collect(),
                saved.twin.iter().map(|&v| v as f64).collect(),
                saved.before.as_deref(),
            ),
            _ => first_breach_f32(contract, &primary, &saved.twin),
        })
    }
    #[cfg(test)]
    fn nudge(&mut self, index: usize, ulps: i32) -> bool {
        match self {
            ValuesMut::Host(v) => Twin::nudge(v, index, ulps),
            ValuesMut::Device(_) => false,
        }
    }
}

/// What the twin of a [`ValuesMut`] starts from: a host copy of the primary's starting values
/// (the twin writes its result there), and for a GEMM's output those values again (`beta`).
pub(crate) struct SavedValues {
    pub(crate) twin: Vec<f32>,
    before: Option<Vec<f32>>,
}

/// The delayed-scaling state: the twin updates a copy of the bank.
impl Twin for &mut SlotBank {
    type Saved = SlotBank;
    type Arg<'s>
        = &'s mut SlotBank
    where
        Self: 's;
    fn save(&self, _: Contract) -> Result<SlotBank> {
        Ok((**self).clone())
    }
    fn primary(&mut self) -> &mut SlotBank {
        self
    }
    fn twin<'s>(&'s self, saved: &'s mut SlotBank) -> &'s mut SlotBank {
        saved
    }
    fn check(&self, saved: &SlotBank, contract: Contract) -> Result<Option<Breach>> {
        Ok(first_breach_f32(contract, &self.values(), &saved.values()))
    }
}

/// A GEMM output buffer, owned (the twin's copy of what the primary op starts from).
pub(crate) enum OwnedOutput {
    /// The twin's buffer, and the content both started from (what `beta` multiplies).
    F32(Vec<f32>, Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    Fp8 {
        codes: Vec<u8>,
        format: Fp8Format,
        scale: f32,
    },
}

impl Twin for Output<'_> {
    type Saved = OwnedOutput;
    type Arg<'s>
        = Output<'s>
    where
        Self: 's;
    fn save(&self, _: Contract) -> Result<OwnedOutput> {
        Ok(match self {
            Output::F32(d) => OwnedOutput::F32(d.to_vec(), d.to_vec()),
            Output::Bf16(d) => OwnedOutput::Bf16(d.to_vec()),
            Output::F16(d) => OwnedOutput::F16(d.to_vec()),
            Output::Fp8 { codes, format, scale } => OwnedOutput::Fp8 {
                codes: codes.to_vec(),
                format: *format,
                scale: *scale,
            },
        })
    }
    fn primary(&mut self) -> Output<'_> {
        match self {
            Output::F32(d) => Output::F32(d),
            Output::Bf16(d) => Output::Bf16(d),
            Output::F16(d) => Output::F16(d),
            Output::Fp8 { codes, format, scale } => Output::Fp8 {
                codes,
                format: *format,
                scale: *scale,
            },
        }
    }
    fn twin<'s>(&'s self, saved: &'s mut OwnedOutput) -> Output<'s> {
        match saved {
            OwnedOutput::F32(d, _) => Output::F32(d),
            OwnedOutput::Bf16(d) => Output::Bf16(d),
            OwnedOutput::F16(d) => Output::F16(d),
            OwnedOutput::Fp8 { codes, format, scale } => Output::Fp8 {
                codes,
                format: *format,
                scale: *scale,
            },
        }
    }
    fn check(&self, saved: &OwnedOutput, contract: Contract) -> Result<Option<Breach>> {
        Ok(self.output_breach(saved, contract))
    }
    #[cfg(test)]
    fn nudge(&mut self, index: usize, ulps: i32) -> bool {
        match self {
            Output::F32(d) => Twin::nudge(d, index, ulps),
            _ => false,
        }
    }
}

/// The GEMM output comparison of [`Twin::check`].
trait OutputBreach {
    fn output_breach(&self, saved: &OwnedOutput, contract: Contract) -> Option<Breach>;
}

impl OutputBreach for Output<'_> {
    fn output_breach(&self, saved: &OwnedOutput, contract: Contract) -> Option<Breach> {
        let widen = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
        let widen16 = |v: &[f16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
        let (dtype, scale, primary, cpu, before) = match (self, saved) {
            (Output::F32(p), OwnedOutput::F32(c, before)) => (
                GemmDtype::F32,
                1.0,
                p.iter().map(|&v| v as f64).collect(),
                c.iter().map(|&v| v as f64).collect(),
                Some(before.as_slice()),
            ),
            (Output::Bf16(p), OwnedOutput::Bf16(c)) => (GemmDtype::Bf16, 1.0, widen(p), widen(c), None),
            (Output::F16(p), OwnedOutput::F16(c)) => (GemmDtype::F16, 1.0, widen16(p), widen16(c), None),
            (
                Output::Fp8 {
                    codes: p,
                    format,
                    scale,
                },
                OwnedOutput::Fp8 { codes: c, .. },
            ) => {
                let decode = |v: &[u8]| v.iter().map(|&q| format.decode(q) as f64).collect::<Vec<_>>();
                (GemmDtype::Fp8(*format), *scale, decode(p), decode(c), None)
            }
            // The twin's buffer is a copy of the primary's: the variants always match.
            _ => return Some(Breach::exact(0, f64::NAN, f64::NAN)),
        };
        gemm_breach(contract, dtype, scale, primary, cpu, before)
    }
}

/// The first breach of a GEMM's output against its twin's: the per-element bound of the call's
/// operands where the contract names them, else the output format's tolerance.
fn gemm_breach(
    contract: Contract,
    dtype: GemmDtype,
    scale: f32,
    primary: Vec<f64>,
    cpu: Vec<f64>,
    before: Option<&[f32]>,
) -> Option<Breach> {
    match contract {
        Contract::Gemm { call: Some(call), .. } => gemm_check::first_breach(
            &call,
            &GemmResult {
                dtype,
                scale,
                primary: &primary,
                cpu: &cpu,
                before,
            },
        ),
        _ => first_breach(
            gemm_tolerance(dtype, gemm_k(contract)),
            primary.into_iter(),
            cpu.into_iter(),
        ),
    }
}

/// The K of a `gemm` contract (0, the K-free floor, for any other).
fn gemm_k(contract: Contract) -> usize {
    match contract {
        Contract::Gemm { k, .. } => k,
        _ => 0,
    }
}

/// An op's return value, compared by the op's contract.
pub(crate) trait Outcome {
    fn breach(&self, cpu: &Self, contract: Contract) -> Option<Breach>;
    /// Test-only perturbation of element `index` by `ulps`; says whether it did.
    #[cfg(test)]
    fn nudge(&mut self, _index: usize, _ulps: i32) -> bool {
        false
    }
}

impl Outcome for () {
    fn breach(&self, _: &(), _: Contract) -> Option<Breach> {
        None
    }
}

impl Outcome for f32 {
    fn breach(&self, cpu: &f32, contract: Contract) -> Option<Breach> {
        first_breach_f32(contract, &[*self], &[*cpu])
    }
}

impl Outcome for f64 {
    fn breach(&self, cpu: &f64, contract: Contract) -> Option<Breach> {
        first_breach(contract, [*self].into_iter(), [*cpu].into_iter())
    }
}

impl Outcome for bool {
    fn breach(&self, cpu: &bool, _: Contract) -> Option<Breach> {
        (self != cpu).then_some(Breach::exact(0, *self as u8 as f64, *cpu as u8 as f64))
    }
}

impl Outcome for Vec<f32> {
    fn breach(&self, cpu: &Vec<f32>, contract: Contract) -> Option<Breach> {
        first_breach_f32(contract, self, cpu)
    }
    #[cfg(test)]
    fn nudge(&mut self, index: usize, ulps: i32) -> bool {
        Twin::nudge(&mut self.as_mut_slice(), index, ulps)
    }
}

impl Outcome for GemmReport {
    fn breach(&self, cpu: &GemmReport, contract: Contract) -> Option<Breach> {
        // The amax of the f32 result before the output cast: the largest |D|, each D within its bound.
        if let Contract::Gemm { call: Some(call), .. } = contract {
            return gemm_check::amax_breach(&call, self.amax, cpu.amax);
        }
        first_breach_f32(
            gemm_tolerance(GemmDtype::F32, gemm_k(contract)),
            &[self.amax],
            &[cpu.amax],
        )
    }
}

/// `gemm_into`'s amax (by the GEMM's contract) or a current scale (exact), read where it was
/// left (a failed read is NaN, a breach).
impl Outcome for Deferred<f32> {
    fn breach(&self, cpu: &Deferred<f32>, contract: Contract) -> Option<Breach> {
        let read = |d: &Deferred<f32>| GemmReport {
            amax: d.get().unwrap_or(f32::NAN),
        };
        match contract {
            Contract::Exact => first_breach_f32(contract, &[read(self).amax], &[read(cpu).amax]),
            _ => read(self).breach(&read(cpu), contract),
        }
    }
}

/// Statistics compared finished (counts a GPU kept are read; a failed read is a breach).
impl Outcome for Fp8Stats {
    fn breach(&self, cpu: &Fp8Stats, contract: Contract) -> Option<Breach> {
        match (self.finish(), cpu.finish()) {
            (Ok(mine), Ok(theirs)) => mine.breach(&theirs, contract),
            _ => Some(Breach::exact(0, f64::NAN, f64::NAN)),
        }
    }
}

impl Outcome for PlainMat {
    fn breach(&self, cpu: &PlainMat, contract: Contract) -> Option<Breach> {
        first_breach(contract, self.widened().into_iter(), cpu.widened().into_iter())
    }
}

/// Elements of a quantized matrix in a fixed order: the codes, then the scales.
fn matrix_values(m: &QuantizedMatrix) -> Vec<f64> {
    let mut out: Vec<f64> = m.data().iter().map(|&q| q as f64).collect();
    match m.scales() {
        Scales::PerTensor(s) => out.push(*s as f64),
        Scales::Block1x128(s) | Scales::Block128x128(s) => out.extend(s.iter().map(|&v| v as f64)),
        Scales::Mxfp8(e) => out.extend(e.iter().map(|&v| v as f64)),
    }
    out
}

impl Outcome for QuantizedMatrix {
    fn breach(&self, cpu: &QuantizedMatrix, contract: Contract) -> Option<Breach> {
        if (self.rows(), self.cols()) != (cpu.rows(), cpu.cols()) {
            return Some(Breach::exact(0, f64::NAN, f64::NAN));
        }
        first_breach(
            contract,
            matrix_values(self).into_iter(),
            matrix_values(cpu).into_iter(),
        )
    }
}

/// Every element of a cast in a fixed order: row-wise codes and scales, column-wise codes and
/// scales, then amax and scale. A breach index counts into this order.
fn cast_values(c: &Cast) -> Vec<f64> {
    let mut out = matrix_values(c.tensor.rowwise());
    if let Some(col) = c.tensor.columnwise() {
        out.extend(matrix_values(col));
    }
    // An amax left on the GPU is read (a failed read is NaN, a breach).
    // So is a scale (current scaling's, computed there).
    let read = |d: &Deferred<f32>| d.get().unwrap_or(f32::NAN) as f64;
    out.extend([read(&c.amax), read(&c.scale)]);
    out
}

impl Outcome for Cast {
    fn breach(&self, cpu: &Cast, contract: Contract) -> Option<Breach> {
        if self.tensor.format() != cpu.tensor.format() || self.tensor.shape() != cpu.tensor.shape() {
            return Some(Breach::exact(0, f64::NAN, f64::NAN));
        }
        let (primary, twin) = (cast_values(self), cast_values(cpu));
        let counted_from = primary.len();
        if let Some(breach) = first_breach(contract, primary.into_iter(), twin.into_iter()) {
            return Some(breach);
        }
        // The statistics counted during the cast (a GPU cast of a device source counts there;
        // the CPU's per-tensor casts always count): `cast_stats` reads them instead of the
        // source, so they are checked here, after the values, exactly.
        let read = |c: &Option<Deferred<[u64; 4]>>| c.as_ref().map(|c| c.get().unwrap_or([u64::MAX; 4]));
        match (read(&self.counts), read(&cpu.counts)) {
            (Some(mine), Some(theirs)) => (0..4)
                .find(|&k| mine[k] != theirs[k])
                .map(|k| Breach::exact(counted_from + k, mine[k] as f64, theirs[k] as f64)),
            _ => None,
        }
    }
    #[cfg(test)]
    fn nudge(&mut self, index: usize, ulps: i32) -> bool {
        // Flips the lowest mantissa bit of one row-wise code (ulps only says "perturb").
        let _ = ulps;
        let (format, row, col) = self.tensor.clone().into_parts();
        let (mut data, scales) = row.into_parts();
        let Some(q) = data.get_mut(index) else { return false };
        *q ^= 1;
        let [rows, cols] = self.tensor.shape();
        let row = QuantizedMatrix::new(data, rows, cols, scales).expect("same shape");
        self.tensor = crate::tensor::QuantizedTensor::new(format, row, col).expect("same shape");
        true
    }
}

impl Outcome for Fp8TensorStats {
    fn breach(&self, cpu: &Fp8TensorStats, contract: Contract) -> Option<Breach> {
        if self.name != cpu.name || self.format != cpu.format {
            return Some(Breach::exact(0, f64::NAN, f64::NAN));
        }
        let values = |s: &Fp8TensorStats| {
            [
                s.amax as f64,
                s.scale as f64,
                s.saturated,
                s.underflow,
                s.nonfinite as f64,
            ]
        };
        first_breach(contract, values(self).into_iter(), values(cpu).into_iter())
    }
}
