//! burn-vision's device computations (cuDNN, its own kernels) as operations of burn-fusion's
//! stream, so the training thread never waits for a buffer.
//!
//! burn-cuda is `Fusion<CubeBackend<Cuda>>`: the training thread queues every tensor operation
//! to burn-fusion's server thread, which fuses them and launches kernels through cubecl's
//! compute thread. Reading a tensor's buffer from the training thread (`resolve_tensor_float`)
//! is a blocking round trip: it waits until the fusion thread has drained everything queued
//! before. An operation registered here is queued like burn's own: it runs later *on* the fusion
//! thread, in stream order, with its inputs' buffers in hand, and hands its outputs' buffers to
//! the same handle table burn's operations read. The training thread only describes it (shapes
//! and types of the outputs) and moves on.
//!
//! What runs inside must not block on the fusion thread (that would deadlock); launching cubecl
//! kernels, queueing work on cubecl's compute thread and waiting for that thread are fine.

use crate::nn::cuda::runtime::launch::{Inner, Prim};
use burn::tensor::{DType, Shape};
use burn_cubecl::fusion::FusionCubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr, TensorStatus};
use cubecl::cuda::CudaRuntime;

/// A buffer of burn-cuda's inner backend.
pub(crate) type Cube = CubeTensor<CudaRuntime>;
type Handles = HandleContainer<<FusionCubeRuntime<CudaRuntime> as burn_fusion::FusionRuntime>::FusionHandle>;
/// The inputs' buffers, each with whether this operation is its tensor's last user (burn-fusion's
/// read-write status: no later operation reads that tensor, so its buffer may be written).
type Exec = dyn Fn(Vec<(Cube, bool)>) -> Vec<Cube> + Send + Sync;

/// An operation's inputs and outputs as burn-fusion sees them, and what it computes.
struct CustomOp {
    desc: CustomOpIr,
    exec: Box<Exec>,
}

impl std::fmt::Debug for CustomOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomOp({})", self.desc.id)
    }
}

impl Operation<FusionCubeRuntime<CudaRuntime>> for CustomOp {
    fn execute(&self, handles: &mut Handles) {
        let inputs = self
            .desc
            .inputs
            .iter()
            .map(|t| (handles.get_float_tensor::<Inner>(t), t.status == TensorStatus::ReadWrite))
            .collect();
        let outputs = (self.exec)(inputs);
        assert_eq!(
            outputs.len(),
            self.desc.outputs.len(),
            "{}: {} outputs computed, {} declared",
            self.desc.id,
            outputs.len(),
            self.desc.outputs.len()
        );
        for (ir, out) in self.desc.outputs.iter().zip(outputs) {
            debug_assert_eq!(out.meta.shape(), &ir.shape, "{}: output shape", self.desc.id);
            handles.register_float_tensor::<Inner>(&ir.id, out);
        }
    }
}

/// Queues `exec` on `inputs`' fusion stream and returns its outputs, one per `(shape, dtype)`
/// of `outputs`, at once. `exec` later receives the inputs' buffers, in order, on the fusion
/// thread and must return buffers of exactly the declared shapes and types (they may be
/// strided). Inputs are float tensors of one device.
///
/// # Panics
/// When `inputs` is empty.
pub(crate) fn queue(
    name: &'static str,
    inputs: Vec<Prim>,
    outputs: &[(Shape, DType)],
    exec: impl Fn(Vec<Cube>) -> Vec<Cube> + Send + Sync + 'static,
) -> Vec<Prim> {
    queue_owned(name, inputs, outputs, move |ins| exec(ins.into_iter().map(|(t, _)| t).collect()))
}

/// [`queue`], with each input's buffer paired with whether this operation is its tensor's last
/// user. Writing into such a buffer is safe only when no other tensor shares it either (a view
/// does: check `can_mut` too).
pub(crate) fn queue_owned(
    name: &'static str,
    inputs: Vec<Prim>,
    outputs: &[(Shape, DType)],
    exec: impl Fn(Vec<(Cube, bool)>) -> Vec<Cube> + Send + Sync + 'static,
) -> Vec<Prim> {
    let client = inputs.first().expect("an operation has inputs").client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let ins: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let outs: Vec<TensorIr> = outputs
        .iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape.clone(), *dtype))
        .collect();
    let desc = CustomOpIr::new(name, &ins, &outs);
    client.register(streams, OperationIr::Custom(desc.clone()), CustomOp { desc, exec: Box::new(exec) })
}

/// The buffer packed (dense row-major in its dims' order): itself when it already is, else a
/// copy (burn-cuda pitches rows; views are strided).
pub(crate) fn packed(t: Cube) -> Cube {
    burn_cubecl::kernel::into_contiguous(t)
}

/// The buffer packed, checked to be row-major (what plans built for packed strides need).
pub(crate) fn dense(t: Cube) -> Cube {
    let t = packed(t);
    assert!(is_row_major(t.meta.shape().as_slice(), t.meta.strides()), "a packed buffer has row-major strides");
    t
}

/// Whether `strides` (in elements) are those of a packed row-major buffer of `dims`: each the
/// product of the dims after it. Allocates nothing: asked once per gradient every DDP step.
pub(crate) fn is_row_major(dims: &[usize], strides: &[usize]) -> bool {
    dims.len() == strides.len()
        && dims.iter().zip(strides).rev().try_fold(1usize, |want, (&d, &s)| (s == want).then(|| want * d)).is_some()
}

/// `(shape, dtype)` of a tensor, for [`queue`]'s outputs.
pub(crate) fn like(t: &Prim) -> (Shape, DType) {
    (t.shape.clone(), t.dtype)
}

#[cfg(test)]
mod tests {
    use super::is_row_major;

    /// The strides of a packed row-major buffer of `dims`, in elements.
    fn row_major(dims: &[usize]) -> Vec<usize> {
        (0..dims.len()).map(|i| dims[i + 1..].iter().product()).collect()
    }

    #[test]
    fn is_row_major_agrees_with_the_strides_row_major_lists() {
        for dims in [vec![], vec![7], vec![3, 1, 5], vec![64, 3, 7, 7], vec![2, 0, 4]] {
            assert!(is_row_major(&dims, &row_major(&dims)), "{dims:?}");
        }
        // A transposed view, a pitched row and a broadcast: not packed.
        assert!(!is_row_major(&[3, 5], &[1, 3]));
        assert!(!is_row_major(&[3, 5], &[8, 1]));
        assert!(!is_row_major(&[3, 5], &[0, 1]));
        assert!(!is_row_major(&[3, 5], &[5]));
    }
}
