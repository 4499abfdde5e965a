//! Channels-last batch norm (+ ReLU) on burn-cuda through our own kernels
//! ([`crate::nn::cuda::kernels::batch_norm_nhwc`]), as an autodiff operation.
//!
//! The kernels are launched through cubecl's client of the tensors' device, so they run on
//! burn's own stream, in order with burn's kernels: no fence, no host wait, no cuDNN. Each pass
//! (forward, backward, inference) is one operation of burn-fusion's stream
//! ([`crate::nn::cuda::runtime::fusion_op`]): the training thread queues it and never waits for a buffer. Training
//! (`Autodiff<Cuda>`): three kernels forward (partial sums, fold, normalise + ReLU), three
//! backward; running statistics follow burn's BatchNorm (momentum blend of the batch mean and
//! the biased variance). Inference (`Cuda`): one kernel with the running statistics. Anything
//! the kernels do not take (another element type, more than 2³¹ elements) comes back untouched
//! for burn's operations, with one warning per cause.

use crate::error::{Error, Result};
use crate::nn::cuda::kernels::batch_norm_nhwc as k;
use crate::nn::cuda::ops::batch_norm::float;
use crate::nn::cuda::runtime::fusion_op::{self, packed};
use crate::nn::cuda::runtime::launch::{Ad, BURN_RUNS, Prim, cast, empty, empty_f32, warn_once};
use crate::nn::layers::{BatchNorm, Epilogue};
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::tensor::CubeTensor;
use burn_cuda::Cuda;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::{CubeCount, CubeDim, TensorArg};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};

type Cube = CubeTensor<CudaRuntime>;

pub(crate) static CALLS: AtomicUsize = AtomicUsize::new(0);

/// How many channels-last batch norms (training forward, backward, inference) ran on the
/// kernels in this process (the GPU check counts them).
pub fn kernel_calls() -> usize {
    CALLS.load(Ordering::Relaxed)
}

/// Blocks of partial sums to aim for: about two waves of 256-thread blocks on a large GPU.
const TARGET_BLOCKS: usize = 2048;

/// `bn(x)` and its epilogue for channels-last `x` through the kernels when `B` is burn-cuda
/// (training statistics with autodiff, running statistics without) and
/// [`super::CudnnOptions::nhwc_bn_kernels`] is set; otherwise `x` and the epilogue come back
/// untouched.
#[allow(clippy::type_complexity)]
pub(crate) fn try_batch_norm<B: Backend>(
    bn: &BatchNorm<B>,
    x: Tensor<B, 4>,
    epilogue: Epilogue<Tensor<B, 4>>,
) -> std::result::Result<Tensor<B, 4>, (Tensor<B, 4>, Epilogue<Tensor<B, 4>>)> {
    if !crate::nn::settings::options::get().nhwc_bn_kernels {
        return Err((x, epilogue));
    }
    crate::nn::cuda::runtime::device_thread::check_failure();
    let fallback = |e: Error| warn_once("channels-last batch norm kernels", &e, BURN_RUNS);
    if let Some(bn) = (bn as &dyn Any).downcast_ref::<BatchNorm<Ad>>() {
        let (x, epilogue): (Tensor<Ad, 4>, _) = (cast(x), epilogue.map(cast));
        return train(bn, x.clone(), epilogue.clone()).map(cast).map_err(|e| {
            fallback(e);
            (cast(x), epilogue.map(cast))
        });
    }
    if let Some(bn) = (bn as &dyn Any).downcast_ref::<BatchNorm<Cuda>>() {
        let (x, epilogue): (Tensor<Cuda, 4>, _) = (cast(x), epilogue.map(cast));
        return infer(bn, x.clone(), epilogue.clone()).map(cast).map_err(|e| {
            fallback(e);
            (cast(x), epilogue.map(cast))
        });
    }
    Err((x, epilogue))
}

/// A residual's error when it does not match the input.
fn check_residual(x: &Prim, residual: Option<&Prim>) -> Result<()> {
    match residual {
        Some(r) if r.shape != x.shape || r.dtype != x.dtype => Err(Error::Kernel {
            op: "channels-last batch norm + residual",
            reason: format!("residual {:?} {:?} for input {:?} {:?}", r.shape, r.dtype, x.shape, x.dtype),
        }),
        _ => Ok(()),
    }
}

/// `(rows, channels)` of an `[n, h, w, c]` tensor the kernels take. (Its resolved buffer may
/// be one-dimensional — a packed copy of a strided view — so outputs take their shape from
/// the tensor, never from the buffer.)
pub(crate) fn extent(t: &Prim) -> Result<(usize, usize)> {
    let d = t.shape.as_slice();
    let fail = |reason: String| Err(Error::Kernel { op: "channels-last batch norm", reason });
    if d.len() != 4 || d.contains(&0) {
        return fail(format!("shape {d:?} is not 4-D and non-empty"));
    }
    if !matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16) {
        return fail(format!("{:?} activations (f32, bf16 and f16 are taken)", t.dtype));
    }
    let elems: usize = d.iter().product();
    if elems > i32::MAX as usize {
        return fail(format!("{elems} elements, more than the kernels' 32-bit indexing"));
    }
    Ok((d[0] * d[1] * d[2], d[3]))
}

pub(crate) fn require_f32(t: &Prim, what: &str) -> Result<()> {
    if t.dtype != DType::F32 {
        return Err(Error::Kernel {
            op: "channels-last batch norm",
            reason: format!("{what} is {:?}; parameters and statistics are f32", t.dtype),
        });
    }
    Ok(())
}

/// How a column-tile kernel covers `[rows, c]` (see `cuda::kernels::batch_norm_nhwc`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tiling {
    /// Channels per vector.
    pub n: usize,
    /// Channel vectors per row (`c / n`).
    pub cols: usize,
    pub tile_x: u32,
    pub tile_y: u32,
    /// Blocks of rows.
    pub groups: usize,
}

impl Tiling {
    /// The widest vector (up to 16 bytes of activations) that divides `c` and that every
    /// operand's buffer is aligned for (f32 statistics: `4·n` bytes); 256-thread blocks, up to
    /// 32 channel vectors wide; enough blocks of rows to fill the GPU.
    pub fn new(rows: usize, c: usize, elem_bytes: usize, operands: &[&Cube]) -> Self {
        let aligned =
            |n: usize| operands.iter().all(|t| t.handle.offset_start.unwrap_or(0).is_multiple_of((4 * n) as u64));
        let n = [8usize, 4, 2, 1]
            .into_iter()
            .find(|&n| n * elem_bytes <= 16 && c.is_multiple_of(n) && aligned(n))
            .unwrap_or(1);
        let cols = c / n;
        let tile_x = cols.next_power_of_two().min(32);
        let tile_y = 256 / tile_x;
        let groups = (TARGET_BLOCKS / cols.div_ceil(tile_x)).clamp(1, rows.div_ceil(tile_y));
        Self { n, cols, tile_x: tile_x as u32, tile_y: tile_y as u32, groups }
    }

    pub fn grid(&self) -> (CubeCount, CubeDim) {
        (
            CubeCount::Static(self.cols.div_ceil(self.tile_x as usize) as u32, self.groups as u32, 1),
            CubeDim::new_2d(self.tile_x, self.tile_y),
        )
    }
}

pub(crate) fn arg(t: &Cube) -> TensorArg<CudaRuntime> {
    t.clone().into_tensor_arg()
}

/// The training forward: `(y, mean, inv_std, new running mean, new running variance)`.
#[allow(clippy::too_many_arguments)]
fn forward_kernels(
    x: &Cube,
    residual: Option<&Cube>,
    shape: &Shape,
    [gamma, beta, running_mean, running_var]: [&Cube; 4],
    (rows, c): (usize, usize),
    eps: f64,
    momentum: f64,
    relu: bool,
) -> [Cube; 5] {
    CALLS.fetch_add(1, Ordering::Relaxed);
    let client = &x.client;
    let dt = x.dtype;
    let [mean, inv_std, new_mean, new_var] = [(); 4].map(|()| empty_f32(x, &[c]));
    let y = empty(x, shape.as_slice());
    let t = Tiling::new(rows, c, dt.size(), &[x, residual.unwrap_or(x), gamma, beta, &mean, &inv_std, &y]);
    let partials = empty_f32(x, &[2, t.groups, c]);
    let (count, dim) = t.grid();
    let (rows32, cols32, groups32) = (rows as u32, t.cols as u32, t.groups as u32);
    k::stats_partials::launch::<CudaRuntime>(
        client,
        count.clone(),
        dim,
        t.n,
        arg(x),
        arg(&partials),
        rows32,
        cols32,
        groups32,
        t.tile_x,
        t.tile_y,
        dt.into(),
    );
    let (fold_count, fold_dim, depth) = k::fold_launch(c);
    k::stats_finalize::launch::<CudaRuntime>(
        client,
        fold_count,
        fold_dim,
        arg(x),
        arg(&partials),
        arg(running_mean),
        arg(running_var),
        arg(&mean),
        arg(&inv_std),
        arg(&new_mean),
        arg(&new_var),
        rows32,
        c as u32,
        groups32,
        eps as f32,
        momentum as f32,
        depth,
        dt.into(),
    );
    k::normalize::launch::<CudaRuntime>(
        client,
        count,
        dim,
        t.n,
        arg(x),
        arg(residual.unwrap_or(x)),
        arg(&y),
        arg(&mean),
        arg(&inv_std),
        arg(gamma),
        arg(beta),
        rows32,
        cols32,
        groups32,
        t.tile_x,
        t.tile_y,
        relu,
        residual.is_some(),
        dt.into(),
    );
    [y, mean, inv_std, new_mean, new_var]
}

/// `y = relu?(γ·inv_std·(x − mean) + β [+ residual])` with given statistics (inference,
/// SyncBatchNorm); a residual needs `relu`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn normalize(
    x: &Cube,
    residual: Option<&Cube>,
    y: &Cube,
    mean: &Cube,
    inv_std: &Cube,
    gamma: &Cube,
    beta: &Cube,
    (rows, c): (usize, usize),
    relu: bool,
) {
    let r = residual.unwrap_or(x);
    let t = Tiling::new(rows, c, x.dtype.size(), &[x, r, y, mean, inv_std, gamma, beta]);
    let (count, dim) = t.grid();
    k::normalize::launch::<CudaRuntime>(
        &x.client,
        count,
        dim,
        t.n,
        arg(x),
        arg(r),
        arg(y),
        arg(mean),
        arg(inv_std),
        arg(gamma),
        arg(beta),
        rows as u32,
        t.cols as u32,
        t.groups as u32,
        t.tile_x,
        t.tile_y,
        relu,
        residual.is_some(),
        x.dtype.into(),
    );
}

/// `(dx, dgamma, dbeta, dresidual)`: with the saved output `y` (a residual was added before
/// the ReLU) the mask comes from `y` and the masked gradient is also the residual's — written
/// into `dy`'s buffer when `dy_writable` (no other tensor reads it), so the pass holds no more
/// activation-sized buffers than the separate ReLU backward and batch-norm backward did.
#[allow(clippy::too_many_arguments)]
fn backward_kernels(
    shape: &Shape,
    relu: bool,
    x: &Cube,
    (dy, dy_writable): (&Cube, bool),
    y: Option<&Cube>,
    [gamma, beta, mean, inv_std]: [&Cube; 4],
    (rows, c): (usize, usize),
) -> (Cube, Cube, Cube, Option<Cube>) {
    CALLS.fetch_add(1, Ordering::Relaxed);
    let client = &x.client;
    let dt = x.dtype;
    let (dgamma, dbeta) = (empty_f32(x, &[c]), empty_f32(x, &[c]));
    let dx = empty(x, shape.as_slice());
    let dz = y.map(|_| if dy_writable { dy.clone() } else { empty(x, shape.as_slice()) });
    let mut operands = vec![x, dy, &dx, gamma, beta, mean, inv_std, &dgamma, &dbeta];
    operands.extend(y.iter().copied().chain(dz.as_ref()));
    let t = Tiling::new(rows, c, dt.size(), &operands);
    let partials = empty_f32(x, &[2, t.groups, c]);
    let (count, dim) = t.grid();
    let (rows32, cols32, groups32) = (rows as u32, t.cols as u32, t.groups as u32);
    match (y, &dz) {
        (Some(y), Some(dz)) => k::grad_partials_from_output::launch::<CudaRuntime>(
            client,
            count.clone(),
            dim,
            t.n,
            arg(x),
            // In place, `dy` is `dz` and is read through it: any read-only buffer stands here.
            arg(if dy_writable { y } else { dy }),
            arg(y),
            arg(mean),
            arg(dz),
            arg(&partials),
            rows32,
            cols32,
            groups32,
            t.tile_x,
            t.tile_y,
            dy_writable,
            dt.into(),
        ),
        _ => k::grad_partials::launch::<CudaRuntime>(
            client,
            count.clone(),
            dim,
            t.n,
            arg(x),
            arg(dy),
            arg(mean),
            arg(inv_std),
            arg(gamma),
            arg(beta),
            arg(&partials),
            rows32,
            cols32,
            groups32,
            t.tile_x,
            t.tile_y,
            relu,
            dt.into(),
        ),
    }
    let (fold_count, fold_dim, depth) = k::fold_launch(c);
    k::grad_finalize::launch::<CudaRuntime>(
        client,
        fold_count,
        fold_dim,
        arg(&partials),
        arg(inv_std),
        arg(&dgamma),
        arg(&dbeta),
        c as u32,
        groups32,
        depth,
    );
    // With the residual, `dz` is already masked: the last pass reads it without a ReLU.
    k::input_grad::launch::<CudaRuntime>(
        client,
        count,
        dim,
        t.n,
        arg(x),
        arg(dz.as_ref().unwrap_or(dy)),
        arg(&dx),
        arg(mean),
        arg(inv_std),
        arg(gamma),
        arg(beta),
        arg(&dgamma),
        arg(&dbeta),
        rows32,
        cols32,
        groups32,
        1.0 / rows as f32,
        t.tile_x,
        t.tile_y,
        relu && dz.is_none(),
        dt.into(),
    );
    (dx, dgamma, dbeta, dz)
}

#[derive(Debug)]
struct NhwcBatchNorm;

/// What the backward pass needs: the input, the parameters (the ReLU mask is recomputed from
/// them), the batch statistics, and the output when a residual was added (its mask).
#[derive(Debug, Clone)]
struct Saved {
    x: Prim,
    gamma: Prim,
    beta: Prim,
    mean: Prim,
    inv_std: Prim,
    relu: bool,
    y: Option<Prim>,
}

/// Parents `x, γ, β` (and the residual): `P` is 3 or 4.
impl<const P: usize> Backward<Cuda, P> for NhwcBatchNorm {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let dy = grads.consume::<Cuda>(&ops.node);
        let s = ops.state;
        // `dy` is moved, not cloned, into the kernels' operation: held twice it would not be
        // its tensor's last use there, and the masked gradient could not take its buffer.
        let out = backward(&s, dy).unwrap_or_else(|refused| {
            let (e, dy) = *refused;
            warn_once("channels-last batch norm kernels (backward)", &e, BURN_RUNS);
            backward_burn(&s, dy)
        });
        for (node, grad) in ops.parents.into_iter().zip(out) {
            if let Some(node) = node {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}

/// `[dx, dγ, dβ]`, and the residual's gradient when one was added; `dy` back with the reason
/// when the kernels do not take it.
fn backward(s: &Saved, dy: Prim) -> std::result::Result<Vec<Prim>, Box<(Error, Prim)>> {
    let (rows, c) = match extent(&s.x) {
        Ok(e) => e,
        Err(e) => return Err(Box::new((e, dy))),
    };
    if dy.shape != s.x.shape || dy.dtype != s.x.dtype {
        let reason = format!("gradient {:?} {:?} for input {:?} {:?}", dy.shape, dy.dtype, s.x.shape, s.x.dtype);
        return Err(Box::new((Error::Kernel { op: "channels-last batch norm backward", reason }, dy)));
    }
    let (relu, shape) = (s.relu, s.x.shape.clone());
    let mut outputs = vec![fusion_op::like(&s.x), fusion_op::like(&s.gamma), fusion_op::like(&s.beta)];
    let mut inputs = vec![s.x.clone(), dy, s.gamma.clone(), s.beta.clone(), s.mean.clone(), s.inv_std.clone()];
    if let Some(y) = &s.y {
        outputs.push(fusion_op::like(&s.x));
        inputs.push(y.clone());
    }
    Ok(fusion_op::queue_owned("bn_nhwc_backward", inputs, &outputs, move |ins| {
        let mut ins = ins.into_iter();
        let (x, (dy, last_user)) = (ins.next().expect("x"), ins.next().expect("dy"));
        // Writable when this is its tensor's last use and no view shares the buffer (a packed
        // copy of a strided one is ours either way).
        let dy_writable = last_user && dy.can_mut();
        let (x, dy) = (packed(x.0), packed(dy));
        let mut next = || packed(ins.next().expect("the queued inputs").0);
        let (gamma, beta, mean, inv_std) = (next(), next(), next(), next());
        let y = ins.next().map(|(y, _)| packed(y));
        let params = [&gamma, &beta, &mean, &inv_std];
        let (dx, dgamma, dbeta, dz) =
            backward_kernels(&shape, relu, &x, (&dy, dy_writable), y.as_ref(), params, (rows, c));
        [dx, dgamma, dbeta].into_iter().chain(dz).collect()
    }))
}

/// The same gradients from burn's operations, in f32 (if the kernels refuse after the forward
/// pass ran); the input's (and residual's) gradient comes back in the input's type.
fn backward_burn(s: &Saved, dy: Prim) -> Vec<Prim> {
    let t4 = |p: Prim| Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(p)).cast(FloatDType::F32);
    let c = s.x.shape.as_slice()[3];
    let per_channel = |p: &Prim| float(p.clone()).reshape([1, 1, 1, c]);
    let sum = |t: Tensor<Cuda, 4>| t.sum_dim(0).sum_dim(1).sum_dim(2).reshape([c]);
    let (inv_std, gamma) = (per_channel(&s.inv_std), per_channel(&s.gamma));
    let d = t4(s.x.clone()) - per_channel(&s.mean);
    let dy = t4(dy);
    let dz = match (&s.y, s.relu) {
        (Some(y), _) => dy.mask_fill(t4(y.clone()).lower_equal_elem(0.0), 0.0),
        (None, true) => dy.mask_fill(
            (d.clone() * (gamma.clone() * inv_std.clone()) + per_channel(&s.beta)).lower_equal_elem(0.0),
            0.0,
        ),
        (None, false) => dy,
    };
    let m = (s.x.shape.num_elements() / c) as f64;
    let dbeta = sum(dz.clone());
    let dgamma = sum(dz.clone() * d.clone()) * float(s.inv_std.clone());
    let dx = gamma
        * inv_std.clone()
        * (dz.clone() - per_channel_of(&dbeta, c) / m - d * inv_std * per_channel_of(&dgamma, c) / m);
    let dtype = s.x.dtype;
    let mut out = vec![
        dx.cast(dtype).into_primitive().tensor(),
        dgamma.into_primitive().tensor(),
        dbeta.into_primitive().tensor(),
    ];
    if s.y.is_some() {
        out.push(dz.cast(dtype).into_primitive().tensor());
    }
    out
}

fn per_channel_of(t: &Tensor<Cuda, 1>, c: usize) -> Tensor<Cuda, 4> {
    t.clone().reshape([1, 1, 1, c])
}

/// γ, β and the running statistics as f32 `[c]` primitives, or why the kernels cannot take them.
fn parameters(bn: &BatchNorm<Ad>, device: &burn::tensor::Device<Ad>, c: usize) -> Result<[Prim; 2]> {
    let running = |t: Tensor<Ad, 1>| -> Prim { t.inner().to_device(device).into_primitive().tensor() };
    let (rm, rv) = (running(bn.running_mean.value_sync()), running(bn.running_var.value_sync()));
    let (g, b) = (bn.gamma.val().inner().into_primitive().tensor(), bn.beta.val().inner().into_primitive().tensor());
    for (t, what) in [(&g, "gamma"), (&b, "beta"), (&rm, "running mean"), (&rv, "running variance")] {
        require_f32(t, what)?;
        if t.shape.as_slice() != [c] {
            return Err(Error::Kernel {
                op: "channels-last batch norm",
                reason: format!("{what} has shape {:?} for {c} channels", t.shape.as_slice()),
            });
        }
    }
    Ok([rm, rv])
}

fn train(bn: &BatchNorm<Ad>, x: Tensor<Ad, 4>, epilogue: Epilogue<Tensor<Ad, 4>>) -> Result<Tensor<Ad, 4>> {
    let device = x.device();
    let (gamma, beta) = (bn.gamma.val().into_primitive().tensor(), bn.beta.val().into_primitive().tensor());
    let xp = x.into_primitive().tensor();
    let (rows, c) = extent(&xp.primitive)?;
    let [rm, rv] = parameters(bn, &device, c)?;
    let relu = epilogue.relu();
    let residual = epilogue.residual().map(|r| r.into_primitive().tensor());
    check_residual(&xp.primitive, residual.as_ref().map(|r| &r.primitive))?;
    let (shape, eps, momentum) = (xp.primitive.shape.clone(), bn.epsilon, bn.momentum);
    let stat = (Shape::new([c]), DType::F32);
    let outputs = [fusion_op::like(&xp.primitive), stat.clone(), stat.clone(), stat.clone(), stat];
    let mut inputs = vec![xp.primitive.clone(), gamma.primitive.clone(), beta.primitive.clone(), rm, rv];
    inputs.extend(residual.as_ref().map(|r| r.primitive.clone()));
    let out = fusion_op::queue("bn_nhwc_forward", inputs, &outputs, move |ins| {
        let mut ins = ins.into_iter().map(packed);
        let mut next = || ins.next().expect("the queued inputs");
        let (x, g, b, rm, rv) = (next(), next(), next(), next(), next());
        let r = ins.next();
        forward_kernels(&x, r.as_ref(), &shape, [&g, &b, &rm, &rv], (rows, c), eps, momentum, relu).to_vec()
    });
    let [y, mean, inv_std, new_mean, new_var]: [Prim; 5] = out.try_into().expect("five outputs");
    bn.running_mean.update(Tensor::from_inner(float(new_mean)));
    bn.running_var.update(Tensor::from_inner(float(new_var)));
    let saved = Saved {
        x: xp.primitive.clone(),
        gamma: gamma.primitive.clone(),
        beta: beta.primitive.clone(),
        mean,
        inv_std,
        relu,
        y: residual.as_ref().map(|_| y.clone()),
    };
    let out = match &residual {
        Some(r) => track([&xp, &gamma, &beta, r], saved, y),
        None => track([&xp, &gamma, &beta], saved, y),
    };
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// The autodiff node of one forward pass over its `P` parents.
fn track<const P: usize>(parents: [&FloatTensor<Ad>; P], saved: Saved, y: Prim) -> FloatTensor<Ad> {
    match NhwcBatchNorm.prepare::<NoCheckpointing>(parents.map(|t| t.node.clone())).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(saved, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}

fn infer(bn: &BatchNorm<Cuda>, x: Tensor<Cuda, 4>, epilogue: Epilogue<Tensor<Cuda, 4>>) -> Result<Tensor<Cuda, 4>> {
    let device = x.device();
    let xp: Prim = x.into_primitive().tensor();
    let (rows, c) = extent(&xp)?;
    let relu = epilogue.relu();
    let residual: Option<Prim> = epilogue.residual().map(|r| r.into_primitive().tensor());
    check_residual(&xp, residual.as_ref())?;
    let (shape, xp_dtype) = (xp.shape.clone(), xp.dtype);
    let prim = |t: Tensor<Cuda, 1>| -> Prim { t.to_device(&device).into_primitive().tensor() };
    let inv_std = bn.running_var.value().to_device(&device).add_scalar(bn.epsilon).sqrt().recip();
    let mut ins = vec![xp, prim(bn.gamma.val()), prim(bn.beta.val()), prim(bn.running_mean.value()), prim(inv_std)];
    for (t, what) in ins[1..].iter().zip(["gamma", "beta", "running mean", "running variance"]) {
        require_f32(t, what)?;
    }
    ins.extend(residual);
    let out = fusion_op::queue("bn_nhwc_inference", ins, &[(shape.clone(), xp_dtype)], move |ins| {
        let mut ins = ins.into_iter().map(packed);
        let mut next = || ins.next().expect("the queued inputs");
        let (x, g, b, m, i) = (next(), next(), next(), next(), next());
        let r = ins.next();
        let y = empty(&x, shape.as_slice());
        CALLS.fetch_add(1, Ordering::Relaxed);
        normalize(&x, r.as_ref(), &y, &m, &i, &g, &b, (rows, c), relu);
        vec![y]
    });
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out.into_iter().next().expect("one output"))))
}
