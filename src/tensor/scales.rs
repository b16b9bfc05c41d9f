//! The scales of one quantized copy, in the compact row-major layout used in
//! files (`docs/numerics.md`, block scaling and MXFP8); GPU kernels may pad or transpose them internally.

/// Elements per MXFP8 scaling block (one E8M0 exponent each).
pub const MXFP8_BLOCK: usize = 32;

/// How a quantized copy is scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleKind {
    /// One f32 scale_inv for the whole tensor (delayed or current scaling).
    PerTensor,
    /// One f32 scale_inv per row per 128 consecutive elements.
    Block1x128,
    /// One f32 scale_inv per 128x128 tile.
    Block128x128,
    /// One E8M0 exponent per row per 32 consecutive elements.
    Mxfp8,
}

impl ScaleKind {
    /// Block height and width; `None` for a per-tensor scale.
    pub const fn block_shape(self) -> Option<(usize, usize)> {
        match self {
            ScaleKind::PerTensor => None,
            ScaleKind::Block1x128 => Some((1, 128)),
            ScaleKind::Block128x128 => Some((128, 128)),
            ScaleKind::Mxfp8 => Some((1, MXFP8_BLOCK)),
        }
    }

    /// Shape of the scale grid of a `rows x cols` copy: `(1, 1)` per tensor,
    /// else `(ceil(rows/bh), ceil(cols/bw))`. Partial blocks at the edges get
    /// their own scale.
    pub const fn scale_shape(self, rows: usize, cols: usize) -> (usize, usize) {
        match self.block_shape() {
            None => (1, 1),
            Some((bh, bw)) => (rows.div_ceil(bh), cols.div_ceil(bw)),
        }
    }
}

/// The scales of one quantized copy.
#[derive(Clone, Debug, PartialEq)]
pub enum Scales {
    /// `scale_inv` of the whole tensor.
    PerTensor(f32),
    /// `[rows, ceil(cols/128)]` f32 `scale_inv`.
    Block1x128(Vec<f32>),
    /// `[ceil(rows/128), ceil(cols/128)]` f32 `scale_inv`.
    Block128x128(Vec<f32>),
    /// `[rows, ceil(cols/32)]` E8M0 codes `e`; the block decodes as `q * 2^(e-127)`.
    Mxfp8(Vec<u8>),
}

impl Scales {
    /// The layout these scales follow.
    pub fn kind(&self) -> ScaleKind {
        match self {
            Scales::PerTensor(_) => ScaleKind::PerTensor,
            Scales::Block1x128(_) => ScaleKind::Block1x128,
            Scales::Block128x128(_) => ScaleKind::Block128x128,
            Scales::Mxfp8(_) => ScaleKind::Mxfp8,
        }
    }

    /// Number of scales stored.
    pub fn len(&self) -> usize {
        match self {
            Scales::PerTensor(_) => 1,
            Scales::Block1x128(s) | Scales::Block128x128(s) => s.len(),
            Scales::Mxfp8(e) => e.len(),
        }
    }

    /// Whether no scale is stored (an empty block-scaled tensor).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
