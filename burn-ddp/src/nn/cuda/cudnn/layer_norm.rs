//! LayerNorm forward (training) and backward as cuDNN graphs (`NORM_FORWARD` / `NORM_BACKWARD`
//! in layer-norm mode, the operations cuDNN's frontend emits for its layernorm nodes): rows of
//! `features` values in bf16/f16 read and written in that type, statistics and arithmetic in f32,
//! the scale and bias (and their gradients) f32. One pass each way over the activations instead of
//! burn's casts and separate reductions. Raw descriptors and device addresses only; plans are
//! built once per device and shape.

use crate::error::Result;
use crate::nn::cuda::cudnn::backend::Desc;
use crate::nn::cuda::cudnn::convolution::DeviceState;
use crate::nn::cuda::cudnn::graph::{Bind, Built, F32, Graph, Pair, PlanCache, execute};
use crate::nn::cuda::cudnn::types::DataType;
use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as A, cudnnBackendAttributeType_t as T, cudnnBackendDescriptorType_t as D,
};

static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many layer norms (forward or backward) cuDNN has run in this process.
pub fn calls() -> u64 {
    CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// One layer-norm problem: `rows` packed rows of `features` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LnShape {
    /// The activations' type, bf16 or f16.
    pub dtype: DataType,
    /// Rows (every axis but the last).
    pub rows: i64,
    /// Values per row (the last axis).
    pub features: i64,
    /// ε's f32 bits.
    pub eps_bits: u32,
}

/// Device addresses: `x`, `scale`, `bias` and the saved `mean` and `inv_var` (f32, one per
/// row); forward writes `y`, `mean`, `inv_var`; backward reads `dy` and writes `dx`, `dscale`,
/// `dbias`.
#[derive(Clone, Copy, Debug, Default)]
pub struct LnPointers {
    pub x: u64,
    pub scale: u64,
    pub bias: u64,
    pub mean: u64,
    pub inv_var: u64,
    pub y: u64,
    pub dy: u64,
    pub dx: u64,
    pub dscale: u64,
    pub dbias: u64,
}

const X: i64 = 1;
const SCALE: i64 = 2;
const BIAS: i64 = 3;
const MEAN: i64 = 4;
const INV_VAR: i64 = 5;
const Y: i64 = 6;
const DY: i64 = 7;
const DX: i64 = 8;
const DSCALE: i64 = 9;
const DBIAS: i64 = 10;
const EPS: i64 = 11;

static PLANS: PlanCache<LnShape> = PlanCache::new();

/// Builds (once per device and shape) the forward and backward plans, or says why not.
pub(crate) fn prepare(device: usize, shape: &LnShape) -> Result<()> {
    PLANS.prepare(device, *shape, "cuDNN layer norm", |h| {
        Ok(Pair { forward: build(h, shape, false)?, backward: build(h, shape, true)? })
    })
}

/// Enqueues the forward on `s`'s stream (inside `cuda::cudnn::convolution::with_handle`).
///
/// # Safety
/// The pointers must be live device buffers of `shape`'s extents (x, scale, bias readable; y,
/// mean, inv_var writable) until the work has finished.
pub(crate) unsafe fn forward(s: &mut DeviceState, device: usize, shape: &LnShape, p: &LnPointers) -> Result<()> {
    let plans = PLANS.get(device, *shape)?;
    let plans = plans.lock().unwrap_or_else(|p| p.into_inner());
    let (ws, _) = s.workspace_ptr(plans.forward.workspace)?;
    let buffers = [(X, p.x), (SCALE, p.scale), (BIAS, p.bias), (MEAN, p.mean), (INV_VAR, p.inv_var), (Y, p.y)];
    // SAFETY: the plan was built for `shape`; the caller vouches for the buffers.
    unsafe {
        execute(s, "cuDNN layer norm", &plans.forward.plan, &buffers, &[(EPS, f32::from_bits(shape.eps_bits))], ws)
    }?;
    CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Enqueues the backward on `s`'s stream.
///
/// # Safety
/// As [`forward`], with x, scale, mean, inv_var, dy readable and dx, dscale, dbias writable.
pub(crate) unsafe fn backward(s: &mut DeviceState, device: usize, shape: &LnShape, p: &LnPointers) -> Result<()> {
    let plans = PLANS.get(device, *shape)?;
    let plans = plans.lock().unwrap_or_else(|p| p.into_inner());
    let (ws, _) = s.workspace_ptr(plans.backward.workspace)?;
    let buffers = [
        (X, p.x),
        (SCALE, p.scale),
        (MEAN, p.mean),
        (INV_VAR, p.inv_var),
        (DY, p.dy),
        (DX, p.dx),
        (DSCALE, p.dscale),
        (DBIAS, p.dbias),
    ];
    // SAFETY: as `forward`.
    unsafe { execute(s, "cuDNN layer norm", &plans.backward.plan, &buffers, &[], ws) }?;
    CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// The tensors both graphs share: x (and y, dy, dx) `[rows, features, 1, 1]` row-major, the
/// per-feature f32 scale/bias `[1, features, 1, 1]`, the per-row f32 statistics `[rows, 1, 1, 1]`.
struct Layouts {
    rows: [i64; 4],
    rows_strides: [i64; 4],
    feats: [i64; 4],
    feats_strides: [i64; 4],
    stats: [i64; 4],
}

fn layouts(shape: &LnShape) -> Layouts {
    let (r, f) = (shape.rows, shape.features);
    Layouts {
        rows: [r, f, 1, 1],
        rows_strides: [f, 1, f, f],
        feats: [1, f, 1, 1],
        feats_strides: [f, 1, f, f],
        stats: [r, 1, 1, 1],
    }
}

fn build(handle: sys::cudnnHandle_t, shape: &LnShape, backward: bool) -> Result<Built> {
    let mut g = Graph::new();
    let (io, l) = (shape.dtype.raw(), layouts(shape));
    let x = g.tensor(Bind::Buffer(X), io, l.rows, l.rows_strides)?;
    let scale = g.tensor(Bind::Buffer(SCALE), F32, l.feats, l.feats_strides)?;
    let mean = g.tensor(Bind::Buffer(MEAN), F32, l.stats, [1; 4])?;
    let inv_var = g.tensor(Bind::Buffer(INV_VAR), F32, l.stats, [1; 4])?;
    let mode = [sys::cudnnBackendNormMode_t::CUDNN_LAYER_NORM];
    if backward {
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR)?;
        // SAFETY: NORM_MODE attributes read cudnnBackendNormMode_t.
        unsafe { op.set(A::CUDNN_ATTR_OPERATION_NORM_BWD_MODE, T::CUDNN_TYPE_NORM_MODE, &mode)? };
        let dy = g.tensor(Bind::Buffer(DY), io, l.rows, l.rows_strides)?;
        let dx = g.tensor(Bind::Buffer(DX), io, l.rows, l.rows_strides)?;
        let dscale = g.tensor(Bind::Buffer(DSCALE), F32, l.feats, l.feats_strides)?;
        let dbias = g.tensor(Bind::Buffer(DBIAS), F32, l.feats, l.feats_strides)?;
        let set = [
            (A::CUDNN_ATTR_OPERATION_NORM_BWD_XDESC, x),
            (A::CUDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC, mean),
            (A::CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC, inv_var),
            (A::CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC, dy),
            (A::CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC, scale),
            (A::CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC, dscale),
            (A::CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC, dbias),
            (A::CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC, dx),
        ];
        g.custom_op(op, &format!("norm backward {mode:?}"), &set)?;
    } else {
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR)?;
        // SAFETY: NORM_MODE / NORM_FWD_PHASE attributes read their enums.
        unsafe {
            op.set(A::CUDNN_ATTR_OPERATION_NORM_FWD_MODE, T::CUDNN_TYPE_NORM_MODE, &mode)?;
            op.set(
                A::CUDNN_ATTR_OPERATION_NORM_FWD_PHASE,
                T::CUDNN_TYPE_NORM_FWD_PHASE,
                &[sys::cudnnBackendNormFwdPhase_t::CUDNN_NORM_FWD_TRAINING],
            )?;
        }
        let bias = g.tensor(Bind::Buffer(BIAS), F32, l.feats, l.feats_strides)?;
        let eps = g.tensor(Bind::Value(EPS), F32, [1; 4], [1; 4])?;
        let y = g.tensor(Bind::Buffer(Y), io, l.rows, l.rows_strides)?;
        let set = [
            (A::CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, x),
            (A::CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC, mean),
            (A::CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, inv_var),
            (A::CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC, scale),
            (A::CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC, bias),
            (A::CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC, eps),
            (A::CUDNN_ATTR_OPERATION_NORM_FWD_YDESC, y),
        ];
        g.custom_op(op, &format!("norm forward {mode:?} training"), &set)?;
    }
    g.finish(handle, "cuDNN layer-norm plan", 64 << 20)
}
