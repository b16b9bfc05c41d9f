//! `fp8 info`: the GPUs found, their compute capability and memory, the
//! precision policy the engine would choose and why, and whether kernels were compiled in.

use clap::Args;
use fp8_engine::backend::{cuda, kernels};
use fp8_engine::device::PrecisionPolicy;

use crate::error::CliError;

/// Show the devices found, the precision policy for each and whether CUDA kernels are compiled in.
#[derive(Args)]
pub struct InfoArgs {
    /// Also load every kernel module and every kernel on GPU 0 (and check the Hopper
    /// kernels' registers); prints "load-all: skipped: <why>" without a usable GPU.
    #[arg(long)]
    load_all: bool,
}

/// Runs `fp8 info`.
pub fn run(args: InfoArgs) -> Result<(), CliError> {
    let names: Vec<&str> = kernels::FATBINS.iter().map(|(name, _)| *name).collect();
    if kernels::compiled() {
        println!(
            "CUDA kernels: compiled in ({}), sm_75 sm_80 sm_86 sm_89 sm_90a sm_100a sm_120 + PTX compute_120",
            names.join(", ")
        );
    } else {
        println!("CUDA kernels: built without CUDA kernels (no nvcc at build time)");
    }
    match cuda::driver_version() {
        Ok((major, minor)) => println!("CUDA driver: {major}.{minor}"),
        Err(err) => println!("CUDA driver: none ({err})"),
    }
    let gpus = cuda::discover().unwrap_or_default();
    if gpus.is_empty() {
        println!("GPUs: none; the engine runs on the CPU (bit-exact FP8 reference kernels)");
    }
    for gpu in &gpus {
        let (major, minor) = gpu.compute_capability;
        let policy = match PrecisionPolicy::for_compute_capability(gpu.compute_capability) {
            Some((policy, why)) => format!("{} ({why})", policy.name()),
            None => "unsupported: CUDA 13 kernels need sm_75 or newer".to_string(),
        };
        println!(
            "GPU {}: {}, compute capability {major}.{minor}, {} SMs, {:.1} GiB; policy: {policy}",
            gpu.ordinal,
            gpu.name,
            gpu.multiprocessors,
            gpu.total_memory as f64 / (1u64 << 30) as f64
        );
    }
    if args.load_all {
        load_all()?;
    }
    Ok(())
}

/// Loads every module and kernel on GPU 0, one line per module.
fn load_all() -> Result<(), CliError> {
    let device = match cuda::CudaDevice::open(0) {
        Ok(device) => device,
        Err(err) => {
            println!("load-all: skipped: {err}");
            return Ok(());
        }
    };
    let modules = cuda::kernel_inventory::load_all(&device)?;
    let total: usize = modules.iter().map(|m| m.kernels.len()).sum();
    for m in &modules {
        println!("load-all: {}: {} kernels loaded", m.module, m.kernels.len());
    }
    println!("load-all: ok: {} modules, {total} kernels", modules.len());
    Ok(())
}
