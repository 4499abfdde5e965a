//! One convolution through cuDNN's graph (backend) API: an execution plan per (direction,
//! shape, math settings), chosen once by timing on the real buffers the engines cuDNN's
//! heuristics propose, then run with one variant pack per call.
//!
//! Why: cuDNN 9 builds its legacy `cudnnConvolution*` entry points on this API and pays for it
//! on every call — about 0.15 ms of host time each on cubecl's compute thread (measured on an
//! H200, docs/benchmarks-history.md, 2026-12-01), which then sets the pace of a training step. A finalized plan costs one
//! variant pack and `cudnnBackendExecute` (PyTorch runs its convolutions this way).
//!
//! Everything here sees raw descriptors and device addresses only; `nn/cuda/cudnn/convolution.rs` decides when a
//! plan is built and falls back to the legacy entry points when none can be.

use crate::error::Result;
use crate::nn::cuda::cudnn::backend::{Desc, configs, operation_graph, plan};
use crate::nn::cuda::cudnn::types::{ConvShape, DataType, Direction, Pointers, fail};
use crate::nn::settings::options::CudnnOptions;
use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as A, cudnnBackendAttributeType_t as T, cudnnBackendDescriptorType_t as D,
};
use cudarc::driver::CudaStream;
use std::ffi::c_void;
use std::sync::Arc;

/// Timed runs per candidate (after one untimed run).
const RUNS: usize = 2;
/// What the plan promises about every buffer's address (checked on each call).
const ALIGNMENT: i64 = 16;
const UIDS: [i64; 3] = [b'x' as i64, b'w' as i64, b'y' as i64];

/// A finalized plan and everything it was built from (kept alive with it).
pub(crate) struct GraphPlan {
    plan: Desc,
    /// Scratch bytes the plan needs.
    pub(crate) workspace: usize,
    _parts: Vec<Desc>,
}

fn tensor(uid: i64, shape: &ConvShape, dims: [i32; 4], strides: [i32; 4]) -> Result<Desc> {
    let t = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    // SAFETY: DATA_TYPE attributes read cudnnDataType_t.
    unsafe { t.set(A::CUDNN_ATTR_TENSOR_DATA_TYPE, T::CUDNN_TYPE_DATA_TYPE, &[shape.dtype.raw()])? };
    t.i64s(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims.map(i64::from))?;
    t.i64s(A::CUDNN_ATTR_TENSOR_STRIDES, &strides.map(i64::from))?;
    t.i64s(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    t.i64s(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[ALIGNMENT])?;
    t.finalize()
}

/// The operation graph of one convolution computation and the descriptors it holds.
fn graph(handle: sys::cudnnHandle_t, dir: Direction, shape: &ConvShape) -> Result<(Desc, Vec<Desc>)> {
    let x = tensor(UIDS[0], shape, shape.x, shape.x_strides)?;
    let w = tensor(UIDS[1], shape, shape.w, shape.layout.strides(shape.w))?;
    let y = tensor(UIDS[2], shape, shape.y, shape.y_strides)?;
    let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    // SAFETY: each attribute gets its documented C type.
    unsafe {
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[sys::cudnnDataType_t::CUDNN_DATA_FLOAT],
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            &[sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
        )?;
    }
    conv.i64s(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
    conv.i64s(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &shape.dilation.map(i64::from))?;
    conv.i64s(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &shape.stride.map(i64::from))?;
    conv.i64s(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &shape.pad.map(i64::from))?;
    conv.i64s(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &shape.pad.map(i64::from))?;
    let conv = conv.finalize()?;
    let (kind, [ax, aw, ay, ac, alpha, beta]) = match dir {
        Direction::Forward => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            [
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            ],
        ),
        Direction::BackwardData | Direction::BackwardDataAccumulate => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            [
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
            ],
        ),
        Direction::BackwardFilter => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            [
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
            ],
        ),
    };
    let op = Desc::new(kind)?;
    op.descs(ax, &[&x])?;
    op.descs(aw, &[&w])?;
    op.descs(ay, &[&y])?;
    op.descs(ac, &[&conv])?;
    // SAFETY: FLOAT attributes read f32.
    unsafe {
        op.set(alpha, T::CUDNN_TYPE_FLOAT, &[1f32])?;
        op.set(beta, T::CUDNN_TYPE_FLOAT, &[dir.beta()])?;
    }
    let op = op.finalize()?;
    Ok((operation_graph(handle, &[&op])?, vec![x, w, y, conv, op]))
}

/// The engine of configuration `cfg`.
fn engine_of(cfg: &Desc) -> Result<Desc> {
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let (mut n, mut raw) = (0i64, engine.0);
    // SAFETY: one pre-created engine descriptor for cuDNN to fill in.
    unsafe {
        sys::cudnnBackendGetAttribute(
            cfg.0,
            A::CUDNN_ATTR_ENGINECFG_ENGINE,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            1,
            &mut n,
            &mut raw as *mut _ as *mut c_void,
        )
    }
    .result()
    .map_err(|e| fail("engine of a configuration", e))?;
    Ok(engine)
}

/// cuDNN's global index of `cfg`'s engine (what its API log names), for the debug log.
fn engine_index(cfg: &Desc) -> Option<i64> {
    engine_of(cfg).and_then(|e| e.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)).ok()
}

/// Whether `cfg`'s engine may run under `opts` for `shape`: no TF32 tensor cores for f32 when
/// they are forbidden, nothing nondeterministic in deterministic mode.
fn allowed(cfg: &Desc, shape: &ConvShape, opts: &CudnnOptions) -> Result<bool> {
    let engine = engine_of(cfg)?;
    let mut n = 0i64;
    let mut notes = [0u32; 16];
    // SAFETY: room for 16 notes (cuDNN 9 defines 10), each a 32-bit enum.
    unsafe {
        sys::cudnnBackendGetAttribute(
            engine.0,
            A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
            T::CUDNN_TYPE_NUMERICAL_NOTE,
            notes.len() as i64,
            &mut n,
            notes.as_mut_ptr() as *mut c_void,
        )
    }
    .result()
    .map_err(|e| fail("numerical notes", e))?;
    let notes = &notes[..n.clamp(0, 16) as usize];
    let has = |note: sys::cudnnBackendNumericalNote_t| notes.contains(&(note as u32));
    let tf32 = shape.dtype == DataType::F32 && has(sys::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
    let nondeterministic = has(sys::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
    let forbidden = (tf32 && !opts.allow_tf32) || (nondeterministic && opts.deterministic);
    Ok(!forbidden)
}

/// Runs `plan` once on cuDNN's stream.
///
/// # Safety
/// The pointers must be live device buffers matching the plan's tensors; the workspace at
/// least the plan's size.
pub(crate) unsafe fn execute(handle: sys::cudnnHandle_t, plan: &GraphPlan, p: Pointers, workspace: u64) -> Result<()> {
    if [p.x, p.w, p.y, workspace].iter().any(|&a| a % ALIGNMENT as u64 != 0) {
        return Err(fail(
            "cuDNN graph plan",
            format!(
                "a buffer is not {ALIGNMENT}-byte aligned ({:#x}, {:#x}, {:#x}, workspace {workspace:#x})",
                p.x, p.w, p.y
            ),
        ));
    }
    // SAFETY: as this function's contract.
    unsafe { run(handle, &plan.plan, p, workspace) }
}

/// Runs one convolution `plan` with its three buffers.
///
/// # Safety
/// As [`crate::nn::cuda::cudnn::backend::run`].
unsafe fn run(handle: sys::cudnnHandle_t, plan: &Desc, p: Pointers, workspace: u64) -> Result<()> {
    let ptrs = [p.x as *mut c_void, p.w as *mut c_void, p.y as *mut c_void];
    // SAFETY: as this function's contract.
    unsafe { crate::nn::cuda::cudnn::backend::run(handle, plan, &UIDS, &ptrs, workspace) }
}

/// Builds the plan for `dir` on `shape`: the fastest, on these buffers, of the first
/// [`CudnnOptions::conv_candidates`] engine configurations the heuristics propose (mode A; the
/// fallback list when none of those ran) that `opts` allows and whose workspace fits
/// `workspace.1` bytes. Runs them on `stream` (the handle's) and waits for it.
///
/// # Safety
/// The pointers must be live device buffers of `shape`'s extents that cuDNN may overwrite
/// (outputs) or read (inputs); the workspace `workspace.1` bytes.
pub(crate) unsafe fn build(
    handle: sys::cudnnHandle_t,
    stream: &Arc<CudaStream>,
    dir: Direction,
    shape: &ConvShape,
    p: Pointers,
    workspace: (u64, usize),
    opts: &CudnnOptions,
) -> Result<GraphPlan> {
    let (graph, mut parts) = graph(handle, dir, shape)?;
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let ctx = stream.context();
    let (start, stop) = (
        ctx.new_event(timing).map_err(|e| fail("timing event", e))?,
        ctx.new_event(timing).map_err(|e| fail("timing event", e))?,
    );
    let mut best: Option<(Desc, usize, f32, Desc)> = None;
    let mut tried = Vec::new();
    for mode in [sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A, sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK]
    {
        let Ok((_heur, cfgs)) = configs(&graph, mode, opts.conv_candidates) else { continue };
        for cfg in cfgs {
            if !allowed(&cfg, shape, opts).unwrap_or(false) {
                continue;
            }
            let Ok((candidate, bytes)) = plan(handle, &cfg) else { continue };
            if bytes > workspace.1 {
                tried.push(format!("needs {bytes} B"));
                continue;
            }
            // SAFETY: as this function's contract.
            let timed = unsafe {
                (|| -> Result<f32> {
                    run(handle, &candidate, p, workspace.0)?;
                    start.record(stream).map_err(|e| fail("timing event", e))?;
                    for _ in 0..RUNS {
                        run(handle, &candidate, p, workspace.0)?;
                    }
                    stop.record(stream).map_err(|e| fail("timing event", e))?;
                    Ok(start.elapsed_ms(&stop).map_err(|e| fail("timing a plan", e))? / RUNS as f32)
                })()
            };
            match timed {
                Ok(ms) if best.as_ref().is_none_or(|b| ms < b.2) => best = Some((candidate, bytes, ms, cfg)),
                Ok(_) => {}
                Err(e) => tried.push(format!("{e}")),
            }
        }
        if best.is_some() {
            break;
        }
    }
    // Whatever a failed candidate left queued must finish before the caller moves on.
    stream.synchronize().map_err(|e| fail("cuDNN's stream after choosing a plan", e))?;
    let (plan, workspace, ms, cfg) = best
        .ok_or_else(|| fail("choosing a graph plan", format!("no engine ran {dir:?} {shape:?} (tried: {tried:?})")))?;
    log::debug!(
        "cuDNN graph {dir:?} {shape:?}: engine {}, {ms:.3} ms, workspace {workspace} B",
        engine_index(&cfg).map_or("?".to_string(), |i| i.to_string())
    );
    parts.extend([graph, cfg]);
    Ok(GraphPlan { plan, workspace, _parts: parts })
}
