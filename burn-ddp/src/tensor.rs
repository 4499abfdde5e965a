//! Collectives on burn tensors, so higher layers never touch raw buffers.
//!
//! With a host-memory group (tcp) the tensor goes through the host: this works for every
//! backend. With a CUDA-memory group (nccl) and a burn-cuda tensor, `all_reduce` and
//! `broadcast` work in place on device memory (`cuda_tensor`, behind `feature = "cuda"`).

pub use crate::collective_time::collective_seconds;
use crate::collective_time::timed;
use crate::error::{Error, Result};
use crate::process_group::buffer::MemoryKind;
use crate::process_group::*;
#[cfg(feature = "cuda")]
use crate::same_type::cast;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType as BurnDType, TensorData};

fn dtype_of(d: BurnDType) -> Result<DType> {
    Ok(match d {
        BurnDType::F32 => DType::F32,
        BurnDType::F64 => DType::F64,
        BurnDType::I64 => DType::I64,
        BurnDType::BF16 => DType::BF16,
        BurnDType::F16 => DType::F16,
        other => {
            return Err(Error::Cuda {
                op: "collective".into(),
                reason: format!("element type {other:?} is not supported (f32, f64, i64, bf16, f16)"),
            });
        }
    })
}

fn host_only(pg: &dyn ProcessGroup) -> Result<()> {
    match pg.memory() {
        MemoryKind::Host => Ok(()),
        MemoryKind::Cuda => Err(Error::Cuda {
            op: "tensor collective".into(),
            reason: "this process group works on CUDA memory; use burn_ddp::cuda_tensor helpers with burn-cuda tensors"
                .into(),
        }),
    }
}

/// Applies `f` to the tensor's bytes on the host and rebuilds it on its device.
fn host_round_trip<B: Backend, const D: usize>(
    t: Tensor<B, D>,
    f: impl FnOnce(Buffer<'_>) -> Result<()>,
) -> Result<Tensor<B, D>> {
    let device = t.device();
    let data = t.into_data();
    let (shape, dtype) = (data.shape.clone(), data.dtype);
    let mut bytes = data.into_bytes().to_vec();
    f(Buffer::host(dtype_of(dtype)?, &mut bytes))?;
    Ok(Tensor::from_data(TensorData::from_bytes_vec(bytes, shape, dtype), &device))
}

/// Reduces a float tensor element-wise across ranks; every rank gets the result.
///
/// # Errors
/// As [`ProcessGroup::all_reduce`].
pub fn all_reduce<B: Backend, const D: usize>(
    pg: &dyn ProcessGroup,
    t: Tensor<B, D>,
    op: ReduceOp,
) -> Result<Tensor<B, D>> {
    #[cfg(feature = "cuda")]
    let t = match on_cuda(pg, t, |pg, t| crate::cuda_tensor::all_reduce(pg, t, op))? {
        Ok(done) => return Ok(done),
        Err(t) => t,
    };
    host_only(pg)?;
    host_round_trip(t, |buf| timed(|| pg.all_reduce(buf, &AllReduceOptions { op, timeout: None })))
}

/// With a CUDA-memory group and a burn-cuda tensor, runs `f` on it (`Ok(Ok(result))`);
/// otherwise hands the tensor back (`Ok(Err(t))`).
#[cfg(feature = "cuda")]
fn on_cuda<B: Backend, const D: usize>(
    pg: &dyn ProcessGroup,
    t: Tensor<B, D>,
    f: impl FnOnce(&dyn ProcessGroup, Tensor<burn_cuda::Cuda, D>) -> Result<Tensor<burn_cuda::Cuda, D>>,
) -> Result<std::result::Result<Tensor<B, D>, Tensor<B, D>>> {
    if pg.memory() != MemoryKind::Cuda {
        return Ok(Err(t));
    }
    type Ad = burn_autodiff::Autodiff<burn_cuda::Cuda>;
    let t = match cast::<_, Tensor<burn_cuda::Cuda, D>>(t) {
        Ok(cuda) => return Ok(Ok(cast(f(pg, cuda)?).unwrap_or_else(|_| unreachable!("the same type as the input")))),
        Err(t) => t,
    };
    match cast::<_, Tensor<Ad, D>>(t) {
        // A parameter of a model trained on Autodiff<Cuda>: the collective works on its values
        // and the result is a fresh leaf, tracked again when the input was.
        Ok(ad) => {
            let tracked = ad.is_require_grad();
            let mut done = Tensor::<Ad, D>::from_inner(f(pg, ad.inner())?);
            if tracked {
                done = done.require_grad();
            }
            Ok(Ok(cast(done).unwrap_or_else(|_| unreachable!("the same type as the input"))))
        }
        Err(t) => Ok(Err(t)),
    }
}

/// Every rank gets rank `root`'s tensor (shapes must match).
///
/// # Errors
/// As [`ProcessGroup::broadcast`].
pub fn broadcast<B: Backend, const D: usize>(
    pg: &dyn ProcessGroup,
    t: Tensor<B, D>,
    root: usize,
) -> Result<Tensor<B, D>> {
    #[cfg(feature = "cuda")]
    let t = match on_cuda(pg, t, |pg, t| crate::cuda_tensor::broadcast(pg, t, root))? {
        Ok(done) => return Ok(done),
        Err(t) => t,
    };
    host_only(pg)?;
    host_round_trip(t, |buf| pg.broadcast(buf, &BroadcastOptions { root, timeout: None }))
}

/// Concatenates every rank's tensor along dimension 0, in rank order.
///
/// # Shapes
/// `[n, ...]` on every rank → `[world · n, ...]`
///
/// # Errors
/// As [`ProcessGroup::all_gather`].
pub fn all_gather<B: Backend, const D: usize>(pg: &dyn ProcessGroup, t: Tensor<B, D>) -> Result<Tensor<B, D>> {
    host_only(pg)?;
    let device = t.device();
    let data = t.into_data();
    let (mut shape, dtype) = (data.shape.clone(), data.dtype);
    let mut input = data.into_bytes().to_vec();
    let mut output = vec![0u8; input.len() * pg.world_size()];
    let d = dtype_of(dtype)?;
    pg.all_gather(Buffer::host(d, &mut input), Buffer::host(d, &mut output), &AllGatherOptions::default())?;
    shape[0] *= pg.world_size();
    Ok(Tensor::from_data(TensorData::from_bytes_vec(output, shape, dtype), &device))
}

/// Sums float values (one per rank entry of `values`) across ranks on the host: a convenience
/// for metrics.
///
/// # Errors
/// As [`ProcessGroup::all_reduce`].
pub fn all_reduce_f64(pg: &dyn ProcessGroup, values: &mut [f64], op: ReduceOp) -> Result<()> {
    // SAFETY: f64 has no invalid bit patterns; the byte length is scaled.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(values)) };
    pg.all_reduce(Buffer::host(DType::F64, bytes), &AllReduceOptions { op, timeout: None })
}

/// What [`join_on_device`] waits for: one [`all_reduce_on_device`]'s end.
#[derive(Clone)]
pub struct DeviceJoin(#[cfg(feature = "cuda")] crate::nn::cuda::runtime::side_stream::Join);

/// Whether `pg` sums `B`'s tensors on `device` on the device, without the host waiting
/// (burn-cuda tensors on an NCCL group: `cuda_tensor::orders_on_device`).
pub fn orders_on_device<B: Backend>(pg: &dyn ProcessGroup, device: &B::Device) -> bool {
    #[cfg(feature = "cuda")]
    if let Some(d) = (device as &dyn std::any::Any).downcast_ref::<burn_cuda::CudaDevice>() {
        return std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn_cuda::Cuda>()
            && crate::cuda_tensor::orders_on_device(pg, d.index);
    }
    let _ = (pg, device);
    false
}

/// Starts summing `t` over the ranks on the device (each rank's values times `scale` first,
/// when given: `1 / world` averages) and returns at once: NCCL's stream waits on the device for
/// burn's kernels that produce `t`, and nobody waits for NCCL until [`join_on_device`], which
/// must be given the result before anything reads it. Only where [`orders_on_device`]; DDP's
/// buckets take this route there.
///
/// # Errors
/// As `cuda_tensor::all_reduce_ordered`; [`Error::Unsupported`] elsewhere.
pub fn all_reduce_on_device<B: Backend>(
    pg: std::sync::Arc<dyn ProcessGroup>,
    t: Tensor<B, 1>,
    scale: Option<f32>,
    label: String,
) -> Result<(Tensor<B, 1>, DeviceJoin)> {
    #[cfg(feature = "cuda")]
    let t = match cast::<Tensor<B, 1>, Tensor<burn_cuda::Cuda, 1>>(t) {
        Ok(cuda) => {
            let (summed, join) = crate::cuda_tensor::all_reduce_ordered(pg, cuda, scale, label)?;
            return Ok((cast(summed).unwrap_or_else(|_| unreachable!("B is burn-cuda")), DeviceJoin(join)));
        }
        Err(t) => t,
    };
    let _ = (pg, t, scale);
    Err(Error::Unsupported { what: format!("{label}: summing on the device needs burn-cuda tensors on an NCCL group") })
}

/// `t` from [`all_reduce_on_device`], readable: burn's stream waits for the sum on the device.
pub fn join_on_device<B: Backend>(t: Tensor<B, 1>, join: &DeviceJoin) -> Tensor<B, 1> {
    #[cfg(feature = "cuda")]
    let t = match cast::<Tensor<B, 1>, Tensor<burn_cuda::Cuda, 1>>(t) {
        Ok(cuda) => {
            let joined =
                crate::nn::cuda::runtime::side_stream::join(vec![cuda.into_primitive().tensor()], &join.0).remove(0);
            return cast(Tensor::<burn_cuda::Cuda, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(joined)))
                .unwrap_or_else(|_| unreachable!("B is burn-cuda"));
        }
        Err(t) => t,
    };
    let _ = join;
    t
}

/// A DDP bucket summed on the device (from [`all_reduce_bucket_on_device`]): read it only
/// through [`join_buckets_on_device`] or a later bucket's [`Started::Joined`].
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct DeviceBucket<B: Backend> {
    /// What the join is given; the other gradients are held by the bucket's operation.
    token: FloatTensor<B>,
    /// The bucket's gradients, and whether presence counts follow them.
    shape: (usize, bool),
    join: DeviceJoin,
}

/// A joined bucket: its averaged gradients, and its summed presence counts when they travelled.
pub(crate) type JoinedBucket<B> = (Vec<FloatTensor<B>>, Option<FloatTensor<B>>);

/// A bucket's sum once started on the device: in flight, or — when it was given the step's
/// earlier buckets to join (its step's last) — every one of them joined, earlier ones first.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum Started<B: Backend> {
    InFlight(DeviceBucket<B>),
    Joined(Vec<JoinedBucket<B>>),
}

/// Starts averaging `grads` (f32, any shapes) over the ranks on the device, as one collective
/// over a flat buffer of `flat` (f32, bf16 or f16), with `presence` (f32 counts) summed beside
/// them; returns at once (see `cuda_tensor::all_reduce_bucket`). `(label, diagnose)`: the
/// bucket's name, and what a world of one's diagnosis leaves out. `join_with`: the step's
/// earlier buckets, to be joined with this one in the same operation (the step's last bucket:
/// [`Started::Joined`]). Only where [`orders_on_device`].
///
/// # Errors
/// As `cuda_tensor::all_reduce_bucket` (the buckets of `join_with` are joined all the same);
/// [`Error::Unsupported`] elsewhere.
pub(crate) fn all_reduce_bucket_on_device<B: Backend>(
    pg: std::sync::Arc<dyn ProcessGroup>,
    (grads, presence): (Vec<FloatTensor<B>>, Option<FloatTensor<B>>),
    flat: BurnDType,
    (label, diagnose): (String, crate::diagnose::Diagnose),
    join_with: Option<Vec<DeviceBucket<B>>>,
) -> Result<Started<B>> {
    #[cfg(feature = "cuda")]
    if std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn_cuda::Cuda>() {
        use crate::cuda_tensor::{self as ct, Then};
        let then = join_with.map_or(Then::Later, |b| Then::JoinWith(b.into_iter().map(to_cuda::<B>).collect()));
        let bucket = (grads.into_iter().map(to_cuda_tensor::<B>).collect(), presence.map(to_cuda_tensor::<B>));
        return Ok(match ct::all_reduce_bucket(pg, bucket, flat, (label, diagnose), then)? {
            ct::Started::InFlight(b) => Started::InFlight(from_cuda::<B>(b)),
            ct::Started::Joined(all) => Started::Joined(all.into_iter().map(joined_from_cuda::<B>).collect()),
        });
    }
    let _ = (pg, grads, presence, flat, diagnose, join_with);
    Err(Error::Unsupported { what: format!("{label}: summing on the device needs burn-cuda tensors on an NCCL group") })
}

/// Each bucket's averaged gradients and summed presence counts, readable: burn's stream waits
/// for the buckets' collectives on the device (one operation for all of them).
pub(crate) fn join_buckets_on_device<B: Backend>(buckets: Vec<DeviceBucket<B>>) -> Vec<JoinedBucket<B>> {
    #[cfg(feature = "cuda")]
    if std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn_cuda::Cuda>() {
        let all = crate::cuda_tensor::join_in_flight(buckets.into_iter().map(to_cuda::<B>).collect());
        return all.into_iter().map(joined_from_cuda::<B>).collect();
    }
    assert!(buckets.is_empty(), "buckets are summed on the device only on burn-cuda");
    Vec::new()
}

/// `B`'s tensor as burn-cuda's (`B` is burn-cuda).
#[cfg(feature = "cuda")]
fn to_cuda_tensor<B: Backend>(t: FloatTensor<B>) -> FloatTensor<burn_cuda::Cuda> {
    cast(t).unwrap_or_else(|_| unreachable!("B is burn-cuda"))
}

/// A bucket of `B` as burn-cuda's (`B` is burn-cuda).
#[cfg(feature = "cuda")]
fn to_cuda<B: Backend>(b: DeviceBucket<B>) -> crate::cuda_tensor::BucketInFlight {
    crate::cuda_tensor::BucketInFlight { token: to_cuda_tensor::<B>(b.token), shape: b.shape, join: b.join.0 }
}

/// A burn-cuda bucket as `B`'s (`B` is burn-cuda).
#[cfg(feature = "cuda")]
fn from_cuda<B: Backend>(b: crate::cuda_tensor::BucketInFlight) -> DeviceBucket<B> {
    DeviceBucket { token: from_cuda_tensor::<B>(b.token), shape: b.shape, join: DeviceJoin(b.join) }
}

/// A joined burn-cuda bucket as `B`'s (`B` is burn-cuda).
#[cfg(feature = "cuda")]
fn joined_from_cuda<B: Backend>(
    (grads, presence): (Vec<FloatTensor<burn_cuda::Cuda>>, Option<FloatTensor<burn_cuda::Cuda>>),
) -> JoinedBucket<B> {
    (grads.into_iter().map(from_cuda_tensor::<B>).collect(), presence.map(from_cuda_tensor::<B>))
}

/// A burn-cuda tensor as `B`'s (`B` is burn-cuda).
#[cfg(feature = "cuda")]
fn from_cuda_tensor<B: Backend>(t: FloatTensor<burn_cuda::Cuda>) -> FloatTensor<B> {
    cast(t).unwrap_or_else(|_| unreachable!("B is burn-cuda"))
}
