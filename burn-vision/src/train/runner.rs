//! The training run: model and optimizer from the config, exact resume, and the loop over
//! epochs — train ([`super::epoch`]), validate, reduce over the ranks, and write
//! ([`super::outputs`]).

use super::checkpoint::{Checkpoint, PartialEpoch, last_path};
use super::config::{DeviceSpec, OptimizerKind, Strategy, TrainConfig};
use super::distributed::{Dist, Distributed};
use super::epoch::{EpochPlan, EpochStart, EpochTrained, Placement, Trainer, train_epoch, validate};
use super::fine_tune::LrGroups;
use super::grad_scaler::GradScaler;
use super::metrics::{EpochRecord, Tally};
use super::outputs::{CheckpointFacts, RunOutputs};
use crate::data::loader::SkipLog;
use crate::data::source::{LoadedData, load_source_with};
use crate::error::{Error, Result};
use crate::model::classifier::Classifier;
use crate::model::classifier::with_model_record;
use crate::model::image_classifier::ImageClassifier;
use crate::model::registry::create;
use crate::train::instrument::health::UtilSampler;
use crate::train::instrument::trace::StepTracer;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn_ddp::nn::{FusedAdamWConfig, FusedSgdConfig};
use burn_ddp::nn::{Layout, Precision};
use burn_ddp::{BatchNormSync, DataParallel};
use burn_optim::Optimizer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

type Bytes = BinBytesRecorder<FullPrecisionSettings>;

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// One record per epoch trained in this invocation.
    pub epochs: Vec<EpochRecord>,
    /// Best validation top-1 over the whole run (resumed epochs included).
    pub best_acc: f64,
    /// Epoch the run was resumed after, if it was.
    pub resumed_after: Option<usize>,
    /// Unreadable images skipped.
    pub skipped: usize,
    /// The first skipped images.
    pub first_skipped: Vec<String>,
    /// The run folder.
    pub out: PathBuf,
    /// Wall-clock seconds of this invocation.
    pub seconds: f64,
}

/// Trains on one device of backend `B` (as one rank when the launcher's environment is set).
///
/// # Errors
/// For invalid settings, unreadable data, unusable checkpoints, or an existing run in `out`
/// without `resume`.
pub fn train<B: AutodiffBackend>(config: &TrainConfig, device: B::Device) -> Result<TrainSummary> {
    train_on::<B>(config, vec![device])
}

/// Trains on `devices`: with more than one, DataParallel in this process (the strategy `dp`);
/// with one, alone or as one DDP rank when the launcher's environment is set.
///
/// # Errors
/// As [`train`].
pub fn train_on<B: AutodiffBackend>(config: &TrainConfig, devices: Vec<B::Device>) -> Result<TrainSummary> {
    config.validate()?;
    let gpus = match &config.device {
        DeviceSpec::Cuda(ids) => Some(ids.as_slice()),
        DeviceSpec::Cpu => None,
    };
    let dist = match config.strategy {
        Strategy::Ddp => {
            let ddp = super::config::ddp_config(!config.sync_bn, config.grad_compression, config.bucket_cap_mb);
            Distributed::from_env(gpus, config.timeout_s, ddp)?
        }
        Strategy::Dp => None,
    };
    // The launcher's world sets the learning-rate scaling and the log, whatever --nproc said.
    let config = &TrainConfig { world: dist.as_ref().map(|d| d.world), ..config.clone() };
    train_inner::<B>(config, devices, dist.as_ref())
}

/// Trains as one rank of `dist` (or alone with `None`).
///
/// # Errors
/// As [`train`].
pub fn train_with<B: AutodiffBackend>(config: &TrainConfig, device: B::Device, dist: Dist<'_>) -> Result<TrainSummary> {
    train_inner::<B>(config, vec![device], dist)
}

fn train_inner<B: AutodiffBackend>(
    config: &TrainConfig,
    devices: Vec<B::Device>,
    dist: Dist<'_>,
) -> Result<TrainSummary> {
    let data = load_source_with(&config.source(), config.image_size, &config.augment)?;
    let classes = data.dataset.classes().len();
    let main_rank = dist.is_none_or(|d| d.rank == 0);
    let (model, tracked) = super::fine_tune::prepare(
        config,
        seeded_model::<B>(config, classes, data.train.channels, &devices[0])?,
        main_rank,
    )?;
    let model = model.with_precision(config.precision).with_channels_last(config.channels_last_on());
    let mut model = model.with_drop_path(config.drop_path).ok_or_else(|| Error::InvalidConfig {
        name: "--drop-path",
        value: config.drop_path.to_string(),
        reason: format!("{} has no stochastic depth (ViTs have); leave it at 0", config.model),
    })?;
    match dist {
        Some(d) if config.sync_bn => {
            model = model.with_sync_batch_norm(Some(BatchNormSync::new::<B>(d.device_group.clone())?))
        }
        None if config.sync_bn => {
            log::info!("--sync-bn: one process, so BatchNorm statistics are already over the whole batch")
        }
        _ => {}
    }
    let wd = config.weight_decay as f32;
    match config.optimizer {
        OptimizerKind::Sgd => {
            // PyTorch's SGD (dampening 0); on CUDA one operation per step (burn_ddp::nn::sgd).
            let optim =
                FusedSgdConfig { momentum: config.momentum, weight_decay: f64::from(wd), ..FusedSgdConfig::default() }
                    .init();
            train_loop(config, data, (model, tracked), optim, devices, dist)
        }
        OptimizerKind::Adamw => {
            // burn's AdamW rule (and record); on CUDA one operation per step (burn_ddp::nn::FusedAdamW).
            let optim = FusedAdamWConfig { weight_decay: wd, ..FusedAdamWConfig::default() }.init();
            train_loop(config, data, (model, tracked), optim, devices, dist)
        }
    }
}

/// Backends keep one random generator per process (flex: a global), so seeding and drawing the
/// initial weights happen under one lock: concurrent trainings in a process (tests, services)
/// still get the initialisation their seed promises.
static INIT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seeded_model<B: AutodiffBackend>(
    config: &TrainConfig,
    classes: usize,
    channels: usize,
    device: &B::Device,
) -> Result<Classifier<B>> {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    B::seed(device, config.seed);
    // Every parameter drawn here, in visiting order: a plain run and a DDP run (whose broadcast
    // draws them in that order) start from the same values.
    Ok(burn_ddp::params::initialized(create(&config.model, classes, channels, config.small_input, device)?))
}

/// Settings that must match between a run and its resumption for it to continue exactly.
const RESUME_KEYS: [&str; 9] =
    ["data", "model", "batch_size", "seed", "val_fraction", "optimizer", "small_input", "image_size", "epochs"];

/// Where a run starts: after `epoch` finished epochs and `partial` of the next one.
#[derive(Debug, Default)]
struct StartPoint {
    epoch: usize,
    best_acc: f64,
    /// The last finished epoch's validation top-1.
    val_acc: f64,
    partial: PartialEpoch,
    /// Whether it continues a checkpoint.
    resumed: bool,
}

/// The trainer and where to start: from `last.ckpt` with `--resume` or when a launcher
/// restarted the job (torchrun/`burn-ddp launch --max-restarts`, a requeued Slurm job), else
/// fresh (refusing to overwrite a run); every rank then takes rank 0's parameters and buffers.
fn start<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
    config: &TrainConfig,
    trainer: Trainer<B, O>,
    device: &B::Device,
    dist: Dist<'_>,
) -> Result<(Trainer<B, O>, StartPoint)> {
    let out = &config.out;
    let restart = burn_ddp::launch_env::restart_count(&|k| std::env::var(k).ok());
    let (mut trainer, from) = if config.resume || (restart > 0 && last_path(out).exists()) {
        if !config.resume && dist.is_none_or(|d| d.rank == 0) {
            log::warn!("restart {restart} of this job: continuing from {}", last_path(out).display());
        }
        resume(config, trainer, device)?
    } else if last_path(out).exists() {
        return Err(Error::InvalidConfig {
            name: "--out",
            value: out.display().to_string(),
            reason: "it already holds a run (last.ckpt); pass --resume to continue it or choose another --out".into(),
        });
    } else {
        (trainer, StartPoint::default())
    };
    if let Some(d) = dist {
        trainer.model = d.ddp.broadcast_module(trainer.model)?;
    }
    Ok((trainer, from))
}

fn resume<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
    config: &TrainConfig,
    mut trainer: Trainer<B, O>,
    device: &B::Device,
) -> Result<(Trainer<B, O>, StartPoint)> {
    let path = last_path(&config.out);
    let ck = Checkpoint::load(&path)?;
    let now = serde_json::to_value(config).expect("config serialises");
    let bad = |reason: String| Error::BadCheckpoint { path: path.clone(), reason };
    for key in RESUME_KEYS {
        if ck.meta.config.get(key) != now.get(key) {
            return Err(bad(format!(
                "it was trained with {key}={}, this run has {key}={}; use the same settings or another --out",
                ck.meta.config.get(key).unwrap_or(&serde_json::Value::Null),
                now[key]
            )));
        }
    }
    let optim_record = crate::guard::decode(|| Bytes::default().load(ck.optimizer, device))
        .map_err(|e| bad(format!("optimizer record: {e}")))?;
    let partial = ck.meta.partial.unwrap_or_default();
    let within = if partial.steps > 0 {
        format!(" and {} steps of epoch {}", partial.steps, ck.meta.epoch + 1)
    } else {
        String::new()
    };
    log::info!("resuming {} after epoch {}{within} (step {})", path.display(), ck.meta.epoch, ck.meta.step);
    trainer.model = with_model_record(trainer.model, &ck.model, device)
        .map_err(|e| bad(format!("model record does not fit {}: {e}", config.model)))?;
    // Burn panics on a record that does not fit (a crafted file under a valid checksum).
    let optim = trainer.optim;
    trainer.optim = crate::guard::catch_panic(|| optim.load_record(optim_record))
        .map_err(|e| bad(format!("optimizer record does not fit: {e}")))?;
    trainer.step = ck.meta.step;
    if let Some(tracked) = ck.meta.batches_tracked {
        trainer.batches_tracked_before = tracked - ck.meta.step as i64;
    }
    Ok((
        trainer,
        StartPoint {
            epoch: ck.meta.epoch,
            best_acc: ck.meta.best_acc,
            val_acc: ck.meta.val_acc,
            partial,
            resumed: true,
        },
    ))
}

/// The run's first log line (rank 0).
fn log_start<B: AutodiffBackend>(
    config: &TrainConfig,
    plan: &EpochPlan,
    model: &Classifier<B>,
    (data_parallel, world): (bool, usize),
) {
    log::info!(
        "training {} on {} ({} classes): {} train / {} validation images, {} device(s) x batch {} = global batch {}, {} steps/epoch, lr {} ({} x {}){}{}{}{}; augmentation: {}, {}{}",
        config.model,
        config.data,
        plan.dataset.classes().len(),
        plan.train_idx.len(),
        plan.val_idx.len(),
        config.world_size(),
        config.batch_size,
        config.batch_size * config.world_size(),
        plan.steps_per_epoch,
        plan.schedule.base_lr,
        config.lr,
        config.world_size(),
        if data_parallel {
            ", DataParallel"
        } else if world > 1 {
            ", DDP"
        } else {
            ""
        },
        if model.sync_batch_norm() { ", SyncBatchNorm" } else { "" },
        if model.precision() == Precision::F32 {
            String::new()
        } else {
            format!(", {} activations", model.precision())
        },
        if model.layout() == Layout::Nhwc { ", channels-last" } else { "" },
        config.augment.describe(),
        config.mixup.describe(),
        if config.drop_path > 0.0 { format!(", stochastic depth {}", config.drop_path) } else { String::new() }
    );
}

fn train_loop<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
    config: &TrainConfig,
    data: LoadedData,
    (model, tracked): (Classifier<B>, i64),
    optim: O,
    devices: Vec<B::Device>,
    dist: Dist<'_>,
) -> Result<TrainSummary> {
    let started = Instant::now();
    // DataParallel: the loader's batch is split over the devices (batch_size per device).
    let at = Placement {
        device: devices[0].clone(),
        dp: (devices.len() > 1).then(|| DataParallel::<B>::new(devices.clone())),
        dist,
    };
    let main_rank = at.main_rank();
    let (mut trainer, from) = start(config, new_trainer(config, (model, tracked), optim), &at.device, dist)?;
    let mut outputs = if main_rank { Some(RunOutputs::open(config, from.epoch)?) } else { None };
    let plan = plan_epochs::<B>(config, &data, (devices.len(), &at), outputs.as_ref(), from.partial.steps)?;
    if main_rank {
        log_start(config, &plan, &trainer.model, (at.dp.is_some(), dist.map_or(1, |d| d.world)));
    }
    let facts = CheckpointFacts {
        classes: plan.dataset.classes().to_vec(),
        in_channels: data.train.channels,
        image_size: data.eval.output_size((config.image_size, config.image_size)).0,
        batches_tracked_before: trainer.batches_tracked_before,
    };
    let skips = Arc::new(SkipLog::default());
    let (mut records, mut health) = (Vec::new(), Vec::new());
    let (mut best_acc, mut last_val, mut done) = (from.best_acc, from.val_acc, from.partial);
    let mut tracer = StepTracer::new(config.profile_steps.filter(|_| main_rank), config.out.join("trace.json"));
    let end_epoch = config.stop_after_epochs.map_or(config.epochs, |n| (from.epoch + n).min(config.epochs));
    for epoch in from.epoch..end_epoch {
        let epoch_start = Instant::now();
        let mut save = |t: &Trainer<B, O>, so_far| {
            outputs.as_ref().map_or(Ok(()), |o| {
                o.step_saved(config, (&t.model, &t.optim, t.step), &facts, (epoch, best_acc, last_val), so_far)
            })
        };
        let start = EpochStart { epoch, done: std::mem::take(&mut done), save: &mut save, tracer: &mut tracer };
        let sampler = UtilSampler::start(dist.and(this_gpu(config, dist)));
        let trained = train_epoch(&mut trainer, &plan, &at, config, (start, &data.train), &skips)?;
        let gpu_bytes = this_gpu(config, dist).and_then(crate::train::instrument::health::gpu_memory_bytes);
        let utilization = sampler.mean();
        let (train, rank_img_per_s) = reduce_training(&mut trainer, &trained, dist)?;
        let (val, skipped) = validate(&trainer.model, &plan, &data.eval, &skips, &at)?;
        if let Some(d) = dist {
            health.push(d.gather(&health_row(config, d, &trained, (rank_img_per_s, utilization)))?);
        }
        let mut record =
            epoch_record(epoch, &trained, &train, &val, skipped, plan.schedule.lr(trainer.step.saturating_sub(1)));
        record.seconds = epoch_start.elapsed().as_secs_f64(); // with validation
        record.gpu_memory_gib = gpu_bytes.map(|b| b as f64 / (1u64 << 30) as f64);
        if let Some(outputs) = outputs.as_mut() {
            let improved = record.val_acc > best_acc || epoch == 0;
            best_acc = best_acc.max(record.val_acc);
            outputs.epoch_done(
                config,
                &record,
                (&trainer.model, &trainer.optim, trainer.step),
                &facts,
                (best_acc, improved),
            )?;
        }
        last_val = record.val_acc;
        records.push(record);
    }
    tracer.finish()?;
    if let Some(last) = health.last().filter(|_| main_rank) {
        crate::train::instrument::health::log(last);
    }
    Ok(TrainSummary {
        epochs: records,
        best_acc,
        resumed_after: from.resumed.then_some(from.epoch),
        skipped: skips.count(),
        first_skipped: skips.first(),
        out: config.out.clone(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A trainer at step 0 of `model` (whose batch norms tracked `tracked` batches before this
/// run) and `optim`, with the run's learning-rate groups, clipping and label smoothing.
fn new_trainer<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
    config: &TrainConfig,
    (model, tracked): (Classifier<B>, i64),
    optim: O,
) -> Trainer<B, O> {
    // f16 activations need loss scaling (bf16 has f32's range). A resumed run starts again from
    // the initial scale, which adapts within a few steps.
    let scaler = (config.precision == Precision::F16).then(GradScaler::default);
    Trainer {
        lr_groups: LrGroups::new(config, &model),
        model,
        optim,
        clip_grad_norm: config.clip_grad_norm,
        batches_tracked_before: tracked,
        step: 0,
        scaler,
        label_smoothing: config.label_smoothing as f32,
    }
}

/// The epochs' plan of this rank over `devices` devices (DataParallel's; its batch spans
/// them): the decode path resolved for the device, the validation list written where this
/// rank writes the run's files (`outputs`). A checkpoint that stopped `done_steps` into an
/// epoch this plan does not reach (another --max-steps-per-epoch) is an error.
fn plan_epochs<B: AutodiffBackend>(
    config: &TrainConfig,
    data: &LoadedData,
    (devices, at): (usize, &Placement<'_, B>),
    outputs: Option<&RunOutputs>,
    done_steps: usize,
) -> Result<EpochPlan> {
    let mut plan = EpochPlan::new(config, data, config.batch_size * devices, at.dist);
    plan.loader.device_decode =
        crate::data::decode::resolve::<B>(config.decode, &data.train, &*plan.dataset, &at.device, at.main_rank())?;
    if let Some(o) = outputs {
        o.write_validation_list(config, &*plan.dataset, &plan.val_idx)?;
    }
    if done_steps >= plan.steps_per_epoch {
        let reason = format!(
            "it stopped {done_steps} steps into an epoch of {} steps; resume with the --max-steps-per-epoch it was trained with",
            plan.steps_per_epoch
        );
        return Err(Error::BadCheckpoint { path: last_path(&config.out), reason });
    }
    Ok(plan)
}

/// This rank's GPU (a DataParallel process: its first).
fn this_gpu(config: &TrainConfig, dist: Dist<'_>) -> Option<usize> {
    match &config.device {
        DeviceSpec::Cuda(ids) => ids.get(dist.map_or(0, |d| d.local_rank)).copied(),
        DeviceSpec::Cpu => None,
    }
}

/// This rank's row of the health table for an epoch.
fn health_row(
    config: &TrainConfig,
    d: &super::distributed::Distributed,
    trained: &EpochTrained,
    (img_per_s, utilization_pct): (f64, f64),
) -> [f64; crate::train::instrument::health::FIELDS] {
    let (steps, seconds) = (trained.steps.max(1) as f64, trained.seconds.max(1e-9));
    let r = crate::train::instrument::health::RankEpoch {
        img_per_s,
        collective_share: trained.collective_seconds / seconds,
        exposed_share: trained.sync_seconds / seconds,
        exposed_ms_per_step: 1e3 * trained.sync_seconds / steps,
        utilization_pct,
    };
    crate::train::instrument::health::row(&r, this_gpu(config, Some(d)))
}

/// Sums the epoch's training tallies over the ranks and, without SyncBatchNorm, hands every
/// rank rank 0's BatchNorm running statistics. Returns the global tally and this rank's
/// images per second.
fn reduce_training<B: AutodiffBackend, O>(
    trainer: &mut Trainer<B, O>,
    trained: &EpochTrained,
    dist: Dist<'_>,
) -> Result<(Tally, f64)> {
    let rank_img_per_s = trained.rank_img_per_s;
    let mut sums = trained.sums;
    if let Some(d) = dist {
        d.sum(&mut sums)?;
        if !trainer.model.sync_batch_norm() {
            trainer.model = d.ddp.broadcast_module(trainer.model.clone())?;
        }
    }
    Ok((Tally { loss_sum: sums[0], top1: sums[1] as usize, top5: 0, count: sums[2] as usize }, rank_img_per_s))
}

fn epoch_record(
    epoch: usize,
    trained: &EpochTrained,
    train: &Tally,
    val: &Tally,
    skipped: usize,
    lr: f64,
) -> EpochRecord {
    let seen = train.count;
    EpochRecord {
        epoch: epoch + 1,
        train_loss: train.loss(),
        train_acc: train.acc1(),
        val_loss: val.loss(),
        val_acc: val.acc1(),
        val_acc5: val.acc5(),
        lr,
        img_per_s: seen as f64 / trained.seconds,
        // This rank's steady rate, scaled to every rank's images.
        steady_img_per_s: trained.steady_img_per_s.map(|r| r * seen as f64 / trained.sums[2].max(1.0)),
        data_wait_s: trained.data_wait_s,
        phases_s: trained.phases_s.clone(),
        device_decode: trained.device_decode.clone(),
        seconds: trained.seconds,
        skipped_images: skipped,
        gpu_memory_gib: None,
    }
}
