//! Values that may live on a GPU: the device array a tensor holds there ([`DeviceArray`],
//! opaque here so tensors depend on no backend, as [`super::DeviceMirror`]), and the op
//! arguments that name either host or device values ([`Values`], [`ValuesMut`]).
//!
//! A device array holds f32 values rounded to the compute dtype, the same values the host
//! arm of a tensor holds, so every op contract and CPU twin reads them unchanged after a
//! download (`docs/cuda-backend.md`, Device-resident tensors).

use std::any::Any;
use std::borrow::Cow;
use std::fmt::Debug;
use std::sync::Arc;

use crate::error::{Error, Result};

/// f32 values in a GPU's memory, kept by that GPU's backend (`dispatch::cuda_ops`).
pub(crate) trait DeviceArray: Debug + Send + Sync {
    /// The GPU holding the values.
    fn ordinal(&self) -> usize;
    /// Number of values.
    fn len(&self) -> usize;
    /// Copies every value into `out` (of [`Self::len`] values), after the work that writes them.
    fn read(&self, out: &mut [f32]) -> Result<()>;
    /// A new array on the same GPU holding the same values (copy on write of shared values).
    fn duplicate(&self) -> Result<Box<dyn DeviceArray>>;
    /// A new array on the same GPU of the same length, contents unspecified (a shared output
    /// about to be overwritten).
    fn blank(&self) -> Result<Box<dyn DeviceArray>>;
    /// Sets every value to zero, in place (a gradient cleared between steps).
    fn zero(&mut self) -> Result<()>;
    /// Overwrites every value with `host` (of [`Self::len`] values), in place (an upload).
    fn write(&mut self, host: &[f32]) -> Result<()>;
    /// The backend's own type, to reach its buffer.
    fn as_any(&self) -> &dyn Any;
    /// The backend's own type, to write its buffer.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// For a parameter's range of an optimizer arena ([`ArenaLender`]): the arena's allocation
    /// (an address, to compare) and the range's first element there. `None` for an array of its
    /// own.
    fn arena_view(&self) -> Option<(usize, usize)> {
        None
    }
}

/// A parameter's range of one of its optimizer's arenas on a GPU, lent as the parameter's
/// device values or gradient, so that the two are one copy: the optimizer updates it in place
/// and copies nothing (`docs/cuda-backend.md`, Optimizer state on the device). It holds the
/// arena weakly: a lender of arenas that are gone lends nothing.
pub(crate) trait ArenaLender: Debug + Send + Sync {
    /// The GPU holding the arena.
    fn ordinal(&self) -> usize;
    /// Values in the range.
    fn len(&self) -> usize;
    /// The range as device values, or `None` once the arena is gone.
    fn lend(&self) -> Result<Option<CudaStorage>>;
}

/// A tensor's values on a GPU. Clones share the array (as host tensors would copy it); the
/// first write to a shared array copies it on the device first ([`Self::unique_mut`]).
///
/// A range of an optimizer arena ([`ArenaLender`]) is never shared: the optimizer writes it in
/// place, so a clone would see a later step's values. Its clones are copies on the device.
#[derive(Debug)]
pub(crate) struct CudaStorage {
    array: Arc<dyn DeviceArray>,
}

impl Clone for CudaStorage {
    /// The same array; for an arena's range, a copy on the device ([`CudaStorage::try_clone`]
    /// says when the GPU has no room for it).
    ///
    /// # Panics
    /// If that copy fails (the GPU has no room for it), as a host allocation that fails aborts.
    fn clone(&self) -> Self {
        self.try_clone().unwrap_or_else(|e| {
            panic!(
                "a copy of {} values of an optimizer arena on cuda:{} failed: {e}",
                self.len(),
                self.ordinal()
            )
        })
    }
}

impl PartialEq for CudaStorage {
    /// The same array. Values on a device are compared by downloading them (`Tensor::to_host`).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.array, &other.array)
    }
}

impl CudaStorage {
    pub(crate) fn new(array: Box<dyn DeviceArray>) -> Self {
        CudaStorage { array: array.into() }
    }

    /// The GPU holding the values.
    pub(crate) fn ordinal(&self) -> usize {
        self.array.ordinal()
    }

    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        self.array.len()
    }

    /// A clone: the same array, or for an arena's range a copy on the device, which can fail
    /// (out of memory) where [`Clone::clone`] would panic.
    pub(crate) fn try_clone(&self) -> Result<Self> {
        match self.array.arena_view() {
            None => Ok(CudaStorage {
                array: self.array.clone(),
            }),
            Some(_) => self.array.duplicate().map(CudaStorage::new),
        }
    }

    /// The backend's array.
    pub(crate) fn array(&self) -> &dyn DeviceArray {
        &*self.array
    }

    /// For a range of an optimizer arena: the arena's allocation and the first element there
    /// ([`DeviceArray::arena_view`]).
    pub(crate) fn arena_view(&self) -> Option<(usize, usize)> {
        self.array.arena_view()
    }

    /// The backend's array to write: this storage's own, or, if a clone shares it (the clone
    /// keeps the old values), a copy made on the device (`keep`) or a new array whose contents
    /// are unspecified (an output about to be overwritten).
    pub(crate) fn unique_mut(&mut self, keep: bool) -> Result<&mut dyn DeviceArray> {
        if Arc::get_mut(&mut self.array).is_none() {
            let fresh = match keep {
                true => self.array.duplicate()?,
                false => self.array.blank()?,
            };
            self.array = fresh.into();
        }
        Ok(Arc::get_mut(&mut self.array).expect("a fresh or unshared array has one owner"))
    }

    /// Sets every value to zero: in place, or in a new array if a clone shares this one (the
    /// clone keeps its values).
    pub(crate) fn zero(&mut self) -> Result<()> {
        self.unique_mut(false)?.zero()
    }

    /// Overwrites the values with `host` (of the same length): in place, or in a new array if
    /// a clone shares this one (the clone keeps its values).
    pub(crate) fn overwrite(&mut self, host: &[f32]) -> Result<()> {
        if host.len() != self.len() {
            return Err(crate::error::Error::LengthMismatch {
                what: "host values into device values",
                src: host.len(),
                dst: self.len(),
            });
        }
        self.unique_mut(false)?.write(host)
    }

    /// The values, downloaded.
    pub(crate) fn to_vec(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.len()];
        self.array.read(&mut out)?;
        Ok(out)
    }
}

/// A small result an op left on its GPU (a cast's amax, its statistics' counts), kept there
/// until the host reads it: a per-op read waits for the stream, so results that only the
/// device or the end of the step needs are never read per op (`docs/cuda-backend.md`, Slot
/// banks on the device).
pub(crate) trait DeviceResult<T>: Debug + Send + Sync {
    /// The GPU holding it.
    fn ordinal(&self) -> usize;
    /// The result, downloaded at the first read (after the work that writes it) and kept.
    fn read(&self) -> Result<T>;
    /// The backend's own type, to reach its buffer.
    fn as_any(&self) -> &dyn Any;
}

/// A result in host memory, or left on a GPU until read ([`DeviceResult`]).
#[derive(Clone, Debug)]
pub(crate) enum Deferred<T> {
    Host(T),
    Device(Arc<dyn DeviceResult<T>>),
}

impl<T: Copy> Deferred<T> {
    /// The value: the host's, or downloaded once from the GPU.
    pub(crate) fn get(&self) -> Result<T> {
        match self {
            Deferred::Host(v) => Ok(*v),
            Deferred::Device(d) => d.read(),
        }
    }

    /// The GPU holding it, if any.
    pub(crate) fn ordinal(&self) -> Option<usize> {
        match self {
            Deferred::Host(_) => None,
            Deferred::Device(d) => Some(d.ordinal()),
        }
    }
}

impl<T> From<T> for Deferred<T> {
    fn from(value: T) -> Self {
        Deferred::Host(value)
    }
}

/// An op's input values: in host memory, or on a GPU.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Values<'a> {
    Host(&'a [f32]),
    Device(&'a CudaStorage),
}

impl<'a> From<&'a [f32]> for Values<'a> {
    fn from(values: &'a [f32]) -> Self {
        Values::Host(values)
    }
}

impl<'a> From<&'a Vec<f32>> for Values<'a> {
    fn from(values: &'a Vec<f32>) -> Self {
        Values::Host(values)
    }
}

impl<'a> Values<'a> {
    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        match self {
            Values::Host(v) => v.len(),
            Values::Device(d) => d.len(),
        }
    }

    /// The GPU holding them, if any.
    pub(crate) fn ordinal(&self) -> Option<usize> {
        match self {
            Values::Host(_) => None,
            Values::Device(d) => Some(d.ordinal()),
        }
    }

    /// The device they live on.
    pub(crate) fn device(&self) -> super::DeviceKind {
        self.ordinal().map_or(super::DeviceKind::Cpu, super::DeviceKind::Cuda)
    }

    /// The host values, or `Unsupported` naming `op` for device values (an op of the CPU
    /// backend: modules move to a device whole, so a device value there is a bug).
    pub(crate) fn host(self, op: &'static str) -> Result<&'a [f32]> {
        match self {
            Values::Host(v) => Ok(v),
            Values::Device(d) => Err(not_on_host(op, d)),
        }
    }

    /// The values in host memory: borrowed, or downloaded.
    pub(crate) fn to_host(self) -> Result<Cow<'a, [f32]>> {
        match self {
            Values::Host(v) => Ok(Cow::Borrowed(v)),
            Values::Device(d) => d.to_vec().map(Cow::Owned),
        }
    }
}

/// An op's output or in-place values: in host memory, or on a GPU.
#[derive(Debug)]
pub(crate) enum ValuesMut<'a> {
    Host(&'a mut [f32]),
    Device(&'a mut CudaStorage),
}

impl<'a> From<&'a mut [f32]> for ValuesMut<'a> {
    fn from(values: &'a mut [f32]) -> Self {
        ValuesMut::Host(values)
    }
}

impl<'a> From<&'a mut Vec<f32>> for ValuesMut<'a> {
    fn from(values: &'a mut Vec<f32>) -> Self {
        ValuesMut::Host(values)
    }
}

impl<'a> ValuesMut<'a> {
    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        match self {
            ValuesMut::Host(v) => v.len(),
            ValuesMut::Device(d) => d.len(),
        }
    }

    /// The GPU holding them, if any.
    pub(crate) fn ordinal(&self) -> Option<usize> {
        match self {
            ValuesMut::Host(_) => None,
            ValuesMut::Device(d) => Some(d.ordinal()),
        }
    }

    /// The same values, borrowed again for a shorter time.
    pub(crate) fn reborrow(&mut self) -> ValuesMut<'_> {
        match self {
            ValuesMut::Host(v) => ValuesMut::Host(v),
            ValuesMut::Device(d) => ValuesMut::Device(d),
        }
    }

    /// Read-only view.
    pub(crate) fn as_values(&self) -> Values<'_> {
        match self {
            ValuesMut::Host(v) => Values::Host(v),
            ValuesMut::Device(d) => Values::Device(d),
        }
    }

    /// The host values, or `Unsupported` naming `op` for device values ([`Values::host`]).
    pub(crate) fn host(self, op: &'static str) -> Result<&'a mut [f32]> {
        match self {
            ValuesMut::Host(v) => Ok(v),
            ValuesMut::Device(d) => Err(not_on_host(op, d)),
        }
    }
}

fn not_on_host(op: &'static str, d: &CudaStorage) -> Error {
    Error::DeviceMismatch {
        op,
        expected: "cpu".to_string(),
        got: format!("cuda:{}", d.ordinal()),
    }
}

/// A device array in host memory, for tests of the code around device values on machines
/// without a GPU: it plays a GPU's array (ordinal, copy on write, downloads) and nothing else.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct HostArray {
    pub(crate) ordinal: usize,
    pub(crate) values: Vec<f32>,
}

#[cfg(test)]
impl DeviceArray for HostArray {
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn len(&self) -> usize {
        self.values.len()
    }
    fn read(&self, out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&self.values);
        Ok(())
    }
    fn duplicate(&self) -> Result<Box<dyn DeviceArray>> {
        Ok(Box::new(HostArray {
            ordinal: self.ordinal,
            values: self.values.clone(),
        }))
    }
    fn blank(&self) -> Result<Box<dyn DeviceArray>> {
        Ok(Box::new(HostArray {
            ordinal: self.ordinal,
            values: vec![f32::NAN; self.values.len()],
        }))
    }
    fn zero(&mut self) -> Result<()> {
        self.values.fill(0.0);
        Ok(())
    }
    fn write(&mut self, host: &[f32]) -> Result<()> {
        self.values.copy_from_slice(host);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// A device result in host memory, for tests without a GPU: it counts its reads.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct HostResult<T> {
    pub(crate) ordinal: usize,
    pub(crate) value: T,
    pub(crate) reads: std::sync::atomic::AtomicUsize,
}

#[cfg(test)]
impl<T: Copy + Debug + Send + Sync + 'static> HostResult<T> {
    /// `value` as a result left on stand-in GPU `ordinal`.
    pub(crate) fn deferred(ordinal: usize, value: T) -> Deferred<T> {
        Deferred::Device(Arc::new(HostResult {
            ordinal,
            value,
            reads: 0.into(),
        }))
    }
}

#[cfg(test)]
impl<T: Copy + Debug + Send + Sync + 'static> DeviceResult<T> for HostResult<T> {
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn read(&self) -> Result<T> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(self.value)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_gpu(ordinal: usize, values: Vec<f32>) -> CudaStorage {
        CudaStorage::new(Box::new(HostArray { ordinal, values }))
    }

    fn written(storage: &mut CudaStorage, v: f32) {
        let array = storage.unique_mut(true).unwrap();
        let host = array.as_any_mut().downcast_mut::<HostArray>().unwrap();
        host.values.iter_mut().for_each(|x| *x = v);
    }

    #[test]
    fn a_deferred_result_is_the_hosts_or_read_from_its_gpu() {
        let host: Deferred<f32> = 2.5.into();
        assert_eq!((host.get().unwrap(), host.ordinal()), (2.5, None));
        let on_gpu = HostResult::deferred(3, [1u64, 2, 3, 4]);
        assert_eq!((on_gpu.get().unwrap(), on_gpu.ordinal()), ([1, 2, 3, 4], Some(3)));
    }

    #[test]
    fn a_write_to_shared_device_values_copies_them_first() {
        let mut a = on_gpu(2, vec![1.0, 2.0, 3.0]);
        let b = a.clone();
        assert_eq!(a, b, "clones share one array");
        written(&mut a, 9.0);
        assert_ne!(a, b, "the write copied the array");
        assert_eq!(a.to_vec().unwrap(), vec![9.0; 3]);
        assert_eq!(
            b.to_vec().unwrap(),
            vec![1.0, 2.0, 3.0],
            "the clone keeps the old values"
        );
        // An unshared array is written in place: no copy.
        let before = Arc::as_ptr(&a.array) as *const () as usize;
        written(&mut a, 4.0);
        assert_eq!(Arc::as_ptr(&a.array) as *const () as usize, before);
        assert_eq!(a.ordinal(), 2);
        // An output about to be overwritten is not copied: a new array, the clone untouched.
        let c = a.clone();
        let fresh = a.unique_mut(false).unwrap();
        assert!(
            fresh
                .as_any()
                .downcast_ref::<HostArray>()
                .unwrap()
                .values
                .iter()
                .all(|v| v.is_nan())
        );
        assert_eq!(c.to_vec().unwrap(), vec![4.0; 3]);
    }

    #[test]
    fn host_only_code_names_the_op_for_device_values() {
        let mut d = on_gpu(1, vec![0.5; 4]);
        let err = Values::Device(&d).host("gelu_forward").unwrap_err();
        assert_eq!(
            err,
            Error::DeviceMismatch {
                op: "gelu_forward",
                expected: "cpu".into(),
                got: "cuda:1".into()
            }
        );
        assert!(ValuesMut::Device(&mut d).host("gelu_forward").is_err());
        assert_eq!(Values::Device(&d).to_host().unwrap().as_ref(), &[0.5; 4]);
        let mut h = vec![1.0f32, 2.0];
        assert_eq!(Values::from(&h).host("x").unwrap(), &[1.0, 2.0]);
        let mut m = ValuesMut::from(&mut h);
        assert_eq!((m.len(), m.ordinal(), m.as_values().ordinal()), (2, None, None));
        m.reborrow().host("x").unwrap()[0] = 5.0;
        assert_eq!(h, vec![5.0, 2.0]);
    }
}
