//! Everything of the GPU layers that exists only on burn-cuda: the cuDNN, cuBLAS and nvJPEG
//! bindings (raw device addresses only), our own kernels (cubecl and NVRTC), the autodiff operations the
//! portable layers call, and the runtime that hands burn's buffers to them and orders their
//! work with burn's stream on the device.

pub mod cublas;
pub mod cublas_lt;
pub mod cudnn;
pub mod gemm_layout;
pub(crate) mod kernels;
pub(crate) mod nvjpeg;
pub(crate) mod ops;
pub(crate) mod runtime;
pub use runtime::burn_stream;
