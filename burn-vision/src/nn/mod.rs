//! Layers and operations with faster device paths than burn's defaults: convolutions through
//! cuDNN on burn-cuda, falling back to burn's kernels everywhere else.

pub mod conv;
#[cfg(feature = "cuda")]
pub mod cudnn;
#[cfg(feature = "cuda")]
mod cudnn_burn;
pub mod options;
pub mod reference;

pub use conv::{conv2d, forward_conv};
pub use options::CudnnOptions;
