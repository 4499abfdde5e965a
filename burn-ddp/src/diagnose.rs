//! `BURN_DDP_DIAGNOSE`: parts of DDP's step on the device left out, in a world of one, so that
//! each part's cost can be timed (`burn-vision bench --ddp --ddp-interleave`). Imports nothing
//! of ours: the reducer reads it, and the device route below it (`cuda_tensor`) obeys it.

/// What `BURN_DDP_DIAGNOSE` leaves out of each step's buckets on the device, so that DDP's
/// parts can be timed apart (`burn-vision bench --ddp`). Read once; honoured in a world of one
/// only, where what it leaves out changes no value, and ignored with a warning elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Diagnose {
    /// Unset: everything runs.
    Nothing,
    /// `no-collective`: each bucket is handed to NCCL's stream and joined as usual (the fences,
    /// the bucket copies) without NCCL's all-reduce.
    NoCollective,
    /// `fences-only`: each bucket's operation orders NCCL's stream after burn's and burn's
    /// after it (the events, the join) with nothing in between: no copies, no collective, no
    /// timing events (where every gradient is summed in place; elsewhere as `no-collective`).
    FencesOnly,
    /// `no-stream-work`: each bucket's operation and the join run on burn-fusion's stream, but
    /// hand nothing to NCCL's stream (no fences, copies or all-reduce; the join waits for
    /// nothing).
    NoStreamWork,
    /// `no-device-ops`: no bucket operation at all; each gradient is returned as backward
    /// left it (the plan, the gradient hooks and the hand-over still run).
    NoDeviceOps,
}

impl Diagnose {
    /// The setting for a group of `world` ranks.
    pub(crate) fn get(world: usize) -> Self {
        static SET: std::sync::OnceLock<Diagnose> = std::sync::OnceLock::new();
        let set = *SET.get_or_init(|| match std::env::var("BURN_DDP_DIAGNOSE").as_deref() {
            Err(_) | Ok("") => Self::Nothing,
            Ok("no-collective") => Self::NoCollective,
            Ok("fences-only") => Self::FencesOnly,
            Ok("no-stream-work") => Self::NoStreamWork,
            Ok("no-device-ops") => Self::NoDeviceOps,
            Ok(other) => {
                log::warn!(
                    "BURN_DDP_DIAGNOSE={other} ignored: it takes no-collective, fences-only, no-stream-work or no-device-ops"
                );
                Self::Nothing
            }
        });
        if set != Self::Nothing && world > 1 {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| log::warn!("BURN_DDP_DIAGNOSE ignored: it applies to a world of one rank only"));
            return Self::Nothing;
        }
        set
    }
}

/// A host thread of a DDP step on the device (see [`spin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostThread {
    /// The thread that runs the training step and queues burn's operations.
    Training,
    /// burn-fusion's thread, which runs the queued operations (DDP's bucket hand-over).
    Fusion,
    /// cubecl's device thread, which launches kernels (DDP's addresses, fences and NCCL calls).
    Device,
}

/// `BURN_DDP_DIAGNOSE_SPIN=THREAD:MICROSECONDS` (`training`, `fusion` or `device`): that thread
/// is kept busy that long once per DDP step on the device, in the step's last bucket operation
/// (the device thread in every join of work on another stream: also in each SyncBatchNorm
/// exchange's) — a known amount of host work on one thread, to find which thread sets a
/// host-bound step's pace (a step slows by the whole amount only where that thread does). Read
/// once; changes no value, in any world.
pub(crate) fn spin(thread: HostThread) {
    static SET: std::sync::OnceLock<Option<(HostThread, std::time::Duration)>> = std::sync::OnceLock::new();
    let set = SET.get_or_init(|| {
        let v = std::env::var("BURN_DDP_DIAGNOSE_SPIN").ok().filter(|v| !v.is_empty())?;
        let parsed = parse_spin(&v);
        if parsed.is_none() {
            log::warn!(
                "BURN_DDP_DIAGNOSE_SPIN={v} ignored: it takes training, fusion or device, a colon and whole microseconds (e.g. fusion:300)"
            );
        }
        parsed
    });
    if let Some((t, d)) = *set
        && t == thread
    {
        let started = std::time::Instant::now();
        while started.elapsed() < d {
            std::hint::spin_loop();
        }
    }
}

/// `THREAD:MICROSECONDS` as [`spin`] takes it.
fn parse_spin(v: &str) -> Option<(HostThread, std::time::Duration)> {
    let (name, us) = v.split_once(':')?;
    let thread = match name.trim() {
        "training" => HostThread::Training,
        "fusion" => HostThread::Fusion,
        "device" => HostThread::Device,
        _ => return None,
    };
    Some((thread, std::time::Duration::from_micros(us.trim().parse().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn spin_settings_name_a_thread_and_whole_microseconds() {
        assert_eq!(parse_spin("fusion:300"), Some((HostThread::Fusion, Duration::from_micros(300))));
        assert_eq!(parse_spin("training: 1000"), Some((HostThread::Training, Duration::from_millis(1))));
        assert_eq!(parse_spin("device:0"), Some((HostThread::Device, Duration::ZERO)));
        for bad in ["fusion", "gpu:300", "fusion:-3", "fusion:1.5", ":300", "none"] {
            assert_eq!(parse_spin(bad), None, "{bad}");
        }
    }
}
