//! `cross_entropy` (cross_entropy.rs) on burn-cuda: one burn-fusion operation ([`fusion_op::queue`]) whose
//! CUDA C kernels ([`crate::nn::cuda::kernels::nvrtc`]) run on cuDNN's stream, ordered with burn's
//! ([`launch::launch`]): `ce_rows` (a block per row: the row's max, its sum of exponentials
//! and of logits, its loss, and its gradient `(softmax − t) / n`) and `ce_mean` (one block: the
//! mean of the rows' losses, in a fixed order, so the loss is the same from run to run). The
//! backward multiplies the saved gradient by the loss's incoming gradient.

use crate::error::{Error, Result};
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::kernels::nvrtc::Kernels;
use crate::nn::cuda::runtime::fusion_op::{self, Cube, packed};
use crate::nn::cuda::runtime::launch::{self, Ad, Prim, cast, cuda_backend, empty_f32};
use burn::prelude::*;
use burn::tensor::ops::IntTensor;
use burn::tensor::{DType, Int, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;
use cudarc::driver::sys as driver;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

const KERNEL: &str = r#"
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = is_max ? fmaxf(v, w) : v + w; }
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = part[0];
    for (int i = 1; i < (blockDim.x + 31) / 32; i++) r = is_max ? fmaxf(r, part[i]) : r + part[i];
    __syncthreads();
    return r;
}
// Row r of z [n, k]: rows[r] = logsumexp(z_r) - (1 - eps) z_ry - eps/k sum_i z_ri;
// d[r, i] = (softmax(z_r)_i - t_ri) / n with t_r = (1 - eps) onehot(y_r) + eps/k. A label
// outside 0..k makes the row (and so the loss) NaN.
extern "C" __global__ void ce_rows(const float* z, const void* labels, int label64, int n, int k, float eps, float* rows, float* d) {
    const float* zr = z + (size_t)blockIdx.x * k;
    float* dr = d + (size_t)blockIdx.x * k;
    long long y = label64 ? ((const long long*)labels)[blockIdx.x] : (long long)((const int*)labels)[blockIdx.x];
    float m = __int_as_float(0xff800000);
    for (int i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, zr[i]);
    m = block_reduce(m, true);
    float s = 0.0f, sz = 0.0f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) { s += expf(zr[i] - m); sz += zr[i]; }
    s = block_reduce(s, false);
    sz = block_reduce(sz, false);
    const bool ok = y >= 0 && y < k;
    const float nan = __int_as_float(0x7fc00000), base = eps / k, inv_n = 1.0f / n;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        float t = base + (i == y ? 1.0f - eps : 0.0f);
        dr[i] = ok ? (expf(zr[i] - m) / s - t) * inv_n : nan;
    }
    if (threadIdx.x == 0) rows[blockIdx.x] = ok ? m + logf(s) - (1.0f - eps) * zr[y] - base * sz : nan;
}
// loss[0] = mean of rows[0..n], one block, each thread's share summed in order.
extern "C" __global__ void ce_mean(const float* rows, int n, float* loss) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += rows[i];
    s = block_reduce(s, false);
    if (threadIdx.x == 0) loss[0] = s / n;
}
"#;

static KERNELS: Kernels = Kernels::new("fused cross-entropy", KERNEL);

/// Losses computed by the kernels so far (read by `cross_entropy::fused_calls`).
pub(crate) static CALLS: AtomicUsize = AtomicUsize::new(0);

/// The inputs, handed back when this path does not take them.
type Inputs<B> = (Tensor<B, 2>, Tensor<B, 1, Int>);

/// The loss on burn-cuda when the inputs suit it (f32 logits `[n, k]`, i32 or i64 labels `[n]`,
/// the GPU path on and the kernels compiled); otherwise the inputs come back.
pub(crate) fn try_cross_entropy<B: Backend>(
    logits: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
    eps: f32,
) -> std::result::Result<Tensor<B, 1>, Inputs<B>> {
    let [n, k] = logits.dims();
    let suits = cuda_backend::<B>().is_some()
        && launch::path_enabled()
        && logits.dtype() == DType::F32
        && matches!(labels.dtype(), DType::I32 | DType::I64)
        && n > 0
        && k > 0
        && i32::try_from(n.max(k)).is_ok()
        && labels.dims()[0] == n
        && KERNELS.ptx().is_some();
    if !suits {
        return Err((logits, labels));
    }
    crate::nn::cuda::runtime::device_thread::check_failure();
    let labels: Prim = cast::<IntTensor<B>, Prim>(labels.into_primitive());
    if cuda_backend::<B>() == Some(true) {
        let z: Tensor<Ad, 2> = cast(logits);
        return Ok(cast(autodiff_loss(z, labels, eps)));
    }
    let z: Tensor<Cuda, 2> = cast(logits);
    let [loss, _d] = forward(z.into_primitive().tensor(), labels, eps);
    Ok(cast(Tensor::<Cuda, 1>::from_primitive(TensorPrimitive::Float(loss))))
}

#[derive(Debug)]
struct CrossEntropy;

impl Backward<Cuda, 1> for CrossEntropy {
    /// The gradient of the mean loss with respect to the logits, `(softmax − t) / n`.
    type State = Prim;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [parent] = ops.parents;
        let g = grads.consume::<Cuda>(&ops.node);
        if let Some(parent) = parent {
            let d = Tensor::<Cuda, 2>::from_primitive(TensorPrimitive::Float(ops.state));
            let g = Tensor::<Cuda, 1>::from_primitive(TensorPrimitive::Float(g)).reshape([1, 1]);
            grads.register::<Cuda>(parent.id, (d * g).into_primitive().tensor());
        }
    }
}

fn autodiff_loss(z: Tensor<Ad, 2>, labels: Prim, eps: f32) -> Tensor<Ad, 1> {
    let z = z.into_primitive().tensor();
    let [loss, d] = forward(z.primitive, labels, eps);
    let out = match CrossEntropy.prepare::<NoCheckpointing>([z.node]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(d, loss),
        OpsKind::UnTracked(prep) => prep.finish(loss),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Queues the operation: `[loss [1], gradient [n, k]]`.
fn forward(z: Prim, labels: Prim, eps: f32) -> [Prim; 2] {
    let [n, k] = [z.shape[0], z.shape[1]];
    let outputs = [(Shape::new([1]), DType::F32), (Shape::new([n, k]), DType::F32)];
    let out = fusion_op::queue("fused_cross_entropy", vec![z, labels], &outputs, move |ins| run(ins, n, k, eps));
    out.try_into().expect("two outputs")
}

/// On burn-fusion's thread: the outputs and the rows' losses allocated, both kernels queued.
fn run(ins: Vec<Cube>, n: usize, k: usize, eps: f32) -> Vec<Cube> {
    let mut ins = ins.into_iter().map(packed);
    let (z, labels) = (ins.next().expect("logits"), ins.next().expect("labels"));
    let label64 = i32::from(labels.dtype == DType::I64);
    let (loss, d, rows) = (empty_f32(&z, &[1]), empty_f32(&z, &[n, k]), empty_f32(&z, &[n]));
    let device = z.device.index;
    launch::launch(&[&z, &labels, &rows, &loss, &d], "fused_cross_entropy", move |a, order| {
        // SAFETY: the addresses are live buffers of `device` of the described sizes, held by
        // `launch` until enqueued.
        unsafe {
            cudnn::with_handle(device, order, |s| enqueue(device, s.cu_stream(), a, [label64, n as i32, k as i32], eps))
        }
    })
    .unwrap_or_else(|e| panic!("fused cross-entropy: {e}"));
    CALLS.fetch_add(1, Ordering::Relaxed);
    vec![loss, d]
}

/// Launches `ce_rows` then `ce_mean` on `stream`; `a` = logits, labels, rows, loss, gradient.
///
/// # Safety
/// The addresses are live buffers of `device` (f32 `[n, k]`, i32/i64 `[n]`, f32 `[n]`, f32 `[1]`,
/// f32 `[n, k]`); its context is bound.
unsafe fn enqueue(
    device: usize,
    stream: driver::CUstream,
    a: &[u64],
    [label64, n, k]: [i32; 3],
    eps: f32,
) -> Result<()> {
    let fail = |what: &str, e: driver::CUresult| Error::Kernel {
        op: "fused cross-entropy",
        reason: format!("launching {what}: {e:?}"),
    };
    let (rows_f, mean_f) = (KERNELS.function(device, c"ce_rows")?, KERNELS.function(device, c"ce_mean")?);
    let [mut z, mut labels, mut rows, mut loss, mut d] = [a[0], a[1], a[2], a[3], a[4]];
    let (mut label64, mut n, mut k, mut eps) = (label64, n, k, eps);
    let p = |x: &mut u64| x as *mut u64 as *mut c_void;
    let mut row_args = [
        p(&mut z),
        p(&mut labels),
        &mut label64 as *mut i32 as *mut c_void,
        &mut n as *mut i32 as *mut c_void,
        &mut k as *mut i32 as *mut c_void,
        &mut eps as *mut f32 as *mut c_void,
        p(&mut rows),
        p(&mut d),
    ];
    // SAFETY: the arguments match `ce_rows`' signature; the caller vouches for the addresses.
    let r = unsafe {
        driver::cuLaunchKernel(
            rows_f,
            n as u32,
            1,
            1,
            256,
            1,
            1,
            0,
            stream,
            row_args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    r.result().map_err(|_| fail("ce_rows", r))?;
    let mut mean_args = [p(&mut rows), &mut n as *mut i32 as *mut c_void, p(&mut loss)];
    // SAFETY: the arguments match `ce_mean`'s signature.
    let r = unsafe {
        driver::cuLaunchKernel(mean_f, 1, 1, 1, 256, 1, 1, 0, stream, mean_args.as_mut_ptr(), std::ptr::null_mut())
    };
    r.result().map_err(|_| fail("ce_mean", r))
}
