//! Persistent caches for burn-cuda's own kernels, so a second run does not pay the first one's
//! cold start again: cubecl's autotune results and its compiled PTX, in a per-user directory
//! (not under `./target`, cubecl's default, which a run outside a Cargo project or in a fresh
//! checkout never finds), one sub-directory per GPU model and driver. cubecl's cache files are
//! append-only under a file lock, so concurrent ranks share them safely.
//!
//! [`configure`] must run before burn-cuda's first operation (first thing in `main`). A
//! `cubecl.toml` / `burn.toml` in the working directory or above wins, as cubecl documents;
//! `BURN_DDP_CACHE_DIR` moves the directory, `BURN_DDP_CACHE_DIR=off` leaves cubecl's defaults.
//! cuDNN's finalized plans are kept there too (`cudnn-plans/`). [`configure_with`] also chooses
//! cubecl's allocator ([`Allocator`], `BURN_DDP_ALLOCATOR`). `BURN_DDP_KERNEL_LOG=FILE`
//! appends every kernel cubecl compiles (name and CUDA source) and every autotune result to
//! FILE: what a fresh machine's first step compiles, and why. `BURN_DDP_MEMORY_LOG=FILE` appends
//! cubecl's memory log: every reservation's size, and the table of blocks by size each time a
//! new one is allocated (where the device memory goes, block by block).

use std::path::{Path, PathBuf};

/// The cache root: `BURN_DDP_CACHE_DIR`, else `$XDG_CACHE_HOME/burn-ddp`, else
/// `$HOME/.cache/burn-ddp`; `None` when turned off or no home is known.
pub fn cache_root(var: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    match var("BURN_DDP_CACHE_DIR") {
        Some(v) if v == "off" || v == "0" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => var("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
            .map(|d| d.join("burn-ddp")),
    }
}

/// The sub-directory of one GPU model and driver: `NVIDIA-H200-cuda13000`.
pub fn device_key(gpu_name: &str, driver_version: i32) -> String {
    let name: String = gpu_name
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '-' })
        .collect();
    format!("{name}-cuda{driver_version}")
}

/// Whether a cubecl configuration file sits in `dir` or above (cubecl reads it then).
fn cubecl_config_file(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .flat_map(|d| ["cubecl.toml", "CubeCL.toml", "burn.toml", "Burn.toml"].map(|f| d.join(f)))
        .find(|p| p.is_file())
}

static DONE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

/// The directory [`configure`] chose, once it has run (`None` before, or when caches are off).
pub fn dir() -> Option<PathBuf> {
    DONE.get().cloned().flatten()
}

/// Files and bytes under [`dir`]: what the kernel caches hold so far. Steady training steps
/// that compile and tune nothing new leave it as it was.
pub fn usage() -> Option<(usize, u64)> {
    fn walk(dir: &Path, total: &mut (usize, u64)) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => walk(&entry.path(), total),
                Ok(m) => *total = (total.0 + 1, total.1 + m.len()),
                Err(_) => {}
            }
        }
    }
    let mut total = (0, 0);
    walk(&dir()?, &mut total);
    Some(total)
}

/// How burn-cuda's memory is allocated (cubecl's memory management).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocator {
    /// cubecl's default: tensors sub-allocated from pages whose sizes follow the device's
    /// memory (on a 141 GB H200: 9 MB … 2.35 GB … 35 GB). Any freed space serves any later
    /// tensor that fits, so shapes may vary from step to step; but memory is reserved in steps
    /// of up to a page, 2–5 GiB more than a training step holds on an H200 (docs/benchmarks.md,
    /// 2026-12-02).
    Pages,
    /// One block per tensor, reused by tensors of the same size (cubecl's persistent pool for
    /// every allocation): what the step holds at its peak, no more — for training whose shapes
    /// repeat (a fixed batch and image size). A new size gets new blocks and the old ones stay
    /// reserved until [`memory::release_unused`](crate::nn::runtime::memory::release_unused) hands them
    /// back: call it when the shapes change (burn-vision does when the batch size changes and
    /// around validation).
    ExactSizes,
}

/// [`configure_with`] cubecl's default allocator ([`Allocator::Pages`]), for any model.
pub fn configure() -> Option<PathBuf> {
    configure_with(Allocator::Pages)
}

/// Points cubecl's autotune and PTX caches at `cache_root()/device_key()` (GPU 0's model)
/// and returns that directory, and sets cubecl's allocator (`allocator`, unless
/// `BURN_DDP_ALLOCATOR=exact|pages` says otherwise); `None` (cubecl's default caches) without
/// CUDA, without a driver, when turned off, or when a cubecl configuration file decides (then it
/// decides the allocator too). Call it once, before burn-cuda's first operation; later calls
/// return the first answer.
pub fn configure_with(allocator: Allocator) -> Option<PathBuf> {
    DONE.get_or_init(|| {
        let var = |k: &str| std::env::var(k).ok();
        if let Some(file) = std::env::current_dir().ok().and_then(|d| cubecl_config_file(&d)) {
            log::info!("kernel caches and allocator: as {} says", file.display());
            return None;
        }
        let device = crate::device::gpu_name(0).ok().zip(crate::device::driver_version().ok())?;
        let dir = cache_root(&var).map(|root| root.join(device_key(&device.0, device.1))).filter(|dir| {
            match std::fs::create_dir_all(dir) {
                Ok(()) => true,
                Err(e) => {
                    log::warn!("kernel caches off: cannot create {} ({e})", dir.display());
                    false
                }
            }
        });
        let allocator = chosen_allocator(&var, allocator);
        if !set_cubecl_config(dir.as_deref(), allocator) {
            return None;
        }
        match &dir {
            Some(d) => log::info!("kernel caches (autotune, PTX, cuDNN plans) in {}", d.display()),
            None => log::info!("kernel caches off"),
        }
        log::debug!("allocator: {allocator:?}");
        dir
    })
    .clone()
}

/// `BURN_DDP_ALLOCATOR` (`exact` or `pages`) if set, else `default`.
fn chosen_allocator(var: &dyn Fn(&str) -> Option<String>, default: Allocator) -> Allocator {
    match var("BURN_DDP_ALLOCATOR").as_deref() {
        None | Some("") => default,
        Some("exact") => Allocator::ExactSizes,
        Some("pages") => Allocator::Pages,
        Some(other) => {
            log::warn!("BURN_DDP_ALLOCATOR={other} is neither `exact` nor `pages`; using {default:?}");
            default
        }
    }
}

/// The file name of a cuDNN plan kept in `dir()/cudnn-plans` (`cuda::cudnn::plan_store`): a 64-bit
/// FNV-1a hash of cuDNN's version and the graph's recipe, the same across builds and Rust
/// versions.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn cudnn_plan_file(cudnn_version: usize, recipe: &str) -> String {
    format!("{:016x}.json", fnv1a(format!("cudnn {cudnn_version}\n{recipe}").as_bytes()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(feature = "cuda")]
fn set_cubecl_config(dir: Option<&Path>, allocator: Allocator) -> bool {
    use cubecl::config::cache::CacheConfig;
    use cubecl::config::memory::PersistentMemory;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    let mut config = CubeClRuntimeConfig::default().override_from_env();
    if let Some(dir) = dir {
        config.autotune.cache = CacheConfig::File(dir.to_path_buf());
        config.compilation.cache = Some(CacheConfig::File(dir.to_path_buf()));
    }
    if allocator == Allocator::ExactSizes {
        config.memory.persistent_memory = PersistentMemory::Enforced;
    }
    if let Some(file) = std::env::var_os("BURN_DDP_KERNEL_LOG").filter(|f| !f.is_empty()) {
        log_kernels(&mut config, PathBuf::from(file));
    }
    if let Some(file) = std::env::var_os("BURN_DDP_MEMORY_LOG").filter(|f| !f.is_empty()) {
        log_memory(&mut config, PathBuf::from(file));
    }
    // `set` panics once cubecl has read its configuration: too late is a warning, not a crash.
    match std::panic::catch_unwind(|| CubeClRuntimeConfig::set(config)) {
        Ok(()) => true,
        Err(_) => {
            log::warn!(
                "kernel caches and allocator: cubecl was already in use; call burn_ddp::nn::kernel_cache::configure() first thing in main"
            );
            false
        }
    }
}

/// cubecl's compilation log (each kernel's name and source) and autotune log (every
/// candidate's time) appended to `file`; its profiling log (every launch) stays off.
#[cfg(feature = "cuda")]
fn log_kernels(config: &mut cubecl::config::CubeClRuntimeConfig, file: PathBuf) {
    use cubecl::config::autotune::AutotuneLogLevel;
    use cubecl::config::compilation::CompilationLogLevel;
    log::info!("kernel log (compilations, autotune results) appended to {}", file.display());
    config.compilation.logger.level = CompilationLogLevel::Full;
    config.compilation.logger.file = Some(file.clone());
    config.compilation.logger.append = true;
    config.autotune.logger.level = AutotuneLogLevel::Full;
    config.autotune.logger.file = Some(file);
    config.autotune.logger.append = true;
}

/// cubecl's memory log at its fullest (each reservation and the pools' table at each new
/// block) appended to `file`.
#[cfg(feature = "cuda")]
fn log_memory(config: &mut cubecl::config::CubeClRuntimeConfig, file: PathBuf) {
    use cubecl::config::memory::MemoryLogLevel;
    log::info!("memory log (reservations, blocks by size) appended to {}", file.display());
    config.memory.logger.level = MemoryLogLevel::Full;
    config.memory.logger.file = Some(file);
    config.memory.logger.append = true;
}

#[cfg(not(feature = "cuda"))]
fn set_cubecl_config(_dir: Option<&Path>, _allocator: Allocator) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_root_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(cache_root(&env(&[("HOME", "/home/u")])), Some(PathBuf::from("/home/u/.cache/burn-ddp")));
        assert_eq!(
            cache_root(&env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/c")])),
            Some(PathBuf::from("/c/burn-ddp"))
        );
        assert_eq!(
            cache_root(&env(&[("HOME", "/home/u"), ("BURN_DDP_CACHE_DIR", "/scratch/k")])),
            Some(PathBuf::from("/scratch/k"))
        );
        assert_eq!(cache_root(&env(&[("HOME", "/home/u"), ("BURN_DDP_CACHE_DIR", "off")])), None);
        assert_eq!(cache_root(&env(&[])), None);
    }

    #[test]
    fn the_allocator_is_the_callers_unless_the_environment_says() {
        let env = |v: &'static str| move |k: &str| (k == "BURN_DDP_ALLOCATOR").then(|| v.to_string());
        assert_eq!(chosen_allocator(&|_: &str| None, Allocator::ExactSizes), Allocator::ExactSizes);
        assert_eq!(chosen_allocator(&|_: &str| None, Allocator::Pages), Allocator::Pages);
        assert_eq!(chosen_allocator(&env("exact"), Allocator::Pages), Allocator::ExactSizes);
        assert_eq!(chosen_allocator(&env("pages"), Allocator::ExactSizes), Allocator::Pages);
        assert_eq!(chosen_allocator(&env("bogus"), Allocator::Pages), Allocator::Pages);
    }

    #[test]
    fn cudnn_plan_files_are_named_by_fnv1a_of_version_and_recipe() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        let a = cudnn_plan_file(91000, "tensor 1 Buffer(1) bf16 [1, 2, 3, 4]");
        assert_eq!(a.len(), 16 + ".json".len());
        assert_ne!(a, cudnn_plan_file(91001, "tensor 1 Buffer(1) bf16 [1, 2, 3, 4]"));
        assert_ne!(a, cudnn_plan_file(91000, "tensor 1 Buffer(1) bf16 [1, 2, 3, 5]"));
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
