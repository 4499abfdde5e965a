//! `bias_gelu` (linear.rs) on burn-cuda: `gelu(y + b)` over the rows of `y` as one burn-fusion
//! operation each way ([`fusion_op::queue`]), one CUDA C kernel ([`crate::nn::cuda::kernels::nvrtc`])
//! on cuDNN's stream, ordered with burn's ([`launch::launch`]).
//!
//! burn's `gelu(y + b)` is an addition that writes the sum (kept for the backward), a GELU pass
//! and a GELU-backward pass: on a ViT-B/16 MLP at batch 128 on an H200 they took 81, 202 and
//! 396 µs per block (`benches/results/2026-12-04-h200-step-profile/`), the last two well above
//! what their memory traffic costs. Here the forward reads `y` and `b` and writes only the
//! activation; the backward recomputes `y + b` in f32 from the same inputs (kept instead of the
//! sum: the same memory) and writes `dy = dh · gelu'(y + b)`; `db` is the column sums of `dy` on
//! cuBLAS (`matmul::row_sums`). Exact GELU (erf), as `torch.nn.GELU()` and burn's `gelu`;
//! arithmetic in f32 whatever the storage type, rounded once on the store.

use crate::error::{Error, Result};
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::kernels::nvrtc::{Kernels, launch_256};
use crate::nn::cuda::ops::matmul::row_sums;
use crate::nn::cuda::runtime::fusion_op::{self, Cube, packed};
use crate::nn::cuda::runtime::launch::{self, Ad, Prim, cast, cuda_backend, empty};
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

const KERNEL: &str = concat!(
    crate::nn::cuda::kernels::nvrtc::storage_types!(),
    r#"
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
// d/dx [x Φ(x)] = Φ(x) + x φ(x).
__device__ __forceinline__ float gelu_grad(float x) {
    return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x);
}
// Element i's column (32-bit division where the sizes allow: a 64-bit one is a long routine).
__device__ __forceinline__ long long column(long long i, long long len, int cols) {
    return len <= 0xffffffffLL ? (long long)((unsigned)i % (unsigned)cols) : i % cols;
}
// y [len / cols, cols] row-major, b [cols] or null. dh null: out = gelu(y + b); else
// out = dh * gelu'(y + b). vec: elements per thread and step, 8 (len and cols multiples of 8,
// every buffer 16-byte aligned), 4 (multiples of 4, aligned for it) or 1.
template <int N>
__device__ __forceinline__ void bias_gelu_vec(const void* y, const void* b, const void* dh, void* out,
                                              long long len, int cols, int t) {
    const long long threads = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long i = first * N; i < len; i += threads * N) {
        float v[N], bias[N], g[N];
        for (int k = 0; k < N; k++) bias[k] = 0.0f;
        if (N == 8) ld8(y, i, t, v); else ld4(y, i, t, v);
        if (b) { if (N == 8) ld8(b, column(i, len, cols), t, bias); else ld4(b, column(i, len, cols), t, bias); }
        if (dh) { if (N == 8) ld8(dh, i, t, g); else ld4(dh, i, t, g); }
        for (int k = 0; k < N; k++) {
            const float x = v[k] + bias[k];
            v[k] = dh ? g[k] * gelu_grad(x) : gelu(x);
        }
        if (N == 8) st8(out, i, t, v); else st4(out, i, t, v);
    }
}
extern "C" __global__ void bias_gelu(const void* y, const void* b, const void* dh, void* out,
                                     long long len, int cols, int t, int vec) {
    if (vec == 8) { bias_gelu_vec<8>(y, b, dh, out, len, cols, t); return; }
    if (vec == 4) { bias_gelu_vec<4>(y, b, dh, out, len, cols, t); return; }
    const long long threads = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long i = first; i < len; i += threads) {
        const float x = ld(y, i, t) + (b ? ld(b, column(i, len, cols), t) : 0.0f);
        st(out, i, t, dh ? ld(dh, i, t) * gelu_grad(x) : gelu(x));
    }
}
"#
);

static KERNELS: Kernels = Kernels::new("fused bias + GELU", KERNEL);

/// Passes (forward or backward) run by the kernel so far (read by `linear::gelu_kernel_calls`).
pub(crate) static CALLS: AtomicUsize = AtomicUsize::new(0);

/// The inputs, handed back when this path does not take them.
type Inputs<B, const D: usize> = (Tensor<B, D>, Option<Tensor<B, 1>>);

/// `gelu(y + b)` over `y`'s last axis on burn-cuda when the inputs suit it (f32, bf16 or f16,
/// `b` of `y`'s type and width, the GPU path and `fused_gelu` on, the kernel compiled);
/// otherwise the inputs come back.
pub(crate) fn try_bias_gelu<B: Backend, const D: usize>(
    y: Tensor<B, D>,
    b: Option<Tensor<B, 1>>,
) -> std::result::Result<Tensor<B, D>, Inputs<B, D>> {
    let dims = y.dims();
    let cols = dims[D - 1];
    let rows: usize = dims[..D - 1].iter().product();
    let suits = cuda_backend::<B>().is_some()
        && launch::path_enabled()
        && crate::nn::settings::options::get().fused_gelu
        && storage_type(y.dtype()).is_some()
        && b.as_ref().is_none_or(|b| b.dtype() == y.dtype() && b.dims()[0] == cols)
        && rows > 0
        && i32::try_from(cols).is_ok()
        && KERNELS.ptx().is_some();
    if !suits {
        return Err((y, b));
    }
    crate::nn::cuda::runtime::device_thread::check_failure();
    if cuda_backend::<B>() == Some(true) {
        let (y, b): (Tensor<Ad, D>, Option<Tensor<Ad, 1>>) = (cast(y), b.map(cast));
        return Ok(cast(autodiff_bias_gelu(y, b)));
    }
    let (y, b): (Tensor<Cuda, D>, Option<Tensor<Cuda, 1>>) = (cast(y), b.map(cast));
    let h = pass(y.into_primitive().tensor(), b.map(|b| b.into_primitive().tensor()), None);
    Ok(cast(Tensor::<Cuda, D>::from_primitive(TensorPrimitive::Float(h))))
}

/// The kernel's code for a storage type.
fn storage_type(dtype: DType) -> Option<i32> {
    match dtype {
        DType::F32 => Some(0),
        DType::BF16 => Some(1),
        DType::F16 => Some(2),
        _ => None,
    }
}

#[derive(Debug)]
struct BiasGelu;

/// The forward's inputs, for the backward (it recomputes their sum).
#[derive(Debug, Clone)]
struct Saved {
    y: Prim,
    b: Option<Prim>,
}

/// Parent 0 is `y`; parent 1, when there is one, is `b`.
impl<const N: usize> Backward<Cuda, N> for BiasGelu {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let dh = grads.consume::<Cuda>(&ops.node);
        let dy = pass(ops.state.y, ops.state.b, Some(dh));
        if let Some(Some(node)) = ops.parents.get(1) {
            grads.register::<Cuda>(node.id, row_sums(dy.clone()));
        }
        if let Some(node) = &ops.parents[0] {
            grads.register::<Cuda>(node.id, dy);
        }
    }
}

fn autodiff_bias_gelu<const D: usize>(y: Tensor<Ad, D>, b: Option<Tensor<Ad, 1>>) -> Tensor<Ad, D> {
    let y = y.into_primitive().tensor();
    let b = b.map(|b| b.into_primitive().tensor());
    let h = pass(y.primitive.clone(), b.as_ref().map(|b| b.primitive.clone()), None);
    let saved = Saved { y: y.primitive.clone(), b: b.as_ref().map(|b| b.primitive.clone()) };
    let out = match &b {
        Some(b) => track([&y, b], saved, h),
        None => track([&y], saved, h),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `h` as the output of a [`BiasGelu`] whose parents are `inputs`' nodes (`y`, then `b` when
/// there is one).
fn track<const N: usize>(inputs: [&FloatTensor<Ad>; N], saved: Saved, h: Prim) -> FloatTensor<Ad> {
    match BiasGelu.prepare::<NoCheckpointing>(inputs.map(|t| t.node.clone())).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(saved, h),
        OpsKind::UnTracked(prep) => prep.finish(h),
    }
}

/// Queues one pass: `gelu(y + b)` without `dh`, `dh · gelu'(y + b)` with it (`y`'s shape and type).
fn pass(y: Prim, b: Option<Prim>, dh: Option<Prim>) -> Prim {
    let (has_b, has_dh) = (b.is_some(), dh.is_some());
    // The output and the bias's column take the tensor's dims, never its buffer's (a packed
    // copy of a view may come back with other dims).
    let dims = y.shape.as_slice().to_vec();
    let outputs = [fusion_op::like(&y)];
    let inputs: Vec<Prim> = std::iter::once(y).chain(b).chain(dh).collect();
    let name = if has_dh { "bias_gelu_backward" } else { "bias_gelu" };
    let mut out = fusion_op::queue(name, inputs, &outputs, move |ins| {
        let mut ins = ins.into_iter().map(packed);
        let y = ins.next().expect("y");
        let b = has_b.then(|| ins.next().expect("b"));
        let dh = has_dh.then(|| ins.next().expect("dh"));
        vec![run(y, b, dh, &dims)]
    });
    out.pop().expect("one output")
}

/// On burn-fusion's thread: the output (of `dims`) allocated and the kernel queued.
fn run(y: Cube, b: Option<Cube>, dh: Option<Cube>, dims: &[usize]) -> Cube {
    let (len, cols) = (dims.iter().product::<usize>(), dims[dims.len() - 1]);
    let t = storage_type(y.dtype).expect("checked by try_bias_gelu");
    let out = empty(&y, dims);
    let tensors: Vec<&Cube> = std::iter::once(&y).chain(&b).chain(&dh).chain(std::iter::once(&out)).collect();
    let (has_b, has_dh, device) = (b.is_some(), dh.is_some(), y.device.index);
    launch::launch(&tensors, ("bias_gelu", has_dh), move |a, order| {
        let mut a = a.iter().copied();
        let y = a.next().expect("y");
        let b = if has_b { a.next().expect("b") } else { 0 };
        let dh = if has_dh { a.next().expect("dh") } else { 0 };
        let out = a.next().expect("out");
        // SAFETY: the addresses are live buffers of `device` of `len` elements (`b`: `cols`) in
        // storage type `t`, held by `launch` until enqueued.
        unsafe { cudnn::with_handle(device, order, |s| enqueue(device, s.cu_stream(), [y, b, dh, out], len, cols, t)) }
    })
    .unwrap_or_else(|e| panic!("fused bias + GELU: {e}"));
    CALLS.fetch_add(1, Ordering::Relaxed);
    out
}

/// Launches `bias_gelu` on `stream` over `[y, b, dh, out]` (0 for an absent `b` or `dh`), eight
/// or four elements per thread and step where the sizes and every address allow it.
///
/// # Safety
/// The non-zero addresses are live buffers of `device` (`len` elements, `b` `cols`) of storage
/// type `t`; its context is bound.
unsafe fn enqueue(
    device: usize,
    stream: cudarc::driver::sys::CUstream,
    [y, b, dh, out]: [u64; 4],
    len: usize,
    cols: usize,
    t: i32,
) -> Result<()> {
    let f = KERNELS.function(device, c"bias_gelu")?;
    let fits = |n: usize, align: u64| {
        len.is_multiple_of(n) && cols.is_multiple_of(n) && [y, b, dh, out].iter().all(|p| p.is_multiple_of(align))
    };
    // 16 bytes or more per thread where the buffers allow: 8-byte loads leave too few bytes in
    // flight to stream at the memory's speed (200 µs against 117 µs for torch.compile's GELU of
    // ViT-B/16's MLP at batch 128 on an H200, 2026-12-04).
    let vec: usize = if fits(8, 16) {
        8
    } else if fits(4, if t == 0 { 16 } else { 8 }) {
        4
    } else {
        1
    };
    let blocks = len.div_ceil(256 * vec).clamp(1, 1 << 24) as u32;
    let [mut y, mut b, mut dh, mut out] = [y, b, dh, out];
    let (mut len, mut cols, mut t, mut vec) = (len as i64, cols as i32, t, vec as i32);
    let p = |x: &mut u64| x as *mut u64 as *mut c_void;
    let mut args = [
        p(&mut y),
        p(&mut b),
        p(&mut dh),
        p(&mut out),
        &mut len as *mut i64 as *mut c_void,
        &mut cols as *mut i32 as *mut c_void,
        &mut t as *mut i32 as *mut c_void,
        &mut vec as *mut i32 as *mut c_void,
    ];
    // SAFETY: the arguments match `bias_gelu`'s signature; the caller vouches for the addresses.
    unsafe { launch_256(f, (blocks, 1), stream, &mut args) }
        .map_err(|e| Error::Kernel { op: "fused bias + GELU", reason: format!("launching bias_gelu: {e:?}") })
}
