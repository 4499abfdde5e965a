//! The NCCL process group: one communicator per process and GPU, the 128-byte unique id passed
//! through the store, collectives on its own CUDA stream, in place on device memory. Every
//! collective polls for completion against its time-out and aborts the communicator when it runs
//! out, so a dead peer gives an error rather than a hang.
//!
//! Without `feature = "cuda"` the type exists and its constructor returns
//! [`Error::CudaNotCompiled`](crate::Error::CudaNotCompiled), so callers need no `cfg`.

#[cfg(feature = "cuda")]
pub use imp::{DeviceReduction, NcclProcessGroup};

#[cfg(not(feature = "cuda"))]
pub use stand_in::NcclProcessGroup;

#[cfg(not(feature = "cuda"))]
mod stand_in {
    use crate::error::{Error, Result};
    use crate::process_group::buffer::{Buffer, MemoryKind};
    use crate::process_group::*;
    use crate::store::client::Store;
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
        pub fn new(
            _store: &dyn Store,
            _rank: usize,
            _world: usize,
            _device: usize,
            _timeout: Duration,
        ) -> Result<Self> {
            Err(Error::CudaNotCompiled)
        }

        /// Never reached in this build (no group exists).
        ///
        /// # Errors
        /// Never.
        pub fn check(&self) -> Result<()> {
            match self.never {}
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
    use super::super::nccl_watch::{CommState, Events, Ticket, Watchdog, Watched, cuda_err};
    use crate::error::{Error, Result};
    use crate::process_group::buffer::{Buffer, DType, Memory, MemoryKind, ReduceOp};
    use crate::process_group::*;
    use crate::store::client::Store;
    use cudarc::driver::{CudaContext, CudaStream, sys as driver};
    use cudarc::nccl::{result as nr, sys as ns};
    use std::ffi::c_void;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A process group over NCCL (CUDA device memory).
    pub struct NcclProcessGroup {
        rank: usize,
        world: usize,
        device: usize,
        state: Arc<CommState>,
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        timeout: Duration,
        /// Dropped before the communicator is destroyed: it waits for the collectives it follows.
        watchdog: Option<Watchdog>,
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
            Memory::Cuda { device: d, .. } => Err(Error::Cuda {
                op: "nccl".into(),
                reason: format!("buffer is on GPU {d}, this rank's communicator is on GPU {device}"),
            }),
            Memory::Host(_) => Err(Error::Cuda {
                op: "nccl".into(),
                reason: "got host memory; NCCL needs CUDA device memory (use the tcp backend for CPU tensors)".into(),
            }),
        }
    }

    fn unique_id(store: &dyn Store, rank: usize, timeout: Duration) -> Result<ns::ncclUniqueId> {
        let key = "nccl/unique_id";
        if rank == 0 {
            let id = nr::get_uniqueid().map_err(|e| cuda_err("ncclGetUniqueId", e))?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            store.set(key, &bytes)?;
            return Ok(id);
        }
        store.wait(&[key], timeout).map_err(|_| Error::Timeout {
            op: "nccl unique id".into(),
            rank,
            waited: timeout,
            missing: vec![0],
        })?;
        let bytes = store.get(key)?;
        if bytes.len() != 128 {
            return Err(Error::Store { reason: format!("nccl unique id has {} bytes, expected 128", bytes.len()) });
        }
        let mut id = ns::ncclUniqueId { internal: [0; 128] };
        for (dst, src) in id.internal.iter_mut().zip(bytes) {
            *dst = src as _;
        }
        Ok(id)
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
            let id = unique_id(store, rank, timeout)?;
            let mut comm = std::mem::MaybeUninit::uninit();
            // SAFETY: comm is written by NCCL on success; id is the group's shared id.
            unsafe { nr::comm_init_rank(comm.as_mut_ptr(), world as i32, id, rank as i32) }
                .map_err(|e| cuda_err("ncclCommInitRank", e))?;
            let state = Arc::new(CommState::new(unsafe { comm.assume_init() }, rank));
            let origin = Events::new()?;
            Events::record(origin.end, stream.cu_stream())?;
            stream.synchronize().map_err(|e| cuda_err("cuStreamSynchronize", e))?;
            let watched =
                Watched { state: state.clone(), ctx: ctx.clone(), timeout, origin: (origin, Instant::now()), device };
            Ok(Self { rank, world, device, state, ctx, stream, timeout, watchdog: Some(Watchdog::spawn(watched)) })
        }

        /// Enqueues `launch` on the group's stream between two events and waits for the second,
        /// polling the communicator for asynchronous errors; aborts it after the time-out.
        /// Returns the collective's device time in seconds.
        fn run(
            &self,
            op: &str,
            timeout: Option<Duration>,
            launch: impl FnOnce(ns::ncclComm_t, ns::cudaStream_t) -> Result<()>,
        ) -> Result<f64> {
            let events = Events::new()?;
            let stream = self.stream.cu_stream();
            self.state.with(op, |comm| {
                self.ctx.bind_to_thread().map_err(|e| cuda_err("bind context", e))?;
                Events::record(events.start, stream)?;
                launch(comm, stream as _)?;
                Events::record(events.end, stream)
            })?;
            let timeout = timeout.unwrap_or(self.timeout);
            let start = Instant::now();
            loop {
                match events.done() {
                    Some(true) => return Ok(Events::between(events.start, events.end) * 1e-3),
                    Some(false) => {}
                    None => return Err(cuda_err(op, "the CUDA event after the collective failed")),
                }
                if let Some((why, timed_out)) = self.state.stop_reason(op, start.elapsed(), timeout) {
                    self.state.abort(why.clone());
                    return Err(if timed_out {
                        Error::Timeout { op: op.into(), rank: self.rank, waited: start.elapsed(), missing: vec![] }
                    } else {
                        Error::Cuda { op: op.into(), reason: why }
                    });
                }
                // Spin while young (a 1 MiB all-reduce takes tens of µs), then back off.
                if start.elapsed() < Duration::from_millis(20) {
                    std::thread::yield_now()
                } else {
                    std::thread::sleep(Duration::from_micros(100))
                }
            }
        }

        /// The GPU this rank's communicator runs on.
        pub fn device(&self) -> usize {
            self.device
        }

        /// Runs `f` with the group's stream, the device's context bound: work ordered on NCCL's
        /// stream that is no collective (`BURN_DDP_DIAGNOSE=fences-only`).
        ///
        /// # Errors
        /// A failed group, or `f`'s error.
        pub(crate) fn on_stream(&self, f: impl FnOnce(driver::CUstream) -> Result<()>) -> Result<()> {
            self.state.with("NCCL stream", |_| {
                self.ctx.bind_to_thread().map_err(|e| cuda_err("bind context", e))?;
                f(self.stream.cu_stream())
            })
        }

        /// Sums each of `items` over the ranks as one NCCL group (`ncclGroupStart`/`End`: one
        /// launch for them all) on the group's stream, and returns at once: each item's values
        /// (first multiplied by its `scale` when given — NCCL's pre-multiplied sum: `1 / world`
        /// averages in the same pass) read at its source, the sum written at its destination
        /// (the same address: in place). `before` enqueues on that stream what the collectives
        /// must follow, `after` what follows them (the device-side ordering with burn's stream,
        /// and any copies in and out). The group's watchdog follows them: their device time goes
        /// to the collective clock and the trace, and a time-out or a failed peer aborts the
        /// communicator, after which this and every other call returns that error.
        ///
        /// # Errors
        /// A failed or aborted group, a buffer not on this group's GPU, `scale` with a buffer
        /// other than f32, or a failed launch.
        pub fn all_reduce_async(
            &self,
            items: &[DeviceReduction<'_>],
            label: String,
            before: impl FnOnce(driver::CUstream) -> Result<()>,
            after: impl FnOnce(driver::CUstream) -> Result<()>,
        ) -> Result<()> {
            let mut bytes = 0;
            for item in items {
                device_ptr(&item.src, self.device)?;
                if item.scale.is_some() && item.src.dtype != DType::F32 {
                    return Err(cuda_err(
                        "ncclAllReduce",
                        format!("a pre-multiplied sum needs an f32 buffer, got {:?}", item.src.dtype),
                    ));
                }
                bytes += item.src.len * item.src.dtype.size();
            }
            // Each part timed as its own span, on whichever thread enqueues.
            let part = crate::trace::DDP_COLLECTIVE;
            let watchdog = self.watchdog.as_ref().expect("present until drop");
            let events = crate::trace::span("ddp: NCCL's timing events", part, || watchdog.events())?;
            let stream = self.stream.cu_stream();
            self.state.with(&label, |comm| {
                self.ctx.bind_to_thread().map_err(|e| cuda_err("bind context", e))?;
                crate::trace::span("ddp: before the collective (wait, gather)", part, || before(stream))?;
                Events::record(events.start, stream)?;
                crate::trace::span("ddp: NCCL group", part, || grouped(comm, stream, items, self.device))?;
                Events::record(events.end, stream)?;
                crate::trace::span("ddp: after the collective (scatter, signal)", part, || after(stream))
            })?;
            watchdog.follow(Ticket { label, bytes, enqueued: Instant::now(), events });
            Ok(())
        }

        /// The error that ended this group (time-out, failed peer), if one did.
        ///
        /// # Errors
        /// That error.
        pub fn check(&self) -> Result<()> {
            self.state.with("NCCL group", |_| Ok(()))
        }
    }

    /// One buffer of [`NcclProcessGroup::all_reduce_async`]: the values at `src`, their sum
    /// over the ranks written at `dst` (`src`'s own address: in place), each rank's values first
    /// multiplied by `scale` when given (f32 only).
    pub struct DeviceReduction<'a> {
        pub src: Buffer<'a>,
        pub dst: u64,
        pub scale: Option<f32>,
    }

    /// Enqueues every item's all-reduce on `stream` as one NCCL group; the group is closed
    /// whatever happens inside it.
    fn grouped(
        comm: ns::ncclComm_t,
        stream: driver::CUstream,
        items: &[DeviceReduction<'_>],
        device: usize,
    ) -> Result<()> {
        let mut ops = Vec::new();
        nr::group_start().map_err(|e| cuda_err("ncclGroupStart", e))?;
        let launched = items.iter().try_for_each(|item| {
            let src = device_ptr(&item.src, device)?;
            let op = match item.scale {
                Some(s) => {
                    let op = premul_sum(comm, s)?;
                    ops.push(op);
                    op
                }
                None => ns::ncclRedOp_t::ncclSum,
            };
            // SAFETY: src and dst are live device memory of `len` elements on this GPU (the
            // caller's contract), untouched by others until `after`'s consumers run.
            unsafe {
                nr::all_reduce(
                    src as *const c_void,
                    item.dst as *mut c_void,
                    item.src.len,
                    nccl_dtype(item.src.dtype),
                    op,
                    comm,
                    stream as _,
                )
            }
            .map(|_| ())
            .map_err(|e| cuda_err("ncclAllReduce", e))
        });
        let ended = nr::group_end().map(|_| ()).map_err(|e| cuda_err("ncclGroupEnd", e));
        for op in ops {
            // SAFETY: NCCL allows destroying an operator once the calls using it returned (the
            // group has ended).
            unsafe { ns::ncclRedOpDestroy(op, comm) };
        }
        launched.and(ended)
    }

    /// NCCL's sum of each rank's values times `scale` (an f32 given by value).
    fn premul_sum(comm: ns::ncclComm_t, scale: f32) -> Result<ns::ncclRedOp_t> {
        let mut op = std::mem::MaybeUninit::uninit();
        let mut scalar = scale;
        // SAFETY: out-pointer to a local; the scalar is read during this call (host, immediate).
        let r = unsafe {
            ns::ncclRedOpCreatePreMulSum(
                op.as_mut_ptr(),
                &mut scalar as *mut f32 as *mut c_void,
                ns::ncclDataType_t::ncclFloat32,
                ns::ncclScalarResidence_t::ncclScalarHostImmediate,
                comm,
            )
        };
        if r != ns::ncclResult_t::ncclSuccess {
            return Err(cuda_err("ncclRedOpCreatePreMulSum", r));
        }
        // SAFETY: written by NCCL on success.
        Ok(unsafe { op.assume_init() })
    }

    impl Drop for NcclProcessGroup {
        fn drop(&mut self) {
            // The watchdog returns once the collectives it follows have ended or were aborted.
            drop(self.watchdog.take());
            self.state.destroy();
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
        fn as_nccl(&self) -> Option<&NcclProcessGroup> {
            Some(self)
        }

        fn all_reduce(&self, buf: Buffer<'_>, opts: &AllReduceOptions) -> Result<()> {
            let ptr = device_ptr(&buf, self.device)?;
            let seconds = self.run("ncclAllReduce", opts.timeout, |comm, stream| {
                // SAFETY: ptr is live device memory of `len` elements on this GPU (caller contract).
                unsafe {
                    nr::all_reduce(
                        ptr as *const c_void,
                        ptr as *mut c_void,
                        buf.len,
                        nccl_dtype(buf.dtype),
                        nccl_op(opts.op),
                        comm,
                        stream,
                    )
                }
                .map(|_| ())
                .map_err(|e| cuda_err("ncclAllReduce", e))
            })?;
            crate::collective_time::add_seconds(seconds);
            Ok(())
        }

        fn broadcast(&self, buf: Buffer<'_>, opts: &BroadcastOptions) -> Result<()> {
            let ptr = device_ptr(&buf, self.device)?;
            self.run("ncclBroadcast", opts.timeout, |comm, stream| {
                // SAFETY: as in all_reduce.
                unsafe {
                    nr::broadcast(
                        ptr as *const c_void,
                        ptr as *mut c_void,
                        buf.len,
                        nccl_dtype(buf.dtype),
                        opts.root as i32,
                        comm,
                        stream,
                    )
                }
                .map(|_| ())
                .map_err(|e| cuda_err("ncclBroadcast", e))
            })
            .map(|_| ())
        }

        fn all_gather(&self, input: Buffer<'_>, output: Buffer<'_>, opts: &AllGatherOptions) -> Result<()> {
            assert!(
                output.len == input.len * self.world,
                "Got all_gather input {} and output {}; expected output = {} × input",
                input.len,
                output.len,
                self.world
            );
            let (src, dst) = (device_ptr(&input, self.device)?, device_ptr(&output, self.device)?);
            self.run("ncclAllGather", opts.timeout, |comm, stream| {
                // SAFETY: as in all_reduce; output holds world × input elements.
                unsafe {
                    nr::all_gather(
                        src as *const c_void,
                        dst as *mut c_void,
                        input.len,
                        nccl_dtype(input.dtype),
                        comm,
                        stream,
                    )
                }
                .map(|_| ())
                .map_err(|e| cuda_err("ncclAllGather", e))
            })
            .map(|_| ())
        }

        fn reduce_scatter(&self, input: Buffer<'_>, output: Buffer<'_>, opts: &ReduceScatterOptions) -> Result<()> {
            assert!(
                input.len == output.len * self.world,
                "Got reduce_scatter input {} and output {}; expected input = {} × output",
                input.len,
                output.len,
                self.world
            );
            let (src, dst) = (device_ptr(&input, self.device)?, device_ptr(&output, self.device)?);
            self.run("ncclReduceScatter", opts.timeout, |comm, stream| {
                // SAFETY: as in all_gather.
                unsafe {
                    nr::reduce_scatter(
                        src as *const c_void,
                        dst as *mut c_void,
                        output.len,
                        nccl_dtype(input.dtype),
                        nccl_op(opts.op),
                        comm,
                        stream,
                    )
                }
                .map(|_| ())
                .map_err(|e| cuda_err("ncclReduceScatter", e))
            })
            .map(|_| ())
        }

        fn barrier(&self, opts: &BarrierOptions) -> Result<()> {
            // An all-reduce of one element on a scratch allocation, as PyTorch's NCCL barrier.
            let scratch = self.stream.alloc_zeros::<f32>(1).map_err(|e| cuda_err("barrier scratch", e))?;
            let ptr = {
                use cudarc::driver::DevicePtr;
                let (p, _sync) = scratch.device_ptr(&self.stream);
                p
            };
            self.all_reduce(
                Buffer { dtype: DType::F32, len: 1, memory: Memory::Cuda { ptr, device: self.device } },
                &AllReduceOptions { op: ReduceOp::Sum, timeout: opts.timeout },
            )
        }
    }
}
