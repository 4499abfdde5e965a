//! The command line's argument types, each flag declared once. Most flags are fields of the
//! library's own settings ([`TrainConfig`], [`BenchConfig`], [`EvalRequest`],
//! [`DataBenchConfig`]), which derive clap's `Args`; the few that are not one field each live
//! here: a preset, switches that set a field either way, and the launcher's restarts.
//!
//! [`BenchConfig`]: crate::train::bench::config::BenchConfig
//! [`EvalRequest`]: crate::train::inference::requests::EvalRequest
//! [`DataBenchConfig`]: crate::data::throughput::DataBenchConfig

use crate::data::augment::Augment;
use crate::data::source::DataSource;
use crate::error::{Error, Result};
use crate::train::bench::config::BenchConfig;
use crate::train::config::{DeviceSpec, TrainConfig};
use clap::{ArgMatches, Args, FromArgMatches};
use std::sync::Arc;

/// `burn-vision train`'s arguments: the run, and how often its own launcher restarts it.
#[derive(Debug, Clone)]
pub struct TrainArgs {
    /// The run: the preset (or the default) with every flag given on top.
    pub config: TrainConfig,
    /// Rounds of restarts after a rank fails, when train starts its own ranks.
    pub max_restarts: usize,
}

/// The train flags that are not one field of [`TrainConfig`].
#[derive(Debug, Args)]
struct TrainFlags {
    /// Start from a named recipe: `tutorial` (ResNet-34, batch 16/GPU, SGD 0.9, wd 0.005,
    /// lr 0.001 × GPUs, cosine to 0.1×, 30 epochs, 224²) or `vit` (ViT-S/16, AdamW 5e-4, wd
    /// 0.05, 5 warm-up epochs, label smoothing 0.1, clip 1.0, colour jitter 0.4, random erasing
    /// 0.25, 30 epochs, 224²); the flags below override it.
    #[arg(long, value_name = "NAME", value_parser = TrainConfig::preset)]
    preset: Option<TrainConfig>,
    /// Train on the CPU (the default).
    #[arg(long, conflicts_with = "device")]
    cpu: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// SyncBatchNorm: BatchNorm statistics over the global batch of all ranks (DDP).
    #[arg(long)]
    sync_bn: bool,
    /// Per-rank BatchNorm statistics even where the preset synchronises them.
    #[arg(long, conflicts_with = "sync_bn")]
    no_sync_bn: bool,
    /// Keep activations channels-last (`[n, h, w, c]`, PyTorch's channels_last): the default
    /// with --gpus (cuDNN's fastest kernels; burn-ddp's own batch-norm kernels).
    #[arg(long)]
    channels_last: bool,
    /// Keep activations NCHW (the default on the CPU; on GPUs slower, see docs/benchmarks.md).
    #[arg(long, conflicts_with = "channels_last")]
    channels_first: bool,
    /// Use the 3×3 stem without max-pool (for 28–64 px images): `true` or `false`; default:
    /// true for the 28² IDX data, false for folders.
    #[arg(long, value_name = "BOOL")]
    small_input: Option<bool>,
    /// RandAugment: N operations per image at magnitude M of 0–30 (torchvision's
    /// RandAugment(N, M); timm's rand-mM-nN), e.g. 2,9; 0 turns it off (default off,
    /// --preset vit 2,9).
    #[arg(long, value_name = "N,M", value_parser = parse_rand_augment)]
    randaugment: Option<(u32, Option<u32>)>,
    /// When train starts its own ranks (--nproc N, --gpus a,b): restart all of them up to N
    /// times after one fails, each round continuing from last.ckpt (under torchrun or
    /// `burn-ddp launch`, pass it to the launcher: train resumes when restarted).
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_restarts: usize,
}

impl TrainFlags {
    /// Sets the fields these flags stand for, over the preset's.
    fn apply(self, c: &mut TrainConfig) {
        c.show_progress = !self.quiet;
        if self.sync_bn || self.no_sync_bn {
            c.sync_bn = self.sync_bn;
        }
        if self.channels_last || self.channels_first {
            c.channels_last = Some(self.channels_last);
        }
        // 28x28 IDX data gets the small-input stem unless told otherwise (`*-mini` models always have it).
        c.small_input =
            self.small_input.unwrap_or(matches!(c.source(), DataSource::Bundled | DataSource::FashionMnist));
        if let Some(given) = self.randaugment {
            set_rand_augment(&mut c.augment, given);
        }
    }
}

impl FromArgMatches for TrainArgs {
    fn from_arg_matches(matches: &ArgMatches) -> std::result::Result<Self, clap::Error> {
        let mut flags = TrainFlags::from_arg_matches(matches)?;
        let mut config = flags.preset.take().unwrap_or_default();
        // Only the flags given: no TrainConfig field has a clap default.
        config.update_from_arg_matches(matches)?;
        let max_restarts = flags.max_restarts;
        flags.apply(&mut config);
        Ok(Self { config, max_restarts })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> std::result::Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for TrainArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        TrainConfig::augment_args(TrainFlags::augment_args(cmd))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// `--randaugment N,M` as given: N operations, and M where given (else the preset's magnitude).
fn set_rand_augment(augment: &mut Augment, (ops, magnitude): (u32, Option<u32>)) {
    augment.rand_augment_ops = ops;
    augment.rand_augment_magnitude = magnitude.unwrap_or(augment.rand_augment_magnitude);
}

/// `--randaugment N,M` (or `0`: off; `N` alone keeps the preset's magnitude).
fn parse_rand_augment(text: &str) -> Result<(u32, Option<u32>)> {
    let bad = || Error::InvalidConfig {
        name: "--randaugment",
        value: text.into(),
        reason: "give N,M: N operations (e.g. 2) at magnitude M of 0–30 (e.g. 9), or 0 for off".into(),
    };
    match text.split_once(',') {
        Some((n, m)) => Ok((n.trim().parse().map_err(|_| bad())?, Some(m.trim().parse().map_err(|_| bad())?))),
        None => Ok((text.trim().parse().map_err(|_| bad())?, None)),
    }
}

/// `burn-vision bench`'s arguments.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[command(flatten)]
    pub config: BenchConfig,
    /// NCHW activations (the default on the CPU).
    #[arg(long, conflicts_with = "channels_last")]
    pub channels_first: bool,
}

impl BenchArgs {
    /// The measurement: channels-last on a GPU unless --channels-first.
    pub fn into_config(self) -> BenchConfig {
        let mut config = self.config;
        config.channels_last |= config.gpu.is_some() && !self.channels_first;
        config
    }
}

/// `burn-vision bench-data`'s arguments.
#[derive(Debug, Args)]
pub struct BenchDataArgs {
    /// `bundled`, `fashion-mnist`, a folder with one sub-folder of images per class, or
    /// WebDataset tar shards (`DIR/shard-{000000..000099}.tar`, a folder of .tar files).
    #[arg(long, default_value = "bundled")]
    pub data: String,
    /// Side of the model input (folder data: RandomResizedCrop / Resize + CenterCrop).
    #[arg(long, default_value_t = 224)]
    pub image_size: u32,
    /// Deliver the batches to this GPU (uploaded as training does) instead of host memory.
    #[arg(long = "gpus", value_name = "ID", value_parser = DeviceSpec::parse_one_gpu)]
    pub gpu: Option<usize>,
    /// What to measure.
    #[command(flatten)]
    pub config: crate::data::throughput::DataBenchConfig,
    /// The training augmentation timed.
    #[command(flatten)]
    pub augment: AugmentArgs,
}

/// The training augmentation `bench-data` times: `train`'s augmentation flags (`--preset`,
/// `--color-jitter`, `--randaugment`, `--random-erasing`, `--hflip`, `--rrc-scale`,
/// `--rrc-ratio`), a preset's values first and the flags given on top, as `train` reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct AugmentArgs(pub Augment);

impl FromArgMatches for AugmentArgs {
    fn from_arg_matches(matches: &ArgMatches) -> std::result::Result<Self, clap::Error> {
        let mut augment = matches.get_one::<TrainConfig>("preset").map_or_else(Augment::default, |c| c.augment);
        // Only the flags given: no Augment field has a clap default.
        augment.update_from_arg_matches(matches)?;
        if let Some(&given) = matches.get_one::<(u32, Option<u32>)>("randaugment") {
            set_rand_augment(&mut augment, given);
        }
        Ok(Self(augment))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> std::result::Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for AugmentArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let preset = clap::Arg::new("preset")
            .long("preset")
            .value_name("NAME")
            .value_parser(TrainConfig::preset)
            .help("Time a recipe's augmentation (`tutorial`, `vit`); the flags below override it");
        let randaugment = clap::Arg::new("randaugment")
            .long("randaugment")
            .value_name("N,M")
            .value_parser(parse_rand_augment)
            .help("RandAugment: N operations per image at magnitude M of 0–30, e.g. 2,9; 0 is off");
        Augment::augment_args(cmd.arg(preset).arg(randaugment))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
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

/// Several processes and not yet launched: starts one per rank (this same command, less
/// `--max-restarts`, which is this launcher's business) and waits; returns the ranks' exit
/// code (0 when every round ended well).
///
/// # Errors
/// An invalid config, a missing GPU, or a launcher that could not start.
pub fn launch_ranks(config: &TrainConfig, max_restarts: usize) -> Result<i32> {
    config.validate()?;
    if let DeviceSpec::Cuda(ids) = &config.device {
        crate::train::check_gpus(ids)?;
    }
    let launch = burn_ddp::launch::LaunchConfig {
        nproc_per_node: config.processes(),
        master_port: 0,
        max_restarts,
        program: without_flag(std::env::args().collect(), "--max-restarts"),
        timeout: config.timeout_s.map(std::time::Duration::from_secs_f64),
        ..Default::default()
    };
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    let _ = ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
    Ok(burn_ddp::launch::launch(&launch, interrupted)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Train {
        #[command(flatten)]
        args: TrainArgs,
    }

    fn parse(line: &str) -> TrainConfig {
        Train::try_parse_from(std::iter::once("train").chain(line.split_whitespace())).unwrap().args.config
    }

    #[test]
    fn a_flag_left_out_keeps_the_presets_value_and_a_flag_given_wins() {
        // The bundled 28² data takes the small-input stem whatever the preset says.
        let tutorial = TrainConfig { show_progress: false, small_input: true, ..TrainConfig::tutorial() };
        assert_eq!(parse("--preset tutorial --quiet"), tutorial);
        let c = parse("--preset tutorial --lr 0.01 --no-sync-bn --mixup 0.2 --rrc-scale 0.3,1");
        assert_eq!((c.lr, c.sync_bn, c.mixup.mixup_alpha, c.augment.scale), (0.01, false, 0.2, [0.3, 1.0]));
        assert_eq!((c.model.as_str(), c.batch_size, c.momentum), ("resnet34", 16, 0.9));
        let vit = parse("--preset vit --randaugment 3 --clip-grad-norm 2");
        assert_eq!((vit.augment.rand_augment_ops, vit.augment.rand_augment_magnitude), (3, 9));
        assert_eq!((vit.clip_grad_norm, vit.mixup.cutmix_alpha, vit.drop_path), (Some(2.0), 1.0, 0.1));
        assert_eq!(parse(""), TrainConfig::default());
    }

    #[test]
    fn bench_data_times_a_presets_augmentation_with_the_flags_given_on_top() {
        #[derive(Parser)]
        struct BenchData {
            #[command(flatten)]
            args: BenchDataArgs,
        }
        let parse = |line: &str| {
            BenchData::try_parse_from(std::iter::once("bench-data").chain(line.split_whitespace()))
                .map(|b| b.args.augment.0)
        };
        assert_eq!(parse("--data photos").unwrap(), Augment::default());
        let vit = parse("--preset vit --random-erasing 0 --randaugment 3").unwrap();
        assert_eq!(vit, Augment { random_erasing: 0.0, rand_augment_ops: 3, ..TrainConfig::vit().augment });
        let jitter = parse("--color-jitter 0.3 --randaugment 2,7 --hflip 0").unwrap();
        assert_eq!((jitter.color_jitter, jitter.rand_augment_ops, jitter.rand_augment_magnitude), (0.3, 2, 7));
        assert_eq!(jitter.hflip, 0.0);
        assert!(parse("--preset imagenet").is_err(), "an unknown preset is refused");
    }

    #[test]
    fn every_field_a_flag_sets_can_be_set() {
        let c = parse(
            "--data fashion-mnist --model resnet18 --epochs 7 --batch-size 8 --lr 0.5 --optimizer sgd \
             --momentum 0.8 --weight-decay 0.1 --warmup-epochs 2 --min-lr-factor 0.2 --label-smoothing 0.1 \
             --val-fraction 0.3 --seed 5 --out o --resume --gpus 1,2 --image-size 64 --small-input false \
             --strict-images --prefetch 2 --shuffle-buffer 64 --max-steps-per-epoch 9 --stop-after-epochs 1 --strategy dp \
             --sync-bn --grad-compression bf16 --bucket-cap-mb 50 --precision bf16 --channels-first --pretrained w.pth \
             --freeze-layers --backbone-lr-scale 0.5 --clip-grad-norm 1 --checkpoint-every 3 \
             --profile-steps 2..4 --timeout-s 9 --hflip 0 --rrc-ratio 1,2 --color-jitter 0.4 \
             --random-erasing 0.2 --randaugment 2,7 --cutmix 1 --mixup-prob 0.5 --mixup-switch-prob 0.1 \
             --drop-path 0.2",
        );
        let mut expected = TrainConfig {
            data: "fashion-mnist".into(),
            model: "resnet18".into(),
            epochs: 7,
            batch_size: 8,
            lr: 0.5,
            optimizer: crate::train::config::OptimizerKind::Sgd,
            momentum: 0.8,
            weight_decay: 0.1,
            warmup_epochs: 2,
            min_lr_factor: 0.2,
            label_smoothing: 0.1,
            val_fraction: 0.3,
            seed: 5,
            out: "o".into(),
            resume: true,
            device: DeviceSpec::Cuda(vec![1, 2]),
            image_size: 64,
            small_input: false,
            strict_images: true,
            prefetch: 2,
            shuffle_buffer: 64,
            max_steps_per_epoch: Some(9),
            stop_after_epochs: Some(1),
            strategy: crate::train::config::Strategy::Dp,
            sync_bn: true,
            grad_compression: burn_ddp::GradCompression::Bf16,
            bucket_cap_mb: 50.0,
            precision: burn_ddp::nn::Precision::Bf16,
            channels_last: Some(false),
            pretrained: Some("w.pth".into()),
            freeze_layers: true,
            backbone_lr_scale: 0.5,
            clip_grad_norm: Some(1.0),
            checkpoint_every: Some(3),
            profile_steps: Some([2, 4]),
            timeout_s: Some(9.0),
            drop_path: 0.2,
            ..TrainConfig::default()
        };
        expected.augment = crate::data::augment::Augment {
            hflip: 0.0,
            ratio: [1.0, 2.0],
            color_jitter: 0.4,
            random_erasing: 0.2,
            rand_augment_ops: 2,
            rand_augment_magnitude: 7,
            ..Default::default()
        };
        expected.mixup.cutmix_alpha = 1.0;
        expected.mixup.prob = 0.5;
        expected.mixup.switch_prob = 0.1;
        assert_eq!(c, expected);
        assert_eq!(parse("--nproc 3 --cpu").nproc, 3);
    }

    #[test]
    fn presets_leave_the_plain_switches_off() {
        // `--resume`, `--strict-images` and `--freeze-layers` are switches: left out, they read as
        // off, so no preset may turn them on.
        for name in ["tutorial", "vit"] {
            let p = TrainConfig::preset(name).unwrap();
            assert!(!p.resume && !p.strict_images && !p.freeze_layers, "{name}");
        }
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
