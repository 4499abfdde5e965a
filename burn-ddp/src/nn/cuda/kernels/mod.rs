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

/// The launch shape of a cubecl kernel with one thread per element of `elements` (at least
/// one block): blocks of 256 threads along x.
pub(crate) fn one_thread_per_element(elements: usize) -> (cubecl::prelude::CubeCount, cubecl::prelude::CubeDim) {
    const BLOCK: u32 = 256;
    let blocks = elements.div_ceil(BLOCK as usize).max(1) as u32;
    (cubecl::prelude::CubeCount::Static(blocks, 1, 1), cubecl::prelude::CubeDim::new_1d(BLOCK))
}
