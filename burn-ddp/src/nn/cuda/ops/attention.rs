//! Self-attention of burn-cuda tensors on cuDNN's fused flash-attention engines
//! ([`crate::nn::cuda::cudnn::attention`]), as an autodiff operation whose forward and backward are operations
//! of burn-fusion's stream ([`crate::nn::cuda::runtime::fusion_op`]), ordered with burn's stream on the device like
//! the convolutions.
//!
//! It takes the qkv projection's output whole (`[batch, tokens, 3, heads, head_dim]`, timm's
//! layout, or the projection's own `[batch, tokens, 3·heads·head_dim]`): q, k and v are read
//! where they lie, the output comes back as `[batch, tokens, heads, head_dim]` or `[batch,
//! tokens, heads·head_dim]` (the out projection's input without a copy or a view), and the
//! backward writes dq, dk and dv into one buffer of the qkv layout, the projection's output
//! gradient — no slices, permutes, reshapes or zero-filled gradient pieces. Saved for the backward: qkv, the output and the
//! rows' log-sum-exp (f32, `batch · heads · tokens`), never the token × token scores.

use crate::nn::cuda::cudnn::attention::{self as cudnn_sdpa, AttnPointers, AttnShape};
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::cudnn::types::DataType;
use crate::nn::cuda::runtime::fusion_op::{self, Cube, dense};
use crate::nn::cuda::runtime::launch::{Ad, Prim, cast, cuda_backend, device_index, empty, empty_f32, launch};
use burn::prelude::*;
use burn::tensor::{DType, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;

/// The attention problem of a packed qkv tensor `[n, t, 3, h, d]`, when cuDNN's engines take it
/// (bf16/f16, head dimension a multiple of 8 up to 128, 16-byte aligned q/k/v starts).
fn shape_of(dims: [usize; 5], dtype: DType) -> Option<AttnShape> {
    let [n, t, three, h, d] = dims.map(|v| v as i64);
    let dtype = match dtype {
        DType::BF16 => DataType::Bf16,
        DType::F16 => DataType::F16,
        _ => return None,
    };
    let suits = three == 3 && d % 8 == 0 && d <= 128 && (h * d) % 8 == 0 && n > 0 && t > 0;
    suits.then(|| AttnShape {
        dtype,
        batch: n,
        heads: h,
        tokens: t,
        head_dim: d,
        qkv_strides: [t * 3 * h * d, d, 3 * h * d, 1],
        o_strides: [t * h * d, d, h * d, 1],
        scale_bits: (1.0 / (d as f32).sqrt()).to_bits(),
    })
}

/// `softmax(q·kᵀ/√d)·v` of a qkv tensor whose buffer is `[n, t, 3, h, d]` (`dims`; the tensor
/// itself of that shape or `[n, t, 3·h·d]`) as a tensor of shape `out` (`[n, t, h, d]` or
/// `[n, t, h·d]`: the same buffer either way) on cuDNN when `B` is burn-cuda (with or without
/// autodiff), the path is on, and cuDNN has a plan for the shape; otherwise the input comes
/// back. Taking and giving the shapes the projections use spares burn a view each way.
pub(crate) fn try_self_attention<B: Backend, const D: usize, const DO: usize>(
    qkv: Tensor<B, D>,
    dims: [usize; 5],
    out: [usize; DO],
) -> std::result::Result<Tensor<B, DO>, Tensor<B, D>> {
    let opts = crate::nn::settings::options::get();
    let on = cuda_backend::<B>().is_some()
        && crate::nn::cuda::runtime::launch::path_enabled()
        && opts.fused_attention
        && !opts.deterministic;
    let Some(shape) = on.then(|| shape_of(dims, qkv.dtype())).flatten() else { return Err(qkv) };
    let device = device_index(&qkv);
    if let Err(e) = cudnn_sdpa::prepare(device, &shape) {
        crate::nn::cuda::runtime::launch::warn_once(
            "cuDNN fused attention",
            &e,
            "two products and a softmax run instead",
        );
        return Err(qkv);
    }
    crate::nn::cuda::runtime::device_thread::check_failure();
    let out = Shape::new(out);
    if cuda_backend::<B>() == Some(true) {
        return Ok(cast(autodiff_attention::<D, DO>(cast(qkv), shape, out)));
    }
    let q: Tensor<Cuda, D> = cast(qkv);
    let (o, _stats) = forward(q.into_primitive().tensor(), shape, out);
    Ok(cast(Tensor::<Cuda, DO>::from_primitive(TensorPrimitive::Float(o))))
}

#[derive(Debug)]
struct FusedAttention;

/// What the backward reads: the input, the output and the rows' log-sum-exp.
#[derive(Debug, Clone)]
struct Saved {
    qkv: Prim,
    o: Prim,
    stats: Prim,
    shape: AttnShape,
}

impl Backward<Cuda, 1> for FusedAttention {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node] = ops.parents;
        let d_o = grads.consume::<Cuda>(&ops.node);
        if let Some(node) = node {
            let s = ops.state;
            grads.register::<Cuda>(node.id, backward(s.qkv, s.o, s.stats, d_o, s.shape));
        }
    }
}

fn autodiff_attention<const D: usize, const DO: usize>(
    qkv: Tensor<Ad, D>,
    shape: AttnShape,
    out: Shape,
) -> Tensor<Ad, DO> {
    let qkv = qkv.into_primitive().tensor();
    let (o, stats) = forward(qkv.primitive.clone(), shape, out);
    let out = match FusedAttention.prepare::<NoCheckpointing>([qkv.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(Saved { qkv: qkv.primitive, o: o.clone(), stats, shape }, o),
        OpsKind::UnTracked(prep) => prep.finish(o),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The addresses of q, k and v inside a packed qkv buffer at `base`.
fn qkv_pointers(base: u64, shape: &AttnShape) -> (u64, u64, u64) {
    let part = (shape.heads * shape.head_dim) as u64 * 2; // bf16/f16: two bytes
    (base, base + part, base + 2 * part)
}

/// Queues the forward: the output (`[n, t, h, d]` packed, of shape `out`) and the rows'
/// log-sum-exp `[n, h, t, 1]` (f32).
fn forward(qkv: Prim, shape: AttnShape, out: Shape) -> (Prim, Prim) {
    let [n, t, h, d] = [shape.batch, shape.tokens, shape.heads, shape.head_dim].map(|v| v as usize);
    debug_assert_eq!(out.num_elements(), n * t * h * d, "the output holds [n, t, h, d]");
    let out_dims = out.clone();
    let outputs = [(out, qkv.dtype), (Shape::new([n, h, t, 1]), DType::F32)];
    let mut out = fusion_op::queue("cudnn_attention", vec![qkv], &outputs, move |ins| {
        let [qkv]: [Cube; 1] = ins.try_into().expect("one input");
        let qkv = dense(qkv);
        let (o, stats) = (empty(&qkv, out_dims.as_slice()), empty_f32(&qkv, &[n, h, t, 1]));
        let device = qkv.device.index;
        // SAFETY: `launch` orders the computation after the buffers' producers and before their
        // next users; their extents are `shape`'s (packed, checked above); o and stats are fresh.
        launch(&[&qkv, &o, &stats], ("sdpa_forward", shape), move |p, order| unsafe {
            let (q, k, v) = qkv_pointers(p[0], &shape);
            let ptrs = AttnPointers { q, k, v, o: p[1], stats: p[2], d_o: 0, dq: 0, dk: 0, dv: 0 };
            cudnn::with_handle(device, order, |s| cudnn_sdpa::forward(s, device, &shape, &ptrs))
        })
        .unwrap_or_else(|e| panic!("cuDNN fused attention failed after its plan was built: {e} (BURN_DDP_SDPA=0 runs it as products and a softmax)"));
        vec![o, stats]
    });
    let stats = out.pop().expect("two outputs");
    (out.pop().expect("two outputs"), stats)
}

/// Queues the backward: the qkv gradient (qkv's shape and packed layout) from the saved
/// tensors and `do`.
fn backward(qkv: Prim, o: Prim, stats: Prim, d_o: Prim, shape: AttnShape) -> Prim {
    let outputs = [fusion_op::like(&qkv)];
    let mut out = fusion_op::queue("cudnn_attention_backward", vec![qkv, o, stats, d_o], &outputs, move |ins| {
        let [qkv, o, stats, d_o]: [Cube; 4] = ins.try_into().expect("four inputs");
        let (qkv, o, stats, d_o) = (dense(qkv), dense(o), dense(stats), dense(d_o));
        let dqkv = empty(&qkv, qkv.meta.shape().as_slice());
        let device = qkv.device.index;
        // SAFETY: as the forward; dqkv is fresh and of qkv's packed layout.
        launch(&[&qkv, &o, &stats, &d_o, &dqkv], ("sdpa_backward", shape), move |p, order| unsafe {
            let (q, k, v) = qkv_pointers(p[0], &shape);
            let (dq, dk, dv) = qkv_pointers(p[4], &shape);
            let ptrs = AttnPointers { q, k, v, o: p[1], stats: p[2], d_o: p[3], dq, dk, dv };
            cudnn::with_handle(device, order, |s| cudnn_sdpa::backward(s, device, &shape, &ptrs))
        })
        .unwrap_or_else(|e| panic!("cuDNN fused attention backward failed after its plan was built: {e} (BURN_DDP_SDPA=0 runs it as products and a softmax)"));
        vec![dqkv]
    });
    out.pop().expect("one output")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vit_layout_maps_to_strided_views() {
        let s = shape_of([128, 197, 3, 12, 64], DType::BF16).expect("ViT-B/16 suits");
        assert_eq!((s.batch, s.heads, s.tokens, s.head_dim), (128, 12, 197, 64));
        // q[b, h, t, :] starts at ((b·197 + t)·3 + 0)·768 + h·64.
        assert_eq!(s.qkv_strides, [197 * 3 * 768, 64, 3 * 768, 1]);
        assert_eq!(s.o_strides, [197 * 768, 64, 768, 1]);
        assert_eq!(f32::from_bits(s.scale_bits), 0.125);
        let (q, k, v) = qkv_pointers(4096, &s);
        assert_eq!((k - q, v - q), (768 * 2, 768 * 4));
    }

    #[test]
    fn unsuitable_problems_take_the_other_path() {
        assert!(shape_of([2, 5, 3, 4, 64], DType::F32).is_none(), "f32");
        assert!(shape_of([2, 5, 3, 4, 12], DType::BF16).is_none(), "head dim not a multiple of 8");
        assert!(shape_of([2, 5, 3, 2, 256], DType::BF16).is_none(), "head dim over 128");
        assert!(shape_of([2, 5, 2, 4, 64], DType::BF16).is_none(), "not q, k and v");
        assert!(shape_of([2, 5, 3, 3, 8], DType::F16).is_some());
    }
}
