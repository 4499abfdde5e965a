//! `burn-vision bench`'s settings: the model, batch and input, the optimizer, and whether the
//! steps go through DistributedDataParallel.

use crate::train::config::{
    DeviceSpec, OptimizerKind, default_bucket_cap_mb, parse_bucket_cap_mb, parse_grad_compression,
};
use burn_ddp::GradCompression;
use burn_ddp::nn::Precision;

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
