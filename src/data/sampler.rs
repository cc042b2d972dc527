//! The distributed sampler, with torch `DistributedSampler` semantics: the indices of an epoch are
//! 0..n or a permutation seeded by (seed + epoch); unless `drop_last` they are padded by wrapping
//! around to a multiple of the world size (else the tail is dropped); rank r takes every
//! world-th index starting at r. The order depends on (seed, epoch) only, never on world size.

use crate::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampler {
    pub len: usize,
    pub world: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub drop_last: bool,
}

impl Sampler {
    /// Samples each rank takes per epoch (torch `num_samples`).
    pub fn per_rank(&self) -> usize {
        if self.drop_last && self.len % self.world != 0 {
            self.len / self.world
        } else {
            self.len.div_ceil(self.world)
        }
    }

    /// The epoch's global order, padded or truncated to `per_rank() * world`.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = if self.shuffle {
            Rng::stream(self.seed.wrapping_add(epoch), "sampler", &[]).permutation(self.len)
        } else {
            (0..self.len).collect()
        };
        let total = self.per_rank() * self.world;
        if total <= order.len() {
            order.truncate(total);
        } else {
            let base = order.clone();
            while order.len() < total {
                let need = total - order.len();
                order.extend_from_slice(&base[..need.min(base.len())]);
            }
        }
        order
    }

    /// The indices rank `rank` takes in `epoch`.
    pub fn indices(&self, epoch: u64, rank: usize) -> Vec<usize> {
        self.epoch_order(epoch)
            .into_iter()
            .skip(rank)
            .step_by(self.world)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(world: usize, shuffle: bool, drop_last: bool) -> Sampler {
        Sampler {
            len: 10,
            world,
            shuffle,
            seed: 0,
            drop_last,
        }
    }

    #[test]
    fn matches_torch_without_shuffle() {
        // torch.utils.data.DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False)
        let pad = s(3, false, false);
        assert_eq!(pad.indices(0, 0), vec![0, 3, 6, 9]);
        assert_eq!(pad.indices(0, 1), vec![1, 4, 7, 0]);
        assert_eq!(pad.indices(0, 2), vec![2, 5, 8, 1]);
        let drop = s(3, false, true);
        assert_eq!(drop.indices(0, 0), vec![0, 3, 6]);
        assert_eq!(drop.indices(0, 1), vec![1, 4, 7]);
        assert_eq!(drop.indices(0, 2), vec![2, 5, 8]);
    }

    #[test]
    fn pads_by_wrapping_more_than_once() {
        let tiny = Sampler {
            len: 2,
            world: 5,
            shuffle: false,
            seed: 0,
            drop_last: false,
        };
        assert_eq!(tiny.epoch_order(0), vec![0, 1, 0, 1, 0]);
    }

    #[test]
    fn shuffle_is_disjoint_covering_and_seeded() {
        let sh = Sampler {
            len: 12,
            world: 3,
            shuffle: true,
            seed: 5,
            drop_last: false,
        };
        for epoch in 0..3 {
            let mut all: Vec<usize> = (0..3).flat_map(|r| sh.indices(epoch, r)).collect();
            all.sort_unstable();
            assert_eq!(all, (0..12).collect::<Vec<_>>());
        }
        assert_ne!(sh.indices(0, 0), sh.indices(1, 0));
        assert_eq!(sh.indices(1, 2), sh.clone().indices(1, 2));
        let other = Sampler { seed: 6, ..sh };
        assert_ne!(sh.epoch_order(0), other.epoch_order(0));
    }
}
