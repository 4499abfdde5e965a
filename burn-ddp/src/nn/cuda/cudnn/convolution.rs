//! cuDNN 2-D convolution — forward, backward-data, backward-filter — on raw device pointers.
//!
//! One cuDNN handle and stream per device. How each (direction, shape) runs is chosen once on
//! the real buffers and cached for the process (PyTorch's `torch.backends.cudnn.benchmark = True`): an
//! execution plan of cuDNN's graph API (`cuda::cudnn::conv_graph`, the default: far less host time per
//! call), or the legacy entry point with the algorithm cuDNN's `Find...Ex` measured fastest.
//! One workspace per device is reused by every call, as large as the most one chosen plan
//! needs: an algorithm search takes the whole limit and hands the rest back. Each call returns
//! after cuDNN's stream has finished, so the caller may hand the output to another stream at
//! once.

use crate::error::Result;
use crate::nn::cuda::cudnn::current_stream::CurrentStream;
pub(crate) use crate::nn::cuda::cudnn::types::fail;
pub use crate::nn::cuda::cudnn::types::{ConvShape, DataType, Direction, Pointers};
use crate::nn::cuda::runtime::stream_bridge::{DeviceKernels, Fence};
use crate::nn::settings::layout::Layout;
use crate::nn::settings::options::{self, CudnnOptions};
use cudarc::cudnn::{result, sys};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut, sys as driver};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many computations (convolutions, batch norms) cuDNN has run in this process (tests use it to prove the
/// path was taken).
pub fn calls() -> u64 {
    CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

static ACCUMULATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many convolution input gradients cuDNN has added into an existing gradient (β = 1)
/// instead of writing a new buffer (tests use it to prove the in-place path was taken).
pub fn accumulated() -> u64 {
    ACCUMULATED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the cuDNN library can be loaded (it is opened at run time, not linked).
pub fn available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: opening a shared library by name; the handle is dropped again.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// cuDNN's version (e.g. 90100 for 9.1.0), or `None` when it cannot be loaded.
pub fn version() -> Option<usize> {
    available().then(result::get_version)
}

macro_rules! raw_handle {
    ($name:ident, $raw:ty, $destroy:path) => {
        pub(crate) struct $name(pub(crate) $raw);
        // SAFETY: cuDNN handles and descriptors are plain heap objects; every use happens under
        // the device's mutex, so one thread at a time touches them.
        unsafe impl Send for $name {}
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created by the matching create call and destroyed once, here.
                let _ = unsafe { $destroy(self.0) };
            }
        }
    };
}
raw_handle!(Handle, sys::cudnnHandle_t, result::destroy_handle);
raw_handle!(TensorDesc, sys::cudnnTensorDescriptor_t, result::destroy_tensor_descriptor);
raw_handle!(FilterDesc, sys::cudnnFilterDescriptor_t, result::destroy_filter_descriptor);
raw_handle!(ConvDesc, sys::cudnnConvolutionDescriptor_t, result::destroy_convolution_descriptor);
raw_handle!(ActivationDesc, sys::cudnnActivationDescriptor_t, sys::cudnnDestroyActivationDescriptor);

/// Row-major (packed NCHW) strides of `d`, in elements.
pub(crate) fn packed(d: [i32; 4]) -> [i32; 4] {
    [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1]
}

/// A 4-D tensor descriptor of `dtype` with explicit strides.
pub(crate) fn tensor_desc(dtype: DataType, dims: [i32; 4], strides: [i32; 4]) -> Result<TensorDesc> {
    let d = TensorDesc(result::create_tensor_descriptor().map_err(|e| fail("tensor descriptor", e))?);
    // SAFETY: a freshly created descriptor, set once with plain values.
    unsafe { result::set_tensor4d_descriptor_ex(d.0, dtype.raw(), dims, strides) }
        .map_err(|e| fail("tensor descriptor", e))?;
    Ok(d)
}

/// A ReLU activation descriptor (NaN propagated, as burn's and PyTorch's ReLU do).
pub(crate) fn relu_desc() -> Result<ActivationDesc> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; the descriptor is set once with plain values.
    unsafe {
        sys::cudnnCreateActivationDescriptor(&mut raw).result().map_err(|e| fail("activation descriptor", e))?;
        let d = ActivationDesc(raw);
        sys::cudnnSetActivationDescriptor(
            d.0,
            sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
            sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
            0.0,
        )
        .result()
        .map_err(|e| fail("activation descriptor", e))?;
        Ok(d)
    }
}

/// Loads `device`'s fence kernels if needed: an error means device-side ordering is not
/// available there (the caller orders on the host instead).
pub(crate) fn device_ordering_ready(device: usize) -> Result<()> {
    let state = device_state(device)?;
    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
    s.ctx.bind_to_thread().map_err(|e| fail("binding the CUDA context", e))?;
    let stream = s.stream.clone();
    s.fence_kernels()?.self_test(&stream)
}

/// How a computation is ordered with burn's stream.
#[derive(Clone, Copy, Debug)]
pub enum Order {
    /// The caller drained burn's stream; cuDNN's stream is drained before returning.
    Host,
    /// On the device: wait for the fence's flag first, write its signal after (see
    /// `stream_bridge`); the host does not wait.
    Device(Fence),
    /// On burn's own stream (its address; `cuda::runtime::burn_stream`): in order with burn's
    /// kernels by being on their stream, no fence, nobody waits.
    Same(usize),
}

/// Runs `f` with `device`'s cuDNN handle (its context bound to this thread, its stream set:
/// burn-ddp's own, or burn's for `Order::Same`), ordered by `order`. `f` enqueues through the
/// state's handles and [`DeviceState::cu_stream`].
///
/// # Safety
/// Whatever `f` hands to cuDNN must be live device memory of `device`, not written by anyone
/// else until the computation has finished (`Order::Host`: until this returns; `Device`: until
/// the signal is written; `Same`: until burn's stream has run it, which orders burn's own later
/// writes after it).
pub(crate) unsafe fn with_handle<T>(
    device: usize,
    order: Order,
    f: impl FnOnce(&mut DeviceState) -> Result<T>,
) -> Result<T> {
    if !available() {
        return Err(fail("loading libcudnn", "not found on the library path"));
    }
    let state = device_state(device)?;
    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
    s.ctx.bind_to_thread().map_err(|e| fail("binding the CUDA context", e))?;
    let own = s.streams.own();
    s.use_stream(match order {
        Order::Same(burn) => burn as driver::CUstream,
        Order::Host | Order::Device(_) => own,
    })?;
    if let Order::Device(fence) = order {
        s.fence_kernels()?.wait(own, &fence)?;
    }
    let out = match f(&mut s) {
        Ok(out) => out,
        Err(e) => {
            // Part of the work may be enqueued, and burn will not wait for it: let it finish
            // before the caller falls back and its buffers are reused.
            let _ = s.streams.synchronize();
            return Err(e);
        }
    };
    CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match order {
        Order::Host => s.stream.synchronize().map_err(|e| fail("waiting for cuDNN's stream", e))?,
        // The store follows (and is ordered after) the computation's kernels.
        Order::Device(fence) => s.fence_kernels()?.signal(own, &fence)?,
        Order::Same(_) => {}
    }
    Ok(out)
}

/// Runs `f` with `device`'s cuDNN state (its context bound to this thread) and nothing
/// ordered: for work that enqueues nothing on the stream, such as building execution plans.
pub(crate) fn with_state<T>(device: usize, f: impl FnOnce(&mut DeviceState) -> Result<T>) -> Result<T> {
    if !available() {
        return Err(fail("loading libcudnn", "not found on the library path"));
    }
    let state = device_state(device)?;
    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
    s.ctx.bind_to_thread().map_err(|e| fail("binding the CUDA context", e))?;
    f(&mut s)
}

#[derive(Clone, Copy, Debug)]
enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

/// How one (direction, shape) runs: a graph-API execution plan, or (when none could be built,
/// or [`CudnnOptions::graph_api`] is off) a legacy entry point with the algorithm Find measured.
enum Plan {
    Graph(crate::nn::cuda::cudnn::conv_graph::GraphPlan),
    Legacy(LegacyPlan),
}

/// Descriptors and the measured algorithm for one (direction, shape) on the legacy API.
struct LegacyPlan {
    x: TensorDesc,
    w: FilterDesc,
    y: TensorDesc,
    conv: ConvDesc,
    algo: Algo,
    workspace: usize,
}

/// One device's cuDNN handle, stream, workspace and algorithm cache.
pub(crate) struct DeviceState {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    handle: Handle,
    workspace: Option<CudaSlice<u8>>,
    /// The most workspace one computation has run with: what the workspace shrinks back to
    /// after an algorithm search, which takes the whole limit (512 MiB by default).
    workspace_need: usize,
    /// Keyed by what the choice depends on: direction, shape, the math settings (TF32
    /// allowed, deterministic only) it was measured under, and whether the graph API may be used.
    plans: HashMap<(Direction, ConvShape, bool, bool, bool), Plan>,
    /// Kernels that order this stream with burn's on the device (see `stream_bridge`).
    fences: Option<DeviceKernels>,
    /// The cuBLAS handle on this stream, created on first use.
    cublas: Option<crate::nn::cuda::cublas::Handle>,
    /// Where the work goes now: `stream`, or burn's own stream (`Order::Same`).
    streams: CurrentStream,
}

type Devices = Mutex<HashMap<usize, Arc<Mutex<DeviceState>>>>;

fn device_state(device: usize) -> Result<Arc<Mutex<DeviceState>>> {
    static DEVICES: OnceLock<Devices> = OnceLock::new();
    let mut map = DEVICES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(state) = map.get(&device) {
        return Ok(state.clone());
    }
    let ctx = CudaContext::new(device).map_err(|e| fail("creating the CUDA context", e))?;
    let stream = ctx.new_stream().map_err(|e| fail("creating a CUDA stream", e))?;
    let own = stream.cu_stream();
    let handle = Handle(result::create_handle().map_err(|e| fail("cudnnCreate", e))?);
    // SAFETY: a live handle and a live stream of the same context.
    unsafe { result::set_stream(handle.0, stream.cu_stream() as sys::cudaStream_t) }
        .map_err(|e| fail("cudnnSetStream", e))?;
    let state = Arc::new(Mutex::new(DeviceState {
        ctx,
        stream,
        handle,
        workspace: None,
        workspace_need: 0,
        plans: HashMap::new(),
        fences: None,
        cublas: None,
        streams: CurrentStream::new(own),
    }));
    map.insert(device, state.clone());
    Ok(state)
}

fn describe(shape: &ConvShape, opts: &CudnnOptions) -> Result<(TensorDesc, FilterDesc, TensorDesc, ConvDesc)> {
    let (data, f32) = (shape.dtype.raw(), sys::cudnnDataType_t::CUDNN_DATA_FLOAT);
    let x = TensorDesc(result::create_tensor_descriptor().map_err(|e| fail("tensor descriptor", e))?);
    let y = TensorDesc(result::create_tensor_descriptor().map_err(|e| fail("tensor descriptor", e))?);
    let w = FilterDesc(result::create_filter_descriptor().map_err(|e| fail("filter descriptor", e))?);
    let conv = ConvDesc(result::create_convolution_descriptor().map_err(|e| fail("convolution descriptor", e))?);
    // Half types always may use tensor cores; f32 only in TF32 when allowed.
    let math = if opts.allow_tf32 || shape.dtype != DataType::F32 {
        sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
    } else {
        sys::cudnnMathType_t::CUDNN_FMA_MATH
    };
    // SAFETY: freshly created descriptors, set once with plain values.
    unsafe {
        result::set_tensor4d_descriptor_ex(x.0, data, shape.x, shape.x_strides)
            .map_err(|e| fail("input descriptor", e))?;
        result::set_tensor4d_descriptor_ex(y.0, data, shape.y, shape.y_strides)
            .map_err(|e| fail("output descriptor", e))?;
        let format = match shape.layout {
            Layout::Nchw => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            Layout::Nhwc => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
        };
        result::set_filter4d_descriptor(w.0, data, format, shape.w).map_err(|e| fail("filter descriptor", e))?;
        let [ph, pw] = shape.pad;
        let [sh, sw] = shape.stride;
        let [dh, dw] = shape.dilation;
        result::set_convolution2d_descriptor(
            conv.0,
            ph,
            pw,
            sh,
            sw,
            dh,
            dw,
            sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            f32,
        )
        .map_err(|e| fail("convolution descriptor", e))?;
        result::set_convolution_math_type(conv.0, math).map_err(|e| fail("math type", e))?;
        result::set_convolution_group_count(conv.0, shape.groups).map_err(|e| fail("group count", e))?;
    }
    Ok((x, w, y, conv))
}

/// Picks the fastest successful candidate that fits the workspace (and is deterministic when
/// asked): cuDNN returns them sorted by measured time. Returns its algorithm, workspace and the
/// math type it was measured with (the descriptor must carry that one when it runs: an
/// algorithm measured without tensor cores fails with `BAD_PARAM` under tensor-core math).
macro_rules! pick {
    ($perf:expr, $n:expr, $limit:expr, $opts:expr, $wrap:path) => {
        $perf[..$n as usize]
            .iter()
            .find(|p| {
                p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                    && p.memory <= $limit
                    && (!$opts.deterministic || p.determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC)
            })
            .map(|p| ($wrap(p.algo), p.memory, p.mathType))
    };
}

/// Whether cuBLASLt takes `gemm` with `epilogue` on `device`, from any thread (the device's
/// context is bound to it first). cuBLASLt is asked once per product; later calls read the
/// answer kept with the device's cuBLAS handle.
pub(crate) fn epilogue_supported(
    device: usize,
    gemm: &crate::nn::cuda::gemm_layout::Gemm,
    epilogue: crate::nn::cuda::cublas_lt::Epilogue,
) -> bool {
    let Ok(state) = device_state(device) else { return false };
    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
    s.ctx.bind_to_thread().is_ok() && s.cublas().is_ok_and(|h| h.epilogue_supported(gemm, epilogue))
}

/// `device`'s CUDA context (the primary one, as burn-cuda's).
pub(crate) fn context(device: usize) -> Result<Arc<CudaContext>> {
    Ok(device_state(device)?.lock().unwrap_or_else(|p| p.into_inner()).ctx.clone())
}

impl DeviceState {
    /// burn-ddp's own stream of the device (for work ordered on it with cudarc's stream
    /// types: the page-locked uploads). Computations enqueue on [`cu_stream`](Self::cu_stream).
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The stream this call's work goes to: burn-ddp's own, or burn's (`Order::Same`).
    pub(crate) fn cu_stream(&self) -> driver::CUstream {
        self.streams.get()
    }

    /// Sends the work that follows, and the cuDNN and cuBLAS handles, to `to` (ordered after
    /// the work enqueued so far).
    fn use_stream(&mut self, to: driver::CUstream) -> Result<()> {
        if self.streams.switch(to)? {
            // SAFETY: a live handle and a live stream of its context.
            unsafe { result::set_stream(self.handle.0, to as sys::cudaStream_t) }
                .map_err(|e| fail("cudnnSetStream", e))?;
            if let Some(c) = self.cublas.as_mut() {
                c.set_stream(to)?;
            }
        }
        Ok(())
    }

    /// Runs `f` with the work ordered on burn-ddp's own stream (cudarc's allocations and frees
    /// happen there), then back on the current stream, ordered after it.
    fn on_own_stream<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let (current, own) = (self.streams.get(), self.streams.own());
        if current == own {
            return f(self);
        }
        self.streams.switch(own)?;
        let out = f(self);
        self.streams.switch(current)?;
        out
    }

    /// The raw cuDNN handle (bound to this state's stream).
    pub(crate) fn raw(&self) -> sys::cudnnHandle_t {
        self.handle.0
    }

    /// The cuBLAS handle on this state's stream, created on first use (the context must be bound).
    pub(crate) fn cublas(&mut self) -> Result<&mut crate::nn::cuda::cublas::Handle> {
        if self.cublas.is_none() {
            let mut handle = self.on_own_stream(|s| crate::nn::cuda::cublas::Handle::new(&s.stream))?;
            if self.streams.get() != self.streams.own() {
                handle.set_stream(self.streams.get())?;
            }
            self.cublas = Some(handle);
        }
        Ok(self.cublas.as_mut().expect("created above"))
    }

    /// The device-side fence kernels, loaded on first use (the context must be bound).
    fn fence_kernels(&mut self) -> Result<&DeviceKernels> {
        if self.fences.is_none() {
            self.fences = Some(DeviceKernels::load()?);
        }
        Ok(self.fences.as_ref().expect("loaded above"))
    }

    /// The device's workspace for a computation that needs `bytes`, grown if it is smaller
    /// (its address and length).
    pub(crate) fn workspace_ptr(&mut self, bytes: usize) -> Result<(u64, usize)> {
        self.workspace_need = self.workspace_need.max(bytes);
        self.workspace_at_least(bytes)
    }

    /// Hands back what an algorithm search took beyond the most any computation runs with (the
    /// free is ordered on this stream, after the search's work).
    fn shrink_workspace(&mut self) {
        if self.workspace.as_ref().is_some_and(|w| w.len() > self.workspace_need) {
            let _ = self.on_own_stream(|s| {
                s.workspace = None;
                Ok(())
            });
        }
    }

    /// The device's workspace, grown to at least `bytes` (its address and length).
    fn workspace_at_least(&mut self, bytes: usize) -> Result<(u64, usize)> {
        if self.workspace.as_ref().is_none_or(|w| w.len() < bytes) {
            self.on_own_stream(|s| {
                s.workspace = None; // free the old one first
                let ws =
                    s.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(|e| fail("allocating the cuDNN workspace", e))?;
                s.workspace = Some(ws);
                Ok(())
            })?;
        }
        let ws = self.workspace.as_mut().expect("allocated above");
        let len = ws.len();
        let (ptr, _sync) = ws.device_ptr_mut(&self.stream);
        Ok((ptr, len))
    }

    /// Measures every algorithm for `dir` on the real buffers (the output is overwritten, which
    /// the call that follows does anyway) and keeps the fastest that fits.
    ///
    /// # Safety
    /// As [`run`].
    unsafe fn find(
        &mut self,
        dir: Direction,
        shape: &ConvShape,
        p: Pointers,
        opts: &CudnnOptions,
    ) -> Result<LegacyPlan> {
        let (x, w, y, conv) = describe(shape, opts)?;
        let (ws, limit) = self.workspace_at_least(opts.workspace_limit)?;
        let h = self.handle.0;
        let (xp, wp, yp, wsp) = (p.x as *mut c_void, p.w as *mut c_void, p.y as *mut c_void, ws as *mut c_void);
        let mut n = 0i32;
        // SAFETY: the descriptors match the buffers' extents, which the caller guarantees are live
        // device allocations of this context; `perf` has room for the requested count.
        let picked = unsafe {
            match dir {
                Direction::Forward => {
                    let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); 16];
                    sys::cudnnFindConvolutionForwardAlgorithmEx(
                        h,
                        x.0,
                        xp,
                        w.0,
                        wp,
                        conv.0,
                        y.0,
                        yp,
                        16,
                        &mut n,
                        perf.as_mut_ptr(),
                        wsp,
                        limit,
                    )
                    .result()
                    .map_err(|e| fail("cudnnFindConvolutionForwardAlgorithmEx", e))?;
                    pick!(perf, n, limit, opts, Algo::Forward)
                }
                Direction::BackwardData | Direction::BackwardDataAccumulate => {
                    let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(); 16];
                    sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                        h,
                        w.0,
                        wp,
                        y.0,
                        yp,
                        conv.0,
                        x.0,
                        xp,
                        16,
                        &mut n,
                        perf.as_mut_ptr(),
                        wsp,
                        limit,
                    )
                    .result()
                    .map_err(|e| fail("cudnnFindConvolutionBackwardDataAlgorithmEx", e))?;
                    pick!(perf, n, limit, opts, Algo::BackwardData)
                }
                Direction::BackwardFilter => {
                    let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); 16];
                    sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        h,
                        x.0,
                        xp,
                        y.0,
                        yp,
                        conv.0,
                        w.0,
                        wp,
                        16,
                        &mut n,
                        perf.as_mut_ptr(),
                        wsp,
                        limit,
                    )
                    .result()
                    .map_err(|e| fail("cudnnFindConvolutionBackwardFilterAlgorithmEx", e))?;
                    pick!(perf, n, limit, opts, Algo::BackwardFilter)
                }
            }
        };
        let (algo, workspace, math) = picked.ok_or_else(|| {
            fail(
                "choosing an algorithm",
                format!(
                    "no {dir:?} algorithm for {shape:?} fits {limit} bytes of workspace{}",
                    if opts.deterministic { " deterministically" } else { "" }
                ),
            )
        })?;
        // SAFETY: a live descriptor, set with a plain value.
        unsafe { result::set_convolution_math_type(conv.0, math) }.map_err(|e| fail("math type", e))?;
        log::debug!("cuDNN {dir:?} {shape:?}: {algo:?}, {math:?}, workspace {workspace} B");
        Ok(LegacyPlan { x, w, y, conv, algo, workspace })
    }

    /// [`Self::choose`], measuring an accumulating backward-data on a scratch input gradient:
    /// the measurement runs the candidates several times, which would add `dy`'s share into
    /// the real gradient more than once.
    ///
    /// # Safety
    /// As [`run`].
    unsafe fn choose_for(
        &mut self,
        dir: Direction,
        shape: &ConvShape,
        p: Pointers,
        opts: &CudnnOptions,
    ) -> Result<Plan> {
        if dir != Direction::BackwardDataAccumulate {
            // SAFETY: as this function's contract.
            return unsafe { self.choose(dir, shape, p, opts) };
        }
        let elements = (0..4).map(|i| (shape.x[i] as usize - 1) * shape.x_strides[i] as usize).sum::<usize>() + 1;
        let stream = self.stream.clone();
        let mut scratch = stream
            .alloc_zeros::<u8>(elements * shape.dtype.size())
            .map_err(|e| fail("allocating a scratch gradient to measure on", e))?;
        let (ptr, _sync) = scratch.device_ptr_mut(&stream);
        // SAFETY: as this function's contract, with `x` replaced by a buffer of its extent.
        unsafe { self.choose(dir, shape, Pointers { x: ptr, ..p }, opts) }
    }

    /// The plan for `dir` on `shape`: from the graph API when allowed and possible (one line
    /// says so the first time it is not), else from Find on the legacy API.
    ///
    /// # Safety
    /// As [`run`].
    unsafe fn choose(&mut self, dir: Direction, shape: &ConvShape, p: Pointers, opts: &CudnnOptions) -> Result<Plan> {
        if opts.graph_api {
            let ws = self.workspace_at_least(opts.workspace_limit)?;
            // SAFETY: as this function's contract.
            match unsafe {
                crate::nn::cuda::cudnn::conv_graph::build(self.handle.0, &self.stream, dir, shape, p, ws, opts)
            } {
                Ok(plan) => return Ok(Plan::Graph(plan)),
                Err(e) => {
                    static ONCE: std::sync::Once = std::sync::Once::new();
                    ONCE.call_once(|| log::info!("cuDNN graph API: {e}; that shape (and any other without a graph plan) runs the legacy entry points"));
                    log::debug!("cuDNN graph API refused {dir:?} {shape:?}: {e}");
                }
            }
        }
        // SAFETY: as this function's contract.
        Ok(Plan::Legacy(unsafe { self.find(dir, shape, p, opts)? }))
    }
}

/// Runs one convolution computation on `device`, ordered by `order`.
///
/// # Errors
/// [`crate::Error::Cudnn`] when cuDNN cannot be loaded, refuses the shape, or fails.
///
/// # Safety
/// The pointers must be live device allocations of `device` holding at least the elements
/// `shape` describes (strides included), not written by anyone else until the computation has
/// finished (see [`Order`]).
pub unsafe fn run(device: usize, dir: Direction, shape: &ConvShape, p: Pointers, order: Order) -> Result<()> {
    // SAFETY: as this function's contract.
    unsafe { with_handle(device, order, |s| s.convolve(dir, shape, p)) }
}

/// Both gradients of one convolution — backward-data (`data.x` written), then
/// backward-filter (`filter.w` written) — in one ordered run: one wait for burn's stream and
/// one signal back, instead of two of each.
///
/// # Safety
/// As [`run`], for both sets of pointers.
pub unsafe fn run_backward(
    device: usize,
    shape: &ConvShape,
    data_dir: Direction,
    data: Pointers,
    filter: Pointers,
    order: Order,
) -> Result<()> {
    // SAFETY: as this function's contract.
    unsafe {
        with_handle(device, order, |s| {
            s.convolve(data_dir, shape, data)?;
            s.convolve(Direction::BackwardFilter, shape, filter)
        })
    }
}

impl DeviceState {
    /// Enqueues one convolution computation on this state's stream (inside [`with_handle`]),
    /// measuring the algorithm first when the shape is new.
    ///
    /// # Safety
    /// As [`run`].
    pub(crate) unsafe fn convolve(&mut self, dir: Direction, shape: &ConvShape, p: Pointers) -> Result<()> {
        let opts = options::get();
        let key = (dir, shape.clone(), opts.allow_tf32, opts.deterministic, opts.graph_api);
        if !self.plans.contains_key(&key) {
            // SAFETY: as this function's contract.
            let plan = unsafe { self.choose_for(dir, shape, p, &opts)? };
            self.plans.insert(key.clone(), plan);
            self.shrink_workspace();
        }
        let need = match &self.plans[&key] {
            Plan::Graph(g) => g.workspace,
            Plan::Legacy(l) => l.workspace,
        };
        let (ws, ws_len) = self.workspace_ptr(need)?;
        if dir == Direction::BackwardDataAccumulate {
            ACCUMULATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let h = self.handle.0;
        let plan = match &self.plans[&key] {
            // SAFETY: the plan was built for `shape`; the caller vouches for the buffers.
            Plan::Graph(g) => return unsafe { crate::nn::cuda::cudnn::conv_graph::execute(h, g, p, ws) },
            Plan::Legacy(l) => l,
        };
        let (one, beta) = (1f32, dir.beta());
        let (a, b) = (&one as *const f32 as *const c_void, &beta as *const f32 as *const c_void);
        let (xp, wp, yp, wsp) = (p.x as *mut c_void, p.w as *mut c_void, p.y as *mut c_void, ws as *mut c_void);
        // SAFETY: the plan's descriptors match `shape`; the caller vouches for the buffers.
        let status = unsafe {
            match plan.algo {
                Algo::Forward(algo) => sys::cudnnConvolutionForward(
                    h,
                    a,
                    plan.x.0,
                    xp,
                    plan.w.0,
                    wp,
                    plan.conv.0,
                    algo,
                    wsp,
                    ws_len,
                    b,
                    plan.y.0,
                    yp,
                ),
                Algo::BackwardData(algo) => sys::cudnnConvolutionBackwardData(
                    h,
                    a,
                    plan.w.0,
                    wp,
                    plan.y.0,
                    yp,
                    plan.conv.0,
                    algo,
                    wsp,
                    ws_len,
                    b,
                    plan.x.0,
                    xp,
                ),
                Algo::BackwardFilter(algo) => sys::cudnnConvolutionBackwardFilter(
                    h,
                    a,
                    plan.x.0,
                    xp,
                    plan.y.0,
                    yp,
                    plan.conv.0,
                    algo,
                    wsp,
                    ws_len,
                    b,
                    plan.w.0,
                    wp,
                ),
            }
        };
        status.result().map_err(|e| fail("running the convolution", e))
    }
}
