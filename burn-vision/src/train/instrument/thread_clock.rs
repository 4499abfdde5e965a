//! Where the host's threads spend a benchmark: CPU seconds per thread, from `/proc` (Linux
//! only).
//!
//! On burn-cuda three threads share a training step: the training thread (autodiff, fusion
//! registrations), burn-fusion's server (`DSU-…`: fusing, launching) and cubecl's compute
//! server (`DSD-…`: kernel launches, memory, cuDNN). They are joined by bounded queues, so the
//! busiest of them sets the pace when the GPU does not; the per-thread times say which.
//! Idle server threads spin a little before they sleep, so their time is an upper bound.

use std::collections::BTreeMap;

/// CPU seconds of one thread over an interval.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ThreadTime {
    /// The thread's name (`comm`), e.g. `main`, `DSU-0-0`.
    pub name: String,
    /// User + system CPU seconds.
    pub cpu_s: f64,
}

/// A snapshot of every thread's CPU time (empty where `/proc` is unavailable).
#[derive(Debug, Clone, Default)]
pub struct ThreadClock {
    ticks: BTreeMap<u32, (String, u64)>,
}

const TICKS_PER_SECOND: f64 = 100.0;

impl ThreadClock {
    /// Reads `/proc/self/task/*/stat` now.
    pub fn now() -> Self {
        let mut ticks = BTreeMap::new();
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return Self { ticks };
        };
        for entry in dir.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            if let Some(parsed) = parse_stat(&stat) {
                ticks.insert(tid, parsed);
            }
        }
        Self { ticks }
    }

    /// Each thread's CPU seconds since `earlier` (threads started since count from zero),
    /// busiest first; threads with less than 10 ms are left out.
    pub fn since(&self, earlier: &ThreadClock) -> Vec<ThreadTime> {
        let mut out: Vec<ThreadTime> = self
            .ticks
            .iter()
            .map(|(tid, (name, t))| {
                let before = earlier.ticks.get(tid).map_or(0, |(_, b)| *b);
                ThreadTime { name: name.clone(), cpu_s: t.saturating_sub(before) as f64 / TICKS_PER_SECOND }
            })
            .filter(|t| t.cpu_s >= 0.01)
            .collect();
        out.sort_by(|a, b| b.cpu_s.total_cmp(&a.cpu_s));
        out
    }
}

/// `(comm, utime + stime)` of one `/proc/<pid>/task/<tid>/stat` line. The name sits in
/// parentheses and may itself hold spaces or parentheses: fields are counted after the last `)`.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let name = stat.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15), so indices 11 and 12 here.
    let (utime, stime) = (fields.get(11)?.parse::<u64>().ok()?, fields.get(12)?.parse::<u64>().ok()?);
    Some((name, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "4242 (DS D-0 (x)) S 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_stat(line), Some(("DS D-0 (x)".to_string(), 281)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_thread_shows_up_after_work() {
        let before = ThreadClock::now();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 60 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = ThreadClock::now();
        if before.ticks.is_empty() {
            eprintln!("SKIP: /proc/self/task is not readable here; thread times are not measured on this system");
            return;
        }
        let busy: f64 = after.since(&before).iter().map(|t| t.cpu_s).sum();
        assert!(busy >= 0.02, "60 ms of spinning showed as {busy} s of CPU");
    }
}
