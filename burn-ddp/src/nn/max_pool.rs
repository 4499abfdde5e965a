//! 2-D max pooling that keeps only its indices for the backward. burn-autodiff's max-pool keeps
//! its input as well, though the backward reads nothing of it but its shape: for ResNet-50's
//! stem at batch 256 in bf16 that is a 411 MB tensor (the stem's ReLU output, which nothing
//! else keeps) alive from the forward to the end of the backward.

use burn::prelude::*;
use burn_nn::PaddingConfig2d;
use burn_nn::pool::MaxPool2d;

/// `pool.forward(x)`. On burn-cuda with autodiff and symmetric (or no) padding, the backward
/// keeps only the pooling's indices and `x`'s shape; elsewhere burn's max-pool as it is.
///
/// # Shapes
/// `[batch, channels, height, width]` → `[batch, channels, height_out, width_out]`
pub fn max_pool2d<B: Backend>(pool: &MaxPool2d, x: Tensor<B, 4>) -> Tensor<B, 4> {
    #[cfg(feature = "cuda")]
    if let (Some(true), Some(padding)) =
        (crate::nn::cuda::runtime::launch::cuda_backend::<B>(), symmetric_padding(&pool.padding))
    {
        let x: Tensor<crate::nn::cuda::runtime::launch::Ad, 4> = crate::nn::cuda::runtime::launch::cast(x);
        return crate::nn::cuda::runtime::launch::cast(cuda::max_pool2d(x, pool, padding));
    }
    pool.forward(x)
}

/// `[top, left]` when the padding is the same on both sides of each axis.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn symmetric_padding(padding: &PaddingConfig2d) -> Option<[usize; 2]> {
    match *padding {
        PaddingConfig2d::Valid => Some([0, 0]),
        PaddingConfig2d::Explicit(top, left, bottom, right) if top == bottom && left == right => Some([top, left]),
        _ => None,
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::nn::cuda::runtime::launch::Ad;
    use burn::prelude::*;
    use burn::tensor::ops::{FloatTensorOps, IntTensor, ModuleOps};
    use burn::tensor::{FloatDType, TensorPrimitive};
    use burn_autodiff::checkpoint::base::Checkpointer;
    use burn_autodiff::checkpoint::strategy::NoCheckpointing;
    use burn_autodiff::grads::Gradients;
    use burn_autodiff::ops::{Backward, Ops, OpsKind};
    use burn_cuda::Cuda;
    use burn_nn::pool::MaxPool2d;

    #[derive(Debug)]
    struct MaxPoolFromIndices;

    /// What the backward reads: the indices, the input's shape and type, the pooling's options.
    #[derive(Debug, Clone)]
    struct State {
        indices: IntTensor<Cuda>,
        shape: Shape,
        dtype: FloatDType,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    }

    impl Backward<Cuda, 1> for MaxPoolFromIndices {
        type State = State;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
            let [parent] = ops.parents;
            let grad = grads.consume::<Cuda>(&ops.node);
            let Some(parent) = parent else { return };
            let s = ops.state;
            // burn's backward takes the input for its shape and type only: a zero-stride view of
            // one zero stands in for it.
            let device = <Cuda as FloatTensorOps<Cuda>>::float_device(&grad);
            let one = <Cuda as FloatTensorOps<Cuda>>::float_zeros(Shape::new([1, 1, 1, 1]), &device, s.dtype);
            let stand_in = <Cuda as FloatTensorOps<Cuda>>::float_expand(one, s.shape);
            let dx = <Cuda as ModuleOps<Cuda>>::max_pool2d_with_indices_backward(
                stand_in,
                s.kernel,
                s.stride,
                s.padding,
                s.dilation,
                s.ceil_mode,
                grad,
                s.indices,
            )
            .x_grad;
            grads.register::<Cuda>(parent.id, dx);
        }
    }

    pub(crate) fn max_pool2d(x: Tensor<Ad, 4>, pool: &MaxPool2d, padding: [usize; 2]) -> Tensor<Ad, 4> {
        let x = x.into_primitive().tensor();
        let (shape, dtype) = (x.primitive.shape.clone(), x.primitive.dtype.into());
        let pooled = <Cuda as ModuleOps<Cuda>>::max_pool2d_with_indices(
            x.primitive,
            pool.kernel_size,
            pool.stride,
            padding,
            pool.dilation,
            pool.ceil_mode,
        );
        let state = State {
            indices: pooled.indices,
            shape,
            dtype,
            kernel: pool.kernel_size,
            stride: pool.stride,
            padding,
            dilation: pool.dilation,
            ceil_mode: pool.ceil_mode,
        };
        let out = match MaxPoolFromIndices.prepare::<NoCheckpointing>([x.node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(state, pooled.output),
            OpsKind::UnTracked(prep) => prep.finish(pooled.output),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;
    use burn_nn::pool::MaxPool2dConfig;

    type B = Autodiff<Flex>;

    /// Against the f64 reference (`reference::max_pool2d_f64`) of a 3×3 stride-2 pool with
    /// padding 1: the value and the gradient of `Σ w·y` (each output's weight lands on its
    /// window's maximum).
    #[test]
    fn matches_the_f64_reference() {
        let device = Default::default();
        let (h, w) = (5usize, 6usize);
        let xv: Vec<f32> = (0..h * w).map(|i| ((i * 37 + 11) % 31) as f32 - 15.0).collect();
        let pool = MaxPool2dConfig::new([3, 3])
            .with_strides([2, 2])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .init();
        let x = Tensor::<B, 1>::from_floats(xv.as_slice(), &device).reshape([1, 1, h, w]).require_grad();
        let y = max_pool2d(&pool, x.clone());
        let [_, _, ho, wo] = y.dims();
        let wv: Vec<f32> = (0..ho * wo).map(|i| i as f32 + 1.0).collect();
        let grads =
            (y.clone() * Tensor::<B, 1>::from_floats(wv.as_slice(), &device).reshape([1, 1, ho, wo])).sum().backward();
        let f64s = |v: &[f32]| v.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
        let (expect_y, expect_g) = crate::nn::reference::max_pool2d_f64(&f64s(&xv), [1, 1, h, w], 3, 2, 1, &f64s(&wv));
        let y: Vec<f64> = y.inner().into_data().to_vec::<f32>().expect("f32").into_iter().map(f64::from).collect();
        assert_eq!(y, expect_y);
        let g: Vec<f64> = x
            .grad(&grads)
            .expect("x's gradient")
            .into_data()
            .to_vec::<f32>()
            .expect("f32")
            .into_iter()
            .map(f64::from)
            .collect();
        assert_eq!(g, expect_g);
    }
}
