//! Mixup and CutMix, with timm's semantics (`timm.data.Mixup`, batch mode): with probability
//! `prob` a batch is mixed with itself reversed (image `i` with image `n − 1 − i`); when both are
//! on, CutMix is chosen with probability `switch_prob`. The mixing weight λ ~ Beta(α, α); CutMix
//! pastes a box of area ≈ (1 − λ) from the partner image and λ becomes the exact share left.
//! Targets are the partners' (label-smoothed) one-hot vectors mixed by λ, each row summing to 1;
//! the loss is the soft-target cross-entropy. Every draw is a pure function of (seed, epoch,
//! step, rank) ([`step_key`]), so a resumed run mixes exactly as the uninterrupted one.
//!
//! Training accuracy still counts the unmixed labels (timm reports none while mixing).

use crate::error::{Error, Result};
use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_distr::{Beta, Distribution};
use serde::{Deserialize, Serialize};

/// What mixing a run uses; the default is off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct MixupConfig {
    /// Mixup's α: batches mixed with their reversed partner by λ ~ Beta(α, α), soft targets
    /// (timm's --mixup; default 0 = off, --preset vit 0.8).
    #[arg(long = "mixup", value_name = "ALPHA", required = false)]
    pub mixup_alpha: f64,
    /// CutMix's α: a box of area ≈ 1 − λ pasted from the partner (timm's --cutmix; default 0,
    /// --preset vit 1.0).
    #[arg(long = "cutmix", value_name = "ALPHA", required = false)]
    pub cutmix_alpha: f64,
    /// Probability that a batch is mixed at all (timm's --mixup-prob; default 1).
    #[arg(long = "mixup-prob", value_name = "P", required = false)]
    pub prob: f64,
    /// With mixup and cutmix both on, the probability of cutmix (timm's --mixup-switch-prob;
    /// default 0.5).
    #[arg(long = "mixup-switch-prob", value_name = "P", required = false)]
    pub switch_prob: f64,
}

impl Default for MixupConfig {
    fn default() -> Self {
        Self { mixup_alpha: 0.0, cutmix_alpha: 0.0, prob: 1.0, switch_prob: 0.5 }
    }
}

/// One batch's mix: the weight of the batch's own images, and CutMix's box
/// (rows `y0..y1`, columns `x0..x1`) when it is a CutMix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixDraw {
    pub lam: f64,
    pub cut: Option<[usize; 4]>,
}

impl MixupConfig {
    /// Whether any batch can be mixed.
    pub fn enabled(&self) -> bool {
        (self.mixup_alpha > 0.0 || self.cutmix_alpha > 0.0) && self.prob > 0.0
    }

    /// Checks the ranges, naming the flag.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a negative or non-finite α, or a probability outside [0, 1].
    pub fn validate(&self) -> Result<()> {
        let bad = |name, value: f64, reason: &str| {
            Err(Error::InvalidConfig { name, value: value.to_string(), reason: reason.into() })
        };
        for (name, a) in [("--mixup", self.mixup_alpha), ("--cutmix", self.cutmix_alpha)] {
            if !(a >= 0.0 && a.is_finite()) {
                return bad(name, a, "must be ≥ 0 (0 turns it off)");
            }
        }
        for (name, p) in [("--mixup-prob", self.prob), ("--mixup-switch-prob", self.switch_prob)] {
            if !(0.0..=1.0).contains(&p) {
                return bad(name, p, "must be a probability in [0, 1]");
            }
        }
        Ok(())
    }

    /// For the run's first log line.
    pub fn describe(&self) -> String {
        if !self.enabled() {
            return "no mixup/cutmix".into();
        }
        format!(
            "mixup α {} cutmix α {} (p {}, switch {})",
            self.mixup_alpha, self.cutmix_alpha, self.prob, self.switch_prob
        )
    }

    /// The mix of the batch whose step has the draw key `key` ([`step_key`]), for `h × w`
    /// images, or `None` when this batch is not mixed.
    pub fn draw(&self, key: u64, (h, w): (usize, usize)) -> Option<MixDraw> {
        if !self.enabled() {
            return None;
        }
        // Salted: the model's draws (stochastic depth) start from the same key.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(key ^ 0x6d69_7875_7000_0000);
        if rng.random::<f64>() >= self.prob {
            return None;
        }
        let cutmix = match (self.mixup_alpha > 0.0, self.cutmix_alpha > 0.0) {
            (true, true) => rng.random::<f64>() < self.switch_prob,
            (_, cut) => cut,
        };
        let alpha = if cutmix { self.cutmix_alpha } else { self.mixup_alpha };
        let lam = Beta::new(alpha, alpha).expect("α > 0 checked").sample(&mut rng);
        if !cutmix {
            return Some(MixDraw { lam, cut: None });
        }
        let cut = cut_box(&mut rng, lam, h, w);
        let area = ((cut[1] - cut[0]) * (cut[3] - cut[2])) as f64;
        Some(MixDraw { lam: 1.0 - area / (h * w) as f64, cut: Some(cut) })
    }
}

/// The key of every random draw of one training step (mixup here, stochastic depth in the
/// model): a pure function of the seed, epoch, step and rank, so a resumed run draws as the
/// uninterrupted one and ranks draw apart.
pub fn step_key(seed: u64, (epoch, step, rank): (usize, usize, usize)) -> u64 {
    use rand::RngCore;
    rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ ((epoch as u64) << 40) ^ ((rank as u64) << 32) ^ step as u64)
        .next_u64()
}

/// timm's `rand_bbox`: a box with sides `√(1 − λ)` of the image's, centred anywhere, clipped.
fn cut_box(rng: &mut impl Rng, lam: f64, h: usize, w: usize) -> [usize; 4] {
    let ratio = (1.0 - lam).sqrt();
    let (ch, cw) = ((h as f64 * ratio) as usize, (w as f64 * ratio) as usize);
    let (cy, cx) = (rng.random_range(0..h), rng.random_range(0..w));
    [cy.saturating_sub(ch / 2), (cy + ch / 2).min(h), cx.saturating_sub(cw / 2), (cx + cw / 2).min(w)]
}

/// `[n, classes]` row-major targets: row `i` is `λ·t(labels[i]) + (1 − λ)·t(labels[n−1−i])`
/// with `t` the label-smoothed one-hot vector (timm's `mixup_target`).
pub fn soft_targets(labels: &[i64], classes: usize, lam: f64, smoothing: f64) -> Vec<f32> {
    let n = labels.len();
    let off = smoothing / classes as f64;
    let mut t = vec![off as f32; n * classes];
    for (i, &y) in labels.iter().enumerate() {
        let partner = labels[n - 1 - i] as usize;
        t[i * classes + y as usize] += (lam * (1.0 - smoothing)) as f32;
        t[i * classes + partner] += ((1.0 - lam) * (1.0 - smoothing)) as f32;
    }
    t
}

/// The batch `x` (`[n, c, h, w]`) mixed with itself reversed along the batch as `mix` says.
pub fn mix_images<B: Backend>(x: Tensor<B, 4>, mix: &MixDraw) -> Tensor<B, 4> {
    let partner = x.clone().flip([0]);
    let Some([y0, y1, x0, x1]) = mix.cut else {
        return x.mul_scalar(mix.lam) + partner.mul_scalar(1.0 - mix.lam);
    };
    let [_, _, h, w] = x.dims();
    let inside: Vec<f32> = (0..h * w)
        .map(|p| if (y0..y1).contains(&(p / w)) && (x0..x1).contains(&(p % w)) { 1.0 } else { 0.0 })
        .collect();
    let mask = Tensor::<B, 4>::from_data(TensorData::new(inside, [1, 1, h, w]), &x.device());
    x.mul(mask.clone().neg().add_scalar(1.0)) + partner.mul(mask)
}

/// Mean over the batch of `−Σ targets · log softmax(logits)` (timm's `SoftTargetCrossEntropy`).
pub fn soft_cross_entropy<B: Backend>(logits: Tensor<B, 2>, targets: Tensor<B, 2>) -> Tensor<B, 1> {
    let log_p = burn::tensor::activation::log_softmax(logits, 1);
    (log_p * targets).sum_dim(1).mean().neg()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    fn both() -> MixupConfig {
        MixupConfig { mixup_alpha: 0.8, cutmix_alpha: 1.0, ..MixupConfig::default() }
    }

    #[test]
    fn mixed_label_rows_sum_to_one_and_weigh_the_partners_by_lambda() {
        let labels = [0i64, 3, 3, 1, 2];
        for (lam, smoothing) in [(0.7, 0.0), (0.25, 0.1), (1.0, 0.1)] {
            let t = soft_targets(&labels, 4, lam, smoothing);
            for (i, row) in t.chunks(4).enumerate() {
                let sum: f32 = row.iter().sum();
                assert!((sum - 1.0).abs() < 1e-6, "row {i} sums to {sum}");
                let (own, partner) = (labels[i] as usize, labels[4 - i] as usize);
                if own != partner {
                    let off = smoothing / 4.0;
                    assert!((f64::from(row[own]) - (off + lam * (1.0 - smoothing))).abs() < 1e-6);
                    assert!((f64::from(row[partner]) - (off + (1.0 - lam) * (1.0 - smoothing))).abs() < 1e-6);
                }
            }
        }
    }

    #[test]
    fn draws_are_reproducible_and_cutmix_lambda_is_the_uncovered_share() {
        let c = both();
        let (mut cut, mut mix) = (0, 0);
        for step in 0..200 {
            let d = c.draw(step_key(7, (1, step, 0)), (32, 24)).expect("prob 1 mixes every batch");
            assert_eq!(Some(d), c.draw(step_key(7, (1, step, 0)), (32, 24)), "a pure function of its key");
            assert!((0.0..=1.0).contains(&d.lam));
            match d.cut {
                Some([y0, y1, x0, x1]) => {
                    cut += 1;
                    assert!(y0 <= y1 && y1 <= 32 && x0 <= x1 && x1 <= 24);
                    assert!((d.lam - (1.0 - ((y1 - y0) * (x1 - x0)) as f64 / 768.0)).abs() < 1e-12);
                }
                None => mix += 1,
            }
        }
        assert!(cut > 60 && mix > 60, "switch prob 0.5: {cut} cutmix, {mix} mixup");
        assert_ne!(
            c.draw(step_key(7, (1, 0, 0)), (32, 24)),
            c.draw(step_key(7, (1, 0, 1)), (32, 24)),
            "ranks draw apart"
        );
        assert_eq!(MixupConfig::default().draw(step_key(7, (0, 0, 0)), (8, 8)), None);
        assert_eq!(MixupConfig { prob: 0.0, ..both() }.draw(step_key(7, (0, 0, 0)), (8, 8)), None);
    }

    #[test]
    fn images_mix_with_their_reversed_partner() {
        let device = Default::default();
        let x = Tensor::<Flex, 4>::from_data(
            TensorData::new((0..2 * 3 * 4).map(|v| v as f32).collect::<Vec<_>>(), [2, 1, 3, 4]),
            &device,
        );
        let v = |t: Tensor<Flex, 4>| t.into_data().to_vec::<f32>().unwrap();
        let m = v(mix_images(x.clone(), &MixDraw { lam: 0.25, cut: None }));
        let orig = v(x.clone());
        for i in 0..12 {
            assert!((m[i] - (0.25 * orig[i] + 0.75 * orig[12 + i])).abs() < 1e-5);
        }
        let c = v(mix_images(x, &MixDraw { lam: 0.5, cut: Some([1, 3, 0, 2]) }));
        for p in 0..12 {
            let inside = (1..3).contains(&(p / 4)) && p % 4 < 2;
            assert_eq!(c[p], if inside { orig[12 + p] } else { orig[p] }, "pixel {p}");
        }
    }

    #[test]
    fn soft_cross_entropy_of_a_one_hot_target_is_cross_entropy() {
        let device = Default::default();
        let logits = Tensor::<Flex, 2>::from_data([[2.0f32, -1.0, 0.5], [0.0, 0.3, -0.2]], &device);
        let t = Tensor::<Flex, 2>::from_data([[1.0f32, 0.0, 0.0], [0.0, 0.0, 1.0]], &device);
        let got: f32 = soft_cross_entropy(logits, t).into_scalar();
        let ce = |l: [f64; 3], y: usize| l.iter().map(|v| v.exp()).sum::<f64>().ln() - l[y];
        let want = (ce([2.0, -1.0, 0.5], 0) + ce([0.0, 0.3, -0.2], 2)) / 2.0;
        assert!((f64::from(got) - want).abs() < 1e-5, "{got} vs {want}");
    }

    #[test]
    fn bad_values_name_their_flag() {
        let e = MixupConfig { mixup_alpha: -1.0, ..both() }.validate().unwrap_err().to_string();
        assert!(e.contains("--mixup"), "{e}");
        let e = MixupConfig { switch_prob: 1.5, ..both() }.validate().unwrap_err().to_string();
        assert!(e.contains("--mixup-switch-prob"), "{e}");
    }
}
