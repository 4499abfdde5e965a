//! cuDNN convolutions for burn-cuda tensors, as an autodiff operation.
//!
//! `Autodiff<Cuda>` (training) and `Cuda` (inference) tensors are recognised by type at run
//! time, so models stay generic over `B: Backend`. The forward pass, the input gradient and the
//! filter gradient each go to cuDNN on the tensors' own device memory, ordered with burn's stream
//! by [`launch`] (on the device; see `stream_bridge`). When cuDNN refuses a shape or fails, that
//! computation falls back to burn's kernels with one warning per cause.

use super::cudnn::{self, ConvShape, DataType, Direction, Order, Pointers, packed};
use super::layout::Layout;
use super::{device_thread, stream_bridge};
use super::profile::{Phase, count_call, timed};
use crate::error::{Error, Result};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::{ConvOptions, FloatTensor, FloatTensorOps, ModuleOps};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::{Autodiff, NodeId};
use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use burn_cuda::Cuda;
use burn_fusion::{FusionBackend, NoOp};
use burn_ir::{BackendIr, InitOperationIr, OperationIr, OperationOutput};
use cubecl::cuda::CudaRuntime;
use std::any::{Any, TypeId};
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

pub(super) type Inner = CubeBackend<CudaRuntime, f32, i32, u8>;
pub(super) type Prim = FloatTensor<Cuda>;
pub(super) type Client = burn_fusion::Client<<Inner as FusionBackend>::FusionRuntime>;
pub(super) type Ad = Autodiff<Cuda>;

pub(super) fn cast<A: 'static, T: 'static>(a: A) -> T {
    *(Box::new(a) as Box<dyn Any>).downcast::<T>().expect("backend type checked before the cast")
}

/// What runs when a cuDNN computation cannot.
pub(super) const BURN_RUNS: &str = "burn's own kernels run instead";
/// What happens when cuDNN's work cannot be ordered on the device.
const HOST_WAITS: &str = "the host waits for the streams instead";

/// Logs each distinct fallback cause once: what failed, why, and what happens instead.
pub(super) fn warn_once(what: &str, e: &Error, instead: &str) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let msg = format!("{what}: {e}; {instead}");
    if SEEN.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner()).insert(msg.clone()) {
        log::warn!("{msg}");
    }
}

/// `Some(true)` when `B` is `Autodiff<Cuda>`, `Some(false)` when it is `Cuda`, `None` for any
/// other backend.
pub(super) fn cuda_backend<B: Backend>() -> Option<bool> {
    let ad = TypeId::of::<B>() == TypeId::of::<Ad>();
    (ad || TypeId::of::<B>() == TypeId::of::<Cuda>()).then_some(ad)
}

/// Whether the cuDNN path is switched on and libcudnn can be loaded.
pub(super) fn path_enabled() -> bool {
    super::options::get().enabled && cudnn::available()
}

/// `conv2d` through cuDNN when `B` is burn-cuda (with or without autodiff) and cuDNN is usable;
/// otherwise the inputs come back untouched. `x` and the output are in `layout`'s order
/// (for [`Layout::Nhwc`]: `[n, h, w, c]`); `w` is burn's `[k, c / groups, r, s]`, handed to
/// cuDNN in the same order as the activations (KRSC for channels-last).
pub(crate) fn try_conv2d<B: Backend>(x: Tensor<B, 4>, w: Tensor<B, 4>, o: &ConvOptions<2>, layout: Layout) -> std::result::Result<Tensor<B, 4>, (Tensor<B, 4>, Tensor<B, 4>)> {
    let Some(ad) = cuda_backend::<B>() else {
        return Err((x, w));
    };
    if !path_enabled() {
        super::conv::note_path(|| "burn's kernels (cuDNN disabled or libcudnn not found)".into());
        return Err((x, w));
    }
    super::conv::note_path(|| format!("cuDNN {}", cudnn::version().unwrap_or(0)));
    if ad {
        let (x, w): (Tensor<Ad, 4>, Tensor<Ad, 4>) = (cast(x), cast(w));
        return Ok(cast(autodiff_conv(x, layout.view_from_nchw(w), o, layout)));
    }
    let (x, w): (Tensor<Cuda, 4>, Tensor<Cuda, 4>) = (cast(x), cast(w));
    let y = forward(x.into_primitive().tensor(), layout.view_from_nchw(w).into_primitive().tensor(), o, layout);
    Ok(cast(Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(y))))
}

#[derive(Debug)]
struct CudnnConv2d;

impl Backward<Cuda, 2> for CudnnConv2d {
    type State = (NodeId, NodeId, ConvOptions<2>, Layout);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        let (x_state, w_state, o, layout) = ops.state;
        let x: Prim = checkpointer.retrieve_node_output(x_state);
        let w: Prim = checkpointer.retrieve_node_output(w_state);
        match (node_x, node_w) {
            (Some(nx), Some(nw)) => {
                let (dx, dw) = backward_both(x, w, dy, &o, layout);
                grads.register::<Cuda>(nx.id, dx);
                grads.register::<Cuda>(nw.id, dw);
            }
            (Some(node), None) => grads.register::<Cuda>(node.id, backward_data(x, w, dy, &o, layout)),
            (None, Some(node)) => grads.register::<Cuda>(node.id, backward_filter(x, w, dy, &o, layout)),
            (None, None) => {}
        }
    }
}

fn autodiff_conv(x: Tensor<Ad, 4>, w: Tensor<Ad, 4>, o: &ConvOptions<2>, layout: Layout) -> Tensor<Ad, 4> {
    let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
    let out = match CudnnConv2d.prepare::<NoCheckpointing>([x.node.clone(), w.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(mut prep) => {
            let x_state = prep.checkpoint(&x);
            let w_state = prep.checkpoint(&w);
            prep.finish((x_state, w_state, o.clone(), layout), forward(x.primitive, w.primitive, o, layout))
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, w.primitive, o, layout)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

fn forward(x: Prim, w: Prim, o: &ConvOptions<2>, layout: Layout) -> Prim {
    cudnn_call(Direction::Forward, x.clone(), w.clone(), None, o, layout).unwrap_or_else(|e| {
        warn_once("cuDNN convolution forward", &e, BURN_RUNS);
        let (x, w) = (nchw(x, layout), nchw(w, layout));
        from_nchw(<Cuda as ModuleOps<Cuda>>::conv2d(x, w, None, o.clone()), layout)
    })
}

pub(super) fn backward_data(x: Prim, w: Prim, dy: Prim, o: &ConvOptions<2>, layout: Layout) -> Prim {
    cudnn_call(Direction::BackwardData, x.clone(), w.clone(), Some(dy.clone()), o, layout).unwrap_or_else(|e| {
        warn_once("cuDNN convolution backward-data", &e, BURN_RUNS);
        let (x, w, dy) = (nchw(x, layout), nchw(w, layout), nchw(dy, layout));
        from_nchw(<Cuda as ModuleOps<Cuda>>::conv2d_x_backward(x, w, dy, o.clone()), layout)
    })
}

pub(super) fn backward_filter(x: Prim, w: Prim, dy: Prim, o: &ConvOptions<2>, layout: Layout) -> Prim {
    cudnn_call(Direction::BackwardFilter, x.clone(), w.clone(), Some(dy.clone()), o, layout).unwrap_or_else(|e| {
        warn_once("cuDNN convolution backward-filter", &e, BURN_RUNS);
        let (x, w, dy) = (nchw(x, layout), nchw(w, layout), nchw(dy, layout));
        from_nchw(<Cuda as ModuleOps<Cuda>>::conv2d_weight_backward(x, w, dy, o.clone()), layout)
    })
}

/// `(dx, dw)`: both gradients in one cuDNN job (each input resolved once, one ordering fence
/// pair); when that cannot run, each gradient on its own ([`backward_data`],
/// [`backward_filter`]).
pub(super) fn backward_both(x: Prim, w: Prim, dy: Prim, o: &ConvOptions<2>, layout: Layout) -> (Prim, Prim) {
    cudnn_backward(x.clone(), w.clone(), dy.clone(), o, layout).unwrap_or_else(|e| {
        warn_once("cuDNN convolution backward (both gradients in one job)", &e, "each gradient is computed on its own");
        (backward_data(x.clone(), w.clone(), dy.clone(), o, layout), backward_filter(x, w, dy, o, layout))
    })
}

fn cudnn_backward(x: Prim, w: Prim, dy: Prim, o: &ConvOptions<2>, layout: Layout) -> Result<(Prim, Prim)> {
    let client: Client = x.client.clone();
    // Everything packed: backward-filter needs it anyway, and then both directions share one
    // shape (and the plans the separate calls measured with packed inputs).
    let shape = checked_shape(&x, &w, Some(&dy), o, layout)?;
    let (xc, wc, yc) = timed(Phase::Prepare, || -> Result<_> { Ok((resolve_packed(x)?, resolve_packed(w)?, resolve_packed(dy)?)) })?;
    let new = |d: [i32; 4]| empty(&xc, &layout.from_nchw(d).map(|v| v as usize));
    let (dx, dw) = (new(shape.x), new(shape.w));
    let device = xc.device.index;
    let kind = ("conv_backward", shape.clone());
    // SAFETY: as in `cudnn_call`; dx and dw are fresh buffers only these computations write.
    launch(&[&xc, &wc, &yc, &dx, &dw], kind, move |p, order| unsafe {
        cudnn::run_backward(device, &shape, Pointers { x: p[3], w: p[1], y: p[2] }, Pointers { x: p[0], w: p[4], y: p[2] }, order)
    })?;
    drop((xc, wc, yc));
    Ok(timed(Phase::Register, || (register(&client, dx), register(&client, dw))))
}

/// A primitive in `layout`'s order viewed as NCHW (filters: KRSC as KCRS), for burn's kernels.
fn nchw(t: Prim, layout: Layout) -> Prim {
    layout.view_nchw(Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(t))).into_primitive().tensor()
}

/// An NCHW primitive viewed in `layout`'s order.
fn from_nchw(t: Prim, layout: Layout) -> Prim {
    layout.view_from_nchw(Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(t))).into_primitive().tensor()
}

pub(super) fn dims4(shape: &Shape) -> Result<[i32; 4]> {
    let d = shape.as_slice();
    let ok = d.len() == 4 && d.iter().all(|&v| v > 0 && v <= i32::MAX as usize);
    if !ok {
        return Err(Error::Cudnn { op: "describing a tensor", reason: format!("shape {d:?} is not 4-D with sizes in i32") });
    }
    Ok([d[0] as i32, d[1] as i32, d[2] as i32, d[3] as i32])
}

/// A device buffer holding the tensor, kept alive while cuDNN uses it, and its strides.
/// cuDNN takes strided activations (burn-cuda pitches rows) but wants packed filters and no
/// broadcast (zero) strides; such tensors are copied to a packed layout first.
pub(super) fn resolve(t: Prim, need_packed: bool) -> Result<(CubeTensor<CudaRuntime>, [i32; 4])> {
    let dims = dims4(&t.shape)?;
    if !need_packed {
        data_type(&t)?;
        let cube = t.client.clone().resolve_tensor_float::<Inner>(t.clone());
        if cube.is_contiguous() {
            return Ok((cube, packed(dims)));
        }
        let s = cube.meta.strides().to_vec();
        if s.len() == 4 && s.iter().all(|&v| v > 0 && v <= i32::MAX as usize) {
            return Ok((cube, [s[0] as i32, s[1] as i32, s[2] as i32, s[3] as i32]));
        }
    }
    Ok((resolve_packed(t)?, packed(dims)))
}

/// cuDNN's name for the tensor's element type (f32, bf16 or f16).
pub(super) fn data_type(t: &Prim) -> Result<DataType> {
    use burn::tensor::DType;
    match t.dtype {
        DType::F32 => Ok(DataType::F32),
        DType::BF16 => Ok(DataType::Bf16),
        DType::F16 => Ok(DataType::F16),
        other => Err(Error::Cudnn { op: "cuDNN", reason: format!("{other:?} tensors are not wired to cuDNN (f32, bf16 and f16 are)") }),
    }
}

/// The common element type of `tensors` (a convolution's input, filter and gradient).
pub(super) fn same_data_type(tensors: &[&Prim]) -> Result<DataType> {
    let dt = data_type(tensors[0])?;
    match tensors.iter().find(|t| t.dtype != tensors[0].dtype) {
        Some(t) => Err(Error::Cudnn { op: "cuDNN", reason: format!("mixed element types {:?} and {:?}; cast to one first", tensors[0].dtype, t.dtype) }),
        None => Ok(dt),
    }
}

/// Errors unless `t` is f32 (batch-norm parameters and statistics).
pub(super) fn require_f32(t: &Prim, what: &str) -> Result<()> {
    if t.dtype != burn::tensor::DType::F32 {
        return Err(Error::Cudnn { op: "batch norm", reason: format!("{what} is {:?}; cuDNN keeps batch-norm parameters in f32", t.dtype) });
    }
    Ok(())
}

/// The tensor's buffer in packed row-major layout, of any rank (a copy when it was pitched or
/// broadcast).
pub(super) fn resolve_packed(t: Prim) -> Result<CubeTensor<CudaRuntime>> {
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
pub(super) fn empty(like: &CubeTensor<CudaRuntime>, dims: &[usize]) -> CubeTensor<CudaRuntime> {
    empty_of(like, dims, like.dtype)
}

/// A new packed f32 buffer of `dims` on `like`'s device (per-channel statistics).
pub(super) fn empty_f32(like: &CubeTensor<CudaRuntime>, dims: &[usize]) -> CubeTensor<CudaRuntime> {
    empty_of(like, dims, burn::tensor::DType::F32)
}

fn empty_of(like: &CubeTensor<CudaRuntime>, dims: &[usize], dtype: burn::tensor::DType) -> CubeTensor<CudaRuntime> {
    burn_cubecl::ops::numeric::empty_device_contiguous_dtype::<CudaRuntime>(like.client.clone(), like.device.clone(), Shape::from(dims.to_vec()), dtype)
}

/// Runs `f` on the device addresses of `tensors`, ordered after what burn launched for them
/// and before what burn launches next: by default on cubecl's device thread and ordered on the
/// device through [`stream_bridge`] (see [`device_thread`]: after the first success of a `kind`,
/// the caller does not wait at all); with [`super::CudnnOptions::host_sync`], or when the
/// device-side ordering cannot be set up, on this thread by draining burn's stream first and
/// cuDNN's in `f`. Host time goes to the profile.
///
/// The buffers are released as soon as the work is enqueued: anything burn launches later,
/// including a new user of that memory, runs after cuDNN's signal.
pub(super) fn launch(
    tensors: &[&CubeTensor<CudaRuntime>],
    kind: impl std::hash::Hash,
    f: impl FnOnce(&[u64], Order) -> Result<()> + Send + 'static,
) -> Result<()> {
    let first = tensors.first().expect("at least one tensor");
    let (device, index) = (first.device.clone(), first.device.index);
    let options = super::options::get();
    if !options.host_sync && device_ordering_ok(index) {
        let owned: Vec<CubeTensor<CudaRuntime>> = tensors.iter().map(|t| (*t).clone()).collect();
        let client = first.client.clone();
        let job = move || -> Result<()> {
            let (_held, ptrs) = timed(Phase::Resources, || resources(&owned.iter().collect::<Vec<_>>()))?;
            let order = timed(Phase::WaitBurn, || match stream_bridge::before(index, &client) {
                Ok(fence) => Ok(Order::Device(fence)),
                Err(e) => {
                    warn_once("ordering cuDNN after burn on the device", &e, HOST_WAITS);
                    cubecl::future::block_on(client.sync()).map(|()| Order::Host).map_err(|e| cudnn::fail("synchronising burn's stream", e))
                }
            })?;
            timed(Phase::Cudnn, || f(&ptrs, order))?;
            if let Order::Device(fence) = order {
                timed(Phase::WaitBurn, || stream_bridge::after(index, &fence));
            }
            count_call(matches!(order, Order::Device(_)));
            Ok(())
        };
        return timed(Phase::Submit, || device_thread::run(&device, device_thread::kind((kind, options)), job));
    }
    let (_held, ptrs) = timed(Phase::Resources, || resources(tensors))?;
    timed(Phase::WaitBurn, || <Inner as Backend>::sync(&device)).map_err(|e| cudnn::fail("synchronising burn's stream", e))?;
    timed(Phase::Cudnn, || f(&ptrs, Order::Host))?;
    count_call(false);
    Ok(())
}

/// The buffers of `tensors`, kept alive while held, and their device addresses.
fn resources(tensors: &[&CubeTensor<CudaRuntime>]) -> Result<(Vec<impl Sized + use<>>, Vec<u64>)> {
    let held = tensors
        .iter()
        .map(|c| c.client.get_resource(c.handle.clone()).map_err(|e| cudnn::fail("device pointer", e)))
        .collect::<Result<Vec<_>>>()?;
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
    let size = |i: usize, k: i32| (x[2 + i] + 2 * o.padding[i] as i32 - o.dilation[i] as i32 * (k - 1) - 1) / o.stride[i] as i32 + 1;
    [x[0], w[0], size(0, w[2]), size(1, w[3])]
}

/// The convolution of `x` and `w` (in `layout`'s order; dims in the description NCHW/KCRS) with
/// packed strides, after checking their element types agree (with `dy`'s too) and `dy` has the
/// output's shape.
fn checked_shape(x: &Prim, w: &Prim, dy: Option<&Prim>, o: &ConvOptions<2>, layout: Layout) -> Result<ConvShape> {
    let dtype = match dy {
        Some(dy) => same_data_type(&[x, w, dy])?,
        None => same_data_type(&[x, w])?,
    };
    let shape = packed_shape(dtype, layout, layout.to_nchw(dims4(&x.shape)?), layout.to_nchw(dims4(&w.shape)?), o);
    if let Some(dy) = dy
        && layout.to_nchw(dims4(&dy.shape)?) != shape.y
    {
        return Err(Error::Cudnn { op: "convolution backward", reason: format!("gradient shape {:?}, expected {:?}", dy.shape.as_slice(), layout.from_nchw(shape.y)) });
    }
    Ok(shape)
}

/// The convolution of NCHW-ordered dims `x` and KCRS `w` with packed strides in `layout`'s order.
pub(super) fn packed_shape(dtype: DataType, layout: Layout, x: [i32; 4], w: [i32; 4], o: &ConvOptions<2>) -> ConvShape {
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

/// One cuDNN computation. `dy` is `None` for the forward pass. Returns the new tensor (y, dx or
/// dw, in `layout`'s order) registered with burn's fusion client.
fn cudnn_call(dir: Direction, x: Prim, w: Prim, dy: Option<Prim>, o: &ConvOptions<2>, layout: Layout) -> Result<Prim> {
    let client: Client = x.client.clone();
    let described = checked_shape(&x, &w, dy.as_ref(), o, layout)?;
    let (xd, wd, yd) = (described.x, described.w, described.y);
    let new = |like: &CubeTensor<CudaRuntime>, d: [i32; 4]| empty(like, &layout.from_nchw(d).map(|v| v as usize));
    // Channels-last activations are always handed over packed (in their order).
    let pack = super::options::get().pack_inputs || layout == Layout::Nhwc;
    let strides = |s: [i32; 4], d: [i32; 4]| if layout == Layout::Nhwc { layout.strides(d) } else { s };
    let (xc, x_strides, wc, yc, y_strides, out) = timed(Phase::Prepare, || -> Result<_> { Ok(match dir {
        Direction::Forward => {
            let (xc, xs) = resolve(x, pack)?;
            let (wc, _) = resolve(w, true)?;
            let yc = new(&xc, yd);
            (xc, strides(xs, xd), wc, yc.clone(), layout.strides(yd), yc)
        }
        Direction::BackwardData => {
            let (wc, _) = resolve(w, true)?;
            let (yc, ys) = resolve(dy.expect("backward has dy"), pack)?;
            let xc = new(&wc, xd);
            (xc.clone(), layout.strides(xd), wc, yc, strides(ys, yd), xc)
        }
        Direction::BackwardFilter => {
            // cuDNN 9 has no backward-filter algorithm for strided (pitched) inputs: pack both.
            let (xc, xs) = resolve(x, true)?;
            let (yc, ys) = resolve(dy.expect("backward has dy"), true)?;
            let wc = new(&xc, wd);
            (xc, strides(xs, xd), wc.clone(), yc, strides(ys, yd), wc)
        }
    }) })?;
    let shape = ConvShape { x_strides, y_strides, ..described };
    // SAFETY: `launch` orders the computation after the buffers' producers and before their
    // next users; their extents match `shape` by construction.
    let device = xc.device.index;
    let kind = ("conv", dir, shape.clone());
    launch(&[&xc, &wc, &yc], kind, move |p, order| unsafe { cudnn::run(device, dir, &shape, Pointers { x: p[0], w: p[1], y: p[2] }, order) })?;
    drop((xc, wc, yc));
    Ok(timed(Phase::Register, || register(&client, out)))
}

/// Hands a buffer made outside burn's fusion graph to it, as a new float tensor.
pub(super) fn register(client: &Client, t: CubeTensor<CudaRuntime>) -> Prim {
    let shape = t.meta.shape().clone();
    let dtype = t.dtype;
    let handle = <Inner as BackendIr>::float_tensor_handle(t);
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    client.register(burn_fusion::stream::OperationStreams::default(), OperationIr::Init(desc), NoOp::<Inner>::new()).output()
}
