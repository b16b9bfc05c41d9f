//! Device values of the CUDA backend: the [`DeviceArray`] a tensor holds on a GPU
//! ([`CudaValues`]), and how an op's arm reaches its arguments wherever they live: a device
//! value in place, a host value through the staging pool ([`Staged::input`], [`Staged::output`],
//! [`Staged::in_place`]), its result downloaded only where the caller passed host memory.

use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::{Lease, Staged, staged};
use crate::backend::cuda::DeviceBuffer;
use crate::dispatch::CudaKernels;
use crate::error::{Error, Result};
use crate::memory::MemoryCategory;
use crate::tensor::device_values::{CudaStorage, DeviceArray, Values, ValuesMut};

/// f32 values a CUDA op wrote and left on its GPU, booked in its ledger under `category`
/// (activations, or workspace for a parameter's gradient kept there: `Parameter::keep_grad_on`).
pub(crate) struct CudaValues {
    staged: Arc<Staged>,
    ordinal: usize,
    category: MemoryCategory,
    buffer: DeviceBuffer<f32>,
    /// A range an optimizer arena lent ([`CudaValues::lent`]); other views (an empty buffer)
    /// are not.
    lent: bool,
}

impl std::fmt::Debug for CudaValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaValues(cuda:{}, {} values)", self.ordinal, self.buffer.len())
    }
}

impl DeviceArray for CudaValues {
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn len(&self) -> usize {
        self.buffer.len()
    }
    fn read(&self, out: &mut [f32]) -> Result<()> {
        self.staged.down(&self.buffer, out)
    }
    fn blank(&self) -> Result<Box<dyn DeviceArray>> {
        Ok(Box::new(self.staged.array(
            self.ordinal,
            self.buffer.len(),
            self.category,
        )?))
    }
    fn duplicate(&self) -> Result<Box<dyn DeviceArray>> {
        let mut copy = self.staged.array(self.ordinal, self.buffer.len(), self.category)?;
        self.staged.device().copy(&self.buffer, &mut copy.buffer)?;
        Ok(Box::new(copy))
    }
    fn zero(&mut self) -> Result<()> {
        self.staged.device().zero(&mut self.buffer)
    }
    fn write(&mut self, host: &[f32]) -> Result<()> {
        self.staged.device().write_at(host, &mut self.buffer, 0)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn arena_view(&self) -> Option<(usize, usize)> {
        let range = self.buffer.view_of().map(|(base, offset)| (base as usize, offset));
        range.filter(|_| self.lent)
    }
}

impl CudaValues {
    /// A range of an optimizer arena (`buffer`, a view) as a parameter's values on GPU
    /// `ordinal`; copies of it are booked as workspace, as a parameter's own device copy is.
    pub(crate) fn lent(staged: Arc<Staged>, ordinal: usize, buffer: DeviceBuffer<f32>) -> CudaStorage {
        CudaStorage::new(Box::new(CudaValues {
            staged,
            ordinal,
            category: MemoryCategory::Workspace,
            buffer,
            lent: true,
        }))
    }
}

/// `len` new values on the GPU of `k`, for an op's output ([`Staged::new_values`]).
pub(crate) fn new_values(k: &CudaKernels, len: usize) -> Result<CudaStorage> {
    staged(k)?.new_values(k.ordinal, len)
}

/// `host` uploaded to the GPU of `k`, as a tensor's values there, booked under `category`.
pub(crate) fn upload(k: &CudaKernels, host: &[f32], category: MemoryCategory) -> Result<CudaStorage> {
    let s = staged(k)?;
    let mut storage = CudaStorage::new(Box::new(s.array(k.ordinal, host.len(), category)?));
    if !host.is_empty() {
        let buffer = s.own_mut("upload", &mut storage, false)?;
        s.device().write(host, buffer)?;
    }
    Ok(storage)
}

/// Checks that every device value of an op (`ordinals`: `None` for host values) is on the GPU
/// of `k`, then opens it: a value on another device is `DeviceMismatch` naming the op, before
/// any device work.
pub(crate) fn staged_for(
    k: &CudaKernels,
    op: &'static str,
    ordinals: impl IntoIterator<Item = Option<usize>>,
) -> Result<Arc<Staged>> {
    if let Some(other) = ordinals.into_iter().flatten().find(|&o| o != k.ordinal) {
        return Err(mismatch(op, k.ordinal, format!("cuda:{other}")));
    }
    staged(k)
}

fn mismatch(op: &'static str, ordinal: usize, got: String) -> Error {
    Error::DeviceMismatch {
        op,
        expected: format!("cuda:{ordinal}"),
        got,
    }
}

/// An op's input on its device: leased and uploaded (host values), or the tensor's own buffer.
pub(crate) enum Input<'a> {
    Staged(Lease<'a, f32>),
    Resident(&'a DeviceBuffer<f32>),
}

impl Deref for Input<'_> {
    type Target = DeviceBuffer<f32>;
    fn deref(&self) -> &DeviceBuffer<f32> {
        match self {
            Input::Staged(lease) => lease,
            Input::Resident(buffer) => buffer,
        }
    }
}

/// An op's output on its device: a leased buffer downloaded into the caller's host memory by
/// [`Output::finish`], or the tensor's own buffer, written in place.
#[must_use = "a staged output reaches the caller's host memory only through `finish`"]
pub(crate) enum Output<'a> {
    Staged { lease: Lease<'a, f32>, host: &'a mut [f32] },
    Resident(&'a mut DeviceBuffer<f32>),
}

impl Deref for Output<'_> {
    type Target = DeviceBuffer<f32>;
    fn deref(&self) -> &DeviceBuffer<f32> {
        match self {
            Output::Staged { lease, .. } => lease,
            Output::Resident(buffer) => buffer,
        }
    }
}

impl DerefMut for Output<'_> {
    fn deref_mut(&mut self) -> &mut DeviceBuffer<f32> {
        match self {
            Output::Staged { lease, .. } => lease,
            Output::Resident(buffer) => buffer,
        }
    }
}

impl Output<'_> {
    /// Brings a staged result to the host (waits for the stream); a resident one is already
    /// in place.
    pub(crate) fn finish(self, s: &Staged) -> Result<()> {
        match self {
            Output::Staged { lease, host } => s.down(&lease, host),
            Output::Resident(_) => Ok(()),
        }
    }
}

impl Staged {
    /// `values` on this device: uploaded from the host, or read in place.
    pub(crate) fn input<'a>(&'a self, op: &'static str, values: Values<'a>) -> Result<Input<'a>> {
        match values {
            Values::Host(host) => Ok(Input::Staged(self.up(host)?)),
            Values::Device(storage) => Ok(Input::Resident(self.own(op, storage.array())?)),
        }
    }

    /// An output whose every value the kernel writes: a scratch lease for host memory, the
    /// tensor's own buffer (copied first if shared) for device values.
    pub(crate) fn output<'a>(&'a self, op: &'static str, values: ValuesMut<'a>) -> Result<Output<'a>> {
        match values {
            ValuesMut::Host(host) => Ok(Output::Staged {
                lease: self.scratch(host.len())?,
                host,
            }),
            ValuesMut::Device(storage) => self.own_mut(op, storage, false).map(Output::Resident),
        }
    }

    /// In-place state or a `+=` accumulator: as [`Self::output`], host values uploaded first.
    pub(crate) fn in_place<'a>(&'a self, op: &'static str, values: ValuesMut<'a>) -> Result<Output<'a>> {
        match values {
            ValuesMut::Host(host) => Ok(Output::Staged {
                lease: self.up(host)?,
                host,
            }),
            ValuesMut::Device(storage) => self.own_mut(op, storage, true).map(Output::Resident),
        }
    }

    /// `len` values made on this device for a tensor (booked as activations); the kernel that
    /// takes it as an output writes every value.
    pub(crate) fn new_values(self: &Arc<Self>, ordinal: usize, len: usize) -> Result<CudaStorage> {
        Ok(CudaStorage::new(Box::new(self.array(
            ordinal,
            len,
            MemoryCategory::Activations,
        )?)))
    }

    /// A new array of `len` values on this device (zeros), booked under `category`.
    fn array(self: &Arc<Self>, ordinal: usize, len: usize, category: MemoryCategory) -> Result<CudaValues> {
        Ok(CudaValues {
            staged: self.clone(),
            ordinal,
            category,
            buffer: self.device().alloc_zeros::<f32>(len, category)?,
            lent: false,
        })
    }

    /// The buffer of an array this device made, or `DeviceMismatch` naming `op`.
    pub(super) fn own<'a>(&self, op: &'static str, array: &'a dyn DeviceArray) -> Result<&'a DeviceBuffer<f32>> {
        let ordinal = array.ordinal();
        match array.as_any().downcast_ref::<CudaValues>() {
            Some(values) if std::ptr::eq(Arc::as_ptr(&values.staged), self) => Ok(&values.buffer),
            _ => Err(mismatch(
                op,
                ordinal,
                format!("values not made by cuda:{ordinal}'s backend"),
            )),
        }
    }

    /// The buffer of an array this device made, to write: a shared one is first copied (`keep`:
    /// in-place state) or replaced by a new one (an output, whose old values nobody reads).
    pub(super) fn own_mut<'a>(
        &self,
        op: &'static str,
        storage: &'a mut CudaStorage,
        keep: bool,
    ) -> Result<&'a mut DeviceBuffer<f32>> {
        let ordinal = storage.ordinal();
        // Checked before the copy on write, so a foreign array is never duplicated.
        self.own(op, storage.array())?;
        let array = storage.unique_mut(keep)?;
        match array.as_any_mut().downcast_mut::<CudaValues>() {
            Some(values) => Ok(&mut values.buffer),
            None => Err(mismatch(op, ordinal, "values of another backend".to_string())),
        }
    }
}
