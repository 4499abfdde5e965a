//! The single-process training loop: data, model, optimiser, schedule, validation,
//! checkpoints, metrics and exact resume.

use super::checkpoint::{Checkpoint, CheckpointMeta, best_path, last_path};
use super::config::{OptimizerKind, TrainConfig};
use super::evaluate::{batch_tensors, evaluate};
use super::metrics::{EpochRecord, MetricsLog, Tally};
use super::schedule::CosineSchedule;
use crate::data::{Dataset, Loader, LoaderConfig, SkipLog, load_source, shuffle_for_epoch, split_per_class};
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

/// Trains on one device of backend `B`.
///
/// # Errors
/// For invalid settings, unreadable data, unusable checkpoints, or an existing run in `out`
/// without `resume`.
pub fn train<B: AutodiffBackend>(config: &TrainConfig, device: B::Device) -> Result<TrainSummary> {
    config.validate()?;
    let data = load_source(&config.source(), config.image_size)?;
    let classes = data.dataset.classes().len();
    B::seed(&device, config.seed);
    let model: ResNet<B> = create(&config.model, classes, data.train.channels, config.small_input, &device)?;
    let wd = config.weight_decay as f32;
    match config.optimizer {
        OptimizerKind::Sgd => {
            let momentum = (config.momentum > 0.0).then(|| MomentumConfig::new().with_momentum(config.momentum).with_dampening(0.0));
            let optim = SgdConfig::new().with_momentum(momentum).with_weight_decay((wd > 0.0).then(|| WeightDecayConfig::new(wd))).init();
            train_loop(config, data, model, optim, device)
        }
        OptimizerKind::Adamw => train_loop(config, data, model, AdamWConfig::new().with_weight_decay(wd).init(), device),
    }
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
    device: B::Device,
) -> Result<TrainSummary> {
    let started = Instant::now();
    let out = &config.out;
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
    std::fs::create_dir_all(out).map_err(|e| Error::io("creating", out, e))?;
    let metrics = MetricsLog::new(&out.join("metrics.jsonl"));
    metrics.truncate_to(start_epoch)?;

    let dataset: Arc<dyn Dataset> = data.dataset.clone();
    let labels: Vec<usize> = (0..dataset.len()).map(|i| dataset.label(i)).collect();
    let (train_idx, val_idx) = split_per_class(&labels, config.val_fraction, config.seed);
    let drop_last = train_idx.len() > config.batch_size;
    let mut steps_per_epoch = if drop_last { train_idx.len() / config.batch_size } else { 1 };
    if let Some(max) = config.max_steps_per_epoch {
        steps_per_epoch = steps_per_epoch.min(max);
    }
    let schedule = CosineSchedule {
        base_lr: config.scaled_lr(),
        min_factor: config.min_lr_factor,
        warmup_steps: config.warmup_epochs * steps_per_epoch,
        total_steps: config.epochs * steps_per_epoch,
    };
    log::info!(
        "training {} on {} ({} classes): {} train / {} validation images, batch {}, {} steps/epoch, lr {}",
        config.model, config.data, dataset.classes().len(), train_idx.len(), val_idx.len(), config.batch_size, steps_per_epoch, schedule.base_lr
    );
    let loader_config = LoaderConfig { batch_size: config.batch_size, drop_last, prefetch: config.prefetch, seed: config.seed, strict: config.strict_images };
    let skips = Arc::new(SkipLog::default());
    let loss_fn = CrossEntropyLossConfig::new()
        .with_smoothing((config.label_smoothing > 0.0).then_some(config.label_smoothing as f32))
        .init(&device);
    let mut records = Vec::new();

    let end_epoch = config.stop_after_epochs.map_or(config.epochs, |n| (start_epoch + n).min(config.epochs));
    for epoch in start_epoch..end_epoch {
        let epoch_start = Instant::now();
        let order = shuffle_for_epoch(&train_idx, config.seed, epoch as u64);
        let loader = Loader::new(dataset.clone(), order, data.train.clone(), epoch as u64, loader_config.clone(), skips.clone());
        let bar = progress_bar(config, steps_per_epoch, epoch);
        let mut loss_sum = Tensor::<B::InnerBackend, 1>::zeros([1], &device);
        let mut correct = Tensor::<B::InnerBackend, 1, Int>::zeros([1], &device);
        let mut seen = 0usize;
        for batch in loader.take(steps_per_epoch) {
            let batch = batch?;
            let n = batch.shape[0];
            let (x, y) = batch_tensors::<B>(batch, &device);
            let logits = model.forward(x);
            let loss = loss_fn.forward(logits.clone(), y.clone());
            loss_sum = loss_sum + loss.clone().inner().mul_scalar(n as f64);
            correct = correct + logits.inner().argmax(1).reshape([n]).equal(y.inner()).int().sum();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(schedule.lr(step), model, grads);
            step += 1;
            seen += n;
            bar.inc(1);
            if step % 10 == 0 {
                bar.set_message(format!("{:.0} img/s", seen as f64 / epoch_start.elapsed().as_secs_f64()));
            }
        }
        bar.finish_and_clear();
        let train_seconds = epoch_start.elapsed().as_secs_f64();
        let mut train_tally = Tally { count: seen, ..Tally::default() };
        train_tally.loss_sum = loss_sum.into_scalar().elem();
        train_tally.top1 = correct.into_scalar().elem::<i64>() as usize;

        let val = evaluate(&model.valid(), dataset.clone(), val_idx.clone(), data.eval.clone(), loader_config.clone(), skips.clone(), &device)?;
        let record = EpochRecord {
            epoch: epoch + 1,
            train_loss: train_tally.loss(),
            train_acc: train_tally.acc1(),
            val_loss: val.loss(),
            val_acc: val.acc1(),
            val_acc5: val.acc5(),
            lr: schedule.lr(step.saturating_sub(1)),
            img_per_s: seen as f64 / train_seconds,
            seconds: epoch_start.elapsed().as_secs_f64(),
            skipped_images: skips.count(),
        };
        log::info!(
            "epoch {}/{}: train loss {:.4} acc {:.2}% | val loss {:.4} acc {:.2}% top-5 {:.2}% | lr {:.2e} | {:.0} img/s | {:.1}s",
            record.epoch, config.epochs, record.train_loss, 100.0 * record.train_acc, record.val_loss, 100.0 * record.val_acc,
            100.0 * record.val_acc5, record.lr, record.img_per_s, record.seconds
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
        records.push(record);
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
