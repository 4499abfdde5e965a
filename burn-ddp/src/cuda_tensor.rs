//! NCCL collectives on burn-cuda tensors, in place on their device memory (no host copy).
//!
//! The route: the fusion tensor is resolved to its `CubeTensor` (which flushes pending fused
//! work), burn's stream is synchronised, the buffer's device pointer goes to NCCL on the group's
//! own stream, and the group waits for NCCL before burn reads the buffer again. The fusion tensor
//! is kept alive during the call, so its id still names the (now reduced) buffer afterwards.

use crate::error::{Error, Result};
use crate::process_group::buffer::{Buffer, DType, Memory};
use crate::process_group::{AllReduceOptions, BroadcastOptions, ProcessGroup};
use crate::ReduceOp;
use burn::prelude::*;
use burn_cubecl::CubeBackend;
use burn_cuda::Cuda;
use cubecl::cuda::CudaRuntime;

type Inner = CubeBackend<CudaRuntime, f32, i32, u8>;

/// Runs `op` on the device buffer of `t`; `None` when the tensor is not one contiguous f32 buffer
/// (the caller then goes through the host).
fn with_device_buffer<const D: usize>(t: Tensor<Cuda, D>, op: impl FnOnce(Buffer<'_>) -> Result<()>) -> Result<Option<Tensor<Cuda, D>>> {
    let prim = t.into_primitive().tensor();
    let len = prim.shape.num_elements();
    let keep = prim.clone();
    let client = prim.client.clone();
    let cube = client.resolve_tensor_float::<Inner>(prim);
    if !cube.is_contiguous_buffer() || cube.dtype != burn::tensor::DType::F32 {
        return Ok(None);
    }
    let device = cube.device.index;
    <Inner as Backend>::sync(&cube.device).map_err(|e| Error::Cuda { op: "synchronising burn's stream".into(), reason: format!("{e:?}") })?;
    let resource = cube.client.get_resource(cube.handle.clone()).map_err(|e| Error::Cuda { op: "device pointer".into(), reason: format!("{e:?}") })?;
    let ptr = resource.resource().ptr;
    op(Buffer { dtype: DType::F32, len, memory: Memory::Cuda { ptr, device } })?;
    drop(resource);
    drop(cube);
    Ok(Some(Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(keep))))
}

/// Reduces a burn-cuda tensor across ranks with NCCL, in place; falls back to a host round trip
/// for a non-contiguous tensor.
///
/// # Errors
/// As [`ProcessGroup::all_reduce`].
pub fn all_reduce<const D: usize>(pg: &dyn ProcessGroup, t: Tensor<Cuda, D>, op: ReduceOp) -> Result<Tensor<Cuda, D>> {
    let opts = AllReduceOptions { op, timeout: None };
    match with_device_buffer(t.clone(), |buf| pg.all_reduce(buf, &opts))? {
        Some(t) => Ok(t),
        None => crate::tensor::host_round_trip(t, |buf| pg.all_reduce(buf, &opts)),
    }
}

/// Rank `root`'s burn-cuda tensor on every rank, with NCCL, in place.
///
/// # Errors
/// As [`ProcessGroup::broadcast`].
pub fn broadcast<const D: usize>(pg: &dyn ProcessGroup, t: Tensor<Cuda, D>, root: usize) -> Result<Tensor<Cuda, D>> {
    let opts = BroadcastOptions { root, timeout: None };
    match with_device_buffer(t.clone(), |buf| pg.broadcast(buf, &opts))? {
        Some(t) => Ok(t),
        None => crate::tensor::host_round_trip(t, |buf| pg.broadcast(buf, &opts)),
    }
}
