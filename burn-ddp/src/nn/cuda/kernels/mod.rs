//! Our own CUDA kernels: the channels-last batch norm (cubecl), and the NVRTC-compiled sources
//! (the fused SGD step, the cross-entropy, DDP's bucket copies).

pub(crate) mod batch_norm_nhwc;
pub(crate) mod batch_norm_phases;
pub(crate) mod bucket_copy;
pub(crate) mod nvrtc;
