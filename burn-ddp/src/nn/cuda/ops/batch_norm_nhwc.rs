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
use crate::nn::cuda::kernels::batch_norm_nhwc::{self as k, FOLD};
use crate::nn::cuda::ops::batch_norm::float;
use crate::nn::cuda::runtime::fusion_op::{self, packed};
use crate::nn::cuda::runtime::launch::{Ad, BURN_RUNS, Prim, cast, empty, empty_f32, warn_once};
use crate::nn::layers::BatchNorm;
use burn::prelude::*;
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

/// `relu?(bn(x))` for channels-last `x` through the kernels when `B` is burn-cuda (training
/// statistics with autodiff, running statistics without) and
/// [`super::CudnnOptions::nhwc_bn_kernels`] is set; otherwise `x` comes back untouched.
pub(crate) fn try_batch_norm<B: Backend>(
    bn: &BatchNorm<B>,
    x: Tensor<B, 4>,
    relu: bool,
) -> std::result::Result<Tensor<B, 4>, Tensor<B, 4>> {
    if !crate::nn::settings::options::get().nhwc_bn_kernels {
        return Err(x);
    }
    crate::nn::cuda::runtime::device_thread::check_failure();
    let fallback = |e: Error| warn_once("channels-last batch norm kernels", &e, BURN_RUNS);
    if let Some(bn) = (bn as &dyn Any).downcast_ref::<BatchNorm<Ad>>() {
        let x: Tensor<Ad, 4> = cast(x);
        return train(bn, x.clone(), relu).map(cast).map_err(|e| {
            fallback(e);
            cast(x)
        });
    }
    if let Some(bn) = (bn as &dyn Any).downcast_ref::<BatchNorm<Cuda>>() {
        let x: Tensor<Cuda, 4> = cast(x);
        return infer(bn, x.clone(), relu).map(cast).map_err(|e| {
            fallback(e);
            cast(x)
        });
    }
    Err(x)
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
    let t = Tiling::new(rows, c, dt.size(), &[x, gamma, beta, &mean, &inv_std, &y]);
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
    k::stats_finalize::launch::<CudaRuntime>(
        client,
        CubeCount::Static(c as u32, 1, 1),
        CubeDim::new_1d(FOLD),
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
        dt.into(),
    );
    k::normalize::launch::<CudaRuntime>(
        client,
        count,
        dim,
        t.n,
        arg(x),
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
        dt.into(),
    );
    [y, mean, inv_std, new_mean, new_var]
}

/// `y = relu?(γ·inv_std·(x − mean) + β)` with given statistics (inference, SyncBatchNorm).
#[allow(clippy::too_many_arguments)]
pub(crate) fn normalize(
    x: &Cube,
    y: &Cube,
    mean: &Cube,
    inv_std: &Cube,
    gamma: &Cube,
    beta: &Cube,
    (rows, c): (usize, usize),
    relu: bool,
) {
    let t = Tiling::new(rows, c, x.dtype.size(), &[x, y, mean, inv_std, gamma, beta]);
    let (count, dim) = t.grid();
    k::normalize::launch::<CudaRuntime>(
        &x.client,
        count,
        dim,
        t.n,
        arg(x),
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
        x.dtype.into(),
    );
}

/// `(dx, dgamma, dbeta)`.
fn backward_kernels(
    shape: &Shape,
    relu: bool,
    x: &Cube,
    dy: &Cube,
    [gamma, beta, mean, inv_std]: [&Cube; 4],
    (rows, c): (usize, usize),
) -> (Cube, Cube, Cube) {
    CALLS.fetch_add(1, Ordering::Relaxed);
    let client = &x.client;
    let dt = x.dtype;
    let (dgamma, dbeta) = (empty_f32(x, &[c]), empty_f32(x, &[c]));
    let dx = empty(x, shape.as_slice());
    let t = Tiling::new(rows, c, dt.size(), &[x, dy, &dx, gamma, beta, mean, inv_std, &dgamma, &dbeta]);
    let partials = empty_f32(x, &[2, t.groups, c]);
    let (count, dim) = t.grid();
    let (rows32, cols32, groups32) = (rows as u32, t.cols as u32, t.groups as u32);
    k::grad_partials::launch::<CudaRuntime>(
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
    );
    k::grad_finalize::launch::<CudaRuntime>(
        client,
        CubeCount::Static(c as u32, 1, 1),
        CubeDim::new_1d(FOLD),
        arg(&partials),
        arg(inv_std),
        arg(&dgamma),
        arg(&dbeta),
        c as u32,
        groups32,
    );
    k::input_grad::launch::<CudaRuntime>(
        client,
        count,
        dim,
        t.n,
        arg(x),
        arg(dy),
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
        relu,
        dt.into(),
    );
    (dx, dgamma, dbeta)
}

#[derive(Debug)]
struct NhwcBatchNorm;

/// What the backward pass needs: the input, the parameters (the ReLU mask is recomputed from
/// them) and the batch statistics.
#[derive(Debug, Clone)]
struct Saved {
    x: Prim,
    gamma: Prim,
    beta: Prim,
    mean: Prim,
    inv_std: Prim,
    relu: bool,
}

impl Backward<Cuda, 3> for NhwcBatchNorm {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        let s = ops.state;
        let (dx, dgamma, dbeta) = backward(&s, dy.clone()).unwrap_or_else(|e| {
            warn_once("channels-last batch norm kernels (backward)", &e, BURN_RUNS);
            backward_burn(&s, dy)
        });
        for (node, grad) in [(node_x, dx), (node_gamma, dgamma), (node_beta, dbeta)] {
            if let Some(node) = node {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}

fn backward(s: &Saved, dy: Prim) -> Result<(Prim, Prim, Prim)> {
    let (rows, c) = extent(&s.x)?;
    if dy.shape != s.x.shape || dy.dtype != s.x.dtype {
        return Err(Error::Kernel {
            op: "channels-last batch norm backward",
            reason: format!("gradient {:?} {:?} for input {:?} {:?}", dy.shape, dy.dtype, s.x.shape, s.x.dtype),
        });
    }
    let (relu, shape) = (s.relu, s.x.shape.clone());
    let outputs = [fusion_op::like(&s.x), fusion_op::like(&s.gamma), fusion_op::like(&s.beta)];
    let inputs = vec![s.x.clone(), dy, s.gamma.clone(), s.beta.clone(), s.mean.clone(), s.inv_std.clone()];
    let out = fusion_op::queue("bn_nhwc_backward", inputs, &outputs, move |ins| {
        let [x, dy, gamma, beta, mean, inv_std]: [Cube; 6] = ins.try_into().expect("six inputs");
        let (x, dy) = (packed(x), packed(dy));
        let (dx, dgamma, dbeta) = backward_kernels(
            &shape,
            relu,
            &x,
            &dy,
            [&packed(gamma), &packed(beta), &packed(mean), &packed(inv_std)],
            (rows, c),
        );
        vec![dx, dgamma, dbeta]
    });
    let [dx, dgamma, dbeta]: [Prim; 3] = out.try_into().expect("three outputs");
    Ok((dx, dgamma, dbeta))
}

/// The same gradients from burn's operations, in f32 (if the kernels refuse after the forward
/// pass ran); the input gradient comes back in the input's type.
fn backward_burn(s: &Saved, dy: Prim) -> (Prim, Prim, Prim) {
    let t4 = |p: Prim| Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(p)).cast(FloatDType::F32);
    let c = s.x.shape.as_slice()[3];
    let per_channel = |p: &Prim| float(p.clone()).reshape([1, 1, 1, c]);
    let sum = |t: Tensor<Cuda, 4>| t.sum_dim(0).sum_dim(1).sum_dim(2).reshape([c]);
    let (inv_std, gamma) = (per_channel(&s.inv_std), per_channel(&s.gamma));
    let d = t4(s.x.clone()) - per_channel(&s.mean);
    let dy = t4(dy);
    let dz = if s.relu {
        dy.mask_fill((d.clone() * (gamma.clone() * inv_std.clone()) + per_channel(&s.beta)).lower_equal_elem(0.0), 0.0)
    } else {
        dy
    };
    let m = (s.x.shape.num_elements() / c) as f64;
    let dbeta = sum(dz.clone());
    let dgamma = sum(dz.clone() * d.clone()) * float(s.inv_std.clone());
    let dx =
        gamma * inv_std.clone() * (dz - per_channel_of(&dbeta, c) / m - d * inv_std * per_channel_of(&dgamma, c) / m);
    (dx.cast(s.x.dtype).into_primitive().tensor(), dgamma.into_primitive().tensor(), dbeta.into_primitive().tensor())
}

fn per_channel_of(t: &Tensor<Cuda, 1>, c: usize) -> Tensor<Cuda, 4> {
    t.clone().reshape([1, 1, 1, c])
}

fn train(bn: &BatchNorm<Ad>, x: Tensor<Ad, 4>, relu: bool) -> Result<Tensor<Ad, 4>> {
    let device = x.device();
    let (gamma, beta) = (bn.gamma.val().into_primitive().tensor(), bn.beta.val().into_primitive().tensor());
    let xp = x.into_primitive().tensor();
    let (rows, c) = extent(&xp.primitive)?;
    let running = |t: Tensor<Ad, 1>| -> Prim { t.inner().to_device(&device).into_primitive().tensor() };
    let (rm, rv) = (running(bn.running_mean.value_sync()), running(bn.running_var.value_sync()));
    for (t, what) in
        [(&gamma.primitive, "gamma"), (&beta.primitive, "beta"), (&rm, "running mean"), (&rv, "running variance")]
    {
        require_f32(t, what)?;
        if t.shape.as_slice() != [c] {
            return Err(Error::Kernel {
                op: "channels-last batch norm",
                reason: format!("{what} has shape {:?} for {c} channels", t.shape.as_slice()),
            });
        }
    }
    let (shape, eps, momentum) = (xp.primitive.shape.clone(), bn.epsilon, bn.momentum);
    let stat = (Shape::new([c]), DType::F32);
    let outputs = [fusion_op::like(&xp.primitive), stat.clone(), stat.clone(), stat.clone(), stat];
    let inputs = vec![xp.primitive.clone(), gamma.primitive.clone(), beta.primitive.clone(), rm, rv];
    let out = fusion_op::queue("bn_nhwc_forward", inputs, &outputs, move |ins| {
        let [x, g, b, rm, rv]: [Cube; 5] = ins.try_into().expect("five inputs");
        forward_kernels(
            &packed(x),
            &shape,
            [&packed(g), &packed(b), &packed(rm), &packed(rv)],
            (rows, c),
            eps,
            momentum,
            relu,
        )
        .to_vec()
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
    };
    let out = match NhwcBatchNorm
        .prepare::<NoCheckpointing>([xp.node.clone(), gamma.node.clone(), beta.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(saved, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

fn infer(bn: &BatchNorm<Cuda>, x: Tensor<Cuda, 4>, relu: bool) -> Result<Tensor<Cuda, 4>> {
    let device = x.device();
    let xp: Prim = x.into_primitive().tensor();
    let (rows, c) = extent(&xp)?;
    let (shape, xp_dtype) = (xp.shape.clone(), xp.dtype);
    let prim = |t: Tensor<Cuda, 1>| -> Prim { t.to_device(&device).into_primitive().tensor() };
    let inv_std = bn.running_var.value().to_device(&device).add_scalar(bn.epsilon).sqrt().recip();
    let ins = [xp, prim(bn.gamma.val()), prim(bn.beta.val()), prim(bn.running_mean.value()), prim(inv_std)];
    for (t, what) in ins[1..].iter().zip(["gamma", "beta", "running mean", "running variance"]) {
        require_f32(t, what)?;
    }
    let out = fusion_op::queue("bn_nhwc_inference", Vec::from(ins), &[(shape.clone(), xp_dtype)], move |ins| {
        let [x, g, b, m, i]: [Cube; 5] = ins.try_into().expect("five inputs");
        let x = packed(x);
        let y = empty(&x, shape.as_slice());
        CALLS.fetch_add(1, Ordering::Relaxed);
        normalize(&x, &y, &packed(m), &packed(i), &packed(g), &packed(b), (rows, c), relu);
        vec![y]
    });
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out.into_iter().next().expect("one output"))))
}
