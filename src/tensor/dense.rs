//! `Tensor`: a row-major matrix of activations or gradients, with its values on a device.

use super::DeviceKind;
use crate::error::{Error, Result};

/// Where a tensor's values live.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Storage {
    /// Host memory: `rows * cols` f32 values, row-major, each exactly representable in the
    /// compute dtype wherever a GPU would store that dtype.
    Cpu(Vec<f32>),
    /// GPU memory. The CUDA ops are staged through host memory today (`docs/cuda-backend.md`),
    /// so no value of this arm is made yet.
    #[allow(dead_code)] // uninhabited: nothing constructs it before device-resident tensors
    Cuda(CudaStorage),
}

/// A device buffer of a tensor. Uninhabited until tensors live on the device (the staged CUDA
/// ops take host tensors), so code that matches on [`Storage`] is complete without a host fallback.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum CudaStorage {}

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

    /// Number of values.
    pub fn len(&self) -> usize {
        self.data().len()
    }

    /// Whether the tensor holds no values.
    pub fn is_empty(&self) -> bool {
        self.data().is_empty()
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        match &self.storage {
            Storage::Cpu(values) => values,
            Storage::Cuda(never) => match *never {},
        }
    }

    /// The values, row-major, to change in place (the shape stays).
    pub fn data_mut(&mut self) -> &mut [f32] {
        match &mut self.storage {
            Storage::Cpu(values) => values,
            Storage::Cuda(never) => match *never {},
        }
    }

    /// The values, row-major, taking the tensor apart.
    pub fn into_data(self) -> Vec<f32> {
        match self.storage {
            Storage::Cpu(values) => values,
            Storage::Cuda(never) => match never {},
        }
    }

    /// The device the values live on.
    pub fn device(&self) -> DeviceKind {
        match &self.storage {
            Storage::Cpu(_) => DeviceKind::Cpu,
            Storage::Cuda(never) => match *never {},
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
