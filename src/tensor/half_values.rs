//! `HalfValues`: a frozen parameter's values held at 2 bytes each (bf16 or fp16), as the
//! checkpoint stored them. Every bf16 and fp16 value widens to f32 exactly, so a reader that
//! widens them gets the bits an f32 copy of the same checkpoint would have held.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::Dtype;
use crate::error::{Error, Result};

/// Values in bf16 or fp16, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum HalfValues {
    /// bfloat16 values.
    Bf16(Vec<bf16>),
    /// IEEE half values.
    F16(Vec<f16>),
}

impl HalfValues {
    /// `values` in `dtype` (bf16 or f16), each of which must be exactly representable there (a
    /// value that would round is an error naming `name` and the value: narrowing must not change
    /// a number).
    pub fn exact(name: &str, dtype: Dtype, values: &[f32]) -> Result<Self> {
        let narrowed = match dtype {
            Dtype::Bf16 => HalfValues::Bf16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            Dtype::F16 => HalfValues::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            Dtype::F32 => {
                return Err(Error::InvalidTensor {
                    name: name.to_string(),
                    reason: "f32 is not a 16-bit storage dtype".into(),
                });
            }
        };
        let inexact = values
            .iter()
            .enumerate()
            .find(|&(i, &x)| narrowed.get(i).to_bits() != x.to_bits() && !(x.is_nan() && narrowed.get(i).is_nan()));
        if let Some((index, &value)) = inexact {
            return Err(Error::InvalidTensor {
                name: name.to_string(),
                reason: format!(
                    "value {value:e} at {index} is not exactly a {dtype} value (it would round to {:e}); \
                     hold it in f32",
                    narrowed.get(index)
                ),
            });
        }
        Ok(narrowed)
    }

    /// The storage dtype (bf16 or f16).
    pub fn dtype(&self) -> Dtype {
        match self {
            HalfValues::Bf16(_) => Dtype::Bf16,
            HalfValues::F16(_) => Dtype::F16,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            HalfValues::Bf16(v) => v.len(),
            HalfValues::F16(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held (2 a value).
    pub fn bytes(&self) -> usize {
        2 * self.len()
    }

    /// Value `i` widened to f32 (exact).
    fn get(&self, i: usize) -> f32 {
        match self {
            HalfValues::Bf16(v) => v[i].to_f32(),
            HalfValues::F16(v) => v[i].to_f32(),
        }
    }

    /// Values `start..start + out.len()` widened into `out` (exact); the range must be in bounds.
    pub fn widen_into(&self, start: usize, out: &mut [f32]) -> Result<()> {
        let end = start.checked_add(out.len()).filter(|&e| e <= self.len());
        let Some(end) = end else {
            return Err(Error::LengthMismatch {
                what: "widened range of 16-bit values",
                src: self.len(),
                dst: start.saturating_add(out.len()),
            });
        };
        match self {
            HalfValues::Bf16(v) => v[start..end].convert_to_f32_slice(out),
            HalfValues::F16(v) => v[start..end].convert_to_f32_slice(out),
        }
        Ok(())
    }

    /// Every value widened to f32 (exact).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            HalfValues::Bf16(v) => v.to_f32_vec(),
            HalfValues::F16(v) => v.to_f32_vec(),
        }
    }

    /// The rows `ids` of these `[vocab, dim]` values, each distinct row widened once (exact):
    /// returns `ids` renumbered into that small table and the table `[distinct, dim]`, for a
    /// lookup that touches only those rows. An id past the last row is an error, as the lookup
    /// op reports it.
    pub(crate) fn widen_rows(&self, ids: &[u32], dim: usize) -> Result<(Vec<u32>, Vec<f32>)> {
        let vocab = self.len().checked_div(dim).unwrap_or(0);
        let mut slot_of = std::collections::HashMap::new();
        let mut local = Vec::with_capacity(ids.len());
        let mut table = Vec::new();
        for (position, &id) in ids.iter().enumerate() {
            if id as usize >= vocab {
                return Err(Error::IndexOutOfRange {
                    what: "token id",
                    index: id.into(),
                    position,
                    len: vocab,
                });
            }
            let next = slot_of.len() as u32;
            let slot = *slot_of.entry(id).or_insert(next);
            if slot == next {
                let start = table.len();
                table.resize(start + dim, 0.0);
                self.widen_into(id as usize * dim, &mut table[start..])?;
            }
            local.push(slot);
        }
        Ok((local, table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_values_narrow_and_widen_back_to_the_same_bits() {
        let values = [1.0f32, -0.5, 3.140625, 0.0, -0.0, 65504.0, f32::INFINITY];
        for dtype in [Dtype::Bf16, Dtype::F16] {
            let values: Vec<f32> = values.iter().map(|&x| dtype.round(x)).collect();
            let half = HalfValues::exact("t", dtype, &values).unwrap();
            assert_eq!(half.dtype(), dtype);
            assert_eq!(half.bytes(), 2 * values.len());
            let back = half.to_f32();
            assert!(back.iter().zip(&values).all(|(a, b)| a.to_bits() == b.to_bits()));
            let mut row = [0.0f32; 3];
            half.widen_into(2, &mut row).unwrap();
            assert_eq!(
                row.map(f32::to_bits),
                [values[2], values[3], values[4]].map(f32::to_bits)
            );
            assert!(half.widen_into(5, &mut row).is_err());
        }
    }

    #[test]
    fn looked_up_rows_are_widened_once_each_and_renumbered() {
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        let half = HalfValues::exact("t", Dtype::Bf16, &values).unwrap();
        let (local, table) = half.widen_rows(&[2, 0, 2, 3], 3).unwrap();
        assert_eq!(local, [0, 1, 0, 2]);
        assert_eq!(table, [3.0, 3.5, 4.0, 0.0, 0.5, 1.0, 4.5, 5.0, 5.5]);
        let err = half.widen_rows(&[1, 4], 3).unwrap_err().to_string();
        assert!(err.contains('4'), "{err}");
    }

    #[test]
    fn a_value_that_would_round_is_an_error_naming_it() {
        // 1 + 2^-10 is an f16 value but not a bf16 one (7 mantissa bits).
        let values = [1.0f32, 1.0 + 1.0 / 1024.0];
        assert!(HalfValues::exact("w", Dtype::F16, &values).is_ok());
        let err = HalfValues::exact("w", Dtype::Bf16, &values).unwrap_err().to_string();
        assert!(
            err.contains("w") && err.contains("at 1") && err.contains("bf16"),
            "{err}"
        );
        // 1e6 is beyond fp16's range: it would become infinity.
        assert!(HalfValues::exact("w", Dtype::F16, &[1.0e6]).is_err());
        assert!(HalfValues::exact("w", Dtype::F32, &values).is_err());
    }
}
