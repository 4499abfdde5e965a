//! Convolution + BatchNorm (+ ReLU) as one autodiff operation on `Autodiff<Cuda>`: one cuDNN
//! session forward (convolution, batch statistics, normalisation, ReLU) and one backward (ReLU
//! mask, batch-norm gradients, input and filter gradients). Against the two separate operations
//! it saves the host a third of the calls per block and keeps the convolution's output out of
//! burn's graph. On by default (`CudnnOptions::fuse_conv_bn` turns it off); any failure runs the separate
//! operations instead.

use crate::error::Result;
use crate::nn::cuda::cudnn::batch_norm as cudnn_bn;
use crate::nn::cuda::cudnn::convolution::{ConvShape, DataType, Direction, Pointers};
use crate::nn::cuda::ops::batch_norm::{Saved, backward_burn, backward_cudnn, checked_eps, float, update_running};
use crate::nn::cuda::runtime::launch::{
    Ad, BURN_RUNS, Prim, cast, dims4, empty, empty_f32, launch, packed_shape, register, require_f32, resolve_packed,
    same_data_type, warn_once,
};
use crate::nn::layers::BatchNorm;
use crate::nn::runtime::profile::{Phase, timed};
use crate::nn::settings::layout::Layout;
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::ConvOptions;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::tensor::CubeTensor;
use burn_cuda::Cuda;
use cubecl::cuda::CudaRuntime;
use std::any::Any;

/// Whether [`try_conv_bn`] can run for backend `B` (`Autodiff<Cuda>`, the fused path switched
/// on): callers hook the parameters for DDP's gradient reports only then, so a path not taken
/// leaves no hooks that never fire.
pub(crate) fn applies<B: Backend>() -> bool {
    let opts = crate::nn::settings::options::get();
    opts.batch_norm
        && opts.fuse_conv_bn
        && crate::nn::cuda::runtime::launch::cuda_backend::<B>() == Some(true)
        && crate::nn::cuda::runtime::launch::path_enabled()
}

/// `relu?(bn(conv(x, w)))` as one operation when `B` is `Autodiff<Cuda>` and fusion is on;
/// otherwise `x` comes back untouched. NCHW only (channels-last batch norms run on burn's
/// operations: see `batch_norm_nhwc`).
pub(crate) fn try_conv_bn<B: Backend>(
    w: Tensor<B, 4>,
    o: &ConvOptions<2>,
    bn: &BatchNorm<B>,
    x: Tensor<B, 4>,
    relu: bool,
) -> std::result::Result<Tensor<B, 4>, Tensor<B, 4>> {
    if !applies::<B>() {
        return Err(x);
    }
    match (bn as &dyn Any).downcast_ref::<BatchNorm<Ad>>() {
        Some(bn) => fused(cast(w), o, bn, cast(x), relu).map(cast).map_err(cast),
        None => Err(x),
    }
}

/// The convolution of packed NCHW `x` and KCRS `w`.
fn shape(dtype: DataType, x: [i32; 4], w: [i32; 4], o: &ConvOptions<2>) -> ConvShape {
    packed_shape(dtype, Layout::Nchw, x, w, o)
}

/// The forward session: `(conv output, block output, batch mean, inverse std)`.
fn forward(
    x: Prim,
    w: Prim,
    gamma: Prim,
    beta: Prim,
    o: &ConvOptions<2>,
    eps: f64,
    relu: bool,
) -> Result<(CubeTensor<CudaRuntime>, Prim, Prim, Prim)> {
    let client = x.client.clone();
    let sh = shape(same_data_type(&[&x, &w])?, dims4(&x.shape)?, dims4(&w.shape)?, o);
    let eps = checked_eps(eps)?;
    require_f32(&gamma, "gamma")?;
    require_f32(&beta, "beta")?;
    let (xc, wc, gc, bc) = timed(Phase::Prepare, || -> Result<_> {
        Ok((resolve_packed(x)?, resolve_packed(w)?, resolve_packed(gamma)?, resolve_packed(beta)?))
    })?;
    let yd = sh.y.map(|v| v as usize);
    let (yc, zc, mc, ic) = (empty(&xc, &yd), empty(&xc, &yd), empty_f32(&xc, &[yd[1]]), empty_f32(&xc, &[yd[1]]));
    let device = xc.device.index;
    // SAFETY: `launch` orders the session after the buffers' producers and before their next
    // users; extents by construction.
    let kind = ("conv_bn", sh.clone(), eps.to_bits(), relu);
    launch(&[&xc, &wc, &yc, &zc, &gc, &bc, &mc, &ic], kind, move |p, order| unsafe {
        crate::nn::cuda::cudnn::convolution::with_handle(device, order, |s| {
            s.convolve(Direction::Forward, &sh, Pointers { x: p[0], w: p[1], y: p[2] })?;
            cudnn_bn::forward_training_in(s.raw(), sh.dtype, sh.y, eps, relu, [p[2], p[3], p[4], p[5], p[6], p[7]])
        })
    })?;
    Ok((yc, register(&client, zc), register(&client, mc), register(&client, ic)))
}

#[derive(Debug)]
struct CudnnConvBn;

#[derive(Debug, Clone)]
struct FusedState {
    x: Prim,
    w: Prim,
    conv_out: CubeTensor<CudaRuntime>,
    bn: Saved,
    options: ConvOptions<2>,
}

impl Backward<Cuda, 4> for CudnnConvBn {
    type State = FusedState;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_w, node_gamma, node_beta] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        let s = ops.state;
        let (dx, dw, dgamma, dbeta) = backward_fused(&s, dy.clone(), node_x.is_some()).unwrap_or_else(|e| {
            warn_once("cuDNN convolution + batch norm backward (separate operations run instead)", &e, BURN_RUNS);
            separate_backward(&s, dy)
        });
        for (node, grad) in [(node_x, dx), (node_w, Some(dw)), (node_gamma, Some(dgamma)), (node_beta, Some(dbeta))] {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}

type Grads4 = (Option<Prim>, Prim, Prim, Prim);

fn backward_fused(s: &FusedState, dy: Prim, need_dx: bool) -> Result<Grads4> {
    let client = dy.client.clone();
    let sh = shape(same_data_type(&[&s.x, &s.w, &dy])?, dims4(&s.x.shape)?, dims4(&s.w.shape)?, &s.options);
    let relu = s.bn.y.is_some();
    let (xc, wc, dyc, gc, mc, ic) = timed(Phase::Prepare, || -> Result<_> {
        Ok((
            resolve_packed(s.x.clone())?,
            resolve_packed(s.w.clone())?,
            resolve_packed(dy)?,
            resolve_packed(s.bn.gamma.clone())?,
            resolve_packed(s.bn.mean.clone())?,
            resolve_packed(s.bn.inv_std.clone())?,
        ))
    })?;
    let zc = match &s.bn.y {
        Some(z) => timed(Phase::Prepare, || resolve_packed(z.clone()))?,
        None => s.conv_out.clone(),
    };
    let (xd, wd, yd) = (sh.x.map(|v| v as usize), sh.w.map(|v| v as usize), sh.y.map(|v| v as usize));
    let dz = if relu { empty(&xc, &yd) } else { s.conv_out.clone() };
    let (dconv, dgc, dbc) = (empty(&xc, &yd), empty_f32(&xc, &[yd[1]]), empty_f32(&xc, &[yd[1]]));
    let (dxc, dwc) = (empty(&xc, if need_dx { &xd } else { &[1] }), empty(&xc, &wd));
    let (device, eps) = (xc.device.index, s.bn.eps);
    let conv_out = &s.conv_out;
    // SAFETY: as in `forward`; dz is only written with ReLU (then it is a fresh buffer).
    let kind = ("conv_bn_backward", sh.clone(), eps.to_bits(), relu, need_dx);
    launch(
        &[&xc, &wc, conv_out, &zc, &dyc, &dz, &dconv, &gc, &dgc, &dbc, &mc, &ic, &dxc, &dwc],
        kind,
        move |p, order| unsafe {
            crate::nn::cuda::cudnn::convolution::with_handle(device, order, |st| {
                let dz = if relu { p[5] } else { 0 };
                cudnn_bn::backward_in(
                    st.raw(),
                    sh.dtype,
                    sh.y,
                    eps,
                    relu,
                    [p[2], p[3], p[4], dz, p[6], p[7], p[8], p[9], p[10], p[11]],
                )?;
                if need_dx {
                    st.convolve(Direction::BackwardData, &sh, Pointers { x: p[12], w: p[1], y: p[6] })?;
                }
                st.convolve(Direction::BackwardFilter, &sh, Pointers { x: p[0], w: p[13], y: p[6] })
            })
        },
    )?;
    let dx = need_dx.then(|| register(&client, dxc));
    Ok((dx, register(&client, dwc), register(&client, dgc), register(&client, dbc)))
}

/// The same gradients through the separate operations (each with its own fallback).
fn separate_backward(s: &FusedState, dy: Prim) -> Grads4 {
    let client = dy.client.clone();
    let bn = Saved { x: register(&client, s.conv_out.clone()), ..s.bn.clone() };
    let (dconv, dgamma, dbeta) = backward_cudnn(&bn, dy.clone()).unwrap_or_else(|_| backward_burn(&bn, dy));
    let (dx, dw) = crate::nn::cuda::ops::conv::backward_both(s.x.clone(), s.w.clone(), dconv, &s.options);
    (Some(dx), dw, dgamma, dbeta)
}

#[allow(clippy::result_large_err)]
fn fused(
    w: Tensor<Ad, 4>,
    o: &ConvOptions<2>,
    bn: &BatchNorm<Ad>,
    x: Tensor<Ad, 4>,
    relu: bool,
) -> std::result::Result<Tensor<Ad, 4>, Tensor<Ad, 4>> {
    let (gamma, beta) = (bn.gamma.val().into_primitive().tensor(), bn.beta.val().into_primitive().tensor());
    let (xp, wp) = (x.clone().into_primitive().tensor(), w.into_primitive().tensor());
    let (conv_out, z, mean, inv_std) = match forward(
        xp.primitive.clone(),
        wp.primitive.clone(),
        gamma.primitive.clone(),
        beta.primitive.clone(),
        o,
        bn.epsilon,
        relu,
    ) {
        Ok(v) => v,
        Err(e) => {
            warn_once("cuDNN convolution + batch norm (separate operations run instead)", &e, BURN_RUNS);
            return Err(x);
        }
    };
    update_running(bn, float(mean.clone()), float(inv_std.clone()));
    // `x` stands for the batch norm's input until a fallback registers the convolution's output.
    let saved = Saved {
        x: xp.primitive.clone(),
        y: relu.then(|| z.clone()),
        gamma: gamma.primitive.clone(),
        mean,
        inv_std,
        eps: bn.epsilon,
    };
    let state =
        FusedState { x: xp.primitive.clone(), w: wp.primitive.clone(), conv_out, bn: saved, options: o.clone() };
    let parents = [xp.node.clone(), wp.node.clone(), gamma.node.clone(), beta.node.clone()];
    let out = match CudnnConvBn.prepare::<NoCheckpointing>(parents).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, z),
        OpsKind::UnTracked(prep) => prep.finish(z),
    };
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}
