//! A weight file's tensors under their PyTorch names, read through burn-store (`.pth`/`.pt`
//! zip + pickle, `.safetensors`), whatever wraps the state dict: a top-level `state_dict` /
//! `model` / ... key (the tutorial's and timm's checkpoints) and DDP's `module.` prefix.

use crate::error::{Error, Result};
use burn_store::{ModuleStore, PytorchStore, SafetensorsStore, TensorSnapshot};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// The tensors of a weight file, keyed by their names inside the state dict.
pub struct Source {
    /// Name → tensor (lazily read).
    pub tensors: BTreeMap<String, TensorSnapshot>,
    /// What was stripped to reach the state dict: `""`, `"state_dict."`, `"module."`, ...
    pub stripped: String,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Weights { path: path.to_path_buf(), reason: reason.into() }
}

/// Every tensor of the file at `path`, names flattened with dots (nested dicts included).
///
/// # Errors
/// [`Error::Weights`] for a missing file or one neither reader accepts.
pub fn read_all(path: &Path) -> Result<BTreeMap<String, TensorSnapshot>> {
    let meta = std::fs::metadata(path)
        .map_err(|e| bad(path, format!("cannot read it ({e}); pass an existing .pth, .pt or .safetensors file")))?;
    if meta.is_dir() {
        return Err(bad(path, "is a folder; pass a .pth, .pt or .safetensors file"));
    }
    let mut magic = [0u8; 2];
    let is_zip = std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok()
        && &magic == b"PK";
    let safetensors = path.extension().is_some_and(|e| e == "safetensors") && !is_zip;
    let tensors = if safetensors {
        let mut store = SafetensorsStore::from_file(path);
        store.get_all_snapshots().cloned().map_err(|e| bad(path, format!("not a readable .safetensors file: {e}")))?
    } else {
        let mut store = PytorchStore::from_file(path).map_indices_contiguous(false);
        store.get_all_snapshots().cloned().map_err(|e| {
            bad(path, format!("not a readable PyTorch weight file (torch.save output): {}", first_line(&e.to_string())))
        })?
    };
    if tensors.is_empty() {
        return Err(bad(path, "holds no tensors; pass a state dict saved with torch.save or safetensors"));
    }
    Ok(tensors)
}

fn first_line(s: &str) -> String {
    s.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("").to_string()
}

/// Finds the state dict among a file's tensors (`all`, from [`read_all`]): the prefix (`""`, a
/// top-level key, and/or `module.`) under which most of `expected` (PyTorch names) are found.
/// Returns it with the number of expected names found.
pub fn locate(all: &BTreeMap<String, TensorSnapshot>, expected: &HashSet<String>) -> (Source, usize) {
    let mut prefixes: Vec<String> = vec![String::new()];
    for key in all.keys() {
        if let Some((first, _)) = key.split_once('.') {
            let p = format!("{first}.");
            if !prefixes.contains(&p) {
                prefixes.push(p);
            }
        }
    }
    let with_module: Vec<String> = prefixes.iter().map(|p| format!("{p}module.")).collect();
    prefixes.extend(with_module);
    let hits = |p: &String| {
        all.keys().filter(|k| k.strip_prefix(p.as_str()).is_some_and(|rest| expected.contains(rest))).count()
    };
    // The first best wins: the bare file before any wrapper.
    let mut best = (0, String::new());
    for p in &prefixes {
        let n = hits(p);
        if n > best.0 {
            best = (n, p.clone());
        }
    }
    let (found, stripped) = best;
    let tensors = all
        .iter()
        .filter_map(|(k, v)| k.strip_prefix(stripped.as_str()).map(|rest| (rest.to_string(), v.clone())))
        .collect();
    (Source { tensors, stripped }, found)
}
