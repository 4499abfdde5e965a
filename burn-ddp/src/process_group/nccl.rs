//! The NCCL process group: one communicator per process and GPU, the 128-byte unique id passed
//! through the store, collectives on its own CUDA stream, in place on device memory. Every
//! collective polls for completion against its time-out and aborts the communicator when it runs
//! out, so a dead peer gives an error rather than a hang.
//!
//! Without `feature = "cuda"` the type exists and its constructor returns
//! [`Error::CudaNotCompiled`](crate::Error::CudaNotCompiled), so callers need no `cfg`.

#[cfg(feature = "cuda")]
pub use imp::NcclProcessGroup;

#[cfg(not(feature = "cuda"))]
pub use stand_in::NcclProcessGroup;

#[cfg(not(feature = "cuda"))]
mod stand_in {
    use crate::error::{Error, Result};
    use crate::process_group::buffer::{Buffer, MemoryKind};
    use crate::process_group::*;
    use crate::store::Store;
    use std::time::Duration;

    /// NCCL process group (this build has no CUDA: [`NcclProcessGroup::new`] always fails).
    pub struct NcclProcessGroup {
        never: std::convert::Infallible,
    }

    impl NcclProcessGroup {
        /// Always [`Error::CudaNotCompiled`] in this build.
        ///
        /// # Errors
        /// Always.
        pub fn new(_store: &dyn Store, _rank: usize, _world: usize, _device: usize, _timeout: Duration) -> Result<Self> {
            Err(Error::CudaNotCompiled)
        }
    }

    impl ProcessGroup for NcclProcessGroup {
        fn rank(&self) -> usize {
            match self.never {}
        }
        fn world_size(&self) -> usize {
            match self.never {}
        }
        fn backend(&self) -> &'static str {
            "nccl"
        }
        fn memory(&self) -> MemoryKind {
            MemoryKind::Cuda
        }
        fn all_reduce(&self, _: Buffer<'_>, _: &AllReduceOptions) -> Result<()> {
            match self.never {}
        }
        fn broadcast(&self, _: Buffer<'_>, _: &BroadcastOptions) -> Result<()> {
            match self.never {}
        }
        fn all_gather(&self, _: Buffer<'_>, _: Buffer<'_>, _: &AllGatherOptions) -> Result<()> {
            match self.never {}
        }
        fn reduce_scatter(&self, _: Buffer<'_>, _: Buffer<'_>, _: &ReduceScatterOptions) -> Result<()> {
            match self.never {}
        }
        fn barrier(&self, _: &BarrierOptions) -> Result<()> {
            match self.never {}
        }
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::error::{Error, Result};
    use crate::process_group::buffer::{Buffer, DType, Memory, MemoryKind, ReduceOp};
    use crate::process_group::*;
    use crate::store::Store;
    use cudarc::driver::{CudaContext, CudaStream};
    use cudarc::nccl::{result as nr, sys as ns};
    use std::ffi::c_void;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    struct Comm(ns::ncclComm_t);
    // SAFETY: the communicator is only used under the group's mutex.
    unsafe impl Send for Comm {}

    /// A process group over NCCL (CUDA device memory).
    pub struct NcclProcessGroup {
        rank: usize,
        world: usize,
        device: usize,
        comm: Mutex<Option<Comm>>,
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        timeout: Duration,
    }

    fn cuda_err(op: &str, e: impl std::fmt::Debug) -> Error {
        Error::Cuda { op: op.to_string(), reason: format!("{e:?}") }
    }

    fn nccl_dtype(d: DType) -> ns::ncclDataType_t {
        match d {
            DType::F32 => ns::ncclDataType_t::ncclFloat32,
            DType::F64 => ns::ncclDataType_t::ncclFloat64,
            DType::I64 => ns::ncclDataType_t::ncclInt64,
            DType::F16 => ns::ncclDataType_t::ncclFloat16,
            DType::BF16 => ns::ncclDataType_t::ncclBfloat16,
        }
    }

    fn nccl_op(op: ReduceOp) -> ns::ncclRedOp_t {
        match op {
            ReduceOp::Sum => ns::ncclRedOp_t::ncclSum,
            ReduceOp::Mean => ns::ncclRedOp_t::ncclAvg,
            ReduceOp::Max => ns::ncclRedOp_t::ncclMax,
            ReduceOp::Min => ns::ncclRedOp_t::ncclMin,
        }
    }

    fn device_ptr(buf: &Buffer<'_>, device: usize) -> Result<u64> {
        match buf.memory {
            Memory::Cuda { ptr, device: d } if d == device => Ok(ptr),
            Memory::Cuda { device: d, .. } => Err(Error::Cuda { op: "nccl".into(), reason: format!("buffer is on GPU {d}, this rank's communicator is on GPU {device}") }),
            Memory::Host(_) => Err(Error::Cuda { op: "nccl".into(), reason: "got host memory; NCCL needs CUDA device memory (use the tcp backend for CPU tensors)".into() }),
        }
    }

    impl NcclProcessGroup {
        /// Creates this rank's communicator on GPU `device`; rank 0 makes the unique id and
        /// publishes it in the store.
        ///
        /// # Errors
        /// [`Error::Cuda`] when the driver, the GPU or `libnccl.so` is missing, or NCCL fails.
        pub fn new(store: &dyn Store, rank: usize, world: usize, device: usize, timeout: Duration) -> Result<Self> {
            crate::device::check_gpu_ids(&[device])?;
            // SAFETY: only probes whether the shared library can be opened.
            if !unsafe { ns::is_culib_present() } {
                return Err(Error::Cuda {
                    op: "loading libnccl.so".into(),
                    reason: "NCCL not found; install it (e.g. pip install nvidia-nccl-cu12) and put the folder holding libnccl.so on LD_LIBRARY_PATH".into(),
                });
            }
            let ctx = CudaContext::new(device).map_err(|e| cuda_err("cuCtx (primary context)", e))?;
            ctx.bind_to_thread().map_err(|e| cuda_err("bind context", e))?;
            let stream = ctx.new_stream().map_err(|e| cuda_err("cuStreamCreate", e))?;
            let key = "nccl/unique_id";
            let id = if rank == 0 {
                let id = nr::get_uniqueid().map_err(|e| cuda_err("ncclGetUniqueId", e))?;
                let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
                store.set(key, &bytes)?;
                id
            } else {
                store.wait(&[key], timeout).map_err(|_| Error::Timeout { op: "nccl unique id".into(), rank, waited: timeout, missing: vec![0] })?;
                let bytes = store.get(key)?;
                let mut id = ns::ncclUniqueId { internal: [0; 128] };
                if bytes.len() != 128 {
                    return Err(Error::Store { reason: format!("nccl unique id has {} bytes, expected 128", bytes.len()) });
                }
                for (dst, src) in id.internal.iter_mut().zip(bytes) {
                    *dst = src as _;
                }
                id
            };
            let mut comm = std::mem::MaybeUninit::uninit();
            // SAFETY: comm is written by NCCL on success; id is the group's shared id.
            unsafe { nr::comm_init_rank(comm.as_mut_ptr(), world as i32, id, rank as i32) }.map_err(|e| cuda_err("ncclCommInitRank", e))?;
            let comm = unsafe { comm.assume_init() };
            Ok(Self { rank, world, device, comm: Mutex::new(Some(Comm(comm))), ctx, stream, timeout })
        }

        /// Enqueues `launch` on the group's stream and waits for it, polling the communicator
        /// for asynchronous errors; aborts the communicator after the time-out.
        fn run(&self, op: &str, timeout: Option<Duration>, launch: impl FnOnce(ns::ncclComm_t, ns::cudaStream_t) -> Result<()>) -> Result<()> {
            let mut guard = self.comm.lock().expect("nccl comm poisoned");
            let comm = guard.as_ref().ok_or_else(|| Error::Cuda { op: op.into(), reason: "the communicator was aborted by an earlier time-out; restart the group".into() })?.0;
            self.ctx.bind_to_thread().map_err(|e| cuda_err("bind context", e))?;
            launch(comm, self.stream.cu_stream() as _)?;
            let timeout = timeout.unwrap_or(self.timeout);
            let start = Instant::now();
            loop {
                // SAFETY: the stream belongs to this group's context, bound above.
                match unsafe { cudarc::driver::sys::cuStreamQuery(self.stream.cu_stream()) } {
                    cudarc::driver::sys::CUresult::CUDA_SUCCESS => return Ok(()),
                    cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => {}
                    other => return Err(cuda_err(op, other)),
                }
                let mut async_err = ns::ncclResult_t::ncclSuccess;
                // SAFETY: valid communicator; out-pointer to a local.
                unsafe { ns::ncclCommGetAsyncError(comm, &mut async_err) };
                let failed = async_err != ns::ncclResult_t::ncclSuccess && async_err != ns::ncclResult_t::ncclInProgress;
                if failed || start.elapsed() > timeout {
                    // SAFETY: abort is the documented way out of a hung or failed communicator.
                    unsafe {
                        let _ = nr::comm_abort(comm);
                    }
                    *guard = None;
                    return Err(if failed {
                        Error::Cuda { op: op.into(), reason: format!("NCCL asynchronous error {async_err:?} (a peer failed?)") }
                    } else {
                        Error::Timeout { op: op.into(), rank: self.rank, waited: start.elapsed(), missing: vec![] }
                    });
                }
                // Spin while young (a 1 MiB all-reduce takes tens of µs), then back off.
                if start.elapsed() < Duration::from_millis(20) { std::thread::yield_now() } else { std::thread::sleep(Duration::from_micros(100)) }
            }
        }

        /// The GPU this rank's communicator runs on.
        pub fn device(&self) -> usize {
            self.device
        }
    }

    impl Drop for NcclProcessGroup {
        fn drop(&mut self) {
            if let Some(Comm(c)) = self.comm.lock().ok().and_then(|mut g| g.take()) {
                // SAFETY: the communicator is not used after this.
                unsafe {
                    let _ = nr::comm_destroy(c);
                }
            }
        }
    }

    impl ProcessGroup for NcclProcessGroup {
        fn rank(&self) -> usize {
            self.rank
        }
        fn world_size(&self) -> usize {
            self.world
        }
        fn backend(&self) -> &'static str {
            "nccl"
        }
        fn memory(&self) -> MemoryKind {
            MemoryKind::Cuda
        }

        fn all_reduce(&self, buf: Buffer<'_>, opts: &AllReduceOptions) -> Result<()> {
            let ptr = device_ptr(&buf, self.device)?;
            self.run("ncclAllReduce", opts.timeout, |comm, stream| {
                // SAFETY: ptr is live device memory of `len` elements on this GPU (caller contract).
                unsafe { nr::all_reduce(ptr as *const c_void, ptr as *mut c_void, buf.len, nccl_dtype(buf.dtype), nccl_op(opts.op), comm, stream) }
                    .map(|_| ())
                    .map_err(|e| cuda_err("ncclAllReduce", e))
            })
        }

        fn broadcast(&self, buf: Buffer<'_>, opts: &BroadcastOptions) -> Result<()> {
            let ptr = device_ptr(&buf, self.device)?;
            self.run("ncclBroadcast", opts.timeout, |comm, stream| {
                // SAFETY: as in all_reduce.
                unsafe { nr::broadcast(ptr as *const c_void, ptr as *mut c_void, buf.len, nccl_dtype(buf.dtype), opts.root as i32, comm, stream) }.map(|_| ()).map_err(|e| cuda_err("ncclBroadcast", e))
            })
        }

        fn all_gather(&self, input: Buffer<'_>, output: Buffer<'_>, opts: &AllGatherOptions) -> Result<()> {
            assert!(output.len == input.len * self.world, "Got all_gather input {} and output {}; expected output = {} × input", input.len, output.len, self.world);
            let (src, dst) = (device_ptr(&input, self.device)?, device_ptr(&output, self.device)?);
            self.run("ncclAllGather", opts.timeout, |comm, stream| {
                // SAFETY: as in all_reduce; output holds world × input elements.
                unsafe { nr::all_gather(src as *const c_void, dst as *mut c_void, input.len, nccl_dtype(input.dtype), comm, stream) }.map(|_| ()).map_err(|e| cuda_err("ncclAllGather", e))
            })
        }

        fn reduce_scatter(&self, input: Buffer<'_>, output: Buffer<'_>, opts: &ReduceScatterOptions) -> Result<()> {
            assert!(input.len == output.len * self.world, "Got reduce_scatter input {} and output {}; expected input = {} × output", input.len, output.len, self.world);
            let (src, dst) = (device_ptr(&input, self.device)?, device_ptr(&output, self.device)?);
            self.run("ncclReduceScatter", opts.timeout, |comm, stream| {
                // SAFETY: as in all_gather.
                unsafe { nr::reduce_scatter(src as *const c_void, dst as *mut c_void, output.len, nccl_dtype(input.dtype), nccl_op(opts.op), comm, stream) }
                    .map(|_| ())
                    .map_err(|e| cuda_err("ncclReduceScatter", e))
            })
        }

        fn barrier(&self, opts: &BarrierOptions) -> Result<()> {
            // An all-reduce of one element on a scratch allocation, as PyTorch's NCCL barrier.
            let scratch = self.stream.alloc_zeros::<f32>(1).map_err(|e| cuda_err("barrier scratch", e))?;
            let ptr = {
                use cudarc::driver::DevicePtr;
                let (p, _sync) = scratch.device_ptr(&self.stream);
                p
            };
            self.all_reduce(Buffer { dtype: DType::F32, len: 1, memory: Memory::Cuda { ptr, device: self.device } }, &AllReduceOptions { op: ReduceOp::Sum, timeout: opts.timeout })
        }
    }
}
