//! The learning-rate schedule: linear warm-up, then cosine decay to a floor. A pure function
//! of the step, so a resumed run continues exactly on the same curve.

/// Linear warm-up over `warmup_steps`, then cosine from `base_lr` down to
/// `base_lr · min_factor` at `total_steps`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CosineSchedule {
    /// Peak learning rate.
    pub base_lr: f64,
    /// Final learning rate over the peak (the seed recipe: 0.1).
    pub min_factor: f64,
    /// Steps of linear warm-up (from `base_lr / warmup_steps`).
    pub warmup_steps: usize,
    /// Total optimisation steps.
    pub total_steps: usize,
}

impl CosineSchedule {
    /// The learning rate of optimisation step `step` (0-based).
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let t = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
        let floor = self.base_lr * self.min_factor;
        floor + 0.5 * (self.base_lr - floor) * (1.0 + (std::f64::consts::PI * t).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_then_decays_to_the_floor() {
        let s = CosineSchedule { base_lr: 0.1, min_factor: 0.1, warmup_steps: 10, total_steps: 110 };
        assert!((s.lr(0) - 0.01).abs() < 1e-12);
        assert!((s.lr(9) - 0.1).abs() < 1e-12);
        assert!((s.lr(10) - 0.1).abs() < 1e-12);
        assert!((s.lr(60) - 0.055).abs() < 1e-12);
        assert!((s.lr(110) - 0.01).abs() < 1e-12);
        assert!((s.lr(500) - 0.01).abs() < 1e-12);
        assert!((11..110).all(|i| s.lr(i) < s.lr(i - 1)));
    }
}
