//! The model's ends on GPU 0 (`ends`, the tied head): with device tensors, the embeddings, the
//! loss, its gradient, the tied head and the table gradients stay on the device and give the
//! bits of the same ops fed host tensors (which stage them). Each test prints `skipped:` without
//! a GPU.

use super::{DecoderModel, ModelConfig, ends, head};
use crate::amp::Precision;
use crate::dispatch::Backend;
use crate::dispatch::device_values_tests::{ramp, skipped_without_a_gpu};
use crate::nn::{Module, Parameter, Tensor};
use crate::tensor::{DeviceKind, Dtype};

const GPU: DeviceKind = DeviceKind::Cuda(0);

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_host().unwrap().data().iter().map(|v| v.to_bits()).collect()
}

fn grad_bits(p: &Parameter) -> Vec<u32> {
    p.grad().iter().map(|v| v.to_bits()).collect()
}

/// A trainable `[vocab, hidden]` table.
fn table(name: &str, vocab: usize, hidden: usize, seed: f32) -> Parameter {
    Parameter::new(name, &[vocab, hidden], ramp(vocab * hidden, seed)).unwrap()
}

#[test]
fn model_ends_keep_device_tensors_on_the_device() {
    const TEST: &str = "model_ends_keep_device_tensors_on_the_device";
    if skipped_without_a_gpu(TEST) {
        return;
    }
    let gpu = Backend::on(GPU);
    let (vocab, hidden, dtype) = (40, 32, Dtype::Bf16);
    // Repeated ids, and one the ignored target below never scores.
    let ids: Vec<u32> = [3, 7, 3, 0, 39, 7, 7, 12, 5, 3, 21, 0].to_vec();
    let rows = ids.len();
    let (mut staged_table, mut resident_table) = (table("t", vocab, hidden, 0.3), table("t", vocab, hidden, 0.3));

    let x = ends::embed_tokens(&gpu, &mut staged_table, &ids, (rows, hidden), dtype, DeviceKind::Cpu).unwrap();
    let xd = ends::embed_tokens(&gpu, &mut resident_table, &ids, (rows, hidden), dtype, GPU).unwrap();
    assert_eq!(xd.device(), GPU, "the embedding output stays on the device");
    assert_eq!(resident_table.value_device(), GPU, "a trainable table moves there");
    assert_eq!(staged_table.value_device(), DeviceKind::Cpu);
    assert_eq!(bits(&x), bits(&xd), "embedding forward");

    // The tied head on the table where each lives.
    let normed = Tensor::new(ramp(rows * hidden, 1.1), rows, hidden).unwrap();
    let normed_d = gpu.to_device(&normed).unwrap();
    let logits = head::logits(&gpu, None, &normed, &staged_table, dtype).unwrap();
    let logits_d = head::logits(&gpu, None, &normed_d, &resident_table, dtype).unwrap();
    assert_eq!(logits_d.device(), GPU, "the logits stay on the device");
    assert_eq!(bits(&logits), bits(&logits_d), "tied head forward");

    let mut targets = ids[1..].to_vec();
    targets.push(crate::data::IGNORE_INDEX);
    let ignore = crate::data::IGNORE_INDEX;
    let (loss, lse) = ends::loss(&gpu, &logits, &targets, ignore).unwrap();
    let (loss_d, lse_d) = ends::loss(&gpu, &logits_d, &targets, ignore).unwrap();
    assert_eq!(lse_d.device(), GPU, "the log-sum-exp stays on the device");
    assert_eq!(loss.to_bits(), loss_d.to_bits(), "loss");
    assert_eq!(bits(&lse), bits(&lse_d), "log-sum-exp");
    let dlogits = ends::loss_backward(&gpu, &logits, &targets, ignore, &lse, 0.5).unwrap();
    let dlogits_d = ends::loss_backward(&gpu, &logits_d, &targets, ignore, &lse_d, 0.5).unwrap();
    assert_eq!(dlogits_d.device(), GPU);
    assert_eq!(bits(&dlogits), bits(&dlogits_d), "dlogits");

    // The tied head's backward adds into the table gradient where it lives, then the embedding's.
    let dh = head::logits_backward(&gpu, None, dlogits, &normed, &mut staged_table, dtype).unwrap();
    let dh_d = head::logits_backward(&gpu, None, dlogits_d, &normed_d, &mut resident_table, dtype).unwrap();
    assert_eq!(dh_d.device(), GPU);
    assert_eq!(resident_table.grad_device(), GPU, "the table gradient moves there");
    assert_eq!(bits(&dh), bits(&dh_d), "tied head backward");
    assert_eq!(
        grad_bits(&staged_table),
        grad_bits(&resident_table),
        "head's table gradient"
    );
    let dx = Tensor::new(ramp(rows * hidden, 2.3), rows, hidden).unwrap();
    let dx_d = gpu.to_device(&dx).unwrap();
    ends::embedding_backward(&gpu, &mut staged_table, &ids, &dx, dtype).unwrap();
    ends::embedding_backward(&gpu, &mut resident_table, &ids, &dx_d, dtype).unwrap();
    assert_eq!(grad_bits(&staged_table), grad_bits(&resident_table), "table gradient");

    // Against the CPU backend: the gather and the scatter-add are exact, the loss within f32
    // rounding of its sums (`docs/numerics.md`: the kernel's exp and log are within 2 ulp).
    let cpu = Backend::default();
    let mut cpu_table = table("t", vocab, hidden, 0.3);
    let x_cpu = ends::embed_tokens(&cpu, &mut cpu_table, &ids, (rows, hidden), dtype, DeviceKind::Cpu).unwrap();
    assert_eq!(bits(&x_cpu), bits(&xd), "embedding forward against the CPU");
    let mut gpu_table = table("t", vocab, hidden, 0.3); // its gradient goes up with dx_d
    ends::embedding_backward(&cpu, &mut cpu_table, &ids, &dx, dtype).unwrap();
    ends::embedding_backward(&gpu, &mut gpu_table, &ids, &dx_d, dtype).unwrap();
    assert_eq!(
        grad_bits(&cpu_table),
        grad_bits(&gpu_table),
        "scatter-add against the CPU"
    );
    let (loss_cpu, _) = ends::loss(&cpu, &logits.to_host().unwrap(), &targets, ignore).unwrap();
    assert!(
        // The loss's contract (`dispatch::contract`, cross_entropy_forward).
        (loss_cpu - loss_d).abs() <= 1e-6 + 1e-5 * loss_cpu.abs(),
        "loss {loss_d} on the GPU, {loss_cpu} on the CPU"
    );
    println!(
        "{TEST}: embedding, tied head, loss and their gradients: same bits, kept on the device, CPU's gather, scatter and loss"
    );
}

#[test]
fn a_resident_decoder_keeps_its_tables_on_the_device_unless_fp32() {
    const TEST: &str = "a_resident_decoder_keeps_its_tables_on_the_device_unless_fp32";
    if skipped_without_a_gpu(TEST) {
        return;
    }
    if !crate::backend::cuda::env_switch::resident_layers() {
        // Not "skipped:", which would mark the whole bundle step skipped.
        println!("{TEST}: not run here: FP8_CUDA_RESIDENT=0 keeps the model's ends on the host");
        return;
    }
    let config = ModelConfig {
        layers: 1,
        hidden: 32,
        heads: 2,
        ffn_hidden: 64,
        vocab: 48,
        max_seq: 16,
        tied_head: true,
        ..ModelConfig::default()
    };
    let (batch, seq) = (2, 16);
    let ids: Vec<u32> = (0..batch * seq).map(|i| (i * 7 % 48) as u32).collect();
    let targets: Vec<u32> = (0..batch * seq).map(|i| (i * 5 % 48) as u32).collect();
    for (precision, kept) in [("bf16", GPU), ("fp8-delayed", GPU), ("fp32", DeviceKind::Cpu)] {
        let precision: Precision = precision.parse().unwrap();
        let mut model = DecoderModel::new(&config, &precision, 7).unwrap();
        model.to_device(GPU).unwrap();
        let loss = model.forward_loss(&ids, &targets, batch, seq).unwrap();
        assert!(loss.is_finite(), "{}: loss {loss}", precision.name());
        model.backward(1.0).unwrap();
        let mut seen = 0;
        model.visit_parameters(&mut |p| {
            if p.name().starts_with("embed.") {
                seen += 1;
                let name = format!("{}: {}", precision.name(), p.name());
                assert_eq!(p.value_device(), kept, "{name}: values");
                assert_eq!(p.grad_device(), kept, "{name}: gradient");
                assert!(p.grad().iter().any(|g| *g != 0.0), "{name}: a gradient arrived");
            }
        });
        assert_eq!(seen, 2, "token and position tables");
    }
    println!("{TEST}: bf16 and fp8-delayed keep both tables on the device, fp32 at home");
}
