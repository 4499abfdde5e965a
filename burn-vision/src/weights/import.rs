//! PyTorch weights into a [`Classifier`]: the file's names matched against the model's under
//! PyTorch's conventions, every difference reported at once, then the tensors applied through
//! burn-store (which transposes `Linear` weights).
//!
//! Strict like `load_state_dict(strict=True)`: a missing, unexpected or wrongly shaped key is an
//! error listing the first few of each kind — except the classifier head when the file has
//! another class count, which is re-initialised (the fine-tuning case), and
//! `num_batches_tracked`, which burn's BatchNorm does not keep (its value is reported).

use super::names::{TorchName, torch_names};
use super::source::{self, Source};
use crate::error::{Error, Result};
use crate::model::classifier::Classifier;
use crate::model::image_classifier::ImageClassifier;
use burn::prelude::*;
use burn::tensor::DType;
use burn_store::{ModuleSnapshot, PyTorchToBurnAdapter, TensorSnapshot};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::rc::Rc;

/// What an import did.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportReport {
    /// Tensors copied into the model.
    pub loaded: usize,
    /// What wrapped the state dict in the file (`"state_dict.module."`, ...), empty for none.
    pub stripped: String,
    /// The family's naming scheme the file uses (`timm`, `torchvision`).
    pub names: &'static str,
    /// `(file's classes, model's classes)` when the head was left at its initialisation.
    pub head_reinitialised: Option<(usize, usize)>,
    /// The largest `num_batches_tracked` in the file.
    pub batches_tracked: Option<i64>,
    /// Element types converted to f32 on the way in (f16, bf16, f64 files).
    pub converted_from: Vec<String>,
}

impl std::fmt::Display for ImportReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} tensors loaded ({} names)", self.loaded, self.names)?;
        if !self.stripped.is_empty() {
            write!(f, " (state dict under `{}`)", self.stripped.trim_end_matches('.'))?;
        }
        if let Some((file, model)) = self.head_reinitialised {
            write!(f, "; the classifier head was re-initialised: the file has {file} classes, the model {model}")?;
        }
        if !self.converted_from.is_empty() {
            write!(f, "; converted {} to f32", self.converted_from.join(", "))?;
        }
        Ok(())
    }
}

/// The differences between a file and a model, PyTorch's names.
#[derive(Default)]
struct Mismatch {
    missing: Vec<String>,
    unexpected: Vec<String>,
    shapes: Vec<String>,
}

/// `items` for a one-line message: the first few, each escaped (a name read from a file may hold
/// a line break or other control characters).
fn listed(what: &str, items: &[String]) -> Option<String> {
    const SHOWN: usize = 4;
    (!items.is_empty()).then(|| {
        let more = if items.len() > SHOWN { format!(", … {} more", items.len() - SHOWN) } else { String::new() };
        let shown: Vec<String> = items[..items.len().min(SHOWN)].iter().map(|s| s.escape_debug().to_string()).collect();
        format!("{} {what} ({}{more})", items.len(), shown.join(", "))
    })
}

impl Mismatch {
    fn into_error(self, path: &Path, model: &str) -> Option<Error> {
        let parts: Vec<String> = [
            listed("missing", &self.missing),
            listed("unexpected", &self.unexpected),
            listed("wrongly shaped", &self.shapes),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!parts.is_empty()).then(|| Error::Weights {
            path: path.to_path_buf(),
            reason: format!("does not fit {model}: {}; pass the --model the weights were made for (torchvision/timm names expected)", parts.join("; ")),
        })
    }
}

/// Compares the file with the model. Returns the head names to skip (re-initialised).
fn compare(src: &Source, names: &BTreeMap<String, TorchName>, head: &[String]) -> (Mismatch, Vec<String>) {
    let mut m = Mismatch::default();
    let mut head_skip = Vec::new();
    for (torch, ours) in names {
        match src.tensors.get(torch) {
            None => m.missing.push(torch.clone()),
            Some(t) if t.shape != ours.snapshot.shape => {
                if head.contains(&ours.path) {
                    head_skip.push(torch.clone());
                } else {
                    m.shapes.push(format!(
                        "{torch}: file {:?}, model {:?}",
                        t.shape.as_slice(),
                        ours.snapshot.shape.as_slice()
                    ));
                }
            }
            Some(_) => {}
        }
    }
    let tracked = |k: &str| {
        k.strip_suffix(".num_batches_tracked").is_some_and(|bn| names.contains_key(&format!("{bn}.running_mean")))
    };
    m.unexpected = src.tensors.keys().filter(|k| !names.contains_key(*k) && !tracked(k)).cloned().collect();
    (m, head_skip)
}

/// `snapshot` under our `path`, read as f32.
fn renamed(snapshot: &TensorSnapshot, path: &str) -> TensorSnapshot {
    let data = snapshot.clone_data_fn();
    let convert = snapshot.dtype != DType::F32;
    let read = Rc::new(move || data().map(|d| if convert { d.convert_dtype(DType::F32) } else { d }));
    TensorSnapshot::from_closure(
        read,
        DType::F32,
        snapshot.shape.clone(),
        path.split('.').map(String::from).collect(),
        Vec::new(),
        Default::default(),
    )
}

fn largest_batches_tracked(src: &Source) -> Option<i64> {
    src.tensors
        .iter()
        .filter(|(k, _)| k.ends_with(".num_batches_tracked"))
        .filter_map(|(_, t)| t.to_data().ok()?.convert::<i64>().to_vec::<i64>().ok()?.first().copied())
        .max()
}

/// Loads the PyTorch weights at `path` into `model` (registry name `model_name`, for messages).
///
/// # Errors
/// [`Error::Weights`] for an unreadable file, or one whose keys or shapes do not fit the model
/// (all differences in one message), or a tensor that fails to load.
pub fn load_pretrained<B: Backend>(
    model: Classifier<B>,
    model_name: &str,
    path: &Path,
) -> Result<(Classifier<B>, ImportReport)> {
    // burn-store's readers may panic on bytes crafted against them (a pickle or a header that
    // lies); that is a bad weight file, not a crash.
    crate::guard::catch_panic(|| load_checked(model, model_name, path)).unwrap_or_else(|p| {
        Err(Error::Weights { path: path.to_path_buf(), reason: format!("not a readable weight file: {p}") })
    })
}

fn load_checked<B: Backend>(
    mut model: Classifier<B>,
    model_name: &str,
    path: &Path,
) -> Result<(Classifier<B>, ImportReport)> {
    let all = source::read_all(path)?;
    // The family's naming scheme (timm's, torchvision's) that fits the file best.
    // Most names found wins; on a tie the family's first scheme.
    let (_, scheme, names, src) = (0..model.torch_names().len())
        .map(|scheme| {
            let names = torch_names(&model, scheme);
            let (src, found) = source::locate(&all, &names.keys().cloned().collect::<HashSet<String>>());
            (found, scheme, names, src)
        })
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .expect("a family has at least one naming scheme");
    let head = model.head_params();
    let (mismatch, head_skip) = compare(&src, &names, &head);
    if let Some(e) = mismatch.into_error(path, model_name) {
        return Err(e);
    }
    let mut converted: Vec<String> = Vec::new();
    let snapshots: Vec<TensorSnapshot> = names
        .iter()
        .filter(|(torch, _)| !head_skip.contains(torch))
        .map(|(torch, ours)| {
            let t = &src.tensors[torch];
            let dtype = format!("{:?}", t.dtype).to_lowercase();
            if t.dtype != DType::F32 && !converted.contains(&dtype) {
                converted.push(dtype);
            }
            renamed(t, &ours.path)
        })
        .collect();
    let wanted = snapshots.len();
    let result = model.apply(snapshots, None, Some(Box::new(PyTorchToBurnAdapter)), true);
    if let Some(err) = result.errors.first() {
        return Err(Error::Weights { path: path.to_path_buf(), reason: format!("{err}") });
    }
    if result.applied.len() != wanted {
        return Err(Error::Weights {
            path: path.to_path_buf(),
            reason: format!(
                "only {} of {wanted} tensors applied (missing: {:?})",
                result.applied.len(),
                result.missing.first()
            ),
        });
    }
    let head_reinitialised = (!head_skip.is_empty()).then(|| {
        let classes_in = |shape: &[usize]| shape.first().copied().unwrap_or(0);
        let bias = head_skip.iter().find(|k| k.ends_with("bias")).or(head_skip.first()).expect("not empty");
        (classes_in(src.tensors[bias].shape.as_slice()), classes_in(names[bias].snapshot.shape.as_slice()))
    });
    let report = ImportReport {
        loaded: wanted,
        stripped: src.stripped.clone(),
        names: model.torch_names()[scheme].0,
        head_reinitialised,
        batches_tracked: largest_batches_tracked(&src),
        converted_from: converted,
    };
    Ok((model, report))
}
