//! A cast whose result is packed, for a model's input batch.
//!
//! burn's cast keeps its input's layout in a pitched buffer: rows padded to a power of two of
//! at least 16 bytes. A channels-last batch of RGB images has rows of 3 values (6 bytes in
//! bf16), so `x.cast(bf16)` there writes 2.7 times the batch's bytes one value per thread, and
//! the first convolution copies it into a packed buffer before cuDNN reads it (2026-12-05, one
//! H100, ResNet-50 bf16 b256: 0.26 ms for the cast and 0.27 ms for each of the forward's and
//! the backward's copies, 1.9 % of the step).

use burn::prelude::*;
use burn::tensor::FloatDType;

/// `x.cast(dtype)` into a packed row-major buffer: on burn-cuda (with or without autodiff) one
/// kernel for a tensor that needs no gradient (an input batch), after which a convolution reads
/// it without a copy; elsewhere, or for a tensor that needs a gradient, burn's cast.
pub fn cast_packed<B: Backend, const D: usize>(x: Tensor<B, D>, dtype: FloatDType) -> Tensor<B, D> {
    #[cfg(feature = "cuda")]
    if !x.is_require_grad()
        && let Some(ad) = crate::nn::cuda::runtime::launch::cuda_backend::<B>()
    {
        use crate::nn::cuda::runtime::launch::{Ad, cast};
        return match ad {
            true => cast(Tensor::<Ad, D>::from_inner(cuda::cast_packed(cast::<_, Tensor<Ad, D>>(x).inner(), dtype))),
            false => cast(cuda::cast_packed(cast::<_, Tensor<burn_cuda::Cuda, D>>(x), dtype)),
        };
    }
    x.cast(dtype)
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::nn::cuda::kernels::cast_packed;
    use crate::nn::cuda::runtime::fusion_op;
    use burn::prelude::*;
    use burn::tensor::{DType, FloatDType, TensorPrimitive};
    use burn_cuda::Cuda;

    /// [`super::cast_packed`] on burn-cuda, queued on burn-fusion's stream.
    pub(super) fn cast_packed<const D: usize>(x: Tensor<Cuda, D>, dtype: FloatDType) -> Tensor<Cuda, D> {
        let x = x.into_primitive().tensor();
        let dtype: DType = dtype.into();
        let outputs = [(x.shape.clone(), dtype)];
        let mut out = fusion_op::queue("cast_packed", vec![x], &outputs, move |ins| {
            let [x]: [fusion_op::Cube; 1] = ins.try_into().expect("one input");
            vec![cast_packed::run(x, dtype)]
        });
        Tensor::from_primitive(TensorPrimitive::Float(out.pop().expect("one output")))
    }
}
