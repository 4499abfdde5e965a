//! The single-process training loop: data, model, optimiser, schedule, validation,
//! checkpoints, metrics and exact resume.

use super::checkpoint::{Checkpoint, CheckpointMeta, best_path, last_path};
use super::config::{DeviceSpec, OptimizerKind, Strategy, TrainConfig};
use super::evaluate::{batch_tensors, evaluate};
use super::metrics::{EpochRecord, MetricsLog, Tally};
use super::schedule::CosineSchedule;
use super::tensorboard::EventWriter;
use super::distributed::{Dist, Distributed};
use crate::data::{Dataset, Loader, LoaderConfig, SkipLog, load_source, shuffle_for_epoch, split_per_class};
use burn_ddp::{BatchNormSync, DataParallel, DistributedSampler, shard_exact};
use crate::error::{Error, Result};
use crate::model::{ResNet, create};
use burn::module::AutodiffModule;
use burn_nn::loss::CrossEntropyLossConfig;
use burn_optim::decay::WeightDecayConfig;
use burn_optim::momentum::MomentumConfig;
use burn_optim::{AdamWConfig, GradientsParams, Optimizer, SgdConfig};
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use super::grad_scaler::GradScaler;
use super::phases::StepPhases;

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
    let dist = match config.strategy {
        Strategy::Ddp => Distributed::from_env(config.processes(), matches!(config.device, DeviceSpec::Cuda(_)))?,
        Strategy::Dp => None,
    };
    train_inner::<B>(config, devices, dist.as_ref())
}

/// Trains as one rank of `dist` (or alone with `None`).
///
/// # Errors
/// As [`train`].
pub fn train_with<B: AutodiffBackend>(config: &TrainConfig, device: B::Device, dist: Dist<'_>) -> Result<TrainSummary> {
    train_inner::<B>(config, vec![device], dist)
}

fn train_inner<B: AutodiffBackend>(config: &TrainConfig, devices: Vec<B::Device>, dist: Dist<'_>) -> Result<TrainSummary> {
    let data = load_source(&config.source(), config.image_size)?;
    let classes = data.dataset.classes().len();
    let mut model: ResNet<B> = seeded_model(config, classes, data.train.channels, &devices[0])?.with_precision(config.precision).with_channels_last(config.channels_last_on());
    match dist {
        Some(d) if config.sync_bn => model = model.with_sync_batch_norm(Some(BatchNormSync::new::<B>(d.device_group.clone())?)),
        None if config.sync_bn => log::info!("--sync-bn: one process, so BatchNorm statistics are already over the whole batch"),
        _ => {}
    }
    let wd = config.weight_decay as f32;
    match config.optimizer {
        OptimizerKind::Sgd => {
            let momentum = (config.momentum > 0.0).then(|| MomentumConfig::new().with_momentum(config.momentum).with_dampening(0.0));
            let optim = SgdConfig::new().with_momentum(momentum).with_weight_decay((wd > 0.0).then(|| WeightDecayConfig::new(wd))).init();
            train_loop(config, data, model, optim, devices, dist)
        }
        OptimizerKind::Adamw => train_loop(config, data, model, AdamWConfig::new().with_weight_decay(wd).init(), devices, dist),
    }
}

/// Backends keep one random generator per process (flex: a global), so seeding and drawing the
/// initial weights happen under one lock: concurrent trainings in a process (tests, services)
/// still get the initialisation their seed promises.
static INIT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seeded_model<B: AutodiffBackend>(config: &TrainConfig, classes: usize, channels: usize, device: &B::Device) -> Result<ResNet<B>> {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    B::seed(device, config.seed);
    create(&config.model, classes, channels, config.small_input, device)
}

struct Resumed<B: AutodiffBackend, O> {
    model: ResNet<B>,
    optim: O,
    epoch: usize,
    step: usize,
    best_acc: f64,
}

/// Settings that must match between a run and its resumption for it to continue exactly.
const RESUME_KEYS: [&str; 9] = ["data", "model", "batch_size", "seed", "val_fraction", "optimizer", "small_input", "image_size", "epochs"];

fn resume<B: AutodiffBackend, O: Optimizer<ResNet<B>, B>>(config: &TrainConfig, model: ResNet<B>, optim: O, device: &B::Device) -> Result<Resumed<B, O>> {
    let path = last_path(&config.out);
    let ck = Checkpoint::load(&path)?;
    let now = serde_json::to_value(config).expect("config serialises");
    let bad = |reason: String| Error::BadCheckpoint { path: path.clone(), reason };
    for key in RESUME_KEYS {
        if ck.meta.config.get(key) != now.get(key) {
            return Err(bad(format!("it was trained with {key}={}, this run has {key}={}; use the same settings or another --out", ck.meta.config.get(key).unwrap_or(&serde_json::Value::Null), now[key])));
        }
    }
    let record = Bytes::default().load(ck.model, device).map_err(|e| bad(format!("model record: {e}")))?;
    let optim_record = Bytes::default().load(ck.optimizer, device).map_err(|e| bad(format!("optimizer record: {e}")))?;
    Ok(Resumed { model: model.load_record(record), optim: optim.load_record(optim_record), epoch: ck.meta.epoch, step: ck.meta.step, best_acc: ck.meta.best_acc })
}

fn progress_bar(config: &TrainConfig, len: usize, epoch: usize) -> ProgressBar {
    if !config.show_progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30.cyan/blue}] {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("epoch {}/{}", epoch + 1, config.epochs));
    bar
}

fn train_loop<B: AutodiffBackend, O: Optimizer<ResNet<B>, B>>(
    config: &TrainConfig,
    data: crate::data::source::LoadedData,
    model: ResNet<B>,
    optim: O,
    devices: Vec<B::Device>,
    dist: Dist<'_>,
) -> Result<TrainSummary> {
    let started = Instant::now();
    let device = devices[0].clone();
    // DataParallel: the loader's batch is split over the devices (batch_size per device).
    let dp = (devices.len() > 1).then(|| DataParallel::<B>::new(devices.clone()));
    let batch_size = config.batch_size * devices.len();
    let out = &config.out;
    let main_rank = dist.is_none_or(|d| d.rank == 0);
    let (rank, world) = dist.map_or((0, 1), |d| (d.rank, d.world));
    let (mut model, mut optim, start_epoch, mut step, mut best_acc) = if config.resume {
        let r = resume(config, model, optim, &device)?;
        log::info!("resuming {} after epoch {} (step {})", last_path(out).display(), r.epoch, r.step);
        (r.model, r.optim, r.epoch, r.step, r.best_acc)
    } else {
        if last_path(out).exists() {
            return Err(Error::InvalidConfig {
                name: "--out",
                value: out.display().to_string(),
                reason: "it already holds a run (last.ckpt); pass --resume to continue it or choose another --out".into(),
            });
        }
        (model, optim, 0, 0, 0.0)
    };
    // Every rank starts from rank 0's parameters and buffers.
    if let Some(d) = dist {
        model = d.ddp.broadcast_module(model)?;
    }
    let metrics = MetricsLog::new(&out.join("metrics.jsonl"));
    let mut board = None;
    if main_rank {
        std::fs::create_dir_all(out).map_err(|e| Error::io("creating", out, e))?;
        metrics.truncate_to(start_epoch)?;
        board = Some(EventWriter::create(&out.join("tensorboard"))?);
    }

    let dataset: Arc<dyn Dataset> = data.dataset.clone();
    let labels: Vec<usize> = (0..dataset.len()).map(|i| dataset.label(i)).collect();
    let (train_idx, val_idx) = split_per_class(&labels, config.val_fraction, config.seed);
    let sampler = DistributedSampler::new(train_idx.len(), world, rank).with_seed(config.seed).with_drop_last(true);
    let per_rank = if dist.is_some() { sampler.num_samples() } else { train_idx.len() };
    let drop_last = per_rank > batch_size;
    let mut steps_per_epoch = if drop_last { per_rank / batch_size } else { 1 };
    if let Some(max) = config.max_steps_per_epoch {
        steps_per_epoch = steps_per_epoch.min(max);
    }
    let schedule = CosineSchedule {
        base_lr: config.scaled_lr(),
        min_factor: config.min_lr_factor,
        warmup_steps: config.warmup_epochs * steps_per_epoch,
        total_steps: config.epochs * steps_per_epoch,
    };
    if main_rank {
        log::info!(
            "training {} on {} ({} classes): {} train / {} validation images, {} device(s) x batch {} = global batch {}, {} steps/epoch, lr {} ({} x {}){}{}{}{}",
            config.model, config.data, dataset.classes().len(), train_idx.len(), val_idx.len(), config.world_size(), config.batch_size,
            config.batch_size * config.world_size(), steps_per_epoch, schedule.base_lr, config.lr, config.world_size(),
            if dp.is_some() { ", DataParallel" } else if world > 1 { ", DDP" } else { "" },
            if model.sync_batch_norm() { ", SyncBatchNorm" } else { "" },
            if model.precision() == crate::nn::Precision::F32 { String::new() } else { format!(", {} activations", model.precision()) },
            if model.layout() == crate::nn::Layout::Nhwc { ", channels-last" } else { "" }
        );
    }
    let loader_config = LoaderConfig { batch_size, drop_last, prefetch: config.prefetch, seed: config.seed, strict: config.strict_images };
    let skips = Arc::new(SkipLog::default());
    let loss_fn = CrossEntropyLossConfig::new()
        .with_smoothing((config.label_smoothing > 0.0).then_some(config.label_smoothing as f32))
        .init(&device);
    let mut records = Vec::new();
    let mut health: Vec<Vec<f64>> = Vec::new();

    let end_epoch = config.stop_after_epochs.map_or(config.epochs, |n| (start_epoch + n).min(config.epochs));
    // f16 activations need loss scaling (bf16 has f32's range). A resumed run starts again
    // from the initial scale, which adapts within a few steps.
    let mut scaler = (config.precision == crate::nn::Precision::F16).then(GradScaler::default);
    for epoch in start_epoch..end_epoch {
        let epoch_start = Instant::now();
        let order = match dist {
            None => shuffle_for_epoch(&train_idx, config.seed, epoch as u64),
            Some(_) => {
                let mut sampler = sampler.clone();
                sampler.set_epoch(epoch as u64);
                sampler.indices().into_iter().map(|i| train_idx[i]).collect()
            }
        };
        let loader = Loader::new(dataset.clone(), order, data.train.clone(), epoch as u64, loader_config.clone(), skips.clone());
        let bar = if main_rank { progress_bar(config, steps_per_epoch, epoch) } else { ProgressBar::hidden() };
        let mut sync_seconds = 0.0;
        let mut loss_sum = Tensor::<B::InnerBackend, 1>::zeros([1], &device);
        let mut correct = Tensor::<B::InnerBackend, 1, Int>::zeros([1], &device);
        let mut seen = 0usize;
        let mut epoch_steps = 0usize;
        let mut first_step = None;
        let warmup_steps = if steps_per_epoch >= 4 { 2 } else { 1 };
        let mut phases = StepPhases::<B>::new(&device);
        let mut batches = loader.take(steps_per_epoch);
        loop {
            phases.restart();
            let Some(batch) = batches.next() else { break };
            phases.end(0);
            let batch = batch?;
            let n = batch.shape[0];
            let (x, y) = batch_tensors::<B>(batch, &device);
            phases.end(1);
            let loss_scale = scaler.as_ref().map_or(1.0, GradScaler::scale);
            let mut grads = match &dp {
                Some(dp) => {
                    let (xs, ys) = (dp.scatter(x), dp.scatter(y));
                    let out = dp.step(model, n, |replica: ResNet<B>, i, _dev| {
                        let (x, y) = (xs[i].clone(), ys[i].clone());
                        let k = x.dims()[0];
                        let logits = replica.forward(x);
                        let hits: i64 = logits.clone().inner().argmax(1).reshape([k]).equal(y.clone().inner()).int().sum().into_scalar().elem();
                        (loss_fn.forward(logits, y).mul_scalar(loss_scale), hits)
                    });
                    loss_sum = loss_sum.add_scalar(out.loss / loss_scale * n as f64);
                    correct = correct.add_scalar(out.outputs.iter().sum::<i64>());
                    model = out.model;
                    out.grads
                }
                None => {
                    let logits = model.forward(x);
                    let loss = loss_fn.forward(logits.clone(), y.clone());
                    loss_sum = loss_sum + loss.clone().inner().mul_scalar(n as f64);
                    correct = correct + logits.inner().argmax(1).reshape([n]).equal(y.inner()).int().sum();
                    phases.end(2);
                    GradientsParams::from_grads(loss.mul_scalar(loss_scale).backward(), &model)
                }
            };
            phases.end(3);
            if let Some(d) = dist {
                let t = Instant::now();
                grads = d.ddp.sync_gradients(&model, grads)?;
                sync_seconds += t.elapsed().as_secs_f64();
            }
            phases.end(4);
            // With loss scaling, gradients that overflowed skip the step (every rank alike:
            // they were all-reduced first).
            let grads = match &mut scaler {
                Some(s) => s.unscale(&model, grads),
                None => Some(grads),
            };
            if let Some(grads) = grads {
                model = optim.step(schedule.lr(step), model, grads);
            }
            phases.end(5);
            step += 1;
            epoch_steps += 1;
            seen += n;
            // The first step carries the one-time costs (kernel tuning and compilation, cuDNN's
            // algorithm search, the first batch's decoding), the second those of the optimizer
            // with its state (momentum, moments): steady throughput is timed after them (after
            // the first only, in epochs of fewer than four steps).
            if epoch_steps == warmup_steps {
                let _ = B::sync(&device);
                first_step = Some((Instant::now(), seen));
            }
            log::debug!("step {epoch_steps}: host at {:.3}s of the epoch", epoch_start.elapsed().as_secs_f64());
            bar.inc(1);
            if step % 10 == 0 {
                bar.set_message(format!("{:.0} img/s", seen as f64 / epoch_start.elapsed().as_secs_f64()));
            }
        }
        bar.finish_and_clear();
        let mut train_sums = [loss_sum.into_scalar().elem::<f64>(), correct.into_scalar().elem::<i64>() as f64, seen as f64];
        // Read back above, so the device has finished the epoch's steps.
        let train_seconds = epoch_start.elapsed().as_secs_f64();
        let rank_img_per_s = seen as f64 / train_seconds;
        let rank_steady = first_step.filter(|_| epoch_steps > warmup_steps).map(|(t, n0)| (seen - n0) as f64 / t.elapsed().as_secs_f64());
        let rank_seen = seen;
        if let Some(d) = dist {
            d.sum(&mut train_sums)?;
            // Per-rank BatchNorm running statistics: rank 0's are broadcast at the end of every
            // epoch (with SyncBatchNorm they are identical on every rank already).
            if !model.sync_batch_norm() {
                model = d.ddp.broadcast_module(model)?;
            }
        }
        let train_tally = Tally { loss_sum: train_sums[0], top1: train_sums[1] as usize, top5: 0, count: train_sums[2] as usize };
        let seen = train_tally.count;

        // Validation: every sample exactly once across ranks, then the tallies are summed.
        let my_val: Vec<usize> = match dist {
            None => val_idx.clone(),
            Some(d) => shard_exact(val_idx.len(), d.world, d.rank).into_iter().map(|i| val_idx[i]).collect(),
        };
        let mut val = evaluate(&model.valid(), dataset.clone(), my_val, data.eval.clone(), loader_config.clone(), skips.clone(), &device)?;
        let mut skipped = skips.count() as f64;
        if let Some(d) = dist {
            let mut v = [val.loss_sum, val.top1 as f64, val.top5 as f64, val.count as f64, skipped];
            d.sum(&mut v)?;
            val = Tally { loss_sum: v[0], top1: v[1] as usize, top5: v[2] as usize, count: v[3] as usize };
            skipped = v[4];
            let gpu = match &config.device {
                DeviceSpec::Cuda(ids) => ids.get(d.local_rank).copied(),
                DeviceSpec::Cpu => None,
            };
            let steps_done = epoch_steps.max(1) as f64;
            health.push(d.gather(&super::health::row(rank_img_per_s, sync_seconds / train_seconds.max(1e-9), gpu, 1e3 * sync_seconds / steps_done))?);
        }
        let record = EpochRecord {
            epoch: epoch + 1,
            train_loss: train_tally.loss(),
            train_acc: train_tally.acc1(),
            val_loss: val.loss(),
            val_acc: val.acc1(),
            val_acc5: val.acc5(),
            lr: schedule.lr(step.saturating_sub(1)),
            img_per_s: seen as f64 / train_seconds,
            steady_img_per_s: rank_steady.map(|r| r * seen as f64 / rank_seen.max(1) as f64),
            data_wait_s: phases.seconds(0),
            phases_s: phases.totals(),
            seconds: epoch_start.elapsed().as_secs_f64(),
            skipped_images: skipped as usize,
        };
        if !main_rank {
            records.push(record);
            continue;
        }
        log::info!(
            "epoch {}/{}: train loss {:.4} acc {:.2}% | val loss {:.4} acc {:.2}% top-5 {:.2}% | lr {:.2e} | {:.0} img/s ({:.0} after warm-up, {:.1}s waiting for data) | {:.1}s",
            record.epoch, config.epochs, record.train_loss, 100.0 * record.train_acc, record.val_loss, 100.0 * record.val_acc,
            100.0 * record.val_acc5, record.lr, record.img_per_s, record.steady_img_per_s.unwrap_or(record.img_per_s), record.data_wait_s, record.seconds
        );
        let improved = record.val_acc > best_acc || epoch == 0;
        best_acc = best_acc.max(record.val_acc);
        let ck = Checkpoint {
            meta: CheckpointMeta {
                model: config.model.clone(),
                classes: dataset.classes().to_vec(),
                in_channels: data.train.channels,
                small_input: config.small_input,
                image_size: data.eval.output_size((config.image_size, config.image_size)).0,
                epoch: epoch + 1,
                step,
                best_acc,
                val_acc: record.val_acc,
                config: serde_json::to_value(config).expect("config serialises"),
            },
            model: Bytes::default().record(model.clone().into_record(), ()).map_err(|e| Error::BadCheckpoint { path: last_path(out), reason: e.to_string() })?,
            optimizer: Bytes::default().record(optim.to_record(), ()).map_err(|e| Error::BadCheckpoint { path: last_path(out), reason: e.to_string() })?,
        };
        if improved {
            Checkpoint { optimizer: Vec::new(), ..ck.clone() }.save(&best_path(out))?;
        }
        ck.save(&last_path(out))?;
        metrics.append(&record)?;
        if let Some(tb) = board.as_mut() {
            let step = record.epoch as i64;
            for (tag, value) in [
                ("train/loss", record.train_loss),
                ("train/acc", record.train_acc),
                ("val/loss", record.val_loss),
                ("val/acc", record.val_acc),
                ("val/acc5", record.val_acc5),
                ("lr", record.lr),
                ("img_per_s", record.img_per_s),
            ] {
                tb.scalar(tag, value, step)?;
            }
            tb.flush()?;
        }
        records.push(record);
    }
    if main_rank {
        if let Some(last) = health.last() {
            super::health::log(last);
        }
    }
    Ok(TrainSummary {
        epochs: records,
        best_acc,
        resumed_after: config.resume.then_some(start_epoch),
        skipped: skips.count(),
        first_skipped: skips.first(),
        out: out.clone(),
        seconds: started.elapsed().as_secs_f64(),
    })
}
