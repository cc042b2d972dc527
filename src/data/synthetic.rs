//! A learnable synthetic classification task. A fixed random teacher draws a low-dimensional latent
//! z ~ N(0, I), labels it by a random linear map (label = argmax of z·W), and embeds it in the
//! feature space through a random projection plus noise (x = A·z + noise). The low latent rank
//! makes the task learnable in a few dozen SGD steps even with many features. Same seed, same
//! data, on every machine.

/// Dimension of the latent the labels depend on.
const LATENT: usize = 16;
/// Standard deviation of the per-feature noise.
const NOISE: f64 = 0.5;

use super::tokens::{TokenStore, Windows};
use super::{Data, Dataset};
use crate::config::DataConfig;
use crate::rng::Rng;

struct Teacher {
    latent: usize,
    /// [latent, classes]
    w: Vec<f64>,
    /// [latent, features]
    a: Vec<f64>,
}

fn draw(n: usize, t: &Teacher, shape: &[usize], classes: usize, rng: &mut Rng) -> Dataset {
    let features: usize = shape.iter().product();
    let mut x = Vec::with_capacity(n * features);
    let mut y = Vec::with_capacity(n);
    let mut row = vec![0f64; features];
    for _ in 0..n {
        let z: Vec<f64> = (0..t.latent).map(|_| rng.normal()).collect();
        let mut best = (0, f64::NEG_INFINITY);
        for c in 0..classes {
            let s: f64 = z
                .iter()
                .enumerate()
                .map(|(l, zl)| zl * t.w[l * classes + c])
                .sum();
            if s > best.1 {
                best = (c, s);
            }
        }
        y.push(best.0 as u32);
        row.iter_mut().for_each(|v| *v = NOISE * rng.normal());
        for (l, zl) in z.iter().enumerate() {
            for (v, a) in row.iter_mut().zip(&t.a[l * features..(l + 1) * features]) {
                *v += zl * a;
            }
        }
        x.extend(row.iter().map(|v| *v as f32));
    }
    Dataset::rows(shape.to_vec(), x, y)
}

pub fn generate(c: &DataConfig) -> Data {
    let shape = if c.image.is_empty() {
        vec![c.features]
    } else {
        c.image.clone()
    };
    let (f, k) = (shape.iter().product::<usize>(), c.classes);
    let latent = LATENT.min(f);
    let mut trng = Rng::stream(c.seed, "synthetic-teacher", &[]);
    let scale = 1.0 / (latent as f64).sqrt();
    let teacher = Teacher {
        latent,
        w: (0..latent * k).map(|_| trng.normal()).collect(),
        a: (0..latent * f).map(|_| trng.normal() * scale).collect(),
    };
    let train = draw(
        c.samples,
        &teacher,
        &shape,
        k,
        &mut Rng::stream(c.seed, "synthetic-train", &[]),
    );
    let eval = (c.eval_samples > 0).then(|| {
        draw(
            c.eval_samples,
            &teacher,
            &shape,
            k,
            &mut Rng::stream(c.seed, "synthetic-eval", &[]),
        )
    });
    Data { train, eval }
}

/// Windows of `width` uniformly random tokens in `0..vocab` (a language-model workload for
/// benchmarks: there is nothing to learn).
pub fn tokens(c: &DataConfig, vocab: usize, width: usize) -> Data {
    let draw = |n: usize, purpose: &str| {
        let mut rng = Rng::stream(c.seed, purpose, &[]);
        let ids: Vec<u32> = (0..n * width)
            .map(|_| rng.below(vocab.max(1) as u64) as u32)
            .collect();
        let store = std::sync::Arc::new(TokenStore::Ids(ids));
        Dataset::windows(Windows::over(store, 0, n * width, width, width, vocab))
    };
    Data {
        train: draw(c.samples, "synthetic-tokens-train"),
        eval: (c.eval_samples > 0).then(|| draw(c.eval_samples, "synthetic-tokens-eval")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_uses_every_class() {
        let c = DataConfig {
            samples: 300,
            features: 8,
            classes: 3,
            ..DataConfig::default()
        };
        let a = generate(&c);
        let b = generate(&c);
        assert_eq!(a.train, b.train);
        let (x, y) = a.train.rows_ref().unwrap();
        for k in 0..3 {
            assert!(y.contains(&k));
        }
        let (ex, _) = a.eval.as_ref().unwrap().rows_ref().unwrap();
        assert_ne!(x[..8], ex[..8]);
    }
}
