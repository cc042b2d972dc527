//! Optimizers over flat host `f32` buffers with PyTorch semantics (SGD with momentum/dampening 0 and
//! Nesterov, Adam with L2 weight decay, AdamW with decoupled decay). Working on flat buffers means
//! the same code updates a whole model (single, dp, ddp) or one rank's shard (fsdp), and its state
//! is plain vectors that checkpoint and reshard trivially. `device.rs` has the same optimizers as
//! Burn tensor ops for parameters kept on a device; one test holds the two equal.

use crate::checkpoint::OptState;
use crate::config::{OptimConfig, OptimKind};

#[derive(Debug, Clone, PartialEq)]
pub struct Optimizer {
    pub kind: OptimKind,
    pub momentum: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
    pub betas: [f32; 2],
    pub eps: f32,
    /// Steps taken so far.
    pub steps: u64,
    /// SGD momentum buffer, or Adam's first moment. Empty until the first step.
    pub m: Vec<f32>,
    /// Adam's second moment. Empty for SGD.
    pub v: Vec<f32>,
    /// Ranges of the buffer this optimizer steps that get no weight decay (sorted, disjoint):
    /// `optim.decay = "matrices"` exempts biases, norms and other 1-D parameters.
    pub no_decay: Vec<std::ops::Range<usize>>,
}

impl Optimizer {
    pub fn new(c: &OptimConfig) -> Self {
        Optimizer {
            kind: c.kind,
            momentum: c.momentum as f32,
            nesterov: c.nesterov,
            weight_decay: c.weight_decay as f32,
            betas: [c.betas[0] as f32, c.betas[1] as f32],
            eps: c.eps as f32,
            steps: 0,
            m: Vec::new(),
            v: Vec::new(),
            no_decay: Vec::new(),
        }
    }

    /// This optimizer with `no_decay` (buffer ranges without weight decay).
    pub fn with_no_decay(mut self, no_decay: Vec<std::ops::Range<usize>>) -> Self {
        self.no_decay = no_decay;
        self
    }

    /// The state to checkpoint.
    pub fn export(&self) -> OptState {
        OptState {
            steps: self.steps,
            m: self.m.clone(),
            v: self.v.clone(),
        }
    }

    /// Takes the state of `o` restricted to `range` (zero-padded to `len` elements).
    pub fn import(&mut self, o: &OptState, range: std::ops::Range<usize>, len: usize) {
        let take = |v: &[f32]| -> Vec<f32> {
            if v.is_empty() {
                return Vec::new();
            }
            let mut out = v[range.clone()].to_vec();
            out.resize(len, 0.0);
            out
        };
        self.steps = o.steps;
        self.m = take(&o.m);
        self.v = take(&o.v);
    }

    /// Takes the whole state of `o`.
    pub fn import_whole(&mut self, o: &OptState) {
        let n = o.m.len().max(o.v.len());
        self.import(o, 0..n, n);
    }

    /// Bytes of optimizer state held.
    pub fn state_bytes(&self) -> usize {
        (self.m.len() + self.v.len()) * std::mem::size_of::<f32>()
    }

    /// The buffer's segments in order, each with the weight decay it gets (`no_decay` ranges
    /// none).
    fn segments(&self, len: usize) -> Vec<(std::ops::Range<usize>, f32)> {
        let mut out = Vec::with_capacity(2 * self.no_decay.len() + 1);
        let mut at = 0;
        for r in &self.no_decay {
            let (s, e) = (r.start.min(len), r.end.min(len));
            if s > at {
                out.push((at..s, self.weight_decay));
            }
            if e > s.max(at) {
                out.push((s.max(at)..e, 0.0));
            }
            at = at.max(e);
        }
        if at < len {
            out.push((at..len, self.weight_decay));
        }
        out
    }

    /// One update of `params` by `grads` at learning rate `lr`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f64) {
        debug_assert_eq!(params.len(), grads.len());
        let lr = lr as f32;
        self.steps += 1;
        let segments = self.segments(params.len());
        match self.kind {
            OptimKind::Sgd => {
                if self.momentum == 0.0 {
                    for (r, wd) in segments {
                        for (p, g) in params[r.clone()].iter_mut().zip(&grads[r]) {
                            *p -= lr * (g + wd * *p);
                        }
                    }
                    return;
                }
                let mu = self.momentum;
                let first = self.m.is_empty();
                if first {
                    self.m = vec![0.0; params.len()];
                }
                for (r, wd) in segments {
                    let m = &mut self.m[r.clone()];
                    for ((p, g), b) in params[r.clone()].iter_mut().zip(&grads[r]).zip(m) {
                        let d = g + wd * *p;
                        *b = if first { d } else { mu * *b + d };
                        let upd = if self.nesterov { d + mu * *b } else { *b };
                        *p -= lr * upd;
                    }
                }
            }
            OptimKind::Adam | OptimKind::Adamw => {
                if self.m.is_empty() {
                    self.m = vec![0.0; params.len()];
                    self.v = vec![0.0; params.len()];
                }
                let [b1, b2] = self.betas;
                let t = self.steps as i32;
                let bc1 = 1.0 - b1.powi(t);
                let bc2_sqrt = (1.0 - b2.powi(t)).sqrt();
                let step_size = lr / bc1;
                let decoupled = self.kind == OptimKind::Adamw;
                for (r, wd) in segments {
                    let step = crate::kernels::AdamStep {
                        lr,
                        wd,
                        b1,
                        b2,
                        bc2_sqrt,
                        step_size,
                        eps: self.eps,
                        decoupled,
                    };
                    crate::kernels::adam_update(
                        &mut params[r.clone()],
                        &grads[r.clone()],
                        &mut self.m[r.clone()],
                        &mut self.v[r],
                        step,
                    );
                }
            }
        }
    }
}

/// Sum of squares of a gradient buffer (f64 accumulation in fixed chunks over the rank's
/// threads, the chunks added in order: `kernels::sum_squares`).
pub fn sum_squares(grads: &[f32]) -> f64 {
    crate::kernels::sum_squares(grads)
}

/// torch `clip_grad_norm_`'s factor for gradients whose global norm is `total_norm`: `None` when
/// they are within `max_norm` already. Every clipping path (host, device, sharded) uses this.
pub fn clip_coef(total_norm: f64, max_norm: f64) -> Option<f64> {
    let coef = max_norm / (total_norm + 1e-6);
    (coef < 1.0).then_some(coef)
}

/// torch `clip_grad_norm_`: scales `grads` so the global norm is at most `max_norm`, given the
/// global norm computed over every shard. Returns the norm before clipping.
pub fn clip_by_norm(grads: &mut [f32], total_norm: f64, max_norm: f64) -> f64 {
    if let Some(coef) = clip_coef(total_norm, max_norm) {
        crate::kernels::scale(grads, coef as f32);
    }
    total_norm
}

/// Clips by the global norm of whole (already synchronised) gradients, then steps.
pub fn clip_and_step(
    opt: &mut Optimizer,
    params: &mut [f32],
    grads: &mut [f32],
    lr: f64,
    clip: Option<f64>,
) {
    if let Some(max_norm) = clip {
        let norm = sum_squares(grads).sqrt();
        clip_by_norm(grads, norm, max_norm);
    }
    opt.step(params, grads, lr);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(kind: OptimKind, momentum: f64, nesterov: bool, wd: f64) -> Optimizer {
        Optimizer::new(&OptimConfig {
            kind,
            lr: 0.1,
            momentum,
            nesterov,
            weight_decay: wd,
            ..OptimConfig::default()
        })
    }

    #[test]
    fn sgd_momentum_matches_torch_by_hand() {
        // torch: buf = g (first), then buf = mu*buf + g; p -= lr*buf
        let mut o = opt(OptimKind::Sgd, 0.9, false, 0.0);
        let mut p = vec![1.0f32];
        o.step(&mut p, &[0.5], 0.1);
        assert!((p[0] - 0.95).abs() < 1e-7);
        o.step(&mut p, &[0.5], 0.1);
        // buf = 0.9*0.5 + 0.5 = 0.95
        assert!((p[0] - (0.95 - 0.095)).abs() < 1e-6);
    }

    #[test]
    fn adam_first_step_is_lr_sized() {
        let mut o = opt(OptimKind::Adam, 0.0, false, 0.0);
        let mut p = vec![0.0f32, 0.0];
        o.step(&mut p, &[3.0, -0.001], 0.1);
        assert!((p[0] + 0.1).abs() < 1e-5, "{}", p[0]);
        assert!((p[1] - 0.1).abs() < 1e-3, "{}", p[1]);
        assert_eq!(o.state_bytes(), 16);
    }

    #[test]
    fn adamw_decays_decoupled() {
        let mut o = opt(OptimKind::Adamw, 0.0, false, 0.5);
        let mut p = vec![2.0f32];
        o.step(&mut p, &[0.0], 0.1);
        // p *= 1 - 0.1*0.5, zero gradient moves nothing else
        assert!((p[0] - 1.9).abs() < 1e-6);
    }

    #[test]
    fn undecayed_ranges_get_no_weight_decay_and_the_rest_is_unchanged() {
        for kind in [OptimKind::Sgd, OptimKind::Adam, OptimKind::Adamw] {
            let grads = [0.3f32, -0.2, 0.1, 0.4, -0.5, 0.25];
            let mut all = opt(kind, 0.9, false, 0.5);
            let mut part = opt(kind, 0.9, false, 0.5).with_no_decay(vec![1..3, 5..6]);
            let mut none = opt(kind, 0.9, false, 0.0);
            let (mut a, mut b, mut c) = ([1.0f32; 6], [1.0f32; 6], [1.0f32; 6]);
            for _ in 0..3 {
                all.step(&mut a, &grads, 0.1);
                part.step(&mut b, &grads, 0.1);
                none.step(&mut c, &grads, 0.1);
            }
            for i in 0..6 {
                let want = if matches!(i, 1 | 2 | 5) { c[i] } else { a[i] };
                assert_eq!(b[i].to_bits(), want.to_bits(), "{kind:?} [{i}]");
            }
        }
    }

    #[test]
    fn clipping_scales_to_max_norm() {
        let mut g = vec![3.0f32, 4.0];
        let n = sum_squares(&g).sqrt();
        clip_by_norm(&mut g, n, 1.0);
        assert!((sum_squares(&g).sqrt() - 1.0).abs() < 1e-5);
    }
}
