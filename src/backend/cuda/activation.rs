//! Launchers of `cuda/activation.cu`: tanh-GELU and SwiGLU, forward and
//! backward. Twins: `ops::gelu_forward/backward`, `ops::swiglu_forward/backward`,
//! the same bits: the kernels repeat the twins' f32 operations in the same order,
//! their `exp` (`ops::fast_exp`) included (`docs/numerics.md`, Activations).

use super::buffer::DeviceBuffer;
use super::context::CudaDevice;
use super::launch::launch;
use super::op_args::{check_len, elements, stride_blocks};
use super::params::Fp8EltwiseParams;
use crate::error::Result;

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
