//! Where a run's images are decoded: `--decode auto|gpu|cpu`. On the GPU, nvJPEG decodes the
//! JPEGs and one kernel crops, resizes, mirrors and normalises them (burn-ddp's
//! `nn::crops_to_device`); the loader's threads only read the files, check them and draw the
//! crops. The choice is made once per run and said in one log line.

use super::Dataset;
use super::transform::Pipeline;
use crate::error::{Error, Result};
use burn::prelude::*;

/// `--decode`: where images are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Decode {
    /// On the GPU when the model trains on one that has a hardware JPEG decoder, the data has
    /// files and the transforms are crop, resize and flip; on the CPU otherwise.
    #[default]
    Auto,
    /// On the GPU (nvJPEG), or an error saying why it cannot.
    Gpu,
    /// On the CPU.
    Cpu,
}

/// Whether the batches of `dataset` made with `train` go to `device` encoded, for it to decode
/// — `choice` resolved, with one log line saying which decoder runs and why (`say`: this
/// process speaks for the run).
///
/// # Errors
/// `--decode gpu` where the device cannot decode these batches, with the reason.
pub fn resolve<B: Backend>(
    choice: Decode,
    train: &Pipeline,
    dataset: &dyn Dataset,
    device: &B::Device,
    say: bool,
) -> Result<bool> {
    let cpu = |reason: String| -> Result<bool> {
        if choice == Decode::Gpu {
            return Err(Error::InvalidConfig {
                name: "decode",
                value: "gpu".into(),
                reason: format!("{reason}; use --decode cpu"),
            });
        }
        if say && choice == Decode::Auto {
            log::info!("decoding images on the CPU: {reason}");
        }
        Ok(false)
    };
    if choice == Decode::Cpu {
        return Ok(false);
    }
    if !train.is_crop_and_resize() {
        return cpu("the training transforms are more than crop, resize and flip (colour jitter, RandAugment and random erasing run on the host only; greyscale data too)".into());
    }
    if dataset.is_empty() || dataset.read_bytes(0).is_none() {
        return cpu("the data set has no image files to decode (IDX data is decoded already)".into());
    }
    match burn_ddp::nn::decode::device_decoder::<B>(device) {
        Err(reason) => cpu(format!("no GPU decoder ({reason})")),
        Ok((name, false)) if choice == Decode::Auto => {
            cpu(format!("the GPU has no hardware JPEG decoder ({name} would run; --decode gpu chooses it)"))
        }
        Ok((name, _)) => {
            if say {
                log::info!("decoding JPEGs on the GPU: {name}; crop, resize, flip and normalise on the GPU");
            }
            Ok(true)
        }
    }
}
