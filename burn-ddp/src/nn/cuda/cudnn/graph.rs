//! Operation graphs of cuDNN's backend API built from parts: tensors (device buffers, virtual
//! intermediates, by-value scalars), pointwise, reduction, matmul and reshape operations, and
//! the first execution plan the heuristics offer for the whole graph. The fused graphs
//! (`cuda::cudnn::attention`'s attention, `cuda::cudnn::layer_norm`'s layer norm) are written with it. Raw descriptors only.

use crate::error::Result;
use crate::nn::cuda::cudnn::backend::{Desc, configs, operation_graph, plan, run};
use crate::nn::cuda::cudnn::convolution::DeviceState;
use crate::nn::cuda::cudnn::plan_store;
use crate::nn::cuda::cudnn::types::fail;
use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as A, cudnnBackendAttributeType_t as T, cudnnBackendDescriptorType_t as D,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What every buffer's address must be a multiple of (bytes).
pub(crate) const ALIGNMENT: u64 = 16;
pub(crate) const F32: sys::cudnnDataType_t = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;

/// A finalized plan and the descriptors it was built from.
pub(crate) struct Built {
    pub(crate) plan: Desc,
    /// Scratch bytes the plan needs.
    pub(crate) workspace: usize,
    _parts: Vec<Desc>,
}

/// How a tensor of the graph is bound.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Bind {
    /// A device buffer in the variant pack, by its unique id.
    Buffer(i64),
    /// Produced and consumed inside the fused kernels.
    Virtual,
    /// A host scalar handed over by value, by its unique id.
    Value(i64),
}

/// Collects a graph's descriptors; hands out the unique ids of its virtual tensors; writes down
/// what it was built from (its recipe: the plan's name in the plan cache on disk).
pub(crate) struct Graph {
    parts: Vec<Desc>,
    ops: Vec<usize>,
    next_virtual: i64,
    recipe: String,
}

/// A tensor of the graph, by its index in `Graph::parts`.
#[derive(Clone, Copy)]
pub(crate) struct Tn(usize);

/// Packed strides of `dims`.
pub(crate) fn packed(d: [i64; 4]) -> [i64; 4] {
    [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1]
}

impl Graph {
    pub(crate) fn new() -> Self {
        Self { parts: Vec::new(), ops: Vec::new(), next_virtual: 100, recipe: String::new() }
    }

    /// A tensor of `dims` with `strides` (elements), bound as `bind`.
    pub(crate) fn tensor(
        &mut self,
        bind: Bind,
        dtype: sys::cudnnDataType_t,
        dims: [i64; 4],
        strides: [i64; 4],
    ) -> Result<Tn> {
        let uid = match bind {
            Bind::Buffer(uid) | Bind::Value(uid) => uid,
            Bind::Virtual => {
                self.next_virtual += 1;
                self.next_virtual
            }
        };
        let t = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        t.data_type(A::CUDNN_ATTR_TENSOR_DATA_TYPE, dtype)?;
        t.i64s(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims)?;
        t.i64s(A::CUDNN_ATTR_TENSOR_STRIDES, &strides)?;
        t.i64s(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
        t.i64s(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[ALIGNMENT as i64])?;
        self.recipe += &format!("tensor {uid} {bind:?} {dtype:?} {dims:?} {strides:?}\n");
        // SAFETY: BOOLEAN attributes read a C bool.
        unsafe {
            t.set(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, T::CUDNN_TYPE_BOOLEAN, &[bind == Bind::Virtual])?;
            t.set(A::CUDNN_ATTR_TENSOR_IS_BY_VALUE, T::CUDNN_TYPE_BOOLEAN, &[matches!(bind, Bind::Value(_))])?;
        }
        Ok(self.keep(t.finalize()?))
    }

    /// A virtual f32 tensor of `dims`, packed.
    pub(crate) fn virt(&mut self, dims: [i64; 4]) -> Result<Tn> {
        self.tensor(Bind::Virtual, F32, dims, packed(dims))
    }

    pub(crate) fn keep(&mut self, d: Desc) -> Tn {
        self.parts.push(d);
        Tn(self.parts.len() - 1)
    }

    /// Adds the finalized operation `d`; `recipe` says what it computes from which tensors.
    fn op(&mut self, d: Desc, recipe: &str) {
        self.recipe += recipe;
        self.recipe.push('\n');
        self.parts.push(d);
        self.ops.push(self.parts.len() - 1);
    }

    /// Adds operation `d`, whose own attributes the caller has set, after binding `tensors`
    /// (attribute, tensor) to it; the recipe names it `what` with those bindings.
    pub(crate) fn custom_op(&mut self, d: Desc, what: &str, tensors: &[(A, Tn)]) -> Result<()> {
        for &(name, t) in tensors {
            d.descs(name, &[self.d(t)])?;
        }
        let bound: Vec<(A, usize)> = tensors.iter().map(|&(name, t)| (name, t.0)).collect();
        self.op(d.finalize()?, &format!("{what} {bound:?}"));
        Ok(())
    }

    pub(crate) fn d(&self, t: Tn) -> &Desc {
        &self.parts[t.0]
    }

    /// `y = mode(x[, b])` elementwise (b broadcast where its axes are 1), computed in f32.
    pub(crate) fn pointwise(&mut self, mode: sys::cudnnPointwiseMode_t, x: Tn, b: Option<Tn>, y: Tn) -> Result<()> {
        let pw = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        // SAFETY: POINTWISE_MODE attributes read cudnnPointwiseMode_t.
        unsafe { pw.set(A::CUDNN_ATTR_POINTWISE_MODE, T::CUDNN_TYPE_POINTWISE_MODE, &[mode])? };
        pw.data_type(A::CUDNN_ATTR_POINTWISE_MATH_PREC, F32)?;
        let pw = self.keep(pw.finalize()?);
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[self.d(pw)])?;
        op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[self.d(x)])?;
        if let Some(b) = b {
            op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[self.d(b)])?;
        }
        op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[self.d(y)])?;
        let op = op.finalize()?;
        self.op(op, &format!("pointwise {mode:?} {} {:?} {}", x.0, b.map(|b| b.0), y.0));
        Ok(())
    }

    /// `y = reduce(x)` over the axes where `y` has extent 1, in f32.
    pub(crate) fn reduction(&mut self, mode: sys::cudnnReduceTensorOp_t, x: Tn, y: Tn) -> Result<()> {
        let r = Desc::new(D::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        // SAFETY: REDUCTION_OPERATOR_TYPE attributes read cudnnReduceTensorOp_t.
        unsafe { r.set(A::CUDNN_ATTR_REDUCTION_OPERATOR, T::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &[mode])? };
        r.data_type(A::CUDNN_ATTR_REDUCTION_COMP_TYPE, F32)?;
        let r = self.keep(r.finalize()?);
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.descs(A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[self.d(x)])?;
        op.descs(A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[self.d(y)])?;
        op.descs(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[self.d(r)])?;
        let op = op.finalize()?;
        self.op(op, &format!("reduction {mode:?} {} {}", x.0, y.0));
        Ok(())
    }

    /// `c = a · b` over the last two axes, batched over the first two, f32 accumulation.
    pub(crate) fn matmul(&mut self, a: Tn, b: Tn, c: Tn) -> Result<()> {
        let m = Desc::new(D::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        m.data_type(A::CUDNN_ATTR_MATMUL_COMP_TYPE, F32)?;
        let m = self.keep(m.finalize()?);
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.descs(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[self.d(a)])?;
        op.descs(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[self.d(b)])?;
        op.descs(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[self.d(c)])?;
        op.descs(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[self.d(m)])?;
        let op = op.finalize()?;
        self.op(op, &format!("matmul {} {} {}", a.0, b.0, c.0));
        Ok(())
    }

    /// `y` as another view (dims/strides) of `x`'s values.
    pub(crate) fn reshape(&mut self, x: Tn, y: Tn) -> Result<()> {
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
        op.descs(A::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[self.d(x)])?;
        op.descs(A::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[self.d(y)])?;
        let op = op.finalize()?;
        self.op(op, &format!("reshape {} {}", x.0, y.0));
        Ok(())
    }

    /// Finalizes the operation graph and the first execution plan the heuristics (mode A, then
    /// the fallback list) offer that builds and needs at most `workspace_limit` bytes; or the
    /// plan an earlier process built from the same recipe, restored from the plan cache on disk.
    pub(crate) fn finish(
        mut self,
        handle: sys::cudnnHandle_t,
        what: &'static str,
        workspace_limit: usize,
    ) -> Result<Built> {
        self.recipe += &format!("workspace limit {workspace_limit}\n");
        if let Some((plan, workspace)) =
            plan_store::load(handle, &self.recipe).filter(|&(_, bytes)| bytes <= workspace_limit)
        {
            return Ok(Built { plan, workspace, _parts: self.parts });
        }
        let ops: Vec<&Desc> = self.ops.iter().map(|&i| &self.parts[i]).collect();
        let graph = operation_graph(handle, &ops)?;
        let mut tried = Vec::new();
        for mode in
            [sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A, sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK]
        {
            let cfgs = match configs(&graph, mode, 8) {
                Ok((_heur, cfgs)) => cfgs,
                Err(e) => {
                    tried.push(format!("{mode:?}: {e}"));
                    continue;
                }
            };
            for cfg in cfgs {
                match plan(handle, &cfg) {
                    Ok((p, bytes)) if bytes <= workspace_limit => {
                        plan_store::save(&self.recipe, &p);
                        self.parts.extend([graph, cfg]);
                        return Ok(Built { plan: p, workspace: bytes, _parts: self.parts });
                    }
                    Ok((_, bytes)) => tried.push(format!("needs {bytes} B of workspace")),
                    Err(e) => tried.push(e.to_string()),
                }
            }
        }
        Err(fail(
            what,
            format!("no engine ({})", if tried.is_empty() { "none proposed".to_string() } else { tried.join("; ") }),
        ))
    }
}

/// A forward and a backward plan of one problem.
pub(crate) struct Pair {
    pub(crate) forward: Built,
    pub(crate) backward: Built,
}

type Shared = Arc<Mutex<Pair>>;

/// Plans per (device, problem), built once on the caller's thread ([`PlanCache::prepare`]) and
/// looked up where they run ([`PlanCache::get`], which never builds: it runs inside the device's
/// lock). A problem cuDNN has no plan for is remembered too, so the caller's other path is taken
/// at once the next time.
pub(crate) struct PlanCache<K>(Mutex<Option<Known<K>>>);

/// Per (device, problem): the pair, or why cuDNN has none.
type Known<K> = HashMap<(usize, K), std::result::Result<Shared, String>>;

impl<K: std::hash::Hash + Eq + Copy + std::fmt::Debug> PlanCache<K> {
    pub(crate) const fn new() -> Self {
        Self(Mutex::new(None))
    }

    fn lookup(&self, device: usize, key: K) -> Option<std::result::Result<Shared, String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).get(&(device, key)).cloned()
    }

    /// Builds the pair for `key` on `device` with `build` (given the device's cuDNN handle)
    /// unless known; `what` names the computation in errors and the log.
    pub(crate) fn prepare(
        &self,
        device: usize,
        key: K,
        what: &'static str,
        build: impl FnOnce(sys::cudnnHandle_t) -> Result<Pair>,
    ) -> Result<()> {
        if let Some(known) = self.lookup(device, key) {
            return known.map(|_| ()).map_err(|e| fail(what, e));
        }
        let built = crate::nn::cuda::cudnn::convolution::with_state(device, |s| build(s.raw()))
            .map(|p| Arc::new(Mutex::new(p)))
            .map_err(|e| e.to_string());
        if let Ok(p) = &built {
            let p = p.lock().unwrap_or_else(|p| p.into_inner());
            log::info!(
                "{what} {key:?}: plans built, workspace forward {} B, backward {} B",
                p.forward.workspace,
                p.backward.workspace
            );
        }
        let out = built.as_ref().map(|_| ()).map_err(|e| fail(what, e));
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).insert((device, key), built);
        out
    }

    /// The prepared pair for `key` on `device`.
    pub(crate) fn get(&self, device: usize, key: K) -> Result<Shared> {
        match self.lookup(device, key) {
            Some(Ok(p)) => Ok(p),
            Some(Err(e)) => Err(fail("cuDNN plan", e)),
            None => Err(fail("cuDNN plan", format!("{key:?} was not prepared on device {device}"))),
        }
    }
}

/// Runs `plan` on `s`'s stream (inside `cuda::cudnn::convolution::with_handle`) with the device buffers `buffers`
/// (unique id, address) and the f32 scalars `values` (unique id, value) handed over by value;
/// every address, the workspace's included, must be [`ALIGNMENT`]-aligned (`what` names the
/// computation in the error).
///
/// # Safety
/// Each address must be live device memory matching its tensor in the plan, the workspace at
/// least the plan's size, until the work has finished.
pub(crate) unsafe fn execute(
    s: &DeviceState,
    what: &'static str,
    plan: &Desc,
    buffers: &[(i64, u64)],
    values: &[(i64, f32)],
    workspace: u64,
) -> Result<()> {
    if let Some(a) = buffers.iter().map(|&(_, a)| a).chain([workspace]).find(|a| a % ALIGNMENT != 0) {
        return Err(fail(what, format!("a buffer at {a:#x} is not {ALIGNMENT}-byte aligned")));
    }
    let uids: Vec<i64> = buffers.iter().map(|&(u, _)| u).chain(values.iter().map(|&(u, _)| u)).collect();
    let ptrs: Vec<*mut std::ffi::c_void> = buffers
        .iter()
        .map(|&(_, a)| a as *mut std::ffi::c_void)
        .chain(values.iter().map(|(_, v)| v as *const f32 as *mut std::ffi::c_void))
        .collect();
    // SAFETY: as this function's contract; the scalars live in `values`, read during the call.
    unsafe { run(s.raw(), plan, &uids, &ptrs, workspace) }
}
