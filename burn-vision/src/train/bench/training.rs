//! Training throughput on synthetic data: the same model, loss and optimiser step as `train`,
//! with random images, so data loading is out of the measurement — plain, or through
//! DistributedDataParallel (`--ddp`), so DDP's own cost is the difference of two runs.

use crate::error::Result;
use crate::model::classifier::Classifier;
use crate::model::image_classifier::ImageClassifier;
use crate::model::registry::create;
use crate::train::bench::config::BenchConfig;
use crate::train::bench::report::{BenchResult, DdpCost, FirstStep, HostTimes, Interleaved, ddp_cost};
use crate::train::config::OptimizerKind;
use crate::train::distributed::Distributed;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::backend::AutodiffBackend;
use burn_ddp::nn::CudnnTimes;
use burn_ddp::nn::cross_entropy;
use burn_ddp::nn::runtime::profile::cuda_profiler_range;
use burn_optim::momentum::MomentumConfig;
use burn_optim::{AdamWConfig, GradientsParams, Optimizer, SgdConfig};
use std::time::Instant;

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
    (x, y): &Batch<B>,
    device: &B::Device,
    gpu: usize,
) -> Option<f64> {
    let loss = cross_entropy(model.forward(x.clone()), y.clone(), 0.0);
    B::sync(device).ok()?;
    let gib = burn_ddp::nn::runtime::memory::report(gpu).map(|r| r.in_use_gib);
    drop(loss.backward());
    gib
}

/// One random batch on the device: images (in the model's memory order, viewed as NCHW) and
/// labels.
type Batch<B> = (Tensor<B, 4>, Tensor<B, 1, Int>);

/// The bench's model, initialised (rank 0's parameters in every rank under DDP, as in
/// training), and its random batch.
fn model_and_batch<B: AutodiffBackend>(
    config: &BenchConfig,
    device: &B::Device,
    dist: Option<&Distributed>,
) -> Result<(Classifier<B>, Batch<B>)> {
    B::seed(device, 0);
    let mut model: Classifier<B> = create(&config.model, config.classes, config.channels, config.small_input, device)?
        .with_precision(config.precision)
        .with_channels_last(config.channels_last);
    model = burn_ddp::params::initialized(model);
    if let Some(d) = dist {
        model = d.ddp.broadcast_module(model)?;
    }
    let shape = [config.batch_size, config.channels, config.image_size, config.image_size];
    // The batch stored in the model's memory order and viewed as NCHW, as PyTorch's baseline
    // holds its input (`.to(memory_format=torch.channels_last)`) and as the GPU JPEG decoder
    // delivers batches: a channels-last model reads it without a copy.
    let layout = model.layout();
    let x = layout.view_nchw(Tensor::<B, 4>::random(layout.from_nchw(shape), Distribution::Normal(0.0, 1.0), device));
    let y = Tensor::<B, 1, Int>::random([config.batch_size], Distribution::Uniform(0.0, config.classes as f64), device);
    Ok((model, (x, y)))
}

/// The bench's training step — forward, backward (through DDP or not) and the optimizer — and
/// what the steps add up: the images' upload seconds and each kind of step's host phases.
struct Stepper<'a, B: AutodiffBackend> {
    optim: BenchOptimizer<B>,
    dist: Option<&'a Distributed>,
    device: B::Device,
    batch: Batch<B>,
    /// Fresh host copies of the images, one per step (`--host-input`).
    host: Option<std::sync::mpsc::Receiver<Vec<f32>>>,
    upload_s: f64,
    /// Forward, backward and optimizer seconds of the plain steps (`[0]`) and the DDP steps.
    host_s: [[f64; 3]; 2],
}

impl<'a, B: AutodiffBackend> Stepper<'a, B> {
    fn new(config: &BenchConfig, dist: Option<&'a Distributed>, batch: Batch<B>, device: &B::Device) -> Self {
        Self {
            optim: BenchOptimizer::new(config.optimizer, config.burn_optimizer),
            dist,
            device: device.clone(),
            host: config.host_input.then(|| host_batches(&batch.0)),
            batch,
            upload_s: 0.0,
            host_s: [[0.0; 3]; 2],
        }
    }

    /// One step; `through_ddp`: through `dist`'s DDP (a plain step otherwise).
    fn step(&mut self, model: Classifier<B>, through_ddp: bool) -> Result<(Classifier<B>, Tensor<B, 1>)> {
        let x = match &self.host {
            Some(h) => {
                let images = h.recv().expect("the producer thread runs until the receiver is dropped");
                let t = Instant::now();
                let x = burn_ddp::nn::images_to_device(images, self.batch.0.dims(), &self.device);
                self.upload_s += t.elapsed().as_secs_f64();
                x
            }
            None => self.batch.0.clone(),
        };
        let t = Instant::now();
        let ddp_step = self.dist.filter(|_| through_ddp).map(|d| d.ddp.step(&model)).transpose()?;
        let loss = cross_entropy(model.forward(x), self.batch.1.clone(), 0.0);
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
        let model = self.optim.step(model, grads);
        let phases = &mut self.host_s[usize::from(through_ddp)];
        *phases = [phases[0] + t_fwd, phases[1] + t_bwd - t_fwd, phases[2] + t.elapsed().as_secs_f64() - t_bwd];
        Ok((model, loss))
    }
}

/// burn-ddp's counters of work done, read at one moment: the kernel caches on disk (`[files,
/// bytes]`), the fused bias + GELU, layer-norm and filter kernels' passes.
struct KernelCounters {
    cache: Option<(usize, u64)>,
    gelu: usize,
    layer_norm: usize,
    filter: usize,
}

impl KernelCounters {
    fn now() -> Self {
        Self {
            cache: burn_ddp::nn::runtime::kernel_cache::usage(),
            gelu: burn_ddp::nn::linear::gelu_kernel_calls(),
            layer_norm: burn_ddp::nn::layer_norm::kernel_forward_calls(),
            filter: burn_ddp::nn::filter_kernel_calls(),
        }
    }
}

/// What the timed steps measured.
struct Timed<B: AutodiffBackend> {
    /// The model they leave.
    model: Classifier<B>,
    seconds: f64,
    last_loss: f64,
    host: HostTimes,
    cudnn: CudnnTimes,
    upload_s: f64,
    threads: Vec<crate::train::instrument::thread_clock::ThreadTime>,
    ddp: Option<DdpCost>,
    interleaved: Option<Interleaved>,
    /// The counters before and after.
    kernels: [KernelCounters; 2],
}

/// Times `config.steps` steps of `stepper` from `model` (blocks of plain and DDP steps when
/// `interleave`d; `loss`: the warm-up's last), host-profiled when asked, inside the CUDA
/// profiler's range on a GPU and DDP's trace when stepping through it.
fn timed_steps<B: AutodiffBackend>(
    config: &BenchConfig,
    interleave: Option<usize>,
    stepper: &mut Stepper<B>,
    mut model: Classifier<B>,
    mut loss: Option<Tensor<B, 1>>,
) -> Result<Timed<B>> {
    let (device, dist) = (stepper.device.clone(), stepper.dist);
    let (t1, cudnn_before) = (Instant::now(), CudnnTimes::now());
    let profile = config
        .host_profile
        .as_deref()
        .filter(|_| !config.host_profile_first_step)
        .map(crate::train::instrument::host_profile::HostProfile::start)
        .transpose()?;
    if let Some(gpu) = config.gpu {
        cuda_profiler_range(true, gpu);
    }
    (stepper.upload_s, stepper.host_s) = (0.0, [[0.0; 3]; 2]);
    let kernels_before = KernelCounters::now();
    let ddp_before = dist.map(|d| d.ddp.stats());
    if dist.is_some() {
        burn_ddp::trace::start();
    }
    let clock = crate::train::instrument::thread_clock::ThreadClock::now();
    let mut blocks = Vec::new();
    for (through_ddp, n) in schedule(config.steps, dist.is_some(), interleave) {
        let t = Instant::now();
        for _ in 0..n {
            let (m, l) = stepper.step(model, through_ddp)?;
            model = m;
            loss = Some(l);
        }
        if interleave.is_some() {
            B::sync(&device).expect("device sync");
            blocks.push((through_ddp, n, t.elapsed().as_secs_f64()));
        }
    }
    let enqueued_s = t1.elapsed().as_secs_f64();
    let last_loss: f64 = loss.map_or(f64::NAN, |l| l.into_scalar().elem());
    B::sync(&device).expect("device sync");
    let seconds = t1.elapsed().as_secs_f64();
    let ddp_steps = if interleave.is_some() { blocks.iter().filter(|b| b.0).map(|b| b.1).sum() } else { config.steps };
    let ddp = dist.zip(ddp_before).map(|(d, before)| ddp_cost(d, &before, &burn_ddp::trace::stop(), ddp_steps));
    let interleaved = interleave.map(|n| Interleaved::from_blocks(n, config.batch_size, &blocks, stepper.host_s));
    let kernels = [kernels_before, KernelCounters::now()];
    let threads = crate::train::instrument::thread_clock::ThreadClock::now().since(&clock);
    if let Some(gpu) = config.gpu {
        cuda_profiler_range(false, gpu);
    }
    if let Some(profile) = profile {
        log::info!("bench: host profile written: {}", profile.finish()?.display());
    }
    let [forward_s, backward_s, optimizer_s] = std::array::from_fn(|i| stepper.host_s[0][i] + stepper.host_s[1][i]);
    Ok(Timed {
        model,
        seconds,
        last_loss,
        host: HostTimes { enqueued_s, forward_s, backward_s, optimizer_s },
        cudnn: CudnnTimes::now().since(&cudnn_before),
        upload_s: stepper.upload_s,
        threads,
        ddp,
        interleaved,
        kernels,
    })
}

/// Times `steps` steps of forward, backward and the bench's optimizer (SGD with momentum 0.9,
/// or AdamW) on random data, through `dist`'s DDP when given.
///
/// # Errors
/// For an unknown model, or a failed DDP step.
pub fn synthetic_throughput<B: AutodiffBackend>(
    config: &BenchConfig,
    device: &B::Device,
    dist: Option<&Distributed>,
) -> Result<BenchResult> {
    let (model, batch) = model_and_batch::<B>(config, device, dist)?;
    let interleave = interleave_blocks(config, dist)?;
    let mut stepper = Stepper::new(config, dist, batch, device);
    let first_step_profile = config.host_profile.as_deref().filter(|_| config.host_profile_first_step);
    // Interleaved, the warm-up alternates too, so both kinds of step are warm.
    let mut warm_steps = 0;
    let mut warm_step = |m| {
        warm_steps += 1;
        stepper.step(m, dist.is_some() && (interleave.is_none() || warm_steps % 2 == 0))
    };
    let (model, loss, first_step, warmup_seconds) =
        warm_up::<B>(config.warmup, device, model, &mut warm_step, first_step_profile)?;
    let memory_after_warmup = config.gpu.and_then(burn_ddp::nn::runtime::memory::report);
    if let Some(gpu) = config.gpu {
        burn_ddp::nn::runtime::memory::release_unused(gpu);
    }
    let timed = timed_steps(config, interleave, &mut stepper, model, loss)?;
    let [before, after] = &timed.kernels;
    // The pools as the timed steps left them, before the probe's forward and backward.
    let memory = config.gpu.and_then(burn_ddp::nn::runtime::memory::report);
    let in_use_after_forward_gib =
        config.gpu.and_then(|gpu| in_use_after_forward(&timed.model, &stepper.batch, device, gpu));
    Ok(BenchResult {
        config: config.clone(),
        seconds: timed.seconds,
        img_per_s: (config.steps * config.batch_size) as f64 / timed.seconds,
        warmup_seconds,
        first_step,
        device_used_gib: config
            .gpu
            .and_then(|g| burn_ddp::gpu_memory_used(g).ok())
            .map(|b| b as f64 / (1u64 << 30) as f64),
        memory_after_warmup,
        memory,
        in_use_after_forward_gib,
        last_loss: timed.last_loss,
        cudnn: timed.cudnn,
        upload_s: timed.upload_s,
        host: timed.host,
        threads: timed.threads,
        ddp: timed.ddp,
        kernel_cache: before.cache.zip(after.cache).map(|(a, b)| [a, b]),
        gelu_kernel_passes: after.gelu - before.gelu,
        layer_norm_kernel_passes: after.layer_norm - before.layer_norm,
        filter_kernel_passes: after.filter - before.filter,
        gpu_options: config.gpu.map(|_| burn_ddp::nn::options::get()),
        interleaved: timed.interleaved,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_alternate_plain_first_and_cover_every_step() {
        assert_eq!(schedule(7, true, None), vec![(true, 7)]);
        assert_eq!(schedule(7, false, None), vec![(false, 7)]);
        assert_eq!(schedule(7, true, Some(3)), vec![(false, 3), (true, 3), (false, 1)]);
        assert_eq!(schedule(8, true, Some(2)), vec![(false, 2), (true, 2), (false, 2), (true, 2)]);
    }
}
