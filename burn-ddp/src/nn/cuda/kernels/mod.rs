//! Our own CUDA kernels: the channels-last batch norm, the filter reorder and the packed cast (cubecl), and the NVRTC-compiled sources
//! (the fused SGD step, the cross-entropy, DDP's bucket copies, the crop-and-resize of decoded
//! images and their pixel operations).

pub(crate) mod batch_norm_nhwc;
pub(crate) mod batch_norm_phases;
pub(crate) mod bucket_copy;
pub(crate) mod cast_packed;
pub(crate) mod crop_resize;
pub(crate) mod filter_reorder;
pub(crate) mod nvrtc;
pub(crate) mod pixel_ops;
