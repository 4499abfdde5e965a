//! The burn side of the cuDNN path: which backend a tensor is on, burn-cuda tensors ↔ device
//! buffers and addresses, and [`launch`], through which every cuDNN computation (and batch
//! upload) is ordered with burn's stream. The convolution itself is `cuda::ops::conv`.
//!
//! This file imports no operation of its own: the operations (`cuda::ops::conv`, `cuda::ops::batch_norm`,
//! `cuda::ops::conv_batch_norm`, `cuda::ops::batch_norm_nhwc`, `upload`) import it.

use crate::error::{Error, Result};
use crate::nn::cuda::cudnn::convolution::{self as cudnn, ConvShape, DataType, Order};
use crate::nn::cuda::runtime::stream_bridge::Channel;
use crate::nn::cuda::runtime::{device_thread, same_stream, stream_bridge};
use crate::nn::runtime::profile::{Phase, count_call, timed};
use crate::nn::settings::layout::Layout;
use burn::prelude::*;
use burn::tensor::ops::{ConvOptions, FloatTensor, FloatTensorOps};
use burn_autodiff::Autodiff;
use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use burn_cuda::Cuda;
use burn_fusion::{FusionBackend, NoOp};
use burn_ir::{BackendIr, InitOperationIr, OperationIr, OperationOutput};
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::server::{Binding, ComputeServer};
use cubecl::stream_id::StreamId;
use std::any::TypeId;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

pub(crate) type Inner = CubeBackend<CudaRuntime, f32, i32, u8>;
pub(crate) type Prim = FloatTensor<Cuda>;
pub(crate) type Client = burn_fusion::Client<<Inner as FusionBackend>::FusionRuntime>;
pub(crate) type Ad = Autodiff<Cuda>;

/// `a` as `T`, a type already checked to be `A` (a backend's tensor or device as burn-cuda's).
pub(crate) fn cast<A: 'static, T: 'static>(a: A) -> T {
    crate::same_type::cast(a).unwrap_or_else(|_| panic!("backend type checked before the cast"))
}

/// `items` grouped by the burn-cuda device of the tensor `tensor_of` names (a `B` already
/// checked by [`cuda_backend`]), groups and items in their first-seen order: what a
/// multi-tensor operation (the fused optimizers) queues once per device.
pub(crate) fn by_device<B: Backend, T>(items: Vec<T>, tensor_of: impl Fn(&T) -> &FloatTensor<B>) -> Vec<Vec<T>> {
    let mut groups: Vec<(burn_cuda::CudaDevice, Vec<T>)> = Vec::new();
    for item in items {
        let device = cast::<FloatTensor<B>, Prim>(tensor_of(&item).clone()).client.device().clone();
        match groups.iter_mut().find(|(d, _)| *d == device) {
            Some((_, list)) => list.push(item),
            None => groups.push((device, vec![item])),
        }
    }
    groups.into_iter().map(|(_, list)| list).collect()
}

/// What runs when a cuDNN computation cannot.
pub(crate) const BURN_RUNS: &str = "burn's own kernels run instead";
/// What happens when cuDNN's work cannot be ordered on the device.
const HOST_WAITS: &str = "the host waits for the streams instead";

/// Logs each distinct fallback cause once: what failed, why, and what happens instead.
pub(crate) fn warn_once(what: &str, e: &Error, instead: &str) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let msg = format!("{what}: {e}; {instead}");
    if SEEN.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner()).insert(msg.clone()) {
        log::warn!("{msg}");
    }
}

/// `Some(true)` when `B` is `Autodiff<Cuda>`, `Some(false)` when it is `Cuda`, `None` for any
/// other backend.
pub(crate) fn cuda_backend<B: Backend>() -> Option<bool> {
    let ad = TypeId::of::<B>() == TypeId::of::<Ad>();
    (ad || TypeId::of::<B>() == TypeId::of::<Cuda>()).then_some(ad)
}

/// The CUDA device index of a tensor of `B`, a burn-cuda backend (checked by [`cuda_backend`]:
/// with or without autodiff, its device is burn-cuda's).
pub(crate) fn device_index<B: Backend, const D: usize>(t: &Tensor<B, D>) -> usize {
    cast::<B::Device, burn_cuda::CudaDevice>(t.device()).index
}

// Both burn-cuda backends' device type is `CudaDevice` (the compiler checks it here), so
// `device_index`'s cast cannot fail for a backend `cuda_backend` accepts.
const _: fn(burn::tensor::Device<Ad>, burn::tensor::Device<Cuda>) -> (burn_cuda::CudaDevice, burn_cuda::CudaDevice) =
    |a, c| (a, c);

/// Whether the cuDNN path is switched on and libcudnn can be loaded.
pub(crate) fn path_enabled() -> bool {
    crate::nn::settings::options::get().enabled && cudnn::available()
}

pub(crate) fn dims4(shape: &Shape) -> Result<[i32; 4]> {
    let d = shape.as_slice();
    let ok = d.len() == 4 && d.iter().all(|&v| v > 0 && v <= i32::MAX as usize);
    if !ok {
        return Err(Error::Cudnn {
            op: "describing a tensor",
            reason: format!("shape {d:?} is not 4-D with sizes in i32"),
        });
    }
    Ok([d[0] as i32, d[1] as i32, d[2] as i32, d[3] as i32])
}

/// cuDNN's name for the tensor's element type (f32, bf16 or f16).
pub(crate) fn data_type(t: &Prim) -> Result<DataType> {
    use burn::tensor::DType;
    match t.dtype {
        DType::F32 => Ok(DataType::F32),
        DType::BF16 => Ok(DataType::Bf16),
        DType::F16 => Ok(DataType::F16),
        other => Err(Error::Cudnn {
            op: "cuDNN",
            reason: format!("{other:?} tensors are not wired to cuDNN (f32, bf16 and f16 are)"),
        }),
    }
}

/// The common element type of `tensors` (a convolution's input, filter and gradient).
pub(crate) fn same_data_type(tensors: &[&Prim]) -> Result<DataType> {
    let dt = data_type(tensors[0])?;
    match tensors.iter().find(|t| t.dtype != tensors[0].dtype) {
        Some(t) => Err(Error::Cudnn {
            op: "cuDNN",
            reason: format!("mixed element types {:?} and {:?}; cast to one first", tensors[0].dtype, t.dtype),
        }),
        None => Ok(dt),
    }
}

/// Errors unless `t` is f32 (batch-norm parameters and statistics).
pub(crate) fn require_f32(t: &Prim, what: &str) -> Result<()> {
    if t.dtype != burn::tensor::DType::F32 {
        return Err(Error::Cudnn {
            op: "batch norm",
            reason: format!("{what} is {:?}; cuDNN keeps batch-norm parameters in f32", t.dtype),
        });
    }
    Ok(())
}

/// The tensor's buffer in packed row-major layout, of any rank (a copy when it was pitched or
/// broadcast).
pub(crate) fn resolve_packed(t: Prim) -> Result<CubeTensor<CudaRuntime>> {
    data_type(&t)?;
    let client: Client = t.client.clone();
    let cube = client.resolve_tensor_float::<Inner>(t.clone());
    if cube.is_contiguous() {
        return Ok(cube);
    }
    drop(cube);
    // As one dimension the tensor is dense.
    let flat = <Cuda as FloatTensorOps<Cuda>>::float_reshape(t.clone(), Shape::new([t.shape.num_elements()]));
    Ok(client.resolve_tensor_float::<Inner>(flat))
}

/// A new packed buffer of `dims` with `like`'s device and element type.
pub(crate) fn empty(like: &CubeTensor<CudaRuntime>, dims: &[usize]) -> CubeTensor<CudaRuntime> {
    empty_of(like, dims, like.dtype)
}

/// A new packed f32 buffer of `dims` on `like`'s device (per-channel statistics).
pub(crate) fn empty_f32(like: &CubeTensor<CudaRuntime>, dims: &[usize]) -> CubeTensor<CudaRuntime> {
    empty_of(like, dims, burn::tensor::DType::F32)
}

pub(crate) fn empty_of(
    like: &CubeTensor<CudaRuntime>,
    dims: &[usize],
    dtype: burn::tensor::DType,
) -> CubeTensor<CudaRuntime> {
    burn_cubecl::ops::numeric::empty_device_contiguous_dtype::<CudaRuntime>(
        like.client.clone(),
        like.device.clone(),
        Shape::from(dims.to_vec()),
        dtype,
    )
}

/// Runs `f` on the device addresses of `tensors`, ordered after what burn launched for them
/// and before what burn launches next: by default on cubecl's device thread and ordered on the
/// device through [`stream_bridge`] (see [`device_thread`]: after the first success of a `kind`,
/// the caller does not wait at all); with [`super::CudnnOptions::host_sync`], or when the
/// device-side ordering cannot be set up, on this thread by draining burn's stream first and
/// cuDNN's in `f`. Host time goes to the profile.
///
/// The buffers stay allocated until the work is enqueued, without blocking burn from writing
/// them in place: anything burn launches later, including a new user of that memory or an
/// in-place write, runs after cuDNN's signal.
///
/// With [`super::CudnnOptions::same_stream`], a proven kind may run on burn's own stream
/// instead (`Order::Same`, see [`same_stream`]): `f` must then enqueue only through the cuDNN
/// state's handles and `cu_stream` (every computation does; [`launch_fenced`] is for work
/// that does not).
pub(crate) fn launch(
    tensors: &[&CubeTensor<CudaRuntime>],
    kind: impl std::hash::Hash,
    f: impl FnOnce(&[u64], Order) -> Result<()> + Send + 'static,
) -> Result<()> {
    launch_with(tensors, kind, true, f)
}

/// [`launch`] never on burn's own stream: for work ordered with cudarc's stream types on
/// burn-ddp's stream (the page-locked uploads).
pub(crate) fn launch_fenced(
    tensors: &[&CubeTensor<CudaRuntime>],
    kind: impl std::hash::Hash,
    f: impl FnOnce(&[u64], Order) -> Result<()> + Send + 'static,
) -> Result<()> {
    launch_with(tensors, kind, false, f)
}

fn launch_with(
    tensors: &[&CubeTensor<CudaRuntime>],
    kind: impl std::hash::Hash,
    same_stream_ok: bool,
    f: impl FnOnce(&[u64], Order) -> Result<()> + Send + 'static,
) -> Result<()> {
    let first = tensors.first().expect("at least one tensor");
    let (device, index) = (first.device.clone(), first.device.index);
    let options = crate::nn::settings::options::get();
    // Bindings, not handles: like cubecl's own kernels, a queued job keeps its buffers allocated
    // without counting as a user of them, so burn may still write a buffer in place once its
    // last tensor is dropped (that write is queued on the device thread behind this job).
    let bindings: Vec<Binding> = tensors.iter().map(|t| t.handle.clone().binding()).collect();
    if !options.host_sync && device_ordering_ok(index) {
        let client = first.client.clone();
        let same_stream_on = options.same_stream;
        let kind = device_thread::kind((kind, options));
        // The first of a kind is waited for on the host (cuDNN measures algorithms then): burn's
        // queued kernels are submitted first. Later ones need no flush (launches are immediate).
        let flush = !device_thread::is_proven(kind);
        let same = same_stream_ok && same_stream_on && !flush;
        let job_device = device.clone();
        let job = move || -> Result<()> {
            let (_held, ptrs) = timed(Phase::Resources, || resources(&job_device, bindings))?;
            let fenced = || stream_bridge::before(Channel::Cudnn, index, &client, flush);
            let order = timed(Phase::WaitBurn, || match same_stream::order(index, same, fenced) {
                Ok(order) => Ok(order),
                Err(e) => {
                    warn_once("ordering cuDNN after burn on the device", &e, HOST_WAITS);
                    cubecl::future::block_on(client.sync())
                        .map(|()| Order::Host)
                        .map_err(|e| cudnn::fail("synchronising burn's stream", e))
                }
            })?;
            timed(Phase::Cudnn, || f(&ptrs, order))?;
            if let Order::Device(fence) = order {
                timed(Phase::WaitBurn, || stream_bridge::after(Channel::Cudnn, index, &fence));
            }
            count_call(!matches!(order, Order::Host), matches!(order, Order::Same(_)));
            Ok(())
        };
        return timed(Phase::Submit, || device_thread::run(&device, kind, job));
    }
    let (_held, ptrs) = timed(Phase::Resources, || resources(&device, bindings))?;
    timed(Phase::WaitBurn, || <Inner as Backend>::sync(&device))
        .map_err(|e| cudnn::fail("synchronising burn's stream", e))?;
    timed(Phase::Cudnn, || f(&ptrs, Order::Host))?;
    count_call(false, false);
    Ok(())
}

/// The buffers behind `bindings`, kept allocated while held, and their device addresses: looked
/// up by cubecl's server for `device` on the calling stream (a direct call on the device thread).
fn resources(device: &CudaDevice, bindings: Vec<Binding>) -> Result<(Vec<impl Sized + use<>>, Vec<u64>)> {
    let stream = StreamId::current();
    let server = device_thread::server(device);
    let held = server
        .submit_blocking(move |s| {
            bindings.into_iter().map(|b| s.get_resource(b, stream)).collect::<std::result::Result<Vec<_>, _>>()
        })
        .map_err(|e| cudnn::fail("device pointer", e))?
        .map_err(|e| cudnn::fail("device pointer", e))?;
    let ptrs = held.iter().map(|r| r.resource().ptr).collect();
    Ok((held, ptrs))
}

/// Whether cuDNN's work on `device` can be ordered on the device (checked once per device; a
/// failure is logged once and the host orders instead).
fn device_ordering_ok(device: usize) -> bool {
    static READY: OnceLock<Mutex<HashMap<usize, bool>>> = OnceLock::new();
    let mut map = READY.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    *map.entry(device).or_insert_with(|| match cudnn::device_ordering_ready(device) {
        Ok(()) => true,
        Err(e) => {
            warn_once("ordering cuDNN after burn on the device", &e, HOST_WAITS);
            false
        }
    })
}

fn out_dims(x: [i32; 4], w: [i32; 4], o: &ConvOptions<2>) -> [i32; 4] {
    let size = |i: usize, k: i32| {
        (x[2 + i] + 2 * o.padding[i] as i32 - o.dilation[i] as i32 * (k - 1) - 1) / o.stride[i] as i32 + 1
    };
    [x[0], w[0], size(0, w[2]), size(1, w[3])]
}

/// The convolution of NCHW-ordered dims `x` and KCRS `w` with packed strides in `layout`'s order.
pub(crate) fn packed_shape(dtype: DataType, layout: Layout, x: [i32; 4], w: [i32; 4], o: &ConvOptions<2>) -> ConvShape {
    let y = out_dims(x, w, o);
    ConvShape {
        dtype,
        layout,
        x,
        x_strides: layout.strides(x),
        w,
        y,
        y_strides: layout.strides(y),
        pad: o.padding.map(|v| v as i32),
        stride: o.stride.map(|v| v as i32),
        dilation: o.dilation.map(|v| v as i32),
        groups: o.groups as i32,
    }
}

/// Hands a buffer made outside burn's fusion graph to it, as a new float tensor.
pub(crate) fn register(client: &Client, t: CubeTensor<CudaRuntime>) -> Prim {
    let shape = t.meta.shape().clone();
    let dtype = t.dtype;
    let handle = <Inner as BackendIr>::float_tensor_handle(t);
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    client
        .register(burn_fusion::stream::OperationStreams::default(), OperationIr::Init(desc), NoOp::<Inner>::new())
        .output()
}
