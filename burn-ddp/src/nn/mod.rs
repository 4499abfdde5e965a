//! GPU layers: Burn modules and operations with faster device paths than burn-nn's —
//! convolutions on cuDNN, batch norms on cuDNN (NCHW) or our own CUDA kernels (channels-last),
//! the fused convolution + batch norm, the page-locked batch upload — on burn-cuda, and burn's
//! own operations on every other backend. Any Burn model can use them; they know nothing of
//! process groups (this layer sits beside `process_group` and never imports it).

pub mod batch_norm;
mod batch_norm_nhwc;
#[cfg(feature = "cuda")]
mod bn_nhwc_cuda;
#[cfg(feature = "cuda")]
mod bn_nhwc_kernels;
#[cfg(feature = "cuda")]
pub(crate) mod bn_nhwc_phases;
#[cfg(feature = "cuda")]
pub(crate) mod bucket_copy;
pub mod conv;
pub mod cross_entropy;
#[cfg(feature = "cuda")]
mod cross_entropy_cuda;
#[cfg(feature = "cuda")]
pub mod cublas;
#[cfg(feature = "cuda")]
mod cublas_matmul;
#[cfg(feature = "cuda")]
pub mod cudnn;
#[cfg(feature = "cuda")]
mod cudnn_attention;
#[cfg(feature = "cuda")]
mod cudnn_backend;
#[cfg(feature = "cuda")]
pub mod cudnn_bn;
#[cfg(feature = "cuda")]
mod cudnn_bn_burn;
#[cfg(feature = "cuda")]
mod cudnn_burn;
#[cfg(feature = "cuda")]
mod cudnn_conv;
#[cfg(feature = "cuda")]
mod cudnn_conv_bn;
#[cfg(feature = "cuda")]
mod cudnn_graph;
#[cfg(feature = "cuda")]
pub mod cudnn_ln;
#[cfg(feature = "cuda")]
mod cudnn_ln_burn;
#[cfg(feature = "cuda")]
mod cudnn_ops;
#[cfg(feature = "cuda")]
mod cudnn_plan_store;
#[cfg(feature = "cuda")]
pub mod cudnn_sdpa;
#[cfg(feature = "cuda")]
mod cudnn_types;
#[cfg(feature = "cuda")]
mod device_thread;
#[cfg(feature = "cuda")]
mod fusion_op;
pub mod gemm_layout;
pub mod kernel_cache;
pub mod layer_norm;
mod layers;
pub mod layout;
pub mod linear;
pub mod max_pool;
pub mod memory;
#[cfg(feature = "cuda")]
mod nvrtc;
pub mod options;
pub mod precision;
pub mod profile;
pub mod reference;
pub mod relu;
mod report;
pub mod sgd;
#[cfg(feature = "cuda")]
mod sgd_cuda;
mod sgd_rule;
#[cfg(feature = "cuda")]
pub(crate) mod side_stream;
#[cfg(feature = "cuda")]
mod stream_bridge;
#[cfg(feature = "cuda")]
mod upload;
pub mod upload_batch;

pub use batch_norm::{batch_norm, conv_batch_norm};
pub use batch_norm_nhwc::batch_norm_nhwc;
#[cfg(feature = "cuda")]
pub use bn_nhwc_cuda::kernel_calls as nhwc_bn_kernel_calls;
pub use conv::conv2d;
pub use cross_entropy::cross_entropy;
pub use layer_norm::layer_norm;
pub use layers::{BatchNorm, Conv2d};
pub use layout::Layout;
pub use linear::{attention, linear, matmul, self_attention};
pub use max_pool::max_pool2d;
pub use options::CudnnOptions;
pub use precision::Precision;
pub use profile::CudnnTimes;
pub use relu::relu;
pub use sgd::{FusedSgd, FusedSgdConfig};
pub use upload_batch::images_to_device;
