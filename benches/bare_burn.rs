//! Where the CPU time of the cnn and gpt workloads goes: forward + backward of the same Burn
//! modules in a bare Burn loop (Burn's own parameters, no kiln install, no gradient flattening,
//! no optimizer), next to kiln's full micro-step. The gap between the two is kiln's overhead;
//! the rest is Burn's kernels (compare with `torch_baseline.py` for PyTorch's).
//!
//!   cargo bench --bench bare_burn

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use kiln::config::load;
use kiln::model::{Batch, ComputeOn, Family, Forward, StepKey, UnitParams};
use kiln::params::Grads;

type B = Autodiff<Flex>;

fn time<F: FnMut()>(steps: usize, mut f: F) -> f64 {
    for _ in 0..2 {
        f();
    }
    let t = Instant::now();
    for _ in 0..steps {
        f();
    }
    t.elapsed().as_secs_f64() / steps as f64
}

/// Seconds per micro-step: a bare Burn forward + backward of `family`'s module, and kiln's
/// micro-step (install, forward, backward, flat gradients) for the same batch.
fn measure<F: Family>(
    name: &str,
    family: F,
    file: &str,
    bare_input: TensorData,
    batch: Batch,
    steps: usize,
) {
    let device = Default::default();
    let module: F::Module<B> = family.build::<B>(&device);
    let bare = time(steps, || {
        let x = bare_input.clone();
        let logits: Tensor<B, 2> = family.forward(&module, x, &device, &mut Forward::eval());
        let loss = logits.mean();
        let _g = <B as AutodiffBackend>::backward(loss.into_primitive().tensor());
    });
    let r = load(std::path::Path::new(file), &[], &[]).unwrap();
    let data = kiln::data::load(&r).unwrap();
    let model = kiln::model::build(&r, &data.input_shape()).unwrap();
    let compute = <B as ComputeOn>::compute(model.as_ref(), &device, true);
    let params = model.init(0);
    let layout = model.layout().clone();
    let kiln_step = time(steps, || {
        let mut source = |u: usize| Ok(UnitParams::Host(params[layout.unit_range(u)].to_vec()));
        let mut g = Grads::Host(vec![0.0; params.len()]);
        let key = StepKey::new(0, [0; 3]);
        kiln::model::forward_backward(
            compute.as_ref(),
            &mut source,
            model.task().input(batch.clone()),
            key,
            1.0,
            &mut g,
            false,
        )
        .unwrap();
    });
    let n = batch.shape[0] as f64;
    println!(
        "{name:<4} bare Burn fwd+bwd {:>8.1} samples/s   kiln micro-step {:>8.1} samples/s   kiln overhead {:>5.1}%",
        n / bare,
        n / kiln_step,
        100.0 * (kiln_step - bare) / kiln_step
    );
}

/// The workloads' heaviest ops alone on Burn flex (milliseconds per call, forward + backward),
/// the same shapes `torch_ops` times in PyTorch (see CHANGELOG.md).
fn ops() {
    use burn::tensor::activation::{gelu, softmax};
    use burn::tensor::module::{conv2d, max_pool2d};
    use burn::tensor::ops::ConvOptions;
    use burn::tensor::Distribution;
    let d = Default::default();
    let rand = |shape: Vec<usize>| -> Tensor<B, 4> {
        Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &d).require_grad()
    };
    let ms = |name: &str, f: &mut dyn FnMut()| {
        println!("{name:<46} {:8.3} ms", 1e3 * time(20, f));
    };
    let opts = || ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
    let (x1, w1) = (rand(vec![32, 1, 28, 28]), rand(vec![32, 1, 3, 3]));
    let (x2, w2) = (rand(vec![32, 32, 14, 14]), rand(vec![64, 32, 3, 3]));
    ms("conv2d 1->32 28x28 fwd+bwd", &mut || {
        let y = conv2d(x1.clone(), w1.clone(), None, opts());
        let _ = y.sum().backward();
    });
    ms("conv2d 32->64 14x14 fwd+bwd", &mut || {
        let y = conv2d(x2.clone(), w2.clone(), None, opts());
        let _ = y.sum().backward();
    });
    let y = rand(vec![32, 32, 28, 28]);
    ms("max_pool2d 32x32x28x28 fwd+bwd", &mut || {
        let _ = max_pool2d(y.clone(), [2, 2], [2, 2], [0, 0], [1, 1], false)
            .sum()
            .backward();
    });
    let a = rand(vec![1, 1, 1024, 128]);
    let b = rand(vec![1, 1, 128, 384]);
    ms("matmul 1024x128 @ 128x384 fwd+bwd", &mut || {
        let _ = a.clone().matmul(b.clone()).sum().backward();
    });
    let (q, k) = (rand(vec![8, 4, 128, 32]), rand(vec![8, 4, 128, 32]));
    ms("attention scores+softmax 8x4x128x128 fwd+bwd", &mut || {
        let s = q.clone().matmul(k.clone().swap_dims(2, 3)).div_scalar(5.6);
        let _ = softmax(s, 3).sum().backward();
    });
    let g = rand(vec![1, 1, 1024, 512]);
    ms("gelu 1024x512 fwd+bwd", &mut || {
        let _ = gelu(g.clone()).sum().backward();
    });
}

fn main() {
    ops();
    let root = env!("CARGO_MANIFEST_DIR");
    let r = load(
        &std::path::Path::new(root).join("experiments/bench-cnn.toml"),
        &[],
        &[],
    )
    .unwrap();
    let cnn = kiln::model::cnn::Cnn::for_input(&r, &[1, 28, 28]).unwrap();
    let images: Vec<f32> = (0..32 * 28 * 28)
        .map(|i| ((i * 37) % 255) as f32 / 255.0)
        .collect();
    measure(
        "cnn",
        cnn,
        &format!("{root}/experiments/bench-cnn.toml"),
        TensorData::new(images.clone(), [32, 1, 28, 28]),
        Batch {
            x: kiln::data::Values::F32(images),
            shape: vec![32, 1, 28, 28],
            y: vec![3; 32],
            starts: None,
        },
        20,
    );
    let r = load(
        &std::path::Path::new(root).join("experiments/bench-gpt.toml"),
        &[],
        &[],
    )
    .unwrap();
    let gpt = kiln::model::gpt::Gpt::for_input(&r, &[129]).unwrap();
    let tokens: Vec<f32> = (0..8 * 129).map(|i| ((i * 31) % 256) as f32).collect();
    // the bare loop takes the model's input: 128 token ids per sample
    let inputs: Vec<i64> = tokens
        .chunks(129)
        .flat_map(|w| w[..128].iter().map(|&t| t as i64))
        .collect();
    measure(
        "gpt",
        gpt,
        &format!("{root}/experiments/bench-gpt.toml"),
        TensorData::new(inputs, [8, 128]),
        Batch {
            x: kiln::data::Values::Tokens(tokens.iter().map(|&t| t as u32).collect()),
            shape: vec![8, 129],
            y: vec![0; 8],
            starts: None,
        },
        5,
    );
}
