//! A convolution filter reordered between burn's `[k, c, r, s]` (KCRS) and the channels-last
//! `[k, r, s, c]` (KRSC) cuDNN reads, and cast between the parameter's type and the
//! activations', in one pass (cubecl, on burn's stream).
//!
//! Without it a channels-last convolution casts its f32 filter to bf16 and then packs the
//! permuted view (two kernels, the cast one element per thread: a 3×3 filter's innermost
//! extent of 3 allows no wider loads), and its backward casts the filter gradient back and
//! copies it again: four passes per convolution and step, 0.72 ms of a ResNet-50 bf16 b256
//! step on an H200 (2026-12-04); two with this kernel.

use crate::nn::cuda::runtime::fusion_op::{Cube, packed};
use crate::nn::cuda::runtime::launch::empty_of;
use burn::tensor::DType;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// How many filters (or filter gradients) this kernel has reordered in this process (the GPU
/// check counts them).
pub fn calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

/// `output[k, p, ch] = input[k, ch, p]` when `to_krsc`, else `output[k, ch, p] = input[k, p, ch]`
/// (`p` the filter position, `r·s` of them), cast from `I` to `O`. One thread per output
/// element, so the writes are coalesced.
#[cube(launch)]
pub(crate) fn reorder_filter<I: Float, O: Float>(
    input: &Tensor<I>,
    output: &mut Tensor<O>,
    channels: u32,
    positions: u32,
    #[comptime] to_krsc: bool,
    #[define(I, O)] _dtypes: [StorageType; 2],
) {
    let i = ABSOLUTE_POS;
    if i >= output.len() {
        terminate!();
    }
    let c = channels as usize;
    let p = positions as usize;
    let per_filter = c * p;
    let start = (i / per_filter) * per_filter;
    let within = i % per_filter;
    let mut from = start;
    if comptime![to_krsc] {
        from += (within % c) * p + within / c;
    } else {
        from += (within % p) * c + within / p;
    }
    output[i] = O::cast_from(input[from]);
}

/// `w` (`[k, c, r, s]`, any float type) as a packed `[k, r, s, c]` buffer of `dtype`.
pub(crate) fn to_krsc(w: Cube, dtype: DType) -> Cube {
    let d = w.meta.shape().to_vec();
    let dims = [d[0], d[2], d[3], d[1]];
    run(w, dtype, &dims, d[1], d[2] * d[3], true)
}

/// `dw` (`[k, r, s, c]`) as a packed `[k, c, r, s]` buffer of `dtype` (the parameter's).
pub(crate) fn to_kcrs(dw: Cube, dtype: DType) -> Cube {
    let d = dw.meta.shape().to_vec();
    let dims = [d[0], d[3], d[1], d[2]];
    run(dw, dtype, &dims, d[3], d[1] * d[2], false)
}

fn run(input: Cube, dtype: DType, dims: &[usize; 4], channels: usize, positions: usize, to_krsc: bool) -> Cube {
    CALLS.fetch_add(1, Ordering::Relaxed);
    let input = packed(input);
    let output = empty_of(&input, dims, dtype);
    let elements: usize = dims.iter().product();
    let (count, dim) = super::one_thread_per_element(elements);
    reorder_filter::launch::<CudaRuntime>(
        &input.client,
        count,
        dim,
        input.clone().into_tensor_arg(),
        output.clone().into_tensor_arg(),
        channels as u32,
        positions as u32,
        to_krsc,
        [input.dtype.into(), dtype.into()],
    );
    output
}
