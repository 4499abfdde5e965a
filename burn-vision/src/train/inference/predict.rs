//! Loading a trained checkpoint for evaluation and prediction on new images.

use crate::data::folder::decode_file;
use crate::data::loader::sample_rng;
use crate::data::source::grayscale_pipelines;
use crate::data::transform::Pipeline;
use crate::error::{Error, Result};
use crate::model::classifier::Classifier;
use crate::model::classifier::with_model_record;
use crate::model::image_classifier::ImageClassifier;
use crate::model::registry::create;
use crate::train::checkpoint::{Checkpoint, CheckpointMeta};
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::softmax;
use std::path::Path;

/// A model restored from a checkpoint, with what is needed to feed it.
pub struct Restored<B: Backend> {
    /// The model (inference mode on a non-autodiff backend).
    pub model: Classifier<B>,
    /// The checkpoint's metadata.
    pub meta: CheckpointMeta,
    /// Deterministic transforms matching training.
    pub pipeline: Pipeline,
}

/// Loads `path` onto `device`.
///
/// # Errors
/// [`Error::BadCheckpoint`] for missing, corrupt or mismatched files.
pub fn restore<B: Backend>(path: &Path, device: &B::Device) -> Result<Restored<B>> {
    let ck = Checkpoint::load(path)?;
    let meta = ck.meta;
    let model = create::<B>(&meta.model, meta.classes.len(), meta.in_channels, meta.small_input, device)?;
    let pipeline = if meta.in_channels == 1 {
        grayscale_pipelines(meta.image_size, &crate::data::augment::Augment::default()).1
    } else {
        Pipeline::imagenet_eval(meta.image_size)
    };
    let model = with_model_record(model, &ck.model, device).map_err(|e| Error::BadCheckpoint {
        path: path.to_path_buf(),
        reason: format!("model record does not fit {}: {e}", meta.model),
    })?;
    Ok(Restored { model, meta, pipeline })
}

/// One image's top predictions.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Prediction {
    /// The image path.
    pub path: String,
    /// (class name, probability), most likely first.
    pub top: Vec<(String, f32)>,
}

/// Predicts the `k` most likely classes of each image.
///
/// # Errors
/// When an image cannot be decoded.
pub fn predict<B: Backend>(
    restored: &Restored<B>,
    images: &[impl AsRef<Path>],
    k: usize,
    device: &B::Device,
) -> Result<Vec<Prediction>> {
    let mut out = Vec::new();
    for path in images {
        let path = path.as_ref();
        let img = decode_file(path)?;
        let mut pixels = Vec::new();
        let (w, h) = restored.pipeline.apply_into(img, &mut sample_rng(0, 0, 0), &mut pixels);
        let x = Tensor::<B, 4>::from_data(
            TensorData::new(pixels, [1, restored.meta.in_channels, h as usize, w as usize]),
            device,
        );
        let probs = softmax(restored.model.forward(x), 1).into_data().convert::<f32>().to_vec::<f32>().expect("f32");
        let mut ranked: Vec<(usize, f32)> = probs.into_iter().enumerate().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        let top = ranked.into_iter().take(k).map(|(i, p)| (restored.meta.classes[i].clone(), p)).collect();
        out.push(Prediction { path: path.display().to_string(), top });
    }
    Ok(out)
}
