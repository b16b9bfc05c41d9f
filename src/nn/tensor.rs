//! `Tensor`: a row-major f32 matrix of activations or gradients.

use crate::error::{Error, Result};

/// A `[rows, cols]` row-major activation. Values are f32, rounded to the
/// precision's compute dtype wherever a GPU would store them in that dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// `rows * cols` values, row-major.
    pub data: Vec<f32>,
    /// Rows (tokens: `batch * seq`).
    pub rows: usize,
    /// Columns (features).
    pub cols: usize,
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
        Ok(Tensor { data, rows, cols })
    }

    /// Zeros of shape `[rows, cols]`.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Tensor {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        }
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor holds no values.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Checks the tensor is consistent and has `cols` columns (and `rows` rows, if given), naming `layer`.
    pub(crate) fn expect(&self, layer: &str, what: &str, rows: Option<usize>, cols: usize) -> Result<()> {
        let consistent = self.rows.checked_mul(self.cols) == Some(self.data.len());
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
                self.data.len()
            ),
        })
    }
}

/// The error of a backward that has no forward to go with.
pub(crate) fn no_forward(layer: &str) -> Error {
    Error::LayerShape {
        layer: layer.to_string(),
        detail: "backward called without a forward before it".into(),
    }
}
