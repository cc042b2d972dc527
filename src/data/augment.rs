//! `[data.augment]`: random transformations of training images, torchvision's
//! `RandomCrop(size, padding)` then `RandomHorizontalFlip()`. Every draw comes from kiln's
//! counter-based RNG keyed by (seed, epoch, sample index), never from a stream a thread consumes,
//! so a sample looks the same whichever loader thread or rank assembles it, and after a resume.

use crate::config::{AugmentConfig, DataConfig};
use crate::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Augment {
    /// Padding on each side before the random crop (0: no crop).
    pub pad: usize,
    pub hflip: bool,
    /// The value padded pixels take: a black pixel after `data.normalize`.
    pub fill: f32,
    pub seed: u64,
}

impl Augment {
    /// The augmentation `c` asks for, `None` when it asks for none.
    pub fn new(c: &DataConfig, seed: u64) -> Option<Augment> {
        let a: &AugmentConfig = c.augment.as_ref()?;
        if a.random_crop == 0 && !a.hflip {
            return None;
        }
        // `data.normalize` applies to idx images only (synthetic ones are made as they are)
        let fill = match (c.kind, c.normalize.as_slice()) {
            (crate::config::DataKind::Idx, [mean, std]) => ((0.0 - mean) / std) as f32,
            _ => 0.0,
        };
        Some(Augment {
            pad: a.random_crop,
            hflip: a.hflip,
            fill,
            seed,
        })
    }

    /// Transforms `sample` (one `[C, H, W]` image, row-major) in place, as drawn for sample
    /// `index` in `epoch`. `scratch` is reused between calls.
    pub fn apply(
        &self,
        epoch: u64,
        index: usize,
        shape: &[usize],
        sample: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        let &[c, h, w] = shape else { return };
        let mut rng = Rng::stream(self.seed, "augment", &[epoch, index as u64]);
        let span = 2 * self.pad as u64 + 1;
        let (dy, dx) = if self.pad > 0 {
            (rng.below(span) as isize, rng.below(span) as isize)
        } else {
            (self.pad as isize, self.pad as isize)
        };
        let flip = self.hflip && rng.next_u64() >> 63 == 1;
        scratch.clear();
        scratch.extend_from_slice(sample);
        let pad = self.pad as isize;
        for ch in 0..c {
            let plane = &scratch[ch * h * w..(ch + 1) * h * w];
            let out = &mut sample[ch * h * w..(ch + 1) * h * w];
            for y in 0..h {
                // row y of the crop is row y + dy of the padded image: y + dy - pad of the input
                let sy = y as isize + dy - pad;
                for x in 0..w {
                    let ox = if flip { w - 1 - x } else { x };
                    let sx = x as isize + dx - pad;
                    out[y * w + ox] =
                        if (0..h as isize).contains(&sy) && (0..w as isize).contains(&sx) {
                            plane[sy as usize * w + sx as usize]
                        } else {
                            self.fill
                        };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aug(pad: usize, hflip: bool) -> Augment {
        Augment {
            pad,
            hflip,
            fill: -1.0,
            seed: 3,
        }
    }

    #[test]
    fn crops_stay_inside_the_padding_and_flips_mirror() {
        let img: Vec<f32> = (0..2 * 3 * 4).map(|v| v as f32).collect();
        let mut scratch = Vec::new();
        // padding 0 and no flip is the identity
        let mut same = img.clone();
        Augment {
            pad: 0,
            hflip: false,
            ..aug(0, false)
        }
        .apply(0, 0, &[2, 3, 4], &mut same, &mut scratch);
        assert_eq!(same, img);
        let mut seen_flip = false;
        let mut seen_shift = false;
        for index in 0..64 {
            let mut out = img.clone();
            aug(1, true).apply(5, index, &[2, 3, 4], &mut out, &mut scratch);
            // the same draw every time for (epoch, index)
            let mut again = img.clone();
            aug(1, true).apply(5, index, &[2, 3, 4], &mut again, &mut scratch);
            assert_eq!(out, again);
            // every output pixel is the fill or an input pixel of the same channel, and rows
            // keep their order
            for ch in 0..2 {
                for v in &out[ch * 12..(ch + 1) * 12] {
                    assert!(*v == -1.0 || (ch * 12..(ch + 1) * 12).contains(&(*v as usize)));
                }
            }
            let row: Vec<f32> = out[4..8].to_vec();
            let inner: Vec<f32> = row.iter().copied().filter(|v| *v >= 0.0).collect();
            if inner.len() >= 2 && inner[0] > inner[1] {
                seen_flip = true;
            }
            if out != img && out.contains(&-1.0) {
                seen_shift = true;
            }
        }
        assert!(seen_flip && seen_shift);
        // another epoch draws differently
        let draws = |epoch| {
            (0..16)
                .map(|i| {
                    let mut o = img.clone();
                    aug(2, true).apply(epoch, i, &[2, 3, 4], &mut o, &mut Vec::new());
                    o
                })
                .collect::<Vec<_>>()
        };
        assert_ne!(draws(0), draws(1));
    }

    #[test]
    fn a_flip_alone_mirrors_each_row_exactly() {
        let img: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let (mut flipped, mut kept) = (0, 0);
        for index in 0..32 {
            let mut o = img.clone();
            aug(0, true).apply(0, index, &[1, 2, 3], &mut o, &mut Vec::new());
            if o == [2.0, 1.0, 0.0, 5.0, 4.0, 3.0] {
                flipped += 1;
            } else {
                assert_eq!(o, img);
                kept += 1;
            }
        }
        assert!(flipped > 5 && kept > 5, "{flipped} flipped, {kept} kept");
    }
}
