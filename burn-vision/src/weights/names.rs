//! Our parameters under PyTorch's names (torchvision's and timm's): burn-store's
//! `BurnToPyTorchAdapter` names BatchNorm's and LayerNorm's `gamma`/`beta` `weight`/`bias` and
//! transposes `Linear` weights to `[out, in]` (its `PyTorchToBurnAdapter` undoes both on
//! import), and each model family rewrites what its layouts name differently
//! ([`ImageClassifier::torch_names`]: one or more schemes).

use crate::model::classifier::Classifier;
use crate::model::image_classifier::ImageClassifier;
use burn::prelude::*;
use burn_store::{BurnToPyTorchAdapter, ModuleAdapter, ModuleSnapshot, TensorSnapshot};
use std::collections::BTreeMap;

/// One of our tensors, as PyTorch names it.
pub struct TorchName {
    /// Our path (`layer1.0.downsample.conv.weight`).
    pub path: String,
    /// The tensor in PyTorch's layout (read lazily; `shape` is PyTorch's).
    pub snapshot: TensorSnapshot,
    /// A BatchNorm's running variance, its last buffer: PyTorch keeps a `num_batches_tracked`
    /// after it.
    pub running_var: bool,
}

/// PyTorch's name of each tensor of `model` under the family's naming scheme `scheme`.
pub fn torch_names<B: Backend>(model: &Classifier<B>, scheme: usize) -> BTreeMap<String, TorchName> {
    ordered_torch_names(model, scheme).into_iter().collect()
}

/// As [`torch_names`], in the model's order (PyTorch's `state_dict` order for our layouts).
///
/// # Panics
/// If `scheme` is not one of the family's, or one of its patterns is not a regex.
pub fn ordered_torch_names<B: Backend>(model: &Classifier<B>, scheme: usize) -> Vec<(String, TorchName)> {
    let renames: Vec<(regex::Regex, &str)> = model.torch_names()[scheme]
        .1
        .iter()
        .map(|(re, to)| (regex::Regex::new(re).expect("a family's pattern"), *to))
        .collect();
    model
        .collect(None, None, true)
        .into_iter()
        .map(|ours| {
            let theirs = BurnToPyTorchAdapter.adapt(&ours);
            let mut torch = theirs.full_path();
            for (re, to) in &renames {
                torch = re.replace(&torch, *to).into_owned();
            }
            let running_var =
                ours.module_type().as_deref() == Some("Struct:BatchNorm") && torch.ends_with(".running_var");
            (torch, TorchName { path: ours.full_path(), snapshot: theirs, running_var })
        })
        .collect()
}
