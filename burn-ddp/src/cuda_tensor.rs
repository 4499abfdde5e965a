//! NCCL collectives on burn-cuda tensors, in place on their device memory (no host copy).
//!
//! The route: the fusion tensor is resolved to its `CubeTensor` (which flushes pending fused
//! work), burn's stream is synchronised, the buffer's device pointer goes to NCCL on the group's
//! own stream, and the group waits for NCCL before burn reads the buffer again. The fusion tensor
//! is kept alive during the call, so its id still names the (now reduced) buffer afterwards.

use crate::ReduceOp;
use crate::error::{Error, Result};
use crate::process_group::buffer::{Buffer, DType, Memory};
use crate::process_group::{AllReduceOptions, BroadcastOptions, ProcessGroup};
use burn::prelude::*;
use burn_cubecl::CubeBackend;
use burn_cuda::Cuda;
use cubecl::cuda::CudaRuntime;

type Inner = CubeBackend<CudaRuntime, f32, i32, u8>;

/// Runs `op` on the device buffer of `t`.
///
/// # Errors
/// [`Error::Cuda`] when the tensor is not f32, or when `op` fails.
fn with_device_buffer<const D: usize>(t: Tensor<Cuda, D>, op: impl FnOnce(Buffer<'_>) -> Result<()>) -> Result<Tensor<Cuda, D>> {
    // burn-cuda pitches the rows of 2-D and larger allocations (a [2, 2] tensor gets strides
    // [4, 1]); as one dimension the tensor is dense, copied only when it was pitched.
    let dims = t.dims();
    let flat: Tensor<Cuda, 1> = t.reshape([dims.iter().product::<usize>()]);
    let flat = with_dense_buffer(flat, op)?;
    Ok(flat.reshape(dims))
}

fn with_dense_buffer(t: Tensor<Cuda, 1>, op: impl FnOnce(Buffer<'_>) -> Result<()>) -> Result<Tensor<Cuda, 1>> {
    let prim = t.into_primitive().tensor();
    let len = prim.shape.num_elements();
    let keep = prim.clone();
    let client = prim.client.clone();
    let cube = client.resolve_tensor_float::<Inner>(prim);
    // Strides decide: the allocation may be padded past the last element, which NCCL never
    // touches (it reads and writes `len` elements from the start).
    if !cube.is_contiguous() || cube.dtype != burn::tensor::DType::F32 {
        return Err(Error::Cuda { op: "collective on a burn-cuda tensor".into(), reason: format!("needs a contiguous f32 tensor, got {:?} with strides {:?}", cube.dtype, cube.meta.strides()) });
    }
    let device = cube.device.index;
    <Inner as Backend>::sync(&cube.device).map_err(|e| Error::Cuda { op: "synchronising burn's stream".into(), reason: format!("{e:?}") })?;
    let resource = cube.client.get_resource(cube.handle.clone()).map_err(|e| Error::Cuda { op: "device pointer".into(), reason: format!("{e:?}") })?;
    let ptr = resource.resource().ptr;
    op(Buffer { dtype: DType::F32, len, memory: Memory::Cuda { ptr, device } })?;
    drop(resource);
    drop(cube);
    Ok(Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(keep)))
}

/// Reduces an f32 burn-cuda tensor (any layout) across ranks with NCCL, in place.
///
/// # Errors
/// As [`ProcessGroup::all_reduce`], and for a tensor that is not f32.
pub fn all_reduce<const D: usize>(pg: &dyn ProcessGroup, t: Tensor<Cuda, D>, op: ReduceOp) -> Result<Tensor<Cuda, D>> {
    let opts = AllReduceOptions { op, timeout: None };
    with_device_buffer(t, |buf| crate::collective_time::timed(|| pg.all_reduce(buf, &opts)))
}

/// Rank `root`'s burn-cuda tensor on every rank, with NCCL, in place.
///
/// # Errors
/// As [`ProcessGroup::broadcast`].
pub fn broadcast<const D: usize>(pg: &dyn ProcessGroup, t: Tensor<Cuda, D>, root: usize) -> Result<Tensor<Cuda, D>> {
    let opts = BroadcastOptions { root, timeout: None };
    with_device_buffer(t, |buf| pg.broadcast(buf, &opts))
}
