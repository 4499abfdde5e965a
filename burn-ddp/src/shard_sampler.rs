//! The shard sampler: which samples each rank reads in an epoch when the data set is stored as
//! shards read front to back (WebDataset tar files). Pure functions of (shard sizes, world size,
//! rank, seed, epoch), so every machine computes the same thing.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Shard-level shuffling for sequential reads, with [`DistributedSampler`]'s promise of equal
/// step counts.
///
/// Each epoch the shards are shuffled by (seed, epoch), the same on every rank, and their samples
/// laid end to end in reading order. Rank r takes the r-th of `world` equal contiguous runs of
/// that sequence (`total / world` samples each, the remainder dropped, as `drop_last`), so a rank
/// reads a few whole shards front to back, sharing at most the first and last with a neighbour.
/// A shuffle buffer (WebDataset's `shuffle(n)`) then mixes each rank's run locally: a sample
/// read at position p of the run comes out at a position of at least p − buffer, so reads stay
/// within a window of `buffer` samples.
///
/// Unlike [`DistributedSampler`], N ranks with batch b do not see the samples one process with
/// batch N·b sees in the same step (each rank reads its own shards); they see the same epoch.
///
/// [`DistributedSampler`]: crate::sampler::DistributedSampler
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSampler {
    shards: Vec<Vec<usize>>,
    world: usize,
    rank: usize,
    seed: u64,
    epoch: u64,
    buffer: usize,
}

/// Samples held by the shuffle buffer unless [`ShardSampler::with_buffer`] says otherwise.
pub const DEFAULT_SHUFFLE_BUFFER: usize = 1000;

impl ShardSampler {
    /// A sampler for `rank` of `world` over `shards`: each shard's sample indices in reading
    /// order (empty shards are allowed). Seed 0, a shuffle buffer of [`DEFAULT_SHUFFLE_BUFFER`].
    ///
    /// # Panics
    /// If `rank >= world` or `world == 0`.
    pub fn new(shards: Vec<Vec<usize>>, world: usize, rank: usize) -> Self {
        assert!(world > 0 && rank < world, "Got rank={rank}, world={world}; expected rank < world");
        Self { shards, world, rank, seed: 0, epoch: 0, buffer: DEFAULT_SHUFFLE_BUFFER }
    }
    /// Sets the seed shared by all ranks.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Sets the shuffle buffer's size in samples (0 or 1: each rank's run in reading order).
    pub fn with_buffer(mut self, buffer: usize) -> Self {
        self.buffer = buffer;
        self
    }
    /// Selects the epoch: call before every epoch, or every epoch has the same order.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
    /// Samples per rank this epoch (the same on every rank): all samples over the world size,
    /// rounded down.
    pub fn num_samples(&self) -> usize {
        self.shards.iter().map(Vec::len).sum::<usize>() / self.world
    }
    /// The epoch's order of shards (indices into the list given to [`ShardSampler::new`]),
    /// identical on every rank.
    pub fn shard_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.shards.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(mix(self.seed, self.epoch, u64::MAX)));
        order
    }
    /// This rank's samples for the current epoch, in the order to train on them.
    pub fn indices(&self) -> Vec<usize> {
        let per_rank = self.num_samples();
        let run: Vec<usize> = self
            .shard_order()
            .into_iter()
            .flat_map(|s| self.shards[s].iter().copied())
            .skip(self.rank * per_rank)
            .take(per_rank)
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed, self.epoch, self.rank as u64));
        buffer_shuffle(run, self.buffer, &mut rng)
    }
}

/// A seed from (seed, epoch, stream), well spread (SplitMix64's finaliser).
fn mix(seed: u64, epoch: u64, stream: u64) -> u64 {
    let mut z = seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// WebDataset's shuffle buffer: fill `size` samples, then for each new sample emit a random one
/// from the buffer and put the new one in its place; shuffle what is left at the end.
fn buffer_shuffle(items: Vec<usize>, size: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    if size <= 1 {
        return items;
    }
    let mut out = Vec::with_capacity(items.len());
    let mut buffer = Vec::with_capacity(size.min(items.len()));
    for item in items {
        if buffer.len() < size {
            buffer.push(item);
            continue;
        }
        let pick = rng.random_range(0..buffer.len());
        out.push(std::mem::replace(&mut buffer[pick], item));
    }
    buffer.shuffle(rng);
    out.extend(buffer);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shards of the given sizes over consecutive indices.
    fn shards(sizes: &[usize]) -> Vec<Vec<usize>> {
        let mut next = 0;
        sizes
            .iter()
            .map(|&n| {
                next += n;
                (next - n..next).collect()
            })
            .collect()
    }

    fn ranks(sizes: &[usize], world: usize, epoch: u64, buffer: usize) -> Vec<Vec<usize>> {
        (0..world)
            .map(|r| {
                let mut s = ShardSampler::new(shards(sizes), world, r).with_seed(7).with_buffer(buffer);
                s.set_epoch(epoch);
                s.indices()
            })
            .collect()
    }

    #[test]
    fn ranks_get_equal_disjoint_runs_and_drop_only_the_remainder() {
        for (sizes, world) in [(&[10, 10, 10][..], 3), (&[7, 1, 0, 12, 5], 4), (&[3], 5), (&[100, 3, 40], 2)] {
            let total: usize = sizes.iter().sum();
            let all = ranks(sizes, world, 1, 4);
            assert!(all.iter().all(|r| r.len() == total / world), "{sizes:?} over {world}");
            let mut seen = all.concat();
            seen.sort_unstable();
            let n = seen.len();
            seen.dedup();
            assert_eq!(seen.len(), n, "a sample went to two ranks: {sizes:?} over {world}");
            assert_eq!(n, total - total % world);
        }
    }

    #[test]
    fn a_rank_reads_whole_shards_in_a_row() {
        // 40 shards of 25 over 4 ranks: each rank's 250 samples come from exactly 10 shards.
        let all = ranks(&[25; 40], 4, 3, 0);
        for run in &all {
            let mut touched: Vec<usize> = run.iter().map(|i| i / 25).collect();
            touched.dedup();
            assert_eq!(touched.len(), 10, "the run is read shard after shard, in reading order");
            assert!(run.windows(2).all(|w| w[0] / 25 != w[1] / 25 || w[1] == w[0] + 1));
        }
    }

    #[test]
    fn the_buffer_only_mixes_within_its_window() {
        let sampler = ShardSampler::new(shards(&[500]), 1, 0).with_buffer(16);
        let order = sampler.indices();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..500).collect::<Vec<_>>());
        assert_ne!(order, sorted, "a buffer of 16 shuffles");
        for (position, &sample) in order.iter().enumerate() {
            assert!(sample <= position + 16, "sample {sample} came out at {position}: read beyond the window");
        }
    }

    #[test]
    fn epochs_reorder_shards_and_every_rank_agrees_on_them() {
        let a = ShardSampler::new(shards(&[5; 20]), 2, 0);
        let mut b = ShardSampler::new(shards(&[5; 20]), 2, 1);
        assert_eq!(a.shard_order(), b.shard_order());
        b.set_epoch(1);
        assert_ne!(a.shard_order(), b.shard_order());
        assert_eq!(ranks(&[5; 20], 2, 4, 8), ranks(&[5; 20], 2, 4, 8));
        assert_ne!(ranks(&[5; 20], 2, 4, 8), ranks(&[5; 20], 2, 5, 8));
    }
}
