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
    /// Shuffle with a permutation computed index by index (a keyed Feistel bijection), not held
    /// in memory: token files, whose windows can number billions. Its order is another
    /// permutation than the in-memory one's (both seeded by seed + epoch).
    pub lazy: bool,
}

/// An epoch's order of the dataset: 0..n, a permutation in memory, or one computed per index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EpochOrder {
    Identity(usize),
    Held(Vec<usize>),
    Keyed { n: usize, key: u64 },
}

impl EpochOrder {
    pub fn len(&self) -> usize {
        match self {
            EpochOrder::Identity(n) | EpochOrder::Keyed { n, .. } => *n,
            EpochOrder::Held(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The sample at position `i` of the order.
    pub fn get(&self, i: usize) -> usize {
        match self {
            EpochOrder::Identity(_) => i,
            EpochOrder::Held(v) => v[i],
            EpochOrder::Keyed { n, key } => feistel(*key, *n, i),
        }
    }
}

/// A bijection of `0..n` keyed by `key`, computed for one index: a 4-round Feistel network on
/// the smallest even number of bits that covers `n`, walking the cycle until it lands below `n`
/// (each step stays a bijection of the larger domain, so the walk ends and the whole is one of
/// `0..n`).
pub(crate) fn feistel(key: u64, n: usize, i: usize) -> usize {
    if n <= 1 {
        return i;
    }
    let bits = (usize::BITS - (n - 1).leading_zeros()).max(2);
    let half = bits.div_ceil(2);
    let mask = (1u64 << half) - 1;
    let mut x = i as u64;
    loop {
        let (mut l, mut r) = (x >> half, x & mask);
        for round in 0..4u64 {
            let f = crate::rng::mix64(key ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ r) & mask;
            (l, r) = (r, l ^ f);
        }
        x = (l << half) | r;
        if (x as usize) < n {
            return x as usize;
        }
    }
}

/// What is left of an epoch from global position `start` on, as the ranks take it: positions
/// `0..total` of the rest of the order, wrapping around within the rest to pad (or truncated)
/// to a multiple of the world size; rank r takes positions r, r + world, ...
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    order: EpochOrder,
    start: usize,
    world: usize,
    /// The positions the ranks take together.
    pub total: usize,
}

impl Segment {
    /// The sample at position `q` of the segment.
    pub fn global(&self, q: usize) -> usize {
        let rest = self.order.len() - self.start;
        self.order.get(self.start + q % rest.max(1))
    }
    /// The `k`-th sample rank `rank` takes.
    pub fn of_rank(&self, rank: usize, k: usize) -> usize {
        self.global(rank + k * self.world)
    }
    /// Samples each rank takes.
    pub fn per_rank(&self) -> usize {
        self.total / self.world.max(1)
    }
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

    /// The order of `epoch`: a permutation seeded by seed + epoch when shuffling.
    pub fn order(&self, epoch: u64) -> EpochOrder {
        let seed = self.seed.wrapping_add(epoch);
        match (self.shuffle, self.lazy) {
            (false, _) => EpochOrder::Identity(self.len),
            (true, false) => {
                EpochOrder::Held(Rng::stream(seed, "sampler", &[]).permutation(self.len))
            }
            (true, true) => EpochOrder::Keyed {
                n: self.len,
                key: crate::rng::derive(seed, "sampler-keyed", &[]),
            },
        }
    }

    /// The part of `epoch` that starts at global position `start` (what is left of an epoch
    /// after a resume, whatever the world size that consumed the first part).
    pub fn segment_of(&self, epoch: u64, start: usize) -> Segment {
        let start = start.min(self.len);
        Segment {
            order: self.order(epoch),
            start,
            world: self.world,
            total: self.per_rank_of(self.len - start) * self.world,
        }
    }

    /// The epoch's global order, padded or truncated to `per_rank() * world`.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        self.segment(epoch, 0)
    }

    /// The epoch's global order from position `start` on, padded by wrapping around or
    /// truncated to a multiple of the world size (`segment_of`, listed).
    pub fn segment(&self, epoch: u64, start: usize) -> Vec<usize> {
        let seg = self.segment_of(epoch, start);
        (0..seg.total).map(|q| seg.global(q)).collect()
    }

    /// The indices rank `rank` takes in `epoch`.
    pub fn indices(&self, epoch: u64, rank: usize) -> Vec<usize> {
        self.indices_from(epoch, rank, 0)
    }

    /// The indices rank `rank` takes from the part of `epoch` that starts at `start`.
    pub fn indices_from(&self, epoch: u64, rank: usize, start: usize) -> Vec<usize> {
        let seg = self.segment_of(epoch, start);
        (0..seg.per_rank()).map(|k| seg.of_rank(rank, k)).collect()
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
            lazy: false,
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
            lazy: false,
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
            lazy: false,
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
            lazy: false,
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

    #[test]
    fn a_keyed_shuffle_is_a_permutation_of_any_length_and_holds_nothing() {
        for n in [1usize, 2, 3, 5, 17, 64, 1000, 4097] {
            let o = EpochOrder::Keyed { n, key: 42 };
            let mut all: Vec<usize> = (0..n).map(|i| o.get(i)).collect();
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
        let lazy = Sampler {
            len: 1000,
            world: 3,
            shuffle: true,
            seed: 9,
            drop_last: false,
            lazy: true,
        };
        // shuffled (not the identity), different per epoch, disjoint and covering across ranks
        let e0 = lazy.epoch_order(0);
        assert_ne!(e0[..10], (0..10).collect::<Vec<_>>());
        assert_ne!(e0, lazy.epoch_order(1));
        let mut all: Vec<usize> = (0..3).flat_map(|r| lazy.indices(0, r)).collect();
        all.truncate(1000);
        let mut first: Vec<usize> = e0[..1000].to_vec();
        first.sort_unstable();
        assert_eq!(first, (0..1000).collect::<Vec<_>>());
        // random access: the 5th sample of rank 2 after a resume at 301 without the list
        let seg = lazy.segment_of(0, 301);
        assert_eq!(seg.of_rank(2, 5), lazy.indices_from(0, 2, 301)[5]);
        // the in-memory order is unchanged by all this
        assert_eq!(
            s(3, true, false).indices(0, 1),
            Sampler {
                lazy: false,
                ..s(3, true, false)
            }
            .indices(0, 1)
        );
    }
}
