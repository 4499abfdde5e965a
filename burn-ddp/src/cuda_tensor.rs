//! NCCL collectives on burn-cuda tensors, in place on their device memory (no host copy).
//!
//! The route: the fusion tensor is resolved to its `CubeTensor` (which flushes pending fused
//! work), burn's stream is synchronised, the buffer's device pointer goes to NCCL on the group's
//! own stream, and the group waits for NCCL before burn reads the buffer again. The fusion tensor
//! is kept alive during the call, so its id still names the (now reduced) buffer afterwards.
//!
//! DDP's buckets take another route, [`all_reduce_bucket`] (and SyncBatchNorm's exchanges
//! [`all_reduce_ordered`]): NCCL's stream is ordered after burn's on the device and burn's after
//! NCCL's only where the result is read, so backward goes on computing while a bucket is
//! summed, and the host waits for neither.

use crate::ReduceOp;
use crate::diagnose::Diagnose;
use crate::error::{Error, Result};
use crate::nn::cuda::kernels::bucket_copy;
use crate::nn::cuda::runtime::side_stream;
use crate::process_group::buffer::{Buffer, DType, Memory};
use crate::process_group::nccl::DeviceReduction;
use crate::process_group::{AllReduceOptions, BroadcastOptions, ProcessGroup};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::FloatTensor;
use burn_cubecl::CubeBackend;
use burn_cuda::Cuda;
use cubecl::cuda::CudaRuntime;
use std::sync::Arc;

type Inner = CubeBackend<CudaRuntime, f32, i32, u8>;

/// Runs `op` on the device buffer of `t`.
///
/// # Errors
/// [`Error::Cuda`] when the tensor is not f32, bf16 or f16, or when `op` fails.
fn with_device_buffer<const D: usize>(
    t: Tensor<Cuda, D>,
    op: impl FnOnce(Buffer<'_>) -> Result<()>,
) -> Result<Tensor<Cuda, D>> {
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
    let dtype = match cube.dtype {
        burn::tensor::DType::F32 => DType::F32,
        burn::tensor::DType::BF16 => DType::BF16,
        burn::tensor::DType::F16 => DType::F16,
        other => {
            return Err(Error::Cuda {
                op: "collective on a burn-cuda tensor".into(),
                reason: format!("needs an f32, bf16 or f16 tensor, got {other:?}"),
            });
        }
    };
    if !cube.is_contiguous() {
        return Err(Error::Cuda {
            op: "collective on a burn-cuda tensor".into(),
            reason: format!("needs a contiguous tensor, got strides {:?}", cube.meta.strides()),
        });
    }
    let device = cube.device.index;
    <Inner as Backend>::sync(&cube.device)
        .map_err(|e| Error::Cuda { op: "synchronising burn's stream".into(), reason: format!("{e:?}") })?;
    let resource = cube
        .client
        .get_resource(cube.handle.clone())
        .map_err(|e| Error::Cuda { op: "device pointer".into(), reason: format!("{e:?}") })?;
    let ptr = resource.resource().ptr;
    op(Buffer { dtype, len, memory: Memory::Cuda { ptr, device } })?;
    drop(resource);
    drop(cube);
    Ok(Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(keep)))
}

/// Reduces an f32, bf16 or f16 burn-cuda tensor (any layout) across ranks with NCCL, in place.
///
/// # Errors
/// As [`ProcessGroup::all_reduce`], and for a tensor of another type.
pub fn all_reduce<const D: usize>(pg: &dyn ProcessGroup, t: Tensor<Cuda, D>, op: ReduceOp) -> Result<Tensor<Cuda, D>> {
    let opts = AllReduceOptions { op, timeout: None };
    with_device_buffer(t, |buf| pg.all_reduce(buf, &opts))
}

/// Rank `root`'s burn-cuda tensor on every rank, with NCCL, in place.
///
/// # Errors
/// As [`ProcessGroup::broadcast`].
pub fn broadcast<const D: usize>(pg: &dyn ProcessGroup, t: Tensor<Cuda, D>, root: usize) -> Result<Tensor<Cuda, D>> {
    let opts = BroadcastOptions { root, timeout: None };
    with_device_buffer(t, |buf| pg.broadcast(buf, &opts))
}

/// Starts the sum of `t` (f32) over `pg`'s ranks on NCCL's stream, each rank's values first
/// multiplied by `scale` when given, ordered on the device after burn's kernels that produce
/// `t` (`nn::side_stream`); neither the host nor burn's stream waits. The result is the
/// returned tensor once given to `side_stream::join`; nothing may read it before.
///
/// # Errors
/// A group other than NCCL, or one that failed (its watchdog's error); a tensor that is not f32;
/// no device-side ordering on this GPU.
pub(crate) fn all_reduce_ordered(
    pg: Arc<dyn ProcessGroup>,
    t: Tensor<Cuda, 1>,
    scale: Option<f32>,
    label: String,
) -> Result<(Tensor<Cuda, 1>, side_stream::Join)> {
    let nccl = pg.as_nccl().ok_or_else(|| Error::Cuda {
        op: label.clone(),
        reason: "only an NCCL group sums on the device without the host waiting".into(),
    })?;
    nccl.check()?;
    if t.dtype() != burn::tensor::DType::F32 {
        return Err(Error::Cuda { op: label, reason: format!("needs an f32 tensor, got {:?}", t.dtype()) });
    }
    let (len, device) = (t.shape().num_elements(), nccl.device());
    let (mut out, join) = side_stream::fork(vec![t.into_primitive().tensor()], Vec::new(), move |bufs, fence| {
        let nccl = pg.as_nccl().expect("checked above");
        let item = DeviceReduction {
            src: Buffer { dtype: DType::F32, len, memory: Memory::Cuda { ptr: bufs.inputs[0], device } },
            dst: bufs.outputs[0],
            scale,
        };
        nccl.all_reduce_async(&[item], label, |s| fence.wait_on(s), |s| fence.signal_on(s))
    })?;
    Ok((Tensor::from_primitive(TensorPrimitive::Float(out.remove(0))), join))
}

/// A bucket's sum in flight on NCCL's stream (`side_stream::fork_held`): its token goes to the
/// join, which hands back the averaged gradients and summed presence counts.
pub(crate) struct BucketInFlight {
    /// What the join is given: the first gradient's output (the others are held by the fork).
    pub token: FloatTensor<Cuda>,
    /// The bucket's gradients, and whether presence counts follow them.
    pub shape: (usize, bool),
    pub join: side_stream::Join,
}

/// f32 gradients of at least this many bytes are summed by NCCL in their own buffers (in place
/// where nothing else sees them); smaller ones travel packed in one flat buffer.
const DIRECT_BYTES: usize = 1 << 20;

/// Where each gradient of a bucket travels: packed at an offset of the flat buffer, or on its own.
struct BucketLayout {
    lens: Vec<usize>,
    /// Per gradient: its offset in the flat buffer when packed.
    offsets: Vec<Option<usize>>,
    /// Elements of the flat buffer.
    flat_len: usize,
}

impl BucketLayout {
    /// Compressed gradients all travel packed (they are converted on the way); f32 ones of
    /// [`DIRECT_BYTES`] and more on their own. Decided by sizes alone, so every rank issues the
    /// same collectives.
    fn new(lens: Vec<usize>, compressed: bool) -> Self {
        let mut flat_len = 0;
        let offsets = lens
            .iter()
            .map(|&n| {
                (compressed || n * 4 < DIRECT_BYTES).then(|| {
                    flat_len += n;
                    flat_len - n
                })
            })
            .collect();
        Self { lens, offsets, flat_len }
    }

    /// The packed gradients at `at` (their buffers' addresses, in order), as the copy kernels
    /// take them.
    fn parts(&self, at: &[u64], scale: f32) -> Vec<bucket_copy::Part> {
        self.offsets
            .iter()
            .zip(&self.lens)
            .zip(at)
            .filter_map(|((o, &len), &at)| o.map(|offset| bucket_copy::Part { at, offset, len, scale }))
            .collect()
    }
}

/// A joined bucket: its averaged gradients, and its summed presence counts when they travelled.
pub(crate) type Joined = (Vec<FloatTensor<Cuda>>, Option<FloatTensor<Cuda>>);

/// What follows a bucket's hand-over to NCCL's stream in the same operation of burn-fusion's
/// stream: nothing (its join comes later, with the step's other buckets), or the join of the
/// step's earlier buckets and its own (the last bucket of a step: one operation less).
pub(crate) enum Then {
    Later,
    JoinWith(Vec<BucketInFlight>),
}

/// A bucket's collective once handed over: in flight, or (`Then::JoinWith`) joined with the
/// earlier buckets — each bucket's averaged gradients and summed presence counts, earlier
/// buckets first.
pub(crate) enum Started {
    InFlight(BucketInFlight),
    Joined(Vec<Joined>),
}

/// Starts averaging a bucket of f32 gradients over `pg`'s ranks on NCCL's stream, ordered on
/// the device after their producers, as one NCCL group: the large gradients summed in their own
/// buffers (each rank's values times `1 / world` by NCCL's pre-multiplied sum; into the
/// gradient's own buffer where nothing else sees it), the small ones copied by one kernel,
/// times `1 / world`, into one flat buffer, summed there and copied back out. With `flat` bf16
/// or f16 every gradient travels packed in that type (half the bytes sent) and comes back as
/// f32. `presence` (f32 counts) is summed as is, in the same group. Neither the host nor burn's
/// stream waits; with `Then::JoinWith`, burn's stream waits for this bucket and the earlier
/// ones at the end of the same operation. `(label, diagnose)`: the bucket's name, and what a
/// world of one's diagnosis leaves out (see [`BucketJob::run`]; `NoStreamWork`: everything
/// but burn-fusion's operations, `side_stream::pass_through`).
///
/// # Errors
/// A group other than NCCL, or one that failed; gradients that are not f32; no device-side
/// ordering on this GPU. The earlier buckets of `Then::JoinWith` are joined all the same.
pub(crate) fn all_reduce_bucket(
    pg: Arc<dyn ProcessGroup>,
    (grads, presence): (Vec<FloatTensor<Cuda>>, Option<FloatTensor<Cuda>>),
    flat: burn::tensor::DType,
    (label, diagnose): (String, Diagnose),
    then: Then,
) -> Result<Started> {
    let job = match BucketJob::new(pg, &grads, presence.as_ref(), flat, (label, diagnose)) {
        Ok(job) => job,
        Err(e) => {
            if let Then::JoinWith(earlier) = then {
                drop(join_in_flight(earlier));
            }
            return Err(e);
        }
    };
    let scratch = match job.layout.flat_len {
        0 => Vec::new(),
        n => vec![(burn::tensor::Shape::new([n]), flat)],
    };
    let shape = (grads.len(), job.counts.is_some());
    let inputs: Vec<FloatTensor<Cuda>> = grads.into_iter().chain(presence).collect();
    let work = move |bufs: &side_stream::ForkBuffers, fence: &side_stream::SideFence| job.run(bufs, fence);
    match (diagnose, then) {
        (Diagnose::NoStreamWork, then) => {
            let (token, join) = side_stream::pass_through(inputs);
            let bucket = BucketInFlight { token, shape, join };
            Ok(match then {
                Then::Later => Started::InFlight(bucket),
                Then::JoinWith(mut earlier) => {
                    earlier.push(bucket);
                    Started::Joined(join_in_flight(earlier))
                }
            })
        }
        (_, Then::Later) => {
            let (token, join) = side_stream::fork_held(inputs, scratch, work)?;
            Ok(Started::InFlight(BucketInFlight { token, shape, join }))
        }
        (_, Then::JoinWith(earlier)) => {
            let (tokens, joins, shapes) = in_one_list(earlier);
            match side_stream::fork_and_join(inputs, scratch, work, (tokens, &joins)) {
                Ok((outs, earlier)) => {
                    let mut joined = regroup(earlier, &shapes);
                    joined.extend(regroup(outs, &[shape]));
                    Ok(Started::Joined(joined))
                }
                Err((e, unjoined)) => {
                    if !unjoined.is_empty() {
                        drop(side_stream::join_held(unjoined, &joins));
                    }
                    Err(e)
                }
            }
        }
    }
}

/// Every bucket's averaged gradients and presence counts, readable (one join operation).
pub(crate) fn join_in_flight(buckets: Vec<BucketInFlight>) -> Vec<Joined> {
    if buckets.is_empty() {
        return Vec::new();
    }
    let (tokens, joins, shape) = in_one_list(buckets);
    regroup(side_stream::join_held(tokens, &joins), &shape)
}

/// [`in_one_list`]'s tokens, joins and bucket shapes.
type OneList = (Vec<FloatTensor<Cuda>>, Vec<side_stream::Join>, Vec<(usize, bool)>);

/// Buckets in flight as one list of tokens, their joins, and per bucket its gradients and
/// whether counts follow them — what [`regroup`] cuts the joined list back with (a join hands
/// back per bucket its gradients, then its presence counts).
fn in_one_list(buckets: Vec<BucketInFlight>) -> OneList {
    let joins = buckets.iter().map(|b| b.join.clone()).collect();
    let shape = buckets.iter().map(|b| b.shape).collect();
    let tokens = buckets.into_iter().map(|b| b.token).collect();
    (tokens, joins, shape)
}

/// Tensors of several buckets in one list, cut back into each bucket's gradients and
/// presence counts (`shape`: per bucket, its gradients and whether counts follow them).
fn regroup(all: Vec<FloatTensor<Cuda>>, shape: &[(usize, bool)]) -> Vec<Joined> {
    let mut all = all.into_iter();
    shape
        .iter()
        .map(|&(n, presence)| {
            let grads: Vec<FloatTensor<Cuda>> = all.by_ref().take(n).collect();
            (grads, if presence { all.next() } else { None })
        })
        .collect()
}

/// One bucket's collective as its fork's work enqueues it on NCCL's stream.
struct BucketJob {
    pg: Arc<dyn ProcessGroup>,
    layout: BucketLayout,
    counts: Option<usize>,
    flat: (burn::tensor::DType, DType),
    label: String,
    diagnose: Diagnose,
}

impl BucketJob {
    /// The job for `grads` (f32) and `presence` travelling as `flat`, after checking the group
    /// and the types.
    fn new(
        pg: Arc<dyn ProcessGroup>,
        grads: &[FloatTensor<Cuda>],
        presence: Option<&FloatTensor<Cuda>>,
        flat: burn::tensor::DType,
        (label, diagnose): (String, Diagnose),
    ) -> Result<Self> {
        let nccl = pg.as_nccl().ok_or_else(|| Error::Cuda {
            op: label.clone(),
            reason: "only an NCCL group sums on the device without the host waiting".into(),
        })?;
        nccl.check()?;
        if let Some(g) = grads.iter().find(|g| g.dtype != burn::tensor::DType::F32) {
            return Err(Error::Cuda {
                op: label,
                reason: format!("DDP averages f32 gradients, got one of {:?}", g.dtype),
            });
        }
        let flat_type = match flat {
            burn::tensor::DType::F32 => DType::F32,
            burn::tensor::DType::BF16 => DType::BF16,
            burn::tensor::DType::F16 => DType::F16,
            other => {
                return Err(Error::Cuda {
                    op: label,
                    reason: format!("gradients travel as f32, bf16 or f16, not {other:?}"),
                });
            }
        };
        let layout = BucketLayout::new(grads.iter().map(|g| g.shape.num_elements()).collect(), flat_type != DType::F32);
        let counts = presence.map(|p| p.shape.num_elements());
        Ok(Self { pg, layout, counts, flat: (flat, flat_type), label, diagnose })
    }

    /// Enqueues the bucket's NCCL group on NCCL's stream between `fence`'s wait and signal:
    /// the gather of the packed gradients, the group, the scatter back. A world of one's
    /// diagnosis leaves out every all-reduce that writes in place (`Diagnose::NoCollective`; a
    /// sum into a fresh buffer still runs, so that every output is written), or everything but
    /// the fences where every output is its input's buffer (`FencesOnly`).
    fn run(self, bufs: &side_stream::ForkBuffers, fence: &side_stream::SideFence) -> Result<()> {
        let Self { pg, layout, counts, flat: (flat, flat_type), label, diagnose } = self;
        let nccl = pg.as_nccl().expect("checked when the job was made");
        let (device, world) = (nccl.device(), pg.world_size());
        let scale = 1.0 / world as f32;
        let (ins, outs, flat_at) =
            (layout.parts(&bufs.inputs, scale), layout.parts(&bufs.outputs, scale), bufs.scratch.first().copied());
        let buffer = |dtype, len, ptr| Buffer { dtype, len, memory: Memory::Cuda { ptr, device } };
        let mut items: Vec<DeviceReduction> = flat_at
            .iter()
            .map(|&at| DeviceReduction { src: buffer(flat_type, layout.flat_len, at), dst: at, scale: None })
            .collect();
        for (i, &len) in layout.lens.iter().enumerate().filter(|&(i, _)| layout.offsets[i].is_none()) {
            // In a world of one the sum is the values themselves: no pre-multiplier (NCCL then
            // has nothing to compute for an in-place sum).
            let scale = (world > 1).then_some(scale);
            items.push(DeviceReduction { src: buffer(DType::F32, len, bufs.inputs[i]), dst: bufs.outputs[i], scale });
        }
        if let Some(k) = counts {
            let at = layout.lens.len();
            items.push(DeviceReduction {
                src: buffer(DType::F32, k, bufs.inputs[at]),
                dst: bufs.outputs[at],
                scale: None,
            });
        }
        if diagnose == Diagnose::FencesOnly && bufs.inputs == bufs.outputs {
            return nccl.on_stream(|s| fence.wait_on(s).and_then(|()| fence.signal_on(s)));
        }
        if matches!(diagnose, Diagnose::NoCollective | Diagnose::FencesOnly) {
            items.retain(|item| matches!(item.src.memory, Memory::Cuda { ptr, .. } if ptr != item.dst));
        }
        let before = |s| {
            fence.wait_on(s)?;
            match flat_at {
                // SAFETY: the gradients and the flat buffer are live buffers of this device (held
                // by the fork until its join); nothing of burn's writes them until then.
                Some(at) => unsafe { bucket_copy::gather(device, s, &ins, at, flat) },
                None => Ok(()),
            }
        };
        let after = |s| {
            if let Some(at) = flat_at {
                // SAFETY: as above.
                unsafe { bucket_copy::scatter(device, s, &outs, at, flat) }?;
            }
            fence.signal_on(s)
        };
        nccl.all_reduce_async(&items, label, before, after)
    }
}

/// Whether `pg` can sum burn-cuda tensors on `device` without the host waiting: an NCCL group,
/// device-side ordering available there, and `BURN_DDP_NCCL_HOST_SYNC` not set to `1` (which
/// keeps the older path: drain burn's stream, then a blocking collective).
pub(crate) fn orders_on_device(pg: &dyn ProcessGroup, device: usize) -> bool {
    // Read at every step (a fraction of a microsecond): the GPU check `nccl`'s benchmark
    // switches it between runs in one process.
    if pg.as_nccl().is_none() || std::env::var("BURN_DDP_NCCL_HOST_SYNC").is_ok_and(|v| v == "1") {
        return false;
    }
    if !bucket_copy::available() {
        log::warn!("NCCL collectives wait on the host: burn-ddp's bucket-copy kernels did not compile (NVRTC)");
        return false;
    }
    match side_stream::ready(device) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("NCCL collectives wait on the host: ordering them on GPU {device} failed: {e}");
            false
        }
    }
}
