//! Scaled dot-product attention, forward and backward, as cuDNN operation graphs that its fused
//! flash-attention engines run (cuDNN ≥ 9 on Ampere and newer): `softmax(q·kᵀ·scale)·v` without
//! the token × token matrix in memory, the row log-sum-exp saved for the backward, bf16/f16
//! inputs with f32 accumulation. The graphs are the ones cuDNN's frontend builds for its
//! composite SDPA nodes (matmul, pointwise and reduction operations that the engines match as a
//! whole), written with the backend API here so that no C++ is needed.
//!
//! q, k, v, o and the gradients may be strided views (`[batch, head, token, dim]`, dim stride 1):
//! a ViT's q, k and v are read where its qkv projection left them and dq, dk, dv written into
//! one buffer of the same layout. Raw descriptors and device addresses only; plans are built
//! once per shape and device and cached for the process.

use crate::error::Result;
use crate::nn::cuda::cudnn::convolution::{self as cudnn, DeviceState};
use crate::nn::cuda::cudnn::graph::{Bind, Built, F32, Graph, Pair, PlanCache, execute, packed};
use crate::nn::cuda::cudnn::types::{DataType, fail};
use cudarc::cudnn::sys;

/// Largest workspace a plan may ask for (bytes), beside the backward's own f32 scratch.
const WORKSPACE_LIMIT: usize = 256 << 20;

static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many attention computations (forward or backward) cuDNN has run in this process.
pub fn calls() -> u64 {
    CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// One attention problem: `heads` heads of `tokens` queries and keys of `head_dim` each, per
/// batch entry, with the element strides of q, k and v (and of dq, dk, dv) and of o (and do)
/// as `[batch, head, token, dim]` views.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnShape {
    /// bf16 or f16.
    pub dtype: DataType,
    /// Batch entries.
    pub batch: i64,
    /// Heads.
    pub heads: i64,
    /// Tokens (queries = keys).
    pub tokens: i64,
    /// Dimension per head.
    pub head_dim: i64,
    /// Strides of q, k, v, dq, dk and dv.
    pub qkv_strides: [i64; 4],
    /// Strides of o and do.
    pub o_strides: [i64; 4],
    /// The softmax scale's f32 bits (usually `1/√head_dim`).
    pub scale_bits: u32,
}

impl AttnShape {
    fn dims(&self) -> [i64; 4] {
        [self.batch, self.heads, self.tokens, self.head_dim]
    }

    /// Bytes of f32 scratch the backward keeps in front of the plan's workspace: the row sums
    /// of `do ∘ o` and dq's f32 accumulator.
    fn backward_scratch(&self) -> (usize, usize) {
        let rows = (self.batch * self.heads * self.tokens) as usize * 4;
        let sums = rows.next_multiple_of(256);
        (sums, sums + (rows * self.head_dim as usize).next_multiple_of(256))
    }
}

/// The device addresses of one forward (`o`, `stats` written) or backward (`d*` written).
#[derive(Clone, Copy, Debug)]
pub struct AttnPointers {
    /// q, k and v.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// The output `[batch, head, token, dim]` view.
    pub o: u64,
    /// The rows' log-sum-exp of the scaled scores, f32 `[batch, head, token]` packed.
    pub stats: u64,
    /// do, dq, dk, dv (backward only).
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
}

static PLANS: PlanCache<AttnShape> = PlanCache::new();

/// Builds (once per device and shape) the forward and backward plans, or says why cuDNN has
/// none (the answer is cached too: the caller then takes another path).
pub(crate) fn prepare(device: usize, shape: &AttnShape) -> Result<()> {
    PLANS.prepare(device, *shape, "cuDNN attention", |h| {
        Ok(Pair { forward: build(h, shape, false)?, backward: build(h, shape, true)? })
    })
}

/// Enqueues the forward (`o`, `stats`) on `s`'s stream (inside `cuda::cudnn::convolution::with_handle`).
///
/// # Safety
/// The pointers must be live device buffers of `shape`'s extents, q/k/v readable and o/stats
/// writable until the work has finished.
pub(crate) unsafe fn forward(s: &mut DeviceState, device: usize, shape: &AttnShape, p: &AttnPointers) -> Result<()> {
    let plans = PLANS.get(device, *shape)?;
    let plans = plans.lock().unwrap_or_else(|p| p.into_inner());
    let (ws, _) = s.workspace_ptr(plans.forward.workspace)?;
    let buffers = [(Q, p.q), (K, p.k), (V, p.v), (O, p.o), (STATS, p.stats)];
    // SAFETY: the plan was built for `shape`; the caller vouches for the buffers.
    unsafe {
        execute(s, "cuDNN attention", &plans.forward.plan, &buffers, &[(SCALE, f32::from_bits(shape.scale_bits))], ws)
    }?;
    CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Enqueues the backward (`dq`, `dk`, `dv` from q, k, v, o, stats and do) on `s`'s stream.
///
/// # Safety
/// As [`forward`], with do readable and dq/dk/dv writable.
pub(crate) unsafe fn backward(s: &mut DeviceState, device: usize, shape: &AttnShape, p: &AttnPointers) -> Result<()> {
    let plans = PLANS.get(device, *shape)?;
    let plans = plans.lock().unwrap_or_else(|p| p.into_inner());
    let (sums_end, scratch) = shape.backward_scratch();
    let (ws, _) = s.workspace_ptr(scratch + plans.backward.workspace)?;
    let (sums, accum) = (ws, ws + sums_end as u64);
    if cudnn::version().unwrap_or(0) < 90600 {
        // Before cuDNN 9.6 the engine adds into dq's accumulator without clearing it first.
        // SAFETY: inside the workspace just obtained, on its stream.
        unsafe { cudarc::driver::sys::cuMemsetD8Async(accum, 0, scratch - sums_end, s.cu_stream()) }
            .result()
            .map_err(|e| fail("clearing dq's accumulator", e))?;
    }
    let buffers = [
        (Q, p.q),
        (K, p.k),
        (V, p.v),
        (O, p.o),
        (STATS, p.stats),
        (DO, p.d_o),
        (DQ, p.dq),
        (DK, p.dk),
        (DV, p.dv),
        (SUMS, sums),
        (DQ_ACCUM, accum),
    ];
    let values = [(SCALE, f32::from_bits(shape.scale_bits)), (ONE, 1.0)];
    // SAFETY: as `forward`; the scratch lies inside the workspace, in front of the plan's part.
    unsafe { execute(s, "cuDNN attention", &plans.backward.plan, &buffers, &values, ws + scratch as u64) }?;
    CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

const Q: i64 = 1;
const K: i64 = 2;
const V: i64 = 3;
const O: i64 = 4;
const STATS: i64 = 5;
const DO: i64 = 6;
const DQ: i64 = 7;
const DK: i64 = 8;
const DV: i64 = 9;
const SUMS: i64 = 10;
const DQ_ACCUM: i64 = 11;
const SCALE: i64 = 12;
const ONE: i64 = 13;

/// `[b, h, s, d]` with the last two axes swapped (a transposed view of the same memory).
fn swap(v: [i64; 4]) -> [i64; 4] {
    [v[0], v[1], v[3], v[2]]
}

fn build(handle: sys::cudnnHandle_t, shape: &AttnShape, backward: bool) -> Result<Built> {
    let mut g = Graph::new();
    if backward {
        backward_graph(&mut g, shape)?
    } else {
        forward_graph(&mut g, shape)?
    };
    g.finish(handle, "cuDNN attention plan", WORKSPACE_LIMIT)
}

/// The row statistics' layout, `[b, h, s, 1]` f32 packed.
fn row_dims(shape: &AttnShape) -> [i64; 4] {
    [shape.batch, shape.heads, shape.tokens, 1]
}

fn scores_dims(shape: &AttnShape) -> [i64; 4] {
    [shape.batch, shape.heads, shape.tokens, shape.tokens]
}

/// `o = softmax(q·kᵀ·scale)·v`, `stats = max + ln Σ exp(· − max)` per row.
fn forward_graph(g: &mut Graph, shape: &AttnShape) -> Result<()> {
    use sys::cudnnPointwiseMode_t::*;
    use sys::cudnnReduceTensorOp_t::*;
    let (io, dims, qs) = (shape.dtype.raw(), shape.dims(), shape.qkv_strides);
    let (rows, scores) = (row_dims(shape), scores_dims(shape));
    let q = g.tensor(Bind::Buffer(Q), io, dims, qs)?;
    let kt = g.tensor(Bind::Buffer(K), io, swap(dims), swap(qs))?;
    let v = g.tensor(Bind::Buffer(V), io, dims, qs)?;
    let o = g.tensor(Bind::Buffer(O), io, dims, shape.o_strides)?;
    let stats = g.tensor(Bind::Buffer(STATS), F32, rows, packed(rows))?;
    let scale = g.tensor(Bind::Value(SCALE), F32, [1; 4], [1; 4])?;
    let s = g.virt(scores)?;
    g.matmul(q, kt, s)?;
    let scaled = g.virt(scores)?;
    g.pointwise(CUDNN_POINTWISE_MUL, s, Some(scale), scaled)?;
    let max = g.virt(rows)?;
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, scaled, max)?;
    let shifted = g.virt(scores)?;
    g.pointwise(CUDNN_POINTWISE_SUB, scaled, Some(max), shifted)?;
    let e = g.virt(scores)?;
    g.pointwise(CUDNN_POINTWISE_EXP, shifted, None, e)?;
    let sum = g.virt(rows)?;
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum)?;
    let log = g.virt(rows)?;
    g.pointwise(CUDNN_POINTWISE_LOG, sum, None, log)?;
    g.pointwise(CUDNN_POINTWISE_ADD, max, Some(log), stats)?;
    let p = g.tensor(Bind::Virtual, io, scores, packed(scores))?;
    g.pointwise(CUDNN_POINTWISE_DIV, e, Some(sum), p)?;
    g.matmul(p, v, o)
}

/// dq, dk, dv of [`forward_graph`] from q, k, v, o, do and the saved stats (the scores are
/// recomputed in the fused kernels): with `p = exp(s·scale − stats)` and `r = rowsum(do ∘ o)`,
/// `dv = pᵀ·do`, `ds = p ∘ (do·vᵀ − r)·scale`, `dk = dsᵀ·q`, `dq = ds·k`.
fn backward_graph(g: &mut Graph, shape: &AttnShape) -> Result<()> {
    use sys::cudnnPointwiseMode_t::*;
    let (io, dims, qs) = (shape.dtype.raw(), shape.dims(), shape.qkv_strides);
    let (rows, scores) = (row_dims(shape), scores_dims(shape));
    let q = g.tensor(Bind::Buffer(Q), io, dims, qs)?;
    let kt = g.tensor(Bind::Buffer(K), io, swap(dims), swap(qs))?;
    let vt = g.tensor(Bind::Buffer(V), io, swap(dims), swap(qs))?;
    let o = g.tensor(Bind::Buffer(O), io, dims, shape.o_strides)?;
    let d_o = g.tensor(Bind::Buffer(DO), io, dims, shape.o_strides)?;
    let stats = g.tensor(Bind::Buffer(STATS), F32, rows, packed(rows))?;
    let scale = g.tensor(Bind::Value(SCALE), F32, [1; 4], [1; 4])?;
    let one = g.tensor(Bind::Value(ONE), F32, [1; 4], [1; 4])?;
    // r = rowsum(do ∘ o), kept (f32) in the workspace for the fused kernels.
    let prod = g.virt(dims)?;
    g.pointwise(CUDNN_POINTWISE_MUL, d_o, Some(o), prod)?;
    let r = g.virt(rows)?;
    g.reduction(sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD, prod, r)?;
    let sums = g.tensor(Bind::Buffer(SUMS), F32, rows, packed(rows))?;
    g.pointwise(CUDNN_POINTWISE_MUL, r, Some(one), sums)?;
    // p = exp(q·kᵀ·scale − stats); dv = pᵀ·do.
    let s = g.virt(scores)?;
    g.matmul(q, kt, s)?;
    let scaled = g.virt(scores)?;
    g.pointwise(CUDNN_POINTWISE_MUL, s, Some(scale), scaled)?;
    let shifted = g.virt(scores)?;
    g.pointwise(CUDNN_POINTWISE_SUB, scaled, Some(stats), shifted)?;
    let p = g.virt(scores)?;
    g.pointwise(CUDNN_POINTWISE_EXP, shifted, None, p)?;
    let pt = g.tensor(Bind::Virtual, io, swap(scores), swap(packed(scores)))?;
    g.reshape(p, pt)?;
    let dv = g.tensor(Bind::Buffer(DV), io, dims, qs)?;
    g.matmul(pt, d_o, dv)?;
    // ds = p ∘ (do·vᵀ − r)·scale; dk = dsᵀ·q; dq = ds·k (accumulated in f32).
    let dp = g.virt(scores)?;
    g.matmul(d_o, vt, dp)?;
    let centred = g.virt(scores)?;
    g.pointwise(CUDNN_POINTWISE_SUB, dp, Some(sums), centred)?;
    let weighted = g.virt(scores)?;
    g.pointwise(CUDNN_POINTWISE_MUL, centred, Some(p), weighted)?;
    let ds = g.virt(scores)?;
    g.pointwise(CUDNN_POINTWISE_MUL, weighted, Some(scale), ds)?;
    let dst = g.tensor(Bind::Virtual, io, swap(scores), swap(packed(scores)))?;
    g.reshape(ds, dst)?;
    let dk = g.tensor(Bind::Buffer(DK), io, dims, qs)?;
    g.matmul(dst, q, dk)?;
    let k = g.tensor(Bind::Virtual, io, dims, qs)?;
    g.reshape(kt, k)?;
    let accum = g.tensor(Bind::Buffer(DQ_ACCUM), F32, dims, packed(dims))?;
    g.matmul(ds, k, accum)?;
    let dq = g.tensor(Bind::Buffer(DQ), io, dims, qs)?;
    g.pointwise(CUDNN_POINTWISE_IDENTITY, accum, None, dq)
}
