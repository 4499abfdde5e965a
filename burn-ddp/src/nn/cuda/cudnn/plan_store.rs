//! Finalized cuDNN plans kept on disk between runs, so that a runtime-compiled engine (the fused
//! attention's, the layer norm's: seconds of compilation each) is compiled once per machine, not
//! once per process. Each plan is kept as cuDNN's own serialized form in the kernel cache
//! directory (`kernel_cache::dir()/cudnn-plans`), in a file named by a hash of cuDNN's version and
//! the graph's recipe (every tensor and operation the graph was built from), which the file
//! repeats and a load compares. Files are written whole (a temporary file, then a rename: ranks
//! may race to write the same plan); one that does not load is rebuilt and written again.

use crate::nn::cuda::cudnn::backend::{Desc, plan_from_json, plan_json};
use cudarc::cudnn::sys;
use std::path::PathBuf;

#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    cudnn: usize,
    recipe: String,
    plan: String,
}

fn cudnn_version() -> usize {
    // SAFETY: no arguments; the library is loaded (a handle exists when plans are built).
    unsafe { sys::cudnnGetVersion() }
}

fn path(recipe: &str) -> Option<PathBuf> {
    Some(
        crate::nn::runtime::kernel_cache::dir()?
            .join("cudnn-plans")
            .join(crate::nn::runtime::kernel_cache::cudnn_plan_file(cudnn_version(), recipe)),
    )
}

/// The plan built from `recipe` before, restored on `handle`'s device, and its workspace bytes;
/// `None` when none was kept (or caches are off, or it no longer loads: said once in the log).
pub(crate) fn load(handle: sys::cudnnHandle_t, recipe: &str) -> Option<(Desc, usize)> {
    let path = path(recipe)?;
    let text = std::fs::read_to_string(&path).ok()?;
    let stored: Stored = serde_json::from_str(&text)
        .map_err(|e| {
            log::warn!("cuDNN plan cache: {} is not a plan file ({e}); building the plan again", path.display())
        })
        .ok()?;
    if stored.cudnn != cudnn_version() || stored.recipe != recipe {
        return None;
    }
    match plan_from_json(handle, &stored.plan) {
        Ok(p) => {
            log::info!("cuDNN plan restored from {}", path.display());
            Some(p)
        }
        Err(e) => {
            log::warn!("cuDNN plan cache: {} does not load ({e}); building the plan again", path.display());
            None
        }
    }
}

/// Keeps `plan`, built from `recipe`, for the next process (nothing when caches are off or
/// cuDNN cannot serialize the plan's engine; a failed write is logged at debug level).
pub(crate) fn save(recipe: &str, plan: &Desc) {
    let (Some(path), Some(json)) = (path(recipe), plan_json(plan)) else { return };
    let stored = Stored { cudnn: cudnn_version(), recipe: recipe.to_string(), plan: json };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&tmp, serde_json::to_vec(&stored)?))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        log::debug!("cuDNN plan cache: cannot write {} ({e})", path.display());
    }
}
