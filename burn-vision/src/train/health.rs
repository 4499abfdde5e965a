//! The per-rank health report at the end of a distributed run: speed, gradient-sync share,
//! memory, and the skew between ranks.

/// Values each rank contributes, in this order.
pub const FIELDS: usize = 5;

/// This process's peak resident host memory in MiB (`VmHWM`), 0 where unknown.
pub fn peak_host_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmHWM:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())))
        .map_or(0.0, |kib| kib / 1024.0)
}

/// One rank's row: images/s, sync share of the training time, peak host MiB, GPU MiB in use
/// (0 without a GPU), milliseconds of gradient sync per step.
pub fn row(img_per_s: f64, sync_share: f64, gpu: Option<usize>, sync_ms_per_step: f64) -> [f64; FIELDS] {
    let gpu_mib = gpu.and_then(|g| burn_ddp::gpu_memory_used(g).ok()).map_or(0.0, |b| b as f64 / (1 << 20) as f64);
    [img_per_s, sync_share, peak_host_mib(), gpu_mib, sync_ms_per_step]
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
        log::info!("rank {r}: {:.1} img/s, gradient sync {:.1}% of training time ({:.2} ms/step), peak host memory {:.0} MiB, GPU memory in use {:.0} MiB", c[0], 100.0 * c[1], c[4], c[2], c[3]);
    }
    let ips: Vec<f64> = rows.iter().map(|c| c[0]).collect();
    log::info!("{} ranks: {:.1} img/s together, slowest/fastest rank {:.2}", rows.len(), ips.iter().sum::<f64>(), 1.0 / skew(&ips));
    let gpu: Vec<f64> = rows.iter().map(|c| c[3]).collect();
    let mem = if gpu.iter().any(|&g| g > 0.0) { gpu } else { rows.iter().map(|c| c[2]).collect() };
    let s = skew(&mem);
    if s > 1.35 {
        log::warn!("memory differs by {:.0}% between ranks (more than 35%): look for work done on one rank only (rank-0 logging, evaluation) or unequal batches", 100.0 * (s - 1.0));
    }
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
    fn peak_memory_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(peak_host_mib() > 1.0, "VmHWM of a running test process");
        }
    }
}
