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
        self.per_rank_of(self.len)
    }

    fn per_rank_of(&self, len: usize) -> usize {
        if self.drop_last && !len.is_multiple_of(self.world) {
            len / self.world
        } else {
            len.div_ceil(self.world)
        }
    }

    /// Samples each rank takes from the part of an epoch that starts at global position `start`.
    pub fn per_rank_from(&self, start: usize) -> usize {
        self.per_rank_of(self.len - start.min(self.len))
    }

    /// The epoch's global order, padded or truncated to `per_rank() * world`.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        self.segment(epoch, 0)
    }

    /// The epoch's global order from position `start` on (what is left of an epoch after a
    /// resume, whatever the world size that consumed the first part), padded by wrapping around
    /// or truncated to a multiple of the world size.
    pub fn segment(&self, epoch: u64, start: usize) -> Vec<usize> {
        let full: Vec<usize> = if self.shuffle {
            Rng::stream(self.seed.wrapping_add(epoch), "sampler", &[]).permutation(self.len)
        } else {
            (0..self.len).collect()
        };
        let mut order = full[start.min(self.len)..].to_vec();
        let total = self.per_rank_of(order.len()) * self.world;
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
        self.indices_from(epoch, rank, 0)
    }

    /// The indices rank `rank` takes from the part of `epoch` that starts at `start`.
    pub fn indices_from(&self, epoch: u64, rank: usize, start: usize) -> Vec<usize> {
        self.segment(epoch, start)
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

    #[test]
    fn a_resumed_epoch_continues_the_same_order_under_another_world() {
        let two = Sampler {
            len: 12,
            world: 2,
            shuffle: true,
            seed: 1,
            drop_last: false,
        };
        let three = Sampler { world: 3, ..two };
        let order = two.epoch_order(4);
        // world 2 consumed the first 6 positions; world 3 takes the rest, each sample once
        let mut rest: Vec<usize> = (0..3).flat_map(|r| three.indices_from(4, r, 6)).collect();
        rest.sort_unstable();
        let mut want = order[6..].to_vec();
        want.sort_unstable();
        assert_eq!(rest, want);
        assert_eq!(three.per_rank_from(6), 2);
        // an uneven rest is padded by wrapping around within the rest
        assert_eq!(three.per_rank_from(4), 3);
        assert_eq!(three.segment(4, 4)[8], order[4]);
    }
}
