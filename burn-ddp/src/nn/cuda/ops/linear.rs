//! `Linear` on cuBLAS as one autodiff operation each way: `x · W + b` over `x`'s last axis,
//! whatever its rank, the f32 parameters cast to the activations' type inside the operation.
//!
//! Built from separate operations the same layer is a reshape of `x`, a cast of `W` and of `b`,
//! the product, the bias addition and a reshape back — six operations forward and six backward,
//! each a round trip from the training thread to burn-fusion's. A ViT-B/16 step at batch 128
//! spent most of its training thread's time in those round trips (host profile, 2026-12-04:
//! 90 % of its samples waiting in cubecl's channel, a third under reshape backward), and its
//! host set the pace. Here the training thread queues one operation forward and one backward;
//! the casts, views and products run inside them, on burn-fusion's thread. The numbers are the
//! separate operations' (the product in the activations' type with f32 accumulation, then the
//! bias; the parameter gradients computed in that type, then cast to f32).

use crate::nn::cuda::ops::matmul::{enabled, product, product_and_sums, product_bias, row_sums_of};
use crate::nn::cuda::runtime::fusion_op::{self, Cube, packed};
use crate::nn::cuda::runtime::launch::{Ad, Inner, Prim, cast, cuda_backend};
use burn::prelude::*;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, FloatDType, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;

/// The inputs, handed back when this path does not take them.
type Inputs<B, const D: usize> = (Tensor<B, 2>, Option<Tensor<B, 1>>, Tensor<B, D>);

/// `x · w + b` (`w` `[d_in, d_out]`, `b` `[d_out]`, both f32 or of `x`'s type) in `x`'s type on
/// cuBLAS when [`enabled`], `CudnnOptions::fused_linear` is on and the tensors suit it;
/// otherwise the inputs come back.
pub(crate) fn try_linear<B: Backend, const D: usize>(
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
    x: Tensor<B, D>,
) -> std::result::Result<Tensor<B, D>, Inputs<B, D>> {
    let [d_in, d_out] = w.dims();
    let param_type = |t: DType| t == DType::F32 || t == x.dtype();
    let suits = D >= 2
        && enabled::<B>()
        && crate::nn::settings::options::get().fused_linear
        && matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && x.dims()[D - 1] == d_in
        && x.shape().num_elements() > 0
        && param_type(w.dtype())
        && b.as_ref().is_none_or(|b| b.dims()[0] == d_out && param_type(b.dtype()));
    if !suits {
        return Err((w, b, x));
    }
    crate::nn::cuda::runtime::device_thread::check_failure();
    if cuda_backend::<B>() == Some(true) {
        let (w, b, x): (Tensor<Ad, 2>, Option<Tensor<Ad, 1>>, Tensor<Ad, D>) = (cast(w), b.map(cast), cast(x));
        return Ok(cast(autodiff_linear(w, b, x)));
    }
    let (w, b, x): (Tensor<Cuda, 2>, Option<Tensor<Cuda, 1>>, Tensor<Cuda, D>) = (cast(w), b.map(cast), cast(x));
    let prim = |t: Tensor<Cuda, 2>| -> Prim { t.into_primitive().tensor() };
    let (y, _) = forward(x.into_primitive().tensor(), prim(w), b.map(|b| b.into_primitive().tensor()));
    Ok(cast(Tensor::<Cuda, D>::from_primitive(TensorPrimitive::Float(y))))
}

#[derive(Debug)]
struct CublasLinear;

/// For the backward: the input, the weight in the activations' type (the forward's cast,
/// kept as PyTorch's autocast keeps its casts: one cast per layer and step, not two), and the
/// parameters' own types.
#[derive(Debug, Clone)]
struct Saved {
    x: Prim,
    w_cast: Prim,
    w_dtype: DType,
    b_dtype: Option<DType>,
}

/// Parents `x, w` and, when there is one, `b`.
impl<const P: usize> Backward<Cuda, P> for CublasLinear {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let dy = grads.consume::<Cuda>(&ops.node);
        let need: Vec<bool> = ops.parents.iter().map(Option::is_some).collect();
        let out = backward(ops.state, dy, [need[0], need[1], need.get(2) == Some(&true)]);
        for (node, grad) in ops.parents.into_iter().zip(out) {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}

fn autodiff_linear<const D: usize>(w: Tensor<Ad, 2>, b: Option<Tensor<Ad, 1>>, x: Tensor<Ad, D>) -> Tensor<Ad, D> {
    let (w, x) = (w.into_primitive().tensor(), x.into_primitive().tensor());
    let b = b.map(|b| b.into_primitive().tensor());
    let (y, w_cast) = forward(x.primitive.clone(), w.primitive.clone(), b.as_ref().map(|b| b.primitive.clone()));
    let saved = Saved {
        x: x.primitive.clone(),
        w_cast,
        w_dtype: w.primitive.dtype,
        b_dtype: b.as_ref().map(|b| b.primitive.dtype),
    };
    let out = match &b {
        Some(b) => track([&x, &w, b], saved, y),
        None => track([&x, &w], saved, y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

fn track<const P: usize>(parents: [&FloatTensor<Ad>; P], saved: Saved, y: Prim) -> FloatTensor<Ad> {
    match CublasLinear.prepare::<NoCheckpointing>(parents.map(|t| t.node.clone())).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(saved, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}

/// `t` in `dtype` (itself when it already is), on burn-fusion's thread.
fn to(t: Cube, dtype: DType) -> Cube {
    if t.dtype == dtype {
        return t;
    }
    let dtype = FloatDType::from(dtype);
    <Inner as FloatTensorOps<Inner>>::float_cast(t, dtype)
}

fn reshape(t: Cube, dims: &[usize]) -> Cube {
    <Inner as FloatTensorOps<Inner>>::float_reshape(t, Shape::from(dims.to_vec()))
}

/// Queues `x · w + b`, `[..., d_in]` → `[..., d_out]` in `x`'s type: the output and the weight
/// in that type (`w` itself when it already is).
fn forward(x: Prim, w: Prim, b: Option<Prim>) -> (Prim, Prim) {
    let (mut dims, dtype) = (x.shape.as_slice().to_vec(), x.dtype);
    let d_out = w.shape.as_slice()[1];
    let rank = dims.len();
    dims[rank - 1] = d_out;
    let (has_b, cast_w) = (b.is_some(), w.dtype != dtype);
    let same_w = (!cast_w).then(|| w.clone());
    let inputs: Vec<Prim> = [x, w.clone()].into_iter().chain(b).collect();
    let mut outputs = vec![(Shape::from(dims.clone()), dtype)];
    outputs.extend(cast_w.then(|| (w.shape.clone(), dtype)));
    let mut out = fusion_op::queue("cublas_linear", inputs, &outputs, move |ins| {
        let mut ins = ins.into_iter().map(packed);
        let (x, w) = (ins.next().expect("x"), to(ins.next().expect("w"), dtype));
        let d_in = w.meta.shape().as_slice()[0];
        let rows = x.meta.shape().num_elements() / d_in;
        let x = reshape(x, &[rows, d_in]);
        let y = match has_b.then(|| ins.next().expect("b")) {
            Some(b) => product_bias(x, w.clone(), packed(to(b, dtype))),
            None => product(x, false, w.clone(), false),
        };
        std::iter::once(reshape(y, &dims)).chain(cast_w.then_some(w)).collect()
    })
    .into_iter();
    let y = out.next().expect("the output");
    (y, out.next().or(same_w).expect("the weight, cast or not"))
}

/// Queues the gradients the graph needs, `[dx, dw, db]`: `dx = dy · wᵀ` in `x`'s type,
/// `dw = xᵀ · dy` and `db` (the sums of `dy`'s rows) in the activations' type, then in the
/// parameters' own.
fn backward(s: Saved, dy: Prim, [need_x, need_w, need_b]: [bool; 3]) -> Vec<Option<Prim>> {
    let (x_dims, w_dtype) = (s.x.shape.as_slice().to_vec(), s.w_dtype);
    let (d_in, d_out) = (s.w_cast.shape.as_slice()[0], s.w_cast.shape.as_slice()[1]);
    let b_dtype = s.b_dtype.filter(|_| need_b);
    let outputs: Vec<(Shape, DType)> = [
        need_x.then(|| fusion_op::like(&s.x)),
        need_w.then(|| (s.w_cast.shape.clone(), w_dtype)),
        b_dtype.map(|t| (Shape::new([d_out]), t)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if outputs.is_empty() {
        return vec![None, None, None];
    }
    let mut out = fusion_op::queue("cublas_linear_backward", vec![s.x, s.w_cast, dy], &outputs, move |ins| {
        let [x, w, dy]: [Cube; 3] = ins.into_iter().map(packed).collect::<Vec<_>>().try_into().expect("three inputs");
        let rows = x.meta.shape().num_elements() / d_in;
        let dy = reshape(dy, &[rows, d_out]);
        let dx = need_x.then(|| reshape(product(dy.clone(), false, w, true), &x_dims));
        let x = reshape(x, &[rows, d_in]);
        let (dw, db) = match (need_w, b_dtype) {
            // Both from one product where cuBLASLt can: the bias's gradient in its epilogue.
            (true, Some(t)) => {
                let (dw, db) = product_and_sums(x, true, dy);
                (Some(to(dw, w_dtype)), Some(to(db, t)))
            }
            (true, None) => (Some(to(product(x, true, dy, false), w_dtype)), None),
            (false, t) => (None, t.map(|t| to(row_sums_of(dy), t))),
        };
        dx.into_iter().chain(dw).chain(db).collect()
    })
    .into_iter();
    vec![
        need_x.then(|| out.next().expect("declared")),
        need_w.then(|| out.next().expect("declared")),
        b_dtype.map(|_| out.next().expect("declared")),
    ]
}
