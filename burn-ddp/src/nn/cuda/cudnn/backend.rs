//! cuDNN's backend (graph) API, the plumbing every graph shares: descriptors that destroy
//! themselves, the engine configurations the heuristics propose, execution plans and their
//! workspace, and one execution with a variant pack. Raw descriptors and device addresses
//! only; what a graph computes is `cuda::cudnn::conv_graph`'s (convolutions) or `cuda::cudnn::attention`'s (attention).

use crate::error::Result;
use crate::nn::cuda::cudnn::types::fail;
use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as A, cudnnBackendAttributeType_t as T, cudnnBackendDescriptorType_t as D,
};
use std::ffi::c_void;

/// A backend descriptor, destroyed on drop.
pub(crate) struct Desc(pub(crate) sys::cudnnBackendDescriptor_t);

// SAFETY: descriptors are plain heap objects, used under the device's mutex.
unsafe impl Send for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once here.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    pub(crate) fn new(kind: D) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut raw) }
            .result()
            .map_err(|e| fail("cudnnBackendCreateDescriptor", e))?;
        Ok(Self(raw))
    }

    /// Sets attribute `name` to `values` of type `ty`.
    ///
    /// # Safety
    /// `V` must be the C type cuDNN reads for `ty`.
    pub(crate) unsafe fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<()> {
        // SAFETY: `values` holds `len` elements of the type `ty` names (caller's contract).
        unsafe {
            sys::cudnnBackendSetAttribute(self.0, name, ty, values.len() as i64, values.as_ptr() as *const c_void)
        }
        .result()
        .map_err(|e| fail("cudnnBackendSetAttribute", format!("{name:?}: {e:?}")))
    }

    pub(crate) fn i64s(&self, name: A, values: &[i64]) -> Result<()> {
        // SAFETY: INT64 attributes read i64.
        unsafe { self.set(name, T::CUDNN_TYPE_INT64, values) }
    }

    /// The value of one-integer attribute `name` (an INT64).
    pub(crate) fn get_i64(&self, name: A) -> Result<i64> {
        let (mut n, mut value) = (0i64, 0i64);
        // SAFETY: room for one INT64.
        unsafe {
            sys::cudnnBackendGetAttribute(
                self.0,
                name,
                T::CUDNN_TYPE_INT64,
                1,
                &mut n,
                &mut value as *mut i64 as *mut c_void,
            )
        }
        .result()
        .map_err(|e| fail("cudnnBackendGetAttribute", format!("{name:?}: {e:?}")))?;
        Ok(value)
    }

    pub(crate) fn descs(&self, name: A, values: &[&Desc]) -> Result<()> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = values.iter().map(|d| d.0).collect();
        // SAFETY: BACKEND_DESCRIPTOR attributes read descriptor handles.
        unsafe { self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw) }
    }

    /// Sets a cudnnDataType_t attribute.
    pub(crate) fn data_type(&self, name: A, value: sys::cudnnDataType_t) -> Result<()> {
        // SAFETY: DATA_TYPE attributes read cudnnDataType_t.
        unsafe { self.set(name, T::CUDNN_TYPE_DATA_TYPE, &[value]) }
    }

    pub(crate) fn finalize(self) -> Result<Self> {
        // SAFETY: a live descriptor whose required attributes were set.
        unsafe { sys::cudnnBackendFinalize(self.0) }.result().map_err(|e| fail("cudnnBackendFinalize", e))?;
        Ok(self)
    }
}

/// The first `limit` engine configurations heuristics `mode` proposes for `graph`, best first.
pub(crate) fn configs(graph: &Desc, mode: sys::cudnnBackendHeurMode_t, limit: usize) -> Result<(Desc, Vec<Desc>)> {
    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.descs(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?;
    // SAFETY: HEUR_MODE attributes read cudnnBackendHeurMode_t.
    unsafe { heur.set(A::CUDNN_ATTR_ENGINEHEUR_MODE, T::CUDNN_TYPE_HEUR_MODE, &[mode])? };
    let heur = heur.finalize()?;
    let mut count = 0i64;
    // SAFETY: a count query (no elements requested).
    unsafe {
        sys::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(|e| fail("engine heuristics", e))?;
    let cfgs = (0..count.clamp(0, limit as i64))
        .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = cfgs.iter().map(|d| d.0).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds `len` engine-config descriptors cuDNN fills in.
    unsafe {
        sys::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            raw.len() as i64,
            &mut got,
            raw.as_mut_ptr() as *mut c_void,
        )
    }
    .result()
    .map_err(|e| fail("engine heuristics", e))?;
    let mut cfgs = cfgs;
    cfgs.truncate(got.max(0) as usize);
    Ok((heur, cfgs))
}

/// The operation graph of `ops` (finalized operations, in an order where every tensor is
/// produced before it is read).
pub(crate) fn operation_graph(handle: sys::cudnnHandle_t, ops: &[&Desc]) -> Result<Desc> {
    let g = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    // SAFETY: HANDLE attributes read cudnnHandle_t.
    unsafe { g.set(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, T::CUDNN_TYPE_HANDLE, &[handle])? };
    g.descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, ops)?;
    g.finalize()
}

/// The finalized execution plan of engine configuration `cfg`, and the workspace bytes it needs.
pub(crate) fn plan(handle: sys::cudnnHandle_t, cfg: &Desc) -> Result<(Desc, usize)> {
    let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    // SAFETY: HANDLE attributes read cudnnHandle_t.
    unsafe { plan.set(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, T::CUDNN_TYPE_HANDLE, &[handle])? };
    plan.descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[cfg])?;
    let plan = plan.finalize()?;
    let bytes = workspace_size(&plan)?;
    Ok((plan, bytes))
}

fn workspace_size(plan: &Desc) -> Result<usize> {
    Ok(plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?.max(0) as usize)
}

/// A finalized plan's serialized form (cuDNN's JSON, which carries a runtime-compiled engine's
/// kernels); `None` for engines cuDNN cannot serialize.
pub(crate) fn plan_json(plan: &Desc) -> Option<String> {
    let mut n = 0i64;
    // SAFETY: a length query (no elements requested).
    unsafe {
        sys::cudnnBackendGetAttribute(
            plan.0,
            A::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
            T::CUDNN_TYPE_CHAR,
            0,
            &mut n,
            std::ptr::null_mut(),
        )
    }
    .result()
    .ok()?;
    let mut text = vec![0u8; usize::try_from(n).ok().filter(|&n| n > 0)?];
    // SAFETY: `text` holds `n` chars for cuDNN to fill.
    unsafe {
        sys::cudnnBackendGetAttribute(
            plan.0,
            A::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
            T::CUDNN_TYPE_CHAR,
            n,
            &mut n,
            text.as_mut_ptr() as *mut c_void,
        )
    }
    .result()
    .ok()?;
    text.truncate(text.iter().position(|&c| c == 0).unwrap_or(text.len()));
    String::from_utf8(text).ok()
}

/// A plan restored from [`plan_json`]'s text on `handle`'s device, and its workspace bytes.
pub(crate) fn plan_from_json(handle: sys::cudnnHandle_t, json: &str) -> Result<(Desc, usize)> {
    let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    // SAFETY: HANDLE attributes read cudnnHandle_t; CHAR attributes read bytes.
    unsafe {
        plan.set(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, T::CUDNN_TYPE_HANDLE, &[handle])?;
        plan.set(A::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, T::CUDNN_TYPE_CHAR, json.as_bytes())?;
    }
    let plan = plan.finalize()?;
    let bytes = workspace_size(&plan)?;
    Ok((plan, bytes))
}

/// Runs `plan` once on the handle's stream with `ptrs[i]` bound to tensor `uids[i]`.
///
/// # Safety
/// Each pointer must be live memory matching its tensor (device memory, or host memory holding
/// the value of a by-value tensor, read when this is called); the workspace at least the plan's
/// size.
pub(crate) unsafe fn run(
    handle: sys::cudnnHandle_t,
    plan: &Desc,
    uids: &[i64],
    ptrs: &[*mut c_void],
    workspace: u64,
) -> Result<()> {
    assert_eq!(uids.len(), ptrs.len(), "one pointer per tensor");
    let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.i64s(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?;
    // SAFETY: VOID_PTR attributes read pointers.
    unsafe {
        pack.set(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, T::CUDNN_TYPE_VOID_PTR, ptrs)?;
        pack.set(A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, T::CUDNN_TYPE_VOID_PTR, &[workspace as *mut c_void])?;
    }
    let pack = pack.finalize()?;
    // SAFETY: a finalized plan and variant pack; buffers as the caller guarantees.
    unsafe { sys::cudnnBackendExecute(handle, plan.0, pack.0) }.result().map_err(|e| fail("cudnnBackendExecute", e))
}
