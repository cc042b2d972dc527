//! Adam's and AdamW's update over flat `f32` buffers in one pass, compiled for AVX-512, AVX2
//! and the baseline (`multiversion!`): the same operations in the same order as the scalar
//! loop (no fused multiply-adds), so every width gives the same bits. The buffers are split
//! over the rank's threads in chunks of a fixed size; each value's update reads only its own
//! values, so the thread count changes no bit. The gradient's sum of squares (for clipping) is
//! summed in fixed chunks too, their partial sums added in chunk order.

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

/// Values per chunk of work in the elementwise passes and the sum of squares (a constant, never
/// the thread count, so every result is the same whatever the threads).
const CHUNK: usize = 1 << 15;

/// Updates `params` (and the moments `m`, `v`) by `grads`: torch's Adam/AdamW step, over the
/// rank's threads.
pub fn adam_update(params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32], s: AdamStep) {
    use rayon::prelude::*;
    if params.len() <= CHUNK {
        return update(params, grads, m, v, s);
    }
    params
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .for_each(|(((p, g), m), v)| update(p, g, m, v, s));
}

multiversion! {
    fn squares(v: &[f32]) -> f64 {
        // eight running sums (the compiler keeps them in vector lanes), added at the end
        let mut acc = [0.0f64; 8];
        let mut it = v.chunks_exact(8);
        for c in &mut it {
            for (a, x) in acc.iter_mut().zip(c) {
                let x = f64::from(*x);
                *a += x * x;
            }
        }
        for (a, x) in acc.iter_mut().zip(it.remainder()) {
            let x = f64::from(*x);
            *a += x * x;
        }
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
    }
}

/// The sum of the squares of `v` in f64: fixed chunks over the rank's threads, each summed in
/// eight lanes, the chunks' sums added in order (the same value whatever the thread count).
pub fn sum_squares(v: &[f32]) -> f64 {
    use rayon::prelude::*;
    if v.len() <= CHUNK {
        return squares(v);
    }
    let parts: Vec<f64> = v.par_chunks(CHUNK).map(squares).collect();
    parts.iter().sum()
}

/// `v *= c`, over the rank's threads.
pub fn scale(v: &mut [f32], c: f32) {
    use rayon::prelude::*;
    v.par_chunks_mut(CHUNK)
        .for_each(|p| p.iter_mut().for_each(|x| *x *= c));
}

/// `a += b` value by value, over the rank's threads.
pub fn add_into(a: &mut [f32], b: &[f32]) {
    use rayon::prelude::*;
    a.par_chunks_mut(CHUNK)
        .zip(b.par_chunks(CHUNK))
        .for_each(|(x, y)| x.iter_mut().zip(y).for_each(|(x, y)| *x += y));
}

/// Whether every value of `v` is finite, over the rank's threads.
pub fn all_finite(v: &[f32]) -> bool {
    use rayon::prelude::*;
    v.par_chunks(CHUNK)
        .all(|c| c.iter().fold(true, |ok, x| ok & x.is_finite()))
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
    fn the_sum_of_squares_is_the_sequential_sum_to_rounding_and_the_same_on_any_thread_count() {
        let v = vals(3 * CHUNK + 1234, 0);
        let seq = seq_of(&v);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let three = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let (a, b) = (
            one.install(|| sum_squares(&v)),
            three.install(|| sum_squares(&v)),
        );
        assert_eq!(a.to_bits(), b.to_bits());
        assert!((a - seq).abs() <= 1e-12 * seq, "{a} vs {seq}");
        assert_eq!(sum_squares(&v[..5]), seq_of(&v[..5]));
        let mut w = v.clone();
        w[CHUNK + 7] = f32::NAN;
        assert!(all_finite(&v) && !all_finite(&w));
        w[CHUNK + 7] = f32::NEG_INFINITY;
        assert!(!all_finite(&w));
    }

    /// `n` values in [-1, 1] spread by a multiplicative hash, `k` picking the sequence.
    fn vals(n: usize, k: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(k) % 2001) as f32 / 1000.0
                    - 1.0
            })
            .collect()
    }

    fn seq_of(v: &[f32]) -> f64 {
        v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum()
    }

    #[test]
    fn the_update_split_over_threads_gives_the_same_bits() {
        let n = 2 * CHUNK + 77;
        let vals = |k: u32| vals(n, k);
        let s = AdamStep {
            lr: 1e-3,
            wd: 0.1,
            b1: 0.9,
            b2: 0.99,
            bc2_sqrt: 0.1,
            step_size: 1e-2,
            eps: 1e-8,
            decoupled: true,
        };
        let (mut p1, g, mut m1) = (vals(1), vals(2), vals(3));
        let mut v1: Vec<f32> = vals(4).iter().map(|x| x.abs()).collect();
        let (mut p2, mut m2, mut v2) = (p1.clone(), m1.clone(), v1.clone());
        let three = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        three.install(|| adam_update(&mut p1, &g, &mut m1, &mut v1, s));
        scalar(&mut p2, &g, &mut m2, &mut v2, s);
        assert_eq!(p1, p2);
        assert_eq!(v1, v2);
    }

    #[test]
    fn the_vectorized_update_gives_the_scalar_loops_bits() {
        let n = 1037;
        let vals = |k: u32| vals(n, k);
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
