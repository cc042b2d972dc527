//! Adam's and AdamW's update over flat `f32` buffers in one pass, compiled for AVX-512, AVX2
//! and the baseline (`multiversion!`): the same operations in the same order as the scalar
//! loop (no fused multiply-adds), so every width gives the same bits.

use super::math::multiversion;

/// One Adam(W) step's constants for one range of parameters.
#[derive(Debug, Clone, Copy)]
pub struct AdamStep {
    /// The learning rate.
    pub lr: f32,
    /// The range's weight decay.
    pub wd: f32,
    pub b1: f32,
    pub b2: f32,
    /// sqrt(1 - b2^t).
    pub bc2_sqrt: f32,
    /// lr / (1 - b1^t).
    pub step_size: f32,
    pub eps: f32,
    /// AdamW (the decay applied to the weight) rather than Adam (added to the gradient).
    pub decoupled: bool,
}

multiversion! {
    fn update(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: AdamStep) {
        let n = p.len().min(g.len()).min(m.len()).min(v.len());
        let (p, g, m, v) = (&mut p[..n], &g[..n], &mut m[..n], &mut v[..n]);
        let decay = 1.0 - s.lr * s.wd;
        for i in 0..n {
            let gi = if s.decoupled {
                p[i] *= decay;
                g[i]
            } else {
                g[i] + s.wd * p[i]
            };
            m[i] = s.b1 * m[i] + (1.0 - s.b1) * gi;
            v[i] = s.b2 * v[i] + (1.0 - s.b2) * gi * gi;
            let denom = v[i].sqrt() / s.bc2_sqrt + s.eps;
            p[i] -= s.step_size * m[i] / denom;
        }
    }
}

/// Updates `params` (and the moments `m`, `v`) by `grads`: torch's Adam/AdamW step.
pub fn adam_update(params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], s: AdamStep) {
    update(params, grads, m, v, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar loop the optimizer ran before, for comparison.
    fn scalar(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: AdamStep) {
        for i in 0..p.len() {
            let gi = if s.decoupled {
                p[i] *= 1.0 - s.lr * s.wd;
                g[i]
            } else {
                g[i] + s.wd * p[i]
            };
            m[i] = s.b1 * m[i] + (1.0 - s.b1) * gi;
            v[i] = s.b2 * v[i] + (1.0 - s.b2) * gi * gi;
            let denom = v[i].sqrt() / s.bc2_sqrt + s.eps;
            p[i] -= s.step_size * m[i] / denom;
        }
    }

    #[test]
    fn the_vectorized_update_gives_the_scalar_loops_bits() {
        let n = 1037;
        let vals = |k: u32| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(k) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        for decoupled in [false, true] {
            let s = AdamStep {
                lr: 1e-3,
                wd: 0.1,
                b1: 0.9,
                b2: 0.99,
                bc2_sqrt: (1.0f32 - 0.99f32.powi(3)).sqrt(),
                step_size: 1e-3 / (1.0 - 0.9f32.powi(3)),
                eps: 1e-8,
                decoupled,
            };
            let (mut p1, g, mut m1, mut v1) = (vals(1), vals(2), vals(3), vals(4));
            let v1a: Vec<f32> = v1.iter().map(|x| x.abs()).collect();
            v1 = v1a;
            let (mut p2, mut m2, mut v2) = (p1.clone(), m1.clone(), v1.clone());
            adam_update(&mut p1, &g, &mut m1, &mut v1, s);
            scalar(&mut p2, &g, &mut m2, &mut v2, s);
            assert_eq!(p1, p2);
            assert_eq!(m1, m2);
            assert_eq!(v1, v2);
        }
    }
}
