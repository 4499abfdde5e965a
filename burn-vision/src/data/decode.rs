//! Where a run's images are decoded: `--decode auto|gpu|cpu`. On the GPU, nvJPEG decodes the
//! JPEGs, started by the loader's thread a batch ahead, and one kernel crops, resizes, mirrors
//! and normalises them (burn-ddp's `nn::decode::DeviceDecoder`) — a second one runs
//! RandAugment, colour jitter and random erasing first when the recipe has them; the loader's
//! threads only read the files, check them and draw the crops and operations. The choice is made once per run and said in
//! one log line.

use super::Dataset;
use super::transform::Pipeline;
use crate::error::{Error, Result};
use burn::prelude::*;
use burn_ddp::nn::decode::DeviceDecoder;

/// `--decode`: where images are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Decode {
    /// On the GPU when the model trains on one that has a hardware JPEG decoder, the data set's
    /// first file is a baseline JPEG and the transforms are crop, resize and flip, with or
    /// without RandAugment, colour jitter and random erasing; on the CPU otherwise.
    #[default]
    Auto,
    /// On the GPU (nvJPEG), with RandAugment, colour jitter and random erasing there too, or an
    /// error saying why it cannot.
    Gpu,
    /// On the CPU.
    Cpu,
}

/// The decoder of `device` when the batches of `dataset` made with `train` go there encoded,
/// for it to decode — `choice` resolved, with one log line saying which decoder runs and why
/// (`say`: this process speaks for the run); `None`: the host decodes.
///
/// # Errors
/// `--decode gpu` where the device cannot decode these batches, with the reason.
pub fn resolve<B: Backend>(
    choice: Decode,
    train: &Pipeline,
    dataset: &dyn Dataset,
    device: &B::Device,
    say: bool,
) -> Result<Option<DeviceDecoder>> {
    let cpu = |reason: String| -> Result<Option<DeviceDecoder>> {
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
        Ok(None)
    };
    // A model on the CPU (or any backend without a decoder): nothing to choose or say.
    if choice == Decode::Cpu || (choice == Decode::Auto && !DeviceDecoder::backend_has_one::<B>()) {
        return Ok(None);
    }
    if !train.is_device_plannable() {
        return cpu("the training transforms are more than RandomResizedCrop, flip, RandAugment, colour jitter and random erasing, or the data is greyscale".into());
    }
    let first = if dataset.is_empty() { None } else { dataset.read_bytes(0) };
    let Some(first) = first else {
        return cpu("the data set has no image files to decode (IDX data is decoded already)".into());
    };
    // The first file stands for the set: PNGs (or progressive JPEGs) would all be decoded on the
    // host anyway, and then copied to the GPU. (One that cannot be read decides nothing: the
    // loader skips and counts it.)
    if first.is_ok_and(|bytes| burn_ddp::nn::jpeg::device_decodable(&bytes).is_none()) {
        return cpu(format!(
            "{} is not a baseline JPEG (PNG, progressive, greyscale and CMYK images decode on the host)",
            dataset.describe(0)
        ));
    }
    match DeviceDecoder::for_device::<B>(device) {
        Err(reason) => cpu(format!("no GPU decoder ({reason})")),
        Ok(d) if choice == Decode::Auto && !d.is_hardware() => {
            cpu(format!("the GPU has no hardware JPEG decoder ({} would run; --decode gpu chooses it)", d.name()))
        }
        Ok(d) => {
            if say {
                let ops = if train.is_crop_and_resize() { "" } else { ", RandAugment, colour jitter, random erasing" };
                log::info!("decoding JPEGs on the GPU: {}; crop, resize, flip{ops} and normalise on the GPU", d.name());
                let queues = burn_ddp::device::cuda_queues();
                if queues < burn_ddp::device::ALL_CUDA_QUEUES {
                    log::warn!(
                        "CUDA spreads this process's streams over {queues} hardware queues ({}): the decode's work may wait behind the training's; 32 fed a decode-bound ResNet-18 20 % faster on an H100",
                        burn_ddp::device::CUDA_QUEUES_VAR
                    );
                }
            }
            Ok(Some(d))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::FolderDataset;
    use burn_flex::Flex;

    fn folder(jpeg: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        let img = image::RgbImage::from_fn(32, 24, |x, y| image::Rgb([x as u8 * 8, y as u8 * 10, 50]));
        let name = if jpeg { "a/0.jpg" } else { "a/0.png" };
        img.save(dir.path().join(name)).unwrap();
        dir
    }

    /// `--decode gpu` says in one line why it cannot run; `auto` and `cpu` fall back silently to
    /// the CPU; each reason in its turn: the transforms, the files, then the device.
    #[test]
    fn each_reason_for_the_cpu_is_one_line_for_decode_gpu() {
        let train = Pipeline::imagenet_train(16);
        let device = Default::default();
        let (jpeg_dir, png_dir) = (folder(true), folder(false));
        let jpegs = FolderDataset::open(jpeg_dir.path()).unwrap();
        let pngs = FolderDataset::open(png_dir.path()).unwrap();
        let gpu = |pipe: &Pipeline, data: &dyn Dataset| resolve::<Flex>(Decode::Gpu, pipe, data, &device, false);
        let jitter =
            Pipeline::imagenet_train_with(16, &crate::data::Augment { color_jitter: 0.4, ..Default::default() });
        let gray = Pipeline::grayscale(16, 0.5, 0.5, &crate::data::Augment::default());
        let e = gpu(&gray, &jpegs).unwrap_err().to_string();
        assert!(e.contains("greyscale") && e.contains("--decode cpu"), "{e}");
        // Jitter on the GPU is asked for: only the device is missing.
        let e = gpu(&jitter, &jpegs).unwrap_err().to_string();
        assert!(e.contains("no GPU decoder"), "{e}");
        let e = gpu(&train, &pngs).unwrap_err().to_string();
        assert!(e.contains("not a baseline JPEG"), "{e}");
        let e = gpu(&train, &jpegs).unwrap_err().to_string();
        assert!(e.contains("no GPU decoder") && e.lines().count() == 1, "{e}");
        for choice in [Decode::Auto, Decode::Cpu] {
            assert!(resolve::<Flex>(choice, &train, &jpegs, &device, false).unwrap().is_none());
            assert!(resolve::<Flex>(choice, &jitter, &jpegs, &device, false).unwrap().is_none());
        }
    }
}
