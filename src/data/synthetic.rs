//! A learnable synthetic classification task: Gaussian inputs labelled by a fixed random linear
//! teacher (label = argmax of x·W). Same seed, same data, on every machine.

use super::{Data, Dataset};
use crate::config::DataConfig;
use crate::rng::Rng;

fn draw(n: usize, teacher: &[f32], features: usize, classes: usize, rng: &mut Rng) -> Dataset {
    let mut x = Vec::with_capacity(n * features);
    let mut y = Vec::with_capacity(n);
    let mut scores = vec![0f32; classes];
    for _ in 0..n {
        let row_start = x.len();
        for _ in 0..features {
            x.push(rng.normal() as f32);
        }
        scores.iter_mut().for_each(|s| *s = 0.0);
        for (f, xv) in x[row_start..].iter().enumerate() {
            let w = &teacher[f * classes..(f + 1) * classes];
            for (s, wv) in scores.iter_mut().zip(w) {
                *s += xv * wv;
            }
        }
        let mut best = 0;
        for (c, s) in scores.iter().enumerate() {
            if *s > scores[best] {
                best = c;
            }
        }
        y.push(best as u32);
    }
    Dataset { features, x, y }
}

pub fn generate(c: &DataConfig) -> Data {
    let (f, k) = (c.features, c.classes);
    let mut trng = Rng::stream(c.seed, "synthetic-teacher", &[]);
    let teacher: Vec<f32> = (0..f * k).map(|_| trng.normal() as f32).collect();
    let train = draw(c.samples, &teacher, f, k, &mut Rng::stream(c.seed, "synthetic-train", &[]));
    let eval = (c.eval_samples > 0)
        .then(|| draw(c.eval_samples, &teacher, f, k, &mut Rng::stream(c.seed, "synthetic-eval", &[])));
    Data { train, eval }
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
        for k in 0..3 {
            assert!(a.train.y.contains(&k));
        }
        assert_ne!(a.train.x[..8], a.eval.as_ref().unwrap().x[..8]);
    }
}
