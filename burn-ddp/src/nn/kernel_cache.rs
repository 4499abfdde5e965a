//! Persistent caches for burn-cuda's own kernels, so a second run does not pay the first one's
//! cold start again: cubecl's autotune results and its compiled PTX, in a per-user directory
//! (not under `./target`, cubecl's default, which a run outside a Cargo project or in a fresh
//! checkout never finds), one sub-directory per GPU model and driver. cubecl's cache files are
//! append-only under a file lock, so concurrent ranks share them safely.
//!
//! [`configure`] must run before burn-cuda's first operation (first thing in `main`). A
//! `cubecl.toml` / `burn.toml` in the working directory or above wins, as cubecl documents;
//! `BURN_DDP_CACHE_DIR` moves the directory, `BURN_DDP_CACHE_DIR=off` leaves cubecl's defaults.

use std::path::{Path, PathBuf};

/// The cache root: `BURN_DDP_CACHE_DIR`, else `$XDG_CACHE_HOME/burn-ddp`, else
/// `$HOME/.cache/burn-ddp`; `None` when turned off or no home is known.
pub fn cache_root(var: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    match var("BURN_DDP_CACHE_DIR") {
        Some(v) if v == "off" || v == "0" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => var("XDG_CACHE_HOME").filter(|v| !v.is_empty()).map(PathBuf::from).or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache"))).map(|d| d.join("burn-ddp")),
    }
}

/// The sub-directory of one GPU model and driver: `NVIDIA-H200-cuda13000`.
pub fn device_key(gpu_name: &str, driver_version: i32) -> String {
    let name: String = gpu_name.trim().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '-' }).collect();
    format!("{name}-cuda{driver_version}")
}

/// Whether a cubecl configuration file sits in `dir` or above (cubecl reads it then).
fn cubecl_config_file(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().flat_map(|d| ["cubecl.toml", "CubeCL.toml", "burn.toml", "Burn.toml"].map(|f| d.join(f))).find(|p| p.is_file())
}

/// Points cubecl's autotune and PTX caches at `cache_root()/device_key()` (GPU 0's model)
/// and returns that directory; `None` (cubecl's defaults) without CUDA, without a driver,
/// when turned off, or when a cubecl configuration file decides. Call it once, before
/// burn-cuda's first operation; later calls return the first answer.
pub fn configure() -> Option<PathBuf> {
    static DONE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let var = |k: &str| std::env::var(k).ok();
        if let Some(file) = std::env::current_dir().ok().and_then(|d| cubecl_config_file(&d)) {
            log::info!("kernel caches: as {} says", file.display());
            return None;
        }
        let dir = cache_root(&var)?.join(device_key(&crate::device::gpu_name(0).ok()?, crate::device::driver_version().ok()?));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            log::warn!("kernel caches off: cannot create {} ({e})", dir.display());
            return None;
        }
        let set = set_cubecl_caches(&dir);
        if set {
            log::info!("kernel caches (autotune, PTX) in {}", dir.display());
        }
        set.then_some(dir)
    })
    .clone()
}

#[cfg(feature = "cuda")]
fn set_cubecl_caches(dir: &Path) -> bool {
    use cubecl::config::cache::CacheConfig;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    let mut config = CubeClRuntimeConfig::default().override_from_env();
    config.autotune.cache = CacheConfig::File(dir.to_path_buf());
    config.compilation.cache = Some(CacheConfig::File(dir.to_path_buf()));
    // `set` panics once cubecl has read its configuration: too late is a warning, not a crash.
    match std::panic::catch_unwind(|| CubeClRuntimeConfig::set(config)) {
        Ok(()) => true,
        Err(_) => {
            log::warn!("kernel caches: cubecl was already in use; call burn_ddp::nn::kernel_cache::configure() first thing in main");
            false
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn set_cubecl_caches(_dir: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_root_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        assert_eq!(cache_root(&env(&[("HOME", "/home/u")])), Some(PathBuf::from("/home/u/.cache/burn-ddp")));
        assert_eq!(cache_root(&env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/c")])), Some(PathBuf::from("/c/burn-ddp")));
        assert_eq!(cache_root(&env(&[("HOME", "/home/u"), ("BURN_DDP_CACHE_DIR", "/scratch/k")])), Some(PathBuf::from("/scratch/k")));
        assert_eq!(cache_root(&env(&[("HOME", "/home/u"), ("BURN_DDP_CACHE_DIR", "off")])), None);
        assert_eq!(cache_root(&env(&[])), None);
    }

    #[test]
    fn device_keys_are_file_names() {
        assert_eq!(device_key("NVIDIA H200 ", 13000), "NVIDIA-H200-cuda13000");
        assert_eq!(device_key("GeForce RTX 4090/x", 12080), "GeForce-RTX-4090-x-cuda12080");
    }

    #[test]
    fn a_cubecl_file_above_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(dir.path().join("a/cubecl.toml"), "").unwrap();
        assert_eq!(cubecl_config_file(&deep), Some(dir.path().join("a/cubecl.toml")));
    }
}
