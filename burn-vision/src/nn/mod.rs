//! Layers and operations with faster device paths than burn's defaults: convolutions and batch
//! norms through cuDNN on burn-cuda, falling back to burn's kernels everywhere else.

pub mod batch_norm;
mod batch_norm_nhwc;
#[cfg(feature = "cuda")]
mod bn_nhwc_cuda;
#[cfg(feature = "cuda")]
mod bn_nhwc_kernels;
pub mod conv;
#[cfg(feature = "cuda")]
pub mod cudnn;
#[cfg(feature = "cuda")]
pub mod cudnn_bn;
#[cfg(feature = "cuda")]
mod cudnn_graph;
#[cfg(feature = "cuda")]
mod cudnn_bn_burn;
#[cfg(feature = "cuda")]
mod cudnn_burn;
#[cfg(feature = "cuda")]
mod cudnn_conv;
#[cfg(feature = "cuda")]
mod cudnn_conv_bn;
pub mod layout;
pub mod options;
pub mod precision;
pub mod profile;
pub mod reference;
#[cfg(feature = "cuda")]
mod device_thread;
#[cfg(feature = "cuda")]
mod fusion_op;
#[cfg(feature = "cuda")]
mod stream_bridge;
pub mod upload_batch;
#[cfg(feature = "cuda")]
mod upload;

pub use batch_norm::{batch_norm, conv_batch_norm};
pub use batch_norm_nhwc::batch_norm_nhwc;
#[cfg(feature = "cuda")]
pub use bn_nhwc_cuda::kernel_calls as nhwc_bn_kernel_calls;
pub use conv::{conv2d, forward_conv};
pub use layout::Layout;
pub use options::CudnnOptions;
pub use precision::Precision;
pub use profile::CudnnTimes;
pub use upload_batch::images_to_device;
