//! A [`Classifier`] out as PyTorch weights — `.safetensors` or `.pth` (`torch.save` format) —
//! under torchvision's / timm's names, so that PyTorch loads them with
//! `load_state_dict(strict=True)`: BatchNorm `weight`/`bias`/`running_*` plus the
//! `num_batches_tracked` PyTorch keeps, `Linear` weights transposed back to `[out, in]`.
//! Parameters are written in f32 whatever the run's activation precision (they are f32 in
//! training too). The file is written atomically.

use super::names::ordered_torch_names;
use super::torch_save::{self, Entry, Storage};
use crate::atomic_file::write_atomic;
use crate::error::{Error, Result};
use crate::model::classifier::Classifier;
use crate::model::image_classifier::ImageClassifier;
use burn::prelude::*;
use burn::tensor::DType;
use std::path::Path;

/// The file format of an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// Hugging Face's safetensors (`safetensors.torch.load_file`).
    Safetensors,
    /// `torch.save`'s zip format (`torch.load`).
    Pth,
}

impl std::str::FromStr for WeightFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "safetensors" => Ok(Self::Safetensors),
            "pth" | "pt" => Ok(Self::Pth),
            other => Err(Error::InvalidConfig {
                name: "--format",
                value: other.into(),
                reason: "expected safetensors or pth".into(),
            }),
        }
    }
}

impl WeightFormat {
    /// The format a file name asks for (`.safetensors`, else `.pth`).
    pub fn for_path(path: &Path) -> Self {
        if path.extension().is_some_and(|e| e == "safetensors") { Self::Safetensors } else { Self::Pth }
    }
}

/// The model's state dict under PyTorch's names, in its order; every BatchNorm gets
/// `num_batches_tracked = batches_tracked`.
fn entries<B: Backend>(
    model: &Classifier<B>,
    (batches_tracked, scheme): (i64, usize),
    path: &Path,
) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for (torch, name) in ordered_torch_names(model, scheme) {
        let data = name.snapshot.to_data().map_err(|e| Error::Weights {
            path: path.to_path_buf(),
            reason: format!("reading {}: {e:?}", name.path),
        })?;
        let values = data.convert_dtype(DType::F32).to_vec::<f32>().expect("f32 after conversion");
        let bn_end = name.running_var.then(|| format!("{}num_batches_tracked", torch.trim_end_matches("running_var")));
        out.push(Entry {
            name: torch,
            storage: Storage::Float,
            shape: name.snapshot.shape.to_vec(),
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        });
        if let Some(name) = bn_end {
            out.push(Entry {
                name,
                storage: Storage::Long,
                shape: Vec::new(),
                bytes: batches_tracked.to_le_bytes().to_vec(),
            });
        }
    }
    Ok(out)
}

fn safetensors_bytes(entries: &[Entry]) -> std::result::Result<Vec<u8>, safetensors::SafeTensorError> {
    let views = entries
        .iter()
        .map(|e| {
            let dtype = if e.storage == Storage::Float { safetensors::Dtype::F32 } else { safetensors::Dtype::I64 };
            safetensors::tensor::TensorView::new(dtype, e.shape.clone(), &e.bytes).map(|v| (e.name.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(meta))
}

/// The index of the family's naming scheme `name` (`None`: the family's first).
///
/// # Errors
/// [`Error::InvalidConfig`] listing the family's schemes.
pub fn scheme_index<B: Backend>(model: &Classifier<B>, name: Option<&str>) -> Result<usize> {
    let schemes = model.torch_names();
    let Some(name) = name else { return Ok(0) };
    schemes.iter().position(|(n, _)| *n == name).ok_or_else(|| Error::InvalidConfig {
        name: "--names",
        value: name.into(),
        reason: format!(
            "this model's PyTorch names are {}",
            schemes.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        ),
    })
}

/// Writes `model` to `path` as PyTorch weights under its family's naming scheme `scheme`
/// ([`scheme_index`]). Returns the number of tensors written.
///
/// # Errors
/// [`Error::Weights`] when the tensors cannot be read or encoded, [`Error::Io`] when the file
/// cannot be written (nothing is left half-written).
pub fn export<B: Backend>(
    model: &Classifier<B>,
    path: &Path,
    format: WeightFormat,
    (batches_tracked, scheme): (i64, usize),
) -> Result<usize> {
    let entries = entries(model, (batches_tracked, scheme), path)?;
    let bytes = match format {
        WeightFormat::Safetensors => safetensors_bytes(&entries).map_err(|e| e.to_string()),
        WeightFormat::Pth => torch_save::to_bytes(&entries).map_err(|e| e.to_string()),
    }
    .map_err(|reason| Error::Weights { path: path.to_path_buf(), reason: format!("encoding: {reason}") })?;
    write_atomic(path, &bytes)?;
    Ok(entries.len())
}
