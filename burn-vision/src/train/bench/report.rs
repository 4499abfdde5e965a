//! What `burn-vision bench` reports: speed, the first step's split, memory, the training
//! thread's phases and DDP's own cost per step (its trace spans, the backend threads' share) —
//! the types and the arithmetic from raw timings to them.

use crate::train::bench::config::BenchConfig;
use crate::train::distributed::Distributed;
use burn_ddp::nn::CudnnTimes;
use burn_ddp::nn::runtime::memory::MemoryReport;

/// The measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    /// The settings.
    pub config: BenchConfig,
    /// Seconds for the timed steps (device synchronised at both ends).
    pub seconds: f64,
    /// Training images per second.
    pub img_per_s: f64,
    /// Seconds of the warm-up steps.
    pub warmup_seconds: f64,
    /// Where the time to the first step went: from the process's start.
    pub first_step: FirstStep,
    /// GiB of device memory in use after the timed steps (every process on the GPU, as
    /// `cuMemGetInfo` / nvidia-smi count it: burn's pools, cuDNN's workspaces, the CUDA
    /// context); `None` on the CPU.
    pub device_used_gib: Option<f64>,
    /// burn-cuda's pools after the warm-up steps (autotune's and cuDNN's trial runs
    /// included); `None` on the CPU.
    pub memory_after_warmup: Option<MemoryReport>,
    /// burn-cuda's pools after the timed steps: the warm-up's unused pages were handed back
    /// before them, so this is what training holds; `None` on the CPU.
    pub memory: Option<MemoryReport>,
    /// GiB in live tensors at the end of one more forward pass: parameters, optimizer state and
    /// what the step saves for its backward (its peak, short of the backward's temporaries);
    /// `None` on the CPU.
    pub in_use_after_forward_gib: Option<f64>,
    /// Loss of the last step (must be finite).
    pub last_loss: f64,
    /// Where the host waited during the timed steps, on the cuDNN path (all zero elsewhere).
    pub cudnn: CudnnTimes,
    /// Host seconds spent handing the timed steps' images to the device (`host_input` only).
    pub upload_s: f64,
    /// The training thread's own time over the timed steps.
    pub host: HostTimes,
    /// CPU seconds of each of the process's threads over the timed steps, busiest first
    /// (Linux; empty elsewhere): which host thread sets the pace.
    pub threads: Vec<crate::train::instrument::thread_clock::ThreadTime>,
    /// DDP's own cost over the timed steps (`ddp` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ddp: Option<DdpCost>,
    /// burn-ddp's kernel caches on disk, `[files, bytes]` before and after the timed steps:
    /// the same when the steady steps compiled and tuned nothing new (`None` without caches).
    pub kernel_cache: Option<[(usize, u64); 2]>,
    /// Passes of the fused bias + GELU kernel (`burn_ddp::nn::linear_gelu`) over the timed
    /// steps: two per MLP block and step when it ran, 0 when burn's operations did.
    pub gelu_kernel_passes: usize,
    /// Layer norms whose forward ran on burn-ddp's own kernel over the timed steps
    /// (`CudnnOptions::layer_norm_kernel`), 0 when cuDNN's or burn's ran.
    pub layer_norm_kernel_passes: usize,
    /// Convolution filters and filter gradients reordered by burn-ddp's filter kernel over the
    /// timed steps (`CudnnOptions::filter_kernel`): two per convolution and step when it ran.
    pub filter_kernel_passes: usize,
    /// The GPU layers' options in force (`burn_ddp::nn::CudnnOptions`, from the
    /// `BURN_DDP_*` variables): which fast paths this run took; `None` on the CPU.
    pub gpu_options: Option<burn_ddp::nn::CudnnOptions>,
    /// Plain and DDP blocks of one process side by side (`ddp_interleave` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interleaved: Option<Interleaved>,
}

/// The timed steps of `bench --ddp --ddp-interleave N`: blocks of N steps alternately without
/// DDP and through it, plain first.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Interleaved {
    /// Steps per block.
    pub block_steps: usize,
    /// Images per second over all plain blocks, and over all DDP blocks.
    pub plain_img_per_s: f64,
    pub ddp_img_per_s: f64,
    /// `ddp_img_per_s / plain_img_per_s`.
    pub ratio: f64,
    /// Each DDP block's speed over the plain block before it, in order, and their median.
    pub pair_ratios: Vec<f64>,
    pub median_pair_ratio: f64,
    /// The training thread's milliseconds per step in forward, backward (with DDP's hand-over
    /// and wait) and the optimizer, over the plain steps and over the DDP steps: which phase
    /// DDP's cost lands in.
    pub plain_host_ms: [f64; 3],
    pub ddp_host_ms: [f64; 3],
}

impl Interleaved {
    /// From each block's `(through DDP, steps, seconds)`, in the order they ran, and the host
    /// phase seconds summed over the plain steps and over the DDP steps.
    pub(super) fn from_blocks(
        block_steps: usize,
        batch: usize,
        blocks: &[(bool, usize, f64)],
        host_s: [[f64; 3]; 2],
    ) -> Self {
        // Steps and seconds over the plain blocks (false) or the DDP blocks (true).
        let totals = |ddp: bool| blocks.iter().filter(|b| b.0 == ddp).fold((0, 0.0), |(n, s), b| (n + b.1, s + b.2));
        let speed = |ddp: bool| {
            let (n, s) = totals(ddp);
            (n * batch) as f64 / s
        };
        let per_block = |b: &(bool, usize, f64)| b.1 as f64 / b.2;
        let pair_ratios: Vec<f64> =
            blocks.windows(2).filter(|w| !w[0].0 && w[1].0).map(|w| per_block(&w[1]) / per_block(&w[0])).collect();
        let mut sorted = pair_ratios.clone();
        sorted.sort_by(f64::total_cmp);
        let median_pair_ratio = match sorted.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        let (plain, ddp) = (speed(false), speed(true));
        let per_step_ms = |ddp: bool| host_s[usize::from(ddp)].map(|s| s * 1e3 / totals(ddp).0.max(1) as f64);
        Self {
            block_steps,
            plain_img_per_s: plain,
            ddp_img_per_s: ddp,
            ratio: ddp / plain,
            pair_ratios,
            median_pair_ratio,
            plain_host_ms: per_step_ms(false),
            ddp_host_ms: per_step_ms(true),
        }
    }
}

/// What DDP did per timed step (`bench --ddp`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DdpCost {
    /// Ranks in the group, and its backend (`nccl`, `tcp`).
    pub world: usize,
    pub backend: &'static str,
    /// Buckets all-reduced per step, and of those the ones summed on the device and the ones
    /// started while backward still ran.
    pub buckets: f64,
    pub on_device: f64,
    pub started_in_backward: f64,
    /// burn tensor operations DDP's reduction enqueued per step.
    pub operations: f64,
    /// Host milliseconds per step inside DDP's own code (its trace spans, overlaps merged).
    pub host_ms: f64,
    /// Milliseconds per step the training thread waited in DDP after backward (the exposed
    /// sync: on the device route, only the joins' enqueueing).
    pub exposed_ms: f64,
    /// Per trace span: milliseconds per step.
    pub spans: std::collections::BTreeMap<String, f64>,
    /// Milliseconds per step DDP's collectives kept the backend's own threads busy (burn-fusion's
    /// and cubecl's device thread: a bucket's hand-over to the collective's stream and its
    /// join; overlaps merged per thread): where a host-bound step pays for DDP beyond the
    /// training thread's own spans.
    pub backend_threads_ms: f64,
    /// The same per span (`ddp: hand a bucket over (device thread)`, …).
    pub backend_thread_spans: std::collections::BTreeMap<String, f64>,
    /// Milliseconds per step burn-ddp's enqueue thread spent enqueueing buckets' collectives
    /// (`BURN_DDP_ENQUEUE_THREAD=1`; 0 without it, when the device thread does that work).
    pub enqueue_thread_ms: f64,
    /// Milliseconds per step of each part of the NCCL collectives' enqueue (timing events, the
    /// work before and after, the NCCL group), on whichever thread enqueued them.
    pub collective_parts: std::collections::BTreeMap<String, f64>,
}

/// Host milliseconds per step inside the spans of category `cat` (each thread's overlapping
/// spans merged), and each span name's milliseconds per step.
fn span_ms(spans: &[burn_ddp::trace::Span], steps: usize, cat: &str) -> (f64, std::collections::BTreeMap<String, f64>) {
    let mut by_name = std::collections::BTreeMap::<String, f64>::new();
    let mut intervals: Vec<(u64, f64, f64)> = Vec::new();
    for s in spans.iter().filter(|s| s.cat == cat) {
        *by_name.entry(s.name.clone()).or_default() += s.dur_us / 1e3 / steps as f64;
        intervals.push((s.thread, s.start_us, s.start_us + s.dur_us));
    }
    intervals.sort_by(|a, b| (a.0, a.1).partial_cmp(&(b.0, b.1)).expect("finite times"));
    let (mut total_us, mut open): (f64, Option<(u64, f64, f64)>) = (0.0, None);
    for (thread, start, end) in intervals {
        open = match open {
            Some((t, s, e)) if t == thread && start <= e => Some((t, s, e.max(end))),
            Some((_, s, e)) => {
                total_us += e - s;
                Some((thread, start, end))
            }
            None => Some((thread, start, end)),
        };
    }
    total_us += open.map_or(0.0, |(_, s, e)| e - s);
    (total_us / 1e3 / steps as f64, by_name)
}

/// Where the time to the first step went (the cold start a user waits through).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct FirstStep {
    /// Process start → the model built and the first batch on the device.
    pub setup_s: f64,
    /// The first step itself, synchronised: burn's kernels compiled (NVRTC) and autotuned,
    /// cuDNN's engines chosen, the allocator's first pools.
    pub step_s: f64,
    /// Of the step: seconds in cuDNN's calls (engine timing on first use, and execution).
    pub cudnn_s: f64,
    /// Process start → the first step finished: what the user waits for.
    pub total_s: f64,
}

/// Where the training thread spent the timed steps. When `enqueued_s` is close to the whole
/// run's `seconds`, the host (this thread, or a device thread it waits for) sets the pace,
/// not the GPU.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct HostTimes {
    /// Until the last step was handed over (before the final synchronisation).
    pub enqueued_s: f64,
    /// Building the forward pass and the loss.
    pub forward_s: f64,
    /// `backward()`.
    pub backward_s: f64,
    /// Gradients to parameters and the optimizer step.
    pub optimizer_s: f64,
}

/// DDP's statistics since `before` and its trace `spans`, per step.
pub(super) fn ddp_cost(
    d: &Distributed,
    before: &burn_ddp::SyncStats,
    spans: &[burn_ddp::trace::Span],
    steps: usize,
) -> DdpCost {
    let now = d.ddp.stats();
    let per_step = |a: usize, b: usize| (a - b) as f64 / steps as f64;
    let (backend_threads_ms, backend_thread_spans) = span_ms(spans, steps, burn_ddp::trace::DDP_BACKEND_THREADS);
    let (enqueue_thread_ms, _) = span_ms(spans, steps, burn_ddp::trace::DDP_ENQUEUE_THREAD);
    let (_, collective_parts) = span_ms(spans, steps, burn_ddp::trace::DDP_COLLECTIVE);
    let (host_ms, spans) = span_ms(spans, steps, burn_ddp::trace::DDP);
    DdpCost {
        world: d.world,
        backend: d.device_group.backend(),
        buckets: per_step(now.buckets, before.buckets),
        on_device: per_step(now.on_device, before.on_device),
        started_in_backward: per_step(now.overlapped, before.overlapped),
        operations: per_step(now.operations, before.operations),
        host_ms,
        exposed_ms: (now.seconds - before.seconds) * 1e3 / steps as f64,
        spans,
        backend_threads_ms,
        backend_thread_spans,
        enqueue_thread_ms,
        collective_parts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_time_merges_each_threads_overlaps_and_keeps_categories_apart() {
        let span = |name: &str, cat: &'static str, thread: u64, start_us: f64, dur_us: f64| burn_ddp::trace::Span {
            name: name.into(),
            cat,
            thread,
            start_us,
            dur_us,
            args: serde_json::Value::Null,
        };
        let (ddp, backend) = (burn_ddp::trace::DDP, burn_ddp::trace::DDP_BACKEND_THREADS);
        let spans = [
            span("a", ddp, 1, 0.0, 400.0),
            span("b", ddp, 1, 100.0, 100.0), // inside a: adds no time to the total
            span("a", ddp, 2, 0.0, 200.0),   // another thread: adds its own
            span("h", backend, 3, 0.0, 600.0),
            span("j", backend, 3, 500.0, 300.0), // overlaps h by 100 µs
        ];
        let (total, by_name) = span_ms(&spans, 2, ddp);
        assert!((total - 0.3).abs() < 1e-9, "(400 + 200) µs over 2 steps: {total}");
        assert!((by_name["a"] - 0.3).abs() < 1e-9 && (by_name["b"] - 0.05).abs() < 1e-9, "{by_name:?}");
        let (total, by_name) = span_ms(&spans, 2, backend);
        assert!((total - 0.4).abs() < 1e-9, "800 µs of thread 3 over 2 steps: {total}");
        assert_eq!(by_name.len(), 2);
    }

    /// Speeds and ratios worked out by hand: plain blocks of 2 steps in 1 s and 0.5 s, DDP
    /// blocks of 2 steps in 2 s and 1 s, batch 10.
    #[test]
    fn interleaved_speeds_and_pair_ratios() {
        let blocks = [(false, 2, 1.0), (true, 2, 2.0), (false, 2, 0.5), (true, 2, 1.0)];
        // Host phases: 4 plain steps and 4 DDP steps.
        let r = Interleaved::from_blocks(2, 10, &blocks, [[4.0, 8.0, 12.0], [4.0, 16.0, 12.0]]);
        assert!((r.plain_img_per_s - 40.0 / 1.5).abs() < 1e-12);
        assert!((r.ddp_img_per_s - 40.0 / 3.0).abs() < 1e-12);
        assert!((r.ratio - 0.5).abs() < 1e-12);
        assert_eq!(r.pair_ratios, vec![0.5, 0.5]);
        assert_eq!(r.median_pair_ratio, 0.5);
        assert_eq!((r.plain_host_ms, r.ddp_host_ms), ([1e3, 2e3, 3e3], [1e3, 4e3, 3e3]));
        let odd = Interleaved::from_blocks(
            1,
            1,
            &[(false, 1, 1.0), (true, 1, 2.0), (false, 1, 1.0), (true, 1, 1.0)],
            [[0.0; 3]; 2],
        );
        assert_eq!((odd.pair_ratios.clone(), odd.median_pair_ratio), (vec![0.5, 1.0], 0.75));
    }
}
