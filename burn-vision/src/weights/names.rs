//! Our parameters under PyTorch's names (torchvision's and timm's): BatchNorm's and LayerNorm's `gamma`/`beta`
//! are `weight`/`bias`, `Linear`'s weight is transposed, and each model family rewrites what
//! its layouts name differently ([`ImageClassifier::torch_names`]: one or more schemes).

use crate::model::{Classifier, ImageClassifier};
use burn::prelude::*;
use burn_store::{ModuleSnapshot, TensorSnapshot};
use std::collections::BTreeMap;

/// One of our tensors, as PyTorch names it.
pub struct TorchName {
    /// Our path (`layer1.0.downsample.conv.weight`).
    pub path: String,
    /// Our shape.
    pub shape: Vec<usize>,
    /// PyTorch keeps it transposed (`Linear`'s `[out, in]` weight).
    pub transposed: bool,
    /// A BatchNorm's running mean: PyTorch keeps a `num_batches_tracked` beside it.
    pub running_mean: bool,
    /// The tensor (read lazily).
    pub snapshot: TensorSnapshot,
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
    let renames: Vec<(regex::Regex, &str)> = model.torch_names()[scheme].1.iter().map(|(re, to)| (regex::Regex::new(re).expect("a family's pattern"), *to)).collect();
    model
        .collect(None, None, true)
        .into_iter()
        .map(|snapshot| {
            let path = snapshot.full_path();
            let module = snapshot.module_type().unwrap_or_default();
            let (parent, param) = path.rsplit_once('.').unwrap_or(("", &path));
            let torch_param = match (module.as_str(), param) {
                ("Struct:BatchNorm" | "Struct:LayerNorm", "gamma") => "weight",
                ("Struct:BatchNorm" | "Struct:LayerNorm", "beta") => "bias",
                _ => param,
            };
            let mut torch = if parent.is_empty() { torch_param.to_string() } else { format!("{parent}.{torch_param}") };
            for (re, to) in &renames {
                torch = re.replace(&torch, *to).into_owned();
            }
            let name = TorchName {
                shape: snapshot.shape.to_vec(),
                transposed: module == "Struct:Linear" && param == "weight",
                running_mean: module == "Struct:BatchNorm" && param == "running_mean",
                path,
                snapshot,
            };
            (torch, name)
        })
        .collect()
}
