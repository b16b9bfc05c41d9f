//! Every layer's CUDA output and gradients against the CPU backend under each precision.
//!
//! The CUDA layer path is not written yet (the layers run their backend calls through
//! `nn::linear_gemms` and the op kernels on the CPU), so there is nothing to compare:
//! this test says so in one visible line instead of passing silently.

fn main() {
    let gpu = match fp8_engine::device::Device::select(fp8_engine::device::DeviceChoice::Cuda(0)) {
        Ok(device) => device.describe(),
        Err(err) => format!("no GPU ({err})"),
    };
    println!(
        "gpu_layers: skipped: the CUDA layer path is not implemented yet; layers run on the CPU backend only [{gpu}]"
    );
}
