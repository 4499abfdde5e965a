//! LayerNorm of bf16/f16 burn-cuda tensors on cuDNN ([`crate::nn::cuda::cudnn::layer_norm`]), as an autodiff
//! operation whose forward and backward are operations of burn-fusion's stream, ordered with
//! burn's stream on the device like the convolutions. Saved for the backward: the input in its
//! own type and two f32 values per row (mean, 1/σ) — not burn's f32 copies of every
//! intermediate.

use crate::grad_ready::param_val;
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::cudnn::layer_norm::{self as cudnn_ln, LnPointers, LnShape};
use crate::nn::cuda::cudnn::types::DataType;
use crate::nn::cuda::runtime::fusion_op::{self, Cube, dense};
use crate::nn::cuda::runtime::launch::{Ad, Prim, cast, cuda_backend, device_index, empty, empty_f32, launch};
use burn::prelude::*;
use burn::tensor::{DType, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;
use burn_nn::LayerNorm;

/// The problem of `x` (`[..., features]`) when cuDNN's path takes it: bf16/f16, features a
/// multiple of 8 (16-byte rows).
fn shape_of(dims: &[usize], dtype: DType, eps: f64) -> Option<LnShape> {
    let dtype = match dtype {
        DType::BF16 => DataType::Bf16,
        DType::F16 => DataType::F16,
        _ => return None,
    };
    let features = *dims.last()? as i64;
    let rows = dims[..dims.len() - 1].iter().product::<usize>() as i64;
    (features % 8 == 0 && rows > 0).then(|| LnShape { dtype, rows, features, eps_bits: (eps as f32).to_bits() })
}

/// `norm(x)` (ε = `eps`, the module's own: burn-nn keeps it private) on cuDNN when `B` is
/// burn-cuda, the path is on, the norm has a bias and cuDNN has plans for the shape; otherwise
/// `x` comes back.
pub(crate) fn try_layer_norm<B: Backend, const D: usize>(
    norm: &LayerNorm<B>,
    x: Tensor<B, D>,
    eps: f64,
) -> std::result::Result<Tensor<B, D>, Tensor<B, D>> {
    let opts = crate::nn::settings::options::get();
    // Off in deterministic mode: the backward sums dγ and dβ across blocks of rows.
    let on = cuda_backend::<B>().is_some()
        && crate::nn::cuda::runtime::launch::path_enabled()
        && opts.layer_norm
        && !opts.deterministic
        && norm.beta.is_some()
        && norm.gamma.val().dtype() == DType::F32;
    let Some(shape) = on.then(|| shape_of(&x.dims(), x.dtype(), eps)).flatten() else { return Err(x) };
    let device = device_index(&x);
    if let Err(e) = cudnn_ln::prepare(device, &shape) {
        crate::nn::cuda::runtime::launch::warn_once("cuDNN layer norm", &e, "burn's operations run instead, in f32");
        return Err(x);
    }
    crate::nn::cuda::runtime::device_thread::check_failure();
    let dims = x.dims();
    let gamma = param_val(&norm.gamma, &x);
    let beta = param_val(norm.beta.as_ref().expect("checked above"), &x);
    let x2 = x.reshape([shape.rows as usize, shape.features as usize]);
    let y: Tensor<B, 2> = if cuda_backend::<B>() == Some(true) {
        cast(autodiff_layer_norm(cast(x2), cast(gamma), cast(beta), shape))
    } else {
        let prim = |t: Tensor<Cuda, 2>| t.into_primitive().tensor();
        let (x2, g, b): (Tensor<Cuda, 2>, Tensor<Cuda, 1>, Tensor<Cuda, 1>) = (cast(x2), cast(gamma), cast(beta));
        let (y, _, _) = forward(prim(x2), g.into_primitive().tensor(), b.into_primitive().tensor(), shape);
        cast(Tensor::<Cuda, 2>::from_primitive(TensorPrimitive::Float(y)))
    };
    Ok(y.reshape(dims))
}

#[derive(Debug)]
struct FusedLayerNorm;

/// What the backward reads.
#[derive(Debug, Clone)]
struct Saved {
    x: Prim,
    gamma: Prim,
    mean: Prim,
    inv_var: Prim,
    shape: LnShape,
}

impl Backward<Cuda, 3> for FusedLayerNorm {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_g, node_b] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        let s = ops.state;
        let (dx, dg, db) = backward(s.x, s.gamma, s.mean, s.inv_var, dy, s.shape);
        for (node, grad) in [(node_x, dx), (node_g, dg), (node_b, db)] {
            if let Some(node) = node {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}

fn autodiff_layer_norm(x: Tensor<Ad, 2>, gamma: Tensor<Ad, 1>, beta: Tensor<Ad, 1>, shape: LnShape) -> Tensor<Ad, 2> {
    let (x, gamma, beta) =
        (x.into_primitive().tensor(), gamma.into_primitive().tensor(), beta.into_primitive().tensor());
    let (y, mean, inv_var) = forward(x.primitive.clone(), gamma.primitive.clone(), beta.primitive.clone(), shape);
    let parents = [x.node.clone(), gamma.node.clone(), beta.node.clone()];
    let out = match FusedLayerNorm.prepare::<NoCheckpointing>(parents).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            prep.finish(Saved { x: x.primitive, gamma: gamma.primitive, mean, inv_var, shape }, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Queues the forward: `y` (x's type) and the rows' mean and 1/σ (f32).
fn forward(x: Prim, gamma: Prim, beta: Prim, shape: LnShape) -> (Prim, Prim, Prim) {
    let rows = shape.rows as usize;
    let outputs = [fusion_op::like(&x), (Shape::new([rows]), DType::F32), (Shape::new([rows]), DType::F32)];
    let mut out = fusion_op::queue("cudnn_layer_norm", vec![x, gamma, beta], &outputs, move |ins| {
        let [x, gamma, beta]: [Cube; 3] = ins.try_into().expect("three inputs");
        let (x, gamma, beta) = (dense(x), dense(gamma), dense(beta));
        let (y, mean, inv_var) = (empty(&x, x.meta.shape().as_slice()), empty_f32(&x, &[rows]), empty_f32(&x, &[rows]));
        let device = x.device.index;
        // SAFETY: `launch` orders the computation after the buffers' producers and before their
        // next users; extents are `shape`'s (packed, checked); y, mean, inv_var are fresh.
        launch(&[&x, &gamma, &beta, &y, &mean, &inv_var], ("layer_norm_forward", shape), move |p, order| unsafe {
            let ptrs = LnPointers {
                x: p[0],
                scale: p[1],
                bias: p[2],
                y: p[3],
                mean: p[4],
                inv_var: p[5],
                ..Default::default()
            };
            cudnn::with_handle(device, order, |s| cudnn_ln::forward(s, device, &shape, &ptrs))
        })
        .unwrap_or_else(|e| {
            panic!("cuDNN layer norm failed after its plan was built: {e} (BURN_DDP_CUDNN_LN=0 runs burn's operations)")
        });
        vec![y, mean, inv_var]
    });
    let inv_var = out.pop().expect("three outputs");
    let mean = out.pop().expect("three outputs");
    (out.pop().expect("three outputs"), mean, inv_var)
}

/// Queues the backward: dx (x's type), dγ and dβ (f32).
fn backward(x: Prim, gamma: Prim, mean: Prim, inv_var: Prim, dy: Prim, shape: LnShape) -> (Prim, Prim, Prim) {
    let outputs = [fusion_op::like(&x), fusion_op::like(&gamma), fusion_op::like(&gamma)];
    let mut out = fusion_op::queue(
        "cudnn_layer_norm_backward",
        vec![x, gamma, mean, inv_var, dy],
        &outputs,
        move |ins| {
            let [x, gamma, mean, inv_var, dy]: [Cube; 5] = ins.try_into().expect("five inputs");
            let (x, gamma, mean, inv_var, dy) = (dense(x), dense(gamma), dense(mean), dense(inv_var), dense(dy));
            let features = [shape.features as usize];
            let (dx, dg, db) =
                (empty(&x, x.meta.shape().as_slice()), empty_f32(&x, &features), empty_f32(&x, &features));
            let device = x.device.index;
            // SAFETY: as the forward; dx, dγ, dβ are fresh.
            launch(&[&x, &gamma, &mean, &inv_var, &dy, &dx, &dg, &db], ("layer_norm_backward", shape), move |p, order| unsafe {
            let ptrs = LnPointers { x: p[0], scale: p[1], mean: p[2], inv_var: p[3], dy: p[4], dx: p[5], dscale: p[6], dbias: p[7], ..Default::default() };
            cudnn::with_handle(device, order, |s| cudnn_ln::backward(s, device, &shape, &ptrs))
        })
        .unwrap_or_else(|e| panic!("cuDNN layer norm backward failed after its plan was built: {e} (BURN_DDP_CUDNN_LN=0 runs burn's operations)"));
            vec![dx, dg, db]
        },
    );
    let db = out.pop().expect("three outputs");
    let dg = out.pop().expect("three outputs");
    (out.pop().expect("three outputs"), dg, db)
}
