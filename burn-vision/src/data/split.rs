//! The seeded per-class train/validation split: the same indices for a seed on every machine.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// Splits sample indices into (train, validation), taking `val_fraction` of each class
/// (rounded to nearest, at least one sample when the class has two or more) with a
/// ChaCha8 shuffle seeded by `seed`, so the split is identical on every platform.
///
/// Both returned lists are sorted ascending.
///
/// # Panics
/// If `val_fraction` is outside `[0, 1)`.
pub fn split_per_class(labels: &[usize], val_fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    assert!((0.0..1.0).contains(&val_fraction), "Got val_fraction={val_fraction}, expected a value in [0, 1)");
    let num_classes = labels.iter().copied().max().map_or(0, |m| m + 1);
    let mut per_class: Vec<Vec<usize>> = vec![Vec::new(); num_classes];
    for (index, &label) in labels.iter().enumerate() {
        per_class[label].push(index);
    }
    let mut train = Vec::with_capacity(labels.len());
    let mut val = Vec::new();
    for (class, mut members) in per_class.into_iter().enumerate() {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (class as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        members.shuffle(&mut rng);
        let mut n_val = (members.len() as f64 * val_fraction).round() as usize;
        if val_fraction > 0.0 && n_val == 0 && members.len() >= 2 {
            n_val = 1;
        }
        val.extend_from_slice(&members[..n_val]);
        train.extend_from_slice(&members[n_val..]);
    }
    train.sort_unstable();
    val.sort_unstable();
    (train, val)
}

/// The training order of `indices` for `epoch`: a ChaCha8 shuffle seeded by (seed, epoch), the
/// same on every machine, different every epoch.
pub fn shuffle_for_epoch(indices: &[usize], seed: u64, epoch: u64) -> Vec<usize> {
    let mut order = indices.to_vec();
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(epoch.wrapping_mul(0xD1B5_4A32_D192_ED03)));
    order.shuffle(&mut rng);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_shuffles_differ_by_epoch_and_keep_the_set() {
        let idx: Vec<usize> = (0..100).collect();
        let a = shuffle_for_epoch(&idx, 0, 0);
        assert_eq!(a, shuffle_for_epoch(&idx, 0, 0));
        assert_ne!(a, shuffle_for_epoch(&idx, 0, 1));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, idx);
    }

    fn labels() -> Vec<usize> {
        (0..1000).map(|i| (i * 7 + i / 13) % 5).collect()
    }

    #[test]
    fn split_is_per_class_and_partitions() {
        let labels = labels();
        let (train, val) = split_per_class(&labels, 0.2, 0);
        assert_eq!(train.len() + val.len(), labels.len());
        let mut all: Vec<usize> = train.iter().chain(&val).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..labels.len()).collect::<Vec<_>>());
        for class in 0..5 {
            let total = labels.iter().filter(|&&l| l == class).count();
            let in_val = val.iter().filter(|&&i| labels[i] == class).count();
            assert_eq!(in_val, (total as f64 * 0.2).round() as usize, "class {class}");
        }
    }

    #[test]
    fn split_is_deterministic_and_seed_dependent() {
        let labels = labels();
        assert_eq!(split_per_class(&labels, 0.2, 0), split_per_class(&labels, 0.2, 0));
        assert_ne!(split_per_class(&labels, 0.2, 0).1, split_per_class(&labels, 0.2, 1).1);
    }

    #[test]
    fn split_is_stable_across_platforms() {
        // ChaCha8 is specified bit-for-bit. Golden values: printed by these two calls on x86-64
        // (rand 0.9, rand_chacha 0.9) on 2026-11-30. A change here means every existing run's
        // split and data order changed: bump it only on purpose, and say so in the changelog.
        let labels: Vec<usize> = (0..20).map(|i| i % 2).collect();
        let (_, val) = split_per_class(&labels, 0.2, 0);
        assert_eq!(val, [4, 16, 17, 19]);
        assert_eq!(shuffle_for_epoch(&(0..10).collect::<Vec<_>>(), 0, 1), [4, 1, 5, 3, 0, 2, 6, 9, 8, 7]);
    }

    #[test]
    fn tiny_classes_still_get_one_validation_sample() {
        let (train, val) = split_per_class(&[0, 0, 1, 1, 1], 0.2, 3);
        assert_eq!(val.len(), 2);
        assert_eq!(train.len(), 3);
    }

    #[test]
    #[should_panic(expected = "val_fraction")]
    fn bad_fraction_panics_with_value() {
        split_per_class(&[0, 1], 1.5, 0);
    }
}
