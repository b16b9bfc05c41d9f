//! Tensors: the dense [`Tensor`] of activations and gradients (with its
//! [`Dtype`] and the device its values live on), and the quantized tensor:
//! FP8 codes, their format, shape and scales, and optionally the transposed
//! (column-wise) copy that backward GEMMs need.
//!
//! Every copy is a row-major matrix quantized along its rows. The column-wise
//! copy of an `[M, K]` tensor is an `[K, M]` matrix: the row-wise quantization
//! of `X^T`, so a TN GEMM can read the reduction dimension contiguously on both
//! sides. Its scales follow from that: per-tensor the same scale_inv, 1x128
//! `[K, ceil(M/128)]`, 128x128 the transposed tile grid `[ceil(K/128), ceil(M/128)]`,
//! MXFP8 `[K, ceil(M/32)]`.

mod dense;
pub mod dequantize;
mod device_kind;
pub(crate) mod device_values;
mod dtype;
mod half_values;
mod scales;
pub(crate) mod scratch;

pub use dense::Tensor;
pub use device_kind::DeviceKind;
pub use dtype::Dtype;
pub(crate) use dtype::{bf16_from_f32_slice, bf16_of};
pub use half_values::HalfValues;
pub use scales::{MXFP8_BLOCK, ScaleKind, Scales};

use std::any::Any;
use std::sync::{Arc, OnceLock};

use crate::convert::HighPrecision;
use crate::error::{Error, Result};
use crate::format::Fp8Format;

/// Where FP8 codes live.
#[derive(Clone, Debug)]
enum CodeStorage {
    /// Host memory: `rows * cols` codes, row-major.
    Cpu(Vec<u8>),
    /// Only in the matrix's [`DeviceMirror`] (a device cast whose host copy nothing has read
    /// yet): read back at the first host read, then kept.
    Cuda(OnceLock<Vec<u8>>),
}

/// Reads a mirror's stored values back into host memory as a `Vec` of their element type
/// (`Vec<u8>` of FP8 codes, `Vec<bf16>`, `Vec<f16>`), boxed: the backend that made it knows how.
pub(crate) type ReadBack = fn(&DeviceMirror) -> Result<Box<dyn Any>>;

/// Reads a mirror's FP8 scales back into host memory (a device cast whose host scales nothing
/// has read yet).
pub(crate) type ReadScales = fn(&DeviceMirror) -> Result<Scales>;

/// A device copy of a quantized matrix's codes and scales, kept by the device op that wrote them
/// (the staged CUDA casts), so a GEMM on the same GPU reads it instead of uploading the host copy.
/// The payload is the backend's own type (`backend::cuda::gemm::Fp8Mirror`), opaque here so that
/// tensors do not depend on a backend. Codes and scales of a [`QuantizedMatrix`] never change
/// after it is made, so the copy cannot go stale.
pub struct DeviceMirror {
    /// The GPU holding it.
    pub(crate) ordinal: usize,
    /// What that GPU's backend stored.
    pub(crate) payload: Box<dyn Any + Send + Sync>,
    /// How to read the stored values back (`None`: the mirror is only ever read on the device,
    /// its owner keeps a host copy).
    pub(crate) read_back: Option<ReadBack>,
    /// How to read an FP8 mirror's scales back (`None`: its matrix keeps host scales).
    pub(crate) read_scales: Option<ReadScales>,
}

impl DeviceMirror {
    /// The stored values read back from the GPU as a `Vec<T>` (`T` the element type stored).
    pub(crate) fn read_values<T: 'static>(&self) -> Result<Vec<T>> {
        let unsupported = |op| Error::Unsupported {
            op,
            device: format!("cuda:{}", self.ordinal),
        };
        let read = self.read_back.ok_or(unsupported("reading a device mirror back"))?;
        match read(self)?.downcast::<Vec<T>>() {
            Ok(values) => Ok(*values),
            Err(_) => Err(unsupported("reading a device mirror back as another element type")),
        }
    }
}

impl std::fmt::Debug for DeviceMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceMirror(cuda:{})", self.ordinal)
    }
}

impl PartialEq for DeviceMirror {
    /// A mirror holds the same values as its matrix: whether one exists is never part of equality.
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

/// Where a matrix's scales live.
#[derive(Clone, Debug)]
enum ScaleStorage {
    /// Host memory.
    Cpu(Scales),
    /// Only in the matrix's [`DeviceMirror`], in this layout (a device cast's scales: current
    /// scaling's `scale_inv` made there, block scales): read back at the first host read, then
    /// kept. The GEMMs read the mirror's, so a pass never waits for them.
    Cuda(ScaleKind, OnceLock<Scales>),
}

/// One orientation of a quantized tensor: `rows x cols` FP8 codes, row-major, with their scales.
#[derive(Clone, Debug)]
pub struct QuantizedMatrix {
    data: CodeStorage,
    rows: usize,
    cols: usize,
    scales: ScaleStorage,
    /// The same codes and scales on a GPU, where a device op made them (shared by clones).
    mirror: Option<Arc<DeviceMirror>>,
}

impl PartialEq for QuantizedMatrix {
    /// Codes, shape and scales; a device mirror of them is a cache and is not compared.
    fn eq(&self, other: &Self) -> bool {
        (self.data(), self.rows, self.cols, self.scales()) == (other.data(), other.rows, other.cols, other.scales())
    }
}

impl QuantizedMatrix {
    /// Checks that `data` holds `rows * cols` codes and `scales` the layout's count.
    pub fn new(data: Vec<u8>, rows: usize, cols: usize, scales: Scales) -> Result<Self> {
        let expected = rows.checked_mul(cols).ok_or(Error::ShapeMismatch {
            what: "quantized data",
            rows,
            cols,
            expected: usize::MAX,
            got: data.len(),
        })?;
        if data.len() != expected {
            return Err(Error::ShapeMismatch {
                what: "quantized data",
                rows,
                cols,
                expected,
                got: data.len(),
            });
        }
        check_scales("scales", scales.kind(), &scales, rows, cols)?;
        Ok(QuantizedMatrix {
            data: CodeStorage::Cpu(data),
            rows,
            cols,
            scales: ScaleStorage::Cpu(scales),
            mirror: None,
        })
    }

    /// A matrix whose codes live only in `mirror` (with the scales), a device cast's copy that
    /// only its GEMMs may ever read: no download unless something on the host reads the codes
    /// ([`Self::data`]). `scales` are the host copy of the mirror's; `mirror` must read back.
    pub(crate) fn held_on_device(rows: usize, cols: usize, scales: Scales, mirror: DeviceMirror) -> Result<Self> {
        check_scales("scales of device codes", scales.kind(), &scales, rows, cols)?;
        Self::held(rows, cols, ScaleStorage::Cpu(scales), mirror)
    }

    /// [`Self::held_on_device`] with the scales, in layout `kind`, in the mirror too: read back
    /// at the first host read of them ([`Self::scales`]); `mirror` must read them back.
    pub(crate) fn held_with_device_scales(
        rows: usize,
        cols: usize,
        kind: ScaleKind,
        mirror: DeviceMirror,
    ) -> Result<Self> {
        if mirror.read_scales.is_none() {
            return Err(Error::Unsupported {
                op: "scales held on a device without a way back",
                device: format!("cuda:{}", mirror.ordinal),
            });
        }
        Self::held(rows, cols, ScaleStorage::Cuda(kind, OnceLock::new()), mirror)
    }

    fn held(rows: usize, cols: usize, scales: ScaleStorage, mirror: DeviceMirror) -> Result<Self> {
        if mirror.read_back.is_none() {
            return Err(Error::Unsupported {
                op: "codes held on a device without a way back",
                device: format!("cuda:{}", mirror.ordinal),
            });
        }
        if rows.checked_mul(cols).is_none() {
            return Err(Error::ShapeMismatch {
                what: "device codes",
                rows,
                cols,
                expected: usize::MAX,
                got: usize::MAX,
            });
        }
        Ok(QuantizedMatrix {
            data: CodeStorage::Cuda(OnceLock::new()),
            rows,
            cols,
            scales,
            mirror: Some(Arc::new(mirror)),
        })
    }

    /// Whether the codes are in host memory (a matrix held on a device reads them back at the
    /// first [`Self::data`]).
    pub fn codes_on_host(&self) -> bool {
        match &self.data {
            CodeStorage::Cpu(_) => true,
            CodeStorage::Cuda(host) => host.get().is_some(),
        }
    }

    /// Number of codes, `rows * cols` (wherever they live).
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether the matrix holds no codes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This matrix with `mirror`, a device copy of exactly its codes and scales (codes held
    /// only in an old mirror come home first, as [`Self::set_mirror`]).
    pub(crate) fn with_mirror(mut self, mirror: DeviceMirror) -> Self {
        self.set_mirror(Some(Arc::new(mirror)));
        self
    }

    /// The device copy of the codes and scales, if a device op made one.
    pub(crate) fn mirror(&self) -> Option<&Arc<DeviceMirror>> {
        self.mirror.as_ref()
    }

    /// Sets (`Some`) or drops (`None`) the device copy of exactly these codes and scales; its
    /// device memory is freed with the last matrix that shares it.
    pub(crate) fn set_mirror(&mut self, mirror: Option<Arc<DeviceMirror>>) {
        // Codes and scales held only in the old mirror come home first.
        if let CodeStorage::Cuda(_) = self.data {
            self.data = CodeStorage::Cpu(self.data().to_vec());
        }
        if let ScaleStorage::Cuda(..) = self.scales {
            self.scales = ScaleStorage::Cpu(self.scales().clone());
        }
        self.mirror = mirror;
    }

    /// Bytes held: one per code plus the scales (4 per f32 scale, 1 per E8M0 exponent).
    pub fn bytes(&self) -> usize {
        let kind = self.scale_kind();
        let (scale_rows, scale_cols) = kind.scale_shape(self.rows, self.cols);
        let per_scale = match kind {
            ScaleKind::Mxfp8 => 1,
            _ => 4,
        };
        self.len() + per_scale * scale_rows * scale_cols
    }

    /// The FP8 codes, row-major. Codes held on a GPU are read back the first time.
    ///
    /// # Panics
    /// If that read fails (the GPU is gone): the accessor hands out a slice.
    pub fn data(&self) -> &[u8] {
        match &self.data {
            CodeStorage::Cpu(codes) => codes,
            CodeStorage::Cuda(host) => host.get_or_init(|| {
                let mirror = self.mirror.as_ref().expect("codes held on a device have their mirror");
                match mirror.read_values::<u8>() {
                    Ok(codes) if codes.len() == self.len() => codes,
                    Ok(codes) => panic!(
                        "{} FP8 codes came back for a {}x{} matrix",
                        codes.len(),
                        self.rows,
                        self.cols
                    ),
                    Err(e) => panic!("FP8 codes could not come back from their GPU: {e}"),
                }
            }),
        }
    }

    /// Rows of this copy.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of this copy (the dimension the blocks run along).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The scales in their compact layout. Scales held on a GPU are read back the first time.
    ///
    /// # Panics
    /// If that read fails (the GPU is gone), as [`Self::data`].
    pub fn scales(&self) -> &Scales {
        self.try_scales()
            .unwrap_or_else(|e| panic!("FP8 scales could not come back from their GPU: {e}"))
    }

    /// [`Self::scales`], with a failed read of scales held on a GPU as an error.
    pub(crate) fn try_scales(&self) -> Result<&Scales> {
        let (kind, host) = match &self.scales {
            ScaleStorage::Cpu(scales) => return Ok(scales),
            ScaleStorage::Cuda(kind, host) => (*kind, host),
        };
        if let Some(scales) = host.get() {
            return Ok(scales);
        }
        let mirror = self.mirror.as_ref().expect("scales held on a device have their mirror");
        let read = mirror.read_scales.expect("checked when the matrix was made");
        let scales = read(mirror)?;
        check_scales("scales read back from a device", kind, &scales, self.rows, self.cols)?;
        Ok(host.get_or_init(|| scales))
    }

    /// How the copy is scaled (never reads scales held on a GPU).
    pub fn scale_kind(&self) -> ScaleKind {
        match &self.scales {
            ScaleStorage::Cpu(scales) => scales.kind(),
            ScaleStorage::Cuda(kind, _) => *kind,
        }
    }

    /// Whether the scales are in host memory (scales held on a GPU are read back at the first
    /// [`Self::scales`]).
    pub fn scales_on_host(&self) -> bool {
        match &self.scales {
            ScaleStorage::Cpu(_) => true,
            ScaleStorage::Cuda(_, host) => host.get().is_some(),
        }
    }

    /// Takes the codes and scales apart.
    pub fn into_parts(self) -> (Vec<u8>, Scales) {
        let scales = self.scales().clone();
        if let CodeStorage::Cuda(_) = self.data {
            self.data();
        }
        match self.data {
            CodeStorage::Cpu(codes) => (codes, scales),
            CodeStorage::Cuda(host) => (host.into_inner().expect("read back just above"), scales),
        }
    }

    /// Decodes every element: `f32(q) * scale_inv` of its block, rounded to `T`.
    pub fn dequantize<T: HighPrecision>(&self, format: Fp8Format) -> Result<Vec<T>> {
        let mut out = vec![T::from_f32(0.0); self.len()];
        dequantize::dequantize_matrix(self, format, &mut out)?;
        Ok(out)
    }
}

/// A quantized `[rows, cols]` tensor: the row-wise copy, and optionally the
/// column-wise (transposed) one.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedTensor {
    format: Fp8Format,
    rowwise: QuantizedMatrix,
    columnwise: Option<QuantizedMatrix>,
}

impl QuantizedTensor {
    /// Checks that the column-wise copy, if any, is the transpose of the row-wise one
    /// and uses the same kind of scales.
    pub fn new(format: Fp8Format, rowwise: QuantizedMatrix, columnwise: Option<QuantizedMatrix>) -> Result<Self> {
        if let Some(col) = &columnwise {
            if col.rows != rowwise.cols || col.cols != rowwise.rows {
                return Err(Error::ShapeMismatch {
                    what: "column-wise copy (must be the transpose)",
                    rows: rowwise.cols,
                    cols: rowwise.rows,
                    expected: rowwise.len(),
                    got: col.len(),
                });
            }
            if col.scale_kind() != rowwise.scale_kind() {
                return Err(Error::InvalidTensor {
                    name: "column-wise copy".to_string(),
                    reason: format!(
                        "scaled {:?} but the row-wise copy is {:?}",
                        col.scale_kind(),
                        rowwise.scale_kind()
                    ),
                });
            }
        }
        Ok(QuantizedTensor {
            format,
            rowwise,
            columnwise,
        })
    }

    /// The FP8 format of every code.
    pub fn format(&self) -> Fp8Format {
        self.format
    }

    /// `[rows, cols]` of the high-precision tensor.
    pub fn shape(&self) -> [usize; 2] {
        [self.rowwise.rows, self.rowwise.cols]
    }

    /// How the tensor is scaled.
    pub fn scale_kind(&self) -> ScaleKind {
        self.rowwise.scale_kind()
    }

    /// The row-wise copy (`[rows, cols]`).
    pub fn rowwise(&self) -> &QuantizedMatrix {
        &self.rowwise
    }

    /// The column-wise copy (`[cols, rows]`), if it was made.
    pub fn columnwise(&self) -> Option<&QuantizedMatrix> {
        self.columnwise.as_ref()
    }

    /// Takes the copies apart.
    pub fn into_parts(self) -> (Fp8Format, QuantizedMatrix, Option<QuantizedMatrix>) {
        (self.format, self.rowwise, self.columnwise)
    }

    /// Dequantizes the row-wise copy: `[rows, cols]` values of type `T` (f32, bf16, f16).
    pub fn dequantize<T: HighPrecision>(&self) -> Result<Vec<T>> {
        self.rowwise.dequantize(self.format)
    }

    /// Dequantizes the column-wise copy, `[cols, rows]`, if there is one.
    pub fn dequantize_columnwise<T: HighPrecision>(&self) -> Result<Option<Vec<T>>> {
        self.columnwise.as_ref().map(|c| c.dequantize(self.format)).transpose()
    }
}

/// Checks that a buffer of `len` elements is a `rows x cols` (or, for scales, a grid) matrix.
/// Checks that `scales` are in layout `kind` with its count for a `rows x cols` copy (`what`
/// names them in the error).
fn check_scales(what: &'static str, kind: ScaleKind, scales: &Scales, rows: usize, cols: usize) -> Result<()> {
    let (scale_rows, scale_cols) = kind.scale_shape(rows, cols);
    if scales.kind() != kind || scales.len() != scale_rows * scale_cols {
        return Err(Error::ShapeMismatch {
            what,
            rows: scale_rows,
            cols: scale_cols,
            expected: scale_rows * scale_cols,
            got: scales.len(),
        });
    }
    Ok(())
}

pub(crate) fn check_len(what: &'static str, len: usize, rows: usize, cols: usize) -> Result<()> {
    match rows.checked_mul(cols) {
        Some(expected) if expected == len => Ok(()),
        expected => Err(Error::ShapeMismatch {
            what,
            rows,
            cols,
            expected: expected.unwrap_or(usize::MAX),
            got: len,
        }),
    }
}

/// Rows per parallel task so that a task handles about 64K elements: big
/// enough to amortize the scheduling, small enough to balance two to many cores.
pub(crate) fn rows_per_task(cols: usize) -> usize {
    (65536 / cols.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in GPU copy: the payload is the stored bytes, read back as they are.
    fn stand_in(bytes: Vec<u8>) -> DeviceMirror {
        DeviceMirror {
            ordinal: 2,
            payload: Box::new(bytes),
            read_back: Some(|m| Ok(Box::new(m.payload.downcast_ref::<Vec<u8>>().expect("bytes").clone()))),
            read_scales: None,
        }
    }

    #[test]
    fn codes_held_on_a_device_are_read_back_at_the_first_host_read() {
        let codes = vec![1, 2, 3, 4, 5, 6];
        let host = QuantizedMatrix::new(codes.clone(), 2, 3, Scales::PerTensor(0.5)).unwrap();
        let held = QuantizedMatrix::held_on_device(2, 3, Scales::PerTensor(0.5), stand_in(codes.clone())).unwrap();
        // Shape, size and the mirror need no codes.
        assert!(!held.codes_on_host());
        assert_eq!(
            (held.len(), held.bytes(), held.mirror().map(|m| m.ordinal)),
            (6, 10, Some(2))
        );
        let clone = held.clone();
        assert_eq!(held.data(), &codes[..]);
        assert!(
            held.codes_on_host() && !clone.codes_on_host(),
            "read once, kept; a clone reads its own"
        );
        assert_eq!(clone, host, "equal to the host matrix of the same codes");
        assert_eq!(
            clone.dequantize::<f32>(Fp8Format::E4M3).unwrap(),
            host.dequantize::<f32>(Fp8Format::E4M3).unwrap()
        );
        // Dropping the mirror brings the codes home first.
        let mut dropped = held.clone();
        dropped.set_mirror(None);
        assert!(dropped.mirror().is_none() && dropped.codes_on_host());
        assert_eq!(dropped.data(), &codes[..]);
        let (parts, scales) = QuantizedMatrix::held_on_device(2, 3, Scales::PerTensor(0.5), stand_in(codes.clone()))
            .unwrap()
            .into_parts();
        assert_eq!((parts, scales), (codes, Scales::PerTensor(0.5)));
    }

    /// Reads of scales from stand-ins, counted.
    static SCALE_READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// A stand-in whose scales read back as a per-tensor 0.25 (6 codes), or as 1x128 scales
    /// `1, 2, ...`, one per 128 codes (a stand-in knows no more).
    fn with_scales(bytes: Vec<u8>) -> DeviceMirror {
        DeviceMirror {
            read_scales: Some(|m| {
                SCALE_READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let n = m.payload.downcast_ref::<Vec<u8>>().expect("bytes").len();
                Ok(match n {
                    6 => Scales::PerTensor(0.25),
                    _ => Scales::Block1x128((0..n / 128).map(|i| (i + 1) as f32).collect()),
                })
            }),
            ..stand_in(bytes)
        }
    }

    #[test]
    fn scales_held_on_a_device_are_read_at_the_first_host_read() {
        let reads = || SCALE_READS.load(std::sync::atomic::Ordering::Relaxed);
        let codes = vec![1, 2, 3, 4, 5, 6];
        let held =
            QuantizedMatrix::held_with_device_scales(2, 3, ScaleKind::PerTensor, with_scales(codes.clone())).unwrap();
        // Kind, size, codes and a tensor of it need no scale.
        assert_eq!(
            (held.scale_kind(), held.bytes(), held.data()),
            (ScaleKind::PerTensor, 10, &codes[..])
        );
        let tensor = QuantizedTensor::new(Fp8Format::E4M3, held.clone(), None).unwrap();
        assert_eq!(tensor.scale_kind(), ScaleKind::PerTensor);
        assert!(!held.scales_on_host(), "nothing read yet");
        let before = reads();
        assert_eq!(held.scales(), &Scales::PerTensor(0.25));
        assert_eq!(held.scales(), &Scales::PerTensor(0.25));
        assert!(held.scales_on_host());
        // (Other tests read stand-ins too: at least this one read, and not a second one here.)
        assert!(reads() > before);
        let host = QuantizedMatrix::new(codes.clone(), 2, 3, Scales::PerTensor(0.25)).unwrap();
        assert_eq!(
            tensor.rowwise(),
            &host,
            "equal to the host matrix of the same codes and scale"
        );
        assert_eq!(held.clone().into_parts(), (codes.clone(), Scales::PerTensor(0.25)));
        // Dropping the mirror brings codes and scales home first.
        let mut dropped =
            QuantizedMatrix::held_with_device_scales(2, 3, ScaleKind::PerTensor, with_scales(codes.clone())).unwrap();
        dropped.set_mirror(None);
        assert!(dropped.codes_on_host() && dropped.scales_on_host() && dropped.mirror().is_none());
        assert_eq!(dropped, host);
        // Block scales: 2 rows of 256 in 1x128 blocks.
        let blocks =
            QuantizedMatrix::held_with_device_scales(2, 256, ScaleKind::Block1x128, with_scales(vec![0; 512])).unwrap();
        assert_eq!(blocks.bytes(), 512 + 4 * 4, "sized without a read");
        assert_eq!(blocks.scales(), &Scales::Block1x128(vec![1.0, 2.0, 3.0, 4.0]));
        // Scales that do not fit the matrix are an error, not a wrong matrix.
        let wrong = QuantizedMatrix::held_with_device_scales(2, 256, ScaleKind::Mxfp8, with_scales(vec![0; 512]));
        assert!(
            wrong.unwrap().try_scales().is_err(),
            "1x128 scales read for an MXFP8 copy"
        );
        let short = QuantizedMatrix::held_with_device_scales(4, 128, ScaleKind::Block1x128, with_scales(vec![0; 384]));
        assert!(short.unwrap().try_scales().is_err(), "3 scales for 4 rows");
        // A mirror without a way back for its scales cannot hold them.
        assert!(QuantizedMatrix::held_with_device_scales(2, 3, ScaleKind::PerTensor, stand_in(codes)).is_err());
    }

    #[test]
    fn device_codes_need_their_scales_and_a_way_back() {
        let wrong = QuantizedMatrix::held_on_device(2, 256, Scales::Block1x128(vec![1.0; 3]), stand_in(vec![0; 512]));
        assert!(wrong.is_err(), "two rows of two 1x128 blocks need 4 scales");
        let no_way_back = DeviceMirror {
            read_back: None,
            ..stand_in(vec![0; 6])
        };
        assert!(QuantizedMatrix::held_on_device(2, 3, Scales::PerTensor(1.0), no_way_back).is_err());
        assert_eq!(stand_in(vec![9]).read_values::<u8>().unwrap(), vec![9]);
        assert!(stand_in(vec![9]).read_values::<u16>().is_err(), "another element type");
        let err = DeviceMirror {
            read_back: None,
            ..stand_in(vec![9])
        }
        .read_values::<u8>()
        .unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    }

    #[test]
    fn a_device_mirror_travels_with_its_matrix_and_never_changes_equality() {
        let plain = QuantizedMatrix::new(vec![1, 2, 3, 4, 5, 6], 2, 3, Scales::PerTensor(0.5)).unwrap();
        let payload: Box<dyn Any + Send + Sync> = Box::new(7u32);
        let mirrored = plain.clone().with_mirror(DeviceMirror {
            ordinal: 3,
            payload,
            read_back: None,
            read_scales: None,
        });
        assert!(plain.mirror().is_none());
        assert_eq!(mirrored, plain, "a mirror is a cache of the same codes");
        assert_eq!(format!("{:?}", mirrored.mirror().unwrap()), "DeviceMirror(cuda:3)");
        // Clones and tensors built from the matrix keep it (the GEMM reads it from either).
        let tensor = QuantizedTensor::new(Fp8Format::E4M3, mirrored.clone(), None).unwrap();
        let (_, rowwise, _) = tensor.clone().into_parts();
        let kept = rowwise.mirror().expect("into_parts keeps the mirror");
        assert_eq!(kept.ordinal, 3);
        assert_eq!(kept.payload.downcast_ref::<u32>(), Some(&7));
        // Other codes differ whatever the mirrors.
        let other = QuantizedMatrix::new(vec![1, 2, 3, 4, 5, 7], 2, 3, Scales::PerTensor(0.5)).unwrap();
        assert_ne!(mirrored, other);
    }
}
