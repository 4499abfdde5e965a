//! The distributed sampler: which dataset indices each rank takes in an epoch. Pure functions of
//! (length, world size, rank, seed, epoch), so every machine computes the same thing.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// PyTorch's `DistributedSampler` contract: a (seed + epoch) permutation, padded to a multiple
/// of the world size by repeating its head (or cut with `drop_last`), rank r taking
/// r, r+W, r+2W, … of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    world: usize,
    rank: usize,
    seed: u64,
    epoch: u64,
    shuffle: bool,
    drop_last: bool,
}

impl DistributedSampler {
    /// A shuffling, padding sampler over `len` samples for `rank` of `world`, seed 0.
    ///
    /// # Panics
    /// If `rank >= world` or `world == 0`.
    pub fn new(len: usize, world: usize, rank: usize) -> Self {
        assert!(world > 0 && rank < world, "Got rank={rank}, world={world}; expected rank < world");
        Self { len, world, rank, seed: 0, epoch: 0, shuffle: true, drop_last: false }
    }
    /// Sets the seed shared by all ranks.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Keeps dataset order when false.
    pub fn with_shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }
    /// Drops the tail that does not divide evenly instead of padding.
    pub fn with_drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }
    /// Selects the epoch: call before every epoch, or every epoch has the same order.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
    /// Samples per rank this epoch (the same on every rank).
    pub fn num_samples(&self) -> usize {
        if self.drop_last { self.len / self.world } else { self.len.div_ceil(self.world) }
    }
    /// The whole epoch's permutation (before padding), identical on every rank.
    pub fn permutation(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed.wrapping_add(self.epoch));
            order.shuffle(&mut rng);
        }
        order
    }
    /// This rank's indices for the current epoch.
    pub fn indices(&self) -> Vec<usize> {
        let mut order = self.permutation();
        let total = self.num_samples() * self.world;
        if total > order.len() && !order.is_empty() {
            let pad: Vec<usize> = order.iter().cycle().take(total - order.len()).copied().collect();
            order.extend(pad);
        }
        order.truncate(total);
        order.into_iter().skip(self.rank).step_by(self.world).collect()
    }
}

/// Evaluation sharding: rank r takes r, r+W, … of `0..len` with no padding, so every sample is
/// counted exactly once across ranks (ranks may differ in count by one).
pub fn shard_exact(len: usize, world: usize, rank: usize) -> Vec<usize> {
    assert!(world > 0 && rank < world, "Got rank={rank}, world={world}; expected rank < world");
    (rank..len).step_by(world).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ranks(len: usize, world: usize, drop_last: bool, epoch: u64) -> Vec<Vec<usize>> {
        (0..world)
            .map(|r| {
                let mut s = DistributedSampler::new(len, world, r).with_seed(42).with_drop_last(drop_last);
                s.set_epoch(epoch);
                s.indices()
            })
            .collect()
    }

    #[test]
    fn padded_covers_every_index_and_ranks_are_equal() {
        for (len, world) in [(10, 3), (9, 3), (1, 4), (100, 7)] {
            let ranks = all_ranks(len, world, false, 0);
            assert!(ranks.iter().all(|r| r.len() == len.div_ceil(world)));
            let mut seen: Vec<usize> = ranks.concat();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen, (0..len).collect::<Vec<_>>(), "len {len} world {world}");
        }
    }

    #[test]
    fn drop_last_gives_each_index_at_most_once() {
        let ranks = all_ranks(10, 3, true, 0);
        assert!(ranks.iter().all(|r| r.len() == 3));
        let mut all = ranks.concat();
        all.sort_unstable();
        let n = all.len();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    #[test]
    fn epochs_change_the_order_and_seeds_are_shared() {
        assert_ne!(all_ranks(50, 2, false, 0), all_ranks(50, 2, false, 1));
        assert_eq!(all_ranks(50, 2, false, 3), all_ranks(50, 2, false, 3));
        let unshuffled = DistributedSampler::new(6, 2, 1).with_shuffle(false).indices();
        assert_eq!(unshuffled, [1, 3, 5]);
    }

    #[test]
    fn exact_shards_partition() {
        let mut all: Vec<usize> = (0..3).flat_map(|r| shard_exact(10, 3, r)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }
}
