//! `eval` and `predict` on a device: the GPU asked for, else the checkpoint's own GPU when this
//! build has CUDA and that GPU exists, else the CPU. Prediction takes files and folders and
//! reports an unreadable image per file without stopping.

use crate::data::folder::is_image;
use crate::data::loader::LoaderConfig;
use crate::data::loader::SkipLog;
use crate::data::source::DataSource;
use crate::data::source::load_source;
use crate::data::split::split_per_class;
use crate::error::{Error, Result};
use crate::model::image_classifier::ImageClassifier;
use crate::train::checkpoint::Checkpoint;
use crate::train::config::{DeviceSpec, TrainConfig};
use crate::train::inference::evaluate::evaluate;
use crate::train::inference::predict::{Prediction, predict, restore};
use crate::train::metrics::Tally;
use burn::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `eval` is asked to do; its fields are also `burn-vision eval`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct EvalRequest {
    /// A checkpoint written by `train` (best.ckpt or last.ckpt).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Data to evaluate on; defaults to the checkpoint's own validation split.
    #[arg(long)]
    pub data: Option<String>,
    /// Evaluate every sample of --data instead of the validation split.
    #[arg(long)]
    pub all: bool,
    /// Images per batch.
    #[arg(long, default_value_t = 128)]
    pub batch_size: usize,
    /// GPU to evaluate on (default: the checkpoint's own GPU when this build has CUDA and the
    /// GPU exists, else the CPU; see [`device_for`]).
    #[arg(long = "gpus", value_name = "ID", value_parser = DeviceSpec::parse_one_gpu)]
    pub gpu: Option<usize>,
    /// Where JPEGs are decoded on a GPU: `gpu`, `cpu` or `auto`, as in training.
    #[arg(long, value_enum, default_value_t)]
    pub decode: crate::data::decode::Decode,
}

/// What `eval` found.
#[derive(Debug, Clone)]
pub struct EvalReport {
    /// Images evaluated (skipped ones included).
    pub images: usize,
    /// Unreadable images skipped.
    pub skipped: usize,
    /// Loss and accuracy.
    pub tally: Tally,
    /// Where it ran (`cpu` or `gpu N`).
    pub device: String,
}

/// The GPU to use: `asked`, else the first GPU the checkpoint was trained on when this build has
/// CUDA and that GPU exists here, else none (the CPU).
///
/// # Errors
/// [`Error::Device`] when `asked` does not exist or the build has no CUDA.
pub fn device_for(asked: Option<usize>, checkpoint: &Path) -> Result<Option<usize>> {
    if let Some(id) = asked {
        crate::train::check_gpus(&[id])?;
        return Ok(Some(id));
    }
    if !cfg!(feature = "cuda") {
        return Ok(None);
    }
    let trained: Option<TrainConfig> =
        Checkpoint::load(checkpoint).ok().and_then(|ck| serde_json::from_value(ck.meta.config).ok());
    let id = match trained.map(|c| c.device) {
        Some(DeviceSpec::Cuda(ids)) => ids.first().copied(),
        _ => None,
    };
    Ok(id.filter(|&id| crate::train::check_gpus(&[id]).is_ok()))
}

/// Evaluates a checkpoint (on [`device_for`]'s device).
///
/// # Errors
/// Unusable checkpoints or data, classes that differ from the checkpoint's, a missing GPU.
pub fn evaluate_checkpoint(r: &EvalRequest) -> Result<EvalReport> {
    let gpu = device_for(r.gpu, &r.checkpoint)?;
    let mut report = match gpu {
        None => evaluate_on::<burn_flex::Flex>(r, &Default::default(), false)?,
        #[cfg(feature = "cuda")]
        Some(id) => evaluate_on::<burn_cuda::Cuda>(r, &crate::train::gpu(id), true)?,
        #[cfg(not(feature = "cuda"))]
        Some(_) => unreachable!("check_gpus fails without the cuda feature"),
    };
    report.device = gpu.map_or("cpu".to_string(), |id| format!("gpu {id}"));
    Ok(report)
}

fn evaluate_on<B: Backend>(r: &EvalRequest, device: &B::Device, gpu: bool) -> Result<EvalReport> {
    let mut restored = restore::<B>(&r.checkpoint, device)?;
    let bad = |reason: String| Error::BadCheckpoint { path: r.checkpoint.clone(), reason };
    let trained: TrainConfig =
        serde_json::from_value(restored.meta.config.clone()).map_err(|e| bad(format!("no training config: {e}")))?;
    // The layout and precision it trained with, where they help: channels-last on GPUs.
    restored.model = restored.model.with_precision(trained.precision).with_channels_last(gpu);
    let source: DataSource = match r.data.as_deref().unwrap_or(&trained.data).parse() {
        Ok(s) => s,
        Err(never) => match never {},
    };
    let data = load_source(&source, trained.image_size)?;
    if data.dataset.classes() != restored.meta.classes.as_slice() {
        return Err(Error::InvalidConfig {
            name: "--data",
            value: source.to_string(),
            reason: format!(
                "its classes ({}) differ from the checkpoint's ({})",
                data.dataset.classes().join(","),
                restored.meta.classes.join(",")
            ),
        });
    }
    let indices: Vec<usize> = if r.all {
        (0..data.dataset.len()).collect()
    } else {
        let labels: Vec<usize> = (0..data.dataset.len()).map(|i| data.dataset.label(i)).collect();
        split_per_class(&labels, trained.val_fraction, trained.seed).1
    };
    let images = indices.len();
    let skips = Arc::new(SkipLog::default());
    let cfg = LoaderConfig {
        batch_size: r.batch_size,
        drop_last: false,
        prefetch: 4,
        seed: trained.seed,
        strict: false,
        device_decode: crate::data::decode::resolve::<B>(r.decode, &restored.pipeline, &*data.dataset, device, true)?,
    };
    let tally = evaluate(&restored.model, data.dataset, indices, restored.pipeline, cfg, skips.clone(), device)?;
    Ok(EvalReport { images, skipped: skips.count(), tally, device: String::new() })
}

/// The image files named by `paths`: files as given, folders by their `.jpg`/`.jpeg`/`.png`
/// files (sorted; not recursive).
///
/// # Errors
/// [`Error::Io`] for a folder that cannot be listed.
pub fn image_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| Error::io("listing", p, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| is_image(f))
            .collect();
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// The `top` classes of every image in `paths` (files or folders), each image's own result:
/// an unreadable one does not stop the others.
///
/// # Errors
/// An unusable checkpoint, a folder that cannot be listed, a missing GPU.
pub fn predict_paths(
    checkpoint: &Path,
    paths: &[PathBuf],
    top: usize,
    gpu: Option<usize>,
) -> Result<Vec<(PathBuf, Result<Prediction>)>> {
    let files = image_files(paths)?;
    match device_for(gpu, checkpoint)? {
        None => predict_on::<burn_flex::Flex>(checkpoint, &files, top, &Default::default()),
        #[cfg(feature = "cuda")]
        Some(id) => predict_on::<burn_cuda::Cuda>(checkpoint, &files, top, &crate::train::gpu(id)),
        #[cfg(not(feature = "cuda"))]
        Some(_) => unreachable!("check_gpus fails without the cuda feature"),
    }
}

fn predict_on<B: Backend>(
    checkpoint: &Path,
    files: &[PathBuf],
    top: usize,
    device: &B::Device,
) -> Result<Vec<(PathBuf, Result<Prediction>)>> {
    let restored = restore::<B>(checkpoint, device)?;
    Ok(files
        .iter()
        .map(|f| (f.clone(), predict(&restored, std::slice::from_ref(f), top, device).map(|mut p| p.remove(0))))
        .collect())
}
