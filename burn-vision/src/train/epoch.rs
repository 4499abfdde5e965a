//! One epoch of training: the plan every epoch follows (split, sampler, steps per epoch,
//! schedule), the steps themselves (one device, DataParallel, or one DDP rank), and
//! validation over every rank's shard.

use super::checkpoint::PartialEpoch;
use super::config::TrainConfig;
use super::distributed::Dist;
use super::fine_tune::LrGroups;
use super::grad_scaler::GradScaler;
use super::metrics::Tally;
use super::mixup::soft_cross_entropy;
use super::schedule::CosineSchedule;
use crate::data::Dataset;
use crate::data::loader::Loader;
use crate::data::loader::LoaderConfig;
use crate::data::loader::SkipLog;
use crate::data::shards::samples_by_shard;
use crate::data::source::LoadedData;
use crate::data::split::split_per_class;
use crate::error::Result;
use crate::model::classifier::Classifier;
use crate::model::image_classifier::ImageClassifier;
use crate::train::inference::evaluate::{batch_tensors, evaluate};
use crate::train::instrument::phases::StepPhases;
use crate::train::instrument::trace::StepTracer;
use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_ddp::DataParallel;
use burn_ddp::nn::cross_entropy;
use burn_ddp::sampler::{DistributedSampler, shard_exact};
use burn_ddp::shard_sampler::ShardSampler;
use burn_optim::{GradientsParams, Optimizer};
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Arc;
use std::time::Instant;

/// How each epoch's training samples are drawn for this rank.
#[derive(Clone)]
enum Sampling {
    /// DistributedSampler over the training split (data read in any order).
    Samples(DistributedSampler),
    /// ShardSampler over the training split's samples, shard by shard (tar shards).
    Shards(ShardSampler),
}

/// What every epoch of a run follows.
pub(super) struct EpochPlan {
    pub dataset: Arc<dyn Dataset>,
    pub train_idx: Vec<usize>,
    pub val_idx: Vec<usize>,
    sampling: Sampling,
    pub steps_per_epoch: usize,
    pub schedule: CosineSchedule,
    pub loader: LoaderConfig,
}

impl EpochPlan {
    /// Splits `data` per class, shards the training part over `dist`'s ranks (drop_last, as
    /// DistributedSampler), and fixes the steps per epoch and the schedule. `batch_size` is this
    /// process's (all its devices').
    pub fn new(config: &TrainConfig, data: &LoadedData, batch_size: usize, dist: Dist<'_>) -> Self {
        let dataset: Arc<dyn Dataset> = data.dataset.clone();
        let labels: Vec<usize> = (0..dataset.len()).map(|i| dataset.label(i)).collect();
        let (train_idx, val_idx) = split_per_class(&labels, config.val_fraction, config.seed);
        let (rank, world) = dist.map_or((0, 1), |d| (d.rank, d.world));
        let (sampling, per_rank) = match dataset.shards() {
            Some(ranges) => {
                let sampler = ShardSampler::new(samples_by_shard(ranges, &train_idx), world, rank)
                    .with_seed(config.seed)
                    .with_buffer(config.shuffle_buffer);
                let per_rank = sampler.num_samples();
                (Sampling::Shards(sampler), per_rank)
            }
            None => {
                let sampler =
                    DistributedSampler::new(train_idx.len(), world, rank).with_seed(config.seed).with_drop_last(true);
                let per_rank = if dist.is_some() { sampler.num_samples() } else { train_idx.len() };
                (Sampling::Samples(sampler), per_rank)
            }
        };
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
        let loader = LoaderConfig {
            batch_size,
            drop_last,
            prefetch: config.prefetch,
            seed: config.seed,
            strict: config.strict_images,
            // Set by the training loop, which knows the device (`data::decode::resolve`).
            device_decode: None,
        };
        Self { dataset, train_idx, val_idx, sampling, steps_per_epoch, schedule, loader }
    }

    /// This rank's training samples of `epoch`, in order: the sampler's (a single process is
    /// its world of one, so it trains on the order a one-rank DDP run does; with
    /// DistributedSampler N ranks with batch b see in each step the samples one process with
    /// batch N·b sees, with tar shards each rank reads its own run of shards).
    fn order(&self, epoch: usize) -> Vec<usize> {
        match self.sampling.clone() {
            Sampling::Samples(mut sampler) => {
                sampler.set_epoch(epoch as u64);
                sampler.indices().into_iter().map(|i| self.train_idx[i]).collect()
            }
            Sampling::Shards(mut sampler) => {
                sampler.set_epoch(epoch as u64);
                sampler.indices()
            }
        }
    }

    /// This rank's loader of `epoch`'s batches, after the first `done_steps` (a resumed epoch
    /// skips the batches its checkpoint had trained on).
    fn loader_from(
        &self,
        epoch: usize,
        done_steps: usize,
        pipeline: &crate::data::transform::Pipeline,
        skips: &Arc<SkipLog>,
    ) -> Loader {
        let order = self.order(epoch);
        let order = order[(done_steps * self.loader.batch_size).min(order.len())..].to_vec();
        Loader::new(self.dataset.clone(), order, pipeline.clone(), epoch as u64, self.loader.clone(), skips.clone())
    }
}

/// Where and how steps run: this process's devices, DataParallel over them, or one DDP rank.
pub(super) struct Placement<'a, B: AutodiffBackend> {
    pub device: B::Device,
    pub dp: Option<DataParallel<B>>,
    pub dist: Dist<'a>,
}

impl<B: AutodiffBackend> Placement<'_, B> {
    /// Whether this process speaks for the run (rank 0, or no DDP): progress, logs, files.
    pub fn main_rank(&self) -> bool {
        self.dist.is_none_or(|d| d.rank == 0)
    }

    /// Hands burn-cuda's unused memory back on every device of the step (its exact-size
    /// blocks serve one batch size: done when the size changes, and around validation).
    fn release_unused(&self) {
        // DataParallel's devices include `device` (its first).
        let devices = self.dp.as_ref().map_or(std::slice::from_ref(&self.device), |dp| dp.devices());
        devices.iter().for_each(burn_ddp::nn::runtime::memory::release_unused_on);
    }
}

/// The model and what moves it: optimizer, step count, loss scaling.
pub(super) struct Trainer<B: AutodiffBackend, O> {
    pub model: Classifier<B>,
    pub optim: O,
    pub lr_groups: LrGroups,
    /// Global gradient-norm limit (`--clip-grad-norm`).
    pub clip_grad_norm: Option<f64>,
    /// BatchNorm forward passes before step 0 (a pretrained file's `num_batches_tracked`).
    pub batches_tracked_before: i64,
    pub step: usize,
    pub scaler: Option<GradScaler>,
    /// Label smoothing ε of the hard-label loss (`burn_ddp::nn::cross_entropy`).
    pub label_smoothing: f32,
}

/// What one rank measured over an epoch of training.
pub(super) struct EpochTrained {
    /// `[loss × samples, correct, samples]` summed over this rank's steps.
    pub sums: [f64; 3],
    pub seconds: f64,
    /// This rank's own images per second over the steps this process trained (a resumed
    /// epoch's earlier part, summed over every rank in its checkpoint, is not this rank's).
    pub rank_img_per_s: f64,
    /// This rank's images per second after the warm-up steps, when there were more.
    pub steady_img_per_s: Option<f64>,
    pub sync_seconds: f64,
    /// Seconds inside the all-reduce collectives themselves (the groups' own work).
    pub collective_seconds: f64,
    pub steps: usize,
    pub data_wait_s: f64,
    pub phases_s: Vec<(String, f64)>,
    /// The loader's hand-over of this epoch's batches to the GPU's decoder, if it decoded any.
    pub device_decode: Option<crate::data::throughput::DeviceSubmit>,
}

/// What the run does with the state at `--checkpoint-every` steps.
pub(super) type SaveHook<'s, B, O> = &'s mut dyn FnMut(&Trainer<B, O>, PartialEpoch) -> Result<()>;

/// Where an epoch starts, and the run's hooks around its steps.
pub(super) struct EpochStart<'s, B: AutodiffBackend, O> {
    pub epoch: usize,
    /// What a mid-epoch checkpoint says was done before this invocation (else nothing).
    pub done: PartialEpoch,
    /// Called on every rank at `--checkpoint-every` steps with the epoch so far, summed over
    /// the ranks (rank 0 saves).
    pub save: SaveHook<'s, B, O>,
    /// `--profile-steps`' recorder.
    pub tracer: &'s mut StepTracer,
}

/// The loss and hit count of one step on the device, and its gradients.
struct StepOut<B: AutodiffBackend> {
    grads: GradientsParams,
    loss_sum: Tensor<B::InnerBackend, 1>,
    correct: Tensor<B::InnerBackend, 1, Int>,
}

fn progress_bar(config: &TrainConfig, len: usize, epoch: usize) -> ProgressBar {
    if !config.show_progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30.cyan/blue}] {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    bar.set_prefix(format!("epoch {}/{}", epoch + 1, config.epochs));
    bar
}

/// Trains one epoch: loads this rank's batches, steps the model, and reads the device's loss
/// and hit counts once at the end. Phases per step: 0 data wait, 1 upload, 2 forward, 3
/// backward (as a DDP rank: with the gradient all-reduce it overlaps), 4 loss-scale checks,
/// 5 optimizer.
pub(super) fn train_epoch<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
    trainer: &mut Trainer<B, O>,
    plan: &EpochPlan,
    at: &Placement<'_, B>,
    config: &TrainConfig,
    (start, train_pipeline): (EpochStart<'_, B, O>, &crate::data::transform::Pipeline),
    skips: &Arc<SkipLog>,
) -> Result<EpochTrained> {
    let mut tally = StepSums::<B>::new(&at.device);
    let (device, epoch, done) = (&at.device, start.epoch, start.done);
    let loader = plan.loader_from(epoch, done.steps, train_pipeline, skips);
    let main_rank = at.main_rank();
    let bar = if main_rank { progress_bar(config, plan.steps_per_epoch, epoch) } else { ProgressBar::hidden() };
    bar.set_position(done.steps as u64);
    // The first step carries the one-time costs (kernel tuning and compilation, cuDNN's plan
    // search, the first batch's decoding), the second those of the optimizer with its state:
    // steady throughput is timed after them (after the first only, in epochs of < 4 steps).
    let warmup_steps = if plan.steps_per_epoch >= 4 { 2 } else { 1 };
    let mut phases = StepPhases::<B>::new(device);
    let (mut batches, mut last_n) = (loader.take(plan.steps_per_epoch.saturating_sub(done.steps)), None);
    let mut profile = None;
    loop {
        start.tracer.before_step(trainer.step);
        phases.restart();
        let Some(batch) = batches.next() else { break };
        phases.end(0);
        let batch = batch?;
        let n = batch.shape[0];
        if last_n.replace(n).is_some_and(|m| m != n) {
            at.release_unused();
        }
        let key = super::mixup::step_key(config.seed, (epoch, trainer.step, at.dist.map_or(0, |d| d.rank)));
        let tensors = mixed_batch::<B>(batch, config, key, plan.dataset.classes().len(), device)?;
        trainer.model.set_draw_key(key);
        phases.end(1);
        let synced_before = at.dist.map_or(0.0, |d| d.ddp.stats().seconds);
        let out = step_gradients(trainer, at, tensors, &mut phases)?;
        tally = tally.add(out.loss_sum, out.correct, n);
        phases.end(3);
        apply_step(trainer, out.grads, &plan.schedule, &mut phases);
        tally.sync_seconds += at.dist.map_or(0.0, |d| d.ddp.stats().seconds) - synced_before;
        start.tracer.after_step(trainer.step - 1)?;
        if config.checkpoint_every.is_some_and(|k| trainer.step.is_multiple_of(k))
            && done.steps + tally.steps < plan.steps_per_epoch
        {
            (start.save)(trainer, tally.so_far(done, at.dist)?)?;
        }
        if tally.steps == warmup_steps {
            let _ = B::sync(device);
            tally.first_step = Some((Instant::now(), tally.seen));
            profile = host_profile_of(config, epoch, main_rank)?;
        }
        bar.inc(1);
        if trainer.step.is_multiple_of(10) {
            bar.set_message(format!("{:.0} img/s", tally.seen as f64 / tally.started.elapsed().as_secs_f64()));
        }
    }
    bar.finish_and_clear();
    if let Some(p) = profile {
        let _ = B::sync(device);
        log::info!("host profile of epoch {}'s steady steps written: {}", epoch + 1, p.finish()?.display());
    }
    Ok(tally.trained(done, (warmup_steps, main_rank), &phases))
}

/// What an epoch's steps add up to as they run: the device's loss and hit sums (read once, at
/// the end), and the host's counts and clocks.
struct StepSums<B: AutodiffBackend> {
    loss_sum: Tensor<B::InnerBackend, 1>,
    correct: Tensor<B::InnerBackend, 1, Int>,
    seen: usize,
    steps: usize,
    sync_seconds: f64,
    /// When the warm-up steps had run on the device, and the images seen by then.
    first_step: Option<(Instant, usize)>,
    started: Instant,
    collectives_before: f64,
    decode_before: burn_ddp::nn::decode::DeviceDecodeTimes,
}

impl<B: AutodiffBackend> StepSums<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            loss_sum: Tensor::zeros([1], device),
            correct: Tensor::zeros([1], device),
            seen: 0,
            steps: 0,
            sync_seconds: 0.0,
            first_step: None,
            started: Instant::now(),
            collectives_before: burn_ddp::tensor::collective_seconds(),
            decode_before: burn_ddp::nn::decode::device_decode_times(),
        }
    }

    /// Counts a step of `n` images with its loss and hit sums (the sums move, so the device
    /// adds in place).
    fn add(self, loss_sum: Tensor<B::InnerBackend, 1>, correct: Tensor<B::InnerBackend, 1, Int>, n: usize) -> Self {
        Self {
            loss_sum: self.loss_sum + loss_sum,
            correct: self.correct + correct,
            steps: self.steps + 1,
            seen: self.seen + n,
            ..self
        }
    }

    /// The epoch so far, summed over the ranks, for a mid-epoch checkpoint.
    fn so_far(&self, done: PartialEpoch, dist: Dist<'_>) -> Result<PartialEpoch> {
        epoch_so_far::<B>(done, (self.steps, self.seen, self.started), (&self.loss_sum, &self.correct), dist)
    }

    /// The epoch's figures once its steps are enqueued: reading the device's sums waits for
    /// them to run. `done` is what a resumed epoch had trained before; its sums were summed over
    /// the ranks already, so only the rank that speaks for the run (`main_rank`) adds them.
    fn trained(
        self,
        done: PartialEpoch,
        (warmup_steps, main_rank): (usize, bool),
        phases: &StepPhases<B>,
    ) -> EpochTrained {
        let (seen, steps) = (self.seen, self.steps);
        let mut sums =
            [self.loss_sum.into_scalar().elem::<f64>(), self.correct.into_scalar().elem::<i64>() as f64, seen as f64];
        if main_rank {
            sums.iter_mut().zip(done.sums).for_each(|(s, d)| *s += d);
        }
        let steady_img_per_s = self
            .first_step
            .filter(|_| steps > warmup_steps)
            .map(|(t, n0)| (seen - n0) as f64 / t.elapsed().as_secs_f64());
        let trained_s = self.started.elapsed().as_secs_f64();
        EpochTrained {
            sums,
            seconds: done.seconds + trained_s,
            rank_img_per_s: seen as f64 / trained_s,
            steady_img_per_s,
            sync_seconds: self.sync_seconds,
            collective_seconds: burn_ddp::tensor::collective_seconds() - self.collectives_before,
            steps,
            data_wait_s: phases.seconds(0),
            phases_s: phases.totals(),
            device_decode: Some(crate::data::throughput::DeviceSubmit::between(
                &self.decode_before,
                &burn_ddp::nn::decode::device_decode_times(),
            ))
            .filter(|d| d.batches > 0),
        }
    }
}

/// `--host-profile`'s sampler, started when this is the epoch it covers (the second, or the
/// only one) on the rank that speaks for the run.
fn host_profile_of(
    config: &TrainConfig,
    epoch: usize,
    main_rank: bool,
) -> Result<Option<crate::train::instrument::host_profile::HostProfile>> {
    let profiled_epoch = if config.epochs > 1 { 1 } else { 0 };
    match &config.host_profile {
        Some(dir) if main_rank && epoch == profiled_epoch => {
            Ok(Some(crate::train::instrument::host_profile::HostProfile::start(dir)?))
        }
        _ => Ok(None),
    }
}

/// The batch on the device: images, labels, and — when this step's draws (`key`) mix it
/// (mixup / cutmix) — the mixed images and soft targets.
fn mixed_batch<B: AutodiffBackend>(
    batch: crate::data::loader::Batch,
    config: &TrainConfig,
    key: u64,
    classes: usize,
    device: &B::Device,
) -> Result<StepBatch<B>> {
    let Some(mix) = config.mixup.draw(key, (batch.shape[2], batch.shape[3])) else {
        let (x, y) = batch_tensors::<B>(batch, device)?;
        return Ok((x, y, None));
    };
    let targets = super::mixup::soft_targets(&batch.labels, classes, mix.lam, config.label_smoothing);
    let n = batch.shape[0];
    let (x, y) = batch_tensors::<B>(batch, device)?;
    Ok((super::mixup::mix_images(x, &mix), y, Some(Tensor::from_data(TensorData::new(targets, [n, classes]), device))))
}

/// Images, labels, and soft targets when the batch is mixed.
type StepBatch<B> = (Tensor<B, 4>, Tensor<B, 1, Int>, Option<Tensor<B, 2>>);

/// The epoch so far, summed over the ranks (a collective: every rank calls it at the same
/// step): what was `done` before this invocation plus `steps` steps and `seen` samples since
/// `started`, whose loss and hit sums are on the device.
fn epoch_so_far<B: AutodiffBackend>(
    done: PartialEpoch,
    (steps, seen, started): (usize, usize, Instant),
    (loss_sum, correct): (&Tensor<B::InnerBackend, 1>, &Tensor<B::InnerBackend, 1, Int>),
    dist: Dist<'_>,
) -> Result<PartialEpoch> {
    let mut sums =
        [loss_sum.clone().into_scalar().elem::<f64>(), correct.clone().into_scalar().elem::<i64>() as f64, seen as f64];
    if let Some(d) = dist {
        d.sum(&mut sums)?;
    }
    sums.iter_mut().zip(done.sums).for_each(|(s, d)| *s += d);
    Ok(PartialEpoch { steps: done.steps + steps, sums, seconds: done.seconds + started.elapsed().as_secs_f64() })
}

/// Forward and backward of one batch, on one device or split over DataParallel's; as a DDP
/// rank, the gradients come back averaged over the ranks (all-reduced while backward runs).
fn step_gradients<B: AutodiffBackend, O>(
    trainer: &mut Trainer<B, O>,
    at: &Placement<'_, B>,
    (x, y, soft): StepBatch<B>,
    phases: &mut StepPhases<B>,
) -> Result<StepOut<B>> {
    let n = x.dims()[0];
    let loss_scale = trainer.scaler.as_ref().map_or(1.0, GradScaler::scale);
    let smoothing = trainer.label_smoothing;
    let Some(dp) = &at.dp else {
        let ddp_step = at.dist.map(|d| d.ddp.step(&trainer.model)).transpose()?;
        let logits = trainer.model.forward(x);
        let loss = match soft {
            Some(t) => soft_cross_entropy(logits.clone(), t),
            None => cross_entropy(logits.clone(), y.clone(), smoothing),
        };
        let loss_sum = loss.clone().inner().mul_scalar(n as f64);
        let correct = logits.inner().argmax(1).reshape([n]).equal(y.inner()).int().sum();
        phases.end(2);
        let loss = loss.mul_scalar(loss_scale);
        let grads = match ddp_step {
            Some(s) => s.backward(loss, &trainer.model)?,
            None => GradientsParams::from_grads(loss.backward(), &trainer.model),
        };
        return Ok(StepOut { grads, loss_sum, correct });
    };
    let (xs, ys, ts) = (dp.scatter(x), dp.scatter(y), soft.map(|t| dp.scatter(t)));
    let model = trainer.model.clone();
    let out = dp.step(model, n, |replica: Classifier<B>, i, _dev| {
        let (x, y) = (xs[i].clone(), ys[i].clone());
        let k = x.dims()[0];
        let logits = replica.forward(x);
        let hits: i64 =
            logits.clone().inner().argmax(1).reshape([k]).equal(y.clone().inner()).int().sum().into_scalar().elem();
        let loss = match &ts {
            Some(ts) => soft_cross_entropy(logits, ts[i].clone()),
            None => cross_entropy(logits, y, smoothing),
        };
        (loss.mul_scalar(loss_scale), hits)
    });
    trainer.model = out.model;
    let device = &at.device;
    let loss_sum = Tensor::<B::InnerBackend, 1>::from_floats([(out.loss / loss_scale * n as f64) as f32], device);
    let correct = Tensor::<B::InnerBackend, 1, Int>::from_ints([out.outputs.iter().sum::<i64>()], device);
    Ok(StepOut { grads: out.grads, loss_sum, correct })
}

/// Unscales the gradients (f16; every rank alike, after DDP averaged them), clips their global
/// norm when asked, and steps the optimizer; a step whose scaled gradients overflowed is skipped.
fn apply_step<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
    trainer: &mut Trainer<B, O>,
    grads: GradientsParams,
    schedule: &CosineSchedule,
    phases: &mut StepPhases<B>,
) {
    phases.end(4);
    let grads = match &mut trainer.scaler {
        Some(s) => s.unscale(&trainer.model, grads),
        None => Some(grads),
    };
    let grads = match (grads, trainer.clip_grad_norm) {
        (Some(g), Some(max_norm)) => Some(super::grad_clip::clip_global_norm(&trainer.model, g, max_norm).0),
        (grads, _) => grads,
    };
    if let Some(grads) = grads {
        let model = trainer.model.clone();
        trainer.model = trainer.lr_groups.step(&mut trainer.optim, schedule.lr(trainer.step), model, grads);
    }
    phases.end(5);
    trainer.step += 1;
}

/// Validation tallies over every sample of the validation split exactly once across the
/// ranks, summed over them, and the count of images skipped so far (all ranks).
pub(super) fn validate<B: AutodiffBackend>(
    model: &Classifier<B>,
    plan: &EpochPlan,
    eval_pipeline: &crate::data::transform::Pipeline,
    skips: &Arc<SkipLog>,
    at: &Placement<'_, B>,
) -> Result<(Tally, usize)> {
    let mine: Vec<usize> = match at.dist {
        None => plan.val_idx.clone(),
        Some(d) => shard_exact(plan.val_idx.len(), d.world, d.rank).into_iter().map(|i| plan.val_idx[i]).collect(),
    };
    at.release_unused();
    let val = evaluate(
        &model.valid(),
        plan.dataset.clone(),
        mine,
        eval_pipeline.clone(),
        plan.loader.clone(),
        skips.clone(),
        &at.device,
    );
    at.release_unused();
    let val = val?;
    let Some(d) = at.dist else { return Ok((val, skips.count())) };
    let mut v = [val.loss_sum, val.top1 as f64, val.top5 as f64, val.count as f64, skips.count() as f64];
    d.sum(&mut v)?;
    Ok((Tally { loss_sum: v[0], top1: v[1] as usize, top5: v[2] as usize, count: v[3] as usize }, v[4] as usize))
}
