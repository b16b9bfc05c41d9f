//! NCCL at world size 1 on GPU 0 (docs/distributed.md): the collectives are the identity (a
//! bf16 wire rounds to bf16), a 3-step ZeRO-1 training run whose parameter all-gathers go
//! through NCCL is bit-identical to the run without a group, and so is `--gpus 1` (the rank on
//! GPU 0 in its own thread) against the same run on GPU 0 without a group. Without a usable GPU or without libnccl
//! this prints one line, "gpu_nccl: skipped: <why>", and passes. It has never run: it was
//! written on a machine without a GPU.

use std::process::ExitCode;

use fp8_engine::amp::Precision;
use fp8_engine::backend::cuda::CudaDevice;
use fp8_engine::backend::cuda::nccl::{NcclCollective, nccl_present, unique_id};
use fp8_engine::data::Dataset;
use fp8_engine::data::addition::AdditionConfig;
use fp8_engine::device::{Device, DeviceChoice};
use fp8_engine::dist::{Collective, DataParallel, Parallel, Wire};
use fp8_engine::model::ModelConfig;
use fp8_engine::train::data_parallel::run_on_gpus;
use fp8_engine::train::session::{RunConfig, RunControl, RunInputs, RunOutput, run};

fn check(what: &str, ok: bool, failures: &mut Vec<String>) {
    println!("gpu_nccl: {what}: {}", if ok { "ok" } else { "FAILED" });
    if !ok {
        failures.push(what.to_string());
    }
}

/// The task and the 3-step run every training check here uses.
fn setup() -> fp8_engine::Result<(Dataset, RunConfig)> {
    let data = Dataset::addition(
        AdditionConfig {
            digits: 2,
            heldout_size: 32,
            ..AdditionConfig::default()
        },
        7,
    )?;
    let config = RunConfig {
        model: ModelConfig {
            hidden: 32,
            heads: 2,
            layers: 1,
            ffn_hidden: 64,
            ..ModelConfig::default()
        },
        steps: 3,
        batch: 32,
        micro_batches: 1,
        warmup: 1,
        seed: 11,
        ..RunConfig::default()
    };
    Ok((data, config))
}

fn train(collective: Option<&dyn Collective>, dir: &std::path::Path) -> fp8_engine::Result<RunOutput> {
    let (data, config) = setup()?;
    let precision: Precision = "fp8-delayed".parse()?;
    let cpu = Device::select(DeviceChoice::Cpu)?;
    let parallel = collective.map(|c| Parallel {
        collective: c,
        // ZeRO-1: the optimizer all-gathers the updated values through NCCL every step (world
        // size 1 skips the gradient and amax reductions, which are the identity there).
        options: DataParallel {
            zero: 1,
            ..DataParallel::default()
        },
    });
    let control = RunControl {
        parallel: parallel.as_ref(),
        ..RunControl::default()
    };
    let inputs = RunInputs {
        precision: &precision,
        config: &config,
        data: &data,
        dir,
        control,
    };
    run(&cpu, &inputs, &mut |_| {})
}

/// Three fp8-delayed steps on GPU 0: alone, or as the one rank of `run_on_gpus(1, ..)`.
fn train_on_gpu(dir: &std::path::Path, ranked: bool) -> fp8_engine::Result<RunOutput> {
    let (data, config) = setup()?;
    let precision: Precision = "fp8-delayed".parse()?;
    if !ranked {
        let gpu = Device::select(DeviceChoice::Cuda(0))?;
        return run(
            &gpu,
            &RunInputs {
                precision: &precision,
                config: &config,
                data: &data,
                dir,
                control: RunControl::default(),
            },
            &mut |_| {},
        );
    }
    let inputs = RunInputs {
        precision: &precision,
        config: &config,
        data: &data,
        dir,
        control: RunControl::default(),
    };
    let options = DataParallel {
        zero: 1,
        ..DataParallel::default()
    };
    let on_failure = |rank: usize, reason: &str| println!("gpu_nccl: rank {rank} {reason}");
    let mut outputs = run_on_gpus(
        1,
        &options,
        &inputs.decoder_builder(),
        &inputs,
        &mut |_| {},
        &on_failure,
    )?;
    Ok(outputs.swap_remove(0))
}

fn main() -> ExitCode {
    let gpu = match CudaDevice::open(0) {
        Ok(gpu) => gpu,
        Err(err) => {
            println!("gpu_nccl: skipped: {err}");
            return ExitCode::SUCCESS;
        }
    };
    if !nccl_present() {
        println!("gpu_nccl: skipped: libnccl is not installed");
        return ExitCode::SUCCESS;
    }
    let nccl = match unique_id().and_then(|id| NcclCollective::from_id(&gpu, 0, 1, &id)) {
        Ok(nccl) => nccl,
        Err(err) => {
            println!("gpu_nccl: FAILED to make a group of one: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut failures = Vec::new();
    let values = vec![1.5f32, -2.25, 3.0e-8, 65504.0, 1.0 + 2f32.powi(-9)];
    let mut sum = values.clone();
    check(
        "f32 sum of one rank is the identity",
        nccl.all_reduce_sum(&mut sum, Wire::F32).is_ok() && sum == values,
        &mut failures,
    );
    let mut rounded = values.clone();
    let want: Vec<f32> = values.iter().map(|&v| Wire::Bf16.round(v)).collect();
    check(
        "bf16 sum of one rank rounds to bf16",
        nccl.all_reduce_sum(&mut rounded, Wire::Bf16).is_ok() && rounded == want,
        &mut failures,
    );
    let mut max = values.clone();
    check(
        "max of one rank is the identity",
        nccl.all_reduce_max(&mut max).is_ok() && max == values,
        &mut failures,
    );
    let mut gathered = vec![0.0f32; values.len()];
    check(
        "all-gather of one rank copies",
        nccl.all_gather(&values, &mut gathered).is_ok() && gathered == values,
        &mut failures,
    );
    let mut b = values.clone();
    check(
        "broadcast and barrier",
        nccl.broadcast(&mut b, 0).is_ok() && b == values && nccl.barrier().is_ok(),
        &mut failures,
    );
    let base = std::env::temp_dir().join(format!("fp8-gpu-nccl-{}", std::process::id()));
    let (plain_dir, nccl_dir) = (base.join("plain"), base.join("nccl"));
    for dir in [&plain_dir, &nccl_dir] {
        let _ = std::fs::create_dir_all(dir);
    }
    match (train(None, &plain_dir), train(Some(&nccl), &nccl_dir)) {
        (Ok(plain), Ok(with_nccl)) => {
            let bits = |o: &RunOutput| o.curve.iter().map(|c| c.1.to_bits()).collect::<Vec<_>>();
            check(
                "fp8-delayed training through NCCL matches the run without a group",
                bits(&plain) == bits(&with_nccl)
                    && std::fs::read(&plain.checkpoint).ok() == std::fs::read(&with_nccl.checkpoint).ok(),
                &mut failures,
            );
        }
        (a, b) => {
            println!("gpu_nccl: training failed: {:?} / {:?}", a.err(), b.err());
            failures.push("training".into());
        }
    }
    // --gpus 1: one rank on GPU 0 in its own thread, NCCL made by ncclCommInitAll, against the
    // same run on GPU 0 without a group.
    let (gpu_plain, gpu_ranks) = (base.join("gpu-plain"), base.join("gpu-ranks"));
    for dir in [&gpu_plain, &gpu_ranks] {
        let _ = std::fs::create_dir_all(dir);
    }
    match (train_on_gpu(&gpu_plain, false), train_on_gpu(&gpu_ranks, true)) {
        (Ok(plain), Ok(ranked)) => {
            let bits = |o: &RunOutput| o.curve.iter().map(|c| c.1.to_bits()).collect::<Vec<_>>();
            check(
                "--gpus 1 (ZeRO-1, NCCL in one process) matches the run on GPU 0 without a group",
                bits(&plain) == bits(&ranked)
                    && std::fs::read(&plain.checkpoint).ok() == std::fs::read(&ranked.checkpoint).ok(),
                &mut failures,
            );
        }
        (a, b) => {
            println!("gpu_nccl: GPU training failed: {:?} / {:?}", a.err(), b.err());
            failures.push("GPU training".into());
        }
    }
    let _ = std::fs::remove_dir_all(&base);
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("gpu_nccl: {} check(s) failed: {failures:?}", failures.len());
        ExitCode::FAILURE
    }
}
