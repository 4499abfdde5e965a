//! `TrainConfig`: everything a training run needs, built by the CLI or by library users.

use crate::data::source::DataSource;
use crate::error::{Error, Result};
use burn_ddp::GradCompression;
use burn_ddp::nn::Precision;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The optimiser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with (PyTorch-style, undampened) momentum and L2 weight decay.
    Sgd,
    /// AdamW with decoupled weight decay.
    Adamw,
}

/// Where the model runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceSpec {
    /// Burn's flex CPU backend.
    Cpu,
    /// burn-cuda on these GPU ordinals.
    Cuda(Vec<usize>),
}

impl DeviceSpec {
    /// Parses `--gpus` (`0`, `0,1,3`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an empty list, a non-number or a duplicate id.
    pub fn parse_gpus(list: &str) -> Result<Self> {
        let bad = |reason: String| Error::InvalidConfig { name: "--gpus", value: list.to_string(), reason };
        let mut ids = Vec::new();
        for part in list.split(',').map(str::trim) {
            let id: usize =
                part.parse().map_err(|_| bad(format!("`{part}` is not a GPU number; use e.g. --gpus 0,1")))?;
            if ids.contains(&id) {
                return Err(bad(format!("GPU {id} is listed twice")));
            }
            ids.push(id);
        }
        if ids.is_empty() {
            return Err(bad("no GPU listed".into()));
        }
        Ok(DeviceSpec::Cuda(ids))
    }

    /// Number of devices (ranks) this spec trains on.
    pub fn world_size(&self) -> usize {
        match self {
            DeviceSpec::Cpu => 1,
            DeviceSpec::Cuda(ids) => ids.len(),
        }
    }
}

/// A complete training run description. Serialised into every checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// `bundled`, `fashion-mnist` or a class-folder path.
    pub data: String,
    /// Registry name of the model.
    pub model: String,
    /// Epochs to train in total (a resumed run continues up to this).
    pub epochs: usize,
    /// Images per batch per device.
    pub batch_size: usize,
    /// Peak learning rate for one device; scaled linearly by the number of devices.
    pub lr: f64,
    /// The optimiser.
    pub optimizer: OptimizerKind,
    /// SGD momentum.
    pub momentum: f64,
    /// Weight decay (L2 for SGD, decoupled for AdamW).
    pub weight_decay: f64,
    /// Epochs of linear warm-up.
    pub warmup_epochs: usize,
    /// Final LR over peak LR of the cosine schedule.
    pub min_lr_factor: f64,
    /// Label smoothing in [0, 1).
    pub label_smoothing: f64,
    /// Validation fraction per class.
    pub val_fraction: f64,
    /// Seed of the split, the initialisation, the shuffles and the augmentation.
    pub seed: u64,
    /// Run folder: checkpoints and metrics.
    pub out: PathBuf,
    /// Continue from `out/last.ckpt`.
    pub resume: bool,
    /// Devices.
    pub device: DeviceSpec,
    /// Processes for CPU training (one per device for CUDA).
    pub nproc: usize,
    /// Model input side for folder datasets.
    pub image_size: u32,
    /// Use the 3×3 stem without max-pool.
    pub small_input: bool,
    /// Fail on unreadable images instead of skipping them.
    pub strict_images: bool,
    /// Batches decoded ahead of the training loop.
    pub prefetch: usize,
    /// Stop each epoch after this many steps (quick runs, benchmarks).
    pub max_steps_per_epoch: Option<usize>,
    /// End this invocation after this many epochs, keeping the schedule of `epochs`; the run
    /// continues later with `resume` (time-boxed or preemptible jobs).
    pub stop_after_epochs: Option<usize>,
    /// Draw a progress bar.
    pub show_progress: bool,
    /// How several devices train together.
    #[serde(default)]
    pub strategy: Strategy,
    /// BatchNorm statistics over the global batch of all ranks (DDP only).
    #[serde(default)]
    pub sync_bn: bool,
    /// The type DDP's gradient all-reduce sends: f32, or bf16 / fp16 (half the bytes;
    /// parameters and optimizer state stay f32: PyTorch's `bf16_compress_hook`).
    #[serde(default)]
    pub grad_compression: GradCompression,
    /// Activation precision (autocast); parameters and optimizer state stay f32.
    #[serde(default)]
    pub precision: Precision,
    /// Channels-last activations (`[n, h, w, c]`): `None` picks them on CUDA devices (where
    /// they are faster on every model measured, docs/benchmarks.md) and NCHW on the CPU.
    #[serde(default)]
    pub channels_last: Option<bool>,
    /// The job's number of ranks when an outside launcher (torchrun, srun, mpirun, `burn-ddp
    /// launch --nnodes N`) set it: it wins over `nproc` / the local `--gpus` list for the
    /// learning-rate scaling and the log. Set by `train` from the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world: Option<usize>,
    /// PyTorch weights (torchvision / timm `.pth`, `.pt`, `.safetensors`) loaded before the
    /// first step; the head is re-initialised when the file has another class count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretrained: Option<PathBuf>,
    /// Train only the classifier head: every other parameter keeps its value (BatchNorm
    /// running statistics still follow the data, as in PyTorch's train mode).
    #[serde(default)]
    pub freeze_layers: bool,
    /// The backbone's learning rate over the head's (PyTorch's two parameter groups); 1 trains
    /// everything at one rate.
    #[serde(default = "one")]
    pub backbone_lr_scale: f64,
    /// Clip the gradients to this global L2 norm (all parameters as one vector, after DDP's
    /// all-reduce: PyTorch's `clip_grad_norm_`, timm's `--clip-grad`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    /// Also write `last.ckpt` every this many optimisation steps inside an epoch (with the
    /// position in the epoch's sample order and the epoch's tallies so far), so a crash or a
    /// restart redoes at most this many steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<usize>,
    /// Steps `[A, B)` (counted from 0 over the run) that rank 0 records as a Chrome / Perfetto
    /// trace in `out/trace.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_steps: Option<[usize; 2]>,
    /// Seconds a rendezvous or collective may take before this rank gives up (a dead or stuck
    /// peer); `None`: `BURN_DDP_TIMEOUT_S`, else 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Training augmentation (flip, crop ranges, colour jitter, random erasing).
    #[serde(default)]
    pub augment: crate::data::augment::Augment,
    /// Mixup / CutMix of training batches (off by default).
    #[serde(default)]
    pub mixup: super::mixup::MixupConfig,
    /// Stochastic depth of the deepest block (ViTs; timm's `--drop-path`); 0 is off.
    #[serde(default)]
    pub drop_path: f64,
}

fn one() -> f64 {
    1.0
}

/// How several devices share the training.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// DistributedDataParallel: one process per device, gradients averaged by all-reduce.
    #[default]
    Ddp,
    /// DataParallel: one process, a thread per device, gradients reduced onto the first device.
    Dp,
}

impl std::str::FromStr for Strategy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ddp" => Ok(Strategy::Ddp),
            "dp" => Ok(Strategy::Dp),
            other => Err(Error::InvalidConfig {
                name: "--strategy",
                value: other.into(),
                reason: "use ddp (one process per device) or dp (one process, a thread per device)".into(),
            }),
        }
    }
}

impl Default for TrainConfig {
    /// The embedded default: CPU, bundled Fashion-MNIST subset, ResNet-10-mini.
    fn default() -> Self {
        Self {
            data: "bundled".into(),
            model: "resnet10-mini".into(),
            epochs: 3,
            batch_size: 64,
            lr: 2e-3,
            optimizer: OptimizerKind::Adamw,
            momentum: 0.9,
            weight_decay: 5e-4,
            warmup_epochs: 0,
            min_lr_factor: 0.1,
            label_smoothing: 0.0,
            val_fraction: 0.2,
            seed: 0,
            out: PathBuf::from("runs/default"),
            resume: false,
            device: DeviceSpec::Cpu,
            nproc: 1,
            image_size: 224,
            small_input: true,
            strict_images: false,
            prefetch: 4,
            max_steps_per_epoch: None,
            stop_after_epochs: None,
            show_progress: true,
            strategy: Strategy::Ddp,
            sync_bn: false,
            grad_compression: GradCompression::None,
            precision: Precision::F32,
            channels_last: None,
            world: None,
            pretrained: None,
            freeze_layers: false,
            backbone_lr_scale: 1.0,
            clip_grad_norm: None,
            checkpoint_every: None,
            profile_steps: None,
            timeout_s: None,
            augment: crate::data::augment::Augment::default(),
            mixup: super::mixup::MixupConfig::default(),
            drop_path: 0.0,
        }
    }
}

/// `--grad-compression`: `none` (f32; also `f32`), `bf16`, or `fp16` (also `f16`).
///
/// # Errors
/// [`Error::InvalidConfig`] for anything else.
pub fn parse_grad_compression(value: &str) -> Result<GradCompression> {
    match value.to_ascii_lowercase().as_str() {
        "none" | "f32" | "fp32" => Ok(GradCompression::None),
        "bf16" => Ok(GradCompression::Bf16),
        "fp16" | "f16" => Ok(GradCompression::Fp16),
        _ => Err(Error::InvalidConfig {
            name: "--grad-compression",
            value: value.into(),
            reason: "use none (f32), bf16 or fp16".into(),
        }),
    }
}

impl TrainConfig {
    /// Whether the model keeps its activations channels-last: as set, else on CUDA devices.
    pub fn channels_last_on(&self) -> bool {
        self.channels_last.unwrap_or(matches!(self.device, DeviceSpec::Cuda(_)))
    }

    /// The seed tutorial's recipe: ResNet-34, batch 16 per GPU, SGD momentum 0.9, weight decay
    /// 0.005, lr 0.001 × world size, cosine to 0.1×, 30 epochs, 20 % validation per class,
    /// seed 0, 224² inputs, SyncBatchNorm across ranks.
    pub fn tutorial() -> Self {
        Self {
            model: "resnet34".into(),
            epochs: 30,
            batch_size: 16,
            lr: 1e-3,
            optimizer: OptimizerKind::Sgd,
            momentum: 0.9,
            weight_decay: 5e-3,
            min_lr_factor: 0.1,
            small_input: false,
            sync_bn: true,
            ..Self::default()
        }
    }

    /// A Vision Transformer fine-tuning recipe after DeiT / timm's: ViT-S/16, AdamW (lr 5e-4 per
    /// device for batch 64, weight decay 0.05), 5 warm-up epochs then cosine to 1 %, label
    /// smoothing 0.1, gradient clipping at global norm 1, RandAugment 2 operations at magnitude
    /// 9, colour jitter 0.4, random erasing 0.25, mixup α 0.8 / cutmix α 1.0 (switch 0.5),
    /// stochastic depth 0.1, 30 epochs at 224².
    pub fn vit() -> Self {
        Self {
            model: "vit_s16".into(),
            epochs: 30,
            batch_size: 64,
            lr: 5e-4,
            optimizer: OptimizerKind::Adamw,
            weight_decay: 0.05,
            warmup_epochs: 5,
            min_lr_factor: 0.01,
            label_smoothing: 0.1,
            small_input: false,
            clip_grad_norm: Some(1.0),
            augment: crate::data::augment::Augment {
                color_jitter: 0.4,
                random_erasing: 0.25,
                rand_augment_ops: 2,
                rand_augment_magnitude: 9,
                ..crate::data::augment::Augment::default()
            },
            mixup: super::mixup::MixupConfig { mixup_alpha: 0.8, cutmix_alpha: 1.0, ..Default::default() },
            drop_path: 0.1,
            ..Self::default()
        }
    }

    /// The data source this config names.
    pub fn source(&self) -> DataSource {
        self.data.parse().expect("infallible")
    }

    /// Checks ranges, with one message per problem.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |name, value: String, reason: &str| Err(Error::InvalidConfig { name, value, reason: reason.into() });
        if self.epochs == 0 {
            return bad("--epochs", "0".into(), "train at least one epoch");
        }
        if self.batch_size == 0 {
            return bad("--batch-size", "0".into(), "use at least 1");
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad("--lr", self.lr.to_string(), "must be a positive number");
        }
        if !(0.0..1.0).contains(&self.val_fraction) {
            return bad("--val-fraction", self.val_fraction.to_string(), "must be in [0, 1)");
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return bad("--label-smoothing", self.label_smoothing.to_string(), "must be in [0, 1)");
        }
        if !(0.0..=1.0).contains(&self.min_lr_factor) {
            return bad("--min-lr-factor", self.min_lr_factor.to_string(), "must be in [0, 1]");
        }
        if self.weight_decay < 0.0 || !(0.0..1.0).contains(&self.momentum) {
            return bad(
                "--weight-decay/--momentum",
                format!("{}/{}", self.weight_decay, self.momentum),
                "need weight decay ≥ 0 and momentum in [0, 1)",
            );
        }
        if self.nproc == 0 {
            return bad("--nproc", "0".into(), "use at least 1");
        }
        if self.sync_bn && self.strategy == Strategy::Dp {
            return bad(
                "--sync-bn",
                "with --strategy dp".into(),
                "SyncBatchNorm synchronises DDP ranks; use --strategy ddp, or drop --sync-bn",
            );
        }
        if !(self.backbone_lr_scale >= 0.0 && self.backbone_lr_scale.is_finite()) {
            return bad(
                "--backbone-lr-scale",
                self.backbone_lr_scale.to_string(),
                "must be a number ≥ 0 (1 = the head's rate)",
            );
        }
        if let Some(c) = self.clip_grad_norm.filter(|c| !(*c > 0.0 && c.is_finite())) {
            return bad("--clip-grad-norm", c.to_string(), "must be a positive number");
        }
        if self.freeze_layers && self.backbone_lr_scale != 1.0 {
            return bad(
                "--backbone-lr-scale",
                self.backbone_lr_scale.to_string(),
                "with --freeze-layers the backbone does not train; drop one of them",
            );
        }
        if let Some(t) = self.timeout_s.filter(|t| !(*t > 0.0 && t.is_finite())) {
            return bad("--timeout-s", t.to_string(), "give a positive number of seconds");
        }
        if self.checkpoint_every == Some(0) {
            return bad(
                "--checkpoint-every",
                "0".into(),
                "use at least 1 step, or drop the flag for checkpoints at epoch ends only",
            );
        }
        self.augment.validate()?;
        self.mixup.validate()?;
        if !(0.0..1.0).contains(&self.drop_path) {
            return bad("--drop-path", self.drop_path.to_string(), "must be in [0, 1)");
        }
        if self.image_size < 8 {
            return bad("--image-size", self.image_size.to_string(), "must be at least 8");
        }
        Ok(())
    }

    /// Processes to start: one per device with DDP, one in all with DataParallel.
    pub fn processes(&self) -> usize {
        match self.strategy {
            Strategy::Ddp => self.world_size(),
            Strategy::Dp => 1,
        }
    }

    /// Devices that train together: the launcher's world when one set it, else `--nproc` on
    /// the CPU, one per listed GPU.
    pub fn world_size(&self) -> usize {
        if let Some(w) = self.world {
            return w;
        }
        match self.device {
            DeviceSpec::Cpu => self.nproc,
            DeviceSpec::Cuda(ref ids) => ids.len(),
        }
    }

    /// Learning rate after linear scaling by the number of processes.
    pub fn scaled_lr(&self) -> f64 {
        self.lr * self.world_size() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_lists_parse_and_reject() {
        assert_eq!(DeviceSpec::parse_gpus("0,1, 3").unwrap(), DeviceSpec::Cuda(vec![0, 1, 3]));
        assert!(DeviceSpec::parse_gpus("0,x").unwrap_err().to_string().contains("`x` is not a GPU number"));
        assert!(DeviceSpec::parse_gpus("1,1").unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn layout_defaults_to_channels_last_on_gpus_only() {
        let cpu = TrainConfig::default();
        assert!(!cpu.channels_last_on(), "the CPU default is NCHW");
        let gpu = TrainConfig { device: DeviceSpec::Cuda(vec![0]), ..TrainConfig::default() };
        assert!(gpu.channels_last_on(), "GPUs default to channels-last");
        assert!(!TrainConfig { channels_last: Some(false), ..gpu.clone() }.channels_last_on());
        assert!(TrainConfig { channels_last: Some(true), ..cpu }.channels_last_on());
        // Checkpoints written before the setting was optional (a plain bool) still read.
        let mut old = serde_json::to_value(TrainConfig::default()).unwrap();
        old["channels_last"] = serde_json::Value::Bool(true);
        let old: TrainConfig = serde_json::from_value(old).unwrap();
        assert_eq!(old.channels_last, Some(true));
    }

    #[test]
    fn validation_names_the_setting() {
        let c = TrainConfig { batch_size: 0, ..TrainConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("--batch-size"));
        assert!(TrainConfig::default().validate().is_ok());
        let t = TrainConfig { device: DeviceSpec::Cuda(vec![0, 1, 2, 3]), ..TrainConfig::tutorial() };
        assert!((t.scaled_lr() - 0.004).abs() < 1e-12);
        let v = TrainConfig::vit();
        assert!(v.validate().is_ok() && v.clip_grad_norm == Some(1.0) && v.augment.random_erasing == 0.25);
    }
}
