//! cuBLAS matrix products on raw device addresses: one handle per device, bound to the stream
//! cuDNN's work runs on (`cuda::cudnn::convolution::DeviceState` owns it), with its own workspace.
//!
//! Products are described row-major ([`Gemm`], see `gemm_layout`); cuBLAS, column-major,
//! computes `Cᵀ = Bᵀ · Aᵀ` on the same memory. Accumulation is f32 for every element type (`CUBLAS_COMPUTE_32F`: strict f32 for f32
//! operands, no TF32).

use crate::error::Result;
use crate::nn::cuda::cublas_lt::{Epilogue, Lt};
use crate::nn::cuda::cudnn::types::fail;
use crate::nn::cuda::gemm_layout::{Gemm, GemmType, Operand};
use cudarc::cublas::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// cuBLAS's workspace: 32 MiB, NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

static GEMMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many products this process has enqueued on cuBLAS (for checks that the path ran).
pub fn calls() -> u64 {
    GEMMS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether libcublas can be loaded (it is opened at run time, not linked).
pub fn available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: opening a shared library by name; the handle is dropped again.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// A cuBLAS handle bound to one stream, with its workspace.
pub struct Handle {
    raw: sys::cublasHandle_t,
    stream: Arc<CudaStream>,
    /// Device memory for the pointer arrays of [`Handle::gemm_pointers`], grown as needed
    /// (reused call after call: each upload is ordered after the previous product on the stream).
    pointers: Option<CudaSlice<u64>>,
    /// Kept alive as long as the handle may use it.
    workspace: CudaSlice<u8>,
    /// The stream its work goes to (`stream`, or burn's own after [`Handle::set_stream`]).
    current: usize,
    /// cuBLASLt, for products with an epilogue (made on first use; `lt_tried` once it was).
    lt: Option<Lt>,
    lt_tried: bool,
}

// SAFETY: a cuBLAS handle is a plain heap object; its owner (`cuda::cudnn::convolution::DeviceState`) is used under
// the device's mutex, one thread at a time.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created in `new` and destroyed once, here.
        let _ = unsafe { result::destroy_handle(self.raw) };
    }
}

impl Handle {
    /// A handle whose work runs on `stream` (whose context must be bound to this thread).
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        if !available() {
            return Err(fail("loading libcublas", "not found on the library path"));
        }
        let workspace =
            stream.alloc_zeros::<u8>(WORKSPACE_BYTES).map_err(|e| fail("allocating the cuBLAS workspace", e))?;
        let raw = result::create_handle().map_err(|e| fail("cublasCreate", e))?;
        let current = stream.cu_stream() as usize;
        let mut handle =
            Handle { raw, stream: stream.clone(), pointers: None, workspace, current, lt: None, lt_tried: false };
        let (ptr, sync) = handle.workspace.device_ptr_mut(stream);
        // SAFETY: a live handle, a live stream of the bound context and a live allocation of
        // WORKSPACE_BYTES that the handle keeps.
        unsafe {
            result::set_stream(raw, stream.cu_stream() as sys::cudaStream_t).map_err(|e| fail("cublasSetStream", e))?;
            sys::cublasSetWorkspace_v2(raw, ptr as *mut c_void, WORKSPACE_BYTES)
                .result()
                .map_err(|e| fail("cublasSetWorkspace", e))?;
        }
        drop(sync);
        Ok(handle)
    }

    /// Sends the handle's later work to `to` (a stream of the same context; the caller orders
    /// it after the work enqueued so far), its workspace kept: cuBLAS forgets a workspace set
    /// by hand when its stream changes, so it is set again.
    pub(crate) fn set_stream(&mut self, to: cudarc::driver::sys::CUstream) -> Result<()> {
        let (ptr, sync) = self.workspace.device_ptr_mut(&self.stream);
        // SAFETY: a live handle, a live stream of its context and the handle's own workspace.
        unsafe {
            result::set_stream(self.raw, to as sys::cudaStream_t).map_err(|e| fail("cublasSetStream", e))?;
            sys::cublasSetWorkspace_v2(self.raw, ptr as *mut c_void, WORKSPACE_BYTES)
                .result()
                .map_err(|e| fail("cublasSetWorkspace", e))?;
        }
        drop(sync);
        self.current = to as usize;
        Ok(())
    }

    /// Enqueues `gemm` on the handle's stream: `c` (fresh memory) = `a · b`.
    ///
    /// # Safety
    /// `a`, `b` and `c` must be live device memory of the handle's device holding the extents
    /// `gemm` describes, and `c` must not be read or written by anyone else until the stream has
    /// run the product.
    pub unsafe fn gemm(&self, gemm: &Gemm, a: u64, b: u64, c: u64) -> Result<()> {
        let x = Args::of(gemm)?;
        // SAFETY: sizes validated; the pointers are the caller's promise.
        unsafe {
            result::gemm_strided_batched_ex(
                self.raw,
                x.op_b,
                x.op_a,
                x.m,
                x.n,
                x.k,
                (&ONE as *const f32).cast(),
                b as *const c_void,
                x.ty,
                x.ld_b,
                gemm.b.batch_stride as i64,
                a as *const c_void,
                x.ty,
                x.ld_a,
                gemm.a.batch_stride as i64,
                (&ZERO as *const f32).cast(),
                c as *mut c_void,
                x.ty,
                x.ld_c,
                gemm.c.batch_stride as i64,
                gemm.batch as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| fail("cublasGemmStridedBatchedEx", e))?;
        GEMMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Enqueues `gemm` with each matrix's address given (`a[i]`, `b[i]`, `c[i]` for the
    /// `gemm.batch` matrices; the operands' batch strides are ignored): for batches whose axes
    /// cannot be walked with one stride, such as attention's q, k, v viewed out of one qkv
    /// projection. The addresses go to the device on the handle's stream.
    ///
    /// # Safety
    /// As [`Handle::gemm`], for every matrix.
    pub unsafe fn gemm_pointers(&mut self, gemm: &Gemm, a: &[u64], b: &[u64], c: &[u64]) -> Result<()> {
        let x = Args::of(gemm)?;
        let n = gemm.batch;
        assert!(a.len() == n && b.len() == n && c.len() == n, "one address per matrix");
        // cuBLAS's first operand is our b (see the module documentation).
        let host: Vec<u64> = b.iter().chain(a).chain(c).copied().collect();
        let elsewhere = self.current != self.stream.cu_stream() as usize;
        if self.pointers.as_ref().is_none_or(|p| p.len() < host.len()) {
            if elsewhere && self.pointers.is_some() {
                // The old arrays are freed on the handle's own stream: the products on the
                // current one that read them finish first (a rare wait: the arrays only grow).
                self.wait_current()?;
            }
            self.pointers = None;
            self.pointers = Some(
                self.stream
                    .alloc_zeros::<u64>(host.len().next_power_of_two())
                    .map_err(|e| fail("allocating cuBLAS's pointer arrays", e))?,
            );
            if elsewhere {
                self.stream.synchronize().map_err(|e| fail("allocating cuBLAS's pointer arrays", e))?;
            }
        }
        let buf = self.pointers.as_mut().expect("allocated above");
        if elsewhere {
            let (at, sync) = buf.device_ptr_mut(&self.stream);
            // SAFETY: the arrays hold at least `host.len()` values; the copy is ordered on the
            // current stream with the products that read the arrays (pageable memory: the host
            // copy is staged before this returns).
            unsafe {
                cudarc::driver::sys::cuMemcpyHtoDAsync_v2(
                    at,
                    host.as_ptr() as *const c_void,
                    host.len() * 8,
                    self.current as cudarc::driver::sys::CUstream,
                )
            }
            .result()
            .map_err(|e| fail("uploading cuBLAS's pointer arrays", e))?;
            drop(sync);
        } else {
            self.stream.memcpy_htod(&host, buf).map_err(|e| fail("uploading cuBLAS's pointer arrays", e))?;
        }
        let (base, sync) = buf.device_ptr(&self.stream);
        let array = |i: u64| (base + i * 8 * n as u64) as *const *const c_void;
        // SAFETY: sizes validated; the arrays hold `n` live addresses each (the caller's promise).
        let status = unsafe {
            sys::cublasGemmBatchedEx(
                self.raw,
                x.op_b,
                x.op_a,
                x.m,
                x.n,
                x.k,
                (&ONE as *const f32).cast(),
                array(0),
                x.ty,
                x.ld_b,
                array(1),
                x.ty,
                x.ld_a,
                (&ZERO as *const f32).cast(),
                array(2) as *const *mut c_void,
                x.ty,
                x.ld_c,
                n as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        drop(sync);
        status.result().map_err(|e| fail("cublasGemmBatchedEx", e))?;
        GEMMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl Handle {
    /// Whether [`Handle::gemm_epilogue`] takes `gemm` with `epilogue`: cuBLASLt loads and
    /// proposes an algorithm for it within the handle's workspace (the context must be bound).
    pub(crate) fn epilogue_supported(&mut self, gemm: &Gemm, epilogue: Epilogue) -> bool {
        if !self.lt_tried {
            self.lt_tried = true;
            match Lt::new() {
                Ok(lt) => self.lt = Some(lt),
                Err(e) => log::info!("cuBLASLt: {e}; linear layers add their bias and sum its gradient apart"),
            }
        }
        self.lt.as_mut().is_some_and(|lt| lt.supports(gemm, epilogue, WORKSPACE_BYTES))
    }

    /// Enqueues `gemm` with `epilogue` on the handle's stream, with its workspace: `c` (fresh
    /// memory) = `a · b`, `v` the epilogue's vector (see [`Epilogue`]).
    ///
    /// # Safety
    /// [`Handle::epilogue_supported`] said yes for this product; the buffers as
    /// `cublas_lt::Lt::run` requires them.
    pub(crate) unsafe fn gemm_epilogue(&mut self, gemm: &Gemm, epilogue: Epilogue, buffers: [u64; 4]) -> Result<()> {
        let Handle { lt, workspace, stream, current, .. } = self;
        let lt = lt.as_ref().ok_or_else(|| fail("cuBLASLt product", "cuBLASLt is not loaded"))?;
        let (ptr, sync) = workspace.device_ptr_mut(stream);
        // SAFETY: as this function's contract; the workspace is the handle's own, used by one
        // stream at a time (the handle's current one).
        let done = unsafe {
            lt.run(gemm, epilogue, buffers, *current as cudarc::driver::sys::CUstream, (ptr, WORKSPACE_BYTES))
        };
        drop(sync);
        done?;
        GEMMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Waits on the host for the stream the handle's work goes to.
    fn wait_current(&self) -> Result<()> {
        // SAFETY: a live stream of the handle's context.
        unsafe { cudarc::driver::sys::cuStreamSynchronize(self.current as cudarc::driver::sys::CUstream) }
            .result()
            .map_err(|e| fail("waiting for cuBLAS's stream", e))
    }
}

/// `alpha` and `beta` of every product: `C = 1 · op(B)ᵀ·op(A)ᵀ + 0 · C`.
const ONE: f32 = 1.0;
const ZERO: f32 = 0.0;

/// cuBLAS's arguments for a validated product (its first operand is our `b`: see the module
/// documentation): operations, leading dimensions, element type, and `m, n, k` of `Cᵀ`.
struct Args {
    op_b: sys::cublasOperation_t,
    ld_b: i32,
    op_a: sys::cublasOperation_t,
    ld_a: i32,
    ld_c: i32,
    ty: sys::cudaDataType,
    m: i32,
    n: i32,
    k: i32,
}

impl Args {
    fn of(gemm: &Gemm) -> Result<Self> {
        gemm.validate()?;
        let ((op_b, ld_b), (op_a, ld_a)) = (op(gemm.b), op(gemm.a));
        let ty = match gemm.dtype {
            GemmType::F32 => sys::cudaDataType::CUDA_R_32F,
            GemmType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
            GemmType::F16 => sys::cudaDataType::CUDA_R_16F,
        };
        let (m, n, k) = (gemm.c.cols as i32, gemm.c.rows as i32, gemm.a.cols as i32);
        Ok(Args { op_b, ld_b: ld_b as i32, op_a, ld_a: ld_a as i32, ld_c: gemm.c.row_stride as i32, ty, m, n, k })
    }
}

/// cuBLAS's operation and leading dimension for a validated operand.
fn op(o: Operand) -> (sys::cublasOperation_t, usize) {
    match o.column_major().expect("validated") {
        (false, ld) => (sys::cublasOperation_t::CUBLAS_OP_N, ld),
        (true, ld) => (sys::cublasOperation_t::CUBLAS_OP_T, ld),
    }
}
