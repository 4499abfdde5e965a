//! LayerNorm of bf16/f16 burn-cuda tensors on cuDNN ([`crate::nn::cuda::cudnn::layer_norm`]), as an autodiff
//! operation whose forward and backward are operations of burn-fusion's stream, ordered with
//! burn's stream on the device like the convolutions. Saved for the backward: the input in its
//! own type and two f32 values per row (mean, 1/σ) — not burn's f32 copies of every
//! intermediate.
//!
//! With `CudnnOptions::layer_norm_kernel` the forward is our own kernel (`ln_forward`, NVRTC,
//! one warp per row held in registers: rows of at most 1024 features) and the backward stays
//! cuDNN's, fed the same mean and 1/σ: cuDNN's forward took 98 µs per ViT-B/16 norm at batch 128
//! on an H200 (`benches/results/2026-12-04-h200-step-profile/`), about four times its memory
//! traffic, where its backward took 38 µs. With the kernel (on by default since 2026-12-04)
//! ViT-B/16 bf16 b128 trains 2.9–3.6 % faster on one H200
//! (`benches/results/2026-12-04-h200-vit-kernels/`).

use crate::grad_ready::param_val;
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::cudnn::layer_norm::{self as cudnn_ln, LnPointers, LnShape};
use crate::nn::cuda::cudnn::types::DataType;
use crate::nn::cuda::kernels::nvrtc::{Kernels, launch_256};
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
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

const KERNEL: &str = concat!(
    crate::nn::cuda::kernels::nvrtc::storage_types!(),
    r#"
// x [rows, d] in storage type t, one warp per row (d a multiple of 4 and at most 1024; x and y
// aligned for four elements): the row's mean and 1/σ = rsqrt(var + eps) in f32 (two passes
// over the row held in registers) and y = (x − mean)·(1/σ)·γ + β in t; γ, β f32 [d].
extern "C" __global__ void ln_forward(const void* x, const float* gamma, const float* beta, void* y,
                                      float* mean, float* rstd, long long rows, int d, float eps, int t) {
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (long long r = (long long)blockIdx.x * warps + (threadIdx.x >> 5); r < rows;
         r += (long long)gridDim.x * warps) {
        const long long base = r * d;
        float v[8][4];
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int i = 4 * lane + 128 * k;
            if (i < d) {
                ld4(x, base + i, t, v[k]);
                s += (v[k][0] + v[k][1]) + (v[k][2] + v[k][3]);
            }
        }
        const float m = warp_sum(s) / d;
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int i = 4 * lane + 128 * k;
            if (i < d) {
                for (int j = 0; j < 4; j++) { const float c = v[k][j] - m; q += c * c; }
            }
        }
        const float rs = rsqrtf(warp_sum(q) / d + eps);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int i = 4 * lane + 128 * k;
            if (i < d) {
                float o[4];
                for (int j = 0; j < 4; j++) o[j] = (v[k][j] - m) * rs * gamma[i + j] + beta[i + j];
                st4(y, base + i, t, o);
            }
        }
        if (lane == 0) { mean[r] = m; rstd[r] = rs; }
    }
}
"#
);

static KERNELS: Kernels = Kernels::new("layer norm forward", KERNEL);

/// Forward passes our kernel has run (read by `layer_norm::kernel_forward_calls`).
pub(crate) static KERNEL_CALLS: AtomicUsize = AtomicUsize::new(0);

/// The most features a row may have for `ln_forward` (32 lanes × 8 × 4 values in registers).
const KERNEL_MAX_FEATURES: i64 = 1024;

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
    let gamma = param_val(&norm.gamma, &x);
    let beta = param_val(norm.beta.as_ref().expect("checked above"), &x);
    // `x` goes in with its own dims: packed, `[..., features]` is `[rows, features]` byte for
    // byte. Not reshaped first: burn-cuda pads rows whose bytes are not a multiple of
    // min(512, their next power of two) (ViT-S's 384 bf16 features: 768 → 1,024 bytes), and
    // burn's reshape of such a tensor to fewer dims copies it into another padded buffer,
    // which `dense` would then copy again.
    if cuda_backend::<B>() == Some(true) {
        return Ok(cast(autodiff_layer_norm::<D>(cast(x), cast(gamma), cast(beta), shape)));
    }
    let (x, g, b): (Tensor<Cuda, D>, Tensor<Cuda, 1>, Tensor<Cuda, 1>) = (cast(x), cast(gamma), cast(beta));
    let prim = |t: Tensor<Cuda, 1>| t.into_primitive().tensor();
    let (y, _, _) = forward(x.into_primitive().tensor(), prim(g), prim(b), shape);
    Ok(cast(Tensor::<Cuda, D>::from_primitive(TensorPrimitive::Float(y))))
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

fn autodiff_layer_norm<const D: usize>(
    x: Tensor<Ad, D>,
    gamma: Tensor<Ad, 1>,
    beta: Tensor<Ad, 1>,
    shape: LnShape,
) -> Tensor<Ad, D> {
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

/// Queues the forward of `x` (`[..., features]`, any number of dims: its packed buffer is read
/// as `[rows, features]`): `y` (x's dims and type) and the rows' mean and 1/σ (f32), on our
/// kernel when `layer_norm_kernel` is on and the rows suit it (else, or for a buffer not
/// aligned for it, on cuDNN).
fn forward(x: Prim, gamma: Prim, beta: Prim, shape: LnShape) -> (Prim, Prim, Prim) {
    let rows = shape.rows as usize;
    let ours = crate::nn::settings::options::get().layer_norm_kernel
        && shape.features <= KERNEL_MAX_FEATURES
        && shape.features % 4 == 0
        && KERNELS.ptx().is_some();
    let kind = if ours { "layer_norm_forward_kernel" } else { "layer_norm_forward" };
    let outputs = [fusion_op::like(&x), (Shape::new([rows]), DType::F32), (Shape::new([rows]), DType::F32)];
    let mut out = fusion_op::queue("cudnn_layer_norm", vec![x, gamma, beta], &outputs, move |ins| {
        let [x, gamma, beta]: [Cube; 3] = ins.try_into().expect("three inputs");
        let (x, gamma, beta) = (dense(x), dense(gamma), dense(beta));
        let (y, mean, inv_var) = (empty(&x, x.meta.shape().as_slice()), empty_f32(&x, &[rows]), empty_f32(&x, &[rows]));
        let device = x.device.index;
        // SAFETY: `launch` orders the computation after the buffers' producers and before their
        // next users; extents are `shape`'s (packed, checked); y, mean, inv_var are fresh.
        launch(&[&x, &gamma, &beta, &y, &mean, &inv_var], (kind, shape), move |p, order| unsafe {
            if ours && p[0] % 8 == 0 && p[3] % 8 == 0 {
                return cudnn::with_handle(device, order, |s| enqueue_forward(device, s.cu_stream(), p, &shape));
            }
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

/// Launches `ln_forward` on `stream`; `p` = x, γ, β, y, mean, 1/σ.
///
/// # Safety
/// The addresses are live buffers of `device` of `shape` (x and y `[rows, features]` in its
/// type, aligned for four elements; γ, β f32 `[features]`; mean, 1/σ f32 `[rows]`); its context
/// is bound.
unsafe fn enqueue_forward(
    device: usize,
    stream: cudarc::driver::sys::CUstream,
    p: &[u64],
    shape: &LnShape,
) -> crate::error::Result<()> {
    let f = KERNELS.function(device, c"ln_forward")?;
    let t = if shape.dtype == DataType::Bf16 { 1i32 } else { 2 };
    let blocks = (shape.rows as u64).div_ceil(8).clamp(1, 1 << 20) as u32;
    let [mut x, mut gamma, mut beta, mut y, mut mean, mut rstd] = [p[0], p[1], p[2], p[3], p[4], p[5]];
    let (mut rows, mut d, mut eps, mut t) = (shape.rows, shape.features as i32, f32::from_bits(shape.eps_bits), t);
    let a = |x: &mut u64| x as *mut u64 as *mut c_void;
    let mut args = [
        a(&mut x),
        a(&mut gamma),
        a(&mut beta),
        a(&mut y),
        a(&mut mean),
        a(&mut rstd),
        &mut rows as *mut i64 as *mut c_void,
        &mut d as *mut i32 as *mut c_void,
        &mut eps as *mut f32 as *mut c_void,
        &mut t as *mut i32 as *mut c_void,
    ];
    // SAFETY: the arguments match `ln_forward`'s signature; the caller vouches for the addresses.
    unsafe { launch_256(f, (blocks, 1), stream, &mut args) }.map_err(|e| crate::error::Error::Kernel {
        op: "layer norm forward",
        reason: format!("launching ln_forward: {e:?}"),
    })?;
    KERNEL_CALLS.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Queues the backward: dx (x's dims and type), dγ and dβ (f32).
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
