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

    /// The packed cast on burn-cuda, queued on burn-fusion's stream.
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;

    type B = Autodiff<Flex>;

    /// Off burn-cuda it is burn's cast: the permuted view's values in their order, and a
    /// gradient through it for a tensor that needs one.
    #[test]
    fn elsewhere_it_is_burns_cast_and_carries_the_gradient() {
        let device = Default::default();
        let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        let x = Tensor::<B, 1>::from_floats(values.as_slice(), &device).reshape([1, 2, 3, 4]).require_grad();
        let view = x.clone().permute([0, 2, 3, 1]);
        let y = cast_packed(view.clone(), FloatDType::F32);
        assert_eq!(y.dims(), [1, 3, 4, 2]);
        let expect: Vec<f32> = view.into_data().to_vec().expect("f32");
        assert_eq!(y.clone().into_data().to_vec::<f32>().expect("f32"), expect);
        let grads = (y * 3.0).sum().backward();
        let g: Vec<f32> = x.grad(&grads).expect("a gradient").into_data().to_vec().expect("f32");
        assert_eq!(g, vec![3.0; 24]);
    }
}
