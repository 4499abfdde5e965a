//! Orders cuDNN's stream and burn's stream on the device, so the host never waits for either.
//!
//! cubecl does not expose the CUDA stream its kernels run on, so the two streams meet through two
//! flags in device memory, one pair per (device, burn stream) — burn-cuda gives each thread its
//! own stream, and cubecl's device thread runs work under the stream of the thread that queued
//! it. For the `n`-th cuDNN computation:
//!
//! 1. a one-thread kernel on burn's stream stores `n` in the first flag: it runs once everything
//!    burn launched before it (the producers of cuDNN's inputs, the last users of memory handed
//!    to cuDNN's outputs) has finished;
//! 2. on cuDNN's stream a one-thread kernel spins until `flag ≥ n`, the computation runs, and a
//!    one-thread kernel writes `n` to the second flag (PTX below, loaded through the driver:
//!    `cuStreamWaitValue32` refuses cubecl's pool memory with `CUDA_ERROR_INVALID_VALUE`);
//! 3. a one-thread kernel on burn's stream spins until the second flag is `≥ n`: everything burn
//!    launches afterwards (the consumers of the outputs, new users of freed input memory) runs
//!    after cuDNN.
//!
//! Step 3 waits only for step 2, which waits only for step 1, launched earlier on the same
//! stream: there is no cycle. Before the counter could wrap, both streams are drained and the
//! flags reset.

use crate::error::Result;
use crate::nn::cuda::cudnn::types::fail;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;
use cubecl::server::Handle;
use cubecl::stream_id::StreamId;
use cudarc::driver::sys as driver;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

/// The cuDNN-side halves, for the driver's JIT (any GPU since Volta): `fence_wait` spins on an
/// atomic read until `*flag >= value`, `fence_store` atomically stores `value`.
const FENCE_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry fence_wait(.param .u64 flag, .param .u32 value)
{
    .reg .u64 %rd<2>;
    .reg .u32 %r<3>;
    .reg .pred %p<1>;
    ld.param.u64 %rd0, [flag];
    ld.param.u32 %r0, [value];
    cvta.to.global.u64 %rd1, %rd0;
    mov.u32 %r2, 0;
SPIN:
    atom.global.add.u32 %r1, [%rd1], %r2;
    setp.lt.u32 %p0, %r1, %r0;
    @%p0 bra SPIN;
    ret;
}

.visible .entry fence_store(.param .u64 flag, .param .u32 value)
{
    .reg .u64 %rd<2>;
    .reg .u32 %r<2>;
    ld.param.u64 %rd0, [flag];
    ld.param.u32 %r0, [value];
    cvta.to.global.u64 %rd1, %rd0;
    atom.global.exch.b32 %r1, [%rd1], %r0;
    ret;
}
"#;

/// The cuDNN-side fence kernels of one CUDA context.
pub struct DeviceKernels {
    module: driver::CUmodule,
    wait: driver::CUfunction,
    store: driver::CUfunction,
}

// SAFETY: module and function handles are plain driver objects, used under the device's mutex.
unsafe impl Send for DeviceKernels {}

impl Drop for DeviceKernels {
    fn drop(&mut self) {
        // SAFETY: loaded once by `load`, unloaded once here.
        let _ = unsafe { driver::cuModuleUnload(self.module) };
    }
}

impl DeviceKernels {
    /// JIT-compiles the PTX in the current context (bind it first).
    pub fn load() -> Result<Self> {
        let src = std::ffi::CString::new(FENCE_PTX).expect("no NUL in the PTX");
        let mut module = std::ptr::null_mut();
        // SAFETY: NUL-terminated PTX text; out-pointer to a local.
        unsafe { driver::cuModuleLoadData(&mut module, src.as_ptr() as *const c_void) }
            .result()
            .map_err(|e| fail("loading the fence kernels", e))?;
        // From here on `Drop` unloads the module, also when a lookup below fails.
        let mut kernels = Self { module, wait: std::ptr::null_mut(), store: std::ptr::null_mut() };
        // SAFETY: a loaded module; NUL-terminated names; out-pointers to fields.
        unsafe {
            driver::cuModuleGetFunction(&mut kernels.wait, module, c"fence_wait".as_ptr())
                .result()
                .map_err(|e| fail("fence_wait", e))?;
            driver::cuModuleGetFunction(&mut kernels.store, module, c"fence_store".as_ptr())
                .result()
                .map_err(|e| fail("fence_store", e))?;
        }
        Ok(kernels)
    }

    /// Runs both kernels once on `stream` over a scratch flag and waits: proves they launch and
    /// return here before any real work depends on them.
    pub fn self_test(&self, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<()> {
        use cudarc::driver::DevicePtrMut;
        let mut flag = stream.alloc_zeros::<u32>(1).map_err(|e| fail("allocating a test flag", e))?;
        let (ptr, _sync) = flag.device_ptr_mut(stream);
        let fence = Fence { wait: (ptr, 7), signal: (ptr, 7) };
        self.signal(stream.cu_stream(), &fence)?;
        self.wait(stream.cu_stream(), &fence)?;
        stream.synchronize().map_err(|e| fail("testing the fence kernels", e))
    }

    fn launch(f: driver::CUfunction, stream: driver::CUstream, (flag, value): (u64, u32)) -> Result<()> {
        let (mut flag, mut value) = (flag, value);
        let mut params = [&mut flag as *mut u64 as *mut c_void, &mut value as *mut u32 as *mut c_void];
        // SAFETY: one thread, no shared memory; the parameters match the entry's signature.
        unsafe { driver::cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| fail("launching a fence kernel", e))
    }

    /// Enqueues on `stream` a wait until the fence's first flag reaches its value.
    pub fn wait(&self, stream: driver::CUstream, fence: &Fence) -> Result<()> {
        Self::launch(self.wait, stream, fence.wait)
    }

    /// Enqueues on `stream` the write of the fence's signal.
    pub fn signal(&self, stream: driver::CUstream, fence: &Fence) -> Result<()> {
        Self::launch(self.store, stream, fence.signal)
    }
}

#[cube(launch)]
fn store_flag(flag: &mut Array<Atomic<u32>>, value: u32) {
    flag[0].store(value);
}

#[cube(launch)]
fn wait_flag(flag: &Array<Atomic<u32>>, value: u32) {
    loop {
        if flag[0].load() >= value {
            break;
        }
    }
}

/// What cuDNN's stream waits for before a computation and writes after it.
#[derive(Clone, Copy, Debug)]
pub struct Fence {
    /// Device address of the flag burn's stream sets, and the value to wait for (`≥`).
    pub wait: (u64, u32),
    /// Device address of the flag burn's stream will wait on, and the value to write.
    pub signal: (u64, u32),
}

struct Flags {
    client: ComputeClient<CudaRuntime>,
    to_cudnn: Handle,
    to_burn: Handle,
    addresses: (u64, u64),
    count: u32,
}

/// The other stream a pair of flags orders burn's stream with. Each counts its own
/// computations, and each signals them in its own order, so each has its own flags: a later
/// cuDNN signal must not release a wait for an earlier NCCL collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Channel {
    /// cuDNN's (and cuBLAS's) stream of the device, waited for right after each computation.
    Cudnn,
    /// Work on another stream that burn waits for later (`side_stream`'s fork and join).
    Side,
}

thread_local! {
    /// Keyed by device, burn stream (cubecl's stream of the thread that queued the work) and
    /// channel.
    static FLAGS: RefCell<HashMap<(usize, StreamId, Channel), Flags>> = RefCell::new(HashMap::new());
}

fn store(client: &ComputeClient<CudaRuntime>, flag: &Handle, value: u32) {
    // SAFETY: the handle holds one u32.
    store_flag::launch::<CudaRuntime>(
        client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(1),
        unsafe { ArrayArg::from_raw_parts(flag.clone(), 1) },
        value,
    );
}

impl Flags {
    fn new(client: &ComputeClient<CudaRuntime>) -> Result<Self> {
        let zero = 0u32.to_ne_bytes();
        let (to_cudnn, to_burn) = (client.create_from_slice(&zero), client.create_from_slice(&zero));
        let address =
            |h: &Handle| client.get_resource(h.clone()).map(|r| r.resource().ptr).map_err(|e| fail("flag address", e));
        let addresses = (address(&to_cudnn)?, address(&to_burn)?);
        // The flags must hold their zeros before cuDNN's stream reads them.
        cubecl::future::block_on(client.sync()).map_err(|e| fail("initialising the stream flags", e))?;
        Ok(Self { client: client.clone(), to_cudnn, to_burn, addresses, count: 0 })
    }

    fn before(&mut self, flush: bool) -> Result<Fence> {
        if self.count >= 1 << 31 {
            cubecl::future::block_on(self.client.sync()).map_err(|e| fail("draining burn's stream", e))?;
            store(&self.client, &self.to_cudnn, 0);
            store(&self.client, &self.to_burn, 0);
            cubecl::future::block_on(self.client.sync()).map_err(|e| fail("resetting the stream flags", e))?;
            self.count = 0;
        }
        self.count += 1;
        store(&self.client, &self.to_cudnn, self.count);
        // cubecl launches at once; its flush only settles deferred frees and errors. Asked for
        // when the host will wait for cuDNN (a kind's first computation measures algorithms).
        if flush {
            self.client.flush().map_err(|e| fail("flushing burn's stream", e))?;
        }
        Ok(Fence { wait: (self.addresses.0, self.count), signal: (self.addresses.1, self.count) })
    }

    fn after(&self, fence: &Fence) {
        // SAFETY: the handle holds one u32.
        wait_flag::launch::<CudaRuntime>(
            &self.client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            unsafe { ArrayArg::from_raw_parts(self.to_burn.clone(), 1) },
            fence.signal.1,
        );
    }
}

/// Step 1 on `device` (burn's stream of this thread, through `client`): returns the fence
/// the other stream of `channel` must honour. `flush` settles cubecl's deferred work first
/// (before a host wait).
pub fn before(channel: Channel, device: usize, client: &ComputeClient<CudaRuntime>, flush: bool) -> Result<Fence> {
    FLAGS.with(|f| {
        let mut map = f.borrow_mut();
        let flags = match map.entry((device, StreamId::current(), channel)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Flags::new(client)?),
        };
        flags.before(flush)
    })
}

/// Step 3: burn's stream waits for the signal of `fence` on `channel`. Call only after the
/// computation and the signal write were enqueued on the other stream.
pub fn after(channel: Channel, device: usize, fence: &Fence) {
    FLAGS.with(|f| {
        if let Some(flags) = f.borrow().get(&(device, StreamId::current(), channel)) {
            flags.after(fence);
        }
    });
}
