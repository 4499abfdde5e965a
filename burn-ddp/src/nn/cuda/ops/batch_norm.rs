//! cuDNN batch normalization (+ optional ReLU) for burn-cuda tensors, as an autodiff operation.
//!
//! Training (`Autodiff<Cuda>`): one cuDNN call computes the batch statistics and the output,
//! one more the three gradients; burn's own BatchNorm takes 10+ kernels forward and more
//! backward. Running statistics follow burn's BatchNorm exactly (momentum blend of the batch
//! mean and *biased* variance). Inference (`Cuda`): the running statistics. When cuDNN refuses
//! (dtype, epsilon below its minimum, a failure), burn's BatchNorm runs instead, with one
//! warning per cause.

use crate::error::{Error, Result};
use crate::nn::cuda::cudnn::batch_norm::{self as cudnn_bn, MIN_EPSILON};
use crate::nn::cuda::runtime::launch::{
    Ad, BURN_RUNS, Prim, cast, data_type, dims4, empty, empty_f32, launch, register, require_f32, resolve_packed,
    same_data_type, warn_once,
};
use crate::nn::layers::BatchNorm;
use crate::nn::runtime::profile::{Phase, timed};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;
use std::any::Any;

/// `relu?(batch_norm(x))` through cuDNN when `B` is burn-cuda (with or without autodiff) and
/// cuDNN is usable; otherwise `x` comes back untouched. NCHW (channels-last batch norms never
/// come here: see `batch_norm_nhwc`).
pub(crate) fn try_batch_norm<B: Backend>(
    bn: &BatchNorm<B>,
    x: Tensor<B, 4>,
    relu: bool,
) -> std::result::Result<Tensor<B, 4>, Tensor<B, 4>> {
    let opts = crate::nn::settings::options::get();
    if !opts.batch_norm || !crate::nn::cuda::runtime::launch::path_enabled() {
        return Err(x);
    }
    if let Some(bn) = (bn as &dyn Any).downcast_ref::<BatchNorm<Ad>>() {
        return train(bn, cast(x), relu).map(cast).map_err(cast);
    }
    if let Some(bn) = (bn as &dyn Any).downcast_ref::<BatchNorm<Cuda>>() {
        return infer(bn, cast(x), relu).map(cast).map_err(cast);
    }
    Err(x)
}

pub(crate) fn float(t: Prim) -> Tensor<Cuda, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

pub(crate) fn checked_eps(eps: f64) -> Result<f64> {
    if eps < MIN_EPSILON {
        return Err(Error::Cudnn {
            op: "batch norm",
            reason: format!("epsilon {eps} is below cuDNN's minimum {MIN_EPSILON}"),
        });
    }
    Ok(eps)
}

/// `(y, batch mean, inverse std)`.
fn forward_training(x: Prim, gamma: Prim, beta: Prim, eps: f64, relu: bool) -> Result<(Prim, Prim, Prim)> {
    let client = x.client.clone();
    let dims = dims4(&x.shape)?;
    let eps = checked_eps(eps)?;
    let dt = data_type(&x)?;
    require_f32(&gamma, "gamma")?;
    require_f32(&beta, "beta")?;
    let (xc, gc, bc) = timed(Phase::Prepare, || -> Result<_> {
        Ok((resolve_packed(x)?, resolve_packed(gamma)?, resolve_packed(beta)?))
    })?;
    let c = dims[1] as usize;
    let (yc, mc, ic) = (empty(&xc, &dims.map(|v| v as usize)), empty_f32(&xc, &[c]), empty_f32(&xc, &[c]));
    // SAFETY: `launch` orders the work after the buffers' producers and before their next
    // users; extents by construction.
    let device = xc.device.index;
    launch(&[&xc, &yc, &gc, &bc, &mc, &ic], ("bn_train", dt, dims, eps.to_bits(), relu), move |p, order| unsafe {
        cudnn_bn::forward_training(device, dt, dims, eps, relu, [p[0], p[1], p[2], p[3], p[4], p[5]], order)
    })?;
    Ok((register(&client, yc), register(&client, mc), register(&client, ic)))
}

#[derive(Debug)]
struct CudnnBatchNorm;

/// What the backward pass needs: the input, the output (for ReLU's mask), γ and the saved
/// batch statistics.
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    pub(crate) x: Prim,
    pub(crate) y: Option<Prim>,
    pub(crate) gamma: Prim,
    pub(crate) mean: Prim,
    pub(crate) inv_std: Prim,
    pub(crate) eps: f64,
}

impl Backward<Cuda, 3> for CudnnBatchNorm {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        let s = ops.state;
        let (dx, dgamma, dbeta) = backward_cudnn(&s, dy.clone()).unwrap_or_else(|e| {
            warn_once("cuDNN batch-norm backward", &e, BURN_RUNS);
            backward_burn(&s, dy)
        });
        for (node, grad) in [(node_x, dx), (node_gamma, dgamma), (node_beta, dbeta)] {
            if let Some(node) = node {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}

pub(crate) fn backward_cudnn(s: &Saved, dy: Prim) -> Result<(Prim, Prim, Prim)> {
    let client = dy.client.clone();
    let dims = dims4(&s.x.shape)?;
    let relu = s.y.is_some();
    let dt = same_data_type(&[&s.x, &dy])?;
    let (xc, dyc, gc, mc, ic) = timed(Phase::Prepare, || -> Result<_> {
        Ok((
            resolve_packed(s.x.clone())?,
            resolve_packed(dy)?,
            resolve_packed(s.gamma.clone())?,
            resolve_packed(s.mean.clone())?,
            resolve_packed(s.inv_std.clone())?,
        ))
    })?;
    // Without ReLU the output is not needed: x stands in for it (and dz is x's extent, unused).
    let yc = match &s.y {
        Some(y) => timed(Phase::Prepare, || resolve_packed(y.clone()))?,
        None => xc.clone(),
    };
    let full = dims.map(|v| v as usize);
    let c = full[1];
    let dzc = if relu { empty(&xc, &full) } else { xc.clone() };
    let (dxc, dgc, dbc) = (empty(&xc, &full), empty_f32(&xc, &[c]), empty_f32(&xc, &[c]));
    let device = xc.device.index;
    // SAFETY: as in `forward_training`; dz is only written with ReLU (then it is a fresh buffer).
    let eps = s.eps;
    launch(
        &[&xc, &yc, &dyc, &dzc, &dxc, &gc, &dgc, &dbc, &mc, &ic],
        ("bn_backward", dt, dims, eps.to_bits(), relu),
        move |p, order| unsafe {
            let dz = if relu { p[3] } else { 0 };
            cudnn_bn::backward(
                device,
                dt,
                dims,
                eps,
                relu,
                [p[0], p[1], p[2], dz, p[4], p[5], p[6], p[7], p[8], p[9]],
                order,
            )
        },
    )?;
    Ok((register(&client, dxc), register(&client, dgc), register(&client, dbc)))
}

/// The same gradients with burn's kernels (when cuDNN fails after the forward pass ran),
/// computed in f32; the input gradient comes back in the input's element type.
pub(crate) fn backward_burn(s: &Saved, dy: Prim) -> (Prim, Prim, Prim) {
    let dtype = s.x.dtype;
    let t4 = |p: Prim| Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(p)).cast(burn::tensor::FloatDType::F32);
    let dy = t4(dy);
    let dz = match &s.y {
        Some(y) => dy.clone().mask_fill(t4(y.clone()).lower_equal_elem(0.0), 0.0),
        None => dy,
    };
    let [n, c, h, w] = dz.dims();
    let m = (n * h * w) as f64;
    let per_channel = |t: Tensor<Cuda, 1>| t.reshape([1, c, 1, 1]);
    let sum = |t: Tensor<Cuda, 4>| t.sum_dim(0).sum_dim(2).sum_dim(3).reshape([c]);
    let inv_std = per_channel(float(s.inv_std.clone()));
    let xhat = (t4(s.x.clone()) - per_channel(float(s.mean.clone()))) * inv_std.clone();
    let dbeta = sum(dz.clone());
    let dgamma = sum(dz.clone() * xhat.clone());
    let scale = per_channel(float(s.gamma.clone())) * inv_std / m;
    let dx = scale * (dz * m - per_channel(dbeta.clone()) - xhat * per_channel(dgamma.clone()));
    (dx.cast(dtype).into_primitive().tensor(), dgamma.into_primitive().tensor(), dbeta.into_primitive().tensor())
}

/// `Err` hands the input back for burn's BatchNorm.
#[allow(clippy::result_large_err)]
fn train(bn: &BatchNorm<Ad>, x: Tensor<Ad, 4>, relu: bool) -> std::result::Result<Tensor<Ad, 4>, Tensor<Ad, 4>> {
    let (gamma, beta) = (bn.gamma.val().into_primitive().tensor(), bn.beta.val().into_primitive().tensor());
    let xp = x.clone().into_primitive().tensor();
    let (y, mean, inv_std) =
        match forward_training(xp.primitive.clone(), gamma.primitive.clone(), beta.primitive.clone(), bn.epsilon, relu)
        {
            Ok(v) => v,
            Err(e) => {
                warn_once("cuDNN batch norm", &e, BURN_RUNS);
                return Err(x);
            }
        };
    update_running(bn, float(mean.clone()), float(inv_std.clone()));
    let saved = Saved {
        x: xp.primitive.clone(),
        y: relu.then(|| y.clone()),
        gamma: gamma.primitive.clone(),
        mean,
        inv_std,
        eps: bn.epsilon,
    };
    let out = match CudnnBatchNorm
        .prepare::<NoCheckpointing>([xp.node.clone(), gamma.node.clone(), beta.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(saved, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// burn's rule: `running = (1 - momentum) · running + momentum · batch`, with the biased
/// batch variance (recovered from cuDNN's `1 / sqrt(var + eps)`).
pub(crate) fn update_running(bn: &BatchNorm<Ad>, mean: Tensor<Cuda, 1>, inv_std: Tensor<Cuda, 1>) {
    let device = mean.device();
    let var = inv_std.powf_scalar(-2.0).sub_scalar(bn.epsilon).clamp_min(0.0);
    let m = bn.momentum;
    let blend = |running: Tensor<Ad, 1>, batch: Tensor<Cuda, 1>| {
        Tensor::<Ad, 1>::from_inner(running.inner().to_device(&device).mul_scalar(1.0 - m).add(batch.mul_scalar(m)))
    };
    bn.running_mean.update(blend(bn.running_mean.value_sync(), mean));
    bn.running_var.update(blend(bn.running_var.value_sync(), var));
}

/// `Err` hands the input back for burn's BatchNorm.
#[allow(clippy::result_large_err)]
fn infer(
    bn: &BatchNorm<Cuda>,
    x: Tensor<Cuda, 4>,
    relu: bool,
) -> std::result::Result<Tensor<Cuda, 4>, Tensor<Cuda, 4>> {
    let run = || -> Result<Tensor<Cuda, 4>> {
        let device = x.device();
        let prim = |t: Tensor<Cuda, 1>| t.to_device(&device).into_primitive().tensor();
        let xp: Prim = x.clone().into_primitive().tensor();
        let client = xp.client.clone();
        let dims = dims4(&xp.shape)?;
        let eps = checked_eps(bn.epsilon)?;
        let dt = data_type(&xp)?;
        let ins = [
            xp,
            prim(bn.gamma.val()),
            prim(bn.beta.val()),
            prim(bn.running_mean.value()),
            prim(bn.running_var.value()),
        ];
        for (t, what) in ins[1..].iter().zip(["gamma", "beta", "running mean", "running variance"]) {
            require_f32(t, what)?;
        }
        let [xc, gc, bc, mc, vc] = timed(Phase::Prepare, || -> Result<_> {
            let v = ins.into_iter().map(resolve_packed).collect::<Result<Vec<_>>>()?;
            Ok(<[_; 5]>::try_from(v).expect("five inputs"))
        })?;
        let yc = empty(&xc, &dims.map(|v| v as usize));
        // SAFETY: as in `forward_training`.
        let device = xc.device.index;
        launch(&[&xc, &yc, &gc, &bc, &mc, &vc], ("bn_infer", dt, dims, eps.to_bits(), relu), move |p, order| unsafe {
            cudnn_bn::forward_inference(device, dt, dims, eps, relu, [p[0], p[1], p[2], p[3], p[4], p[5]], order)
        })?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(register(&client, yc))))
    };
    run().map_err(|e| {
        warn_once("cuDNN batch norm (inference)", &e, BURN_RUNS);
        x
    })
}
