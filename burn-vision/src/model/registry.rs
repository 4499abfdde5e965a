//! The model registry: names → configs, as timm's `create_model`.

use super::classifier::{Classifier, ModelConfig};
use super::resnet::ResNetConfig;
use super::vit::VitConfig;
use crate::error::{Error, Result};
use burn::prelude::*;

/// A registry entry: the model's config for a class count.
type Constructor = fn(usize) -> ModelConfig;

const MODELS: [(&str, Constructor); 11] = [
    ("resnet10-mini", |n| ModelConfig::ResNet(ResNetConfig::resnet10_mini(n))),
    ("resnet18", |n| ModelConfig::ResNet(ResNetConfig::resnet18(n))),
    ("resnet34", |n| ModelConfig::ResNet(ResNetConfig::resnet34(n))),
    ("resnet50", |n| ModelConfig::ResNet(ResNetConfig::resnet50(n))),
    ("resnet101", |n| ModelConfig::ResNet(ResNetConfig::resnet101(n))),
    ("resnet152", |n| ModelConfig::ResNet(ResNetConfig::resnet152(n))),
    ("vit-mini", |n| ModelConfig::Vit(VitConfig::new(4, 96, 6, 3, n).with_small_input(true))),
    ("vit_ti16", |n| ModelConfig::Vit(VitConfig::tiny(16, n))),
    ("vit_s16", |n| ModelConfig::Vit(VitConfig::small(16, n))),
    ("vit_b16", |n| ModelConfig::Vit(VitConfig::base(16, n))),
    ("vit_b32", |n| ModelConfig::Vit(VitConfig::base(32, n))),
];

/// Every registered model name.
pub fn list_models() -> Vec<&'static str> {
    MODELS.iter().map(|(name, _)| *name).collect()
}

/// The config registered under `name`, for `num_classes` classes.
///
/// # Errors
/// [`Error::UnknownModel`] listing the known names.
pub fn model_config(name: &str, num_classes: usize) -> Result<ModelConfig> {
    MODELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, make)| make(num_classes))
        .ok_or_else(|| Error::UnknownModel { name: name.to_string(), available: list_models().join(", ") })
}

/// Builds model `name` with `num_classes` outputs and `in_channels` inputs; `small_input`
/// switches to the 3×3 stem without max-pool (always on for `*-mini` models).
///
/// # Errors
/// [`Error::UnknownModel`] for a name not in the registry.
pub fn create<B: Backend>(
    name: &str,
    num_classes: usize,
    in_channels: usize,
    small_input: bool,
    device: &B::Device,
) -> Result<Classifier<B>> {
    Ok(model_config(name, num_classes)?.with_in_channels(in_channels).with_small_input(small_input).init(device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ImageClassifier;
    use burn_flex::Flex;

    #[test]
    fn every_registered_model_builds_and_runs() {
        let device = Default::default();
        for name in list_models() {
            for (channels, small, side) in [(3, false, 32), (1, true, 16)] {
                let model = create::<Flex>(name, 7, channels, small, &device).unwrap();
                let x = Tensor::<Flex, 4>::random(
                    [2, channels, side, side],
                    burn::tensor::Distribution::Normal(0.0, 1.0),
                    &device,
                );
                let y = model.forward(x);
                assert_eq!(y.dims(), [2, 7], "{name}");
                let values = y.into_data().to_vec::<f32>().unwrap();
                assert!(values.iter().all(|v| v.is_finite()), "{name}: non-finite logits");
            }
        }
    }

    #[test]
    fn torchvision_parameter_counts() {
        // torchvision: sum(p.numel() for p in resnetXX(num_classes=1000).parameters()), plus
        // the running mean and variance of every BatchNorm, which Burn counts as parameters
        // (sum(b.numel() for n, b in model.named_buffers() if "running" in n)).
        let device = Default::default();
        for (name, params, running) in [("resnet18", 11_689_512usize, 9_600usize), ("resnet50", 25_557_032, 53_120)] {
            let model = create::<Flex>(name, 1000, 3, false, &device).unwrap();
            assert_eq!(model.num_params(), params + running, "{name}");
        }
    }

    #[test]
    fn unknown_model_lists_known_ones() {
        let err = model_config("vgg16", 10).unwrap_err().to_string();
        assert!(err.contains("vgg16") && err.contains("resnet50"), "{err}");
    }
}
