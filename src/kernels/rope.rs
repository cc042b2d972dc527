//! Rotary position embeddings (RoPE) of the query and key heads of a `qkv` buffer, in one pass
//! over its rows, forward and backward: each head's halves `x1`, `x2` become `x1 cos - x2 sin`
//! and `x2 cos + x1 sin` (transformers' `x cos + rotate_half(x) sin`), and a gradient goes back
//! through the transposed rotation (`g1 cos + g2 sin`, `g2 cos - g1 sin`). The attention kernel
//! runs it on the projection it reads, so the rotated q and k are never separate tensors.

use std::sync::Arc;

use super::attention::Dims;
use super::dense;
use super::math::multiversion;

/// The rotation of every row: the tables of cos and sin of each position's angles (`[positions,
/// head_dim]` row by row, each frequency twice, halves side by side), and each row's position.
#[derive(Debug, Clone)]
pub struct Rope {
    pub cos: Arc<[f32]>,
    pub sin: Arc<[f32]>,
    /// Row b's position i's place in its document (packed rows), `[n * t]`; `None`: `i`.
    pub positions: Option<Arc<[u32]>>,
}

// one row's heads (`heads` of `hd` channels side by side at the row's start) rotated in place
// by the angles of `cos` and `sin` (`hd` values each), or by their transpose with `inverse`
multiversion! {
    fn rotate_row(row: &mut [f32], cos: &[f32], sin: &[f32], heads: usize, hd: usize, inverse: bool) {
        let half = hd / 2;
        let (c1, c2) = cos[..hd].split_at(half);
        let (s1, s2) = sin[..hd].split_at(half);
        for head in row[..heads * hd].chunks_exact_mut(hd) {
            let (x1, x2) = head.split_at_mut(half);
            if inverse {
                for j in 0..half {
                    let (a, b) = (x1[j], x2[j]);
                    x1[j] = a * c1[j] + b * s2[j];
                    x2[j] = b * c2[j] - a * s1[j];
                }
            } else {
                for j in 0..half {
                    let (a, b) = (x1[j], x2[j]);
                    x1[j] = a * c1[j] - b * s1[j];
                    x2[j] = b * c2[j] + a * s2[j];
                }
            }
        }
    }
}

impl Rope {
    /// Whether the tables and positions fit rows of shape `d`.
    pub(super) fn fits(&self, d: &Dims) -> bool {
        let hd = d.hd;
        if hd == 0
            || !hd.is_multiple_of(2)
            || self.cos.len() != self.sin.len()
            || !self.cos.len().is_multiple_of(hd)
        {
            return false;
        }
        let rows = self.cos.len() / hd;
        match &self.positions {
            Some(p) => p.len() == d.n * d.t && p.iter().all(|&v| (v as usize) < rows),
            None => d.t <= rows,
        }
    }

    /// Row `r`'s (of `[n * t]`) position.
    fn position(&self, r: usize, t: usize) -> usize {
        match &self.positions {
            Some(p) => p[r] as usize,
            None => r % t,
        }
    }

    /// The q and k heads of every row of `qkv` (rows of `d.width()` values) rotated in place,
    /// or (`inverse`) a gradient of them rotated back; the v heads are left as they are.
    pub(super) fn apply(&self, qkv: &mut [f32], d: &Dims, inverse: bool) {
        let (w, hd) = (d.width(), d.hd);
        let heads = d.heads + d.kv_heads;
        dense::for_rows(qkv, w, |first, chunk| {
            for (i, row) in chunk.chunks_exact_mut(w).enumerate() {
                let at = self.position(first + i, d.t) * hd;
                let (c, s) = (&self.cos[at..at + hd], &self.sin[at..at + hd]);
                rotate_row(row, c, s, heads, hd, inverse);
            }
        });
    }
}
