//! The per-rank health report at the end of a distributed run: speed, gradient-sync share,
//! memory, GPU utilisation, and the skew between ranks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Values each rank contributes, in this order.
pub const FIELDS: usize = 7;

/// GPU utilisation sampled by NVML twice a second while an epoch trains.
pub struct UtilSampler {
    stop: Arc<AtomicBool>,
    /// Sum of the samples and their count.
    sums: Arc<[AtomicU64; 2]>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UtilSampler {
    /// Starts sampling `gpu` (nothing without one, or without NVML).
    pub fn start(gpu: Option<usize>) -> Self {
        let (stop, sums) = (Arc::new(AtomicBool::new(false)), Arc::new([AtomicU64::new(0), AtomicU64::new(0)]));
        let thread = gpu.filter(|&g| burn_ddp::device::gpu_use(g).is_ok()).map(|g| {
            let (stop, sums) = (stop.clone(), sums.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(u) = burn_ddp::device::gpu_use(g) {
                        sums[0].fetch_add(u64::from(u.utilization_pct), Ordering::Relaxed);
                        sums[1].fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
            })
        });
        Self { stop, sums, thread }
    }

    /// Stops and returns the mean utilisation in percent (0 when nothing was sampled).
    pub fn mean(mut self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let (sum, n) = (self.sums[0].load(Ordering::Relaxed), self.sums[1].load(Ordering::Relaxed));
        if n == 0 { 0.0 } else { sum as f64 / n as f64 }
    }
}

/// This process's peak resident host memory in MiB (`VmHWM`), 0 where unknown.
pub fn peak_host_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmHWM:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            })
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// What one rank measured over an epoch, for its row.
pub struct RankEpoch {
    /// Training images per second.
    pub img_per_s: f64,
    /// Share of the training time inside the all-reduce collectives themselves.
    pub collective_share: f64,
    /// Share of the training time the training thread waited for gradient sync (what the
    /// overlap with backward did not hide; it includes waiting for unfinished backward work).
    pub exposed_share: f64,
    /// Milliseconds of that wait per step.
    pub exposed_ms_per_step: f64,
    /// Mean GPU utilisation in percent (0 without NVML).
    pub utilization_pct: f64,
}

/// One rank's row: images/s, collectives' share, peak host MiB, GPU MiB this process holds
/// (NVML; the device's whole use where NVML cannot tell; 0 without a GPU), exposed sync ms per
/// step, GPU utilisation, exposed share.
pub fn row(r: &RankEpoch, gpu: Option<usize>) -> [f64; FIELDS] {
    let bytes = gpu.and_then(gpu_memory_bytes);
    [
        r.img_per_s,
        r.collective_share,
        peak_host_mib(),
        bytes.map_or(0.0, |b| b as f64 / (1 << 20) as f64),
        r.exposed_ms_per_step,
        r.utilization_pct,
        r.exposed_share,
    ]
}

/// Bytes of GPU `gpu`'s memory this process holds (NVML), else the device's whole use.
pub fn gpu_memory_bytes(gpu: usize) -> Option<u64> {
    burn_ddp::device::gpu_use(gpu).ok().and_then(|u| u.process_bytes).or_else(|| burn_ddp::gpu_memory_used(gpu).ok())
}

/// Largest over smallest of the positive values (1 when fewer than two).
fn skew(values: &[f64]) -> f64 {
    let v: Vec<f64> = values.iter().copied().filter(|&x| x > 0.0).collect();
    if v.len() < 2 {
        return 1.0;
    }
    v.iter().copied().fold(0.0, f64::max) / v.iter().copied().fold(f64::MAX, f64::min)
}

/// Logs the table (rank-major rows of [`FIELDS`] values) and warns, as the seed tutorial does,
/// when memory differs by more than 35 % between ranks.
pub fn log(rows: &[f64]) {
    let rows: Vec<&[f64]> = rows.chunks(FIELDS).collect();
    for (r, c) in rows.iter().enumerate() {
        let util = if c[5] > 0.0 { format!(", GPU utilisation {:.0}%", c[5]) } else { String::new() };
        log::info!(
            "rank {r}: {:.1} img/s, gradient sync: collectives {:.1}% of training time, exposed wait {:.1}% ({:.2} ms/step), peak host memory {:.0} MiB, GPU memory {:.0} MiB{util}",
            c[0],
            100.0 * c[1],
            100.0 * c[6],
            c[4],
            c[2],
            c[3]
        );
    }
    utilization_spread(&rows.iter().map(|c| c[5]).collect::<Vec<_>>());
    let ips: Vec<f64> = rows.iter().map(|c| c[0]).collect();
    log::info!(
        "{} ranks: {:.1} img/s together, slowest/fastest rank {:.2}",
        rows.len(),
        ips.iter().sum::<f64>(),
        1.0 / skew(&ips)
    );
    let gpu: Vec<f64> = rows.iter().map(|c| c[3]).collect();
    let mem = if gpu.iter().any(|&g| g > 0.0) { gpu } else { rows.iter().map(|c| c[2]).collect() };
    let s = skew(&mem);
    if s > 1.35 {
        log::warn!(
            "memory differs by {:.0}% between ranks (more than 35%): look for work done on one rank only (rank-0 logging, evaluation) or unequal batches",
            100.0 * (s - 1.0)
        );
    }
}

/// The tutorial's thresholds on the spread of GPU utilisation between ranks: a warning above 15
/// points, an alarm above 25 (a straggler: data loading, a slower GPU, unequal work).
fn utilization_spread(util: &[f64]) -> Option<f64> {
    let seen: Vec<f64> = util.iter().copied().filter(|&u| u > 0.0).collect();
    if seen.len() < 2 {
        return None;
    }
    let spread = seen.iter().copied().fold(0.0, f64::max) - seen.iter().copied().fold(f64::MAX, f64::min);
    if spread > 25.0 {
        log::error!(
            "GPU utilisation differs by {spread:.0} points between ranks (alarm above 25): one rank waits for the others; look at its data loading and its GPU"
        );
    } else if spread > 15.0 {
        log::warn!("GPU utilisation differs by {spread:.0} points between ranks (warning above 15)");
    }
    Some(spread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_ignores_missing_values() {
        assert_eq!(skew(&[100.0, 150.0]), 1.5);
        assert_eq!(skew(&[0.0, 150.0]), 1.0);
        assert_eq!(skew(&[7.0]), 1.0);
    }

    #[test]
    fn utilization_spread_ignores_ranks_without_a_reading() {
        assert_eq!(utilization_spread(&[90.0, 70.0]), Some(20.0));
        assert_eq!(utilization_spread(&[0.0, 70.0]), None);
        // Without NVML (no GPU here) the sampler reads nothing.
        assert_eq!(UtilSampler::start(None).mean(), 0.0);
    }

    #[test]
    fn peak_memory_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(peak_host_mib() > 1.0, "VmHWM of a running test process");
        }
    }
}
