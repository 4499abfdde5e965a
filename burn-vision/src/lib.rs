//! Image classification on Burn: ResNet models, image-folder and IDX datasets, augmentation,
//! and a training / evaluation / prediction pipeline for the CPU and CUDA GPUs.

pub mod atomic_file;
pub mod cli;
pub mod data;
pub mod error;
pub mod guard;
pub mod model;
pub mod plot;
pub mod train;
pub mod weights;

pub use error::{Error, Result};

static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Marks the process's start (the CLI calls it first thing; otherwise the first call does).
pub fn mark_start() {
    START.get_or_init(std::time::Instant::now);
}

/// Seconds since [`mark_start`].
pub fn since_start() -> f64 {
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}
