//! The `burn-vision` command: `train`, `eval`, `predict`, `export`, `bench`. Thin: clap arguments become a
//! `TrainConfig` and the library does the work.

use anyhow::Result;
use burn_vision::data::{DataBenchConfig, DataSource, load_source};
use burn_vision::model::list_models;
use burn_vision::train::bench::training::BenchConfig;
use burn_vision::train::inference::predict::restore;
use burn_vision::train::inference::requests::{EvalRequest, evaluate_checkpoint, predict_paths};
use burn_vision::train::{DeviceSpec, OptimizerKind, TrainConfig, run, run_bench};
use burn_vision::weights::{WeightFormat, export, scheme_index};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "burn-vision", version, about = "Train, evaluate and run image classifiers on Burn")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Train a model (with no flags: ResNet-10-mini on the bundled Fashion-MNIST subset, CPU).
    #[command(allow_negative_numbers = true)]
    Train(TrainArgs),
    /// Evaluate a checkpoint on the validation split of its data (or all of --data).
    Eval(EvalArgs),
    /// Print the top classes of each image.
    Predict(PredictArgs),
    /// Measure training throughput on synthetic data (prints one JSON line).
    #[command(allow_negative_numbers = true)]
    Bench(BenchArgs),
    /// Measure how fast the input pipeline alone delivers batches (prints one JSON line).
    BenchData(BenchDataArgs),
    /// Write a checkpoint's model as PyTorch weights (torchvision / timm names), for
    /// `model.load_state_dict(..., strict=True)`.
    Export(ExportArgs),
    /// Draw the training curves of one or several runs (loss, accuracy, learning rate, img/s
    /// per epoch, from each run's metrics.jsonl) into a PNG.
    Plot(PlotArgs),
    /// List the models in the registry.
    Models,
}

#[derive(Args)]
struct PlotArgs {
    /// Run folders (--out of `train`), overlaid in one figure, e.g. runs/1gpu runs/2gpu.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// The PNG to write.
    #[arg(short, long, default_value = "curves.png")]
    output: PathBuf,
}

#[derive(Args)]
struct ExportArgs {
    /// A checkpoint written by `train` (best.ckpt or last.ckpt).
    #[arg(long)]
    checkpoint: PathBuf,
    /// `safetensors` or `pth` (torch.save's format); default: from --output's extension, else pth.
    #[arg(long)]
    format: Option<String>,
    /// The file to write (default: the checkpoint's path with .pth or .safetensors).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Whose parameter names to write: `timm` or `torchvision` for ViTs (default: timm);
    /// ResNets have one set (torchvision's, which timm shares).
    #[arg(long)]
    names: Option<String>,
}

#[derive(Args)]
struct BenchArgs {
    #[arg(long, default_value = "resnet50")]
    model: String,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    #[arg(long, default_value_t = 224)]
    image_size: usize,
    #[arg(long, default_value_t = 3)]
    channels: usize,
    #[arg(long, default_value_t = 1000)]
    classes: usize,
    #[arg(long)]
    small_input: bool,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// CUDA GPU, e.g. `0`; CPU when absent.
    #[arg(long)]
    gpus: Option<String>,
    /// Copy each step's images from host memory (as training from files does) instead of
    /// reusing one batch made on the device.
    #[arg(long)]
    host_input: bool,
    /// Activation precision: f32, bf16 or f16 (parameters stay f32).
    #[arg(long, default_value = "f32")]
    precision: String,
    /// Channels-last activations (PyTorch's channels_last; the default with --gpus).
    #[arg(long)]
    channels_last: bool,
    /// NCHW activations (the default on the CPU).
    #[arg(long, conflicts_with = "channels_last")]
    channels_first: bool,
    /// Sample every host thread over the timed steps and write a flame graph and a summary of
    /// where their time went into this folder (a binary built with `--features host-profile`).
    #[arg(long, value_name = "DIR")]
    host_profile: Option<PathBuf>,
    /// Profile the first warm-up step (a fresh machine's cold start: compilation, autotuning,
    /// cuDNN's engine timing) instead of the timed steps.
    #[arg(long, requires = "host_profile")]
    host_profile_first_step: bool,
    /// Update with burn's own `Sgd` instead of burn-ddp's `FusedSgd` (the same rule; one
    /// operation per step on CUDA instead of seven per parameter).
    #[arg(long)]
    burn_sgd: bool,
    /// Step through DistributedDataParallel: under `burn-ddp launch` (or torchrun) in its
    /// world, else in a one-rank group of its own whose every bucket still goes through NCCL
    /// (TCP on the CPU) — DDP's own cost is then the difference from the same command without it.
    #[arg(long)]
    ddp: bool,
    /// With --ddp, the type the gradients travel in: `none` (f32), `bf16` or `fp16`.
    #[arg(long, value_name = "TYPE", requires = "ddp")]
    grad_compression: Option<String>,
    /// With --ddp, all-reduce every bucket after backward instead of during it (one rank; a
    /// launcher's NCCL world keeps the overlap).
    #[arg(long, requires = "ddp")]
    no_overlap: bool,
}

#[derive(Args)]
struct BenchDataArgs {
    /// `bundled`, `fashion-mnist`, or a folder with one sub-folder of images per class.
    #[arg(long, default_value = "bundled")]
    data: String,
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Side of the model input (folder data: RandomResizedCrop / Resize + CenterCrop).
    #[arg(long, default_value_t = 224)]
    image_size: u32,
    /// Batches timed, after one untimed batch.
    #[arg(long, default_value_t = 10)]
    batches: usize,
    /// Time the evaluation transforms instead of the training ones.
    #[arg(long)]
    eval: bool,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Batches prepared ahead of the consumer.
    #[arg(long, default_value_t = 4)]
    prefetch: usize,
    /// Deliver the batches to this GPU (uploaded as training does) instead of host memory.
    #[arg(long)]
    gpus: Option<String>,
}

#[derive(Args)]
struct TrainArgs {
    /// Start from a named recipe: `tutorial` (ResNet-34, batch 16/GPU, SGD 0.9, wd 0.005,
    /// lr 0.001 × GPUs, cosine to 0.1×, 30 epochs, 224²) or `vit` (ViT-S/16, AdamW 5e-4, wd
    /// 0.05, 5 warm-up epochs, label smoothing 0.1, clip 1.0, colour jitter 0.4, random erasing
    /// 0.25, 30 epochs, 224²); flags below override it.
    #[arg(long)]
    preset: Option<String>,
    /// `bundled`, `fashion-mnist`, or a folder with one sub-folder of images per class.
    #[arg(long)]
    data: Option<String>,
    /// Model name (see `burn-vision models`).
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    epochs: Option<usize>,
    /// Images per batch per device.
    #[arg(long)]
    batch_size: Option<usize>,
    /// Peak learning rate for one device (multiplied by the number of devices).
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long, value_enum)]
    optimizer: Option<OptimizerKind>,
    #[arg(long)]
    momentum: Option<f64>,
    #[arg(long)]
    weight_decay: Option<f64>,
    #[arg(long)]
    warmup_epochs: Option<usize>,
    /// Final over peak learning rate of the cosine schedule.
    #[arg(long)]
    min_lr_factor: Option<f64>,
    #[arg(long)]
    label_smoothing: Option<f64>,
    /// Fraction of each class held out for validation.
    #[arg(long)]
    val_fraction: Option<f64>,
    #[arg(long)]
    seed: Option<u64>,
    /// Run folder (checkpoints, metrics.jsonl).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in --out from its last checkpoint.
    #[arg(long)]
    resume: bool,
    /// CUDA GPUs to train on, e.g. `0` (CUDA is in the default build; not in one built with `--no-default-features`).
    #[arg(long, conflicts_with = "cpu")]
    gpus: Option<String>,
    /// Train on the CPU (the default).
    #[arg(long)]
    cpu: bool,
    /// CPU processes training together (DDP over TCP), e.g. `--nproc 2 --cpu`; with
    /// `--strategy dp`, CPU worker threads of one process.
    #[arg(long, conflicts_with = "gpus")]
    nproc: Option<usize>,
    /// How several devices train together: `ddp` (one process per device, all-reduce; the
    /// default) or `dp` (DataParallel: one process, a thread per device).
    #[arg(long)]
    strategy: Option<String>,
    /// SyncBatchNorm: BatchNorm statistics over the global batch of all ranks (DDP).
    #[arg(long)]
    sync_bn: bool,
    /// Per-rank BatchNorm statistics even where the preset synchronises them.
    #[arg(long, conflicts_with = "sync_bn")]
    no_sync_bn: bool,
    /// The type DDP's gradient all-reduce sends: `none` (f32, the default), `bf16` or `fp16`
    /// (half the bytes across the wire; parameters and optimizer state stay f32).
    #[arg(long, value_name = "TYPE")]
    grad_compression: Option<String>,
    /// Activation precision: `f32` (the default), `bf16` or `f16` (PyTorch's autocast:
    /// parameters, optimizer and BatchNorm statistics stay f32; f16 adds dynamic loss scaling,
    /// PyTorch's GradScaler).
    #[arg(long)]
    precision: Option<String>,
    /// Keep activations channels-last (`[n, h, w, c]`, PyTorch's channels_last): the default
    /// with --gpus (cuDNN's fastest kernels; burn-vision's own batch-norm kernels).
    #[arg(long)]
    channels_last: bool,
    /// Keep activations NCHW (the default on the CPU; on GPUs slower, see docs/benchmarks.md).
    #[arg(long, conflicts_with = "channels_last")]
    channels_first: bool,
    /// Input side for folder datasets.
    #[arg(long)]
    image_size: Option<u32>,
    /// Use the 3×3 stem without max-pool (for 28–64 px images).
    #[arg(long)]
    small_input: Option<bool>,
    /// Stop on the first unreadable image instead of skipping it.
    #[arg(long)]
    strict_images: bool,
    /// End after this many epochs (keeping the schedule of --epochs); continue with --resume.
    #[arg(long)]
    stop_after_epochs: Option<usize>,
    /// Stop every epoch after this many steps.
    #[arg(long)]
    max_steps_per_epoch: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Start from PyTorch weights: a torchvision / timm state dict (.pth, .pt, .safetensors;
    /// `state_dict`/`model` wrappers and DDP's `module.` prefix are found). The classifier head
    /// is re-initialised when the class count differs.
    #[arg(long)]
    pretrained: Option<PathBuf>,
    /// Train only the classifier head (the tutorial's option for fine-tuning).
    #[arg(long)]
    freeze_layers: bool,
    /// The backbone's learning rate as a fraction of the head's, e.g. 0.1.
    #[arg(long)]
    backbone_lr_scale: Option<f64>,
    /// Clip the gradients to this global L2 norm (all parameters together, after DDP's
    /// all-reduce; PyTorch's clip_grad_norm_, timm's --clip-grad), e.g. 1.0.
    #[arg(long)]
    clip_grad_norm: Option<f64>,
    /// Also save last.ckpt every N optimisation steps inside an epoch, so a crash redoes at
    /// most N steps (a resumed run continues from that step exactly).
    #[arg(long, value_name = "N")]
    checkpoint_every: Option<usize>,
    /// When train starts its own ranks (--nproc N, --gpus a,b): restart all of them up to N
    /// times after one fails, each round continuing from last.ckpt (under torchrun or
    /// `burn-ddp launch`, pass it to the launcher: train resumes when restarted).
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_restarts: usize,
    /// Record steps A..B−1 (counted from 0) as a Chrome / Perfetto trace in OUT/trace.json
    /// (rank 0): spans per step, phase and DDP bucket all-reduce; open it in ui.perfetto.dev.
    #[arg(long, value_name = "A..B")]
    profile_steps: Option<String>,
    /// Seconds a rendezvous or collective may wait for the other ranks before this rank stops
    /// with an error (a dead or stuck rank); default: BURN_DDP_TIMEOUT_S, else 300.
    #[arg(long, value_name = "S")]
    timeout_s: Option<f64>,
    /// Probability of a horizontal flip in training (default 0.5; 0 for digits, text, X-rays).
    #[arg(long, value_name = "P")]
    hflip: Option<f64>,
    /// RandomResizedCrop's area range, MIN,MAX (default 0.08,1; folder data).
    #[arg(long, value_name = "MIN,MAX")]
    rrc_scale: Option<String>,
    /// RandomResizedCrop's aspect-ratio range, MIN,MAX (default 0.75,1.333; folder data).
    #[arg(long, value_name = "MIN,MAX")]
    rrc_ratio: Option<String>,
    /// Colour jitter strength: brightness, contrast, saturation by factors in [1−S, 1+S]
    /// (torchvision's ColorJitter(S, S, S); default 0 = off), e.g. 0.4.
    #[arg(long, value_name = "S")]
    color_jitter: Option<f64>,
    /// RandAugment: N operations per image at magnitude M of 0–30 (torchvision's
    /// RandAugment(N, M); timm's rand-mM-nN), e.g. 2,9; 0 turns it off (default off,
    /// --preset vit 2,9).
    #[arg(long, value_name = "N,M")]
    randaugment: Option<String>,
    /// Probability of erasing a random rectangle (timm's --reprob; default 0), e.g. 0.25.
    #[arg(long, value_name = "P")]
    random_erasing: Option<f64>,
    /// Mixup's α: batches mixed with their reversed partner by λ ~ Beta(α, α), soft targets
    /// (timm's --mixup; default 0 = off, --preset vit 0.8).
    #[arg(long, value_name = "ALPHA")]
    mixup: Option<f64>,
    /// CutMix's α: a box of area ≈ 1 − λ pasted from the partner (timm's --cutmix; default 0,
    /// --preset vit 1.0).
    #[arg(long, value_name = "ALPHA")]
    cutmix: Option<f64>,
    /// Probability that a batch is mixed at all (timm's --mixup-prob; default 1).
    #[arg(long, value_name = "P")]
    mixup_prob: Option<f64>,
    /// With mixup and cutmix both on, the probability of cutmix (timm's --mixup-switch-prob;
    /// default 0.5).
    #[arg(long, value_name = "P")]
    mixup_switch_prob: Option<f64>,
    /// Stochastic depth: the deepest block's residual branches are skipped per sample with
    /// this probability, earlier ones linearly less (ViTs; timm's --drop-path; default 0,
    /// --preset vit 0.1).
    #[arg(long, value_name = "RATE")]
    drop_path: Option<f64>,
}

#[derive(Args)]
struct EvalArgs {
    /// A checkpoint written by `train` (best.ckpt or last.ckpt).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Data to evaluate on; defaults to the checkpoint's own validation split.
    #[arg(long)]
    data: Option<String>,
    /// Evaluate every sample of --data instead of the validation split.
    #[arg(long)]
    all: bool,
    #[arg(long, default_value_t = 128)]
    batch_size: usize,
    /// GPU to evaluate on (default: the checkpoint's own GPU when this build has CUDA and the GPU
    /// exists, else the CPU).
    #[arg(long)]
    gpus: Option<String>,
}

#[derive(Args)]
struct PredictArgs {
    #[arg(long)]
    checkpoint: PathBuf,
    /// How many classes to show per image.
    #[arg(long, default_value_t = 3)]
    top: usize,
    /// GPU to predict on (default: as for eval).
    #[arg(long)]
    gpus: Option<String>,
    /// Image files and folders of images (.jpg, .jpeg, .png); an unreadable image is reported
    /// and the others go on.
    #[arg(required = true)]
    images: Vec<PathBuf>,
}

fn train_config(a: TrainArgs) -> Result<TrainConfig> {
    let mut c = match a.preset.as_deref() {
        None => TrainConfig::default(),
        Some("tutorial") => TrainConfig::tutorial(),
        Some("vit") => TrainConfig::vit(),
        Some(other) => anyhow::bail!("unknown preset `{other}`; available: tutorial, vit"),
    };
    macro_rules! set {
        ($($field:ident),*) => { $( if let Some(v) = a.$field { c.$field = v; } )* };
    }
    augmentation(&mut c.augment, &a)?;
    mixing(&mut c.mixup, &a);
    set!(
        data,
        model,
        epochs,
        batch_size,
        lr,
        optimizer,
        momentum,
        weight_decay,
        warmup_epochs,
        min_lr_factor,
        label_smoothing,
        val_fraction,
        seed,
        out,
        image_size,
        backbone_lr_scale,
        drop_path
    );
    c.pretrained = a.pretrained;
    c.freeze_layers = a.freeze_layers;
    c.clip_grad_norm = a.clip_grad_norm.or(c.clip_grad_norm);
    c.checkpoint_every = a.checkpoint_every;
    c.timeout_s = a.timeout_s;
    c.profile_steps = a.profile_steps.as_deref().map(burn_vision::train::instrument::trace::parse_steps).transpose()?;
    // 28x28 IDX data gets the small-input stem unless told otherwise (`*-mini` models always have it).
    c.small_input = a.small_input.unwrap_or(matches!(c.source(), DataSource::Bundled | DataSource::FashionMnist));
    c.resume = a.resume;
    c.strict_images = a.strict_images;
    c.max_steps_per_epoch = a.max_steps_per_epoch;
    c.stop_after_epochs = a.stop_after_epochs;
    c.show_progress = !a.quiet;
    if let Some(gpus) = a.gpus {
        c.device = DeviceSpec::parse_gpus(&gpus)?;
    }
    if let Some(n) = a.nproc {
        c.nproc = n;
    }
    if let Some(s) = a.strategy {
        c.strategy = s.parse()?;
    }
    if a.sync_bn {
        c.sync_bn = true;
    }
    if a.no_sync_bn {
        c.sync_bn = false;
    }
    if let Some(g) = a.grad_compression {
        c.grad_compression = burn_vision::train::config::parse_grad_compression(&g)?;
    }
    if let Some(p) = a.precision {
        c.precision = p.parse()?;
    }
    if a.channels_last || a.channels_first {
        c.channels_last = Some(a.channels_last);
    }
    Ok(c)
}

/// The augmentation flags over the preset's augmentation.
fn augmentation(aug: &mut burn_vision::data::Augment, a: &TrainArgs) -> Result<()> {
    use burn_vision::data::augment::parse_pair;
    if let Some(p) = a.hflip {
        aug.hflip = p;
    }
    if let Some(r) = &a.rrc_scale {
        aug.scale = parse_pair("--rrc-scale", r)?;
    }
    if let Some(r) = &a.rrc_ratio {
        aug.ratio = parse_pair("--rrc-ratio", r)?;
    }
    if let Some(s) = a.color_jitter {
        aug.color_jitter = s;
    }
    if let Some(r) = &a.randaugment {
        (aug.rand_augment_ops, aug.rand_augment_magnitude) = parse_rand_augment(r, aug.rand_augment_magnitude)?;
    }
    if let Some(p) = a.random_erasing {
        aug.random_erasing = p;
    }
    Ok(())
}

/// `--randaugment N,M` (or `0`: off; `N` alone keeps magnitude `magnitude`).
fn parse_rand_augment(text: &str, magnitude: u32) -> Result<(u32, u32)> {
    let bad = || burn_vision::error::Error::InvalidConfig {
        name: "--randaugment",
        value: text.into(),
        reason: "give N,M: N operations (e.g. 2) at magnitude M of 0–30 (e.g. 9), or 0 for off".into(),
    };
    let (n, m) = match text.split_once(',') {
        Some((n, m)) => (n.trim().parse().map_err(|_| bad())?, m.trim().parse().map_err(|_| bad())?),
        None => (text.trim().parse().map_err(|_| bad())?, magnitude),
    };
    Ok((n, m))
}

/// The mixup / cutmix flags over the preset's.
fn mixing(m: &mut burn_vision::train::mixup::MixupConfig, a: &TrainArgs) {
    for (flag, field) in [
        (a.mixup, &mut m.mixup_alpha),
        (a.cutmix, &mut m.cutmix_alpha),
        (a.mixup_prob, &mut m.prob),
        (a.mixup_switch_prob, &mut m.switch_prob),
    ] {
        if let Some(v) = flag {
            *field = v;
        }
    }
}

/// `args` without `flag VALUE` / `flag=VALUE`.
fn without_flag(args: Vec<String>, flag: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut skip_value = false;
    for a in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        if a == flag {
            skip_value = true;
        } else if !a.starts_with(&format!("{flag}=")) {
            out.push(a);
        }
    }
    out
}

/// Several processes and not yet launched: start one per rank (this same command) and wait.
fn launch_ranks(config: &TrainConfig, max_restarts: usize) -> Result<()> {
    config.validate()?;
    if let DeviceSpec::Cuda(ids) = &config.device {
        burn_vision::train::check_gpus(ids)?;
    }
    // The ranks run this same command, less the restarts, which are this launcher's business.
    let program = without_flag(std::env::args().collect(), "--max-restarts");
    let timeout = config.timeout_s.map(std::time::Duration::from_secs_f64);
    let launch = burn_ddp::launch::LaunchConfig {
        nproc_per_node: config.processes(),
        master_port: 0,
        max_restarts,
        program,
        timeout,
        ..Default::default()
    };
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    let _ = ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
    let code = burn_ddp::launch::launch(&launch, interrupted)?;
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

fn cmd_train(a: TrainArgs) -> Result<()> {
    let max_restarts = a.max_restarts;
    let config = train_config(a)?;
    // Under a launcher (ours, torchrun, srun, mpirun) this process is one rank of its world.
    let place = burn_ddp::launch_env::detect(&|k| std::env::var(k).ok())?;
    // Several ranks, or restarts asked for: this process becomes their launcher.
    if (config.processes() > 1 || max_restarts > 0) && place.is_none() {
        return launch_ranks(&config, max_restarts);
    }
    if max_restarts > 0 && place.as_ref().is_some_and(|p| p.rank == 0) {
        log::warn!(
            "--max-restarts is for the ranks train starts itself; under an outside launcher give it to the launcher (train continues from last.ckpt when restarted)"
        );
    }
    let summary = run(&config)?;
    if place.is_some_and(|p| p.rank != 0) {
        return Ok(());
    }
    if summary.skipped > 0 {
        log::warn!("skipped {} unreadable image(s); first: {}", summary.skipped, summary.first_skipped.join(", "));
    }
    let last = summary.epochs.last();
    println!(
        "done: {} epoch(s) in {:.1}s, final val acc {:.2}%, best {:.2}%, skipped images {}, checkpoints and metrics.jsonl in {}",
        summary.epochs.len(),
        summary.seconds,
        100.0 * last.map_or(0.0, |r| r.val_acc),
        100.0 * summary.best_acc,
        summary.skipped,
        summary.out.display()
    );
    Ok(())
}

fn cmd_eval(a: EvalArgs) -> Result<()> {
    let request = EvalRequest {
        checkpoint: a.checkpoint,
        data: a.data,
        all: a.all,
        batch_size: a.batch_size,
        gpu: first_gpu(a.gpus.as_deref())?,
    };
    let r = evaluate_checkpoint(&request)?;
    println!(
        "{}: {} images ({} skipped) on {}: loss {:.4}, top-1 {:.2}%, top-5 {:.2}%",
        request.checkpoint.display(),
        r.images,
        r.skipped,
        r.device,
        r.tally.loss(),
        100.0 * r.tally.acc1(),
        100.0 * r.tally.acc5()
    );
    Ok(())
}

/// The GPU of `--gpus` for eval and predict (one; the first of a list).
fn first_gpu(gpus: Option<&str>) -> Result<Option<usize>> {
    let Some(list) = gpus else { return Ok(None) };
    let DeviceSpec::Cuda(ids) = DeviceSpec::parse_gpus(list)? else { return Ok(None) };
    if ids.len() > 1 {
        log::info!("--gpus {list}: evaluating on GPU {} (one device is enough)", ids[0]);
    }
    Ok(ids.first().copied())
}

fn cmd_predict(a: PredictArgs) -> Result<()> {
    let results = predict_paths(&a.checkpoint, &a.images, a.top, first_gpu(a.gpus.as_deref())?)?;
    anyhow::ensure!(
        !results.is_empty(),
        "no .jpg/.jpeg/.png images in {}",
        a.images.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    let mut failed = 0;
    for (path, result) in &results {
        match result {
            Ok(p) => {
                let top: Vec<String> = p.top.iter().map(|(c, prob)| format!("{c} {:.1}%", 100.0 * prob)).collect();
                println!("{}: {}", p.path, top.join(", "));
            }
            Err(e) => {
                failed += 1;
                eprintln!("{}: not predicted: {e}", path.display());
            }
        }
    }
    anyhow::ensure!(failed < results.len(), "none of the {} image(s) could be read", results.len());
    if failed > 0 {
        eprintln!("{failed} of {} image(s) could not be read (listed above)", results.len());
    }
    Ok(())
}

fn cmd_bench(a: BenchArgs) -> Result<()> {
    let spec = match a.gpus.as_deref() {
        Some(g) => DeviceSpec::parse_gpus(g)?,
        None => DeviceSpec::Cpu,
    };
    let config = BenchConfig {
        model: a.model,
        batch_size: a.batch_size,
        image_size: a.image_size,
        channels: a.channels,
        classes: a.classes,
        small_input: a.small_input,
        warmup: a.warmup,
        steps: a.steps,
        host_input: a.host_input,
        precision: a.precision.parse()?,
        channels_last: a.channels_last || (!a.channels_first && matches!(spec, DeviceSpec::Cuda(_))),
        gpu: match &spec {
            DeviceSpec::Cuda(ids) => ids.first().copied(),
            DeviceSpec::Cpu => None,
        },
        host_profile: a.host_profile,
        host_profile_first_step: a.host_profile_first_step,
        burn_sgd: a.burn_sgd,
        ddp: a.ddp,
        grad_compression: a
            .grad_compression
            .as_deref()
            .map(burn_vision::train::config::parse_grad_compression)
            .transpose()?
            .unwrap_or_default(),
        no_overlap: a.no_overlap,
    };
    let result = run_bench(&config, &spec)?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

fn cmd_bench_data(a: BenchDataArgs) -> Result<()> {
    let source: DataSource = a.data.parse().expect("infallible");
    let data = load_source(&source, a.image_size)?;
    let config = DataBenchConfig {
        batch_size: a.batch_size,
        batches: a.batches,
        eval: a.eval,
        seed: a.seed,
        prefetch: a.prefetch,
    };
    let gpu = first_gpu(a.gpus.as_deref())?;
    println!("{}", serde_json::to_string(&burn_vision::train::bench::data::bench_data(&data, &config, gpu)?)?);
    Ok(())
}

fn cmd_export(a: ExportArgs) -> Result<()> {
    let format = match (&a.format, &a.output) {
        (Some(f), _) => f.parse()?,
        (None, Some(out)) => WeightFormat::for_path(out),
        (None, None) => WeightFormat::Pth,
    };
    let output = a.output.unwrap_or_else(|| {
        a.checkpoint.with_extension(if format == WeightFormat::Safetensors { "safetensors" } else { "pth" })
    });
    let restored = restore::<burn_flex::Flex>(&a.checkpoint, &Default::default())?;
    let tracked = restored.meta.batches_tracked.unwrap_or(restored.meta.step as i64);
    let scheme = scheme_index(&restored.model, a.names.as_deref())?;
    let n = export(&restored.model, &output, format, (tracked, scheme))?;
    println!(
        "{}: {} tensors of {} ({} classes) written as {format:?}, num_batches_tracked {tracked}",
        output.display(),
        n,
        restored.meta.model,
        restored.meta.classes.len()
    );
    Ok(())
}

fn main() {
    burn_vision::mark_start();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp(None)
        .format_target(false)
        .init();
    let cli = Cli::parse();
    let command = cli.command.or_else(|| Cli::parse_from(["burn-vision", "train"]).command).expect("train parses");
    let result = match command {
        Command::Train(a) => cmd_train(a),
        Command::Eval(a) => cmd_eval(a),
        Command::Predict(a) => cmd_predict(a),
        Command::Bench(a) => cmd_bench(a),
        Command::BenchData(a) => cmd_bench_data(a),
        Command::Export(a) => cmd_export(a),
        Command::Plot(a) => burn_vision::plot::plot_folders(&a.runs, &a.output)
            .map(|()| println!("wrote {} ({} run(s))", a.output.display(), a.runs.len()))
            .map_err(Into::into),
        Command::Models => {
            println!("{}", list_models().join("\n"));
            Ok(())
        }
    };
    if let Err(e) = result {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(1);
    }
}

/// The error and its causes on one line, each said once: burn-vision's errors already end with
/// their source's text, which `{:#}` would repeat.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1).map(ToString::to_string) {
        if !line.contains(&cause) {
            line = format!("{line}: {cause}");
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::{one_line, without_flag};

    #[test]
    fn a_cause_the_message_already_holds_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(13);
        let ours = burn_vision::error::Error::io("creating", std::path::Path::new("/run"), io);
        let text = one_line(&anyhow::Error::from(ours));
        assert_eq!(text.matches("os error 13").count(), 1, "{text}");
        let wrapped = anyhow::Error::from(std::io::Error::from_raw_os_error(2)).context("reading the list");
        assert!(
            one_line(&wrapped).starts_with("reading the list: ") && one_line(&wrapped).contains("os error 2"),
            "{}",
            one_line(&wrapped)
        );
    }

    #[test]
    fn the_ranks_do_not_get_the_launchers_restarts() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            without_flag(args("bv train --max-restarts 3 --nproc 2"), "--max-restarts"),
            args("bv train --nproc 2")
        );
        assert_eq!(without_flag(args("bv train --max-restarts=3 --cpu"), "--max-restarts"), args("bv train --cpu"));
        assert_eq!(without_flag(args("bv train --cpu"), "--max-restarts"), args("bv train --cpu"));
    }
}
