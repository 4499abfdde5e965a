//! Evaluation: loss, top-1 and top-5 over a set of samples, with no gradient tracking.

use crate::data::Dataset;
use crate::data::loader::BatchImages;
use crate::data::loader::Loader;
use crate::data::loader::LoaderConfig;
use crate::data::loader::SkipLog;
use crate::data::transform::Pipeline;
use crate::error::Result;
use crate::model::classifier::Classifier;
use crate::model::image_classifier::ImageClassifier;
use crate::train::metrics::Tally;
use burn::prelude::*;
use burn::tensor::TensorData;
use std::sync::Arc;

/// Converts a loader batch into device tensors: host values uploaded, or encoded images
/// decoded, cropped and normalised on the device.
///
/// # Shapes
/// images `[n, c, h, w]`, labels `[n]`
///
/// # Errors
/// When the device cannot make the batch of encoded images.
pub fn batch_tensors<B: Backend>(
    batch: crate::data::loader::Batch,
    device: &B::Device,
) -> Result<(Tensor<B, 4>, Tensor<B, 1, Int>)> {
    let n = batch.shape[0];
    let x = match batch.images {
        BatchImages::Host(values) => burn_ddp::nn::images_to_device(values, batch.shape, device),
        BatchImages::Device(decoding) => decoding.to_device(device)?,
    };
    let y = Tensor::from_data(TensorData::new(batch.labels, [n]), device);
    Ok((x, y))
}

/// Evaluates `model` (an inference-mode module: BatchNorm uses running statistics) on the
/// samples `indices` of `dataset`, in order.
///
/// # Errors
/// When a batch cannot be loaded (strict mode) or a transform fails.
pub fn evaluate<B: Backend>(
    model: &Classifier<B>,
    dataset: Arc<dyn Dataset>,
    indices: Vec<usize>,
    pipeline: Pipeline,
    config: LoaderConfig,
    skips: Arc<SkipLog>,
    device: &B::Device,
) -> Result<Tally> {
    let classes = dataset.classes().len();
    let mut tally = Tally::default();
    for batch in Loader::new(dataset, indices, pipeline, 0, LoaderConfig { drop_last: false, ..config }, skips) {
        let batch = batch?;
        let labels = batch.labels.clone();
        let (x, y) = batch_tensors::<B>(batch, device)?;
        let logits = model.forward(x);
        let loss: f64 = burn_ddp::nn::cross_entropy(logits.clone(), y, 0.0).into_scalar().elem();
        let logits = logits.into_data().convert::<f32>().to_vec::<f32>().expect("f32 logits");
        tally.add(&logits, &labels, classes, loss);
    }
    Ok(tally)
}
