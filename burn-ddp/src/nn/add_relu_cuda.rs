//! `add_relu` (add_relu.rs) on burn-cuda: cubecl kernels queued as burn-fusion operations
//! ([`fusion_op::queue`]), so they run in order on burn's own stream. The forward writes
//! `max(a + b, 0)` to a new buffer; the backward writes `dy · [y > 0]` over `dy`'s buffer when
//! burn-fusion handed it over unshared (its last use), into a new one otherwise.

use super::add_relu_kernels::{add_relu_kernel, relu_grad_in_place_kernel, relu_grad_kernel};
use super::cudnn_burn::{Ad, Prim, cast, cuda_backend, empty};
use super::fusion_op::{self, Cube, packed};
use burn::prelude::*;
use burn::tensor::ops::ActivationOps;
use burn::tensor::{DType, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::{CubeCount, CubeDim, TensorArg};
use std::sync::atomic::{AtomicUsize, Ordering};

static IN_PLACE: AtomicUsize = AtomicUsize::new(0);

/// How many of `add_relu`'s backward passes on burn-cuda wrote over the incoming gradient (the
/// GPU check reads it).
pub fn in_place_backwards() -> usize {
    IN_PLACE.load(Ordering::Relaxed)
}

/// Threads per block of the elementwise kernels.
const THREADS: u32 = 256;

/// The widest vector (up to 16 bytes) that divides the element count and that every buffer's
/// start is aligned for; the vector count; the grid.
fn grid(elements: usize, elem_bytes: usize, buffers: &[&Cube]) -> (usize, u32, CubeCount, CubeDim) {
    let aligned = |n: usize| buffers.iter().all(|t| t.handle.offset_start.unwrap_or(0).is_multiple_of((n * elem_bytes) as u64));
    let n = [8usize, 4, 2, 1].into_iter().find(|&n| n * elem_bytes <= 16 && elements.is_multiple_of(n) && aligned(n)).unwrap_or(1);
    let vectors = elements / n;
    (n, vectors as u32, CubeCount::Static(vectors.div_ceil(THREADS as usize) as u32, 1, 1), CubeDim::new_1d(THREADS))
}

fn arg(t: &Cube) -> TensorArg<CudaRuntime> {
    t.clone().into_tensor_arg()
}

/// Whether the kernels take these operands: one float type they handle, one shape, fewer than
/// 2³¹ elements.
fn supported(a: &Prim, b: &Prim) -> bool {
    matches!(a.dtype, DType::F32 | DType::BF16 | DType::F16) && a.dtype == b.dtype && a.shape == b.shape && a.shape.num_elements() < (1 << 31)
}

/// The forward: one new buffer.
fn forward(a: Prim, b: Prim) -> Prim {
    let out = [fusion_op::like(&a)];
    let y = fusion_op::queue("add_relu", vec![a, b], &out, |ins| {
        let [a, b]: [Cube; 2] = ins.try_into().expect("two inputs");
        let (a, b) = (packed(a), packed(b));
        let y = empty(&a, a.meta.shape().as_slice());
        let (n, vectors, count, dim) = grid(a.meta.num_elements(), a.dtype.size(), &[&a, &b, &y]);
        add_relu_kernel::launch::<CudaRuntime>(&a.client, count, dim, n, arg(&a), arg(&b), arg(&y), vectors, a.dtype.into());
        vec![y]
    });
    y.into_iter().next().expect("one output")
}

/// `dy · [y > 0]`, over `dy`'s buffer when burn-fusion handed it over unshared.
fn masked(dy: Prim, y: Prim) -> Prim {
    if !supported(&dy, &y) {
        return <Cuda as ActivationOps<Cuda>>::relu_backward(y, dy);
    }
    let out = [fusion_op::like(&dy)];
    let g = fusion_op::queue("relu_grad", vec![dy, y], &out, |ins| {
        let [dy, y]: [Cube; 2] = ins.try_into().expect("two inputs");
        let (dy, y) = (packed(dy), packed(y));
        let elements = dy.meta.num_elements();
        if dy.can_mut() {
            IN_PLACE.fetch_add(1, Ordering::Relaxed);
            let (n, vectors, count, dim) = grid(elements, dy.dtype.size(), &[&dy, &y]);
            relu_grad_in_place_kernel::launch::<CudaRuntime>(&dy.client, count, dim, n, arg(&dy), arg(&y), vectors, dy.dtype.into());
            return vec![dy];
        }
        let g = empty(&dy, dy.meta.shape().as_slice());
        let (n, vectors, count, dim) = grid(elements, dy.dtype.size(), &[&dy, &y, &g]);
        relu_grad_kernel::launch::<CudaRuntime>(&dy.client, count, dim, n, arg(&dy), arg(&y), arg(&g), vectors, dy.dtype.into());
        vec![g]
    });
    g.into_iter().next().expect("one output")
}

#[derive(Debug)]
struct AddRelu;

impl Backward<Cuda, 2> for AddRelu {
    /// The forward's output.
    type State = Prim;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_a, node_b] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        let g = masked(dy, ops.state);
        match (node_a, node_b) {
            (Some(a), Some(b)) => {
                grads.register::<Cuda>(a.id, g.clone());
                grads.register::<Cuda>(b.id, g);
            }
            (Some(only), None) | (None, Some(only)) => grads.register::<Cuda>(only.id, g),
            (None, None) => {}
        }
    }
}

fn train<const D: usize>(a: Tensor<Ad, D>, b: Tensor<Ad, D>) -> Tensor<Ad, D> {
    let (a, b) = (a.into_primitive().tensor(), b.into_primitive().tensor());
    let y = forward(a.primitive, b.primitive);
    let out = match AddRelu.prepare::<NoCheckpointing>([a.node, b.node]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(y.clone(), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `add_relu` on burn-cuda, or the operands back untouched (another backend, or operands the
/// kernels do not take).
#[allow(clippy::type_complexity)]
pub(super) fn try_add_relu<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> std::result::Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    let same = a.dims() == b.dims() && a.dtype() == b.dtype() && matches!(a.dtype(), DType::F32 | DType::BF16 | DType::F16) && a.shape().num_elements() < (1 << 31);
    match cuda_backend::<B>() {
        Some(true) if same => Ok(cast(train::<D>(cast(a), cast(b)))),
        Some(false) if same => {
            let (a, b): (Tensor<Cuda, D>, Tensor<Cuda, D>) = (cast(a), cast(b));
            let y = forward(a.into_primitive().tensor(), b.into_primitive().tensor());
            Ok(cast(Tensor::<Cuda, D>::from_primitive(TensorPrimitive::Float(y))))
        }
        _ => Err((a, b)),
    }
}
