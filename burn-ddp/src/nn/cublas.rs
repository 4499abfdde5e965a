//! cuBLAS matrix products on raw device addresses: one handle per device, bound to the stream
//! cuDNN's work runs on (`cudnn::DeviceState` owns it), with its own workspace.
//!
//! Products are described row-major, as burn's tensors are: `C[M, N] = A[M, K] · B[K, N]` per
//! batch, each operand either row-major (`col_stride == 1`) or column-major (`row_stride == 1`,
//! a transposed view), with one stride between batches. cuBLAS is column-major: it computes
//! `Cᵀ = Bᵀ · Aᵀ`, and a row-major matrix read column-major is its transpose, so no data moves.
//! Accumulation is f32 for every element type (`CUBLAS_COMPUTE_32F`: strict f32 for f32
//! operands, no TF32).

use super::cudnn_types::fail;
use crate::error::{Error, Result};
use cudarc::cublas::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
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

/// The element type of all three matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmType {
    F32,
    Bf16,
    F16,
}

/// One operand as stored: `rows × cols` per batch, element `(i, j)` at
/// `batch · batch_stride + i · row_stride + j · col_stride` (elements, not bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
    pub batch_stride: usize,
}

impl Operand {
    /// The same memory read as the transposed matrix.
    pub fn t(self) -> Self {
        Operand { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }

    /// Whether cuBLAS reads it as it lies (row- or column-major, no gaps inside a row).
    pub fn is_readable(&self) -> bool {
        self.column_major_transpose().is_some()
    }

    /// cuBLAS's operation and leading dimension for this operand read column-major as its
    /// transpose (see the module documentation), or `None` when neither layout fits.
    fn column_major_transpose(&self) -> Option<(sys::cublasOperation_t, usize)> {
        if self.col_stride == 1 && self.row_stride >= self.cols.max(1) {
            Some((sys::cublasOperation_t::CUBLAS_OP_N, self.row_stride))
        } else if self.row_stride == 1 && self.col_stride >= self.rows.max(1) {
            Some((sys::cublasOperation_t::CUBLAS_OP_T, self.col_stride))
        } else {
            None
        }
    }
}

/// `C = A · B` for `batch` matrices; `c` must be row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gemm {
    pub dtype: GemmType,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    pub batch: usize,
}

impl Gemm {
    /// Errors unless the shapes chain, every operand has a layout cuBLAS reads, and every size
    /// fits cuBLAS's 32-bit arguments.
    pub fn validate(&self) -> Result<()> {
        let (a, b, c) = (self.a, self.b, self.c);
        let bad = |reason: String| Err(Error::Cudnn { op: "cuBLAS matrix product", reason });
        if a.cols != b.rows || c.rows != a.rows || c.cols != b.cols {
            return bad(format!("shapes {}x{} · {}x{} → {}x{} do not chain", a.rows, a.cols, b.rows, b.cols, c.rows, c.cols));
        }
        if c.col_stride != 1 || a.column_major_transpose().is_none() || b.column_major_transpose().is_none() {
            return bad(format!("unsupported strides {a:?} {b:?} {c:?}"));
        }
        let fits = |v: usize| v <= i32::MAX as usize;
        let all = [a.rows, a.cols, b.cols, a.row_stride, a.col_stride, b.row_stride, b.col_stride, c.row_stride, self.batch];
        if !all.into_iter().all(fits) || [a.batch_stride, b.batch_stride, c.batch_stride].iter().any(|&s| s > i64::MAX as usize) {
            return bad(format!("sizes beyond cuBLAS's 32-bit arguments: {self:?}"));
        }
        Ok(())
    }
}

/// A cuBLAS handle bound to one stream, with its workspace.
pub struct Handle {
    raw: sys::cublasHandle_t,
    /// Kept alive as long as the handle may use it.
    workspace: CudaSlice<u8>,
}

// SAFETY: a cuBLAS handle is a plain heap object; its owner (`cudnn::DeviceState`) is used under
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
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES).map_err(|e| fail("allocating the cuBLAS workspace", e))?;
        let raw = result::create_handle().map_err(|e| fail("cublasCreate", e))?;
        let mut handle = Handle { raw, workspace };
        let (ptr, sync) = handle.workspace.device_ptr_mut(stream);
        // SAFETY: a live handle, a live stream of the bound context and a live allocation of
        // WORKSPACE_BYTES that the handle keeps.
        unsafe {
            result::set_stream(raw, stream.cu_stream() as sys::cudaStream_t).map_err(|e| fail("cublasSetStream", e))?;
            sys::cublasSetWorkspace_v2(raw, ptr as *mut c_void, WORKSPACE_BYTES).result().map_err(|e| fail("cublasSetWorkspace", e))?;
        }
        drop(sync);
        Ok(handle)
    }

    /// Enqueues `gemm` on the handle's stream: `c` (fresh memory) = `a · b`.
    ///
    /// # Safety
    /// `a`, `b` and `c` must be live device memory of the handle's device holding the extents
    /// `gemm` describes, and `c` must not be read or written by anyone else until the stream has
    /// run the product.
    pub unsafe fn gemm(&self, gemm: &Gemm, a: u64, b: u64, c: u64) -> Result<()> {
        gemm.validate()?;
        let (op_b, ld_b) = gemm.b.column_major_transpose().expect("validated");
        let (op_a, ld_a) = gemm.a.column_major_transpose().expect("validated");
        let ty = match gemm.dtype {
            GemmType::F32 => sys::cudaDataType::CUDA_R_32F,
            GemmType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
            GemmType::F16 => sys::cudaDataType::CUDA_R_16F,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (m, n, k) = (gemm.c.cols as i32, gemm.c.rows as i32, gemm.a.cols as i32);
        // SAFETY: sizes validated; the pointers are the caller's promise.
        unsafe {
            result::gemm_strided_batched_ex(
                self.raw,
                op_b,
                op_a,
                m,
                n,
                k,
                (&alpha as *const f32).cast(),
                b as *const c_void,
                ty,
                ld_b as i32,
                gemm.b.batch_stride as i64,
                a as *const c_void,
                ty,
                ld_a as i32,
                gemm.a.batch_stride as i64,
                (&beta as *const f32).cast(),
                c as *mut c_void,
                ty,
                gemm.c.row_stride as i32,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row_major(rows: usize, cols: usize) -> Operand {
        Operand { rows, cols, row_stride: cols, col_stride: 1, batch_stride: rows * cols }
    }

    #[test]
    fn a_transposed_view_is_read_with_op_t_and_no_copy() {
        let a = row_major(3, 5);
        assert_eq!(a.column_major_transpose(), Some((sys::cublasOperation_t::CUBLAS_OP_N, 5)));
        assert_eq!(a.t().column_major_transpose(), Some((sys::cublasOperation_t::CUBLAS_OP_T, 5)));
        assert_eq!(a.t().t(), a);
    }

    #[test]
    fn shapes_that_do_not_chain_or_strided_columns_are_refused() {
        let g = Gemm { dtype: GemmType::Bf16, a: row_major(4, 8), b: row_major(8, 2), c: row_major(4, 2), batch: 1 };
        assert!(g.validate().is_ok());
        assert!(Gemm { b: row_major(7, 2), ..g }.validate().is_err());
        let gappy = Operand { col_stride: 2, row_stride: 16, ..row_major(4, 8) };
        assert!(Gemm { a: gappy, ..g }.validate().is_err());
        assert!(Gemm { c: row_major(4, 2).t().t(), ..g }.validate().is_ok());
    }
}
