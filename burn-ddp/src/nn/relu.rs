//! ReLU whose backward reads its output. burn-autodiff's `relu` keeps its input for the
//! backward; where nothing else keeps that input — a residual block's `relu(out + identity)`,
//! whose sum exists only to be rectified — that is one more activation-sized tensor per block
//! held from the forward to the backward (2.6 GiB over ResNet-50's 16 blocks at batch 256 in
//! bf16). The output is kept anyway (the next layer's input), and `y > 0` exactly where
//! `x > 0`, so the gradient is the same. On burn-cuda with autodiff; burn's `relu` elsewhere.

use burn::prelude::*;

/// `max(x, 0)`, keeping only its output for the backward on burn-cuda.
pub fn relu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(feature = "cuda")]
    if crate::nn::cuda::runtime::launch::cuda_backend::<B>() == Some(true) {
        return crate::nn::cuda::runtime::launch::cast(cuda::relu::<D>(crate::nn::cuda::runtime::launch::cast(x)));
    }
    burn::tensor::activation::relu(x)
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::nn::cuda::runtime::launch::{Ad, Prim};
    use burn::prelude::*;
    use burn::tensor::TensorPrimitive;
    use burn::tensor::ops::ActivationOps;
    use burn_autodiff::checkpoint::base::Checkpointer;
    use burn_autodiff::checkpoint::strategy::NoCheckpointing;
    use burn_autodiff::grads::Gradients;
    use burn_autodiff::ops::{Backward, Ops, OpsKind};
    use burn_cuda::Cuda;

    #[derive(Debug)]
    struct ReluFromOutput;

    impl Backward<Cuda, 1> for ReluFromOutput {
        /// The forward's output.
        type State = Prim;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
            let [parent] = ops.parents;
            let grad = grads.consume::<Cuda>(&ops.node);
            if let Some(parent) = parent {
                // Zero where the output is ≤ 0, which is where the input is.
                grads.register::<Cuda>(parent.id, <Cuda as ActivationOps<Cuda>>::relu_backward(ops.state, grad));
            }
        }
    }

    pub(crate) fn relu<const D: usize>(x: Tensor<Ad, D>) -> Tensor<Ad, D> {
        let x = x.into_primitive().tensor();
        let y = <Cuda as ActivationOps<Cuda>>::relu(x.primitive);
        let out = match ReluFromOutput.prepare::<NoCheckpointing>([x.node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(y.clone(), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}
