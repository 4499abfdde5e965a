//! The autodiff operations of the GPU layers on burn-cuda, one per layer: each forward and
//! backward is an operation of burn-fusion's stream that runs cuDNN, cuBLAS or our kernels.

pub(crate) mod adamw;
pub(crate) mod attention;
pub(crate) mod batch_norm;
pub(crate) mod batch_norm_nhwc;
pub(crate) mod conv;
pub(crate) mod conv_batch_norm;
pub(crate) mod cross_entropy;
pub(crate) mod gelu;
pub(crate) mod layer_norm;
pub(crate) mod linear;
pub(crate) mod matmul;
pub(crate) mod sgd;
