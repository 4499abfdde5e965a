//! `--profile-steps A..B`: rank 0 records optimisation steps A to B−1 (counted from 0 over the
//! whole run) as a Chrome / Perfetto trace, `OUT/trace.json` (open it in ui.perfetto.dev or
//! chrome://tracing): one span per step and per phase (data wait, upload, forward, backward —
//! which holds DDP's wait for the buckets it overlaps —, loss-scale checks, optimizer) on the
//! training thread, and each bucket's all-reduce on DDP's communication thread. While it
//! records, every phase boundary synchronises the device, so the phase spans carry device
//! time: profiled steps run somewhat slower than the others.

use crate::error::{Error, Result};
use burn_ddp::trace;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Instant;

/// Parses `A..B` (steps A to B−1).
///
/// # Errors
/// [`Error::InvalidConfig`] for anything else or an empty range.
pub fn parse_steps(text: &str) -> Result<[usize; 2]> {
    let bad = || Error::InvalidConfig {
        name: "--profile-steps",
        value: text.into(),
        reason: "write A..B with A < B, e.g. 10..20 (steps counted from 0)".into(),
    };
    let (a, b) = text.split_once("..").ok_or_else(bad)?;
    let (a, b): (usize, usize) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
    if a >= b {
        return Err(bad());
    }
    Ok([a, b])
}

/// Rank 0's recorder of the steps asked for; does nothing on other ranks or without the flag.
pub(crate) struct StepTracer {
    steps: Range<usize>,
    path: PathBuf,
    recording: bool,
    step_started: Instant,
}

impl StepTracer {
    /// A recorder of `steps` writing `path`, or an idle one for `None`.
    pub fn new(steps: Option<[usize; 2]>, path: PathBuf) -> Self {
        let steps = steps.map_or(0..0, |[a, b]| a..b);
        Self { steps, path, recording: false, step_started: Instant::now() }
    }

    /// Before step `step` (0-based, whole run): starts recording at the first step asked for.
    pub fn before_step(&mut self, step: usize) {
        if !self.steps.contains(&step) {
            return;
        }
        if !self.recording {
            trace::start();
            self.recording = true;
        }
        self.step_started = Instant::now();
    }

    /// After step `step`: records its span, and writes the trace after the last step asked for.
    ///
    /// # Errors
    /// When the trace file cannot be written.
    pub fn after_step(&mut self, step: usize) -> Result<()> {
        if !self.recording {
            return Ok(());
        }
        trace::record(
            format!("step {step}"),
            "step",
            self.step_started,
            Instant::now(),
            serde_json::json!({ "step": step }),
        );
        if step + 1 >= self.steps.end { self.finish() } else { Ok(()) }
    }

    /// Writes what was recorded (also when the run ends inside the range).
    ///
    /// # Errors
    /// When the trace file cannot be written.
    pub fn finish(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.recording) {
            return Ok(());
        }
        let spans = trace::stop();
        let json = trace::chrome_json(&spans, "burn-vision rank 0", 0);
        crate::atomic_file::write_atomic(&self.path, &serde_json::to_vec(&json).expect("trace serialises"))?;
        log::info!(
            "wrote {} ({} spans of steps {}..{}): open it in ui.perfetto.dev",
            self.path.display(),
            spans.len(),
            self.steps.start,
            self.steps.end
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_ranges_parse_or_say_how() {
        assert_eq!(parse_steps("10..20").unwrap(), [10, 20]);
        assert_eq!(parse_steps(" 0 .. 1").unwrap(), [0, 1]);
        for bad in ["10", "5..5", "7..3", "a..b", "1..2..3"] {
            let err = parse_steps(bad).unwrap_err().to_string();
            assert!(err.contains("A..B"), "{bad}: {err}");
        }
    }
}
