//! GPU layers: Burn modules and operations with faster device paths than burn-nn's —
//! convolutions on cuDNN, batch norms on cuDNN (NCHW) or our own CUDA kernels (channels-last),
//! the fused convolution + batch norm, the page-locked batch upload, JPEG batches decoded and
//! augmented on the device — on burn-cuda, and burn's
//! own operations on every other backend. Any Burn model can use them; they know nothing of
//! process groups (this layer sits beside `process_group` and never imports it).
//!
//! The portable face is this folder's files, one per layer, with `settings` (layout, precision,
//! cuDNN switches), `runtime` (kernel caches, memory reports, host-time counters) and `optim`
//! (the fused SGD). Everything that exists only on burn-cuda is under [`cuda`], behind the one
//! `feature = "cuda"` gate: the cuDNN and cuBLAS bindings, our kernels, the autodiff operations
//! and the plumbing that orders them with burn's stream.

pub mod batch_norm;
mod batch_norm_nhwc;
pub mod cast;
pub mod conv;
pub mod crop;
pub mod cross_entropy;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod decode;
pub mod jpeg;
pub mod layer_norm;
pub(crate) mod layers;
pub mod linear;
pub mod max_pool;
pub mod optim;
pub mod pixel_ops;
#[cfg(any(test, feature = "testing"))]
pub mod reference;
pub mod relu;
pub mod runtime;
pub mod settings;
pub mod upload;

pub use batch_norm::{batch_norm, batch_norm_add_relu, conv_batch_norm, conv_batch_norm_add_relu};
pub use batch_norm_nhwc::{batch_norm_add_relu_nhwc, batch_norm_nhwc};
pub use cast::cast_packed;
pub use conv::{conv2d, filter_kernel_calls};
pub use crop::{CropResize, Normalize, Pixels};
pub use cross_entropy::cross_entropy;
#[cfg(feature = "cuda")]
pub use cuda::ops::batch_norm_nhwc::kernel_calls as nhwc_bn_kernel_calls;
pub use decode::crops_to_device;
pub use layer_norm::layer_norm;
pub use layers::{BatchNorm, Conv2d};
pub use linear::{attention, bias_gelu, linear, linear_gelu, matmul, multi_head_self_attention, self_attention};
pub use max_pool::max_pool2d;
pub use optim::adamw::{FusedAdamW, FusedAdamWConfig};
pub use optim::sgd::{self, FusedSgd, FusedSgdConfig};
pub use pixel_ops::{Erase, PixelOp, PixelOps};
pub use relu::relu;
pub use runtime::profile::CudnnTimes;
pub use runtime::{kernel_cache, memory, profile};
pub use settings::layout::Layout;
pub use settings::options::CudnnOptions;
pub use settings::precision::Precision;
pub use settings::{layout, options, precision};
pub use upload::images_to_device;
