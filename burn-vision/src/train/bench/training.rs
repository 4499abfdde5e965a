//! Training throughput on synthetic data: the same model, loss and optimiser step as `train`,
//! with random images, so data loading is out of the measurement — plain, or through
//! DistributedDataParallel (`--ddp`), so DDP's own cost is the difference of two runs.

use crate::error::Result;
use crate::model::classifier::Classifier;
use crate::model::image_classifier::ImageClassifier;
use crate::model::registry::create;
use crate::train::config::{
    DeviceSpec, OptimizerKind, default_bucket_cap_mb, parse_bucket_cap_mb, parse_grad_compression,
};
use crate::train::distributed::Distributed;
use burn::module::Module;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::backend::AutodiffBackend;
use burn_ddp::GradCompression;
use burn_ddp::nn::cross_entropy;
use burn_ddp::nn::runtime::memory::MemoryReport;
use burn_ddp::nn::runtime::profile::cuda_profiler_range;
use burn_ddp::nn::{CudnnTimes, Precision};
use burn_optim::momentum::MomentumConfig;
use burn_optim::{AdamWConfig, GradientsParams, Optimizer, SgdConfig};
use std::time::Instant;

/// What to measure; its fields are also `burn-vision bench`'s flags.
#[derive(Debug, Clone, serde::Serialize, clap::Args)]
pub struct BenchConfig {
    /// Registry name (see `burn-vision models`).
    #[arg(long, default_value = "resnet50")]
    pub model: String,
    /// Images per step.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Input side.
    #[arg(long, default_value_t = 224)]
    pub image_size: usize,
    /// Input channels.
    #[arg(long, default_value_t = 3)]
    pub channels: usize,
    /// Classes.
    #[arg(long, default_value_t = 1000)]
    pub classes: usize,
    /// Small-input stem (3×3, no max-pool).
    #[arg(long)]
    pub small_input: bool,
    /// Untimed steps first (autotune, kernel compilation, allocator warm-up).
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Copy each step's images from host memory, as training from files does (otherwise one
    /// batch made on the device is reused): the difference is the cost of the upload.
    #[serde(default)]
    #[arg(long)]
    pub host_input: bool,
    /// Activation precision: f32, bf16 or f16 (parameters stay f32).
    #[serde(default)]
    #[arg(long, default_value = "f32")]
    pub precision: Precision,
    /// Channels-last activations (PyTorch's channels_last; the default with --gpus).
    #[serde(default)]
    #[arg(long)]
    pub channels_last: bool,
    /// The CUDA GPU it runs on, e.g. `0`; the CPU when absent.
    #[serde(default)]
    #[arg(long = "gpus", value_name = "ID", value_parser = DeviceSpec::parse_one_gpu)]
    pub gpu: Option<usize>,
    /// Sample every host thread over the timed steps and write a flame graph and a summary of
    /// where their time went into this folder (a binary built with `--features host-profile`;
    /// [`crate::train::instrument::host_profile`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long, value_name = "DIR")]
    pub host_profile: Option<std::path::PathBuf>,
    /// Profile the first warm-up step (a fresh machine's cold start: compilation, autotuning,
    /// cuDNN's engine timing) instead of the timed steps.
    #[serde(default)]
    #[arg(long, requires = "host_profile")]
    pub host_profile_first_step: bool,
    /// The optimizer: `sgd` (momentum 0.9, lr 0.01) or `adamw` (lr 5e-4, weight decay 0.05: what
    /// ViT recipes train with), as burn-ddp's FusedSgd / FusedAdamW.
    #[arg(long, value_enum, default_value = "sgd")]
    pub optimizer: OptimizerKind,
    /// Update with burn's own `Sgd` or `AdamW` instead of burn-ddp's fused one (the same rule;
    /// one operation per step on CUDA instead of several per parameter).
    #[serde(default)]
    #[arg(long, alias = "burn-sgd")]
    pub burn_optimizer: bool,
    /// Step through DistributedDataParallel: under `burn-ddp launch` (or torchrun) in its
    /// world, else in a one-rank group of its own whose every bucket still goes through NCCL
    /// (TCP on the CPU): DDP's own cost is then the difference from the same command without
    /// it. There is no shortcut for one rank.
    #[serde(default)]
    #[arg(long)]
    pub ddp: bool,
    /// With --ddp, the type the gradients travel in: `none` (f32), `bf16` or `fp16`.
    #[serde(default)]
    #[arg(long, value_name = "TYPE", requires = "ddp", default_value = "none", value_parser = parse_grad_compression)]
    pub grad_compression: GradCompression,
    /// With --ddp, all-reduce every bucket after backward instead of during it (no gradient
    /// hooks; one rank — a launcher's NCCL world keeps the overlap).
    #[serde(default)]
    #[arg(long, requires = "ddp")]
    pub no_overlap: bool,
    /// With --ddp, the largest gradient bucket in MiB (PyTorch's `bucket_cap_mb`).
    #[arg(long, value_name = "MIB", requires = "ddp", default_value_t = default_bucket_cap_mb(), value_parser = parse_bucket_cap_mb)]
    pub bucket_cap_mb: f64,
    /// With --ddp in a one-rank group: the timed steps alternate blocks of STEPS steps without
    /// DDP and through it, in this one process (the same threads, memory and device), each block
    /// timed to the device's end: DDP's own cost without the spread between two processes,
    /// which on a host-bound step is larger than the cost itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_name = "STEPS", requires = "ddp")]
    pub ddp_interleave: Option<usize>,
}

/// The bench's optimizer: SGD (momentum 0.9) or AdamW (weight decay 0.05, as ViT recipes use
/// it), each as burn-ddp's fused optimizer or burn's own.
enum BenchOptimizer<B: AutodiffBackend> {
    BurnSgd(burn_optim::adaptor::OptimizerAdaptor<burn_optim::Sgd<B::InnerBackend>, Classifier<B>, B>),
    FusedSgd(burn_ddp::nn::FusedSgd<Classifier<B>, B>),
    BurnAdamW(burn_optim::adaptor::OptimizerAdaptor<burn_optim::AdamW, Classifier<B>, B>),
    FusedAdamW(burn_ddp::nn::FusedAdamW<Classifier<B>, B>),
}

impl<B: AutodiffBackend> BenchOptimizer<B> {
    fn new(kind: OptimizerKind, burn: bool) -> Self {
        match (kind, burn) {
            (OptimizerKind::Sgd, true) => {
                Self::BurnSgd(SgdConfig::new().with_momentum(Some(MomentumConfig::new().with_dampening(0.0))).init())
            }
            (OptimizerKind::Sgd, false) => {
                Self::FusedSgd(burn_ddp::nn::FusedSgdConfig { momentum: 0.9, ..Default::default() }.init())
            }
            (OptimizerKind::Adamw, true) => Self::BurnAdamW(AdamWConfig::new().with_weight_decay(0.05).init()),
            (OptimizerKind::Adamw, false) => {
                Self::FusedAdamW(burn_ddp::nn::FusedAdamWConfig { weight_decay: 0.05, ..Default::default() }.init())
            }
        }
    }

    /// The step at the optimizer's usual learning rate (SGD 0.01, AdamW 5e-4).
    fn step(&mut self, model: Classifier<B>, grads: GradientsParams) -> Classifier<B> {
        match self {
            Self::BurnSgd(o) => o.step(0.01, model, grads),
            Self::FusedSgd(o) => o.step(0.01, model, grads),
            Self::BurnAdamW(o) => o.step(5e-4, model, grads),
            Self::FusedAdamW(o) => o.step(5e-4, model, grads),
        }
    }
}

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
    fn from_blocks(block_steps: usize, batch: usize, blocks: &[(bool, usize, f64)], host_s: [[f64; 3]; 2]) -> Self {
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

/// A producer thread handing over a fresh host copy of `x` per step, as the loader's thread
/// does in training (so the copy is not the training thread's work).
fn host_batches<B: Backend>(x: &Tensor<B, 4>) -> std::sync::mpsc::Receiver<Vec<f32>> {
    let images: Vec<f32> = x.to_data().into_vec().expect("f32 images");
    let (tx, rx) = std::sync::mpsc::sync_channel(2);
    std::thread::spawn(move || while tx.send(images.clone()).is_ok() {});
    rx
}

/// The model after the warm-up, its last loss, the first step's split, the warm-up's seconds.
type WarmedUp<B> = (Classifier<B>, Option<Tensor<B, 1>>, FirstStep, f64);

/// The untimed warm-up steps (new shapes measured, kernels compiled: minutes on a fresh
/// machine, so each is logged); the first one synchronised and timed from the process's start,
/// and host-profiled into `profile` if given.
/// Returns the model, the last loss, the first step's split and the warm-up's seconds.
fn warm_up<B: AutodiffBackend>(
    steps: usize,
    device: &B::Device,
    mut model: Classifier<B>,
    step: &mut impl FnMut(Classifier<B>) -> Result<(Classifier<B>, Tensor<B, 1>)>,
    profile: Option<&std::path::Path>,
) -> Result<WarmedUp<B>> {
    B::sync(device).expect("device sync");
    let mut profile = profile.map(crate::train::instrument::host_profile::HostProfile::start).transpose()?;
    let (t0, cudnn0) = (Instant::now(), CudnnTimes::now());
    let mut first_step = FirstStep { setup_s: crate::since_start(), ..FirstStep::default() };
    let mut loss = None;
    for i in 0..steps {
        let (m, l) = step(model)?;
        model = m;
        loss = Some(l);
        B::sync(device).expect("device sync");
        if i == 0 {
            let (step_s, cudnn_s) = (t0.elapsed().as_secs_f64(), CudnnTimes::now().since(&cudnn0).cudnn_s);
            first_step = FirstStep { step_s, cudnn_s, total_s: crate::since_start(), ..first_step };
            if let Some(profile) = profile.take() {
                log::info!("bench: host profile of the first step written: {}", profile.finish()?.display());
            }
        }
        log::info!("bench: warm-up step {}/{steps} done at {:.1} s", i + 1, t0.elapsed().as_secs_f64());
    }
    Ok((model, loss, first_step, t0.elapsed().as_secs_f64()))
}

/// burn-cuda's live GiB on `gpu` after one more forward pass and its loss (synchronised there);
/// its backward then runs and its gradients are dropped.
fn in_use_after_forward<B: AutodiffBackend>(
    model: &Classifier<B>,
    (x, y): (&Tensor<B, 4>, &Tensor<B, 1, Int>),
    device: &B::Device,
    gpu: usize,
) -> Option<f64> {
    let loss = cross_entropy(model.forward(x.clone()), y.clone(), 0.0);
    B::sync(device).ok()?;
    let gib = burn_ddp::nn::runtime::memory::report(gpu).map(|r| r.in_use_gib);
    drop(loss.backward());
    gib
}

/// Times `steps` SGD steps (momentum 0.9) of forward, backward and update on random data,
/// through `dist`'s DDP when given.
///
/// # Errors
/// For an unknown model, or a failed DDP step.
pub fn synthetic_throughput<B: AutodiffBackend>(
    config: &BenchConfig,
    device: &B::Device,
    dist: Option<&Distributed>,
) -> Result<BenchResult> {
    B::seed(device, 0);
    let mut model: Classifier<B> = create(&config.model, config.classes, config.channels, config.small_input, device)?
        .with_precision(config.precision)
        .with_channels_last(config.channels_last);
    model = burn_ddp::params::initialized(model);
    if let Some(d) = dist {
        // Every rank starts from rank 0's parameters, as in training.
        model = d.ddp.broadcast_module(model)?;
    }
    let mut optim = BenchOptimizer::<B>::new(config.optimizer, config.burn_optimizer);
    let shape = [config.batch_size, config.channels, config.image_size, config.image_size];
    // The batch stored in the model's memory order and viewed as NCHW, as PyTorch's baseline
    // holds its input (`.to(memory_format=torch.channels_last)`) and as the GPU JPEG decoder
    // delivers batches: a channels-last model reads it without a copy.
    let layout = model.layout();
    let x = layout.view_nchw(Tensor::<B, 4>::random(layout.from_nchw(shape), Distribution::Normal(0.0, 1.0), device));
    let y = Tensor::<B, 1, Int>::random([config.batch_size], Distribution::Uniform(0.0, config.classes as f64), device);
    let host = config.host_input.then(|| host_batches(&x));
    let upload_s = std::cell::Cell::new(0.0);
    // Host phase seconds (forward, backward, optimizer) of the plain and of the DDP steps.
    let host_s = std::cell::Cell::new([[0.0f64; 3]; 2]);
    let interleave = interleave_blocks(config, dist)?;
    // `through_ddp`: this step goes through `dist`'s DDP (a plain step otherwise).
    let mut step = |model: Classifier<B>, through_ddp: bool| -> Result<(Classifier<B>, Tensor<B, 1>)> {
        let x = match &host {
            Some(h) => {
                let images = h.recv().expect("the producer thread runs until the receiver is dropped");
                let t = Instant::now();
                let x = burn_ddp::nn::images_to_device(images, shape, device);
                upload_s.set(upload_s.get() + t.elapsed().as_secs_f64());
                x
            }
            None => x.clone(),
        };
        let t = Instant::now();
        let ddp_step = dist.filter(|_| through_ddp).map(|d| d.ddp.step(&model)).transpose()?;
        let loss = cross_entropy(model.forward(x), y.clone(), 0.0);
        let t_fwd = t.elapsed().as_secs_f64();
        let (grads, t_bwd) = match ddp_step {
            // DDP's backward hands over and averages the gradients too.
            Some(s) => (s.backward(loss.clone(), &model)?, t.elapsed().as_secs_f64()),
            None => {
                let grads = loss.backward();
                let t_bwd = t.elapsed().as_secs_f64();
                (GradientsParams::from_grads(grads, &model), t_bwd)
            }
        };
        let model = optim.step(model, grads);
        let mut h = host_s.get();
        let phases = &mut h[usize::from(through_ddp)];
        *phases = [phases[0] + t_fwd, phases[1] + t_bwd - t_fwd, phases[2] + t.elapsed().as_secs_f64() - t_bwd];
        host_s.set(h);
        Ok((model, loss))
    };
    let first_step_profile = config.host_profile.as_deref().filter(|_| config.host_profile_first_step);
    // Interleaved, the warm-up alternates too, so both kinds of step are warm.
    let mut warm_steps = 0;
    let mut warm_step = |m| {
        warm_steps += 1;
        step(m, dist.is_some() && (interleave.is_none() || warm_steps % 2 == 0))
    };
    let (m, mut loss, first_step, warmup_seconds) =
        warm_up::<B>(config.warmup, device, model, &mut warm_step, first_step_profile)?;
    model = m;
    let memory_after_warmup = config.gpu.and_then(burn_ddp::nn::runtime::memory::report);
    if let Some(gpu) = config.gpu {
        burn_ddp::nn::runtime::memory::release_unused(gpu);
    }
    let (t1, before) = (Instant::now(), CudnnTimes::now());
    let upload_before = upload_s.get();
    let profile = config
        .host_profile
        .as_deref()
        .filter(|_| !config.host_profile_first_step)
        .map(crate::train::instrument::host_profile::HostProfile::start)
        .transpose()?;
    if let Some(gpu) = config.gpu {
        cuda_profiler_range(true, gpu);
    }
    host_s.set([[0.0; 3]; 2]);
    let cache_before = burn_ddp::nn::runtime::kernel_cache::usage();
    let gelu_before = burn_ddp::nn::linear::gelu_kernel_calls();
    let ln_before = burn_ddp::nn::layer_norm::kernel_forward_calls();
    let filter_before = burn_ddp::nn::filter_kernel_calls();
    let ddp_before = dist.map(|d| d.ddp.stats());
    if dist.is_some() {
        burn_ddp::trace::start();
    }
    let clock = crate::train::instrument::thread_clock::ThreadClock::now();
    let mut blocks = Vec::new();
    for (through_ddp, n) in schedule(config.steps, dist.is_some(), interleave) {
        let t = Instant::now();
        for _ in 0..n {
            let (m, l) = step(model, through_ddp)?;
            model = m;
            loss = Some(l);
        }
        if interleave.is_some() {
            B::sync(device).expect("device sync");
            blocks.push((through_ddp, n, t.elapsed().as_secs_f64()));
        }
    }
    let enqueued_s = t1.elapsed().as_secs_f64();
    let last_loss: f64 = loss.map_or(f64::NAN, |l| l.into_scalar().elem());
    B::sync(device).expect("device sync");
    let seconds = t1.elapsed().as_secs_f64();
    let ddp_steps = blocks.iter().filter(|b| b.0).map(|b| b.1).sum::<usize>();
    let ddp_steps = if interleave.is_some() { ddp_steps } else { config.steps };
    let ddp = dist.zip(ddp_before).map(|(d, before)| ddp_cost(d, &before, &burn_ddp::trace::stop(), ddp_steps));
    let interleaved = interleave.map(|n| Interleaved::from_blocks(n, config.batch_size, &blocks, host_s.get()));
    let host_s = host_s.get();
    let host_s: [f64; 3] = std::array::from_fn(|i| host_s[0][i] + host_s[1][i]);
    let kernel_cache = cache_before.zip(burn_ddp::nn::runtime::kernel_cache::usage()).map(|(a, b)| [a, b]);
    let gelu_kernel_passes = burn_ddp::nn::linear::gelu_kernel_calls() - gelu_before;
    let layer_norm_kernel_passes = burn_ddp::nn::layer_norm::kernel_forward_calls() - ln_before;
    let filter_kernel_passes = burn_ddp::nn::filter_kernel_calls() - filter_before;
    let threads = crate::train::instrument::thread_clock::ThreadClock::now().since(&clock);
    if let Some(gpu) = config.gpu {
        cuda_profiler_range(false, gpu);
    }
    if let Some(profile) = profile {
        log::info!("bench: host profile written: {}", profile.finish()?.display());
    }
    let cudnn = CudnnTimes::now().since(&before);
    let _ = model.num_params();
    let upload_s = upload_s.get() - upload_before;
    // The pools as the timed steps left them, before the probe's forward and backward.
    let memory = config.gpu.and_then(burn_ddp::nn::runtime::memory::report);
    let in_use_after_forward_gib = config.gpu.and_then(|gpu| in_use_after_forward(&model, (&x, &y), device, gpu));
    Ok(BenchResult {
        config: config.clone(),
        seconds,
        img_per_s: (config.steps * config.batch_size) as f64 / seconds,
        warmup_seconds,
        first_step,
        device_used_gib: config
            .gpu
            .and_then(|g| burn_ddp::gpu_memory_used(g).ok())
            .map(|b| b as f64 / (1u64 << 30) as f64),
        memory_after_warmup,
        memory,
        in_use_after_forward_gib,
        last_loss,
        cudnn,
        upload_s,
        host: HostTimes { enqueued_s, forward_s: host_s[0], backward_s: host_s[1], optimizer_s: host_s[2] },
        threads,
        ddp,
        kernel_cache,
        gelu_kernel_passes,
        layer_norm_kernel_passes,
        filter_kernel_passes,
        gpu_options: config.gpu.map(|_| burn_ddp::nn::options::get()),
        interleaved,
    })
}

/// `--ddp-interleave`'s block length, refused unless the DDP world is this one process (other
/// ranks' parameters would drift apart during the plain blocks).
fn interleave_blocks(config: &BenchConfig, dist: Option<&Distributed>) -> Result<Option<usize>> {
    let Some(n) = config.ddp_interleave else { return Ok(None) };
    let refuse = |reason: &str| crate::error::Error::InvalidConfig {
        name: "--ddp-interleave",
        value: n.to_string(),
        reason: reason.into(),
    };
    if n == 0 {
        return Err(refuse("a block needs at least one step"));
    }
    match dist {
        Some(d) if d.world == 1 => Ok(Some(n)),
        Some(d) => Err(refuse(&format!(
            "it needs a world of one process (this one has {} ranks); run `bench --ddp` without it under the launcher",
            d.world
        ))),
        None => Err(refuse("it needs --ddp")),
    }
}

/// The timed steps as `(through DDP, steps)` blocks: one block of all `steps` (through DDP when
/// `ddp`), or alternating blocks of `interleave` steps, plain first.
fn schedule(steps: usize, ddp: bool, interleave: Option<usize>) -> Vec<(bool, usize)> {
    match interleave {
        None => vec![(ddp, steps)],
        Some(n) => (0..steps.div_ceil(n)).map(|b| (b % 2 == 1, n.min(steps - b * n))).collect(),
    }
}

/// DDP's statistics since `before` and its trace `spans`, per step.
fn ddp_cost(d: &Distributed, before: &burn_ddp::SyncStats, spans: &[burn_ddp::trace::Span], steps: usize) -> DdpCost {
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

    #[test]
    fn blocks_alternate_plain_first_and_cover_every_step() {
        assert_eq!(schedule(7, true, None), vec![(true, 7)]);
        assert_eq!(schedule(7, false, None), vec![(false, 7)]);
        assert_eq!(schedule(7, true, Some(3)), vec![(false, 3), (true, 3), (false, 1)]);
        assert_eq!(schedule(8, true, Some(2)), vec![(false, 2), (true, 2), (false, 2), (true, 2)]);
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
