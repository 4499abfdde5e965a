//! A cast into a packed buffer (cubecl, on burn's stream): burn's cast keeps its input's layout
//! and allocates a pitched output, whose rows burn-cuda pads to a power of two of at least 16
//! bytes. A channels-last image batch has rows of 3 channels (6 bytes in bf16), so its cast
//! takes 2.7 times the batch's bytes, and a convolution must then pack it once more.

use crate::nn::cuda::runtime::fusion_op::Cube;
use crate::nn::cuda::runtime::launch::empty_of;
use burn::tensor::DType;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;

/// `output[i] = input[at(i)]`, cast from `I` to `O`: `output` packed row-major, `input` of the
/// same shape with any strides. One thread per output element, so the writes are coalesced.
#[cube(launch)]
pub(crate) fn cast_to_packed<I: Float, O: Float>(
    input: &Tensor<I>,
    output: &mut Tensor<O>,
    #[define(I, O)] _dtypes: [StorageType; 2],
) {
    let i = ABSOLUTE_POS;
    if i >= output.len() {
        terminate!();
    }
    let rank = output.rank();
    let mut rest = i;
    let mut from = 0;
    for k in 0..rank {
        let dim = rank - 1 - k;
        let extent = output.shape(dim);
        from += (rest % extent) * input.stride(dim);
        rest /= extent;
    }
    output[i] = O::cast_from(input[from]);
}

/// `x` as a packed row-major buffer of `dtype`: `x` itself when it already is one.
pub(crate) fn run(x: Cube, dtype: DType) -> Cube {
    if x.dtype == dtype {
        return crate::nn::cuda::runtime::fusion_op::packed(x);
    }
    let dims = x.meta.shape().to_vec();
    let output = empty_of(&x, &dims, dtype);
    let elements: usize = dims.iter().product();
    if elements == 0 {
        return output;
    }
    let (count, dim) = super::one_thread_per_element(elements);
    cast_to_packed::launch::<CudaRuntime>(
        &x.client,
        count,
        dim,
        x.clone().into_tensor_arg(),
        output.clone().into_tensor_arg(),
        [x.dtype.into(), dtype.into()],
    );
    output
}
