//! Grouped-query attention and the Llama layer on device tensors. On any machine: where they
//! accept a device tensor and what they say when they do not (a host-memory stand-in plays the
//! GPU's array). With a GPU: fed device tensors they give the bits of the same layer fed host
//! tensors (staged ops), groups of several heads and of one (each prints `skipped:` without one).

use super::RopeTable;
use super::device_values_tests::{ramp, same_pass, skipped_without_a_gpu, stand_in};
use crate::amp::Precision;
use crate::error::Error;
use crate::nn::{GqaConfig, GroupedQueryAttention, KvCache, LlamaLayer, Module, NormConfig};
use crate::tensor::{DeviceKind, Tensor};

/// Rotary frequencies of a 16-feature head (rotary width 16), positions `0..64`.
fn rope_table() -> RopeTable {
    let inv_freq: Vec<f32> = (0..8).map(|i| 10000f32.powf(-(i as f32) / 8.0)).collect();
    RopeTable::new(&inv_freq, 64)
}

fn config(heads: usize, kv_heads: usize, qkv_bias: bool, recompute: bool) -> GqaConfig {
    GqaConfig {
        hidden: 128,
        heads,
        kv_heads,
        head_dim: 16,
        qkv_bias,
        norm: NormConfig::default(),
        recompute,
    }
}

fn mismatch(op: &'static str, expected: &str, got: &str) -> Error {
    Error::DeviceMismatch {
        op,
        expected: expected.into(),
        got: got.into(),
    }
}

/// The CPU backend refuses a GPU tensor with `DeviceMismatch` naming the op, not a panic; a GPU's
/// backend refuses another GPU's tensor the same way, before any op (no GPU is opened here), and
/// generation, whose cache lives in host memory, refuses any device tensor.
#[test]
fn grouped_attention_refuses_tensors_its_ops_cannot_read() {
    let bf16: Precision = "bf16".parse().unwrap();
    let (table, rows) = (rope_table(), 4);
    let on =
        |ordinal: usize, seed: f32| Tensor::on_device(stand_in(ordinal, ramp(rows * 128, seed)), rows, 128).unwrap();
    let mut attn = GroupedQueryAttention::new("attn", &config(8, 2, false, false), &bf16, 3).unwrap();
    let err = attn.forward(&on(0, 0.0), 1, rows, &table).unwrap_err();
    assert_eq!(err, mismatch("grouped attention forward", "cpu", "cuda:0"));
    let err = attn.backward(&on(0, 1.0), &table).unwrap_err();
    assert_eq!(err, mismatch("grouped attention backward", "cpu", "cuda:0"));
    let err = attn
        .forward_cached(&on(0, 0.0), 2, &mut KvCache::default(), &table)
        .unwrap_err();
    assert_eq!(err, mismatch("grouped attention forward_cached", "cpu", "cuda:0"));
    // Host tensors still run on the CPU after the refusals.
    let x = Tensor::new(ramp(rows * 128, 0.0), rows, 128).unwrap();
    let y = attn.forward(&x, 1, rows, &table).unwrap();
    let dx = attn.backward(&y, &table).unwrap();
    assert_eq!((y.device(), dx.device()), (DeviceKind::Cpu, DeviceKind::Cpu));

    let mut layer = LlamaLayer::new("layer", &config(8, 8, true, true), 256, &bf16, 3).unwrap();
    let err = layer.forward(&on(1, 0.0), 1, rows, &table).unwrap_err();
    assert_eq!(err, mismatch("grouped attention forward", "cpu", "cuda:1"));

    attn.to_device(DeviceKind::Cuda(3)).unwrap();
    let err = attn.forward(&on(0, 0.0), 1, rows, &table).unwrap_err();
    assert_eq!(err, mismatch("grouped attention forward", "cuda:3", "cuda:0"));
    let err = attn.backward(&on(0, 1.0), &table).unwrap_err();
    assert_eq!(err, mismatch("grouped attention backward", "cuda:3", "cuda:0"));
    let err = attn
        .forward_cached(&on(3, 0.0), 2, &mut KvCache::default(), &table)
        .unwrap_err();
    assert_eq!(err, mismatch("grouped attention forward_cached", "cpu", "cuda:3"));
    layer.to_device(DeviceKind::Cuda(3)).unwrap();
    let err = layer.forward(&on(0, 0.0), 1, rows, &table).unwrap_err();
    assert_eq!(err, mismatch("grouped attention forward", "cuda:3", "cuda:0"));
}

/// On GPU 0: layers made by `build` from one seed, one fed host tensors (staged ops) and one fed
/// their uploads, over two passes: 8 query heads over 2 key/value heads (with q/k/v biases, as
/// Qwen2; the repeat and the group sums on the device) and over 8 (groups of one), with and
/// without recompute, under bf16 and fp8-delayed: the resident outputs stay on the device with
/// the staged bits, and the layers end with the same gradients, slots and statistics.
fn same_as_staged<M: Module>(
    test: &str,
    build: impl Fn(&GqaConfig, &Precision) -> M,
    forward: impl Fn(&mut M, &Tensor, &RopeTable) -> crate::error::Result<Tensor> + Copy,
    backward: impl Fn(&mut M, &Tensor, &RopeTable) -> crate::error::Result<Tensor> + Copy,
) {
    if skipped_without_a_gpu(test) {
        return;
    }
    let (batch, seq, hidden) = (2, 32, 128);
    let table = rope_table();
    for name in ["bf16", "fp8-delayed"] {
        let precision: Precision = name.parse().unwrap();
        for (kv_heads, recompute) in [(2, false), (2, true), (8, false), (8, true)] {
            let config = config(8, kv_heads, kv_heads == 2, recompute);
            let case = format!("{name} 8 heads over {kv_heads} recompute {recompute}");
            let (mut staged, mut resident) = (build(&config, &precision), build(&config, &precision));
            staged.to_device(DeviceKind::Cuda(0)).unwrap();
            resident.to_device(DeviceKind::Cuda(0)).unwrap();
            for pass in 0..2 {
                let x = Tensor::new(ramp(batch * seq * hidden, pass as f32), batch * seq, hidden).unwrap();
                let dy = Tensor::new(ramp(batch * seq * hidden, pass as f32 + 2.5), batch * seq, hidden).unwrap();
                same_pass(
                    &format!("{case} pass {pass}"),
                    (&mut staged, &mut resident),
                    (&x, &dy),
                    |l, x| forward(l, x, &table),
                    |l, dy| backward(l, dy, &table),
                );
            }
        }
    }
    println!(
        "{test}: bf16, fp8-delayed x (8 heads over 2 with biases, over 8) x recompute on/off: same bits, \
         gradients, slots and statistics"
    );
}

/// On GPU 0: a `GroupedQueryAttention` fed device tensors, as [`same_as_staged`] says.
#[test]
fn grouped_attention_keeps_device_inputs_on_the_device() {
    let (batch, seq) = (2, 32);
    same_as_staged(
        "grouped_attention_keeps_device_inputs_on_the_device",
        |config, precision| GroupedQueryAttention::new("attn", config, precision, 5).unwrap(),
        |l, x, table| l.forward(x, batch, seq, table),
        |l, dy, table| l.backward(dy, table),
    );
}

/// On GPU 0: a `LlamaLayer` fed device tensors (what a resident GPU backend uploads at its
/// boundary), as [`same_as_staged`] says.
#[test]
fn llama_layers_keep_device_inputs_on_the_device() {
    let (batch, seq) = (2, 32);
    same_as_staged(
        "llama_layers_keep_device_inputs_on_the_device",
        |config, precision| LlamaLayer::new("layer", config, 256, precision, 7).unwrap(),
        |l, x, table| l.forward(x, batch, seq, table),
        |l, dy, table| l.backward(dy, table),
    );
}
