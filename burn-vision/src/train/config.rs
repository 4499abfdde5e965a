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

    /// Parses the `--gpus` of a one-device command (eval, predict, bench): one GPU number.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for what [`DeviceSpec::parse_gpus`] refuses, and for a list of
    /// more than one GPU.
    pub fn parse_one_gpu(list: &str) -> Result<usize> {
        match Self::parse_gpus(list)? {
            DeviceSpec::Cuda(ids) if ids.len() == 1 => Ok(ids[0]),
            _ => Err(Error::InvalidConfig {
                name: "--gpus",
                value: list.into(),
                reason: "this command runs on one GPU: give one number, e.g. --gpus 0 (several GPUs: train, or bench under `burn-ddp launch`)".into(),
            }),
        }
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
///
/// Its fields are also `burn-vision train`'s flags (each declared here once, with its help as
/// the doc comment): the command line starts from [`TrainConfig::default`] or a preset and
/// overrides only the flags given (`cli::TrainArgs`). No field has a clap default, so
/// a flag left out never overwrites the preset's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct TrainConfig {
    /// `bundled`, `fashion-mnist`, a folder with one sub-folder of images per class, or
    /// WebDataset tar shards (`DIR/shard-{000000..000099}.tar`, a folder of .tar files).
    #[arg(long, required = false)]
    pub data: String,
    /// Model name (see `burn-vision models`).
    #[arg(long, required = false)]
    pub model: String,
    /// Epochs to train in total (a resumed run continues up to this).
    #[arg(long, required = false)]
    pub epochs: usize,
    /// Images per batch per device.
    #[arg(long, required = false)]
    pub batch_size: usize,
    /// Peak learning rate for one device (multiplied by the number of devices).
    #[arg(long, required = false)]
    pub lr: f64,
    /// The optimiser.
    #[arg(long, value_enum, required = false)]
    pub optimizer: OptimizerKind,
    /// SGD momentum.
    #[arg(long, required = false)]
    pub momentum: f64,
    /// Weight decay (L2 for SGD, decoupled for AdamW).
    #[arg(long, required = false)]
    pub weight_decay: f64,
    /// Epochs of linear warm-up.
    #[arg(long, required = false)]
    pub warmup_epochs: usize,
    /// Final over peak learning rate of the cosine schedule.
    #[arg(long, required = false)]
    pub min_lr_factor: f64,
    /// Label smoothing in [0, 1).
    #[arg(long, required = false)]
    pub label_smoothing: f64,
    /// Fraction of each class held out for validation.
    #[arg(long, required = false)]
    pub val_fraction: f64,
    /// Seed of the split, the initialisation, the shuffles and the augmentation.
    #[arg(long, required = false)]
    pub seed: u64,
    /// Run folder: checkpoints and metrics.jsonl.
    #[arg(long, required = false)]
    pub out: PathBuf,
    /// Continue the run in --out from its last checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// CUDA GPUs to train on, e.g. `0,1` (CUDA is in the default build; not in one built with
    /// `--no-default-features`); the CPU when absent.
    #[arg(long = "gpus", value_name = "IDS", value_parser = DeviceSpec::parse_gpus, required = false)]
    pub device: DeviceSpec,
    /// CPU processes training together (DDP over TCP), e.g. `--nproc 2 --cpu`; with
    /// `--strategy dp`, CPU worker threads of one process. GPUs run one process each.
    #[arg(long, conflicts_with = "device", required = false)]
    pub nproc: usize,
    /// Input side for folder datasets.
    #[arg(long, required = false)]
    pub image_size: u32,
    /// Use the 3×3 stem without max-pool (for 28–64 px images).
    #[arg(skip)]
    pub small_input: bool,
    /// Stop on the first unreadable image instead of skipping it.
    #[arg(long)]
    pub strict_images: bool,
    /// Batches decoded ahead of the training loop.
    #[arg(long, required = false)]
    pub prefetch: usize,
    /// Where JPEGs are decoded: `gpu` (nvJPEG, with crop, resize, flip, RandAugment, colour
    /// jitter, random erasing and normalise on the GPU), `cpu`, or `auto` (the GPU when the
    /// model trains on one with a hardware JPEG decoder and the transforms are those).
    #[serde(default)]
    #[arg(long, value_enum, default_value_t)]
    pub decode: crate::data::decode::Decode,
    /// Tar-shard data: the shuffle buffer, in samples, that mixes each rank's run of shards
    /// (WebDataset's `shuffle(n)`; reads stay within that window); 0 trains in reading order.
    #[serde(default = "default_shuffle_buffer")]
    #[arg(long, required = false)]
    pub shuffle_buffer: usize,
    /// Stop every epoch after this many steps (quick runs, benchmarks).
    #[arg(long)]
    pub max_steps_per_epoch: Option<usize>,
    /// End after this many epochs, keeping the schedule of --epochs; continue later with
    /// --resume (time-boxed or preemptible jobs).
    #[arg(long)]
    pub stop_after_epochs: Option<usize>,
    /// Draw a progress bar.
    #[arg(skip = true)]
    pub show_progress: bool,
    /// How several devices train together: `ddp` (one process per device, all-reduce; the
    /// default) or `dp` (DataParallel: one process, a thread per device).
    #[serde(default)]
    #[arg(long, required = false)]
    pub strategy: Strategy,
    /// BatchNorm statistics over the global batch of all ranks (DDP only).
    #[serde(default)]
    #[arg(skip)]
    pub sync_bn: bool,
    /// The type DDP's gradient all-reduce sends: `none` (f32, the default), `bf16` or `fp16`
    /// (half the bytes across the wire; parameters and optimizer state stay f32: PyTorch's
    /// `bf16_compress_hook`).
    #[serde(default)]
    #[arg(long, value_name = "TYPE", value_parser = parse_grad_compression, required = false)]
    pub grad_compression: GradCompression,
    /// DDP's largest gradient bucket, in MiB (PyTorch's `bucket_cap_mb`; 25 by default): larger
    /// buckets mean fewer collectives and less host work a step, smaller ones start earlier in
    /// backward.
    #[serde(default = "default_bucket_cap_mb")]
    #[arg(long, value_name = "MIB", value_parser = parse_bucket_cap_mb, required = false)]
    pub bucket_cap_mb: f64,
    /// Activation precision: `f32` (the default), `bf16` or `f16` (PyTorch's autocast:
    /// parameters, optimizer and BatchNorm statistics stay f32; f16 adds dynamic loss scaling,
    /// PyTorch's GradScaler).
    #[serde(default)]
    #[arg(long, required = false)]
    pub precision: Precision,
    /// Channels-last activations (`[n, h, w, c]`): `None` picks them on CUDA devices (where
    /// they are faster on every model measured, docs/benchmarks.md) and NCHW on the CPU.
    #[serde(default)]
    #[arg(skip)]
    pub channels_last: Option<bool>,
    /// The job's number of ranks when an outside launcher (torchrun, srun, mpirun, `burn-ddp
    /// launch --nnodes N`) set it: it wins over `nproc` / the local `--gpus` list for the
    /// learning-rate scaling and the log. Set by `train` from the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(skip)]
    pub world: Option<usize>,
    /// Start from PyTorch weights: a torchvision / timm state dict (.pth, .pt, .safetensors;
    /// `state_dict`/`model` wrappers and DDP's `module.` prefix are found). The classifier head
    /// is re-initialised when the class count differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub pretrained: Option<PathBuf>,
    /// Train only the classifier head (the tutorial's option for fine-tuning): every other
    /// parameter keeps its value (BatchNorm running statistics still follow the data, as in
    /// PyTorch's train mode).
    #[serde(default)]
    #[arg(long)]
    pub freeze_layers: bool,
    /// The backbone's learning rate as a fraction of the head's, e.g. 0.1 (PyTorch's two
    /// parameter groups); 1 trains everything at one rate.
    #[serde(default = "one")]
    #[arg(long, required = false)]
    pub backbone_lr_scale: f64,
    /// Clip the gradients to this global L2 norm, e.g. 1.0 (all parameters as one vector,
    /// after DDP's all-reduce: PyTorch's `clip_grad_norm_`, timm's `--clip-grad`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub clip_grad_norm: Option<f64>,
    /// Also save last.ckpt every N optimisation steps inside an epoch, so a crash redoes at
    /// most N steps (a resumed run continues from that step exactly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<usize>,
    /// Record steps A..B−1 (counted from 0) as a Chrome / Perfetto trace in OUT/trace.json
    /// (rank 0): spans per step, phase and DDP bucket all-reduce; open it in ui.perfetto.dev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_name = "A..B", value_parser = crate::train::instrument::trace::parse_steps)]
    pub profile_steps: Option<[usize; 2]>,
    /// Sample every host thread over the second epoch's steady steps (the first epoch's with
    /// one epoch) and write a flame graph and a summary of where their time went into this
    /// folder (rank 0; a binary built with `--features host-profile`): `bench --host-profile`
    /// for a real training loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_name = "DIR")]
    pub host_profile: Option<PathBuf>,
    /// Seconds a rendezvous or collective may wait for the other ranks before this rank stops
    /// with an error (a dead or stuck rank); default: BURN_DDP_TIMEOUT_S, else 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_name = "S")]
    pub timeout_s: Option<f64>,
    /// Training augmentation (flip, crop ranges, colour jitter, RandAugment, random erasing).
    #[serde(default)]
    #[command(flatten)]
    pub augment: crate::data::augment::Augment,
    /// Mixup / CutMix of training batches (off by default).
    #[serde(default)]
    #[command(flatten)]
    pub mixup: super::mixup::MixupConfig,
    /// Stochastic depth: the deepest block's residual branches are skipped per sample with
    /// this probability, earlier ones linearly less (ViTs; timm's --drop-path; default 0,
    /// --preset vit 0.1).
    #[serde(default)]
    #[arg(long, value_name = "RATE", required = false)]
    pub drop_path: f64,
}

fn one() -> f64 {
    1.0
}

fn default_shuffle_buffer() -> usize {
    burn_ddp::shard_sampler::DEFAULT_SHUFFLE_BUFFER
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
            decode: Default::default(),
            prefetch: 4,
            shuffle_buffer: default_shuffle_buffer(),
            max_steps_per_epoch: None,
            stop_after_epochs: None,
            show_progress: true,
            strategy: Strategy::Ddp,
            sync_bn: false,
            grad_compression: GradCompression::None,
            bucket_cap_mb: default_bucket_cap_mb(),
            precision: Precision::F32,
            channels_last: None,
            world: None,
            pretrained: None,
            freeze_layers: false,
            backbone_lr_scale: 1.0,
            clip_grad_norm: None,
            checkpoint_every: None,
            profile_steps: None,
            host_profile: None,
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

/// DDP's default bucket size (PyTorch's: 25 MiB), in MiB.
pub fn default_bucket_cap_mb() -> f64 {
    burn_ddp::DdpConfig::default().bucket_bytes as f64 / (1 << 20) as f64
}

/// `--bucket-cap-mb`: a positive number of MiB (fractions allowed, as PyTorch's `bucket_cap_mb`).
///
/// # Errors
/// [`Error::InvalidConfig`] for anything else.
pub fn parse_bucket_cap_mb(value: &str) -> Result<f64> {
    match value.trim().parse::<f64>() {
        Ok(mib) if mib.is_finite() && mib > 0.0 && mib <= 1e6 => Ok(mib),
        _ => Err(Error::InvalidConfig {
            name: "--bucket-cap-mb",
            value: value.into(),
            reason: "give the largest gradient bucket in MiB, a number above 0 (PyTorch's default: 25)".into(),
        }),
    }
}

/// The DDP settings a run's flags ask for: `overlap` (buckets start during backward), the
/// gradients' wire type and the bucket size in MiB.
pub fn ddp_config(overlap: bool, compression: GradCompression, bucket_cap_mb: f64) -> burn_ddp::DdpConfig {
    burn_ddp::DdpConfig {
        overlap,
        compression,
        bucket_bytes: (bucket_cap_mb * (1 << 20) as f64).round().max(1.0) as usize,
        ..burn_ddp::DdpConfig::default()
    }
}

impl TrainConfig {
    /// Whether the model keeps its activations channels-last: as set, else on CUDA devices.
    pub fn channels_last_on(&self) -> bool {
        self.channels_last.unwrap_or(matches!(self.device, DeviceSpec::Cuda(_)))
    }

    /// The recipe `--preset NAME` starts from: `tutorial` ([`TrainConfig::tutorial`]) or `vit`
    /// ([`TrainConfig::vit`]).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another name.
    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "tutorial" => Ok(Self::tutorial()),
            "vit" => Ok(Self::vit()),
            other => Err(Error::InvalidConfig {
                name: "--preset",
                value: other.into(),
                reason: "no such preset; available: tutorial, vit".into(),
            }),
        }
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
        if let Some(dir) = self.host_profile.as_ref().filter(|_| !cfg!(feature = "host-profile")) {
            return bad(
                "--host-profile",
                dir.display().to_string(),
                "this binary was built without the profiler; rebuild with `cargo build --release -p burn-vision --features host-profile`",
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
    fn bucket_sizes_parse_and_reach_ddp() {
        assert_eq!(parse_bucket_cap_mb("0.5").unwrap(), 0.5);
        for bad in ["0", "-3", "x", "inf", "NaN"] {
            let e = parse_bucket_cap_mb(bad).unwrap_err().to_string();
            assert!(e.contains("--bucket-cap-mb") && e.contains("MiB"), "{bad}: {e}");
        }
        let d = ddp_config(false, GradCompression::Bf16, default_bucket_cap_mb());
        assert_eq!(d.bucket_bytes, burn_ddp::DdpConfig::default().bucket_bytes);
        assert!(!d.overlap && d.compression == GradCompression::Bf16);
        assert_eq!(ddp_config(true, GradCompression::None, 0.5).bucket_bytes, 1 << 19);
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
        // A run that would only fail after its first epoch is refused before it starts.
        let p = TrainConfig { host_profile: Some("prof".into()), ..TrainConfig::default() };
        if cfg!(feature = "host-profile") {
            assert!(p.validate().is_ok());
        } else {
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains("--host-profile") && e.contains("--features host-profile"), "{e}");
        }
    }
}
