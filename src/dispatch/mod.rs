//! One set of layers, two backends: the op trait [`Kernels`] lists every op the
//! layers, the model and the trainer run, once, with one signature; the CPU
//! backend implements it with the reference code (`ops`, `gemm::cpu`,
//! `quantize`, `scaling`), and [`Backend`] is the one place that picks the
//! implementation for a device. `nn`, `model` and `train` call ops only
//! through here.
//!
//! The CUDA backend's arms (`cuda_ops`) read values already on their GPU in place
//! ([`Values`]/[`ValuesMut`] arguments) and stage host values through host memory:
//! upload the inputs, run the kernel(s), download the host outputs
//! (`docs/cuda-backend.md`). Ops without a kernel return `Error::Unsupported`
//! naming the op, never a panic and never a silent host fallback. The activation,
//! embedding and loss ops take `Values`; the rest (optimizer, slot banks) still take
//! host slices. The layers keep a tensor where it lives, and pass device tensors
//! between their ops once a GPU backend uploads their input (unless `FP8_CUDA_RESIDENT=0`)
//! (`docs/cuda-backend.md`, Device-resident tensors).
//!
//! Shadow mode ([`Backend::checked_against_cpu`], `shadow.rs`) runs every op
//! on its backend and on the CPU twin, and compares them by the op's contract
//! (`contract.rs`, `docs/numerics.md`).

/// Calls `$m!` with every op argument type passed by value (scalars, shapes, names): the one
/// list the shadow runner (`twin.rs`) and the CPU arm (`on_host.rs`) pass through as they are.
macro_rules! by_value_args {
    ($m:ident) => {
        $m!(
            usize,
            u32,
            f32,
            bool,
            String,
            crate::format::Fp8Format,
            crate::tensor::Dtype,
            crate::scaling::TensorRole,
            crate::ops::NormShape,
            crate::ops::AttentionShape,
            crate::ops::CachedAttentionShape,
            crate::ops::RopeShape,
            crate::ops::elementwise::ColumnCopy,
            crate::ops::DropoutMask,
            crate::tensor::device_values::Deferred<f32>
        );
    };
}

pub(crate) mod arena_store;
mod contract;
mod cuda_ops;
#[cfg(test)]
pub(crate) mod device_values_tests;
pub(crate) mod fp8_cast;
mod gemm_check;
#[cfg(test)]
mod gqa_device_tests;
mod on_host;
pub mod op_times;
mod plain;
mod shadow;
#[cfg(test)]
mod shadow_tests;
mod twin;

pub(crate) use crate::ops::elementwise::ColumnCopy;
pub(crate) use crate::ops::{AdamWStep, AttentionShape, CachedAttentionShape, NormShape, RopeShape, RopeTable};
pub(crate) use fp8_cast::{Cast, Fp8Stats};
pub(crate) use plain::{Halves, PlainMat};
#[cfg(test)]
pub(crate) use shadow::{Perturbed, perturb_cpu_primaries};

use std::sync::Arc;

use arena_store::ArenaStore;
use on_host::OnHost;
use shadow::{Primary, ShadowKernels};
use twin::{Outcome, Twin};

use crate::amp::Fp8Recipe;
use crate::backend::cuda::arena::ArenaLayout;
use crate::error::{Error, Result};
use crate::format::Fp8Format;
use crate::gemm::{GemmParams, GemmReport, Operand, Output};
use crate::memory::MemoryCategory;
use crate::scaling::{DelayedScaling, SlotBank, TensorRole};
pub(crate) use crate::tensor::device_values::{Deferred, Values, ValuesMut};
use crate::tensor::{DeviceKind, DeviceMirror, Dtype, QuantizedMatrix, Tensor};

/// Declares the op trait from one list, with the CPU implementation of each op
/// (a path to the reference function) and the CUDA arm (`cuda_ops::<op>`, staged).
macro_rules! kernels {
    ($( $(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $cpu:path
        $(, gemm_call = $call:expr)? $(, contract = $own:expr)?; )*) => {
        /// Every op of the layers, model and trainer, implemented once per backend.
        #[allow(clippy::too_many_arguments)] // the ops' own signatures (`ops::*`)
        pub(crate) trait Kernels {
            $( $(#[$doc])* fn $name(&self, $($arg: $ty),*) -> Result<$ret>; )*
        }

        #[allow(clippy::too_many_arguments)]
        impl Kernels for CpuKernels {
            $( fn $name(&self, $($arg: $ty),*) -> Result<$ret> {
                op_times::timed(stringify!($name), || {
                    $cpu($(OnHost::on_host($arg, stringify!($name))?),*)
                })
            } )*
        }

        #[allow(clippy::too_many_arguments)]
        impl Kernels for CudaKernels {
            $( fn $name(&self, $($arg: $ty),*) -> Result<$ret> {
                op_times::timed(stringify!($name), || {
                    let result = cuda_ops::$name(self, $($arg),*);
                    match op_times::syncing_ops() {
                        true => cuda_ops::wait_for_stream(self).and(result),
                        false => result,
                    }
                })
            } )*
        }

        /// Each op: state saved, the primary op, its CPU twin on the saved state, then the
        /// in-place state and the results compared by the op's contract (with the call's
        /// operands where the list names them: a GEMM's K and bound).
        #[allow(clippy::too_many_arguments)]
        impl Kernels for ShadowKernels {
            $(
                fn $name(&self, $($arg: $ty),*) -> Result<$ret> {
                    let contract = contract::contract(stringify!($name));
                    $( let contract = contract.for_gemm($call); )?
                    // An op's own contract from its call (attention: its dtype) replaces the name's.
                    $( let contract = { let _ = contract; $own }; )?
                    $( let mut $arg = Saved::<$ty>::new($arg, contract)?; )*
                    let primary = self.primary.kernels().$name($(Twin::primary(&mut $arg.live)),*)?;
                    let cpu = CpuKernels.$name($(Twin::twin(&$arg.live, &mut $arg.saved)),*)?;
                    $(
                        if let Some(breach) = Twin::check(&$arg.live, &$arg.saved, contract)? {
                            return Err(self.mismatch(stringify!($name), breach));
                        }
                    )*
                    match Outcome::breach(&primary, &cpu, contract) {
                        Some(breach) => Err(self.mismatch(stringify!($name), breach)),
                        None => Ok(primary),
                    }
                }
            )*
        }

        /// The CPU ops, with the first output of `self.op` moved.
        #[cfg(test)]
        #[allow(clippy::too_many_arguments)]
        impl Kernels for Perturbed {
            $(
                fn $name(&self, $(mut $arg: $ty),*) -> Result<$ret> {
                    let mut result = CpuKernels.$name($(Twin::primary(&mut $arg)),*)?;
                    if stringify!($name) == self.op {
                        let mut moved = Outcome::nudge(&mut result, self.index, self.ulps);
                        $( moved = moved || Twin::nudge(&mut $arg, self.index, self.ulps); )*
                        assert!(moved, "op {} has no element {} to move", self.op, self.index);
                    }
                    Ok(result)
                }
            )*
        }
    };
}

kernels! {
    /// Casts `[rows, cols]` to FP8 under any recipe, both copies (row-wise and transposed).
    fn quantize(recipe: &Fp8Recipe, role: TensorRole, src: Values<'_>, rows: usize, cols: usize, delayed_scale: f32)
        -> Cast = fp8_cast::cast;
    /// `D = A B^T` scaled (`docs/numerics.md`, GEMM), any operand precision, into any output
    /// type. The layers and models write f32 through [`Kernels::gemm_into`]; this op keeps the
    /// 16-bit and FP8 outputs reachable through the trait (its tests, shadow mode's). `params`
    /// by value: its bias may live on a GPU (`gemm::Bias`), which the CPU arm refuses and
    /// shadow mode downloads for the twin, as for any device value.
    #[cfg_attr(not(test), allow(dead_code))]
    fn gemm(a: &Operand, b: &Operand, out: Output, params: GemmParams<'_>) -> GemmReport = cpu_gemm,
        gemm_call = contract::GemmCall { a, b, params: &params };
    /// [`Kernels::gemm`] into f32 values wherever they live (an activation's GEMM whose result
    /// stays on the device of the call); the result's amax (0 unless `params.report_amax`),
    /// left on the GPU of a device output.
    fn gemm_into(a: &Operand, b: &Operand, out: ValuesMut<'_>, params: GemmParams<'_>) -> Deferred<f32> = cpu_gemm_into,
        gemm_call = contract::GemmCall { a, b, params: &params };
    /// The exact transpose of FP8 codes with per-tensor or 128x128 scales (a frozen weight's
    /// `W^T`), made where the codes are held.
    fn transpose_fp8(m: &QuantizedMatrix) -> QuantizedMatrix = crate::quantize::transpose_matrix;
    /// f32 values to a plain compute dtype.
    fn convert(dtype: Dtype, src: Values<'_>) -> PlainMat = plain::convert;
    /// The transpose of `[rows, cols]` f32 values in a plain compute dtype.
    fn convert_transposed(dtype: Dtype, src: Values<'_>, rows: usize, cols: usize) -> PlainMat = plain::convert_transposed;
    /// LayerNorm forward, saving mean and rstd.
    fn layernorm_forward(x: Values<'_>, gamma: Values<'_>, beta: Values<'_>, shape: NormShape, eps: f32, zero_centered: bool,
        y: ValuesMut<'_>, mean: ValuesMut<'_>, rstd: ValuesMut<'_>) -> () = crate::ops::layernorm_forward;
    /// LayerNorm backward: dx, and `+=` into dgamma and dbeta.
    fn layernorm_backward(dy: Values<'_>, x: Values<'_>, gamma: Values<'_>, mean: Values<'_>, rstd: Values<'_>, shape: NormShape,
        zero_centered: bool, dx: ValuesMut<'_>, dgamma: ValuesMut<'_>, dbeta: ValuesMut<'_>) -> () = crate::ops::layernorm_backward;
    /// RMSNorm forward, saving rstd.
    fn rmsnorm_forward(x: Values<'_>, gamma: Values<'_>, shape: NormShape, eps: f32, zero_centered: bool, y: ValuesMut<'_>,
        rstd: ValuesMut<'_>) -> () = crate::ops::rmsnorm_forward;
    /// RMSNorm backward: dx, and `+=` into dgamma.
    fn rmsnorm_backward(dy: Values<'_>, x: Values<'_>, gamma: Values<'_>, rstd: Values<'_>, shape: NormShape, zero_centered: bool,
        dx: ValuesMut<'_>, dgamma: ValuesMut<'_>) -> () = crate::ops::rmsnorm_backward;
    /// tanh-GELU forward.
    fn gelu_forward(x: Values<'_>, y: ValuesMut<'_>) -> () = crate::ops::gelu_forward;
    /// tanh-GELU backward.
    fn gelu_backward(dy: Values<'_>, x: Values<'_>, dx: ValuesMut<'_>) -> () = crate::ops::gelu_backward;
    /// SwiGLU forward over `[rows, 2 * cols]`.
    fn swiglu_forward(x: Values<'_>, rows: usize, cols: usize, y: ValuesMut<'_>) -> () = crate::ops::swiglu_forward;
    /// SwiGLU backward.
    fn swiglu_backward(dy: Values<'_>, x: Values<'_>, rows: usize, cols: usize, dx: ValuesMut<'_>) -> ()
        = crate::ops::swiglu_backward;
    /// Causal attention core forward, saving the log-sum-exp.
    fn attention_forward(q: Values<'_>, k: Values<'_>, v: Values<'_>, shape: AttentionShape, softmax_scale: f32, dtype: Dtype,
        out: ValuesMut<'_>, lse: ValuesMut<'_>) -> () = crate::ops::attention_forward, contract = contract::attention(dtype);
    /// Causal attention core backward.
    fn attention_backward(dout: Values<'_>, q: Values<'_>, k: Values<'_>, v: Values<'_>, out: Values<'_>, lse: Values<'_>,
        shape: AttentionShape, softmax_scale: f32, dtype: Dtype, dq: ValuesMut<'_>, dk: ValuesMut<'_>, dv: ValuesMut<'_>)
        -> () = crate::ops::attention_backward, contract = contract::attention(dtype);
    /// Causal attention of new queries against a key/value cache (generation), forward only.
    fn attention_cached(q: &[f32], k: &[f32], v: &[f32], shape: CachedAttentionShape, softmax_scale: f32,
        dtype: Dtype, out: &mut [f32]) -> () = crate::ops::attention_cached, contract = contract::attention(dtype);
    /// Rotary position embedding of `[rows, heads * head_dim]`, in place.
    fn rope_forward(x: ValuesMut<'_>, shape: RopeShape, table: &RopeTable) -> () = cpu_rope_forward;
    /// The rotary embedding's backward (the transposed rotation), in place.
    fn rope_backward(dx: ValuesMut<'_>, shape: RopeShape, table: &RopeTable) -> () = cpu_rope_backward;
    /// The residual add, rounded to the dtype.
    fn residual_add(x: Values<'_>, f: Values<'_>, dtype: Dtype, out: ValuesMut<'_>) -> () = cpu_residual_add;
    /// A column range of `a` into `out` (the other columns of `out` kept).
    fn copy_columns(a: Values<'_>, out: ValuesMut<'_>, copy: ColumnCopy) -> () = crate::ops::elementwise::copy_columns;
    /// `values *= factor` in f32, in place.
    fn multiply(values: ValuesMut<'_>, factor: f32) -> () = crate::ops::elementwise::multiply;
    /// Inverted dropout, `out = round(x * mask)` (a LoRA adapter's input), the mask drawn where
    /// the op runs (`ops::dropout`: counter-based, the same on every backend).
    fn dropout(x: Values<'_>, mask: crate::ops::DropoutMask, dtype: Dtype, out: ValuesMut<'_>) -> ()
        = crate::ops::dropout;
    /// `out = round(out + g * mask)`: an input gradient through dropout, added to `out`.
    fn dropout_add(g: Values<'_>, mask: crate::ops::DropoutMask, dtype: Dtype, out: ValuesMut<'_>) -> ()
        = crate::ops::dropout_add;
    /// The values rounded to the compute dtype in place (kept as f32, the layers' storage).
    fn round(values: ValuesMut<'_>, dtype: Dtype) -> () = cpu_round;
    /// `sums += column sums of x` (bias gradients).
    fn column_sum(x: Values<'_>, cols: usize, sums: ValuesMut<'_>) -> () = crate::ops::elementwise::column_sum_accumulate;
    /// Embedding gather (the ids are host values: the data loader's).
    fn embedding_forward(ids: &[u32], table: Values<'_>, dim: usize, out: ValuesMut<'_>) -> ()
        = crate::ops::embedding_forward;
    /// Embedding scatter-add into the table gradient.
    fn embedding_backward(ids: &[u32], dout: Values<'_>, dim: usize, dtable: ValuesMut<'_>) -> ()
        = crate::ops::embedding_backward;
    /// Mean cross-entropy over the non-ignored targets (returned: read back from a GPU), saving
    /// the log-sum-exp.
    fn cross_entropy_forward(logits: Values<'_>, targets: &[u32], vocab: usize, ignore: u32, lse: ValuesMut<'_>)
        -> f32 = crate::ops::cross_entropy_forward;
    /// Cross-entropy backward into dlogits.
    fn cross_entropy_backward(logits: Values<'_>, targets: &[u32], vocab: usize, ignore: u32, lse: Values<'_>,
        dloss: f32, dlogits: ValuesMut<'_>) -> () = crate::ops::cross_entropy_backward;
    /// The delayed-scaling update of the slots `slots` of a bank, slot `slots[k]` in `formats[k]`
    /// (`docs/numerics.md`, delayed scaling).
    fn delayed_update(bank: &mut SlotBank, slots: &[usize], formats: &[Fp8Format], recipe: &DelayedScaling) -> ()
        = cpu_delayed_update;
    /// What a cast of slot `slot` leaves in its bank ([`SlotBank::record_cast`]): on a bank
    /// kept on the GPU, an amax left there is folded in there, nothing read back.
    fn record_amax(bank: &mut SlotBank, slot: usize, amax: &Deferred<f32>) -> () = cpu_record_amax;
    /// FP8 statistics of a cast.
    fn cast_stats(name: String, src: Values<'_>, cast: &Cast) -> Fp8Stats = fp8_cast::cast_stats;
    /// FP8 statistics of a high-precision tensor as if cast per tensor with `scale`.
    fn uncast_stats(name: String, values: Values<'_>, format: Fp8Format, amax: Deferred<f32>, scale: Deferred<f32>)
        -> Fp8Stats = cpu_uncast_stats;
    /// Current scaling's scale of `amax` in `format` (`ScaleRule::scale`, `docs/numerics.md`):
    /// an amax left on a GPU gives a scale computed and left there (nothing read back).
    fn current_scale(amax: Deferred<f32>, format: Fp8Format, power_2: bool, epsilon: f32) -> Deferred<f32>
        = cpu_current_scale;
    /// One AdamW update of a parameter and its moments.
    fn adamw(value: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], step: &crate::ops::AdamWStep) -> ()
        = crate::ops::adamw_update;
    /// Sum of squares in f64 (gradient norms).
    fn sum_squares(values: &[f32]) -> f64 = cpu_sum_squares;
    /// Multiplies by `inv_scale` and says whether every result is finite.
    fn unscale_and_check(values: &mut [f32], inv_scale: f32) -> bool = cpu_unscale_and_check;
}

fn cpu_delayed_update(
    bank: &mut SlotBank,
    slots: &[usize],
    formats: &[Fp8Format],
    recipe: &DelayedScaling,
) -> Result<()> {
    check_delayed_update(bank, slots, formats)?;
    bank.update(slots, formats, recipe);
    Ok(())
}

/// `delayed_update`'s arguments, checked once for every backend: a format per slot, every slot
/// in the bank.
pub(crate) fn check_delayed_update(bank: &SlotBank, slots: &[usize], formats: &[Fp8Format]) -> Result<()> {
    if slots.len() != formats.len() || slots.iter().any(|&i| i >= bank.slots()) {
        return Err(Error::LengthMismatch {
            what: "delayed_update slots and formats",
            src: slots.len(),
            dst: formats.len(),
        });
    }
    Ok(())
}

fn cpu_record_amax(bank: &mut SlotBank, slot: usize, amax: &Deferred<f32>) -> Result<()> {
    check_slot(bank, slot)?;
    bank.record_cast(slot, amax.get()?);
    Ok(())
}

/// `record_amax`'s slot, checked once for every backend.
pub(crate) fn check_slot(bank: &SlotBank, slot: usize) -> Result<()> {
    match slot < bank.slots() {
        true => Ok(()),
        false => Err(Error::LengthMismatch {
            what: "record_amax slot past the bank",
            src: slot,
            dst: bank.slots(),
        }),
    }
}

fn cpu_uncast_stats(
    name: String,
    values: &[f32],
    format: Fp8Format,
    amax: Deferred<f32>,
    scale: Deferred<f32>,
) -> Result<Fp8Stats> {
    let (amax, scale) = (amax.get()?, scale.get()?);
    Ok(Fp8Stats::Ready(fp8_cast::uncast_stats(
        name, values, format, amax, scale,
    )))
}

fn cpu_current_scale(amax: Deferred<f32>, format: Fp8Format, power_2: bool, epsilon: f32) -> Result<Deferred<f32>> {
    Ok(current_rule(format, power_2, epsilon)?.scale(amax.get()?).into())
}

/// The rule of [`Kernels::current_scale`], checked once for every backend.
pub(crate) fn current_rule(format: Fp8Format, power_2: bool, epsilon: f32) -> Result<crate::quantize::ScaleRule> {
    let rule = crate::quantize::ScaleRule {
        format,
        power_2_scale: power_2,
        amax_epsilon: epsilon,
    };
    rule.validate()?;
    Ok(rule)
}

fn cpu_residual_add(x: &[f32], f: &[f32], dtype: Dtype, out: &mut [f32]) -> Result<()> {
    crate::ops::elementwise::residual_add_into(x, f, dtype, out)
}

fn cpu_gemm(a: &Operand, b: &Operand, out: Output, params: GemmParams) -> Result<GemmReport> {
    crate::gemm::cpu::gemm(a, b, out, &params)
}

fn cpu_gemm_into(a: &Operand, b: &Operand, out: &mut [f32], params: GemmParams) -> Result<Deferred<f32>> {
    Ok(crate::gemm::cpu::gemm(a, b, Output::F32(out), &params)?.amax.into())
}

fn cpu_round(values: &mut [f32], dtype: Dtype) -> Result<()> {
    dtype.round_slice(values);
    Ok(())
}

fn cpu_rope_forward(x: &mut [f32], shape: RopeShape, table: &RopeTable) -> Result<()> {
    crate::ops::rope_forward(x, &shape, table)
}

fn cpu_rope_backward(dx: &mut [f32], shape: RopeShape, table: &RopeTable) -> Result<()> {
    crate::ops::rope_backward(dx, &shape, table)
}

fn cpu_sum_squares(values: &[f32]) -> Result<f64> {
    Ok(crate::ops::sum_of_squares(values))
}

fn cpu_unscale_and_check(values: &mut [f32], inv_scale: f32) -> Result<bool> {
    Ok(crate::ops::unscale_and_check(values, inv_scale))
}

/// An op argument and the copy the CPU twin starts from (taken before the primary op runs).
struct Saved<T: Twin> {
    live: T,
    saved: T::Saved,
}

impl<T: Twin> Saved<T> {
    fn new(live: T, contract: contract::Contract) -> Result<Self> {
        let saved = live.save(contract)?;
        Ok(Saved { live, saved })
    }
}

/// Reads the results a GPU still holds among `scalars` and `counts` (FP8 statistics: amaxes and
/// counts) with one download per GPU and element type, so that reading each afterwards waits for
/// nothing. Results in host memory, or of a stand-in, are left as they are.
pub(crate) fn read_deferred(scalars: &[Deferred<f32>], counts: &[Deferred<[u64; 4]>]) -> Result<()> {
    cuda_ops::read_all(scalars, counts)
}

/// The CPU reference backend.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CpuKernels;

/// The CUDA backend of one GPU (its device is opened on the first op, `cuda_ops::staged`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CudaKernels {
    ordinal: usize,
}

/// The backend of one device: the single place where a device picks its kernels.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    Cpu(CpuKernels),
    Cuda(CudaKernels),
    /// Every op checked against its CPU twin (`--check-cpu`).
    Shadow(ShadowKernels),
}

impl Default for Backend {
    fn default() -> Self {
        Backend::Cpu(CpuKernels)
    }
}

impl Backend {
    /// The backend of `device`.
    pub(crate) fn on(device: DeviceKind) -> Self {
        match device {
            DeviceKind::Cpu => Backend::Cpu(CpuKernels),
            DeviceKind::Cuda(ordinal) => Backend::Cuda(CudaKernels { ordinal }),
        }
    }

    /// The device it runs on.
    pub(crate) fn device(&self) -> DeviceKind {
        match self {
            Backend::Cpu(_) => DeviceKind::Cpu,
            Backend::Cuda(k) => DeviceKind::Cuda(k.ordinal),
            Backend::Shadow(k) => k.primary.device(),
        }
    }

    /// This backend with every op shadowed by its CPU twin and checked by the op's contract
    /// (`docs/numerics.md`, Op contracts between backends), for the ops of `layer`; `on = false`
    /// undoes it.
    pub(crate) fn checked_against_cpu(&self, on: bool, layer: &str) -> Self {
        let primary = match self {
            Backend::Cpu(k) => Primary::Cpu(*k),
            Backend::Cuda(k) => Primary::Cuda(*k),
            Backend::Shadow(k) => k.primary.clone(),
        };
        match (on, primary) {
            (true, primary) => Backend::Shadow(ShadowKernels {
                primary: shadow::primary_for_tests(primary),
                layer: Arc::from(layer),
            }),
            (false, Primary::Cpu(k)) => Backend::Cpu(k),
            (false, Primary::Cuda(k)) => Backend::Cuda(k),
            #[cfg(test)]
            (false, Primary::Perturbed(_)) => Backend::Cpu(CpuKernels),
        }
    }

    /// Whether the optimizer keeps its arenas on this backend's device, apart from the host: a
    /// plain CUDA backend does (device memory, the moments kept there between steps); the CPU
    /// and shadow mode do not (shadow mode checks each parameter's update against its twin).
    pub(crate) fn holds_arenas(&self) -> bool {
        matches!(self, Backend::Cuda(_)) && cuda_ops::switches::arenas_enabled()
    }

    /// Whether a layer running on this backend's GPU keeps its delayed-scaling slot bank there
    /// (a plain CUDA backend with `FP8_CUDA_DEVICE_BANKS=1`, not yet validated on a GPU; shadow
    /// mode checks each record and update against its twin on host banks).
    pub(crate) fn holds_slot_banks(&self) -> bool {
        matches!(self, Backend::Cuda(_)) && crate::backend::cuda::env_switch::device_slot_banks()
    }

    /// Moves `bank` to this backend's GPU if it [holds slot banks](Self::holds_slot_banks)
    /// (nothing to do if it is there already; from another GPU it comes home first:
    /// `SlotBank::keep_on`); otherwise brings it home.
    pub(crate) fn keep_slot_bank(&self, bank: &mut SlotBank) -> Result<()> {
        let ordinal = match self {
            Backend::Cuda(k) if self.holds_slot_banks() => k.ordinal,
            _ => return bank.bring_home(),
        };
        let (slots, len) = (bank.slots(), bank.history_len());
        bank.keep_on(ordinal, |host| {
            cuda_ops::bank_on(&CudaKernels { ordinal }, host, slots, len)
        })
    }

    /// The optimizer's arenas of `layout` on this backend's device ([`Self::holds_arenas`]).
    pub(crate) fn arena_store(&self, layout: ArenaLayout) -> Result<Box<dyn ArenaStore>> {
        match self {
            Backend::Cuda(k) => cuda_ops::arena_store(k, layout),
            Backend::Cpu(_) | Backend::Shadow(_) => Err(Error::Unsupported {
                op: "device arenas",
                device: self.device().to_string(),
            }),
        }
    }

    /// The device copy a matrix that stays (a frozen FP8 weight) keeps on this backend's GPU, so
    /// its GEMMs read it in place: uploaded once (or `q`'s own copy there). `None` on the CPU, or
    /// with `FP8_CUDA_MIRRORS=0` (the GEMMs then upload it each time). Shadow mode keeps it
    /// too: its primary ops run on the GPU, the twins read the host codes.
    pub(crate) fn resident_copy(&self, q: &QuantizedMatrix) -> Result<Option<Arc<DeviceMirror>>> {
        match self.device() {
            DeviceKind::Cpu => Ok(None),
            DeviceKind::Cuda(ordinal) => cuda_ops::resident(&CudaKernels { ordinal }, q),
        }
    }

    /// `tensor`'s values on this backend's device: the same tensor on the CPU (a GPU one
    /// downloaded), uploaded to a CUDA backend's GPU (a tensor already there shared, not copied).
    pub(crate) fn to_device(&self, tensor: &Tensor) -> Result<Tensor> {
        self.to_device_as(tensor, MemoryCategory::Activations)
    }

    /// [`Self::to_device`] booking an upload in the device's ledger under `category` (a
    /// parameter's gradient kept on the device is `Workspace`: `Parameter::keep_grad_on`).
    pub(crate) fn to_device_as(&self, tensor: &Tensor, category: MemoryCategory) -> Result<Tensor> {
        let (rows, cols) = tensor.shape();
        match (self.device(), tensor.device()) {
            (DeviceKind::Cpu, _) => tensor.to_host(),
            (DeviceKind::Cuda(want), DeviceKind::Cuda(have)) if want == have => Ok(tensor.clone()),
            // An empty tensor has nothing to move (and a GPU allocates none of zero bytes).
            _ if tensor.is_empty() => Tensor::new(Vec::new(), rows, cols),
            (DeviceKind::Cuda(ordinal), _) => {
                let host = tensor.to_host()?;
                Tensor::on_device(
                    cuda_ops::upload(&CudaKernels { ordinal }, host.data(), category)?,
                    rows,
                    cols,
                )
            }
        }
    }

    /// `x` uploaded for a layer that keeps its activations on this backend's GPU between its
    /// ops (the default; `FP8_CUDA_RESIDENT=0` turns it off): `None` on the CPU, with
    /// the switch off, or for a tensor that is not in host memory (already on the device).
    pub(crate) fn resident_input(&self, x: &Tensor) -> Result<Option<Tensor>> {
        if self.resident_device() == DeviceKind::Cpu || x.device() != DeviceKind::Cpu {
            return Ok(None);
        }
        self.to_device(x).map(Some)
    }

    /// The GPU this backend's layers keep their activations on between ops (a CUDA backend,
    /// unless `FP8_CUDA_RESIDENT=0`), or the CPU: where a model puts its embeddings' outputs,
    /// logits and loss state (`model::ends`).
    pub(crate) fn resident_device(&self) -> DeviceKind {
        match self.device() {
            DeviceKind::Cuda(_) if crate::backend::cuda::env_switch::resident_layers() => self.device(),
            _ => DeviceKind::Cpu,
        }
    }

    /// `f` run on `x` as a layer that keeps its activations on the GPU between its ops: with
    /// [`Self::resident_input`]'s upload of a host `x`, the result coming back to the host;
    /// otherwise on `x` where it lives.
    pub(crate) fn resident_boundary(&self, x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        match self.resident_input(x)? {
            Some(uploaded) => f(&uploaded)?.into_host(),
            None => f(x),
        }
    }

    /// A `[rows, cols]` tensor for an op's output, where `input` lives: host memory for a host
    /// input, a new array on its GPU for a device one (the op writes every value; the
    /// contents before are unspecified).
    pub(crate) fn output_like(&self, input: &Tensor, rows: usize, cols: usize) -> Result<Tensor> {
        self.output_at(input.device(), rows, cols)
    }

    /// [`Self::output_like`] for an input that lives on `device`.
    pub(crate) fn output_at(&self, device: DeviceKind, rows: usize, cols: usize) -> Result<Tensor> {
        let len = rows.checked_mul(cols).ok_or(Error::ShapeMismatch {
            what: "op output",
            rows,
            cols,
            expected: usize::MAX,
            got: 0,
        })?;
        match device {
            // No values to keep anywhere (and a GPU allocates none of zero bytes): on the host.
            _ if len == 0 => Tensor::new(Vec::new(), rows, cols),
            DeviceKind::Cpu => Tensor::new(crate::tensor::scratch::overwritten(len), rows, cols),
            DeviceKind::Cuda(ordinal) => {
                Tensor::on_device(cuda_ops::new_values(&CudaKernels { ordinal }, len)?, rows, cols)
            }
        }
    }

    /// The kernels of this device (the one dispatch `match`).
    pub(crate) fn kernels(&self) -> &dyn Kernels {
        match self {
            Backend::Cpu(k) => k,
            Backend::Cuda(k) => k,
            Backend::Shadow(k) => k,
        }
    }

    /// Checks that `tensor`, an input of `op`, lives where this backend's ops can read it: in
    /// host memory (the CUDA arms stage it) or on this backend's own GPU. A tensor on another
    /// GPU, or any GPU tensor given to the CPU backend, is `DeviceMismatch`, not a panic at its
    /// first host read.
    pub(crate) fn expect_on(&self, op: &'static str, tensor: &Tensor) -> Result<()> {
        let here = tensor.device();
        if here == DeviceKind::Cpu || here == self.device() {
            return Ok(());
        }
        Err(Error::DeviceMismatch {
            op,
            expected: self.device().to_string(),
            got: here.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_on_cuda_checks_its_shape_like_the_twin_before_opening_the_device() {
        let table = RopeTable::new(&[1.0, 0.5], 4);
        let shape = RopeShape {
            rows: 2,
            seq: 2,
            heads: 1,
            head_dim: 4,
            first_position: 3,
        };
        let mut x = vec![7.0f32; 8];
        // Position 4 is past the table: the twin's error, whether or not GPU 99 exists.
        let cuda = Backend::on(DeviceKind::Cuda(99))
            .kernels()
            .rope_forward(ValuesMut::Host(&mut x), shape, &table)
            .expect_err("past the table");
        let cpu = Backend::default()
            .kernels()
            .rope_forward(ValuesMut::Host(&mut x), shape, &table)
            .expect_err("past the table");
        assert_eq!(cuda, cpu);
        // A good shape reaches the device, which is missing: a typed error, x untouched.
        let shape = RopeShape {
            first_position: 0,
            ..shape
        };
        let err = Backend::on(DeviceKind::Cuda(99))
            .kernels()
            .rope_backward(ValuesMut::Host(&mut x), shape, &table)
            .expect_err("there is no GPU 99");
        assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
        assert_eq!(x, vec![7.0; 8], "a failed op must not touch its input");
    }

    #[test]
    fn a_cuda_op_without_that_gpu_is_a_typed_error_and_touches_nothing() {
        // No machine has GPU 99: the staged arm fails to open it before any copy.
        let mut y = vec![7.0f32; 4];
        let err = Backend::on(DeviceKind::Cuda(99))
            .kernels()
            .gelu_forward(Values::Host(&[1.0; 4]), ValuesMut::Host(&mut y))
            .expect_err("there is no GPU 99");
        assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
        assert_eq!(y, vec![7.0; 4]);
    }

    #[test]
    fn mxfp8_and_f32_gemm_operands_go_to_the_device_after_the_cpu_gemm_checks() {
        let data = vec![1.0f32; 16 * 16];
        let a = Operand::F32(crate::gemm::Mat::new(&data, 16, 16).unwrap());
        let mut d = vec![0.0f32; 16 * 16];
        // f32 operands take the cuBLASLt path: GPU 99 is missing, a typed error.
        let err = Backend::on(DeviceKind::Cuda(99))
            .kernels()
            .gemm(&a, &a, Output::F32(&mut d), GemmParams::default())
            .unwrap_err();
        assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
        // A wrong output length is the CPU GEMM's own error, before any device is opened.
        let mut short = vec![0.0f32; 16 * 15];
        let cuda = Backend::on(DeviceKind::Cuda(99))
            .kernels()
            .gemm(&a, &a, Output::F32(&mut short), GemmParams::default())
            .unwrap_err();
        let cpu = Backend::default()
            .kernels()
            .gemm(&a, &a, Output::F32(&mut short), GemmParams::default())
            .unwrap_err();
        assert_eq!(cuda, cpu);
        // MXFP8 operands have a CUDA GEMM now: GPU 99 is missing, not the kernel.
        let q = crate::quantize::quantize_mxfp8(&data, 16, 16, Fp8Format::E4M3, false).unwrap();
        let b = Operand::Fp8(Fp8Format::E4M3, q.rowwise());
        let err = Backend::on(DeviceKind::Cuda(99))
            .kernels()
            .gemm(&b, &b, Output::F32(&mut d), GemmParams::default())
            .unwrap_err();
        assert!(matches!(err, Error::NoGpu { .. } | Error::KernelsMissing), "{err}");
        // Their shape errors are the CPU GEMM's too, before any device is opened.
        let cuda = Backend::on(DeviceKind::Cuda(99))
            .kernels()
            .gemm(&b, &b, Output::F32(&mut short), GemmParams::default())
            .unwrap_err();
        let cpu = Backend::default()
            .kernels()
            .gemm(&b, &b, Output::F32(&mut short), GemmParams::default())
            .unwrap_err();
        assert_eq!(cuda, cpu);
        assert!(matches!(cpu, Error::ShapeMismatch { .. }), "{cpu}");
    }

    #[test]
    fn the_cpu_arm_is_the_reference_code() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
        let (mut via_dispatch, mut direct) = (vec![0.0; 64], vec![0.0; 64]);
        Backend::default()
            .kernels()
            .gelu_forward(Values::Host(&x), ValuesMut::Host(&mut via_dispatch))
            .unwrap();
        crate::ops::gelu_forward(&x, &mut direct).unwrap();
        assert_eq!(
            via_dispatch.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            direct.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
