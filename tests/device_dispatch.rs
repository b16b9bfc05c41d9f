//! Layers and models run their ops on the device they were moved to: the CUDA
//! backend's arms are staged through host memory, so a layer on CUDA takes host
//! inputs; without that GPU the first op is a typed error, and nothing panics.

use fp8_engine::Error;
use fp8_engine::amp::Precision;
use fp8_engine::model::{DecoderModel, ModelConfig};
use fp8_engine::nn::{Linear, Module, Tensor};
use fp8_engine::tensor::DeviceKind;

/// No machine has GPU 99: every op on it must fail to open the device, as a value.
const ABSENT: DeviceKind = DeviceKind::Cuda(99);

fn no_gpu(err: &Error) -> bool {
    matches!(err, Error::NoGpu { .. } | Error::KernelsMissing)
}

#[test]
fn a_layer_on_an_absent_gpu_fails_at_its_first_op_and_runs_again_on_the_cpu() {
    let precision: Precision = "bf16".parse().unwrap();
    let mut layer = Linear::new("fc", 16, 16, true, &precision, 1).unwrap();
    layer.to_device(ABSENT).unwrap();
    let x = Tensor::zeros(16, 16);
    let err = layer.forward(&x).expect_err("there is no GPU 99");
    assert!(no_gpu(&err), "{err}");
    // Back on the CPU the same layer runs.
    layer.to_device(DeviceKind::Cpu).unwrap();
    assert_eq!(layer.forward(&x).unwrap().shape(), (16, 16));
}

#[test]
fn a_model_on_an_absent_gpu_fails_at_its_first_op_with_a_typed_error() {
    let config = ModelConfig {
        vocab: 16,
        max_seq: 4,
        hidden: 16,
        heads: 2,
        layers: 1,
        ffn_hidden: 32,
        ..ModelConfig::default()
    };
    let precision: Precision = "bf16".parse().unwrap();
    let mut model = DecoderModel::new(&config, &precision, 1).unwrap();
    model.to_device(ABSENT).unwrap();
    let err = model
        .forward_loss(&[1, 2, 3, 4], &[2, 3, 4, 5], 1, 4)
        .expect_err("there is no GPU 99");
    assert!(no_gpu(&err), "{err}");
}
