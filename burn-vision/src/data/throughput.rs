//! How fast the input pipeline turns files into batches — in host memory, or on a GPU as
//! training receives them (`burn-vision bench-data [--gpus N]`): run it next to `burn-vision
//! bench` to see whether the device or the data loading limits training.

use super::loader::{Batch, Loader, LoaderConfig, SkipLog};
use super::shards::samples_by_shard;
use super::source::LoadedData;
use super::split::shuffle_for_epoch;
use crate::error::{Error, Result};
use burn_ddp::nn::decode::{DeviceDecodeTimes, device_decode_times};
use burn_ddp::shard_sampler::ShardSampler;
use std::sync::Arc;
use std::time::Instant;

/// What to measure; its fields are also flags of `burn-vision bench-data`.
#[derive(Debug, Clone, serde::Serialize, clap::Args)]
pub struct DataBenchConfig {
    /// Images per batch.
    #[arg(long, default_value_t = 256)]
    pub batch_size: usize,
    /// Batches timed, after one untimed batch.
    #[arg(long, default_value_t = 10)]
    pub batches: usize,
    /// Time the evaluation transforms instead of the training ones.
    #[arg(long)]
    pub eval: bool,
    /// Augmentation and shuffling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Batches prepared ahead of the consumer (as in training).
    #[arg(long, default_value_t = 4)]
    pub prefetch: usize,
    /// Where JPEGs are decoded when the batches go to a GPU (`--gpus`): `gpu`, `cpu` or `auto`,
    /// as in training.
    #[arg(long, value_enum, default_value_t)]
    pub decode: super::decode::Decode,
}

/// Where the timed batches go.
pub trait BatchSink {
    /// Where the batches end up, for the report (`host memory`, `gpu 0`).
    fn name(&self) -> String;
    /// Takes one batch (uploads it, or drops it).
    fn take(&mut self, batch: Batch);
    /// Waits until every batch taken has arrived (the clock stops after this).
    fn finish(&mut self) {}
    /// The device decoder the sink's batches go to encoded (the GPU's), when it decodes them.
    fn decoder(&self) -> Option<burn_ddp::nn::decode::DeviceDecoder> {
        None
    }
}

/// Batches stay in host memory: the loader alone is timed.
pub struct HostMemory;

impl BatchSink for HostMemory {
    fn name(&self) -> String {
        "host memory".into()
    }
    fn take(&mut self, _batch: Batch) {}
}

/// The measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DataBenchResult {
    /// The settings.
    pub config: DataBenchConfig,
    /// Where the batches were delivered (`host memory`, or the GPU they were uploaded to).
    pub delivered_to: String,
    /// Images in the timed batches.
    pub images: usize,
    /// Wall seconds of the timed batches.
    pub seconds: f64,
    /// Images per second the loader delivered.
    pub img_per_s: f64,
    /// Threads decoding and transforming (rayon's pool).
    pub threads: usize,
    /// Milliseconds per image spent reading and decoding (one thread's time), over every image
    /// the loader made (the loader's threads run ahead of the timed window: a short run may
    /// have made all its batches before it opened).
    pub decode_ms_per_image: f64,
    /// Milliseconds per image spent in the transforms and normalisation (one thread's time),
    /// over every image the loader made.
    pub transform_ms_per_image: f64,
    /// `[n, c, h, w]` of the batches.
    pub batch_shape: [usize; 4],
    /// The transforms timed, in order (`RandomResizedCrop { .. }, RandAugment { .. }, …`).
    pub transforms: String,
    /// Images that could not be decoded (skipped).
    pub skipped: usize,
    /// Where the images were decoded: `cpu`, or `gpu` (the sink decoded them).
    pub decoded_on: String,
    /// In a GPU-decoded run, the images the host decoded all the same (formats the GPU's
    /// decoder does not take: PNG, progressive or greyscale JPEG).
    pub host_decoded: u64,
    /// In a GPU-decoded run, the JPEGs the GPU's decoder refused (they entered their batches
    /// as zeros, each batch with a warning).
    pub device_failed: u64,
    /// In a GPU-decoded run, where the loader's submitting thread spent each batch's time while
    /// the timed batches were loaded: what sets the decode's pace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_submit: Option<DeviceSubmit>,
}

/// A GPU-decoded run's batches as the loader's thread handed them to the GPU's decoder
/// (`burn_ddp::nn::decode::DeviceDecodeTimes`), in milliseconds per batch.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct DeviceSubmit {
    /// Batches submitted while the timed batches were loaded.
    pub batches: u64,
    /// Waiting for a free decode slot: the consumer had not taken the batch it held.
    pub slot_wait_ms: f64,
    /// Waiting for the slot's previous decode and its reads to end: the GPU's JPEG engines and
    /// the crop kernel.
    pub reuse_wait_ms: f64,
    /// In nvJPEG's calls (and reading the headers for the planes' layout, copying images
    /// decoded on the host): the host's own work.
    pub submit_ms: f64,
}

impl DeviceSubmit {
    /// The batches submitted between two readings of `device_decode_times`.
    pub fn between(before: &DeviceDecodeTimes, after: &DeviceDecodeTimes) -> Self {
        let span = after.since(before);
        let [slot_wait_ms, reuse_wait_ms, submit_ms] = span.ms_per_batch();
        Self { batches: span.batches, slot_wait_ms, reuse_wait_ms, submit_ms }
    }
}

/// Loads `config.batches + 1` batches of `data` (a shuffled order, as in training), hands them
/// to `sink`, and times all but the first.
///
/// # Errors
/// When there are too few images for the batches asked for, or (strict mode) an image fails.
pub fn loader_throughput(
    data: &LoadedData,
    config: &DataBenchConfig,
    sink: &mut dyn BatchSink,
) -> Result<DataBenchResult> {
    let need = config.batch_size * (config.batches + 1);
    if config.batch_size == 0 || config.batches == 0 || data.dataset.len() < need {
        return Err(Error::InvalidConfig {
            name: "bench-data",
            value: format!("batch size {} × ({} + 1) batches", config.batch_size, config.batches),
            reason: format!(
                "needs {need} images and the data has {}; lower --batches or --batch-size",
                data.dataset.len()
            ),
        });
    }
    let all: Vec<usize> = (0..data.dataset.len()).collect();
    // The order training reads in: shard after shard for tar shards, any order otherwise.
    let order = match data.dataset.shards() {
        Some(ranges) => ShardSampler::new(samples_by_shard(ranges, &all), 1, 0).with_seed(config.seed).indices(),
        None => shuffle_for_epoch(&all, config.seed, 0),
    };
    let order: Vec<usize> = order.into_iter().take(need).collect();
    let pipeline = if config.eval { data.eval.clone() } else { data.train.clone() };
    let transforms = pipeline.steps.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
    let device_decode = sink.decoder();
    let decoded_on = if device_decode.is_some() { "gpu" } else { "cpu" };
    let loader_config = LoaderConfig {
        batch_size: config.batch_size,
        drop_last: true,
        prefetch: config.prefetch,
        seed: config.seed,
        strict: false,
        device_decode,
    };
    let skips = Arc::new(SkipLog::default());
    let failed_before = burn_ddp::nn::decode::device_decode_counts().1;
    let mut loader = Loader::new(data.dataset.clone(), order, pipeline, 0, loader_config, skips.clone());
    let first = loader.next().ok_or_else(|| Error::InvalidConfig {
        name: "bench-data",
        value: String::new(),
        reason: "every image of the first batch failed to load".into(),
    })??;
    let batch_shape = first.shape;
    sink.take(first);
    sink.finish();
    let submitted_before = device_decode_times();
    let started = Instant::now();
    let mut images = 0;
    for batch in loader.by_ref() {
        let batch = batch?;
        images += batch.shape[0];
        sink.take(batch);
    }
    sink.finish();
    let seconds = started.elapsed().as_secs_f64();
    let device_submit = (decoded_on == "gpu").then(|| DeviceSubmit::between(&submitted_before, &device_decode_times()));
    let (decode_s, transform_s, made) = loader.stage_times().totals();
    let per_image = |s: f64| 1e3 * s / made.max(1) as f64;
    Ok(DataBenchResult {
        config: config.clone(),
        delivered_to: sink.name(),
        images,
        seconds,
        img_per_s: images as f64 / seconds.max(1e-9),
        threads: rayon::current_num_threads(),
        decode_ms_per_image: per_image(decode_s),
        transform_ms_per_image: per_image(transform_s),
        batch_shape,
        transforms,
        skipped: skips.count(),
        decoded_on: decoded_on.into(),
        host_decoded: loader.stage_times().host_decoded(),
        device_failed: burn_ddp::nn::decode::device_decode_counts().1 - failed_before,
        device_submit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DataSource, load_source};

    fn config(batches: usize) -> DataBenchConfig {
        DataBenchConfig { batch_size: 64, batches, eval: false, seed: 3, prefetch: 2, decode: Default::default() }
    }

    #[test]
    fn times_the_batches_after_the_first() {
        let data = load_source(&DataSource::Bundled, 28).unwrap();
        let r = loader_throughput(&data, &config(3), &mut HostMemory).unwrap();
        assert_eq!((r.images, r.batch_shape, r.skipped), (3 * 64, [64, 1, 28, 28], 0));
        assert_eq!(r.delivered_to, "host memory");
        assert!(r.seconds > 0.0 && r.img_per_s > 0.0 && r.threads >= 1, "{r:?}");
        assert!(r.decode_ms_per_image >= 0.0 && r.transform_ms_per_image > 0.0, "{r:?}");
        // Decoded on the host: no GPU decoder's times in the report.
        assert!(r.device_submit.is_none());
        assert!(!serde_json::to_string(&r).unwrap().contains("device_submit"));
    }

    /// Counts what it is handed.
    struct Counting(usize, usize);

    impl BatchSink for Counting {
        fn name(&self) -> String {
            "counting".into()
        }
        fn take(&mut self, batch: Batch) {
            self.0 += batch.shape[0];
        }
        fn finish(&mut self) {
            self.1 += 1;
        }
    }

    #[test]
    fn the_sink_gets_every_batch_and_is_drained_before_the_clock_stops() {
        let data = load_source(&DataSource::Bundled, 28).unwrap();
        let mut sink = Counting(0, 0);
        let r = loader_throughput(&data, &config(2), &mut sink).unwrap();
        assert_eq!((sink.0, sink.1, r.images, r.delivered_to.as_str()), (3 * 64, 2, 2 * 64, "counting"));
    }

    #[test]
    fn too_few_images_is_an_error_that_says_so() {
        let data = load_source(&DataSource::Bundled, 28).unwrap();
        let e = loader_throughput(&data, &config(1000), &mut HostMemory).unwrap_err().to_string();
        assert!(e.contains("needs 64064 images") && e.contains("10000"), "{e}");
    }
}
