//! Where a training step's time goes: host seconds per phase, summed over an epoch and written
//! to metrics.jsonl. With `BURN_VISION_STEP_SYNC=1` the device is synchronised at every phase
//! boundary, so each phase also carries its device time (slower, for diagnosis only); so it
//! is while `--profile-steps` records a trace, which gets a span per phase.

use burn::prelude::*;
use std::time::Instant;

/// The phases of one step, in order.
pub const PHASES: [&str; 6] = ["data", "upload", "forward", "backward", "grad_sync", "optimizer"];

/// Accumulates seconds per phase.
pub struct StepPhases<B: Backend> {
    seconds: [f64; PHASES.len()],
    sync: bool,
    device: B::Device,
    last: Instant,
}

impl<B: Backend> StepPhases<B> {
    /// Starts timing on `device`.
    pub fn new(device: &B::Device) -> Self {
        let sync = std::env::var("BURN_VISION_STEP_SYNC").is_ok_and(|v| !matches!(v.as_str(), "" | "0"));
        Self { seconds: [0.0; PHASES.len()], sync, device: device.clone(), last: Instant::now() }
    }

    /// Ends phase `index` (of [`PHASES`]) now; the next phase starts here.
    pub fn end(&mut self, index: usize) {
        let tracing = burn_ddp::trace::enabled();
        if self.sync || tracing {
            let _ = B::sync(&self.device);
        }
        let now = Instant::now();
        if tracing {
            burn_ddp::trace::record(PHASES[index], "phase", self.last, now, serde_json::Value::Null);
        }
        self.seconds[index] += (now - self.last).as_secs_f64();
        self.last = now;
    }

    /// Restarts the clock without charging any phase (between steps).
    pub fn restart(&mut self) {
        self.last = Instant::now();
    }

    /// Seconds of phase `index` (of [`PHASES`]) so far.
    pub fn seconds(&self, index: usize) -> f64 {
        self.seconds[index]
    }

    /// `(phase, seconds)` pairs.
    pub fn totals(&self) -> Vec<(String, f64)> {
        PHASES.iter().zip(self.seconds).map(|(n, s)| (n.to_string(), s)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    #[test]
    fn charges_each_phase_its_own_time() {
        let mut p = StepPhases::<Flex>::new(&Default::default());
        std::thread::sleep(std::time::Duration::from_millis(20));
        p.end(2);
        p.end(3);
        let t = p.totals();
        assert_eq!(t[2].0, "forward");
        assert!(t[2].1 >= 0.019 && t[3].1 < 0.019, "{t:?}");
    }
}
