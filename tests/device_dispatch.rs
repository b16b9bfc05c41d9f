//! Layers and models run their ops on the device they were moved to: a CUDA
//! backend without ops fails at the first op with its name, an input on
//! another device is refused naming the op and both devices, and nothing panics.

use fp8_engine::Error;
use fp8_engine::amp::Precision;
use fp8_engine::model::{DecoderModel, ModelConfig};
use fp8_engine::nn::{Linear, Module, Tensor};
use fp8_engine::tensor::DeviceKind;

#[test]
fn a_layer_moved_to_cuda_refuses_a_host_input_naming_op_and_devices() {
    let precision: Precision = "bf16".parse().unwrap();
    let mut layer = Linear::new("fc", 16, 16, true, &precision, 1).unwrap();
    layer.to_device(DeviceKind::Cuda(0)).unwrap();
    let x = Tensor::zeros(16, 16);
    let err = layer.forward(&x).expect_err("input on the CPU, layer on cuda:0");
    assert_eq!(
        err,
        Error::DeviceMismatch {
            op: "linear forward",
            expected: "cuda:0".into(),
            got: "cpu".into()
        }
    );
    // Back on the CPU the same layer runs.
    layer.to_device(DeviceKind::Cpu).unwrap();
    assert_eq!(layer.forward(&x).unwrap().shape(), (16, 16));
}

#[test]
fn a_model_on_cuda_fails_at_its_first_op_with_its_name() {
    let config = ModelConfig {
        vocab: 16,
        max_seq: 4,
        hidden: 16,
        heads: 2,
        layers: 1,
        ffn_hidden: 32,
        ..ModelConfig::default()
    };
    let precision: Precision = "fp32".parse().unwrap();
    let mut model = DecoderModel::new(&config, &precision, 1).unwrap();
    model.to_device(DeviceKind::Cuda(0)).unwrap();
    let err = model
        .forward_loss(&[1, 2, 3, 4], &[2, 3, 4, 5], 1, 4)
        .expect_err("no CUDA ops");
    assert_eq!(
        err,
        Error::Unsupported {
            op: "embedding_forward",
            device: "cuda:0".into()
        }
    );
}
