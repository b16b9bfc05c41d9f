//! Launchers of `cuda/activation.cu`: tanh-GELU and SwiGLU, forward and
//! backward, and inverted dropout. Twins: `ops::gelu_forward/backward`,
//! `ops::swiglu_forward/backward`, `ops::dropout/dropout_add`, the same bits: the
//! kernels repeat the twins' f32 operations in the same order, their `exp`
//! (`ops::fast_exp`) included (`docs/numerics.md`, Activations), and draw the
//! twin's counter-based dropout mask.

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::launch::launch;
use super::op_args::{check_len, dtype_code, elements, stride_blocks};
use super::params::{Fp8DropoutParams, Fp8EltwiseParams};
use crate::error::Result;
use crate::ops::DropoutMask;
use crate::tensor::Dtype;

const MODULE: &str = "activation";

impl CudaDevice {
    fn elementwise(&self, function: &str, n: usize, params: Fp8EltwiseParams) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        launch(
            self,
            MODULE,
            function,
            stride_blocks(self.info().multiprocessors, n),
            params,
        )
    }

    /// `out = round(x * mask)` (`add`: `out = round(out + x * mask)`). Twins of `ops::dropout`
    /// and `ops::dropout_add`.
    pub fn dropout(
        &self,
        x: &DeviceBuffer<f32>,
        mask: DropoutMask,
        dtype: Dtype,
        out: &mut DeviceBuffer<f32>,
        add: bool,
    ) -> Result<()> {
        let (k, function) = match add {
            false => ("dropout", "fp8_dropout"),
            true => ("dropout_add", "fp8_dropout_add"),
        };
        check_len(k, "output", out.len(), x.len())?;
        if x.is_empty() {
            return Ok(());
        }
        let params = Fp8DropoutParams {
            x: x.address(self),
            out: out.address_mut(self),
            n: x.len() as u64,
            state: mask.state(),
            p: mask.p(),
            keep: mask.keep(),
            dtype: dtype_code(dtype),
        };
        launch(
            self,
            MODULE,
            function,
            stride_blocks(self.info().multiprocessors, x.len()),
            params,
        )
    }

    /// `y = gelu(x)` (tanh form). Twin of `ops::gelu_forward`.
    pub fn gelu_forward(&self, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        check_len("gelu_forward", "output y", y.len(), x.len())?;
        let params = Fp8EltwiseParams {
            a: x.address(self),
            out: y.address_mut(self),
            rows: 1,
            cols: x.len() as u64,
            ..Default::default()
        };
        self.elementwise("fp8_gelu_forward", x.len(), params)
    }

    /// `dx = dy * gelu'(x)`. Twin of `ops::gelu_backward`.
    pub fn gelu_backward(
        &self,
        dy: &DeviceBuffer<f32>,
        x: &DeviceBuffer<f32>,
        dx: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "gelu_backward";
        check_len(K, "output gradient dy", dy.len(), x.len())?;
        check_len(K, "input gradient dx", dx.len(), x.len())?;
        let params = Fp8EltwiseParams {
            a: dy.address(self),
            b: x.address(self),
            out: dx.address_mut(self),
            rows: 1,
            cols: x.len() as u64,
            ..Default::default()
        };
        self.elementwise("fp8_gelu_backward", x.len(), params)
    }

    /// `y [rows, cols] = silu(gate) * up` for `x [rows, 2 cols] = [gate | up]`. Twin of `ops::swiglu_forward`.
    pub fn swiglu_forward(
        &self,
        x: &DeviceBuffer<f32>,
        rows: usize,
        cols: usize,
        y: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "swiglu_forward";
        let n = elements(K, rows, cols)?;
        check_len(K, "input x [rows, 2 cols]", x.len(), elements(K, n, 2)?)?;
        check_len(K, "output y", y.len(), n)?;
        let params = Fp8EltwiseParams {
            a: x.address(self),
            out: y.address_mut(self),
            rows: rows as u64,
            cols: cols as u64,
            ..Default::default()
        };
        self.elementwise("fp8_swiglu_forward", n, params)
    }

    /// `dx [rows, 2 cols] = [dgate | dup]`, overwritten. Twin of `ops::swiglu_backward`.
    pub fn swiglu_backward(
        &self,
        dy: &DeviceBuffer<f32>,
        x: &DeviceBuffer<f32>,
        rows: usize,
        cols: usize,
        dx: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const K: &str = "swiglu_backward";
        let n = elements(K, rows, cols)?;
        check_len(K, "output gradient dy", dy.len(), n)?;
        check_len(K, "input x [rows, 2 cols]", x.len(), elements(K, n, 2)?)?;
        check_len(K, "input gradient dx", dx.len(), 2 * n)?;
        let params = Fp8EltwiseParams {
            a: dy.address(self),
            b: x.address(self),
            out: dx.address_mut(self),
            rows: rows as u64,
            cols: cols as u64,
            ..Default::default()
        };
        self.elementwise("fp8_swiglu_backward", n, params)
    }
}
