//! `Tensor`: a row-major matrix of activations or gradients, with its values on a device.

use super::DeviceKind;
use super::device_values::{CudaStorage, Values, ValuesMut};
use crate::error::{Error, Result};

/// Where a tensor's values live.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Storage {
    /// Host memory: `rows * cols` f32 values, row-major, each exactly representable in the
    /// compute dtype wherever a GPU would store that dtype.
    Cpu(Vec<f32>),
    /// GPU memory: the same f32 values, made by the CUDA backend's ops (`docs/cuda-backend.md`,
    /// Device-resident tensors).
    Cuda(CudaStorage),
}

/// A `[rows, cols]` row-major activation. Values are f32, rounded to the
/// precision's compute dtype wherever a GPU would store them in that dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    storage: Storage,
    /// Rows (tokens: `batch * seq`).
    rows: usize,
    /// Columns (features).
    cols: usize,
}

impl Tensor {
    /// A tensor of `data` with shape `[rows, cols]`; an error if the length does not match.
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> Result<Self> {
        let expected = rows.saturating_mul(cols);
        if data.len() != expected {
            return Err(Error::ShapeMismatch {
                what: "Tensor",
                rows,
                cols,
                expected,
                got: data.len(),
            });
        }
        Ok(Tensor {
            storage: Storage::Cpu(data),
            rows,
            cols,
        })
    }

    /// Zeros of shape `[rows, cols]`.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Tensor {
            storage: Storage::Cpu(vec![0.0; rows * cols]),
            rows,
            cols,
        }
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Rows (tokens: `batch * seq`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// A tensor of `[rows, cols]` values on a GPU; an error if the length does not match.
    pub(crate) fn on_device(values: CudaStorage, rows: usize, cols: usize) -> Result<Self> {
        let expected = rows.saturating_mul(cols);
        if values.len() != expected {
            return Err(Error::ShapeMismatch {
                what: "Tensor on a GPU",
                rows,
                cols,
                expected,
                got: values.len(),
            });
        }
        Ok(Tensor {
            storage: Storage::Cuda(values),
            rows,
            cols,
        })
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::Cpu(values) => values.len(),
            Storage::Cuda(values) => values.len(),
        }
    }

    /// Whether the tensor holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values, row-major.
    ///
    /// # Panics
    /// If the values live on a GPU. Only the crate's own modules hold such tensors, between
    /// their ops, and bring them back at their boundaries; [`Tensor::to_host`] is the way back.
    pub fn data(&self) -> &[f32] {
        match &self.storage {
            Storage::Cpu(values) => values,
            Storage::Cuda(values) => on_gpu(values),
        }
    }

    /// The values, row-major, to change in place (the shape stays).
    ///
    /// # Panics
    /// If the values live on a GPU, as [`Tensor::data`].
    pub fn data_mut(&mut self) -> &mut [f32] {
        match &mut self.storage {
            Storage::Cpu(values) => values,
            Storage::Cuda(values) => on_gpu(values),
        }
    }

    /// The values, row-major, taking the tensor apart.
    ///
    /// # Panics
    /// If the values live on a GPU, as [`Tensor::data`].
    pub fn into_data(self) -> Vec<f32> {
        match self.storage {
            Storage::Cpu(values) => values,
            Storage::Cuda(values) => on_gpu(&values),
        }
    }

    /// The same values in host memory: a copy of a host tensor, a download of a GPU one.
    pub fn to_host(&self) -> Result<Tensor> {
        let values = match &self.storage {
            Storage::Cpu(values) => values.clone(),
            Storage::Cuda(values) => values.to_vec()?,
        };
        Tensor::new(values, self.rows, self.cols)
    }

    /// This tensor in host memory (a GPU one downloaded, a host one as it is).
    pub fn into_host(self) -> Result<Tensor> {
        match self.storage {
            Storage::Cpu(_) => Ok(self),
            Storage::Cuda(_) => self.to_host(),
        }
    }

    /// A clone that says when a GPU has no room for it: device values are shared, or copied on
    /// the device where they are an optimizer arena's range (`CudaStorage::try_clone`).
    pub(crate) fn try_clone(&self) -> Result<Tensor> {
        let storage = match &self.storage {
            Storage::Cpu(values) => Storage::Cpu(values.clone()),
            Storage::Cuda(values) => Storage::Cuda(values.try_clone()?),
        };
        Ok(Tensor {
            storage,
            rows: self.rows,
            cols: self.cols,
        })
    }

    /// A copy to keep for backward: host values copied into a recycled buffer, device values
    /// shared (copied on the device only if a later op writes one of the two in place).
    pub(crate) fn kept_copy(&self) -> Tensor {
        let storage = match &self.storage {
            Storage::Cpu(values) => Storage::Cpu(super::scratch::copy_of(values)),
            Storage::Cuda(values) => Storage::Cuda(values.clone()),
        };
        Tensor {
            storage,
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// Gives host values back to the scratch pool (device values are freed when the last
    /// tensor sharing them goes).
    pub(crate) fn recycle(self) {
        if let Storage::Cpu(values) = self.storage {
            super::scratch::recycle(values);
        }
    }

    /// The values as an op argument, wherever they live.
    pub(crate) fn values(&self) -> Values<'_> {
        match &self.storage {
            Storage::Cpu(values) => Values::Host(values),
            Storage::Cuda(values) => Values::Device(values),
        }
    }

    /// The values as an op's output or in-place argument, wherever they live.
    pub(crate) fn values_mut(&mut self) -> ValuesMut<'_> {
        match &mut self.storage {
            Storage::Cpu(values) => ValuesMut::Host(values),
            Storage::Cuda(values) => ValuesMut::Device(values),
        }
    }

    /// The device the values live on.
    pub fn device(&self) -> DeviceKind {
        match &self.storage {
            Storage::Cpu(_) => DeviceKind::Cpu,
            Storage::Cuda(values) => DeviceKind::Cuda(values.ordinal()),
        }
    }

    /// Checks the tensor is consistent and has `cols` columns (and `rows` rows, if given), naming `layer`.
    pub(crate) fn expect(&self, layer: &str, what: &str, rows: Option<usize>, cols: usize) -> Result<()> {
        let consistent = self.rows.checked_mul(self.cols) == Some(self.len());
        let rows_ok = rows.is_none_or(|r| r == self.rows);
        if consistent && rows_ok && self.cols == cols {
            return Ok(());
        }
        let want_rows = rows.map_or("*".to_string(), |r| r.to_string());
        Err(Error::LayerShape {
            layer: layer.to_string(),
            detail: format!(
                "{what} is {}x{} ({} values), the layer expects {want_rows}x{cols}",
                self.rows,
                self.cols,
                self.len()
            ),
        })
    }
}

/// The panic of host-only accessors on GPU values (see [`Tensor::data`]).
#[cold]
fn on_gpu(values: &CudaStorage) -> ! {
    panic!(
        "tensor values live on cuda:{}: bring them to the host with Tensor::to_host first",
        values.ordinal()
    )
}
