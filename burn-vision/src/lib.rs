//! Image classification on Burn: ResNet models, image-folder and IDX datasets, augmentation,
//! and a training / evaluation / prediction pipeline for the CPU and CUDA GPUs.

pub mod atomic_file;
pub mod data;
pub mod error;
pub mod model;
pub mod train;
pub mod weights;

pub use error::{Error, Result};
