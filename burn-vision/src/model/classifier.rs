//! [`Classifier`], the Burn module that holds any family of the registry (an enum, so
//! optimizers, DDP, DataParallel and records see one concrete module type), known to the
//! pipeline through [`ImageClassifier`] like every family.
//!
//! A new family is one file (its blocks, model, configs and `impl ImageClassifier`) plus its
//! entries here and in `registry.rs`: a variant of [`Classifier`] and of [`ModelConfig`], and
//! its names.

use super::image_classifier::{ImageClassifier, NameScheme};
use super::resnet::{ResNet, ResNetConfig, ResNetRecord};
use super::vit::{VisionTransformer, VitConfig};
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder, RecorderError};
use burn_ddp::BatchNormSync;
use burn_ddp::nn::{Layout, Precision};

/// Any model of the registry.
#[derive(Module, Debug)]
pub enum Classifier<B: Backend> {
    /// ResNet-10-mini/18/34/50/101/152.
    ResNet(ResNet<B>),
    /// ViT-Ti/S/B.
    Vit(VisionTransformer<B>),
}

/// Any model's configuration (no backend): what the registry hands out.
#[derive(Debug, Clone)]
pub enum ModelConfig {
    /// A ResNet.
    ResNet(ResNetConfig),
    /// A Vision Transformer.
    Vit(VitConfig),
}

impl ModelConfig {
    /// The same model for `channels` input channels.
    pub fn with_in_channels(self, channels: usize) -> Self {
        match self {
            ModelConfig::ResNet(c) => ModelConfig::ResNet(c.with_in_channels(channels)),
            ModelConfig::Vit(c) => ModelConfig::Vit(c.with_in_channels(channels)),
        }
    }

    /// The same model with its small-input stem (28–64 px images) when `small` (a `*-mini`
    /// model keeps its own).
    pub fn with_small_input(self, small: bool) -> Self {
        match self {
            ModelConfig::ResNet(c) => {
                let small = c.small_input || small;
                ModelConfig::ResNet(c.with_small_input(small))
            }
            ModelConfig::Vit(c) => {
                let small = c.small_input || small;
                ModelConfig::Vit(c.with_small_input(small))
            }
        }
    }

    /// Builds the model on `device` with its family's initialisation.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Classifier<B> {
        match self {
            ModelConfig::ResNet(c) => Classifier::ResNet(c.init(device)),
            ModelConfig::Vit(c) => Classifier::Vit(c.init(device)),
        }
    }
}

/// Runs `$body` with `$m` bound to the family's model, re-wrapping a returned model with
/// `wrap`.
macro_rules! each_family {
    ($self:expr, $m:ident => $body:expr) => {
        match $self {
            Classifier::ResNet($m) => $body,
            Classifier::Vit($m) => $body,
        }
    };
    (wrap $self:expr, $m:ident => $body:expr) => {
        match $self {
            Classifier::ResNet($m) => Classifier::ResNet($body),
            Classifier::Vit($m) => Classifier::Vit($body),
        }
    };
}

impl<B: Backend> ImageClassifier<B> for Classifier<B> {
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        each_family!(self, m => m.forward(x))
    }
    fn with_precision(self, precision: Precision) -> Self {
        each_family!(wrap self, m => m.with_precision(precision))
    }
    fn precision(&self) -> Precision {
        each_family!(self, m => m.precision())
    }
    fn with_channels_last(self, channels_last: bool) -> Self {
        each_family!(wrap self, m => m.with_channels_last(channels_last))
    }
    fn layout(&self) -> Layout {
        each_family!(self, m => m.layout())
    }
    fn with_sync_batch_norm(self, sync: Option<BatchNormSync>) -> Self {
        each_family!(wrap self, m => m.with_sync_batch_norm(sync))
    }
    fn sync_batch_norm(&self) -> bool {
        each_family!(self, m => m.sync_batch_norm())
    }
    fn torch_names(&self) -> &'static [NameScheme] {
        each_family!(self, m => m.torch_names())
    }
    fn head_params(&self) -> Vec<String> {
        each_family!(self, m => m.head_params())
    }
    fn with_drop_path(self, rate: f64) -> Option<Self> {
        match self {
            Classifier::ResNet(m) => m.with_drop_path(rate).map(Classifier::ResNet),
            Classifier::Vit(m) => m.with_drop_path(rate).map(Classifier::Vit),
        }
    }
    fn set_draw_key(&self, key: u64) {
        each_family!(self, m => m.set_draw_key(key))
    }
}

/// The model record in a checkpoint's bytes: a [`Classifier`]'s, or a bare ResNet's as
/// checkpoints held it before model families were one type (read as that ResNet).
///
/// # Errors
/// The recorder's error when the bytes fit neither.
pub fn load_model_record<B: Backend>(bytes: &[u8], device: &B::Device) -> Result<ClassifierRecord<B>, RecorderError> {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    match crate::guard::decode(|| recorder.load::<ClassifierRecord<B>>(bytes.to_vec(), device)) {
        Ok(record) => Ok(record),
        Err(e) => crate::guard::decode(|| {
            recorder.load::<ResNetRecord<B>>(bytes.to_vec(), device).map(ClassifierRecord::ResNet)
        })
        .map_err(|_| e),
    }
}

/// `model` with the model record in a checkpoint's `bytes` loaded into it.
///
/// # Errors
/// Why the bytes are no record, or do not fit `model` (Burn panics on a record of another
/// structure, which a crafted file under a valid checksum can be; that panic becomes the error).
pub fn with_model_record<B: Backend>(
    model: Classifier<B>,
    bytes: &[u8],
    device: &B::Device,
) -> Result<Classifier<B>, String> {
    let record = load_model_record::<B>(bytes, device).map_err(|e| e.to_string())?;
    crate::guard::catch_panic(|| model.load_record(record))
}
