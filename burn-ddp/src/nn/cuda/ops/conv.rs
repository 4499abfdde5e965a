//! cuDNN convolutions for burn-cuda tensors, as an autodiff operation whose forward and
//! backward are operations of burn-fusion's stream ([`crate::nn::cuda::runtime::fusion_op`]).
//!
//! `Autodiff<Cuda>` (training) and `Cuda` (inference) tensors are recognised by type at run
//! time, so models stay generic over `B: Backend`. The training thread only queues each
//! computation; on burn-fusion's thread it gets its buffers, the filter is cast to the
//! activations' type and reordered for `layout` once per forward (the backward reuses that
//! copy), and the cuDNN work is queued on cubecl's compute thread, ordered with burn's stream by
//! [`launch`]. When cuDNN refuses a shape or fails, that computation runs burn's kernels on the
//! same buffers instead, with one warning per cause.

use crate::error::{Error, Result};
use crate::nn::cuda::cudnn::convolution::{self as cudnn, ConvShape, Direction, Pointers};
use crate::nn::cuda::kernels::filter_reorder;
use crate::nn::cuda::runtime::fusion_op::{self, Cube, is_row_major, packed};
use crate::nn::cuda::runtime::launch::{
    Ad, BURN_RUNS, Inner, Prim, cast, data_type, dims4, empty, launch, packed_shape, same_data_type, warn_once,
};
use crate::nn::runtime::profile::{Phase, timed};
use crate::nn::runtime::report::note_path;
use crate::nn::settings::layout::Layout;
use burn::prelude::*;
use burn::tensor::ops::{ConvOptions, FloatTensorOps, ModuleOps};
use burn::tensor::{DType, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;
use std::sync::Arc;

/// `conv2d` through cuDNN when `B` is burn-cuda (with or without autodiff) and cuDNN is usable;
/// otherwise the inputs come back untouched. `x` and the output are in `layout`'s order
/// (for [`Layout::Nhwc`]: `[n, h, w, c]`); `w` is burn's `[k, c / groups, r, s]` in its own
/// element type (the computation runs in `x`'s; see [`crate::nn::cuda::ops::conv`]).
pub(crate) fn try_conv2d<B: Backend>(
    x: Tensor<B, 4>,
    w: Tensor<B, 4>,
    o: &ConvOptions<2>,
    layout: Layout,
) -> std::result::Result<Tensor<B, 4>, (Tensor<B, 4>, Tensor<B, 4>)> {
    let Some(ad) = crate::nn::cuda::runtime::launch::cuda_backend::<B>() else {
        return Err((x, w));
    };
    if !crate::nn::cuda::runtime::launch::path_enabled() {
        note_path(|| "burn's kernels (cuDNN disabled or libcudnn not found)".into());
        return Err((x, w));
    }
    note_path(|| format!("cuDNN {}", cudnn::version().unwrap_or(0)));
    conv2d_cuda(x, w, o, layout, ad).map_err(|(x, w, e)| {
        warn_once("cuDNN convolution", &e, BURN_RUNS);
        (x, w)
    })
}

/// `(dx, dw)` of a convolution in NCHW whose filter `w` is already in the activations' type
/// (the fused convolution + batch norm's fallback).
pub(crate) fn backward_both(x: Prim, w: Prim, dy: Prim, o: &ConvOptions<2>) -> (Prim, Prim) {
    let meta = (w.shape.clone(), w.dtype);
    match backward(x, w, dy, None, o, Layout::Nchw, meta, true, true) {
        (Some(dx), Some(dw)) => (dx, dw),
        _ => unreachable!("both gradients were asked for"),
    }
}

/// `conv2d` of `x` (in `layout`'s order) and `w` (burn's `[k, c / groups, r, s]`, any float
/// type) on cuDNN, in `x`'s element type, for `Autodiff<Cuda>` (`ad`) or `Cuda` tensors.
/// `Err` (before anything was queued) for what cuDNN cannot describe: the caller runs burn's
/// kernels.
pub(crate) fn conv2d_cuda<B: Backend>(
    x: Tensor<B, 4>,
    w: Tensor<B, 4>,
    o: &ConvOptions<2>,
    layout: Layout,
    ad: bool,
) -> std::result::Result<Tensor<B, 4>, (Tensor<B, 4>, Tensor<B, 4>, Error)> {
    crate::nn::cuda::runtime::device_thread::check_failure();
    if ad {
        let (xa, wa): (Tensor<Ad, 4>, Tensor<Ad, 4>) = (cast(x.clone()), cast(w.clone()));
        return autodiff_conv(xa, wa, o, layout).map(cast).map_err(|e| (x, w, e));
    }
    let (xc, wc): (Tensor<Cuda, 4>, Tensor<Cuda, 4>) = (cast(x.clone()), cast(w.clone()));
    match forward(xc.into_primitive().tensor(), wc.into_primitive().tensor(), o, layout) {
        Ok((y, _, _)) => Ok(cast(Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(y)))),
        Err(e) => Err((x, w, e)),
    }
}

/// What the backward pass needs: the input and the filter as cuDNN read them (the input
/// packed, the filter cast, reordered and packed: the backward packs neither again), and the
/// filter parameter's own shape and type (its gradient comes back in those).
#[derive(Debug, Clone)]
struct Saved {
    x: Prim,
    wk: Prim,
    w: (Shape, DType),
    options: ConvOptions<2>,
    layout: Layout,
}

#[derive(Debug)]
struct CudnnConv2d;

impl Backward<Cuda, 2> for CudnnConv2d {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        let s = ops.state;
        // The gradient `x` has from its other users so far (a ResNet stage's first block feeds
        // `x` to two convolutions): this one adds its share into it rather than beside it.
        let acc = node_x
            .as_ref()
            .and_then(|n| take_grad(grads, AdPrim { primitive: s.x.clone(), node: n.clone(), rc: Arc::new(n.id) }));
        let (dx, dw) = backward(s.x, s.wk, dy, acc, &s.options, s.layout, s.w, node_x.is_some(), node_w.is_some());
        for (node, grad) in [(node_x, dx), (node_w, dw)] {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}

/// An autodiff tensor (burn-autodiff names its type only through the backend).
type AdPrim = burn::tensor::ops::FloatTensor<Ad>;

/// The gradient registered so far for `key`'s node, taken out of `grads`, when it has the shape
/// and type of `key`'s tensor (what the convolution's input gradient has); otherwise it stays.
fn take_grad(grads: &mut Gradients, key: AdPrim) -> Option<Prim> {
    let g = grads.remove::<Cuda>(&key)?;
    if g.shape == key.primitive.shape && g.dtype == key.primitive.dtype {
        return Some(g);
    }
    grads.register::<Cuda>(key.node.id, g);
    None
}

fn autodiff_conv(x: Tensor<Ad, 4>, w: Tensor<Ad, 4>, o: &ConvOptions<2>, layout: Layout) -> Result<Tensor<Ad, 4>> {
    let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
    let w_meta = (w.primitive.shape.clone(), w.primitive.dtype);
    let (y, wk, xk) = forward(x.primitive.clone(), w.primitive.clone(), o, layout)?;
    let out = match CudnnConv2d.prepare::<NoCheckpointing>([x.node.clone(), w.node.clone()]).compute_bound().stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(Saved { x: xk, wk, w: w_meta, options: o.clone(), layout }, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// The convolution's description, from the tensors' metadata: `x` in `layout`'s order, `w`
/// KCRS of any float type (cuDNN gets it in `x`'s type).
fn describe(x: &Prim, w: &Shape, o: &ConvOptions<2>, layout: Layout) -> Result<ConvShape> {
    let dtype = data_type(x)?;
    let (xd, wd) = (layout.to_nchw(dims4(&x.shape)?), dims4(w)?);
    if xd[1] != wd[1] * o.groups as i32 {
        return Err(Error::Cudnn {
            op: "convolution",
            reason: format!("input has {} channels, the filter expects {} x groups={}", xd[1], wd[1], o.groups),
        });
    }
    Ok(packed_shape(dtype, layout, xd, wd, o))
}

fn shape_of(layout: Layout, nchw: [i32; 4]) -> Shape {
    Shape::from(layout.from_nchw(nchw).map(|v| v as usize).to_vec())
}

/// Queues the forward pass: `(y, the filter as cuDNN reads it, the input as cuDNN reads it)`.
/// The last is `x`'s own buffer unless `x` had to be packed (a pitched or strided input: a
/// 3-channel image in channels-last, whose rows burn-cuda pads to 16 bytes): the backward pass
/// keeps that copy, not `x`, and so packs nothing again.
fn forward(x: Prim, w: Prim, o: &ConvOptions<2>, layout: Layout) -> Result<(Prim, Prim, Prim)> {
    data_type(&w)?;
    let shape = describe(&x, &w.shape, o, layout)?;
    let dtype = x.dtype;
    let outputs = [(shape_of(layout, shape.y), dtype), (shape_of(layout, shape.w), dtype), fusion_op::like(&x)];
    let o = o.clone();
    let mut out = fusion_op::queue("cudnn_conv2d", vec![x, w], &outputs, move |ins| {
        let [x, w]: [Cube; 2] = ins.try_into().expect("two inputs");
        let wk = timed(Phase::Prepare, || pack_filter(w, dtype, layout));
        let (y, xk) = forward_cubes(x, &wk, &shape, &o, layout);
        vec![y, wk, xk]
    });
    let [y, wk, xk]: [Prim; 3] = std::array::from_fn(|_| out.remove(0));
    Ok((y, wk, xk))
}

/// `w` (KCRS, any float type) in `dtype`, reordered for `layout` (KRSC for channels-last), packed:
/// one kernel for channels-last with `CudnnOptions::filter_kernel`.
fn pack_filter(w: Cube, dtype: DType, layout: Layout) -> Cube {
    if layout == Layout::Nhwc && crate::nn::settings::options::get().filter_kernel {
        return filter_reorder::to_krsc(w, dtype);
    }
    packed(from_nchw(burn_cubecl::kernel::cast(w, dtype), layout))
}

/// A filter gradient in `layout`'s order back to KCRS in the parameter's `dtype` (one kernel
/// for channels-last with `CudnnOptions::filter_kernel`).
fn unpack_filter(dw: Cube, dtype: DType, layout: Layout) -> Cube {
    if layout == Layout::Nhwc && crate::nn::settings::options::get().filter_kernel {
        return filter_reorder::to_kcrs(dw, dtype);
    }
    burn_cubecl::kernel::cast(nchw(dw, layout), dtype)
}

/// A buffer in `layout`'s order viewed as NCHW (filters: KRSC as KCRS), and back.
fn nchw(t: Cube, layout: Layout) -> Cube {
    match layout {
        Layout::Nchw => t,
        Layout::Nhwc => <Inner as FloatTensorOps<Inner>>::float_permute(t, &[0, 3, 1, 2]),
    }
}

fn from_nchw(t: Cube, layout: Layout) -> Cube {
    match layout {
        Layout::Nchw => t,
        Layout::Nhwc => <Inner as FloatTensorOps<Inner>>::float_permute(t, &[0, 2, 3, 1]),
    }
}

/// `(y, the input as cuDNN read it)`.
fn forward_cubes(x: Cube, wk: &Cube, shape: &ConvShape, o: &ConvOptions<2>, layout: Layout) -> (Cube, Cube) {
    let (xc, x_strides) = input(x, shape);
    let y = cudnn_forward(&xc, x_strides, wk, shape).unwrap_or_else(|e| {
        warn_once("cuDNN convolution forward", &e, BURN_RUNS);
        from_nchw(
            <Inner as ModuleOps<Inner>>::conv2d(nchw(xc.clone(), layout), nchw(wk.clone(), layout), None, o.clone()),
            layout,
        )
    });
    (y, xc)
}

/// Input strides cuDNN may read `x` with: its own when it is a strided NCHW buffer and
/// packing is switched off, else packed (a copy when it is not).
fn input(x: Cube, shape: &ConvShape) -> (Cube, [i32; 4]) {
    let keep = !crate::nn::settings::options::get().pack_inputs && shape.layout == Layout::Nchw && !x.is_contiguous();
    let s = x.meta.strides().to_vec();
    if keep && s.len() == 4 && s.iter().all(|&v| v > 0 && v <= i32::MAX as usize) {
        return (x, [s[0] as i32, s[1] as i32, s[2] as i32, s[3] as i32]);
    }
    (timed(Phase::Prepare, || packed(x)), shape.x_strides)
}

fn cudnn_forward(xc: &Cube, x_strides: [i32; 4], wk: &Cube, shape: &ConvShape) -> Result<Cube> {
    let y = empty(xc, &shape.layout.from_nchw(shape.y).map(|v| v as usize));
    let shape = ConvShape { x_strides, ..shape.clone() };
    let device = xc.device.index;
    // SAFETY: `launch` orders the computation after the buffers' producers and before their
    // next users; their extents match `shape` by construction.
    launch(&[xc, wk, &y], ("conv", Direction::Forward, shape.clone()), move |p, order| unsafe {
        cudnn::run(device, Direction::Forward, &shape, Pointers { x: p[0], w: p[1], y: p[2] }, order)
    })?;
    Ok(y)
}

/// Queues the gradients the graph needs — `dx` in `x`'s order and type, `dw` in the
/// parameter's shape `w` (KCRS) and type — from `wk`, the filter the forward pass read. With
/// `acc` (a gradient `x` already has), `dx` comes back as `acc` plus this convolution's share:
/// added in place by cuDNN (β = 1) when this is `acc`'s last use and nothing else shares its
/// buffer, else added after.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    x: Prim,
    wk: Prim,
    dy: Prim,
    acc: Option<Prim>,
    o: &ConvOptions<2>,
    layout: Layout,
    w: (Shape, DType),
    need_dx: bool,
    need_dw: bool,
) -> (Option<Prim>, Option<Prim>) {
    assert!(acc.is_none() || need_dx, "an input gradient to add into, but none asked for");
    if !need_dx && !need_dw {
        return (None, None);
    }
    let shape = match describe(&x, &w.0, o, layout).and_then(|s| same_data_type(&[&x, &wk, &dy]).map(|_| s)) {
        Ok(s) => s,
        Err(e) => panic!("cuDNN convolution backward: {e} (the forward pass ran with these tensors)"),
    };
    let mut outputs = Vec::new();
    if need_dx {
        outputs.push(fusion_op::like(&x));
    }
    if need_dw {
        outputs.push(w.clone());
    }
    let o = o.clone();
    let inputs: Vec<Prim> = [x, wk, dy].into_iter().chain(acc).collect();
    let mut out = fusion_op::queue_owned("cudnn_conv2d_backward", inputs, &outputs, move |ins| {
        let mut ins = ins.into_iter();
        let [x, wk, dy] = [(); 3].map(|()| ins.next().expect("three inputs").0);
        let (dx, dw) = backward_cubes(x, packed(wk), dy, ins.next(), &shape, &o, need_dx, need_dw);
        dx.into_iter().chain(dw.map(|dw| unpack_filter(dw, w.1, layout))).collect()
    })
    .into_iter();
    let dx = need_dx.then(|| out.next().expect("declared"));
    (dx, need_dw.then(|| out.next().expect("declared")))
}

type Grads = (Option<Cube>, Option<Cube>);

/// The gradients on cuDNN (burn's kernels when it fails), `dx` plus `acc` when given: `acc` is
/// the gradient already there with whether this operation is its last user.
#[allow(clippy::too_many_arguments)]
fn backward_cubes(
    x: Cube,
    wk: Cube,
    dy: Cube,
    acc: Option<(Cube, bool)>,
    shape: &ConvShape,
    o: &ConvOptions<2>,
    need_dx: bool,
    need_dw: bool,
) -> Grads {
    let (x, dy) = timed(Phase::Prepare, || (packed(x), packed(dy)));
    if let Some((a, true)) = &acc
        && a.can_mut()
        && writable_as_dx(a, &x, shape)
    {
        match cudnn_backward(&x, &wk, &dy, Some(a), shape, need_dx, need_dw) {
            Ok(grads) => return grads,
            Err(e) => warn_once(
                "cuDNN convolution backward adding into the input's gradient",
                &e,
                "the gradients are added after",
            ),
        }
    }
    let (dx, dw) = cudnn_backward(&x, &wk, &dy, None, shape, need_dx, need_dw).unwrap_or_else(|e| {
        warn_once("cuDNN convolution backward", &e, BURN_RUNS);
        let layout = shape.layout;
        let (xn, wn, dyn_) = (nchw(x, layout), nchw(wk, layout), nchw(dy, layout));
        let dx = need_dx.then(|| {
            from_nchw(
                <Inner as ModuleOps<Inner>>::conv2d_x_backward(xn.clone(), wn.clone(), dyn_.clone(), o.clone()),
                layout,
            )
        });
        let dw = need_dw
            .then(|| from_nchw(<Inner as ModuleOps<Inner>>::conv2d_weight_backward(xn, wn, dyn_, o.clone()), layout));
        (dx, dw)
    });
    let dx = match (dx, acc) {
        (Some(dx), Some((a, _))) => Some(<Inner as FloatTensorOps<Inner>>::float_add(a, dx)),
        (dx, _) => dx,
    };
    (dx, dw)
}

/// Whether cuDNN may write the input gradient of `shape` straight into `t`: its dims, type and
/// packed strides are those of the buffer it would otherwise allocate (`x`'s type).
fn writable_as_dx(t: &Cube, x: &Cube, shape: &ConvShape) -> bool {
    let dims = dx_dims(shape);
    t.dtype == x.dtype && t.meta.shape().as_slice() == dims.as_slice() && is_row_major(&dims, t.meta.strides())
}

/// The input gradient's dims, in the layout's order.
fn dx_dims(shape: &ConvShape) -> [usize; 4] {
    shape.layout.from_nchw(shape.x).map(|v| v as usize)
}

/// Both gradients in one cuDNN job (one fence pair), or the one asked for. With `into`, the
/// input gradient is added into that buffer (cuDNN's β = 1) and it is returned as `dx`.
fn cudnn_backward(
    x: &Cube,
    wk: &Cube,
    dy: &Cube,
    into: Option<&Cube>,
    shape: &ConvShape,
    need_dx: bool,
    need_dw: bool,
) -> Result<Grads> {
    let layout = shape.layout;
    let dx = into.cloned().unwrap_or_else(|| empty(x, &dx_dims(shape)));
    let dw = empty(x, &layout.from_nchw(shape.w).map(|v| v as usize));
    let data_dir = if into.is_some() { Direction::BackwardDataAccumulate } else { Direction::BackwardData };
    let (device, sh) = (x.device.index, shape.clone());
    let kind = ("conv_backward", shape.clone(), need_dx, need_dw, data_dir);
    // SAFETY: as in `cudnn_forward`; dw is a fresh buffer, dx fresh or one no tensor but this
    // operation's output holds (`backward_cubes` checked), and only this job writes them.
    launch(&[x, wk, dy, &dx, &dw], kind, move |p, order| unsafe {
        let data = Pointers { x: p[3], w: p[1], y: p[2] };
        let filter = Pointers { x: p[0], w: p[4], y: p[2] };
        match (need_dx, need_dw) {
            (true, true) => cudnn::run_backward(device, &sh, data_dir, data, filter, order),
            (true, false) => cudnn::run(device, data_dir, &sh, data, order),
            _ => cudnn::run(device, Direction::BackwardFilter, &sh, filter, order),
        }
    })?;
    Ok((need_dx.then_some(dx), need_dw.then_some(dw)))
}
