//! cuBLASLt products with work in their epilogue, on raw device addresses: the bias of a
//! linear layer added before the output is rounded to its type, or the bias's gradient written
//! by the kernel that computes the weight's.
//!
//! Products are described row-major, as everywhere here (`gemm_layout`: `C[M, N] = A[M, K] ·
//! B[K, N]`); cuBLASLt, column-major, computes `Cᵀ = Bᵀ · Aᵀ` on the same memory. So a bias
//! over `C`'s columns runs along cuBLASLt's rows of D (its `BIAS` epilogue), and the sums of
//! `B` over its rows — a linear layer's bias gradient, when the product is its weight gradient
//! `xᵀ · dy` — are the sums of cuBLASLt's first operand over the inner axis (`BGRADA`).
//!
//! A plan (the descriptors and the algorithm cuBLASLt's heuristics propose for them) is made
//! once per product and epilogue; a product cuBLASLt proposes nothing for gets no plan, and
//! its caller runs the separate operations instead.

use crate::error::Result;
use crate::nn::cuda::cudnn::types::fail;
use crate::nn::cuda::gemm_layout::{Gemm, GemmType, column_major_layouts};
use cudarc::cublaslt::{result, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the epilogue does besides `C = A · B`, with one vector of `N` elements in `C`'s type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// `C = A · B + v`, `v` added to every row of `C` (a linear layer's bias).
    Bias,
    /// `C = A · B` and `v[n] = Σₖ B[k, n]`, the sums of `B` over its rows (with `A = xᵀ` and
    /// `B = dy`: a linear layer's weight gradient and its bias gradient).
    SumsOfB,
}

impl Epilogue {
    fn raw(self) -> sys::cublasLtEpilogue_t {
        match self {
            Epilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::SumsOfB => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BGRADA,
        }
    }
}

static CALLS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// How many products with each epilogue (`[Bias, SumsOfB]`) this process has enqueued on
/// cuBLASLt (for checks that the path ran).
pub fn calls() -> [u64; 2] {
    [CALLS[0].load(Ordering::Relaxed), CALLS[1].load(Ordering::Relaxed)]
}

/// Whether libcublasLt can be loaded (it is opened at run time, not linked).
pub fn available() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: opening a shared library by name; the handle is dropped again.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The alignment every address is promised to have (checked on each call); cuBLASLt's
/// heuristics otherwise assume 256 bytes.
const ALIGNMENT: u32 = 16;

macro_rules! owned {
    ($name:ident, $raw:ty, $destroy:path) => {
        struct $name($raw);
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created once by this module and destroyed once, here.
                let _ = unsafe { $destroy(self.0) };
            }
        }
    };
}
owned!(Desc, sys::cublasLtMatmulDesc_t, result::destroy_matmul_desc);
owned!(Layout, sys::cublasLtMatrixLayout_t, result::destroy_matrix_layout);
owned!(Pref, sys::cublasLtMatmulPreference_t, result::destroy_matmul_pref);

/// One product's descriptors and the algorithm chosen for them.
struct Plan {
    desc: Desc,
    /// cuBLASLt's A (our `b`), B (our `a`) and D (our `c`, also its C).
    layouts: [Layout; 3],
    algo: sys::cublasLtMatmulAlgo_t,
    workspace: usize,
}

/// A cuBLASLt handle and the plans made with it.
pub(crate) struct Lt {
    raw: sys::cublasLtHandle_t,
    plans: HashMap<(Gemm, Epilogue), Option<Plan>>,
}

// SAFETY: a cuBLASLt handle and its descriptors are plain heap objects; their owner
// (`cuda::cublas::Handle`) is used under the device's mutex, one thread at a time.
unsafe impl Send for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created in `new` and destroyed once, here, after every descriptor made with it.
        let _ = unsafe { result::destroy_handle(self.raw) };
    }
}

/// `C = 1 · op(A)·op(B) + 0 · C`.
const ONE: f32 = 1.0;
const ZERO: f32 = 0.0;

impl Lt {
    /// A handle (the device's context must be bound to this thread).
    pub(crate) fn new() -> Result<Self> {
        if !available() {
            return Err(fail("loading libcublasLt", "not found on the library path"));
        }
        let raw = result::create_handle().map_err(|e| fail("cublasLtCreate", e))?;
        Ok(Lt { raw, plans: HashMap::new() })
    }

    /// Whether cuBLASLt proposes an algorithm for `gemm` with `epilogue` within `workspace`
    /// bytes (asked once per product; a refusal is logged once, at debug level).
    pub(crate) fn supports(&mut self, gemm: &Gemm, epilogue: Epilogue, workspace: usize) -> bool {
        let raw = self.raw;
        self.plans
            .entry((*gemm, epilogue))
            .or_insert_with(|| {
                plan(raw, gemm, epilogue, workspace)
                    .inspect_err(|e| log::debug!("cuBLASLt has no {epilogue:?} product for {gemm:?}: {e}"))
                    .ok()
            })
            .is_some()
    }

    /// Enqueues `gemm` with `epilogue` on `stream`: `c` (fresh memory) = `a · b`, and `v` the
    /// epilogue's vector (read for [`Epilogue::Bias`], written for [`Epilogue::SumsOfB`]).
    ///
    /// # Safety
    /// [`Lt::supports`] said yes for this product; `a`, `b`, `c` and `v` are live device memory
    /// of the handle's device with the extents `gemm` describes (`v`: `gemm.c.cols` elements of
    /// the product's type); `c` and a written `v` are not read or written by anyone else until
    /// `stream` has run the product; `workspace` holds `workspace.1` bytes that only this
    /// stream uses.
    pub(crate) unsafe fn run(
        &self,
        gemm: &Gemm,
        epilogue: Epilogue,
        [a, b, c, v]: [u64; 4],
        stream: cudarc::driver::sys::CUstream,
        workspace: (u64, usize),
    ) -> Result<()> {
        let plan = self
            .plans
            .get(&(*gemm, epilogue))
            .and_then(Option::as_ref)
            .ok_or_else(|| fail("cuBLASLt product", format!("no plan for {epilogue:?} {gemm:?}")))?;
        if [a, b, c, v].iter().any(|&p| p % ALIGNMENT as u64 != 0) || plan.workspace > workspace.1 {
            return Err(fail(
                "cuBLASLt product",
                format!(
                    "a buffer is not {ALIGNMENT}-byte aligned ({a:#x}, {b:#x}, {c:#x}, {v:#x}) or the workspace is short ({} of {} B)",
                    workspace.1, plan.workspace
                ),
            ));
        }
        let [la, lb, ld] = &plan.layouts;
        // SAFETY: a live descriptor; the attribute is the vector's address (a pointer-sized value).
        unsafe { set_desc(plan.desc.0, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &v) }?;
        // SAFETY: the plan was made for `gemm`; the caller vouches for the buffers and the stream.
        unsafe {
            result::matmul(
                self.raw,
                plan.desc.0,
                (&ONE as *const f32).cast(),
                (&ZERO as *const f32).cast(),
                b as *const c_void,
                la.0,
                a as *const c_void,
                lb.0,
                c as *const c_void,
                ld.0,
                c as *mut c_void,
                ld.0,
                &plan.algo,
                workspace.0 as *mut c_void,
                workspace.1,
                stream as sys::cudaStream_t,
            )
        }
        .map_err(|e| fail("cublasLtMatmul", e))?;
        CALLS[epilogue as usize].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Sets one attribute of a matmul descriptor to `value`.
///
/// # Safety
/// `desc` is live and `T` is the attribute's documented type.
unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<()> {
    // SAFETY: as this function's contract; cuBLASLt copies the value.
    unsafe { result::set_matmul_desc_attribute(desc, attr, (value as *const T).cast(), size_of::<T>()) }
        .map_err(|e| fail("cublasLtMatmulDescSetAttribute", e))
}

/// The descriptors for `gemm` with `epilogue` and the first algorithm cuBLASLt's heuristics
/// propose for them within `workspace` bytes: an error when it proposes none.
fn plan(handle: sys::cublasLtHandle_t, gemm: &Gemm, epilogue: Epilogue, workspace: usize) -> Result<Plan> {
    gemm.validate()?;
    if gemm.batch != 1 {
        return Err(fail("cuBLASLt product", "one matrix per product only"));
    }
    let ty = match gemm.dtype {
        GemmType::F32 => sys::cudaDataType::CUDA_R_32F,
        GemmType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        GemmType::F16 => sys::cudaDataType::CUDA_R_16F,
    };
    // cuBLASLt's A is our b, its B our a (see the module documentation).
    let stored = column_major_layouts(gemm).ok_or_else(|| fail("cuBLASLt product", "an operand cuBLAS cannot read"))?;
    let desc = Desc(
        result::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
            .map_err(|e| fail("cublasLtMatmulDescCreate", e))?,
    );
    use sys::cublasLtMatmulDescAttributes_t as D;
    // The operations are int32 values of cuBLAS's enum (0: as stored, 1: transposed), the
    // epilogue a uint32.
    let (trans_a, trans_b) = (stored[0].transposed as i32, stored[1].transposed as i32);
    // SAFETY: a live descriptor, each attribute with its documented type.
    unsafe {
        set_desc(desc.0, D::CUBLASLT_MATMUL_DESC_TRANSA, &trans_a)?;
        set_desc(desc.0, D::CUBLASLT_MATMUL_DESC_TRANSB, &trans_b)?;
        set_desc(desc.0, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &(epilogue.raw() as u32))?;
    }
    let [la, lb, ld] = stored.map(|s| {
        result::create_matrix_layout(ty, s.rows as u64, s.cols as u64, s.ld as i64)
            .map(Layout)
            .map_err(|e| fail("cublasLtMatrixLayoutCreate", e))
    });
    let layouts = [la?, lb?, ld?];
    let pref = Pref(result::create_matmul_pref().map_err(|e| fail("cublasLtMatmulPreferenceCreate", e))?);
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    let set_pref = |attr: P, value: *const c_void, size: usize| {
        // SAFETY: a live preference, each attribute with its documented type and size.
        unsafe { result::set_matmul_pref_attribute(pref.0, attr, value, size) }
            .map_err(|e| fail("cublasLtMatmulPreferenceSetAttribute", e))
    };
    let limit = workspace as u64;
    set_pref(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (&limit as *const u64).cast(), 8)?;
    for attr in [
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    ] {
        set_pref(attr, (&ALIGNMENT as *const u32).cast(), 4)?;
    }
    let [la, lb, ld] = &layouts;
    // SAFETY: live descriptors made above.
    let found = unsafe { result::get_matmul_algo_heuristic(handle, desc.0, la.0, lb.0, ld.0, ld.0, pref.0) }
        .map_err(|e| fail("cublasLtMatmulAlgoGetHeuristic", e))?;
    Ok(Plan { desc, layouts, algo: found.algo, workspace: found.workspaceSize })
}
