//! PyTorch's reference logits for weight files (`benches/weights/make_weights.py` writes them
//! as `golden.json`), and the comparison the import proofs make: our eval-mode logits on the
//! same input against PyTorch's float64 ones.

use crate::error::{Error, Result};
use crate::model::classifier::ModelConfig;
use crate::model::image_classifier::ImageClassifier;
use crate::model::registry::model_config;
use crate::model::resnet::BlockKind;
use crate::model::resnet::ResNetConfig;
use crate::model::vit::VitConfig;
use burn::prelude::*;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One model of `golden.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct GoldenModel {
    /// Architecture tag (`tv_small_basic`, `tv_resnet50`, ...).
    pub arch: String,
    /// Classes.
    pub classes: usize,
    /// `[n, c, h, w]` of the input.
    pub input_shape: [usize; 4],
    /// Weight file, beside `golden.json`.
    pub file: String,
    /// PyTorch's float64 eval-mode logits, `[n][classes]`.
    pub logits: Vec<Vec<f64>>,
}

/// `golden.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Golden {
    /// By name.
    pub models: BTreeMap<String, GoldenModel>,
}

impl Golden {
    /// Reads `dir/golden.json`.
    ///
    /// # Errors
    /// [`Error::Weights`] when it is missing or malformed.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("golden.json");
        let text =
            std::fs::read_to_string(&path).map_err(|e| Error::Weights { path: path.clone(), reason: e.to_string() })?;
        serde_json::from_str(&text).map_err(|e| Error::Weights { path, reason: e.to_string() })
    }
}

/// Our config for an architecture tag of the script (the small ones: one block per stage,
/// widths 8 (timm: 64), 16, 32, 64, ImageNet stem).
///
/// # Errors
/// [`Error::UnknownModel`] for a tag this crate does not know.
pub fn arch_config(arch: &str, classes: usize, in_channels: usize) -> Result<ModelConfig> {
    Ok(family_config(arch, classes)?.with_in_channels(in_channels))
}

fn family_config(arch: &str, classes: usize) -> Result<ModelConfig> {
    let small = |block, first| {
        Ok(ModelConfig::ResNet(ResNetConfig::new(block, [1, 1, 1, 1], classes).with_widths([first, 16, 32, 64])))
    };
    match arch {
        "tv_small_basic" => small(BlockKind::Basic, 8),
        "tv_small_bottleneck" => small(BlockKind::Bottleneck, 8),
        // timm's plain stem is 64 wide whatever its stages are.
        "timm_small_basic" => small(BlockKind::Basic, 64),
        "tv_resnet50" | "timm_resnet50" => model_config("resnet50", classes),
        // timm's / torchvision's VisionTransformer class: patch 8 at 32², dim 32, 2 blocks, 2 heads.
        "timm_small_vit" | "tv_small_vit" => {
            Ok(ModelConfig::Vit(VitConfig::new(8, 32, 2, 2, classes).with_image_size(32)))
        }
        "timm_vit_s16" => model_config("vit_s16", classes),
        "tv_vit_b16" => model_config("vit_b16", classes),
        other => model_config(other, classes),
    }
}

/// The script's input: `x[i] = sin(0.37·i + 0.11)` over the flat NCHW index, computed in f64.
pub fn formula_input<B: Backend>(shape: [usize; 4], device: &B::Device) -> Tensor<B, 4> {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| (0.37 * i as f64 + 0.11).sin() as f32).collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// `max |ours − theirs| / max |theirs|` of `model`'s logits on the formula input.
pub fn logits_error<B: Backend, M: ImageClassifier<B>>(model: &M, golden: &GoldenModel, device: &B::Device) -> f64 {
    let logits = model.forward(formula_input::<B>(golden.input_shape, device));
    let ours = logits.into_data().convert::<f32>().to_vec::<f32>().expect("f32 logits");
    let theirs: Vec<f64> = golden.logits.iter().flatten().copied().collect();
    assert_eq!(ours.len(), theirs.len(), "logit count");
    let scale = theirs.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    ours.iter().zip(&theirs).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0, f64::max) / scale
}
